/* The host device's engine ops (devops.h), implemented with the CPU kernels: see devops_host.c. */
#ifndef WF_ENGINE_DEVOPS_HOST_H
#define WF_ENGINE_DEVOPS_HOST_H

#include "engine/devops.h"

const struct wf_engine_dev_ops *wf__devops_host(void);

#endif
