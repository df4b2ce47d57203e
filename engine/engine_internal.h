/* Shared inside engine/: the engine (engine.c owns its life), its tensor table (tensors.c), the
 * sequence state (seqstate.c), the executor (exec.c: dense ops, slices; moe.c: the routed
 * experts and their placement) and the expert slots (fetch.c). One-way: engine.c calls the
 * others; exec.c and moe.c call fetch.c and seqstate.c; nothing calls back up. */
#ifndef WF_ENGINE_INTERNAL_H
#define WF_ENGINE_INTERNAL_H

#include "device/device.h"
#include "engine/arch.h"
#include "engine/engine.h"
#include "engine/exec.h"
#include "engine/postfetch.h"
#include "kernels/backend.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define UBATCH_MAX       512u /* tokens computed together; larger batches run in slices */
#define OUT_CHUNK        32u  /* logits rows per output product on a device with its own memory */
#define WF__MAX_EXPERTS  4096u
#define WF__DEV_MAX_ROWS 64u /* mul_mat_id's no-host-wait bound (backend.h): decode steps */

/* ---- the tensor table (tensors.c) --------------------------------------------------------- */

/* A backend context the engine computes with: the CPU (no stream), or a device's (its stream). */
struct wf__be {
	const struct wf_backend_ops *ops;
	struct wf_backend_ctx *ctx;
	struct wf_device_stream *stream; /* NULL: the host backend computing at once */
};

/* One model tensor the engine reads. */
struct wf__tensor {
	uint32_t model_index;
	enum wf_dtype type;
	int64_t ne[3];      /* ne[0] the row width, ne[1] rows, ne[2] experts (1 otherwise) */
	size_t row_size;    /* bytes of one row */
	size_t matrix_size; /* bytes of one [ne0, ne1] matrix: an expert's stride */
	uint64_t nbytes;
	uint8_t flags;    /* the table entry's WF_ARCH_* */
	const void *host; /* the bytes in host memory (floor, file mapping) */
	void *device;     /* the device weight store's copy, or NULL */
};

/* The bytes of tensor t that be reads: the CPU reads the host bytes; a device reads the store's
 * copy, or, where its memory is host memory (the host device), the host bytes in place when the
 * store holds no copy. NULL when a device that cannot read host memory has no copy. */
const void *wf__tensor_data(const struct wf__tensor *t, const struct wf__be *be);
struct wf_backend_matrix wf__tensor_matrix(const struct wf__tensor *t, const void *data);

/* Resolves the arch's tensor table against the model: e->t, e->layer_t, e->global_t,
 * e->of_model, e->bytes_per_token (hp resolved before). Checks every entry's presence, shape and
 * type (the kernels of the host backend take it), and that the model has no tensor the arch
 * would silently ignore. */
int wf__tensors_resolve(struct wf_engine *e, struct wf_diag *diag);
/* Points every entry at w's bytes: host always, the device copy where w has one. */
int wf__tensors_bind(struct wf_engine *e, const struct wf_engine_weights *w, struct wf_diag *diag);
void wf__tensors_fini(struct wf_engine *e);

/* ---- sequence state (seqstate.c) --------------------------------------------------------- */

/* What each sequence keeps between steps, beside each layer: attention layers keep K and V rows
 * per position (the KV cache, one block per layer and sequence so that a sequence's positions are
 * rows in position order); recurrent layers (Qwen3-Next's gated DeltaNet, next) keep a fixed
 * state per sequence, which a sequence can only drop whole (llama.cpp's hybrid memory: a partial
 * rewind of a recurrent state is refused). The memory lies where the dense part computes. */
