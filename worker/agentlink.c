/* The worker's link to its agent (worker/agentlink.h). */
#include "worker/agentlink.h"

#include "base/error.h"
#include "base/log.h"
#include "control/client.h"
#include "device/device.h"
#include "proto/status.h"
#include "worker/service.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define REGISTER_TIMEOUT_MS 3000

struct report_entry {
	char model[256];
	char message[192];
	enum wf_residency state;
	uint64_t device_bytes;
	int64_t time_ms;
};

struct wf_agentlink {
	struct wf_worker_svc *svc;
	wf_agentlink_refused_fn *on_refused;
	void *ctx;
	pthread_mutex_t mu;
	pthread_cond_t cv;   /* the heartbeat's wait and the sender's queue, both under mu */
	bool stop;           /* under mu */
	atomic_bool started; /* start was called: there is an agent */
	unsigned threads;    /* running, to join: start, stop and destroy only */
	/* registration */
	atomic_bool refused;     /* the agent refused us for good */
	atomic_bool registered;  /* the last registration was accepted */
	_Atomic int64_t beat_ms; /* CLOCK_MONOTONIC ms of the loop's last turn */
	bool poke;               /* under mu: register now, do not wait for the beat */
	pthread_t heartbeat;
	/* reports */
	struct report_entry q[WF_AGENTLINK_QUEUE]; /* ring under mu: head, n */
	size_t head, n;
	uint64_t
	    lost; /* under mu: dropped (queue full, or the agent did not take them), not told */
	char evicted_model[256],
	    evicted_why[64]; /* under mu: an EVICTED waiting for its RESIDENCY */
	struct report_entry batch[WF_AGENTLINK_QUEUE]; /* the sender thread's own */
	pthread_t sender;
};

static int64_t mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
}

static int64_t now_unix_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
}

/* ---- registration ------------------------------------------------------------------------- */

/* Registers (or heartbeats) once. Returns 0, the agent's refusal as a WF_E* code with its
 * message in diag, or the transport error. */
static int register_once(struct wf_worker_svc *s, struct wf_diag *diag)
{
	struct wf_cache_status *st = NULL;
	if (wf_cache_status(s->cache, &st) < 0)
		return -ENOMEM;
	Weightfloor__V1__RegisterWorker rw = WEIGHTFLOOR__V1__REGISTER_WORKER__INIT;
	rw.pid = (uint32_t)getpid();
	rw.device_name = (char *)wf_device_name(s->dev);
	rw.endpoint = (char *)s->endpoint;
	rw.device_total_bytes = st->mem_total;
	rw.device_budget_bytes = st->budget.on_demand;
	rw.worker_id = (char *)s->worker_id;
	rw.mode = wf_worker_svc_mode_pb(st->mode);
	wf_cache_status_free(st);
	Weightfloor__V1__Request req = WEIGHTFLOOR__V1__REQUEST__INIT;
	req.client = (char *)s->worker_id;
	req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_REGISTER_WORKER;
	req.register_worker = &rw;
	Weightfloor__V1__Reply *rep = NULL;
	int rc = wf_ctl_client_call_timeout(s->agent, &req, REGISTER_TIMEOUT_MS, &rep, diag);
	if (rc == 0) {
		rc = wf_proto_status_to_err(rep->code);
		if (rc < 0)
			wf_diag_set(diag, rc, "%s", rep->message);
		wf_ctl_reply_free(rep);
	}
	return rc;
}

/* Refusals that retrying cannot change: the id belongs to another live worker
 * (FAILED_PRECONDITION), or the agent will not take our id or endpoint (INVALID_ARGUMENT). */
static bool refusal_is_final(int rc)
{
	return rc == WF_ESTATE || rc == WF_EINVAL;
}

static void *heartbeat_main(void *arg)
{
	struct wf_agentlink *l = arg;
	struct wf_worker_svc *s = l->svc;
	bool was_up = false, first = true;
	pthread_mutex_lock(&l->mu);
	while (!l->stop) {
		pthread_mutex_unlock(&l->mu);
		atomic_store(&l->beat_ms, mono_ms());
		struct wf_diag d = {{0}};
		int rc = register_once(s, &d);
		bool up = rc == 0;
		atomic_store(&l->registered, up);
		if (refusal_is_final(rc)) {
			wf_log_error("the agent refused worker '%s': %s; stopping", s->worker_id,
			             wf_diag_str(&d, rc));
			atomic_store(&l->refused, true);
			if (l->on_refused)
				l->on_refused(l->ctx);
			return NULL;
		}
		if (rc < 0 &&
		    wf_proto_status_from_err(rc) != WEIGHTFLOOR__V1__STATUS__STATUS_UNAVAILABLE &&
		    rc != WF_ETRANSPORT)
			wf_log_warn("agent refused the registration: %s", wf_diag_str(&d, rc));
		if (up != was_up || first) {
			if (up)
				wf_log_info("registered with the agent as '%s'", s->worker_id);
			else
				wf_log_warn(
				    "agent unreachable: serving with the floors already attached; "
				    "retrying every %d s",
				    WF_AGENTLINK_HEARTBEAT_MS / 1000);
		}
		was_up = up;
		first = false;
		pthread_mutex_lock(&l->mu);
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec += WF_AGENTLINK_HEARTBEAT_MS / 1000;
		while (!l->stop && !l->poke &&
		       pthread_cond_timedwait(&l->cv, &l->mu, &ts) != ETIMEDOUT)
			;
		l->poke = false;
	}
	pthread_mutex_unlock(&l->mu);
	return NULL;
}

