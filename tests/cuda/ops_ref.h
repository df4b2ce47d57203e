/* Shared by the CUDA backend's tests (test_cuda_backend.c on a GPU, test_cuda_ops_host.c and
 * test_cuda_dequant.c on the CPU): random inputs, the error measures, the host backend as the
 * reference, and attention cases over a KV cache filled the way the engine fills it. */
#ifndef WF_TESTS_CUDA_OPS_REF_H
#define WF_TESTS_CUDA_OPS_REF_H

#include "base/error.h"
#include "kernels/backend.h"
#include "kernels/cpu_ops.h"
#include "kernels/ref.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct opsr_rng {
	uint64_t s;
};

static inline uint32_t opsr_u32(struct opsr_rng *r)
{
	r->s ^= r->s << 13;
	r->s ^= r->s >> 7;
	r->s ^= r->s << 17;
	return (uint32_t)(r->s >> 16);
}

/* Uniform in [-amp, amp). */
static inline float opsr_f(struct opsr_rng *r, float amp)
{
	return amp * ((float)(opsr_u32(r) & 0xffffff) / (float)(1 << 23) - 1.0f);
}

static inline void opsr_fill(struct opsr_rng *r, float *x, size_t n, float amp)
{
	for (size_t i = 0; i < n; i++)
		x[i] = opsr_f(r, amp);
}

/* Normalized mean squared error of got against want: sum (g - w)^2 / sum w^2; NaN where one is
 * NaN and the other is not counts as infinitely wrong, NaN in both as equal. */
static inline double opsr_nmse(const float *got, const float *want, size_t n)
{
	double num = 0.0, den = 0.0;
	for (size_t i = 0; i < n; i++) {
		if (isnan(got[i]) && isnan(want[i]))
			continue;
		const double d = (double)got[i] - (double)want[i];
		num += isnan(d) ? INFINITY : d * d;
		den += (double)want[i] * (double)want[i];
	}
	return den > 0.0 ? num / den : num;
}

static inline double opsr_max_abs(const float *got, const float *want, size_t n)
{
	double m = 0.0;
	for (size_t i = 0; i < n; i++) {
		if (isnan(got[i]) && isnan(want[i]))
			continue;
		const double d = fabs((double)got[i] - (double)want[i]);
		if (!(d <= m)) /* NaN counts as infinitely wrong */
			m = isnan(d) ? INFINITY : d;
	}
	return m;
}

static inline double opsr_rms(const float *x, size_t n)
{
	double s = 0.0;
	for (size_t i = 0; i < n; i++)
		s += isnan(x[i]) ? 0.0 : (double)x[i] * x[i];
	return n ? sqrt(s / (double)n) : 0.0;
}

#define OPSR_OK(call_with_diag)                                                                    \
	do {                                                                                       \
		struct wf_diag diag = {{0}};                                                       \
		int r_ = (call_with_diag);                                                         \
		cr_assert_eq(r_, 0, "%s: %s", #call_with_diag, wf_diag_str(&diag, r_));            \
	} while (0)

/* A host-backend context (the reference) with lim; n_threads from lim (0: 1). */
static inline struct wf_backend_ctx *opsr_host_ctx(struct wf_backend_limits lim)
{
	struct wf_backend_ctx *c = NULL;
	OPSR_OK(wf_backend_host()->ctx_create(NULL, NULL, &lim, &c, &diag));
	return c;
}

/* An attention case: n tokens, each reading its own window of one layer's cache (rows of
 * n_head_kv * head_dim elements). */
struct opsr_att {
	uint32_t n, n_head, n_head_kv, head_dim, rows;
	enum wf_backend_kv type;
	float scale;
	float *q;         /* n * n_head * head_dim */
	uint8_t *kc, *vc; /* rows * row elements of the cache type */
	uint32_t *kv_first, *n_kv;
};

static inline size_t opsr_att_row(const struct opsr_att *a)
{
	return (size_t)a->n_head_kv * a->head_dim;
}

static inline size_t opsr_att_elem(const struct opsr_att *a)
{
	return a->type == WF_BACKEND_KV_F16 ? 2 : 4;
}

/* The CPU's attention (kernels/cpu_ops.c, what the host backend runs) over the case's cache
 * bytes, whoever wrote them: out, as the op lays it. */
static inline void opsr_att_ref(const struct opsr_att *a, float *out)
{
	const size_t row = opsr_att_row(a), elem = opsr_att_elem(a);
	const uint32_t group = a->n_head / a->n_head_kv;
	uint32_t most = 0;
	for (uint32_t t = 0; t < a->n; t++)
		most = a->n_kv[t] > most ? a->n_kv[t] : most;
	float *scratch = malloc(sizeof(float) * (most + 2 * a->head_dim + 16));
	for (uint32_t t = 0; t < a->n; t++) {
		for (uint32_t h = 0; h < a->n_head; h++) {
			const size_t off =
			    ((size_t)a->kv_first[t] * row + (size_t)(h / group) * a->head_dim) *
			    elem;
			const size_t qo = ((size_t)t * a->n_head + h) * a->head_dim;
			wf_cpu_attend(a->q + qo, a->kc + off, a->vc + off, row * elem, a->n_kv[t],
			              a->head_dim, a->scale, a->type, scratch, out + qo);
		}
	}
	free(scratch);
}

/* Random queries (amplitude qamp: the spread of the scores, a flat or peaked softmax), a cache of
 * rows positions written through the CPU's conversion, and token t's window: n_kv[t] positions
 * from a random first row, or causal (first 0). */
static inline void opsr_att_make(struct opsr_att *a, struct opsr_rng *r, const uint32_t *n_kv,
                                 float qamp, bool from_zero)
{
	const size_t row = opsr_att_row(a), elem = opsr_att_elem(a);
	a->q = malloc(sizeof(float) * a->n * a->n_head * a->head_dim);
	a->kc = malloc(a->rows * row * elem);
	a->vc = malloc(a->rows * row * elem);
	a->kv_first = malloc(sizeof(uint32_t) * a->n);
	a->n_kv = malloc(sizeof(uint32_t) * a->n);
	opsr_fill(r, a->q, (size_t)a->n * a->n_head * a->head_dim, qamp);
	for (size_t i = 0; i < a->rows * row; i++) {
		const float k = opsr_f(r, 1.0f), v = opsr_f(r, 1.0f);
		if (a->type == WF_BACKEND_KV_F16) {
			((uint16_t *)a->kc)[i] = wf_kernels_fp32_to_fp16(k);
			((uint16_t *)a->vc)[i] = wf_kernels_fp32_to_fp16(v);
		} else {
			((float *)a->kc)[i] = k;
			((float *)a->vc)[i] = v;
		}
	}
	for (uint32_t t = 0; t < a->n; t++) {
		a->n_kv[t] = n_kv[t];
		a->kv_first[t] =
		    from_zero || n_kv[t] >= a->rows ? 0 : opsr_u32(r) % (a->rows - n_kv[t] + 1);
	}
	a->scale = 1.0f / sqrtf((float)a->head_dim);
}

static inline void opsr_att_free(struct opsr_att *a)
{
	free(a->q);
	free(a->kc);
	free(a->vc);
	free(a->kv_first);
	free(a->n_kv);
}

#endif
