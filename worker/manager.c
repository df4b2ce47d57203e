/* The cache's manager thread (worker/cache_internal.h): commands, budget, eviction, lifecycle. */
#include "worker/cache_internal.h"

#include "base/error.h"
#include "base/lru.h"

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Takes sets of m off the device: one set, or every set (ALL_SETS); unpinned_only leaves pinned
 * sets (the LRU's victims). -EBUSY when the model is acquired (checked under the lock,
 * atomically with the state change). 0 when there was nothing to evict. */
/* The refreshed copies of set w's tensors, and the superseded ones among them, taken out of m
 * into *list (lock held), to be freed once the lock is dropped. */
static size_t take_refreshed_locked(struct model *m, const struct wset *w, void **list, size_t n)
{
	for (uint32_t k = 0; k < w->def.n_tensors; k++) {
		const uint32_t t = w->def.tensors[k];
		if (m->rcopy[t])
			list[n++] = m->rcopy[t];
		m->rcopy[t] = NULL;
		m->rcopy_bytes[t] = 0;
		for (size_t i = 0; i < m->n_superseded;) {
			if (m->superseded[i].tensor == t) {
				list[n++] = m->superseded[i].ptr;
				m->superseded[i] = m->superseded[--m->n_superseded];
			} else {
				i++;
			}
		}
	}
	return n;
}

static void free_list(struct wf_cache *c, void **list, size_t n)
{
	for (size_t i = 0; i < n; i++)
		(void)wf_device_mem_free(c->dev, list[i], NULL);
}

static int evict_sets(struct wf_cache *c, struct model *m, uint32_t set, bool unpinned_only,
                      bool by_lru, const char *why)
{
	struct devcopy *d = NULL;
	uint32_t nd = 0;
	bool had_pinned = false;
	/* Every refreshed copy once, and every superseded one: at most two per tensor plus the
	 * superseded list. */
	void **freed = calloc(2u * m->model->n_tensors + m->n_superseded + 1, sizeof(*freed));
	size_t n_freed = 0;
	if (!freed)
		return -ENOMEM;

	d = calloc(m->n_sets ? m->n_sets : 1, sizeof(*d));
	pthread_mutex_lock(&c->lock);
	for (uint32_t s = 0; s < m->n_sets; s++) {
		const struct wset *w = &m->sets[s];
		if ((set == ALL_SETS || s == set) && w->resident && !(unpinned_only && w->pinned))
			nd++;
	}
	if (!nd) {
		pthread_mutex_unlock(&c->lock);
		free(d);
		free(freed);
		return 0;
	}
	if (m->acquired) {
		pthread_mutex_unlock(&c->lock);
		free(d);
		free(freed);
		return -EBUSY;
	}
	if (!d) {
		/* Nothing changed yet: the caller sees the failure like any other. */
		pthread_mutex_unlock(&c->lock);
		free(freed);
		return -ENOMEM;
	}
	nd = 0;
	for (uint32_t s = 0; s < m->n_sets; s++) {
		struct wset *w = &m->sets[s];
		if (!((set == ALL_SETS || s == set) && w->resident &&
		      !(unpinned_only && w->pinned)))
			continue;
		had_pinned |= w->pinned;
		d[nd].n_segs = w->n_segs;
		d[nd].seg_ptr = w->seg_ptr;
		d[nd].seg_size = w->seg_size;
		nd++;
		for (uint32_t k = 0; k < w->def.n_tensors; k++)
			m->tensors[w->def.tensors[k]] = NULL;
		n_freed = take_refreshed_locked(m, w, freed, n_freed);
		w->resident = false;
		w->pinned = false;
		w->n_segs = 0;
		w->seg_ptr = NULL;
		w->seg_size = NULL;
		w->device_bytes = 0;
	}
	wf__cache_model_refresh_locked(m);
	if (set == ALL_SETS)
		m->over_budget = false;
	m->evictions++;
	c->evictions++;
	if (by_lru)
		c->lru_evictions++;
	if (had_pinned)
		wf__cache_budget_update_locked(c);
	pthread_mutex_unlock(&c->lock);
	for (uint32_t k = 0; k < nd; k++)
		wf__cache_devcopy_free(c, &d[k]);
	free(d);
	free_list(c, freed, n_freed);
	free(freed);
	wf__cache_emit(c, WF_CACHE_EVENT_EVICTED, m, 0, why);
	wf__cache_emit(c, WF_CACHE_EVENT_RESIDENCY, m, 0, NULL);
	return 0;
}

/* Takes every set of the model off the device, pinned ones included. */
static int evict_model(struct wf_cache *c, struct model *m, bool by_lru, const char *why)
{
	return evict_sets(c, m, ALL_SETS, false, by_lru, why);
}

/* An LRU item: a model's unpinned sets, or a reservation (by id: its owner may drop it between
 * the plan and the eviction). */
struct item {
	struct model *m;
	uint32_t resv;
};

/* Takes reservation id off the budget and tells its owner, unless it is acquired (-EBUSY,
 * checked under the lock, atomically with taking it out). 0 when it was gone already (dropped:
 * its owner freed the memory). */
static int evict_resv(struct wf_cache *c, uint32_t id, bool by_lru, const char *why)
{
	struct resv *r = NULL;

	pthread_mutex_lock(&c->lock);
	for (size_t i = 0; i < c->n_resv; i++)
		if (c->resvs[i]->id == id)
			r = c->resvs[i];
	if (r && r->acquired) {
		pthread_mutex_unlock(&c->lock);
		return -EBUSY;
	}
	if (r) {
		(void)wf__cache_resv_take_locked(c, id);
		c->evictions++;
		if (by_lru)
			c->lru_evictions++;
	}
	pthread_mutex_unlock(&c->lock);
	if (!r)
		return 0;
	/* Out of the table first: an acquire from now on fails, so no new use can start on the
	 * memory the owner is about to free. */
	r->evict(r->ctx, r->id, why);
	free(r);
	return 0;
}

static int evict_item(struct wf_cache *c, const struct item *it, bool by_lru, const char *why)
{
	return it->m ? evict_sets(c, it->m, ALL_SETS, true, by_lru, why)
	             : evict_resv(c, it->resv, by_lru, why);
}

/* Room for the plans: every model and reservation, plus one. Manager thread (the capacities grow
 * only there). */
static size_t plan_cap(const struct wf_cache *c)
{
	return c->cap_models + c->cap_resv + 1;
}

/* The models other than skip with unpinned resident sets, and the reservations, as LRU items
 * (acquired ones busy): a model's unpinned sets go together, as the model did before it had
 * sets. Lock held. */
static size_t entries_locked(struct wf_cache *c, const struct model *skip, struct wf_lru_item *e,
                             struct item *who)
{
	size_t n = 0;

	for (size_t i = 0; i < c->n_models; i++) {
		struct model *m = c->models[i];
		uint64_t b = wf__cache_set_bytes(m, false);
		if (m == skip || !wf__cache_any_set(m, false))
			continue;
		e[n] =
		    (struct wf_lru_item){.bytes = b, .last_used = m->lru, .busy = m->acquired != 0};
		who[n++] = (struct item){.m = m};
	}
	for (size_t i = 0; i < c->n_resv; i++) {
		const struct resv *r = c->resvs[i];
		e[n] = (struct wf_lru_item){
		    .bytes = r->bytes, .last_used = r->lru, .busy = r->acquired != 0};
		who[n++] = (struct item){.resv = r->id};
	}
	return n;
}

/* Makes room for need bytes of unpinned weights under the on-demand budget (with extra_pinned
 * bytes about to be pinned). allow_evict: self-managed (LRU victims go); otherwise any needed
 * victim is WF_ENO_SPACE. *ret_over: the model is larger than the whole budget. */
