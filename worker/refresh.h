/* What the worker does when a floor publishes a new generation of some tensors (the agent's
 * PUBLISHED event, heard by worker/agentevents.h): for now one log line per event ("model M:
 * tensors [..] published at generation G") and the latest published generation per model, for
 * WorkerStatus to report. The device store's refresh (re-upload the tensors whose generation
 * moved, then swap them in at a step boundary) plugs in at wf_worker_refresh_published(), which
 * runs on the ear's thread.
 *
 * Thread-safety: the callbacks run on the ear's thread; wf_worker_refresh_generation() may be
 * called from any thread (a mutex guards the table, held for memory only). */
#ifndef WF_WORKER_REFRESH_H
#define WF_WORKER_REFRESH_H

#include "control/client.h"
#include "model/model.h"

#include <stdbool.h>
#include <stdint.h>

struct wf_worker_refresh;

/* The table, and the ear on the agent wired to it. The ear's endpoint: $WF_AGENT_EVENTS when set
 * ("none": no ear: returns 0 and *ret NULL), else asked of the agent (AgentStatusReply.events_url)
 * over agent, which is borrowed and must outlive destroy. tls: for a tls+tcp:// endpoint
 * (copied). Returns 0 and *ret, or WF_EINVAL / -ENOMEM / -errno. */
int wf_worker_refresh_create(struct wf_ctl_client *agent, const struct wf_ctl_tls_opts *tls,
                             struct wf_worker_refresh **ret);

/* Closes and stops the ear (within about a second: one receive poll or one AgentStatus call),
 * then frees the table. Accepts NULL. */
void wf_worker_refresh_destroy(struct wf_worker_refresh *r);

/* wf_agent_events_published_fn (worker/agentevents.h); ctx is the struct wf_worker_refresh. Logs
 * one line and records generation as the model's latest. */
void wf_worker_refresh_published(void *ctx, const char *model, const struct wf_digest *digest,
                                 uint64_t generation, uint32_t n, const uint32_t *tensor_ids);

/* The latest generation published for model (the agent's name) and its floor's digest, as the
 * events told: true when one was seen. Thread-safe; ret_* written only when true. */
bool wf_worker_refresh_generation(struct wf_worker_refresh *r, const char *model,
                                  struct wf_digest *ret_digest, uint64_t *ret_generation);

#endif
