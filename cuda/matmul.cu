/* The matmul family of the CUDA backend (matmul.h): matmul, mul_mat_id and get_rows.
 *
 * Kernels:
 *  act_kernel<kind>   one block per activation row: the row converted to its product's
 *                     vec_dot_type (quant.cuh), into the activation workspace.
 *  mv_kernel<T,N,V>   the mat-vec (mmv.cuh): 4 warps per block, one weight row per warp, N (1, 2,
 *                     4, 8, 16 or 32) activation rows in registers, the warp's lanes added by xor
 *                     shuffles, lane 0 writing. 128 threads; ptxas (sm_90): 24-44 registers at
 *                     N = 1 (16 blocks, 64 warps per SM: the bytes in flight decode needs), at
 *                     most 70 for the quantized types at N = 32; the float types' 16-byte path
 *                     takes 160-168 at N = 32 (3 blocks per SM: batches of 17-32 rows only).
 *                     No kernel spills. V: the float types' 16-byte path.
 *  mv_id_kernel<T,V>  mul_mat_id's decode path: grid (pairs, row blocks); a pair (token t, choice
 *                     j) reads its expert id on the device, so a decode step needs no host wait.
 *  dq_f16_kernel<T>   weight rows to F16 for cuBLAS, one thread per 8 elements, one 16-byte
 *                     store each.
 *  get_rows_kernel<T> rows picked by ids in device memory.
 *  scale_kernel, scatter_kernel: the F16 overflow guard's outputs scaled back; mul_mat_id's GEMM
 *                     results moved from expert order to their rows.
 *
 * Nothing here synchronizes except mul_mat_id's prompt path (n * k > 64), which reads the ids back
 * (the rows are grouped per expert on the host, as the old engine did) and waits for the stream
 * once per call. Every buffer is the context's, allocated at create. */
#include "cuda/backend_ctx.h"
#include "cuda/matmul.h"
#include "cuda/mmv.cuh"

#include "base/error.h"
#include "device/device.h"

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MV_WARPS   4
#define MV_THREADS (32 * MV_WARPS)
#define EW_THREADS 256
/* Expert groups of a prompt with at least this many rows go through cuBLAS (dequantize the
 * expert once, one GEMM); smaller ones through the mat-vec kernel, one pair per block, which
 * reads the expert's weights once per row (from L2 for a 1-3 MB expert). At 16 rows the GEMM
 * path moves ~7 MB (dequantize, write and read F16) against ~15 MB of L2 reads: about even. */
#define MMID_GEMM_MIN 16u
/* Workspace caps. The F16 weight slab: 32 MiB of halves takes an expert (Qwen3-30B: 3 MiB) whole
 * and the 151936 x 2048 output head in 10 slabs of 8192 rows (a GEMM that still fills the GPU).
 * GEMM activation rows per chunk: 1024 (a 512-token prompt, or 128 tokens x 8 experts, in one).
 * mul_mat_id's GEMM outputs in expert order: 4 Mi floats (16 MiB). */
#define WH_CAP_HALVES ((int64_t)1 << 24)
#define P_ROWS_CAP    1024u
#define YP_CAP_FLOATS ((int64_t)1 << 22)

struct wf__cuda_mm {
	bool gemm; /* max_rows > WF_CUDA_MV_MAX_ROWS: the cuBLAS path can run */
	cublasHandle_t blas;
	void *blas_ws;
	size_t blas_ws_bytes;
	uint8_t *act; /* converted activation rows (mat-vec paths), max_rows x act_row_bytes */
	int64_t act_row;
	int32_t *act_exp; /* their F16 exponents */
	uint16_t *p;      /* GEMM activations (F16 or BF16), p_rows x p_ld halves */
	int32_t *p_exp;
	uint32_t p_rows;
	int64_t p_ld;
	uint16_t *wh; /* dequantized weight rows (F16) */
	int64_t wh_halves;
	float *yp; /* mul_mat_id's GEMM outputs, in expert order */
	int64_t yp_floats;
	uint32_t *d_order, *d_list; /* device copies of the prompt path's row lists */
	int32_t *h_ids;             /* pinned: the ids read back */
	uint32_t *h_order, *h_list; /* pinned: GEMM rows in expert order, small rows */
	uint32_t *count_of;         /* host, per stack matrix */
	uint32_t *g_index, *g_first, *g_count, *g_fill; /* host, per group */
	uint64_t *g_pairs;                              /* host: (matrix, count) to sort */
};

/* ---- cuBLAS, loaded on demand ----------------------------------------------------------------
 * Loaded by the first CUDA context that can take the GEMM path, not at process start: mapping
 * libcublas relocates about 95 MB of private memory into every process that links it (measured:
 * a process's Anonymous bytes before and after loading it). The configured library's path first,
 * then its soname through the run path. A failed load (library or symbol missing) closes what it
 * opened and is tried again by the next context: no leaked handle, no permanent failure. */
static pthread_mutex_t blas_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
	bool loaded;
	void *handle;
	decltype(&cublasCreate_v2) create;
	decltype(&cublasDestroy_v2) destroy;
	decltype(&cublasSetStream_v2) set_stream;
	decltype(&cublasSetWorkspace_v2) set_workspace;
	decltype(&cublasSetMathMode) set_math_mode;
	/* The C symbol; C++ overloads the name in the header. */
	cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int,
	                          int, const void *, const void *, cudaDataType, int, const void *,
	                          cudaDataType, int, const void *, void *, cudaDataType, int,
	                          cublasComputeType_t, cublasGemmAlgo_t);
	decltype(&cublasGetStatusName) status_name;
	decltype(&cublasGetStatusString) status_string;
} blas;

int wf__cuda_blas_load(struct wf_diag *diag)
{
	const char *const paths[] = {WF_CUBLAS_PATH, WF_CUBLAS_SONAME};
	int rc = 0;

	pthread_mutex_lock(&blas_mu);
	if (blas.loaded)
		goto out;
	for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]) && !blas.handle; i++)
		blas.handle = dlopen(paths[i], RTLD_NOW | RTLD_LOCAL);
	if (!blas.handle) {
		rc = wf_diag_set(diag, WF_EUNSUPPORTED, "cannot load cuBLAS (%s): %s",
		                 WF_CUBLAS_SONAME, dlerror());
		goto out;
	}
	{
		const struct {
			void **fn;
			const char *name;
		} syms[] = {
		    {(void **)&blas.create, "cublasCreate_v2"},
		    {(void **)&blas.destroy, "cublasDestroy_v2"},
		    {(void **)&blas.set_stream, "cublasSetStream_v2"},
		    {(void **)&blas.set_workspace, "cublasSetWorkspace_v2"},
		    {(void **)&blas.set_math_mode, "cublasSetMathMode"},
		    {(void **)&blas.gemm_ex, "cublasGemmEx"},
		    {(void **)&blas.status_name, "cublasGetStatusName"},
		    {(void **)&blas.status_string, "cublasGetStatusString"},
		};
		for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
			*syms[i].fn = dlsym(blas.handle, syms[i].name);
			if (!*syms[i].fn) {
				rc = wf_diag_set(diag, WF_EUNSUPPORTED, "cuBLAS (%s) lacks %s",
				                 WF_CUBLAS_SONAME, syms[i].name);
				dlclose(blas.handle);
				blas.handle = NULL;
				goto out;
			}
		}
	}
	blas.loaded = true;
out:
	pthread_mutex_unlock(&blas_mu);
	return rc;
}

static int blas_fail(cublasStatus_t st, struct wf_diag *diag, const char *what)
{
	(void)cudaGetLastError();
	return wf_diag_set(diag, st == CUBLAS_STATUS_ALLOC_FAILED ? -ENOMEM : WF_EDEVICE,
	                   "%s: %s (%s)", what, blas.status_name(st), blas.status_string(st));
}

/* ---- Kernels -------------------------------------------------------------------------------- */

static __device__ __forceinline__ float warp_max(float v)
{
	for (int off = 16; off > 0; off >>= 1) {
		const float o = __shfl_xor_sync(0xffffffffu, v, off);
		v = o > v ? o : v;
	}
	return v;
}

/* Row r of the output: x row (rows ? rows[r] : r) / div (mul_mat_id's gather: a token's row
 * for each of its k choices). F16 rows record their exponent in exps[r]. */
