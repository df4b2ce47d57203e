/* The device forward pass: the same graph as forward.c with the dense weights, the KV cache and
 * the activations in device memory, computed by the device's engine ops (devops.h) on one
 * compute stream, and the routed experts placed per layer the way llama.cpp users choose with
 * --n-cpu-moe N:
 *
 *   resident   (layers >= the first resident one) gate, up and down of every expert copied to
 *              the device at create; the layer's MoE runs there entirely.
 *   host-side  (the other layers) the experts stay in the floor. Right after routing, the router's
 *              choices come back to the host; the post-fetch slots (fetch.c) start copying each
 *              selected expert's down projection (or find it in the expert cache) while the CPU
 *              computes gate and up from the floor; each down projection then runs on the device
 *              from its slot, or on the CPU from the floor when the slot is not there (no
 *              post-fetch, a failed copy, or the non-blocking policy and a copy not done). With
 *              an expert cache the slots hold experts whole: a hit runs gate, up and down on the
 *              device. The partial results land in one device buffer, one row per (token,
 *              expert), and are summed in llama.cpp's order there, so the output does not
 *              depend on where each expert ran.
 *
 * Split execution: the device ops are asynchronous on CUDA, so the device computes the resident
 * layers' experts, the cache's whole hits and the fetched down projections (grouped products,
 * one call per matrix) while the host thread goes on with the CPU's share; the host device's ops
 * compute when called (its "device" is this CPU), which keeps every path and its bookkeeping
 * under test in CI with the CPU engine's results bit for bit.
 *
 * Synchronisation: one host wait per MoE layer (the router's choices, and the normalized input
 * for the CPU's experts, come back), one per slice for the logits. The pinned buffers that carry
 * indices and CPU results to the device are rewritten only after such a wait, so a copy still
 * queued from them never reads the next layer's bytes. */
#include "engine/engine_state.h"

#include "base/error.h"
#include "device/device.h"
#include "engine/devops_host.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define OUT_CHUNK 32u /* logits rows computed per output product */

struct dlayer {
	const float *attn_norm, *q_norm, *k_norm, *ffn_norm;
	struct wf_engine_dev_matrix wq, wk, wv, wo, gate_inp, ffn_gate, ffn_up, ffn_down;
	/* Resident layers: the expert stacks (expert x at data + x * its matrix size). */
	struct wf_engine_dev_matrix gate_exps, up_exps, down_exps;
};

struct wf__devfwd {
	struct wf_device *dev;
	const struct wf_engine_dev_ops *ops;
	void *ctx;
	struct wf_device_stream *stream;
	uint32_t first_resident;
	enum wf_engine_dev_kv kv_type;

	uint8_t *wmem; /* dense weights and resident experts */
	size_t wbytes;
	struct dlayer *L;
	struct wf_engine_dev_matrix tok_embd, output;
	const float *output_norm;

	uint8_t *kc, *vc; /* [layer][seq][pos][kv_dim] */
	size_t kv_layer_bytes, kv_bytes;

	uint8_t *amem; /* activations and indices */
	size_t abytes;
	float *x, *xn, *q, *k, *v, *attn, *tmp, *router, *wts, *rows, *gate, *up, *down, *out;
	int32_t *ids; /* the router's choices, S */
	uint32_t
	    *idx; /* [tok pos kv_first n_kv dst_row oidx] x UBATCH_MAX, then [slot_of gidx] x S */

	uint8_t *pmem; /* pinned host buffers */
	size_t pbytes;
	uint32_t *h_idx; /* the same layout as idx */
	int32_t *h_ids;
	float *h_xn, *h_h, *h_down, *h_router;

	uint8_t *on_dev; /* per expert, this step: its down projection ran on the device */
	uint8_t *whole;  /* per expert, this step: the cache holds it whole (all on the device) */
	uint32_t *g_index, *g_first, *g_count; /* a grouped product's groups, one per expert */
};

enum { I_TOK, I_POS, I_KV_FIRST, I_N_KV, I_DST, I_OUT, I_STEP_ARRAYS };

static size_t s_rows(const struct wf_engine *e)
{
	return (size_t)UBATCH_MAX * (e->w.moe ? e->w.n_expert_used : 1);
}

uint32_t wf__first_resident(const struct wf_engine *e, const struct wf_engine_config *cfg)
{
	const uint32_t nl = e->w.n_layer;
	if (!e->w.moe || !cfg->experts_on_device)
		return nl;
	return cfg->n_cpu_moe < nl ? cfg->n_cpu_moe : nl;
}

