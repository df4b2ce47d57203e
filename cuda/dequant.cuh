/* Block decoders for the weight types the engine runs (F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K,
 * Q6_K), shared by matmul.cu's kernels (mat-vec, dequantize to F16, get_rows) and by its host
 * test entry points. Everything here is __host__ __device__ so that the unit tests, which run on
 * machines without a GPU, check these very functions against kernels/ref.c bit for bit.
 *
 * The unit of decoding is a group of WF_DQ_GROUP (8) consecutive elements of a row: every
 * block size divides by 8, all elements of a group share one scale, and a warp whose lanes take
 * consecutive groups reads a contiguous stretch of the row. For the plain types (block size 1)
 * a row of ne0 % 8 != 0 elements ends in a tail that wf_dq<T>::elem decodes one by one.
 *
 * Bit-exactness: each element is the float expression of the reference dequantize_row, in its
 * order. nvcc contracts a * b - c into an FMA in device code (one rounding instead of two), so
 * the products go through wf_dq_mul, __fmul_rn on the device, which is never contracted. Block
 * fields are read as bytes and 16-bit halves (blocks are 2-byte aligned: 18, 34, 144, 176 and
 * 210 bytes), never wider, since a block is not aligned to its size. F32 rows need 4 bytes. */
#ifndef WF_CUDA_DEQUANT_CUH
#define WF_CUDA_DEQUANT_CUH

#include "model/dtype.h"

#include <cuda_fp16.h>
#include <stdint.h>
#include <string.h>

#define WF_DQ_GROUP 8

#define WF_DQ_FN static __host__ __device__ __forceinline__

WF_DQ_FN float wf_dq_bits_f32(uint32_t u)
{
#ifdef __CUDA_ARCH__
	return __uint_as_float(u);
#else
	float f;
	memcpy(&f, &u, sizeof(f));
	return f;
#endif
}

/* IEEE binary16 bits to float, exact for every finite value and infinity. The host version is
 * the reference's bit conversion; the device's hardware conversion agrees except perhaps on a
 * NaN's payload, which no weight holds. */
WF_DQ_FN float wf_dq_h2f(uint16_t h)
{
#ifdef __CUDA_ARCH__
	return __half2float(__ushort_as_half(h));
#else
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
	uint32_t exp = (h >> 10) & 0x1fu;
	uint32_t man = h & 0x3ffu;

	if (exp == 0x1f)
		return wf_dq_bits_f32(sign | 0x7f800000u | (man << 13));
	if (exp == 0) {
		float f = (float)man * 0x1p-24f; /* zero or subnormal: exact */
		return sign ? -f : f;
	}
	return wf_dq_bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
#endif
}

WF_DQ_FN float wf_dq_bf2f(uint16_t h)
{
	return wf_dq_bits_f32((uint32_t)h << 16);
}

/* A product rounded on its own, so that "product - m" is two roundings as in the reference. */
WF_DQ_FN float wf_dq_mul(float a, float b)
{
#ifdef __CUDA_ARCH__
	return __fmul_rn(a, b);
#else
	return a * b;
#endif
}

WF_DQ_FN uint16_t wf_dq_u16(const uint8_t *p)
{
	return *reinterpret_cast<const uint16_t *>(p);
}

/* Sub-block j's 6-bit scale and min from the 12 packed bytes of Q4_K/Q5_K: 0..3 in the low 6
 * bits of bytes 0..3 (scales) and 4..7 (mins); 4..7 keep their low 4 bits in bytes 8..11 (scale
 * low nibble, min high nibble) and their top 2 bits in the spare top bits of bytes 0..7. */
WF_DQ_FN void wf_dq_k_scale_min(const uint8_t *s, int j, int *ret_sc, int *ret_m)
{
	if (j < 4) {
		*ret_sc = s[j] & 63;
		*ret_m = s[j + 4] & 63;
	} else {
		*ret_sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
		*ret_m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
	}
}

/* wf_dq<T>: BLOCK elements in BYTES bytes; group(row, g, v) decodes elements 8g .. 8g+7 of a
 * row into v; elem(row, e) decodes element e (plain types only, for a row's tail). */
template <enum wf_dtype T> struct wf_dq;

template <> struct wf_dq<WF_DTYPE_F32> {
	static constexpr int BLOCK = 1, BYTES = 4;
	WF_DQ_FN float elem(const uint8_t *row, int64_t e)
	{
		return reinterpret_cast<const float *>(row)[e];
	}
	WF_DQ_FN void group(const uint8_t *row, int64_t g, float *v)
	{
		for (int l = 0; l < WF_DQ_GROUP; l++)
			v[l] = elem(row, WF_DQ_GROUP * g + l);
	}
};

