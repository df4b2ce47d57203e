/* Resolves a model's tensors into the engine's weight view and checks them: the architecture,
 * every tensor it needs with a type the kernels run and the shape the hyperparameters imply, and
 * no tensor the engine would silently ignore (a bias, a per-expert split layout). */
#include "engine/engine_internal.h"

#include "base/error.h"
#include "model/kv.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct resolver {
	const struct wf_model *model;
	const void *const *data;
	const struct wf_kernel_ops *ops;
	bool *used; /* per model tensor */
	struct wf_diag *diag;
};

static const char *dtype_name(enum wf_dtype t)
{
	const struct wf_dtype_info *info = wf_dtype_info(t);
	return info ? info->name : "?";
}

/* Finds NAME, checks its dims against want (0: any; trailing 1s implied) and its type. f32_only:
 * norms and other vectors read directly. */
static int take(struct resolver *r, const char *name, const int64_t want[3], bool f32_only,
                bool optional, struct wf__wt *ret)
{
	memset(ret, 0, sizeof(*ret));
	const struct wf_tensor *t = wf_model_find_tensor(r->model, name);
	if (!t) {
		if (optional)
			return 0;
		return wf_diag_set(r->diag, WF_ENOT_FOUND, "tensor '%s' is missing", name);
	}
	const uint32_t idx = (uint32_t)(t - r->model->tensors);
	r->used[idx] = true;
	for (uint32_t d = 3; d < t->n_dims; d++)
		if (t->ne[d] != 1)
			return wf_diag_set(r->diag, WF_EFORMAT, "tensor '%s' has %u dimensions",
			                   name, t->n_dims);
	for (int d = 0; d < 3; d++) {
		const int64_t ne = d < (int)t->n_dims ? t->ne[d] : 1;
		if (want[d] && ne != want[d])
			return wf_diag_set(r->diag, WF_EFORMAT,
			                   "tensor '%s' has shape [%" PRId64 ", %" PRId64
			                   ", %" PRId64 "], want [%" PRId64 ", %" PRId64
			                   ", %" PRId64 "]",
			                   name, t->ne[0], t->n_dims > 1 ? t->ne[1] : 1,
			                   t->n_dims > 2 ? t->ne[2] : 1, want[0],
			                   want[1] ? want[1] : 1, want[2] ? want[2] : 1);
		ret->ne[d] = ne;
	}
	if (f32_only && t->dtype != WF_DTYPE_F32)
		return wf_diag_set(r->diag, WF_EUNSUPPORTED,
		                   "tensor '%s' is %s; the engine wants F32", name,
		                   dtype_name(t->dtype));
	if (!f32_only) {
		ret->ops = wf_kernel_ops_type(r->ops, t->dtype);
		if (!ret->ops)
			return wf_diag_set(r->diag, WF_EUNSUPPORTED,
			                   "tensor '%s' has type %s, which the engine does not run "
			                   "(F32 F16 BF16 Q8_0 Q4_0 Q4_K Q5_K Q6_K)",
			                   name, dtype_name(t->dtype));
		const struct wf_dtype_info *act = wf_dtype_info(ret->ops->vec_dot_type);
		if (!act || ret->ne[0] % act->block_size != 0)
			return wf_diag_set(r->diag, WF_EFORMAT,
			                   "tensor '%s': rows of %" PRId64
			                   " elements do not fit %s blocks",
			                   name, ret->ne[0], act ? act->name : "?");
	}
	if (!r->data[idx])
		return wf_diag_set(r->diag, WF_EINVAL, "tensor '%s' has no data pointer", name);
	ret->data = r->data[idx];
	ret->type = t->dtype;
	ret->row_size = (size_t)(t->nbytes / (uint64_t)(ret->ne[1] * ret->ne[2]));
	ret->matrix_size = ret->row_size * (size_t)ret->ne[1];
	return 0;
}

#define V3(a, b, c) ((const int64_t[3]){(a), (b), (c)})

static int get_u32(const struct wf_model *m, const char *arch, const char *key, uint32_t *ret,
                   struct wf_diag *diag)
{
	char full[128];
	snprintf(full, sizeof(full), "%s.%s", arch, key);
	uint64_t v;
	int rc = wf_kv_get_u64(&m->kv, full, &v);
	if (rc == WF_ENOT_FOUND)
		return rc;
	if (rc < 0 || v > UINT32_MAX)
		return wf_diag_set(diag, WF_EFORMAT, "key '%s' is not a 32-bit count", full);
	*ret = (uint32_t)v;
	return 0;
}

