/* What the GPU suites of the CUDA backend share: cuda:0, a stream, a backend context made by the
 * real table (wf_cuda_backend()->ctx_create), and buffers moved to and from the device. Each
 * Criterion test opens its own (CUDA is not fork-safe: nothing touches it in the runner's
 * parent). */
#ifndef WFT_CUDA_GPUENV_H
#define WFT_CUDA_GPUENV_H

#include "base/error.h"
#include "cuda/backend.h"
#include "cuda/device_cuda.h"
#include "device/device.h"

#include <criterion/criterion.h>
#include <stdbool.h>
#include <string.h>

/* Asserts a call that takes `&diag` succeeded, printing the call and the diag. */
#define OKD(call_with_diag)                                                                        \
	do {                                                                                       \
		struct wf_diag diag = {{0}};                                                       \
		int r_ = (call_with_diag);                                                         \
		cr_assert_eq(r_, 0, "%s: %s", #call_with_diag, wf_diag_str(&diag, r_));            \
	} while (0)

struct wft_gpu {
	struct wf_device *dev;
	struct wf_device_stream *s;
	const struct wf_backend_ops *ops;
	struct wf_backend_ctx *c; /* NULL until wft_gpu_ctx */
};

/* cuda:0 and a stream. */
static inline void wft_gpu_open(struct wft_gpu *g)
{
	memset(g, 0, sizeof(*g));
	cr_assert_eq(wf_device_backend_register(wf_cuda_device_ops()), 0);
	cr_assert_eq(wf_cuda_backend_register(), 0);
	g->ops = wf_cuda_backend();
	cr_assert_eq(wf_backend_for_kind(WF_DEVICE_KIND_CUDA), g->ops);
	OKD(wf_device_open("cuda:0", &g->dev, &diag));
	OKD(wf_device_stream_create(g->dev, &g->s, &diag));
}

/* A backend context on the stream with lim. */
static inline void wft_gpu_ctx(struct wft_gpu *g, struct wf_backend_limits lim)
{
	OKD(g->ops->ctx_create(g->dev, g->s, &lim, &g->c, &diag));
	cr_assert_not_null(g->c);
}

static inline void wft_gpu_close(struct wft_gpu *g)
{
	OKD(wf_device_stream_synchronize(g->s, &diag));
	g->ops->ctx_destroy(g->c);
	wf_device_stream_destroy(g->s);
	wf_device_close(g->dev);
}

static inline void *wft_gpu_alloc(struct wft_gpu *g, size_t size)
{
	void *d;
	OKD(wf_device_mem_alloc(g->dev, size ? size : 1, &d, &diag));
	return d;
}

/* A device copy of size bytes of h (queued on the stream). */
static inline void *wft_gpu_up(struct wft_gpu *g, const void *h, size_t size)
{
	void *d = wft_gpu_alloc(g, size);
	if (size)
		OKD(wf_device_memcpy_async(g->s, d, h, size, WF_DEVICE_COPY_H2D, &diag));
	return d;
}

/* size bytes of d into h, after the stream's work. */
static inline void wft_gpu_down(struct wft_gpu *g, void *h, const void *d, size_t size)
{
	if (size)
		OKD(wf_device_memcpy_async(g->s, h, d, size, WF_DEVICE_COPY_D2H, &diag));
	OKD(wf_device_stream_synchronize(g->s, &diag));
}

static inline void wft_gpu_free(struct wft_gpu *g, void *d)
{
	OKD(wf_device_mem_free(g->dev, d, &diag));
}

#endif
