/* The host device backend: device memory is host memory, a stream is a copy thread that also
 * runs the host functions queued on it (so CPU kernels run in stream order, between copies).
 *
 * Why it exists: every residency, staging and post-fetch path must run in CI without a GPU, with
 * the same ordering rules a GPU imposes. So this backend is strict where CUDA is strict (work on
 * a stream runs in order, an event completes when the work captured before it has, a free waits
 * for queued work) and slow where PCIe is slow (the bw option).
 *
 * Memory: each device allocation and pinned buffer is its own anonymous mapping, so freeing it
 * returns the memory to the kernel at once, and the arena accounting (total minus page-rounded
 * live sizes) is exact: an eviction brings mem_info back to the level before the load.
 *
 * Ordering: one mutex per device guards every queue and event; one condition variable per stream
 * wakes its thread, and one per device ("progress") is broadcast whenever any operation
 * completes, so waiters (stream/event/device synchronize, cross-stream waits) recheck their
 * condition. Copies, memsets and host functions run outside the lock. Each operation takes a
 * device-wide sequence number at submission; "all work queued before now" is "every stream's
 * oldest unfinished operation has a larger number", which needs no per-stream snapshot that a
 * concurrent stream_destroy could free.
 *
 * Events: each record creates a capture (a small refcounted completion flag) and queues a marker
 * that completes it in stream order; the event points at its newest capture. Query and
 * synchronize look at the capture current at the call, and a wait queued on another stream
 * holds the capture current at the wait call, so a later record (even one that completes first,
 * on an idle stream) does not release it: CUDA's rule. Captures outlive their event while
 * markers or waits still reference them, so destroying an event with work pending is safe.
 *
 * Throttle: a virtual-clock token bucket per direction (H2D, D2H), shared by all streams as a
 * link is. Each step of a copy reserves bytes/bw seconds on the link clock, copies, then sleeps
 * until the end of its slot. The first step of a copy starts no earlier than now (an idle link
 * banks no credit); later steps continue from the link clock even when the thread fell behind
 * (oversleeping, a busy CPU), up to HOST_CATCHUP_NS, so a copy's duration stays bytes/bw.
 * Steps are about 1 ms of link time, which also bounds how long cancel takes.
 *
 * Shutdown (three steps): cancel sets a flag the threads check between steps and wakes every
 * waiter; stream_destroy closes the queue and joins the thread (it drains what is queued, fast
 * when canceled: skipped work completes with WF_ECANCELED); close frees the device.
 *
 * Faults (tests): fail=N fails single copies (see struct host_dev); sticky=N imitates a CUDA
 * sticky error: the Nth copy "faults" when its stream thread reaches it, the device is then
 * lost for good, and every call fails with WF_EDEVICE (frees still free, so a test leaks
 * nothing). The threads keep draining their queues (copies and memsets skipped, host functions
 * run, events complete with WF_EDEVICE), so no synchronize, destroy or close can hang on a lost
 * device. */
#include "device/device.h"

#include "base/error.h"
#include "base/units.h"
#include "device/internal.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define HOST_DEFAULT_ARENA (8ull << 30)
#define HOST_DEFAULT_CHUNK (16u << 20)
#define HOST_MIN_STEP      (64u << 10)
#define HOST_CATCHUP_NS    100000000ull

struct bucket {
	pthread_mutex_t lock;
	uint64_t next_ns; /* when the link is free again, on CLOCK_MONOTONIC */
};

enum op_type { OP_COPY, OP_MEMSET, OP_MARKER, OP_WAIT, OP_HOST_FN };

/* One record of an event. Guarded by the device lock. */
struct capture {
	int done;
	int status;    /* 0, WF_ECANCELED, or WF_EDEVICE after an injected copy failure */
	uint64_t t_ns; /* completion time */
	unsigned refs; /* the event's (while current), plus one per queued marker or wait */
};

struct op {
	struct op *next;
	enum op_type type;
	uint64_t seq;
	union {
		struct {
			void *dst;
			const void *src;
			size_t size;
			enum wf_device_copy kind;
			int inject; /* fail=N: this copy fails when it runs */
			int sticky; /* sticky=N: this copy faults, and the device is lost */
		} copy;
		struct {
			void *dst;
			int value;
			size_t size;
		} set;
		struct capture *cap; /* OP_MARKER completes it, OP_WAIT waits for it */
		struct {
			wf_device_host_fn fn;
			void *arg;
		} host;
	} u;
};

