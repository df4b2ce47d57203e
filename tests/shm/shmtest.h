/* Support for the floor tests: hand-made models (so the tests need no GGUF reader), a fill
 * callback that copies with pread, byte-for-byte checks against the source files, and process
 * helpers. Not thread-safe. */
#ifndef WF_TESTS_SHM_SHMTEST_H
#define WF_TESTS_SHM_SHMTEST_H

#include "model/model.h"
#include "shm/region.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* A model of n_files files "model-0000N.bin" in a directory. Each file has a fake header of odd
 * length (so data sections are not page-aligned), tensors_per_file tensors of tensor_bytes + k*96
 * bytes (k-th tensor of the file) packed at 32-byte alignment, and, in every other file, trailing
 * bytes after the data section. Contents are pseudo-random from seed. */
struct shmt_spec {
	unsigned n_files;
	unsigned tensors_per_file;
	uint64_t tensor_bytes; /* a multiple of 32 */
	uint32_t seed;
};

/* Builds the model struct for spec in dir; with write, writes the files first. Sizes and mtimes
 * come from stat. Returns NULL on failure (errno set). */
struct wf_model *shmt_model_make(const char *dir, const struct shmt_spec *spec, bool write);
void shmt_model_free(struct wf_model *m);
/* wf_model_digest() of the hand-made model (it reads only files[] and tensors[]). */
void shmt_digest(const struct wf_model *m, struct wf_digest *ret);

struct shmt_fill_ctx {
	const char *count_path;   /* if set: one byte appended per fill call (O_APPEND) */
	const char *started_path; /* if set: created when a fill starts */
	size_t chunk;             /* bytes per pread; 0: whole windows */
	unsigned sleep_us;        /* pause after each chunk */
	int fail_with;            /* if non-zero: fail with this code after copying half */
};

/* The fill callback: pread of each window into the section; WF_ECHANGED if a file's size or mtime
 * moved since the model was made. */
int shmt_fill(void *ctx, const struct wf_shm_fill *job, struct wf_diag *diag);

/* Every tensor of m: found by name in r, same size and table fields, and its floor bytes equal to
 * the file's bytes. 0, or -1 with a reason in why. */
int shmt_check_bytes(const struct wf_shm_region *r, const struct wf_model *m, char *why,
                     size_t why_len);

/* Entries of a directory other than . and .. (-1 if it cannot be read); names optionally joined
 * into buf for messages. */
int shmt_count_entries(const char *dir, char *buf, size_t buf_len);
/* Size of a file, or -1. */
long long shmt_file_size(const char *path);
/* Creates an empty file (0 or -1). */
int shmt_touch(const char *path);
bool shmt_exists(const char *path);
/* Sleeps ms milliseconds. */
void shmt_sleep_ms(unsigned ms);

/* wf_shm_holder_pids(), asked again (every 10 ms, for 5 s at most) until it counts want holders:
 * /proc/locks, which it reads, can repeat or miss an entry while other processes (parallel tests)
 * take and drop locks, so one reading may be off. Returns the last count (0 on an error) and the
 * pids of that reading in pids (up to cap). */
size_t shmt_holders(const struct wf_shm_config *cfg, const struct wf_digest *digest, size_t want,
                    pid_t *pids, size_t cap);

/* posix_spawn with stdout+stderr to out_path (or inherited); returns the pid or -1. */
pid_t shmt_spawn(char *const argv[], const char *out_path);
/* Waits for pid up to timeout_s (SIGKILL after). Exit status 0..255, 128+signal, -1 on error. */
int shmt_wait(pid_t pid, int timeout_s);

/* Leaves a READY region for spec behind with no holder, as a crashed agent would: a forked child
 * attaches in AGENT mode and _exits without detaching. 0 on success. */
int shmt_orphan_region(const struct wf_shm_config *cfg, const struct wf_model *m);

/* Maps the region file of m writable (outside the library) for corruption tests. */
void *shmt_map_rw(const struct wf_shm_config *cfg, const struct wf_model *m, size_t *ret_size);
/* Recomputes tables_checksum (when the table bounds are sane) and header_checksum in place, so
 * that a deliberate corruption reaches the structural checks. */
void shmt_fix_checksums(void *base, size_t size);

#endif
