#include "worker/completion.h"

#include "base/error.h"
#include "base/log.h"
#include "engine/engine.h"
#include "engine/scheduler.h"
#include "engine/tokenizer.h"
#include "shm/region.h"
#include "worker/cache.h"
#include "worker/service.h"
#include "worker/weights.h"
#include "worker/wengine.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

/* A model's engine. The engine and what it reads (scheduler, tokenizer, view, attachment) are
 * its heavy part; the name and metrics stay for the completions that still refer to it after the
 * heavy part is gone (an evicted engine's finished completions are readable for a while). */
#define WF_COMPLETION_EVICT_TRIES 8 /* victims evicted for an engine the device refused */

struct engine_model {
	char *name;
	struct wf_cache *cache; /* where resv lives */
	uint32_t resv;          /* the engine's device bytes in the device budget; 0: none
	                           (CPU-only engine, or the reservation was evicted) */
	uint64_t device_bytes;
	const struct wf_model *model; /* the service's, open until the worker stops */
	struct wf_shm_region *region; /* our own attachment; NULL: file mappings */
	struct wf_weight_view view;
	struct wf_tokenizer *tok;
	struct wf_worker_engine we; /* the engine, holding the store's sets it computes from */
	struct wf_engine *engine;   /* we.engine */
	struct wf_sched *sched;
	unsigned refreshing; /* refreshes and evaluations in progress (under wf_completions.mu):
	                        not to be freed */
	uint32_t n_ctx;
	uint32_t n_seq_sched; /* sequences the scheduler hands out; the next one is evaluations' */
	struct wf_completion_metrics metrics; /* under wf_completions.mu */
};

struct out_token {
	int32_t id;
	uint32_t len;
	size_t off; /* in completion.text */
};

struct completion {
	struct wf_completions *cs;
	uint64_t id;
	struct engine_model *gm;
	uint64_t sched_id;
	struct out_token *toks;
	uint32_t n_toks, cap;
	char *text;
	size_t text_len, text_cap;
	bool lost; /* out of memory for the output: it ends as an error */
	bool done;
	struct wf_sched_result res;
	double done_at;
	double last_seen;
	unsigned readers; /* long polls in progress: it is not idle */
	uint32_t idle_ms;
	uint64_t seed;
	uint32_t n_prompt;
	uint32_t resv; /* the engine's reservation this completion holds until its end; 0: none */
};

struct wf_completions {
	struct wf_worker_svc *svc;
	struct wf_completion_opts opts;
	pthread_mutex_t mu; /* guards models, runs and every run's fields */
	pthread_cond_t cv;  /* a token, an end, or closing */
	/* Engines being built, by model name: a second request for one waits on cv; requests for
	 * other models go on. Builds hold no lock: they ask the agent for floors. */
	char *loading[WF_COMPLETION_MODELS_MAX];
	uint32_t n_loading;
	struct engine_model *models[WF_COMPLETION_MODELS_MAX];
	uint32_t n_models;
	/* Engines of models sent back to disk, and the shells of evicted engines: no new
	 * completion finds them; the reaper frees one (and with it the floor attachment that keeps
	 * the floor alive) once no completion refers to it. Every entry that outlives a reaper
	 * pass is referred to by a completion, so WF_COMPLETION_MAX more than the models is enough.
	 */
	struct engine_model *retired[WF_COMPLETION_MAX + WF_COMPLETION_MODELS_MAX];
	uint32_t n_retired;
	/* The reservation of the engine the reaper is freeing now (0: none): an eviction of it
	 * waits for the memory to be gone before it returns to the cache. */
	uint32_t reaping_resv;
	struct completion *runs[WF_COMPLETION_MAX];
	uint32_t n_runs;
	uint64_t next_id;
	bool closing;
	pthread_t reaper;
	bool reaper_started;
};

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void deadline_after(struct timespec *ts, uint32_t ms)
{
	clock_gettime(CLOCK_MONOTONIC, ts);
	ts->tv_sec += ms / 1000;
	ts->tv_nsec += (long)(ms % 1000) * 1000000L;
	if (ts->tv_nsec >= 1000000000L) {
		ts->tv_sec++;
		ts->tv_nsec -= 1000000000L;
	}
}

/* ---- engines ------------------------------------------------------------------------------ */

/* The scheduler first: it joins its thread, so no step is cut short (none runs: nothing holds
 * the engine when this is called, or the worker is stopping). */
static void gmodel_free_heavy(struct engine_model *gm)
{
	wf_sched_destroy(gm->sched);
	gm->sched = NULL;
	wf_worker_engine_close(&gm->we); /* lets go of the store's sets */
	gm->engine = NULL;
	wf_tokenizer_destroy(gm->tok);
	gm->tok = NULL;
	wf_weight_view_release(&gm->view);
	wf_shm_region_detach(gm->region);
	gm->region = NULL;
}

static void gmodel_free(struct engine_model *gm)
{
	if (!gm)
		return;
	gmodel_free_heavy(gm);
	/* After the memory is gone: the budget never shows room the device does not have. */
	wf_cache_resv_drop(gm->cache, gm->resv);
	free(gm->name);
	free(gm);
}

/* Our own read-only attachment of the model's floor: the engine reads the same pages every
 * worker on the node maps, and the attachment lives as long as the engine, whatever the cache
 * or the agent do with theirs. */
static int view_floor(struct engine_model *gm, const struct wf_shm_config *shm,
                      const struct wf_digest *dg, struct wf_diag *diag)
{
	struct wf_diag d = {{0}};
	int rc =
	    wf_shm_region_attach(shm, dg, NULL, WF_SHM_ATTACH_READER, NULL, NULL, &gm->region, &d);
	if (rc < 0)
		return wf_diag_set(diag, rc, "floor: %s", wf_diag_str(&d, rc));
	return wf_weight_view_from_floor(gm->model, gm->region, &gm->view, diag);
}

/* Finds or builds the engine of a model. The residency rules are applied here, once: an engine
 * that exists is what "loaded" means for completion. */
static struct engine_model *find_model_locked(struct wf_completions *cs, const char *name)
{
	for (uint32_t i = 0; i < cs->n_models; i++)
		if (strcmp(cs->models[i]->name, name) == 0)
			return cs->models[i];
	return NULL;
}

static bool loading_locked(const struct wf_completions *cs, const char *name)
{
	for (uint32_t i = 0; i < cs->n_loading; i++)
		if (strcmp(cs->loading[i], name) == 0)
			return true;
	return false;
}

static int build_model(struct wf_completions *cs, const char *name, int agent_ms,
                       struct engine_model **ret, struct wf_diag *diag);