/* ---- residency reports -------------------------------------------------------------------- */

/* Queues one change; never waits on anything but the queue's own short-held lock. Under mu. */
static void push_locked(struct wf_agentlink *l, const char *model, enum wf_residency state,
                        uint64_t device_bytes, const char *message)
{
	if (l->n == WF_AGENTLINK_QUEUE) {
		l->head = (l->head + 1) % WF_AGENTLINK_QUEUE;
		l->n--;
		l->lost++;
	}
	struct report_entry *e = &l->q[(l->head + l->n++) % WF_AGENTLINK_QUEUE];
	snprintf(e->model, sizeof e->model, "%s", model);
	snprintf(e->message, sizeof e->message, "%s", message ? message : "");
	e->state = state;
	e->device_bytes = device_bytes;
	e->time_ms = now_unix_ms();
	pthread_cond_broadcast(&l->cv);
}

/* Sends one batch. Returns 0 or the error (the batch is gone either way). */
static int send_batch(struct wf_agentlink *l, size_t n, uint64_t lost)
{
	Weightfloor__V1__ResidencyChange ch[WF_AGENTLINK_QUEUE];
	Weightfloor__V1__ResidencyChange *chp[WF_AGENTLINK_QUEUE];
	char note[256];
	for (size_t i = 0; i < n; i++) {
		Weightfloor__V1__ResidencyChange c = WEIGHTFLOOR__V1__RESIDENCY_CHANGE__INIT;
		c.model = l->batch[i].model;
		c.state = wf_worker_residency_pb(l->batch[i].state);
		c.device_bytes = l->batch[i].device_bytes;
		c.message = l->batch[i].message;
		c.time_unix_ms = l->batch[i].time_ms;
		ch[i] = c;
		chp[i] = &ch[i];
	}
	if (lost && n) {
		snprintf(note, sizeof note, "%s%s%llu earlier residency changes were not reported",
		         ch[0].message, *ch[0].message ? "; " : "", (unsigned long long)lost);
		ch[0].message = note;
	}
	Weightfloor__V1__ReportResidency rr = WEIGHTFLOOR__V1__REPORT_RESIDENCY__INIT;
	rr.worker_id = (char *)l->svc->worker_id;
	rr.n_changes = n;
	rr.changes = chp;
	Weightfloor__V1__Request req = WEIGHTFLOOR__V1__REQUEST__INIT;
	req.client = (char *)l->svc->worker_id;
	req.deadline_ms = WF_AGENTLINK_REPORT_MS;
	req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_REPORT_RESIDENCY;
	req.report_residency = &rr;
	Weightfloor__V1__Reply *rep = NULL;
	struct wf_diag d = {{0}};
	int rc = wf_ctl_client_call_timeout(l->svc->agent, &req, WF_AGENTLINK_REPORT_MS, &rep, &d);
	if (rc == 0) {
		rc = wf_proto_status_to_err(rep->code);
		wf_ctl_reply_free(rep);
	}
	return rc;
}

static void *sender_main(void *arg)
{
	struct wf_agentlink *l = arg;
	pthread_mutex_lock(&l->mu);
	for (;;) {
		while (!l->stop && l->n == 0)
			pthread_cond_wait(&l->cv, &l->mu);
		if (l->stop)
			break;
		size_t n = l->n;
		for (size_t i = 0; i < n; i++)
			l->batch[i] = l->q[(l->head + i) % WF_AGENTLINK_QUEUE];
		l->head = (l->head + n) % WF_AGENTLINK_QUEUE;
		l->n = 0;
		uint64_t lost = l->lost;
		pthread_mutex_unlock(&l->mu);
		/* Unregistered (agent down or not yet answered): the agent would refuse the report,
		 * and waiting for it would send stale news later. */
		int rc = atomic_load(&l->registered) ? send_batch(l, n, lost) : WF_EUNAVAILABLE;
		pthread_mutex_lock(&l->mu);
		if (rc == WF_ENOT_FOUND) {
			/* The agent restarted and does not know us yet: register now. */
			atomic_store(&l->registered, false);
			l->poke = true;
			pthread_cond_broadcast(&l->cv);
		}
		/* Told: what was counted when the batch left; drops since then wait for the next.
		 */
		if (rc == 0)
			l->lost -= lost;
		else
			l->lost += n;
	}
	pthread_mutex_unlock(&l->mu);
	return NULL;
}

