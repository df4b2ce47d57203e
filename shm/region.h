/* Floor regions: attach, materialize, detach, and the flock protocol that makes them safe across
 * processes that start, crash and exit at any moment. The byte layout is in shm/layout.h.
 *
 * Files, all in one directory (default WF_SHM_DEFAULT_DIR; tmpfs, or hugetlbfs where sizes round
 * up to the huge page and the region is filled through a mapping, since hugetlbfs has no write()):
 *   wf-<digest hex>           the region, mode 0640 (agent writes, the worker group reads)
 *   wf-<digest hex>.guard     guard lock, 0660: held EX briefly around attach, release, materialize
 *   wf-<digest hex>.holders   holders lock, 0660: held SH by every attachment for as long as it
 *                             maps the region
 *   wf-<digest hex>.keep      keep marker, 0640, owned by the agent (wf_shm_region_set_keep()):
 *                             the agent means to keep this floor even when nobody holds it
 * Modes and an optional group come from struct wf_shm_config. Files are created in the order guard,
 * holders, region and unlinked in the order region, holders, guard, always under guard EX. The keep
 * marker is created and removed under guard EX too, and may exist before its region (the agent
 * sets it before materializing); wf_shm_region_remove() removes it with the rest.
 *
 * Trust. The directory must be owned by the agent's euid and not writable by group or others
 * (wf_shm_dir_check(), which the agent calls at start: under a world-writable /dev/shm anybody
 * could otherwise create it first and plant regions). The agent attaches with
 * WF_SHM_ATTACH_OWNED (files it does not own are not trusted) and adopts with
 * WF_SHM_ATTACH_VERIFY (checksums re-hashed); wf_shm_dir_scan() reports untrusted files as
 * BROKEN.
 *
 * Lock protocol (flock(2): per open file description, dropped by the kernel when a process dies):
 *   lock(path): open, flock, then compare the fd's inode (fstat) with the path's (stat); on a
 *     mismatch or ENOENT the file was unlinked by a last holder after we opened it: close, retry.
 *   attach: lock(guard) EX → open the region →
 *       READY and valid: map PROT_READ;
 *       absent (and CREATE), or anything else (and REBUILD: EMPTY, MATERIALIZING, FAILED, an odd
 *       generation, a bad header, a size mismatch, tables that do not match the model): unlink it,
 *       create a fresh file, reserve its full size with fallocate (a full tmpfs fails here with
 *       ENOSPC, not with SIGBUS later; with WF_SHM_ATTACH_STREAM: check the free space, reserve
 *       the tables, and the data area as the fill writes it, see below), write header, tables and
 *       name index with state MATERIALIZING, call the fill callback, hash every tensor (unless the
 *       fill did while copying), write tables_checksum, header_checksum, then state READY with a
 *       release store; map PROT_READ;
 *       otherwise: fail (WF_ENOT_READY, or the validation error, or -ENOENT), touching nothing;
 *     → lock(holders) SH → guard UN.
 *   publish (wf_shm_region_publish(), a WRITE attachment): lock(guard) EX → the path still names
 *     the mapped inode → the live header and tables validate → append, seqlock, checksums (see
 *     shm/layout.h) → guard UN. An attacher therefore validates either the region before the
 *     publish or after it, never half of one.
 *   detach: munmap → lock(guard) EX → holders UN → holders EX|NB: if it succeeds this was the
 *     last holder: unless the keep marker exists, unlink region, holders, guard → guard UN.
 *   set_keep: lock(guard) EX → create or unlink the marker → (no region and no holders file:
 *     unlink the guard again) → guard UN.
 *   reap: guard EX|NB → holders EX|NB → no keep marker → unlink region, holders, guard.
 *   A broken region is replaced (unlink, create), never truncated in place, so a process still
 *   mapping an old inode (a rebuild of a corrupt READY region that was in use) cannot fault.
 *   Crash anywhere: the dead process's flocks go; what remains is a READY region, or one that the
 *   next attacher under guard EX sees as not READY and rebuilds (or refuses, if it may not).
 *   Nothing ever hands out a region that is not READY and valid.
 *   Waiting attachers block on the guard for as long as a materialization takes
 *   (WF_SHM_ATTACH_NOWAIT makes them fail with -EAGAIN instead).
 *
 * Thread-safety: the functions that take a config may be called from any thread. A region handle
 * may be read (accessors, find, verify) from many threads at once; detach must not race with use.
 * Flocks belong to open file descriptions: do not detach in a fork()ed child that inherited an
 * attachment (it would drop the parent's holders lock); every descriptor is O_CLOEXEC. */
