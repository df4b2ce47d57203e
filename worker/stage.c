/* The staging pipeline (worker/stage.h).
 *
 * One thread drives everything: it plans batches into free slots, submits their reads, reaps
 * read completions, queues the copies of fully read slots, and polls the slots' events. It never
 * blocks while it could make progress; when it cannot, it waits on whatever the oldest slot in
 * flight waits for (a read completion, with a short timeout so that cancel stays prompt, or the
 * slot's copy event), because the ring is refilled in order and the oldest slot is the one the
 * pipeline needs back first.
 *
 * A slot in DIRECT mode has no buffer: it is a group of copies straight from the mapping with an
 * event after them, which bounds the copies in flight to n_buffers * buffer_size and gives
 * progress and cancel points at the same granularity as STAGED. */
#include "worker/stage.h"

#include "base/error.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define PAGE         4096u
#define REAP_MAX     64u
#define REAP_WAIT_NS 2000000 /* a blocked wait on reads returns this often to poll cancel */

enum slot_state { SLOT_FREE, SLOT_READING, SLOT_COPYING };

struct seg_read {
	uint64_t off; /* source offset */
	uint64_t len;
	size_t boff; /* position in the staging buffer */
};

struct seg_copy {
	size_t boff;      /* position in the staging buffer (STAGED) */
	uint64_t src_off; /* source offset (DIRECT) */
	unsigned char *dst;
	uint64_t len;
	uint32_t group;
};

struct slot {
	unsigned char *buf; /* STAGED: this slot's part of the ring */
	struct wf_device_event *ev;
	unsigned stream;
	enum slot_state state;
	uint64_t seq;           /* fill order: the smallest in flight is the oldest */
	uint64_t bytes;         /* item bytes in this batch */
	size_t reads_submitted; /* reads[0..reads_submitted) went to the reader */
	size_t reads_left;      /* submitted or not, not yet completed */
	struct seg_read *reads;
	size_t n_reads, cap_reads;
	struct seg_copy *copies;
	size_t n_copies, cap_copies;
};

struct wf_stage {
	struct wf_device *dev;
	struct wf_io_reader *io;
	struct wf_stage_opts opts; /* resolved */
	void *ring;
	size_t ring_size;
	bool io_registered;
	struct wf_device_stream *streams[WF_STAGE_STREAMS_MAX];
	struct slot *slots;
	enum wf_stage_mode preferred; /* AUTO: the default rule */
	bool calibrated;
	double staged_gbps, direct_gbps;
};

/* The state of one wf_stage_load call. */
struct run {
	struct wf_stage *st;
	const struct wf_stage_src *src;
	const struct wf_stage_item *items;
	size_t n;
	const struct wf_stage_ctl *ctl;
	struct wf_diag *diag;
	enum wf_stage_mode mode;
	struct wf_io_file *file;
	size_t cur_item; /* planning cursor */
	uint64_t cur_pos;
	uint64_t next_seq;
	unsigned next_fill; /* the ring is filled in order */
	uint64_t total, done;
	struct wf_stage_stats stats;
};

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

const char *wf_stage_mode_name(enum wf_stage_mode mode)
{
	switch (mode) {
	case WF_STAGE_MODE_AUTO:
		return "auto";
	case WF_STAGE_MODE_STAGED:
		return "staged";
	case WF_STAGE_MODE_DIRECT:
		return "direct";
	default:
		return "?";
	}
}

/* ---- create / destroy ----------------------------------------------------------------------- */