template <enum wf_act K>
static __global__ void __launch_bounds__(MV_THREADS)
    act_kernel(const float *x, size_t xs, const uint32_t *rows, uint32_t div, int64_t ne0,
               uint8_t *out, size_t out_stride, int32_t *exps)
{
	const uint32_t r = blockIdx.x;
	const float *xr = x + (size_t)((rows ? rows[r] : r) / div) * xs;
	uint8_t *o = out + (size_t)r * out_stride;
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

	if constexpr (K == WF_ACT_Q8_0) {
		float *d = reinterpret_cast<float *>(o + wf_align16(ne0));
		for (int64_t b = warp; b < ne0 / 32; b += MV_WARPS) {
			const float v = xr[32 * b + lane], a = fabsf(v);
			float id;
			const float amax = warp_max(a > 0.0f ? a : 0.0f); /* NaN: 0 */
			const float dq = wf_q8_0_scale(amax, &id);
			reinterpret_cast<int8_t *>(o)[32 * b + lane] = wf_q8_0_value(v, id);
			if (lane == 0)
				d[b] = dq;
		}
	} else if constexpr (K == WF_ACT_Q8_K) {
		float *d = reinterpret_cast<float *>(o + wf_align16(ne0));
		for (int64_t b = warp; b < ne0 / 256; b += MV_WARPS) {
			const float *xb = xr + 256 * b;
			float v[8], best = 0.0f;
			int bi = INT_MAX;
			for (int i = 0; i < 8; i++) {
				v[i] = xb[lane + 32 * i];
				if (wf_q8_K_before(fabsf(v[i]), lane + 32 * i, best, bi)) {
					best = fabsf(v[i]);
					bi = lane + 32 * i;
				}
			}
			for (int off = 16; off > 0; off >>= 1) {
				const float ob = __shfl_xor_sync(0xffffffffu, best, off);
				const int oi = __shfl_xor_sync(0xffffffffu, bi, off);
				if (wf_q8_K_before(ob, oi, best, bi)) {
					best = ob;
					bi = oi;
				}
			}
			int8_t *q = reinterpret_cast<int8_t *>(o) + 256 * b;
			if (best == 0.0f) {
				for (int i = 0; i < 8; i++)
					q[lane + 32 * i] = 0;
				if (lane == 0)
					d[b] = 0.0f;
				continue;
			}
			const float is = wf_q8_K_iscale(xb[bi]);
			for (int i = 0; i < 8; i++)
				q[lane + 32 * i] = wf_q8_K_value(v[i], is);
			if (lane == 0)
				d[b] = 1.0f / is;
		}
	} else if constexpr (K == WF_ACT_F16) {
		__shared__ float part[MV_WARPS];
		float m = 0.0f;
		for (int64_t i = threadIdx.x; i < ne0; i += MV_THREADS) {
			const float a = fabsf(xr[i]);
			m = a > m ? a : m;
		}
		m = warp_max(m);
		if (lane == 0)
			part[warp] = m;
		__syncthreads();
		for (int w = 0; w < MV_WARPS; w++)
			m = part[w] > m ? part[w] : m;
		const int e = wf_f16_exp(m);
		const float s = wf_pow2(-e);
		uint16_t *h = reinterpret_cast<uint16_t *>(o);
		for (int64_t i = threadIdx.x; i < ne0; i += MV_THREADS)
			h[i] = wf_f2h(xr[i] * s);
		if (threadIdx.x == 0)
			exps[r] = e;
	} else if constexpr (K == WF_ACT_BF16) {
		uint16_t *h = reinterpret_cast<uint16_t *>(o);
		for (int64_t i = threadIdx.x; i < ne0; i += MV_THREADS)
			h[i] = wf_f2bf(xr[i]);
	}
}

static __device__ __forceinline__ float warp_sum(float v)
{
	for (int off = 16; off > 0; off >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, off);
	return v;
}

template <enum wf_dtype T, int N, bool VEC>
static __global__ void __launch_bounds__(MV_THREADS)
    mv_kernel(const uint8_t *w, size_t row_size, int64_t ne0, int64_t ne1, wf_mv_act a, int n,
              const int32_t *exps, float *y, size_t ys)
{
	const int64_t row = (int64_t)blockIdx.x * MV_WARPS + threadIdx.x / 32;
	const int lane = threadIdx.x % 32;
	float acc[N];

	/* row is the same for the 32 lanes of a warp: whole warps leave, the shuffles below
	 * always run with all lanes present. */
	if (row >= ne1)
		return;
	wf_mv_lane<T, N, VEC>(w + (size_t)row * row_size, ne0, a, n, lane, acc);
#pragma unroll
	for (int j = 0; j < N; j++)
		acc[j] = warp_sum(acc[j]);
	if (lane == 0) {
#pragma unroll
		for (int j = 0; j < N; j++)
			if (j < n)
				y[(size_t)j * ys + row] =
				    T == WF_DTYPE_F16 ? acc[j] * wf_pow2(exps[j]) : acc[j];
	}
}

/* mul_mat_id, one (token, choice) pair per blockIdx.x (row list[pair] of ids, or pair itself),
 * 4 weight rows per blockIdx.y. An id < 0 leaves the pair's row of y alone; an id past the stack
 * writes NaN (bytes that break the caller's promise must not fault the device). */
template <enum wf_dtype T, bool VEC>
static __global__ void __launch_bounds__(MV_THREADS)
    mv_id_kernel(const uint8_t *w, size_t row_size, size_t stride, int64_t ne0, int64_t ne1,
                 wf_mv_act a, const int32_t *ids, const uint32_t *list, uint32_t k, int per_slot,
                 uint32_t max_stack, const int32_t *exps, float *y, size_t ys)
{
	const uint32_t r = list ? list[blockIdx.x] : blockIdx.x;
	const int32_t e = ids[r];
	const int64_t row = (int64_t)blockIdx.y * MV_WARPS + threadIdx.x / 32;
	const int lane = threadIdx.x % 32;

	if (e < 0 || row >= ne1) /* uniform per block, then per warp */
		return;
	if ((uint32_t)e >= max_stack) {
		if (lane == 0)
			y[(size_t)r * ys + row] = __int_as_float(0x7fc00000);
		return;
	}
	const uint32_t xr = per_slot ? r : r / k;
	/* Read before the loop: kept live across it, the pointer made ptxas spill 8 bytes. */
	const float sc = T == WF_DTYPE_F16 ? wf_pow2(exps[xr]) : 1.0f;
	wf_mv_act ar = a;
	ar.base += (size_t)xr * a.stride;
	float acc[1];
	wf_mv_lane<T, 1, VEC>(w + (size_t)e * stride + (size_t)row * row_size, ne0, ar, 1, lane,
	                      acc);
	acc[0] = warp_sum(acc[0]);
	if (lane == 0)
		y[(size_t)r * ys + row] = T == WF_DTYPE_F16 ? acc[0] * sc : acc[0];
}

/* rows weight rows to F16, out[r * ne0 + e] (ne0 % 8 == 0: one 16-byte store per thread). */
template <enum wf_dtype T>
static __global__ void __launch_bounds__(EW_THREADS)
    dq_f16_kernel(const uint8_t *w, size_t row_size, int64_t ne0, int64_t rows, uint16_t *out)
{
	const int64_t groups = ne0 / WF_DQ_GROUP;
	const int64_t step = (int64_t)gridDim.x * blockDim.x;

	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < rows * groups;
	     i += step) {
		const int64_t r = i / groups, g = i % groups;
		float v[WF_DQ_GROUP];
		uint32_t h[4];

		wf_dq<T>::group(w + (size_t)r * row_size, g, v);
#pragma unroll
		for (int l = 0; l < 4; l++)
			h[l] = (uint32_t)wf_f2h(v[2 * l]) | ((uint32_t)wf_f2h(v[2 * l + 1]) << 16);
		reinterpret_cast<uint4 *>(out + r * ne0)[g] = make_uint4(h[0], h[1], h[2], h[3]);
	}
}

/* y[j][0..ne0) = row ids[j]; an id outside [0, ne1) gives a zero row rather than a read out of
 * bounds (the engine checks token ids before; bad bytes must not fault the device). */
template <enum wf_dtype T>
static __global__ void __launch_bounds__(EW_THREADS)
    get_rows_kernel(const uint8_t *w, size_t row_size, int64_t ne0, int64_t ne1, const int32_t *ids,
                    int64_t n, float *y)
{
	const int64_t groups = ne0 / WF_DQ_GROUP;
	const int64_t step = (int64_t)gridDim.x * blockDim.x;
	const int64_t first = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;

	for (int64_t i = first; i < n * groups; i += step) {
		const int64_t j = i / groups, g = i % groups;
		const int32_t id = ids[j];
		float *o = y + j * ne0 + WF_DQ_GROUP * g;
		float v[WF_DQ_GROUP];

		if (id >= 0 && id < ne1) {
			wf_dq<T>::group(w + (size_t)id * row_size, g, v);
		} else {
#pragma unroll
			for (int l = 0; l < WF_DQ_GROUP; l++)
				v[l] = 0.0f;
		}
#pragma unroll
		for (int l = 0; l < WF_DQ_GROUP; l++)
			o[l] = v[l];
	}
	if constexpr (wf_dq<T>::BLOCK == 1) {
		const int64_t tail = ne0 - groups * WF_DQ_GROUP;
		for (int64_t i = first; i < n * tail; i += step) {
			const int64_t j = i / tail, e = groups * WF_DQ_GROUP + i % tail;
			const int32_t id = ids[j];
			y[j * ne0 + e] = id >= 0 && id < ne1
			                     ? wf_dq_elem<T>(w + (size_t)id * row_size, e)
			                     : 0.0f;
		}
	}
}

/* The F16 guard's outputs scaled back: y[j * ys + i] *= 2^exps[j] (exact). */
static __global__ void __launch_bounds__(EW_THREADS)
    scale_kernel(float *y, size_t ys, int64_t ne1, int64_t n, const int32_t *exps)
{
	const int64_t step = (int64_t)gridDim.x * blockDim.x;
	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n * ne1; i += step) {
		const int64_t j = i / ne1;
		const int32_t e = exps[j];
		if (e)
			y[(size_t)j * ys + i % ne1] *= wf_pow2(e);
	}
}

/* y[order[r] * ys + i] = yp[r * ne1 + i] (times 2^exps[r] with exps). */
static __global__ void __launch_bounds__(EW_THREADS)
    scatter_kernel(const float *yp, int64_t ne1, int64_t rows, const uint32_t *order,
                   const int32_t *exps, float *y, size_t ys)
{
	const int64_t step = (int64_t)gridDim.x * blockDim.x;
	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < rows * ne1;
	     i += step) {
		const int64_t r = i / ne1;
		const float v = yp[i];
		y[(size_t)order[r] * ys + i % ne1] = exps ? v * wf_pow2(exps[r]) : v;
	}
}

/* ---- Dispatch from runtime values ------------------------------------------------------------ */

/* Calls f.go<T, N>() with n (1..32) rounded up to the kernels' register counts. */
template <enum wf_dtype T, class F> static int with_rows(F &f, uint32_t n)
{
	if (n == 1)
		f.template go<T, 1>();
	else if (n == 2)
		f.template go<T, 2>();
	else if (n <= 4)
		f.template go<T, 4>();
	else if (n <= 8)
		f.template go<T, 8>();
	else if (n <= 16)
		f.template go<T, 16>();
	else if (n <= 32)
		f.template go<T, 32>();
	else
		return WF_EINVAL;
	return 0;
}

