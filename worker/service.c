#include "worker/service.h"

#include "base/error.h"
#include "proto/status.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int wf_worker_svc_init(struct wf_worker_svc *s)
{
	memset(s, 0, sizeof(*s));
	pthread_mutex_init(&s->mu, NULL);
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	s->started_unix_ms = (int64_t)ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
	return 0;
}

void wf_worker_svc_fini(struct wf_worker_svc *s)
{
	/* The cache has been destroyed before this: the models are no longer borrowed. */
	for (size_t i = 0; i < s->n_models; i++) {
		free(s->models[i].name);
		free(s->models[i].path);
		wf_model_close(s->models[i].model);
	}
	s->n_models = 0;
	pthread_mutex_destroy(&s->mu);
}

static struct wf_worker_model *find_locked(struct wf_worker_svc *s, const char *name)
{
	for (size_t i = 0; i < s->n_models; i++)
		if (strcmp(s->models[i].name, name) == 0)
			return &s->models[i];
	return NULL;
}

static struct wf_worker_model *add_locked(struct wf_worker_svc *s, const char *name,
                                          const char *path)
{
	if (s->n_models == WF_WORKER_MAX_MODELS)
		return NULL;
	struct wf_worker_model *m = &s->models[s->n_models];
	memset(m, 0, sizeof(*m));
	m->name = strdup(name);
	m->path = path ? strdup(path) : NULL;
	if (!m->name || (path && !m->path)) {
		free(m->name);
		free(m->path);
		return NULL;
	}
	s->n_models++;
	return m;
}

int wf_worker_svc_declare(struct wf_worker_svc *s, const char *name, const char *path,
                          struct wf_diag *diag)
{
	pthread_mutex_lock(&s->mu);
	int rc = 0;
	if (find_locked(s, name))
		rc = wf_diag_set(diag, WF_EDUPLICATE, "model '%s' declared twice", name);
	else if (!add_locked(s, name, path))
		rc = wf_diag_set(diag, WF_ELIMIT, "too many models");
	pthread_mutex_unlock(&s->mu);
	return rc;
}

/* Asks the agent to make sure the model's floor exists, within timeout_ms, and learns its digest
 * (the floor's name). An agent that is not connected (not running: the client keeps redialling)
 * gets a second at most to come up, so a worker without its agent answers at once instead of
 * spending the request's whole budget waiting for a connection. */
static int ask_agent(struct wf_worker_svc *s, const char *name, int timeout_ms,
                     struct wf_digest *ret_digest, struct wf_diag *diag)
{
	if (timeout_ms <= 0)
		return wf_diag_set(diag, WF_ETIMEOUT, "agent: no time left to ask for model '%s'",
		                   name);
	int rc = wf_ctl_client_wait_connected(s->agent, timeout_ms < WF_WORKER_AGENT_CONNECT_MS
	                                                    ? timeout_ms
	                                                    : WF_WORKER_AGENT_CONNECT_MS);
	if (rc < 0)
		return wf_diag_set(diag, rc, "agent: not connected (not running?)");
	Weightfloor__V1__EnsureFloor ef = WEIGHTFLOOR__V1__ENSURE_FLOOR__INIT;
	ef.name = (char *)name;
	ef.wait = true;
	/* The agent gives up waiting first, so its answer arrives within our time. */
	ef.wait_timeout_ms = (uint32_t)(timeout_ms - timeout_ms / 10);
	if (ef.wait_timeout_ms == 0)
		ef.wait_timeout_ms = 1;
	Weightfloor__V1__Request req = WEIGHTFLOOR__V1__REQUEST__INIT;
	req.client = (char *)s->worker_id;
	req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_ENSURE_FLOOR;
	req.ensure_floor = &ef;
	Weightfloor__V1__Reply *rep = NULL;
	rc = wf_ctl_client_call_timeout(s->agent, &req, timeout_ms, &rep, diag);
	if (rc < 0)
		return wf_diag_set(diag, rc, "agent: %s", wf_diag_str(diag, rc));
	rc = wf_proto_status_to_err(rep->code);
	if (rc < 0) {
		wf_diag_set(diag, rc, "agent: model '%s': %s", name, rep->message);
	} else if (rep->body_case != WEIGHTFLOOR__V1__REPLY__BODY_MODEL_INFO ||
	           !rep->model_info->digest_hex ||
	           wf_digest_parse(rep->model_info->digest_hex, ret_digest) < 0) {
		rc = wf_diag_set(diag, WF_EPROTOCOL, "agent: no floor digest for model '%s'", name);
	}
	wf_ctl_reply_free(rep);
	return rc;
}