struct host_stream {
	struct host_dev *d;
	pthread_t thread;
	pthread_cond_t work;
	struct op *head, *tail; /* head: running or next to run; removed when done */
	int closing;
	int fault; /* an injected copy failed since the last marker: the next one reports it */
	struct host_stream *prev, *next;
};

struct host_event {
	unsigned flags;
	struct capture *cur; /* newest record; NULL: never recorded (counts as complete) */
};

struct host_dev {
	uint64_t total, used;
	uint64_t bw; /* bytes per second per direction; 0: unthrottled */
	size_t chunk, step;
	int mlock_pinned;
	size_t page;
	atomic_int canceled;

	/* Fault injection (fail=N), for the tests of what a failing device does to its users:
	 * every Nth H2D copy from a registered range (the floor) fails, alternately when queued
	 * (memcpy_async returns WF_EDEVICE) and when it runs (the copy is skipped and the next
	 * event recorded on its stream completes with WF_EDEVICE). */
	uint64_t fail_every;
	atomic_uint_fast64_t fail_seen;
	/* sticky=N: the Nth copy of any kind loses the device when it runs (dead: for good). */
	uint64_t sticky_after;
	atomic_uint_fast64_t copies_seen;
	atomic_int dead;
	struct {
		uintptr_t lo, hi;
	} reg[16]; /* registered ranges (under lock), for fail=N */
	unsigned n_reg;

	pthread_mutex_t lock;
	pthread_cond_t progress;
	uint64_t next_seq;
	struct host_stream *streams;
	struct bucket h2d, d2h;
};

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void sleep_until(uint64_t t_ns)
{
	struct timespec ts = {.tv_sec = (time_t)(t_ns / 1000000000ull),
	                      .tv_nsec = (long)(t_ns % 1000000000ull)};
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}

/* Reserves the link for n bytes; returns when the slot ends. first: the first step of a copy. */
static uint64_t bucket_reserve(struct bucket *b, uint64_t bw, size_t n, int first)
{
	uint64_t now = now_ns(), start, dur = (uint64_t)((double)n * 1e9 / (double)bw);
	uint64_t floor = first ? now : now - HOST_CATCHUP_NS;

	pthread_mutex_lock(&b->lock);
	start = b->next_ns > floor ? b->next_ns : floor;
	b->next_ns = start + dur;
	pthread_mutex_unlock(&b->lock);
	return start + dur;
}

/* ---- Options --------------------------------------------------------------------------------- */

