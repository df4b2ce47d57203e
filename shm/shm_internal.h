/* Internal contract between the files of libwfshm: the region handle, validation (layout.c),
 * locks and names (lock.c). Not installed, not for other modules. */
#ifndef WF_SHM_SHM_INTERNAL_H
#define WF_SHM_SHM_INTERNAL_H

#include "shm/region.h"

#include <sys/stat.h>

struct wf_shm_region {
	char *dir;
	char *path;
	char *guard_path;
	char *holders_path;
	char *keep_path;
	struct wf_digest digest;
	int fd;         /* region file */
	int holders_fd; /* holds the holders lock SH while attached */
	void *base;
	uint64_t size;
	struct wf_shm_header hdr;   /* snapshot validated at attach */
	const uint32_t *name_index; /* in the mapping: tensor indices sorted by name */
	bool materialized;
	bool writable; /* the fd is O_RDWR: the attachment may publish */
	char *rebuild_reason;
	struct wf__shm_reserve *reserve; /* reservation frontier while a STREAM fill runs */
};

/* layout.c */

/* Validates a whole region mapped at base (size bytes): header, sections, checksums, strings, file
 * and tensor entries (see shm/layout.h). digest may be NULL (scan of an unknown name). On success
 * writes the header snapshot. Never reads outside [base, base + size); base may be NULL when
 * size < WF_SHM_HEADER_SIZE. A 0-byte file or a zero magic is EMPTY: WF_ENOT_READY. */
int wf__shm_validate(const void *base, uint64_t size, const struct wf_digest *digest,
                     struct wf_shm_header *ret_header, struct wf_diag *diag);

/* Checks that a validated region's tables describe model as layout lays it out. WF_EFORMAT with
 * the first difference otherwise. */
int wf__shm_match_model(const void *base, const struct wf_shm_header *h,
                        const struct wf_model *model, const struct wf_shm_layout *layout,
                        struct wf_diag *diag);

/* Bounds of a tensor entry's bytes against a validated header: 0 or WF_EFORMAT. */
int wf__shm_tensor_bounds(const struct wf_shm_header *h, uint64_t floor_offset, uint64_t nbytes);

/* region.c */

/* Test hook: reserving a STREAM region's data area fails with err (a negative errno) from offset
 * from on; UINT64_MAX turns it off. Not thread-safe: set it before attaching. */
void wf__shm_set_reserve_fault(uint64_t from, int err);

/* publish.c */

/* Test hook: called inside a publish's seqlock window (the header generation odd, the entries
 * switched, the checksums not yet rewritten), so a test can kill the publisher there. NULL turns
 * it off. Not thread-safe: set it before publishing. */
void wf__shm_set_publish_hook(void (*hook)(void *arg), void *arg);

/* lock.c */

/* flock() retried on EINTR. 0, -EAGAIN (LOCK_NB and held), or -errno. */
int wf__shm_flock(int fd, int op);
/* The same, giving up with -EAGAIN after wait_ms (< 0: waits forever). */
int wf__shm_flock_timed(int fd, int op, int wait_ms);

/* Opens path (O_RDONLY: flock needs no more) and takes op on it, retrying until the locked file is
 * the one path names (the unlink race). With create, makes the file with cfg's lock mode and group
 * if absent. Returns 0 and *ret_fd, -ENOENT (no file and !create), -EAGAIN, or -errno. */
int wf__shm_lock_path(const char *path, int op, bool create, const struct wf_shm_config *cfg,
                      int *ret_fd);
/* lock_path with a bounded wait for the lock (< 0: forever): -EAGAIN when it passed. */
int wf__shm_lock_path_timed(const char *path, int op, bool create, const struct wf_shm_config *cfg,
                            int wait_ms, int *ret_fd);

/* Opens a lock file without locking it (creating it as above when asked). */
int wf__shm_lockfile_open(const char *path, bool create, const struct wf_shm_config *cfg,
                          int *ret_fd);

/* 1 if fd and path are the same file, 0 if not (or path is gone), -errno on other errors. */
int wf__shm_same_file(int fd, const char *path);

/* Applies cfg's group to a file or directory this library created. 0 or -errno. */
int wf__shm_apply_group(int fd, const struct wf_shm_config *cfg);

/* Can a file of the floor directory be trusted (st from fstat or lstat)? It must be a regular file
 * owned by our effective uid, and not writable by others; a region or keep marker not writable by
 * the group either (lock files are group-writable by design: their bytes mean nothing). 0, or
 * WF_EPERMISSION with the reason in why. */
int wf__shm_check_file(const struct stat *st, bool lock_file, char *why, size_t why_len);

/* mkdir -p of a floor directory; directories created get cfg's mode and group (region.c). */
int wf__shm_make_dir(const struct wf_shm_config *cfg, const char *dir, struct wf_diag *diag);

/* True if the keep marker at path exists (lstat; any file type counts). */
bool wf__shm_keep_exists(const char *path);

/* "wf-" + wf_digest_hex(): the region's file name. */
#define WF_SHM_NAME_LEN (3 + 32)
void wf__shm_name(const struct wf_digest *digest, char out[WF_SHM_NAME_LEN + 1]);
/* Parses the 32 lowercase hex digits at hex (more may follow). 0 or WF_EFORMAT. */
int wf__shm_parse_hex(const char *hex, struct wf_digest *ret_digest);

/* The directory and the three paths for a digest (malloc'ed; free() each). 0 or -ENOMEM. */
int wf__shm_paths(const struct wf_shm_config *cfg, const struct wf_digest *digest,
                  char **ret_region, char **ret_guard, char **ret_holders);
const char *wf__shm_dir(const struct wf_shm_config *cfg);
mode_t wf__shm_region_mode(const struct wf_shm_config *cfg);
mode_t wf__shm_lock_mode(const struct wf_shm_config *cfg);
mode_t wf__shm_dir_mode(const struct wf_shm_config *cfg);

#endif
