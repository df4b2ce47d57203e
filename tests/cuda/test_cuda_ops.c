/* The CUDA engine ops of norm_rope.cu, attention.cu and moe.cu against the CPU engine's
 * numerics (engine/ops.c), on a GPU: inputs uploaded, each op run on a hand-built context (no
 * matmul workspace: these ops must not need one), results read back and compared by NMSE and
 * max-abs error, or bit for bit where the op is exact. Tolerances are stated per test. */
#include "gpuenv.h"
#include "ops_ref.h"

#include <criterion/criterion.h>
#include <stdio.h>

/* No matmul workspace: these ops must not need one. */
static void env_open(struct wft_gpu *e)
{
	wft_gpu_open(
	    e, (struct wf_engine_dev_limits){.max_rows = 4096, .max_kv = 4096, .head_dim = 256},
	    false);
}

/* float-sum-of-squares on the GPU against the CPU's double sum: the scale differs by a few ulp.
 * NMSE <= 1e-12, max-abs <= 1e-5 (values up to ~10). Rows 1..7, lengths 64..4096, a row stride
 * wider than the row, with and without weights, in place and not. */
Test(cuda_ops, rms_norm, .timeout = 120)
{
	struct wft_gpu e;
	struct opsr_rng r = {1};
	static const uint32_t lens[] = {64, 100, 1000, 2048, 4096};

	env_open(&e);
	for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++)
		for (uint32_t rows = 1; rows <= 7; rows += 3)
			for (int variant = 0; variant < 3; variant++) {
				const uint32_t len = lens[li];
				const size_t stride = len + 17, n = rows * stride;
				float *x = malloc(n * sizeof(float)),
				      *w = malloc(len * sizeof(float));
				float *want = calloc(n, sizeof(float)),
				      *got = calloc(n, sizeof(float));
				opsr_fill(&r, x, n, 4.0f);
				opsr_fill(&r, w, len, 2.0f);
				const bool weights = variant != 1, alias = variant == 2;
				for (uint32_t i = 0; i < rows; i++)
					wf__rms_norm(x + i * stride, weights ? w : NULL,
					             want + i * stride, len, 1e-6f);
				float *dx = wft_gpu_up(&e, x, n * sizeof(float)),
				      *dw = wft_gpu_up(&e, w, len * sizeof(float));
				float *dy =
				    alias ? dx : wft_gpu_up(&e, got, n * sizeof(float)); /* zeros */
				OKD(wf__cuda_rms_norm(&e.c, dx, weights ? dw : NULL, dy, rows, len,
				                      stride, 1e-6f, &diag));
				wft_gpu_down(&e, got, dy, n * sizeof(float));
				for (uint32_t i = 0; i < rows; i++) {
					/* the gap between rows is untouched: x in place, else 0 */
					for (size_t j = len; j < stride; j++)
						cr_assert_eq(got[i * stride + j],
						             alias ? x[i * stride + j] : 0.0f);
					memcpy(want + i * stride + len, got + i * stride + len,
					       (stride - len) * sizeof(float));
				}
				const double nmse = opsr_nmse(got, want, n),
				             ma = opsr_max_abs(got, want, n);
				cr_assert(nmse <= 1e-12 && ma <= 1e-5,
				          "len %u rows %u variant %d: nmse %g "
				          "max-abs %g",
				          len, rows, variant, nmse, ma);
				if (!alias)
					wft_gpu_free(&e, dy);
				wft_gpu_free(&e, dx);
				wft_gpu_free(&e, dw);
				free(x), free(w), free(want), free(got);
			}
	wft_gpu_close(&e);
}

/* The angles are the CPU's bit for bit (same step, same products); sincosf may differ from the
 * host's cosf and sinf by 2 ulp, so NMSE <= 1e-12 and max-abs <= 1e-5 (|x| < 3), and the
 * elements past n_dims are untouched, bit for bit. NORM and NEOX, n_dims = head_dim and below,
 * positions to 4095, two bases. */
