/* The staging pipeline: bytes from a floor region or a model file to device memory.
 *
 * Two ways to move them:
 *
 *   STAGED  io reads (io_uring, or the pread pool) of the source descriptor fill a ring of
 *           pinned staging buffers; each filled buffer is copied to the device with an
 *           asynchronous copy on one of the copy streams, an event is recorded after it, and
 *           the buffer is refilled once that event completes. Reads into some buffers, copies
 *           out of others and the next reads all overlap: every buffer is in one of
 *           FREE -> READING -> COPYING -> FREE, and several are in each stage at once.
 *           Works for every source, and with O_DIRECT for model files (each read is placed in
 *           its buffer at the file offset's phase modulo 4096, which is what the reader needs).
 *   DIRECT  the source's read-only mapping (the floor) is registered with the device and copied
 *           from with no staging step: one copy instead of a read and a copy. Floor sources
 *           only (a model file has no mapping here).
 *
 * Batching: the items of one load are taken in the order given. Many small items go into one
 * staging buffer: items whose source ranges follow each other (gaps of up to
 * WF_STAGE_MERGE_GAP bytes are read along) share one read, and when their destinations keep
 * the same spacing inside one device allocation (the same non-zero `group`) they also share
 * one copy, so a layer of small tensors costs one read and one copy. An item larger than a
 * buffer spans as many buffers as it needs, in pieces that flow through the ring like any
 * other.
 *
 * Which mode: AUTO uses the stage's preference: DIRECT where the source has a mapping (it does
 * half the memory traffic of STAGED on the host), STAGED otherwise or where registering the
 * mapping fails. wf_stage_calibrate() measures both on a real load and sets the preference to
 * the faster one; benchmarks force either with ctl.mode. On the host device both modes are
 * memcpys by the copy threads and the choice only matters for speed, never for the bytes.
 *
 * Errors: 0, -errno or WF_E* (base/error.h); struct wf_diag says which item and where. Library
 * code does not log.
 *
 * Threads: a stage, and the io reader it was given, are used by one thread at a time (the
 * worker's residency manager thread); the reader must have no other requests outstanding while
 * a load runs (the stage reaps every completion). Create the reader and the stage on the thread
 * that loads: an io_uring reader registers its ring with the creating thread, and calls from
 * another thread fail with -EINVAL. Different stages may run concurrently on one device. */
#ifndef WF_WORKER_STAGE_H
#define WF_WORKER_STAGE_H

#include "base/diag.h"
#include "device/device.h"
#include "io/reader.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define WF_STAGE_BUFFERS_DEFAULT     8u
#define WF_STAGE_BUFFERS_MAX         256u
#define WF_STAGE_BUFFER_SIZE_DEFAULT (8u << 20)
#define WF_STAGE_BUFFER_SIZE_MIN     (64u << 10)
#define WF_STAGE_BUFFER_SIZE_MAX     (1u << 30)
#define WF_STAGE_STREAMS_DEFAULT     2u
#define WF_STAGE_STREAMS_MAX         16u
#define WF_STAGE_MERGE_GAP           (16u << 10) /* source gap read along to merge reads */

/* wf_stage_opts.flags */
enum {
	WF_STAGE_OPT_NO_REGISTER = 1u << 0,    /* do not register staging with the io reader */
	WF_STAGE_OPT_WRITE_COMBINED = 1u << 1, /* staging in write-combined pinned memory (CUDA) */
};

/* Zero means the default in every field; NULL options mean all defaults. */
struct wf_stage_opts {
	unsigned n_buffers; /* staging buffers in the ring (default 8, at most 256) */
	size_t buffer_size; /* bytes each (default 8 MiB, rounded up to 64 KiB, 64 KiB .. 1 GiB) */
	unsigned n_streams; /* copy streams (default 2, at most 16) */
	unsigned flags;     /* WF_STAGE_OPT_* */
};

enum wf_stage_mode {
	WF_STAGE_MODE_AUTO = 0, /* the stage's preference (see the top of this file) */
	WF_STAGE_MODE_STAGED,
	WF_STAGE_MODE_DIRECT,
	WF_STAGE_MODE_MAX
};

/* Where the bytes come from. Offsets in items are offsets in this source.
 *  - a floor region: fd = wf_shm_region_fd(), map = wf_shm_region_data(), map_size =
 *    wf_shm_region_size(); path NULL. The caller keeps the attachment (and so the mapping and
 *    the descriptor) alive for the whole call;
 *  - a model file: path, fd -1, map NULL. Opened on the io reader for the call (O_DIRECT where
 *    the filesystem does it). With expect_size/expect_mtime_ns non-zero, a file that no longer
 *    has them (the model changed on disk) fails with WF_ECHANGED, checked at open and again
 *    after the last read. */
struct wf_stage_src {
	int fd;
	const void *map;
	size_t map_size;
	bool map_registered; /* the caller registered [map, map+map_size) with the device already
	                        (READONLY); otherwise DIRECT registers it for the call */
	const char *path;
	uint64_t expect_size;
	int64_t expect_mtime_ns;
};

/* One range to move: len bytes at source offset `offset` to device memory at dst (inside a live
 * device allocation). Items of the same non-zero group must lie in one device allocation: the
 * stage may then merge their copies (and copy the gap bytes between them along). */
struct wf_stage_item {
	uint64_t offset;
	uint64_t len;
	void *dst;
	uint32_t group;
};

