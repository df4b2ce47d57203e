/* llama (llama.cpp src/models/llama.cpp): pre-norm attention with NORM RoPE (adjacent pairs), then
 * either a dense SwiGLU FFN or, Mixtral-style, a routed SwiGLU MoE FFN (softmax gating, top k,
 * weights renormalized). No biases. A rope_freqs tensor (Llama 3's frequency factors) is refused
 * rather than ignored: tensors.c takes no tensor the table does not name. */
#include "engine/exec.h"

enum { G_TOK_EMBD, G_OUTPUT_NORM, G_OUTPUT, G_N };
enum {
	L_ATTN_NORM,
	L_Q,
	L_K,
	L_V,
	L_O,
	L_FFN_NORM,
	L_ROUTER,
	L_GATE_EXPS,
	L_UP_EXPS,
	L_DOWN_EXPS,
	L_FFN_GATE,
	L_FFN_UP,
	L_FFN_DOWN,
	L_N
};

static const struct wf_arch_tensor globals[G_N] = {
    [G_TOK_EMBD] = {"token_embd.weight", {WF_DIM_EMBD, WF_DIM_VOCAB}, WF_ARCH_ROWS, WF_ARCH_NONE},
    [G_OUTPUT_NORM] = {"output_norm.weight", {WF_DIM_EMBD}, WF_ARCH_F32, WF_ARCH_NONE},
    [G_OUTPUT] = {"output.weight", {WF_DIM_EMBD, WF_DIM_VOCAB}, WF_ARCH_OPTIONAL, G_TOK_EMBD},
};

static const struct wf_arch_tensor layer[L_N] = {
    [L_ATTN_NORM] = {"attn_norm", {WF_DIM_EMBD}, WF_ARCH_F32, WF_ARCH_NONE},
    [L_Q] = {"attn_q", {WF_DIM_EMBD, WF_DIM_Q}, 0, WF_ARCH_NONE},
    [L_K] = {"attn_k", {WF_DIM_EMBD, WF_DIM_KV}, 0, WF_ARCH_NONE},
    [L_V] = {"attn_v", {WF_DIM_EMBD, WF_DIM_KV}, 0, WF_ARCH_NONE},
    [L_O] = {"attn_output", {WF_DIM_Q, WF_DIM_EMBD}, 0, WF_ARCH_NONE},
    [L_FFN_NORM] = {"ffn_norm", {WF_DIM_EMBD}, WF_ARCH_F32, WF_ARCH_NONE},
    [L_ROUTER] = {"ffn_gate_inp", {WF_DIM_EMBD, WF_DIM_EXPERT}, WF_ARCH_MOE, WF_ARCH_NONE},
    [L_GATE_EXPS] = {"ffn_gate_exps",
                     {WF_DIM_EMBD, WF_DIM_FF, WF_DIM_EXPERT},
                     WF_ARCH_MOE | WF_ARCH_EXPERTS,
                     WF_ARCH_NONE},
    [L_UP_EXPS] = {"ffn_up_exps",
                   {WF_DIM_EMBD, WF_DIM_FF, WF_DIM_EXPERT},
                   WF_ARCH_MOE | WF_ARCH_EXPERTS,
                   WF_ARCH_NONE},
    [L_DOWN_EXPS] = {"ffn_down_exps",
                     {WF_DIM_FF, WF_DIM_EMBD, WF_DIM_EXPERT},
                     WF_ARCH_MOE | WF_ARCH_EXPERTS,
                     WF_ARCH_NONE},
    [L_FFN_GATE] = {"ffn_gate", {WF_DIM_EMBD, WF_DIM_FF}, WF_ARCH_DENSE, WF_ARCH_NONE},
    [L_FFN_UP] = {"ffn_up", {WF_DIM_EMBD, WF_DIM_FF}, WF_ARCH_DENSE, WF_ARCH_NONE},
    [L_FFN_DOWN] = {"ffn_down", {WF_DIM_FF, WF_DIM_EMBD}, WF_ARCH_DENSE, WF_ARCH_NONE},
};

static void forward(struct wf_engine *e)
{
	const struct wf_arch_hparams *hp = wf_ex_hparams(e);
	const enum wf_act qkv_out[3] = {WF_ACT_Q, WF_ACT_K, WF_ACT_V};
	const enum wf_act tmp = WF_ACT_TMP;
	wf_ex_embed(e, wf_ex_global(e, G_TOK_EMBD));
	for (uint32_t il = 0; il < hp->n_layer; il++) {
#define T(role) wf_ex_tensor(e, il, (role))
		const uint32_t qkv[3] = {T(L_Q), T(L_K), T(L_V)}, o = T(L_O);
		wf_ex_norm(e, WF_ACT_X, T(L_ATTN_NORM), WF_ACT_XN);
		wf_ex_matmul(e, WF_ACT_XN, 3, qkv, qkv_out);
		wf_ex_rope(e, WF_ACT_Q, hp->n_head, WF_BACKEND_ROPE_NORM);
		wf_ex_rope(e, WF_ACT_K, hp->n_head_kv, WF_BACKEND_ROPE_NORM);
		wf_ex_attention(e, il);
		wf_ex_matmul(e, WF_ACT_ATTN, 1, &o, &tmp);
		wf_ex_add(e, WF_ACT_X, WF_ACT_TMP);
		if (il == hp->n_layer - 1)
			wf_ex_keep_outputs(e);
		wf_ex_norm(e, WF_ACT_X, T(L_FFN_NORM), WF_ACT_XN);
		if (hp->moe)
			wf_ex_moe(e, il, T(L_ROUTER), T(L_GATE_EXPS), T(L_UP_EXPS), T(L_DOWN_EXPS));
		else
			wf_ex_ffn(e, T(L_FFN_GATE), T(L_FFN_UP), T(L_FFN_DOWN));
		wf_ex_add(e, WF_ACT_X, WF_ACT_TMP);
#undef T
	}
	wf_ex_logits(e, wf_ex_global(e, G_OUTPUT_NORM), wf_ex_global(e, G_OUTPUT));
}

const struct wf_arch wf__arch_llama = {
    .name = "llama",
    .globals = globals,
    .n_globals = G_N,
    .layer = layer,
    .n_layer_roles = L_N,
    .moe_roles = {L_ROUTER, L_GATE_EXPS, L_UP_EXPS, L_DOWN_EXPS},
    .configure = NULL,
    .forward = forward,
};
