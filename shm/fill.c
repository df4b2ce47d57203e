/* The standard fill. On tmpfs it streams each file window through a small ring of bounce buffers:
 *   read    chunks in the page cache are read here with pread (cachestat(2) tells); the others
 *           go to libwfio (io_uring, O_DIRECT where the file system has it), several in flight;
 *   hash    in file order, each chunk feeds the xxh3 of the tensors it holds, so the library
 *           skips its own pass over the region (checksums_set);
 *   write   a writer thread pwrites the chunks in order with wf_shm_fill_write(), which also
 *           reserves the pages as it goes under WF_SHM_ATTACH_STREAM.
 * Why not read straight into the writable mapping, as this fill once did: every 4 KiB page of a
 * MAP_SHARED tmpfs mapping needs its page table entry populated (by faults or MAP_POPULATE), which
 * we measured at 0.38 s per GB, four times the copy; pwrite reaches the pages without them, and
 * the hashing reads a buffer still in cache instead of the region. Why a writer thread: allocating
 * and filling tmpfs pages (0.33 s per GB here) is serialized by the inode lock and is the longest
 * stage; on its own thread it overlaps the reading and hashing (warm) and the disk (cold).
 *
 * On hugetlbfs, which has no write(), the reads go straight into the mapping (huge pages need
 * few entries) and the library hashes afterwards. */
#include "shm/fill.h"

#include "base/error.h"
#include "io/pagecache.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

/* Bounce ring: enough bytes in flight for a virtual or NVMe disk at queue depth (16 x 1 MiB reads
 * measured as fast as fio's 64 x 1 MiB here), small enough that touching it costs little. */
#define RING_BYTES_DEFAULT (16u << 20)
#define RING_SLOTS_MIN     2u
#define POLL_NS            (50 * 1000 * 1000LL)

/* A bounce buffer goes FREE -> READING (submitted) -> READ (completed) -> WRITING (hashed, handed
 * to the writer) -> FREE. The ring is a FIFO: slots are submitted, hashed and written in order. */
enum slot_state { SLOT_FREE, SLOT_READING, SLOT_READ, SLOT_WRITING };

struct slot {
	uint8_t *buf;
	uint32_t file;
	uint64_t src;   /* file offset */
	uint64_t floor; /* region offset */
	uint64_t len;
	unsigned state; /* enum slot_state, via slot_get()/slot_set(); waited on under mu */
	int res;
};

/* Slot states are read by both threads. Only the main thread moves a slot to READING, READ and
 * WRITING, only the writer moves it to FREE, and the hand-overs (to WRITING, to FREE) happen under
 * mu, which orders the buffer's bytes; the atomics only keep the other loads and stores whole. */
static enum slot_state slot_get(const struct slot *sl)
{
	return (enum slot_state)__atomic_load_n(&sl->state, __ATOMIC_RELAXED);
}

static void slot_set(struct slot *sl, enum slot_state st)
{
	__atomic_store_n(&sl->state, (unsigned)st, __ATOMIC_RELAXED);
}

/* A tensor whose bytes span chunks, hashed incrementally. */
struct open_sum {
	uint32_t tensor;
	uint64_t end; /* region offset past its last byte */
	XXH3_state_t *st;
};

struct stream {
	const struct wf_shm_fill *job;
	const struct wf_shm_fill_io *fi;
	struct wf_io_reader *rd;
	struct wf_io_file **files;
	int *fds;         /* buffered descriptors for chunks read here from the page cache, or -1 */
	struct stat *st0; /* each file as fstat saw it when its read began (the torn-file check) */
	bool probe;       /* cachestat(2) works */

	uint8_t *ring;
	size_t ring_bytes, chunk;
	bool registered;
	struct slot *slots;
	unsigned n_slots, head, tail; /* head: oldest not yet hashed; tail: next to submit */
	unsigned reading;             /* slots READING */