static void metrics_update(struct engine_model *gm, const struct wf_sched_result *res);

/* Finds or builds the model's engine and holds its reservation (*ret_resv, 0 for an engine
 * without device memory) for the caller, who passes it to a completion or releases it: held, the
 * engine is not evicted. */
static int model_get(struct wf_completions *cs, const char *name, int agent_ms,
                     struct engine_model **ret, uint32_t *ret_resv, struct wf_diag *diag)
{
	pthread_mutex_lock(&cs->mu);
	struct engine_model *gm;
	for (;;) {
		while (!(gm = find_model_locked(cs, name)) && loading_locked(cs, name) &&
		       !cs->closing)
			pthread_cond_wait(&cs->cv, &cs->mu);
		if (!gm || !gm->resv || wf_cache_resv_acquire(gm->cache, gm->resv) == 0)
			break;
		/* Evicted a moment ago: on_resv_evict, on the cache's manager thread, is about to
		 * take it out of the table (and wakes us); then it is built anew. */
		pthread_cond_wait(&cs->cv, &cs->mu);
	}
	if (gm || cs->closing) {
		uint32_t resv = gm ? gm->resv : 0;
		pthread_mutex_unlock(&cs->mu);
		if (!gm)
			return wf_diag_set(diag, WF_ECANCELED, "the worker is stopping");
		*ret = gm;
		*ret_resv = resv;
		return 0;
	}
	if (cs->n_models + cs->n_loading >= WF_COMPLETION_MODELS_MAX) {
		pthread_mutex_unlock(&cs->mu);
		return wf_diag_set(diag, WF_ELIMIT, "engines for %d models exist already",
		                   WF_COMPLETION_MODELS_MAX);
	}
	char *mine = strdup(name);
	if (!mine) {
		pthread_mutex_unlock(&cs->mu);
		return -ENOMEM;
	}
	cs->loading[cs->n_loading++] = mine;
	pthread_mutex_unlock(&cs->mu);

	int rc = build_model(cs, name, agent_ms, &gm, diag);

	pthread_mutex_lock(&cs->mu);
	for (uint32_t i = 0; i < cs->n_loading; i++)
		if (cs->loading[i] == mine) {
			cs->loading[i] = cs->loading[--cs->n_loading];
			break;
		}
	uint32_t resv = 0;
	if (rc == 0) {
		/* The reservation was made acquired: that hold is the caller's. */
		cs->models[cs->n_models++] = gm;
		resv = gm->resv;
	}
	pthread_cond_broadcast(&cs->cv);
	pthread_mutex_unlock(&cs->mu);
	free(mine);
	if (rc == 0) {
		*ret = gm;
		*ret_resv = resv;
	}
	return rc;
}

static bool gm_used_locked(const struct wf_completions *cs, const struct engine_model *gm)
{
	if (gm->refreshing)
		return true;
	for (uint32_t i = 0; i < cs->n_runs; i++)
		if (cs->runs[i]->gm == gm)
			return true;
	return false;
}

/* The cache evicted an engine's reservation (a load, another engine or a budget change needed the
 * room): the engine goes now, on the cache's manager thread, so that the memory is free when we
 * return. Nothing holds the reservation, so no completion runs on the engine (those that ran are
 * done: their on_done released it) and none can start (model_get's acquire fails and waits for
 * us). The shell stays for the finished completions that still refer to it. */
static void on_resv_evict(void *ctx, uint32_t resv, const char *why)
{
	struct wf_completions *cs = ctx;
	struct engine_model *gm = NULL;

	pthread_mutex_lock(&cs->mu);
	for (;;) {
		for (uint32_t i = 0; i < cs->n_models && !gm; i++)
			if (cs->models[i]->resv == resv) {
				gm = cs->models[i];
				cs->models[i] = cs->models[--cs->n_models];
			}
		for (uint32_t i = 0; i < cs->n_retired && !gm; i++)
			if (cs->retired[i]->resv == resv) {
				gm = cs->retired[i];
				cs->retired[i] = cs->retired[--cs->n_retired];
			}
		/* The reaper is freeing it: done when it is gone. */
		if (gm || cs->reaping_resv != resv)
			break;
		pthread_cond_wait(&cs->cv, &cs->mu);
	}
	if (gm)
		gm->resv = 0;
	pthread_cond_broadcast(&cs->cv);
	pthread_mutex_unlock(&cs->mu);
	if (!gm)
		return;
	wf_log_event(
	    WF_LOG_INFO,
	    WF_LOG_F(.worker = cs->svc->worker_id, .model = gm->name, .event = "engine_evicted"),
	    "engine evicted (%s): %" PRIu64 " device bytes freed; the next completion "
	    "builds it again",
	    why, gm->device_bytes);
	gmodel_free_heavy(gm);
	pthread_mutex_lock(&cs->mu);
	bool keep =
	    gm_used_locked(cs, gm) && cs->n_retired < WF_COMPLETION_MAX + WF_COMPLETION_MODELS_MAX;
	if (keep)
		cs->retired[cs->n_retired++] = gm;
	pthread_mutex_unlock(&cs->mu);
	if (!keep)
		gmodel_free(gm);
}

/* Builds a model's engine: asks the agent for its floor (or opens its files), views the weights,
 * makes the tokenizer, the engine and its scheduler. No lock held. */