/* Bytes of a row of ne0 elements; -1 when ne0 is not a whole number of blocks. */
struct row_bytes_fn {
	int64_t ne0;
	template <enum wf_dtype T> int64_t operator()()
	{
		if (ne0 % wf_dq<T>::BLOCK)
			return -1;
		return ne0 / wf_dq<T>::BLOCK * wf_dq<T>::BYTES;
	}
};

/* The alignment the kernels read blocks with (mmv.cuh): 4-byte words in F32, Q4_K and Q5_K,
 * halves elsewhere. */
static size_t type_align(enum wf_dtype t)
{
	return t == WF_DTYPE_F32 || t == WF_DTYPE_Q4_K || t == WF_DTYPE_Q5_K ? 4 : 2;
}

static bool aligned16(const void *p, size_t a, size_t b)
{
	return (((uintptr_t)p | a | b) & 15) == 0;
}

struct mv_launch_fn {
	const struct wf_backend_matrix *w;
	wf_mv_act a;
	uint32_t n;
	const int32_t *exps;
	float *y;
	size_t ys;
	bool vec;
	cudaStream_t s;

	template <enum wf_dtype T, int N> void go()
	{
		const unsigned blocks = (unsigned)((w->ne1 + MV_WARPS - 1) / MV_WARPS);
		const uint8_t *wd = (const uint8_t *)w->data;
		/* the 16-byte path exists for the float types only (mv_vec) */
		if constexpr (wf_dq<T>::BLOCK == 1) {
			if (vec) {
				mv_kernel<T, N, true><<<blocks, MV_THREADS, 0, s>>>(
				    wd, w->row_size, w->ne0, w->ne1, a, (int)n, exps, y, ys);
				return;
			}
		}
		mv_kernel<T, N, false><<<blocks, MV_THREADS, 0, s>>>(
		    wd, w->row_size, w->ne0, w->ne1, a, (int)n, exps, y, ys);
	}
	template <enum wf_dtype T> int operator()()
	{
		return with_rows<T>(*this, n);
	}
};

struct mv_id_launch_fn {
	const struct wf_backend_matrix *w;
	wf_mv_act a;
	const int32_t *ids;
	const uint32_t *list;
	uint32_t pairs, k;
	bool per_slot;
	uint32_t max_stack;
	const int32_t *exps;
	float *y;
	size_t ys;
	bool vec;
	cudaStream_t s;

	template <enum wf_dtype T> int operator()()
	{
		const dim3 grid(pairs, (unsigned)((w->ne1 + MV_WARPS - 1) / MV_WARPS));
		const uint8_t *wd = (const uint8_t *)w->data;
		if constexpr (wf_dq<T>::BLOCK == 1) {
			if (vec) {
				mv_id_kernel<T, true><<<grid, MV_THREADS, 0, s>>>(
				    wd, w->row_size, w->stride, w->ne0, w->ne1, a, ids, list, k,
				    per_slot, max_stack, exps, y, ys);
				return 0;
			}
		}
		mv_id_kernel<T, false>
		    <<<grid, MV_THREADS, 0, s>>>(wd, w->row_size, w->stride, w->ne0, w->ne1, a, ids,
		                                 list, k, per_slot, max_stack, exps, y, ys);
		return 0;
	}
};

struct dq_f16_launch_fn {
	const uint8_t *w;
	size_t row_size;
	int64_t ne0, rows;
	uint16_t *out;
	unsigned blocks;
	cudaStream_t s;

	template <enum wf_dtype T> int operator()()
	{
		if constexpr (wf_dq<T>::BLOCK == 1)
			return WF_EINVAL; /* plain types go to cuBLAS as they are */
		else
			dq_f16_kernel<T><<<blocks, EW_THREADS, 0, s>>>(w, row_size, ne0, rows, out);
		return 0;
	}
};

struct get_rows_launch_fn {
	const uint8_t *w;
	size_t row_size;
	int64_t ne0, ne1;
	const int32_t *ids;
	int64_t n;
	float *y;
	unsigned blocks;
	cudaStream_t s;

	template <enum wf_dtype T> int operator()()
	{
		get_rows_kernel<T><<<blocks, EW_THREADS, 0, s>>>(w, row_size, ne0, ne1, ids, n, y);
		return 0;
	}
};

/* ---- Preloading: every kernel of the family, loaded at create ------------------------------- */

template <class K> static cudaError_t touch(K kernel)
{
	cudaFuncAttributes attr;
	return cudaFuncGetAttributes(&attr, reinterpret_cast<const void *>(kernel));
}

struct preload_fn {
	cudaError_t e = cudaSuccess;

	void add(cudaError_t r)
	{
		if (e == cudaSuccess)
			e = r;
	}
	template <enum wf_dtype T, int N> void go()
	{
		add(touch(mv_kernel<T, N, false>));
		if constexpr (wf_dq<T>::BLOCK == 1)
			add(touch(mv_kernel<T, N, true>));
	}
	template <enum wf_dtype T> int operator()()
	{
		for (uint32_t n : {1u, 2u, 4u, 8u, 16u, 32u})
			(void)with_rows<T>(*this, n);
		add(touch(mv_id_kernel<T, false>));
		add(touch(get_rows_kernel<T>));
		if constexpr (wf_dq<T>::BLOCK == 1)
			add(touch(mv_id_kernel<T, true>));
		else
			add(touch(dq_f16_kernel<T>));
		return 0;
	}
};

int wf__cuda_mm_preload(struct wf_diag *diag)
{
	static const enum wf_dtype types[] = {WF_DTYPE_F32,  WF_DTYPE_F16,  WF_DTYPE_BF16,
	                                      WF_DTYPE_Q8_0, WF_DTYPE_Q4_0, WF_DTYPE_Q4_K,
	                                      WF_DTYPE_Q5_K, WF_DTYPE_Q6_K};
	preload_fn f;
	for (enum wf_dtype t : types)
		(void)wf_dq_dispatch(t, f, 0);
	f.add(touch(act_kernel<WF_ACT_Q8_0>));
	f.add(touch(act_kernel<WF_ACT_Q8_K>));
	f.add(touch(act_kernel<WF_ACT_F16>));
	f.add(touch(act_kernel<WF_ACT_BF16>));
	f.add(touch(scale_kernel));
	f.add(touch(scatter_kernel));
	return f.e == cudaSuccess ? 0 : wf__cuda_fail(f.e, diag, "loading the matmul kernels");
}

/* ---- Checks ---------------------------------------------------------------------------------- */

bool wf__cuda_supports(enum wf_dtype type)
{
	switch (type) {
	case WF_DTYPE_F32:
	case WF_DTYPE_F16:
	case WF_DTYPE_BF16:
	case WF_DTYPE_Q8_0:
	case WF_DTYPE_Q4_0:
	case WF_DTYPE_Q4_K:
	case WF_DTYPE_Q5_K:
	case WF_DTYPE_Q6_K:
		return true;
	default:
		return false;
	}
}

/* w against its type: supported, whole blocks, rows at least that long, the kernels' alignment,
 * sizes that cuBLAS's ints take. */
static int check_matrix(const struct wf_backend_matrix *w, const char *op, struct wf_diag *diag)
{
	if (!w || !wf__cuda_supports(w->type))
		return wf_diag_set(diag, WF_EUNSUPPORTED, "%s: weight type %d has no CUDA kernel",
		                   op, w ? (int)w->type : -1);
	row_bytes_fn rb = {w->ne0};
	const int64_t bytes = wf_dq_dispatch(w->type, rb, (int64_t)-1);
	const size_t al = type_align(w->type);
	if (w->ne0 <= 0 || w->ne1 <= 0 || w->ne0 > INT_MAX || w->ne1 > INT_MAX || bytes < 0 ||
	    w->row_size < (size_t)bytes || w->row_size / al > INT_MAX || !w->data)
		return wf_diag_set(diag, WF_EINVAL,
		                   "%s: bad weight matrix (%lld x %lld of type %d, rows %zu bytes)",
		                   op, (long long)w->ne0, (long long)w->ne1, (int)w->type,
		                   w->row_size);
	if (((uintptr_t)w->data | w->row_size | w->stride) % al)
		return wf_diag_set(
		    diag, WF_EINVAL,
		    "%s: weight matrix of type %d not %zu-byte aligned (data %p, rows "
		    "%zu, stride %zu bytes)",
		    op, (int)w->type, al, w->data, w->row_size, w->stride);
	return 0;
}

static int check_products(const struct wf_backend_ctx *c, uint32_t n_products,
                          const struct wf_backend_product *p, uint32_t rows, const char *op,
                          struct wf_diag *diag)
{
	if (n_products == 0 || n_products > WF_BACKEND_MAX_PRODUCTS || !p)
		return wf_diag_set(diag, WF_EINVAL, "%s: %u products in one call", op, n_products);
	if (rows > c->lim.max_rows)
		return wf_diag_set(diag, WF_EINVAL, "%s: %u activation rows (at most %u)", op, rows,
		                   c->lim.max_rows);
	for (uint32_t i = 0; i < n_products; i++) {
		int rc = check_matrix(p[i].w, op, diag);
		if (rc < 0)
			return rc;
		if (p[i].w->ne0 != p[0].w->ne0 || p[i].w->ne0 > c->lim.max_ne0)
			return wf_diag_set(
			    diag, WF_EINVAL,
			    "%s: products of rows of %lld elements (context: at most "
			    "%lld, all alike)",
			    op, (long long)p[i].w->ne0, (long long)c->lim.max_ne0);
		if (!p[i].y || (rows > 1 && p[i].y_stride < (size_t)p[i].w->ne1) ||
		    p[i].y_stride > INT_MAX)
			return wf_diag_set(diag, WF_EINVAL, "%s: output stride %zu for %lld rows",
			                   op, p[i].y_stride, (long long)p[i].w->ne1);
	}
	return 0;
}

