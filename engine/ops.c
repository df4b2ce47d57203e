/* The engine's non-matmul numerics, written to compute what ggml's CPU ops compute (llama.cpp
 * b10573, ggml/src/ggml-cpu/ops.cpp and vec.h), in the same order where the order shows in the
 * result: sums of squares and softmax sums in double, RoPE angles by repeated float
 * multiplication, the flash-attention accumulator rounded to F16 after every step. */
#include "engine/engine_internal.h"

#include "kernels/ref.h"

#include <math.h>
#include <string.h>

void wf__rms_norm(const float *x, const float *w, float *y, uint32_t n, float eps)
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

void wf__rope(float *x, uint32_t head_dim, uint32_t n_dims, uint32_t pos, float base,
              enum wf__rope_kind kind)
{
	(void)head_dim; /* dimensions past n_dims pass through unchanged */
	const float theta_scale = powf(base, -2.0f / (float)n_dims);
	float theta = (float)pos;
	for (uint32_t i0 = 0; i0 < n_dims; i0 += 2) {
		const float c = cosf(theta), s = sinf(theta);
		theta *= theta_scale;
		uint32_t a, b;
		if (kind == WF__ROPE_NEOX) {
			a = i0 / 2;
			b = i0 / 2 + n_dims / 2;
		} else {
			a = i0;
			b = i0 + 1;
		}
		const float x0 = x[a], x1 = x[b];
		x[a] = x0 * c - x1 * s;
		x[b] = x0 * s + x1 * c;
	}
}

void wf__softmax(float *x, uint32_t n)
{
	float max = -INFINITY;
	for (uint32_t i = 0; i < n; i++)
		max = x[i] > max ? x[i] : max;
	double sum = 0.0;
	for (uint32_t i = 0; i < n; i++) {
		const float v = expf(x[i] - max);
		sum += (double)v;
		x[i] = v;
	}
	const float inv = (float)(1.0 / sum);
	for (uint32_t i = 0; i < n; i++)
		x[i] *= inv;
}

void wf__route(const float *logits, uint32_t n_expert, uint32_t k, float *probs,
               int32_t *ret_ids, float *ret_weights)
{
	memcpy(probs, logits, n_expert * sizeof(float));
	wf__softmax(probs, n_expert);
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

void wf__swiglu(const float *g, const float *u, float *y, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
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

void wf__attend(const float *q, const uint8_t *k, const uint8_t *v, size_t kv_stride,
                uint32_t n_kv, uint32_t head_dim, float scale, enum wf_engine_kv_type type,
                float *scratch, float *out)
{
	if (type == WF_ENGINE_KV_F16) {
		/* scratch: the query rounded to F16 (as floats), then the accumulator's F16 bits */
		float *qh = scratch;
		uint16_t *acc = (uint16_t *)(scratch + head_dim);
		for (uint32_t i = 0; i < head_dim; i++) {
			qh[i] = h2f(f2h(q[i]));
			acc[i] = 0;
		}
		float M = -INFINITY, S = 0.0f;
		for (uint32_t p = 0; p < n_kv; p++) {
			const uint16_t *kp = (const uint16_t *)(k + p * kv_stride);
			const uint16_t *vp = (const uint16_t *)(v + p * kv_stride);
			float s = 0.0f;
			for (uint32_t i = 0; i < head_dim; i++)
				s += h2f(kp[i]) * qh[i];
			s *= scale;
			float ms = 1.0f, vs = 1.0f;
			if (s > M) {
				const float m_old = M;
				M = s;
				ms = expf(m_old - M);
				for (uint32_t i = 0; i < head_dim; i++)
					acc[i] = f2h(h2f(acc[i]) * ms);
			} else {
				vs = expf(s - M);
			}
			for (uint32_t i = 0; i < head_dim; i++)
				acc[i] = f2h(fmaf(h2f(vp[i]), vs, h2f(acc[i])));
			S = S * ms + vs;
		}
		const float inv = S == 0.0f ? 0.0f : 1.0f / S;
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
