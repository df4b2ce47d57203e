/* The metrics registry's text rendering (http/metrics.h): exact Prometheus 0.0.4 text for each
 * type, label escaping, bad UTF-8, names refused, the series cap, counters that never go down,
 * collectors, and numbers as the format reads them. */
#include "base/error.h"
#include "http/metrics.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char DROPPED0[] =
    "# HELP weightfloor_metrics_dropped_total Series updates dropped (too many series in a "
    "family, or no memory).\n"
    "# TYPE weightfloor_metrics_dropped_total counter\n"
    "weightfloor_metrics_dropped_total 0\n";

static char *render(struct wf_metrics *reg)
{
	char *text = NULL;
	size_t len = 0;
	cr_assert_eq(wf_metrics_render(reg, &text, &len), 0);
	cr_assert_eq(strlen(text), len);
	return text;
}

/* The text up to the registry's own dropped counter, which every render ends with. */
static char *families(struct wf_metrics *reg)
{
	char *t = render(reg);
	char *d = strstr(t, "# HELP weightfloor_metrics_dropped_total");
	cr_assert_not_null(d);
	*d = '\0';
	return t;
}

Test(http_metrics, empty_registry_renders_only_the_dropped_counter)
{
	struct wf_metrics *reg;
	cr_assert_eq(wf_metrics_create(&reg), 0);
	char *t = render(reg);
	cr_assert_str_eq(t, DROPPED0);
	free(t);
	wf_metrics_destroy(reg);
}

Test(http_metrics, counter_and_gauge_text)
{
	struct wf_metrics *reg;
	struct wf_metric *c, *g;
	cr_assert_eq(wf_metrics_create(&reg), 0);
	cr_assert_eq(wf_metrics_add(reg, WF_METRIC_COUNTER, "wf_requests_total", "Requests.",
	                            (const char *const[]){"kind", "status", NULL}, NULL, 0, &c),
	             0);
	cr_assert_eq(
	    wf_metrics_add(reg, WF_METRIC_GAUGE, "wf_bytes", "Bytes held.", NULL, NULL, 0, &g), 0);
	cr_assert_eq(wf_metric_add(c, (const char *[]){"pin", "OK"}, 1), 0);
	cr_assert_eq(wf_metric_add(c, (const char *[]){"pin", "OK"}, 2), 0);
	cr_assert_eq(wf_metric_add(c, (const char *[]){"evict", "NOT_FOUND"}, 1), 0);
	cr_assert_eq(wf_metric_set(g, NULL, 6486752), 0);
	cr_assert_eq(wf_metric_add(g, NULL, -2), 0);
	char *t = families(reg);
	cr_assert_str_eq(t, "# HELP wf_requests_total Requests.\n"
	                    "# TYPE wf_requests_total counter\n"
	                    "wf_requests_total{kind=\"pin\",status=\"OK\"} 3\n"
	                    "wf_requests_total{kind=\"evict\",status=\"NOT_FOUND\"} 1\n"
	                    "# HELP wf_bytes Bytes held.\n"
	                    "# TYPE wf_bytes gauge\n"
	                    "wf_bytes 6486750\n");
	free(t);
	wf_metrics_destroy(reg);
}

