#include "tests/agent/agt.h"

#include "base/error.h"
#include "common/wftest.h"
#include "proto/status.h"
#include "shm/region.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#define MAX_AGT  8
#define MAX_PIDS 16

static struct agt *agts[MAX_AGT];
static size_t n_agts;
static pid_t extra_pids[MAX_PIDS];
static size_t n_extra;

void agt_sleep_ms(int ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

static int64_t mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

char *agt_printf(const char *fmt, ...)
{
	va_list ap;
	char *p = NULL;
	va_start(ap, fmt);
	int n = vasprintf(&p, fmt, ap);
	va_end(ap);
	cr_assert(n >= 0);
	return p;
}

struct agt *agt_new(const char *tag)
{
	cr_assert(n_agts < MAX_AGT);
	struct agt *a = calloc(1, sizeof(*a));
	cr_assert_not_null(a);
	a->dir = wft_tmpdir(tag);
	a->floor = agt_printf("%s/floor", a->dir);
	a->models = agt_printf("%s/models", a->dir);
	a->run = agt_printf("%s/run", a->dir);
	a->sock_path = agt_printf("%s/agent.sock", a->run);
	a->ev_path = agt_printf("%s/events.sock", a->run);
	a->sock_url = agt_printf("ipc://%s", a->sock_path);
	a->ev_url = agt_printf("ipc://%s", a->ev_path);
	cr_assert_eq(mkdir(a->models, 0755), 0);
	cr_assert_eq(mkdir(a->run, 0755), 0);
	agts[n_agts++] = a;
	return a;
}

void agt_track_pid(pid_t pid)
{
	if (pid > 0 && n_extra < MAX_PIDS)
		extra_pids[n_extra++] = pid;
}

static int wait_exit(pid_t pid, int timeout_ms, int *ret_status)
{
	int64_t end = mono_ms() + timeout_ms;
	for (;;) {
		int st;
		pid_t r = waitpid(pid, &st, WNOHANG);
		if (r == pid) {
			*ret_status = st;
			return 0;
		}
		if (r < 0)
			return -errno;
		if (mono_ms() >= end)
			return -ETIMEDOUT;
		agt_sleep_ms(10);
	}
}

static int status_code(int st)
{
	if (WIFEXITED(st))
		return WEXITSTATUS(st);
	if (WIFSIGNALED(st))
		return 128 + WTERMSIG(st);
	return -1;
}

int agt_stop(struct agt *a, int timeout_ms)
{
	if (a->cli) {
		wf_ctl_client_close(a->cli);
		a->cli = NULL;
	}
	if (a->pid <= 0)
		return -1;
	pid_t pid = a->pid;
	a->pid = 0;
	kill(pid, SIGTERM);
	int st = 0;
	if (wait_exit(pid, timeout_ms, &st) == 0)
		return status_code(st);
	kill(pid, SIGKILL);
	waitpid(pid, &st, 0);
	return -1;
}

void agt_fini(void)
{
	for (size_t i = 0; i < n_agts; i++) {
		struct agt *a = agts[i];
		agt_stop(a, 5000);
		if (a->mounted) {
			umount2(a->mounted, MNT_DETACH);
			free(a->mounted);
			a->mounted = NULL;
		}
		if (!getenv("WF_TEST_KEEP"))
			wft_rmtree(a->dir);
	}
	n_agts = 0;
	for (size_t i = 0; i < n_extra; i++) {
		pid_t p = extra_pids[i];
		if (kill(p, SIGTERM) != 0)
			continue;
		/* A child of ours (a spawned worker) stays a zombie, which kill(p, 0) still finds,
		 * until it is reaped: reap it, or this waits out the whole 5 s. */
		bool gone = false;
		for (int k = 0; k < 500 && !gone; k++) {
			gone = waitpid(p, NULL, WNOHANG) == p || kill(p, 0) != 0;
			if (!gone)
				agt_sleep_ms(10);
		}
		if (!gone) {
			kill(p, SIGKILL);
			waitpid(p, NULL, WNOHANG);
		}
	}
	n_extra = 0;
}

char *agt_gen(struct agt *a, const char *name, int seed, const char *size)
{
	char *path = agt_printf("%s/%s.gguf", a->models, name);
	char sseed[16];
	snprintf(sseed, sizeof sseed, "%d", seed);
	char *gen = wft_exe("tools/wf-gen");
	char *argv[10] = {gen, "--arch", "qwen3moe", "--seed", sseed, "-o", path};
	int n = 7;
	if (size) {
		argv[n++] = "--size";
		argv[n++] = (char *)size;
	}
	argv[n] = NULL;
	char *err = NULL;
	int rc = agt_run(argv, NULL, &err, 60, a->dir);
	cr_assert_eq(rc, 0, "wf-gen %s: exit %d: %s", path, rc, err ? err : "");
	free(err);
	chmod(path, 0644);
	return path;
}

/* ---- processes ------------------------------------------------------------------------------ */

static char **build_env(const struct agt_opts *o)
{
	size_t n = 0;
	while (environ[n])
		n++;
	char **env = calloc(n + 8, sizeof(*env));
	cr_assert_not_null(env);
	size_t k = 0;
	for (size_t i = 0; i < n; i++) {
		/* the tests set the fault-injection knobs themselves */
		if (strncmp(environ[i], "WF_AGENT_FAULT_", 15) == 0)
			continue;
		env[k++] = environ[i];
	}
	for (size_t i = 0; o && i < 4 && o->env[i]; i++)
		env[k++] = (char *)o->env[i];
	env[k] = NULL;
	return env;
}

pid_t agt_spawn(struct agt *a, const struct agt_opts *o, const char *const *args)
{
	cr_assert_eq(a->pid, 0, "an agent is already running");
	a->n_started++;
	free(a->log);
	a->log = agt_printf("%s/agent-%d.log", a->dir, a->n_started);

	char *argv[64];
	int n = 0;
	char suid[16], sgid[16];
	argv[n++] = wft_exe("tests/agent/agent_helper");
	if (o && o->drop) {
		snprintf(suid, sizeof suid, "%u", (unsigned)o->uid);
		snprintf(sgid, sizeof sgid, "%u", (unsigned)o->gid);
		argv[n++] = "--uid";
		argv[n++] = suid;
		argv[n++] = "--gid";
		argv[n++] = sgid;
	}
	argv[n++] = "--pdeathsig";
	argv[n++] = "exec";
	argv[n++] = wft_exe("agent/wf-agent");
	if (!(o && o->no_defaults)) {
		argv[n++] = "--floor-dir";
		argv[n++] = a->floor;
		argv[n++] = "--socket";
		argv[n++] = a->sock_url;
		argv[n++] = "--events";
		argv[n++] = a->ev_url;
	}
	for (size_t i = 0; args && args[i]; i++) {
		cr_assert(n < 62);
		argv[n++] = (char *)args[i];
	}
	argv[n] = NULL;

	posix_spawn_file_actions_t fa;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
	posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, a->log, O_WRONLY | O_CREAT | O_APPEND,
	                                 0644);
	posix_spawn_file_actions_adddup2(&fa, STDOUT_FILENO, STDERR_FILENO);
	char **env = build_env(o);
	pid_t pid;
	int rc = posix_spawn(&pid, argv[0], &fa, NULL, argv, env);
	posix_spawn_file_actions_destroy(&fa);
	free(env);
	cr_assert_eq(rc, 0, "spawn %s: %s", argv[0], strerror(rc));
	a->pid = pid;
	return pid;
}

