/* The CUDA backend of the device interface (device/device.h): struct wf_device_ops over the CUDA
 * runtime. The compute backend (kernels/backend.h: the kernels, cuBLAS) lives beside it in cuda/
 * (backend.c) and queues its work on this backend's streams.
 *
 * Compute: host work in stream order is cudaLaunchHostFunc, and the native stream handed to
 * kernels is the cudaStream_t.
 *
 * Threads: the runtime keeps the current device per host thread, so every entry point selects
 * this handle's device first (cudaSetDevice is a cheap thread-local check once set). All
 * functions may run concurrently; the only state of our own is the checksum scratch word,
 * which a mutex serialises.
 *
 * Errors: translated here, at the edge: cudaErrorMemoryAllocation is -ENOMEM, no device or a
 * too-old driver -ENODEV, a registration overlap WF_EOVERLAP, a pending event -EAGAIN, and
 * everything else WF_EDEVICE; the diag carries cudaGetErrorName and cudaGetErrorString. Nothing
 * aborts: a sticky error (an illegal address in a kernel) keeps failing every later call with
 * WF_EDEVICE, and the worker decides what to do with a broken device.
 *
 * Sticky errors: the runtime's errors after which "the process must be terminated and
 * relaunched" (is_sticky). Whichever call first sees one, through wf__cuda_fail (every failure
 * of this file and of cuda/'s kernels goes there), marks the device lost, process-wide and per
 * ordinal, since every handle of a device shares its primary context. From then on every entry
 * point of a handle on that device fails at once with WF_EDEVICE (use()), without calling the
 * runtime, so the behaviour does not depend on which calls the driver still answers, and
 * wf_device_health() says lost. The health check also asks the runtime itself (a query of an idle
 * private stream: no work queued, nothing waited for), so a fault that no call has met yet is
 * found too.
 *
 * Pinned memory: cudaHostAllocPortable, so the buffer is pinned for every context in the
 * process. Write-combined only on request (WF_DEVICE_PINNED_WRITE_COMBINED): it speeds up H2D
 * over PCIe and keeps staging out of the CPU caches, but CPU reads from it are uncached and
 * slow, so a buffer the CPU ever reads (verification, D2H) must not be write-combined.
 *
 * Registration: the floor is mapped PROT_READ, and pinning a read-only mapping needs
 * cudaHostRegisterReadOnly (devices report cudaDevAttrHostRegisterReadOnlySupported). Where it
 * is missing, or the driver refuses the flag as unsupported, the range is registered with
 * default flags instead (which needs a writable mapping) and *ret_flags says READONLY was not
 * applied.
 *
 * Fault injection (tests; the spec options fail=N, bw=RATE and sticky=N of device.h, with the
 * host backend's semantics) so the failing-copy, slow-copy and lost-device paths of the engine
 * and the worker run on a GPU too. The backend keeps its own list of registered ranges for
 * them (only while an option is set). fail=N: a copy failed "when it runs" is never queued;
 * the stream remembers it, and the next event recorded on it carries WF_EDEVICE, reported by
 * query and synchronize once the event completes (streams and events are small wrappers for
 * this). bw=RATE: after each registered-range H2D copy, a host function on the stream sleeps
 * until the copy's slot on a virtual link ends (reserved when queued, shared by the device's
 * streams), so the stream's later work, events included, completes no earlier than
 * bytes/RATE after the copy was queued. sticky=N: the checksum kernel is queued before the
 * Nth copy with an unmapped address to read, a real illegal address that poisons the context
 * as a bug in a kernel would. */
#include "cuda/device_cuda.h"

#include "base/error.h"
#include "base/units.h"
#include "cuda/checksum.cuh"
#include "cuda/error.h"
#include "device/checksum.h"

#include <cuda_runtime_api.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define INJECT_RANGES 16

struct cuda_dev {
	int ordinal;
	int sm_count;
	int readonly_register; /* cudaDevAttrHostRegisterReadOnlySupported */
	pthread_mutex_t sum_lock;
	unsigned long long *d_sum; /* checksum accumulator (device) */
	cudaStream_t probe;        /* never used for work: the health check queries it */

	/* Fault injection (spec options; 0 = off). */
	uint64_t fail_every, bw, sticky_after;
	atomic_uint_fast64_t fail_seen, copies_seen;
	pthread_mutex_t inj_lock; /* guards reg[], n_reg and link_ns */
	struct {
		uintptr_t lo, hi;
	} reg[INJECT_RANGES]; /* registered ranges (fail=, bw=) */
	unsigned n_reg;
	uint64_t link_ns; /* bw=: when the virtual link is free again (CLOCK_MONOTONIC) */
};

/* The backend's stream and event handles: the CUDA handle, and fail=N's "failed when it ran"
 * mark (a stream's, until the next event recorded on it takes it over). */
