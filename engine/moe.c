/* The routed experts of a MoE layer (llama.cpp's build_moe_ffn: softmax gating over every expert,
 * top k, weights renormalized, SwiGLU experts, the weighted sum in selected order), placed by the
 * plan:
 *
 *   resident   (layers >= the first resident one) routed and computed where the experts lie,
 *              the device (or the CPU engine's host backend), with the choices left where the
 *              router wrote them: mul_mat_id reads them in place, so the step needs no host
 *              wait and a CUDA decode step can be captured whole.
 *   host-side  (the other layers) the experts stay in the floor. The choices come back to the
 *              host (the one wait), then per selected expert: a hit the expert cache holds whole
 *              (copies complete) runs gate, up and down on the device from its slot, queued
 *              first so the device works while the CPU does; a miss is post-fetched (its down
 *              projection copied into a slot on a private stream; a hit on a slot of down
 *              projections only goes on as a miss whose copy is done) while the CPU computes its
 *              gate and up from the floor, and then its down projection runs on the device from
 *              the slot (the device's stream waits for the copy in stream order: no host spin
 *              per expert) or, when the policy says not to block and the copy is not done, or
 *              the copy failed, on the CPU; experts without a slot run wholly on the CPU. The
 *              CPU's down projections run while the device's are queued; one host wait per
 *              layer afterwards settles the copies, and a copy that failed after its reader was
 *              queued has its rows recomputed on the CPU. Every (token, choice) row lands in one
 *              buffer, token-major, and moe_sum adds them in llama.cpp's order, so the output
 *              does not depend on where an expert ran. */
#include "engine/engine_internal.h"

#include "base/error.h"

#include <stdio.h>
#include <string.h>

/* Where an expert's work runs this step. REDO: fetched, but its copy failed after the device's
 * read was queued: the CPU recomputes its down projection. */
enum where { ON_CPU = 0, WHOLE, FETCHED, REDO };

#define TRY(call)                                                                                  \
	do {                                                                                       \
		if (wf__ex_fail(e, (call)) < 0)                                                    \
			return;                                                                    \
	} while (0)

static const struct wf__tensor *layer_t(const struct wf_engine *e, uint32_t h)
{
	return &e->t[h];
}

/* Counts a layer's selected experts (ids on the host): the weights they read, and for
 * experts a device computes, the resident lookups. */
static void count_experts(struct wf_engine *e, uint32_t il, const int32_t *ids, uint32_t rows)
{
	const uint32_t *mr = e->arch->moe_roles;
	const uint64_t per = layer_t(e, wf_ex_tensor(e, il, mr[1]))->matrix_size +
	                     layer_t(e, wf_ex_tensor(e, il, mr[2]))->matrix_size +
	                     layer_t(e, wf_ex_tensor(e, il, mr[3]))->matrix_size;
	uint32_t distinct = 0;
	for (uint32_t r = 0; r < rows; r++) {
		const int32_t x = ids[r];
		if (x < 0 || (uint32_t)x >= e->hp.n_expert || e->expert_count[x]++)
			continue;
		distinct++;
	}
	for (uint32_t r = 0; r < rows; r++)
		if (ids[r] >= 0 && (uint32_t)ids[r] < e->hp.n_expert)
			e->expert_count[ids[r]] = 0;
	e->stats.weight_bytes += distinct * per;
	if (e->dev.ctx && wf__layer_resident(e, il))
		e->stats.resident_lookups += distinct;
}

void wf__moe_count_resident(struct wf_engine *e)
{
	const size_t S = (size_t)UBATCH_MAX * e->hp.n_expert_used;
	/* Every layer carried the slice's n rows but the last, which kept the n_out with logits. */
	for (uint32_t k = 0; k < e->res_layers; k++) {
		const uint32_t il = e->res_layer[k];
		const uint32_t n = il == e->hp.n_layer - 1 ? e->n_out : e->n;
		count_experts(e, il, e->h_res_ids + k * S, n * e->hp.n_expert_used);
	}
	e->res_layers = 0;
}

