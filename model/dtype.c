#include "model/dtype.h"

#include "base/error.h"

#include <stddef.h>
#include <string.h>

/* Block sizes and bytes per block of ggml at llama.cpp b10573 (type_traits in ggml/src/ggml.c,
 * block_* structs in ggml/src/ggml-common.h; QK_K = 256). Spelled the way gguf-py and the GGUF
 * tooling print them (GGMLQuantizationType), which is also the spelling in safetensors headers
 * for the plain types. A zero block_size marks a hole. */
#define Q(name, bs, ts) [WF_DTYPE_##name] = {WF_DTYPE_##name, #name, bs, ts, true}
#define P(name, ts)     [WF_DTYPE_##name] = {WF_DTYPE_##name, #name, 1, ts, false}

static const struct wf_dtype_info dtype_table[WF_DTYPE_MAX_] = {
    P(F32, 4),
    P(F16, 2),
    Q(Q4_0, 32, 18),
    Q(Q4_1, 32, 20),
    Q(Q5_0, 32, 22),
    Q(Q5_1, 32, 24),
    Q(Q8_0, 32, 34),
    Q(Q8_1, 32, 36),
    Q(Q2_K, 256, 84),
    Q(Q3_K, 256, 110),
    Q(Q4_K, 256, 144),
    Q(Q5_K, 256, 176),
    Q(Q6_K, 256, 210),
    Q(Q8_K, 256, 292),
    Q(IQ2_XXS, 256, 66),
    Q(IQ2_XS, 256, 74),
    Q(IQ3_XXS, 256, 98),
    Q(IQ1_S, 256, 50),
    Q(IQ4_NL, 32, 18),
    Q(IQ3_S, 256, 110),
    Q(IQ2_S, 256, 82),
    Q(IQ4_XS, 256, 136),
    P(I8, 1),
    P(I16, 2),
    P(I32, 4),
    P(I64, 8),
    P(F64, 8),
    Q(IQ1_M, 256, 56),
    P(BF16, 2),
    Q(TQ1_0, 256, 54),
    Q(TQ2_0, 256, 66),
    Q(MXFP4, 32, 17),
    Q(NVFP4, 64, 36),
    Q(Q1_0, 128, 18),
    Q(Q2_0, 64, 18),

    P(U8, 1),
    P(U16, 2),
    P(U32, 4),
    P(U64, 8),
    P(BOOL, 1),
    P(F8_E4M3, 1),
    P(F8_E5M2, 1),
};

#undef Q
#undef P

_Static_assert(WF_DTYPE_GGML_COUNT_ <= WF_DTYPE_U8, "safetensors types must follow ggml's");

const struct wf_dtype_info *wf_dtype_info(uint32_t dtype)
{
	if (dtype >= WF_DTYPE_MAX_ || dtype_table[dtype].block_size == 0)
		return NULL;
	return &dtype_table[dtype];
}

int wf_dtype_from_name(const char *name, enum wf_dtype *ret_dtype)
{
	if (!name)
		return WF_EUNKNOWN_TYPE;
	for (uint32_t i = 0; i < WF_DTYPE_MAX_; i++) {
		if (dtype_table[i].block_size && strcmp(dtype_table[i].name, name) == 0) {
			*ret_dtype = (enum wf_dtype)i;
			return 0;
		}
	}
	return WF_EUNKNOWN_TYPE;
}

int wf_dtype_nbytes(uint32_t dtype, uint32_t n_dims, const int64_t *ne, uint64_t *ret_nbytes)
{
	const struct wf_dtype_info *ti = wf_dtype_info(dtype);
	if (!ti)
		return WF_EUNKNOWN_TYPE;
	if (n_dims > WF_DTYPE_MAX_DIMS)
		return WF_EINVAL;

	/* Every dimension is checked for sign before any product, so that a negative extent cannot
	 * hide behind a zero one. */
	for (uint32_t i = 0; i < n_dims; i++)
		if (ne[i] < 0)
			return WF_EFORMAT;

	uint64_t n = 1;
	for (uint32_t i = 0; i < n_dims; i++)
		if (__builtin_mul_overflow(n, (uint64_t)ne[i], &n) || n > (uint64_t)INT64_MAX)
			return WF_EOVERFLOW;

	uint64_t row = n_dims ? (uint64_t)ne[0] : 1;
	if (row % ti->block_size != 0)
		return WF_EALIGN;

	/* n is a multiple of ne[0], hence of the block size. */
	uint64_t bytes;
	if (__builtin_mul_overflow(n / ti->block_size, (uint64_t)ti->type_size, &bytes) ||
	    bytes > (uint64_t)INT64_MAX)
		return WF_EOVERFLOW;
	*ret_nbytes = bytes;
	return 0;
}

bool wf_dtype_is_safetensors(uint32_t d)
{
	switch (d) {
	case WF_DTYPE_F64:
	case WF_DTYPE_F32:
	case WF_DTYPE_F16:
	case WF_DTYPE_BF16:
	case WF_DTYPE_I64:
	case WF_DTYPE_I32:
	case WF_DTYPE_I16:
	case WF_DTYPE_I8:
	case WF_DTYPE_U64:
	case WF_DTYPE_U32:
	case WF_DTYPE_U16:
	case WF_DTYPE_U8:
	case WF_DTYPE_BOOL:
	case WF_DTYPE_F8_E4M3:
	case WF_DTYPE_F8_E5M2:
		return true;
	default:
		return false;
	}
}