static int parse_args(struct host_dev *d, const char *args, struct wf_diag *diag)
{
	char buf[256];
	char *save = NULL;

	if (strlen(args) >= sizeof(buf))
		return wf_diag_set(diag, WF_EINVAL, "host device options too long");
	strcpy(buf, args);
	for (char *kv = strtok_r(buf, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
		char *eq = strchr(kv, '=');
		uint64_t v;
		if (!eq)
			return wf_diag_set(diag, WF_EINVAL, "host device option '%s': expected k=v",
			                   kv);
		*eq = '\0';
		if (wf_parse_size(eq + 1, &v) < 0)
			return wf_diag_set(diag, WF_EINVAL, "host device option %s: bad value '%s'",
			                   kv, eq + 1);
		if (strcmp(kv, "mem") == 0) {
			if (v == 0)
				return wf_diag_set(diag, WF_EINVAL, "host device: mem=0");
			d->total = v;
		} else if (strcmp(kv, "bw") == 0) {
			d->bw = v;
		} else if (strcmp(kv, "chunk") == 0) {
			if (v < 4096 || v > (1ull << 30))
				return wf_diag_set(diag, WF_EINVAL,
				                   "host device: chunk must be 4Ki..1Gi");
			d->chunk = (size_t)v;
		} else if (strcmp(kv, "mlock") == 0) {
			if (v > 1)
				return wf_diag_set(diag, WF_EINVAL, "host device: mlock is 0 or 1");
			d->mlock_pinned = (int)v;
		} else if (strcmp(kv, "fail") == 0) {
			d->fail_every = v;
		} else if (strcmp(kv, "sticky") == 0) {
			d->sticky_after = v;
		} else {
			return wf_diag_set(diag, WF_EINVAL,
			                   "host device: unknown option '%s' (mem, bw, chunk, "
			                   "mlock, fail, sticky)",
			                   kv);
		}
	}
	return 0;
}

static int host_probe(void)
{
	return 1;
}

static int host_open(const char *args, void **ret_impl, char *name, size_t name_len,
                     struct wf_diag *diag)
{
	struct host_dev *d = calloc(1, sizeof(*d));
	int ret;

	if (!d)
		return -ENOMEM;
	d->total = HOST_DEFAULT_ARENA;
	d->chunk = HOST_DEFAULT_CHUNK;
	d->page = (size_t)sysconf(_SC_PAGESIZE);
	atomic_init(&d->canceled, 0);
	atomic_init(&d->dead, 0);
	ret = parse_args(d, args, diag);
	if (ret < 0)
		goto err;
	d->step = d->chunk;
	if (d->bw) {
		/* About 1 ms of link time per step, in whole pages. */
		uint64_t s = d->bw / 1000;
		s = s < HOST_MIN_STEP ? HOST_MIN_STEP : s;
		s = s > d->chunk ? d->chunk : s;
		d->step = (size_t)(s & ~(uint64_t)4095);
	}
	pthread_mutex_init(&d->lock, NULL);
	pthread_cond_init(&d->progress, NULL);
	pthread_mutex_init(&d->h2d.lock, NULL);
	pthread_mutex_init(&d->d2h.lock, NULL);
	if (d->bw)
		snprintf(name, name_len, "host (arena %.2f GiB, bw %.3f GiB/s)",
		         (double)d->total / (1 << 30), (double)d->bw / (1 << 30));
	else
		snprintf(name, name_len, "host (arena %.2f GiB, unthrottled)",
		         (double)d->total / (1 << 30));
	*ret_impl = d;
	return 0;
err:
	free(d);
	return ret;
}

static void host_cancel(void *impl)
{
	struct host_dev *d = impl;

	atomic_store(&d->canceled, 1);
	pthread_mutex_lock(&d->lock);
	pthread_cond_broadcast(&d->progress);
	for (struct host_stream *s = d->streams; s; s = s->next)
		pthread_cond_signal(&s->work);
	pthread_mutex_unlock(&d->lock);
}

static void host_close(void *impl)
{
	struct host_dev *d = impl;

	if (!d)
		return;
	pthread_mutex_destroy(&d->d2h.lock);
	pthread_mutex_destroy(&d->h2d.lock);
	pthread_cond_destroy(&d->progress);
	pthread_mutex_destroy(&d->lock);
	free(d);
}

/* WF_EDEVICE (explained) once sticky=N lost the device, else 0. Every call but the void ones
 * checks it first, as every CUDA call fails after a sticky error. */
static int lost(struct host_dev *d, struct wf_diag *diag)
{
	if (!atomic_load_explicit(&d->dead, memory_order_acquire))
		return 0;
	return wf_diag_set(diag, WF_EDEVICE,
	                   "host device lost: injected sticky error at copy %llu (sticky=%llu); "
	                   "every call fails until the process restarts",
	                   (unsigned long long)d->sticky_after,
	                   (unsigned long long)d->sticky_after);
}

static int host_health(void *impl, struct wf_diag *diag)
{
	return lost(impl, diag);
}

static int host_mem_info(void *impl, size_t *ret_free, size_t *ret_total, struct wf_diag *diag)
{
	struct host_dev *d = impl;
	int ret = lost(d, diag);

	if (ret < 0)
		return ret;
	pthread_mutex_lock(&d->lock);
	*ret_free = (size_t)(d->total - d->used);
	*ret_total = (size_t)d->total;
	pthread_mutex_unlock(&d->lock);
	return 0;
}

/* ---- Waiting --------------------------------------------------------------------------------- */

/* True when every operation numbered below seq (on s, or on every stream when s is NULL) has
 * completed. Called with d->lock held. */
static int drained(struct host_dev *d, struct host_stream *s, uint64_t seq)
{
	if (s)
		return !s->head || s->head->seq >= seq;
	for (struct host_stream *t = d->streams; t; t = t->next)
		if (t->head && t->head->seq < seq)
			return 0;
	return 1;
}

static int wait_drained(struct host_dev *d, struct host_stream *s)
{
	pthread_mutex_lock(&d->lock);
	uint64_t seq = d->next_seq;
	while (!drained(d, s, seq))
		pthread_cond_wait(&d->progress, &d->lock);
	pthread_mutex_unlock(&d->lock);
	return atomic_load(&d->canceled) ? WF_ECANCELED : 0;
}

/* A wait that reports a device lost before or while waiting. */
static int wait_checked(struct host_dev *d, struct host_stream *s, struct wf_diag *diag)
{
	int ret = lost(d, diag);

	if (ret < 0)
		return ret;
	ret = wait_drained(d, s);
	return ret < 0 ? ret : lost(d, diag);
}

static int host_synchronize(void *impl, struct wf_diag *diag)
{
	return wait_checked(impl, NULL, diag);
}

/* ---- Memory ---------------------------------------------------------------------------------- */

static size_t round_page(struct host_dev *d, size_t size)
{
	return (size + d->page - 1) & ~(d->page - 1);
}

static int host_mem_alloc(void *impl, size_t size, void **ret_ptr, struct wf_diag *diag)
{
	struct host_dev *d = impl;
	size_t len = round_page(d, size);
	void *p;

	if (len < size)
		return wf_diag_set(diag, -ENOMEM, "host device: %zu bytes overflow", size);
	if (lost(d, diag) < 0)
		return WF_EDEVICE;
	pthread_mutex_lock(&d->lock);
	if (len > d->total - d->used) {
		uint64_t avail = d->total - d->used;
		pthread_mutex_unlock(&d->lock);
		return wf_diag_set(diag, -ENOMEM,
		                   "host device arena: %zu bytes requested, %" PRIu64 " of %" PRIu64
		                   " free",
		                   size, avail, d->total);
	}
	d->used += len;
	pthread_mutex_unlock(&d->lock);

	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED) {
		int err = -errno;
		pthread_mutex_lock(&d->lock);
		d->used -= len;
		pthread_mutex_unlock(&d->lock);
		return wf_diag_set(diag, err, "host device: mmap of %zu bytes: %s", len,
		                   strerror(-err));
	}
	/* Device memory is not inherited by a child, and copying it at fork would be slow. */
	madvise(p, len, MADV_DONTFORK);
	*ret_ptr = p;
	return 0;
}