struct wf__seqstate {
	enum wf_backend_kv kv_type;
	uint32_t n_layer, n_seq, n_ctx, kv_row; /* kv_row: elements per position */
	size_t elem;                            /* 2 or 4 */
	size_t layer_bytes;                     /* one layer's K (or V) cache */
	uint8_t *k, *v;                         /* [layer][seq][pos][kv_row] */
	uint8_t *rs;                            /* recurrent states: [layer][seq][rs_bytes] */
	size_t rs_bytes;                        /* per layer and sequence; 0: none */
	uint32_t *len;                          /* per sequence: positions held */
	bool *recurrent;                        /* per layer: a recurrent layer (no KV rows) */
	struct wf_device *dev;                  /* the memory's device (NULL: host mappings) */
};
int wf__seqstate_init(struct wf__seqstate *s, struct wf_device *dev, enum wf_backend_kv type,
                      uint32_t n_layer, uint32_t n_seq, uint32_t n_ctx, uint32_t kv_row,
                      struct wf_diag *diag);
void wf__seqstate_fini(struct wf__seqstate *s);
/* Forgets a sequence from pos on: KV positions are simply not read again; a recurrent state
 * can only be dropped whole (pos 0) or kept (pos at or past its length): WF_EUNSUPPORTED. */
int wf__seqstate_truncate(struct wf__seqstate *s, uint32_t seq, uint32_t pos);
uint64_t wf__seqstate_bytes(const struct wf__seqstate *s);
static inline uint8_t *wf__seq_k(const struct wf__seqstate *s, uint32_t layer)
{
	return s->k + (size_t)layer * s->layer_bytes;
}
static inline uint8_t *wf__seq_v(const struct wf__seqstate *s, uint32_t layer)
{
	return s->v + (size_t)layer * s->layer_bytes;
}

/* Memory the engine computes on: device memory of dev, or anonymous host pages touched only
 * when used (dev NULL). NULL on failure (diag says why). */
void *wf__mem_alloc(struct wf_device *dev, size_t bytes, struct wf_diag *diag);
void wf__mem_free(struct wf_device *dev, void *p, size_t bytes);

/* ---- expert slots (fetch.c) --------------------------------------------------------------- */

struct wf__fetch_stats {
	uint64_t hits, misses;  /* selected experts found in a cache slot, or not */
	uint64_t experts;       /* copies queued (the misses that got a slot) */
	uint64_t bytes;         /* bytes they moved */
	uint64_t used;          /* experts whose down projection was computed from a slot */
	uint64_t fallbacks;     /* experts with a slot computed on the CPU after all */
	uint64_t errors;        /* copies or events that failed */
	uint64_t wait_ns;       /* time the host blocked on copies */
	uint64_t copy_ns;       /* copy time of the timed steps */
	uint64_t wait_ns_timed; /* the part of wait_ns spent in the timed steps */
	uint64_t steps_timed;
	uint64_t whole;            /* hits whose gate and up were in the slot too (whole slots) */
	uint64_t scratchpad_bytes; /* the slots' device memory */
};
struct wf__fetch_shape {
	size_t slot_bytes;     /* the largest down projection */
	size_t max_g, max_u;   /* whole slots: the largest gate and up (placed after it) */
	uint32_t step_experts; /* the most experts one step can select */
	uint32_t n_layer, n_expert;
	uint64_t cache_mb; /* 0: a scratchpad (WF_POSTFETCH_SCRATCHPAD_MB or step_experts slots) */
	bool whole;        /* cache slots hold gate and up too (copied after the step's down
	                      projections), so a later hit computes wholly on the device */
};
/* One selected expert's matrices in the floor: down always, gate and up for whole slots. */
struct wf__fetch_src {
	const void *d, *g, *u;
	size_t d_bytes, g_bytes, u_bytes;
};
struct wf__fetch;
int wf__fetch_create(struct wf_device *dev, const struct wf_postfetch_settings *s,
                     const struct wf__fetch_shape *shape, struct wf__fetch **ret,
                     struct wf_diag *diag);
/* Waits for the copies still reading the floor, then frees. Accepts NULL. */
void wf__fetch_destroy(struct wf__fetch *f);
/* One layer's step: the n selected experts (in expert order) and their matrices; writes each
 * one's slot, or -1 (no slot: the CPU computes it from the floor), and whether the slot holds the
 * expert whole with every copy complete (then gate and up run from it on the device too). The
 * copies are queued behind the device's last reading of the slots (wf__fetch_readers_done). */