static int resolve_layer(struct resolver *r, struct wf__weights *w, uint32_t il)
{
	struct wf__layer *L = &w->layers[il];
	const int64_t E = w->n_embd, Q = (int64_t)w->n_head * w->head_dim,
	              KV = (int64_t)w->n_head_kv * w->head_dim;
	char name[96];
	int rc;
#define TAKE(field, suffix, shape, f32, opt)                                                       \
	do {                                                                                       \
		snprintf(name, sizeof(name), "blk.%u.%s.weight", il, suffix);                      \
		if ((rc = take(r, name, shape, f32, opt, &L->field)) < 0)                          \
			return rc;                                                                 \
	} while (0)
	TAKE(attn_norm, "attn_norm", V3(E, 1, 1), true, false);
	TAKE(wq, "attn_q", V3(E, Q, 1), false, false);
	TAKE(wk, "attn_k", V3(E, KV, 1), false, false);
	TAKE(wv, "attn_v", V3(E, KV, 1), false, false);
	TAKE(wo, "attn_output", V3(Q, E, 1), false, false);
	if (w->qk_norm) {
		TAKE(q_norm, "attn_q_norm", V3(w->head_dim, 1, 1), true, false);
		TAKE(k_norm, "attn_k_norm", V3(w->head_dim, 1, 1), true, false);
	}
	TAKE(ffn_norm, "ffn_norm", V3(E, 1, 1), true, false);
	if (w->moe) {
		const int64_t X = w->n_expert, F = w->n_ff;
		TAKE(gate_inp, "ffn_gate_inp", V3(E, X, 1), false, false);
		TAKE(gate_exps, "ffn_gate_exps", V3(E, F, X), false, false);
		TAKE(up_exps, "ffn_up_exps", V3(E, F, X), false, false);
		TAKE(down_exps, "ffn_down_exps", V3(F, E, X), false, false);
	} else {
		const int64_t F = w->n_ff;
		TAKE(ffn_gate, "ffn_gate", V3(E, F, 1), false, false);
		TAKE(ffn_up, "ffn_up", V3(E, F, 1), false, false);
		TAKE(ffn_down, "ffn_down", V3(F, E, 1), false, false);
	}
#undef TAKE
	return 0;
}

int wf__weights_resolve(const struct wf_model *model, const void *const *tensor_data,
                        const struct wf_kernel_ops *ops, struct wf__weights *w,
                        struct wf_diag *diag)
{
	memset(w, 0, sizeof(*w));
	const struct wf_hparams *hp = &model->hp;
	if (model->format != WF_MODEL_FORMAT_GGUF)
		return wf_diag_set(diag, WF_EUNSUPPORTED, "the engine runs GGUF models only");
	if (strcmp(hp->arch, "qwen3moe") == 0) {
		w->rope = WF__ROPE_NEOX;
		w->qk_norm = true;
	} else if (strcmp(hp->arch, "llama") == 0) {
		w->rope = WF__ROPE_NORM;
	} else {
		return wf_diag_set(diag, WF_EUNSUPPORTED,
		                   "architecture '%s' is not supported (qwen3moe, llama)",
		                   hp->arch);
	}
	snprintf(w->arch, sizeof(w->arch), "%s", hp->arch);
	w->n_layer = hp->n_layer;
	w->n_embd = hp->n_embd;
	w->n_head = hp->n_head;
	w->n_head_kv = hp->n_head_kv ? hp->n_head_kv : hp->n_head;
	w->head_dim = hp->head_dim;
	w->rope_dim = hp->rope_dim ? hp->rope_dim : hp->head_dim;
	w->n_expert = hp->n_expert;
	w->n_expert_used = hp->n_expert_used;
	w->n_ctx_train = hp->n_ctx_train;
	w->rope_base = hp->rope_freq_base > 0.0f ? hp->rope_freq_base : 10000.0f;
	w->rms_eps = hp->rms_eps;
	w->moe = w->n_expert > 0;
	/* The experts' width: qwen3moe's expert_feed_forward_length; a Mixtral-style llama keeps it
	 * in feed_forward_length (hp.n_ff_exp falls back to it). */
	w->n_ff = w->moe ? hp->n_ff_exp : hp->n_ff;
	uint32_t key_len = 0, value_len = 0;
	int krc = get_u32(model, hp->arch, "attention.key_length", &key_len, diag);
	if (krc < 0 && krc != WF_ENOT_FOUND)
		return krc;
	krc = get_u32(model, hp->arch, "attention.value_length", &value_len, diag);
	if (krc < 0 && krc != WF_ENOT_FOUND)
		return krc;
	if (value_len && key_len && value_len != key_len)
		return wf_diag_set(diag, WF_EUNSUPPORTED,
		                   "attention.value_length %u differs from key_length %u",
		                   value_len, key_len);
	if (!w->n_layer || !w->n_embd || !w->n_head || !w->head_dim || !w->n_ff)
		return wf_diag_set(diag, WF_ENOT_FOUND,
		                   "%s: block_count, embedding_length, attention.head_count or "
		                   "feed_forward_length is missing",
		                   hp->arch);
	if (w->n_layer > 4096 || w->n_head > 4096 || w->head_dim > 4096 || w->n_embd > (1u << 20))
		return wf_diag_set(diag, WF_ELIMIT, "%s: hyperparameters out of range", hp->arch);
	if (w->n_head % w->n_head_kv != 0)
		return wf_diag_set(diag, WF_EFORMAT,
		                   "head_count %u is not a multiple of head_count_kv %u", w->n_head,
		                   w->n_head_kv);
	if (w->rope_dim > w->head_dim || w->rope_dim % 2 || w->head_dim % 2)
		return wf_diag_set(diag, WF_EFORMAT,
		                   "rope.dimension_count %u does not fit head size %u", w->rope_dim,
		                   w->head_dim);
	if (!(w->rms_eps > 0.0f))
		return wf_diag_set(diag, WF_ENOT_FOUND,
		                   "%s.attention.layer_norm_rms_epsilon is missing", hp->arch);
	if (w->moe && (w->n_expert_used == 0 || w->n_expert_used > w->n_expert ||
	               w->n_expert > WF__MAX_EXPERTS))
		return wf_diag_set(diag, WF_EFORMAT,
		                   "expert_used_count %u does not fit expert_count %u",
		                   w->n_expert_used, w->n_expert);

