/* Matrix products on the CPU over the engine's thread pool: what the CPU forward pass
 * (forward.c), the host device's compute ops (devops_host.c) and the device forward pass's
 * host-side experts (forward_dev.c) all multiply with, so the three give bit-identical results.
 *
 * A product quantizes its activation rows once to the weight type's vec_dot_type (as ggml's
 * mul_mat does) and then takes row-by-row dots, each weight row against every activation row
 * (the kernels' gemm), so a weight row is read from memory once per step however many tokens the
 * batch holds. Jobs are collected into a phase and run together, split into chunks of rows that
 * the pool's threads claim. */
#ifndef WF_ENGINE_CPUMM_H
#define WF_ENGINE_CPUMM_H

#include "engine/engine_internal.h"

/* What a CPU product runs with. */
struct wf__cpu {
	const struct wf_kernel_ops *ops;
	struct wf_pool *pool;
	uint32_t n_threads;
};

/* One product: out[j][i] = W[i] . act[j] for rows [0, w->ne[1]) of one matrix (an expert's when
 * the weight is a stack). */
struct wf__mm_job {
	const struct wf__wt *w;
	const uint8_t *wbase;
	const uint8_t *act;
	size_t act_stride;
	uint32_t n_act;
	float *out;
	size_t out_stride;
};

#define WF__MM_MAX_JOBS (2u * WF__MAX_EXPERTS + 8u) /* gate and up of every expert */

struct wf__mm_phase {
	struct wf__mm_job jobs[WF__MM_MAX_JOBS];
	uint32_t n_jobs;
	uint32_t chunk_rows;
	uint32_t first_chunk[WF__MM_MAX_JOBS + 1];
};

/* Bytes of one row of n activations of type act. */
size_t wf__act_row_bytes(enum wf_dtype act, int64_t n);

/* Adds a product of w (expert `expert` of a stack) with n_act activation rows to the phase.
 * base: the matrix's bytes when they are not in the view (a post-fetched copy); NULL: the
 * view's. n_act 0 adds nothing. */
void wf__mm_add(struct wf__mm_phase *ph, const struct wf__wt *w, uint32_t expert, const void *base,
                const void *act, size_t act_stride, uint32_t n_act, float *out, size_t out_stride);
/* Runs every job of the phase in one pool run and empties it. */
void wf__mm_run(const struct wf__cpu *cpu, struct wf__mm_phase *ph);

/* Quantizes n rows of n_cols floats (src_stride floats apart) to the activation type act, rows
 * packed at dst; returns the bytes of one quantized row. */
size_t wf__quantize_rows(const struct wf__cpu *cpu, enum wf_dtype act, const float *src,
                         size_t src_stride, uint32_t n, int64_t n_cols, uint8_t *dst);

/* y[j * y_stride + i] = W[i] . x[j * x_stride] for one plain matrix and n rows, quantizing x
 * into qa (room for n rows of w's activation type). */
void wf__matmul(const struct wf__cpu *cpu, struct wf__mm_phase *ph, const struct wf__wt *w,
                const float *x, size_t x_stride, uint32_t n, uint8_t *qa, float *y,
                size_t y_stride);

#endif
