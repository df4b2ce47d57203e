/* The device contract: what every backend promises, tested through the public interface only.
 *
 * Compiled twice: as test_device_contract_host (label unit) against the host backend, and with
 * WFT_DEVICE_CUDA as test_cuda_contract (label gpu) against cuda:0, whose main() exits 77 when
 * there is no GPU. The compute part (host functions in stream order, native handles, kernel
 * tables) runs on both too. Timing-dependent checks (pending states, throttle) live in host.c,
 * where the host backend's bw option makes them deterministic; the one pending state checked
 * here is held by a host function blocked on a gate, not by timing. */
#include "base/error.h"
#include "device/device.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#ifdef WFT_DEVICE_CUDA
#include "cuda/device_cuda.h"
#define WFT_SPEC "cuda:0"
/* The device with spec options (the fault injections, which both backends take). */
#define WFT_SPEC_WITH(opts) "cuda:0," opts
#define WFT_KIND            WF_DEVICE_KIND_CUDA
#define WFT_SUITE           cuda_contract
/* cudaMemGetInfo sees other processes and the driver's 2 MiB granularity. */
#define WFT_MEM_SLACK ((size_t)64 << 20)
#else
#define WFT_SPEC            "host:mem=1Gi"
#define WFT_SPEC_WITH(opts) "host:mem=1Gi," opts
#define WFT_KIND            WF_DEVICE_KIND_HOST
#define WFT_SUITE           host_contract
#define WFT_MEM_SLACK       ((size_t)0)
#endif

#define MiB ((size_t)1 << 20)

static struct wf_device *open_spec(const char *spec)
{
	struct wf_diag diag = {0};
	struct wf_device *dev = NULL;
	int ret;

#ifdef WFT_DEVICE_CUDA
	cr_assert_eq(wf_device_backend_register(wf_cuda_device_ops()), 0);
#endif
	ret = wf_device_open(spec, &dev, &diag);
	cr_assert_eq(ret, 0, "open %s: %s", spec, wf_diag_str(&diag, ret));
	return dev;
}

static struct wf_device *open_dev(void)
{
	return open_spec(WFT_SPEC);
}

