/* The cache's table (worker/cache_internal.h): models, their states, requests, status. */
#include "worker/cache_internal.h"

#include "base/error.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *wf_residency_name(enum wf_residency state)
{
	static const char *const names[] = {"DISK", "HOST", "DEVICE", "PINNED_DEVICE"};
	return (unsigned)state < WF_RESIDENCY_MAX ? names[state] : "?";
}

const char *wf_cache_mode_name(enum wf_cache_mode mode)
{
	return mode == WF_CACHE_SELF_MANAGED ? "self-managed"
	       : mode == WF_CACHE_EXTERNAL   ? "external"
	                                     : "?";
}

enum wf_cache_mode wf__cache_mode_get(struct wf_cache *c)
{
	enum wf_cache_mode mode;

	pthread_mutex_lock(&c->lock);
	mode = c->mode;
	pthread_mutex_unlock(&c->lock);
	return mode;
}

/* Called with the lock held. */
struct model *wf__cache_find_locked(struct wf_cache *c, uint32_t id)
{
	for (size_t i = 0; i < c->n_models; i++)
		if (c->models[i]->id == id)
			return c->models[i];
	return NULL;
}

/* Recomputes the budget from its inputs and the pinned bytes. Lock held. */
void wf__cache_budget_update_locked(struct wf_cache *c)
{
	struct wf_devbudget_in in = {
	    .arena = c->bin.arena,
	    .weight_fraction = c->bin.weight_fraction,
	    .wiggle_fraction = c->bin.wiggle_fraction,
	    .max_scratch = c->bin.max_scratch,
	};

	for (size_t i = 0; i < c->n_models; i++)
		in.pinned += wf__cache_set_bytes(c->models[i], true);
	/* The inputs were validated when they were set. */
	(void)wf_devbudget_compute(&in, &c->budget);
}

void wf__cache_emit(struct wf_cache *c, enum wf_cache_event_type type, const struct model *m,
                    int error, const char *msg)
{
	struct wf_cache_event ev = {
	    .type = type,
	    .id = m->id,
	    .name = m->name,
	    .state = m->state,
	    .over_budget = m->over_budget,
	    .done = m->load_done,
	    .total = m->load_total,
	    .error = error,
	    .msg = msg,
	};

	if (c->opts.event)
		c->opts.event(c->opts.event_ctx, &ev);
}

void wf__cache_set_error(struct wf_cache *c, struct model *m, int err, const struct wf_diag *diag)
{
	pthread_mutex_lock(&c->lock);
	m->last_error = err;
	snprintf(m->last_error_msg, sizeof(m->last_error_msg), "%s", wf_diag_str(diag, err));
	pthread_mutex_unlock(&c->lock);
}

int wf_cache_model_find(struct wf_cache *c, const char *name, uint32_t *ret_id)
{
	int ret = WF_ENOT_FOUND;

	if (!c || !name || !ret_id)
		return WF_EINVAL;
	pthread_mutex_lock(&c->lock);
	for (size_t i = 0; i < c->n_models; i++) {
		if (strcmp(c->models[i]->name, name) == 0) {
			*ret_id = c->models[i]->id;
			ret = 0;
			break;
		}
	}
	pthread_mutex_unlock(&c->lock);
	return ret;
}

/* Acquires a resident model under the lock. 1 when done, 0 when not resident, <0 error. */
int wf__cache_try_acquire_locked(struct wf_cache *c, uint32_t id, struct wf_cache_view *view)
{
	struct model *m = wf__cache_find_locked(c, id);

	if (!m)
		return WF_ENOT_FOUND;
	if (!resident(m))
		return 0;
	m->acquired++;
	m->lru = ++c->tick;
	if (view)
		*view = (struct wf_cache_view){m->model, m->model->n_tensors, m->tensors};
	return 1;
}

