/* The common layer of libwfio: readers, files, requests, and their split into chunk reads.
 *
 * A request is split lazily: the pending list holds requests with bytes left to issue, in
 * submission order, and free chunk slots (queue_depth of them) take the next piece of the head
 * request. A chunk that comes back short, refused or interrupted is resubmitted from where it
 * stopped without giving up its slot; a request completes once it has issued everything (or
 * failed) and its last chunk has returned, so nothing writes into dst after its completion. */
#include "io/internal.h"

#include "base/error.h"
#include "io/pagecache.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <time.h>
#include <unistd.h>

/* An error that keeps coming back after this many immediate resubmissions is reported. */
#define MAX_RETRIES 16

/* --- lists --------------------------------------------------------------------------------- */

static void list_init(struct wf__io_link *l)
{
	l->prev = l->next = l;
}

static bool list_empty(const struct wf__io_link *l)
{
	return l->next == l;
}

static void list_add_tail(struct wf__io_link *head, struct wf__io_link *n)
{
	n->prev = head->prev;
	n->next = head;
	head->prev->next = n;
	head->prev = n;
}

static void list_del(struct wf__io_link *n)
{
	n->prev->next = n->next;
	n->next->prev = n->prev;
	list_init(n);
}

#define REQ_OF(l)  ((struct wf__io_req *)((char *)(l)-offsetof(struct wf__io_req, link)))
#define FILE_OF(l) ((struct wf_io_file *)((char *)(l)-offsetof(struct wf_io_file, link)))

/* --- small helpers ------------------------------------------------------------------------- */

int64_t wf__io_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static uint64_t align_up(uint64_t v, uint64_t a)
{
	return (v + a - 1) / a * a;
}

static uint64_t align_down(uint64_t v, uint64_t a)
{
	return v / a * a;
}

static bool is_pow2(uint64_t v)
{
	return v && !(v & (v - 1));
}

const char *wf_io_backend_name(enum wf_io_backend backend)
{
	switch (backend) {
	case WF_IO_BACKEND_AUTO:
		return "auto";
	case WF_IO_BACKEND_URING:
		return "io_uring";
	case WF_IO_BACKEND_PREAD:
		return "pread";
	default:
		return "?";
	}
}

/* --- requests ------------------------------------------------------------------------------ */

static void file_free(struct wf_io_file *f);

static void req_complete(struct wf_io_reader *r, struct wf__io_req *q)
{
	struct wf_io_file *f = q->file;

	q->completed = true;
	if (q->linked) {
		list_del(&q->link);
		q->linked = false;
	}
	if (q->job) {
		q->job->result = q->err;
		r->active_internal--;
	} else {
		list_add_tail(&r->done, &q->link);
		q->linked = true;
	}
	f->refs--;
	if (f->closed && f->refs == 0)
		file_free(f);
}

void wf__io_req_fail(struct wf_io_reader *r, struct wf__io_req *q, int err)
{
	if (q->completed)
		return;
	if (!q->err)
		q->err = err;
	if (q->linked) {
		list_del(&q->link); /* off the pending list: nothing more starts */
		q->linked = false;
	}
	if (q->inflight == 0)
		req_complete(r, q);
}

void wf__io_req_start(struct wf_io_reader *r, struct wf__io_req *q)
{
	struct wf_io_file *f = q->file;

	f->refs++;
	list_init(&q->link);
	q->linked = false;
	if (q->len == 0) {
		req_complete(r, q);
		return;
	}
	if (r->direct_allowed && f->direct.fd >= 0 && f->direct_ok) {
		uint64_t end = q->off + q->len;
		uint64_t bs = align_up(q->off, f->dio_align);
		uint64_t be = align_down(end, f->dio_align);
		if (be > bs && (uintptr_t)(q->dst + (bs - q->off)) % f->dio_mem_align == 0) {
			q->use_direct = true;
			q->body_start = bs;
			q->body_end = be;
		}
	}
	list_add_tail(&r->pending, &q->link);
	q->linked = true;
}

