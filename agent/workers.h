/* The agent's registry of the node's workers, and the relay that lets a control plane reach any
 * worker through the agent's one address.
 *
 * A worker registers (RegisterWorker) at start and then every few seconds as a heartbeat; the
 * heartbeat is also how a worker finds a restarted agent. A worker that has not been heard from
 * for WF_WORKERS_EXPIRE_MS, or whose pid is gone, is dropped. Requests of the worker slice
 * (SetResidency, Pin, Unpin, Evict, Prefetch, Compact, WorkerStatus, Generate, GenerateRead)
 * naming a worker_id, or
 * naming none when exactly one worker is registered, are forwarded to that worker's endpoint and
 * its reply is returned as the agent's. A Generate naming no worker when several are registered
 * goes to the worker that reported the model most resident (pinned, device, host), the least busy
 * with completions among equals, or else to the least busy self-managed worker; its reply names
 * the worker, which the GenerateReads that follow it must name.
 *
 * Relays never take the agent down with a worker. Each is bounded by the client's deadline
 * (Request.deadline_ms, what is left of it when the relay starts, at most WF_WORKERS_RELAY_MAX_MS);
 * at most WF_WORKERS_RELAY_PER_WORKER run at once per worker (more: UNAVAILABLE at once) and at
 * most half the server's request threads in all (more: RESOURCE_EXHAUSTED at once), so a hung
 * worker, or a relay loop, always leaves threads for the agent's own requests. Completions have a
 * budget of their own (each one being followed holds a long poll): at most
 * WF_WORKERS_COMPLETION_RELAY_PER_WORKER per worker and wf_workers_set_completion_relays() in all.
 * RegisterWorker refuses (INVALID_ARGUMENT) an endpoint that is not ipc:///absolute/path or
 * tls+tcp://host:port, or that is one of the agent's own sockets.
 *
 * Thread-safe. */
#ifndef WF_AGENT_WORKERS_H
#define WF_AGENT_WORKERS_H

#include "control/server.h"

#include <stdint.h>

#define WF_WORKERS_EXPIRE_MS                   15000
#define WF_WORKERS_MAX                         256
#define WF_WORKERS_RELAY_MAX_MS                (10 * 60 * 1000)
#define WF_WORKERS_RELAY_PER_WORKER            2
#define WF_WORKERS_COMPLETION_RELAY_PER_WORKER 16
#define WF_WORKERS_RES_MAX                     32 /* models per worker whose residency the registry remembers */
/* Connecting to a worker: one that does not complete the handshake in this time is not there. */
#define WF_WORKERS_CONNECT_MS 2000

struct wf_workers;

/* on_change(ctx, worker_id, message) is called without locks held for registrations and drops. */
typedef void (*wf_workers_event_fn)(void *ctx, const char *worker_id, const char *message);

/* At most this many changes in one ReportResidency (more: INVALID_ARGUMENT). */
#define WF_WORKERS_REPORT_MAX 256

/* on_residency(ctx, worker_id, change) is called without locks held, once per change of a
 * ReportResidency from a registered worker, in the order the worker sent them. */
typedef void (*wf_workers_residency_fn)(void *ctx, const char *worker_id,
                                        const Weightfloor__V1__ResidencyChange *change);

int wf_workers_create(wf_workers_event_fn on_change, void *ctx, struct wf_workers **ret);
void wf_workers_destroy(struct wf_workers *w);
uint32_t wf_workers_count(void *w);

/* The agent's own request and events urls (either may be NULL), refused as worker endpoints, and
 * the number of request threads of its server (relays may use half of them, at least one).
 * Call before the server starts. Returns 0 or -ENOMEM. */
int wf_workers_set_self(struct wf_workers *w, const char *request_url, const char *events_url,
                        unsigned server_threads);

/* Generate and GenerateRead relays at once, all workers (default 0: refused). The agent gives
 * them request threads of their own. Call before the server starts. */
void wf_workers_set_completion_relays(struct wf_workers *w, unsigned max);

/* Where ReportResidency changes go (NULL: accepted and dropped). Call before the server
 * starts. */
void wf_workers_set_residency_fn(struct wf_workers *w, wf_workers_residency_fn fn, void *ctx);

/* One registered worker as wf_workers_visit() shows it: its budgets and the last residency it
 * reported for each model (Weightfloor__V1__Residency values). Valid during the call only. */
struct wf_workers_view {
	const char *worker_id;
	uint64_t device_total, device_budget, pinned_host_budget;
	int64_t last_seen_unix_ms;
	uint32_t n_res;
	const char *res_model[WF_WORKERS_RES_MAX];
	int res_state[WF_WORKERS_RES_MAX];
};
/* Calls fn once per registered worker with the registry's lock held (metrics at scrape time):
 * fn must not block or call into the registry. */
void wf_workers_visit(struct wf_workers *w, void (*fn)(void *ctx, const struct wf_workers_view *v),
                      void *ctx);

/* wf_ctl_handle_fn for the worker slice and RegisterWorker/ListWorkers/ReportResidency; ctx is
 * the registry. */
int wf_workers_handle(void *ctx, const Weightfloor__V1__Request *req, Weightfloor__V1__Reply *reply,
                      struct wf_ctl_call *call);

#endif
