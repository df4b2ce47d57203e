/* libwfio: the one module that reads files fast.
 *
 * Two users drive it:
 *  - the agent's materializer copies whole tensor-data sections (GB-sized) of model files into a
 *    mapped floor region: wf_io_copy() / wf_io_copy_many(), blocking, with progress and cancel;
 *  - the worker's staging pipeline reads tensor ranges from a region fd or a model file into
 *    pinned staging buffers and needs completions one at a time: wf_io_submit() / wf_io_reap().
 *
 * Backends. A reader runs on one of two backends behind a small ops table (io/internal.h):
 *  - io_uring: deep queue (queue_depth chunks in flight), large chunks, registered files, and
 *    registered buffers for destinations the caller registers with wf_io_buffer_register();
 *  - pread: a pool of threads, for hosts where io_uring is unavailable (seccomp, the
 *    kernel.io_uring_disabled sysctl, old kernels).
 * WF_IO_BACKEND_AUTO tries io_uring and falls back to pread, recording why in
 * wf_io_reader_info.uring_err so that the caller can say so once in its log. The environment
 * variable WF_IO_BACKEND=pread|uring|auto overrides AUTO (not an explicit choice), and
 * WF_IO_DIRECT=0 turns O_DIRECT off, unless WF_IO_OPT_NO_ENV is given.
 *
 * O_DIRECT. wf_io_file_open() opens a buffered descriptor and, where the filesystem does direct
 * I/O (not tmpfs, ramfs or hugetlbfs: there it would only be a slower copy from the same pages),
 * a second one with O_DIRECT. The alignment comes from statx(STATX_DIOALIGN), else 4096. A
 * request [offset, offset+len) -> dst is read as
 *    head  [offset, align_up(offset))         buffered (fewer than align bytes)
 *    body  [align_up(offset), align_down(end)) O_DIRECT, in chunk_size pieces
 *    tail  [align_down(end), end)              buffered (fewer than align bytes)
 * when the destination has the same phase as the file offset, i.e. the body's destination address
 * is aligned to the memory alignment (for 4096: (uintptr_t)dst % 4096 == offset % 4096). Otherwise
 * the whole request is read buffered. So the caller may pass any offset, length and destination
 * and gets exactly len bytes; to get O_DIRECT it places dst in phase with the file offset (the
 * floor does: a file's tensor-data section starts at the same offset modulo 4096 in the region).
 * Nothing is ever written outside [dst, dst+len), and reads never go past the requested range.
 * Body chunks whose pages are all in the page cache already (cachestat(2), Linux 6.5+) are read
 * buffered: copying from RAM beats re-reading the disk. A direct read refused with EINVAL turns
 * O_DIRECT off for that file and is redone buffered.
 *
 * Errors: 0, -errno, or WF_E* (base/error.h). Completion results: 0 when all len bytes were read;
 * WF_ETRUNCATED when EOF came first; WF_ECANCELED; or the -errno of a failed read. Short reads are
 * resubmitted; EAGAIN, EINTR and unrequested ECANCELED are retried a bounded number of times.
 *
 * Threads: a reader and its files are used by one thread at a time (like a liburing ring); use one
 * reader per thread for parallel pipelines. Destinations must stay valid until their request has
 * been reaped (or the copy call has returned): the kernel or a pool thread writes into them until
 * then. Library code here does not log. */
