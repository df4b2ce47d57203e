/* The KV-cache store and attention of the CUDA backend (attention.h; numerics of
 * kernels/cpu_ops.c wf_cpu_attend).
 *
 * att_kernel: one block per (token, KV head, range of the window), one warp per query head of
 * that KV head (up to 8; more heads take more blocks), so a K or V row is read from memory once
 * for all the query heads that share it (GQA 8:1 reads the cache once, not 8 times). The block
 * walks its range in chunks of C positions (32 for F16, 16 for F32): the chunk's K and V rows
 * are staged in shared memory (16-byte loads where the cache rows allow), then each warp
 * computes the chunk's scores, one position per lane, each lane running the CPU's whole dot over
 * the head in the CPU's order (K rows padded so the lanes' 16-byte reads hit distinct banks),
 * and steps through the positions in order: the CPU's online-softmax step, every lane updating
 * its head elements lane, lane + 32, ... (the F16 rounding after each position, as the CPU).
 * Shared memory: C x (D + pad) + C x D elements and the query heads' floats: at most 41 KiB
 * at D = 256, under the 48 KiB a block gets without opting in; up to 5 blocks per SM.
 *
 * att_merge_kernel: for a split window, the ranges' (max, sum, accumulator) merged in float,
 * one thread per head element.
 *
 * Decode at 4k context (Qwen3-30B-A3B: 32 heads over 4 KV heads of 128) runs 4 KV heads x 32
 * ranges = 128 blocks of 8 warps (the old kernel: 32 blocks, every position serial per warp). */
#include "cuda/attention.h"
#include "cuda/backend_ctx.h"
#include "cuda/quant.cuh"
#include "cuda/rn.cuh"

#include "base/error.h"

#include <cuda_fp16.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <type_traits>

#define ATT_MAX_WARPS 8
#define ATT_PER_LANE  (WF_CUDA_ATT_MAX_DIM / 32)
#define ATT_CHUNK_F16 32u
#define ATT_CHUNK_F32 16u
#define ATT_MAX_SPLIT WF_CUDA_ATT_SPLIT_MIN /* keeps every range non-empty (see att_range) */
#define KV_THREADS    256
#define EW_MAX_BLOCKS 4096u

struct wf__cuda_att {
	float *ms;  /* per state: max, sum */
	float *acc; /* per state: head_dim accumulators */
};

/* ---- the steps, shared with the host twin --------------------------------------------------- */

#define ATT_FN static __host__ __device__ __forceinline__

ATT_FN float att_h(float v) /* rounded to F16 */
{
	return wf_dq_h2f(wf_f2h(v));
}

/* The ranges a window of cnt positions is split into (S at most): none below the minimum. */
ATT_FN uint32_t att_eff(uint32_t S, uint32_t cnt)
{
	const uint32_t by_len = cnt / WF_CUDA_ATT_SPLIT_MIN;
	const uint32_t e = by_len < S ? by_len : S;
	return e > 1 ? e : 1;
}

/* Range s of eff: [p0, p1). With eff <= cnt / SPLIT_MIN and eff <= SPLIT_MIN, every range holds
 * at least one position: (eff - 1) * ceil(cnt / eff) < cnt. */
ATT_FN void att_range(uint32_t cnt, uint32_t eff, uint32_t s, uint32_t *p0, uint32_t *p1)
{
	const uint32_t len = (cnt + eff - 1) / eff;
	*p0 = s * len < cnt ? s * len : cnt;
	*p1 = *p0 + len < cnt ? *p0 + len : cnt;
}

/* The CPU's F16 dot of a K row (halves) with the F16-rounded query: eight fused lanes, element
 * i in lane i % 8, added in its fixed order, then the tail. */
