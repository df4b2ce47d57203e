#include "engine/sampler.h"

#include "base/error.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

struct cand {
	int32_t id;
	float logit;
};

struct wf_sampler {
	struct wf_sampler_params p;
	uint32_t n_vocab;
	struct cand *cand;
	float *prob;    /* the candidates' unnormalized probabilities */
	uint32_t *seen; /* per token: the stamp of the last penalty pass that touched it */
	uint32_t stamp;
	int32_t *hist; /* ring of the last repeat_last_n accepted tokens */
	uint32_t hist_len, hist_pos;
	uint64_t rng;
};

void wf_sampler_params_default(struct wf_sampler_params *ret_params)
{
	memset(ret_params, 0, sizeof(*ret_params));
	ret_params->top_p = 1.0f;
	ret_params->repeat_penalty = 1.0f;
	ret_params->repeat_last_n = 64;
}

int wf_sampler_params_check(const struct wf_sampler_params *p, struct wf_diag *diag)
{
	if (!isfinite(p->temperature))
		return wf_diag_set(diag, WF_EINVAL, "temperature must be a finite number");
	if (p->top_k < 0)
		return wf_diag_set(diag, WF_EINVAL, "top_k must be >= 0 (0: off), not %d",
		                   p->top_k);
	if (!(p->top_p >= 0.0f && p->top_p <= 1.0f))
		return wf_diag_set(diag, WF_EINVAL, "top_p must be in [0, 1] (1: off), not %g",
		                   (double)p->top_p);
	if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
		return wf_diag_set(diag, WF_EINVAL, "min_p must be in [0, 1] (0: off), not %g",
		                   (double)p->min_p);
	if (!(p->repeat_penalty > 0.0f) || !isfinite(p->repeat_penalty))
		return wf_diag_set(diag, WF_EINVAL, "repeat_penalty must be > 0 (1: off), not %g",
		                   (double)p->repeat_penalty);
	if (p->repeat_last_n > WF_SAMPLER_LAST_N_MAX)
		return wf_diag_set(diag, WF_EINVAL, "repeat_last_n must be at most %u, not %u",
		                   WF_SAMPLER_LAST_N_MAX, p->repeat_last_n);
	return 0;
}

int wf_sampler_create(const struct wf_sampler_params *params, uint32_t n_vocab,
                      struct wf_sampler **ret_sampler, struct wf_diag *diag)
{
	int rc = wf_sampler_params_check(params, diag);
	if (rc < 0)
		return rc;
	if (n_vocab == 0)
		return wf_diag_set(diag, WF_EINVAL, "sampler: empty vocabulary");
	struct wf_sampler *s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->p = *params;
	s->n_vocab = n_vocab;
	s->rng = params->seed;
	s->cand = malloc((size_t)n_vocab * sizeof(*s->cand));
	s->prob = malloc((size_t)n_vocab * sizeof(*s->prob));
	s->seen = calloc(n_vocab, sizeof(*s->seen));
	s->hist = malloc((params->repeat_last_n ? params->repeat_last_n : 1) * sizeof(*s->hist));
	if (!s->cand || !s->prob || !s->seen || !s->hist) {
		wf_sampler_destroy(s);
		return -ENOMEM;
	}
	*ret_sampler = s;
	return 0;
}

void wf_sampler_destroy(struct wf_sampler *s)
{
	if (!s)
		return;
	free(s->cand);
	free(s->prob);
	free(s->seen);
	free(s->hist);
	free(s);
}

void wf_sampler_accept(struct wf_sampler *s, int32_t token)
{
	if (token < 0 || (uint32_t)token >= s->n_vocab || s->p.repeat_last_n == 0)
		return;
	s->hist[s->hist_pos] = token;
	s->hist_pos = (s->hist_pos + 1) % s->p.repeat_last_n;
	if (s->hist_len < s->p.repeat_last_n)
		s->hist_len++;
}