int wf_cache_acquire(struct wf_cache *c, uint32_t id, struct wf_cache_view *ret_view,
                     struct wf_diag *diag)
{
	struct cmd k = {.type = CMD_ACQUIRE, .id = id};
	int ret;
	bool self;

	if (!c)
		return WF_EINVAL;
	pthread_mutex_lock(&c->lock);
	ret = wf__cache_try_acquire_locked(c, id, ret_view);
	self = c->mode == WF_CACHE_SELF_MANAGED;
	pthread_mutex_unlock(&c->lock);
	if (ret < 0)
		return wf_diag_set(diag, ret, "acquire: no model with id %u", id);
	if (ret == 1)
		return 0;
	if (!self)
		return wf_diag_set(diag, WF_ENOT_RESIDENT,
		                   "model %u is not resident (external mode)", id);
	ret = wf__cache_post(c, &k, diag);
	if (ret < 0)
		return ret;
	/* The manager counted our hold when it published the model: only the view is left. */
	if (ret_view) {
		pthread_mutex_lock(&c->lock);
		struct model *m = wf__cache_find_locked(c, id);
		*ret_view = (struct wf_cache_view){m->model, m->model->n_tensors, m->tensors};
		pthread_mutex_unlock(&c->lock);
	}
	return 0;
}

int wf_cache_release(struct wf_cache *c, uint32_t id)
{
	struct model *m;
	int ret = 0;

	if (!c)
		return WF_EINVAL;
	pthread_mutex_lock(&c->lock);
	m = wf__cache_find_locked(c, id);
	if (!m)
		ret = WF_ENOT_FOUND;
	else if (!m->acquired)
		ret = WF_ESTATE;
	else
		m->acquired--;
	pthread_mutex_unlock(&c->lock);
	return ret;
}

uint64_t wf__cache_resv_bytes_locked(const struct wf_cache *c)
{
	uint64_t b = 0;

	for (size_t i = 0; i < c->n_resv; i++)
		b += c->resvs[i]->bytes;
	return b;
}

static struct resv *resv_find_locked(struct wf_cache *c, uint32_t id)
{
	for (size_t i = 0; i < c->n_resv; i++)
		if (c->resvs[i]->id == id)
			return c->resvs[i];
	return NULL;
}

struct resv *wf__cache_resv_take_locked(struct wf_cache *c, uint32_t id)
{
	for (size_t i = 0; i < c->n_resv; i++) {
		struct resv *r = c->resvs[i];
		if (r->id == id) {
			c->resvs[i] = c->resvs[--c->n_resv];
			return r;
		}
	}
	return NULL;
}

int wf_cache_resv_acquire(struct wf_cache *c, uint32_t id)
{
	struct resv *r;

	if (!c)
		return WF_EINVAL;
	pthread_mutex_lock(&c->lock);
	r = resv_find_locked(c, id);
	if (r) {
		r->acquired++;
		r->lru = ++c->tick;
	}
	pthread_mutex_unlock(&c->lock);
	return r ? 0 : WF_ENOT_FOUND;
}

int wf_cache_resv_release(struct wf_cache *c, uint32_t id)
{
	struct resv *r;
	int ret = 0;

	if (!c)
		return WF_EINVAL;
	pthread_mutex_lock(&c->lock);
	r = resv_find_locked(c, id);
	if (!r) {
		ret = WF_ENOT_FOUND;
	} else if (!r->acquired) {
		ret = WF_ESTATE;
	} else {
		r->acquired--;
		/* The end of a use is its last step: the LRU orders by it. */
		r->lru = ++c->tick;
	}
	pthread_mutex_unlock(&c->lock);
	return ret;
}

void wf_cache_resv_drop(struct wf_cache *c, uint32_t id)
{
	struct resv *r;

	if (!c || !id)
		return;
	pthread_mutex_lock(&c->lock);
	r = wf__cache_resv_take_locked(c, id);
	pthread_mutex_unlock(&c->lock);
	free(r);
}

