/* A small metrics registry rendered in the Prometheus text exposition format (version 0.0.4).
 *
 * A registry holds families (a name, a help line, a type, up to WF_METRIC_MAX_LABELS label
 * names); a family holds series, one per tuple of label values, created on first update. Types:
 *   counter    a monotonic total; rendered under its name, which must end in "_total"
 *   gauge      a value that goes up and down
 *   histogram  fixed upper bounds given at creation; rendered as <name>_bucket{le="..."}
 *              (cumulative, "+Inf" last), <name>_sum and <name>_count
 *
 * Daemons update series from any thread: every update takes the registry's one mutex for a
 * lookup over the family's series (a handful each) and an add, and nothing else is done under
 * it, so an update costs well under a microsecond and never waits on I/O. Values a daemon
 * already keeps (floor states, budgets, a cache's counters) are copied into the registry at
 * scrape time by collectors, which wf_metrics_render() calls first (without the registry lock:
 * a collector updates series like any thread).
 *
 * Label values may come from peers (model names, worker ids): a family keeps at most
 * WF_METRIC_MAX_SERIES series; updates of a new series beyond that are dropped and counted in
 * weightfloor_metrics_dropped_total, which every registry renders. Values are escaped as the
 * format requires (backslash, double quote, newline) and bytes that are not UTF-8 become '?'.
 *
 * Library code: nothing here logs. */
#ifndef WF_HTTP_METRICS_H
#define WF_HTTP_METRICS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define WF_METRIC_MAX_LABELS  4
#define WF_METRIC_MAX_SERIES  1024
#define WF_METRIC_MAX_BUCKETS 32

enum wf_metric_type {
	WF_METRIC_COUNTER = 0,
	WF_METRIC_GAUGE,
	WF_METRIC_HISTOGRAM,
	WF_METRIC_TYPE_MAX
};

struct wf_metrics;
struct wf_metric; /* a family; owned by its registry, valid until wf_metrics_destroy() */

/* Returns 0 and *ret, or -ENOMEM. */
int wf_metrics_create(struct wf_metrics **ret);
/* Frees the registry and its families. Accepts NULL. No update may run concurrently. */
void wf_metrics_destroy(struct wf_metrics *reg);

/* Adds a family. name matches [a-zA-Z_:][a-zA-Z0-9_:]* (a counter's ends in "_total"), help is
 * one line of text, labels is NULL or a NULL-terminated list of at most WF_METRIC_MAX_LABELS
 * names matching [a-zA-Z_][a-zA-Z0-9_]* that do not start with "__" (and, for a histogram, are
 * not "le"). bounds: a histogram's upper bounds, strictly increasing and finite, 1 to
 * WF_METRIC_MAX_BUCKETS of them ("+Inf" is implied); NULL/0 for the other types. Returns 0 and
 * *ret, WF_EINVAL for a bad name, label or bounds, WF_EDUPLICATE when the name is taken, or
 * -ENOMEM. Thread-safe. */
int wf_metrics_add(struct wf_metrics *reg, enum wf_metric_type type, const char *name,
                   const char *help, const char *const *labels, const double *bounds,
                   size_t n_bounds, struct wf_metric **ret);

/* Updates. values holds one string per label name of the family (NULL when it has none; a NULL
 * value is rendered as ""). Return 0, WF_ELIMIT when the series would exceed
 * WF_METRIC_MAX_SERIES (dropped, counted), WF_EINVAL for the wrong type or a negative counter
 * increment, or -ENOMEM. Thread-safe. */
/* Counter: adds v (>= 0). Gauge: adds v (any sign). */
int wf_metric_add(struct wf_metric *m, const char *const *values, double v);
/* Gauge: sets v. Counter: sets v when it is not below the current value (a total the daemon
 * already counts, mirrored at scrape time). */
int wf_metric_set(struct wf_metric *m, const char *const *values, double v);
/* Histogram: counts one observation. */
int wf_metric_observe(struct wf_metric *m, const char *const *values, double v);
/* Drops every series of the family: a collector that rebuilds a labelled gauge (one series per
 * model present now) clears it first so that models gone are no longer reported. */
void wf_metric_clear(struct wf_metric *m);

/* Called by wf_metrics_render() before it renders, in the order added. */
typedef void wf_metrics_collect_fn(void *ctx);
/* Returns 0, or -ENOMEM. At most 8 collectors (WF_ELIMIT beyond). */
int wf_metrics_collector_add(struct wf_metrics *reg, wf_metrics_collect_fn *fn, void *ctx);

/* Runs the collectors, then renders every family in the order added (HELP and TYPE lines, then
 * its series in the order they appeared). Renders are serialized. Returns 0 and a malloc'ed,
 * NUL-terminated text in *ret_text (its length in *ret_len), or -ENOMEM. */
int wf_metrics_render(struct wf_metrics *reg, char **ret_text, size_t *ret_len);

/* Bucket bounds the daemons share: seconds from 1 ms to 10 min, roughly x2.5 apart. */
extern const double wf_metrics_seconds_buckets[];
extern const size_t wf_metrics_seconds_buckets_n;

#ifdef __cplusplus
}
#endif
#endif
