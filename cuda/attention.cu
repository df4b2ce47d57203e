/* The engine's KV-cache store and attention on CUDA (engine/devops.h kv_store and attention;
 * numerics of engine/ops.c wf__attend).
 *
 * Attention: one block of ATT_WARPS warps per (token, query head). Warp w walks positions w,
 * w + ATT_WARPS, ... of the token's window with an online softmax (running maximum m, sum l and
 * accumulator, one exp per step as llama.cpp's flash attention takes it); lane l holds head
 * elements l, l + 32, ... (ATT_MAX_DIM / 32 registers), so K and V rows are read coalesced and a
 * score is one warp reduction. The warps' partial states are merged through shared memory at
 * the end. Nothing is sized by the window: any n_kv runs in the same ~9 KiB of shared memory.
 * Arithmetic is float; with an F16 cache the query is rounded to F16 first, as the CPU's
 * flash-attention path does, but the accumulator stays float (the CPU rounds it to F16 after
 * every position, so the two differ by F16 rounding: tests/cuda states the tolerance). */
#include "cuda/attention.h"
#include "cuda/engine_ctx.h"

#include "base/error.h"

#include <cuda_fp16.h>
#include <math.h>

#define ATT_WARPS     8
#define ATT_THREADS   (ATT_WARPS * 32)
#define ATT_MAX_DIM   256u
#define ATT_PER_LANE  (ATT_MAX_DIM / 32)
#define KV_THREADS    256
#define EW_MAX_BLOCKS 4096u

/* Element i of a cache row, F16 or F32. F16 elements are read one half at a time: a row's head
 * slice is only 2-byte aligned for odd head offsets. */
static __host__ __device__ __forceinline__ float kv_load(const void *base, size_t i, bool f16)
{
	if (f16)
		return __half2float(static_cast<const __half *>(base)[i]);
	return static_cast<const float *>(base)[i];
}

/* Where position p of token t's window starts for query head h: its KV head's slice of the
 * cache row (group query heads per KV head); and where token t's head h lies in q and out. */
static __host__ __device__ __forceinline__ size_t att_kv_at(uint32_t first, uint32_t p, size_t row,
                                                            uint32_t h, uint32_t group,
                                                            uint32_t head_dim)
{
	return (size_t)(first + p) * row + (size_t)(h / group) * head_dim;
}

static __host__ __device__ __forceinline__ size_t att_q_at(uint32_t t, size_t q_stride, uint32_t h,
                                                           uint32_t head_dim)
{
	return (size_t)t * q_stride + (size_t)h * head_dim;
}

static __host__ __device__ __forceinline__ float round_f16(float v)
{
	return __half2float(__float2half_rn(v));
}

/* One position's step of the online softmax: score s moves the maximum (the old state scaled
 * by corr) or weighs in below it (weight p). l, the sum of weights, is updated here; the caller
 * applies acc = acc * corr + p * v. m starts at -INFINITY (expf(-inf) = 0: nothing to scale). */
static __host__ __device__ __forceinline__ void att_step(float *m, float *l, float s, float *corr,
                                                         float *p)
{
	if (s > *m) {
		*corr = expf(*m - s);
		*p = 1.0f;
		*m = s;
	} else {
		*corr = 1.0f;
		*p = expf(s - *m);
	}
	*l = *l * *corr + *p;
}

/* Merges nw partial states (m[w], l[w], acc[w * acc_stride]) of one head element into the
 * output. Empty states (m = -inf) weigh nothing; an empty window gives 0. */
static __host__ __device__ __forceinline__ float
att_merge(const float *m, const float *l, const float *acc, size_t acc_stride, unsigned nw)
{
	float mx = -INFINITY;
	for (unsigned w = 0; w < nw; w++)
		mx = m[w] > mx ? m[w] : mx;
	if (mx == -INFINITY)
		return 0.0f;
	float sum = 0.0f, o = 0.0f;
	for (unsigned w = 0; w < nw; w++) {
		const float f = m[w] == -INFINITY ? 0.0f : expf(m[w] - mx);
		sum += l[w] * f;
		o += acc[w * acc_stride] * f;
	}
	return sum > 0.0f ? o / sum : 0.0f;
}

static __device__ __forceinline__ float warp_sum(float v)
{
	for (int off = 16; off > 0; off >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, off);
	return v;
}