static int make_room(struct wf_cache *c, const struct model *target, const char *what,
                     uint64_t need, uint64_t extra_pinned, bool allow_evict, bool *ret_over,
                     struct wf_diag *diag)
{
	struct wf_lru_item *e = NULL;
	struct item *who = NULL;
	size_t *victims = NULL;
	int ret = 0;

	if (!what)
		what = target ? target->name : "?";
	e = calloc(plan_cap(c), sizeof(*e));
	who = calloc(plan_cap(c), sizeof(*who));
	victims = calloc(plan_cap(c), sizeof(*victims));
	if (!e || !who || !victims) {
		ret = -ENOMEM;
		goto out;
	}
	for (int attempt = 0;; attempt++) {
		struct wf_devbudget b;
		struct wf_devbudget_in in;
		enum wf_lru_fit fit;
		size_t n, nv = 0, busy = 0;
		uint64_t used = 0;

		pthread_mutex_lock(&c->lock);
		in = c->budget.in;
		in.pinned += extra_pinned;
		(void)wf_devbudget_compute(&in, &b);
		n = entries_locked(c, target, e, who);
		for (size_t i = 0; i < n; i++) {
			used += e[i].bytes;
			busy += e[i].busy;
		}
		/* A model completing itself (some sets already resident) must fit as a whole, as
		 * it would loading from nothing: its resident unpinned sets join the need. */
		fit = wf_lru_plan(e, n, b.on_demand, used,
		                  need + (target ? wf__cache_set_bytes(target, false) : 0), victims,
		                  &nv);
		pthread_mutex_unlock(&c->lock);

		*ret_over = fit == WF_LRU_OVERSIZED;
		if (fit == WF_LRU_NO_ROOM || (nv && !allow_evict)) {
			ret = wf_diag_set(
			    diag, WF_ENO_SPACE,
			    "%s: %" PRIu64 " bytes do not fit: on-demand budget %" PRIu64
			    ", %" PRIu64
			    " resident in %zu unpinned models and engines (%zu in use)%s",
			    what, need, b.on_demand, used, n, busy,
			    allow_evict ? "" : "; external mode does not evict");
			goto out;
		}
		bool raced = false;
		for (size_t k = 0; k < nv; k++) {
			ret = evict_item(c, &who[victims[k]], true, "lru");
			if (ret == -EBUSY) {
				/* Acquired since the plan: plan again. */
				raced = true;
				ret = 0;
				break;
			}
		}
		if (!raced)
			break;
		if (attempt >= PLAN_RETRIES) {
			ret = wf_diag_set(diag, WF_ENO_SPACE, "%s: LRU victims keep being acquired",
			                  what);
			goto out;
		}
	}
out:
	free(e);
	free(who);
	free(victims);
	return ret;
}

/* Evicts the least recently used evictable unpinned model other than skip. 0, or WF_ENO_SPACE
 * when there is none. For allocations the device refuses although the budget allows them. */
static int evict_one_lru(struct wf_cache *c, const struct model *skip)
{
	struct wf_lru_item *e = calloc(plan_cap(c), sizeof(*e));
	struct item *who = calloc(plan_cap(c), sizeof(*who));
	int ret = WF_ENO_SPACE;

	if (!e || !who) {
		ret = -ENOMEM;
		goto out;
	}
	for (int attempt = 0; attempt < PLAN_RETRIES; attempt++) {
		size_t n, k;

		pthread_mutex_lock(&c->lock);
		n = entries_locked(c, skip, e, who);
		k = wf_lru_oldest(e, n);
		pthread_mutex_unlock(&c->lock);
		if (k == n)
			break;
		if (evict_item(c, &who[k], true, "lru: device memory") == 0) {
			ret = 0;
			break;
		}
	}
out:
	free(e);
	free(who);
	return ret;
}

/* Self-managed: brings the unpinned resident bytes back under the budget (after a pin or a budget
 * change). What cannot be evicted stays, flagged by the status's over_budget. */
static void enforce_budget(struct wf_cache *c)
{
	bool over;
	struct wf_diag ignore = {0};

	if (wf__cache_mode_get(c) != WF_CACHE_SELF_MANAGED)
		return;
	(void)make_room(c, NULL, NULL, 0, 0, true, &over, &ignore);
}

/* Marks the model the manager is loading, so wf_cache_cancel() can find it. A new model resets
 * the cancel flag; the same one keeps a cancel that came before the load started. */
static void set_active(struct wf_cache *c, uint32_t id)
{
	pthread_mutex_lock(&c->lock);
	if (c->active_id != id) {
		c->active_id = id;
		__atomic_store_n(&c->cancel_flag, 0, __ATOMIC_RELAXED);
	}
	pthread_mutex_unlock(&c->lock);
}

static bool cancel_requested(struct wf_cache *c)
{
	return __atomic_load_n(&c->cancel_flag, __ATOMIC_RELAXED) != 0;
}

/* Fails a load that could not fit even after every evictable model went, before anything is
 * evicted: emptying the device for a model that then fails anyway would leave nothing but a
 * colder cache. The limits are the arena less the pinned bytes (policy) and the device's free
 * memory plus what the evictable models hold (fact). Over-budget loads that do fit still go on. */
static int check_fits(struct wf_cache *c, const struct model *target, uint64_t bytes,
                      struct wf_diag *diag)
{
	size_t mem_free = 0;
	uint64_t evictable = 0, pinned = 0, arena;

	if (wf_device_mem_info(c->dev, &mem_free, NULL, NULL) < 0)
		return 0; /* unknown: the allocation decides */
	pthread_mutex_lock(&c->lock);
	arena = c->bin.arena;
	for (size_t i = 0; i < c->n_models; i++) {
		const struct model *m = c->models[i];
		if (m == target)
			continue;
		pinned += wf__cache_set_bytes(m, true);
		if (!m->acquired)
			evictable += wf__cache_set_bytes(m, false);
	}
	for (size_t i = 0; i < c->n_resv; i++)
		if (!c->resvs[i]->acquired)
			evictable += c->resvs[i]->bytes;
	pthread_mutex_unlock(&c->lock);
	uint64_t room = arena > pinned ? arena - pinned : 0;
	if (bytes > room)
		return wf_diag_set(diag, WF_ENO_SPACE,
		                   "model '%s': %" PRIu64
		                   " bytes can never fit: the arena is %" PRIu64 " bytes, %" PRIu64
		                   " of them pinned (nothing was evicted)",
		                   target->name, bytes, arena, pinned);
	if (bytes > (uint64_t)mem_free + evictable)
		return wf_diag_set(
		    diag, WF_ENO_SPACE,
		    "model '%s': %" PRIu64 " bytes do not fit: the device has %zu bytes "
		    "free and evictable models and engines hold %" PRIu64 " (nothing was evicted)",
		    target->name, bytes, mem_free, evictable);
	return 0;
}

static bool in_scope(uint32_t sel, uint32_t s)
{
	return sel == ALL_SETS || sel == s;
}

/* Pins the resident sets in scope. Lock held. True when one was not pinned before. */
static bool pin_resident_locked(struct wf_cache *c, struct model *m, uint32_t sel)
{
	bool changed = false;

	for (uint32_t s = 0; s < m->n_sets; s++) {
		struct wset *w = &m->sets[s];
		if (in_scope(sel, s) && w->resident && !w->pinned) {
			w->pinned = true;
			changed = true;
		}
	}
	if (changed) {
		wf__cache_model_refresh_locked(m);
		if (m->state == WF_RESIDENCY_PINNED_DEVICE)
			m->over_budget = false;
		wf__cache_budget_update_locked(c);
	}
	return changed;
}

/* Loads the sets of m in scope (sel: one set, or ALL_SETS for the model); pin: pins them (a
 * PINNED_DEVICE model when all); acquire (whole model only): counts a holder in the same step that
 * publishes it. allow_evict: LRU victims may go (self-managed). Resident sets are only converted.
 * All or nothing: a failure leaves every set where it was. */
