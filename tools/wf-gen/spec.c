/* What wf-gen writes: defaults, --size fitting, validation and the tensor list.
 *
 * Tensor names, shapes and required hparams follow llama.cpp b10573 (src/models/qwen3moe.cpp and
 * src/models/llama.cpp, load_arch_tensors): ggml ne order, ffn_{gate,up}_exps [n_embd, n_ff_exp,
 * n_expert], ffn_down_exps [n_ff_exp, n_embd, n_expert], ffn_gate_inp [n_embd, n_expert]. The
 * MoE "llama" arch takes the experts' width from feed_forward_length, qwen3moe from
 * expert_feed_forward_length (its feed_forward_length is unused). */
#include "gen.h"

#include "base/error.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define MAX_LAYERS  512  /* LLAMA_MAX_LAYERS */
#define MAX_EXPERTS 1024 /* LLAMA_MAX_EXPERTS */
#define MAX_VOCAB   (1u << 21)
#define MAX_DIM     (1u << 20)

const char *gen_arch_name(enum gen_arch a)
{
	return a == GEN_ARCH_LLAMA ? "llama" : "qwen3moe";
}

int gen_arch_from_name(const char *s, enum gen_arch *ret)
{
	if (strcmp(s, "qwen3moe") == 0)
		*ret = GEN_ARCH_QWEN3MOE;
	else if (strcmp(s, "llama") == 0)
		*ret = GEN_ARCH_LLAMA;
	else
		return WF_EINVAL;
	return 0;
}

const char *gen_class_name(enum gen_class c)
{
	static const char *const names[GEN_CLASS_MAX_] = {
	    [GEN_CLASS_EXPERTS] = "experts", [GEN_CLASS_ATTN] = "attn",   [GEN_CLASS_EMBD] = "embd",
	    [GEN_CLASS_OUTPUT] = "output",   [GEN_CLASS_DENSE] = "dense", [GEN_CLASS_NORM] = "norm",
	    [GEN_CLASS_ROUTER] = "router",
	};
	return (unsigned)c < GEN_CLASS_MAX_ ? names[c] : "?";
}

bool gen_dtype_supported(enum wf_dtype t)
{
	switch (t) {
	case WF_DTYPE_F32:
	case WF_DTYPE_F16:
	case WF_DTYPE_BF16:
	case WF_DTYPE_Q8_0:
	case WF_DTYPE_Q4_0:
	case WF_DTYPE_Q4_K:
	case WF_DTYPE_Q6_K:
		return true;
	default:
		return false;
	}
}

