/* The MoE and element-wise ops of the CUDA backend (moe.h: route, copy_rows, swiglu, add,
 * moe_sum; numerics of kernels/cpu_ops.c wf_cpu_route, wf_cpu_swiglu and wf_cpu_moe_sum).
 *
 * Route: one block per token. The softmax takes the CPU's steps (maximum, expf of the
 * difference, the sum in double, one float reciprocal, products rounded as written), so the
 * probabilities match up to expf's last ulp; top-k is k block-wide arg-max rounds under one
 * total order (probability descending, then expert id ascending: the CPU's ties to the lower
 * id), each winner marked taken with a value below every probability. The order being total,
 * the result does not depend on how the threads split the experts. NaN logits (a corrupt
 * model) leave no comparable probability: a round then takes the lowest untaken id, as the CPU
 * does, so ids stay in bounds. The rest are grid-stride element-wise kernels; moe_sum rounds
 * each product and sum as written, so it is the CPU's sum bit for bit. */
#include "cuda/backend_ctx.h"
#include "cuda/moe.h"
#include "cuda/rn.cuh"

#include "base/error.h"

#include <math.h>

#define ROUTE_THREADS    256
#define ROUTE_WARPS      (ROUTE_THREADS / 32)
#define ROUTE_MAX_EXPERT WF_CUDA_ROUTE_MAX_EXPERT
#define ROUTE_MAX_K      WF_CUDA_ROUTE_MAX_K
/* Below every probability (they are >= 0): what a taken expert's slot holds. */
#define ROUTE_TAKEN   (-1.0f)
#define EW_THREADS    256
#define EW_MAX_BLOCKS 4096u

/* Whether expert a (probability pa) ranks before expert b. */
static __host__ __device__ __forceinline__ bool route_better(float pa, int32_t a, float pb,
                                                             int32_t b)
{
	return pa > pb || (pa == pb && a < b);
}

/* One candidate of a top-k round against the best so far; taken experts never compete. */
static __host__ __device__ __forceinline__ void route_consider(const float *pr, uint32_t e,
                                                               float *bp, int32_t *bi)
{
	if (pr[e] != ROUTE_TAKEN && route_better(pr[e], (int32_t)e, *bp, *bi)) {
		*bp = pr[e];
		*bi = (int32_t)e;
	}
}

/* The expert a round picks when no probability compares (NaN logits make every probability
 * NaN): the lowest id not taken yet, as the CPU's selection picks then. Never out of bounds. */
static __host__ __device__ __forceinline__ int32_t route_fallback(const float *pr,
                                                                  uint32_t n_expert)
{
	for (uint32_t e = 0; e < n_expert; e++)
		if (!(pr[e] == ROUTE_TAKEN))
			return (int32_t)e;
	return 0; /* unreachable with k <= n_expert */
}

/* The selected probabilities divided by their sum (in double, as the CPU), clamped below. */
static __host__ __device__ __forceinline__ void route_renorm(const float *sel, uint32_t k,
                                                             float *weights)
{
	double sum = 0.0;
	for (uint32_t j = 0; j < k; j++)
		sum += (double)sel[j];
	float fsum = (float)sum;
	if (fsum < 6.103515625e-5f)
		fsum = 6.103515625e-5f;
	for (uint32_t j = 0; j < k; j++)
		weights[j] = sel[j] / fsum;
}

