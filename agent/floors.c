#include "agent/floors.h"

#include "agent/budget.h"
#include "base/error.h"
#include "io/reader.h"
#include "shm/fill.h"
#include "shm/layout.h"
#include "shm/region.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

/* Progress events at most this often per model. */
#define PROGRESS_EVENT_NS (250 * 1000 * 1000LL)

struct floor_entry {
	char *name;
	char *path; /* resolved */
	struct wf_model *model;
	struct wf_digest digest;
	char hex[WF_DIGEST_HEX_LEN];
	uint64_t region_bytes;
	enum wf_floor_state state;
	bool pin_host;
	struct wf_shm_region *region; /* the agent's hold: HOST and PINNED_HOST */

	/* materialization */
	bool thread_running;
	pthread_t thread;
	atomic_int cancel;
	_Atomic uint64_t done, total;
	int64_t started_ns, started_unix_ms, last_event_ns;
	uint64_t rate;
	char last_error[256];
	int last_rc; /* the code of the last failure, returned to waiters */

	uint64_t use_stamp; /* LRU clock */
	int64_t last_used_unix_ms, registered_unix_ms;
	struct wf_floors *owner;
};

struct wf_floors {
	const struct wf_agent_config *cfg;
	struct wf_shm_config shm;
	struct wf_io_opts io;
	wf_floor_event_fn on_event;
	void *event_ctx;
	uint64_t host_budget;

	pthread_mutex_t mu;
	pthread_cond_t cv; /* broadcast whenever a materialization ends */
	struct floor_entry **entries;
	size_t n_entries, cap_entries;
	uint64_t use_clock;
	bool closing;

	const char *reader_backend;
	bool o_direct;
	int uring_err;
	uint32_t adopted, removed;
};

static int64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int64_t unix_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
}

const char *wf_floor_state_name(enum wf_floor_state s)
{
	switch (s) {
	case WF_FLOOR_DISK: return "DISK";
	case WF_FLOOR_MATERIALIZING: return "MATERIALIZING";
	case WF_FLOOR_HOST: return "HOST";
	case WF_FLOOR_PINNED_HOST: return "PINNED_HOST";
	case WF_FLOOR_FAILED: return "FAILED";
	}
	return "?";
}

static void emit(struct wf_floors *f, const struct wf_floor_event *ev)
{
	if (f->on_event)
		f->on_event(f->event_ctx, ev);
}

static void emit_state(struct wf_floors *f, const char *name, enum wf_floor_state s,
		       const char *message)
{
	struct wf_floor_event ev = {
		.kind = WF_FLOOR_EV_STATE, .model = name, .state = s, .message = message};
	emit(f, &ev);
}

static struct floor_entry *find_locked(struct wf_floors *f, const char *name)
{
	for (size_t i = 0; i < f->n_entries; i++)
		if (strcmp(f->entries[i]->name, name) == 0)
			return f->entries[i];
	return NULL;
}

static void entry_free(struct floor_entry *e)
{
	if (!e)
		return;
	free(e->name);
	free(e->path);
	wf_model_close(e->model);
	free(e);
}

/* Opens the inventory and derives digest and region size. */
static int entry_inventory(struct floor_entry *e, const struct wf_shm_config *shm,
			   struct wf_diag *diag)
{
	struct wf_model *m = NULL;
	int rc = wf_model_open(e->path, &m, diag);
	if (rc < 0)
		return rc;
	/* Every file the reader opened (shard siblings, index, config), not just e->path. */
	rc = wf_agent_config_check_model(e->owner->cfg, m, diag);
	if (rc < 0) {
		wf_model_close(m);
		return rc;
	}
	struct wf_shm_layout lay;
	rc = wf_shm_layout_compute(m, shm->spare_bytes, &lay, diag);
	if (rc < 0) {
		wf_model_close(m);
		return rc;
	}
	wf_model_close(e->model);
	e->model = m;
	wf_model_digest(m, &e->digest);
	wf_digest_hex(&e->digest, e->hex);
	e->region_bytes = lay.total_size;
	return 0;
}

/* True when a file of the inventory no longer has the size and mtime it had: the digest is stale
 * and the model must be inventoried again before it is materialized. */
static bool inventory_stale(const struct floor_entry *e)
{
	for (uint32_t i = 0; i < e->model->n_files; i++) {
		struct stat st;
		const struct wf_model_file *mf = &e->model->files[i];
		if (stat(mf->path, &st) != 0)
			return true;
		int64_t mt = (int64_t)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec;
		if ((uint64_t)st.st_size != mf->size || mt != mf->mtime_ns)
			return true;
	}
	return false;
}