/* A model the worker knows may have lost its floor since (the agent released or evicted it, or
 * restarted without it): before loading, ask the agent for it again, so that the bytes come from
 * the node's one copy rather than from a private read of the files. Without an agent, or when it
 * fails, the load reads the files (the residency status says which source it used). */
static void refloor(struct wf_worker_svc *s, const char *name, uint32_t id, int agent_ms)
{
	if (!s->agent)
		return;
	struct wf_cache_status *st = NULL;
	if (wf_cache_status(s->cache, &st) < 0)
		return;
	bool attached = id < st->n_models && st->models[id].floor;
	wf_cache_status_free(st);
	if (attached)
		return;
	struct wf_digest dg;
	struct wf_diag d = {{0}};
	(void)ask_agent(s, name, agent_ms, &dg, &d);
}

/* The model as the floor describes it (shm/region.h, wf_shm_region_model): the worker needs
 * neither the files nor a path, only the floor directory, so it runs in a container that cannot
 * see the model files. The attachment ends here; the cache attaches the floor again by digest. */
static int model_from_floor(struct wf_worker_svc *s, const char *name, const struct wf_digest *dg,
                            struct wf_model **ret_model, struct wf_diag *diag)
{
	struct wf_shm_region *r = NULL;
	struct wf_diag d = {{0}};
	char hex[WF_DIGEST_HEX_LEN];
	wf_digest_hex(dg, hex);
	if (!s->shm)
		return wf_diag_set(diag, WF_EUNSUPPORTED,
		                   "model '%s': the agent has floor %s but no floor directory "
		                   "is configured",
		                   name, hex);
	int rc = wf_shm_region_attach(s->shm, dg, NULL, WF_SHM_ATTACH_READER, NULL, NULL, &r, &d);
	if (rc == 0) {
		rc = wf_shm_region_model(r, ret_model, &d);
		wf_shm_region_detach(r);
	}
	if (rc < 0)
		return wf_diag_set(diag, rc, "model '%s': floor %s: %s", name, hex,
		                   wf_diag_str(&d, rc));
	return 0;
}

int wf_worker_svc_resolve(struct wf_worker_svc *s, const char *name, int agent_ms, bool for_load,
                          uint32_t *ret_id, struct wf_diag *diag)
{
	if (!name || !*name)
		return wf_diag_set(diag, WF_EINVAL, "no model named");
	if (wf_cache_model_find(s->cache, name, ret_id) == 0) {
		if (for_load)
			refloor(s, name, *ret_id, agent_ms);
		return 0;
	}
	pthread_mutex_lock(&s->mu);
	struct wf_worker_model *m = find_locked(s, name);
	bool in_cache = m && m->in_cache, has_path = m && m->path;
	uint32_t id = m ? m->id : 0;
	pthread_mutex_unlock(&s->mu);
	if (in_cache) {
		if (for_load)
			refloor(s, name, id, agent_ms);
		*ret_id = id;
		return 0;
	}
	int rc = 0;
	struct wf_digest dg;
	struct wf_model *floor_model = NULL;
	if (s->agent) {
		/* Even a model declared with --model: the agent ensures the node's floor, and the
		 * model is built from that floor alone (the path is for running without an agent).
		 * Not under mu: a slow or absent agent must not hold up requests for other models.
		 * Two requests for the same new model may both ask; EnsureFloor materializes once,
		 * and the loser's model is dropped below. */
		struct wf_diag ad = {{0}};
		rc = ask_agent(s, name, agent_ms, &dg, &ad);
		if (rc == 0)
			rc = model_from_floor(s, name, &dg, &floor_model, &ad);
		if (rc < 0 && !has_path)
			return wf_diag_set(diag, rc, "%s", wf_diag_str(&ad, rc));
		rc = 0;
	}
	pthread_mutex_lock(&s->mu);
	m = find_locked(s, name);
	if (m && m->in_cache) { /* added meanwhile */
		*ret_id = m->id;
		goto out;
	}
	if (!m && !floor_model) {
		rc = wf_diag_set(diag, WF_ENOT_FOUND,
		                 "no model named '%s' (declare it with --model "
		                 "or register it with the agent)",
		                 name);
		goto out;
	}
	if (!m && !(m = add_locked(s, name, NULL))) {
		rc = -ENOMEM;
		goto out;
	}
	if (!m->model && floor_model) {
		m->model = floor_model;
		floor_model = NULL;
	}
	if (!m->model) {
		rc = wf_model_open(m->path, &m->model, diag);
		if (rc < 0)
			goto out;
	}
	rc = wf_cache_model_add(s->cache, name, m->model, &m->id, diag);
	if (rc == 0) {
		m->in_cache = true;
		*ret_id = m->id;
	}
out:
	pthread_mutex_unlock(&s->mu);
	wf_model_close(floor_model);
	return rc;
}