static int build_model(struct wf_completions *cs, const char *name, int agent_ms,
                       struct engine_model **ret, struct wf_diag *diag)
{
	struct wf_worker_svc *s = cs->svc;
	struct engine_model *gm = NULL;
	struct wf_cache_status *st = NULL;
	int rc;
	uint32_t id;
	struct wf_diag d = {{0}};
	/* Externally managed: a completion never attaches a model itself (resolving it for a load
	 * would); only what the control plane attached may run. */
	if ((rc = wf_cache_status(s->cache, &st)) < 0)
		goto out;
	const bool external = st->mode == WF_CACHE_EXTERNAL;
	wf_cache_status_free(st);
	st = NULL;
	if (external && wf_cache_model_find(s->cache, name, &id) < 0) {
		rc = wf_diag_set(diag, WF_ENOT_RESIDENT,
		                 "model '%s' is not resident on worker '%s' (external residency: "
		                 "attach it with a residency command first)",
		                 name, s->worker_id);
		goto out;
	}
	if (!external && (rc = wf_worker_svc_resolve(s, name, agent_ms, true, &id, &d)) < 0) {
		wf_diag_set(diag, rc, "%s", wf_diag_str(&d, rc));
		goto out;
	}
	if ((rc = wf_cache_status(s->cache, &st)) < 0)
		goto out;
	const struct wf_cache_model_status *ms = NULL;
	for (size_t i = 0; i < st->n_models && !ms; i++)
		if (st->models[i].id == id)
			ms = &st->models[i];
	if (!ms) {
		rc = wf_diag_set(diag, WF_ENOT_FOUND, "model '%s' left the cache", name);
		goto out;
	}
	if (st->mode == WF_CACHE_EXTERNAL && ms->state == WF_RESIDENCY_DISK) {
		rc = wf_diag_set(diag, WF_ENOT_RESIDENT,
		                 "model '%s' is not resident on worker '%s' (external residency: "
		                 "attach it with a residency command first)",
		                 name, s->worker_id);
		goto out;
	}
	gm = calloc(1, sizeof(*gm));
	if (!gm || !(gm->name = strdup(name))) {
		rc = -ENOMEM;
		goto out;
	}
	gm->model = wf_worker_svc_model(s, name);
	if (!gm->model) {
		rc = wf_diag_set(diag, WF_ENOT_FOUND, "model '%s' is not open", name);
		goto out;
	}
	if (ms->floor && s->shm)
		rc = view_floor(gm, s->shm, &ms->digest, &d);
	else
		rc = wf_weight_view_map_files(gm->model, &gm->view, &d);
	if (rc < 0) {
		wf_diag_set(diag, rc, "model '%s': %s", name, wf_diag_str(&d, rc));
		goto out;
	}
	if ((rc = wf_tokenizer_create(&gm->model->kv, &gm->tok, &d)) < 0) {
		wf_diag_set(diag, rc, "model '%s': tokenizer: %s", name, wf_diag_str(&d, rc));
		goto out;
	}
	/* One sequence more than completions get: the evaluations' (wf_completion_with_engine). */
	const uint32_t n_seq = cs->opts.n_seq ? cs->opts.n_seq : 8;
	struct wf_engine_config ec = {.n_ctx = cs->opts.n_ctx,
	                              .n_seq_max = n_seq + 1,
	                              .n_threads = cs->opts.n_threads,
	                              .kv_type = WF_ENGINE_KV_F16,
	                              .device = cs->opts.device,
	                              .postfetch = cs->opts.postfetch,
	                              .expert_cache_mb = cs->opts.expert_cache_mb,
	                              .experts_on_device = cs->opts.experts_on_device,
	                              .n_cpu_moe = cs->opts.n_cpu_moe,
	                              .dense_on_device = cs->opts.dense_on_device};
	/* The device refusing the engine's memory although the budget has room for it: weights
	 * the LRU may evict hold it (the budget's slack, or fragmentation). Make room one victim
	 * at a time, as the cache does for its own allocations. */
	/* The engine computes from the store's copies of what its plan puts on the device
	 * (worker/wengine.h): loaded here in self-managed mode, held for the engine's life. */
	for (int tries = 0;; tries++) {
		const struct wf_engine_weights ew = wf_weight_view_engine(&gm->view);
		rc = wf_worker_engine_open(s->cache, id, gm->model, &ew, &ec, &gm->we, &d);
		if (rc != -ENOMEM || !ec.device || tries >= WF_COMPLETION_EVICT_TRIES ||
		    wf_cache_evict_oldest(s->cache, NULL) < 0)
			break;
		wf_diag_clear(&d);
	}
	if (rc < 0) {
		wf_diag_set(
		    diag, rc, "model '%s': %s%s", name, wf_diag_str(&d, rc),
		    rc == WF_ENOT_RESIDENT && external
		        ? " (external residency: load or pin the model on this worker first)"
		        : "");
		goto out;
	}
	gm->engine = gm->we.engine;
	struct wf_engine_info info;
	wf_engine_get_info(gm->engine, &info);
	gm->n_ctx = info.n_ctx;
	gm->n_seq_sched = n_seq;
	gm->cache = s->cache;
	gm->device_bytes = info.device_bytes;
	/* A reservation for the engine's own device bytes (KV cache, activations, expert slots),
	 * and for the hold it keeps on the store's sets even when it has none of its own: the LRU
	 * and residency commands free an idle engine through it (on_resv_evict). */
	if (info.device_bytes || gm->we.device) {
		char what[WF_CACHE_NAME_MAX + 16];
		snprintf(what, sizeof what, "engine of '%s'", name);
		rc = wf_cache_resv_create(s->cache, what, info.device_bytes, on_resv_evict, cs,
		                          &gm->resv, &d);
		if (rc < 0) {
			wf_diag_set(diag, rc,
			            "model '%s': its engine holds %" PRIu64 " bytes on device %s, "
			            "more than the device budget leaves it: %s",
			            name, info.device_bytes, wf_device_name(ec.device),
			            wf_diag_str(&d, rc));
			goto out;
		}
	}
	metrics_update(gm, NULL);
	struct wf_sched_config sc = {.n_batch = cs->opts.n_batch, .n_seq = n_seq};
	if ((rc = wf_sched_create(gm->engine, gm->tok, &sc, &gm->sched, &d)) < 0) {
		wf_diag_set(diag, rc, "model '%s': %s", name, wf_diag_str(&d, rc));
		goto out;
	}
	*ret = gm;
	gm = NULL;
out:
	wf_cache_status_free(st);
	gmodel_free(gm);
	return rc;
}

static double ratio(uint64_t num, uint64_t den)
{
	return den ? (double)num / (double)den : -1.0;
}

/* Reads the engine's counters into gm->metrics; the caller holds wf_completions.mu and the engine
 * is not decoding (its own thread calls, or it has not started). res: the completion that just
 * ended, NULL for none. */
static void metrics_update(struct engine_model *gm, const struct wf_sched_result *res)
{
	struct wf_engine_stats es;
	wf_engine_get_stats(gm->engine, &es);
	struct wf_completion_metrics *m = &gm->metrics;
	m->tokens = es.tokens;
	m->fetch_experts = es.fetch_experts;
	m->fetch_bytes = es.fetch_bytes;
	m->fetch_used = es.fetch_used;
	m->fetch_fallbacks = es.fetch_fallbacks;
	m->fetch_hits = es.fetch_hits;
	m->fetch_misses = es.fetch_misses;
	m->scratchpad_bytes = es.scratchpad_bytes;
	m->fetch_overlap = es.fetch_overlap;
	m->fetch_bytes_per_token = es.tokens ? (double)es.fetch_bytes / (double)es.tokens : -1.0;
	m->fallback_rate = ratio(es.fetch_fallbacks, es.fetch_used + es.fetch_fallbacks);
	m->cache_hit_rate = ratio(es.fetch_hits, es.fetch_hits + es.fetch_misses);
	if (!res) {
		m->decode_tokens_per_s = -1.0;
		return;
	}
	m->completions++;
	/* n_gen tokens sampled, the first at the end of the prompt: n_gen - 1 decode steps. */
	if (res->n_gen > 1 && res->decode_s > 0)
		m->decode_tokens_per_s = (double)(res->n_gen - 1) / res->decode_s;
}