static int stage_ready(struct wf_cache *c, struct wf_diag *diag);

static int load_sets(struct wf_cache *c, struct model *m, uint32_t sel, bool pin, bool acquire,
                     bool allow_evict, struct wf_diag *diag)
{
	struct devcopy *d = NULL;
	struct wf_stage_stats stats = {0};
	struct progress_ctx pc = {.c = c, .m = m};
	uint32_t nd = 0;
	uint64_t bytes = 0, src_bytes = 0;
	bool over = false, pinned_now = false, from_floor;
	int ret = 0;

	for (uint32_t s = 0; s < m->n_sets; s++)
		nd += in_scope(sel, s) && !m->sets[s].resident;
	if (!nd) {
		pthread_mutex_lock(&c->lock);
		if (pin)
			pinned_now = pin_resident_locked(c, m, sel);
		if (acquire)
			m->acquired++;
		m->lru = ++c->tick;
		pthread_mutex_unlock(&c->lock);
		if (pinned_now) {
			/* Its bytes now shrink the on-demand budget: the rest may have to go. */
			if (allow_evict)
				enforce_budget(c);
			wf__cache_emit(c, WF_CACHE_EVENT_RESIDENCY, m, 0, NULL);
		}
		return 0;
	}
	set_active(c, m->id);
	if (c->have_shm && !m->region)
		(void)wf__cache_floor_attach(c, m, NULL);
	from_floor = m->region != NULL;
	d = calloc(nd, sizeof(*d));
	if (!d)
		return -ENOMEM;
	nd = 0;
	for (uint32_t s = 0; s < m->n_sets; s++) {
		if (!in_scope(sel, s) || m->sets[s].resident)
			continue;
		d[nd].set = &m->sets[s];
		d[nd].from_floor = from_floor;
		ret = wf__cache_layout(c, m, &d[nd], diag);
		nd++;
		if (ret < 0)
			goto fail;
		bytes += d[nd - 1].bytes;
		src_bytes += m->sets[s].def.bytes;
	}
	ret = check_fits(c, m, bytes, diag);
	if (ret < 0)
		goto fail;
	if (pin)
		ret = make_room(c, m, NULL, 0, bytes, allow_evict, &over, diag);
	else
		ret = make_room(c, m, NULL, bytes, 0, allow_evict, &over, diag);
	/* A pinned model may exceed the budget (an over-commit, flagged); it only needs the
	 * device to have the memory. */
	if (pin && ret == WF_ENO_SPACE) {
		wf_diag_clear(diag);
		ret = 0;
	}
	if (ret < 0)
		goto fail;
	over = !pin && over;
	for (uint32_t j = 0; j < nd; j++) {
		for (uint32_t s = 0; s < d[j].n_segs; s++) {
			for (;;) {
				struct wf_diag ad = {0};
				ret = wf_device_mem_alloc(c->dev, (size_t)d[j].seg_size[s],
				                          &d[j].seg_ptr[s], &ad);
				if (ret != -ENOMEM || !allow_evict || evict_one_lru(c, m) < 0) {
					if (ret < 0)
						wf_diag_set(
						    diag, ret,
						    "model '%s': device allocation of %" PRIu64
						    " bytes: %s",
						    m->name, d[j].seg_size[s],
						    wf_diag_str(&ad, ret));
					break;
				}
			}
			if (ret < 0)
				goto fail;
		}
		wf__cache_fill_pointers(&d[j]);
	}

	if ((ret = stage_ready(c, diag)) < 0)
		goto fail;
	pthread_mutex_lock(&c->lock);
	m->loading = true;
	m->load_done = 0;
	m->load_total = src_bytes;
	pthread_mutex_unlock(&c->lock);
	wf__cache_emit(c, WF_CACHE_EVENT_PROGRESS, m, 0, NULL);
	for (uint32_t j = 0; j < nd && ret == 0; j++) {
		struct wf_stage_stats st = {0};

		if (cancel_requested(c))
			ret = wf_diag_set(diag, WF_ECANCELED, "model '%s': load canceled", m->name);
		else
			ret = wf__cache_transfer(c, m, &d[j], &pc, &st, diag);
		stats.seconds += st.seconds;
		stats.bytes += st.bytes;
		stats.mode = st.mode;
	}
	stats.gbps = stats.seconds > 0 ? (double)stats.bytes / stats.seconds / 1e9 : 0;
	pthread_mutex_lock(&c->lock);
	m->loading = false;
	wf_stage_info(c->stage, &c->stage_info);
	pthread_mutex_unlock(&c->lock);
	if (ret < 0)
		goto fail;

	pthread_mutex_lock(&c->lock);
	for (uint32_t j = 0; j < nd; j++) {
		struct wset *w = d[j].set;
		for (uint32_t k = 0; k < w->def.n_tensors; k++) {
			m->tensors[w->def.tensors[k]] = d[j].tensors[k];
			m->src_off[w->def.tensors[k]] = d[j].src_off[k];
		}
		w->resident = true;
		w->pinned = pin;
		w->from_floor = d[j].from_floor;
		w->n_segs = d[j].n_segs;
		w->seg_ptr = d[j].seg_ptr;
		w->seg_size = d[j].seg_size;
		w->device_bytes = d[j].bytes;
	}
	if (pin)
		(void)pin_resident_locked(c, m, sel);
	wf__cache_model_refresh_locked(m);
	m->from_floor = from_floor;
	m->over_budget = over;
	m->lru = ++c->tick;
	if (acquire)
		m->acquired++;
	m->loads++;
	c->loads++;
	m->last_seconds = stats.seconds;
	m->last_gbps = stats.gbps;
	m->last_mode = stats.mode;
	m->last_error = 0;
	m->last_error_msg[0] = '\0';
	if (pin)
		wf__cache_budget_update_locked(c);
	pthread_mutex_unlock(&c->lock);
	for (uint32_t j = 0; j < nd; j++) {
		free(d[j].tensors);
		free(d[j].src_off);
		free(d[j].seg_of);
		free(d[j].dev_off);
	}
	free(d);
	/* As wf__cache_emit, with the load's duration (the worker's metrics). */
	struct wf_cache_event ev = {
	    .type = WF_CACHE_EVENT_RESIDENCY,
	    .id = m->id,
	    .name = m->name,
	    .state = m->state,
	    .over_budget = m->over_budget,
	    .done = m->load_done,
	    .total = m->load_total,
	    .msg = over ? "larger than the on-demand budget" : NULL,
	    .seconds = stats.seconds > 0 ? stats.seconds : 1e-9,
	};
	if (c->opts.event)
		c->opts.event(c->opts.event_ctx, &ev);
	return 0;
fail:
	/* Frees waits for the copies queued before it: nothing is left behind. */
	for (uint32_t j = 0; j < nd; j++)
		wf__cache_devcopy_free(c, &d[j]);
	free(d);
	wf__cache_emit(c, WF_CACHE_EVENT_LOAD_FAILED, m, ret, wf_diag_str(diag, ret));
	return ret;
}

static int load_model(struct wf_cache *c, struct model *m, bool pin, bool acquire, bool allow_evict,
                      struct wf_diag *diag)
{
	return load_sets(c, m, ALL_SETS, pin, acquire, allow_evict, diag);
}

