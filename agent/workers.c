#include "agent/workers.h"

#include "base/error.h"
#include "control/client.h"
#include "proto/status.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct worker {
	char id[64];
	uint32_t pid;
	char *device_name, *endpoint, *device_uuid;
	int32_t device_index;
	uint64_t device_total, device_budget, pinned_host_budget;
	int64_t registered_ms, last_seen_ms;
};

struct wf_workers {
	pthread_mutex_t mu;
	struct worker v[WF_WORKERS_MAX];
	size_t n;
	uint64_t next_id;
	wf_workers_event_fn on_change;
	void *ctx;
};

static int64_t unix_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
}

static void worker_fini(struct worker *w)
{
	free(w->device_name);
	free(w->endpoint);
	free(w->device_uuid);
	memset(w, 0, sizeof(*w));
}

int wf_workers_create(wf_workers_event_fn on_change, void *ctx, struct wf_workers **ret)
{
	struct wf_workers *w = calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	pthread_mutex_init(&w->mu, NULL);
	w->on_change = on_change;
	w->ctx = ctx;
	w->next_id = 1;
	*ret = w;
	return 0;
}

void wf_workers_destroy(struct wf_workers *w)
{
	if (!w)
		return;
	for (size_t i = 0; i < w->n; i++)
		worker_fini(&w->v[i]);
	pthread_mutex_destroy(&w->mu);
	free(w);
}

/* Drops workers not heard from in time or whose process is gone (pid checks work in the agent's
 * pid namespace only: a worker in another container is judged by its heartbeat alone). Returns
 * the dropped ids in *dropped (caller frees). */
static size_t expire_locked(struct wf_workers *w, char (*dropped)[64], size_t cap)
{
	int64_t now = unix_ms();
	size_t nd = 0;
	for (size_t i = 0; i < w->n;) {
		struct worker *k = &w->v[i];
		bool gone = now - k->last_seen_ms > WF_WORKERS_EXPIRE_MS ||
			    (k->pid && kill((pid_t)k->pid, 0) < 0 && errno == ESRCH);
		if (!gone) {
			i++;
			continue;
		}
		if (nd < cap)
			memcpy(dropped[nd++], k->id, 64);
		worker_fini(k);
		w->v[i] = w->v[--w->n];
		memset(&w->v[w->n], 0, sizeof(w->v[w->n]));
	}
	return nd;
}

static void notify_dropped(struct wf_workers *w, char (*dropped)[64], size_t nd)
{
	for (size_t i = 0; i < nd; i++)
		if (w->on_change)
			w->on_change(w->ctx, dropped[i], "gone");
}

uint32_t wf_workers_count(void *ctx)
{
	struct wf_workers *w = ctx;
	char dropped[8][64];
	pthread_mutex_lock(&w->mu);
	size_t nd = expire_locked(w, dropped, 8);
	uint32_t n = (uint32_t)w->n;
	pthread_mutex_unlock(&w->mu);
	notify_dropped(w, dropped, nd);
	return n;
}

static struct worker *find_locked(struct wf_workers *w, const char *id)
{
	for (size_t i = 0; i < w->n; i++)
		if (strcmp(w->v[i].id, id) == 0)
			return &w->v[i];
	return NULL;
}

static Weightfloor__V1__WorkerInfo *worker_info(struct wf_ctl_call *call, const struct worker *k)
{
	Weightfloor__V1__WorkerInfo *wi = wf_ctl_call_alloc(call, sizeof(*wi));
	if (!wi)
		return NULL;
	weightfloor__v1__worker_info__init(wi);
	wi->worker_id = wf_ctl_call_strdup(call, k->id);
	wi->device_name = wf_ctl_call_strdup(call, k->device_name ? k->device_name : "");
	wi->endpoint = wf_ctl_call_strdup(call, k->endpoint ? k->endpoint : "");
	wi->device_uuid = wf_ctl_call_strdup(call, k->device_uuid ? k->device_uuid : "");
	if (!wi->worker_id || !wi->device_name || !wi->endpoint || !wi->device_uuid)
		return NULL;
	wi->pid = k->pid;
	wi->device_index = k->device_index;
	wi->device_total_bytes = k->device_total;
	wi->device_budget_bytes = k->device_budget;
	wi->pinned_host_budget_bytes = k->pinned_host_budget;
	wi->registered_unix_ms = k->registered_ms;
	wi->last_seen_unix_ms = k->last_seen_ms;
	return wi;
}

static bool valid_id(const char *s)
{
	size_t n = strlen(s);
	if (n == 0 || n >= 64)
		return false;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      c == '-' || c == '_' || c == '.' || c == ':'))
			return false;
	}
	return true;
}

