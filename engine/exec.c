/* The executor: the placement plan, the buffers, and the dense ops an architecture's graph is
 * written with (exec.h); the routed experts are moe.c's.
 *
 * The plan, made once at create from the config and the device's backend (kernels/backend.h):
 *   main   computes the dense part and holds the activations and the sequence state: the
 *          device's backend when the device computes the dense part (always on CUDA; on the
 *          host device with dense_on_device), else the CPU (the host backend without a stream).
 *   dev    the device's backend (== main when main is the device; none without a device):
 *          resident experts, the expert cache's whole hits, post-fetched down projections.
 *   cpu    the host backend without a stream: host-side experts read from the floor in place.
 * Where main computes on host memory (the CPU, the host device) the three share every buffer;
 * where it computes on its own memory (CUDA) pinned staging buffers carry the host-side
 * experts' inputs and outputs, and only the layers with host-side experts wait for the device
 * (the routing must come back to decide where each expert runs). A tensor is read where each
 * backend reads it (wf__tensor_data): the device weight store's copy on a device, the floor in
 * place on the CPU and, without a copy, on the host device.
 *
 * Numerics: every backend op computes what the host backend computes (bit for bit on the host
 * kind: tests/data/golden holds the logits of the engine this executor replaced, and every
 * placement on the host device gives them), so the output does not depend on the plan beyond
 * the device's stated tolerance. */
#include "engine/engine_internal.h"

#include "base/error.h"
#include "kernels/pool.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { I_TOK, I_POS, I_KV_FIRST, I_N_KV, I_DST, I_OUT, I_N };

static size_t align256(size_t n)
{
	return (n + 255u) & ~(size_t)255u;
}

static size_t s_rows(const struct wf_engine *e)
{
	return (size_t)UBATCH_MAX * (e->hp.moe ? e->hp.n_expert_used : 1);
}

uint32_t wf__first_resident(const struct wf_arch_hparams *hp, const struct wf_engine_config *cfg)
{
	if (!cfg->device)
		return 0; /* the CPU engine: every expert where the dense part is, in place */
	if (!hp->moe || !cfg->experts_on_device)
		return hp->n_layer;
	return cfg->n_cpu_moe < hp->n_layer ? cfg->n_cpu_moe : hp->n_layer;
}

bool wf__layer_resident(const struct wf_engine *e, uint32_t layer)
{
	return layer >= e->first_resident;
}

int wf__ex_fail(struct wf_engine *e, int rc)
{
	if (rc < 0 && e->rc == 0)
		e->rc = rc;
	return rc;
}

/* ---- the arch-facing getters -------------------------------------------------------------- */

const struct wf_arch_hparams *wf_ex_hparams(const struct wf_engine *e)
{
	return &e->hp;
}

uint32_t wf_ex_tensor(const struct wf_engine *e, uint32_t layer, uint32_t role)
{
	return e->layer_t[layer * e->arch->n_layer_roles + role];
}

uint32_t wf_ex_global(const struct wf_engine *e, uint32_t role)
{
	return e->global_t[role];
}

static uint32_t act_width(const struct wf_engine *e, enum wf_act a)
{
	switch (a) {
	case WF_ACT_Q:
	case WF_ACT_ATTN:
		return e->q_dim;
	case WF_ACT_K:
	case WF_ACT_V:
		return e->kv_dim;
	default:
		return e->hp.n_embd;
	}
}

/* Whether an op should run: no error yet, and rows to compute. */
static bool go(const struct wf_engine *e)
{
	return e->rc == 0 && e->rows > 0;
}

static const float *vec(const struct wf_engine *e, uint32_t t)
{
	if (t == WF_ARCH_NONE)
		return NULL;
	return wf__tensor_data(&e->t[t], &e->main);
}

/* ---- the dense ops ------------------------------------------------------------------------ */

void wf_ex_embed(struct wf_engine *e, uint32_t t_embd)
{
	if (!go(e))
		return;
	const struct wf__tensor *t = &e->t[t_embd];
	const struct wf_backend_matrix m = wf__tensor_matrix(t, wf__tensor_data(t, &e->main));
	e->stats.weight_bytes += (uint64_t)e->rows * t->row_size;
	wf__ex_fail(e, e->main.ops->get_rows(e->main.ctx, &m,
	                                     (const int32_t *)e->idx + I_TOK * UBATCH_MAX, e->rows,
	                                     e->act[WF_ACT_X], e->diag));
}

