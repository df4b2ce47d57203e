/* The sampler (engine/sampler.h): each stage of llama.cpp's chain on hand-made logits whose
 * outcome is worked out in the comments, the draw's distribution, seeds, and refused
 * parameters. */
#include "base/error.h"
#include "engine/sampler.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

TestSuite(sampler, .timeout = 60);

static struct wf_sampler *mk(const struct wf_sampler_params *p, uint32_t n)
{
	struct wf_sampler *s = NULL;
	struct wf_diag d = {{0}};
	int rc = wf_sampler_create(p, n, &s, &d);
	cr_assert_eq(rc, 0, "create: %s", wf_diag_str(&d, rc));
	return s;
}

static struct wf_sampler_params greedy(void)
{
	struct wf_sampler_params p;
	wf_sampler_params_default(&p);
	return p;
}

Test(sampler, greedy_argmax_ties_to_lowest_id)
{
	struct wf_sampler_params p = greedy();
	struct wf_sampler *s = mk(&p, 6);
	float l[6] = {0.5f, 3.0f, -1.0f, 3.0f, NAN, 2.9f};
	cr_assert_eq(wf_sampler_sample(s, l), 1);
	l[1] = 2.0f;
	cr_assert_eq(wf_sampler_sample(s, l), 3);
	wf_sampler_destroy(s);
}

/* llama.cpp: a positive logit is divided by the penalty, a non-positive one multiplied. */
Test(sampler, repeat_penalty_divides_positive_multiplies_negative)
{
	struct wf_sampler_params p = greedy();
	p.repeat_penalty = 2.0f;
	struct wf_sampler *s = mk(&p, 4);
	/* Token 0 leads at 2.0; penalized it falls to 1.0, under token 1 (1.5). Multiplying
	 * (4.0) or ignoring the penalty would keep token 0. */
	float pos[4] = {2.0f, 1.5f, -5.0f, -5.0f};
	cr_assert_eq(wf_sampler_sample(s, pos), 0);
	wf_sampler_accept(s, 0);
	wf_sampler_accept(s, 0); /* counted once: twice dividing would give 0.5, same winner */
	cr_assert_eq(wf_sampler_sample(s, pos), 1);
	wf_sampler_destroy(s);

	/* Negative: token 0 at -1.0 leads -1.5; multiplied it is -2.0 and loses. Dividing
	 * (-0.5) would keep it ahead. */
	s = mk(&p, 4);
	float neg[4] = {-1.0f, -1.5f, -5.0f, -5.0f};
	wf_sampler_accept(s, 0);
	cr_assert_eq(wf_sampler_sample(s, neg), 1);
	wf_sampler_destroy(s);
}

Test(sampler, repeat_penalty_window_is_last_n)
{
	struct wf_sampler_params p = greedy();
	p.repeat_penalty = 2.0f;
	p.repeat_last_n = 2;
	struct wf_sampler *s = mk(&p, 4);
	float l[4] = {2.0f, 1.5f, -5.0f, -5.0f};
	wf_sampler_accept(s, 0);
	cr_assert_eq(wf_sampler_sample(s, l), 1);
	wf_sampler_accept(s, 3);
	wf_sampler_accept(s, 3); /* token 0 has left the window of 2 */
	cr_assert_eq(wf_sampler_sample(s, l), 0);
	wf_sampler_destroy(s);

	p.repeat_last_n = 0; /* off */
	s = mk(&p, 4);
	wf_sampler_accept(s, 0);
	cr_assert_eq(wf_sampler_sample(s, l), 0);
	wf_sampler_destroy(s);
}

/* Counts draws per token over many steps. */
static void histogram(struct wf_sampler *s, const float *l, uint32_t n, int draws, int *count)
{
	memset(count, 0, n * sizeof(*count));
	for (int i = 0; i < draws; i++) {
		int32_t t = wf_sampler_sample(s, l);
		cr_assert(t >= 0 && (uint32_t)t < n);
		count[t]++;
	}
}

