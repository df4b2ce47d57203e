/* The worker's metrics (docs/METRICS.md): its registry's families, the cache's and engines'
 * state copied at scrape time, loads counted from the cache's events, and the control requests,
 * counted by a wrapper around the service's handler. Thread-safe; updates never block on
 * anything but the registry's short-held lock. */
#ifndef WF_WORKER_METRICS_H
#define WF_WORKER_METRICS_H

#include "control/server.h"
#include "http/metrics.h"
#include "worker/cache.h"

struct wf_worker_svc;
struct wf_completions;
struct wf_worker_metrics;

/* Returns 0 and *ret, or a negative code. */
int wf_worker_metrics_create(struct wf_worker_metrics **ret);
/* svc (its cache and id) and cs (the engines; NULL: none) are borrowed, read at scrape time from
 * here on, and must outlive the registry's renders. Call once. */
void wf_worker_metrics_bind(struct wf_worker_metrics *wm, struct wf_worker_svc *svc,
                            struct wf_completions *cs);
/* Accepts NULL. The HTTP server that renders it must be gone. */
void wf_worker_metrics_destroy(struct wf_worker_metrics *wm);
struct wf_metrics *wf_worker_metrics_registry(struct wf_worker_metrics *wm);

/* Counts what a cache event says (loads, their durations and bytes, failures). Accepts NULL. */
void wf_worker_metrics_cache_event(struct wf_worker_metrics *wm, const struct wf_cache_event *ev);

/* A wf_ctl_handle_fn that calls inner(inner_ctx, ...) and counts the request by kind and status
 * with its latency. ctx is the wf_worker_metrics. */
void wf_worker_metrics_wrap(struct wf_worker_metrics *wm, wf_ctl_handle_fn inner, void *inner_ctx);
int wf_worker_metrics_handle(void *ctx, const Weightfloor__V1__Request *req,
                             Weightfloor__V1__Reply *reply, struct wf_ctl_call *call);

#endif
