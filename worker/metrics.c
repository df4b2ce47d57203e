/* The worker's metrics (worker/metrics.h, docs/METRICS.md). */
#include "worker/metrics.h"

#include "control/reqmetrics.h"
#include "device/device.h"
#include "proto/status.h"
#include "worker/completion.h"
#include "worker/service.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct wf_worker_metrics {
	struct wf_metrics *reg;
	_Atomic(struct wf_worker_svc *) svc;
	struct wf_completions *cs; /* written before svc */
	/* events */
	struct wf_ctl_reqmetrics req; /* control requests, and errors_total */
	struct wf_metric *loads, *load_seconds, *loaded_bytes;
	/* scrape time: the worker and its device */
	struct wf_metric *info, *evictions, *lru_evictions, *mem_total, *mem_free, *arena, *pool,
	    *budget, *resident, *pinned, *reserved, *overcommit, *over_budget;
	/* per model */
	struct wf_metric *residency, *model_bytes, *model_device_bytes, *load_rate;
	/* engines */
	struct wf_metric *completions, *tokens, *tps, *pf_bytes, *pf_bpt, *pf_overlap,
	    *pf_fallbacks, *pf_fallback_ratio, *hits, *misses, *hit_ratio;
};

static void collect_engine(struct wf_worker_metrics *wm, struct wf_completions *cs,
                           const char *name)
{
	struct wf_completion_metrics g;
	if (!cs || wf_completion_model_metrics(cs, name, &g) < 0)
		return;
	const char *m[] = {name};
	wf_metric_set(wm->completions, m, (double)g.completions);
	wf_metric_set(wm->tokens, m, (double)g.tokens);
	wf_metric_set(wm->pf_bytes, m, (double)g.fetch_bytes);
	wf_metric_set(wm->pf_fallbacks, m, (double)g.fetch_fallbacks);
	wf_metric_set(wm->hits, m, (double)g.fetch_hits);
	wf_metric_set(wm->misses, m, (double)g.fetch_misses);
	/* Ratios with nothing to divide by (-1) are left out rather than reported as a value. */
	if (g.decode_tokens_per_s >= 0)
		wf_metric_set(wm->tps, m, g.decode_tokens_per_s);
	if (g.fetch_bytes_per_token >= 0)
		wf_metric_set(wm->pf_bpt, m, g.fetch_bytes_per_token);
	if (g.fetch_overlap >= 0)
		wf_metric_set(wm->pf_overlap, m, g.fetch_overlap);
	if (g.fallback_rate >= 0)
		wf_metric_set(wm->pf_fallback_ratio, m, g.fallback_rate);
	if (g.cache_hit_rate >= 0)
		wf_metric_set(wm->hit_ratio, m, g.cache_hit_rate);
}

/* Copies the cache's status and the engines' figures into the registry. Per-model families are
 * rebuilt each time: an engine rebuilt after an eviction starts its totals again, which
 * Prometheus reads as a counter reset. */
static void collect(void *ctx)
{
	struct wf_worker_metrics *wm = ctx;
	struct wf_worker_svc *svc = atomic_load(&wm->svc);
	if (!svc || !svc->cache)
		return;
	struct wf_cache_status *st = NULL;
	if (wf_cache_status(svc->cache, &st) < 0)
		return;
	wf_metric_clear(wm->info);
	wf_metric_set(wm->info,
	              (const char *[]){svc->worker_id, svc->dev ? wf_device_name(svc->dev) : "",
	                               wf_cache_mode_name(st->mode)},
	              1);
	wf_metric_set(wm->evictions, NULL, (double)st->evictions);
	wf_metric_set(wm->lru_evictions, NULL, (double)st->lru_evictions);
	wf_metric_set(wm->mem_total, NULL, (double)st->mem_total);
	wf_metric_set(wm->mem_free, NULL, (double)st->mem_free);
	wf_metric_set(wm->arena, NULL, (double)st->budget.in.arena);
	wf_metric_set(wm->pool, NULL, (double)st->budget.weight_pool);
	wf_metric_set(wm->budget, NULL, (double)st->budget.on_demand);
	wf_metric_set(wm->resident, NULL, (double)st->resident_bytes);
	wf_metric_set(wm->pinned, NULL, (double)st->pinned_bytes);
	wf_metric_set(wm->reserved, NULL, (double)st->reserved_bytes);
	wf_metric_set(wm->overcommit, NULL, st->budget.pinned_overcommit ? 1 : 0);
	wf_metric_set(wm->over_budget, NULL, st->over_budget ? 1 : 0);
	struct wf_metric *per_model[] = {wm->residency,  wm->model_bytes,  wm->model_device_bytes,
	                                 wm->load_rate,  wm->completions,  wm->tokens,
	                                 wm->tps,        wm->pf_bytes,     wm->pf_bpt,
	                                 wm->pf_overlap, wm->pf_fallbacks, wm->pf_fallback_ratio,
	                                 wm->hits,       wm->misses,       wm->hit_ratio};
	for (size_t i = 0; i < sizeof per_model / sizeof per_model[0]; i++)
		wf_metric_clear(per_model[i]);
	for (size_t i = 0; i < st->n_models; i++) {
		const struct wf_cache_model_status *ms = &st->models[i];
		if (!ms->name[0])
			continue; /* a removed model's slot */
		const char *m[] = {ms->name};
		wf_metric_set(wm->residency,
		              (const char *[]){ms->name, wf_residency_name(ms->state)}, 1);
		wf_metric_set(wm->model_bytes, m, (double)ms->bytes);
		wf_metric_set(wm->model_device_bytes, m, (double)ms->device_bytes);
		if (ms->loads)
			wf_metric_set(wm->load_rate, m, ms->last_load_gbps * 1e9);
		collect_engine(wm, wm->cs, ms->name);
	}
	wf_cache_status_free(st);
}

