/* The compute interface of a device kind: the ops a kind's kernels implement so that the engine's
 * one executor runs every architecture's graph on it. One table type for every kind, below both
 * its implementations and its user, as ggml's ggml-backend-impl.h is (the CPU is a backend too):
 *
 *   host   kernels/backend_host.c: the CPU kernels (kernels/kernels.h), the CPU numerics
 *          (kernels/cpu_ops.h) and products (kernels/cpu_matmul.h) over a thread pool. Always
 *          registered for WF_DEVICE_KIND_HOST. It computes on host memory, so it reads weights
 *          where they lie: the floor's pages in place, a file mapping, or the host device's
 *          "device memory" (which is host memory too).
 *   cuda   cuda/backend.c (libwfcuda): CUDA kernels and cuBLAS on the stream's cudaStream_t,
 *          registered for WF_DEVICE_KIND_CUDA by wf_cuda_backend_register() in main().
 *
 * Memory. Every pointer an op takes is memory the context computes on: device memory of its
 * device; for a backend whose `host_memory` is true, any host memory (floor pages, heap, the
 * host device's allocations). Index arrays (ids, rows, positions) are in that memory too, never
 * "host arrays" on a device backend, so that a decode step needs no host wait and can be
 * captured (a CUDA graph). Weight matrices are GGUF tensors as they lie in the floor: rows of ne0
 * elements in blocks of their type, row_size bytes apart.
 *
 * Order and waiting. A context is made for one stream (or none). Its ops are queued in order on
 * that stream: each reads what earlier work on the stream (and copies on other streams the caller
 * made it wait for, wf_device_stream_wait_event) wrote, and returns without waiting for its own
 * result (CUDA). The host backend computes in the caller's thread: with a stream it first waits
 * for the stream (copies into its inputs may still be running on the host device's copy
 * thread); without one (the CPU engine: no device) it computes at once.
 *
 * Errors. Ops return 0 or an error (base/error.h; a CUDA failure translated as device.h does:
 * -ENOMEM, WF_EDEVICE for a sticky device error ...), with diag naming the op. After an error the
 * stream's results are undefined and the caller fails the step. Contexts are not thread-safe;
 * the op table is (it is a static).
 *
 * Numerics. Float activations in and out. The host backend computes what ggml's CPU ops compute
 * (llama.cpp b10573), bit for bit the engine's reference. Another backend may compute in any
 * precision whose results stay within the reference criteria (tests/data/reference/README.md):
 * its per-op tolerances are stated and checked per op and per weight type against the host
 * backend (tests/cuda). Where a backend must round differently, its table says so in a comment
 * on the op.
 *
 * Adding an op: add the member at the end, bump WF_BACKEND_OPS_VERSION, implement it in every
 * backend (a backend may leave an op NULL only where its comment allows), and add its case to
 * the per-op tests of every backend. */
#ifndef WF_KERNELS_BACKEND_H
#define WF_KERNELS_BACKEND_H

#include "base/diag.h"
#include "device/device.h"
#include "model/dtype.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped whenever struct wf_backend_ops changes layout or an op's contract changes. */
#define WF_BACKEND_OPS_VERSION 3u

/* The most products one matmul or mul_mat_id call takes (Q, K and V share their input). */
#define WF_BACKEND_MAX_PRODUCTS 3u

struct wf_pool;
/* A backend's context: its stream, workspaces (cuBLAS handle and buffers on CUDA; quantized
 * activations and per-thread scratch on the host). Each backend defines it. */
struct wf_backend_ctx;

/* One weight matrix, or a stack of equally spaced ones (the experts of a layer, the expert
 * cache's slots): matrix i at data + i * stride, each ne1 rows of ne0 elements of type, rows
 * row_size bytes apart. stride 0 for a single matrix. */
struct wf_backend_matrix {
	const void *data;
	enum wf_dtype type;
	int64_t ne0, ne1;
	size_t row_size;
	size_t stride;
};

/* A matrix and where its results go: row r of the product at y + r * y_stride (floats). */
struct wf_backend_product {
	const struct wf_backend_matrix *w;
	float *y;
	size_t y_stride; /* >= w->ne1 */
};

/* What a context must be ready for, so that it sizes its workspaces once, at create. */
struct wf_backend_limits {
	/* Host backend: the pool to compute on (borrowed, shared with the caller's other host
	 * contexts, which must not run ops concurrently); NULL: the context makes its own of
	 * n_threads threads (0: 1). Other backends ignore both. */
	struct wf_pool *pool;
	uint32_t n_threads;
	uint32_t max_rows;        /* activation rows of one op: tokens, or tokens x experts used */
	uint32_t max_expert;      /* the most experts route takes */
	uint32_t max_stack;       /* the most matrices of a mul_mat_id stack (experts, slots) */
	int64_t max_ne0, max_ne1; /* the widest and tallest weight matrix */
	uint32_t max_kv;          /* positions one attention covers (the engine's n_ctx) */
	uint32_t head_dim;
};

