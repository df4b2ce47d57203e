/* The agent's metrics (agent/metrics.h, docs/METRICS.md). */
#include "agent/metrics.h"

#include "base/error.h"
#include "control/reqmetrics.h"
#include "proto/status.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct wf_agent_metrics {
	struct wf_metrics *reg;
	_Atomic(struct wf_floors *) floors;
	_Atomic(struct wf_workers *) workers;
	/* events */
	struct wf_ctl_reqmetrics req; /* control requests, and errors_total */
	struct wf_metric *materializations, *materialize_seconds, *materialized_bytes;
	struct wf_metric *publishes, *published_tensors, *published_bytes;
	struct wf_metric *reloads, *reload_seconds;
	/* scrape time */
	struct wf_metric *info, *floors_by_state, *floor_state, *floor_bytes, *floor_resident,
	    *floor_holders, *floor_stale, *materialize_rate, *reaped, *budget, *used, *orphan,
	    *overcommit, *n_workers, *w_budget, *w_total, *w_seen, *w_res;
	int64_t now_ms; /* the collector's clock, for ages */
};

static int64_t unix_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
}

static const char *floor_state_label(enum wf_floor_state s)
{
	switch (s) {
	case WF_FLOOR_DISK:
		return "DISK";
	case WF_FLOOR_MATERIALIZING:
		return "MATERIALIZING";
	case WF_FLOOR_HOST:
		return "HOST";
	case WF_FLOOR_PINNED_HOST:
		return "PINNED_HOST";
	case WF_FLOOR_FAILED:
		return "FAILED";
	}
	return "UNKNOWN";
}

static const char *residency_label(int r)
{
	switch (r) {
	case WEIGHTFLOOR__V1__RESIDENCY__RESIDENCY_DISK:
		return "DISK";
	case WEIGHTFLOOR__V1__RESIDENCY__RESIDENCY_HOST:
		return "HOST";
	case WEIGHTFLOOR__V1__RESIDENCY__RESIDENCY_DEVICE:
		return "DEVICE";
	case WEIGHTFLOOR__V1__RESIDENCY__RESIDENCY_PINNED_DEVICE:
		return "PINNED_DEVICE";
	default:
		return "UNSPECIFIED";
	}
}

static void collect_worker(void *ctx, const struct wf_workers_view *v)
{
	struct wf_agent_metrics *am = ctx;
	const char *w[] = {v->worker_id};
	wf_metric_set(am->w_budget, w, (double)v->device_budget);
	wf_metric_set(am->w_total, w, (double)v->device_total);
	wf_metric_set(am->w_seen, w,
	              v->last_seen_unix_ms > 0 ? (double)(am->now_ms - v->last_seen_unix_ms) / 1e3
	                                       : -1.0);
	for (uint32_t i = 0; i < v->n_res; i++) {
		const char *l[] = {v->worker_id, v->res_model[i], residency_label(v->res_state[i])};
		wf_metric_set(am->w_res, l, 1);
	}
}

/* Copies what the floor manager and the worker registry hold into the registry. Labelled
 * gauges are rebuilt: a model released or a worker gone is no longer reported. */
static void collect(void *ctx)
{
	struct wf_agent_metrics *am = ctx;
	struct wf_floors *f = atomic_load(&am->floors);
	struct wf_workers *wk = atomic_load(&am->workers);
	am->now_ms = unix_ms();
	if (f) {
		struct wf_floors_status st;
		wf_floors_status(f, &st);
		static const enum wf_floor_state states[] = {WF_FLOOR_DISK, WF_FLOOR_MATERIALIZING,
		                                             WF_FLOOR_HOST, WF_FLOOR_PINNED_HOST,
		                                             WF_FLOOR_FAILED};
		const uint32_t counts[] = {st.n_disk, st.n_materializing, st.n_host, st.n_pinned,
		                           st.n_failed};
		for (size_t i = 0; i < 5; i++)
			wf_metric_set(am->floors_by_state,
			              (const char *[]){floor_state_label(states[i])}, counts[i]);
		wf_metric_set(am->reaped, NULL, st.reaped);
		wf_metric_set(am->budget, NULL, (double)st.host_budget);
		wf_metric_set(am->used, NULL, (double)st.host_used);
		wf_metric_set(am->orphan, NULL, (double)st.orphan_bytes);
		wf_metric_set(am->overcommit, NULL,
		              st.host_budget && st.host_used > st.host_budget ? 1 : 0);
		struct wf_floor_snapshot *snaps = NULL;
		size_t n = 0;
		wf_metric_clear(am->floor_state);
		wf_metric_clear(am->floor_bytes);
		wf_metric_clear(am->floor_resident);
		wf_metric_clear(am->floor_holders);
		wf_metric_clear(am->floor_stale);
		wf_metric_clear(am->materialize_rate);
		if (wf_floors_list(f, &snaps, &n) == 0) {
			for (size_t i = 0; i < n; i++) {
				const struct wf_floor_snapshot *s = &snaps[i];
				const char *m[] = {s->name};
				wf_metric_set(
				    am->floor_state,
				    (const char *[]){s->name, floor_state_label(s->state)}, 1);
				wf_metric_set(am->floor_bytes, m, (double)s->total_bytes);
				wf_metric_set(am->floor_resident, m, (double)s->resident_bytes);
				wf_metric_set(am->floor_holders, m, s->holder_count);
				wf_metric_set(am->floor_stale, m, s->stale ? 1 : 0);
				if (s->rate_bytes_per_s)
					wf_metric_set(am->materialize_rate, m,
					              (double)s->rate_bytes_per_s);
				wf_floor_snapshot_fini(&snaps[i]);
			}
			free(snaps);
		}
	}
	if (wk) {
		wf_metric_set(am->n_workers, NULL, wf_workers_count(wk));
		wf_metric_clear(am->w_budget);
		wf_metric_clear(am->w_total);
		wf_metric_clear(am->w_seen);
		wf_metric_clear(am->w_res);
		wf_workers_visit(wk, collect_worker, am);
	}
}

