/* The worker's protocol service: residency commands and status on the worker's own endpoint
 * (and relayed through the agent). Thread-safe: the control server calls it from several
 * threads; residency changes are serialized by the cache's manager thread.
 *
 * Other request kinds are served by modules that register with the service (a dispatch table:
 * worker/completion.c registers Generate and GenerateRead at its creation). They may call the
 * service (resolve, model); the service calls them only through the table, so the dependency
 * points one way. */
#ifndef WF_WORKER_SERVICE_H
#define WF_WORKER_SERVICE_H

#include "control/client.h"
#include "control/server.h"
#include "device/device.h"
#include "worker/cache.h"

#include <pthread.h>

#define WF_WORKER_MAX_MODELS 1024
/* The longest the worker waits for the agent to ensure a floor (a materialization reads the
 * files), and, within a request, never longer than the client's deadline allows. */
#define WF_WORKER_AGENT_MAX_MS (30 * 60 * 1000)
/* An agent not connected gets this long to come up before the worker goes on without it. */
#define WF_WORKER_AGENT_CONNECT_MS 1000
#define WF_WORKER_SVC_EXT_MAX      4 /* modules registered at once */
#define WF_WORKER_SVC_EXT_KINDS    4 /* request kinds per module */

/* What a module that serves beside the service provides (every member but handle may be NULL).
 * The service calls them from the control server's threads, concurrently; ctx is the one given
 * at registration. */
struct wf_worker_svc_ext {
	/* Serves a request of a kind the module registered, once the service has checked that it
	 * names this worker; agent_ms is what the agent may take of the request's time (to ensure
	 * a floor). The conventions of wf_ctl_handle_fn. */
	int (*handle)(void *ctx, const Weightfloor__V1__Request *req, int agent_ms,
	              Weightfloor__V1__Reply *reply, struct wf_ctl_call *call);
	/* The model was sent back to disk (SetResidency DISK succeeded). */
	void (*model_to_disk)(void *ctx, const char *model);
	/* Adds the module's figures to a model's residency (WorkerStatus, and the replies of
	 * residency commands): ModelResidency's engine fields, allocated from call. */
	void (*describe_model)(void *ctx, const char *model, Weightfloor__V1__ModelResidency *r,
	                       struct wf_ctl_call *call);
	/* A residency command is about to take device memory from a model (Evict, SetResidency
	 * below DEVICE; Compact: model NULL, every model): the module lets go of what its idle
	 * users hold of it (an idle engine's hold on the store's sets), so that the command does
	 * not fail for them; users with work running keep theirs (the command then fails with
	 * -EBUSY, as for any model in use). */
	void (*release_idle)(void *ctx, const char *model);
	/* The refresh seam (docs/ARCHITECTURE.md): the model's floor published new bytes of n
	 * tensors (model indices); device[i] is the store's new copy of ids[i], NULL where the
	 * store holds none. The module swaps them into its engines at their step boundary and
	 * returns once none reads the old bytes. 0 or an error (diag says why). */
	int (*refresh)(void *ctx, const char *model, uint32_t n, const uint32_t *ids,
	               void *const *device, struct wf_diag *diag);
};

struct wf_worker_model {
	char *name;
	char *path;
	struct wf_model *model; /* owned; stays open while registered in the cache */
	uint32_t id;
	bool in_cache;
};

struct wf_worker_svc {
	const char *worker_id;
	const char *endpoint;
	struct wf_device *dev;
	struct wf_cache *cache;
	struct wf_ctl_client *agent;     /* NULL without an agent */
	const struct wf_shm_config *shm; /* the floor directory; NULL: models from files only */
	pthread_mutex_t mu;              /* guards models; never held across a call to the agent */
	struct wf_worker_model models[WF_WORKER_MAX_MODELS];
	size_t n_models;
	int64_t started_unix_ms;
	/* The dispatch table: written by wf_worker_svc_extend before the server starts, only
	 * read afterwards. */
	struct {
		const struct wf_worker_svc_ext *ext;
		void *ctx;
		Weightfloor__V1__Request__BodyCase kinds[WF_WORKER_SVC_EXT_KINDS];
		size_t n_kinds;
	} exts[WF_WORKER_SVC_EXT_MAX];
	size_t n_exts;
};

int wf_worker_svc_init(struct wf_worker_svc *s);
void wf_worker_svc_fini(struct wf_worker_svc *s);

/* Declares a model by name and path (from --model flags); it is opened on first use. */
int wf_worker_svc_declare(struct wf_worker_svc *s, const char *name, const char *path,
                          struct wf_diag *diag);

/* Finds the model in the cache, adding it on first use. With an agent, the agent ensures the
 * node's floor (EnsureFloor, whose reply names it by digest) and the model is built from that
 * floor alone (wf_shm_region_model: tables and metadata), so the worker never opens the files and
 * need not be able to; the path from --model is used only when the agent cannot be reached or its
 * floor cannot be read. agent_ms bounds the agent's part
 * (the request's time left); an agent that is not running, or does not answer in time, costs a
 * model declared with --model nothing but the floor (it loads from its files) and fails any
 * other with the agent's error (WF_EUNAVAILABLE, WF_ETIMEOUT, ...). No lock is held while the
 * agent is asked. With for_load, a model already known whose floor is no longer attached is asked
 * for again (the agent may have released it since), within the same agent_ms. */
int wf_worker_svc_resolve(struct wf_worker_svc *s, const char *name, int agent_ms, bool for_load,
                          uint32_t *ret_id, struct wf_diag *diag);

/* The open model of a name the cache knows (resolved before), or NULL. Models stay open until
 * wf_worker_svc_fini, so the pointer stays valid as long as the service. */
const struct wf_model *wf_worker_svc_model(struct wf_worker_svc *s, const char *name);

/* The refresh seam on this worker: the model's floor published a new generation of n tensors
 * (the agent's PUBLISHED event). The store makes new device copies of those it holds
 * (wf_cache_refresh), every module swaps them in at its engines' step boundary, then the copies
 * they replaced are freed (wf_cache_refresh_done). A model the worker does not know is nothing
 * to do (0). Returns 0 or the first error; diag says which part failed. */
int wf_worker_svc_refresh(struct wf_worker_svc *s, const char *model, uint32_t n,
                          const uint32_t *ids, struct wf_diag *diag);

/* Registers a module that serves the given request kinds (at most WF_WORKER_SVC_EXT_KINDS, of
 * those the service routes to modules: Generate and GenerateRead; another kind, or one served
 * already, is refused) and follows the service's models.
 * ext and ctx are borrowed until wf_worker_svc_fini. Call before the control server starts: not
 * thread-safe. Returns 0, WF_ELIMIT (WF_WORKER_SVC_EXT_MAX modules) or WF_EINVAL. */
int wf_worker_svc_extend(struct wf_worker_svc *s, const struct wf_worker_svc_ext *ext, void *ctx,
                         const Weightfloor__V1__Request__BodyCase *kinds, size_t n_kinds);

/* wf_ctl_handle_fn; ctx is struct wf_worker_svc *. */
int wf_worker_svc_handle(void *ctx, const Weightfloor__V1__Request *req,
                         Weightfloor__V1__Reply *reply, struct wf_ctl_call *call);

/* A residency state as the protocol's Residency (ModelResidency, ReportResidency). */
Weightfloor__V1__Residency wf_worker_residency_pb(enum wf_residency r);
/* The cache's mode as the protocol's ResidencyMode (RegisterWorker, WorkerInfo). */
Weightfloor__V1__ResidencyMode wf_worker_svc_mode_pb(enum wf_cache_mode mode);

#endif
