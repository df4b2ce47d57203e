/* Shared inside engine/: the resolved weight view (weights.c), the KV cache (kvcache.c), the
 * numerics that must match llama.cpp (ops.c) and the engine struct (forward.c). */
#ifndef WF_ENGINE_INTERNAL_H
#define WF_ENGINE_INTERNAL_H

#include "device/device.h"
#include "engine/engine.h"
#include "kernels/pool.h"
#include "engine/postfetch.h"
#include "kernels/kernels.h"

#include <stddef.h>
#include <stdint.h>

/* One weight matrix (or stack of matrices for experts): rows of ne[0] elements. */
struct wf__wt {
	const void *data;
	enum wf_dtype type;
	int64_t ne[3];      /* ne[0] the row width, ne[1] rows, ne[2] experts (1 otherwise) */
	size_t row_size;    /* bytes of one row */
	size_t matrix_size; /* bytes of one [ne0, ne1] matrix: an expert's stride */
	const struct wf_kernel_type_ops *ops; /* NULL for F32 norms read directly */
};

#define WF__MAX_EXPERTS 4096u

enum wf__rope_kind { WF__ROPE_NORM = 0, WF__ROPE_NEOX = 2 };

struct wf__layer {
	struct wf__wt attn_norm, wq, wk, wv, wo;
	struct wf__wt q_norm, k_norm; /* data NULL: the architecture has none */
	struct wf__wt ffn_norm;
	/* MoE */
	struct wf__wt gate_inp, gate_exps, up_exps, down_exps;
	/* dense FFN (a llama model without experts) */
	struct wf__wt ffn_gate, ffn_up, ffn_down;
};

struct wf__weights {
	char arch[64];
	enum wf__rope_kind rope;
	bool qk_norm;
	bool moe;
	uint32_t n_vocab, n_embd, n_layer, n_head, n_head_kv, head_dim, rope_dim;
	uint32_t n_expert, n_expert_used, n_ff; /* n_ff: the experts' (or dense FFN's) width */
	uint32_t n_ctx_train;
	float rope_base, rms_eps;
	struct wf__wt tok_embd, output_norm, output;
	struct wf__layer *layers;
	uint64_t bytes_per_token;
};

/* Resolves and checks every tensor the architecture needs. */
int wf__weights_resolve(const struct wf_model *model, const void *const *tensor_data,
                        const struct wf_kernel_ops *ops, struct wf__weights *w,
                        struct wf_diag *diag);
void wf__weights_fini(struct wf__weights *w);

/* KV cache: per layer and sequence, n_ctx rows of n_head_kv * head_dim elements for K and V. */
struct wf__kv {
	enum wf_engine_kv_type type;
	uint32_t n_layer, n_seq, n_ctx, row; /* row: elements per position */
	size_t elem;                         /* 2 or 4 */
	size_t bytes;                        /* of k, and of v */
	uint8_t *k, *v;                      /* [layer][seq][pos][row] */
	uint32_t *len;                       /* per sequence */
};
int wf__kv_init(struct wf__kv *kv, enum wf_engine_kv_type type, uint32_t n_layer, uint32_t n_seq,
                uint32_t n_ctx, uint32_t row);
void wf__kv_fini(struct wf__kv *kv);

/* Anonymous zero pages, touched only when used (NULL on failure); wf__unmap accepts NULL. */
void *wf__map_zeroed(size_t bytes);
void wf__unmap(void *p, size_t bytes);
static inline uint8_t *wf__kv_k(const struct wf__kv *kv, uint32_t layer, uint32_t seq, uint32_t pos)
{
	return kv->k + ((((size_t)layer * kv->n_seq + seq) * kv->n_ctx + pos) * kv->row) * kv->elem;
}
static inline uint8_t *wf__kv_v(const struct wf__kv *kv, uint32_t layer, uint32_t seq, uint32_t pos)
{
	return kv->v + ((((size_t)layer * kv->n_seq + seq) * kv->n_ctx + pos) * kv->row) * kv->elem;
}

/* ---- numerics (ops.c): each one imitates the ggml CPU op named in its comment ---- */

/* ggml_rms_norm then ggml_mul by w (w may be NULL: norm only). y may alias x. */
void wf__rms_norm(const float *x, const float *w, float *y, uint32_t n, float eps);
/* ggml's rope cache for one position (ggml_rope_cache_init): cos and sin of each pair's angle,
 * interleaved, n_dims floats; the angle advances by repeated float multiplication as ggml's. */
void wf__rope_angles(uint32_t pos, uint32_t n_dims, float base, float *cs);
/* ggml_rope_ext for one head with those angles: n_dims rotated, the rest of the head untouched. */
void wf__rope(float *x, uint32_t n_dims, const float *cs, enum wf__rope_kind kind);
/* ggml_soft_max over n values, in place. */
void wf__softmax(float *x, uint32_t n);
/* The MoE router: softmax over n_expert logits, top k (descending, ties to the lower id),
 * weights renormalized by their sum clamped to >= 6.1035e-5. */
void wf__route(const float *logits, uint32_t n_expert, uint32_t k, float *probs_scratch,
               int32_t *ret_ids, float *ret_weights);