/* ---- create ---------------------------------------------------------------------------------- */

static size_t wt_bytes(const struct wf__wt *t)
{
	return t->data ? t->matrix_size * (size_t)(t->ne[2] ? t->ne[2] : 1) : 0;
}

static size_t align256(size_t n)
{
	return (n + 255u) & ~(size_t)255u;
}

/* Places t at *at in the weight memory, queues its copy, and describes it. */
static int place(struct wf__devfwd *d, const struct wf__wt *t, size_t *at,
                 struct wf_engine_dev_matrix *ret, const float **ret_f32, struct wf_diag *diag)
{
	const size_t bytes = wt_bytes(t);
	if (!bytes)
		return 0;
	uint8_t *dst = d->wmem + *at;
	*at += align256(bytes);
	if (ret) {
		*ret = (struct wf_engine_dev_matrix){dst, t->type, t->ne[0], t->ne[1], t->row_size};
		if (!d->ops->supports(t->type))
			return wf_diag_set(diag, WF_EUNSUPPORTED,
			                   "the %s engine ops have no kernels for weight type %u",
			                   d->ops->name, t->type);
	}
	if (ret_f32)
		*ret_f32 = (const float *)dst;
	return wf_device_memcpy_async(d->stream, dst, t->data, bytes, WF_DEVICE_COPY_H2D, diag);
}

/* Every device-side tensor of the model, in placement order; count only (d->wmem NULL) or
 * place them. */
static int place_all(struct wf__devfwd *d, const struct wf__weights *w, size_t *at,
                     struct wf_diag *diag)
{
	int rc = 0;
#define PUT(t, m, f)                                                                               \
	do {                                                                                       \
		if (rc == 0) {                                                                     \
			if (d->wmem)                                                               \
				rc = place(d, (t), at, (m), (f), diag);                            \
			else                                                                       \
				*at += align256(wt_bytes(t));                                      \
		}                                                                                  \
	} while (0)
	PUT(&w->tok_embd, &d->tok_embd, NULL);
	PUT(&w->output_norm, NULL, &d->output_norm);
	PUT(&w->output, &d->output, NULL);
	for (uint32_t il = 0; il < w->n_layer; il++) {
		const struct wf__layer *L = &w->layers[il];
		struct dlayer *D = &d->L[il];
		PUT(&L->attn_norm, NULL, &D->attn_norm);
		PUT(&L->q_norm, NULL, &D->q_norm);
		PUT(&L->k_norm, NULL, &D->k_norm);
		PUT(&L->ffn_norm, NULL, &D->ffn_norm);
		PUT(&L->wq, &D->wq, NULL);
		PUT(&L->wk, &D->wk, NULL);
		PUT(&L->wv, &D->wv, NULL);
		PUT(&L->wo, &D->wo, NULL);
		if (w->moe) {
			PUT(&L->gate_inp, &D->gate_inp, NULL);
			if (il >= d->first_resident) {
				PUT(&L->gate_exps, &D->gate_exps, NULL);
				PUT(&L->up_exps, &D->up_exps, NULL);
				PUT(&L->down_exps, &D->down_exps, NULL);
			}
		} else {
			PUT(&L->ffn_gate, &D->ffn_gate, NULL);
			PUT(&L->ffn_up, &D->ffn_up, NULL);
			PUT(&L->ffn_down, &D->ffn_down, NULL);
		}
	}
#undef PUT
	return rc;
}

static const struct wf_engine_dev_ops *ops_for(struct wf_device *dev, struct wf_diag *diag)
{
	if (wf_device_kind(dev) == WF_DEVICE_KIND_HOST)
		return wf__devops_host();
	const struct wf_device_kernel_table *t = wf_device_kernels(dev);
	if (!t) {
		wf_diag_set(diag, WF_EUNSUPPORTED, "no engine kernels are registered for %s",
		            wf_device_name(dev));
		return NULL;
	}
	if (t->version != WF_ENGINE_DEV_OPS_VERSION) {
		wf_diag_set(diag, WF_EUNSUPPORTED,
		            "the %s kernels are built for engine ops version %u, not %u", t->name,
		            t->version, WF_ENGINE_DEV_OPS_VERSION);
		return NULL;
	}
	return t->ops;
}