	/* The writer thread: writes WRITING slots in order, so that the copy into the region (and
	 * the page allocation that comes with it, serialized by the inode lock) runs beside the
	 * reading and hashing instead of after them. Without a thread the main thread writes. */
	pthread_t writer;
	bool sync_init, has_writer, stop;
	pthread_mutex_t mu;
	pthread_cond_t work, freed; /* writer waits for work; main for freed slots */
	unsigned wcur;              /* next slot to write */
	uint64_t written;
	int werr; /* first write error */
	uint64_t werr_at;

	uint32_t next_file; /* next piece to submit */
	uint64_t next_off;  /* offset inside that file's window */
	uint64_t total, reported;

	/* checksums */
	uint32_t *order;  /* tensor indices by (file, floor offset) */
	uint32_t *first;  /* first[f]..first[f+1]: file f's tensors in order */
	uint32_t *cursor; /* per file: next tensor in order not yet started */
	struct open_sum *open;
	uint32_t n_open, cap_open;
	XXH3_state_t **spare;
	uint32_t n_spare;
	uint32_t hashed;
	bool hash_ok; /* false: some tensor could not be hashed in stream; the library will */
};

static int by_place(const void *a, const void *b, void *arg)
{
	const struct wf_shm_fill_tensor *t = arg;
	const struct wf_shm_fill_tensor *x = &t[*(const uint32_t *)a];
	const struct wf_shm_fill_tensor *y = &t[*(const uint32_t *)b];
	if (x->file != y->file)
		return x->file < y->file ? -1 : 1;
	return (x->floor_offset > y->floor_offset) - (x->floor_offset < y->floor_offset);
}

static int sums_init(struct stream *s)
{
	const struct wf_shm_fill *job = s->job;
	uint32_t n = job->n_tensors, nf = job->n_files;

	s->hash_ok = job->tensors && job->checksums && job->checksums_set;
	if (!s->hash_ok)
		return 0;
	s->order = malloc((n ? n : 1) * sizeof(*s->order));
	s->first = calloc(nf + 1, sizeof(*s->first));
	s->cursor = calloc(nf + 1, sizeof(*s->cursor));
	if (!s->order || !s->first || !s->cursor)
		return -ENOMEM;
	for (uint32_t i = 0; i < n; i++) {
		s->order[i] = i;
		if (job->tensors[i].file >= nf) {
			s->hash_ok = false; /* cannot happen for a layout we computed */
			return 0;
		}
		s->first[job->tensors[i].file + 1]++;
	}
	for (uint32_t f = 0; f < nf; f++)
		s->first[f + 1] += s->first[f];
	memcpy(s->cursor, s->first, (nf + 1) * sizeof(*s->cursor));
	qsort_r(s->order, n, sizeof(*s->order), by_place, (void *)job->tensors);
	return 0;
}

static void sums_fini(struct stream *s)
{
	for (uint32_t i = 0; i < s->n_open; i++)
		XXH3_freeState(s->open[i].st);
	for (uint32_t i = 0; i < s->n_spare; i++)
		XXH3_freeState(s->spare[i]);
	free(s->open);
	free(s->spare);
	free(s->order);
	free(s->first);
	free(s->cursor);
}

static int sum_open(struct stream *s, uint32_t t, uint64_t end, const void *p, size_t n)
{
	XXH3_state_t *st;

	if (s->n_open == s->cap_open) {
		uint32_t cap = s->cap_open ? 2 * s->cap_open : 4;
		struct open_sum *o = realloc(s->open, cap * sizeof(*o));
		XXH3_state_t **sp = realloc(s->spare, cap * sizeof(*sp));
		if (o)
			s->open = o;
		if (sp)
			s->spare = sp;
		if (!o || !sp)
			return -ENOMEM;
		s->cap_open = cap;
	}
	st = s->n_spare ? s->spare[--s->n_spare] : XXH3_createState();
	if (!st)
		return -ENOMEM;
	XXH3_64bits_reset(st);
	XXH3_64bits_update(st, p, n);
	s->open[s->n_open++] = (struct open_sum){.tensor = t, .end = end, .st = st};
	return 0;
}