static int host_mem_free(void *impl, void *ptr, size_t size, struct wf_diag *diag)
{
	struct host_dev *d = impl;
	size_t len = round_page(d, size);

	wait_drained(d, NULL);
	munmap(ptr, len);
	pthread_mutex_lock(&d->lock);
	d->used -= len;
	pthread_mutex_unlock(&d->lock);
	return lost(d, diag);
}

static int host_pinned_alloc(void *impl, size_t size, unsigned flags, void **ret_ptr,
                             struct wf_diag *diag)
{
	struct host_dev *d = impl;
	size_t len = round_page(d, size);
	void *p;
	int err;
	(void)flags; /* write-combining means nothing without a bus in between */

	if (len < size)
		return wf_diag_set(diag, -ENOMEM, "pinned: %zu bytes overflow", size);
	if (lost(d, diag) < 0)
		return WF_EDEVICE;
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED) {
		err = -errno;
		return wf_diag_set(diag, err, "pinned: mmap of %zu bytes: %s", len, strerror(-err));
	}
	/* A child that touched a pinned page would make the parent's copy-on-write copy no
	 * longer the page the device reads. */
	madvise(p, len, MADV_DONTFORK);
	if (d->mlock_pinned && mlock(p, len) < 0) {
		err = -errno;
		munmap(p, len);
		return wf_diag_set(diag, err, "pinned: mlock of %zu bytes: %s (RLIMIT_MEMLOCK?)",
		                   len, strerror(-err));
	}
	*ret_ptr = p;
	return 0;
}

static int host_pinned_free(void *impl, void *ptr, size_t size, struct wf_diag *diag)
{
	struct host_dev *d = impl;

	wait_drained(d, NULL);
	munmap(ptr, round_page(d, size));
	return lost(d, diag);
}

/* Checks that every page of the range is mapped (mincore fails with ENOMEM otherwise), in
 * pieces so a 100 GiB floor needs no 25 MB vector. */