int wf__devfwd_create(struct wf_engine *e, const struct wf_engine_config *cfg, struct wf_diag *diag)
{
	const struct wf__weights *w = &e->w;
	struct wf__devfwd *d = calloc(1, sizeof(*d));
	if (!d)
		return wf_diag_set(diag, -ENOMEM, "device forward pass");
	e->devfwd = d;
	d->dev = cfg->device;
	d->first_resident = wf__first_resident(e, cfg);
	d->kv_type = cfg->kv_type == WF_ENGINE_KV_F32 ? WF_ENGINE_DEV_KV_F32 : WF_ENGINE_DEV_KV_F16;
	int rc;
	if (!(d->ops = ops_for(d->dev, diag)))
		return WF_EUNSUPPORTED;
	d->L = calloc(w->n_layer, sizeof(*d->L));
	d->on_dev = calloc(w->moe ? w->n_expert : 1, 1);
	const size_t nx = w->moe ? w->n_expert : 1;
	d->whole = calloc(nx, 1);
	d->g_index = calloc(nx, sizeof(uint32_t));
	d->g_first = calloc(nx, sizeof(uint32_t));
	d->g_count = calloc(nx, sizeof(uint32_t));
	if (!d->L || !d->on_dev || !d->whole || !d->g_index || !d->g_first || !d->g_count)
		return wf_diag_set(diag, -ENOMEM, "device forward pass");
	if ((rc = wf_device_stream_create(d->dev, &d->stream, diag)) < 0)
		return rc;

	/* Weights. */
	size_t at = 0;
	(void)place_all(d, w, &at, diag);
	d->wbytes = at;
	if ((rc = wf_device_mem_alloc(d->dev, d->wbytes, (void **)&d->wmem, diag)) < 0)
		return wf_diag_set(diag, rc, "%zu bytes of weights on %s: %s", d->wbytes,
		                   wf_device_name(d->dev), diag ? diag->msg : "");
	at = 0;
	if ((rc = place_all(d, w, &at, diag)) < 0)
		return rc;

	/* KV cache. */
	d->kv_layer_bytes = (size_t)e->n_seq_max * e->n_ctx * e->kv_dim *
	                    (d->kv_type == WF_ENGINE_DEV_KV_F16 ? 2u : 4u);
	d->kv_bytes = d->kv_layer_bytes * w->n_layer;
	if ((rc = wf_device_mem_alloc(d->dev, d->kv_bytes, (void **)&d->kc, diag)) < 0 ||
	    (rc = wf_device_mem_alloc(d->dev, d->kv_bytes, (void **)&d->vc, diag)) < 0)
		return rc;

	/* Activations and indices. */
	const size_t U = UBATCH_MAX, S = s_rows(e), E = w->n_embd, F = w->n_ff;
	const size_t X = w->moe ? w->n_expert : 1, V = w->n_vocab;
	struct {
		void **ptr;
		size_t bytes;
	} dev_bufs[] =
	    {
	        {(void **)&d->x, U * E * 4},
	        {(void **)&d->xn, U * E * 4},
	        {(void **)&d->tmp, U * E * 4},
	        {(void **)&d->q, U * e->q_dim * 4},
	        {(void **)&d->attn, U * e->q_dim * 4},
	        {(void **)&d->k, U * e->kv_dim * 4},
	        {(void **)&d->v, U * e->kv_dim * 4},
	        {(void **)&d->router, U * X * 4},
	        {(void **)&d->wts, S * 4},
	        {(void **)&d->rows, S * E * 4},
	        {(void **)&d->ids, S * 4},
	        {(void **)&d->gate, S * F * 4},
	        {(void **)&d->up, S * F * 4},
	        {(void **)&d->down, S * E * 4},
	        {(void **)&d->out, OUT_CHUNK * V * 4},
	        {(void **)&d->idx, (I_STEP_ARRAYS * U + 2 * S) * 4},
	    },
	  pin_bufs[] = {
	      {(void **)&d->h_idx, (I_STEP_ARRAYS * U + 2 * S) * 4},
	      {(void **)&d->h_ids, S * 4},
	      {(void **)&d->h_xn, U * E * 4},
	      {(void **)&d->h_h, S * F * 4},
	      {(void **)&d->h_down, S * E * 4},
	      {(void **)&d->h_router, U * X * 4},
	  };
	for (int pass = 0; pass < 2; pass++) {
		const bool pinned = pass == 1;
		size_t total = 0;
		const size_t nb = pinned ? sizeof(pin_bufs) / sizeof(pin_bufs[0])
		                         : sizeof(dev_bufs) / sizeof(dev_bufs[0]);
		for (size_t i = 0; i < nb; i++)
			total += align256(pinned ? pin_bufs[i].bytes : dev_bufs[i].bytes);
		uint8_t *base;
		rc = pinned ? wf_device_pinned_alloc(d->dev, total, 0, (void **)&base, diag)
		            : wf_device_mem_alloc(d->dev, total, (void **)&base, diag);
		if (rc < 0)
			return rc;
		if (pinned) {
			d->pmem = base;
			d->pbytes = total;
		} else {
			d->amem = base;
			d->abytes = total;
		}
		for (size_t i = 0; i < nb; i++) {
			*(pinned ? pin_bufs : dev_bufs)[i].ptr = base;
			base += align256(pinned ? pin_bufs[i].bytes : dev_bufs[i].bytes);
		}
	}

	struct wf_engine_dev_limits lim = {
	    .n_threads = e->n_threads,
	    .host_pool = e->cpu.pool,
	    .max_expert = (uint32_t)X,
	    .max_rows = (uint32_t)S,
	    .max_kv = e->n_ctx,
	    .head_dim = w->head_dim,
	};
	const struct wf__wt *all[] = {&w->output, &w->tok_embd};
	for (size_t i = 0; i < 2; i++) {
		lim.max_ne0 = all[i]->ne[0] > lim.max_ne0 ? all[i]->ne[0] : lim.max_ne0;
		lim.max_ne1 = all[i]->ne[1] > lim.max_ne1 ? all[i]->ne[1] : lim.max_ne1;
	}
	for (uint32_t il = 0; il < w->n_layer; il++) {
		const struct wf__layer *L = &w->layers[il];
		const struct wf__wt *m[] = {&L->wq,       &L->wk,        &L->wv,      &L->wo,
		                            &L->gate_inp, &L->gate_exps, &L->up_exps, &L->down_exps,
		                            &L->ffn_gate, &L->ffn_up,    &L->ffn_down};
		for (size_t i = 0; i < sizeof(m) / sizeof(m[0]); i++) {
			if (!m[i]->data)
				continue;
			lim.max_ne0 = m[i]->ne[0] > lim.max_ne0 ? m[i]->ne[0] : lim.max_ne0;
			lim.max_ne1 = m[i]->ne[1] > lim.max_ne1 ? m[i]->ne[1] : lim.max_ne1;
		}
	}
	if ((rc = d->ops->ctx_create(d->dev, d->stream, &lim, &d->ctx, diag)) < 0)
		return rc;
	/* The weights' copies have landed before the first decode. */
	return wf_device_stream_synchronize(d->stream, diag);
}