/* True when every page of [off, off+len) is in the page cache, so a buffered read is a copy
 * from RAM. Turns itself off where cachestat(2) does not exist. */
static bool range_cached(struct wf_io_reader *r, struct wf_io_file *f, uint64_t off, uint64_t len)
{
	bool cached = false;
	int rc = wf_io_pagecache_probe(f->buffered.fd, off, len, &cached);
	if (rc == -ENOSYS || rc == -EPERM)
		r->cache_probe = false;
	return rc == 0 && cached;
}

static void chunk_set_fd(struct wf__io_chunk *c, struct wf_io_file *f, bool direct)
{
	const struct wf__io_file_slot *s = direct ? &f->direct : &f->buffered;

	c->direct = direct;
	c->fd = s->fd;
	c->fixed_file = s->fixed;
}

/* Starts the next piece of the head pending request in a free chunk slot. */
static bool issue_one(struct wf_io_reader *r)
{
	struct wf__io_req *q;
	struct wf__io_chunk *c;
	struct wf_io_file *f;
	uint64_t pos, end, piece_end;
	bool direct = false;

	if (!r->free_chunks || list_empty(&r->pending))
		return false;
	q = REQ_OF(r->pending.next);
	f = q->file;
	pos = q->off + q->issued;
	end = q->off + q->len;
	if (q->use_direct && pos < q->body_start) {
		piece_end = q->body_start; /* unaligned head */
	} else if (q->use_direct && pos < q->body_end) {
		piece_end =
		    pos + r->opts.chunk_size < q->body_end ? pos + r->opts.chunk_size : q->body_end;
		direct = f->direct_ok;
		if (direct && r->cache_probe && range_cached(r, f, pos, piece_end - pos)) {
			direct = false;
			r->stats.cached_chunks++;
		}
	} else {
		piece_end = pos + r->opts.chunk_size < end ? pos + r->opts.chunk_size : end;
	}

	c = r->free_chunks;
	r->free_chunks = c->next;
	c->next = NULL;
	c->req = q;
	c->off = pos;
	c->buf = q->dst + (pos - q->off);
	c->len = (uint32_t)(piece_end - pos);
	c->retries = 0;
	c->res = 0;
	chunk_set_fd(c, f, direct);
	c->fixed_buf = r->ops->buf_lookup ? r->ops->buf_lookup(r, c->buf, c->len) : -1;

	q->issued += c->len;
	q->inflight++;
	r->inflight++;
	if (q->issued == q->len) {
		list_del(&q->link);
		q->linked = false;
	}
	r->stats.reads++;
	if (c->fixed_buf >= 0)
		r->stats.fixed_reads++;
	r->ops->queue(r, c);
	return true;
}

static void issue_all(struct wf_io_reader *r)
{
	while (issue_one(r))
		;
}

static void requeue(struct wf_io_reader *r, struct wf__io_chunk *c)
{
	r->stats.reads++;
	if (c->fixed_buf >= 0)
		r->stats.fixed_reads++;
	r->ops->queue(r, c);
}

static int inject(struct wf_io_reader *r, struct wf__io_chunk *c, int res)
{
	const struct wf__io_faults *fl = &r->faults;
	uint64_t n = ++r->fault_count;

	if (c->direct && fl->direct_einval) {
		r->faults.direct_einval--;
		return -EINVAL;
	}
	if (fl->eagain_every && n % fl->eagain_every == 0)
		return -EAGAIN;
	if (fl->ecanceled_every && n % fl->ecanceled_every == 0)
		return -ECANCELED;
	if (fl->eintr_every && n % fl->eintr_every == 0)
		return -EINTR;
	if (fl->short_every && n % fl->short_every == 0 && res > 1)
		return res / 2;
	return res;
}