enum wf_backend_kv { WF_BACKEND_KV_F16 = 0, WF_BACKEND_KV_F32 = 1, WF_BACKEND_KV_MAX };
/* ggml's rope modes: NORM rotates adjacent pairs, NEOX the two halves of the rotated part. */
enum wf_backend_rope { WF_BACKEND_ROPE_NORM = 0, WF_BACKEND_ROPE_NEOX = 2 };

struct wf_backend_ops {
	const char *name; /* "host", "cuda" */
	uint32_t version; /* WF_BACKEND_OPS_VERSION of the build that made the table */
	bool host_memory; /* computes on host memory: reads floor tensors in place */

	/* A context for dev (NULL only for the host backend: the CPU engine without a device)
	 * whose ops queue on stream (a stream of dev, kept by the caller for the context's life;
	 * NULL with dev NULL). Errors: WF_EINVAL (a stream of another device or kind),
	 * WF_EUNSUPPORTED (limits this backend cannot meet, diag says which), -ENOMEM. */
	int (*ctx_create)(struct wf_device *dev, struct wf_device_stream *stream,
	                  const struct wf_backend_limits *lim, struct wf_backend_ctx **ret_ctx,
	                  struct wf_diag *diag);
	/* Waits for the context's queued work, then frees it. Accepts NULL. */
	void (*ctx_destroy)(struct wf_backend_ctx *ctx);
	/* Device memory the context holds for its life (workspaces, library handles' buffers),
	 * all of it allocated at create: no op allocates device memory later, so a context that
	 * was made never fails a step for want of memory. 0 for the host backend. */
	uint64_t (*ctx_device_bytes)(const struct wf_backend_ctx *ctx);

	/* Whether matmul, mul_mat_id and get_rows take weights of this type. */
	bool (*supports)(enum wf_dtype type);

	/* For each product p < n_products (<= WF_BACKEND_MAX_PRODUCTS, every w with the same
	 * ne0): p.y[j * p.y_stride + i] = W[i] . x[j * x_stride] for i < w->ne1, j < n
	 * (n <= max_rows; x rows hold ne0 floats). One call for products that share their input
	 * (Q, K and V) lets the host backend quantize the input once and run them in one pool
	 * run. */
	int (*matmul)(struct wf_backend_ctx *ctx, uint32_t n_products,
	              const struct wf_backend_product *p, const float *x, size_t x_stride,
	              uint32_t n, struct wf_diag *diag);
	/* ggml's mul_mat_id: the routed experts of n tokens, k each, in one call per product (no
	 * host wait needed: ids are read where they lie). For t < n and j < k with
	 * e = ids[t * k + j] >= 0: p.y[(t * k + j) * p.y_stride + i] = W_e[i] . x_row, W_e the
	 * stack's matrix e, x_row = x[t * x_stride] (x_per_slot false: each token's row, shared by
	 * its k experts: gate and up) or x[(t * k + j) * x_stride] (true: one row per choice:
	 * down). ids < 0 leave that row of y untouched (the expert runs elsewhere). Every e >= 0
	 * must be a matrix of the stack (the caller's promise; an implementation need not check
	 * on the device). n * k <= max_rows. The host backend groups the rows by expert (expert
	 * order, token order within), so each selected matrix is read once per call. A device
	 * backend queues the product without a host wait when n * k <= 64 (a decode step); for
	 * larger batches (prompts) it may read ids back and wait, to group rows per expert. */
	int (*mul_mat_id)(struct wf_backend_ctx *ctx, uint32_t n_products,
	                  const struct wf_backend_product *p, const int32_t *ids, uint32_t n,
	                  uint32_t k, const float *x, size_t x_stride, bool x_per_slot,
	                  struct wf_diag *diag);
	/* y[j * w->ne0 + i] = row ids[j] of w, dequantized, for j < n (the token embedding). An id
	 * outside [0, ne1) is WF_EINVAL where the backend can see it (host), undefined on the
	 * device (the engine checks tokens before the step). */
	int (*get_rows)(struct wf_backend_ctx *ctx, const struct wf_backend_matrix *w,
	                const int32_t *ids, uint32_t n, float *y, struct wf_diag *diag);
	/* Float rows: dst[(dst_idx ? dst_idx[r] : r) * dst_stride + i] =
	 * src[(src_idx ? src_idx[r] : r) * src_stride + i] for r < n, i < len (ggml's get_rows on
	 * F32 with src_idx, set_rows with dst_idx). Rows of dst must not overlap rows of src still
	 * to be read. */
	int (*copy_rows)(struct wf_backend_ctx *ctx, const float *src, size_t src_stride,
	                 const uint32_t *src_idx, uint32_t n, uint32_t len, float *dst,
	                 size_t dst_stride, const uint32_t *dst_idx, struct wf_diag *diag);

