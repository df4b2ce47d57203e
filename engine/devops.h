/* The engine's compute on a device with its own memory: the ops a device's kernels implement so
 * that the forward pass runs there (dense weights and the KV cache in device memory, experts
 * resident, cached or post-fetched), registered as the device kind's kernel table
 * (device/device.h, struct wf_device_kernel_table, version WF_ENGINE_DEV_OPS_VERSION).
 *
 * Two implementations:
 *   cuda   cuda/engine_ops.c (libwfcuda): CUDA kernels and cuBLAS on the stream's cudaStream_t,
 *          registered for WF_DEVICE_KIND_CUDA by wf_cuda_engine_ops_register().
 *   host   engine/devops_host.c: the CPU kernels and ops.c numerics over the engine's thread
 *          pool on the host backend's "device memory" (host memory), so CI runs the device
 *          forward pass (engine/forward_dev.c) and every placement without a GPU. Its results
 *          are bit-identical to the CPU engine's (same kernels, same order). The host kind's
 *          registered table stays the CPU kernel table (kernels/kernels.h) that the CPU forward
 *          pass calls per weight row; the engine takes these ops for the host from
 *          wf__devops_host() instead.
 *
 * Every pointer an op takes is device memory unless its comment says otherwise, and every op
 * is queued in order on the context's stream: it reads what earlier work on that stream (and
 * copies on other streams the caller made it wait for) wrote, and returns without waiting (the
 * host implementation waits for the stream first and then computes in the caller's thread).
 * Ops return 0, or an error (base/error.h, the launch's error translated as device.h does, the
 * diag naming the op); after an error the stream's results are undefined and the engine fails
 * the decode. Ops are not thread-safe on one context.
 *
 * Numerics: float activations in and out. Weight matrices are GGUF tensors as they lie in the
 * floor (rows of ne0 elements in blocks of their type); a device implementation may dequantize
 * and compute in any precision whose results stay within the reference tolerance of the CPU
 * engine (tests/cuda: NMSE and max-abs against the CPU reference per op and per type). */
#ifndef WF_ENGINE_DEVOPS_H
#define WF_ENGINE_DEVOPS_H

#include "base/diag.h"
#include "model/dtype.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped whenever struct wf_engine_dev_ops changes layout. */
#define WF_ENGINE_DEV_OPS_VERSION 2u

struct wf_device;
struct wf_device_stream;

/* One weight matrix in device memory: ne1 rows of ne0 elements of type, row_size bytes apart. */
struct wf_engine_dev_matrix {
	const void *data;
	enum wf_dtype type;
	int64_t ne0, ne1;
	size_t row_size;
};

/* What a context must be ready for, so it can size its workspaces once at create. */
struct wf_engine_dev_limits {
	uint32_t n_threads;  /* host implementation: threads of its own pool (the caller's
	                        counted), when host_pool is NULL */
	void *host_pool;     /* host implementation: the engine's struct wf_pool to compute
	                        on; other implementations ignore it */
	uint32_t max_expert; /* the most experts route takes */
	uint32_t max_rows;   /* the most activation rows one op takes (tokens x experts used) */
	int64_t max_ne0, max_ne1; /* the widest and tallest weight matrix */
	uint32_t max_kv;          /* positions one attention may cover (the engine's n_ctx) */
	uint32_t head_dim;        /* attention's head size */
};

enum wf_engine_dev_kv { WF_ENGINE_DEV_KV_F16 = 0, WF_ENGINE_DEV_KV_F32 = 1 };
enum wf_engine_dev_rope { WF_ENGINE_DEV_ROPE_NORM = 0, WF_ENGINE_DEV_ROPE_NEOX = 2 };

struct wf_engine_dev_ops {
	const char *name; /* "cuda", "host" */

	/* A context: the stream its ops queue on (the engine's compute stream, which it keeps),
	 * and its workspaces (cuBLAS handle and dequantization buffers on CUDA; the thread pool
	 * and quantized activations on the host). */
	int (*ctx_create)(struct wf_device *dev, struct wf_device_stream *stream,
	                  const struct wf_engine_dev_limits *lim, void **ret_ctx,
	                  struct wf_diag *diag);
	/* Waits for the context's queued ops, then frees it. Accepts NULL. */
	void (*ctx_destroy)(void *ctx);

	/* Whether matmul and get_rows take weights of this type. */
	bool (*supports)(enum wf_dtype type);