static uint64_t default_budget(const char *dir)
{
	long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
	uint64_t half = pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz / 2 : 1ull << 30;
	struct statvfs vs;
	if (statvfs(dir, &vs) == 0) {
		uint64_t fs = (uint64_t)vs.f_blocks * vs.f_frsize;
		if (fs && fs < half)
			return fs;
	}
	return half;
}

static int mkdir_p(const char *dir, mode_t mode)
{
	char buf[4096];
	if (snprintf(buf, sizeof buf, "%s", dir) >= (int)sizeof buf)
		return -ENAMETOOLONG;
	for (char *p = buf + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = '\0';
		if (mkdir(buf, mode) < 0 && errno != EEXIST)
			return -errno;
		*p = '/';
	}
	if (mkdir(buf, mode) < 0 && errno != EEXIST)
		return -errno;
	return 0;
}

static int register_locked(struct wf_floors *f, const char *name, const char *path, bool pin,
			   bool *ret_new, struct wf_diag *diag);

int wf_floors_create(const struct wf_floors_opts *opts, struct wf_floors **ret, struct wf_diag *diag)
{
	const struct wf_agent_config *cfg = opts->cfg;
	struct wf_floors *f = calloc(1, sizeof(*f));
	if (!f)
		return -ENOMEM;
	f->cfg = cfg;
	f->on_event = opts->on_event;
	f->event_ctx = opts->event_ctx;
	f->shm.dir = cfg->floor_dir;
	if (cfg->gid != (gid_t)-1) {
		f->shm.set_gid = true;
		f->shm.gid = cfg->gid;
	}
	f->io.backend = strcmp(cfg->io_backend, "pread") == 0   ? WF_IO_BACKEND_PREAD
			: strcmp(cfg->io_backend, "uring") == 0 ? WF_IO_BACKEND_URING
								: WF_IO_BACKEND_AUTO;
	f->io.queue_depth = cfg->io_queue_depth;
	f->io.chunk_size = cfg->io_chunk;
	pthread_mutex_init(&f->mu, NULL);
	pthread_cond_init(&f->cv, NULL);

	int rc = mkdir_p(cfg->floor_dir, 0750);
	if (rc < 0) {
		rc = wf_diag_set(diag, rc, "floor directory %s: %s", cfg->floor_dir, wf_strerror(rc));
		goto err;
	}
	if (f->shm.set_gid && chown(cfg->floor_dir, (uid_t)-1, f->shm.gid) < 0) {
		rc = wf_diag_set(diag, -errno, "floor directory %s: chown to group %u: %s",
				 cfg->floor_dir, (unsigned)f->shm.gid, strerror(errno));
		goto err;
	}
	/* Refuse a directory someone else made (or can write) before trusting anything in it. */
	rc = wf_shm_dir_check(&f->shm, diag);
	if (rc < 0)
		goto err;
	f->host_budget = cfg->host_budget ? cfg->host_budget : default_budget(cfg->floor_dir);

	/* Probe the reader once so status and the log can say which backend runs and why. */
	struct wf_io_reader *probe = NULL;
	rc = wf_io_reader_create(&f->io, &probe);
	if (rc < 0) {
		rc = wf_diag_set(diag, rc, "io reader (%s): %s", cfg->io_backend, wf_strerror(rc));
		goto err;
	}
	struct wf_io_reader_info info;
	wf_io_reader_info(probe, &info);
	f->reader_backend = info.backend_name;
	f->o_direct = info.direct;
	f->uring_err = info.uring_err;
	wf_io_reader_destroy(probe);

	for (size_t i = 0; i < cfg->n_models; i++) {
		rc = register_locked(f, cfg->models[i].name, cfg->models[i].path,
				     cfg->models[i].pin_host, NULL, diag);
		if (rc < 0)
			goto err;
	}
	*ret = f;
	return 0;
err:
	wf_floors_destroy(f);
	return rc;
}