Test(cuda_ops, rope, .timeout = 120)
{
	struct wft_gpu e;
	struct opsr_rng r = {2};
	static const int32_t pos[] = {0, 1, 17, 255, 1000, 2047, 3999, 4000, 4095};
	const uint32_t n = sizeof(pos) / sizeof(pos[0]), n_heads = 6, head_dim = 128;
	const size_t x_stride = n_heads * head_dim + 64, count = n * x_stride;
	static const uint32_t dims[] = {128, 64, 32};
	static const float bases[] = {10000.0f, 1000000.0f};
	float *x = malloc(count * sizeof(float)), *want = malloc(count * sizeof(float));
	float *got = malloc(count * sizeof(float)), cs[128];

	env_open(&e);
	int32_t *dpos = wft_gpu_up(&e, pos, sizeof(pos));
	for (int kind = 0; kind <= 2; kind += 2)
		for (size_t d = 0; d < 3; d++)
			for (size_t b = 0; b < 2; b++) {
				opsr_fill(&r, x, count, 3.0f);
				memcpy(want, x, count * sizeof(float));
				for (uint32_t t = 0; t < n; t++) {
					wf__rope_angles((uint32_t)pos[t], dims[d], bases[b], cs);
					for (uint32_t h = 0; h < n_heads; h++)
						wf__rope(want + t * x_stride + h * head_dim,
						         dims[d], cs, (enum wf__rope_kind)kind);
				}
				float *dx = wft_gpu_up(&e, x, count * sizeof(float));
				OKD(wf__cuda_rope(&e.c, dx, x_stride, n, n_heads, head_dim, dims[d],
				                  dpos, bases[b], (enum wf_engine_dev_rope)kind,
				                  &diag));
				wft_gpu_down(&e, got, dx, count * sizeof(float));
				for (uint32_t t = 0; t < n; t++)
					for (uint32_t h = 0; h < n_heads; h++)
						for (uint32_t i = dims[d]; i < head_dim; i++) {
							const size_t at =
							    t * x_stride + h * head_dim + i;
							cr_assert_eq(got[at], x[at]);
						}
				const double nmse = opsr_nmse(got, want, count),
				             ma = opsr_max_abs(got, want, count);
				cr_assert(nmse <= 1e-12 && ma <= 1e-5,
				          "kind %d n_dims %u base %g: nmse %g max-abs %g", kind,
				          dims[d], (double)bases[b], nmse, ma);
				wft_gpu_free(&e, dx);
			}
	wft_gpu_free(&e, dpos);
	free(x), free(want), free(got);
	wft_gpu_close(&e);
}

/* kv_store writes the CPU's conversion of every row at its destination (bit for bit: both round
 * to nearest even), then attention over windows of that cache against wf__attend over the same
 * bytes read back. F32 cache: NMSE <= 1e-10, max-abs <= 1e-5. F16 cache: the CPU rounds its
 * accumulator to F16 at each position, the kernel keeps float: NMSE <= 5e-5 (the host twin
 * measures <= 6.2e-7), max-abs <= 1e-2.
 * Six tokens with windows of 1..2000 positions at different rows (tokens of different
 * sequences), GQA 4:1 and 1:1, head sizes 64, 80 and 128, flat and peaked softmax. */