int wf_agent_metrics_create(struct wf_agent_metrics **ret)
{
	struct wf_agent_metrics *am = calloc(1, sizeof(*am));
	if (!am)
		return -ENOMEM;
	const enum wf_metric_type C = WF_METRIC_COUNTER, G = WF_METRIC_GAUGE,
	                          H = WF_METRIC_HISTOGRAM;
	static const char *const L_none[] = {NULL};
	static const char *const L_model[] = {"model", NULL};
	static const char *const L_worker[] = {"worker", NULL};
	const struct wf_ctl_metric_def defs[] = {
	    {&am->info, G, "weightfloor_agent_info", "The agent's version (value 1).",
	     (const char *const[]){"version", NULL}},
	    {&am->materializations, C, "weightfloor_materializations_total",
	     "Materializations ended: ok (this agent copied the files), ready (another "
	     "process had made the floor), failed.",
	     (const char *const[]){"result", NULL}},
	    {&am->materialize_seconds, H, "weightfloor_materialize_duration_seconds",
	     "Duration of the materializations this agent completed.", L_none},
	    {&am->materialized_bytes, C, "weightfloor_materialized_bytes_total",
	     "Bytes copied into floors by completed materializations.", L_none},
	    {&am->publishes, C, "weightfloor_publishes_total",
	     "Generations published into a model's floor (PublishTensors).", L_model},
	    {&am->published_tensors, C, "weightfloor_published_tensors_total",
	     "Tensor versions published into a model's floor.", L_model},
	    {&am->published_bytes, C, "weightfloor_published_bytes_total",
	     "Bytes published into a model's floor (its spare area).", L_model},
	    {&am->reloads, C, "weightfloor_reloads_total",
	     "Reloads of a model's changed files (ReloadModel): published, unchanged (nothing "
	     "differed), dry_run, refused (a tensor could not be reloaded), failed.",
	     (const char *const[]){"model", "result", NULL}},
	    {&am->reload_seconds, H, "weightfloor_reload_duration_seconds",
	     "Duration of the reloads that did not fail.", L_none},
	    {&am->materialize_rate, G, "weightfloor_materialize_rate_bytes_per_second",
	     "A model's materialization rate (in progress, or its last).", L_model},
	    {&am->floors_by_state, G, "weightfloor_floors", "Registered models by floor state.",
	     (const char *const[]){"state", NULL}},
	    {&am->floor_state, G, "weightfloor_floor_state",
	     "A registered model's floor state (value 1 for the current state).",
	     (const char *const[]){"model", "state", NULL}},
	    {&am->floor_bytes, G, "weightfloor_floor_bytes",
	     "A model's tensor bytes (what its floor holds when materialized).", L_model},
	    {&am->floor_resident, G, "weightfloor_floor_resident_bytes",
	     "Memory a model's floor occupies now (allocated blocks of its region).", L_model},
	    {&am->floor_holders, G, "weightfloor_floor_holders",
	     "Processes attached to a model's floor, the agent included.", L_model},
	    {&am->floor_stale, G, "weightfloor_floor_stale",
	     "1 when a model's files changed under its floor.", L_model},
	    {&am->reaped, C, "weightfloor_floors_reaped_total",
	     "Floors the janitor removed (nobody held or kept them).", L_none},
	    {&am->budget, G, "weightfloor_host_budget_bytes",
	     "Host memory the agent may hold in floors (0: no limit).", L_none},
	    {&am->used, G, "weightfloor_host_used_bytes",
	     "Host memory in floors: the agent's, those being materialized, and orphans.", L_none},
	    {&am->orphan, G, "weightfloor_host_orphan_bytes",
	     "Bytes of floors other processes hold that no registered model points to.", L_none},
	    {&am->overcommit, G, "weightfloor_host_overcommit",
	     "1 when floors use more than the host budget (pins, or floors others hold).", L_none},
	    {&am->n_workers, G, "weightfloor_workers", "Workers registered with the agent.",
	     L_none},
	    {&am->w_budget, G, "weightfloor_worker_device_budget_bytes",
	     "A worker's on-demand device budget, as it registered.", L_worker},
	    {&am->w_total, G, "weightfloor_worker_device_total_bytes",
	     "A worker's device memory, as it registered.", L_worker},
	    {&am->w_seen, G, "weightfloor_worker_last_seen_seconds",
	     "Seconds since the worker's last registration or heartbeat.", L_worker},
	    {&am->w_res, G, "weightfloor_worker_residency",
	     "The residency a worker last reported for a model (value 1).",
	     (const char *const[]){"worker", "model", "state", NULL}},
	};
	int rc = wf_ctl_daemon_metrics_create(defs, sizeof defs / sizeof defs[0], &am->req,
	                                      "Errors by status code: request replies other than "
	                                      "OK, and failures of asynchronous floor work.",
	                                      collect, am, &am->reg);
	if (rc == 0)
		rc = wf_metric_set(am->info, (const char *[]){WF_VERSION}, 1);
	if (rc < 0) {
		wf_agent_metrics_destroy(am);
		return rc;
	}
	*ret = am;
	return 0;
}

