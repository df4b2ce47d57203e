/* The CUDA backend's host twins (cuda/norm_rope.h, attention.h, moe.h) against the CPU numerics
 * the host backend computes with (kernels/cpu_ops.c): the same __host__ __device__ helpers and
 * work partition the kernels use, run on the CPU, so the kernels' angle arithmetic, pair indices,
 * norm reduction, top-k order and NaN ranking, attention steps, window split and merge, and cache
 * addressing are checked on a machine without a GPU (test_cuda_backend does the rest on one). */
#include "cuda/attention.h"
#include "cuda/moe.h"
#include "cuda/norm_rope.h"

#include "ops_ref.h"

#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <stdio.h>

/* The angles are the CPU's bit for bit: same powf step (on the host), same products in the same
 * order, same cosf and sinf here. Positions to 32767, dims 16 to 256, two bases. */
Test(cuda_ops_host, rope_angles_bitwise)
{
	static const uint32_t dims[] = {16, 64, 96, 128, 256};
	static const uint32_t pos[] = {0, 1, 2, 7, 100, 1000, 4000, 4095, 32767};
	static const float bases[] = {10000.0f, 1000000.0f};
	float want[256], got[256];

	for (size_t d = 0; d < sizeof(dims) / sizeof(dims[0]); d++)
		for (size_t b = 0; b < 2; b++)
			for (size_t p = 0; p < sizeof(pos) / sizeof(pos[0]); p++) {
				wf_cpu_rope_angles(pos[p], dims[d], bases[b], want);
				wf__cuda_rope_angles_host(
				    (int32_t)pos[p], dims[d],
				    wf__cuda_rope_theta_scale(bases[b], dims[d]), got);
				cr_assert(memcmp(want, got, dims[d] * sizeof(float)) == 0,
				          "n_dims %u base %g pos %u", dims[d], (double)bases[b],
				          pos[p]);
			}
}

/* Rotation: NORM and NEOX, all of a head or its first part (the rest untouched), bit for bit. */
Test(cuda_ops_host, rope_head_bitwise)
{
	struct opsr_rng r = {12345};
	float cs[128], want[128], got[128];
	static const uint32_t nd[] = {128, 64, 32};

	for (int kind = 0; kind <= 2; kind += 2)
		for (size_t d = 0; d < 3; d++) {
			wf_cpu_rope_angles(3999, nd[d], 10000.0f, cs);
			opsr_fill(&r, want, 128, 3.0f);
			memcpy(got, want, sizeof(got));
			wf_cpu_rope(want, nd[d], cs, (enum wf_backend_rope)kind);
			wf__cuda_rope_head_host(got, nd[d], cs, (enum wf_backend_rope)kind);
			cr_assert(memcmp(want, got, sizeof(got)) == 0, "kind %d n_dims %u", kind,
			          nd[d]);
		}
}

/* The norm's double sum in the kernel's order against the CPU's sequential one: the same mean but
 * in the rare case where the two double sums round the float mean differently. Asserted:
 * NMSE <= 1e-13 (one ulp of the scale would be ~1e-14); with and without weights, in place. */
Test(cuda_ops_host, rms_norm_matches_cpu)
{
	static const uint32_t lens[] = {1, 64, 100, 255, 1000, 2048, 4096, 7168};
	struct opsr_rng r = {99};
	float x[7168], w[7168], want[7168], got[7168];

	for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++)
		for (int weights = 0; weights < 2; weights++) {
			const uint32_t len = lens[li];
			opsr_fill(&r, x, len, 4.0f);
			opsr_fill(&r, w, len, 2.0f);
			wf_cpu_rms_norm(x, weights ? w : NULL, want, len, 1e-6f);
			wf__cuda_rms_norm_host(x, weights ? w : NULL, got, len, 1e-6f);
			const double e = opsr_nmse(got, want, len);
			cr_assert(e <= 1e-13, "len %u weights %d: nmse %g", len, weights, e);
		}
}

/* Route: ids exactly the CPU's, weights within 1e-6 (same expf here; only the double sum's
 * order differs), over expert counts and k the models use, to the op's limits (4096, 64). */