void gen_config_defaults(struct gen_config *c)
{
	/* Small enough for a unit test (a few MB), shaped like the shared reference models, and
	 * legal for every supported type (every ne[0] a multiple of 256). */
	struct gen_dims d = {
	    .layers = 3,
	    .embd = 256,
	    .heads = 8,
	    .kv_heads = 4,
	    .head_dim = 32,
	    .experts = 16,
	    .experts_used = 4,
	    .expert_ff = 256,
	    .ff = 768,
	    .vocab = 1024,
	    .ctx = 2048,
	};
	if (c->arch == GEN_ARCH_LLAMA) {
		d.experts = 8; /* Mixtral-style */
		d.experts_used = 2;
		d.expert_ff = 512;
		d.ff = 512;
	}
	struct gen_dims *u = &c->dims;
#define DEF(bit, f)                                                                                \
	if (!(c->dims_set & (bit)))                                                                \
		u->f = d.f;
	DEF(GEN_DIM_LAYERS, layers)
	DEF(GEN_DIM_EMBD, embd)
	DEF(GEN_DIM_HEADS, heads)
	DEF(GEN_DIM_KV_HEADS, kv_heads)
	DEF(GEN_DIM_HEAD_DIM, head_dim)
	DEF(GEN_DIM_EXPERTS, experts)
	DEF(GEN_DIM_EXPERTS_USED, experts_used)
	DEF(GEN_DIM_EXPERT_FF, expert_ff)
	DEF(GEN_DIM_FF, ff)
	DEF(GEN_DIM_VOCAB, vocab)
	DEF(GEN_DIM_CTX, ctx)
#undef DEF
	/* Derived defaults follow what the user did set, so that e.g. --embd 1024 alone keeps
	 * the attention consistent. */
	if (!(c->dims_set & GEN_DIM_HEADS) && (c->dims_set & (GEN_DIM_EMBD | GEN_DIM_HEAD_DIM)))
		u->heads = u->embd / u->head_dim ? u->embd / u->head_dim : 1;
	if (!(c->dims_set & GEN_DIM_KV_HEADS))
		u->kv_heads = u->heads % 2 == 0 ? u->heads / 2 : u->heads;
	if (!(c->dims_set & GEN_DIM_EXPERTS_USED) && u->experts_used > u->experts)
		u->experts_used = u->experts;
	if (c->arch == GEN_ARCH_LLAMA) {
		/* One width: llama.cpp reads the experts' ff from feed_forward_length. */
		if ((c->dims_set & GEN_DIM_FF) && !(c->dims_set & GEN_DIM_EXPERT_FF))
			u->expert_ff = u->ff;
		else if (!(c->dims_set & GEN_DIM_FF))
			u->ff = u->expert_ff;
	} else if (!(c->dims_set & GEN_DIM_FF)) {
		u->ff = 3 * u->expert_ff; /* unused by qwen3moe; differs on purpose */
	}
	static const enum wf_dtype types[GEN_N_TYPED_CLASSES] = {
	    [GEN_CLASS_EXPERTS] = WF_DTYPE_Q4_K, [GEN_CLASS_ATTN] = WF_DTYPE_Q8_0,
	    [GEN_CLASS_EMBD] = WF_DTYPE_Q8_0,    [GEN_CLASS_OUTPUT] = WF_DTYPE_Q6_K,
	    [GEN_CLASS_DENSE] = WF_DTYPE_Q8_0,
	};
	for (int i = 0; i < GEN_N_TYPED_CLASSES; i++)
		if (c->types[i] == WF_DTYPE_MAX_)
			c->types[i] = types[i];
}

/* ---- tensor enumeration ------------------------------------------------------------------- */

typedef int (*tensor_fn)(void *ctx, struct gen_tensor *t);

static enum wf_dtype class_dtype(const struct gen_config *c, enum gen_class cls)
{
	if (cls == GEN_CLASS_NORM || cls == GEN_CLASS_ROUTER)
		return WF_DTYPE_F32; /* as llama-quantize leaves them */
	return c->types[cls];
}

struct tdesc {
	const char *name;    /* printf pattern with the layer */
	const char *hf_qwen; /* Hugging Face name pattern (layer, and %%u for the expert) */
	const char *hf_llama;
	enum gen_class cls;
	int kind; /* shape, see shape_of() */
	bool qwen_only;
};

enum {
	SH_EMBD_VOCAB, /* [embd, vocab] */
	SH_EMBD,       /* [embd] */
	SH_Q,          /* [embd, heads*head_dim] */
	SH_KV,         /* [embd, kv_heads*head_dim] */
	SH_O,          /* [heads*head_dim, embd] */
	SH_HEAD,       /* [head_dim] */
	SH_ROUTER,     /* [embd, experts] */
	SH_UP,         /* [embd, expert_ff, experts] */
	SH_DOWN,       /* [expert_ff, embd, experts] */
};

