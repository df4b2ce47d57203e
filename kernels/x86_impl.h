/* The x86 SIMD kernels, included once per level by kernels/x86_avx2.c (WF_X86_AVX512 0: AVX2 +
 * FMA + F16C) and kernels/x86_avx512.c (WF_X86_AVX512 1: also AVX-512 F/BW/VL + VNNI), each file
 * compiled with its level's target flags. Everything here is static except the level's filler.
 *
 * Shape of the work. gemm runs tiles of one weight row by up to TILE activation rows: each weight
 * block is loaded and unpacked once and multiplied into every activation row of the tile, so
 * batched decode and prefill read the weights (the bandwidth that decode is bound by) once per
 * TILE rows instead of once per row. Activation rows go in groups of GROUP whose blocks stay in
 * L2 while the weight rows pass over them. vec_dot is the 1 x 1 tile.
 *
 * Numerics. Integer products of a block are summed exactly (u8 x s8 pairs into int16 cannot
 * saturate: weights are at most 6 bits unsigned or |q| <= 128 and activations |q| <= 127, as the
 * quantizers write them), then scaled in float per block into eight float lanes per activation
 * row (sixteen for the AVX-512 Q4_K/Q5_K, see q45_K_tile); the lanes are added at the end. So the
 * result differs from the reference only by float summation order (and, for F32/F16/BF16, by FMA
 * rounding instead of a double accumulator). The quantizers reproduce the reference's float
 * operations one for one and are bit-identical, and so are the float numerics at the end
 * (llama.cpp's softmax, swiglu, rope and tiled attention, lane by lane). */
#include "kernels/cpu_scalar.h"
#include "kernels/kernels.h"
#include "kernels/ref.h"
#include "kernels/simd.h"

#include <immintrin.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 8")

enum {
/* activation rows per tile: their accumulators and the unpacked weight block stay in
 * registers (16 vector registers in AVX2, 32 in AVX-512, where 8 rows make a batch of 8
 * sequences one tile) */
#if WF_X86_AVX512
	TILE = 8,
#else
	TILE = 4,
#endif
	GROUP = 64, /* activation rows whose blocks are revisited per weight row (L2-resident) */
};

/* ---- helpers ------------------------------------------------------------------------------- */

INLINE float hsum_ps(__m256 v)
{
	__m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));

	s = _mm_add_ps(s, _mm_movehl_ps(s, s));
	s = _mm_add_ss(s, _mm_movehdup_ps(s));
	return _mm_cvtss_f32(s);
}

INLINE float hmax_ps(__m256 v)
{
	__m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));

	s = _mm_max_ps(s, _mm_movehl_ps(s, s));
	s = _mm_max_ss(s, _mm_movehdup_ps(s));
	return _mm_cvtss_f32(s);
}

/* acc + the sums of four u8 x s8 products, per int32 lane */
INLINE __m256i mul_sum_u8s8(__m256i acc, __m256i a, __m256i b)
{
#if WF_X86_AVX512
	return _mm256_dpbusd_epi32(acc, a, b);
#else
	return _mm256_add_epi32(
	    acc, _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1)));
#endif
}

/* pairs of u8 x s8 products summed to int16, times an int16 scale per pair, summed to int32 */
INLINE __m256i mul_sum_scaled(__m256i a, __m256i b, __m256i scale16)
{
	return _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), scale16);
}

INLINE float f16(uint16_t h)
{
	return _cvtsh_ss(h);
}

/* Software prefetch of the weights PREFETCH bytes ahead of the block being read. Decode streams
 * every weight once, and a kernel doing real work per cache line keeps too few lines in flight
 * for one core to reach the memory bandwidth on its own (measured: Q4_K from DRAM ran at a
 * third of the read bandwidth without it). Prefetches never fault, so running past the end of
 * the weights is harmless. */
enum { PREFETCH = 2048 }; /* 1 KiB to 8 KiB measured the same; none was 30% slower */

INLINE void prefetch_ahead(const void *p, size_t bytes)
{
	UNROLL for (size_t k = 0; k < bytes; k += 64)
	    _mm_prefetch((const char *)p + PREFETCH + k, _MM_HINT_T0);
}

INLINE __m256i loadu256(const void *p)
{
	return _mm256_loadu_si256((const __m256i *)p);
}

#if WF_X86_AVX512
INLINE __m512i cat256(__m256i lo, __m256i hi)
{
	return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}
#endif

/* 4 x 8 int32 in element order to 32 int8 (saturating, which the callers' ranges never reach) */
INLINE __m256i pack_i32_i8(__m256i v0, __m256i v1, __m256i v2, __m256i v3)
{
	const __m256i p =
	    _mm256_packs_epi16(_mm256_packs_epi32(v0, v1), _mm256_packs_epi32(v2, v3));

	/* packs works per 128-bit lane: dwords come out as v0lo v1lo v2lo v3lo v0hi v1hi ... */
	return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

#if WF_X86_AVX512
#define TILE_CASES_8(T)                                                                            \
	case 7:                                                                                    \
		tile_##T(7, n, wr, a, as, o, os);                                                  \
		break;                                                                             \
	case 6:                                                                                    \
		tile_##T(6, n, wr, a, as, o, os);                                                  \
		break;                                                                             \
	case 5:                                                                                    \
		tile_##T(5, n, wr, a, as, o, os);                                                  \
		break;                                                                             \
	case 4:                                                                                    \
		tile_##T(4, n, wr, a, as, o, os);                                                  \
		break;
#else
#define TILE_CASES_8(T)
#endif

/* The gemm loop around a tile function tile_<T>(C, n, w, act, act_stride, out, out_stride) that
 * writes out[c * out_stride] for its C activation rows; vec_dot is the 1 x 1 tile. */
#define GEMM(T)                                                                                    \
	static void gemm_##T(int64_t n, const void *w, size_t ws, int64_t nr, const void *act,     \
	                     size_t as, int64_t na, float *out, size_t os)                         \
	{                                                                                          \
		for (int64_t j0 = 0; j0 < na; j0 += GROUP) {                                       \
			const int64_t j1 = j0 + GROUP < na ? j0 + GROUP : na;                      \
			for (int64_t i = 0; i < nr; i++) {                                         \
				const char *wr = (const char *)w + (size_t)i * ws;                 \
				const char *a = (const char *)act + (size_t)j0 * as;               \
				float *o = out + (size_t)j0 * os + (size_t)i;                      \
				int64_t j = j0;                                                    \
				for (; j + TILE <= j1; j += TILE, a += TILE * as, o += TILE * os)  \
					tile_##T(TILE, n, wr, a, as, o, os);                       \
				switch (j1 - j) {                                                  \
					TILE_CASES_8(T)                                            \
				case 3:                                                            \
					tile_##T(3, n, wr, a, as, o, os);                          \
					break;                                                     \
				case 2:                                                            \
					tile_##T(2, n, wr, a, as, o, os);                          \
					break;                                                     \
				case 1:                                                            \
					tile_##T(1, n, wr, a, as, o, os);                          \
					break;                                                     \
				default:                                                           \
					break;                                                     \
				}                                                                  \
			}                                                                          \
		}                                                                                  \
	}                                                                                          \
	static float vec_dot_##T(int64_t n, const void *x, const void *y)                          \
	{                                                                                          \
		float r;                                                                           \
		tile_##T(1, n, x, y, 0, &r, 0);                                                    \
		return r;                                                                          \
	}