Test(cuda_ops_host, route_matches_cpu)
{
	static const uint32_t ne[] = {8, 64, 128, 256, 4096};
	static const uint32_t ks[] = {1, 2, 8, 64};
	struct opsr_rng r = {777};
	const uint32_t n = 5;
	float *logits = malloc(sizeof(float) * n * 4096), *probs = malloc(sizeof(float) * 4096);
	int32_t ids[5 * 64], want_ids[64];
	float w[5 * 64], want_w[64];

	for (size_t e = 0; e < sizeof(ne) / sizeof(ne[0]); e++)
		for (size_t kk = 0; kk < sizeof(ks) / sizeof(ks[0]); kk++) {
			const uint32_t k = ks[kk];
			if (k > ne[e])
				continue;
			opsr_fill(&r, logits, (size_t)n * ne[e], 6.0f);
			cr_assert_eq(wf__cuda_route_host(logits, n, ne[e], k, ids, w), 0);
			for (uint32_t t = 0; t < n; t++) {
				wf_cpu_route(logits + (size_t)t * ne[e], ne[e], k, probs, want_ids,
				             want_w);
				for (uint32_t j = 0; j < k; j++) {
					cr_assert_eq(ids[t * k + j], want_ids[j],
					             "n_expert %u k %u t %u j %u", ne[e], k, t, j);
					cr_assert(fabsf(w[t * k + j] - want_w[j]) <= 1e-6f,
					          "n_expert %u k %u: weight %g, want %g", ne[e], k,
					          (double)w[t * k + j], (double)want_w[j]);
				}
			}
		}
	free(logits);
	free(probs);
}

/* Ties go to the lower id, as the CPU's selection: equal logits, every logit equal, and 512
 * tokens of 128 experts (top 8) drawn from 5 values, so most rounds are ties. */
Test(cuda_ops_host, route_ties_to_lower_id)
{
	float logits[16] = {0}, probs[128], want_w[8], w[8];
	int32_t ids[8], want_ids[8];

	logits[3] = logits[9] = logits[12] = 2.0f;
	logits[5] = 1.0f;
	cr_assert_eq(wf__cuda_route_host(logits, 1, 16, 4, ids, w), 0);
	wf_cpu_route(logits, 16, 4, probs, want_ids, want_w);
	cr_assert_arr_eq(ids, want_ids, 4 * sizeof(int32_t));
	cr_assert_eq(ids[0], 3);
	cr_assert_eq(ids[1], 9);
	cr_assert_eq(ids[2], 12);
	cr_assert_eq(ids[3], 5);
	memset(logits, 0, sizeof(logits));
	cr_assert_eq(wf__cuda_route_host(logits, 1, 16, 4, ids, w), 0);
	for (int j = 0; j < 4; j++) {
		cr_assert_eq(ids[j], j);
		cr_assert_float_eq(w[j], 0.25f, 1e-7f);
	}
	struct opsr_rng r = {5};
	float *many = malloc(sizeof(float) * 512 * 128);
	int32_t *mids = malloc(sizeof(int32_t) * 512 * 8);
	float *mw = malloc(sizeof(float) * 512 * 8);
	for (uint32_t i = 0; i < 512 * 128; i++)
		many[i] = (float)(opsr_u32(&r) % 5) - 2.0f;
	cr_assert_eq(wf__cuda_route_host(many, 512, 128, 8, mids, mw), 0);
	for (uint32_t t = 0; t < 512; t++) {
		wf_cpu_route(many + t * 128, 128, 8, probs, want_ids, want_w);
		cr_assert_arr_eq(mids + t * 8, want_ids, sizeof(want_ids), "token %u", t);
	}
	free(many), free(mids), free(mw);
}

/* NaN and infinite logits (a corrupt model): every probability becomes NaN on the CPU, no
 * comparison succeeds and it takes the lowest ids not taken; the kernel must pick the same ids
 * (and never an id out of bounds: it wrote pr[INT32_MAX] once). One NaN, one +inf, all -inf,
 * and a -inf among finite logits (which is no NaN: that expert just gets 0). */
Test(cuda_ops_host, route_nan_logits_ranked_as_the_cpu)
{
	float logits[64], probs[64], w[8], want_w[8];
	int32_t ids[8], want_ids[8];

	for (int variant = 0; variant < 4; variant++) {
		for (int i = 0; i < 64; i++)
			logits[i] = (float)((i * 37) % 64) / 8.0f;
		if (variant == 0)
			logits[40] = NAN;
		else if (variant == 1)
			logits[17] = INFINITY;
		else if (variant == 2)
			for (int i = 0; i < 64; i++)
				logits[i] = -INFINITY;
		else
			logits[0] = -INFINITY;
		cr_assert_eq(wf__cuda_route_host(logits, 1, 64, 8, ids, w), 0);
		wf_cpu_route(logits, 64, 8, probs, want_ids, want_w);
		for (int j = 0; j < 8; j++) {
			cr_assert_eq(ids[j], want_ids[j], "variant %d j %d: %d, want %d", variant,
			             j, ids[j], want_ids[j]);
			cr_assert(isnan(w[j]) == isnan(want_w[j]), "variant %d j %d", variant, j);
			if (!isnan(w[j]))
				cr_assert(fabsf(w[j] - want_w[j]) <= 1e-6f);
		}
	}
}

