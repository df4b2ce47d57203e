/* The front end of the device interface: argument checks, the record of what was handed out,
 * and dispatch to a backend's ops table. Backends see only well-formed calls. */
#include "device/device.h"

#include "base/error.h"
#include "device/checksum.h"
#include "device/internal.h"
#include "device/ranges.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct wf_device_stream {
	struct wf_device *dev;
	void *impl;
	struct wf_device_stream *prev, *next;
};

struct wf_device_event {
	struct wf_device *dev;
	void *impl;
	unsigned flags;
	struct wf_device_event *prev, *next;
};

struct wf_device {
	const struct wf_device_ops *ops;
	void *impl;
	char name[160];
	char selection[256];
	/* Guards the range sets and the object lists. Never held across a backend call that can
	 * block, so a slow copy never stalls an unrelated allocation. */
	pthread_mutex_t lock;
	struct wf__device_ranges mem, pinned, reg;
	struct wf_device_stream *streams;
	struct wf_device_event *events;
};

#define LIST_PUSH(head, x)                                                                         \
	do {                                                                                       \
		(x)->prev = NULL;                                                                  \
		(x)->next = (head);                                                                \
		if (head)                                                                          \
			(head)->prev = (x);                                                        \
		(head) = (x);                                                                      \
	} while (0)
#define LIST_UNLINK(head, x)                                                                       \
	do {                                                                                       \
		if ((x)->prev)                                                                     \
			(x)->prev->next = (x)->next;                                               \
		else                                                                               \
			(head) = (x)->next;                                                        \
		if ((x)->next)                                                                     \
			(x)->next->prev = (x)->prev;                                               \
	} while (0)

int wf_device_open(const char *spec, struct wf_device **ret_dev, struct wf_diag *diag)
{
	const struct wf_device_ops *ops;
	const char *args;
	struct wf_device *dev;
	int ret;

	if (!ret_dev)
		return WF_EINVAL;
	dev = calloc(1, sizeof(*dev));
	if (!dev)
		return -ENOMEM;
	ret = wf__device_registry_resolve(spec, &ops, &args, dev->selection, sizeof(dev->selection),
	                                  diag);
	if (ret < 0)
		goto err;
	ret = -pthread_mutex_init(&dev->lock, NULL);
	if (ret < 0)
		goto err;
	dev->ops = ops;
	ret = ops->open(args, &dev->impl, dev->name, sizeof(dev->name), diag);
	if (ret < 0) {
		pthread_mutex_destroy(&dev->lock);
		goto err;
	}
	*ret_dev = dev;
	return 0;
err:
	free(dev);
	return ret;
}

void wf_device_close(struct wf_device *dev)
{
	if (!dev)
		return;
	/* Step 1: cancel what has not started, without blocking. */
	dev->ops->cancel(dev->impl);
	/* Step 2: wait for the work in flight, stream by stream (each destroy joins). */
	while (dev->streams) {
		struct wf_device_stream *s = dev->streams;
		LIST_UNLINK(dev->streams, s);
		dev->ops->stream_destroy(dev->impl, s->impl);
		free(s);
	}
	/* Step 3: free what the caller left behind, then the backend. */
	while (dev->events) {
		struct wf_device_event *e = dev->events;
		LIST_UNLINK(dev->events, e);
		dev->ops->event_destroy(dev->impl, e->impl);
		free(e);
	}
	for (size_t i = 0; i < dev->reg.n; i++)
		dev->ops->host_unregister(dev->impl, (const void *)dev->reg.v[i].base,
		                          dev->reg.v[i].size, NULL);
	for (size_t i = 0; i < dev->pinned.n; i++)
		dev->ops->pinned_free(dev->impl, (void *)dev->pinned.v[i].base,
		                      dev->pinned.v[i].size, NULL);
	for (size_t i = 0; i < dev->mem.n; i++)
		dev->ops->mem_free(dev->impl, (void *)dev->mem.v[i].base, dev->mem.v[i].size, NULL);
	wf__device_ranges_fini(&dev->reg);
	wf__device_ranges_fini(&dev->pinned);
	wf__device_ranges_fini(&dev->mem);
	dev->ops->close(dev->impl);
	pthread_mutex_destroy(&dev->lock);
	free(dev);
}

