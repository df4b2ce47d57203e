/* The CUDA matmul family's arithmetic on the host (cuda/matmul.h host entry points) against the
 * host backend (kernels/backend_host.c, the reference), where every machine can run it:
 *  - the activation conversions (Q8_0, Q8_K, F16, BF16) equal the CPU's from_float byte for byte,
 *    at the reference level and at the level this CPU uses (they are identical at every level);
 *    the F16 overflow guard scales by exactly the power of two it reports;
 *  - the mat-vec path (every lane's integer block sums and float scales, the shuffle tree) equals
 *    the host backend's matmul but for the order of float additions, for every weight type,
 *    1 to 32 activation rows, strided x and y whose gaps stay untouched, the float types' 16-byte
 *    and element paths;
 *  - mul_mat_id's decode path: expert ids read per row, matrices at id x stride in stacks of
 *    experts and in equally spaced slots, x per token or per choice, ids < 0 untouched;
 *  - the prompt path's numerics (cuBLAS's inputs as this backend rounds them) against the host
 *    backend: the tolerances test_cuda_backend asserts on the GPU come from here. */
#include "cuda/matmul.h"
#include "kernels/kernels.h"
#include "tests/cuda/mmref.h"
#include "tests/cuda/ops_ref.h"
#include "tests/kernels/kgen.h"

#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

TestSuite(cuda_matvec_host, .timeout = 300);

#define SENTINEL 1234.5f

static const struct wf_kernel_type_ops *cpu_type(enum wf_dtype t)
{
	return wf_kernel_ops_type(wf_kernels_cpu_ops(), t);
}

static void act_check(enum wf_dtype weight, const float *x, int64_t ne0)
{
	const enum wf_dtype act = cpu_type(weight)->vec_dot_type;
	const size_t bytes = kgen_row_bytes(act, ne0) + 64;
	uint8_t *want = calloc(1, bytes), *got = calloc(1, bytes), *ref = calloc(1, bytes);
	int e = -1;
	cr_assert_eq(wf__cuda_act_host(weight, x, ne0, got, &e), 0);
	wf_kernels_cpu_ops()->from_float[act](x, want, ne0);
	wf_kernels_cpu_ops_level(WF_KERNEL_LEVEL_REF)->from_float[act](x, ref, ne0);
	cr_assert(memcmp(want, ref, kgen_row_bytes(act, ne0)) == 0, "levels differ");
	if (e == 0) {
		cr_assert(memcmp(got, want, kgen_row_bytes(act, ne0)) == 0,
		          "%s activations of %lld elements differ from the CPU's",
		          mmref_name(weight), (long long)ne0);
	} else {
		/* the overflow guard: exactly the CPU's rounding of x * 2^-e */
		cr_assert_eq(act, WF_DTYPE_F16);
		float *xs = malloc((size_t)ne0 * sizeof(float));
		for (int64_t i = 0; i < ne0; i++)
			xs[i] = ldexpf(x[i], -e);
		wf_kernels_cpu_ops()->from_float[act](xs, want, ne0);
		cr_assert(memcmp(got, want, (size_t)ne0 * 2) == 0);
		free(xs);
	}
	free(want), free(got), free(ref);
}

/* Random rows of three magnitudes; a zero block; a block whose largest magnitudes tie (+m and -m:
 * the first one decides Q8_K's sign); halves exactly between two Q8 steps; rows past F16's range
 * (the guard); tiny rows (F16 subnormals, kept as the CPU keeps them). */