/* The router's logits to the hook, on the host. */
static void router_hook(struct wf_engine *e, uint32_t il)
{
	const size_t bytes = (size_t)e->rows * e->hp.n_expert * sizeof(float);
	if (!e->shared) {
		TRY(wf_device_memcpy_async(e->main.stream, e->h_router, e->router, bytes,
		                           WF_DEVICE_COPY_D2H, e->diag));
		TRY(wf_device_stream_synchronize(e->main.stream, e->diag));
	}
	e->router_fn(e->router_arg, il, e->rows, e->h_router);
}

static void resident(struct wf_engine *e, uint32_t il, const struct wf__tensor *g,
                     const struct wf__tensor *u, const struct wf__tensor *d)
{
	const struct wf__be *be = e->dev.ctx ? &e->dev : &e->main;
	const struct wf_backend_ops *o = be->ops;
	const uint32_t n = e->rows, K = e->hp.n_expert_used, E = e->hp.n_embd, F = e->hp.n_ff;
	const struct wf_backend_matrix mg = wf__tensor_matrix(g, wf__tensor_data(g, be)),
	                               mu = wf__tensor_matrix(u, wf__tensor_data(u, be)),
	                               md = wf__tensor_matrix(d, wf__tensor_data(d, be));
	const struct wf_backend_product gu[2] = {{&mg, e->gate, F}, {&mu, e->up, F}};
	const struct wf_backend_product dn = {&md, e->down, E};
	TRY(o->mul_mat_id(be->ctx, 2, gu, e->ids, n, K, e->act[WF_ACT_XN], E, false, e->diag));
	TRY(o->swiglu(be->ctx, e->gate, e->up, e->gate, (size_t)n * K * F, e->diag));
	TRY(o->mul_mat_id(be->ctx, 1, &dn, e->ids, n, K, e->gate, F, true, e->diag));
	/* The counters need the choices on the host: read in place, or brought back without a
	 * wait and counted when the slice ends. */
	if (e->shared) {
		count_experts(e, il, e->ids, n * K);
	} else {
		const size_t S = (size_t)UBATCH_MAX * K;
		TRY(wf_device_memcpy_async(e->main.stream, e->h_res_ids + e->res_layers * S, e->ids,
		                           (size_t)n * K * sizeof(int32_t), WF_DEVICE_COPY_D2H,
		                           e->diag));
		e->res_layer[e->res_layers++] = il;
	}
}

/* Host-side layers: the selected experts in expert order (step_experts), their rows' positions
 * (expert_first/count over the rows in expert order) and the weights they read. */
static uint32_t select_experts(struct wf_engine *e, uint32_t il, uint32_t rows)
{
	const uint32_t X = e->hp.n_expert;
	memset(e->expert_count, 0, X * sizeof(uint32_t));
	for (uint32_t r = 0; r < rows; r++)
		e->expert_count[e->h_ids[r]]++;
	uint32_t n_sel = 0;
	for (uint32_t x = 0; x < X; x++)
		if (e->expert_count[x])
			e->step_experts[n_sel++] = x;
	count_experts(e, il, e->h_ids, rows);
	return n_sel;
}

/* Looks the selected experts up in the slots (post-fetch queues the misses' copies now, in
 * expert order) and decides where each one's gate and up run. */
static void look_up(struct wf_engine *e, uint32_t il, uint32_t n_sel, const struct wf__tensor *g,
                    const struct wf__tensor *u, const struct wf__tensor *d)
{
	for (uint32_t i = 0; i < n_sel; i++) {
		const uint32_t x = e->step_experts[i];
		e->expert_slot[x] = -1;
		e->expert_where[x] = ON_CPU;
		e->fetch_src[i] = (struct wf__fetch_src){
		    .d = (const uint8_t *)d->host + (size_t)x * d->matrix_size,
		    .g = (const uint8_t *)g->host + (size_t)x * g->matrix_size,
		    .u = (const uint8_t *)u->host + (size_t)x * u->matrix_size,
		    .d_bytes = d->matrix_size,
		    .g_bytes = g->matrix_size,
		    .u_bytes = u->matrix_size,
		};
	}
	if (!e->fetch)
		return;
	wf__fetch_step(e->fetch, il, n_sel, e->step_experts, e->fetch_src, e->fetch_slot,
	               e->fetch_whole);
	for (uint32_t i = 0; i < n_sel; i++) {
		const uint32_t x = e->step_experts[i];
		e->expert_slot[x] = e->fetch_slot[i];
		if (e->fetch_slot[i] >= 0)
			e->expert_where[x] = e->fetch_whole[i] ? WHOLE : FETCHED;
	}
}

