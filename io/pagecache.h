/* Page-cache residency of a file range, through cachestat(2) (Linux 6.5+): the one probe that
 * both readers of model files use to pick a copy from RAM over a disk read (io/reader.c, the
 * materializer's fill in shm/fill.c).
 *
 * The syscall's ABI is declared here once: struct cachestat_range {off, len} in, struct
 * cachestat {nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted} out, syscall
 * number 451 on every architecture. Pages are the system's (sysconf(_SC_PAGESIZE)), not an
 * assumed 4096. */
#ifndef WF_IO_PAGECACHE_H
#define WF_IO_PAGECACHE_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Is every page of [off, off + len) of fd in the page cache? Returns 0 with *ret_cached (an
 * empty range is cached), or -errno: -ENOSYS where the kernel has no cachestat(2) and -EPERM
 * where a seccomp filter refuses it (callers stop asking then), -EBADF, -EINVAL, ... Does not
 * change the file or its cache. Thread-safe. */
int wf_io_pagecache_probe(int fd, uint64_t off, uint64_t len, bool *ret_cached);

#ifdef __cplusplus
}
#endif

#endif
