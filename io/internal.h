/* libwfio internals shared by reader.c, copy.c and the two backends. Not installed.
 *
 * The common layer (reader.c) owns requests, their split into chunks, O_DIRECT decisions, short
 * reads, retries and completion. A backend only moves chunk reads: it is handed a chunk (fd, buf,
 * len, off) and later hands it back with res set as pread(2) would (bytes or -errno). */
#ifndef WF_IO_INTERNAL_H
#define WF_IO_INTERNAL_H

#include "io/reader.h"

#include <stdbool.h>
#include <stdint.h>

struct wf__io_req;

/* Intrusive doubly linked list; an unlinked node points to itself. */
struct wf__io_link {
	struct wf__io_link *prev, *next;
};

/* One read in flight; there are queue_depth of them. */
struct wf__io_chunk {
	struct wf__io_req *req;
	uint64_t off;              /* file offset of the next byte to read */
	char *buf;                 /* where it goes */
	uint32_t len;              /* bytes still to read */
	bool direct;               /* through the O_DIRECT descriptor */
	int fd;                    /* descriptor for this read */
	int fixed_file;            /* io_uring registered file index, or -1 */
	int fixed_buf;             /* io_uring registered buffer index, or -1 */
	unsigned retries;          /* EAGAIN/EINTR/ECANCELED resubmissions so far */
	int res;                   /* set by the backend: bytes read or -errno */
	struct wf__io_chunk *next; /* backend queues, free list */
};

struct wf__io_file_slot {
	int fd;
	int fixed; /* registered index or -1 */
};

struct wf_io_file {
	struct wf_io_reader *reader;
	struct wf__io_link link; /* reader->files */
	struct wf__io_file_slot buffered;
	struct wf__io_file_slot direct; /* fd -1 when none */
	bool direct_ok;                 /* cleared when a direct read is refused */
	bool closed;                    /* the caller has let go */
	unsigned refs;                  /* requests not yet completed */
	uint32_t dio_align, dio_mem_align;
	uint64_t size;
	int64_t mtime_ns;
	uint64_t dev, ino;
	char *path; /* NULL for wf_io_file_open_fd() */
};

struct wf__io_req {
	struct wf__io_link link; /* pending list, done list or free list */
	bool linked;
	struct wf_io_file *file;
	uint64_t off, len;
	char *dst;
	uint64_t user_data;
	uint64_t issued;   /* bytes handed to chunks */
	uint64_t done;     /* bytes read */
	unsigned inflight; /* chunks in flight */
	int err;           /* first error; stops issuing */
	bool use_direct;   /* body read direct (phase and alignment allow) */
	bool completed;
	uint64_t body_start, body_end; /* absolute file offsets of the direct body */
	struct wf_io_copy_job *job;    /* internal copy request: result goes here, not to reap */
};

/* The backend function table. Every call comes from the reader's thread. */
struct wf__io_ops {
	const char *name;
	enum wf_io_backend kind;
	/* Sets reader->be. Returns 0 or -errno. */
	int (*init)(struct wf_io_reader *r);
	/* Called with nothing in flight. Accepts a half-built backend. */
	void (*fini)(struct wf_io_reader *r);
	/* Optional: what the backend really set up (fixed_files, fixed_bufs). */
	void (*info)(const struct wf_io_reader *r, struct wf_io_reader_info *info);
	/* Optional: fill in the fixed indexes of a file's slots (left -1 on failure). */
	void (*file_add)(struct wf_io_reader *r, struct wf__io_file_slot *slot);
	void (*file_remove)(struct wf_io_reader *r, struct wf__io_file_slot *slot);
	/* Optional: register/unregister destination memory. */
	int (*buf_register)(struct wf_io_reader *r, void *base, size_t len);
	int (*buf_unregister)(struct wf_io_reader *r, void *base);
	/* Optional: registered buffer index covering [buf, buf+len), or -1. */
	int (*buf_lookup)(struct wf_io_reader *r, const void *buf, size_t len);
	/* Starts (or queues for the next flush) one read. Cannot fail: the caller never has more
	 * than queue_depth chunks out. */
	void (*queue)(struct wf_io_reader *r, struct wf__io_chunk *c);
	/* Makes queued reads start. Returns 0 or -errno. */
	int (*flush)(struct wf_io_reader *r);
	/* Flushes, then waits (up to timeout_ns; < 0 forever, 0 not at all) until at least min
	 * chunks have completed, and moves up to max of them into out with res set. Returns the
	 * count, or -errno. */
	int (*wait)(struct wf_io_reader *r, struct wf__io_chunk **out, unsigned max, unsigned min,
	            int64_t timeout_ns);
};

extern const struct wf__io_ops wf__io_uring_ops;
extern const struct wf__io_ops wf__io_pread_ops;

/* Test-only fault injection: every nth completion (counted over all chunks) is altered. */
struct wf__io_faults {
	unsigned short_every;     /* successful read: report half the bytes */
	unsigned eagain_every;    /* report -EAGAIN */
	unsigned ecanceled_every; /* report -ECANCELED */
	unsigned eintr_every;     /* report -EINTR */
	unsigned direct_einval;   /* the next this many direct reads report -EINVAL */
	bool direct_open_einval;  /* O_DIRECT open fails with EINVAL */
};

struct wf_io_reader {
	const struct wf__io_ops *ops;
	void *be;
	struct wf_io_opts opts; /* resolved: no zero fields */
	bool direct_allowed;
	bool cache_probe;
	int uring_err;
	struct wf_io_stats stats;

	struct wf__io_chunk *chunks; /* queue_depth of them */
	struct wf__io_chunk *free_chunks;
	unsigned inflight;             /* chunks handed to the backend */
	struct wf__io_chunk **harvest; /* queue_depth slots for wait() */

	struct wf__io_req *reqs; /* max_requests, for wf_io_submit() */
	struct wf__io_link free_reqs;
	struct wf__io_link pending; /* requests with bytes left to issue, in order */
	struct wf__io_link done;    /* completed submit() requests awaiting reap */
	unsigned outstanding;       /* submit() requests not yet reaped */
	unsigned active_internal;   /* copy requests not yet completed */

	struct wf__io_link files;
	struct wf__io_faults faults;
	uint64_t fault_count;
};

/* Runs completions: issues what can start, waits for at least one chunk when wait_ns != 0 and
 * something is in flight, handles up to max_chunks (0: queue_depth) completions, issues again.
 * Returns 0 or -errno. */
int wf__io_pump(struct wf_io_reader *r, int64_t wait_ns, unsigned max_chunks);

/* Starts a request (zero-initialised by the caller apart from file, off, len, dst, user_data,
 * job). Completes it at once when len is 0. */
void wf__io_req_start(struct wf_io_reader *r, struct wf__io_req *q);

/* Marks a request failed with err (first error wins) and completes it if nothing is in flight. */
void wf__io_req_fail(struct wf_io_reader *r, struct wf__io_req *q, int err);

/* Monotonic clock in nanoseconds. */
int64_t wf__io_now_ns(void);

/* Test hook. */
void wf__io_reader_set_faults(struct wf_io_reader *r, const struct wf__io_faults *faults);

#endif