ATT_FN float att_dot_f16(const uint16_t *k, const float *q, uint32_t D)
{
	float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
	uint32_t i = 0;
#ifdef __CUDA_ARCH__
	/* The kernel's K rows and query sit in shared memory, 16-byte aligned (D % 8 == 0). */
	for (; i + 8 <= D; i += 8) {
		const uint4 u = *reinterpret_cast<const uint4 *>(k + i);
		const float4 qa = *reinterpret_cast<const float4 *>(q + i);
		const float4 qb = *reinterpret_cast<const float4 *>(q + i + 4);
		const uint32_t w[4] = {u.x, u.y, u.z, u.w};
		const float qq[8] = {qa.x, qa.y, qa.z, qa.w, qb.x, qb.y, qb.z, qb.w};
		for (int j = 0; j < 8; j++)
			l[j] = fmaf(wf_dq_h2f((uint16_t)(w[j / 2] >> (16 * (j % 2)))), qq[j], l[j]);
	}
#else
	for (; i + 8 <= D; i += 8)
		for (int j = 0; j < 8; j++)
			l[j] = fmaf(wf_dq_h2f(k[i + j]), q[i + j], l[j]);
#endif
	float s = add_rn(add_rn(add_rn(l[0], l[4]), add_rn(l[2], l[6])),
	                 add_rn(add_rn(l[1], l[5]), add_rn(l[3], l[7])));
	for (; i < D; i++)
		s = add_rn(s, mul_rn(wf_dq_h2f(k[i]), q[i]));
	return s;
}

/* The CPU's F32 dot: products rounded, added in order. */
ATT_FN float att_dot_f32(const float *k, const float *q, uint32_t D)
{
	float s = 0.0f;
#ifdef __CUDA_ARCH__
	for (uint32_t i = 0; i < D; i += 4) { /* shared memory, 16-byte aligned (D % 8 == 0) */
		const float4 a = *reinterpret_cast<const float4 *>(k + i);
		const float4 b = *reinterpret_cast<const float4 *>(q + i);
		s = add_rn(s, mul_rn(a.x, b.x));
		s = add_rn(s, mul_rn(a.y, b.y));
		s = add_rn(s, mul_rn(a.z, b.z));
		s = add_rn(s, mul_rn(a.w, b.w));
	}
#else
	for (uint32_t i = 0; i < D; i++)
		s = add_rn(s, mul_rn(k[i], q[i]));
#endif
	return s;
}

/* One position's scalar step. F16 (the CPU's): a new maximum rescales the accumulator (ms),
 * else the position weighs vs; S = S * ms + vs. F32: the same online softmax in float. Returns
 * whether the accumulator must be scaled by *ms before *vs * v is added. */
ATT_FN bool att_step(float *M, float *S, float s, float *ms, float *vs)
{
	bool scale = false;
	*ms = 1.0f;
	*vs = 1.0f;
	if (s > *M) {
		const float m_old = *M;
		*M = s;
		*ms = expf(m_old - *M);
		scale = true;
	} else {
		*vs = expf(s - *M);
	}
	*S = add_rn(mul_rn(*S, *ms), *vs);
	return scale;
}

/* One accumulator element's update after att_step. */
ATT_FN float att_acc(bool f16, float a, bool scale, float ms, float vs, float v)
{
	if (f16) {
		if (scale)
			a = att_h(mul_rn(a, ms));
		return att_h(fmaf(v, vs, a));
	}
	if (scale)
		a = mul_rn(a, ms);
	return add_rn(a, mul_rn(vs, v));
}

ATT_FN float att_inv(float S)
{
	return S == 0.0f ? 0.0f : 1.0f / S;
}

/* Merges eff ranges' states (ms[2 s], ms[2 s + 1], acc[s * D]) for one element. */
ATT_FN float att_merge(const float *ms, const float *acc, uint32_t D, uint32_t eff)
{
	float mx = -INFINITY;
	for (uint32_t s = 0; s < eff; s++)
		mx = ms[2 * s] > mx ? ms[2 * s] : mx;
	float den = 0.0f, num = 0.0f;
	for (uint32_t s = 0; s < eff; s++) {
		const float f = ms[2 * s] == -INFINITY ? 0.0f : expf(ms[2 * s] - mx);
		den = add_rn(den, mul_rn(ms[2 * s + 1], f));
		num = add_rn(num, mul_rn(acc[(size_t)s * D], f));
	}
	return mul_rn(num, att_inv(den));
}