void wf_ex_norm(struct wf_engine *e, enum wf_act src, uint32_t t_w, enum wf_act dst)
{
	if (!go(e))
		return;
	const uint32_t w = act_width(e, src);
	if (t_w != WF_ARCH_NONE)
		e->stats.weight_bytes += e->t[t_w].nbytes;
	wf__ex_fail(e, e->main.ops->rms_norm(e->main.ctx, e->act[src], vec(e, t_w), e->act[dst],
	                                     e->rows, w, w, e->hp.rms_eps, e->diag));
}

void wf_ex_head_norm(struct wf_engine *e, enum wf_act a, uint32_t n_heads, uint32_t t_w)
{
	if (!go(e))
		return;
	const uint32_t hd = e->hp.head_dim;
	if (t_w != WF_ARCH_NONE)
		e->stats.weight_bytes += e->t[t_w].nbytes;
	wf__ex_fail(e, e->main.ops->rms_norm(e->main.ctx, e->act[a], vec(e, t_w), e->act[a],
	                                     e->rows * n_heads, hd, hd, e->hp.rms_eps, e->diag));
}

void wf_ex_matmul(struct wf_engine *e, enum wf_act src, uint32_t n, const uint32_t *t,
                  const enum wf_act *dst)
{
	if (!go(e))
		return;
	struct wf_backend_matrix m[WF_BACKEND_MAX_PRODUCTS];
	struct wf_backend_product p[WF_BACKEND_MAX_PRODUCTS];
	if (n == 0 || n > WF_BACKEND_MAX_PRODUCTS) {
		wf__ex_fail(e, wf_diag_set(e->diag, WF_EINVAL, "matmul of %u products", n));
		return;
	}
	for (uint32_t i = 0; i < n; i++) {
		const struct wf__tensor *w = &e->t[t[i]];
		m[i] = wf__tensor_matrix(w, wf__tensor_data(w, &e->main));
		p[i] = (struct wf_backend_product){&m[i], e->act[dst[i]], act_width(e, dst[i])};
		e->stats.weight_bytes += w->nbytes;
	}
	wf__ex_fail(e, e->main.ops->matmul(e->main.ctx, n, p, e->act[src], act_width(e, src),
	                                   e->rows, e->diag));
}

void wf_ex_rope(struct wf_engine *e, enum wf_act a, uint32_t n_heads, enum wf_backend_rope kind)
{
	if (!go(e))
		return;
	wf__ex_fail(e, e->main.ops->rope(e->main.ctx, e->act[a], act_width(e, a), e->rows, n_heads,
	                                 e->hp.head_dim, e->hp.rope_dim,
	                                 (const int32_t *)e->idx + I_POS * UBATCH_MAX,
	                                 e->hp.rope_base, kind, e->diag));
}

void wf_ex_attention(struct wf_engine *e, uint32_t layer)
{
	if (!go(e))
		return;
	const struct wf_backend_ops *o = e->main.ops;
	const struct wf__seqstate *s = &e->seq;
	uint8_t *kc = wf__seq_k(s, layer), *vc = wf__seq_v(s, layer);
	if (wf__ex_fail(e, o->kv_store(e->main.ctx, e->act[WF_ACT_K], e->act[WF_ACT_V], e->rows,
	                               e->kv_dim, e->idx + I_DST * UBATCH_MAX, kc, vc, s->kv_type,
	                               e->diag)) < 0)
		return;
	wf__ex_fail(e, o->attention(e->main.ctx, e->act[WF_ACT_Q], e->q_dim, e->rows, e->hp.n_head,
	                            e->hp.n_head_kv, e->hp.head_dim, kc, vc, s->kv_type,
	                            e->idx + I_KV_FIRST * UBATCH_MAX, e->idx + I_N_KV * UBATCH_MAX,
	                            1.0f / sqrtf((float)e->hp.head_dim), e->act[WF_ACT_ATTN],
	                            e->diag));
}

