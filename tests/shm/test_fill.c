/* The standard fill (shm/fill.h) through the region API: bytes and streaming checksums equal what
 * the library computes itself, for chunk sizes that cut tensors anywhere, with and without
 * WF_SHM_ATTACH_STREAM, on both libwfio backends and with O_DIRECT; files that change; cancel.
 * Floors go to /dev/shm (tmpfs: the pwrite path) where it exists. */
#include "shmtest.h"

#include "base/error.h"
#include "common/wftest.h"
#include "shm/fill.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#define TMPFS_MAGIC_ 0x01021994

static char *tmp, *floor_dir, *model_dir;
static struct wf_shm_config cfg;

static void setup(void)
{
	tmp = wft_tmpdir("shm-fill");
	cr_assert(asprintf(&model_dir, "%s/model", tmp) > 0);
	cr_assert_eq(mkdir(model_dir, 0755), 0);
	struct statfs sfs;
	if (statfs("/dev/shm", &sfs) == 0 && (uint32_t)sfs.f_type == TMPFS_MAGIC_) {
		floor_dir = strdup("/dev/shm/wftest-fill-XXXXXX");
		cr_assert_not_null(mkdtemp(floor_dir));
	} else {
		cr_assert(asprintf(&floor_dir, "%s/floor", tmp) > 0);
	}
	memset(&cfg, 0, sizeof(cfg));
	cfg.dir = floor_dir;
}

static void teardown(void)
{
	wft_rmtree(floor_dir);
	wft_rmtree(tmp);
	free(floor_dir);
	free(model_dir);
}

/* The standard fill, noting whether it hashed in stream. */
struct wrap {
	struct wf_shm_fill_io *fi;
	bool checksums_set;
};

static int wrapped_fill(void *ctx, const struct wf_shm_fill *job, struct wf_diag *diag)
{
	struct wrap *w = ctx;
	int rc = wf_shm_fill_from_files(w->fi, job, diag);
	w->checksums_set = *job->checksums_set;
	return rc;
}

/* Materializes m with the standard fill and checks the result against the library's own
 * hashing: verify() re-hashes every tensor and compares with the table. */
static void fill_and_check(const char *what, struct wf_model *m, struct wf_shm_fill_io *fi,
                           unsigned flags)
{
	struct wf_digest d;
	struct wf_shm_region *r = NULL;
	struct wf_diag diag;
	char why[256];

	shmt_digest(m, &d);
	wf_diag_clear(&diag);
	struct wrap w = {.fi = fi};
	int rc = wf_shm_region_attach(&cfg, &d, m, WF_SHM_ATTACH_AGENT | flags, wrapped_fill, &w,
	                              &r, &diag);
	cr_assert_eq(rc, 0, "%s: %s", what, wf_diag_str(&diag, rc));
	cr_assert(wf_shm_region_materialized(r), "%s", what);
	cr_assert(w.checksums_set, "%s: the fill hashed while streaming", what);
	wf_diag_clear(&diag);
	rc = wf_shm_region_verify(r, &diag);
	cr_assert_eq(rc, 0, "%s: %s", what, wf_diag_str(&diag, rc));
	cr_assert_eq(shmt_check_bytes(r, m, why, sizeof(why)), 0, "%s: %s", what, why);
	/* a reader sees the same */
	struct wf_shm_region *rr = NULL;
	cr_assert_eq(
	    wf_shm_region_attach(&cfg, &d, NULL, WF_SHM_ATTACH_READER, NULL, NULL, &rr, NULL), 0,
	    "%s", what);
	cr_assert_eq(shmt_check_bytes(rr, m, why, sizeof(why)), 0, "%s: %s", what, why);
	wf_shm_region_detach(rr);
	wf_shm_region_detach(r);
	cr_assert_eq(shmt_count_entries(floor_dir, NULL, 0), 0, "%s: nothing left", what);
}