/* K rows in shared memory are padded so that their byte stride is 16 x odd: the 8 lanes of a
 * quarter-warp reading 16 bytes each at one row apiece hit 8 distinct 16-byte bank groups. */
ATT_FN uint32_t att_kstride(uint32_t D, uint32_t elem)
{
	const uint32_t units = D * elem / 16; /* D * elem is a multiple of 16 (D % 8 == 0) */
	return D + (units % 2 == 0 ? 16 : 32) / elem;
}

/* ---- kernels ------------------------------------------------------------------------------------
 */

template <bool F16>
static __global__ void __launch_bounds__(ATT_MAX_WARPS * 32)
    att_kernel(const float *q, size_t q_stride, uint32_t n_head, uint32_t n_head_kv, uint32_t group,
               uint32_t hblocks, uint32_t W, uint32_t D, size_t row, const void *kc, const void *vc,
               bool vec, const uint32_t *kv_first, const uint32_t *n_kv, float scale, uint32_t S,
               float *out, float *part_ms, float *part_acc)
{
	typedef typename std::conditional<F16, uint16_t, float>::type elem_t;
	constexpr uint32_t C = F16 ? ATT_CHUNK_F16 : ATT_CHUNK_F32;
	extern __shared__ __align__(16) unsigned char smem[];
	const uint32_t KS = att_kstride(D, sizeof(elem_t));
	float *Q = reinterpret_cast<float *>(smem);                /* W x D */
	elem_t *K = reinterpret_cast<elem_t *>(Q + (size_t)W * D); /* C x KS */
	elem_t *V = K + (size_t)C * KS;                            /* C x D */

	uint32_t b = blockIdx.x;
	const uint32_t hb = b % hblocks;
	b /= hblocks;
	const uint32_t g = b % n_head_kv, t = b / n_head_kv, sidx = blockIdx.y;
	const uint32_t cnt = n_kv[t], first = kv_first[t];
	const uint32_t eff = att_eff(S, cnt);
	if (sidx >= eff) /* uniform per block */
		return;
	uint32_t p0, p1;
	att_range(cnt, eff, sidx, &p0, &p1);
	const uint32_t warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	const uint32_t hl = hb * W + warp, h = g * group + hl;
	const bool active = hl < group; /* uniform per warp */

	for (uint32_t idx = threadIdx.x; idx < W * D; idx += blockDim.x) {
		const uint32_t wi = idx / D, i = idx % D, hh = hb * W + wi;
		if (hh < group) {
			const float v = q[(size_t)t * q_stride + (size_t)(g * group + hh) * D + i];
			Q[idx] = F16 ? att_h(v) : v;
		}
	}
	float M = -INFINITY, Ssum = 0.0f, acc[ATT_PER_LANE];
#pragma unroll
	for (uint32_t j = 0; j < ATT_PER_LANE; j++)
		acc[j] = 0.0f;

	const elem_t *kb = static_cast<const elem_t *>(kc) + (size_t)g * D;
	const elem_t *vb = static_cast<const elem_t *>(vc) + (size_t)g * D;
	constexpr uint32_t PER16 = 16 / sizeof(elem_t);
	for (uint32_t c0 = p0; c0 < p1; c0 += C) {
		const uint32_t m = p1 - c0 < C ? p1 - c0 : C;
		__syncthreads(); /* the previous chunk is consumed (and Q written, the first time)
		                  */
		if (vec) {
			for (uint32_t idx = threadIdx.x; idx < m * D / PER16; idx += blockDim.x) {
				const uint32_t r = idx / (D / PER16),
				               i = (idx % (D / PER16)) * PER16;
				const size_t src = (size_t)(first + c0 + r) * row + i;
				*reinterpret_cast<uint4 *>(K + (size_t)r * KS + i) =
				    *reinterpret_cast<const uint4 *>(kb + src);
				*reinterpret_cast<uint4 *>(V + (size_t)r * D + i) =
				    *reinterpret_cast<const uint4 *>(vb + src);
			}
		} else {
			for (uint32_t idx = threadIdx.x; idx < m * D; idx += blockDim.x) {
				const uint32_t r = idx / D, i = idx % D;
				const size_t src = (size_t)(first + c0 + r) * row + i;
				K[(size_t)r * KS + i] = kb[src];
				V[(size_t)r * D + i] = vb[src];
			}
		}
		__syncthreads();
		if (!active)
			continue;
		const float *qw = Q + (size_t)warp * D;
		float sc = 0.0f;
		if (lane < m) {
			if constexpr (F16)
				sc = mul_rn(att_dot_f16(K + (size_t)lane * KS, qw, D), scale);
			else
				sc = mul_rn(att_dot_f32(K + (size_t)lane * KS, qw, D), scale);
		}
		for (uint32_t p = 0; p < m; p++) {
			const float s = __shfl_sync(0xffffffffu, sc, p);
			float ms, vs;
			const bool scl = att_step(&M, &Ssum, s, &ms, &vs);
#pragma unroll
			for (uint32_t j = 0; j < ATT_PER_LANE; j++) {
				const uint32_t i = lane + 32 * j;
				if (i < D) {
					float v;
					if constexpr (F16)
						v = wf_dq_h2f(V[(size_t)p * D + i]);
					else
						v = V[(size_t)p * D + i];
					acc[j] = att_acc(F16, acc[j], scl, ms, vs, v);
				}
			}
		}
	}
	if (!active)
		return;
	if (eff == 1) {
		const float inv = att_inv(Ssum);
		float *o = out + (size_t)t * q_stride + (size_t)h * D;
#pragma unroll
		for (uint32_t j = 0; j < ATT_PER_LANE; j++)
			if (lane + 32 * j < D)
				o[lane + 32 * j] = mul_rn(acc[j], inv);
		return;
	}
	const size_t st = ((size_t)t * n_head + h) * S + sidx;
	if (lane == 0) {
		part_ms[2 * st] = M;
		part_ms[2 * st + 1] = Ssum;
	}
#pragma unroll
	for (uint32_t j = 0; j < ATT_PER_LANE; j++)
		if (lane + 32 * j < D)
			part_acc[st * D + lane + 32 * j] = acc[j];
}

