/* The engine's matmul and get_rows on CUDA (engine/devops.h), for the weight types of
 * dequant.cuh.
 *
 * matmul, n <= 8 (decode, small batches): a mat-vec kernel, one warp per weight row. Lanes take
 * consecutive 8-element groups of the row (so a warp reads a contiguous stretch of it), decode
 * each group once and dot it with all n activation rows in float (FMA), then the warp adds its
 * lanes with xor shuffles and lane 0 writes the n outputs. Every weight byte is read once per
 * call, which is what bounds a decode step.
 *
 * matmul, n > 8 (prompts): W is dequantized to F16 in a workspace, x converted to F16, and
 * cublasGemmEx multiplies them with float accumulation and float output. The workspace holds at
 * most WS_CAP_HALVES halves; a taller matrix (the output head) goes through it in slabs of rows,
 * one dequantize and one GEMM per slab, queued in order on the same stream.
 *
 * get_rows: one thread per 8-element group of the output, rows picked by ids in device memory.
 *
 * Nothing here synchronizes: every kernel and cuBLAS call is queued on ctx->stream. */
#include "cuda/engine_ctx.h"
#include "cuda/matmul.h"

#include "base/error.h"
#include "cuda/dequant.cuh"
#include "device/device.h"

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#define MV_WARPS   4 /* weight rows per mat-vec block */
#define MV_THREADS (32 * MV_WARPS)
#define MV_MAX_N   8
#define EW_THREADS 256
/* The F16 weight workspace's cap (128 MiB): an 8k-wide matrix still goes in slabs of 8k rows,
 * large enough for the GEMM to fill the GPU, and the output head needs no 1 GiB buffer. */
#define WS_CAP_HALVES ((int64_t)1 << 26)

struct wf__cuda_mm {
	struct wf_device *dev;
	cublasHandle_t blas;
	__half *wh; /* dequantized weight rows, ne0 halves each */
	int64_t wh_halves;
	__half *xh; /* activations in F16, ne0 halves per row */
	int64_t xh_halves;
};

/* cuBLAS, loaded by the first CUDA engine context that needs it, not at process start: mapping
 * libcublas relocates about 95 MB of private memory into every process that links it (measured:
 * a process's Anonymous bytes before and after loading it), so a worker on the host device, or
 * one that never builds a CUDA engine, would carry it for nothing. The configured library's
 * path first, then its soname through the run path. */
static struct {
	decltype(&cublasCreate_v2) create;
	decltype(&cublasDestroy_v2) destroy;
	decltype(&cublasSetStream_v2) set_stream;
	decltype(&cublasSetMathMode) set_math_mode;
	/* The C symbol; C++ overloads the name in the header. */
	cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int,
	                          int, const void *, const void *, cudaDataType, int, const void *,
	                          cudaDataType, int, const void *, void *, cudaDataType, int,
	                          cublasComputeType_t, cublasGemmAlgo_t);
	decltype(&cublasGetStatusName) status_name;
	decltype(&cublasGetStatusString) status_string;
} blas;
static pthread_once_t blas_once = PTHREAD_ONCE_INIT;
static char blas_error[512];

static void blas_load(void)
{
	const char *const paths[] = {WF_CUBLAS_PATH, WF_CUBLAS_SONAME};
	void *h = NULL;
	for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]) && !h; i++)
		h = dlopen(paths[i], RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		snprintf(blas_error, sizeof blas_error, "cannot load cuBLAS (%s): %s",
		         WF_CUBLAS_SONAME, dlerror());
		return;
	}
	const struct {
		void **fn;
		const char *name;
	} syms[] = {
	    {(void **)&blas.destroy, "cublasDestroy_v2"},
	    {(void **)&blas.set_stream, "cublasSetStream_v2"},
	    {(void **)&blas.set_math_mode, "cublasSetMathMode"},
	    {(void **)&blas.gemm_ex, "cublasGemmEx"},
	    {(void **)&blas.status_name, "cublasGetStatusName"},
	    {(void **)&blas.status_string, "cublasGetStatusString"},
	    {(void **)&blas.create, "cublasCreate_v2"}, /* last: set means all are */
	};
	for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
		*syms[i].fn = dlsym(h, syms[i].name);
		if (!*syms[i].fn) {
			snprintf(blas_error, sizeof blas_error, "cuBLAS (%s) lacks %s",
			         WF_CUBLAS_SONAME, syms[i].name);
			blas.create = NULL;
			return;
		}
	}
}