int wf_cache_status(struct wf_cache *c, struct wf_cache_status **ret_status)
{
	struct wf_cache_status *s;
	size_t n;

	if (!c || !ret_status)
		return WF_EINVAL;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	pthread_mutex_lock(&c->lock);
	n = c->n_models;
	s->models = calloc(n ? n : 1, sizeof(*s->models));
	if (!s->models) {
		pthread_mutex_unlock(&c->lock);
		free(s);
		return -ENOMEM;
	}
	s->mode = c->mode;
	s->budget = c->budget;
	s->loads = c->loads;
	s->evictions = c->evictions;
	s->lru_evictions = c->lru_evictions;
	s->n_models = n;
	for (size_t i = 0; i < n; i++) {
		const struct model *m = c->models[i];
		struct wf_cache_model_status *ms = &s->models[i];

		ms->id = m->id;
		memcpy(ms->name, m->name, sizeof(ms->name));
		ms->digest = m->digest;
		ms->state = m->state;
		ms->floor = m->region != NULL;
		ms->floor_error = m->region ? 0 : m->floor_error;
		ms->loading = m->loading;
		ms->load_done = m->load_done;
		ms->load_total = m->load_total;
		ms->over_budget = m->over_budget;
		ms->bytes = m->model->total_bytes;
		ms->device_bytes = m->device_bytes;
		ms->n_allocs = m->n_segs;
		ms->acquired = m->acquired;
		ms->lru_stamp = m->lru;
		ms->last_load_seconds = m->last_seconds;
		ms->last_load_gbps = m->last_gbps;
		ms->last_load_mode = m->last_mode;
		ms->last_load_from_floor = m->from_floor;
		ms->loads = m->loads;
		ms->evictions = m->evictions;
		ms->last_error = m->last_error;
		memcpy(ms->last_error_msg, m->last_error_msg, sizeof(ms->last_error_msg));
		s->resident_bytes += wf__cache_set_bytes(m, false);
		s->pinned_bytes += wf__cache_set_bytes(m, true);
	}
	s->reserved_bytes = wf__cache_resv_bytes_locked(c);
	s->n_reservations = c->n_resv;
	s->stage = c->stage_info;
	pthread_mutex_unlock(&c->lock);
	s->over_budget = s->resident_bytes + s->reserved_bytes > s->budget.on_demand;
	(void)wf_device_mem_info(c->dev, &s->mem_free, &s->mem_total, NULL);
	*ret_status = s;
	return 0;
}

void wf_cache_status_free(struct wf_cache_status *s)
{
	if (!s)
		return;
	free(s->models);
	free(s);
}

uint64_t wf__cache_set_bytes(const struct model *m, bool pinned)
{
	uint64_t b = 0;

	for (uint32_t s = 0; s < m->n_sets; s++)
		if (m->sets[s].resident && m->sets[s].pinned == pinned)
			b += m->sets[s].device_bytes;
	return b;
}

bool wf__cache_any_set(const struct model *m, bool pinned)
{
	for (uint32_t s = 0; s < m->n_sets; s++)
		if (m->sets[s].resident && m->sets[s].pinned == pinned)
			return true;
	return false;
}

void wf__cache_model_refresh_locked(struct model *m)
{
	bool all = m->n_sets > 0, all_pinned = true;

	m->n_segs = 0;
	m->device_bytes = 0;
	for (uint32_t s = 0; s < m->n_sets; s++) {
		const struct wset *w = &m->sets[s];
		all &= w->resident;
		all_pinned &= w->pinned;
		if (w->resident) {
			m->n_segs += w->n_segs;
			m->device_bytes += w->device_bytes;
		}
	}
	m->state = !all         ? host_level(m)
	           : all_pinned ? WF_RESIDENCY_PINNED_DEVICE
	                        : WF_RESIDENCY_DEVICE;
	if (!m->device_bytes)
		m->over_budget = false;
}