static __global__ void __launch_bounds__(WF_CUDA_ATT_MAX_DIM)
    att_merge_kernel(size_t q_stride, uint32_t n_head, uint32_t D, const uint32_t *n_kv, uint32_t S,
                     const float *part_ms, const float *part_acc, float *out)
{
	const uint32_t t = blockIdx.x / n_head, h = blockIdx.x % n_head, i = threadIdx.x;
	const uint32_t eff = att_eff(S, n_kv[t]);
	if (eff <= 1 || i >= D)
		return;
	const size_t st = ((size_t)t * n_head + h) * S;
	out[(size_t)t * q_stride + (size_t)h * D + i] =
	    att_merge(part_ms + 2 * st, part_acc + st * D + i, D, eff);
}

/* ---- host side ----------------------------------------------------------------------------------
 */

static int attention_check(const struct wf_backend_ctx *c, uint32_t n_head, uint32_t n_head_kv,
                           uint32_t head_dim, size_t q_stride, uint32_t n, enum wf_backend_kv type,
                           uint32_t max_dim, struct wf_diag *diag)
{
	(void)c;
	if (n_head == 0 || n_head_kv == 0 || n_head % n_head_kv || head_dim == 0 ||
	    head_dim > max_dim || head_dim % 8 ||
	    (type != WF_BACKEND_KV_F16 && type != WF_BACKEND_KV_F32) ||
	    (n > 1 && q_stride < (size_t)n_head * head_dim) || (uint64_t)n * n_head > INT32_MAX)
		return wf_diag_set(
		    diag, WF_EINVAL,
		    "attention: %u tokens, %u heads over %u KV heads of %u (a multiple of 8, at "
		    "most %u), q stride %zu, cache type %d",
		    n, n_head, n_head_kv, head_dim, max_dim, q_stride, (int)type);
	return 0;
}