/* Asserts success; the call may fill `diag`, whose text the failure shows. */
#define OKD(call_with_diag)                                                                        \
	do {                                                                                       \
		struct wf_diag diag = {0};                                                         \
		int r_ = (call_with_diag);                                                         \
		cr_assert_eq(r_, 0, "%s: %s", #call_with_diag, wf_diag_str(&diag, r_));            \
	} while (0)

static void fill_random(void *p, size_t n, uint64_t seed)
{
	unsigned char *b = p;
	uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
	for (size_t i = 0; i < n; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		b[i] = (unsigned char)(x >> 24);
	}
}

static void mem_free_now(struct wf_device *dev, size_t *ret_free)
{
	OKD(wf_device_mem_info(dev, ret_free, NULL, &diag));
}

static void assert_near(size_t a, size_t b, size_t slack, const char *what)
{
	size_t d = a > b ? a - b : b - a;
	cr_assert_leq(d, slack, "%s: %zu vs %zu (slack %zu)", what, a, b, slack);
}

Test(WFT_SUITE, open_describes_itself, .timeout = 60)
{
	struct wf_device *dev = open_dev();
	size_t f, t;

	cr_assert_eq(wf_device_kind(dev), WFT_KIND);
	cr_assert_str_not_empty(wf_device_name(dev));
	cr_assert_str_eq(wf_device_selection(dev), WFT_SPEC);
	OKD(wf_device_mem_info(dev, &f, &t, &diag));
	cr_assert_gt(t, 0);
	cr_assert_leq(f, t);
	wf_device_close(dev);
	wf_device_close(NULL);
}

/* Health: a fresh device is healthy, and ordinary failures (out of memory, a bad pointer, a bad
 * copy) leave it so: only a sticky error loses a device. */
Test(WFT_SUITE, ordinary_failures_leave_the_device_healthy, .timeout = 60)
{
	struct wf_device *dev = open_dev();
	struct wf_device_stream *s;
	size_t total;
	void *p = NULL, *d;
	int local;

	OKD(wf_device_health(dev, &diag));
	OKD(wf_device_mem_info(dev, NULL, &total, &diag));
	cr_assert_eq(wf_device_mem_alloc(dev, total + ((size_t)1 << 30), &p, NULL), -ENOMEM);
	cr_assert_eq(wf_device_mem_free(dev, &local, NULL), WF_EINVAL);
	OKD(wf_device_stream_create(dev, &s, &diag));
	OKD(wf_device_mem_alloc(dev, MiB, &d, &diag));
	cr_assert_eq(wf_device_memcpy_async(s, d, &local, 2 * MiB, WF_DEVICE_COPY_H2D, NULL),
	             WF_EINVAL);
	OKD(wf_device_stream_synchronize(s, &diag));
	OKD(wf_device_health(dev, &diag));
	cr_assert_eq(wf_device_health(NULL, NULL), WF_EINVAL);
	wf_device_close(dev);
}

Test(WFT_SUITE, auto_picks_and_says_why, .timeout = 60)
{
	struct wf_device *dev = NULL;
	struct wf_diag dg = {0};

#ifdef WFT_DEVICE_CUDA
	cr_assert_eq(wf_device_backend_register(wf_cuda_device_ops()), 0);
#endif
	int ret = wf_device_open("auto", &dev, &dg);
	cr_assert_eq(ret, 0, "%s", wf_diag_str(&dg, ret));
	cr_assert_eq(wf_device_kind(dev), WFT_KIND, "selection: %s", wf_device_selection(dev));
#ifdef WFT_DEVICE_CUDA
	cr_assert(strstr(wf_device_selection(dev), "using cuda:0"), "%s", wf_device_selection(dev));
#else
	cr_assert(strstr(wf_device_selection(dev), "using host"), "%s", wf_device_selection(dev));
#endif
	wf_device_close(dev);
}

Test(WFT_SUITE, bad_specs, .timeout = 60)
{
	struct wf_device *dev = (struct wf_device *)0x1;
	struct wf_diag dg = {0};

	cr_assert_eq(wf_device_open("bogus:1", &dev, &dg), WF_ENOT_FOUND);
	cr_assert_str_not_empty(dg.msg);
	cr_assert_eq(wf_device_open("", &dev, NULL), WF_EINVAL);
	cr_assert_eq(wf_device_open("host:nope=1", &dev, NULL), WF_EINVAL);
	cr_assert_eq(wf_device_open("host:mem=12X", &dev, NULL), WF_EINVAL);
#ifdef WFT_DEVICE_CUDA
	cr_assert_eq(wf_device_backend_register(wf_cuda_device_ops()), 0);
	cr_assert_eq(wf_device_open("cuda:x", &dev, NULL), WF_EINVAL);
	cr_assert_eq(wf_device_open("cuda:4096", &dev, NULL), -ENODEV);
#else
	cr_assert_eq(wf_device_open("cuda:0", &dev, NULL), WF_ENOT_FOUND);
#endif
	cr_assert_eq(dev, (struct wf_device *)0x1, "ret_dev written on failure");
}

Test(WFT_SUITE, alloc_free_returns_to_baseline, .timeout = 60)
{
	struct wf_device *dev = open_dev();
	size_t base, during, after;
	void *a, *b, *c;

	mem_free_now(dev, &base);
	OKD(wf_device_mem_alloc(dev, 64 * MiB, &a, &diag));
	OKD(wf_device_mem_alloc(dev, MiB + 1, &b, &diag));
	OKD(wf_device_mem_alloc(dev, 7, &c, &diag));
	cr_assert_eq((uintptr_t)a % 256, 0);
	cr_assert_eq((uintptr_t)b % 256, 0);
	cr_assert_eq((uintptr_t)c % 256, 0);
	mem_free_now(dev, &during);
	cr_assert_geq(base - during + WFT_MEM_SLACK, 65 * MiB + 8, "alloc did not show");
#ifndef WFT_DEVICE_CUDA
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	cr_assert_eq(base - during, 64 * MiB + (MiB + page) + page, "exact page-rounded use");
#endif
	OKD(wf_device_mem_free(dev, b, &diag));
	OKD(wf_device_mem_free(dev, a, &diag));
	OKD(wf_device_mem_free(dev, c, &diag));
	OKD(wf_device_mem_free(dev, NULL, &diag));
	mem_free_now(dev, &after);
	assert_near(after, base, WFT_MEM_SLACK, "free after eviction");
	wf_device_close(dev);
}

Test(WFT_SUITE, alloc_beyond_total_is_enomem, .timeout = 60)
{
	struct wf_device *dev = open_dev();
	struct wf_diag dg = {0};
	size_t base, after, total;
	void *p = (void *)0x1;

	OKD(wf_device_mem_info(dev, &base, &total, &diag));
	cr_assert_eq(wf_device_mem_alloc(dev, total + ((size_t)1 << 30), &p, &dg), -ENOMEM);
	cr_assert_str_not_empty(dg.msg);
	cr_assert_eq(p, (void *)0x1);
	cr_assert_eq(wf_device_mem_alloc(dev, 0, &p, NULL), WF_EINVAL);
	mem_free_now(dev, &after);
	assert_near(after, base, WFT_MEM_SLACK, "failed alloc leaked");
	wf_device_close(dev);
}

Test(WFT_SUITE, free_of_unknown_pointer_is_einval, .timeout = 60)
{
	struct wf_device *dev = open_dev();
	struct wf_diag dg = {0};
	void *p, *h;
	int local;

	OKD(wf_device_mem_alloc(dev, MiB, &p, &diag));
	OKD(wf_device_pinned_alloc(dev, 4096, 0, &h, &diag));
	cr_assert_eq(wf_device_mem_free(dev, &local, &dg), WF_EINVAL);
	cr_assert_str_not_empty(dg.msg);
	cr_assert_eq(wf_device_mem_free(dev, (char *)p + 256, NULL), WF_EINVAL);
	cr_assert_eq(wf_device_mem_free(dev, h, NULL), WF_EINVAL, "pinned freed as device");
	cr_assert_eq(wf_device_pinned_free(dev, p, NULL), WF_EINVAL, "device freed as pinned");
	cr_assert_eq(wf_device_host_unregister(dev, h, NULL), WF_EINVAL);
	OKD(wf_device_mem_free(dev, p, &diag));
	cr_assert_eq(wf_device_mem_free(dev, p, NULL), WF_EINVAL, "double free");
	OKD(wf_device_pinned_free(dev, h, &diag));
	cr_assert_eq(wf_device_pinned_free(dev, h, NULL), WF_EINVAL, "double free");
	wf_device_close(dev);
}

Test(WFT_SUITE, copy_round_trip_equals_source, .timeout = 60)
{
	struct wf_device *dev = open_dev();
	struct wf_device_stream *s;
	size_t n = 8 * MiB + 13;
	void *d, *src, *dst;
	unsigned char *pageable = malloc(n), *back = malloc(n);

	cr_assert(pageable && back);
	OKD(wf_device_stream_create(dev, &s, &diag));
	OKD(wf_device_mem_alloc(dev, n, &d, &diag));
	OKD(wf_device_pinned_alloc(dev, n, 0, &src, &diag));
	OKD(wf_device_pinned_alloc(dev, n, 0, &dst, &diag));

	/* From pinned staging. */
	fill_random(src, n, 1);
	memset(dst, 0, n);
	OKD(wf_device_memcpy_async(s, d, src, n, WF_DEVICE_COPY_H2D, &diag));
	OKD(wf_device_memcpy_async(s, dst, d, n, WF_DEVICE_COPY_D2H, &diag));
	OKD(wf_device_stream_synchronize(s, &diag));
	cr_assert_eq(memcmp(src, dst, n), 0);

	/* From pageable memory, into pageable memory. */
	fill_random(pageable, n, 2);
	OKD(wf_device_memcpy_async(s, d, pageable, n, WF_DEVICE_COPY_H2D, &diag));
	OKD(wf_device_memcpy_async(s, back, d, n, WF_DEVICE_COPY_D2H, &diag));
	OKD(wf_device_stream_synchronize(s, &diag));
	cr_assert_eq(memcmp(pageable, back, n), 0);

	/* Zero-length copies are no-ops. */
	OKD(wf_device_memcpy_async(s, d, src, 0, WF_DEVICE_COPY_H2D, &diag));
	wf_device_stream_destroy(s);
	free(pageable);
	free(back);
	wf_device_close(dev); /* frees d, src, dst */
}

Test(WFT_SUITE, copies_run_in_stream_order, .timeout = 60)
{
	struct wf_device *dev = open_dev();
	struct wf_device_stream *s;
	enum { N = 64, SZ = 1 << 16 };
	unsigned char *src, *out;
	void *d, *d2;

	OKD(wf_device_stream_create(dev, &s, &diag));
	OKD(wf_device_mem_alloc(dev, SZ, &d, &diag));
	OKD(wf_device_mem_alloc(dev, SZ, &d2, &diag));
	OKD(wf_device_pinned_alloc(dev, (size_t)N * SZ, 0, (void **)&src, &diag));
	OKD(wf_device_pinned_alloc(dev, SZ, 0, (void **)&out, &diag));
	for (int i = 0; i < N; i++)
		memset(src + (size_t)i * SZ, i + 1, SZ);
	/* Each copy overwrites the last one; only order makes the final content the last. */
	for (int i = 0; i < N; i++)
		OKD(wf_device_memcpy_async(s, d, src + (size_t)i * SZ, SZ, WF_DEVICE_COPY_H2D,
		                           &diag));
	OKD(wf_device_memset_async(s, d, 0xEE, 100, &diag));
	OKD(wf_device_memcpy_async(s, d2, d, SZ, WF_DEVICE_COPY_D2D, &diag));
	OKD(wf_device_memcpy_async(s, out, d2, SZ, WF_DEVICE_COPY_D2H, &diag));
	OKD(wf_device_stream_synchronize(s, &diag));
	for (size_t i = 0; i < SZ; i++)
		cr_assert_eq(out[i], i < 100 ? 0xEE : N, "byte %zu is %u", i, out[i]);
	wf_device_stream_destroy(s);
	wf_device_close(dev);
}

Test(WFT_SUITE, events_query_and_synchronize, .timeout = 60)
{
	struct wf_device *dev = open_dev();
	struct wf_device_stream *s;
	struct wf_device_event *e, *t0, *t1;
	size_t n = 32 * MiB;
	void *d, *h;
	double ms = -1;

	OKD(wf_device_stream_create(dev, &s, &diag));
	OKD(wf_device_event_create(dev, 0, &e, &diag));
	OKD(wf_device_event_create(dev, WF_DEVICE_EVENT_TIMING, &t0, &diag));
	OKD(wf_device_event_create(dev, WF_DEVICE_EVENT_TIMING | WF_DEVICE_EVENT_BLOCKING_SYNC, &t1,
	                           &diag));
	cr_assert_eq(wf_device_event_query(e, NULL), 0, "never recorded counts as complete");
	OKD(wf_device_mem_alloc(dev, n, &d, &diag));
	OKD(wf_device_pinned_alloc(dev, n, 0, &h, &diag));
	memset(h, 3, n);

	OKD(wf_device_event_record(t0, s, &diag));
	OKD(wf_device_memcpy_async(s, d, h, n, WF_DEVICE_COPY_H2D, &diag));
	OKD(wf_device_event_record(e, s, &diag));
	OKD(wf_device_event_record(t1, s, &diag));
	int q = wf_device_event_query(e, NULL);
	cr_assert(q == 0 || q == -EAGAIN, "query: %s", wf_err_name(q));
	OKD(wf_device_event_synchronize(e, &diag));
	cr_assert_eq(wf_device_event_query(e, NULL), 0);
	OKD(wf_device_event_synchronize(t1, &diag));
	OKD(wf_device_event_elapsed_ms(t0, t1, &ms, &diag));
	cr_assert_geq(ms, 0.0);
	cr_assert_eq(wf_device_event_elapsed_ms(t0, e, &ms, NULL), WF_EINVAL, "e has no timing");

	/* Re-recording on an idle stream completes again. */
	OKD(wf_device_event_record(e, s, &diag));
	OKD(wf_device_event_synchronize(e, &diag));
	cr_assert_eq(wf_device_event_query(e, NULL), 0);

	wf_device_event_destroy(e);
	wf_device_event_destroy(t0);
	wf_device_event_destroy(t1);
	wf_device_event_destroy(NULL);
	wf_device_stream_destroy(s);
	wf_device_stream_destroy(NULL);
	wf_device_close(dev);
}

Test(WFT_SUITE, cross_stream_wait_orders_work, .timeout = 60)
{
	struct wf_device *dev = open_dev();
	struct wf_device_stream *a, *b;
	struct wf_device_event *e;
	size_t n = 64 * MiB;
	void *d, *src, *out;

	OKD(wf_device_stream_create(dev, &a, &diag));
	OKD(wf_device_stream_create(dev, &b, &diag));
	OKD(wf_device_event_create(dev, 0, &e, &diag));
	OKD(wf_device_mem_alloc(dev, n, &d, &diag));
	OKD(wf_device_pinned_alloc(dev, n, 0, &src, &diag));
	OKD(wf_device_pinned_alloc(dev, n, 0, &out, &diag));
	fill_random(src, n, 3);
	memset(out, 0, n);
	for (int round = 0; round < 4; round++) {
		/* a writes d; b reads d only after a's event. */
		((unsigned char *)src)[round] ^= 0xFF; /* new contents each round */
		OKD(wf_device_memcpy_async(a, d, src, n, WF_DEVICE_COPY_H2D, &diag));
		OKD(wf_device_event_record(e, a, &diag));
		OKD(wf_device_stream_wait_event(b, e, &diag));
		OKD(wf_device_memcpy_async(b, out, d, n, WF_DEVICE_COPY_D2H, &diag));
		OKD(wf_device_stream_synchronize(b, &diag));
		cr_assert_eq(memcmp(out, src, n), 0, "round %d: b read before a wrote", round);
	}
	/* Destroying the event with a wait still queued is allowed. */
	OKD(wf_device_memcpy_async(a, d, src, n, WF_DEVICE_COPY_H2D, &diag));
	OKD(wf_device_event_record(e, a, &diag));
	OKD(wf_device_stream_wait_event(b, e, &diag));
	wf_device_event_destroy(e);
	OKD(wf_device_synchronize(dev, &diag));
	wf_device_stream_destroy(a);
	wf_device_stream_destroy(b);
	wf_device_close(dev);
}

Test(WFT_SUITE, checksum_matches_host, .timeout = 60)
{
	struct wf_device *dev = open_dev();
	struct wf_device_stream *s;
	size_t n = 4 * MiB + 5;
	unsigned char *h;
	void *d;
	uint64_t sum;

	OKD(wf_device_stream_create(dev, &s, &diag));
	OKD(wf_device_mem_alloc(dev, n, &d, &diag));
	OKD(wf_device_pinned_alloc(dev, n, 0, (void **)&h, &diag));
	fill_random(h, n, 4);
	OKD(wf_device_memcpy_async(s, d, h, n, WF_DEVICE_COPY_H2D, &diag));
	/* No synchronize: the checksum itself runs after the queued copy. */
	OKD(wf_device_checksum(s, d, n, &sum, &diag));
	cr_assert_eq(sum, wf_device_checksum_host(h, n));
	static const size_t offs[] = {1, 3, 7, 8, 13};
	for (size_t i = 0; i < sizeof(offs) / sizeof(offs[0]); i++) {
		size_t o = offs[i], len = n - o - 11;
		OKD(wf_device_checksum(s, (char *)d + o, len, &sum, &diag));
		cr_assert_eq(sum, wf_device_checksum_host(h + o, len), "offset %zu", o);
	}
	OKD(wf_device_checksum(s, d, 0, &sum, &diag));
	cr_assert_eq(sum, wf_device_checksum_host(NULL, 0));
	cr_assert_eq(wf_device_checksum(s, d, n + 1, &sum, NULL), WF_EINVAL);
	wf_device_stream_destroy(s);
	wf_device_close(dev);
}

Test(WFT_SUITE, pinned_alloc_is_usable, .timeout = 60)
{
	struct wf_device *dev = open_dev();
	struct wf_device_stream *s;
	unsigned char *p, *wc;
	void *d;

	OKD(wf_device_stream_create(dev, &s, &diag));
	OKD(wf_device_pinned_alloc(dev, 3 * MiB + 1, 0, (void **)&p, &diag));
	OKD(wf_device_pinned_alloc(dev, MiB, WF_DEVICE_PINNED_WRITE_COMBINED, (void **)&wc, &diag));
	cr_assert_eq(wf_device_pinned_alloc(dev, 0, 0, (void **)&p, NULL), WF_EINVAL);
	cr_assert_eq(wf_device_pinned_alloc(dev, 10, 0x80, (void **)&p, NULL), WF_EINVAL);
	memset(p, 0x5A, 3 * MiB + 1);
	memset(wc, 0xA5, MiB); /* write-only use, as staging would */
	OKD(wf_device_mem_alloc(dev, MiB, &d, &diag));
	OKD(wf_device_memcpy_async(s, d, wc, MiB, WF_DEVICE_COPY_H2D, &diag));
	OKD(wf_device_memcpy_async(s, p, d, MiB, WF_DEVICE_COPY_D2H, &diag));
	OKD(wf_device_stream_synchronize(s, &diag));
	cr_assert_eq(p[0], 0xA5);
	cr_assert_eq(p[MiB - 1], 0xA5);
	cr_assert_eq(p[MiB], 0x5A);
	OKD(wf_device_pinned_free(dev, wc, &diag));
	OKD(wf_device_pinned_free(dev, p, &diag));
	OKD(wf_device_mem_free(dev, d, &diag));
	wf_device_stream_destroy(s);
	wf_device_close(dev);
}

/* The floor is a PROT_READ file mapping; the direct mode registers it read-only and copies from
 * it without staging. */
Test(WFT_SUITE, register_read_only_mapping, .timeout = 60)
{
	struct wf_device *dev = open_dev();
	struct wf_device_stream *s;
	size_t n = 16 * MiB;
	unsigned char *buf = malloc(n), *out;
	unsigned applied = 0;
	void *d;
	int fd;

	cr_assert(buf);
	fill_random(buf, n, 5);
	/* A memfd, as the floor's shared memory is: page-cache pages, not anonymous ones. */
	fd = memfd_create("wftest-floor", MFD_CLOEXEC);
	cr_assert_geq(fd, 0);
	cr_assert_eq(write(fd, buf, n), (ssize_t)n);
	void *map = mmap(NULL, n, PROT_READ, MAP_SHARED, fd, 0);
	cr_assert_neq(map, MAP_FAILED);
	close(fd);

	OKD(wf_device_host_register(dev, map, n, WF_DEVICE_REGISTER_READONLY, &applied, &diag));
	cr_assert_eq(applied, WF_DEVICE_REGISTER_READONLY);
	cr_assert_eq(wf_device_host_register(dev, (char *)map + 4096, 4096,
	                                     WF_DEVICE_REGISTER_READONLY, NULL, NULL),
	             WF_EOVERLAP);
	cr_assert_eq(wf_device_host_register(dev, map, n, 0x40, NULL, NULL), WF_EINVAL);

	OKD(wf_device_stream_create(dev, &s, &diag));
	OKD(wf_device_mem_alloc(dev, n, &d, &diag));
	OKD(wf_device_pinned_alloc(dev, n, 0, (void **)&out, &diag));
	OKD(wf_device_memcpy_async(s, d, map, n, WF_DEVICE_COPY_H2D, &diag));
	uint64_t sum;
	OKD(wf_device_checksum(s, d, n, &sum, &diag));
	cr_assert_eq(sum, wf_device_checksum_host(buf, n), "device bytes differ from file bytes");
	OKD(wf_device_memcpy_async(s, out, d, n, WF_DEVICE_COPY_D2H, &diag));
	OKD(wf_device_stream_synchronize(s, &diag));
	cr_assert_eq(memcmp(out, buf, n), 0);

	OKD(wf_device_host_unregister(dev, map, &diag));
	cr_assert_eq(wf_device_host_unregister(dev, map, NULL), WF_EINVAL);
	/* Registered again after unregistering: the record was really dropped. */
	OKD(wf_device_host_register(dev, map, n, WF_DEVICE_REGISTER_READONLY, NULL, &diag));
	wf_device_stream_destroy(s);
	wf_device_close(dev); /* unregisters before the unmap below */
	munmap(map, n);
	free(buf);
}

Test(WFT_SUITE, copies_outside_allocations_are_einval, .timeout = 60)
{
	struct wf_device *dev = open_dev();
	struct wf_device_stream *s;
	struct wf_diag dg = {0};
	unsigned char host[4096];
	void *d, *d2;

	OKD(wf_device_stream_create(dev, &s, &diag));
	OKD(wf_device_mem_alloc(dev, 4096, &d, &diag));
	OKD(wf_device_mem_alloc(dev, 4096, &d2, &diag));
	wf_diag_clear(&dg);
	cr_assert_eq(wf_device_memcpy_async(s, host, host, 16, WF_DEVICE_COPY_H2D, &dg), WF_EINVAL);
	cr_assert_str_not_empty(dg.msg);
	cr_assert_eq(
	    wf_device_memcpy_async(s, (char *)d + 4000, host, 97, WF_DEVICE_COPY_H2D, NULL),
	    WF_EINVAL, "runs past the allocation");
	cr_assert_eq(wf_device_memcpy_async(s, d, d2, 16, WF_DEVICE_COPY_H2D, NULL), WF_EINVAL,
	             "device memory as host source");
	cr_assert_eq(wf_device_memcpy_async(s, host, host, 16, WF_DEVICE_COPY_D2H, NULL),
	             WF_EINVAL);
	cr_assert_eq(wf_device_memcpy_async(s, d2, host, 16, WF_DEVICE_COPY_D2D, NULL), WF_EINVAL);
	cr_assert_eq(wf_device_memcpy_async(s, d, host, 16, WF_DEVICE_COPY_MAX, NULL), WF_EINVAL);
	cr_assert_eq(wf_device_memset_async(s, (char *)d + 1, 0, 4096, NULL), WF_EINVAL);
	OKD(wf_device_memcpy_async(s, (char *)d + 4095, host, 1, WF_DEVICE_COPY_H2D, &diag));
	OKD(wf_device_stream_synchronize(s, &diag));
	wf_device_stream_destroy(s);
	wf_device_close(dev);
}

Test(WFT_SUITE, foreign_stream_and_event_are_einval, .timeout = 60)
{
	struct wf_device *a = open_dev(), *b = open_dev();
	struct wf_device_stream *sa, *sb;
	struct wf_device_event *eb;

	OKD(wf_device_stream_create(a, &sa, &diag));
	OKD(wf_device_stream_create(b, &sb, &diag));
	OKD(wf_device_event_create(b, 0, &eb, &diag));
	cr_assert_eq(wf_device_event_record(eb, sa, NULL), WF_EINVAL);
	cr_assert_eq(wf_device_stream_wait_event(sa, eb, NULL), WF_EINVAL);
	OKD(wf_device_event_record(eb, sb, &diag));
	wf_device_close(a);
	wf_device_close(b); /* reclaims sb and eb */
}

/* Close with copies queued and objects left behind: no crash, no leak (ASan), no hang. */
Test(WFT_SUITE, close_with_copies_in_flight, .timeout = 60)
{
	struct wf_device *dev = open_dev();
	struct wf_device_stream *s[3];
	struct wf_device_event *e;
	size_t n = 32 * MiB;
	void *d, *h;

	OKD(wf_device_mem_alloc(dev, n, &d, &diag));
	OKD(wf_device_pinned_alloc(dev, n, 0, &h, &diag));
	memset(h, 1, n);
	OKD(wf_device_event_create(dev, 0, &e, &diag));
	for (int i = 0; i < 3; i++)
		OKD(wf_device_stream_create(dev, &s[i], &diag));
	for (int k = 0; k < 8; k++)
		for (int i = 0; i < 3; i++)
			OKD(wf_device_memcpy_async(s[i], d, h, n, WF_DEVICE_COPY_H2D, &diag));
	OKD(wf_device_event_record(e, s[0], &diag));
	OKD(wf_device_stream_wait_event(s[1], e, &diag));
	wf_device_close(dev);
}

struct worker_arg {
	struct wf_device *dev;
	int id;
	int failures;
};

static void *worker(void *p)
{
	struct worker_arg *w = p;
	struct wf_device_stream *s = NULL;
	size_t n = MiB + (size_t)w->id * 4096;
	unsigned char *src = malloc(n), *out = malloc(n);
	void *d = NULL;

	if (!src || !out || wf_device_stream_create(w->dev, &s, NULL) < 0)
		goto fail;
	for (int round = 0; round < 20; round++) {
		fill_random(src, n, (uint64_t)(w->id * 100 + round));
		if (wf_device_mem_alloc(w->dev, n, &d, NULL) < 0 ||
		    wf_device_memcpy_async(s, d, src, n, WF_DEVICE_COPY_H2D, NULL) < 0 ||
		    wf_device_memcpy_async(s, out, d, n, WF_DEVICE_COPY_D2H, NULL) < 0 ||
		    wf_device_stream_synchronize(s, NULL) < 0 || memcmp(src, out, n) != 0 ||
		    wf_device_mem_free(w->dev, d, NULL) < 0)
			goto fail;
	}
	wf_device_stream_destroy(s);
	free(src);
	free(out);
	return NULL;
fail:
	w->failures++;
	wf_device_stream_destroy(s);
	free(src);
	free(out);
	return NULL;
}

Test(WFT_SUITE, concurrent_users, .timeout = 120)
{
	struct wf_device *dev = open_dev();
	enum { T = 4 };
	pthread_t th[T];
	struct worker_arg args[T];
	size_t base, after;

	mem_free_now(dev, &base);
	for (int i = 0; i < T; i++) {
		args[i] = (struct worker_arg){.dev = dev, .id = i};
		cr_assert_eq(pthread_create(&th[i], NULL, worker, &args[i]), 0);
	}
	for (int i = 0; i < T; i++) {
		pthread_join(th[i], NULL);
		cr_assert_eq(args[i].failures, 0, "worker %d failed", i);
	}
	mem_free_now(dev, &after);
	assert_near(after, base, WFT_MEM_SLACK, "after concurrent use");
	wf_device_close(dev);
}

/* ---- Host work and kernels ------------------------------------------------------------------- */

/* What a host function saw, written by it and read by the test only after a synchronize. */
struct seen {
	const unsigned char *want; /* what the bytes must be when fn runs */
	unsigned char *bytes;      /* host bytes an earlier copy filled; fn then rewrites them */
	size_t n;
	int calls;
	int status; /* the error convention of device.h: 0 or WF_E* */
};

static void check_then_rewrite(void *p)
{
	struct seen *s = p;

	s->calls++;
	s->status = memcmp(s->bytes, s->want, s->n) == 0 ? 0 : WF_ECHECKSUM;
	memset(s->bytes, 0x5A, s->n);
}

static int all_bytes(const unsigned char *p, size_t n, unsigned char v)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != v)
			return 0;
	return 1;
}

