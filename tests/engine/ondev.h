/* The engine suites on a device. tests/cuda compiles test_engine_ref.c and test_postfetch.c a
 * second time with WFT_ENGINE_DEVICE defined to a device spec ("cuda:0"): every engine the suite
 * builds then runs the device forward pass there, and the suite's bitwise promises become the
 * reference tolerance (the README's criteria for quantized models: at most 2 positions above
 * 0.5, none above 1.5, RMS <= 0.1, and the argmax equal where the top-2 gap exceeds 0.5),
 * because the CUDA kernels compute in other precisions than the CPU's. */
#ifndef WFT_ENGINE_ONDEV_H
#define WFT_ENGINE_ONDEV_H

#include "device/device.h"
#include "engine/engine.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#ifdef WFT_ENGINE_DEVICE
#ifdef WF_HAVE_CUDA
#include "cuda/backend.h"
#include "cuda/device_cuda.h"
#endif

/* The device every engine of this process runs on, opened at the first call. */
static inline struct wf_device *wft_engine_device(void)
{
	static struct wf_device *dev;
	if (!dev) {
#ifdef WF_HAVE_CUDA
		wf_device_backend_register(wf_cuda_device_ops());
		wf_cuda_backend_register();
#endif
		struct wf_diag d = {{0}};
		int rc = wf_device_open(WFT_ENGINE_DEVICE, &dev, &d);
		cr_assert_eq(rc, 0, "%s: %s", WFT_ENGINE_DEVICE, wf_diag_str(&d, rc));
	}
	return dev;
}
#else
static inline struct wf_device *wft_engine_device(void)
{
	return NULL;
}
#endif

/* cfg with the suite's device applied (unchanged without one). */
static inline struct wf_engine_config wft_on_device(struct wf_engine_config cfg)
{
	if (wft_engine_device()) {
		cfg.device = wft_engine_device();
		cfg.dense_on_device = true;
	}
	return cfg;
}

static inline uint32_t wft_argmax(const float *row, size_t n)
{
	size_t best = 0;
	for (size_t i = 1; i < n; i++)
		if (row[i] > row[best])
			best = i;
	return (uint32_t)best;
}

/* The README's measures of rows x n logits of got against want: the largest difference, the
 * RMS difference, the rows whose largest difference exceeds 0.5, and the rows whose argmax
 * changed where want's top-2 gap exceeds 0.5. A non-finite logit counts as infinitely off. */
struct wft_criteria {
	float max_abs;
	double rms;
	size_t rows_over, argmax_bad;
};

static inline struct wft_criteria wft_measure(const float *want, const float *got, size_t rows,
                                              size_t n)
{
	struct wft_criteria c = {0};
	double sq = 0;
	for (size_t r = 0; r < rows; r++) {
		const float *w = want + r * n, *g = got + r * n;
		float pm = 0, top1 = -INFINITY, top2 = -INFINITY;
		for (size_t i = 0; i < n; i++) {
			const float dd = isfinite(g[i]) ? fabsf(w[i] - g[i]) : INFINITY;
			pm = dd > pm ? dd : pm;
			sq += (double)dd * dd;
			if (w[i] > top1) {
				top2 = top1;
				top1 = w[i];
			} else if (w[i] > top2) {
				top2 = w[i];
			}
		}
		c.rows_over += pm > 0.5f;
		c.max_abs = pm > c.max_abs ? pm : c.max_abs;
		c.argmax_bad += top1 - top2 > 0.5f && wft_argmax(g, n) != wft_argmax(w, n);
	}
	c.rms = sqrt(sq / ((double)rows * n));
	return c;
}

/* rows x n logits of got against want: bit for bit on the CPU, the reference tolerance on a
 * device. Writes what differs to why. */
static inline bool wft_rows_match(const float *want, const float *got, size_t rows, size_t n,
                                  char *why, size_t why_len)
{
	if (!wft_engine_device()) {
		if (memcmp(want, got, rows * n * sizeof(float)) == 0)
			return true;
		snprintf(why, why_len, "not bit for bit");
		return false;
	}
	const struct wft_criteria c = wft_measure(want, got, rows, n);
	snprintf(why, why_len, "max-abs %.4f, rms %.4f, %zu rows above 0.5, %zu argmax changes",
	         c.max_abs, c.rms, c.rows_over, c.argmax_bad);
	return c.rows_over <= 2 && c.max_abs <= 1.5f && c.rms <= 0.1 && c.argmax_bad == 0;
}

#endif