/* ---- F32, F16, BF16 ------------------------------------------------------------------------ */

#if WF_X86_AVX512
typedef __m512 vf;
enum { VL = 16 };
#define VF_ZERO()       _mm512_setzero_ps()
#define VF_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define VF_ADD(a, b)    _mm512_add_ps(a, b)
#define VF_HSUM(a)      _mm512_reduce_add_ps(a)
#define VF_LOAD_F32(p)  _mm512_loadu_ps(p)
#define VF_LOAD_F16(p)  _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#define VF_LOAD_BF16(p)                                                                            \
	_mm512_castsi512_ps(_mm512_slli_epi32(                                                     \
	    _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p))), 16))
#else
typedef __m256 vf;
enum { VL = 8 };
#define VF_ZERO()       _mm256_setzero_ps()
#define VF_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define VF_ADD(a, b)    _mm256_add_ps(a, b)
#define VF_HSUM(a)      hsum_ps(a)
#define VF_LOAD_F32(p)  _mm256_loadu_ps(p)
#define VF_LOAD_F16(p)  _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define VF_LOAD_BF16(p)                                                                            \
	_mm256_castsi256_ps(                                                                       \
	    _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p))), 16))
#endif

INLINE float scalar_f32(const void *p, int64_t i)
{
	return ((const float *)p)[i];
}
INLINE float scalar_f16(const void *p, int64_t i)
{
	return f16(((const uint16_t *)p)[i]);
}
INLINE float scalar_bf16(const void *p, int64_t i)
{
	uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

/* llamafile's tinyBLAS (what llama.cpp multiplies F32 batches of two rows or more with, the
 * MoE router among them): one chain of eight float lanes per activation row, fused multiply-adds
 * in element order, the lanes summed at the end. Eight lanes at both levels, so that they agree
 * bit for bit. */
#define F8_LOAD_F32(p) _mm256_loadu_ps(p)
#define F8_LOAD_F16(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define F8_LOAD_BF16(p)                                                                            \
	_mm256_castsi256_ps(                                                                       \
	    _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p))), 16))
#define FLOAT_TILE(T, ELT, LOAD, SCALAR)                                                           \
	INLINE void tile_##T(int C, int64_t n, const char *w, const char *act, size_t as,          \
	                     float *out, size_t os)                                                \
	{                                                                                          \
		const ELT *x = (const ELT *)w;                                                     \
		const ELT *y[TILE];                                                                \
		__m256 acc[TILE];                                                                  \
		int64_t i = 0;                                                                     \
                                                                                                   \
		UNROLL for (int c = 0; c < C; c++)                                                 \
		{                                                                                  \
			y[c] = (const ELT *)(act + (size_t)c * as);                                \
			acc[c] = _mm256_setzero_ps();                                              \
		}                                                                                  \
		for (; i + 8 <= n; i += 8) {                                                       \
			prefetch_ahead(x + i, 8 * sizeof(ELT));                                    \
			const __m256 x0 = LOAD(x + i);                                             \
			UNROLL for (int c = 0; c < C; c++) acc[c] =                                \
			    _mm256_fmadd_ps(x0, LOAD(y[c] + i), acc[c]);                           \
		}                                                                                  \
		UNROLL for (int c = 0; c < C; c++)                                                 \
		{                                                                                  \
			float s = hsum_ps(acc[c]);                                                 \
			for (int64_t k = i; k < n; k++)                                            \
				s += SCALAR(x, k) * SCALAR(y[c], k);                               \
			out[(size_t)c * os] = s;                                                   \
		}                                                                                  \
	}

FLOAT_TILE(f32, float, F8_LOAD_F32, scalar_f32)
FLOAT_TILE(f16, uint16_t, F8_LOAD_F16, scalar_f16)
FLOAT_TILE(bf16, uint16_t, F8_LOAD_BF16, scalar_bf16)
GEMM(f32)
GEMM(f16)
GEMM(bf16)

/* ---- Q8_0 and Q4_0 (x Q8_0) ---------------------------------------------------------------- */

/* One block of signed weights qx (32 int8, scale dx) into C activation rows. s8 x s8 goes
 * through u8 x s8: |qx| times qy with qx's sign (exact; |qx| <= 128, |qy| <= 127). */
INLINE void q8_block(int C, __m256i qx, float dx, const struct wf_block_q8_0 *const *y, int64_t b,
                     __m256 *acc)
{
	const __m256i ax = _mm256_sign_epi8(qx, qx);

	UNROLL for (int c = 0; c < C; c++)
	{
		const __m256i qy = loadu256(y[c][b].qs);
		const __m256i p =
		    mul_sum_u8s8(_mm256_setzero_si256(), ax, _mm256_sign_epi8(qy, qx));

		acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(dx * f16(y[c][b].d)), _mm256_cvtepi32_ps(p),
		                         acc[c]);
	}
}

INLINE __m256i q4_0_values(const struct wf_block_q4_0 *x)
{
	/* elements 0..15 are the low nibbles, 16..31 the high ones; -8 makes them signed */
	const __m128i q = _mm_loadu_si128((const __m128i *)x->qs);
	const __m256i v =
	    _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0f));

	return _mm256_sub_epi8(v, _mm256_set1_epi8(8));
}

/* ggml's Q8_0 x Q8_0 dot (ggml_vec_dot_q8_0_q8_0 of the AVX2 build, and llamafile's
 * tinyBLAS_Q0_AVX, which llama.cpp multiplies batches of two rows or more with, per element the
 * same): one chain of eight float lanes per activation row, each block's products scaled by
 * dx * dy and fused-added in block order, the lanes summed at the end. Both levels keep that
 * order (the AVX-512 one only gets its integer products from vpdpbusd), so they agree bit for
 * bit with each other and with llama.cpp. */
#define Q8_TILE(T, XBLOCK, VALUES)                                                                 \
	INLINE void tile_##T(int C, int64_t n, const char *w, const char *act, size_t as,          \
	                     float *out, size_t os)                                                \
	{                                                                                          \
		const XBLOCK *x = (const XBLOCK *)w;                                               \
		const struct wf_block_q8_0 *y[TILE];                                               \
		__m256 acc[TILE];                                                                  \
		const int64_t nb = n / WF_QK8_0;                                                   \
                                                                                                   \
		UNROLL for (int c = 0; c < C; c++)                                                 \
		{                                                                                  \
			y[c] = (const struct wf_block_q8_0 *)(act + (size_t)c * as);               \
			acc[c] = _mm256_setzero_ps();                                              \
		}                                                                                  \
		for (int64_t b = 0; b < nb; b++) {                                                 \
			prefetch_ahead(&x[b], sizeof(*x));                                         \
			q8_block(C, VALUES(&x[b]), f16(x[b].d), y, b, acc);                        \
		}                                                                                  \
		UNROLL for (int c = 0; c < C; c++) out[(size_t)c * os] = hsum_ps(acc[c]);          \
	}