Test(cuda_ops_host, route_rejects_out_of_limits)
{
	float logits[8] = {0}, w[8];
	int32_t ids[8];

	cr_assert_eq(wf__cuda_route_host(logits, 1, 8, 9, ids, w), WF_EINVAL);
	cr_assert_eq(wf__cuda_route_host(logits, 1, 8, 0, ids, w), WF_EINVAL);
	cr_assert_eq(wf__cuda_route_host(logits, 1, 4097, 2, ids, w), WF_EINVAL);
	cr_assert_eq(wf__cuda_route_host(logits, 1, 0, 0, ids, w), WF_EINVAL);
}

/* The splits the GPU takes at decode on an H100 (132 SMs) with a 4096-position context. */
static uint32_t decode_splits(uint32_t n_head, uint32_t n_head_kv)
{
	return wf__cuda_att_splits(1, n_head, n_head_kv, 4096, 132);
}

/* The F16 tolerance against the CPU for one window (test_cuda_backend states the same on the GPU).
 * Windows under 2 x SPLIT_MIN are one range, the CPU's own steps: bit for bit here (same expf);
 * on the GPU the device's expf may move an F16 rounding by an ulp: NMSE 1e-6, max-abs 4e-3.
 * Split windows round differently from the CPU's sequential F16 accumulator (attention.h), and
 * the CPU's own F16 error grows with the window. Measured (32 heads over 4 of 128, 256 to 4096
 * positions, flat and peaked softmax): CPU vs exact arithmetic NMSE 2.5e-6 .. 9.3e-5 (about
 * 2.3e-8 per position when flat); split vs exact 7.5e-7 .. 3.2e-6 (closer to exact than the
 * CPU); split vs CPU 1.7e-6 .. 9.6e-5, max-abs <= 4.4e-3. Asserted vs the CPU: NMSE <= 6e-8 per
 * position, max-abs <= 1e-2; vs exact: NMSE <= 1e-5. An NMSE this loose cannot see one lost
 * position of thousands: the F32 cases (1e-10, below) check the split's ranges and merge. */
static void att_tol(uint32_t n_kv, double *ret_nmse, double *ret_max)
{
	if (n_kv < 2 * WF_CUDA_ATT_SPLIT_MIN) {
		*ret_nmse = 1e-6;
		*ret_max = 4e-3;
	} else {
		*ret_nmse = 6e-8 * n_kv;
		*ret_max = 1e-2;
	}
}

/* Exact attention (double) over the F16 cache values and the F16-rounded query. */
static void att_exact(const struct opsr_att *a, float *out)
{
	const size_t row = opsr_att_row(a);
	const uint32_t group = a->n_head / a->n_head_kv, D = a->head_dim;
	const uint16_t *kc = (const uint16_t *)a->kc, *vc = (const uint16_t *)a->vc;
	for (uint32_t t = 0; t < a->n; t++) {
		const uint32_t cnt = a->n_kv[t];
		double *sc = malloc(cnt * sizeof(double));
		for (uint32_t h = 0; h < a->n_head; h++) {
			const size_t base = (size_t)a->kv_first[t] * row + (size_t)(h / group) * D;
			const float *q = a->q + ((size_t)t * a->n_head + h) * D;
			double mx = -INFINITY, sum = 0;
			for (uint32_t p = 0; p < cnt; p++) {
				double d = 0;
				for (uint32_t i = 0; i < D; i++)
					d += (double)wf_kernels_fp16_to_fp32(
					         kc[base + p * row + i]) *
					     wf_kernels_fp16_to_fp32(wf_kernels_fp32_to_fp16(q[i]));
				sc[p] = d * a->scale;
				mx = sc[p] > mx ? sc[p] : mx;
			}
			for (uint32_t p = 0; p < cnt; p++)
				sum += sc[p] = exp(sc[p] - mx);
			for (uint32_t i = 0; i < D; i++) {
				double o = 0;
				for (uint32_t p = 0; p < cnt; p++)
					o +=
					    sc[p] * wf_kernels_fp16_to_fp32(vc[base + p * row + i]);
				out[((size_t)t * a->n_head + h) * D + i] = (float)(o / sum);
			}
		}
		free(sc);
	}
}