void wf_ex_add(struct wf_engine *e, enum wf_act dst, enum wf_act src)
{
	if (!go(e))
		return;
	wf__ex_fail(e, e->main.ops->add(e->main.ctx, e->act[dst], e->act[src],
	                                (size_t)e->rows * act_width(e, dst), e->diag));
}

void wf_ex_ffn(struct wf_engine *e, uint32_t t_gate, uint32_t t_up, uint32_t t_down)
{
	if (!go(e))
		return;
	const struct wf__tensor *g = &e->t[t_gate], *u = &e->t[t_up], *d = &e->t[t_down];
	const uint32_t F = e->hp.n_ff, E = e->hp.n_embd;
	struct wf_backend_matrix m[3] = {wf__tensor_matrix(g, wf__tensor_data(g, &e->main)),
	                                 wf__tensor_matrix(u, wf__tensor_data(u, &e->main)),
	                                 wf__tensor_matrix(d, wf__tensor_data(d, &e->main))};
	const struct wf_backend_product gu[2] = {{&m[0], e->gate, F}, {&m[1], e->up, F}};
	const struct wf_backend_product dn = {&m[2], e->act[WF_ACT_TMP], E};
	const struct wf_backend_ops *o = e->main.ops;
	e->stats.weight_bytes += g->nbytes + u->nbytes + d->nbytes;
	if (wf__ex_fail(e, o->matmul(e->main.ctx, 2, gu, e->act[WF_ACT_XN], E, e->rows, e->diag)) <
	        0 ||
	    wf__ex_fail(e, o->swiglu(e->main.ctx, e->gate, e->up, e->gate, (size_t)e->rows * F,
	                             e->diag)) < 0)
		return;
	wf__ex_fail(e, o->matmul(e->main.ctx, 1, &dn, e->gate, F, e->rows, e->diag));
}

void wf_ex_moe(struct wf_engine *e, uint32_t layer, uint32_t t_router, uint32_t t_gate,
               uint32_t t_up, uint32_t t_down)
{
	if (go(e))
		wf__moe_layer(e, layer, t_router, t_gate, t_up, t_down);
}

void wf_ex_keep_outputs(struct wf_engine *e)
{
	if (!go(e) || e->n_out == e->rows)
		return;
	const struct wf_backend_ops *o = e->main.ops;
	const uint32_t E = e->hp.n_embd;
	/* Gathered through TMP: the rows move down in place, which a parallel kernel must not do.
	 */
	if (wf__ex_fail(e,
	                o->copy_rows(e->main.ctx, e->act[WF_ACT_X], E, e->idx + I_OUT * UBATCH_MAX,
	                             e->n_out, E, e->act[WF_ACT_TMP], E, NULL, e->diag)) < 0 ||
	    wf__ex_fail(e, o->copy_rows(e->main.ctx, e->act[WF_ACT_TMP], E, NULL, e->n_out, E,
	                                e->act[WF_ACT_X], E, NULL, e->diag)) < 0)
		return;
	e->rows = e->n_out;
}

void wf_ex_logits(struct wf_engine *e, uint32_t t_norm, uint32_t t_output)
{
	if (!go(e) || e->n_out == 0)
		return;
	const struct wf_backend_ops *o = e->main.ops;
	const uint32_t E = e->hp.n_embd, V = e->hp.n_vocab;
	wf_ex_norm(e, WF_ACT_X, t_norm, WF_ACT_XN);
	const struct wf__tensor *t = &e->t[t_output];
	const struct wf_backend_matrix m = wf__tensor_matrix(t, wf__tensor_data(t, &e->main));
	e->stats.weight_bytes += t->nbytes;
	if (e->shared) { /* main writes host memory: the caller's array directly */
		const struct wf_backend_product p = {&m, e->logits, V};
		wf__ex_fail(e,
		            o->matmul(e->main.ctx, 1, &p, e->act[WF_ACT_XN], E, e->n_out, e->diag));
		return;
	}
	/* Device memory: in chunks through a pinned buffer (a D2H copy into the caller's pageable
	 * array would be staged by the driver, synchronously). */
	for (uint32_t c0 = 0; c0 < e->n_out && e->rc == 0; c0 += OUT_CHUNK) {
		const uint32_t cn = e->n_out - c0 < OUT_CHUNK ? e->n_out - c0 : OUT_CHUNK;
		const struct wf_backend_product p = {&m, e->out, V};
		if (wf__ex_fail(e, o->matmul(e->main.ctx, 1, &p, e->act[WF_ACT_XN] + (size_t)c0 * E,
		                             E, cn, e->diag)) < 0 ||
		    wf__ex_fail(e, wf_device_memcpy_async(e->main.stream, e->h_down, e->out,
		                                          (size_t)cn * V * sizeof(float),
		                                          WF_DEVICE_COPY_D2H, e->diag)) < 0 ||
		    wf__ex_fail(e, wf_device_stream_synchronize(e->main.stream, e->diag)) < 0)
			return;
		memcpy(e->logits + (size_t)c0 * V, e->h_down, (size_t)cn * V * sizeof(float));
	}
}

