/* The engine's life: create (architecture, hyperparameters, tensor table, the executor's plan),
 * decode (batches into slices), refresh (the seam), the sequences, the counters. */
#include "engine/engine_internal.h"

#include "base/error.h"
#include "kernels/kernels.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CTX_DEFAULT_CAP 4096u

static uint32_t online_cpus(void)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);
	return n < 1 ? 1u : n > WF_ENGINE_MAX_THREADS ? WF_ENGINE_MAX_THREADS : (uint32_t)n;
}

static int check_config(const struct wf_engine_config *cfg, struct wf_diag *diag)
{
	if (cfg->kv_type >= WF_ENGINE_KV_MAX || cfg->n_seq_max > WF_ENGINE_MAX_SEQ ||
	    cfg->n_threads > WF_ENGINE_MAX_THREADS)
		return wf_diag_set(diag, WF_EINVAL, "engine configuration out of range");
	if (cfg->dense_on_device && !cfg->device)
		return wf_diag_set(diag, WF_EINVAL, "dense weights on the device need a device");
	if (cfg->experts_on_device && !cfg->device)
		return wf_diag_set(diag, WF_EINVAL, "resident experts need a device");
	return 0;
}

/* The model's architecture, hyperparameters and tensor table, into e. */
static int resolve(struct wf_engine *e, const struct wf_model *model, struct wf_diag *diag)
{
	e->model = model;
	e->arch = wf__arch_find(model->hp.arch);
	if (!e->arch)
		return wf_diag_set(diag, WF_EUNSUPPORTED, "architecture '%s' is not supported (%s)",
		                   model->hp.arch, wf__arch_names());
	int rc = wf__arch_hparams(e->arch, model, &e->hp, diag);
	if (rc == 0)
		rc = wf__tensors_resolve(e, diag);
	return rc;
}

int wf_engine_device_tensors(const struct wf_model *model, const struct wf_engine_config *cfg,
                             bool *ret_wanted, struct wf_diag *diag)
{
	wf_diag_clear(diag);
	struct wf_engine e = {0};
	int rc = check_config(cfg, diag);
	if (rc == 0)
		rc = resolve(&e, model, diag);
	if (rc == 0) {
		const struct wf_backend_ops *ops = cfg->device ? wf_backend_for(cfg->device) : NULL;
		const bool dense =
		    cfg->device && (cfg->dense_on_device || (ops && !ops->host_memory));
		const uint32_t fr = wf__first_resident(&e.hp, cfg);
		memset(ret_wanted, 0, model->n_tensors * sizeof(bool));
		for (uint32_t h = 0; h < e.n_t; h++)
			if (!(e.t[h].flags & WF_ARCH_EXPERTS))
				ret_wanted[e.t[h].model_index] = dense;
		for (uint32_t il = fr; cfg->device && il < e.hp.n_layer; il++)
			for (int r = 1; r < 4; r++)
				ret_wanted[e.t[wf_ex_tensor(&e, il, e.arch->moe_roles[r])]
				               .model_index] = true;
	}
	wf__tensors_fini(&e);
	return rc;
}