#ifndef WF_SHM_REGION_H
#define WF_SHM_REGION_H

#include "base/diag.h"
#include "model/model.h"
#include "shm/layout.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

#define WF_SHM_DEFAULT_DIR "/dev/shm/weightfloor"

/* A zeroed config is the default. Read during each call only; the caller keeps ownership. */
struct wf_shm_config {
	const char *dir;    /* NULL: WF_SHM_DEFAULT_DIR; created (mkdir -p) by writer attaches */
	mode_t dir_mode;    /* 0: 0750, for directories this library creates */
	mode_t region_mode; /* 0: 0640 */
	mode_t lock_mode;   /* 0: 0660 */
	bool set_gid;       /* fchown new files and directories to gid */
	gid_t gid;
	uint64_t spare_bytes; /* spare area of new regions, for published tensor versions */
};

/* Attach modes. READER (0) never creates, never writes: what workers use when an agent exists. */
#define WF_SHM_ATTACH_CREATE  0x1u /* create the region when absent (needs model and fill) */
#define WF_SHM_ATTACH_REBUILD 0x2u /* rebuild an existing region that is not READY and valid */
#define WF_SHM_ATTACH_NOWAIT  0x4u /* -EAGAIN instead of waiting for the guard lock */
/* The fill writes the region only with wf_shm_fill_write() (never through base or dst), so on
 * tmpfs the data area is reserved as it is written instead of all before the fill starts reading
 * (below). wf_shm_fill_from_files() qualifies. Ignored on hugetlbfs. */
#define WF_SHM_ATTACH_STREAM 0x8u
/* Trust only files this process's effective uid owns: the guard, the holders file and an existing
 * region must be regular files owned by geteuid(), the region not writable by group or others,
 * the lock files not by others. A region that fails is rebuilt (REBUILD) or refused
 * (WF_EPERMISSION); a lock file that fails is refused (WF_EPERMISSION). For the agent, whose
 * floors workers trust: a region planted by another user must never be handed out. */
#define WF_SHM_ATTACH_OWNED 0x10u
/* OWNED, and re-hash every tensor of an existing READY region against its table
 * (wf_shm_region_verify()) before using it: a region whose bytes were altered behind a valid
 * header is rebuilt (REBUILD) or refused (WF_ECHECKSUM). Reads every byte, under the guard: for
 * the agent's adoption of floors it did not make in this run. */
#define WF_SHM_ATTACH_VERIFY 0x20u
/* Open the region file O_RDWR, so that this attachment may publish (wf_shm_region_publish()).
 * Creates and rebuilds nothing by itself (add CREATE or REBUILD for that; they open O_RDWR
 * anyway). Only the region's owner can open it so (mode 0640): the agent. Its mapping stays
 * PROT_READ; a publish maps a writable view of its own for the length of the call. */
#define WF_SHM_ATTACH_WRITE  0x40u
#define WF_SHM_ATTACH_READER 0x0u
/* Re-adopt (and repair) but never create. */
#define WF_SHM_ATTACH_MUST_EXIST WF_SHM_ATTACH_REBUILD
#define WF_SHM_ATTACH_AGENT      (WF_SHM_ATTACH_CREATE | WF_SHM_ATTACH_REBUILD)

struct wf_shm_region;