#define Q8_0_VALUES(blk) loadu256((blk)->qs)
Q8_TILE(q8_0, struct wf_block_q8_0, Q8_0_VALUES)
/* Q4_0 as llama.cpp's AVX2 build computes it: it repacks every Q4_0 matrix of a multiple of 8
 * rows (q4_0_8x8, ggml-cpu/arch/x86/repack.cpp), whose gemv and gemm keep one float per output
 * element: each block's products summed exactly in int32, then acc = fma(sum, dx * dy, acc) in
 * block order, no lanes. The same here at both levels. */
INLINE int32_t hsum_epi32(__m256i v)
{
	__m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));

	s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
	s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
	return _mm_cvtsi128_si32(s);
}

INLINE void tile_q4_0(int C, int64_t n, const char *w, const char *act, size_t as, float *out,
                      size_t os)
{
	const struct wf_block_q4_0 *x = (const struct wf_block_q4_0 *)w;
	const struct wf_block_q8_0 *y[TILE];
	__m128 acc[TILE];
	const int64_t nb = n / WF_QK8_0;

	UNROLL for (int c = 0; c < C; c++)
	{
		y[c] = (const struct wf_block_q8_0 *)(act + (size_t)c * as);
		acc[c] = _mm_setzero_ps();
	}
	for (int64_t b = 0; b < nb; b++) {
		prefetch_ahead(&x[b], sizeof(*x));
		const __m256i qx = q4_0_values(&x[b]);
		const __m256i ax = _mm256_sign_epi8(qx, qx);
		const float dx = f16(x[b].d);

		UNROLL for (int c = 0; c < C; c++)
		{
			const __m256i qy = loadu256(y[c][b].qs);
			const int32_t p = hsum_epi32(
			    mul_sum_u8s8(_mm256_setzero_si256(), ax, _mm256_sign_epi8(qy, qx)));

			acc[c] = _mm_fmadd_ss(_mm_set_ss((float)p), _mm_set_ss(dx * f16(y[c][b].d)),
			                      acc[c]);
		}
	}
	UNROLL for (int c = 0; c < C; c++) out[(size_t)c * os] = _mm_cvtss_f32(acc[c]);
}

GEMM(q8_0)
GEMM(q4_0)

/* ---- K-quants (x Q8_K) --------------------------------------------------------------------- */

/* The 6-bit scales of Q4_K/Q5_K's 12 packed bytes as 8 int16 (ret_sc), and their mins as 16
 * int16, each twice (ret_mn: min j covers the 16-element groups 2j and 2j + 1). The layout is
 * ref.c's k_scale_min taken four bytes at a time, as 32-bit lanes w0, w1, w2:
 *   scales 0..3 = w0 & 0x3f..,  scales 4..7 = (w2 & 0x0f..) | ((w0 >> 2) & 0x30..),
 *   mins 0..3   = w1 & 0x3f..,  mins 4..7   = ((w2 >> 4) & 0x0f..) | ((w1 >> 2) & 0x30..).
 * Reads 16 bytes at s (the block goes on after its scales). */
INLINE void k_scales_mins(const uint8_t *s, __m128i *ret_sc, __m256i *ret_mn)
{
	const __m128i v = _mm_loadu_si128((const __m128i *)s);
	const __m128i a = _mm_shuffle_epi32(v, _MM_SHUFFLE(2, 1, 2, 0)); /* w0 w2 w1 w2 */
	const __m128i b = _mm_shuffle_epi32(v, _MM_SHUFFLE(1, 1, 0, 0)); /* w0 w0 w1 w1 */
	const __m128i lo =
	    _mm_and_si128(_mm_srlv_epi32(a, _mm_setr_epi32(0, 0, 0, 4)),
	                  _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f));
	const __m128i hi =
	    _mm_and_si128(_mm_srli_epi32(b, 2), _mm_setr_epi32(0, 0x30303030, 0, 0x30303030));
	const __m128i r = _mm_or_si128(lo, hi); /* bytes: scales 0..7, mins 0..7 */

	*ret_sc = _mm_cvtepu8_epi16(r);
	*ret_mn = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(r, r));
}

/* d and dmin of a K block (adjacent F16s) as floats in lanes 0 and 1 */
INLINE __m128 k_d_dmin(const uint16_t *d)
{
	return _mm_cvtph_ps(_mm_cvtsi32_si128((int)((uint32_t)d[0] | (uint32_t)d[1] << 16)));
}

/* Lane k (int16) of v16 (8 int16 in both 128-bit halves) in every int16 lane; k is a constant
 * after unrolling. */
INLINE __m256i bcast16(__m256i v16, int k)
{
	return _mm256_shuffle_epi8(v16, _mm256_set1_epi16((short)(0x0100 + 0x0202 * k)));
}

/* Lane k of lo8 in the low half and lane k2 in the high half (Q6_K: a scale per 16 elements). */
INLINE __m256i bcast16_2(__m256i v16, int k, int k2)
{
	const __m128i a = _mm_set1_epi16((short)(0x0100 + 0x0202 * k));
	const __m128i b = _mm_set1_epi16((short)(0x0100 + 0x0202 * k2));

	return _mm256_shuffle_epi8(v16, _mm256_set_m128i(b, a));
}

/* Bit `bit` of every byte of v, moved to bit 4 (the value 16). */
INLINE __m256i bit_to_16(__m256i v, int bit)
{
	const __m256i s = bit <= 4 ? _mm256_slli_epi16(v, 4 - bit) : _mm256_srli_epi16(v, bit - 4);

	return _mm256_and_si256(s, _mm256_set1_epi8(0x10));
}

#if !WF_X86_AVX512
/* Q4_K (qh NULL) and Q5_K: per block, per activation row, the integer sum of the scaled products
 * (8 int32 lanes) and of the mins against the activation's 16-element sums. */
