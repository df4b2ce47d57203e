/* Plain-C reference kernels for the weight types the engine runs: F32, F16, BF16, Q8_0, Q4_0,
 * Q4_K, Q5_K and Q6_K, and the activation types llama.cpp pairs them with (F32, F16, BF16, Q8_0,
 * Q8_K).
 *
 * Semantics are ggml's at llama.cpp tag b10573 (commit d775b896), the release the reference models
 * under tests/data/reference/ were dumped with:
 *  - block layouts: the block_* structs of ggml/src/ggml-common.h (QK_K = 256);
 *  - dequantize_row_*: ggml/src/ggml-quants.c, the same float expression per element;
 *  - the activation quantizers: the x86 quantize_row_q8_0 of ggml-cpu/arch/x86/quants.c, which
 *    llama.cpp's AVX2 build runs (values times 127 / amax rounded half to even, d = amax / 127
 *    stored as F16; quantize_row_q8_0_ref's 1 / d and halves away from zero differ by an ulp and
 *    a tie), and quantize_row_q8_K_ref (round half to even, d = max/-127 with the sign of the
 *    element of largest magnitude, 16-element bsums), bit for bit;
 *  - vec_dot_*: the scalar ("generic") paths of ggml/src/ggml-cpu/quants.c and vec.cpp: integer
 *    sums per block, then the scales, with the same float operations in the same order (the
 *    K-quants keep ggml's eight float lanes, one per position modulo 8, added at the end after
 *    the mins). F32/F16/BF16 dots accumulate in double as ggml's non-SIMD path does.
 * These are the numbers the SIMD paths are checked against; they are not meant to be fast.
 *
 * Rows: n is the element count of one row and must be a multiple of the type's block size
 * (model/dtype.h); x and y must not overlap. Blocks need only the alignment of their structs, which
 * every GGUF tensor offset (a multiple of 32) and row size satisfies. Thread-safe (no state). */
#ifndef WF_KERNELS_REF_H
#define WF_KERNELS_REF_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define WF_QK8_0        32
#define WF_QK4_0        32
#define WF_QK_K         256
#define WF_K_SCALE_SIZE 12

/* F16 and BF16 values are their raw bits; d fields are IEEE binary16 bits. */
struct wf_block_q8_0 {
	uint16_t d;
	int8_t qs[WF_QK8_0];
};
struct wf_block_q4_0 {
	uint16_t d;
	uint8_t qs[WF_QK4_0 / 2]; /* element j in the low nibble of qs[j], j + 16 in the high one */
};
struct wf_block_q4_K {
	uint16_t d, dmin;                /* scales of the 6-bit sub-block scales and mins */
	uint8_t scales[WF_K_SCALE_SIZE]; /* 8 scales + 8 mins, 6 bits each, packed */
	uint8_t qs[WF_QK_K / 2];         /* 64-element chunks: low nibbles, then high ones */
};
struct wf_block_q5_K {
	uint16_t d, dmin;
	uint8_t scales[WF_K_SCALE_SIZE];
	uint8_t qh[WF_QK_K / 8]; /* bit s of qh[l]: the fifth bit of element l of sub-block s */
	uint8_t qs[WF_QK_K / 2];
};
struct wf_block_q6_K {
	uint8_t ql[WF_QK_K / 2];     /* low 4 bits */
	uint8_t qh[WF_QK_K / 4];     /* high 2 bits */
	int8_t scales[WF_QK_K / 16]; /* one per 16 elements */
	uint16_t d;
};
struct wf_block_q8_K {
	float d;
	int8_t qs[WF_QK_K];
	int16_t bsums[WF_QK_K / 16]; /* sums of qs by 16 */
};

_Static_assert(sizeof(struct wf_block_q8_0) == 34, "q8_0 block");
_Static_assert(sizeof(struct wf_block_q4_0) == 18, "q4_0 block");
_Static_assert(sizeof(struct wf_block_q4_K) == 144, "q4_K block");
_Static_assert(sizeof(struct wf_block_q5_K) == 176, "q5_K block");
_Static_assert(sizeof(struct wf_block_q6_K) == 210, "q6_K block");
_Static_assert(sizeof(struct wf_block_q8_K) == 292, "q8_K block");