void wf_agent_metrics_bind(struct wf_agent_metrics *am, struct wf_floors *floors,
                           struct wf_workers *workers)
{
	atomic_store(&am->floors, floors);
	atomic_store(&am->workers, workers);
}

void wf_agent_metrics_destroy(struct wf_agent_metrics *am)
{
	if (!am)
		return;
	wf_metrics_destroy(am->reg);
	free(am);
}

struct wf_metrics *wf_agent_metrics_registry(struct wf_agent_metrics *am)
{
	return am->reg;
}

void wf_agent_metrics_floor_event(struct wf_agent_metrics *am, const struct wf_floor_event *ev)
{
	if (!am)
		return;
	if (ev->kind == WF_FLOOR_EV_ERROR) {
		const char *l[] = {wf_proto_status_name(wf_proto_status_from_err(ev->code)),
		                   "floor"};
		wf_metric_add(am->req.errors, l, 1);
		return;
	}
	if (ev->kind == WF_FLOOR_EV_RELOADED) {
		wf_metric_add(am->reloads, (const char *[]){ev->model, ev->reload_result}, 1);
		if (!ev->code)
			wf_metric_observe(am->reload_seconds, NULL, ev->seconds);
		return;
	}
	if (ev->kind == WF_FLOOR_EV_PUBLISHED) {
		const char *m[] = {ev->model};
		wf_metric_add(am->publishes, m, 1);
		wf_metric_add(am->published_tensors, m, ev->n_tensors);
		wf_metric_add(am->published_bytes, m, (double)ev->bytes_done);
		return;
	}
	if (ev->kind != WF_FLOOR_EV_STATE || ev->seconds <= 0)
		return; /* only the STATE event that ends a materialization carries its duration */
	const char *result = ev->state == WF_FLOOR_FAILED ? "failed"
	                     : ev->materialized           ? "ok"
	                                                  : "ready";
	wf_metric_add(am->materializations, (const char *[]){result}, 1);
	if (ev->materialized) {
		wf_metric_observe(am->materialize_seconds, NULL, ev->seconds);
		wf_metric_add(am->materialized_bytes, NULL, (double)ev->bytes_total);
	}
}

void wf_agent_metrics_wrap(struct wf_agent_metrics *am, wf_ctl_handle_fn inner, void *inner_ctx)
{
	wf_ctl_reqmetrics_wrap(&am->req, inner, inner_ctx);
}

int wf_agent_metrics_handle(void *ctx, const Weightfloor__V1__Request *req,
                            Weightfloor__V1__Reply *reply, struct wf_ctl_call *call)
{
	return wf_ctl_reqmetrics_handle(&((struct wf_agent_metrics *)ctx)->req, req, reply, call);
}

bool wf_agent_metrics_live(void *ctx, char *reason, size_t len)
{
	struct wf_agent_metrics *am = ctx;
	struct wf_floors *f = atomic_load(&am->floors);
	if (!f)
		return true;
	struct wf_floors_status st;
	wf_floors_status(f, &st);
	int64_t limit = (int64_t)st.janitor_interval_ms * 10;
	if (limit < 60000)
		limit = 60000;
	if (st.janitor_age_ms > limit) {
		snprintf(reason, len, "the janitor has not finished a pass for %lld ms",
		         (long long)st.janitor_age_ms);
		return false;
	}
	return true;
}
