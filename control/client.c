/* REQ client (one nng context per call) and SUB client. */
#include "control/client.h"

#include "base/error.h"
#include "control/internal.h"
#include "proto/version.h"

#include <nng/protocol/pubsub0/sub.h>
#include <nng/protocol/reqrep0/req.h>

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct wf_ctl_client {
	nng_socket sock;
	bool sock_open;
	char *url;
	char *name;
	size_t max_request;
	size_t max_reply;
	int timeout_ms;
	atomic_uint_fast64_t next_id;
	/* The id of the connection (pipe) in use, 0 while there is none; under mu, with cv
	 * signalled when one comes up. */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	uint32_t pipe_id;
};

struct wf_ctl_sub {
	nng_socket sock;
	bool sock_open;
	nng_aio *aio;
	size_t max_event;
};

/* Unpacked peer bytes may take this many times their packed size before we give up. */
#define UNPACK_FACTOR 8

/* nng calls this on its own threads. A client has one dialer, so one pipe at a time; a removal
 * is matched by id because nng may report the removal of a pipe it never finished adding. */
static void pipe_event(nng_pipe p, nng_pipe_ev ev, void *arg)
{
	struct wf_ctl_client *c = arg;
	uint32_t id = (uint32_t)nng_pipe_id(p);

	pthread_mutex_lock(&c->mu);
	if (ev == NNG_PIPE_EV_ADD_POST) {
		c->pipe_id = id;
		pthread_cond_broadcast(&c->cv);
	} else if (ev == NNG_PIPE_EV_REM_POST && c->pipe_id == id) {
		c->pipe_id = 0;
	}
	pthread_mutex_unlock(&c->mu);
}

int wf_ctl_client_open(const char *url, int timeout_ms, const struct wf_ctl_client_opts *opts,
                       struct wf_ctl_client **ret_client, struct wf_diag *diag)
{
	static const struct wf_ctl_client_opts defaults;
	struct wf_ctl_client *c;
	int rv;

	if (!opts)
		opts = &defaults;
	if (!url)
		url = WF_CTL_DEFAULT_URL;
	c = calloc(1, sizeof(*c));
	if (!c)
		return wf_diag_set(diag, -ENOMEM, "out of memory");
	atomic_init(&c->next_id, 1);
	pthread_mutex_init(&c->mu, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&c->cv, &ca);
	pthread_condattr_destroy(&ca);
	c->timeout_ms = timeout_ms > 0 ? timeout_ms : WF_CTL_TIMEOUT_DEFAULT_MS;
	c->max_request =
	    opts->max_request_size ? opts->max_request_size : WF_CTL_MAX_REQUEST_DEFAULT;
	c->max_reply = opts->max_reply_size ? opts->max_reply_size : WF_CTL_MAX_REPLY_DEFAULT;
	if (c->max_reply > SIZE_MAX / UNPACK_FACTOR - WF__CTL_SP_SLACK) {
		rv = wf_diag_set(diag, WF_EINVAL, "max_reply_size too large");
		goto err;
	}
	c->url = strdup(url);
	c->name = strdup(opts->client_name ? opts->client_name : "");
	if (!c->url || !c->name) {
		rv = wf_diag_set(diag, -ENOMEM, "out of memory");
		goto err;
	}
	if ((rv = nng_req0_open(&c->sock)) != 0) {
		rv = wf__ctl_nng_err(rv, diag, "req socket");
		goto err;
	}
	c->sock_open = true;
	/* No resends: REQ would otherwise repeat a request after a reconnect (or every minute),
	 * running a non-idempotent command twice. With resend off, a dropped connection fails the
	 * call at once (NNG_ECONNRESET) instead. Contexts copy this at open, so set it first. */
	if ((rv = nng_socket_set_ms(c->sock, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE)) != 0 ||
	    (rv = nng_socket_set_size(c->sock, NNG_OPT_RECVMAXSZ,
	                              c->max_reply + WF__CTL_SP_SLACK)) != 0) {
		rv = wf__ctl_nng_err(rv, diag, "req socket options");
		goto err;
	}
	if ((rv = nng_pipe_notify(c->sock, NNG_PIPE_EV_ADD_POST, pipe_event, c)) != 0 ||
	    (rv = nng_pipe_notify(c->sock, NNG_PIPE_EV_REM_POST, pipe_event, c)) != 0) {
		rv = wf__ctl_nng_err(rv, diag, "pipe notifications");
		goto err;
	}
	if ((rv = wf__ctl_dial(c->sock, url, &opts->tls, opts->allow_insecure_tcp,
	                       !opts->wait_for_server, diag)) < 0)
		goto err;
	*ret_client = c;
	return 0;
err:
	wf_ctl_client_close(c);
	return rv;
}