struct cuda_stream {
	cudaStream_t s;
	atomic_int fault;
};

struct cuda_event {
	cudaEvent_t ev;
	atomic_int fault;
};

/* ---- Sticky errors ------------------------------------------------------------------------- */

#define LOST_MAX 64 /* ordinals tracked; a larger one shares the last slot */

/* Per ordinal: the first sticky error seen (0: none), and which call saw it (under lost_lock,
 * written once, before the error is published). */
static atomic_int lost_err[LOST_MAX];
static char lost_what[LOST_MAX][96];
static pthread_mutex_t lost_lock = PTHREAD_MUTEX_INITIALIZER;

static bool is_sticky(cudaError_t e)
{
	switch (e) {
	case cudaErrorIllegalAddress:
	case cudaErrorLaunchFailure:
	case cudaErrorLaunchTimeout:
	case cudaErrorAssert:
	case cudaErrorHardwareStackError:
	case cudaErrorIllegalInstruction:
	case cudaErrorMisalignedAddress:
	case cudaErrorInvalidAddressSpace:
	case cudaErrorInvalidPc:
	case cudaErrorTensorMemoryLeak:
	case cudaErrorECCUncorrectable:
	case cudaErrorContained:
	case cudaErrorMpsClientTerminated:
	case cudaErrorExternalDevice:
		return true;
	default:
		return false;
	}
}

static int lost_slot(int ordinal)
{
	return ordinal < 0 ? 0 : ordinal >= LOST_MAX ? LOST_MAX - 1 : ordinal;
}

static void mark_lost(int slot, cudaError_t e, const char *what)
{
	pthread_mutex_lock(&lost_lock);
	if (atomic_load_explicit(&lost_err[slot], memory_order_relaxed) == 0) {
		snprintf(lost_what[slot], sizeof(lost_what[slot]), "%s", what);
		atomic_store_explicit(&lost_err[slot], (int)e, memory_order_release);
	}
	pthread_mutex_unlock(&lost_lock);
}

/* Remembers a sticky error for the current device of this thread (every device when the
 * runtime cannot say which: a restart recovers them all). */
static void remember(cudaError_t e, const char *what)
{
	int dev = -1;

	if (!is_sticky(e))
		return;
	if (cudaGetDevice(&dev) != cudaSuccess || dev < 0) {
		for (int i = 0; i < LOST_MAX; i++)
			mark_lost(i, e, what);
		return;
	}
	mark_lost(lost_slot(dev), e, what);
}

/* WF_EDEVICE, explained, when ordinal's device is lost; else 0. */
static int lost(int ordinal, struct wf_diag *diag)
{
	int slot = lost_slot(ordinal);
	cudaError_t e = (cudaError_t)atomic_load_explicit(&lost_err[slot], memory_order_acquire);

	if (e == cudaSuccess)
		return 0;
	pthread_mutex_lock(&lost_lock);
	wf_diag_set(diag, WF_EDEVICE,
	            "cuda:%d is lost: %s (%s), first seen by %s; every call fails until the "
	            "process restarts",
	            ordinal, cudaGetErrorName(e), cudaGetErrorString(e), lost_what[slot]);
	pthread_mutex_unlock(&lost_lock);
	return WF_EDEVICE;
}

static int translate(cudaError_t e)
{
	switch (e) {
	case cudaErrorMemoryAllocation:
		return -ENOMEM;
	case cudaErrorNoDevice:
	case cudaErrorInsufficientDriver:
	case cudaErrorInvalidDevice:
		return -ENODEV;
	case cudaErrorHostMemoryAlreadyRegistered:
		return WF_EOVERLAP;
	case cudaErrorNotReady:
		return -EAGAIN;
	default:
		return WF_EDEVICE;
	}
}

/* Translates a failed call, clears the runtime's last-error slot (so a later unrelated launch
 * check does not report it again; sticky errors stay sticky regardless) and explains. */
int wf__cuda_fail(cudaError_t e, struct wf_diag *diag, const char *what)
{
	(void)cudaGetLastError();
	remember(e, what);
	return wf_diag_set(diag, translate(e), "%s: %s (%s)", what, cudaGetErrorName(e),
	                   cudaGetErrorString(e));
}

/* The first call on a machine without a usable GPU: say so in plain words. The static runtime
 * loads libcuda.so.1 itself and reports a missing library as cudaErrorInsufficientDriver, the
 * same code as a driver too old for it; cudaDriverGetVersion tells the two apart (0: none). */
static int fail(cudaError_t e, struct wf_diag *diag, const char *what)
{
	return wf__cuda_fail(e, diag, what);
}

