/* The backends by device kind (backend.h). */
#include "kernels/backend.h"

#include "base/error.h"

#include <pthread.h>
#include <string.h>

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static const struct wf_backend_ops *by_kind[WF_DEVICE_KIND_MAX];

int wf_backend_register(enum wf_device_kind kind, const struct wf_backend_ops *ops)
{
	if ((unsigned)kind >= WF_DEVICE_KIND_MAX || !ops || !ops->name ||
	    ops->version != WF_BACKEND_OPS_VERSION)
		return WF_EINVAL;
	if (kind == WF_DEVICE_KIND_HOST)
		return ops == wf_backend_host() ? 0 : WF_EDUPLICATE;
	int rc = 0;
	pthread_mutex_lock(&mu);
	if (!by_kind[kind])
		by_kind[kind] = ops;
	else if (by_kind[kind] != ops)
		rc = WF_EDUPLICATE;
	pthread_mutex_unlock(&mu);
	return rc;
}

const struct wf_backend_ops *wf_backend_for_kind(enum wf_device_kind kind)
{
	if ((unsigned)kind >= WF_DEVICE_KIND_MAX)
		return NULL;
	if (kind == WF_DEVICE_KIND_HOST)
		return wf_backend_host();
	pthread_mutex_lock(&mu);
	const struct wf_backend_ops *ops = by_kind[kind];
	pthread_mutex_unlock(&mu);
	return ops;
}

const struct wf_backend_ops *wf_backend_for(const struct wf_device *dev)
{
	return dev ? wf_backend_for_kind(wf_device_kind(dev)) : wf_backend_host();
}