/* ---- Workspace ------------------------------------------------------------------------------- */

void wf__cuda_mm_destroy(struct wf_backend_ctx *c)
{
	struct wf__cuda_mm *mm = c->mm;
	if (!mm)
		return;
	if (mm->blas)
		(void)blas.destroy(mm->blas);
	wf__cuda_ctx_free(c, mm->blas_ws);
	wf__cuda_ctx_free(c, mm->act);
	wf__cuda_ctx_free(c, mm->act_exp);
	wf__cuda_ctx_free(c, mm->p);
	wf__cuda_ctx_free(c, mm->p_exp);
	wf__cuda_ctx_free(c, mm->wh);
	wf__cuda_ctx_free(c, mm->yp);
	wf__cuda_ctx_free(c, mm->d_order);
	wf__cuda_ctx_free(c, mm->d_list);
	(void)wf_device_pinned_free(c->dev, mm->h_ids, NULL);
	(void)wf_device_pinned_free(c->dev, mm->h_order, NULL);
	(void)wf_device_pinned_free(c->dev, mm->h_list, NULL);
	free(mm->count_of);
	free(mm->g_index);
	free(mm->g_first);
	free(mm->g_count);
	free(mm->g_fill);
	free(mm->g_pairs);
	free(mm);
	c->mm = NULL;
}

/* Allocates and zeroes (so that the warm-up and a sanitizer never read garbage). */
static int ws_alloc(struct wf_backend_ctx *c, size_t size, void **ret, struct wf_diag *diag)
{
	int rc = wf__cuda_ctx_alloc(c, size, ret, diag);
	if (rc == 0 && cudaMemsetAsync(*ret, 0, size, c->stream) != cudaSuccess)
		rc = wf__cuda_fail(cudaGetLastError(), diag, "matmul workspace memset");
	return rc;
}

int wf__cuda_mm_create(struct wf_backend_ctx *c, struct wf_diag *diag)
{
	const struct wf_backend_limits *lim = &c->lim;
	const uint32_t rows = lim->max_rows, stack = lim->max_stack ? lim->max_stack : 1;
	struct wf__cuda_mm *mm = (struct wf__cuda_mm *)calloc(1, sizeof(*mm));
	int rc = 0;

	if (!mm)
		return wf_diag_set(diag, -ENOMEM, "CUDA matmul context");
	c->mm = mm;
	if (lim->max_ne0 <= 0 || lim->max_ne0 > INT_MAX || lim->max_ne1 < 0 ||
	    lim->max_ne1 > INT_MAX || rows == 0) {
		rc = wf_diag_set(diag, WF_EINVAL,
		                 "CUDA matmul: limits of %u rows, matrices %lld x %lld", rows,
		                 (long long)lim->max_ne0, (long long)lim->max_ne1);
		goto fail;
	}
	mm->act_row = wf_act_row_bytes(lim->max_ne0);
	if ((rc = ws_alloc(c, (size_t)rows * (size_t)mm->act_row, (void **)&mm->act, diag)) < 0 ||
	    (rc = ws_alloc(c, (size_t)rows * sizeof(int32_t), (void **)&mm->act_exp, diag)) < 0)
		goto fail;
	mm->gemm = rows > WF_CUDA_MV_MAX_ROWS;
	if (mm->gemm) {
		const int64_t ne1 = lim->max_ne1 > 0 ? lim->max_ne1 : 1;
		mm->p_rows = rows < P_ROWS_CAP ? rows : P_ROWS_CAP;
		mm->p_ld = (lim->max_ne0 + 7) & ~(int64_t)7;
		mm->wh_halves =
		    lim->max_ne0 * ne1 < WH_CAP_HALVES ? lim->max_ne0 * ne1 : WH_CAP_HALVES;
		if (mm->wh_halves < 2 * lim->max_ne0)
			mm->wh_halves = 2 * lim->max_ne0; /* a row, and the warm-up's F32 view */
		mm->yp_floats =
		    (int64_t)rows * ne1 < YP_CAP_FLOATS ? (int64_t)rows * ne1 : YP_CAP_FLOATS;
		if (mm->yp_floats < ne1)
			mm->yp_floats = ne1;
		/* cuBLAS's recommended workspace: 32 MiB on Hopper and later, 4 MiB before
		 * (cuBLAS documentation, cublasSetWorkspace). */
		int major = 0;
		if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, c->device) !=
		    cudaSuccess) {
			rc = wf__cuda_fail(cudaGetLastError(), diag, "compute capability");
			goto fail;
		}
		mm->blas_ws_bytes = (size_t)(major >= 9 ? 32 : 4) << 20;
		if ((rc = ws_alloc(c, (size_t)mm->p_rows * (size_t)mm->p_ld * 2, (void **)&mm->p,
		                   diag)) < 0 ||
		    (rc = ws_alloc(c, (size_t)mm->p_rows * sizeof(int32_t), (void **)&mm->p_exp,
		                   diag)) < 0 ||
		    (rc = ws_alloc(c, (size_t)mm->wh_halves * 2, (void **)&mm->wh, diag)) < 0 ||
		    (rc = ws_alloc(c, (size_t)mm->yp_floats * sizeof(float), (void **)&mm->yp,
		                   diag)) < 0 ||
		    (rc = ws_alloc(c, mm->blas_ws_bytes, &mm->blas_ws, diag)) < 0)
			goto fail;
		if ((rc = wf__cuda_blas_load(diag)) < 0)
			goto fail;
		cublasStatus_t st = blas.create(&mm->blas);
		if (st != CUBLAS_STATUS_SUCCESS) {
			mm->blas = NULL;
			rc = blas_fail(st, diag, "cublasCreate");
			goto fail;
		}
		/* The stream first: cublasSetStream resets the workspace to cuBLAS's own pool
		 * (which would allocate at a first GEMM). Default math: TF32 only where asked
		 * (F32 GEMMs ask for none: CUBLAS_COMPUTE_32F_PEDANTIC). */
		st = blas.set_stream(mm->blas, c->stream);
		if (st == CUBLAS_STATUS_SUCCESS)
			st = blas.set_workspace(mm->blas, mm->blas_ws, mm->blas_ws_bytes);
		if (st == CUBLAS_STATUS_SUCCESS)
			st = blas.set_math_mode(mm->blas, CUBLAS_DEFAULT_MATH);
		if (st != CUBLAS_STATUS_SUCCESS) {
			rc = blas_fail(st, diag, "cuBLAS stream, workspace and math mode");
			goto fail;
		}
	}
	if (rows > WF_CUDA_MMID_MAX_ROWS) {
		if ((rc = ws_alloc(c, (size_t)rows * 4, (void **)&mm->d_order, diag)) < 0 ||
		    (rc = ws_alloc(c, (size_t)rows * 4, (void **)&mm->d_list, diag)) < 0 ||
		    (rc = wf_device_pinned_alloc(c->dev, (size_t)rows * 4, 0, (void **)&mm->h_ids,
		                                 diag)) < 0 ||
		    (rc = wf_device_pinned_alloc(c->dev, (size_t)rows * 4, 0, (void **)&mm->h_order,
		                                 diag)) < 0 ||
		    (rc = wf_device_pinned_alloc(c->dev, (size_t)rows * 4, 0, (void **)&mm->h_list,
		                                 diag)) < 0)
			goto fail;
		mm->count_of = (uint32_t *)calloc(stack, sizeof(uint32_t));
		mm->g_index = (uint32_t *)malloc((size_t)rows * sizeof(uint32_t));
		mm->g_first = (uint32_t *)malloc((size_t)rows * sizeof(uint32_t));
		mm->g_count = (uint32_t *)malloc((size_t)rows * sizeof(uint32_t));
		mm->g_fill = (uint32_t *)malloc((size_t)rows * sizeof(uint32_t));
		mm->g_pairs = (uint64_t *)malloc((size_t)rows * sizeof(uint64_t));
		if (!mm->count_of || !mm->g_index || !mm->g_first || !mm->g_count || !mm->g_fill ||
		    !mm->g_pairs) {
			rc = wf_diag_set(diag, -ENOMEM, "CUDA mul_mat_id grouping");
			goto fail;
		}
	}
	return 0;
fail:
	wf__cuda_mm_destroy(c);
	return rc;
}

/* ---- The GEMM path -----------------------------------------------------------------------------
 */

/* y^T[0 .. ne1) x n = W x^T for one matrix (w->data), activations xin (F32, F16 or BF16 columns
 * ldx apart), y rows ldy apart. Column-major: W's rows are the columns of an ne0 x ne1 matrix
 * (lda = row elements apart), x's rows the columns of ne0 x n, y's rows the columns of
 * ne1 x n, so y^T = op_T(W) * x. Quantized W goes through the F16 slab. */