/* Hashes the tensors in [floor, floor + len) of file f, whose bytes are at buf: finishes those
 * begun in earlier chunks, hashes those that fit whole, begins those that go on. */
static int sums_chunk(struct stream *s, uint32_t f, uint64_t floor, const uint8_t *buf,
                      uint64_t len)
{
	const struct wf_shm_fill_tensor *tt = s->job->tensors;
	uint64_t end = floor + len;

	if (!s->hash_ok)
		return 0;
	for (uint32_t i = 0; i < s->n_open;) {
		struct open_sum *o = &s->open[i];
		uint64_t hi = o->end < end ? o->end : end;
		XXH3_64bits_update(o->st, buf, (size_t)(hi - floor));
		if (o->end > end) {
			i++;
			continue;
		}
		s->job->checksums[o->tensor] = XXH3_64bits_digest(o->st);
		s->hashed++;
		s->spare[s->n_spare++] = o->st;
		*o = s->open[--s->n_open];
	}
	while (s->cursor[f] < s->first[f + 1]) {
		uint32_t t = s->order[s->cursor[f]];
		uint64_t to = tt[t].floor_offset, tend = to + tt[t].nbytes;
		if (to >= end)
			break;
		s->cursor[f]++;
		if (to < floor) {
			/* Before the first chunk of its file: outside what the fill copies. */
			s->hash_ok = false;
			return 0;
		}
		if (tend <= end) {
			s->job->checksums[t] =
			    XXH3_64bits(buf + (to - floor), (size_t)tt[t].nbytes);
			s->hashed++;
		} else {
			int e = sum_open(s, t, tend, buf + (to - floor), (size_t)(end - to));
			if (e < 0)
				return e;
		}
	}
	return 0;
}

/* After the last chunk of file f: what is left did not lie inside the copied bytes, except empty
 * tensors at the very end, whose checksum needs no bytes. */
static void sums_file_done(struct stream *s, uint32_t f)
{
	const struct wf_shm_fill_tensor *tt = s->job->tensors;

	if (!s->hash_ok)
		return;
	for (uint32_t i = 0; i < s->n_open; i++) {
		if (tt[s->open[i].tensor].file == f) {
			s->hash_ok = false;
			return;
		}
	}
	for (; s->cursor[f] < s->first[f + 1]; s->cursor[f]++) {
		uint32_t t = s->order[s->cursor[f]];
		if (tt[t].nbytes != 0) {
			s->hash_ok = false;
			return;
		}
		s->job->checksums[t] = XXH3_64bits(NULL, 0);
		s->hashed++;
	}
}

/* The reader's check (size, mtime and identity as at open) plus what it does not look at: the
 * ctime, which every write and every utimensat(2) moves and which nobody but the kernel can set
 * back, so that a file rewritten in place with its size and mtime restored is caught; and the
 * path, which must still name the file we read (a rename over it would leave a floor of a file
 * that is no longer the model's). 0, WF_ECHANGED, or -errno. */
static int file_check(const struct stream *s, uint32_t f)
{
	const struct stat *a = &s->st0[f];
	struct stat b;
	int rc = wf_io_file_check(s->files[f]);

	if (rc < 0)
		return rc;
	if (fstat(s->fds[f], &b) != 0)
		return -errno;
	if (b.st_dev != a->st_dev || b.st_ino != a->st_ino || b.st_size != a->st_size ||
	    b.st_mtim.tv_sec != a->st_mtim.tv_sec || b.st_mtim.tv_nsec != a->st_mtim.tv_nsec ||
	    b.st_ctim.tv_sec != a->st_ctim.tv_sec || b.st_ctim.tv_nsec != a->st_ctim.tv_nsec)
		return WF_ECHANGED;
	if (stat(s->job->files[f].path, &b) != 0)
		return errno == ENOENT || errno == ENOTDIR ? WF_ECHANGED : -errno;
	if (b.st_dev != a->st_dev || b.st_ino != a->st_ino)
		return WF_ECHANGED;
	return 0;
}