static int register_locked(struct wf_floors *f, const char *name, const char *path, bool pin,
			   bool *ret_new, struct wf_diag *diag)
{
	if (ret_new)
		*ret_new = false;
	char *resolved = NULL;
	int rc = wf_agent_config_check_path(f->cfg, path, &resolved, diag);
	if (rc < 0)
		return rc;
	struct floor_entry *old = find_locked(f, name);
	if (old) {
		rc = strcmp(old->path, resolved) == 0
			     ? 0
			     : wf_diag_set(diag, WF_ESTATE,
					   "model '%s' is already registered with %s", name, old->path);
		if (rc == 0 && pin)
			old->pin_host = true;
		free(resolved);
		return rc;
	}
	if (f->n_entries >= WF_AGENT_MAX_MODELS) {
		free(resolved);
		return wf_diag_set(diag, WF_ELIMIT, "more than %d models", WF_AGENT_MAX_MODELS);
	}
	struct floor_entry *e = calloc(1, sizeof(*e));
	if (!e || !(e->name = strdup(name))) {
		free(resolved);
		entry_free(e);
		return -ENOMEM;
	}
	e->path = resolved;
	e->owner = f;
	e->pin_host = pin;
	e->state = WF_FLOOR_DISK;
	e->registered_unix_ms = unix_ms();
	rc = entry_inventory(e, &f->shm, diag);
	if (rc < 0) {
		wf_diag_set(diag, rc, "model '%s' (%s): %s", name, path, wf_strerror(rc));
		entry_free(e);
		return rc;
	}
	if (f->n_entries == f->cap_entries) {
		size_t cap = f->cap_entries ? f->cap_entries * 2 : 16;
		struct floor_entry **v = realloc(f->entries, cap * sizeof(*v));
		if (!v) {
			entry_free(e);
			return -ENOMEM;
		}
		f->entries = v;
		f->cap_entries = cap;
	}
	f->entries[f->n_entries++] = e;
	if (ret_new)
		*ret_new = true;
	return 0;
}

int wf_floors_register(struct wf_floors *f, const char *name, const char *path, bool pin_host,
		       struct wf_diag *diag)
{
	if (!name || !*name || strlen(name) > 128 || !path || !*path)
		return wf_diag_set(diag, WF_EINVAL, "register: a model needs a name (1-128 bytes) "
						    "and a path");
	for (const char *p = name; *p; p++) {
		char c = *p;
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      c == '-' || c == '_' || c == '.' || c == ':' || c == '/'))
			return wf_diag_set(diag, WF_EINVAL,
					   "register: model name '%s' must be of [A-Za-z0-9._:/-]",
					   name);
	}
	/* Inventory reading happens under the lock: registration is rare and reads headers only. */
	bool is_new = false;
	pthread_mutex_lock(&f->mu);
	int rc = register_locked(f, name, path, pin_host, &is_new, diag);
	pthread_mutex_unlock(&f->mu);
	if (rc == 0 && is_new)
		emit_state(f, name, WF_FLOOR_DISK, "registered");
	return rc;
}

/* ---- materialization ---------------------------------------------------------------------- */

struct fill_ctx {
	struct floor_entry *e;
	struct wf_floors *f;
};

static void on_progress(void *ctx, uint64_t done, uint64_t total)
{
	struct fill_ctx *fc = ctx;
	struct floor_entry *e = fc->e;
	atomic_store(&e->done, done);
	atomic_store(&e->total, total);
	int64_t t = now_ns();
	if (t - e->last_event_ns < PROGRESS_EVENT_NS && done != total)
		return;
	e->last_event_ns = t;
	double secs = (double)(t - e->started_ns) / 1e9;
	e->rate = secs > 0 ? (uint64_t)((double)done / secs) : 0;
	struct wf_floor_event ev = {.kind = WF_FLOOR_EV_PROGRESS,
				    .model = e->name,
				    .state = WF_FLOOR_MATERIALIZING,
				    .bytes_done = done,
				    .bytes_total = total,
				    .rate_bytes_per_s = e->rate};
	emit(fc->f, &ev);
}

/* Fault injection for tests (documented in docs/man/wf-agent.md): hold a materialization, its
 * files opened and checked, for WF_AGENT_FAULT_FILL_DELAY_MS so that a test can change a model
 * file under it deterministically. */
static void fault_delay(void *ctx, uint64_t total)
{
	struct fill_ctx *fc = ctx;
	atomic_store(&fc->e->total, total);
	const char *delay = getenv("WF_AGENT_FAULT_FILL_DELAY_MS");
	if (!delay || !*delay)
		return;
	long ms = strtol(delay, NULL, 10);
	for (long t = 0; t < ms && !atomic_load(&fc->e->cancel); t += 10)
		usleep(10000);
}

