/* The norm and RoPE family of the CUDA engine ops (norm_rope.cu), and host twins of its device
 * helpers for the unit test without a GPU (tests/cuda/test_cuda_ops_host.c). Included from C and
 * CUDA. */
#ifndef WF_CUDA_NORM_ROPE_H
#define WF_CUDA_NORM_ROPE_H

#include "cuda/engine_ctx.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

int wf__cuda_rms_norm(void *ctx, const float *x, const float *w, float *y, uint32_t rows,
                      uint32_t len, size_t stride, float eps, struct wf_diag *diag);
int wf__cuda_rope(void *ctx, float *x, size_t x_stride, uint32_t n, uint32_t n_heads,
                  uint32_t head_dim, uint32_t n_dims, const int32_t *pos, float base,
                  enum wf_engine_dev_rope kind, struct wf_diag *diag);

/* The angle step of wf__cuda_rope: powf(base, -2 / n_dims) on the host, as engine/ops.c takes it,
 * so the device's repeated products are the CPU's bit for bit. */
float wf__cuda_rope_theta_scale(float base, uint32_t n_dims);
/* The interleaved cos and sin of each pair's angle (n_dims floats), as the rope kernel makes them
 * (host cosf and sinf in place of the device's sincosf). */
void wf__cuda_rope_angles_host(int32_t pos, uint32_t n_dims, float theta_scale, float *cs);
/* One head rotated as the rope kernel rotates it, from cs of wf__cuda_rope_angles_host. */
void wf__cuda_rope_head_host(float *x, uint32_t n_dims, const float *cs,
                             enum wf_engine_dev_rope kind);

#ifdef __cplusplus
}
#endif
#endif