void wf_ctl_client_close(struct wf_ctl_client *c)
{
	if (!c)
		return;
	/* nng_close waits for callbacks in progress, so mu is unused afterwards. */
	if (c->sock_open)
		nng_close(c->sock);
	pthread_cond_destroy(&c->cv);
	pthread_mutex_destroy(&c->mu);
	free(c->url);
	free(c->name);
	free(c);
}

int wf_ctl_client_wait_connected(struct wf_ctl_client *c, int timeout_ms)
{
	struct timespec ts;
	int rv = 0;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	ts.tv_sec += timeout_ms / 1000;
	ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&c->mu);
	while (c->pipe_id == 0 && rv == 0 && timeout_ms > 0)
		rv = pthread_cond_timedwait(&c->cv, &c->mu, &ts);
	bool up = c->pipe_id != 0;
	pthread_mutex_unlock(&c->mu);
	return up ? 0 : WF_EUNAVAILABLE;
}

void wf_ctl_reply_free(Weightfloor__V1__Reply *reply)
{
	if (reply)
		weightfloor__v1__reply__free_unpacked(reply, &wf__ctl_free_allocator);
}

/* Error for a failed send or receive of one call. */
static int call_err(struct wf_ctl_client *c, int rv, bool sending, int timeout_ms,
                    struct wf_diag *diag)
{
	switch (rv) {
	case NNG_ETIMEDOUT:
		if (sending)
			return wf_diag_set(diag, WF_ETIMEOUT, "%s: not connected within %d ms",
			                   c->url, timeout_ms);
		return wf_diag_set(diag, WF_ETIMEOUT, "%s: no reply within %d ms", c->url,
		                   timeout_ms);
	case NNG_ECONNRESET:
	case NNG_ECONNSHUT:
		return wf_diag_set(diag, WF_ETRANSPORT,
		                   "%s: connection dropped before the reply (server stopped, or "
		                   "it refused the message as too large)",
		                   c->url);
	case NNG_ECLOSED:
		return wf_diag_set(diag, WF_EUNAVAILABLE, "%s: client closed", c->url);
	default:
		return wf_diag_set(diag, wf__ctl_nng_code(rv), "%s: %s: %s", c->url,
		                   sending ? "send" : "receive", nng_strerror(rv));
	}
}

int wf_ctl_client_call_timeout(struct wf_ctl_client *c, const Weightfloor__V1__Request *req,
                               int timeout_ms, Weightfloor__V1__Reply **ret_reply,
                               struct wf_diag *diag)
{
	Weightfloor__V1__Request r = *req;
	Weightfloor__V1__Reply *reply = NULL;
	nng_msg *msg = NULL;
	nng_aio *aio = NULL;
	nng_ctx ctx;
	bool ctx_open = false;
	int rv;