static void chunk_done(struct wf_io_reader *r, struct wf__io_chunk *c)
{
	struct wf__io_req *q = c->req;
	struct wf_io_file *f = q->file;
	int res = c->res;

	if (r->fault_count != UINT64_MAX)
		res = inject(r, c, res);
	if (res > 0) {
		if ((uint32_t)res > c->len)
			res = (int)c->len; /* cannot happen; never trust a count past the buffer */
		if (c->direct)
			r->stats.bytes_direct += (uint64_t)res;
		else
			r->stats.bytes_buffered += (uint64_t)res;
		q->done += (uint64_t)res;
		c->off += (uint64_t)res;
		c->buf += res;
		c->len -= (uint32_t)res;
		if (c->len == 0 || q->err)
			goto finish;
		r->stats.short_reads++;
		/* The rest of a short direct read may no longer be aligned: finish it buffered. */
		if (c->direct && (c->off % f->dio_align || c->len % f->dio_align ||
		                  (uintptr_t)c->buf % f->dio_mem_align))
			chunk_set_fd(c, f, false);
		requeue(r, c);
		return;
	}
	if (res == 0) {
		/* EOF inside the requested range: the file is shorter than the caller thinks. */
		wf__io_req_fail(r, q, WF_ETRUNCATED);
		goto finish;
	}
	if (q->err)
		goto finish;
	if (res == -EINVAL && c->direct) {
		/* Some filesystems accept O_DIRECT at open and refuse the read; stop trying. */
		f->direct_ok = false;
		r->stats.direct_fallbacks++;
		chunk_set_fd(c, f, false);
		requeue(r, c);
		return;
	}
	if ((res == -EAGAIN || res == -EINTR || res == -ECANCELED) && c->retries < MAX_RETRIES) {
		c->retries++;
		r->stats.retries++;
		requeue(r, c);
		return;
	}
	wf__io_req_fail(r, q, res == -ECANCELED ? WF_ECANCELED : res);
finish:
	q->inflight--;
	r->inflight--;
	c->req = NULL;
	c->next = r->free_chunks;
	r->free_chunks = c;
	if (q->inflight == 0 && !q->completed && (q->err || q->issued == q->len))
		req_complete(r, q);
}

int wf__io_pump(struct wf_io_reader *r, int64_t wait_ns, unsigned max_chunks)
{
	int n, ret;

	issue_all(r);
	if (r->inflight == 0)
		return 0;
	if (!max_chunks || max_chunks > r->opts.queue_depth)
		max_chunks = r->opts.queue_depth;
	n = r->ops->wait(r, r->harvest, max_chunks, wait_ns != 0 ? 1 : 0, wait_ns);
	if (n < 0)
		return n;
	for (int i = 0; i < n; i++)
		chunk_done(r, r->harvest[i]);
	issue_all(r);
	ret = r->ops->flush(r);
	return ret < 0 ? ret : 0;
}

/* --- reader -------------------------------------------------------------------------------- */

static int parse_env(struct wf_io_opts *o)
{
	const char *b = secure_getenv("WF_IO_BACKEND");
	const char *d = secure_getenv("WF_IO_DIRECT");

	if (b && *b && o->backend == WF_IO_BACKEND_AUTO) {
		if (!strcmp(b, "pread"))
			o->backend = WF_IO_BACKEND_PREAD;
		else if (!strcmp(b, "uring") || !strcmp(b, "io_uring"))
			o->backend = WF_IO_BACKEND_URING;
		else if (strcmp(b, "auto"))
			return WF_EINVAL;
	}
	if (d && *d) {
		if (!strcmp(d, "0"))
			o->flags |= WF_IO_OPT_NO_DIRECT;
		else if (strcmp(d, "1"))
			return WF_EINVAL;
	}
	return 0;
}

