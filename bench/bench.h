#ifndef WF_BENCH_BENCH_H
#define WF_BENCH_BENCH_H

#include <stdbool.h>

struct bench_opts {
	bool json;
	const char *dir;        /* model files (a disk directory, not tmpfs) */
	const char *floor_root; /* where floors are made (tmpfs) */
	const char *size;       /* model size for throughput figures */
	const char *only;       /* comma-separated sub-benchmarks, NULL: all */
	const char *wfgen;      /* path of wf-gen */
	const char *device;     /* residency: device spec */
	int iterations;
};

bool bench_selected(const struct bench_opts *o, const char *name);
int bench_floor(const struct bench_opts *o);
int bench_residency(const struct bench_opts *o);

#endif