Test(fill, chunks_cut_tensors_anywhere, .init = setup, .fini = teardown)
{
	/* tensors of 12000 + 96k bytes at 32-byte alignment after odd-length headers: with these
	 * chunk sizes, boundaries fall inside tensors, between them, and on their edges */
	struct shmt_spec spec = {
	    .n_files = 3, .tensors_per_file = 7, .tensor_bytes = 12000, .seed = 21};
	struct wf_model *m = shmt_model_make(model_dir, &spec, true);
	cr_assert_not_null(m);
	static const size_t chunks[] = {4096, 8192, 12288, 65536, 1 << 20};
	static const size_t rings[] = {0, 4096 * 2, 4096 * 3, 65536 * 4, 1 << 20};
	for (size_t c = 0; c < sizeof(chunks) / sizeof(chunks[0]); c++) {
		for (unsigned stream = 0; stream < 2; stream++) {
			struct wf_shm_fill_io fi = {
			    .io = {.chunk_size = chunks[c], .flags = WF_IO_OPT_NO_ENV},
			    .ring_bytes = rings[c]};
			char what[96];
			snprintf(what, sizeof(what), "chunk %zu, ring %zu, %s", chunks[c], rings[c],
			         stream ? "STREAM" : "reserved first");
			fill_and_check(what, m, &fi, stream ? WF_SHM_ATTACH_STREAM : 0);
		}
	}
	shmt_model_free(m);
}

Test(fill, backends_and_direct_io, .init = setup, .fini = teardown)
{
	struct shmt_spec spec = {
	    .n_files = 2, .tensors_per_file = 5, .tensor_bytes = 70016, .seed = 22};
	struct wf_model *m = shmt_model_make(model_dir, &spec, true);
	cr_assert_not_null(m);
	static const struct {
		const char *what;
		enum wf_io_backend backend;
		unsigned flags;
	} cases[] = {
	    {"io_uring, page cache", WF_IO_BACKEND_AUTO, 0},
	    /* the files were just written: make the body go direct anyway */
	    {"io_uring, O_DIRECT", WF_IO_BACKEND_AUTO, WF_IO_OPT_NO_CACHE_PROBE},
	    {"io_uring, buffered", WF_IO_BACKEND_AUTO,
	     WF_IO_OPT_NO_CACHE_PROBE | WF_IO_OPT_NO_DIRECT},
	    {"pread pool", WF_IO_BACKEND_PREAD, 0},
	    {"pread pool, O_DIRECT", WF_IO_BACKEND_PREAD, WF_IO_OPT_NO_CACHE_PROBE},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct wf_shm_fill_io fi = {.io = {.backend = cases[i].backend,
		                                   .chunk_size = 65536,
		                                   .flags = cases[i].flags | WF_IO_OPT_NO_ENV}};
		fill_and_check(cases[i].what, m, &fi, WF_SHM_ATTACH_STREAM);
	}
	shmt_model_free(m);
}

struct progress {
	uint64_t last, total, calls;
	bool monotonic;
};

static void on_progress(void *ctx, uint64_t done, uint64_t total)
{
	struct progress *p = ctx;
	if (done < p->last || done > total)
		p->monotonic = false;
	p->last = done;
	p->total = total;
	p->calls++;
}

Test(fill, progress_ends_at_total, .init = setup, .fini = teardown)
{
	struct shmt_spec spec = {
	    .n_files = 2, .tensors_per_file = 3, .tensor_bytes = 4096, .seed = 23};
	struct wf_model *m = shmt_model_make(model_dir, &spec, true);
	struct progress p = {.monotonic = true};
	struct wf_shm_fill_io fi = {.io = {.chunk_size = 4096, .flags = WF_IO_OPT_NO_ENV},
	                            .progress = on_progress,
	                            .progress_ctx = &p};
	fill_and_check("progress", m, &fi, WF_SHM_ATTACH_STREAM);
	cr_assert(p.monotonic);
	cr_assert_gt(p.calls, 0);
	cr_assert_eq(p.last, p.total, "the last report is the total");
	shmt_model_free(m);
}

/* before_copy hooks: damage a file, or cancel, after the start checks. */
struct hook {
	const char *path;
	volatile int cancel;
	bool append;
};

static void before_copy(void *ctx, uint64_t total)
{
	struct hook *h = ctx;
	(void)total;
	if (h->path) {
		int fd = open(h->path, O_WRONLY | O_APPEND | O_CLOEXEC);
		cr_assert_geq(fd, 0);
		if (h->append)
			cr_assert_eq(write(fd, "more", 4), 4);
		else
			cr_assert_eq(ftruncate(fd, 100), 0);
		close(fd);
	}
	if (!h->path)
		__atomic_store_n(&h->cancel, 1, __ATOMIC_RELEASE);
}