/* One file's share of the materialization. */
struct wf_shm_fill_file {
	const char *path;        /* model->files[i].path */
	uint64_t file_size;      /* size and mtime the digest covers: a file that no longer has */
	int64_t mtime_ns;        /* them must fail the callback with WF_ECHANGED */
	uint64_t src_offset;     /* window start in the file, 4096-aligned */
	uint64_t copy_length;    /* bytes to copy from src_offset (the window, clipped at EOF) */
	uint64_t floor_offset;   /* section start in the region, 4096-aligned */
	uint64_t section_length; /* multiple of 4096, >= copy_length; the bytes past copy_length */
	                         /* are zero already */
	void *dst;               /* writable: region base + floor_offset, 4096-aligned */
	uint64_t dev, ino;       /* model->files[i].dev/ino: the file the model's reader opened;
	                            a fill that finds another file at path fails with WF_ECHANGED.
	                            Both 0: not recorded (a hand-made model) */
};

/* Where one tensor's bytes go, for fills that hash while they copy. */
struct wf_shm_fill_tensor {
	uint64_t floor_offset; /* in the region, inside files[file]'s section */
	uint64_t nbytes;
	uint32_t file;
	uint32_t reserved;
};

/* What the fill callback gets. Valid during the call only. */
struct wf_shm_fill {
	struct wf_shm_region *region; /* being materialized: accessors work, checksums are 0 */
	const struct wf_model *model;
	int region_fd; /* O_RDWR; pwrite works on tmpfs but not on hugetlbfs */
	void *base;    /* writable MAP_SHARED mapping of the whole region */
	uint64_t region_size;
	uint64_t page_size; /* 4096, or the huge page size */
	bool hugetlbfs;
	uint32_t n_files;
	const struct wf_shm_fill_file *files;
	/* Streaming checksums (optional): tensors[n_tensors], in model order. A fill that hashes
	 * every tensor's bytes as they pass through its buffers stores wf_shm_checksum() of tensor
	 * i in checksums[i] for every i and sets *checksums_set; the library then skips its own
	 * pass over the whole region. The fill vouches for them: they become the table's. */
	uint32_t n_tensors;
	const struct wf_shm_fill_tensor *tensors;
	uint64_t *checksums;
	bool *checksums_set;
};

/* The fill callback contract: copy, for every file, its bytes [src_offset, src_offset +
 * copy_length) to dst (through the mapping; or pwrite on region_fd unless hugetlbfs; or
 * wf_shm_fill_write()). With O_DIRECT, read section_length bytes (everything is 4096-aligned) and
 * accept the short read at EOF. It runs under the guard lock, so other attachers of this model
 * wait: report progress from inside it if needed. Return 0 only when every byte is in place; any
 * negative code fails the attach (the region is marked FAILED and removed) and is returned to the
 * attacher; diag may explain it. Checksums (unless the fill set them, above), READY and the header
 * checksum are written by the library after it returns.
 *
 * Space. Without WF_SHM_ATTACH_STREAM (and always on hugetlbfs) the whole region is reserved with
 * fallocate before the fill is called, so no write can meet a full file system. With it, on tmpfs,
 * the library first checks the free space (statvfs: a floor directory that cannot hold the region
 * still fails with -ENOSPC before anything is read) and reserves the tables; then
 * wf_shm_fill_write() reserves the data area in 16 MiB steps ahead of the writes, so that the page
 * allocation (about a quarter of a second per GB, and serialized with the writes by the inode
 * lock) overlaps the fill's reading instead of preceding it. Every byte still lands in reserved
 * space and nothing is written through a mapping, so no SIGBUS is possible; should a step fail
 * (something else filled the directory meanwhile) wf_shm_fill_write() returns -ENOSPC and the
 * attach fails with -ENOSPC and the same diag. After the fill the library reserves what it did not
 * write (padding, the spare area): the region is completely reserved before it becomes READY. */
typedef int (*wf_shm_fill_fn)(void *ctx, const struct wf_shm_fill *job, struct wf_diag *diag);

