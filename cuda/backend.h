/* The CUDA backend of the compute interface (kernels/backend.h): the op table every device kind
 * implements, here with CUDA kernels and cuBLAS on the context's stream. The engine reaches it
 * through the registry (wf_backend_for(dev)); nothing in cuda/ knows the engine.
 *
 * This header includes no CUDA header, so any module may include it. An executable built with
 * CUDA registers the backend once in main(), beside the device backend:
 *     #ifdef WF_HAVE_CUDA
 *     wf_device_backend_register(wf_cuda_device_ops());
 *     wf_cuda_backend_register();
 *     #endif
 *
 * What the table promises beyond backend.h (each op's comment in cuda/<family>.h says more):
 *  - ctx_create allocates every byte of device memory the context will use (cuBLAS handle and
 *    its workspace, activation and weight workspaces, attention partials), loads every kernel of
 *    the backend (lazy module loading would otherwise allocate at a first launch) and runs
 *    cuBLAS once on each GEMM kind it uses; ctx_device_bytes reports what cudaMemGetInfo saw
 *    creation take (never less than the context's own allocations). No op allocates later.
 *  - Every op queues work on the stream and returns without waiting, except mul_mat_id with
 *    n * k > 64 (a prompt), which reads the expert ids back and waits for the stream.
 *  - Numerics: see cuda/matmul.h (the mat-vec path computes with the CPU's activation
 *    quantization and integer block sums; the prompt path with cuBLAS per type), attention.h (the
 *    CPU's F16 accumulator within each split of the window) and moe.h (route ranks as the CPU). */
#ifndef WF_CUDA_BACKEND_H
#define WF_CUDA_BACKEND_H

#include "kernels/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The table ("cuda", WF_BACKEND_OPS_VERSION). Static; thread-safe to call. */
const struct wf_backend_ops *wf_cuda_backend(void);

/* Registers it for WF_DEVICE_KIND_CUDA (wf_backend_register): 0, also when it already is;
 * WF_EDUPLICATE when another table holds the kind. Thread-safe. */
int wf_cuda_backend_register(void);

#ifdef __cplusplus
}
#endif
#endif
