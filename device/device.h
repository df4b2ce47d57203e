/* The device interface: where weights go after the floor.
 *
 * A worker moves tensors from the shared-memory floor to "device memory" through pinned staging
 * buffers (or directly from a registered floor mapping) with asynchronous copies on streams, and
 * orders work with events. Two backends implement the same contract:
 *
 *   host     "device memory" is host memory; each stream has a copy thread that runs memcpy in
 *            order, optionally throttled to imitate a PCIe link. Built into libwfdevice, so
 *            every residency, staging and post-fetch path runs in CI without a GPU.
 *   cuda     the CUDA runtime (libwfcuda, built when the toolkit exists). libwfdevice does not
 *            depend on it: an executable registers it with wf_device_backend_register().
 *
 * Compute: the interface moves bytes and orders work; it runs no kernels itself. The compute
 * backend of a device kind (kernels/backend.h: one op table type, the host backend there, the
 * CUDA one in cuda/) queues its kernels on the stream's native handle (wf_device_stream_native)
 * or runs them in stream order as host work (wf_device_host_fn_async), so CPU and CUDA kernels
 * plug in the same way and libwfdevice depends on neither.
 *
 * Device specs (wf_device_open):
 *   "host"                 host backend with default options
 *   "host:k=v,k=v"         options: mem=SIZE (arena, default 8Gi), bw=RATE (bytes/s per
 *                          direction, H2D and D2H each; 0 = unthrottled, the default),
 *                          chunk=SIZE (largest memcpy step, default 16Mi; throttled copies use
 *                          steps of about 1 ms), mlock=0|1 (mlock pinned buffers), and the
 *                          fault injections below
 *   "cuda:N"               CUDA device ordinal N ("cuda" means "cuda:0")
 *   "cuda:N,k=v,k=v"       options: the fault injections below, and bw=RATE (bytes/s): H2D
 *                          copies from a registered range (the floor) take at least
 *                          bytes/RATE, one link shared by the device's streams (other copies
 *                          run at the bus's speed; a GPU cannot be made slower)
 *   "auto"                 the first registered non-host backend that probes at least one
 *                          device, its ordinal 0; otherwise "host". wf_device_selection() says
 *                          what was chosen and why.
 * Fault injection, for the tests of what a failing device does to its users (both backends,
 * the same semantics, 0 = never, the default):
 *   fail=N     every Nth H2D copy from a registered range fails: alternately when queued
 *              (wf_device_memcpy_async returns WF_EDEVICE) and when it runs (the copy is
 *              skipped, its destination keeps its old bytes, and the next event recorded on its
 *              stream completes with WF_EDEVICE). The device stays healthy.
 *   sticky=N   the Nth copy (any kind) faults when it runs, as a kernel that hits an illegal
 *              address does (CUDA: a kernel reading an unmapped address is queued before it, a
 *              real cudaErrorIllegalAddress): from then on every call on the device fails with
 *              WF_EDEVICE and wf_device_health() says the device is lost.
 * Sizes and rates are parsed by wf_parse_size() (base/units.h), like every other size in the
 * project: K, M, G, T and Ki, Mi, Gi, Ti (with an optional B) are all powers of 1024, so
 * "host:mem=8G" is 8 GiB, as 8G is to --arena or a config file.
 *
 * Pointers: device pointers are void * values that only mean something to the device (host
 * backend: real host addresses; CUDA: device virtual addresses). The interface tracks every
 * device allocation, pinned buffer and registration it hands out, so freeing an unknown pointer
 * is WF_EINVAL (never a crash), and the device side of every copy must lie inside one live
 * device allocation, the host side outside all of them (WF_EINVAL otherwise): a confusion of the
 * two is caught on the host backend in CI, not as a fault on a GPU.
 *
 * Errors: 0, -errno or WF_E* (base/error.h). Backend errors are translated at the backend edge:
 * out of memory is -ENOMEM, no device or driver -ENODEV, other CUDA failures WF_EDEVICE, each
 * with the CUDA error name and text in the diag. Every int-returning function takes an optional
 * struct wf_diag (NULL to skip). A sticky error (CUDA: an illegal address, a launch failure)
 * makes every later call fail with WF_EDEVICE until the process restarts:
 * wf_device_health() tells it apart from an ordinary failure.
 *
 * Threads: every function is thread-safe unless it says otherwise; wf_device_close() must be the
 * last call on a handle. Streams and events belong to the device that created them and must not
 * be used with another. Nothing here forks or may be used across fork(): open devices in the
 * process that uses them (CUDA is not fork-safe).
 *
 * Lifetime: memory passed to an async operation (both sides of a copy) must stay valid until
 * the operation completes. Freeing device memory, pinned memory or a registration first waits
 * for all work already queued on the device (as cudaFree does), so a free never races a copy
 * queued before it. */
