#include "agent/floors.h"

#include "agent/state.h"
#include "base/error.h"
#include "base/lru.h"
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
#define PROGRESS_EVENT_NS           (250 * 1000 * 1000LL)
#define JANITOR_INTERVAL_MS_DEFAULT 2000u

/* An inventory (the model's files, tensors, digest and region size) never changes once built;
 * a re-inventory builds a new one. Entries and materialization jobs share it by reference count,
 * so a job reads it outside the registry lock while the entry may already point at a newer
 * one. */
struct floor_inv {
	atomic_int refs;
	struct wf_model *model;
	struct wf_digest digest;
	char hex[WF_DIGEST_HEX_LEN];
	uint64_t region_bytes;
	uint64_t spare_bytes; /* of a region made from it (the config's spare for this model) */
};

struct floor_entry;

/* One materialization. Its thread is detached: nobody joins it. It owns itself and frees itself
 * at the end; the entry points at the job that is current (e->job) and forgets a job it cancels,
 * so a late finish of a cancelled job can be recognised and discarded. */
struct fill_job {
	struct floor_entry *e;
	struct floor_inv *inv;
	atomic_int cancel;
	_Atomic uint64_t done, total, rate;
	int64_t started_ns, last_event_ns;
};

struct floor_entry {
	char *name;
	char *path; /* resolved */
	bool api;   /* registered through RegisterModel (persisted), not by the config */
	struct floor_inv *inv;
	enum wf_floor_state state;
	bool pin_host;
	bool stale; /* a file changed since the floor was materialized (told once per change) */
	/* The files' identities the floor's bytes were last reconciled with by a reload
	 * (agent/reload.h), n_files of them; NULL: the inventory's, as materialized. */
	struct wf_reload_ident *ident;
	struct wf_shm_region *region; /* the agent's hold: HOST and PINNED_HOST */
	struct fill_job *job;         /* the current materialization, or NULL */

	/* the last materialization, for status */
	uint64_t done, total, rate;
	int64_t started_unix_ms;
	char last_error[256];
	int last_rc; /* the code of the last failure, returned to waiters */

	uint64_t use_stamp; /* LRU clock */
	int64_t last_used_unix_ms, registered_unix_ms;

	/* The keep marker in the floor directory follows (e->region || e->job); keep_mu
	 * serializes the file operations that make it so (never under the registry lock). */
	pthread_mutex_t keep_mu;
	bool keep_set;
	struct wf_digest keep_digest;
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
	unsigned n_jobs; /* job threads alive */

	/* what the janitor saw last: regions the agent does not hold that others do (counted in
	 * host_used), and among them those of no registered model (orphans) */
	uint64_t others_bytes, orphan_bytes;
	uint32_t n_orphans, reaped;
	struct wf_floor_orphan orphans[WF_FLOORS_MAX_ORPHANS];

	/* the janitor thread */
	pthread_t janitor;
	bool janitor_started;
	pthread_cond_t janitor_cv;
	uint32_t janitor_interval_ms;
	int64_t janitor_last_ns; /* now_ns() after its last pass; 0 before the first */

	/* persistence: snapshots are numbered under mu and written under persist_mu, newest wins */
	char *state_file;
	pthread_mutex_t persist_mu;
	uint64_t persist_seq, persist_written;

	pthread_mutex_t reload_mu; /* one reload at a time (agent/reload.h) */

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

static void emit_error(struct wf_floors *f, const char *name, enum wf_floor_state s, int code,
                       const char *message)
{
	struct wf_floor_event ev = {
	    .kind = WF_FLOOR_EV_ERROR, .model = name, .state = s, .code = code, .message = message};
	emit(f, &ev);
}

static struct floor_entry *find_locked(struct wf_floors *f, const char *name)
{
	for (size_t i = 0; i < f->n_entries; i++)
		if (strcmp(f->entries[i]->name, name) == 0)
			return f->entries[i];
	return NULL;
}

static bool held_state(enum wf_floor_state s)
{
	return s == WF_FLOOR_HOST || s == WF_FLOOR_PINNED_HOST || s == WF_FLOOR_MATERIALIZING;
}

/* ---- inventories -------------------------------------------------------------------------- */

static struct floor_inv *inv_ref(struct floor_inv *inv)
{
	atomic_fetch_add(&inv->refs, 1);
	return inv;
}

static void inv_unref(struct floor_inv *inv)
{
	if (inv && atomic_fetch_sub(&inv->refs, 1) == 1) {
		wf_model_close(inv->model);
		free(inv);
	}
}

/* Opens the model's files (outside any lock) and derives digest, spare area and region size. */
static int inv_open(const struct wf_agent_config *cfg, const char *path, struct floor_inv **ret,
                    struct wf_diag *diag)
{
	struct floor_inv *inv = calloc(1, sizeof(*inv));
	if (!inv)
		return -ENOMEM;
	atomic_init(&inv->refs, 1);
	int rc = wf_model_open(path, &inv->model, diag);
	if (rc < 0)
		goto err;
	/* Every file the reader opened (shard siblings, index, config), not just path. */
	rc = wf_agent_config_check_model(cfg, inv->model, diag);
	if (rc < 0)
		goto err;
	struct wf_shm_layout lay;
	inv->spare_bytes = wf_agent_config_spare(cfg, inv->model->total_bytes);
	rc = wf_shm_layout_compute(inv->model, inv->spare_bytes, &lay, diag);
	if (rc < 0)
		goto err;
	wf_model_digest(inv->model, &inv->digest);
	wf_digest_hex(&inv->digest, inv->hex);
	inv->region_bytes = lay.total_size;
	*ret = inv;
	return 0;
err:
	inv_unref(inv);
	return rc;
}

/* The floor directory's shm config with the spare area a region made from inv gets. */
static struct wf_shm_config shm_for(const struct wf_floors *f, const struct floor_inv *inv)
{
	struct wf_shm_config c = f->shm;
	c.spare_bytes = inv->spare_bytes;
	return c;
}

/* True when a file of the inventory no longer has the size and times it had. Stats files: never
 * under the registry lock. */
static bool inv_stale(const struct floor_inv *inv)
{
	for (uint32_t i = 0; i < inv->model->n_files; i++) {
		struct stat st;
		const struct wf_model_file *mf = &inv->model->files[i];
		if (stat(mf->path, &st) != 0)
			return true;
		int64_t mt = (int64_t)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec;
		if ((uint64_t)st.st_size != mf->size || mt != mf->mtime_ns)
			return true;
	}
	return false;
}

/* A copy of a reload's baseline (n identities), or NULL for none or no memory (the janitor
 * then compares against the inventory: a stale report too many, never one too few). */
static struct wf_reload_ident *ident_copy(const struct wf_reload_ident *id, uint32_t n)
{
	struct wf_reload_ident *c = id ? malloc(n * sizeof(*c)) : NULL;
	if (c)
		memcpy(c, id, n * sizeof(*c));
	return c;
}

/* inv_stale() against a reload's baseline: a file moved since the last reload. */
static bool ident_stale(const struct floor_inv *inv, const struct wf_reload_ident *id)
{
	for (uint32_t i = 0; i < inv->model->n_files; i++)
		if (wf_reload_ident_moved(inv->model->files[i].path, &id[i]))
			return true;
	return false;
}

static void entry_free(struct floor_entry *e)
{
	if (!e)
		return;
	free(e->name);
	free(e->path);
	free(e->ident);
	inv_unref(e->inv);
	pthread_mutex_destroy(&e->keep_mu);
	free(e);
}

/* ---- the keep marker ---------------------------------------------------------------------- */

/* Makes the keep marker in the directory agree with what the entry holds now. Loops because the
 * entry may change while the marker is being written; keep_mu orders concurrent syncs. */
static void keep_sync(struct wf_floors *f, struct floor_entry *e)
{
	pthread_mutex_lock(&e->keep_mu);
	for (int round = 0; round < 8; round++) {
		pthread_mutex_lock(&f->mu);
		bool want = e->region || e->job;
		struct wf_digest d = e->job ? e->job->inv->digest : e->inv->digest;
		pthread_mutex_unlock(&f->mu);
		bool same = e->keep_set && e->keep_digest.hi == d.hi && e->keep_digest.lo == d.lo;
		if (want == e->keep_set && (!want || same))
			break;
		struct wf_diag diag = {{0}};
		if (e->keep_set && (!want || !same)) {
			int rc = wf_shm_region_set_keep(&f->shm, &e->keep_digest, false, &diag);
			if (rc < 0 && rc != -ENOENT) {
				/* -EBUSY: a peer sits on the guard; the janitor tries again. */
				if (rc != -EBUSY)
					emit_error(f, e->name, e->state, rc,
					           wf_diag_str(&diag, rc));
				break;
			}
			e->keep_set = false;
		}
		if (want) {
			int rc = wf_shm_region_set_keep(&f->shm, &d, true, &diag);
			if (rc < 0) {
				if (rc != -EBUSY)
					emit_error(f, e->name, e->state, rc,
					           wf_diag_str(&diag, rc));
				break;
			}
			e->keep_set = true;
			e->keep_digest = d;
		}
	}
	pthread_mutex_unlock(&e->keep_mu);
}

/* Drops a hold the registry no longer references: the attachment goes (abandon: no guard wait,
 * so a peer sitting on the guard cannot stall us), then the region is removed if nobody else
 * holds it and no marker keeps it; if that cannot be decided now, the janitor does it later. */
static void hold_drop(struct wf_floors *f, struct wf_shm_region *region)
{
	if (!region)
		return;
	struct wf_digest d;
	wf_shm_region_digest(region, &d);
	wf_shm_region_abandon(region);
	(void)wf_shm_region_reap(&f->shm, &d, NULL);
}

/* ---- persistence -------------------------------------------------------------------------- */

/* Builds the state document under the lock (pure memory) and numbers it. */
static char *persist_snapshot_locked(struct wf_floors *f, uint64_t *ret_seq)
{
	if (!f->state_file)
		return NULL;
	struct wf_agent_state st = {0};
	st.models = calloc(f->n_entries ? f->n_entries : 1, sizeof(*st.models));
	if (!st.models)
		return NULL;
	for (size_t i = 0; i < f->n_entries; i++) {
		struct floor_entry *e = f->entries[i];
		st.models[st.n_models++] = (struct wf_agent_state_model){
		    .name = e->name, .path = e->path, .api = e->api, .pin_host = e->pin_host};
	}
	char *json = NULL;
	if (wf_agent_state_format(&st, &json) < 0)
		json = NULL;
	free(st.models); /* the strings are the entries' */
	*ret_seq = ++f->persist_seq;
	return json;
}

static void persist_write(struct wf_floors *f, char *json, uint64_t seq)
{
	if (!json)
		return;
	pthread_mutex_lock(&f->persist_mu);
	if (seq > f->persist_written) {
		struct wf_diag d = {{0}};
		int rc = wf_agent_state_write(f->state_file, json, &d);
		if (rc < 0)
			emit_error(f, "", WF_FLOOR_DISK, rc, wf_diag_str(&d, rc));
		else
			f->persist_written = seq;
	}
	pthread_mutex_unlock(&f->persist_mu);
	free(json);
}

static void persist(struct wf_floors *f)
{
	uint64_t seq = 0;
	pthread_mutex_lock(&f->mu);
	char *json = persist_snapshot_locked(f, &seq);
	pthread_mutex_unlock(&f->mu);
	persist_write(f, json, seq);
}

/* ---- creation and registration ------------------------------------------------------------ */

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

static int check_name(const char *name, struct wf_diag *diag)
{
	if (!name || !*name || strlen(name) > 128)
		return wf_diag_set(diag, WF_EINVAL,
		                   "register: a model needs a name of 1-128 bytes");
	for (const char *p = name; *p; p++) {
		char c = *p;
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      c == '-' || c == '_' || c == '.' || c == ':' || c == '/'))
			return wf_diag_set(diag, WF_EINVAL,
			                   "register: model name '%s' must be of [A-Za-z0-9._:/-]",
			                   name);
	}
	return 0;
}

