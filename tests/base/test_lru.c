/* The one LRU planner (base/lru.h): the cases of the agent's floor budget and the worker's device
 * budget, which used to have a planner each. */
#include "base/lru.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>

Test(lru, evicts_lru_unpinned_idle_only)
{
	struct wf_lru_item f[] = {
	    {.bytes = 40, .last_used = 5},                 /* 0 */
	    {.bytes = 30, .last_used = 1, .pinned = true}, /* 1: oldest but pinned */
	    {.bytes = 20, .last_used = 2},                 /* 2: oldest evictable */
	    {.bytes = 10, .last_used = 3, .busy = true},   /* 3: held by a worker */
	};
	size_t v[4], nv = 99;
	/* budget 100, used 100: room for 15 needs 20 (item 2) alone. */
	cr_assert_eq(wf_lru_plan(f, 4, 100, 100, 15, v, &nv), WF_LRU_FITS);
	cr_assert_eq(nv, 1);
	cr_assert_eq(v[0], 2);
	/* room for 50: item 2 then item 0. */
	cr_assert_eq(wf_lru_plan(f, 4, 100, 100, 50, v, &nv), WF_LRU_FITS);
	cr_assert_eq(nv, 2);
	cr_assert_eq(v[0], 2);
	cr_assert_eq(v[1], 0);
	/* room for 61 would need pinned or busy items: refused, nothing planned. */
	cr_assert_eq(wf_lru_plan(f, 4, 100, 100, 61, v, &nv), WF_LRU_NO_ROOM);
	cr_assert_eq(nv, 0);
	/* fits without eviction. */
	cr_assert_eq(wf_lru_plan(f, 4, 200, 100, 100, v, &nv), WF_LRU_FITS);
	cr_assert_eq(nv, 0);
	/* larger than the whole budget with pinned bytes present: no room. */
	cr_assert_eq(wf_lru_plan(f, 4, 100, 100, 101, v, &nv), WF_LRU_NO_ROOM);
	/* used beyond the items (a floor being materialized) counts as unevictable. */
	struct wf_lru_item g[] = {{.bytes = 10, .last_used = 7}, {.bytes = 10, .last_used = 7}};
	cr_assert_eq(wf_lru_plan(g, 2, 40, 40, 20, v, &nv), WF_LRU_FITS);
	cr_assert_eq(nv, 2);
	cr_assert_eq(wf_lru_plan(g, 2, 40, 40, 21, v, &nv), WF_LRU_NO_ROOM);
	/* ties by index. */
	cr_assert_eq(wf_lru_plan(g, 2, 20, 20, 10, v, &nv), WF_LRU_FITS);
	cr_assert_eq(nv, 1);
	cr_assert_eq(v[0], 0);
}

struct plan_row {
	const char *what;
	struct wf_lru_item e[6];
	size_t n;
	uint64_t budget, need;
	enum wf_lru_fit fit;
	size_t victims[6];
	size_t n_victims;
};

#define IT(b, s, busy_)                                                                            \
	{                                                                                          \
		.bytes = (b), .last_used = (s), .busy = (busy_)                                    \
	}

/* clang-format off */
static const struct plan_row plans[] = {
    {"fits without eviction", {IT(10, 1, 0), IT(10, 2, 0)}, 2, 100, 50, WF_LRU_FITS, {0}, 0},
    {"evicts oldest first", {IT(30, 5, 0), IT(30, 1, 0), IT(30, 3, 0)}, 3, 100, 41, WF_LRU_FITS,
     {1, 2}, 2},
    {"skips acquired", {IT(30, 5, 0), IT(30, 1, 1), IT(30, 3, 0)}, 3, 100, 41, WF_LRU_FITS,
     {2, 0}, 2},
    {"ties by index", {IT(30, 7, 0), IT(30, 7, 0), IT(30, 7, 0)}, 3, 100, 20, WF_LRU_FITS, {0}, 1},
    {"acquired leave too little", {IT(60, 1, 1), IT(30, 2, 0)}, 2, 100, 50, WF_LRU_NO_ROOM, {0},
     0},
    {"oversized: everything goes", {IT(30, 2, 0), IT(30, 1, 0)}, 2, 100, 150, WF_LRU_OVERSIZED,
     {1, 0}, 2},
    {"oversized with nothing loaded", {{0}}, 0, 100, 150, WF_LRU_OVERSIZED, {0}, 0},
    {"oversized but something is acquired", {IT(30, 2, 1)}, 1, 100, 150, WF_LRU_NO_ROOM, {0}, 0},
    {"zero budget, zero need", {{0}}, 0, 0, 0, WF_LRU_FITS, {0}, 0},
    {"already over budget (pins grew)", {IT(80, 1, 0), IT(80, 2, 0)}, 2, 100, 0, WF_LRU_FITS,
     {0}, 1},
    {"exact fit", {IT(50, 1, 0)}, 1, 100, 50, WF_LRU_FITS, {0}, 0},
    {"six, stamps reversed", {IT(10, 6, 0), IT(10, 5, 0), IT(10, 4, 0), IT(10, 3, 0),
     IT(10, 2, 0), IT(10, 1, 0)}, 6, 60, 30, WF_LRU_FITS, {5, 4, 3}, 3},
};
/* clang-format on */

