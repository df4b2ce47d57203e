/* The MoE family of the CUDA engine ops (moe.cu): the router's softmax and top-k, gather,
 * swiglu, add and the experts' weighted sum; and a host twin of the router kernel for the unit
 * test without a GPU. Included from C and CUDA. */
#ifndef WF_CUDA_MOE_H
#define WF_CUDA_MOE_H

#include "cuda/engine_ctx.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

int wf__cuda_route(void *ctx, const float *logits, uint32_t n, uint32_t n_expert, uint32_t k,
                   int32_t *ids, float *weights, struct wf_diag *diag);
int wf__cuda_gather(void *ctx, const float *x, const uint32_t *idx, uint32_t n, uint32_t len,
                    float *y, struct wf_diag *diag);
int wf__cuda_swiglu(void *ctx, const float *g, const float *u, float *y, size_t count,
                    struct wf_diag *diag);
int wf__cuda_add(void *ctx, float *y, const float *x, size_t count, struct wf_diag *diag);
int wf__cuda_moe_sum(void *ctx, const float *down, const uint32_t *slot_of, const float *weights,
                     uint32_t n, uint32_t k, uint32_t len, float *y, struct wf_diag *diag);

/* wf__cuda_route on host memory, in the kernel's steps. 0 or WF_EINVAL (the op's limits). */
int wf__cuda_route_host(const float *logits, uint32_t n, uint32_t n_expert, uint32_t k,
                        int32_t *ids, float *weights);

#ifdef __cplusplus
}
#endif
#endif