static int file_error(const struct stream *s, uint32_t f, int rc, struct wf_diag *diag)
{
	const char *why = rc == WF_ECHANGED     ? "changed during materialization"
	                  : rc == WF_ETRUNCATED ? "truncated during materialization"
	                                        : wf_strerror(rc);
	return wf_diag_set(diag, rc, "%s: %s", s->job->files[f].path, why);
}

/* True when every page of [off, off + len) of fd is in the page cache. */
static bool chunk_cached(struct stream *s, int fd, uint64_t off, uint64_t len)
{
	bool cached = false;
	if (!s->probe || fd < 0)
		return false;
	int rc = wf_io_pagecache_probe(fd, off, len, &cached);
	s->probe = rc != -ENOSYS && rc != -EPERM;
	return rc == 0 && cached;
}

/* Reads a cached chunk here, synchronously: 0, WF_ETRUNCATED at an early EOF, or -errno. Why not
 * through the reader: io_uring hands such reads to its worker threads (we measured no inline
 * completions), where the copy competes for the CPUs with the writer and lands in another core's
 * cache; here it lands in the cache of the thread that hashes it next. */
static int read_here(int fd, uint8_t *buf, uint64_t off, uint64_t len)
{
	while (len > 0) {
		ssize_t n = pread(fd, buf, (size_t)len, (off_t)off);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			return WF_ETRUNCATED;
		buf += n;
		off += (uint64_t)n;
		len -= (uint64_t)n;
	}
	return 0;
}

/* Queues the next piece into the tail slot. */
static int submit_next(struct stream *s, struct wf_diag *diag)
{
	const struct wf_shm_fill *job = s->job;

	while (s->next_file < job->n_files && s->next_off >= job->files[s->next_file].copy_length) {
		s->next_file++;
		s->next_off = 0;
	}
	if (s->next_file >= job->n_files)
		return 0;
	uint32_t f = s->next_file;
	const struct wf_shm_fill_file *ff = &job->files[f];
	if (s->next_off == 0) {
		/* The start check: refuse before reading when the file already differs. */
		int rc = file_check(s, f);
		if (rc < 0)
			return file_error(s, f, rc, diag);
	}
	struct slot *sl = &s->slots[s->tail];
	uint64_t left = ff->copy_length - s->next_off;
	sl->file = f;
	sl->src = ff->src_offset + s->next_off;
	sl->floor = ff->floor_offset + s->next_off;
	sl->len = left < s->chunk ? left : s->chunk;
	sl->res = 0;
	if (chunk_cached(s, s->fds[f], sl->src, sl->len)) {
		sl->res = read_here(s->fds[f], sl->buf, sl->src, sl->len);
		slot_set(sl, SLOT_READ);
	} else {
		if (!s->registered) {
			/* Registered (pinned once) buffers spare every direct read its page
			 * pinning; optional, and only worth its cost once reads go to the disk. */
			(void)wf_io_buffer_register(s->rd, s->ring, s->ring_bytes);
			s->registered = true;
		}
		int rc =
		    wf_io_submit(s->rd, s->files[f], sl->src, (size_t)sl->len, sl->buf, s->tail);
		if (rc < 0)
			return wf_diag_set(diag, rc, "%s: read: %s", ff->path, wf_strerror(rc));
		slot_set(sl, SLOT_READING);
		s->reading++;
	}
	s->next_off += sl->len;
	s->tail = (s->tail + 1) % s->n_slots;
	return 1;
}

static bool pieces_left(const struct stream *s)
{
	const struct wf_shm_fill *job = s->job;
	for (uint32_t f = s->next_file; f < job->n_files; f++)
		if ((f == s->next_file ? s->next_off : 0) < job->files[f].copy_length)
			return true;
	return false;
}

/* Collects completions; waits up to timeout_ns for at least one when wait is set. */
static int reap(struct stream *s, bool wait, int64_t timeout_ns)
{
	struct wf_io_cqe cqe[32];
	int n = wf_io_reap(s->rd, cqe, 32, wait ? 1 : 0, wait ? timeout_ns : 0);

	if (n < 0)
		return n;
	for (int i = 0; i < n; i++) {
		struct slot *sl = &s->slots[cqe[i].user_data];
		slot_set(sl, SLOT_READ);
		sl->res = cqe[i].res;
		s->reading--;
	}
	return n;
}

