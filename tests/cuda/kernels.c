/* CUDA specifics: the checksum kernel against the host function over sizes and alignments that
 * exercise the tail word, the unaligned path and the grid-stride loop; and link throughput. */
#include "base/error.h"
#include "cuda/device_cuda.h"
#include "device/device.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MiB ((size_t)1 << 20)

#define OKD(call_with_diag)                                                                        \
	do {                                                                                       \
		struct wf_diag diag = {0};                                                         \
		int r_ = (call_with_diag);                                                         \
		cr_assert_eq(r_, 0, "%s: %s", #call_with_diag, wf_diag_str(&diag, r_));            \
	} while (0)

static struct wf_device *open_cuda(void)
{
	struct wf_diag diag = {0};
	struct wf_device *dev = NULL;

	cr_assert_eq(wf_device_backend_register(wf_cuda_device_ops()), 0);
	int ret = wf_device_open("cuda:0", &dev, &diag);
	cr_assert_eq(ret, 0, "%s", wf_diag_str(&diag, ret));
	return dev;
}

static void fill_random(unsigned char *b, size_t n, uint64_t seed)
{
	uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
	for (size_t i = 0; i < n; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		b[i] = (unsigned char)(x >> 24);
	}
}

Test(cuda_kernels, checksum_matches_host, .timeout = 120)
{
	struct wf_device *dev = open_cuda();
	struct wf_device_stream *s;
	size_t cap = 256 * MiB + 64;
	unsigned char *h;
	void *d;

	OKD(wf_device_stream_create(dev, &s, &diag));
	OKD(wf_device_mem_alloc(dev, cap, &d, &diag));
	OKD(wf_device_pinned_alloc(dev, cap, 0, (void **)&h, &diag));
	fill_random(h, cap, 42);
	OKD(wf_device_memcpy_async(s, d, h, cap, WF_DEVICE_COPY_H2D, &diag));
	static const size_t sizes[] = {
	    1, 7, 8, 9, 255, 256, 257, 4095, 65536 + 3, 1 << 20, (64u << 20) + 5, 256u << 20};
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		for (size_t off = 0; off < 8; off++) {
			uint64_t sum;
			if (sizes[i] > (1 << 20) && off % 4)
				continue; /* big sizes: a few offsets are enough */
			OKD(wf_device_checksum(s, (char *)d + off, sizes[i], &sum, &diag));
			cr_assert_eq(sum, wf_device_checksum_host(h + off, sizes[i]),
			             "size %zu offset %zu", sizes[i], off);
		}
	}
	wf_device_close(dev);
}

/* A corrupted device byte shows in the checksum. */
Test(cuda_kernels, checksum_detects_corruption, .timeout = 60)
{
	struct wf_device *dev = open_cuda();
	struct wf_device_stream *s;
	size_t n = 16 * MiB;
	unsigned char *h;
	uint64_t a, b;
	void *d;

	OKD(wf_device_stream_create(dev, &s, &diag));
	OKD(wf_device_mem_alloc(dev, n, &d, &diag));
	OKD(wf_device_pinned_alloc(dev, n, 0, (void **)&h, &diag));
	fill_random(h, n, 7);
	OKD(wf_device_memcpy_async(s, d, h, n, WF_DEVICE_COPY_H2D, &diag));
	OKD(wf_device_checksum(s, d, n, &a, &diag));
	OKD(wf_device_memset_async(s, (char *)d + n / 3, h[n / 3] ^ 1, 1, &diag));
	OKD(wf_device_checksum(s, d, n, &b, &diag));
	cr_assert_neq(a, b);
	wf_device_close(dev);
}

/* H2D from pinned memory: at least PCIe gen3 x16-ish territory on any data-centre GPU; prints
 * the measured rate so the log carries the number. */
Test(cuda_kernels, h2d_throughput, .timeout = 120)
{
	struct wf_device *dev = open_cuda();
	struct wf_device_stream *s;
	struct wf_device_event *t0, *t1;
	size_t n = 1024 * MiB;
	void *d, *h;
	double ms;

	OKD(wf_device_stream_create(dev, &s, &diag));
	OKD(wf_device_event_create(dev, WF_DEVICE_EVENT_TIMING, &t0, &diag));
	OKD(wf_device_event_create(dev, WF_DEVICE_EVENT_TIMING, &t1, &diag));
	OKD(wf_device_mem_alloc(dev, n, &d, &diag));
	OKD(wf_device_pinned_alloc(dev, n, 0, &h, &diag));
	memset(h, 1, n);
	/* Warm-up, then three timed copies. */
	OKD(wf_device_memcpy_async(s, d, h, n, WF_DEVICE_COPY_H2D, &diag));
	OKD(wf_device_event_record(t0, s, &diag));
	for (int i = 0; i < 3; i++)
		OKD(wf_device_memcpy_async(s, d, h, n, WF_DEVICE_COPY_H2D, &diag));
	OKD(wf_device_event_record(t1, s, &diag));
	OKD(wf_device_event_synchronize(t1, &diag));
	OKD(wf_device_event_elapsed_ms(t0, t1, &ms, &diag));
	double gbs = 3.0 * (double)n / (ms / 1e3) / 1e9;
	fprintf(stderr, "%s: pinned H2D %.2f GB/s\n", wf_device_name(dev), gbs);
	cr_assert_gt(gbs, 5.0, "pinned H2D only %.2f GB/s", gbs);

	/* Checksum kernel rate, for the log. */
	OKD(wf_device_event_record(t0, s, &diag));
	uint64_t sum;
	OKD(wf_device_checksum(s, d, n, &sum, &diag));
	OKD(wf_device_event_record(t1, s, &diag));
	OKD(wf_device_event_synchronize(t1, &diag));
	OKD(wf_device_event_elapsed_ms(t0, t1, &ms, &diag));
	fprintf(stderr, "%s: checksum kernel %.1f GB/s\n", wf_device_name(dev),
	        (double)n / (ms / 1e3) / 1e9);
	wf_device_close(dev);
}