/* Attention through the twin and the CPU, one window per call so each length has its own NMSE
 * (a pooled NMSE lets the short windows hide the long ones). */
static void att_window(uint32_t n_head, uint32_t n_head_kv, uint32_t head_dim, uint32_t n_kv,
                       float qamp, uint32_t splits, uint64_t seed)
{
	struct opsr_rng r = {seed};
	struct opsr_att a = {.n = 1,
	                     .n_head = n_head,
	                     .n_head_kv = n_head_kv,
	                     .head_dim = head_dim,
	                     .rows = n_kv + 37,
	                     .type = WF_BACKEND_KV_F16};
	opsr_att_make(&a, &r, &n_kv, qamp, false);
	const size_t count = (size_t)n_head * head_dim;
	float *want = malloc(count * sizeof(float)), *got = malloc(count * sizeof(float));
	float *exact = malloc(count * sizeof(float));
	opsr_att_ref(&a, want);
	att_exact(&a, exact);
	cr_assert_eq(wf__cuda_attention_host(a.q, count, 1, n_head, n_head_kv, head_dim, a.kc, a.vc,
	                                     WF_BACKEND_KV_F16, a.kv_first, a.n_kv, a.scale, splits,
	                                     got),
	             0);
	const double e = opsr_nmse(got, want, count), m = opsr_max_abs(got, want, count);
	const double ex = opsr_nmse(got, exact, count), cpu_ex = opsr_nmse(want, exact, count);
	double nmse_tol, max_tol;
	att_tol(n_kv, &nmse_tol, &max_tol);
	cr_log_info("attention F16 heads %u/%u dim %u window %u (splits %u) qamp %g: vs CPU nmse "
	            "%.3g max-abs %.3g; vs exact %.3g (the CPU: %.3g)",
	            n_head, n_head_kv, head_dim, n_kv, splits, (double)qamp, e, m, ex, cpu_ex);
	if (n_kv < 2 * WF_CUDA_ATT_SPLIT_MIN || splits == 1)
		cr_assert(memcmp(got, want, count * sizeof(float)) == 0,
		          "window %u (one range) differs from the CPU: nmse %g max-abs %g", n_kv, e,
		          m);
	cr_assert(e <= nmse_tol && m <= max_tol, "window %u: nmse %g (<= %g) max-abs %g (<= %g)",
	          n_kv, e, nmse_tol, m, max_tol);
	cr_assert(ex <= 1e-5, "window %u: nmse vs exact %g", n_kv, ex);
	opsr_att_free(&a);
	free(want), free(got), free(exact);
}

static const uint32_t windows[] = {1, 2, 33, 255, 256, 700, 2000, 2047, 4096};

/* F16 cache, Qwen3-30B-A3B's heads (32 over 4, GQA 8:1, 128) and head 256 (8 over 1), flat and
 * peaked softmax, each window its own case (tolerances: att_tol). */
Test(cuda_ops_host, attention_f16_per_window, .timeout = 300)
{
	for (size_t i = 0; i < sizeof(windows) / sizeof(windows[0]); i++) {
		att_window(32, 4, 128, windows[i], 1.0f, decode_splits(32, 4), 100 + i);
		att_window(32, 4, 128, windows[i], 8.0f, decode_splits(32, 4), 200 + i);
		att_window(8, 1, 256, windows[i], 1.0f, decode_splits(8, 1), 300 + i);
	}
}

/* F32 cache: the CPU's plain softmax against the online one: float rounding only. NMSE <= 1e-10,
 * max-abs <= 1e-5 (outputs are weighted means of values in [-1, 1]). Windows of one range are
 * not bitwise (the CPU's softmax is two-pass): only the tolerance is asserted there. */
static double att_window_f32(uint32_t n_head, uint32_t n_head_kv, uint32_t head_dim, uint32_t n_kv,
                             float qamp, uint64_t seed)
{
	struct opsr_rng r = {seed};
	struct opsr_att a = {.n = 1,
	                     .n_head = n_head,
	                     .n_head_kv = n_head_kv,
	                     .head_dim = head_dim,
	                     .rows = n_kv + 37,
	                     .type = WF_BACKEND_KV_F32};
	opsr_att_make(&a, &r, &n_kv, qamp, false);
	const size_t count = (size_t)n_head * head_dim;
	float *want = malloc(count * sizeof(float)), *got = malloc(count * sizeof(float));
	opsr_att_ref(&a, want);
	cr_assert_eq(wf__cuda_attention_host(a.q, count, 1, n_head, n_head_kv, head_dim, a.kc, a.vc,
	                                     WF_BACKEND_KV_F32, a.kv_first, a.n_kv, a.scale,
	                                     decode_splits(n_head, n_head_kv), got),
	             0);
	const double e = opsr_nmse(got, want, count), m = opsr_max_abs(got, want, count);
	cr_assert(e <= 1e-10 && m <= 1e-5, "F32 window %u: nmse %g max-abs %g", n_kv, e, m);
	opsr_att_free(&a);
	free(want);
	free(got);
	return e;
}

