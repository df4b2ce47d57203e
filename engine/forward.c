/* The forward pass: llama.cpp's graph for qwen3moe and llama (src/models/qwen3moe.cpp,
 * src/models/llama.cpp, build_moe_ffn in src/llama-graph.cpp) computed op by op over a batch of
 * tokens, with the matrix products split over the thread pool.
 *
 * A matrix product quantizes its activation rows once to the weight type's vec_dot_type (as ggml's
 * mul_mat does) and then takes row-by-row dots, each weight row against every activation row, so a
 * weight row is read from memory once per step however many tokens the batch holds. The experts
 * of a layer run grouped by expert: the rows of all tokens routed to one expert are gathered, so a
 * batched decode step reads each selected expert once. */
#include "engine/engine_state.h"

#include "base/error.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CTX_DEFAULT_CAP 4096u

/* y[n][rows] = W . x[n][cols] for one plain matrix. */
static void matmul(struct wf_engine *e, struct wf__mm_phase *ph, const struct wf__wt *w,
                   const float *x, uint32_t n, float *y)
{
	wf__matmul(&e->cpu, ph, w, x, (size_t)w->ne[0], n, e->qa, y, (size_t)w->ne[1]);
}

/* ---- attention ------------------------------------------------------------------------------ */

struct attn_job {
	struct wf_engine *e;
	uint32_t layer, n;
	const uint32_t *pos, *seq;
};

static void attn_task(void *arg, uint32_t task, uint32_t thread)
{
	const struct attn_job *a = arg;
	struct wf_engine *e = a->e;
	const struct wf__weights *w = &e->w;
	const uint32_t t = task / w->n_head, h = task % w->n_head;
	const uint32_t kvh = h / (w->n_head / w->n_head_kv);
	const uint32_t D = w->head_dim;
	const size_t kv_stride = (size_t)e->kv.row * e->kv.elem;
	const uint8_t *k = wf__kv_k(&e->kv, a->layer, a->seq[t], 0) + (size_t)kvh * D * e->kv.elem;
	const uint8_t *v = wf__kv_v(&e->kv, a->layer, a->seq[t], 0) + (size_t)kvh * D * e->kv.elem;
	wf__attend(e->q + (size_t)t * e->q_dim + (size_t)h * D, k, v, kv_stride, a->pos[t] + 1, D,
	           1.0f / sqrtf((float)D), e->kv.type,
	           e->att_scratch + thread * e->att_scratch_floats,
	           e->attn + (size_t)t * e->q_dim + (size_t)h * D);
}

static void store_kv(struct wf_engine *e, uint32_t layer, uint32_t seq, uint32_t pos,
                     const float *k, const float *v)
{
	uint8_t *kd = wf__kv_k(&e->kv, layer, seq, pos), *vd = wf__kv_v(&e->kv, layer, seq, pos);
	if (e->kv.type == WF_ENGINE_KV_F16) {
		e->cpu.ops->from_float[WF_DTYPE_F16](k, kd, e->kv_dim);
		e->cpu.ops->from_float[WF_DTYPE_F16](v, vd, e->kv_dim);
	} else {
		memcpy(kd, k, e->kv_dim * sizeof(float));
		memcpy(vd, v, e->kv_dim * sizeof(float));
	}
}