/* src -> d1 -> hb, fn checks hb and rewrites it, hb -> d2 -> out. fn must see the copied bytes
 * (it ran after the D2H), and out must hold fn's bytes (the later H2D waited for fn). A second
 * stream that waits on an event recorded after fn must see fn's bytes too. */
Test(WFT_SUITE, host_fn_runs_between_copies_in_stream_order, .timeout = 60)
{
	struct wf_device *dev = open_dev();
	struct wf_device_stream *s, *t;
	struct wf_device_event *after_fn;
	size_t n = 32 * MiB;
	void *d1, *d2, *d3;
	unsigned char *src, *hb, *out, *out2;
	struct seen seen = {0};

	OKD(wf_device_stream_create(dev, &s, &diag));
	OKD(wf_device_stream_create(dev, &t, &diag));
	OKD(wf_device_event_create(dev, 0, &after_fn, &diag));
	OKD(wf_device_mem_alloc(dev, n, &d1, &diag));
	OKD(wf_device_mem_alloc(dev, n, &d2, &diag));
	OKD(wf_device_mem_alloc(dev, n, &d3, &diag));
	OKD(wf_device_pinned_alloc(dev, n, 0, (void **)&src, &diag));
	OKD(wf_device_pinned_alloc(dev, n, 0, (void **)&hb, &diag));
	OKD(wf_device_pinned_alloc(dev, n, 0, (void **)&out, &diag));
	OKD(wf_device_pinned_alloc(dev, n, 0, (void **)&out2, &diag));
	fill_random(src, n, 7);
	memset(hb, 0, n);
	memset(out, 0, n);
	memset(out2, 0, n);
	seen = (struct seen){.want = src, .bytes = hb, .n = n, .status = -1};

	OKD(wf_device_memcpy_async(s, d1, src, n, WF_DEVICE_COPY_H2D, &diag));
	OKD(wf_device_memcpy_async(s, hb, d1, n, WF_DEVICE_COPY_D2H, &diag));
	OKD(wf_device_host_fn_async(s, check_then_rewrite, &seen, &diag));
	OKD(wf_device_event_record(after_fn, s, &diag));
	OKD(wf_device_memcpy_async(s, d2, hb, n, WF_DEVICE_COPY_H2D, &diag));
	OKD(wf_device_memcpy_async(s, out, d2, n, WF_DEVICE_COPY_D2H, &diag));
	/* The other stream: only the event orders it after fn. */
	OKD(wf_device_stream_wait_event(t, after_fn, &diag));
	OKD(wf_device_memcpy_async(t, d3, hb, n, WF_DEVICE_COPY_H2D, &diag));
	OKD(wf_device_memcpy_async(t, out2, d3, n, WF_DEVICE_COPY_D2H, &diag));

	/* The event recorded after fn is the caller's licence to read fn's status. */
	OKD(wf_device_event_synchronize(after_fn, &diag));
	cr_assert_eq(seen.calls, 1);
	cr_assert_eq(seen.status, 0, "fn ran before the D2H copy before it finished");
	OKD(wf_device_stream_synchronize(s, &diag));
	cr_assert(all_bytes(out, n, 0x5A), "the copy after fn did not wait for it");
	OKD(wf_device_stream_synchronize(t, &diag));
	cr_assert(all_bytes(out2, n, 0x5A), "a wait on an event after fn did not wait for fn");
	cr_assert_eq(seen.calls, 1);
	wf_device_event_destroy(after_fn);
	wf_device_close(dev);
}

