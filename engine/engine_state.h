/* The engine's state, shared by the CPU forward pass (forward.c, which owns it) and the device
 * forward pass (forward_dev.c), which borrows its weights, KV lengths, CPU scratch and post-fetch
 * slots for the experts it computes host-side. */
#ifndef WF_ENGINE_STATE_H
#define WF_ENGINE_STATE_H

#include "engine/cpumm.h"
#include "engine/engine_internal.h"

#define UBATCH_MAX 512u /* tokens computed together; larger batches run in slices */

struct wf__devfwd;

struct wf_engine {
	struct wf__cpu cpu; /* kernels, pool and thread count */
	struct wf__weights w;
	struct wf__kv kv;
	uint32_t n_ctx, n_seq_max, n_threads;
	uint32_t q_dim, kv_dim, max_dim; /* n_head*head_dim, n_head_kv*head_dim, widest row */

	/* Scratch for UBATCH_MAX tokens (slots: tokens x experts used). */
	float *x, *xn, *q, *k, *v, *attn, *tmp;
	float *rope_cs; /* [token][rope_dim]: cos, sin per pair */
	float *router, *probs, *sel_w;
	int32_t *sel;
	float *gate, *up, *hbuf, *down;        /* [slots][n_ff] / [slots][n_embd] */
	uint32_t *slot_of;                     /* [token * k + j]: row in the expert-sorted order */
	uint32_t *expert_first, *expert_count; /* per expert: its rows in that order */
	uint32_t *row_token;                   /* per sorted row: the token */
	uint8_t *qa, *qb;                      /* quantized activations */
	size_t qa_size;
	float *att_scratch; /* per thread */
	size_t att_scratch_floats;
	uint32_t *out_rows; /* tokens whose logits are wanted, per slice */

	struct wf__mm_phase *ph;
	void *scratch; /* the mapping all the buffers above live in */
	size_t scratch_size;

	wf_engine_router_fn router_fn;
	void *router_arg;
	wf_engine_log_fn log_fn;
	void *log_arg;
	struct wf_engine_stats stats;
	struct wf__fetch *fetch; /* post-fetch; NULL: every expert from the floor */
	bool fetch_debug;
	struct wf__fetch_src *fetch_src; /* per step: the matrices to copy, in expert order */
	bool *fetch_whole;               /* per step: the slot holds the expert whole */
	uint32_t *fetch_ids;             /* per step: the selected experts, in order */
	int32_t *fetch_step_slot;        /* per step: their slots */
	int32_t *fetch_slot;             /* per expert: its slot this step, -1 */
	struct wf_device *reg_dev;       /* the floor range registered for post-fetch's copies */
	const void *reg_base;            /* (its start), or NULL */
	struct wf__devfwd *devfwd; /* the device forward pass (forward_dev.c); NULL: the CPU's */
	uint64_t dense_step_bytes; /* every dense matrix once (wf__weights.bytes_per_token less the
	                              experts and the embedding row) */
};

/* The MoE steps both forward passes share (forward.c). wf__moe_order: a layer's n * K (token,
 * expert) rows in expert order (ids: the router's choices, token-major): expert_first/count,
 * slot_of (each choice's row), row_token (each row's token), and the experts' weight bytes
 * counted. wf__moe_fetch: the post-fetch lookups of the selected experts (fetch_slot per
 * expert); ret_whole (NULL: down projections only) asks for whole slots and says per expert
 * whether its slot holds it whole. Returns the experts looked up. wf__moe_gate_up: gate, up and
 * swiglu on the CPU from the floor for the experts skip does not mark (NULL: all), into rows
 * of h (n_ff floats each, expert order); xn: the layer's normalized input, n rows. */
void wf__moe_order(struct wf_engine *e, const struct wf__layer *L, const int32_t *ids, uint32_t n);
uint32_t wf__moe_fetch(struct wf_engine *e, uint32_t il, const struct wf__layer *L,
                       uint8_t *ret_whole);
void wf__moe_gate_up(struct wf_engine *e, const struct wf__layer *L, const float *xn, uint32_t n,
                     const uint8_t *skip, float *h);

/* The device forward pass (forward_dev.c): dense weights, KV cache and activations in device
 * memory, computed with the device's ops (devops.h); experts resident on the device, in the
 * post-fetch slots, or host-side on the CPU. Created after the CPU state (weights, scratch, pool,
 * post-fetch slots). */
int wf__devfwd_create(struct wf_engine *e, const struct wf_engine_config *cfg,
                      struct wf_diag *diag);
void wf__devfwd_destroy(struct wf__devfwd *d);
/* One slice of a batch (<= UBATCH_MAX tokens), as forward.c's forward_slice. */
int wf__devfwd_slice(struct wf_engine *e, const int32_t *tokens, const uint32_t *pos,
                     const uint32_t *seq, const bool *want, uint32_t n, float *logits,
                     struct wf_diag *diag);
/* Device bytes it holds (weights, KV, activations), and the resident experts' share. */
uint64_t wf__devfwd_device_bytes(const struct wf__devfwd *d);
uint64_t wf__devfwd_resident_bytes(const struct wf__devfwd *d, const struct wf__weights *w);
/* The first layer whose experts are resident on the device (n_layer: none). */
uint32_t wf__first_resident(const struct wf_engine *e, const struct wf_engine_config *cfg);

#endif