static int fill_files(void *ctx, const struct wf_shm_fill *job, struct wf_diag *diag)
{
	struct fill_ctx *fc = ctx;
	struct wf_shm_fill_io fi = {
		.io = fc->f->io,
		.progress = on_progress,
		.progress_ctx = fc,
		.cancel = (const volatile int *)&fc->e->cancel,
		.before_copy = fault_delay,
		.before_copy_ctx = fc,
	};
	return wf_shm_fill_from_files(&fi, job, diag);
}

static void *materialize_thread(void *arg)
{
	struct floor_entry *e = arg;
	struct wf_floors *f = e->owner;
	struct fill_ctx fc = {.e = e, .f = f};
	struct wf_diag diag = {{0}};
	struct wf_shm_region *region = NULL;

	/* Announced from here, not by the requester: a subscriber then always sees MATERIALIZING
	 * before the HOST or FAILED this thread announces. */
	emit_state(f, e->name, WF_FLOOR_MATERIALIZING, NULL);
	int rc = wf_shm_region_attach(&f->shm, &e->digest, e->model,
				      WF_SHM_ATTACH_AGENT | WF_SHM_ATTACH_STREAM |
					      WF_SHM_ATTACH_OWNED,
				      fill_files,
				      &fc, &region, &diag);
	enum wf_floor_state st;
	pthread_mutex_lock(&f->mu);
	e->thread_running = false; /* joined by whoever reaps it (ensure/release/destroy) */
	if (rc == 0 && atomic_load(&e->cancel)) {
		/* Released while finishing: drop the hold we just took. */
		wf_shm_region_detach(region);
		region = NULL;
		rc = WF_ECANCELED;
	}
	if (rc == 0) {
		e->region = region;
		e->state = e->pin_host ? WF_FLOOR_PINNED_HOST : WF_FLOOR_HOST;
		e->last_error[0] = '\0';
		double secs = (double)(now_ns() - e->started_ns) / 1e9;
		uint64_t done = atomic_load(&e->total);
		atomic_store(&e->done, done);
		if (wf_shm_region_materialized(region) && secs > 0)
			e->rate = (uint64_t)((double)done / secs);
	} else if (rc == WF_ECANCELED) {
		e->state = WF_FLOOR_DISK;
	} else {
		e->state = WF_FLOOR_FAILED;
		e->last_rc = rc;
		snprintf(e->last_error, sizeof e->last_error, "%s", wf_diag_str(&diag, rc));
	}
	st = e->state;
	char errbuf[256];
	snprintf(errbuf, sizeof errbuf, "%s", e->last_error);
	pthread_cond_broadcast(&f->cv);
	pthread_mutex_unlock(&f->mu);

	if (rc < 0 && rc != WF_ECANCELED) {
		struct wf_floor_event ev = {.kind = WF_FLOOR_EV_ERROR,
					    .model = e->name,
					    .state = st,
					    .code = rc,
					    .message = errbuf};
		emit(f, &ev);
	}
	emit_state(f, e->name, st, rc == 0 ? "ready" : rc == WF_ECANCELED ? "cancelled" : errbuf);
	return NULL;
}

/* Reaps a finished materialization thread. Called with the lock held; the thread does not take
 * the lock after clearing thread_running, so joining here cannot deadlock. */
static void reap_locked(struct floor_entry *e)
{
	if (e->thread && !e->thread_running) {
		pthread_join(e->thread, NULL);
		e->thread = 0;
	}
}

static uint64_t used_locked(struct wf_floors *f)
{
	uint64_t used = 0;
	for (size_t i = 0; i < f->n_entries; i++) {
		enum wf_floor_state s = f->entries[i]->state;
		if (s == WF_FLOOR_HOST || s == WF_FLOOR_PINNED_HOST || s == WF_FLOOR_MATERIALIZING)
			used += f->entries[i]->region_bytes;
	}
	return used;
}

static void drop_hold_locked(struct wf_floors *f, struct floor_entry *e)
{
	(void)f;
	wf_shm_region_detach(e->region);
	e->region = NULL;
	e->state = WF_FLOOR_DISK;
}

