/* Matrix products on the CPU over a thread pool: what the host backend (backend_host.c) multiplies
 * with.
 *
 * A product quantizes its activation rows once to the weight type's vec_dot_type (as ggml's
 * mul_mat does) and then takes row-by-row dots, each weight row against every activation row (the
 * kernels' gemm), so a weight row is read from memory once per call however many rows the batch
 * holds. Jobs are collected into a phase and run together, split into chunks of rows that the
 * pool's threads claim; the result of each dot does not depend on the chunking (kernels.h: gemm
 * is bit-identical to vec_dot), so neither does the product. */
#ifndef WF_KERNELS_CPU_MATMUL_H
#define WF_KERNELS_CPU_MATMUL_H

#include "kernels/backend.h"
#include "kernels/kernels.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What CPU products run with: the kernel level's table, the pool and its thread count. */
struct wf_cpu {
	const struct wf_kernel_ops *ops;
	struct wf_pool *pool;
	uint32_t n_threads;
};

/* One product: out[j * out_stride + i] = W[i] . act[j] for rows [0, ne1) of one matrix. */
struct wf_cpu_mm_job {
	const struct wf_kernel_type_ops *t;
	const uint8_t *w; /* the matrix's first row */
	size_t row_size;
	int64_t ne0, ne1;
	const uint8_t *act;
	size_t act_stride;
	uint32_t n_act;
	float *out;
	size_t out_stride;
};

#define WF_CPU_MM_MAX_JOBS (WF_BACKEND_MAX_PRODUCTS * 4096u + 8u)

struct wf_cpu_mm_phase {
	struct wf_cpu_mm_job jobs[WF_CPU_MM_MAX_JOBS];
	uint32_t n_jobs;
	uint32_t chunk_rows;
	uint32_t first_chunk[WF_CPU_MM_MAX_JOBS + 1];
};

/* Bytes of one row of n activations of type act. */
size_t wf_cpu_act_row_bytes(enum wf_dtype act, int64_t n);

/* Adds a product of the matrix whose first row is at w (ne1 rows of type t, row_size apart)
 * with n_act activation rows to the phase; n_act 0 adds nothing. The phase holds at most
 * WF_CPU_MM_MAX_JOBS jobs (the caller's bound). */
void wf_cpu_mm_add(struct wf_cpu_mm_phase *ph, const struct wf_kernel_type_ops *t, const void *w,
                   size_t row_size, int64_t ne0, int64_t ne1, const void *act, size_t act_stride,
                   uint32_t n_act, float *out, size_t out_stride);
/* Runs every job of the phase in one pool run and empties it. */
void wf_cpu_mm_run(const struct wf_cpu *cpu, struct wf_cpu_mm_phase *ph);

/* Quantizes n rows of n_cols floats (src_stride floats apart) to the activation type act, rows
 * packed at dst; returns the bytes of one quantized row. */
size_t wf_cpu_quantize_rows(const struct wf_cpu *cpu, enum wf_dtype act, const float *src,
                            size_t src_stride, uint32_t n, int64_t n_cols, uint8_t *dst);

/* The same for the rows idx[0..n) of src, in that order. */
size_t wf_cpu_quantize_rows_idx(const struct wf_cpu *cpu, enum wf_dtype act, const float *src,
                                size_t src_stride, const uint32_t *idx, uint32_t n, int64_t n_cols,
                                uint8_t *dst);

#ifdef __cplusplus
}
#endif
#endif
