/* Control requests on /metrics (docs/METRICS.md): the one wrapper wf-agent and wf-worker put
 * around their request handler, counting each request by kind (the body's field name) and reply
 * status, timing it, and counting replies other than OK as errors of source "request". */
#ifndef WF_CONTROL_REQMETRICS_H
#define WF_CONTROL_REQMETRICS_H

#include "control/server.h"
#include "http/metrics.h"

#ifdef __cplusplus
extern "C" {
#endif

struct wf_ctl_reqmetrics {
	struct wf_metric *requests; /* weightfloor_requests_total{kind,status} */
	struct wf_metric *seconds;  /* weightfloor_request_duration_seconds{kind} */
	struct wf_metric *errors;   /* weightfloor_errors_total{code,source} */
	wf_ctl_handle_fn inner;
	void *inner_ctx;
};

/* One family of a daemon's own (histograms count seconds: wf_metrics_seconds_buckets). */
struct wf_ctl_metric_def {
	struct wf_metric **ret;
	enum wf_metric_type type;
	const char *name, *help;
	const char *const *labels;
};

/* The registry wf-agent and wf-worker serve on /metrics: their own families (defs), the request
 * families of wf_ctl_reqmetrics_init (into req, with errors_help), and collect(ctx) run at each
 * scrape. Returns 0 and *ret_reg (wf_metrics_destroy() it), or the registry's error with nothing
 * left behind. */
int wf_ctl_daemon_metrics_create(const struct wf_ctl_metric_def *defs, size_t n_defs,
                                 struct wf_ctl_reqmetrics *req, const char *errors_help,
                                 wf_metrics_collect_fn *collect, void *ctx,
                                 struct wf_metrics **ret_reg);

/* Adds the three families to reg; errors_help is the errors family's help text (the daemon
 * counts other failures there too, under other sources). Returns 0 or the registry's error. */
int wf_ctl_reqmetrics_init(struct wf_ctl_reqmetrics *m, struct wf_metrics *reg,
                           const char *errors_help);
/* The handler the wrapper calls. */
void wf_ctl_reqmetrics_wrap(struct wf_ctl_reqmetrics *m, wf_ctl_handle_fn inner, void *inner_ctx);
/* A wf_ctl_handle_fn; ctx is the struct wf_ctl_reqmetrics. */
int wf_ctl_reqmetrics_handle(void *ctx, const Weightfloor__V1__Request *req,
                             Weightfloor__V1__Reply *reply, struct wf_ctl_call *call);

#ifdef __cplusplus
}
#endif
#endif
