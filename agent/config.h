/* wf-agent configuration: a JSON file, then command-line overrides.
 *
 *   {
 *     "floor_dir": "/dev/shm/weightfloor",   tmpfs or hugetlbfs directory for regions
 *     "group": "weightfloor",                 group (name or number): reads floors, may connect
 *     "host_budget": "64G",                   bytes of floors the agent may hold at once
 *     "spare": "2%",                          spare area of each new floor, for published
 *                                             tensor versions: "N%" of the model's tensor bytes
 *                                             (at least 1 MiB), or a size ("256M"; 0: none)
 *     "model_roots": ["/models"],             every model path must resolve under one of these
 *     "socket": "ipc:///run/weightfloor/agent.sock",
 *     "events": "ipc:///run/weightfloor/events.sock",
 *     "allowed_uids": [1000], "allowed_gids": [1000],   ipc peers besides root and the agent's uid
 *     "max_message": "4M",
 *     "io": {"backend": "auto|uring|pread", "queue_depth": 64, "chunk": "1M", "parallel_files": 4},
 *     "models": [ {"name": "qwen", "path": "/models/q.gguf", "pin_host": true, "preload": true} ],
 *     "state_file": "/var/lib/weightfloor/agent-state.json"   API registrations and pins; "none"
 *                                             disables; default: beside an ipc:// socket
 *     "metrics": "127.0.0.1:9400"             HTTP /metrics, /healthz, /readyz (HOST omitted:
 *                                             127.0.0.1); default: off
 *     "reload_dir": "/run/weightfloor/reload", reload requests from files (agent/reloadwatch.h);
 *                                             absolute; default: off
 *     "watch": false                          reload a model when its files change (inotify)
 *   }
 *
 * Every key is optional; unknown keys are errors (a typo must not silently fall back to a
 * default). The struct owns all its strings; wf_agent_config_fini() frees them. */
#ifndef WF_AGENT_CONFIG_H
#define WF_AGENT_CONFIG_H

#include "base/diag.h"
#include "model/model.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define WF_AGENT_DEFAULT_FLOOR_DIR  "/dev/shm/weightfloor"
#define WF_AGENT_DEFAULT_SOCKET     "ipc:///run/weightfloor/agent.sock"
#define WF_AGENT_DEFAULT_EVENTS     "ipc:///run/weightfloor/events.sock"
#define WF_AGENT_DEFAULT_STATE_FILE "/var/lib/weightfloor/agent-state.json"
#define WF_AGENT_MAX_MODELS         4096
/* The spare area of a new floor (shm/layout.h: where published tensor versions go; it is
 * reserved in RAM with the floor and comes back only when the floor is rebuilt). By default a
 * share of the model, so that a floor can take a few rounds of changes to some of its tensors;
 * never less than WF_AGENT_SPARE_MIN, so that small models can publish too. */
#define WF_AGENT_SPARE_PERCENT_DEFAULT 2.0
#define WF_AGENT_SPARE_MIN             ((uint64_t)1 << 20)

struct wf_agent_model_cfg {
	char *name;
	char *path; /* a GGUF file or shard, a safetensors file, index.json or directory */
	bool pin_host;
	bool preload; /* materialize at start */
};

struct wf_agent_config {
	char *floor_dir;
	char *group;          /* NULL: the agent's own group */
	gid_t gid;            /* resolved from group; (gid_t)-1 when unset */
	uint64_t host_budget; /* 0: half of MemTotal, resolved at start */
	/* The spare area of new floors: spare_percent of the model's tensor bytes (at least
	 * WF_AGENT_SPARE_MIN) when > 0, else exactly spare_bytes. wf_agent_config_spare(). */
	double spare_percent;
	uint64_t spare_bytes;
	char **model_roots;
	size_t n_model_roots;
	char *socket_url;
	char *events_url;
	/* tls+tcp:// endpoints (PEM files): the agent's certificate and key, and the CA that signs
	 * the clients' certificates (mutual TLS: clients without one are refused). NULL: unset. */
	char *tls_cert;
	char *tls_key;
	char *tls_ca;
	uid_t *allowed_uids;
	size_t n_allowed_uids;
	gid_t *allowed_gids;
	size_t n_allowed_gids;
	uint64_t max_message;
	char *io_backend; /* "auto", "uring", "pread" */
	uint32_t io_queue_depth;
	uint64_t io_chunk;
	uint32_t io_parallel_files;
	struct wf_agent_model_cfg *models;
	size_t n_models;
	char *state_file; /* NULL: the default (wf_agent_config_state_path); "none": off */
	char *metrics;    /* HTTP endpoint "HOST:PORT" (http/server.h); NULL: none */
	char *log_format; /* "text" or "json"; NULL: text (--log-format wins) */
	char *
	    reload_dir; /* control directory of reload requests (agent/reloadwatch.h); NULL: none */
	bool watch;     /* reload models whose files change (agent/reloadwatch.h) */
};

/* Fills defaults (no file). */
int wf_agent_config_init(struct wf_agent_config *cfg);
/* Reads a JSON config file over the defaults already in cfg. On failure cfg keeps what it had
 * and diag names the key and the problem. */
int wf_agent_config_load(struct wf_agent_config *cfg, const char *path, struct wf_diag *diag);
/* Same, from a string (tests). */
int wf_agent_config_parse(struct wf_agent_config *cfg, const char *json, size_t len,
                          struct wf_diag *diag);
/* Resolves the group name to cfg->gid. */
int wf_agent_config_resolve(struct wf_agent_config *cfg, struct wf_diag *diag);
void wf_agent_config_fini(struct wf_agent_config *cfg);

/* Sets the spare area from "N%" (0 < N <= 100; fractions allowed) or a size ("64M", "0").
 * WF_EINVAL with diag naming the value otherwise; cfg unchanged then. */
int wf_agent_config_set_spare(struct wf_agent_config *cfg, const char *value, struct wf_diag *diag);

/* The spare bytes of a new floor for a model of model_bytes tensor bytes (see spare_percent).
 * Pure. */
uint64_t wf_agent_config_spare(const struct wf_agent_config *cfg, uint64_t model_bytes);

/* The state file to use (agent/state.h): state_file when set, none for "none" (*ret_path NULL),
 * else agent-state.json in the directory of an ipc:// control socket (so that agents with
 * private sockets have private state), else WF_AGENT_DEFAULT_STATE_FILE. 0 or -ENOMEM. */
int wf_agent_config_state_path(const struct wf_agent_config *cfg, char **ret_path);

/* Resolves path (realpath) and checks that it lies under one of the model roots. With no roots
 * configured every path is allowed. Returns 0 and a malloc'ed resolved path, WF_EPERMISSION if
 * outside the roots, or -errno if the path cannot be resolved. */
int wf_agent_config_check_path(const struct wf_agent_config *cfg, const char *path,
                               char **ret_resolved, struct wf_diag *diag);

/* Checks every file an opened model read against the model roots: each files[i].real_path (the
 * file the reader actually opened, so a shard sibling that is a symlink out of the roots is
 * caught) and each aux_paths[] (index.json, config.json). The materializer later reads only the
 * files with those dev/ino (shm/fill.c), so a symlink swapped after this check cannot escape
 * either. Returns 0 (always, with no roots configured) or WF_EPERMISSION naming the file. */
int wf_agent_config_check_model(const struct wf_agent_config *cfg, const struct wf_model *model,
                                struct wf_diag *diag);

#endif