/* Warps per block (query heads sharing one KV head, at most 8) and blocks per KV head. */
static void att_shape(uint32_t n_head, uint32_t n_head_kv, uint32_t *ret_w, uint32_t *ret_hb)
{
	const uint32_t group = n_head / n_head_kv;
	*ret_w = group < ATT_MAX_WARPS ? group : ATT_MAX_WARPS;
	*ret_hb = (group + *ret_w - 1) / *ret_w;
}

extern "C" uint32_t wf__cuda_att_splits(uint32_t n, uint32_t n_head, uint32_t n_head_kv,
                                        uint32_t max_kv, int sm_count)
{
	if (n == 0 || n_head == 0 || n_head_kv == 0)
		return 1;
	uint32_t w, hb;
	att_shape(n_head, n_head_kv, &w, &hb);
	const uint64_t blocks = (uint64_t)n * n_head_kv * hb;
	const uint64_t target = 2 * (uint64_t)(sm_count > 0 ? sm_count : 1); /* 2 per SM */
	uint64_t s = (target + blocks - 1) / blocks;
	const uint64_t by_len = max_kv / WF_CUDA_ATT_SPLIT_MIN;
	const uint64_t by_states = WF_CUDA_ATT_STATES / ((uint64_t)n * n_head);
	s = s < by_len ? s : by_len;
	s = s < by_states ? s : by_states;
	s = s < ATT_MAX_SPLIT ? s : ATT_MAX_SPLIT;
	return s > 1 ? (uint32_t)s : 1;
}

static size_t att_smem(bool f16, uint32_t W, uint32_t D)
{
	const uint32_t elem = f16 ? 2 : 4, C = f16 ? ATT_CHUNK_F16 : ATT_CHUNK_F32;
	return (size_t)W * D * 4 + (size_t)C * (att_kstride(D, elem) + D) * elem;
}

extern "C" int wf__cuda_att_create(struct wf_backend_ctx *c, struct wf_diag *diag)
{
	struct wf__cuda_att *a = (struct wf__cuda_att *)calloc(1, sizeof(*a));
	if (!a)
		return wf_diag_set(diag, -ENOMEM, "CUDA attention context");
	c->att = a;
	if (c->lim.head_dim == 0 || c->lim.max_kv < 2 * WF_CUDA_ATT_SPLIT_MIN)
		return 0; /* never split: no partial states */
	int rc = wf__cuda_ctx_alloc(c, (size_t)WF_CUDA_ATT_STATES * 2 * sizeof(float),
	                            (void **)&a->ms, diag);
	if (rc == 0)
		rc = wf__cuda_ctx_alloc(
		    c, (size_t)WF_CUDA_ATT_STATES * c->lim.head_dim * sizeof(float),
		    (void **)&a->acc, diag);
	if (rc < 0)
		wf__cuda_att_destroy(c);
	return rc;
}

extern "C" void wf__cuda_att_destroy(struct wf_backend_ctx *c)
{
	if (!c->att)
		return;
	wf__cuda_ctx_free(c, c->att->ms);
	wf__cuda_ctx_free(c, c->att->acc);
	free(c->att);
	c->att = NULL;
}

