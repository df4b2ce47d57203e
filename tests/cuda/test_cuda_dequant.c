/* The CUDA kernels' block decoders (cuda/dequant.cuh) and mat-vec lane arithmetic, checked on
 * the host, where every machine can run them (no GPU needed):
 *  - wf__cuda_dequantize_host, the same __host__ __device__ decoders the kernels call, equals
 *    the reference dequantize_row (kernels/ref.c) bit for bit for every weight type: random
 *    valid blocks (real-model scales) and blocks of raw random bytes (every packed scale
 *    pattern, F16 scales that are subnormal, infinite or NaN), one to several blocks, plain
 *    types of lengths that leave a tail after the 8-element groups, matrices of odd row counts;
 *  - the types refused; cuBLAS loaded on demand.
 * The activation conversions and the mat-vec and mul_mat_id lane arithmetic are checked against
 * the host backend in test_cuda_matvec_host.c. */
#include "base/error.h"
#include "cuda/matmul.h"
#include "tests/cuda/mmref.h"
#include "tests/kernels/kgen.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

TestSuite(cuda_dequant, .timeout = 120);

/* Decodes ne1 rows of ne0 with both and compares the bytes; raw: random bytes, not kgen's. */
static void check_rows(enum wf_dtype t, int64_t ne0, int64_t ne1, int raw)
{
	size_t row;
	unsigned char *w = mmref_matrix(t, ne0, ne1, &row);
	float *ref = malloc((size_t)(ne0 * ne1) * sizeof(float));
	float *got = malloc((size_t)(ne0 * ne1) * sizeof(float));

	cr_assert(ref && got);
	if (raw)
		kgen_bytes(w, row * (size_t)ne1);
	mmref_dequant(t, w, row, ne0, ne1, ref);
	memset(got, 0xa5, (size_t)(ne0 * ne1) * sizeof(float));
	for (int64_t i = 0; i < ne1; i++)
		cr_assert_eq(wf__cuda_dequantize_host(t, w + (size_t)i * row, got + i * ne0, ne0),
		             0);
	for (int64_t e = 0; e < ne0 * ne1; e++) {
		if (memcmp(&ref[e], &got[e], sizeof(float)) != 0)
			cr_assert_fail("%s %s ne0 %lld row %lld element %lld: %a, reference %a",
			               mmref_name(t), raw ? "raw" : "valid", (long long)ne0,
			               (long long)(e / ne0), (long long)(e % ne0), got[e], ref[e]);
	}
	free(w);
	free(ref);
	free(got);
}

Test(cuda_dequant, decoders_match_reference_bitwise)
{
	static const int64_t blocks[] = {1, 2, 3, 7};
	static const int64_t rows[] = {1, 3, 5};

	kgen_seed(11);
	for (int ti = 0; ti < MMREF_N_TYPES; ti++) {
		enum wf_dtype t = mmref_types[ti];
		int64_t bs = mmref_block(t);
		/* plain types: whole groups, then lengths with a tail (1..7 past the last group) */
		int64_t qk = bs == 1 ? 256 : bs;
		for (size_t b = 0; b < sizeof(blocks) / sizeof(blocks[0]); b++)
			for (size_t r = 0; r < sizeof(rows) / sizeof(rows[0]); r++)
				for (int raw = 0; raw < 2; raw++)
					check_rows(t, blocks[b] * qk, rows[r], raw);
		if (bs == 1) {
			static const int64_t odd[] = {1, 3, 7, 9, 13, 33, 255, 1001};
			for (size_t k = 0; k < sizeof(odd) / sizeof(odd[0]); k++)
				for (int raw = 0; raw < 2; raw++)
					check_rows(t, odd[k], 3, raw);
		}
	}
}

/* Several blocks in one call, as get_rows and the F16 workspace walk them. */
Test(cuda_dequant, long_rows_bitwise)
{
	kgen_seed(12);
	for (int ti = 0; ti < MMREF_N_TYPES; ti++)
		check_rows(mmref_types[ti], 256 * 41, 1, 0);
}

Test(cuda_dequant, refuses_other_types)
{
	unsigned char blk[512] = {0};
	float y[256];

	for (int ti = 0; ti < MMREF_N_TYPES; ti++)
		cr_assert(wf__cuda_supports(mmref_types[ti]), "%s", mmref_name(mmref_types[ti]));
	static const enum wf_dtype no[] = {WF_DTYPE_Q8_K,   WF_DTYPE_Q2_K, WF_DTYPE_Q4_1,
	                                   WF_DTYPE_IQ4_NL, WF_DTYPE_I32,  WF_DTYPE_MXFP4};
	for (size_t i = 0; i < sizeof(no) / sizeof(no[0]); i++) {
		cr_assert_not(wf__cuda_supports(no[i]));
		cr_assert_eq(wf__cuda_dequantize_host(no[i], blk, y, 256), WF_EUNSUPPORTED);
	}
	/* not a whole number of blocks */
	cr_assert_eq(wf__cuda_dequantize_host(WF_DTYPE_Q4_K, blk, y, 128), WF_EINVAL);
	cr_assert_eq(wf__cuda_dequantize_host(WF_DTYPE_Q8_0, blk, y, 33), WF_EINVAL);
}

static bool cublas_mapped(void)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[1024];
	bool found = false;
	cr_assert_not_null(f);
	while (!found && fgets(line, sizeof line, f))
		found = strstr(line, "libcublas") != NULL;
	fclose(f);
	return found;
}

/* cuBLAS is loaded by the first CUDA context that can take the GEMM path, not at start: linking
 * it would relocate ~95 MB of private memory into every process (a worker on the host device
 * included). It loads without a GPU, and its functions resolve. */
Test(cuda_blas, loaded_on_demand_only)
{
	cr_assert(!cublas_mapped(), "libcublas is mapped before anything asked for it");
	struct wf_diag d = {0};
	cr_assert_eq(wf__cuda_blas_load(&d), 0, "%s", d.msg);
	cr_assert(cublas_mapped());
	cr_assert_eq(wf__cuda_blas_load(&d), 0, "loading twice is a no-op");
}