Test(cuda_matvec_host, activations_bitwise)
{
	static const enum wf_dtype weights[] = {WF_DTYPE_F16, WF_DTYPE_BF16, WF_DTYPE_Q8_0,
	                                        WF_DTYPE_Q4_K};
	struct opsr_rng r = {31};
	const int64_t ne0 = 1024;
	float x[1024];

	for (size_t wi = 0; wi < sizeof(weights) / sizeof(weights[0]); wi++) {
		for (int variant = 0; variant < 8; variant++) {
			const float amp = variant == 0 ? 1.0f : variant == 1 ? 60.0f : 1e-3f;
			opsr_fill(&r, x, ne0, amp);
			if (variant == 3)
				memset(x + 256, 0, 256 * sizeof(float));
			if (variant == 4) {
				x[300] = 5.0f;
				x[301] = -5.0f;
				x[20] = -7.0f;
				x[40] = 7.0f;
			}
			if (variant == 5) /* 127 / 127 * k + 0.5 steps: x * id lands on .5 */
				for (int i = 0; i < 1024; i++)
					x[i] = (i % 32 == 0) ? 127.0f : (float)(i % 7) - 2.5f;
			if (variant == 6)
				x[77] = 1e6f, x[500] = -70000.0f;
			if (variant == 7)
				opsr_fill(&r, x, ne0, 1e-6f);
			act_check(weights[wi], x, ne0);
		}
	}
	/* the guard's exponent: rows reaching 2^15 are scaled below it */
	uint16_t h[256];
	int e;
	for (int i = 0; i < 256; i++)
		x[i] = 1.0f;
	x[9] = 32768.0f;
	cr_assert_eq(wf__cuda_act_host(WF_DTYPE_F16, x, 256, h, &e), 0);
	cr_assert_eq(e, 1);
	x[9] = 32767.0f;
	cr_assert_eq(wf__cuda_act_host(WF_DTYPE_F16, x, 256, h, &e), 0);
	cr_assert_eq(e, 0);
	x[9] = INFINITY; /* an infinity stays one, as the CPU's rounding keeps it */
	cr_assert_eq(wf__cuda_act_host(WF_DTYPE_F16, x, 256, h, &e), 0);
	cr_assert_eq(e, 0);
	cr_assert_eq(h[9], 0x7c00);
	cr_assert_eq(wf__cuda_act_host(WF_DTYPE_F32, x, 256, h, &e), WF_EINVAL);
	cr_assert_eq(wf__cuda_act_host(WF_DTYPE_Q4_K, x, 128, h, &e), WF_EINVAL);
}

/* The host backend's matmul of one product: the reference. */
static void host_matmul(const struct wf_backend_matrix *m, const float *x, size_t xs, uint32_t n,
                        float *y, size_t ys)
{
	struct wf_backend_ctx *c = opsr_host_ctx((struct wf_backend_limits){
	    .n_threads = 2, .max_rows = 1024, .max_ne0 = m->ne0, .max_ne1 = m->ne1});
	struct wf_backend_product p = {m, y, ys};
	OPSR_OK(wf_backend_host()->matmul(c, 1, &p, x, xs, n, &diag));
	wf_backend_host()->ctx_destroy(c);
}

/* Error of got against want over n rows of ne1 (ys apart): NMSE and max-abs over the rms. */
static void err(const float *got, const float *want, size_t ys, int64_t ne1, uint32_t n,
                double *ret_nmse, double *ret_rel)
{
	double num = 0, den = 0, mx = 0;
	for (uint32_t j = 0; j < n; j++)
		for (int64_t i = 0; i < ne1; i++) {
			const double w = want[j * ys + i], d = (double)got[j * ys + i] - w;
			num += isnan(d) ? INFINITY : d * d;
			den += w * w;
			mx = fabs(d) > mx || isnan(d) ? (isnan(d) ? INFINITY : fabs(d)) : mx;
		}
	*ret_nmse = den > 0 ? num / den : num;
	*ret_rel = den > 0 ? mx / sqrt(den / ((double)n * ne1)) : mx;
}

/* One matrix through the twin and the host backend; x and y strided, gaps untouched. The float
 * additions are the only difference: measured NMSE <= 9e-14 and max-abs/rms <= 1e-6 (every type,
 * these shapes); asserted 1e-11 and 1e-5. */
