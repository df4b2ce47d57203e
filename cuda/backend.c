/* The CUDA backend's op table and context (cuda/backend.h): the kernels live in matmul.cu,
 * norm_rope.cu, attention.cu and moe.cu; this file makes the context (every byte of device
 * memory it will use, every kernel loaded, cuBLAS warmed up), binds the families' functions to
 * the table and registers it for WF_DEVICE_KIND_CUDA. */
#include "cuda/backend.h"

#include "base/error.h"
#include "cuda/attention.h"
#include "cuda/backend_ctx.h"
#include "cuda/matmul.h"
#include "cuda/moe.h"
#include "cuda/norm_rope.h"
#include "device/device.h"

#include <errno.h>
#include <stdlib.h>

int wf__cuda_ctx_alloc(struct wf_backend_ctx *c, size_t size, void **ret_ptr, struct wf_diag *diag)
{
	int rc = wf_device_mem_alloc(c->dev, size ? size : 1, ret_ptr, diag);
	if (rc == 0)
		c->own_bytes += size;
	return rc;
}

void wf__cuda_ctx_free(struct wf_backend_ctx *c, void *ptr)
{
	if (ptr)
		(void)wf_device_mem_free(c->dev, ptr, NULL);
}

unsigned wf__cuda_grid(const struct wf_backend_ctx *c, uint64_t total, unsigned threads)
{
	uint64_t blocks = (total + threads - 1) / threads;
	const uint64_t cap = (uint64_t)(c->sm_count > 0 ? c->sm_count : 32) * 32;

	if (blocks > cap)
		blocks = cap;
	return blocks > 0 ? (unsigned)blocks : 1u;
}

static void cuda_ctx_destroy(struct wf_backend_ctx *c)
{
	if (!c)
		return;
	if (c->wstream)
		(void)wf_device_stream_synchronize(c->wstream, NULL);
	if (cudaSetDevice(c->device) != cudaSuccess)
		(void)cudaGetLastError();
	wf__cuda_mm_destroy(c);
	wf__cuda_att_destroy(c);
	free(c);
}

static int free_bytes(size_t *ret, struct wf_diag *diag)
{
	size_t total;
	cudaError_t e = cudaMemGetInfo(ret, &total);
	return e == cudaSuccess ? 0 : wf__cuda_fail(e, diag, "cudaMemGetInfo");
}

static int cuda_ctx_create(struct wf_device *dev, struct wf_device_stream *stream,
                           const struct wf_backend_limits *lim, struct wf_backend_ctx **ret_ctx,
                           struct wf_diag *diag)
{
	if (!dev || !stream || wf_device_kind(dev) != WF_DEVICE_KIND_CUDA ||
	    wf_device_stream_device(stream) != dev || !lim)
		return wf_diag_set(diag, WF_EINVAL,
		                   "the CUDA backend takes a stream of a CUDA device");
	/* The kernels' own limits, refused here rather than at the first step. */
	if ((lim->head_dim && (lim->head_dim > WF_CUDA_ATT_MAX_DIM || lim->head_dim % 8)) ||
	    lim->max_expert > WF_CUDA_ROUTE_MAX_EXPERT)
		return wf_diag_set(
		    diag, WF_EUNSUPPORTED,
		    "the CUDA kernels take heads of a multiple of 8 up to %u and up to "
		    "%u experts (this model: %u, %u)",
		    WF_CUDA_ATT_MAX_DIM, WF_CUDA_ROUTE_MAX_EXPERT, lim->head_dim, lim->max_expert);
	if (!lim->max_rows || lim->max_ne0 <= 0)
		return wf_diag_set(diag, WF_EINVAL, "CUDA backend limits without rows or widths");
	struct wf_backend_ctx *c = calloc(1, sizeof(*c));
	if (!c)
		return wf_diag_set(diag, -ENOMEM, "CUDA backend context");
	c->dev = dev;
	c->wstream = stream;
	c->stream = (cudaStream_t)wf_device_stream_native(stream);
	c->lim = *lim;
	size_t before = 0, after = 0;
	int rc = 0;
	cudaError_t e = cudaStreamGetDevice(c->stream, &c->device);
	if (e == cudaSuccess)
		e = cudaSetDevice(c->device);
	if (e == cudaSuccess)
		e = cudaDeviceGetAttribute(&c->sm_count, cudaDevAttrMultiProcessorCount, c->device);
	if (e != cudaSuccess) {
		rc = wf__cuda_fail(e, diag, "CUDA backend context");
		goto fail;
	}
	/* What the device had before anything of this context: modules loaded now (the first
	 * context of a process loads the backend's kernels), the cuBLAS handle's own memory, the
	 * workspaces, all count. */
	if ((rc = free_bytes(&before, diag)) < 0)
		goto fail;
	/* Lazy module loading (CUDA_MODULE_LOADING=LAZY, the default since CUDA 12.2) would load
	 * a kernel, and allocate device memory for it, at its first launch: a device filled to
	 * its budget after create could then fail a step. cudaFuncGetAttributes loads each one
	 * now. */
	if ((rc = wf__cuda_mm_preload(diag)) < 0 || (rc = wf__cuda_norm_rope_preload(diag)) < 0 ||
	    (rc = wf__cuda_att_preload(diag)) < 0 || (rc = wf__cuda_moe_preload(diag)) < 0)
		goto fail;
	if ((rc = wf__cuda_mm_create(c, diag)) < 0 || (rc = wf__cuda_att_create(c, diag)) < 0 ||
	    (rc = wf__cuda_mm_warmup(c, diag)) < 0 ||
	    (rc = wf_device_stream_synchronize(stream, diag)) < 0 ||
	    (rc = free_bytes(&after, diag)) < 0)
		goto fail;
	/* cudaMemGetInfo is device-wide: another thread's allocation meanwhile makes the figure
	 * larger (a conservative reservation), a free smaller; never report less than our own
	 * allocations. */
	c->device_bytes =
	    before > after && before - after > c->own_bytes ? before - after : c->own_bytes;
	*ret_ctx = c;
	return 0;
fail:
	cuda_ctx_destroy(c);
	return rc;
}