int wf_completion_model_metrics(struct wf_completions *cs, const char *name,
                                struct wf_completion_metrics *ret)
{
	pthread_mutex_lock(&cs->mu);
	const struct engine_model *gm = find_model_locked(cs, name);
	if (gm)
		*ret = gm->metrics;
	pthread_mutex_unlock(&cs->mu);
	return gm ? 0 : WF_ENOT_FOUND;
}

/* ---- completions -------------------------------------------------------------------------- */

static void on_token(void *arg, int32_t token, const char *text, size_t len)
{
	struct completion *x = arg;
	struct wf_completions *cs = x->cs;
	pthread_mutex_lock(&cs->mu);
	if (x->n_toks == x->cap) {
		uint32_t cap = x->cap ? x->cap * 2 : 64;
		struct out_token *nt = realloc(x->toks, cap * sizeof(*nt));
		if (!nt)
			goto lost;
		x->toks = nt;
		x->cap = cap;
	}
	if (x->text_len + len > x->text_cap) {
		size_t cap = x->text_cap ? x->text_cap * 2 : 1024;
		while (cap < x->text_len + len)
			cap *= 2;
		char *nt = realloc(x->text, cap);
		if (!nt)
			goto lost;
		x->text = nt;
		x->text_cap = cap;
	}
	if (len)
		memcpy(x->text + x->text_len, text, len);
	x->toks[x->n_toks++] =
	    (struct out_token){.id = token, .len = (uint32_t)len, .off = x->text_len};
	x->text_len += len;
	pthread_cond_broadcast(&cs->cv);
	pthread_mutex_unlock(&cs->mu);
	return;
lost:
	if (!x->lost)
		(void)wf_sched_cancel(x->gm->sched, x->sched_id);
	x->lost = true;
	pthread_mutex_unlock(&cs->mu);
}

/* The engine event: one line per finished completion, with the engine's figures so far (the
 * post-fetch ones only where post-fetch ran). */
static void log_engine_event(const char *worker, const char *model, uint64_t id,
                             const struct wf_sched_result *res,
                             const struct wf_completion_metrics *m)
{
	char rate[32], fetch[256] = "";
	if (m->decode_tokens_per_s >= 0 && res->n_gen > 1)
		snprintf(rate, sizeof rate, "%.1f", m->decode_tokens_per_s);
	else
		snprintf(rate, sizeof rate, "-");
	if (m->fetch_experts || m->scratchpad_bytes)
		snprintf(fetch, sizeof fetch,
		         "; post-fetch %.0f bytes/token, overlap %.0f%%, fallback rate %.1f%%, "
		         "scratchpad %" PRIu64 " bytes, cache hit rate %.1f%%",
		         m->fetch_bytes_per_token, m->fetch_overlap * 100.0,
		         m->fallback_rate * 100.0, m->scratchpad_bytes, m->cache_hit_rate * 100.0);
	wf_log_event(WF_LOG_INFO,
	             WF_LOG_F(.worker = worker, .model = model, .completion = id,
	                      .event = "completion_done"),
	             "completion %" PRIu64 " done: %u+%u tokens, %s tokens/s%s", id, res->n_prompt,
	             res->n_gen, rate, fetch);
}

static void on_done(void *arg, const struct wf_sched_result *res)
{
	struct completion *x = arg;
	struct wf_completions *cs = x->cs;
	pthread_mutex_lock(&cs->mu);
	x->res = *res;
	metrics_update(x->gm, res);
	struct wf_completion_metrics m = x->gm->metrics;
	uint64_t id = x->id;
	char model[WF_CACHE_NAME_MAX];
	snprintf(model, sizeof model, "%s", x->gm->name);
	if (x->lost) {
		x->res.reason = WF_SCHED_FINISH_ERROR;
		x->res.error = -ENOMEM;
		snprintf(x->res.message, sizeof x->res.message, "out of memory for the output");
	}
	/* The last use of the engine by this completion (its last step is ending): from here the
	 * cache may evict it; the eviction joins the step thread, so the step still finishes. */
	if (x->resv)
		(void)wf_cache_resv_release(x->gm->cache, x->resv);
	x->resv = 0;
	x->done = true;
	x->done_at = now_s();
	pthread_cond_broadcast(&cs->cv);
	pthread_mutex_unlock(&cs->mu);
	log_engine_event(cs->svc->worker_id, model, id, res, &m);
}

static void completion_free(struct completion *x)
{
	if (!x)
		return;
	free(x->toks);
	free(x->text);
	free(x);
}

/* Cancels completions nobody reads any more (the client went away) and drops finished ones
 * nobody collected, every quarter second. */
static void *reaper_main(void *arg)
{
	struct wf_completions *cs = arg;
	pthread_mutex_lock(&cs->mu);
	while (!cs->closing) {
		struct timespec ts;
		deadline_after(&ts, 250);
		pthread_cond_timedwait(&cs->cv, &cs->mu, &ts);
		double t = now_s();
		for (uint32_t i = 0; i < cs->n_runs;) {
			struct completion *x = cs->runs[i];
			bool idle = !x->readers && t - x->last_seen > x->idle_ms / 1000.0;
			/* A finished one stays readable for a while after its end too, so a client
			 * that comes back late learns how it ended. */
			double keep = x->idle_ms > WF_COMPLETION_IDLE_MS
			                  ? x->idle_ms / 1000.0
			                  : WF_COMPLETION_IDLE_MS / 1000.0;
			double since = x->last_seen > x->done_at ? x->last_seen : x->done_at;
			if (x->done && !x->readers && t - since > keep) {
				cs->runs[i] = cs->runs[--cs->n_runs];
				completion_free(x);
				continue;
			}
			if (idle && !x->done)
				(void)wf_sched_cancel(x->gm->sched, x->sched_id);
			i++;
		}
		/* Freed outside the lock: a scheduler going down runs its done callbacks, which
		 * take it. */
		for (uint32_t r = 0; r < cs->n_retired;) {
			struct engine_model *gm = cs->retired[r];
			if (gm_used_locked(cs, gm)) {
				r++;
				continue;
			}
			cs->retired[r] = cs->retired[--cs->n_retired];
			cs->reaping_resv = gm->resv;
			pthread_mutex_unlock(&cs->mu);
			gmodel_free(gm);
			pthread_mutex_lock(&cs->mu);
			cs->reaping_resv = 0;
			pthread_cond_broadcast(&cs->cv);
			r = 0;
		}
	}
	pthread_mutex_unlock(&cs->mu);
	return NULL;
}