/* SplitMix64 (Steele, Lea, Flood 2014): tiny, and the same stream on every machine. */
static uint64_t rng_next(uint64_t *state)
{
	uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

/* Descending logit, ties to the lower id: a total order, so every sort gives one answer. */
static int cand_cmp(const void *a, const void *b)
{
	const struct cand *x = a, *y = b;
	if (x->logit != y->logit)
		return x->logit > y->logit ? -1 : 1;
	return (x->id > y->id) - (x->id < y->id);
}

static bool cand_before(const struct cand *x, const struct cand *y)
{
	return cand_cmp(x, y) < 0;
}

/* Moves the k first candidates of the order to the front, sorted (quickselect, then a sort of
 * the k), so that top-k over a large vocabulary costs O(n + k log k) rather than a full sort.
 * The order is total (ids are unique), so every partition step fixes one element. */
static void select_top(struct cand *c, size_t n, size_t k)
{
	size_t lo = 0, hi = n;
	while (hi - lo > 1) {
		size_t mid = lo + (hi - lo) / 2;
		struct cand t = c[mid];
		c[mid] = c[hi - 1];
		c[hi - 1] = t;
		size_t store = lo;
		for (size_t i = lo; i < hi - 1; i++) {
			if (cand_before(&c[i], &c[hi - 1])) {
				t = c[i];
				c[i] = c[store];
				c[store++] = t;
			}
		}
		t = c[store];
		c[store] = c[hi - 1];
		c[hi - 1] = t;
		/* c[store] is where the sort would put it: [0, k) is settled once store is k - 1
		 * or k. */
		if (store == k - 1 || store == k)
			break;
		if (store < k)
			lo = store + 1;
		else
			hi = store;
	}
	qsort(c, k, sizeof(*c), cand_cmp);
}

/* Softmax of c[0..n) into p (float exp as ggml does; sums in double). */
static void softmax(const struct cand *c, size_t n, float scale, double *sum_out, float *p)
{
	float max = -INFINITY;
	for (size_t i = 0; i < n; i++)
		if (c[i].logit > max)
			max = c[i].logit;
	double sum = 0.0;
	for (size_t i = 0; i < n; i++) {
		/* Every logit -inf (all masked): a uniform draw rather than NaNs. */
		p[i] = max == -INFINITY ? 1.0f : expf((c[i].logit - max) * scale);
		sum += p[i];
	}
	*sum_out = sum;
}

int32_t wf_sampler_sample(struct wf_sampler *s, const float *logits)
{
	const struct wf_sampler_params *p = &s->p;
	size_t n = s->n_vocab;
	struct cand *c = s->cand;
	for (size_t i = 0; i < n; i++) {
		c[i].id = (int32_t)i;
		/* A NaN would make every comparison false and the order undefined. */
		c[i].logit = isnan(logits[i]) ? -INFINITY : logits[i];
	}
	/* 1. Repetition penalty, once per distinct token of the history (llama.cpp counts
	 * occurrences only for the frequency penalty, which this chain does not have). */
	if (p->repeat_penalty != 1.0f && s->hist_len) {
		if (++s->stamp == 0) { /* wrapped: old stamps could collide */
			memset(s->seen, 0, n * sizeof(*s->seen));
			s->stamp = 1;
		}
		for (uint32_t i = 0; i < s->hist_len; i++) {
			int32_t t = s->hist[i];
			if (s->seen[t] == s->stamp)
				continue;
			s->seen[t] = s->stamp;
			if (c[t].logit <= 0.0f)
				c[t].logit *= p->repeat_penalty;
			else
				c[t].logit /= p->repeat_penalty;
		}
	}
	if (p->temperature <= 0.0f) {
		size_t best = 0;
		for (size_t i = 1; i < n; i++)
			if (c[i].logit > c[best].logit)
				best = i;
		return c[best].id;
	}
	bool sorted = false;
	/* 2. top-k. */
	if (p->top_k > 0 && (size_t)p->top_k < n) {
		select_top(c, n, (size_t)p->top_k);
		n = (size_t)p->top_k;
		sorted = true;
	}
	float *prob = s->prob;
	/* 3. top-p, on the untempered distribution. */
	if (p->top_p < 1.0f) {
		if (!sorted) {
			qsort(c, n, sizeof(*c), cand_cmp);
			sorted = true;
		}
		double sum;
		softmax(c, n, 1.0f, &sum, prob);
		double cum = 0.0;
		size_t keep = n;
		for (size_t i = 0; i < n; i++) {
			cum += prob[i] / sum;
			if (cum >= p->top_p) {
				keep = i + 1;
				break;
			}
		}
		n = keep;
	}
	/* 4. min-p, in logit space: p_i >= min_p * p_max  <=>  l_i >= l_max + log(min_p). */
	if (p->min_p > 0.0f) {
		float max = -INFINITY;
		for (size_t i = 0; i < n; i++)
			if (c[i].logit > max)
				max = c[i].logit;
		float min_logit = max + logf(p->min_p);
		size_t k = 0;
		for (size_t i = 0; i < n; i++)
			if (c[i].logit >= min_logit)
				c[k++] = c[i];
		n = k ? k : 1; /* cannot be 0: the max passes; kept for -inf logits */
	}
	/* 5. Temperature, softmax, draw. */
	double sum;
	softmax(c, n, 1.0f / p->temperature, &sum, prob);
	double u = (double)(rng_next(&s->rng) >> 11) * 0x1.0p-53 * sum;
	double cum = 0.0;
	int32_t pick = c[n - 1].id;
	for (size_t i = 0; i < n; i++) {
		cum += prob[i];
		if (cum > u) {
			pick = c[i].id;
			break;
		}
	}
	return pick;
}