/* ids[r]: the slot (slots true) or expert of row r when its expert is at `where`, else -1;
 * returns how many rows are. */
static uint32_t row_ids(const struct wf_engine *e, uint32_t rows, enum where where, bool slots,
                        int32_t *ids)
{
	uint32_t c = 0;
	for (uint32_t r = 0; r < rows; r++) {
		const int32_t x = e->h_ids[r];
		const bool at = e->expert_where[x] == where;
		ids[r] = at ? (slots ? e->expert_slot[x] : x) : -1;
		c += at;
	}
	return c;
}

static int h2d(struct wf_engine *e, void *dst, const void *src, size_t bytes)
{
	return e->shared || !bytes ? 0
	                           : wf_device_memcpy_async(e->main.stream, dst, src, bytes,
	                                                    WF_DEVICE_COPY_H2D, e->diag);
}

static void debug_line(struct wf_engine *e, uint32_t il, uint32_t n_sel,
                       const struct wf__fetch_stats *before)
{
	struct wf__fetch_stats after;
	wf__fetch_get_stats(e->fetch, &after);
	char line[224];
	snprintf(
	    line, sizeof line,
	    "post-fetch layer %u: %u experts, %llu cached (%llu whole), %llu copied, %llu from "
	    "the device, %llu on the cpu, %.3f ms blocked",
	    il, n_sel, (unsigned long long)(after.hits - before->hits),
	    (unsigned long long)(after.whole - before->whole),
	    (unsigned long long)(after.experts - before->experts),
	    (unsigned long long)(after.used - before->used),
	    (unsigned long long)(after.fallbacks - before->fallbacks),
	    (double)(after.wait_ns - before->wait_ns) / 1e6);
	e->log_fn(e->log_arg, line);
}