char *agt_log(struct agt *a)
{
	char *s = a->log ? wft_read_file(a->log, NULL) : NULL;
	return s ? s : strdup("");
}

bool agt_wait_ready(struct agt *a, int timeout_ms)
{
	int64_t end = mono_ms() + timeout_ms;
	while (mono_ms() < end) {
		int st;
		if (a->pid > 0 && waitpid(a->pid, &st, WNOHANG) == a->pid) {
			a->pid = 0;
			return false;
		}
		struct wf_ctl_client *c = NULL;
		if (wf_ctl_client_open(a->sock_url, 5000, NULL, &c, NULL) == 0) {
			Weightfloor__V1__Request req = WEIGHTFLOOR__V1__REQUEST__INIT;
			Weightfloor__V1__AgentStatus as = WEIGHTFLOOR__V1__AGENT_STATUS__INIT;
			req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_AGENT_STATUS;
			req.agent_status = &as;
			Weightfloor__V1__Reply *r = NULL;
			if (wf_ctl_client_call(c, &req, &r, NULL) == 0 &&
			    r->code == WEIGHTFLOOR__V1__STATUS__STATUS_OK) {
				wf_ctl_reply_free(r);
				wf_ctl_client_close(a->cli);
				a->cli = c;
				return true;
			}
			wf_ctl_reply_free(r);
			wf_ctl_client_close(c);
		}
		agt_sleep_ms(20);
	}
	return false;
}

