/* Tensor element types: every ggml type a llama.cpp GGUF can hold, plus the safetensors dtypes
 * that ggml has no number for.
 *
 * The ggml part mirrors ggml/include/ggml.h (enum ggml_type) and the type_traits table of
 * ggml/src/ggml.c at llama.cpp tag b10573 (commit d775b896), which is also what the reference
 * models under tests/data/reference/ were made with. Block sizes and bytes per block were
 * checked by compiling ggml-common.h's block structs at that tag. That tag has three types past
 * MXFP4: NVFP4 (40), Q1_0 (41) and Q2_0 (42), so GGML_TYPE_COUNT is 43.
 *
 * The enum values of ggml types are ggml's own numbers (the u32 stored in a GGUF tensor info), so
 * a GGUF type id maps to enum wf_dtype by a range check and a table lookup. Numbers that ggml has
 * retired (4, 5, 31..33, 36..38) are holes: wf_dtype_info() returns NULL for them. The
 * safetensors-only types start at 64.
 *
 * A type is stored in blocks: block_size elements take type_size bytes. For plain types
 * block_size is 1. A row of ne0 elements takes ne0 / block_size * type_size bytes and ne0 must be a
 * multiple of block_size. */
#ifndef WF_MODEL_DTYPE_H
#define WF_MODEL_DTYPE_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum wf_dtype {
	WF_DTYPE_F32 = 0,
	WF_DTYPE_F16 = 1,
	WF_DTYPE_Q4_0 = 2,
	WF_DTYPE_Q4_1 = 3,
	WF_DTYPE_Q5_0 = 6,
	WF_DTYPE_Q5_1 = 7,
	WF_DTYPE_Q8_0 = 8,
	WF_DTYPE_Q8_1 = 9,
	WF_DTYPE_Q2_K = 10,
	WF_DTYPE_Q3_K = 11,
	WF_DTYPE_Q4_K = 12,
	WF_DTYPE_Q5_K = 13,
	WF_DTYPE_Q6_K = 14,
	WF_DTYPE_Q8_K = 15,
	WF_DTYPE_IQ2_XXS = 16,
	WF_DTYPE_IQ2_XS = 17,
	WF_DTYPE_IQ3_XXS = 18,
	WF_DTYPE_IQ1_S = 19,
	WF_DTYPE_IQ4_NL = 20,
	WF_DTYPE_IQ3_S = 21,
	WF_DTYPE_IQ2_S = 22,
	WF_DTYPE_IQ4_XS = 23,
	WF_DTYPE_I8 = 24,
	WF_DTYPE_I16 = 25,
	WF_DTYPE_I32 = 26,
	WF_DTYPE_I64 = 27,
	WF_DTYPE_F64 = 28,
	WF_DTYPE_IQ1_M = 29,
	WF_DTYPE_BF16 = 30,
	WF_DTYPE_TQ1_0 = 34,
	WF_DTYPE_TQ2_0 = 35,
	WF_DTYPE_MXFP4 = 39,
	WF_DTYPE_NVFP4 = 40, /* 64 elements: four UE4M3 sub-block scales + 32 bytes of E2M1 */
	WF_DTYPE_Q1_0 = 41,
	WF_DTYPE_Q2_0 = 42,
	WF_DTYPE_GGML_COUNT_ = 43, /* GGML_TYPE_COUNT at b10573: first number past ggml's table */

	/* safetensors dtypes with no ggml number */
	WF_DTYPE_U8 = 64,
	WF_DTYPE_U16 = 65,
	WF_DTYPE_U32 = 66,
	WF_DTYPE_U64 = 67,
	WF_DTYPE_BOOL = 68,
	WF_DTYPE_F8_E4M3 = 69,
	WF_DTYPE_F8_E5M2 = 70,
	WF_DTYPE_MAX_
};

struct wf_dtype_info {
	enum wf_dtype dtype;
	const char *name; /* ggml spelling: "F32", "Q4_K", "IQ2_XXS", "MXFP4"; safetensors: "U8" */
	uint32_t block_size; /* elements per block */
	uint32_t type_size;  /* bytes per block */
	bool quantized;
};

/* Table entry for a type, or NULL for a hole or an out-of-range value. Static storage. */
const struct wf_dtype_info *wf_dtype_info(uint32_t dtype);

/* Type by name (case-sensitive ggml/safetensors spelling): returns 0 and writes *ret_dtype on
 * success, WF_EUNKNOWN_TYPE otherwise (also for NULL). Accepts the safetensors
 * spellings too ("F8_E4M3", "BOOL", "I64"). */
int wf_dtype_from_name(const char *name, enum wf_dtype *ret_dtype);

#define WF_DTYPE_MAX_DIMS 8 /* the most dims wf_dtype_nbytes() takes (= WF_MODEL_MAX_DIMS) */

/* True for the dtypes the safetensors format defines and this library can hold (F64, F32, F16,
 * BF16, I64..I8, U64..U8, BOOL, F8_E4M3, F8_E5M2). ggml's quantized names are not among them;
 * the format's sub-byte and exotic types (F4, F6_*, F8_E8M0, *FNUZ, C64) have no wf_dtype yet. */
bool wf_dtype_is_safetensors(uint32_t dtype);

/* Bytes for a tensor of this type and shape (n_dims == 0 is a scalar: one element). Fails with
 * WF_EUNKNOWN_TYPE, WF_EALIGN (ne[0] not a multiple of the block size), WF_EOVERFLOW (the element
 * count or the byte count does not fit in 63 bits) or WF_EINVAL (n_dims > WF_DTYPE_MAX_DIMS).
 * Negative ne is WF_EFORMAT. *ret_nbytes is written only on success. */
int wf_dtype_nbytes(uint32_t dtype, uint32_t n_dims, const int64_t *ne, uint64_t *ret_nbytes);

#ifdef __cplusplus
}
#endif
#endif