/* The model went back to disk: see wf_completion_create. A model without an engine: nothing
 * happens. */
static void retire(struct wf_completions *cs, const char *name)
{
	pthread_mutex_lock(&cs->mu);
	struct engine_model *gm = find_model_locked(cs, name);
	if (gm && cs->n_retired < WF_COMPLETION_MAX + WF_COMPLETION_MODELS_MAX) {
		for (uint32_t i = 0; i < cs->n_models; i++)
			if (cs->models[i] == gm) {
				cs->models[i] = cs->models[--cs->n_models];
				break;
			}
		cs->retired[cs->n_retired++] = gm;
		for (uint32_t i = 0; i < cs->n_runs; i++)
			if (cs->runs[i]->gm == gm && !cs->runs[i]->done)
				(void)wf_sched_cancel(gm->sched, cs->runs[i]->sched_id);
		pthread_cond_broadcast(&cs->cv);
	}
	pthread_mutex_unlock(&cs->mu);
}

static int serve(struct wf_completions *cs);

int wf_completion_create(struct wf_worker_svc *svc, const struct wf_completion_opts *opts,
                         struct wf_completions **ret)
{
	struct wf_completions *cs = calloc(1, sizeof(*cs));
	if (!cs)
		return -ENOMEM;
	cs->svc = svc;
	if (opts)
		cs->opts = *opts;
	pthread_mutex_init(&cs->mu, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&cs->cv, &ca);
	pthread_condattr_destroy(&ca);
	/* Ids that a restarted worker does not hand out again: a random high half. */
	uint32_t r = 0;
	if (getrandom(&r, sizeof r, GRND_NONBLOCK) != sizeof r)
		r = (uint32_t)getpid() ^ (uint32_t)time(NULL);
	cs->next_id = ((uint64_t)(r | 1u) << 32) | 1u;
	int rc = -pthread_create(&cs->reaper, NULL, reaper_main, cs);
	if (rc < 0) {
		wf_completion_destroy(cs);
		return rc;
	}
	cs->reaper_started = true;
	if ((rc = serve(cs)) < 0) {
		wf_completion_destroy(cs);
		return rc;
	}
	*ret = cs;
	return 0;
}

void wf_completion_close(struct wf_completions *cs)
{
	if (!cs)
		return;
	pthread_mutex_lock(&cs->mu);
	cs->closing = true;
	pthread_cond_broadcast(&cs->cv);
	pthread_mutex_unlock(&cs->mu);
}

void wf_completion_destroy(struct wf_completions *cs)
{
	if (!cs)
		return;
	wf_completion_close(cs);
	if (cs->reaper_started)
		pthread_join(cs->reaper, NULL);
	/* Each scheduler cancels its requests and runs their done callbacks on the way down. */
	for (uint32_t i = 0; i < cs->n_models; i++)
		gmodel_free(cs->models[i]);
	for (uint32_t i = 0; i < cs->n_retired; i++)
		gmodel_free(cs->retired[i]);
	for (uint32_t i = 0; i < cs->n_runs; i++)
		completion_free(cs->runs[i]);
	pthread_cond_destroy(&cs->cv);
	pthread_mutex_destroy(&cs->mu);
	free(cs);
}

static Weightfloor__V1__FinishReason finish_pb(enum wf_sched_finish f)
{
	switch (f) {
	case WF_SCHED_FINISH_EOS:
		return WEIGHTFLOOR__V1__FINISH_REASON__FINISH_REASON_EOS;
	case WF_SCHED_FINISH_STOP:
		return WEIGHTFLOOR__V1__FINISH_REASON__FINISH_REASON_STOP;
	case WF_SCHED_FINISH_LENGTH:
		return WEIGHTFLOOR__V1__FINISH_REASON__FINISH_REASON_LENGTH;
	case WF_SCHED_FINISH_CONTEXT:
		return WEIGHTFLOOR__V1__FINISH_REASON__FINISH_REASON_CONTEXT;
	case WF_SCHED_FINISH_CANCELED:
		return WEIGHTFLOOR__V1__FINISH_REASON__FINISH_REASON_CANCELED;
	default:
		return WEIGHTFLOOR__V1__FINISH_REASON__FINISH_REASON_ERROR;
	}
}

/* The reply for x from token index after on. Under cs->mu. */
static int reply_locked(struct wf_completions *cs, struct completion *x, uint32_t after,
                        Weightfloor__V1__Reply *reply, struct wf_ctl_call *call)
{
	Weightfloor__V1__GenerateReply *gr = wf_ctl_call_alloc(call, sizeof(*gr));
	if (!gr)
		return -ENOMEM;
	weightfloor__v1__generate_reply__init(gr);
	gr->completion_id = x->id;
	gr->worker_id = (char *)cs->svc->worker_id;
	gr->model = x->gm->name;
	gr->seed = x->seed;
	gr->prompt_tokens = x->n_prompt;
	if (after > x->n_toks)
		after = x->n_toks;
	uint32_t n = x->n_toks - after;
	if (n > WF_COMPLETION_REPLY_TOKENS)
		n = WF_COMPLETION_REPLY_TOKENS;
	gr->first = after;
	if (n) {
		Weightfloor__V1__GeneratedToken *tv = wf_ctl_call_calloc(call, n, sizeof(*tv));
		Weightfloor__V1__GeneratedToken **tp = wf_ctl_call_calloc(call, n, sizeof(*tp));
		if (!tv || !tp)
			return -ENOMEM;
		for (uint32_t i = 0; i < n; i++) {
			const struct out_token *t = &x->toks[after + i];
			weightfloor__v1__generated_token__init(&tv[i]);
			tv[i].id = t->id;
			if (t->len) {
				uint8_t *b = wf_ctl_call_alloc(call, t->len);
				if (!b)
					return -ENOMEM;
				memcpy(b, x->text + t->off, t->len);
				tv[i].text.data = b;
				tv[i].text.len = t->len;
			}
			tp[i] = &tv[i];
		}
		gr->tokens = tp;
		gr->n_tokens = n;
	}
	if (x->done && after + n == x->n_toks) {
		const struct wf_sched_result *r = &x->res;
		gr->done = true;
		gr->finish = finish_pb(r->reason);
		if (r->message[0] && !(gr->error = wf_ctl_call_strdup(call, r->message)))
			return -ENOMEM;
		Weightfloor__V1__GenerateTimings *tm = wf_ctl_call_alloc(call, sizeof(*tm));
		if (!tm)
			return -ENOMEM;
		weightfloor__v1__generate_timings__init(tm);
		tm->prompt_tokens = r->n_prompt;
		tm->generated_tokens = r->n_gen;
		tm->queue_ms = r->queue_s * 1e3;
		tm->prompt_ms = r->prompt_s * 1e3;
		tm->decode_ms = r->decode_s * 1e3;
		tm->time_to_first_token_ms = r->first_token_s * 1e3;
		tm->prompt_tokens_per_s = r->prompt_s > 0 ? r->n_prompt / r->prompt_s : 0;
		tm->decode_tokens_per_s =
		    r->decode_s > 0 && r->n_gen > 1 ? (r->n_gen - 1) / r->decode_s : 0;
		gr->timings = tm;
	}
	reply->body_case = WEIGHTFLOOR__V1__REPLY__BODY_GENERATE;
	reply->generate = gr;
	return 0;
}