pid_t agt_start(struct agt *a, const struct agt_opts *o, const char *const *args)
{
	pid_t pid = agt_spawn(a, o, args);
	if (!agt_wait_ready(a, 20000)) {
		char *log = agt_log(a);
		agt_stop(a, 2000);
		cr_assert_fail("wf-agent did not become ready; its log:\n%s", log);
	}
	return pid;
}

pid_t agt_spawn_to(char *const *argv, const char *out)
{
	posix_spawn_file_actions_t fa;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
	posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, out, O_WRONLY | O_CREAT | O_TRUNC,
	                                 0644);
	posix_spawn_file_actions_adddup2(&fa, STDOUT_FILENO, STDERR_FILENO);
	pid_t pid;
	int rc = posix_spawn(&pid, argv[0], &fa, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	cr_assert_eq(rc, 0, "spawn %s: %s", argv[0], strerror(rc));
	return pid;
}

int agt_run(char *const *argv, char **out, char **err, int timeout_s, const char *dir)
{
	static atomic_int seq; /* tests run agentctl from several threads */
	int n = atomic_fetch_add(&seq, 1) + 1;
	char *o = agt_printf("%s/run-%d.out", dir, n);
	char *e = agt_printf("%s/run-%d.err", dir, n);
	int rc = wft_run(argv, o, e, timeout_s);
	if (out)
		*out = wft_read_file(o, NULL);
	if (err)
		*err = wft_read_file(e, NULL);
	if (out && !*out)
		*out = strdup("");
	if (err && !*err)
		*err = strdup("");
	unlink(o);
	unlink(e);
	free(o);
	free(e);
	return rc;
}

int agt_ctl(struct agt *a, char **out, char **err, const char *const *args)
{
	char *argv[32];
	int n = 0;
	argv[n++] = wft_exe("control/agentctl/agentctl");
	argv[n++] = "--socket";
	argv[n++] = a->sock_url;
	argv[n++] = "--events";
	argv[n++] = a->ev_url;
	for (size_t i = 0; args[i]; i++) {
		cr_assert(n < 31);
		argv[n++] = (char *)args[i];
	}
	argv[n] = NULL;
	return agt_run(argv, out, err, 30, a->dir);
}

Weightfloor__V1__Reply *agt_publish(struct agt *a, const char *model, const char *tensor,
                                    const uint8_t *data, uint64_t size, bool dry)
{
	Weightfloor__V1__TensorBytes tb = WEIGHTFLOOR__V1__TENSOR_BYTES__INIT;
	Weightfloor__V1__TensorBytes *tbp = &tb;
	tb.name = (char *)tensor;
	tb.size = size;
	if (data) {
		tb.data.data = (uint8_t *)data;
		tb.data.len = size;
	}
	Weightfloor__V1__PublishTensors pt = WEIGHTFLOOR__V1__PUBLISH_TENSORS__INIT;
	pt.name = (char *)model;
	pt.tensors = &tbp;
	pt.n_tensors = 1;
	pt.dry_run = dry;
	Weightfloor__V1__Request req = WEIGHTFLOOR__V1__REQUEST__INIT;
	req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_PUBLISH_TENSORS;
	req.publish_tensors = &pt;
	return agt_call(a, &req, 10000);
}