/* silu(g) * u, elementwise (ggml_swiglu_split). */
void wf__swiglu(const float *g, const float *u, float *y, uint32_t n);
/* The experts' weighted sum of n tokens in selected order, ((d0*w0 + d1*w1) + d2*w2) + ..., as
 * ggml adds them: row slot_of[t*k+j] of down (rows of len) weighted by weights[t*k+j]. */
void wf__moe_sum(const float *down, const uint32_t *slot_of, const float *weights, uint32_t n,
                 uint32_t k, uint32_t len, float *y);

/* Attention of one query head over n_kv cached positions of one sequence (positions 0..n_kv-1),
 * writing head_dim floats to out. F16 cache: llama.cpp's flash-attention CPU path (query in F16,
 * online softmax, V accumulated in F16); F32 cache: a plain softmax. scratch: 2 * head_dim floats.
 */
void wf__attend(const float *q, const uint8_t *k, const uint8_t *v, size_t kv_stride_bytes,
                uint32_t n_kv, uint32_t head_dim, float scale, enum wf_engine_kv_type type,
                float *scratch, float *out);

/* ---- expert slots: the post-fetch scratchpad and the device expert cache (fetch.c) ---- */
/* The cache's LRFU half-life in tokens (a middle value of those `wf-bench cachepolicy` tried;
 * its simulator takes this constant to replay the engine's rule). */
#define WF__FETCH_LRFU_HALF_LIFE 16.0
struct wf__fetch_stats {
	uint64_t hits, misses;  /* selected experts found in a cache slot, or not */
	uint64_t resident;      /* selected experts of resident layers (never missed) */
	uint64_t experts;       /* copies queued (the misses that got a slot) */
	uint64_t bytes;         /* bytes they moved */
	uint64_t used;          /* experts whose down projection was computed from a slot */
	uint64_t fallbacks;     /* experts with a slot computed on the CPU after all */
	uint64_t errors;        /* copies or events that failed */
	uint64_t wait_ns;       /* time blocked on copies */
	uint64_t copy_ns;       /* copy time of the timed steps */
	uint64_t wait_ns_timed; /* the part of wait_ns spent in the timed steps */
	uint64_t steps_timed;
	uint64_t whole;            /* hits whose gate and up were in the slot too (whole slots) */
	uint64_t scratchpad_bytes; /* the post-fetch slots' device memory (scratchpad or cache) */
	uint64_t resident_bytes;   /* the resident experts' */
};
struct wf__fetch_shape {
	size_t slot_bytes;     /* the largest down projection */
	size_t max_g, max_u;   /* whole slots: the largest gate and up (placed after it) */
	uint32_t step_experts; /* the most experts one step can select */
	uint32_t n_layer, n_expert;
	uint64_t cache_mb; /* 0: a scratchpad (WF_POSTFETCH_SCRATCHPAD_MB or step_experts slots) */
	uint32_t n_resident; /* slots kept for resident experts (wf__fetch_pin), never evicted */
	bool postfetch; /* misses are copied; false: resident experts only, misses on the CPU */
	bool whole;     /* cache slots hold gate and up too (copied after the step's down
	                   projections), so a later hit computes wholly on the device */
};
/* One selected expert's matrices in the view: down always, gate and up for whole slots. */
struct wf__fetch_src {
	const void *d, *g, *u;
	size_t d_bytes, g_bytes, u_bytes;
};
struct wf__fetch;
int wf__fetch_create(struct wf_device *dev, const struct wf_postfetch_settings *s,
                     const struct wf__fetch_shape *shape, struct wf__fetch **ret,
                     struct wf_diag *diag);
void wf__fetch_destroy(struct wf__fetch *f);
/* Loads one expert's down projection into a resident slot (at create, synchronously). */
int wf__fetch_pin(struct wf__fetch *f, uint32_t layer, uint32_t expert, const void *src,
                  size_t bytes, struct wf_diag *diag);
/* One layer's step: the n selected experts (in expert order) and their matrices in the view;
 * writes each one's slot, or -1 (the CPU computes it from the floor). ret_whole (NULL without
 * whole slots): whether the slot holds the expert whole, copies completed, so gate and up can
 * run from it on the device too (wf__fetch_stacks). */
void wf__fetch_step(struct wf__fetch *f, uint32_t layer, uint32_t n, const uint32_t *experts,
                    const struct wf__fetch_src *src, int32_t *ret_slot, bool *ret_whole);
/* The slots as three stacks of equally spaced matrices: slot s's down projection at
 * *ret_d + s * *ret_stride, its gate and up (whole slots) at *ret_g and *ret_u likewise. */
void wf__fetch_stacks(const struct wf__fetch *f, const void **ret_d, const void **ret_g,
                      const void **ret_u, size_t *ret_stride);
/* The slot's bytes to read, or NULL: compute that expert from the floor. */
const void *wf__fetch_ready(struct wf__fetch *f, int32_t slot);
void wf__fetch_end_step(struct wf__fetch *f);
void wf__fetch_get_stats(const struct wf__fetch *f, struct wf__fetch_stats *ret);
void wf__fetch_reset_stats(struct wf__fetch *f);

#endif
