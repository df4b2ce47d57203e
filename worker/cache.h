/* The device weight cache: which models are on one device, and the one thread that changes it.
 *
 * Residency, per model (the lower levels are facts about the host, the upper ones about the
 * device):
 *   DISK           no floor attached: loads read the model files directly (O_DIRECT)
 *   HOST           the cache holds a read-only attachment of the model's floor; nothing on the
 *                  device
 *   DEVICE         resident and evictable: counted against the on-demand budget, LRU victim
 *   PINNED_DEVICE  resident and exempt from the budget (never an LRU victim); its bytes shrink
 *                  the on-demand budget (worker/devbudget.h)
 * A resident model keeps its floor attachment (if it had one), so a later reload is cheap and
 * the bytes it was loaded from stay mapped however the agent's own attachment comes and goes.
 *
 * Modes:
 *   SELF_MANAGED   a request (wf_cache_acquire) for a non-resident model loads it, evicting least
 *                  recently used unpinned, unacquired models until it fits;
 *   EXTERNAL       the control plane decides: acquire of a non-resident model fails at once with
 *                  WF_ENOT_RESIDENT, and residency commands never evict other models to make
 *                  room (WF_ENO_SPACE instead): evicting is the control plane's call.
 *   In both, a model larger than the whole on-demand budget loads when nothing that cannot be
 *   evicted is in the way (self-managed: after evicting everything evictable; external: when
 *   nothing unpinned is resident), with over_budget set in its status. Pinned bytes beyond the
 *   weight pool are allowed and flagged (pinned_overcommit).
 *
 * Threads. Every residency change runs on one manager thread, the sole mutator: the calls below
 * that change residency post a command to its queue and wait for it (wf_cache_prefetch may
 * return at once), so they are thread-safe and serialized, in the order they were posted.
 * Acquire, release, status and tensor lookups do not go through the queue: they take the
 * cache's mutex briefly, so a request for a resident model never waits behind a load.
 *
 * Acquire/release. A request that runs on a model holds it with wf_cache_acquire() until it
 * finishes. An acquired model is never an LRU victim, and an explicit eviction, a residency
 * change off the device, a compaction that would free it, release_all and model removal fail
 * at once with -EBUSY (nothing is changed) rather than wait: the manager thread must never
 * block on a request that might itself be waiting for the manager, and the control plane gets
 * a definite answer it can retry after draining.
 *
 * Device memory. One device allocation per weight set (or per alloc_max-sized segment of it),
 * so that an eviction returns exactly what the load took: wf_device_mem_info() goes back to its
 * level before the load. Inside the allocation tensors keep their source spacing where the gap
 * is small (a few KiB of padding and file headers at most), so a run of tensors is one read and
 * one copy; elsewhere a tensor starts at a fresh 256-byte boundary plus its source offset
 * modulo 256, so a tensor's device address has the same alignment (up to 256) as its offset in
 * the file.
 *
 * Errors: 0, -errno or WF_E*; struct wf_diag (optional) says which model and why. Library code
 * does not log: the event callback and the status snapshot carry what a daemon reports. */
#ifndef WF_WORKER_CACHE_H
#define WF_WORKER_CACHE_H

#include "base/diag.h"
#include "device/device.h"
#include "io/reader.h"
#include "model/model.h"
#include "shm/region.h"
#include "worker/devbudget.h"
#include "worker/stage.h"
#include "worker/wset.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum wf_residency {
	WF_RESIDENCY_DISK = 0,
	WF_RESIDENCY_HOST,
	WF_RESIDENCY_DEVICE,
	WF_RESIDENCY_PINNED_DEVICE,
	WF_RESIDENCY_MAX
};

enum wf_cache_mode { WF_CACHE_SELF_MANAGED = 0, WF_CACHE_EXTERNAL, WF_CACHE_MODE_MAX };