char *agt_eval_ids(struct agt *a, const char *model, const char *prompt, const char *n_gen)
{
	char *exe = wft_exe("worker/wf-worker");
	char *const argv[] = {
	    exe,          "eval",        "--model",   (char *)model, "--prompt", (char *)prompt,
	    "--generate", (char *)n_gen, "--threads", "2",           NULL};
	char *out = NULL, *err = NULL;
	int rc = agt_run(argv, &out, &err, 120, a->dir);
	cr_assert_eq(rc, 0, "wf-worker eval %s: %s", model, err);
	char *end = out + strlen(out);
	while (end > out && (end[-1] == '\n' || end[-1] == ' '))
		*--end = '\0';
	char *last = strrchr(out, '\n');
	char *ids = strdup(last ? last + 1 : out);
	free(out);
	free(err);
	free(exe);
	return ids;
}

char *agt_generate_ids(struct agt *a, const char *model, const char *worker, const char *prompt,
                       const char *n_gen)
{
	const char *args[16] = {"generate",     model, "--prompt-ids", prompt,
	                        "--max-tokens", n_gen, "--ignore-eos", "--json"};
	size_t n = 8;
	if (worker) {
		args[n++] = "--worker";
		args[n++] = worker;
	}
	args[n] = NULL;
	char *out = NULL, *err = NULL;
	int rc = agt_ctl(a, &out, &err, args);
	char ids[1024] = "";
	size_t at = 0;
	/* one JSON object a token ({"index", "id", "text"}), then the end ({"done": true, ...},
	 * whose ids are completion_id and worker_id) */
	for (char *line = strtok(out, "\n"); rc == 0 && line; line = strtok(NULL, "\n")) {
		const char *p = strstr(line, "\"id\":");
		if (p && !strstr(line, "\"done\""))
			at += (size_t)snprintf(ids + at, sizeof ids - at, "%s%d", at ? "," : "",
			                       atoi(p + 5));
	}
	free(out);
	free(err);
	return rc == 0 ? strdup(ids) : NULL;
}

/* ---- requests ------------------------------------------------------------------------------- */

Weightfloor__V1__Reply *agt_call(struct agt *a, Weightfloor__V1__Request *req, int timeout_ms)
{
	cr_assert_not_null(a->cli, "no agent connection");
	Weightfloor__V1__Reply *r = NULL;
	struct wf_diag d = {{0}};
	int rc = wf_ctl_client_call_timeout(a->cli, req, timeout_ms, &r, &d);
	cr_assert_eq(rc, 0, "request %d: %s", (int)req->body_case, wf_diag_str(&d, rc));
	return r;
}

Weightfloor__V1__Reply *agt_register_paths(struct agt *a, const char *name, char **paths, size_t n)
{
	Weightfloor__V1__RegisterModel rm = WEIGHTFLOOR__V1__REGISTER_MODEL__INIT;
	rm.name = (char *)name;
	rm.paths = paths;
	rm.n_paths = n;
	Weightfloor__V1__Request req = WEIGHTFLOOR__V1__REQUEST__INIT;
	req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_REGISTER_MODEL;
	req.register_model = &rm;
	return agt_call(a, &req, 10000);
}

Weightfloor__V1__Reply *agt_register(struct agt *a, const char *name, const char *path, bool pin)
{
	char *p = (char *)path;
	Weightfloor__V1__RegisterModel rm = WEIGHTFLOOR__V1__REGISTER_MODEL__INIT;
	rm.name = (char *)name;
	rm.paths = &p;
	rm.n_paths = 1;
	rm.pin_host = pin;
	Weightfloor__V1__Request req = WEIGHTFLOOR__V1__REQUEST__INIT;
	req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_REGISTER_MODEL;
	req.register_model = &rm;
	return agt_call(a, &req, 10000);
}

