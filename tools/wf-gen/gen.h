/* wf-gen internals: the model plan (spec.c), the tokenizer vocabulary (vocab.c), the weight
 * generators (fill.c) and the writer pipeline (emit.c).
 *
 * Determinism contract: every byte of a tensor depends only on (seed, tensor name, dtype, shape,
 * target mean/std). Tensors are generated in groups of GEN_GROUP elements, each group with its own
 * PRNG state derived from the tensor's seed and the group index, so output is bit-identical
 * whatever the thread count, chunking, sharding or write order. */
#ifndef WF_TOOLS_WF_GEN_GEN_H
#define WF_TOOLS_WF_GEN_GEN_H

#include "base/diag.h"
#include "model/dtype.h"

#include <stdbool.h>
#include <stdint.h>

/* Elements per PRNG group: a multiple of every supported block size (1, 32, 256). */
#define GEN_GROUP 8192u

enum gen_arch {
	GEN_ARCH_QWEN3MOE = 0,
	GEN_ARCH_LLAMA,
	GEN_ARCH_MAX_,
};

/* Which --type-* flag governs a tensor. Norms and the router are always F32. */
enum gen_class {
	GEN_CLASS_EXPERTS = 0, /* ffn_{gate,up,down}_exps */
	GEN_CLASS_ATTN,        /* attn_{q,k,v,output} */
	GEN_CLASS_EMBD,        /* token_embd */
	GEN_CLASS_OUTPUT,      /* output */
	GEN_CLASS_DENSE,       /* dense FFN / shared experts: none in qwen3moe or MoE llama */
	GEN_CLASS_NORM,        /* *_norm: F32 */
	GEN_CLASS_ROUTER,      /* ffn_gate_inp: F32 */
	GEN_CLASS_MAX_,
};

#define GEN_N_TYPED_CLASSES 5 /* classes that a --type-* flag can set */

struct gen_dims {
	uint32_t layers, embd, heads, kv_heads, head_dim;
	uint32_t experts, experts_used, expert_ff, ff;
	uint32_t vocab, ctx;
};

/* Bit per gen_dims field that the user gave explicitly (--size leaves those alone). */
enum gen_dim_bit {
	GEN_DIM_LAYERS = 1u << 0,
	GEN_DIM_EMBD = 1u << 1,
	GEN_DIM_HEADS = 1u << 2,
	GEN_DIM_KV_HEADS = 1u << 3,
	GEN_DIM_HEAD_DIM = 1u << 4,
	GEN_DIM_EXPERTS = 1u << 5,
	GEN_DIM_EXPERTS_USED = 1u << 6,
	GEN_DIM_EXPERT_FF = 1u << 7,
	GEN_DIM_FF = 1u << 8,
	GEN_DIM_VOCAB = 1u << 9,
	GEN_DIM_CTX = 1u << 10,
};

struct gen_config {
	enum gen_arch arch;
	struct gen_dims dims;
	uint32_t dims_set; /* enum gen_dim_bit */
	enum wf_dtype types[GEN_N_TYPED_CLASSES];
	uint64_t seed;
	uint64_t target_size; /* --size, 0 = none */
	const char *name;     /* general.name; NULL = derived */
};

struct gen_tensor {
	char name[64];
	char hf_name[96]; /* Hugging Face name for safetensors; experts get one per expert */
	enum gen_class cls;
	enum wf_dtype dtype;
	uint32_t n_dims;
	int64_t ne[4];
	const char *ne0_flag; /* the flag that sets ne[0], for error messages */
	float mean, std;      /* intended distribution of the dequantized weights */
	uint64_t seed;        /* PRNG seed of this tensor, from (seed, name) */
	uint64_t nbytes;
};

struct gen_plan {
	struct gen_config cfg; /* after defaults and --size fitting */
	struct gen_tensor *tensors;
	uint32_t n_tensors;
	uint64_t data_bytes; /* sum of tensor nbytes */
};

/* spec.c */
const char *gen_arch_name(enum gen_arch a);
int gen_arch_from_name(const char *s, enum gen_arch *ret);
const char *gen_class_name(enum gen_class c);
/* The supported tensor types: F32 F16 BF16 Q8_0 Q4_0 Q4_K Q6_K. */
bool gen_dtype_supported(enum wf_dtype t);
/* Fills defaults for every dim not in cfg->dims_set and every type left at WF_DTYPE_MAX_. */
void gen_config_defaults(struct gen_config *cfg);
/* Grows the dims not set by the user so that the model takes about cfg->target_size bytes.
 * Returns the relative error reached (0.03 = 3 %). */
double gen_config_fit_size(struct gen_config *cfg);
/* Estimated file bytes (tensors with padding plus metadata) for a configuration. */
uint64_t gen_config_bytes(const struct gen_config *cfg);
/* Checks the dims and types (usage errors: WF_EINVAL with diag) and builds the tensor list. */
int gen_plan_build(const struct gen_config *cfg, struct gen_plan *ret_plan, struct wf_diag *diag);
void gen_plan_fini(struct gen_plan *plan);
/* llama_ftype that describes the mix (general.file_type). */
uint32_t gen_plan_file_type(const struct gen_plan *plan);

/* vocab.c: an SPM ("llama") vocabulary of exactly n tokens. */
struct gen_vocab {
	uint32_t n;
	char **tokens;
	float *scores;
	int32_t *types;
};
/* 3 special + 256 byte + 74 single-character tokens */
#define GEN_VOCAB_MIN 333u
int gen_vocab_build(uint32_t n, struct gen_vocab *ret_vocab);
void gen_vocab_fini(struct gen_vocab *v);

/* fill.c */
uint64_t gen_tensor_seed(uint64_t seed, const char *name);
/* Writes the bytes of elements [first, first + n) of tensor t into out. For block types first
 * must be a multiple of GEN_GROUP and n of the block size; float types take any range. */
void gen_fill(const struct gen_tensor *t, uint64_t first, uint64_t n, void *out);
uint16_t gen_f32_to_f16(float f);
uint16_t gen_f32_to_bf16(float f);

/* emit.c */
struct gen_output {
	const char *path;
	bool safetensors;
	uint64_t split_max_bytes;
	uint32_t alignment; /* 0 = default */
	uint32_t threads;
	bool fsync;
	bool buffered; /* through the page cache rather than O_DIRECT */
};
struct gen_stats {
	uint32_t n_files;
	uint64_t bytes; /* every byte written to every file */
	double seconds;
	char first_path[4096];
};
int gen_emit(const struct gen_plan *plan, const struct gen_vocab *vocab,
             const struct gen_output *out, struct gen_stats *ret_stats, struct wf_diag *diag);

#endif
