/* The SIMD kernel levels (kernels/kernels.h) against the plain-C reference (kernels/ref.h).
 *
 *  - gemm and vec_dot, every weight type x every level the CPU has: rows of 1 to several blocks
 *    (float rows of odd lengths, so the scalar tails run), odd row counts, 1..9, 17 and 67
 *    activation rows (full tiles, partial tiles, more than one group), strides that are any
 *    multiple of the block size (what GGUF rows allow) and an out stride with a gap that must stay
 *    untouched. Per activation row: NMSE against the reference gemm and the largest error relative
 *    to the row's largest value. The integer types only differ by float summation order;
 *  - gemm's out[j][i] is bit-identical to the same level's vec_dot of row i with activation j
 *    (what makes an engine's results independent of how sequences are batched);
 *  - K-quant blocks at their extremes, and Q4_K/Q5_K against activations of one sign over whole
 *    4-element groups (the largest integer lanes the AVX-512 kernel scales as int16);
 *  - the activation quantizers (Q8_0, Q8_K, F16, BF16): bit-identical to the reference on random
 *    and hand-picked values (ties, zero blocks, the sign of Q8_K's d, NaN, infinities,
 *    subnormals);
 *  - the float numerics (softmax, swiglu, rope, the tiled attention of up to 8 query rows):
 *    bit-identical to the reference (a NaN may carry another payload) on random values, values
 *    that take ggml_v_expf's overflow and underflow branches, heads of odd sizes and rows of
 *    any length; and the host backend's tiled attention over batches of several sequences (rows
 *    starting at different cache rows) equal to the reference row by row, at every level;
 *  - the level choice: WF_KERNELS=ref|avx2|avx512, refusing a level the CPU lacks or a name that
 *    is none.
 * A level the CPU lacks is skipped (cr_skip_test), never passed. */
#include "base/error.h"
#include "kernels/backend.h"
#include "kernels/cpu_ops.h"
#include "kernels/kernels.h"
#include "kernels/ref.h"
#include "model/dtype.h"
#include "tests/kernels/kgen.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

TestSuite(kernels_simd, .timeout = 120);

/* ---- helpers ------------------------------------------------------------------------------- */

/* The level's ops, or a skip when the CPU (or this build) lacks it. */
static const struct wf_kernel_ops *level_ops(enum wf_kernel_level level)
{
	const struct wf_kernel_ops *o = wf_kernels_cpu_ops_level(level);

	if (!o)
		cr_skip_test("this CPU or build has no %s kernels", wf_kernel_level_name(level));
	return o;
}

static const struct wf_kernel_ops *ref_ops(void)
{
	const struct wf_kernel_ops *o = wf_kernels_cpu_ops_level(WF_KERNEL_LEVEL_REF);

	cr_assert_not_null(o);
	return o;
}

static size_t block_bytes(enum wf_dtype t)
{
	return wf_dtype_info(t)->type_size;
}

static int64_t block_elems(enum wf_dtype t)
{
	return wf_dtype_info(t)->block_size;
}

/* ---- gemm and vec_dot against the reference ------------------------------------------------ */

static double norm(const float *x, int64_t n)
{
	double s = 0;

	for (int64_t i = 0; i < n; i++)
		s += (double)x[i] * x[i];
	return sqrt(s);
}

struct worst {
	double nmse, rel;
};

/* One shape: n_rows weight rows at w_stride, n_act activation rows at act_stride (the reference
 * quantizer's output of random floats), outputs with a gap of 3 floats per row. */