int wf__cuda_blas_load(struct wf_diag *diag)
{
	pthread_once(&blas_once, blas_load);
	return blas.create ? 0 : wf_diag_set(diag, WF_EUNSUPPORTED, "%s", blas_error);
}

static int blas_fail(cublasStatus_t st, struct wf_diag *diag, const char *what)
{
	(void)cudaGetLastError();
	return wf_diag_set(diag, st == CUBLAS_STATUS_ALLOC_FAILED ? -ENOMEM : WF_EDEVICE,
	                   "%s: %s (%s)", what, blas.status_name(st), blas.status_string(st));
}

/* Blocks for an elementwise grid-stride kernel over total items: enough to fill the GPU a few
 * times over, at least one. */
static unsigned ew_blocks(const struct wf__cuda_engine_ctx *c, int64_t total)
{
	int64_t blocks = (total + EW_THREADS - 1) / EW_THREADS;
	int64_t cap = (int64_t)(c->sm_count > 0 ? c->sm_count : 32) * 32;

	if (blocks > cap)
		blocks = cap;
	return blocks > 0 ? (unsigned)blocks : 1u;
}

/* ---- Kernels -------------------------------------------------------------------------------- */

/* One lane's share of the dot products of a weight row with N activation rows: groups lane,
 * lane + lanes, ... and, for plain types, the tail elements the same way. Runs on the host too
 * (wf__cuda_matvec_host), so the unit tests check which lane reads which bytes. */
template <enum wf_dtype T, int N>
static __host__ __device__ __forceinline__ void
mv_lane(const uint8_t *row, int64_t ne0, const float *x, size_t xs, int lane, int lanes, float *acc)
{
	const int64_t groups = ne0 / WF_DQ_GROUP;

	for (int j = 0; j < N; j++)
		acc[j] = 0.0f;
	for (int64_t g = lane; g < groups; g += lanes) {
		float v[WF_DQ_GROUP];

		wf_dq<T>::group(row, g, v);
		for (int j = 0; j < N; j++) {
			const float *xr = x + (size_t)j * xs + WF_DQ_GROUP * g;
			float s = acc[j];
			for (int l = 0; l < WF_DQ_GROUP; l++)
				s += v[l] * xr[l];
			acc[j] = s;
		}
	}
	if constexpr (wf_dq<T>::BLOCK == 1) {
		for (int64_t e = groups * WF_DQ_GROUP + lane; e < ne0; e += lanes) {
			const float v = wf_dq_elem<T>(row, e);
			for (int j = 0; j < N; j++)
				acc[j] += v * x[(size_t)j * xs + e];
		}
	}
}

template <enum wf_dtype T, int N>
static __global__ void __launch_bounds__(MV_THREADS)
    mv_kernel(const uint8_t *w, size_t row_size, int64_t ne0, int64_t ne1, const float *x,
              size_t xs, float *y, size_t ys)
{
	const int64_t row = (int64_t)blockIdx.x * MV_WARPS + threadIdx.x / 32;
	const int lane = threadIdx.x % 32;
	float acc[N];

	/* row is the same for the 32 lanes of a warp: whole warps leave, the shuffles below
	 * always run with all lanes present. */
	if (row >= ne1)
		return;
	mv_lane<T, N>(w + (size_t)row * row_size, ne0, x, xs, lane, 32, acc);
#pragma unroll
	for (int j = 0; j < N; j++)
		for (int off = 16; off > 0; off >>= 1)
			acc[j] += __shfl_xor_sync(0xffffffffu, acc[j], off);
	if (lane == 0) {
#pragma unroll
		for (int j = 0; j < N; j++)
			y[(size_t)j * ys + row] = acc[j];
	}
}

