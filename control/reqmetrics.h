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