static void check_shape(const struct wf_kernel_ops *simd, enum wf_dtype t, int64_t n,
                        int64_t n_rows, int64_t n_act, size_t w_pad, size_t act_pad,
                        double max_nmse, double max_rel, struct worst *worst)
{
	const struct wf_kernel_type_ops *so = wf_kernel_ops_type(simd, t);
	const struct wf_kernel_type_ops *ro = wf_kernel_ops_type(ref_ops(), t);
	const enum wf_dtype at = ro->vec_dot_type;
	const size_t ws = kgen_row_bytes(t, n) + w_pad * block_bytes(t);
	const size_t as = kgen_row_bytes(at, n) + act_pad * block_bytes(at);
	const size_t os = (size_t)n_rows + 3;
	char *w = malloc(ws * (size_t)n_rows), *act = malloc(as * (size_t)n_act);
	float *x = malloc((size_t)n * sizeof(float));
	float *out = malloc(os * (size_t)n_act * sizeof(float));
	float *want = malloc(os * (size_t)n_act * sizeof(float));
	double *wnorm = malloc((size_t)n_rows * sizeof(double));

	cr_assert(so && ro && so->gemm && so->vec_dot && ro->gemm);
	cr_assert_eq(so->vec_dot_type, at);
	cr_assert(w && act && x && out && want && wnorm);
	kgen_bytes(w, ws * (size_t)n_rows); /* the pads hold noise the kernels must not read */
	kgen_bytes(act, as * (size_t)n_act);
	for (int64_t i = 0; i < n_rows; i++)
		kgen_weights(t, w + (size_t)i * ws, n);
	for (int64_t j = 0; j < n_act; j++) {
		for (int64_t k = 0; k < n; k++)
			x[k] = kgen_uniform(-1.0f, 1.0f);
		ref_ops()->from_float[at](x, act + (size_t)j * as, n);
	}
	/* a NaN sentinel in every output slot: the gaps must keep it */
	memset(out, 0xff, os * (size_t)n_act * sizeof(float));
	ro->gemm(n, w, ws, n_rows, act, as, n_act, want, os);
	so->gemm(n, w, ws, n_rows, act, as, n_act, out, os);

	/* the rows' norms (dequantized, in double): the scale a dot's rounding error is relative
	 * to, which stays meaningful when a dot cancels to almost nothing */
	for (int64_t i = 0; i < n_rows; i++) {
		ro->dequantize_row(w + (size_t)i * ws, x, n);
		wnorm[i] = norm(x, n);
	}
	for (int64_t j = 0; j < n_act; j++) {
		double err2 = 0, ref2 = 0;

		if (at == WF_DTYPE_Q8_K)
			wf_kernels_ref_dequantize_row_q8_K(act + (size_t)j * as, x, n);
		else
			wf_kernel_ops_type(ref_ops(), at)
			    ->dequantize_row(act + (size_t)j * as, x, n);
		const double anorm = norm(x, n);

		for (size_t i = 0; i < os; i++) {
			const float got = out[(size_t)j * os + i];

			if (i >= (size_t)n_rows) {
				uint32_t bits;
				memcpy(&bits, &got, 4);
				cr_assert_eq(bits, 0xffffffffu, "gap %zu of row %ld written", i,
				             (long)j);
				continue;
			}
			const double r = want[(size_t)j * os + i];
			/* the batched result is the level's own vec_dot, bit for bit */
			const float one = so->vec_dot(n, w + i * ws, act + (size_t)j * as);
			cr_assert(memcmp(&one, &got, 4) == 0,
			          "%s n=%ld rows=%ld acts=%ld: gemm[%ld][%zu] %a != vec_dot %a",
			          wf_dtype_info(t)->name, (long)n, (long)n_rows, (long)n_act,
			          (long)j, i, got, one);
			const double rel = fabs(got - r) / (wnorm[i] * anorm + 1e-30);
			cr_assert(
			    rel <= max_rel,
			    "%s n=%ld rows=%ld acts=%ld [%ld][%zu]: %a vs reference %a: error "
			    "%.3g of |w||a| (max %.3g)",
			    wf_dtype_info(t)->name, (long)n, (long)n_rows, (long)n_act, (long)j, i,
			    got, r, rel, max_rel);
			worst->rel = fmax(worst->rel, rel);
			err2 += (got - r) * (got - r);
			ref2 += r * r;
		}
		/* NMSE over a row of outputs needs a few of them to mean anything */
		if (n_rows >= 8) {
			const double nmse = ref2 > 0 ? err2 / ref2 : err2;

			cr_assert(nmse <= max_nmse,
			          "%s n=%ld rows=%ld acts=%ld act row %ld: nmse %.3g (max %.3g)",
			          wf_dtype_info(t)->name, (long)n, (long)n_rows, (long)n_act,
			          (long)j, nmse, max_nmse);
			worst->nmse = fmax(worst->nmse, nmse);
		}
	}
	free(w);
	free(act);
	free(x);
	free(out);
	free(want);
	free(wnorm);
}

static void check_type(enum wf_kernel_level level, enum wf_dtype t)
{
	const struct wf_kernel_ops *simd = level_ops(level);
	const bool is_float = t == WF_DTYPE_F32 || t == WF_DTYPE_F16 || t == WF_DTYPE_BF16;
	/* integer block sums are exact: only float summation order differs. The float types
	 * accumulate in float with FMA where the reference adds in double. The error bound is
	 * relative to |w| |a| (a dot's rounding scale); worst seen at writing: 1.5e-7 (float
	 * types), 7e-8 (integer types). */
	const double max_nmse = is_float ? 1e-9 : 1e-10, max_rel = is_float ? 1e-6 : 5e-7;
	static const int64_t float_n[] = {1, 7, 8, 15, 16, 17, 31, 32, 33, 63, 100, 1001};
	static const int64_t block_n[] = {1, 2, 3, 5, 8};
	static const int64_t acts[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 17, 67};
	static const int64_t rows[] = {1, 3, 9};
	struct worst worst = {0, 0};
	int n_shapes = 0;

	kgen_seed(0x51d0 + (uint64_t)t * 131 + (uint64_t)level);
	const int n_sizes = is_float ? 12 : 5;
	for (int s = 0; s < n_sizes; s++) {
		const int64_t n = is_float ? float_n[s] : block_n[s] * block_elems(t);

		for (size_t a = 0; a < sizeof(acts) / sizeof(acts[0]); a++) {
			for (size_t r = 0; r < sizeof(rows) / sizeof(rows[0]); r++) {
				/* pads of 0, 1 or 3 blocks: strides that are no power of two */
				const size_t w_pad =
				    (size_t)(a + r) % 3 == 2 ? 3 : (size_t)(a + r) % 3;
				const size_t act_pad = (size_t)(a + 2 * r) % 3;

				check_shape(simd, t, n, rows[r], acts[a], w_pad, act_pad, max_nmse,
				            max_rel, &worst);
				n_shapes++;
			}
		}
	}
	cr_log_info("%s %s: %d shapes, worst nmse %.3g, worst error / (|w| |a|) %.3g",
	            wf_kernel_level_name(level), wf_dtype_info(t)->name, n_shapes, worst.nmse,
	            worst.rel);
}