const char *wf_device_name(const struct wf_device *dev)
{
	return dev ? dev->name : "(none)";
}

enum wf_device_kind wf_device_kind(const struct wf_device *dev)
{
	return dev ? dev->ops->kind : WF_DEVICE_KIND_MAX;
}

const char *wf_device_selection(const struct wf_device *dev)
{
	return dev ? dev->selection : "(none)";
}

int wf_device_mem_info(struct wf_device *dev, size_t *ret_free, size_t *ret_total,
                       struct wf_diag *diag)
{
	size_t f, t;
	int ret;

	if (!dev)
		return WF_EINVAL;
	ret = dev->ops->mem_info(dev->impl, &f, &t, diag);
	if (ret < 0)
		return ret;
	if (ret_free)
		*ret_free = f;
	if (ret_total)
		*ret_total = t;
	return 0;
}

int wf_device_synchronize(struct wf_device *dev, struct wf_diag *diag)
{
	if (!dev)
		return WF_EINVAL;
	return dev->ops->synchronize(dev->impl, diag);
}

int wf_device_health(struct wf_device *dev, struct wf_diag *diag)
{
	if (!dev)
		return WF_EINVAL;
	return dev->ops->health(dev->impl, diag);
}

/* ---- Memory ---------------------------------------------------------------------------------- */

int wf_device_mem_alloc(struct wf_device *dev, size_t size, void **ret_ptr, struct wf_diag *diag)
{
	void *p;
	int ret;

	if (!dev || !ret_ptr || size == 0)
		return wf_diag_set(diag, WF_EINVAL, "device alloc: bad argument (size %zu)", size);
	ret = dev->ops->mem_alloc(dev->impl, size, &p, diag);
	if (ret < 0)
		return ret;
	pthread_mutex_lock(&dev->lock);
	ret = wf__device_ranges_add(&dev->mem, (uintptr_t)p, size);
	pthread_mutex_unlock(&dev->lock);
	if (ret < 0) {
		/* WF_EOVERLAP here means the backend returned live memory twice: report it loudly
		 * rather than hand out aliased buffers. */
		dev->ops->mem_free(dev->impl, p, size, NULL);
		return wf_diag_set(diag, ret == WF_EOVERLAP ? WF_EINTERNAL : ret,
		                   "device alloc: cannot record %p+%zu", p, size);
	}
	*ret_ptr = p;
	return 0;
}

/* Removes ptr from rs (so a concurrent second free fails cleanly) and returns its size. */
static int take(struct wf_device *dev, struct wf__device_ranges *rs, const void *ptr,
                size_t *ret_size)
{
	pthread_mutex_lock(&dev->lock);
	int ret = wf__device_ranges_remove(rs, (uintptr_t)ptr, ret_size);
	pthread_mutex_unlock(&dev->lock);
	return ret;
}

int wf_device_mem_free(struct wf_device *dev, void *ptr, struct wf_diag *diag)
{
	size_t size;

	if (!dev)
		return WF_EINVAL;
	if (!ptr)
		return 0;
	if (take(dev, &dev->mem, ptr, &size) < 0)
		return wf_diag_set(diag, WF_EINVAL,
		                   "device free: %p is not a device allocation of %s", ptr,
		                   dev->name);
	return dev->ops->mem_free(dev->impl, ptr, size, diag);
}

int wf_device_pinned_alloc(struct wf_device *dev, size_t size, unsigned flags, void **ret_ptr,
                           struct wf_diag *diag)
{
	void *p;
	int ret;

	if (!dev || !ret_ptr || size == 0 || (flags & ~WF_DEVICE_PINNED_WRITE_COMBINED))
		return wf_diag_set(diag, WF_EINVAL,
		                   "pinned alloc: bad argument (size %zu, flags %#x)", size, flags);
	ret = dev->ops->pinned_alloc(dev->impl, size, flags, &p, diag);
	if (ret < 0)
		return ret;
	pthread_mutex_lock(&dev->lock);
	ret = wf__device_ranges_add(&dev->pinned, (uintptr_t)p, size);
	pthread_mutex_unlock(&dev->lock);
	if (ret < 0) {
		dev->ops->pinned_free(dev->impl, p, size, NULL);
		return wf_diag_set(diag, ret == WF_EOVERLAP ? WF_EINTERNAL : ret,
		                   "pinned alloc: cannot record %p+%zu", p, size);
	}
	*ret_ptr = p;
	return 0;
}

