/* libwfio: both backends, O_DIRECT and buffered paths, errors, truncation, cancel, progress and
 * the asynchronous submit/reap interface. Files hold a position-dependent pattern, so a byte read
 * into the wrong place or from the wrong offset is caught. */
#include "io/internal.h"
#include "io/pagecache.h"
#include "io/reader.h"

#include "base/error.h"
#include "common/wftest.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/magic.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define MIB (1ull << 20)

/* --- helpers ------------------------------------------------------------------------------- */

static uint64_t splitmix(uint64_t x)
{
	x += 0x9E3779B97F4A7C15ull;
	x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
	x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
	return x ^ (x >> 31);
}

static uint8_t pat(uint64_t seed, uint64_t pos)
{
	return (uint8_t)(splitmix(seed ^ (pos >> 3)) >> ((pos & 7) * 8));
}

static void fill(uint8_t *buf, uint64_t seed, uint64_t pos, size_t n)
{
	for (size_t i = 0; i < n; i++)
		buf[i] = pat(seed, pos + i);
}

/* Index of the first byte of buf that differs from the pattern at pos, or n. */
static size_t mismatch(const uint8_t *buf, uint64_t seed, uint64_t pos, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (buf[i] != pat(seed, pos + i))
			return i;
	return n;
}

/* Writes a file of size bytes of pattern seed; evict drops it from the page cache afterwards so
 * that reads go to the disk. */
static char *make_file(const char *dir, const char *name, uint64_t size, uint64_t seed, bool evict)
{
	char *path = NULL;
	uint8_t *buf = malloc(MIB);
	int fd;

	cr_assert(buf);
	cr_assert(asprintf(&path, "%s/%s", dir, name) > 0);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	cr_assert(fd >= 0, "open %s: %s", path, strerror(errno));
	for (uint64_t pos = 0; pos < size;) {
		size_t n = size - pos < MIB ? (size_t)(size - pos) : MIB;
		fill(buf, seed, pos, n);
		cr_assert(pwrite(fd, buf, n, (off_t)pos) == (ssize_t)n);
		pos += n;
	}
	if (evict) {
		cr_assert(fsync(fd) == 0);
		cr_assert(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0);
	}
	close(fd);
	free(buf);
	return path;
}

static bool dir_is_memory(const char *dir)
{
	struct statfs s;
	return statfs(dir, &s) == 0 && (s.f_type == TMPFS_MAGIC || s.f_type == RAMFS_MAGIC);
}

/* A private directory on a real disk (for O_DIRECT), or NULL when there is none. */
static char *disk_dir(void)
{
	static const char *const bases[] = {"/var/tmp", "/tmp"};
	for (size_t i = 0; i < 2; i++) {
		char *p = NULL;
		if (dir_is_memory(bases[i]))
			continue;
		cr_assert(asprintf(&p, "%s/wftest-io-XXXXXX", bases[i]) > 0);
		if (mkdtemp(p))
			return p;
		free(p);
	}
	return NULL;
}

static void rm_dir(char *dir)
{
	wft_rmtree(dir);
	free(dir);
}

static char *shm_dir(void)
{
	char *p = strdup("/dev/shm/wftest-io-XXXXXX");
	cr_assert(p && mkdtemp(p));
	return p;
}

/* Destination with guard pages around it; phase_ok places dst in phase with the file offset
 * (so the body can go direct), otherwise 7 bytes off. */
struct dstbuf {
	uint8_t *base;
	uint8_t *dst;
	size_t len, total;
};

#define GUARD 8192

static void dst_alloc(struct dstbuf *d, size_t len, uint64_t off, bool phase_ok)
{
	size_t phase = (size_t)(off % 4096) + (phase_ok ? 0 : 7);
	d->total = GUARD + phase + len + GUARD;
	d->base = mmap(NULL, d->total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	cr_assert(d->base != MAP_FAILED);
	memset(d->base, 0xA5, d->total);
	d->dst = d->base + GUARD + phase;
	d->len = len;
}

static void dst_check_guards(const struct dstbuf *d)
{
	for (uint8_t *p = d->base; p < d->dst; p++)
		cr_assert_eq(*p, 0xA5, "guard before dst overwritten at -%zu",
		             (size_t)(d->dst - p));
	for (uint8_t *p = d->dst + d->len; p < d->base + d->total; p++)
		cr_assert_eq(*p, 0xA5, "guard after dst overwritten at +%zu",
		             (size_t)(p - d->dst - d->len));
}

static void dst_free(struct dstbuf *d)
{
	munmap(d->base, d->total);
}

static struct wf_io_reader *reader_new(enum wf_io_backend b, unsigned depth, size_t chunk)
{
	struct wf_io_opts o = {
	    .backend = b, .queue_depth = depth, .chunk_size = chunk, .flags = WF_IO_OPT_NO_ENV};
	struct wf_io_reader *r = NULL;
	int ret = wf_io_reader_create(&o, &r);
	if (ret == -ENOSYS || ret == -EPERM)
		cr_skip_test("io_uring unavailable here (%s)", wf_err_name(ret));
	cr_assert_eq(ret, 0, "reader_create: %s", wf_strerror(ret));
	return r;
}

static void copy_and_check(struct wf_io_reader *r, const char *path, uint64_t seed, uint64_t off,
                           uint64_t len, bool phase_ok)
{
	struct wf_io_file *f = NULL;
	struct dstbuf d;
	int ret;

	cr_assert_eq(wf_io_file_open(r, path, 0, &f), 0);
	dst_alloc(&d, len, off, phase_ok);
	ret = wf_io_copy(r, f, off, len, d.dst, NULL);
	cr_assert_eq(ret, 0, "copy %s off %llu len %llu: %s", path, (unsigned long long)off,
	             (unsigned long long)len, wf_strerror(ret));
	size_t bad = mismatch(d.dst, seed, off, len);
	cr_assert_eq(bad, len, "byte %zu of off %llu len %llu differs", bad,
	             (unsigned long long)off, (unsigned long long)len);
	dst_check_guards(&d);
	dst_free(&d);
	wf_io_file_close(f);
}

static const uint64_t sizes[] = {0, 1, 4095, 4097, 3 * MIB + 17, 64 * MIB};

/* Whole files, and odd windows inside them, in and out of phase. */
static void sizes_matrix(enum wf_io_backend b, const char *dir, bool evict)
{
	struct wf_io_reader *r = reader_new(b, 0, 0);

	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		uint64_t size = sizes[i], seed = 1000 + i;
		char name[32];
		snprintf(name, sizeof(name), "f%zu", i);
		char *path = make_file(dir, name, size, seed, evict);
		copy_and_check(r, path, seed, 0, size, true);
		copy_and_check(r, path, seed, 0, size, false);
		const uint64_t offs[] = {1, 31, 32, 4095, 4096, 4097, 65536 + 32};
		for (size_t k = 0; k < sizeof(offs) / sizeof(offs[0]); k++) {
			if (offs[k] >= size)
				continue;
			uint64_t len = size - offs[k];
			copy_and_check(r, path, seed, offs[k], len, true);
			copy_and_check(r, path, seed, offs[k], len, k % 2);
			if (len > 9000)
				copy_and_check(r, path, seed, offs[k], len - 4099, true);
		}
		unlink(path);
		free(path);
	}
	wf_io_reader_destroy(r);
}

/* --- correctness over sizes and offsets ----------------------------------------------------- */