static int write_error(int rc, uint64_t at, struct wf_diag *diag)
{
	return wf_diag_set(diag, rc, "writing the region at %llu: %s", (unsigned long long)at,
	                   rc == -ENOSPC ? "no space left" : wf_strerror(rc));
}

static void *writer_main(void *arg)
{
	struct stream *s = arg;

	pthread_mutex_lock(&s->mu);
	for (;;) {
		struct slot *sl = &s->slots[s->wcur];
		while (!s->stop && slot_get(sl) != SLOT_WRITING)
			pthread_cond_wait(&s->work, &s->mu);
		if (s->stop)
			break;
		pthread_mutex_unlock(&s->mu);
		int rc = wf_shm_fill_write(s->job, sl->floor, sl->buf, (size_t)sl->len);
		pthread_mutex_lock(&s->mu);
		if (rc < 0) {
			s->werr = rc;
			s->werr_at = sl->floor;
			pthread_cond_broadcast(&s->freed);
			break;
		}
		slot_set(sl, SLOT_FREE);
		s->written += sl->len;
		s->wcur = (s->wcur + 1) % s->n_slots;
		pthread_cond_broadcast(&s->freed);
	}
	pthread_mutex_unlock(&s->mu);
	return NULL;
}

static void writer_start(struct stream *s)
{
	sigset_t all, old;

	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->work, NULL);
	pthread_cond_init(&s->freed, NULL);
	s->sync_init = true;
	/* Library threads take no process signals: they stay with the caller's threads. */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	s->has_writer = pthread_create(&s->writer, NULL, writer_main, s) == 0;
	pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* Stops the writer after its current write; the ring may be freed afterwards. */
static void writer_stop(struct stream *s)
{
	if (!s->sync_init)
		return; /* never started */
	if (s->has_writer) {
		pthread_mutex_lock(&s->mu);
		s->stop = true;
		pthread_cond_broadcast(&s->work);
		pthread_mutex_unlock(&s->mu);
		pthread_join(s->writer, NULL);
		s->has_writer = false;
	}
	pthread_cond_destroy(&s->freed);
	pthread_cond_destroy(&s->work);
	pthread_mutex_destroy(&s->mu);
}

/* Hands the head slot, hashed, to the writer (or writes it here without one). */
static int hand_over(struct stream *s, struct slot *sl, struct wf_diag *diag)
{
	if (!s->has_writer) {
		int rc = wf_shm_fill_write(s->job, sl->floor, sl->buf, (size_t)sl->len);
		if (rc < 0)
			return write_error(rc, sl->floor, diag);
		slot_set(sl, SLOT_FREE);
		s->written += sl->len;
		return 0;
	}
	pthread_mutex_lock(&s->mu);
	slot_set(sl, SLOT_WRITING);
	pthread_cond_signal(&s->work);
	pthread_mutex_unlock(&s->mu);
	return 0;
}

/* Hashes the oldest slot (its read has completed) and hands it to the writer. */
static int process_head(struct stream *s, struct wf_diag *diag)
{
	const struct wf_shm_fill *job = s->job;
	struct slot *sl = &s->slots[s->head];
	uint32_t f = sl->file;
	int rc = sl->res;

	if (rc == WF_ETRUNCATED && file_check(s, f) == WF_ECHANGED)
		rc = WF_ECHANGED; /* an early EOF from a file that changed says more as that */
	if (rc < 0)
		return file_error(s, f, rc, diag);
	rc = sums_chunk(s, f, sl->floor, sl->buf, sl->len);
	if (rc < 0)
		return wf_diag_set(diag, rc, "hashing tensors: %s", wf_strerror(rc));
	if (sl->src + sl->len == job->files[f].src_offset + job->files[f].copy_length) {
		/* The end check: bytes of a file that changed under the copy are suspect even when
		 * every read succeeded. */
		rc = file_check(s, f);
		if (rc < 0)
			return file_error(s, f, rc, diag);
		sums_file_done(s, f);
	}
	s->head = (s->head + 1) % s->n_slots;
	return hand_over(s, sl, diag);
}

