/* wf-bench output: one result per line, JSON (--json) or a readable table.
 *
 * JSON fields: bench, metric, value, unit, anchor, anchor_value, ratio, goal, goal_op ("<=" or
 * ">="), pass, plus free-form notes and the kernels' SIMD level (kernels); or, for a figure that
 * could not be measured here, bench, metric and skipped (the reason), never a made-up value. */
#ifndef WF_BENCH_REPORT_H
#define WF_BENCH_REPORT_H

#include <stdbool.h>

struct bench_result {
	const char *bench, *metric, *unit;
	double value;
	const char *anchor; /* what value was compared with, measured in the same run */
	double anchor_value;
	double ratio; /* value / anchor_value, or as the metric defines it */
	double goal;
	const char *goal_op; /* ">=" or "<=", NULL: no goal on this machine (the row is a record) */
	const char *notes;   /* optional */
	const char *kernels; /* optional: the CPU kernels' SIMD level the figure ran with */
};

void bench_report_init(bool json);
void bench_report(const struct bench_result *r);
void bench_skip(const char *bench, const char *metric, const char *reason);

#endif