/* Writes len bytes of buf at offset (from the start of the region, inside the data area) from a
 * fill callback: pwrite on region_fd on tmpfs, which needs no page tables in this process (a
 * writable mapping needs one entry per 4 KiB page, which costs more than the copy), or a copy
 * through the mapping on hugetlbfs. With WF_SHM_ATTACH_STREAM it first reserves what is not yet
 * reserved up to offset + len (and a step beyond). Thread-safe for disjoint ranges. Returns 0,
 * -ENOSPC (or the -errno of fallocate) when reserving failed, WF_EINVAL for a range outside the
 * data area, or -errno of pwrite. */
int wf_shm_fill_write(const struct wf_shm_fill *job, uint64_t offset, const void *buf, size_t len);

/* Attaches the region of the model named by digest, per the protocol above.
 * model: required with CREATE or REBUILD (it gives the layout); optional otherwise, and when given
 *   an existing region's tables must match it (else it counts as broken).
 * fill, fill_ctx: required with CREATE or REBUILD; called only when this call materializes.
 * Returns 0 and *ret_region (mapped PROT_READ, READY, validated), or:
 *   -ENOENT          no region (READER or MUST_EXIST), or the directory does not exist;
 *   WF_ENOT_READY    the region exists but is not READY (EMPTY or MATERIALIZING: its creator
 *                    died; FAILED; or a publish never finished) and this call may not rebuild
 *                    it;
 *   WF_EMAGIC, WF_EVERSION, WF_ECHECKSUM, WF_ETRUNCATED, WF_EFORMAT, WF_EOVERFLOW
 *                    a READY region fails validation and this call may not rebuild it;
 *   -ENOSPC          the directory has no room for the region (nothing is left behind);
 *   -EAGAIN          NOWAIT and the guard is held;
 *   the fill callback's error; other -errno (EACCES, ENOMEM, ...); WF_EINVAL for bad arguments,
 * with diag naming the directory, the digest and the sizes involved. */
int wf_shm_region_attach(const struct wf_shm_config *cfg, const struct wf_digest *digest,
                         const struct wf_model *model, unsigned flags, wf_shm_fill_fn fill,
                         void *fill_ctx, struct wf_shm_region **ret_region, struct wf_diag *diag);

/* Unmaps and releases; the last holder removes the region and its lock files, unless the keep
 * marker exists (a holder without write permission on the directory leaves them; the agent removes
 * them later). Accepts NULL. */
void wf_shm_region_detach(struct wf_shm_region *region);

/* Unmaps and closes without the release protocol: the holders lock goes (as at process exit)
 * but nothing is unlinked, even by a last holder. For an agent that stops and wants its READY
 * floors re-adopted by the next agent rather than removed. Accepts NULL. */
void wf_shm_region_abandon(struct wf_shm_region *region);

/* Re-hashes every tensor and compares with the table. 0, or WF_ECHECKSUM with diag naming the
 * first bad tensor; WF_EFORMAT if an entry went out of bounds since attach. Reads every byte. */
int wf_shm_region_verify(const struct wf_shm_region *region, struct wf_diag *diag);

/* One tensor, read consistently with the generation seqlock (shm/layout.h). */
struct wf_shm_tensor_info {
	uint32_t index;
	const char *name; /* inside the mapping, NUL-terminated; valid until detach */
	uint32_t name_len;
	uint32_t dtype; /* enum wf_dtype */
	uint32_t n_dims;
	uint32_t tclass; /* enum wf_tensor_class */
	int64_t ne[WF_MODEL_MAX_DIMS];
	uint64_t nbytes;
	uint32_t file;
	uint64_t source_offset;
	uint64_t floor_offset; /* offset in the region: pread(wf_shm_region_fd(), ...) reads it */
	const void *data;      /* base + floor_offset, read-only */
	uint64_t checksum;
	uint64_t generation;
};

/* ---- publishing (shm/layout.h, "Generations") --------------------------------------------- */

/* New contents for one tensor. The type and the size are the entry's: a publish changes bytes,
 * never a shape or a type (that needs other tables: a later format's). */