static int resolve_opts(const struct wf_stage_opts *in, struct wf_stage_opts *o,
                        struct wf_diag *diag)
{
	*o = in ? *in : (struct wf_stage_opts){0};
	if (!o->n_buffers)
		o->n_buffers = WF_STAGE_BUFFERS_DEFAULT;
	if (!o->buffer_size)
		o->buffer_size = WF_STAGE_BUFFER_SIZE_DEFAULT;
	if (!o->n_streams)
		o->n_streams = WF_STAGE_STREAMS_DEFAULT;
	if (o->n_buffers > WF_STAGE_BUFFERS_MAX || o->n_streams > WF_STAGE_STREAMS_MAX ||
	    o->buffer_size > WF_STAGE_BUFFER_SIZE_MAX ||
	    (o->flags & ~(unsigned)(WF_STAGE_OPT_NO_REGISTER | WF_STAGE_OPT_WRITE_COMBINED)))
		return wf_diag_set(diag, WF_EINVAL,
		                   "stage options: %u buffers (max %u), %zu bytes each (max %u), "
		                   "%u streams (max %u), flags %#x",
		                   o->n_buffers, WF_STAGE_BUFFERS_MAX, o->buffer_size,
		                   WF_STAGE_BUFFER_SIZE_MAX, o->n_streams, WF_STAGE_STREAMS_MAX,
		                   o->flags);
	if (o->buffer_size < WF_STAGE_BUFFER_SIZE_MIN)
		o->buffer_size = WF_STAGE_BUFFER_SIZE_MIN;
	/* Whole 64 KiB units keep every slot page-aligned, which O_DIRECT reads need. */
	o->buffer_size = (o->buffer_size + WF_STAGE_BUFFER_SIZE_MIN - 1) &
	                 ~(size_t)(WF_STAGE_BUFFER_SIZE_MIN - 1);
	return 0;
}

int wf_stage_create(struct wf_device *dev, struct wf_io_reader *io,
                    const struct wf_stage_opts *opts, struct wf_stage **ret_stage,
                    struct wf_diag *diag)
{
	struct wf_stage *st;
	int ret;

	if (!dev || !io || !ret_stage)
		return wf_diag_set(diag, WF_EINVAL, "stage create: NULL argument");
	st = calloc(1, sizeof(*st));
	if (!st)
		return -ENOMEM;
	st->dev = dev;
	st->io = io;
	ret = resolve_opts(opts, &st->opts, diag);
	if (ret < 0)
		goto err;
	st->slots = calloc(st->opts.n_buffers, sizeof(*st->slots));
	if (!st->slots) {
		ret = -ENOMEM;
		goto err;
	}
	st->ring_size = (size_t)st->opts.n_buffers * st->opts.buffer_size;
	ret = wf_device_pinned_alloc(
	    dev, st->ring_size,
	    (st->opts.flags & WF_STAGE_OPT_WRITE_COMBINED) ? WF_DEVICE_PINNED_WRITE_COMBINED : 0,
	    &st->ring, diag);
	if (ret < 0)
		goto err;
	/* The device backend may not have done it (cudaHostAlloc does not): a fork()ed child
	 * touching a staging page would leave the device reading the parent's stale copy. The
	 * ring is page-aligned by both backends; align inward anyway. */
	{
		uintptr_t a = ((uintptr_t)st->ring + PAGE - 1) & ~(uintptr_t)(PAGE - 1);
		uintptr_t e = ((uintptr_t)st->ring + st->ring_size) & ~(uintptr_t)(PAGE - 1);
		if (e > a)
			(void)madvise((void *)a, e - a, MADV_DONTFORK);
	}
	if (!(st->opts.flags & WF_STAGE_OPT_NO_REGISTER))
		st->io_registered = wf_io_buffer_register(io, st->ring, st->ring_size) == 0;
	for (unsigned i = 0; i < st->opts.n_streams; i++) {
		ret = wf_device_stream_create(dev, &st->streams[i], diag);
		if (ret < 0)
			goto err;
	}
	for (unsigned i = 0; i < st->opts.n_buffers; i++) {
		struct slot *s = &st->slots[i];
		s->buf = (unsigned char *)st->ring + (size_t)i * st->opts.buffer_size;
		s->stream = i % st->opts.n_streams;
		ret = wf_device_event_create(dev, 0, &s->ev, diag);
		if (ret < 0)
			goto err;
	}
	*ret_stage = st;
	return 0;
err:
	wf_stage_destroy(st);
	return ret;
}

