/* The CUDA matmul and get_rows ops (cuda/matmul.cu) on a GPU against the CPU reference
 * (tests/cuda/mmref.h: rows dequantized by the reference kernels, a double-precision matmul).
 *
 *  - matmul, every weight type x n in {1, 3, 8} (the mat-vec kernel, float accumulation:
 *    NMSE <= 1e-6, max-abs <= 1e-3 of the outputs' rms) and n in {9, 33, 130} (weights and
 *    activations in F16 through cublasGemmEx: NMSE <= 5e-4, max-abs <= 2e-2 of the rms), odd
 *    row counts, plain types of a length with a tail after the 8-element groups, strided x and
 *    y whose gaps must stay untouched;
 *  - a matrix taller than the context's max_ne1, so the F16 workspace takes it in slabs;
 *  - get_rows bit-identical to dequantize_row (repeated ids, the last row), a zero row for an
 *    id out of range;
 *  - the refusals: a type without kernels, more rows than the context was made for.
 * Run through gpu_main.c: skipped (77) without a GPU. */
#include "tests/cuda/gpuenv.h"
#include "tests/cuda/mmref.h"
#include "tests/kernels/kgen.h"

#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define SENTINEL 1234.5f

static void fix_open(struct wft_gpu *f, uint32_t max_rows, int64_t max_ne0, int64_t max_ne1)
{
	wft_gpu_open(
	    f,
	    (struct wf_engine_dev_limits){
	        .n_threads = 1, .max_rows = max_rows, .max_ne0 = max_ne0, .max_ne1 = max_ne1},
	    true);
}

/* One matmul of a random ne1 x ne0 matrix of type t with n activation rows, x and y strided
 * with gaps, against the reference. */
static void matmul_case(struct wft_gpu *f, enum wf_dtype t, int64_t ne0, int64_t ne1, uint32_t n)
{
	const size_t xs = (size_t)ne0 + 5, ys = (size_t)ne1 + 3;
	size_t row;
	unsigned char *w = mmref_matrix(t, ne0, ne1, &row);
	float *wd = malloc((size_t)(ne0 * ne1) * sizeof(float));
	float *x = mmref_acts(n, xs);
	float *y = malloc((size_t)n * ys * sizeof(float));
	double *ref = malloc((size_t)n * (size_t)ne1 * sizeof(double));
	double nmse, max_rel;

	cr_assert(wd && y && ref);
	for (size_t k = 0; k < (size_t)n * ys; k++)
		y[k] = SENTINEL;
	void *dw = wft_gpu_up(f, w, row * (size_t)ne1);
	float *dx = wft_gpu_up(f, x, (size_t)n * xs * sizeof(float));
	float *dy = wft_gpu_up(f, y, (size_t)n * ys * sizeof(float));
	struct wf_engine_dev_matrix m = {dw, t, ne0, ne1, row};

	OKD(wf__cuda_matmul(&f->c, &m, dx, xs, n, dy, ys, &diag));
	wft_gpu_down(f, y, dy, (size_t)n * ys * sizeof(float));
	mmref_dequant(t, w, row, ne0, ne1, wd);
	mmref_matmul(wd, ne0, ne1, x, xs, n, ref);
	mmref_error(y, ys, ref, ne1, n, &nmse, &max_rel);

	const int gemm = n > 8;
	const double nmse_tol = gemm ? 5e-4 : 1e-6, max_tol = gemm ? 2e-2 : 1e-3;
	cr_log_info("matmul %-4s %5lld x %-4lld n %3u (%s): NMSE %.3g, max-abs/rms %.3g",
	            mmref_name(t), (long long)ne1, (long long)ne0, n,
	            gemm ? "cuBLAS F16" : "mat-vec", nmse, max_rel);
	cr_assert(nmse <= nmse_tol && max_rel <= max_tol,
	          "matmul %s %lld x %lld n %u: NMSE %.3g (<= %g), max-abs/rms %.3g (<= %g)",
	          mmref_name(t), (long long)ne1, (long long)ne0, n, nmse, nmse_tol, max_rel,
	          max_tol);
	for (uint32_t j = 0; j < n; j++)
		for (size_t i = (size_t)ne1; i < ys; i++)
			cr_assert_eq(y[j * ys + i], SENTINEL, "%s n %u: y gap [%u][%zu] written",
			             mmref_name(t), n, j, i);
	OKD(wf_device_mem_free(f->dev, dw, &diag));
	OKD(wf_device_mem_free(f->dev, dx, &diag));
	OKD(wf_device_mem_free(f->dev, dy, &diag));
	free(w);
	free(wd);
	free(x);
	free(y);
	free(ref);
}

Test(cuda_matmul, every_type_and_batch, .timeout = 300)
{
	static const uint32_t ns[] = {1, 3, 8, 9, 33, 130};
	struct wft_gpu f;

	kgen_seed(21);
	fix_open(&f, 130, 1024, 37);
	for (int ti = 0; ti < MMREF_N_TYPES; ti++) {
		enum wf_dtype t = mmref_types[ti];
		/* 3 blocks of 256 (whole warps of groups, then part of one); plain types also a
		 * length with a tail after the last group */
		for (size_t k = 0; k < sizeof(ns) / sizeof(ns[0]); k++) {
			matmul_case(&f, t, 768, 37, ns[k]);
			if (mmref_block(t) == 1)
				matmul_case(&f, t, 1001, 13, ns[k]);
			else if (mmref_block(t) == 32)
				matmul_case(&f, t, 32 * 23, 13, ns[k]);
		}
	}
	wft_gpu_close(&f);
}

