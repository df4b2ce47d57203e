/* Anchors: what a wf-bench figure is compared with, measured in the same run. */
#ifndef WF_BENCH_ANCHORS_H
#define WF_BENCH_ANCHORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

double bench_now(void); /* CLOCK_MONOTONIC seconds */

/* Drops the page cache (echo 3 > /proc/sys/vm/drop_caches after sync); false if not permitted. */
bool bench_drop_caches(void);

/* Evicts one file from the page cache (POSIX_FADV_DONTNEED), which needs no privilege. */
void bench_evict_file(const char *path);

/* fio's sequential read of path: io_uring, O_DIRECT (direct false: buffered), 1 MiB blocks,
 * iodepth 64. Returns bytes/s, or a negative code when fio is missing or fails. */
double bench_fio_read(const char *path, bool direct);

/* Seconds `cat path > /dev/null` takes (a real cat process). Negative on failure. */
double bench_cat_seconds(const char *path);

/* Memory read bandwidth with n_threads threads: each reads its own contiguous slice of one
 * anonymous buffer of `bytes` (pre-faulted; pick it much larger than the last-level cache) front
 * to back, summing the words into registers, as a bandwidth-bound decode reads its weights. The
 * best of `passes` timed passes, in bytes/s; negative on failure (no memory, no threads). */
double bench_read_bandwidth(unsigned n_threads, size_t bytes, int passes);

/* A buffer size for bench_read_bandwidth: 4 x the last-level cache (sysfs), at least 1 GiB, at
 * most an eighth of physical memory. */
size_t bench_read_bandwidth_size(void);

/* Runs argv (argv[0] a path, or a name looked up in $PATH) with stdout to out_path (NULL:
 * /dev/null), stderr inherited; returns its exit status, or -1 when it could not run or died of
 * a signal. */
int bench_run(char *const argv[], const char *out_path);

/* Removes a file or a directory tree (best effort). */
void bench_rmtree(const char *path);

/* Generates a model with wf-gen (next to wf-bench in the build tree, or on PATH). */
int bench_gen_model(const char *wfgen, const char *path, const char *size, int seed);

#endif
