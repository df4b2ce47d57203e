/* wf-bench cachepolicy: which policy the device expert cache (engine/fetch.c) should use, chosen
 * on routing traces rather than by taste (issue 11).
 *
 * 1. Trace. The engine runs the model on the CPU with a host device, post-fetch and an expert
 *    cache; every token (prompt, then greedy decoding, or with --random-tokens a fixed
 *    pseudo-random stream) is decoded as a one-token step, and the
 *    router hook gives each layer's logits, to which the host backend's wf_cpu_route picks the top
 * k. A trace is, per step and layer, the k selected expert ids in the order the engine's post-fetch
 * step hands them to the cache (ascending id).
 * 2. Simulate, over the trace, caches of C slots (C = 10, 25, 50, 100% of layers x experts; a
 *    slot holds one expert, as the engine's do) under:
 *      lru global    the engine's rule: one pool for every layer, the victim wf_lru_oldest over
 *                    the slots (never used ones first), slots of this (step, layer) busy;
 *      lru layer     the same rule with C/n_layer slots reserved to each layer;
 *      lrfu global   LRFU (Lee et al.): each (layer, expert) carries a score that decays by half
 *                    every H tokens and gains 1 per use, kept for every expert whether cached or
 *                    not (the keys are few); the victim is the non-busy slot of lowest decayed
 *                    score, ties to the least recently used. H -> infinity is LFU, H -> 0 LRU.
 *      lrfu layer    the same per layer;
 *      belady        the clairvoyant optimum: the victim is the non-busy slot whose expert is
 *                    needed again furthest ahead (or never), and a miss needed later than
 *                    every candidate is not cached at all (bypass). It bounds every policy
 *                    above, per-layer pools included: they are one of its choices.
 *    A miss when every slot is busy is not cached (the engine computes it from the floor).
 * 3. Check: the simulated policy the engine uses (global LRFU, half-life WF_ENGINE_CACHE_HALF_LIFE)
 *    at the engine cache's slot count must give the engine's own hit and miss counts
 *    (policy_sim_vs_engine_hits, ratio 1), so the simulator is the engine's rule (base/lru.h's
 *    functions, which both call) and not a model of it. */
#include "anchors.h"
#include "bench.h"
#include "report.h"

#include "base/error.h"
#include "base/lru.h"
#include "base/units.h"
#include "device/device.h"
#include "engine/engine.h"
#include "engine/postfetch.h"
#include "engine/tokenizer.h"
#include "kernels/cpu_ops.h" /* wf_cpu_route: the engine's top k, ties and all */
#include "model/model.h"
#include "worker/weights.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_TOKENS     65536u
#define MAX_HALF_LIVES 8

/* The reference models' prompt (tests/data/reference/README.md): every vocabulary here has them. */
static const int32_t default_prompt[] = {1, 17, 300, 42,  99, 7,  256, 311,
                                         5, 63, 128, 400, 2,  77, 150, 203};

struct trace {
	uint32_t n_layer, n_expert, k;
	uint32_t n_steps, cap_steps;
	uint16_t *ids; /* [step][layer][k], ascending within a (step, layer) */
	float *probs;  /* wf_cpu_route's scratch */
	int32_t *top;
	float *weights;
	uint32_t step; /* the step being decoded */
	int err;       /* a hook call the trace could not take */
};

static int cmp_u16(const void *a, const void *b)
{
	return (int)*(const uint16_t *)a - (int)*(const uint16_t *)b;
}

static int cmp_desc_u32(const void *a, const void *b)
{
	const uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	return x < y ? 1 : x > y ? -1 : 0;
}