static int do_register(struct wf_workers *w, const Weightfloor__V1__RegisterWorker *r,
		       Weightfloor__V1__Reply *reply, struct wf_ctl_call *call)
{
	if (!r->endpoint || !*r->endpoint || strlen(r->endpoint) > 1024) {
		reply->message = "RegisterWorker needs the worker's endpoint url";
		return WF_EINVAL;
	}
	if (r->worker_id && *r->worker_id && !valid_id(r->worker_id)) {
		reply->message = "worker_id must be 1-63 of [A-Za-z0-9._:-]";
		return WF_EINVAL;
	}
	char dropped[8][64];
	bool is_new = false;
	char id[64];
	pthread_mutex_lock(&w->mu);
	size_t nd = expire_locked(w, dropped, 8);
	struct worker *k = NULL;
	if (r->worker_id && *r->worker_id) {
		k = find_locked(w, r->worker_id);
		/* An id is a worker's name: a second process claiming it (other pid, other endpoint)
		 * is refused, but the same worker re-registering after an agent restart is not. */
		if (k && k->pid != r->pid && strcmp(k->endpoint, r->endpoint) != 0) {
			pthread_mutex_unlock(&w->mu);
			notify_dropped(w, dropped, nd);
			reply->message = wf_ctl_call_printf(call, "worker id '%s' is taken by pid %u",
							    r->worker_id, k->pid);
			return WF_ESTATE;
		}
	} else {
		for (size_t i = 0; i < w->n && !k; i++)
			if (strcmp(w->v[i].endpoint, r->endpoint) == 0)
				k = &w->v[i];
	}
	if (!k) {
		if (w->n == WF_WORKERS_MAX) {
			pthread_mutex_unlock(&w->mu);
			notify_dropped(w, dropped, nd);
			reply->message = "too many workers registered";
			return WF_ENO_SPACE;
		}
		k = &w->v[w->n++];
		memset(k, 0, sizeof(*k));
		if (r->worker_id && *r->worker_id)
			snprintf(k->id, sizeof k->id, "%s", r->worker_id);
		else
			snprintf(k->id, sizeof k->id, "w%llu", (unsigned long long)w->next_id++);
		k->registered_ms = unix_ms();
		is_new = true;
	}
	free(k->device_name);
	free(k->endpoint);
	free(k->device_uuid);
	k->device_name = strdup(r->device_name ? r->device_name : "");
	k->endpoint = strdup(r->endpoint);
	k->device_uuid = strdup(r->device_uuid ? r->device_uuid : "");
	k->pid = r->pid;
	k->device_index = r->device_index;
	k->device_total = r->device_total_bytes;
	k->device_budget = r->device_budget_bytes;
	k->pinned_host_budget = r->pinned_host_budget_bytes;
	k->last_seen_ms = unix_ms();
	memcpy(id, k->id, sizeof id);
	Weightfloor__V1__WorkerInfo *wi =
		k->device_name && k->endpoint && k->device_uuid ? worker_info(call, k) : NULL;
	pthread_mutex_unlock(&w->mu);
	notify_dropped(w, dropped, nd);
	if (!wi)
		return -ENOMEM;
	if (is_new && w->on_change)
		w->on_change(w->ctx, id, "registered");
	reply->body_case = WEIGHTFLOOR__V1__REPLY__BODY_WORKER_INFO;
	reply->worker_info = wi;
	return 0;
}

static int do_list(struct wf_workers *w, Weightfloor__V1__Reply *reply, struct wf_ctl_call *call)
{
	char dropped[8][64];
	pthread_mutex_lock(&w->mu);
	size_t nd = expire_locked(w, dropped, 8);
	Weightfloor__V1__WorkerList *wl = wf_ctl_call_alloc(call, sizeof(*wl));
	Weightfloor__V1__WorkerInfo **items =
		wf_ctl_call_calloc(call, w->n ? w->n : 1, sizeof(*items));
	int rc = wl && items ? 0 : -ENOMEM;
	for (size_t i = 0; rc == 0 && i < w->n; i++)
		if (!(items[i] = worker_info(call, &w->v[i])))
			rc = -ENOMEM;
	size_t n = w->n;
	pthread_mutex_unlock(&w->mu);
	notify_dropped(w, dropped, nd);
	if (rc < 0)
		return rc;
	weightfloor__v1__worker_list__init(wl);
	wl->workers = items;
	wl->n_workers = n;
	reply->body_case = WEIGHTFLOOR__V1__REPLY__BODY_WORKER_LIST;
	reply->worker_list = wl;
	return 0;
}