static int gemm(struct wf_backend_ctx *c, const struct wf_backend_matrix *w, const void *xin,
                int64_t ldx, int64_t n, float *y, int64_t ldy, struct wf_diag *diag)
{
	struct wf__cuda_mm *mm = c->mm;
	const float one = 1.0f, zero = 0.0f;
	const int ne0 = (int)w->ne0;
	cublasStatus_t st;

	switch (w->type) {
	case WF_DTYPE_F32:
		st = blas.gemm_ex(mm->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)w->ne1, (int)n, ne0,
		                  &one, w->data, CUDA_R_32F, (int)(w->row_size / 4), xin,
		                  CUDA_R_32F, (int)ldx, &zero, y, CUDA_R_32F, (int)ldy,
		                  CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT);
		return st == CUBLAS_STATUS_SUCCESS ? 0 : blas_fail(st, diag, "cublasGemmEx (F32)");
	case WF_DTYPE_F16:
	case WF_DTYPE_BF16: {
		const cudaDataType t = w->type == WF_DTYPE_F16 ? CUDA_R_16F : CUDA_R_16BF;
		st = blas.gemm_ex(mm->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)w->ne1, (int)n, ne0,
		                  &one, w->data, t, (int)(w->row_size / 2), xin, t, (int)ldx, &zero,
		                  y, CUDA_R_32F, (int)ldy, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
		return st == CUBLAS_STATUS_SUCCESS ? 0
		                                   : blas_fail(st, diag, "cublasGemmEx (F16/BF16)");
	}
	default:
		break;
	}
	const int64_t slab = mm->wh_halves / w->ne0; /* >= 1: the slab holds a max_ne0 row */
	for (int64_t i0 = 0; i0 < w->ne1; i0 += slab) {
		const int64_t m = w->ne1 - i0 < slab ? w->ne1 - i0 : slab;
		dq_f16_launch_fn f = {
		    (const uint8_t *)w->data + (size_t)i0 * w->row_size,
		    w->row_size,
		    w->ne0,
		    m,
		    mm->wh,
		    wf__cuda_grid(c, (uint64_t)m * (uint64_t)(w->ne0 / 8), EW_THREADS),
		    c->stream};
		int rc = wf_dq_dispatch(w->type, f, (int)WF_EUNSUPPORTED);
		if (rc == 0)
			rc = wf__cuda_launched(diag, "matmul (weights to F16)");
		if (rc < 0)
			return rc;
		st = blas.gemm_ex(mm->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)m, (int)n, ne0, &one,
		                  mm->wh, CUDA_R_16F, ne0, xin, CUDA_R_16F, (int)ldx, &zero, y + i0,
		                  CUDA_R_32F, (int)ldy, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
		if (st != CUBLAS_STATUS_SUCCESS)
			return blas_fail(st, diag, "cublasGemmEx (F16, dequantized)");
	}
	return 0;
}

/* Converts rows of x for kind (to out, rows out_stride bytes apart): row r from x row
 * (rows ? rows[r] : r) / div. */
static int convert(struct wf_backend_ctx *c, enum wf_act kind, const float *x, size_t xs,
                   const uint32_t *rows, uint32_t div, uint32_t n, int64_t ne0, void *out,
                   size_t out_stride, int32_t *exps, struct wf_diag *diag)
{
	uint8_t *o = (uint8_t *)out;
	switch (kind) {
	case WF_ACT_Q8_0:
		act_kernel<WF_ACT_Q8_0>
		    <<<n, MV_THREADS, 0, c->stream>>>(x, xs, rows, div, ne0, o, out_stride, exps);
		break;
	case WF_ACT_Q8_K:
		act_kernel<WF_ACT_Q8_K>
		    <<<n, MV_THREADS, 0, c->stream>>>(x, xs, rows, div, ne0, o, out_stride, exps);
		break;
	case WF_ACT_F16:
		act_kernel<WF_ACT_F16>
		    <<<n, MV_THREADS, 0, c->stream>>>(x, xs, rows, div, ne0, o, out_stride, exps);
		break;
	case WF_ACT_BF16:
		act_kernel<WF_ACT_BF16>
		    <<<n, MV_THREADS, 0, c->stream>>>(x, xs, rows, div, ne0, o, out_stride, exps);
		break;
	default:
		return 0;
	}
	return wf__cuda_launched(diag, "matmul (activations)");
}

/* The activations of the mat-vec kernels for type t: the converted rows, or x itself (F32). */
static wf_mv_act mv_act(const struct wf__cuda_mm *mm, enum wf_dtype t, const float *x, size_t xs,
                        int64_t ne0)
{
	wf_mv_act a;
	if (t == WF_DTYPE_F32) {
		a.base = (const uint8_t *)x;
		a.stride = xs * sizeof(float);
		a.d_off = 0;
	} else {
		a.base = mm->act;
		a.stride = (size_t)mm->act_row;
		a.d_off = wf_align16(ne0);
	}
	return a;
}

/* Whether the float types' 16-byte path applies: the matrix rows, and for F32 the caller's x. */
static bool mv_vec(const struct wf_backend_matrix *w, const float *x, size_t xs)
{
	if (w->type != WF_DTYPE_F32 && w->type != WF_DTYPE_F16 && w->type != WF_DTYPE_BF16)
		return false;
	if (w->ne0 % 8 || !aligned16(w->data, w->row_size, w->stride))
		return false;
	return w->type != WF_DTYPE_F32 || aligned16(x, xs * sizeof(float), 0);
}

int wf__cuda_matmul(struct wf_backend_ctx *c, uint32_t n_products,
                    const struct wf_backend_product *p, const float *x, size_t x_stride, uint32_t n,
                    struct wf_diag *diag)
{
	struct wf__cuda_mm *mm = c->mm;
	int rc = check_products(c, n_products, p, n, "matmul", diag);
	if (rc < 0 || n == 0)
		return rc;
	const int64_t ne0 = p[0].w->ne0;
	if (!x || (n > 1 && x_stride < (size_t)ne0) || x_stride > INT_MAX)
		return wf_diag_set(diag, WF_EINVAL, "matmul: input stride %zu for rows of %lld",
		                   x_stride, (long long)ne0);
	const size_t xs = n > 1 ? x_stride : (size_t)ne0;
	int have = -1; /* the kind the workspace holds for this call's x */

	if (n <= WF_CUDA_MV_MAX_ROWS) {
		for (uint32_t i = 0; i < n_products; i++) {
			const struct wf_backend_matrix *w = p[i].w;
			const enum wf_act k = wf_act_of(w->type);
			if (k != WF_ACT_F32 && (int)k != have) {
				rc = convert(c, k, x, xs, NULL, 1, n, ne0, mm->act,
				             (size_t)mm->act_row, mm->act_exp, diag);
				if (rc < 0)
					return rc;
				have = (int)k;
			}
			mv_launch_fn f = {w,
			                  mv_act(mm, w->type, x, xs, ne0),
			                  n,
			                  mm->act_exp,
			                  p[i].y,
			                  n > 1 ? p[i].y_stride : (size_t)w->ne1,
			                  mv_vec(w, x, xs),
			                  c->stream};
			rc = wf_dq_dispatch(w->type, f, (int)WF_EUNSUPPORTED);
			if (rc == 0)
				rc = wf__cuda_launched(diag, "matmul (mat-vec)");
			if (rc < 0)
				return rc;
		}
		return 0;
	}
	if (!mm->gemm)
		return wf_diag_set(diag, WF_EINVAL, "matmul: %u rows without a GEMM workspace", n);
	for (uint32_t i = 0; i < n_products; i++) {
		const struct wf_backend_matrix *w = p[i].w;
		const int64_t ldy = (int64_t)p[i].y_stride;
		if (w->type == WF_DTYPE_F32) {
			if ((rc = gemm(c, w, x, (int64_t)xs, n, p[i].y, ldy, diag)) < 0)
				return rc;
			continue;
		}
		const enum wf_act k = w->type == WF_DTYPE_BF16 ? WF_ACT_BF16 : WF_ACT_F16;
		for (uint32_t r0 = 0; r0 < n; r0 += mm->p_rows) {
			const uint32_t cnt = n - r0 < mm->p_rows ? n - r0 : mm->p_rows;
			if (n > mm->p_rows || (int)k != have) {
				rc = convert(c, k, x + (size_t)r0 * xs, xs, NULL, 1, cnt, ne0,
				             mm->p, (size_t)mm->p_ld * 2, mm->p_exp, diag);
				if (rc < 0)
					return rc;
				have = (int)k;
			}
			float *y = p[i].y + (size_t)r0 * p[i].y_stride;
			if ((rc = gemm(c, w, mm->p, mm->p_ld, cnt, y, ldy, diag)) < 0)
				return rc;
			if (k == WF_ACT_F16) {
				scale_kernel<<<wf__cuda_grid(c, (uint64_t)cnt * w->ne1, EW_THREADS),
				               EW_THREADS, 0, c->stream>>>(y, p[i].y_stride, w->ne1,
				                                           cnt, mm->p_exp);
				if ((rc = wf__cuda_launched(diag, "matmul (F16 scale)")) < 0)
					return rc;
			}
		}
	}
	return 0;
}

/* ---- mul_mat_id --------------------------------------------------------------------------------
 */