static int no_device(cudaError_t e, struct wf_diag *diag)
{
	int drv = 0;

	(void)cudaGetLastError();
	switch (e) {
	case cudaErrorInsufficientDriver:
		if (cudaDriverGetVersion(&drv) != cudaSuccess || drv == 0)
			return wf_diag_set(
			    diag, -ENODEV,
			    "no CUDA driver found (libcuda.so.1 is not installed or "
			    "cannot be loaded): is there an NVIDIA GPU and its driver? "
			    "(--device host runs without one)");
		return wf_diag_set(
		    diag, -ENODEV,
		    "the CUDA driver (%d.%d) is older than the CUDA %d.%d runtime this "
		    "worker was built with: update the driver",
		    drv / 1000, drv % 1000 / 10, CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10);
	case cudaErrorNoDevice:
		return wf_diag_set(diag, -ENODEV,
		                   "no CUDA GPU found (the driver sees no device: check "
		                   "CUDA_VISIBLE_DEVICES and nvidia-smi)");
	default:
		return fail(e, diag, "cudaGetDeviceCount");
	}
}

/* Every entry point starts here: a lost device fails at once; else select it on this thread. */
static int use(struct cuda_dev *d, struct wf_diag *diag)
{
	int ret = lost(d->ordinal, diag);

	if (ret < 0)
		return ret;
	cudaError_t e = cudaSetDevice(d->ordinal);
	return e == cudaSuccess ? 0 : fail(e, diag, "cudaSetDevice");
}

int wf_cuda_device_count(void)
{
	int n = 0;
	cudaError_t e = cudaGetDeviceCount(&n);

	if (e != cudaSuccess) {
		(void)cudaGetLastError();
		return 0;
	}
	return n > 0 ? n : 0;
}

static int cuda_probe(void)
{
	return wf_cuda_device_count();
}

static int parse_ordinal(const char *args, int *ret)
{
	char *end;
	long v;

	if (!args[0]) {
		*ret = 0;
		return 0;
	}
	if (args[0] < '0' || args[0] > '9')
		return WF_EINVAL;
	errno = 0;
	v = strtol(args, &end, 10);
	if (errno || *end || v > INT_MAX)
		return WF_EINVAL;
	*ret = (int)v;
	return 0;
}

/* "", "N", "N,k=v,..." or "k=v,..." (the ordinal, 0 when absent, then the fault injections).
 * Touches no GPU, so a bad spec is refused the same with or without one. */
static int parse_args(const char *args, int *ret_ordinal, struct cuda_dev *d, struct wf_diag *diag)
{
	char buf[256];
	size_t flen = strcspn(args, ",");
	char *p = buf;

	*ret_ordinal = 0;
	if (strlen(args) >= sizeof(buf))
		return wf_diag_set(diag, WF_EINVAL, "cuda device spec too long");
	strcpy(buf, args);
	if (flen > 0 && !memchr(args, '=', flen)) {
		/* The first field is the ordinal. */
		buf[flen] = '\0';
		if (parse_ordinal(buf, ret_ordinal) < 0)
			return wf_diag_set(diag, WF_EINVAL,
			                   "cuda device spec: bad ordinal '%s' (cuda:N[,k=v...])",
			                   buf);
		if (!args[flen])
			return 0;
		p = buf + flen + 1;
	}
	if (!args[0])
		return 0;
	for (char *kv = p, *next; kv; kv = next) {
		char *eq;
		uint64_t v;

		next = strchr(kv, ',');
		if (next)
			*next++ = '\0';
		eq = strchr(kv, '=');
		if (!eq || eq == kv)
			return wf_diag_set(
			    diag, WF_EINVAL,
			    "cuda device option '%s': expected k=v (cuda:N[,k=v...])", kv);
		*eq = '\0';
		if (wf_parse_size(eq + 1, &v) < 0)
			return wf_diag_set(diag, WF_EINVAL, "cuda device option %s: bad value '%s'",
			                   kv, eq + 1);
		if (strcmp(kv, "fail") == 0)
			d->fail_every = v;
		else if (strcmp(kv, "bw") == 0)
			d->bw = v;
		else if (strcmp(kv, "sticky") == 0)
			d->sticky_after = v;
		else
			return wf_diag_set(diag, WF_EINVAL,
			                   "cuda device: unknown option '%s' (fail, bw, sticky)",
			                   kv);
	}
	return 0;
}

static int cuda_open(const char *args, void **ret_impl, char *name, size_t name_len,
                     struct wf_diag *diag)
{
	struct cudaDeviceProp prop;
	struct cuda_dev *d;
	cudaError_t e;
	int ordinal = 0, count = 0, ret;

