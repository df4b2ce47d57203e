/* Matrix products on the CPU over the pool (cpumm.h). */
#include "engine/cpumm.h"

size_t wf__act_row_bytes(enum wf_dtype act, int64_t n)
{
	const struct wf_dtype_info *info = wf_dtype_info(act);
	return (size_t)(n / info->block_size) * info->type_size;
}

static void mm_rows(const struct wf__mm_job *j, int64_t r0, int64_t r1)
{
	const struct wf__wt *w = j->w;
	const uint8_t *wr = j->wbase + (size_t)r0 * w->row_size;
	if (w->ops->gemm) {
		w->ops->gemm(w->ne[0], wr, w->row_size, r1 - r0, j->act, j->act_stride, j->n_act,
		             j->out + r0, j->out_stride);
		return;
	}
	for (int64_t r = r0; r < r1; r++, wr += w->row_size)
		for (uint32_t a = 0; a < j->n_act; a++)
			j->out[a * j->out_stride + (size_t)r] =
			    w->ops->vec_dot(w->ne[0], wr, j->act + a * j->act_stride);
}

static void mm_task(void *arg, uint32_t task, uint32_t thread)
{
	(void)thread;
	const struct wf__mm_phase *ph = arg;
	/* Find the job holding this chunk (few jobs: a linear scan over the prefix sums). */
	uint32_t lo = 0, hi = ph->n_jobs;
	while (hi - lo > 1) {
		uint32_t mid = (lo + hi) / 2;
		if (ph->first_chunk[mid] <= task)
			lo = mid;
		else
			hi = mid;
	}
	const struct wf__mm_job *j = &ph->jobs[lo];
	const int64_t r0 = (int64_t)(task - ph->first_chunk[lo]) * ph->chunk_rows;
	int64_t r1 = r0 + ph->chunk_rows;
	if (r1 > j->w->ne[1])
		r1 = j->w->ne[1];
	mm_rows(j, r0, r1);
}

void wf__mm_add(struct wf__mm_phase *ph, const struct wf__wt *w, uint32_t expert, const void *base,
                const void *act, size_t act_stride, uint32_t n_act, float *out, size_t out_stride)
{
	if (n_act == 0)
		return;
	struct wf__mm_job *j = &ph->jobs[ph->n_jobs++];
	j->w = w;
	j->wbase = base ? (const uint8_t *)base
	                : (const uint8_t *)w->data + (size_t)expert * w->matrix_size;
	j->act = act;
	j->act_stride = act_stride;
	j->n_act = n_act;
	j->out = out;
	j->out_stride = out_stride;
}

/* Splits every job into chunks of rows so that the threads get several chunks each (dynamic
 * claiming evens out the rest), then runs them all in one pool run. */
void wf__mm_run(const struct wf__cpu *cpu, struct wf__mm_phase *ph)
{
	uint64_t total_rows = 0;
	for (uint32_t i = 0; i < ph->n_jobs; i++)
		total_rows += (uint64_t)ph->jobs[i].w->ne[1];
	uint64_t chunk = total_rows / ((uint64_t)cpu->n_threads * 8u);
	if (chunk < 16)
		chunk = 16;
	chunk = (chunk + 7) & ~(uint64_t)7;
	ph->chunk_rows = (uint32_t)chunk;
	ph->first_chunk[0] = 0;
	for (uint32_t i = 0; i < ph->n_jobs; i++) {
		const uint64_t rows = (uint64_t)ph->jobs[i].w->ne[1];
		ph->first_chunk[i + 1] =
		    ph->first_chunk[i] + (uint32_t)((rows + chunk - 1) / chunk);
	}
	wf_pool_run(cpu->pool, mm_task, ph, ph->first_chunk[ph->n_jobs]);
	ph->n_jobs = 0;
}

struct quant_job {
	const struct wf__cpu *cpu;
	const float *src;
	size_t src_stride;
	uint8_t *dst;
	size_t dst_stride;
	int64_t n_cols;
	enum wf_dtype act;
};

static void quant_task(void *arg, uint32_t task, uint32_t thread)
{
	(void)thread;
	const struct quant_job *q = arg;
	q->cpu->ops->from_float[q->act](q->src + task * q->src_stride,
	                                q->dst + task * q->dst_stride, q->n_cols);
}

size_t wf__quantize_rows(const struct wf__cpu *cpu, enum wf_dtype act, const float *src,
                         size_t src_stride, uint32_t n, int64_t n_cols, uint8_t *dst)
{
	struct quant_job q = {cpu,    src, src_stride, dst, wf__act_row_bytes(act, n_cols),
	                      n_cols, act};
	if (n <= 2) {
		for (uint32_t i = 0; i < n; i++)
			quant_task(&q, i, 0);
	} else {
		wf_pool_run(cpu->pool, quant_task, &q, n);
	}
	return q.dst_stride;
}

void wf__matmul(const struct wf__cpu *cpu, struct wf__mm_phase *ph, const struct wf__wt *w,
                const float *x, size_t x_stride, uint32_t n, uint8_t *qa, float *y, size_t y_stride)
{
	const size_t stride =
	    wf__quantize_rows(cpu, w->ops->vec_dot_type, x, x_stride, n, w->ne[0], qa);
	wf__mm_add(ph, w, 0, NULL, qa, stride, n, y, y_stride);
	wf__mm_run(cpu, ph);
}
