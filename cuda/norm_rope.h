/* The norm and RoPE family of the CUDA backend (norm_rope.cu), and host twins of its device
 * helpers for the unit tests without a GPU (tests/cuda/test_cuda_ops_host.c). No CUDA header.
 *
 * rms_norm: the CPU's steps (kernels/cpu_ops.c): the sum of the float squares in double, the
 * mean rounded to float, 1 / sqrtf(mean + eps), then (x * scale) * w, each product rounded. Only
 * the order of the double additions differs, so results are the CPU's but for a rare last-ulp
 * rounding of the mean. rope: the angles by the CPU's repeated float products from the same
 * powf step (made on the host), so only sincosf's last ulp can differ from cosf and sinf. */
#ifndef WF_CUDA_NORM_ROPE_H
#define WF_CUDA_NORM_ROPE_H

#include "kernels/backend.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Loads the family's kernels (cudaFuncGetAttributes), so no launch loads a module later. */
int wf__cuda_norm_rope_preload(struct wf_diag *diag);

int wf__cuda_rms_norm(struct wf_backend_ctx *c, const float *x, const float *w, float *y,
                      uint32_t rows, uint32_t len, size_t stride, float eps, struct wf_diag *diag);
int wf__cuda_rope(struct wf_backend_ctx *c, float *x, size_t x_stride, uint32_t n, uint32_t n_heads,
                  uint32_t head_dim, uint32_t n_dims, const int32_t *pos, float base,
                  enum wf_backend_rope kind, struct wf_diag *diag);

/* The angle step of wf__cuda_rope: powf(base, -2 / n_dims) on the host, as kernels/cpu_ops.c
 * takes it, so the device's repeated products are the CPU's bit for bit. */
float wf__cuda_rope_theta_scale(float base, uint32_t n_dims);
/* The interleaved cos and sin of each pair's angle (n_dims floats), as the rope kernel makes them
 * (host cosf and sinf in place of the device's sincosf). */
void wf__cuda_rope_angles_host(int32_t pos, uint32_t n_dims, float theta_scale, float *cs);
/* One head rotated as the rope kernel rotates it, from cs of wf__cuda_rope_angles_host. */
void wf__cuda_rope_head_host(float *x, uint32_t n_dims, const float *cs, enum wf_backend_rope kind);
/* One row normalized as the rms_norm kernel does, its 256 threads' double sums added in the
 * kernel's order. */
void wf__cuda_rms_norm_host(const float *x, const float *w, float *y, uint32_t len, float eps);

#ifdef __cplusplus
}
#endif
#endif
