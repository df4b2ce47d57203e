/* The CPU's non-matmul numerics (kernels/cpu_ops.h), written to compute what ggml's CPU ops compute
 * (llama.cpp b10573, ggml/src/ggml-cpu/ops.cpp and vec.h), in the same order where the order shows
 * in the result: sums of squares and softmax sums in double, RoPE angles by repeated float
 * multiplication, the flash-attention accumulator rounded to F16 after every step. */
#include "kernels/cpu_ops.h"

#include "kernels/cpu_scalar.h"
#include "kernels/ref.h"

#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

void wf_cpu_rms_norm(const float *x, const float *w, float *y, uint32_t n, float eps)
{
	double sum = 0.0;
	for (uint32_t i = 0; i < n; i++)
		sum += (double)(x[i] * x[i]);
	const float mean = (float)(sum / n);
	const float scale = 1.0f / sqrtf(mean + eps);
	if (w) {
		for (uint32_t i = 0; i < n; i++)
			y[i] = (x[i] * scale) * w[i];
	} else {
		for (uint32_t i = 0; i < n; i++)
			y[i] = x[i] * scale;
	}
}

void wf_cpu_rope_angles(uint32_t pos, uint32_t n_dims, float base, float *cs)
{
	const float theta_scale = powf(base, -2.0f / (float)n_dims);
	float theta = (float)pos;
	for (uint32_t i0 = 0; i0 < n_dims; i0 += 2) {
		cs[i0] = cosf(theta);
		cs[i0 + 1] = sinf(theta);
		theta *= theta_scale;
	}
}

void wf_cpu_rope(float *x, uint32_t n_dims, const float *cs, enum wf_backend_rope kind)
{
	wf__cpu_rope_rotate(x, n_dims, cs, kind == WF_BACKEND_ROPE_NEOX);
}

void wf__cpu_rope_ref(float *x, uint32_t n_dims, const float *cs, bool neox)
{
	wf__cpu_rope_rotate(x, n_dims, cs, neox);
}

void wf_cpu_softmax(float *x, uint32_t n)
{
	float max = -INFINITY;
	for (uint32_t i = 0; i < n; i++)
		max = x[i] > max ? x[i] : max;
	/* ggml_vec_soft_max_f32 of the AVX2 build: ggml_v_expf eight at a time, each eight summed
	 * in float in hsum order, the sums in double; the tail with expf */
	double sum = 0.0;
	uint32_t i = 0;
	for (; i + 8 <= n; i += 8) {
		float l[8];
		for (int j = 0; j < 8; j++)
			l[j] = x[i + j] = wf__cpu_v_expf(x[i + j] - max);
		sum += (double)(((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7])));
	}
	for (; i < n; i++) {
		const float v = expf(x[i] - max);
		sum += (double)v;
		x[i] = v;
	}
	const float inv = (float)(1.0 / sum);
	for (i = 0; i < n; i++)
		x[i] *= inv;
}

void wf_cpu_route(const float *logits, uint32_t n_expert, uint32_t k, float *probs,
                  int32_t *ret_ids, float *ret_weights)
{
	memcpy(probs, logits, n_expert * sizeof(float));
	wf_cpu_softmax(probs, n_expert);
	wf_cpu_route_top(probs, n_expert, k, ret_ids, ret_weights);
}

void wf_cpu_route_top(const float *probs, uint32_t n_expert, uint32_t k, int32_t *ret_ids,
                      float *ret_weights)
{
	/* Top k by selection: k is small (2..8) and the order is descending probability, ties to
	 * the lower expert id, which is what a stable descending argsort gives. */
	for (uint32_t j = 0; j < k; j++) {
		int32_t best = -1;
		for (uint32_t e = 0; e < n_expert; e++) {
			bool taken = false;
			for (uint32_t t = 0; t < j; t++)
				taken |= ret_ids[t] == (int32_t)e;
			if (!taken && (best < 0 || probs[e] > probs[best]))
				best = (int32_t)e;
		}
		ret_ids[j] = best;
		ret_weights[j] = probs[best];
	}
	double sum = 0.0;
	for (uint32_t j = 0; j < k; j++)
		sum += (double)ret_weights[j];
	float fsum = (float)sum;
	if (fsum < 6.103515625e-5f)
		fsum = 6.103515625e-5f;
	for (uint32_t j = 0; j < k; j++)
		ret_weights[j] /= fsum;
}

