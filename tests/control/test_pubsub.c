/* Event publisher and subscriber over ipc:// in a fresh directory per test. */
#include "tests/control/ctl_test.h"

#include "base/error.h"
#include "common/wftest.h"
#include "control/pub.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <nng/nng.h>
#include <nng/protocol/pubsub0/pub.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define KIND(k) WEIGHTFLOOR__V1__EVENT_KIND__EVENT_KIND_##k

static struct wf_ctl_pub *make_pub(const char *dir, size_t max_event)
{
	struct wf_ctl_pub_opts o = {.max_event_size = max_event};
	struct wf_ctl_pub *pub = NULL;
	struct wf_diag d = {{0}};
	char *url = ipc_url(dir, "ev.sock");
	o.listen.url = url;
	int rv = wf_ctl_pub_create(&o, &pub, &d);
	free(url);
	cr_assert_eq(rv, 0, "pub: %s", wf_diag_str(&d, rv));
	return pub;
}

static struct wf_ctl_sub *make_sub(const char *url)
{
	struct wf_ctl_sub *sub = NULL;
	struct wf_diag d = {{0}};
	int rv = wf_ctl_sub_open(url, NULL, &sub, &d);
	cr_assert_eq(rv, 0, "sub: %s", wf_diag_str(&d, rv));
	return sub;
}

static uint64_t publish(struct wf_ctl_pub *pub, Weightfloor__V1__EventKind kind, const char *model,
                        uint64_t done)
{
	Weightfloor__V1__Event ev = WEIGHTFLOOR__V1__EVENT__INIT;
	uint64_t seq = 0;
	ev.kind = kind;
	ev.model = (char *)model;
	ev.bytes_done = done;
	ev.bytes_total = 1000;
	int rv = wf_ctl_pub_publish(pub, &ev, &seq);
	cr_assert_eq(rv, 0, "publish: %s", wf_err_name(rv));
	return seq;
}

/* PUB keeps no history: publish probes until the subscription is live, then drain them. */
static void sync_sub(struct wf_ctl_pub *pub, struct wf_ctl_sub *sub)
{
	Weightfloor__V1__Event *ev = NULL;
	int64_t until = now_ms() + 5000;
	bool live = false;
	while (!live && now_ms() < until) {
		publish(pub, KIND(WORKER), "probe", 0);
		if (wf_ctl_sub_recv(sub, 20, &ev, NULL) == 0) {
			wf_ctl_event_free(ev);
			live = true;
		}
	}
	cr_assert(live, "subscription never became live");
	while (wf_ctl_sub_recv(sub, 100, &ev, NULL) == 0)
		wf_ctl_event_free(ev);
}

Test(pubsub, events_in_order_with_increasing_sequence, .timeout = 30)
{
	char *dir = wft_tmpdir("pub");
	struct wf_ctl_pub *pub = make_pub(dir, 0);
	struct wf_ctl_sub *sub = make_sub(wf_ctl_pub_url(pub));
	sync_sub(pub, sub);

	const int n = 500;
	uint64_t first = 0;
	for (int i = 0; i < n; i++) {
		uint64_t s = publish(pub, KIND(PROGRESS), "qwen", (uint64_t)i);
		if (i == 0)
			first = s;
		else
			cr_assert_eq(s, first + (uint64_t)i);
	}
	uint64_t prev = 0;
	for (int i = 0; i < n; i++) {
		Weightfloor__V1__Event *ev = NULL;
		struct wf_diag d = {{0}};
		int rv = wf_ctl_sub_recv(sub, 2000, &ev, &d);
		cr_assert_eq(rv, 0, "event %d: %s", i, wf_diag_str(&d, rv));
		cr_assert_eq(ev->sequence, first + (uint64_t)i, "event %d has sequence %llu", i,
		             (unsigned long long)ev->sequence);
		cr_assert_gt(ev->sequence, prev);
		prev = ev->sequence;
		cr_expect_eq(ev->kind, KIND(PROGRESS));
		cr_expect_str_eq(ev->model, "qwen");
		cr_expect_eq(ev->bytes_done, (uint64_t)i);
		cr_expect_eq(ev->bytes_total, 1000);
		cr_expect_eq(ev->epoch, wf_ctl_pub_epoch(pub));
		cr_expect_neq(ev->epoch, 0);
		cr_expect_gt(ev->time_unix_ms, 1600000000000);
		wf_ctl_event_free(ev);
	}
	Weightfloor__V1__Event *ev = NULL;
	int64_t t0 = now_ms();
	cr_expect_eq(wf_ctl_sub_recv(sub, 100, &ev, NULL), WF_ETIMEOUT);
	cr_expect_lt(now_ms() - t0, 20 * 100); /* only a time-out gone far wrong fails */
	wf_ctl_sub_close(sub);
	wf_ctl_pub_destroy(pub);
	wft_rmtree(dir);
	free(dir);
}

