/* The device weight budget: how many bytes of weights one device may hold, as pure arithmetic.
 *
 *   scratch_ceiling  = (1 - wiggle) * arena        room for weights and execution scratch, after a
 *                                                  safety margin for allocator slack and other
 *                                                  users of the device
 *   weight_pool      = min(fraction * arena, scratch_ceiling - max_scratch), at least 0
 *   on_demand_budget = clamp(weight_pool - pinned, 0, weight_pool)
 *
 * Pinned models (PINNED_DEVICE) are exempt from the budget: they are never evicted to make room,
 * but they do shrink what is left for models loaded on demand. Pinned bytes beyond the weight pool
 * are an over-commit: the control plane asked for it, so it is allowed, and flagged.
 *
 * Everything is computed in unsigned 64-bit bytes; each fraction is applied once and rounded to
 * the nearest byte. No I/O, no state: the functions are thread-safe. */
#ifndef WF_WORKER_DEVBUDGET_H
#define WF_WORKER_DEVBUDGET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define WF_DEVBUDGET_FRACTION_DEFAULT 0.90
#define WF_DEVBUDGET_WIGGLE_DEFAULT   0.05

struct wf_devbudget_in {
	uint64_t arena;         /* usable device memory, bytes */
	double weight_fraction; /* 0..1: the most of the arena weights may take */
	double wiggle_fraction; /* 0..1: kept free for allocator slack and foreign users */
	uint64_t max_scratch;   /* largest execution scratch (activations, KV) the engine needs */
	uint64_t pinned;        /* bytes of pinned (budget-exempt) device weights */
};

/* Every input and output, so that a status display can show how the numbers came about. */
struct wf_devbudget {
	struct wf_devbudget_in in;
	uint64_t fraction_cap;    /* weight_fraction * arena */
	uint64_t scratch_ceiling; /* (1 - wiggle_fraction) * arena */
	uint64_t weight_pool;
	uint64_t on_demand;     /* on_demand_budget */
	bool scratch_limited;   /* the scratch bound, not the fraction, decided weight_pool */
	bool scratch_overflow;  /* max_scratch > scratch_ceiling: no room for weights at all */
	bool pinned_overcommit; /* pinned > weight_pool */
};

/* Computes the budget. Returns 0 and *ret_budget, or WF_EINVAL when a fraction is outside [0, 1]
 * or not a number (ret_budget untouched). */
int wf_devbudget_compute(const struct wf_devbudget_in *in, struct wf_devbudget *ret_budget);

/* True when a model of `bytes` cannot fit in the on-demand budget even with nothing else loaded:
 * it can still be loaded (after evicting everything evictable) but is flagged. */
bool wf_devbudget_oversized(const struct wf_devbudget *budget, uint64_t bytes);

/* Which models to evict to make room is base/lru.h's call (wf_lru_plan), the planner the agent
 * and the expert cache share. */

#ifdef __cplusplus
}
#endif
#endif
