/* Matrix products on the CPU over the pool (cpu_matmul.h). */
#include "kernels/cpu_matmul.h"

#include "kernels/pool.h"

size_t wf_cpu_act_row_bytes(enum wf_dtype act, int64_t n)
{
	const struct wf_dtype_info *info = wf_dtype_info(act);
	return (size_t)(n / info->block_size) * info->type_size;
}

static void mm_rows(const struct wf_cpu_mm_job *j, int64_t r0, int64_t r1)
{
	const uint8_t *wr = j->w + (size_t)r0 * j->row_size;
	if (j->t->gemm) {
		j->t->gemm(j->ne0, wr, j->row_size, r1 - r0, j->act, j->act_stride, j->n_act,
		           j->out + r0, j->out_stride);
		return;
	}
	for (int64_t r = r0; r < r1; r++, wr += j->row_size)
		for (uint32_t a = 0; a < j->n_act; a++)
			j->out[a * j->out_stride + (size_t)r] =
			    j->t->vec_dot(j->ne0, wr, j->act + a * j->act_stride);
}

static void mm_task(void *arg, uint32_t task, uint32_t thread)
{
	(void)thread;
	const struct wf_cpu_mm_phase *ph = arg;
	/* The job holding this chunk: a binary search over the prefix sums. */
	uint32_t lo = 0, hi = ph->n_jobs;
	while (hi - lo > 1) {
		const uint32_t mid = (lo + hi) / 2;
		if (ph->first_chunk[mid] <= task)
			lo = mid;
		else
			hi = mid;
	}
	const struct wf_cpu_mm_job *j = &ph->jobs[lo];
	const int64_t r0 = (int64_t)(task - ph->first_chunk[lo]) * ph->chunk_rows;
	int64_t r1 = r0 + ph->chunk_rows;
	if (r1 > j->ne1)
		r1 = j->ne1;
	mm_rows(j, r0, r1);
}

void wf_cpu_mm_add(struct wf_cpu_mm_phase *ph, const struct wf_kernel_type_ops *t, const void *w,
                   size_t row_size, int64_t ne0, int64_t ne1, const void *act, size_t act_stride,
                   uint32_t n_act, float *out, size_t out_stride)
{
	if (n_act == 0)
		return;
	ph->jobs[ph->n_jobs++] = (struct wf_cpu_mm_job){
	    .t = t,
	    .w = w,
	    .row_size = row_size,
	    .ne0 = ne0,
	    .ne1 = ne1,
	    .act = act,
	    .act_stride = act_stride,
	    .n_act = n_act,
	    .out = out,
	    .out_stride = out_stride,
	};
}

/* Splits every job into chunks of rows so that the threads get several chunks each (dynamic
 * claiming evens out the rest), then runs them all in one pool run. */
void wf_cpu_mm_run(const struct wf_cpu *cpu, struct wf_cpu_mm_phase *ph)
{
	uint64_t total_rows = 0;
	for (uint32_t i = 0; i < ph->n_jobs; i++)
		total_rows += (uint64_t)ph->jobs[i].ne1;
	uint64_t chunk = total_rows / ((uint64_t)cpu->n_threads * 8u);
	if (chunk < 16)
		chunk = 16;
	chunk = (chunk + 7) & ~(uint64_t)7;
	ph->chunk_rows = (uint32_t)chunk;
	ph->first_chunk[0] = 0;
	for (uint32_t i = 0; i < ph->n_jobs; i++) {
		const uint64_t rows = (uint64_t)ph->jobs[i].ne1;
		ph->first_chunk[i + 1] =
		    ph->first_chunk[i] + (uint32_t)((rows + chunk - 1) / chunk);
	}
	wf_pool_run(cpu->pool, mm_task, ph, ph->first_chunk[ph->n_jobs]);
	ph->n_jobs = 0;
}

struct quant_job {
	const struct wf_cpu *cpu;
	const float *src;
	const uint32_t *idx; /* NULL: rows in order */
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
	const size_t row = q->idx ? q->idx[task] : task;
	q->cpu->ops->from_float[q->act](q->src + row * q->src_stride, q->dst + task * q->dst_stride,
	                                q->n_cols);
}

size_t wf_cpu_quantize_rows_idx(const struct wf_cpu *cpu, enum wf_dtype act, const float *src,
                                size_t src_stride, const uint32_t *idx, uint32_t n, int64_t n_cols,
                                uint8_t *dst)
{
	struct quant_job q = {cpu,    src, idx, src_stride, dst, wf_cpu_act_row_bytes(act, n_cols),
	                      n_cols, act};
	/* A pool run costs more than quantizing one or two rows. */
	if (n <= 2) {
		for (uint32_t i = 0; i < n; i++)
			quant_task(&q, i, 0);
	} else {
		wf_pool_run(cpu->pool, quant_task, &q, n);
	}
	return q.dst_stride;
}

size_t wf_cpu_quantize_rows(const struct wf_cpu *cpu, enum wf_dtype act, const float *src,
                            size_t src_stride, uint32_t n, int64_t n_cols, uint8_t *dst)
{
	return wf_cpu_quantize_rows_idx(cpu, act, src, src_stride, NULL, n, n_cols, dst);
}