static int resolve_opts(const struct wf_io_opts *in, struct wf_io_opts *o)
{
	int ret;

	*o = in ? *in : (struct wf_io_opts){0};
	if ((unsigned)o->backend >= WF_IO_BACKEND_MAX || o->queue_depth > WF_IO_QUEUE_DEPTH_MAX ||
	    o->chunk_size > WF_IO_CHUNK_MAX || o->threads > WF_IO_THREADS_MAX ||
	    o->max_requests > WF_IO_REQUESTS_MAX)
		return WF_EINVAL;
	if (!(o->flags & WF_IO_OPT_NO_ENV)) {
		ret = parse_env(o);
		if (ret < 0)
			return ret;
	}
	if (!o->queue_depth)
		o->queue_depth = WF_IO_QUEUE_DEPTH_DEFAULT;
	if (!o->chunk_size)
		o->chunk_size = WF_IO_CHUNK_DEFAULT;
	o->chunk_size = align_up(o->chunk_size, WF_IO_CHUNK_MIN);
	if (!o->threads)
		o->threads =
		    o->queue_depth < WF_IO_THREADS_DEFAULT ? o->queue_depth : WF_IO_THREADS_DEFAULT;
	if (!o->max_requests)
		o->max_requests = WF_IO_REQUESTS_DEFAULT;
	return 0;
}

int wf_io_reader_create(const struct wf_io_opts *opts, struct wf_io_reader **ret_reader)
{
	struct wf_io_reader *r;
	int ret;

	if (!ret_reader)
		return WF_EINVAL;
	r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	list_init(&r->free_reqs);
	list_init(&r->pending);
	list_init(&r->done);
	list_init(&r->files);
	ret = resolve_opts(opts, &r->opts);
	if (ret < 0)
		goto err;
	r->direct_allowed = !(r->opts.flags & WF_IO_OPT_NO_DIRECT);
	r->cache_probe = !(r->opts.flags & WF_IO_OPT_NO_CACHE_PROBE);
	r->fault_count = UINT64_MAX; /* no injection unless a test asks */

	r->chunks = calloc(r->opts.queue_depth, sizeof(*r->chunks));
	r->harvest = calloc(r->opts.queue_depth, sizeof(*r->harvest));
	r->reqs = calloc(r->opts.max_requests, sizeof(*r->reqs));
	if (!r->chunks || !r->harvest || !r->reqs) {
		ret = -ENOMEM;
		goto err;
	}
	for (unsigned i = r->opts.queue_depth; i-- > 0;) {
		r->chunks[i].next = r->free_chunks;
		r->free_chunks = &r->chunks[i];
	}
	for (unsigned i = 0; i < r->opts.max_requests; i++)
		list_add_tail(&r->free_reqs, &r->reqs[i].link);

	switch (r->opts.backend) {
	case WF_IO_BACKEND_AUTO:
		r->ops = &wf__io_uring_ops;
		ret = r->ops->init(r);
		if (ret == 0)
			break;
		/* io_uring may be absent, forbidden by seccomp or the io_uring_disabled sysctl, or
		 * out of locked memory on old kernels: any of these leaves pread. */
		r->uring_err = ret;
		r->ops = &wf__io_pread_ops;
		ret = r->ops->init(r);
		break;
	case WF_IO_BACKEND_URING:
		r->ops = &wf__io_uring_ops;
		ret = r->ops->init(r);
		break;
	default:
		r->ops = &wf__io_pread_ops;
		ret = r->ops->init(r);
		break;
	}
	if (ret < 0) {
		r->ops = NULL;
		goto err;
	}
	*ret_reader = r;
	return 0;
err:
	free(r->chunks);
	free(r->harvest);
	free(r->reqs);
	free(r);
	return ret;
}

void wf_io_reader_destroy(struct wf_io_reader *r)
{
	if (!r)
		return;
	wf_io_cancel(r);
	/* Reads in flight still write into caller memory: wait for every one of them. A backend
	 * that fails here cannot tell us when they end, so the memory they use is leaked. */
	while (r->inflight) {
		if (wf__io_pump(r, -1, 0) < 0)
			return;
	}
	while (!list_empty(&r->files)) {
		struct wf_io_file *f = FILE_OF(r->files.next);
		f->refs = 0;
		file_free(f);
	}
	if (r->ops)
		r->ops->fini(r);
	free(r->chunks);
	free(r->harvest);
	free(r->reqs);
	free(r);
}

