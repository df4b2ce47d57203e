#include "shmtest.h"

#include "base/error.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static uint64_t splitmix(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static int write_all(int fd, const void *p, size_t n)
{
	const uint8_t *b = p;
	while (n) {
		ssize_t w = write(fd, b, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		b += w;
		n -= (size_t)w;
	}
	return 0;
}

static int write_random(const char *path, uint64_t size, uint64_t seed)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return -1;
	uint8_t buf[65536];
	uint64_t s = seed;
	for (uint64_t off = 0; off < size;) {
		size_t n = size - off < sizeof(buf) ? (size_t)(size - off) : sizeof(buf);
		for (size_t i = 0; i < n; i += 8) {
			uint64_t v = splitmix(&s);
			memcpy(buf + i, &v, n - i < 8 ? n - i : 8);
		}
		if (write_all(fd, buf, n) < 0) {
			close(fd);
			return -1;
		}
		off += n;
	}
	return close(fd);
}

void shmt_model_free(struct wf_model *m)
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

struct wf_model *shmt_model_make(const char *dir, const struct shmt_spec *spec, bool write)
{
	struct wf_model *m = calloc(1, sizeof(*m));
	if (!m)
		return NULL;
	m->format = WF_MODEL_FORMAT_GGUF;
	m->n_files = spec->n_files;
	m->files = calloc(spec->n_files, sizeof(*m->files));
	m->n_tensors = spec->n_files * spec->tensors_per_file;
	m->tensors = calloc(m->n_tensors ? m->n_tensors : 1, sizeof(*m->tensors));
	if (!m->files || !m->tensors)
		goto fail;
	uint32_t t = 0;
	for (unsigned i = 0; i < spec->n_files; i++) {
		struct wf_model_file *f = &m->files[i];
		uint64_t hdr = 1000 + 333 * i + spec->seed % 100;
		uint64_t off = (hdr + 31) & ~31ull;
		if (asprintf(&f->path, "%s/model-%05u.bin", dir, i) < 0) {
			f->path = NULL;
			goto fail;
		}
		f->data_offset = off;
		f->alignment = 32;
		f->gguf_version = 3;
		f->n_tensors = spec->tensors_per_file;
		for (unsigned k = 0; k < spec->tensors_per_file; k++, t++) {
			struct wf_tensor *ts = &m->tensors[t];
			if (asprintf(&ts->name, "blk.%u.t%u.weight", i, k) < 0) {
				ts->name = NULL;
				goto fail;
			}
			ts->nbytes = spec->tensor_bytes + 96ull * k;
			ts->dtype = WF_DTYPE_I8;
			ts->n_dims = 2;
			ts->ne[0] = 32;
			ts->ne[1] = (int64_t)(ts->nbytes / 32);
			for (int d = 2; d < WF_MODEL_MAX_DIMS; d++)
				ts->ne[d] = 1;
			ts->file = i;
			ts->offset = off;
			ts->tclass = k % 2 ? WF_TENSOR_EXPERT : WF_TENSOR_DENSE;
			off = (off + ts->nbytes + 31) & ~31ull;
			m->total_bytes += ts->nbytes;
		}
		f->data_size = off - f->data_offset;
		uint64_t size = off + (i % 2 ? 0 : 777);
		if (write && write_random(f->path, size, (uint64_t)spec->seed * 1000003u + i) < 0)
			goto fail;
		struct stat st;
		if (stat(f->path, &st) != 0)
			goto fail;
		f->size = (uint64_t)st.st_size;
		f->mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
	}
	return m;
fail:
	shmt_model_free(m);
	return NULL;
}

void shmt_digest(const struct wf_model *m, struct wf_digest *ret)
{
	wf_model_digest(m, ret);
}