const struct wf_model *wf_worker_svc_model(struct wf_worker_svc *s, const char *name)
{
	pthread_mutex_lock(&s->mu);
	struct wf_worker_model *m = find_locked(s, name);
	const struct wf_model *model = m && m->in_cache ? m->model : NULL;
	pthread_mutex_unlock(&s->mu);
	return model;
}

Weightfloor__V1__Residency wf_worker_residency_pb(enum wf_residency r)
{
	switch (r) {
	case WF_RESIDENCY_DISK:
		return WEIGHTFLOOR__V1__RESIDENCY__RESIDENCY_DISK;
	case WF_RESIDENCY_HOST:
		return WEIGHTFLOOR__V1__RESIDENCY__RESIDENCY_HOST;
	case WF_RESIDENCY_DEVICE:
		return WEIGHTFLOOR__V1__RESIDENCY__RESIDENCY_DEVICE;
	case WF_RESIDENCY_PINNED_DEVICE:
		return WEIGHTFLOOR__V1__RESIDENCY__RESIDENCY_PINNED_DEVICE;
	default:
		return WEIGHTFLOOR__V1__RESIDENCY__RESIDENCY_UNSPECIFIED;
	}
}

/* The model's weight sets resident in the store. */
static int add_sets(struct wf_worker_svc *s, struct wf_ctl_call *call,
                    const struct wf_cache_model_status *ms, Weightfloor__V1__ModelResidency *r)
{
	uint32_t n = 0;
	if (wf_cache_wset_count(s->cache, ms->id, &n) < 0 || n == 0)
		return 0;
	r->sets = wf_ctl_call_calloc(call, n, sizeof(*r->sets));
	if (!r->sets)
		return -ENOMEM;
	for (uint32_t k = 0; k < n; k++) {
		struct wf_cache_wset_status ws;
		if (wf_cache_wset_status(s->cache, ms->id, k, &ws) < 0 ||
		    (ws.state != WF_RESIDENCY_DEVICE && ws.state != WF_RESIDENCY_PINNED_DEVICE))
			continue;
		Weightfloor__V1__WeightSet *w = wf_ctl_call_alloc(call, sizeof(*w));
		if (!w)
			return -ENOMEM;
		weightfloor__v1__weight_set__init(w);
		if (!(w->name = wf_ctl_call_strdup(call, ws.name)))
			return -ENOMEM;
		w->device_bytes = ws.device_bytes;
		w->pinned = ws.state == WF_RESIDENCY_PINNED_DEVICE;
		w->tensors = ws.n_tensors;
		r->sets[r->n_sets++] = w;
	}
	return 0;
}

/* The registered modules' figures (the engines' metrics) ride along. */
static Weightfloor__V1__ModelResidency *residency_pb(struct wf_worker_svc *s,
                                                     struct wf_ctl_call *call,
                                                     const struct wf_cache_model_status *ms)
{
	Weightfloor__V1__ModelResidency *r = wf_ctl_call_alloc(call, sizeof(*r));
	if (!r)
		return NULL;
	weightfloor__v1__model_residency__init(r);
	r->model = wf_ctl_call_strdup(call, ms->name);
	r->worker_id = wf_ctl_call_strdup(call, s->worker_id);
	if (!r->model || !r->worker_id)
		return NULL;
	r->state = wf_worker_residency_pb(ms->state);
	r->device_bytes = ms->device_bytes;
	r->bytes_done = ms->loading ? ms->load_done : (ms->device_bytes ? ms->bytes : 0);
	r->bytes_total = ms->loading ? ms->load_total : ms->bytes;
	if (add_sets(s, call, ms, r) < 0)
		return NULL;
	for (size_t i = 0; i < s->n_exts; i++)
		if (s->exts[i].ext->describe_model)
			s->exts[i].ext->describe_model(s->exts[i].ctx, ms->name, r, call);
	return r;
}