static int cmp_u64(const void *a, const void *b)
{
	const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

/* The prompt path's grouping, on the host, of the ids read back into h_ids: the groups (matrix
 * g_index[i], g_count[i] rows), sorted by matrix; groups of MMID_GEMM_MIN rows or more (none
 * when gemm is false) get consecutive places g_first[i] in h_order (row order within), the
 * other rows go to h_list in row order. WF_EINVAL for an id past the stack. */
static int mmid_group(struct wf__cuda_mm *mm, uint32_t rows, uint32_t stack, bool gemm,
                      uint32_t *ret_g, uint32_t *ret_nb, uint32_t *ret_nl, struct wf_diag *diag)
{
	for (uint32_t r = 0; r < rows; r++) {
		const int32_t id = mm->h_ids[r];
		if (id < 0)
			continue;
		if ((uint32_t)id >= stack) {
			for (uint32_t q = 0; q < r; q++)
				if (mm->h_ids[q] >= 0)
					mm->count_of[mm->h_ids[q]] = 0;
			return wf_diag_set(diag, WF_EINVAL,
			                   "mul_mat_id: matrix id %d outside the stack of %u", id,
			                   stack);
		}
		mm->count_of[id]++;
	}
	uint32_t g = 0;
	for (uint32_t r = 0; r < rows; r++) {
		const int32_t id = mm->h_ids[r];
		if (id < 0 || mm->count_of[id] == 0)
			continue;
		mm->g_pairs[g++] = (uint64_t)(uint32_t)id << 32 | mm->count_of[id];
		mm->count_of[id] = 0; /* seen: later rows of this matrix are skipped here */
	}
	qsort(mm->g_pairs, g, sizeof(uint64_t), cmp_u64);
	/* count_of maps a matrix to its group + 1 meanwhile. */
	uint32_t nb = 0, nl = 0;
	for (uint32_t i = 0; i < g; i++) {
		mm->g_index[i] = (uint32_t)(mm->g_pairs[i] >> 32);
		mm->g_count[i] = (uint32_t)mm->g_pairs[i];
		const bool big = gemm && mm->g_count[i] >= MMID_GEMM_MIN;
		mm->g_first[i] = big ? nb : UINT32_MAX;
		mm->g_fill[i] = 0;
		nb += big ? mm->g_count[i] : 0;
		mm->count_of[mm->g_index[i]] = i + 1;
	}
	for (uint32_t r = 0; r < rows; r++) {
		const int32_t id = mm->h_ids[r];
		if (id < 0)
			continue;
		const uint32_t gi = mm->count_of[id] - 1;
		if (mm->g_first[gi] == UINT32_MAX)
			mm->h_list[nl++] = r;
		else
			mm->h_order[mm->g_first[gi] + mm->g_fill[gi]++] = r;
	}
	for (uint32_t i = 0; i < g; i++)
		mm->count_of[mm->g_index[i]] = 0;
	*ret_g = g;
	*ret_nb = nb;
	*ret_nl = nl;
	return 0;
}

/* One product's big groups through cuBLAS, in chunks of the GEMM workspace: the chunk's rows of
 * x gathered and converted in expert order (P), one GEMM per group piece into yp, the chunk's
 * results scattered back to their rows. *have tracks what P holds (kind and rows) across the
 * call's products. */
struct mmid_have {
	int kind;
	uint32_t c0, c1;
};

static int mmid_big(struct wf_backend_ctx *c, const struct wf_backend_product *pr, uint32_t g,
                    uint32_t nb, uint32_t k, const float *x, size_t xs, bool x_per_slot,
                    struct mmid_have *have, struct wf_diag *diag)
{
	struct wf__cuda_mm *mm = c->mm;
	const struct wf_backend_matrix *w = pr->w;
	const enum wf_act pk = w->type == WF_DTYPE_BF16 ? WF_ACT_BF16 : WF_ACT_F16;
	int64_t chunk = mm->yp_floats / w->ne1;
	int rc;

	if (chunk > (int64_t)mm->p_rows)
		chunk = mm->p_rows;
	if (chunk < 1)
		return wf_diag_set(diag, WF_EINVAL,
		                   "mul_mat_id: matrices of %lld rows (the context: at most %lld)",
		                   (long long)w->ne1, (long long)c->lim.max_ne1);
	uint32_t gi = 0;
	for (uint32_t c0 = 0; c0 < nb; c0 += (uint32_t)chunk) {
		const uint32_t c1 = nb - c0 < chunk ? nb : c0 + (uint32_t)chunk;
		if ((int)pk != have->kind || have->c0 != c0 || have->c1 != c1) {
			rc = convert(c, pk, x, xs, mm->d_order + c0, x_per_slot ? 1 : k, c1 - c0,
			             w->ne0, mm->p, (size_t)mm->p_ld * 2, mm->p_exp, diag);
			if (rc < 0)
				return rc;
			*have = (struct mmid_have){(int)pk, c0, c1};
		}
		for (; gi < g; gi++) {
			if (mm->g_first[gi] == UINT32_MAX)
				continue;
			const uint32_t f0 = mm->g_first[gi], f1 = f0 + mm->g_count[gi];
			if (f0 >= c1)
				break;
			const uint32_t a = f0 > c0 ? f0 : c0, b = f1 < c1 ? f1 : c1;
			struct wf_backend_matrix we = *w;
			we.data = (const uint8_t *)w->data + (size_t)mm->g_index[gi] * w->stride;
			rc = gemm(c, &we, mm->p + (size_t)(a - c0) * mm->p_ld, mm->p_ld, b - a,
			          mm->yp + (size_t)(a - c0) * w->ne1, w->ne1, diag);
			if (rc < 0)
				return rc;
			if (f1 > c1)
				break; /* the group goes on in the next chunk */
		}
		scatter_kernel<<<wf__cuda_grid(c, (uint64_t)(c1 - c0) * w->ne1, EW_THREADS),
		                 EW_THREADS, 0, c->stream>>>(
		    mm->yp, w->ne1, c1 - c0, mm->d_order + c0, pk == WF_ACT_F16 ? mm->p_exp : NULL,
		    pr->y, pr->y_stride);
		if ((rc = wf__cuda_launched(diag, "mul_mat_id (scatter)")) < 0)
			return rc;
	}
	return 0;
}

/* The prompt path: ids read back (one wait), rows grouped per expert on the host (expert order,
 * row order within, as the host backend walks them, mmid_group). Groups of MMID_GEMM_MIN rows or
 * more go through cuBLAS (mmid_big); the other rows through the mat-vec kernel over their list.
 * F32 stacks take the mat-vec for every group (their GEMM would need F32 activations gathered:
 * not worth a workspace for a type no quantized model's experts have). */
static int mmid_prompt(struct wf_backend_ctx *c, uint32_t n_products,
                       const struct wf_backend_product *p, const int32_t *ids, uint32_t n,
                       uint32_t k, const float *x, size_t xs, bool x_per_slot, struct wf_diag *diag)
{
	struct wf__cuda_mm *mm = c->mm;
	const uint32_t rows = n * k, xrows = x_per_slot ? rows : n;
	const uint32_t stack = c->lim.max_stack ? c->lim.max_stack : 1;
	const int64_t ne0 = p[0].w->ne0;
	bool any_f32 = false;
	uint32_t g = 0, nb = 0, nl = 0;
	int rc;

	for (uint32_t i = 0; i < n_products; i++)
		any_f32 |= p[i].w->type == WF_DTYPE_F32;
	cudaError_t e =
	    cudaMemcpyAsync(mm->h_ids, ids, (size_t)rows * 4, cudaMemcpyDeviceToHost, c->stream);
	if (e != cudaSuccess)
		return wf__cuda_fail(e, diag, "mul_mat_id: ids to the host");
	/* The wait also completes the previous call's copies out of h_order and h_list. */
	if ((rc = wf_device_stream_synchronize(c->wstream, diag)) < 0 ||
	    (rc = mmid_group(mm, rows, stack, !any_f32, &g, &nb, &nl, diag)) < 0)
		return rc;
	if (nb && (e = cudaMemcpyAsync(mm->d_order, mm->h_order, (size_t)nb * 4,
	                               cudaMemcpyHostToDevice, c->stream)) != cudaSuccess)
		return wf__cuda_fail(e, diag, "mul_mat_id: row order to the device");
	if (nl && (e = cudaMemcpyAsync(mm->d_list, mm->h_list, (size_t)nl * 4,
	                               cudaMemcpyHostToDevice, c->stream)) != cudaSuccess)
		return wf__cuda_fail(e, diag, "mul_mat_id: row list to the device");

	int have_act = -1; /* the kind the activation workspace holds */
	struct mmid_have have_p = {-1, 0, 0};
	for (uint32_t i = 0; i < n_products; i++) {
		const struct wf_backend_matrix *w = p[i].w;
		const enum wf_act kind = wf_act_of(w->type);
		if (nl) {
			if (kind != WF_ACT_F32 && (int)kind != have_act) {
				rc = convert(c, kind, x, xs, NULL, 1, xrows, ne0, mm->act,
				             (size_t)mm->act_row, mm->act_exp, diag);
				if (rc < 0)
					return rc;
				have_act = (int)kind;
			}
			mv_id_launch_fn f = {w,
			                     mv_act(mm, w->type, x, xs, ne0),
			                     ids,
			                     mm->d_list,
			                     nl,
			                     k,
			                     x_per_slot,
			                     stack,
			                     mm->act_exp,
			                     p[i].y,
			                     p[i].y_stride,
			                     mv_vec(w, x, xs),
			                     c->stream};
			rc = wf_dq_dispatch(w->type, f, (int)WF_EUNSUPPORTED);
			if (rc == 0)
				rc = wf__cuda_launched(diag, "mul_mat_id (mat-vec rows)");
			if (rc < 0)
				return rc;
		}
		if (nb && (rc = mmid_big(c, &p[i], g, nb, k, x, xs, x_per_slot, &have_p, diag)) < 0)
			return rc;
	}
	return 0;
}

int wf__cuda_mul_mat_id(struct wf_backend_ctx *c, uint32_t n_products,
                        const struct wf_backend_product *p, const int32_t *ids, uint32_t n,
                        uint32_t k, const float *x, size_t x_stride, bool x_per_slot,
                        struct wf_diag *diag)
{
	struct wf__cuda_mm *mm = c->mm;
	if ((uint64_t)n * k > c->lim.max_rows)
		return wf_diag_set(diag, WF_EINVAL, "mul_mat_id: %u x %u rows (at most %u)", n, k,
		                   c->lim.max_rows);
	const uint32_t rows = n * k;
	int rc = check_products(c, n_products, p, rows, "mul_mat_id", diag);
	if (rc < 0 || rows == 0)
		return rc;
	const int64_t ne0 = p[0].w->ne0;
	const uint32_t xrows = x_per_slot ? rows : n;
	if (!ids || !x || (xrows > 1 && x_stride < (size_t)ne0) || x_stride > INT_MAX)
		return wf_diag_set(diag, WF_EINVAL, "mul_mat_id: input stride %zu for rows of %lld",
		                   x_stride, (long long)ne0);
	for (uint32_t i = 0; i < n_products; i++)
		if ((p[i].w->ne1 + MV_WARPS - 1) / MV_WARPS > 65535)
			return wf_diag_set(diag, WF_EINVAL, "mul_mat_id: matrices of %lld rows",
			                   (long long)p[i].w->ne1);
	const size_t xs = xrows > 1 ? x_stride : (size_t)ne0;
	if (rows > WF_CUDA_MMID_MAX_ROWS)
		return mmid_prompt(c, n_products, p, ids, n, k, x, xs, x_per_slot, diag);

	const uint32_t stack = c->lim.max_stack ? c->lim.max_stack : 1;
	int have = -1;
	for (uint32_t i = 0; i < n_products; i++) {
		const struct wf_backend_matrix *w = p[i].w;
		const enum wf_act kind = wf_act_of(w->type);
		if (kind != WF_ACT_F32 && (int)kind != have) {
			rc = convert(c, kind, x, xs, NULL, 1, xrows, ne0, mm->act,
			             (size_t)mm->act_row, mm->act_exp, diag);
			if (rc < 0)
				return rc;
			have = (int)kind;
		}
		mv_id_launch_fn f = {w,
		                     mv_act(mm, w->type, x, xs, ne0),
		                     ids,
		                     NULL,
		                     rows,
		                     k,
		                     x_per_slot,
		                     stack,
		                     mm->act_exp,
		                     p[i].y,
		                     rows > 1 ? p[i].y_stride : (size_t)w->ne1,
		                     mv_vec(w, x, xs),
		                     c->stream};
		rc = wf_dq_dispatch(w->type, f, (int)WF_EUNSUPPORTED);
		if (rc == 0)
			rc = wf__cuda_launched(diag, "mul_mat_id (mat-vec)");
		if (rc < 0)
			return rc;
	}
	return 0;
}

int wf__cuda_get_rows(struct wf_backend_ctx *c, const struct wf_backend_matrix *w,
                      const int32_t *ids, uint32_t n, float *y, struct wf_diag *diag)
{
	int rc = check_matrix(w, "get_rows", diag);
	if (rc < 0 || n == 0)
		return rc;
	if (!ids || !y)
		return wf_diag_set(diag, WF_EINVAL, "get_rows: no ids or output");
	const int64_t ne0 = w->ne0;
	get_rows_launch_fn f = {
	    (const uint8_t *)w->data,
	    w->row_size,
	    ne0,
	    w->ne1,
	    ids,
	    (int64_t)n,
	    y,
	    wf__cuda_grid(c, (uint64_t)n * (uint64_t)(ne0 / 8 + ne0 % 8), EW_THREADS),
	    c->stream};
	(void)wf_dq_dispatch(w->type, f, 0);
	return wf__cuda_launched(diag, "get_rows");
}

/* ---- Warm-up -----------------------------------------------------------------------------------
 */

int wf__cuda_mm_warmup(struct wf_backend_ctx *c, struct wf_diag *diag)
{
	struct wf__cuda_mm *mm = c->mm;
	if (!mm || !mm->gemm)
		return 0;
	const float one = 1.0f, zero = 0.0f;
	const int64_t kk = c->lim.max_ne0;
	int64_t m = c->lim.max_ne1 > 0 ? c->lim.max_ne1 : 1;
	if (m > mm->wh_halves / (2 * kk))
		m = mm->wh_halves / (2 * kk); /* the slab viewed as floats */
	if (m < 1)
		m = 1;
	int64_t n = c->lim.max_rows < mm->p_rows / 2 ? c->lim.max_rows : mm->p_rows / 2;
	if (n > mm->yp_floats / m)
		n = mm->yp_floats / m;
	/* The three GEMM kinds at the context's largest shapes and at a few narrower ones (cuBLAS
	 * picks its kernel by shape, and loads each lazily: the shapes a step will use are not
	 * known here, so this covers the common ones, expert-sized and full). */
	const struct {
		cudaDataType t;
		cublasComputeType_t ct;
	} kinds[] = {{CUDA_R_32F, CUBLAS_COMPUTE_32F_PEDANTIC},
	             {CUDA_R_16F, CUBLAS_COMPUTE_32F},
	             {CUDA_R_16BF, CUBLAS_COMPUTE_32F}};
	for (int64_t mm_ : {m, m < 768 ? m : (int64_t)768}) {
		for (int64_t nn :
		     {(int64_t)WF_CUDA_MV_MAX_ROWS + 1, (int64_t)128, (int64_t)512, n}) {
			if (nn > n)
				continue;
			for (const auto &kd : kinds) {
				cublasStatus_t st = blas.gemm_ex(
				    mm->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)mm_, (int)nn, (int)kk,
				    &one, mm->wh, kd.t, (int)kk, mm->p, kd.t, (int)kk, &zero,
				    mm->yp, CUDA_R_32F, (int)mm_, kd.ct, CUBLAS_GEMM_DEFAULT);
				if (st != CUBLAS_STATUS_SUCCESS)
					return blas_fail(st, diag, "cuBLAS warm-up");
			}
		}
	}
	return wf_device_stream_synchronize(c->wstream, diag);
}