void wf_stage_destroy(struct wf_stage *st)
{
	if (!st)
		return;
	for (unsigned i = 0; i < WF_STAGE_STREAMS_MAX; i++)
		if (st->streams[i])
			(void)wf_device_stream_synchronize(st->streams[i], NULL);
	if (st->slots) {
		for (unsigned i = 0; i < st->opts.n_buffers; i++) {
			wf_device_event_destroy(st->slots[i].ev);
			free(st->slots[i].reads);
			free(st->slots[i].copies);
		}
	}
	for (unsigned i = 0; i < WF_STAGE_STREAMS_MAX; i++)
		wf_device_stream_destroy(st->streams[i]);
	if (st->io_registered)
		(void)wf_io_buffer_unregister(st->io, st->ring);
	if (st->ring)
		(void)wf_device_pinned_free(st->dev, st->ring, NULL);
	free(st->slots);
	free(st);
}

int wf_stage_info_planned(const struct wf_stage_opts *opts, struct wf_stage_info *ret_info,
                          struct wf_diag *diag)
{
	struct wf_stage_opts o;
	int ret = resolve_opts(opts, &o, diag);
	if (ret < 0)
		return ret;
	*ret_info = (struct wf_stage_info){
	    .n_buffers = o.n_buffers,
	    .buffer_size = o.buffer_size,
	    .n_streams = o.n_streams,
	    .preferred = WF_STAGE_MODE_DIRECT,
	};
	return 0;
}

void wf_stage_info(const struct wf_stage *st, struct wf_stage_info *ret_info)
{
	*ret_info = (struct wf_stage_info){
	    .n_buffers = st->opts.n_buffers,
	    .buffer_size = st->opts.buffer_size,
	    .n_streams = st->opts.n_streams,
	    .io_registered = st->io_registered,
	    .preferred = st->preferred == WF_STAGE_MODE_AUTO ? WF_STAGE_MODE_DIRECT : st->preferred,
	    .calibrated = st->calibrated,
	    .staged_gbps = st->staged_gbps,
	    .direct_gbps = st->direct_gbps,
	};
}

/* ---- planning ------------------------------------------------------------------------------- */

static int grow(void **arr, size_t *cap, size_t need, size_t elem)
{
	size_t ncap;
	void *p;

	if (need <= *cap)
		return 0;
	ncap = *cap ? *cap * 2 : 16;
	while (ncap < need)
		ncap *= 2;
	p = realloc(*arr, ncap * elem);
	if (!p)
		return -ENOMEM;
	*arr = p;
	*cap = ncap;
	return 0;
}

/* Fills slot s with the next batch from the cursor: up to buffer_size bytes of buffer (STAGED)
 * or of copy (DIRECT). Returns 0 (the batch may hold less than a buffer when the items end) or
 * -ENOMEM. */
