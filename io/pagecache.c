/* cachestat(2) for io/pagecache.h. */
#include "io/pagecache.h"

#include <errno.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef __NR_cachestat
#define __NR_cachestat 451 /* same number on every architecture (Linux 6.5) */
#endif

/* The kernel's uapi structs (linux/mman.h), spelled out: older headers lack them. */
struct cachestat_range_ {
	uint64_t off, len;
};
struct cachestat_ {
	uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted;
};

int wf_io_pagecache_probe(int fd, uint64_t off, uint64_t len, bool *ret_cached)
{
	/* len 0 would mean "to the end of the file" to the kernel. */
	if (len == 0) {
		*ret_cached = true;
		return 0;
	}
	long ps = sysconf(_SC_PAGESIZE);
	uint64_t page = ps > 0 ? (uint64_t)ps : 4096;
	uint64_t pages = (off + len + page - 1) / page - off / page;
	struct cachestat_range_ range = {off, len};
	struct cachestat_ cs = {0};
	if (syscall(__NR_cachestat, fd, &range, &cs, 0) != 0)
		return -errno;
	*ret_cached = cs.nr_cache >= pages;
	return 0;
}
