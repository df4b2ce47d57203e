/* The agent's metrics (docs/METRICS.md): its registry's families, what the floor manager and
 * the worker registry hold (copied at scrape time), the floor events that count
 * materializations, and the control requests, counted by a wrapper around the service's
 * handler. Thread-safe; updates never block on anything but the registry's short-held lock. */
#ifndef WF_AGENT_METRICS_H
#define WF_AGENT_METRICS_H

#include "agent/floors.h"
#include "agent/workers.h"
#include "control/server.h"
#include "http/metrics.h"

struct wf_agent_metrics;

/* Builds the registry and its families and registers the scrape-time collector over floors and
 * workers (either may be NULL until set with wf_agent_metrics_bind; both borrowed). Returns 0 and
 * *ret, or a negative code. */
int wf_agent_metrics_create(struct wf_agent_metrics **ret);
void wf_agent_metrics_bind(struct wf_agent_metrics *am, struct wf_floors *floors,
                           struct wf_workers *workers);
/* Frees it. Accepts NULL. The HTTP server that renders it must be gone. */
void wf_agent_metrics_destroy(struct wf_agent_metrics *am);
struct wf_metrics *wf_agent_metrics_registry(struct wf_agent_metrics *am);

/* Counts what a floor event says (materializations, their durations and bytes, errors). */
void wf_agent_metrics_floor_event(struct wf_agent_metrics *am, const struct wf_floor_event *ev);

/* A wf_ctl_handle_fn that calls inner(inner_ctx, ...) and counts the request by kind and status
 * with its latency. ctx is the wf_agent_metrics, whose inner handler is set here. */
void wf_agent_metrics_wrap(struct wf_agent_metrics *am, wf_ctl_handle_fn inner, void *inner_ctx);
int wf_agent_metrics_handle(void *ctx, const Weightfloor__V1__Request *req,
                            Weightfloor__V1__Reply *reply, struct wf_ctl_call *call);

/* /healthz for the agent: false (with a reason) when the janitor has not finished a pass for
 * ten of its intervals (and at least 60 s): its loop is stuck. */
bool wf_agent_metrics_live(void *ctx, char *reason, size_t len);

#endif