/* row: elements of one cache position (n_head_kv * head_dim); group: query heads per KV head. */
static __global__ void __launch_bounds__(ATT_THREADS)
    attention_kernel(const float *q, size_t q_stride, uint32_t n_head, uint32_t group,
                     uint32_t head_dim, size_t row, const void *kc, const void *vc, bool f16,
                     const uint32_t *kv_first, const uint32_t *n_kv, float scale, float *out)
{
	__shared__ float sm_m[ATT_WARPS], sm_l[ATT_WARPS];
	__shared__ float sm_acc[ATT_WARPS * ATT_MAX_DIM];
	const uint32_t t = blockIdx.x / n_head, h = blockIdx.x % n_head;
	const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const float *qh = q + att_q_at(t, q_stride, h, head_dim);
	const uint32_t first = kv_first[t], cnt = n_kv[t];

	float qr[ATT_PER_LANE], acc[ATT_PER_LANE];
#pragma unroll
	for (uint32_t j = 0; j < ATT_PER_LANE; j++) {
		const uint32_t i = lane + 32 * j;
		qr[j] = i < head_dim ? (f16 ? round_f16(qh[i]) : qh[i]) : 0.0f;
		acc[j] = 0.0f;
	}
	float m = -INFINITY, l = 0.0f;
	/* The loop bound depends on the warp only: every lane of a warp reaches the shuffles. */
	for (uint32_t p = warp; p < cnt; p += ATT_WARPS) {
		const size_t off = att_kv_at(first, p, row, h, group, head_dim);
		float s = 0.0f;
#pragma unroll
		for (uint32_t j = 0; j < ATT_PER_LANE; j++) {
			const uint32_t i = lane + 32 * j;
			if (i < head_dim)
				s += kv_load(kc, off + i, f16) * qr[j];
		}
		s = warp_sum(s) * scale;
		float corr, pw;
		att_step(&m, &l, s, &corr, &pw);
#pragma unroll
		for (uint32_t j = 0; j < ATT_PER_LANE; j++) {
			const uint32_t i = lane + 32 * j;
			if (i < head_dim)
				acc[j] = acc[j] * corr + pw * kv_load(vc, off + i, f16);
		}
	}
	if (lane == 0) {
		sm_m[warp] = m;
		sm_l[warp] = l;
	}
#pragma unroll
	for (uint32_t j = 0; j < ATT_PER_LANE; j++) {
		const uint32_t i = lane + 32 * j;
		if (i < head_dim)
			sm_acc[warp * ATT_MAX_DIM + i] = acc[j];
	}
	__syncthreads();
	float *oh = out + att_q_at(t, q_stride, h, head_dim);
	for (uint32_t i = threadIdx.x; i < head_dim; i += ATT_THREADS)
		oh[i] = att_merge(sm_m, sm_l, sm_acc + i, ATT_MAX_DIM, ATT_WARPS);
}

static int attention_check(uint32_t n_head, uint32_t n_head_kv, uint32_t head_dim, size_t q_stride,
                           uint32_t n, enum wf_engine_dev_kv type, struct wf_diag *diag)
{
	if (n_head == 0 || n_head_kv == 0 || n_head % n_head_kv || head_dim == 0 ||
	    head_dim > ATT_MAX_DIM ||
	    (type != WF_ENGINE_DEV_KV_F16 && type != WF_ENGINE_DEV_KV_F32) ||
	    (n > 1 && q_stride < (size_t)n_head * head_dim) || (uint64_t)n * n_head > INT32_MAX)
		return wf_diag_set(
		    diag, WF_EINVAL,
		    "attention: %u tokens, %u heads over %u KV heads of %u (at most %u), "
		    "q stride %zu, cache type %d",
		    n, n_head, n_head_kv, head_dim, ATT_MAX_DIM, q_stride, (int)type);
	return 0;
}

extern "C" int wf__cuda_attention(void *ctx, const float *q, size_t q_stride, uint32_t n,
                                  uint32_t n_head, uint32_t n_head_kv, uint32_t head_dim,
                                  const void *kc, const void *vc, enum wf_engine_dev_kv type,
                                  const uint32_t *kv_first, const uint32_t *n_kv, float scale,
                                  float *out, struct wf_diag *diag)
{
	struct wf__cuda_engine_ctx *c = (struct wf__cuda_engine_ctx *)ctx;
	int rc = attention_check(n_head, n_head_kv, head_dim, q_stride, n, type, diag);

	if (rc < 0 || n == 0)
		return rc;
	attention_kernel<<<n * n_head, ATT_THREADS, 0, c->stream>>>(
	    q, q_stride, n_head, n_head / n_head_kv, head_dim, (size_t)n_head_kv * head_dim, kc, vc,
	    type == WF_ENGINE_DEV_KV_F16, kv_first, n_kv, scale, out);
	return wf__cuda_launched(diag, "attention");
}

