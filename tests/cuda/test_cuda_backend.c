/* Every op of the CUDA backend against the host backend (the reference: kernels/backend_host.c,
 * the CPU numerics llama.cpp computes), as ggml's tests/test-backend-ops.cpp checks a backend:
 * one table of cases, each run on both backends from the same inputs (host memory for the host
 * backend, device copies for CUDA), outputs compared by NMSE and max-abs with the tolerance the
 * case states, integer outputs and bytes exactly, and every output element the reference leaves
 * untouched (the sentinel it was given) left untouched on the GPU too.
 *
 * Tolerances, and why (the host twins in test_cuda_matvec_host.c and test_cuda_ops_host.c
 * measure the same arithmetic on the CPU):
 *   mat-vec path (matmul n <= 32, mul_mat_id n * k <= 64 and small groups): the CPU's
 *     activation conversion bit for bit, integer block sums, float scales; only the order of
 *     float additions (and the device's fused multiply-adds) differs: NMSE 1e-10, max-abs 1e-4
 *     of the outputs' rms.
 *   prompt path, plain weights (F32 pedantic, BF16 and F16 with the CPU's input rounding): float
 *     accumulation of exact products: NMSE 1e-10, max 1e-4.
 *   prompt path, quantized weights: F16 weights and activations where the CPU takes int8
 *     activations: NMSE 1e-4, max 0.06 of the rms (the twin measures 1.35e-5..1.65e-5, 0.014).
 *   attention, F16 cache: windows under 256 positions are the CPU's steps (the twin is bit for
 *     bit; the device's expf may move an F16 rounding by an ulp): NMSE 1e-6, max-abs 4e-3.
 *     Longer windows are split (attention.h) and differ from the CPU by the CPU's own F16 error,
 *     which grows with the window: NMSE 6e-8 per position, max-abs 1e-2 (the twin measures
 *     <= 2.4e-8 per position and 4.4e-3). F32 cache: NMSE 1e-10, max-abs 1e-5 at any window
 *     (this is what checks the split's ranges and merge to the position).
 *   route: ids exact, weights 1e-6; rms_norm, rope, swiglu: NMSE 1e-12 (last-ulp functions);
 *   get_rows, copy_rows, add, moe_sum, kv_store: exact.
 * Run through gpu_main.c: skipped (77) without a GPU. */
#include "cuda/attention.h"
#include "tests/cuda/gpuenv.h"
#include "tests/cuda/mmref.h"
#include "tests/cuda/ops_ref.h"
#include "tests/kernels/kgen.h"

#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SENTINEL 1234.5f
#define MAXB     12

enum tb_kind { TB_IN, TB_OUT, TB_OUT_EXACT };

/* One case: its buffers (host copies of the inputs, and outputs pre-filled with the sentinel),
 * the op's call on either side, the tolerance. */
struct tb {
	char name[200];
	void *h[MAXB];
	size_t size[MAXB];
	enum tb_kind kind[MAXB];
	unsigned nb;
	double nmse_tol, max_tol;
	bool max_rel; /* max-abs over the reference's rms (true) or absolute */
};

typedef int (*tb_run_fn)(const struct wf_backend_ops *ops, struct wf_backend_ctx *c, void *const *p,
                         const void *arg, struct wf_diag *diag);

static unsigned tb_add(struct tb *t, void *h, size_t size, enum tb_kind kind)
{
	cr_assert(t->nb < MAXB);
	t->h[t->nb] = h;
	t->size[t->nb] = size;
	t->kind[t->nb] = kind;
	return t->nb++;
}

/* A float output of count floats, filled with the sentinel. */
static unsigned tb_out(struct tb *t, size_t count)
{
	float *y = malloc(count * sizeof(float));
	for (size_t i = 0; i < count; i++)
		y[i] = SENTINEL;
	return tb_add(t, y, count * sizeof(float), TB_OUT);
}

static unsigned tb_in(struct tb *t, const void *src, size_t size)
{
	void *h = malloc(size ? size : 1);
	memcpy(h, src, size);
	return tb_add(t, h, size, TB_IN);
}

/* The two backends of the run. */
static struct wft_gpu G;
static struct wf_backend_ctx *H;

static const struct wf_backend_limits LIM = {
    .n_threads = 8,
    .max_rows = 4096,
    .max_expert = 4096,
    .max_stack = 128,
    .max_ne0 = 8192,
    .max_ne1 = 151936,
    .max_kv = 4200,
    .head_dim = 256,
};

static void setup(void)
{
	kgen_seed(1234);
	wft_gpu_open(&G);
	wft_gpu_ctx(&G, LIM);
	H = opsr_host_ctx(LIM);
}

static void teardown(void)
{
	wf_backend_host()->ctx_destroy(H);
	wft_gpu_close(&G);
}

TestSuite(cuda_backend, .init = setup, .fini = teardown, .timeout = 600);

static void compare_floats(const struct tb *t, unsigned i, const float *got, const float *want)
{
	const size_t n = t->size[i] / sizeof(float);
	double num = 0, den = 0, mx = 0;
	size_t cnt = 0;
	for (size_t e = 0; e < n; e++) {
		if (memcmp(&want[e], &(float){SENTINEL}, sizeof(float)) == 0) {
			cr_assert(memcmp(&got[e], &want[e], sizeof(float)) == 0,
			          "%s: element %zu written on the GPU (%g), not by the reference",
			          t->name, e, (double)got[e]);
			continue;
		}
		if (isnan(want[e]) && isnan(got[e]))
			continue;
		const double d = (double)got[e] - (double)want[e];
		num += isnan(d) ? INFINITY : d * d;
		den += (double)want[e] * (double)want[e];
		mx = isnan(d) ? INFINITY : fabs(d) > mx ? fabs(d) : mx;
		cnt++;
	}
	const double nmse = den > 0 ? num / den : num;
	const double rms = cnt ? sqrt(den / (double)cnt) : 0;
	const double m = t->max_rel && rms > 0 ? mx / rms : mx;
	cr_log_info("%-60s NMSE %9.3g  max%s %9.3g", t->name, nmse, t->max_rel ? "/rms" : "-abs",
	            m);
	cr_assert(nmse <= t->nmse_tol && m <= t->max_tol, "%s: NMSE %g (<= %g), max %g (<= %g)",
	          t->name, nmse, t->nmse_tol, m, t->max_tol);
}

