/* Internal to libwfkernels: llama.cpp's scalar float steps written once, compiled twice.
 *
 * kernels/cpu_ops.c includes this for the reference level (built without target flags: fmaf is a
 * call into libm), and kernels/x86_impl.h for each SIMD level (built with -mfma: fmaf is one
 * vfmadd instruction). A fused multiply-add is exactly rounded either way, and the build is ISO C
 * (-std=c11: gcc contracts nothing on its own), so both copies compute the same floats; the
 * levels' vector versions (x86_impl.h) compute these lane by lane. */
#ifndef WF_KERNELS_CPU_SCALAR_H
#define WF_KERNELS_CPU_SCALAR_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

static inline uint32_t wf__cpu_f2u(float f)
{
	uint32_t u;
	memcpy(&u, &f, sizeof(u));
	return u;
}

static inline float wf__cpu_u2f(uint32_t u)
{
	float f;
	memcpy(&f, &u, sizeof(f));
	return f;
}

/* ggml_v_expf of the AVX2 build (ggml-cpu/vec.h), one lane: the exponential that
 * ggml_vec_soft_max_f32 takes, not libm's expf. Written with fmaf (each _mm256_fmadd_ps and
 * _mm256_fnmadd_ps one fused operation) so that every build and kernel level gives its bits. */
static inline float wf__cpu_v_expf(float x)
{
	const float r = 0x1.8p23f;
	const float z = fmaf(x, 0x1.715476p+0f, r);
	const float n = z - r;
	const float b = fmaf(-n, 0x1.7f7d1cp-20f, fmaf(-n, 0x1.62e4p-1f, x));
	const uint32_t e = wf__cpu_f2u(z) << 23;
	const float k = wf__cpu_u2f(e + wf__cpu_f2u(1.0f));
	const float u = b * b;
	const float j = fmaf(fmaf(fmaf(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u,
	                          fmaf(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)),
	                     u, 0x1.ffffecp-1f * b);
	if (!(fabsf(n) > 126.0f))
		return fmaf(j, k, k);
	const uint32_t g = n <= 0.0f ? 0x82000000u : 0u;
	const float s1 = wf__cpu_u2f(g + 0x7f000000u);
	const float s2 = wf__cpu_u2f(e - g);
	if (fabsf(n) > 192.0f)
		return s1 * s1;
	return fmaf(s2, j, s2) * s1;
}

/* ggml_rope_ext's rotation of one head (the cpu_ops.h wf_cpu_rope). */
static inline void wf__cpu_rope_rotate(float *x, uint32_t n_dims, const float *cs, bool neox)
{
	for (uint32_t i0 = 0; i0 < n_dims; i0 += 2) {
		const float c = cs[i0], s = cs[i0 + 1];
		const uint32_t a = neox ? i0 / 2 : i0, b = neox ? i0 / 2 + n_dims / 2 : i0 + 1;
		const float x0 = x[a], x1 = x[b];
		/* rotate_pairs as gcc contracts it in llama.cpp's -mfma build (-std=gnu++17: fused
		 * multiply-adds allowed): x0 * c fused with the rounded x1 * s, and x0 * s with x1
		 * * c */
		x[a] = fmaf(x0, c, -(x1 * s));
		x[b] = fmaf(x0, s, x1 * c);
	}
}

#endif
