/* The matmul family of the CUDA backend (matmul.cu): matmul, mul_mat_id and get_rows for the
 * weight types F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K and Q6_K; and host entry points that run
 * the kernels' own __host__ __device__ arithmetic on the CPU, so the unit tests check it without
 * a GPU. No CUDA header: the context is opaque here.
 *
 * Paths and numerics (per product, chosen by the number of activation rows):
 *
 *  mat-vec, n <= 32 (matmul) and n * k <= 64 (mul_mat_id, a decode step; also the rows of small
 *  expert groups of a prompt): one warp per weight row, lanes reading consecutive bytes of the
 *  row and of the activations. The activations are first converted as the CPU converts them
 *  (ggml's vec_dot_type, bit for bit): Q8_0 for Q8_0/Q4_0 weights, Q8_K for the K-quants, F16 for
 *  F16 and BF16 for BF16 weights (F32 weights read x as it is). Quantized blocks are then dotted
 *  in integers (dp4a) exactly as the CPU's block sums, and scaled in float: results differ from
 *  the host backend only in the order of float additions (NMSE ~1e-14).
 *
 *  prompt, n > 32 (matmul) and n * k > 64 (mul_mat_id, expert groups of >= 16 rows): cuBLAS
 *  with float accumulation and output. F32 weights: F32 x F32, CUBLAS_COMPUTE_32F_PEDANTIC (no
 *  TF32, no BF16x9 emulation). BF16 weights: read in place with x rounded to BF16, as the CPU
 *  rounds it (products exact in float). F16 weights: read in place with x rounded to F16.
 *  Quantized weights: dequantized to F16 in a workspace (in slabs of rows for tall matrices),
 *  with x rounded to F16 (NMSE vs the host's Q8 activations ~1.5e-5: the CPU's own int8
 *  rounding). F16 activations never overflow: a row whose largest magnitude reaches 2^15 is
 *  scaled by a power of two before rounding and the outputs by its inverse (exact); the
 *  mat-vec path of F16 weights does the same, so it computes the host's F16 rounding wherever
 *  the host's does not overflow to infinity.
 *
 * Alignment: matrix data, row_size and stride must be multiples of 4 bytes for F32, Q4_K and
 * Q5_K (whole blocks of 4-byte words) and of 2 bytes for the other types (WF_EINVAL otherwise;
 * GGUF tensors are 32-byte aligned). */
#ifndef WF_CUDA_MATMUL_H
#define WF_CUDA_MATMUL_H

#include "kernels/backend.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The most activation rows of the matmul mat-vec path, and of a mul_mat_id queued without a
 * host wait (n * k). */
#define WF_CUDA_MV_MAX_ROWS   32u
#define WF_CUDA_MMID_MAX_ROWS 64u

/* The matmul workspace of a context (cuBLAS handle and its workspace, activation and weight
 * buffers, pinned host buffers for the prompt path's grouping), all sized from the limits.
 * _destroy accepts a half-built context. */
int wf__cuda_mm_create(struct wf_backend_ctx *c, struct wf_diag *diag);
void wf__cuda_mm_destroy(struct wf_backend_ctx *c);
/* Loads every matmul kernel (cudaFuncGetAttributes), so no launch loads a module later. */
int wf__cuda_mm_preload(struct wf_diag *diag);
/* Runs cuBLAS on each GEMM kind at the context's largest shapes and a few narrower ones (up to
 * 24 GEMMs), so that cuBLAS's own lazy loading and setup happen at create for the kernels those
 * shapes pick (another shape may still load one later: tests/cuda's memory test measures it).
 * Waits for the stream. */
int wf__cuda_mm_warmup(struct wf_backend_ctx *c, struct wf_diag *diag);

bool wf__cuda_supports(enum wf_dtype type);
int wf__cuda_matmul(struct wf_backend_ctx *c, uint32_t n_products,
                    const struct wf_backend_product *p, const float *x, size_t x_stride, uint32_t n,
                    struct wf_diag *diag);
int wf__cuda_mul_mat_id(struct wf_backend_ctx *c, uint32_t n_products,
                        const struct wf_backend_product *p, const int32_t *ids, uint32_t n,
                        uint32_t k, const float *x, size_t x_stride, bool x_per_slot,
                        struct wf_diag *diag);