/* Runs the case on both backends and compares; frees its buffers. */
static void tb_check(struct tb *t, tb_run_fn run, const void *arg)
{
	void *hp[MAXB], *dp[MAXB];
	for (unsigned i = 0; i < t->nb; i++) {
		hp[i] = malloc(t->size[i] ? t->size[i] : 1);
		memcpy(hp[i], t->h[i], t->size[i]);
		dp[i] = wft_gpu_up(&G, t->h[i], t->size[i]);
	}
	{
		struct wf_diag diag = {{0}};
		int rc = run(wf_backend_host(), H, hp, arg, &diag);
		cr_assert_eq(rc, 0, "%s (host): %s", t->name, wf_diag_str(&diag, rc));
	}
	{
		struct wf_diag diag = {{0}};
		int rc = run(G.ops, G.c, dp, arg, &diag);
		cr_assert_eq(rc, 0, "%s (cuda): %s", t->name, wf_diag_str(&diag, rc));
	}
	for (unsigned i = 0; i < t->nb; i++) {
		if (t->kind[i] != TB_IN) {
			void *got = malloc(t->size[i] ? t->size[i] : 1);
			wft_gpu_down(&G, got, dp[i], t->size[i]);
			if (t->kind[i] == TB_OUT_EXACT)
				cr_assert(memcmp(got, hp[i], t->size[i]) == 0,
				          "%s: output %u differs", t->name, i);
			else
				compare_floats(t, i, got, hp[i]);
			free(got);
		}
		wft_gpu_free(&G, dp[i]);
		free(hp[i]);
		free(t->h[i]);
	}
	t->nb = 0;
}

/* ---- matmul and mul_mat_id ----------------------------------------------------------------------
 */

/* Tolerances by path and weight type (see the top). */
static void mm_tol(struct tb *t, enum wf_dtype type, bool gemm)
{
	t->max_rel = true;
	if (gemm && mmref_block(type) > 1) {
		t->nmse_tol = 1e-4;
		t->max_tol = 0.06;
	} else {
		t->nmse_tol = 1e-10;
		t->max_tol = 1e-4;
	}
}

struct mm_arg {
	unsigned n_products;
	unsigned w[3], y[3], x, ids;
	enum wf_dtype type[3];
	int64_t ne0, ne1[3];
	size_t row[3], stride[3], ys[3], xs;
	uint32_t n, k;
	bool per_slot;
};

static int run_matmul(const struct wf_backend_ops *ops, struct wf_backend_ctx *c, void *const *p,
                      const void *arg, struct wf_diag *diag)
{
	const struct mm_arg *a = arg;
	struct wf_backend_matrix m[3];
	struct wf_backend_product pr[3];
	for (unsigned i = 0; i < a->n_products; i++) {
		m[i] = (struct wf_backend_matrix){p[a->w[i]], a->type[i], a->ne0,
		                                  a->ne1[i],  a->row[i],  a->stride[i]};
		pr[i] = (struct wf_backend_product){&m[i], p[a->y[i]], a->ys[i]};
	}
	if (a->k)
		return ops->mul_mat_id(c, a->n_products, pr, p[a->ids], a->n, a->k, p[a->x], a->xs,
		                       a->per_slot, diag);
	return ops->matmul(c, a->n_products, pr, p[a->x], a->xs, a->n, diag);
}

/* A matrix (or a stack of n_mat, gap bytes apart beyond their size) of random valid blocks. */
static unsigned add_matrix(struct tb *t, enum wf_dtype type, int64_t ne0, int64_t ne1,
                           uint32_t n_mat, size_t gap, size_t *ret_row, size_t *ret_stride)
{
	const size_t row = kgen_row_bytes(type, ne0), stride = row * (size_t)ne1 + gap;
	unsigned char *w = calloc(1, stride * n_mat);
	cr_assert_not_null(w);
	for (uint32_t e = 0; e < n_mat; e++)
		for (int64_t r = 0; r < ne1; r++)
			kgen_weights(type, w + e * stride + (size_t)r * row, ne0);
	*ret_row = row;
	*ret_stride = n_mat > 1 ? stride : 0;
	return tb_add(t, w, stride * n_mat, TB_IN);
}

/* Activations of a real model's spread (uniform in [-3, 3]); big: a few entries past F16's
 * range (the prompt path's overflow guard). */
static unsigned add_acts(struct tb *t, uint32_t rows, size_t xs, int64_t ne0, bool big)
{
	float *x = malloc((size_t)rows * xs * sizeof(float) + 4);
	for (size_t i = 0; i < (size_t)rows * xs; i++)
		x[i] = kgen_uniform(-3.0f, 3.0f);
	if (big)
		for (uint32_t j = 0; j < rows; j += 3)
			x[(size_t)j * xs + (size_t)(j * 7) % (size_t)ne0] = 1e5f;
	return tb_add(t, x, (size_t)rows * xs * sizeof(float), TB_IN);
}

/* matmul of n_products matrices (types[i], ne1s[i]) sharing n rows of ne0. */
static void matmul_case(const enum wf_dtype *types, const int64_t *ne1s, unsigned n_products,
                        int64_t ne0, uint32_t n, bool misalign, bool big)
{
	if (big && types[0] == WF_DTYPE_F16) /* the CPU's F16 rounding overflows to inf there */
		return;
	struct tb t = {.nb = 0};
	struct mm_arg a = {.n_products = n_products, .ne0 = ne0, .n = n};
	a.xs = (size_t)ne0 + (misalign ? 3 : 8);
	a.x = add_acts(&t, n, a.xs, ne0, big);
	bool quant_gemm = false;
	for (unsigned i = 0; i < n_products; i++) {
		a.type[i] = types[i];
		a.ne1[i] = ne1s[i];
		a.w[i] = add_matrix(&t, types[i], ne0, ne1s[i], 1, 0, &a.row[i], &a.stride[i]);
		a.ys[i] = (size_t)ne1s[i] + 5;
		a.y[i] = tb_out(&t, (size_t)n * a.ys[i]);
		quant_gemm |= mmref_block(types[i]) > 1;
	}
	snprintf(t.name, sizeof t.name, "matmul %s%s%s %lldx%lld n %u%s%s", mmref_name(types[0]),
	         n_products > 1 ? "+" : "", n_products > 1 ? mmref_name(types[1]) : "",
	         (long long)ne1s[0], (long long)ne0, n, misalign ? " misaligned x" : "",
	         big ? " x past F16" : "");
	mm_tol(&t, types[0], n > 32 && quant_gemm);
	tb_check(&t, run_matmul, &a);
}

