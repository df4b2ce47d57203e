/* What the GPU suites of cuda/'s engine ops share: the CUDA device, a stream and an engine-ops
 * context built by hand around it (so one family of ops is tested without the others), and
 * buffers moved to and from the device. Each Criterion test opens its own (CUDA is not
 * fork-safe: nothing touches it in the runner's parent). */
#ifndef WFT_CUDA_GPUENV_H
#define WFT_CUDA_GPUENV_H

#include "base/error.h"
#include "cuda/attention.h"
#include "cuda/device_cuda.h"
#include "cuda/engine_ctx.h"
#include "cuda/matmul.h"
#include "cuda/moe.h"
#include "cuda/norm_rope.h"
#include "device/device.h"

#include <criterion/criterion.h>
#include <stdbool.h>
#include <string.h>

/* Asserts a call that takes `&diag` succeeded, printing the call and the diag. */
#define OKD(call_with_diag)                                                                        \
	do {                                                                                       \
		struct wf_diag diag = {0};                                                         \
		int r_ = (call_with_diag);                                                         \
		cr_assert_eq(r_, 0, "%s: %s", #call_with_diag, wf_diag_str(&diag, r_));            \
	} while (0)

struct wft_gpu {
	struct wf_device *dev;
	struct wf_device_stream *s;
	struct wf__cuda_engine_ctx c;
};

/* cuda:0, a stream, and a context with lim; with_mm: matmul.cu's workspace too. */
static inline void wft_gpu_open(struct wft_gpu *g, struct wf_engine_dev_limits lim, bool with_mm)
{
	memset(g, 0, sizeof(*g));
	cr_assert_eq(wf_device_backend_register(wf_cuda_device_ops()), 0);
	OKD(wf_device_open("cuda:0", &g->dev, &diag));
	OKD(wf_device_stream_create(g->dev, &g->s, &diag));
	g->c.dev = g->dev;
	g->c.wstream = g->s;
	g->c.stream = (cudaStream_t)wf_device_stream_native(g->s);
	cr_assert_not_null(g->c.stream);
	cr_assert_eq(cudaGetDevice(&g->c.device), cudaSuccess);
	cr_assert_eq(
	    cudaDeviceGetAttribute(&g->c.sm_count, cudaDevAttrMultiProcessorCount, g->c.device),
	    cudaSuccess);
	g->c.lim = lim;
	if (with_mm) {
		OKD(wf__cuda_mm_create(&g->c, &diag));
		cr_assert_not_null(g->c.mm);
	}
}

static inline void wft_gpu_close(struct wft_gpu *g)
{
	OKD(wf_device_stream_synchronize(g->s, &diag));
	wf__cuda_mm_destroy(g->c.mm);
	wf_device_stream_destroy(g->s);
	wf_device_close(g->dev);
}

static inline void *wft_gpu_alloc(struct wft_gpu *g, size_t size)
{
	void *d;
	OKD(wf_device_mem_alloc(g->dev, size, &d, &diag));
	return d;
}

/* A device copy of size bytes of h (queued on the stream). */
static inline void *wft_gpu_up(struct wft_gpu *g, const void *h, size_t size)
{
	void *d = wft_gpu_alloc(g, size);
	OKD(wf_device_memcpy_async(g->s, d, h, size, WF_DEVICE_COPY_H2D, &diag));
	return d;
}

/* size bytes of d into h, after the stream's work. */
static inline void wft_gpu_down(struct wft_gpu *g, void *h, const void *d, size_t size)
{
	OKD(wf_device_memcpy_async(g->s, h, d, size, WF_DEVICE_COPY_D2H, &diag));
	OKD(wf_device_stream_synchronize(g->s, &diag));
}

static inline void wft_gpu_free(struct wft_gpu *g, void *d)
{
	OKD(wf_device_mem_free(g->dev, d, &diag));
}

#endif
