/* The planning half of a reload: see agent/reload.h for the decision it implements. */
#include "agent/reload.h"

#include "base/error.h"
#include "model/dtype.h"
#include "shm/layout.h"
#include "shm/region.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int64_t ts_ns(const struct timespec *t)
{
	return (int64_t)t->tv_sec * 1000000000LL + t->tv_nsec;
}

static struct wf_reload_ident ident_of_stat(const struct stat *st)
{
	return (struct wf_reload_ident){.size = (uint64_t)st->st_size,
	                                .dev = (uint64_t)st->st_dev,
	                                .ino = (uint64_t)st->st_ino,
	                                .mtime_ns = ts_ns(&st->st_mtim),
	                                .ctime_ns = ts_ns(&st->st_ctim)};
}

static bool ident_equal(const struct wf_reload_ident *a, const struct wf_reload_ident *b)
{
	return a->size == b->size && a->dev == b->dev && a->ino == b->ino &&
	       a->mtime_ns == b->mtime_ns && a->ctime_ns == b->ctime_ns;
}

struct wf_reload_ident wf_reload_ident_of(const struct wf_model_file *file)
{
	return (struct wf_reload_ident){.size = file->size,
	                                .dev = file->dev,
	                                .ino = file->ino,
	                                .mtime_ns = file->mtime_ns,
	                                .ctime_ns = file->ctime_ns};
}

bool wf_reload_ident_moved(const char *path, const struct wf_reload_ident *id)
{
	struct stat st;
	if (stat(path, &st) != 0)
		return true;
	struct wf_reload_ident now = ident_of_stat(&st);
	return !ident_equal(&now, id);
}

void wf_reload_plan_free(struct wf_reload_plan *plan)
{
	if (!plan)
		return;
	for (uint32_t i = 0; i < plan->n_tensors; i++) {
		free(plan->tensors[i].name);
		free(plan->tensors[i].data);
	}
	free(plan->tensors);
	free(plan->idents);
	*plan = (struct wf_reload_plan){0};
}

/* The files of one plan, opened on first use and checked to be the files the model reader
 * opened (regular, same device and inode): a path replaced since is refused, never read. */
struct files {
	const struct wf_model *model;
	int *fd; /* -1: not opened yet */
};

static int file_fd(struct files *fs, uint32_t i, struct wf_diag *diag)
{
	if (fs->fd[i] >= 0)
		return fs->fd[i];
	const struct wf_model_file *mf = &fs->model->files[i];
	/* O_NONBLOCK: a FIFO put in the file's place must not hang the agent in open() */
	int fd = open(mf->path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
	if (fd < 0)
		return wf_diag_set(diag, -errno, "'%s': %s", mf->path, strerror(errno));
	struct stat st;
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_dev != mf->dev ||
	    (uint64_t)st.st_ino != mf->ino) {
		close(fd);
		return wf_diag_set(diag, WF_ECHANGED,
		                   "'%s' was replaced while the reload read it: reload again",
		                   mf->path);
	}
	fs->fd[i] = fd;
	return fd;
}

static int pread_full(int fd, void *buf, uint64_t n, uint64_t off)
{
	char *p = buf;
	while (n) {
		ssize_t r = pread(fd, p, n > (1u << 30) ? (1u << 30) : n, (off_t)off);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -errno;
		if (r == 0)
			return WF_ETRUNCATED;
		p += r;
		n -= (uint64_t)r;
		off += (uint64_t)r;
	}
	return 0;
}

static int push(struct wf_reload_plan *p, const struct wf_reload_tensor *t)
{
	if ((p->n_tensors & (p->n_tensors - 1)) == 0) { /* grow at powers of two */
		size_t cap = p->n_tensors ? (size_t)p->n_tensors * 2 : 8;
		struct wf_reload_tensor *v = realloc(p->tensors, cap * sizeof(*v));
		if (!v)
			return -ENOMEM;
		p->tensors = v;
	}
	p->tensors[p->n_tensors++] = *t;
	return 0;
}