/* Registers name → path. The files are checked and read here, without the registry lock; the
 * lock is taken only to insert. *ret_new says whether an entry was added. */
static int do_register(struct wf_floors *f, const char *name, const char *path, bool pin, bool api,
                       bool *ret_new, struct wf_diag *diag)
{
	*ret_new = false;
	char *resolved = NULL;
	struct floor_inv *inv = NULL;
	struct floor_entry *e = NULL;
	int rc = check_name(name, diag);
	if (rc < 0)
		return rc;
	rc = wf_agent_config_check_path(f->cfg, path, &resolved, diag);
	if (rc < 0)
		return rc;

	/* Idempotent re-registration must not read the files again. */
	pthread_mutex_lock(&f->mu);
	struct floor_entry *old = find_locked(f, name);
	if (old) {
		rc = strcmp(old->path, resolved) == 0
		         ? 0
		         : wf_diag_set(diag, WF_ESTATE, "model '%s' is already registered with %s",
		                       name, old->path);
		pthread_mutex_unlock(&f->mu);
		free(resolved);
		return rc;
	}
	pthread_mutex_unlock(&f->mu);

	rc = inv_open(f->cfg, resolved, &inv, diag);
	if (rc < 0) {
		wf_diag_set(diag, rc, "model '%s' (%s): %s", name, path, wf_diag_str(diag, rc));
		free(resolved);
		return rc;
	}
	e = calloc(1, sizeof(*e));
	if (!e || !(e->name = strdup(name))) {
		free(e);
		inv_unref(inv);
		free(resolved);
		return -ENOMEM;
	}
	pthread_mutex_init(&e->keep_mu, NULL);
	e->path = resolved;
	e->inv = inv;
	e->owner = f;
	e->api = api;
	e->pin_host = pin;
	e->state = WF_FLOOR_DISK;
	e->registered_unix_ms = unix_ms();

	pthread_mutex_lock(&f->mu);
	old = find_locked(f, name); /* someone else registered it meanwhile */
	if (old) {
		rc = strcmp(old->path, resolved) == 0
		         ? 0
		         : wf_diag_set(diag, WF_ESTATE, "model '%s' is already registered with %s",
		                       name, old->path);
		goto out_unlock;
	}
	if (f->n_entries >= WF_AGENT_MAX_MODELS) {
		rc = wf_diag_set(diag, WF_ELIMIT, "more than %d models", WF_AGENT_MAX_MODELS);
		goto out_unlock;
	}
	if (f->n_entries == f->cap_entries) {
		size_t cap = f->cap_entries ? f->cap_entries * 2 : 16;
		struct floor_entry **v = realloc(f->entries, cap * sizeof(*v));
		if (!v) {
			rc = -ENOMEM;
			goto out_unlock;
		}
		f->entries = v;
		f->cap_entries = cap;
	}
	f->entries[f->n_entries++] = e;
	e = NULL;
	*ret_new = true;
out_unlock:
	pthread_mutex_unlock(&f->mu);
	entry_free(e);
	return rc;
}

static int restore_state(struct wf_floors *f, struct wf_diag *diag)
{
	struct wf_agent_state st;
	int rc = wf_agent_state_load(f->state_file, &st, diag);
	if (rc < 0)
		return rc;
	for (size_t i = 0; i < st.n_models; i++) {
		struct wf_agent_state_model *sm = &st.models[i];
		struct wf_diag d = {{0}};
		bool is_new = false;
		if (sm->api) {
			rc = do_register(f, sm->name, sm->path, sm->pin_host, true, &is_new, &d);
			if (rc < 0) {
				/* The file went away or changed beyond reading: say so, keep
				 * serving everything else. The entry leaves the state file at its
				 * next write. */
				char msg[512];
				snprintf(msg, sizeof msg, "registration from %s not restored: %s",
				         f->state_file, wf_diag_str(&d, rc));
				emit_error(f, sm->name, WF_FLOOR_FAILED, rc, msg);
			}
			continue;
		}
		/* A config model's pin: applies while the config still names the same file. */
		pthread_mutex_lock(&f->mu);
		struct floor_entry *e = find_locked(f, sm->name);
		if (e && !e->api && strcmp(e->path, sm->path) == 0)
			e->pin_host = sm->pin_host;
		pthread_mutex_unlock(&f->mu);
	}
	wf_agent_state_fini(&st);
	return 0;
}

int wf_floors_create(const struct wf_floors_opts *opts, struct wf_floors **ret,
                     struct wf_diag *diag)
{
	const struct wf_agent_config *cfg = opts->cfg;
	struct wf_floors *f = calloc(1, sizeof(*f));
	if (!f)
		return -ENOMEM;
	f->cfg = cfg;
	f->on_event = opts->on_event;
	f->event_ctx = opts->event_ctx;
	f->janitor_interval_ms =
	    opts->janitor_interval_ms ? opts->janitor_interval_ms : JANITOR_INTERVAL_MS_DEFAULT;
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
	pthread_mutex_init(&f->persist_mu, NULL);
	pthread_mutex_init(&f->reload_mu, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&f->janitor_cv, &ca);
	pthread_condattr_destroy(&ca);
	int rc = 0;
	if (opts->state_file && !(f->state_file = strdup(opts->state_file))) {
		rc = -ENOMEM;
		goto err;
	}

	/* Creates the directory with safe modes, or refuses one that another user could have
	 * planted regions in. */
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
		bool is_new;
		rc = do_register(f, cfg->models[i].name, cfg->models[i].path,
		                 cfg->models[i].pin_host, false, &is_new, diag);
		if (rc < 0)
			goto err;
	}
	if (f->state_file && (rc = restore_state(f, diag)) < 0)
		goto err;
	*ret = f;
	return 0;
err:
	wf_floors_destroy(f);
	return rc;
}