static void matvec_case(enum wf_dtype t, int64_t ne0, int64_t ne1, uint32_t n, bool misalign)
{
	const size_t xs = (size_t)ne0 + (misalign ? 5 : 8), ys = (size_t)ne1 + 3;
	size_t row;
	unsigned char *w = mmref_matrix(t, ne0, ne1, &row);
	float *x = mmref_acts(n, xs);
	float *got = malloc((size_t)n * ys * sizeof(float)), *want = malloc(n * ys * sizeof(float));
	for (size_t k = 0; k < (size_t)n * ys; k++)
		got[k] = want[k] = SENTINEL;
	for (size_t k = 0; k < (size_t)n * xs; k++) /* activations of a real model's spread */
		x[k] *= 3.0f;
	struct wf_backend_matrix m = {w, t, ne0, ne1, row, 0};
	cr_assert_eq(wf__cuda_matvec_host(&m, x, xs, n, got, ys), 0);
	host_matmul(&m, x, xs, n, want, ys);
	double nmse, rel;
	err(got, want, ys, ne1, n, &nmse, &rel);
	cr_log_info("matvec %-4s %4lld x %-5lld n %2u: NMSE %.3g max-abs/rms %.3g", mmref_name(t),
	            (long long)ne1, (long long)ne0, n, nmse, rel);
	cr_assert(nmse <= 1e-11 && rel <= 1e-5, "matvec %s %lld x %lld n %u: NMSE %g, max %g",
	          mmref_name(t), (long long)ne1, (long long)ne0, n, nmse, rel);
	for (uint32_t j = 0; j < n; j++)
		for (size_t i = (size_t)ne1; i < ys; i++)
			cr_assert_eq(got[j * ys + i], SENTINEL, "gap [%u][%zu] written", j, i);
	free(w), free(x), free(got), free(want);
}

Test(cuda_matvec_host, matvec_matches_host_backend)
{
	static const uint32_t ns[] = {1, 2, 3, 5, 8, 9, 16, 17, 31, 32};
	kgen_seed(41);
	for (int ti = 0; ti < MMREF_N_TYPES; ti++) {
		const enum wf_dtype t = mmref_types[ti];
		for (size_t k = 0; k < sizeof(ns) / sizeof(ns[0]); k++) {
			/* 3 blocks of 256 (part of a warp's blocks), 8 (Qwen3's 2048: whole warps)
			 */
			matvec_case(t, 768, 7, ns[k], false);
			matvec_case(t, 2048, 5, ns[k], k % 2 == 1);
			if (mmref_block(t) == 1) /* the element path: a tail past the 8-groups */
				matvec_case(t, 1001, 6, ns[k], true);
			else if (mmref_block(t) == 32)
				matvec_case(t, 32 * 23, 6, ns[k], false);
		}
	}
	struct wf_backend_matrix bad = {NULL, WF_DTYPE_Q8_K, 256, 1, 292, 0};
	float x[256] = {0}, y[1];
	cr_assert_eq(wf__cuda_matvec_host(&bad, x, 256, 1, y, 1), WF_EUNSUPPORTED);
	struct wf_backend_matrix odd = {x, WF_DTYPE_Q4_K, 256, 1, 146, 0}; /* rows not 4-aligned */
	cr_assert_eq(wf__cuda_matvec_host(&odd, x, 256, 1, y, 1), WF_EINVAL);
}

/* mul_mat_id's decode path through the twin and the host backend, on a stack of n_mat matrices
 * `gap` bytes apart beyond their own size (0: a stack of experts; > 0: equally spaced slots of a
 * cache), n tokens x k choices with some ids -1 (rows untouched by both). */
static void mmid_case(enum wf_dtype t, int64_t ne0, int64_t ne1, uint32_t n_mat, size_t gap,
                      uint32_t n, uint32_t k, bool per_slot, uint64_t seed)
{
	struct opsr_rng r = {seed};
	size_t row;
	unsigned char *one = mmref_matrix(t, ne0, ne1, &row);
	free(one);
	const size_t stride = row * (size_t)ne1 + gap;
	unsigned char *stack = malloc(stride * n_mat);
	for (uint32_t e = 0; e < n_mat; e++) {
		unsigned char *m = mmref_matrix(t, ne0, ne1, &row);
		memcpy(stack + e * stride, m, row * (size_t)ne1);
		free(m);
	}
	const uint32_t rows = n * k, xrows = per_slot ? rows : n;
	const size_t xs = (size_t)ne0 + 4, ys = (size_t)ne1 + 1;
	float *x = mmref_acts(xrows, xs);
	int32_t *ids = malloc(rows * sizeof(int32_t));
	for (uint32_t t0 = 0; t0 < n; t0++)
		for (uint32_t j = 0; j < k; j++) /* distinct experts per token, a few elsewhere */
			ids[t0 * k + j] =
			    (opsr_u32(&r) % 5 == 0)
			        ? -1
			        : (int32_t)((t0 * 7 + j * 3 + opsr_u32(&r) % 2) % n_mat);
	float *got = malloc(rows * ys * sizeof(float)), *want = malloc(rows * ys * sizeof(float));
	for (size_t i = 0; i < rows * ys; i++)
		got[i] = want[i] = SENTINEL;
	struct wf_backend_matrix m = {stack, t, ne0, ne1, row, stride};
	cr_assert_eq(wf__cuda_mul_mat_id_host(&m, ids, n, k, x, xs, per_slot, got, ys), 0);
	struct wf_backend_ctx *c = opsr_host_ctx((struct wf_backend_limits){
	    .n_threads = 2, .max_rows = 64, .max_ne0 = ne0, .max_ne1 = ne1, .max_stack = n_mat});
	struct wf_backend_product p = {&m, want, ys};
	OPSR_OK(wf_backend_host()->mul_mat_id(c, 1, &p, ids, n, k, x, xs, per_slot, &diag));
	wf_backend_host()->ctx_destroy(c);
	double nmse, rel;
	err(got, want, ys, ne1, rows, &nmse, &rel);
	cr_assert(nmse <= 1e-11 && rel <= 1e-5,
	          "mul_mat_id %s stack %u gap %zu n %u k %u per_slot %d: NMSE %g max %g",
	          mmref_name(t), n_mat, gap, n, k, per_slot, nmse, rel);
	for (uint32_t q = 0; q < rows; q++)
		for (size_t i = 0; i < ys; i++)
			if (ids[q] < 0 || i >= (size_t)ne1)
				cr_assert_eq(got[q * ys + i], SENTINEL, "row %u (id %d) written", q,
				             ids[q]);
	free(stack), free(x), free(ids), free(got), free(want);
}

