/* The device contract: what every backend promises, tested through the public interface only.
 *
 * Compiled twice: as test_device_contract_host (label unit) against the host backend, and with
 * WFT_DEVICE_CUDA as test_cuda_contract (label gpu) against cuda:0, whose main() exits 77 when
 * there is no GPU. Timing-dependent checks (pending states, throttle) live in host.c, where the
 * host backend's bw option makes them deterministic. */
#include "base/error.h"
#include "device/device.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifdef WFT_DEVICE_CUDA
#include "cuda/device_cuda.h"
#define WFT_SPEC  "cuda:0"
#define WFT_KIND  WF_DEVICE_KIND_CUDA
#define WFT_SUITE cuda_contract
/* cudaMemGetInfo sees other processes and the driver's 2 MiB granularity. */
#define WFT_MEM_SLACK ((size_t)64 << 20)
#else
#define WFT_SPEC      "host:mem=1Gi"
#define WFT_KIND      WF_DEVICE_KIND_HOST
#define WFT_SUITE     host_contract
#define WFT_MEM_SLACK ((size_t)0)
#endif

#define MiB ((size_t)1 << 20)

static struct wf_device *open_dev(void)
{
	struct wf_diag diag = {0};
	struct wf_device *dev = NULL;
	int ret;

#ifdef WFT_DEVICE_CUDA
	cr_assert_eq(wf_device_backend_register(wf_cuda_device_ops()), 0);
#endif
	ret = wf_device_open(WFT_SPEC, &dev, &diag);
	cr_assert_eq(ret, 0, "open %s: %s", WFT_SPEC, wf_diag_str(&diag, ret));
	return dev;
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
