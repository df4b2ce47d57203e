/* The device weight cache (worker/cache.h).
 *
 * Locking. One mutex guards the command queue and every field that a thread other than the
 * manager reads (the model table, states, acquisition counts, LRU stamps, progress, the budget).
 * The manager is the only writer of residency: it takes the mutex for each state change and
 * never holds it across a load, an allocation or a free, so acquire/release/status stay cheap
 * while a load runs. The one field other threads write is `acquired` (and the LRU stamp with
 * it); the manager re-checks `acquired` under the mutex in the same critical section that takes
 * a model off the device, so an acquisition either happens before (and the eviction fails with
 * -EBUSY) or after (and sees the model gone).
 *
 * A load is published only once it is complete: during the load the model keeps its host level
 * (DISK or HOST) with `loading` set, so a request never sees a half-loaded model. */
#include "worker/cache.h"

#include "base/error.h"
#include "base/lru.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NO_ID          0u
#define LAYOUT_GAP     4096u /* source gaps kept in the device layout (padding, headers) */
#define LAYOUT_ALIGN   256u
#define PROGRESS_EVENT (64ull << 20)
#define PLAN_RETRIES   8

enum cmd_type {
	CMD_ADD,
	CMD_REMOVE,
	CMD_SET_RESIDENCY,
	CMD_EVICT,
	CMD_UNPIN,
	CMD_PREFETCH,
	CMD_ACQUIRE,
	CMD_COMPACT,
	CMD_RELEASE_ALL,
	CMD_SET_BUDGET,
};

struct cmd {
	struct cmd *next;
	enum cmd_type type;
	uint32_t id;
	enum wf_residency state;
	const uint32_t *ids;
	size_t n_ids;
	struct wf_cache_budget budget;
	const char *name;
	const struct wf_model *model;
	uint32_t out_id;
	bool async, done;
	int result;
	struct wf_diag diag;
};

struct model {
	uint32_t id;
	char name[WF_CACHE_NAME_MAX];
	const struct wf_model *model;
	struct wf_digest digest;

	struct wf_shm_region *region; /* our own read-only attachment, or NULL */
	bool registered;              /* region mapping registered with the device */
	bool register_failed;
	int floor_error;

	enum wf_residency state;
	bool loading;
	uint64_t load_done, load_total;
	bool over_budget;

	/* The device copy (manager-owned; readers use tensors only while holding the model). */
	uint32_t n_segs;
	void **seg_ptr;
	uint64_t *seg_size;
	void **tensors;
	uint64_t *src_off; /* where each tensor's bytes came from (floor or file offset) */
	bool from_floor;
	uint64_t device_bytes;

	unsigned acquired;
	uint64_t lru;

	double last_seconds, last_gbps;
	enum wf_stage_mode last_mode;
	uint64_t loads, evictions;
	int last_error;
	char last_error_msg[WF_DIAG_MAX];
};

struct wf_cache {
	struct wf_device *dev;
	struct wf_io_reader *io;
	struct wf_stage *stage;
	struct wf_cache_opts opts; /* budget, shm, io pointers cleared: copies below */
	bool have_shm;
	struct wf_shm_config shm;
	char *shm_dir;

	pthread_mutex_t lock;
	pthread_cond_t wake; /* the manager: a command arrived, or closing */
	pthread_cond_t done; /* callers: some command finished */
	struct cmd *head, *tail;
	pthread_t thread;
	bool started, closing, stopped;
	bool init_done; /* the manager built its reader and stage (or failed: init_ret) */
	int init_ret;
	struct wf_diag init_diag;
	struct wf_io_opts io_opts;
	bool have_io_opts;
	uint32_t active_id; /* the model the manager loads (or is about to) */
	int cancel_flag;    /* read by the stage with an atomic load */

	struct model **models;
	size_t n_models, cap_models;
	uint32_t next_id;
	uint64_t tick;

	enum wf_cache_mode mode;
	struct wf_stage_info stage_info; /* the manager's copy for status (the stage is its own) */
	struct wf_cache_budget bin;
	struct wf_devbudget budget;
	uint64_t loads, evictions, lru_evictions;
};

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

static enum wf_cache_mode get_mode(struct wf_cache *c)
{
	enum wf_cache_mode mode;

	pthread_mutex_lock(&c->lock);
	mode = c->mode;
	pthread_mutex_unlock(&c->lock);
	return mode;
}

static bool resident(const struct model *m)
{
	return m->state == WF_RESIDENCY_DEVICE || m->state == WF_RESIDENCY_PINNED_DEVICE;
}

static enum wf_residency host_level(const struct model *m)
{
	return m->region ? WF_RESIDENCY_HOST : WF_RESIDENCY_DISK;
}

static uint64_t align_up(uint64_t v, uint64_t a)
{
	return (v + a - 1) & ~(a - 1);
}

/* Called with the lock held. */
static struct model *find_locked(struct wf_cache *c, uint32_t id)
{
	for (size_t i = 0; i < c->n_models; i++)
		if (c->models[i]->id == id)
			return c->models[i];
	return NULL;
}