/* logits {0, ln 3}: p = 1/4, 3/4 at temperature 1; at 0.5 the logits double: p = 1/10, 9/10. */
Test(sampler, temperature_draws_follow_softmax)
{
	struct wf_sampler_params p = greedy();
	p.temperature = 1.0f;
	p.seed = 7;
	float l[2] = {0.0f, logf(3.0f)};
	int c[2];
	struct wf_sampler *s = mk(&p, 2);
	histogram(s, l, 2, 40000, c);
	cr_assert(fabs(c[0] / 40000.0 - 0.25) < 0.01, "p0 %f", c[0] / 40000.0);
	wf_sampler_destroy(s);
	p.temperature = 0.5f;
	s = mk(&p, 2);
	histogram(s, l, 2, 40000, c);
	cr_assert(fabs(c[0] / 40000.0 - 0.10) < 0.01, "p0 %f", c[0] / 40000.0);
	wf_sampler_destroy(s);
}

/* top-k over a vocabulary of 1000 random logits: at a huge temperature (nearly uniform) every
 * draw is one of the k largest and each of them turns up; the quickselect must not lose one. */
Test(sampler, top_k_keeps_exactly_the_k_largest)
{
	enum { N = 1000, K = 37 };
	float *l = malloc(N * sizeof(*l));
	uint64_t x = 12345;
	for (int i = 0; i < N; i++) {
		x = x * 6364136223846793005ull + 1442695040888963407ull;
		l[i] = (float)((x >> 40) % 100000) / 1000.0f; /* repeats: exercises ties */
	}
	float sorted[N];
	memcpy(sorted, l, sizeof sorted);
	/* The K-th largest value, and how many equal it may enter (ties to the lower id). */
	for (int i = 0; i < K; i++)
		for (int j = i + 1; j < N; j++)
			if (sorted[j] > sorted[i]) {
				float t = sorted[i];
				sorted[i] = sorted[j];
				sorted[j] = t;
			}
	float kth = sorted[K - 1];
	int above = 0;
	for (int i = 0; i < N; i++)
		above += l[i] > kth;
	bool in[N];
	int room = K - above;
	for (int i = 0; i < N; i++) {
		in[i] = l[i] > kth || (l[i] == kth && room-- > 0);
	}
	struct wf_sampler_params p = greedy();
	p.temperature = 1e6f;
	p.top_k = K;
	p.seed = 99;
	struct wf_sampler *s = mk(&p, N);
	int c[N];
	histogram(s, l, N, 20000, c);
	for (int i = 0; i < N; i++) {
		if (in[i])
			cr_assert_gt(c[i], 0, "token %d (logit %f) of the top %d never drawn", i,
			             l[i], K);
		else
			cr_assert_eq(c[i], 0, "token %d (logit %f) outside the top %d drawn", i,
			             l[i], K);
	}
	wf_sampler_destroy(s);
	free(l);
}

/* p = {0.5, 0.3, 0.2}: top_p 0.5 keeps token 0 alone (its mass reaches 0.5); 0.6 keeps 0 and
 * 1 (token 1 crosses), never 2. */
Test(sampler, top_p_keeps_the_crossing_token)
{
	float l[3] = {logf(0.5f), logf(0.3f), logf(0.2f)};
	struct wf_sampler_params p = greedy();
	p.temperature = 1.0f;
	p.top_p = 0.5f;
	int c[3];
	struct wf_sampler *s = mk(&p, 3);
	histogram(s, l, 3, 2000, c);
	cr_assert_eq(c[0], 2000);
	wf_sampler_destroy(s);
	p.top_p = 0.6f;
	s = mk(&p, 3);
	histogram(s, l, 3, 20000, c);
	cr_assert_eq(c[2], 0);
	cr_assert(fabs(c[0] / 20000.0 - 0.625) < 0.015, "p0 %f", c[0] / 20000.0);
	wf_sampler_destroy(s);
}

/* p = {0.5, 0.3, 0.2}: min_p 0.5 keeps p >= 0.25 (tokens 0, 1); min_p 0.39 keeps p >= 0.195
 * (all three). */