int wf_device_pinned_free(struct wf_device *dev, void *ptr, struct wf_diag *diag)
{
	size_t size;

	if (!dev)
		return WF_EINVAL;
	if (!ptr)
		return 0;
	if (take(dev, &dev->pinned, ptr, &size) < 0)
		return wf_diag_set(diag, WF_EINVAL, "pinned free: %p is not a pinned buffer of %s",
		                   ptr, dev->name);
	return dev->ops->pinned_free(dev->impl, ptr, size, diag);
}

int wf_device_host_register(struct wf_device *dev, const void *ptr, size_t size, unsigned flags,
                            unsigned *ret_flags, struct wf_diag *diag)
{
	uintptr_t p = (uintptr_t)ptr;
	unsigned applied = 0;
	int ret;

	if (!dev || !ptr || size == 0 || (flags & ~WF_DEVICE_REGISTER_READONLY))
		return wf_diag_set(diag, WF_EINVAL,
		                   "host register: bad argument (size %zu, flags %#x)", size,
		                   flags);
	/* The range is reserved before the backend call, so two racing registrations of the same
	 * bytes cannot both reach the driver. */
	pthread_mutex_lock(&dev->lock);
	if (wf__device_ranges_touches(&dev->mem, p, size))
		ret = wf_diag_set(diag, WF_EINVAL, "host register: %p+%zu is device memory", ptr,
		                  size);
	else if (wf__device_ranges_touches(&dev->pinned, p, size))
		ret = wf_diag_set(diag, WF_EOVERLAP,
		                  "host register: %p+%zu overlaps a pinned buffer", ptr, size);
	else if ((ret = wf__device_ranges_add(&dev->reg, p, size)) == WF_EOVERLAP)
		wf_diag_set(diag, ret, "host register: %p+%zu overlaps a registration", ptr, size);
	pthread_mutex_unlock(&dev->lock);
	if (ret < 0)
		return ret;
	ret = dev->ops->host_register(dev->impl, ptr, size, flags, &applied, diag);
	if (ret < 0) {
		take(dev, &dev->reg, ptr, NULL);
		return ret;
	}
	if (ret_flags)
		*ret_flags = applied;
	return 0;
}

int wf_device_host_unregister(struct wf_device *dev, const void *ptr, struct wf_diag *diag)
{
	size_t size;

	if (!dev || !ptr)
		return WF_EINVAL;
	if (take(dev, &dev->reg, ptr, &size) < 0)
		return wf_diag_set(diag, WF_EINVAL, "host unregister: %p is not registered with %s",
		                   ptr, dev->name);
	return dev->ops->host_unregister(dev->impl, ptr, size, diag);
}

/* ---- Streams --------------------------------------------------------------------------------- */

int wf_device_stream_create(struct wf_device *dev, struct wf_device_stream **ret_stream,
                            struct wf_diag *diag)
{
	struct wf_device_stream *s;
	int ret;

	if (!dev || !ret_stream)
		return WF_EINVAL;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	ret = dev->ops->stream_create(dev->impl, &s->impl, diag);
	if (ret < 0) {
		free(s);
		return ret;
	}
	s->dev = dev;
	pthread_mutex_lock(&dev->lock);
	LIST_PUSH(dev->streams, s);
	pthread_mutex_unlock(&dev->lock);
	*ret_stream = s;
	return 0;
}

void wf_device_stream_destroy(struct wf_device_stream *s)
{
	if (!s)
		return;
	struct wf_device *dev = s->dev;
	pthread_mutex_lock(&dev->lock);
	LIST_UNLINK(dev->streams, s);
	pthread_mutex_unlock(&dev->lock);
	dev->ops->stream_destroy(dev->impl, s->impl);
	free(s);
}

int wf_device_stream_synchronize(struct wf_device_stream *s, struct wf_diag *diag)
{
	if (!s)
		return WF_EINVAL;
	return s->dev->ops->stream_synchronize(s->dev->impl, s->impl, diag);
}

