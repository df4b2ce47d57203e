/* qwen3moe (llama.cpp src/models/qwen3moe.cpp): pre-norm attention with per-head RMS norms on Q
 * and K and NEOX RoPE, then a routed SwiGLU MoE FFN (softmax gating over all experts, top k,
 * weights renormalized), no biases, no shared expert. */
#include "engine/exec.h"

#include "base/error.h"

enum { G_TOK_EMBD, G_OUTPUT_NORM, G_OUTPUT, G_N };
enum {
	L_ATTN_NORM,
	L_Q,
	L_K,
	L_V,
	L_O,
	L_Q_NORM,
	L_K_NORM,
	L_FFN_NORM,
	L_ROUTER,
	L_GATE_EXPS,
	L_UP_EXPS,
	L_DOWN_EXPS,
	L_N
};

static const struct wf_arch_tensor globals[G_N] = {
    [G_TOK_EMBD] = {"token_embd.weight", {WF_DIM_EMBD, WF_DIM_VOCAB}, WF_ARCH_ROWS, WF_ARCH_NONE},
    [G_OUTPUT_NORM] = {"output_norm.weight", {WF_DIM_EMBD}, WF_ARCH_F32, WF_ARCH_NONE},
    /* Absent: tied to the token embedding, as llama.cpp falls back. */
    [G_OUTPUT] = {"output.weight", {WF_DIM_EMBD, WF_DIM_VOCAB}, WF_ARCH_OPTIONAL, G_TOK_EMBD},
};

static const struct wf_arch_tensor layer[L_N] = {
    [L_ATTN_NORM] = {"attn_norm", {WF_DIM_EMBD}, WF_ARCH_F32, WF_ARCH_NONE},
    [L_Q] = {"attn_q", {WF_DIM_EMBD, WF_DIM_Q}, 0, WF_ARCH_NONE},
    [L_K] = {"attn_k", {WF_DIM_EMBD, WF_DIM_KV}, 0, WF_ARCH_NONE},
    [L_V] = {"attn_v", {WF_DIM_EMBD, WF_DIM_KV}, 0, WF_ARCH_NONE},
    [L_O] = {"attn_output", {WF_DIM_Q, WF_DIM_EMBD}, 0, WF_ARCH_NONE},
    [L_Q_NORM] = {"attn_q_norm", {WF_DIM_HEAD}, WF_ARCH_F32, WF_ARCH_NONE},
    [L_K_NORM] = {"attn_k_norm", {WF_DIM_HEAD}, WF_ARCH_F32, WF_ARCH_NONE},
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
};

static int configure(const struct wf_model *model, struct wf_arch_hparams *hp, struct wf_diag *diag)
{
	(void)model;
	if (!hp->moe)
		return wf_diag_set(diag, WF_EFORMAT, "qwen3moe: expert_count is missing or 0");
	return 0;
}

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
		wf_ex_head_norm(e, WF_ACT_Q, hp->n_head, T(L_Q_NORM));
		wf_ex_head_norm(e, WF_ACT_K, hp->n_head_kv, T(L_K_NORM));
		wf_ex_rope(e, WF_ACT_Q, hp->n_head, WF_BACKEND_ROPE_NEOX);
		wf_ex_rope(e, WF_ACT_K, hp->n_head_kv, WF_BACKEND_ROPE_NEOX);
		wf_ex_attention(e, il);
		wf_ex_matmul(e, WF_ACT_ATTN, 1, &o, &tmp);
		wf_ex_add(e, WF_ACT_X, WF_ACT_TMP);
		if (il == hp->n_layer - 1)
			wf_ex_keep_outputs(e);
		wf_ex_norm(e, WF_ACT_X, T(L_FFN_NORM), WF_ACT_XN);
		wf_ex_moe(e, il, T(L_ROUTER), T(L_GATE_EXPS), T(L_UP_EXPS), T(L_DOWN_EXPS));
		wf_ex_add(e, WF_ACT_X, WF_ACT_TMP);
#undef T
	}
	wf_ex_logits(e, wf_ex_global(e, G_OUTPUT_NORM), wf_ex_global(e, G_OUTPUT));
}

const struct wf_arch wf__arch_qwen3moe = {
    .name = "qwen3moe",
    .globals = globals,
    .n_globals = G_N,
    .layer = layer,
    .n_layer_roles = L_N,
    .moe_roles = {L_ROUTER, L_GATE_EXPS, L_UP_EXPS, L_DOWN_EXPS},
    .configure = configure,
    .forward = forward,
};