	if (timeout_ms <= 0)
		timeout_ms = c->timeout_ms;
	r.request_id = atomic_fetch_add(&c->next_id, 1);
	r.api_version = WF_PROTO_API_VERSION;
	/* The server bounds its own waits (and the calls it makes for us) by our timeout. */
	if (r.deadline_ms == 0 || r.deadline_ms > (uint32_t)timeout_ms)
		r.deadline_ms = (uint32_t)timeout_ms;
	if (!r.client || !*r.client)
		r.client = c->name;
	if (!protobuf_c_message_check(&r.base))
		return wf_diag_set(diag, WF_EINVAL, "request is not a valid message");
	size_t n = weightfloor__v1__request__get_packed_size(&r);
	if (n > c->max_request)
		return wf_diag_set(diag, WF_ELIMIT, "request of %zu bytes exceeds the limit of %zu",
		                   n, c->max_request);
	if (nng_msg_alloc(&msg, n) != 0)
		return wf_diag_set(diag, -ENOMEM, "out of memory");
	weightfloor__v1__request__pack(&r, nng_msg_body(msg));

	if ((rv = nng_aio_alloc(&aio, NULL, NULL)) != 0) {
		rv = wf__ctl_nng_err(rv, diag, "aio");
		goto out;
	}
	if ((rv = nng_ctx_open(&ctx, c->sock)) != 0) {
		rv = call_err(c, rv, true, timeout_ms, diag);
		goto out;
	}
	ctx_open = true;

	int64_t deadline = wf__ctl_mono_ms() + timeout_ms;
	nng_aio_set_msg(aio, msg);
	nng_aio_set_timeout(aio, timeout_ms);
	nng_ctx_send(ctx, aio);
	nng_aio_wait(aio);
	if ((rv = nng_aio_result(aio)) != 0) {
		rv = call_err(c, rv, true, timeout_ms, diag);
		goto out; /* msg is still ours */
	}
	msg = NULL; /* sent: nng owns it */

	int64_t left = deadline - wf__ctl_mono_ms();
	nng_aio_set_timeout(aio, left > 0 ? (nng_duration)left : 1);
	nng_ctx_recv(ctx, aio);
	nng_aio_wait(aio);
	if ((rv = nng_aio_result(aio)) != 0) {
		rv = call_err(c, rv, false, timeout_ms, diag);
		goto out;
	}
	msg = nng_aio_get_msg(aio);

	struct wf__ctl_budget budget;
	wf__ctl_budget_init(&budget, UNPACK_FACTOR * (c->max_reply + WF__CTL_SP_SLACK));
	reply = weightfloor__v1__reply__unpack(&budget.a, nng_msg_len(msg), nng_msg_body(msg));
	if (!reply) {
		rv = wf_diag_set(diag, WF_EPROTOCOL, "%s: reply of %zu bytes does not parse%s",
		                 c->url, nng_msg_len(msg),
		                 budget.exceeded ? " within the memory limit" : "");
		goto out;
	}
	/* REQ/REP already pairs replies with requests; this catches a server that echoes
	 * another id. 0 is the server refusing the envelope before it could read the id. */
	if (reply->request_id != r.request_id &&
	    !(reply->request_id == 0 && reply->code != WEIGHTFLOOR__V1__STATUS__STATUS_OK)) {
		rv = wf_diag_set(diag, WF_EPROTOCOL, "%s: reply for request %llu, expected %llu",
		                 c->url, (unsigned long long)reply->request_id,
		                 (unsigned long long)r.request_id);
		goto out;
	}
	*ret_reply = reply;
	reply = NULL;
	rv = 0;
out:
	if (reply)
		weightfloor__v1__reply__free_unpacked(reply, &wf__ctl_free_allocator);
	nng_msg_free(msg);
	if (ctx_open)
		nng_ctx_close(ctx);
	nng_aio_free(aio);
	return rv;
}

int wf_ctl_client_call(struct wf_ctl_client *c, const Weightfloor__V1__Request *req,
                       Weightfloor__V1__Reply **ret_reply, struct wf_diag *diag)
{
	return wf_ctl_client_call_timeout(c, req, c->timeout_ms, ret_reply, diag);
}

/* ---- subscriber ---------------------------------------------------------------------------- */