#define WF_CACHE_NAME_MAX      128u        /* bytes of a model name, NUL included */
#define WF_CACHE_MODELS_MAX    4096u       /* models registered at once */
#define WF_CACHE_CALIBRATE_MAX (64u << 20) /* bytes measured in each mode by the calibration */
#define WF_CACHE_CALIBRATE_MIN (16u << 20) /* smaller models load without calibrating */
#define WF_CACHE_ANY           UINT32_MAX  /* wf_cache_cancel(): whatever is loading */

/* The budget's inputs (worker/devbudget.h) other than the pinned bytes, which the cache tracks. */
struct wf_cache_budget {
	uint64_t arena; /* 0: the device's free memory when the cache is created */
	double weight_fraction;
	double wiggle_fraction;
	uint64_t max_scratch;
};

enum wf_cache_event_type {
	WF_CACHE_EVENT_RESIDENCY = 0, /* state changed (state, over_budget) */
	WF_CACHE_EVENT_PROGRESS,      /* a load moved bytes (done, total) */
	WF_CACHE_EVENT_LOAD_FAILED,   /* error, msg */
	WF_CACHE_EVENT_EVICTED,       /* by the LRU (reason "lru") or a command */
	WF_CACHE_EVENT_MAX
};

struct wf_cache_event {
	enum wf_cache_event_type type;
	uint32_t id;
	const char *name;
	enum wf_residency state;
	bool over_budget;
	uint64_t done, total;
	int error;
	const char *msg; /* why (NULL when nothing to say) */
	double seconds;  /* RESIDENCY announcing a completed load: how long it took; else 0 */
};

/* Called on the manager thread, without the cache's lock held; it may call the status and lookup
 * functions but must not wait for a residency command (that would deadlock the manager). */
typedef void wf_cache_event_fn(void *ctx, const struct wf_cache_event *event);

/* Zero or NULL means the default in every field. */
struct wf_cache_opts {
	enum wf_cache_mode mode;
	const struct wf_cache_budget *budget; /* NULL: arena from the device, fraction
	                                         WF_DEVBUDGET_FRACTION_DEFAULT, wiggle
	                                         WF_DEVBUDGET_WIGGLE_DEFAULT, no scratch */
	const struct wf_shm_config *shm;      /* where floors live; NULL: no floors, files only.
	                                         Copied. */
	struct wf_stage_opts stage;
	const struct wf_io_opts *io; /* the cache's own io reader */
	/* AUTO: on the first load from a floor of at least WF_CACHE_CALIBRATE_MIN bytes, measure
	 * both (up to WF_CACHE_CALIBRATE_MAX bytes each) and keep the faster for every later
	 * load; before that DIRECT (one copy instead of two). STAGED or DIRECT: always that one
	 * (DIRECT fails where the floor cannot be registered). Loads from model files are always
	 * STAGED. */
	enum wf_stage_mode load_mode;
	uint64_t alloc_max;       /* 0: one device allocation per weight set; else
	                             sets are split into allocations of at most this
	                             many bytes (a tensor larger than it gets its own) */
	wf_cache_event_fn *event; /* optional */
	void *event_ctx;
};

struct wf_cache;

/* Creates the cache for dev (borrowed; it must outlive the cache): the io reader, the stage (its
 * pinned ring) and the manager thread. Returns 0 and *ret_cache, WF_EINVAL for bad options, or
 * the error of what could not be created. */
int wf_cache_create(struct wf_device *dev, const struct wf_cache_opts *opts,
                    struct wf_cache **ret_cache, struct wf_diag *diag);

/* Shutdown in three steps. close: the load in progress is canceled, queued commands fail with
 * WF_ECANCELED, and later commands fail at once; does not block. stop: waits for the manager
 * thread to finish. destroy: stop if needed, then frees every device allocation (acquisitions
 * or not: the caller has stopped its requests), unregisters and detaches every floor, and frees
 * the cache. Each accepts NULL; close and stop are idempotent. */
void wf_cache_close(struct wf_cache *cache);
void wf_cache_stop(struct wf_cache *cache);
void wf_cache_destroy(struct wf_cache *cache);

/* ---- models -----------------------------------------------------------------------------------
 */