/* ---- Host entry points for the unit tests ---------------------------------------------------- */

struct host_dq_fn {
	const uint8_t *x;
	float *y;
	int64_t n;

	template <enum wf_dtype T> int operator()()
	{
		const int64_t groups = n / WF_DQ_GROUP;
		if (n < 0 || n % wf_dq<T>::BLOCK)
			return WF_EINVAL;
		for (int64_t g = 0; g < groups; g++)
			wf_dq<T>::group(x, g, y + WF_DQ_GROUP * g);
		for (int64_t e = groups * WF_DQ_GROUP; e < n; e++)
			y[e] = wf_dq_elem<T>(x, e);
		return 0;
	}
};

int wf__cuda_dequantize_host(enum wf_dtype type, const void *x, float *y, int64_t n)
{
	host_dq_fn f = {(const uint8_t *)x, y, n};
	return wf_dq_dispatch(type, f, (int)WF_EUNSUPPORTED);
}

/* One activation row converted as act_kernel converts it, into the kernels' layout: the same
 * per-element functions; the kernel's warp reductions are maxima under a total order, which do
 * not depend on the order they are taken in. */
static void act_row_host(enum wf_act kind, const float *xr, int64_t ne0, uint8_t *o, int32_t *exp)
{
	int8_t *q = reinterpret_cast<int8_t *>(o);
	float *d = reinterpret_cast<float *>(o + wf_align16(ne0));
	*exp = 0;
	switch (kind) {
	case WF_ACT_Q8_0:
		for (int64_t b = 0; b < ne0 / 32; b++) {
			float amax = 0.0f, id;
			for (int l = 0; l < 32; l++) {
				float a = fabsf(xr[32 * b + l]);
				a = a > 0.0f ? a : 0.0f;
				amax = a > amax ? a : amax;
			}
			d[b] = wf_q8_0_scale(amax, &id);
			for (int l = 0; l < 32; l++)
				q[32 * b + l] = wf_q8_0_value(xr[32 * b + l], id);
		}
		break;
	case WF_ACT_Q8_K:
		for (int64_t b = 0; b < ne0 / 256; b++) {
			const float *xb = xr + 256 * b;
			float best = 0.0f;
			int bi = INT_MAX;
			for (int i = 0; i < 256; i++)
				if (wf_q8_K_before(fabsf(xb[i]), i, best, bi)) {
					best = fabsf(xb[i]);
					bi = i;
				}
			if (best == 0.0f) {
				memset(q + 256 * b, 0, 256);
				d[b] = 0.0f;
				continue;
			}
			const float is = wf_q8_K_iscale(xb[bi]);
			for (int i = 0; i < 256; i++)
				q[256 * b + i] = wf_q8_K_value(xb[i], is);
			d[b] = 1.0f / is;
		}
		break;
	case WF_ACT_F16: {
		float m = 0.0f;
		for (int64_t i = 0; i < ne0; i++) {
			const float a = fabsf(xr[i]);
			m = a > m ? a : m;
		}
		*exp = wf_f16_exp(m);
		const float s = wf_pow2(-*exp);
		for (int64_t i = 0; i < ne0; i++)
			reinterpret_cast<uint16_t *>(o)[i] = wf_f2h(xr[i] * s);
		break;
	}
	case WF_ACT_BF16:
		for (int64_t i = 0; i < ne0; i++)
			reinterpret_cast<uint16_t *>(o)[i] = wf_f2bf(xr[i]);
		break;
	default:
		break;
	}
}

static int64_t act_block(enum wf_act kind)
{
	return kind == WF_ACT_Q8_0 ? 32 : kind == WF_ACT_Q8_K ? 256 : 1;
}

int wf__cuda_act_host(enum wf_dtype weight, const float *x, int64_t ne0, void *out, int *ret_exp)
{
	const enum wf_act kind = wf_act_of(weight);
	if (!wf__cuda_supports(weight) || kind == WF_ACT_F32 || ne0 <= 0 || ne0 % act_block(kind))
		return WF_EINVAL;
	uint8_t *row = (uint8_t *)malloc((size_t)wf_act_row_bytes(ne0));
	int32_t e;
	if (!row)
		return -ENOMEM;
	act_row_host(kind, x, ne0, row, &e);
	const int8_t *q = reinterpret_cast<const int8_t *>(row);
	const float *d = reinterpret_cast<const float *>(row + wf_align16(ne0));
	uint8_t *o = (uint8_t *)out;
	switch (kind) {
	case WF_ACT_Q8_0: /* wf_block_q8_0: F16 d, 32 int8 */
		for (int64_t b = 0; b < ne0 / 32; b++, o += 34) {
			const uint16_t h = wf_f2h(d[b]); /* d[b] is an F16 value: exact */
			memcpy(o, &h, 2);
			memcpy(o + 2, q + 32 * b, 32);
		}
		break;
	case WF_ACT_Q8_K: /* wf_block_q8_K: float d, 256 int8, 16 int16 sums */
		for (int64_t b = 0; b < ne0 / 256; b++, o += 292) {
			memcpy(o, &d[b], 4);
			memcpy(o + 4, q + 256 * b, 256);
			for (int s = 0; s < 16; s++) {
				int sum = 0;
				for (int i = 0; i < 16; i++)
					sum += q[256 * b + 16 * s + i];
				const int16_t v = (int16_t)sum;
				memcpy(o + 260 + 2 * s, &v, 2);
			}
		}
		break;
	default:
		memcpy(o, row, (size_t)ne0 * 2);
		break;
	}
	free(row);
	*ret_exp = e;
	return 0;
}