/* Makes room for `need` bytes, evicting LRU floors that only the agent holds. */
static int make_room_locked(struct wf_floors *f, struct floor_entry *want, uint64_t need,
			    char ***ret_evicted, size_t *ret_n_evicted, struct wf_diag *diag)
{
	size_t n = f->n_entries;
	struct wf_budget_floor *bf = calloc(n ? n : 1, sizeof(*bf));
	size_t *victims = calloc(n ? n : 1, sizeof(*victims));
	int rc = 0;
	*ret_evicted = NULL;
	*ret_n_evicted = 0;
	if (!bf || !victims) {
		rc = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < n; i++) {
		struct floor_entry *e = f->entries[i];
		bool held = e->state == WF_FLOOR_HOST || e->state == WF_FLOOR_PINNED_HOST ||
			    e->state == WF_FLOOR_MATERIALIZING;
		bf[i].bytes = held ? e->region_bytes : 0;
		bf[i].last_used = e->use_stamp;
		bf[i].pinned = e->state == WF_FLOOR_PINNED_HOST || e == want;
		bf[i].busy = !held || e->state == WF_FLOOR_MATERIALIZING;
		if (e->state == WF_FLOOR_HOST && e->region) {
			bool sole = false;
			int r = wf_shm_region_sole_holder(e->region, &sole);
			bf[i].busy = r < 0 || !sole;
		}
	}
	size_t nv = 0;
	uint64_t used = used_locked(f);
	rc = wf_budget_plan(bf, n, f->host_budget, used, need, victims, &nv);
	if (rc < 0) {
		rc = wf_diag_set(diag, WF_ENO_SPACE,
				 "host budget: model '%s' needs %llu bytes; budget %llu, %llu in use "
				 "by floors that are pinned or held by other processes",
				 want->name, (unsigned long long)need,
				 (unsigned long long)f->host_budget, (unsigned long long)used);
		goto out;
	}
	if (nv) {
		*ret_evicted = calloc(nv, sizeof(char *));
		if (!*ret_evicted) {
			rc = -ENOMEM;
			goto out;
		}
	}
	for (size_t k = 0; k < nv; k++) {
		struct floor_entry *v = f->entries[victims[k]];
		drop_hold_locked(f, v);
		(*ret_evicted)[k] = strdup(v->name);
		*ret_n_evicted = k + 1;
	}
out:
	free(bf);
	free(victims);
	return rc;
}

static void emit_evicted(struct wf_floors *f, char **names, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		if (names[i])
			emit_state(f, names[i], WF_FLOOR_DISK, "evicted for host budget");
		free(names[i]);
	}
	free(names);
}

static int start_locked(struct wf_floors *f, struct floor_entry *e, char ***ev, size_t *nev,
			struct wf_diag *diag)
{
	reap_locked(e);
	if (e->state == WF_FLOOR_HOST || e->state == WF_FLOOR_PINNED_HOST ||
	    e->state == WF_FLOOR_MATERIALIZING)
		return 0;
	if (f->closing)
		return wf_diag_set(diag, WF_EUNAVAILABLE, "agent is shutting down");
	if (inventory_stale(e)) {
		int rc = entry_inventory(e, &f->shm, diag);
		if (rc < 0) {
			e->state = WF_FLOOR_FAILED;
			e->last_rc = rc;
			snprintf(e->last_error, sizeof e->last_error, "%s", wf_diag_str(diag, rc));
			return rc;
		}
	}
	int rc = make_room_locked(f, e, e->region_bytes, ev, nev, diag);
	if (rc < 0)
		return rc;
	e->state = WF_FLOOR_MATERIALIZING;
	atomic_store(&e->cancel, 0);
	atomic_store(&e->done, 0);
	atomic_store(&e->total, 0);
	e->rate = 0;
	e->started_ns = now_ns();
	e->started_unix_ms = unix_ms();
	e->last_event_ns = 0;
	e->thread_running = true;
	rc = pthread_create(&e->thread, NULL, materialize_thread, e);
	if (rc != 0) {
		e->thread_running = false;
		e->thread = 0;
		e->state = WF_FLOOR_FAILED;
		e->last_rc = -rc;
		return wf_diag_set(diag, -rc, "cannot start a materialization thread: %s",
				   strerror(rc));
	}
	return 0;
}

static void touch_locked(struct wf_floors *f, struct floor_entry *e)
{
	e->use_stamp = ++f->use_clock;
	e->last_used_unix_ms = unix_ms();
}

