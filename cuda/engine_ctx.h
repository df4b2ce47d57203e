/* The CUDA engine ops' context (engine/devops.h, struct wf_engine_dev_ops), shared by the files
 * of cuda/ that implement them: engine_ops.c (the table, create and destroy), matmul.cu (matmul
 * and get_rows, with cuBLAS for prompts), norm_rope.cu (rms_norm, rope), attention.cu (kv_store,
 * attention) and moe.cu (route, gather, swiglu, add, moe_sum). Every op function here has the
 * devops.h signature and queues its kernels on ctx->stream. Included from C and CUDA. */
#ifndef WF_CUDA_ENGINE_CTX_H
#define WF_CUDA_ENGINE_CTX_H

#include "engine/devops.h"

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

struct wf__cuda_mm; /* matmul.cu's workspace: cuBLAS handle, F16 buffers */

struct wf__cuda_engine_ctx {
	struct wf_device *dev;
	struct wf_device_stream *wstream; /* the engine's compute stream */
	cudaStream_t stream;              /* its native handle */
	int device;                       /* CUDA ordinal (current on the creating thread) */
	int sm_count;
	struct wf_engine_dev_limits lim;
	struct wf__cuda_mm *mm;
};

/* Translates a failed CUDA call (device_cuda.c's rules: -ENOMEM, -ENODEV, WF_EDEVICE ...),
 * clears the last-error slot and writes "what: name (text)" to diag. */
int wf__cuda_fail(cudaError_t e, struct wf_diag *diag, const char *what);

/* 0 when the last launch on this thread succeeded, else wf__cuda_fail(..., what). */
static inline int wf__cuda_launched(struct wf_diag *diag, const char *what)
{
	cudaError_t e = cudaGetLastError();
	return e == cudaSuccess ? 0 : wf__cuda_fail(e, diag, what);
}

/* matmul.cu */
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

/* norm_rope.cu */
int wf__cuda_rms_norm(void *ctx, const float *x, const float *w, float *y, uint32_t rows,
                      uint32_t len, size_t stride, float eps, struct wf_diag *diag);
int wf__cuda_rope(void *ctx, float *x, size_t x_stride, uint32_t n, uint32_t n_heads,
                  uint32_t head_dim, uint32_t n_dims, const int32_t *pos, float base,
                  enum wf_engine_dev_rope kind, struct wf_diag *diag);

/* attention.cu */
int wf__cuda_kv_store(void *ctx, const float *k, const float *v, uint32_t n, uint32_t row,
                      const uint32_t *dst_row, void *kc, void *vc, enum wf_engine_dev_kv type,
                      struct wf_diag *diag);
int wf__cuda_attention(void *ctx, const float *q, size_t q_stride, uint32_t n, uint32_t n_head,
                       uint32_t n_head_kv, uint32_t head_dim, const void *kc, const void *vc,
                       enum wf_engine_dev_kv type, const uint32_t *kv_first,
                       const uint32_t *n_kv, float scale, float *out, struct wf_diag *diag);

/* moe.cu */
int wf__cuda_route(void *ctx, const float *logits, uint32_t n, uint32_t n_expert, uint32_t k,
                   int32_t *ids, float *weights, struct wf_diag *diag);
int wf__cuda_gather(void *ctx, const float *x, const uint32_t *idx, uint32_t n, uint32_t len,
                    float *y, struct wf_diag *diag);
int wf__cuda_swiglu(void *ctx, const float *g, const float *u, float *y, size_t count,
                    struct wf_diag *diag);
int wf__cuda_add(void *ctx, float *y, const float *x, size_t count, struct wf_diag *diag);
int wf__cuda_moe_sum(void *ctx, const float *down, const uint32_t *slot_of, const float *weights,
                     uint32_t n, uint32_t k, uint32_t len, float *y, struct wf_diag *diag);

#ifdef __cplusplus
}
#endif
#endif
