/* The agent's floor manager: the model registry, materialization, the host budget with LRU
 * eviction, pinning, re-adoption of regions left by an earlier agent, the persistent state
 * (agent/state.h) and a janitor that reaps floors nobody holds.
 *
 * States of a registered model (FloorState in the protocol):
 *   DISK          registered; the agent holds no region for it
 *   MATERIALIZING a thread is copying its files into a new region (progress below)
 *   HOST          the agent holds a READY region; evictable when no other process holds it
 *   PINNED_HOST   the same, never evicted
 *   FAILED        the last materialization failed (last_error says why); ensure retries
 *
 * The agent holds one attachment (a holders SH lock) on every HOST/PINNED_HOST floor and, so that
 * its intent outlives the process, a keep marker (shm/region.h): while the marker exists no last
 * holder unlinks the region, whatever the order in which the agent and its workers stop. Release
 * and eviction clear the marker and drop the attachment; the region then goes with its last
 * holder, or, when nobody holds it any more (a worker was killed, the agent was the last), the
 * janitor removes it within one interval. A restarted agent re-adopts the floors it kept (their
 * checksums verified) and the registrations and pins of its state file.
 *
 * Thread-safety and locking: every function may be called from any thread (the control server
 * calls them from several). One mutex guards the registry's memory and nothing else: no file is
 * opened, no flock taken, no region mapped or unmapped, no remote call made while it is held.
 * Materializations run in detached threads of their own; the registry never joins a thread. */
#ifndef WF_AGENT_FLOORS_H
#define WF_AGENT_FLOORS_H

#include "agent/config.h"
#include "agent/reload.h"
#include "base/diag.h"
#include "model/model.h"

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

enum wf_floor_state {
	WF_FLOOR_DISK = 1,
	WF_FLOOR_MATERIALIZING = 2,
	WF_FLOOR_HOST = 3,
	WF_FLOOR_PINNED_HOST = 4,
	WF_FLOOR_FAILED = 5,
};

const char *wf_floor_state_name(enum wf_floor_state s);

/* Called (without the registry lock held) when a model changes state or makes progress, and for
 * errors of asynchronous work. kind is one of the WF_FLOOR_EV_* values. */
enum wf_floor_event_kind {
	WF_FLOOR_EV_STATE = 1,
	WF_FLOOR_EV_PROGRESS = 2,
	WF_FLOOR_EV_ERROR = 3,
	WF_FLOOR_EV_STALE = 4, /* a model file changed under a floor the agent holds */
	/* a floor published a new generation of some tensors (wf_floors_publish()): the fields
	 * below say which; bytes_done is the bytes published */
	WF_FLOOR_EV_PUBLISHED = 5,
	/* a reload ended (wf_floors_reload(), dry runs and failures included): message says what
	 * it found; code is 0 or the failure's; n_tensors counts the tensors it published */
	WF_FLOOR_EV_RELOADED = 6,
};
struct wf_floor_event {
	enum wf_floor_event_kind kind;
	const char *model;
	enum wf_floor_state state;
	uint64_t bytes_done, bytes_total, rate_bytes_per_s;
	int code;            /* ERROR: the failure */
	const char *message; /* ERROR, and STATE changes worth a word (evicted, adopted) */
	/* STATE events that end a materialization (HOST, PINNED_HOST or FAILED from the job):
	 * how long it ran, and whether this agent copied the bytes (false: another process had
	 * already made the region READY). 0 / false for every other event. */
	double seconds;
	bool materialized;
	/* PUBLISHED: the floor (its digest), the generation it published and the tensors, n of
	 * each, in the request's order; valid during the callback only. */
	const char *digest_hex;
	uint64_t generation;
	uint32_t n_tensors;
	const uint32_t *tensor_ids;
	const char *const *tensor_names;
	/* RELOADED: "published", "unchanged" (nothing differed), "dry_run", "refused" (a tensor
	 * could not be reloaded: nothing published) or "failed" */
	const char *reload_result;
};
typedef void (*wf_floor_event_fn)(void *ctx, const struct wf_floor_event *ev);

struct wf_floor_file {
	char *path;
	uint64_t size;
};

#define WF_FLOOR_MAX_PIDS 32

/* A copy of one model's state; owned by the caller, freed with wf_floor_snapshot_fini(). */
struct wf_floor_snapshot {
	char name[129];
	char digest_hex[WF_DIGEST_HEX_LEN];
	enum wf_model_format format;
	char arch[64];
	uint32_t n_files;
	struct wf_floor_file *files;
	uint64_t total_bytes, dense_bytes, expert_bytes, region_bytes;
	uint32_t tensor_count;
	enum wf_floor_state state;
	bool pin_host;
	uint64_t bytes_done, bytes_total, rate_bytes_per_s;
	int64_t started_unix_ms;
	char last_error[256];
	int64_t last_used_unix_ms, registered_unix_ms;
	uint32_t holder_count; /* processes holding the region now, the agent included */
	uint32_t n_holder_pids;
	pid_t holder_pids[WF_FLOOR_MAX_PIDS];
	bool region_present;     /* a region file for the model's digest exists */
	uint64_t resident_bytes; /* its pages in RAM (allocated blocks of the region file) */
	bool stale;              /* a model file changed since this floor was materialized */
};
void wf_floor_snapshot_fini(struct wf_floor_snapshot *s);