static int unpin_model(struct wf_cache *c, struct model *m, struct wf_diag *diag)
{
	pthread_mutex_lock(&c->lock);
	if (m->state != WF_RESIDENCY_PINNED_DEVICE) {
		pthread_mutex_unlock(&c->lock);
		return wf_diag_set(diag, WF_ESTATE, "model '%s' is not pinned (%s)", m->name,
		                   wf_residency_name(m->state));
	}
	for (uint32_t s = 0; s < m->n_sets; s++)
		m->sets[s].pinned = false;
	wf__cache_model_refresh_locked(m);
	m->lru = ++c->tick;
	wf__cache_budget_update_locked(c);
	pthread_mutex_unlock(&c->lock);
	/* It now counts against the budget like any other; in self-managed mode the budget is
	 * enforced (the LRU may pick this very model if it is the oldest). */
	enforce_budget(c);
	wf__cache_emit(c, WF_CACHE_EVENT_RESIDENCY, m, 0, NULL);
	return 0;
}

/* No count in the message: `acquired` moves under the lock, and callers hold it or not. */
static int busy_error(const struct model *m, struct wf_diag *diag)
{
	return wf_diag_set(diag, -EBUSY, "model '%s' is acquired by a request", m->name);
}

static int cmd_add(struct wf_cache *c, struct cmd *k)
{
	struct model *m;
	char hex[WF_DIGEST_HEX_LEN];
	int ret = 0;

	if (!k->model)
		return wf_diag_set(&k->diag, WF_EINVAL, "model add: NULL model");
	m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->model = k->model;
	ret = wf__cache_model_sets_init(m);
	if (ret < 0) {
		wf__cache_model_free(m);
		return ret;
	}
	wf_model_digest(k->model, &m->digest);
	wf_digest_hex(&m->digest, hex);
	if (k->name && (!k->name[0] || strlen(k->name) >= sizeof(m->name))) {
		wf__cache_model_free(m);
		return wf_diag_set(&k->diag, WF_EINVAL, "model name empty or longer than %u bytes",
		                   WF_CACHE_NAME_MAX - 1);
	}
	snprintf(m->name, sizeof(m->name), "%s", k->name ? k->name : hex);
	m->state = WF_RESIDENCY_DISK;
	m->floor_error = c->have_shm ? -ENOENT : 0;

	pthread_mutex_lock(&c->lock);
	for (size_t i = 0; i < c->n_models; i++)
		if (strcmp(c->models[i]->name, m->name) == 0)
			ret = wf_diag_set(&k->diag, WF_EDUPLICATE, "model '%s' already registered",
			                  m->name);
	if (!ret && c->n_models >= WF_CACHE_MODELS_MAX)
		ret = wf_diag_set(&k->diag, WF_ELIMIT, "more than %u models", WF_CACHE_MODELS_MAX);
	if (!ret && c->n_models == c->cap_models) {
		size_t ncap = c->cap_models ? c->cap_models * 2 : 16;
		struct model **p = realloc(c->models, ncap * sizeof(*p));
		if (!p)
			ret = -ENOMEM;
		else {
			c->models = p;
			c->cap_models = ncap;
		}
	}
	if (!ret) {
		m->id = c->next_id++;
		if (c->next_id == WF_CACHE_ANY)
			c->next_id = 1;
		c->models[c->n_models++] = m;
	}
	pthread_mutex_unlock(&c->lock);
	if (ret) {
		wf__cache_model_free(m);
		return ret;
	}
	if (c->have_shm)
		(void)wf__cache_floor_attach(c, m, NULL);
	k->out_id = m->id;
	wf__cache_emit(c, WF_CACHE_EVENT_RESIDENCY, m, 0, NULL);
	return 0;
}

static int cmd_remove(struct wf_cache *c, struct model *m, struct wf_diag *diag)
{
	int ret = evict_model(c, m, false, "removed");

	if (ret == -EBUSY)
		return busy_error(m, diag);
	wf__cache_floor_detach(c, m);
	pthread_mutex_lock(&c->lock);
	for (size_t i = 0; i < c->n_models; i++) {
		if (c->models[i] == m) {
			memmove(&c->models[i], &c->models[i + 1],
			        (c->n_models - i - 1) * sizeof(*c->models));
			c->n_models--;
			break;
		}
	}
	pthread_mutex_unlock(&c->lock);
	wf__cache_model_free(m);
	return 0;
}

static int cmd_set_residency(struct wf_cache *c, struct model *m, enum wf_residency to,
                             struct wf_diag *diag)
{
	bool self = wf__cache_mode_get(c) == WF_CACHE_SELF_MANAGED;
	int ret;

	switch (to) {
	case WF_RESIDENCY_DISK:
	case WF_RESIDENCY_HOST:
		if (to == WF_RESIDENCY_HOST && !c->have_shm)
			return wf_diag_set(diag, WF_EUNSUPPORTED,
			                   "model '%s': HOST needs a floor directory", m->name);
		ret = evict_model(c, m, false, to == WF_RESIDENCY_DISK ? "to DISK" : "to HOST");
		if (ret == -EBUSY)
			return busy_error(m, diag);
		if (to == WF_RESIDENCY_DISK) {
			wf__cache_floor_detach(c, m);
			return 0;
		}
		ret = wf__cache_floor_attach(c, m, diag);
		if (ret < 0)
			return wf_diag_set(diag, ret, "model '%s': no floor: %s", m->name,
			                   wf_strerror(ret));
		return 0;
	case WF_RESIDENCY_DEVICE:
		if (m->state == WF_RESIDENCY_PINNED_DEVICE)
			return unpin_model(c, m, diag);
		set_active(c, m->id);
		return load_model(c, m, false, false, self, diag);
	case WF_RESIDENCY_PINNED_DEVICE:
		set_active(c, m->id);
		return load_model(c, m, true, false, self, diag);
	default:
		return wf_diag_set(diag, WF_EINVAL, "residency %d out of range", (int)to);
	}
}

static int cmd_compact(struct wf_cache *c, struct cmd *k)
{
	struct model **list;
	size_t n = 0;
	int first = 0;

	list = calloc(c->n_models + 1, sizeof(*list));
	if (!list)
		return -ENOMEM;
	/* All or nothing: check every id and every acquisition before freeing anything. */
	pthread_mutex_lock(&c->lock);
	for (size_t i = 0; i < k->n_ids; i++) {
		if (!wf__cache_find_locked(c, k->ids[i])) {
			pthread_mutex_unlock(&c->lock);
			free(list);
			return wf_diag_set(&k->diag, WF_ENOT_FOUND, "compact: no model %u",
			                   k->ids[i]);
		}
	}
	for (size_t i = 0; i < c->n_models; i++) {
		struct model *m = c->models[i];
		if (!wf__cache_any_set(m, false))
			continue;
		if (m->acquired) {
			int ret = busy_error(m, &k->diag);
			pthread_mutex_unlock(&c->lock);
			free(list);
			return ret;
		}
		list[n++] = m;
	}
	pthread_mutex_unlock(&c->lock);
	/* Only the manager changes residency, but a request may have acquired a model since:
	 * those stay (their eviction fails with -EBUSY) and are reported. */
	for (size_t i = 0; i < n; i++)
		if (evict_sets(c, list[i], ALL_SETS, true, false, "compact") == -EBUSY && !first)
			first = busy_error(list[i], &k->diag);
	free(list);
	for (size_t i = 0; i < k->n_ids; i++) {
		struct model *m;
		struct wf_diag d = {0};
		int ret;

		pthread_mutex_lock(&c->lock);
		m = wf__cache_find_locked(c, k->ids[i]);
		pthread_mutex_unlock(&c->lock);
		set_active(c, m->id);
		ret = load_model(c, m, false, false, false, &d);
		if (ret < 0) {
			wf__cache_set_error(c, m, ret, &d);
			if (!first) {
				first = ret;
				wf_diag_set(&k->diag, ret, "compact: %s", wf_diag_str(&d, ret));
			}
		}
	}
	return first;
}

