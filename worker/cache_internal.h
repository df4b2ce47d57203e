/* Internal contract between the files of the device weight cache (worker/cache.h), one job each:
 *   wset.c     the table: models and their states, lookups, requests (acquire/release), status
 *   loader.c   moving bytes: floor attachment, device layout, floor or file -> device, verify
 *   manager.c  the manager thread: commands, budget and eviction decisions, create/shutdown
 * Not installed, not for other modules.
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
#ifndef WF_WORKER_CACHE_INTERNAL_H
#define WF_WORKER_CACHE_INTERNAL_H

#include "worker/cache.h"

#include <pthread.h>

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
	CMD_WSET_LOAD,
	CMD_WSET_EVICT,
	CMD_RESV_CREATE,
	CMD_EVICT_OLDEST,
	CMD_ACQUIRE_SETS,
	CMD_REFRESH,
	CMD_REFRESH_DONE,
	CMD_RESV_EVICT,
};

struct cmd {
	struct cmd *next;
	enum cmd_type type;
	uint32_t id;
	enum wf_residency state;
	uint32_t set; /* CMD_WSET_* */
	const uint32_t *ids;
	size_t n_ids;
	struct wf_cache_budget budget;
	const char *name;
	const struct wf_model *model;
	uint64_t bytes;                /* CMD_RESV_CREATE */
	wf_cache_resv_evict_fn *evict; /* CMD_RESV_CREATE */
	void *evict_ctx;
	uint32_t out_id;
	const bool *wanted; /* CMD_ACQUIRE_SETS: per tensor */
	void **out_tensors; /* CMD_ACQUIRE_SETS, CMD_REFRESH */
	bool async, done;
	int result;
	struct wf_diag diag;
};

/* One weight set's device copy. Readers look at resident/pinned/device_bytes under the lock; the
 * rest is the manager's. */
struct wset {
	struct wf_wset_def def;
	bool resident, pinned;
	bool from_floor; /* loaded from the floor (else from the model files) */
	uint32_t n_segs;
	void **seg_ptr;
	uint64_t *seg_size;
	uint64_t device_bytes;
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

	/* Derived from the sets (model_refresh_locked): every set resident is DEVICE, or
	 * PINNED_DEVICE when every set is pinned; anything less is the host level. */
	enum wf_residency state;
	bool loading;
	uint64_t load_done, load_total;
	bool over_budget;

	/* The weight sets, each tensor in exactly one (worker/wset.h). */
	uint32_t n_sets;
	struct wset *sets;
	/* Per tensor, valid for the tensors of resident sets (readers use them only while holding
	 * the model). */
	void **tensors;
	uint64_t *src_off; /* where each tensor's bytes came from (floor or file offset) */
	/* Refreshed tensors (wf_cache_refresh): a copy of their published bytes of their own, which
	 * m->tensors points at instead of the set's segment; and the copies they superseded, freed
	 * once every engine swapped (wf_cache_refresh_done). Both count in their set's
	 * device_bytes. */
	void **rcopy;
	uint64_t *rcopy_bytes;
	struct superseded {
		void *ptr;
		uint64_t bytes;
		uint32_t tensor;
	} * superseded;
	size_t n_superseded, cap_superseded;
	bool from_floor; /* of the last load */
	uint32_t n_segs; /* sums over the resident sets */
	uint64_t device_bytes;

	unsigned acquired;
	uint64_t lru;

	double last_seconds, last_gbps;
	enum wf_stage_mode last_mode;
	uint64_t loads, evictions;
	int last_error;
	char last_error_msg[WF_DIAG_MAX];
};

/* A reservation (cache.h): bytes its owner holds on the device, an LRU item like a model's
 * unpinned sets. In the table while it counts; the manager takes it out (under the lock, while
 * not acquired) before it calls the owner's evict function, and wf_cache_resv_drop takes it out
 * from any thread: whoever takes it out frees it. */
struct resv {
	uint32_t id;
	char name[WF_CACHE_NAME_MAX];
	uint64_t bytes;
	unsigned acquired;
	uint64_t lru;
	wf_cache_resv_evict_fn *evict;
	void *ctx;
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
	/* cap_resv grows on the manager thread only, so the manager may size its plans by
	 * cap_models + cap_resv outside the lock. */
	struct resv **resvs;
	size_t n_resv, cap_resv;
	uint32_t next_resv;
	uint64_t tick;