int wf_floors_register(struct wf_floors *f, const char *name, const char *path, bool pin_host,
                       struct wf_diag *diag)
{
	bool is_new = false;
	int rc = do_register(f, name, path, pin_host, true, &is_new, diag);
	if (rc == 0 && is_new) {
		persist(f);
		emit_state(f, name, WF_FLOOR_DISK, "registered");
	}
	return rc;
}

/* ---- materialization ---------------------------------------------------------------------- */

struct fill_ctx {
	struct fill_job *job;
	struct wf_floors *f;
};

static void on_progress(void *ctx, uint64_t done, uint64_t total)
{
	struct fill_ctx *fc = ctx;
	struct fill_job *job = fc->job;
	atomic_store(&job->done, done);
	atomic_store(&job->total, total);
	int64_t t = now_ns();
	if (t - job->last_event_ns < PROGRESS_EVENT_NS && done != total)
		return;
	job->last_event_ns = t;
	double secs = (double)(t - job->started_ns) / 1e9;
	uint64_t rate = secs > 0 ? (uint64_t)((double)done / secs) : 0;
	atomic_store(&job->rate, rate);
	struct wf_floor_event ev = {.kind = WF_FLOOR_EV_PROGRESS,
	                            .model = job->e->name,
	                            .state = WF_FLOOR_MATERIALIZING,
	                            .bytes_done = done,
	                            .bytes_total = total,
	                            .rate_bytes_per_s = rate};
	emit(fc->f, &ev);
}

/* Fault injection for tests (documented in docs/man/wf-agent.md): hold a materialization, its
 * files opened and checked, for WF_AGENT_FAULT_FILL_DELAY_MS so that a test can change a model
 * file under it deterministically. */
static void fault_delay(void *ctx, uint64_t total)
{
	struct fill_ctx *fc = ctx;
	atomic_store(&fc->job->total, total);
	const char *delay = getenv("WF_AGENT_FAULT_FILL_DELAY_MS");
	if (!delay || !*delay)
		return;
	long ms = strtol(delay, NULL, 10);
	for (long t = 0; t < ms && !atomic_load(&fc->job->cancel); t += 10)
		usleep(10000);
}

static int fill_files(void *ctx, const struct wf_shm_fill *job, struct wf_diag *diag)
{
	struct fill_ctx *fc = ctx;
	struct wf_shm_fill_io fi = {
	    .io = fc->f->io,
	    .progress = on_progress,
	    .progress_ctx = fc,
	    .cancel = (const volatile int *)&fc->job->cancel,
	    .before_copy = fault_delay,
	    .before_copy_ctx = fc,
	};
	return wf_shm_fill_from_files(&fi, job, diag);
}

/* Re-inventories a model whose files changed since it was registered, outside the lock. The new
 * inventory replaces the entry's only if the job is still current. */
static int job_refresh_inventory(struct wf_floors *f, struct fill_job *job, struct wf_diag *diag)
{
	struct floor_entry *e = job->e;
	if (!inv_stale(job->inv))
		return 0;
	struct floor_inv *inv = NULL;
	int rc = inv_open(f->cfg, e->path, &inv, diag);
	if (rc < 0)
		return rc;
	struct floor_inv *old_entry_inv = NULL, *old_job_inv;
	pthread_mutex_lock(&f->mu); /* others read job->inv (and e->inv) under the lock */
	if (e->job == job) {
		old_entry_inv = e->inv;
		e->inv = inv_ref(inv);
	}
	old_job_inv = job->inv;
	job->inv = inv;
	pthread_mutex_unlock(&f->mu);
	inv_unref(old_entry_inv);
	inv_unref(old_job_inv);
	return 0;
}

static void *job_thread(void *arg)
{
	struct fill_job *job = arg;
	struct floor_entry *e = job->e;
	struct wf_floors *f = e->owner;
	struct fill_ctx fc = {.job = job, .f = f};
	struct wf_diag diag = {{0}};
	struct wf_shm_region *region = NULL;

	/* Announced from here, not by the requester: a subscriber then always sees MATERIALIZING
	 * before the HOST or FAILED this thread announces. */
	emit_state(f, e->name, WF_FLOOR_MATERIALIZING, NULL);
	int rc = job_refresh_inventory(f, job, &diag);
	if (rc == 0) {
		/* The marker first: a worker that attaches and detaches while we fill must not
		 * take the region with it. */
		keep_sync(f, e);
		struct wf_shm_config shm = shm_for(f, job->inv);
		rc = wf_shm_region_attach(&shm, &job->inv->digest, job->inv->model,
		                          WF_SHM_ATTACH_AGENT | WF_SHM_ATTACH_STREAM |
		                              WF_SHM_ATTACH_OWNED,
		                          fill_files, &fc, &region, &diag);
	}

	pthread_mutex_lock(&f->mu);
	bool current = e->job == job && !atomic_load(&job->cancel);
	enum wf_floor_state st = e->state;
	char errbuf[256] = "";
	bool materialized = false;
	if (current) {
		e->job = NULL;
		e->done = atomic_load(&job->done);
		e->total = atomic_load(&job->total);
		e->rate = atomic_load(&job->rate);
		if (rc == 0) {
			e->region = region;
			region = NULL;
			e->state = e->pin_host ? WF_FLOOR_PINNED_HOST : WF_FLOOR_HOST;
			e->stale = false;
			free(e->ident); /* a new floor: its bytes are the inventory's files' */
			e->ident = NULL;
			e->last_error[0] = '\0';
			double secs = (double)(now_ns() - job->started_ns) / 1e9;
			e->done = e->total;
			materialized = wf_shm_region_materialized(e->region);
			if (materialized && secs > 0)
				e->rate = (uint64_t)((double)e->total / secs);
		} else {
			e->state = WF_FLOOR_FAILED;
			e->last_rc = rc;
			snprintf(e->last_error, sizeof e->last_error, "%s", wf_diag_str(&diag, rc));
		}
		st = e->state;
		snprintf(errbuf, sizeof errbuf, "%s", e->last_error);
	}
	pthread_mutex_unlock(&f->mu);

	/* A cancelled job's region (it finished just as it was released) is dropped, and the
	 * marker brought in line, outside the lock. */
	hold_drop(f, region);
	keep_sync(f, e);
	if (current) {
		if (rc < 0)
			emit_error(f, e->name, st, rc, errbuf);
		struct wf_floor_event ev = {
		    .kind = WF_FLOOR_EV_STATE,
		    .model = e->name,
		    .state = st,
		    .message = rc == 0 ? "ready" : errbuf,
		    .bytes_done = atomic_load(&job->done),
		    .bytes_total = atomic_load(&job->total),
		    .seconds = (double)(now_ns() - job->started_ns) / 1e9,
		    .materialized = rc == 0 && materialized,
		};
		emit(f, &ev);
	}

	inv_unref(job->inv);
	free(job);
	pthread_mutex_lock(&f->mu);
	f->n_jobs--;
	pthread_cond_broadcast(&f->cv);
	pthread_mutex_unlock(&f->mu);
	return NULL;
}

/* Starts a job for e (state becomes MATERIALIZING). Called with the lock held; creating a
 * detached thread does no I/O. */
static int job_start_locked(struct wf_floors *f, struct floor_entry *e, struct wf_diag *diag)
{
	struct fill_job *job = calloc(1, sizeof(*job));
	if (!job)
		return -ENOMEM;
	job->e = e;
	job->inv = inv_ref(e->inv);
	job->started_ns = now_ns();
	pthread_attr_t attr;
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	pthread_t t;
	e->job = job;
	f->n_jobs++;
	int rc = pthread_create(&t, &attr, job_thread, job);
	pthread_attr_destroy(&attr);
	if (rc != 0) {
		e->job = NULL;
		f->n_jobs--;
		inv_unref(job->inv);
		free(job);
		e->state = WF_FLOOR_FAILED;
		e->last_rc = -rc;
		snprintf(e->last_error, sizeof e->last_error,
		         "cannot start a materialization thread: %s", strerror(rc));
		return wf_diag_set(diag, -rc, "%s", e->last_error);
	}
	e->state = WF_FLOOR_MATERIALIZING;
	e->started_unix_ms = unix_ms();
	e->done = e->total = e->rate = 0;
	return 0;
}

static uint64_t used_locked(struct wf_floors *f)
{
	uint64_t used = f->others_bytes;
	for (size_t i = 0; i < f->n_entries; i++)
		if (held_state(f->entries[i]->state))
			used += f->entries[i]->inv->region_bytes;
	return used;
}

/* Counts the holders of a digest's region other than the agent: the eviction test. Reads
 * /proc/locks: never under the registry lock. -1 if unknown. */
static int others_holding(struct wf_floors *f, const struct wf_digest *d)
{
	pid_t pids[WF_FLOOR_MAX_PIDS];
	size_t n = 0;
	if (wf_shm_holder_pids(&f->shm, d, pids, WF_FLOOR_MAX_PIDS, &n, NULL) < 0)
		return -1;
	pid_t me = getpid();
	int others = 0;
	for (size_t i = 0; i < n && i < WF_FLOOR_MAX_PIDS; i++)
		if (pids[i] != me)
			others++;
	if (n > WF_FLOOR_MAX_PIDS)
		others += (int)(n - WF_FLOOR_MAX_PIDS);
	return others;
}