void wf_cpu_swiglu(const float *g, const float *u, float *y, uint32_t n)
{
	/* ggml_vec_swiglu_f32 of the AVX2 build: ggml_v_silu (ggml_v_expf) eight at a time, the
	 * tail with expf */
	uint32_t i = 0;
	for (; i + 8 <= n; i += 8)
		for (int j = 0; j < 8; j++)
			y[i + j] = g[i + j] / (1.0f + wf__cpu_v_expf(0.0f - g[i + j])) * u[i + j];
	for (; i < n; i++)
		y[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

static inline float h2f(uint16_t h)
{
	return wf_kernels_fp16_to_fp32(h);
}

static inline uint16_t f2h(float f)
{
	return wf_kernels_fp32_to_fp16(f);
}

/* The F16 flash-attention step, portable and with F16C/AVX2/FMA. Both compute the same floats:
 * the query-key dot in eight lanes (lane i % 8, fused multiply-add) reduced in one fixed order,
 * then the tail; the accumulator update as one fused multiply-add rounded to F16. */
struct f16_state {
	float M, S;
};

static float dot_h_lanes(const uint16_t *k, const float *qh, uint32_t n)
{
	float l[8] = {0};
	uint32_t i = 0;
	for (; i + 8 <= n; i += 8)
		for (int j = 0; j < 8; j++)
			l[j] = fmaf(h2f(k[i + j]), qh[i + j], l[j]);
	float s = ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
	for (; i < n; i++)
		s += h2f(k[i]) * qh[i];
	return s;
}

static void scale_h_portable(uint16_t *acc, uint32_t D, float ms)
{
	for (uint32_t i = 0; i < D; i++)
		acc[i] = f2h(h2f(acc[i]) * ms);
}

static void mad_h_portable(uint16_t *acc, const uint16_t *vp, uint32_t D, float vs)
{
	for (uint32_t i = 0; i < D; i++)
		acc[i] = f2h(fmaf(h2f(vp[i]), vs, h2f(acc[i])));
}

/* The three vector steps of the F16 flash-attention loop, portable or F16C. */
struct f16_ops {
	float (*dot)(const uint16_t *k, const float *qh, uint32_t n);
	void (*scale)(uint16_t *acc, uint32_t D, float ms);
	void (*mad)(uint16_t *acc, const uint16_t *vp, uint32_t D, float vs);
};

static const struct f16_ops f16_portable = {dot_h_lanes, scale_h_portable, mad_h_portable};

/* llama.cpp's one-chunk flash-attention step per cached position: the score, then either a new
 * maximum (rescale the accumulator) or a weight below one, then the V row added. */
static void attend_f16(const struct f16_ops *ops, const float *qh, const uint8_t *k,
                       const uint8_t *v, size_t kv_stride, uint32_t n_kv, uint32_t D, float scale,
                       uint16_t *acc, struct f16_state *st)
{
	for (uint32_t p = 0; p < n_kv; p++) {
		const uint16_t *kp = (const uint16_t *)(k + p * kv_stride);
		const uint16_t *vp = (const uint16_t *)(v + p * kv_stride);
		const float s = ops->dot(kp, qh, D) * scale;
		float ms = 1.0f, vs = 1.0f;
		if (s > st->M) {
			const float m_old = st->M;
			st->M = s;
			ms = expf(m_old - st->M);
			ops->scale(acc, D, ms);
		} else {
			vs = expf(s - st->M);
		}
		ops->mad(acc, vp, D, vs);
		st->S = st->S * ms + vs;
	}
}

#if defined(__x86_64__)
#include <immintrin.h>

#define F16C_FNS __attribute__((target("avx2,fma,f16c")))

F16C_FNS static float dot_h_lanes_f16c(const uint16_t *k, const float *qh, uint32_t n)
{
	__m256 l = _mm256_setzero_ps();
	uint32_t i = 0;
	for (; i + 8 <= n; i += 8)
		l = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k + i))),
		                    _mm256_loadu_ps(qh + i), l);
	__m128 x = _mm_add_ps(_mm256_castps256_ps128(l), _mm256_extractf128_ps(l, 1));
	x = _mm_add_ps(x, _mm_movehl_ps(x, x)); /* (l0+l4)+(l2+l6), (l1+l5)+(l3+l7) */
	x = _mm_add_ss(x, _mm_movehdup_ps(x));
	float s = _mm_cvtss_f32(x);
	for (; i < n; i++)
		s += h2f(k[i]) * qh[i];
	return s;
}