static int reply_residency(struct wf_worker_svc *s, uint32_t id, Weightfloor__V1__Reply *reply,
                           struct wf_ctl_call *call)
{
	struct wf_cache_status *st = NULL;
	int rc = wf_cache_status(s->cache, &st);
	if (rc < 0)
		return rc;
	rc = WF_ENOT_FOUND;
	for (size_t i = 0; i < st->n_models; i++) {
		if (st->models[i].id != id)
			continue;
		Weightfloor__V1__ModelResidency *r = residency_pb(s, call, &st->models[i]);
		rc = r ? 0 : -ENOMEM;
		reply->body_case = WEIGHTFLOOR__V1__REPLY__BODY_RESIDENCY;
		reply->residency = r;
	}
	wf_cache_status_free(st);
	return rc;
}

Weightfloor__V1__ResidencyMode wf_worker_svc_mode_pb(enum wf_cache_mode mode)
{
	switch (mode) {
	case WF_CACHE_SELF_MANAGED:
		return WEIGHTFLOOR__V1__RESIDENCY_MODE__RESIDENCY_MODE_SELF_MANAGED;
	case WF_CACHE_EXTERNAL:
		return WEIGHTFLOOR__V1__RESIDENCY_MODE__RESIDENCY_MODE_EXTERNAL;
	default:
		return WEIGHTFLOOR__V1__RESIDENCY_MODE__RESIDENCY_MODE_UNSPECIFIED;
	}
}

static int worker_info(struct wf_worker_svc *s, Weightfloor__V1__Reply *reply,
                       struct wf_ctl_call *call)
{
	struct wf_cache_status *st = NULL;
	int rc = wf_cache_status(s->cache, &st);
	if (rc < 0)
		return rc;
	Weightfloor__V1__WorkerInfo *wi = wf_ctl_call_alloc(call, sizeof(*wi));
	Weightfloor__V1__ModelResidency **ms =
	    wf_ctl_call_calloc(call, st->n_models ? st->n_models : 1, sizeof(*ms));
	rc = wi && ms ? 0 : -ENOMEM;
	for (size_t i = 0; rc == 0 && i < st->n_models; i++)
		if (!(ms[i] = residency_pb(s, call, &st->models[i])))
			rc = -ENOMEM;
	if (rc == 0) {
		weightfloor__v1__worker_info__init(wi);
		wi->worker_id = (char *)s->worker_id;
		wi->pid = (uint32_t)getpid();
		wi->device_name = wf_ctl_call_strdup(call, wf_device_name(s->dev));
		wi->endpoint = (char *)s->endpoint;
		wi->device_total_bytes = st->mem_total;
		wi->device_budget_bytes = st->budget.on_demand;
		/* Engines' device memory (reservations) is used device memory too. */
		wi->device_used_bytes = st->resident_bytes + st->pinned_bytes + st->reserved_bytes;
		wi->models = ms;
		wi->n_models = st->n_models;
		wi->registered_unix_ms = s->started_unix_ms;
		wi->mode = wf_worker_svc_mode_pb(st->mode);
		wi->device_pinned_bytes = st->pinned_bytes;
		wi->device_weight_pool_bytes = st->budget.weight_pool;
		wi->device_pinned_overcommit = st->budget.pinned_overcommit;
		if (!wi->device_name)
			rc = -ENOMEM;
		reply->body_case = WEIGHTFLOOR__V1__REPLY__BODY_WORKER_INFO;
		reply->worker_info = wi;
	}
	wf_cache_status_free(st);
	return rc;
}

static int fail(Weightfloor__V1__Reply *reply, struct wf_ctl_call *call, int rc,
                const struct wf_diag *d)
{
	reply->message = wf_ctl_call_strdup(call, wf_diag_str(d, rc));
	return rc;
}

