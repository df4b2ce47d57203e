/* An engine on the device weight store (worker/cache.h): the one way a worker, `wf-worker eval`,
 * the benchmarks and the tests build an engine. The tensors the engine computes from on the
 * device (wf_engine_device_tensors: the dense ones when the device computes the dense part, the
 * resident layers' expert stacks) come from the store's copies, loaded as the store's mode
 * allows and held (the model acquired) for the engine's life; everything else is read where the
 * host view has it (the floor, or the files). So what the control plane pins is what the engine
 * runs from, and a weight is on the device once. */
#ifndef WF_WORKER_WENGINE_H
#define WF_WORKER_WENGINE_H

#include "base/diag.h"
#include "engine/engine.h"
#include "worker/cache.h"

#ifdef __cplusplus
extern "C" {
#endif

struct wf_worker_engine {
	struct wf_engine *engine;
	struct wf_cache *cache; /* the store it holds the model in; NULL: none (no device copies) */
	uint32_t model_id;
	void **device;  /* per tensor: the store's copy the engine reads, or NULL */
	bool own_cache; /* wf_worker_engine_open_files made the store: close destroys it */
};

/* Builds the engine for cfg on model (registered in cache as model_id; cache NULL, or a cfg
 * without a device: host bytes only). host: the engine weights' host side (host and maps; its
 * device is ignored). Loads and holds the sets whose copies the engine wants (self-managed mode;
 * an external store holds what is resident, and a device that cannot read host memory then
 * refuses with WF_ENOT_RESIDENT). Errors: the store's and the engine's; on error nothing is
 * held. */
int wf_worker_engine_open(struct wf_cache *cache, uint32_t model_id, const struct wf_model *model,
                          const struct wf_engine_weights *host, const struct wf_engine_config *cfg,
                          struct wf_worker_engine *ret, struct wf_diag *diag);
/* A standalone engine (no worker, no agent: `wf-worker eval`, the benchmarks, the tests): a store
 * of its own on cfg->device loads the sets the engine computes from on the device, from the
 * model's files. copies: use the store on a device that can read host memory too (the host
 * device: otherwise it reads the files in place); a device that cannot (CUDA) always does. */
int wf_worker_engine_open_files(const struct wf_model *model, const struct wf_engine_weights *host,
                                const struct wf_engine_config *cfg, bool copies,
                                struct wf_worker_engine *ret, struct wf_diag *diag);
/* Destroys the engine and drops the hold (and the store it made). Accepts a zeroed one. */
void wf_worker_engine_close(struct wf_worker_engine *we);

#ifdef __cplusplus
}
#endif
#endif