Weightfloor__V1__Reply *agt_ensure(struct agt *a, const char *name, bool wait)
{
	Weightfloor__V1__EnsureFloor ef = WEIGHTFLOOR__V1__ENSURE_FLOOR__INIT;
	ef.name = (char *)name;
	ef.wait = wait;
	ef.wait_timeout_ms = wait ? 30000 : 0;
	Weightfloor__V1__Request req = WEIGHTFLOOR__V1__REQUEST__INIT;
	req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_ENSURE_FLOOR;
	req.ensure_floor = &ef;
	return agt_call(a, &req, wait ? 35000 : 10000);
}

#define NAMED_REQ(fn, Type, INIT, BODY, field)                                                     \
	Weightfloor__V1__Reply *fn(struct agt *a, const char *name)                                \
	{                                                                                          \
		Weightfloor__V1__##Type m = INIT;                                                  \
		m.name = (char *)name;                                                             \
		Weightfloor__V1__Request req = WEIGHTFLOOR__V1__REQUEST__INIT;                     \
		req.body_case = BODY;                                                              \
		req.field = &m;                                                                    \
		return agt_call(a, &req, 10000);                                                   \
	}
NAMED_REQ(agt_model, ModelStatus, WEIGHTFLOOR__V1__MODEL_STATUS__INIT,
          WEIGHTFLOOR__V1__REQUEST__BODY_MODEL_STATUS, model_status)
NAMED_REQ(agt_release, ReleaseFloor, WEIGHTFLOOR__V1__RELEASE_FLOOR__INIT,
          WEIGHTFLOOR__V1__REQUEST__BODY_RELEASE_FLOOR, release_floor)
NAMED_REQ(agt_pin_, PinHost, WEIGHTFLOOR__V1__PIN_HOST__INIT,
          WEIGHTFLOOR__V1__REQUEST__BODY_PIN_HOST, pin_host)
NAMED_REQ(agt_unpin_, UnpinHost, WEIGHTFLOOR__V1__UNPIN_HOST__INIT,
          WEIGHTFLOOR__V1__REQUEST__BODY_UNPIN_HOST, unpin_host)

Weightfloor__V1__Reply *agt_pin(struct agt *a, const char *name, bool pin)
{
	return pin ? agt_pin_(a, name) : agt_unpin_(a, name);
}

Weightfloor__V1__Reply *agt_list(struct agt *a)
{
	Weightfloor__V1__ListModels lm = WEIGHTFLOOR__V1__LIST_MODELS__INIT;
	Weightfloor__V1__Request req = WEIGHTFLOOR__V1__REQUEST__INIT;
	req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_LIST_MODELS;
	req.list_models = &lm;
	return agt_call(a, &req, 10000);
}

Weightfloor__V1__Reply *agt_status(struct agt *a)
{
	Weightfloor__V1__AgentStatus as = WEIGHTFLOOR__V1__AGENT_STATUS__INIT;
	Weightfloor__V1__Request req = WEIGHTFLOOR__V1__REQUEST__INIT;
	req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_AGENT_STATUS;
	req.agent_status = &as;
	return agt_call(a, &req, 10000);
}

Weightfloor__V1__FloorState agt_state(const Weightfloor__V1__Reply *r)
{
	cr_assert_eq(r->body_case, WEIGHTFLOOR__V1__REPLY__BODY_MODEL_INFO,
	             "reply without ModelInfo: %s %s", wf_proto_status_name(r->code), r->message);
	return r->model_info->floor_state;
}

