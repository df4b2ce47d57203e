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
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>

struct worker {
	char id[64];
	uint32_t pid;
	char *device_name, *endpoint, *device_uuid;
	int32_t device_index;
	int mode; /* Weightfloor__V1__ResidencyMode, as the worker said (open enum) */
	uint64_t device_total, device_budget, pinned_host_budget;
	int64_t registered_ms, last_seen_ms;
	unsigned relays;            /* residency relays in flight to it */
	unsigned completion_relays; /* Generate / GenerateRead relays in flight to it */
	/* What the worker last reported per model (ReportResidency), for choosing the worker of a
	 * Generate that names none. Models past the table are simply not known here. */
	struct {
		char model[128];
		int state; /* Weightfloor__V1__Residency */
	} res[WF_WORKERS_RES_MAX];
	uint32_t n_res;
};

struct wf_workers {
	pthread_mutex_t mu;
	struct worker v[WF_WORKERS_MAX];
	size_t n;
	uint64_t next_id;
	wf_workers_event_fn on_change;
	void *ctx;
	wf_workers_residency_fn on_residency;
	void *residency_ctx;
	char *self[2];                                    /* the agent's request and events urls */
	unsigned relays;                                  /* in flight, all workers */
	unsigned relay_max;                               /* half the server's request threads */
	unsigned completion_relays, completion_relay_max; /* completion relays: their own threads */
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
	w->relay_max = 2;            /* half the server's default 4 threads, until told */
	w->completion_relay_max = 0; /* none until the agent gives completion relays threads */
	*ret = w;
	return 0;
}

void wf_workers_destroy(struct wf_workers *w)
{
	if (!w)
		return;
	for (size_t i = 0; i < w->n; i++)
		worker_fini(&w->v[i]);
	free(w->self[0]);
	free(w->self[1]);
	pthread_mutex_destroy(&w->mu);
	free(w);
}

int wf_workers_set_self(struct wf_workers *w, const char *request_url, const char *events_url,
                        unsigned server_threads)
{
	const char *urls[2] = {request_url, events_url};
	for (int i = 0; i < 2; i++) {
		free(w->self[i]);
		w->self[i] = NULL;
		if (urls[i] && !(w->self[i] = strdup(urls[i])))
			return -ENOMEM;
	}
	w->relay_max = server_threads / 2 ? server_threads / 2 : 1;
	return 0;
}