static int cmd_release_all(struct wf_cache *c, struct wf_diag *diag)
{
	pthread_mutex_lock(&c->lock);
	for (size_t i = 0; i < c->n_models; i++) {
		if (c->models[i]->acquired) {
			int ret = busy_error(c->models[i], diag);
			pthread_mutex_unlock(&c->lock);
			return ret;
		}
	}
	pthread_mutex_unlock(&c->lock);
	for (size_t i = 0; i < c->n_models; i++) {
		int ret = evict_model(c, c->models[i], false, "release all");
		if (ret == -EBUSY)
			return busy_error(c->models[i], diag);
	}
	return 0;
}

/* A reservation never goes over the budget (unlike a model, which the control plane may want
 * on the device at any cost): its owner can retry smaller, or not at all. */
static int cmd_resv_create(struct wf_cache *c, struct cmd *k)
{
	bool self = wf__cache_mode_get(c) == WF_CACHE_SELF_MANAGED, over = false;
	struct resv *r = calloc(1, sizeof(*r));
	uint64_t on_demand;
	int ret = 0;

	if (!r)
		return -ENOMEM;
	snprintf(r->name, sizeof(r->name), "%s", k->name);
	r->bytes = k->bytes;
	r->evict = k->evict;
	r->ctx = k->evict_ctx;
	/* Room in the table first: nothing is evicted for a reservation that cannot be kept. */
	pthread_mutex_lock(&c->lock);
	on_demand = c->budget.on_demand;
	if (c->n_resv == c->cap_resv) {
		size_t ncap = c->cap_resv ? c->cap_resv * 2 : 8;
		struct resv **p = realloc(c->resvs, ncap * sizeof(*p));
		if (!p)
			ret = -ENOMEM;
		else {
			c->resvs = p;
			c->cap_resv = ncap;
		}
	}
	pthread_mutex_unlock(&c->lock);
	if (ret < 0)
		goto fail;
	if (k->bytes > on_demand) {
		ret = wf_diag_set(&k->diag, WF_ENO_SPACE,
		                  "%s: %" PRIu64
		                  " device bytes exceed the whole on-demand budget of %" PRIu64
		                  " (nothing was evicted)",
		                  r->name, k->bytes, on_demand);
		goto fail;
	}
	/* NO_ROOM (what is in use leaves too little) fails before any victim goes; OVERSIZED
	 * cannot happen below the budget. */
	ret = make_room(c, NULL, r->name, k->bytes, 0, self, &over, &k->diag);
	if (ret < 0)
		goto fail;
	pthread_mutex_lock(&c->lock);
	r->id = c->next_resv++;
	if (!r->id)
		r->id = c->next_resv++;
	r->acquired = 1;
	r->lru = ++c->tick;
	c->resvs[c->n_resv++] = r;
	pthread_mutex_unlock(&c->lock);
	k->out_id = r->id;
	return 0;
fail:
	free(r);
	return ret;
}

/* The sets holding a wanted tensor loaded (self-managed mode: one load per set missing; loading
 * one never evicts another of the model, the target of its own room), then the model acquired
 * and the wanted tensors' device addresses given where their set is resident. */
static int cmd_acquire_sets(struct wf_cache *c, struct model *m, const bool *wanted, bool self,
                            void **out, struct wf_diag *diag)
{
	const uint32_t nt = m->model->n_tensors;
	for (uint32_t s = 0; s < m->n_sets && self; s++) {
		const struct wset *w = &m->sets[s];
		bool want = false;
		for (uint32_t k = 0; k < w->def.n_tensors && !want; k++)
			want = wanted[w->def.tensors[k]];
		if (!want || w->resident)
			continue;
		int ret = load_sets(c, m, s, false, false, true, diag);
		if (ret < 0)
			return ret;
	}
	pthread_mutex_lock(&c->lock);
	for (uint32_t i = 0; i < nt; i++)
		out[i] = wanted[i] ? m->tensors[i] : NULL;
	m->acquired++;
	m->lru = ++c->tick;
	pthread_mutex_unlock(&c->lock);
	return 0;
}

/* The set holding tensor t, or NULL. */
static struct wset *set_of(struct model *m, uint32_t t)
{
	for (uint32_t s = 0; s < m->n_sets; s++) {
		const struct wf_wset_def *def = &m->sets[s].def;
		uint32_t lo = 0, hi = def->n_tensors; /* def->tensors is ascending */
		while (lo < hi) {
			const uint32_t mid = lo + (hi - lo) / 2;
			if (def->tensors[mid] < t)
				lo = mid + 1;
			else
				hi = mid;
		}
		if (lo < def->n_tensors && def->tensors[lo] == t)
			return &m->sets[s];
	}
	return NULL;
}

/* The store's part of the refresh seam: a new device copy of each listed tensor that is resident,
 * from the floor's current (published) bytes; the copies it replaces stay valid until
 * CMD_REFRESH_DONE. All copies are made before any pointer changes: a failure changes nothing. */
static int cmd_refresh(struct wf_cache *c, struct model *m, uint32_t n, const uint32_t *ids,
                       void **out, struct wf_diag *diag)
{
	if (!m->region)
		return wf_diag_set(diag, WF_ESTATE,
		                   "model '%s': no floor attached, nothing to refresh from",
		                   m->name);
	struct wf_device_stream *st = NULL;
	int ret = wf_device_stream_create(c->dev, &st, diag);
	for (uint32_t i = 0; i < n; i++)
		out[i] = NULL;
	for (uint32_t i = 0; ret == 0 && i < n; i++) {
		if (ids[i] >= m->model->n_tensors) {
			ret = wf_diag_set(diag, WF_EINVAL, "model '%s' has no tensor %u", m->name,
			                  ids[i]);
			break;
		}
		pthread_mutex_lock(&c->lock);
		const struct wset *w = set_of(m, ids[i]);
		const bool res = w && w->resident;
		pthread_mutex_unlock(&c->lock);
		if (!res)
			continue;
		struct wf_shm_tensor_info info;
		if ((ret = wf_shm_region_tensor(m->region, ids[i], &info)) < 0) {
			wf_diag_set(diag, ret, "model '%s': floor entry %u", m->name, ids[i]);
			break;
		}
		if (info.nbytes != m->model->tensors[ids[i]].nbytes) {
			ret = wf_diag_set(
			    diag, WF_EFORMAT,
			    "model '%s': tensor '%s' changed size in the floor: a refresh "
			    "copies bytes of the same size only",
			    m->name, m->model->tensors[ids[i]].name);
			break;
		}
		if ((ret = wf_device_mem_alloc(c->dev, info.nbytes, &out[i], diag)) < 0)
			break;
		ret = wf_device_memcpy_async(st, out[i], info.data, info.nbytes, WF_DEVICE_COPY_H2D,
		                             diag);
	}
	if (ret == 0)
		ret = wf_device_stream_synchronize(st, diag);
	wf_device_stream_destroy(st);
	if (ret < 0) {
		for (uint32_t i = 0; i < n; i++)
			if (out[i])
				(void)wf_device_mem_free(c->dev, out[i], NULL);
		for (uint32_t i = 0; i < n; i++)
			out[i] = NULL;
		return ret;
	}
	pthread_mutex_lock(&c->lock);
	for (uint32_t i = 0; i < n; i++) {
		if (!out[i])
			continue;
		const uint32_t t = ids[i];
		struct wset *w = set_of(m, t);
		if (m->rcopy[t]) {
			if (m->n_superseded == m->cap_superseded) {
				size_t cap = m->cap_superseded ? 2 * m->cap_superseded : 16;
				struct superseded *ns =
				    realloc(m->superseded, cap * sizeof(*m->superseded));
				if (!ns) { /* keep it then: freed with its set */
					continue;
				}
				m->superseded = ns;
				m->cap_superseded = cap;
			}
			m->superseded[m->n_superseded++] =
			    (struct superseded){m->rcopy[t], m->rcopy_bytes[t], t};
		}
		m->rcopy[t] = out[i];
		m->rcopy_bytes[t] = m->model->tensors[t].nbytes;
		m->tensors[t] = out[i];
		w->device_bytes += m->rcopy_bytes[t];
	}
	wf__cache_model_refresh_locked(m);
	pthread_mutex_unlock(&c->lock);
	return 0;
}

