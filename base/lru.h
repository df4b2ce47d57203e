/* The project's one LRU planner: which items to evict, least recently used first, so that `need`
 * more bytes fit under a budget. Pure arithmetic, no I/O, no allocation, no state: the caller
 * describes what it holds, applies the plan, and re-plans if the world moved meanwhile.
 *
 * Two budgets use it: the agent's host budget for floors (agent/floors.c) and the worker's device
 * budget for weight sets and engines (worker/manager.c). One policy for both means one set of
 * tie-break, over-size and "nothing movable" rules to reason about.
 *
 * The engine's expert cache (engine/fetch.c) picks its victims with LRFU instead (below): its
 * items are experts looked up by every layer of every token, and plain LRU evicts a layer's
 * experts for the other layers' before the next token needs them whenever the cache holds less
 * than one token's working set (docs/BENCHMARKS.md, "Expert cache policy"). */
#ifndef WF_BASE_LRU_H
#define WF_BASE_LRU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct wf_lru_item {
	uint64_t bytes;     /* counted against the budget */
	uint64_t last_used; /* monotonic stamp; smaller is older */
	bool pinned;        /* never evicted (by policy) */
	bool busy;          /* not evictable now (held by a request or another process) */
};

enum wf_lru_fit {
	WF_LRU_FITS = 0,  /* evicting the victims (maybe none) makes room */
	WF_LRU_OVERSIZED, /* need > budget and nothing unevictable is held: the victims are every
	                     evictable item; whether to go ahead (flagged) is the caller's call */
	WF_LRU_NO_ROOM,   /* unevictable items leave too little room: no victims proposed,
	                     evicting would destroy work for nothing */
};

/* Plans room for `need` more bytes under `budget` with `used` bytes present. `used` may exceed
 * the items' sum (bytes the caller holds but cannot evict, e.g. a floor being materialized);
 * items' bytes above `used` are not trusted. Writes the indices of the items to evict, oldest
 * first (equal stamps: lower index first), into victims (capacity n) and their count into
 * *ret_n_victims; victims doubles as scratch. O(n log n). */
enum wf_lru_fit wf_lru_plan(const struct wf_lru_item *items, size_t n, uint64_t budget,
                            uint64_t used, uint64_t need, size_t *victims, size_t *ret_n_victims);

/* The oldest evictable item's index, or n when none: for room the budget allows but the device
 * refuses (fragmentation), where the only plan is "one more". */
size_t wf_lru_oldest(const struct wf_lru_item *items, size_t n);

/* LRFU (Lee et al., 2001): each key's combined recency and frequency, a score that gains 1 per
 * use and halves every 1/lambda stamps. lambda 0: no decay (LFU). */
struct wf_lrfu_score {
	double crf;     /* the score at `stamp` */
	uint64_t stamp; /* of its last use */
};

/* The score at stamp now (>= s->stamp). */
double wf_lrfu_value(const struct wf_lrfu_score *s, uint64_t now, double lambda);
/* A use at stamp now: crf = value(now) + 1. */
void wf_lrfu_touch(struct wf_lrfu_score *s, uint64_t now, double lambda);
/* A score's rank: log2(crf) + lambda * stamp (-INFINITY for crf 0). Ranks order scores as their
 * values at any one time do (the value's log2 is the rank less lambda * now, a term common to
 * all), and a rank changes only when its key is used: a cache keeps one per slot and never
 * decays the others. */
double wf_lrfu_rank(const struct wf_lrfu_score *s, double lambda);
/* The victim among the evictable items (not pinned, not busy): the lowest value (the caller's
 * ranks, or values at one time; -INFINITY for an empty item, so empty ones go first), then the
 * older last_used, then the lower index; n when none is evictable. */
size_t wf_lrfu_victim(const struct wf_lru_item *items, const double *value, size_t n);

#ifdef __cplusplus
}
#endif
#endif