void wf__devfwd_destroy(struct wf__devfwd *d)
{
	if (!d)
		return;
	if (d->stream)
		(void)wf_device_stream_synchronize(d->stream, NULL);
	if (d->ctx)
		d->ops->ctx_destroy(d->ctx);
	wf_device_stream_destroy(d->stream);
	if (d->pmem)
		(void)wf_device_pinned_free(d->dev, d->pmem, NULL);
	const void *mem[] = {d->amem, d->kc, d->vc, d->wmem};
	for (size_t i = 0; i < 4; i++)
		if (mem[i])
			(void)wf_device_mem_free(d->dev, (void *)mem[i], NULL);
	free(d->L);
	free(d->on_dev);
	free(d->whole);
	free(d->g_index);
	free(d->g_first);
	free(d->g_count);
	free(d);
}

uint64_t wf__devfwd_device_bytes(const struct wf__devfwd *d)
{
	return d ? (uint64_t)d->wbytes + 2u * d->kv_bytes + d->abytes : 0;
}

uint64_t wf__devfwd_resident_bytes(const struct wf__devfwd *d, const struct wf__weights *w)
{
	uint64_t b = 0;
	for (uint32_t il = d ? d->first_resident : w->n_layer; il < w->n_layer; il++)
		b += wt_bytes(&w->layers[il].gate_exps) + wt_bytes(&w->layers[il].up_exps) +
		     wt_bytes(&w->layers[il].down_exps);
	return b;
}

/* ---- the forward pass ------------------------------------------------------------------------ */