/* Progress over the bytes written so far. */
static void report(struct stream *s)
{
	uint64_t w;

	if (!s->fi->progress)
		return;
	if (s->has_writer) {
		pthread_mutex_lock(&s->mu);
		w = s->written;
		pthread_mutex_unlock(&s->mu);
	} else {
		w = s->written;
	}
	if (w - s->reported >= WF_IO_PROGRESS_DEFAULT && w < s->total) {
		s->fi->progress(s->fi->progress_ctx, w, s->total);
		s->reported = w;
	}
}

static bool cancelled(const struct wf_shm_fill_io *fi)
{
	return fi->cancel && __atomic_load_n(fi->cancel, __ATOMIC_ACQUIRE);
}

/* Frees the ring; the reader must be gone (nothing can still read into it). */
static void ring_free(struct stream *s)
{
	if (s->ring)
		munmap(s->ring, s->ring_bytes);
	s->ring = NULL;
	free(s->slots);
}

static int ring_alloc(struct stream *s, const struct wf_io_reader_info *info, size_t want)
{
	s->chunk = info->chunk_size;
	s->n_slots = (unsigned)(want / s->chunk);
	if (s->n_slots > info->queue_depth)
		s->n_slots = info->queue_depth;
	if (s->n_slots < RING_SLOTS_MIN)
		s->n_slots = RING_SLOTS_MIN;
	s->ring_bytes = (size_t)s->n_slots * s->chunk;
	s->slots = calloc(s->n_slots, sizeof(*s->slots));
	void *p =
	    mmap(NULL, s->ring_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (!s->slots || p == MAP_FAILED)
		return -ENOMEM;
	s->ring = p;
	/* A child forked meanwhile must not share buffers the kernel is reading into; huge pages
	 * make the ring cheap to fault in (where THP is allowed for madvised memory). */
	madvise(p, s->ring_bytes, MADV_DONTFORK);
	madvise(p, s->ring_bytes, MADV_HUGEPAGE);
	for (unsigned i = 0; i < s->n_slots; i++)
		s->slots[i].buf = s->ring + (size_t)i * s->chunk;
	return 0;
}

/* Waits up to POLL_NS for the writer to finish a slot or to fail. 0 or its error. */
static int wait_writer(struct stream *s, struct wf_diag *diag)
{
	struct timespec ts;
	int rc = 0;

	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_nsec += POLL_NS;
	if (ts.tv_nsec >= 1000000000) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000;
	}
	pthread_mutex_lock(&s->mu);
	uint64_t seen = s->written;
	while (s->werr == 0 && s->written == seen)
		if (pthread_cond_timedwait(&s->freed, &s->mu, &ts) == ETIMEDOUT)
			break;
	if (s->werr)
		rc = write_error(s->werr, s->werr_at, diag);
	pthread_mutex_unlock(&s->mu);
	return rc;
}

/* Whether another read may start: the tail slot is free (the writer moves slots from WRITING to
 * FREE; a failed writer frees nothing more). */
static bool may_submit(struct stream *s)
{
	bool ok;

	if (!s->has_writer)
		return slot_get(&s->slots[s->tail]) == SLOT_FREE;
	pthread_mutex_lock(&s->mu);
	ok = s->werr == 0 && slot_get(&s->slots[s->tail]) == SLOT_FREE;
	pthread_mutex_unlock(&s->mu);
	return ok;
}

