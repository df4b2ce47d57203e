/* REP server: worker threads, each blocking on its own nng context, and the per-request checks
 * that keep peer bytes away from the handler. */
#include "control/server.h"

#include "base/error.h"
#include "control/internal.h"
#include "proto/status.h"
#include "proto/version.h"

#include <nng/protocol/reqrep0/rep.h>

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ST(name)    WEIGHTFLOOR__V1__STATUS__STATUS_##name
#define MAX_WORKERS 64

struct worker {
	struct wf_ctl_server *srv;
	nng_ctx ctx;
	nng_aio *aio;
	pthread_t thread;
	bool ctx_open;
	bool running; /* thread created and not yet joined */
};

struct wf_ctl_server {
	nng_socket sock;
	bool sock_open;
	struct wf__ctl_listener lst;
	struct wf__ctl_watchdog watchdog; /* restarts lst after nng 1.5.2 loses it (internal.h) */
	struct wf__ctl_dispatch dispatch;
	size_t max_request;
	nng_duration send_timeout;
	unsigned nworkers;
	struct worker *workers;
	/* Orders "check closing, start a receive" in a worker against "set closing, cancel the
	 * receives" in close(): without it a worker could start waiting just after the cancel and
	 * sleep through the shutdown. */
	pthread_mutex_t mu;
	bool mu_init;
	atomic_bool closing;
	bool started;
	bool stopped;
};

/* Reply memory for one request: a list of zeroed blocks, freed after the send. */
struct arena_blk {
	struct arena_blk *next;
	_Alignas(max_align_t) unsigned char data[];
};

struct wf_ctl_call {
	const atomic_bool *closing;
	int64_t deadline_mono_ms; /* 0: the client gave none */
	struct wf_ctl_peer peer;
	struct arena_blk *blocks;
};

/* ---- call arena ---------------------------------------------------------------------------- */

void *wf_ctl_call_alloc(struct wf_ctl_call *call, size_t size)
{
	if (size > SIZE_MAX - sizeof(struct arena_blk))
		return NULL;
	struct arena_blk *b = calloc(1, sizeof(*b) + (size ? size : 1));
	if (!b)
		return NULL;
	b->next = call->blocks;
	call->blocks = b;
	return b->data;
}

void *wf_ctl_call_calloc(struct wf_ctl_call *call, size_t n, size_t elem_size)
{
	if (elem_size && n > SIZE_MAX / elem_size)
		return NULL;
	return wf_ctl_call_alloc(call, n * elem_size);
}

char *wf_ctl_call_strdup(struct wf_ctl_call *call, const char *s)
{
	size_t n = strlen(s);
	char *p = wf_ctl_call_alloc(call, n + 1);
	if (p)
		memcpy(p, s, n + 1);
	return p;
}

char *wf_ctl_call_printf(struct wf_ctl_call *call, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	if (n < 0)
		return NULL;
	char *p = wf_ctl_call_alloc(call, (size_t)n + 1);
	if (!p)
		return NULL;
	va_start(ap, fmt);
	vsnprintf(p, (size_t)n + 1, fmt, ap);
	va_end(ap);
	return p;
}

static void call_fini(struct wf_ctl_call *call)
{
	struct arena_blk *b = call->blocks;
	while (b) {
		struct arena_blk *next = b->next;
		free(b);
		b = next;
	}
	call->blocks = NULL;
}

const struct wf_ctl_peer *wf_ctl_call_peer(const struct wf_ctl_call *call)
{
	return &call->peer;
}

bool wf_ctl_call_closing(const struct wf_ctl_call *call)
{
	return atomic_load(call->closing);
}

int wf_ctl_call_time_left_ms(const struct wf_ctl_call *call, int cap_ms)
{
	if (!call->deadline_mono_ms)
		return cap_ms;
	int64_t left = call->deadline_mono_ms - wf__ctl_mono_ms();
	if (left <= 0)
		return 0;
	return left > cap_ms ? cap_ms : (int)left;
}

/* ---- one request ----------------------------------------------------------------------------- */

/* A message from the arena, or a fixed text when even that fails: replies must go out. */
static char *msg_or(char *m, const char *fallback)
{
	return m ? m : (char *)fallback;
}

static void set_error(Weightfloor__V1__Reply *reply, Weightfloor__V1__Status code, char *message)
{
	reply->code = code;
	reply->message = message;
	reply->body_case = WEIGHTFLOOR__V1__REPLY__BODY__NOT_SET;
}

