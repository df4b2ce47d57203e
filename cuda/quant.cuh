/* The activation side of the mat-vec path, __host__ __device__ so the unit tests run these very
 * functions on the CPU: the conversions of an activation row to the CPU's vec_dot_type (Q8_0,
 * Q8_K, F16 with an overflow guard, BF16), and the integer helpers the block dots use.
 *
 * Bit-exactness with the CPU's quantizers (kernels/ref.c, identical at every SIMD level): the
 * same float operations in the same order. Each is a single rounding here (a division, one
 * product, roundf / rintf), which nvcc cannot contract, so the device computes the CPU's bits.
 *
 * Layout of a converted row in the activation workspace (ours, not the CPU's blocks, so that
 * every lane's 4-byte reads are aligned): Q8: ne0 int8 values, then at align16(ne0) one float d
 * per block (per 32 elements for Q8_0: the F16 d as float; per 256 for Q8_K); F16 and BF16:
 * ne0 halves. Rows are WF_ACT row_bytes apart (a multiple of 16). */
#ifndef WF_CUDA_QUANT_CUH
#define WF_CUDA_QUANT_CUH

#include "cuda/dequant.cuh"

#include <math.h>
#include <stdint.h>

#define WF_Q_FN static __host__ __device__ __forceinline__

/* What a product's activation rows are converted to, by weight type. */
enum wf_act {
	WF_ACT_F32,  /* x read in place (F32 weights) */
	WF_ACT_F16,  /* halves, scaled by 2^-exp when the row reaches 2^15 */
	WF_ACT_BF16, /* halves */
	WF_ACT_Q8_0, /* Q8_0 weights and Q4_0 */
	WF_ACT_Q8_K, /* the K-quants */
};

WF_Q_FN enum wf_act wf_act_of(enum wf_dtype t)
{
	switch (t) {
	case WF_DTYPE_F16:
		return WF_ACT_F16;
	case WF_DTYPE_BF16:
		return WF_ACT_BF16;
	case WF_DTYPE_Q8_0:
	case WF_DTYPE_Q4_0:
		return WF_ACT_Q8_0;
	case WF_DTYPE_Q4_K:
	case WF_DTYPE_Q5_K:
	case WF_DTYPE_Q6_K:
		return WF_ACT_Q8_K;
	default:
		return WF_ACT_F32;
	}
}

WF_Q_FN int64_t wf_align16(int64_t b)
{
	return (b + 15) & ~(int64_t)15;
}

/* Bytes of one converted row of ne0 elements: the largest of the layouts (a row's slot in the
 * workspace does not depend on the kind). */
WF_Q_FN int64_t wf_act_row_bytes(int64_t ne0)
{
	const int64_t h = wf_align16(2 * ne0);
	const int64_t q = wf_align16(ne0) + wf_align16(4 * (ne0 / 32));
	return h > q ? h : q;
}

/* ---- conversions of single values ---------------------------------------------------------- */

WF_Q_FN uint32_t wf_f32_bits(float f)
{
#ifdef __CUDA_ARCH__
	return __float_as_uint(f);
#else
	uint32_t u;
	memcpy(&u, &f, sizeof(u));
	return u;
#endif
}

/* float to binary16 bits, round to nearest even (kernels/ref.c wf_kernels_fp32_to_fp16: the
 * device's conversion agrees on every non-NaN value; a NaN stays a NaN). */
WF_Q_FN uint16_t wf_f2h(float f)
{
#ifdef __CUDA_ARCH__
	return __half_as_ushort(__float2half_rn(f));
#else
	uint32_t w = wf_f32_bits(f);
	uint16_t sign = (uint16_t)((w >> 16) & 0x8000u);
	uint32_t a = w & 0x7fffffffu;

	if (a > 0x7f800000u)
		return sign | 0x7e00u;
	if (a >= 0x477ff000u)
		return sign | 0x7c00u;
	if (a < 0x38800000u)
		return sign | (uint16_t)rintf(wf_dq_bits_f32(a) * 0x1p24f);
	a += 0xfffu + ((a >> 13) & 1u);
	return sign | (uint16_t)((a - (112u << 23)) >> 13);
#endif
}

/* float to bfloat16 bits exactly as kernels/ref.c (round to nearest even; NaN made quiet), on
 * both sides: integer operations only. */