struct order_log {
	atomic_int next;
	int at[64]; /* at[i]: the position in which fn number i ran */
};

struct order_arg {
	struct order_log *log;
	int id;
};

static void log_order(void *p)
{
	struct order_arg *a = p;
	a->log->at[a->id] = atomic_fetch_add(&a->log->next, 1);
}

Test(WFT_SUITE, host_fns_run_once_each_in_queue_order, .timeout = 60)
{
	struct wf_device *dev = open_dev();
	struct wf_device_stream *s;
	struct order_log log = {0};
	struct order_arg args[64];
	void *d, *h;

	OKD(wf_device_stream_create(dev, &s, &diag));
	OKD(wf_device_mem_alloc(dev, MiB, &d, &diag));
	OKD(wf_device_pinned_alloc(dev, MiB, 0, &h, &diag));
	atomic_init(&log.next, 0);
	for (int i = 0; i < 64; i++) {
		args[i] = (struct order_arg){.log = &log, .id = i};
		log.at[i] = -1;
		/* Copies between the functions, so they do not simply run back to back. */
		if (i % 8 == 0)
			OKD(wf_device_memcpy_async(s, d, h, MiB, WF_DEVICE_COPY_H2D, &diag));
		OKD(wf_device_host_fn_async(s, log_order, &args[i], &diag));
	}
	OKD(wf_device_stream_synchronize(s, &diag));
	cr_assert_eq(atomic_load(&log.next), 64);
	for (int i = 0; i < 64; i++)
		cr_assert_eq(log.at[i], i, "fn %d ran in position %d", i, log.at[i]);
	wf_device_close(dev);
}