int wf_ctl_sub_open(const char *url, const struct wf_ctl_client_opts *opts,
                    struct wf_ctl_sub **ret_sub, struct wf_diag *diag)
{
	static const struct wf_ctl_client_opts defaults;
	struct wf_ctl_sub *s;
	int rv;

	if (!opts)
		opts = &defaults;
	if (!url)
		url = WF_CTL_DEFAULT_EVENTS_URL;
	s = calloc(1, sizeof(*s));
	if (!s)
		return wf_diag_set(diag, -ENOMEM, "out of memory");
	s->max_event = opts->max_reply_size ? opts->max_reply_size : WF_CTL_MAX_EVENT_DEFAULT;
	if (s->max_event > SIZE_MAX / UNPACK_FACTOR - WF__CTL_SP_SLACK) {
		rv = wf_diag_set(diag, WF_EINVAL, "max_reply_size too large");
		goto err;
	}
	if ((rv = nng_aio_alloc(&s->aio, NULL, NULL)) != 0) {
		rv = wf__ctl_nng_err(rv, diag, "aio");
		goto err;
	}
	if ((rv = nng_sub0_open(&s->sock)) != 0) {
		rv = wf__ctl_nng_err(rv, diag, "sub socket");
		goto err;
	}
	s->sock_open = true;
	/* Events carry no topic prefix: take them all. A deep queue rides out bursts of
	 * progress events while the reader is busy. */
	if ((rv = nng_socket_set(s->sock, NNG_OPT_SUB_SUBSCRIBE, "", 0)) != 0 ||
	    (rv = nng_socket_set_int(s->sock, NNG_OPT_RECVBUF, 1024)) != 0 ||
	    (rv = nng_socket_set_size(s->sock, NNG_OPT_RECVMAXSZ,
	                              s->max_event + WF__CTL_SP_SLACK)) != 0) {
		rv = wf__ctl_nng_err(rv, diag, "sub socket options");
		goto err;
	}
	if ((rv = wf__ctl_dial(s->sock, url, &opts->tls, opts->allow_insecure_tcp,
	                       !opts->wait_for_server, diag)) < 0)
		goto err;
	*ret_sub = s;
	return 0;
err:
	wf_ctl_sub_close(s);
	return rv;
}

int wf_ctl_sub_recv(struct wf_ctl_sub *s, int timeout_ms, Weightfloor__V1__Event **ret_event,
                    struct wf_diag *diag)
{
	nng_aio_set_timeout(s->aio,
	                    timeout_ms < 0 ? NNG_DURATION_INFINITE : (nng_duration)timeout_ms);
	nng_recv_aio(s->sock, s->aio);
	nng_aio_wait(s->aio);
	int rv = nng_aio_result(s->aio);
	if (rv == NNG_ETIMEDOUT)
		return wf_diag_set(diag, WF_ETIMEOUT, "no event within %d ms", timeout_ms);
	if (rv != 0)
		return wf__ctl_nng_err(rv, diag, "receive event");
	nng_msg *msg = nng_aio_get_msg(s->aio);
	nng_aio_set_msg(s->aio, NULL);
	struct wf__ctl_budget budget;
	wf__ctl_budget_init(&budget, UNPACK_FACTOR * (s->max_event + WF__CTL_SP_SLACK));
	Weightfloor__V1__Event *ev =
	    weightfloor__v1__event__unpack(&budget.a, nng_msg_len(msg), nng_msg_body(msg));
	size_t len = nng_msg_len(msg);
	nng_msg_free(msg);
	if (!ev)
		return wf_diag_set(diag, WF_EFORMAT, "event message of %zu bytes does not parse",
		                   len);
	*ret_event = ev;
	return 0;
}

void wf_ctl_event_free(Weightfloor__V1__Event *event)
{
	if (event)
		weightfloor__v1__event__free_unpacked(event, &wf__ctl_free_allocator);
}

void wf_ctl_sub_close(struct wf_ctl_sub *s)
{
	if (!s)
		return;
	if (s->sock_open)
		nng_close(s->sock);
	nng_aio_free(s->aio);
	free(s);
}