static int stream_copy(struct stream *s, struct wf_diag *diag)
{
	int rc;

	for (;;) {
		if (cancelled(s->fi))
			return wf_diag_set(diag, WF_ECANCELED, "materialization cancelled");
		/* Oldest first: hashing needs each file's bytes in order. */
		while (slot_get(&s->slots[s->head]) == SLOT_READ) {
			rc = process_head(s, diag);
			if (rc < 0)
				return rc;
		}
		report(s);
		bool more = pieces_left(s);
		if (more && may_submit(s)) {
			/* A chunk in the page cache is read at once and hashed next, while its
			 * bytes are in this CPU's cache; direct reads keep the ring full. */
			rc = submit_next(s, diag);
			if (rc < 0)
				return rc;
			if (s->reading) {
				rc = reap(s, false, 0);
				if (rc < 0)
					return wf_diag_set(diag, rc, "read: %s", wf_strerror(rc));
			}
			continue;
		}
		if (s->reading) {
			rc = reap(s, true, POLL_NS);
			if (rc < 0)
				return wf_diag_set(diag, rc, "read: %s", wf_strerror(rc));
			continue;
		}
		if (!more) {
			/* Everything read and hashed (nothing is READING, the head is not READ):
			 * done once the writer has caught up. */
			bool all = true;
			if (s->has_writer) {
				pthread_mutex_lock(&s->mu);
				all = s->written == s->total;
				pthread_mutex_unlock(&s->mu);
			}
			if (all)
				return 0;
		}
		rc = s->has_writer ? wait_writer(s, diag) : 0;
		if (rc < 0)
			return rc;
	}
}

static int copy_mapped(struct wf_io_reader *rd, struct wf_io_file **files,
                       const struct wf_shm_fill_io *fi, const struct wf_shm_fill *job,
                       struct wf_diag *diag)
{
	struct wf_io_copy_job *jobs = calloc(job->n_files ? job->n_files : 1, sizeof(*jobs));
	if (!jobs)
		return -ENOMEM;
	for (uint32_t i = 0; i < job->n_files; i++) {
		const struct wf_shm_fill_file *ff = &job->files[i];
		jobs[i] = (struct wf_io_copy_job){.file = files[i],
		                                  .offset = ff->src_offset,
		                                  .len = ff->copy_length,
		                                  .dst = ff->dst};
	}
	struct wf_io_copy_ctl ctl = {
	    .progress = fi->progress, .progress_ctx = fi->progress_ctx, .cancel = fi->cancel};
	int rc = wf_io_copy_many(rd, jobs, job->n_files, &ctl);
	if (rc < 0) {
		const char *path = NULL;
		for (uint32_t i = 0; i < job->n_files && !path; i++)
			if (jobs[i].result == rc)
				path = job->files[i].path;
		const char *why = rc == WF_ECHANGED     ? "changed during materialization"
		                  : rc == WF_ETRUNCATED ? "truncated during materialization"
		                  : rc == WF_ECANCELED  ? "materialization cancelled"
		                                        : wf_strerror(rc);
		if (path)
			wf_diag_set(diag, rc, "%s: %s", path, why);
		else
			wf_diag_set(diag, rc, "%s", why);
	}
	free(jobs);
	return rc;
}

