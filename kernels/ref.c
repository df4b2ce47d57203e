/* Plain-C reference kernels (see ref.h for what "ggml's semantics" pins down). The float
 * expressions keep ggml's operand order on purpose: the build is ISO C11, so GCC does not
 * contract a*b+c into an FMA, and each line rounds where ggml's scalar code rounds. */
#include "kernels/ref.h"

#include <assert.h>
#include <math.h>
#include <string.h>

/* ---- F16 / BF16 ---------------------------------------------------------------------------- */

static float bits_to_f32(uint32_t u)
{
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

static uint32_t f32_to_bits(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	return u;
}

float wf_kernels_fp16_to_fp32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
	uint32_t exp = (h >> 10) & 0x1fu;
	uint32_t man = h & 0x3ffu;

	if (exp == 0x1f)
		return bits_to_f32(sign | 0x7f800000u | (man << 13));
	if (exp == 0) {
		/* zero or subnormal: man * 2^-24, exact in binary32 */
		float f = (float)man * 0x1p-24f;
		return sign ? -f : f;
	}
	return bits_to_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

uint16_t wf_kernels_fp32_to_fp16(float f)
{
	uint32_t w = f32_to_bits(f);
	uint16_t sign = (uint16_t)((w >> 16) & 0x8000u);
	uint32_t a = w & 0x7fffffffu;

	if (a > 0x7f800000u)
		return sign | 0x7e00u; /* NaN: the canonical quiet one, as ggml writes it */
	/* 65520 (0x477ff000) lies halfway between 65504 (odd mantissa) and 2^16: ties to even go up
	 */
	if (a >= 0x477ff000u)
		return sign | 0x7c00u;
	if (a < 0x38800000u) {
		/* below 2^-14: a subnormal half (or zero); scaling by 2^24 is exact and rintf
		 * rounds half to even in the default rounding mode */
		return sign | (uint16_t)rintf(bits_to_f32(a) * 0x1p24f);
	}
	a += 0xfffu + ((a >> 13) & 1u); /* round to nearest even; a carry bumps the exponent */
	return sign | (uint16_t)((a - (112u << 23)) >> 13);
}

float wf_kernels_bf16_to_fp32(uint16_t h)
{
	return bits_to_f32((uint32_t)h << 16);
}

uint16_t wf_kernels_fp32_to_bf16(float f)
{
	uint32_t w = f32_to_bits(f);

	if ((w & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((w >> 16) |
		                  0x40u); /* NaN: keep the payload's top, make it quiet */
	return (uint16_t)((w + 0x7fffu + ((w >> 16) & 1u)) >> 16);
}

/* ---- Dequantization ------------------------------------------------------------------------ */

void wf_kernels_ref_dequantize_row_f32(const void *x, float *y, int64_t n)
{
	memcpy(y, x, (size_t)n * sizeof(float));
}

void wf_kernels_ref_dequantize_row_f16(const void *x, float *y, int64_t n)
{
	const uint16_t *h = x;

	for (int64_t i = 0; i < n; i++)
		y[i] = wf_kernels_fp16_to_fp32(h[i]);
}

void wf_kernels_ref_dequantize_row_bf16(const void *x, float *y, int64_t n)
{
	const uint16_t *h = x;

	for (int64_t i = 0; i < n; i++)
		y[i] = wf_kernels_bf16_to_fp32(h[i]);
}

void wf_kernels_ref_dequantize_row_q8_0(const void *x, float *y, int64_t n)
{
	const struct wf_block_q8_0 *b = x;

	assert(n % WF_QK8_0 == 0);
	for (int64_t i = 0; i < n / WF_QK8_0; i++, y += WF_QK8_0) {
		const float d = wf_kernels_fp16_to_fp32(b[i].d);

		for (int j = 0; j < WF_QK8_0; j++)
			y[j] = (float)b[i].qs[j] * d;
	}
}

void wf_kernels_ref_dequantize_row_q4_0(const void *x, float *y, int64_t n)
{
	const struct wf_block_q4_0 *b = x;

	assert(n % WF_QK4_0 == 0);
	for (int64_t i = 0; i < n / WF_QK4_0; i++, y += WF_QK4_0) {
		const float d = wf_kernels_fp16_to_fp32(b[i].d);

		for (int j = 0; j < WF_QK4_0 / 2; j++) {
			y[j] = (float)((b[i].qs[j] & 0x0f) - 8) * d;
			y[j + WF_QK4_0 / 2] = (float)((b[i].qs[j] >> 4) - 8) * d;
		}
	}
}

/* Sub-block j's 6-bit scale and min from the 12 packed bytes of Q4_K/Q5_K: sub-blocks 0..3 hold
 * theirs in the low 6 bits of bytes 0..3 (scales) and 4..7 (mins); 4..7 keep the low 4 bits in
 * bytes 8..11 (scale low nibble, min high nibble) and the top 2 bits in the spare top bits of
 * bytes 0..3 (scales) and 4..7 (mins). */
static void k_scale_min(const uint8_t *s, int j, uint8_t *ret_sc, uint8_t *ret_m)
{
	if (j < 4) {
		*ret_sc = s[j] & 63;
		*ret_m = s[j + 4] & 63;
	} else {
		*ret_sc = (uint8_t)((s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4));
		*ret_m = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
	}
}

void wf_kernels_ref_dequantize_row_q4_K(const void *x, float *y, int64_t n)
{
	const struct wf_block_q4_K *b = x;

	assert(n % WF_QK_K == 0);
	for (int64_t i = 0; i < n / WF_QK_K; i++) {
		const float d = wf_kernels_fp16_to_fp32(b[i].d);
		const float dmin = wf_kernels_fp16_to_fp32(b[i].dmin);

		/* four chunks of 64: the low nibbles of 32 bytes are sub-block 2c, the high ones
		 * 2c+1 */
		for (int c = 0; c < 4; c++) {
			const uint8_t *q = b[i].qs + 32 * c;
			uint8_t sc, m;

			k_scale_min(b[i].scales, 2 * c, &sc, &m);
			const float d1 = d * (float)sc, m1 = dmin * (float)m;
			k_scale_min(b[i].scales, 2 * c + 1, &sc, &m);
			const float d2 = d * (float)sc, m2 = dmin * (float)m;
			for (int l = 0; l < 32; l++)
				*y++ = d1 * (float)(q[l] & 0x0f) - m1;
			for (int l = 0; l < 32; l++)
				*y++ = d2 * (float)(q[l] >> 4) - m2;
		}
	}
}

void wf_kernels_ref_dequantize_row_q5_K(const void *x, float *y, int64_t n)
{
	const struct wf_block_q5_K *b = x;

	assert(n % WF_QK_K == 0);
	for (int64_t i = 0; i < n / WF_QK_K; i++) {
		const float d = wf_kernels_fp16_to_fp32(b[i].d);
		const float dmin = wf_kernels_fp16_to_fp32(b[i].dmin);

		for (int c = 0; c < 4; c++) {
			const uint8_t *q = b[i].qs + 32 * c;
			const uint8_t *qh = b[i].qh;
			const uint8_t h1 = (uint8_t)(1u << (2 * c)),
			              h2 = (uint8_t)(1u << (2 * c + 1));
			uint8_t sc, m;

			k_scale_min(b[i].scales, 2 * c, &sc, &m);
			const float d1 = d * (float)sc, m1 = dmin * (float)m;
			k_scale_min(b[i].scales, 2 * c + 1, &sc, &m);
			const float d2 = d * (float)sc, m2 = dmin * (float)m;
			for (int l = 0; l < 32; l++)
				*y++ = d1 * (float)((q[l] & 0x0f) + (qh[l] & h1 ? 16 : 0)) - m1;
			for (int l = 0; l < 32; l++)
				*y++ = d2 * (float)((q[l] >> 4) + (qh[l] & h2 ? 16 : 0)) - m2;
		}
	}
}

/* The 256 signed 6-bit values of a Q6_K block, in element order. Each half of 128 takes 64 ql
 * bytes and 32 qh bytes: element l + 32*k (l < 32) of the half has its low nibble in
 * ql[l + 32*(k&1)] (low nibble for k < 2, high for k >= 2) and its top 2 bits in qh[l] at 2*k. */
static void q6_K_values(const struct wf_block_q6_K *b, int8_t *a)
{
	const uint8_t *ql = b->ql, *qh = b->qh;

	for (int half = 0; half < 2; half++, ql += 64, qh += 32, a += 128) {
		for (int l = 0; l < 32; l++) {
			a[l + 0] = (int8_t)((ql[l + 0] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
			a[l + 32] = (int8_t)((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
			a[l + 64] = (int8_t)((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
			a[l + 96] = (int8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
		}
	}
}

void wf_kernels_ref_dequantize_row_q6_K(const void *x, float *y, int64_t n)
{
	const struct wf_block_q6_K *b = x;
	int8_t a[WF_QK_K];

	assert(n % WF_QK_K == 0);
	for (int64_t i = 0; i < n / WF_QK_K; i++, y += WF_QK_K) {
		const float d = wf_kernels_fp16_to_fp32(b[i].d);

		q6_K_values(&b[i], a);
		/* ggml multiplies d by the scale first, then by the value */
		for (int e = 0; e < WF_QK_K; e++)
			y[e] = d * (float)b[i].scales[e / 16] * (float)a[e];
	}
}

void wf_kernels_ref_dequantize_row_q8_K(const void *x, float *y, int64_t n)
{
	const struct wf_block_q8_K *b = x;

	assert(n % WF_QK_K == 0);
	for (int64_t i = 0; i < n / WF_QK_K; i++, y += WF_QK_K)
		for (int j = 0; j < WF_QK_K; j++)
			y[j] = b[i].d * (float)b[i].qs[j];
}

/* ---- Activation quantizers ----------------------------------------------------------------- */

void wf_kernels_ref_quantize_row_f32(const float *x, void *y, int64_t n)
{
	memcpy(y, x, (size_t)n * sizeof(float));
}

void wf_kernels_ref_quantize_row_f16(const float *x, void *y, int64_t n)
{
	uint16_t *h = y;

	for (int64_t i = 0; i < n; i++)
		h[i] = wf_kernels_fp32_to_fp16(x[i]);
}

void wf_kernels_ref_quantize_row_bf16(const float *x, void *y, int64_t n)
{
	uint16_t *h = y;

	for (int64_t i = 0; i < n; i++)
		h[i] = wf_kernels_fp32_to_bf16(x[i]);
}

void wf_kernels_ref_quantize_row_q8_0(const float *x, void *y, int64_t n)
{
	struct wf_block_q8_0 *b = y;

	assert(n % WF_QK8_0 == 0);
	for (int64_t i = 0; i < n / WF_QK8_0; i++, x += WF_QK8_0) {
		float amax = 0.0f;

		for (int j = 0; j < WF_QK8_0; j++)
			amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
		/* ggml's x86 quantize_row_q8_0 (what llama.cpp's AVX2 build quantizes with, not
		 * quantize_row_q8_0_ref): scaled by 127 / amax, rounded half to even; only the
		 * stored d = amax / 127 is F16 */
		const float d = amax / 127.0f;
		const float id = amax != 0.0f ? 127.0f / amax : 0.0f;

		b[i].d = wf_kernels_fp32_to_fp16(d);
		for (int j = 0; j < WF_QK8_0; j++)
			b[i].qs[j] = (int8_t)nearbyintf(x[j] * id); /* the default mode: to even */
	}
}

void wf_kernels_ref_quantize_row_q8_K(const float *x, void *y, int64_t n)
{
	struct wf_block_q8_K *b = y;

	assert(n % WF_QK_K == 0);
	for (int64_t i = 0; i < n / WF_QK_K; i++, x += WF_QK_K) {
		float max = 0.0f, amax = 0.0f;

		/* the first element of largest magnitude, with its sign */
		for (int j = 0; j < WF_QK_K; j++) {
			if (fabsf(x[j]) > amax) {
				amax = fabsf(x[j]);
				max = x[j];
			}
		}
		if (amax == 0.0f) {
			memset(&b[i], 0, sizeof(b[i]));
			continue;
		}
		/* -127 (not -128) as ggml has it: the largest element maps to -127 whatever its
		 * sign, so d carries the opposite sign of that element */
		const float iscale = -127.0f / max;

		for (int j = 0; j < WF_QK_K; j++) {
			/* rintf: round half to even, as ggml's nearest_int (|v| <= 127 here) */
			int v = (int)rintf(iscale * x[j]);
			b[i].qs[j] = (int8_t)(v < 127 ? v : 127);
		}
		for (int g = 0; g < WF_QK_K / 16; g++) {
			int sum = 0;

			for (int j = 0; j < 16; j++)
				sum += b[i].qs[g * 16 + j];
			b[i].bsums[g] = (int16_t)sum;
		}
		b[i].d = 1.0f / iscale;
	}
}

/* ---- Dot products -------------------------------------------------------------------------- */

float wf_kernels_ref_vec_dot_f32_f32(int64_t n, const void *x, const void *y)
{
	const float *a = x, *b = y;
	double sum = 0.0;

	/* the product rounds to float first, the sum is double: ggml's non-SIMD path */
	for (int64_t i = 0; i < n; i++)
		sum += (double)(a[i] * b[i]);
	return (float)sum;
}

float wf_kernels_ref_vec_dot_f16_f16(int64_t n, const void *x, const void *y)
{
	const uint16_t *a = x, *b = y;
	double sum = 0.0;

	for (int64_t i = 0; i < n; i++)
		sum += (double)(wf_kernels_fp16_to_fp32(a[i]) * wf_kernels_fp16_to_fp32(b[i]));
	return (float)sum;
}

float wf_kernels_ref_vec_dot_bf16_bf16(int64_t n, const void *x, const void *y)
{
	const uint16_t *a = x, *b = y;
	double sum = 0.0;

	for (int64_t i = 0; i < n; i++)
		sum += (double)(wf_kernels_bf16_to_fp32(a[i]) * wf_kernels_bf16_to_fp32(b[i]));
	return (float)sum;
}

float wf_kernels_ref_vec_dot_q8_0_q8_0(int64_t n, const void *x, const void *y)
{
	const struct wf_block_q8_0 *a = x, *b = y;
	float sum = 0.0f;

	assert(n % WF_QK8_0 == 0);
	for (int64_t i = 0; i < n / WF_QK8_0; i++) {
		int sumi = 0;

		for (int j = 0; j < WF_QK8_0; j++)
			sumi += a[i].qs[j] * b[i].qs[j];
		sum += (float)sumi *
		       (wf_kernels_fp16_to_fp32(a[i].d) * wf_kernels_fp16_to_fp32(b[i].d));
	}
	return sum;
}

float wf_kernels_ref_vec_dot_q4_0_q8_0(int64_t n, const void *x, const void *y)
{
	const struct wf_block_q4_0 *a = x;
	const struct wf_block_q8_0 *b = y;
	float sum = 0.0f;

	assert(n % WF_QK8_0 == 0);
	for (int64_t i = 0; i < n / WF_QK8_0; i++) {
		int lo = 0, hi = 0;

		for (int j = 0; j < WF_QK8_0 / 2; j++) {
			lo += ((a[i].qs[j] & 0x0f) - 8) * b[i].qs[j];
			hi += ((a[i].qs[j] >> 4) - 8) * b[i].qs[j + WF_QK8_0 / 2];
		}
		/* unlike Q8_0, ggml scales by the two d's one after the other here */
		sum += (float)(lo + hi) * wf_kernels_fp16_to_fp32(a[i].d) *
		       wf_kernels_fp16_to_fp32(b[i].d);
	}
	return sum;
}

/* The float tail shared by the K-quant dots: ggml keeps eight float lanes (element index mod 8)
 * across blocks and adds them after the mins. lanes[] are one block's integer sums. */
struct k_acc {
	float lanes[8];
	float sum;
};

static void k_acc_block(struct k_acc *acc, const int32_t lanes[8], float d)
{
	for (int l = 0; l < 8; l++)
		acc->lanes[l] += d * (float)lanes[l];
}

static float k_acc_finish(const struct k_acc *acc)
{
	float sum = acc->sum;

	for (int l = 0; l < 8; l++)
		sum += acc->lanes[l];
	return sum;
}

/* Q4_K and Q5_K differ only in how the unsigned values are read. */
static float q45_K_dot(int64_t n, const void *x, const void *y, int bits5)
{
	const struct wf_block_q8_K *b = y;
	struct k_acc acc = {{0}, 0.0f};
	uint8_t a[WF_QK_K];

	assert(n % WF_QK_K == 0);
	for (int64_t i = 0; i < n / WF_QK_K; i++) {
		const uint8_t *scales, *qs, *qh = NULL;
		uint16_t d, dmin;

		if (bits5) {
			const struct wf_block_q5_K *blk = (const struct wf_block_q5_K *)x + i;
			scales = blk->scales, qs = blk->qs, qh = blk->qh, d = blk->d,
			dmin = blk->dmin;
		} else {
			const struct wf_block_q4_K *blk = (const struct wf_block_q4_K *)x + i;
			scales = blk->scales, qs = blk->qs, d = blk->d, dmin = blk->dmin;
		}
		for (int c = 0; c < 4; c++) {
			for (int l = 0; l < 32; l++) {
				a[64 * c + l] = qs[32 * c + l] & 0x0f;
				a[64 * c + 32 + l] = qs[32 * c + l] >> 4;
				if (qh) {
					a[64 * c + l] += (qh[l] >> (2 * c)) & 1 ? 16 : 0;
					a[64 * c + 32 + l] += (qh[l] >> (2 * c + 1)) & 1 ? 16 : 0;
				}
			}
		}
		uint8_t sc[8], mn[8];
		for (int j = 0; j < 8; j++)
			k_scale_min(scales, j, &sc[j], &mn[j]);

		/* the mins against the activation's 16-element sums */
		int summ = 0;
		for (int g = 0; g < WF_QK_K / 16; g++)
			summ += b[i].bsums[g] * mn[g / 2];
		int32_t lanes[8] = {0};
		for (int e = 0; e < WF_QK_K; e++)
			lanes[e % 8] += sc[e / 32] * (a[e] * b[i].qs[e]);

		k_acc_block(&acc, lanes, wf_kernels_fp16_to_fp32(d) * b[i].d);
		acc.sum -= wf_kernels_fp16_to_fp32(dmin) * b[i].d * (float)summ;
	}
	return k_acc_finish(&acc);
}

float wf_kernels_ref_vec_dot_q4_K_q8_K(int64_t n, const void *x, const void *y)
{
	return q45_K_dot(n, x, y, 0);
}

float wf_kernels_ref_vec_dot_q5_K_q8_K(int64_t n, const void *x, const void *y)
{
	return q45_K_dot(n, x, y, 1);
}

float wf_kernels_ref_vec_dot_q6_K_q8_K(int64_t n, const void *x, const void *y)
{
	const struct wf_block_q6_K *a = x;
	const struct wf_block_q8_K *b = y;
	struct k_acc acc = {{0}, 0.0f};
	int8_t v[WF_QK_K];

	assert(n % WF_QK_K == 0);
	for (int64_t i = 0; i < n / WF_QK_K; i++) {
		int32_t lanes[8] = {0};

		q6_K_values(&a[i], v);
		for (int e = 0; e < WF_QK_K; e++)
			lanes[e % 8] += a[i].scales[e / 16] * (v[e] * b[i].qs[e]);
		k_acc_block(&acc, lanes, wf_kernels_fp16_to_fp32(a[i].d) * b[i].d);
	}
	return k_acc_finish(&acc);
}

/* ---- Batched dots -------------------------------------------------------------------------- */

#define REF_GEMM(name)                                                                             \
	WF_KERNELS_REF_GEMM(name)                                                                  \
	{                                                                                          \
		for (int64_t j = 0; j < n_act; j++)                                                \
			for (int64_t i = 0; i < n_rows; i++)                                       \
				out[(size_t)j * out_stride + (size_t)i] =                          \
				    wf_kernels_ref_vec_dot_##name(                                 \
				        n, (const char *)w + (size_t)i * w_stride,                 \
				        (const char *)act + (size_t)j * act_stride);               \
	}

REF_GEMM(f32_f32)
REF_GEMM(f16_f16)
REF_GEMM(bf16_bf16)
REF_GEMM(q8_0_q8_0)
REF_GEMM(q4_0_q8_0)
REF_GEMM(q4_K_q8_K)
REF_GEMM(q5_K_q8_K)
REF_GEMM(q6_K_q8_K)