const char *agt_state_name(Weightfloor__V1__FloorState s)
{
	switch (s) {
	case WEIGHTFLOOR__V1__FLOOR_STATE__FLOOR_STATE_DISK:
		return "DISK";
	case WEIGHTFLOOR__V1__FLOOR_STATE__FLOOR_STATE_MATERIALIZING:
		return "MATERIALIZING";
	case WEIGHTFLOOR__V1__FLOOR_STATE__FLOOR_STATE_HOST:
		return "HOST";
	case WEIGHTFLOOR__V1__FLOOR_STATE__FLOOR_STATE_PINNED_HOST:
		return "PINNED_HOST";
	case WEIGHTFLOOR__V1__FLOOR_STATE__FLOOR_STATE_FAILED:
		return "FAILED";
	default:
		return "UNSPECIFIED";
	}
}

Weightfloor__V1__Reply *agt_wait_settled(struct agt *a, const char *name, int timeout_ms)
{
	int64_t end = mono_ms() + timeout_ms;
	for (;;) {
		Weightfloor__V1__Reply *r = agt_model(a, name);
		cr_assert_eq(r->code, WEIGHTFLOOR__V1__STATUS__STATUS_OK, "ModelStatus %s: %s %s",
		             name, wf_proto_status_name(r->code), r->message);
		if (agt_state(r) != WEIGHTFLOOR__V1__FLOOR_STATE__FLOOR_STATE_MATERIALIZING)
			return r;
		wf_ctl_reply_free(r);
		cr_assert(mono_ms() < end, "model %s still MATERIALIZING after %d ms", name,
		          timeout_ms);
		agt_sleep_ms(20);
	}
}

/* ---- files ---------------------------------------------------------------------------------- */

char *agt_region_path(struct agt *a, const char *hex, const char *suffix)
{
	return agt_printf("%s/wf-%s%s", a->floor, hex, suffix ? suffix : "");
}

uint64_t agt_inode(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0 ? (uint64_t)st.st_ino : 0;
}

int agt_dir_count(const char *dir, char *buf, size_t len)
{
	DIR *d = opendir(dir);
	if (!d)
		return -errno;
	int n = 0;
	size_t off = 0;
	if (buf && len)
		buf[0] = '\0';
	struct dirent *e;
	while ((e = readdir(d))) {
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		n++;
		if (buf && off < len) {
			int w = snprintf(buf + off, len - off, "%s ", e->d_name);
			if (w > 0)
				off += (size_t)w;
		}
	}
	closedir(d);
	return n;
}

int agt_count(const char *hay, const char *needle)
{
	int n = 0;
	size_t k = strlen(needle);
	for (const char *p = hay; p && (p = strstr(p, needle)); p += k)
		n++;
	return n;
}

/* ---- events --------------------------------------------------------------------------------- */

int agt_event_peers(struct agt *a)
{
	FILE *f = fopen("/proc/net/unix", "r");
	if (!f)
		return -1;
	char line[1024];
	int n = 0;
	while (fgets(line, sizeof line, f)) {
		/* Num RefCount Protocol Flags Type St Inode Path: accepted (St 03) sockets carry
		 * the listener's path */
		char path[512] = "";
		unsigned st = 0;
		if (sscanf(line, "%*s %*s %*s %*s %*s %x %*s %511s", &st, path) == 2 && st == 3 &&
		    strcmp(path, a->ev_path) == 0)
			n++;
	}
	fclose(f);
	return n;
}

struct wf_ctl_sub *agt_sub_synced(struct agt *a, const char *ping_name, const char *ping_path)
{
	struct wf_ctl_sub *sub = NULL;
	struct wf_diag d = {{0}};
	int rc = wf_ctl_sub_open(a->ev_url, NULL, &sub, &d);
	cr_assert_eq(rc, 0, "sub %s: %s", a->ev_url, wf_diag_str(&d, rc));
	int64_t end = mono_ms() + 15000;
	/* Each round registers a new name: only a new registration is announced (re-registering
	 * a model is idempotent and silent), so the first one may go out before we are connected.
	 */
	for (unsigned round = 0; mono_ms() < end; round++) {
		char name[160];
		if (round == 0)
			snprintf(name, sizeof name, "%s", ping_name);
		else
			snprintf(name, sizeof name, "%s-%u", ping_name, round);
		Weightfloor__V1__Reply *r = agt_register(a, name, ping_path, false);
		cr_assert_eq(r->code, WEIGHTFLOOR__V1__STATUS__STATUS_OK, "register %s: %s", name,
		             r->message);
		wf_ctl_reply_free(r);
		Weightfloor__V1__Event *ev = NULL;
		while (wf_ctl_sub_recv(sub, 100, &ev, NULL) == 0) {
			bool ping = strncmp(ev->model, ping_name, strlen(ping_name)) == 0;
			wf_ctl_event_free(ev);
			if (ping)
				return sub;
		}
	}
	cr_assert_fail("the event subscription never received a ping");
	return NULL;
}