static const struct tdesc layer_tensors[] = {
    {"blk.%u.attn_norm.weight", "model.layers.%u.input_layernorm.weight",
     "model.layers.%u.input_layernorm.weight", GEN_CLASS_NORM, SH_EMBD, false},
    {"blk.%u.attn_q.weight", "model.layers.%u.self_attn.q_proj.weight",
     "model.layers.%u.self_attn.q_proj.weight", GEN_CLASS_ATTN, SH_Q, false},
    {"blk.%u.attn_k.weight", "model.layers.%u.self_attn.k_proj.weight",
     "model.layers.%u.self_attn.k_proj.weight", GEN_CLASS_ATTN, SH_KV, false},
    {"blk.%u.attn_v.weight", "model.layers.%u.self_attn.v_proj.weight",
     "model.layers.%u.self_attn.v_proj.weight", GEN_CLASS_ATTN, SH_KV, false},
    {"blk.%u.attn_output.weight", "model.layers.%u.self_attn.o_proj.weight",
     "model.layers.%u.self_attn.o_proj.weight", GEN_CLASS_ATTN, SH_O, false},
    {"blk.%u.attn_q_norm.weight", "model.layers.%u.self_attn.q_norm.weight", NULL, GEN_CLASS_NORM,
     SH_HEAD, true},
    {"blk.%u.attn_k_norm.weight", "model.layers.%u.self_attn.k_norm.weight", NULL, GEN_CLASS_NORM,
     SH_HEAD, true},
    {"blk.%u.ffn_norm.weight", "model.layers.%u.post_attention_layernorm.weight",
     "model.layers.%u.post_attention_layernorm.weight", GEN_CLASS_NORM, SH_EMBD, false},
    {"blk.%u.ffn_gate_inp.weight", "model.layers.%u.mlp.gate.weight",
     "model.layers.%u.block_sparse_moe.gate.weight", GEN_CLASS_ROUTER, SH_ROUTER, false},
    {"blk.%u.ffn_gate_exps.weight", "model.layers.%u.mlp.experts.%%u.gate_proj.weight",
     "model.layers.%u.block_sparse_moe.experts.%%u.w1.weight", GEN_CLASS_EXPERTS, SH_UP, false},
    {"blk.%u.ffn_up_exps.weight", "model.layers.%u.mlp.experts.%%u.up_proj.weight",
     "model.layers.%u.block_sparse_moe.experts.%%u.w3.weight", GEN_CLASS_EXPERTS, SH_UP, false},
    {"blk.%u.ffn_down_exps.weight", "model.layers.%u.mlp.experts.%%u.down_proj.weight",
     "model.layers.%u.block_sparse_moe.experts.%%u.w2.weight", GEN_CLASS_EXPERTS, SH_DOWN, false},
};

static void shape_of(const struct gen_config *c, int kind, struct gen_tensor *t)
{
	const struct gen_dims *d = &c->dims;
	int64_t q = (int64_t)d->heads * d->head_dim, kv = (int64_t)d->kv_heads * d->head_dim;
	t->n_dims = 2;
	t->ne[2] = t->ne[3] = 1;
	switch (kind) {
	case SH_EMBD_VOCAB:
		t->ne[0] = d->embd, t->ne[1] = d->vocab, t->ne0_flag = "--embd";
		break;
	case SH_EMBD:
		t->n_dims = 1, t->ne[0] = d->embd, t->ne[1] = 1, t->ne0_flag = "--embd";
		break;
	case SH_Q:
		t->ne[0] = d->embd, t->ne[1] = q, t->ne0_flag = "--embd";
		break;
	case SH_KV:
		t->ne[0] = d->embd, t->ne[1] = kv, t->ne0_flag = "--embd";
		break;
	case SH_O:
		t->ne[0] = q, t->ne[1] = d->embd, t->ne0_flag = "--heads x --head-dim";
		break;
	case SH_HEAD:
		t->n_dims = 1, t->ne[0] = d->head_dim, t->ne[1] = 1, t->ne0_flag = "--head-dim";
		break;
	case SH_ROUTER:
		t->ne[0] = d->embd, t->ne[1] = d->experts, t->ne0_flag = "--embd";
		break;
	case SH_UP:
		t->n_dims = 3, t->ne[0] = d->embd, t->ne[1] = d->expert_ff, t->ne[2] = d->experts;
		t->ne0_flag = "--embd";
		break;
	case SH_DOWN:
		t->n_dims = 3, t->ne[0] = d->expert_ff, t->ne[1] = d->embd, t->ne[2] = d->experts;
		t->ne0_flag =
		    c->arch == GEN_ARCH_LLAMA ? "--expert-ff (= --ff for llama)" : "--expert-ff";
		break;
	}
}

