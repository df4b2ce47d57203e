/* The engine's tensor table: an architecture's table (arch.h) resolved against a model, each
 * entry checked (present, the shape the hyperparameters imply, a type the kernels take) and
 * pointed at the caller's bytes; and no tensor of the model left that the architecture would
 * silently ignore. */
#include "engine/engine_internal.h"

#include "base/error.h"
#include "kernels/kernels.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *dtype_name(enum wf_dtype t)
{
	const struct wf_dtype_info *info = wf_dtype_info(t);
	return info ? info->name : "?";
}

static int64_t dim_value(const struct wf_arch_hparams *hp, uint8_t d)
{
	switch (d) {
	case WF_DIM_EMBD:
		return hp->n_embd;
	case WF_DIM_VOCAB:
		return hp->n_vocab;
	case WF_DIM_Q:
		return (int64_t)hp->n_head * hp->head_dim;
	case WF_DIM_KV:
		return (int64_t)hp->n_head_kv * hp->head_dim;
	case WF_DIM_HEAD:
		return hp->head_dim;
	case WF_DIM_FF:
		return hp->n_ff;
	case WF_DIM_EXPERT:
		return hp->n_expert;
	default:
		return 1;
	}
}

/* Checks model tensor idx against entry and appends it to the table; returns its handle. */
static int take(struct wf_engine *e, uint32_t idx, const struct wf_arch_tensor *entry,
                uint32_t *ret_handle, struct wf_diag *diag)
{
	const struct wf_tensor *t = &e->model->tensors[idx];
	if (e->of_model[idx] != WF_ARCH_NONE) { /* named twice (a tied role): one entry */
		*ret_handle = e->of_model[idx];
		return 0;
	}
	for (uint32_t d = 3; d < t->n_dims; d++)
		if (t->ne[d] != 1)
			return wf_diag_set(diag, WF_EFORMAT, "tensor '%s' has %u dimensions",
			                   t->name, t->n_dims);
	struct wf__tensor *w = &e->t[e->n_t];
	memset(w, 0, sizeof(*w));
	for (int d = 0; d < 3; d++) {
		const int64_t ne = d < (int)t->n_dims ? t->ne[d] : 1;
		const int64_t want = dim_value(&e->hp, entry->dims[d]);
		if (ne != want)
			return wf_diag_set(
			    diag, WF_EFORMAT,
			    "tensor '%s' has shape [%" PRId64 ", %" PRId64 ", %" PRId64
			    "], want [%" PRId64 ", %" PRId64 ", %" PRId64 "]",
			    t->name, t->ne[0], t->n_dims > 1 ? t->ne[1] : 1,
			    t->n_dims > 2 ? t->ne[2] : 1, dim_value(&e->hp, entry->dims[0]),
			    dim_value(&e->hp, entry->dims[1]), dim_value(&e->hp, entry->dims[2]));
		w->ne[d] = ne;
	}
	if (entry->flags & WF_ARCH_F32) {
		if (t->dtype != WF_DTYPE_F32)
			return wf_diag_set(diag, WF_EUNSUPPORTED,
			                   "tensor '%s' is %s; the engine wants F32", t->name,
			                   dtype_name(t->dtype));
	} else {
		const struct wf_kernel_type_ops *ops =
		    wf_kernel_ops_type(wf_kernels_cpu_ops(), t->dtype);
		if (!ops)
			return wf_diag_set(diag, WF_EUNSUPPORTED,
			                   "tensor '%s' has type %s, which the engine does not run "
			                   "(F32 F16 BF16 Q8_0 Q4_0 Q4_K Q5_K Q6_K)",
			                   t->name, dtype_name(t->dtype));
		const struct wf_dtype_info *act = wf_dtype_info(ops->vec_dot_type);
		if (!act || w->ne[0] % act->block_size != 0)
			return wf_diag_set(diag, WF_EFORMAT,
			                   "tensor '%s': rows of %" PRId64
			                   " elements do not fit %s blocks",
			                   t->name, w->ne[0], act ? act->name : "?");
	}
	w->model_index = idx;
	w->type = t->dtype;
	w->nbytes = t->nbytes;
	w->row_size = (size_t)(t->nbytes / (uint64_t)(w->ne[1] * w->ne[2]));
	w->matrix_size = w->row_size * (size_t)w->ne[1];
	w->flags = entry->flags;
	e->of_model[idx] = e->n_t;
	*ret_handle = e->n_t++;
	return 0;
}

/* Resolves one entry by its full name: its handle, or WF_ARCH_NONE for an optional one that is
 * absent (the caller applies `tied`). */
static int resolve(struct wf_engine *e, const char *name, const struct wf_arch_tensor *entry,
                   uint32_t *ret_handle, struct wf_diag *diag)
{
	const struct wf_tensor *t = wf_model_find_tensor(e->model, name);
	if (!t) {
		if (entry->flags & WF_ARCH_OPTIONAL) {
			*ret_handle = WF_ARCH_NONE;
			return 0;
		}
		return wf_diag_set(diag, WF_ENOT_FOUND, "tensor '%s' is missing", name);
	}
	return take(e, (uint32_t)(t - e->model->tensors), entry, ret_handle, diag);
}

/* Whether a layer entry applies to this model (MoE-only and dense-only entries). */
static bool applies(const struct wf_arch_hparams *hp, uint8_t flags)
{
	if ((flags & WF_ARCH_MOE) && !hp->moe)
		return false;
	if ((flags & WF_ARCH_DENSE) && hp->moe)
		return false;
	return true;
}