	d = calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	ret = parse_args(args, &ordinal, d, diag);
	if (ret < 0)
		goto err_free;
	e = cudaGetDeviceCount(&count);
	if (e != cudaSuccess || count == 0) {
		ret = no_device(e != cudaSuccess ? e : cudaErrorNoDevice, diag);
		goto err_free;
	}
	if (ordinal >= count) {
		ret = wf_diag_set(diag, -ENODEV, "cuda:%d: only %d CUDA device(s)", ordinal, count);
		goto err_free;
	}
	d->ordinal = ordinal;
	ret = use(d, diag);
	if (ret < 0)
		goto err_free;
	/* Create the primary context now, so the first copy does not pay for it. */
	e = cudaInitDevice(ordinal, 0, 0);
	if (e != cudaSuccess) {
		ret = fail(e, diag, "cudaInitDevice");
		goto err_free;
	}
	e = cudaGetDeviceProperties(&prop, ordinal);
	if (e != cudaSuccess) {
		ret = fail(e, diag, "cudaGetDeviceProperties");
		goto err_free;
	}
	d->sm_count = prop.multiProcessorCount;
	if (cudaDeviceGetAttribute(&d->readonly_register, cudaDevAttrHostRegisterReadOnlySupported,
	                           ordinal) != cudaSuccess) {
		(void)cudaGetLastError();
		d->readonly_register = 0;
	}
	e = cudaMalloc((void **)&d->d_sum, sizeof(*d->d_sum));
	if (e != cudaSuccess) {
		ret = fail(e, diag, "cudaMalloc (checksum scratch)");
		goto err_free;
	}
	e = cudaStreamCreateWithFlags(&d->probe, cudaStreamNonBlocking);
	if (e != cudaSuccess) {
		ret = fail(e, diag, "cudaStreamCreateWithFlags (health probe)");
		cudaFree(d->d_sum);
		goto err_free;
	}
	pthread_mutex_init(&d->sum_lock, NULL);
	pthread_mutex_init(&d->inj_lock, NULL);
	atomic_init(&d->fail_seen, 0);
	atomic_init(&d->copies_seen, 0);
	snprintf(name, name_len, "cuda:%d (%s, cc %d.%d)", ordinal, prop.name, prop.major,
	         prop.minor);
	*ret_impl = d;
	return 0;
err_free:
	free(d);
	return ret;
}

static void cuda_cancel(void *impl)
{
	/* Queued CUDA work cannot be withdrawn; close waits for it instead. */
	(void)impl;
}

static void cuda_close(void *impl)
{
	struct cuda_dev *d = impl;

	if (!d)
		return;
	if (use(d, NULL) == 0) {
		cudaFree(d->d_sum);
		cudaStreamDestroy(d->probe);
	}
	pthread_mutex_destroy(&d->sum_lock);
	pthread_mutex_destroy(&d->inj_lock);
	free(d);
	/* No cudaDeviceReset: the primary context is shared by every handle on this device in
	 * the process. */
}

static int cuda_mem_info(void *impl, size_t *ret_free, size_t *ret_total, struct wf_diag *diag)
{
	cudaError_t e;
	int ret = use(impl, diag);

	if (ret < 0)
		return ret;
	e = cudaMemGetInfo(ret_free, ret_total);
	return e == cudaSuccess ? 0 : fail(e, diag, "cudaMemGetInfo");
}

static int cuda_synchronize(void *impl, struct wf_diag *diag)
{
	cudaError_t e;
	int ret = use(impl, diag);

	if (ret < 0)
		return ret;
	e = cudaDeviceSynchronize();
	return e == cudaSuccess ? 0 : fail(e, diag, "cudaDeviceSynchronize");
}

/* No work queued, none waited for: an idle stream's query answers at once, with the context's
 * sticky error if it has one (fail() remembers it). */
static int cuda_health(void *impl, struct wf_diag *diag)
{
	struct cuda_dev *d = impl;
	cudaError_t e;

	if (lost(d->ordinal, diag) < 0)
		return WF_EDEVICE;
	e = cudaSetDevice(d->ordinal);
	if (e == cudaSuccess)
		e = cudaStreamQuery(d->probe);
	if (e == cudaSuccess)
		return 0;
	/* Remembered when sticky; any other failure leaves the device healthy. */
	(void)fail(e, NULL, "cudaStreamQuery (health check)");
	return lost(d->ordinal, diag);
}

static int cuda_mem_alloc(void *impl, size_t size, void **ret_ptr, struct wf_diag *diag)
{
	cudaError_t e;
	void *p;
	int ret = use(impl, diag);

	if (ret < 0)
		return ret;
	e = cudaMalloc(&p, size);
	if (e != cudaSuccess) {
		size_t f = 0, t = 0;
		(void)cudaGetLastError();
		if (cudaMemGetInfo(&f, &t) != cudaSuccess)
			(void)cudaGetLastError();
		return wf_diag_set(diag, translate(e),
		                   "cudaMalloc of %zu bytes: %s (%s); %zu of %zu bytes free", size,
		                   cudaGetErrorName(e), cudaGetErrorString(e), f, t);
	}
	*ret_ptr = p;
	return 0;
}