/* A region in the floor directory that no registered model points to (a model released while
 * workers still hold it, a floor of an unregistered model a process still maps). */
struct wf_floor_orphan {
	char digest_hex[WF_DIGEST_HEX_LEN];
	uint64_t resident_bytes;
	uint32_t holder_count;
	bool kept; /* a keep marker is present (an agent meant to keep it) */
};

#define WF_FLOORS_MAX_ORPHANS 64

struct wf_floors_status {
	uint64_t host_budget;
	uint64_t host_used; /* floors the agent holds or materializes, plus orphans' bytes */
	uint64_t orphan_bytes;
	uint32_t n_orphans; /* may exceed WF_FLOORS_MAX_ORPHANS; orphans[] holds the first ones */
	struct wf_floor_orphan orphans[WF_FLOORS_MAX_ORPHANS];
	uint32_t reaped;            /* regions the janitor removed since start */
	const char *reader_backend; /* "io_uring" or "pread" (static) */
	bool o_direct;
	int uring_err; /* why io_uring is not used, 0 if it is */
	uint32_t n_models, n_disk, n_materializing, n_host, n_pinned, n_failed;
	uint32_t adopted, removed; /* at start */
	/* Milliseconds since the janitor last finished a pass (-1: it has not yet), and its
	 * interval: a janitor far behind its interval is a stuck loop (/healthz). */
	int64_t janitor_age_ms;
	uint32_t janitor_interval_ms;
};

struct wf_floors;

struct wf_floors_opts {
	const struct wf_agent_config *cfg; /* kept by reference: must outlive the manager */
	wf_floor_event_fn on_event;        /* optional */
	void *event_ctx;
	const char *state_file;       /* NULL: registrations and pins are not persisted */
	uint32_t janitor_interval_ms; /* 0: 2000 */
};

/* Creates the manager: checks the floor directory (owned by us, not group- or world-writable),
 * probes the io backend, registers the config's models (one that fails to open fails creation,
 * naming it: a config is the operator's intent), then the state file's API models (one whose
 * file is gone is reported through on_event as an ERROR and dropped) and pins. An unreadable or
 * invalid state file fails creation. */
int wf_floors_create(const struct wf_floors_opts *opts, struct wf_floors **ret,
                     struct wf_diag *diag);

/* Scans the floor directory: re-adopts READY regions of registered models whose checksums verify,
 * removes broken ones, unheld unknown ones and orphaned lock files, and never removes what any
 * process holds. Then starts the janitor. Call once after create. *ret_adopted / *ret_removed
 * count what it did. */
int wf_floors_adopt(struct wf_floors *f, uint32_t *ret_adopted, uint32_t *ret_removed,
                    struct wf_diag *diag);

/* Starts materializing every config model marked preload (or pin_host). */
void wf_floors_preload(struct wf_floors *f);

/* Registers a model by name and path (checked against the model roots, then inventoried,
 * outside the registry lock) and persists it. The API refuses relative paths before this (the
 * agent's working directory means nothing to a client). WF_EINVAL bad name;
 * WF_EPERMISSION path outside the roots; the reader's error for a bad file; WF_ESTATE if the name
 * exists with other files (same files: succeeds, idempotent). */
int wf_floors_register(struct wf_floors *f, const char *name, const char *path, bool pin_host,
                       struct wf_diag *diag);

/* Makes sure the model has a READY floor: starts a materialization if needed (evicting LRU
 * floors to make room; WF_ENO_SPACE when it cannot fit). With wait, blocks until it is READY,
 * failed, timeout_ms passed (WF_ETIMEOUT; 0 = no limit), or *closing becomes true
 * (WF_EUNAVAILABLE). Without wait, returns 0 once the materialization has started. */
int wf_floors_ensure(struct wf_floors *f, const char *name, bool wait, uint32_t timeout_ms,
                     bool (*closing)(const void *), const void *closing_arg, struct wf_diag *diag);

/* Drops the agent's hold (cancelling a materialization in progress). The region goes when the
 * last other holder detaches. WF_ENOT_FOUND for an unknown model. Unpins too. */
int wf_floors_release(struct wf_floors *f, const char *name, struct wf_diag *diag);

/* Pins (materializing first if needed; never evicted) or unpins, and persists it. A pin that
 * cannot start (no room, a bad file) fails and leaves the model as it was, unpinned. */