/* A gate a host function blocks on until the test opens it (or 20 s pass: then the test fails
 * on `timed_out`, it does not hang). */
struct gate {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int entered, open, timed_out;
};

static void wait_at_gate(void *p)
{
	struct gate *g = p;
	struct timespec dl;

	clock_gettime(CLOCK_REALTIME, &dl);
	dl.tv_sec += 20;
	pthread_mutex_lock(&g->lock);
	g->entered = 1;
	pthread_cond_broadcast(&g->cond);
	while (!g->open && !g->timed_out)
		if (pthread_cond_timedwait(&g->cond, &g->lock, &dl) == ETIMEDOUT)
			g->timed_out = 1;
	pthread_mutex_unlock(&g->lock);
}

/* While a host function holds stream a, stream b's copies complete, and a's later copies and
 * event do not start: the streams are independent, and fn holds only its own stream. */
Test(WFT_SUITE, blocked_host_fn_holds_only_its_stream, .timeout = 60)
{
	struct wf_device *dev = open_dev();
	struct wf_device_stream *a, *b;
	struct wf_device_event *ea;
	struct gate g = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};
	size_t n = 4 * MiB;
	void *da, *db;
	unsigned char *src, *out_a, *out_b;

	OKD(wf_device_stream_create(dev, &a, &diag));
	OKD(wf_device_stream_create(dev, &b, &diag));
	OKD(wf_device_event_create(dev, 0, &ea, &diag));
	OKD(wf_device_mem_alloc(dev, n, &da, &diag));
	OKD(wf_device_mem_alloc(dev, n, &db, &diag));
	OKD(wf_device_pinned_alloc(dev, n, 0, (void **)&src, &diag));
	OKD(wf_device_pinned_alloc(dev, n, 0, (void **)&out_a, &diag));
	OKD(wf_device_pinned_alloc(dev, n, 0, (void **)&out_b, &diag));
	fill_random(src, n, 11);
	memset(out_a, 0, n);
	memset(out_b, 0, n);

	OKD(wf_device_host_fn_async(a, wait_at_gate, &g, &diag));
	OKD(wf_device_memcpy_async(a, da, src, n, WF_DEVICE_COPY_H2D, &diag));
	OKD(wf_device_memcpy_async(a, out_a, da, n, WF_DEVICE_COPY_D2H, &diag));
	OKD(wf_device_event_record(ea, a, &diag));

	OKD(wf_device_memcpy_async(b, db, src, n, WF_DEVICE_COPY_H2D, &diag));
	OKD(wf_device_memcpy_async(b, out_b, db, n, WF_DEVICE_COPY_D2H, &diag));
	OKD(wf_device_stream_synchronize(b, &diag));
	cr_assert_eq(memcmp(out_b, src, n), 0, "stream b was held up by a's host function");

	pthread_mutex_lock(&g.lock);
	while (!g.entered && !g.timed_out)
		pthread_cond_wait(&g.cond, &g.lock);
	cr_assert_eq(g.timed_out, 0);
	/* fn is still blocked: nothing queued after it on a may have run. */
	cr_assert_eq(wf_device_event_query(ea, NULL), -EAGAIN);
	cr_assert(all_bytes(out_a, n, 0), "a copy queued after a blocked host fn ran");
	g.open = 1;
	pthread_cond_broadcast(&g.cond);
	pthread_mutex_unlock(&g.lock);

	OKD(wf_device_event_synchronize(ea, &diag));
	cr_assert_eq(memcmp(out_a, src, n), 0);
	cr_assert_eq(g.timed_out, 0);
	wf_device_close(dev);
}