	/* ggml_rms_norm of rows of len floats, then times w (len floats; NULL: the norm only):
	 * y[r * stride + i] for r < rows. y may alias x. */
	int (*rms_norm)(struct wf_backend_ctx *ctx, const float *x, const float *w, float *y,
	                uint32_t rows, uint32_t len, size_t stride, float eps,
	                struct wf_diag *diag);
	/* ggml_rope_ext in place on n tokens of n_heads heads of head_dim floats (token t's heads
	 * at x + t * x_stride): the first n_dims of each head rotated by pos[t] (int32, n) with
	 * theta base^(-2i/n_dims), angles by repeated float multiplication as ggml's rope cache. */
	int (*rope)(struct wf_backend_ctx *ctx, float *x, size_t x_stride, uint32_t n,
	            uint32_t n_heads, uint32_t head_dim, uint32_t n_dims, const int32_t *pos,
	            float base, enum wf_backend_rope kind, struct wf_diag *diag);
	/* Writes n tokens' K and V rows (row floats each, rows `row` floats apart) into one layer's
	 * cache: row dst_row[t] (uint32, n) of kc and vc, converted to the cache type. */
	int (*kv_store)(struct wf_backend_ctx *ctx, const float *k, const float *v, uint32_t n,
	                uint32_t row, const uint32_t *dst_row, void *kc, void *vc,
	                enum wf_backend_kv type, struct wf_diag *diag);
	/* Causal attention for n tokens: token t's n_head query heads (q + t * q_stride, head_dim
	 * floats each) over rows kv_first[t] .. kv_first[t] + n_kv[t] - 1 of one layer's cache
	 * (rows of n_head_kv * head_dim elements; query head h reads kv head
	 * h / (n_head / n_head_kv)), scores times scale, softmax, weighted V into out (q's layout).
	 * F16 cache: llama.cpp's CPU flash attention: the query rounded to F16, online softmax,
	 * the V accumulator rounded to F16 after every position. F32 cache: a plain softmax.
	 * kv_first and n_kv: uint32, n; 1 <= n_kv[t] <= max_kv. */
	int (*attention)(struct wf_backend_ctx *ctx, const float *q, size_t q_stride, uint32_t n,
	                 uint32_t n_head, uint32_t n_head_kv, uint32_t head_dim, const void *kc,
	                 const void *vc, enum wf_backend_kv type, const uint32_t *kv_first,
	                 const uint32_t *n_kv, float scale, float *out, struct wf_diag *diag);

	/* The MoE router of llama.cpp's build_moe_ffn with softmax gating and normalized weights,
	 * for n tokens: softmax over n_expert logits, top k descending (ties to the lower id), the
	 * selected probabilities divided by their sum clamped to >= 6.1035e-5. ids (int32) and
	 * weights: n * k, token-major. NaN logits: as the host backend ranks them (its
	 * probabilities compared with >), so every backend picks the same ids. */
	int (*route)(struct wf_backend_ctx *ctx, const float *logits, uint32_t n, uint32_t n_expert,
	             uint32_t k, int32_t *ids, float *weights, struct wf_diag *diag);
	/* y[i] = silu(g[i]) * u[i] for i < count (ggml_swiglu_split). y may alias g. */
	int (*swiglu)(struct wf_backend_ctx *ctx, const float *g, const float *u, float *y,
	              size_t count, struct wf_diag *diag);
	/* y[i] += x[i] for i < count. */
	int (*add)(struct wf_backend_ctx *ctx, float *y, const float *x, size_t count,
	           struct wf_diag *diag);
	/* The experts' weighted sum per token, in selected order as llama.cpp adds the views:
	 * y[t] = ((d[t*k] * w[t*k] + d[t*k+1] * w[t*k+1]) + d[t*k+2] * w[t*k+2]) + ..., d's rows
	 * token-major (mul_mat_id's output rows), len floats each. */
	int (*moe_sum)(struct wf_backend_ctx *ctx, const float *d, const float *weights, uint32_t n,
	               uint32_t k, uint32_t len, float *y, struct wf_diag *diag);
};

/* The host backend (static, always available). */
const struct wf_backend_ops *wf_backend_host(void);

/* Makes ops the backend of kind. The table must live for the rest of the process (a static).
 * The host kind has the host backend from the start. Registering the same table again is a
 * no-op (0); another table for a kind that has one is WF_EDUPLICATE; a kind out of range, a NULL
 * table or name, or a table of another WF_BACKEND_OPS_VERSION (a library built against another
 * header) is WF_EINVAL. Thread-safe. Why registration and not a link-time symbol: libwfkernels
 * must build and work without CUDA (device/device.h says the same of device backends). */
int wf_backend_register(enum wf_device_kind kind, const struct wf_backend_ops *ops);
/* The backend of kind, or NULL when none is registered (or kind is out of range). */
const struct wf_backend_ops *wf_backend_for_kind(enum wf_device_kind kind);
/* The backend of dev's kind; the host backend for a NULL dev (the CPU). NULL when dev's kind has
 * none registered. Thread-safe. */
const struct wf_backend_ops *wf_backend_for(const struct wf_device *dev);

#ifdef __cplusplus
}
#endif
#endif
