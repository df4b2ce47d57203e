/* The worker's ear on its agent: a thread subscribed to the agent's event endpoint (PUB,
 * control/pub.h) that hands every EVENT_KIND_PUBLISHED event (a floor published a new generation
 * of some tensors, docs/PROTOCOL.md "Publishing") to a callback.
 *
 * Where the endpoint is: opts.url when given; otherwise the thread asks the agent
 * (AgentStatusReply.events_url, API 1.4) over opts.agent, and asks again after every failure, so
 * a worker that starts before its agent, or outlives a restart, finds it when it comes.
 *
 * Resets: the subscription redials by itself (nng) while the agent restarts; any other receive
 * error closes it and the thread opens a new one after opts.redial_ms, asking for the url again
 * when it was not given. PUB keeps no history and drops events for a subscriber that falls
 * behind: what the agent published while nobody listened is not seen. The thread tells
 * on_lost (optional) when it knows it missed events: a jump in Event.sequence, a new publisher
 * epoch (the agent restarted), or a new subscription after a lost one. Whoever keeps per-tensor
 * state then compares the floor's generations (wf_shm_region_tensor()) with its own.
 *
 * Threads and ownership. Callbacks run on the ear's thread, one at a time, in event order; they
 * must not block for long (events queue meanwhile, and a full queue drops them) and must not
 * call close/stop/destroy. Their pointer arguments are valid during the call only. opts.agent is
 * borrowed and must outlive stop(). Shutdown in the tree's three steps: close (does not
 * block; a callback in progress finishes, and the thread starts no other), stop (joins the
 * thread: within one receive poll, WF_AGENT_EVENTS_POLL_MS, or one AgentStatus call, 1 s),
 * destroy. The module
 * does not log: opts.on_note reports what a daemon may want in its log (subscribed, lost,
 * redialing), at most once per state change. */
#ifndef WF_WORKER_AGENTEVENTS_H
#define WF_WORKER_AGENTEVENTS_H

#include "control/client.h"
#include "model/model.h"

#include <stdint.h>

#define WF_AGENT_EVENTS_POLL_MS   200
#define WF_AGENT_EVENTS_REDIAL_MS 1000

/* A floor published generation `generation` of the tensors tensor_ids[0..n) (their indices in
 * the floor, model order) of model (the agent's name for it), whose floor is named by digest. A
 * publish of very many tensors may come as several calls with the same digest and generation
 * (their ids together are the publish's). */
typedef void (*wf_agent_events_published_fn)(void *ctx, const char *model,
                                             const struct wf_digest *digest, uint64_t generation,
                                             uint32_t n, const uint32_t *tensor_ids);

enum wf_agent_events_note {
	WF_AGENT_EVENTS_SUBSCRIBED = 1, /* a subscription is open (text: the url) */
	WF_AGENT_EVENTS_NO_URL = 2,     /* the agent did not say where its events are (text: why) */
	WF_AGENT_EVENTS_REDIAL = 3,     /* the subscription failed; retrying (text: why) */
	WF_AGENT_EVENTS_BAD_EVENT = 4,  /* a PUBLISHED event without a valid digest (ignored) */
};

struct wf_agent_events_opts {
	const char *url;             /* the agent's event endpoint; NULL: ask the agent */
	struct wf_ctl_client *agent; /* for AgentStatus when url is NULL; borrowed */
	struct wf_ctl_tls_opts tls;  /* for a tls+tcp:// endpoint (copied, files by name) */
	wf_agent_events_published_fn on_published; /* required */
	/* Optional: events were missed (missed: how many, 0 when unknown: a restart or a new
	 * subscription). */
	void (*on_lost)(void *ctx, uint64_t missed);
	/* Optional: state changes worth a log line; text valid during the call. */
	void (*on_note)(void *ctx, enum wf_agent_events_note note, const char *text);
	void *ctx;          /* passed to the callbacks */
	uint32_t redial_ms; /* wait before a new subscription or a new question; 0: the default */
};

struct wf_agent_events;

/* Starts the thread. Needs on_published, and url or agent. Returns 0 and *ret, WF_EINVAL, or
 * -ENOMEM / -errno (pthread_create). opts is copied (url too). */
int wf_agent_events_create(const struct wf_agent_events_opts *opts, struct wf_agent_events **ret);

/* Tells the thread to end; does not block. Thread-safe, idempotent. Accepts NULL. */
void wf_agent_events_close(struct wf_agent_events *ae);
/* close(), then waits for the thread. Not from a callback. Accepts NULL. */
void wf_agent_events_stop(struct wf_agent_events *ae);
/* stop() if needed, then frees. Accepts NULL. */
void wf_agent_events_destroy(struct wf_agent_events *ae);

#endif