static void host_side(struct wf_engine *e, uint32_t il, const struct wf__tensor *g,
                      const struct wf__tensor *u, const struct wf__tensor *d)
{
	const uint32_t n = e->rows, K = e->hp.n_expert_used, E = e->hp.n_embd, F = e->hp.n_ff;
	const uint32_t X = e->hp.n_expert, rows = n * K;
	const struct wf__be *cpu = &e->cpu, *dev = &e->dev;

	/* The choices, and the input the CPU's experts need, on the host: the layer's one wait. */
	if (!e->shared) {
		TRY(wf_device_memcpy_async(e->main.stream, e->h_ids, e->ids, rows * sizeof(int32_t),
		                           WF_DEVICE_COPY_D2H, e->diag));
		TRY(wf_device_memcpy_async(e->main.stream, e->h_xn, e->act[WF_ACT_XN],
		                           (size_t)n * E * sizeof(float), WF_DEVICE_COPY_D2H,
		                           e->diag));
		TRY(wf_device_stream_synchronize(e->main.stream, e->diag));
	}
	for (uint32_t r = 0; r < rows; r++)
		if (e->h_ids[r] < 0 || (uint32_t)e->h_ids[r] >= X) {
			wf__ex_fail(e, wf_diag_set(e->diag, WF_EDEVICE,
			                           "the router chose expert %d of %u", e->h_ids[r],
			                           X));
			return;
		}
	struct wf__fetch_stats before;
	if (e->fetch && e->fetch_debug && e->log_fn)
		wf__fetch_get_stats(e->fetch, &before);
	const uint32_t n_sel = select_experts(e, il, rows);
	look_up(e, il, n_sel, g, u, d);

	const void *sd = NULL, *sg = NULL, *su = NULL;
	size_t stride = 0;
	if (e->fetch)
		wf__fetch_stacks(e->fetch, &sd, &sg, &su, &stride);
	const struct wf_backend_matrix slot_g = {sg,       g->type,     g->ne[0],
	                                         g->ne[1], g->row_size, stride},
	                               slot_u = {su,       u->type,     u->ne[0],
	                                         u->ne[1], u->row_size, stride},
	                               slot_d = {sd,       d->type,     d->ne[0],
	                                         d->ne[1], d->row_size, stride};
	bool device_read = false;

	/* 1. The cache's whole hits on the device, queued first. */
	if (row_ids(e, rows, WHOLE, true, e->h_ids_dev)) {
		const struct wf_backend_product gu[2] = {{&slot_g, e->dgate, F},
		                                         {&slot_u, e->dup, F}};
		const struct wf_backend_product dn = {&slot_d, e->down, E};
		TRY(h2d(e, e->ids_dev, e->h_ids_dev, rows * sizeof(int32_t)));
		TRY(dev->ops->mul_mat_id(dev->ctx, 2, gu, e->ids_dev, n, K, e->act[WF_ACT_XN], E,
		                         false, e->diag));
		TRY(dev->ops->swiglu(dev->ctx, e->dgate, e->dup, e->dgate, (size_t)rows * F,
		                     e->diag));
		TRY(dev->ops->mul_mat_id(dev->ctx, 1, &dn, e->ids_dev, n, K, e->dgate, F, true,
		                         e->diag));
		device_read = true;
	}

	/* 2. Gate and up of the others on the CPU, from the floor, while copies fly. */
	const struct wf_backend_matrix hg = wf__tensor_matrix(g, g->host),
	                               hu = wf__tensor_matrix(u, u->host),
	                               hd = wf__tensor_matrix(d, d->host);
	uint32_t n_cpu_gu = 0;
	for (uint32_t r = 0; r < rows; r++) {
		const bool whole = e->expert_where[e->h_ids[r]] == WHOLE;
		e->h_ids_cpu[r] = whole ? -1 : e->h_ids[r];
		n_cpu_gu += !whole;
	}
	if (n_cpu_gu) {
		const struct wf_backend_product gu[2] = {{&hg, e->h_gate, F}, {&hu, e->h_up, F}};
		TRY(cpu->ops->mul_mat_id(cpu->ctx, 2, gu, e->h_ids_cpu, n, K, e->h_xn, E, false,
		                         e->diag));
		TRY(cpu->ops->swiglu(cpu->ctx, e->h_gate, e->h_up, e->h_gate, (size_t)rows * F,
		                     e->diag));
	}

	/* 3. Down projections: from the slot on the device where the copy may be read, else on the
	 * CPU. The device's are queued before the CPU computes its own. */
	uint32_t n_used = 0;
	for (uint32_t i = 0; i < n_sel; i++) {
		const uint32_t x = e->step_experts[i];
		if (e->expert_where[x] != FETCHED)
			continue;
		if (wf__fetch_use(e->fetch, e->expert_slot[x], dev->stream,
		                  dev->ops->host_memory) == 0)
			e->fetch_slot[n_used++] =
			    e->expert_slot[x]; /* the slots read, for settle */
		else
			e->expert_where[x] = ON_CPU;
	}
	if (row_ids(e, rows, FETCHED, true, e->h_ids_fetch)) {
		const struct wf_backend_product dn = {&slot_d, e->down, E};
		TRY(h2d(e, e->hx, e->h_gate, (size_t)rows * F * sizeof(float)));
		TRY(h2d(e, e->ids_fetch, e->h_ids_fetch, rows * sizeof(int32_t)));
		TRY(dev->ops->mul_mat_id(dev->ctx, 1, &dn, e->ids_fetch, n, K, e->hx, F, true,
		                         e->diag));
		device_read = true;
	}
	if (device_read)
		wf__fetch_readers_done(e->fetch, dev->stream, dev->ops->host_memory);
	const struct wf_backend_product cpu_dn = {&hd, e->h_down, E};
	if (row_ids(e, rows, ON_CPU, false, e->h_ids_cpu_d))
		TRY(cpu->ops->mul_mat_id(cpu->ctx, 1, &cpu_dn, e->h_ids_cpu_d, n, K, e->h_gate, F,
		                         true, e->diag));

	/* 4. The copies settled: one whose failure showed only after its reader was queued has
	 * its rows recomputed on the CPU (they overwrite what the device made of bad bytes). */
	if (n_used && !wf__fetch_settle(e->fetch, n_used, e->fetch_slot, e->fetch_bad)) {
		for (uint32_t i = 0; i < n_sel; i++) {
			const uint32_t x = e->step_experts[i];
			if (e->expert_where[x] != FETCHED)
				continue;
			for (uint32_t j = 0; j < n_used; j++)
				if (e->fetch_bad[j] && e->fetch_slot[j] == e->expert_slot[x])
					e->expert_where[x] = REDO;
		}
		for (uint32_t r = 0; r < rows; r++) {
			const bool redo = e->expert_where[e->h_ids[r]] == REDO;
			e->h_ids_cpu_d[r] = redo ? e->h_ids[r] : -1;
		}
		TRY(cpu->ops->mul_mat_id(cpu->ctx, 1, &cpu_dn, e->h_ids_cpu_d, n, K, e->h_gate, F,
		                         true, e->diag));
		for (uint32_t i = 0; i < n_sel; i++)
			if (e->expert_where[e->step_experts[i]] == REDO)
				e->expert_where[e->step_experts[i]] = ON_CPU;
	}

	/* 5. The CPU's rows into main's buffer (the same buffer when main computes on host
	 * memory), then the weighted sum. */
	if (!e->shared) {
		uint32_t m = 0;
		for (uint32_t r = 0; r < rows; r++)
			if (e->expert_where[e->h_ids[r]] == ON_CPU)
				e->h_cpu_rows[m++] = r;
		if (m) {
			TRY(h2d(e, e->down_cpu, e->h_down, (size_t)rows * E * sizeof(float)));
			TRY(h2d(e, e->cpu_rows, e->h_cpu_rows, m * sizeof(uint32_t)));
			TRY(e->main.ops->copy_rows(e->main.ctx, e->down_cpu, E, e->cpu_rows, m, E,
			                           e->down, E, e->cpu_rows, e->diag));
		}
	}
	if (e->fetch) {
		wf__fetch_end_step(e->fetch);
		if (e->fetch_debug && e->log_fn)
			debug_line(e, il, n_sel, &before);
	}
}