Test(io, sizes_uring_disk, .timeout = 120)
{
	char *dir = disk_dir();
	if (!dir)
		cr_skip_test("no disk-backed temporary directory");
	sizes_matrix(WF_IO_BACKEND_URING, dir, true);
	rm_dir(dir);
}

Test(io, sizes_pread_disk, .timeout = 120)
{
	char *dir = disk_dir();
	if (!dir)
		cr_skip_test("no disk-backed temporary directory");
	sizes_matrix(WF_IO_BACKEND_PREAD, dir, true);
	rm_dir(dir);
}

Test(io, sizes_uring_shm, .timeout = 120)
{
	char *dir = shm_dir();
	sizes_matrix(WF_IO_BACKEND_URING, dir, false);
	rm_dir(dir);
}

Test(io, sizes_pread_shm, .timeout = 120)
{
	char *dir = shm_dir();
	sizes_matrix(WF_IO_BACKEND_PREAD, dir, false);
	rm_dir(dir);
}

/* Small chunks and a shallow queue: many chunks per request, the backlog and slot reuse. */
Test(io, small_chunks_many_pieces, .timeout = 60)
{
	char *dir = disk_dir();
	if (!dir)
		cr_skip_test("no disk-backed temporary directory");
	char *path = make_file(dir, "f", 5 * MIB + 123, 7, true);
	for (int b = WF_IO_BACKEND_URING; b <= WF_IO_BACKEND_PREAD; b++) {
		struct wf_io_reader *r = reader_new(b, 3, 4096);
		copy_and_check(r, path, 7, 17, 5 * MIB + 100, true);
		copy_and_check(r, path, 7, 8192, 5 * MIB - 8192, false);
		wf_io_reader_destroy(r);
	}
	unlink(path);
	free(path);
	rm_dir(dir);
}

/* --- O_DIRECT and its fallbacks ------------------------------------------------------------ */

static void direct_on_disk(enum wf_io_backend b)
{
	char *dir = disk_dir();
	if (!dir)
		cr_skip_test("no disk-backed temporary directory");
	char *path = make_file(dir, "f", 8 * MIB + 100, 3, true);
	struct wf_io_reader *r = reader_new(b, 0, 0);
	struct wf_io_reader_info ri;
	struct wf_io_file_info fi;
	struct wf_io_file *f;
	struct wf_io_stats st;

	wf_io_reader_info(r, &ri);
	cr_assert(ri.direct);
	cr_assert_eq(ri.backend, b);
	if (b == WF_IO_BACKEND_URING)
		cr_assert(ri.fixed_files, "sparse file registration needs Linux 5.19");
	cr_assert_eq(wf_io_file_open(r, path, 0, &f), 0);
	wf_io_file_info(f, &fi);
	cr_assert(fi.direct, "O_DIRECT not in use on a disk file");
	cr_assert(fi.direct_align >= 512 && fi.direct_align <= 4096);
	wf_io_file_close(f);
	copy_and_check(r, path, 3, 32, 8 * MIB, true);
	wf_io_reader_stats(r, &st);
	cr_assert_geq(st.bytes_direct, 7 * MIB, "direct bytes %llu",
	              (unsigned long long)st.bytes_direct);
	cr_assert_lt(st.bytes_buffered, 8192);
	cr_assert_eq(st.direct_fallbacks, 0);
	wf_io_reader_destroy(r);
	unlink(path);
	free(path);
	rm_dir(dir);
}

Test(io, direct_on_disk_uring, .timeout = 60)
{
	direct_on_disk(WF_IO_BACKEND_URING);
}

Test(io, direct_on_disk_pread, .timeout = 60)
{
	direct_on_disk(WF_IO_BACKEND_PREAD);
}

/* Out of phase: the whole request is read buffered, and correctly. */
Test(io, out_of_phase_is_buffered, .timeout = 60)
{
	char *dir = disk_dir();
	if (!dir)
		cr_skip_test("no disk-backed temporary directory");
	char *path = make_file(dir, "f", 4 * MIB, 4, true);
	struct wf_io_reader *r = reader_new(WF_IO_BACKEND_AUTO, 0, 0);
	struct wf_io_stats st;

	copy_and_check(r, path, 4, 0, 4 * MIB, false);
	wf_io_reader_stats(r, &st);
	cr_assert_eq(st.bytes_direct, 0);
	cr_assert_eq(st.bytes_buffered, 4 * MIB);
	wf_io_reader_destroy(r);
	rm_dir(dir);
	free(path);
}

/* A cached file is copied from the page cache even where O_DIRECT is possible. */
Test(io, cached_body_read_buffered, .timeout = 60)
{
	char *dir = disk_dir();
	if (!dir)
		cr_skip_test("no disk-backed temporary directory");
	char *path = make_file(dir, "f", 8 * MIB, 5, false);
	struct wf_io_reader *r = reader_new(WF_IO_BACKEND_URING, 0, 0);
	struct wf_io_stats st;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	char tmp[65536];

	while (read(fd, tmp, sizeof(tmp)) > 0) /* make sure every page is cached */
		;
	close(fd);
	copy_and_check(r, path, 5, 0, 8 * MIB, true);
	wf_io_reader_stats(r, &st);
	if (st.cached_chunks == 0 && st.bytes_direct > 0)
		cr_skip_test("cachestat(2) unavailable");
	cr_assert_eq(st.bytes_buffered, 8 * MIB);
	cr_assert_eq(st.cached_chunks, 8);
	wf_io_reader_destroy(r);
	rm_dir(dir);
	free(path);
}

/* The probe itself (io/pagecache.h): a tmpfs file's pages are all in the page cache, an empty
 * range is cached without asking the kernel, and a bad descriptor is an error. */
Test(io, pagecache_probe, .timeout = 30)
{
	char *dir = shm_dir();
	char *path = make_file(dir, "f", 1 * MIB + 5, 9, false);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	cr_assert_geq(fd, 0);
	bool cached = false;
	int rc = wf_io_pagecache_probe(fd, 3, 1 * MIB, &cached);
	if (rc == -ENOSYS || rc == -EPERM)
		cr_skip_test("cachestat(2) unavailable (%s)", strerror(-rc));
	cr_assert_eq(rc, 0, "%s", strerror(-rc));
	cr_assert(cached, "a tmpfs file is all in the page cache");
	cached = false;
	cr_assert_eq(wf_io_pagecache_probe(fd, 7, 0, &cached), 0);
	cr_assert(cached, "an empty range is cached");
	close(fd);
	cr_assert_eq(wf_io_pagecache_probe(fd, 0, 4096, &cached), -EBADF);
	rm_dir(dir);
	free(path);
}

static void shm_buffered(enum wf_io_backend b)
{
	char *dir = shm_dir();
	char *path = make_file(dir, "f", 3 * MIB + 17, 6, false);
	struct wf_io_reader *r = reader_new(b, 0, 0);
	struct wf_io_file_info fi;
	struct wf_io_file *f;
	struct wf_io_stats st;

	cr_assert_eq(wf_io_file_open(r, path, 0, &f), 0);
	wf_io_file_info(f, &fi);
	cr_assert(!fi.direct, "tmpfs should be read buffered");
	wf_io_file_close(f);
	copy_and_check(r, path, 6, 32, 3 * MIB - 15, true);
	wf_io_reader_stats(r, &st);
	cr_assert_eq(st.bytes_direct, 0);
	cr_assert_eq(st.bytes_buffered, 3 * MIB - 15);
	wf_io_reader_destroy(r);
	rm_dir(dir);
	free(path);
}