/* Every engine swapped: the superseded copies go. */
static int cmd_refresh_done(struct wf_cache *c, struct model *m)
{
	pthread_mutex_lock(&c->lock);
	struct superseded *list = m->superseded;
	const size_t n = m->n_superseded;
	for (size_t i = 0; i < n; i++) {
		struct wset *w = set_of(m, list[i].tensor);
		if (w)
			w->device_bytes -= list[i].bytes;
	}
	m->superseded = NULL;
	m->n_superseded = m->cap_superseded = 0;
	wf__cache_model_refresh_locked(m);
	pthread_mutex_unlock(&c->lock);
	for (size_t i = 0; i < n; i++)
		(void)wf_device_mem_free(c->dev, list[i].ptr, NULL);
	free(list);
	return 0;
}

static int check_budget(const struct wf_cache_budget *b, struct wf_diag *diag)
{
	struct wf_devbudget_in in = {b->arena, b->weight_fraction, b->wiggle_fraction,
	                             b->max_scratch, 0};
	struct wf_devbudget out;

	if (wf_devbudget_compute(&in, &out) < 0)
		return wf_diag_set(diag, WF_EINVAL,
		                   "budget: fractions must be in [0, 1] (weight %g, wiggle %g)",
		                   b->weight_fraction, b->wiggle_fraction);
	return 0;
}

static int run_cmd(struct wf_cache *c, struct cmd *k)
{
	struct model *m = NULL;
	bool self = wf__cache_mode_get(c) == WF_CACHE_SELF_MANAGED;
	int ret;

	switch (k->type) {
	case CMD_ADD:
		return cmd_add(c, k);
	case CMD_COMPACT:
		return cmd_compact(c, k);
	case CMD_RELEASE_ALL:
		return cmd_release_all(c, &k->diag);
	case CMD_RESV_CREATE:
		return cmd_resv_create(c, k);
	case CMD_RESV_EVICT:
		return evict_resv(c, k->id, false, "released");
	case CMD_EVICT_OLDEST:
		ret = evict_one_lru(c, NULL);
		if (ret == WF_ENO_SPACE)
			ret = wf_diag_set(&k->diag, ret,
			                  "nothing evictable on the device (every model and engine "
			                  "there is pinned or in use)");
		return ret;
	case CMD_SET_BUDGET:
		ret = check_budget(&k->budget, &k->diag);
		if (ret < 0)
			return ret;
		pthread_mutex_lock(&c->lock);
		c->bin = k->budget;
		wf__cache_budget_update_locked(c);
		pthread_mutex_unlock(&c->lock);
		enforce_budget(c);
		return 0;
	default:
		break;
	}
	pthread_mutex_lock(&c->lock);
	m = wf__cache_find_locked(c, k->id);
	pthread_mutex_unlock(&c->lock);
	if (!m)
		return wf_diag_set(&k->diag, WF_ENOT_FOUND, "no model with id %u", k->id);
	switch (k->type) {
	case CMD_REMOVE:
		return cmd_remove(c, m, &k->diag);
	case CMD_SET_RESIDENCY:
		ret = cmd_set_residency(c, m, k->state, &k->diag);
		break;
	case CMD_EVICT:
		if (wf__cache_any_set(m, true))
			ret = wf_diag_set(&k->diag, WF_ESTATE,
			                  "model '%s' is pinned: unpin it or set its residency",
			                  m->name);
		else if ((ret = evict_model(c, m, false, "evict")) == -EBUSY)
			ret = busy_error(m, &k->diag);
		break;
	case CMD_UNPIN:
		ret = unpin_model(c, m, &k->diag);
		break;
	case CMD_WSET_LOAD:
	case CMD_WSET_EVICT:
		if (k->set >= m->n_sets) {
			ret = wf_diag_set(&k->diag, WF_ENOT_FOUND, "model '%s' has no set %u",
			                  m->name, k->set);
		} else if (k->type == CMD_WSET_LOAD) {
			ret = load_sets(c, m, k->set, k->state == WF_RESIDENCY_PINNED_DEVICE, false,
			                self, &k->diag);
		} else if ((ret = evict_sets(c, m, k->set, false, false, "evict set")) == -EBUSY) {
			ret = busy_error(m, &k->diag);
		}
		break;
	case CMD_PREFETCH:
		ret = load_model(c, m, false, false, self, &k->diag);
		break;
	case CMD_ACQUIRE_SETS:
		ret = cmd_acquire_sets(c, m, k->wanted, self, k->out_tensors, &k->diag);
		break;
	case CMD_REFRESH:
		ret = cmd_refresh(c, m, (uint32_t)k->n_ids, k->ids, k->out_tensors, &k->diag);
		break;
	case CMD_REFRESH_DONE:
		ret = cmd_refresh_done(c, m);
		break;
	case CMD_ACQUIRE:
		/* The mode may have changed since the request was queued. */
		if (!self && !resident(m))
			ret = wf_diag_set(&k->diag, WF_ENOT_RESIDENT, "model '%s' is not resident",
			                  m->name);
		else
			ret = load_model(c, m, false, true, self, &k->diag);
		break;
	default:
		ret = wf_diag_set(&k->diag, WF_EINTERNAL, "unknown command %d", (int)k->type);
	}
	if (ret < 0)
		wf__cache_set_error(c, m, ret, &k->diag);
	return ret;
}

static bool is_load(const struct cmd *k)
{
	return k->type == CMD_PREFETCH || k->type == CMD_ACQUIRE || k->type == CMD_WSET_LOAD ||
	       k->type == CMD_ACQUIRE_SETS ||
	       (k->type == CMD_SET_RESIDENCY && k->state >= WF_RESIDENCY_DEVICE);
}

/* The io reader is created, used and destroyed on this thread: an io_uring reader registers its
 * ring descriptor with the thread that set it up (io_uring_register_ring_fd), and a registered
 * ring is invisible to every other thread. The stage registers its ring with that reader, so it
 * lives here too, made by the first load (stage_ready): its pinned ring (64 MiB by default) is
 * resident memory that a worker which never copies weights to its device (one that only runs
 * the CPU engine on the floor) should not hold. Its options are checked here, at start. */
static int manager_init(struct wf_cache *c)
{
	int ret = wf_io_reader_create(c->have_io_opts ? &c->io_opts : NULL, &c->io);

	if (ret < 0)
		return wf_diag_set(&c->init_diag, ret, "cache: io reader: %s", wf_strerror(ret));
	return wf_stage_info_planned(&c->opts.stage, &c->stage_info, &c->init_diag);
}

/* Makes the stage on the first load. */
static int stage_ready(struct wf_cache *c, struct wf_diag *diag)
{
	if (c->stage)
		return 0;
	struct wf_stage *st = NULL;
	struct wf_diag d = {{0}};
	int ret = wf_stage_create(c->dev, c->io, &c->opts.stage, &st, &d);
	if (ret < 0)
		return wf_diag_set(diag, ret, "staging buffers: %s", wf_diag_str(&d, ret));
	pthread_mutex_lock(&c->lock);
	c->stage = st;
	wf_stage_info(c->stage, &c->stage_info);
	pthread_mutex_unlock(&c->lock);
	return 0;
}

static void manager_fini(struct wf_cache *c)
{
	wf_stage_destroy(c->stage);
	c->stage = NULL;
	wf_io_reader_destroy(c->io);
	c->io = NULL;
}

