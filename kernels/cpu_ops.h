/* The CPU's non-matmul numerics: each one computes what the ggml CPU op named in its comment
 * computes (llama.cpp b10573, ggml/src/ggml-cpu/ops.cpp and vec.h), in the same order where the
 * order shows in the result. The host backend (backend_host.c) computes with them; the CUDA
 * kernels' host twins are checked against them (tests/cuda). Pure and thread-safe.
 *
 * softmax, swiglu, rope and the tiled attention are also the reference level's entries of the
 * CPU kernel table (kernels.h), through which the host backend runs them: the SIMD levels
 * compute the same floats faster (kernels/x86_impl.h), checked bit for bit (tests/kernels). */
#ifndef WF_KERNELS_CPU_OPS_H
#define WF_KERNELS_CPU_OPS_H

#include "kernels/backend.h"
#include "kernels/kernels.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ggml_rms_norm (sum of squares in double), then ggml_mul by w (NULL: the norm only). y may
 * alias x. */
void wf_cpu_rms_norm(const float *x, const float *w, float *y, uint32_t n, float eps);
/* ggml's rope cache for one position (ggml_rope_cache_init): cos and sin of each pair's angle,
 * interleaved, n_dims floats; the angle advances by repeated float multiplication as ggml's. */
void wf_cpu_rope_angles(uint32_t pos, uint32_t n_dims, float base, float *cs);
/* ggml_rope_ext for one head with those angles: n_dims rotated, the rest of the head untouched. */
void wf_cpu_rope(float *x, uint32_t n_dims, const float *cs, enum wf_backend_rope kind);
/* ggml_soft_max over n values, in place (the sum in double). */
void wf_cpu_softmax(float *x, uint32_t n);
/* The MoE router for one token (backend.h, route): probs_scratch holds n_expert floats. */
void wf_cpu_route(const float *logits, uint32_t n_expert, uint32_t k, float *probs_scratch,
                  int32_t *ret_ids, float *ret_weights);
/* Its second half: the top k of the probabilities (softmax already taken) and their weights. */
void wf_cpu_route_top(const float *probs, uint32_t n_expert, uint32_t k, int32_t *ret_ids,
                      float *ret_weights);
/* silu(g) * u, elementwise (ggml_swiglu_split). y may alias g. */
void wf_cpu_swiglu(const float *g, const float *u, float *y, uint32_t n);
/* Attention of one query head over n_kv cached positions (backend.h, attention), writing
 * head_dim floats to out. scratch: 2 * head_dim + n_kv floats. */
void wf_cpu_attend(const float *q, const uint8_t *k, const uint8_t *v, size_t kv_stride,
                   uint32_t n_kv, uint32_t head_dim, float scale, enum wf_backend_kv type,
                   float *scratch, float *out);
/* Query rows of one batch from which llama.cpp's CPU flash attention takes its tiled path
 * (GGML_FA_TILE_Q), and the positions of one of its KV tiles (GGML_FA_TILE_KV). */
#define WF_CPU_FA_TILE WF_KERNELS_FA_TILE
/* Attention of one query head over n_kv positions of an F16 cache as ggml's
 * ggml_compute_forward_flash_attn_ext_tiled computes it for batches of WF_CPU_FA_TILE rows or
 * more: the query kept in F32, positions in tiles of WF_CPU_FA_TILE from the first, scores by
 * fused multiply-add chains, the softmax per tile with ggml_v_expf (AVX2), an F32 accumulator.
 * Bit-identical on every build. scratch: head_dim floats. */
void wf_cpu_attend_tiled(const float *q, const uint8_t *k, const uint8_t *v, size_t kv_stride,
                         uint32_t n_kv, uint32_t head_dim, float scale, float *scratch, float *out);
/* The reference level's table entries (kernels.h) whose shape differs from the functions above:
 * wf_cpu_rope with NEOX as a flag, and wf_cpu_attend_tiled for n_q rows (scratch: head_dim
 * floats). The levels' own entries compute the same floats, bit for bit. */
void wf__cpu_rope_ref(float *x, uint32_t n_dims, const float *cs, bool neox);
void wf__cpu_attend_tiled_ref(uint32_t n_q, const float *q, size_t q_stride, const uint32_t *n_kv,
                              const uint8_t *k, const uint8_t *v, size_t kv_stride,
                              uint32_t head_dim, float scale, float *scratch, float *out,
                              size_t out_stride);
/* The experts' weighted sum of n tokens (backend.h, moe_sum): d's rows token-major. */
void wf_cpu_moe_sum(const float *d, const float *weights, uint32_t n, uint32_t k, uint32_t len,
                    float *y);

#ifdef __cplusplus
}
#endif
#endif