/* The activations of n rows (row j at x + j * xs) converted for type t into a host buffer in the
 * kernels' layout; F32 weights read x itself. */
struct host_act {
	uint8_t *buf = nullptr;
	int32_t exps[64] = {0};
	wf_mv_act a;

	int make(enum wf_dtype t, const float *x, size_t xs, uint32_t n, int64_t ne0)
	{
		const enum wf_act kind = wf_act_of(t);
		if (kind == WF_ACT_F32) {
			a.base = (const uint8_t *)x;
			a.stride = xs * sizeof(float);
			a.d_off = 0;
			return 0;
		}
		const int64_t rb = wf_act_row_bytes(ne0);
		buf = (uint8_t *)aligned_alloc(16, (size_t)rb * n);
		if (!buf)
			return -ENOMEM;
		for (uint32_t j = 0; j < n; j++)
			act_row_host(kind, x + (size_t)j * xs, ne0, buf + (size_t)j * rb, &exps[j]);
		a.base = buf;
		a.stride = (size_t)rb;
		a.d_off = wf_align16(ne0);
		return 0;
	}
	~host_act()
	{
		free(buf);
	}
};

/* One weight row's dots through the kernel's lanes and its xor-shuffle tree. */
template <enum wf_dtype T, int N, bool VEC>
static void host_row(const uint8_t *row, int64_t ne0, const wf_mv_act &a, int n, float *out)
{
	float acc[32][N], t[32][N];
	for (int lane = 0; lane < 32; lane++)
		wf_mv_lane<T, N, VEC>(row, ne0, a, n, lane, acc[lane]);
	for (int off = 16; off > 0; off >>= 1) {
		for (int lane = 0; lane < 32; lane++)
			for (int j = 0; j < N; j++)
				t[lane][j] = acc[lane][j] + acc[lane ^ off][j];
		for (int lane = 0; lane < 32; lane++)
			for (int j = 0; j < N; j++)
				acc[lane][j] = t[lane][j];
	}
	for (int j = 0; j < n; j++)
		out[j] = acc[0][j];
}

struct host_mv_fn {
	const struct wf_backend_matrix *w;
	const wf_mv_act *a;
	uint32_t n;
	bool vec;
	const int32_t *exps;
	float *y;
	size_t ys;

	template <enum wf_dtype T, int N> void go()
	{
		float out[32] = {0};
		for (int64_t i = 0; i < w->ne1; i++) {
			const uint8_t *row = (const uint8_t *)w->data + (size_t)i * w->row_size;
			if (vec)
				host_row<T, N, true>(row, w->ne0, *a, (int)n, out);
			else
				host_row<T, N, false>(row, w->ne0, *a, (int)n, out);
			for (uint32_t j = 0; j < n; j++)
				y[(size_t)j * ys + i] =
				    T == WF_DTYPE_F16 ? out[j] * wf_pow2(exps[j]) : out[j];
		}
	}
	template <enum wf_dtype T> int operator()()
	{
		return with_rows<T>(*this, n);
	}
};

int wf__cuda_matvec_host(const struct wf_backend_matrix *w, const float *x, size_t x_stride,
                         uint32_t n, float *y, size_t y_stride)
{
	if (!w || !wf__cuda_supports(w->type))
		return WF_EUNSUPPORTED;
	if (check_matrix(w, "matvec", NULL) < 0 || n == 0 || n > WF_CUDA_MV_MAX_ROWS)
		return WF_EINVAL;
	const size_t xs = n > 1 ? x_stride : (size_t)w->ne0;
	host_act ha;
	if (ha.make(w->type, x, xs, n, w->ne0) < 0)
		return -ENOMEM;
	host_mv_fn f = {w, &ha.a, n, mv_vec(w, x, xs), ha.exps, y, n > 1 ? y_stride : 0};
	return wf_dq_dispatch(w->type, f, (int)WF_EUNSUPPORTED);
}

int wf__cuda_mul_mat_id_host(const struct wf_backend_matrix *w, const int32_t *ids, uint32_t n,
                             uint32_t k, const float *x, size_t x_stride, bool x_per_slot, float *y,
                             size_t y_stride)
{
	if (!w || !wf__cuda_supports(w->type))
		return WF_EUNSUPPORTED;
	const uint32_t rows = n * k, xrows = x_per_slot ? rows : n;
	if (check_matrix(w, "mul_mat_id", NULL) < 0 || rows == 0 || rows > WF_CUDA_MMID_MAX_ROWS)
		return WF_EINVAL;
	const size_t xs = xrows > 1 ? x_stride : (size_t)w->ne0;
	host_act ha;
	if (ha.make(w->type, x, xs, xrows, w->ne0) < 0)
		return -ENOMEM;
	const bool vec = mv_vec(w, x, xs);
	for (uint32_t r = 0; r < rows; r++) {
		const int32_t e = ids[r];
		if (e < 0)
			continue;
		const uint32_t xr = x_per_slot ? r : r / k;
		struct wf_backend_matrix m = *w;
		m.data = (const uint8_t *)w->data + (size_t)e * w->stride;
		wf_mv_act ar = ha.a;
		ar.base += (size_t)xr * ha.a.stride;
		const int32_t ex = ha.exps[xr];
		host_mv_fn f = {&m, &ar, 1, vec, &ex, y + (size_t)r * y_stride, 0};
		(void)wf_dq_dispatch(w->type, f, (int)WF_EUNSUPPORTED);
	}
	return 0;
}

int wf__cuda_gemm_host(const struct wf_backend_matrix *w, const float *x, size_t x_stride,
                       uint32_t n, float *y, size_t y_stride)
{
	if (!w || !wf__cuda_supports(w->type))
		return WF_EUNSUPPORTED;
	if (check_matrix(w, "gemm", NULL) < 0 || n == 0)
		return WF_EINVAL;
	const int64_t ne0 = w->ne0;
	const size_t xs = n > 1 ? x_stride : (size_t)ne0;
	const enum wf_act kind = w->type == WF_DTYPE_F32    ? WF_ACT_F32
	                         : w->type == WF_DTYPE_BF16 ? WF_ACT_BF16
	                                                    : WF_ACT_F16;
	float *xv = (float *)malloc((size_t)n * ne0 * sizeof(float));
	float *wv = (float *)malloc((size_t)ne0 * sizeof(float));
	uint8_t *row = (uint8_t *)malloc((size_t)wf_act_row_bytes(ne0));
	int32_t *ex = (int32_t *)calloc(n, sizeof(int32_t));
	if (!xv || !wv || !row || !ex) {
		free(xv), free(wv), free(row), free(ex);
		return -ENOMEM;
	}
	for (uint32_t j = 0; j < n; j++) {
		const float *xr = x + (size_t)j * xs;
		float *v = xv + (size_t)j * ne0;
		if (kind == WF_ACT_F32) {
			memcpy(v, xr, (size_t)ne0 * sizeof(float));
			continue;
		}
		act_row_host(kind, xr, ne0, row, &ex[j]);
		for (int64_t i = 0; i < ne0; i++) {
			const uint16_t h = reinterpret_cast<const uint16_t *>(row)[i];
			v[i] = kind == WF_ACT_BF16 ? wf_dq_bf2f(h) : wf_dq_h2f(h);
		}
	}
	for (int64_t i = 0; i < w->ne1; i++) {
		const uint8_t *wr = (const uint8_t *)w->data + (size_t)i * w->row_size;
		(void)wf__cuda_dequantize_host(w->type, wr, wv, ne0);
		if (w->type != WF_DTYPE_F32 && w->type != WF_DTYPE_F16 && w->type != WF_DTYPE_BF16)
			for (int64_t e = 0; e < ne0; e++) /* the F16 slab */
				wv[e] = wf_dq_h2f(wf_f2h(wv[e]));
		for (uint32_t j = 0; j < n; j++) {
			double s = 0.0;
			for (int64_t e = 0; e < ne0; e++)
				s += (double)wv[e] * (double)xv[(size_t)j * ne0 + e];
			y[(size_t)j * y_stride + i] = (float)s * wf_pow2(ex[j]);
		}
	}
	free(xv), free(wv), free(row), free(ex);
	return 0;
}

int wf__cuda_mmid_group_host(const int32_t *ids, uint32_t rows, uint32_t stack, bool gemm,
                             uint32_t *order, uint32_t *list, uint32_t *g_index, uint32_t *g_first,
                             uint32_t *g_count, uint32_t *ret_g, uint32_t *ret_nb, uint32_t *ret_nl)
{
	struct wf__cuda_mm mm;
	memset(&mm, 0, sizeof(mm));
	mm.h_ids = (int32_t *)ids;
	mm.h_order = order;
	mm.h_list = list;
	mm.g_index = g_index;
	mm.g_first = g_first;
	mm.g_count = g_count;
	mm.count_of = (uint32_t *)calloc(stack ? stack : 1, sizeof(uint32_t));
	mm.g_fill = (uint32_t *)malloc(((size_t)rows + 1) * sizeof(uint32_t));
	mm.g_pairs = (uint64_t *)malloc(((size_t)rows + 1) * sizeof(uint64_t));
	int rc = -ENOMEM;
	if (mm.count_of && mm.g_fill && mm.g_pairs) {
		rc = mmid_group(&mm, rows, stack, gemm, ret_g, ret_nb, ret_nl, NULL);
		/* count_of must come back zeroed, whatever happened (the context reuses it) */
		for (uint32_t e = 0; e < stack && rc == 0; e++)
			if (mm.count_of[e])
				rc = WF_EINTERNAL;
		for (uint32_t e = 0; e < stack && rc == WF_EINVAL; e++)
			if (mm.count_of[e])
				rc = WF_EINTERNAL;
	}
	free(mm.count_of);
	free(mm.g_fill);
	free(mm.g_pairs);
	return rc;
}
