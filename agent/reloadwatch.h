/* Reloads without an RPC (agent/reload.h does the work): the agent's opt-in watch of its models'
 * files, and a control directory for scripts that cannot speak nng. One thread, one inotify
 * descriptor.
 *
 *  watch        (wf-agent --watch, "watch": true) inotify on the directories of the registered
 *               models' files (IN_CLOSE_WRITE, IN_MOVED_TO, IN_ATTRIB): a model whose file was
 *               written, replaced or touched is reloaded once its files have been quiet for
 *               debounce_ms (a writer that takes several writes, or a tool that writes a
 *               temporary file and renames it, makes one reload). Models without a floor in
 *               host memory are skipped (nothing to reload). The directories are re-read from
 *               the registry every second, so new registrations are watched too.
 *  control dir  (wf-agent --reload-dir DIR, "reload_dir"): a script writes a file NAME.request
 *               holding "SEQ MODEL" or "SEQ MODEL dry-run" (SEQ a decimal it chooses, MODEL as
 *               registered; written whole, e.g. to a temporary name then renamed), and the agent
 *               reloads MODEL and writes NAME.status (temporary file then rename: a reader never
 *               sees half of one) with one JSON object: {"seq", "model", "result" (published,
 *               unchanged, dry_run, refused, failed), "generation", "files_changed",
 *               "tensors_reloaded", "tensors_unchanged", "tensors_refused", "reloaded": [names],
 *               "refused": [{"name", "reason"}], "error", "seconds"}. The script waits until the
 *               status file's seq is its own (ik_llama.cpp's signal mode, with a sequence number
 *               instead of a race). Requests already present when the agent starts are served.
 *               A malformed request gets a status with result "failed" and the reason (seq 0 if
 *               it had none). The directory is created (0700) if missing; its mode decides who may
 *               ask for reloads.
 * Every reload, whatever started it, is the same wf_floors_reload(): serialized, all or nothing,
 * announced by a RELOADED event and counted in /metrics. */
#ifndef WF_AGENT_RELOADWATCH_H
#define WF_AGENT_RELOADWATCH_H

#include "agent/floors.h"
#include "base/diag.h"

#include <stdbool.h>
#include <stdint.h>

struct wf_reload_watch_opts {
	struct wf_floors *floors;
	const char *control_dir; /* NULL: none */
	bool watch_files;
	uint32_t debounce_ms; /* 0: 500 */
};

struct wf_reload_watch;

/* Starts the thread (nothing to do, neither set: *ret NULL and 0). Errors: the control directory
 * cannot be made or is not a directory, inotify unavailable (-errno), with diag saying which. */
int wf_reload_watch_start(const struct wf_reload_watch_opts *o, struct wf_reload_watch **ret,
                          struct wf_diag *diag);
/* Stops and joins the thread (a reload in progress finishes first); accepts NULL. */
void wf_reload_watch_stop(struct wf_reload_watch *w);

#endif
