/* Shared between the files of libwfdevice; not installed, not for other modules. */
#ifndef WF_DEVICE_INTERNAL_H
#define WF_DEVICE_INTERNAL_H

#include "device/device.h"

#include <stddef.h>
#include <stdint.h>

/* Parses "123", "1.5G", "8Gi" (K M G T: powers of 1000; Ki Mi Gi Ti: powers of 1024) into
 * bytes. The whole string must be consumed. WF_EINVAL, or WF_EOVERFLOW past 2^62. */
int wf__device_parse_size(const char *s, uint64_t *ret_bytes);

/* Resolves a spec to a backend and its argument string. Writes the args (a suffix of spec, or a
 * literal) to *ret_args and a sentence for wf_device_selection() to sel. */
int wf__device_registry_resolve(const char *spec, const struct wf_device_ops **ret_ops,
                                const char **ret_args, char *sel, size_t sel_len,
                                struct wf_diag *diag);

#endif
