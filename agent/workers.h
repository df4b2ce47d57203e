/* The agent's registry of the node's workers, and the relay that lets a control plane reach any
 * worker through the agent's one address.
 *
 * A worker registers (RegisterWorker) at start and then every few seconds as a heartbeat; the
 * heartbeat is also how a worker finds a restarted agent. A worker that has not been heard from
 * for WF_WORKERS_EXPIRE_MS, or whose pid is gone, is dropped. Requests of the worker slice
 * (SetResidency, Pin, Unpin, Evict, Prefetch, Compact, WorkerStatus) naming a worker_id, or
 * naming none when exactly one worker is registered, are forwarded to that worker's endpoint and
 * its reply is returned as the agent's.
 *
 * Thread-safe. */
#ifndef WF_AGENT_WORKERS_H
#define WF_AGENT_WORKERS_H

#include "control/server.h"

#include <stdint.h>

#define WF_WORKERS_EXPIRE_MS 15000
#define WF_WORKERS_MAX 256

struct wf_workers;

/* on_change(ctx, worker_id, message) is called without locks held for registrations and drops. */
typedef void (*wf_workers_event_fn)(void *ctx, const char *worker_id, const char *message);

int wf_workers_create(wf_workers_event_fn on_change, void *ctx, struct wf_workers **ret);
void wf_workers_destroy(struct wf_workers *w);
uint32_t wf_workers_count(void *w);

/* wf_ctl_handle_fn for the worker slice and RegisterWorker/ListWorkers; ctx is the registry. */
int wf_workers_handle(void *ctx, const Weightfloor__V1__Request *req,
		      Weightfloor__V1__Reply *reply, struct wf_ctl_call *call);

#endif
