/* The CUDA engine ops' context (engine/devops.h, struct wf_engine_dev_ops), shared by the op
 * families of cuda/, one source pair each: matmul (matmul, matmul_experts and get_rows, cuBLAS
 * for prompts), norm_rope (rms_norm, rope), attention (kv_store, attention) and moe (route,
 * gather, swiglu, add, moe_sum); engine_ops.c binds them into the table. Every op function has
 * the devops.h signature and queues its kernels on ctx->stream. Included from C and CUDA. */
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

#ifdef __cplusplus
}
#endif
#endif