static int cuda_mem_free(void *impl, void *ptr, size_t size, struct wf_diag *diag)
{
	cudaError_t e;
	int ret = use(impl, diag);
	(void)size;

	if (ret < 0)
		return ret;
	e = cudaFree(ptr);
	return e == cudaSuccess ? 0 : fail(e, diag, "cudaFree");
}

static int cuda_pinned_alloc(void *impl, size_t size, unsigned flags, void **ret_ptr,
                             struct wf_diag *diag)
{
	unsigned cf = cudaHostAllocPortable;
	cudaError_t e;
	void *p;
	int ret = use(impl, diag);

	if (ret < 0)
		return ret;
	if (flags & WF_DEVICE_PINNED_WRITE_COMBINED)
		cf |= cudaHostAllocWriteCombined;
	e = cudaHostAlloc(&p, size, cf);
	if (e != cudaSuccess)
		return fail(e, diag, "cudaHostAlloc");
	*ret_ptr = p;
	return 0;
}

static int cuda_pinned_free(void *impl, void *ptr, size_t size, struct wf_diag *diag)
{
	cudaError_t e;
	int ret = use(impl, diag);
	(void)size;

	if (ret < 0)
		return ret;
	e = cudaFreeHost(ptr);
	return e == cudaSuccess ? 0 : fail(e, diag, "cudaFreeHost");
}

static int cuda_host_register(void *impl, const void *ptr, size_t size, unsigned flags,
                              unsigned *ret_flags, struct wf_diag *diag)
{
	struct cuda_dev *d = impl;
	int readonly = (flags & WF_DEVICE_REGISTER_READONLY) && d->readonly_register;
	cudaError_t e;
	int ret = use(d, diag);

	if (ret < 0)
		return ret;
	/* The runtime takes void *; with cudaHostRegisterReadOnly it never writes. */
	e = cudaHostRegister((void *)ptr, size,
	                     cudaHostRegisterPortable | (readonly ? cudaHostRegisterReadOnly : 0));
	if (e == cudaErrorNotSupported && readonly) {
		(void)cudaGetLastError();
		readonly = 0;
		e = cudaHostRegister((void *)ptr, size, cudaHostRegisterPortable);
	}
	if (e != cudaSuccess) {
		if ((flags & WF_DEVICE_REGISTER_READONLY) && !readonly)
			return fail(e, diag,
			            "cudaHostRegister (read-only registration unsupported on this "
			            "device; the default needs a writable mapping)");
		return fail(e, diag, "cudaHostRegister");
	}
	*ret_flags = readonly ? WF_DEVICE_REGISTER_READONLY : 0;
	if (d->fail_every || d->bw) {
		pthread_mutex_lock(&d->inj_lock);
		if (d->n_reg < INJECT_RANGES) {
			d->reg[d->n_reg].lo = (uintptr_t)ptr;
			d->reg[d->n_reg].hi = (uintptr_t)ptr + size;
			d->n_reg++;
		}
		pthread_mutex_unlock(&d->inj_lock);
	}
	return 0;
}

/* cudaHostUnregister does not wait for copies still reading the range (unlike cudaFree, which
 * synchronises), and a DMA from pages no longer pinned reads whatever the kernel put there since.
 * device.h promises that every free waits for the work queued before it, so drain the device
 * first. A device that fails the drain (a sticky error) runs no more copies: unregister anyway,
 * so the pages are not left pinned, and report the drain's error. */
static int cuda_host_unregister(void *impl, const void *ptr, size_t size, struct wf_diag *diag)
{
	struct cuda_dev *d = impl;
	cudaError_t e, drained;
	int ret = use(d, diag);
	(void)size;

	if (d->fail_every || d->bw) {
		pthread_mutex_lock(&d->inj_lock);
		for (unsigned i = 0; i < d->n_reg; i++)
			if (d->reg[i].lo == (uintptr_t)ptr) {
				d->reg[i] = d->reg[--d->n_reg];
				break;
			}
		pthread_mutex_unlock(&d->inj_lock);
	}
	if (ret < 0)
		return ret;
	drained = cudaDeviceSynchronize();
	if (drained != cudaSuccess)
		(void)cudaGetLastError();
	e = cudaHostUnregister((void *)ptr);
	if (drained != cudaSuccess)
		return fail(drained, diag, "cudaDeviceSynchronize (before cudaHostUnregister)");
	return e == cudaSuccess ? 0 : fail(e, diag, "cudaHostUnregister");
}

static int cuda_stream_create(void *impl, void **ret_stream, struct wf_diag *diag)
{
	struct cuda_stream *cs;
	cudaError_t e;
	int ret = use(impl, diag);

	if (ret < 0)
		return ret;
	cs = calloc(1, sizeof(*cs));
	if (!cs)
		return -ENOMEM;
	atomic_init(&cs->fault, 0);
	/* Non-blocking: no implicit ordering against the legacy default stream, which other
	 * code in the process (an engine) may use. */
	e = cudaStreamCreateWithFlags(&cs->s, cudaStreamNonBlocking);
	if (e != cudaSuccess) {
		free(cs);
		return fail(e, diag, "cudaStreamCreateWithFlags");
	}
	*ret_stream = cs;
	return 0;
}

