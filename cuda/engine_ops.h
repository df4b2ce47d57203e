/* The engine's CUDA ops (engine/devops.h) as the kernel table of WF_DEVICE_KIND_CUDA. This
 * header includes no CUDA header, so any module may include it. An executable built with CUDA
 * registers the table once in main(), beside the backend:
 *     #ifdef WF_HAVE_CUDA
 *     wf_device_backend_register(wf_cuda_device_ops());
 *     wf_cuda_engine_ops_register();
 *     #endif */
#ifndef WF_CUDA_ENGINE_OPS_H
#define WF_CUDA_ENGINE_OPS_H

#include "engine/devops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The ops (static). */
const struct wf_engine_dev_ops *wf_cuda_engine_ops(void);
/* Registers them for WF_DEVICE_KIND_CUDA (version WF_ENGINE_DEV_OPS_VERSION); idempotent and
 * thread-safe, as wf_device_kernels_register. */
int wf_cuda_engine_ops_register(void);

#ifdef __cplusplus
}
#endif
#endif
