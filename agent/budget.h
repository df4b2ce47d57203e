/* Host-memory budget for floors: which unpinned, unused floors to evict, least recently used
 * first, so that a new floor fits. Pure arithmetic, no I/O: the registry describes its floors
 * and applies the plan. */
#ifndef WF_AGENT_BUDGET_H
#define WF_AGENT_BUDGET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct wf_budget_floor {
	uint64_t bytes;     /* region size counted against the budget */
	uint64_t last_used; /* monotonic stamp; smaller is older */
	bool pinned;        /* PINNED_HOST: never evicted */
	bool busy;          /* held by another process, or being materialized: not evictable now */
};

/* Plans room for `need` more bytes under `budget` with `used` bytes of floors present.
 * Writes the indices of floors to evict, oldest first, into victims (capacity n) and their count
 * into *ret_n_victims. Returns 0 when the plan fits; WF_ENO_SPACE when even evicting every
 * candidate would not make room (then nothing should be evicted), including when need alone
 * exceeds the budget. Deterministic: equal stamps break ties by index. */
int wf_budget_plan(const struct wf_budget_floor *floors, size_t n, uint64_t budget, uint64_t used,
		   uint64_t need, size_t *victims, size_t *ret_n_victims);

#endif