template <> struct wf_dq<WF_DTYPE_F16> {
	static constexpr int BLOCK = 1, BYTES = 2;
	WF_DQ_FN float elem(const uint8_t *row, int64_t e)
	{
		return wf_dq_h2f(reinterpret_cast<const uint16_t *>(row)[e]);
	}
	WF_DQ_FN void group(const uint8_t *row, int64_t g, float *v)
	{
		for (int l = 0; l < WF_DQ_GROUP; l++)
			v[l] = elem(row, WF_DQ_GROUP * g + l);
	}
};

template <> struct wf_dq<WF_DTYPE_BF16> {
	static constexpr int BLOCK = 1, BYTES = 2;
	WF_DQ_FN float elem(const uint8_t *row, int64_t e)
	{
		return wf_dq_bf2f(reinterpret_cast<const uint16_t *>(row)[e]);
	}
	WF_DQ_FN void group(const uint8_t *row, int64_t g, float *v)
	{
		for (int l = 0; l < WF_DQ_GROUP; l++)
			v[l] = elem(row, WF_DQ_GROUP * g + l);
	}
};

/* d (F16), then 32 int8: y = q * d. */
template <> struct wf_dq<WF_DTYPE_Q8_0> {
	static constexpr int BLOCK = 32, BYTES = 34;
	WF_DQ_FN void group(const uint8_t *row, int64_t g, float *v)
	{
		const uint8_t *b = row + (g / 4) * BYTES;
		const float d = wf_dq_h2f(wf_dq_u16(b));
		const uint8_t *qs = b + 2 + 8 * (int)(g % 4);

		for (int l = 0; l < WF_DQ_GROUP; l++)
			v[l] = (float)(int8_t)qs[l] * d;
	}
};

/* d (F16), then 16 bytes: element j < 16 in the low nibble of byte j, j + 16 in its high one;
 * y = (q - 8) * d. */
template <> struct wf_dq<WF_DTYPE_Q4_0> {
	static constexpr int BLOCK = 32, BYTES = 18;
	WF_DQ_FN void group(const uint8_t *row, int64_t g, float *v)
	{
		const uint8_t *b = row + (g / 4) * BYTES;
		const float d = wf_dq_h2f(wf_dq_u16(b));
		const int s = (int)(g % 4);
		const uint8_t *qs = b + 2 + 8 * (s & 1);
		const int shift = s < 2 ? 0 : 4;

		for (int l = 0; l < WF_DQ_GROUP; l++)
			v[l] = (float)(((qs[l] >> shift) & 0x0f) - 8) * d;
	}
};

/* d, dmin (F16), 12 bytes of packed scales and mins, 128 bytes of nibbles: four chunks of 64
 * elements, the low nibbles of 32 bytes are sub-block 2c, the high ones 2c + 1;
 * y = (d * sc) * q - dmin * m. Group g: chunk g / 8, sub-block 2 (g / 8) + (g / 4) % 2, bytes
 * 8 (g % 4) .. + 7 of the chunk. */
template <> struct wf_dq<WF_DTYPE_Q4_K> {
	static constexpr int BLOCK = 256, BYTES = 144;
	WF_DQ_FN void group(const uint8_t *row, int64_t g, float *v)
	{
		const uint8_t *b = row + (g / 32) * BYTES;
		const int s = (int)(g % 32), c = s / 8, hi = (s / 4) & 1;
		const float d = wf_dq_h2f(wf_dq_u16(b)), dmin = wf_dq_h2f(wf_dq_u16(b + 2));
		const uint8_t *q = b + 16 + 32 * c + 8 * (s % 4);
		int sc, m;

		wf_dq_k_scale_min(b + 4, 2 * c + hi, &sc, &m);
		const float d1 = wf_dq_mul(d, (float)sc), m1 = wf_dq_mul(dmin, (float)m);
		for (int l = 0; l < WF_DQ_GROUP; l++)
			v[l] = wf_dq_mul(d1, (float)((q[l] >> (4 * hi)) & 0x0f)) - m1;
	}
};

/* Q4_K's layout with 32 bytes qh before the nibbles: bit s of qh[l] is the fifth bit of
 * element l of sub-block s. */
