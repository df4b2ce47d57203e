/* The agent's persistent intent: the models registered through the API and the host pins, so that
 * a restarted agent serves (and keeps the floors of) what it served before.
 *
 * The file is JSON, written atomically (a temporary file beside it, fsync, rename, fsync of the
 * directory), so a crash leaves the old state or the new one, never a mix:
 *   {"version": 1, "models": [{"name": "qwen", "path": "/models/q.gguf", "api": true,
 *                              "pin_host": true}, ...]}
 * "api" marks a model registered through RegisterModel (restored by registering it again);
 * entries with "api": false record only the pin of a model that the configuration registers.
 *
 * Not thread-safe by itself: the floor manager serializes its calls. */
#ifndef WF_AGENT_STATE_H
#define WF_AGENT_STATE_H

#include "base/diag.h"

#include <stdbool.h>
#include <stddef.h>

struct wf_agent_state_model {
	char *name;
	char *path;
	bool api;
	bool pin_host;
};

struct wf_agent_state {
	struct wf_agent_state_model *models;
	size_t n_models;
};

/* Reads path into *ret (zeroed first). A missing file is an empty state (0). A file that is not
 * a valid state fails with WF_EFORMAT and diag naming the file and the problem: the agent refuses
 * to start rather than forget registrations silently. Caps: 4096 models, 1 MiB file. */
int wf_agent_state_load(const char *path, struct wf_agent_state *ret, struct wf_diag *diag);

/* Serializes st to a malloc'ed JSON string (*ret_json). Pure: no I/O, for use under a lock. */
int wf_agent_state_format(const struct wf_agent_state *st, char **ret_json);

/* Writes json to path atomically (see above), creating the directory (0750) if needed. */
int wf_agent_state_write(const char *path, const char *json, struct wf_diag *diag);

void wf_agent_state_fini(struct wf_agent_state *st);

#endif