Test(io, shm_buffered_uring, .timeout = 60)
{
	shm_buffered(WF_IO_BACKEND_URING);
}

Test(io, shm_buffered_pread, .timeout = 60)
{
	shm_buffered(WF_IO_BACKEND_PREAD);
}

/* A direct read refused with EINVAL (as some filesystems do at read time) turns O_DIRECT off for
 * the file and is redone buffered. */
static void direct_read_einval(enum wf_io_backend b)
{
	char *dir = disk_dir();
	if (!dir)
		cr_skip_test("no disk-backed temporary directory");
	char *path = make_file(dir, "f", 6 * MIB, 8, true);
	struct wf_io_reader *r = reader_new(b, 0, 0);
	struct wf__io_faults fl = {.direct_einval = 1};
	struct wf_io_file_info fi;
	struct wf_io_file *f;
	struct dstbuf d;
	struct wf_io_stats st;

	wf__io_reader_set_faults(r, &fl);
	cr_assert_eq(wf_io_file_open(r, path, 0, &f), 0);
	dst_alloc(&d, 6 * MIB, 0, true);
	cr_assert_eq(wf_io_copy(r, f, 0, 6 * MIB, d.dst, NULL), 0);
	cr_assert_eq(mismatch(d.dst, 8, 0, 6 * MIB), 6 * MIB);
	dst_check_guards(&d);
	wf_io_file_info(f, &fi);
	cr_assert(!fi.direct);
	wf_io_reader_stats(r, &st);
	cr_assert_eq(st.direct_fallbacks, 1);
	cr_assert_eq(st.bytes_direct + st.bytes_buffered, 6 * MIB);
	dst_free(&d);
	wf_io_file_close(f);
	wf_io_reader_destroy(r);
	rm_dir(dir);
	free(path);
}

Test(io, direct_read_einval_uring, .timeout = 60)
{
	direct_read_einval(WF_IO_BACKEND_URING);
}

Test(io, direct_read_einval_pread, .timeout = 60)
{
	direct_read_einval(WF_IO_BACKEND_PREAD);
}

Test(io, direct_open_refused, .timeout = 60)
{
	char *dir = disk_dir();
	if (!dir)
		cr_skip_test("no disk-backed temporary directory");
	char *path = make_file(dir, "f", 2 * MIB, 9, true);
	struct wf_io_reader *r = reader_new(WF_IO_BACKEND_URING, 0, 0);
	struct wf__io_faults fl = {.direct_open_einval = true};
	struct wf_io_file_info fi;
	struct wf_io_file *f;

	wf__io_reader_set_faults(r, &fl);
	cr_assert_eq(wf_io_file_open(r, path, 0, &f), 0);
	wf_io_file_info(f, &fi);
	cr_assert(!fi.direct);
	wf_io_file_close(f);
	copy_and_check(r, path, 9, 0, 2 * MIB, true);
	wf_io_reader_destroy(r);
	rm_dir(dir);
	free(path);
}

Test(io, no_direct_flag_and_env, .timeout = 60)
{
	char *dir = disk_dir();
	if (!dir)
		cr_skip_test("no disk-backed temporary directory");
	char *path = make_file(dir, "f", 4096, 10, true);
	struct wf_io_reader *r = reader_new(WF_IO_BACKEND_URING, 0, 0);
	struct wf_io_file_info fi;
	struct wf_io_file *f;

	cr_assert_eq(wf_io_file_open(r, path, WF_IO_FILE_NO_DIRECT, &f), 0);
	wf_io_file_info(f, &fi);
	cr_assert(!fi.direct);
	wf_io_file_close(f);
	wf_io_reader_destroy(r);

	setenv("WF_IO_DIRECT", "0", 1);
	cr_assert_eq(wf_io_reader_create(NULL, &r), 0);
	cr_assert_eq(wf_io_file_open(r, path, 0, &f), 0);
	wf_io_file_info(f, &fi);
	cr_assert(!fi.direct);
	wf_io_file_close(f);
	wf_io_reader_destroy(r);
	unsetenv("WF_IO_DIRECT");
	rm_dir(dir);
	free(path);
}

/* --- short reads and retried errors -------------------------------------------------------- */

static void faults(enum wf_io_backend b, const struct wf__io_faults *fl, bool evict)
{
	char *dir = disk_dir();
	if (!dir)
		cr_skip_test("no disk-backed temporary directory");
	char *path = make_file(dir, "f", 9 * MIB + 5, 11, evict);
	struct wf_io_reader *r = reader_new(b, 8, 256 * 1024);
	struct wf_io_stats st;

	wf__io_reader_set_faults(r, fl);
	copy_and_check(r, path, 11, 33, 9 * MIB - 40, true);
	copy_and_check(r, path, 11, 4096, 9 * MIB - 4096, false);
	wf_io_reader_stats(r, &st);
	if (fl->short_every)
		cr_assert_gt(st.short_reads, 0);
	else
		cr_assert_gt(st.retries, 0);
	wf_io_reader_destroy(r);
	rm_dir(dir);
	free(path);
}

Test(io, short_reads_uring, .timeout = 60)
{
	struct wf__io_faults fl = {.short_every = 3};
	faults(WF_IO_BACKEND_URING, &fl, true);
}

Test(io, short_reads_pread, .timeout = 60)
{
	struct wf__io_faults fl = {.short_every = 3};
	faults(WF_IO_BACKEND_PREAD, &fl, true);
}

Test(io, retried_errors_uring, .timeout = 60)
{
	struct wf__io_faults fl = {.eagain_every = 5, .eintr_every = 7, .ecanceled_every = 11};
	faults(WF_IO_BACKEND_URING, &fl, false);
}

Test(io, retried_errors_pread, .timeout = 60)
{
	struct wf__io_faults fl = {.eagain_every = 5, .eintr_every = 7, .ecanceled_every = 11};
	faults(WF_IO_BACKEND_PREAD, &fl, false);
}

/* An error that never stops is reported, not retried forever. */
Test(io, persistent_eagain_fails, .timeout = 30)
{
	char *dir = shm_dir();
	char *path = make_file(dir, "f", MIB, 12, false);
	struct wf_io_reader *r = reader_new(WF_IO_BACKEND_PREAD, 0, 0);
	struct wf__io_faults fl = {.eagain_every = 1};
	struct wf_io_file *f;
	struct dstbuf d;

	wf__io_reader_set_faults(r, &fl);
	cr_assert_eq(wf_io_file_open(r, path, 0, &f), 0);
	dst_alloc(&d, MIB, 0, true);
	cr_assert_eq(wf_io_copy(r, f, 0, MIB, d.dst, NULL), -EAGAIN);
	dst_free(&d);
	wf_io_reader_destroy(r);
	rm_dir(dir);
	free(path);
}

/* --- truncation and change ----------------------------------------------------------------- */

