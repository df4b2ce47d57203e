/* The agent's floor manager: the model registry, materialization, the host budget with LRU
 * eviction, pinning, and re-adoption of regions left by an earlier agent.
 *
 * States of a registered model (FloorState in the protocol):
 *   DISK          registered; the agent holds no region for it
 *   MATERIALIZING a thread is copying its files into a new region (progress below)
 *   HOST          the agent holds a READY region; evictable when no other process holds it
 *   PINNED_HOST   the same, never evicted
 *   FAILED        the last materialization failed (last_error says why); ensure retries
 *
 * The agent holds one attachment (a holders SH lock) on every HOST/PINNED_HOST floor, so a floor
 * lives as long as the agent wants it, whatever workers do. Eviction drops that attachment: the
 * region goes when its last holder goes. Stopping the agent does not drop floors (its flocks go
 * with the process; regions stay READY) so that a restarted agent re-adopts them at once.
 *
 * Thread-safety: every function may be called from any thread (the control server calls them
 * from several). One mutex guards the registry; materializations run in their own threads and
 * block no request. */
#ifndef WF_AGENT_FLOORS_H
#define WF_AGENT_FLOORS_H

#include "agent/config.h"
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
};
struct wf_floor_event {
	enum wf_floor_event_kind kind;
	const char *model;
	enum wf_floor_state state;
	uint64_t bytes_done, bytes_total, rate_bytes_per_s;
	int code;            /* ERROR: the failure */
	const char *message; /* ERROR, and STATE changes worth a word (evicted, adopted) */
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
	uint32_t holder_count; /* processes holding the region, the agent included */
	uint32_t n_holder_pids;
	pid_t holder_pids[WF_FLOOR_MAX_PIDS];
};
void wf_floor_snapshot_fini(struct wf_floor_snapshot *s);

struct wf_floors_status {
	uint64_t host_budget, host_used;
	const char *reader_backend; /* "io_uring" or "pread" (static) */
	bool o_direct;
	int uring_err;              /* why io_uring is not used, 0 if it is */
	uint32_t n_models, n_disk, n_materializing, n_host, n_pinned, n_failed;
	uint32_t adopted, removed;  /* at start */
};

struct wf_floors;

struct wf_floors_opts {
	const struct wf_agent_config *cfg; /* kept by reference: must outlive the manager */
	wf_floor_event_fn on_event;         /* optional */
	void *event_ctx;
};

/* Creates the manager: checks the floor directory, probes the io backend, registers the config's
 * models (a model that fails to open is logged by the caller through the returned per-model
 * errors? no: it fails creation, naming the model, since a config is the operator's intent). */
int wf_floors_create(const struct wf_floors_opts *opts, struct wf_floors **ret, struct wf_diag *diag);

/* Scans the floor directory: re-adopts READY regions of registered models, removes broken ones,
 * unheld unknown ones and orphaned lock files, and leaves alone what another process holds. Call
 * once after create. *ret_adopted / *ret_removed count what it did. */
int wf_floors_adopt(struct wf_floors *f, uint32_t *ret_adopted, uint32_t *ret_removed,
		    struct wf_diag *diag);

/* Starts materializing every config model marked preload (or pin_host). */
void wf_floors_preload(struct wf_floors *f);

/* Registers a model by name and path (checked against the model roots, then inventoried).
 * WF_EINVAL bad name; WF_EPERMISSION path outside the roots; the reader's error for a bad file;
 * WF_ESTATE if the name exists with other files (same files: succeeds, idempotent). */
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

/* Pins (materializing first if needed; never evicted) or unpins. */
int wf_floors_pin(struct wf_floors *f, const char *name, bool pin, struct wf_diag *diag);

int wf_floors_snapshot(struct wf_floors *f, const char *name, struct wf_floor_snapshot *ret,
		       struct wf_diag *diag);
/* All models, sorted by name. Free each with wf_floor_snapshot_fini() and the array with free(). */
int wf_floors_list(struct wf_floors *f, struct wf_floor_snapshot **ret, size_t *ret_n);
void wf_floors_status(struct wf_floors *f, struct wf_floors_status *ret);

/* Cancels materializations in progress and waits for their threads, then frees everything.
 * Floors stay in the directory (READY ones for the next agent to adopt). Accepts NULL. */
void wf_floors_destroy(struct wf_floors *f);

#endif