void wf_workers_set_completion_relays(struct wf_workers *w, unsigned max)
{
	w->completion_relay_max = max;
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
	wi->mode = (Weightfloor__V1__ResidencyMode)k->mode;
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

/* "host:port" (host a name, an IPv4 address or a [bracketed] IPv6 address) into host and port. */
static bool split_hostport(const char *s, char *host, size_t cap, unsigned *ret_port)
{
	const char *colon = strrchr(s, ':');
	if (!colon || colon == s || (size_t)(colon - s) >= cap)
		return false;
	if (s[0] == '[' ? colon[-1] != ']' : memchr(s, ':', (size_t)(colon - s)) != NULL)
		return false;
	char *end;
	unsigned long port = strtoul(colon + 1, &end, 10);
	if (*end || end == colon + 1 || port == 0 || port > 65535)
		return false;
	memcpy(host, s, (size_t)(colon - s));
	host[colon - s] = '\0';
	*ret_port = (unsigned)port;
	return true;
}

static bool wildcard_host(const char *h)
{
	return !*h || strcmp(h, "*") == 0 || strcmp(h, "0.0.0.0") == 0 || strcmp(h, "[::]") == 0;
}

static bool loopback_host(const char *h)
{
	return strcmp(h, "localhost") == 0 || strncmp(h, "127.", 4) == 0 || strcmp(h, "[::1]") == 0;
}

/* Whether a (well-formed) worker endpoint is the agent's own url self: the same text, the same
 * socket file (by inode: other spellings of the path), or the same tls port on this host. */
static bool is_self(const char *ep, const char *self)
{
	if (!self)
		return false;
	if (strcmp(ep, self) == 0)
		return true;
	if (strncmp(ep, "ipc://", 6) == 0 && strncmp(self, "ipc://", 6) == 0) {
		struct stat a, b;
		return stat(ep + 6, &a) == 0 && stat(self + 6, &b) == 0 && a.st_dev == b.st_dev &&
		       a.st_ino == b.st_ino;
	}
	const char *sp = strstr(self, "://"), *ep_rest = strstr(ep, "://");
	char h1[256], h2[256];
	unsigned p1, p2;
	if (!sp || !ep_rest || !split_hostport(ep_rest + 3, h1, sizeof h1, &p1) ||
	    !split_hostport(sp + 3, h2, sizeof h2, &p2) || p1 != p2)
		return false;
	/* Other aliases (a name of this host) are not caught here: the relay limits stop the loop
	 * they would make. */
	return strcmp(h1, h2) == 0 || wildcard_host(h2) || (loopback_host(h1) && loopback_host(h2));
}

/* Why endpoint cannot be a worker's (a static message), or NULL. The relay dials it, so it must
 * be a transport the relay can use, and never the agent itself: a relay to its own socket would
 * relay again, until every request thread is waiting on another. */
static const char *endpoint_problem(const struct wf_workers *w, const char *ep)
{
	for (const char *p = ep; *p; p++)
		if ((unsigned char)*p <= ' ' || *p == 0x7f)
			return "the endpoint url has spaces or control characters";
	if (strncmp(ep, "ipc://", 6) == 0) {
		if (ep[6] != '/')
			return "an ipc:// endpoint needs an absolute path "
			       "(ipc:///run/weightfloor/w.sock)";
		if (strlen(ep + 6) >= sizeof(((struct sockaddr_un *)0)->sun_path))
			return "the ipc:// endpoint's path is longer than a unix socket path can "
			       "be";
	} else if (strncmp(ep, "tls+tcp://", 10) == 0) {
		char host[256];
		unsigned port;
		if (!split_hostport(ep + 10, host, sizeof host, &port))
			return "a tls+tcp:// endpoint needs host:port";
	} else if (strncmp(ep, "tcp://", 6) == 0) {
		return "plain tcp:// is unauthenticated: the agent relays to ipc:// and tls+tcp:// "
		       "endpoints only";
	} else {
		return "the endpoint must be an ipc:///absolute/path or tls+tcp://host:port url";
	}
	if (is_self(ep, w->self[0]) || is_self(ep, w->self[1]))
		return "the endpoint is the agent's own socket: a worker needs its own endpoint";
	return NULL;
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
	const char *why = endpoint_problem(w, r->endpoint);
	if (why) {
		reply->message = wf_ctl_call_printf(call, "endpoint %s: %s", r->endpoint, why);
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
		/* An id is a worker's name: a second process claiming it (other pid, other
		 * endpoint) is refused (FAILED_PRECONDITION; the worker exits), but the same worker
		 * re-registering after an agent restart is not. A stale holder (no heartbeat for
		 * WF_WORKERS_EXPIRE_MS, or its pid gone) was dropped by expire_locked above. */
		if (k && k->pid != r->pid && strcmp(k->endpoint, r->endpoint) != 0) {
			reply->message = wf_ctl_call_printf(
			    call,
			    "worker id '%s' is already registered by a live worker (pid %u, %s): "
			    "give this one another --id",
			    r->worker_id, k->pid, k->endpoint);
			pthread_mutex_unlock(&w->mu);
			notify_dropped(w, dropped, nd);
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
	k->mode = (int)r->mode;
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
	case WEIGHTFLOOR__V1__REQUEST__BODY_SET_RESIDENCY:
		return req->set_residency->worker_id;
	case WEIGHTFLOOR__V1__REQUEST__BODY_PIN:
		return req->pin->worker_id;
	case WEIGHTFLOOR__V1__REQUEST__BODY_UNPIN:
		return req->unpin->worker_id;
	case WEIGHTFLOOR__V1__REQUEST__BODY_EVICT:
		return req->evict->worker_id;
	case WEIGHTFLOOR__V1__REQUEST__BODY_PREFETCH:
		return req->prefetch->worker_id;
	case WEIGHTFLOOR__V1__REQUEST__BODY_COMPACT:
		return req->compact->worker_id;
	case WEIGHTFLOOR__V1__REQUEST__BODY_WORKER_STATUS:
		return req->worker_status->worker_id;
	case WEIGHTFLOOR__V1__REQUEST__BODY_GENERATE:
		return req->generate->worker_id;
	case WEIGHTFLOOR__V1__REQUEST__BODY_GENERATE_READ:
		return req->generate_read->worker_id;
	case WEIGHTFLOOR__V1__REQUEST__BODY_PERPLEXITY:
		return req->perplexity->worker_id;
	default:
		return NULL;
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

/* Gives back the relay slots taken for worker id (which may have gone meanwhile). */
static void relay_done(struct wf_workers *w, const char *id, bool completion)
{
	pthread_mutex_lock(&w->mu);
	struct worker *k = find_locked(w, id);
	unsigned *mine = k ? (completion ? &k->completion_relays : &k->relays) : NULL;
	unsigned *all = completion ? &w->completion_relays : &w->relays;
	if (mine && *mine)
		(*mine)--;
	if (*all)
		(*all)--;
	pthread_mutex_unlock(&w->mu);
}

static bool is_completion(const Weightfloor__V1__Request *req)
{
	return req->body_case == WEIGHTFLOOR__V1__REQUEST__BODY_GENERATE ||
	       req->body_case == WEIGHTFLOOR__V1__REQUEST__BODY_GENERATE_READ ||
	       req->body_case == WEIGHTFLOOR__V1__REQUEST__BODY_PERPLEXITY;
}

/* The worker for a Generate that names none: the one whose reported residency of the model is
 * highest (pinned, device, host), then the least busy with completions; a model no worker has
 * reported goes to the least busy self-managed worker (it loads models on demand). NULL if
 * none fits. */
static struct worker *choose_completion_worker_locked(struct wf_workers *w, const char *model)
{
	struct worker *best = NULL;
	int best_state = -1;
	for (size_t i = 0; i < w->n; i++) {
		struct worker *k = &w->v[i];
		int state = -1;
		for (uint32_t j = 0; j < k->n_res; j++)
			if (strcmp(k->res[j].model, model) == 0)
				state = k->res[j].state;
		if (state <= WEIGHTFLOOR__V1__RESIDENCY__RESIDENCY_DISK) {
			if (k->mode != WEIGHTFLOOR__V1__RESIDENCY_MODE__RESIDENCY_MODE_SELF_MANAGED)
				continue;
			state = WEIGHTFLOOR__V1__RESIDENCY__RESIDENCY_DISK;
		}
		if (!best || state > best_state ||
		    (state == best_state && k->completion_relays < best->completion_relays)) {
			best = k;
			best_state = state;
		}
	}
	return best;
}

static int relay(struct wf_workers *w, const Weightfloor__V1__Request *req,
                 Weightfloor__V1__Reply *reply, struct wf_ctl_call *call)
{
	const char *id = target_id(req);
	char endpoint[1025] = "", wid[64] = "";
	if (wf_ctl_call_time_left_ms(call, WF_WORKERS_RELAY_MAX_MS) == 0) {
		reply->message = "the request's deadline passed before it could be relayed";
		return WF_ETIMEOUT;
	}
	pthread_mutex_lock(&w->mu);
	char dropped[8][64];
	size_t nd = expire_locked(w, dropped, 8);
	struct worker *k = NULL;
	const bool completion = is_completion(req);
	if (id && *id)
		k = find_locked(w, id);
	else if (w->n == 1)
		k = &w->v[0];
	else if (req->body_case == WEIGHTFLOOR__V1__REQUEST__BODY_GENERATE && req->generate->model)
		k = choose_completion_worker_locked(w, req->generate->model);
	else if (req->body_case == WEIGHTFLOOR__V1__REQUEST__BODY_PERPLEXITY &&
	         req->perplexity->model)
		k = choose_completion_worker_locked(w, req->perplexity->model);
	int busy = 0;
	unsigned in_flight = 0;
	if (k) {
		snprintf(endpoint, sizeof endpoint, "%s", k->endpoint);
		memcpy(wid, k->id, sizeof wid);
		/* Completions are followed by long polls, one per completion in progress, so they
		 * have their own, larger budget of threads; residency relays keep theirs. Refused
		 * at once rather than queued: a waiting relay would hold a request thread as surely
		 * as a running one. */
		unsigned *mine = completion ? &k->completion_relays : &k->relays;
		unsigned *all = completion ? &w->completion_relays : &w->relays;
		const unsigned per_worker = completion ? WF_WORKERS_COMPLETION_RELAY_PER_WORKER
		                                       : WF_WORKERS_RELAY_PER_WORKER;
		const unsigned total = completion ? w->completion_relay_max : w->relay_max;
		in_flight = *mine;
		if (*mine >= per_worker) {
			busy = WF_EUNAVAILABLE;
		} else if (*all >= total) {
			busy = WF_ELIMIT;
			in_flight = *all;
		} else {
			(*mine)++;
			(*all)++;
		}
	}
	size_t n = w->n;
	pthread_mutex_unlock(&w->mu);
	notify_dropped(w, dropped, nd);
	if (!k) {
		reply->message = id && *id
		                     ? wf_ctl_call_printf(call, "no worker '%s' is registered", id)
		                 : n == 0 ? "no worker is registered"
		                          : "several workers are registered: name one (worker_id)";
		return id && *id ? WF_ENOT_FOUND : (n == 0 ? WF_ENOT_FOUND : WF_EINVAL);
	}
	if (busy == WF_EUNAVAILABLE) {
		reply->message = wf_ctl_call_printf(
		    call,
		    "worker '%s' already has %u requests in progress (slow or hung): retry later",
		    wid, in_flight);
		return busy;
	}
	if (busy) {
		reply->message = wf_ctl_call_printf(
		    call,
		    "the agent is relaying %u requests to workers already (its limit): retry "
		    "later",
		    in_flight);
		return busy;
	}

	struct wf_ctl_client *c = NULL;
	struct wf_diag d = {{0}};
	Weightfloor__V1__Reply *wr = NULL, *copy = NULL;
	int left = wf_ctl_call_time_left_ms(call, WF_WORKERS_RELAY_MAX_MS);
	/* Dial without blocking (a blocking dial waits out nng's 10 s handshake time-out on a
	 * worker that is stopped), then give the connection a short budget of its own: a worker
	 * that is not there fails fast, whatever the client's deadline. */
	struct wf_ctl_client_opts co = {.client_name = "wf-agent relay", .wait_for_server = true};
	int rc = wf_ctl_client_open(endpoint, left, &co, &c, &d);
	if (rc == 0 && (rc = wf_ctl_client_wait_connected(
	                    c, left < WF_WORKERS_CONNECT_MS ? left : WF_WORKERS_CONNECT_MS)) < 0)
		wf_diag_set(&d, rc, "no connection (not running, stopped or hung)");
	if (rc == 0) {
		/* Keep a tenth of what is left for our own reply to reach the client in time. */
		left = wf_ctl_call_time_left_ms(call, WF_WORKERS_RELAY_MAX_MS);
		left -= left / 10;
		rc = left > 0 ? wf_ctl_client_call_timeout(c, req, left, &wr, &d) : WF_ETIMEOUT;
		if (rc == WF_ETIMEOUT) {
			reply->message = wf_ctl_call_printf(
			    call,
			    "worker '%s' at %s: no answer within %d ms (what was left of the "
			    "request's deadline)",
			    wid, endpoint, left);
			rc = WF_EUNAVAILABLE;
			goto out;
		}
	}
	if (rc < 0) {
		reply->message = wf_ctl_call_printf(call, "worker '%s' at %s: %s", wid, endpoint,
		                                    wf_diag_str(&d, rc));
		rc = WF_EUNAVAILABLE;
		goto out;
	}
	/* Copy the worker's reply into the call arena: pack, then unpack with the arena. */
	size_t len = weightfloor__v1__reply__get_packed_size(wr);
	uint8_t *buf = wf_ctl_call_alloc(call, len ? len : 1);
	if (buf) {
		weightfloor__v1__reply__pack(wr, buf);
		ProtobufCAllocator a = {
		    .alloc = arena_alloc, .free = arena_free, .allocator_data = call};
		copy = weightfloor__v1__reply__unpack(&a, len, buf);
	}
	if (!copy) {
		rc = -ENOMEM;
		goto out;
	}
	reply->code = copy->code;
	reply->message = copy->message;
	reply->body_case = (Weightfloor__V1__Reply__BodyCase)copy->body_case;
	switch (copy->body_case) {
	case WEIGHTFLOOR__V1__REPLY__BODY_WORKER_INFO: {
		reply->worker_info = copy->worker_info;
		/* Only the agent knows when it registered the worker and last heard from it: a
		 * relayed WorkerStatus says so, as ListWorkers does. */
		pthread_mutex_lock(&w->mu);
		const struct worker *kk = find_locked(w, wid);
		if (kk) {
			reply->worker_info->registered_unix_ms = kk->registered_ms;
			reply->worker_info->last_seen_unix_ms = kk->last_seen_ms;
		}
		pthread_mutex_unlock(&w->mu);
		break;
	}
	case WEIGHTFLOOR__V1__REPLY__BODY_RESIDENCY:
		reply->residency = copy->residency;
		break;
	case WEIGHTFLOOR__V1__REPLY__BODY_COMPACT:
		reply->compact = copy->compact;
		break;
	case WEIGHTFLOOR__V1__REPLY__BODY_GENERATE:
		reply->generate = copy->generate;
		break;
	case WEIGHTFLOOR__V1__REPLY__BODY_PERPLEXITY:
		reply->perplexity = copy->perplexity;
		break;
	default:
		reply->body_case = WEIGHTFLOOR__V1__REPLY__BODY__NOT_SET;
		break;
	}
	rc = 0;
out:
	wf_ctl_reply_free(wr);
	wf_ctl_client_close(c);
	relay_done(w, wid, completion);
	return rc;
}

void wf_workers_set_residency_fn(struct wf_workers *w, wf_workers_residency_fn fn, void *ctx)
{
	w->on_residency = fn;
	w->residency_ctx = ctx;
}

/* A worker's report of what its cache did. Only a registered worker may speak for its id: an
 * unknown id is a worker the agent has not heard from (it registers again within a heartbeat)
 * or something that is not a worker, and publishing under it would let anyone forge events. */
/* Keeps the worker's last reported state of a model (a model back on disk leaves the table). */
static void note_residency_locked(struct worker *k, const Weightfloor__V1__ResidencyChange *c)
{
	if (strlen(c->model) >= sizeof(k->res[0].model))
		return;
	uint32_t j = 0;
	while (j < k->n_res && strcmp(k->res[j].model, c->model) != 0)
		j++;
	if (c->state <= WEIGHTFLOOR__V1__RESIDENCY__RESIDENCY_DISK) {
		if (j < k->n_res)
			k->res[j] = k->res[--k->n_res];
		return;
	}
	if (j == k->n_res) {
		if (k->n_res == WF_WORKERS_RES_MAX)
			return;
		snprintf(k->res[k->n_res++].model, sizeof(k->res[0].model), "%s", c->model);
	}
	k->res[j].state = (int)c->state;
}

static int do_report(struct wf_workers *w, const Weightfloor__V1__ReportResidency *r,
                     Weightfloor__V1__Reply *reply, struct wf_ctl_call *call)
{
	if (!r->worker_id || !*r->worker_id) {
		reply->message = "ReportResidency needs the worker's worker_id";
		return WF_EINVAL;
	}
	if (r->n_changes > WF_WORKERS_REPORT_MAX) {
		reply->message = wf_ctl_call_printf(call, "%zu changes in one report: at most %d",
		                                    r->n_changes, WF_WORKERS_REPORT_MAX);
		return WF_EINVAL;
	}
	for (size_t i = 0; i < r->n_changes; i++) {
		const Weightfloor__V1__ResidencyChange *c = r->changes[i];
		if (!c->model || !*c->model || strlen(c->model) > 1024 ||
		    (c->message && strlen(c->message) > 4096)) {
			reply->message = wf_ctl_call_printf(
			    call, "change %zu: model must be 1-1024 bytes, message at most 4096",
			    i);
			return WF_EINVAL;
		}
		if (c->state <= WEIGHTFLOOR__V1__RESIDENCY__RESIDENCY_UNSPECIFIED ||
		    c->state > WEIGHTFLOOR__V1__RESIDENCY__RESIDENCY_PINNED_DEVICE) {
			reply->message = wf_ctl_call_printf(
			    call, "change %zu: unknown residency %d", i, (int)c->state);
			return WF_EINVAL;
		}
	}
	char id[64];
	pthread_mutex_lock(&w->mu);
	struct worker *k = strlen(r->worker_id) < sizeof id ? find_locked(w, r->worker_id) : NULL;
	if (k) {
		memcpy(id, k->id, sizeof id);
		for (size_t i = 0; i < r->n_changes; i++)
			note_residency_locked(k, r->changes[i]);
	}
	pthread_mutex_unlock(&w->mu);
	if (!k) {
		reply->message = wf_ctl_call_printf(
		    call, "no worker '%.64s' is registered: register (RegisterWorker) first",
		    r->worker_id);
		return WF_ENOT_FOUND;
	}
	for (size_t i = 0; i < r->n_changes && w->on_residency; i++)
		w->on_residency(w->residency_ctx, id, r->changes[i]);
	return 0;
}

int wf_workers_handle(void *ctx, const Weightfloor__V1__Request *req, Weightfloor__V1__Reply *reply,
                      struct wf_ctl_call *call)
{
	struct wf_workers *w = ctx;
	switch (req->body_case) {
	case WEIGHTFLOOR__V1__REQUEST__BODY_REGISTER_WORKER:
		return do_register(w, req->register_worker, reply, call);
	case WEIGHTFLOOR__V1__REQUEST__BODY_LIST_WORKERS:
		return do_list(w, reply, call);
	case WEIGHTFLOOR__V1__REQUEST__BODY_REPORT_RESIDENCY:
		return do_report(w, req->report_residency, reply, call);
	default:
		if (target_id(req))
			return relay(w, req, reply, call);
		reply->message = "unsupported request";
		return WF_EUNSUPPORTED;
	}
}

void wf_workers_visit(struct wf_workers *w, void (*fn)(void *ctx, const struct wf_workers_view *v),
                      void *ctx)
{
	struct wf_workers_view v;
	pthread_mutex_lock(&w->mu);
	for (size_t i = 0; i < w->n; i++) {
		const struct worker *k = &w->v[i];
		v.worker_id = k->id;
		v.device_total = k->device_total;
		v.device_budget = k->device_budget;
		v.pinned_host_budget = k->pinned_host_budget;
		v.last_seen_unix_ms = k->last_seen_ms;
		v.n_res = k->n_res;
		for (uint32_t j = 0; j < k->n_res; j++) {
			v.res_model[j] = k->res[j].model;
			v.res_state[j] = k->res[j].state;
		}
		fn(ctx, &v);
	}
	pthread_mutex_unlock(&w->mu);
}