/* rows weight rows to F16, out[r * ne0 + e]. */
template <enum wf_dtype T>
static __global__ void __launch_bounds__(EW_THREADS)
    dq_f16_kernel(const uint8_t *w, size_t row_size, int64_t ne0, int64_t rows, __half *out)
{
	const int64_t groups = ne0 / WF_DQ_GROUP;
	const int64_t stride = (int64_t)gridDim.x * blockDim.x;
	const int64_t first = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;

	for (int64_t i = first; i < rows * groups; i += stride) {
		const int64_t r = i / groups, g = i % groups;
		__half *o = out + r * ne0 + WF_DQ_GROUP * g;
		float v[WF_DQ_GROUP];

		wf_dq<T>::group(w + (size_t)r * row_size, g, v);
#pragma unroll
		for (int l = 0; l < WF_DQ_GROUP; l++)
			o[l] = __float2half_rn(v[l]);
	}
	if constexpr (wf_dq<T>::BLOCK == 1) {
		const int64_t tail = ne0 - groups * WF_DQ_GROUP;
		for (int64_t i = first; i < rows * tail; i += stride) {
			const int64_t r = i / tail, e = groups * WF_DQ_GROUP + i % tail;
			out[r * ne0 + e] =
			    __float2half_rn(wf_dq_elem<T>(w + (size_t)r * row_size, e));
		}
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
	const int64_t stride = (int64_t)gridDim.x * blockDim.x;
	const int64_t first = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;

	for (int64_t i = first; i < n * groups; i += stride) {
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
		for (int64_t i = first; i < n * tail; i += stride) {
			const int64_t j = i / tail, e = groups * WF_DQ_GROUP + i % tail;
			const int32_t id = ids[j];
			y[j * ne0 + e] = id >= 0 && id < ne1
			                     ? wf_dq_elem<T>(w + (size_t)id * row_size, e)
			                     : 0.0f;
		}
	}
}

/* xh[j * ne0 + k] = x[j * xs + k] rounded to F16. */
static __global__ void __launch_bounds__(EW_THREADS)
    x_f16_kernel(const float *x, size_t xs, int64_t ne0, int64_t n, __half *xh)
{
	const int64_t stride = (int64_t)gridDim.x * blockDim.x;

	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n * ne0; i += stride)
		xh[i] = __float2half_rn(x[(size_t)(i / ne0) * xs + i % ne0]);
}

/* ---- Dispatch from a runtime type ---------------------------------------------------------- */

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

/* Calls f.go<T, N>() with the activation row count n (1..MV_MAX_N) as a template argument, so
 * the mat-vec's accumulators stay in registers: the one switch for the kernel and its host twin. */
template <enum wf_dtype T, class F> static int with_rows(F &f, uint32_t n)
{
	switch (n) {
	case 1:
		f.template go<T, 1>();
		break;
	case 2:
		f.template go<T, 2>();
		break;
	case 3:
		f.template go<T, 3>();
		break;
	case 4:
		f.template go<T, 4>();
		break;
	case 5:
		f.template go<T, 5>();
		break;
	case 6:
		f.template go<T, 6>();
		break;
	case 7:
		f.template go<T, 7>();
		break;
	case 8:
		f.template go<T, 8>();
		break;
	default:
		return WF_EINVAL;
	}
	return 0;
}

struct mv_launch_fn {
	const uint8_t *w;
	size_t row_size;
	int64_t ne0, ne1;
	const float *x;
	size_t xs;
	uint32_t n;
	float *y;
	size_t ys;
	cudaStream_t s;

	template <enum wf_dtype T, int N> void go()
	{
		const unsigned blocks = (unsigned)((ne1 + MV_WARPS - 1) / MV_WARPS);
		mv_kernel<T, N><<<blocks, MV_THREADS, 0, s>>>(w, row_size, ne0, ne1, x, xs, y, ys);
	}
	template <enum wf_dtype T> int operator()()
	{
		return with_rows<T>(*this, n);
	}
};