Test(http_metrics, histogram_buckets_are_cumulative_with_inf_sum_and_count)
{
	struct wf_metrics *reg;
	struct wf_metric *h;
	cr_assert_eq(wf_metrics_create(&reg), 0);
	const double b[] = {0.5, 1, 2.5};
	cr_assert_eq(wf_metrics_add(reg, WF_METRIC_HISTOGRAM, "wf_seconds", "Durations.",
	                            (const char *const[]){"kind", NULL}, b, 3, &h),
	             0);
	const double obs[] = {0.1, 0.5, 0.7, 3, 100};
	for (size_t i = 0; i < 5; i++)
		cr_assert_eq(wf_metric_observe(h, (const char *[]){"x"}, obs[i]), 0);
	char *t = families(reg);
	cr_assert_str_eq(t, "# HELP wf_seconds Durations.\n"
	                    "# TYPE wf_seconds histogram\n"
	                    "wf_seconds_bucket{kind=\"x\",le=\"0.5\"} 2\n"
	                    "wf_seconds_bucket{kind=\"x\",le=\"1\"} 3\n"
	                    "wf_seconds_bucket{kind=\"x\",le=\"2.5\"} 3\n"
	                    "wf_seconds_bucket{kind=\"x\",le=\"+Inf\"} 5\n"
	                    "wf_seconds_sum{kind=\"x\"} 104.3\n"
	                    "wf_seconds_count{kind=\"x\"} 5\n");
	free(t);
	/* Without labels, le is the only label. */
	struct wf_metric *h2;
	cr_assert_eq(wf_metrics_add(reg, WF_METRIC_HISTOGRAM, "wf_h2", "H.", NULL, b, 1, &h2), 0);
	cr_assert_eq(wf_metric_observe(h2, NULL, 7), 0);
	t = render(reg);
	cr_assert_not_null(strstr(t, "wf_h2_bucket{le=\"0.5\"} 0\nwf_h2_bucket{le=\"+Inf\"} 1\n"
	                             "wf_h2_sum 7\nwf_h2_count 1\n"),
	                   "%s", t);
	free(t);
	wf_metrics_destroy(reg);
}

Test(http_metrics, label_values_and_help_are_escaped_and_bad_utf8_replaced)
{
	struct wf_metrics *reg;
	struct wf_metric *g;
	cr_assert_eq(wf_metrics_create(&reg), 0);
	cr_assert_eq(wf_metrics_add(reg, WF_METRIC_GAUGE, "wf_g", "A \\ backslash.",
	                            (const char *const[]){"model", NULL}, NULL, 0, &g),
	             0);
	cr_assert_eq(wf_metric_set(g, (const char *[]){"a\"b\\c\nd"}, 1), 0);
	cr_assert_eq(wf_metric_set(g, (const char *[]){"caf\xc3\xa9 \xff\xc3 \xed\xa0\x80"}, 2), 0);
	cr_assert_eq(wf_metric_set(g, (const char *[]){NULL}, 3), 0);
	char *t = families(reg);
	cr_assert_str_eq(t, "# HELP wf_g A \\\\ backslash.\n"
	                    "# TYPE wf_g gauge\n"
	                    "wf_g{model=\"a\\\"b\\\\c\\nd\"} 1\n"
	                    "wf_g{model=\"caf\xc3\xa9 ?? ???\"} 2\n"
	                    "wf_g{model=\"\"} 3\n");
	free(t);
	wf_metrics_destroy(reg);
}

Test(http_metrics, numbers_as_the_format_reads_them)
{
	struct wf_metrics *reg;
	struct wf_metric *g;
	cr_assert_eq(wf_metrics_create(&reg), 0);
	cr_assert_eq(wf_metrics_add(reg, WF_METRIC_GAUGE, "wf_n", "N.",
	                            (const char *const[]){"v", NULL}, NULL, 0, &g),
	             0);
	wf_metric_set(g, (const char *[]){"inf"}, INFINITY);
	wf_metric_set(g, (const char *[]){"ninf"}, -INFINITY);
	wf_metric_set(g, (const char *[]){"nan"}, NAN);
	wf_metric_set(g, (const char *[]){"big"}, 1e300);
	wf_metric_set(g, (const char *[]){"third"}, 1.0 / 3.0);
	wf_metric_set(g, (const char *[]){"neg"}, -42);
	char *t = families(reg);
	cr_assert_not_null(strstr(t, "wf_n{v=\"inf\"} +Inf\n"), "%s", t);
	cr_assert_not_null(strstr(t, "wf_n{v=\"ninf\"} -Inf\n"), "%s", t);
	cr_assert_not_null(strstr(t, "wf_n{v=\"nan\"} NaN\n"), "%s", t);
	cr_assert_not_null(strstr(t, "wf_n{v=\"big\"} 1e+300\n"), "%s", t);
	cr_assert_not_null(strstr(t, "wf_n{v=\"third\"} 0.33333333333333331\n"), "%s", t);
	cr_assert_not_null(strstr(t, "wf_n{v=\"neg\"} -42\n"), "%s", t);
	free(t);
	wf_metrics_destroy(reg);
}

