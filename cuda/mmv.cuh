/* One lane's share of the mat-vec path's dot products (matmul.cu), __host__ __device__ so that
 * the unit tests run these very functions lane by lane on the CPU (wf__cuda_matvec_host).
 *
 * Coalescing. A warp takes one weight row. For the quantized types, lanes_per_block (LPB) lanes
 * share a block and each reads its own consecutive 4 to 12 bytes of it, so the warp reads
 * 32 / LPB consecutive blocks at a time (Q8_0: 8 x 34 B; Q4_0: 8 x 18 B; Q4_K, Q5_K: 2 x 144
 * or 176 B; Q6_K: 2 x 210 B), and the activations' matching int8 values as aligned 4-byte words
 * (the lanes of a block read 32 to 256 consecutive bytes). The float types take 8 elements per
 * lane per step (16- or 32-byte loads of the row and of the activations: the warp reads 512 or
 * 1024 consecutive bytes) when rows are 16-byte aligned and ne0 % 8 == 0 (VEC), else one
 * element per lane per step (the warp reads 32 consecutive elements). This replaces the old
 * kernel's one 8-element group per lane (32 B lane stride on x, byte loads of the weights:
 * about 12 % of HBM by the review's count).
 *
 * Arithmetic. Quantized blocks are dotted in integers, exactly the CPU's block sums
 * (kernels/ref.c): Q8_0 and Q4_0 against Q8_0 activations; the K-quants against Q8_K, with the
 * mins taken against the activations' own sums (the CPU's bsums, summed here by dp4a with ones:
 * the same integers). Each lane scales its integer share in float as the CPU scales a block
 * (Q8_0: sum * (dw * dx); Q4_0: (sum * dw) * dx; K: (dw * dx) * sum - (dmin * dx) * mins), and
 * the float shares are added across the block's lanes and blocks: only that order differs
 * from the CPU. F16 and BF16 products are exact in float; F32 products round as the CPU's do,
 * the sums are float (the CPU's double). */
#ifndef WF_CUDA_MMV_CUH
#define WF_CUDA_MMV_CUH

#include "cuda/quant.cuh"

#define WF_MV_FN static __host__ __device__ __forceinline__
/* Unrolled on the device (the N accumulators stay in registers); the host compiler does not
 * know the pragma. */
#ifdef __CUDA_ARCH__
#define WF_MV_UNROLL _Pragma("unroll")
/* The row loops unrolled (for few activation rows: more registers would spill) so that a lane
 * issues the loads of 2 blocks (quantized) or 4 x 16 bytes (float types) before it waits on the
 * first: with one weight row per warp, this is what keeps enough bytes in flight per SM to
 * approach the memory's bandwidth (Little's law: ~3.35 TB/s x ~0.6 us = ~15 KB per SM on an H100;
 * 64 warps x 2 x 288 B of Q4_K blocks). Sums stay in the same order: the host twin's results are
 * unchanged. N is the lane function's template argument. */
#define WF_MV_UNROLL2 _Pragma("unroll (N <= 4 ? 2 : 1)")
#define WF_MV_UNROLL4 _Pragma("unroll (N <= 2 ? 4 : N <= 8 ? 2 : 1)")
#else
#define WF_MV_UNROLL
#define WF_MV_UNROLL2
#define WF_MV_UNROLL4
#endif

/* The activation rows a lane reads: for quantized weights, the int8 values (row j at
 * qs + j * stride) and their per-block d (the float at align16(ne0) in the row). */
struct wf_mv_act {
	const uint8_t *base;
	size_t stride; /* bytes between rows */
	int64_t d_off; /* where a row's d floats start */
};

WF_MV_FN const int8_t *wf_mv_qs(const wf_mv_act &a, int j)
{
	return reinterpret_cast<const int8_t *>(a.base + (size_t)j * a.stride);
}

WF_MV_FN const float *wf_mv_d(const wf_mv_act &a, int j)
{
	return reinterpret_cast<const float *>(a.base + (size_t)j * a.stride + a.d_off);
}

template <enum wf_dtype T> struct wf_mv;