/* What one decode token reads per use of a table entry: a row of an embedding, the used
 * experts' share of a stack, the whole of anything else. */
static uint64_t token_bytes(const struct wf_engine *e, const struct wf_arch_tensor *entry,
                            const struct wf__tensor *t)
{
	if (entry->flags & WF_ARCH_ROWS)
		return t->row_size;
	if (entry->flags & WF_ARCH_EXPERTS)
		return (uint64_t)e->hp.n_expert_used * t->matrix_size;
	return t->nbytes;
}

int wf__tensors_resolve(struct wf_engine *e, struct wf_diag *diag)
{
	const struct wf_arch *a = e->arch;
	const struct wf_model *m = e->model;
	const struct wf_tensor *embd = wf_model_find_tensor(m, "token_embd.weight");
	if (!embd)
		return wf_diag_set(diag, WF_ENOT_FOUND, "tensor 'token_embd.weight' is missing");
	e->hp.n_vocab = embd->n_dims > 1 ? (uint32_t)embd->ne[1] : 0;
	if (m->hp.n_vocab && m->hp.n_vocab != e->hp.n_vocab)
		return wf_diag_set(diag, WF_EFORMAT,
		                   "token_embd.weight has %u rows, the vocabulary %u",
		                   e->hp.n_vocab, m->hp.n_vocab);
	const uint32_t n_roles = a->n_globals + e->hp.n_layer * a->n_layer_roles;
	e->t = calloc(n_roles ? n_roles : 1, sizeof(*e->t));
	e->layer_t = malloc((size_t)e->hp.n_layer * a->n_layer_roles * sizeof(uint32_t) + 1);
	e->global_t = malloc(a->n_globals * sizeof(uint32_t) + 1);
	e->of_model = malloc(m->n_tensors * sizeof(uint32_t) + 1);
	if (!e->t || !e->layer_t || !e->global_t || !e->of_model)
		return wf_diag_set(diag, -ENOMEM, "tensor table");
	for (uint32_t i = 0; i < m->n_tensors; i++)
		e->of_model[i] = WF_ARCH_NONE;
	int rc;
	uint64_t bytes = 0;
	for (uint32_t r = 0; r < a->n_globals; r++) {
		const struct wf_arch_tensor *g = &a->globals[r];
		if ((rc = resolve(e, g->name, g, &e->global_t[r], diag)) < 0)
			return rc;
	}
	for (uint32_t r = 0; r < a->n_globals; r++) {
		const struct wf_arch_tensor *g = &a->globals[r];
		if (e->global_t[r] == WF_ARCH_NONE && g->tied != WF_ARCH_NONE)
			e->global_t[r] = e->global_t[g->tied];
		if (e->global_t[r] != WF_ARCH_NONE) /* a tied output reads the whole matrix */
			bytes += token_bytes(e, g, &e->t[e->global_t[r]]);
	}
	char name[160];
	for (uint32_t il = 0; il < e->hp.n_layer; il++) {
		for (uint32_t r = 0; r < a->n_layer_roles; r++) {
			const struct wf_arch_tensor *l = &a->layer[r];
			uint32_t *h = &e->layer_t[il * a->n_layer_roles + r];
			*h = WF_ARCH_NONE;
			if (!applies(&e->hp, l->flags))
				continue;
			snprintf(name, sizeof(name), "blk.%u.%s.weight", il, l->name);
			if ((rc = resolve(e, name, l, h, diag)) < 0)
				return rc;
			if (*h != WF_ARCH_NONE)
				bytes += token_bytes(e, l, &e->t[*h]);
		}
	}
	for (uint32_t i = 0; i < m->n_tensors; i++)
		if (e->of_model[i] == WF_ARCH_NONE)
			return wf_diag_set(
			    diag, WF_EUNSUPPORTED,
			    "tensor '%s' is not part of the %s architecture the engine runs",
			    m->tensors[i].name, a->name);
	e->bytes_per_token = bytes;
	return 0;
}

int wf__tensors_bind(struct wf_engine *e, const struct wf_engine_weights *w, struct wf_diag *diag)
{
	const struct wf_model *m = e->model;
	for (uint32_t h = 0; h < e->n_t; h++) {
		struct wf__tensor *t = &e->t[h];
		t->host = w->host[t->model_index];
		t->device = w->device ? w->device[t->model_index] : NULL;
		if (!t->host)
			return wf_diag_set(diag, WF_EINVAL, "tensor '%s' has no data pointer",
			                   m->tensors[t->model_index].name);
	}
	return 0;
}

void wf__tensors_fini(struct wf_engine *e)
{
	free(e->t);
	free(e->layer_t);
	free(e->global_t);
	free(e->of_model);
	e->t = NULL;
	e->layer_t = e->global_t = e->of_model = NULL;
}

const void *wf__tensor_data(const struct wf__tensor *t, const struct wf__be *be)
{
	if (!be->stream)
		return t->host;
	if (t->device)
		return t->device;
	return be->ops->host_memory ? t->host : NULL;
}

struct wf_backend_matrix wf__tensor_matrix(const struct wf__tensor *t, const void *data)
{
	return (struct wf_backend_matrix){
	    .data = data,
	    .type = t->type,
	    .ne0 = t->ne[0],
	    .ne1 = t->ne[1],
	    .row_size = t->row_size,
	    .stride = t->ne[2] > 1 ? t->matrix_size : 0,
	};
}