struct pub_arg {
	struct wf_ctl_pub *pub;
	int n;
};

static void *pub_thread(void *p)
{
	struct pub_arg *a = p;
	for (int i = 0; i < a->n; i++) {
		Weightfloor__V1__Event ev = WEIGHTFLOOR__V1__EVENT__INIT;
		ev.kind = KIND(FLOOR_STATE);
		if (wf_ctl_pub_publish(a->pub, &ev, NULL) != 0)
			abort();
	}
	return NULL;
}

Test(pubsub, concurrent_publishers_keep_sequence_order, .timeout = 30)
{
	char *dir = wft_tmpdir("pub");
	struct wf_ctl_pub *pub = make_pub(dir, 0);
	struct wf_ctl_sub *sub = make_sub(wf_ctl_pub_url(pub));
	sync_sub(pub, sub);
	pthread_t t[4];
	struct pub_arg a = {.pub = pub, .n = 200};
	for (int i = 0; i < 4; i++)
		pthread_create(&t[i], NULL, pub_thread, &a);
	for (int i = 0; i < 4; i++)
		pthread_join(t[i], NULL);
	uint64_t prev = 0;
	for (int i = 0; i < 800; i++) {
		Weightfloor__V1__Event *ev = NULL;
		cr_assert_eq(wf_ctl_sub_recv(sub, 2000, &ev, NULL), 0, "event %d", i);
		if (i > 0)
			cr_assert_eq(ev->sequence, prev + 1, "gap or reorder at %d", i);
		prev = ev->sequence;
		wf_ctl_event_free(ev);
	}
	wf_ctl_sub_close(sub);
	wf_ctl_pub_destroy(pub);
	wft_rmtree(dir);
	free(dir);
}

Test(pubsub, publish_never_blocks, .timeout = 30)
{
	char *dir = wft_tmpdir("pub");
	struct wf_ctl_pub *pub = make_pub(dir, 0);

	/* No subscriber at all. */
	int64_t t0 = now_ms();
	for (int i = 0; i < 10000; i++)
		publish(pub, KIND(PROGRESS), "m", (uint64_t)i);
	/* A publish that waited for a subscriber would never return: the bound only says so
	 * before Criterion's time-out does. */
	cr_expect_lt(now_ms() - t0, 10000);

	/* A subscriber that does not read: the publisher drops for it instead of waiting (nng
	 * drops the oldest queued messages), and the subscriber sees the loss as a jump in the
	 * sequence. */
	struct wf_ctl_sub *sub = make_sub(wf_ctl_pub_url(pub));
	sync_sub(pub, sub);
	t0 = now_ms();
	uint64_t first = 0, last = 0;
	for (int i = 0; i < 20000; i++) {
		last = publish(pub, KIND(PROGRESS), "m", (uint64_t)i);
		if (i == 0)
			first = last;
	}
	int64_t dt = now_ms() - t0;
	cr_expect_lt(dt, 10000, "20000 publishes took %lld ms", (long long)dt);
	sleep_ms(200);
	uint64_t prev = first - 1, n = 0, jumps = 0;
	Weightfloor__V1__Event *ev = NULL;
	while (wf_ctl_sub_recv(sub, 200, &ev, NULL) == 0) {
		cr_expect_gt(ev->sequence, prev);
		if (ev->sequence != prev + 1)
			jumps++;
		prev = ev->sequence;
		n++;
		wf_ctl_event_free(ev);
	}
	cr_expect_gt(n, 0);
	cr_expect_lt(n, 20000, "everything was queued: the test overflowed nothing");
	cr_expect(jumps > 0 || prev < last, "losses must show as a jump in the sequence");
	cr_log_info("slow subscriber: %llu of 20000 events delivered (%llu jumps), last seq %llu "
	            "of %llu",
	            (unsigned long long)n, (unsigned long long)jumps, (unsigned long long)prev,
	            (unsigned long long)last);
	wf_ctl_sub_close(sub);
	wf_ctl_pub_destroy(pub);
	wft_rmtree(dir);
	free(dir);
}

