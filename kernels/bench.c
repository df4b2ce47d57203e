/* wf-kbench: one-thread speed of the CPU kernels' gemm per weight type and level, against the
 * memory read bandwidth measured in the same run. A developer's tool (not installed): the
 * benchmark suite proper lives in bench/.
 *
 *   wf-kbench [-m MIB] [-l ref|avx2|avx512|all] [-a N[,N...]] [-t TYPE[,TYPE...]]
 *
 * Decode multiplies every weight by one activation row, so it is bound by the rate weights come
 * from memory: gemm at n_act=1 over a matrix much larger than the caches (MIB, default 512)
 * should approach the read bandwidth. Larger n_act (batched decode, prefill) reuse each weight
 * block for several activation rows; for them the tool reports activation rows x weight bytes
 * per second, whose ratio to n_act=1 is the speed-up batching buys. */
#include "kernels/kernels.h"
#include "kernels/ref.h"
#include "model/dtype.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
	struct timespec ts;

	/* this thread's CPU time: the machine this runs on may be shared, and time spent
	 * descheduled says nothing about the kernels */
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Reads every byte once: eight independent sums so that the loop is bound by loads, and the
 * same software prefetch distance as the kernels, so that the figure is the best a thread
 * reads, not what the hardware prefetcher alone gives. */
static uint64_t read_all(const void *p, size_t n)
{
	const uint64_t *q = p;
	uint64_t s[8] = {0};

	for (size_t i = 0; i + 8 <= n / 8; i += 8) {
		__builtin_prefetch((const char *)(q + i) + 2048);
		for (int k = 0; k < 8; k++)
			s[k] += q[i + k];
	}
	return s[0] ^ s[1] ^ s[2] ^ s[3] ^ s[4] ^ s[5] ^ s[6] ^ s[7];
}

struct job {
	enum { JOB_READ, JOB_COPY, JOB_GEMM } kind;
	const struct wf_kernel_type_ops *o;
	const void *w, *act;
	void *dst;
	size_t bytes, row, arow;
	int64_t n, rows, na;
	float *out;
	uint64_t sink;
};

/* CPU seconds per run, the best of `reps` (on a shared machine the best run is the one the
 * others disturbed least: caches and memory bandwidth are shared too). */
static double best_of(int reps, struct job *j)
{
	double best = 1e30;

	for (int r = 0; r < reps; r++) {
		const double t0 = now();

		switch (j->kind) {
		case JOB_READ:
			j->sink += read_all(j->w, j->bytes);
			break;
		case JOB_COPY:
			memcpy(j->dst, j->w, j->bytes);
			break;
		case JOB_GEMM:
			j->o->gemm(j->n, j->w, j->row, j->rows, j->act, j->arow, j->na, j->out,
			           (size_t)j->rows);
			break;
		}
		const double t = now() - t0;
		best = t < best ? t : best;
	}
	return best;
}

/* Weights as a model has them: random values and scales of ordinary magnitude. Random bits
 * would make subnormal floats (microcode assists on every FMA) and NaN scales, which no model
 * holds and which would measure the wrong thing. */
static void fill_weights(enum wf_dtype t, char *w, size_t bytes)
{
	const struct wf_dtype_info *info = wf_dtype_info(t);
	uint64_t z = 0x2545f4914f6cdd1dull;
	size_t d_off[2] = {0, SIZE_MAX};

	for (size_t i = 0; i + 8 <= bytes; i += 8) {
		z ^= z << 13, z ^= z >> 7, z ^= z << 17; /* xorshift64 */
		memcpy(w + i, &z, 8);
	}
	switch (t) {
	case WF_DTYPE_F32:
		for (size_t i = 0; i + 4 <= bytes; i += 4) {
			float f = (float)((int32_t)((uint32_t)w[i] * 2654435761u) >> 8) * 0x1p-30f;
			memcpy(w + i, &f, 4);
		}
		return;
	case WF_DTYPE_F16:
	case WF_DTYPE_BF16:
		for (size_t i = 0; i + 2 <= bytes; i += 2) {
			float f = (float)(int8_t)w[i] * 0x1p-10f;
			uint16_t v = t == WF_DTYPE_F16 ? wf_kernels_fp32_to_fp16(f)
			                               : wf_kernels_fp32_to_bf16(f);
			memcpy(w + i, &v, 2);
		}
		return;
	case WF_DTYPE_Q4_K:
	case WF_DTYPE_Q5_K:
		d_off[1] = 2; /* dmin */
		break;
	case WF_DTYPE_Q6_K:
		d_off[0] = offsetof(struct wf_block_q6_K, d);
		break;
	default:
		break;
	}
	for (size_t b = 0; b + info->type_size <= bytes; b += info->type_size) {
		for (int k = 0; k < 2; k++) {
			if (d_off[k] == SIZE_MAX)
				continue;
			uint16_t d =
			    wf_kernels_fp32_to_fp16(1e-4f * (float)(1 + (uint8_t)w[b + 4 + k]));
			memcpy(w + b + d_off[k], &d, 2);
		}
	}
}

static const enum wf_dtype all_types[] = {WF_DTYPE_F32,  WF_DTYPE_F16,  WF_DTYPE_BF16,
                                          WF_DTYPE_Q8_0, WF_DTYPE_Q4_0, WF_DTYPE_Q4_K,
                                          WF_DTYPE_Q5_K, WF_DTYPE_Q6_K};

static int parse_list(const char *s, long *v, int max)
{
	int n = 0;

	while (*s && n < max) {
		char *end;
		v[n++] = strtol(s, &end, 10);
		if (end == s || v[n - 1] <= 0)
			return -1;
		s = *end == ',' ? end + 1 : end;
	}
	return n;
}