/* ---- slices ------------------------------------------------------------------------------- */

int wf__exec_slice(struct wf_engine *e, const int32_t *tokens, const uint32_t *pos,
                   const uint32_t *seq, const bool *want, uint32_t n, float *logits,
                   struct wf_diag *diag)
{
	e->rc = 0;
	e->diag = diag;
	e->n = e->rows = n;
	e->tokens = tokens;
	e->pos = pos;
	e->seqs = seq;
	e->want = want;
	e->logits = logits;
	e->res_layers = 0;
	uint32_t *hi = e->h_idx, n_out = 0;
	for (uint32_t t = 0; t < n; t++) {
		hi[I_TOK * UBATCH_MAX + t] = (uint32_t)tokens[t];
		hi[I_POS * UBATCH_MAX + t] = pos[t];
		hi[I_KV_FIRST * UBATCH_MAX + t] = seq[t] * e->n_ctx;
		hi[I_N_KV * UBATCH_MAX + t] = pos[t] + 1;
		hi[I_DST * UBATCH_MAX + t] = seq[t] * e->n_ctx + pos[t];
		if (want[t])
			hi[I_OUT * UBATCH_MAX + n_out++] = t;
	}
	e->n_out = n_out;
	if (!e->shared)
		wf__ex_fail(e, wf_device_memcpy_async(e->main.stream, e->idx, hi,
		                                      (size_t)I_N * UBATCH_MAX * sizeof(uint32_t),
		                                      WF_DEVICE_COPY_H2D, diag));
	e->arch->forward(e);
	if (e->main.stream) {
		const int rc = wf_device_stream_synchronize(e->main.stream, e->rc ? NULL : diag);
		wf__ex_fail(e, rc);
	}
	if (e->rc == 0)
		wf__moe_count_resident(e);
	return e->rc;
}

/* ---- create ------------------------------------------------------------------------------- */

static int make_ctx(struct wf_engine *e, struct wf__be *be, struct wf_device *dev,
                    const struct wf_backend_limits *lim, struct wf_diag *diag)
{
	be->ops = wf_backend_for(dev);
	if (!be->ops)
		return wf_diag_set(diag, WF_EUNSUPPORTED, "no compute backend is registered for %s",
		                   wf_device_name(dev));
	int rc;
	if (dev && (rc = wf_device_stream_create(dev, &be->stream, diag)) < 0)
		return rc;
	(void)e;
	return be->ops->ctx_create(dev, be->stream, lim, &be->ctx, diag);
}

static void drop_ctx(struct wf__be *be)
{
	if (be->ops && be->ctx)
		be->ops->ctx_destroy(be->ctx);
	wf_device_stream_destroy(be->stream);
	memset(be, 0, sizeof(*be));
}