Test(cuda_backend, matmul_every_type_and_batch)
{
	static const uint32_t ns[] = {1, 3, 8, 9, 17, 32, 33, 130};
	for (int ti = 0; ti < MMREF_N_TYPES; ti++) {
		const enum wf_dtype ty = mmref_types[ti];
		for (size_t k = 0; k < sizeof(ns) / sizeof(ns[0]); k++) {
			matmul_case(&ty, (int64_t[]){37}, 1, 768, ns[k], false, false);
			if (mmref_block(ty) == 1) /* the element path: no 16-byte rows */
				matmul_case(&ty, (int64_t[]){13}, 1, 1001, ns[k], true, false);
			else if (mmref_block(ty) == 32)
				matmul_case(&ty, (int64_t[]){13}, 1, 32 * 23, ns[k], false, false);
		}
		/* activations past F16's range: the overflow guard on both paths */
		matmul_case(&ty, (int64_t[]){29}, 1, 512, 4, false, true);
		matmul_case(&ty, (int64_t[]){29}, 1, 512, 40, false, true);
	}
}

/* Q, K and V in one call (shared input, converted once per activation type): types mixed as in
 * Q4_K_M (Q4_K, Q4_K, Q6_K) and across activation types (Q8_0, Q4_K, F32). */
Test(cuda_backend, matmul_three_products)
{
	static const enum wf_dtype m1[] = {WF_DTYPE_Q4_K, WF_DTYPE_Q4_K, WF_DTYPE_Q6_K};
	static const enum wf_dtype m2[] = {WF_DTYPE_Q8_0, WF_DTYPE_Q4_K, WF_DTYPE_F32};
	static const int64_t ne1[] = {256, 64, 64};
	for (uint32_t n = 1; n <= 40; n += 39) {
		matmul_case(m1, ne1, 3, 1024, n, false, false);
		matmul_case(m2, ne1, 3, 1024, n, false, false);
	}
}

/* The vocab-sized output head (151936 x 2048: Qwen3-30B-A3B) at decode and through the prompt
 * path's F16 slabs (8192 rows each, 19 slabs). */
Test(cuda_backend, matmul_output_head)
{
	static const enum wf_dtype types[] = {WF_DTYPE_Q6_K, WF_DTYPE_Q8_0};
	for (size_t i = 0; i < 2; i++) {
		matmul_case(&types[i], (int64_t[]){151936}, 1, 2048, 1, false, false);
		matmul_case(&types[i], (int64_t[]){151936}, 1, 2048, 40, false, false);
	}
}

/* mul_mat_id: n tokens x k choices over a stack of n_mat matrices (gap: slots of a cache), ids
 * with a fraction of -1 (the expert runs elsewhere: rows untouched) and, for prompts, a skew so
 * that some experts get groups past the GEMM threshold and others stay small. */
static void mmid_case(enum wf_dtype type, int64_t ne0, int64_t ne1, uint32_t n_mat, size_t gap,
                      uint32_t n, uint32_t k, bool per_slot, unsigned n_products, int neg_pct)
{
	struct tb t = {.nb = 0};
	struct mm_arg a = {.n_products = n_products, .ne0 = ne0, .n = n, .k = k};
	const uint32_t rows = n * k, xrows = per_slot ? rows : n;
	a.per_slot = per_slot;
	a.xs = (size_t)ne0 + 4;
	a.x = add_acts(&t, xrows, a.xs, ne0, false);
	int32_t *ids = malloc(rows * sizeof(int32_t));
	for (uint32_t q = 0; q < n; q++) {
		for (uint32_t j = 0; j < k; j++) {
			uint32_t e;
			bool dup;
			do { /* distinct per token; half the tokens prefer the first 8 experts */
				e = (uint32_t)(kgen_u64() % ((q % 2 && n_mat > 8) ? 8 : n_mat));
				dup = false;
				for (uint32_t jj = 0; jj < j; jj++)
					dup |= ids[q * k + jj] == (int32_t)e;
			} while (dup && k <= n_mat);
			ids[q * k + j] = (int)(kgen_u64() % 100) < neg_pct ? -1 : (int32_t)e;
		}
	}
	a.ids = tb_in(&t, ids, rows * sizeof(int32_t));
	free(ids);
	for (unsigned i = 0; i < n_products; i++) {
		a.type[i] = type;
		a.ne1[i] = ne1;
		a.w[i] = add_matrix(&t, type, ne0, ne1, n_mat, gap, &a.row[i], &a.stride[i]);
		if (n_mat == 1)
			a.stride[i] = a.row[i] * (size_t)ne1;
		a.ys[i] = (size_t)ne1 + 2;
		a.y[i] = tb_out(&t, (size_t)rows * a.ys[i]);
	}
	snprintf(t.name, sizeof t.name, "mul_mat_id %s %lldx%lld x%u%s n %u k %u%s%s",
	         mmref_name(type), (long long)ne1, (long long)ne0, n_mat, gap ? " slots" : "", n, k,
	         per_slot ? " per-slot" : "", n_products > 1 ? " gate+up" : "");
	mm_tol(&t, type, rows > 64);
	tb_check(&t, run_matmul, &a);
}