INLINE void q45_K_tile(int C, int bits5, int64_t n, const char *w, const char *act, size_t as,
                       float *out, size_t os)
{
	const struct wf_block_q8_K *y[TILE];
	__m256 acc[TILE];
	const int64_t nb = n / WF_QK_K;
	const __m256i m4 = _mm256_set1_epi8(0x0f);

	UNROLL for (int c = 0; c < C; c++)
	{
		y[c] = (const struct wf_block_q8_K *)(act + (size_t)c * as);
		acc[c] = _mm256_setzero_ps();
	}
	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *scales, *qs, *qh = NULL;
		const uint16_t *dd;

		prefetch_ahead(w + (size_t)b * (bits5 ? sizeof(struct wf_block_q5_K)
		                                      : sizeof(struct wf_block_q4_K)),
		               bits5 ? sizeof(struct wf_block_q5_K) : sizeof(struct wf_block_q4_K));

		if (bits5) {
			const struct wf_block_q5_K *blk = (const struct wf_block_q5_K *)w + b;
			scales = blk->scales, qs = blk->qs, qh = blk->qh, dd = &blk->d;
		} else {
			const struct wf_block_q4_K *blk = (const struct wf_block_q4_K *)w + b;
			scales = blk->scales, qs = blk->qs, dd = &blk->d;
		}
		__m128i sc8;
		__m256i mn;
		k_scales_mins(scales, &sc8, &mn);
		const __m256i sc = _mm256_broadcastsi128_si256(sc8);
		const __m256i qhv = bits5 ? loadu256(qh) : _mm256_setzero_si256();
		__m256i sumi[TILE];

		UNROLL for (int c = 0; c < C; c++) sumi[c] = _mm256_setzero_si256();
		/* 64-element chunks: low nibbles are sub-block 2k, high nibbles 2k + 1 */
		UNROLL for (int k = 0; k < 4; k++)
		{
			const __m256i q = loadu256(qs + 32 * k);
			__m256i lo = _mm256_and_si256(q, m4);
			__m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);

			if (bits5) {
				lo = _mm256_or_si256(lo, bit_to_16(qhv, 2 * k));
				hi = _mm256_or_si256(hi, bit_to_16(qhv, 2 * k + 1));
			}
			const __m256i s_lo = bcast16(sc, 2 * k), s_hi = bcast16(sc, 2 * k + 1);

			UNROLL for (int c = 0; c < C; c++)
			{
				const __m256i p_lo =
				    mul_sum_scaled(lo, loadu256(y[c][b].qs + 64 * k), s_lo);
				const __m256i p_hi =
				    mul_sum_scaled(hi, loadu256(y[c][b].qs + 64 * k + 32), s_hi);

				sumi[c] = _mm256_add_epi32(sumi[c], _mm256_add_epi32(p_lo, p_hi));
			}
		}
		const __m128 d_dmin = k_d_dmin(dd);

		UNROLL for (int c = 0; c < C; c++)
		{
			const __m256i summ = _mm256_madd_epi16(loadu256(y[c][b].bsums), mn);
			const __m128 s = _mm_mul_ps(d_dmin, _mm_set1_ps(y[c][b].d));

			acc[c] = _mm256_fmadd_ps(_mm256_broadcastss_ps(s),
			                         _mm256_cvtepi32_ps(sumi[c]), acc[c]);
			acc[c] = _mm256_fnmadd_ps(_mm256_broadcastss_ps(_mm_movehdup_ps(s)),
			                          _mm256_cvtepi32_ps(summ), acc[c]);
		}
	}
	UNROLL for (int c = 0; c < C; c++) out[(size_t)c * os] = hsum_ps(acc[c]);
}

INLINE void tile_q4_K(int C, int64_t n, const char *w, const char *act, size_t as, float *out,
                      size_t os)
{
	q45_K_tile(C, 0, n, w, act, as, out, os);
}

INLINE void tile_q5_K(int C, int64_t n, const char *w, const char *act, size_t as, float *out,
                      size_t os)
{
	q45_K_tile(C, 1, n, w, act, as, out, os);
}

/* Q6_K: unsigned 6-bit values u = v + 32, so sum(sc * v * y) = sum(sc * u * y) - 32 * sum over
 * 16-element groups of sc * bsum, all in int32. */
INLINE void tile_q6_K(int C, int64_t n, const char *w, const char *act, size_t as, float *out,
                      size_t os)
{
	const struct wf_block_q6_K *x = (const struct wf_block_q6_K *)w;
	const struct wf_block_q8_K *y[TILE];
	__m256 acc[TILE];
	const int64_t nb = n / WF_QK_K;
	const __m256i m4 = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30);

	UNROLL for (int c = 0; c < C; c++)
	{
		y[c] = (const struct wf_block_q8_K *)(act + (size_t)c * as);
		acc[c] = _mm256_setzero_ps();
	}
	for (int64_t b = 0; b < nb; b++) {
		prefetch_ahead(&x[b], sizeof(*x));
		const __m128i sc8 = _mm_loadu_si128((const __m128i *)x[b].scales);
		const __m256i sc_all = _mm256_cvtepi8_epi16(sc8); /* 16 int16, one per group */
		__m256i sumi[TILE], corr[TILE];

		UNROLL for (int c = 0; c < C; c++)
		{
			sumi[c] = _mm256_setzero_si256();
			corr[c] = _mm256_madd_epi16(loadu256(y[c][b].bsums), sc_all);
		}
		UNROLL for (int h = 0; h < 2; h++)
		{
			/* the half's 8 scales as int16, in both 128-bit halves */
			const __m256i sc = _mm256_broadcastsi128_si256(
			    _mm_cvtepi8_epi16(h ? _mm_unpackhi_epi64(sc8, sc8) : sc8));
			const uint8_t *ql = x[b].ql + 64 * h, *qh = x[b].qh + 32 * h;
			const __m256i ql0 = loadu256(ql), ql1 = loadu256(ql + 32),
			              qhv = loadu256(qh);
			__m256i u[4];

			/* element l + 32k of the half: low nibble of ql[l + 32(k&1)] (high for k >=
			 * 2), top bits at 2k of qh[l] */
			u[0] = _mm256_or_si256(_mm256_and_si256(ql0, m4),
			                       _mm256_and_si256(_mm256_slli_epi16(qhv, 4), m30));
			u[1] = _mm256_or_si256(_mm256_and_si256(ql1, m4),
			                       _mm256_and_si256(_mm256_slli_epi16(qhv, 2), m30));
			u[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
			                       _mm256_and_si256(qhv, m30));
			u[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
			                       _mm256_and_si256(_mm256_srli_epi16(qhv, 2), m30));
			UNROLL for (int k = 0; k < 4; k++)
			{
				/* 32 elements = groups 2k and 2k+1 of the half */
				const __m256i s = bcast16_2(sc, 2 * k, 2 * k + 1);

				UNROLL for (int c = 0; c < C; c++)
				{
					const __m256i qy = loadu256(y[c][b].qs + 128 * h + 32 * k);

					sumi[c] =
					    _mm256_add_epi32(sumi[c], mul_sum_scaled(u[k], qy, s));
				}
			}
		}
		const float d = f16(x[b].d);

		UNROLL for (int c = 0; c < C; c++)
		{
			const __m256i t = _mm256_sub_epi32(sumi[c], _mm256_slli_epi32(corr[c], 5));

			acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(d * y[c][b].d),
			                         _mm256_cvtepi32_ps(t), acc[c]);
		}
	}
	UNROLL for (int c = 0; c < C; c++) out[(size_t)c * os] = hsum_ps(acc[c]);
}

#else
/* AVX-512: a 64-element chunk per register. Q4_K/Q5_K's chunk k is 32 bytes whose low nibbles
 * are sub-block 2k and high nibbles 2k + 1, i.e. elements 64k..64k+63 in order once the high
 * nibbles go to the upper half; so the activation's 64 bytes load as they are. */
/* int16 lanes 0..15 = v16[k], 16..31 = v16[k2], from 8 int16 repeated in each 128-bit lane */
INLINE __m512i bcast16_512(__m512i v16, int k, int k2)
{
	const __m512i ctl = cat256(_mm256_set1_epi16((short)(0x0100 + 0x0202 * k)),
	                           _mm256_set1_epi16((short)(0x0100 + 0x0202 * k2)));

	return _mm512_shuffle_epi8(v16, ctl);
}

/* Q4_K (bits5 0) and Q5_K. Per weight block, once per tile: the four 64-element chunks of
 * unsigned values (vpdpbusd's u8 operand as they are), each chunk's two sub-block scales as int32
 * lanes, and a float vector of d (lanes 0..7) and -dmin (lanes 8..15). Per activation row and
 * block, everything but the last two steps in int32 and exact:
 *  - vpdpbusd: per chunk, 16 lanes of four products each (lanes 0..7 sub-block 2k, 8..15
 *    2k + 1); |lane| <= 4 * 31 * 127 fits in int16, so the lane is its low int16 sign-extended;
 *  - vpdpwssd of that lane with its scale as (scale, 0) is lane * scale: one instruction scales
 *    and accumulates a chunk (vpmaddubsw + vpmaddwd + add before);
 *  - the accumulator's halves added into lanes 0..7, the mins against the activation's
 *    16-element sums (vpdpwssd again) into lanes 8..15;
 *  - one conversion and one FMA by (d, -dmin) times the row's scale into eight float lanes of
 *    each kind per row, added at the end. */