/* IEEE binary16 and bfloat16 conversions (round to nearest even; NaN stays NaN, made quiet). */
float wf_kernels_fp16_to_fp32(uint16_t h);
uint16_t wf_kernels_fp32_to_fp16(float f);
float wf_kernels_bf16_to_fp32(uint16_t h);
uint16_t wf_kernels_fp32_to_bf16(float f);

/* Blocks (x) to n floats (y). */
void wf_kernels_ref_dequantize_row_f32(const void *x, float *y, int64_t n);
void wf_kernels_ref_dequantize_row_f16(const void *x, float *y, int64_t n);
void wf_kernels_ref_dequantize_row_bf16(const void *x, float *y, int64_t n);
void wf_kernels_ref_dequantize_row_q8_0(const void *x, float *y, int64_t n);
void wf_kernels_ref_dequantize_row_q4_0(const void *x, float *y, int64_t n);
void wf_kernels_ref_dequantize_row_q4_K(const void *x, float *y, int64_t n);
void wf_kernels_ref_dequantize_row_q5_K(const void *x, float *y, int64_t n);
void wf_kernels_ref_dequantize_row_q6_K(const void *x, float *y, int64_t n);
void wf_kernels_ref_dequantize_row_q8_K(const void *x, float *y, int64_t n);

/* n floats (x) to the activation type (y). Unlike ggml, an all-zero Q8_K block gets zero bsums
 * too (ggml leaves them unwritten; they are multiplied by d = 0 either way). */
void wf_kernels_ref_quantize_row_f32(const float *x, void *y, int64_t n);
void wf_kernels_ref_quantize_row_f16(const float *x, void *y, int64_t n);
void wf_kernels_ref_quantize_row_bf16(const float *x, void *y, int64_t n);
void wf_kernels_ref_quantize_row_q8_0(const float *x, void *y, int64_t n);
void wf_kernels_ref_quantize_row_q8_K(const float *x, void *y, int64_t n);

/* Dot product of one weight row x (n elements) with one activation row y of the paired type. */
float wf_kernels_ref_vec_dot_f32_f32(int64_t n, const void *x, const void *y);
float wf_kernels_ref_vec_dot_f16_f16(int64_t n, const void *x, const void *y);
float wf_kernels_ref_vec_dot_bf16_bf16(int64_t n, const void *x, const void *y);
float wf_kernels_ref_vec_dot_q8_0_q8_0(int64_t n, const void *x, const void *y);
float wf_kernels_ref_vec_dot_q4_0_q8_0(int64_t n, const void *x, const void *y);
float wf_kernels_ref_vec_dot_q4_K_q8_K(int64_t n, const void *x, const void *y);
float wf_kernels_ref_vec_dot_q5_K_q8_K(int64_t n, const void *x, const void *y);
float wf_kernels_ref_vec_dot_q6_K_q8_K(int64_t n, const void *x, const void *y);

/* out[j * out_stride + i] = the vec_dot above of weight row i (w + i * w_stride bytes) with
 * activation row j (act + j * act_stride bytes), for i < n_rows, j < n_act (kernels.h's gemm). */
#define WF_KERNELS_REF_GEMM(name)                                                                  \
	void wf_kernels_ref_gemm_##name(int64_t n, const void *w, size_t w_stride, int64_t n_rows, \
	                                const void *act, size_t act_stride, int64_t n_act,         \
	                                float *out, size_t out_stride)
WF_KERNELS_REF_GEMM(f32_f32);
WF_KERNELS_REF_GEMM(f16_f16);
WF_KERNELS_REF_GEMM(bf16_bf16);
WF_KERNELS_REF_GEMM(q8_0_q8_0);
WF_KERNELS_REF_GEMM(q4_0_q8_0);
WF_KERNELS_REF_GEMM(q4_K_q8_K);
WF_KERNELS_REF_GEMM(q5_K_q8_K);
WF_KERNELS_REF_GEMM(q6_K_q8_K);

#ifdef __cplusplus
}
#endif
#endif
