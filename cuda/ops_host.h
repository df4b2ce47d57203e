/* Host twins of the engine ops' device code (norm_rope.cu, attention.cu, moe.cu), for the unit
 * test (tests/cuda/test_cuda_ops_host.c): each runs on the CPU the same __host__ __device__
 * helpers the kernels call (angles, pair indices, online-softmax steps and their merge, top-k
 * order and renormalization) over the same partition of the work into threads and warps, so a
 * machine without a GPU still checks the kernels' index math and numerics against engine/ops.c. Not
 * for production use: they are slow and single-threaded. Included from C and CUDA. */
#ifndef WF_CUDA_OPS_HOST_H
#define WF_CUDA_OPS_HOST_H

#include "engine/devops.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The angle step of wf__cuda_rope: powf(base, -2 / n_dims) on the host, as engine/ops.c takes it,
 * so the device's repeated products are the CPU's bit for bit. */
float wf__cuda_rope_theta_scale(float base, uint32_t n_dims);
/* The interleaved cos and sin of each pair's angle (n_dims floats), as the rope kernel makes them
 * (host cosf and sinf in place of the device's sincosf). */
void wf__cuda_rope_angles_host(int32_t pos, uint32_t n_dims, float theta_scale, float *cs);
/* One head rotated as the rope kernel rotates it, from cs of wf__cuda_rope_angles_host. */
void wf__cuda_rope_head_host(float *x, uint32_t n_dims, const float *cs,
                             enum wf_engine_dev_rope kind);

/* wf__cuda_route on host memory, in the kernel's steps. 0 or WF_EINVAL (the op's limits). */
int wf__cuda_route_host(const float *logits, uint32_t n, uint32_t n_expert, uint32_t k,
                        int32_t *ids, float *weights);

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