/* Registers a model: model is borrowed and must stay open until the model is removed or the
 * cache destroyed; name (NULL: the digest in hex) is copied and must be unique. With floors
 * configured, attaches the model's floor read-only when a READY one exists (HOST), else the
 * model starts at DISK (why: floor_error in the status). Returns 0 and *ret_id (never
 * WF_CACHE_ANY), WF_EDUPLICATE, WF_ELIMIT (too many models), WF_EINVAL. */
int wf_cache_model_add(struct wf_cache *cache, const char *name, const struct wf_model *model,
                       uint32_t *ret_id, struct wf_diag *diag);

/* Evicts the model from the device, detaches its floor and forgets it. -EBUSY while acquired,
 * WF_ENOT_FOUND. */
int wf_cache_model_remove(struct wf_cache *cache, uint32_t id, struct wf_diag *diag);

/* Id by name; 0 or WF_ENOT_FOUND. Thread-safe, does not wait for the manager. */
int wf_cache_model_find(struct wf_cache *cache, const char *name, uint32_t *ret_id);

/* ---- residency commands (through the manager thread) -------------------------------------------
 */

/* Moves the model to state:
 *   DISK           evicts it from the device (pinned or not) and detaches its floor;
 *   HOST           evicts it from the device and attaches its floor (WF_EUNSUPPORTED without
 *                  floors configured; the attach error, e.g. -ENOENT, when there is none);
 *   DEVICE         loads it, or unpins it when pinned;
 *   PINNED_DEVICE  loads it and pins it, or pins it when resident.
 * Returns 0; -EBUSY (acquired, for a move off the device); WF_ENO_SPACE (no room without
 * evicting what may not be evicted); -ENOMEM (the device refused the allocation); a load's error
 * (WF_ECANCELED when wf_cache_cancel() stopped it, ...), after which the model is where it was
 * and none of the load's device memory remains. */
int wf_cache_set_residency(struct wf_cache *cache, uint32_t id, enum wf_residency state,
                           struct wf_diag *diag);

/* set_residency(PINNED_DEVICE) and, for a pinned model, set_residency(DEVICE). unpin of a model
 * that is not pinned is WF_ESTATE. */
int wf_cache_pin(struct wf_cache *cache, uint32_t id, struct wf_diag *diag);
int wf_cache_unpin(struct wf_cache *cache, uint32_t id, struct wf_diag *diag);

/* Frees the model's device memory (to HOST or DISK, by floor). 0 when it was not resident;
 * WF_ESTATE for a pinned model (unpin it, or set its residency, first); -EBUSY while acquired. */
int wf_cache_evict(struct wf_cache *cache, uint32_t id, struct wf_diag *diag);

/* Loads the model without acquiring it (as set_residency(DEVICE) for a model not pinned). With
 * wait false the command is queued and the call returns 0 at once; the outcome shows in the
 * status (loading, last_error) and in events. */
int wf_cache_prefetch(struct wf_cache *cache, uint32_t id, bool wait, struct wf_diag *diag);

/* Frees every unpinned device allocation at once, then loads the listed models in order
 * (pinned ones stay as they are). -EBUSY, with nothing changed, if an unpinned resident model is
 * acquired. The reloads never evict one another: a model that does not fit any more fails with
 * WF_ENO_SPACE and the rest are still tried. Returns 0 or the first failure. */
int wf_cache_compact(struct wf_cache *cache, const uint32_t *ids, size_t n, struct wf_diag *diag);

/* Evicts every model, pinned ones included. -EBUSY, with nothing changed, while any model is
 * acquired. */
int wf_cache_release_all(struct wf_cache *cache, struct wf_diag *diag);

/* Changes the budget's inputs; self-managed mode then evicts LRU models until the resident
 * bytes fit (external mode only flags the excess). WF_EINVAL for bad fractions. */
int wf_cache_set_budget(struct wf_cache *cache, const struct wf_cache_budget *budget,
                        struct wf_diag *diag);