/* Recomputes the budget from its inputs and the pinned bytes. Lock held. */
static void budget_update_locked(struct wf_cache *c)
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

static void emit(struct wf_cache *c, enum wf_cache_event_type type, const struct model *m,
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

static void set_error(struct wf_cache *c, struct model *m, int err, const struct wf_diag *diag)
{
	pthread_mutex_lock(&c->lock);
	m->last_error = err;
	snprintf(m->last_error_msg, sizeof(m->last_error_msg), "%s", wf_diag_str(diag, err));
	pthread_mutex_unlock(&c->lock);
}

/* ---- floors ---------------------------------------------------------------------------------- */

/* Attaches the model's floor if floors are configured and a READY one exists. Never waits on a
 * materialization in progress (NOWAIT): loading from the files meanwhile is as fast as waiting.
 * Returns 0 or the attach error (also kept in floor_error). */
static int floor_attach(struct wf_cache *c, struct model *m, struct wf_diag *diag)
{
	struct wf_shm_region *r = NULL;
	int ret;

	if (m->region)
		return 0;
	if (!c->have_shm)
		return wf_diag_set(diag, WF_EUNSUPPORTED,
		                   "model '%s': no floor directory configured", m->name);
	ret =
	    wf_shm_region_attach(&c->shm, &m->digest, m->model,
	                         WF_SHM_ATTACH_READER | WF_SHM_ATTACH_NOWAIT, NULL, NULL, &r, diag);
	pthread_mutex_lock(&c->lock);
	m->floor_error = ret;
	if (ret == 0) {
		m->region = r;
		m->register_failed = false;
		if (!resident(m))
			m->state = WF_RESIDENCY_HOST;
	}
	pthread_mutex_unlock(&c->lock);
	return ret;
}

/* Unregisters and detaches the floor. Only when the model is not resident (nothing on the device
 * may still be read from the mapping: copies finished when the load returned). */
static void floor_detach(struct wf_cache *c, struct model *m)
{
	struct wf_shm_region *r = m->region;

	if (!r)
		return;
	if (m->registered)
		(void)wf_device_host_unregister(c->dev, wf_shm_region_data(r), NULL);
	pthread_mutex_lock(&c->lock);
	m->region = NULL;
	m->registered = false;
	if (!resident(m))
		m->state = WF_RESIDENCY_DISK;
	pthread_mutex_unlock(&c->lock);
	wf_shm_region_detach(r);
}

/* ---- device copies --------------------------------------------------------------------------- */

struct devcopy {
	uint32_t n_segs;
	void **seg_ptr;
	uint64_t *seg_size;
	void **tensors;
	uint64_t *src_off;
	uint32_t *seg_of; /* per tensor, during a load only */
	uint64_t *dev_off;
	bool from_floor;
	uint64_t bytes;
};

static void devcopy_free(struct wf_cache *c, struct devcopy *d)
{
	for (uint32_t i = 0; d->seg_ptr && i < d->n_segs; i++)
		if (d->seg_ptr[i])
			(void)wf_device_mem_free(c->dev, d->seg_ptr[i], NULL);
	free(d->seg_ptr);
	free(d->seg_size);
	free(d->tensors);
	free(d->src_off);
	free(d->seg_of);
	free(d->dev_off);
	*d = (struct devcopy){0};
}

/* Source offset of each tensor: in the floor (the current generation's bytes) or in its file. */
static int source_offsets(struct model *m, struct devcopy *d, struct wf_diag *diag)
{
	const struct wf_model *mo = m->model;

	for (uint32_t i = 0; i < mo->n_tensors; i++) {
		if (!d->from_floor) {
			d->src_off[i] = mo->tensors[i].offset;
			continue;
		}
		struct wf_shm_tensor_info ti;
		int ret = wf_shm_region_tensor(m->region, i, &ti);
		if (ret < 0)
			return wf_diag_set(diag, ret, "model '%s': floor tensor %u: %s", m->name, i,
			                   wf_strerror(ret));
		if (ti.nbytes != mo->tensors[i].nbytes)
			return wf_diag_set(diag, WF_EFORMAT,
			                   "model '%s': floor tensor '%s' has %" PRIu64
			                   " bytes, the model %" PRIu64,
			                   m->name, mo->tensors[i].name, ti.nbytes,
			                   mo->tensors[i].nbytes);
		d->src_off[i] = ti.floor_offset;
	}
	return 0;
}

/* The device layout (see the top of cache.h): per tensor a segment and an offset in it. */
static int layout(struct wf_cache *c, struct model *m, struct devcopy *d, struct wf_diag *diag)
{
	const struct wf_model *mo = m->model;
	uint32_t nt = mo->n_tensors, seg = 0;
	uint64_t prev_src = 0, prev_src_end = 0, prev_dev = 0, prev_dev_end = 0;
	uint32_t prev_file = 0;
	bool empty = true;
	int ret;

	d->src_off = calloc(nt ? nt : 1, sizeof(*d->src_off));
	d->seg_of = calloc(nt ? nt : 1, sizeof(*d->seg_of));
	d->dev_off = calloc(nt ? nt : 1, sizeof(*d->dev_off));
	d->tensors = calloc(nt ? nt : 1, sizeof(*d->tensors));
	/* At most one segment per tensor. */
	d->seg_size = calloc(nt ? nt : 1, sizeof(*d->seg_size));
	d->seg_ptr = calloc(nt ? nt : 1, sizeof(*d->seg_ptr));
	if (!d->src_off || !d->seg_of || !d->dev_off || !d->tensors || !d->seg_size || !d->seg_ptr)
		return -ENOMEM;
	ret = source_offsets(m, d, diag);
	if (ret < 0)
		return ret;
	for (uint32_t i = 0; i < nt; i++) {
		uint64_t src = d->src_off[i], nb = mo->tensors[i].nbytes, dev;
		uint32_t file = d->from_floor ? 0 : mo->tensors[i].file;

		if (!empty && file == prev_file && src >= prev_src_end &&
		    src - prev_src_end <= LAYOUT_GAP) {
			/* Keep the source spacing: this tensor and the previous one are then one
			 * read and one copy. */
			dev = prev_dev + (src - prev_src);
		} else {
			dev = align_up(prev_dev_end, LAYOUT_ALIGN) + src % LAYOUT_ALIGN;
		}
		if (c->opts.alloc_max && !empty && dev + nb > c->opts.alloc_max) {
			seg++;
			dev = src % LAYOUT_ALIGN;
		}
		if (dev + nb < dev)
			return wf_diag_set(diag, WF_EOVERFLOW, "model '%s': layout overflows",
			                   m->name);
		d->seg_of[i] = seg;
		d->dev_off[i] = dev;
		if (dev + nb > d->seg_size[seg])
			d->seg_size[seg] = dev + nb;
		prev_src = src;
		prev_src_end = src + nb;
		prev_dev = dev;
		prev_dev_end = dev + nb;
		prev_file = file;
		empty = false;
	}
	d->n_segs = nt ? seg + 1 : 0;
	d->bytes = 0;
	for (uint32_t s = 0; s < d->n_segs; s++) {
		/* A segment of zero-byte tensors still gets a (tiny) allocation. */
		if (!d->seg_size[s])
			d->seg_size[s] = 1;
		d->bytes += d->seg_size[s];
	}
	return 0;
}

static void fill_pointers(struct model *m, struct devcopy *d)
{
	for (uint32_t i = 0; i < m->model->n_tensors; i++)
		d->tensors[i] = (unsigned char *)d->seg_ptr[d->seg_of[i]] + d->dev_off[i];
}

/* ---- eviction -------------------------------------------------------------------------------- */

/* Takes the model off the device. -EBUSY when acquired (checked under the lock, atomically with
 * the state change). 0 when it was not resident. */
static int evict_model(struct wf_cache *c, struct model *m, bool by_lru, const char *why)
{
	struct devcopy d = {0};
	bool was_pinned;

	pthread_mutex_lock(&c->lock);
	if (!resident(m)) {
		pthread_mutex_unlock(&c->lock);
		return 0;
	}
	if (m->acquired) {
		pthread_mutex_unlock(&c->lock);
		return -EBUSY;
	}
	was_pinned = m->state == WF_RESIDENCY_PINNED_DEVICE;
	m->state = host_level(m);
	d.n_segs = m->n_segs;
	d.seg_ptr = m->seg_ptr;
	d.seg_size = m->seg_size;
	d.tensors = m->tensors;
	d.src_off = m->src_off;
	m->n_segs = 0;
	m->seg_ptr = NULL;
	m->seg_size = NULL;
	m->tensors = NULL;
	m->src_off = NULL;
	m->device_bytes = 0;
	m->over_budget = false;
	m->evictions++;
	c->evictions++;
	if (by_lru)
		c->lru_evictions++;
	if (was_pinned)
		budget_update_locked(c);
	pthread_mutex_unlock(&c->lock);
	devcopy_free(c, &d);
	emit(c, WF_CACHE_EVENT_EVICTED, m, 0, why);
	emit(c, WF_CACHE_EVENT_RESIDENCY, m, 0, NULL);
	return 0;
}

/* The unpinned resident models other than skip, as LRU items (acquired ones busy). Lock held. */
static size_t entries_locked(struct wf_cache *c, const struct model *skip, struct wf_lru_item *e,
                             struct model **who)
{
	size_t n = 0;

	for (size_t i = 0; i < c->n_models; i++) {
		struct model *m = c->models[i];
		if (m == skip || m->state != WF_RESIDENCY_DEVICE)
			continue;
		e[n] = (struct wf_lru_item){.bytes = m->device_bytes,
		                            .last_used = m->lru,
		                            .busy = m->acquired != 0};
		who[n++] = m;
	}
	return n;
}

/* Makes room for need bytes of unpinned weights under the on-demand budget (with extra_pinned
 * bytes about to be pinned). allow_evict: self-managed (LRU victims go); otherwise any needed
 * victim is WF_ENO_SPACE. *ret_over: the model is larger than the whole budget. */
static int make_room(struct wf_cache *c, const struct model *target, uint64_t need,
                     uint64_t extra_pinned, bool allow_evict, bool *ret_over, struct wf_diag *diag)
{
	struct wf_lru_item *e = NULL;
	struct model **who = NULL;
	size_t *victims = NULL;
	int ret = 0;

	e = calloc(c->cap_models + 1, sizeof(*e));
	who = calloc(c->cap_models + 1, sizeof(*who));
	victims = calloc(c->cap_models + 1, sizeof(*victims));
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
		fit = wf_lru_plan(e, n, b.on_demand, used, need, victims, &nv);
		pthread_mutex_unlock(&c->lock);

		*ret_over = fit == WF_LRU_OVERSIZED;
		if (fit == WF_LRU_NO_ROOM || (nv && !allow_evict)) {
			ret = wf_diag_set(
			    diag, WF_ENO_SPACE,
			    "model '%s': %" PRIu64 " bytes do not fit: on-demand budget %" PRIu64
			    ", %" PRIu64 " resident in %zu unpinned models (%zu acquired)%s",
			    target ? target->name : "?", need, b.on_demand, used, n, busy,
			    allow_evict ? "" : "; external mode does not evict");
			goto out;
		}
		bool raced = false;
		for (size_t k = 0; k < nv; k++) {
			ret = evict_model(c, who[victims[k]], true, "lru");
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
			ret = wf_diag_set(diag, WF_ENO_SPACE,
			                  "model '%s': LRU victims keep being acquired",
			                  target ? target->name : "?");
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
	struct wf_lru_item *e = calloc(c->cap_models + 1, sizeof(*e));
	struct model **who = calloc(c->cap_models + 1, sizeof(*who));
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
		if (evict_model(c, who[k], true, "lru: device memory") == 0) {
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

	if (get_mode(c) != WF_CACHE_SELF_MANAGED)
		return;
	(void)make_room(c, NULL, 0, 0, true, &over, &ignore);
}

/* ---- loading --------------------------------------------------------------------------------- */

struct progress_ctx {
	struct wf_cache *c;
	struct model *m;
	uint64_t base;
	uint64_t last_event;
};

static void on_progress(void *vctx, uint64_t done, uint64_t total)
{
	struct progress_ctx *p = vctx;
	uint64_t now = p->base + done;
	(void)total;

	pthread_mutex_lock(&p->c->lock);
	p->m->load_done = now;
	pthread_mutex_unlock(&p->c->lock);
	if (now - p->last_event >= PROGRESS_EVENT || now == p->m->load_total) {
		p->last_event = now;
		emit(p->c, WF_CACHE_EVENT_PROGRESS, p->m, 0, NULL);
	}
}

/* Moves the bytes of every tensor into d's allocations. */
static int transfer(struct wf_cache *c, struct model *m, struct devcopy *d,
                    struct wf_stage_stats *ret_stats, struct wf_diag *diag)
{
	const struct wf_model *mo = m->model;
	struct progress_ctx pc = {.c = c, .m = m};
	struct wf_stage_ctl ctl = {
	    .mode = c->opts.load_mode,
	    .progress = on_progress,
	    .progress_ctx = &pc,
	    .cancel = &c->cancel_flag,
	};
	struct wf_stage_item *items = calloc(mo->n_tensors ? mo->n_tensors : 1, sizeof(*items));
	struct wf_stage_stats st = {0}, total = {0};
	int ret = 0;

	if (!items)
		return -ENOMEM;
	for (uint32_t i = 0; i < mo->n_tensors; i++)
		items[i] = (struct wf_stage_item){d->src_off[i], mo->tensors[i].nbytes,
		                                  d->tensors[i], d->seg_of[i] + 1};
	if (d->from_floor) {
		struct wf_stage_src src = {
		    .fd = wf_shm_region_fd(m->region),
		    .map = wf_shm_region_data(m->region),
		    .map_size = (size_t)wf_shm_region_size(m->region),
		};
		/* Register the floor once per attachment, not per load: pinning a large
		 * mapping costs (cudaHostRegister walks every page). */
		if (ctl.mode != WF_STAGE_MODE_STAGED && !m->registered && !m->register_failed) {
			struct wf_diag rd = {0};
			int r = wf_device_host_register(c->dev, src.map, src.map_size,
			                                WF_DEVICE_REGISTER_READONLY, NULL, &rd);
			if (r == 0)
				m->registered = true;
			else if (ctl.mode == WF_STAGE_MODE_DIRECT)
				ret = wf_diag_set(diag, r, "model '%s': registering the floor: %s",
				                  m->name, wf_diag_str(&rd, r));
			else
				m->register_failed = true;
		}
		if (ret < 0)
			goto out;
		if (!m->registered)
			ctl.mode = WF_STAGE_MODE_STAGED;
		src.map_registered = m->registered;
		/* A small model would measure call overheads, not rates: wait for a real one. */
		if (ctl.mode == WF_STAGE_MODE_AUTO && m->registered &&
		    mo->total_bytes >= WF_CACHE_CALIBRATE_MIN) {
			struct wf_stage_info si;
			wf_stage_info(c->stage, &si);
			if (!si.calibrated) {
				ret = wf_stage_calibrate(c->stage, &src, items, mo->n_tensors,
				                         WF_CACHE_CALIBRATE_MAX, &c->cancel_flag,
				                         NULL, NULL, diag);
				if (ret < 0)
					goto out;
			}
		}
		ret = wf_stage_load(c->stage, &src, items, mo->n_tensors, &ctl, &total, diag);
		if (ret < 0)
			goto out;
	} else {
		double seconds = 0;

		/* One load per file, its tensors in model order. */
		ctl.mode = WF_STAGE_MODE_STAGED;
		for (uint32_t f = 0; f < mo->n_files; f++) {
			const struct wf_model_file *mf = &mo->files[f];
			struct wf_stage_src src = {
			    .fd = -1,
			    .path = mf->path,
			    .expect_size = mf->size,
			    .expect_mtime_ns = mf->mtime_ns,
			};
			size_t k = 0;
			uint64_t bytes = 0;

			for (uint32_t i = 0; i < mo->n_tensors; i++) {
				if (mo->tensors[i].file != f)
					continue;
				items[k] =
				    (struct wf_stage_item){d->src_off[i], mo->tensors[i].nbytes,
				                           d->tensors[i], d->seg_of[i] + 1};
				bytes += mo->tensors[i].nbytes;
				k++;
			}
			if (!k)
				continue;
			ret = wf_stage_load(c->stage, &src, items, k, &ctl, &st, diag);
			if (ret < 0)
				goto out;
			pc.base += bytes;
			seconds += st.seconds;
			total.bytes += st.bytes;
			total.bytes_read += st.bytes_read;
			total.batches += st.batches;
			total.reads += st.reads;
			total.copies += st.copies;
			total.mode = st.mode;
		}
		total.seconds = seconds;
		total.gbps = seconds > 0 ? (double)total.bytes / seconds / 1e9 : 0;
	}
	*ret_stats = total;
out:
	free(items);
	return ret;
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
		if (m->state == WF_RESIDENCY_PINNED_DEVICE)
			pinned += m->device_bytes;
		else if (m->state == WF_RESIDENCY_DEVICE && !m->acquired)
			evictable += m->device_bytes;
	}
	pthread_mutex_unlock(&c->lock);
	uint64_t room = arena > pinned ? arena - pinned : 0;
	if (bytes > room)
		return wf_diag_set(diag, WF_ENO_SPACE,
		                   "model '%s': %" PRIu64 " bytes can never fit: the arena is %" PRIu64
		                   " bytes, %" PRIu64 " of them pinned (nothing was evicted)",
		                   target->name, bytes, arena, pinned);
	if (bytes > (uint64_t)mem_free + evictable)
		return wf_diag_set(diag, WF_ENO_SPACE,
		                   "model '%s': %" PRIu64 " bytes do not fit: the device has %zu bytes "
		                   "free and evictable models hold %" PRIu64 " (nothing was evicted)",
		                   target->name, bytes, mem_free, evictable);
	return 0;
}

/* Loads m (pin: as PINNED_DEVICE; acquire: count a holder in the same step that publishes it).
 * allow_evict: LRU victims may go (self-managed). A resident model is only converted. */
static int load_model(struct wf_cache *c, struct model *m, bool pin, bool acquire, bool allow_evict,
                      struct wf_diag *diag)
{
	struct devcopy d = {0};
	struct wf_stage_stats stats = {0};
	bool over = false;
	int ret;

	if (resident(m)) {
		bool pinned_now = false;
		pthread_mutex_lock(&c->lock);
		if (pin && m->state == WF_RESIDENCY_DEVICE) {
			m->state = WF_RESIDENCY_PINNED_DEVICE;
			m->over_budget = false;
			budget_update_locked(c);
			pinned_now = true;
		}
		if (acquire)
			m->acquired++;
		m->lru = ++c->tick;
		pthread_mutex_unlock(&c->lock);
		if (pinned_now) {
			/* Its bytes now shrink the on-demand budget: the rest may have to go. */
			if (allow_evict)
				enforce_budget(c);
			emit(c, WF_CACHE_EVENT_RESIDENCY, m, 0, NULL);
		}
		return 0;
	}
	set_active(c, m->id);
	if (c->have_shm && !m->region)
		(void)floor_attach(c, m, NULL);
	d.from_floor = m->region != NULL;
	ret = layout(c, m, &d, diag);
	if (ret < 0)
		goto fail;
	ret = check_fits(c, m, d.bytes, diag);
	if (ret < 0)
		goto fail;
	if (pin)
		ret = make_room(c, m, 0, d.bytes, allow_evict, &over, diag);
	else
		ret = make_room(c, m, d.bytes, 0, allow_evict, &over, diag);
	/* A pinned model may exceed the budget (an over-commit, flagged); it only needs the
	 * device to have the memory. */
	if (pin && ret == WF_ENO_SPACE) {
		wf_diag_clear(diag);
		ret = 0;
	}
	if (ret < 0)
		goto fail;
	over = !pin && over;
	for (uint32_t s = 0; s < d.n_segs; s++) {
		for (;;) {
			struct wf_diag ad = {0};
			ret =
			    wf_device_mem_alloc(c->dev, (size_t)d.seg_size[s], &d.seg_ptr[s], &ad);
			if (ret != -ENOMEM || !allow_evict || evict_one_lru(c, m) < 0) {
				if (ret < 0)
					wf_diag_set(diag, ret,
					            "model '%s': device allocation of %" PRIu64
					            " bytes: %s",
					            m->name, d.seg_size[s], wf_diag_str(&ad, ret));
				break;
			}
		}
		if (ret < 0)
			goto fail;
	}
	fill_pointers(m, &d);

	pthread_mutex_lock(&c->lock);
	m->loading = true;
	m->load_done = 0;
	m->load_total = m->model->total_bytes;
	pthread_mutex_unlock(&c->lock);
	emit(c, WF_CACHE_EVENT_PROGRESS, m, 0, NULL);
	if (cancel_requested(c))
		ret = wf_diag_set(diag, WF_ECANCELED, "model '%s': load canceled", m->name);
	else
		ret = transfer(c, m, &d, &stats, diag);
	pthread_mutex_lock(&c->lock);
	m->loading = false;
	wf_stage_info(c->stage, &c->stage_info);
	pthread_mutex_unlock(&c->lock);
	if (ret < 0)
		goto fail;

	pthread_mutex_lock(&c->lock);
	m->state = pin ? WF_RESIDENCY_PINNED_DEVICE : WF_RESIDENCY_DEVICE;
	m->n_segs = d.n_segs;
	m->seg_ptr = d.seg_ptr;
	m->seg_size = d.seg_size;
	m->tensors = d.tensors;
	m->src_off = d.src_off;
	m->from_floor = d.from_floor;
	m->device_bytes = d.bytes;
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
		budget_update_locked(c);
	pthread_mutex_unlock(&c->lock);
	free(d.seg_of);
	free(d.dev_off);
	emit(c, WF_CACHE_EVENT_RESIDENCY, m, 0, over ? "larger than the on-demand budget" : NULL);
	return 0;
fail:
	/* Frees waits for the copies queued before it: nothing is left behind. */
	devcopy_free(c, &d);
	emit(c, WF_CACHE_EVENT_LOAD_FAILED, m, ret, wf_diag_str(diag, ret));
	return ret;
}

static int unpin_model(struct wf_cache *c, struct model *m, struct wf_diag *diag)
{
	pthread_mutex_lock(&c->lock);
	if (m->state != WF_RESIDENCY_PINNED_DEVICE) {
		pthread_mutex_unlock(&c->lock);
		return wf_diag_set(diag, WF_ESTATE, "model '%s' is not pinned (%s)", m->name,
		                   wf_residency_name(m->state));
	}
	m->state = WF_RESIDENCY_DEVICE;
	m->lru = ++c->tick;
	budget_update_locked(c);
	pthread_mutex_unlock(&c->lock);
	/* It now counts against the budget like any other; in self-managed mode the budget is
	 * enforced (the LRU may pick this very model if it is the oldest). */
	enforce_budget(c);
	emit(c, WF_CACHE_EVENT_RESIDENCY, m, 0, NULL);
	return 0;
}

/* ---- commands -------------------------------------------------------------------------------- */

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
	wf_model_digest(k->model, &m->digest);
	wf_digest_hex(&m->digest, hex);
	if (k->name && (!k->name[0] || strlen(k->name) >= sizeof(m->name))) {
		free(m);
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
		free(m);
		return ret;
	}
	if (c->have_shm)
		(void)floor_attach(c, m, NULL);
	k->out_id = m->id;
	emit(c, WF_CACHE_EVENT_RESIDENCY, m, 0, NULL);
	return 0;
}

static int cmd_remove(struct wf_cache *c, struct model *m, struct wf_diag *diag)
{
	int ret = evict_model(c, m, false, "removed");

	if (ret == -EBUSY)
		return busy_error(m, diag);
	floor_detach(c, m);
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
	free(m);
	return 0;
}

static int cmd_set_residency(struct wf_cache *c, struct model *m, enum wf_residency to,
                             struct wf_diag *diag)
{
	bool self = get_mode(c) == WF_CACHE_SELF_MANAGED;
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
			floor_detach(c, m);
			return 0;
		}
		ret = floor_attach(c, m, diag);
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
		if (!find_locked(c, k->ids[i])) {
			pthread_mutex_unlock(&c->lock);
			free(list);
			return wf_diag_set(&k->diag, WF_ENOT_FOUND, "compact: no model %u",
			                   k->ids[i]);
		}
	}
	for (size_t i = 0; i < c->n_models; i++) {
		struct model *m = c->models[i];
		if (m->state != WF_RESIDENCY_DEVICE)
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
		if (evict_model(c, list[i], false, "compact") == -EBUSY && !first)
			first = busy_error(list[i], &k->diag);
	free(list);
	for (size_t i = 0; i < k->n_ids; i++) {
		struct model *m;
		struct wf_diag d = {0};
		int ret;

		pthread_mutex_lock(&c->lock);
		m = find_locked(c, k->ids[i]);
		pthread_mutex_unlock(&c->lock);
		set_active(c, m->id);
		ret = load_model(c, m, false, false, false, &d);
		if (ret < 0) {
			set_error(c, m, ret, &d);
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
	bool self = get_mode(c) == WF_CACHE_SELF_MANAGED;
	int ret;

	switch (k->type) {
	case CMD_ADD:
		return cmd_add(c, k);
	case CMD_COMPACT:
		return cmd_compact(c, k);
	case CMD_RELEASE_ALL:
		return cmd_release_all(c, &k->diag);
	case CMD_SET_BUDGET:
		ret = check_budget(&k->budget, &k->diag);
		if (ret < 0)
			return ret;
		pthread_mutex_lock(&c->lock);
		c->bin = k->budget;
		budget_update_locked(c);
		pthread_mutex_unlock(&c->lock);
		enforce_budget(c);
		return 0;
	default:
		break;
	}
	pthread_mutex_lock(&c->lock);
	m = find_locked(c, k->id);
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
		if (m->state == WF_RESIDENCY_PINNED_DEVICE)
			ret = wf_diag_set(&k->diag, WF_ESTATE,
			                  "model '%s' is pinned: unpin it or set its residency",
			                  m->name);
		else if ((ret = evict_model(c, m, false, "evict")) == -EBUSY)
			ret = busy_error(m, &k->diag);
		break;
	case CMD_UNPIN:
		ret = unpin_model(c, m, &k->diag);
		break;
	case CMD_PREFETCH:
		ret = load_model(c, m, false, false, self, &k->diag);
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
		set_error(c, m, ret, &k->diag);
	return ret;
}

static bool is_load(const struct cmd *k)
{
	return k->type == CMD_PREFETCH || k->type == CMD_ACQUIRE ||
	       (k->type == CMD_SET_RESIDENCY && k->state >= WF_RESIDENCY_DEVICE);
}

/* The io reader is created, used and destroyed on this thread: an io_uring reader registers its
 * ring descriptor with the thread that set it up (io_uring_register_ring_fd), and a registered
 * ring is invisible to every other thread. The stage registers its ring with that reader, so it
 * lives here too. */
static int manager_init(struct wf_cache *c)
{
	int ret = wf_io_reader_create(c->have_io_opts ? &c->io_opts : NULL, &c->io);

	if (ret < 0)
		return wf_diag_set(&c->init_diag, ret, "cache: io reader: %s", wf_strerror(ret));
	ret = wf_stage_create(c->dev, c->io, &c->opts.stage, &c->stage, &c->init_diag);
	if (ret < 0)
		return ret;
	wf_stage_info(c->stage, &c->stage_info);
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
static int post(struct wf_cache *c, struct cmd *k, struct wf_diag *diag)
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

/* ---- create / shutdown ----------------------------------------------------------------------- */

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
	budget_update_locked(c);
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
		floor_detach(c, c->models[i]);
		free(c->models[i]);
	}
	free(c->models);
	free(c->shm_dir);
	pthread_cond_destroy(&c->done);
	pthread_cond_destroy(&c->wake);
	pthread_mutex_destroy(&c->lock);
	free(c);
}

/* ---- public commands ------------------------------------------------------------------------- */

int wf_cache_model_add(struct wf_cache *c, const char *name, const struct wf_model *model,
                       uint32_t *ret_id, struct wf_diag *diag)
{
	struct cmd k = {.type = CMD_ADD, .name = name, .model = model};
	int ret;

	if (!c || !model || !ret_id)
		return wf_diag_set(diag, WF_EINVAL, "model add: NULL argument");
	ret = post(c, &k, diag);
	if (ret == 0)
		*ret_id = k.out_id;
	return ret;
}

int wf_cache_model_remove(struct wf_cache *c, uint32_t id, struct wf_diag *diag)
{
	struct cmd k = {.type = CMD_REMOVE, .id = id};
	return c ? post(c, &k, diag) : WF_EINVAL;
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

int wf_cache_set_residency(struct wf_cache *c, uint32_t id, enum wf_residency state,
                           struct wf_diag *diag)
{
	struct cmd k = {.type = CMD_SET_RESIDENCY, .id = id, .state = state};

	if (!c || (unsigned)state >= WF_RESIDENCY_MAX)
		return wf_diag_set(diag, WF_EINVAL, "set residency: bad argument");
	return post(c, &k, diag);
}

int wf_cache_pin(struct wf_cache *c, uint32_t id, struct wf_diag *diag)
{
	return wf_cache_set_residency(c, id, WF_RESIDENCY_PINNED_DEVICE, diag);
}

int wf_cache_unpin(struct wf_cache *c, uint32_t id, struct wf_diag *diag)
{
	struct cmd k = {.type = CMD_UNPIN, .id = id};
	return c ? post(c, &k, diag) : WF_EINVAL;
}

int wf_cache_evict(struct wf_cache *c, uint32_t id, struct wf_diag *diag)
{
	struct cmd k = {.type = CMD_EVICT, .id = id};
	return c ? post(c, &k, diag) : WF_EINVAL;
}

int wf_cache_prefetch(struct wf_cache *c, uint32_t id, bool wait, struct wf_diag *diag)
{
	struct cmd *k, local = {.type = CMD_PREFETCH, .id = id};

	if (!c)
		return WF_EINVAL;
	if (wait)
		return post(c, &local, diag);
	k = calloc(1, sizeof(*k));
	if (!k)
		return -ENOMEM;
	*k = local;
	k->async = true;
	return post(c, k, diag);
}

int wf_cache_compact(struct wf_cache *c, const uint32_t *ids, size_t n, struct wf_diag *diag)
{
	struct cmd k = {.type = CMD_COMPACT, .ids = ids, .n_ids = n};

	if (!c || (n && !ids))
		return wf_diag_set(diag, WF_EINVAL, "compact: bad argument");
	return post(c, &k, diag);
}

int wf_cache_release_all(struct wf_cache *c, struct wf_diag *diag)
{
	struct cmd k = {.type = CMD_RELEASE_ALL};
	return c ? post(c, &k, diag) : WF_EINVAL;
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
	return post(c, &k, diag);
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

/* ---- requests -------------------------------------------------------------------------------- */

/* Acquires a resident model under the lock. 1 when done, 0 when not resident, <0 error. */
static int try_acquire_locked(struct wf_cache *c, uint32_t id, struct wf_cache_view *view)
{
	struct model *m = find_locked(c, id);

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
	ret = try_acquire_locked(c, id, ret_view);
	self = c->mode == WF_CACHE_SELF_MANAGED;
	pthread_mutex_unlock(&c->lock);
	if (ret < 0)
		return wf_diag_set(diag, ret, "acquire: no model with id %u", id);
	if (ret == 1)
		return 0;
	if (!self)
		return wf_diag_set(diag, WF_ENOT_RESIDENT,
		                   "model %u is not resident (external mode)", id);
	ret = post(c, &k, diag);
	if (ret < 0)
		return ret;
	/* The manager counted our hold when it published the model: only the view is left. */
	if (ret_view) {
		pthread_mutex_lock(&c->lock);
		struct model *m = find_locked(c, id);
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
	m = find_locked(c, id);
	if (!m)
		ret = WF_ENOT_FOUND;
	else if (!m->acquired)
		ret = WF_ESTATE;
	else
		m->acquired--;
	pthread_mutex_unlock(&c->lock);
	return ret;
}

int wf_cache_verify(struct wf_cache *c, uint32_t id, struct wf_diag *diag)
{
	const struct wf_model *mo;
	struct wf_stage_item *items = NULL;
	struct model *m;
	int ret;

	if (!c)
		return WF_EINVAL;
	pthread_mutex_lock(&c->lock);
	ret = try_acquire_locked(c, id, NULL);
	m = find_locked(c, id);
	pthread_mutex_unlock(&c->lock);
	if (ret < 0)
		return wf_diag_set(diag, ret, "verify: no model with id %u", id);
	if (ret == 0)
		return wf_diag_set(diag, WF_ENOT_RESIDENT, "verify: model '%s' is not resident",
		                   m->name);
	/* Held: the device copy, its source offsets and the floor attachment stay as they are. */
	mo = m->model;
	items = calloc(mo->n_tensors ? mo->n_tensors : 1, sizeof(*items));
	if (!items) {
		ret = -ENOMEM;
		goto out;
	}
	for (uint32_t f = 0; f < (m->from_floor ? 1u : mo->n_files); f++) {
		struct wf_stage_src src = {.fd = -1};
		size_t k = 0, bad = 0;
		uint32_t *index = NULL;

		if (m->from_floor) {
			src.fd = wf_shm_region_fd(m->region);
			src.map = wf_shm_region_data(m->region);
			src.map_size = (size_t)wf_shm_region_size(m->region);
		} else {
			src.path = mo->files[f].path;
		}
		index = calloc(mo->n_tensors ? mo->n_tensors : 1, sizeof(*index));
		if (!index) {
			ret = -ENOMEM;
			goto out;
		}
		for (uint32_t i = 0; i < mo->n_tensors; i++) {
			if (!m->from_floor && mo->tensors[i].file != f)
				continue;
			index[k] = i;
			items[k++] = (struct wf_stage_item){m->src_off[i], mo->tensors[i].nbytes,
			                                    m->tensors[i], 0};
		}
		struct wf_diag vd = {0};
		ret = wf_stage_verify(c->dev, &src, items, k, &bad, &vd);
		if (ret < 0) {
			const char *tn =
			    ret == WF_ECHECKSUM && bad < k ? mo->tensors[index[bad]].name : "?";
			wf_diag_set(diag, ret, "verify: model '%s' tensor '%s': %s", m->name, tn,
			            wf_diag_str(&vd, ret));
		}
		free(index);
		if (ret < 0)
			goto out;
	}
out:
	free(items);
	(void)wf_cache_release(c, id);
	return ret;
}

/* ---- status ---------------------------------------------------------------------------------- */

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