/* Intended std of each weight: inputs of every projection are RMS-normalised (rms ~1), so
 * 1/sqrt(fan_in) keeps every activation near unit scale through the layers; the router and the
 * output head are a little hotter so that routing and logits are not flat (about 2 and 3 std). */
static void init_of(const struct gen_config *c, const char *name, struct gen_tensor *t)
{
	const struct gen_dims *d = &c->dims;
	t->mean = 0.0f;
	if (t->cls == GEN_CLASS_NORM) {
		t->mean = 1.0f;
		t->std = 0.05f;
	} else if (t->cls == GEN_CLASS_EMBD) {
		t->std = 1.0f;
	} else if (t->cls == GEN_CLASS_OUTPUT) {
		t->std = 3.0f / sqrtf((float)d->embd);
	} else if (t->cls == GEN_CLASS_ROUTER) {
		t->std = 2.0f / sqrtf((float)d->embd);
	} else if (strstr(name, "attn_output")) {
		t->std = 1.0f / sqrtf((float)d->heads * (float)d->head_dim);
	} else if (strstr(name, "ffn_down")) {
		t->std = 1.0f / sqrtf((float)d->expert_ff);
	} else {
		t->std = 1.0f / sqrtf((float)d->embd);
	}
}

static int emit_one(const struct gen_config *c, tensor_fn fn, void *ctx, enum gen_class cls,
                    int kind, const char *name, const char *hf)
{
	struct gen_tensor t;
	memset(&t, 0, sizeof(t));
	snprintf(t.name, sizeof(t.name), "%s", name);
	snprintf(t.hf_name, sizeof(t.hf_name), "%s", hf ? hf : "");
	t.cls = cls;
	t.dtype = class_dtype(c, cls);
	shape_of(c, kind, &t);
	init_of(c, name, &t);
	t.seed = gen_tensor_seed(c->seed, t.name);
	return fn(ctx, &t);
}

/* Calls fn for every tensor, in file order: token_embd, the layers, output_norm, output. */
static int for_each_tensor(const struct gen_config *c, tensor_fn fn, void *ctx)
{
	int r = emit_one(c, fn, ctx, GEN_CLASS_EMBD, SH_EMBD_VOCAB, "token_embd.weight",
	                 "model.embed_tokens.weight");
	for (uint32_t l = 0; l < c->dims.layers && r == 0; l++) {
		for (size_t i = 0; i < sizeof(layer_tensors) / sizeof(layer_tensors[0]) && r == 0;
		     i++) {
			const struct tdesc *d = &layer_tensors[i];
			if (d->qwen_only && c->arch != GEN_ARCH_QWEN3MOE)
				continue;
			char name[64], hf[96];
			snprintf(name, sizeof(name), d->name, l);
			snprintf(hf, sizeof(hf),
			         c->arch == GEN_ARCH_LLAMA ? d->hf_llama : d->hf_qwen, l);
			r = emit_one(c, fn, ctx, d->cls, d->kind, name, hf);
		}
	}
	if (r == 0)
		r = emit_one(c, fn, ctx, GEN_CLASS_NORM, SH_EMBD, "output_norm.weight",
		             "model.norm.weight");
	if (r == 0)
		r = emit_one(c, fn, ctx, GEN_CLASS_OUTPUT, SH_EMBD_VOCAB, "output.weight",
		             "lm_head.weight");
	return r;
}

/* ---- size ------------------------------------------------------------------------------------ */

struct sum_ctx {
	uint64_t bytes;
};

static uint64_t tensor_bytes(const struct gen_tensor *t)
{
	uint64_t nb = 0;
	if (wf_dtype_nbytes(t->dtype, t->n_dims, t->ne, &nb) < 0) {
		/* Shapes not legal for the type still need a size estimate while fitting. */
		const struct wf_dtype_info *ti = wf_dtype_info(t->dtype);
		double e =
		    (double)t->ne[0] * (double)t->ne[1] * (double)t->ne[2] * (double)t->ne[3];
		nb = ti ? (uint64_t)(e * ti->type_size / ti->block_size) : 0;
	}
	return (nb + 31) & ~31ull; /* with the default padding */
}