void wf_agentlink_cache_event(struct wf_agentlink *l, const struct wf_cache_event *ev)
{
	if (!l)
		return;
	char msg[192] = "";
	pthread_mutex_lock(&l->mu);
	switch (ev->type) {
	case WF_CACHE_EVENT_RESIDENCY:
		if (l->evicted_model[0] && strcmp(l->evicted_model, ev->name) == 0)
			snprintf(msg, sizeof msg, "evicted (%s)", l->evicted_why);
		l->evicted_model[0] = 0;
		if (!msg[0] && ev->over_budget)
			snprintf(msg, sizeof msg, "larger than the on-demand budget");
		push_locked(l, ev->name, ev->state,
		            ev->state == WF_RESIDENCY_DEVICE ||
		                    ev->state == WF_RESIDENCY_PINNED_DEVICE
		                ? ev->total
		                : 0,
		            msg);
		break;
	case WF_CACHE_EVENT_LOAD_FAILED:
		snprintf(msg, sizeof msg, "load failed: %s",
		         ev->msg ? ev->msg : wf_strerror(ev->error));
		push_locked(l, ev->name, ev->state, 0, msg);
		break;
	case WF_CACHE_EVENT_EVICTED:
		/* The cache follows with the RESIDENCY event of the new state: the reason rides on
		 * it, one change per eviction. */
		snprintf(l->evicted_model, sizeof l->evicted_model, "%s", ev->name);
		snprintf(l->evicted_why, sizeof l->evicted_why, "%s",
		         ev->msg ? ev->msg : "command");
		break;
	default:
		break;
	}
	pthread_mutex_unlock(&l->mu);
}

/* ---- lifecycle ---------------------------------------------------------------------------- */

int wf_agentlink_create(struct wf_worker_svc *svc, wf_agentlink_refused_fn *on_refused, void *ctx,
                        struct wf_agentlink **ret)
{
	struct wf_agentlink *l = calloc(1, sizeof(*l));
	if (!l)
		return -ENOMEM;
	l->svc = svc;
	l->on_refused = on_refused;
	l->ctx = ctx;
	pthread_mutex_init(&l->mu, NULL);
	pthread_cond_init(&l->cv, NULL);
	*ret = l;
	return 0;
}

int wf_agentlink_start(struct wf_agentlink *l)
{
	atomic_store(&l->beat_ms, mono_ms());
	/* Before the threads: /readyz must not see "no agent" first. */
	atomic_store(&l->started, true);
	int rc = -pthread_create(&l->heartbeat, NULL, heartbeat_main, l);
	if (rc == 0) {
		l->threads = 1;
		rc = -pthread_create(&l->sender, NULL, sender_main, l);
	}
	if (rc < 0) {
		wf_agentlink_stop(l);
		atomic_store(&l->started, false);
		return rc;
	}
	l->threads = 2;
	return 0;
}

void wf_agentlink_close(struct wf_agentlink *l)
{
	if (!l)
		return;
	pthread_mutex_lock(&l->mu);
	l->stop = true;
	pthread_cond_broadcast(&l->cv);
	pthread_mutex_unlock(&l->mu);
}

void wf_agentlink_stop(struct wf_agentlink *l)
{
	if (!l)
		return;
	wf_agentlink_close(l);
	if (l->threads >= 1)
		pthread_join(l->heartbeat, NULL);
	if (l->threads >= 2)
		pthread_join(l->sender, NULL);
	l->threads = 0;
}

void wf_agentlink_destroy(struct wf_agentlink *l)
{
	if (!l)
		return;
	wf_agentlink_stop(l);
	pthread_cond_destroy(&l->cv);
	pthread_mutex_destroy(&l->mu);
	free(l);
}

bool wf_agentlink_started(const struct wf_agentlink *l)
{
	return l && atomic_load(&l->started);
}

bool wf_agentlink_registered(const struct wf_agentlink *l)
{
	return l && atomic_load(&l->registered);
}

int64_t wf_agentlink_beat_age_ms(const struct wf_agentlink *l)
{
	return l ? mono_ms() - atomic_load(&l->beat_ms) : 0;
}

bool wf_agentlink_refused(const struct wf_agentlink *l)
{
	return l && atomic_load(&l->refused);
}