	enum wf_cache_mode mode;
	struct wf_stage_info stage_info; /* the manager's copy for status (the stage is its own) */
	struct wf_cache_budget bin;
	struct wf_devbudget budget;
	uint64_t loads, evictions, lru_evictions;
};

/* One set's copy while it loads: arrays by position in the set. */
struct devcopy {
	struct wset *set;
	uint32_t n_segs;
	void **seg_ptr;
	uint64_t *seg_size;
	void **tensors;
	uint64_t *src_off;
	uint32_t *seg_of;
	uint64_t *dev_off;
	bool from_floor;
	uint64_t bytes;
};

/* A load's progress across its sets. */
struct progress_ctx {
	struct wf_cache *c;
	struct model *m;
	uint64_t base;
	uint64_t last_event;
};

#define ALL_SETS UINT32_MAX

static inline bool resident(const struct model *m)
{
	return m->state == WF_RESIDENCY_DEVICE || m->state == WF_RESIDENCY_PINNED_DEVICE;
}

static inline enum wf_residency host_level(const struct model *m)
{
	return m->region ? WF_RESIDENCY_HOST : WF_RESIDENCY_DISK;
}

/* wset.c */

/* Bytes of the model's resident sets that are (not) pinned. Lock held or manager. */
uint64_t wf__cache_set_bytes(const struct model *m, bool pinned);
/* Whether the model has a resident set that is (not) pinned. */
bool wf__cache_any_set(const struct model *m, bool pinned);
/* Bytes of every reservation. Lock held. */
uint64_t wf__cache_resv_bytes_locked(const struct wf_cache *c);
/* Takes reservation id out of the table. Lock held. NULL when it is not there. */
struct resv *wf__cache_resv_take_locked(struct wf_cache *c, uint32_t id);
/* Recomputes the model's state and totals from its sets. Lock held. */
void wf__cache_model_refresh_locked(struct model *m);
/* Builds the model's sets and per-tensor arrays (cmd_add); frees them and m. */
int wf__cache_model_sets_init(struct model *m);
void wf__cache_model_free(struct model *m);

enum wf_cache_mode wf__cache_mode_get(struct wf_cache *c);
/* Called with the lock held. */
struct model *wf__cache_find_locked(struct wf_cache *c, uint32_t id);
/* Recomputes the budget from its inputs and the pinned bytes. Lock held. */
void wf__cache_budget_update_locked(struct wf_cache *c);
void wf__cache_emit(struct wf_cache *c, enum wf_cache_event_type type, const struct model *m,
                    int error, const char *msg);
void wf__cache_set_error(struct wf_cache *c, struct model *m, int err, const struct wf_diag *diag);
/* Acquires a resident model under the lock. 1 when done, 0 when not resident, <0 error. */
int wf__cache_try_acquire_locked(struct wf_cache *c, uint32_t id, struct wf_cache_view *view);

/* loader.c */

/* Attaches the model's floor if floors are configured and a READY one exists. Never waits on a
 * materialization in progress (NOWAIT): loading from the files meanwhile is as fast as waiting.
 * Returns 0 or the attach error (also kept in floor_error). */
int wf__cache_floor_attach(struct wf_cache *c, struct model *m, struct wf_diag *diag);
/* Unregisters and detaches the floor. Only when the model is not resident (nothing on the device
 * may still be read from the mapping: copies finished when the load returned). */
void wf__cache_floor_detach(struct wf_cache *c, struct model *m);
void wf__cache_devcopy_free(struct wf_cache *c, struct devcopy *d);
/* The device layout of d->set (see the top of cache.h): per tensor a segment and an offset in
 * it. d->from_floor says where from. */
int wf__cache_layout(struct wf_cache *c, struct model *m, struct devcopy *d, struct wf_diag *diag);
/* Device address of each of the set's tensors, once its segments are allocated. */
void wf__cache_fill_pointers(struct devcopy *d);
/* Moves the bytes of the set's tensors into d's allocations; progress continues from pc->base
 * (advanced by the set's bytes). */
int wf__cache_transfer(struct wf_cache *c, struct model *m, struct devcopy *d,
                       struct progress_ctx *pc, struct wf_stage_stats *ret_stats,
                       struct wf_diag *diag);

/* manager.c */

/* Posts k and, unless it is async (then heap-allocated and freed by the manager), waits for it. */
int wf__cache_post(struct wf_cache *c, struct cmd *k, struct wf_diag *diag);

#endif