int wf_floors_ensure(struct wf_floors *f, const char *name, bool wait, uint32_t timeout_ms,
		     bool (*closing)(const void *), const void *closing_arg, struct wf_diag *diag)
{
	char **evicted = NULL;
	size_t n_evicted = 0;
	pthread_mutex_lock(&f->mu);
	struct floor_entry *e = find_locked(f, name);
	if (!e) {
		pthread_mutex_unlock(&f->mu);
		return wf_diag_set(diag, WF_ENOT_FOUND, "no model named '%s'", name);
	}
	touch_locked(f, e);
	int rc = start_locked(f, e, &evicted, &n_evicted, diag);
	pthread_mutex_unlock(&f->mu);
	emit_evicted(f, evicted, n_evicted);
	if (rc < 0)
		return rc;
	if (!wait)
		return 0;

	int64_t deadline = timeout_ms ? now_ns() + (int64_t)timeout_ms * 1000000LL : 0;
	pthread_mutex_lock(&f->mu);
	while (e->state == WF_FLOOR_MATERIALIZING) {
		if ((closing && closing(closing_arg)) || f->closing) {
			rc = wf_diag_set(diag, WF_EUNAVAILABLE, "agent is shutting down");
			break;
		}
		if (deadline && now_ns() >= deadline) {
			rc = wf_diag_set(diag, WF_ETIMEOUT,
					 "model '%s' still materializing after %u ms (%llu of %llu "
					 "bytes)",
					 name, timeout_ms, (unsigned long long)atomic_load(&e->done),
					 (unsigned long long)atomic_load(&e->total));
			break;
		}
		/* Short waits so the server's closing flag is noticed promptly. */
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += 100 * 1000 * 1000;
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		pthread_cond_timedwait(&f->cv, &f->mu, &ts);
	}
	if (rc == 0 && e->state == WF_FLOOR_FAILED)
		rc = wf_diag_set(diag, e->last_rc < 0 ? e->last_rc : WF_EINTERNAL, "model '%s': %s",
				 name, e->last_error);
	else if (rc == 0 && e->state == WF_FLOOR_DISK)
		rc = wf_diag_set(diag, WF_ECANCELED, "model '%s': materialization cancelled", name);
	pthread_mutex_unlock(&f->mu);
	return rc;
}

/* Cancels and joins a running materialization. Drops the lock while joining (the thread takes
 * it to finish). */
static void cancel_join_locked(struct wf_floors *f, struct floor_entry *e)
{
	if (!e->thread)
		return;
	atomic_store(&e->cancel, 1);
	pthread_t t = e->thread;
	e->thread = 0;
	pthread_mutex_unlock(&f->mu);
	pthread_join(t, NULL);
	pthread_mutex_lock(&f->mu);
}

int wf_floors_release(struct wf_floors *f, const char *name, struct wf_diag *diag)
{
	pthread_mutex_lock(&f->mu);
	struct floor_entry *e = find_locked(f, name);
	if (!e) {
		pthread_mutex_unlock(&f->mu);
		return wf_diag_set(diag, WF_ENOT_FOUND, "no model named '%s'", name);
	}
	cancel_join_locked(f, e);
	e->pin_host = false;
	bool had = e->region != NULL;
	if (had)
		drop_hold_locked(f, e);
	if (e->state != WF_FLOOR_FAILED)
		e->state = WF_FLOOR_DISK;
	pthread_mutex_unlock(&f->mu);
	emit_state(f, name, WF_FLOOR_DISK, had ? "released" : NULL);
	return 0;
}

int wf_floors_pin(struct wf_floors *f, const char *name, bool pin, struct wf_diag *diag)
{
	char **evicted = NULL;
	size_t n_evicted = 0;
	int rc = 0;
	pthread_mutex_lock(&f->mu);
	struct floor_entry *e = find_locked(f, name);
	if (!e) {
		pthread_mutex_unlock(&f->mu);
		return wf_diag_set(diag, WF_ENOT_FOUND, "no model named '%s'", name);
	}
	e->pin_host = pin;
	enum wf_floor_state before = e->state;
	if (pin && (e->state == WF_FLOOR_DISK || e->state == WF_FLOOR_FAILED)) {
		touch_locked(f, e);
		rc = start_locked(f, e, &evicted, &n_evicted, diag);
	} else if (e->state == WF_FLOOR_HOST || e->state == WF_FLOOR_PINNED_HOST) {
		e->state = pin ? WF_FLOOR_PINNED_HOST : WF_FLOOR_HOST;
	}
	enum wf_floor_state after = e->state;
	pthread_mutex_unlock(&f->mu);
	emit_evicted(f, evicted, n_evicted);
	if (rc == 0 && after != before)
		emit_state(f, name, after, pin ? "pinned" : "unpinned");
	return rc;
}

/* ---- adoption ----------------------------------------------------------------------------- */

