/* Shared between the files of libwfdevice; not installed, not for other modules. */
#ifndef WF_DEVICE_INTERNAL_H
#define WF_DEVICE_INTERNAL_H

#include "device/device.h"

#include <stddef.h>
#include <stdint.h>

/* Resolves a spec to a backend and its argument string. Writes the args (a suffix of spec, or a
 * literal) to *ret_args and a sentence for wf_device_selection() to sel. */
int wf__device_registry_resolve(const char *spec, const struct wf_device_ops **ret_ops,
                                const char **ret_args, char *sel, size_t sel_len,
                                struct wf_diag *diag);

#endif