int wf_engine_create(const struct wf_model *model, const struct wf_engine_weights *weights,
                     const struct wf_engine_config *cfg, struct wf_engine **ret_engine,
                     struct wf_diag *diag)
{
	static const struct wf_engine_config defaults = {0};
	wf_diag_clear(diag);
	if (!cfg)
		cfg = &defaults;
	if (!model || !weights || !weights->host)
		return wf_diag_set(diag, WF_EINVAL, "engine without a model or weights");
	int rc = check_config(cfg, diag);
	if (rc < 0)
		return rc;
	struct wf_engine *e = calloc(1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	if (!wf_kernels_cpu_ops()) {
		enum wf_kernel_level level;
		rc = wf_kernels_cpu_level(&level);
		rc = wf_diag_set(diag, rc < 0 ? rc : WF_EUNSUPPORTED,
		                 "WF_KERNELS names a kernel level this CPU or build lacks");
		goto fail;
	}
	if ((rc = resolve(e, model, diag)) < 0 || (rc = wf__tensors_bind(e, weights, diag)) < 0)
		goto fail;
	const struct wf_arch_hparams *hp = &e->hp;
	e->n_ctx = cfg->n_ctx;
	if (!e->n_ctx)
		e->n_ctx = hp->n_ctx_train && hp->n_ctx_train < CTX_DEFAULT_CAP ? hp->n_ctx_train
		                                                                : CTX_DEFAULT_CAP;
	if (hp->n_ctx_train && e->n_ctx > hp->n_ctx_train) {
		rc =
		    wf_diag_set(diag, WF_ELIMIT, "context %u exceeds the model's context_length %u",
		                e->n_ctx, hp->n_ctx_train);
		goto fail;
	}
	e->n_seq_max = cfg->n_seq_max ? cfg->n_seq_max : 1;
	e->n_threads = cfg->n_threads ? cfg->n_threads : online_cpus();
	e->q_dim = hp->n_head * hp->head_dim;
	e->kv_dim = hp->n_head_kv * hp->head_dim;
	if ((rc = wf__exec_init(e, cfg, weights, diag)) < 0)
		goto fail;
	*ret_engine = e;
	return 0;
fail:
	wf_engine_destroy(e);
	return rc;
}

void wf_engine_destroy(struct wf_engine *e)
{
	if (!e)
		return;
	wf__exec_fini(e);
	wf__tensors_fini(e);
	free(e);
}

void wf_engine_get_info(const struct wf_engine *e, struct wf_engine_info *ret)
{
	const struct wf_arch_hparams *hp = &e->hp;
	memset(ret, 0, sizeof(*ret));
	ret->arch = e->arch->name;
	ret->n_vocab = hp->n_vocab;
	ret->n_embd = hp->n_embd;
	ret->n_layer = hp->n_layer;
	ret->n_head = hp->n_head;
	ret->n_head_kv = hp->n_head_kv;
	ret->head_dim = hp->head_dim;
	if (hp->moe) {
		ret->n_expert = hp->n_expert;
		ret->n_expert_used = hp->n_expert_used;
		ret->n_ff_exp = hp->n_ff;
	}
	ret->n_ctx = e->n_ctx;
	ret->n_seq_max = e->n_seq_max;
	ret->n_threads = e->n_threads;
	ret->weight_bytes_per_token = e->bytes_per_token;
	ret->kv_bytes = wf__seqstate_bytes(&e->seq);
	ret->scratch_bytes = e->scratch_bytes;
	ret->placement = e->placement;
	if (e->fetch) {
		struct wf__fetch_stats f;
		wf__fetch_get_stats(e->fetch, &f);
		ret->slot_bytes = f.scratchpad_bytes;
		ret->n_slots = wf__fetch_n_slots(e->fetch);
	}
	if (e->dev_handle) {
		ret->device_bytes = ret->slot_bytes + e->dev.ops->ctx_device_bytes(e->dev.ctx);
		if (e->main.stream) /* the activations and the sequence state live on the device */
			ret->device_bytes += e->abytes + ret->kv_bytes;
	}
}

/* Which backend reads tensor h under the plan. */
static const struct wf__be *reader(const struct wf_engine *e, uint32_t h)
{
	if (!(e->t[h].flags & WF_ARCH_EXPERTS))
		return &e->main;
	for (uint32_t il = e->first_resident; il < e->hp.n_layer; il++)
		for (int r = 1; r < 4; r++)
			if (wf_ex_tensor(e, il, e->arch->moe_roles[r]) == h)
				return e->dev.ctx ? &e->dev : &e->main;
	return &e->cpu;
}

/* The host-side layer holding expert stack h, or n_layer. */
static uint32_t host_side_layer(const struct wf_engine *e, uint32_t h)
{
	for (uint32_t il = 0; il < e->first_resident && il < e->hp.n_layer; il++)
		for (int r = 1; r < 4; r++)
			if (wf_ex_tensor(e, il, e->arch->moe_roles[r]) == h)
				return il;
	return e->hp.n_layer;
}

int wf_engine_refresh(struct wf_engine *e, uint32_t n, const uint32_t *tensors,
                      const struct wf_engine_weights *w, struct wf_diag *diag)
{
	wf_diag_clear(diag);
	if (!w || !w->host || (n && !tensors))
		return wf_diag_set(diag, WF_EINVAL, "refresh without tensors or weights");
	/* Everything checked before anything changes. */
	for (uint32_t i = 0; i < n; i++) {
		const uint32_t idx = tensors[i];
		if (idx >= e->model->n_tensors)
			return wf_diag_set(diag, WF_EINVAL, "tensor %u of a model of %u", idx,
			                   e->model->n_tensors);
		const uint32_t h = e->of_model[idx];
		if (h == WF_ARCH_NONE)
			continue;
		const struct wf_tensor *mt = &e->model->tensors[idx];
		const struct wf__tensor *t = &e->t[h];
		if (mt->dtype != t->type || mt->nbytes != t->nbytes)
			return wf_diag_set(
			    diag, WF_EFORMAT,
			    "tensor '%s' changed type or size: the engine refreshes bytes "
			    "only",
			    mt->name);
		if (!w->host[idx])
			return wf_diag_set(diag, WF_EINVAL, "tensor '%s' has no data pointer",
			                   mt->name);
		struct wf__tensor probe = *t;
		probe.host = w->host[idx];
		probe.device = w->device ? w->device[idx] : NULL;
		if (!wf__tensor_data(&probe, reader(e, h)))
			return wf_diag_set(diag, WF_ENOT_RESIDENT, "tensor '%s' has no copy on %s",
			                   mt->name, wf_device_name(e->dev_handle));
	}
	/* No step runs (the caller's promise) and a decode ends with the device idle, but
	 * post-fetch may still be copying a refreshed stack's old bytes into slots: those slots
	 * are forgotten after their copies land. */
	for (uint32_t i = 0; i < n; i++) {
		const uint32_t h = e->of_model[tensors[i]];
		if (h == WF_ARCH_NONE)
			continue;
		e->t[h].host = w->host[tensors[i]];
		e->t[h].device = w->device ? w->device[tensors[i]] : NULL;
		const uint32_t il = host_side_layer(e, h);
		if (e->fetch && il < e->hp.n_layer)
			wf__fetch_forget_layer(e->fetch, il);
	}
	return 0;
}

static int check_batch(const struct wf_engine *e, const struct wf_engine_batch *b,
                       struct wf_diag *diag)
{
	if (!b || (b->n && (!b->tokens || !b->pos || !b->seq)))
		return wf_diag_set(diag, WF_EINVAL, "batch without tokens, positions or sequences");
	uint32_t next[WF_ENGINE_MAX_SEQ];
	memcpy(next, e->seq.len, e->n_seq_max * sizeof(uint32_t));
	for (uint32_t i = 0; i < b->n; i++) {
		if (b->tokens[i] < 0 || (uint32_t)b->tokens[i] >= e->hp.n_vocab)
			return wf_diag_set(diag, WF_EINVAL,
			                   "token %d is outside the vocabulary of %u", b->tokens[i],
			                   e->hp.n_vocab);
		const uint32_t s = b->seq[i];
		if (s >= e->n_seq_max)
			return wf_diag_set(diag, WF_EINVAL,
			                   "sequence %u is out of range (%u sequences)", s,
			                   e->n_seq_max);
		if (b->pos[i] != next[s])
			return wf_diag_set(
			    diag, WF_EINVAL,
			    "sequence %u: position %u does not continue its %u cached "
			    "positions",
			    s, b->pos[i], next[s]);
		if (next[s] >= e->n_ctx)
			return wf_diag_set(diag, WF_ELIMIT,
			                   "sequence %u would pass the context length of %u tokens",
			                   s, e->n_ctx);
		next[s]++;
	}
	return 0;
}

int wf_engine_decode(struct wf_engine *e, const struct wf_engine_batch *b, float *logits,
                     struct wf_diag *diag)
{
	wf_diag_clear(diag);
	int rc = check_batch(e, b, diag);
	if (rc < 0)
		return rc;
	if (b->n == 0)
		return 0;
	bool last_only[UBATCH_MAX];
	float *out = logits;
	for (uint32_t s0 = 0; s0 < b->n; s0 += UBATCH_MAX) {
		const uint32_t n = b->n - s0 < UBATCH_MAX ? b->n - s0 : UBATCH_MAX;
		const bool *want = b->want_logits ? b->want_logits + s0 : last_only;
		if (!b->want_logits)
			for (uint32_t i = 0; i < n; i++)
				last_only[i] = s0 + i == b->n - 1;
		rc =
		    wf__exec_slice(e, b->tokens + s0, b->pos + s0, b->seq + s0, want, n, out, diag);
		if (rc < 0)
			return rc; /* sequence lengths unchanged: the sequences are as they were */
		for (uint32_t i = 0; i < n; i++)
			if (want[i])
				out += e->hp.n_vocab;
	}
	for (uint32_t i = 0; i < b->n; i++)
		e->seq.len[b->seq[i]] = b->pos[i] + 1;
	e->stats.decodes++;
	e->stats.tokens += b->n;
	return 0;
}

uint32_t wf_engine_seq_len(const struct wf_engine *e, uint32_t seq)
{
	return seq < e->n_seq_max ? e->seq.len[seq] : 0;
}

int wf_engine_seq_truncate(struct wf_engine *e, uint32_t seq, uint32_t pos)
{
	return wf__seqstate_truncate(&e->seq, seq, pos);
}

void wf_engine_get_stats(const struct wf_engine *e, struct wf_engine_stats *ret)
{
	*ret = e->stats;
	ret->fetch_overlap = -1;
	ret->resident_bytes = 0;
	if (e->dev.ctx && e->hp.moe)
		for (uint32_t il = e->first_resident; il < e->hp.n_layer; il++)
			for (int r = 1; r < 4; r++)
				ret->resident_bytes +=
				    e->t[wf_ex_tensor(e, il, e->arch->moe_roles[r])].nbytes;
	if (!e->fetch)
		return;
	struct wf__fetch_stats f;
	wf__fetch_get_stats(e->fetch, &f);
	ret->fetch_experts = f.experts;
	ret->fetch_bytes = f.bytes;
	ret->fetch_used = f.used;
	ret->fetch_fallbacks = f.fallbacks;
	ret->fetch_errors = f.errors;
	ret->scratchpad_bytes = f.scratchpad_bytes;
	ret->fetch_hits = f.hits;
	ret->fetch_misses = f.misses;
	ret->fetch_whole = f.whole;
	if (f.steps_timed && f.copy_ns) {
		const double hidden = 1.0 - (double)f.wait_ns_timed / (double)f.copy_ns;
		ret->fetch_overlap = hidden < 0 ? 0 : hidden;
	}
}

void wf_engine_reset_stats(struct wf_engine *e)
{
	memset(&e->stats, 0, sizeof(e->stats));
	if (e->fetch)
		wf__fetch_reset_stats(e->fetch);
}

uint32_t wf_engine_cached_experts(const struct wf_engine *e, uint32_t *ret_keys, uint32_t max)
{
	return e->fetch ? wf__fetch_keys(e->fetch, ret_keys, max) : 0;
}

void wf_engine_set_log(struct wf_engine *e, wf_engine_log_fn fn, void *arg)
{
	e->log_fn = fn;
	e->log_arg = arg;
}

void wf_engine_set_router_hook(struct wf_engine *e, wf_engine_router_fn fn, void *arg)
{
	e->router_fn = fn;
	e->router_arg = arg;
}