static void on_router(void *arg, uint32_t layer, uint32_t n_tokens, const float *logits)
{
	struct trace *t = arg;
	if (n_tokens != 1 || layer >= t->n_layer || t->step >= t->cap_steps) {
		t->err = WF_EINVAL; /* we decode one token per step: anything else is a bug here */
		return;
	}
	wf_cpu_route(logits, t->n_expert, t->k, t->probs, t->top, t->weights);
	uint16_t *g = &t->ids[((size_t)t->step * t->n_layer + layer) * t->k];
	for (uint32_t j = 0; j < t->k; j++)
		g[j] = (uint16_t)t->top[j];
	/* moe.c walks the selected experts by id: the order the cache sees them in */
	qsort(g, t->k, sizeof *g, cmp_u16);
}

/* ---- the simulator ---- */

/* A group is one (step, layer): the experts one post-fetch step looks up. */
struct sim_trace {
	uint32_t n_groups, k, n_layer, n_expert;
	const uint16_t *ids; /* [group][k] */
	uint32_t *next; /* [group][k]: the next group that uses this expert, UINT32_MAX never */
};

enum policy { POL_LRU, POL_LRFU, POL_BELADY };

struct sim_result {
	uint64_t hits, misses;
};

static double rate(struct sim_result r)
{
	return r.hits + r.misses ? (double)r.hits / (double)(r.hits + r.misses) : 0;
}

/* One pool of slots; keys are layer * n_expert + expert. */
struct pool {
	uint32_t n;
	struct wf_lru_item *lru; /* stamps and busy flags, for wf_lru_oldest and the tie-breaks */
	uint32_t *key;           /* UINT32_MAX: empty */
};

/* lambda: decay per group (LRFU); score and seen: per key, over the whole run. */
struct sim_state {
	const struct sim_trace *tr;
	enum policy pol;
	double lambda;
	struct wf_lrfu_score *score; /* per key (base/lru.h, the engine's rule) */
	double *value;               /* per slot of the pool being searched */
	uint32_t *nxt;               /* per key: its next use (Belady) */
	int32_t *slot_of;            /* per key: slot in its pool, -1 */
};

/* The victim among p's non-busy slots, or p->n when all are busy. */
static uint32_t victim(const struct sim_state *s, const struct pool *p, uint32_t key)
{
	if (s->pol == POL_LRU)
		return (uint32_t)wf_lru_oldest(p->lru, p->n);
	if (s->pol == POL_LRFU) { /* base/lru.h's rule, as engine/fetch.c applies it */
		for (uint32_t i = 0; i < p->n; i++)
			s->value[i] = p->key[i] == UINT32_MAX
			                  ? -INFINITY
			                  : wf_lrfu_rank(&s->score[p->key[i]], s->lambda);
		return (uint32_t)wf_lrfu_victim(p->lru, s->value, p->n);
	}
	uint32_t best = p->n;
	double best_v = 0;
	for (uint32_t i = 0; i < p->n; i++) {
		if (p->lru[i].busy)
			continue;
		if (p->key[i] == UINT32_MAX)
			return i; /* an empty slot first, as the engine takes one */
		const double v = -(double)s->nxt[p->key[i]];
		if (best == p->n || v < best_v ||
		    (v == best_v && p->lru[i].last_used < p->lru[best].last_used)) {
			best = i;
			best_v = v;
		}
	}
	/* Belady may leave the miss uncached (computed from the floor, as the engine does when
	 * every slot is busy) when it is needed later than every candidate: without that bypass a
	 * policy that reserves slots (per layer) could beat it, and it would bound nothing. */
	if (s->pol == POL_BELADY && best < p->n && s->nxt[key] >= s->nxt[p->key[best]])
		return p->n;
	return best;
}