struct wf_shm_publish_tensor {
	uint32_t index;   /* the tensor, < n_tensors (wf_shm_region_find() gives it by name) */
	uint32_t dtype;   /* enum wf_dtype: must equal the entry's */
	uint64_t nbytes;  /* must equal the entry's */
	const void *data; /* nbytes of new contents; read during the call only, never kept */
};

/* wf_shm_region_publish() flags. DRY_RUN: every check, under the guard as for a real publish
 * (the arguments, the live region, the room in the spare area), and nothing written;
 * *ret_generation is the region's generation now. For callers that validate a request before
 * its bytes travel. */
#define WF_SHM_PUBLISH_DRY_RUN 0x1u

/* Publishes new bytes for n tensors of a READY region as ONE generation, per the protocol of
 * shm/layout.h: under the guard lock EX (attachers and scans wait or see BUSY), after checking
 * that the region file is still the one this handle maps and that its live header and tables
 * validate, the bytes are appended to the spare area (64-byte aligned, after spare_used), hashed
 * there, and the entries switched under the generation seqlock; the table and header checksums
 * are rewritten inside the seqlock's odd window, so a region whose generation is even is whole,
 * and one whose publisher died mid-way is odd: WF_ENOT_READY for every later attacher, which
 * rebuilds it (REBUILD) or refuses it. Old bytes are never overwritten: readers that hold an old
 * entry (floor_offset, checksum, generation g) keep reading intact bytes.
 *
 * Needs an attachment opened for writing (WF_SHM_ATTACH_WRITE, CREATE or REBUILD). The handle's
 * header snapshot (wf_shm_region_header()) stays the attach's; wf_shm_region_generation() and
 * wf_shm_region_spare() read the live header. Returns 0 and *ret_generation (the new, even
 * header generation; every entry published carries it), or, with diag saying which tensor and
 * why, and nothing changed:
 *   WF_EINVAL      n == 0, NULL arguments, unknown flags, or a tensor's nbytes or dtype that is
 *                  not its entry's (with DRY_RUN, data may be NULL);
 *   WF_ENOT_FOUND  an index >= n_tensors;
 *   WF_EDUPLICATE  the same tensor twice;
 *   WF_EPERMISSION the attachment is read-only;
 *   WF_ENO_SPACE   the spare area cannot hold the new bytes (its size, use and the need given);
 *   WF_ENOT_READY  the region is not READY or a publish never finished (odd generation);
 *   WF_ESTATE      the region file was removed or replaced since this attach;
 *   the validation error of a region damaged since attach; -errno (mmap, pwrite, lock).
 * Thread-safe against readers in any process and against other publishers (the guard serializes
 * them); not against detach of the same handle. Blocks while another process holds the guard (a
 * materialization of the same model). */
int wf_shm_region_publish(struct wf_shm_region *region, const struct wf_shm_publish_tensor *tensors,
                          uint32_t n, unsigned flags, uint64_t *ret_generation,
                          struct wf_diag *diag);

/* The spare area as the live header says now: its size and the bytes published into it. For
 * status displays. Thread-safe. */
void wf_shm_region_spare(const struct wf_shm_region *region, uint64_t *ret_size,
                         uint64_t *ret_used);

/* Tensor by index (< n_tensors) or by name (O(log n)). 0, WF_ENOT_FOUND, or WF_EFORMAT when the
 * entry is out of bounds (the region was damaged after attach), WF_ESTATE if a publish never
 * finished. Thread-safe. */
int wf_shm_region_tensor(const struct wf_shm_region *region, uint32_t index,
                         struct wf_shm_tensor_info *ret_info);
int wf_shm_region_find(const struct wf_shm_region *region, const char *name,
                       struct wf_shm_tensor_info *ret_info);

