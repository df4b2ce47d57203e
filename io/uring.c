/* The io_uring backend: one ring per reader, SQ sized to the queue depth so that every chunk the
 * common layer hands over has an SQE (a backlog covers the moment the SQ is still full because
 * the kernel has not consumed it yet).
 *
 * Registered files (a sparse table) save the per-read file lookup; registered buffers (a sparse
 * table filled by wf_io_buffer_register()) save pinning destination pages on every O_DIRECT read.
 * Both are optional: the ring works without them. */
#include "io/internal.h"

#include "base/error.h"

#include <errno.h>
#include <liburing.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#define FILE_SLOTS 256
#define BUF_SLOTS  64
#define BUF_PIECE  (1ull << 30) /* the kernel's limit for one registered buffer */

struct buf_slot {
	char *base;
	size_t len;
	char *owner; /* base given to wf_io_buffer_register(); NULL when free */
};

struct uring {
	struct io_uring ring;
	bool ring_ok;
	struct io_uring_cqe **cqes;
	struct wf__io_chunk *backlog, *backlog_tail;
	unsigned nfiles;
	unsigned char *file_used;
	unsigned nbufs;
	struct buf_slot bufs[BUF_SLOTS];
	unsigned bufs_used;
};

static struct uring *U(const struct wf_io_reader *r)
{
	return r->be;
}

static void uring_fini(struct wf_io_reader *r)
{
	struct uring *u = U(r);

	if (!u)
		return;
	if (u->ring_ok)
		io_uring_queue_exit(&u->ring);
	free(u->cqes);
	free(u->file_used);
	free(u);
	r->be = NULL;
}

static int uring_init(struct wf_io_reader *r)
{
	/* COOP_TASKRUN: completions are run when we enter the kernel anyway, without an IPI to
	 * interrupt us; TASKRUN_FLAG lets liburing see that such work is pending when it peeks
	 * without waiting. Fall back to plain flags on kernels that predate them (5.19). */
	static const unsigned flag_sets[] = {
	    IORING_SETUP_COOP_TASKRUN | IORING_SETUP_TASKRUN_FLAG | IORING_SETUP_SUBMIT_ALL, 0};
	struct uring *u;
	int ret = -EINVAL;

	u = calloc(1, sizeof(*u));
	if (!u)
		return -ENOMEM;
	r->be = u;
	u->cqes = calloc(r->opts.queue_depth, sizeof(*u->cqes));
	if (!u->cqes) {
		ret = -ENOMEM;
		goto err;
	}
	for (size_t i = 0; i < sizeof(flag_sets) / sizeof(flag_sets[0]); i++) {
		struct io_uring_params p;
		memset(&p, 0, sizeof(p));
		p.flags = flag_sets[i];
		ret = io_uring_queue_init_params(r->opts.queue_depth, &u->ring, &p);
		if (ret != -EINVAL)
			break;
	}
	if (ret < 0)
		goto err;
	u->ring_ok = true;
	/* A forked child (posix_spawn of a helper) must not share the ring's pages. */
	ret = io_uring_ring_dontfork(&u->ring);
	if (ret < 0)
		goto err;
	/* No io_uring_register_ring_fd(): a registered ring fd belongs to the registering thread,
	 * and a reader may be handed between threads (one at a time). */
	if (!(r->opts.flags & WF_IO_OPT_NO_REGISTER)) {
		if (io_uring_register_files_sparse(&u->ring, FILE_SLOTS) == 0) {
			u->file_used = calloc(FILE_SLOTS, 1);
			if (!u->file_used) {
				ret = -ENOMEM;
				goto err;
			}
			u->nfiles = FILE_SLOTS;
		}
		if (io_uring_register_buffers_sparse(&u->ring, BUF_SLOTS) == 0)
			u->nbufs = BUF_SLOTS;
	}
	return 0;
err:
	uring_fini(r);
	return ret;
}

static void uring_info(const struct wf_io_reader *r, struct wf_io_reader_info *info)
{
	info->fixed_files = U(r)->nfiles > 0;
	info->fixed_bufs = U(r)->nbufs > 0;
}

static void uring_file_add(struct wf_io_reader *r, struct wf__io_file_slot *slot)
{
	struct uring *u = U(r);

	slot->fixed = -1;
	for (unsigned i = 0; i < u->nfiles; i++) {
		if (u->file_used[i])
			continue;
		if (io_uring_register_files_update(&u->ring, i, &slot->fd, 1) == 1) {
			u->file_used[i] = 1;
			slot->fixed = (int)i;
		}
		return;
	}
}

static void uring_file_remove(struct wf_io_reader *r, struct wf__io_file_slot *slot)
{
	struct uring *u = U(r);
	int none = -1;

	if (slot->fixed < 0)
		return;
	/* Reads still holding the file keep it alive in the kernel; nothing of ours is in flight
	 * on it anyway (the file is freed after its last request). */
	(void)io_uring_register_files_update(&u->ring, (unsigned)slot->fixed, &none, 1);
	u->file_used[slot->fixed] = 0;
	slot->fixed = -1;
}