	/* y[j * y_stride + i] = sum_k W[i][k] * x[j * x_stride + k] for i < w->ne1, j < n (strides
	 * in floats; x rows hold w->ne0 floats). One decode token (n small) is a mat-vec; a prompt
	 * may go through cuBLAS. n <= lim.max_rows. */
	int (*matmul)(void *ctx, const struct wf_engine_dev_matrix *w, const float *x,
	              size_t x_stride, uint32_t n, float *y, size_t y_stride, struct wf_diag *diag);
	/* The experts of one layer in one call (ggml's mul_mat_id): for each group g < n_groups,
	 * rows [first[g], first[g] + count[g]) of y = matrix index[g] of a stack times the same
	 * rows of x, where matrix i lies at w->data + i * stride (an expert stack, or the expert
	 * cache's equally spaced slots) and has w's type and shape. index, first and count are host
	 * arrays (the engine orders the rows on the host); strides of x and y in floats. */
	int (*matmul_experts)(void *ctx, const struct wf_engine_dev_matrix *w, size_t stride,
	                      uint32_t n_groups, const uint32_t *index, const uint32_t *first,
	                      const uint32_t *count, const float *x, size_t x_stride, float *y,
	                      size_t y_stride, struct wf_diag *diag);
	/* y[j][0..ne0) = row ids[j] of w, dequantized (the token embedding). ids: n int32. */
	int (*get_rows)(void *ctx, const struct wf_engine_dev_matrix *w, const int32_t *ids,
	                uint32_t n, float *y, struct wf_diag *diag);

	/* ggml_rms_norm of rows of len floats, multiplied by w (len floats; NULL: norm only):
	 * y[r * stride + i] for r < rows. y may alias x. */
	int (*rms_norm)(void *ctx, const float *x, const float *w, float *y, uint32_t rows,
	                uint32_t len, size_t stride, float eps, struct wf_diag *diag);
	/* ggml_rope_ext in place on n tokens of n_heads heads of head_dim floats (token t's heads
	 * at x + t * x_stride): the first n_dims of each head rotated by pos[t] (int32, n), theta
	 * base^(-2i/n_dims), NORM (adjacent pairs) or NEOX (halves). */
	int (*rope)(void *ctx, float *x, size_t x_stride, uint32_t n, uint32_t n_heads,
	            uint32_t head_dim, uint32_t n_dims, const int32_t *pos, float base,
	            enum wf_engine_dev_rope kind, struct wf_diag *diag);
	/* Writes n tokens' K and V rows (row floats each, rows row apart) into one layer's cache:
	 * row dst_row[t] (uint32, n) of kc and vc, converted to the cache type. */
	int (*kv_store)(void *ctx, const float *k, const float *v, uint32_t n, uint32_t row,
	                const uint32_t *dst_row, void *kc, void *vc, enum wf_engine_dev_kv type,
	                struct wf_diag *diag);
	/* Causal attention for n tokens: token t's n_head query heads (q + t * q_stride, head_dim
	 * floats each) over rows kv_first[t] .. kv_first[t] + n_kv[t] - 1 of one layer's cache
	 * (rows of n_head_kv * head_dim elements; query head h reads kv head h / (n_head /
	 * n_head_kv)), scaled by scale, softmax, weighted V into out (same layout as q). F16 cache:
	 * llama.cpp's flash-attention numerics within tolerance. kv_first, n_kv: uint32, n. */
	int (*attention)(void *ctx, const float *q, size_t q_stride, uint32_t n, uint32_t n_head,
	                 uint32_t n_head_kv, uint32_t head_dim, const void *kc, const void *vc,
	                 enum wf_engine_dev_kv type, const uint32_t *kv_first, const uint32_t *n_kv,
	                 float scale, float *out, struct wf_diag *diag);

	/* The MoE router for n tokens (engine_internal.h wf__route): softmax over n_expert logits,
	 * top k descending (ties to the lower id), weights renormalized by their sum clamped to
	 * >= 6.1035e-5. ids (int32) and weights: n * k, token-major. */
	int (*route)(void *ctx, const float *logits, uint32_t n, uint32_t n_expert, uint32_t k,
	             int32_t *ids, float *weights, struct wf_diag *diag);
	/* y[r * len + i] = x[idx[r] * len + i] for r < n (idx: uint32): gathers the rows routed to
	 * one expert. */
	int (*gather)(void *ctx, const float *x, const uint32_t *idx, uint32_t n, uint32_t len,
	              float *y, struct wf_diag *diag);
	/* y[i] = silu(g[i]) * u[i] for i < count. y may alias g. */
	int (*swiglu)(void *ctx, const float *g, const float *u, float *y, size_t count,
	              struct wf_diag *diag);
	/* y[i] += x[i] for i < count. */
	int (*add)(void *ctx, float *y, const float *x, size_t count, struct wf_diag *diag);
	/* The experts' weighted sum per token in selected order, as ggml adds them:
	 * y[t] = ((d[s0] * w0 + d[s1] * w1) + d[s2] * w2) + ..., with s_j = slot_of[t * k + j]
	 * (uint32: the row of down holding that expert's output for t, rows of len floats) and
	 * w_j = weights[t * k + j]. */
	int (*moe_sum)(void *ctx, const float *down, const uint32_t *slot_of, const float *weights,
	               uint32_t n, uint32_t k, uint32_t len, float *y, struct wf_diag *diag);
};

#ifdef __cplusplus
}
#endif
#endif