static void attention_block(struct wf_engine *e, struct wf__mm_phase *ph, uint32_t il, uint32_t n,
                            const uint32_t *pos, const uint32_t *seq)
{
	const struct wf__weights *w = &e->w;
	const struct wf__layer *L = &w->layers[il];
	const uint32_t E = w->n_embd, D = w->head_dim;
	for (uint32_t t = 0; t < n; t++)
		wf__rms_norm(e->x + (size_t)t * E, L->attn_norm.data, e->xn + (size_t)t * E, E,
		             w->rms_eps);
	/* Q, K and V share the quantized input when their types pair with one activation type. */
	const enum wf_dtype aq = L->wq.ops->vec_dot_type;
	size_t stride = wf__quantize_rows(&e->cpu, aq, e->xn, E, n, E, e->qa);
	wf__mm_add(ph, &L->wq, 0, NULL, e->qa, stride, n, e->q, e->q_dim);
	const uint8_t *ka = e->qa, *va = e->qa;
	size_t ks = stride, vs = stride;
	uint8_t *next = e->qa + stride * n;
	if (L->wk.ops->vec_dot_type != aq) {
		ks = wf__quantize_rows(&e->cpu, L->wk.ops->vec_dot_type, e->xn, E, n, E, next);
		ka = next;
		next += ks * n;
	}
	if (L->wv.ops->vec_dot_type != aq) {
		vs = wf__quantize_rows(&e->cpu, L->wv.ops->vec_dot_type, e->xn, E, n, E, next);
		va = next;
	}
	wf__mm_add(ph, &L->wk, 0, NULL, ka, ks, n, e->k, e->kv_dim);
	wf__mm_add(ph, &L->wv, 0, NULL, va, vs, n, e->v, e->kv_dim);
	wf__mm_run(&e->cpu, ph);

	for (uint32_t t = 0; t < n; t++) {
		float *q = e->q + (size_t)t * e->q_dim, *k = e->k + (size_t)t * e->kv_dim;
		const float *cs = e->rope_cs + (size_t)t * w->rope_dim;
		for (uint32_t h = 0; h < w->n_head; h++) {
			if (w->qk_norm)
				wf__rms_norm(q + h * D, L->q_norm.data, q + h * D, D, w->rms_eps);
			wf__rope(q + h * D, w->rope_dim, cs, w->rope);
		}
		for (uint32_t h = 0; h < w->n_head_kv; h++) {
			if (w->qk_norm)
				wf__rms_norm(k + h * D, L->k_norm.data, k + h * D, D, w->rms_eps);
			wf__rope(k + h * D, w->rope_dim, cs, w->rope);
		}
		store_kv(e, il, seq[t], pos[t], k, e->v + (size_t)t * e->kv_dim);
	}
	struct attn_job aj = {e, il, n, pos, seq};
	wf_pool_run(e->cpu.pool, attn_task, &aj, n * w->n_head);

	matmul(e, ph, &L->wo, e->attn, n, e->tmp);
	for (size_t i = 0; i < (size_t)n * E; i++)
		e->x[i] += e->tmp[i];
}

/* ---- feed-forward --------------------------------------------------------------------------- */

static void dense_ffn(struct wf_engine *e, struct wf__mm_phase *ph, const struct wf__layer *L,
                      uint32_t n)
{
	const uint32_t E = e->w.n_embd, F = e->w.n_ff;
	size_t stride =
	    wf__quantize_rows(&e->cpu, L->ffn_gate.ops->vec_dot_type, e->xn, E, n, E, e->qa);
	wf__mm_add(ph, &L->ffn_gate, 0, NULL, e->qa, stride, n, e->gate, F);
	const uint8_t *ua = e->qa;
	size_t us = stride;
	if (L->ffn_up.ops->vec_dot_type != L->ffn_gate.ops->vec_dot_type) {
		us = wf__quantize_rows(&e->cpu, L->ffn_up.ops->vec_dot_type, e->xn, E, n, E, e->qb);
		ua = e->qb;
	}
	wf__mm_add(ph, &L->ffn_up, 0, NULL, ua, us, n, e->up, F);
	wf__mm_run(&e->cpu, ph);
	for (uint32_t t = 0; t < n; t++)
		wf__swiglu(e->gate + (size_t)t * F, e->up + (size_t)t * F, e->hbuf + (size_t)t * F,
		           F);
	stride = wf__quantize_rows(&e->cpu, L->ffn_down.ops->vec_dot_type, e->hbuf, F, n, F, e->qa);
	wf__mm_add(ph, &L->ffn_down, 0, NULL, e->qa, stride, n, e->tmp, E);
	wf__mm_run(&e->cpu, ph);
}

/* ---- the MoE steps both forward passes share ---------------------------------------------- */

void wf__moe_order(struct wf_engine *e, const struct wf__layer *L, const int32_t *ids, uint32_t n)
{
	const uint32_t X = e->w.n_expert, K = e->w.n_expert_used;
	memset(e->expert_count, 0, X * sizeof(uint32_t));
	for (uint32_t i = 0; i < n * K; i++)
		e->expert_count[ids[i]]++;
	uint32_t at = 0;
	for (uint32_t x = 0; x < X; x++) {
		if (e->expert_count[x])
			e->stats.weight_bytes += L->gate_exps.matrix_size + L->up_exps.matrix_size +
			                         L->down_exps.matrix_size;
		e->expert_first[x] = at;
		at += e->expert_count[x];
		e->expert_count[x] = 0;
	}
	for (uint32_t t = 0; t < n; t++) {
		for (uint32_t j = 0; j < K; j++) {
			const uint32_t x = (uint32_t)ids[t * K + j];
			const uint32_t r = e->expert_first[x] + e->expert_count[x]++;
			e->slot_of[t * K + j] = r;
			e->row_token[r] = t;
		}
	}
}