Test(WFT_SUITE, kind_native_and_owner_queries, .timeout = 60)
{
	struct wf_device *dev = open_dev(), *other = open_dev();
	struct wf_device_stream *s, *s2, *so;
	struct wf_device_event *eo;

	OKD(wf_device_stream_create(dev, &s, &diag));
	OKD(wf_device_stream_create(dev, &s2, &diag));
	OKD(wf_device_stream_create(other, &so, &diag));
	OKD(wf_device_event_create(other, 0, &eo, &diag));
	cr_assert_eq(wf_device_kind(dev), WFT_KIND);
	cr_assert_eq(wf_device_kind(NULL), WF_DEVICE_KIND_MAX);
	cr_assert_eq(wf_device_stream_device(s), dev);
	cr_assert_eq(wf_device_stream_device(so), other);
	cr_assert_null(wf_device_stream_device(NULL));
#ifdef WFT_DEVICE_CUDA
	/* The cudaStream_t of each stream: real, distinct, not the legacy default stream (NULL). */
	cr_assert_not_null(wf_device_stream_native(s));
	cr_assert_not_null(wf_device_stream_native(s2));
	cr_assert_neq(wf_device_stream_native(s), wf_device_stream_native(s2));
#else
	/* The host backend has no native queue: CPU kernels are host functions. */
	cr_assert_null(wf_device_stream_native(s));
	cr_assert_null(wf_device_stream_native(s2));
#endif
	cr_assert_null(wf_device_stream_native(NULL));
	/* A stream of another device: its work (host functions included) is ordered only by that
	 * device's events, and mixing the two devices' objects is refused. */
	OKD(wf_device_event_record(eo, so, &diag));
	cr_assert_eq(wf_device_stream_wait_event(s, eo, NULL), WF_EINVAL);
	cr_assert_eq(wf_device_event_record(eo, s, NULL), WF_EINVAL);
	wf_device_close(other);
	wf_device_close(dev);
}