#define TRY(call)                                                                                  \
	do {                                                                                       \
		if ((rc = (call)) < 0)                                                             \
			return rc;                                                                 \
	} while (0)

static int h2d(struct wf__devfwd *d, void *dst, const void *src, size_t bytes, struct wf_diag *diag)
{
	return bytes ? wf_device_memcpy_async(d->stream, dst, src, bytes, WF_DEVICE_COPY_H2D, diag)
	             : 0;
}

static int d2h(struct wf__devfwd *d, void *dst, const void *src, size_t bytes, struct wf_diag *diag)
{
	return bytes ? wf_device_memcpy_async(d->stream, dst, src, bytes, WF_DEVICE_COPY_D2H, diag)
	             : 0;
}

static int attention_block(struct wf_engine *e, struct wf__devfwd *d, uint32_t il, uint32_t n,
                           struct wf_diag *diag)
{
	const struct wf__weights *w = &e->w;
	const struct dlayer *D = &d->L[il];
	const struct wf_engine_dev_ops *o = d->ops;
	const uint32_t E = w->n_embd, HD = w->head_dim;
	const int32_t *pos = (const int32_t *)d->idx + I_POS * UBATCH_MAX;
	int rc;
	TRY(o->rms_norm(d->ctx, d->x, D->attn_norm, d->xn, n, E, E, w->rms_eps, diag));
	TRY(o->matmul(d->ctx, &D->wq, d->xn, E, n, d->q, e->q_dim, diag));
	TRY(o->matmul(d->ctx, &D->wk, d->xn, E, n, d->k, e->kv_dim, diag));
	TRY(o->matmul(d->ctx, &D->wv, d->xn, E, n, d->v, e->kv_dim, diag));
	if (w->qk_norm) {
		TRY(o->rms_norm(d->ctx, d->q, D->q_norm, d->q, n * w->n_head, HD, HD, w->rms_eps,
		                diag));
		TRY(o->rms_norm(d->ctx, d->k, D->k_norm, d->k, n * w->n_head_kv, HD, HD, w->rms_eps,
		                diag));
	}
	const enum wf_engine_dev_rope rk =
	    w->rope == WF__ROPE_NEOX ? WF_ENGINE_DEV_ROPE_NEOX : WF_ENGINE_DEV_ROPE_NORM;
	TRY(o->rope(d->ctx, d->q, e->q_dim, n, w->n_head, HD, w->rope_dim, pos, w->rope_base, rk,
	            diag));
	TRY(o->rope(d->ctx, d->k, e->kv_dim, n, w->n_head_kv, HD, w->rope_dim, pos, w->rope_base,
	            rk, diag));
	uint8_t *kc = d->kc + il * d->kv_layer_bytes, *vc = d->vc + il * d->kv_layer_bytes;
	TRY(o->kv_store(d->ctx, d->k, d->v, n, e->kv_dim, d->idx + I_DST * UBATCH_MAX, kc, vc,
	                d->kv_type, diag));
	TRY(o->attention(d->ctx, d->q, e->q_dim, n, w->n_head, w->n_head_kv, HD, kc, vc, d->kv_type,
	                 d->idx + I_KV_FIRST * UBATCH_MAX, d->idx + I_N_KV * UBATCH_MAX,
	                 1.0f / sqrtf((float)HD), d->attn, diag));
	TRY(o->matmul(d->ctx, &D->wo, d->attn, e->q_dim, n, d->tmp, E, diag));
	return o->add(d->ctx, d->x, d->tmp, (size_t)n * E, diag);
}

/* Groups of experts for one grouped product: the matrix index (expert, or cache slot) and the
 * rows in expert order. */
struct groups {
	uint32_t n, *index, *first, *count;
};

static void group_add(struct groups *g, uint32_t index, uint32_t first, uint32_t count)
{
	g->index[g->n] = index;
	g->first[g->n] = first;
	g->count[g->n] = count;
	g->n++;
}

static struct wf_engine_dev_matrix dev_matrix(const struct wf__wt *t, const void *data)
{
	return (struct wf_engine_dev_matrix){data, t->type, t->ne[0], t->ne[1], t->row_size};
}

/* The CPU's share of a host-side layer: gate and up of every selected expert from the floor,
 * then each down projection from its post-fetch slot on the device, or from the floor on the
 * CPU; every result row lands in d->down. */
