/* The CUDA backend's context (struct wf_backend_ctx of kernels/backend.h), shared by the op
 * families of cuda/, one source pair each: matmul (matmul, mul_mat_id, get_rows: mat-vec kernels
 * and cuBLAS), norm_rope (rms_norm, rope), attention (kv_store, attention) and moe (route,
 * copy_rows, swiglu, add, moe_sum); backend.c makes the context and binds the table. Private to
 * cuda/: included from C and CUDA, it includes the CUDA runtime's header.
 *
 * Memory: a family that needs device memory allocates it in its _create with wf__cuda_ctx_alloc,
 * which counts it; ctx_create calls every family's _create, so nothing is allocated later. */
#ifndef WF_CUDA_BACKEND_CTX_H
#define WF_CUDA_BACKEND_CTX_H

#include "cuda/error.h"
#include "kernels/backend.h"

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct wf__cuda_mm;  /* matmul.cu: cuBLAS handle and the matmul workspaces */
struct wf__cuda_att; /* attention.cu: the split window's partial states */

struct wf_backend_ctx {
	struct wf_device *dev;
	struct wf_device_stream *wstream; /* the caller's stream (kept by the caller) */
	cudaStream_t stream;              /* its native handle */
	int device;                       /* CUDA ordinal (current on the creating thread) */
	int sm_count;
	struct wf_backend_limits lim;
	uint64_t own_bytes;    /* the sum of wf__cuda_ctx_alloc's sizes */
	uint64_t device_bytes; /* what ctx_device_bytes reports (backend.c) */
	struct wf__cuda_mm *mm;
	struct wf__cuda_att *att;
};

/* Device memory for the context's life, counted in own_bytes. 0 or the device's error. */
int wf__cuda_ctx_alloc(struct wf_backend_ctx *c, size_t size, void **ret_ptr, struct wf_diag *diag);
/* Frees what wf__cuda_ctx_alloc gave (NULL: nothing). */
void wf__cuda_ctx_free(struct wf_backend_ctx *c, void *ptr);

/* Blocks for a grid-stride kernel over total items with threads per block: enough to fill the
 * GPU a few times over (32 per SM), at least one. */
unsigned wf__cuda_grid(const struct wf_backend_ctx *c, uint64_t total, unsigned threads);

#ifdef __cplusplus
}
#endif
#endif