INLINE void q45_K_tile(int C, int bits5, int64_t n, const char *w, const char *act, size_t as,
                       float *out, size_t os)
{
	const struct wf_block_q8_K *y[TILE];
	__m512 acc[TILE];
	const int64_t nb = n / WF_QK_K;
	const __m512i m4 = _mm512_set1_epi8(0x0f), m16 = _mm512_set1_epi8(0x10);
	const __m512i hi4 = cat256(_mm256_setzero_si256(), _mm256_set1_epi16(4));
	const __m512i dd_idx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
	const __m128 neg_dmin = _mm_castsi128_ps(_mm_setr_epi32(0, (int)0x80000000u, 0, 0));

	UNROLL for (int c = 0; c < C; c++)
	{
		y[c] = (const struct wf_block_q8_K *)(act + (size_t)c * as);
		acc[c] = _mm512_setzero_ps();
	}
	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *scales, *qs, *qh = NULL;
		const uint16_t *dd;

		prefetch_ahead(w + (size_t)b * (bits5 ? sizeof(struct wf_block_q5_K)
		                                      : sizeof(struct wf_block_q4_K)),
		               bits5 ? sizeof(struct wf_block_q5_K) : sizeof(struct wf_block_q4_K));

		if (bits5) {
			const struct wf_block_q5_K *blk = (const struct wf_block_q5_K *)w + b;
			scales = blk->scales, qs = blk->qs, qh = blk->qh, dd = &blk->d;
		} else {
			const struct wf_block_q4_K *blk = (const struct wf_block_q4_K *)w + b;
			scales = blk->scales, qs = blk->qs, dd = &blk->d;
		}
		__m128i sc8;
		__m256i mn;
		k_scales_mins(scales, &sc8, &mn);
		const __m512 dvec = _mm512_permutexvar_ps(
		    dd_idx, _mm512_castps128_ps512(_mm_xor_ps(k_d_dmin(dd), neg_dmin)));
		const __m512i sc32 = _mm512_cvtepu16_epi32(_mm256_castsi128_si256(sc8));
		const __m512i mn_hi = _mm512_inserti64x4(_mm512_setzero_si512(), mn, 1);
		__m512i v[4], s[4];

		/* chunk k: low nibbles of qs[32k..32k+31] then their high nibbles (the 32 bytes
		 * broadcast to both halves, the upper half shifted by 4) */
		UNROLL for (int k = 0; k < 4; k++)
		{
			v[k] = _mm512_and_si512(
			    _mm512_srlv_epi16(_mm512_broadcast_i64x4(loadu256(qs + 32 * k)), hi4),
			    m4);
			s[k] = _mm512_permutexvar_epi32(
			    cat256(_mm256_set1_epi32(2 * k), _mm256_set1_epi32(2 * k + 1)), sc32);
		}
		if (bits5) {
			/* bit 2k of qh[l] is the fifth bit of element l of chunk k, bit 2k + 1 that
			 * of element 32 + l */
			const __m512i qh2 = _mm512_broadcast_i64x4(loadu256(qh));

			UNROLL for (int k = 0; k < 4; k++)
			{
				const __m512i bits =
				    cat256(_mm256_set1_epi8((char)(1 << (2 * k))),
				           _mm256_set1_epi8((char)(1 << (2 * k + 1))));

				v[k] = _mm512_mask_add_epi8(v[k], _mm512_test_epi8_mask(qh2, bits),
				                            v[k], m16);
			}
		}
		UNROLL for (int c = 0; c < C; c++)
		{
			__m512i p = _mm512_setzero_si512();

			UNROLL for (int k = 0; k < 4; k++)
			{
				const __m512i q4 =
				    _mm512_dpbusd_epi32(_mm512_setzero_si512(), v[k],
				                        _mm512_loadu_si512(y[c][b].qs + 64 * k));

				p = _mm512_dpwssd_epi32(p, q4, s[k]);
			}
			const __m512i m = _mm512_dpwssd_epi32(
			    _mm512_setzero_si512(), _mm512_broadcast_i64x4(loadu256(y[c][b].bsums)),
			    mn_hi);
			const __m512i t = _mm512_mask_add_epi32(
			    m, 0x00ff, p, _mm512_shuffle_i64x2(p, p, _MM_SHUFFLE(1, 0, 3, 2)));

			acc[c] =
			    _mm512_fmadd_ps(_mm512_cvtepi32_ps(t),
			                    _mm512_mul_ps(dvec, _mm512_set1_ps(y[c][b].d)), acc[c]);
		}
	}
	UNROLL for (int c = 0; c < C; c++) out[(size_t)c * os] = _mm512_reduce_add_ps(acc[c]);
}

INLINE void tile_q4_K(int C, int64_t n, const char *w, const char *act, size_t as, float *out,
                      size_t os)
{
	q45_K_tile(C, 0, n, w, act, as, out, os);
}

INLINE void tile_q5_K(int C, int64_t n, const char *w, const char *act, size_t as, float *out,
                      size_t os)
{
	q45_K_tile(C, 1, n, w, act, as, out, os);
}

/* Q6_K as below, 64 elements per register: a half's 64 ql bytes are elements 0..63 (low nibbles)
 * and 64..127 (high nibbles) of the half, their top bits are bit pairs 0,1 / 2,3 (first 64) and
 * 4,5 / 6,7 (last 64) of the same 32 qh bytes. */