uint32_t wf__moe_fetch(struct wf_engine *e, uint32_t il, const struct wf__layer *L,
                       uint8_t *ret_whole)
{
	const uint32_t X = e->w.n_expert;
	uint32_t nf = 0;
	for (uint32_t x = 0; x < X; x++) {
		e->fetch_slot[x] = -1;
		if (ret_whole)
			ret_whole[x] = 0;
		if (!e->expert_count[x])
			continue;
		e->fetch_ids[nf] = x;
		e->fetch_src[nf] = (struct wf__fetch_src){.d = (const uint8_t *)L->down_exps.data +
		                                               (size_t)x * L->down_exps.matrix_size,
		                                          .d_bytes = L->down_exps.matrix_size};
		if (ret_whole) {
			e->fetch_src[nf].g = (const uint8_t *)L->gate_exps.data +
			                     (size_t)x * L->gate_exps.matrix_size;
			e->fetch_src[nf].u =
			    (const uint8_t *)L->up_exps.data + (size_t)x * L->up_exps.matrix_size;
			e->fetch_src[nf].g_bytes = L->gate_exps.matrix_size;
			e->fetch_src[nf].u_bytes = L->up_exps.matrix_size;
		}
		nf++;
	}
	wf__fetch_step(e->fetch, il, nf, e->fetch_ids, e->fetch_src, e->fetch_step_slot,
	               ret_whole ? e->fetch_whole : NULL);
	for (uint32_t i = 0; i < nf; i++) {
		e->fetch_slot[e->fetch_ids[i]] = e->fetch_step_slot[i];
		if (ret_whole)
			ret_whole[e->fetch_ids[i]] = e->fetch_whole[i];
	}
	return nf;
}

void wf__moe_gate_up(struct wf_engine *e, const struct wf__layer *L, const float *xn, uint32_t n,
                     const uint8_t *skip, float *h)
{
	const struct wf__weights *w = &e->w;
	const uint32_t E = w->n_embd, F = w->n_ff, X = w->n_expert, K = w->n_expert_used;
	struct wf__mm_phase *ph = e->ph;
	/* Each token's input quantized once, then gathered per expert. */
	const enum wf_dtype ag = L->gate_exps.ops->vec_dot_type, au = L->up_exps.ops->vec_dot_type;
	const size_t gs = wf__act_row_bytes(ag, E), us = wf__act_row_bytes(au, E);
	uint8_t *tok_g = e->qb, *tok_u = e->qb + gs * n;
	wf__quantize_rows(&e->cpu, ag, xn, E, n, E, tok_g);
	if (au != ag)
		wf__quantize_rows(&e->cpu, au, xn, E, n, E, tok_u);
	uint8_t *rows_g = e->qa, *rows_u = au != ag ? e->qa + gs * n * K : e->qa;
	for (uint32_t r = 0; r < n * K; r++) {
		memcpy(rows_g + r * gs, tok_g + e->row_token[r] * gs, gs);
		if (au != ag)
			memcpy(rows_u + r * us, tok_u + e->row_token[r] * us, us);
	}
	for (uint32_t x = 0; x < X; x++) {
		const uint32_t c = skip && skip[x] ? 0 : e->expert_count[x], f = e->expert_first[x];
		wf__mm_add(ph, &L->gate_exps, x, NULL, rows_g + f * gs, gs, c,
		           e->gate + (size_t)f * F, F);
		wf__mm_add(ph, &L->up_exps, x, NULL, rows_u + f * us, us, c, e->up + (size_t)f * F,
		           F);
	}
	wf__mm_run(&e->cpu, ph);
	for (uint32_t x = 0; x < X; x++) {
		if (skip && skip[x])
			continue;
		for (uint32_t r = e->expert_first[x]; r < e->expert_first[x] + e->expert_count[x];
		     r++)
			wf__swiglu(e->gate + (size_t)r * F, e->up + (size_t)r * F,
			           h + (size_t)r * F, F);
	}
}

