/* The architectures the engine runs, and the hyperparameters they share (arch.h). */
#include "engine/arch.h"

#include "base/error.h"
#include "model/kv.h"

#include <stdio.h>
#include <string.h>

extern const struct wf_arch wf__arch_qwen3moe;
extern const struct wf_arch wf__arch_llama;

static const struct wf_arch *const archs[] = {&wf__arch_qwen3moe, &wf__arch_llama};

const struct wf_arch *wf__arch_find(const char *name)
{
	for (size_t i = 0; i < sizeof(archs) / sizeof(archs[0]); i++)
		if (strcmp(archs[i]->name, name) == 0)
			return archs[i];
	return NULL;
}

const char *wf__arch_names(void)
{
	return "qwen3moe, llama";
}

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

int wf__arch_hparams(const struct wf_arch *arch, const struct wf_model *model,
                     struct wf_arch_hparams *ret, struct wf_diag *diag)
{
	const struct wf_hparams *h = &model->hp;
	struct wf_arch_hparams hp = {0};
	if (model->format != WF_MODEL_FORMAT_GGUF)
		return wf_diag_set(diag, WF_EUNSUPPORTED, "the engine runs GGUF models only");
	hp.n_layer = h->n_layer;
	hp.n_embd = h->n_embd;
	hp.n_head = h->n_head;
	hp.n_head_kv = h->n_head_kv ? h->n_head_kv : h->n_head;
	hp.head_dim = h->head_dim;
	hp.rope_dim = h->rope_dim ? h->rope_dim : h->head_dim;
	hp.n_expert = h->n_expert;
	hp.n_expert_used = h->n_expert_used;
	hp.n_ctx_train = h->n_ctx_train;
	hp.rope_base = h->rope_freq_base > 0.0f ? h->rope_freq_base : 10000.0f;
	hp.rms_eps = h->rms_eps;
	hp.moe = hp.n_expert > 0;
	/* The experts' width: qwen3moe's expert_feed_forward_length; a Mixtral-style llama keeps it
	 * in feed_forward_length (hp.n_ff_exp falls back to it). */
	hp.n_ff = hp.moe ? h->n_ff_exp : h->n_ff;
	uint32_t key_len = 0, value_len = 0;
	int rc = get_u32(model, h->arch, "attention.key_length", &key_len, diag);
	if (rc < 0 && rc != WF_ENOT_FOUND)
		return rc;
	rc = get_u32(model, h->arch, "attention.value_length", &value_len, diag);
	if (rc < 0 && rc != WF_ENOT_FOUND)
		return rc;
	if (value_len && key_len && value_len != key_len)
		return wf_diag_set(diag, WF_EUNSUPPORTED,
		                   "attention.value_length %u differs from key_length %u",
		                   value_len, key_len);
	if (!hp.n_layer || !hp.n_embd || !hp.n_head || !hp.head_dim || !hp.n_ff)
		return wf_diag_set(diag, WF_ENOT_FOUND,
		                   "%s: block_count, embedding_length, attention.head_count or "
		                   "feed_forward_length is missing",
		                   h->arch);
	if (hp.n_layer > 4096 || hp.n_head > 4096 || hp.head_dim > 4096 || hp.n_embd > (1u << 20))
		return wf_diag_set(diag, WF_ELIMIT, "%s: hyperparameters out of range", h->arch);
	if (hp.n_head % hp.n_head_kv != 0)
		return wf_diag_set(diag, WF_EFORMAT,
		                   "head_count %u is not a multiple of head_count_kv %u", hp.n_head,
		                   hp.n_head_kv);
	if (hp.rope_dim > hp.head_dim || hp.rope_dim % 2 || hp.head_dim % 2)
		return wf_diag_set(diag, WF_EFORMAT,
		                   "rope.dimension_count %u does not fit head size %u", hp.rope_dim,
		                   hp.head_dim);
	if (!(hp.rms_eps > 0.0f))
		return wf_diag_set(diag, WF_ENOT_FOUND,
		                   "%s.attention.layer_norm_rms_epsilon is missing", h->arch);
	if (hp.moe &&
	    (hp.n_expert_used == 0 || hp.n_expert_used > hp.n_expert || hp.n_expert > 4096u))
		return wf_diag_set(diag, WF_EFORMAT,
		                   "expert_used_count %u does not fit expert_count %u",
		                   hp.n_expert_used, hp.n_expert);
	if (arch->configure && (rc = arch->configure(model, &hp, diag)) < 0)
		return rc;
	*ret = hp;
	return 0;
}