/* Simulates pol with pools[n_pools] (one, or one per layer: layer l uses pool l). */
static int simulate(const struct sim_trace *tr, enum policy pol, double half_life_tokens,
                    const uint32_t *pool_slots, uint32_t n_pools, struct sim_result *ret)
{
	const uint32_t n_keys = tr->n_layer * tr->n_expert;
	struct sim_state s = {.tr = tr, .pol = pol};
	struct pool *pools = calloc(n_pools, sizeof *pools);
	struct sim_result r = {0};
	int rc = -ENOMEM;
	s.score = calloc(n_keys, sizeof *s.score);
	uint32_t max_pool = 1;
	for (uint32_t p = 0; p < n_pools; p++)
		max_pool = pool_slots[p] > max_pool ? pool_slots[p] : max_pool;
	s.value = calloc(max_pool, sizeof *s.value);
	s.nxt = calloc(n_keys, sizeof *s.nxt);
	s.slot_of = malloc(n_keys * sizeof *s.slot_of);
	if (!pools || !s.score || !s.value || !s.nxt || !s.slot_of)
		goto out;
	/* half-life in tokens, time in groups (n_layer a token); 0: no decay (LFU) */
	s.lambda = half_life_tokens > 0 ? 1.0 / (half_life_tokens * tr->n_layer) : 0;
	for (uint32_t k = 0; k < n_keys; k++)
		s.slot_of[k] = -1;
	for (uint32_t p = 0; p < n_pools; p++) {
		pools[p].n = pool_slots[p];
		pools[p].lru = calloc(pools[p].n ? pools[p].n : 1, sizeof *pools[p].lru);
		pools[p].key = malloc((pools[p].n ? pools[p].n : 1) * sizeof *pools[p].key);
		if (!pools[p].lru || !pools[p].key)
			goto out;
		for (uint32_t i = 0; i < pools[p].n; i++) {
			pools[p].key[i] = UINT32_MAX;
			pools[p].lru[i].bytes = 1;
		}
	}
	for (uint32_t g = 0; g < tr->n_groups; g++) {
		const uint64_t now = (uint64_t)g + 1; /* the engine's stamp: one per fetch step */
		const uint32_t layer = g % tr->n_layer;
		struct pool *p = &pools[n_pools == 1 ? 0 : layer];
		for (uint32_t i = 0; i < p->n; i++)
			p->lru[i].busy = false;
		for (uint32_t j = 0; j < tr->k; j++) {
			const uint32_t key = layer * tr->n_expert + tr->ids[(size_t)g * tr->k + j];
			/* every policy keeps the score; only LRFU reads it */
			wf_lrfu_touch(&s.score[key], now, s.lambda);
			s.nxt[key] = tr->next[(size_t)g * tr->k + j];
			int32_t slot = s.slot_of[key];
			if (slot < 0) {
				r.misses++;
				const uint32_t v = victim(&s, p, key);
				if (v >= p->n)
					continue; /* every slot holds an expert of this step */
				if (p->key[v] != UINT32_MAX)
					s.slot_of[p->key[v]] = -1;
				p->key[v] = key;
				s.slot_of[key] = (int32_t)v;
				slot = (int32_t)v;
			} else {
				r.hits++;
			}
			p->lru[slot].busy = true;
			p->lru[slot].last_used = now;
		}
	}
	*ret = r;
	rc = 0;
out:
	for (uint32_t p = 0; pools && p < n_pools; p++) {
		free(pools[p].lru);
		free(pools[p].key);
	}
	free(pools);
	free(s.score);
	free(s.value);
	free(s.nxt);
	free(s.slot_of);
	return rc;
}

/* Fills tr->next: for each access, the next group using the same key. */
static int next_uses(struct sim_trace *tr)
{
	const uint32_t n_keys = tr->n_layer * tr->n_expert;
	uint32_t *last = malloc(n_keys * sizeof *last);
	if (!last)
		return -ENOMEM;
	for (uint32_t k = 0; k < n_keys; k++)
		last[k] = UINT32_MAX;
	for (uint32_t g = tr->n_groups; g-- > 0;) {
		const uint32_t layer = g % tr->n_layer;
		for (uint32_t j = 0; j < tr->k; j++) {
			const uint32_t key = layer * tr->n_expert + tr->ids[(size_t)g * tr->k + j];
			tr->next[(size_t)g * tr->k + j] = last[key];
		}
		for (uint32_t j = 0; j < tr->k; j++)
			last[layer * tr->n_expert + tr->ids[(size_t)g * tr->k + j]] = g;
	}
	free(last);
	return 0;
}