extern "C" int wf__cuda_attention(struct wf_backend_ctx *c, const float *q, size_t q_stride,
                                  uint32_t n, uint32_t n_head, uint32_t n_head_kv,
                                  uint32_t head_dim, const void *kc, const void *vc,
                                  enum wf_backend_kv type, const uint32_t *kv_first,
                                  const uint32_t *n_kv, float scale, float *out,
                                  struct wf_diag *diag)
{
	const uint32_t max_dim =
	    c->lim.head_dim < WF_CUDA_ATT_MAX_DIM ? c->lim.head_dim : WF_CUDA_ATT_MAX_DIM;
	int rc = attention_check(c, n_head, n_head_kv, head_dim, q_stride, n, type, max_dim, diag);
	if (rc < 0 || n == 0)
		return rc;
	const bool f16 = type == WF_BACKEND_KV_F16;
	const size_t elem = f16 ? 2 : 4, row = (size_t)n_head_kv * head_dim;
	const size_t qs = n > 1 ? q_stride : (size_t)n_head * head_dim;
	uint32_t w, hb;
	att_shape(n_head, n_head_kv, &w, &hb);
	uint32_t S = c->att && c->att->ms
	                 ? wf__cuda_att_splits(n, n_head, n_head_kv, c->lim.max_kv, c->sm_count)
	                 : 1;
	const bool vec = ((uintptr_t)kc | (uintptr_t)vc | (row * elem)) % 16 == 0;
	const dim3 grid(n * n_head_kv * hb, S);
	const size_t sm = att_smem(f16, w, head_dim);
	if (f16)
		att_kernel<true><<<grid, w * 32, sm, c->stream>>>(
		    q, qs, n_head, n_head_kv, n_head / n_head_kv, hb, w, head_dim, row, kc, vc, vec,
		    kv_first, n_kv, scale, S, out, c->att ? c->att->ms : NULL,
		    c->att ? c->att->acc : NULL);
	else
		att_kernel<false><<<grid, w * 32, sm, c->stream>>>(
		    q, qs, n_head, n_head_kv, n_head / n_head_kv, hb, w, head_dim, row, kc, vc, vec,
		    kv_first, n_kv, scale, S, out, c->att ? c->att->ms : NULL,
		    c->att ? c->att->acc : NULL);
	if ((rc = wf__cuda_launched(diag, "attention")) < 0 || S == 1)
		return rc;
	att_merge_kernel<<<n * n_head, head_dim, 0, c->stream>>>(qs, n_head, head_dim, n_kv, S,
	                                                         c->att->ms, c->att->acc, out);
	return wf__cuda_launched(diag, "attention (merge)");
}

/* The kernels' steps on the host: block by block (every range), warp by warp; a lane's score is
 * the same function over the same K row, and the element updates are independent per element,
 * so they are taken for the whole head at once. */
extern "C" int wf__cuda_attention_host(const float *q, size_t q_stride, uint32_t n, uint32_t n_head,
                                       uint32_t n_head_kv, uint32_t head_dim, const void *kc,
                                       const void *vc, enum wf_backend_kv type,
                                       const uint32_t *kv_first, const uint32_t *n_kv, float scale,
                                       uint32_t splits, float *out)
{
	int rc = attention_check(NULL, n_head, n_head_kv, head_dim, q_stride, n, type,
	                         WF_CUDA_ATT_MAX_DIM, NULL);
	if (rc < 0 || splits == 0 || splits > ATT_MAX_SPLIT)
		return rc < 0 ? rc : WF_EINVAL;
	const bool f16 = type == WF_BACKEND_KV_F16;
	const uint32_t D = head_dim, group = n_head / n_head_kv;
	const size_t row = (size_t)n_head_kv * D, qs = n > 1 ? q_stride : (size_t)n_head * D;
	float *ms = (float *)malloc(2 * sizeof(float) * splits);
	float *acc = (float *)malloc(sizeof(float) * D * splits);
	float qh[WF_CUDA_ATT_MAX_DIM], kf[WF_CUDA_ATT_MAX_DIM];
	if (!ms || !acc) {
		free(ms), free(acc);
		return -ENOMEM;
	}
	for (uint32_t t = 0; t < n; t++) {
		const uint32_t cnt = n_kv[t], eff = att_eff(splits, cnt);
		for (uint32_t h = 0; h < n_head; h++) {
			const uint32_t g = h / group;
			for (uint32_t i = 0; i < D; i++) {
				const float v = q[(size_t)t * qs + (size_t)h * D + i];
				qh[i] = f16 ? att_h(v) : v;
			}
			for (uint32_t s = 0; s < eff; s++) {
				uint32_t p0, p1;
				att_range(cnt, eff, s, &p0, &p1);
				float M = -INFINITY, Ssum = 0.0f, *a = acc + (size_t)s * D;
				for (uint32_t i = 0; i < D; i++)
					a[i] = 0.0f;
				for (uint32_t p = p0; p < p1; p++) {
					const size_t off =
					    (size_t)(kv_first[t] + p) * row + (size_t)g * D;
					float sc;
					if (f16) {
						sc = mul_rn(
						    att_dot_f16((const uint16_t *)kc + off, qh, D),
						    scale);
					} else {
						for (uint32_t i = 0; i < D; i++)
							kf[i] = ((const float *)kc)[off + i];
						sc = mul_rn(att_dot_f32(kf, qh, D), scale);
					}
					float m_s, v_s;
					const bool scl = att_step(&M, &Ssum, sc, &m_s, &v_s);
					for (uint32_t i = 0; i < D; i++) {
						const float v =
						    f16 ? wf_dq_h2f(((const uint16_t *)vc)[off + i])
						        : ((const float *)vc)[off + i];
						a[i] = att_acc(f16, a[i], scl, m_s, v_s, v);
					}
				}
				ms[2 * s] = M;
				ms[2 * s + 1] = Ssum;
			}
			float *o = out + (size_t)t * qs + (size_t)h * D;
			for (uint32_t i = 0; i < D; i++)
				o[i] = eff == 1 ? mul_rn(acc[i], att_inv(ms[1]))
				                : att_merge(ms, acc + i, D, eff);
		}
	}
	free(ms), free(acc);
	return 0;
}