static __global__ void __launch_bounds__(ROUTE_THREADS)
    route_kernel(const float *logits, uint32_t n_expert, uint32_t k, int32_t *ids, float *weights)
{
	__shared__ float pr[ROUTE_MAX_EXPERT];
	__shared__ float red_f[ROUTE_WARPS];
	__shared__ int32_t red_i[ROUTE_WARPS];
	__shared__ double red_d[ROUTE_WARPS];
	__shared__ float sel[ROUTE_MAX_K];
	__shared__ float max_all;
	__shared__ double sum_all;
	const float *x = logits + (size_t)blockIdx.x * n_expert;
	const unsigned tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

	float mx = -INFINITY;
	for (uint32_t e = tid; e < n_expert; e += ROUTE_THREADS)
		mx = x[e] > mx ? x[e] : mx;
	for (int off = 16; off > 0; off >>= 1) {
		const float o = __shfl_xor_sync(0xffffffffu, mx, off);
		mx = o > mx ? o : mx;
	}
	if (lane == 0)
		red_f[warp] = mx;
	__syncthreads();
	if (tid == 0) {
		for (unsigned w = 1; w < ROUTE_WARPS; w++)
			mx = red_f[w] > mx ? red_f[w] : mx;
		max_all = mx;
	}
	__syncthreads();
	mx = max_all;

	double sum = 0.0;
	for (uint32_t e = tid; e < n_expert; e += ROUTE_THREADS) {
		const float v = expf(x[e] - mx);
		pr[e] = v;
		sum += (double)v;
	}
	for (int off = 16; off > 0; off >>= 1)
		sum += __shfl_xor_sync(0xffffffffu, sum, off);
	if (lane == 0)
		red_d[warp] = sum;
	__syncthreads();
	if (tid == 0) {
		for (unsigned w = 1; w < ROUTE_WARPS; w++)
			sum += red_d[w];
		sum_all = sum;
	}
	__syncthreads();
	const float inv = (float)(1.0 / sum_all);
	for (uint32_t e = tid; e < n_expert; e += ROUTE_THREADS)
		pr[e] = mul_rn(pr[e], inv);
	__syncthreads();

	for (uint32_t j = 0; j < k; j++) {
		float bp = -INFINITY;
		int32_t bi = INT32_MAX;
		for (uint32_t e = tid; e < n_expert; e += ROUTE_THREADS) {
			route_consider(pr, e, &bp, &bi);
		}
		for (int off = 16; off > 0; off >>= 1) {
			const float op = __shfl_xor_sync(0xffffffffu, bp, off);
			const int32_t oi = __shfl_xor_sync(0xffffffffu, bi, off);
			if (route_better(op, oi, bp, bi)) {
				bp = op;
				bi = oi;
			}
		}
		if (lane == 0) {
			red_f[warp] = bp;
			red_i[warp] = bi;
		}
		__syncthreads();
		if (tid == 0) {
			for (unsigned w = 1; w < ROUTE_WARPS; w++) {
				if (route_better(red_f[w], red_i[w], bp, bi)) {
					bp = red_f[w];
					bi = red_i[w];
				}
			}
			if (bi == INT32_MAX) {
				bi = route_fallback(pr, n_expert);
				bp = pr[bi];
			}
			ids[(size_t)blockIdx.x * k + j] = bi;
			sel[j] = bp;
			pr[bi] = ROUTE_TAKEN;
		}
		__syncthreads();
	}
	if (tid == 0)
		route_renorm(sel, k, weights + (size_t)blockIdx.x * k);
}

static int route_check(uint32_t n_expert, uint32_t k, struct wf_diag *diag)
{
	if (n_expert == 0 || n_expert > ROUTE_MAX_EXPERT || k == 0 || k > ROUTE_MAX_K ||
	    k > n_expert)
		return wf_diag_set(diag, WF_EINVAL,
		                   "route: top %u of %u experts (at most %u of %u)", k, n_expert,
		                   ROUTE_MAX_K, ROUTE_MAX_EXPERT);
	return 0;
}

extern "C" int wf__cuda_route(struct wf_backend_ctx *c, const float *logits, uint32_t n,
                              uint32_t n_expert, uint32_t k, int32_t *ids, float *weights,
                              struct wf_diag *diag)
{
	int rc = route_check(n_expert, k, diag);

	if (rc < 0 || n == 0)
		return rc;
	route_kernel<<<n, ROUTE_THREADS, 0, c->stream>>>(logits, n_expert, k, ids, weights);
	return wf__cuda_launched(diag, "route");
}

/* The kernel's steps on the host: the same softmax arithmetic (the double sum's order aside)
 * and the same order, marker and renormalization. */
extern "C" int wf__cuda_route_host(const float *logits, uint32_t n, uint32_t n_expert, uint32_t k,
                                   int32_t *ids, float *weights)
{
	int rc = route_check(n_expert, k, NULL);
	if (rc < 0)
		return rc;
	float pr[ROUTE_MAX_EXPERT], sel[ROUTE_MAX_K];
	for (uint32_t t = 0; t < n; t++) {
		const float *x = logits + (size_t)t * n_expert;
		float mx = -INFINITY;
		for (uint32_t e = 0; e < n_expert; e++)
			mx = x[e] > mx ? x[e] : mx;
		double sum = 0.0;
		for (uint32_t e = 0; e < n_expert; e++) {
			pr[e] = expf(x[e] - mx);
			sum += (double)pr[e];
		}
		const float inv = (float)(1.0 / sum);
		for (uint32_t e = 0; e < n_expert; e++)
			pr[e] = mul_rn(pr[e], inv);
		for (uint32_t j = 0; j < k; j++) {
			float bp = -INFINITY;
			int32_t bi = INT32_MAX;
			for (uint32_t e = 0; e < n_expert; e++) {
				route_consider(pr, e, &bp, &bi);
			}
			if (bi == INT32_MAX) {
				bi = route_fallback(pr, n_expert);
				bp = pr[bi];
			}
			ids[(size_t)t * k + j] = bi;
			sel[j] = bp;
			pr[bi] = ROUTE_TAKEN;
		}
		route_renorm(sel, k, weights + (size_t)t * k);
	}
	return 0;
}

/* ---- element-wise ------------------------------------------------------------------------- */

static unsigned ew_blocks(size_t count)
{
	size_t b = (count + EW_THREADS - 1) / EW_THREADS;
	return (unsigned)(b > EW_MAX_BLOCKS ? EW_MAX_BLOCKS : b);
}