/* total slots spread over the layers, the remainder to the first ones */
static void per_layer(uint32_t total, uint32_t n_layer, uint32_t *out)
{
	for (uint32_t l = 0; l < n_layer; l++)
		out[l] = total / n_layer + (l < total % n_layer ? 1 : 0);
}

/* ---- the mode ---- */

struct run {
	struct wf_model *m;
	struct wf_weight_view w;
	struct wf_device *dev;
	struct wf_engine *e;
	struct wf_tokenizer *tok;
	int32_t *prompt;
	size_t n_prompt;
	float *logits;
	struct trace t;
	uint32_t *next;
	uint32_t *slots;
};

static void run_fini(struct run *r)
{
	wf_engine_destroy(r->e);
	wf_device_close(r->dev);
	wf_tokenizer_destroy(r->tok);
	wf_weight_view_release(&r->w);
	wf_model_close(r->m);
	free(r->prompt);
	free(r->logits);
	free(r->t.ids);
	free(r->t.probs);
	free(r->t.top);
	free(r->t.weights);
	free(r->next);
	free(r->slots);
}

static int parse_half_lives(const char *s, double *out, uint32_t *ret_n)
{
	uint32_t n = 0;
	char buf[256];
	if (!s)
		s = "16";
	if (strlen(s) >= sizeof buf)
		return WF_EINVAL;
	strcpy(buf, s);
	char *save = NULL;
	for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		uint64_t v;
		if (n == MAX_HALF_LIVES || wf_parse_uint(tok, 1000000, &v) < 0)
			return WF_EINVAL;
		out[n++] = (double)v;
	}
	if (n == 0)
		return WF_EINVAL;
	*ret_n = n;
	return 0;
}

/* A hit-rate row; both rates 0 compare as equal (ratio 1), a candidate above an anchor of 0 has
 * no ratio and is reported as skipped. */
static void report_rate(const char *metric, double value, const char *anchor, double anchor_value,
                        const char *notes)
{
	if (anchor_value <= 0 && value > 0) {
		char why[200];
		snprintf(why, sizeof why, "the anchor (%s) hit nothing, this policy %.4f: no ratio",
		         anchor, value);
		bench_skip("cachepolicy", metric, why);
		return;
	}
	bench_report(&(struct bench_result){.bench = "cachepolicy",
	                                    .metric = metric,
	                                    .value = value,
	                                    .unit = "hit rate",
	                                    .anchor = anchor,
	                                    .anchor_value = anchor_value,
	                                    .ratio = anchor_value > 0 ? value / anchor_value : 1,
	                                    .notes = notes});
}

static const char *base_name(const char *path)
{
	const char *s = strrchr(path, '/');
	return s ? s + 1 : path;
}