int wf__cuda_get_rows(struct wf_backend_ctx *c, const struct wf_backend_matrix *w,
                      const int32_t *ids, uint32_t n, float *y, struct wf_diag *diag);

/* Loads cuBLAS (libcublas, dlopen) if it is not loaded yet: 0, or WF_EUNSUPPORTED with the
 * loader's message. A failed load leaves nothing mapped and is tried again at the next call. */
int wf__cuda_blas_load(struct wf_diag *diag);

/* ---- Host entry points for the unit tests (no GPU) ---------------------------------------- */

/* Dequantizes n elements (a whole number of blocks) with the kernels' block decoders
 * (dequant.cuh). WF_EUNSUPPORTED for a type without them, WF_EINVAL for a partial block. */
int wf__cuda_dequantize_host(enum wf_dtype type, const void *x, float *y, int64_t n);

/* The activation conversion of the mat-vec path for weights of type `weight` (its vec_dot_type),
 * one row of ne0 floats, into the CPU's layout of that type (wf_block_q8_0 / wf_block_q8_K
 * blocks, F16 or BF16 halves) so that tests compare it with the CPU's from_float byte for byte.
 * *ret_exp: the power of two the row was scaled down by (F16 only, else 0). For F32 weights
 * WF_EINVAL (they read x as it is). */
int wf__cuda_act_host(enum wf_dtype weight, const float *x, int64_t ne0, void *out, int *ret_exp);

/* The mat-vec path on host memory: activations converted by the kernels' functions, every lane's
 * share of each row through the function the kernel calls, the warp's shuffle tree in its order.
 * y[j * y_stride + i] = W[i] . x[j * x_stride] for j < n <= 32. Not bitwise the GPU's (the
 * device contracts float multiply-adds), but the same integers and lanes. WF_EUNSUPPORTED for a
 * type without kernels, WF_EINVAL for a malformed matrix or n outside 1..32. */
int wf__cuda_matvec_host(const struct wf_backend_matrix *w, const float *x, size_t x_stride,
                         uint32_t n, float *y, size_t y_stride);

/* mul_mat_id's mat-vec path on host memory: the kernel's index arithmetic (row t * k + j, expert
 * ids[row], x row t or t * k + j, matrix data + e * stride; rows of ids < 0 untouched) around
 * wf__cuda_matvec_host's lane arithmetic. n * k <= 64. */
int wf__cuda_mul_mat_id_host(const struct wf_backend_matrix *w, const int32_t *ids, uint32_t n,
                             uint32_t k, const float *x, size_t x_stride, bool x_per_slot, float *y,
                             size_t y_stride);

/* mul_mat_id's prompt-path grouping on host memory (the function the op runs on the ids it
 * reads back): groups (g_index[i] a matrix, g_count[i] its rows, sorted by matrix; *ret_g of
 * them, up to rows); groups of 16 rows or more (none without gemm) placed consecutively in order
 * (g_first[i], else UINT32_MAX), rows in row order within (*ret_nb rows); every other row with an
 * id >= 0 in list, in row order (*ret_nl). WF_EINVAL for an id past stack; WF_EINTERNAL if the
 * per-matrix counters were not left at zero. order, list: rows entries; g_*: rows entries. */
int wf__cuda_mmid_group_host(const int32_t *ids, uint32_t rows, uint32_t stack, bool gemm,
                             uint32_t *order, uint32_t *list, uint32_t *g_index, uint32_t *g_first,
                             uint32_t *g_count, uint32_t *ret_g, uint32_t *ret_nb,
                             uint32_t *ret_nl);

/* The prompt path's numerics on host memory (for its tolerance): weights as the GEMM reads them
 * (F32 as they are; F16 and BF16 as stored; quantized ones dequantized by the kernels' decoders
 * and rounded to F16), activations as its conversion rounds them (F32; BF16; F16 with the row's
 * power-of-two scale), products summed in double, outputs scaled back. n >= 1. */
int wf__cuda_gemm_host(const struct wf_backend_matrix *w, const float *x, size_t x_stride,
                       uint32_t n, float *y, size_t y_stride);

#ifdef __cplusplus
}
#endif
#endif