/* The worker_id a worker-slice request names. */
static const char *target_id(const Weightfloor__V1__Request *req)
{
	switch (req->body_case) {
	case WEIGHTFLOOR__V1__REQUEST__BODY_SET_RESIDENCY: return req->set_residency->worker_id;
	case WEIGHTFLOOR__V1__REQUEST__BODY_PIN: return req->pin->worker_id;
	case WEIGHTFLOOR__V1__REQUEST__BODY_UNPIN: return req->unpin->worker_id;
	case WEIGHTFLOOR__V1__REQUEST__BODY_EVICT: return req->evict->worker_id;
	case WEIGHTFLOOR__V1__REQUEST__BODY_PREFETCH: return req->prefetch->worker_id;
	case WEIGHTFLOOR__V1__REQUEST__BODY_COMPACT: return req->compact->worker_id;
	case WEIGHTFLOOR__V1__REQUEST__BODY_WORKER_STATUS: return req->worker_status->worker_id;
	default: return NULL;
	}
}

/* protobuf-c allocator over the call's arena, so a relayed reply can be unpacked into memory
 * that lives exactly as long as the agent's own reply. */
static void *arena_alloc(void *ctx, size_t size)
{
	return wf_ctl_call_alloc(ctx, size ? size : 1);
}
static void arena_free(void *ctx, void *p)
{
	(void)ctx;
	(void)p;
}

static int relay(struct wf_workers *w, const Weightfloor__V1__Request *req,
		 Weightfloor__V1__Reply *reply, struct wf_ctl_call *call)
{
	const char *id = target_id(req);
	char endpoint[1025] = "";
	pthread_mutex_lock(&w->mu);
	char dropped[8][64];
	size_t nd = expire_locked(w, dropped, 8);
	struct worker *k = NULL;
	if (id && *id)
		k = find_locked(w, id);
	else if (w->n == 1)
		k = &w->v[0];
	if (k)
		snprintf(endpoint, sizeof endpoint, "%s", k->endpoint);
	size_t n = w->n;
	pthread_mutex_unlock(&w->mu);
	notify_dropped(w, dropped, nd);
	if (!k) {
		reply->message = id && *id ? wf_ctl_call_printf(call, "no worker '%s' is registered", id)
			       : n == 0    ? "no worker is registered"
					   : "several workers are registered: name one (worker_id)";
		return id && *id ? WF_ENOT_FOUND : (n == 0 ? WF_ENOT_FOUND : WF_EINVAL);
	}
	struct wf_ctl_client *c = NULL;
	struct wf_diag d = {{0}};
	/* Residency changes can take as long as a load: allow minutes, not the default 10 s. */
	int rc = wf_ctl_client_open(endpoint, 600000, NULL, &c, &d);
	Weightfloor__V1__Reply *wr = NULL;
	if (rc == 0)
		rc = wf_ctl_client_call(c, req, &wr, &d);
	if (rc < 0) {
		wf_ctl_client_close(c);
		reply->message = wf_ctl_call_printf(call, "worker at %s: %s", endpoint,
						    wf_diag_str(&d, rc));
		return WF_EUNAVAILABLE;
	}
	/* Copy the worker's reply into the call arena: pack, then unpack with the arena. */
	size_t len = weightfloor__v1__reply__get_packed_size(wr);
	uint8_t *buf = wf_ctl_call_alloc(call, len ? len : 1);
	Weightfloor__V1__Reply *copy = NULL;
	if (buf) {
		weightfloor__v1__reply__pack(wr, buf);
		ProtobufCAllocator a = {.alloc = arena_alloc, .free = arena_free, .allocator_data = call};
		copy = weightfloor__v1__reply__unpack(&a, len, buf);
	}
	wf_ctl_reply_free(wr);
	wf_ctl_client_close(c);
	if (!copy)
		return -ENOMEM;
	reply->code = copy->code;
	reply->message = copy->message;
	reply->body_case = (Weightfloor__V1__Reply__BodyCase)copy->body_case;
	switch (copy->body_case) {
	case WEIGHTFLOOR__V1__REPLY__BODY_WORKER_INFO: reply->worker_info = copy->worker_info; break;
	case WEIGHTFLOOR__V1__REPLY__BODY_RESIDENCY: reply->residency = copy->residency; break;
	case WEIGHTFLOOR__V1__REPLY__BODY_COMPACT: reply->compact = copy->compact; break;
	default: reply->body_case = WEIGHTFLOOR__V1__REPLY__BODY__NOT_SET; break;
	}
	return 0;
}

int wf_workers_handle(void *ctx, const Weightfloor__V1__Request *req,
		      Weightfloor__V1__Reply *reply, struct wf_ctl_call *call)
{
	struct wf_workers *w = ctx;
	switch (req->body_case) {
	case WEIGHTFLOOR__V1__REQUEST__BODY_REGISTER_WORKER:
		return do_register(w, req->register_worker, reply, call);
	case WEIGHTFLOOR__V1__REQUEST__BODY_LIST_WORKERS:
		return do_list(w, reply, call);
	default:
		if (target_id(req))
			return relay(w, req, reply, call);
		reply->message = "unsupported request";
		return WF_EUNSUPPORTED;
	}
}
