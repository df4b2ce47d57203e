/* The CUDA engine ops' host twins (cuda/norm_rope.h, attention.h, moe.h) against the CPU engine
 * (engine/ops.c): the same __host__ __device__ helpers and work partition the kernels use, run on
 * the CPU, so the kernels' angle arithmetic, pair indices, top-k order, renormalization,
 * online-softmax merge and cache addressing are checked on a machine without a GPU (test_cuda_ops
 * does the rest on one). */
#include "base/error.h"
#include "cuda/attention.h"
#include "cuda/moe.h"
#include "cuda/norm_rope.h"

#include "ops_ref.h"

#include <criterion/criterion.h>
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
				wf__rope_angles(pos[p], dims[d], bases[b], want);
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
			wf__rope_angles(3999, nd[d], 10000.0f, cs);
			opsr_fill(&r, want, 128, 3.0f);
			memcpy(got, want, sizeof(got));
			wf__rope(want, nd[d], cs, (enum wf__rope_kind)kind);
			wf__cuda_rope_head_host(got, nd[d], cs, (enum wf_engine_dev_rope)kind);
			cr_assert(memcmp(want, got, sizeof(got)) == 0, "kind %d n_dims %u", kind,
			          nd[d]);
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
				wf__route(logits + (size_t)t * ne[e], ne[e], k, probs, want_ids,
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

/* Ties go to the lower id, as the CPU's stable order: equal logits, and every logit equal. */
Test(cuda_ops_host, route_ties_to_lower_id)
{
	float logits[16] = {0}, probs[16], want_w[4], w[4];
	int32_t ids[4], want_ids[4];

	logits[3] = logits[9] = logits[12] = 2.0f;
	logits[5] = 1.0f;
	cr_assert_eq(wf__cuda_route_host(logits, 1, 16, 4, ids, w), 0);
	wf__route(logits, 16, 4, probs, want_ids, want_w);
	cr_assert_arr_eq(ids, want_ids, sizeof(ids));
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
}

/* A NaN logit (a corrupt model) makes every probability NaN: no round finds a winner by
 * comparison, and the kernel must still pick an expert in bounds (it wrote pr[INT32_MAX]
 * before): the lowest untaken ids, as the CPU picks them. */
Test(cuda_ops_host, route_nan_logits_stay_in_bounds)
{
	float logits[64], probs[64], w[8], want_w[8];
	int32_t ids[8], want_ids[8];

	for (int i = 0; i < 64; i++)
		logits[i] = (float)i / 8.0f;
	logits[40] = NAN;
	cr_assert_eq(wf__cuda_route_host(logits, 1, 64, 8, ids, w), 0);
	wf__route(logits, 64, 8, probs, want_ids, want_w);
	for (int j = 0; j < 8; j++) {
		cr_assert_eq(ids[j], want_ids[j], "j %d: %d, want %d", j, ids[j], want_ids[j]);
		cr_assert(isnan(w[j]));
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

/* One attention case through the twin and the CPU; returns the NMSE, asserting max-abs. */
static double att_case(enum wf_engine_dev_kv type, uint32_t n_head, uint32_t n_head_kv,
                       uint32_t head_dim, const uint32_t *n_kv, uint32_t n, float qamp,
                       double max_abs_tol, uint64_t seed)
{
	struct opsr_rng r = {seed};
	struct opsr_att a = {.n = n,
	                     .n_head = n_head,
	                     .n_head_kv = n_head_kv,
	                     .head_dim = head_dim,
	                     .rows = 2100,
	                     .type = type};
	opsr_att_make(&a, &r, n_kv, qamp);
	const size_t count = (size_t)n * n_head * head_dim;
	float *want = malloc(count * sizeof(float)), *got = malloc(count * sizeof(float));
	opsr_att_ref(&a, want);
	cr_assert_eq(wf__cuda_attention_host(a.q, (size_t)n_head * head_dim, n, n_head, n_head_kv,
	                                     head_dim, a.kc, a.vc, type, a.kv_first, a.n_kv,
	                                     a.scale, got),
	             0);
	const double e = opsr_nmse(got, want, count), m = opsr_max_abs(got, want, count);
	cr_log_info("attention type %d heads %u/%u dim %u qamp %g: nmse %.3g max-abs %.3g", type,
	            n_head, n_head_kv, head_dim, (double)qamp, e, m);
	cr_assert(m <= max_abs_tol, "type %d heads %u/%u dim %u: max-abs %g > %g", type, n_head,
	          n_head_kv, head_dim, m, max_abs_tol);
	opsr_att_free(&a);
	free(want);
	free(got);
	return e;
}

/* F32 cache: the CPU's plain softmax in float (double sum) against the online softmax over 8
 * warps: NMSE <= 1e-10, max-abs <= 1e-5 (outputs are weighted means of values in [-1, 1];
 * measured: 1e-13 and 1.1e-6).
 * Windows of 1 to 2000 positions; GQA 4:1 and 1:1; head sizes 64, 80 (not a multiple of 32),
 * 128, 256. */
Test(cuda_ops_host, attention_f32_matches_cpu, .timeout = 120)
{
	static const uint32_t n_kv[] = {1, 2, 9, 31, 300, 2000};
	static const uint32_t dims[] = {64, 80, 128, 256};
	for (size_t d = 0; d < 4; d++) {
		cr_assert(att_case(WF_ENGINE_DEV_KV_F32, 8, 2, dims[d], n_kv, 6, 1.0f, 1e-5,
		                   d + 1) <= 1e-10);
		cr_assert(att_case(WF_ENGINE_DEV_KV_F32, 4, 4, dims[d], n_kv, 6, 8.0f, 1e-5,
		                   d + 9) <= 1e-10);
	}
}

/* F16 cache: the CPU rounds its accumulator to F16 after every position (llama.cpp's CPU flash
 * attention); the kernel keeps it in float. Their difference is F16 rounding, well inside the
 * F16 compute tolerance (NMSE 5e-4): measured NMSE <= 6.2e-7 and max-abs <= 2.6e-3 for windows
 * up to 2000, flat and peaked softmax; asserted NMSE <= 5e-5 and max-abs <= 1e-2. */
Test(cuda_ops_host, attention_f16_within_f16_tolerance, .timeout = 120)
{
	static const uint32_t n_kv[] = {1, 2, 9, 31, 300, 2000};
	for (uint32_t d = 64; d <= 128; d += 64) {
		cr_assert(att_case(WF_ENGINE_DEV_KV_F16, 8, 2, d, n_kv, 6, 1.0f, 1e-2, d) <= 5e-5);
		cr_assert(att_case(WF_ENGINE_DEV_KV_F16, 4, 4, d, n_kv, 6, 8.0f, 1e-2, d + 1) <=
		          5e-5);
	}
}

Test(cuda_ops_host, attention_rejects_out_of_limits)
{
	float q[4] = {0}, out[4];
	uint32_t first = 0, cnt = 1;
	uint16_t kv[4] = {0};

	cr_assert_eq(wf__cuda_attention_host(q, 512, 1, 2, 1, 257, kv, kv, WF_ENGINE_DEV_KV_F16,
	                                     &first, &cnt, 1.0f, out),
	             WF_EINVAL);
	cr_assert_eq(wf__cuda_attention_host(q, 512, 1, 3, 2, 64, kv, kv, WF_ENGINE_DEV_KV_F16,
	                                     &first, &cnt, 1.0f, out),
	             WF_EINVAL);
	cr_assert_eq(wf__cuda_attention_host(q, 512, 1, 2, 0, 64, kv, kv, WF_ENGINE_DEV_KV_F16,
	                                     &first, &cnt, 1.0f, out),
	             WF_EINVAL);
	cr_assert_eq(wf__cuda_attention_host(q, 512, 1, 2, 1, 64, kv, kv, (enum wf_engine_dev_kv)5,
	                                     &first, &cnt, 1.0f, out),
	             WF_EINVAL);
}