static int plan(struct run *r, struct slot *s)
{
	const size_t cap = r->st->opts.buffer_size;
	const bool staged = r->mode == WF_STAGE_MODE_STAGED;
	uint64_t run_end = 0;
	size_t p = 0;

	s->n_reads = s->n_copies = 0;
	s->reads_submitted = 0;
	s->bytes = 0;
	while (r->cur_item < r->n) {
		const struct wf_stage_item *it = &r->items[r->cur_item];
		uint64_t src, rem, len;
		size_t start;
		bool same_run = false;

		if (r->cur_pos == it->len) {
			r->cur_item++;
			r->cur_pos = 0;
			continue;
		}
		src = it->offset + r->cur_pos;
		rem = it->len - r->cur_pos;
		if (s->n_reads && src >= run_end && src - run_end <= WF_STAGE_MERGE_GAP) {
			/* Reading a small gap along is cheaper than another request. When the gap
			 * does not fit, the next buffer starts with this item: a sliver of it here
			 * would only cost another read and copy. */
			if (p + (src - run_end) >= cap)
				break;
			start = p + (size_t)(src - run_end);
			same_run = true;
		} else {
			/* A new read lands at the source offset's phase modulo the page, so the
			 * reader can take its body with O_DIRECT. */
			start = staged ? p + (size_t)((src - p) & (PAGE - 1)) : p;
			if (start >= cap)
				break;
		}
		len = rem < cap - start ? rem : cap - start;

		if (same_run) {
			s->reads[s->n_reads - 1].len += (start - p) + len;
		} else {
			if (grow((void **)&s->reads, &s->cap_reads, s->n_reads + 1,
			         sizeof(*s->reads)) < 0)
				return -ENOMEM;
			s->reads[s->n_reads++] = (struct seg_read){src, len, start};
		}
		run_end = src + len;

		/* Merge the copy with the previous one when both sit in one run and keep their
		 * spacing in one device allocation: then the bytes between are copied along. */
		struct seg_copy *c = s->n_copies ? &s->copies[s->n_copies - 1] : NULL;
		unsigned char *dst = (unsigned char *)it->dst + r->cur_pos;
		if (same_run && c && it->group && c->group == it->group && dst > c->dst &&
		    (uintptr_t)(dst - c->dst) == start - c->boff) {
			c->len = start + len - c->boff;
		} else {
			if (grow((void **)&s->copies, &s->cap_copies, s->n_copies + 1,
			         sizeof(*s->copies)) < 0)
				return -ENOMEM;
			s->copies[s->n_copies++] =
			    (struct seg_copy){start, src, dst, len, it->group};
		}
		s->bytes += len;
		p = start + len;
		r->cur_pos += len;
	}
	return 0;
}

static bool planned_all(struct run *r)
{
	while (r->cur_item < r->n && r->cur_pos == r->items[r->cur_item].len) {
		r->cur_item++;
		r->cur_pos = 0;
	}
	return r->cur_item >= r->n;
}

/* ---- the pipeline ---------------------------------------------------------------------------- */

static bool canceled(const struct run *r)
{
	return r->ctl && r->ctl->cancel && __atomic_load_n(r->ctl->cancel, __ATOMIC_RELAXED);
}

/* Submits what the reader takes of s's reads. -EAGAIN (the reader's request table is full) is
 * not an error: the rest goes out after the next reap. */
static int submit_reads(struct run *r, struct slot *s, unsigned idx)
{
	while (s->reads_submitted < s->n_reads) {
		const struct seg_read *rd = &s->reads[s->reads_submitted];
		uint64_t ud = ((uint64_t)idx << 32) | s->reads_submitted;
		int ret = wf_io_submit(r->st->io, r->file, rd->off, (size_t)rd->len,
		                       s->buf + rd->boff, ud);
		if (ret == -EAGAIN)
			return 0;
		if (ret < 0)
			return wf_diag_set(r->diag, ret,
			                   "stage: read of %" PRIu64 " bytes at %" PRIu64 ": %s",
			                   rd->len, rd->off, wf_strerror(ret));
		s->reads_submitted++;
		r->stats.reads++;
		r->stats.bytes_read += rd->len;
	}
	return 0;
}

static int queue_copies(struct run *r, struct slot *s)
{
	struct wf_device_stream *stream = r->st->streams[s->stream];
	int ret;

	for (size_t i = 0; i < s->n_copies; i++) {
		const struct seg_copy *c = &s->copies[i];
		const void *from =
		    r->mode == WF_STAGE_MODE_STAGED
		        ? (const void *)(s->buf + c->boff)
		        : (const void *)((const unsigned char *)r->src->map + c->src_off);
		ret = wf_device_memcpy_async(stream, c->dst, from, (size_t)c->len,
		                             WF_DEVICE_COPY_H2D, r->diag);
		if (ret < 0)
			return ret;
		r->stats.copies++;
	}
	ret = wf_device_event_record(s->ev, stream, r->diag);
	if (ret < 0)
		return ret;
	s->state = SLOT_COPYING;
	return 0;
}