int wf_worker_metrics_create(struct wf_worker_metrics **ret)
{
	struct wf_worker_metrics *wm = calloc(1, sizeof(*wm));
	if (!wm)
		return -ENOMEM;
	const enum wf_metric_type C = WF_METRIC_COUNTER, G = WF_METRIC_GAUGE,
	                          H = WF_METRIC_HISTOGRAM;
	static const char *const L_none[] = {NULL};
	static const char *const L_model[] = {"model", NULL};
	const struct wf_ctl_metric_def defs[] = {
	    {&wm->info, G, "weightfloor_worker_info",
	     "The worker's id, device and residency mode (value 1).",
	     (const char *const[]){"worker", "device", "mode", NULL}},
	    {&wm->loads, C, "weightfloor_loads_total",
	     "Loads of weights to the device that ended, by result (ok, failed).",
	     (const char *const[]){"result", NULL}},
	    {&wm->load_seconds, H, "weightfloor_load_duration_seconds",
	     "Duration of the completed loads of weights to the device.", L_none},
	    {&wm->loaded_bytes, C, "weightfloor_loaded_bytes_total",
	     "Bytes of weights copied to the device by completed loads.", L_none},
	    {&wm->load_rate, G, "weightfloor_load_rate_bytes_per_second",
	     "A model's last load rate to the device.", L_model},
	    {&wm->evictions, C, "weightfloor_evictions_total",
	     "Models evicted from the device (commands and LRU).", L_none},
	    {&wm->lru_evictions, C, "weightfloor_lru_evictions_total",
	     "Models the LRU evicted from the device for the budget.", L_none},
	    {&wm->mem_total, G, "weightfloor_device_memory_total_bytes", "The device's memory.",
	     L_none},
	    {&wm->mem_free, G, "weightfloor_device_memory_free_bytes",
	     "The device's free memory now.", L_none},
	    {&wm->arena, G, "weightfloor_device_arena_bytes",
	     "Usable device memory the budget starts from.", L_none},
	    {&wm->pool, G, "weightfloor_device_weight_pool_bytes",
	     "Device memory for weights: pinned and on-demand models share it.", L_none},
	    {&wm->budget, G, "weightfloor_device_budget_bytes",
	     "The on-demand budget: the weight pool less pinned bytes.", L_none},
	    {&wm->resident, G, "weightfloor_device_resident_bytes",
	     "Device bytes of unpinned resident weights (against the on-demand budget).", L_none},
	    {&wm->pinned, G, "weightfloor_device_pinned_bytes",
	     "Device bytes of pinned weights (exempt from the budget).", L_none},
	    {&wm->reserved, G, "weightfloor_device_reserved_bytes",
	     "Device bytes reserved by engines (post-fetch scratchpads, expert caches).", L_none},
	    {&wm->overcommit, G, "weightfloor_device_pinned_overcommit",
	     "1 when pinned weights exceed the weight pool.", L_none},
	    {&wm->over_budget, G, "weightfloor_device_over_budget",
	     "1 when resident and reserved bytes exceed the on-demand budget.", L_none},
	    {&wm->residency, G, "weightfloor_model_residency",
	     "A model's residency on this worker (value 1 for the current state).",
	     (const char *const[]){"model", "state", NULL}},
	    {&wm->model_bytes, G, "weightfloor_model_bytes", "A model's tensor bytes.", L_model},
	    {&wm->model_device_bytes, G, "weightfloor_model_device_bytes",
	     "Device memory a model's weights hold now.", L_model},
	    {&wm->completions, C, "weightfloor_engine_completions_total",
	     "Completions finished on a model's engine.", L_model},
	    {&wm->tokens, C, "weightfloor_engine_tokens_total",
	     "Tokens a model's engine computed (prompts and generated).", L_model},
	    {&wm->tps, G, "weightfloor_engine_decode_tokens_per_second",
	     "Decode rate of the last finished completion of a model.", L_model},
	    {&wm->pf_bytes, C, "weightfloor_postfetch_bytes_total",
	     "Expert bytes post-fetched to the device for a model's engine.", L_model},
	    {&wm->pf_bpt, G, "weightfloor_postfetch_bytes_per_token",
	     "Expert bytes post-fetched per token computed.", L_model},
	    {&wm->pf_overlap, G, "weightfloor_postfetch_overlap_ratio",
	     "Fraction of the post-fetch copy time hidden under compute.", L_model},
	    {&wm->pf_fallbacks, C, "weightfloor_postfetch_fallbacks_total",
	     "Experts meant for the device that the CPU computed after all.", L_model},
	    {&wm->pf_fallback_ratio, G, "weightfloor_postfetch_fallback_ratio",
	     "Fallbacks over experts meant for the device.", L_model},
	    {&wm->hits, C, "weightfloor_expert_cache_hits_total",
	     "Selected experts found in a device slot.", L_model},
	    {&wm->misses, C, "weightfloor_expert_cache_misses_total",
	     "Selected experts not found in a device slot.", L_model},
	    {&wm->hit_ratio, G, "weightfloor_expert_cache_hit_ratio",
	     "Hits over lookups of the expert slots.", L_model},
	};
	int rc = wf_ctl_daemon_metrics_create(
	    defs, sizeof defs / sizeof defs[0], &wm->req,
	    "Errors by status code: request replies other than OK, and failed loads.", collect, wm,
	    &wm->reg);
	if (rc < 0) {
		wf_worker_metrics_destroy(wm);
		return rc;
	}
	*ret = wm;
	return 0;
}