static void attention_case(struct wft_gpu *e, enum wf_engine_dev_kv type, uint32_t n_head,
                           uint32_t n_head_kv, uint32_t head_dim, float qamp, uint64_t seed)
{
	static const uint32_t n_kv[] = {1, 2, 33, 700, 2000, 1999};
	struct opsr_rng r = {seed};
	struct opsr_att a = {.n = 6,
	                     .n_head = n_head,
	                     .n_head_kv = n_head_kv,
	                     .head_dim = head_dim,
	                     .rows = 2100,
	                     .type = type};
	opsr_att_make(&a, &r, n_kv, qamp);
	const size_t row = opsr_att_row(&a), elem = opsr_att_elem(&a);
	const size_t cache = a.rows * row * elem, count = (size_t)a.n * n_head * head_dim;

	/* The rows to store, in reverse order of their destinations. */
	float *k = malloc(a.rows * row * sizeof(float)), *v = malloc(a.rows * row * sizeof(float));
	uint32_t *dst = malloc(a.rows * sizeof(uint32_t));
	opsr_fill(&r, k, a.rows * row, 1.0f);
	opsr_fill(&r, v, a.rows * row, 1.0f);
	for (uint32_t i = 0; i < a.rows; i++)
		dst[i] = a.rows - 1 - i;
	float *dk = wft_gpu_up(e, k, a.rows * row * sizeof(float)),
	      *dv = wft_gpu_up(e, v, a.rows * row * sizeof(float));
	uint32_t *ddst = wft_gpu_up(e, dst, a.rows * sizeof(uint32_t));
	void *dkc = wft_gpu_alloc(e, cache), *dvc = wft_gpu_alloc(e, cache);
	OKD(wf__cuda_kv_store(&e->c, dk, dv, a.rows, (uint32_t)row, ddst, dkc, dvc, type, &diag));
	wft_gpu_down(e, a.kc, dkc, cache);
	wft_gpu_down(e, a.vc, dvc, cache);
	for (uint32_t i = 0; i < a.rows; i++)
		for (size_t j = 0; j < row; j++) {
			const size_t s = i * row + j, d = (size_t)dst[i] * row + j;
			if (type == WF_ENGINE_DEV_KV_F16) {
				cr_assert_eq(((uint16_t *)a.kc)[d], wf_kernels_fp32_to_fp16(k[s]));
				cr_assert_eq(((uint16_t *)a.vc)[d], wf_kernels_fp32_to_fp16(v[s]));
			} else {
				cr_assert_eq(((float *)a.kc)[d], k[s]);
				cr_assert_eq(((float *)a.vc)[d], v[s]);
			}
		}

	float *want = malloc(count * sizeof(float)), *got = malloc(count * sizeof(float));
	opsr_att_ref(&a, want);
	float *dq = wft_gpu_up(e, a.q, count * sizeof(float)),
	      *dout = wft_gpu_alloc(e, count * sizeof(float));
	uint32_t *dfirst = wft_gpu_up(e, a.kv_first, a.n * sizeof(uint32_t));
	uint32_t *dn = wft_gpu_up(e, a.n_kv, a.n * sizeof(uint32_t));
	OKD(wf__cuda_attention(&e->c, dq, (size_t)n_head * head_dim, a.n, n_head, n_head_kv,
	                       head_dim, dkc, dvc, type, dfirst, dn, a.scale, dout, &diag));
	wft_gpu_down(e, got, dout, count * sizeof(float));
	const double nmse = opsr_nmse(got, want, count), ma = opsr_max_abs(got, want, count);
	const double nmse_tol = type == WF_ENGINE_DEV_KV_F16 ? 5e-5 : 1e-10;
	const double ma_tol = type == WF_ENGINE_DEV_KV_F16 ? 1e-2 : 1e-5;
	cr_log_info("attention type %d heads %u/%u dim %u qamp %g: nmse %.3g max-abs %.3g",
	            (int)type, n_head, n_head_kv, head_dim, (double)qamp, nmse, ma);
	cr_assert(nmse <= nmse_tol && ma <= ma_tol,
	          "type %d heads %u/%u dim %u qamp %g: nmse %g max-abs %g", (int)type, n_head,
	          n_head_kv, head_dim, (double)qamp, nmse, ma);

	void *dev_bufs[] = {dk, dv, ddst, dkc, dvc, dq, dout, dfirst, dn};
	for (size_t i = 0; i < sizeof(dev_bufs) / sizeof(dev_bufs[0]); i++)
		wft_gpu_free(e, dev_bufs[i]);
	free(k), free(v), free(dst), free(want), free(got);
	opsr_att_free(&a);
}

Test(cuda_ops, kv_store_attention_f32, .timeout = 300)
{
	struct wft_gpu e;
	env_open(&e);
	static const uint32_t dims[] = {64, 80, 128};
	for (size_t d = 0; d < 3; d++) {
		attention_case(&e, WF_ENGINE_DEV_KV_F32, 16, 4, dims[d], 1.0f, 10 + d);
		attention_case(&e, WF_ENGINE_DEV_KV_F32, 4, 4, dims[d], 8.0f, 20 + d);
	}
	wft_gpu_close(&e);
}