/* ---- assertions shared by the agent suites ---- */

void agt_expect_code(const Weightfloor__V1__Reply *r, Weightfloor__V1__Status want,
                     const char *what)
{
	cr_assert_eq(r->code, want, "%s: got %s (%s), want %s", what, wf_proto_status_name(r->code),
	             r->message ? r->message : "", wf_proto_status_name(want));
}

void agt_ensure_ok(struct agt *a, const char *name)
{
	Weightfloor__V1__Reply *r = agt_ensure(a, name, true);
	agt_expect_code(r, AGT_ST(OK), name);
	cr_assert(agt_state(r) == AGT_FS(HOST) || agt_state(r) == AGT_FS(PINNED_HOST));
	wf_ctl_reply_free(r);
}

char *agt_digest_of(struct agt *a, const char *name)
{
	Weightfloor__V1__Reply *r = agt_model(a, name);
	agt_expect_code(r, AGT_ST(OK), name);
	char *hex = strdup(r->model_info->digest_hex);
	wf_ctl_reply_free(r);
	cr_assert_not_null(hex);
	return hex;
}

struct wf_shm_region *agt_attach_reader(struct agt *a, const char *hex, int *ret_rc)
{
	struct wf_shm_config cfg = {.dir = a->floor};
	struct wf_digest dg;
	cr_assert_eq(wf_digest_parse(hex, &dg), 0, "digest '%s'", hex);
	struct wf_shm_region *r = NULL;
	struct wf_diag d = {{0}};
	int rc = wf_shm_region_attach(&cfg, &dg, NULL, WF_SHM_ATTACH_READER, NULL, NULL, &r, &d);
	if (ret_rc)
		*ret_rc = rc;
	else
		cr_assert_eq(rc, 0, "reader attach %s: %s", hex, wf_diag_str(&d, rc));
	return rc == 0 ? r : NULL;
}

pid_t agt_hold_floor(struct agt *a, const char *hex)
{
	int p[2];
	cr_assert_eq(pipe2(p, O_CLOEXEC), 0);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		close(p[0]);
		struct wf_shm_config cfg = {.dir = a->floor};
		struct wf_digest dg;
		struct wf_shm_region *r = NULL;
		char ok = wf_digest_parse(hex, &dg) == 0 &&
		                  wf_shm_region_attach(&cfg, &dg, NULL, WF_SHM_ATTACH_READER, NULL,
		                                       NULL, &r, NULL) == 0
		              ? 'y'
		              : 'n';
		if (write(p[1], &ok, 1) != 1 || ok != 'y')
			_exit(1);
		for (;;)
			pause();
	}
	close(p[1]);
	char ok = 0;
	ssize_t n = read(p[0], &ok, 1);
	close(p[0]);
	agt_track_pid(pid);
	cr_assert(n == 1 && ok == 'y', "the holder process could not attach floor %s", hex);
	return pid;
}