INLINE void tile_q6_K(int C, int64_t n, const char *w, const char *act, size_t as, float *out,
                      size_t os)
{
	const struct wf_block_q6_K *x = (const struct wf_block_q6_K *)w;
	const struct wf_block_q8_K *y[TILE];
	__m512 acc[TILE];
	const int64_t nb = n / WF_QK_K;
	const __m512i m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);

	UNROLL for (int c = 0; c < C; c++)
	{
		y[c] = (const struct wf_block_q8_K *)(act + (size_t)c * as);
		acc[c] = _mm512_setzero_ps();
	}
	for (int64_t b = 0; b < nb; b++) {
		prefetch_ahead(&x[b], sizeof(*x));
		const __m256i sc_all =
		    _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x[b].scales));
		const __m512i sc512 = _mm512_castsi256_si512(sc_all);
		__m512i sumi[TILE];
		__m256i corr[TILE];

		UNROLL for (int c = 0; c < C; c++)
		{
			sumi[c] = _mm512_setzero_si512();
			corr[c] = _mm256_madd_epi16(loadu256(y[c][b].bsums), sc_all);
		}
		UNROLL for (int h = 0; h < 2; h++)
		{
			const __m512i ql = _mm512_loadu_si512(x[b].ql + 64 * h);
			const __m256i qhv = loadu256(x[b].qh + 32 * h);
			const __m512i qh2 = cat256(qhv, _mm256_srli_epi16(qhv, 2));
			__m512i u[2];

			u[0] = _mm512_or_si512(_mm512_and_si512(ql, m4),
			                       _mm512_and_si512(_mm512_slli_epi16(qh2, 4), m30));
			u[1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
			                       _mm512_and_si512(qh2, m30));
			UNROLL for (int k = 0; k < 2; k++)
			{
				/* 64 elements = groups g0..g0+3, one per 128-bit lane */
				const int g0 = 8 * h + 4 * k;
				const __m512i idx = _mm512_set_epi16(
				    g0 + 3, g0 + 3, g0 + 3, g0 + 3, g0 + 3, g0 + 3, g0 + 3, g0 + 3,
				    g0 + 2, g0 + 2, g0 + 2, g0 + 2, g0 + 2, g0 + 2, g0 + 2, g0 + 2,
				    g0 + 1, g0 + 1, g0 + 1, g0 + 1, g0 + 1, g0 + 1, g0 + 1, g0 + 1,
				    g0, g0, g0, g0, g0, g0, g0, g0);
				const __m512i s = _mm512_permutexvar_epi16(idx, sc512);

				UNROLL for (int c = 0; c < C; c++)
				{
					const __m512i qy =
					    _mm512_loadu_si512(y[c][b].qs + 128 * h + 64 * k);

					sumi[c] = _mm512_add_epi32(
					    sumi[c],
					    _mm512_madd_epi16(_mm512_maddubs_epi16(u[k], qy), s));
				}
			}
		}
		const float d = f16(x[b].d);

		UNROLL for (int c = 0; c < C; c++)
		{
			const __m512i corr512 = _mm512_inserti64x4(
			    _mm512_setzero_si512(), _mm256_slli_epi32(corr[c], 5), 0);
			const __m512i t = _mm512_sub_epi32(sumi[c], corr512);

			acc[c] = _mm512_fmadd_ps(_mm512_set1_ps(d * y[c][b].d),
			                         _mm512_cvtepi32_ps(t), acc[c]);
		}
	}
	UNROLL for (int c = 0; c < C; c++) out[(size_t)c * os] = _mm512_reduce_add_ps(acc[c]);
}

#endif

GEMM(q4_K)
GEMM(q5_K)
GEMM(q6_K)

/* ---- Activation quantizers (bit-identical to ref.c) ---------------------------------------- */

/* max(|x|) over 8k floats; max_ps returns its second operand when the first is NaN, so a NaN is
 * skipped as ref.c's `fabsf(x) > amax` skips it. */
INLINE float amax_ps(const float *x, int k)
{
	const __m256 sign = _mm256_set1_ps(-0.0f);
	__m256 m = _mm256_setzero_ps();

	for (int i = 0; i < k; i += 8)
		m = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)), m);
	return hmax_ps(m);
}

static void quantize_row_q8_0(const float *x, void *vy, int64_t n)
{
	struct wf_block_q8_0 *yb = vy;

	for (int64_t b = 0; b < n / WF_QK8_0; b++, x += WF_QK8_0) {
		const float amax = amax_ps(x, WF_QK8_0);
		const float d = amax / 127.0f;
		const __m256 id = _mm256_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
		__m256i v[4];

		yb[b].d = wf_kernels_fp32_to_fp16(d);
		for (int q = 0; q < 4; q++)
			v[q] = _mm256_cvtps_epi32(
			    _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * q), id),
			                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
		_mm256_storeu_si256((__m256i *)yb[b].qs, pack_i32_i8(v[0], v[1], v[2], v[3]));
	}
}

static void quantize_row_q8_K(const float *x, void *vy, int64_t n)
{
	struct wf_block_q8_K *yb = vy;
	const __m256 sign = _mm256_set1_ps(-0.0f);

	for (int64_t b = 0; b < n / WF_QK_K; b++, x += WF_QK_K) {
		const float amax = amax_ps(x, WF_QK_K);

		if (amax == 0.0f) {
			memset(&yb[b], 0, sizeof(yb[b]));
			continue;
		}
		/* the first element of that magnitude gives the sign, as in ref.c */
		const __m256 vam = _mm256_set1_ps(amax);
		float max = amax;
		for (int i = 0; i < WF_QK_K; i += 8) {
			const __m256 a = _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i));
			const int m = _mm256_movemask_ps(_mm256_cmp_ps(a, vam, _CMP_EQ_OQ));

			if (m) {
				max = x[i + __builtin_ctz((unsigned)m)];
				break;
			}
		}
		const float iscale = -127.0f / max;
		const __m256 vis = _mm256_set1_ps(iscale);
		const __m256i lim = _mm256_set1_epi32(127);

		for (int i = 0; i < WF_QK_K; i += 32) {
			__m256i v[4];

			for (int q = 0; q < 4; q++) {
				const __m256 r = _mm256_round_ps(
				    _mm256_mul_ps(vis, _mm256_loadu_ps(x + i + 8 * q)),
				    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
				v[q] = _mm256_min_epi32(_mm256_cvtps_epi32(r), lim);
			}
			const __m256i q8 = pack_i32_i8(v[0], v[1], v[2], v[3]);
			_mm256_storeu_si256((__m256i *)(yb[b].qs + i), q8);
			/* sums by 16: pairs, quads, then the two 16s at lanes 0 and 4 */
			__m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), q8),
			                              _mm256_set1_epi16(1));
			s = _mm256_hadd_epi32(s, s);
			s = _mm256_hadd_epi32(s, s);
			yb[b].bsums[i / 16] = (int16_t)_mm256_extract_epi32(s, 0);
			yb[b].bsums[i / 16 + 1] = (int16_t)_mm256_extract_epi32(s, 4);
		}
		yb[b].d = 1.0f / iscale;
	}
}

/* F16C rounds to nearest even like the reference; only NaN differs (the hardware keeps the
 * payload, the reference writes the canonical quiet NaN), so NaN lanes take the reference. */
static void quantize_row_f16(const float *x, void *vy, int64_t n)
{
	uint16_t *h = vy;
	int64_t i = 0;

	for (; i + 8 <= n; i += 8) {
		const __m256 v = _mm256_loadu_ps(x + i);

		_mm_storeu_si128((__m128i *)(h + i),
		                 _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
		if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)))
			for (int k = 0; k < 8; k++)
				h[i + k] = wf_kernels_fp32_to_fp16(x[i + k]);
	}
	for (; i < n; i++)
		h[i] = wf_kernels_fp32_to_fp16(x[i]);
}

static void quantize_row_bf16(const float *x, void *vy, int64_t n)
{
	uint16_t *h = vy;
	int64_t i = 0;
	const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);

	for (; i + 16 <= n; i += 16) {
		__m256i r[2];

		for (int q = 0; q < 2; q++) {
			const __m256i w = _mm256_loadu_si256((const __m256i *)(x + i + 8 * q));
			const __m256i hi = _mm256_srli_epi32(w, 16);
			const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(w, abs_mask), inf);
			const __m256i bias = _mm256_add_epi32(
			    _mm256_set1_epi32(0x7fff), _mm256_and_si256(hi, _mm256_set1_epi32(1)));
			const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(w, bias), 16);

			r[q] = _mm256_blendv_epi8(
			    rounded, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
		}
		/* packus works per 128-bit lane; the permute puts the quads back in order */
		_mm256_storeu_si256((__m256i *)(h + i), _mm256_permute4x64_epi64(
		                                            _mm256_packus_epi32(r[0], r[1]), 0xd8));
	}
	for (; i < n; i++)
		h[i] = wf_kernels_fp32_to_bf16(x[i]);
}

