/* The attention family of the CUDA engine ops (attention.cu): the KV store and attention over
 * the device KV cache, and a host twin of the attention kernel's partition and numerics for the
 * unit test without a GPU. Included from C and CUDA. */
#ifndef WF_CUDA_ATTENTION_H
#define WF_CUDA_ATTENTION_H

#include "cuda/engine_ctx.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

int wf__cuda_kv_store(void *ctx, const float *k, const float *v, uint32_t n, uint32_t row,
                      const uint32_t *dst_row, void *kc, void *vc, enum wf_engine_dev_kv type,
                      struct wf_diag *diag);
int wf__cuda_attention(void *ctx, const float *q, size_t q_stride, uint32_t n, uint32_t n_head,
                       uint32_t n_head_kv, uint32_t head_dim, const void *kc, const void *vc,
                       enum wf_engine_dev_kv type, const uint32_t *kv_first, const uint32_t *n_kv,
                       float scale, float *out, struct wf_diag *diag);

/* wf__cuda_attention on host memory (kc and vc: the layer's cache bytes), in the kernel's
 * partition: warp w takes positions w, w + WARPS, ..., lane l the elements l, l + 32, ...
 * 0 or WF_EINVAL (the op's limits). */
int wf__cuda_attention_host(const float *q, size_t q_stride, uint32_t n, uint32_t n_head,
                            uint32_t n_head_kv, uint32_t head_dim, const void *kc, const void *vc,
                            enum wf_engine_dev_kv type, const uint32_t *kv_first,
                            const uint32_t *n_kv, float scale, float *out);

#ifdef __cplusplus
}
#endif
#endif