/* Q8_0: 34-byte blocks (d, 32 int8), 4 lanes per block, 8 values each. */
template <> struct wf_mv<WF_DTYPE_Q8_0> {
	static constexpr int QK = 32, BYTES = 34, LPB = 4;
	struct w_t {
		uint32_t q[2];
		float d;
	};
	WF_MV_FN void decode(const uint8_t *blk, int sub, w_t &w)
	{
		w.d = wf_dq_h2f(wf_dq_u16(blk));
		w.q[0] = wf_ld4_a2(blk + 2 + 8 * sub);
		w.q[1] = wf_ld4_a2(blk + 2 + 8 * sub + 4);
	}
	WF_MV_FN float dot(const w_t &w, const int8_t *qs, const float *d, int64_t b, int sub)
	{
		const int8_t *x = qs + 32 * b + 8 * sub;
		const int s =
		    wf_dp4a((int)w.q[1], wf_ld4i(x + 4), wf_dp4a((int)w.q[0], wf_ld4i(x), 0));
		return (float)s * (w.d * d[b]);
	}
};

/* Q4_0: 18-byte blocks (d, 16 bytes: element j < 16 in the low nibble of byte j, j + 16 in its
 * high one), 4 lanes per block: lane i takes bytes 4i..4i+3, elements 4i.. and 16+4i.. */
template <> struct wf_mv<WF_DTYPE_Q4_0> {
	static constexpr int QK = 32, BYTES = 18, LPB = 4;
	struct w_t {
		uint32_t lo, hi;
		float d;
	};
	WF_MV_FN void decode(const uint8_t *blk, int sub, w_t &w)
	{
		const uint32_t q = wf_ld4_a2(blk + 2 + 4 * sub);
		w.d = wf_dq_h2f(wf_dq_u16(blk));
		w.lo = wf_vsub4(q & 0x0f0f0f0fu, 0x08080808u);
		w.hi = wf_vsub4((q >> 4) & 0x0f0f0f0fu, 0x08080808u);
	}
	WF_MV_FN float dot(const w_t &w, const int8_t *qs, const float *d, int64_t b, int sub)
	{
		const int8_t *x = qs + 32 * b + 4 * sub;
		const int s =
		    wf_dp4a((int)w.hi, wf_ld4i(x + 16), wf_dp4a((int)w.lo, wf_ld4i(x), 0));
		return ((float)s * w.d) * d[b];
	}
};

/* Q4_K and Q5_K: 16 lanes per block; lane i takes chunk c = i / 4 (64 elements) and bytes
 * p = 8 (i % 4) .. p + 7 of its 32 nibble bytes: elements 64c + p .. +7 (low nibbles, sub-block
 * 2c) and 64c + 32 + p .. +7 (high nibbles, 2c + 1). Q5_K's fifth bits: bits 2c and 2c + 1 of
 * qh[p .. p + 7]. */
template <bool Q5> struct wf_mv_k45 {
	static constexpr int QK = 256, BYTES = Q5 ? 176 : 144, LPB = 16;
	struct w_t {
		uint32_t lo[2], hi[2];
		int sc_lo, sc_hi, m_lo, m_hi;
		float d, dmin;
	};
	WF_MV_FN void decode(const uint8_t *blk, int sub, w_t &w)
	{
		const int c = sub / 4, p = 8 * (sub % 4);
		const uint8_t *qs = blk + (Q5 ? 48 : 16) + 32 * c + p;
		w.d = wf_dq_h2f(wf_dq_u16(blk));
		w.dmin = wf_dq_h2f(wf_dq_u16(blk + 2));
		wf_dq_k_scale_min(blk + 4, 2 * c, &w.sc_lo, &w.m_lo);
		wf_dq_k_scale_min(blk + 4, 2 * c + 1, &w.sc_hi, &w.m_hi);
		for (int h = 0; h < 2; h++) {
			const uint32_t q = wf_ld4(qs + 4 * h);
			w.lo[h] = q & 0x0f0f0f0fu;
			w.hi[h] = (q >> 4) & 0x0f0f0f0fu;
			if (Q5) {
				const uint32_t qh = wf_ld4(blk + 16 + p + 4 * h);
				w.lo[h] |= ((qh >> (2 * c)) & 0x01010101u) << 4;
				w.hi[h] |= ((qh >> (2 * c + 1)) & 0x01010101u) << 4;
			}
		}
	}
	WF_MV_FN float dot(const w_t &w, const int8_t *qs, const float *d, int64_t b, int sub)
	{
		const int8_t *x = qs + 256 * b + 64 * (sub / 4) + 8 * (sub % 4);
		const int x0 = wf_ld4i(x), x1 = wf_ld4i(x + 4);
		const int x2 = wf_ld4i(x + 32), x3 = wf_ld4i(x + 36);
		const int il = wf_dp4a((int)w.lo[1], x1, wf_dp4a((int)w.lo[0], x0, 0));
		const int ih = wf_dp4a((int)w.hi[1], x3, wf_dp4a((int)w.hi[0], x2, 0));
		const int sl = wf_dp4a(0x01010101, x1, wf_dp4a(0x01010101, x0, 0));
		const int sh = wf_dp4a(0x01010101, x3, wf_dp4a(0x01010101, x2, 0));
		const int isum = w.sc_lo * il + w.sc_hi * ih, msum = w.m_lo * sl + w.m_hi * sh;
		return (w.d * d[b]) * (float)isum - (w.dmin * d[b]) * (float)msum;
	}
};
template <> struct wf_mv<WF_DTYPE_Q4_K> : wf_mv_k45<false> {
};
template <> struct wf_mv<WF_DTYPE_Q5_K> : wf_mv_k45<true> {
};