template <> struct wf_dq<WF_DTYPE_Q5_K> {
	static constexpr int BLOCK = 256, BYTES = 176;
	WF_DQ_FN void group(const uint8_t *row, int64_t g, float *v)
	{
		const uint8_t *b = row + (g / 32) * BYTES;
		const int s = (int)(g % 32), c = s / 8, hi = (s / 4) & 1, l0 = 8 * (s % 4);
		const float d = wf_dq_h2f(wf_dq_u16(b)), dmin = wf_dq_h2f(wf_dq_u16(b + 2));
		const uint8_t *qh = b + 16 + l0;
		const uint8_t *q = b + 48 + 32 * c + l0;
		const int sub = 2 * c + hi;
		int sc, m;

		wf_dq_k_scale_min(b + 4, sub, &sc, &m);
		const float d1 = wf_dq_mul(d, (float)sc), m1 = wf_dq_mul(dmin, (float)m);
		for (int l = 0; l < WF_DQ_GROUP; l++) {
			const int x = ((q[l] >> (4 * hi)) & 0x0f) + ((qh[l] >> sub) & 1 ? 16 : 0);
			v[l] = wf_dq_mul(d1, (float)x) - m1;
		}
	}
};

/* 128 bytes ql (low 4 bits), 64 bytes qh (top 2 bits), 16 int8 scales, d (F16). Each half of
 * 128 elements takes 64 ql and 32 qh bytes: element l + 32 k (l < 32) of the half has its low
 * bits in ql[l + 32 (k & 1)] (low nibble for k < 2, high for k >= 2) and its top bits in qh[l]
 * at 2 k; y = (d * scale[e / 16]) * (q - 32). */
template <> struct wf_dq<WF_DTYPE_Q6_K> {
	static constexpr int BLOCK = 256, BYTES = 210;
	WF_DQ_FN void group(const uint8_t *row, int64_t g, float *v)
	{
		const uint8_t *b = row + (g / 32) * BYTES;
		const int e0 = WF_DQ_GROUP * (int)(g % 32); /* first element in the block */
		const int half = e0 / 128, k = (e0 % 128) / 32, l0 = e0 % 32;
		const uint8_t *ql = b + 64 * half + 32 * (k & 1) + l0;
		const uint8_t *qh = b + 128 + 32 * half + l0;
		const int8_t sc = (int8_t)b[192 + e0 / 16];
		const float ds = wf_dq_mul(wf_dq_h2f(wf_dq_u16(b + 208)), (float)sc);

		for (int l = 0; l < WF_DQ_GROUP; l++) {
			const int lo = (ql[l] >> (k >= 2 ? 4 : 0)) & 0x0f;
			const int q = (lo | (((qh[l] >> (2 * k)) & 3) << 4)) - 32;
			v[l] = wf_dq_mul(ds, (float)q);
		}
	}
};

/* Calls f.template operator()<T>() for a supported type T == t, else returns ret_unsupported:
 * one instantiation per type from a runtime wf_dtype (f: a struct with a member template). */
template <class F, class R>
static __host__ R wf_dq_dispatch(enum wf_dtype t, F &f, R ret_unsupported)
{
	switch (t) {
	case WF_DTYPE_F32:
		return f.template operator()<WF_DTYPE_F32>();
	case WF_DTYPE_F16:
		return f.template operator()<WF_DTYPE_F16>();
	case WF_DTYPE_BF16:
		return f.template operator()<WF_DTYPE_BF16>();
	case WF_DTYPE_Q8_0:
		return f.template operator()<WF_DTYPE_Q8_0>();
	case WF_DTYPE_Q4_0:
		return f.template operator()<WF_DTYPE_Q4_0>();
	case WF_DTYPE_Q4_K:
		return f.template operator()<WF_DTYPE_Q4_K>();
	case WF_DTYPE_Q5_K:
		return f.template operator()<WF_DTYPE_Q5_K>();
	case WF_DTYPE_Q6_K:
		return f.template operator()<WF_DTYPE_Q6_K>();
	default:
		return ret_unsupported;
	}
}

/* Plain types have no elem() requirement on quantized ones: a tail exists only for BLOCK == 1. */
template <enum wf_dtype T> WF_DQ_FN float wf_dq_elem(const uint8_t *row, int64_t e)
{
	if constexpr (wf_dq<T>::BLOCK == 1) {
		return wf_dq<T>::elem(row, e);
	} else {
		(void)row;
		(void)e;
		return 0.0f;
	}
}

#endif