/* The struct wf_model the region was materialized from, rebuilt from the floor alone (its
 * file and tensor tables and its metadata section, shm/layout.h), for a reader that cannot or
 * need not open the model's files. Its tensors, key/values (types and values, arrays included),
 * hyperparameters, format and file identities (path as opened by the materializer, size, mtime,
 * data section, GGUF version, alignment) equal what wf_model_open() gave for the files, so
 * wf_model_digest() gives the region's digest (checked). Tensor offsets are the files' (the
 * digest covers them); the bytes are in the floor at wf_shm_region_tensor()'s floor_offset, in
 * the same order as model->tensors. real_path, dev, ino and aux_paths are unknown: 0 / NULL.
 * Clears diag first. Returns 0 and *ret_model (wf_model_close() it; it does not borrow the
 * region), or WF_EFORMAT / WF_ETRUNCATED / WF_ELIMIT / WF_EVERSION for a section damaged since
 * attach, -ENOMEM, WF_EINVAL. Thread-safe. */
int wf_shm_region_model(const struct wf_shm_region *region, struct wf_model **ret_model,
                        struct wf_diag *diag);

/* Accessors; thread-safe; the region must be attached. */
uint32_t wf_shm_region_n_tensors(const struct wf_shm_region *region);
/* The header as validated at attach (generation and state may have moved since: see below). */
void wf_shm_region_header(const struct wf_shm_region *region, struct wf_shm_header *ret_header);
uint32_t wf_shm_region_state(const struct wf_shm_region *region);      /* live, acquire */
uint64_t wf_shm_region_generation(const struct wf_shm_region *region); /* live, acquire */
const void *wf_shm_region_data(const struct wf_shm_region *region);    /* the mapping's base */
uint64_t wf_shm_region_size(const struct wf_shm_region *region);
/* The region's fd, owned by the handle: O_RDONLY for READER attaches (for io_uring reads of
 * tensor bytes at floor_offset), O_RDWR for writer modes and WRITE. */
int wf_shm_region_fd(const struct wf_shm_region *region);
const char *wf_shm_region_path(const struct wf_shm_region *region);
void wf_shm_region_digest(const struct wf_shm_region *region, struct wf_digest *ret_digest);
/* True if this attach called the fill callback. */
bool wf_shm_region_materialized(const struct wf_shm_region *region);
/* Why an existing region was rebuilt by this attach ("state MATERIALIZING", the validation
 * message), or NULL if it was not. For the agent's log. */
const char *wf_shm_region_rebuild_reason(const struct wf_shm_region *region);

/* Is this attachment the only holder? For the agent's eviction: a floor it alone holds can go.
 * Takes the guard EX (blocking, briefly: a materialization of this model holds it longer), tries
 * holders EX|NB, and goes back to SH either way (a failed conversion drops the SH lock on Linux;
 * the guard keeps attach and detach out meanwhile). Another attachment in the same process counts
 * as another holder. Returns 0 and *ret_sole, or -errno (then the attachment may have lost its
 * holders lock: detach it). */
int wf_shm_region_sole_holder(struct wf_shm_region *region, bool *ret_sole);

/* Pids holding the region's holders lock, from /proc/locks (FLOCK entries on the holders file's
 * inode, read until two reads agree: the kernel's listing can repeat or skip an entry while other
 * processes lock); best effort, for status displays: a process with two attachments appears
 * twice, a process outside our pid namespace as 0. Writes up to cap pids and *ret_n = the number of
 * holders found (may exceed cap). -ENOENT if there is no holders file. */
int wf_shm_holder_pids(const struct wf_shm_config *cfg, const struct wf_digest *digest, pid_t *pids,
                       size_t cap, size_t *ret_n, struct wf_diag *diag);

/* Directory scan, for the agent's restart. */
enum wf_shm_scan_class {
	WF_SHM_SCAN_READY = 0,  /* region READY and valid (held or not) */
	WF_SHM_SCAN_BROKEN = 1, /* region file present but not READY or invalid, or one of its
	                           files is not trusted (WF_EPERMISSION: not owned by our euid,
	                           or writable by others): error says why */
	WF_SHM_SCAN_ORPHAN = 2, /* lock files or a keep marker without a region (a crash between
	                           unlinks; a marker whose floor failed or was never made) */
	WF_SHM_SCAN_BUSY = 3,   /* guard held: being attached, released or materialized now */
	WF_SHM_SCAN_CLASS_MAX_
};