Test(cuda_matvec_host, mul_mat_id_matches_host_backend)
{
	kgen_seed(42);
	for (int ti = 0; ti < MMREF_N_TYPES; ti++) {
		const enum wf_dtype t = mmref_types[ti];
		/* experts (gate/up: x per token; down: per choice), slots 4 KiB apart, a decode
		 * step of 8 sequences (64 rows) */
		mmid_case(t, 512, 24, 16, 0, 1, 8, false, 1 + ti);
		mmid_case(t, 256, 40, 16, 0, 2, 4, true, 2 + ti);
		mmid_case(t, 512, 24, 6, 4096, 3, 2, false, 3 + ti);
		mmid_case(t, 512, 24, 6, 4096, 3, 2, true, 4 + ti);
		mmid_case(t, 256, 8, 128, 0, 8, 8, true, 5 + ti);
	}
}

/* The prompt path's numerics model against the host backend. Plain types read the same
 * activations the CPU does (F32; BF16 and F16 rounded as the CPU rounds them) and accumulate
 * exactly-rounded products: measured NMSE <= 3e-14. Quantized types: weights rounded to F16 from
 * their exact dequantized values (2^-12 relative), activations to F16 (2^-12) where the CPU
 * rounds them to 8 bits: measured NMSE 1.35e-5 to 1.65e-5 (the CPU's int8 rounding: 1 / (4 *
 * 127^2) = 1.55e-5 for uniform activations), max-abs/rms <= 0.014. Asserted: plain NMSE <= 1e-11,
 * max 1e-5; quantized NMSE <= 1e-4, max-abs/rms <= 0.06. */
Test(cuda_matvec_host, gemm_numerics_within_tolerance)
{
	kgen_seed(43);
	for (int ti = 0; ti < MMREF_N_TYPES; ti++) {
		const enum wf_dtype t = mmref_types[ti];
		const int64_t ne0 = 2048, ne1 = 24;
		const uint32_t n = 40;
		const size_t xs = ne0, ys = ne1;
		size_t row;
		unsigned char *w = mmref_matrix(t, ne0, ne1, &row);
		float *x = mmref_acts(n, xs);
		for (size_t i = 0; i < n * xs; i++)
			x[i] *= 3.0f;
		x[5] = 1e5f; /* row 0 takes the F16 guard */
		float *got = malloc(n * ys * sizeof(float)), *want = malloc(n * ys * sizeof(float));
		struct wf_backend_matrix m = {w, t, ne0, ne1, row, 0};
		cr_assert_eq(wf__cuda_gemm_host(&m, x, xs, n, got, ys), 0);
		host_matmul(&m, x, xs, n, want, ys);
		double nmse, rel;
		/* row 0 (the guard's) alone: its outputs dwarf the others' in a pooled NMSE, and
		 * the CPU's F16 rounding overflows there (F16 weights) */
		err(got + ys, want + ys, ys, ne1, n - 1, &nmse, &rel);
		const bool plain = mmref_block(t) == 1;
		cr_log_info("gemm %-4s: NMSE %.3g max-abs/rms %.3g", mmref_name(t), nmse, rel);
		cr_assert(plain ? nmse <= 1e-11 && rel <= 1e-5 : nmse <= 1e-4 && rel <= 0.06,
		          "gemm %s: NMSE %g max %g", mmref_name(t), nmse, rel);
		for (int64_t i = 0; i < ne1; i++)
			cr_assert(isfinite(got[i]), "%s: the guard keeps row 0 finite",
			          mmref_name(t));
		if (t != WF_DTYPE_F16) {
			double n0, r0;
			err(got, want, ys, ne1, 1, &n0, &r0);
			cr_assert(plain ? n0 <= 1e-11 : n0 <= 1e-4, "%s row 0: NMSE %g",
			          mmref_name(t), n0);
		}
		free(w), free(x), free(got), free(want);
	}
}