/* Fills free slots in ring order and starts them. */
static int fill(struct run *r, bool *progressed)
{
	struct wf_stage *st = r->st;
	int ret;

	while (st->slots[r->next_fill].state == SLOT_FREE && !planned_all(r)) {
		unsigned idx = r->next_fill;
		struct slot *s = &st->slots[idx];

		ret = plan(r, s);
		if (ret < 0)
			return ret;
		s->seq = r->next_seq++;
		r->stats.batches++;
		r->next_fill = (r->next_fill + 1) % st->opts.n_buffers;
		*progressed = true;
		if (r->mode == WF_STAGE_MODE_DIRECT) {
			ret = queue_copies(r, s);
		} else {
			s->state = SLOT_READING;
			s->reads_left = s->n_reads;
			ret = submit_reads(r, s, idx);
		}
		if (ret < 0)
			return ret;
	}
	return 0;
}

static int handle_cqes(struct run *r, const struct wf_io_cqe *cqes, int n)
{
	for (int i = 0; i < n; i++) {
		unsigned idx = (unsigned)(cqes[i].user_data >> 32);
		size_t k = (size_t)(cqes[i].user_data & 0xffffffffu);
		struct slot *s;
		int ret;

		if (idx >= r->st->opts.n_buffers)
			return wf_diag_set(r->diag, WF_EINTERNAL,
			                   "stage: stray completion %#" PRIx64, cqes[i].user_data);
		s = &r->st->slots[idx];
		if (cqes[i].res < 0)
			return wf_diag_set(
			    r->diag, cqes[i].res,
			    "stage: read of %" PRIu64 " bytes at source offset %" PRIu64 "%s%s: %s",
			    s->reads[k].len, s->reads[k].off, r->src->path ? " of " : "",
			    r->src->path ? r->src->path : "", wf_strerror(cqes[i].res));
		if (--s->reads_left == 0) {
			ret = queue_copies(r, s);
			if (ret < 0)
				return ret;
		}
	}
	return 0;
}

static int reap(struct run *r, unsigned min_wait, int64_t timeout_ns, bool *progressed)
{
	struct wf_io_cqe cqes[REAP_MAX];
	int n;

	if (wf_io_outstanding(r->st->io) == 0)
		return 0;
	n = wf_io_reap(r->st->io, cqes, REAP_MAX, min_wait, timeout_ns);
	if (n < 0)
		return wf_diag_set(r->diag, n, "stage: reaping reads: %s", wf_strerror(n));
	if (n > 0)
		*progressed = true;
	return handle_cqes(r, cqes, n);
}

static void slot_done(struct run *r, struct slot *s)
{
	s->state = SLOT_FREE;
	r->done += s->bytes;
	if (r->ctl && r->ctl->progress)
		r->ctl->progress(r->ctl->progress_ctx, r->done, r->total);
}

/* Retires slots whose copies completed; resubmits reads the reader had no room for. */
static int poll_slots(struct run *r, bool *progressed)
{
	struct wf_stage *st = r->st;

	for (unsigned i = 0; i < st->opts.n_buffers; i++) {
		struct slot *s = &st->slots[i];
		int ret;

		if (s->state == SLOT_READING && s->reads_submitted < s->n_reads) {
			size_t before = s->reads_submitted;
			ret = submit_reads(r, s, i);
			if (ret < 0)
				return ret;
			*progressed |= s->reads_submitted != before;
		}
		if (s->state != SLOT_COPYING)
			continue;
		ret = wf_device_event_query(s->ev, r->diag);
		if (ret == -EAGAIN)
			continue;
		if (ret < 0)
			return ret;
		slot_done(r, s);
		*progressed = true;
	}
	return 0;
}

static struct slot *oldest_busy(struct run *r)
{
	struct slot *best = NULL;

	for (unsigned i = 0; i < r->st->opts.n_buffers; i++) {
		struct slot *s = &r->st->slots[i];
		if (s->state != SLOT_FREE && (!best || s->seq < best->seq))
			best = s;
	}
	return best;
}

/* Nothing moved: wait for the oldest slot in flight. */
static int wait_oldest(struct run *r)
{
	struct slot *s = oldest_busy(r);
	bool progressed = false;
	int ret;

	if (!s)
		return 0;
	if (s->state == SLOT_READING)
		return reap(r, 1, REAP_WAIT_NS, &progressed);
	ret = wf_device_event_synchronize(s->ev, r->diag);
	if (ret < 0)
		return ret;
	slot_done(r, s);
	return 0;
}