void wf__fetch_step(struct wf__fetch *f, uint32_t layer, uint32_t n, const uint32_t *experts,
                    const struct wf__fetch_src *src, int32_t *ret_slot, bool *ret_whole);
/* The slots as stacks of equally spaced matrices: slot s's down projection at
 * *ret_d + s * *ret_stride, its gate and up (whole slots) at *ret_g and *ret_u likewise. */
void wf__fetch_stacks(const struct wf__fetch *f, const void **ret_d, const void **ret_g,
                      const void **ret_u, size_t *ret_stride);
/* Before the device reads slot's down projection on reader: 0 when it may (blocking policy:
 * reader now waits for the copy in stream order, no host wait; non-blocking: the copy had
 * completed), -EAGAIN (non-blocking, still in flight), or an error (the copy failed: the slot is
 * forgotten). Anything but 0: the CPU computes that expert. reader_waits_on_host: the reader's
 * backend computes in the calling thread (the host device), so the host's wait is timed here. */
int wf__fetch_use(struct wf__fetch *f, int32_t slot, struct wf_device_stream *reader,
                  bool reader_waits_on_host);
/* After the CPU's share of the step: waits (once per copy stream) for the step's copies to land,
 * so a copy that failed after its reader was queued is known: returns true when every slot used
 * this step holds good bytes; else ret_bad[i] says which of the n used slots (as passed to
 * wf__fetch_use, in order) must be recomputed on the CPU. */
bool wf__fetch_settle(struct wf__fetch *f, uint32_t n, const int32_t *slots, bool *ret_bad);
/* The device's last read of slots in this step is queued on reader: later copies into slots
 * wait for it (a slot is never refilled while a queued kernel reads it). A reader that computes
 * in the calling thread (reader_waits_on_host, as for wf__fetch_use) has read them when its op
 * returned: nothing is recorded. */
void wf__fetch_readers_done(struct wf__fetch *f, struct wf_device_stream *reader,
                            bool reader_waits_on_host);
void wf__fetch_end_step(struct wf__fetch *f);
/* Forgets every slot holding an expert of layer (its stacks were refreshed): waits for the copy
 * streams first. */
void wf__fetch_forget_layer(struct wf__fetch *f, uint32_t layer);
uint32_t wf__fetch_n_slots(const struct wf__fetch *f);
uint32_t wf__fetch_keys(const struct wf__fetch *f, uint32_t *ret_keys, uint32_t max);
void wf__fetch_get_stats(const struct wf__fetch *f, struct wf__fetch_stats *ret);
void wf__fetch_reset_stats(struct wf__fetch *f);

/* ---- the engine ----------------------------------------------------------------------------- */

struct wf_engine {
	const struct wf_arch *arch;
	struct wf_arch_hparams hp;
	const struct wf_model *model;
	uint32_t n_ctx, n_seq_max, n_threads;
	uint32_t q_dim, kv_dim;

	/* Tensors (tensors.c). */
	struct wf__tensor *t;
	uint32_t n_t;
	uint32_t *layer_t;  /* [n_layer][arch->n_layer_roles]: handle or WF_ARCH_NONE */
	uint32_t *global_t; /* [arch->n_globals] */
	uint32_t *of_model; /* [model->n_tensors]: handle or WF_ARCH_NONE */
	uint64_t bytes_per_token;

	/* The placement plan (exec.c). `main` computes the dense part and holds the activations
	 * and the sequence state; `dev` is the device's backend (== main when the device computes
	 * the dense part; .ctx NULL without a device); `cpu` the host backend without a stream
	 * (== main for the CPU engine) for host-side experts. shared: main computes on host
	 * memory, so the CPU's and the device's host-side work read and write main's buffers
	 * directly; otherwise pinned staging buffers carry them. */
	struct wf_device *dev_handle;
	struct wf_pool *pool;
	struct wf__be main, dev, cpu;
	bool main_is_dev, cpu_is_main, shared;
	uint32_t first_resident; /* layers from here on: experts resident (n_layer: none) */
	char placement[192];