Test(http_metrics, bad_names_labels_and_bounds_are_refused)
{
	struct wf_metrics *reg;
	struct wf_metric *m;
	const double b[] = {1, 2}, bad_b[] = {2, 1}, nan_b[] = {NAN};
	cr_assert_eq(wf_metrics_create(&reg), 0);
	cr_assert_eq(
	    wf_metrics_add(reg, WF_METRIC_COUNTER, "wf_requests", "no _total", NULL, NULL, 0, &m),
	    WF_EINVAL);
	cr_assert_eq(wf_metrics_add(reg, WF_METRIC_GAUGE, "9lives", "h", NULL, NULL, 0, &m),
	             WF_EINVAL);
	cr_assert_eq(wf_metrics_add(reg, WF_METRIC_GAUGE, "wf-dash", "h", NULL, NULL, 0, &m),
	             WF_EINVAL);
	cr_assert_eq(wf_metrics_add(reg, WF_METRIC_GAUGE, "wf_g", "two\nlines", NULL, NULL, 0, &m),
	             WF_EINVAL);
	cr_assert_eq(wf_metrics_add(reg, WF_METRIC_GAUGE, "wf_g", "h",
	                            (const char *const[]){"__reserved", NULL}, NULL, 0, &m),
	             WF_EINVAL);
	cr_assert_eq(wf_metrics_add(reg, WF_METRIC_GAUGE, "wf_g", "h",
	                            (const char *const[]){"a:b", NULL}, NULL, 0, &m),
	             WF_EINVAL);
	cr_assert_eq(wf_metrics_add(reg, WF_METRIC_GAUGE, "wf_g", "h",
	                            (const char *const[]){"a", "b", "c", "d", "e", NULL}, NULL, 0,
	                            &m),
	             WF_EINVAL);
	cr_assert_eq(wf_metrics_add(reg, WF_METRIC_HISTOGRAM, "wf_h", "h",
	                            (const char *const[]){"le", NULL}, b, 2, &m),
	             WF_EINVAL);
	cr_assert_eq(wf_metrics_add(reg, WF_METRIC_HISTOGRAM, "wf_h", "h", NULL, bad_b, 2, &m),
	             WF_EINVAL);
	cr_assert_eq(wf_metrics_add(reg, WF_METRIC_HISTOGRAM, "wf_h", "h", NULL, nan_b, 1, &m),
	             WF_EINVAL);
	cr_assert_eq(wf_metrics_add(reg, WF_METRIC_HISTOGRAM, "wf_h", "h", NULL, NULL, 0, &m),
	             WF_EINVAL);
	cr_assert_eq(wf_metrics_add(reg, WF_METRIC_GAUGE, "wf_g", "h", NULL, b, 2, &m), WF_EINVAL);
	cr_assert_eq(wf_metrics_add(reg, WF_METRIC_GAUGE, "wf_g", "h", NULL, NULL, 0, &m), 0);
	cr_assert_eq(wf_metrics_add(reg, WF_METRIC_GAUGE, "wf_g", "other", NULL, NULL, 0, &m),
	             WF_EDUPLICATE);
	char *t = render(reg);
	cr_assert_str_eq(t, "# HELP wf_g h\n# TYPE wf_g gauge\n"
	                    "# HELP weightfloor_metrics_dropped_total Series updates dropped (too "
	                    "many series in a family, or no memory).\n"
	                    "# TYPE weightfloor_metrics_dropped_total counter\n"
	                    "weightfloor_metrics_dropped_total 0\n");
	free(t);
	wf_metrics_destroy(reg);
}