/* After a failure or cancel: no read may still write a buffer, no copy still read one or write a
 * destination, and every slot is free for the next load. */
static void drain(struct run *r)
{
	struct wf_stage *st = r->st;
	struct wf_io_cqe cqes[REAP_MAX];

	if (wf_io_outstanding(st->io)) {
		wf_io_cancel(st->io);
		while (wf_io_outstanding(st->io))
			if (wf_io_reap(st->io, cqes, REAP_MAX, 1, -1) < 0)
				break;
	}
	for (unsigned i = 0; i < st->opts.n_streams; i++)
		(void)wf_device_stream_synchronize(st->streams[i], NULL);
	for (unsigned i = 0; i < st->opts.n_buffers; i++)
		st->slots[i].state = SLOT_FREE;
}

static int run_pipeline(struct run *r)
{
	int ret = 0;

	for (;;) {
		bool progressed = false;

		if (canceled(r)) {
			ret = wf_diag_set(r->diag, WF_ECANCELED,
			                  "stage: load canceled after %" PRIu64 " of %" PRIu64
			                  " bytes",
			                  r->done, r->total);
			break;
		}
		ret = fill(r, &progressed);
		if (ret < 0)
			break;
		ret = reap(r, 0, 0, &progressed);
		if (ret < 0)
			break;
		ret = poll_slots(r, &progressed);
		if (ret < 0)
			break;
		if (planned_all(r) && !oldest_busy(r))
			break;
		if (!progressed) {
			ret = wait_oldest(r);
			if (ret < 0)
				break;
		}
	}
	if (ret < 0)
		drain(r);
	return ret;
}

/* ---- load ------------------------------------------------------------------------------------ */

static int check_items(const struct wf_stage_item *items, size_t n, const struct wf_stage_src *src,
                       enum wf_stage_mode mode, uint64_t *ret_total, struct wf_diag *diag)
{
	uint64_t total = 0;

	for (size_t i = 0; i < n; i++) {
		const struct wf_stage_item *it = &items[i];
		if (!it->len)
			continue;
		if (!it->dst)
			return wf_diag_set(diag, WF_EINVAL, "stage: item %zu has no destination",
			                   i);
		if (it->offset + it->len < it->offset || it->len > SIZE_MAX ||
		    (uintptr_t)it->dst + it->len < (uintptr_t)it->dst || total + it->len < total)
			return wf_diag_set(diag, WF_EOVERFLOW,
			                   "stage: item %zu (%" PRIu64 " bytes at %" PRIu64
			                   ") overflows",
			                   i, it->len, it->offset);
		if (mode == WF_STAGE_MODE_DIRECT && it->offset + it->len > src->map_size)
			return wf_diag_set(diag, WF_EINVAL,
			                   "stage: item %zu (%" PRIu64 " bytes at %" PRIu64
			                   ") ends past the mapping (%zu bytes)",
			                   i, it->len, it->offset, src->map_size);
		total += it->len;
	}
	*ret_total = total;
	return 0;
}

static int open_source(struct run *r)
{
	const struct wf_stage_src *src = r->src;
	struct wf_io_file_info fi;
	int ret;

	if (src->path)
		ret = wf_io_file_open(r->st->io, src->path, 0, &r->file);
	else
		ret = wf_io_file_open_fd(r->st->io, src->fd, 0, &r->file);
	if (ret < 0)
		return wf_diag_set(r->diag, ret, "stage: open %s: %s",
		                   src->path ? src->path : "floor descriptor", wf_strerror(ret));
	wf_io_file_info(r->file, &fi);
	if ((src->expect_size && fi.size != src->expect_size) ||
	    (src->expect_mtime_ns && fi.mtime_ns != src->expect_mtime_ns))
		return wf_diag_set(r->diag, WF_ECHANGED,
		                   "stage: %s changed since the model was opened (size %" PRIu64
		                   ", expected %" PRIu64 ")",
		                   src->path ? src->path : "source", fi.size, src->expect_size);
	return 0;
}