Test(cuda_ops_host, attention_f32_per_window, .timeout = 300)
{
	for (size_t i = 0; i < sizeof(windows) / sizeof(windows[0]); i++) {
		att_window_f32(32, 4, 128, windows[i], 1.0f, 400 + i);
		att_window_f32(8, 8, 64, windows[i], 8.0f, 500 + i);
		att_window_f32(8, 1, 256, windows[i], 1.0f, 600 + i);
	}
}

/* A batched prompt with causal windows (token t sees positions 0..t), as the engine's prefill
 * lays it: 40 tokens, GQA 4:1, head 64; all windows short, so bit for bit. */
Test(cuda_ops_host, attention_causal_batch_bitwise)
{
	struct opsr_rng r = {7};
	uint32_t n_kv[40];
	for (uint32_t t = 0; t < 40; t++)
		n_kv[t] = t + 1;
	struct opsr_att a = {.n = 40,
	                     .n_head = 8,
	                     .n_head_kv = 2,
	                     .head_dim = 64,
	                     .rows = 40,
	                     .type = WF_BACKEND_KV_F16};
	opsr_att_make(&a, &r, n_kv, 2.0f, true);
	const size_t count = (size_t)40 * 8 * 64;
	float *want = malloc(count * sizeof(float)), *got = malloc(count * sizeof(float));
	opsr_att_ref(&a, want);
	cr_assert_eq(wf__cuda_attention_host(a.q, 8 * 64, 40, 8, 2, 64, a.kc, a.vc,
	                                     WF_BACKEND_KV_F16, a.kv_first, a.n_kv, a.scale,
	                                     wf__cuda_att_splits(40, 8, 2, 4096, 132), got),
	             0);
	cr_assert(memcmp(got, want, count * sizeof(float)) == 0);
	opsr_att_free(&a);
	free(want);
	free(got);
}

/* The split choice: Qwen3-30B-A3B decode at 4k on an H100 takes 32 ranges (128 blocks); a
 * short context, a prompt that fills the GPU, and a batch past the states do not split. */
Test(cuda_ops_host, attention_splits)
{
	cr_assert_eq(wf__cuda_att_splits(1, 32, 4, 4096, 132), 32);
	cr_assert_eq(wf__cuda_att_splits(1, 32, 4, 200, 132), 1);
	cr_assert_eq(wf__cuda_att_splits(512, 32, 4, 4096, 132), 1);
	cr_assert_eq(wf__cuda_att_splits(8, 32, 4, 4096, 132), 9);
	cr_assert(wf__cuda_att_splits(64, 32, 4, 4096, 132) <= WF_CUDA_ATT_STATES / (64 * 32));
}

Test(cuda_ops_host, attention_rejects_out_of_limits)
{
	float q[4] = {0}, out[4];
	uint32_t first = 0, cnt = 1;
	uint16_t kv[4] = {0};

	cr_assert_eq(wf__cuda_attention_host(q, 512, 1, 2, 1, 264, kv, kv, WF_BACKEND_KV_F16,
	                                     &first, &cnt, 1.0f, 1, out),
	             WF_EINVAL);
	cr_assert_eq(wf__cuda_attention_host(q, 512, 1, 2, 1, 60, kv, kv, WF_BACKEND_KV_F16, &first,
	                                     &cnt, 1.0f, 1, out),
	             WF_EINVAL);
	cr_assert_eq(wf__cuda_attention_host(q, 512, 1, 3, 2, 64, kv, kv, WF_BACKEND_KV_F16, &first,
	                                     &cnt, 1.0f, 1, out),
	             WF_EINVAL);
	cr_assert_eq(wf__cuda_attention_host(q, 512, 1, 2, 0, 64, kv, kv, WF_BACKEND_KV_F16, &first,
	                                     &cnt, 1.0f, 1, out),
	             WF_EINVAL);
	cr_assert_eq(wf__cuda_attention_host(q, 512, 1, 2, 1, 64, kv, kv, (enum wf_backend_kv)5,
	                                     &first, &cnt, 1.0f, 1, out),
	             WF_EINVAL);
}
