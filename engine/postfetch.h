/* Expert post-fetch settings (docs/ARCHITECTURE.md, "Engine and expert post-fetch").
 *
 * Right after routing, the engine copies each selected host-side expert's down projection (D)
 * from the floor into a device scratchpad on a private stream, one event per expert, while gate
 * and up (G, U) compute on the CPU from the floor; before each D it waits on that expert's event
 * (block_on_miss) or, when the copy is not done, computes that D on the CPU from the floor. The
 * result never depends on which: the bytes are the same and so are the kernels (host device) or
 * the tolerance (CUDA).
 *
 * Every setting comes from a flag, a config key or an environment variable of the same name:
 *   WF_POSTFETCH_ENABLE            0|1   post-fetch at all (default 1 when the engine has a device)
 *   WF_POSTFETCH_FORCE_CPU         0|1   never fetch: every expert on the CPU (default 0)
 *   WF_POSTFETCH_BLOCK_ON_MISS     0|1   wait for a copy rather than fall back (default 1)
 *   WF_POSTFETCH_MAX_TRANSFERS     N     experts fetched per layer and step, 0 = no limit (<= 4096)
 *   WF_POSTFETCH_SCRATCHPAD_MB     N     scratchpad MiB, 0 = sized for the largest layer's active
 *                                        experts at the engine's largest batch (<= 1048576)
 *   WF_POSTFETCH_DEDICATED_STREAMS 0|1   one copy stream per layer parity rather than one (default
 * 0) WF_POSTFETCH_DEBUG             0|1   per-layer fetch lines through the engine's log hook A
 * value that is not one of these is refused with a message naming the variable. */
#ifndef WF_ENGINE_POSTFETCH_H
#define WF_ENGINE_POSTFETCH_H

#include "base/diag.h"

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define WF_POSTFETCH_MAX_TRANSFERS_MAX 4096u
#define WF_POSTFETCH_SCRATCHPAD_MB_MAX (1u << 20)

struct wf_postfetch_settings {
	bool enable;
	bool force_cpu;
	bool block_on_miss;
	uint32_t max_transfers;
	uint32_t scratchpad_mb;
	bool dedicated_streams;
	bool debug;
};

/* The defaults above. */
void wf_postfetch_settings_default(struct wf_postfetch_settings *ret_settings);

/* Sets one setting by its name, with or without the WF_POSTFETCH_ prefix and in any case
 * ("BLOCK_ON_MISS", "block_on_miss", "WF_POSTFETCH_BLOCK_ON_MISS"; a flag's --block-on-miss
 * spelling with '-' too). Booleans take 0/1/true/false/yes/no/on/off. Returns 0, WF_ENOT_FOUND
 * for an unknown name, or WF_EINVAL for a bad value; diag names the setting and the value. */
int wf_postfetch_settings_set(struct wf_postfetch_settings *s, const char *name, const char *value,
                              struct wf_diag *diag);

/* Applies every WF_POSTFETCH_* variable of the environment over s (a variable with that prefix
 * that names no setting is refused too, so a typo is not silently ignored). Not thread-safe
 * with respect to setenv. */
int wf_postfetch_settings_from_env(struct wf_postfetch_settings *s, struct wf_diag *diag);

#ifdef __cplusplus
}
#endif
#endif