Test(lru, plan_table)
{
	for (size_t i = 0; i < sizeof(plans) / sizeof(plans[0]); i++) {
		const struct plan_row *p = &plans[i];
		uint64_t used = 0;
		size_t victims[6] = {0}, nv = 99;

		for (size_t k = 0; k < p->n; k++)
			used += p->e[k].bytes;
		enum wf_lru_fit fit =
		    wf_lru_plan(p->e, p->n, p->budget, used, p->need, victims, &nv);
		cr_expect_eq(fit, p->fit, "%s: fit %d", p->what, fit);
		cr_expect_eq(nv, p->n_victims, "%s: %zu victims", p->what, nv);
		for (size_t k = 0; k < nv && k < p->n_victims; k++)
			cr_expect_eq(victims[k], p->victims[k], "%s: victim %zu is %zu", p->what, k,
			             victims[k]);
	}
}

/* Against a plain O(n^2) selection on random inputs: the heap order is the LRU order. */
Test(lru, matches_repeated_minimum)
{
	enum { N = 200 };
	struct wf_lru_item it[N];
	size_t v[N], nv;
	unsigned seed = 12345;

	for (int round = 0; round < 50; round++) {
		uint64_t used = 0;
		for (size_t i = 0; i < N; i++) {
			it[i] = (struct wf_lru_item){.bytes = 1 + rand_r(&seed) % 100,
			                             .last_used = rand_r(&seed) % 40,
			                             .pinned = rand_r(&seed) % 10 == 0,
			                             .busy = rand_r(&seed) % 10 == 0};
			used += it[i].bytes;
		}
		uint64_t need = rand_r(&seed) % 3000;
		enum wf_lru_fit fit = wf_lru_plan(it, N, used, used, need, v, &nv);
		if (fit == WF_LRU_NO_ROOM) {
			cr_assert_eq(nv, 0);
			continue;
		}
		bool taken[N] = {0};
		uint64_t freed = 0;
		for (size_t k = 0; k < nv; k++) {
			size_t best = wf_lru_oldest(it, N), j;
			for (j = 0; j < N; j++)
				if (!taken[j] && !it[j].pinned && !it[j].busy &&
				    (taken[best] || it[j].last_used < it[best].last_used ||
				     (it[j].last_used == it[best].last_used && j < best)))
					best = j;
			cr_assert_eq(v[k], best, "round %d victim %zu", round, k);
			taken[best] = true;
			freed += it[best].bytes;
		}
		cr_assert_geq(freed, need);
		if (nv)
			cr_assert_lt(freed - it[v[nv - 1]].bytes, need, "round %d: one too many",
			             round);
	}
}

/* LRFU: a use adds 1, the score halves every 1/lambda stamps; the victim is an empty item first,
 * then the lowest score, then the older stamp, then the lower index, never a busy or pinned one. */
Test(lru, lrfu_scores_decay_and_pick_the_coldest)
{
	struct wf_lrfu_score s = {0};
	wf_lrfu_touch(&s, 10, 0.25);
	cr_expect_float_eq(s.crf, 1.0, 1e-12);
	cr_expect_float_eq(wf_lrfu_value(&s, 14, 0.25), 0.5, 1e-12, "one half-life later");
	wf_lrfu_touch(&s, 14, 0.25);
	cr_expect_float_eq(s.crf, 1.5, 1e-12);
	cr_expect_eq(s.stamp, 14);
	struct wf_lrfu_score lfu = {0};
	wf_lrfu_touch(&lfu, 1, 0);
	wf_lrfu_touch(&lfu, 900, 0);
	cr_expect_float_eq(lfu.crf, 2.0, 1e-12, "lambda 0 is LFU: no decay");

	struct wf_lru_item it[5] = {{.bytes = 1, .last_used = 5},
	                            {.bytes = 1, .last_used = 3},
	                            {.bytes = 1, .last_used = 4},
	                            {.bytes = 1, .last_used = 1, .busy = true},
	                            {.bytes = 1, .last_used = 0, .pinned = true}};
	double v[5] = {2.0, 1.0, 1.0, 0.1, 0.0};
	cr_expect_eq(wf_lrfu_victim(it, v, 5), 1, "lowest score, the older of a tie");
	v[2] = 0.5;
	cr_expect_eq(wf_lrfu_victim(it, v, 5), 2, "lowest score");
	v[0] = -INFINITY;
	cr_expect_eq(wf_lrfu_victim(it, v, 5), 0, "an empty item first");
	it[0].busy = it[1].busy = it[2].busy = true;
	cr_expect_eq(wf_lrfu_victim(it, v, 5), 5, "nothing evictable: busy and pinned stay");
}

/* Ranks order scores as their values at any one time do, so a cache compares ranks that change
 * only on use instead of decaying every score at every miss. */
Test(lru, lrfu_ranks_order_as_values_do)
{
	const double lambda = 1.0 / 48.0;
	struct wf_lrfu_score s[64] = {{0}};
	unsigned seed = 7;
	for (uint64_t now = 1; now <= 4000; now++) {
		seed = seed * 1103515245u + 12345u;
		wf_lrfu_touch(&s[(seed >> 16) % 64], now, lambda);
	}
	const uint64_t now = 4100;
	for (int i = 0; i < 64; i++)
		for (int j = 0; j < 64; j++) {
			const double vi = wf_lrfu_value(&s[i], now, lambda),
			             vj = wf_lrfu_value(&s[j], now, lambda);
			if (fabs(vi - vj) > 1e-9 * (vi + vj))
				cr_assert_eq(vi < vj,
				             wf_lrfu_rank(&s[i], lambda) <
				                 wf_lrfu_rank(&s[j], lambda),
				             "scores %d and %d", i, j);
		}
	struct wf_lrfu_score never = {0};
	cr_expect(isinf(wf_lrfu_rank(&never, lambda)) && wf_lrfu_rank(&never, lambda) < 0);
}