F16C_FNS static void scale_h(uint16_t *acc, uint32_t D, float ms)
{
	uint32_t i = 0;
	const __m256 m = _mm256_set1_ps(ms);
	for (; i + 8 <= D; i += 8) {
		__m256 a = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(acc + i)));
		_mm_storeu_si128((__m128i *)(acc + i),
		                 _mm256_cvtps_ph(_mm256_mul_ps(a, m), _MM_FROUND_TO_NEAREST_INT));
	}
	for (; i < D; i++)
		acc[i] = f2h(h2f(acc[i]) * ms);
}

F16C_FNS static void mad_h(uint16_t *acc, const uint16_t *vp, uint32_t D, float vs)
{
	uint32_t i = 0;
	const __m256 m = _mm256_set1_ps(vs);
	for (; i + 8 <= D; i += 8) {
		__m256 a = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(acc + i)));
		__m256 x = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(vp + i)));
		_mm_storeu_si128((__m128i *)(acc + i), _mm256_cvtps_ph(_mm256_fmadd_ps(x, m, a),
		                                                       _MM_FROUND_TO_NEAREST_INT));
	}
	for (; i < D; i++)
		acc[i] = f2h(fmaf(h2f(vp[i]), vs, h2f(acc[i])));
}

static const struct f16_ops f16_f16c = {dot_h_lanes_f16c, scale_h, mad_h};

/* Asked by every thread of the pool: an atomic (relaxed: every thread computes the same answer),
 * so the first callers may each compute it once. */
static bool have_f16c(void)
{
	static _Atomic int cached = -1;
	int c = atomic_load_explicit(&cached, memory_order_relaxed);
	if (c < 0) {
		c = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
		    __builtin_cpu_supports("f16c");
		atomic_store_explicit(&cached, c, memory_order_relaxed);
	}
	return c;
}
#endif

void wf_cpu_attend(const float *q, const uint8_t *k, const uint8_t *v, size_t kv_stride,
                   uint32_t n_kv, uint32_t head_dim, float scale, enum wf_backend_kv type,
                   float *scratch, float *out)
{
	if (type == WF_BACKEND_KV_F16) {
		/* scratch: the query rounded to F16 (as floats), then the accumulator's F16 bits */
		float *qh = scratch;
		uint16_t *acc = (uint16_t *)(scratch + head_dim);
		for (uint32_t i = 0; i < head_dim; i++) {
			qh[i] = h2f(f2h(q[i]));
			acc[i] = 0;
		}
		struct f16_state st = {-INFINITY, 0.0f};
#if defined(__x86_64__)
		const struct f16_ops *ops = have_f16c() ? &f16_f16c : &f16_portable;
#else
		const struct f16_ops *ops = &f16_portable;
#endif
		attend_f16(ops, qh, k, v, kv_stride, n_kv, head_dim, scale, acc, &st);
		const float inv = st.S == 0.0f ? 0.0f : 1.0f / st.S;
		for (uint32_t i = 0; i < head_dim; i++)
			out[i] = h2f(acc[i]) * inv;
		return;
	}
	/* F32 cache: scores, softmax, weighted sum (ggml's non-flash path). */
	float max = -INFINITY;
	float *sc = scratch; /* n_kv scores: the caller sizes scratch for it */
	for (uint32_t p = 0; p < n_kv; p++) {
		const float *kp = (const float *)(k + p * kv_stride);
		float s = 0.0f;
		for (uint32_t i = 0; i < head_dim; i++)
			s += kp[i] * q[i];
		sc[p] = s * scale;
		max = sc[p] > max ? sc[p] : max;
	}
	double sum = 0.0;
	for (uint32_t p = 0; p < n_kv; p++) {
		sc[p] = expf(sc[p] - max);
		sum += sc[p];
	}
	const float inv = (float)(1.0 / sum);
	memset(out, 0, head_dim * sizeof(float));
	for (uint32_t p = 0; p < n_kv; p++) {
		const float *vp = (const float *)(v + p * kv_stride);
		const float w = sc[p] * inv;
		for (uint32_t i = 0; i < head_dim; i++)
			out[i] += vp[i] * w;
	}
}