static int sum_fn(void *ctx, struct gen_tensor *t)
{
	((struct sum_ctx *)ctx)->bytes += tensor_bytes(t);
	return 0;
}

/* Header bytes beyond the tensors: mostly the vocabulary (string, score, type per token). */
static uint64_t meta_bytes(const struct gen_config *c)
{
	return 4096 + (uint64_t)c->dims.vocab * (8 + 7 + 4 + 4) +
	       (uint64_t)c->dims.layers * 12 * 80;
}

static uint64_t model_bytes(const struct gen_config *c)
{
	struct sum_ctx s = {0};
	for_each_tensor(c, sum_fn, &s);
	return s.bytes + meta_bytes(c);
}

static double clampd(double x, double lo, double hi)
{
	return x < lo ? lo : x > hi ? hi : x;
}

double gen_config_fit_size(struct gen_config *c)
{
	static const uint32_t embd_ladder[] = {256,  512,  768,  1024, 1280, 1536, 2048,
	                                       2560, 3072, 4096, 5120, 6144, 7168, 8192};
	static const uint32_t ff_ladder[] = {256, 512, 768, 1024, 1536, 2048, 2560, 3072, 4096};
	static const uint32_t experts_ladder[] = {4, 8, 16, 32, 64, 128, 256};
	const double T = (double)c->target_size;
	const double mib = 1024.0 * 1024.0;
	/* Preferred shapes grow slowly with the size: ~12 layers and 16 experts at 64 MiB, ~22
	 * layers and ~90 experts at 2 GiB; the experts' ff about half the embedding. */
	const double L_pref = clampd(round(2.0 * log2(T / mib)), 2, 64);
	const double X_pref = clampd(16.0 * sqrt(T / (64.0 * mib)), 8, 128);

	const uint32_t ff_fixed =
	    c->arch == GEN_ARCH_LLAMA ? (GEN_DIM_EXPERT_FF | GEN_DIM_FF) : GEN_DIM_EXPERT_FF;
	struct gen_config best = *c;
	double best_cost = INFINITY, best_err = INFINITY;
#define N(a) (sizeof(a) / sizeof((a)[0]))
	for (size_t ie = 0; ie < N(embd_ladder); ie++) {
		for (size_t iff = 0; iff < N(ff_ladder); iff++) {
			for (size_t ix = 0; ix < N(experts_ladder); ix++) {
				struct gen_config t = *c;
				struct gen_dims *d = &t.dims;
				if (!(c->dims_set & GEN_DIM_EMBD))
					d->embd = embd_ladder[ie];
				else if (ie)
					continue;
				if (!(c->dims_set & ff_fixed))
					d->expert_ff = ff_ladder[iff];
				else if (iff)
					continue;
				if (!(c->dims_set & GEN_DIM_EXPERTS))
					d->experts = experts_ladder[ix];
				else if (ix)
					continue;
				if (!(c->dims_set & GEN_DIM_HEAD_DIM))
					d->head_dim = d->embd >= 1024 ? 64 : 32;
				if (!(c->dims_set & GEN_DIM_HEADS))
					d->heads =
					    d->embd / d->head_dim ? d->embd / d->head_dim : 1;
				if (!(c->dims_set & GEN_DIM_KV_HEADS))
					d->kv_heads = d->heads % 4 == 0 ? d->heads / 4 : d->heads;
				if (!(c->dims_set & GEN_DIM_EXPERTS_USED))
					d->experts_used = d->experts < 8    ? 2
					                  : d->experts < 64 ? 4
					                                    : 8;
				if (t.arch == GEN_ARCH_LLAMA)
					d->ff = d->expert_ff;
				else if (!(c->dims_set & GEN_DIM_FF))
					d->ff = 3 * d->expert_ff;
				/* bytes(L) is affine in L: measure it at 1 and 2 layers (cheap,
				 * unlike enumerating every layer of every candidate) */
				uint32_t layers = d->layers;
				d->layers = 1;
				double b1 = (double)model_bytes(&t);
				d->layers = 2;
				double per = (double)model_bytes(&t) - b1;
				d->layers = layers;
				if (!(c->dims_set & GEN_DIM_LAYERS)) {
					double L = round((T - (b1 - per)) / per);
					d->layers = (uint32_t)clampd(L, 1, 256);
				}
				double bytes = b1 + per * (d->layers - 1.0);
				double err = fabs(bytes - T) / T;
				double cost = (err > 0.05 ? 100.0 : 20.0) * err +
				              fabs(log2(d->layers / L_pref)) +
				              0.5 * fabs(log2(d->experts / X_pref)) +
				              0.5 * fabs(log2(2.0 * d->expert_ff / d->embd));
				if (cost < best_cost) {
					best_cost = cost;
					best_err = err;
					best = t;
				}
			}
		}
	}
#undef N
	*c = best;
	return best_err;
}