int bench_cachepolicy(const struct bench_opts *o)
{
	char model_path[4200];
	struct run r = {0};
	struct wf_diag d = {{0}};
	int ret = 1, rc;
	double half_lives[MAX_HALF_LIVES];
	uint32_t n_hl;
	const uint32_t n_gen = o->tokens ? o->tokens : 256;

	if (o->model)
		snprintf(model_path, sizeof model_path, "%s", o->model);
	else
		snprintf(model_path, sizeof model_path, "%s/engine-qwen3moe-q4k.gguf", o->dir);
	if (parse_half_lives(o->half_life, half_lives, &n_hl) < 0) {
		fprintf(stderr, "wf-bench: --half-life '%s' is not a list of whole token counts\n",
		        o->half_life);
		return 2;
	}
	if (n_gen > MAX_TOKENS) {
		fprintf(stderr, "wf-bench: --tokens %u is more than %u\n", n_gen, MAX_TOKENS);
		return 2;
	}
	if ((rc = wf_model_open(model_path, &r.m, &d)) < 0 ||
	    (rc = wf_weight_view_map_files(r.m, &r.w, &d)) < 0) {
		fprintf(stderr, "wf-bench: %s: %s%s\n", model_path, wf_diag_str(&d, rc),
		        o->model ? ""
		                 : " (run `wf-bench engine` once to generate it, or give --model)");
		goto out;
	}

	/* The prompt: ids, a text through the model's tokenizer, or the reference prompt. */
	if (o->prompt_ids) {
		if (wf_parse_ids(o->prompt_ids, MAX_TOKENS, &r.prompt, &r.n_prompt) < 0) {
			fprintf(stderr, "wf-bench: --prompt-ids '%s' is not a list of ids\n",
			        o->prompt_ids);
			ret = 2;
			goto out;
		}
	} else if (o->prompt) {
		if ((rc = wf_tokenizer_create(&r.m->kv, &r.tok, &d)) < 0 ||
		    (rc = wf_tokenizer_encode(r.tok, o->prompt, strlen(o->prompt), true, false,
		                              &r.prompt, &r.n_prompt, &d)) < 0) {
			fprintf(stderr, "wf-bench: %s: tokenizer: %s\n", model_path,
			        wf_diag_str(&d, rc));
			goto out;
		}
	} else {
		r.n_prompt = sizeof default_prompt / sizeof *default_prompt;
		r.prompt = malloc(sizeof default_prompt);
		if (!r.prompt)
			goto out;
		memcpy(r.prompt, default_prompt, sizeof default_prompt);
	}
	if (r.n_prompt == 0 || r.n_prompt > MAX_TOKENS) {
		fprintf(stderr, "wf-bench: the prompt has %zu tokens (1..%u)\n", r.n_prompt,
		        MAX_TOKENS);
		goto out;
	}

	/* The down projections' sizes: the engine's slot (the largest) and the cache's size. */
	uint64_t down_all = 0, down_max = 0;
	for (uint32_t i = 0; i < r.m->n_tensors; i++) {
		const struct wf_tensor *t = &r.m->tensors[i];
		if (!strstr(t->name, "ffn_down_exps"))
			continue;
		const uint64_t n_x = t->n_dims > 2 ? (uint64_t)t->ne[2] : 1;
		down_all += t->nbytes;
		if (t->nbytes / n_x > down_max)
			down_max = t->nbytes / n_x;
	}
	if (!down_max) {
		fprintf(stderr, "wf-bench: %s has no routed experts\n", model_path);
		goto out;
	}
	/* The engine that records the trace is also the one the simulator is checked against: a
	 * cache of a quarter of the down projections (at least 1 MiB, the option's unit). */
	const uint32_t cache_mb =
	    (uint32_t)(down_all / 4 >> 20) ? (uint32_t)(down_all / 4 >> 20) : 1;
	if ((rc = wf_device_open("host", &r.dev, &d)) < 0) {
		fprintf(stderr, "wf-bench: host device: %s\n", wf_diag_str(&d, rc));
		goto out;
	}
	struct wf_postfetch_settings pf;
	wf_postfetch_settings_default(&pf);
	/* n_ctx 0: the model's context (the tiny ones have 256); a run longer than that starts the
	 * sequence again from its last token, a new request to the same cache. */
	struct wf_engine_config cfg = {.n_ctx = 0,
	                               .n_seq_max = 1,
	                               .n_threads = o->threads,
	                               .device = r.dev,
	                               .postfetch = &pf,
	                               .expert_cache_mb = cache_mb};
	const struct wf_engine_weights weights = wf_weight_view_engine(&r.w);
	if ((rc = wf_engine_create(r.m, &weights, &cfg, &r.e, &d)) < 0) {
		fprintf(stderr, "wf-bench: engine: %s: %s\n", model_path, wf_diag_str(&d, rc));
		goto out;
	}
	struct wf_engine_info info;
	wf_engine_get_info(r.e, &info);
	if (!info.n_expert || info.n_expert > UINT16_MAX) {
		fprintf(stderr, "wf-bench: %s: %u experts: not a MoE model this mode takes\n",
		        model_path, info.n_expert);
		goto out;
	}
	for (size_t i = 0; i < r.n_prompt; i++)
		if (r.prompt[i] < 0 || (uint32_t)r.prompt[i] >= info.n_vocab) {
			fprintf(stderr, "wf-bench: prompt id %d is outside the vocabulary (%u)\n",
			        r.prompt[i], info.n_vocab);
			ret = 2;
			goto out;
		}

	struct trace *t = &r.t;
	t->n_layer = info.n_layer, t->n_expert = info.n_expert, t->k = info.n_expert_used;
	t->cap_steps = (uint32_t)r.n_prompt + n_gen;
	t->ids = malloc((size_t)t->cap_steps * t->n_layer * t->k * sizeof *t->ids);
	t->probs = malloc(t->n_expert * sizeof *t->probs);
	t->top = malloc(t->k * sizeof *t->top);
	t->weights = malloc(t->k * sizeof *t->weights);
	r.logits = malloc(info.n_vocab * sizeof *r.logits);
	if (!t->ids || !t->probs || !t->top || !t->weights || !r.logits)
		goto out;
	wf_engine_set_router_hook(r.e, on_router, t);
	wf_engine_reset_stats(r.e);

	/* One token a step: the prompt, then greedy decoding (ties to the lowest id). */
	int32_t token = r.prompt[0];
	uint32_t pos = 0, restarts = 0, n_distinct_gen = 0;
	uint64_t rng = 2;
	/* how varied the output is: a random model's greedy output tends to loop */
	uint8_t *generated = calloc(info.n_vocab, 1);
	if (!generated)
		goto out;
	const double t0 = bench_now();
	for (uint32_t step = 0; step < t->cap_steps; step++, pos++) {
		if (step < r.n_prompt)
			token = r.prompt[step];
		if (pos == info.n_ctx) {
			wf_engine_seq_truncate(r.e, 0, 0);
			pos = 0;
			restarts++;
		}
		uint32_t seq = 0;
		struct wf_engine_batch b = {.n = 1, .tokens = &token, .pos = &pos, .seq = &seq};
		t->step = step;
		if ((rc = wf_engine_decode(r.e, &b, r.logits, &d)) < 0) {
			fprintf(stderr, "wf-bench: decode: %s\n", wf_diag_str(&d, rc));
			goto out;
		}
		if (t->err) {
			fprintf(stderr, "wf-bench: the router hook gave an unexpected call\n");
			goto out;
		}
		t->n_steps = step + 1;
		uint32_t best = 0;
		for (uint32_t v = 1; v < info.n_vocab; v++)
			if (r.logits[v] > r.logits[best])
				best = v;
		if (o->random_tokens) { /* llama-bench's tg stream: no loop to repeat */
			rng = rng * 6364136223846793005ull + 1442695040888963407ull;
			best = (uint32_t)((rng >> 33) % info.n_vocab);
		}
		token = (int32_t)best;
		if (step + 1 >= r.n_prompt && !generated[best]) {
			generated[best] = 1;
			n_distinct_gen++;
		}
	}
	free(generated);
	const double secs = bench_now() - t0;
	struct wf_engine_stats st;
	wf_engine_get_stats(r.e, &st);
	/* The engine's own slots: whole experts (down, gate and up) since the cache keeps them so.
	 */
	const uint32_t engine_slots = info.n_slots;
	const size_t slot_bytes = info.n_slots ? info.slot_bytes / info.n_slots : 0;

	struct sim_trace tr = {.n_groups = t->n_steps * t->n_layer,
	                       .k = t->k,
	                       .n_layer = t->n_layer,
	                       .n_expert = t->n_expert,
	                       .ids = t->ids};
	const uint32_t n_keys = t->n_layer * t->n_expert;
	r.next = malloc((size_t)tr.n_groups * tr.k * sizeof *r.next);
	r.slots = malloc(t->n_layer * sizeof *r.slots);
	if (!r.next || !r.slots)
		goto out;
	tr.next = r.next;
	if (next_uses(&tr) < 0)
		goto out;

	/* The trace: how many experts it touches, and how concentrated the use is. */
	uint64_t accesses = (uint64_t)tr.n_groups * tr.k, distinct = 0;
	{
		uint32_t *count = calloc(n_keys, sizeof *count);
		if (!count)
			goto out;
		for (uint64_t i = 0; i < accesses; i++)
			count[(i / tr.k % tr.n_layer) * tr.n_expert + tr.ids[i]]++;
		for (uint32_t k = 0; k < n_keys; k++)
			distinct += count[k] > 0;
		/* the share of accesses the most used quarter of the experts takes (uniform: 25%)
		 */
		uint32_t *sorted = count;
		qsort(sorted, n_keys, sizeof *sorted, cmp_desc_u32);
		uint64_t top = 0;
		for (uint32_t k = 0; k < n_keys / 4; k++)
			top += sorted[k];
		free(count);
		char notes[512];
		snprintf(
		    notes, sizeof notes,
		    "%.120s: %u layers x %u experts, top %u; %u steps (%zu prompt + %u %s, one "
		    "token each, context %u, %u restarts from the last token; %u distinct tokens "
		    "generated) in %.1f s; %llu "
		    "accesses; the most used quarter of the experts takes %.1f%% of them",
		    base_name(model_path), t->n_layer, t->n_expert, t->k, t->n_steps, r.n_prompt,
		    n_gen, o->random_tokens ? "random" : "greedy", info.n_ctx, restarts,
		    n_distinct_gen, secs, (unsigned long long)accesses,
		    accesses ? 100.0 * (double)top / (double)accesses : 0);
		bench_report(&(struct bench_result){.bench = "cachepolicy",
		                                    .metric = "trace_distinct_experts",
		                                    .value = (double)distinct,
		                                    .unit = "experts",
		                                    .anchor = "layers x experts",
		                                    .anchor_value = n_keys,
		                                    .ratio = (double)distinct / n_keys,
		                                    .notes = notes});
	}

	/* The simulator against the engine's own count at the engine's slot count. */
	{
		struct sim_result s;
		if (simulate(&tr, POL_LRFU, WF_ENGINE_CACHE_HALF_LIFE, &engine_slots, 1, &s) < 0)
			goto out;
		char notes[400];
		snprintf(
		    notes, sizeof notes,
		    "engine: host device, post-fetch, expert cache %u MiB = %u slots of %zu bytes; "
		    "hits %llu misses %llu; simulated global LRFU, half-life %g tokens (the "
		    "engine's rule): hits %llu misses %llu",
		    cache_mb, engine_slots, slot_bytes, (unsigned long long)st.fetch_hits,
		    (unsigned long long)st.fetch_misses, WF_ENGINE_CACHE_HALF_LIFE,
		    (unsigned long long)s.hits, (unsigned long long)s.misses);
		if (!st.fetch_hits) {
			bench_skip("cachepolicy", "policy_sim_vs_engine_hits", notes);
		} else {
			bench_report(
			    &(struct bench_result){.bench = "cachepolicy",
			                           .metric = "policy_sim_vs_engine_hits",
			                           .value = (double)s.hits,
			                           .unit = "hits",
			                           .anchor = "the engine's fetch_hits",
			                           .anchor_value = (double)st.fetch_hits,
			                           .ratio = (double)s.hits / (double)st.fetch_hits,
			                           .notes = notes});
		}
		if (s.misses != st.fetch_misses)
			fprintf(stderr, "wf-bench: simulated LRFU misses %llu, the engine's %llu\n",
			        (unsigned long long)s.misses, (unsigned long long)st.fetch_misses);
	}

	static const uint32_t pct[] = {10, 25, 50, 100};
	for (size_t fi = 0; fi < sizeof pct / sizeof *pct; fi++) {
		uint32_t C = (uint32_t)((uint64_t)n_keys * pct[fi] / 100);
		if (C == 0)
			C = 1;
		struct sim_result lru_g, lru_l, bel, lrfu_g[MAX_HALF_LIVES], lrfu_l[MAX_HALF_LIVES];
		per_layer(C, t->n_layer, r.slots);
		if (simulate(&tr, POL_LRU, 0, &C, 1, &lru_g) < 0 ||
		    simulate(&tr, POL_LRU, 0, r.slots, t->n_layer, &lru_l) < 0 ||
		    simulate(&tr, POL_BELADY, 0, &C, 1, &bel) < 0)
			goto out;
		for (uint32_t h = 0; h < n_hl; h++)
			if (simulate(&tr, POL_LRFU, half_lives[h], &C, 1, &lrfu_g[h]) < 0 ||
			    simulate(&tr, POL_LRFU, half_lives[h], r.slots, t->n_layer,
			             &lrfu_l[h]) < 0)
				goto out;
		char metric[96], notes[400];
		const char *bel_anchor = "Belady (clairvoyant), same trace and slots";
		snprintf(
		    notes, sizeof notes,
		    "%.120s: %u slots of %u (%u%%); per layer: %u..%u; LRFU half-life %g tokens",
		    base_name(model_path), C, n_keys, pct[fi], r.slots[t->n_layer - 1], r.slots[0],
		    half_lives[0]);
		const double compulsory = 1.0 - (double)distinct / (double)accesses;
		snprintf(metric, sizeof metric, "hit_rate_belady_c%u", pct[fi]);
		report_rate(metric, rate(bel), "every expert cached (compulsory misses only)",
		            compulsory, notes);
		snprintf(metric, sizeof metric, "hit_rate_lru_global_c%u", pct[fi]);
		report_rate(metric, rate(lru_g), bel_anchor, rate(bel), notes);
		snprintf(metric, sizeof metric, "hit_rate_lru_layer_c%u", pct[fi]);
		report_rate(metric, rate(lru_l), bel_anchor, rate(bel), notes);
		for (uint32_t h = 0; h < n_hl; h++) {
			char tag[32] = "";
			if (h > 0)
				snprintf(tag, sizeof tag, "_h%g", half_lives[h]);
			snprintf(metric, sizeof metric, "hit_rate_lrfu%s_global_c%u", tag, pct[fi]);
			report_rate(metric, rate(lrfu_g[h]), bel_anchor, rate(bel), notes);
			snprintf(metric, sizeof metric, "hit_rate_lrfu%s_layer_c%u", tag, pct[fi]);
			report_rate(metric, rate(lrfu_l[h]), bel_anchor, rate(bel), notes);
		}
		if (pct[fi] == 100)
			continue; /* every policy holds everything: nothing to compare */
		const char *lru_anchor = "global LRU (the engine's rule), same trace and slots";
		snprintf(metric, sizeof metric, "lru_layer_vs_lru_hit_rate_c%u", pct[fi]);
		report_rate(metric, rate(lru_l), lru_anchor, rate(lru_g), notes);
		snprintf(metric, sizeof metric, "lrfu_vs_lru_hit_rate_c%u", pct[fi]);
		report_rate(metric, rate(lrfu_g[0]), lru_anchor, rate(lru_g), notes);
		snprintf(metric, sizeof metric, "lrfu_layer_vs_lru_hit_rate_c%u", pct[fi]);
		report_rate(metric, rate(lrfu_l[0]), lru_anchor, rate(lru_g), notes);
		snprintf(metric, sizeof metric, "belady_vs_lru_hit_rate_c%u", pct[fi]);
		report_rate(metric, rate(bel), lru_anchor, rate(lru_g), notes);
	}
	ret = 0;
out:
	run_fini(&r);
	return ret;
}