/* ---- llama.cpp's float numerics (bit-identical to kernels/cpu_ops.c) ------------------------ */

/* Each lane computes the reference's scalar operations one for one (cpu_scalar.h): a vector
 * fused multiply-add rounds each lane as fmaf does, and lanes never mix except where the
 * reference adds them in the same order (hsum_ps: ((0+4)+(2+6))+((1+5)+(3+7)), which is
 * ggml_vec_soft_max_f32's). Both levels run the same 8-lane code: the results are the
 * reference's either way, and the work here is small beside the products. */

/* wf__cpu_v_expf on 8 lanes: ggml_v_expf of the AVX2 build (ggml-cpu/vec.h), the special cases
 * chosen per lane as its blends choose them. */
INLINE __m256 v_expf8(__m256 x)
{
	const __m256 r = _mm256_set1_ps(0x1.8p23f);
	const __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(0x1.715476p+0f), r);
	const __m256 n = _mm256_sub_ps(z, r);
	const __m256 b = _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.7f7d1cp-20f),
	                                  _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.62e4p-1f), x));
	const __m256i e = _mm256_slli_epi32(_mm256_castps_si256(z), 23);
	const __m256 k = _mm256_castsi256_ps(_mm256_add_epi32(e, _mm256_set1_epi32(0x3f800000)));
	const __m256 an = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), n);
	const __m256 c = _mm256_cmp_ps(an, _mm256_set1_ps(126.0f), _CMP_GT_OQ);
	const __m256 u = _mm256_mul_ps(b, b);
	const __m256 j = _mm256_fmadd_ps(
	    _mm256_fmadd_ps(
	        _mm256_fmadd_ps(_mm256_set1_ps(0x1.0e4020p-7f), b, _mm256_set1_ps(0x1.573e2ep-5f)),
	        u,
	        _mm256_fmadd_ps(_mm256_set1_ps(0x1.555e66p-3f), b, _mm256_set1_ps(0x1.fffdb6p-2f))),
	    u, _mm256_mul_ps(_mm256_set1_ps(0x1.ffffecp-1f), b));
	const __m256 plain = _mm256_fmadd_ps(j, k, k);
	if (!_mm256_movemask_ps(c))
		return plain;
	const __m256i g =
	    _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ)),
	                     _mm256_set1_epi32((int)0x82000000u));
	const __m256 s1 = _mm256_castsi256_ps(_mm256_add_epi32(g, _mm256_set1_epi32(0x7f000000)));
	const __m256 s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
	const __m256 d = _mm256_cmp_ps(an, _mm256_set1_ps(192.0f), _CMP_GT_OQ);
	const __m256 big = _mm256_blendv_ps(_mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1),
	                                    _mm256_mul_ps(s1, s1), d);
	return _mm256_blendv_ps(plain, big, c);
}

/* wf_cpu_softmax: the maximum as the reference folds it, ggml_v_expf eight at a time with each
 * eight summed in hsum order, the sums in double, the tail with libm's expf. */
