/* The worker's side of published generations (worker/refresh.h). */
#include "worker/refresh.h"

#include "base/error.h"
#include "base/log.h"
#include "worker/agentevents.h"
#include "worker/service.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Tensor ids a log line lists before "and N more". */
#define LOG_IDS 16

struct published {
	char *model;
	struct wf_digest digest;
	uint64_t generation;
};

struct wf_worker_refresh {
	struct wf_agent_events *ear;
	struct wf_worker_svc *svc; /* NULL: record and log only */
	pthread_mutex_t mu;        /* guards the table below; memory only */
	struct published *v;
	size_t n, cap;
};

/* Records (model, digest, generation) as the model's latest. A generation lower than the one
 * known for the same floor is an old event (not possible from one agent, but harmless); another
 * floor (the model re-registered with other files) replaces it. */
static int record(struct wf_worker_refresh *r, const char *model, const struct wf_digest *digest,
                  uint64_t generation)
{
	int rc = 0;
	pthread_mutex_lock(&r->mu);
	struct published *p = NULL;
	for (size_t i = 0; i < r->n && !p; i++)
		if (strcmp(r->v[i].model, model) == 0)
			p = &r->v[i];
	if (!p) {
		char *name = strdup(model);
		if (!name) {
			rc = -ENOMEM;
			goto out;
		}
		if (r->n == r->cap) {
			size_t cap = r->cap ? 2 * r->cap : 8;
			struct published *nv = realloc(r->v, cap * sizeof(*nv));
			if (!nv) {
				free(name);
				rc = -ENOMEM;
				goto out;
			}
			r->v = nv;
			r->cap = cap;
		}
		p = &r->v[r->n++];
		*p = (struct published){.model = name, .digest = *digest};
	}
	bool same_floor = p->digest.hi == digest->hi && p->digest.lo == digest->lo;
	if (!same_floor || generation > p->generation) {
		p->digest = *digest;
		p->generation = generation;
	}
out:
	pthread_mutex_unlock(&r->mu);
	return rc;
}

void wf_worker_refresh_published(void *ctx, const char *model, const struct wf_digest *digest,
                                 uint64_t generation, uint32_t n, const uint32_t *tensor_ids)
{
	struct wf_worker_refresh *r = ctx;
	char ids[LOG_IDS * 12 + 32];
	size_t at = 0;
	ids[0] = '\0';
	for (uint32_t i = 0; i < n && i < LOG_IDS; i++)
		at += (size_t)snprintf(ids + at, sizeof ids - at, "%s%" PRIu32, i ? ", " : "",
		                       tensor_ids[i]);
	if (n > LOG_IDS)
		snprintf(ids + at, sizeof ids - at, " and %" PRIu32 " more", n - LOG_IDS);
	char hex[WF_DIGEST_HEX_LEN];
	wf_digest_hex(digest, hex);
	struct wf_diag d = {{0}};
	const double t0 = now_s();
	const int applied = r->svc ? wf_worker_svc_refresh(r->svc, model, n, tensor_ids, &d) : 0;
	const double secs = now_s() - t0;
	int rc = record(r, model, digest, generation);
	if (applied < 0)
		wf_log_event(WF_LOG_ERROR, WF_LOG_F(.model = model, .event = "refresh_failed"),
		             "tensors [%s] published at generation %" PRIu64
		             " (floor %.12s): not applied on this worker: %s",
		             ids, generation, hex, wf_diag_str(&d, applied));
	else
		wf_log_event(WF_LOG_INFO, WF_LOG_F(.model = model, .event = "published"),
		             "tensors [%s] published at generation %" PRIu64
		             " (floor %.12s)%s, refreshed in %.1f ms%s",
		             ids, generation, hex, rc < 0 ? " (not recorded: out of memory)" : "",
		             secs * 1e3, r->svc ? "" : " (nothing here reads it)");
}

bool wf_worker_refresh_generation(struct wf_worker_refresh *r, const char *model,
                                  struct wf_digest *ret_digest, uint64_t *ret_generation)
{
	bool found = false;
	if (!r || !model)
		return false;
	pthread_mutex_lock(&r->mu);
	for (size_t i = 0; i < r->n && !found; i++) {
		if (strcmp(r->v[i].model, model) == 0) {
			found = true;
			if (ret_digest)
				*ret_digest = r->v[i].digest;
			if (ret_generation)
				*ret_generation = r->v[i].generation;
		}
	}
	pthread_mutex_unlock(&r->mu);
	return found;
}

static void on_lost(void *ctx, uint64_t missed)
{
	(void)ctx;
	/* Until the device store refreshes by comparing generations, a lost event is only said. */
	if (missed)
		wf_log_warn("missed %" PRIu64 " agent events: a published generation may not have "
		            "been heard",
		            missed);
	else
		wf_log_warn("agent events were missed (the agent restarted or the subscription was "
		            "lost): a published generation may not have been heard");
}

static void on_note(void *ctx, enum wf_agent_events_note note, const char *text)
{
	(void)ctx;
	switch (note) {
	case WF_AGENT_EVENTS_SUBSCRIBED:
		wf_log_info("listening for published generations on %s", text);
		break;
	case WF_AGENT_EVENTS_NO_URL:
	case WF_AGENT_EVENTS_REDIAL:
		wf_log_warn("agent events: %s; retrying", text);
		break;
	case WF_AGENT_EVENTS_BAD_EVENT:
		wf_log_warn("agent events: ignored %s", text);
		break;
	}
}

int wf_worker_refresh_create(struct wf_ctl_client *agent, const struct wf_ctl_tls_opts *tls,
                             struct wf_worker_svc *svc, struct wf_worker_refresh **ret)
{
	const char *url = getenv("WF_AGENT_EVENTS");
	if (url && !*url)
		url = NULL;
	if (url && strcmp(url, "none") == 0) {
		*ret = NULL;
		return 0;
	}
	if (!url && !agent)
		return WF_EINVAL;
	struct wf_worker_refresh *r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	pthread_mutex_init(&r->mu, NULL);
	r->svc = svc;
	struct wf_agent_events_opts o = {.url = url,
	                                 .agent = agent,
	                                 .on_published = wf_worker_refresh_published,
	                                 .on_lost = on_lost,
	                                 .on_note = on_note,
	                                 .ctx = r};
	if (tls)
		o.tls = *tls;
	int rc = wf_agent_events_create(&o, &r->ear);
	if (rc < 0) {
		wf_worker_refresh_destroy(r);
		return rc;
	}
	*ret = r;
	return 0;
}

void wf_worker_refresh_destroy(struct wf_worker_refresh *r)
{
	if (!r)
		return;
	wf_agent_events_destroy(r->ear); /* the callbacks use the table: the ear goes first */
	for (size_t i = 0; i < r->n; i++)
		free(r->v[i].model);
	free(r->v);
	pthread_mutex_destroy(&r->mu);
	free(r);
}