int64_t agt_now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void agt_spawn_worker(struct agt *a, struct agt_worker *w, const char *id, const char *agent_url,
                      const char *device, const char *const *extra)
{
	snprintf(w->url, sizeof w->url, "ipc://%s/%s.sock", a->run, id);
	static int seq;
	snprintf(w->log, sizeof w->log, "%s/worker-%s-%d.log", a->dir, id, ++seq);
	char *argv[48];
	int n = 0;
	argv[n++] = wft_exe("tests/agent/agent_helper");
	argv[n++] = "--pdeathsig";
	argv[n++] = "exec";
	argv[n++] = wft_exe("worker/wf-worker");
	argv[n++] = "--device";
	argv[n++] = (char *)(device ? device : "host:mem=256Mi");
	argv[n++] = "--id";
	argv[n++] = (char *)id;
	argv[n++] = "--endpoint";
	argv[n++] = w->url;
	argv[n++] = "--agent";
	argv[n++] = (char *)(agent_url ? agent_url : a->sock_url);
	argv[n++] = "--floor-dir";
	argv[n++] = a->floor;
	for (size_t i = 0; extra && extra[i]; i++) {
		cr_assert(n < 46);
		argv[n++] = (char *)extra[i];
	}
	argv[n] = NULL;
	posix_spawn_file_actions_t fa;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
	posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, w->log, O_WRONLY | O_CREAT | O_APPEND,
	                                 0644);
	posix_spawn_file_actions_adddup2(&fa, STDOUT_FILENO, STDERR_FILENO);
	int rc = posix_spawn(&w->pid, argv[0], &fa, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	cr_assert_eq(rc, 0, "spawn wf-worker: %s", strerror(rc));
	agt_track_pid(w->pid);
}

char *agt_worker_log(const struct agt_worker *w)
{
	char *s = wft_read_file(w->log, NULL);
	return s ? s : strdup("");
}

int agt_call_url(const char *url, Weightfloor__V1__Request *req, int timeout_ms,
                 Weightfloor__V1__Reply **ret_reply, struct wf_diag *diag)
{
	struct wf_ctl_client *c = NULL;
	int rc = wf_ctl_client_open(url, timeout_ms, NULL, &c, diag);
	if (rc == 0)
		rc = wf_ctl_client_call_timeout(c, req, timeout_ms, ret_reply, diag);
	wf_ctl_client_close(c);
	return rc;
}

Weightfloor__V1__Reply *agt_worker_status(const char *url, int timeout_ms, int *ret_rc)
{
	Weightfloor__V1__WorkerStatus ws = WEIGHTFLOOR__V1__WORKER_STATUS__INIT;
	Weightfloor__V1__Request req = WEIGHTFLOOR__V1__REQUEST__INIT;
	req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_WORKER_STATUS;
	req.worker_status = &ws;
	Weightfloor__V1__Reply *r = NULL;
	*ret_rc = agt_call_url(url, &req, timeout_ms, &r, NULL);
	return r;
}

void agt_wait_worker_registered(struct agt *a, struct agt_worker *w, const char *id)
{
	char *quoted = agt_printf("\"%s\"", id);
	int64_t end = agt_now_ms() + 20000;
	while (agt_now_ms() < end) {
		char *out = NULL, *err = NULL;
		int rc = agt_ctl(a, &out, &err, (const char *[]){"workers", "--json", NULL});
		bool ok = rc == 0 && out && strstr(out, quoted);
		free(out);
		free(err);
		if (ok) {
			free(quoted);
			return;
		}
		int st;
		cr_assert_neq(waitpid(w->pid, &st, WNOHANG), w->pid, "wf-worker %s exited:\n%s", id,
		              agt_worker_log(w));
		agt_sleep_ms(50);
	}
	cr_assert_fail("worker %s never registered with the agent:\n%s", id, agt_worker_log(w));
}

void agt_wait_worker_ready(struct agt_worker *w)
{
	int64_t end = agt_now_ms() + 20000;
	while (agt_now_ms() < end) {
		int rc, st;
		Weightfloor__V1__Reply *r = agt_worker_status(w->url, 2000, &rc);
		bool ok = rc == 0 && r->code == AGT_ST(OK);
		wf_ctl_reply_free(r);
		if (ok)
			return;
		if (waitpid(w->pid, &st, WNOHANG) == w->pid)
			break;
		agt_sleep_ms(50);
	}
	cr_assert_fail("wf-worker did not answer; its log:\n%s", agt_worker_log(w));
}