Test(cuda_backend, mul_mat_id_every_type)
{
	for (int ti = 0; ti < MMREF_N_TYPES; ti++) {
		const enum wf_dtype ty = mmref_types[ti];
		/* decode: gate+up (x per token), down (per choice), slots 64 KiB apart, 8 seqs */
		mmid_case(ty, 512, 96, 16, 0, 1, 8, false, 2, 20);
		mmid_case(ty, 256, 128, 16, 0, 2, 4, true, 1, 20);
		mmid_case(ty, 512, 96, 6, 65536, 3, 2, false, 1, 0);
		mmid_case(ty, 512, 96, 6, 65536, 3, 2, true, 1, 30);
		mmid_case(ty, 256, 64, 32, 0, 8, 8, true, 1, 10);
		/* prompts: groups above and below the GEMM threshold, ids < 0, both x layouts */
		mmid_case(ty, 512, 96, 16, 0, 40, 8, false, 2, 10);
		mmid_case(ty, 256, 128, 16, 0, 40, 4, true, 1, 10);
		mmid_case(ty, 512, 96, 6, 65536, 100, 2, true, 1, 5);
	}
}

/* Qwen3-30B-A3B's experts: 128 per layer, top 8; gate/up 2048 -> 768 (Q4_K), down 768 -> 2048
 * (Q6_K, as Q4_K_M makes some), at n = 1, 8, 32 (decode batches) and 512 (a prompt: 4096 rows). */
Test(cuda_backend, mul_mat_id_qwen3_shapes)
{
	static const uint32_t ns[] = {1, 8, 32, 512};
	for (size_t i = 0; i < sizeof(ns) / sizeof(ns[0]); i++) {
		mmid_case(WF_DTYPE_Q4_K, 2048, 768, 128, 0, ns[i], 8, false, 2, 0);
		mmid_case(WF_DTYPE_Q6_K, 768, 2048, 128, 0, ns[i], 8, true, 1, 0);
	}
}

/* ---- get_rows, copy_rows, element-wise
 * ----------------------------------------------------------- */

struct rows_arg {
	unsigned w, ids, y, src, dst, si, di;
	enum wf_dtype type;
	int64_t ne0, ne1;
	size_t row, ss, ds;
	uint32_t n, len;
	bool with_si, with_di;
};

static int run_get_rows(const struct wf_backend_ops *ops, struct wf_backend_ctx *c, void *const *p,
                        const void *arg, struct wf_diag *diag)
{
	const struct rows_arg *a = arg;
	struct wf_backend_matrix m = {p[a->w], a->type, a->ne0, a->ne1, a->row, 0};
	return ops->get_rows(c, &m, p[a->ids], a->n, p[a->y], diag);
}

Test(cuda_backend, get_rows_exact)
{
	static const int32_t ids[] = {0, 4, 4, 10, 1, 10, 7, 0};
	for (int ti = 0; ti < MMREF_N_TYPES; ti++) {
		struct tb t = {.nb = 0};
		struct rows_arg a = {.type = mmref_types[ti], .ne1 = 11, .n = 8};
		a.ne0 = mmref_block(a.type) == 1 ? 1001 : 512;
		size_t stride;
		a.w = add_matrix(&t, a.type, a.ne0, a.ne1, 1, 0, &a.row, &stride);
		a.ids = tb_in(&t, ids, sizeof(ids));
		a.y = tb_add(&t, calloc((size_t)a.ne0 * a.n, sizeof(float)),
		             (size_t)a.ne0 * a.n * sizeof(float), TB_OUT_EXACT);
		snprintf(t.name, sizeof t.name, "get_rows %s", mmref_name(a.type));
		tb_check(&t, run_get_rows, &a);
	}
}

static int run_copy_rows(const struct wf_backend_ops *ops, struct wf_backend_ctx *c, void *const *p,
                         const void *arg, struct wf_diag *diag)
{
	const struct rows_arg *a = arg;
	return ops->copy_rows(c, p[a->src], a->ss, a->with_si ? p[a->si] : NULL, a->n, a->len,
	                      p[a->dst], a->ds, a->with_di ? p[a->di] : NULL, diag);
}

/* Gather (source indices), scatter (destination indices), both, neither; strides wider than the
 * rows, whose gaps stay untouched. */
Test(cuda_backend, copy_rows_exact)
{
	struct opsr_rng r = {8};
	for (int v = 0; v < 4; v++) {
		struct tb t = {.nb = 0};
		struct rows_arg a = {.n = 37, .len = 1000, .ss = 1003, .ds = 1010};
		a.with_si = v & 1;
		a.with_di = v & 2;
		const uint32_t src_rows = 64, dst_rows = 48;
		float *src = malloc(src_rows * a.ss * sizeof(float));
		opsr_fill(&r, src, src_rows * a.ss, 5.0f);
		a.src = tb_in(&t, src, src_rows * a.ss * sizeof(float));
		free(src);
		uint32_t si[37], di[37];
		for (uint32_t i = 0; i < a.n; i++) {
			si[i] = opsr_u32(&r) % src_rows;
			di[i] = (i * 13) % dst_rows; /* distinct (13 and 48 coprime, 37 < 48) */
		}
		a.si = tb_in(&t, si, sizeof(si));
		a.di = tb_in(&t, di, sizeof(di));
		float *dst = malloc(dst_rows * a.ds * sizeof(float));
		for (size_t i = 0; i < dst_rows * a.ds; i++)
			dst[i] = SENTINEL;
		a.dst = tb_add(&t, dst, dst_rows * a.ds * sizeof(float), TB_OUT_EXACT);
		snprintf(t.name, sizeof t.name, "copy_rows src_idx %d dst_idx %d", a.with_si,
		         a.with_di);
		tb_check(&t, run_copy_rows, &a);
	}
}

struct ew_arg {
	int op; /* 0 swiglu, 1 swiglu in place, 2 add, 3 moe_sum, 4 rms_norm, 5 rope */
	unsigned a, b, c, d;
	size_t count, stride;
	uint32_t n, k, len, heads, head_dim, n_dims;
	bool weights;
	enum wf_backend_rope kind;
	float base;
};

static int run_ew(const struct wf_backend_ops *ops, struct wf_backend_ctx *c, void *const *p,
                  const void *arg, struct wf_diag *diag)
{
	const struct ew_arg *a = arg;
	switch (a->op) {
	case 0:
		return ops->swiglu(c, p[a->a], p[a->b], p[a->c], a->count, diag);
	case 1:
		return ops->swiglu(c, p[a->c], p[a->b], p[a->c], a->count, diag);
	case 2:
		return ops->add(c, p[a->c], p[a->a], a->count, diag);
	case 3:
		return ops->moe_sum(c, p[a->a], p[a->b], a->n, a->k, a->len, p[a->c], diag);
	case 4:
		return ops->rms_norm(c, p[a->a], a->weights ? p[a->b] : NULL, p[a->c], a->n, a->len,
		                     a->stride, 1e-6f, diag);
	default:
		return ops->rope(c, p[a->c], a->stride, a->n, a->heads, a->head_dim, a->n_dims,
		                 p[a->d], a->base, a->kind, diag);
	}
}