/* Post-fetch when the engine has a device, host-side experts, and the settings ask for it. */
static int fetch_init(struct wf_engine *e, const struct wf_engine_config *cfg, struct wf_diag *diag)
{
	struct wf_postfetch_settings s;
	if (cfg->postfetch)
		s = *cfg->postfetch;
	else
		wf_postfetch_settings_default(&s);
	const bool pf = cfg->device && s.enable && !s.force_cpu;
	if (cfg->expert_cache_mb && !pf)
		return wf_diag_set(diag, WF_EINVAL,
		                   "an expert cache needs a device and post-fetch (its miss path)");
	e->block_on_miss = s.block_on_miss;
	e->fetch_debug = s.debug;
	if (!e->hp.moe || !pf || e->first_resident == 0)
		return 0;
	/* Whole slots where the device computes the dense part: a hit then runs wholly on the
	 * device, where the layer's input is. Where the CPU computes it (the host device without
	 * dense_on_device), the CPU reads gate and up from the floor at memory speed, and slots of
	 * down projections alone hold three times as many experts: at a quarter of the expert
	 * bytes of wf-bench engine's 1.06 GB qwen3moe, hit rate 0.93 and 2.9 MB copied a token,
	 * against 0.53 and 59.5 MB with whole slots (cache25_vs_cpu_experts, host:bw=16G). */
	struct wf__fetch_shape shape = {.n_layer = e->hp.n_layer,
	                                .n_expert = e->hp.n_expert,
	                                .cache_mb = cfg->expert_cache_mb,
	                                .whole = cfg->expert_cache_mb > 0 && e->main_is_dev};
	const uint32_t *mr = e->arch->moe_roles;
	for (uint32_t il = 0; il < e->first_resident; il++) {
		const struct wf__tensor *g = &e->t[wf_ex_tensor(e, il, mr[1])],
		                        *u = &e->t[wf_ex_tensor(e, il, mr[2])],
		                        *d = &e->t[wf_ex_tensor(e, il, mr[3])];
		shape.slot_bytes =
		    d->matrix_size > shape.slot_bytes ? d->matrix_size : shape.slot_bytes;
		shape.max_g = g->matrix_size > shape.max_g ? g->matrix_size : shape.max_g;
		shape.max_u = u->matrix_size > shape.max_u ? u->matrix_size : shape.max_u;
	}
	const uint64_t step = (uint64_t)UBATCH_MAX * e->hp.n_expert_used;
	shape.step_experts = (uint32_t)(step < e->hp.n_expert ? step : e->hp.n_expert);
	return wf__fetch_create(cfg->device, &s, &shape, &e->fetch, diag);
}

/* Each mapping of the view that holds host-side experts is registered with the device, so that
 * post-fetch copies are DMA from the one shared copy. One registration per mapping: a range
 * spanning several mappings would cover holes or foreign pages and fail (or pin what it should
 * not). A mapping the worker registered already (WF_EOVERLAP) is fine; any other refusal leaves
 * the copies to the driver's staging. */
static void register_maps(struct wf_engine *e, struct wf_device *dev,
                          const struct wf_engine_weights *w)
{
	if (!w->maps || !w->n_maps)
		return;
	e->reg_base = calloc(w->n_maps, sizeof(*e->reg_base));
	if (!e->reg_base)
		return;
	e->reg_dev = dev;
	const uint32_t *mr = e->arch->moe_roles;
	for (uint32_t i = 0; i < w->n_maps; i++) {
		const uintptr_t lo = (uintptr_t)w->maps[i].base, hi = lo + w->maps[i].len;
		bool holds = false;
		for (uint32_t il = 0; il < e->first_resident && !holds; il++)
			for (int r = 1; r < 4 && !holds; r++) {
				const uintptr_t a =
				    (uintptr_t)e->t[wf_ex_tensor(e, il, mr[r])].host;
				holds = a >= lo && a < hi;
			}
		if (!holds)
			continue;
		if (wf_device_host_register(dev, w->maps[i].base, w->maps[i].len,
		                            WF_DEVICE_REGISTER_READONLY, NULL, NULL) == 0)
			e->reg_base[e->n_reg++] = w->maps[i].base;
	}
}

/* Every tensor is readable where the plan computes it: WF_ENOT_RESIDENT names the first one a
 * device that cannot read host memory has no copy of. */