static void moe_ffn(struct wf_engine *e, struct wf__mm_phase *ph, uint32_t il,
                    const struct wf__layer *L, uint32_t n)
{
	const struct wf__weights *w = &e->w;
	const uint32_t E = w->n_embd, F = w->n_ff, X = w->n_expert, K = w->n_expert_used;

	matmul(e, ph, &L->gate_inp, e->xn, n, e->router);
	if (e->router_fn)
		e->router_fn(e->router_arg, il, n, e->router);
	for (uint32_t t = 0; t < n; t++)
		wf__route(e->router + (size_t)t * X, X, K, e->probs, e->sel + (size_t)t * K,
		          e->sel_w + (size_t)t * K);
	wf__moe_order(e, L, e->sel, n);

	/* Post-fetch: the selected experts' down projections start moving to the device now (or
	 * are found in the expert cache), in expert order, while gate and up compute below. */
	const uint32_t n_fetch = e->fetch ? wf__moe_fetch(e, il, L, NULL) : 0;
	wf__moe_gate_up(e, L, e->xn, n, NULL, e->hbuf);

	const enum wf_dtype ad = L->down_exps.ops->vec_dot_type;
	const size_t ds = wf__quantize_rows(&e->cpu, ad, e->hbuf, F, n * K, F, e->qa);
	struct wf__fetch_stats before;
	if (e->fetch && e->fetch_debug)
		wf__fetch_get_stats(e->fetch, &before);
	for (uint32_t x = 0; x < X; x++) {
		const uint32_t c = e->expert_count[x], f = e->expert_first[x];
		const void *copy = NULL;
		if (c && e->fetch)
			copy = wf__fetch_ready(e->fetch, e->fetch_slot[x]);
		wf__mm_add(ph, &L->down_exps, x, copy, e->qa + f * ds, ds, c,
		           e->down + (size_t)f * E, E);
	}
	wf__mm_run(&e->cpu, ph);
	if (e->fetch) {
		wf__fetch_end_step(e->fetch);
		if (e->fetch_debug && e->log_fn) {
			struct wf__fetch_stats after;
			wf__fetch_get_stats(e->fetch, &after);
			char line[192];
			snprintf(
			    line, sizeof line,
			    "post-fetch layer %u: %u experts, %llu cached, %llu copied, %llu from "
			    "the device, %llu on the cpu, %.3f ms blocked",
			    il, n_fetch, (unsigned long long)(after.hits - before.hits),
			    (unsigned long long)(after.experts - before.experts),
			    (unsigned long long)(after.used - before.used),
			    (unsigned long long)(after.fallbacks - before.fallbacks),
			    (double)(after.wait_ns - before.wait_ns) / 1e6);
			e->log_fn(e->log_arg, line);
		}
	}

	wf__moe_sum(e->down, e->slot_of, e->sel_w, n, K, E, e->tmp);
}

/* ---- one slice of a batch ------------------------------------------------------------------- */

static void forward_slice(struct wf_engine *e, struct wf__mm_phase *ph, const int32_t *tokens,
                          const uint32_t *pos, const uint32_t *seq, const bool *want, uint32_t n,
                          float *logits)
{
	const struct wf__weights *w = &e->w;
	const uint32_t E = w->n_embd;
	e->stats.weight_bytes += e->dense_step_bytes + (uint64_t)n * w->tok_embd.row_size;
	/* RoPE angles depend on the position only: once per token, for every head and layer. */
	for (uint32_t t = 0; t < n; t++)
		wf__rope_angles(pos[t], w->rope_dim, w->rope_base,
		                e->rope_cs + (size_t)t * w->rope_dim);
	for (uint32_t t = 0; t < n; t++)
		w->tok_embd.ops->dequantize_row((const uint8_t *)w->tok_embd.data +
		                                    (size_t)tokens[t] * w->tok_embd.row_size,
		                                e->x + (size_t)t * E, E);
	uint32_t n_out = 0;
	for (uint32_t t = 0; t < n; t++)
		if (want[t])
			e->out_rows[n_out++] = t;

	uint32_t rows = n; /* tokens still carried: the last layer keeps only those with logits */
	for (uint32_t il = 0; il < w->n_layer; il++) {
		const struct wf__layer *L = &w->layers[il];
		attention_block(e, ph, il, rows, pos, seq);
		if (il == w->n_layer - 1 && n_out < rows) {
			for (uint32_t i = 0; i < n_out; i++)
				memmove(e->x + (size_t)i * E, e->x + (size_t)e->out_rows[i] * E,
				        E * sizeof(float));
			rows = n_out;
		}
		for (uint32_t t = 0; t < rows; t++)
			wf__rms_norm(e->x + (size_t)t * E, L->ffn_norm.data, e->xn + (size_t)t * E,
			             E, w->rms_eps);
		if (w->moe)
			moe_ffn(e, ph, il, L, rows);
		else
			dense_ffn(e, ph, L, rows);
		for (size_t i = 0; i < (size_t)rows * E; i++)
			e->x[i] += e->tmp[i];
	}
	if (n_out == 0)
		return;
	for (uint32_t t = 0; t < n_out; t++)
		wf__rms_norm(e->x + (size_t)t * E, w->output_norm.data, e->xn + (size_t)t * E, E,
		             w->rms_eps);
	matmul(e, ph, &w->output, e->xn, n_out, logits);
}

/* ---- public API ----------------------------------------------------------------------------- */

static uint32_t online_cpus(void)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);
	return n < 1 ? 1u : n > WF_ENGINE_MAX_THREADS ? WF_ENGINE_MAX_THREADS : (uint32_t)n;
}