/* Q6_K: 128 bytes ql, 64 qh, 16 int8 scales, d. 16 lanes per block; lane i takes half h = i / 8
 * and l0 = 4 (i % 8): for k = 0..3 the four elements 128h + 32k + l0 .. +3, low bits in
 * ql[64h + 32 (k & 1) + l0 ..] (low nibbles for k < 2, high for k >= 2), top bits in
 * qh[32h + l0 ..] at 2k; one scale per k (the four share a 16-element group). */
template <> struct wf_mv<WF_DTYPE_Q6_K> {
	static constexpr int QK = 256, BYTES = 210, LPB = 16;
	struct w_t {
		uint32_t v[4];
		int sc[4];
		float d;
	};
	WF_MV_FN void decode(const uint8_t *blk, int sub, w_t &w)
	{
		const int h = sub / 8, l0 = 4 * (sub % 8);
		const uint32_t a = wf_ld4_a2(blk + 64 * h + l0);
		const uint32_t b = wf_ld4_a2(blk + 64 * h + 32 + l0);
		const uint32_t q = wf_ld4_a2(blk + 128 + 32 * h + l0);
		w.v[0] = (a & 0x0f0f0f0fu) | ((q & 0x03030303u) << 4);
		w.v[1] = (b & 0x0f0f0f0fu) | (((q >> 2) & 0x03030303u) << 4);
		w.v[2] = ((a >> 4) & 0x0f0f0f0fu) | (((q >> 4) & 0x03030303u) << 4);
		w.v[3] = ((b >> 4) & 0x0f0f0f0fu) | (((q >> 6) & 0x03030303u) << 4);
		for (int k = 0; k < 4; k++) {
			w.v[k] = wf_vsub4(w.v[k], 0x20202020u);
			w.sc[k] = (int8_t)blk[192 + 8 * h + 2 * k + l0 / 16];
		}
		w.d = wf_dq_h2f(wf_dq_u16(blk + 208));
	}
	WF_MV_FN float dot(const w_t &w, const int8_t *qs, const float *d, int64_t b, int sub)
	{
		const int8_t *x = qs + 256 * b + 128 * (sub / 8) + 4 * (sub % 8);
		int isum = 0;
		for (int k = 0; k < 4; k++)
			isum += w.sc[k] * wf_dp4a((int)w.v[k], wf_ld4i(x + 32 * k), 0);
		return (w.d * d[b]) * (float)isum;
	}
};

/* A quantized row: the lane's share for rows j < n of the activations (N: the registers). */
template <enum wf_dtype T, int N>
WF_MV_FN void wf_mv_lane_q(const uint8_t *row, int64_t ne0, const wf_mv_act &a, int n, int lane,
                           float *acc)
{
	typedef wf_mv<T> M;
	const int64_t nb = ne0 / M::QK;
	const int sub = lane % M::LPB;

	for (int j = 0; j < N; j++)
		acc[j] = 0.0f;
	WF_MV_UNROLL2
	for (int64_t b = lane / M::LPB; b < nb; b += 32 / M::LPB) {
		typename M::w_t w;
		M::decode(row + b * M::BYTES, sub, w);
		WF_MV_UNROLL
		for (int j = 0; j < N; j++)
			if (j < n)
				acc[j] += M::dot(w, wf_mv_qs(a, j), wf_mv_d(a, j), b, sub);
	}
}

/* ---- float types ---------------------------------------------------------------------------- */

/* Element e of a float-type row, and of an activation row (F32 weights: the caller's floats;
 * F16 and BF16: the converted halves). */