Test(sampler, min_p_is_relative_to_the_best)
{
	float l[3] = {logf(0.2f), logf(0.5f), logf(0.3f)};
	struct wf_sampler_params p = greedy();
	p.temperature = 1.0f;
	p.min_p = 0.5f;
	int c[3];
	struct wf_sampler *s = mk(&p, 3);
	histogram(s, l, 3, 20000, c);
	cr_assert_eq(c[0], 0);
	cr_assert_gt(c[2], 0);
	wf_sampler_destroy(s);
	p.min_p = 0.39f;
	s = mk(&p, 3);
	histogram(s, l, 3, 20000, c);
	cr_assert_gt(c[0], 0);
	wf_sampler_destroy(s);
}

/* The same seed gives the same tokens; another seed others; and the stream is SplitMix64's,
 * fixed here so that another machine or C library must agree. */
Test(sampler, seed_reproducible_and_pinned)
{
	enum { N = 16, DRAWS = 32 };
	float l[N];
	for (int i = 0; i < N; i++)
		l[i] = (float)(i % 5) * 0.25f;
	struct wf_sampler_params p = greedy();
	p.temperature = 1.0f;
	p.seed = 42;
	int32_t a[DRAWS], b[DRAWS], c[DRAWS];
	struct wf_sampler *s1 = mk(&p, N), *s2 = mk(&p, N);
	p.seed = 43;
	struct wf_sampler *s3 = mk(&p, N);
	int differ = 0;
	for (int i = 0; i < DRAWS; i++) {
		a[i] = wf_sampler_sample(s1, l);
		b[i] = wf_sampler_sample(s2, l);
		c[i] = wf_sampler_sample(s3, l);
		cr_assert_eq(a[i], b[i], "draw %d", i);
		differ += a[i] != c[i];
	}
	cr_assert_gt(differ, DRAWS / 4);
	/* Pinned: the first draws for seed 42 (from an independent Python model of SplitMix64 and
	 * the draw). */
	static const int32_t want[8] = {12, 3, 4, 5, 1, 14, 3, 13};
	for (int i = 0; i < 8; i++)
		cr_assert_eq(a[i], want[i], "draw %d: %d, pinned %d", i, a[i], want[i]);
	wf_sampler_destroy(s1);
	wf_sampler_destroy(s2);
	wf_sampler_destroy(s3);
}

static void refused(struct wf_sampler_params p, const char *name)
{
	struct wf_diag d = {{0}};
	struct wf_sampler *s = NULL;
	int rc = wf_sampler_create(&p, 8, &s, &d);
	cr_assert_eq(rc, WF_EINVAL, "%s: rc %d", name, rc);
	cr_assert_null(s);
	cr_assert(strstr(wf_diag_str(&d, rc), name), "message '%s' does not name %s",
	          wf_diag_str(&d, rc), name);
}

Test(sampler, invalid_parameters_refused_by_name)
{
	struct wf_sampler_params p = greedy();
	p.temperature = NAN;
	refused(p, "temperature");
	p = greedy();
	p.temperature = INFINITY;
	refused(p, "temperature");
	p = greedy();
	p.top_k = -1;
	refused(p, "top_k");
	p = greedy();
	p.top_p = -0.1f;
	refused(p, "top_p");
	p = greedy();
	p.top_p = 1.5f;
	refused(p, "top_p");
	p = greedy();
	p.top_p = NAN;
	refused(p, "top_p");
	p = greedy();
	p.min_p = NAN;
	refused(p, "min_p");
	p = greedy();
	p.min_p = 2.0f;
	refused(p, "min_p");
	p = greedy();
	p.repeat_penalty = 0.0f;
	refused(p, "repeat_penalty");
	p = greedy();
	p.repeat_penalty = -1.0f;
	refused(p, "repeat_penalty");
	p = greedy();
	p.repeat_last_n = WF_SAMPLER_LAST_N_MAX + 1;
	refused(p, "repeat_last_n");
	p = greedy();
	struct wf_diag d = {{0}};
	struct wf_sampler *s = NULL;
	cr_assert_eq(wf_sampler_create(&p, 0, &s, &d), WF_EINVAL);
}