Test(http_metrics, wrong_updates_are_refused)
{
	struct wf_metrics *reg;
	struct wf_metric *c, *g, *h;
	const double b[] = {1};
	cr_assert_eq(wf_metrics_create(&reg), 0);
	cr_assert_eq(wf_metrics_add(reg, WF_METRIC_COUNTER, "wf_c_total", "c", NULL, NULL, 0, &c),
	             0);
	cr_assert_eq(wf_metrics_add(reg, WF_METRIC_GAUGE, "wf_g", "g", NULL, NULL, 0, &g), 0);
	cr_assert_eq(wf_metrics_add(reg, WF_METRIC_HISTOGRAM, "wf_h", "h", NULL, b, 1, &h), 0);
	cr_assert_eq(wf_metric_add(c, NULL, -1), WF_EINVAL);
	cr_assert_eq(wf_metric_add(c, NULL, NAN), WF_EINVAL);
	cr_assert_eq(wf_metric_set(c, NULL, 10), 0);
	cr_assert_eq(wf_metric_set(c, NULL, 9), WF_EINVAL, "a counter never goes down");
	cr_assert_eq(wf_metric_observe(g, NULL, 1), WF_EINVAL);
	cr_assert_eq(wf_metric_add(h, NULL, 1), WF_EINVAL);
	cr_assert_eq(wf_metric_set(h, NULL, 1), WF_EINVAL);
	cr_assert_eq(wf_metric_observe(h, NULL, NAN), WF_EINVAL);
	char *t = families(reg);
	cr_assert_not_null(strstr(t, "\nwf_c_total 10\n"), "%s", t);
	free(t);
	wf_metrics_destroy(reg);
}

Test(http_metrics, series_beyond_the_cap_are_dropped_and_counted)
{
	struct wf_metrics *reg;
	struct wf_metric *g;
	cr_assert_eq(wf_metrics_create(&reg), 0);
	cr_assert_eq(wf_metrics_add(reg, WF_METRIC_GAUGE, "wf_g", "g",
	                            (const char *const[]){"model", NULL}, NULL, 0, &g),
	             0);
	char name[32];
	for (int i = 0; i < WF_METRIC_MAX_SERIES; i++) {
		snprintf(name, sizeof name, "m%d", i);
		cr_assert_eq(wf_metric_set(g, (const char *[]){name}, i), 0);
	}
	cr_assert_eq(wf_metric_set(g, (const char *[]){"one-too-many"}, 1), WF_ELIMIT);
	cr_assert_eq(wf_metric_set(g, (const char *[]){"m7"}, 70), 0,
	             "existing series still update");
	char *t = render(reg);
	cr_assert_not_null(strstr(t, "weightfloor_metrics_dropped_total 1\n"), "%s", t);
	cr_assert_null(strstr(t, "one-too-many"));
	cr_assert_not_null(strstr(t, "wf_g{model=\"m7\"} 70\n"));
	free(t);
	/* Clearing makes room again. */
	wf_metric_clear(g);
	cr_assert_eq(wf_metric_set(g, (const char *[]){"one-too-many"}, 1), 0);
	t = families(reg);
	cr_assert_str_eq(t, "# HELP wf_g g\n# TYPE wf_g gauge\nwf_g{model=\"one-too-many\"} 1\n");
	free(t);
	wf_metrics_destroy(reg);
}

struct coll {
	struct wf_metric *g;
	int calls;
};

static void collect(void *ctx)
{
	struct coll *c = ctx;
	c->calls++;
	wf_metric_clear(c->g);
	wf_metric_set(c->g, (const char *[]){c->calls == 1 ? "first" : "second"}, c->calls);
}

Test(http_metrics, collectors_run_before_each_render)
{
	struct wf_metrics *reg;
	struct coll c = {0};
	cr_assert_eq(wf_metrics_create(&reg), 0);
	cr_assert_eq(wf_metrics_add(reg, WF_METRIC_GAUGE, "wf_g", "g",
	                            (const char *const[]){"model", NULL}, NULL, 0, &c.g),
	             0);
	cr_assert_eq(wf_metrics_collector_add(reg, collect, &c), 0);
	char *t = families(reg);
	cr_assert_str_eq(t, "# HELP wf_g g\n# TYPE wf_g gauge\nwf_g{model=\"first\"} 1\n");
	free(t);
	t = families(reg);
	cr_assert_str_eq(t, "# HELP wf_g g\n# TYPE wf_g gauge\nwf_g{model=\"second\"} 2\n");
	free(t);
	wf_metrics_destroy(reg);
}