int wf_floors_adopt(struct wf_floors *f, uint32_t *ret_adopted, uint32_t *ret_removed,
		    struct wf_diag *diag)
{
	struct wf_shm_scan_entry *ents = NULL;
	size_t n = 0;
	int rc = wf_shm_dir_scan(&f->shm, &ents, &n, diag);
	if (rc < 0)
		return rc;
	uint32_t adopted = 0, removed = 0;
	for (size_t i = 0; i < n; i++) {
		struct wf_shm_scan_entry *se = &ents[i];
		struct floor_entry *e = NULL;
		pthread_mutex_lock(&f->mu);
		for (size_t k = 0; k < f->n_entries; k++) {
			if (f->entries[k]->digest.hi == se->digest.hi &&
			    f->entries[k]->digest.lo == se->digest.lo)
				e = f->entries[k];
		}
		if (se->cls == WF_SHM_SCAN_READY && e && !e->region) {
			struct wf_diag d = {{0}};
			struct wf_shm_region *r = NULL;
			/* MUST_EXIST: validates against the model and repairs, never creates. */
			int a = wf_shm_region_attach(&f->shm, &e->digest, e->model,
						     WF_SHM_ATTACH_MUST_EXIST |
							     WF_SHM_ATTACH_VERIFY,
						     fill_files,
						     &(struct fill_ctx){.e = e, .f = f}, &r, &d);
			if (a == 0) {
				e->region = r;
				e->state = e->pin_host ? WF_FLOOR_PINNED_HOST : WF_FLOOR_HOST;
				touch_locked(f, e);
				adopted++;
			}
			pthread_mutex_unlock(&f->mu);
			if (a == 0)
				emit_state(f, e->name, e->state, "adopted");
			continue;
		}
		pthread_mutex_unlock(&f->mu);
		bool removable = se->cls == WF_SHM_SCAN_BROKEN || se->cls == WF_SHM_SCAN_ORPHAN ||
				 (se->cls == WF_SHM_SCAN_READY && !e && !se->held);
		if (removable && wf_shm_region_remove(&f->shm, &se->digest, 0, NULL) == 0)
			removed++;
	}
	free(ents);
	f->adopted = adopted;
	f->removed = removed;
	if (ret_adopted)
		*ret_adopted = adopted;
	if (ret_removed)
		*ret_removed = removed;
	return 0;
}

void wf_floors_preload(struct wf_floors *f)
{
	for (size_t i = 0; i < f->cfg->n_models; i++) {
		const struct wf_agent_model_cfg *mc = &f->cfg->models[i];
		if (!mc->preload && !mc->pin_host)
			continue;
		struct wf_diag d = {{0}};
		int rc = wf_floors_ensure(f, mc->name, false, 0, NULL, NULL, &d);
		if (rc < 0) {
			struct wf_floor_event ev = {.kind = WF_FLOOR_EV_ERROR,
						    .model = mc->name,
						    .state = WF_FLOOR_FAILED,
						    .code = rc,
						    .message = wf_diag_str(&d, rc)};
			emit(f, &ev);
		}
	}
}

/* ---- status ------------------------------------------------------------------------------- */

static int snapshot_locked(struct wf_floors *f, struct floor_entry *e, struct wf_floor_snapshot *s)
{
	memset(s, 0, sizeof(*s));
	snprintf(s->name, sizeof s->name, "%s", e->name);
	memcpy(s->digest_hex, e->hex, sizeof s->digest_hex);
	s->format = e->model->format;
	snprintf(s->arch, sizeof s->arch, "%s", e->model->hp.arch);
	s->files = calloc(e->model->n_files ? e->model->n_files : 1, sizeof(*s->files));
	if (!s->files)
		return -ENOMEM;
	for (uint32_t i = 0; i < e->model->n_files; i++) {
		s->files[i].path = strdup(e->model->files[i].path);
		s->files[i].size = e->model->files[i].size;
		s->n_files = i + 1;
		if (!s->files[i].path)
			return -ENOMEM;
	}
	s->total_bytes = e->model->total_bytes;
	s->dense_bytes = e->model->dense_bytes;
	s->expert_bytes = e->model->expert_bytes;
	s->region_bytes = e->region_bytes;
	s->tensor_count = e->model->n_tensors;
	s->state = e->state;
	s->pin_host = e->pin_host;
	s->bytes_done = atomic_load(&e->done);
	s->bytes_total = atomic_load(&e->total);
	s->rate_bytes_per_s = e->rate;
	s->started_unix_ms = e->started_unix_ms;
	snprintf(s->last_error, sizeof s->last_error, "%s", e->last_error);
	s->last_used_unix_ms = e->last_used_unix_ms;
	s->registered_unix_ms = e->registered_unix_ms;
	if (e->state != WF_FLOOR_MATERIALIZING) {
		size_t nh = 0;
		if (wf_shm_holder_pids(&f->shm, &e->digest, s->holder_pids, WF_FLOOR_MAX_PIDS, &nh,
				       NULL) == 0) {
			s->holder_count = (uint32_t)nh;
			s->n_holder_pids = nh < WF_FLOOR_MAX_PIDS ? (uint32_t)nh : WF_FLOOR_MAX_PIDS;
		}
	}
	return 0;
}