int main(int argc, char **argv)
{
	long mib = 512, acts[16] = {1, 8, 64};
	int n_acts = 3, opt;
	const char *level_arg = "all", *types_arg = NULL;

	while ((opt = getopt(argc, argv, "m:l:a:t:h")) != -1) {
		switch (opt) {
		case 'm':
			mib = strtol(optarg, NULL, 10);
			break;
		case 'l':
			level_arg = optarg;
			break;
		case 'a':
			n_acts = parse_list(optarg, acts, 16);
			break;
		case 't':
			types_arg = optarg;
			break;
		default:
			fprintf(stderr, "usage: wf-kbench [-m MIB] [-l ref|avx2|avx512|all] "
			                "[-a N[,N...]] [-t TYPE[,TYPE...]]\n");
			return opt == 'h' ? 0 : 2;
		}
	}
	if (mib < 1 || n_acts <= 0) {
		fprintf(stderr, "wf-kbench: -m takes at least 1 MiB, -a positive counts\n");
		return 2;
	}
	const size_t bytes = (size_t)mib << 20;
	char *w = malloc(bytes), *dst = malloc(bytes);
	if (!w || !dst) {
		fprintf(stderr, "wf-kbench: cannot allocate 2 x %ld MiB\n", mib);
		return 1;
	}
	/* written before anything reads it: untouched pages all map the kernel's zero page, which
	 * reads at cache speed */
	memset(w, 0x5a, bytes);
	memset(dst, 0, bytes);

	struct job rd = {.kind = JOB_READ, .w = w, .bytes = bytes};
	struct job cp = {.kind = JOB_COPY, .w = w, .dst = dst, .bytes = bytes};
	const double t_read = best_of(5, &rd);
	const double t_copy = best_of(5, &cp);
	printf(
	    "# one thread, %ld MiB: memory read %.1f GB/s, memcpy %.1f GB/s (bytes copied / s)\n",
	    mib, bytes / t_read / 1e9, bytes / t_copy / 1e9);
	printf("%-7s %-5s %6s %9s %8s %s\n", "level", "type", "n_act", "GB/s", "x n_act",
	       "of read bw");

	const int64_t n = 4096; /* a row of a model's hidden size */
	float *x = malloc((size_t)n * sizeof(float));
	float *out = malloc((size_t)1 << 26);
	void *act = malloc((size_t)512 * n * 4 + 4096);
	if (!x || !out || !act)
		return 1;
	for (int64_t i = 0; i < n; i++)
		x[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;

	for (int l = 0; l < WF_KERNEL_LEVEL_MAX_; l++) {
		const struct wf_kernel_ops *ops = wf_kernels_cpu_ops_level((enum wf_kernel_level)l);

		if (strcmp(level_arg, "all") != 0 &&
		    strcmp(level_arg, wf_kernel_level_name((enum wf_kernel_level)l)) != 0)
			continue;
		if (!ops) {
			printf("# %s: not on this CPU\n",
			       wf_kernel_level_name((enum wf_kernel_level)l));
			continue;
		}
		for (size_t ti = 0; ti < sizeof(all_types) / sizeof(all_types[0]); ti++) {
			const enum wf_dtype t = all_types[ti];
			const struct wf_kernel_type_ops *o = wf_kernel_ops_type(ops, t);
			const struct wf_dtype_info *info = wf_dtype_info(t);

			if (types_arg && !strstr(types_arg, info->name))
				continue;
			const struct wf_dtype_info *ainfo = wf_dtype_info(o->vec_dot_type);
			const size_t row = (size_t)(n / info->block_size) * info->type_size;
			const size_t arow = (size_t)(n / ainfo->block_size) * ainfo->type_size;
			double gbs1 = 0;

			fill_weights(t, w, bytes);
			for (int64_t j = 0; j < 512; j++)
				ops->from_float[o->vec_dot_type](x, (char *)act + (size_t)j * arow,
				                                 n);
			for (int a = 0; a < n_acts; a++) {
				/* the whole buffer up to 16 activation rows (batched decode reads
				 * its weights from memory too); a slice for prefill-sized batches,
				 * so a call does about as many dots as 16 rows over the whole
				 * buffer; an eighth for the reference, which is slow */
				const int64_t na = acts[a] > 512 ? 512 : acts[a];
				int64_t rows = (int64_t)(bytes / row);
				if (na > 16)
					rows = rows * 16 / na;
				if (l == WF_KERNEL_LEVEL_REF)
					rows /= 8;
				if ((size_t)rows * (size_t)na * sizeof(float) > ((size_t)1 << 26))
					rows = (int64_t)(((size_t)1 << 26) / sizeof(float)) / na;
				if (rows < 1)
					rows = 1;
				struct job g = {.kind = JOB_GEMM,
				                .o = o,
				                .w = w,
				                .act = act,
				                .row = row,
				                .arow = arow,
				                .n = n,
				                .rows = rows,
				                .na = na,
				                .out = out};
				const double tt = best_of(5, &g);
				const double gbs = (double)rows * (double)row / tt / 1e9;

				if (acts[a] == 1)
					gbs1 = gbs;
				printf("%-7s %-5s %6ld %9.2f %8.2f %9.2f\n",
				       wf_kernel_level_name((enum wf_kernel_level)l), info->name,
				       (long)na, gbs, gbs1 > 0 ? gbs * (double)na / gbs1 : 0.0,
				       gbs / (bytes / t_read / 1e9));
				fflush(stdout);
			}
		}
	}
	free(x);
	free(out);
	free(act);
	free(w);
	free(dst);
	return rd.sink == 42 ? 3 : 0; /* keeps the read loop from being optimized away */
}