/* Checks that come before the handler. Returns false (reply filled) to answer without it. */
static bool check_request(struct wf_ctl_call *call, const Weightfloor__V1__Request *req,
                          Weightfloor__V1__Reply *reply)
{
	unsigned major = WF_PROTO_API_VERSION_MAJOR(req->api_version);
	if (req->request_id == 0) {
		set_error(reply, ST(INVALID_ARGUMENT), "request_id 0 is reserved");
		return false;
	}
	if (req->api_version == 0) {
		set_error(reply, ST(INVALID_ARGUMENT), "api_version is not set");
		return false;
	}
	if (major != WF_PROTO_API_MAJOR) {
		set_error(
		    reply, ST(INVALID_ARGUMENT),
		    msg_or(wf_ctl_call_printf(call,
		                              "unsupported api_version %u.%u (this server "
		                              "speaks %u.x)",
		                              major, WF_PROTO_API_VERSION_MINOR(req->api_version),
		                              WF_PROTO_API_MAJOR),
		           "unsupported api_version"));
		return false;
	}
	if (req->body_case == WEIGHTFLOOR__V1__REQUEST__BODY__NOT_SET) {
		/* A newer client's request kind arrives as an unknown field. Name it: it tells the
		 * operator that the server, not the client, is the one to upgrade. */
		char *m = NULL;
		if (req->base.n_unknown_fields > 0)
			m = wf_ctl_call_printf(call,
			                       "unsupported request (unknown body field %u: client "
			                       "is newer than this server)",
			                       (unsigned)req->base.unknown_fields[0].tag);
		set_error(reply, ST(INVALID_ARGUMENT), msg_or(m, "unsupported request (no body)"));
		return false;
	}
	return true;
}

static void run_handler(const struct wf__ctl_dispatch *d, struct wf_ctl_call *call,
                        const Weightfloor__V1__Request *req, Weightfloor__V1__Reply *reply)
{
	if (req->deadline_ms)
		call->deadline_mono_ms = wf__ctl_mono_ms() + req->deadline_ms;
	int rv = d->handle(d->ctx, req, reply, call);
	/* The envelope is the server's: a handler cannot misroute a reply. */
	reply->request_id = req->request_id;
	reply->api_version = WF_PROTO_API_VERSION;
	if (rv > 0)
		rv = WF_EINTERNAL; /* programmer error: handlers return 0 or negative */
	if (rv < 0) {
		char *m = reply->message;
		set_error(reply, wf_proto_status_from_err(rv),
		          m && *m ? m : (char *)wf_strerror(rv));
		return;
	}
	if (!wf_proto_status_valid(reply->code)) {
		set_error(reply, ST(INTERNAL), "handler returned an invalid status");
		return;
	}
	if (reply->code != ST(OK))
		reply->body_case = WEIGHTFLOOR__V1__REPLY__BODY__NOT_SET;
}

/* Packs reply into a new nng message, replacing it by an error reply when it is invalid or too
 * large. Returns NULL only when memory for even the error reply is lacking. */
static nng_msg *pack_reply(const struct wf__ctl_dispatch *d, struct wf_ctl_call *call,
                           Weightfloor__V1__Reply *reply)
{
	nng_msg *out = NULL;
	if (!protobuf_c_message_check(&reply->base))
		set_error(reply, ST(INTERNAL), "handler built an invalid reply");
	size_t n = weightfloor__v1__reply__get_packed_size(reply);
	if (n > d->max_reply) {
		set_error(reply, ST(RESOURCE_EXHAUSTED),
		          msg_or(wf_ctl_call_printf(call,
		                                    "reply of %zu bytes exceeds the limit of %zu "
		                                    "bytes",
		                                    n, d->max_reply),
		                 "reply too large"));
		n = weightfloor__v1__reply__get_packed_size(reply);
	}
	if (nng_msg_alloc(&out, n) != 0)
		return NULL;
	weightfloor__v1__reply__pack(reply, nng_msg_body(out));
	return out;
}

