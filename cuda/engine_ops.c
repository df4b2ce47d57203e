/* The table of the engine's CUDA ops and their context (cuda/engine_ctx.h): the kernels live in
 * matmul.cu, norm_rope.cu, attention.cu and moe.cu; this file binds them to the engine's compute
 * stream and registers them for WF_DEVICE_KIND_CUDA. */
#include "cuda/engine_ops.h"

#include "base/error.h"
#include "cuda/attention.h"
#include "cuda/engine_ctx.h"
#include "cuda/matmul.h"
#include "cuda/moe.h"
#include "cuda/norm_rope.h"
#include "device/device.h"

#include <errno.h>
#include <stdlib.h>

static int ctx_create(struct wf_device *dev, struct wf_device_stream *stream,
                      const struct wf_engine_dev_limits *lim, void **ret_ctx, struct wf_diag *diag)
{
	if (wf_device_kind(dev) != WF_DEVICE_KIND_CUDA || wf_device_stream_device(stream) != dev)
		return wf_diag_set(diag, WF_EINVAL,
		                   "CUDA engine ops need a stream of a CUDA device");
	/* The kernels' own limits (attention.cu, moe.cu), refused here rather than at the first
	 * decode. */
	if (lim->head_dim > 256 || lim->max_expert > 4096)
		return wf_diag_set(
		    diag, WF_EUNSUPPORTED,
		    "the CUDA kernels take heads of up to 256 and up to 4096 experts "
		    "(this model: %u, %u)",
		    lim->head_dim, lim->max_expert);
	struct wf__cuda_engine_ctx *c = calloc(1, sizeof(*c));
	if (!c)
		return wf_diag_set(diag, -ENOMEM, "CUDA engine context");
	c->dev = dev;
	c->wstream = stream;
	c->stream = (cudaStream_t)wf_device_stream_native(stream);
	c->lim = *lim;
	cudaError_t e = cudaGetDevice(&c->device);
	if (e == cudaSuccess)
		e = cudaDeviceGetAttribute(&c->sm_count, cudaDevAttrMultiProcessorCount, c->device);
	int rc = e == cudaSuccess ? 0 : wf__cuda_fail(e, diag, "CUDA engine context");
	if (rc == 0)
		rc = wf__cuda_mm_create(c, diag);
	if (rc < 0) {
		free(c);
		return rc;
	}
	*ret_ctx = c;
	return 0;
}

static void ctx_destroy(void *ctx)
{
	struct wf__cuda_engine_ctx *c = ctx;
	if (!c)
		return;
	(void)wf_device_stream_synchronize(c->wstream, NULL);
	wf__cuda_mm_destroy(c->mm);
	free(c);
}

static const struct wf_engine_dev_ops cuda_ops = {
    .name = "cuda",
    .ctx_create = ctx_create,
    .ctx_destroy = ctx_destroy,
    .supports = wf__cuda_supports,
    .matmul = wf__cuda_matmul,
    .matmul_experts = wf__cuda_matmul_experts,
    .get_rows = wf__cuda_get_rows,
    .rms_norm = wf__cuda_rms_norm,
    .rope = wf__cuda_rope,
    .kv_store = wf__cuda_kv_store,
    .attention = wf__cuda_attention,
    .route = wf__cuda_route,
    .gather = wf__cuda_gather,
    .swiglu = wf__cuda_swiglu,
    .add = wf__cuda_add,
    .moe_sum = wf__cuda_moe_sum,
};

static const struct wf_device_kernel_table cuda_table = {
    .kind = WF_DEVICE_KIND_CUDA,
    .name = "cuda",
    .version = WF_ENGINE_DEV_OPS_VERSION,
    .ops = &cuda_ops,
};

const struct wf_engine_dev_ops *wf_cuda_engine_ops(void)
{
	return &cuda_ops;
}

int wf_cuda_engine_ops_register(void)
{
	return wf_device_kernels_register(&cuda_table);
}
