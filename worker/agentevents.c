/* The worker's ear on its agent (worker/agentevents.h). */
#include "worker/agentevents.h"

#include "base/error.h"
#include "proto/status.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* How long the thread waits for the agent's AgentStatus when it asks for the url: short, so
 * that stop() stays prompt (the call cannot be interrupted). */
#define ASK_TIMEOUT_MS 1000

struct wf_agent_events {
	struct wf_agent_events_opts o;
	char *url; /* opts.url, copied; NULL: ask */
	pthread_t thread;
	bool started, joined;
	atomic_bool closing;
	/* what the thread last told on_note, so a state is told once */
	enum wf_agent_events_note last_note;
	/* for on_lost: the last event seen */
	uint64_t last_seq, last_epoch;
	bool have_last;   /* an event was seen */
	bool lost_before; /* a subscription was lost: the next one may have missed events */
};

static void note(struct wf_agent_events *ae, enum wf_agent_events_note n, const char *text)
{
	/* A subscription is worth a line every time; trouble once until it changes. */
	if (n != WF_AGENT_EVENTS_SUBSCRIBED && n == ae->last_note)
		return;
	ae->last_note = n;
	if (ae->o.on_note)
		ae->o.on_note(ae->o.ctx, n, text);
}

/* Sleeps ms in short steps, returning early when closing. */
static void pause_ms(struct wf_agent_events *ae, uint32_t ms)
{
	for (uint32_t t = 0; t < ms && !atomic_load(&ae->closing); t += 50) {
		struct timespec ts = {0, 50 * 1000 * 1000};
		nanosleep(&ts, NULL);
	}
}

/* The agent's event url (malloc'ed) from AgentStatus, or NULL with why. */
static char *ask_url(struct wf_agent_events *ae, char *why, size_t len)
{
	Weightfloor__V1__AgentStatus as = WEIGHTFLOOR__V1__AGENT_STATUS__INIT;
	Weightfloor__V1__Request req = WEIGHTFLOOR__V1__REQUEST__INIT;
	Weightfloor__V1__Reply *rep = NULL;
	struct wf_diag d = {{0}};
	char *url = NULL;
	req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_AGENT_STATUS;
	req.agent_status = &as;
	int rc = wf_ctl_client_call_timeout(ae->o.agent, &req, ASK_TIMEOUT_MS, &rep, &d);
	if (rc < 0) {
		snprintf(why, len, "the agent does not answer: %s", wf_diag_str(&d, rc));
	} else if (rep->code != WEIGHTFLOOR__V1__STATUS__STATUS_OK ||
	           rep->body_case != WEIGHTFLOOR__V1__REPLY__BODY_AGENT_STATUS) {
		snprintf(why, len, "AgentStatus: %s: %s", wf_proto_status_name(rep->code),
		         rep->message ? rep->message : "");
	} else if (!rep->agent_status->events_url || !*rep->agent_status->events_url) {
		snprintf(why, len,
		         "the agent does not say where its events are (an agent older than API "
		         "1.4): set WF_AGENT_EVENTS");
	} else if (!(url = strdup(rep->agent_status->events_url))) {
		snprintf(why, len, "out of memory");
	}
	wf_ctl_reply_free(rep);
	return url;
}

/* Loss accounting for on_lost: gaps in the sequence, a new epoch, a first event after a lost
 * subscription. */
static void account(struct wf_agent_events *ae, const Weightfloor__V1__Event *ev)
{
	uint64_t missed = 0;
	bool lost = false;
	if (ae->lost_before) {
		lost = true; /* unknown how many */
	} else if (!ae->have_last) {
		lost = false; /* the first subscription: what came before is the caller's to know */
	} else if (ev->epoch != ae->last_epoch) {
		lost = true;
	} else if (ev->sequence > ae->last_seq + 1) {
		lost = true;
		missed = ev->sequence - ae->last_seq - 1;
	}
	ae->lost_before = false;
	ae->have_last = true;
	ae->last_seq = ev->sequence;
	ae->last_epoch = ev->epoch;
	if (lost && ae->o.on_lost)
		ae->o.on_lost(ae->o.ctx, missed);
}