/* A floor evicted to make room: its name for the event, and the hold to drop outside the lock. */
struct evicted {
	char *name;
	struct wf_shm_region *region;
};

/* Ensures e has a floor or a job, evicting LRU floors that only the agent holds. The holder
 * counts are read before the lock is taken; the plan and its application happen under it in one
 * go. Returns 0 with the evicted floors in *ret_ev (*ret_nev of them; finish_evictions() drops
 * their holds and announces them) and *ret_started when this call started the job. */
static int start_or_join(struct wf_floors *f, struct floor_entry *e, bool pin,
                         struct evicted **ret_ev, size_t *ret_nev, bool *ret_started,
                         struct wf_diag *diag)
{
	*ret_ev = NULL;
	*ret_nev = 0;
	*ret_started = false;

	/* Phase 1: which floors could go, and are they held by others? (No lock while reading
	 * /proc/locks.) */
	pthread_mutex_lock(&f->mu);
	size_t n = f->n_entries;
	struct wf_digest *cand = calloc(n ? n : 1, sizeof(*cand));
	int *others = calloc(n ? n : 1, sizeof(*others));
	struct wf_lru_item *bf = calloc(n ? n : 1, sizeof(*bf));
	size_t *victims = calloc(n ? n : 1, sizeof(*victims));
	struct floor_entry **snap = calloc(n ? n : 1, sizeof(*snap));
	int rc = 0;
	if (!cand || !others || !bf || !victims || !snap) {
		pthread_mutex_unlock(&f->mu);
		rc = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < n; i++) {
		snap[i] = f->entries[i];
		cand[i] = f->entries[i]->inv->digest;
		others[i] =
		    f->entries[i]->state == WF_FLOOR_HOST ? 0 : -2; /* -2: not a candidate */
	}
	pthread_mutex_unlock(&f->mu);
	for (size_t i = 0; i < n; i++)
		if (others[i] == 0)
			others[i] = others_holding(f, &cand[i]);

	/* Phase 2: plan and apply under the lock. */
	pthread_mutex_lock(&f->mu);
	if (e->region || e->job) {
		/* present, or someone started it meanwhile */
		if (pin) {
			e->pin_host = true;
			if (e->state == WF_FLOOR_HOST)
				e->state = WF_FLOOR_PINNED_HOST;
		}
		pthread_mutex_unlock(&f->mu);
		goto out;
	}
	if (f->closing) {
		pthread_mutex_unlock(&f->mu);
		rc = wf_diag_set(diag, WF_EUNAVAILABLE, "agent is shutting down");
		goto out;
	}
	for (size_t i = 0; i < n; i++) {
		struct floor_entry *x = snap[i];
		bool held = held_state(x->state);
		bf[i].bytes = held ? x->inv->region_bytes : 0;
		bf[i].last_used = x->use_stamp;
		bf[i].pinned = x->state == WF_FLOOR_PINNED_HOST || x == e;
		/* Evictable: HOST, the agent's own hold, seen unheld by others just now. */
		bf[i].busy = !(x->state == WF_FLOOR_HOST && x->region && others[i] == 0 &&
		               x->inv->digest.hi == cand[i].hi && x->inv->digest.lo == cand[i].lo);
	}
	size_t nv = 0;
	uint64_t used = used_locked(f);
	uint64_t need = e->inv->region_bytes;
	/* The host budget is never exceeded: an oversized floor is refused like one with no room.
	 */
	rc = wf_lru_plan(bf, n, f->host_budget, used, need, victims, &nv) == WF_LRU_FITS
	         ? 0
	         : WF_ENO_SPACE;
	if (rc < 0) {
		pthread_mutex_unlock(&f->mu);
		rc = wf_diag_set(
		    diag, WF_ENO_SPACE,
		    "host budget: model '%s' needs %llu bytes; budget %llu, %llu in use "
		    "by floors that are pinned, held by other processes or materializing",
		    e->name, (unsigned long long)need, (unsigned long long)f->host_budget,
		    (unsigned long long)used);
		goto out;
	}
	struct evicted *ev = nv ? calloc(nv, sizeof(*ev)) : NULL;
	if (nv && !ev) {
		pthread_mutex_unlock(&f->mu);
		rc = -ENOMEM;
		goto out;
	}
	rc = job_start_locked(f, e, diag);
	if (rc < 0) {
		pthread_mutex_unlock(&f->mu);
		free(ev);
		goto out;
	}
	if (pin)
		e->pin_host = true;
	for (size_t k = 0; k < nv; k++) {
		struct floor_entry *v = snap[victims[k]];
		ev[k].name = strdup(v->name);
		ev[k].region = v->region;
		v->region = NULL;
		v->state = WF_FLOOR_DISK;
	}
	pthread_mutex_unlock(&f->mu);
	*ret_ev = ev;
	*ret_nev = nv;
	*ret_started = true;
out:
	free(cand);
	free(others);
	free(bf);
	free(victims);
	free(snap);
	return rc;
}

static void finish_evictions(struct wf_floors *f, struct evicted *ev, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		pthread_mutex_lock(&f->mu);
		struct floor_entry *v = ev[i].name ? find_locked(f, ev[i].name) : NULL;
		pthread_mutex_unlock(&f->mu);
		if (v)
			keep_sync(f, v);
		hold_drop(f, ev[i].region);
		if (ev[i].name)
			emit_state(f, ev[i].name, WF_FLOOR_DISK, "evicted for host budget");
		free(ev[i].name);
	}
	free(ev);
}

static void touch_locked(struct wf_floors *f, struct floor_entry *e)
{
	e->use_stamp = ++f->use_clock;
	e->last_used_unix_ms = unix_ms();
}

/* Starts (or finds started) the model's materialization. pin also pins it, but only if the start
 * succeeds. */
static int ensure_started(struct wf_floors *f, const char *name, bool pin,
                          struct floor_entry **ret_e, struct wf_diag *diag)
{
	pthread_mutex_lock(&f->mu);
	struct floor_entry *e = find_locked(f, name);
	if (!e) {
		pthread_mutex_unlock(&f->mu);
		return wf_diag_set(diag, WF_ENOT_FOUND, "no model named '%s'", name);
	}
	touch_locked(f, e);
	bool present = e->region || e->job;
	if (present && pin && !e->pin_host) {
		e->pin_host = true;
		if (e->state == WF_FLOOR_HOST)
			e->state = WF_FLOOR_PINNED_HOST;
	}
	pthread_mutex_unlock(&f->mu);
	*ret_e = e;
	if (present)
		return 0;
	struct evicted *ev = NULL;
	size_t nev = 0;
	bool started = false;
	int rc = start_or_join(f, e, pin, &ev, &nev, &started, diag);
	finish_evictions(f, ev, nev);
	return rc;
}

