/* The agent's protocol service: turns Requests into floor-manager (and worker-registry) calls
 * and fills Replies. It is the control server's handler; it holds no state of its own beyond
 * what status reports. */
#ifndef WF_AGENT_SERVICE_H
#define WF_AGENT_SERVICE_H

#include "agent/floors.h"
#include "control/server.h"

struct wf_agent_service {
	struct wf_floors *floors;
	const struct wf_agent_config *cfg;
	int64_t started_unix_ms;
	int64_t started_mono_ns;
	uint32_t (*worker_count)(void *ctx); /* optional, until workers register */
	void *worker_ctx;
	/* Requests the agent does not serve itself (the worker slice) go here when set. */
	wf_ctl_handle_fn worker_handle;
	void *worker_handle_ctx;
};

/* wf_ctl_handle_fn for struct wf_agent_service *ctx. */
int wf_agent_service_handle(void *ctx, const Weightfloor__V1__Request *req,
                            Weightfloor__V1__Reply *reply, struct wf_ctl_call *call);

#endif