static int host_experts(struct wf_engine *e, struct wf__devfwd *d, uint32_t il, uint32_t n,
                        struct wf_diag *diag)
{
	const struct wf__weights *w = &e->w;
	const struct wf__layer *L = &w->layers[il];
	const uint32_t E = w->n_embd, F = w->n_ff, X = w->n_expert, K = w->n_expert_used;
	struct wf__mm_phase *ph = e->ph;
	int rc;

	wf__moe_gate_up(e, L, d->h_xn, n, d->whole, d->h_h);

	/* Down: from the slot on the device where post-fetch brought it, else on the CPU. */
	const enum wf_dtype ad = L->down_exps.ops->vec_dot_type;
	const size_t ds = wf__quantize_rows(&e->cpu, ad, d->h_h, F, n * K, F, e->qa);
	struct groups gr = {0, d->g_index, d->g_first, d->g_count};
	for (uint32_t x = 0; x < X; x++) {
		const uint32_t c = e->expert_count[x], f = e->expert_first[x];
		d->on_dev[x] = d->whole[x];
		if (!c || d->whole[x])
			continue;
		const void *slot = e->fetch ? wf__fetch_ready(e->fetch, e->fetch_slot[x]) : NULL;
		d->on_dev[x] = slot != NULL;
		if (!slot) {
			wf__mm_add(ph, &L->down_exps, x, NULL, e->qa + f * ds, ds, c,
			           d->h_down + (size_t)f * E, E);
			continue;
		}
		TRY(h2d(d, d->gate + (size_t)f * F, d->h_h + (size_t)f * F, (size_t)c * F * 4,
		        diag));
		group_add(&gr, (uint32_t)e->fetch_slot[x], f, c);
	}
	if (gr.n) {
		const void *sd, *sg, *su;
		size_t stride;
		wf__fetch_stacks(e->fetch, &sd, &sg, &su, &stride);
		const struct wf_engine_dev_matrix dn = dev_matrix(&L->down_exps, sd);
		TRY(d->ops->matmul_experts(d->ctx, &dn, stride, gr.n, gr.index, gr.first, gr.count,
		                           d->gate, F, d->down, E, diag));
	}
	wf__mm_run(&e->cpu, ph);
	for (uint32_t x = 0; x < X; x++) {
		const uint32_t c = e->expert_count[x], f = e->expert_first[x];
		if (c && !d->on_dev[x])
			TRY(h2d(d, d->down + (size_t)f * E, d->h_down + (size_t)f * E,
			        (size_t)c * E * 4, diag));
	}
	return 0;
}

/* Experts wholly on the device, in one grouped product each for gate, up and down: the stacks
 * (an expert stack of the weights, or the expert cache's slots) at g, u and dn, stride apart;
 * their rows gathered in d->rows, the results in the same rows of d->down. all_rows: the
 * groups cover every row (one swiglu then). */
static int device_experts(struct wf__devfwd *d, const struct groups *gr,
                          const struct wf_engine_dev_matrix *g,
                          const struct wf_engine_dev_matrix *u,
                          const struct wf_engine_dev_matrix *dn, size_t g_stride, size_t u_stride,
                          size_t d_stride, uint32_t E, uint32_t F, uint32_t all_rows,
                          struct wf_diag *diag)
{
	const struct wf_engine_dev_ops *o = d->ops;
	int rc;
	if (!gr->n)
		return 0;
	TRY(o->matmul_experts(d->ctx, g, g_stride, gr->n, gr->index, gr->first, gr->count, d->rows,
	                      E, d->gate, F, diag));
	TRY(o->matmul_experts(d->ctx, u, u_stride, gr->n, gr->index, gr->first, gr->count, d->rows,
	                      E, d->up, F, diag));
	if (all_rows) {
		TRY(o->swiglu(d->ctx, d->gate, d->up, d->gate, (size_t)all_rows * F, diag));
	} else {
		for (uint32_t i = 0; i < gr->n; i++) {
			const size_t at = (size_t)gr->first[i] * F;
			TRY(o->swiglu(d->ctx, d->gate + at, d->up + at, d->gate + at,
			              (size_t)gr->count[i] * F, diag));
		}
	}
	return o->matmul_experts(d->ctx, dn, d_stride, gr->n, gr->index, gr->first, gr->count,
	                         d->gate, F, d->down, E, diag);
}