/* The activation type with the most bytes per element among those the weights pair with. */
static enum wf_dtype widest_act(const struct wf_engine *e)
{
	const struct wf__weights *w = &e->w;
	enum wf_dtype best = WF_DTYPE_Q8_0;
	double best_bpe = 0;
	for (uint32_t il = 0; il <= w->n_layer; il++) {
		const struct wf__wt *list[12];
		uint32_t n = 0;
		if (il == w->n_layer) {
			list[n++] = &w->output;
		} else {
			const struct wf__layer *L = &w->layers[il];
			const struct wf__wt *all[] = {&L->wq,      &L->wk,        &L->wv,
			                              &L->wo,      &L->gate_inp,  &L->gate_exps,
			                              &L->up_exps, &L->down_exps, &L->ffn_gate,
			                              &L->ffn_up,  &L->ffn_down};
			for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
				if (all[i]->ops)
					list[n++] = all[i];
		}
		for (uint32_t i = 0; i < n; i++) {
			const struct wf_dtype_info *a = wf_dtype_info(list[i]->ops->vec_dot_type);
			const double bpe = (double)a->type_size / a->block_size;
			if (bpe > best_bpe) {
				best_bpe = bpe;
				best = a->dtype;
			}
		}
	}
	return best;
}

/* Scratch is one anonymous mapping carved into buffers: its pages stay untouched (no memory)
 * until a batch that large uses them, whichever thread creates the engine. (calloc from a
 * thread's malloc arena zeroes, and so touches, every byte it hands out.) */
static int alloc_scratch(struct wf_engine *e)
{
	const struct wf__weights *w = &e->w;
	const size_t U = UBATCH_MAX, K = w->moe ? w->n_expert_used : 1, S = U * K;
	const size_t E = w->n_embd, F = w->n_ff, X = w->moe ? w->n_expert : 1;
	/* Quantized activations, for every row a phase quantizes (three inputs of Q/K/V, or the
	 * slots' rows twice), at the widest activation type any weight pairs with. */
	e->qa_size =
	    S * wf__act_row_bytes(widest_act(e), (int64_t)((e->max_dim + 255u) & ~255u)) * 3u +
	    4096u;
	e->att_scratch_floats = 2u * w->head_dim + e->n_ctx + 16u;
	struct {
		void **ptr;
		size_t bytes;
	} bufs[] = {
	    {(void **)&e->x, U * E * sizeof(float)},
	    {(void **)&e->xn, U * E * sizeof(float)},
	    {(void **)&e->tmp, U * E * sizeof(float)},
	    {(void **)&e->q, U * e->q_dim * sizeof(float)},
	    {(void **)&e->attn, U * e->q_dim * sizeof(float)},
	    {(void **)&e->k, U * e->kv_dim * sizeof(float)},
	    {(void **)&e->v, U * e->kv_dim * sizeof(float)},
	    {(void **)&e->router, U * X * sizeof(float)},
	    {(void **)&e->rope_cs, U * w->rope_dim * sizeof(float)},
	    {(void **)&e->probs, X * sizeof(float)},
	    {(void **)&e->sel, S * sizeof(int32_t)},
	    {(void **)&e->sel_w, S * sizeof(float)},
	    {(void **)&e->gate, S * F * sizeof(float)},
	    {(void **)&e->up, S * F * sizeof(float)},
	    {(void **)&e->hbuf, S * F * sizeof(float)},
	    {(void **)&e->down, S * E * sizeof(float)},
	    {(void **)&e->slot_of, S * sizeof(uint32_t)},
	    {(void **)&e->row_token, S * sizeof(uint32_t)},
	    {(void **)&e->expert_first, X * sizeof(uint32_t)},
	    {(void **)&e->expert_count, X * sizeof(uint32_t)},
	    {(void **)&e->out_rows, U * sizeof(uint32_t)},
	    {(void **)&e->qa, e->qa_size},
	    {(void **)&e->qb, e->qa_size},
	    {(void **)&e->att_scratch,
	     (size_t)e->n_threads * e->att_scratch_floats * sizeof(float)},
	    {(void **)&e->ph, sizeof(*e->ph)},
	};
	size_t total = 0;
	for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
		total += (bufs[i].bytes + 63u) & ~(size_t)63u;
	uint8_t *base = wf__map_zeroed(total);
	if (!base)
		return -ENOMEM;
	e->scratch = base;
	e->scratch_size = total;
	for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) {
		*bufs[i].ptr = base;
		base += (bufs[i].bytes + 63u) & ~(size_t)63u;
	}
	return 0;
}

/* Registers the floor's pages that post-fetch copies from (the host-side layers' experts: down
 * projections, and gate and up for whole cache slots) so the copies are DMA from the one shared
 * copy. A range the worker registered already (WF_EOVERLAP) is fine; any other refusal leaves
 * the copies to the driver's staging. */