static void cuda_stream_destroy(void *impl, void *stream)
{
	struct cuda_stream *cs = stream;

	/* cudaStreamDestroy returns at once and lets queued work finish later; the interface
	 * promises that host functions queued on the stream have run when destroy returns (their
	 * arg may be freed right after), so wait first. A sticky error ends the wait too. A lost
	 * device is left alone: its context dies with the process. */
	if (use(impl, NULL) == 0) {
		if (cudaStreamSynchronize(cs->s) != cudaSuccess)
			(void)cudaGetLastError();
		if (cudaStreamDestroy(cs->s) != cudaSuccess)
			(void)cudaGetLastError();
	}
	free(cs);
}

static int cuda_stream_synchronize(void *impl, void *stream, struct wf_diag *diag)
{
	struct cuda_stream *cs = stream;
	cudaError_t e;
	int ret = use(impl, diag);

	if (ret < 0)
		return ret;
	e = cudaStreamSynchronize(cs->s);
	return e == cudaSuccess ? 0 : fail(e, diag, "cudaStreamSynchronize");
}

/* ---- Fault injection ------------------------------------------------------------------------ */

/* Nothing in the first pages of the address space is ever mapped for a GPU: a read there is an
 * illegal address (cudaErrorIllegalAddress), the commonest sticky error. */
#define STICKY_FAULT_ADDR ((const void *)(uintptr_t)0x100)

static uint64_t mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int in_registered(struct cuda_dev *d, const void *src, size_t size)
{
	uintptr_t lo = (uintptr_t)src, hi = lo + size;
	int hit = 0;

	pthread_mutex_lock(&d->inj_lock);
	for (unsigned i = 0; i < d->n_reg && !hit; i++)
		hit = lo >= d->reg[i].lo && hi <= d->reg[i].hi;
	pthread_mutex_unlock(&d->inj_lock);
	return hit;
}

/* bw=: reserves size bytes on the virtual link; returns when the slot ends. */
static uint64_t link_reserve(struct cuda_dev *d, size_t size)
{
	uint64_t now = mono_ns(), start, end;

	pthread_mutex_lock(&d->inj_lock);
	start = d->link_ns > now ? d->link_ns : now;
	end = start + (uint64_t)((double)size * 1e9 / (double)d->bw);
	d->link_ns = end;
	pthread_mutex_unlock(&d->inj_lock);
	return end;
}

/* A host function (cudaHostFn_t): sleeps until the CLOCK_MONOTONIC time its argument carries
 * (no allocation, so nothing leaks if a sticky error means it never runs). */
static void sleep_until_arg(void *arg)
{
	uint64_t t = (uint64_t)(uintptr_t)arg;
	struct timespec ts = {.tv_sec = (time_t)(t / 1000000000ull),
	                      .tv_nsec = (long)(t % 1000000000ull)};
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}
_Static_assert(sizeof(uintptr_t) >= sizeof(uint64_t), "bw= passes a time in a pointer");

/* fail=N for an H2D copy from a registered range: 0 (copy it), WF_EDEVICE (fail now) or 1
 * (skip it: it "failed when it ran"). */
static int fail_injected(struct cuda_dev *d)
{
	const uint64_t k = atomic_fetch_add(&d->fail_seen, 1) + 1;

	if (k % d->fail_every)
		return 0;
	return (k / d->fail_every) & 1 ? WF_EDEVICE : 1;
}

static int cuda_memcpy_async(void *impl, void *stream, void *dst, const void *src, size_t size,
                             enum wf_device_copy kind, struct wf_diag *diag)
{
	static const enum cudaMemcpyKind kinds[WF_DEVICE_COPY_MAX] = {
	    [WF_DEVICE_COPY_H2D] = cudaMemcpyHostToDevice,
	    [WF_DEVICE_COPY_D2H] = cudaMemcpyDeviceToHost,
	    [WF_DEVICE_COPY_D2D] = cudaMemcpyDeviceToDevice,
	};
	struct cuda_dev *d = impl;
	struct cuda_stream *cs = stream;
	uint64_t slow_until = 0;
	cudaError_t e;
	int ret = use(d, diag);