#define TYPE_TESTS(lvl, LVL)                                                                       \
	Test(kernels_simd, lvl##_f32)                                                              \
	{                                                                                          \
		check_type(WF_KERNEL_LEVEL_##LVL, WF_DTYPE_F32);                                   \
	}                                                                                          \
	Test(kernels_simd, lvl##_f16)                                                              \
	{                                                                                          \
		check_type(WF_KERNEL_LEVEL_##LVL, WF_DTYPE_F16);                                   \
	}                                                                                          \
	Test(kernels_simd, lvl##_bf16)                                                             \
	{                                                                                          \
		check_type(WF_KERNEL_LEVEL_##LVL, WF_DTYPE_BF16);                                  \
	}                                                                                          \
	Test(kernels_simd, lvl##_q8_0)                                                             \
	{                                                                                          \
		check_type(WF_KERNEL_LEVEL_##LVL, WF_DTYPE_Q8_0);                                  \
	}                                                                                          \
	Test(kernels_simd, lvl##_q4_0)                                                             \
	{                                                                                          \
		check_type(WF_KERNEL_LEVEL_##LVL, WF_DTYPE_Q4_0);                                  \
	}                                                                                          \
	Test(kernels_simd, lvl##_q4_K)                                                             \
	{                                                                                          \
		check_type(WF_KERNEL_LEVEL_##LVL, WF_DTYPE_Q4_K);                                  \
	}                                                                                          \
	Test(kernels_simd, lvl##_q5_K)                                                             \
	{                                                                                          \
		check_type(WF_KERNEL_LEVEL_##LVL, WF_DTYPE_Q5_K);                                  \
	}                                                                                          \
	Test(kernels_simd, lvl##_q6_K)                                                             \
	{                                                                                          \
		check_type(WF_KERNEL_LEVEL_##LVL, WF_DTYPE_Q6_K);                                  \
	}

TYPE_TESTS(avx2, AVX2)
TYPE_TESTS(avx512, AVX512)

/* Extreme K-quant blocks: all 6-bit scales and mins at 63, values at their largest, activations
 * at +-127: the int16 pair sums come closest to saturating here. */
static void check_extremes(enum wf_kernel_level level)
{
	const struct wf_kernel_ops *simd = level_ops(level);
	struct wf_block_q4_K q4[2];
	struct wf_block_q5_K q5[2];
	struct wf_block_q6_K q6[2];
	struct wf_block_q8_K y[2];
	struct wf_block_q8_0 a0[16], w0[16];
	struct wf_block_q4_0 w4[16];

	for (int b = 0; b < 2; b++) {
		q4[b].d = q5[b].d = q6[b].d = kgen_h(1e-3f);
		q4[b].dmin = q5[b].dmin = kgen_h(2e-3f);
		memset(q4[b].scales, 0xff, sizeof(q4[b].scales));
		memset(q5[b].scales, 0xff, sizeof(q5[b].scales));
		memset(q4[b].qs, 0xff, sizeof(q4[b].qs));
		memset(q5[b].qs, 0xff, sizeof(q5[b].qs));
		memset(q5[b].qh, 0xff, sizeof(q5[b].qh));
		memset(q6[b].ql, b ? 0x00 : 0xff,
		       sizeof(q6[b].ql)); /* 6-bit 63 and 0: v = 31, -32 */
		memset(q6[b].qh, b ? 0x00 : 0xff, sizeof(q6[b].qh));
		memset(q6[b].scales, b ? 0x80 : 0x7f, sizeof(q6[b].scales)); /* -128 and 127 */
		y[b].d = 1e-2f;
		for (int e = 0; e < WF_QK_K; e++)
			y[b].qs[e] = (int8_t)((e + b) % 3 == 0 ? -127 : 127);
		for (int g = 0; g < WF_QK_K / 16; g++) {
			int s = 0;
			for (int e = 0; e < 16; e++)
				s += y[b].qs[16 * g + e];
			y[b].bsums[g] = (int16_t)s;
		}
	}
	for (int b = 0; b < 16; b++) {
		w0[b].d = a0[b].d = w4[b].d = kgen_h(0.5f);
		memset(w0[b].qs, b % 2 ? 0x80 : 0x7f, 32); /* -128 and 127 */
		memset(w4[b].qs, b % 2 ? 0x00 : 0xff, 16); /* -8 and 7 */
		for (int e = 0; e < 32; e++)
			a0[b].qs[e] = (int8_t)(e % 2 ? -127 : 127);
	}
	const struct {
		enum wf_dtype t;
		const void *w, *a;
		int64_t n;
	} cases[] = {
	    {WF_DTYPE_Q4_K, q4, y, 512},  {WF_DTYPE_Q5_K, q5, y, 512},  {WF_DTYPE_Q6_K, q6, y, 512},
	    {WF_DTYPE_Q8_0, w0, a0, 512}, {WF_DTYPE_Q4_0, w4, a0, 512},
	};
	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		const float r = wf_kernel_ops_type(ref_ops(), cases[c].t)
		                    ->vec_dot(cases[c].n, cases[c].w, cases[c].a);
		const float s = wf_kernel_ops_type(simd, cases[c].t)
		                    ->vec_dot(cases[c].n, cases[c].w, cases[c].a);

		cr_assert(fabsf(s - r) <= 1e-5f * fabsf(r) + 1e-6f, "%s: %a vs reference %a",
		          wf_dtype_info(cases[c].t)->name, s, r);
	}
}

Test(kernels_simd, avx2_extremes)
{
	check_extremes(WF_KERNEL_LEVEL_AVX2);
}
Test(kernels_simd, avx512_extremes)
{
	check_extremes(WF_KERNEL_LEVEL_AVX512);
}

/* Q4_K/Q5_K at their largest against activations of one sign over whole 4-element groups: the
 * AVX-512 kernel scales each vpdpbusd lane (four products) as a sign-extended int16, so the
 * largest lane, 4 x 31 x 127, must come out exact, positive and negative, through gemm's tiles
 * of every size (1..8 rows) as through vec_dot. */
static void check_k_lanes(enum wf_kernel_level level)
{
	const struct wf_kernel_ops *simd = level_ops(level);
	enum { NB = 2, NA = 8 };
	struct wf_block_q4_K q4[NB];
	struct wf_block_q5_K q5[NB];
	struct wf_block_q8_K y[NA][NB];
	float out[NA], one;

	for (int b = 0; b < NB; b++) {
		q4[b].d = q5[b].d = kgen_h(1e-3f);
		q4[b].dmin = q5[b].dmin = kgen_h(2e-3f);
		memset(q4[b].scales, 0xff, sizeof(q4[b].scales)); /* scales and mins 63 */
		memset(q5[b].scales, 0xff, sizeof(q5[b].scales));
		memset(q4[b].qs, 0xff, sizeof(q4[b].qs)); /* values 15 (Q4_K), 31 (Q5_K) */
		memset(q5[b].qs, 0xff, sizeof(q5[b].qs));
		memset(q5[b].qh, 0xff, sizeof(q5[b].qh));
	}
	for (int j = 0; j < NA; j++)
		for (int b = 0; b < NB; b++) {
			/* row j: all +127, all -127, or the sign flipping every 4 (j % 3) */
			for (int e = 0; e < WF_QK_K; e++) {
				const int neg = j % 3 == 1 || (j % 3 == 2 && (e / 4 + b) % 2);
				y[j][b].qs[e] = (int8_t)(neg ? -127 : 127);
			}
			for (int g = 0; g < WF_QK_K / 16; g++) {
				int sum = 0;
				for (int e = 0; e < 16; e++)
					sum += y[j][b].qs[16 * g + e];
				y[j][b].bsums[g] = (int16_t)sum;
			}
			y[j][b].d = 1e-2f * (float)(j + 1);
		}
	const struct {
		enum wf_dtype t;
		const void *w;
	} cases[] = {{WF_DTYPE_Q4_K, q4}, {WF_DTYPE_Q5_K, q5}};
	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		const struct wf_kernel_type_ops *so = wf_kernel_ops_type(simd, cases[c].t);
		const struct wf_kernel_type_ops *ro = wf_kernel_ops_type(ref_ops(), cases[c].t);

		for (int na = 1; na <= NA; na++) {
			so->gemm(NB * WF_QK_K, cases[c].w, sizeof(q5), 1, y, sizeof(y[0]), na, out,
			         1);
			for (int j = 0; j < na; j++) {
				const float r = ro->vec_dot(NB * WF_QK_K, cases[c].w, y[j]);

				one = so->vec_dot(NB * WF_QK_K, cases[c].w, y[j]);
				cr_assert(memcmp(&one, &out[j], 4) == 0,
				          "%s acts=%d row %d: gemm %a != vec_dot %a",
				          wf_dtype_info(cases[c].t)->name, na, j, out[j], one);
				cr_assert(fabsf(one - r) <= 1e-5f * fabsf(r) + 1e-6f,
				          "%s row %d: %a vs reference %a",
				          wf_dtype_info(cases[c].t)->name, j, one, r);
			}
		}
	}
}

Test(kernels_simd, avx2_k_lanes)
{
	check_k_lanes(WF_KERNEL_LEVEL_AVX2);
}
Test(kernels_simd, avx512_k_lanes)
{
	check_k_lanes(WF_KERNEL_LEVEL_AVX512);
}

/* ---- activation quantizers: bit for bit ---------------------------------------------------- */

/* A finite float of any magnitude from 2^-40 to 2^40 (or zero), either sign. */
static float rng_wide(void)
{
	const uint64_t r = kgen_u64();

	if ((r & 63) == 0)
		return (r & 64) ? -0.0f : 0.0f;
	return ldexpf(kgen_uniform(-1.0f, 1.0f), (int)((r >> 8) % 81) - 40);
}

static void check_quantizer(const struct wf_kernel_ops *simd, enum wf_dtype at, const float *x,
                            int64_t n, const char *what)
{
	const size_t nb = kgen_row_bytes(at, n);
	uint8_t *a = malloc(nb + 16), *b = malloc(nb + 16);

	cr_assert(a && b);
	memset(a, 0xa5, nb + 16);
	memset(b, 0xa5, nb + 16);
	ref_ops()->from_float[at](x, a, n);
	simd->from_float[at](x, b, n);
	for (size_t i = 0; i < nb + 16; i++)
		cr_assert_eq(a[i], b[i], "%s %s n=%ld: byte %zu: %02x, reference %02x",
		             wf_dtype_info(at)->name, what, (long)n, i, b[i], a[i]);
	free(a);
	free(b);
}

static void check_quantizers(enum wf_kernel_level level)
{
	const struct wf_kernel_ops *simd = level_ops(level);
	enum { N = 4 * 256 };
	float x[N];

	kgen_seed(0x9a77 + (uint64_t)level);
	/* random rows at several scales, then rows of one scale with ties built in */
	for (int trial = 0; trial < 200; trial++) {
		const float scale = ldexpf(1.0f, (int)(kgen_u64() % 60) - 30);

		for (int i = 0; i < N; i++)
			x[i] = kgen_uniform(-1.0f, 1.0f) * scale;
		if (trial % 4 == 1)
			for (int i = 0; i < N; i++)
				x[i] = rng_wide();
		if (trial % 4 == 2) {
			/* amax 127 gives Q8_0 d = 1 and Q8_K iscale = -1: k + 0.5 are exact ties */
			for (int i = 0; i < N; i++)
				x[i] = (float)((int)(kgen_u64() % 254) - 127) +
				       ((kgen_u64() & 1) ? 0.5f : 0.0f);
			for (int i = 0; i < N; i += 32)
				x[i + (int)(kgen_u64() % 32)] = (kgen_u64() & 1) ? 127.0f : -127.0f;
		}
		if (trial % 4 == 3) {
			/* a zero block, a block of one value, and equal magnitudes of both signs */
			for (int i = 0; i < 512; i++)
				x[i] = i < 256 ? 0.0f : -3.0f;
			x[700] = 5.0f;
			x[701] = -5.0f;
		}
		const int64_t n = 256 * (1 + trial % 4);
		check_quantizer(simd, WF_DTYPE_Q8_0, x, n, "random");
		check_quantizer(simd, WF_DTYPE_Q8_K, x, n, "random");
		check_quantizer(simd, WF_DTYPE_F16, x, n, "random");
		check_quantizer(simd, WF_DTYPE_BF16, x, n, "random");
	}
	/* the float conversions on every kind of bit pattern (NaNs too), with tails of any length
	 */
	for (int trial = 0; trial < 64; trial++) {
		for (int i = 0; i < N; i++) {
			uint32_t u = (uint32_t)kgen_u64();
			memcpy(&x[i], &u, 4);
		}
		const float specials[] = {
		    NAN,       -NAN,      INFINITY,       -INFINITY,    65519.0f,
		    65520.0f,  -65520.0f, 0x1p-25f,       3 * 0x1p-25f, 0x1p-14f,
		    0x1p-149f, -0.0f,     1.0f + 0x1p-11f};
		for (size_t i = 0; i < sizeof(specials) / sizeof(specials[0]); i++)
			x[(size_t)trial + 13 * i] = specials[i];
		check_quantizer(simd, WF_DTYPE_F16, x, 1 + trial * 7, "bits");
		check_quantizer(simd, WF_DTYPE_BF16, x, 1 + trial * 7, "bits");
	}
}

Test(kernels_simd, avx2_quantizers)
{
	check_quantizers(WF_KERNEL_LEVEL_AVX2);
}
Test(kernels_simd, avx512_quantizers)
{
	check_quantizers(WF_KERNEL_LEVEL_AVX512);
}

/* ---- float numerics: bit for bit ---------------------------------------------------------- */

/* The same float, or NaN both (the payload of a NaN may differ: which operand an instruction
 * takes it from is the compiler's choice of encoding). */
static void assert_same(const float *want, const float *got, size_t n, const char *what)
{
	for (size_t i = 0; i < n; i++) {
		uint32_t a, b;

		memcpy(&a, &want[i], 4);
		memcpy(&b, &got[i], 4);
		cr_assert(a == b || (isnan(want[i]) && isnan(got[i])),
		          "%s: [%zu] = %a (%08x), reference %a (%08x)", what, i, (double)got[i], b,
		          (double)want[i], a);
	}
}

/* A float as activations hold them (most of them), or one that takes ggml_v_expf's special
 * branches (|x| / ln 2 past 126 and 192), an infinity or a NaN. */
static float rng_act(int trial)
{
	const uint64_t r = kgen_u64();

	switch (trial % 4) {
	case 0:
		return kgen_uniform(-8.0f, 8.0f);
	case 1:
		return kgen_uniform(-200.0f, 200.0f);
	case 2:
		return rng_wide();
	default:
		if ((r & 255) == 0)
			return (r & 256) ? -INFINITY : INFINITY;
		if ((r & 255) == 1)
			return NAN;
		return kgen_uniform(-150.0f, 150.0f);
	}
}

static void check_numerics(enum wf_kernel_level level)
{
	const struct wf_kernel_ops *simd = level_ops(level), *ref = ref_ops();
	enum { N = 300 };
	float g[N], u[N], want[N], got[N];
	char what[96];

	cr_assert(simd->softmax && simd->swiglu && simd->rope && simd->attend_tiled);
	kgen_seed(0x5eed + (uint64_t)level);
	for (int trial = 0; trial < 400; trial++) {
		const uint32_t n =
		    trial < 100 ? (uint32_t)trial + 1 : 1 + (uint32_t)(kgen_u64() % N);

		for (uint32_t i = 0; i < n; i++) {
			g[i] = rng_act(trial);
			u[i] = rng_act(trial);
		}
		snprintf(what, sizeof(what), "%s swiglu n=%u trial %d", wf_kernel_level_name(level),
		         n, trial);
		ref->swiglu(g, u, want, n);
		simd->swiglu(g, u, got, n);
		assert_same(want, got, n, what);
		memcpy(want, g, n * sizeof(float));
		memcpy(got, g, n * sizeof(float));
		snprintf(what, sizeof(what), "%s softmax n=%u trial %d",
		         wf_kernel_level_name(level), n, trial);
		ref->softmax(want, n);
		simd->softmax(got, n);
		assert_same(want, got, n, what);
	}
	/* rope: every pair layout, angles of far positions */
	const uint32_t dims[] = {2, 4, 6, 32, 64, 80, 128};
	for (size_t d = 0; d < sizeof(dims) / sizeof(dims[0]); d++)
		for (int neox = 0; neox < 2; neox++)
			for (int trial = 0; trial < 20; trial++) {
				float cs[128];

				wf_cpu_rope_angles((uint32_t)(kgen_u64() % 40000), dims[d],
				                   trial % 2 ? 10000.0f : 1000000.0f, cs);
				for (uint32_t i = 0; i < 130; i++)
					want[i] = got[i] = rng_act(trial % 3);
				ref->rope(want, dims[d], cs, neox);
				simd->rope(got, dims[d], cs, neox);
				snprintf(what, sizeof(what), "%s rope n_dims=%u neox=%d",
				         wf_kernel_level_name(level), dims[d], neox);
				assert_same(want, got, 130, what);
			}
}

Test(kernels_simd, avx2_numerics)
{
	check_numerics(WF_KERNEL_LEVEL_AVX2);
}
Test(kernels_simd, avx512_numerics)
{
	check_numerics(WF_KERNEL_LEVEL_AVX512);
}

/* n_q rows over one cache of n_pos positions (heads of D, two kv heads side by side, the second
 * one read) with each row's own count of positions, against the reference row by row. */
static void check_attend(const struct wf_kernel_ops *simd, uint32_t n_q, const uint32_t *n_kv,
                         uint32_t n_pos, uint32_t D, float scale, float qmag)
{
	const size_t kv_stride = 2u * D * sizeof(uint16_t);
	uint16_t *kc = malloc(n_pos * kv_stride), *vc = malloc(n_pos * kv_stride);
	float *q = malloc(WF_KERNELS_FA_ROWS * (D + 3) * sizeof(float));
	float *want = malloc(WF_KERNELS_FA_ROWS * (D + 5) * sizeof(float));
	float *got = malloc(WF_KERNELS_FA_ROWS * (D + 5) * sizeof(float));
	float *scratch = malloc(WF_KERNELS_FA_SCRATCH(D) * sizeof(float));
	char what[128];

	cr_assert(kc && vc && q && want && got && scratch);
	for (size_t i = 0; i < n_pos * 2u * D; i++) {
		kc[i] = kgen_h(kgen_uniform(-2.0f, 2.0f));
		vc[i] = kgen_h(kgen_uniform(-2.0f, 2.0f));
	}
	for (size_t i = 0; i < WF_KERNELS_FA_ROWS * (D + 3); i++)
		q[i] = kgen_uniform(-qmag, qmag);
	memset(want, 0x7f, WF_KERNELS_FA_ROWS * (D + 5) * sizeof(float));
	memset(got, 0x7f, WF_KERNELS_FA_ROWS * (D + 5) * sizeof(float));
	const uint8_t *k = (const uint8_t *)kc + D * sizeof(uint16_t);
	const uint8_t *v = (const uint8_t *)vc + D * sizeof(uint16_t);
	ref_ops()->attend_tiled(n_q, q, D + 3, n_kv, k, v, kv_stride, D, scale, scratch, want,
	                        D + 5);
	simd->attend_tiled(n_q, q, D + 3, n_kv, k, v, kv_stride, D, scale, scratch, got, D + 5);
	snprintf(what, sizeof(what), "attend_tiled n_q=%u D=%u n_kv[0]=%u scale=%g", n_q, D,
	         n_kv[0], (double)scale);
	/* the gaps between output rows stay untouched */
	assert_same(want, got, WF_KERNELS_FA_ROWS * (D + 5), what);
	free(kc);
	free(vc);
	free(q);
	free(want);
	free(got);
	free(scratch);
}

static void check_attend_tiled(enum wf_kernel_level level)
{
	const struct wf_kernel_ops *simd = level_ops(level);
	const uint32_t heads[] = {64, 128, 80, 36, 4, 1};
	const uint32_t lens[] = {1, 2, 7, 63, 64, 65, 127, 128, 129, 200, 300};

	kgen_seed(0xa77e + (uint64_t)level);
	for (size_t h = 0; h < sizeof(heads) / sizeof(heads[0]); h++) {
		const uint32_t D = heads[h];

		for (size_t l = 0; l < sizeof(lens) / sizeof(lens[0]); l++)
			for (uint32_t n_q = 1; n_q <= WF_KERNELS_FA_ROWS; n_q++) {
				uint32_t n_kv[WF_KERNELS_FA_ROWS];

				/* a prompt's rows (one more position each), or any counts */
				for (uint32_t r = 0; r < n_q; r++)
					n_kv[r] = (l + r) % 3 ? lens[l] + r
					                      : 1 + (uint32_t)(kgen_u64() % 300);
				check_attend(simd, n_q, n_kv, 310, D, 1.0f / sqrtf((float)D), 1.0f);
			}
		/* scores far apart: the softmax's underflow, and the running maximum moving */
		const uint32_t far[3] = {300, 150, 70};
		check_attend(simd, 3, far, 300, D, 4.0f, 30.0f);
		check_attend(simd, 3, far, 300, D, 0.01f, 1.0f);
	}
}

Test(kernels_simd, avx2_attend_tiled)
{
	check_attend_tiled(WF_KERNEL_LEVEL_AVX2);
}
Test(kernels_simd, avx512_attend_tiled)
{
	check_attend_tiled(WF_KERNEL_LEVEL_AVX512);
}

/* The host backend's attention on a batch of >= 64 rows (the tiled path) from three sequences,
 * each row at its own first cache row and count, grouped query heads: equal to the reference's
 * wf_cpu_attend_tiled row by row and head by head, at the level the process chose. */
static void check_backend_batches(const char *level)
{
	enum { NS = 3, H = 8, HKV = 2, D = 64, CTX = 512 };
	const uint32_t seq_len[NS] = {40, 9, 31}, seq_past[NS] = {0, 100, 37};
	const uint32_t seq_row[NS] = {0, 150, 300};
	uint32_t n = 0, kv_first[80], n_kv[80];
	struct wf_backend_limits lim = {.n_threads = 2,
	                                .max_rows = 128,
	                                .max_expert = 8,
	                                .max_stack = 1,
	                                .max_ne0 = 256,
	                                .max_ne1 = 256,
	                                .max_kv = CTX,
	                                .head_dim = D};
	struct wf_backend_ctx *ctx = NULL;
	struct wf_diag diag = {0};
	const struct wf_backend_ops *host = wf_backend_host();

	cr_assert_eq(setenv("WF_KERNELS", level, 1), 0);
	if (!wf_kernels_cpu_ops())
		cr_skip_test("this CPU has no %s kernels", level);
	for (int s = 0; s < NS; s++)
		for (uint32_t i = 0; i < seq_len[s]; i++, n++) {
			kv_first[n] = seq_row[s];
			n_kv[n] = seq_past[s] + i + 1;
		}
	cr_assert_geq(n, WF_CPU_FA_TILE);
	const size_t row = (size_t)HKV * D;
	uint16_t *kc = malloc(CTX * row * 2), *vc = malloc(CTX * row * 2);
	float *q = malloc((size_t)n * H * D * sizeof(float));
	float *got = malloc((size_t)n * H * D * sizeof(float)), want[D], scratch[D];

	cr_assert(kc && vc && q && got);
	kgen_seed(0xba7c);
	for (size_t i = 0; i < CTX * row; i++) {
		kc[i] = kgen_h(kgen_uniform(-2.0f, 2.0f));
		vc[i] = kgen_h(kgen_uniform(-2.0f, 2.0f));
	}
	for (size_t i = 0; i < (size_t)n * H * D; i++)
		q[i] = kgen_uniform(-1.0f, 1.0f);
	cr_assert_eq(host->ctx_create(NULL, NULL, &lim, &ctx, &diag), 0, "%s", diag.msg);
	cr_assert_eq(host->attention(ctx, q, (size_t)H * D, n, H, HKV, D, kc, vc, WF_BACKEND_KV_F16,
	                             kv_first, n_kv, 0.125f, got, &diag),
	             0, "%s", diag.msg);
	for (uint32_t t = 0; t < n; t++)
		for (uint32_t h = 0; h < H; h++) {
			const size_t off =
			    ((size_t)kv_first[t] * row + (size_t)(h / (H / HKV)) * D) * 2;
			char what[64];

			wf_cpu_attend_tiled(q + ((size_t)t * H + h) * D, (const uint8_t *)kc + off,
			                    (const uint8_t *)vc + off, row * 2, n_kv[t], D, 0.125f,
			                    scratch, want);
			snprintf(what, sizeof(what), "%s row %u head %u", level, t, h);
			assert_same(want, got + ((size_t)t * H + h) * D, D, what);
		}
	host->ctx_destroy(ctx);
	free(kc);
	free(vc);
	free(q);
	free(got);
}

Test(kernels_simd, ref_backend_attention_batches)
{
	check_backend_batches("ref");
}
Test(kernels_simd, avx2_backend_attention_batches)
{
	check_backend_batches("avx2");
}
Test(kernels_simd, avx512_backend_attention_batches)
{
	check_backend_batches("avx512");
}

/* ---- the level choice ---------------------------------------------------------------------- */

Test(kernels_simd, default_level_is_the_best_the_cpu_has)
{
	enum wf_kernel_level best = WF_KERNEL_LEVEL_REF, got;

	unsetenv("WF_KERNELS");
	for (int l = 0; l < WF_KERNEL_LEVEL_MAX_; l++)
		if (wf_kernels_cpu_ops_level((enum wf_kernel_level)l))
			best = (enum wf_kernel_level)l;
	cr_assert_eq(wf_kernels_cpu_level(&got), 0);
	cr_assert_eq(got, best, "chose %s, best is %s", wf_kernel_level_name(got),
	             wf_kernel_level_name(best));
	cr_assert_eq(wf_kernels_cpu_ops(), wf_kernels_cpu_ops_level(best));
	cr_log_info("CPU kernel level: %s", wf_kernel_level_name(got));
	cr_assert_str_eq(wf_kernel_level_name(WF_KERNEL_LEVEL_REF), "ref");
	cr_assert_str_eq(wf_kernel_level_name(WF_KERNEL_LEVEL_AVX2), "avx2");
	cr_assert_str_eq(wf_kernel_level_name(WF_KERNEL_LEVEL_AVX512), "avx512");
	cr_assert_null(wf_kernel_level_name(WF_KERNEL_LEVEL_MAX_));
	cr_assert_null(wf_kernels_cpu_ops_level(WF_KERNEL_LEVEL_MAX_));
	/* every level fills every type and quantizer the reference has */
	for (int l = 0; l < WF_KERNEL_LEVEL_MAX_; l++) {
		const struct wf_kernel_ops *o = wf_kernels_cpu_ops_level((enum wf_kernel_level)l);

		for (uint32_t t = 0; o && t < WF_DTYPE_GGML_COUNT_; t++) {
			const struct wf_kernel_type_ops *r = wf_kernel_ops_type(ref_ops(), t);
			const struct wf_kernel_type_ops *s = wf_kernel_ops_type(o, t);

			cr_assert_eq(!r, !s);
			cr_assert(!s || (s->gemm && s->dequantize_row &&
			                 s->vec_dot_type == r->vec_dot_type));
			cr_assert_eq(!ref_ops()->from_float[t], !o->from_float[t]);
		}
	}
}

/* In a process of its own (Criterion forks per test), so the choice is made here. */
static void check_forced(const char *name)
{
	enum wf_kernel_level l = WF_KERNEL_LEVEL_MAX_, got;

	for (int k = 0; k < WF_KERNEL_LEVEL_MAX_; k++)
		if (strcmp(wf_kernel_level_name((enum wf_kernel_level)k), name) == 0)
			l = (enum wf_kernel_level)k;
	cr_assert_eq(setenv("WF_KERNELS", name, 1), 0);
	if (l == WF_KERNEL_LEVEL_MAX_) {
		cr_assert_eq(wf_kernels_cpu_level(&got), WF_EINVAL);
		cr_assert_null(wf_kernels_cpu_ops());
	} else if (!wf_kernels_cpu_ops_level(l)) {
		cr_assert_eq(wf_kernels_cpu_level(&got), WF_EUNSUPPORTED);
		cr_assert_null(wf_kernels_cpu_ops());
		cr_skip_test("this CPU has no %s kernels: refused as it should be", name);
	} else {
		cr_assert_eq(wf_kernels_cpu_level(&got), 0);
		cr_assert_eq(got, l);
		cr_assert_eq(wf_kernels_cpu_ops(), wf_kernels_cpu_ops_level(l));
	}
}

Test(kernels_simd, forced_ref)
{
	check_forced("ref");
}
Test(kernels_simd, forced_avx2)
{
	check_forced("avx2");
}
Test(kernels_simd, forced_avx512)
{
	check_forced("avx512");
}
Test(kernels_simd, forced_unknown_name_refused)
{
	check_forced("sse9");
}