Test(io, shorter_than_requested, .timeout = 30)
{
	char *dir = shm_dir();
	char *path = make_file(dir, "f", 10000, 13, false);
	for (int b = WF_IO_BACKEND_URING; b <= WF_IO_BACKEND_PREAD; b++) {
		struct wf_io_reader *r = reader_new(b, 0, 0);
		struct wf_io_file *f;
		struct dstbuf d;
		struct wf_io_cqe cqe;

		cr_assert_eq(wf_io_file_open(r, path, 0, &f), 0);
		dst_alloc(&d, 20000, 0, true);
		cr_assert_eq(wf_io_copy(r, f, 0, 10001, d.dst, NULL), WF_ETRUNCATED);
		cr_assert_eq(wf_io_copy(r, f, 9000, 20000, d.dst, NULL), WF_ETRUNCATED);
		/* The asynchronous path reads up to EOF and says so. */
		cr_assert_eq(wf_io_submit(r, f, 5000, 6000, d.dst, 42), 0);
		cr_assert_eq(wf_io_reap(r, &cqe, 1, 1, -1), 1);
		cr_assert_eq(cqe.user_data, 42);
		cr_assert_eq(cqe.res, WF_ETRUNCATED);
		cr_assert_eq(cqe.bytes, 5000);
		cr_assert_eq(mismatch(d.dst, 13, 5000, 5000), 5000);
		dst_free(&d);
		wf_io_file_close(f);
		wf_io_reader_destroy(r);
	}
	rm_dir(dir);
	free(path);
}

struct trunc_ctx {
	const char *path;
	uint64_t at;
	int done;
};

static void truncate_in_progress(void *ctx, uint64_t done, uint64_t total)
{
	struct trunc_ctx *t = ctx;
	(void)total;
	if (!t->done && done >= t->at) {
		cr_assert_eq(truncate(t->path, (off_t)(t->at / 2)), 0);
		t->done = 1;
	}
}

static void truncate_midway(enum wf_io_backend b, bool disk)
{
	char *dir = disk ? disk_dir() : shm_dir();
	if (!dir)
		cr_skip_test("no disk-backed temporary directory");
	char *path = make_file(dir, "f", 64 * MIB, 14, disk);
	struct wf_io_reader *r = reader_new(b, 4, 0);
	struct trunc_ctx t = {.path = path, .at = 8 * MIB};
	struct wf_io_copy_ctl ctl = {
	    .progress = truncate_in_progress, .progress_ctx = &t, .progress_interval = MIB};
	struct wf_io_file *f;
	struct dstbuf d;
	int ret;

	cr_assert_eq(wf_io_file_open(r, path, 0, &f), 0);
	dst_alloc(&d, 64 * MIB, 0, true);
	ret = wf_io_copy(r, f, 0, 64 * MIB, d.dst, &ctl);
	cr_assert(t.done);
	cr_assert(ret == WF_ECHANGED || ret == WF_ETRUNCATED, "got %s", wf_err_name(ret));
	cr_assert_eq(wf_io_file_check(f), WF_ECHANGED);
	dst_check_guards(&d);
	dst_free(&d);
	wf_io_file_close(f);
	wf_io_reader_destroy(r);
	rm_dir(dir);
	free(path);
}

Test(io, truncate_midway_uring_disk, .timeout = 60)
{
	truncate_midway(WF_IO_BACKEND_URING, true);
}

Test(io, truncate_midway_pread_disk, .timeout = 60)
{
	truncate_midway(WF_IO_BACKEND_PREAD, true);
}

Test(io, truncate_midway_uring_shm, .timeout = 60)
{
	truncate_midway(WF_IO_BACKEND_URING, false);
}

Test(io, truncate_midway_pread_shm, .timeout = 60)
{
	truncate_midway(WF_IO_BACKEND_PREAD, false);
}

struct thread_trunc {
	const char *path;
	int fd;
};

static void *trunc_thread(void *arg)
{
	struct thread_trunc *t = arg;
	struct timespec ts = {0, 2 * 1000 * 1000};
	nanosleep(&ts, NULL);
	cr_assert_eq(truncate(t->path, 12345), 0);
	return NULL;
}

/* A concurrent truncation from another thread: whatever the timing, never a hang, never a bogus
 * success. */
Test(io, truncate_from_thread, .timeout = 60)
{
	char *dir = disk_dir();
	if (!dir)
		cr_skip_test("no disk-backed temporary directory");
	char *path = make_file(dir, "f", 64 * MIB, 15, true);
	for (int b = WF_IO_BACKEND_URING; b <= WF_IO_BACKEND_PREAD; b++) {
		struct wf_io_reader *r = reader_new(b, 0, 0);
		struct thread_trunc t = {.path = path};
		struct wf_io_file *f;
		struct dstbuf d;
		pthread_t th;
		int ret;

		cr_assert_eq(wf_io_file_open(r, path, 0, &f), 0);
		dst_alloc(&d, 64 * MIB, 0, true);
		cr_assert_eq(pthread_create(&th, NULL, trunc_thread, &t), 0);
		ret = wf_io_copy(r, f, 0, 64 * MIB, d.dst, NULL);
		pthread_join(th, NULL);
		/* The copy may finish before the truncate; the end check still sees the change
		 * unless the copy ended first, in which case the bytes are complete. */
		if (ret == 0)
			cr_assert_eq(mismatch(d.dst, 15, 0, 64 * MIB), 64 * MIB);
		else
			cr_assert(ret == WF_ECHANGED || ret == WF_ETRUNCATED, "got %s",
			          wf_err_name(ret));
		dst_free(&d);
		wf_io_file_close(f);
		wf_io_reader_destroy(r);
		free(path);
		path = make_file(dir, "f", 64 * MIB, 15, true);
	}
	rm_dir(dir);
	free(path);
}

static void touch_in_progress(void *ctx, uint64_t done, uint64_t total)
{
	struct trunc_ctx *t = ctx;
	(void)total;
	if (!t->done && done >= t->at) {
		struct timespec times[2] = {{0, UTIME_OMIT}, {12345, 0}};
		cr_assert_eq(utimensat(AT_FDCWD, t->path, times, 0), 0);
		t->done = 1;
	}
}

Test(io, mtime_change_midway, .timeout = 60)
{
	char *dir = shm_dir();
	char *path = make_file(dir, "f", 16 * MIB, 16, false);
	struct wf_io_reader *r = reader_new(WF_IO_BACKEND_AUTO, 2, 0);
	struct trunc_ctx t = {.path = path, .at = 2 * MIB};
	struct wf_io_copy_ctl ctl = {
	    .progress = touch_in_progress, .progress_ctx = &t, .progress_interval = MIB};
	struct wf_io_file *f;
	struct dstbuf d;

	cr_assert_eq(wf_io_file_open(r, path, 0, &f), 0);
	dst_alloc(&d, 16 * MIB, 0, true);
	cr_assert_eq(wf_io_copy(r, f, 0, 16 * MIB, d.dst, &ctl), WF_ECHANGED);
	dst_free(&d);
	wf_io_file_close(f);
	wf_io_reader_destroy(r);
	rm_dir(dir);
	free(path);
}

Test(io, replaced_before_copy, .timeout = 30)
{
	char *dir = shm_dir();
	char *path = make_file(dir, "f", MIB, 17, false);
	char *other = make_file(dir, "g", MIB, 18, false);
	struct wf_io_reader *r = reader_new(WF_IO_BACKEND_AUTO, 0, 0);
	struct wf_io_file *f;
	struct dstbuf d;

	cr_assert_eq(wf_io_file_open(r, path, 0, &f), 0);
	cr_assert_eq(wf_io_file_check(f), 0);
	cr_assert_eq(rename(other, path), 0);
	cr_assert_eq(wf_io_file_check(f), WF_ECHANGED);
	dst_alloc(&d, MIB, 0, true);
	cr_assert_eq(wf_io_copy(r, f, 0, MIB, d.dst, NULL), WF_ECHANGED);
	dst_free(&d);
	wf_io_file_close(f);
	wf_io_reader_destroy(r);
	rm_dir(dir);
	free(path);
	free(other);
}