/* mul_mat_id's prompt path groups the ids it reads back on the host: every row with an id >= 0
 * once, big groups (>= 16 rows) consecutive in matrix order with their rows in row order, the
 * rest listed in row order, groups sorted; an id past the stack refused with the counters left
 * clean (the next call works). 512 tokens x 8 of 128 experts, skewed so that both kinds of
 * groups occur, with a tenth of the ids -1; and without GEMM (F32 stacks): every row listed. */
Test(cuda_matvec_host, mul_mat_id_prompt_grouping)
{
	struct opsr_rng r = {9};
	const uint32_t rows = 512 * 8, stack = 128;
	int32_t *ids = malloc(rows * sizeof(int32_t));
	uint32_t *order = malloc(rows * 4), *list = malloc(rows * 4), *gi = malloc(rows * 4);
	uint32_t *gf = malloc(rows * 4), *gc = malloc(rows * 4), *seen = calloc(rows, 4);
	for (uint32_t q = 0; q < rows; q++)
		ids[q] = opsr_u32(&r) % 10 == 0
		             ? -1
		             : (int32_t)(opsr_u32(&r) % ((q / 8) % 2 ? 8 : stack));
	for (int gemm = 0; gemm < 2; gemm++) {
		uint32_t g, nb, nl;
		memset(seen, 0, rows * 4);
		cr_assert_eq(wf__cuda_mmid_group_host(ids, rows, stack, gemm, order, list, gi, gf,
		                                      gc, &g, &nb, &nl),
		             0);
		uint32_t total = 0, big_rows = 0;
		for (uint32_t i = 0; i < g; i++) {
			cr_assert(i == 0 || gi[i] > gi[i - 1], "groups sorted by matrix");
			const bool big = gemm && gc[i] >= 16;
			cr_assert_eq(gf[i] != UINT32_MAX, big, "group %u (%u rows)", i, gc[i]);
			if (big) {
				cr_assert_eq(gf[i], big_rows, "big groups consecutive");
				for (uint32_t j = 0; j < gc[i]; j++) {
					const uint32_t row = order[gf[i] + j];
					cr_assert_eq(ids[row], (int32_t)gi[i]);
					cr_assert(j == 0 || row > order[gf[i] + j - 1]);
					seen[row]++;
				}
				big_rows += gc[i];
			}
			total += gc[i];
		}
		cr_assert_eq(nb, big_rows);
		for (uint32_t j = 0; j < nl; j++) {
			cr_assert(j == 0 || list[j] > list[j - 1], "list in row order");
			seen[list[j]]++;
		}
		cr_assert_eq(nb + nl, total);
		for (uint32_t q = 0; q < rows; q++)
			cr_assert_eq(seen[q], ids[q] >= 0 ? 1u : 0u, "row %u (id %d)", q, ids[q]);
		cr_assert(gemm == 0 || (nb > 0 && nl > 0), "both kinds of groups: %u %u", nb, nl);
		cr_assert(gemm == 1 || nb == 0);
	}
	ids[rows / 2] = (int32_t)stack;
	uint32_t g, nb, nl;
	cr_assert_eq(
	    wf__cuda_mmid_group_host(ids, rows, stack, true, order, list, gi, gf, gc, &g, &nb, &nl),
	    WF_EINVAL);
	free(ids), free(order), free(list), free(gi), free(gf), free(gc), free(seen);
}
