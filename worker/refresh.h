/* What the worker does when a floor publishes a new generation of some tensors (the agent's
 * PUBLISHED event, heard by worker/agentevents.h): the refresh seam's worker half
 * (wf_worker_svc_refresh: the store re-uploads the resident ones, the engines swap them in at
 * their step boundary, the old copies go), one log line per event ("model M: tensors [..]
 * published at generation G ... refreshed") and the latest published generation per model, for
 * WorkerStatus to report. It runs on the ear's thread.
 *
 * Thread-safety: the callbacks run on the ear's thread; wf_worker_refresh_generation() may be
 * called from any thread (a mutex guards the table, held for memory only). */
#ifndef WF_WORKER_REFRESH_H
#define WF_WORKER_REFRESH_H

#include "control/client.h"
#include "model/model.h"

struct wf_worker_svc;

#include <stdbool.h>
#include <stdint.h>

struct wf_worker_refresh;

/* The table, and the ear on the agent wired to it. The ear's endpoint: $WF_AGENT_EVENTS when set
 * ("none": no ear: returns 0 and *ret NULL), else asked of the agent (AgentStatusReply.events_url)
 * over agent, which is borrowed and must outlive destroy. tls: for a tls+tcp:// endpoint
 * (copied). svc (borrowed, outliving destroy; NULL: record and log only): where the refreshes
 * go. Returns 0 and *ret, or WF_EINVAL / -ENOMEM / -errno. */
int wf_worker_refresh_create(struct wf_ctl_client *agent, const struct wf_ctl_tls_opts *tls,
                             struct wf_worker_svc *svc, struct wf_worker_refresh **ret);

/* Closes and stops the ear (within about a second: one receive poll or one AgentStatus call),
 * then frees the table. Accepts NULL. */
void wf_worker_refresh_destroy(struct wf_worker_refresh *r);

/* wf_agent_events_published_fn (worker/agentevents.h); ctx is the struct wf_worker_refresh.
 * Refreshes the tensors on this worker (wf_worker_svc_refresh), logs one line and records
 * generation as the model's latest. */
void wf_worker_refresh_published(void *ctx, const char *model, const struct wf_digest *digest,
                                 uint64_t generation, uint32_t n, const uint32_t *tensor_ids);

/* The latest generation published for model (the agent's name) and its floor's digest, as the
 * events told: true when one was seen. Thread-safe; ret_* written only when true. */
bool wf_worker_refresh_generation(struct wf_worker_refresh *r, const char *model,
                                  struct wf_digest *ret_digest, uint64_t *ret_generation);

#endif