static enum wf_residency residency_from_pb(Weightfloor__V1__Residency r, bool *ok)
{
	*ok = true;
	switch (r) {
	case WEIGHTFLOOR__V1__RESIDENCY__RESIDENCY_DISK:
		return WF_RESIDENCY_DISK;
	case WEIGHTFLOOR__V1__RESIDENCY__RESIDENCY_HOST:
		return WF_RESIDENCY_HOST;
	case WEIGHTFLOOR__V1__RESIDENCY__RESIDENCY_DEVICE:
		return WF_RESIDENCY_DEVICE;
	case WEIGHTFLOOR__V1__RESIDENCY__RESIDENCY_PINNED_DEVICE:
		return WF_RESIDENCY_PINNED_DEVICE;
	default:
		*ok = false;
		return WF_RESIDENCY_DISK;
	}
}

/* The worker_id a request names must be ours (or empty). */
static bool for_us(struct wf_worker_svc *s, const char *id)
{
	return !id || !*id || strcmp(id, s->worker_id) == 0;
}

/* Does the request load the model's bytes (so that it should come from the floor)? */
static bool wants_bytes(const Weightfloor__V1__Request *req)
{
	switch (req->body_case) {
	case WEIGHTFLOOR__V1__REQUEST__BODY_SET_RESIDENCY:
		return req->set_residency->target != WEIGHTFLOOR__V1__RESIDENCY__RESIDENCY_DISK;
	case WEIGHTFLOOR__V1__REQUEST__BODY_PIN:
	case WEIGHTFLOOR__V1__REQUEST__BODY_PREFETCH:
		return true;
	default:
		return false;
	}
}

/* Requests of the worker slice that registered modules serve (wf_worker_svc_extend). */
static bool for_modules(Weightfloor__V1__Request__BodyCase kind)
{
	return kind == WEIGHTFLOOR__V1__REQUEST__BODY_GENERATE ||
	       kind == WEIGHTFLOOR__V1__REQUEST__BODY_GENERATE_READ ||
	       kind == WEIGHTFLOOR__V1__REQUEST__BODY_PERPLEXITY;
}

/* The worker slice of the protocol: the requests a worker serves, the model and worker they name
 * (either may be NULL), and whether the service serves them itself (the others go to the
 * modules in the dispatch table). False for a request that is not for a worker. */
static bool worker_slice(const Weightfloor__V1__Request *req, const char **ret_model,
                         const char **ret_wid, bool *ret_own)
{
	const char *model = NULL, *wid = NULL;
	switch (req->body_case) {
	case WEIGHTFLOOR__V1__REQUEST__BODY_SET_RESIDENCY:
		model = req->set_residency->model;
		wid = req->set_residency->worker_id;
		break;
	case WEIGHTFLOOR__V1__REQUEST__BODY_PIN:
		model = req->pin->model;
		wid = req->pin->worker_id;
		break;
	case WEIGHTFLOOR__V1__REQUEST__BODY_UNPIN:
		model = req->unpin->model;
		wid = req->unpin->worker_id;
		break;
	case WEIGHTFLOOR__V1__REQUEST__BODY_EVICT:
		model = req->evict->model;
		wid = req->evict->worker_id;
		break;
	case WEIGHTFLOOR__V1__REQUEST__BODY_PREFETCH:
		model = req->prefetch->model;
		wid = req->prefetch->worker_id;
		break;
	case WEIGHTFLOOR__V1__REQUEST__BODY_COMPACT:
		wid = req->compact->worker_id;
		break;
	case WEIGHTFLOOR__V1__REQUEST__BODY_WORKER_STATUS:
		wid = req->worker_status->worker_id;
		break;
	case WEIGHTFLOOR__V1__REQUEST__BODY_GENERATE:
		wid = req->generate->worker_id;
		break;
	case WEIGHTFLOOR__V1__REQUEST__BODY_GENERATE_READ:
		wid = req->generate_read->worker_id;
		break;
	case WEIGHTFLOOR__V1__REQUEST__BODY_PERPLEXITY:
		wid = req->perplexity->worker_id;
		break;
	default:
		return false;
	}
	*ret_model = model;
	*ret_wid = wid;
	*ret_own = !for_modules(req->body_case);
	return true;
}