int wf_floors_ensure(struct wf_floors *f, const char *name, bool wait, uint32_t timeout_ms,
                     bool (*closing)(const void *), const void *closing_arg, struct wf_diag *diag)
{
	struct floor_entry *e = NULL;
	int rc = ensure_started(f, name, false, &e, diag);
	if (rc < 0 || !wait)
		return rc;

	int64_t deadline = timeout_ms ? now_ns() + (int64_t)timeout_ms * 1000000LL : 0;
	pthread_mutex_lock(&f->mu);
	while (e->job) {
		if ((closing && closing(closing_arg)) || f->closing) {
			rc = wf_diag_set(diag, WF_EUNAVAILABLE, "agent is shutting down");
			break;
		}
		if (deadline && now_ns() >= deadline) {
			rc = wf_diag_set(diag, WF_ETIMEOUT,
			                 "model '%s' still materializing after %u ms (%llu of %llu "
			                 "bytes)",
			                 name, timeout_ms,
			                 (unsigned long long)atomic_load(&e->job->done),
			                 (unsigned long long)atomic_load(&e->job->total));
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
	else if (rc == 0 && !e->region)
		rc = wf_diag_set(diag, WF_ECANCELED, "model '%s': materialization cancelled", name);
	pthread_mutex_unlock(&f->mu);
	return rc;
}

int wf_floors_release(struct wf_floors *f, const char *name, struct wf_diag *diag)
{
	pthread_mutex_lock(&f->mu);
	struct floor_entry *e = find_locked(f, name);
	if (!e) {
		pthread_mutex_unlock(&f->mu);
		return wf_diag_set(diag, WF_ENOT_FOUND, "no model named '%s'", name);
	}
	/* A job in progress is told to stop and forgotten: it finishes on its own, and its result
	 * is discarded. Nothing here waits for it. */
	if (e->job) {
		atomic_store(&e->job->cancel, 1);
		e->job = NULL;
	}
	bool was_pinned = e->pin_host;
	e->pin_host = false;
	struct wf_shm_region *region = e->region;
	e->region = NULL;
	if (e->state != WF_FLOOR_FAILED)
		e->state = WF_FLOOR_DISK;
	uint64_t seq = 0;
	char *json = was_pinned ? persist_snapshot_locked(f, &seq) : NULL;
	pthread_cond_broadcast(&f->cv);
	pthread_mutex_unlock(&f->mu);

	persist_write(f, json, seq);
	keep_sync(f, e);
	hold_drop(f, region);
	emit_state(f, name, WF_FLOOR_DISK, region ? "released" : NULL);
	return 0;
}

int wf_floors_pin(struct wf_floors *f, const char *name, bool pin, struct wf_diag *diag)
{
	pthread_mutex_lock(&f->mu);
	struct floor_entry *e = find_locked(f, name);
	if (!e) {
		pthread_mutex_unlock(&f->mu);
		return wf_diag_set(diag, WF_ENOT_FOUND, "no model named '%s'", name);
	}
	enum wf_floor_state before = e->state;
	bool pinned_before = e->pin_host;
	if (!pin) {
		e->pin_host = false;
		if (e->state == WF_FLOOR_PINNED_HOST)
			e->state = WF_FLOOR_HOST;
	}
	pthread_mutex_unlock(&f->mu);

	int rc = 0;
	if (pin) {
		struct floor_entry *x = NULL;
		rc = ensure_started(f, name, true, &x, diag);
		if (rc < 0)
			return rc; /* nothing changed: the pin is set only once the start succeeded
			            */
	}
	pthread_mutex_lock(&f->mu);
	enum wf_floor_state after = e->state;
	bool changed = e->pin_host != pinned_before;
	pthread_mutex_unlock(&f->mu);
	if (changed)
		persist(f);
	if (after != before || changed)
		emit_state(f, name, after, pin ? "pinned" : "unpinned");
	return rc;
}

/* ---- publishing --------------------------------------------------------------------------- */

/* The floor a publish goes to: the digest of the region the agent holds for the model, read
 * under the lock (the handle cannot go while it is held). */
static int publish_target(struct wf_floors *f, const char *name, struct wf_digest *ret_digest,
                          struct wf_diag *diag)
{
	int rc = 0;
	pthread_mutex_lock(&f->mu);
	struct floor_entry *e = find_locked(f, name);
	if (!e) {
		rc = wf_diag_set(diag, WF_ENOT_FOUND, "no model named '%s'", name);
	} else if (!e->region) {
		rc =
		    wf_diag_set(diag, WF_ENOT_RESIDENT,
		                "model '%s' has no floor to publish to (state %s): ensure it first",
		                name, wf_floor_state_name(e->state));
	} else {
		wf_shm_region_digest(e->region, ret_digest);
		touch_locked(f, e);
	}
	pthread_mutex_unlock(&f->mu);
	return rc;
}

static int cmp_u32_pair(const void *a, const void *b)
{
	const uint32_t *x = a, *y = b;
	return (x[0] > y[0]) - (x[0] < y[0]);
}

/* Each name to its tensor, with the size checked; a name given twice is refused here, by name. */
static int publish_resolve(const struct wf_shm_region *w, const char *model,
                           const struct wf_floor_publish_tensor *t, uint32_t n,
                           struct wf_shm_publish_tensor *pt, struct wf_diag *diag)
{
	for (uint32_t i = 0; i < n; i++) {
		struct wf_shm_tensor_info ti;
		int rc = t[i].name ? wf_shm_region_find(w, t[i].name, &ti) : WF_EINVAL;
		if (rc == WF_ENOT_FOUND || rc == WF_EINVAL)
			return wf_diag_set(diag, WF_ENOT_FOUND, "model '%s' has no tensor '%s'",
			                   model, t[i].name ? t[i].name : "");
		if (rc < 0)
			return wf_diag_set(diag, rc, "model '%s': tensor '%s': %s", model,
			                   t[i].name, wf_strerror(rc));
		if (ti.nbytes != t[i].nbytes)
			return wf_diag_set(
			    diag, WF_EINVAL,
			    "model '%s': tensor '%s' is %llu bytes, the new version %llu "
			    "(a publish keeps the size and type)",
			    model, t[i].name, (unsigned long long)ti.nbytes,
			    (unsigned long long)t[i].nbytes);
		pt[i] = (struct wf_shm_publish_tensor){
		    .index = ti.index, .dtype = ti.dtype, .nbytes = ti.nbytes, .data = t[i].data};
	}
	/* (index, position) pairs sorted by index: equal neighbours are a name given twice */
	uint32_t *pairs = malloc((size_t)n * 2 * sizeof(*pairs));
	if (!pairs)
		return -ENOMEM;
	for (uint32_t i = 0; i < n; i++) {
		pairs[2 * i] = pt[i].index;
		pairs[2 * i + 1] = i;
	}
	qsort(pairs, n, 2 * sizeof(*pairs), cmp_u32_pair);
	int rc = 0;
	for (uint32_t i = 1; i < n && rc == 0; i++)
		if (pairs[2 * i] == pairs[2 * i - 2])
			rc = wf_diag_set(diag, WF_EINVAL, "model '%s': tensor '%s' given twice",
			                 model, t[pairs[2 * i + 1]].name);
	free(pairs);
	return rc;
}

int wf_floors_publish(struct wf_floors *f, const char *name,
                      const struct wf_floor_publish_tensor *t, uint32_t n, bool dry_run,
                      uint32_t *ret_ids, struct wf_floor_publish_result *ret, struct wf_diag *diag)
{
	struct wf_shm_publish_tensor *pt = NULL;
	struct wf_shm_region *w = NULL;
	struct wf_floor_publish_result res = {0};
	struct wf_digest d;
	struct wf_diag sd = {{0}};
	int rc;

	if (!name || !t || n == 0 || !ret_ids || !ret)
		return wf_diag_set(diag, WF_EINVAL,
		                   "publish: give a model and at least one tensor");
	rc = publish_target(f, name, &d, diag);
	if (rc < 0)
		return rc;
	/* An attachment of our own, read-write, for this call: the registry's hold may be dropped
	 * meanwhile (release, eviction) without pulling the mapping from under the publish. No
	 * model: nothing is created or rebuilt here, and the header names the digest. */
	rc = wf_shm_region_attach(&f->shm, &d, NULL, WF_SHM_ATTACH_WRITE | WF_SHM_ATTACH_OWNED,
	                          NULL, NULL, &w, &sd);
	if (rc == -ENOENT)
		return wf_diag_set(diag, WF_ENOT_RESIDENT,
		                   "model '%s': its floor was released meanwhile: ensure it again",
		                   name);
	if (rc < 0)
		return wf_diag_set(diag, rc, "model '%s': %s", name, wf_diag_str(&sd, rc));
	pt = calloc(n, sizeof(*pt));
	if (!pt) {
		rc = -ENOMEM;
		goto out;
	}
	rc = publish_resolve(w, name, t, n, pt, diag);
	if (rc < 0)
		goto out;
	wf_diag_clear(&sd);
	rc = wf_shm_region_publish(w, pt, n, dry_run ? WF_SHM_PUBLISH_DRY_RUN : 0, &res.generation,
	                           &sd);
	if (rc < 0) {
		wf_diag_set(diag, rc, "model '%s': %s%s", name, wf_diag_str(&sd, rc),
		            rc == WF_ENO_SPACE ? " (release the floor: once no process holds it, "
		                                 "ensure makes it anew, with the files' bytes and "
		                                 "the configured spare area)"
		                               : "");
		goto out;
	}
	wf_digest_hex(&d, res.digest_hex);
	wf_shm_region_spare(w, &res.spare_bytes, &res.spare_used);
	for (uint32_t i = 0; i < n; i++) {
		ret_ids[i] = pt[i].index;
		res.bytes += pt[i].nbytes;
	}
	*ret = res;
out:
	/* The keep marker holds the floor while the registry does; otherwise this was perhaps its
	 * last holder, and the region goes as a release would have taken it. */
	wf_shm_region_detach(w);
	free(pt);
	if (rc == 0 && !dry_run) {
		const char **names = malloc((size_t)n * sizeof(*names));
		for (uint32_t i = 0; names && i < n; i++)
			names[i] = t[i].name;
		struct wf_floor_event ev = {.kind = WF_FLOOR_EV_PUBLISHED,
		                            .model = name,
		                            .state = WF_FLOOR_HOST,
		                            .bytes_done = res.bytes,
		                            .digest_hex = res.digest_hex,
		                            .generation = res.generation,
		                            .n_tensors = names ? n : 0,
		                            .tensor_ids = ret_ids,
		                            .tensor_names = names};
		pthread_mutex_lock(&f->mu);
		struct floor_entry *e = find_locked(f, name);
		if (e)
			ev.state = e->state;
		pthread_mutex_unlock(&f->mu);
		emit(f, &ev);
		free(names);
	}
	return rc;
}

/* ---- reloading ---------------------------------------------------------------------------- */

void wf_floor_reload_result_fini(struct wf_floor_reload_result *r)
{
	if (r)
		wf_reload_plan_free(&r->plan);
}

/* What a reload needs of the entry, copied under the lock: its path, its floor's digest and the
 * baseline identities (the last reload's, or the inventory's). */
static int reload_target(struct wf_floors *f, const char *name, char **ret_path,
                         struct wf_digest *ret_digest, struct wf_reload_ident **ret_base,
                         uint32_t *ret_n, struct wf_diag *diag)
{
	int rc = publish_target(f, name, ret_digest, diag);
	if (rc < 0)
		return rc;
	pthread_mutex_lock(&f->mu);
	struct floor_entry *e = find_locked(f, name);
	uint32_t n = e ? e->inv->model->n_files : 0;
	char *path = e ? strdup(e->path) : NULL;
	struct wf_reload_ident *base = n ? malloc(n * sizeof(*base)) : NULL;
	for (uint32_t i = 0; base && i < n; i++)
		base[i] = e->ident ? e->ident[i] : wf_reload_ident_of(&e->inv->model->files[i]);
	pthread_mutex_unlock(&f->mu);
	if (!e || !path || !base) {
		free(path);
		free(base);
		return e ? -ENOMEM : wf_diag_set(diag, WF_ENOT_FOUND, "no model named '%s'", name);
	}
	*ret_path = path;
	*ret_base = base;
	*ret_n = n;
	return 0;
}

/* The plan of a reload: the model's files opened again (the agent's model roots checked, as at
 * registration) and compared with the floor through an attachment of our own. */
static int reload_plan(struct wf_floors *f, const char *name, const char *path,
                       const struct wf_digest *d, const struct wf_reload_ident *base,
                       uint32_t n_base, struct wf_floor_reload_result *ret, struct wf_diag *diag)
{
	struct wf_model *m = NULL;
	struct wf_shm_region *w = NULL;
	struct wf_diag sd = {{0}};
	int rc = wf_model_open(path, &m, &sd);
	if (rc == 0)
		rc = wf_agent_config_check_model(f->cfg, m, &sd);
	if (rc < 0) {
		wf_diag_set(diag, rc, "model '%s': %s", name, wf_diag_str(&sd, rc));
		goto out;
	}
	rc = wf_shm_region_attach(&f->shm, d, NULL, WF_SHM_ATTACH_WRITE | WF_SHM_ATTACH_OWNED, NULL,
	                          NULL, &w, &sd);
	if (rc == -ENOENT) {
		rc = wf_diag_set(diag, WF_ENOT_RESIDENT,
		                 "model '%s': its floor was released meanwhile: ensure it again",
		                 name);
		goto out;
	}
	if (rc < 0) {
		wf_diag_set(diag, rc, "model '%s': %s", name, wf_diag_str(&sd, rc));
		goto out;
	}
	wf_diag_clear(&sd);
	ret->generation = wf_shm_region_generation(w);
	rc = wf_reload_plan(w, m, base, n_base, &ret->plan, &sd);
	if (rc < 0)
		wf_diag_set(diag, rc, "model '%s': %s", name, wf_diag_str(&sd, rc));
out:
	wf_shm_region_detach(w);
	wf_model_close(m);
	return rc;
}

/* Publishes the plan's CHANGED tensors (one generation). */
static int reload_publish(struct wf_floors *f, const char *name, const struct wf_reload_plan *plan,
                          struct wf_floor_reload_result *res, struct wf_diag *diag)
{
	struct wf_floor_publish_tensor *t = calloc(plan->n_changed, sizeof(*t));
	uint32_t *ids = calloc(plan->n_changed, sizeof(*ids));
	int rc = -ENOMEM;
	if (t && ids) {
		uint32_t k = 0;
		for (uint32_t i = 0; i < plan->n_tensors; i++)
			if (plan->tensors[i].status == WF_RELOAD_CHANGED)
				t[k++] = (struct wf_floor_publish_tensor){
				    .name = plan->tensors[i].name,
				    .data = plan->tensors[i].data,
				    .nbytes = plan->tensors[i].nbytes};
		struct wf_floor_publish_result pr;
		rc = wf_floors_publish(f, name, t, k, false, ids, &pr, diag);
		if (rc == 0) {
			res->generation = pr.generation;
			res->published = true;
		}
	}
	free(t);
	free(ids);
	return rc;
}

/* The plan's identities become the entry's baseline, if the entry still holds the floor the
 * reload looked at; the stale mark goes with it. */
static void reload_adopt_idents(struct wf_floors *f, const char *name, const struct wf_digest *d,
                                struct wf_reload_plan *plan)
{
	pthread_mutex_lock(&f->mu);
	struct floor_entry *e = find_locked(f, name);
	struct wf_digest now = {0};
	if (e && e->region)
		wf_shm_region_digest(e->region, &now);
	if (e && e->region && now.hi == d->hi && now.lo == d->lo &&
	    e->inv->model->n_files == plan->n_files) {
		free(e->ident);
		e->ident = plan->idents;
		plan->idents = NULL;
		e->stale = false;
	}
	pthread_mutex_unlock(&f->mu);
}

static void reload_emit(struct wf_floors *f, const char *name, int rc,
                        const struct wf_floor_reload_result *r, bool dry_run,
                        const struct wf_diag *diag)
{
	char msg[320];
	const struct wf_reload_plan *p = &r->plan;
	if (rc < 0)
		snprintf(msg, sizeof(msg), "reload failed: %s", wf_diag_str(diag, rc));
	else
		snprintf(msg, sizeof(msg),
		         "%s%u reloaded, %u unchanged, %u refused (%u of %u files changed, %llu "
		         "bytes read)%s",
		         dry_run ? "dry run: " : "", p->n_changed, p->n_unchanged, p->n_refused,
		         p->files_moved, p->n_files, (unsigned long long)p->bytes_read,
		         p->n_refused ? ": nothing published" : "");
	struct wf_floor_event ev = {.kind = WF_FLOOR_EV_RELOADED,
	                            .model = name,
	                            .state = WF_FLOOR_HOST,
	                            .code = rc < 0 ? rc : 0,
	                            .message = msg,
	                            .seconds = r->seconds,
	                            .digest_hex = r->digest_hex,
	                            .generation = r->generation,
	                            .n_tensors = r->published ? p->n_changed : 0,
	                            .bytes_done = r->published ? p->bytes_changed : 0};
	ev.reload_result = rc < 0         ? "failed"
	                   : p->n_refused ? "refused"
	                   : dry_run      ? "dry_run"
	                   : r->published ? "published"
	                                  : "unchanged";
	pthread_mutex_lock(&f->mu);
	struct floor_entry *e = find_locked(f, name);
	if (e)
		ev.state = e->state;
	pthread_mutex_unlock(&f->mu);
	emit(f, &ev);
}

int wf_floors_reload(struct wf_floors *f, const char *name, bool dry_run,
                     struct wf_floor_reload_result *ret, struct wf_diag *diag)
{
	struct wf_floor_reload_result res = {0};
	struct wf_reload_ident *base = NULL;
	char *path = NULL;
	struct wf_digest d;
	uint32_t n_base = 0;
	int64_t t0 = now_ns();

	if (!name || !ret)
		return wf_diag_set(diag, WF_EINVAL, "reload: name the model");
	/* Serialized: two reloads of one floor would each publish what the other already did. */
	pthread_mutex_lock(&f->reload_mu);
	int rc = reload_target(f, name, &path, &d, &base, &n_base, diag);
	if (rc == 0) {
		wf_digest_hex(&d, res.digest_hex);
		rc = reload_plan(f, name, path, &d, base, n_base, &res, diag);
	}
	if (rc == 0 && !dry_run && res.plan.n_refused == 0 && res.plan.n_changed)
		rc = reload_publish(f, name, &res.plan, &res, diag);
	if (rc == 0 && !dry_run && res.plan.n_refused == 0)
		reload_adopt_idents(f, name, &d, &res.plan);
	res.seconds = (double)(now_ns() - t0) / 1e9;
	if (rc != WF_ENOT_FOUND)
		reload_emit(f, name, rc, &res, dry_run, diag);
	pthread_mutex_unlock(&f->reload_mu);
	free(path);
	free(base);
	if (rc < 0) {
		wf_floor_reload_result_fini(&res);
		return rc;
	}
	*ret = res;
	return 0;
}

void wf_floor_model_files_free(struct wf_floor_model_file *v, size_t n)
{
	for (size_t i = 0; v && i < n; i++) {
		free(v[i].model);
		free(v[i].path);
	}
	free(v);
}

int wf_floors_held_files(struct wf_floors *f, struct wf_floor_model_file **ret, size_t *ret_n)
{
	struct wf_floor_model_file *v = NULL;
	size_t n = 0, cap = 0;
	int rc = 0;
	pthread_mutex_lock(&f->mu);
	for (size_t i = 0; rc == 0 && i < f->n_entries; i++) {
		const struct floor_entry *e = f->entries[i];
		if (!e->region)
			continue;
		for (uint32_t k = 0; rc == 0 && k < e->inv->model->n_files; k++) {
			const struct wf_model_file *mf = &e->inv->model->files[k];
			if (n == cap) {
				cap = cap ? cap * 2 : 16;
				struct wf_floor_model_file *nv = realloc(v, cap * sizeof(*nv));
				if (!nv) {
					rc = -ENOMEM;
					break;
				}
				v = nv;
			}
			v[n].model = strdup(e->name);
			v[n].path = strdup(mf->real_path ? mf->real_path : mf->path);
			n++;
			if (!v[n - 1].model || !v[n - 1].path)
				rc = -ENOMEM;
		}
	}
	pthread_mutex_unlock(&f->mu);
	if (rc < 0) {
		wf_floor_model_files_free(v, n);
		return rc;
	}
	*ret = v;
	*ret_n = n;
	return 0;
}

/* ---- adoption ----------------------------------------------------------------------------- */

static void *janitor_thread(void *arg);

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
		struct floor_inv *inv = NULL;
		pthread_mutex_lock(&f->mu);
		for (size_t k = 0; k < f->n_entries; k++) {
			struct floor_entry *x = f->entries[k];
			if (x->inv->digest.hi == se->digest.hi &&
			    x->inv->digest.lo == se->digest.lo && !x->region && !x->job) {
				e = x;
				inv = inv_ref(x->inv);
			}
		}
		pthread_mutex_unlock(&f->mu);
		if (se->cls == WF_SHM_SCAN_READY && e) {
			struct wf_diag d = {{0}};
			struct wf_shm_region *r = NULL;
			/* MUST_EXIST | VERIFY: validates against the model, re-hashes every tensor,
			 * repairs what does not match, never creates. */
			struct fill_job tmp = {.e = e, .inv = inv};
			struct wf_shm_config shm = shm_for(f, inv);
			int a = wf_shm_region_attach(
			    &shm, &inv->digest, inv->model,
			    WF_SHM_ATTACH_MUST_EXIST | WF_SHM_ATTACH_VERIFY, fill_files,
			    &(struct fill_ctx){.job = &tmp, .f = f}, &r, &d);
			inv_unref(inv);
			bool installed = false;
			if (a == 0) {
				pthread_mutex_lock(&f->mu);
				if (!e->region && !e->job) {
					e->region = r;
					r = NULL;
					e->state =
					    e->pin_host ? WF_FLOOR_PINNED_HOST : WF_FLOOR_HOST;
					touch_locked(f, e);
					installed = true;
				}
				pthread_mutex_unlock(&f->mu);
				hold_drop(f, r);
			} else {
				emit_error(f, e->name, WF_FLOOR_DISK, a, wf_diag_str(&d, a));
			}
			if (installed) {
				adopted++;
				keep_sync(f, e);
				emit_state(f, e->name, e->state, "adopted");
			}
			continue;
		}
		inv_unref(inv);
		/* Whatever nobody holds and no model of ours wants goes; a held region is never
		 * removed (wf_shm_region_remove refuses it). */
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

	pthread_mutex_lock(&f->mu);
	if (!f->janitor_started && !f->closing &&
	    pthread_create(&f->janitor, NULL, janitor_thread, f) == 0)
		f->janitor_started = true;
	pthread_mutex_unlock(&f->mu);
	return 0;
}

void wf_floors_preload(struct wf_floors *f)
{
	for (size_t i = 0; i < f->cfg->n_models; i++) {
		const struct wf_agent_model_cfg *mc = &f->cfg->models[i];
		pthread_mutex_lock(&f->mu);
		struct floor_entry *e = find_locked(f, mc->name);
		bool want = mc->preload || (e && e->pin_host);
		pthread_mutex_unlock(&f->mu);
		if (!want)
			continue;
		struct wf_diag d = {{0}};
		int rc = wf_floors_ensure(f, mc->name, false, 0, NULL, NULL, &d);
		if (rc < 0)
			emit_error(f, mc->name, WF_FLOOR_FAILED, rc, wf_diag_str(&d, rc));
	}
	/* Pinned API models come back too: a pin is a promise to keep the floor. */
	pthread_mutex_lock(&f->mu);
	size_t n = f->n_entries;
	char **names = calloc(n ? n : 1, sizeof(char *));
	size_t k = 0;
	for (size_t i = 0; names && i < n; i++)
		if (f->entries[i]->api && f->entries[i]->pin_host && !f->entries[i]->region &&
		    !f->entries[i]->job)
			names[k++] = strdup(f->entries[i]->name);
	pthread_mutex_unlock(&f->mu);
	for (size_t i = 0; i < k; i++) {
		struct wf_diag d = {{0}};
		int rc =
		    names[i] ? wf_floors_ensure(f, names[i], false, 0, NULL, NULL, &d) : -ENOMEM;
		if (rc < 0 && names[i])
			emit_error(f, names[i], WF_FLOOR_FAILED, rc, wf_diag_str(&d, rc));
		free(names[i]);
	}
	free(names);
}

/* ---- the janitor -------------------------------------------------------------------------- */

static uint64_t file_resident_bytes(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0 ? (uint64_t)st.st_blocks * 512u : 0;
}

static void region_path(const struct wf_floors *f, const char *hex, char *buf, size_t len)
{
	snprintf(buf, len, "%s/wf-%s", f->shm.dir, hex);
}

/* One pass: reap regions that nobody holds and nobody keeps, account for the ones others hold,
 * and tell about models whose files changed under their floor. Every file operation is done
 * without the registry lock; the lock is taken to read and store in-memory state only. */
static void janitor_pass(struct wf_floors *f)
{
	struct wf_shm_scan_entry *ents = NULL;
	size_t n = 0;
	if (wf_shm_dir_scan(&f->shm, &ents, &n, NULL) == 0) {
		uint64_t others_bytes = 0, orphan_bytes = 0;
		uint32_t n_orphans = 0, reaped = 0;
		struct wf_floor_orphan orphans[WF_FLOORS_MAX_ORPHANS];
		for (size_t i = 0; i < n; i++) {
			struct wf_shm_scan_entry *se = &ents[i];
			bool wanted = false, known = false;
			pthread_mutex_lock(&f->mu);
			for (size_t k = 0; k < f->n_entries && !wanted; k++) {
				struct floor_entry *x = f->entries[k];
				const struct wf_digest *d =
				    x->job ? &x->job->inv->digest : &x->inv->digest;
				bool match = (d->hi == se->digest.hi && d->lo == se->digest.lo) ||
				             (x->inv->digest.hi == se->digest.hi &&
				              x->inv->digest.lo == se->digest.lo);
				known |= match;
				wanted = match && (x->region || x->job);
			}
			pthread_mutex_unlock(&f->mu);
			if (wanted || se->cls == WF_SHM_SCAN_BUSY)
				continue;
			if (!se->held) {
				/* A marker no model of ours stands behind (left by an agent that
				 * forgot the model). Markers of known models are keep_sync's alone.
				 */
				if (se->has_keep && !known)
					(void)wf_shm_region_set_keep(&f->shm, &se->digest, false,
					                             NULL);
				if (wf_shm_region_reap(&f->shm, &se->digest, NULL) == 0) {
					reaped++;
					continue;
				}
			}
			if (!se->has_region)
				continue;
			char hex[WF_DIGEST_HEX_LEN], path[4096];
			wf_digest_hex(&se->digest, hex);
			region_path(f, hex, path, sizeof path);
			uint64_t bytes = file_resident_bytes(path);
			others_bytes += bytes;
			if (known)
				continue; /* shown in its model's status (region_present, holders)
				           */
			orphan_bytes += bytes;
			if (n_orphans < WF_FLOORS_MAX_ORPHANS) {
				struct wf_floor_orphan *o = &orphans[n_orphans];
				memcpy(o->digest_hex, hex, sizeof o->digest_hex);
				o->resident_bytes = bytes;
				pid_t pids[WF_FLOOR_MAX_PIDS];
				size_t nh = 0;
				o->holder_count =
				    wf_shm_holder_pids(&f->shm, &se->digest, pids,
				                       WF_FLOOR_MAX_PIDS, &nh, NULL) == 0
				        ? (uint32_t)nh
				        : 0;
				o->kept = se->has_keep;
			}
			n_orphans++;
		}
		pthread_mutex_lock(&f->mu);
		f->others_bytes = others_bytes;
		f->orphan_bytes = orphan_bytes;
		f->n_orphans = n_orphans;
		memcpy(f->orphans, orphans,
		       sizeof(orphans[0]) *
		           (n_orphans < WF_FLOORS_MAX_ORPHANS ? n_orphans : WF_FLOORS_MAX_ORPHANS));
		f->reaped += reaped;
		pthread_mutex_unlock(&f->mu);
		free(ents);
	}

	/* Keep markers a busy guard kept us from setting or clearing. Entries are never freed
	 * before the janitor stops, so the pointers stay valid outside the lock. */
	pthread_mutex_lock(&f->mu);
	size_t ne = f->n_entries;
	struct floor_entry **all = calloc(ne ? ne : 1, sizeof(*all));
	if (all && ne) /* f->entries is NULL while no model is registered */
		memcpy(all, f->entries, ne * sizeof(*all));
	pthread_mutex_unlock(&f->mu);
	for (size_t i = 0; all && i < ne; i++)
		keep_sync(f, all[i]);
	free(all);

	/* Stale floors: a file replaced or rewritten since the floor was made. */
	pthread_mutex_lock(&f->mu);
	ne = f->n_entries;
	struct floor_entry **held = calloc(ne ? ne : 1, sizeof(*held));
	struct floor_inv **invs = calloc(ne ? ne : 1, sizeof(*invs));
	struct wf_reload_ident **idents = calloc(ne ? ne : 1, sizeof(*idents));
	size_t nh = 0;
	for (size_t i = 0; held && invs && idents && i < ne; i++) {
		struct floor_entry *x = f->entries[i];
		if (x->region && !x->stale) {
			held[nh] = x;
			idents[nh] = ident_copy(x->ident, x->inv->model->n_files);
			invs[nh++] = inv_ref(x->inv);
		}
	}
	pthread_mutex_unlock(&f->mu);
	for (size_t i = 0; i < nh; i++) {
		bool stale = idents[i] ? ident_stale(invs[i], idents[i]) : inv_stale(invs[i]);
		free(idents[i]);
		if (stale) {
			pthread_mutex_lock(&f->mu);
			bool tell = held[i]->region && !held[i]->stale && held[i]->inv == invs[i];
			if (tell)
				held[i]->stale = true;
			enum wf_floor_state st = held[i]->state;
			pthread_mutex_unlock(&f->mu);
			if (tell) {
				struct wf_floor_event ev = {
				    .kind = WF_FLOOR_EV_STALE,
				    .model = held[i]->name,
				    .state = st,
				    .message = "a model file changed since the floor was "
				               "materialized: the floor serves the old bytes; "
				               "release and ensure it to load the new ones"};
				emit(f, &ev);
			}
		}
		inv_unref(invs[i]);
	}
	free(held);
	free(invs);
	free(idents);
}

static void *janitor_thread(void *arg)
{
	struct wf_floors *f = arg;
	pthread_mutex_lock(&f->mu);
	while (!f->closing) {
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)f->janitor_interval_ms * 1000000u;
		ts.tv_sec += (time_t)(ns / 1000000000u);
		ts.tv_nsec = (long)(ns % 1000000000u);
		pthread_cond_timedwait(&f->janitor_cv, &f->mu, &ts);
		if (f->closing)
			break;
		pthread_mutex_unlock(&f->mu);
		janitor_pass(f);
		pthread_mutex_lock(&f->mu);
		f->janitor_last_ns = now_ns();
	}
	pthread_mutex_unlock(&f->mu);
	return NULL;
}