static void softmax_f32(float *x, uint32_t n)
{
	float max = -INFINITY;
	for (uint32_t i = 0; i < n; i++)
		max = x[i] > max ? x[i] : max;
	const __m256 vmax = _mm256_set1_ps(max);
	double sum = 0.0;
	uint32_t i = 0;
	for (; i + 8 <= n; i += 8) {
		const __m256 l = v_expf8(_mm256_sub_ps(_mm256_loadu_ps(x + i), vmax));
		_mm256_storeu_ps(x + i, l);
		sum += (double)hsum_ps(l);
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

/* wf_cpu_swiglu: g / (1 + ggml_v_expf(0 - g)) * u eight at a time, the tail with expf. */
static void swiglu_f32(const float *g, const float *u, float *y, uint32_t n)
{
	const __m256 one = _mm256_set1_ps(1.0f);
	uint32_t i = 0;
	for (; i + 8 <= n; i += 8) {
		const __m256 gv = _mm256_loadu_ps(g + i);
		const __m256 e = v_expf8(_mm256_sub_ps(_mm256_setzero_ps(), gv));
		_mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(one, e)),
		                                      _mm256_loadu_ps(u + i)));
	}
	for (; i < n; i++)
		y[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* wf_cpu_rope: the reference's loop, its fmaf one instruction here. */
static void rope_f32(float *x, uint32_t n_dims, const float *cs, bool neox)
{
	wf__cpu_rope_rotate(x, n_dims, cs, neox);
}

/* F16 to F32 (exact either way) */
INLINE void f16_row(const uint16_t *h, float *y, uint32_t n)
{
	uint32_t i = 0;
	for (; i + 8 <= n; i += 8)
		_mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
	for (; i < n; i++)
		y[i] = f16(h[i]);
}

/* rows r[0..7] of an 8 x 8 block become its columns */
INLINE void transpose8_ps(__m256 *r)
{
	const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
	const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
	const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
	const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
	const __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xee);
	const __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xee);
	const __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xee);
	const __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xee);

	r[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
	r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
	r[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
	r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
	r[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
	r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
	r[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
	r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

/* tile_max of the reference: `m = m > x ? m : x` over the tile, which max_ps is lane by lane.
 * Without NaN the lanes' order cannot show (only the sign of a zero maximum could, and no result
 * depends on it: it is subtracted from scores, compared, or subtracted from a smaller M); with a
 * NaN in the tile the reference's fold is taken as it is. */
INLINE float tile_max_ps(const float *kq)
{
	__m256 m = _mm256_set1_ps(-INFINITY), nan = _mm256_setzero_ps();

	for (int i = 0; i < WF_KERNELS_FA_TILE; i += 8) {
		const __m256 x = _mm256_loadu_ps(kq + i);
		m = _mm256_max_ps(m, x);
		nan = _mm256_or_ps(nan, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
	}
	if (!_mm256_movemask_ps(nan))
		return hmax_ps(m);
	float t = -INFINITY;
	for (int i = 0; i < WF_KERNELS_FA_TILE; i++)
		t = t > kq[i] ? t : kq[i];
	return t;
}

/* acc[d] = fma(v[tk][d], p[tk], acc[d]) for tk < nt in order, d < D: each element's chain is the
 * reference's; eight vectors of d at a time so that eight chains are in flight. */
static void tile_pv(float *acc, const float *vt, const float *p, uint32_t nt, uint32_t D)
{
	uint32_t d0 = 0;
	for (; d0 + 64 <= D; d0 += 64) {
		__m256 a[8];
		UNROLL for (int c = 0; c < 8; c++) a[c] = _mm256_loadu_ps(acc + d0 + 8 * c);
		for (uint32_t tk = 0; tk < nt; tk++) {
			const __m256 w = _mm256_broadcast_ss(p + tk);
			const float *vr = vt + (size_t)tk * D + d0;
			UNROLL for (int c = 0; c < 8; c++) a[c] =
			    _mm256_fmadd_ps(_mm256_loadu_ps(vr + 8 * c), w, a[c]);
		}
		UNROLL for (int c = 0; c < 8; c++) _mm256_storeu_ps(acc + d0 + 8 * c, a[c]);
	}
	for (; d0 + 8 <= D; d0 += 8) {
		__m256 a = _mm256_loadu_ps(acc + d0);
		for (uint32_t tk = 0; tk < nt; tk++)
			a = _mm256_fmadd_ps(_mm256_loadu_ps(vt + (size_t)tk * D + d0),
			                    _mm256_broadcast_ss(p + tk), a);
		_mm256_storeu_ps(acc + d0, a);
	}
	for (; d0 < D; d0++)
		for (uint32_t tk = 0; tk < nt; tk++)
			acc[d0] = fmaf(vt[(size_t)tk * D + d0], p[tk], acc[d0]);
}

/* wf__cpu_attend_tiled_ref (kernels.h, attend_tiled), its rows side by side. Per tile: the K and
 * V rows converted to F32 once for every query row; the scores with the query rows in the lanes
 * (qt: the rows transposed), so each score is the reference's one fused multiply-add chain over
 * the head, eight positions' chains in flight; then each row's softmax step and V product, as
 * the reference's, vectorized over positions (the exponentials) and over the head (the V
 * chains). */
static void attend_tiled(uint32_t n_q, const float *q, size_t q_stride, const uint32_t *n_kv,
                         const uint8_t *k, const uint8_t *v, size_t kv_stride, uint32_t D,
                         float scale, float *scratch, float *out, size_t out_stride)
{
	enum { T = WF_KERNELS_FA_TILE, R = WF_KERNELS_FA_ROWS };
	_Static_assert(R == 8 && T % 8 == 0, "one lane per query row, tiles of whole vectors");
	float *kf = scratch;     /* T x D: the tile's K rows */
	float *vt = kf + T * D;  /* T x D: its V rows */
	float *qt = vt + T * D;  /* D x R: the query rows transposed */
	float *acc = qt + R * D; /* R x D: VKQ32 per row */
	float *kq = acc + R * D; /* R x T: scores, then probabilities, per row */
	float M[R], S[R];
	uint32_t max_kv = 0;

	for (uint32_t r = 0; r < R; r++) {
		for (uint32_t d = 0; d < D; d++)
			qt[(size_t)d * R + r] = r < n_q ? q[r * q_stride + d] : 0.0f;
		if (r < n_q) {
			max_kv = n_kv[r] > max_kv ? n_kv[r] : max_kv;
			memset(acc + (size_t)r * D, 0, D * sizeof(float));
			M[r] = -INFINITY;
			S[r] = 0.0f;
		}
	}
	const __m256 vscale = _mm256_set1_ps(scale);
	for (uint32_t ic = 0; ic < max_kv; ic += T) {
		const uint32_t nt_max = max_kv - ic < T ? max_kv - ic : T;
		const uint32_t n8 = (nt_max + 7) & ~7u;
		for (uint32_t tk = 0; tk < nt_max; tk++) {
			f16_row((const uint16_t *)(k + (size_t)(ic + tk) * kv_stride),
			        kf + (size_t)tk * D, D);
			f16_row((const uint16_t *)(v + (size_t)(ic + tk) * kv_stride),
			        vt + (size_t)tk * D, D);
		}
		memset(kf + (size_t)nt_max * D, 0, (size_t)(n8 - nt_max) * D * sizeof(float));
		/* simd_gemm: s = fma(k[d], q[d], s) from d = 0, then ggml_vec_scale_f32 */
		for (uint32_t t0 = 0; t0 < n8; t0 += 8) {
			__m256 s[8];
			UNROLL for (int j = 0; j < 8; j++) s[j] = _mm256_setzero_ps();
			const float *kr = kf + (size_t)t0 * D;
			for (uint32_t d = 0; d < D; d++) {
				const __m256 qd = _mm256_loadu_ps(qt + (size_t)d * R);
				UNROLL for (int j = 0; j < 8; j++) s[j] = _mm256_fmadd_ps(
				    _mm256_broadcast_ss(kr + (size_t)j * D + d), qd, s[j]);
			}
			UNROLL for (int j = 0; j < 8; j++) s[j] = _mm256_mul_ps(s[j], vscale);
			transpose8_ps(s);
			UNROLL for (int r = 0; r < 8; r++) _mm256_storeu_ps(kq + r * T + t0, s[r]);
		}
		for (uint32_t r = 0; r < n_q; r++) {
			if (ic >= n_kv[r])
				continue; /* the row's positions ended before this tile */
			const uint32_t nt = n_kv[r] - ic < T ? n_kv[r] - ic : T;
			float *p = kq + r * T, *a = acc + (size_t)r * D;
			for (uint32_t tk = nt; tk < T; tk++)
				p[tk] = -INFINITY; /* the causal mask */
			const float tile_max = tile_max_ps(p);
			if (tile_max == -INFINITY)
				continue;
			const float m_new = fmaxf(M[r], tile_max);
			if (m_new > M[r]) {
				const float ms = expf(M[r] - m_new);
				const __m256 vms = _mm256_set1_ps(ms);
				uint32_t d = 0;
				for (; d + 8 <= D; d += 8)
					_mm256_storeu_ps(
					    a + d, _mm256_mul_ps(_mm256_loadu_ps(a + d), vms));
				for (; d < D; d++)
					a[d] *= ms;
				S[r] *= ms;
			}
			M[r] = m_new;
			const __m256 vm = _mm256_set1_ps(m_new);
			double sum = 0.0;
			for (uint32_t g = 0; g < T; g += 8) {
				const __m256 l = v_expf8(_mm256_sub_ps(_mm256_loadu_ps(p + g), vm));
				_mm256_storeu_ps(p + g, l);
				sum += (double)hsum_ps(l);
			}
			S[r] = (float)((double)S[r] + sum);
			tile_pv(a, vt, p, nt, D);
		}
	}
	for (uint32_t r = 0; r < n_q; r++) {
		const float inv = S[r] == 0.0f ? 0.0f : 1.0f / S[r];
		const float *a = acc + (size_t)r * D;
		float *o = out + r * out_stride;
		for (uint32_t d = 0; d < D; d++)
			o[d] = a[d] * inv;
	}
}

/* ---- the level's table ----------------------------------------------------------------------- */

void WF_X86_FILL(struct wf_kernel_ops *ops)
{
#define SET(DT, T)                                                                                 \
	do {                                                                                       \
		ops->types[WF_DTYPE_##DT].vec_dot = vec_dot_##T;                                   \
		ops->types[WF_DTYPE_##DT].gemm = gemm_##T;                                         \
	} while (0)
	SET(F32, f32);
	SET(F16, f16);
	SET(BF16, bf16);
	SET(Q8_0, q8_0);
	SET(Q4_0, q4_0);
	SET(Q4_K, q4_K);
	SET(Q5_K, q5_K);
	SET(Q6_K, q6_K);
#undef SET
	ops->from_float[WF_DTYPE_F16] = quantize_row_f16;
	ops->from_float[WF_DTYPE_BF16] = quantize_row_bf16;
	ops->from_float[WF_DTYPE_Q8_0] = quantize_row_q8_0;
	ops->from_float[WF_DTYPE_Q8_K] = quantize_row_q8_K;
	ops->softmax = softmax_f32;
	ops->swiglu = swiglu_f32;
	ops->rope = rope_f32;
	ops->attend_tiled = attend_tiled;
}
