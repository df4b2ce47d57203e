/* The worker's protocol service: residency commands and status on the worker's own endpoint
 * (and relayed through the agent). Thread-safe: the control server calls it from several
 * threads; residency changes are serialized by the cache's manager thread. */
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
	struct wf_ctl_client *agent;        /* NULL without an agent */
	struct wf_completions *completions; /* Generate (worker/completion.h); NULL: not served */
	const struct wf_shm_config *shm;    /* the floor directory; NULL: models from files only */
	pthread_mutex_t mu; /* guards models; never held across a call to the agent */
	struct wf_worker_model models[WF_WORKER_MAX_MODELS];
	size_t n_models;
	int64_t started_unix_ms;
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

/* wf_ctl_handle_fn; ctx is struct wf_worker_svc *. */
int wf_worker_svc_handle(void *ctx, const Weightfloor__V1__Request *req,
                         Weightfloor__V1__Reply *reply, struct wf_ctl_call *call);

/* A residency state as the protocol's Residency (ModelResidency, ReportResidency). */
Weightfloor__V1__Residency wf_worker_residency_pb(enum wf_residency r);
/* The cache's mode as the protocol's ResidencyMode (RegisterWorker, WorkerInfo). */
Weightfloor__V1__ResidencyMode wf_worker_svc_mode_pb(enum wf_cache_mode mode);

#endif
