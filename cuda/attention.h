/* The attention family of the CUDA backend (attention.cu): the KV store, attention over the
 * device KV cache, and a host twin of the attention kernels' partition and numerics for the unit
 * tests without a GPU. No CUDA header.
 *
 * Numerics. An F16 cache is llama.cpp's CPU flash attention (kernels/cpu_ops.c wf_cpu_attend):
 * the query rounded to F16; each score the CPU's 8-lane fused dot in its reduction order; the
 * online softmax with the V accumulator rounded to F16 after every position, in position order.
 * An F32 cache: the CPU's sequential float dot, then an online softmax in float.
 *
 * The window split (flash-decoding). A window of fewer than 2 x WF_CUDA_ATT_SPLIT_MIN positions
 * is one sequence of steps, the CPU's own, so it computes the CPU's floats (but for the last ulp
 * of expf on the device). A longer window is split into up to S consecutive ranges of at least
 * WF_CUDA_ATT_SPLIT_MIN positions (S chosen per call from the grid the GPU needs), each range
 * run by its own block from an empty state with the CPU's F16 steps, and the ranges' states
 * (max, sum, F16 accumulator) merged in float. The split changes the rounding: each range's
 * accumulator starts from zero at its own running maximum instead of carrying the previous
 * positions' rounded sum, and the merge rescales in float instead of F16. Since the CPU's F16
 * accumulator loses precision as its sum grows, the split result is closer to exact arithmetic
 * than the CPU's (measured on the host twin at 256 to 4096 positions: NMSE vs exact <= 3.2e-6,
 * the CPU's 2.5e-6 .. 9.3e-5) and as far from the CPU's as the CPU is from exact (NMSE ~2.3e-8
 * per position for a flat softmax; tests/cuda/test_cuda_ops_host.c states the tolerance). An F32
 * cache splits the same way in float (NMSE vs the CPU <= 1e-10).  */
#ifndef WF_CUDA_ATTENTION_H
#define WF_CUDA_ATTENTION_H

#include "kernels/backend.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Head sizes the kernels take: a multiple of 8 up to 256. */
#define WF_CUDA_ATT_MAX_DIM 256u
/* The shortest range of a split window: windows under twice this are never split (computed as
 * the CPU computes them). */
#define WF_CUDA_ATT_SPLIT_MIN 128u
/* Partial states (token x head x range) the context holds for split windows: decode of 8
 * sequences x 32 heads x 32 ranges (4096 positions). Calls needing more split less. */
#define WF_CUDA_ATT_STATES 8192u

/* The attention workspace (the split ranges' partial states), sized from the limits. */
int wf__cuda_att_create(struct wf_backend_ctx *c, struct wf_diag *diag);
void wf__cuda_att_destroy(struct wf_backend_ctx *c);
int wf__cuda_att_preload(struct wf_diag *diag);

int wf__cuda_kv_store(struct wf_backend_ctx *c, const float *k, const float *v, uint32_t n,
                      uint32_t row, const uint32_t *dst_row, void *kc, void *vc,
                      enum wf_backend_kv type, struct wf_diag *diag);
int wf__cuda_attention(struct wf_backend_ctx *c, const float *q, size_t q_stride, uint32_t n,
                       uint32_t n_head, uint32_t n_head_kv, uint32_t head_dim, const void *kc,
                       const void *vc, enum wf_backend_kv type, const uint32_t *kv_first,
                       const uint32_t *n_kv, float scale, float *out, struct wf_diag *diag);

/* The ranges a call splits windows into at most (>= 1): enough blocks for the GPU (sm_count),
 * no range shorter than WF_CUDA_ATT_SPLIT_MIN at max_kv, within the states. */
uint32_t wf__cuda_att_splits(uint32_t n, uint32_t n_head, uint32_t n_head_kv, uint32_t max_kv,
                             int sm_count);

/* wf__cuda_attention on host memory (kc and vc: the layer's cache bytes) with at most `splits`
 * ranges per window: each block's steps in the kernel's order (the score of a position by one
 * lane over the whole head, the F16 steps position by position), then the merge. 0 or WF_EINVAL
 * (the op's limits). */
int wf__cuda_attention_host(const float *q, size_t q_stride, uint32_t n, uint32_t n_head,
                            uint32_t n_head_kv, uint32_t head_dim, const void *kc, const void *vc,
                            enum wf_backend_kv type, const uint32_t *kv_first, const uint32_t *n_kv,
                            float scale, uint32_t splits, float *out);

#ifdef __cplusplus
}
#endif
#endif
