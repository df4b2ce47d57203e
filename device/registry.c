/* Backend registry and spec resolution. The host backend is built in; others (CUDA) are
 * registered by the executable, see wf_device_backend_register() in device.h for why. */
#include "device/internal.h"

#include "base/error.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REGISTRY_MAX 8

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static const struct wf_device_ops *registry[REGISTRY_MAX];
static size_t registry_n;

int wf_device_backend_register(const struct wf_device_ops *ops)
{
	int ret = 0;

	if (!ops || !ops->name || !ops->name[0] || strchr(ops->name, ':'))
		return WF_EINVAL;
	if (strcmp(ops->name, "host") == 0 || strcmp(ops->name, "auto") == 0)
		return ops == wf_device_host_ops() ? 0 : WF_EDUPLICATE;
	pthread_mutex_lock(&registry_lock);
	for (size_t i = 0; i < registry_n; i++) {
		if (strcmp(registry[i]->name, ops->name) == 0) {
			ret = registry[i] == ops ? 0 : WF_EDUPLICATE;
			goto out;
		}
	}
	if (registry_n == REGISTRY_MAX) {
		ret = WF_ELIMIT;
		goto out;
	}
	registry[registry_n++] = ops;
out:
	pthread_mutex_unlock(&registry_lock);
	return ret;
}

static const struct wf_device_ops *lookup(const char *name, size_t len)
{
	const struct wf_device_ops *found = NULL;

	if (len == 4 && memcmp(name, "host", 4) == 0)
		return wf_device_host_ops();
	pthread_mutex_lock(&registry_lock);
	for (size_t i = 0; i < registry_n && !found; i++)
		if (strlen(registry[i]->name) == len && memcmp(registry[i]->name, name, len) == 0)
			found = registry[i];
	pthread_mutex_unlock(&registry_lock);
	return found;
}

/* "auto": the first registered backend that sees a device, else host. The registry is
 * append-only, so a snapshot of the pointers is safe to probe outside the lock (a probe may
 * take a while: it loads a driver). */
static int resolve_auto(const struct wf_device_ops **ret_ops, const char **ret_args, char *sel,
                        size_t sel_len)
{
	const struct wf_device_ops *snap[REGISTRY_MAX];
	size_t n;
	int len = snprintf(sel, sel_len, "auto:");

	pthread_mutex_lock(&registry_lock);
	n = registry_n;
	memcpy(snap, registry, n * sizeof(snap[0]));
	pthread_mutex_unlock(&registry_lock);

	for (size_t i = 0; i < n; i++) {
		int count = snap[i]->probe();
		if (count > 0) {
			snprintf(sel + len, sel_len - (size_t)len,
			         " %s probe found %d device(s); using %s:0", snap[i]->name, count,
			         snap[i]->name);
			*ret_ops = snap[i];
			*ret_args = "0";
			return 0;
		}
		len += snprintf(sel + len, sel_len - (size_t)len, " %s probe found no device;",
		                snap[i]->name);
		if ((size_t)len >= sel_len)
			len = (int)sel_len - 1;
	}
	snprintf(sel + len, sel_len - (size_t)len, "%s using host",
	         n ? "" : " no GPU backend registered (built without CUDA?);");
	*ret_ops = wf_device_host_ops();
	*ret_args = "";
	return 0;
}

int wf__device_registry_resolve(const char *spec, const struct wf_device_ops **ret_ops,
                                const char **ret_args, char *sel, size_t sel_len,
                                struct wf_diag *diag)
{
	if (!spec || !spec[0])
		return wf_diag_set(diag, WF_EINVAL, "empty device spec");
	if (strcmp(spec, "auto") == 0)
		return resolve_auto(ret_ops, ret_args, sel, sel_len);

	const char *colon = strchr(spec, ':');
	size_t name_len = colon ? (size_t)(colon - spec) : strlen(spec);
	const struct wf_device_ops *ops = lookup(spec, name_len);
	if (!ops)
		return wf_diag_set(diag, WF_ENOT_FOUND,
		                   "device spec '%s': backend '%.*s' is not registered%s", spec,
		                   (int)name_len, spec,
		                   name_len == 4 && memcmp(spec, "cuda", 4) == 0
		                       ? " (built without CUDA, or the executable did not "
		                         "register it)"
		                       : "");
	snprintf(sel, sel_len, "%s", spec);
	*ret_ops = ops;
	*ret_args = colon ? colon + 1 : "";
	return 0;
}
