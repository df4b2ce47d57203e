/* The weight view a worker hands the engine (engine/engine.h): one pointer per tensor of a model,
 * into memory that holds the tensor's bytes in place. Two sources:
 *  - a floor (shm/region.h): tensor i at the mapping's base + its floor offset; every worker on
 *    the node reads the same pages;
 *  - the model's files, mapped read-only and shared (no agent: `wf-worker eval`, a worker without
 *    a floor), so the page cache is the only copy.
 * A view owns its file mappings (not a floor's: the floor stays attached by its owner for as long
 * as the view is used). Both prefault the pages into this process's page tables in parallel
 * (MADV_POPULATE_READ), since a MoE model's first tokens touch nearly all of them. */
#ifndef WF_WORKER_WEIGHTS_H
#define WF_WORKER_WEIGHTS_H

#include "base/diag.h"
#include "engine/engine.h"
#include "model/model.h"

#ifdef __cplusplus
extern "C" {
#endif

struct wf_shm_region;

struct wf_weight_view {
	const void **tensor_data; /* [model->n_tensors] */
	/* The mappings the bytes lie in: each file's (owned: unmapped on release), or the floor
	 * region's (borrowed). */
	uint32_t n_maps;
	struct wf_engine_mapping *maps;
	bool own_maps;
};

/* The view as the engine takes it (host bytes and their mappings; no device copies). */
struct wf_engine_weights wf_weight_view_engine(const struct wf_weight_view *view);

/* Maps every file of model (opened again through wf_model_file_open, and refused with
 * WF_ECHANGED when a file is no longer the one the model was read from). Returns 0 and fills
 * *ret_view; on error nothing stays mapped. */
int wf_weight_view_map_files(const struct wf_model *model, struct wf_weight_view *ret_view,
                             struct wf_diag *diag);
/* Points the view at a floor's tensors (the region's model must be model, in the same order:
 * wf_shm_region_model builds it so). */
int wf_weight_view_from_floor(const struct wf_model *model, const struct wf_shm_region *region,
                              struct wf_weight_view *ret_view, struct wf_diag *diag);
/* Unmaps what the view mapped and frees it; accepts a zeroed view. */
void wf_weight_view_release(struct wf_weight_view *view);

#ifdef __cplusplus
}
#endif
#endif