int wf__cache_model_sets_init(struct model *m)
{
	struct wf_wset_def *defs = NULL;
	uint32_t n = 0, nt = m->model->n_tensors;
	int ret = wf_wset_classify(m->model, &defs, &n);

	if (ret < 0)
		return ret;
	m->sets = calloc(n, sizeof(*m->sets));
	m->tensors = calloc(nt ? nt : 1, sizeof(*m->tensors));
	m->src_off = calloc(nt ? nt : 1, sizeof(*m->src_off));
	m->rcopy = calloc(nt ? nt : 1, sizeof(*m->rcopy));
	m->rcopy_bytes = calloc(nt ? nt : 1, sizeof(*m->rcopy_bytes));
	if (!m->sets || !m->tensors || !m->src_off || !m->rcopy || !m->rcopy_bytes) {
		wf_wset_defs_free(defs, n);
		return -ENOMEM;
	}
	/* The definitions move into the sets; only the array that held them goes. */
	for (uint32_t s = 0; s < n; s++)
		m->sets[s].def = defs[s];
	free(defs);
	m->n_sets = n;
	return 0;
}

void wf__cache_model_free(struct model *m)
{
	if (!m)
		return;
	for (uint32_t s = 0; s < m->n_sets; s++)
		free(m->sets[s].def.tensors);
	free(m->sets);
	free(m->tensors);
	free(m->src_off);
	free(m->rcopy);
	free(m->rcopy_bytes);
	free(m->superseded);
	free(m);
}

/* ---- weight sets ------------------------------------------------------------------------------
 */

/* The model and its set, lock held. */
static int wset_locked(struct wf_cache *c, uint32_t id, uint32_t set, struct model **ret_m)
{
	struct model *m = wf__cache_find_locked(c, id);

	if (!m)
		return WF_ENOT_FOUND;
	if (set >= m->n_sets)
		return WF_ENOT_FOUND;
	*ret_m = m;
	return 0;
}

int wf_cache_wset_count(struct wf_cache *c, uint32_t id, uint32_t *ret_n)
{
	struct model *m;

	if (!c || !ret_n)
		return WF_EINVAL;
	pthread_mutex_lock(&c->lock);
	m = wf__cache_find_locked(c, id);
	if (m)
		*ret_n = m->n_sets;
	pthread_mutex_unlock(&c->lock);
	return m ? 0 : WF_ENOT_FOUND;
}

int wf_cache_wset_find(struct wf_cache *c, uint32_t id, const char *name, uint32_t *ret_set)
{
	struct model *m;
	int ret = WF_ENOT_FOUND;

	if (!c || !name || !ret_set)
		return WF_EINVAL;
	pthread_mutex_lock(&c->lock);
	m = wf__cache_find_locked(c, id);
	for (uint32_t s = 0; m && s < m->n_sets; s++) {
		if (strcmp(m->sets[s].def.name, name) == 0) {
			*ret_set = s;
			ret = 0;
			break;
		}
	}
	pthread_mutex_unlock(&c->lock);
	return ret;
}

int wf_cache_wset_status(struct wf_cache *c, uint32_t id, uint32_t set,
                         struct wf_cache_wset_status *ret_status)
{
	struct model *m = NULL;
	int ret;

	if (!c || !ret_status)
		return WF_EINVAL;
	pthread_mutex_lock(&c->lock);
	ret = wset_locked(c, id, set, &m);
	if (ret == 0) {
		const struct wset *w = &m->sets[set];
		struct wf_cache_wset_status st = {
		    .state = !w->resident ? host_level(m)
		             : w->pinned  ? WF_RESIDENCY_PINNED_DEVICE
		                          : WF_RESIDENCY_DEVICE,
		    .n_tensors = w->def.n_tensors,
		    .bytes = w->def.bytes,
		    .device_bytes = w->resident ? w->device_bytes : 0,
		    .n_allocs = w->resident ? w->n_segs : 0,
		};
		memcpy(st.name, w->def.name, sizeof(st.name));
		*ret_status = st;
	}
	pthread_mutex_unlock(&c->lock);
	return ret;
}

