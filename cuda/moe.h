/* The MoE and element-wise family of the CUDA backend (moe.cu): route, copy_rows, swiglu, add and
 * moe_sum; and a host twin of the router kernel for the unit tests without a GPU. No CUDA header.
 *
 * route ranks as the host backend (kernels/cpu_ops.c wf_cpu_route): softmax with the CPU's steps,
 * then top k by probability with ties to the lower id, under the CPU's ">" comparison. A NaN or
 * +inf logit (or all logits -inf) makes every probability NaN there (expf of NaN or of inf - inf
 * enters the softmax's sum), no comparison
 * then succeeds, and the CPU picks the lowest ids not taken yet: so does the kernel (its weights
 * are NaN like the CPU's). moe_sum, add and copy_rows are exact; swiglu differs from the CPU by
 * the device's expf (1e-6 relative). */
#ifndef WF_CUDA_MOE_H
#define WF_CUDA_MOE_H

#include "kernels/backend.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The most experts route takes (its probabilities sit in shared memory) and the largest k. */
#define WF_CUDA_ROUTE_MAX_EXPERT 4096u
#define WF_CUDA_ROUTE_MAX_K      64u

int wf__cuda_moe_preload(struct wf_diag *diag);

int wf__cuda_route(struct wf_backend_ctx *c, const float *logits, uint32_t n, uint32_t n_expert,
                   uint32_t k, int32_t *ids, float *weights, struct wf_diag *diag);
int wf__cuda_copy_rows(struct wf_backend_ctx *c, const float *src, size_t src_stride,
                       const uint32_t *src_idx, uint32_t n, uint32_t len, float *dst,
                       size_t dst_stride, const uint32_t *dst_idx, struct wf_diag *diag);
int wf__cuda_swiglu(struct wf_backend_ctx *c, const float *g, const float *u, float *y,
                    size_t count, struct wf_diag *diag);
int wf__cuda_add(struct wf_backend_ctx *c, float *y, const float *x, size_t count,
                 struct wf_diag *diag);
int wf__cuda_moe_sum(struct wf_backend_ctx *c, const float *d, const float *weights, uint32_t n,
                     uint32_t k, uint32_t len, float *y, struct wf_diag *diag);

/* wf__cuda_route on host memory, in the kernel's steps. 0 or WF_EINVAL (the op's limits). */
int wf__cuda_route_host(const float *logits, uint32_t n, uint32_t n_expert, uint32_t k,
                        int32_t *ids, float *weights);

#ifdef __cplusplus
}
#endif
#endif