static int host_register(void *impl, const void *ptr, size_t size, unsigned flags,
                         unsigned *ret_flags, struct wf_diag *diag)
{
	struct host_dev *d = impl;
	unsigned char vec[1024];
	uintptr_t start = (uintptr_t)ptr & ~(uintptr_t)(d->page - 1);
	uintptr_t end = (uintptr_t)ptr + size;

	if (lost(d, diag) < 0)
		return WF_EDEVICE;
	for (uintptr_t p = start; p < end;) {
		size_t len = end - p;
		if (len > sizeof(vec) * d->page)
			len = sizeof(vec) * d->page;
		if (mincore((void *)p, len, vec) < 0) {
			int err = -errno;
			return wf_diag_set(diag, err, "host register %p+%zu: %s", ptr, size,
			                   err == -ENOMEM ? "range is not mapped" : strerror(-err));
		}
		p += len;
	}
	pthread_mutex_lock(&d->lock);
	if (d->n_reg < sizeof(d->reg) / sizeof(d->reg[0])) {
		d->reg[d->n_reg].lo = (uintptr_t)ptr;
		d->reg[d->n_reg].hi = (uintptr_t)ptr + size;
		d->n_reg++;
	}
	pthread_mutex_unlock(&d->lock);
	*ret_flags = flags;
	return 0;
}

static int host_unregister(void *impl, const void *ptr, size_t size, struct wf_diag *diag)
{
	struct host_dev *d = impl;
	(void)size;
	wait_drained(impl, NULL);
	pthread_mutex_lock(&d->lock);
	for (unsigned i = 0; i < d->n_reg; i++)
		if (d->reg[i].lo == (uintptr_t)ptr) {
			d->reg[i] = d->reg[--d->n_reg];
			break;
		}
	pthread_mutex_unlock(&d->lock);
	return lost(d, diag);
}

/* fail=N: whether this H2D copy is one to fail (0), and how: WF_EDEVICE now, or 1 when it
 * runs. */
static int injected(struct host_dev *d, const void *src, size_t size)
{
	int hit = 0;
	pthread_mutex_lock(&d->lock);
	for (unsigned i = 0; i < d->n_reg && !hit; i++)
		hit = (uintptr_t)src >= d->reg[i].lo && (uintptr_t)src + size <= d->reg[i].hi;
	pthread_mutex_unlock(&d->lock);
	if (!hit)
		return 0;
	const uint64_t k = atomic_fetch_add(&d->fail_seen, 1) + 1;
	if (k % d->fail_every)
		return 0;
	return (k / d->fail_every) & 1 ? WF_EDEVICE : 1;
}

/* ---- Streams --------------------------------------------------------------------------------- */

/* Called with the device lock held. */
static void capture_unref(struct capture *c)
{
	if (c && --c->refs == 0)
		free(c);
}

/* Runs one step-wise copy or memset. Returns WF_ECANCELED when cancel stopped it. */
static int run_bytes(struct host_dev *d, struct op *op)
{
	int is_copy = op->type == OP_COPY;
	unsigned char *dst = is_copy ? op->u.copy.dst : op->u.set.dst;
	const unsigned char *src = is_copy ? op->u.copy.src : NULL;
	size_t size = is_copy ? op->u.copy.size : op->u.set.size;
	struct bucket *b = NULL;
	size_t step = d->chunk;

	if (is_copy && d->bw && op->u.copy.kind != WF_DEVICE_COPY_D2D) {
		b = op->u.copy.kind == WF_DEVICE_COPY_H2D ? &d->h2d : &d->d2h;
		step = d->step;
	}
	for (size_t off = 0; off < size;) {
		size_t n = size - off < step ? size - off : step;
		uint64_t end = 0;
		if (atomic_load_explicit(&d->canceled, memory_order_relaxed))
			return WF_ECANCELED;
		if (b)
			end = bucket_reserve(b, d->bw, n, off == 0);
		if (is_copy)
			memcpy(dst + off, src + off, n);
		else
			memset(dst + off, op->u.set.value, n);
		if (b)
			sleep_until(end);
		off += n;
	}
	return 0;
}