static int refuse(struct wf_reload_plan *p, const char *name, uint32_t index, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int refuse(struct wf_reload_plan *p, const char *name, uint32_t index, const char *fmt, ...)
{
	struct wf_reload_tensor t = {.index = index, .status = WF_RELOAD_REFUSED};
	t.name = strdup(name);
	if (!t.name)
		return -ENOMEM;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(t.why, sizeof(t.why), fmt, ap);
	va_end(ap);
	p->n_refused++;
	int rc = push(p, &t);
	if (rc < 0)
		free(t.name);
	return rc;
}

static bool same_shape(const struct wf_shm_tensor_info *a, const struct wf_tensor *b)
{
	if (a->n_dims != b->n_dims)
		return false;
	for (uint32_t d = 0; d < a->n_dims; d++)
		if (a->ne[d] != b->ne[d])
			return false;
	return true;
}

static const char *dtype_name(uint32_t dtype)
{
	const struct wf_dtype_info *di = wf_dtype_info(dtype);
	return di ? di->name : "?";
}

static void shape_str(char *out, size_t len, uint32_t n_dims, const int64_t *ne)
{
	size_t k = 0;
	out[0] = '\0';
	for (uint32_t d = 0; d < n_dims && k < len; d++)
		k += (size_t)snprintf(out + k, len - k, "%s%lld", d ? "x" : "", (long long)ne[d]);
}

/* One floor tensor against its namesake in the files: refused, unchanged or changed. */
static int plan_tensor(struct wf_reload_plan *p, struct files *fs,
                       const struct wf_shm_tensor_info *ti, struct wf_diag *diag)
{
	const struct wf_tensor *t = wf_model_find_tensor(fs->model, ti->name);
	if (!t)
		return refuse(p, ti->name, ti->index, "vanished from the model's files");
	if (!same_shape(ti, t)) {
		char was[96], now[96];
		shape_str(was, sizeof(was), ti->n_dims, ti->ne);
		shape_str(now, sizeof(now), t->n_dims, t->ne);
		return refuse(p, ti->name, ti->index, "shape changed from %s to %s", was, now);
	}
	if ((uint32_t)t->dtype != ti->dtype)
		return refuse(p, ti->name, ti->index,
		              "type changed from %s to %s (a reload keeps each tensor's type)",
		              dtype_name(ti->dtype), dtype_name((uint32_t)t->dtype));
	int fd = file_fd(fs, t->file, diag);
	if (fd < 0)
		return fd;
	void *buf = malloc(t->nbytes ? t->nbytes : 1);
	if (!buf)
		return -ENOMEM;
	int rc = pread_full(fd, buf, t->nbytes, t->offset);
	if (rc < 0) {
		free(buf);
		return wf_diag_set(
		    diag, rc, "'%s': tensor '%s': %s", fs->model->files[t->file].path, ti->name,
		    rc == WF_ETRUNCATED ? "the file ends inside it" : wf_strerror(rc));
	}
	p->bytes_read += t->nbytes;
	uint64_t sum = wf_shm_checksum(buf, t->nbytes);
	if (sum == ti->checksum) {
		free(buf);
		p->n_unchanged++;
		return 0;
	}
	struct wf_reload_tensor rt = {.index = ti->index,
	                              .status = WF_RELOAD_CHANGED,
	                              .nbytes = t->nbytes,
	                              .old_checksum = ti->checksum,
	                              .new_checksum = sum,
	                              .data = buf};
	rt.name = strdup(ti->name);
	if (!rt.name || push(p, &rt) < 0) {
		free(rt.name);
		free(buf);
		return -ENOMEM;
	}
	p->n_changed++;
	p->bytes_changed += t->nbytes;
	return 0;
}

/* After reading: every file read must still be what was opened (a write during the read moves
 * ctime), else the bytes may be half old, half new. */
static int recheck_files(struct files *fs, const struct wf_reload_plan *p, struct wf_diag *diag)
{
	for (uint32_t i = 0; i < p->n_files; i++) {
		struct stat st;
		if (fs->fd[i] < 0)
			continue;
		if (fstat(fs->fd[i], &st) != 0)
			return wf_diag_set(diag, -errno, "'%s': fstat: %s",
			                   fs->model->files[i].path, strerror(errno));
		struct wf_reload_ident now = ident_of_stat(&st);
		if (!ident_equal(&now, &p->idents[i]))
			return wf_diag_set(
			    diag, WF_ECHANGED,
			    "'%s' was written while the reload read it: reload again "
			    "once its writer is done",
			    fs->model->files[i].path);
	}
	return 0;
}

static int plan_tensors(const struct wf_shm_region *region, struct files *fs, const bool *moved,
                        struct wf_reload_plan *p, struct wf_diag *diag)
{
	uint32_t n = wf_shm_region_n_tensors(region);
	for (uint32_t i = 0; i < n; i++) {
		struct wf_shm_tensor_info ti;
		int rc = wf_shm_region_tensor(region, i, &ti);
		if (rc < 0)
			return wf_diag_set(diag, rc, "floor tensor %u: %s", i, wf_strerror(rc));
		const struct wf_tensor *t = wf_model_find_tensor(fs->model, ti.name);
		/* its floor file moved, or (moved between files) its file in the model did */
		if (!moved[ti.file] && !(t && moved[t->file]))
			continue;
		rc = plan_tensor(p, fs, &ti, diag);
		if (rc < 0)
			return rc;
	}
	for (uint32_t i = 0; i < fs->model->n_tensors; i++) {
		const struct wf_tensor *t = &fs->model->tensors[i];
		struct wf_shm_tensor_info ti;
		if (!moved[t->file] || wf_shm_region_find(region, t->name, &ti) == 0)
			continue;
		int rc = refuse(p, t->name, UINT32_MAX,
		                "new in the model's files (a reload cannot add a tensor)");
		if (rc < 0)
			return rc;
	}
	return 0;
}

int wf_reload_plan(const struct wf_shm_region *region, const struct wf_model *model,
                   const struct wf_reload_ident *baseline, uint32_t n_baseline,
                   struct wf_reload_plan *ret, struct wf_diag *diag)
{
	struct wf_reload_plan p = {.n_files = model->n_files};
	struct files fs = {.model = model};
	bool *moved = NULL;
	int rc = 0;

	if (model->n_files != n_baseline)
		return wf_diag_set(diag, WF_ESHARD,
		                   "the model has %u file(s) now, its floor %u: a reload keeps the "
		                   "file list (release and ensure the model to load the new one)",
		                   model->n_files, n_baseline);
	p.idents = calloc(model->n_files, sizeof(*p.idents));
	moved = calloc(model->n_files, sizeof(*moved));
	fs.fd = malloc(model->n_files * sizeof(*fs.fd));
	if (!p.idents || !moved || !fs.fd) {
		rc = -ENOMEM;
		goto out;
	}
	for (uint32_t i = 0; i < model->n_files; i++) {
		fs.fd[i] = -1;
		p.idents[i] = wf_reload_ident_of(&model->files[i]);
		moved[i] = !ident_equal(&p.idents[i], &baseline[i]);
		p.files_moved += moved[i];
	}
	if (p.files_moved) {
		rc = plan_tensors(region, &fs, moved, &p, diag);
		if (rc == 0)
			rc = recheck_files(&fs, &p, diag);
	}
out:
	for (uint32_t i = 0; fs.fd && i < model->n_files; i++)
		if (fs.fd[i] >= 0)
			close(fs.fd[i]);
	free(fs.fd);
	free(moved);
	if (rc < 0) {
		wf_reload_plan_free(&p);
		return rc;
	}
	*ret = p;
	return 0;
}