/* ---- status ------------------------------------------------------------------------------- */

/* In-memory part of a snapshot, under the lock. */
static int snapshot_locked(struct floor_entry *e, struct wf_floor_snapshot *s)
{
	memset(s, 0, sizeof(*s));
	const struct floor_inv *inv = e->inv;
	snprintf(s->name, sizeof s->name, "%s", e->name);
	memcpy(s->digest_hex, inv->hex, sizeof s->digest_hex);
	s->format = inv->model->format;
	snprintf(s->arch, sizeof s->arch, "%s", inv->model->hp.arch);
	s->files = calloc(inv->model->n_files ? inv->model->n_files : 1, sizeof(*s->files));
	if (!s->files)
		return -ENOMEM;
	for (uint32_t i = 0; i < inv->model->n_files; i++) {
		s->files[i].path = strdup(inv->model->files[i].path);
		s->files[i].size = inv->model->files[i].size;
		s->n_files = i + 1;
		if (!s->files[i].path)
			return -ENOMEM;
	}
	s->total_bytes = inv->model->total_bytes;
	s->dense_bytes = inv->model->dense_bytes;
	s->expert_bytes = inv->model->expert_bytes;
	s->region_bytes = inv->region_bytes;
	s->tensor_count = inv->model->n_tensors;
	s->state = e->state;
	s->pin_host = e->pin_host;
	s->stale = e->stale;
	if (e->job) {
		s->bytes_done = atomic_load(&e->job->done);
		s->bytes_total = atomic_load(&e->job->total);
		s->rate_bytes_per_s = atomic_load(&e->job->rate);
	} else {
		s->bytes_done = e->done;
		s->bytes_total = e->total;
		s->rate_bytes_per_s = e->rate;
	}
	s->started_unix_ms = e->started_unix_ms;
	snprintf(s->last_error, sizeof s->last_error, "%s", e->last_error);
	s->last_used_unix_ms = e->last_used_unix_ms;
	s->registered_unix_ms = e->registered_unix_ms;
	return 0;
}

