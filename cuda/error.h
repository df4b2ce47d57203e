/* CUDA runtime errors translated at cuda/'s edge, shared by the device backend (device_cuda.c) and
 * the compute backend (backend.c and the op families): cudaErrorMemoryAllocation is -ENOMEM, no
 * device or a too-old driver -ENODEV, a registration overlap WF_EOVERLAP, a pending event
 * -EAGAIN, everything else WF_EDEVICE (a sticky error keeps returning it). Private to cuda/:
 * included from C and CUDA, it includes the CUDA runtime's header. */
#ifndef WF_CUDA_ERROR_H
#define WF_CUDA_ERROR_H

#include "base/diag.h"

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Translates a failed CUDA call, clears the runtime's last-error slot (so a later unrelated launch
 * check does not report it again; sticky errors stay sticky regardless) and writes
 * "what: name (text)" to diag. */
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
