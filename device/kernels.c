/* The kernel tables: one per device kind, registered by the modules that hold kernels (see
 * struct wf_device_kernel_table in device.h for why registration). Tables are statics that live
 * for the process, and a slot, once set, never changes, so a lookup hands out the pointer
 * without further locking by the caller. */
#include "device/device.h"

#include "base/error.h"

#include <pthread.h>
#include <stddef.h>

static pthread_mutex_t kernels_lock = PTHREAD_MUTEX_INITIALIZER;
static const struct wf_device_kernel_table *kernels[WF_DEVICE_KIND_MAX];

int wf_device_kernels_register(const struct wf_device_kernel_table *table)
{
	int ret = 0;

	if (!table || (unsigned)table->kind >= WF_DEVICE_KIND_MAX || !table->name ||
	    !table->name[0] || !table->ops)
		return WF_EINVAL;
	pthread_mutex_lock(&kernels_lock);
	if (!kernels[table->kind])
		kernels[table->kind] = table;
	else if (kernels[table->kind] != table)
		ret = WF_EDUPLICATE;
	pthread_mutex_unlock(&kernels_lock);
	return ret;
}

const struct wf_device_kernel_table *wf_device_kernels_for_kind(enum wf_device_kind kind)
{
	const struct wf_device_kernel_table *t;

	if ((unsigned)kind >= WF_DEVICE_KIND_MAX)
		return NULL;
	pthread_mutex_lock(&kernels_lock);
	t = kernels[kind];
	pthread_mutex_unlock(&kernels_lock);
	return t;
}

const struct wf_device_kernel_table *wf_device_kernels(const struct wf_device *dev)
{
	return dev ? wf_device_kernels_for_kind(wf_device_kind(dev)) : NULL;
}