struct wf_device *wf_device_stream_device(const struct wf_device_stream *s)
{
	return s ? s->dev : NULL;
}

static const char *copy_name(enum wf_device_copy kind)
{
	switch (kind) {
	case WF_DEVICE_COPY_H2D:
		return "H2D";
	case WF_DEVICE_COPY_D2H:
		return "D2H";
	case WF_DEVICE_COPY_D2D:
		return "D2D";
	default:
		return "?";
	}
}

/* The device side must lie inside one live allocation; the host side outside all of them. */
static int check_copy(struct wf_device *dev, void *dst, const void *src, size_t size,
                      enum wf_device_copy kind, struct wf_diag *diag)
{
	uintptr_t d = (uintptr_t)dst, s = (uintptr_t)src;
	const char *bad = NULL;

	pthread_mutex_lock(&dev->lock);
	switch (kind) {
	case WF_DEVICE_COPY_H2D:
		if (!wf__device_ranges_contains(&dev->mem, d, size))
			bad = "destination is not inside one device allocation";
		else if (wf__device_ranges_touches(&dev->mem, s, size))
			bad = "source is device memory";
		break;
	case WF_DEVICE_COPY_D2H:
		if (!wf__device_ranges_contains(&dev->mem, s, size))
			bad = "source is not inside one device allocation";
		else if (wf__device_ranges_touches(&dev->mem, d, size))
			bad = "destination is device memory";
		break;
	case WF_DEVICE_COPY_D2D:
		if (!wf__device_ranges_contains(&dev->mem, d, size))
			bad = "destination is not inside one device allocation";
		else if (!wf__device_ranges_contains(&dev->mem, s, size))
			bad = "source is not inside one device allocation";
		break;
	default:
		bad = "unknown copy kind";
	}
	pthread_mutex_unlock(&dev->lock);
	if (bad)
		return wf_diag_set(diag, WF_EINVAL, "%s copy %p <- %p (%zu bytes): %s",
		                   copy_name(kind), dst, src, size, bad);
	return 0;
}

int wf_device_memcpy_async(struct wf_device_stream *s, void *dst, const void *src, size_t size,
                           enum wf_device_copy kind, struct wf_diag *diag)
{
	int ret;

	if (!s || !dst || !src || (unsigned)kind >= WF_DEVICE_COPY_MAX)
		return wf_diag_set(diag, WF_EINVAL, "memcpy_async: bad argument");
	if (size == 0)
		return 0;
	ret = check_copy(s->dev, dst, src, size, kind, diag);
	if (ret < 0)
		return ret;
	return s->dev->ops->memcpy_async(s->dev->impl, s->impl, dst, src, size, kind, diag);
}

int wf_device_memset_async(struct wf_device_stream *s, void *dst, int value, size_t size,
                           struct wf_diag *diag)
{
	int inside;

	if (!s || !dst)
		return wf_diag_set(diag, WF_EINVAL, "memset_async: bad argument");
	if (size == 0)
		return 0;
	pthread_mutex_lock(&s->dev->lock);
	inside = wf__device_ranges_contains(&s->dev->mem, (uintptr_t)dst, size);
	pthread_mutex_unlock(&s->dev->lock);
	if (!inside)
		return wf_diag_set(diag, WF_EINVAL,
		                   "memset_async %p (%zu bytes): not inside one device allocation",
		                   dst, size);
	return s->dev->ops->memset_async(s->dev->impl, s->impl, dst, value, size, diag);
}

/* ---- Host work and kernels ------------------------------------------------------------------- */

int wf_device_host_fn_async(struct wf_device_stream *s, wf_device_host_fn fn, void *arg,
                            struct wf_diag *diag)
{
	if (!s || !fn)
		return wf_diag_set(diag, WF_EINVAL, "host_fn_async: %s",
		                   !s ? "no stream" : "no function");
	return s->dev->ops->host_fn_async(s->dev->impl, s->impl, fn, arg, diag);
}

void *wf_device_stream_native(const struct wf_device_stream *s)
{
	return s ? s->dev->ops->stream_native(s->dev->impl, s->impl) : NULL;
}

/* ---- Events ---------------------------------------------------------------------------------- */

int wf_device_event_create(struct wf_device *dev, unsigned flags,
                           struct wf_device_event **ret_event, struct wf_diag *diag)
{
	struct wf_device_event *e;
	int ret;