/* What is true in the directory now: holders and resident bytes. Outside the lock. */
static void snapshot_observe(struct wf_floors *f, struct wf_floor_snapshot *s)
{
	struct wf_digest d;
	if (wf_digest_parse(s->digest_hex, &d) < 0)
		return;
	char path[4096];
	region_path(f, s->digest_hex, path, sizeof path);
	struct stat st;
	s->region_present = stat(path, &st) == 0;
	s->resident_bytes = s->region_present ? (uint64_t)st.st_blocks * 512u : 0;
	if (s->state == WF_FLOOR_MATERIALIZING)
		return; /* the holders file may not exist yet; the count would say nothing */
	size_t nh = 0;
	if (wf_shm_holder_pids(&f->shm, &d, s->holder_pids, WF_FLOOR_MAX_PIDS, &nh, NULL) == 0) {
		s->holder_count = (uint32_t)nh;
		s->n_holder_pids = nh < WF_FLOOR_MAX_PIDS ? (uint32_t)nh : WF_FLOOR_MAX_PIDS;
	}
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
	int rc = e ? snapshot_locked(e, ret)
	           : wf_diag_set(diag, WF_ENOT_FOUND, "no model named '%s'", name);
	pthread_mutex_unlock(&f->mu);
	if (rc < 0) {
		if (e)
			wf_floor_snapshot_fini(ret);
		return rc;
	}
	snapshot_observe(f, ret);
	return 0;
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
		rc = snapshot_locked(f->entries[i], &v[i]);
	pthread_mutex_unlock(&f->mu);
	if (rc < 0) {
		for (size_t i = 0; v && i < n; i++)
			wf_floor_snapshot_fini(&v[i]);
		free(v);
		return rc;
	}
	for (size_t i = 0; i < n; i++)
		snapshot_observe(f, &v[i]);
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
	s->orphan_bytes = f->orphan_bytes;
	s->n_orphans = f->n_orphans;
	memcpy(s->orphans, f->orphans,
	       sizeof(s->orphans[0]) *
	           (f->n_orphans < WF_FLOORS_MAX_ORPHANS ? f->n_orphans : WF_FLOORS_MAX_ORPHANS));
	s->reaped = f->reaped;
	s->reader_backend = f->reader_backend;
	s->o_direct = f->o_direct;
	s->uring_err = f->uring_err;
	s->adopted = f->adopted;
	s->removed = f->removed;
	s->janitor_age_ms = f->janitor_last_ns ? (now_ns() - f->janitor_last_ns) / 1000000 : -1;
	s->janitor_interval_ms = f->janitor_interval_ms;
	s->n_models = (uint32_t)f->n_entries;
	for (size_t i = 0; i < f->n_entries; i++) {
		switch (f->entries[i]->state) {
		case WF_FLOOR_DISK:
			s->n_disk++;
			break;
		case WF_FLOOR_MATERIALIZING:
			s->n_materializing++;
			break;
		case WF_FLOOR_HOST:
			s->n_host++;
			break;
		case WF_FLOOR_PINNED_HOST:
			s->n_pinned++;
			break;
		case WF_FLOOR_FAILED:
			s->n_failed++;
			break;
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
		if (f->entries[i]->job)
			atomic_store(&f->entries[i]->job->cancel, 1);
	pthread_cond_broadcast(&f->janitor_cv);
	bool janitor = f->janitor_started;
	f->janitor_started = false;
	pthread_mutex_unlock(&f->mu);
	if (janitor)
		pthread_join(f->janitor, NULL);

	/* Jobs see the cancel within one chunk of I/O; they need the lock to finish, which this
	 * wait releases. */
	pthread_mutex_lock(&f->mu);
	while (f->n_jobs > 0)
		pthread_cond_wait(&f->cv, &f->mu);
	pthread_mutex_unlock(&f->mu);

	for (size_t i = 0; i < f->n_entries; i++) {
		/* Leave READY floors and their keep markers in place for the next agent: close
		 * without the release. */
		wf_shm_region_abandon(f->entries[i]->region);
		f->entries[i]->region = NULL;
		entry_free(f->entries[i]);
	}
	free(f->entries);
	free(f->state_file);
	pthread_cond_destroy(&f->janitor_cv);
	pthread_mutex_destroy(&f->persist_mu);
	pthread_mutex_destroy(&f->reload_mu);
	pthread_cond_destroy(&f->cv);
	pthread_mutex_destroy(&f->mu);
	free(f);
}