static int moe_block(struct wf_engine *e, struct wf__devfwd *d, uint32_t il, uint32_t n,
                     struct wf_diag *diag)
{
	const struct wf__weights *w = &e->w;
	const struct wf__layer *L = &w->layers[il];
	const struct dlayer *D = &d->L[il];
	const struct wf_engine_dev_ops *o = d->ops;
	const uint32_t E = w->n_embd, F = w->n_ff, X = w->n_expert, K = w->n_expert_used;
	const bool resident = il >= d->first_resident;
	int rc;

	TRY(o->matmul(d->ctx, &D->gate_inp, d->xn, E, n, d->router, X, diag));
	TRY(o->route(d->ctx, d->router, n, X, K, d->ids, d->wts, diag));
	/* The choices come back, with the input the CPU's experts need. */
	TRY(d2h(d, d->h_ids, d->ids, (size_t)n * K * 4, diag));
	if (!resident)
		TRY(d2h(d, d->h_xn, d->xn, (size_t)n * E * 4, diag));
	if (e->router_fn)
		TRY(d2h(d, d->h_router, d->router, (size_t)n * X * 4, diag));
	TRY(wf_device_stream_synchronize(d->stream, diag));
	if (e->router_fn)
		e->router_fn(e->router_arg, il, n, d->h_router);

	for (uint32_t i = 0; i < n * K; i++)
		if (d->h_ids[i] < 0 || (uint32_t)d->h_ids[i] >= X)
			return wf_diag_set(diag, WF_EDEVICE, "the router chose expert %d of %u",
			                   d->h_ids[i], X);
	wf__moe_order(e, L, d->h_ids, n);
	uint32_t *slot_of = d->h_idx + I_STEP_ARRAYS * UBATCH_MAX, *gidx = slot_of + s_rows(e);
	memcpy(slot_of, e->slot_of, (size_t)n * K * sizeof(uint32_t));
	memcpy(gidx, e->row_token, (size_t)n * K * sizeof(uint32_t));
	uint32_t *dslot_of = d->idx + I_STEP_ARRAYS * UBATCH_MAX, *dgidx = dslot_of + s_rows(e);
	TRY(h2d(d, dslot_of, slot_of, (size_t)n * K * 4, diag));
	TRY(h2d(d, dgidx, gidx, (size_t)n * K * 4, diag));

	struct groups gr = {0, d->g_index, d->g_first, d->g_count};
	if (resident) {
		/* The whole layer on the device, over the gathered rows. */
		TRY(o->gather(d->ctx, d->xn, dgidx, n * K, E, d->rows, diag));
		for (uint32_t x = 0; x < X; x++)
			if (e->expert_count[x])
				group_add(&gr, x, e->expert_first[x], e->expert_count[x]);
		TRY(device_experts(d, &gr, &D->gate_exps, &D->up_exps, &D->down_exps,
		                   L->gate_exps.matrix_size, L->up_exps.matrix_size,
		                   L->down_exps.matrix_size, E, F, n * K, diag));
		e->stats.resident_lookups += gr.n; /* as fetch.c counts them: one per expert */
	} else {
		/* Post-fetch: the down projections start moving now (or are found in the expert
		 * cache), while the CPU computes gate and up. */
		if (e->fetch)
			(void)wf__moe_fetch(e, il, L, d->whole);
		/* Split execution: the experts the cache holds whole run on the device (queued,
		 * asynchronous on CUDA) while the CPU computes the others. */
		for (uint32_t x = 0; x < X; x++)
			if (d->whole[x])
				group_add(&gr, (uint32_t)e->fetch_slot[x], e->expert_first[x],
				          e->expert_count[x]);
		if (gr.n) {
			const void *sd, *sg, *su;
			size_t stride;
			wf__fetch_stacks(e->fetch, &sd, &sg, &su, &stride);
			const struct wf_engine_dev_matrix g = dev_matrix(&L->gate_exps, sg),
			                                  u = dev_matrix(&L->up_exps, su),
			                                  dn = dev_matrix(&L->down_exps, sd);
			TRY(o->gather(d->ctx, d->xn, dgidx, n * K, E, d->rows, diag));
			TRY(device_experts(d, &gr, &g, &u, &dn, stride, stride, stride, E, F, 0,
			                   diag));
		}
		TRY(host_experts(e, d, il, n, diag));
		if (e->fetch)
			wf__fetch_end_step(e->fetch);
	}
	return o->moe_sum(d->ctx, d->down, dslot_of, d->wts, n, K, E, d->tmp, diag);
}

