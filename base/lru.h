/* The project's one LRU planner: which items to evict, least recently used first, so that `need`
 * more bytes fit under a budget. Pure arithmetic, no I/O, no allocation, no state: the caller
 * describes what it holds, applies the plan, and re-plans if the world moved meanwhile.
 *
 * Three budgets use it: the agent's host budget for floors (agent/floors.c), the worker's device
 * budget for weight sets (worker/manager.c), and the expert cache of the CUDA engine, whose items
 * are expert slices (one weight set each). One policy for all three means one set of tie-break,
 * over-size and "nothing movable" rules to reason about. */
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

#ifdef __cplusplus
}
#endif
#endif