static int uring_buf_register(struct wf_io_reader *r, void *base, size_t len)
{
	struct uring *u = U(r);
	struct iovec iov[BUF_SLOTS];
	size_t pieces = (len + BUF_PIECE - 1) / BUF_PIECE;
	unsigned start;
	int ret;

	if (!u->nbufs)
		return WF_EUNSUPPORTED;
	for (unsigned i = 0; i < u->nbufs; i++)
		if (u->bufs[i].owner == base)
			return -EEXIST;
	if (pieces > u->nbufs - u->bufs_used)
		return WF_ELIMIT;
	/* Pieces take consecutive slots so that one update call registers them. */
	for (start = 0; start + pieces <= u->nbufs; start++) {
		size_t k = 0;
		while (k < pieces && !u->bufs[start + k].owner)
			k++;
		if (k == pieces)
			break;
	}
	if (start + pieces > u->nbufs)
		return WF_ELIMIT;
	for (size_t k = 0; k < pieces; k++) {
		size_t off = k * BUF_PIECE;
		iov[k].iov_base = (char *)base + off;
		iov[k].iov_len = len - off < BUF_PIECE ? len - off : BUF_PIECE;
	}
	ret = io_uring_register_buffers_update_tag(&u->ring, start, iov, NULL, (unsigned)pieces);
	if (ret < 0)
		return ret;
	if ((size_t)ret != pieces)
		return -EIO;
	for (size_t k = 0; k < pieces; k++) {
		u->bufs[start + k].base = iov[k].iov_base;
		u->bufs[start + k].len = iov[k].iov_len;
		u->bufs[start + k].owner = base;
	}
	u->bufs_used += (unsigned)pieces;
	return 0;
}

static int uring_buf_unregister(struct wf_io_reader *r, void *base)
{
	struct uring *u = U(r);
	struct iovec none = {NULL, 0};
	bool found = false;

	for (unsigned i = 0; i < u->nbufs; i++) {
		if (u->bufs[i].owner != base)
			continue;
		(void)io_uring_register_buffers_update_tag(&u->ring, i, &none, NULL, 1);
		memset(&u->bufs[i], 0, sizeof(u->bufs[i]));
		u->bufs_used--;
		found = true;
	}
	return found ? 0 : WF_ENOT_FOUND;
}

static int uring_buf_lookup(struct wf_io_reader *r, const void *buf, size_t len)
{
	struct uring *u = U(r);
	const char *b = buf;

	if (!u->bufs_used)
		return -1;
	for (unsigned i = 0; i < u->nbufs; i++) {
		const struct buf_slot *s = &u->bufs[i];
		if (s->owner && b >= s->base && b + len <= s->base + s->len)
			return (int)i;
	}
	return -1;
}

static bool prep(struct uring *u, struct wf__io_chunk *c)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring);

	if (!sqe)
		return false;
	if (c->fixed_buf >= 0)
		io_uring_prep_read_fixed(sqe, c->fixed_file >= 0 ? c->fixed_file : c->fd, c->buf,
		                         c->len, c->off, c->fixed_buf);
	else
		io_uring_prep_read(sqe, c->fixed_file >= 0 ? c->fixed_file : c->fd, c->buf, c->len,
		                   c->off);
	if (c->fixed_file >= 0)
		sqe->flags |= IOSQE_FIXED_FILE;
	io_uring_sqe_set_data(sqe, c);
	return true;
}

static void uring_queue(struct wf_io_reader *r, struct wf__io_chunk *c)
{
	struct uring *u = U(r);

	if (!u->backlog && prep(u, c))
		return;
	c->next = NULL;
	if (u->backlog_tail)
		u->backlog_tail->next = c;
	else
		u->backlog = c;
	u->backlog_tail = c;
}

static void drain_backlog(struct uring *u)
{
	while (u->backlog && prep(u, u->backlog)) {
		u->backlog = u->backlog->next;
		if (!u->backlog)
			u->backlog_tail = NULL;
	}
}

static int uring_flush(struct wf_io_reader *r)
{
	struct uring *u = U(r);
	int ret;

	for (int round = 0; round < 2; round++) {
		drain_backlog(u);
		ret = io_uring_submit(&u->ring);
		if (ret < 0 && ret != -EINTR && ret != -EAGAIN && ret != -EBUSY)
			return ret;
		if (!u->backlog)
			break;
	}
	return 0;
}

static int uring_wait(struct wf_io_reader *r, struct wf__io_chunk **out, unsigned max, unsigned min,
                      int64_t timeout_ns)
{
	struct uring *u = U(r);
	struct io_uring_cqe *cqe = NULL;
	unsigned n;
	int ret;

	drain_backlog(u);
	if (min > 0 && io_uring_cq_ready(&u->ring) < min) {
		struct __kernel_timespec ts, *tsp = NULL;
		if (timeout_ns >= 0) {
			ts.tv_sec = timeout_ns / 1000000000;
			ts.tv_nsec = timeout_ns % 1000000000;
			tsp = &ts;
		}
		ret = io_uring_submit_and_wait_timeout(&u->ring, &cqe, min, tsp, NULL);
		if (ret < 0 && ret != -ETIME && ret != -EINTR && ret != -EAGAIN && ret != -EBUSY)
			return ret;
	} else {
		ret = uring_flush(r);
		if (ret < 0)
			return ret;
	}
	if (max > r->opts.queue_depth)
		max = r->opts.queue_depth;
	n = io_uring_peek_batch_cqe(&u->ring, u->cqes, max);
	for (unsigned i = 0; i < n; i++) {
		struct wf__io_chunk *c = io_uring_cqe_get_data(u->cqes[i]);
		c->res = u->cqes[i]->res;
		out[i] = c;
	}
	io_uring_cq_advance(&u->ring, n);
	return (int)n;
}

const struct wf__io_ops wf__io_uring_ops = {
    .name = "io_uring",
    .kind = WF_IO_BACKEND_URING,
    .init = uring_init,
    .fini = uring_fini,
    .info = uring_info,
    .file_add = uring_file_add,
    .file_remove = uring_file_remove,
    .buf_register = uring_buf_register,
    .buf_unregister = uring_buf_unregister,
    .buf_lookup = uring_buf_lookup,
    .queue = uring_queue,
    .flush = uring_flush,
    .wait = uring_wait,
};