	/* Buffers in main's memory (one allocation): activations, and per slice index arrays. */
	void *amem;
	size_t abytes;
	float *act[WF_ACT_MAX];
	float *router, *wts, *gate, *up, *down, *out;
	int32_t *ids;       /* the router's choices, S */
	uint32_t *idx;      /* [tok pos kv_first n_kv dst out] x UBATCH_MAX */
	int32_t *ids_dev;   /* host-side layers: slot ids of the rows the device computes, S */
	int32_t *ids_fetch; /* slot ids of the rows whose down projection runs from a slot, S */
	uint32_t *cpu_rows; /* rows the CPU computed, S (device with its own memory) */
	float *dgate, *dup; /* the device's gate/up rows for whole-slot experts, S x n_ff */
	float *hx;          /* the CPU's swiglu rows on the device (own memory), S x n_ff */
	float *down_cpu;    /* the CPU's down rows on the device (own memory), S x n_embd */
	/* Host-side buffers: in main's memory when shared, else pinned. */
	void *pmem;
	size_t pbytes;
	int32_t *h_ids, *h_ids_dev, *h_ids_fetch, *h_ids_cpu, *h_ids_cpu_d;
	uint32_t *h_idx, *h_cpu_rows;
	float *h_xn, *h_gate, *h_up, *h_down, *h_router, *h_wts;
	int32_t
	    *h_res_ids; /* resident layers' choices brought back for the counters, n_layer x S */
	size_t scratch_bytes;

	struct wf__seqstate seq;

	/* The slice being computed. */
	uint32_t n, rows, n_out;
	const int32_t *tokens;
	const uint32_t *pos, *seqs;
	const bool *want;
	float *logits;
	int rc;
	struct wf_diag *diag;
	uint32_t res_layers; /* resident layers whose choices await counting at the slice's end */
	uint32_t *res_layer; /* their layers, in order (n_layer) */

	/* Per step of a MoE layer, on the host (moe.c). */
	uint32_t *expert_count, *expert_first, *step_experts;
	int32_t *expert_slot;  /* per expert: its slot this step, -1 */
	uint8_t *expert_where; /* per expert: enum in moe.c */
	struct wf__fetch_src *fetch_src;
	int32_t *fetch_slot;
	bool *fetch_whole, *fetch_bad;

	/* Post-fetch and the expert cache. */
	struct wf__fetch *fetch;
	bool fetch_debug;
	bool block_on_miss;
	struct wf_device *reg_dev;
	const void **reg_base; /* registered mappings */
	uint32_t n_reg;

	wf_engine_router_fn router_fn;
	void *router_arg;
	wf_engine_log_fn log_fn;
	void *log_arg;
	struct wf_engine_stats stats;
};

/* exec.c */
/* The placement plan and everything the executor computes with: backends, buffers, sequence
 * state, post-fetch. Called by wf_engine_create after the tensors are resolved. */
int wf__exec_init(struct wf_engine *e, const struct wf_engine_config *cfg,
                  const struct wf_engine_weights *w, struct wf_diag *diag);
void wf__exec_fini(struct wf_engine *e);
/* One slice of a batch (<= UBATCH_MAX tokens). On error the sequences' lengths are unchanged. */
int wf__exec_slice(struct wf_engine *e, const int32_t *tokens, const uint32_t *pos,
                   const uint32_t *seq, const bool *want, uint32_t n, float *logits,
                   struct wf_diag *diag);
/* Records the first error of a slice (sticky); returns rc. */
int wf__ex_fail(struct wf_engine *e, int rc);
/* Whether the layer's experts are resident (computed where the dense part is, or on the
 * device). */
bool wf__layer_resident(const struct wf_engine *e, uint32_t layer);
/* The first resident layer under cfg for a model of hp. */
uint32_t wf__first_resident(const struct wf_arch_hparams *hp, const struct wf_engine_config *cfg);

/* moe.c */
void wf__moe_layer(struct wf_engine *e, uint32_t layer, uint32_t t_router, uint32_t t_gate,
                   uint32_t t_up, uint32_t t_down);
/* At the end of a slice: the resident layers' choices, brought back without a wait, counted. */
void wf__moe_count_resident(struct wf_engine *e);

#endif