static int check_placement(struct wf_engine *e, struct wf_diag *diag)
{
	const struct wf__be *res = e->dev.ctx ? &e->dev : &e->main;
	for (uint32_t h = 0; h < e->n_t; h++) {
		const struct wf__tensor *t = &e->t[h];
		const struct wf__be *be = &e->main;
		if (t->flags & WF_ARCH_EXPERTS) {
			be = &e->cpu; /* host-side: read in place; resident: below */
			for (uint32_t il = e->first_resident; il < e->hp.n_layer; il++)
				for (int r = 1; r < 4; r++)
					if (wf_ex_tensor(e, il, e->arch->moe_roles[r]) == h)
						be = res;
		}
		if (!wf__tensor_data(t, be))
			return wf_diag_set(diag, WF_ENOT_RESIDENT,
			                   "tensor '%s' has no copy on %s, which computes from it",
			                   e->model->tensors[t->model_index].name,
			                   wf_device_name(e->dev_handle));
	}
	return 0;
}

static void describe(struct wf_engine *e, const struct wf_engine_config *cfg)
{
	char experts[128] = "none";
	const uint32_t nl = e->hp.n_layer, fr = e->first_resident;
	const char *side = e->fetch ? (cfg->expert_cache_mb ? "host-side, post-fetch, cache"
	                                                    : "host-side, post-fetch")
	                            : "host-side, cpu";
	if (e->hp.moe) {
		if (fr == 0)
			snprintf(experts, sizeof(experts), "resident (%s)",
			         e->dev.ctx ? e->dev.ops->name : "cpu");
		else if (fr >= nl)
			snprintf(experts, sizeof(experts), "%s", side);
		else
			snprintf(experts, sizeof(experts), "layers 0-%u %s, %u-%u resident", fr - 1,
			         side, fr, nl - 1);
	}
	snprintf(e->placement, sizeof(e->placement), "dense: %s; experts: %s",
	         e->main_is_dev ? wf_device_name(e->dev_handle) : "cpu", experts);
}

struct buf {
	void **ptr;
	size_t bytes;
};

/* Lays the buffers out in one allocation of dev's (or host) memory. */
static void *alloc_bufs(struct wf_device *dev, bool pinned, const struct buf *b, size_t n,
                        size_t *ret_bytes, struct wf_diag *diag)
{
	size_t total = 0;
	for (size_t i = 0; i < n; i++)
		total += align256(b[i].bytes);
	uint8_t *base = NULL;
	if (pinned) {
		if (wf_device_pinned_alloc(dev, total ? total : 1, 0, (void **)&base, diag) < 0)
			return NULL;
	} else if (!(base = wf__mem_alloc(dev, total, diag))) {
		return NULL;
	}
	*ret_bytes = total;
	uint8_t *at = base;
	for (size_t i = 0; i < n; i++) {
		*b[i].ptr = b[i].bytes ? at : NULL;
		at += align256(b[i].bytes);
	}
	return base;
}