/* Switches the mode for later requests. Thread-safe, immediate. WF_EINVAL out of range. */
int wf_cache_set_mode(struct wf_cache *cache, enum wf_cache_mode mode);

/* Cancels the load of model id (WF_CACHE_ANY: whatever is loading) and drops queued loads of it
 * (prefetches, residency commands, and the loads of requests waiting in wf_cache_acquire, which
 * then return WF_ECANCELED): the load fails with WF_ECANCELED and frees its device memory. Does
 * not wait. Returns 0 when something was canceled, WF_ESTATE when nothing was loading or
 * queued. */
int wf_cache_cancel(struct wf_cache *cache, uint32_t id);

/* ---- weight sets ------------------------------------------------------------------------------
 *
 * The unit of residency is a weight set (worker/wset.h): a model is the union of its sets, which
 * wf_cache_model_add() classifies ("dense", then one "blk.N.ffn_*_exps" per layer). The model
 * calls above move all of a model's sets at once; a model is DEVICE (PINNED_DEVICE) when every
 * set is resident (pinned), and only then can it be acquired (an engine holds the sets it computes
 * from with wf_cache_acquire_sets instead). The calls below move one set (a control plane's
 * partial residency, and tests). The LRU evicts a model's unpinned sets together. */

struct wf_cache_wset_status {
	char name[WF_WSET_NAME_MAX];
	enum wf_residency state; /* the model's host level when not resident */
	uint32_t n_tensors;
	uint64_t bytes;        /* sum of tensor bytes */
	uint64_t device_bytes; /* allocated on the device (0 when not resident) */
	uint32_t n_allocs;
};

/* Number of sets of model id; a set's index by name; its status. Thread-safe, do not wait for
 * the manager. WF_ENOT_FOUND for an unknown model or set. */
int wf_cache_wset_count(struct wf_cache *cache, uint32_t id, uint32_t *ret_n);
int wf_cache_wset_find(struct wf_cache *cache, uint32_t id, const char *name, uint32_t *ret_set);
int wf_cache_wset_status(struct wf_cache *cache, uint32_t id, uint32_t set,
                         struct wf_cache_wset_status *ret_status);

/* Loads one set (pin: and pins it; a resident set is only pinned), under the same budget and
 * mode rules as a model load. Errors as wf_cache_set_residency(). */
int wf_cache_wset_load(struct wf_cache *cache, uint32_t id, uint32_t set, bool pin,
                       struct wf_diag *diag);
/* Frees one set's device memory, pinned or not. 0 when it was not resident; -EBUSY while the
 * model is acquired. */
int wf_cache_wset_evict(struct wf_cache *cache, uint32_t id, uint32_t set, struct wf_diag *diag);

/* ---- reservations ------------------------------------------------------------------------------
 *
 * Device memory that its owner, not the cache, allocated and frees: a completion engine's own
 * (its KV cache and activations on the device, the post-fetch scratchpad or expert cache slots,
 * its compute backend's workspaces; never weights, which are the store's sets). A reservation
 * counts against the on-demand budget exactly as a model's unpinned
 * sets do, and it is an item of the same LRU planner: a load, a budget change or another
 * reservation that needs room evicts it, least recently used first. While acquired it is never
 * a victim (nor are acquired models). Evicting one calls the owner's evict function on the
 * manager thread, without the cache's lock: the owner must free the memory before it returns
 * (the load that made room allocates right after) and must not wait for a residency command.
 * The reservation is gone from the table before the call (acquire fails with WF_ENOT_FOUND),
 * so the owner's own wf_cache_resv_drop() of it is a no-op. Compaction and release_all leave
 * reservations alone: the cache does not hold their memory. Events: none (the owner reports). */

/* why: "lru", "lru: device memory". */
typedef void wf_cache_resv_evict_fn(void *ctx, uint32_t resv, const char *why);