Test(cuda_backend, elementwise)
{
	struct opsr_rng r = {4};
	const uint32_t n = 37, k = 8, len = 1000;
	const size_t cnt = (size_t)n * k * len;
	float *x = malloc(cnt * sizeof(float)), *u = malloc(cnt * sizeof(float));
	float *wts = malloc(n * k * sizeof(float));
	opsr_fill(&r, x, cnt, 8.0f);
	opsr_fill(&r, u, cnt, 2.0f);
	opsr_fill(&r, wts, n * k, 1.0f);
	for (int op = 0; op < 4; op++) {
		struct tb t = {.nb = 0};
		struct ew_arg a = {.op = op, .count = cnt, .n = n, .k = k, .len = len};
		a.a = tb_in(&t, x, cnt * sizeof(float));
		a.b = tb_in(&t, op == 3 ? wts : u, (op == 3 ? n * k : cnt) * sizeof(float));
		if (op == 1 || op == 2) /* in place: y = g (swiglu), y = y + x (add) */
			a.c = tb_add(&t,
			             memcpy(malloc(cnt * sizeof(float)), op == 1 ? x : u,
			                    cnt * sizeof(float)),
			             cnt * sizeof(float), op == 2 ? TB_OUT_EXACT : TB_OUT);
		else
			a.c = op == 3 ? tb_add(&t, calloc((size_t)n * len, sizeof(float)),
			                       (size_t)n * len * sizeof(float), TB_OUT_EXACT)
			              : tb_out(&t, cnt);
		static const char *names[] = {"swiglu", "swiglu in place", "add", "moe_sum"};
		snprintf(t.name, sizeof t.name, "%s", names[op]);
		t.nmse_tol = 1e-12; /* expf's last ulp */
		t.max_tol = 1e-5;
		t.max_rel = true;
		tb_check(&t, run_ew, &a);
	}
	free(x), free(u), free(wts);
}

/* rms_norm: rows of 1..7168, a stride wider than the row (gaps untouched), with and without
 * weights, in place. The CPU's double sum in another order: NMSE <= 1e-12, max 1e-5 (|y| < 10). */
Test(cuda_backend, rms_norm)
{
	static const uint32_t lens[] = {1, 64, 100, 2048, 4096, 7168};
	struct opsr_rng r = {1};
	for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++)
		for (int variant = 0; variant < 3; variant++) {
			struct tb t = {.nb = 0};
			struct ew_arg a = {.op = 4, .n = 5, .len = lens[li]};
			a.stride = lens[li] + 17;
			a.weights = variant != 1;
			float *x = malloc(a.n * a.stride * sizeof(float)),
			      *w = malloc(lens[li] * sizeof(float));
			opsr_fill(&r, x, a.n * a.stride, 4.0f);
			opsr_fill(&r, w, lens[li], 2.0f);
			a.b = tb_in(&t, w, lens[li] * sizeof(float));
			if (variant == 2) {
				a.c = tb_add(&t, x, a.n * a.stride * sizeof(float), TB_OUT);
				a.a = a.c;
			} else {
				a.a = tb_in(&t, x, a.n * a.stride * sizeof(float));
				a.c = tb_out(&t, a.n * a.stride);
				free(x);
			}
			free(w);
			snprintf(t.name, sizeof t.name, "rms_norm len %u variant %d", lens[li],
			         variant);
			t.nmse_tol = 1e-12;
			t.max_tol = 1e-5;
			tb_check(&t, run_ew, &a);
		}
}

/* rope: NORM and NEOX, n_dims = head_dim and below (the rest untouched, exactly: in place, the
 * unrotated elements are the inputs), positions to 4095, two bases. sincosf's last ulp: NMSE
 * <= 1e-12, max-abs <= 1e-5 (|x| < 3). */
Test(cuda_backend, rope)
{
	static const int32_t pos[] = {0, 1, 17, 255, 1000, 2047, 3999, 4000, 4095};
	static const uint32_t dims[] = {128, 64, 32};
	struct opsr_rng r = {2};
	for (int kind = 0; kind <= 2; kind += 2)
		for (size_t d = 0; d < 3; d++)
			for (int b = 0; b < 2; b++) {
				struct tb t = {.nb = 0};
				struct ew_arg a = {.op = 5, .n = 9, .heads = 6, .head_dim = 128};
				a.stride = 6 * 128 + 64;
				a.n_dims = dims[d];
				a.kind = (enum wf_backend_rope)kind;
				a.base = b ? 1000000.0f : 10000.0f;
				float *x = malloc(a.n * a.stride * sizeof(float));
				opsr_fill(&r, x, a.n * a.stride, 3.0f);
				a.c = tb_add(&t, x, a.n * a.stride * sizeof(float), TB_OUT);
				a.d = tb_in(&t, pos, sizeof(pos));
				snprintf(t.name, sizeof t.name, "rope kind %d n_dims %u base %g",
				         kind, dims[d], (double)a.base);
				t.nmse_tol = 1e-12;
				t.max_tol = 1e-5;
				tb_check(&t, run_ew, &a);
			}
}

/* ---- route
 * ---------------------------------------------------------------------------------------- */

struct route_arg {
	unsigned logits, ids, w;
	uint32_t n, n_expert, k;
};

static int run_route(const struct wf_backend_ops *ops, struct wf_backend_ctx *c, void *const *p,
                     const void *arg, struct wf_diag *diag)
{
	const struct route_arg *a = arg;
	return ops->route(c, p[a->logits], a->n, a->n_expert, a->k, p[a->ids], p[a->w], diag);
}

/* Each token's logits: kind 0, a random permutation of evenly spaced values (no two
 * probabilities closer than 0.3%: far beyond expf's ulps, so ids must be equal); 1, five values
 * (most rounds are ties: the lower id); 2, a NaN in every third token and a +inf in every fifth
 * (NaN probabilities: the lowest untaken ids, NaN weights). */
