/* Harness for the wf-agent integration tests: a private directory per test, real wf-agent
 * processes on ipc:// sockets inside it, a control client, agentctl runs, and a cleanup that
 * always kills what was started.
 *
 * Layout of a test directory (wft_tmpdir):
 *   floor/            the agent's --floor-dir
 *   models/           model files made with wf-gen
 *   run/agent.sock    --socket ipc://...
 *   run/events.sock   --events ipc://...
 *   agent-N.log       stdout and stderr of the N-th agent started in the test
 *
 * Every agent is started through agent_helper (PR_SET_PDEATHSIG), so a test process that crashes
 * or is killed by Criterion's timeout takes its agents with it; agt_fini() (the suites' .fini)
 * stops them with SIGTERM, then SIGKILL, and removes the directory. Only the test process uses
 * nng: children that need the control library are agent_helper processes (nng does not work in
 * a fork()ed child, and Criterion's test processes already run nng). */
#ifndef WF_TESTS_AGENT_AGT_H
#define WF_TESTS_AGENT_AGT_H

#include "control/client.h"

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

struct agt {
	char *dir, *floor, *models, *run;
	char *sock_url, *ev_url, *sock_path, *ev_path;
	char *log; /* log of the last agent started */
	pid_t pid; /* the running agent, 0 when none */
	int n_started;
	struct wf_ctl_client *cli; /* connected to the running agent */
	char *mounted;             /* a mount point to detach at cleanup */
};

struct agt_opts {
	bool drop; /* run the agent as uid:gid */
	uid_t uid;
	gid_t gid;
	const char *env[4]; /* "NAME=VALUE" added to the agent's environment */
	bool no_defaults;   /* do not pass --floor-dir/--socket/--events */
};

/* Creates the directory tree. The struct is registered for agt_fini(). */
struct agt *agt_new(const char *tag);
/* Criterion .fini: stops every agent, closes clients, unmounts, removes directories. */
void agt_fini(void);
/* Also kill this pid at cleanup (a daemonized agent is not our child). */
void agt_track_pid(pid_t pid);

/* <dir>/models/<name>.gguf made by wf-gen (qwen3moe, the seed, size NULL: the default ~6.5 MB).
 * Returns the path (malloc'ed). */
char *agt_gen(struct agt *a, const char *name, int seed, const char *size);

/* Starts wf-agent with the default endpoints plus args (NULL-terminated), waits until it answers
 * an AgentStatus (asserting, with the agent's log, if it exits or does not answer in 20 s), and
 * leaves a->cli connected. Returns the agent's pid. */
pid_t agt_start(struct agt *a, const struct agt_opts *o, const char *const *args);
/* Starts without waiting. */
pid_t agt_spawn(struct agt *a, const struct agt_opts *o, const char *const *args);
/* Waits for readiness as above; false (no assert) if the agent exited or timeout passed. */
bool agt_wait_ready(struct agt *a, int timeout_ms);
/* SIGTERM, waits up to timeout_ms, then SIGKILL. Returns the exit status (0..255), 128+signal
 * when killed by a signal, or -1 when it had to be SIGKILLed after the timeout. */
int agt_stop(struct agt *a, int timeout_ms);
/* The current agent's log (malloc'ed, "" if none). */
char *agt_log(struct agt *a);

/* A wf-worker started by agt_spawn_worker(). */
struct agt_worker {
	pid_t pid;
	char url[512]; /* its --endpoint, ipc://<run>/<id>.sock */
	char log[512]; /* its stdout and stderr, <dir>/worker-<id>-<n>.log */
};

/* Starts wf-worker (through agent_helper, so it dies with the test) as worker `id` of agent a
 * (agent_url NULL: a->sock_url) on device (NULL: "host:mem=256Mi"), with extra args
 * (NULL-terminated). Does not wait for it; tracked for cleanup. */
void agt_spawn_worker(struct agt *a, struct agt_worker *w, const char *id, const char *agent_url,
                      const char *device, const char *const *extra);
/* The worker's log (malloc'ed, "" if none). */
char *agt_worker_log(const struct agt_worker *w);
/* One request to url (a worker's endpoint, or any server) with a client of its own. Returns the
 * call's rc; on 0 *ret_reply is the caller's (wf_ctl_reply_free). */
int agt_call_url(const char *url, Weightfloor__V1__Request *req, int timeout_ms,
                 Weightfloor__V1__Reply **ret_reply, struct wf_diag *diag);
/* WorkerStatus to url (timeout_ms); *ret_rc is the call's rc, the reply (or NULL) the caller's. */
Weightfloor__V1__Reply *agt_worker_status(const char *url, int timeout_ms, int *ret_rc);
/* Waits until the worker answers WorkerStatus OK; asserts, with its log, within 20 s or when it
 * exits first. */
void agt_wait_worker_ready(struct agt_worker *w);
/* Waits (20 s at most) until the agent lists worker w under id (`agentctl workers --json`):
 * a request relayed through the agent before that finds no worker. Fails the test with the
 * worker's log if it exits or never registers. */
void agt_wait_worker_registered(struct agt *a, struct agt_worker *w, const char *id);