static int alloc_buffers(struct wf_engine *e, struct wf_diag *diag)
{
	const size_t U = UBATCH_MAX, S = s_rows(e), E = e->hp.n_embd, F = e->hp.n_ff;
	const size_t X = e->hp.moe ? e->hp.n_expert : 1, V = e->hp.n_vocab;
	const bool own = !e->shared; /* main has memory of its own: staging on the host */
	struct wf_device *mdev = e->main.stream ? e->dev_handle : NULL;
	const struct buf dev_bufs[] = {
	    {(void **)&e->act[WF_ACT_X], U * E * 4},
	    {(void **)&e->act[WF_ACT_XN], U * E * 4},
	    {(void **)&e->act[WF_ACT_TMP], U * E * 4},
	    {(void **)&e->act[WF_ACT_Q], U * e->q_dim * 4},
	    {(void **)&e->act[WF_ACT_ATTN], U * e->q_dim * 4},
	    {(void **)&e->act[WF_ACT_K], U * e->kv_dim * 4},
	    {(void **)&e->act[WF_ACT_V], U * e->kv_dim * 4},
	    {(void **)&e->router, U * X * 4},
	    {(void **)&e->wts, S * 4},
	    {(void **)&e->ids, S * 4},
	    {(void **)&e->gate, S * F * 4},
	    {(void **)&e->up, S * F * 4},
	    {(void **)&e->down, S * E * 4},
	    {(void **)&e->out, own ? OUT_CHUNK * V * 4 : 0},
	    {(void **)&e->idx, I_N * U * 4},
	    {(void **)&e->ids_dev, S * 4},
	    {(void **)&e->ids_fetch, S * 4},
	    {(void **)&e->cpu_rows, own ? S * 4 : 0},
	    {(void **)&e->dgate, own ? 0 : S * F * 4},
	    {(void **)&e->dup, own ? 0 : S * F * 4},
	    {(void **)&e->hx, own ? S * F * 4 : 0},
	    {(void **)&e->down_cpu, own ? S * E * 4 : 0},
	};
	e->amem = alloc_bufs(mdev, false, dev_bufs, sizeof(dev_bufs) / sizeof(dev_bufs[0]),
	                     &e->abytes, diag);
	if (!e->amem)
		return wf_diag_set(diag, -ENOMEM, "engine activations");
	const size_t hd = S * E > OUT_CHUNK * V ? S * E : OUT_CHUNK * V;
	const struct buf host_bufs[] = {
	    {(void **)&e->h_ids_cpu, S * 4},
	    {(void **)&e->h_ids_cpu_d, S * 4},
	    {(void **)&e->h_idx, own ? I_N * U * 4 : 0},
	    {(void **)&e->h_ids, own ? S * 4 : 0},
	    {(void **)&e->h_ids_dev, own ? S * 4 : 0},
	    {(void **)&e->h_ids_fetch, own ? S * 4 : 0},
	    {(void **)&e->h_cpu_rows, own ? S * 4 : 0},
	    {(void **)&e->h_wts, own ? S * 4 : 0},
	    {(void **)&e->h_xn, own ? U * E * 4 : 0},
	    {(void **)&e->h_gate, own ? S * F * 4 : 0},
	    {(void **)&e->h_up, own ? S * F * 4 : 0},
	    {(void **)&e->h_down, own ? hd * 4 : 0},
	    {(void **)&e->h_router, own ? U * X * 4 : 0},
	    {(void **)&e->h_res_ids, own ? (size_t)e->hp.n_layer * S * 4 : 0},
	};
	e->pmem = alloc_bufs(own ? e->dev_handle : NULL, own, host_bufs,
	                     sizeof(host_bufs) / sizeof(host_bufs[0]), &e->pbytes, diag);
	if (!e->pmem)
		return wf_diag_set(diag, -ENOMEM, "engine host buffers");
	if (!own) { /* one memory: the host side reads and writes main's buffers */
		e->h_idx = e->idx;
		e->h_ids = e->ids;
		e->h_ids_dev = e->ids_dev;
		e->h_ids_fetch = e->ids_fetch;
		e->h_wts = e->wts;
		e->h_xn = e->act[WF_ACT_XN];
		e->h_gate = e->gate;
		e->h_up = e->up;
		e->h_down = e->down;
		e->h_router = e->router;
		e->hx = e->gate;
	} else { /* the device's whole-slot experts use main's own gate and up rows */
		e->dgate = e->gate;
		e->dup = e->up;
	}
	e->scratch_bytes = e->abytes + e->pbytes;
	return 0;
}

static int moe_host_init(struct wf_engine *e, struct wf_diag *diag)
{
	const size_t X = e->hp.moe ? e->hp.n_expert : 1;
	e->expert_count = calloc(X, sizeof(uint32_t));
	e->expert_first = calloc(X, sizeof(uint32_t));
	e->step_experts = calloc(X, sizeof(uint32_t));
	e->expert_slot = calloc(X, sizeof(int32_t));
	e->expert_where = calloc(X, 1);
	e->fetch_src = calloc(X, sizeof(*e->fetch_src));
	e->fetch_slot = calloc(X, sizeof(int32_t));
	e->fetch_whole = calloc(X, sizeof(bool));
	e->fetch_bad = calloc(X, sizeof(bool));
	e->res_layer = calloc(e->hp.n_layer, sizeof(uint32_t));
	if (!e->res_layer || !e->expert_count || !e->expert_first || !e->step_experts ||
	    !e->expert_slot || !e->expert_where || !e->fetch_src || !e->fetch_slot ||
	    !e->fetch_whole || !e->fetch_bad)
		return wf_diag_set(diag, -ENOMEM, "expert bookkeeping");
	return 0;
}