Test(cuda_ops, kv_store_attention_f16, .timeout = 300)
{
	struct wft_gpu e;
	env_open(&e);
	static const uint32_t dims[] = {64, 80, 128};
	for (size_t d = 0; d < 3; d++) {
		attention_case(&e, WF_ENGINE_DEV_KV_F16, 16, 4, dims[d], 1.0f, 30 + d);
		attention_case(&e, WF_ENGINE_DEV_KV_F16, 4, 4, dims[d], 8.0f, 40 + d);
	}
	wft_gpu_close(&e);
}

/* ids equal to the CPU's, weights within 1e-6 (expf on the GPU and the host may differ in the
 * last ulp or two). The logits are each token's random permutation of evenly spaced values in
 * [-6, 6): no two probabilities closer than 0.3% (relative), far beyond what expf's ulps can
 * reorder; ties are the unit test's (test_cuda_ops_host). n_expert 8, 64, 128, 4096; k 2, 8
 * and 64. */
static void distinct_logits(struct opsr_rng *r, float *x, uint32_t n_expert)
{
	for (uint32_t e = 0; e < n_expert; e++)
		x[e] = -6.0f + 12.0f * (float)e / (float)n_expert;
	for (uint32_t e = n_expert - 1; e > 0; e--) {
		const uint32_t o = opsr_u32(r) % (e + 1);
		const float tmp = x[e];
		x[e] = x[o];
		x[o] = tmp;
	}
}

Test(cuda_ops, route, .timeout = 120)
{
	struct wft_gpu e;
	struct opsr_rng r = {3};
	static const uint32_t ne[] = {8, 64, 128, 4096};
	static const uint32_t ks[] = {2, 8, 64};
	const uint32_t n = 9;
	float *logits = malloc(sizeof(float) * n * 4096), *probs = malloc(sizeof(float) * 4096);
	int32_t ids[9 * 64], want_ids[64];
	float w[9 * 64], want_w[64];

	env_open(&e);
	for (size_t ei = 0; ei < sizeof(ne) / sizeof(ne[0]); ei++)
		for (size_t ki = 0; ki < sizeof(ks) / sizeof(ks[0]); ki++) {
			const uint32_t k = ks[ki];
			if (k > ne[ei])
				continue;
			for (uint32_t t = 0; t < n; t++)
				distinct_logits(&r, logits + (size_t)t * ne[ei], ne[ei]);
			float *dl = wft_gpu_up(&e, logits, sizeof(float) * n * ne[ei]);
			int32_t *dids = wft_gpu_alloc(&e, sizeof(int32_t) * n * k);
			float *dw = wft_gpu_alloc(&e, sizeof(float) * n * k);
			OKD(wf__cuda_route(&e.c, dl, n, ne[ei], k, dids, dw, &diag));
			wft_gpu_down(&e, ids, dids, sizeof(int32_t) * n * k);
			wft_gpu_down(&e, w, dw, sizeof(float) * n * k);
			for (uint32_t t = 0; t < n; t++) {
				wf__route(logits + (size_t)t * ne[ei], ne[ei], k, probs, want_ids,
				          want_w);
				for (uint32_t j = 0; j < k; j++) {
					cr_assert_eq(ids[t * k + j], want_ids[j],
					             "n_expert %u k %u t %u j %u", ne[ei], k, t, j);
					cr_assert(fabsf(w[t * k + j] - want_w[j]) <= 1e-6f,
					          "n_expert %u k %u: weight %g want %g", ne[ei], k,
					          (double)w[t * k + j], (double)want_w[j]);
				}
			}
			wft_gpu_free(&e, dl);
			wft_gpu_free(&e, dids);
			wft_gpu_free(&e, dw);
		}
	free(logits);
	free(probs);
	wft_gpu_close(&e);
}

/* gather and add are exact; moe_sum rounds every product and sum as the CPU does: exact. swiglu
 * (expf on the GPU): each element within 1e-6 relative (max-abs / max(1, |want|)), in place. */