/* The kernel's steps on the host, warp by warp and lane by lane; the warp reduction is the same
 * xor butterfly (every lane ends with lane 0's sum, float addition being commutative). */
extern "C" int wf__cuda_attention_host(const float *q, size_t q_stride, uint32_t n, uint32_t n_head,
                                       uint32_t n_head_kv, uint32_t head_dim, const void *kc,
                                       const void *vc, enum wf_engine_dev_kv type,
                                       const uint32_t *kv_first, const uint32_t *n_kv, float scale,
                                       float *out)
{
	int rc = attention_check(n_head, n_head_kv, head_dim, q_stride, n, type, NULL);
	if (rc < 0)
		return rc;
	const bool f16 = type == WF_ENGINE_DEV_KV_F16;
	const uint32_t group = n_head / n_head_kv;
	const size_t row = (size_t)n_head_kv * head_dim;
	float sm_acc[ATT_WARPS * ATT_MAX_DIM];
	float sm_m[ATT_WARPS], sm_l[ATT_WARPS], qr[ATT_MAX_DIM], part[32];

	for (uint32_t b = 0; b < n * n_head; b++) {
		const uint32_t t = b / n_head, h = b % n_head;
		const float *qh = q + att_q_at(t, q_stride, h, head_dim);
		for (uint32_t i = 0; i < head_dim; i++)
			qr[i] = f16 ? round_f16(qh[i]) : qh[i];
		for (uint32_t w = 0; w < ATT_WARPS; w++) {
			float m = -INFINITY, l = 0.0f, *acc = sm_acc + w * ATT_MAX_DIM;
			for (uint32_t i = 0; i < head_dim; i++)
				acc[i] = 0.0f;
			for (uint32_t p = w; p < n_kv[t]; p += ATT_WARPS) {
				const size_t off =
				    att_kv_at(kv_first[t], p, row, h, group, head_dim);
				for (uint32_t lane = 0; lane < 32; lane++) {
					part[lane] = 0.0f;
					for (uint32_t i = lane; i < head_dim; i += 32)
						part[lane] += kv_load(kc, off + i, f16) * qr[i];
				}
				for (uint32_t o = 16; o > 0; o >>= 1) {
					float nx[32];
					for (uint32_t lane = 0; lane < 32; lane++)
						nx[lane] = part[lane] + part[lane ^ o];
					for (uint32_t lane = 0; lane < 32; lane++)
						part[lane] = nx[lane];
				}
				float corr, pw;
				att_step(&m, &l, part[0] * scale, &corr, &pw);
				for (uint32_t i = 0; i < head_dim; i++)
					acc[i] = acc[i] * corr + pw * kv_load(vc, off + i, f16);
			}
			sm_m[w] = m;
			sm_l[w] = l;
		}
		float *oh = out + att_q_at(t, q_stride, h, head_dim);
		for (uint32_t i = 0; i < head_dim; i++)
			oh[i] = att_merge(sm_m, sm_l, sm_acc + i, ATT_MAX_DIM, ATT_WARPS);
	}
	return 0;
}

/* ---- KV store ---------------------------------------------------------------------------- */

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

extern "C" int wf__cuda_kv_store(void *ctx, const float *k, const float *v, uint32_t n,
                                 uint32_t row, const uint32_t *dst_row, void *kc, void *vc,
                                 enum wf_engine_dev_kv type, struct wf_diag *diag)
{
	struct wf__cuda_engine_ctx *c = (struct wf__cuda_engine_ctx *)ctx;

	if (type != WF_ENGINE_DEV_KV_F16 && type != WF_ENGINE_DEV_KV_F32)
		return wf_diag_set(diag, WF_EINVAL, "kv_store: cache type %d", (int)type);
	const size_t total = (size_t)n * row;
	if (total == 0)
		return 0;
	size_t blocks = (total + KV_THREADS - 1) / KV_THREADS;
	if (blocks > EW_MAX_BLOCKS)
		blocks = EW_MAX_BLOCKS;
	kv_store_kernel<<<(unsigned)blocks, KV_THREADS, 0, c->stream>>>(
	    k, v, total, row, dst_row, kc, vc, type == WF_ENGINE_DEV_KV_F16);
	return wf__cuda_launched(diag, "kv_store");
}