int wf__exec_init(struct wf_engine *e, const struct wf_engine_config *cfg,
                  const struct wf_engine_weights *w, struct wf_diag *diag)
{
	struct wf_device *dev = cfg->device;
	int rc;
	e->dev_handle = dev;
	e->first_resident = wf__first_resident(&e->hp, cfg);
	if (dev && !wf_backend_for(dev))
		return wf_diag_set(diag, WF_EUNSUPPORTED, "no compute backend is registered for %s",
		                   wf_device_name(dev));
	e->main_is_dev = dev && (cfg->dense_on_device || !wf_backend_for(dev)->host_memory);
	if ((rc = moe_host_init(e, diag)) < 0 || (rc = fetch_init(e, cfg, diag)) < 0)
		return rc;
	if ((rc = wf_pool_create(e->n_threads, &e->pool)) < 0)
		return wf_diag_set(diag, rc, "thread pool of %u", e->n_threads);

	struct wf_backend_limits lim = {
	    .pool = e->pool,
	    .n_threads = e->n_threads,
	    .max_rows = (uint32_t)s_rows(e),
	    .max_expert = e->hp.moe ? e->hp.n_expert : 1,
	    .max_kv = e->n_ctx,
	    .head_dim = e->hp.head_dim,
	};
	lim.max_stack = lim.max_expert;
	if (e->fetch && wf__fetch_n_slots(e->fetch) > lim.max_stack)
		lim.max_stack = wf__fetch_n_slots(e->fetch);
	for (uint32_t h = 0; h < e->n_t; h++) {
		lim.max_ne0 = e->t[h].ne[0] > lim.max_ne0 ? e->t[h].ne[0] : lim.max_ne0;
		lim.max_ne1 = e->t[h].ne[1] > lim.max_ne1 ? e->t[h].ne[1] : lim.max_ne1;
	}
	if ((rc = make_ctx(e, &e->cpu, NULL, &lim, diag)) < 0)
		return rc;
	if (dev && (rc = make_ctx(e, &e->dev, dev, &lim, diag)) < 0)
		return rc;
	e->main = e->main_is_dev ? e->dev : e->cpu;
	e->cpu_is_main = !e->main_is_dev;
	e->shared = e->main.ops->host_memory;
	if ((rc = check_placement(e, diag)) < 0 || (rc = alloc_buffers(e, diag)) < 0)
		return rc;
	const enum wf_backend_kv kv =
	    cfg->kv_type == WF_ENGINE_KV_F32 ? WF_BACKEND_KV_F32 : WF_BACKEND_KV_F16;
	if ((rc = wf__seqstate_init(&e->seq, e->main.stream ? dev : NULL, kv, e->hp.n_layer,
	                            e->n_seq_max, e->n_ctx, e->kv_dim, diag)) < 0)
		return rc;
	if (e->fetch)
		register_maps(e, dev, w);
	describe(e, cfg);
	return 0;
}

void wf__exec_fini(struct wf_engine *e)
{
	if (e->main.stream)
		(void)wf_device_stream_synchronize(e->main.stream, NULL);
	wf__fetch_destroy(e->fetch); /* waits for copies still reading the floor */
	e->fetch = NULL;
	for (uint32_t i = 0; i < e->n_reg; i++)
		(void)wf_device_host_unregister(e->reg_dev, e->reg_base[i], NULL);
	free(e->reg_base);
	wf__seqstate_fini(&e->seq);
	struct wf_device *mdev = e->main.stream ? e->dev_handle : NULL;
	wf__mem_free(mdev, e->amem, e->abytes);
	if (e->pmem) {
		if (!e->shared)
			(void)wf_device_pinned_free(e->dev_handle, e->pmem, NULL);
		else
			wf__mem_free(NULL, e->pmem, e->pbytes);
	}
	/* main is one of dev and cpu, not a context of its own */
	drop_ctx(&e->dev);
	drop_ctx(&e->cpu);
	wf_pool_destroy(e->pool);
	free(e->expert_count);
	free(e->expert_first);
	free(e->step_experts);
	free(e->expert_slot);
	free(e->expert_where);
	free(e->fetch_src);
	free(e->fetch_slot);
	free(e->fetch_whole);
	free(e->fetch_bad);
	free(e->res_layer);
}