/* Charges bytes that the caller holds (or is about to allocate) on the device, under name
 * (copied; for messages), through the manager thread. Self-managed mode evicts LRU models and
 * reservations to make room; external mode evicts nothing (WF_ENO_SPACE when something would
 * have to go). Unlike a model, a reservation never goes over the budget: bytes larger than the
 * whole on-demand budget, or than what is left once everything evictable is counted out, fail
 * with WF_ENO_SPACE before anything is evicted. On success the reservation is acquired once
 * (release it when the owner's first use ends) and *ret_resv is its id (never 0). evict is
 * required. */
int wf_cache_resv_create(struct wf_cache *cache, const char *name, uint64_t bytes,
                         wf_cache_resv_evict_fn *evict, void *ctx, uint32_t *ret_resv,
                         struct wf_diag *diag);
/* Holds it for a use (a completion): it is not evicted until the matching release, which also
 * makes it the most recently used. Thread-safe, do not wait for the manager. acquire: 0, or
 * WF_ENOT_FOUND when it was evicted or dropped; release: 0, WF_ENOT_FOUND, WF_ESTATE when not
 * acquired. */
int wf_cache_resv_acquire(struct wf_cache *cache, uint32_t resv);
int wf_cache_resv_release(struct wf_cache *cache, uint32_t resv);
/* Evicts reservation resv now, as the LRU would: its owner's evict function runs (on the manager
 * thread) before this returns. 0, also when it was gone already; -EBUSY while it is acquired.
 * For an owner that wants its idle users' memory back (a residency command is about to take a
 * model away from an idle engine). */
int wf_cache_resv_evict(struct wf_cache *cache, uint32_t resv);
/* The owner freed the memory: the reservation is forgotten (acquired or not), without a call to
 * evict. Accepts a NULL cache, 0 and ids no longer there. Thread-safe, does not wait. */
void wf_cache_resv_drop(struct wf_cache *cache, uint32_t resv);

/* Evicts the least recently used evictable unpinned model or reservation, through the manager
 * thread: for an owner whose own device allocation failed (-ENOMEM) although the budget let it
 * be tried. Returns 0, or WF_ENO_SPACE when nothing may be evicted. */
int wf_cache_evict_oldest(struct wf_cache *cache, struct wf_diag *diag);

/* ---- requests
 * ------------------------------------------------------------------------------------- */

/* What an acquisition gives: the model and the device address of each of its tensors (in model
 * order), valid until the matching wf_cache_release(). */
struct wf_cache_view {
	const struct wf_model *model;
	uint32_t n_tensors;
	void *const *tensors;
};

/* Holds the model resident for a request. Resident: counts the holder and refreshes the LRU
 * stamp, without waiting for the manager. Not resident: self-managed mode loads it (as a
 * command, evicting LRU models) and acquires it in the same step; external mode fails with
 * WF_ENOT_RESIDENT. view optional. Thread-safe. */
int wf_cache_acquire(struct wf_cache *cache, uint32_t id, struct wf_cache_view *ret_view,
                     struct wf_diag *diag);
/* For an engine (engine/engine.h), which computes from the device copies of some of a model's
 * sets for its life (the dense set, the resident layers' experts: wf_engine_device_tensors names
 * their tensors): loads the sets holding a wanted tensor that are not resident (self-managed
 * mode, with the LRU making room; external mode loads nothing: the control plane decides) and
 * acquires the model, as wf_cache_acquire does, without needing every set resident: never an LRU
 * victim, an eviction fails with -EBUSY, until the matching wf_cache_release. ret_tensors (the
 * caller's array of n_tensors): the device address of each wanted tensor whose set is resident,
 * NULL for the rest (an engine on a device that reads host memory reads those in place; on one
 * that does not, it refuses with WF_ENOT_RESIDENT). Errors as wf_cache_set_residency's loads.
 * One device weight store: what the control plane pins is what the engine runs from, and a
 * byte is on the device once. */
int wf_cache_acquire_sets(struct wf_cache *cache, uint32_t id, const bool *wanted,
                          void **ret_tensors, struct wf_diag *diag);
