/* An engine on the device weight store (wengine.h). */
#include "worker/wengine.h"

#include "base/error.h"
#include "kernels/backend.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int wf_worker_engine_open(struct wf_cache *cache, uint32_t model_id, const struct wf_model *model,
                          const struct wf_engine_weights *host, const struct wf_engine_config *cfg,
                          struct wf_worker_engine *ret, struct wf_diag *diag)
{
	struct wf_worker_engine we = {0};
	struct wf_engine_weights w = *host;
	w.device = NULL;
	int rc = 0;
	bool *wanted = NULL;
	if (cache && cfg->device) {
		wanted = calloc(model->n_tensors ? model->n_tensors : 1, sizeof(bool));
		we.device = calloc(model->n_tensors ? model->n_tensors : 1, sizeof(void *));
		if (!wanted || !we.device) {
			rc = wf_diag_set(diag, -ENOMEM, "engine weights");
			goto fail;
		}
		if ((rc = wf_engine_device_tensors(model, cfg, wanted, diag)) < 0)
			goto fail;
		bool any = false;
		for (uint32_t i = 0; i < model->n_tensors && !any; i++)
			any = wanted[i];
		if (!any) {
			free(we.device); /* nothing to hold */
			we.device = NULL;
		} else {
			if ((rc = wf_cache_acquire_sets(cache, model_id, wanted, we.device, diag)) <
			    0)
				goto fail;
			we.cache = cache;
			we.model_id = model_id;
			w.device = we.device;
		}
	}
	if ((rc = wf_engine_create(model, &w, cfg, &we.engine, diag)) < 0)
		goto fail;
	free(wanted);
	*ret = we;
	return 0;
fail:
	free(wanted);
	wf_worker_engine_close(&we);
	return rc;
}

int wf_worker_engine_open_files(const struct wf_model *model, const struct wf_engine_weights *host,
                                const struct wf_engine_config *cfg, bool copies,
                                struct wf_worker_engine *ret, struct wf_diag *diag)
{
	const struct wf_backend_ops *ops = cfg->device ? wf_backend_for(cfg->device) : NULL;
	struct wf_cache *cache = NULL;
	uint32_t id = 0;
	int rc = 0;
	if (cfg->device && (copies || (ops && !ops->host_memory))) {
		rc = wf_cache_create(cfg->device, NULL, &cache, diag);
		if (rc == 0)
			rc = wf_cache_model_add(cache, NULL, model, &id, diag);
	}
	if (rc == 0)
		rc = wf_worker_engine_open(cache, id, model, host, cfg, ret, diag);
	if (rc < 0) {
		wf_cache_close(cache);
		wf_cache_destroy(cache);
		return rc;
	}
	ret->cache = cache; /* held or not, it is this engine's to destroy */
	ret->own_cache = cache != NULL;
	return 0;
}

void wf_worker_engine_close(struct wf_worker_engine *we)
{
	wf_engine_destroy(we->engine);
	if (we->cache && we->device)
		(void)wf_cache_release(we->cache, we->model_id);
	if (we->own_cache) {
		wf_cache_close(we->cache);
		wf_cache_destroy(we->cache);
	}
	free(we->device);
	memset(we, 0, sizeof(*we));
}