int wf_floors_pin(struct wf_floors *f, const char *name, bool pin, struct wf_diag *diag);

/* One tensor of a publish, by name. */
struct wf_floor_publish_tensor {
	const char *name;
	const void *data; /* nbytes of new contents (NULL with dry_run); read during the call */
	uint64_t nbytes;
};

struct wf_floor_publish_result {
	char digest_hex[WF_DIGEST_HEX_LEN]; /* the floor's */
	uint64_t generation;                /* the new one, or (dry_run) the floor's now */
	uint64_t bytes;                     /* published (dry_run: that would be) */
	uint64_t spare_bytes, spare_used;   /* the floor's spare area and its use now */
};

/* Publishes new contents for n tensors of the model's floor as one generation
 * (wf_shm_region_publish()). The floor must be HOST or PINNED_HOST. The registry lock is held
 * only to find the model and its floor's digest: the publish goes through an attachment of its
 * own, opened read-write for the call (WF_SHM_ATTACH_WRITE), under the region's guard, so a
 * release or eviction meanwhile costs it nothing (the region goes with its last holder). On
 * success emits a WF_FLOOR_EV_PUBLISHED event (not for dry_run), writes ret_ids[i] (tensor i's
 * index in the floor) and *ret. Errors, with diag naming the model and the tensor, and nothing
 * changed: WF_ENOT_FOUND (no such model, or tensor), WF_ENOT_RESIDENT (no READY floor: DISK,
 * MATERIALIZING, FAILED, or released meanwhile), WF_EINVAL (a size or type other than the
 * tensor's, a name given twice, n == 0), WF_ENO_SPACE (the spare area cannot hold it), or the
 * publisher's (shm/region.h). Thread-safe; concurrent publishes of one floor are serialized by
 * its guard. */
int wf_floors_publish(struct wf_floors *f, const char *name,
                      const struct wf_floor_publish_tensor *tensors, uint32_t n, bool dry_run,
                      uint32_t *ret_ids, struct wf_floor_publish_result *ret, struct wf_diag *diag);

/* What a reload found and did. */
struct wf_floor_reload_result {
	char digest_hex[WF_DIGEST_HEX_LEN]; /* the floor's */
	uint64_t generation;                /* the floor's now (the new one when published) */
	bool published;                     /* the CHANGED tensors are the floor's now */
	double seconds;
	struct wf_reload_plan plan; /* per tensor (agent/reload.h); free with the result */
};
void wf_floor_reload_result_fini(struct wf_floor_reload_result *r);

/* Reloads the tensors of the model's files that changed on disk into its floor (agent/reload.h
 * decides which, by content), as one generation (wf_floors_publish(), whose PUBLISHED event
 * makes workers refresh exactly those tensors), and takes the files' identities as the floor's
 * new baseline, so the janitor's stale check and the next reload compare against them. Nothing
 * is published when a tensor is refused (the plan says which and why: *ret is filled, 0
 * returned, published false) or with dry_run. Errors, with nothing changed: WF_ENOT_FOUND,
 * WF_ENOT_RESIDENT (no READY floor), the model reader's (a truncated file, a header that lies,
 * a path out of the model roots), the planner's (WF_ESHARD, WF_ECHANGED), the publisher's
 * (WF_ENO_SPACE: the spare area is full). Every call ends with a WF_FLOOR_EV_RELOADED event.
 * Reloads are serialized (one at a time per agent); thread-safe. */
int wf_floors_reload(struct wf_floors *f, const char *name, bool dry_run,
                     struct wf_floor_reload_result *ret, struct wf_diag *diag);

/* The files of every model whose floor the agent holds (HOST or PINNED_HOST), as the model
 * reader resolved them (real_path), for the reload watch (agent/reloadwatch.h). Returns 0 and
 * *ret_n pairs (free with wf_floor_model_files_free), or -ENOMEM. Cheap: no file is touched. */
struct wf_floor_model_file {
	char *model;
	char *path;
};
int wf_floors_held_files(struct wf_floors *f, struct wf_floor_model_file **ret, size_t *ret_n);
void wf_floor_model_files_free(struct wf_floor_model_file *v, size_t n);

int wf_floors_snapshot(struct wf_floors *f, const char *name, struct wf_floor_snapshot *ret,
                       struct wf_diag *diag);
/* All models, sorted by name. Free each with wf_floor_snapshot_fini() and the array with free(). */
int wf_floors_list(struct wf_floors *f, struct wf_floor_snapshot **ret, size_t *ret_n);
void wf_floors_status(struct wf_floors *f, struct wf_floors_status *ret);

/* Cancels materializations in progress and waits for their threads, then frees everything.
 * Floors stay in the directory (READY ones for the next agent to adopt). Accepts NULL. */
void wf_floors_destroy(struct wf_floors *f);

#endif
