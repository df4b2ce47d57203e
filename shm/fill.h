/* The standard materializer: a wf_shm_fill_fn that copies every file's window into the region
 * with libwfio (io_uring with O_DIRECT where the file system allows it, all files sharing one
 * deep queue; the pread pool where io_uring is unavailable). The agent uses it, and so does a
 * worker that materializes a floor itself on a node without an agent. */
#ifndef WF_SHM_FILL_H
#define WF_SHM_FILL_H

#include "io/reader.h"
#include "shm/region.h"

#ifdef __cplusplus
extern "C" {
#endif

struct wf_shm_fill_io {
	struct wf_io_opts io;          /* reader options (backend, queue depth, chunk size) */
	wf_io_progress_fn *progress;   /* optional: bytes done over all files */
	void *progress_ctx;
	const volatile int *cancel;    /* optional: non-zero stops with WF_ECANCELED */
	/* Optional hook run after the files are opened and checked, before any byte is copied
	 * (fault injection in tests; progress setup). */
	void (*before_copy)(void *ctx, uint64_t total_bytes);
	void *before_copy_ctx;
};

/* wf_shm_fill_fn; ctx is a struct wf_shm_fill_io *. Fails with WF_ECHANGED (diag names the file)
 * when a file no longer has the size and mtime the digest covers, or changes during the copy;
 * WF_ETRUNCATED when it got shorter; WF_ECANCELED; or the reader's error. */
int wf_shm_fill_from_files(void *ctx, const struct wf_shm_fill *job, struct wf_diag *diag);

#ifdef __cplusplus
}
#endif
#endif
