/* What an architecture is to the engine: one file per architecture (engine/arch/NAME.c, as
 * llama.cpp's src/models/NAME.cpp), holding its tensor table, its hyperparameters and its layer
 * graph, the graph written once against the executor's ops (engine/exec.h) whatever the device
 * and wherever each layer's and expert's work runs (the placement plan is the executor's data,
 * not a second copy of the graph).
 *
 * Adding an architecture: its arch file (table, configure, forward), an entry in arch.c's list,
 * the kernels it needs (a new op in kernels/backend.h, implemented by every backend), and
 * tools/wf-gen to make test models of it. Nothing else in the engine changes. */
#ifndef WF_ENGINE_ARCH_H
#define WF_ENGINE_ARCH_H

#include "base/diag.h"
#include "model/model.h"

#include <stdbool.h>
#include <stdint.h>

struct wf_engine;

/* The dimensions a tensor table entry names: each resolves to a hyperparameter. */
enum wf_arch_dim {
	WF_DIM_1 = 0, /* 1: the dimension is absent */
	WF_DIM_EMBD,  /* n_embd */
	WF_DIM_VOCAB, /* n_vocab */
	WF_DIM_Q,     /* n_head * head_dim */
	WF_DIM_KV,    /* n_head_kv * head_dim */
	WF_DIM_HEAD,  /* head_dim */
	WF_DIM_FF,    /* n_ff: the experts' width in a MoE model, the FFN's in a dense one */
	WF_DIM_EXPERT /* n_expert */
};

/* Entry flags. */
#define WF_ARCH_F32      0x01u /* a vector the ops read as floats (norms): F32 only */
#define WF_ARCH_OPTIONAL 0x02u /* may be absent (then the entry's `tied` role stands in) */
#define WF_ARCH_MOE      0x04u /* only in a model with experts (n_expert > 0), required there */
#define WF_ARCH_DENSE    0x08u /* only in a model without experts, required there */
#define WF_ARCH_EXPERTS  0x10u /* a stack of the routed experts' matrices (ne[2] = n_expert) */
#define WF_ARCH_ROWS     0x20u /* read by rows (the token embedding): a token reads one row */

#define WF_ARCH_NONE UINT32_MAX /* a role without a tensor, a tensor handle that is absent */

/* One tensor of the table: a global ("output_norm.weight") or, for layer entries, the part of
 * "blk.N.<name>.weight". `role` is the entry's index in its table (the arch's own enum). */
struct wf_arch_tensor {
	const char *name;
	uint8_t dims[3]; /* enum wf_arch_dim of ne[0], ne[1], ne[2] */
	uint8_t flags;
	uint32_t tied; /* OPTIONAL globals: the role whose tensor stands in (WF_ARCH_NONE: none) */
};

/* The hyperparameters the executor and the graphs use, resolved and checked at create. */
struct wf_arch_hparams {
	uint32_t n_vocab, n_embd, n_layer, n_head, n_head_kv, head_dim, rope_dim;
	uint32_t n_expert, n_expert_used, n_ff, n_ctx_train;
	float rope_base, rms_eps;
	bool moe; /* n_expert > 0 */
};

struct wf_arch {
	const char *name; /* general.architecture */
	const struct wf_arch_tensor *globals;
	uint32_t n_globals;
	const struct wf_arch_tensor *layer;
	uint32_t n_layer_roles;
	/* The layer roles of the routed experts: router, gate, up and down stacks (what the graph
	 * passes to wf_ex_moe), so the placement plan can size expert slots and say which tensors
	 * are host-side before the first step. WF_ARCH_NONE x 4 for an architecture without. */
	uint32_t moe_roles[4];
	/* Checks what the common resolution (arch.c: the GGUF keys every supported architecture
	 * shares) left to the architecture, and reads its own keys. diag names the key at fault. */
	int (*configure)(const struct wf_model *model, struct wf_arch_hparams *hp,
	                 struct wf_diag *diag);
	/* The graph: one slice of tokens through every layer to the logits, as calls of the
	 * executor's ops (exec.h). Errors are the executor's (sticky: after one, the calls do
	 * nothing and the slice fails). */
	void (*forward)(struct wf_engine *e);
};

/* The architectures the engine runs, by name; NULL when none has it. */
const struct wf_arch *wf__arch_find(const char *name);
/* "qwen3moe, llama": for messages. Static. */
const char *wf__arch_names(void);

/* Resolves the hyperparameters every architecture shares from the model's GGUF keys, then the
 * arch's configure. WF_EUNSUPPORTED (not GGUF), WF_ENOT_FOUND (a missing key), WF_EFORMAT
 * (inconsistent values), WF_ELIMIT (values out of range). */
int wf__arch_hparams(const struct wf_arch *arch, const struct wf_model *model,
                     struct wf_arch_hparams *ret, struct wf_diag *diag);

#endif
