/* Control requests on /metrics (reqmetrics.h). */
#include "control/reqmetrics.h"

#include "proto/request.h"
#include "proto/status.h"

#include <time.h>

int wf_ctl_reqmetrics_init(struct wf_ctl_reqmetrics *m, struct wf_metrics *reg,
                           const char *errors_help)
{
	int rc =
	    wf_metrics_add(reg, WF_METRIC_COUNTER, "weightfloor_requests_total",
	                   "Control requests answered, by kind (the request's body) and reply "
	                   "status.",
	                   (const char *const[]){"kind", "status", NULL}, NULL, 0, &m->requests);
	if (rc == 0)
		rc =
		    wf_metrics_add(reg, WF_METRIC_HISTOGRAM, "weightfloor_request_duration_seconds",
		                   "Time from a request's arrival to its reply, by kind.",
		                   (const char *const[]){"kind", NULL}, wf_metrics_seconds_buckets,
		                   wf_metrics_seconds_buckets_n, &m->seconds);
	if (rc == 0)
		rc = wf_metrics_add(reg, WF_METRIC_COUNTER, "weightfloor_errors_total", errors_help,
		                    (const char *const[]){"code", "source", NULL}, NULL, 0,
		                    &m->errors);
	return rc;
}

int wf_ctl_daemon_metrics_create(const struct wf_ctl_metric_def *defs, size_t n_defs,
                                 struct wf_ctl_reqmetrics *req, const char *errors_help,
                                 wf_metrics_collect_fn *collect, void *ctx,
                                 struct wf_metrics **ret_reg)
{
	struct wf_metrics *reg = NULL;
	int rc = wf_metrics_create(&reg);
	for (size_t i = 0; rc == 0 && i < n_defs; i++) {
		bool h = defs[i].type == WF_METRIC_HISTOGRAM;
		rc = wf_metrics_add(reg, defs[i].type, defs[i].name, defs[i].help, defs[i].labels,
		                    h ? wf_metrics_seconds_buckets : NULL,
		                    h ? wf_metrics_seconds_buckets_n : 0, defs[i].ret);
	}
	if (rc == 0)
		rc = wf_ctl_reqmetrics_init(req, reg, errors_help);
	if (rc == 0 && collect)
		rc = wf_metrics_collector_add(reg, collect, ctx);
	if (rc < 0) {
		wf_metrics_destroy(reg);
		return rc;
	}
	*ret_reg = reg;
	return 0;
}

void wf_ctl_reqmetrics_wrap(struct wf_ctl_reqmetrics *m, wf_ctl_handle_fn inner, void *inner_ctx)
{
	m->inner = inner;
	m->inner_ctx = inner_ctx;
}

static double mono_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int wf_ctl_reqmetrics_handle(void *ctx, const Weightfloor__V1__Request *req,
                             Weightfloor__V1__Reply *reply, struct wf_ctl_call *call)
{
	struct wf_ctl_reqmetrics *m = ctx;
	const double t0 = mono_s();
	const int rc = m->inner(m->inner_ctx, req, reply, call);
	const double dt = mono_s() - t0;
	struct wf_proto_request_desc rd;
	wf_proto_request_describe(req, &rd);
	const Weightfloor__V1__Status st = rc < 0 ? wf_proto_status_from_err(rc) : reply->code;
	const char *status = wf_proto_status_name(st);
	wf_metric_add(m->requests, (const char *[]){rd.kind, status}, 1);
	wf_metric_observe(m->seconds, (const char *[]){rd.kind}, dt);
	if (st != WEIGHTFLOOR__V1__STATUS__STATUS_OK)
		wf_metric_add(m->errors, (const char *[]){status, "request"}, 1);
	return rc;
}
