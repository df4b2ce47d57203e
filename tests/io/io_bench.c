/* wf-io-bench: copies one file (or a range) into memory with libwfio and prints the rate, for
 * comparison with fio and cat in the same session. Not a test; built beside the io tests.
 *
 *   wf-io-bench [-b auto|uring|pread] [-q depth] [-c chunk] [-t threads] [-r] [-n] [-N]
 *               [-d anon|shm] [-p] [-o offset] [-l len] FILE
 *   -r register the destination (io_uring fixed buffers)   -n no O_DIRECT   -N no cache probe
 *   -d destination: anonymous memory, or a /dev/shm file mapped shared (like a floor region)
 *   -p pre-fault the destination before timing   -P populate it from a second thread, timed */
#include "base/error.h"
#include "io/reader.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

struct populate {
	char *base;
	size_t len;
};

/* Populates the destination from another thread while the copy runs, the way a materializer
 * can overlap page allocation with the reads. */
static void *populate_fn(void *arg)
{
	struct populate *p = arg;
	for (size_t off = 0; off < p->len; off += 64u << 20) {
		size_t n = p->len - off < (64u << 20) ? p->len - off : (64u << 20);
		if (madvise(p->base + off, n, MADV_POPULATE_WRITE) != 0)
			break;
	}
	return NULL;
}

static int usage(void)
{
	fprintf(stderr,
	        "usage: wf-io-bench [-b auto|uring|pread] [-q depth] [-c chunk] [-t threads] "
	        "[-r] [-n] [-N] [-d anon|shm] [-p|-P] [-o offset] [-l len] FILE\n");
	return 2;
}

int main(int argc, char **argv)
{
	struct wf_io_opts o = {.flags = WF_IO_OPT_NO_ENV};
	const char *dstkind = "shm";
	bool reg = false, prefault = false, populate = false;
	unsigned long long off = 0, len = 0;
	struct wf_io_reader *r;
	struct wf_io_file *f;
	int c, ret;

	while ((c = getopt(argc, argv, "b:q:c:t:rnNd:pPo:l:")) != -1) {
		switch (c) {
		case 'b':
			o.backend = !strcmp(optarg, "pread")   ? WF_IO_BACKEND_PREAD
			            : !strcmp(optarg, "uring") ? WF_IO_BACKEND_URING
			                                       : WF_IO_BACKEND_AUTO;
			break;
		case 'q':
			o.queue_depth = (unsigned)strtoul(optarg, NULL, 0);
			break;
		case 'c':
			o.chunk_size = strtoull(optarg, NULL, 0);
			break;
		case 't':
			o.threads = (unsigned)strtoul(optarg, NULL, 0);
			break;
		case 'r':
			reg = true;
			break;
		case 'n':
			o.flags |= WF_IO_OPT_NO_DIRECT;
			break;
		case 'N':
			o.flags |= WF_IO_OPT_NO_CACHE_PROBE;
			break;
		case 'd':
			dstkind = optarg;
			break;
		case 'p':
			prefault = true;
			break;
		case 'P':
			populate = true;
			break;
		case 'o':
			off = strtoull(optarg, NULL, 0);
			break;
		case 'l':
			len = strtoull(optarg, NULL, 0);
			break;
		default:
			return usage();
		}
	}
	if (optind + 1 != argc)
		return usage();

	ret = wf_io_reader_create(&o, &r);
	if (ret < 0) {
		fprintf(stderr, "wf-io-bench: reader: %s\n", wf_strerror(ret));
		return 1;
	}
	ret = wf_io_file_open(r, argv[optind], 0, &f);
	if (ret < 0) {
		fprintf(stderr, "wf-io-bench: %s: %s\n", argv[optind], wf_strerror(ret));
		return 1;
	}
	struct wf_io_file_info fi;
	wf_io_file_info(f, &fi);
	if (!len)
		len = fi.size - off;

	/* The destination starts in phase with the file offset, as a floor region's data does. */
	size_t map_len = len + 4096;
	char *map;
	if (!strcmp(dstkind, "anon")) {
		map =
		    mmap(NULL, map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	} else {
		char path[] = "/dev/shm/wf-io-bench-XXXXXX";
		int fd = mkostemp(path, O_CLOEXEC);
		if (fd < 0 || ftruncate(fd, (off_t)map_len) != 0) {
			perror("wf-io-bench: shm");
			return 1;
		}
		unlink(path);
		map = mmap(NULL, map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		close(fd);
	}
	if (map == MAP_FAILED) {
		perror("wf-io-bench: mmap");
		return 1;
	}
	if (prefault)
		for (size_t i = 0; i < map_len; i += 4096)
			map[i] = 0;
	char *dst = map + off % 4096;
	if (reg) {
		ret = wf_io_buffer_register(r, map, map_len);
		if (ret < 0)
			fprintf(stderr, "wf-io-bench: register: %s (continuing)\n",
			        wf_strerror(ret));
	}

	struct populate pop = {map, map_len};
	pthread_t th;
	double t0 = now_s();
	if (populate && pthread_create(&th, NULL, populate_fn, &pop) != 0)
		populate = false;
	ret = wf_io_copy(r, f, off, len, dst, NULL);
	if (populate)
		pthread_join(th, NULL);
	double dt = now_s() - t0;
	if (ret < 0) {
		fprintf(stderr, "wf-io-bench: copy: %s\n", wf_strerror(ret));
		return 1;
	}

	struct wf_io_reader_info ri;
	struct wf_io_stats st;
	wf_io_reader_info(r, &ri);
	wf_io_reader_stats(r, &st);
	printf("%s depth=%u chunk=%zu%s direct=%d dst=%s%s: %llu bytes in %.3f s = %.0f MB/s "
	       "(%.0f MiB/s); direct %llu buffered %llu cached_chunks %llu fixed_reads %llu\n",
	       ri.backend_name, ri.queue_depth, ri.chunk_size, reg ? " registered" : "", fi.direct,
	       dstkind,
	       prefault   ? "+prefault"
	       : populate ? "+populate-thread"
	                  : "",
	       len, dt, (double)len / dt / 1e6, (double)len / dt / 1048576.0,
	       (unsigned long long)st.bytes_direct, (unsigned long long)st.bytes_buffered,
	       (unsigned long long)st.cached_chunks, (unsigned long long)st.fixed_reads);
	wf_io_file_close(f);
	wf_io_reader_destroy(r);
	munmap(map, map_len);
	return 0;
}