#define EW_FOR(e, count)                                                                           \
	for (size_t e = (size_t)blockIdx.x * EW_THREADS + threadIdx.x; e < (count);                \
	     e += (size_t)gridDim.x * EW_THREADS)

/* dst row (dst_idx ? dst_idx[r] : r) = src row (src_idx ? src_idx[r] : r), len floats. */
static __global__ void __launch_bounds__(EW_THREADS)
    copy_rows_kernel(const float *src, size_t ss, const uint32_t *si, size_t total, uint32_t len,
                     float *dst, size_t ds, const uint32_t *di)
{
	EW_FOR(e, total)
	{
		const size_t r = e / len, i = e % len;
		dst[(size_t)(di ? di[r] : r) * ds + i] = src[(size_t)(si ? si[r] : r) * ss + i];
	}
}

extern "C" int wf__cuda_copy_rows(struct wf_backend_ctx *c, const float *src, size_t src_stride,
                                  const uint32_t *src_idx, uint32_t n, uint32_t len, float *dst,
                                  size_t dst_stride, const uint32_t *dst_idx, struct wf_diag *diag)
{
	const size_t total = (size_t)n * len;
	if (total == 0)
		return 0;
	if (!src || !dst)
		return wf_diag_set(diag, WF_EINVAL, "copy_rows: no source or destination");
	copy_rows_kernel<<<ew_blocks(total), EW_THREADS, 0, c->stream>>>(
	    src, src_stride, src_idx, total, len, dst, dst_stride, dst_idx);
	return wf__cuda_launched(diag, "copy_rows");
}

/* y may alias g: each element is read, then written, by one thread. */
static __global__ void __launch_bounds__(EW_THREADS)
    swiglu_kernel(const float *g, const float *u, float *y, size_t count)
{
	EW_FOR(i, count)
	{
		const float gi = g[i];
		y[i] = mul_rn(gi / (1.0f + expf(-gi)), u[i]);
	}
}

extern "C" int wf__cuda_swiglu(struct wf_backend_ctx *c, const float *g, const float *u, float *y,
                               size_t count, struct wf_diag *diag)
{
	if (count == 0)
		return 0;
	swiglu_kernel<<<ew_blocks(count), EW_THREADS, 0, c->stream>>>(g, u, y, count);
	return wf__cuda_launched(diag, "swiglu");
}

static __global__ void __launch_bounds__(EW_THREADS)
    add_kernel(float *y, const float *x, size_t count)
{
	EW_FOR(i, count)
	y[i] = add_rn(y[i], x[i]);
}

extern "C" int wf__cuda_add(struct wf_backend_ctx *c, float *y, const float *x, size_t count,
                            struct wf_diag *diag)
{
	if (count == 0)
		return 0;
	add_kernel<<<ew_blocks(count), EW_THREADS, 0, c->stream>>>(y, x, count);
	return wf__cuda_launched(diag, "add");
}

/* y[t][i] = ((d[t k] w[t k] + d[t k + 1] w[t k + 1]) + ...)[i], d's rows token-major. */
static __global__ void __launch_bounds__(EW_THREADS)
    moe_sum_kernel(const float *d, const float *weights, size_t total, uint32_t k, uint32_t len,
                   float *y)
{
	EW_FOR(e, total)
	{
		const size_t t = e / len, i = e % len;
		float acc = 0.0f;
		for (uint32_t j = 0; j < k; j++) {
			const float p =
			    mul_rn(d[((size_t)t * k + j) * len + i], weights[t * k + j]);
			acc = j == 0 ? p : add_rn(acc, p);
		}
		y[e] = acc;
	}
}

extern "C" int wf__cuda_moe_sum(struct wf_backend_ctx *c, const float *d, const float *weights,
                                uint32_t n, uint32_t k, uint32_t len, float *y,
                                struct wf_diag *diag)
{
	const size_t total = (size_t)n * len;

	if (k == 0)
		return wf_diag_set(diag, WF_EINVAL, "moe_sum: no expert per token");
	if (total == 0)
		return 0;
	moe_sum_kernel<<<ew_blocks(total), EW_THREADS, 0, c->stream>>>(d, weights, total, k, len,
	                                                               y);
	return wf__cuda_launched(diag, "moe_sum");
}

extern "C" int wf__cuda_moe_preload(struct wf_diag *diag)
{
	cudaFuncAttributes attr;
	const void *kernels[] = {(const void *)route_kernel, (const void *)copy_rows_kernel,
	                         (const void *)swiglu_kernel, (const void *)add_kernel,
	                         (const void *)moe_sum_kernel};
	for (const void *k : kernels) {
		const cudaError_t e = cudaFuncGetAttributes(&attr, k);
		if (e != cudaSuccess)
			return wf__cuda_fail(e, diag, "loading the MoE kernels");
	}
	return 0;
}