static void *manager_main(void *arg)
{
	struct wf_cache *c = arg;
	int ret = manager_init(c);

	pthread_mutex_lock(&c->lock);
	c->init_ret = ret;
	c->init_done = true;
	pthread_cond_broadcast(&c->done);
	if (ret < 0) {
		pthread_mutex_unlock(&c->lock);
		manager_fini(c);
		return NULL;
	}
	for (;;) {
		struct cmd *k;

		while (!c->head && !c->closing)
			pthread_cond_wait(&c->wake, &c->lock);
		k = c->head;
		if (!k)
			break;
		c->head = k->next;
		if (!c->head)
			c->tail = NULL;
		c->active_id = is_load(k) ? k->id : NO_ID;
		__atomic_store_n(&c->cancel_flag, c->closing ? 1 : 0, __ATOMIC_RELAXED);
		pthread_mutex_unlock(&c->lock);

		ret = run_cmd(c, k);

		pthread_mutex_lock(&c->lock);
		c->active_id = NO_ID;
		if (k->async) {
			free(k);
		} else {
			k->result = ret;
			k->done = true;
			pthread_cond_broadcast(&c->done);
		}
	}
	pthread_mutex_unlock(&c->lock);
	manager_fini(c);
	return NULL;
}

/* Posts k and, unless it is async (then heap-allocated and freed by the manager), waits for it. */
int wf__cache_post(struct wf_cache *c, struct cmd *k, struct wf_diag *diag)
{
	int ret;

	pthread_mutex_lock(&c->lock);
	if (c->closing) {
		pthread_mutex_unlock(&c->lock);
		if (k->async)
			free(k);
		return wf_diag_set(diag, WF_ECANCELED, "cache is closing");
	}
	k->next = NULL;
	if (c->tail)
		c->tail->next = k;
	else
		c->head = k;
	c->tail = k;
	pthread_cond_signal(&c->wake);
	if (k->async) {
		pthread_mutex_unlock(&c->lock);
		return 0;
	}
	while (!k->done)
		pthread_cond_wait(&c->done, &c->lock);
	ret = k->result;
	pthread_mutex_unlock(&c->lock);
	if (ret < 0 && diag && !diag->msg[0])
		*diag = k->diag;
	return ret;
}

int wf_cache_create(struct wf_device *dev, const struct wf_cache_opts *opts,
                    struct wf_cache **ret_cache, struct wf_diag *diag)
{
	struct wf_cache *c;
	sigset_t all, old;
	int ret;

	if (!dev || !ret_cache)
		return wf_diag_set(diag, WF_EINVAL, "cache create: NULL argument");
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->dev = dev;
	c->next_id = 1;
	c->next_resv = 1;
	pthread_mutex_init(&c->lock, NULL);
	pthread_cond_init(&c->wake, NULL);
	pthread_cond_init(&c->done, NULL);
	c->opts = opts ? *opts : (struct wf_cache_opts){0};
	if ((unsigned)c->opts.mode >= WF_CACHE_MODE_MAX ||
	    (unsigned)c->opts.load_mode >= WF_STAGE_MODE_MAX) {
		ret = wf_diag_set(diag, WF_EINVAL, "cache: mode %d or load mode %d out of range",
		                  (int)c->opts.mode, (int)c->opts.load_mode);
		goto err;
	}
	c->mode = c->opts.mode;
	if (c->opts.budget) {
		c->bin = *c->opts.budget;
		ret = check_budget(&c->bin, diag);
		if (ret < 0)
			goto err;
	} else {
		c->bin = (struct wf_cache_budget){0, WF_DEVBUDGET_FRACTION_DEFAULT,
		                                  WF_DEVBUDGET_WIGGLE_DEFAULT, 0};
	}
	if (!c->bin.arena) {
		size_t fr = 0;
		ret = wf_device_mem_info(dev, &fr, NULL, diag);
		if (ret < 0)
			goto err;
		c->bin.arena = fr;
	}
	wf__cache_budget_update_locked(c);
	if (c->opts.shm) {
		c->have_shm = true;
		c->shm = *c->opts.shm;
		if (c->shm.dir) {
			c->shm_dir = strdup(c->shm.dir);
			if (!c->shm_dir) {
				ret = -ENOMEM;
				goto err;
			}
			c->shm.dir = c->shm_dir;
		}
	}
	if (c->opts.io) {
		c->io_opts = *c->opts.io;
		c->have_io_opts = true;
	}
	c->opts.budget = NULL;
	c->opts.shm = NULL;
	c->opts.io = NULL;
	/* The manager takes no signals: they belong to the application's threads. */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	ret = -pthread_create(&c->thread, NULL, manager_main, c);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (ret < 0) {
		wf_diag_set(diag, ret, "cache: pthread_create: %s", strerror(-ret));
		goto err;
	}
	c->started = true;
	/* The manager builds the io reader and the stage itself (see manager_main). */
	pthread_mutex_lock(&c->lock);
	while (!c->init_done)
		pthread_cond_wait(&c->done, &c->lock);
	ret = c->init_ret;
	pthread_mutex_unlock(&c->lock);
	if (ret < 0) {
		if (diag && !diag->msg[0])
			*diag = c->init_diag;
		goto err;
	}
	*ret_cache = c;
	return 0;
err:
	wf_cache_destroy(c);
	return ret;
}

void wf_cache_close(struct wf_cache *c)
{
	if (!c)
		return;
	pthread_mutex_lock(&c->lock);
	if (!c->closing) {
		c->closing = true;
		__atomic_store_n(&c->cancel_flag, 1, __ATOMIC_RELAXED);
		for (struct cmd *k = c->head, *next; k; k = next) {
			next = k->next;
			if (k->async) {
				free(k);
			} else {
				k->result = wf_diag_set(&k->diag, WF_ECANCELED, "cache is closing");
				k->done = true;
			}
		}
		c->head = c->tail = NULL;
		pthread_cond_broadcast(&c->done);
		pthread_cond_signal(&c->wake);
	}
	pthread_mutex_unlock(&c->lock);
}

void wf_cache_stop(struct wf_cache *c)
{
	if (!c)
		return;
	wf_cache_close(c);
	if (c->started && !c->stopped) {
		pthread_join(c->thread, NULL);
		c->stopped = true;
	}
}

void wf_cache_destroy(struct wf_cache *c)
{
	if (!c)
		return;
	wf_cache_stop(c);
	/* The manager is gone: this thread is now the sole mutator. Acquisitions no longer
	 * matter (the caller has stopped its requests), and nobody listens for events. */
	c->opts.event = NULL;
	for (size_t i = 0; i < c->n_models; i++) {
		c->models[i]->acquired = 0;
		(void)evict_model(c, c->models[i], false, "shutdown");
	}
	for (size_t i = 0; i < c->n_models; i++) {
		wf__cache_floor_detach(c, c->models[i]);
		wf__cache_model_free(c->models[i]);
	}
	free(c->models);
	/* Their owners free their memory themselves. */
	for (size_t i = 0; i < c->n_resv; i++)
		free(c->resvs[i]);
	free(c->resvs);
	free(c->shm_dir);
	pthread_cond_destroy(&c->done);
	pthread_cond_destroy(&c->wake);
	pthread_mutex_destroy(&c->lock);
	free(c);
}

int wf_cache_model_add(struct wf_cache *c, const char *name, const struct wf_model *model,
                       uint32_t *ret_id, struct wf_diag *diag)
{
	struct cmd k = {.type = CMD_ADD, .name = name, .model = model};
	int ret;

	if (!c || !model || !ret_id)
		return wf_diag_set(diag, WF_EINVAL, "model add: NULL argument");
	ret = wf__cache_post(c, &k, diag);
	if (ret == 0)
		*ret_id = k.out_id;
	return ret;
}