static void deliver(struct wf_agent_events *ae, const Weightfloor__V1__Event *ev)
{
	struct wf_digest dg;
	if (ev->kind != WEIGHTFLOOR__V1__EVENT_KIND__EVENT_KIND_PUBLISHED)
		return;
	if (!ev->digest || wf_digest_parse(ev->digest, &dg) < 0 || !ev->model) {
		char text[160];
		snprintf(text, sizeof text,
		         "a PUBLISHED event for model '%.64s' with digest '%.40s'",
		         ev->model ? ev->model : "", ev->digest ? ev->digest : "");
		note(ae, WF_AGENT_EVENTS_BAD_EVENT, text);
		return;
	}
	uint32_t n = ev->n_tensor_ids > UINT32_MAX ? UINT32_MAX : (uint32_t)ev->n_tensor_ids;
	ae->o.on_published(ae->o.ctx, ev->model, &dg, ev->generation, n, ev->tensor_ids);
}

/* One subscription, until it fails or the ear closes. */
static void listen_on(struct wf_agent_events *ae, const char *url)
{
	struct wf_ctl_client_opts so = {.wait_for_server = true, .tls = ae->o.tls};
	struct wf_ctl_sub *sub = NULL;
	struct wf_diag d = {{0}};
	char text[512];
	int rc = wf_ctl_sub_open(url, &so, &sub, &d);
	if (rc < 0) {
		snprintf(text, sizeof text, "%s: %s", url, wf_diag_str(&d, rc));
		note(ae, WF_AGENT_EVENTS_REDIAL, text);
		return;
	}
	note(ae, WF_AGENT_EVENTS_SUBSCRIBED, url);
	while (!atomic_load(&ae->closing)) {
		Weightfloor__V1__Event *ev = NULL;
		wf_diag_clear(&d);
		rc = wf_ctl_sub_recv(sub, WF_AGENT_EVENTS_POLL_MS, &ev, &d);
		if (rc == WF_ETIMEOUT || rc == WF_EFORMAT)
			continue;
		if (rc < 0) {
			snprintf(text, sizeof text, "%s: %s", url, wf_diag_str(&d, rc));
			note(ae, WF_AGENT_EVENTS_REDIAL, text);
			break;
		}
		account(ae, ev);
		deliver(ae, ev);
		wf_ctl_event_free(ev);
	}
	wf_ctl_sub_close(sub);
	ae->lost_before = true;
}

static void *ear_main(void *arg)
{
	struct wf_agent_events *ae = arg;
	uint32_t redial = ae->o.redial_ms ? ae->o.redial_ms : WF_AGENT_EVENTS_REDIAL_MS;
	char why[512];
	while (!atomic_load(&ae->closing)) {
		char *asked = NULL;
		const char *url = ae->url;
		if (!url) {
			asked = ask_url(ae, why, sizeof why);
			if (!asked) {
				note(ae, WF_AGENT_EVENTS_NO_URL, why);
				pause_ms(ae, redial);
				continue;
			}
			url = asked;
		}
		listen_on(ae, url);
		free(asked);
		pause_ms(ae, redial);
	}
	return NULL;
}

int wf_agent_events_create(const struct wf_agent_events_opts *opts, struct wf_agent_events **ret)
{
	if (!opts || !ret || !opts->on_published || (!opts->url && !opts->agent))
		return WF_EINVAL;
	struct wf_agent_events *ae = calloc(1, sizeof(*ae));
	if (!ae)
		return -ENOMEM;
	ae->o = *opts;
	ae->o.url = NULL;
	atomic_init(&ae->closing, false);
	if (opts->url && !(ae->url = strdup(opts->url))) {
		free(ae);
		return -ENOMEM;
	}
	int e = pthread_create(&ae->thread, NULL, ear_main, ae);
	if (e != 0) {
		free(ae->url);
		free(ae);
		return -e;
	}
	ae->started = true;
	*ret = ae;
	return 0;
}

void wf_agent_events_close(struct wf_agent_events *ae)
{
	if (ae)
		atomic_store(&ae->closing, true);
}

void wf_agent_events_stop(struct wf_agent_events *ae)
{
	if (!ae)
		return;
	wf_agent_events_close(ae);
	if (ae->started && !ae->joined) {
		pthread_join(ae->thread, NULL);
		ae->joined = true;
	}
}

void wf_agent_events_destroy(struct wf_agent_events *ae)
{
	if (!ae)
		return;
	wf_agent_events_stop(ae);
	free(ae->url);
	free(ae);
}