uint64_t gen_config_bytes(const struct gen_config *c)
{
	return model_bytes(c);
}

/* ---- validation and plan ---------------------------------------------------------------- */

static int check_dims(const struct gen_config *c, struct wf_diag *diag)
{
	const struct gen_dims *d = &c->dims;
	if (d->layers < 1 || d->layers > MAX_LAYERS)
		return wf_diag_set(diag, WF_EINVAL, "--layers must be 1..%d, got %u", MAX_LAYERS,
		                   d->layers);
	if (d->experts < 1)
		return wf_diag_set(diag, WF_EINVAL,
		                   "--experts must be at least 1: wf-gen writes MoE models");
	if (d->experts > MAX_EXPERTS)
		return wf_diag_set(diag, WF_EINVAL, "--experts %u exceeds llama.cpp's limit of %d",
		                   d->experts, MAX_EXPERTS);
	if (d->experts_used < 1 || d->experts_used > d->experts)
		return wf_diag_set(diag, WF_EINVAL,
		                   "--experts-used must be 1..--experts (%u), got %u", d->experts,
		                   d->experts_used);
	if (d->embd < 1 || d->embd > MAX_DIM)
		return wf_diag_set(diag, WF_EINVAL, "--embd must be 1..%u, got %u", MAX_DIM,
		                   d->embd);
	if (d->heads < 1 || d->heads > 4096)
		return wf_diag_set(diag, WF_EINVAL, "--heads must be 1..4096, got %u", d->heads);
	if (d->kv_heads < 1 || d->heads % d->kv_heads != 0)
		return wf_diag_set(diag, WF_EINVAL, "--kv-heads must divide --heads (%u), got %u",
		                   d->heads, d->kv_heads);
	if (d->head_dim < 2 || d->head_dim % 2 || d->head_dim > 4096)
		return wf_diag_set(
		    diag, WF_EINVAL,
		    "--head-dim must be even and 2..4096 (RoPE rotates pairs), got %u",
		    d->head_dim);
	if (d->expert_ff < 1 || d->expert_ff > MAX_DIM)
		return wf_diag_set(diag, WF_EINVAL, "--expert-ff must be 1..%u, got %u", MAX_DIM,
		                   d->expert_ff);
	if (c->arch == GEN_ARCH_LLAMA && d->ff != d->expert_ff)
		return wf_diag_set(diag, WF_EINVAL,
		                   "--ff %u and --expert-ff %u differ: the MoE llama arch has one "
		                   "width (feed_forward_length, used by the experts)",
		                   d->ff, d->expert_ff);
	if (d->ff < 1 || d->ff > MAX_DIM)
		return wf_diag_set(diag, WF_EINVAL, "--ff must be 1..%u, got %u", MAX_DIM, d->ff);
	if (d->vocab < GEN_VOCAB_MIN || d->vocab > MAX_VOCAB)
		return wf_diag_set(diag, WF_EINVAL,
		                   "--vocab must be %u..%u (special, byte and character tokens "
		                   "need %u), got %u",
		                   GEN_VOCAB_MIN, MAX_VOCAB, GEN_VOCAB_MIN, d->vocab);
	if (d->ctx < 1)
		return wf_diag_set(diag, WF_EINVAL, "--ctx must be at least 1");
	for (int i = 0; i < GEN_N_TYPED_CLASSES; i++)
		if (!gen_dtype_supported(c->types[i])) {
			const struct wf_dtype_info *ti = wf_dtype_info(c->types[i]);
			return wf_diag_set(diag, WF_EINVAL,
			                   "--type-%s %s is not supported (F32 F16 BF16 Q8_0 Q4_0 "
			                   "Q4_K Q6_K)",
			                   gen_class_name((enum gen_class)i), ti ? ti->name : "?");
		}
	return 0;
}