/* One request to the running agent; asserts that a reply came. */
Weightfloor__V1__Reply *agt_call(struct agt *a, Weightfloor__V1__Request *req, int timeout_ms);
Weightfloor__V1__Reply *agt_register(struct agt *a, const char *name, const char *path, bool pin);
Weightfloor__V1__Reply *agt_register_paths(struct agt *a, const char *name, char **paths, size_t n);
Weightfloor__V1__Reply *agt_ensure(struct agt *a, const char *name, bool wait);
Weightfloor__V1__Reply *agt_model(struct agt *a, const char *name);
Weightfloor__V1__Reply *agt_release(struct agt *a, const char *name);
Weightfloor__V1__Reply *agt_pin(struct agt *a, const char *name, bool pin);
Weightfloor__V1__Reply *agt_list(struct agt *a);
Weightfloor__V1__Reply *agt_status(struct agt *a);
/* Polls ModelStatus until the model is not MATERIALIZING (asserting within timeout_ms). */
Weightfloor__V1__Reply *agt_wait_settled(struct agt *a, const char *name, int timeout_ms);
/* The model's floor state from a reply with ModelInfo (asserts it has one). */
Weightfloor__V1__FloorState agt_state(const Weightfloor__V1__Reply *r);
const char *agt_state_name(Weightfloor__V1__FloorState s);

/* Runs agentctl --socket S --events E ARGS... (NULL-terminated) with stdout and stderr captured
 * (malloc'ed into *out and *err when not NULL). Returns its exit status. */
int agt_ctl(struct agt *a, char **out, char **err, const char *const *args);

/* PublishTensors of one tensor of model (data NULL: a dry run with the size alone); the reply. */
Weightfloor__V1__Reply *agt_publish(struct agt *a, const char *model, const char *tensor,
                                    const uint8_t *data, uint64_t size, bool dry);
/* The greedy ids (comma-separated) `wf-worker eval` computes on a model file for prompt (ids
 * "1,17,300") and n_gen tokens: its last output line. Asserts that it ran. */
char *agt_eval_ids(struct agt *a, const char *model, const char *prompt, const char *n_gen);
/* The ids of a greedy completion of prompt (n_gen tokens, past EOS) of model through the agent,
 * on worker (NULL: the agent's pick), or NULL when agentctl failed (a worker not answering). */
char *agt_generate_ids(struct agt *a, const char *model, const char *worker, const char *prompt,
                       const char *n_gen);

/* Starts a program (argv[0] a path) with stdin from /dev/null and stdout and stderr into out
 * (truncated), in this environment; asserts that it started. Returns its pid: the caller waits. */
pid_t agt_spawn_to(char *const *argv, const char *out);

/* Runs a program (argv[0] a path) with captured output; like wft_run. */
int agt_run(char *const *argv, char **out, char **err, int timeout_s, const char *dir);

/* <floor>/wf-<hex>[suffix] (malloc'ed). */
char *agt_region_path(struct agt *a, const char *hex, const char *suffix);
/* Inode of a path, 0 when it does not exist. */
uint64_t agt_inode(const char *path);
/* Number of directory entries other than . and ..; names listed into buf. */
int agt_dir_count(const char *dir, char *buf, size_t len);

/* Opens a subscriber to the agent's events and makes sure it receives: registers ping_name
 * (ping_path) repeatedly until its "registered" event arrives. */
struct wf_ctl_sub *agt_sub_synced(struct agt *a, const char *ping_name, const char *ping_path);
/* True once /proc/net/unix shows a connected peer on the events socket besides ours. */
int agt_event_peers(struct agt *a);

/* Substring count. */
int agt_count(const char *hay, const char *needle);
void agt_sleep_ms(int ms);

/* ---- assertions shared by the agent suites ---- */
#define AGT_ST(x) WEIGHTFLOOR__V1__STATUS__STATUS_##x
#define AGT_FS(x) WEIGHTFLOOR__V1__FLOOR_STATE__FLOOR_STATE_##x

/* Asserts the reply's status code, naming what and the reply's message on failure. */
void agt_expect_code(const Weightfloor__V1__Reply *r, Weightfloor__V1__Status want,
                     const char *what);
/* EnsureFloor with wait; asserts OK and HOST or PINNED_HOST. */
void agt_ensure_ok(struct agt *a, const char *name);
/* The model's digest (malloc'ed); asserts the model exists. */
char *agt_digest_of(struct agt *a, const char *name);
/* Attaches the model's floor read-only as a worker would (in this process). With ret_rc NULL it
 * asserts success; else *ret_rc is the attach's code and NULL is returned on failure. */
struct wf_shm_region *agt_attach_reader(struct agt *a, const char *hex, int *ret_rc);
/* A child process (fork, shm only: no nng) that attaches the floor as a reader and holds it
 * until killed. Returns its pid once it holds the floor (asserts). Tracked for cleanup. */
pid_t agt_hold_floor(struct agt *a, const char *hex);
int64_t agt_now_ms(void);
/* vasprintf that asserts; the result is the caller's. */
char *agt_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