/* ---- classification ---------------------------------------------------------------------------
 */

/* The layer of a tensor name: "blk.N." (GGUF) or "layers.N." (safetensors); -1 when none. */
static long layer_of(const char *name)
{
	static const char *const keys[] = {"blk.", "layers."};

	for (size_t k = 0; k < sizeof(keys) / sizeof(keys[0]); k++) {
		const char *p = strstr(name, keys[k]);
		if (!p)
			continue;
		p += strlen(keys[k]);
		if (*p < '0' || *p > '9')
			continue;
		char *end;
		long v = strtol(p, &end, 10);
		if (*end == '.' && v >= 0 && v < 1000000)
			return v;
	}
	return -1;
}

static int set_key(const struct wf_tensor *t)
{
	if (t->tclass != WF_TENSOR_EXPERT)
		return -2;             /* dense */
	return (int)layer_of(t->name); /* -1: experts of no known layer */
}

void wf_wset_defs_free(struct wf_wset_def *sets, uint32_t n)
{
	for (uint32_t i = 0; sets && i < n; i++)
		free(sets[i].tensors);
	free(sets);
}

int wf_wset_classify(const struct wf_model *mo, struct wf_wset_def **ret_sets, uint32_t *ret_n)
{
	uint32_t nt, n = 0;
	int *keys = NULL, *seen = NULL;
	struct wf_wset_def *sets = NULL;
	int ret = 0;

	if (!mo || !ret_sets || !ret_n)
		return WF_EINVAL;
	nt = mo->n_tensors;
	keys = calloc(nt ? nt : 1, sizeof(*keys));
	seen = calloc(nt + 1, sizeof(*seen)); /* distinct keys, in set order */
	sets = calloc(nt + 1, sizeof(*sets));
	if (!keys || !seen || !sets) {
		ret = -ENOMEM;
		goto err;
	}
	/* Set order: dense, then experts of no layer, then layers ascending. Keys are few (one per
	 * layer), so insertion into a sorted list is enough. */
	for (uint32_t i = 0; i < nt; i++) {
		int k = set_key(&mo->tensors[i]);
		uint32_t j = 0;

		keys[i] = k;
		while (j < n && seen[j] < k)
			j++;
		if (j < n && seen[j] == k)
			continue;
		memmove(&seen[j + 1], &seen[j], (n - j) * sizeof(*seen));
		seen[j] = k;
		n++;
	}
	if (!nt) {
		seen[0] = -2;
		n = 1;
	}
	for (uint32_t s = 0; s < n; s++) {
		struct wf_wset_def *d = &sets[s];
		uint32_t count = 0;

		if (seen[s] == -2)
			snprintf(d->name, sizeof(d->name), "dense");
		else if (seen[s] == -1)
			snprintf(d->name, sizeof(d->name), "experts");
		else
			snprintf(d->name, sizeof(d->name), "blk.%d.ffn_*_exps", seen[s]);
		for (uint32_t i = 0; i < nt; i++)
			count += keys[i] == seen[s];
		d->tensors = calloc(count ? count : 1, sizeof(*d->tensors));
		if (!d->tensors) {
			ret = -ENOMEM;
			goto err;
		}
		for (uint32_t i = 0; i < nt; i++) {
			if (keys[i] != seen[s])
				continue;
			d->tensors[d->n_tensors++] = i;
			d->bytes += mo->tensors[i].nbytes;
		}
	}
	free(keys);
	free(seen);
	*ret_sets = sets;
	*ret_n = n;
	return 0;
err:
	free(keys);
	free(seen);
	wf_wset_defs_free(sets, n);
	return ret;
}
