/* The worker's link to its agent: registration and residency reports.
 *
 * Registration. A thread registers (RegisterWorker) at start and then every
 * WF_AGENTLINK_HEARTBEAT_MS: a restarted agent knows the worker again within one beat, and an
 * absent agent costs nothing but a log line when it goes and comes back. A refusal that retrying
 * cannot change (the id belongs to another live worker, or the agent will not take our id or
 * endpoint) is final: the thread stops and calls on_refused, since a worker that stayed up
 * unregistered would be unreachable through the agent while looking healthy.
 *
 * Residency reports. The cache's manager thread passes its events to wf_agentlink_cache_event(),
 * which never waits on the agent: it only appends to a bounded queue (WF_AGENTLINK_QUEUE, the
 * oldest entry goes when it is full) and wakes a sender thread, which sends what is queued in one
 * ReportResidency with a short timeout. Nothing is retried: changes the agent cannot take (down,
 * restarted and not yet re-registered) are dropped and counted, and the next change sent carries
 * the count in its message, so a watcher knows it missed some and can query WorkerStatus. A
 * report the agent refuses because it does not know the worker (it restarted) asks for a
 * registration at once.
 *
 * Lifecycle: create (no thread; events are queued from then on), start (the two threads; only
 * with an agent), close (asks them to stop; does not block), stop (joins them), destroy. The
 * service is borrowed: its worker_id, endpoint, device, cache and agent client are read by the
 * threads, so they must be set before start and outlive stop. Executable code: it logs. Every
 * function is thread-safe. */
#ifndef WF_WORKER_AGENTLINK_H
#define WF_WORKER_AGENTLINK_H

#include "worker/cache.h"

#include <stdbool.h>
#include <stdint.h>

#define WF_AGENTLINK_HEARTBEAT_MS 5000
#define WF_AGENTLINK_QUEUE        256  /* residency changes waiting at most */
#define WF_AGENTLINK_REPORT_MS    1000 /* one ReportResidency's timeout */

struct wf_worker_svc;
struct wf_agentlink;

/* Called once, on the registration thread, when the agent refuses the worker for good (the
 * refusal is logged first). wf-worker stops itself. */
typedef void wf_agentlink_refused_fn(void *ctx);

/* Returns 0 and *ret, or -ENOMEM. */
int wf_agentlink_create(struct wf_worker_svc *svc, wf_agentlink_refused_fn *on_refused, void *ctx,
                        struct wf_agentlink **ret);
/* Starts registering and reporting. Returns 0, or -errno of pthread_create (nothing started). */
int wf_agentlink_start(struct wf_agentlink *link);
void wf_agentlink_close(struct wf_agentlink *link);
void wf_agentlink_stop(struct wf_agentlink *link);
/* Closes and stops first if need be. Accepts NULL. */
void wf_agentlink_destroy(struct wf_agentlink *link);

/* The residency part of a cache event (RESIDENCY and LOAD_FAILED are queued; an EVICTED gives
 * its reason to the RESIDENCY change that follows it). Accepts a NULL link (no agent). */
void wf_agentlink_cache_event(struct wf_agentlink *link, const struct wf_cache_event *ev);

/* For /readyz and /livez: started (an agent exists), the last registration accepted, how long
 * ago (ms) the registration loop last turned, and whether the agent refused us for good. */
bool wf_agentlink_started(const struct wf_agentlink *link);
bool wf_agentlink_registered(const struct wf_agentlink *link);
int64_t wf_agentlink_beat_age_ms(const struct wf_agentlink *link);
bool wf_agentlink_refused(const struct wf_agentlink *link);

#endif