/* max_ne1 7: a 33-row matrix goes through the F16 workspace in slabs of 7 rows. */
Test(cuda_matmul, tall_matrix_in_slabs, .timeout = 120)
{
	struct wft_gpu f;

	kgen_seed(22);
	fix_open(&f, 64, 512, 7);
	for (int ti = 0; ti < MMREF_N_TYPES; ti++) {
		matmul_case(&f, mmref_types[ti], 512, 33, 17);
		matmul_case(&f, mmref_types[ti], 512, 33, 2);
	}
	wft_gpu_close(&f);
}

Test(cuda_matmul, get_rows_bitwise, .timeout = 120)
{
	static const int32_t ids_ok[] = {0, 4, 4, 10, 1, 10, 7};
	struct wft_gpu f;

	kgen_seed(23);
	fix_open(&f, 8, 1024, 11);
	for (int ti = 0; ti < MMREF_N_TYPES; ti++) {
		enum wf_dtype t = mmref_types[ti];
		const int64_t ne0 = mmref_block(t) == 1 ? 1001 : 512, ne1 = 11;
		const uint32_t n = 9;
		int32_t ids[9];
		size_t row;
		unsigned char *w = mmref_matrix(t, ne0, ne1, &row);
		float *wd = malloc((size_t)(ne0 * ne1) * sizeof(float));
		float *y = malloc((size_t)(ne0 * n) * sizeof(float));

		cr_assert(wd && y);
		memcpy(ids, ids_ok, sizeof(ids_ok));
		ids[7] = -1;           /* out of range: a zero row */
		ids[8] = (int32_t)ne1; /* one past the last row */
		mmref_dequant(t, w, row, ne0, ne1, wd);
		void *dw = wft_gpu_up(&f, w, row * (size_t)ne1);
		int32_t *dids = wft_gpu_up(&f, ids, sizeof(ids));
		float *dy;
		OKD(wf_device_mem_alloc(f.dev, (size_t)(ne0 * n) * sizeof(float), (void **)&dy,
		                        &diag));
		struct wf_engine_dev_matrix m = {dw, t, ne0, ne1, row};
		OKD(wf__cuda_get_rows(&f.c, &m, dids, n, dy, &diag));
		wft_gpu_down(&f, y, dy, (size_t)(ne0 * n) * sizeof(float));
		for (uint32_t j = 0; j < n; j++) {
			for (int64_t e = 0; e < ne0; e++) {
				float want = j < 7 ? wd[ids[j] * ne0 + e] : 0.0f;
				cr_assert(memcmp(&y[j * ne0 + e], &want, sizeof(float)) == 0,
				          "get_rows %s row %u (id %d) element %lld: %a, want %a",
				          mmref_name(t), j, ids[j], (long long)e, y[j * ne0 + e],
				          want);
			}
		}
		OKD(wf_device_mem_free(f.dev, dw, &diag));
		OKD(wf_device_mem_free(f.dev, dids, &diag));
		OKD(wf_device_mem_free(f.dev, dy, &diag));
		free(w);
		free(wd);
		free(y);
	}
	wft_gpu_close(&f);
}

Test(cuda_matmul, refusals, .timeout = 60)
{
	struct wft_gpu f;
	struct wf_diag diag = {0};
	void *d;

	fix_open(&f, 16, 256, 4);
	int ret = wf_device_mem_alloc(f.dev, 1 << 20, &d, &diag);
	cr_assert_eq(ret, 0, "%s", wf_diag_str(&diag, ret));
	struct wf_engine_dev_matrix q8k = {d, WF_DTYPE_Q8_K, 256, 4, 292};
	cr_assert_eq(wf__cuda_matmul(&f.c, &q8k, d, 256, 1, d, 4, &diag), WF_EUNSUPPORTED);
	cr_assert_eq(wf__cuda_get_rows(&f.c, &q8k, d, 1, d, &diag), WF_EUNSUPPORTED);
	struct wf_engine_dev_matrix f32 = {d, WF_DTYPE_F32, 256, 4, 1024};
	/* more activation rows, or wider rows, than the workspaces were sized for */
	cr_assert_eq(wf__cuda_matmul(&f.c, &f32, d, 256, 17, d, 4, &diag), WF_EINVAL);
	struct wf_engine_dev_matrix wide = {d, WF_DTYPE_F32, 512, 4, 2048};
	cr_assert_eq(wf__cuda_matmul(&f.c, &wide, d, 512, 9, d, 4, &diag), WF_EINVAL);
	/* a row shorter than its blocks */
	struct wf_engine_dev_matrix shortrow = {d, WF_DTYPE_Q4_K, 256, 4, 100};
	cr_assert_eq(wf__cuda_matmul(&f.c, &shortrow, d, 256, 1, d, 4, &diag), WF_EINVAL);
	cr_assert_eq(wf__cuda_matmul(&f.c, &f32, d, 256, 0, d, 4, &diag), 0);
	cr_assert_eq(wf_device_mem_free(f.dev, d, &diag), 0);
	wft_gpu_close(&f);
}