template <enum wf_dtype T> WF_MV_FN float wf_mv_w(const uint8_t *row, int64_t e)
{
	return wf_dq<T>::elem(row, e);
}

template <enum wf_dtype T> WF_MV_FN float wf_mv_x(const uint8_t *xrow, int64_t e)
{
	if (T == WF_DTYPE_F32)
		return reinterpret_cast<const float *>(xrow)[e];
	const uint16_t h = reinterpret_cast<const uint16_t *>(xrow)[e];
	return T == WF_DTYPE_F16 ? wf_dq_h2f(h) : wf_dq_bf2f(h);
}

/* 8 consecutive elements e0 .. e0 + 7 (e0 % 8 == 0, rows 16-byte aligned): 16-byte loads. */
template <enum wf_dtype T> WF_MV_FN void wf_mv_w8(const uint8_t *row, int64_t e0, float *v)
{
#ifdef __CUDA_ARCH__
	if (T == WF_DTYPE_F32) {
		const float4 *p = reinterpret_cast<const float4 *>(row) + e0 / 4;
		const float4 a = p[0], b = p[1];
		v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
		v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
		return;
	}
	const uint4 u = reinterpret_cast<const uint4 *>(row)[e0 / 8];
	const uint32_t w[4] = {u.x, u.y, u.z, u.w};
	for (int i = 0; i < 4; i++) {
		const uint16_t l = (uint16_t)(w[i] & 0xffffu), h = (uint16_t)(w[i] >> 16);
		v[2 * i] = T == WF_DTYPE_F16 ? wf_dq_h2f(l) : wf_dq_bf2f(l);
		v[2 * i + 1] = T == WF_DTYPE_F16 ? wf_dq_h2f(h) : wf_dq_bf2f(h);
	}
#else
	for (int i = 0; i < 8; i++)
		v[i] = wf_mv_w<T>(row, e0 + i);
#endif
}

/* The activations' 8 elements: F32 weights read the caller's floats, the others halves. */
template <enum wf_dtype T> WF_MV_FN void wf_mv_x8(const uint8_t *xrow, int64_t e0, float *v)
{
#ifdef __CUDA_ARCH__
	if (T == WF_DTYPE_F32) {
		wf_mv_w8<WF_DTYPE_F32>(xrow, e0, v);
		return;
	}
	wf_mv_w8<T>(xrow, e0, v);
#else
	for (int i = 0; i < 8; i++)
		v[i] = wf_mv_x<T>(xrow, e0 + i);
#endif
}

/* A float-type row: VEC, 8 elements per lane per step (8 lane + 256 s); else one element per
 * lane per step (lane + 32 s). Activation row j at a.base + j * a.stride. */
template <enum wf_dtype T, int N, bool VEC>
WF_MV_FN void wf_mv_lane_f(const uint8_t *row, int64_t ne0, const wf_mv_act &a, int n, int lane,
                           float *acc)
{
	for (int j = 0; j < N; j++)
		acc[j] = 0.0f;
	if (VEC) {
		WF_MV_UNROLL4
		for (int64_t e0 = 8 * (int64_t)lane; e0 < ne0; e0 += 256) {
			float w[8];
			wf_mv_w8<T>(row, e0, w);
			WF_MV_UNROLL
			for (int j = 0; j < N; j++) {
				if (j >= n)
					continue;
				float x[8], s = acc[j];
				wf_mv_x8<T>(a.base + (size_t)j * a.stride, e0, x);
				for (int i = 0; i < 8; i++)
					s += w[i] * x[i];
				acc[j] = s;
			}
		}
	} else {
		WF_MV_UNROLL4
		for (int64_t e = lane; e < ne0; e += 32) {
			const float w = wf_mv_w<T>(row, e);
			WF_MV_UNROLL
			for (int j = 0; j < N; j++)
				if (j < n)
					acc[j] += w * wf_mv_x<T>(a.base + (size_t)j * a.stride, e);
		}
	}
}

/* Whether the mat-vec kernels take type T at all, and its lane function. */
template <enum wf_dtype T, int N, bool VEC>
WF_MV_FN void wf_mv_lane(const uint8_t *row, int64_t ne0, const wf_mv_act &a, int n, int lane,
                         float *acc)
{
	if constexpr (wf_dq<T>::BLOCK == 1)
		wf_mv_lane_f<T, N, VEC>(row, ne0, a, n, lane, acc);
	else
		wf_mv_lane_q<T, N>(row, ne0, a, n, lane, acc);
}

#endif
