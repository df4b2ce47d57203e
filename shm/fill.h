/* The standard materializer: a wf_shm_fill_fn that copies every file's window into the region
 * with libwfio (io_uring with O_DIRECT where the file system allows it, and buffered reads of what
 * is cached; the pread pool where io_uring is unavailable). The agent uses it, and so does a
 * worker that materializes a floor itself on a node without an agent.
 *
 * On tmpfs it reads into a ring of bounce buffers and writes each chunk with wf_shm_fill_write(),
 * hashing the tensors as their bytes pass (so the library skips its own pass), which qualifies it
 * for WF_SHM_ATTACH_STREAM: attach with that flag to overlap the region's space reservation with
 * the reads. On hugetlbfs it reads straight into the mapping. */
#ifndef WF_SHM_FILL_H
#define WF_SHM_FILL_H

#include "io/reader.h"
#include "shm/region.h"

#ifdef __cplusplus
extern "C" {
#endif

struct wf_shm_fill_io {
	struct wf_io_opts io;        /* reader options (backend, queue depth, chunk size) */
	wf_io_progress_fn *progress; /* optional: bytes done over all files */
	void *progress_ctx;
	const volatile int *cancel; /* optional: non-zero stops with WF_ECANCELED */
	/* Optional hook run after the files are opened and checked, before any byte is copied
	 * (fault injection in tests; progress setup). */
	void (*before_copy)(void *ctx, uint64_t total_bytes);
	void *before_copy_ctx;
	/* Bytes of bounce buffers (tmpfs): 0 means 16 MiB, split into reads of io.chunk_size, at
	 * most io.queue_depth of them in flight. */
	size_t ring_bytes;
};

/* wf_shm_fill_fn; ctx is a struct wf_shm_fill_io *. Fails with WF_ECHANGED (diag names the file)
 * when a file no longer has the size and mtime the digest covers, or changes during the copy;
 * WF_ETRUNCATED when it got shorter; WF_ECANCELED; or the reader's error. */
int wf_shm_fill_from_files(void *ctx, const struct wf_shm_fill *job, struct wf_diag *diag);

#ifdef __cplusplus
}
#endif
#endif