#ifndef WF_DEVICE_DEVICE_H
#define WF_DEVICE_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "base/diag.h"

#ifdef __cplusplus
extern "C" {
#endif

enum wf_device_kind { WF_DEVICE_KIND_HOST, WF_DEVICE_KIND_CUDA, WF_DEVICE_KIND_MAX };

enum wf_device_copy {
	WF_DEVICE_COPY_H2D, /* host (pageable, pinned or registered) to device */
	WF_DEVICE_COPY_D2H, /* device to host: verification and read-back */
	WF_DEVICE_COPY_D2D, /* device to device: compaction */
	WF_DEVICE_COPY_MAX
};

/* wf_device_pinned_alloc flags. Write-combined memory crosses PCIe faster and does not pollute
 * the CPU caches, but CPU reads from it are uncached and very slow: use it only for staging the
 * CPU (or a DMA engine) writes sequentially and never reads back. Host backend: ignored. */
#define WF_DEVICE_PINNED_WRITE_COMBINED 0x1u

/* wf_device_host_register flags. READONLY registers a PROT_READ mapping (the floor) so the
 * device reads it directly (CUDA: cudaHostRegisterReadOnly). Where the device cannot, the CUDA
 * backend registers with default flags (which needs a writable mapping) and leaves the bit out
 * of *ret_flags. */
#define WF_DEVICE_REGISTER_READONLY 0x1u

/* wf_device_event_create flags. Events are created without timing unless TIMING is given (timing
 * costs on CUDA). BLOCKING_SYNC makes event_synchronize sleep instead of spin (CUDA:
 * cudaEventBlockingSync; host backend always sleeps). */
#define WF_DEVICE_EVENT_TIMING        0x1u
#define WF_DEVICE_EVENT_BLOCKING_SYNC 0x2u

struct wf_device;        /* an open device (opaque) */
struct wf_device_stream; /* an in-order queue of device work (opaque) */
struct wf_device_event;  /* a marker in a stream (opaque) */

/* ---- Handle ---------------------------------------------------------------------------------- */

/* Opens the device that spec names (see the top of this file). *ret_dev is written only on
 * success and is released with wf_device_close(). Returns WF_EINVAL for a malformed spec,
 * WF_ENOT_FOUND for an unregistered backend, -ENODEV for a missing ordinal, or the backend's
 * error. */
int wf_device_open(const char *spec, struct wf_device **ret_dev, struct wf_diag *diag);

/* Shuts the device down in three steps: cancels queued work that has not started (host: copies
 * stop at the next chunk; CUDA cannot cancel and lets it finish), waits for the work in flight,
 * then frees every stream, event, allocation, pinned buffer and registration still held.
 * Accepts NULL. Not thread-safe: no other call on dev may run or follow. */
void wf_device_close(struct wf_device *dev);

/* "host", "cuda:0 (NVIDIA H100 80GB HBM3, cc 9.0)". Static for the life of dev. */
const char *wf_device_name(const struct wf_device *dev);
enum wf_device_kind wf_device_kind(const struct wf_device *dev);
/* How the spec was resolved, for the caller to log: "auto: no cuda device (cuda probe found 0);
 * using host", or the spec itself. Static for the life of dev. */
const char *wf_device_selection(const struct wf_device *dev);

/* Free and total device memory in bytes. Host backend: total is the arena, free is total minus
 * the page-rounded sizes of live allocations (exact). CUDA: cudaMemGetInfo (other processes and
 * the allocator's granularity show). Both outputs optional. */
int wf_device_mem_info(struct wf_device *dev, size_t *ret_free, size_t *ret_total,
                       struct wf_diag *diag);

/* Waits for all work queued on every stream of dev before the call. */
int wf_device_synchronize(struct wf_device *dev, struct wf_diag *diag);

/* Whether dev can still run work: 0 when healthy; WF_EDEVICE when the device hit a sticky error
 * and is unusable until the process restarts (every later call on it, and on every other handle
 * of the same device in this process, fails), with diag saying which error and which call first
 * saw it. Sticky: CUDA's illegal address, launch failure, device-side assert, misaligned
 * address, illegal instruction, launch timeout, uncorrectable ECC error and the like (the
 * runtime's errors after which "the process must be terminated and relaunched"); host backend:
 * the sticky=N injection. An ordinary failure (a failed copy, fail=N, out of memory, a bad
 * argument) leaves the device healthy. Once lost, always lost.
 *
 * Cheap and non-blocking: it queues no work and waits for none, so a daemon may poll it (the
 * worker turns /readyz red and exits for its supervisor to restart it). CUDA: a sticky error is
 * remembered by whichever call of the backend, or of cuda/'s kernels, first sees it, and the
 * check also asks the runtime (a query of an idle private stream), so an error that no call has
 * met yet is found too. Thread-safe. WF_EINVAL for a NULL dev. */
int wf_device_health(struct wf_device *dev, struct wf_diag *diag);

/* ---- Memory ---------------------------------------------------------------------------------- */

/* Allocates size > 0 bytes of device memory (at least 256-byte aligned; contents undefined).
 * -ENOMEM when the arena or the device is full. The caller owns it until wf_device_mem_free. */
int wf_device_mem_alloc(struct wf_device *dev, size_t size, void **ret_ptr, struct wf_diag *diag);
/* Frees what wf_device_mem_alloc returned (the exact pointer), after the work already queued
 * completes. NULL is a no-op; any other unknown pointer is WF_EINVAL. */
int wf_device_mem_free(struct wf_device *dev, void *ptr, struct wf_diag *diag);

/* Page-locked host memory for staging (CUDA: cudaHostAlloc, portable; host backend: an
 * anonymous mapping with MADV_DONTFORK, mlock'ed with the mlock=1 option). Not counted in the
 * device's memory. flags: WF_DEVICE_PINNED_*. */
int wf_device_pinned_alloc(struct wf_device *dev, size_t size, unsigned flags, void **ret_ptr,
                           struct wf_diag *diag);
/* Frees a pinned buffer after queued work completes. NULL is a no-op; unknown is WF_EINVAL. */
int wf_device_pinned_free(struct wf_device *dev, void *ptr, struct wf_diag *diag);

/* Registers an existing host mapping [ptr, ptr+size) so copies from it run as DMA without
 * staging (CUDA: cudaHostRegister; host backend: checks the range is mapped and records it).
 * The caller keeps the mapping alive until wf_device_host_unregister. Overlapping an existing
 * registration is WF_EOVERLAP; an unmapped range is -ENOMEM (host) or WF_EDEVICE (CUDA).
 * *ret_flags (optional) receives the WF_DEVICE_REGISTER_* flags actually applied. */
int wf_device_host_register(struct wf_device *dev, const void *ptr, size_t size, unsigned flags,
                            unsigned *ret_flags, struct wf_diag *diag);
/* Unregisters by the pointer given to register, after queued work completes. Unknown is
 * WF_EINVAL. */
int wf_device_host_unregister(struct wf_device *dev, const void *ptr, struct wf_diag *diag);

/* ---- Streams --------------------------------------------------------------------------------- */

/* Creates a stream; work on it runs in submission order, concurrently with other streams (CUDA:
 * a non-blocking stream; host backend: a copy thread). */
int wf_device_stream_create(struct wf_device *dev, struct wf_device_stream **ret_stream,
                            struct wf_diag *diag);
/* Destroys a stream after the work queued on it has completed (both backends wait for it, so
 * every host function queued on it has run when this returns). Accepts NULL. */
void wf_device_stream_destroy(struct wf_device_stream *stream);
/* Waits until all work queued on stream before the call has completed. */
int wf_device_stream_synchronize(struct wf_device_stream *stream, struct wf_diag *diag);

/* Queues a copy of size bytes (0 is a no-op) and returns without waiting. kind says which side
 * is device memory; see the top of this file for the range checks. Host backend: throttled by
 * the bw option for H2D and D2H. CUDA: only pinned or registered host memory gives a truly
 * asynchronous copy; pageable memory is staged by the driver. */
int wf_device_memcpy_async(struct wf_device_stream *stream, void *dst, const void *src, size_t size,
                           enum wf_device_copy kind, struct wf_diag *diag);
/* Queues setting size bytes of device memory to (unsigned char)value. */
int wf_device_memset_async(struct wf_device_stream *stream, void *dst, int value, size_t size,
                           struct wf_diag *diag);

/* The device that created stream (NULL for NULL): a compute backend handed a stream checks it
 * is its device's (kernels/backend.h). */
struct wf_device *wf_device_stream_device(const struct wf_device_stream *stream);

/* ---- Host work and kernels ------------------------------------------------------------------- */

/* Host work in stream order: what an engine queues between kernels (CPU kernels on the host
 * backend, routing decisions that pick the experts to post-fetch, releasing a staging slot).
 * It takes one pointer and returns nothing because CUDA's host functions do (see below). */
typedef void (*wf_device_host_fn)(void *arg);

/* Queues fn(arg) on stream: it runs after all work queued on stream before it has completed,
 * and work queued on stream after it (copies, event records, other host functions, kernels)
 * starts only when fn has returned. Returns without waiting; WF_EINVAL for a NULL stream or fn.
 * CUDA: cudaLaunchHostFunc (fn runs on a thread of the driver); host backend: the stream's own
 * thread runs it, between copies.
 *
 * What fn may do: read and write host memory (pinned, registered or pageable) that earlier work
 * on the stream produced, and signal the application's own threads. What it must not do: call
 * any wf_device_* function (CUDA forbids CUDA calls in a host function, and on the host
 * backend a synchronize from fn waits for fn itself), or block on other device work (CUDA may
 * run the host functions of every stream of a device on one thread, so waiting for another
 * stream's host function can deadlock). fn is the stream's work while it runs: a long fn delays
 * everything queued after it on that stream, and nothing on other streams.
 *
 * Errors: fn cannot return one, and no device call reports fn's failure. The convention: fn
 * writes its status into memory that arg points to (an int, 0 or -errno/WF_E*), and the caller
 * reads it only after a wf_device_stream_synchronize() of that stream, or a synchronize of an
 * event recorded after fn, has returned 0; that return orders fn's writes before the read.
 * Device errors (a failed copy before fn) are reported by that synchronize, not to fn.
 *
 * Lifetime: arg must stay valid until fn has run; wf_device_stream_destroy() and
 * wf_device_close() return only after every queued fn has run. fn runs once for every 0
 * returned, also when wf_device_close() cancels the copies around it (host backend: a canceled
 * copy leaves its destination partly written, so fn must not trust bytes once a close began),
 * so fn may own and free what arg holds. The one exception is a CUDA device that failed with a
 * sticky error before fn's turn: the runtime does not promise to run fn then, and the
 * synchronize that follows reports the error. */
int wf_device_host_fn_async(struct wf_device_stream *stream, wf_device_host_fn fn, void *arg,
                            struct wf_diag *diag);

/* The backend's native handle for stream, for kernels that launch on it: CUDA returns the
 * cudaStream_t (as void *; never NULL: the streams are created non-blocking, not the legacy
 * default stream). The host backend returns NULL: it has no native queue, and CPU kernels
 * run as host functions queued with wf_device_host_fn_async(). NULL for a NULL stream. The
 * handle stays owned by the interface: do not destroy it, and work launched on it obeys the
 * same order as work queued through this interface. */
void *wf_device_stream_native(const struct wf_device_stream *stream);

/* ---- Events ---------------------------------------------------------------------------------- */

/* Creates an event (flags: WF_DEVICE_EVENT_*). An event never recorded counts as complete. */
int wf_device_event_create(struct wf_device *dev, unsigned flags,
                           struct wf_device_event **ret_event, struct wf_diag *diag);
/* Destroys an event. Waits queued on it (stream_wait_event) still resolve. Accepts NULL. */
void wf_device_event_destroy(struct wf_device_event *event);
/* Captures the work queued on stream so far: the event completes when that work has. Recording
 * again replaces the capture (query and synchronize then refer to the new one). */
int wf_device_event_record(struct wf_device_event *event, struct wf_device_stream *stream,
                           struct wf_diag *diag);
/* Non-blocking: 0 when the captured work is complete, -EAGAIN while it is pending, WF_ECANCELED
 * when the device was closed under it, or a device error. */
int wf_device_event_query(struct wf_device_event *event, struct wf_diag *diag);
/* Blocks until the captured work completes; returns as query would then. */
int wf_device_event_synchronize(struct wf_device_event *event, struct wf_diag *diag);
/* Milliseconds between two completed TIMING events. WF_EINVAL without the flag, -EAGAIN while
 * either is pending. */
int wf_device_event_elapsed_ms(struct wf_device_event *start, struct wf_device_event *end,
                               double *ret_ms, struct wf_diag *diag);
/* Makes work queued on stream after this call wait for the event's current capture (a later
 * record does not change what this wait waits for). Does not block the caller. */
int wf_device_stream_wait_event(struct wf_device_stream *stream, struct wf_device_event *event,
                                struct wf_diag *diag);

/* ---- Verification ---------------------------------------------------------------------------- */

/* Computes wf_device_checksum_host() of [ptr, ptr+size) of device memory on the device, after
 * the work queued on stream, and blocks for the result (CUDA: a kernel; host backend: the host
 * function once the stream is idle). Any alignment. Tests use it to prove device bytes equal
 * file bytes without reading them back. */
int wf_device_checksum(struct wf_device_stream *stream, const void *ptr, size_t size,
                       uint64_t *ret_sum, struct wf_diag *diag);

/* The checksum of a host buffer (device/checksum.h gives the definition). Thread-safe, pure. */
uint64_t wf_device_checksum_host(const void *ptr, size_t size);

/* ---- Backends -------------------------------------------------------------------------------- */

/* The function table a backend implements. All pointers are required. `impl` is what open
 * returned; stream and event handles are the backend's own (void *). The front end (device.c)
 * has already validated arguments (non-NULL handles, size > 0, kind in range, pointers known and
 * copy ranges inside live allocations), serialises nothing else, and owns the bookkeeping of
 * allocations, so a backend may assume well-formed calls. Every function may be called from any
 * thread concurrently, except close. Errors are translated before they return. */
struct wf_device_ops {
	const char *name; /* spec prefix: "host", "cuda" */
	enum wf_device_kind kind;

	/* Number of usable devices; 0 (never an error) when there is no driver or device. May
	 * initialise a driver in the calling process (CUDA does): a process that forks later
	 * (Criterion's runner) probes in a child. */
	int (*probe)(void);
	/* args: the spec after "name:" ("" when absent). Writes *ret_impl only on success. name
	 * receives a description such as "cuda:0 (NVIDIA H100, cc 9.0)" (NUL-terminated). */
	int (*open)(const char *args, void **ret_impl, char *name, size_t name_len,
	            struct wf_diag *diag);
	/* Step 1 of shutdown: cancel queued work that has not started and wake every waiter. Must
	 * not block. Work canceled this way completes with WF_ECANCELED. */
	void (*cancel)(void *impl);
	/* Step 3: free impl. Every stream and event has been destroyed and every allocation freed
	 * by the front end before this is called. */
	void (*close)(void *impl);

	int (*mem_info)(void *impl, size_t *ret_free, size_t *ret_total, struct wf_diag *diag);
	int (*synchronize)(void *impl, struct wf_diag *diag);
	/* 0 healthy, WF_EDEVICE lost (see wf_device_health). Never blocks. */
	int (*health)(void *impl, struct wf_diag *diag);

	int (*mem_alloc)(void *impl, size_t size, void **ret_ptr, struct wf_diag *diag);
	/* Synchronises with queued work first (see the top of this file). size is the size given
	 * to mem_alloc. */
	int (*mem_free)(void *impl, void *ptr, size_t size, struct wf_diag *diag);
	int (*pinned_alloc)(void *impl, size_t size, unsigned flags, void **ret_ptr,
	                    struct wf_diag *diag);
	int (*pinned_free)(void *impl, void *ptr, size_t size, struct wf_diag *diag);
	int (*host_register)(void *impl, const void *ptr, size_t size, unsigned flags,
	                     unsigned *ret_flags, struct wf_diag *diag);
	int (*host_unregister)(void *impl, const void *ptr, size_t size, struct wf_diag *diag);

	int (*stream_create)(void *impl, void **ret_stream, struct wf_diag *diag);
	/* Returns after queued work has completed (or was canceled) and every host function
	 * queued on the stream has run. */
	void (*stream_destroy)(void *impl, void *stream);
	int (*stream_synchronize)(void *impl, void *stream, struct wf_diag *diag);
	int (*memcpy_async)(void *impl, void *stream, void *dst, const void *src, size_t size,
	                    enum wf_device_copy kind, struct wf_diag *diag);
	int (*memset_async)(void *impl, void *stream, void *dst, int value, size_t size,
	                    struct wf_diag *diag);

	int (*event_create)(void *impl, unsigned flags, void **ret_event, struct wf_diag *diag);
	/* Pending waits on the event still resolve after this. */
	void (*event_destroy)(void *impl, void *event);
	int (*event_record)(void *impl, void *event, void *stream, struct wf_diag *diag);
	/* 0 done, -EAGAIN pending; never blocks. */
	int (*event_query)(void *impl, void *event, struct wf_diag *diag);
	int (*event_synchronize)(void *impl, void *event, struct wf_diag *diag);
	/* Both events were created with WF_DEVICE_EVENT_TIMING (checked by the front end). */
	int (*event_elapsed_ms)(void *impl, void *start, void *end, double *ret_ms,
	                        struct wf_diag *diag);
	int (*stream_wait_event)(void *impl, void *stream, void *event, struct wf_diag *diag);

	/* Queues fn(arg) in stream order (see wf_device_host_fn_async); fn is not NULL. */
	int (*host_fn_async)(void *impl, void *stream, wf_device_host_fn fn, void *arg,
	                     struct wf_diag *diag);
	/* The native stream handle, or NULL where the backend has none. Never fails. */
	void *(*stream_native)(void *impl, void *stream);

	/* Runs after the work queued on stream; blocks for the result. */
	int (*checksum)(void *impl, void *stream, const void *ptr, size_t size, uint64_t *ret_sum,
	                struct wf_diag *diag);
};

/* The built-in host backend (always registered). */
const struct wf_device_ops *wf_device_host_ops(void);

/* Makes a backend available to wf_device_open() under ops->name.
 *
 * Why registration and not a weak symbol or a link-time dependency: libwfdevice must build and
 * work without CUDA, and a weak reference to wf_cuda_device_ops would silently resolve to NULL
 * when libwfcuda is a static archive (the linker does not pull an archive member to satisfy a
 * weak reference), turning "CUDA compiled in" into "CUDA quietly absent". An executable built
 * with CUDA says so once, in main():
 *     #ifdef WF_HAVE_CUDA
 *     wf_device_backend_register(wf_cuda_device_ops());
 *     #endif
 * Registering the same table again is a no-op (0); another table under a taken name is
 * WF_EDUPLICATE; more than 8 backends is WF_ELIMIT. Thread-safe. */
int wf_device_backend_register(const struct wf_device_ops *ops);

#ifdef __cplusplus
}
#endif
#endif
