/* PUB socket with sequence numbers assigned under the same lock as the send, so that the order
 * on the wire is the order of the numbers. */
#include "control/pub.h"

#include "base/error.h"
#include "control/internal.h"

#include <nng/protocol/pubsub0/pub.h>

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

struct wf_ctl_pub {
	nng_socket sock;
	bool sock_open;
	struct wf__ctl_listener lst;
	struct wf__ctl_watchdog watchdog; /* restarts lst after nng 1.5.2 loses it (internal.h) */
	size_t max_event;
	uint64_t epoch;
	pthread_mutex_t mu; /* guards seq and the pack+send pair */
	bool mu_init;
	uint64_t seq; /* last sequence number used */
};

static uint64_t new_epoch(void)
{
	uint64_t e = 0;
	if (getrandom(&e, sizeof(e), GRND_NONBLOCK) != (ssize_t)sizeof(e)) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		e = ((uint64_t)ts.tv_sec << 32) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 16);
	}
	return e ? e : 1;
}

int wf_ctl_pub_create(const struct wf_ctl_pub_opts *opts, struct wf_ctl_pub **ret_pub,
                      struct wf_diag *diag)
{
	static const struct wf_ctl_pub_opts defaults;
	struct wf_ctl_pub *pub;
	int rv;

	if (!opts)
		opts = &defaults;
	if (opts->queue_depth > 8192)
		return wf_diag_set(diag, WF_EINVAL, "queue_depth %u exceeds 8192",
		                   opts->queue_depth);
	pub = calloc(1, sizeof(*pub));
	if (!pub)
		return wf_diag_set(diag, -ENOMEM, "out of memory");
	pub->max_event = opts->max_event_size ? opts->max_event_size : WF_CTL_MAX_EVENT_DEFAULT;
	pub->epoch = new_epoch();
	if ((rv = pthread_mutex_init(&pub->mu, NULL)) != 0) {
		rv = wf_diag_set(diag, -rv, "mutex: %s", strerror(rv));
		goto err;
	}
	pub->mu_init = true;
	if ((rv = nng_pub0_open(&pub->sock)) != 0) {
		rv = wf__ctl_nng_err(rv, diag, "pub socket");
		goto err;
	}
	pub->sock_open = true;
	rv = nng_socket_set_int(pub->sock, NNG_OPT_SENDBUF,
	                        opts->queue_depth ? (int)opts->queue_depth : 1024);
	if (rv != 0) {
		rv = wf__ctl_nng_err(rv, diag, "send buffer");
		goto err;
	}
	/* Subscribers send nothing; anything they do send is dropped at the transport. */
	if ((rv = nng_socket_set_size(pub->sock, NNG_OPT_RECVMAXSZ, 1024)) != 0) {
		rv = wf__ctl_nng_err(rv, diag, "recv-size-max");
		goto err;
	}
	if ((rv = wf__ctl_listen(pub->sock, &opts->listen, WF_CTL_DEFAULT_EVENTS_URL, true,
	                         &pub->lst, diag)) < 0)
		goto err;
	if ((rv = wf__ctl_watchdog_start(&pub->watchdog, &pub->lst)) < 0) {
		rv = wf_diag_set(diag, rv, "watchdog thread: %s", strerror(-rv));
		goto err;
	}
	*ret_pub = pub;
	return 0;
err:
	wf_ctl_pub_destroy(pub);
	return rv;
}

int wf_ctl_pub_publish(struct wf_ctl_pub *pub, const Weightfloor__V1__Event *ev,
                       uint64_t *ret_sequence)
{
	Weightfloor__V1__Event e = *ev;
	nng_msg *msg = NULL;
	int rv = 0;

	e.epoch = pub->epoch;
	if (e.time_unix_ms == 0)
		e.time_unix_ms = wf__ctl_unix_ms();

	pthread_mutex_lock(&pub->mu);
	e.sequence = pub->seq + 1;
	size_t n = weightfloor__v1__event__get_packed_size(&e);
	if (n > pub->max_event) {
		rv = WF_ELIMIT;
		goto out;
	}
	if (nng_msg_alloc(&msg, n) != 0) {
		rv = -ENOMEM;
		goto out;
	}
	weightfloor__v1__event__pack(&e, nng_msg_body(msg));
	/* PUB never waits for subscribers; NONBLOCK makes that a promise. */
	if ((rv = nng_sendmsg(pub->sock, msg, NNG_FLAG_NONBLOCK)) != 0) {
		nng_msg_free(msg);
		rv = wf__ctl_nng_code(rv);
		goto out;
	}
	pub->seq = e.sequence;
	if (ret_sequence)
		*ret_sequence = e.sequence;
out:
	pthread_mutex_unlock(&pub->mu);
	return rv;
}

const char *wf_ctl_pub_url(const struct wf_ctl_pub *pub)
{
	return pub->lst.url;
}

uint64_t wf_ctl_pub_epoch(const struct wf_ctl_pub *pub)
{
	return pub->epoch;
}

void wf_ctl_pub_destroy(struct wf_ctl_pub *pub)
{
	if (!pub)
		return;
	wf__ctl_watchdog_stop(&pub->watchdog);
	if (pub->sock_open)
		nng_close(pub->sock);
	wf__ctl_listener_fini(&pub->lst);
	if (pub->mu_init)
		pthread_mutex_destroy(&pub->mu);
	free(pub);
}