	struct resolver r = {model, tensor_data, ops, calloc(model->n_tensors, sizeof(bool)), diag};
	w->layers = calloc(w->n_layer, sizeof(*w->layers));
	int rc = -ENOMEM;
	if (!r.used || !w->layers)
		goto out;
	const struct wf_tensor *embd = wf_model_find_tensor(model, "token_embd.weight");
	if (!embd) {
		rc = wf_diag_set(diag, WF_ENOT_FOUND, "tensor 'token_embd.weight' is missing");
		goto out;
	}
	w->n_vocab = embd->n_dims > 1 ? (uint32_t)embd->ne[1] : 0;
	if (hp->n_vocab && hp->n_vocab != w->n_vocab) {
		rc = wf_diag_set(diag, WF_EFORMAT,
		                 "token_embd.weight has %u rows, the vocabulary %u", w->n_vocab,
		                 hp->n_vocab);
		goto out;
	}
	if ((rc = take(&r, "token_embd.weight", V3(w->n_embd, w->n_vocab, 1), false, false,
	               &w->tok_embd)) < 0)
		goto out;
	if ((rc = take(&r, "output_norm.weight", V3(w->n_embd, 1, 1), true, false,
	               &w->output_norm)) < 0)
		goto out;
	if ((rc = take(&r, "output.weight", V3(w->n_embd, w->n_vocab, 1), false, true,
	               &w->output)) < 0)
		goto out;
	if (!w->output.data)
		w->output = w->tok_embd; /* tied embeddings */
	for (uint32_t il = 0; il < w->n_layer; il++)
		if ((rc = resolve_layer(&r, w, il)) < 0)
			goto out;
	for (uint32_t i = 0; i < model->n_tensors; i++) {
		if (!r.used[i] && strcmp(model->tensors[i].name, "rope_freqs.weight") != 0) {
			rc = wf_diag_set(
			    diag, WF_EUNSUPPORTED,
			    "tensor '%s' is not part of the %s architecture the engine runs",
			    model->tensors[i].name, hp->arch);
			goto out;
		}
	}
	/* Bytes one decode token reads: every dense matrix whole, one embedding row, and the used
	 * experts' share of the expert stacks. */
	uint64_t bytes = w->tok_embd.row_size + w->output.matrix_size + w->n_embd * 4u;
	for (uint32_t il = 0; il < w->n_layer; il++) {
		const struct wf__layer *L = &w->layers[il];
		bytes +=
		    L->wq.matrix_size + L->wk.matrix_size + L->wv.matrix_size + L->wo.matrix_size;
		bytes += 2u * w->n_embd * 4u;
		if (w->moe)
			bytes += L->gate_inp.matrix_size +
			         (uint64_t)w->n_expert_used *
			             (L->gate_exps.matrix_size + L->up_exps.matrix_size +
			              L->down_exps.matrix_size);
		else
			bytes += L->ffn_gate.matrix_size + L->ffn_up.matrix_size +
			         L->ffn_down.matrix_size;
	}
	w->bytes_per_token = bytes;
	rc = 0;
out:
	free(r.used);
	if (rc < 0)
		wf__weights_fini(w);
	return rc;
}

void wf__weights_fini(struct wf__weights *w)
{
	free(w->layers);
	w->layers = NULL;
}