static void route_case(uint32_t n, uint32_t n_expert, uint32_t k, int kind)
{
	struct tb t = {.nb = 0};
	struct route_arg a = {.n = n, .n_expert = n_expert, .k = k};
	float *x = malloc((size_t)n * n_expert * sizeof(float));
	for (uint32_t q = 0; q < n; q++) {
		float *xr = x + (size_t)q * n_expert;
		for (uint32_t e = 0; e < n_expert; e++)
			xr[e] = kind == 1 ? (float)(kgen_u64() % 5) - 2.0f
			                  : -6.0f + 12.0f * (float)e / (float)n_expert;
		if (kind != 1)
			for (uint32_t e = n_expert - 1; e > 0; e--) {
				const uint32_t o = (uint32_t)(kgen_u64() % (e + 1));
				const float tmp = xr[e];
				xr[e] = xr[o];
				xr[o] = tmp;
			}
		if (kind == 2 && q % 3 == 0)
			xr[q % n_expert] = NAN;
		if (kind == 2 && q % 5 == 0)
			xr[(q * 7) % n_expert] = INFINITY;
	}
	a.logits = tb_in(&t, x, (size_t)n * n_expert * sizeof(float));
	free(x);
	a.ids = tb_add(&t, calloc((size_t)n * k, sizeof(int32_t)), (size_t)n * k * sizeof(int32_t),
	               TB_OUT_EXACT);
	a.w = tb_out(&t, (size_t)n * k);
	snprintf(t.name, sizeof t.name, "route %u tokens, top %u of %u, kind %d", n, k, n_expert,
	         kind);
	t.nmse_tol = 1e-12;
	t.max_tol = 1e-6;
	tb_check(&t, run_route, &a);
}

Test(cuda_backend, route)
{
	static const uint32_t ns[] = {1, 9, 512};
	for (size_t i = 0; i < 3; i++)
		for (int kind = 0; kind < 3; kind++)
			route_case(ns[i], 128, 8, kind);
	route_case(4, 8, 2, 0);
	route_case(4, 4096, 64, 0);
	route_case(64, 64, 64, 1);
}

/* ---- KV store and attention ---------------------------------------------------------------------
 */

struct att_arg {
	unsigned q, kc, vc, first, nkv, out, k, v, dst;
	uint32_t n, n_head, n_head_kv, head_dim, rows;
	enum wf_backend_kv type;
	float scale;
};

static int run_attention(const struct wf_backend_ops *ops, struct wf_backend_ctx *c, void *const *p,
                         const void *arg, struct wf_diag *diag)
{
	const struct att_arg *a = arg;
	const size_t qs = (size_t)a->n_head * a->head_dim;
	return ops->attention(c, p[a->q], qs, a->n, a->n_head, a->n_head_kv, a->head_dim, p[a->kc],
	                      p[a->vc], a->type, p[a->first], p[a->nkv], a->scale, p[a->out], diag);
}

static int run_kv_store(const struct wf_backend_ops *ops, struct wf_backend_ctx *c, void *const *p,
                        const void *arg, struct wf_diag *diag)
{
	const struct att_arg *a = arg;
	return ops->kv_store(c, p[a->k], p[a->v], a->rows, a->n_head_kv * a->head_dim, p[a->dst],
	                     p[a->kc], p[a->vc], a->type, diag);
}

/* n tokens' windows (n_kv[t] positions each: random first rows, or causal from 0) over a cache of
 * rows positions. */
static void attention_case(enum wf_backend_kv type, uint32_t n_head, uint32_t n_head_kv,
                           uint32_t head_dim, uint32_t n, const uint32_t *n_kv, bool causal,
                           float qamp, uint64_t seed)
{
	struct opsr_rng r = {seed};
	uint32_t most = 0;
	for (uint32_t i = 0; i < n; i++)
		most = n_kv[i] > most ? n_kv[i] : most;
	struct opsr_att o = {.n = n,
	                     .n_head = n_head,
	                     .n_head_kv = n_head_kv,
	                     .head_dim = head_dim,
	                     .rows = most + (causal ? 0 : 29),
	                     .type = type};
	opsr_att_make(&o, &r, n_kv, qamp, causal);
	struct tb t = {.nb = 0};
	struct att_arg a = {.n = n,
	                    .n_head = n_head,
	                    .n_head_kv = n_head_kv,
	                    .head_dim = head_dim,
	                    .type = type,
	                    .scale = o.scale};
	const size_t cache = o.rows * opsr_att_row(&o) * opsr_att_elem(&o);
	const size_t count = (size_t)n * n_head * head_dim;
	a.q = tb_in(&t, o.q, count * sizeof(float));
	a.kc = tb_in(&t, o.kc, cache);
	a.vc = tb_in(&t, o.vc, cache);
	a.first = tb_in(&t, o.kv_first, n * sizeof(uint32_t));
	a.nkv = tb_in(&t, o.n_kv, n * sizeof(uint32_t));
	a.out = tb_out(&t, count);
	snprintf(t.name, sizeof t.name, "attention %s heads %u/%u dim %u n %u window %u%s qamp %g",
	         type == WF_BACKEND_KV_F16 ? "F16" : "F32", n_head, n_head_kv, head_dim, n, most,
	         causal ? " causal" : "", (double)qamp);
	if (type == WF_BACKEND_KV_F32) {
		t.nmse_tol = 1e-10;
		t.max_tol = 1e-5;
	} else if (most < 2 * WF_CUDA_ATT_SPLIT_MIN) {
		t.nmse_tol = 1e-6;
		t.max_tol = 4e-3;
	} else { /* a batch's tolerance is its longest window's */
		t.nmse_tol = 6e-8 * most;
		t.max_tol = 1e-2;
	}
	tb_check(&t, run_attention, &a);
	opsr_att_free(&o);
}

static const uint32_t WINDOWS[] = {1, 2, 33, 700, 2000, 2047, 4096};

/* Each window length its own case (never pooled): Qwen3-30B-A3B's GQA 8:1 (32 heads over 4 of
 * 128) with a flat and a peaked softmax, head 256 (16 over 2), F16 and F32 caches. */