nng_msg *wf__ctl_answer(const struct wf__ctl_dispatch *d, nng_pipe pipe, const void *buf,
                        size_t len)
{
	struct wf_ctl_call call = {.closing = d->closing};
	Weightfloor__V1__Reply reply = WEIGHTFLOOR__V1__REPLY__INIT;
	Weightfloor__V1__Request *req = NULL;
	struct wf__ctl_budget budget;
	nng_msg *out;

	reply.code = ST(OK);
	reply.api_version = WF_PROTO_API_VERSION;

	if ((d->peer ? (call.peer = *d->peer, 0)
	             : wf__ctl_peer_get(pipe, d->lst->transport, &call.peer)) < 0 ||
	    !wf__ctl_auth_allows(&d->lst->auth, &call.peer)) {
		/* The bytes of a peer we do not serve are not parsed at all. */
		set_error(&reply, ST(PERMISSION_DENIED),
		          call.peer.has_creds
		              ? msg_or(wf_ctl_call_printf(&call,
		                                          "peer uid %u gid %u is not allowed on "
		                                          "this socket",
		                                          (unsigned)call.peer.uid,
		                                          (unsigned)call.peer.gid),
		                       "peer not allowed")
		              : "peer credentials unavailable");
		goto send;
	}

	wf__ctl_budget_init(&budget, d->max_unpacked);
	req = weightfloor__v1__request__unpack(&budget.a, len, buf);
	if (!req) {
		set_error(&reply, ST(INVALID_ARGUMENT),
		          msg_or(budget.exceeded
		                     ? wf_ctl_call_printf(&call,
		                                          "request of %zu bytes needs more than "
		                                          "%zu bytes unpacked",
		                                          len, d->max_unpacked)
		                     : wf_ctl_call_printf(&call,
		                                          "malformed request: %zu bytes are not "
		                                          "a weightfloor.v1.Request",
		                                          len),
		                 "malformed request"));
		goto send;
	}
	reply.request_id = req->request_id;
	if (check_request(&call, req, &reply))
		run_handler(d, &call, req, &reply);

send:
	out = pack_reply(d, &call, &reply);
	if (req)
		weightfloor__v1__request__free_unpacked(req, &budget.a);
	call_fini(&call);
	return out;
}

/* ---- workers ------------------------------------------------------------------------------- */

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	struct wf_ctl_server *srv = w->srv;

	for (;;) {
		pthread_mutex_lock(&srv->mu);
		if (atomic_load(&srv->closing)) {
			pthread_mutex_unlock(&srv->mu);
			break;
		}
		nng_aio_set_timeout(w->aio, NNG_DURATION_INFINITE);
		nng_ctx_recv(w->ctx, w->aio);
		pthread_mutex_unlock(&srv->mu);

		nng_aio_wait(w->aio);
		int rv = nng_aio_result(w->aio);
		if (rv != 0) {
			if (rv == NNG_ECLOSED || atomic_load(&srv->closing))
				break;
			/* Nothing else is expected here (ENOMEM at worst): pause instead of
			 * spinning. */
			nanosleep(&(struct timespec){.tv_nsec = 10 * 1000 * 1000}, NULL);
			continue;
		}
		nng_msg *in = nng_aio_get_msg(w->aio);
		nng_aio_set_msg(w->aio, NULL);
		nng_msg *out = wf__ctl_answer(&srv->dispatch, nng_msg_get_pipe(in),
		                              nng_msg_body(in), nng_msg_len(in));
		nng_msg_free(in);
		if (!out)
			continue; /* out of memory: the client times out */
		nng_aio_set_msg(w->aio, out);
		nng_aio_set_timeout(w->aio, srv->send_timeout);
		nng_ctx_send(w->ctx, w->aio);
		nng_aio_wait(w->aio);
		if (nng_aio_result(w->aio) != 0)
			nng_msg_free(nng_aio_get_msg(w->aio)); /* peer gone or stuck: drop */
		nng_aio_set_msg(w->aio, NULL);
	}
	return NULL;
}

/* ---- lifecycle ------------------------------------------------------------------------------ */

int wf_ctl_server_create(const struct wf_ctl_server_opts *opts, struct wf_ctl_server **ret_srv,
                         struct wf_diag *diag)
{
	struct wf_ctl_server *srv;
	int rv;

	if (!opts || !opts->handle)
		return wf_diag_set(diag, WF_EINVAL, "server options need a handler");
	if (opts->nworkers > MAX_WORKERS)
		return wf_diag_set(diag, WF_EINVAL, "nworkers %u exceeds %u", opts->nworkers,
		                   MAX_WORKERS);
	srv = calloc(1, sizeof(*srv));
	if (!srv)
		return wf_diag_set(diag, -ENOMEM, "out of memory");
	atomic_init(&srv->closing, false);
	srv->max_request =
	    opts->max_request_size ? opts->max_request_size : WF_CTL_MAX_REQUEST_DEFAULT;
	srv->dispatch = (struct wf__ctl_dispatch){
	    .handle = opts->handle,
	    .ctx = opts->ctx,
	    .max_reply = opts->max_reply_size ? opts->max_reply_size : WF_CTL_MAX_REPLY_DEFAULT,
	    .max_unpacked =
	        opts->max_unpacked_size ? opts->max_unpacked_size : 8 * srv->max_request,
	    .lst = &srv->lst,
	    .closing = &srv->closing,
	};
	srv->send_timeout = opts->send_timeout_ms ? (nng_duration)opts->send_timeout_ms : 1000;
	srv->nworkers = opts->nworkers ? opts->nworkers : 4;
	if (srv->max_request > SIZE_MAX / 8 - WF__CTL_SP_SLACK) {
		rv = wf_diag_set(diag, WF_EINVAL, "max_request_size too large");
		goto err;
	}
	if ((rv = pthread_mutex_init(&srv->mu, NULL)) != 0) {
		rv = wf_diag_set(diag, -rv, "mutex: %s", strerror(rv));
		goto err;
	}
	srv->mu_init = true;
	srv->workers = calloc(srv->nworkers, sizeof(*srv->workers));
	if (!srv->workers) {
		rv = wf_diag_set(diag, -ENOMEM, "out of memory");
		goto err;
	}

