/* Weight sets: the unit of device residency. A weight set is a named list of tensor indices of
 * one model; a model is the union of its sets, each tensor in exactly one. The classification
 * (wf_wset_classify) gives
 *   "dense"              every tensor that is not a routed expert (attention, norms, embeddings,
 *                        router, shared experts)
 *   "blk.N.ffn_*_exps"   the routed experts of layer N (GGUF ffn_{gate,up,down}_exps, or the
 *                        per-expert tensors of a safetensors layer)
 *   "experts"            routed experts whose layer the name does not say
 * The cache loads, evicts and pins every set the same way (worker/cache.h). An engine's own device
 * memory (its expert cache, resident experts, dense weights and KV cache) is one reservation in the
 * same budget (cache.h, reservations), evicted by the same LRU. */
#ifndef WF_WORKER_WSET_H
#define WF_WORKER_WSET_H

#include "model/model.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define WF_WSET_NAME_MAX 64u /* bytes of a set name, NUL included */

struct wf_wset_def {
	char name[WF_WSET_NAME_MAX];
	uint32_t n_tensors;
	uint32_t *tensors; /* indices into model->tensors, ascending (model order) */
	uint64_t bytes;    /* sum of the tensors' nbytes */
};

/* Splits model's tensors into sets as above: "dense" first (present even when empty only if the
 * model has no tensors at all), then expert sets by ascending layer. Returns 0 and *ret_sets
 * (free with wf_wset_defs_free) and *ret_n, or -ENOMEM, WF_EINVAL. */
int wf_wset_classify(const struct wf_model *model, struct wf_wset_def **ret_sets, uint32_t *ret_n);
void wf_wset_defs_free(struct wf_wset_def *sets, uint32_t n);

#ifdef __cplusplus
}
#endif
#endif