void wf_floor_snapshot_fini(struct wf_floor_snapshot *s)
{
	if (!s)
		return;
	for (uint32_t i = 0; i < s->n_files; i++)
		free(s->files[i].path);
	free(s->files);
	s->files = NULL;
	s->n_files = 0;
}

int wf_floors_snapshot(struct wf_floors *f, const char *name, struct wf_floor_snapshot *ret,
		       struct wf_diag *diag)
{
	pthread_mutex_lock(&f->mu);
	struct floor_entry *e = find_locked(f, name);
	int rc = e ? snapshot_locked(f, e, ret)
		   : wf_diag_set(diag, WF_ENOT_FOUND, "no model named '%s'", name);
	pthread_mutex_unlock(&f->mu);
	if (rc < 0 && e)
		wf_floor_snapshot_fini(ret);
	return rc;
}

static int cmp_snap(const void *a, const void *b)
{
	return strcmp(((const struct wf_floor_snapshot *)a)->name,
		      ((const struct wf_floor_snapshot *)b)->name);
}

int wf_floors_list(struct wf_floors *f, struct wf_floor_snapshot **ret, size_t *ret_n)
{
	pthread_mutex_lock(&f->mu);
	size_t n = f->n_entries;
	struct wf_floor_snapshot *v = calloc(n ? n : 1, sizeof(*v));
	int rc = v ? 0 : -ENOMEM;
	for (size_t i = 0; rc == 0 && i < n; i++)
		rc = snapshot_locked(f, f->entries[i], &v[i]);
	pthread_mutex_unlock(&f->mu);
	if (rc < 0) {
		for (size_t i = 0; v && i < n; i++)
			wf_floor_snapshot_fini(&v[i]);
		free(v);
		return rc;
	}
	qsort(v, n, sizeof(*v), cmp_snap);
	*ret = v;
	*ret_n = n;
	return 0;
}

void wf_floors_status(struct wf_floors *f, struct wf_floors_status *s)
{
	memset(s, 0, sizeof(*s));
	pthread_mutex_lock(&f->mu);
	s->host_budget = f->host_budget;
	s->host_used = used_locked(f);
	s->reader_backend = f->reader_backend;
	s->o_direct = f->o_direct;
	s->uring_err = f->uring_err;
	s->adopted = f->adopted;
	s->removed = f->removed;
	s->n_models = (uint32_t)f->n_entries;
	for (size_t i = 0; i < f->n_entries; i++) {
		switch (f->entries[i]->state) {
		case WF_FLOOR_DISK: s->n_disk++; break;
		case WF_FLOOR_MATERIALIZING: s->n_materializing++; break;
		case WF_FLOOR_HOST: s->n_host++; break;
		case WF_FLOOR_PINNED_HOST: s->n_pinned++; break;
		case WF_FLOOR_FAILED: s->n_failed++; break;
		}
	}
	pthread_mutex_unlock(&f->mu);
}

void wf_floors_destroy(struct wf_floors *f)
{
	if (!f)
		return;
	pthread_mutex_lock(&f->mu);
	f->closing = true;
	for (size_t i = 0; i < f->n_entries; i++)
		cancel_join_locked(f, f->entries[i]);
	for (size_t i = 0; i < f->n_entries; i++) {
		/* Leave READY floors in place for the next agent: close without the release. */
		wf_shm_region_abandon(f->entries[i]->region);
		f->entries[i]->region = NULL;
		entry_free(f->entries[i]);
	}
	pthread_mutex_unlock(&f->mu);
	free(f->entries);
	pthread_cond_destroy(&f->cv);
	pthread_mutex_destroy(&f->mu);
	free(f);
}
