/* The matmul family of the CUDA engine ops (matmul.cu): quantized mat-vec kernels for decode,
 * dequantization to F16 and cuBLAS for prompts, get_rows; and its host entry points, the same
 * block decoders and lane arithmetic run on the CPU, for the unit tests without a GPU
 * (tests/cuda/test_cuda_dequant.c). Included from C and CUDA. */
#ifndef WF_CUDA_MATMUL_H
#define WF_CUDA_MATMUL_H

#include "cuda/engine_ctx.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Loads cuBLAS (once per process; the mm workspace does it at create): 0, or WF_EUNSUPPORTED
 * with the loader's message when the library or a function is missing. */
int wf__cuda_blas_load(struct wf_diag *diag);
int wf__cuda_mm_create(struct wf__cuda_engine_ctx *c, struct wf_diag *diag);
void wf__cuda_mm_destroy(struct wf__cuda_mm *mm);
bool wf__cuda_supports(enum wf_dtype type);
int wf__cuda_matmul(void *ctx, const struct wf_engine_dev_matrix *w, const float *x,
                    size_t x_stride, uint32_t n, float *y, size_t y_stride, struct wf_diag *diag);
int wf__cuda_matmul_experts(void *ctx, const struct wf_engine_dev_matrix *w, size_t stride,
                            uint32_t n_groups, const uint32_t *index, const uint32_t *first,
                            const uint32_t *count, const float *x, size_t x_stride, float *y,
                            size_t y_stride, struct wf_diag *diag);
int wf__cuda_get_rows(void *ctx, const struct wf_engine_dev_matrix *w, const int32_t *ids,
                      uint32_t n, float *y, struct wf_diag *diag);
/* For tests, on the host: dequantizes n elements (a whole number of blocks) of type with the
 * same block decoders the kernels use (dequant.cuh, __host__ __device__), so their bit layouts
 * are checked against the CPU reference without a GPU. WF_EUNSUPPORTED for a type without. */
int wf__cuda_dequantize_host(enum wf_dtype type, const void *x, float *y, int64_t n);

/* The mat-vec kernel's path (n in 1..8) on host memory: every lane's share of each row's dot
 * products through the same function the kernel calls, added in the kernel's shuffle order:
 * y[j * y_stride + i] = sum_k W[i][k] x[j * x_stride + k]. Not bitwise the GPU's (the device
 * contracts into FMAs), but the same elements in the same lanes. WF_EUNSUPPORTED for a type
 * without kernels, WF_EINVAL for a malformed matrix or n outside 1..8. */
int wf__cuda_matvec_host(const struct wf_engine_dev_matrix *w, const float *x, size_t x_stride,
                         uint32_t n, float *y, size_t y_stride);

#ifdef __cplusplus
}
#endif
#endif