void wf_io_reader_info(const struct wf_io_reader *r, struct wf_io_reader_info *ret_info)
{
	struct wf_io_reader_info i;

	memset(&i, 0, sizeof(i));
	i.backend = r->ops->kind;
	i.backend_name = r->ops->name;
	i.uring_err = r->uring_err;
	i.direct = r->direct_allowed;
	i.queue_depth = r->opts.queue_depth;
	i.chunk_size = r->opts.chunk_size;
	i.threads = r->ops->kind == WF_IO_BACKEND_PREAD ? r->opts.threads : 0;
	i.max_requests = r->opts.max_requests;
	if (r->ops->info)
		r->ops->info(r, &i);
	*ret_info = i;
}

void wf_io_reader_stats(const struct wf_io_reader *r, struct wf_io_stats *ret_stats)
{
	*ret_stats = r->stats;
}

void wf__io_reader_set_faults(struct wf_io_reader *r, const struct wf__io_faults *faults)
{
	r->faults = *faults;
	r->fault_count = 0;
}

/* --- files --------------------------------------------------------------------------------- */

static void file_free(struct wf_io_file *f)
{
	struct wf_io_reader *r = f->reader;

	if (f->direct.fd >= 0) {
		if (r->ops->file_remove)
			r->ops->file_remove(r, &f->direct);
		close(f->direct.fd);
	}
	if (f->buffered.fd >= 0) {
		if (r->ops->file_remove)
			r->ops->file_remove(r, &f->buffered);
		close(f->buffered.fd);
	}
	list_del(&f->link);
	free(f->path);
	free(f);
}

/* Page-cache filesystems where O_DIRECT would be the same copy with extra constraints. */
static bool fs_is_memory(int fd)
{
	struct statfs sfs;

	if (fstatfs(fd, &sfs) != 0)
		return false;
	switch ((unsigned long)sfs.f_type) {
	case TMPFS_MAGIC:
	case RAMFS_MAGIC:
	case HUGETLBFS_MAGIC:
		return true;
	default:
		return false;
	}
}