int wf_shm_fill_from_files(void *ctx, const struct wf_shm_fill *job, struct wf_diag *diag)
{
	const struct wf_shm_fill_io *fi = ctx;
	struct stream s = {.job = job, .fi = fi};
	struct wf_io_reader_info info;
	int rc;

	s.files = calloc(job->n_files ? job->n_files : 1, sizeof(*s.files));
	s.fds = malloc((job->n_files ? job->n_files : 1) * sizeof(*s.fds));
	s.st0 = calloc(job->n_files ? job->n_files : 1, sizeof(*s.st0));
	if (!s.files || !s.fds || !s.st0) {
		free(s.files);
		free(s.fds);
		free(s.st0);
		return -ENOMEM;
	}
	for (uint32_t i = 0; i < job->n_files; i++)
		s.fds[i] = -1;
	s.probe = !(fi->io.flags & WF_IO_OPT_NO_CACHE_PROBE);
	rc = wf_io_reader_create(&fi->io, &s.rd);
	if (rc < 0) {
		wf_diag_set(diag, rc, "io reader: %s", wf_strerror(rc));
		goto out;
	}
	for (uint32_t i = 0; i < job->n_files; i++) {
		const struct wf_shm_fill_file *ff = &job->files[i];
		struct stat *st = &s.st0[i];
		/* One descriptor per file, opened safely (a FIFO in its place fails instead of
		 * blocking), for the chunks read here; the reader reads a duplicate of it (and
		 * reopens /proc/self/fd for O_DIRECT), so every byte comes from the file checked
		 * below, whatever the path names meanwhile. */
		rc = wf_model_file_open(ff->path, &s.fds[i], st, diag);
		if (rc < 0) {
			wf_diag_set(diag, rc, "%s: %s", ff->path, wf_strerror(rc));
			goto out;
		}
		/* The file the model's reader opened (and its owner checked, e.g. against the
		 * agent's model roots): a path swapped since for another file must not be read. */
		if ((ff->dev || ff->ino) &&
		    ((uint64_t)st->st_dev != ff->dev || (uint64_t)st->st_ino != ff->ino)) {
			rc = wf_diag_set(
			    diag, WF_ECHANGED,
			    "%s is no longer the file that was inventoried (device %llu "
			    "inode %llu, now device %llu inode %llu)",
			    ff->path, (unsigned long long)ff->dev, (unsigned long long)ff->ino,
			    (unsigned long long)st->st_dev, (unsigned long long)st->st_ino);
			goto out;
		}
		rc = wf_io_file_open_fd(s.rd, s.fds[i], 0, &s.files[i]);
		if (rc < 0) {
			wf_diag_set(diag, rc, "%s: %s", ff->path, wf_strerror(rc));
			goto out;
		}
		struct wf_io_file_info fin;
		wf_io_file_info(s.files[i], &fin);
		if (fin.size != ff->file_size || fin.mtime_ns != ff->mtime_ns) {
			rc = wf_diag_set(
			    diag, WF_ECHANGED,
			    "%s changed since it was inventoried (size %llu, now %llu)", ff->path,
			    (unsigned long long)ff->file_size, (unsigned long long)fin.size);
			goto out;
		}
		s.total += ff->copy_length;
	}
	if (fi->before_copy)
		fi->before_copy(fi->before_copy_ctx, s.total);
	if (job->hugetlbfs) {
		rc = copy_mapped(s.rd, s.files, fi, job, diag);
		for (uint32_t i = 0; rc == 0 && i < job->n_files; i++) {
			rc = file_check(&s, i); /* the ctime and path checks the reader lacks */
			if (rc < 0)
				file_error(&s, i, rc, diag);
		}
		goto out;
	}
	if (cancelled(fi)) {
		rc = wf_diag_set(diag, WF_ECANCELED, "materialization cancelled");
		goto out;
	}
	wf_io_reader_info(s.rd, &info);
	rc = ring_alloc(&s, &info, fi->ring_bytes ? fi->ring_bytes : RING_BYTES_DEFAULT);
	if (rc == 0)
		rc = sums_init(&s);
	if (rc < 0) {
		wf_diag_set(diag, rc, "bounce buffers: %s", wf_strerror(rc));
		goto out;
	}
	for (uint32_t i = 0; i < job->n_files; i++)
		if (job->files[i].copy_length == 0)
			sums_file_done(&s, i); /* no chunk will come: its tensors are empty */
	writer_start(&s);
	rc = stream_copy(&s, diag);
	if (rc == 0) {
		if (s.hash_ok && s.hashed == job->n_tensors)
			*job->checksums_set = true;
		if (fi->progress)
			fi->progress(fi->progress_ctx, s.total, s.total);
	}
out:
	writer_stop(&s);
	wf_io_reader_destroy(s.rd); /* waits for reads in flight, closes the files */
	ring_free(&s);
	sums_fini(&s);
	for (uint32_t i = 0; i < job->n_files; i++)
		if (s.fds[i] >= 0)
			close(s.fds[i]);
	free(s.fds);
	free(s.st0);
	free(s.files);
	return rc;
}