/* The store's part of the refresh seam (docs/ARCHITECTURE.md): the model's floor published new
 * bytes of n tensors (model indices). For each one whose set is resident a new device copy is
 * made from the floor's current bytes: ret_device[i] (the caller's n pointers) gets it, NULL for
 * a tensor not resident. The tensors' lookups point at the new copies from now on; the copies
 * they replace stay valid, for the engines still reading them, until wf_cache_refresh_done (once
 * every engine of the model swapped at its step boundary). Through the manager thread. Errors:
 * WF_ESTATE (no floor attached), WF_EINVAL (an index out of range), WF_EFORMAT (the floor's entry
 * changed size), -ENOMEM: then nothing changed. */
int wf_cache_refresh(struct wf_cache *cache, uint32_t id, uint32_t n, const uint32_t *tensors,
                     void **ret_device, struct wf_diag *diag);
int wf_cache_refresh_done(struct wf_cache *cache, uint32_t id);
/* Drops one hold; WF_ESTATE if the model was not acquired, WF_ENOT_FOUND. Thread-safe. */
int wf_cache_release(struct wf_cache *cache, uint32_t id);

/* Checks that the model's device copy equals the bytes it was loaded from (floor or files):
 * wf_device_checksum per tensor against wf_device_checksum_host of the source. Holds the model
 * for the duration (it must be resident: WF_ENOT_RESIDENT otherwise, in either mode). Returns 0,
 * or WF_ECHECKSUM with diag naming the first bad tensor. Thread-safe; reads every byte. */
int wf_cache_verify(struct wf_cache *cache, uint32_t id, struct wf_diag *diag);

/* ---- status
 * -------------------------------------------------------------------------------------- */

struct wf_cache_model_status {
	uint32_t id;
	char name[WF_CACHE_NAME_MAX];
	struct wf_digest digest;
	enum wf_residency state;
	bool floor;      /* a floor attachment is held */
	int floor_error; /* why not, when floors are configured (0, -ENOENT, ...) */
	bool loading;
	uint64_t load_done, load_total;
	bool over_budget;      /* resident though larger than the on-demand budget */
	uint64_t bytes;        /* sum of tensor bytes */
	uint64_t device_bytes; /* allocated on the device (0 when not resident) */
	uint32_t n_allocs;
	unsigned acquired;  /* requests holding it */
	uint64_t lru_stamp; /* larger is more recent; 0 never used */
	double last_load_seconds, last_load_gbps;
	enum wf_stage_mode last_load_mode;
	bool last_load_from_floor;
	uint64_t loads, evictions;
	int last_error; /* of the last command on this model that failed, else 0 */
	char last_error_msg[WF_DIAG_MAX];
};

struct wf_cache_status {
	enum wf_cache_mode mode;
	struct wf_devbudget budget; /* every input and output */
	uint64_t resident_bytes;    /* unpinned weight bytes (against budget.on_demand) */
	uint64_t pinned_bytes;
	uint64_t reserved_bytes; /* reservations (against budget.on_demand too) */
	size_t n_reservations;
	bool over_budget;           /* resident_bytes + reserved_bytes > budget.on_demand */
	size_t mem_free, mem_total; /* wf_device_mem_info now */
	struct wf_stage_info stage;
	uint64_t loads, evictions, lru_evictions;
	size_t n_models;
	struct wf_cache_model_status *models; /* by id */
};

/* A consistent snapshot. Returns 0 and *ret_status (free with wf_cache_status_free), or -ENOMEM.
 * Thread-safe; does not wait for the manager (a model being loaded shows loading and progress). */
int wf_cache_status(struct wf_cache *cache, struct wf_cache_status **ret_status);
void wf_cache_status_free(struct wf_cache_status *status);

/* "DISK", "HOST", "DEVICE", "PINNED_DEVICE"; "?" out of range. Static. */
const char *wf_residency_name(enum wf_residency state);
/* "self-managed", "external"; "?". */
const char *wf_cache_mode_name(enum wf_cache_mode mode);

#ifdef __cplusplus
}
#endif
#endif