int wf_stage_load(struct wf_stage *st, const struct wf_stage_src *src,
                  const struct wf_stage_item *items, size_t n, const struct wf_stage_ctl *ctl,
                  struct wf_stage_stats *ret_stats, struct wf_diag *diag)
{
	struct run r = {.st = st, .src = src, .items = items, .n = n, .ctl = ctl, .diag = diag};
	enum wf_stage_mode want = ctl ? ctl->mode : WF_STAGE_MODE_AUTO;
	bool registered = false;
	double t0 = now_s();
	int ret;

	if (!st || !src || (n && !items) || (unsigned)want >= WF_STAGE_MODE_MAX)
		return wf_diag_set(diag, WF_EINVAL, "stage load: bad argument");
	if (!src->path && src->fd < 0)
		return wf_diag_set(diag, WF_EINVAL, "stage load: source has neither fd nor path");
	if (want == WF_STAGE_MODE_DIRECT && !src->map)
		return wf_diag_set(diag, WF_EINVAL,
		                   "stage load: direct mode needs a mapped source");
	if (want == WF_STAGE_MODE_AUTO) {
		enum wf_stage_mode pref = st->preferred ? st->preferred : WF_STAGE_MODE_DIRECT;
		want = src->map ? pref : WF_STAGE_MODE_STAGED;
	}
	r.mode = want;
	ret = check_items(items, n, src, r.mode, &r.total, diag);
	if (ret < 0)
		return ret;

	if (r.mode == WF_STAGE_MODE_DIRECT && !src->map_registered) {
		ret = wf_device_host_register(st->dev, src->map, src->map_size,
		                              WF_DEVICE_REGISTER_READONLY, NULL, diag);
		if (ret < 0 && (!ctl || ctl->mode == WF_STAGE_MODE_AUTO)) {
			/* A device that cannot pin the floor still gets the bytes, staged. */
			wf_diag_clear(diag);
			r.mode = WF_STAGE_MODE_STAGED;
		} else if (ret < 0) {
			return ret;
		} else {
			registered = true;
		}
	}
	if (r.mode == WF_STAGE_MODE_STAGED) {
		ret = open_source(&r);
		if (ret < 0)
			goto out;
	}
	ret = run_pipeline(&r);
	if (ret == 0 && r.file && src->path) {
		ret = wf_io_file_check(r.file);
		if (ret < 0)
			wf_diag_set(diag, ret, "stage: %s changed while it was read", src->path);
	}
out:
	wf_io_file_close(r.file);
	if (registered)
		(void)wf_device_host_unregister(st->dev, src->map, NULL);
	if (ret < 0)
		return ret;
	if (r.total && r.done != r.total)
		return wf_diag_set(diag, WF_EINTERNAL,
		                   "stage: %" PRIu64 " of %" PRIu64 " bytes moved", r.done,
		                   r.total);
	r.stats.mode = r.mode;
	r.stats.bytes = r.total;
	r.stats.seconds = now_s() - t0;
	r.stats.gbps = r.stats.seconds > 0 ? (double)r.total / r.stats.seconds / 1e9 : 0;
	if (r.total == 0 && ctl && ctl->progress)
		ctl->progress(ctl->progress_ctx, 0, 0);
	if (ret_stats)
		*ret_stats = r.stats;
	return 0;
}

int wf_stage_calibrate(struct wf_stage *st, const struct wf_stage_src *src,
                       const struct wf_stage_item *items, size_t n, uint64_t max_bytes,
                       const volatile int *cancel, struct wf_stage_stats *ret_staged,
                       struct wf_stage_stats *ret_direct, struct wf_diag *diag)
{
	struct wf_stage_stats s = {0}, d = {0};
	struct wf_stage_ctl ctl = {.cancel = cancel};
	uint64_t sum = 0;
	size_t k = 0;
	int ret;