static void count_call(void *p)
{
	atomic_fetch_add((atomic_int *)p, 1);
}

Test(WFT_SUITE, host_fn_bad_arguments_are_einval, .timeout = 60)
{
	struct wf_device *dev = open_dev();
	struct wf_device_stream *s;
	struct wf_diag dg = {0};
	atomic_int calls;

	atomic_init(&calls, 0);
	OKD(wf_device_stream_create(dev, &s, &diag));
	cr_assert_eq(wf_device_host_fn_async(s, NULL, &calls, &dg), WF_EINVAL);
	cr_assert(strstr(wf_diag_str(&dg, WF_EINVAL), "no function"), "%s",
	          wf_diag_str(&dg, WF_EINVAL));
	cr_assert_eq(wf_device_host_fn_async(NULL, count_call, &calls, NULL), WF_EINVAL);
	/* The refused calls queued nothing; an accepted one runs once. */
	OKD(wf_device_host_fn_async(s, count_call, &calls, &diag));
	OKD(wf_device_stream_synchronize(s, &diag));
	cr_assert_eq(atomic_load(&calls), 1);
	wf_device_close(dev);
}

/* fn owns its argument and frees it: destroy and close must run every queued fn first (the
 * calls counter proves it; ASan would report the leak otherwise). */
struct owned {
	atomic_int *calls;
	char payload[64];
};

static void free_owned(void *p)
{
	struct owned *o = p;
	atomic_fetch_add(o->calls, 1);
	free(o);
}

Test(WFT_SUITE, destroy_and_close_run_queued_host_fns, .timeout = 60)
{
	struct wf_device *dev = open_dev();
	struct wf_device_stream *s[2];
	atomic_int calls;
	size_t n = 32 * MiB;
	void *d[2], *h;

	atomic_init(&calls, 0);
	/* One destination per stream: two unordered streams writing the same bytes would race. */
	for (int i = 0; i < 2; i++)
		OKD(wf_device_mem_alloc(dev, n, &d[i], &diag));
	OKD(wf_device_pinned_alloc(dev, n, 0, &h, &diag));
	memset(h, 1, n);
	for (int i = 0; i < 2; i++)
		OKD(wf_device_stream_create(dev, &s[i], &diag));
	for (int k = 0; k < 4; k++) {
		for (int i = 0; i < 2; i++) {
			struct owned *o = calloc(1, sizeof(*o));
			cr_assert_not_null(o);
			o->calls = &calls;
			OKD(wf_device_memcpy_async(s[i], d[i], h, n, WF_DEVICE_COPY_H2D, &diag));
			OKD(wf_device_host_fn_async(s[i], free_owned, o, &diag));
		}
	}
	wf_device_stream_destroy(s[0]);
	cr_assert_eq(atomic_load(&calls) >= 4, 1, "destroy returned before its fns ran");
	wf_device_close(dev); /* s[1] still has copies and fns queued */
	cr_assert_eq(atomic_load(&calls), 8, "close returned before every queued fn ran");
}

/* ---- Fault injection (device.h: fail=N, bw=RATE, sticky=N), the same on every backend ---- */

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* An anonymous mapping of n random bytes (seed), registered with dev. */
static unsigned char *registered(struct wf_device *dev, size_t n, uint64_t seed)
{
	unsigned char *p =
	    mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	cr_assert_neq(p, MAP_FAILED);
	fill_random(p, n, seed);
	OKD(wf_device_host_register(dev, p, n, 0, NULL, &diag));
	return p;
}

/* fail=2: the 2nd, 4th, ... H2D copy from a registered range fails, alternately when queued and
 * when it runs (reported by the next event recorded on its stream, once); copies from other
 * host memory never fail, a failed copy leaves its destination alone, and the device stays
 * healthy. */
Test(WFT_SUITE, fail_n_fails_every_nth_registered_copy, .timeout = 60)
{
	struct wf_device *dev = open_spec(WFT_SPEC_WITH("fail=2"));
	struct wf_device_stream *s;
	struct wf_device_event *e1, *e2, *e3;
	struct wf_diag dg = {0};
	const size_t n = 256 << 10;
	unsigned char *src = registered(dev, 4 * n, 11), *out, *plain;
	void *d;

	OKD(wf_device_stream_create(dev, &s, &diag));
	OKD(wf_device_event_create(dev, 0, &e1, &diag));
	OKD(wf_device_event_create(dev, 0, &e2, &diag));
	OKD(wf_device_event_create(dev, 0, &e3, &diag));
	OKD(wf_device_mem_alloc(dev, 4 * n, &d, &diag));
	OKD(wf_device_pinned_alloc(dev, 4 * n, 0, (void **)&out, &diag));
	plain = malloc(n);
	cr_assert(plain);
	memset(plain, 0x5a, n);
	for (int i = 0; i < 4; i++) /* pageable, never injected */
		OKD(wf_device_memcpy_async(s, (char *)d + (size_t)i * n, plain, n,
		                           WF_DEVICE_COPY_H2D, &diag));
	OKD(wf_device_memset_async(s, d, 0, 4 * n, &diag));
	OKD(wf_device_stream_synchronize(s, &diag));

	OKD(wf_device_memcpy_async(s, d, src, n, WF_DEVICE_COPY_H2D, &diag)); /* 1 */
	cr_assert_eq(wf_device_memcpy_async(s, (char *)d + n, src + n, n, WF_DEVICE_COPY_H2D, &dg),
	             WF_EDEVICE, "copy 2 should fail when queued"); /* 2 */
	cr_assert(strstr(dg.msg, "fail=2"), "%s", dg.msg);
	OKD(wf_device_memcpy_async(s, (char *)d + 2 * n, src + 2 * n, n, WF_DEVICE_COPY_H2D,
	                           &diag)); /* 3 */
	OKD(wf_device_event_record(e1, s, &diag));
	/* 4: queued fine, fails when it runs. */
	OKD(wf_device_memcpy_async(s, (char *)d + 3 * n, src + 3 * n, n, WF_DEVICE_COPY_H2D,
	                           &diag));
	OKD(wf_device_event_record(e2, s, &diag));
	OKD(wf_device_event_record(e3, s, &diag));
	OKD(wf_device_event_synchronize(e1, &diag));
	wf_diag_clear(&dg);
	cr_assert_eq(wf_device_event_synchronize(e2, &dg), WF_EDEVICE, "copy 4 failed silently");
	cr_assert_str_not_empty(dg.msg);
	cr_assert_eq(wf_device_event_query(e2, NULL), WF_EDEVICE);
	OKD(wf_device_event_synchronize(e3, &diag)); /* reported once */
	OKD(wf_device_health(dev, &diag));

	OKD(wf_device_memcpy_async(s, out, d, 4 * n, WF_DEVICE_COPY_D2H, &diag));
	OKD(wf_device_stream_synchronize(s, &diag));
	cr_assert_eq(memcmp(out, src, n), 0, "copy 1");
	cr_assert(all_bytes(out + n, n, 0), "copy 2 wrote although it failed");
	cr_assert_eq(memcmp(out + 2 * n, src + 2 * n, n), 0, "copy 3");
	cr_assert(all_bytes(out + 3 * n, n, 0), "copy 4 wrote although it failed");
	OKD(wf_device_host_unregister(dev, src, &diag));
	wf_device_close(dev);
	munmap(src, 4 * n);
	free(plain);
}