/* Progress, from the loading thread: item bytes on the device so far (copies completed, gaps not
 * counted) and the total; at least once per buffer and once with done == total on success. It
 * must not call into the stage. */
typedef void wf_stage_progress_fn(void *ctx, uint64_t done, uint64_t total);

struct wf_stage_ctl {
	enum wf_stage_mode mode;        /* AUTO, or force one (DIRECT without a map: WF_EINVAL) */
	wf_stage_progress_fn *progress; /* optional */
	void *progress_ctx;
	/* Optional. Non-zero stops the load promptly (polled at every completion and at least
	 * every few milliseconds) with WF_ECANCELED. Set from any thread with an atomic store. */
	const volatile int *cancel;
};

struct wf_stage_stats {
	enum wf_stage_mode mode; /* STAGED or DIRECT: what ran */
	uint64_t bytes;          /* item bytes moved */
	uint64_t bytes_read;     /* STAGED: bytes read, merged gaps included */
	double seconds;          /* wall time of the call */
	double gbps;             /* bytes / seconds / 1e9 */
	uint64_t batches;        /* buffers filled (STAGED) or copy groups (DIRECT) */
	uint64_t reads;          /* io requests */
	uint64_t copies;         /* device copies queued */
};

struct wf_stage_info {
	unsigned n_buffers;
	size_t buffer_size;
	unsigned n_streams;
	bool io_registered;              /* the staging ring is registered with the io reader */
	enum wf_stage_mode preferred;    /* what AUTO picks for a source with a mapping */
	bool calibrated;                 /* preferred was measured by wf_stage_calibrate() */
	double staged_gbps, direct_gbps; /* the calibration's rates; 0 before */
};

struct wf_stage;

/* What a stage made with opts would report before any transfer (opts checked as
 * wf_stage_create checks them), for a caller that creates its stage only when it first needs
 * one. Returns 0 or WF_EINVAL. */
int wf_stage_info_planned(const struct wf_stage_opts *opts, struct wf_stage_info *ret_info,
                          struct wf_diag *diag);

/* Creates a stage on dev that reads with io (both borrowed: they must outlive the stage): allocates
 * the pinned ring (one allocation, MADV_DONTFORK), registers it with the reader where that works
 * (failure only costs the speed-up), and creates the copy streams and one event per buffer.
 * opts may be NULL. Returns 0 and *ret_stage, WF_EINVAL for bad options, or the device's error
 * (-ENOMEM when pinned memory is short). Thread-safe with respect to other stages. */
int wf_stage_create(struct wf_device *dev, struct wf_io_reader *io,
                    const struct wf_stage_opts *opts, struct wf_stage **ret_stage,
                    struct wf_diag *diag);

/* Waits for the stage's device work, unregisters and frees the ring, streams and events.
 * Accepts NULL. No load may be running. */
void wf_stage_destroy(struct wf_stage *stage);

void wf_stage_info(const struct wf_stage *stage, struct wf_stage_info *ret_info);

/* Moves every item from src to the device and returns when all of it is there (the copies have
 * completed). Items are validated first (dst non-NULL, no offset overflow, inside map_size when
 * the mode is DIRECT): a bad one fails the call before any byte moves. ctl may be NULL (AUTO,
 * no progress, no cancel). On failure or cancel every read has been reaped and every copy has
 * completed or stopped before the call returns, so the caller may free the destinations at
 * once; what they hold is then undefined. Returns 0 and *ret_stats (optional); WF_ECANCELED;
 * WF_ECHANGED / WF_ETRUNCATED (the file changed or is short); WF_EINVAL; -errno of a read or
 * the device's error. */
int wf_stage_load(struct wf_stage *stage, const struct wf_stage_src *src,
                  const struct wf_stage_item *items, size_t n, const struct wf_stage_ctl *ctl,
                  struct wf_stage_stats *ret_stats, struct wf_diag *diag);

/* Measures both modes on the same load (items from a source with a mapping; the prefix of the
 * items covering at most max_bytes, 0 for all), STAGED first then DIRECT, writing the same bytes
 * twice, and sets the preference to the faster one. Stats of each run are returned (optional).
 * Returns 0, or the first failing load's error (the preference is then unchanged); WF_EINVAL
 * when src has no mapping. cancel (optional) as in wf_stage_ctl. */
int wf_stage_calibrate(struct wf_stage *stage, const struct wf_stage_src *src,
                       const struct wf_stage_item *items, size_t n, uint64_t max_bytes,
                       const volatile int *cancel, struct wf_stage_stats *ret_staged,
                       struct wf_stage_stats *ret_direct, struct wf_diag *diag);

/* Checks that the device bytes of every item equal the source bytes: wf_device_checksum() of
 * [dst, dst+len) against wf_device_checksum_host() of the source range (read through src.map,
 * or through a private read-only mapping of src.path / src.fd). Runs on a private stream after
 * all work queued on the device so far. Returns 0; WF_ECHECKSUM with diag naming the first bad
 * item and *ret_bad (optional) its index; or the error of a mapping or of the device.
 * Thread-safe (it uses no stage state): a caller must keep the destinations alive. */
int wf_stage_verify(struct wf_device *dev, const struct wf_stage_src *src,
                    const struct wf_stage_item *items, size_t n, size_t *ret_bad,
                    struct wf_diag *diag);

/* "auto", "staged", "direct"; "?" out of range. Static. */
const char *wf_stage_mode_name(enum wf_stage_mode mode);

#ifdef __cplusplus
}
#endif
#endif