static uint64_t cuda_ctx_device_bytes(const struct wf_backend_ctx *c)
{
	return c ? c->device_bytes : 0;
}

/* Every op selects the context's device first: the runtime keeps the current device per host
 * thread, and a launch on another device's stream fails. cudaSetDevice is a thread-local check
 * once set. */
static int use(struct wf_backend_ctx *c, struct wf_diag *diag)
{
	cudaError_t e = cudaSetDevice(c->device);
	return e == cudaSuccess ? 0 : wf__cuda_fail(e, diag, "cudaSetDevice");
}

static int op_matmul(struct wf_backend_ctx *c, uint32_t n_products,
                     const struct wf_backend_product *p, const float *x, size_t x_stride,
                     uint32_t n, struct wf_diag *diag)
{
	int rc = use(c, diag);
	return rc < 0 ? rc : wf__cuda_matmul(c, n_products, p, x, x_stride, n, diag);
}

static int op_mul_mat_id(struct wf_backend_ctx *c, uint32_t n_products,
                         const struct wf_backend_product *p, const int32_t *ids, uint32_t n,
                         uint32_t k, const float *x, size_t x_stride, bool x_per_slot,
                         struct wf_diag *diag)
{
	int rc = use(c, diag);
	return rc < 0 ? rc
	              : wf__cuda_mul_mat_id(c, n_products, p, ids, n, k, x, x_stride, x_per_slot,
	                                    diag);
}

static int op_get_rows(struct wf_backend_ctx *c, const struct wf_backend_matrix *w,
                       const int32_t *ids, uint32_t n, float *y, struct wf_diag *diag)
{
	int rc = use(c, diag);
	return rc < 0 ? rc : wf__cuda_get_rows(c, w, ids, n, y, diag);
}

static int op_copy_rows(struct wf_backend_ctx *c, const float *src, size_t src_stride,
                        const uint32_t *src_idx, uint32_t n, uint32_t len, float *dst,
                        size_t dst_stride, const uint32_t *dst_idx, struct wf_diag *diag)
{
	int rc = use(c, diag);
	return rc < 0 ? rc
	              : wf__cuda_copy_rows(c, src, src_stride, src_idx, n, len, dst, dst_stride,
	                                   dst_idx, diag);
}

static int op_rms_norm(struct wf_backend_ctx *c, const float *x, const float *w, float *y,
                       uint32_t rows, uint32_t len, size_t stride, float eps, struct wf_diag *diag)
{
	int rc = use(c, diag);
	return rc < 0 ? rc : wf__cuda_rms_norm(c, x, w, y, rows, len, stride, eps, diag);
}

static int op_rope(struct wf_backend_ctx *c, float *x, size_t x_stride, uint32_t n,
                   uint32_t n_heads, uint32_t head_dim, uint32_t n_dims, const int32_t *pos,
                   float base, enum wf_backend_rope kind, struct wf_diag *diag)
{
	int rc = use(c, diag);
	return rc < 0 ? rc
	              : wf__cuda_rope(c, x, x_stride, n, n_heads, head_dim, n_dims, pos, base, kind,
	                              diag);
}

static int op_kv_store(struct wf_backend_ctx *c, const float *k, const float *v, uint32_t n,
                       uint32_t row, const uint32_t *dst_row, void *kc, void *vc,
                       enum wf_backend_kv type, struct wf_diag *diag)
{
	int rc = use(c, diag);
	return rc < 0 ? rc : wf__cuda_kv_store(c, k, v, n, row, dst_row, kc, vc, type, diag);
}