struct wf_shm_scan_entry {
	struct wf_digest digest;
	enum wf_shm_scan_class cls;
	bool has_region, has_guard, has_holders;
	bool has_keep;  /* the keep marker exists (wf_shm_region_set_keep()) */
	bool held;      /* some process holds the holders lock (not known when BUSY) */
	int error;      /* BROKEN: the validation error */
	uint32_t state; /* header state if the header could be read, else 0 */
	uint64_t size;  /* st_size of the region file */
	uint64_t generation;
	uint32_t n_tensors;
	int64_t ready_ns;
	int32_t materializer_pid;
	char why[160]; /* BROKEN: the validation message */
};

/* Lists the regions in the directory, one entry per digest, sorted by digest; files that are not
 * "wf-<32 hex>[.guard|.holders|.keep]" are ignored. Takes each guard EX|NB (never blocks: a held
 * guard is BUSY) and never creates or removes anything. A missing directory is an empty list.
 * Returns 0 with *ret_entries (free() it; NULL when *ret_n is 0), or -errno. */
int wf_shm_dir_scan(const struct wf_shm_config *cfg, struct wf_shm_scan_entry **ret_entries,
                    size_t *ret_n, struct wf_diag *diag);

#define WF_SHM_REMOVE_BROKEN_ONLY 0x1u /* refuse (WF_ESTATE) to remove a READY, valid region */

/* Removes a region, its lock files and its keep marker (this is the agent's explicit removal) when
 * nobody holds it: guard EX|NB (-EBUSY if held), holders EX|NB (-EBUSY if anyone is attached),
 * then unlink region, keep, holders, guard. Also clears orphaned lock files and markers. Returns 0,
 * -EBUSY, WF_ESTATE (BROKEN_ONLY and the region is valid), -ENOENT when there was nothing to
 * remove, or -errno. */
int wf_shm_region_remove(const struct wf_shm_config *cfg, const struct wf_digest *digest,
                         unsigned flags, struct wf_diag *diag);

/* Makes sure the floor directory can be trusted, for the agent at start: creates it if absent
 * (mkdir -p, cfg's directory mode and group), then opens it O_DIRECTORY | O_NOFOLLOW and checks
 * with fstat that it is a directory owned by this process's effective uid and not writable by
 * group or others, and that no ancestor lets anyone else replace it (each one owned by root or by
 * us, and not writable by others unless sticky, like /dev/shm; a symlink among them owned by root
 * or us). Returns 0, or WF_EPERMISSION with diag naming the path, its owner or mode and what to
 * do (also for a symlink in its place), or -errno. Thread-safe. */
int wf_shm_dir_check(const struct wf_shm_config *cfg, struct wf_diag *diag);

#define WF_SHM_KEEP_WAIT_MS 250

/* Sets (keep) or clears (!keep) the keep marker of a floor, under guard EX, waiting at most
 * WF_SHM_KEEP_WAIT_MS for it (-EBUSY then: call again later). Idempotent; setting it for a region
 * that does not exist yet is allowed (the agent sets it before materializing). A marker found that
 * this process does not own (wf__shm_check_file) is replaced. While the marker exists, the last
 * holder's detach leaves the region in place. Returns 0, -ENOENT when the directory does not exist,
 * or -errno, -EBUSY, with diag. */
int wf_shm_region_set_keep(const struct wf_shm_config *cfg, const struct wf_digest *digest,
                           bool keep, struct wf_diag *diag);

/* Removes the region (and its lock files) iff nobody holds it and it has no keep marker: guard
 * EX|NB, holders EX|NB, no marker, then unlink region, holders, guard. Returns 0 when removed,
 * -EBUSY when the guard or the holders lock is held, WF_ESTATE when the keep marker exists,
 * -ENOENT when there is no region (orphaned lock files are left to wf_shm_region_remove()), or
 * -errno; with diag. */
int wf_shm_region_reap(const struct wf_shm_config *cfg, const struct wf_digest *digest,
                       struct wf_diag *diag);

#ifdef __cplusplus
}
#endif
#endif