static void register_floor(struct wf_engine *e, struct wf_device *dev, uint32_t first_resident)
{
	const struct wf__weights *w = &e->w;
	uintptr_t lo = UINTPTR_MAX, hi = 0;
	for (uint32_t il = 0; il < first_resident && il < w->n_layer; il++) {
		const struct wf__wt *t[3] = {&w->layers[il].down_exps, &w->layers[il].gate_exps,
		                             &w->layers[il].up_exps};
		for (int i = 0; i < 3; i++) {
			if (!t[i]->data)
				continue;
			const uintptr_t a = (uintptr_t)t[i]->data,
			                b = a + t[i]->matrix_size * (size_t)t[i]->ne[2];
			lo = a < lo ? a : lo;
			hi = b > hi ? b : hi;
		}
	}
	if (lo >= hi)
		return;
	const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
	lo &= ~(page - 1);
	hi = (hi + page - 1) & ~(page - 1);
	if (wf_device_host_register(dev, (const void *)lo, hi - lo, WF_DEVICE_REGISTER_READONLY,
	                            NULL, NULL) == 0) {
		e->reg_dev = dev;
		e->reg_base = (const void *)lo;
	}
}

static bool dev_forward(const struct wf_engine_config *cfg)
{
	return cfg->device &&
	       (cfg->dense_on_device || wf_device_kind(cfg->device) != WF_DEVICE_KIND_HOST);
}

/* Post-fetch when the engine has a device, a MoE model, and the settings ask for it. */
static int fetch_init(struct wf_engine *e, const struct wf_engine_config *cfg, struct wf_diag *diag)
{
	struct wf_postfetch_settings s;
	if (cfg->postfetch)
		s = *cfg->postfetch;
	else
		wf_postfetch_settings_default(&s);
	const struct wf__weights *w = &e->w;
	const bool pf = cfg->device && s.enable && !s.force_cpu;
	if (cfg->expert_cache_mb && !pf)
		return wf_diag_set(diag, WF_EINVAL,
		                   "an expert cache needs a device and post-fetch (its miss path)");
	if (cfg->experts_on_device && !cfg->device)
		return wf_diag_set(diag, WF_EINVAL, "resident experts need a device");
	/* Resident experts: whole in the device forward pass's weights, or their down projections
	 * in pinned slots here for the CPU forward pass. */
	const uint32_t first_resident = dev_forward(cfg) ? w->n_layer : wf__first_resident(e, cfg);
	const uint32_t n_resident = (w->n_layer - first_resident) * w->n_expert;
	if (!w->moe || (!pf && n_resident == 0))
		return 0;
	struct wf__fetch_shape shape = {.n_layer = w->n_layer,
	                                .n_expert = w->n_expert,
	                                .cache_mb = cfg->expert_cache_mb,
	                                .n_resident = n_resident,
	                                .postfetch = pf};
	/* The device forward pass keeps experts whole in its cache, so a hit runs on the device
	 * entirely; the CPU forward pass computes gate and up itself and caches down only. */
	shape.whole = dev_forward(cfg) && cfg->expert_cache_mb;
	for (uint32_t il = 0; il < w->n_layer; il++) {
		const struct wf__layer *L = &w->layers[il];
		if (L->down_exps.matrix_size > shape.slot_bytes)
			shape.slot_bytes = L->down_exps.matrix_size;
		if (L->gate_exps.matrix_size > shape.max_g)
			shape.max_g = L->gate_exps.matrix_size;
		if (L->up_exps.matrix_size > shape.max_u)
			shape.max_u = L->up_exps.matrix_size;
	}
	uint64_t step = (uint64_t)UBATCH_MAX * w->n_expert_used;
	shape.step_experts = (uint32_t)(step < w->n_expert ? step : w->n_expert);
	e->fetch_src = calloc(w->n_expert, sizeof(*e->fetch_src));
	e->fetch_whole = calloc(w->n_expert, sizeof(*e->fetch_whole));
	e->fetch_ids = calloc(w->n_expert, sizeof(*e->fetch_ids));
	e->fetch_step_slot = calloc(w->n_expert, sizeof(*e->fetch_step_slot));
	e->fetch_slot = calloc(w->n_expert, sizeof(*e->fetch_slot));
	if (!e->fetch_src || !e->fetch_whole || !e->fetch_ids || !e->fetch_step_slot ||
	    !e->fetch_slot)
		return wf_diag_set(diag, -ENOMEM, "post-fetch");
	e->fetch_debug = s.debug;
	int rc = wf__fetch_create(cfg->device, &s, &shape, &e->fetch, diag);
	for (uint32_t il = first_resident; rc == 0 && il < w->n_layer; il++) {
		const struct wf__wt *d = &w->layers[il].down_exps;
		for (uint32_t x = 0; rc == 0 && x < w->n_expert; x++)
			rc = wf__fetch_pin(e->fetch, il, x,
			                   (const uint8_t *)d->data + x * d->matrix_size,
			                   d->matrix_size, diag);
	}
	return rc;
}