Test(pubsub, oversized_event_is_refused_without_using_a_sequence, .timeout = 30)
{
	char *dir = wft_tmpdir("pub");
	struct wf_ctl_pub *pub = make_pub(dir, 256);
	uint64_t s1 = publish(pub, KIND(ERROR), "m", 0);
	char msg[1000];
	memset(msg, 'e', sizeof(msg) - 1);
	msg[sizeof(msg) - 1] = '\0';
	Weightfloor__V1__Event ev = WEIGHTFLOOR__V1__EVENT__INIT;
	ev.kind = KIND(ERROR);
	ev.message = msg;
	uint64_t seq = 0;
	cr_expect_eq(wf_ctl_pub_publish(pub, &ev, &seq), WF_ELIMIT);
	cr_expect_eq(seq, 0, "ret_sequence untouched on failure");
	cr_expect_eq(publish(pub, KIND(ERROR), "m", 0), s1 + 1);
	wf_ctl_pub_destroy(pub);
	wft_rmtree(dir);
	free(dir);
}

Test(pubsub, malformed_event_is_reported_and_skipped, .timeout = 30)
{
	char *dir = wft_tmpdir("pub");
	char *url = ipc_url(dir, "raw.sock");
	nng_socket p;
	cr_assert_eq(nng_pub0_open(&p), 0);
	cr_assert_eq(nng_listen(p, url, NULL, 0), 0);
	struct wf_ctl_sub *sub = make_sub(url);
	Weightfloor__V1__Event *ev = NULL;
	static const uint8_t junk[] = {0x08, 0xff};
	Weightfloor__V1__Event good = WEIGHTFLOOR__V1__EVENT__INIT;
	good.sequence = 77;
	uint8_t buf[64];
	size_t n = weightfloor__v1__event__pack(&good, buf);
	int rv = WF_ETIMEOUT;
	/* Wait for the subscription, sending junk until it shows. */
	for (int i = 0; i < 200 && rv == WF_ETIMEOUT; i++) {
		nng_send(p, (void *)junk, sizeof(junk), 0);
		rv = wf_ctl_sub_recv(sub, 20, &ev, NULL);
	}
	cr_expect_eq(rv, WF_EFORMAT, "%s", wf_err_name(rv));
	while (wf_ctl_sub_recv(sub, 100, &ev, NULL) == WF_EFORMAT)
		;
	cr_assert_eq(nng_send(p, buf, n, 0), 0);
	cr_assert_eq(wf_ctl_sub_recv(sub, 2000, &ev, NULL), 0);
	cr_expect_eq(ev->sequence, 77);
	wf_ctl_event_free(ev);
	wf_ctl_sub_close(sub);
	nng_close(p);
	free(url);
	wft_rmtree(dir);
	free(dir);
}

Test(pubsub, subscriber_without_publisher, .timeout = 30)
{
	char *dir = wft_tmpdir("pub");
	char *url = ipc_url(dir, "ev.sock");
	struct wf_ctl_sub *sub = NULL;
	cr_expect_eq(wf_ctl_sub_open(url, NULL, &sub, NULL), WF_EUNAVAILABLE);
	/* agentctl watch --wait: subscribe first, the agent comes later. */
	struct wf_ctl_client_opts o = {.wait_for_server = true};
	cr_assert_eq(wf_ctl_sub_open(url, &o, &sub, NULL), 0);
	struct wf_ctl_pub *pub = make_pub(dir, 0);
	sync_sub(pub, sub);
	uint64_t s = publish(pub, KIND(STALE), "m", 0);
	Weightfloor__V1__Event *ev = NULL;
	cr_assert_eq(wf_ctl_sub_recv(sub, 2000, &ev, NULL), 0);
	cr_expect_eq(ev->sequence, s);
	cr_expect_eq(ev->kind, KIND(STALE));
	wf_ctl_event_free(ev);
	wf_ctl_sub_close(sub);
	wf_ctl_pub_destroy(pub);
	free(url);
	wft_rmtree(dir);
	free(dir);
}