static void expect_failure(const char *what, struct wf_model *m, struct hook *h, int want,
                           const char *in_msg)
{
	struct wf_digest d;
	struct wf_shm_region *r = NULL;
	struct wf_diag diag;
	struct wf_shm_fill_io fi = {.io = {.chunk_size = 8192, .flags = WF_IO_OPT_NO_ENV},
	                            .cancel = &h->cancel,
	                            .before_copy = before_copy,
	                            .before_copy_ctx = h};
	shmt_digest(m, &d);
	wf_diag_clear(&diag);
	int rc = wf_shm_region_attach(&cfg, &d, m, WF_SHM_ATTACH_AGENT | WF_SHM_ATTACH_STREAM,
	                              wf_shm_fill_from_files, &fi, &r, &diag);
	cr_assert_eq(rc, want, "%s: %s (%s)", what, wf_err_name(rc), wf_diag_str(&diag, rc));
	cr_assert(strstr(diag.msg, in_msg), "%s: %s", what, diag.msg);
	char names[512];
	cr_assert_eq(shmt_count_entries(floor_dir, names, sizeof(names)), 0, "%s: left %s", what,
	             names);
}

Test(fill, changed_files_and_cancel, .init = setup, .fini = teardown)
{
	struct shmt_spec spec = {
	    .n_files = 2, .tensors_per_file = 4, .tensor_bytes = 40000 & ~31, .seed = 24};
	struct wf_model *m = shmt_model_make(model_dir, &spec, true);
	struct hook h = {0};
	expect_failure("cancel", m, &h, WF_ECANCELED, "cancel");

	h = (struct hook){.path = m->files[1].path, .append = true};
	expect_failure("grown under the copy", m, &h, WF_ECHANGED, m->files[1].path);

	shmt_model_free(m);
	m = shmt_model_make(model_dir, &spec, true);
	h = (struct hook){.path = m->files[0].path, .append = false};
	expect_failure("truncated under the copy", m, &h, WF_ECHANGED, m->files[0].path);
	shmt_model_free(m);

	/* changed before the attach: refused when the files are opened */
	m = shmt_model_make(model_dir, &spec, true);
	struct timespec ts[2] = {{0, UTIME_OMIT}, {12345, 0}};
	cr_assert_eq(utimensat(AT_FDCWD, m->files[0].path, ts, 0), 0);
	h = (struct hook){0};
	struct wf_digest d;
	struct wf_shm_region *r = NULL;
	struct wf_shm_fill_io fi = {0};
	shmt_digest(m, &d);
	cr_assert_eq(wf_shm_region_attach(&cfg, &d, m, WF_SHM_ATTACH_AGENT | WF_SHM_ATTACH_STREAM,
	                                  wf_shm_fill_from_files, &fi, &r, NULL),
	             WF_ECHANGED);
	cr_assert_eq(shmt_count_entries(floor_dir, NULL, 0), 0);
	shmt_model_free(m);
}

/* A fill that writes with wf_shm_fill_write() but leaves the checksums to the library. */
static int write_fill(void *ctx, const struct wf_shm_fill *job, struct wf_diag *diag)
{
	(void)ctx;
	for (uint32_t i = 0; i < job->n_files; i++) {
		const struct wf_shm_fill_file *f = &job->files[i];
		uint8_t *buf = malloc(f->copy_length ? f->copy_length : 1);
		int fd = open(f->path, O_RDONLY | O_CLOEXEC);
		cr_assert_geq(fd, 0);
		cr_assert_eq(pread(fd, buf, f->copy_length, (off_t)f->src_offset),
		             (ssize_t)f->copy_length);
		close(fd);
		int rc = wf_shm_fill_write(job, f->floor_offset, buf, (size_t)f->copy_length);
		free(buf);
		if (rc < 0)
			return wf_diag_set(diag, rc, "write");
	}
	/* outside the data area: refused */
	uint8_t b = 0;
	cr_assert_eq(wf_shm_fill_write(job, 0, &b, 1), WF_EINVAL);
	cr_assert_eq(wf_shm_fill_write(job, job->region_size, &b, 1), WF_EINVAL);
	cr_assert_eq(wf_shm_fill_write(job, UINT64_MAX, &b, 2), WF_EINVAL);
	return 0;
}