struct build_ctx {
	struct gen_plan *plan;
	uint32_t cap;
	struct wf_diag *diag;
};

static int build_fn(void *ctx, struct gen_tensor *t)
{
	struct build_ctx *b = ctx;
	const struct wf_dtype_info *ti = wf_dtype_info(t->dtype);
	if (t->ne[0] % ti->block_size != 0)
		return wf_diag_set(
		    b->diag, WF_EINVAL,
		    "%s (%s) has ne[0] = %lld from %s, not a multiple of %u as %s "
		    "needs: change that dimension or use --type-%s with another type",
		    t->name, gen_class_name(t->cls), (long long)t->ne[0], t->ne0_flag,
		    ti->block_size, ti->name, gen_class_name(t->cls));
	int r = wf_dtype_nbytes(t->dtype, t->n_dims, t->ne, &t->nbytes);
	if (r < 0)
		return wf_diag_set(b->diag, WF_EINVAL, "%s: shape too large", t->name);
	struct gen_plan *p = b->plan;
	if (p->n_tensors == b->cap) {
		uint32_t cap = b->cap ? b->cap * 2 : 256;
		struct gen_tensor *n = realloc(p->tensors, cap * sizeof(*n));
		if (!n)
			return -ENOMEM;
		p->tensors = n;
		b->cap = cap;
	}
	p->tensors[p->n_tensors++] = *t;
	p->data_bytes += t->nbytes;
	return 0;
}

int gen_plan_build(const struct gen_config *cfg, struct gen_plan *ret_plan, struct wf_diag *diag)
{
	int r = check_dims(cfg, diag);
	if (r < 0)
		return r;
	struct gen_plan plan = {.cfg = *cfg};
	struct build_ctx b = {.plan = &plan, .diag = diag};
	r = for_each_tensor(cfg, build_fn, &b);
	if (r < 0) {
		gen_plan_fini(&plan);
		return r;
	}
	*ret_plan = plan;
	return 0;
}

void gen_plan_fini(struct gen_plan *plan)
{
	if (!plan)
		return;
	free(plan->tensors);
	memset(plan, 0, sizeof(*plan));
}

uint32_t gen_plan_file_type(const struct gen_plan *plan)
{
	/* llama_ftype numbers (include/llama.h), named after the experts' type, which dominates. */
	bool all_f32 = true;
	for (int i = 0; i < GEN_N_TYPED_CLASSES; i++)
		if (plan->cfg.types[i] != WF_DTYPE_F32)
			all_f32 = false;
	if (all_f32)
		return 0; /* LLAMA_FTYPE_ALL_F32 */
	switch (plan->cfg.types[GEN_CLASS_EXPERTS]) {
	case WF_DTYPE_F16:
		return 1;
	case WF_DTYPE_Q4_0:
		return 2;
	case WF_DTYPE_Q8_0:
		return 7;
	case WF_DTYPE_Q4_K:
		return plan->cfg.types[GEN_CLASS_OUTPUT] == WF_DTYPE_Q6_K ? 15 : 14; /* K_M : K_S */
	case WF_DTYPE_Q6_K:
		return 18;
	case WF_DTYPE_BF16:
		return 32;
	default:
		return 0;
	}
}