static int op_attention(struct wf_backend_ctx *c, const float *q, size_t q_stride, uint32_t n,
                        uint32_t n_head, uint32_t n_head_kv, uint32_t head_dim, const void *kc,
                        const void *vc, enum wf_backend_kv type, const uint32_t *kv_first,
                        const uint32_t *n_kv, float scale, float *out, struct wf_diag *diag)
{
	int rc = use(c, diag);
	return rc < 0 ? rc
	              : wf__cuda_attention(c, q, q_stride, n, n_head, n_head_kv, head_dim, kc, vc,
	                                   type, kv_first, n_kv, scale, out, diag);
}

static int op_route(struct wf_backend_ctx *c, const float *logits, uint32_t n, uint32_t n_expert,
                    uint32_t k, int32_t *ids, float *weights, struct wf_diag *diag)
{
	int rc = use(c, diag);
	if (rc == 0 && n_expert > c->lim.max_expert)
		rc = wf_diag_set(diag, WF_EINVAL, "route: %u experts (the context: at most %u)",
		                 n_expert, c->lim.max_expert);
	return rc < 0 ? rc : wf__cuda_route(c, logits, n, n_expert, k, ids, weights, diag);
}

static int op_swiglu(struct wf_backend_ctx *c, const float *g, const float *u, float *y,
                     size_t count, struct wf_diag *diag)
{
	int rc = use(c, diag);
	return rc < 0 ? rc : wf__cuda_swiglu(c, g, u, y, count, diag);
}

static int op_add(struct wf_backend_ctx *c, float *y, const float *x, size_t count,
                  struct wf_diag *diag)
{
	int rc = use(c, diag);
	return rc < 0 ? rc : wf__cuda_add(c, y, x, count, diag);
}

static int op_moe_sum(struct wf_backend_ctx *c, const float *d, const float *weights, uint32_t n,
                      uint32_t k, uint32_t len, float *y, struct wf_diag *diag)
{
	int rc = use(c, diag);
	return rc < 0 ? rc : wf__cuda_moe_sum(c, d, weights, n, k, len, y, diag);
}

/* Where this backend rounds or refuses differently from the host backend (kernels/backend.h asks
 * each table to say so on the op). Since 2e3fd4a the host computes prompt batches as llama.cpp's
 * AVX2 CPU build does; rope and the Q8_0 activation quantizer here follow it again (7c629ca),
 * the attention of >= 64 rows, route's softmax and swiglu do not (each op says how): */
static const struct wf_backend_ops cuda_ops = {
    .name = "cuda",
    .version = WF_BACKEND_OPS_VERSION,
    .host_memory = false,
    /* heads must be a multiple of 8 up to 256, experts at most 4096: WF_EUNSUPPORTED */
    .ctx_create = cuda_ctx_create,
    .ctx_destroy = cuda_ctx_destroy,
    .ctx_device_bytes = cuda_ctx_device_bytes,
    .supports = wf__cuda_supports,
    /* matmul.h: the mat-vec path (n <= 32) computes the CPU's integer block sums in another
     * float order; the prompt path (n > 32) takes quantized weights through F16 cuBLAS (NMSE
     * ~1.5e-5 against the CPU's int8 activations). F16 activations reaching 2^15 are scaled by a
     * power of two (the host's F16 rounding overflows to inf there). Weight matrices must be
     * 4-byte (F32, Q4_K, Q5_K) or 2-byte aligned: WF_EINVAL. */
    .matmul = op_matmul,
    /* as matmul; an id past the stack writes NaN rows on the decode path (the host: WF_EINVAL,
     * which the prompt path returns too) */
    .mul_mat_id = op_mul_mat_id,
    /* an id outside [0, ne1): a zero row */
    .get_rows = op_get_rows,
    .copy_rows = op_copy_rows,
    .rms_norm = op_rms_norm,
    .rope = op_rope,
    .kv_store = op_kv_store,
    /* attention.h: windows of 256 positions or more are split across blocks and merged in
     * float, which rounds the F16 accumulator differently (as far from the CPU as the CPU's own
     * F16 accumulation is from exact arithmetic). For batches of >= 64 rows (an F16 cache) the
     * host takes llama.cpp's tiled path (F32 query and accumulator, 64-position tiles, the
     * softmax per tile with ggml_v_expf); this backend keeps the F16 steps for every batch */
    .attention = op_attention,
    /* the softmax with the device's expf; the host's (and llama.cpp's AVX2 build's) takes
     * ggml_v_expf eight at a time and sums each eight in its own order: probabilities differ in
     * the last bits, so near-equal experts may rank differently */
    .route = op_route,
    /* silu with the device's expf; the host's with ggml_v_expf (eight at a time, the tail with
     * expf): differs in the last bits */
    .swiglu = op_swiglu,
    .add = op_add,
    .moe_sum = op_moe_sum,
};

const struct wf_backend_ops *wf_cuda_backend(void)
{
	return &cuda_ops;
}

int wf_cuda_backend_register(void)
{
	return wf_backend_register(WF_DEVICE_KIND_CUDA, &cuda_ops);
}