#ifndef WF_IO_READER_H
#define WF_IO_READER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#ifdef __cplusplus
extern "C" {
#endif

enum wf_io_backend {
	WF_IO_BACKEND_AUTO = 0, /* io_uring, else pread; WF_IO_BACKEND may override */
	WF_IO_BACKEND_URING,
	WF_IO_BACKEND_PREAD,
	WF_IO_BACKEND_MAX
};

#define WF_IO_QUEUE_DEPTH_DEFAULT 64u
#define WF_IO_QUEUE_DEPTH_MAX     4096u
#define WF_IO_CHUNK_DEFAULT       (1u << 20)
#define WF_IO_CHUNK_MIN           4096u
#define WF_IO_CHUNK_MAX           (64u << 20)
#define WF_IO_REQUESTS_DEFAULT    1024u
#define WF_IO_REQUESTS_MAX        (1u << 20)
#define WF_IO_THREADS_DEFAULT     16u
#define WF_IO_THREADS_MAX         256u
#define WF_IO_PROGRESS_DEFAULT    (64ull << 20)

/* wf_io_opts.flags */
enum {
	WF_IO_OPT_NO_DIRECT = 1u << 0,      /* never open files with O_DIRECT */
	WF_IO_OPT_NO_ENV = 1u << 1,         /* ignore WF_IO_BACKEND and WF_IO_DIRECT */
	WF_IO_OPT_NO_CACHE_PROBE = 1u << 2, /* read the body direct even where it is cached */
	WF_IO_OPT_NO_REGISTER = 1u << 3,    /* io_uring: no registered file or buffer tables */
};

/* Zero means the default in every field; NULL options mean all defaults. */
struct wf_io_opts {
	enum wf_io_backend backend;
	unsigned queue_depth;  /* chunk reads in flight (default 64, max 4096) */
	size_t chunk_size;     /* bytes per read (default 1 MiB, rounded up to 4096, max 64 MiB) */
	unsigned threads;      /* pread backend threads (default min(queue_depth, 16)) */
	unsigned max_requests; /* wf_io_submit() requests not yet reaped (default 1024) */
	unsigned flags;        /* WF_IO_OPT_* */
};

struct wf_io_reader_info {
	enum wf_io_backend backend; /* URING or PREAD: what runs */
	const char *backend_name;   /* "io_uring" or "pread"; static */
	int uring_err;    /* AUTO fell back to pread because io_uring setup failed with this -errno;
	                     0 when io_uring runs or was not tried */
	bool direct;      /* O_DIRECT is allowed for files opened on this reader */
	bool fixed_files; /* io_uring: registered file table in use */
	bool fixed_bufs;  /* io_uring: wf_io_buffer_register() can register buffers */
	unsigned queue_depth;
	size_t chunk_size;
	unsigned threads; /* pread backend; 0 for io_uring */
	unsigned max_requests;
};

/* Counters since the reader was created. */
struct wf_io_stats {
	uint64_t bytes_direct;     /* bytes read through O_DIRECT descriptors */
	uint64_t bytes_buffered;   /* bytes read through the page cache */
	uint64_t reads;            /* chunk reads issued (retries included) */
	uint64_t short_reads;      /* reads that returned fewer bytes than asked, not at EOF */
	uint64_t retries;          /* EAGAIN / EINTR / ECANCELED resubmissions */
	uint64_t direct_fallbacks; /* direct reads refused with EINVAL and redone buffered */
	uint64_t cached_chunks;    /* body chunks read buffered because they were cached */
	uint64_t fixed_reads;      /* io_uring reads into registered buffers */
};

struct wf_io_reader;
struct wf_io_file;

/* Creates a reader. opts may be NULL. Returns 0 and *ret_reader, WF_EINVAL for bad options, or
 * -errno (an explicit WF_IO_BACKEND_URING that cannot start returns io_uring's error). */
int wf_io_reader_create(const struct wf_io_opts *opts, struct wf_io_reader **ret_reader);

/* Cancels everything outstanding, waits until no read can still write into a destination, closes
 * the files still open on the reader, and frees it. Accepts NULL. */
void wf_io_reader_destroy(struct wf_io_reader *reader);

/* Which backend runs, and why (see struct wf_io_reader_info). Never fails. */
void wf_io_reader_info(const struct wf_io_reader *reader, struct wf_io_reader_info *ret_info);
void wf_io_reader_stats(const struct wf_io_reader *reader, struct wf_io_stats *ret_stats);

/* wf_io_file_open() flags */
enum {
	WF_IO_FILE_NO_DIRECT = 1u << 0, /* this file: buffered reads only */
};

struct wf_io_file_info {
	uint64_t size;             /* st_size at open */
	int64_t mtime_ns;          /* st_mtim at open */
	uint64_t dev, ino;         /* identity at open */
	bool direct;               /* an O_DIRECT descriptor is open and has not been refused */
	uint32_t direct_align;     /* file offset and length alignment of direct reads */
	uint32_t direct_mem_align; /* destination alignment of direct reads */
};

/* Opens path (a regular file) for reading on reader: a buffered descriptor and, where useful and
 * allowed, an O_DIRECT one (both O_CLOEXEC). Records size, mtime and identity for
 * wf_io_file_check(). The file belongs to the reader and is closed by wf_io_file_close() or by
 * wf_io_reader_destroy(). Returns 0, -errno from open/fstat, or WF_EINVAL when path is not a
 * regular file. */
int wf_io_file_open(struct wf_io_reader *reader, const char *path, unsigned flags,
                    struct wf_io_file **ret_file);

/* Like wf_io_file_open() for a descriptor the caller has (a floor region): fd is duplicated
 * (F_DUPFD_CLOEXEC) and stays the caller's. O_DIRECT, where it applies, reopens
 * /proc/self/fd/<fd>. wf_io_file_check() compares the descriptor only (there is no path). */
int wf_io_file_open_fd(struct wf_io_reader *reader, int fd, unsigned flags,
                       struct wf_io_file **ret_file);

/* Closes file. Requests still outstanding on it finish first (the descriptors are released when
 * the last one completes); the handle is invalid on return. Accepts NULL. */
void wf_io_file_close(struct wf_io_file *file);

void wf_io_file_info(const struct wf_io_file *file, struct wf_io_file_info *ret_info);

/* 0 when the file still has the size, mtime and identity recorded at open and (for files opened by
 * path) the path still names the same inode; WF_ECHANGED otherwise; -errno when fstat fails. */
int wf_io_file_check(const struct wf_io_file *file);

/* --- asynchronous requests ---------------------------------------------------------------- */

struct wf_io_cqe {
	uint64_t user_data; /* as given to wf_io_submit() */
	int res;            /* 0, WF_ETRUNCATED, WF_ECANCELED, or -errno of a read */
	uint64_t bytes;     /* bytes read into dst (len on success; informational otherwise) */
};

/* Queues a read of [offset, offset+len) of file into dst and starts it (or as much of it as the
 * queue depth allows; the rest starts as earlier reads complete, inside wf_io_reap() and
 * wf_io_submit()). A request is split into chunks internally but completes exactly once, after
 * every byte of dst has been written or the request has failed; only then may dst be reused.
 * Requests start in submission order. len 0 completes at once with res 0.
 * Returns 0; -EAGAIN when max_requests are outstanding (reap first); WF_EINVAL (NULL dst with
 * len > 0); WF_EOVERFLOW (offset+len wraps); WF_ESTATE (file closed). */
int wf_io_submit(struct wf_io_reader *reader, struct wf_io_file *file, uint64_t offset, size_t len,
                 void *dst, uint64_t user_data);

/* Moves up to max completed requests into out. Waits until at least min_wait have completed, the
 * timeout (nanoseconds; < 0: none, 0: do not wait) expires, or nothing is left outstanding.
 * Returns the number written (0..max), or -errno when the backend fails. */
int wf_io_reap(struct wf_io_reader *reader, struct wf_io_cqe *out, unsigned max, unsigned min_wait,
               int64_t timeout_ns);

/* Requests submitted and not yet reaped. */
unsigned wf_io_outstanding(const struct wf_io_reader *reader);

/* Cancels every outstanding wf_io_submit() request without blocking: no new chunk starts; each
 * completes with WF_ECANCELED (unless it had already completed) once its reads in flight return,
 * and is reaped as usual. */
void wf_io_cancel(struct wf_io_reader *reader);

/* Registers [base, base+len) as a destination (io_uring: fixed buffers, so reads into it skip the
 * per-read page pinning). Optional: failure (ENOMEM under RLIMIT_MEMLOCK, EOPNOTSUPP for file
 * mappings other than shmem) costs nothing but that speed-up. The pread backend accepts and ignores
 * it. The memory must stay mapped until wf_io_buffer_unregister() or reader destruction, and must
 * not be unregistered while requests into it are outstanding. Returns 0, -errno, WF_ELIMIT (table
 * full), WF_EUNSUPPORTED (registration unavailable on this reader). Measured on a virtio disk it
 * gave no gain (1 MiB O_DIRECT reads), so nothing registers by default. */
int wf_io_buffer_register(struct wf_io_reader *reader, void *base, size_t len);
int wf_io_buffer_unregister(struct wf_io_reader *reader, void *base);

/* --- blocking copy ------------------------------------------------------------------------ */

/* Called from the copying thread with the bytes read so far over all jobs (strictly increasing)
 * and the total: at least every progress_interval bytes (every chunk_size where chunks are
 * larger), at most about twice per interval, and once with done == total on success. It must not
 * call into the reader. */
typedef void wf_io_progress_fn(void *ctx, uint64_t done, uint64_t total);

struct wf_io_copy_ctl {
	wf_io_progress_fn *progress; /* optional */
	void *progress_ctx;
	uint64_t progress_interval; /* 0: WF_IO_PROGRESS_DEFAULT (64 MiB) */
	/* Optional. Non-zero stops the copy promptly with WF_ECANCELED (it is polled at least every
	 * 50 ms and at every completion). Set it from any thread with __atomic_store_n() or
	 * atomic_store() on an int. */
	const volatile int *cancel;
};

struct wf_io_copy_job {
	struct wf_io_file *file;
	uint64_t offset; /* in file */
	uint64_t len;
	void *dst;  /* len writable bytes */
	int result; /* out: 0 or the job's error */
};

/* Reads [offset, offset+len) of file into dst, streaming with the whole queue depth. Before the
 * first read and after the last, checks the file as wf_io_file_check() does. Returns 0;
 * WF_ETRUNCATED when the file (as opened) is shorter than offset+len or EOF comes early while
 * the file looks unchanged; WF_ECHANGED when its size, mtime or identity changed; WF_ECANCELED;
 * or -errno of a read. ctl may be NULL. On failure dst holds partial data. */
int wf_io_copy(struct wf_io_reader *reader, struct wf_io_file *file, uint64_t offset, uint64_t len,
               void *dst, const struct wf_io_copy_ctl *ctl);

/* Several copies sharing one queue: jobs start in array order and overlap (a later job's reads
 * start as soon as an earlier one has issued all of its own). Each job's result is set. The first
 * failing job cancels the others (they report WF_ECANCELED), since the caller fails them together.
 * Returns 0 or the first failing job's error (in array order among real failures). */
int wf_io_copy_many(struct wf_io_reader *reader, struct wf_io_copy_job *jobs, size_t n_jobs,
                    const struct wf_io_copy_ctl *ctl);

/* Backend name for logs ("auto", "io_uring", "pread"); "?" when out of range. */
const char *wf_io_backend_name(enum wf_io_backend backend);

#ifdef __cplusplus
}
#endif
#endif