static void *stream_main(void *arg)
{
	struct host_stream *s = arg;
	struct host_dev *d = s->d;

	pthread_mutex_lock(&d->lock);
	for (;;) {
		while (!s->head && !s->closing)
			pthread_cond_wait(&s->work, &d->lock);
		struct op *op = s->head;
		if (!op)
			break; /* closing and drained */
		switch (op->type) {
		case OP_COPY:
			if (op->u.copy.sticky) { /* sticky=N: the device is lost from now on */
				atomic_store_explicit(&d->dead, 1, memory_order_release);
				break;
			}
			if (op->u.copy.inject) { /* fail=N: the copy "fails" on the device */
				s->fault = WF_EDEVICE;
				break;
			}
			/* fall through */
		case OP_MEMSET:
			/* A lost device runs no more copies (as a faulted GPU context). */
			if (atomic_load_explicit(&d->dead, memory_order_acquire))
				break;
			pthread_mutex_unlock(&d->lock);
			/* A canceled copy stops early; synchronize and events report WF_ECANCELED
			 * from the device's flag. */
			run_bytes(d, op);
			pthread_mutex_lock(&d->lock);
			break;
		case OP_HOST_FN:
			/* Runs even when canceled: fn may own what arg holds (the contract says it
			 * runs once per successful queueing). Outside the lock, like a copy. */
			pthread_mutex_unlock(&d->lock);
			op->u.host.fn(op->u.host.arg);
			pthread_mutex_lock(&d->lock);
			break;
		case OP_WAIT:
			while (!op->u.cap->done && !atomic_load(&d->canceled))
				pthread_cond_wait(&d->progress, &d->lock);
			break;
		case OP_MARKER:
			op->u.cap->done = 1;
			op->u.cap->status = atomic_load(&d->canceled) ? WF_ECANCELED
			                    : atomic_load(&d->dead)   ? WF_EDEVICE
			                                              : s->fault;
			s->fault = 0;
			op->u.cap->t_ns = now_ns();
			break;
		}
		if (op->type == OP_WAIT || op->type == OP_MARKER)
			capture_unref(op->u.cap);
		s->head = op->next;
		if (!s->head)
			s->tail = NULL;
		free(op);
		pthread_cond_broadcast(&d->progress);
	}
	pthread_mutex_unlock(&d->lock);
	return NULL;
}

static int host_stream_create(void *impl, void **ret_stream, struct wf_diag *diag)
{
	struct host_dev *d = impl;
	struct host_stream *s = calloc(1, sizeof(*s));
	sigset_t all, old;
	int ret;

	if (!s)
		return -ENOMEM;
	if ((ret = lost(d, diag)) < 0) {
		free(s);
		return ret;
	}
	s->d = d;
	pthread_cond_init(&s->work, NULL);
	/* The copy thread takes no signals: they belong to the application's threads. */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	ret = -pthread_create(&s->thread, NULL, stream_main, s);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (ret < 0) {
		pthread_cond_destroy(&s->work);
		free(s);
		return wf_diag_set(diag, ret, "host stream: pthread_create: %s", strerror(-ret));
	}
	pthread_mutex_lock(&d->lock);
	s->prev = NULL;
	s->next = d->streams;
	if (d->streams)
		d->streams->prev = s;
	d->streams = s;
	pthread_mutex_unlock(&d->lock);
	*ret_stream = s;
	return 0;
}

static void host_stream_destroy(void *impl, void *stream)
{
	struct host_dev *d = impl;
	struct host_stream *s = stream;

	/* close: no more work, wake the thread; stop: join (it drains the queue first); then
	 * destroy. */
	pthread_mutex_lock(&d->lock);
	s->closing = 1;
	pthread_cond_signal(&s->work);
	pthread_mutex_unlock(&d->lock);
	pthread_join(s->thread, NULL);
	pthread_mutex_lock(&d->lock);
	if (s->prev)
		s->prev->next = s->next;
	else
		d->streams = s->next;
	if (s->next)
		s->next->prev = s->prev;
	pthread_cond_broadcast(&d->progress);
	pthread_mutex_unlock(&d->lock);
	pthread_cond_destroy(&s->work);
	free(s);
}

static int host_stream_synchronize(void *impl, void *stream, struct wf_diag *diag)
{
	return wait_checked(impl, stream, diag);
}

/* Queues op on s; called with d->lock held. */
static void enqueue(struct host_dev *d, struct host_stream *s, struct op *op)
{
	op->seq = d->next_seq++;
	op->next = NULL;
	if (s->tail)
		s->tail->next = op;
	else
		s->head = op;
	s->tail = op;
	pthread_cond_signal(&s->work);
}

static int submit(struct host_dev *d, struct host_stream *s, struct op *op)
{
	pthread_mutex_lock(&d->lock);
	if (atomic_load(&d->canceled)) {
		pthread_mutex_unlock(&d->lock);
		free(op);
		return WF_ECANCELED;
	}
	enqueue(d, s, op);
	pthread_mutex_unlock(&d->lock);
	return 0;
}