void wf_worker_metrics_bind(struct wf_worker_metrics *wm, struct wf_worker_svc *svc,
                            struct wf_completions *cs)
{
	wm->cs = cs;
	atomic_store(&wm->svc, svc); /* publishes cs with it */
}

void wf_worker_metrics_destroy(struct wf_worker_metrics *wm)
{
	if (!wm)
		return;
	wf_metrics_destroy(wm->reg);
	free(wm);
}

struct wf_metrics *wf_worker_metrics_registry(struct wf_worker_metrics *wm)
{
	return wm->reg;
}

void wf_worker_metrics_cache_event(struct wf_worker_metrics *wm, const struct wf_cache_event *ev)
{
	if (!wm)
		return;
	if (ev->type == WF_CACHE_EVENT_LOAD_FAILED) {
		wf_metric_add(wm->loads, (const char *[]){"failed"}, 1);
		wf_metric_add(wm->req.errors,
		              (const char *[]){wf_proto_status_name(wf_proto_status_from_err(
		                                   ev->error < 0 ? ev->error : -EIO)),
		                               "load"},
		              1);
		return;
	}
	if (ev->type != WF_CACHE_EVENT_RESIDENCY || ev->seconds <= 0)
		return; /* only the RESIDENCY event that ends a load carries its duration */
	wf_metric_add(wm->loads, (const char *[]){"ok"}, 1);
	wf_metric_observe(wm->load_seconds, NULL, ev->seconds);
	wf_metric_add(wm->loaded_bytes, NULL, (double)ev->total);
}

void wf_worker_metrics_wrap(struct wf_worker_metrics *wm, wf_ctl_handle_fn inner, void *inner_ctx)
{
	wf_ctl_reqmetrics_wrap(&wm->req, inner, inner_ctx);
}

int wf_worker_metrics_handle(void *ctx, const Weightfloor__V1__Request *req,
                             Weightfloor__V1__Reply *reply, struct wf_ctl_call *call)
{
	return wf_ctl_reqmetrics_handle(&((struct wf_worker_metrics *)ctx)->req, req, reply, call);
}
