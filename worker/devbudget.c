#include "worker/devbudget.h"

#include "base/error.h"

#include <math.h>
#include <stdlib.h>

static bool fraction_ok(double f)
{
	return !isnan(f) && f >= 0.0 && f <= 1.0;
}

/* f * v rounded to the nearest byte, never outside [0, v]. Nearest, not floor: fractions such as
 * 0.95 have no exact binary form, and flooring 0.9499999... * 80 GiB would leave a budget one
 * byte short of what the operator wrote. Long double keeps 64 bits of an arena exact on x86-64;
 * the clamp covers platforms where it is a plain double. */
static uint64_t scale(uint64_t v, long double f)
{
	long double x = roundl((long double)v * f);

	if (x <= 0.0L)
		return 0;
	if (x >= (long double)v)
		return v;
	return (uint64_t)x;
}

int wf_devbudget_compute(const struct wf_devbudget_in *in, struct wf_devbudget *ret_budget)
{
	struct wf_devbudget b = {0};

	if (!in || !ret_budget || !fraction_ok(in->weight_fraction) ||
	    !fraction_ok(in->wiggle_fraction))
		return WF_EINVAL;
	b.in = *in;
	b.fraction_cap = scale(in->arena, in->weight_fraction);
	b.scratch_ceiling = scale(in->arena, 1.0L - (long double)in->wiggle_fraction);
	if (in->max_scratch > b.scratch_ceiling) {
		b.scratch_overflow = true;
		b.scratch_limited = true;
		b.weight_pool = 0;
	} else {
		uint64_t room = b.scratch_ceiling - in->max_scratch;
		b.scratch_limited = room < b.fraction_cap;
		b.weight_pool = b.scratch_limited ? room : b.fraction_cap;
	}
	b.pinned_overcommit = in->pinned > b.weight_pool;
	b.on_demand = b.pinned_overcommit ? 0 : b.weight_pool - in->pinned;
	*ret_budget = b;
	return 0;
}

bool wf_devbudget_oversized(const struct wf_devbudget *budget, uint64_t bytes)
{
	return bytes > budget->on_demand;
}