/* bw=RATE: a copy from a registered range completes no earlier than size/RATE after it was
 * queued, and neither does the work behind it (a lower bound: no time window is asserted). */
Test(WFT_SUITE, bw_slows_registered_copies, .timeout = 60)
{
	struct wf_device *dev = open_spec(WFT_SPEC_WITH("bw=64Mi"));
	struct wf_device_stream *s;
	struct wf_device_event *e;
	const size_t n = 16 * MiB; /* 0.25 s at 64 MiB/s */
	const double slot = 0.25;
	unsigned char *src = registered(dev, n, 12);
	void *d;

	OKD(wf_device_stream_create(dev, &s, &diag));
	OKD(wf_device_event_create(dev, 0, &e, &diag));
	OKD(wf_device_mem_alloc(dev, n, &d, &diag));
	OKD(wf_device_stream_synchronize(s, &diag));
	double t0 = now_s();
	OKD(wf_device_memcpy_async(s, d, src, n, WF_DEVICE_COPY_H2D, &diag));
	OKD(wf_device_event_record(e, s, &diag));
	int q = wf_device_event_query(e, NULL);
	double t1 = now_s();
	if (q == 0)
		cr_assert_geq(t1 - t0, slot * 0.999, "done after %.3f s", t1 - t0);
	else
		cr_assert_eq(q, -EAGAIN);
	OKD(wf_device_event_synchronize(e, &diag));
	double t2 = now_s();
	cr_assert_geq(t2 - t0, slot * 0.999, "16 MiB at 64 MiB/s done after %.3f s", t2 - t0);
	uint64_t sum;
	OKD(wf_device_checksum(s, d, n, &sum, &diag));
	cr_assert_eq(sum, wf_device_checksum_host(src, n), "a slowed copy changed the bytes");
	OKD(wf_device_host_unregister(dev, src, &diag));
	wf_device_close(dev);
	munmap(src, n);
}

/* sticky=3: the third copy faults when it runs (CUDA: a real illegal address); the device is
 * lost for good: health says so, every call fails with WF_EDEVICE, and closing it returns. */
Test(WFT_SUITE, sticky_n_loses_the_device, .timeout = 60)
{
#ifdef WFT_DEVICE_CUDA
	if (getenv("WF_TEST_SANITIZER"))
		cr_skip_test("under compute-sanitizer: the injected illegal address would be "
		             "reported as an error");
#endif
	struct wf_device *dev = open_spec(WFT_SPEC_WITH("sticky=3"));
	struct wf_device_stream *s, *s2 = NULL;
	struct wf_device_event *e;
	struct wf_diag dg = {0};
	const size_t n = MiB;
	unsigned char *h;
	void *d, *p = NULL;

	OKD(wf_device_stream_create(dev, &s, &diag));
	OKD(wf_device_event_create(dev, 0, &e, &diag));
	OKD(wf_device_mem_alloc(dev, n, &d, &diag));
	OKD(wf_device_pinned_alloc(dev, n, 0, (void **)&h, &diag));
	OKD(wf_device_health(dev, &diag));
	OKD(wf_device_memcpy_async(s, d, h, n, WF_DEVICE_COPY_H2D, &diag)); /* 1 */
	OKD(wf_device_memcpy_async(s, h, d, n, WF_DEVICE_COPY_D2H, &diag)); /* 2 */
	OKD(wf_device_stream_synchronize(s, &diag));
	OKD(wf_device_health(dev, &diag));
	/* 3 faults when it runs: queueing it may still succeed (a kernel's fault is asynchronous).
	 */
	(void)wf_device_memcpy_async(s, d, h, n, WF_DEVICE_COPY_H2D, NULL);
	cr_assert_eq(wf_device_stream_synchronize(s, &dg), WF_EDEVICE, "%s", dg.msg);
	wf_diag_clear(&dg);
	cr_assert_eq(wf_device_health(dev, &dg), WF_EDEVICE);
	cr_assert_str_not_empty(dg.msg);
	cr_log_info("lost: %s", dg.msg);

	cr_assert_eq(wf_device_synchronize(dev, NULL), WF_EDEVICE);
	cr_assert_eq(wf_device_mem_info(dev, NULL, NULL, NULL), WF_EDEVICE);
	cr_assert_eq(wf_device_mem_alloc(dev, 4096, &p, NULL), WF_EDEVICE);
	cr_assert_null(p);
	cr_assert_eq(wf_device_memcpy_async(s, d, h, 4096, WF_DEVICE_COPY_H2D, NULL), WF_EDEVICE);
	cr_assert_eq(wf_device_memset_async(s, d, 0, 4096, NULL), WF_EDEVICE);
	cr_assert_eq(wf_device_event_record(e, s, NULL), WF_EDEVICE);
	cr_assert_eq(wf_device_event_synchronize(e, NULL), WF_EDEVICE);
	cr_assert_eq(wf_device_stream_create(dev, &s2, NULL), WF_EDEVICE);
	cr_assert_null(s2);
	cr_assert_eq(wf_device_health(dev, NULL), WF_EDEVICE, "once lost, always lost");
	wf_device_close(dev); /* returns: nothing waits on a lost device */
}