	if (!dev || !ret_event ||
	    (flags & ~(WF_DEVICE_EVENT_TIMING | WF_DEVICE_EVENT_BLOCKING_SYNC)))
		return wf_diag_set(diag, WF_EINVAL, "event create: bad argument (flags %#x)",
		                   flags);
	e = calloc(1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	ret = dev->ops->event_create(dev->impl, flags, &e->impl, diag);
	if (ret < 0) {
		free(e);
		return ret;
	}
	e->dev = dev;
	e->flags = flags;
	pthread_mutex_lock(&dev->lock);
	LIST_PUSH(dev->events, e);
	pthread_mutex_unlock(&dev->lock);
	*ret_event = e;
	return 0;
}

void wf_device_event_destroy(struct wf_device_event *e)
{
	if (!e)
		return;
	struct wf_device *dev = e->dev;
	pthread_mutex_lock(&dev->lock);
	LIST_UNLINK(dev->events, e);
	pthread_mutex_unlock(&dev->lock);
	dev->ops->event_destroy(dev->impl, e->impl);
	free(e);
}

int wf_device_event_record(struct wf_device_event *e, struct wf_device_stream *s,
                           struct wf_diag *diag)
{
	if (!e || !s || e->dev != s->dev)
		return wf_diag_set(diag, WF_EINVAL, "event record: bad argument");
	return e->dev->ops->event_record(e->dev->impl, e->impl, s->impl, diag);
}

int wf_device_event_query(struct wf_device_event *e, struct wf_diag *diag)
{
	if (!e)
		return WF_EINVAL;
	return e->dev->ops->event_query(e->dev->impl, e->impl, diag);
}

int wf_device_event_synchronize(struct wf_device_event *e, struct wf_diag *diag)
{
	if (!e)
		return WF_EINVAL;
	return e->dev->ops->event_synchronize(e->dev->impl, e->impl, diag);
}

int wf_device_event_elapsed_ms(struct wf_device_event *start, struct wf_device_event *end,
                               double *ret_ms, struct wf_diag *diag)
{
	double ms;
	int ret;

	if (!start || !end || !ret_ms || start->dev != end->dev)
		return wf_diag_set(diag, WF_EINVAL, "event elapsed: bad argument");
	if (!(start->flags & end->flags & WF_DEVICE_EVENT_TIMING))
		return wf_diag_set(diag, WF_EINVAL,
		                   "event elapsed: both events need WF_DEVICE_EVENT_TIMING");
	ret =
	    start->dev->ops->event_elapsed_ms(start->dev->impl, start->impl, end->impl, &ms, diag);
	if (ret < 0)
		return ret;
	*ret_ms = ms;
	return 0;
}

int wf_device_stream_wait_event(struct wf_device_stream *s, struct wf_device_event *e,
                                struct wf_diag *diag)
{
	if (!s || !e || e->dev != s->dev)
		return wf_diag_set(diag, WF_EINVAL, "stream wait event: bad argument");
	return s->dev->ops->stream_wait_event(s->dev->impl, s->impl, e->impl, diag);
}

/* ---- Verification ---------------------------------------------------------------------------- */

int wf_device_checksum(struct wf_device_stream *s, const void *ptr, size_t size, uint64_t *ret_sum,
                       struct wf_diag *diag)
{
	uint64_t sum;
	int inside, ret;

	if (!s || !ptr || !ret_sum)
		return wf_diag_set(diag, WF_EINVAL, "checksum: bad argument");
	pthread_mutex_lock(&s->dev->lock);
	inside = wf__device_ranges_contains(&s->dev->mem, (uintptr_t)ptr, size);
	pthread_mutex_unlock(&s->dev->lock);
	if (!inside)
		return wf_diag_set(diag, WF_EINVAL,
		                   "checksum %p (%zu bytes): not inside one device allocation", ptr,
		                   size);
	if (size == 0) {
		*ret_sum = wf_device_checksum_final(0, 0);
		return 0;
	}
	ret = s->dev->ops->checksum(s->dev->impl, s->impl, ptr, size, &sum, diag);
	if (ret < 0)
		return ret;
	*ret_sum = sum;
	return 0;
}