struct dq_f16_launch_fn {
	const uint8_t *w;
	size_t row_size;
	int64_t ne0, rows;
	__half *out;
	unsigned blocks;
	cudaStream_t s;

	template <enum wf_dtype T> int operator()()
	{
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

/* Checks w against its type: supported, a whole number of blocks per row, rows at least that
 * long, sizes the kernels' int arithmetic takes. */
static int check_matrix(const struct wf_engine_dev_matrix *w, const char *op, struct wf_diag *diag)
{
	if (!wf__cuda_supports(w->type))
		return wf_diag_set(diag, WF_EUNSUPPORTED, "%s: weight type %d has no CUDA kernel",
		                   op, (int)w->type);
	row_bytes_fn rb = {w->ne0};
	const int64_t bytes = wf_dq_dispatch(w->type, rb, (int64_t)-1);
	if (w->ne0 <= 0 || w->ne1 <= 0 || w->ne0 > INT_MAX || w->ne1 > INT_MAX || bytes < 0 ||
	    w->row_size < (size_t)bytes || !w->data)
		return wf_diag_set(diag, WF_EINVAL,
		                   "%s: bad weight matrix (%lld x %lld of type %d, rows %zu bytes)",
		                   op, (long long)w->ne0, (long long)w->ne1, (int)w->type,
		                   w->row_size);
	return 0;
}

/* ---- The ops (C linkage from their declarations in matmul.h) ---------- */

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

void wf__cuda_mm_destroy(struct wf__cuda_mm *mm)
{
	if (!mm)
		return;
	if (mm->blas)
		(void)blas.destroy(mm->blas);
	(void)wf_device_mem_free(mm->dev, mm->wh, NULL);
	(void)wf_device_mem_free(mm->dev, mm->xh, NULL);
	free(mm);
}

int wf__cuda_mm_create(struct wf__cuda_engine_ctx *c, struct wf_diag *diag)
{
	const struct wf_engine_dev_limits *lim = &c->lim;
	struct wf__cuda_mm *mm = (struct wf__cuda_mm *)calloc(1, sizeof(*mm));
	cublasStatus_t st;
	int rc = 0;

	if (!mm)
		return wf_diag_set(diag, -ENOMEM, "CUDA matmul context");
	mm->dev = c->dev;
	if ((rc = wf__cuda_blas_load(diag)) < 0)
		goto fail;
	st = blas.create(&mm->blas);
	if (st != CUBLAS_STATUS_SUCCESS) {
		mm->blas = NULL;
		rc = blas_fail(st, diag, "cublasCreate");
		goto fail;
	}
	st = blas.set_stream(mm->blas, c->stream);
	/* The default math mode lets cuBLAS use tensor cores for F16 inputs (the old
	 * CUBLAS_TENSOR_OP_MATH is deprecated); accumulation stays float (CUBLAS_COMPUTE_32F). */
	if (st == CUBLAS_STATUS_SUCCESS)
		st = blas.set_math_mode(mm->blas, CUBLAS_DEFAULT_MATH);
	if (st != CUBLAS_STATUS_SUCCESS) {
		rc = blas_fail(st, diag, "cuBLAS stream and math mode");
		goto fail;
	}
	/* Workspaces only where the GEMM path can run: more than MV_MAX_N rows. */
	if (lim->max_rows > MV_MAX_N && lim->max_ne0 > 0 && lim->max_ne1 > 0) {
		if (lim->max_ne0 > INT_MAX || lim->max_ne1 > INT_MAX) {
			rc = wf_diag_set(diag, WF_EINVAL,
			                 "CUDA matmul: matrix limits %lld x %lld too large",
			                 (long long)lim->max_ne0, (long long)lim->max_ne1);
			goto fail;
		}
		int64_t wh = lim->max_ne0 * lim->max_ne1;
		const int64_t cap = WS_CAP_HALVES > lim->max_ne0 ? WS_CAP_HALVES : lim->max_ne0;
		mm->wh_halves = wh < cap ? wh : cap;
		mm->xh_halves = (int64_t)lim->max_rows * lim->max_ne0;
		rc = wf_device_mem_alloc(c->dev, (size_t)mm->wh_halves * sizeof(__half),
		                         (void **)&mm->wh, diag);
		if (rc == 0)
			rc = wf_device_mem_alloc(c->dev, (size_t)mm->xh_halves * sizeof(__half),
			                         (void **)&mm->xh, diag);
		if (rc < 0)
			goto fail;
	}
	c->mm = mm;
	return 0;
fail:
	wf__cuda_mm_destroy(mm);
	return rc;
}

int wf__cuda_matmul(void *ctx, const struct wf_engine_dev_matrix *w, const float *x,
                    size_t x_stride, uint32_t n, float *y, size_t y_stride, struct wf_diag *diag)
{
	struct wf__cuda_engine_ctx *c = (struct wf__cuda_engine_ctx *)ctx;
	struct wf__cuda_mm *mm = c->mm;
	const uint8_t *wd = (const uint8_t *)w->data;
	int rc = check_matrix(w, "matmul", diag);

	if (rc < 0 || n == 0)
		return rc;
	if (n > 1 && (x_stride < (size_t)w->ne0 || y_stride < (size_t)w->ne1))
		return wf_diag_set(diag, WF_EINVAL,
		                   "matmul: strides %zu, %zu shorter than rows %lld, %lld",
		                   x_stride, y_stride, (long long)w->ne0, (long long)w->ne1);
	if (n <= MV_MAX_N) {
		mv_launch_fn f = {wd,       w->row_size, w->ne0, w->ne1,   x,
		                  x_stride, n,           y,      y_stride, c->stream};
		rc = wf_dq_dispatch(w->type, f, (int)WF_EUNSUPPORTED);
		return rc < 0 ? wf_diag_set(diag, rc, "matmul: n %u", n)
		              : wf__cuda_launched(diag, "matmul (mat-vec)");
	}

	if (!mm->wh || n > c->lim.max_rows || w->ne0 > c->lim.max_ne0 || y_stride > INT_MAX)
		return wf_diag_set(
		    diag, WF_EINVAL,
		    "matmul: %u rows of %lld exceed the context's limits (%u rows of %lld)", n,
		    (long long)w->ne0, c->lim.max_rows, (long long)c->lim.max_ne0);
	const int64_t ne0 = w->ne0, ne1 = w->ne1;
	x_f16_kernel<<<ew_blocks(c, (int64_t)n * ne0), EW_THREADS, 0, c->stream>>>(x, x_stride, ne0,
	                                                                           n, mm->xh);
	rc = wf__cuda_launched(diag, "matmul (activations to F16)");
	if (rc < 0)
		return rc;

	const float one = 1.0f, zero = 0.0f;
	const int64_t slab = mm->wh_halves / ne0; /* >= 1: the workspace holds a max_ne0 row */
	for (int64_t i0 = 0; i0 < ne1; i0 += slab) {
		const int64_t m = ne1 - i0 < slab ? ne1 - i0 : slab;
		dq_f16_launch_fn f = {wd + (size_t)i0 * w->row_size,
		                      w->row_size,
		                      ne0,
		                      m,
		                      mm->wh,
		                      ew_blocks(c, m * (ne0 / WF_DQ_GROUP + ne0 % WF_DQ_GROUP)),
		                      c->stream};
		(void)wf_dq_dispatch(w->type, f, 0);
		rc = wf__cuda_launched(diag, "matmul (weights to F16)");
		if (rc < 0)
			return rc;
		/* Column-major: W's rows are the columns of an ne0 x m matrix (lda ne0), x's the
		 * columns of ne0 x n (ldb ne0), and y's rows the columns of ne1 x n (ldc y_stride),
		 * so y^T[i0 .. i0+m) = W^T-op(A) * x^T. */
		cublasStatus_t st = blas.gemm_ex(
		    mm->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)m, (int)n, (int)ne0, &one, mm->wh,
		    CUDA_R_16F, (int)ne0, mm->xh, CUDA_R_16F, (int)ne0, &zero, y + i0, CUDA_R_32F,
		    (int)y_stride, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
		if (st != CUBLAS_STATUS_SUCCESS)
			return blas_fail(st, diag, "matmul: cublasGemmEx");
	}
	return 0;
}

/* The experts of a layer: one product per group, each on the path its row count takes (a
 * launch per expert; a grouped mat-vec kernel, one launch for every expert of a decode step, is
 * the next step once it can be timed on a GPU). */
int wf__cuda_matmul_experts(void *ctx, const struct wf_engine_dev_matrix *w, size_t stride,
                            uint32_t n_groups, const uint32_t *index, const uint32_t *first,
                            const uint32_t *count, const float *x, size_t x_stride, float *y,
                            size_t y_stride, struct wf_diag *diag)
{
	for (uint32_t g = 0; g < n_groups; g++) {
		struct wf_engine_dev_matrix m = *w;
		m.data = (const uint8_t *)w->data + (size_t)index[g] * stride;
		const int rc =
		    wf__cuda_matmul(ctx, &m, x + (size_t)first[g] * x_stride, x_stride, count[g],
		                    y + (size_t)first[g] * y_stride, y_stride, diag);
		if (rc < 0)
			return rc;
	}
	return 0;
}

int wf__cuda_get_rows(void *ctx, const struct wf_engine_dev_matrix *w, const int32_t *ids,
                      uint32_t n, float *y, struct wf_diag *diag)
{
	struct wf__cuda_engine_ctx *c = (struct wf__cuda_engine_ctx *)ctx;
	int rc = check_matrix(w, "get_rows", diag);

	if (rc < 0 || n == 0)
		return rc;
	const int64_t ne0 = w->ne0;
	get_rows_launch_fn f = {(const uint8_t *)w->data,
	                        w->row_size,
	                        ne0,
	                        w->ne1,
	                        ids,
	                        (int64_t)n,
	                        y,
	                        ew_blocks(c, (int64_t)n * (ne0 / WF_DQ_GROUP + ne0 % WF_DQ_GROUP)),
	                        c->stream};
	(void)wf_dq_dispatch(w->type, f, 0);
	return wf__cuda_launched(diag, "get_rows");
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

/* The mat-vec kernel's arithmetic for one row: 32 lanes' partial sums, then the xor-shuffle
 * tree in the kernel's order (lane l adds lane l ^ off); lane 0's sums are the result. */
struct host_mv_fn {
	const uint8_t *w;
	size_t row_size;
	int64_t ne0, ne1;
	const float *x;
	size_t xs;
	uint32_t n;
	float *y;
	size_t ys;

	template <enum wf_dtype T, int N> void go()
	{
		float acc[32][N], t[32][N];
		for (int64_t r = 0; r < ne1; r++) {
			for (int lane = 0; lane < 32; lane++)
				mv_lane<T, N>(w + (size_t)r * row_size, ne0, x, xs, lane, 32,
				              acc[lane]);
			for (int off = 16; off > 0; off >>= 1) {
				for (int lane = 0; lane < 32; lane++)
					for (int j = 0; j < N; j++)
						t[lane][j] = acc[lane][j] + acc[lane ^ off][j];
				for (int lane = 0; lane < 32; lane++)
					for (int j = 0; j < N; j++)
						acc[lane][j] = t[lane][j];
			}
			for (int j = 0; j < N; j++)
				y[(size_t)j * ys + r] = acc[0][j];
		}
	}
	template <enum wf_dtype T> int operator()()
	{
		return with_rows<T>(*this, n);
	}
};

int wf__cuda_matvec_host(const struct wf_engine_dev_matrix *w, const float *x, size_t x_stride,
                         uint32_t n, float *y, size_t y_stride)
{
	if (!wf__cuda_supports(w->type))
		return WF_EUNSUPPORTED;
	if (check_matrix(w, "matvec", NULL) < 0)
		return WF_EINVAL;
	host_mv_fn f = {
	    (const uint8_t *)w->data, w->row_size, w->ne0, w->ne1, x, x_stride, n, y, y_stride};
	return wf_dq_dispatch(w->type, f, (int)WF_EUNSUPPORTED);
}