/* ---- KV store
 * ------------------------------------------------------------------------------------ */

static __global__ void __launch_bounds__(KV_THREADS)
    kv_store_kernel(const float *k, const float *v, size_t total, uint32_t row,
                    const uint32_t *dst_row, void *kc, void *vc, bool f16)
{
	for (size_t e = (size_t)blockIdx.x * KV_THREADS + threadIdx.x; e < total;
	     e += (size_t)gridDim.x * KV_THREADS) {
		const size_t t = e / row, i = e % row;
		const size_t d = (size_t)dst_row[t] * row + i;
		if (f16) {
			static_cast<__half *>(kc)[d] = __float2half_rn(k[e]);
			static_cast<__half *>(vc)[d] = __float2half_rn(v[e]);
		} else {
			static_cast<float *>(kc)[d] = k[e];
			static_cast<float *>(vc)[d] = v[e];
		}
	}
}

extern "C" int wf__cuda_kv_store(struct wf_backend_ctx *c, const float *k, const float *v,
                                 uint32_t n, uint32_t row, const uint32_t *dst_row, void *kc,
                                 void *vc, enum wf_backend_kv type, struct wf_diag *diag)
{
	if (type != WF_BACKEND_KV_F16 && type != WF_BACKEND_KV_F32)
		return wf_diag_set(diag, WF_EINVAL, "kv_store: cache type %d", (int)type);
	const size_t total = (size_t)n * row;
	if (total == 0)
		return 0;
	size_t blocks = (total + KV_THREADS - 1) / KV_THREADS;
	if (blocks > EW_MAX_BLOCKS)
		blocks = EW_MAX_BLOCKS;
	kv_store_kernel<<<(unsigned)blocks, KV_THREADS, 0, c->stream>>>(
	    k, v, total, row, dst_row, kc, vc, type == WF_BACKEND_KV_F16);
	return wf__cuda_launched(diag, "kv_store");
}

extern "C" int wf__cuda_att_preload(struct wf_diag *diag)
{
	cudaFuncAttributes attr;
	cudaError_t e = cudaFuncGetAttributes(&attr, att_kernel<true>);
	if (e == cudaSuccess)
		e = cudaFuncGetAttributes(&attr, att_kernel<false>);
	if (e == cudaSuccess)
		e = cudaFuncGetAttributes(&attr, att_merge_kernel);
	if (e == cudaSuccess)
		e = cudaFuncGetAttributes(&attr, kv_store_kernel);
	return e == cudaSuccess ? 0 : wf__cuda_fail(e, diag, "loading the attention kernels");
}