/* Waits (under cs->mu) until x has more than after tokens, ends, the worker closes, or wait_ms
 * pass. */
static void wait_locked(struct wf_completions *cs, struct completion *x, uint32_t after,
                        uint32_t wait_ms)
{
	if (wait_ms > WF_COMPLETION_WAIT_MAX_MS)
		wait_ms = WF_COMPLETION_WAIT_MAX_MS;
	struct timespec ts;
	deadline_after(&ts, wait_ms);
	while (!cs->closing && !x->done && x->n_toks <= after)
		if (pthread_cond_timedwait(&cs->cv, &cs->mu, &ts) == ETIMEDOUT)
			break;
}

static int fail(Weightfloor__V1__Reply *reply, struct wf_ctl_call *call, int rc,
                const struct wf_diag *d)
{
	reply->message = wf_ctl_call_strdup(call, wf_diag_str(d, rc));
	return rc;
}

/* The protocol's sampling (zero: off) as the sampler's parameters. */
static void sampling_from_pb(const Weightfloor__V1__Sampling *p, struct wf_sampler_params *sp)
{
	wf_sampler_params_default(sp);
	if (!p)
		return;
	sp->temperature = p->temperature;
	sp->top_k = p->top_k;
	sp->top_p = p->top_p == 0.0f ? 1.0f : p->top_p;
	sp->min_p = p->min_p;
	sp->repeat_penalty = p->repeat_penalty == 0.0f ? 1.0f : p->repeat_penalty;
	if (p->repeat_last_n)
		sp->repeat_last_n = p->repeat_last_n;
	sp->seed = p->seed;
}

/* handle_start once the model's engine is there; *ret_passed: the completion took
 * over the hold on resv. */