static int host_memcpy_async(void *impl, void *stream, void *dst, const void *src, size_t size,
                             enum wf_device_copy kind, struct wf_diag *diag)
{
	struct host_dev *d = impl;
	int inject = 0, sticky = 0;
	if (lost(d, diag) < 0)
		return WF_EDEVICE;
	if (d->fail_every && kind == WF_DEVICE_COPY_H2D &&
	    (inject = injected(d, src, size)) == WF_EDEVICE)
		return wf_diag_set(diag, WF_EDEVICE,
		                   "host device: injected copy failure (fail=%llu)",
		                   (unsigned long long)d->fail_every);
	/* Counted among the copies queued, so fail=N and sticky=N combine. */
	if (d->sticky_after && atomic_fetch_add(&d->copies_seen, 1) + 1 == d->sticky_after)
		sticky = 1;
	struct op *op = calloc(1, sizeof(*op));

	if (!op)
		return -ENOMEM;
	op->type = OP_COPY;
	op->u.copy.inject = inject;
	op->u.copy.sticky = sticky;
	op->u.copy.dst = dst;
	op->u.copy.src = src;
	op->u.copy.size = size;
	op->u.copy.kind = kind;
	return submit(impl, stream, op);
}

static int host_memset_async(void *impl, void *stream, void *dst, int value, size_t size,
                             struct wf_diag *diag)
{
	if (lost(impl, diag) < 0)
		return WF_EDEVICE;
	struct op *op = calloc(1, sizeof(*op));

	if (!op)
		return -ENOMEM;
	op->type = OP_MEMSET;
	op->u.set.dst = dst;
	op->u.set.value = value;
	op->u.set.size = size;
	return submit(impl, stream, op);
}

static int host_host_fn_async(void *impl, void *stream, wf_device_host_fn fn, void *arg,
                              struct wf_diag *diag)
{
	if (lost(impl, diag) < 0)
		return WF_EDEVICE;
	struct op *op = calloc(1, sizeof(*op));

	if (!op)
		return -ENOMEM;
	op->type = OP_HOST_FN;
	op->u.host.fn = fn;
	op->u.host.arg = arg;
	return submit(impl, stream, op);
}

/* No native queue: CPU kernels are host functions on the stream's thread. */
static void *host_stream_native(void *impl, void *stream)
{
	(void)impl;
	(void)stream;
	return NULL;
}

/* ---- Events ---------------------------------------------------------------------------------- */

/* An event's status, explained when it is an error. */
static int capture_status(struct host_dev *d, int status, struct wf_diag *diag)
{
	if (status != WF_EDEVICE)
		return status;
	if (lost(d, diag) < 0)
		return WF_EDEVICE;
	return wf_diag_set(diag, WF_EDEVICE,
	                   "host device: injected copy failure before this event (fail=%llu)",
	                   (unsigned long long)d->fail_every);
}

static int host_event_create(void *impl, unsigned flags, void **ret_event, struct wf_diag *diag)
{
	if (lost(impl, diag) < 0)
		return WF_EDEVICE;
	struct host_event *e = calloc(1, sizeof(*e));

	if (!e)
		return -ENOMEM;
	e->flags = flags;
	*ret_event = e;
	return 0;
}

static void host_event_destroy(void *impl, void *event)
{
	struct host_dev *d = impl;
	struct host_event *e = event;

	pthread_mutex_lock(&d->lock);
	capture_unref(e->cur);
	pthread_mutex_unlock(&d->lock);
	free(e);
}

static int host_event_record(void *impl, void *event, void *stream, struct wf_diag *diag)
{
	struct host_dev *d = impl;
	struct host_event *e = event;
	if (lost(d, diag) < 0)
		return WF_EDEVICE;
	struct op *op = calloc(1, sizeof(*op));
	struct capture *c = calloc(1, sizeof(*c));

	if (!op || !c) {
		free(op);
		free(c);
		return -ENOMEM;
	}
	pthread_mutex_lock(&d->lock);
	if (atomic_load(&d->canceled)) {
		pthread_mutex_unlock(&d->lock);
		free(op);
		free(c);
		return WF_ECANCELED;
	}
	c->refs = 2; /* the event's and the marker's */
	capture_unref(e->cur);
	e->cur = c;
	op->type = OP_MARKER;
	op->u.cap = c;
	enqueue(d, stream, op);
	pthread_mutex_unlock(&d->lock);
	return 0;
}