Test(cuda_backend, attention_per_window)
{
	for (size_t i = 0; i < sizeof(WINDOWS) / sizeof(WINDOWS[0]); i++)
		for (int f32 = 0; f32 < 2; f32++) {
			const enum wf_backend_kv ty = f32 ? WF_BACKEND_KV_F32 : WF_BACKEND_KV_F16;
			attention_case(ty, 32, 4, 128, 1, &WINDOWS[i], false, 1.0f, 10 + i);
			attention_case(ty, 32, 4, 128, 1, &WINDOWS[i], false, 8.0f, 20 + i);
			attention_case(ty, 16, 2, 256, 1, &WINDOWS[i], false, 1.0f, 30 + i);
		}
}

/* Decode batches (8 sequences of different lengths: some windows split, some not) and a batched
 * prompt with causal windows (token t sees 0..t), as the engine lays them out. */
Test(cuda_backend, attention_batches)
{
	static const uint32_t dec[] = {1, 300, 4096, 17, 2047, 700, 255, 3000};
	uint32_t causal[64];
	for (uint32_t t = 0; t < 64; t++)
		causal[t] = t + 1;
	for (int f32 = 0; f32 < 2; f32++) {
		const enum wf_backend_kv ty = f32 ? WF_BACKEND_KV_F32 : WF_BACKEND_KV_F16;
		attention_case(ty, 32, 4, 128, 8, dec, false, 2.0f, 40 + f32);
		attention_case(ty, 32, 4, 128, 64, causal, true, 2.0f, 50 + f32);
		attention_case(ty, 8, 8, 64, 64, causal, true, 2.0f, 60 + f32);
	}
}

/* kv_store writes the CPU's conversion of every row at its destination (bit for bit: both round to
 * nearest even), rows in reverse order of their destinations. */
Test(cuda_backend, kv_store_exact)
{
	struct opsr_rng r = {5};
	for (int f32 = 0; f32 < 2; f32++) {
		struct tb t = {.nb = 0};
		struct att_arg a = {.n_head_kv = 4, .head_dim = 128, .rows = 300};
		a.type = f32 ? WF_BACKEND_KV_F32 : WF_BACKEND_KV_F16;
		const size_t row = 4 * 128, elem = f32 ? 4 : 2;
		float *k = malloc(a.rows * row * sizeof(float)), *v = malloc(a.rows * row * 4);
		uint32_t *dst = malloc(a.rows * sizeof(uint32_t));
		opsr_fill(&r, k, a.rows * row, 1.0f);
		opsr_fill(&r, v, a.rows * row, 1.0f);
		for (uint32_t i = 0; i < a.rows; i++)
			dst[i] = a.rows + 10 - 1 - i;
		a.k = tb_in(&t, k, a.rows * row * sizeof(float));
		a.v = tb_in(&t, v, a.rows * row * sizeof(float));
		a.dst = tb_in(&t, dst, a.rows * sizeof(uint32_t));
		const size_t cache = (a.rows + 10) * row * elem;
		a.kc = tb_add(&t, calloc(1, cache), cache, TB_OUT_EXACT);
		a.vc = tb_add(&t, calloc(1, cache), cache, TB_OUT_EXACT);
		snprintf(t.name, sizeof t.name, "kv_store %s", f32 ? "F32" : "F16");
		tb_check(&t, run_kv_store, &a);
		free(k), free(v), free(dst);
	}
}

/* ---- limits and memory
 * ---------------------------------------------------------------------------- */

/* Refusals at the op: a type without kernels, more rows than the limits, a misaligned K-quant
 * matrix, a head the kernels do not take; and at create. */
Test(cuda_backend, refusals)
{
	struct wf_diag diag = {{0}};
	void *d = wft_gpu_alloc(&G, 1 << 20);
	struct wf_backend_matrix q8k = {d, WF_DTYPE_Q8_K, 256, 4, 292, 0};
	struct wf_backend_product p = {&q8k, d, 4};
	cr_assert_eq(G.ops->matmul(G.c, 1, &p, d, 256, 1, &diag), WF_EUNSUPPORTED);
	cr_assert_eq(G.ops->get_rows(G.c, &q8k, d, 1, d, &diag), WF_EUNSUPPORTED);
	cr_assert_not(G.ops->supports(WF_DTYPE_Q8_K));
	struct wf_backend_matrix f32 = {d, WF_DTYPE_F32, 256, 4, 1024, 0};
	p.w = &f32;
	cr_assert_eq(G.ops->matmul(G.c, 1, &p, d, 256, LIM.max_rows + 1, &diag), WF_EINVAL);
	struct wf_backend_matrix mis = {(char *)d + 2, WF_DTYPE_Q4_K, 256, 4, 144, 0};
	p.w = &mis;
	cr_assert_eq(G.ops->matmul(G.c, 1, &p, d, 256, 1, &diag), WF_EINVAL);
	cr_assert_eq(G.ops->attention(G.c, d, 4096, 1, 2, 1, 60, d, d, WF_BACKEND_KV_F16, d, d,
	                              1.0f, d, &diag),
	             WF_EINVAL);
	struct wf_backend_ctx *c2 = NULL;
	struct wf_backend_limits bad = LIM;
	bad.head_dim = 512;
	cr_assert_eq(G.ops->ctx_create(G.dev, G.s, &bad, &c2, &diag), WF_EUNSUPPORTED);
	cr_assert_eq(G.ops->ctx_create(NULL, G.s, &LIM, &c2, &diag), WF_EINVAL);
	wft_gpu_free(&G, d);
}

/* ctx_device_bytes is what the device lost to the context, and no op takes more later.
 *
 * A first context is made and destroyed before measuring: it loads what a process loads once
 * (cuBLAS's library, the backend's modules), which stays after destroy and is counted by that
 * first context only. Then: free memory before and after ctx_create differs from
 * ctx_device_bytes by at most 2 MiB (the driver's allocation granularity: both figures come from
 * cudaMemGetInfo, over almost the same window); every op on its paths that could allocate
 * (cuBLAS GEMMs of each kind at shapes other than the warm-up's, the prompt path of mul_mat_id,
 * split attention) leaves free memory within 4 MiB (a grown code pool for a kernel cuBLAS loads
 * lazily would show here: the figure is logged); destroy gives everything back (2 MiB). */