	if ((rv = nng_rep0_open(&srv->sock)) != 0) {
		rv = wf__ctl_nng_err(rv, diag, "rep socket");
		goto err;
	}
	srv->sock_open = true;
	/* The transport drops a connection that announces a larger message before allocating it. */
	rv = nng_socket_set_size(srv->sock, NNG_OPT_RECVMAXSZ, srv->max_request + WF__CTL_SP_SLACK);
	if (rv != 0) {
		rv = wf__ctl_nng_err(rv, diag, "recv-size-max");
		goto err;
	}
	for (unsigned i = 0; i < srv->nworkers; i++) {
		struct worker *w = &srv->workers[i];
		w->srv = srv;
		if ((rv = nng_aio_alloc(&w->aio, NULL, NULL)) != 0) {
			rv = wf__ctl_nng_err(rv, diag, "aio");
			goto err;
		}
		if ((rv = nng_ctx_open(&w->ctx, srv->sock)) != 0) {
			rv = wf__ctl_nng_err(rv, diag, "rep context");
			goto err;
		}
		w->ctx_open = true;
	}
	if ((rv = wf__ctl_listen(srv->sock, &opts->listen, WF_CTL_DEFAULT_URL, false, &srv->lst,
	                         diag)) < 0)
		goto err;
	*ret_srv = srv;
	return 0;
err:
	wf_ctl_server_destroy(srv);
	return rv;
}

int wf_ctl_server_start(struct wf_ctl_server *srv)
{
	if (srv->started || atomic_load(&srv->closing))
		return WF_ESTATE;
	srv->started = true;
	int rv = wf__ctl_watchdog_start(&srv->watchdog, &srv->lst);
	if (rv < 0)
		return rv;
	for (unsigned i = 0; i < srv->nworkers; i++) {
		struct worker *w = &srv->workers[i];
		rv = pthread_create(&w->thread, NULL, worker_main, w);
		if (rv != 0)
			return -rv;
		w->running = true;
	}
	return 0;
}

void wf_ctl_server_close(struct wf_ctl_server *srv)
{
	if (!srv || !srv->mu_init)
		return;
	wf__ctl_watchdog_close(&srv->watchdog);
	pthread_mutex_lock(&srv->mu);
	atomic_store(&srv->closing, true);
	/* Wakes workers blocked in a receive; a worker between requests sees the flag under mu. */
	for (unsigned i = 0; i < srv->nworkers; i++)
		if (srv->workers[i].aio)
			nng_aio_cancel(srv->workers[i].aio);
	pthread_mutex_unlock(&srv->mu);
}

void wf_ctl_server_stop(struct wf_ctl_server *srv)
{
	if (!srv || srv->stopped)
		return;
	wf_ctl_server_close(srv);
	wf__ctl_watchdog_stop(&srv->watchdog);
	for (unsigned i = 0; srv->workers && i < srv->nworkers; i++) {
		struct worker *w = &srv->workers[i];
		if (w->running) {
			pthread_join(w->thread, NULL);
			w->running = false;
		}
	}
	for (unsigned i = 0; srv->workers && i < srv->nworkers; i++) {
		struct worker *w = &srv->workers[i];
		if (w->ctx_open) {
			nng_ctx_close(w->ctx);
			w->ctx_open = false;
		}
	}
	if (srv->sock_open) {
		nng_close(srv->sock); /* closes the listener: nng unlinks the ipc socket file */
		srv->sock_open = false;
	}
	srv->stopped = true;
}

void wf_ctl_server_destroy(struct wf_ctl_server *srv)
{
	if (!srv)
		return;
	wf_ctl_server_stop(srv);
	for (unsigned i = 0; srv->workers && i < srv->nworkers; i++)
		if (srv->workers[i].aio)
			nng_aio_free(srv->workers[i].aio);
	free(srv->workers);
	wf__ctl_listener_fini(&srv->lst);
	if (srv->mu_init)
		pthread_mutex_destroy(&srv->mu);
	free(srv);
}

const char *wf_ctl_server_url(const struct wf_ctl_server *srv)
{
	return srv->lst.url;
}
