/* The device budget as a table: every row is an input and the outputs it must give. */
#include "base/error.h"
#include "worker/devbudget.h"

#include <criterion/criterion.h>
#include <math.h>

#define MiB  (1ull << 20)
#define GiB  (1ull << 30)
#define R(x) ((uint64_t)((x) + 0.5)) /* the budget rounds to the nearest byte */

struct row {
	const char *what;
	struct wf_devbudget_in in;
	uint64_t fraction_cap, scratch_ceiling, weight_pool, on_demand;
	bool scratch_limited, scratch_overflow, pinned_overcommit;
};

/* clang-format off */
static const struct row rows[] = {
    {"plain 80 GiB, no scratch, no pins",
     {80 * GiB, 0.9, 0.05, 0, 0}, 72 * GiB, 76 * GiB, 72 * GiB, 72 * GiB, false, false, false},
    {"fraction caps (scratch small)",
     {100 * GiB, 0.5, 0.1, 10 * GiB, 0}, 50 * GiB, 90 * GiB, 50 * GiB, 50 * GiB, false, false,
     false},
    {"scratch limits (fraction large)",
     {100 * GiB, 1.0, 0.1, 30 * GiB, 0}, 100 * GiB, 90 * GiB, 60 * GiB, 60 * GiB, true, false,
     false},
    {"wiggle takes its share",
     {1000 * MiB, 1.0, 0.25, 0, 0}, 1000 * MiB, 750 * MiB, 750 * MiB, 750 * MiB, true, false,
     false},
    {"pinned shrink the on-demand budget",
     {100 * GiB, 0.8, 0.05, 0, 30 * GiB}, 80 * GiB, 95 * GiB, 80 * GiB, 50 * GiB, false, false,
     false},
    {"pinned exactly the pool",
     {100 * GiB, 0.8, 0.05, 0, 80 * GiB}, 80 * GiB, 95 * GiB, 80 * GiB, 0, false, false, false},
    {"pinned over-commit",
     {100 * GiB, 0.8, 0.05, 0, 81 * GiB}, 80 * GiB, 95 * GiB, 80 * GiB, 0, false, false, true},
    {"scratch bigger than the arena",
     {8 * GiB, 0.9, 0.05, 16 * GiB, 0}, R(0.9 * 8 * GiB), R(0.95 * 8 * GiB), 0,
     0, true, true, false},
    {"scratch bigger than the arena, with pins",
     {8 * GiB, 0.9, 0.05, 16 * GiB, 1}, R(0.9 * 8 * GiB), R(0.95 * 8 * GiB), 0,
     0, true, true, true},
    {"scratch exactly the ceiling",
     {1000, 1.0, 0.0, 1000, 0}, 1000, 1000, 0, 0, true, false, false},
    {"zero arena", {0, 0.9, 0.05, 0, 0}, 0, 0, 0, 0, false, false, false},
    {"zero arena, pins", {0, 0.9, 0.05, 0, 5}, 0, 0, 0, 0, false, false, true},
    {"zero fraction", {64 * MiB, 0.0, 0.0, 0, 0}, 0, 64 * MiB, 0, 0, false, false, false},
    {"full wiggle", {64 * MiB, 1.0, 1.0, 0, 0}, 64 * MiB, 0, 0, 0, true, false, false},
    {"odd sizes round", {1001, 0.5, 0.5, 0, 0}, 501, 501, 501, 501, false, false, false},
    {"a tenth of odd", {1005, 0.1, 0.0, 0, 0}, 101, 1005, 101, 101, false, false, false},
    {"huge arena does not overflow",
     {UINT64_MAX, 1.0, 0.0, 0, 0}, UINT64_MAX, UINT64_MAX, UINT64_MAX, UINT64_MAX, false, false,
     false},
};
/* clang-format on */

Test(devbudget, table)
{
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		const struct row *r = &rows[i];
		struct wf_devbudget b;

		cr_assert_eq(wf_devbudget_compute(&r->in, &b), 0, "%s", r->what);
		cr_expect_eq(b.fraction_cap, r->fraction_cap, "%s: fraction_cap %lu", r->what,
		             (unsigned long)b.fraction_cap);
		cr_expect_eq(b.scratch_ceiling, r->scratch_ceiling, "%s: ceiling %lu", r->what,
		             (unsigned long)b.scratch_ceiling);
		cr_expect_eq(b.weight_pool, r->weight_pool, "%s: pool %lu", r->what,
		             (unsigned long)b.weight_pool);
		cr_expect_eq(b.on_demand, r->on_demand, "%s: on_demand %lu", r->what,
		             (unsigned long)b.on_demand);
		cr_expect_eq(b.scratch_limited, r->scratch_limited, "%s: scratch_limited", r->what);
		cr_expect_eq(b.scratch_overflow, r->scratch_overflow, "%s: overflow", r->what);
		cr_expect_eq(b.pinned_overcommit, r->pinned_overcommit, "%s: overcommit", r->what);
		cr_expect(b.on_demand <= b.weight_pool, "%s: on_demand within pool", r->what);
		cr_expect(b.weight_pool <= b.in.arena, "%s: pool within arena", r->what);
		cr_expect_eq(b.in.pinned, r->in.pinned, "%s: inputs kept", r->what);
	}
}

Test(devbudget, bad_fractions)
{
	struct wf_devbudget b = {.on_demand = 42};
	const double bad[] = {-0.01, 1.01, NAN, INFINITY};

	for (size_t i = 0; i < 4; i++) {
		struct wf_devbudget_in in = {GiB, bad[i], 0.05, 0, 0};
		cr_expect_eq(wf_devbudget_compute(&in, &b), WF_EINVAL, "fraction %g", bad[i]);
		in = (struct wf_devbudget_in){GiB, 0.9, bad[i], 0, 0};
		cr_expect_eq(wf_devbudget_compute(&in, &b), WF_EINVAL, "wiggle %g", bad[i]);
	}
	cr_expect_eq(b.on_demand, 42, "output untouched on failure");
}

Test(devbudget, model_bigger_than_budget)
{
	struct wf_devbudget b;
	struct wf_devbudget_in in = {64 * MiB, 0.9, 0.05, 0, 0};

	cr_assert_eq(wf_devbudget_compute(&in, &b), 0);
	cr_expect(!wf_devbudget_oversized(&b, b.on_demand));
	cr_expect(wf_devbudget_oversized(&b, b.on_demand + 1));
	in.pinned = 50 * MiB;
	cr_assert_eq(wf_devbudget_compute(&in, &b), 0);
	cr_expect(wf_devbudget_oversized(&b, 10 * MiB), "pins leave less room");
}