Test(cuda_memory, device_bytes_and_baseline, .timeout = 300)
{
	struct wft_gpu g;
	const struct wf_backend_limits lim = {.max_rows = 2048,
	                                      .max_expert = 128,
	                                      .max_stack = 32,
	                                      .max_ne0 = 2048,
	                                      .max_ne1 = 32768,
	                                      .max_kv = 4096,
	                                      .head_dim = 128};
	size_t f0, f1, f2, f3, total;
	const double MiB = 1 << 20;

	kgen_seed(77);
	wft_gpu_open(&g);
	wft_gpu_ctx(&g, lim);
	g.ops->ctx_destroy(g.c);
	g.c = NULL;
	OKD(wf_device_mem_info(g.dev, &f0, &total, &diag));
	wft_gpu_ctx(&g, lim);
	OKD(wf_device_mem_info(g.dev, &f1, &total, &diag));
	const uint64_t bytes = g.ops->ctx_device_bytes(g.c);
	const double taken = (double)f0 - (double)f1;
	cr_log_info("ctx_device_bytes %.1f MiB, cudaMemGetInfo saw %.1f MiB", bytes / MiB,
	            taken / MiB);
	cr_assert(fabs(taken - (double)bytes) <= 2 * MiB, "device_bytes %.1f MiB, taken %.1f MiB",
	          bytes / MiB, taken / MiB);

	/* Every GEMM kind at a shape the warm-up did not take, mul_mat_id's prompt path, split
	 * attention. */
	const size_t xs = 2048;
	float *x = malloc(600 * xs * sizeof(float));
	for (size_t i = 0; i < 600 * xs; i++)
		x[i] = kgen_uniform(-1.0f, 1.0f);
	float *dx = wft_gpu_up(&g, x, 600 * xs * sizeof(float));
	float *dy = wft_gpu_alloc(&g, (size_t)600 * 32768 * sizeof(float));
	for (int ti = 0; ti < MMREF_N_TYPES; ti++) {
		const enum wf_dtype ty = mmref_types[ti];
		const int64_t ne1 = 3000 + ti;
		const size_t row = kgen_row_bytes(ty, 2048);
		unsigned char *w = malloc(row * (size_t)ne1);
		for (int64_t r = 0; r < ne1; r++)
			kgen_weights(ty, w + (size_t)r * row, 2048);
		void *dw = wft_gpu_up(&g, w, row * (size_t)ne1);
		struct wf_backend_matrix m = {dw, ty, 2048, ne1, row, 0};
		struct wf_backend_product p = {&m, dy, (size_t)ne1};
		for (uint32_t n = 33; n <= 577; n += 272)
			OKD(g.ops->matmul(g.c, 1, &p, dx, xs, n, &diag));
		OKD(wf_device_stream_synchronize(g.s, &diag));
		wft_gpu_free(&g, dw);
		free(w);
	}
	{ /* mul_mat_id, 64 tokens x 8 of 32 experts of 256 x 2048 (Q4_K): groups of ~16 */
		const size_t row = kgen_row_bytes(WF_DTYPE_Q4_K, 2048);
		unsigned char *w = malloc(row * 256 * 32);
		for (int r = 0; r < 256 * 32; r++)
			kgen_weights(WF_DTYPE_Q4_K, w + (size_t)r * row, 2048);
		void *dw = wft_gpu_up(&g, w, row * 256 * 32);
		int32_t ids[512];
		for (int i = 0; i < 512; i++)
			ids[i] = (i / 8 * 3 + i % 8 * 5) % 32;
		int32_t *dids = wft_gpu_up(&g, ids, sizeof(ids));
		struct wf_backend_matrix m = {dw, WF_DTYPE_Q4_K, 2048, 256, row, row * 256};
		struct wf_backend_product p = {&m, dy, 256};
		OKD(g.ops->mul_mat_id(g.c, 1, &p, dids, 64, 8, dx, xs, false, &diag));
		OKD(wf_device_stream_synchronize(g.s, &diag));
		wft_gpu_free(&g, dw);
		wft_gpu_free(&g, dids);
		free(w);
	}
	{ /* decode attention at 4096 positions: 32 ranges */
		const size_t cache = (size_t)4096 * 4 * 128 * 2;
		void *kc = wft_gpu_alloc(&g, cache), *vc = wft_gpu_alloc(&g, cache);
		OKD(wf_device_memset_async(g.s, kc, 0, cache, &diag));
		OKD(wf_device_memset_async(g.s, vc, 0, cache, &diag));
		const uint32_t first = 0, cnt = 4096;
		uint32_t *dfirst = wft_gpu_up(&g, &first, 4), *dcnt = wft_gpu_up(&g, &cnt, 4);
		OKD(g.ops->attention(g.c, dx, 32 * 128, 1, 32, 4, 128, kc, vc, WF_BACKEND_KV_F16,
		                     dfirst, dcnt, 0.088f, dy, &diag));
		OKD(wf_device_stream_synchronize(g.s, &diag));
		wft_gpu_free(&g, kc);
		wft_gpu_free(&g, vc);
		wft_gpu_free(&g, dfirst);
		wft_gpu_free(&g, dcnt);
	}
	wft_gpu_free(&g, dx);
	wft_gpu_free(&g, dy);
	free(x);
	OKD(wf_device_mem_info(g.dev, &f2, &total, &diag));
	cr_log_info("after the ops: %.2f MiB more taken than after create",
	            ((double)f1 - f2) / MiB);
	cr_assert(fabs((double)f1 - (double)f2) <= 4 * MiB, "ops took %.2f MiB after create",
	          ((double)f1 - (double)f2) / MiB);
	g.ops->ctx_destroy(g.c);
	g.c = NULL;
	OKD(wf_device_mem_info(g.dev, &f3, &total, &diag));
	cr_log_info("after destroy: %.2f MiB off the baseline", ((double)f0 - f3) / MiB);
	cr_assert(fabs((double)f0 - (double)f3) <= 2 * MiB, "destroy left %.2f MiB taken",
	          ((double)f0 - (double)f3) / MiB);
	wft_gpu_close(&g);
}