	if (ret < 0)
		return ret;
	if ((d->fail_every || d->bw) && kind == WF_DEVICE_COPY_H2D && in_registered(d, src, size)) {
		int inject = d->fail_every ? fail_injected(d) : 0;
		if (inject == WF_EDEVICE)
			return wf_diag_set(diag, WF_EDEVICE,
			                   "cuda device: injected copy failure (fail=%llu)",
			                   (unsigned long long)d->fail_every);
		if (inject) {
			atomic_store(&cs->fault, 1);
			return 0;
		}
		if (d->bw)
			slow_until = link_reserve(d, size);
	}
	if (d->sticky_after && atomic_fetch_add(&d->copies_seen, 1) + 1 == d->sticky_after &&
	    wf__cuda_checksum_launch(STICKY_FAULT_ADDR, 256, d->d_sum, 1, cs->s) != cudaSuccess)
		(void)cudaGetLastError();
	e = cudaMemcpyAsync(dst, src, size, kinds[kind], cs->s);
	if (e == cudaSuccess && slow_until)
		e = cudaLaunchHostFunc(cs->s, sleep_until_arg, (void *)(uintptr_t)slow_until);
	return e == cudaSuccess ? 0 : fail(e, diag, "cudaMemcpyAsync");
}

static int cuda_memset_async(void *impl, void *stream, void *dst, int value, size_t size,
                             struct wf_diag *diag)
{
	struct cuda_stream *cs = stream;
	cudaError_t e;
	int ret = use(impl, diag);

	if (ret < 0)
		return ret;
	e = cudaMemsetAsync(dst, value, size, cs->s);
	return e == cudaSuccess ? 0 : fail(e, diag, "cudaMemsetAsync");
}

/* wf_device_host_fn has the shape of cudaHostFn_t (CUDART_CB is empty on Linux), so fn goes to
 * the runtime as it is: no wrapper to allocate, none to leak if a sticky error means the runtime
 * never calls it. */
static int cuda_host_fn_async(void *impl, void *stream, wf_device_host_fn fn, void *arg,
                              struct wf_diag *diag)
{
	struct cuda_stream *cs = stream;
	cudaError_t e;
	int ret = use(impl, diag);

	if (ret < 0)
		return ret;
	e = cudaLaunchHostFunc(cs->s, (cudaHostFn_t)fn, arg);
	return e == cudaSuccess ? 0 : fail(e, diag, "cudaLaunchHostFunc");
}

/* The cudaStream_t itself: kernels in cuda/ launch on it (<<<..., stream>>>). */
static void *cuda_stream_native(void *impl, void *stream)
{
	(void)impl;
	return ((struct cuda_stream *)stream)->s;
}

static int cuda_event_create(void *impl, unsigned flags, void **ret_event, struct wf_diag *diag)
{
	unsigned cf = cudaEventDefault;
	struct cuda_event *ce;
	cudaError_t e;
	int ret = use(impl, diag);

	if (ret < 0)
		return ret;
	ce = calloc(1, sizeof(*ce));
	if (!ce)
		return -ENOMEM;
	atomic_init(&ce->fault, 0);
	/* Timing makes record and query costlier; only measurements ask for it. */
	if (!(flags & WF_DEVICE_EVENT_TIMING))
		cf |= cudaEventDisableTiming;
	if (flags & WF_DEVICE_EVENT_BLOCKING_SYNC)
		cf |= cudaEventBlockingSync;
	e = cudaEventCreateWithFlags(&ce->ev, cf);
	if (e != cudaSuccess) {
		free(ce);
		return fail(e, diag, "cudaEventCreateWithFlags");
	}
	*ret_event = ce;
	return 0;
}

static void cuda_event_destroy(void *impl, void *event)
{
	struct cuda_event *ce = event;

	if (use(impl, NULL) == 0 && cudaEventDestroy(ce->ev) != cudaSuccess)
		(void)cudaGetLastError();
	free(ce);
}

static int cuda_event_record(void *impl, void *event, void *stream, struct wf_diag *diag)
{
	struct cuda_event *ce = event;
	struct cuda_stream *cs = stream;
	cudaError_t e;
	int ret = use(impl, diag);

	if (ret < 0)
		return ret;
	e = cudaEventRecord(ce->ev, cs->s);
	if (e != cudaSuccess)
		return fail(e, diag, "cudaEventRecord");
	/* fail=N: this record captures a copy that "failed when it ran", if one came before. */
	atomic_store(&ce->fault, atomic_exchange(&cs->fault, 0));
	return 0;
}

/* A completed event's fail=N mark. */
static int event_fault(struct cuda_dev *d, struct cuda_event *ce, struct wf_diag *diag)
{
	if (!atomic_load(&ce->fault))
		return 0;
	return wf_diag_set(diag, WF_EDEVICE,
	                   "cuda device: injected copy failure before this event (fail=%llu)",
	                   (unsigned long long)d->fail_every);
}