int wf_engine_create(const struct wf_model *model, const void *const *tensor_data,
                     const struct wf_engine_config *cfg, struct wf_engine **ret_engine,
                     struct wf_diag *diag)
{
	static const struct wf_engine_config defaults = {0};
	wf_diag_clear(diag);
	if (!cfg)
		cfg = &defaults;
	if (!model || !tensor_data || cfg->kv_type >= WF_ENGINE_KV_MAX ||
	    cfg->n_seq_max > WF_ENGINE_MAX_SEQ || cfg->n_threads > WF_ENGINE_MAX_THREADS)
		return wf_diag_set(diag, WF_EINVAL, "engine configuration out of range");
	struct wf_engine *e = calloc(1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	e->cpu.ops = wf_kernels_cpu_ops();
	int rc;
	if (!e->cpu.ops) {
		enum wf_kernel_level level;
		rc = wf_kernels_cpu_level(&level);
		rc = wf_diag_set(diag, rc < 0 ? rc : WF_EUNSUPPORTED,
		                 "WF_KERNELS names a kernel level this CPU or build lacks");
		goto fail;
	}
	rc = wf__weights_resolve(model, tensor_data, e->cpu.ops, &e->w, diag);
	if (rc < 0)
		goto fail;
	const struct wf__weights *w = &e->w;
	e->n_ctx = cfg->n_ctx;
	if (!e->n_ctx)
		e->n_ctx = w->n_ctx_train && w->n_ctx_train < CTX_DEFAULT_CAP ? w->n_ctx_train
		                                                              : CTX_DEFAULT_CAP;
	if (w->n_ctx_train && e->n_ctx > w->n_ctx_train) {
		rc =
		    wf_diag_set(diag, WF_ELIMIT, "context %u exceeds the model's context_length %u",
		                e->n_ctx, w->n_ctx_train);
		goto fail;
	}
	e->n_seq_max = cfg->n_seq_max ? cfg->n_seq_max : 1;
	e->dense_step_bytes = w->bytes_per_token - w->tok_embd.row_size;
	if (w->moe)
		for (uint32_t il = 0; il < w->n_layer; il++)
			e->dense_step_bytes -=
			    (uint64_t)w->n_expert_used * (w->layers[il].gate_exps.matrix_size +
			                                  w->layers[il].up_exps.matrix_size +
			                                  w->layers[il].down_exps.matrix_size);
	e->n_threads = cfg->n_threads ? cfg->n_threads : online_cpus();
	e->cpu.n_threads = e->n_threads;
	e->q_dim = w->n_head * w->head_dim;
	e->kv_dim = w->n_head_kv * w->head_dim;
	e->max_dim = w->n_embd;
	if (w->n_ff > e->max_dim)
		e->max_dim = w->n_ff;
	if (e->q_dim > e->max_dim)
		e->max_dim = e->q_dim;
	if ((rc = wf__kv_init(&e->kv, cfg->kv_type, w->n_layer, e->n_seq_max, e->n_ctx,
	                      e->kv_dim)) < 0) {
		wf_diag_set(diag, rc, "KV cache of %u x %u positions", e->n_seq_max, e->n_ctx);
		goto fail;
	}
	if ((rc = alloc_scratch(e)) < 0) {
		wf_diag_set(diag, rc, "engine scratch buffers");
		goto fail;
	}
	if ((rc = wf_pool_create(e->n_threads, &e->cpu.pool)) < 0) {
		wf_diag_set(diag, rc, "thread pool of %u", e->n_threads);
		goto fail;
	}
	if (cfg->dense_on_device && !cfg->device) {
		rc = wf_diag_set(diag, WF_EINVAL, "dense weights on the device need a device");
		goto fail;
	}
	if ((rc = fetch_init(e, cfg, diag)) < 0)
		goto fail;
	if (dev_forward(cfg) && (rc = wf__devfwd_create(e, cfg, diag)) < 0)
		goto fail;
	/* Last: the weights' own copies to the device (resident experts, the device forward pass's
	 * dense weights) are done, only post-fetch copies from here on. */
	if (e->fetch && cfg->device)
		register_floor(e, cfg->device, wf__first_resident(e, cfg));
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
	wf__devfwd_destroy(e->devfwd);
	wf__fetch_destroy(e->fetch); /* waits for copies still reading the view */
	if (e->reg_base)
		(void)wf_device_host_unregister(e->reg_dev, e->reg_base, NULL);
	free(e->fetch_src);
	free(e->fetch_whole);
	free(e->fetch_ids);
	free(e->fetch_step_slot);
	free(e->fetch_slot);
	wf_pool_destroy(e->cpu.pool);
	wf__kv_fini(&e->kv);
	wf__weights_fini(&e->w);
	wf__unmap(e->scratch, e->scratch_size);
	free(e);
}

void wf_engine_get_info(const struct wf_engine *e, struct wf_engine_info *ret)
{
	const struct wf__weights *w = &e->w;
	memset(ret, 0, sizeof(*ret));
	ret->arch = w->arch;
	ret->n_vocab = w->n_vocab;
	ret->n_embd = w->n_embd;
	ret->n_layer = w->n_layer;
	ret->n_head = w->n_head;
	ret->n_head_kv = w->n_head_kv;
	ret->head_dim = w->head_dim;
	if (w->moe) {
		ret->n_expert = w->n_expert;
		ret->n_expert_used = w->n_expert_used;
		ret->n_ff_exp = w->n_ff;
	}
	ret->n_ctx = e->n_ctx;
	ret->n_seq_max = e->n_seq_max;
	ret->n_threads = e->n_threads;
	ret->weight_bytes_per_token = w->bytes_per_token;
	ret->kv_bytes = 2ull * e->kv.n_layer * e->kv.n_seq * e->kv.n_ctx * e->kv.row * e->kv.elem;
	ret->scratch_bytes = e->scratch_size;
	if (e->fetch) {
		struct wf__fetch_stats f;
		wf__fetch_get_stats(e->fetch, &f);
		ret->device_bytes = f.scratchpad_bytes + f.resident_bytes;
	}
	ret->device_bytes += wf__devfwd_device_bytes(e->devfwd);
}

static int check_batch(const struct wf_engine *e, const struct wf_engine_batch *b,
                       struct wf_diag *diag)
{
	if (!b || (b->n && (!b->tokens || !b->pos || !b->seq)))
		return wf_diag_set(diag, WF_EINVAL, "batch without tokens, positions or sequences");
	uint32_t next[WF_ENGINE_MAX_SEQ];
	memcpy(next, e->kv.len, e->n_seq_max * sizeof(uint32_t));
	for (uint32_t i = 0; i < b->n; i++) {
		if (b->tokens[i] < 0 || (uint32_t)b->tokens[i] >= e->w.n_vocab)
			return wf_diag_set(diag, WF_EINVAL,
			                   "token %d is outside the vocabulary of %u", b->tokens[i],
			                   e->w.n_vocab);
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
	struct wf__mm_phase *ph = e->ph;
	float *out = logits;
	for (uint32_t s0 = 0; s0 < b->n; s0 += UBATCH_MAX) {
		const uint32_t n = b->n - s0 < UBATCH_MAX ? b->n - s0 : UBATCH_MAX;
		const bool *want = b->want_logits ? b->want_logits + s0 : last_only;
		if (!b->want_logits)
			for (uint32_t i = 0; i < n; i++)
				last_only[i] = s0 + i == b->n - 1;
		if (e->devfwd) {
			rc = wf__devfwd_slice(e, b->tokens + s0, b->pos + s0, b->seq + s0, want, n,
			                      out, diag);
			if (rc < 0)
				return rc; /* KV lengths unchanged: the sequences are as they were
				            */
		} else {
			forward_slice(e, ph, b->tokens + s0, b->pos + s0, b->seq + s0, want, n,
			              out);
		}
		for (uint32_t i = 0; i < n; i++)
			if (want[i])
				out += e->w.n_vocab;
	}
	for (uint32_t i = 0; i < b->n; i++)
		e->kv.len[b->seq[i]] = b->pos[i] + 1;
	e->stats.decodes++;
	e->stats.tokens += b->n;
	return 0;
}

uint32_t wf_engine_seq_len(const struct wf_engine *e, uint32_t seq)
{
	return seq < e->n_seq_max ? e->kv.len[seq] : 0;
}

int wf_engine_seq_truncate(struct wf_engine *e, uint32_t seq, uint32_t pos)
{
	if (seq >= e->n_seq_max)
		return WF_EINVAL;
	if (pos < e->kv.len[seq])
		e->kv.len[seq] = pos;
	return 0;
}

void wf_engine_get_stats(const struct wf_engine *e, struct wf_engine_stats *ret)
{
	*ret = e->stats;
	ret->fetch_overlap = -1;
	if (e->devfwd)
		ret->resident_bytes = wf__devfwd_resident_bytes(e->devfwd, &e->w);
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
	ret->resident_lookups = f.resident + e->stats.resident_lookups;
	ret->resident_bytes += f.resident_bytes;
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