Test(fill, fill_write_without_checksums, .init = setup, .fini = teardown)
{
	struct shmt_spec spec = {
	    .n_files = 3, .tensors_per_file = 3, .tensor_bytes = 5000 & ~31, .seed = 25};
	struct wf_model *m = shmt_model_make(model_dir, &spec, true);
	struct wf_digest d;
	struct wf_shm_region *r = NULL;
	struct wf_diag diag;
	char why[256];
	shmt_digest(m, &d);
	for (unsigned stream = 0; stream < 2; stream++) {
		wf_diag_clear(&diag);
		int rc = wf_shm_region_attach(
		    &cfg, &d, m, WF_SHM_ATTACH_AGENT | (stream ? WF_SHM_ATTACH_STREAM : 0),
		    write_fill, NULL, &r, &diag);
		cr_assert_eq(rc, 0, "%s", wf_diag_str(&diag, rc));
		cr_assert_eq(wf_shm_region_verify(r, NULL), 0, "the library hashed");
		cr_assert_eq(shmt_check_bytes(r, m, why, sizeof(why)), 0, "%s", why);
		wf_shm_region_detach(r);
	}
	shmt_model_free(m);
}

Test(fill, partly_cached_files, .init = setup, .fini = teardown)
{
	/* every other 64 KiB of each file evicted: chunks alternate between the page cache (read
	 * by the fill itself) and the reader (O_DIRECT where the file system has it), in order */
	struct shmt_spec spec = {
	    .n_files = 2, .tensors_per_file = 6, .tensor_bytes = 100000 & ~31, .seed = 27};
	struct wf_model *m = shmt_model_make(model_dir, &spec, true);
	cr_assert_not_null(m);
	for (uint32_t i = 0; i < m->n_files; i++) {
		int fd = open(m->files[i].path, O_RDONLY | O_CLOEXEC);
		cr_assert_geq(fd, 0);
		cr_assert_eq(fdatasync(fd), 0);
		for (off_t o = 0; o < (off_t)m->files[i].size; o += 2 * 65536)
			posix_fadvise(fd, o, 65536, POSIX_FADV_DONTNEED);
		close(fd);
	}
	struct wf_shm_fill_io fi = {.io = {.chunk_size = 65536, .flags = WF_IO_OPT_NO_ENV}};
	fill_and_check("partly cached", m, &fi, WF_SHM_ATTACH_STREAM);
	shmt_model_free(m);
}

Test(fill, unusual_tensor_layouts, .init = setup, .fini = teardown)
{
	/* out of offset order in the model, overlapping, empty (also at the very end of a file's
	 * data): the streaming checksums still match the library's */
	struct shmt_spec spec = {
	    .n_files = 2, .tensors_per_file = 5, .tensor_bytes = 9000 & ~31, .seed = 26};
	struct wf_model *m = shmt_model_make(model_dir, &spec, true);
	cr_assert_not_null(m);
	struct wf_tensor *t = m->tensors;
	t[1].offset = t[0].offset + 64; /* overlaps tensor 0 */
	t[2].nbytes = 0;                /* empty, mid-file */
	t[9].offset += t[9].nbytes;     /* empty, at the end of file 1's data */
	t[9].nbytes = 0;
	struct wf_tensor tmp_t = t[3]; /* model order is not offset order */
	t[3] = t[7];
	t[7] = tmp_t;
	tmp_t = t[0];
	t[0] = t[4];
	t[4] = tmp_t;
	for (size_t c = 0; c < 3; c++) {
		struct wf_shm_fill_io fi = {
		    .io = {.chunk_size = (size_t)4096 << c, .flags = WF_IO_OPT_NO_ENV}};
		fill_and_check("unusual layouts", m, &fi, WF_SHM_ATTACH_STREAM);
	}
	shmt_model_free(m);
}

Test(fill, file_without_data, .init = setup, .fini = teardown)
{
	/* the middle file's data section is empty: nothing to copy from it, and the tensors of
	 * the files around it are still hashed in stream */
	struct shmt_spec spec = {
	    .n_files = 3, .tensors_per_file = 1, .tensor_bytes = 8192, .seed = 28};
	struct wf_model *m = shmt_model_make(model_dir, &spec, true);
	cr_assert_not_null(m);
	m->files[1].data_size = 0;
	free(m->tensors[1].name);
	m->tensors[1] = m->tensors[2];
	m->n_tensors = 2;
	struct wf_shm_fill_io fi = {.io = {.flags = WF_IO_OPT_NO_ENV}};
	fill_and_check("file without data", m, &fi, WF_SHM_ATTACH_STREAM);
	shmt_model_free(m);
}