int wf_worker_svc_extend(struct wf_worker_svc *s, const struct wf_worker_svc_ext *ext, void *ctx,
                         const Weightfloor__V1__Request__BodyCase *kinds, size_t n_kinds)
{
	if (!ext || !ext->handle || n_kinds > WF_WORKER_SVC_EXT_KINDS)
		return WF_EINVAL;
	if (s->n_exts == WF_WORKER_SVC_EXT_MAX)
		return WF_ELIMIT;
	for (size_t k = 0; k < n_kinds; k++) {
		/* A request of the worker slice that the service does not serve itself (it must
		 * know where the request names its worker), and that no module serves yet. */
		if (!for_modules(kinds[k]))
			return WF_EINVAL;
		for (size_t i = 0; i < s->n_exts; i++)
			for (size_t j = 0; j < s->exts[i].n_kinds; j++)
				if (s->exts[i].kinds[j] == kinds[k])
					return WF_EINVAL;
	}
	s->exts[s->n_exts].ext = ext;
	s->exts[s->n_exts].ctx = ctx;
	for (size_t k = 0; k < n_kinds; k++)
		s->exts[s->n_exts].kinds[k] = kinds[k];
	s->exts[s->n_exts].n_kinds = n_kinds;
	s->n_exts++;
	return 0;
}

/* Before a residency command takes device memory from model (NULL: every model). */
static void release_idle(struct wf_worker_svc *s, const char *model)
{
	for (size_t i = 0; i < s->n_exts; i++)
		if (s->exts[i].ext->release_idle)
			s->exts[i].ext->release_idle(s->exts[i].ctx, model);
}

int wf_worker_svc_refresh(struct wf_worker_svc *s, const char *model, uint32_t n,
                          const uint32_t *ids, struct wf_diag *diag)
{
	uint32_t id;
	if (!n || wf_cache_model_find(s->cache, model, &id) < 0)
		return 0;
	void **dev = calloc(n, sizeof(*dev));
	if (!dev)
		return wf_diag_set(diag, -ENOMEM, "refresh of %u tensors", n);
	struct wf_diag d = {{0}};
	/* The store first: a store without the floor attached (or nothing resident) refreshes
	 * nothing, and the engines still take the floor's new bytes where they read them. */
	int rc = wf_cache_refresh(s->cache, id, n, ids, dev, &d);
	if (rc == WF_ESTATE) {
		rc = 0;
		wf_diag_clear(&d);
	}
	if (rc < 0) {
		free(dev);
		return wf_diag_set(diag, rc, "the device store: %s", wf_diag_str(&d, rc));
	}
	for (size_t i = 0; rc == 0 && i < s->n_exts; i++)
		if (s->exts[i].ext->refresh)
			rc = s->exts[i].ext->refresh(s->exts[i].ctx, model, n, ids, dev, diag);
	/* Only once every engine swapped: the old copies may go. (On an error some engine may
	 * still read them: they stay until the next refresh or an eviction frees them.) */
	if (rc == 0)
		(void)wf_cache_refresh_done(s->cache, id);
	free(dev);
	return rc;
}

/* Compact: evicts every unpinned model and reloads the listed ones; the reply says what moved. */
static int compact(struct wf_worker_svc *s, const Weightfloor__V1__Compact *c, int agent_ms,
                   Weightfloor__V1__Reply *reply, struct wf_ctl_call *call)
{
	struct wf_diag d = {{0}};
	int rc = 0;
	uint32_t *ids = wf_ctl_call_calloc(call, c->n_reload ? c->n_reload : 1, sizeof(*ids));
	if (!ids)
		return -ENOMEM;
	for (size_t i = 0; i < c->n_reload; i++)
		if ((rc = wf_worker_svc_resolve(s, c->reload[i], agent_ms, true, &ids[i], &d)) < 0)
			return fail(reply, call, rc, &d);
	struct wf_cache_status *before = NULL, *after = NULL;
	wf_cache_status(s->cache, &before);
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	release_idle(s, NULL);
	rc = wf_cache_compact(s->cache, ids, c->n_reload, &d);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	wf_cache_status(s->cache, &after);
	Weightfloor__V1__CompactReply *cr = wf_ctl_call_alloc(call, sizeof(*cr));
	if (cr && before && after) {
		weightfloor__v1__compact_reply__init(cr);
		uint64_t reloaded = 0;
		for (size_t i = 0; i < after->n_models; i++)
			for (size_t k = 0; k < c->n_reload; k++)
				if (after->models[i].id == ids[k])
					reloaded += after->models[i].device_bytes;
		/* Compaction frees every unpinned allocation, then reloads the list. */
		cr->bytes_freed = before->resident_bytes;
		cr->bytes_moved = reloaded;
		cr->reloaded = c->reload;
		cr->n_reloaded = c->n_reload;
		cr->duration_ms = (uint64_t)((t1.tv_sec - t0.tv_sec) * 1000 +
		                             (t1.tv_nsec - t0.tv_nsec) / 1000000);
		reply->body_case = WEIGHTFLOOR__V1__REPLY__BODY_COMPACT;
		reply->compact = cr;
	}
	wf_cache_status_free(before);
	wf_cache_status_free(after);
	return rc < 0 ? fail(reply, call, rc, &d) : 0;
}