static int start(struct wf_completions *cs, const Weightfloor__V1__Generate *req,
                 struct engine_model *gm, uint32_t resv, struct wf_sched_request *srp,
                 Weightfloor__V1__Reply *reply, struct wf_ctl_call *call, bool *ret_passed)
{
	struct wf_diag d = {{0}};
	struct wf_sched_request sr = *srp;
	bool has_text = req->prompt && *req->prompt;
	int rc;
	int32_t *ids = NULL;
	size_t n_ids = 0;
	if (has_text) {
		/* llama.cpp's prompt: BOS where the vocabulary adds one, special tokens parsed. */
		rc = wf_tokenizer_encode(gm->tok, req->prompt, strlen(req->prompt), true, true,
		                         &ids, &n_ids, &d);
		if (rc < 0)
			return fail(reply, call, rc, &d);
		if (n_ids == 0) {
			free(ids);
			return fail(reply, call, wf_diag_set(&d, WF_EINVAL, "empty prompt"), &d);
		}
		sr.tokens = ids;
		sr.n_tokens = n_ids;
	} else {
		sr.tokens = req->prompt_ids;
		sr.n_tokens = req->n_prompt_ids;
	}
	if (sr.n_tokens > gm->n_ctx) {
		free(ids);
		return fail(reply, call,
		            wf_diag_set(&d, WF_EINVAL,
		                        "the prompt has %zu tokens, more than the context of %u",
		                        sr.n_tokens, gm->n_ctx),
		            &d);
	}
	if (sr.sampling.seed == 0) {
		uint64_t seed = 0;
		if (getrandom(&seed, sizeof seed, GRND_NONBLOCK) != sizeof seed)
			seed = (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull;
		sr.sampling.seed = seed ? seed : 1;
	}
	sr.max_tokens = req->max_tokens ? req->max_tokens : WF_COMPLETION_MAX_TOKENS;
	sr.stop = (const char *const *)req->stop;
	sr.n_stop = req->n_stop;
	sr.ignore_eos = req->ignore_eos;
	sr.on_token = on_token;
	sr.on_done = on_done;

	struct completion *x = calloc(1, sizeof(*x));
	if (!x) {
		free(ids);
		return -ENOMEM;
	}
	x->cs = cs;
	x->gm = gm;
	x->seed = sr.sampling.seed;
	x->n_prompt = (uint32_t)sr.n_tokens;
	x->resv = resv;
	x->idle_ms = req->idle_timeout_ms ? req->idle_timeout_ms : WF_COMPLETION_IDLE_MS;
	x->last_seen = now_s();
	sr.arg = x;
	pthread_mutex_lock(&cs->mu);
	if (cs->closing) {
		rc = wf_diag_set(&d, WF_EUNAVAILABLE, "the worker is stopping");
	} else if (cs->n_runs == WF_COMPLETION_MAX) {
		rc = wf_diag_set(&d, WF_ELIMIT, "%d completions in progress or unread: retry later",
		                 WF_COMPLETION_MAX);
	} else {
		x->id = cs->next_id++;
		/* Submitted under mu: the callbacks take mu, so none can run before the
		 * completion is in the table with its scheduler id. */
		rc = wf_sched_submit(gm->sched, &sr, &x->sched_id, &d);
		if (rc == 0)
			cs->runs[cs->n_runs++] = x;
	}
	bool in_table = rc == 0;
	*ret_passed = in_table;
	if (rc == 0) {
		x->readers++;
		wait_locked(cs, x, 0, req->wait_ms);
		x->readers--;
		x->last_seen = now_s();
		/* Out of memory here leaves the completion running: the client may read it. */
		rc = reply_locked(cs, x, 0, reply, call);
	}
	pthread_mutex_unlock(&cs->mu);
	free(ids);
	if (!in_table)
		completion_free(x);
	if (rc < 0)
		return fail(reply, call, rc, &d);
	return 0;
}

/* Generate; agent_ms bounds the agent's part of a load. */
static int handle_start(struct wf_completions *cs, const Weightfloor__V1__Generate *req,
                        int agent_ms, Weightfloor__V1__Reply *reply, struct wf_ctl_call *call)
{
	struct wf_diag d = {{0}};
	int rc;
	bool has_text = req->prompt && *req->prompt;
	if (!req->model || !*req->model)
		return fail(reply, call, wf_diag_set(&d, WF_EINVAL, "no model named"), &d);
	if (has_text && req->n_prompt_ids)
		return fail(reply, call,
		            wf_diag_set(&d, WF_EINVAL, "give prompt or prompt_ids, not both"), &d);
	if (!has_text && !req->n_prompt_ids)
		return fail(reply, call, wf_diag_set(&d, WF_EINVAL, "empty prompt"), &d);
	if (req->idle_timeout_ms > WF_COMPLETION_IDLE_MAX_MS)
		return fail(reply, call,
		            wf_diag_set(&d, WF_EINVAL, "idle_timeout_ms is at most %d",
		                        WF_COMPLETION_IDLE_MAX_MS),
		            &d);
	struct wf_sched_request sr = {0};
	sampling_from_pb(req->sampling, &sr.sampling);
	/* Checked before any model is loaded: a bad request costs nothing. */
	if ((rc = wf_sampler_params_check(&sr.sampling, &d)) < 0)
		return fail(reply, call, rc, &d);
	if (req->n_stop > WF_SCHED_STOP_MAX)
		return fail(reply, call,
		            wf_diag_set(&d, WF_EINVAL, "%zu stop strings: at most %d", req->n_stop,
		                        WF_SCHED_STOP_MAX),
		            &d);
	struct engine_model *gm = NULL;
	uint32_t resv = 0;
	if ((rc = model_get(cs, req->model, agent_ms, &gm, &resv, &d)) < 0)
		return fail(reply, call, rc, &d);
	/* The engine's reservation is held from here: it passes to the completion, or is released
	 * on the way out. */
	bool passed = false;
	rc = start(cs, req, gm, resv, &sr, reply, call, &passed);
	if (resv && !passed)
		(void)wf_cache_resv_release(gm->cache, resv);
	return rc;
}

static int handle_read(struct wf_completions *cs, const Weightfloor__V1__GenerateRead *req,
                       Weightfloor__V1__Reply *reply, struct wf_ctl_call *call)
{
	pthread_mutex_lock(&cs->mu);
	struct completion *x = NULL;
	for (uint32_t i = 0; i < cs->n_runs; i++)
		if (cs->runs[i]->id == req->completion_id)
			x = cs->runs[i];
	if (!x) {
		pthread_mutex_unlock(&cs->mu);
		reply->message = wf_ctl_call_printf(
		    call,
		    "no completion %llu on worker '%s' (never started, or finished and "
		    "not read for its idle time-out)",
		    (unsigned long long)req->completion_id, cs->svc->worker_id);
		return WF_ENOT_FOUND;
	}
	x->last_seen = now_s();
	x->readers++;
	uint32_t after = req->after;
	if (req->cancel && !x->done) {
		(void)wf_sched_cancel(x->gm->sched, x->sched_id);
		/* The step thread ends it at its next step: wait for that, so the reply is final.
		 */
		struct timespec ts;
		deadline_after(&ts, WF_COMPLETION_WAIT_MAX_MS);
		while (!x->done && !cs->closing)
			if (pthread_cond_timedwait(&cs->cv, &cs->mu, &ts) == ETIMEDOUT)
				break;
		after = x->n_toks < after ? x->n_toks : after;
	} else {
		wait_locked(cs, x, after, req->wait_ms);
	}
	x->readers--;
	x->last_seen = now_s();
	int rc = reply_locked(cs, x, after, reply, call);
	pthread_mutex_unlock(&cs->mu);
	return rc;
}

/* ---- what residency commands and published generations need of the engines --------------- */

/* Frees the idle engines of model (NULL: every one) through their reservations, as the LRU would
 * (on_resv_evict): an engine with a completion running keeps its reservation acquired, and
 * stays. */
static void release_idle(struct wf_completions *cs, const char *model)
{
	uint32_t resv[WF_COMPLETION_MODELS_MAX], n = 0;
	struct wf_cache *cache = NULL;
	pthread_mutex_lock(&cs->mu);
	for (uint32_t i = 0; i < cs->n_models; i++) {
		const struct engine_model *gm = cs->models[i];
		if (gm->resv && (!model || strcmp(gm->name, model) == 0)) {
			resv[n++] = gm->resv;
			cache = gm->cache;
		}
	}
	pthread_mutex_unlock(&cs->mu);
	for (uint32_t i = 0; i < n; i++)
		(void)wf_cache_resv_evict(cache, resv[i]);
}

struct refresh_job {
	struct engine_model *gm;
	uint32_t n;
	const uint32_t *ids;
	struct wf_diag *diag;
};

/* On the scheduler's step thread, between two steps. */
static int refresh_step(void *arg, struct wf_engine *e)
{
	struct refresh_job *j = arg;
	struct wf_engine_weights w = wf_weight_view_engine(&j->gm->view);
	w.device = j->gm->we.device;
	return wf_engine_refresh(e, j->n, j->ids, &w, j->diag);
}

/* The model's engine takes the floor's new bytes of the tensors (its own attachment: the new
 * entries' places in the spare area) and the store's new copies of those it holds, at its step
 * boundary. An engine being built is waited for first (its view may predate the publish). */
static int refresh(struct wf_completions *cs, const char *model, uint32_t n, const uint32_t *ids,
                   void *const *device, struct wf_diag *diag)
{
	pthread_mutex_lock(&cs->mu);
	while (loading_locked(cs, model) && !cs->closing)
		pthread_cond_wait(&cs->cv, &cs->mu);
	struct engine_model *gm = find_model_locked(cs, model);
	/* Held: neither evicted (its reservation acquired) nor freed (refreshing) meanwhile. */
	if (gm && gm->resv && wf_cache_resv_acquire(gm->cache, gm->resv) < 0)
		gm = NULL; /* being evicted: the next build reads the new bytes */
	if (gm)
		gm->refreshing++;
	pthread_mutex_unlock(&cs->mu);
	if (!gm)
		return 0;
	int rc = 0;
	for (uint32_t i = 0; i < n && rc == 0; i++) {
		if (ids[i] >= gm->model->n_tensors) {
			rc = wf_diag_set(diag, WF_EINVAL, "model '%s' has no tensor %u", model,
			                 ids[i]);
			break;
		}
		if (gm->region) {
			struct wf_shm_tensor_info info;
			if ((rc = wf_shm_region_tensor(gm->region, ids[i], &info)) < 0) {
				wf_diag_set(diag, rc, "model '%s': floor entry %u", model, ids[i]);
				break;
			}
			gm->view.tensor_data[ids[i]] = info.data;
		}
		if (gm->we.device && gm->we.device[ids[i]]) {
			if (!device[i])
				rc = wf_diag_set(
				    diag, WF_ESTATE,
				    "model '%s': the store did not refresh tensor %u that "
				    "the engine holds",
				    model, ids[i]);
			else
				gm->we.device[ids[i]] = device[i];
		}
	}
	struct refresh_job j = {gm, n, ids, diag};
	if (rc == 0)
		rc = wf_sched_between(gm->sched, refresh_step, &j);
	pthread_mutex_lock(&cs->mu);
	gm->refreshing--;
	pthread_cond_broadcast(&cs->cv);
	pthread_mutex_unlock(&cs->mu);
	if (gm->resv)
		(void)wf_cache_resv_release(gm->cache, gm->resv);
	return rc;
}

/* ---- evaluations ------------------------------------------------------------------------- */

struct eval_job {
	struct engine_model *gm;
	wf_completion_engine_fn fn;
	void *arg;
};

static int eval_step(void *arg, struct wf_engine *e)
{
	const struct eval_job *j = arg;
	/* the sequence past the scheduler's (build_model made one more) */
	return j->fn(j->arg, e, j->gm->tok, j->gm->n_seq_sched);
}

int wf_completion_with_engine(struct wf_completions *cs, const char *model, int agent_ms,
                              wf_completion_engine_fn fn, void *arg, struct wf_diag *diag)
{
	struct engine_model *gm = NULL;
	uint32_t resv = 0;
	int rc = model_get(cs, model, agent_ms, &gm, &resv, diag);
	if (rc < 0)
		return rc;
	pthread_mutex_lock(&cs->mu);
	gm->refreshing++; /* not freed while it runs, reservation or not */
	pthread_mutex_unlock(&cs->mu);
	struct eval_job j = {gm, fn, arg};
	rc = wf_sched_between(gm->sched, eval_step, &j);
	pthread_mutex_lock(&cs->mu);
	gm->refreshing--;
	pthread_cond_broadcast(&cs->cv);
	pthread_mutex_unlock(&cs->mu);
	if (resv)
		(void)wf_cache_resv_release(gm->cache, resv);
	return rc;
}

/* ---- the service's dispatch table (worker/service.h) -------------------------------------- */

static int ext_handle(void *ctx, const Weightfloor__V1__Request *req, int agent_ms,
                      Weightfloor__V1__Reply *reply, struct wf_ctl_call *call)
{
	struct wf_completions *cs = ctx;
	if (req->body_case == WEIGHTFLOOR__V1__REQUEST__BODY_GENERATE)
		return handle_start(cs, req->generate, agent_ms, reply, call);
	return handle_read(cs, req->generate_read, reply, call);
}

static void ext_model_to_disk(void *ctx, const char *model)
{
	retire(ctx, model);
}

static void ext_release_idle(void *ctx, const char *model)
{
	release_idle(ctx, model);
}

static int ext_refresh(void *ctx, const char *model, uint32_t n, const uint32_t *ids,
                       void *const *device, struct wf_diag *diag)
{
	return refresh(ctx, model, n, ids, device, diag);
}

/* What the model's engine holds and how it places the work (docs/PROTOCOL.md "What a worker
 * holds"). The engine's getters may run beside a decode; the lock keeps it from being freed. */
static void describe_engine(struct wf_completions *cs, const char *model,
                            Weightfloor__V1__ModelResidency *r, struct wf_ctl_call *call)
{
	pthread_mutex_lock(&cs->mu);
	const struct engine_model *gm = find_model_locked(cs, model);
	if (gm && gm->engine) {
		struct wf_engine_info info;
		wf_engine_get_info(gm->engine, &info);
		r->placement = wf_ctl_call_strdup(call, info.placement);
		r->engine_device_bytes = info.device_bytes;
		r->expert_slots = info.n_slots;
		r->cached_experts =
		    info.n_slots ? wf_ctl_call_calloc(call, info.n_slots, sizeof(uint32_t)) : NULL;
		if (r->cached_experts) {
			const uint32_t n =
			    wf_engine_cached_experts(gm->engine, r->cached_experts, info.n_slots);
			r->n_cached_experts = n < info.n_slots ? n : info.n_slots;
		}
	}
	pthread_mutex_unlock(&cs->mu);
}

/* The engine's metrics in a model's residency (docs/PROTOCOL.md "Engine metrics"). */
static void ext_describe_model(void *ctx, const char *model, Weightfloor__V1__ModelResidency *r,
                               struct wf_ctl_call *call)
{
	struct wf_completion_metrics m;
	if (wf_completion_model_metrics(ctx, model, &m) < 0)
		return;
	r->engine = true;
	r->engine_completions = m.completions;
	r->engine_tokens = m.tokens;
	r->decode_tokens_per_s = m.decode_tokens_per_s;
	r->fetch_bytes = m.fetch_bytes;
	r->fetch_bytes_per_token = m.fetch_bytes_per_token;
	r->fetch_overlap = m.fetch_overlap;
	r->fetch_fallback_rate = m.fallback_rate;
	r->scratchpad_bytes = m.scratchpad_bytes;
	r->cache_hit_rate = m.cache_hit_rate;
	r->fetch_experts = m.fetch_experts;
	r->fetch_fallbacks = m.fetch_fallbacks;
	r->fetch_hits = m.fetch_hits;
	r->fetch_misses = m.fetch_misses;
	describe_engine(ctx, model, r, call);
}

static int serve(struct wf_completions *cs)
{
	static const struct wf_worker_svc_ext ext = {
	    .handle = ext_handle,
	    .model_to_disk = ext_model_to_disk,
	    .describe_model = ext_describe_model,
	    .release_idle = ext_release_idle,
	    .refresh = ext_refresh,
	};
	static const Weightfloor__V1__Request__BodyCase kinds[] = {
	    WEIGHTFLOOR__V1__REQUEST__BODY_GENERATE,
	    WEIGHTFLOOR__V1__REQUEST__BODY_GENERATE_READ,
	};
	return wf_worker_svc_extend(cs->svc, &ext, cs, kinds, sizeof kinds / sizeof kinds[0]);
}