/* --- cancel and progress ------------------------------------------------------------------- */

struct cancel_ctx {
	volatile int flag;
	uint64_t at;
	int64_t set_ns;
};

static void cancel_in_progress(void *ctx, uint64_t done, uint64_t total)
{
	struct cancel_ctx *c = ctx;
	(void)total;
	if (done >= c->at && !c->set_ns) {
		c->set_ns = wf__io_now_ns();
		__atomic_store_n(&c->flag, 1, __ATOMIC_RELEASE);
	}
}

static void cancel_large(enum wf_io_backend b)
{
	/* A sparse 1 GiB file: reads cost memory bandwidth only, and there is a lot to read. */
	char *dir = shm_dir();
	char *path = NULL;
	const uint64_t len = 1ull << 30;
	cr_assert(asprintf(&path, "%s/sparse", dir) > 0);
	int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
	cr_assert(fd >= 0 && ftruncate(fd, (off_t)len) == 0);
	close(fd);

	struct wf_io_reader *r = reader_new(b, 0, 0);
	struct cancel_ctx c = {.at = 16 * MIB};
	struct wf_io_copy_ctl ctl = {.progress = cancel_in_progress,
	                             .progress_ctx = &c,
	                             .progress_interval = MIB,
	                             .cancel = &c.flag};
	struct wf_io_file *f;
	void *dst = mmap(NULL, len, PROT_READ | PROT_WRITE,
	                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	cr_assert(dst != MAP_FAILED);
	cr_assert_eq(wf_io_file_open(r, path, 0, &f), 0);
	cr_assert_eq(wf_io_copy(r, f, 0, len, dst, &ctl), WF_ECANCELED);
	int64_t took_ms = (wf__io_now_ns() - c.set_ns) / 1000000;
	cr_assert(c.set_ns);
	/* WF_ECANCELED is the property (a copy that ignored the flag would have read it all and
	 * returned 0); how soon after the flag it returns depends on the machine's load. */
	cr_log_info("cancel took %lld ms", (long long)took_ms);

	/* Set before the start: nothing is read. */
	struct wf_io_stats before, after;
	wf_io_reader_stats(r, &before);
	cr_assert_eq(wf_io_copy(r, f, 0, len, dst, &ctl), WF_ECANCELED);
	wf_io_reader_stats(r, &after);
	cr_assert_eq(after.reads, before.reads);

	wf_io_file_close(f);
	wf_io_reader_destroy(r);
	munmap(dst, len);
	rm_dir(dir);
	free(path);
}

Test(io, cancel_large_uring, .timeout = 60)
{
	cancel_large(WF_IO_BACKEND_URING);
}

Test(io, cancel_large_pread, .timeout = 60)
{
	cancel_large(WF_IO_BACKEND_PREAD);
}

struct cancel_thread {
	volatile int *flag;
	int64_t set_ns;
};

static void *cancel_thread_fn(void *arg)
{
	struct cancel_thread *t = arg;
	struct timespec ts = {0, 20 * 1000 * 1000};
	nanosleep(&ts, NULL);
	t->set_ns = wf__io_now_ns();
	__atomic_store_n(t->flag, 1, __ATOMIC_RELEASE);
	return NULL;
}

/* Cancel from another thread while the copy waits on a disk. */
Test(io, cancel_from_thread, .timeout = 60)
{
	char *dir = disk_dir();
	if (!dir)
		cr_skip_test("no disk-backed temporary directory");
	const uint64_t len = 256 * MIB;
	char *path = make_file(dir, "f", len, 19, true);
	struct wf_io_reader *r = reader_new(WF_IO_BACKEND_AUTO, 0, 0);
	volatile int flag = 0;
	struct cancel_thread t = {.flag = &flag};
	struct wf_io_copy_ctl ctl = {.cancel = &flag};
	struct wf_io_file *f;
	struct dstbuf d;
	pthread_t th;
	int ret;

	cr_assert_eq(wf_io_file_open(r, path, 0, &f), 0);
	dst_alloc(&d, len, 0, true);
	cr_assert_eq(pthread_create(&th, NULL, cancel_thread_fn, &t), 0);
	ret = wf_io_copy(r, f, 0, len, d.dst, &ctl);
	int64_t end = wf__io_now_ns();
	pthread_join(th, NULL);
	if (ret == 0)
		cr_skip_test("the disk read 256 MiB in under 20 ms");
	cr_assert_eq(ret, WF_ECANCELED);
	/* At most queue_depth chunks were in flight from the disk when the flag was set. */
	cr_assert_lt((end - t.set_ns) / 1000000, 2000, "cancel took %lld ms",
	             (long long)((end - t.set_ns) / 1000000));
	dst_check_guards(&d);
	dst_free(&d);
	wf_io_file_close(f);
	wf_io_reader_destroy(r);
	rm_dir(dir);
	free(path);
}

struct progress_log {
	uint64_t n, last, total, calls, max_gap;
	bool monotonic;
};

static void log_progress(void *ctx, uint64_t done, uint64_t total)
{
	struct progress_log *p = ctx;
	if (p->calls && done <= p->last)
		p->monotonic = false;
	if (done - p->last > p->max_gap)
		p->max_gap = done - p->last;
	p->last = done;
	p->total = total;
	p->calls++;
}

Test(io, progress_monotonic, .timeout = 60)
{
	char *dir = shm_dir();
	const uint64_t len = 64 * MIB + 3;
	char *path = make_file(dir, "f", len, 20, false);
	for (int b = WF_IO_BACKEND_URING; b <= WF_IO_BACKEND_PREAD; b++) {
		struct wf_io_reader *r = reader_new(b, 0, 0);
		struct progress_log p = {.monotonic = true};
		struct wf_io_copy_ctl ctl = {
		    .progress = log_progress, .progress_ctx = &p, .progress_interval = 4 * MIB};
		struct wf_io_file *f;
		struct dstbuf d;

		cr_assert_eq(wf_io_file_open(r, path, 0, &f), 0);
		dst_alloc(&d, len, 0, true);
		cr_assert_eq(wf_io_copy(r, f, 0, len, d.dst, &ctl), 0);
		cr_assert(p.monotonic);
		cr_assert_eq(p.last, len);
		cr_assert_eq(p.total, len);
		cr_assert_geq(p.calls, 16, "only %llu progress calls", (unsigned long long)p.calls);
		cr_assert_leq(p.max_gap, 4 * MIB, "gap of %llu bytes between reports",
		              (unsigned long long)p.max_gap);
		cr_assert_eq(mismatch(d.dst, 20, 0, len), len);
		dst_free(&d);
		wf_io_file_close(f);
		wf_io_reader_destroy(r);
	}
	rm_dir(dir);
	free(path);
}

/* --- several files at once ----------------------------------------------------------------- */

Test(io, copy_many, .timeout = 60)
{
	char *dir = disk_dir();
	if (!dir)
		cr_skip_test("no disk-backed temporary directory");
	enum { N = 5 };
	const uint64_t lens[N] = {3 * MIB + 17, 1, 0, 10 * MIB, 4097};
	char *paths[N];
	struct wf_io_copy_job jobs[N];
	struct dstbuf d[N];
	struct wf_io_reader *r = reader_new(WF_IO_BACKEND_AUTO, 0, 0);
	struct progress_log p = {.monotonic = true};
	struct wf_io_copy_ctl ctl = {
	    .progress = log_progress, .progress_ctx = &p, .progress_interval = MIB};
	uint64_t total = 0;

	for (int i = 0; i < N; i++) {
		char name[8];
		snprintf(name, sizeof(name), "f%d", i);
		paths[i] = make_file(dir, name, lens[i] + 32 * i + 100, 30 + i, true);
		jobs[i] = (struct wf_io_copy_job){.offset = 32 * i, .len = lens[i]};
		cr_assert_eq(wf_io_file_open(r, paths[i], 0, &jobs[i].file), 0);
		dst_alloc(&d[i], lens[i], jobs[i].offset, i % 2 == 0);
		jobs[i].dst = d[i].dst;
		total += lens[i];
	}
	cr_assert_eq(wf_io_copy_many(r, jobs, N, &ctl), 0);
	cr_assert(p.monotonic);
	cr_assert_eq(p.last, total);
	for (int i = 0; i < N; i++) {
		cr_assert_eq(jobs[i].result, 0);
		cr_assert_eq(mismatch(d[i].dst, 30 + i, jobs[i].offset, lens[i]), lens[i]);
		dst_check_guards(&d[i]);
	}

	/* One job past EOF: it fails, the set fails with its error, nothing hangs. */
	jobs[3].len = lens[3] + 32 * 3 + 200;
	jobs[3].dst = malloc(jobs[3].len);
	cr_assert_eq(wf_io_copy_many(r, jobs, N, &ctl), WF_ETRUNCATED);
	cr_assert_eq(jobs[3].result, WF_ETRUNCATED);
	free(jobs[3].dst);
	for (int i = 0; i < N; i++) {
		wf_io_file_close(jobs[i].file);
		dst_free(&d[i]);
		free(paths[i]);
	}
	wf_io_reader_destroy(r);
	rm_dir(dir);
}

/* --- asynchronous submit / reap ------------------------------------------------------------ */

static void async_many(enum wf_io_backend b, bool disk)
{
	char *dir = disk ? disk_dir() : shm_dir();
	if (!dir)
		cr_skip_test("no disk-backed temporary directory");
	const uint64_t fsize = 32 * MIB + 999;
	char *path = make_file(dir, "f", fsize, 40, disk);
	struct wf_io_opts o = {.backend = b,
	                       .queue_depth = 16,
	                       .chunk_size = 64 * 1024,
	                       .max_requests = 37,
	                       .flags = WF_IO_OPT_NO_ENV};
	struct wf_io_reader *r;
	struct wf_io_file *f;
	enum { NREQ = 600 };
	uint64_t offs[NREQ], lens[NREQ];
	uint8_t *dsts[NREQ];
	bool seen[NREQ] = {0};
	uint64_t seed = 99, total = 0;
	unsigned next = 0, reaped = 0, eagain = 0;

	cr_assert_eq(wf_io_reader_create(&o, &r), 0);
	cr_assert_eq(wf_io_file_open(r, path, 0, &f), 0);
	for (unsigned i = 0; i < NREQ; i++) {
		seed = splitmix(seed);
		lens[i] = seed % (i % 10 == 0 ? 2 * MIB : 70000);
		offs[i] = splitmix(seed) % (fsize - lens[i]);
		total += lens[i] + 8192;
	}
	/* Disjoint slices of one buffer, in phase with the file offset or not. */
	uint8_t *buf = malloc(total);
	cr_assert(buf);
	size_t pos = 0;
	for (unsigned i = 0; i < NREQ; i++) {
		size_t start = (pos + 4095) / 4096 * 4096 + (i % 3 ? offs[i] % 4096 : 0);
		dsts[i] = buf + start;
		pos = start + lens[i];
	}
	cr_assert_leq(pos, total);
	while (reaped < NREQ) {
		/* Fill up to the request cap, then take completions one at a time. */
		while (next < NREQ) {
			int ret = wf_io_submit(r, f, offs[next], lens[next], dsts[next],
			                       0xABCD0000ull + next);
			if (ret == -EAGAIN) {
				eagain++;
				break;
			}
			cr_assert_eq(ret, 0);
			next++;
		}
		struct wf_io_cqe cqe;
		cr_assert_eq(wf_io_reap(r, &cqe, 1, 1, -1), 1);
		unsigned i = (unsigned)(cqe.user_data - 0xABCD0000ull);
		cr_assert_lt(i, NREQ);
		cr_assert(!seen[i]);
		seen[i] = true;
		cr_assert_eq(cqe.res, 0, "request %u: %s", i, wf_strerror(cqe.res));
		cr_assert_eq(cqe.bytes, lens[i]);
		cr_assert_eq(mismatch(dsts[i], 40, offs[i], lens[i]), lens[i]);
		reaped++;
	}
	cr_assert_gt(eagain, 0);
	cr_assert_eq(wf_io_outstanding(r), 0);
	wf_io_file_close(f);
	wf_io_reader_destroy(r);
	free(buf);
	rm_dir(dir);
	free(path);
}

Test(io, async_one_at_a_time_uring, .timeout = 60)
{
	async_many(WF_IO_BACKEND_URING, true);
}

Test(io, async_one_at_a_time_pread, .timeout = 60)
{
	async_many(WF_IO_BACKEND_PREAD, false);
}

/* Many requests outstanding at once, reaped one by one, user_data intact, -EAGAIN at the cap. */
static void async_deep(enum wf_io_backend b)
{
	char *dir = shm_dir();
	const uint64_t fsize = 8 * MIB;
	char *path = make_file(dir, "f", fsize, 41, false);
	struct wf_io_opts o = {.backend = b,
	                       .queue_depth = 8,
	                       .chunk_size = 4096,
	                       .max_requests = 256,
	                       .flags = WF_IO_OPT_NO_ENV};
	struct wf_io_reader *r;
	struct wf_io_file *f;
	enum { NREQ = 256, SZ = 20000 };
	uint8_t *buf = malloc((size_t)NREQ * SZ);
	bool seen[NREQ] = {0};

	cr_assert_eq(wf_io_reader_create(&o, &r), 0);
	cr_assert_eq(wf_io_file_open(r, path, 0, &f), 0);
	for (unsigned i = 0; i < NREQ; i++)
		cr_assert_eq(wf_io_submit(r, f, (uint64_t)i * 31111, SZ, buf + (size_t)i * SZ,
		                          (uint64_t)i << 32 | 7),
		             0);
	cr_assert_eq(wf_io_submit(r, f, 0, 1, buf, 1), -EAGAIN);
	cr_assert_eq(wf_io_outstanding(r), NREQ);
	for (unsigned k = 0; k < NREQ; k++) {
		struct wf_io_cqe cqe;
		cr_assert_eq(wf_io_reap(r, &cqe, 1, 1, 5ll * 1000000000), 1);
		unsigned i = (unsigned)(cqe.user_data >> 32);
		cr_assert_eq(cqe.user_data & 0xffffffff, 7);
		cr_assert(i < NREQ && !seen[i]);
		seen[i] = true;
		cr_assert_eq(cqe.res, 0);
		cr_assert_eq(mismatch(buf + (size_t)i * SZ, 41, (uint64_t)i * 31111, SZ), SZ);
	}
	struct wf_io_cqe cqe;
	int64_t t0 = wf__io_now_ns();
	cr_assert_eq(wf_io_reap(r, &cqe, 1, 1, -1), 0, "nothing outstanding: no wait");
	cr_assert_eq(wf_io_reap(r, &cqe, 1, 1, 0), 0);
	cr_assert_lt(wf__io_now_ns() - t0, 100000000);
	wf_io_file_close(f);
	wf_io_reader_destroy(r);
	free(buf);
	rm_dir(dir);
	free(path);
}

Test(io, async_deep_uring, .timeout = 60)
{
	async_deep(WF_IO_BACKEND_URING);
}

Test(io, async_deep_pread, .timeout = 60)
{
	async_deep(WF_IO_BACKEND_PREAD);
}

Test(io, async_batch_reap_and_zero_len, .timeout = 30)
{
	char *dir = shm_dir();
	char *path = make_file(dir, "f", MIB, 42, false);
	struct wf_io_reader *r = reader_new(WF_IO_BACKEND_AUTO, 0, 0);
	struct wf_io_file *f;
	uint8_t *buf = malloc(MIB);
	struct wf_io_cqe cqes[16];
	int got = 0;

	cr_assert_eq(wf_io_file_open(r, path, 0, &f), 0);
	cr_assert_eq(wf_io_submit(r, f, 0, 0, NULL, 100), 0);
	for (int i = 0; i < 10; i++)
		cr_assert_eq(wf_io_submit(r, f, (uint64_t)i * 65536, 65536, buf + i * 65536, i), 0);
	while (got < 11) {
		int n = wf_io_reap(r, cqes, 16, 11 - got, 1000000000);
		cr_assert_gt(n, 0);
		for (int k = 0; k < n; k++)
			cr_assert_eq(cqes[k].res, 0);
		got += n;
	}
	cr_assert_eq(mismatch(buf, 42, 0, 10 * 65536), 10 * 65536);
	wf_io_file_close(f);
	wf_io_reader_destroy(r);
	free(buf);
	rm_dir(dir);
	free(path);
}

static void async_cancel(enum wf_io_backend b)
{
	char *dir = shm_dir();
	char *path = make_file(dir, "f", 8 * MIB, 43, false);
	struct wf_io_opts o = {
	    .backend = b, .queue_depth = 2, .chunk_size = 4096, .flags = WF_IO_OPT_NO_ENV};
	struct wf_io_reader *r;
	struct wf_io_file *f;
	uint8_t *buf = malloc(8 * MIB);
	unsigned ok = 0, canceled = 0;

	cr_assert_eq(wf_io_reader_create(&o, &r), 0);
	cr_assert_eq(wf_io_file_open(r, path, 0, &f), 0);
	for (int i = 0; i < 64; i++)
		cr_assert_eq(wf_io_submit(r, f, (uint64_t)i * 131072, 131072, buf + i * 131072, i),
		             0);
	wf_io_cancel(r);
	for (int i = 0; i < 64; i++) {
		struct wf_io_cqe cqe;
		cr_assert_eq(wf_io_reap(r, &cqe, 1, 1, -1), 1);
		if (cqe.res == 0) {
			ok++;
			cr_assert_eq(mismatch(buf + cqe.user_data * 131072, 43,
			                      cqe.user_data * 131072, 131072),
			             131072);
		} else {
			cr_assert_eq(cqe.res, WF_ECANCELED);
			canceled++;
		}
	}
	cr_assert_gt(canceled, 0);
	cr_assert_eq(wf_io_outstanding(r), 0);
	wf_io_file_close(f);
	wf_io_reader_destroy(r);
	free(buf);
	rm_dir(dir);
	free(path);
}

Test(io, async_cancel_uring, .timeout = 30)
{
	async_cancel(WF_IO_BACKEND_URING);
}

Test(io, async_cancel_pread, .timeout = 30)
{
	async_cancel(WF_IO_BACKEND_PREAD);
}

/* Closing a file or destroying the reader with requests in flight is safe. */
Test(io, close_and_destroy_with_outstanding, .timeout = 30)
{
	char *dir = shm_dir();
	char *path = make_file(dir, "f", 4 * MIB, 44, false);
	for (int b = WF_IO_BACKEND_URING; b <= WF_IO_BACKEND_PREAD; b++) {
		struct wf_io_reader *r = reader_new(b, 4, 4096);
		struct wf_io_file *f;
		uint8_t *buf = malloc(4 * MIB);
		struct wf_io_cqe cqe;

		cr_assert_eq(wf_io_file_open(r, path, 0, &f), 0);
		cr_assert_eq(wf_io_submit(r, f, 0, 4 * MIB, buf, 1), 0);
		wf_io_file_close(f);
		cr_assert_eq(wf_io_reap(r, &cqe, 1, 1, -1), 1);
		cr_assert_eq(cqe.res, 0);
		cr_assert_eq(mismatch(buf, 44, 0, 4 * MIB), 4 * MIB);

		cr_assert_eq(wf_io_file_open(r, path, 0, &f), 0);
		cr_assert_eq(wf_io_submit(r, f, 0, 4 * MIB, buf, 2), 0);
		wf_io_reader_destroy(r); /* waits for the reads, frees the file */
		free(buf);
	}
	rm_dir(dir);
	free(path);
}

/* --- region fds and registered buffers ------------------------------------------------------ */

Test(io, open_fd_region, .timeout = 30)
{
	char *dir = shm_dir();
	char *path = make_file(dir, "region", 2 * MIB + 5, 45, false);
	struct wf_io_reader *r = reader_new(WF_IO_BACKEND_AUTO, 0, 0);
	struct wf_io_file *f;
	struct dstbuf d;
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	cr_assert(fd >= 0);
	cr_assert_eq(wf_io_file_open_fd(r, fd, 0, &f), 0);
	cr_assert(fcntl(fd, F_GETFD) >= 0, "caller's fd stays open");
	dst_alloc(&d, 2 * MIB, 5, true);
	cr_assert_eq(wf_io_copy(r, f, 5, 2 * MIB, d.dst, NULL), 0);
	cr_assert_eq(mismatch(d.dst, 45, 5, 2 * MIB), 2 * MIB);
	unlink(path); /* no path to check: an fd file is unchanged while its inode is */
	cr_assert_eq(wf_io_file_check(f), 0);
	wf_io_file_close(f);
	close(fd);
	dst_free(&d);
	wf_io_reader_destroy(r);
	rm_dir(dir);
	free(path);
}

Test(io, registered_buffer, .timeout = 60)
{
	char *dir = disk_dir();
	if (!dir)
		cr_skip_test("no disk-backed temporary directory");
	const uint64_t len = 16 * MIB;
	char *path = make_file(dir, "f", len, 46, true);
	struct wf_io_reader *r = reader_new(WF_IO_BACKEND_URING, 0, 0);
	struct wf_io_reader_info ri;
	struct wf_io_file *f;
	struct wf_io_stats st;
	struct dstbuf d;

	wf_io_reader_info(r, &ri);
	if (!ri.fixed_bufs)
		cr_skip_test("no registered buffers on this kernel");
	dst_alloc(&d, len, 0, true);
	int ret = wf_io_buffer_register(r, d.base, d.total);
	if (ret == -ENOMEM)
		cr_skip_test("RLIMIT_MEMLOCK too small to register 16 MiB");
	cr_assert_eq(ret, 0, "register: %s", wf_strerror(ret));
	cr_assert_eq(wf_io_buffer_register(r, d.base, d.total), -EEXIST);
	cr_assert_eq(wf_io_file_open(r, path, 0, &f), 0);
	cr_assert_eq(wf_io_copy(r, f, 0, len, d.dst, NULL), 0);
	cr_assert_eq(mismatch(d.dst, 46, 0, len), len);
	dst_check_guards(&d);
	wf_io_reader_stats(r, &st);
	cr_assert_geq(st.fixed_reads, 16);
	cr_assert_eq(wf_io_buffer_unregister(r, d.base), 0);
	cr_assert_eq(wf_io_buffer_unregister(r, d.base), WF_ENOT_FOUND);
	wf_io_file_close(f);
	wf_io_reader_destroy(r);
	dst_free(&d);
	rm_dir(dir);
	free(path);
}

/* --- backend choice and errors ------------------------------------------------------------- */

Test(io, force_pread_env, .timeout = 30)
{
	struct wf_io_reader *r;
	struct wf_io_reader_info ri;

	setenv("WF_IO_BACKEND", "pread", 1);
	cr_assert_eq(wf_io_reader_create(NULL, &r), 0);
	wf_io_reader_info(r, &ri);
	cr_assert_eq(ri.backend, WF_IO_BACKEND_PREAD);
	cr_assert_str_eq(ri.backend_name, "pread");
	cr_assert_eq(ri.uring_err, 0);
	cr_assert_eq(ri.threads, 16);
	wf_io_reader_destroy(r);

	/* An explicit choice wins over the environment; NO_ENV ignores it. */
	struct wf_io_opts o = {.backend = WF_IO_BACKEND_URING};
	cr_assert_eq(wf_io_reader_create(&o, &r), 0);
	wf_io_reader_info(r, &ri);
	cr_assert_eq(ri.backend, WF_IO_BACKEND_URING);
	wf_io_reader_destroy(r);
	o = (struct wf_io_opts){.flags = WF_IO_OPT_NO_ENV};
	cr_assert_eq(wf_io_reader_create(&o, &r), 0);
	wf_io_reader_info(r, &ri);
	cr_assert_eq(ri.backend, WF_IO_BACKEND_URING);
	wf_io_reader_destroy(r);

	setenv("WF_IO_BACKEND", "bogus", 1);
	cr_assert_eq(wf_io_reader_create(NULL, &r), WF_EINVAL);
	unsetenv("WF_IO_BACKEND");
}

Test(io, defaults_and_bad_options, .timeout = 30)
{
	struct wf_io_reader *r;
	struct wf_io_reader_info ri;
	struct wf_io_opts o = {.flags = WF_IO_OPT_NO_ENV};

	cr_assert_eq(wf_io_reader_create(&o, &r), 0);
	wf_io_reader_info(r, &ri);
	cr_assert_eq(ri.queue_depth, 64);
	cr_assert_eq(ri.chunk_size, 1 << 20);
	cr_assert_str_eq(wf_io_backend_name(ri.backend), ri.backend_name);
	wf_io_reader_destroy(r);
	wf_io_reader_destroy(NULL);
	wf_io_file_close(NULL);

	o.chunk_size = 5000; /* rounded up to 8192 */
	o.backend = WF_IO_BACKEND_PREAD;
	o.queue_depth = 3;
	cr_assert_eq(wf_io_reader_create(&o, &r), 0);
	wf_io_reader_info(r, &ri);
	cr_assert_eq(ri.chunk_size, 8192);
	cr_assert_eq(ri.threads, 3);
	wf_io_reader_destroy(r);

	o = (struct wf_io_opts){.queue_depth = WF_IO_QUEUE_DEPTH_MAX + 1};
	cr_assert_eq(wf_io_reader_create(&o, &r), WF_EINVAL);
	o = (struct wf_io_opts){.chunk_size = WF_IO_CHUNK_MAX + 1};
	cr_assert_eq(wf_io_reader_create(&o, &r), WF_EINVAL);
	o = (struct wf_io_opts){.backend = WF_IO_BACKEND_MAX};
	cr_assert_eq(wf_io_reader_create(&o, &r), WF_EINVAL);
	cr_assert_eq(wf_io_reader_create(NULL, NULL), WF_EINVAL);
}

Test(io, open_errors, .timeout = 30)
{
	struct wf_io_reader *r = reader_new(WF_IO_BACKEND_AUTO, 0, 0);
	struct wf_io_file *f = NULL;
	char *dir = shm_dir();
	char *path = make_file(dir, "f", 100, 47, false);
	uint8_t buf[200];

	cr_assert_eq(wf_io_file_open(r, "/nonexistent/wf/file", 0, &f), -ENOENT);
	cr_assert_eq(wf_io_file_open(r, dir, 0, &f), WF_EINVAL);
	cr_assert_eq(wf_io_file_open(r, "/dev/null", 0, &f), WF_EINVAL);
	cr_assert_eq(wf_io_file_open_fd(r, -1, 0, &f), -EBADF);
	cr_assert_eq(wf_io_file_open_fd(r, 1000000, 0, &f), -EBADF);
	cr_assert_null(f);

	cr_assert_eq(wf_io_file_open(r, path, 0, &f), 0);
	cr_assert_eq(wf_io_submit(r, f, 0, 10, NULL, 0), WF_EINVAL);
	cr_assert_eq(wf_io_submit(r, f, UINT64_MAX - 5, 10, buf, 0), WF_EOVERFLOW);
	cr_assert_eq(wf_io_copy(r, f, UINT64_MAX - 5, 10, buf, NULL), WF_EOVERFLOW);
	cr_assert_eq(wf_io_copy(r, f, 0, 101, buf, NULL), WF_ETRUNCATED);
	cr_assert_eq(wf_io_copy(r, f, 0, 100, buf, NULL), 0);
	cr_assert_eq(mismatch(buf, 47, 0, 100), 100);
	cr_assert_eq(wf_io_copy(r, f, 100, 0, NULL, NULL), 0);
	wf_io_file_close(f);
	wf_io_reader_destroy(r);
	rm_dir(dir);
	free(path);
}

/* AUTO with io_uring forbidden (as seccomp or kernel.io_uring_disabled do) falls back to pread
 * and says why. A seccomp filter in this forked test process stands in for both; the sysctl would
 * affect every process on the host. */
Test(io, auto_falls_back_when_uring_forbidden, .timeout = 30)
{
	struct sock_filter prog[] = {
	    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
	    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
	    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
	    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
	};
	struct sock_fprog fprog = {.len = sizeof(prog) / sizeof(prog[0]), .filter = prog};
	struct wf_io_reader *r = NULL;
	struct wf_io_reader_info ri;
	struct wf_io_opts o = {.flags = WF_IO_OPT_NO_ENV};

	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
	    prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &fprog) != 0)
		cr_skip_test("cannot install a seccomp filter");
	cr_assert_eq(wf_io_reader_create(&o, &r), 0);
	wf_io_reader_info(r, &ri);
	cr_assert_eq(ri.backend, WF_IO_BACKEND_PREAD);
	cr_assert_eq(ri.uring_err, -EPERM);
	wf_io_reader_destroy(r);

	o.backend = WF_IO_BACKEND_URING;
	cr_assert_eq(wf_io_reader_create(&o, &r), -EPERM);

	/* The fallback reader works. */
	char *dir = shm_dir();
	char *path = make_file(dir, "f", 3 * MIB + 17, 48, false);
	o.backend = WF_IO_BACKEND_AUTO;
	cr_assert_eq(wf_io_reader_create(&o, &r), 0);
	copy_and_check(r, path, 48, 17, 3 * MIB, true);
	wf_io_reader_destroy(r);
	rm_dir(dir);
	free(path);
}
