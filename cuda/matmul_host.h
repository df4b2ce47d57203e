/* Host entry points into matmul.cu's kernel arithmetic, for the unit tests that run without a
 * GPU (tests/cuda/test_cuda_dequant.c); wf__cuda_dequantize_host is in engine_ctx.h. No CUDA
 * headers: included from C. */
#ifndef WF_CUDA_MATMUL_HOST_H
#define WF_CUDA_MATMUL_HOST_H

#include "engine/devops.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

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
