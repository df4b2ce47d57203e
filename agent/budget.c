#include "agent/budget.h"

#include "base/error.h"

int wf_budget_plan(const struct wf_budget_floor *floors, size_t n, uint64_t budget, uint64_t used,
		   uint64_t need, size_t *victims, size_t *ret_n_victims)
{
	*ret_n_victims = 0;
	if (need > budget)
		return WF_ENO_SPACE;
	if (used <= budget - need)
		return 0;
	uint64_t to_free = used - (budget - need);

	/* Selection by repeated minimum: n is the number of floors on one node (tens), and this
	 * keeps the plan allocation-free. */
	size_t k = 0;
	uint64_t freed = 0;
	while (freed < to_free) {
		size_t best = n;
		for (size_t i = 0; i < n; i++) {
			if (floors[i].pinned || floors[i].busy)
				continue;
			bool taken = false;
			for (size_t j = 0; j < k; j++)
				taken |= victims[j] == i;
			if (taken)
				continue;
			if (best == n || floors[i].last_used < floors[best].last_used)
				best = i;
		}
		if (best == n)
			return WF_ENO_SPACE;
		victims[k++] = best;
		freed += floors[best].bytes;
	}
	*ret_n_victims = k;
	return 0;
}