static int host_stream_wait_event(void *impl, void *stream, void *event, struct wf_diag *diag)
{
	struct host_dev *d = impl;
	struct host_event *e = event;
	if (lost(d, diag) < 0)
		return WF_EDEVICE;
	struct op *op = calloc(1, sizeof(*op));

	if (!op)
		return -ENOMEM;
	pthread_mutex_lock(&d->lock);
	if (atomic_load(&d->canceled)) {
		pthread_mutex_unlock(&d->lock);
		free(op);
		return WF_ECANCELED;
	}
	if (!e->cur || e->cur->done) {
		/* Nothing to wait for (never recorded, or already complete). */
		pthread_mutex_unlock(&d->lock);
		free(op);
		return 0;
	}
	e->cur->refs++;
	op->type = OP_WAIT;
	op->u.cap = e->cur;
	enqueue(d, stream, op);
	pthread_mutex_unlock(&d->lock);
	return 0;
}

static int host_event_query(void *impl, void *event, struct wf_diag *diag)
{
	struct host_dev *d = impl;
	struct host_event *e = event;
	int ret;

	if ((ret = lost(d, diag)) < 0)
		return ret;
	pthread_mutex_lock(&d->lock);
	ret = !e->cur ? 0 : e->cur->done ? e->cur->status : -EAGAIN;
	pthread_mutex_unlock(&d->lock);
	return capture_status(d, ret, diag);
}

static int host_event_synchronize(void *impl, void *event, struct wf_diag *diag)
{
	struct host_dev *d = impl;
	struct host_event *e = event;
	struct capture *c;
	int ret = 0;

	if ((ret = lost(d, diag)) < 0)
		return ret;
	pthread_mutex_lock(&d->lock);
	c = e->cur;
	if (c) {
		/* Hold the capture: a concurrent record may replace it while we sleep. */
		c->refs++;
		while (!c->done)
			pthread_cond_wait(&d->progress, &d->lock);
		ret = c->status;
		capture_unref(c);
	}
	pthread_mutex_unlock(&d->lock);
	return capture_status(d, ret, diag);
}

static int host_event_elapsed_ms(void *impl, void *start, void *end, double *ret_ms,
                                 struct wf_diag *diag)
{
	struct host_dev *d = impl;
	struct host_event *a = start, *b = end;
	int ret = lost(d, diag);

	if (ret < 0)
		return ret;
	pthread_mutex_lock(&d->lock);
	if (!a->cur || !b->cur)
		ret = wf_diag_set(diag, WF_ESTATE, "event elapsed: event never recorded");
	else if (!a->cur->done || !b->cur->done)
		ret = -EAGAIN;
	else
		*ret_ms = ((double)b->cur->t_ns - (double)a->cur->t_ns) / 1e6;
	pthread_mutex_unlock(&d->lock);
	return ret;
}

/* ---- Verification ---------------------------------------------------------------------------- */

static int host_checksum(void *impl, void *stream, const void *ptr, size_t size, uint64_t *ret_sum,
                         struct wf_diag *diag)
{
	int ret = host_stream_synchronize(impl, stream, diag);
	if (ret < 0)
		return ret;
	*ret_sum = wf_device_checksum_host(ptr, size);
	return 0;
}

static const struct wf_device_ops host_ops = {
    .name = "host",
    .kind = WF_DEVICE_KIND_HOST,
    .probe = host_probe,
    .open = host_open,
    .cancel = host_cancel,
    .close = host_close,
    .mem_info = host_mem_info,
    .synchronize = host_synchronize,
    .health = host_health,
    .mem_alloc = host_mem_alloc,
    .mem_free = host_mem_free,
    .pinned_alloc = host_pinned_alloc,
    .pinned_free = host_pinned_free,
    .host_register = host_register,
    .host_unregister = host_unregister,
    .stream_create = host_stream_create,
    .stream_destroy = host_stream_destroy,
    .stream_synchronize = host_stream_synchronize,
    .memcpy_async = host_memcpy_async,
    .memset_async = host_memset_async,
    .event_create = host_event_create,
    .event_destroy = host_event_destroy,
    .event_record = host_event_record,
    .event_query = host_event_query,
    .event_synchronize = host_event_synchronize,
    .event_elapsed_ms = host_event_elapsed_ms,
    .stream_wait_event = host_stream_wait_event,
    .host_fn_async = host_host_fn_async,
    .stream_native = host_stream_native,
    .checksum = host_checksum,
};

const struct wf_device_ops *wf_device_host_ops(void)
{
	return &host_ops;
}