static int dense_block(struct wf_engine *e, struct wf__devfwd *d, uint32_t il, uint32_t n,
                       struct wf_diag *diag)
{
	const struct dlayer *D = &d->L[il];
	const struct wf_engine_dev_ops *o = d->ops;
	const uint32_t E = e->w.n_embd, F = e->w.n_ff;
	int rc;
	TRY(o->matmul(d->ctx, &D->ffn_gate, d->xn, E, n, d->gate, F, diag));
	TRY(o->matmul(d->ctx, &D->ffn_up, d->xn, E, n, d->up, F, diag));
	TRY(o->swiglu(d->ctx, d->gate, d->up, d->gate, (size_t)n * F, diag));
	return o->matmul(d->ctx, &D->ffn_down, d->gate, F, n, d->tmp, E, diag);
}

int wf__devfwd_slice(struct wf_engine *e, const int32_t *tokens, const uint32_t *pos,
                     const uint32_t *seq, const bool *want, uint32_t n, float *logits,
                     struct wf_diag *diag)
{
	struct wf__devfwd *d = e->devfwd;
	const struct wf__weights *w = &e->w;
	const struct wf_engine_dev_ops *o = d->ops;
	const uint32_t E = w->n_embd, V = w->n_vocab;
	int rc;
	e->stats.weight_bytes += e->dense_step_bytes + (uint64_t)n * w->tok_embd.row_size;

	/* This slice's indices, in one copy. */
	uint32_t *hi = d->h_idx, n_out = 0;
	for (uint32_t t = 0; t < n; t++) {
		hi[I_TOK * UBATCH_MAX + t] = (uint32_t)tokens[t];
		hi[I_POS * UBATCH_MAX + t] = pos[t];
		hi[I_KV_FIRST * UBATCH_MAX + t] = seq[t] * e->n_ctx;
		hi[I_N_KV * UBATCH_MAX + t] = pos[t] + 1;
		hi[I_DST * UBATCH_MAX + t] = seq[t] * e->n_ctx + pos[t];
		if (want[t])
			hi[I_OUT * UBATCH_MAX + n_out++] = t;
	}
	TRY(h2d(d, d->idx, hi, (size_t)I_STEP_ARRAYS * UBATCH_MAX * 4, diag));
	TRY(o->get_rows(d->ctx, &d->tok_embd, (const int32_t *)d->idx + I_TOK * UBATCH_MAX, n, d->x,
	                diag));

	uint32_t rows = n; /* tokens still carried: the last layer keeps only those with logits */
	for (uint32_t il = 0; il < w->n_layer; il++) {
		TRY(attention_block(e, d, il, rows, diag));
		if (il == w->n_layer - 1 && n_out < rows) {
			TRY(o->gather(d->ctx, d->x, d->idx + I_OUT * UBATCH_MAX, n_out, E, d->tmp,
			              diag));
			TRY(wf_device_memcpy_async(d->stream, d->x, d->tmp, (size_t)n_out * E * 4,
			                           WF_DEVICE_COPY_D2D, diag));
			rows = n_out;
		}
		if (rows == 0)
			break;
		TRY(o->rms_norm(d->ctx, d->x, d->L[il].ffn_norm, d->xn, rows, E, E, w->rms_eps,
		                diag));
		TRY(w->moe ? moe_block(e, d, il, rows, diag) : dense_block(e, d, il, rows, diag));
		TRY(o->add(d->ctx, d->x, d->tmp, (size_t)rows * E, diag));
	}
	if (n_out == 0)
		return wf_device_stream_synchronize(d->stream, diag);
	TRY(o->rms_norm(d->ctx, d->x, d->output_norm, d->xn, n_out, E, E, w->rms_eps, diag));
	for (uint32_t c0 = 0; c0 < n_out; c0 += OUT_CHUNK) {
		const uint32_t cn = n_out - c0 < OUT_CHUNK ? n_out - c0 : OUT_CHUNK;
		TRY(o->matmul(d->ctx, &d->output, d->xn + (size_t)c0 * E, E, cn, d->out, V, diag));
		TRY(d2h(d, logits + (size_t)c0 * V, d->out, (size_t)cn * V * 4, diag));
	}
	return wf_device_stream_synchronize(d->stream, diag);
}