int wf_worker_svc_handle(void *ctx, const Weightfloor__V1__Request *req,
                         Weightfloor__V1__Reply *reply, struct wf_ctl_call *call)
{
	struct wf_worker_svc *s = ctx;
	struct wf_diag d = {{0}};
	uint32_t id = 0;
	int rc;
	const char *model, *wid;
	bool own;
	if (!worker_slice(req, &model, &wid, &own)) {
		reply->message = "not served by a worker: floor requests go to the agent";
		return WF_EUNSUPPORTED;
	}
	if (!for_us(s, wid)) {
		reply->message =
		    wf_ctl_call_printf(call, "this is worker '%s', not '%s'", s->worker_id, wid);
		return WF_ENOT_FOUND;
	}
	/* What the agent may take to ensure a floor: most of the client's budget, the rest is
	 * for the load and our answer. */
	int agent_ms = wf_ctl_call_time_left_ms(call, WF_WORKER_AGENT_MAX_MS);
	agent_ms -= agent_ms / 10;
	if (!own) {
		for (size_t i = 0; i < s->n_exts; i++)
			for (size_t k = 0; k < s->exts[i].n_kinds; k++)
				if (s->exts[i].kinds[k] == req->body_case)
					return s->exts[i].ext->handle(s->exts[i].ctx, req, agent_ms,
					                              reply, call);
		reply->message = "this worker does not generate";
		return WF_EUNSUPPORTED;
	}
	if (model &&
	    (rc = wf_worker_svc_resolve(s, model, agent_ms, wants_bytes(req), &id, &d)) < 0)
		return fail(reply, call, rc, &d);

	switch (req->body_case) {
	case WEIGHTFLOOR__V1__REQUEST__BODY_SET_RESIDENCY: {
		bool ok;
		enum wf_residency target = residency_from_pb(req->set_residency->target, &ok);
		if (!ok) {
			reply->message = "target must be DISK, HOST, DEVICE or PINNED_DEVICE";
			return WF_EINVAL;
		}
		if (target < WF_RESIDENCY_DEVICE)
			release_idle(s, model);
		rc = wf_cache_set_residency(s->cache, id, target, &d);
		for (size_t i = 0; rc == 0 && target == WF_RESIDENCY_DISK && i < s->n_exts; i++)
			if (s->exts[i].ext->model_to_disk)
				s->exts[i].ext->model_to_disk(s->exts[i].ctx, model);
		break;
	}
	case WEIGHTFLOOR__V1__REQUEST__BODY_PIN:
		rc = wf_cache_pin(s->cache, id, &d);
		break;
	case WEIGHTFLOOR__V1__REQUEST__BODY_UNPIN:
		rc = wf_cache_unpin(s->cache, id, &d);
		break;
	case WEIGHTFLOOR__V1__REQUEST__BODY_EVICT:
		release_idle(s, model);
		rc = wf_cache_evict(s->cache, id, &d);
		break;
	case WEIGHTFLOOR__V1__REQUEST__BODY_PREFETCH:
		if (req->prefetch->n_tensors) {
			reply->message =
			    "prefetch of single tensors is not supported yet: prefetch "
			    "the whole model";
			return WF_EUNSUPPORTED;
		}
		rc = wf_cache_prefetch(s->cache, id, true, &d);
		break;
	case WEIGHTFLOOR__V1__REQUEST__BODY_COMPACT:
		return compact(s, req->compact, agent_ms, reply, call);
	case WEIGHTFLOOR__V1__REQUEST__BODY_WORKER_STATUS:
		return worker_info(s, reply, call);
	default:
		return WF_EUNSUPPORTED;
	}
	if (rc < 0)
		return fail(reply, call, rc, &d);
	return reply_residency(s, id, reply, call);
}