	if (!st || !src || !src->map || (n && !items))
		return wf_diag_set(diag, WF_EINVAL, "stage calibrate: needs a mapped source");
	/* The prefix: whole items up to max_bytes, at least one. */
	while (k < n && (!max_bytes || k == 0 || sum + items[k].len <= max_bytes))
		sum += items[k++].len;
	ctl.mode = WF_STAGE_MODE_STAGED;
	ret = wf_stage_load(st, src, items, k, &ctl, &s, diag);
	if (ret < 0)
		return ret;
	ctl.mode = WF_STAGE_MODE_DIRECT;
	ret = wf_stage_load(st, src, items, k, &ctl, &d, diag);
	if (ret < 0)
		return ret;
	st->preferred = d.gbps >= s.gbps ? WF_STAGE_MODE_DIRECT : WF_STAGE_MODE_STAGED;
	st->calibrated = true;
	st->staged_gbps = s.gbps;
	st->direct_gbps = d.gbps;
	if (ret_staged)
		*ret_staged = s;
	if (ret_direct)
		*ret_direct = d;
	return 0;
}

/* ---- verify ---------------------------------------------------------------------------------- */

int wf_stage_verify(struct wf_device *dev, const struct wf_stage_src *src,
                    const struct wf_stage_item *items, size_t n, size_t *ret_bad,
                    struct wf_diag *diag)
{
	struct wf_device_stream *stream = NULL;
	const unsigned char *base = src ? src->map : NULL;
	void *own = NULL;
	size_t own_size = 0, i = 0;
	int fd = -1, ret;

	if (!dev || !src || (n && !items))
		return wf_diag_set(diag, WF_EINVAL, "stage verify: bad argument");
	if (!base) {
		struct stat stb;
		fd = src->path ? open(src->path, O_RDONLY | O_CLOEXEC) : dup(src->fd);
		if (fd < 0)
			return wf_diag_set(diag, -errno, "stage verify: open %s: %s",
			                   src->path ? src->path : "source", strerror(errno));
		if (fstat(fd, &stb) < 0) {
			ret = wf_diag_set(diag, -errno, "stage verify: fstat: %s", strerror(errno));
			goto out;
		}
		own_size = (size_t)stb.st_size;
		if (own_size) {
			own = mmap(NULL, own_size, PROT_READ, MAP_PRIVATE, fd, 0);
			if (own == MAP_FAILED) {
				own = NULL;
				ret = wf_diag_set(diag, -errno, "stage verify: mmap: %s",
				                  strerror(errno));
				goto out;
			}
		}
		base = own;
	}
	ret = wf_device_synchronize(dev, diag);
	if (ret < 0)
		goto out;
	ret = wf_device_stream_create(dev, &stream, diag);
	if (ret < 0)
		goto out;
	for (i = 0; i < n; i++) {
		const struct wf_stage_item *it = &items[i];
		uint64_t want, got;
		size_t limit = own ? own_size : src->map_size;

		if (!it->len)
			continue;
		if (it->offset + it->len < it->offset || it->offset + it->len > limit) {
			ret = wf_diag_set(diag, WF_ETRUNCATED,
			                  "stage verify: item %zu (%" PRIu64 " bytes at %" PRIu64
			                  ") ends past the source (%zu bytes)",
			                  i, it->len, it->offset, limit);
			goto bad;
		}
		ret = wf_device_checksum(stream, it->dst, (size_t)it->len, &got, diag);
		if (ret < 0)
			goto bad;
		want = wf_device_checksum_host(base + it->offset, (size_t)it->len);
		if (want != got) {
			ret = wf_diag_set(diag, WF_ECHECKSUM,
			                  "stage verify: item %zu (%" PRIu64 " bytes at %" PRIu64
			                  "): device checksum %016" PRIx64 ", source %016" PRIx64,
			                  i, it->len, it->offset, got, want);
			goto bad;
		}
	}
	ret = 0;
	goto out;
bad:
	if (ret_bad)
		*ret_bad = i;
out:
	wf_device_stream_destroy(stream);
	if (own)
		munmap(own, own_size);
	if (fd >= 0)
		close(fd);
	return ret;
}