Test(cuda_ops, gather_swiglu_add_moe_sum, .timeout = 120)
{
	struct wft_gpu e;
	struct opsr_rng r = {4};
	const uint32_t n = 37, k = 8, len = 1000, rows = n * k;
	const size_t cnt = (size_t)rows * len;
	float *x = malloc(cnt * sizeof(float)), *u = malloc(cnt * sizeof(float));
	float *want = malloc(cnt * sizeof(float)), *got = malloc(cnt * sizeof(float));
	float *wts = malloc(rows * sizeof(float));
	uint32_t *idx = malloc(rows * sizeof(uint32_t));

	env_open(&e);
	opsr_fill(&r, x, cnt, 8.0f);
	opsr_fill(&r, u, cnt, 2.0f);
	opsr_fill(&r, wts, rows, 1.0f);
	for (uint32_t i = 0; i < rows; i++)
		idx[i] = opsr_u32(&r) % rows;
	float *dx = wft_gpu_up(&e, x, cnt * sizeof(float)),
	      *du = wft_gpu_up(&e, u, cnt * sizeof(float));
	float *dy = wft_gpu_alloc(&e, cnt * sizeof(float));
	uint32_t *didx = wft_gpu_up(&e, idx, rows * sizeof(uint32_t));
	float *dwts = wft_gpu_up(&e, wts, rows * sizeof(float));

	/* gather: rows * len floats */
	OKD(wf__cuda_gather(&e.c, dx, didx, rows, len, dy, &diag));
	wft_gpu_down(&e, got, dy, cnt * sizeof(float));
	for (uint32_t i = 0; i < rows; i++)
		cr_assert(memcmp(got + (size_t)i * len, x + (size_t)idx[i] * len,
		                 len * sizeof(float)) == 0,
		          "gather row %u", i);

	/* swiglu, out of place and in place (y aliases g) */
	wf__swiglu(x, u, want, (uint32_t)cnt);
	for (int alias = 0; alias < 2; alias++) {
		float *dg = alias ? wft_gpu_up(&e, x, cnt * sizeof(float)) : dx;
		OKD(wf__cuda_swiglu(&e.c, dg, du, alias ? dg : dy, cnt, &diag));
		wft_gpu_down(&e, got, alias ? dg : dy, cnt * sizeof(float));
		for (size_t i = 0; i < cnt; i++) {
			const float tol = 1e-6f * (fabsf(want[i]) > 1.0f ? fabsf(want[i]) : 1.0f);
			cr_assert(fabsf(got[i] - want[i]) <= tol, "swiglu %zu alias %d: %g want %g",
			          i, alias, (double)got[i], (double)want[i]);
		}
		if (alias)
			wft_gpu_free(&e, dg);
	}

	/* add: y = x, then y += u */
	OKD(wf_device_memcpy_async(e.s, dy, dx, cnt * sizeof(float), WF_DEVICE_COPY_D2D, &diag));
	OKD(wf__cuda_add(&e.c, dy, du, cnt, &diag));
	wft_gpu_down(&e, got, dy, cnt * sizeof(float));
	for (size_t i = 0; i < cnt; i++)
		cr_assert_eq(got[i], x[i] + u[i], "add %zu", i);

	/* moe_sum: token t's k experts at slot_of rows of down (= x), weights wts, in order */
	OKD(wf__cuda_moe_sum(&e.c, dx, didx, dwts, n, k, len, dy, &diag));
	wft_gpu_down(&e, got, dy, (size_t)n * len * sizeof(float));
	for (uint32_t t = 0; t < n; t++)
		for (uint32_t i = 0; i < len; i++) {
			float y = 0.0f;
			for (uint32_t j = 0; j < k; j++) {
				const float p =
				    x[(size_t)idx[t * k + j] * len + i] * wts[t * k + j];
				y = j == 0 ? p : y + p;
			}
			cr_assert_eq(got[(size_t)t * len + i], y, "moe_sum t %u i %u", t, i);
		}

	void *dev_bufs[] = {dx, du, dy, didx, dwts};
	for (size_t i = 0; i < sizeof(dev_bufs) / sizeof(dev_bufs[0]); i++)
		wft_gpu_free(&e, dev_bufs[i]);
	free(x), free(u), free(want), free(got), free(wts), free(idx);
	wft_gpu_close(&e);
}
