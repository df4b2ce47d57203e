/* The executor's ops: what an architecture's graph (engine/arch/NAME.c) is written with. Each op
 * takes the slice being computed (its tokens, the rows still carried) from the engine and queues
 * its work on the backend the placement plan chose: the device's (dense weights and resident
 * experts in the device weight store's copies), the host backend for host-side experts (read in
 * place from the floor), post-fetch slots and the expert cache in between (exec.c, moe.c). A
 * graph never names a device, a copy or a placement.
 *
 * Activations are the engine's named buffers, one row per token of the slice: X (the residual
 * stream), XN (its normed copy), TMP (a block's output), Q and ATTN (n_head * head_dim floats a
 * row), K and V (n_head_kv * head_dim). Tensors are handles from wf_ex_tensor / wf_ex_global
 * (WF_ARCH_NONE: the model has none, where the table allows that).
 *
 * Errors are sticky: the first failing op records its error and diag in the engine, and every
 * later op of the slice returns at once; the engine fails the decode with it. */
#ifndef WF_ENGINE_EXEC_H
#define WF_ENGINE_EXEC_H

#include "engine/arch.h"
#include "kernels/backend.h"

#include <stdint.h>

enum wf_act {
	WF_ACT_X,
	WF_ACT_XN,
	WF_ACT_TMP,
	WF_ACT_Q,
	WF_ACT_K,
	WF_ACT_V,
	WF_ACT_ATTN,
	WF_ACT_MAX
};

const struct wf_arch_hparams *wf_ex_hparams(const struct wf_engine *e);
/* The handle of a layer's tensor by its role in the arch's layer table, or of a global one. */
uint32_t wf_ex_tensor(const struct wf_engine *e, uint32_t layer, uint32_t role);
uint32_t wf_ex_global(const struct wf_engine *e, uint32_t role);

/* X = the slice's token embeddings (rows of t_embd, dequantized). */
void wf_ex_embed(struct wf_engine *e, uint32_t t_embd);
/* dst = rms_norm(src) * t_w per row (t_w WF_ARCH_NONE: the norm only). dst may be src. */
void wf_ex_norm(struct wf_engine *e, enum wf_act src, uint32_t t_w, enum wf_act dst);
/* Each of the rows' n_heads heads of a (Q or K) normed in place, times t_w (head_dim floats):
 * qwen3's per-head Q/K norm. */
void wf_ex_head_norm(struct wf_engine *e, enum wf_act a, uint32_t n_heads, uint32_t t_w);
/* dst[i] = t[i] . src for i < n (n <= WF_BACKEND_MAX_PRODUCTS products sharing src). */
void wf_ex_matmul(struct wf_engine *e, enum wf_act src, uint32_t n, const uint32_t *t,
                  const enum wf_act *dst);
/* RoPE in place on a's n_heads heads at each token's position. */
void wf_ex_rope(struct wf_engine *e, enum wf_act a, uint32_t n_heads, enum wf_backend_rope kind);
/* K and V into the layer's cache at each token's position, then ATTN = causal attention of Q
 * over its sequence's cached positions (scale 1/sqrt(head_dim)). */
void wf_ex_attention(struct wf_engine *e, uint32_t layer);
/* dst += src. */
void wf_ex_add(struct wf_engine *e, enum wf_act dst, enum wf_act src);
/* TMP = down(silu(gate . XN) * (up . XN)): a dense SwiGLU FFN. */
void wf_ex_ffn(struct wf_engine *e, uint32_t t_gate, uint32_t t_up, uint32_t t_down);
/* TMP = the routed experts of llama.cpp's build_moe_ffn (softmax gating, top n_expert_used,
 * normalized weights, SwiGLU experts) over XN: t_router the router, t_gate/t_up/t_down the expert
 * stacks. Where each selected expert runs is the placement plan's (moe.c). */
void wf_ex_moe(struct wf_engine *e, uint32_t layer, uint32_t t_router, uint32_t t_gate,
               uint32_t t_up, uint32_t t_down);
/* Before the last layer's FFN: keep only the rows whose logits are wanted (llama.cpp's
 * inp_out_ids): the FFN of the other tokens changes no logit. */
void wf_ex_keep_outputs(struct wf_engine *e);
/* The logits of the kept rows: t_output . rms_norm(X) * t_norm, into the caller's array. */
void wf_ex_logits(struct wf_engine *e, uint32_t t_norm, uint32_t t_output);

#endif