WF_Q_FN uint16_t wf_f2bf(float f)
{
	const uint32_t w = wf_f32_bits(f);
	if ((w & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((w >> 16) | 0x40u);
	return (uint16_t)((w + 0x7fffu + ((w >> 16) & 1u)) >> 16);
}

WF_Q_FN float wf_q_round(float v) /* roundf: halves away from zero */
{
	return roundf(v);
}

WF_Q_FN float wf_q_rint(float v) /* rintf: halves to even */
{
	return rintf(v);
}

/* The F16 overflow guard: the power of two (>= 0) a row whose largest finite magnitude is m is
 * scaled down by so that it stays below 2^15 (no F16 rounding can then reach infinity). An
 * infinite m keeps 0: the row holds an infinity, as the CPU's would. */
WF_Q_FN int wf_f16_exp(float m)
{
	if (!(m >= 32768.0f) || isinf(m))
		return 0;
	int e;
	(void)frexpf(m, &e); /* m < 2^e */
	return e - 15;
}

/* 2^e for -126 <= e <= 127 (the exponents here are 0 to ~113), built from its bits: exact,
 * and no libm call in the kernels. */
WF_Q_FN float wf_pow2(int e)
{
	return wf_dq_bits_f32((uint32_t)(e + 127) << 23);
}

/* ---- integer helpers of the block dots ----------------------------------------------------- */

/* Four signed byte products added to c (the device's dp4a). */
WF_Q_FN int wf_dp4a(int a, int b, int c)
{
#ifdef __CUDA_ARCH__
	return __dp4a(a, b, c);
#else
	for (int i = 0; i < 4; i++)
		c += (int)(int8_t)(uint8_t)((uint32_t)a >> (8 * i)) *
		     (int)(int8_t)(uint8_t)((uint32_t)b >> (8 * i));
	return c;
#endif
}

/* Per-byte a - b, wrapping (values 0..63 minus 8 or 32 become the signed bytes the dots take). */
WF_Q_FN uint32_t wf_vsub4(uint32_t a, uint32_t b)
{
#ifdef __CUDA_ARCH__
	return __vsub4(a, b);
#else
	uint32_t r = 0;
	for (int i = 0; i < 4; i++)
		r |= ((((a >> (8 * i)) & 0xffu) - ((b >> (8 * i)) & 0xffu)) & 0xffu) << (8 * i);
	return r;
#endif
}

/* 4 bytes from a 2-byte aligned address (Q8_0, Q4_0 and Q6_K blocks are 34, 18 and 210 bytes),
 * and from a 4-byte aligned one. */
WF_Q_FN uint32_t wf_ld4_a2(const uint8_t *p)
{
	const uint16_t *h = reinterpret_cast<const uint16_t *>(p);
	return (uint32_t)h[0] | ((uint32_t)h[1] << 16);
}

WF_Q_FN uint32_t wf_ld4(const uint8_t *p)
{
	return *reinterpret_cast<const uint32_t *>(p);
}

WF_Q_FN int wf_ld4i(const int8_t *p)
{
	return *reinterpret_cast<const int *>(p);
}

/* ---- block quantizers, one block from its values ------------------------------------------- */

/* Q8_0 as the host backend quantizes activations (kernels/ref.c, ggml's x86 quantize_row_q8_0,
 * what llama.cpp's AVX2 build uses): d = amax / 127 stored as F16; values rintf(x * 127 / amax),
 * halves to even. amax ignores NaN as the CPU's "fabsf(x) > amax" does. Returns the d the dot
 * reads (the F16 value as float). */
WF_Q_FN float wf_q8_0_scale(float amax, float *ret_id)
{
	const float d = amax / 127.0f;
	*ret_id = amax != 0.0f ? 127.0f / amax : 0.0f;
	return wf_dq_h2f(wf_f2h(d));
}

WF_Q_FN int8_t wf_q8_0_value(float x, float id)
{
	return (int8_t)wf_q_rint(x * id);
}

/* Q8_K (quantize_row_q8_K_ref): max is the first element of largest magnitude with its sign;
 * iscale = -127 / max, values rintf(iscale * x) capped at 127, d = 1 / iscale (0 for an all-zero
 * block, whose values are 0). */
WF_Q_FN float wf_q8_K_iscale(float max)
{
	return -127.0f / max;
}

WF_Q_FN int8_t wf_q8_K_value(float x, float iscale)
{
	const int v = (int)wf_q_rint(iscale * x);
	return (int8_t)(v < 127 ? v : 127);
}

/* Whether element (a, ia) is "first of larger magnitude" than (b, ib): the CPU's sequential
 * scan with "fabsf(x) > amax" keeps the first maximum; NaN never wins. */
WF_Q_FN bool wf_q8_K_before(float a, int ia, float b, int ib)
{
	return a > b || (a == b && ia < ib);
}

#endif