static void open_direct(struct wf_io_reader *r, struct wf_io_file *f, const char *reopen,
                        const struct stat *st)
{
	struct statx sx;
	struct stat dst;
	uint32_t align = 4096, mem_align = 4096;
	int fd;

	if (fs_is_memory(f->buffered.fd))
		return;
	memset(&sx, 0, sizeof(sx));
	if (statx(f->buffered.fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 &&
	    (sx.stx_mask & STATX_DIOALIGN)) {
		if (!sx.stx_dio_offset_align || !sx.stx_dio_mem_align)
			return; /* the filesystem says it has no direct I/O for this file */
		align = sx.stx_dio_offset_align;
		mem_align = sx.stx_dio_mem_align;
		if (!is_pow2(align) || !is_pow2(mem_align) || align > WF_IO_CHUNK_MIN ||
		    mem_align > WF_IO_CHUNK_MIN)
			return;
	}
	if (r->faults.direct_open_einval)
		return;
	fd = open(reopen, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_DIRECT);
	if (fd < 0)
		return; /* EINVAL: no O_DIRECT here; anything else: buffered still works */
	/* The path may have been replaced between the two opens; the buffered fd is the file. */
	if (fstat(fd, &dst) != 0 || dst.st_dev != st->st_dev || dst.st_ino != st->st_ino) {
		close(fd);
		return;
	}
	f->direct.fd = fd;
	f->direct_ok = true;
	f->dio_align = align;
	f->dio_mem_align = mem_align;
}

static int file_setup(struct wf_io_reader *r, int fd, const char *path, const char *reopen,
                      unsigned flags, struct wf_io_file **ret_file)
{
	struct wf_io_file *f;
	struct stat st;
	int ret;

	if (fstat(fd, &st) != 0) {
		ret = -errno;
		goto err_fd;
	}
	if (!S_ISREG(st.st_mode)) {
		ret = WF_EINVAL;
		goto err_fd;
	}
	f = calloc(1, sizeof(*f));
	if (!f) {
		ret = -ENOMEM;
		goto err_fd;
	}
	if (path) {
		f->path = strdup(path);
		if (!f->path) {
			free(f);
			ret = -ENOMEM;
			goto err_fd;
		}
	}
	f->reader = r;
	f->buffered.fd = fd;
	f->buffered.fixed = -1;
	f->direct.fd = -1;
	f->direct.fixed = -1;
	f->dio_align = 4096;
	f->dio_mem_align = 4096;
	f->size = (uint64_t)st.st_size;
	f->mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
	f->dev = (uint64_t)st.st_dev;
	f->ino = (uint64_t)st.st_ino;
	list_add_tail(&r->files, &f->link);
	if (r->direct_allowed && !(flags & WF_IO_FILE_NO_DIRECT))
		open_direct(r, f, reopen, &st);
	if (r->ops->file_add) {
		r->ops->file_add(r, &f->buffered);
		if (f->direct.fd >= 0)
			r->ops->file_add(r, &f->direct);
	}
	*ret_file = f;
	return 0;
err_fd:
	close(fd);
	return ret;
}

int wf_io_file_open(struct wf_io_reader *r, const char *path, unsigned flags,
                    struct wf_io_file **ret_file)
{
	int fd;

	if (!r || !path || !ret_file)
		return WF_EINVAL;
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
	if (fd < 0)
		return -errno;
	return file_setup(r, fd, path, path, flags, ret_file);
}

int wf_io_file_open_fd(struct wf_io_reader *r, int fd, unsigned flags, struct wf_io_file **ret_file)
{
	char reopen[64];
	int dup_fd;

	if (!r || fd < 0 || !ret_file)
		return fd < 0 ? -EBADF : WF_EINVAL;
	dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
	if (dup_fd < 0)
		return -errno;
	snprintf(reopen, sizeof(reopen), "/proc/self/fd/%d", dup_fd);
	return file_setup(r, dup_fd, NULL, reopen, flags, ret_file);
}

void wf_io_file_close(struct wf_io_file *f)
{
	if (!f)
		return;
	f->closed = true;
	if (f->refs == 0)
		file_free(f);
}

void wf_io_file_info(const struct wf_io_file *f, struct wf_io_file_info *ret_info)
{
	struct wf_io_file_info i;

	memset(&i, 0, sizeof(i));
	i.size = f->size;
	i.mtime_ns = f->mtime_ns;
	i.dev = f->dev;
	i.ino = f->ino;
	i.direct = f->direct.fd >= 0 && f->direct_ok && f->reader->direct_allowed;
	i.direct_align = f->dio_align;
	i.direct_mem_align = f->dio_mem_align;
	*ret_info = i;
}

int wf_io_file_check(const struct wf_io_file *f)
{
	struct stat st;

	if (fstat(f->buffered.fd, &st) != 0)
		return -errno;
	if ((uint64_t)st.st_size != f->size || (uint64_t)st.st_dev != f->dev ||
	    (uint64_t)st.st_ino != f->ino ||
	    (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec != f->mtime_ns)
		return WF_ECHANGED;
	if (f->path) {
		if (stat(f->path, &st) != 0)
			return errno == ENOENT || errno == ENOTDIR ? WF_ECHANGED : -errno;
		if ((uint64_t)st.st_dev != f->dev || (uint64_t)st.st_ino != f->ino)
			return WF_ECHANGED; /* replaced (rename over it): the path is a new file */
	}
	return 0;
}

/* --- asynchronous requests ----------------------------------------------------------------- */

int wf_io_submit(struct wf_io_reader *r, struct wf_io_file *f, uint64_t offset, size_t len,
                 void *dst, uint64_t user_data)
{
	struct wf__io_req *q;

	if (!r || !f || f->reader != r || (len && !dst))
		return WF_EINVAL;
	if (f->closed)
		return WF_ESTATE;
	if (offset + len < offset || (uintptr_t)dst + len < (uintptr_t)dst)
		return WF_EOVERFLOW;
	if (list_empty(&r->free_reqs))
		return -EAGAIN;
	q = REQ_OF(r->free_reqs.next);
	list_del(&q->link);
	memset(q, 0, sizeof(*q));
	q->file = f;
	q->off = offset;
	q->len = len;
	q->dst = dst;
	q->user_data = user_data;
	r->outstanding++;
	wf__io_req_start(r, q);
	issue_all(r);
	/* A failed flush is not the request's failure: the next wait submits again. */
	(void)r->ops->flush(r);
	return 0;
}

unsigned wf_io_outstanding(const struct wf_io_reader *r)
{
	return r->outstanding;
}

static unsigned collect(struct wf_io_reader *r, struct wf_io_cqe *out, unsigned n, unsigned max)
{
	while (n < max && !list_empty(&r->done)) {
		struct wf__io_req *q = REQ_OF(r->done.next);
		list_del(&q->link);
		out[n].user_data = q->user_data;
		out[n].res = q->err;
		out[n].bytes = q->done;
		n++;
		memset(q, 0, sizeof(*q));
		list_add_tail(&r->free_reqs, &q->link);
		r->outstanding--;
	}
	return n;
}

int wf_io_reap(struct wf_io_reader *r, struct wf_io_cqe *out, unsigned max, unsigned min_wait,
               int64_t timeout_ns)
{
	int64_t deadline = timeout_ns > 0 ? wf__io_now_ns() + timeout_ns : 0;
	unsigned n = 0;
	int ret;

	if (!r || (max && !out))
		return WF_EINVAL;
	if (min_wait > max)
		min_wait = max;
	for (bool pumped = false;; pumped = true) {
		int64_t wait;

		n = collect(r, out, n, max);
		if (n >= min_wait || n == max)
			break;
		if (r->outstanding == (unsigned)0 || (!r->inflight && list_empty(&r->pending)))
			break;
		if (timeout_ns < 0) {
			wait = -1;
		} else if (timeout_ns == 0) {
			if (pumped)
				break;
			wait = 0;
		} else {
			wait = deadline - wf__io_now_ns();
			if (wait <= 0) {
				if (pumped)
					break;
				wait = 0;
			}
		}
		ret = wf__io_pump(r, wait, 0);
		if (ret < 0) {
			n = collect(r, out, n, max);
			return n ? (int)n : ret;
		}
	}
	return (int)n;
}

void wf_io_cancel(struct wf_io_reader *r)
{
	if (!r)
		return;
	for (unsigned i = 0; i < r->opts.max_requests; i++) {
		struct wf__io_req *q = &r->reqs[i];
		if (q->file && !q->completed)
			wf__io_req_fail(r, q, WF_ECANCELED);
	}
}

int wf_io_buffer_register(struct wf_io_reader *r, void *base, size_t len)
{
	if (!r || !base || !len)
		return WF_EINVAL;
	if (!r->ops->buf_register)
		return r->ops->kind == WF_IO_BACKEND_PREAD ? 0 : WF_EUNSUPPORTED;
	return r->ops->buf_register(r, base, len);
}

int wf_io_buffer_unregister(struct wf_io_reader *r, void *base)
{
	if (!r || !base)
		return WF_EINVAL;
	if (!r->ops->buf_unregister)
		return r->ops->kind == WF_IO_BACKEND_PREAD ? 0 : WF_EUNSUPPORTED;
	return r->ops->buf_unregister(r, base);
}