int shmt_fill(void *vctx, const struct wf_shm_fill *job, struct wf_diag *diag)
{
	const struct shmt_fill_ctx *ctx = vctx;
	uint64_t total = 0, done = 0;

	if (ctx && ctx->count_path) {
		int fd = open(ctx->count_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
		if (fd < 0 || write_all(fd, "x", 1) < 0)
			return wf_diag_set(diag, -EIO, "count file %s", ctx->count_path);
		close(fd);
	}
	if (ctx && ctx->started_path)
		shmt_touch(ctx->started_path);
	for (uint32_t i = 0; i < job->n_files; i++)
		total += job->files[i].copy_length;
	for (uint32_t i = 0; i < job->n_files; i++) {
		const struct wf_shm_fill_file *f = &job->files[i];
		struct stat st;
		int fd = open(f->path, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			return wf_diag_set(diag, -errno, "open %s: %s", f->path, strerror(errno));
		if (fstat(fd, &st) != 0 || (uint64_t)st.st_size != f->file_size ||
		    (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec != f->mtime_ns) {
			close(fd);
			return wf_diag_set(diag, WF_ECHANGED, "%s changed since the model was read",
			                   f->path);
		}
		size_t chunk = ctx && ctx->chunk ? ctx->chunk : (size_t)f->copy_length;
		for (uint64_t off = 0; off < f->copy_length;) {
			size_t n =
			    f->copy_length - off < chunk ? (size_t)(f->copy_length - off) : chunk;
			ssize_t r =
			    pread(fd, (uint8_t *)f->dst + off, n, (off_t)(f->src_offset + off));
			if (r < 0 && errno == EINTR)
				continue;
			if (r <= 0) {
				close(fd);
				return wf_diag_set(diag, r < 0 ? -errno : WF_ETRUNCATED,
				                   "read %s at %" PRIu64, f->path,
				                   f->src_offset + off);
			}
			off += (uint64_t)r;
			done += (uint64_t)r;
			if (ctx && ctx->fail_with && done >= total / 2) {
				close(fd);
				return wf_diag_set(diag, ctx->fail_with, "injected failure");
			}
			if (ctx && ctx->sleep_us)
				usleep(ctx->sleep_us);
		}
		close(fd);
	}
	return 0;
}

int shmt_check_bytes(const struct wf_shm_region *r, const struct wf_model *m, char *why,
                     size_t why_len)
{
	uint8_t *buf = NULL;
	size_t cap = 0;
	int rc = -1;

	for (uint32_t i = 0; i < m->n_tensors; i++) {
		const struct wf_tensor *t = &m->tensors[i];
		struct wf_shm_tensor_info ti;
		int e = wf_shm_region_find(r, t->name, &ti);
		if (e < 0) {
			snprintf(why, why_len, "find %s: %s", t->name, wf_strerror(e));
			goto out;
		}
		if (ti.nbytes != t->nbytes || ti.source_offset != t->offset || ti.file != t->file ||
		    ti.n_dims != t->n_dims || ti.ne[1] != t->ne[1] ||
		    ti.dtype != (uint32_t)t->dtype || strcmp(ti.name, t->name) != 0) {
			snprintf(why, why_len, "table entry of %s differs", t->name);
			goto out;
		}
		if (ti.floor_offset % 32 != t->offset % 32) {
			snprintf(why, why_len, "%s: floor offset %" PRIu64 " not congruent",
			         t->name, ti.floor_offset);
			goto out;
		}
		if (t->nbytes > cap) {
			free(buf);
			cap = (size_t)t->nbytes;
			buf = malloc(cap);
		}
		int fd = open(m->files[t->file].path, O_RDONLY | O_CLOEXEC);
		ssize_t n = fd >= 0 ? pread(fd, buf, (size_t)t->nbytes, (off_t)t->offset) : -1;
		if (fd >= 0)
			close(fd);
		if (n != (ssize_t)t->nbytes) {
			snprintf(why, why_len, "read %s of %s", t->name, m->files[t->file].path);
			goto out;
		}
		if (memcmp(buf, ti.data, (size_t)t->nbytes) != 0) {
			snprintf(why, why_len, "floor bytes of %s differ from the file", t->name);
			goto out;
		}
	}
	rc = 0;
out:
	free(buf);
	return rc;
}

int shmt_count_entries(const char *dir, char *buf, size_t buf_len)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	int n = 0;
	size_t used = 0;

	if (buf && buf_len)
		buf[0] = '\0';
	if (!d)
		return -1;
	while ((de = readdir(d)) != NULL) {
		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		n++;
		if (buf && used < buf_len) {
			int w = snprintf(buf + used, buf_len - used, "%s ", de->d_name);
			if (w > 0)
				used += (size_t)w;
		}
	}
	closedir(d);
	return n;
}

long long shmt_file_size(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0 ? (long long)st.st_size : -1;
}

int shmt_touch(const char *path)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
	if (fd < 0)
		return -1;
	close(fd);
	return 0;
}

bool shmt_exists(const char *path)
{
	struct stat st;
	return lstat(path, &st) == 0;
}

void shmt_sleep_ms(unsigned ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

size_t shmt_holders(const struct wf_shm_config *cfg, const struct wf_digest *digest, size_t want,
                    pid_t *pids, size_t cap)
{
	size_t n = 0;
	for (int i = 0; i < 500; i++) {
		if (wf_shm_holder_pids(cfg, digest, pids, cap, &n, NULL) < 0)
			n = 0;
		if (n == want)
			break;
		shmt_sleep_ms(10);
	}
	return n;
}

pid_t shmt_spawn(char *const argv[], const char *out_path)
{
	posix_spawn_file_actions_t fa;
	pid_t pid;

	posix_spawn_file_actions_init(&fa);
	if (out_path) {
		posix_spawn_file_actions_addopen(&fa, 1, out_path, O_WRONLY | O_CREAT | O_TRUNC,
		                                 0644);
		posix_spawn_file_actions_adddup2(&fa, 1, 2);
	}
	int rc = posix_spawn(&pid, argv[0], &fa, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	return rc == 0 ? pid : -1;
}

int shmt_wait(pid_t pid, int timeout_s)
{
	struct timespec start, now;
	clock_gettime(CLOCK_MONOTONIC, &start);
	for (;;) {
		int status;
		pid_t r = waitpid(pid, &status, WNOHANG);
		if (r == pid)
			return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
		if (r < 0 && errno != EINTR)
			return -1;
		clock_gettime(CLOCK_MONOTONIC, &now);
		if (now.tv_sec - start.tv_sec >= timeout_s) {
			kill(pid, SIGKILL);
			waitpid(pid, &status, 0);
			return 128 + SIGKILL;
		}
		shmt_sleep_ms(2);
	}
}

int shmt_orphan_region(const struct wf_shm_config *cfg, const struct wf_model *m)
{
	pid_t pid = fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		struct wf_digest d;
		struct wf_shm_region *r;
		shmt_digest(m, &d);
		int rc = wf_shm_region_attach(cfg, &d, m, WF_SHM_ATTACH_AGENT, shmt_fill, NULL, &r,
		                              NULL);
		_exit(rc == 0 ? 0 : 1); /* no detach: the kernel drops the holders lock */
	}
	int status;
	if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
		return -1;
	return 0;
}

void *shmt_map_rw(const struct wf_shm_config *cfg, const struct wf_model *m, size_t *ret_size)
{
	struct wf_digest d;
	char *path = NULL;
	struct stat st;
	void *p = NULL;

	shmt_digest(m, &d);
	if (asprintf(&path, "%s/wf-%016" PRIx64 "%016" PRIx64, cfg->dir, d.hi, d.lo) < 0)
		return NULL;
	int fd = open(path, O_RDWR | O_CLOEXEC);
	free(path);
	if (fd < 0)
		return NULL;
	if (fstat(fd, &st) == 0 && st.st_size > 0) {
		p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		if (p == MAP_FAILED)
			p = NULL;
		*ret_size = (size_t)st.st_size;
	}
	close(fd);
	return p;
}

void shmt_fix_checksums(void *base, size_t size)
{
	struct wf_shm_header *h = base;
	if (h->file_table_offset < h->data_offset && h->data_offset <= size)
		h->tables_checksum = wf_shm_checksum((uint8_t *)base + h->file_table_offset,
		                                     h->data_offset - h->file_table_offset);
	h->header_checksum = wf_shm_header_checksum(h);
}