static int cuda_event_query(void *impl, void *event, struct wf_diag *diag)
{
	struct cuda_event *ce = event;
	cudaError_t e;
	int ret = use(impl, diag);

	if (ret < 0)
		return ret;
	e = cudaEventQuery(ce->ev);
	if (e == cudaSuccess)
		return event_fault(impl, ce, diag);
	if (e == cudaErrorNotReady) {
		(void)cudaGetLastError();
		return -EAGAIN;
	}
	return fail(e, diag, "cudaEventQuery");
}

static int cuda_event_synchronize(void *impl, void *event, struct wf_diag *diag)
{
	struct cuda_event *ce = event;
	cudaError_t e;
	int ret = use(impl, diag);

	if (ret < 0)
		return ret;
	e = cudaEventSynchronize(ce->ev);
	if (e != cudaSuccess)
		return fail(e, diag, "cudaEventSynchronize");
	return event_fault(impl, ce, diag);
}

static int cuda_event_elapsed_ms(void *impl, void *start, void *end, double *ret_ms,
                                 struct wf_diag *diag)
{
	cudaError_t e;
	float ms;
	int ret = use(impl, diag);

	if (ret < 0)
		return ret;
	e = cudaEventElapsedTime(&ms, ((struct cuda_event *)start)->ev,
	                         ((struct cuda_event *)end)->ev);
	if (e == cudaSuccess) {
		*ret_ms = ms;
		return 0;
	}
	if (e == cudaErrorNotReady) {
		(void)cudaGetLastError();
		return -EAGAIN;
	}
	if (e == cudaErrorInvalidResourceHandle) {
		(void)fail(e, diag, "cudaEventElapsedTime (event never recorded?)");
		return WF_ESTATE;
	}
	return fail(e, diag, "cudaEventElapsedTime");
}

static int cuda_stream_wait_event(void *impl, void *stream, void *event, struct wf_diag *diag)
{
	cudaError_t e;
	int ret = use(impl, diag);

	if (ret < 0)
		return ret;
	e = cudaStreamWaitEvent(((struct cuda_stream *)stream)->s, ((struct cuda_event *)event)->ev,
	                        0);
	return e == cudaSuccess ? 0 : fail(e, diag, "cudaStreamWaitEvent");
}

static int cuda_checksum(void *impl, void *stream_h, const void *ptr, size_t size,
                         uint64_t *ret_sum, struct wf_diag *diag)
{
	struct cuda_dev *d = impl;
	cudaStream_t stream = ((struct cuda_stream *)stream_h)->s;
	unsigned long long acc = 0;
	const char *what;
	cudaError_t e;
	int ret = use(d, diag);

	if (ret < 0)
		return ret;
	pthread_mutex_lock(&d->sum_lock);
	what = "cudaMemsetAsync (checksum)";
	e = cudaMemsetAsync(d->d_sum, 0, sizeof(*d->d_sum), stream);
	if (e != cudaSuccess)
		goto out;
	what = "checksum kernel launch";
	e = wf__cuda_checksum_launch(ptr, size, d->d_sum, d->sm_count, stream);
	if (e != cudaSuccess)
		goto out;
	what = "cudaMemcpyAsync (checksum)";
	e = cudaMemcpyAsync(&acc, d->d_sum, sizeof(acc), cudaMemcpyDeviceToHost, stream);
	if (e != cudaSuccess)
		goto out;
	what = "cudaStreamSynchronize (checksum)";
	e = cudaStreamSynchronize(stream);
out:
	pthread_mutex_unlock(&d->sum_lock);
	if (e != cudaSuccess)
		return fail(e, diag, what);
	*ret_sum = wf_device_checksum_final(acc, size);
	return 0;
}

static const struct wf_device_ops cuda_ops = {
    .name = "cuda",
    .kind = WF_DEVICE_KIND_CUDA,
    .probe = cuda_probe,
    .open = cuda_open,
    .cancel = cuda_cancel,
    .close = cuda_close,
    .mem_info = cuda_mem_info,
    .synchronize = cuda_synchronize,
    .health = cuda_health,
    .mem_alloc = cuda_mem_alloc,
    .mem_free = cuda_mem_free,
    .pinned_alloc = cuda_pinned_alloc,
    .pinned_free = cuda_pinned_free,
    .host_register = cuda_host_register,
    .host_unregister = cuda_host_unregister,
    .stream_create = cuda_stream_create,
    .stream_destroy = cuda_stream_destroy,
    .stream_synchronize = cuda_stream_synchronize,
    .memcpy_async = cuda_memcpy_async,
    .memset_async = cuda_memset_async,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .event_query = cuda_event_query,
    .event_synchronize = cuda_event_synchronize,
    .event_elapsed_ms = cuda_event_elapsed_ms,
    .stream_wait_event = cuda_stream_wait_event,
    .host_fn_async = cuda_host_fn_async,
    .stream_native = cuda_stream_native,
    .checksum = cuda_checksum,
};

const struct wf_device_ops *wf_cuda_device_ops(void)
{
	return &cuda_ops;
}