int wf_cache_model_remove(struct wf_cache *c, uint32_t id, struct wf_diag *diag)
{
	struct cmd k = {.type = CMD_REMOVE, .id = id};
	return c ? wf__cache_post(c, &k, diag) : WF_EINVAL;
}

int wf_cache_set_residency(struct wf_cache *c, uint32_t id, enum wf_residency state,
                           struct wf_diag *diag)
{
	struct cmd k = {.type = CMD_SET_RESIDENCY, .id = id, .state = state};

	if (!c || (unsigned)state >= WF_RESIDENCY_MAX)
		return wf_diag_set(diag, WF_EINVAL, "set residency: bad argument");
	return wf__cache_post(c, &k, diag);
}

int wf_cache_pin(struct wf_cache *c, uint32_t id, struct wf_diag *diag)
{
	return wf_cache_set_residency(c, id, WF_RESIDENCY_PINNED_DEVICE, diag);
}

int wf_cache_unpin(struct wf_cache *c, uint32_t id, struct wf_diag *diag)
{
	struct cmd k = {.type = CMD_UNPIN, .id = id};
	return c ? wf__cache_post(c, &k, diag) : WF_EINVAL;
}

int wf_cache_evict(struct wf_cache *c, uint32_t id, struct wf_diag *diag)
{
	struct cmd k = {.type = CMD_EVICT, .id = id};
	return c ? wf__cache_post(c, &k, diag) : WF_EINVAL;
}

int wf_cache_prefetch(struct wf_cache *c, uint32_t id, bool wait, struct wf_diag *diag)
{
	struct cmd *k, local = {.type = CMD_PREFETCH, .id = id};

	if (!c)
		return WF_EINVAL;
	if (wait)
		return wf__cache_post(c, &local, diag);
	k = calloc(1, sizeof(*k));
	if (!k)
		return -ENOMEM;
	*k = local;
	k->async = true;
	return wf__cache_post(c, k, diag);
}

int wf_cache_compact(struct wf_cache *c, const uint32_t *ids, size_t n, struct wf_diag *diag)
{
	struct cmd k = {.type = CMD_COMPACT, .ids = ids, .n_ids = n};

	if (!c || (n && !ids))
		return wf_diag_set(diag, WF_EINVAL, "compact: bad argument");
	return wf__cache_post(c, &k, diag);
}

int wf_cache_release_all(struct wf_cache *c, struct wf_diag *diag)
{
	struct cmd k = {.type = CMD_RELEASE_ALL};
	return c ? wf__cache_post(c, &k, diag) : WF_EINVAL;
}

int wf_cache_set_budget(struct wf_cache *c, const struct wf_cache_budget *budget,
                        struct wf_diag *diag)
{
	struct cmd k = {.type = CMD_SET_BUDGET};

	if (!c || !budget)
		return wf_diag_set(diag, WF_EINVAL, "set budget: NULL argument");
	k.budget = *budget;
	if (!k.budget.arena) {
		pthread_mutex_lock(&c->lock);
		k.budget.arena = c->bin.arena;
		pthread_mutex_unlock(&c->lock);
	}
	return wf__cache_post(c, &k, diag);
}

int wf_cache_set_mode(struct wf_cache *c, enum wf_cache_mode mode)
{
	if (!c || (unsigned)mode >= WF_CACHE_MODE_MAX)
		return WF_EINVAL;
	pthread_mutex_lock(&c->lock);
	c->mode = mode;
	pthread_mutex_unlock(&c->lock);
	return 0;
}

int wf_cache_cancel(struct wf_cache *c, uint32_t id)
{
	int ret = WF_ESTATE;

	if (!c)
		return WF_EINVAL;
	pthread_mutex_lock(&c->lock);
	/* Queued loads of it go first, so the cancel cannot be followed by its own reload. */
	for (struct cmd **pk = &c->head; *pk;) {
		struct cmd *k = *pk;
		if (is_load(k) && (id == WF_CACHE_ANY || k->id == id)) {
			*pk = k->next;
			if (k->async) {
				free(k);
			} else {
				k->result = wf_diag_set(&k->diag, WF_ECANCELED, "load canceled");
				k->done = true;
			}
			ret = 0;
			continue;
		}
		pk = &k->next;
	}
	c->tail = NULL;
	for (struct cmd *k = c->head; k; k = k->next)
		c->tail = k;
	if (c->active_id != NO_ID && (id == WF_CACHE_ANY || c->active_id == id)) {
		__atomic_store_n(&c->cancel_flag, 1, __ATOMIC_RELAXED);
		ret = 0;
	}
	pthread_cond_broadcast(&c->done);
	pthread_mutex_unlock(&c->lock);
	return ret;
}

int wf_cache_wset_load(struct wf_cache *c, uint32_t id, uint32_t set, bool pin,
                       struct wf_diag *diag)
{
	struct cmd k = {
	    .type = CMD_WSET_LOAD,
	    .id = id,
	    .set = set,
	    .state = pin ? WF_RESIDENCY_PINNED_DEVICE : WF_RESIDENCY_DEVICE,
	};
	return c ? wf__cache_post(c, &k, diag) : WF_EINVAL;
}

int wf_cache_wset_evict(struct wf_cache *c, uint32_t id, uint32_t set, struct wf_diag *diag)
{
	struct cmd k = {.type = CMD_WSET_EVICT, .id = id, .set = set};
	return c ? wf__cache_post(c, &k, diag) : WF_EINVAL;
}

int wf_cache_resv_create(struct wf_cache *c, const char *name, uint64_t bytes,
                         wf_cache_resv_evict_fn *evict, void *ctx, uint32_t *ret_resv,
                         struct wf_diag *diag)
{
	struct cmd k = {.type = CMD_RESV_CREATE,
	                .name = name ? name : "?",
	                .bytes = bytes,
	                .evict = evict,
	                .evict_ctx = ctx};
	int ret;

	if (!c || !evict || !ret_resv)
		return wf_diag_set(diag, WF_EINVAL, "reservation: NULL argument");
	ret = wf__cache_post(c, &k, diag);
	if (ret == 0)
		*ret_resv = k.out_id;
	return ret;
}

int wf_cache_acquire_sets(struct wf_cache *c, uint32_t id, const bool *wanted, void **ret_tensors,
                          struct wf_diag *diag)
{
	struct cmd k = {
	    .type = CMD_ACQUIRE_SETS, .id = id, .wanted = wanted, .out_tensors = ret_tensors};
	if (!c || !wanted || !ret_tensors)
		return wf_diag_set(diag, WF_EINVAL, "acquire sets: NULL argument");
	return wf__cache_post(c, &k, diag);
}

int wf_cache_refresh(struct wf_cache *c, uint32_t id, uint32_t n, const uint32_t *tensors,
                     void **ret_device, struct wf_diag *diag)
{
	struct cmd k = {
	    .type = CMD_REFRESH, .id = id, .ids = tensors, .n_ids = n, .out_tensors = ret_device};
	if (!c || (n && (!tensors || !ret_device)))
		return wf_diag_set(diag, WF_EINVAL, "refresh: NULL argument");
	return wf__cache_post(c, &k, diag);
}

int wf_cache_resv_evict(struct wf_cache *c, uint32_t resv)
{
	struct cmd k = {.type = CMD_RESV_EVICT, .id = resv};
	return c ? wf__cache_post(c, &k, NULL) : WF_EINVAL;
}

int wf_cache_refresh_done(struct wf_cache *c, uint32_t id)
{
	struct cmd k = {.type = CMD_REFRESH_DONE, .id = id};
	return c ? wf__cache_post(c, &k, NULL) : WF_EINVAL;
}

int wf_cache_evict_oldest(struct wf_cache *c, struct wf_diag *diag)
{
	struct cmd k = {.type = CMD_EVICT_OLDEST};
	return c ? wf__cache_post(c, &k, diag) : WF_EINVAL;
}
