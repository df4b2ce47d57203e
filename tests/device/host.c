/* Host-backend specifics: the arena, the throttle, and the ordering guarantees made observable by
 * a slow link (pending events, cross-stream waits, frees waiting for queued copies, cancel on
 * close). The shared contract is in contract.c. */
#include "base/error.h"
#include "device/device.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define MiB ((size_t)1 << 20)

#define OKD(call_with_diag)                                                                        \
	do {                                                                                       \
		struct wf_diag diag = {0};                                                         \
		int r_ = (call_with_diag);                                                         \
		cr_assert_eq(r_, 0, "%s: %s", #call_with_diag, wf_diag_str(&diag, r_));            \
	} while (0)

static struct wf_device *open_spec(const char *spec)
{
	struct wf_diag diag = {0};
	struct wf_device *dev = NULL;
	int ret = wf_device_open(spec, &dev, &diag);
	cr_assert_eq(ret, 0, "open %s: %s", spec, wf_diag_str(&diag, ret));
	return dev;
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

Test(device_host, options_parse)
{
	struct wf_device *dev;
	size_t f, t;

	dev = open_spec("host:mem=1.5Gi");
	OKD(wf_device_mem_info(dev, &f, &t, &diag));
	cr_assert_eq(t, (size_t)3 << 29);
	cr_assert_eq(f, t);
	wf_device_close(dev);

	dev = open_spec("host:mem=8G,bw=12G,chunk=1Mi,mlock=0");
	OKD(wf_device_mem_info(dev, &f, &t, &diag));
	cr_assert_eq(t, (size_t)8 << 30, "8G is 8 GiB, as everywhere (base/units.h)");
	cr_assert(strstr(wf_device_name(dev), "12.000 GiB/s"), "%s", wf_device_name(dev));
	wf_device_close(dev);

	dev = open_spec("host");
	OKD(wf_device_mem_info(dev, NULL, &t, &diag));
	cr_assert_eq(t, (size_t)8 << 30, "default arena");
	wf_device_close(dev);

	dev = open_spec("host:fail=3,sticky=100");
	OKD(wf_device_health(dev, &diag));
	wf_device_close(dev);

	static const char *bad[] = {"host:bw=-1",    "host:mem=0",   "host:mem",
	                            "host:chunk=1",  "host:mlock=2", "host:bw=1Q",
	                            "host:mem=1e30", "host:=3",      "host:sticky=x",
	                            "host:fail=-1",  "host:sticky=", "host:stickyy=1"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct wf_diag diag = {0};
		cr_assert_eq(wf_device_open(bad[i], &dev, &diag), WF_EINVAL, "%s", bad[i]);
		cr_assert_str_not_empty(diag.msg, "%s", bad[i]);
	}
}

Test(device_host, arena_is_exact)
{
	struct wf_device *dev = open_spec("host:mem=16Mi");
	size_t page = (size_t)sysconf(_SC_PAGESIZE), f;
	void *a, *b, *c;
	struct wf_diag dg = {0};

	OKD(wf_device_mem_alloc(dev, 8 * MiB, &a, &diag));
	OKD(wf_device_mem_alloc(dev, 8 * MiB - page, &b, &diag));
	OKD(wf_device_mem_info(dev, &f, NULL, &diag));
	cr_assert_eq(f, page);
	cr_assert_eq(wf_device_mem_alloc(dev, page + 1, &c, &dg), -ENOMEM);
	cr_assert(strstr(dg.msg, "arena"), "%s", dg.msg);
	OKD(wf_device_mem_alloc(dev, 1, &c, &diag));
	OKD(wf_device_mem_info(dev, &f, NULL, &diag));
	cr_assert_eq(f, 0);
	OKD(wf_device_mem_free(dev, a, &diag));
	OKD(wf_device_mem_info(dev, &f, NULL, &diag));
	cr_assert_eq(f, 8 * MiB);
	OKD(wf_device_mem_free(dev, b, &diag));
	OKD(wf_device_mem_free(dev, c, &diag));
	OKD(wf_device_mem_info(dev, &f, NULL, &diag));
	cr_assert_eq(f, 16 * MiB);
	wf_device_close(dev);
}

/* A throttled copy is never faster than the link: 64 MiB at 256 MiB/s take at least 0.25 s (each
 * step reserves its bytes/bw on the link's clock), and memcpy_async queues it without waiting.
 * How close to 0.25 s it comes depends on the machine's load: wf-bench residency's
 * host_link_throttle_s row measures that. The upper bound only catches a throttle gone wrong. */
Test(device_host, throttle_never_faster_than_the_link, .timeout = 30)
{
	struct wf_device *dev = open_spec("host:bw=256Mi");
	struct wf_device_stream *s;
	struct wf_device_event *e;
	size_t n = 64 * MiB;
	const double link_s = (double)n / (256.0 * MiB);
	void *d, *h;

	OKD(wf_device_stream_create(dev, &s, &diag));
	OKD(wf_device_event_create(dev, 0, &e, &diag));
	OKD(wf_device_mem_alloc(dev, n, &d, &diag));
	OKD(wf_device_pinned_alloc(dev, n, 0, &h, &diag));
	memset(h, 7, n);
	memset(d, 0, n); /* fault the pages in now: the clock below measures the link only */
	double t0 = now_s();
	OKD(wf_device_memcpy_async(s, d, h, n, WF_DEVICE_COPY_H2D, &diag));
	OKD(wf_device_event_record(e, s, &diag));
	int q = wf_device_event_query(e, NULL);
	double asked = now_s() - t0;
	/* Before the link time has passed the copy cannot be done, so a finished one means that
	 * memcpy_async waited for it. (A thread descheduled past the link time proves nothing.) */
	if (asked < link_s)
		cr_assert_eq(q, -EAGAIN, "memcpy_async returned after the copy (%.3f s)", asked);
	OKD(wf_device_stream_synchronize(s, &diag));
	double dt = now_s() - t0;
	cr_assert_geq(dt, link_s - 1e-4, "64 MiB at 256 MiB/s took %.3f s: faster than the link",
	              dt);
	cr_assert_lt(dt, 20 * link_s, "64 MiB at 256 MiB/s took %.3f s", dt);
	cr_assert_eq(((unsigned char *)d)[n - 1], 7);
	wf_device_close(dev);
}

/* The link is shared: two streams in the same direction split it; the other direction is
 * independent (PCIe is full duplex). */
Test(device_host, throttle_is_per_link_direction, .timeout = 30)
{
	struct wf_device *dev = open_spec("host:bw=256Mi");
	struct wf_device_stream *a, *b, *c;
	size_t n = 32 * MiB;
	void *d1, *d2, *d3, *h1, *h2, *h3;

	OKD(wf_device_stream_create(dev, &a, &diag));
	OKD(wf_device_stream_create(dev, &b, &diag));
	OKD(wf_device_stream_create(dev, &c, &diag));
	OKD(wf_device_mem_alloc(dev, n, &d1, &diag));
	OKD(wf_device_mem_alloc(dev, n, &d2, &diag));
	OKD(wf_device_mem_alloc(dev, n, &d3, &diag));
	OKD(wf_device_pinned_alloc(dev, n, 0, &h1, &diag));
	OKD(wf_device_pinned_alloc(dev, n, 0, &h2, &diag));
	OKD(wf_device_pinned_alloc(dev, n, 0, &h3, &diag));
	void *all[] = {d1, d2, d3, h1, h2, h3};
	for (int i = 0; i < 6; i++)
		memset(all[i], i, n);
	double t0 = now_s();
	OKD(wf_device_memcpy_async(a, d1, h1, n, WF_DEVICE_COPY_H2D, &diag));
	OKD(wf_device_memcpy_async(b, d2, h2, n, WF_DEVICE_COPY_H2D, &diag));
	OKD(wf_device_memcpy_async(c, h3, d3, n, WF_DEVICE_COPY_D2H, &diag));
	OKD(wf_device_synchronize(dev, &diag));
	double dt = now_s() - t0;
	/* 64 MiB H2D in total at 256 MiB/s: the two H2D streams share one link, so never less than
	 * 0.25 s (each alone would take 0.125 s). That the D2H copy overlaps rather than queueing
	 * behind them (0.375 s) is a matter of speed on a loaded machine, so only a throttle gone
	 * far wrong fails the upper bound. */
	cr_assert_geq(dt, 0.25 - 1e-4, "took %.3f s: the H2D streams did not share the link", dt);
	cr_assert_lt(dt, 20 * 0.25, "took %.3f s", dt);
	wf_device_close(dev);
}

Test(device_host, pending_event_then_complete, .timeout = 30)
{
	struct wf_device *dev = open_spec("host:bw=256Mi");
	struct wf_device_stream *s;
	struct wf_device_event *t0, *t1;
	size_t n = 32 * MiB;
	void *d, *h;
	double ms;

	OKD(wf_device_stream_create(dev, &s, &diag));
	OKD(wf_device_event_create(dev, WF_DEVICE_EVENT_TIMING, &t0, &diag));
	OKD(wf_device_event_create(dev, WF_DEVICE_EVENT_TIMING, &t1, &diag));
	OKD(wf_device_mem_alloc(dev, n, &d, &diag));
	OKD(wf_device_pinned_alloc(dev, n, 0, &h, &diag));
	memset(h, 1, n);
	memset(d, 0, n);
	double start = now_s();
	OKD(wf_device_event_record(t0, s, &diag));
	OKD(wf_device_memcpy_async(s, d, h, n, WF_DEVICE_COPY_H2D, &diag));
	OKD(wf_device_event_record(t1, s, &diag));
	int q = wf_device_event_query(t1, NULL), el = wf_device_event_elapsed_ms(t0, t1, &ms, NULL);
	/* Pending while the copy's link time (125 ms) has not passed; a thread descheduled longer
	 * than that may find it done, which proves nothing either way. */
	if (now_s() - start < 0.125) {
		cr_assert_eq(q, -EAGAIN);
		cr_assert_eq(el, -EAGAIN);
	}
	OKD(wf_device_event_synchronize(t1, &diag));
	cr_assert_eq(wf_device_event_query(t1, NULL), 0);
	cr_assert_eq(wf_device_event_query(t0, NULL), 0);
	OKD(wf_device_event_elapsed_ms(t0, t1, &ms, &diag));
	/* Never faster than the link (125 ms); the upper bound only catches a broken clock. */
	cr_assert(ms >= 125 - 0.1 && ms < 20 * 125, "32 MiB at 256 MiB/s: %.1f ms", ms);
	wf_device_close(dev);
}

/* b's work waits for the capture at the time of the wait call, not for later records. */
Test(device_host, cross_stream_wait_uses_capture_at_call, .timeout = 30)
{
	struct wf_device *dev = open_spec("host:bw=256Mi");
	struct wf_device_stream *a, *b, *c;
	struct wf_device_event *e, *f;
	size_t n = 32 * MiB;
	unsigned char *h, *out;
	void *d;

	OKD(wf_device_stream_create(dev, &a, &diag));
	OKD(wf_device_stream_create(dev, &b, &diag));
	OKD(wf_device_stream_create(dev, &c, &diag));
	OKD(wf_device_event_create(dev, 0, &e, &diag));
	OKD(wf_device_event_create(dev, 0, &f, &diag));
	OKD(wf_device_mem_alloc(dev, n, &d, &diag));
	OKD(wf_device_pinned_alloc(dev, n, 0, (void **)&h, &diag));
	OKD(wf_device_pinned_alloc(dev, 4096, 0, (void **)&out, &diag));
	memset(h, 9, n);
	memset(d, 0, n);

	double start = now_s();
	OKD(wf_device_memcpy_async(a, d, h, n, WF_DEVICE_COPY_H2D, &diag)); /* >= 125 ms */
	OKD(wf_device_event_record(e, a, &diag));
	OKD(wf_device_stream_wait_event(b, e, &diag));
	OKD(wf_device_memcpy_async(b, out, (char *)d + n - 4096, 4096, WF_DEVICE_COPY_D2H, &diag));
	OKD(wf_device_event_record(f, b, &diag));
	/* Re-record e on an idle stream: e completes at once, b must still wait for a. */
	OKD(wf_device_event_record(e, c, &diag));
	OKD(wf_device_event_synchronize(e, &diag));
	/* Before a's link time has passed, b cannot have run (if it was let through early, the
	 * stale bytes below say so too). */
	int q = wf_device_event_query(f, NULL);
	if (now_s() - start < 0.125)
		cr_assert_eq(q, -EAGAIN, "b ran before a's copy");
	OKD(wf_device_event_synchronize(f, &diag));
	for (int i = 0; i < 4096; i++)
		cr_assert_eq(out[i], 9, "b read stale bytes at %d", i);
	wf_device_close(dev);
}

/* A free waits for the copies queued before it: the munmap must not pull the pages out from
 * under the copy thread (ASan or a SIGSEGV would say so). */
Test(device_host, free_waits_for_queued_copies, .timeout = 30)
{
	struct wf_device *dev = open_spec("host:bw=256Mi");
	struct wf_device_stream *s;
	size_t n = 32 * MiB;
	void *d, *h;

	OKD(wf_device_stream_create(dev, &s, &diag));
	OKD(wf_device_mem_alloc(dev, n, &d, &diag));
	OKD(wf_device_pinned_alloc(dev, n, 0, &h, &diag));
	double t0 = now_s();
	OKD(wf_device_memcpy_async(s, d, h, n, WF_DEVICE_COPY_H2D, &diag));
	OKD(wf_device_mem_free(dev, d, &diag));
	double dt = now_s() - t0;
	/* The copy cannot end before its link time (32 MiB at 256 MiB/s: 125 ms). */
	cr_assert_geq(dt, 0.125 - 1e-4, "free returned after %.3f s, before the copy finished", dt);
	OKD(wf_device_pinned_free(dev, h, &diag));
	wf_device_stream_destroy(s);
	wf_device_close(dev);
}

/* Destroying a stream lets its queued work finish. */
Test(device_host, stream_destroy_drains, .timeout = 30)
{
	struct wf_device *dev = open_spec("host:bw=1Gi");
	struct wf_device_stream *s;
	size_t n = 32 * MiB;
	unsigned char *d, *h;

	OKD(wf_device_stream_create(dev, &s, &diag));
	OKD(wf_device_mem_alloc(dev, n, (void **)&d, &diag));
	OKD(wf_device_pinned_alloc(dev, n, 0, (void **)&h, &diag));
	memset(h, 0x42, n);
	memset(d, 0, n);
	OKD(wf_device_memcpy_async(s, d, h, n, WF_DEVICE_COPY_H2D, &diag));
	wf_device_stream_destroy(s);
	cr_assert_eq(d[0], 0x42);
	cr_assert_eq(d[n - 1], 0x42);
	wf_device_close(dev);
}

/* Closing cancels what has not run: 256 MiB queued at 16 MiB/s would take 16 s, so a close that
 * returns within half of that did not run them (how fast it returns is not the point). */
Test(device_host, close_cancels_queued_copies, .timeout = 30)
{
	struct wf_device *dev = open_spec("host:bw=16Mi");
	struct wf_device_stream *s[2];
	struct wf_device_event *e;
	size_t n = 64 * MiB;
	void *d[2], *h;

	/* One destination per stream: two unordered streams writing the same bytes would race. */
	for (int i = 0; i < 2; i++)
		OKD(wf_device_mem_alloc(dev, n, &d[i], &diag));
	OKD(wf_device_pinned_alloc(dev, n, 0, &h, &diag));
	OKD(wf_device_event_create(dev, 0, &e, &diag));
	for (int i = 0; i < 2; i++)
		OKD(wf_device_stream_create(dev, &s[i], &diag));
	for (int k = 0; k < 2; k++)
		for (int i = 0; i < 2; i++)
			OKD(wf_device_memcpy_async(s[i], d[i], h, n, WF_DEVICE_COPY_H2D, &diag));
	OKD(wf_device_event_record(e, s[0], &diag));
	OKD(wf_device_stream_wait_event(s[1], e, &diag));
	usleep(20000);
	/* 128 MiB on s[0] at 16 MiB/s: 8 s before e can complete. */
	cr_assert_eq(wf_device_event_query(e, NULL), -EAGAIN);
	double t0 = now_s();
	wf_device_close(dev);
	double dt = now_s() - t0;
	cr_assert_lt(dt, 8.0, "close took %.3f s: it ran the queued copies", dt);
}

Test(device_host, pinned_with_mlock)
{
	struct wf_device *dev = open_spec("host:mlock=1");
	struct rlimit rl;
	struct wf_diag dg = {0};
	void *p;

	cr_assert_eq(getrlimit(RLIMIT_MEMLOCK, &rl), 0);
	int ret = wf_device_pinned_alloc(dev, 4096, 0, &p, &dg);
	if (rl.rlim_cur >= 65536) {
		cr_assert_eq(ret, 0, "%s", wf_diag_str(&dg, ret));
		memset(p, 1, 4096);
		OKD(wf_device_pinned_free(dev, p, &diag));
	} else {
		cr_assert(ret == 0 || strstr(dg.msg, "mlock"), "%s", wf_diag_str(&dg, ret));
	}
	/* Far past any default RLIMIT_MEMLOCK: refused with an explanation, not a crash. */
	if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < ((rlim_t)1 << 30)) {
		wf_diag_clear(&dg);
		ret = wf_device_pinned_alloc(dev, (size_t)1 << 30, 0, &p, &dg);
		if (ret == 0) /* CAP_IPC_LOCK ignores the limit */
			OKD(wf_device_pinned_free(dev, p, &diag));
		else
			cr_assert(strstr(dg.msg, "mlock"), "%s", wf_diag_str(&dg, ret));
	}
	wf_device_close(dev);
}

Test(device_host, register_unmapped_range_fails)
{
	struct wf_device *dev = open_spec("host");
	size_t n = 1 << 20;
	struct wf_diag dg = {0};
	void *m = mmap(NULL, n, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	cr_assert_neq(m, MAP_FAILED);
	munmap((char *)m + n / 2, n / 2);
	cr_assert_eq(wf_device_host_register(dev, m, n, WF_DEVICE_REGISTER_READONLY, NULL, &dg),
	             -ENOMEM);
	cr_assert(strstr(dg.msg, "not mapped"), "%s", dg.msg);
	/* The failed registration left no record: the first half registers fine. */
	OKD(wf_device_host_register(dev, m, n / 2, 0, NULL, &diag));
	OKD(wf_device_host_unregister(dev, m, &diag));
	munmap(m, n / 2);
	wf_device_close(dev);
}

Test(device_host, device_memory_cannot_be_registered)
{
	struct wf_device *dev = open_spec("host");
	void *d;

	OKD(wf_device_mem_alloc(dev, 4096, &d, &diag));
	cr_assert_eq(wf_device_host_register(dev, d, 4096, 0, NULL, NULL), WF_EINVAL);
	wf_device_close(dev);
}

Test(device_host, backend_registration)
{
	static const struct wf_device_ops fake = {.name = "host"};
	cr_assert_eq(wf_device_backend_register(wf_device_host_ops()), 0);
	cr_assert_eq(wf_device_backend_register(&fake), WF_EDUPLICATE);
	cr_assert_eq(wf_device_backend_register(NULL), WF_EINVAL);
	static const struct wf_device_ops colon = {.name = "a:b"};
	cr_assert_eq(wf_device_backend_register(&colon), WF_EINVAL);
}

/* "auto" with a registered GPU-like backend: picks it when its probe finds a device, falls back
 * to host (and says so) when not. The fake is the host backend under another name. */
static int fake_count;
static struct wf_device_ops fake_ops;

static int fake_probe(void)
{
	return fake_count;
}

static int fake_open(const char *args, void **ret_impl, char *name, size_t name_len,
                     struct wf_diag *diag)
{
	cr_assert_str_eq(args, "0");
	return wf_device_host_ops()->open("mem=1Mi", ret_impl, name, name_len, diag);
}

Test(device_host, auto_selection)
{
	struct wf_device *dev;

	fake_ops = *wf_device_host_ops();
	fake_ops.name = "fakegpu";
	fake_ops.probe = fake_probe;
	fake_ops.open = fake_open;

	dev = open_spec("auto");
	cr_assert(strstr(wf_device_selection(dev), "no GPU backend registered"), "%s",
	          wf_device_selection(dev));
	wf_device_close(dev);

	cr_assert_eq(wf_device_backend_register(&fake_ops), 0);
	cr_assert_eq(wf_device_backend_register(&fake_ops), 0, "idempotent");
	fake_count = 0;
	dev = open_spec("auto");
	cr_assert_str_eq(wf_device_selection(dev),
	                 "auto: fakegpu probe found no device; using host");
	wf_device_close(dev);

	fake_count = 2;
	dev = open_spec("auto");
	cr_assert_str_eq(wf_device_selection(dev),
	                 "auto: fakegpu probe found 2 device(s); using fakegpu:0");
	size_t t;
	OKD(wf_device_mem_info(dev, NULL, &t, &diag));
	cr_assert_eq(t, MiB, "opened through the fake");
	wf_device_close(dev);
}

/* sticky=N: the Nth copy loses the device when it runs, as a kernel hitting an illegal address
 * loses a CUDA context. Until then the device is healthy; afterwards every call fails with
 * WF_EDEVICE and health says so, while the work already queued still drains: the host function
 * behind the faulting copy runs, its events complete (with the error), and destroying the
 * stream and closing the device return. */
static void set_flag(void *arg)
{
	*(int *)arg = 1;
}

/* Holds a stream until the test opens it, so what is queued behind it is queued before it runs. */
struct gate {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int open;
};

static void gate_wait(void *arg)
{
	struct gate *g = arg;
	pthread_mutex_lock(&g->mu);
	while (!g->open)
		pthread_cond_wait(&g->cv, &g->mu);
	pthread_mutex_unlock(&g->mu);
}

static void gate_open(struct gate *g)
{
	pthread_mutex_lock(&g->mu);
	g->open = 1;
	pthread_cond_broadcast(&g->cv);
	pthread_mutex_unlock(&g->mu);
}

Test(device_host, sticky_error_loses_the_device, .timeout = 30)
{
	struct wf_device *dev = open_spec("host:bw=256Mi,sticky=2");
	struct wf_device_stream *s, *s2 = NULL;
	struct wf_device_event *e, *e2 = NULL;
	struct wf_diag dg = {0};
	unsigned char *d, *h;
	void *p = NULL;
	size_t n = 8 * MiB;
	int ran = 0;

	OKD(wf_device_stream_create(dev, &s, &diag));
	OKD(wf_device_event_create(dev, 0, &e, &diag));
	OKD(wf_device_mem_alloc(dev, n, (void **)&d, &diag));
	OKD(wf_device_pinned_alloc(dev, n, 0, (void **)&h, &diag));
	memset(h, 7, n);
	memset(d, 0, n);
	OKD(wf_device_memcpy_async(s, d, h, n, WF_DEVICE_COPY_H2D, &diag)); /* copy 1 */
	OKD(wf_device_stream_synchronize(s, &diag));
	OKD(wf_device_health(dev, &diag));
	cr_assert_eq(d[n - 1], 7);

	memset(h, 8, n);
	/* Copy 2 faults when it runs; queueing it succeeds (a kernel's fault is asynchronous), and
	 * so does what is queued behind it before it runs (the gate holds the stream till then). */
	struct gate g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
	OKD(wf_device_host_fn_async(s, gate_wait, &g, &diag));
	OKD(wf_device_memcpy_async(s, d, h, n, WF_DEVICE_COPY_H2D, &diag));
	OKD(wf_device_host_fn_async(s, set_flag, &ran, &diag));
	OKD(wf_device_event_record(e, s, &diag));
	OKD(wf_device_health(dev, &diag));
	gate_open(&g);
	cr_assert_eq(wf_device_event_synchronize(e, &dg), WF_EDEVICE);
	cr_assert(strstr(dg.msg, "sticky"), "%s", dg.msg);
	cr_assert_eq(ran, 1, "the host function queued behind the fault did not run");
	cr_assert_eq(d[0], 7, "a lost device still copied");

	wf_diag_clear(&dg);
	cr_assert_eq(wf_device_health(dev, &dg), WF_EDEVICE);
	cr_assert(strstr(dg.msg, "lost"), "%s", dg.msg);
	/* Every call fails now, whatever it is. */
	cr_assert_eq(wf_device_stream_synchronize(s, NULL), WF_EDEVICE);
	cr_assert_eq(wf_device_synchronize(dev, NULL), WF_EDEVICE);
	cr_assert_eq(wf_device_event_query(e, NULL), WF_EDEVICE);
	cr_assert_eq(wf_device_mem_info(dev, NULL, NULL, NULL), WF_EDEVICE);
	cr_assert_eq(wf_device_mem_alloc(dev, 4096, &p, NULL), WF_EDEVICE);
	cr_assert_eq(wf_device_pinned_alloc(dev, 4096, 0, &p, NULL), WF_EDEVICE);
	cr_assert_null(p);
	cr_assert_eq(wf_device_memcpy_async(s, d, h, 4096, WF_DEVICE_COPY_H2D, NULL), WF_EDEVICE);
	cr_assert_eq(wf_device_memset_async(s, d, 0, 4096, NULL), WF_EDEVICE);
	cr_assert_eq(wf_device_host_fn_async(s, set_flag, &ran, NULL), WF_EDEVICE);
	cr_assert_eq(wf_device_event_record(e, s, NULL), WF_EDEVICE);
	cr_assert_eq(wf_device_stream_wait_event(s, e, NULL), WF_EDEVICE);
	cr_assert_eq(wf_device_stream_create(dev, &s2, NULL), WF_EDEVICE);
	cr_assert_eq(wf_device_event_create(dev, 0, &e2, NULL), WF_EDEVICE);
	cr_assert_null(s2);
	cr_assert_null(e2);
	uint64_t sum;
	cr_assert_eq(wf_device_checksum(s, d, 4096, &sum, NULL), WF_EDEVICE);
	static char plain[4096];
	cr_assert_eq(wf_device_host_register(dev, plain, sizeof plain, 0, NULL, NULL), WF_EDEVICE);
	/* Frees report the loss too, but free: the arena comes back (a test leaks nothing). */
	cr_assert_eq(wf_device_mem_free(dev, d, NULL), WF_EDEVICE);
	cr_assert_eq(wf_device_pinned_free(dev, h, NULL), WF_EDEVICE);
	cr_assert_eq(wf_device_mem_free(dev, d, NULL), WF_EINVAL, "the record is gone");
	wf_device_event_destroy(e);
	wf_device_stream_destroy(s);
	cr_assert_eq(wf_device_health(dev, NULL), WF_EDEVICE, "once lost, always lost");
	wf_device_close(dev);
}

/* A copy queued behind the fault, on another stream, still completes its waiters: a
 * synchronize that began before the loss returns (with the error), it does not hang. */
Test(device_host, sticky_error_wakes_waiters, .timeout = 30)
{
	struct wf_device *dev = open_spec("host:bw=64Mi,sticky=1");
	struct wf_device_stream *a, *b;
	struct wf_device_event *e;
	struct gate g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
	size_t n = 16 * MiB;
	void *d, *h;

	OKD(wf_device_stream_create(dev, &a, &diag));
	OKD(wf_device_stream_create(dev, &b, &diag));
	OKD(wf_device_event_create(dev, 0, &e, &diag));
	OKD(wf_device_mem_alloc(dev, 2 * n, &d, &diag));
	OKD(wf_device_pinned_alloc(dev, n, 0, &h, &diag));
	OKD(wf_device_host_fn_async(b, gate_wait, &g, &diag));
	OKD(wf_device_memset_async(b, d, 0, n, &diag));
	OKD(wf_device_event_record(e, b, &diag));
	OKD(wf_device_stream_wait_event(a, e, &diag));
	OKD(wf_device_memcpy_async(a, d, h, n, WF_DEVICE_COPY_H2D, &diag)); /* faults */
	OKD(wf_device_memset_async(a, (char *)d + n, 1, n, &diag));
	gate_open(&g);
	cr_assert_eq(wf_device_synchronize(dev, NULL), WF_EDEVICE);
	cr_assert_eq(wf_device_health(dev, NULL), WF_EDEVICE);
	wf_device_close(dev);
}
