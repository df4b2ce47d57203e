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
		if (c->models[i]->state == WF_RESIDENCY_PINNED_DEVICE)
			in.pinned += c->models[i]->device_bytes;
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
		if (m->state == WF_RESIDENCY_DEVICE)
			s->resident_bytes += m->device_bytes;
		else if (m->state == WF_RESIDENCY_PINNED_DEVICE)
			s->pinned_bytes += m->device_bytes;
	}
	s->stage = c->stage_info;
	pthread_mutex_unlock(&c->lock);
	s->over_budget = s->resident_bytes > s->budget.on_demand;
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