void wf_cpu_attend_tiled(const float *q, const uint8_t *k, const uint8_t *v, size_t kv_stride,
                         uint32_t n_kv, uint32_t head_dim, float scale, float *scratch, float *out)
{
	enum { KV_TILE = WF_CPU_FA_TILE };
	float kq[KV_TILE];
	float *acc = scratch; /* VKQ32: head_dim floats */
	float M = -INFINITY, S = 0.0f;

	memset(acc, 0, head_dim * sizeof(float));
	for (uint32_t ic = 0; ic < n_kv; ic += KV_TILE) {
		const uint32_t nt = n_kv - ic < KV_TILE ? n_kv - ic : KV_TILE;
		/* simd_gemm: one fused multiply-add chain per score over the head, from 0; then
		 * ggml_vec_scale_f32; the causal mask's -inf where the tile runs past the query */
		for (uint32_t tk = 0; tk < KV_TILE; tk++) {
			if (tk >= nt) {
				kq[tk] = -INFINITY;
				continue;
			}
			const uint16_t *kp = (const uint16_t *)(k + (size_t)(ic + tk) * kv_stride);
			float s = 0.0f;
			for (uint32_t d = 0; d < head_dim; d++)
				s = fmaf(h2f(kp[d]), q[d], s);
			kq[tk] = s * scale;
		}
		float tile_max = -INFINITY;
		for (uint32_t tk = 0; tk < KV_TILE; tk++)
			tile_max = tile_max > kq[tk] ? tile_max : kq[tk];
		if (tile_max == -INFINITY)
			continue;
		const float m_new = fmaxf(M, tile_max);
		if (m_new > M) {
			const float ms = expf(M - m_new);
			for (uint32_t d = 0; d < head_dim; d++)
				acc[d] *= ms;
			S *= ms;
		}
		M = m_new;
		/* ggml_vec_soft_max_f32 (AVX2): eight lanes at a time, each eight summed in the
		 * hsum order (lanes i and i + 4, then pairs), the sums added in double */
		double sum = 0.0;
		for (uint32_t g = 0; g < KV_TILE; g += 8) {
			float l[8];
			for (int i = 0; i < 8; i++)
				l[i] = kq[g + i] = wf__cpu_v_expf(kq[g + i] - m_new);
			const float a0 = l[0] + l[4], a1 = l[1] + l[5], a2 = l[2] + l[6],
			            a3 = l[3] + l[7];
			sum += (double)((a0 + a2) + (a1 + a3));
		}
		S = (float)((double)S + sum);
		/* simd_gemm of the probabilities by V: a fused multiply-add per position, in order
		 * (masked positions add 0 * V, nothing) */
		for (uint32_t tk = 0; tk < nt; tk++) {
			const uint16_t *vp = (const uint16_t *)(v + (size_t)(ic + tk) * kv_stride);
			for (uint32_t d = 0; d < head_dim; d++)
				acc[d] = fmaf(h2f(vp[d]), kq[tk], acc[d]);
		}
	}
	const float inv = S == 0.0f ? 0.0f : 1.0f / S;
	for (uint32_t d = 0; d < head_dim; d++)
		out[d] = acc[d] * inv;
}

void wf__cpu_attend_tiled_ref(uint32_t n_q, const float *q, size_t q_stride, const uint32_t *n_kv,
                              const uint8_t *k, const uint8_t *v, size_t kv_stride,
                              uint32_t head_dim, float scale, float *scratch, float *out,
                              size_t out_stride)
{
	for (uint32_t r = 0; r < n_q; r++)
		wf_cpu_attend_tiled(q + r * q_stride, k, v, kv_stride, n_kv[r], head_dim, scale,
		                    scratch, out + r * out_stride);
}

void wf_cpu_moe_sum(const float *d, const float *weights, uint32_t n, uint32_t k, uint32_t len,
                    float *y)
{
	for (uint32_t t = 0; t < n; t++) {
		float *yt = y + (size_t)t * len;
		for (uint32_t j = 0; j < k; j++) {
			const float *dj = d + ((size_t)t * k + j) * len;
			const float wj = weights[t * k + j];
			if (j == 0) {
				for (uint32_t i = 0; i < len; i++)
					yt[i] = dj[i] * wj;
			} else {
				for (uint32_t i = 0; i < len; i++) {
					const float p = dj[i] * wj;
					yt[i] = yt[i] + p;
				}
			}
		}
	}
}
