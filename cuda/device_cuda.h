/* cuda/ (libwfcuda) is the device interface's CUDA backend and the compute interface's CUDA
 * backend (cuda/backend.h), with the CUDA kernels. Built wherever the CUDA toolkit exists, with or
 * without a GPU, so it cannot rot.
 *
 * The device backend implements struct wf_device_ops (device/device.h) with the CUDA runtime:
 * memory, streams, events, host work in stream order (cudaLaunchHostFunc) and the native stream
 * for kernels (the cudaStream_t). libwfdevice does not know about cuda/; an executable built with
 * CUDA makes the backends available once, in main():
 *     #ifdef WF_HAVE_CUDA
 *     wf_device_backend_register(wf_cuda_device_ops());
 *     wf_cuda_backend_register();
 *     #endif
 * after which "cuda:N" and "auto" specs can open it. Only cuda/ includes CUDA headers: this
 * header does not, so any module may include it. */
#ifndef WF_CUDA_DEVICE_CUDA_H
#define WF_CUDA_DEVICE_CUDA_H

#include "device/device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The ops table ("cuda"). Static; thread-safe to call. */
const struct wf_device_ops *wf_cuda_device_ops(void);

/* Number of CUDA devices the runtime sees; 0 (not an error) when there is no driver, no device
 * or the driver is too old for this runtime. Initialises the CUDA driver in the calling
 * process: a process that forks afterwards (Criterion, posix_spawn is fine) must probe in a
 * child instead. Thread-safe. */
int wf_cuda_device_count(void);

#ifdef __cplusplus
}
#endif
#endif