void wf__moe_layer(struct wf_engine *e, uint32_t il, uint32_t t_router, uint32_t t_gate,
                   uint32_t t_up, uint32_t t_down)
{
	const struct wf_backend_ops *o = e->main.ops;
	const uint32_t n = e->rows, K = e->hp.n_expert_used, E = e->hp.n_embd, X = e->hp.n_expert;
	const struct wf__tensor *rt = &e->t[t_router];
	const struct wf_backend_matrix mr = wf__tensor_matrix(rt, wf__tensor_data(rt, &e->main));
	const struct wf_backend_product p = {&mr, e->router, X};
	e->stats.weight_bytes += rt->nbytes;
	TRY(o->matmul(e->main.ctx, 1, &p, e->act[WF_ACT_XN], E, n, e->diag));
	if (e->router_fn)
		router_hook(e, il);
	if (e->rc)
		return;
	TRY(o->route(e->main.ctx, e->router, n, X, K, e->ids, e->wts, e->diag));
	const struct wf__tensor *g = &e->t[t_gate], *u = &e->t[t_up], *d = &e->t[t_down];
	if (wf__layer_resident(e, il))
		resident(e, il, g, u, d);
	else
		host_side(e, il, g, u, d);
	if (e->rc)
		return;
	TRY(o->moe_sum(e->main.ctx, e->down, e->wts, n, K, E, e->act[WF_ACT_TMP], e->diag));
}
