#include "wtest.h"

#include "common/wftest.h"

#include "base/error.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static uint64_t splitmix(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static int write_random(const char *path, uint64_t size, uint64_t seed)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	static uint8_t buf[1 << 20];
	uint64_t s = seed;

	if (fd < 0)
		return -1;
	for (uint64_t off = 0; off < size;) {
		size_t n = size - off < sizeof(buf) ? (size_t)(size - off) : sizeof(buf);
		for (size_t i = 0; i < n; i += 8) {
			uint64_t v = splitmix(&s);
			memcpy(buf + i, &v, n - i < 8 ? n - i : 8);
		}
		for (size_t done = 0; done < n;) {
			ssize_t w = write(fd, buf + done, n - done);
			if (w < 0 && errno == EINTR)
				continue;
			if (w <= 0) {
				close(fd);
				return -1;
			}
			done += (size_t)w;
		}
		off += n;
	}
	return close(fd);
}

void wt_model_free(struct wf_model *m)
{
	if (!m)
		return;
	for (uint32_t i = 0; i < m->n_files; i++)
		free(m->files[i].path);
	for (uint32_t i = 0; i < m->n_tensors; i++)
		free(m->tensors[i].name);
	free(m->files);
	free(m->tensors);
	free(m);
}

struct wf_model *wt_model_make(const char *dir, const struct wt_spec *spec)
{
	struct wf_model *m = calloc(1, sizeof(*m));
	size_t per_file;
	uint32_t t = 0;

	if (!m)
		return NULL;
	m->format = WF_MODEL_FORMAT_GGUF;
	m->n_files = spec->n_files;
	m->files = calloc(spec->n_files, sizeof(*m->files));
	m->n_tensors = (uint32_t)spec->n_tensors;
	m->tensors = calloc(spec->n_tensors ? spec->n_tensors : 1, sizeof(*m->tensors));
	if (!m->files || !m->tensors)
		goto fail;
	per_file = (spec->n_tensors + spec->n_files - 1) / spec->n_files;
	for (unsigned i = 0; i < spec->n_files; i++) {
		struct wf_model_file *f = &m->files[i];
		uint64_t hdr = 1000 + 333 * i + spec->seed % 100;
		uint64_t off = (hdr + 31) & ~31ull;
		size_t end = i + 1 == spec->n_files ? spec->n_tensors : (i + 1) * per_file;
		struct stat st;

		if (asprintf(&f->path, "%s/%s-%05u.bin", dir, spec->tag ? spec->tag : "model", i) <
		    0) {
			f->path = NULL;
			goto fail;
		}
		f->data_offset = off;
		f->alignment = 32;
		f->gguf_version = 3;
		for (; t < end; t++) {
			struct wf_tensor *ts = &m->tensors[t];
			if (asprintf(&ts->name, "blk.%u.t%u.weight", i, t) < 0) {
				ts->name = NULL;
				goto fail;
			}
			ts->nbytes = spec->sizes[t];
			ts->dtype = WF_DTYPE_I8;
			ts->n_dims = 1;
			ts->ne[0] = (int64_t)ts->nbytes;
			for (int d = 1; d < WF_MODEL_MAX_DIMS; d++)
				ts->ne[d] = 1;
			ts->file = i;
			ts->offset = off;
			ts->tclass = WF_TENSOR_DENSE;
			off = (off + ts->nbytes + 31) & ~31ull;
			m->total_bytes += ts->nbytes;
			m->dense_bytes += ts->nbytes;
			f->n_tensors++;
		}
		f->data_size = off - f->data_offset;
		if (write_random(f->path, off + 777, (uint64_t)spec->seed * 1000003u + i) < 0)
			goto fail;
		if (stat(f->path, &st) != 0)
			goto fail;
		f->size = (uint64_t)st.st_size;
		f->mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
	}
	return m;
fail:
	wt_model_free(m);
	return NULL;
}

struct wf_model *wt_model_uniform(const char *dir, const char *tag, size_t n_tensors,
                                  uint64_t bytes, uint32_t seed)
{
	uint64_t *sizes = calloc(n_tensors ? n_tensors : 1, sizeof(*sizes));
	struct wf_model *m;

	cr_assert(sizes);
	for (size_t i = 0; i < n_tensors; i++)
		sizes[i] = bytes;
	m = wt_model_make(dir, &(struct wt_spec){tag, 1, sizes, n_tensors, seed});
	free(sizes);
	cr_assert(m, "model %s in %s", tag, dir);
	return m;
}

int wt_fill(void *ctx, const struct wf_shm_fill *job, struct wf_diag *diag)
{
	(void)ctx;
	for (uint32_t i = 0; i < job->n_files; i++) {
		const struct wf_shm_fill_file *f = &job->files[i];
		int fd = open(f->path, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			return wf_diag_set(diag, -errno, "open %s", f->path);
		for (uint64_t off = 0; off < f->copy_length;) {
			ssize_t r =
			    pread(fd, (uint8_t *)f->dst + off, (size_t)(f->copy_length - off),
			          (off_t)(f->src_offset + off));
			if (r < 0 && errno == EINTR)
				continue;
			if (r <= 0) {
				close(fd);
				return wf_diag_set(diag, r < 0 ? -errno : WF_ETRUNCATED,
				                   "read %s at %" PRIu64, f->path,
				                   f->src_offset + off);
			}
			off += (uint64_t)r;
		}
		close(fd);
	}
	return 0;
}

struct wf_shm_region *wt_floor_create(const struct wf_shm_config *cfg, const struct wf_model *m)
{
	struct wf_shm_region *r = NULL;
	struct wf_digest dg;
	struct wf_diag diag = {0};
	int ret;

	wf_model_digest(m, &dg);
	ret = wf_shm_region_attach(cfg, &dg, m, WF_SHM_ATTACH_AGENT, wt_fill, NULL, &r, &diag);
	cr_assert_eq(ret, 0, "floor attach: %s", wf_diag_str(&diag, ret));
	return r;
}

struct wf_device *wt_device(const char *spec)
{
	struct wf_diag diag = {0};
	struct wf_device *dev = NULL;
	int ret = wf_device_open(spec, &dev, &diag);
	cr_assert_eq(ret, 0, "open %s: %s", spec, wf_diag_str(&diag, ret));
	return dev;
}

size_t wt_mem_free(struct wf_device *dev)
{
	size_t f = 0;
	cr_assert_eq(wf_device_mem_info(dev, &f, NULL, NULL), 0);
	return f;
}

char *wt_shm_dir(const char *tag)
{
	char *path = NULL;

	if (asprintf(&path, "/dev/shm/wf-%s-XXXXXX", tag) < 0)
		cr_assert_fail("asprintf");
	if (mkdtemp(path))
		return path;
	free(path);
	return wft_tmpdir(tag);
}

double wt_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void wt_sleep_ms(unsigned ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}
