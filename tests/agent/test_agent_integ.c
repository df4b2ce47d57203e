/* wf-agent integration tests: real agent processes on ipc:// sockets in a private directory,
 * driven through the control client library, raw nng, agent_helper children and the agentctl
 * binary. See agt.h for the harness; test_agent_enospc.c has the tmpfs ENOSPC tests.
 */
#include "tests/agent/agt.h"

#include "base/error.h"
#include "common/wftest.h"
#include "model/model.h"
#include "proto/status.h"
#include "proto/version.h"
#include "shm/layout.h"
#include "shm/region.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <limits.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define ST(x) WEIGHTFLOOR__V1__STATUS__STATUS_##x
#define FS(x) WEIGHTFLOOR__V1__FLOOR_STATE__FLOOR_STATE_##x
#define EK(x) WEIGHTFLOOR__V1__EVENT_KIND__EVENT_KIND_##x

TestSuite(agent, .fini = agt_fini, .timeout = 60);

static void expect_state(struct agt *a, const char *name, Weightfloor__V1__FloorState want)
{
	Weightfloor__V1__Reply *r = agt_model(a, name);
	agt_expect_code(r, ST(OK), name);
	cr_assert_eq(agt_state(r), want, "model %s is %s, want %s (last_error '%s')", name,
	             agt_state_name(agt_state(r)), agt_state_name(want), r->model_info->last_error);
	wf_ctl_reply_free(r);
}

static bool has_pid(const Weightfloor__V1__ModelInfo *mi, pid_t pid)
{
	for (size_t i = 0; i < mi->n_holder_pids; i++)
		if (mi->holder_pids[i] == (uint32_t)pid)
			return true;
	return false;
}

static char *real(const char *path)
{
	char *r = realpath(path, NULL);
	cr_assert_not_null(r, "realpath %s: %s", path, strerror(errno));
	return r;
}

static void require_root(void)
{
	if (geteuid() != 0)
		cr_skip_test("needs root: the test runs processes under uid 65534");
}

/* Every ancestor of dir must be traversable by others for an agent or client running as 65534. */
static const char *untraversable_ancestor(const char *dir)
{
	static char buf[PATH_MAX];
	snprintf(buf, sizeof buf, "%s", dir);
	for (;;) {
		char *slash = strrchr(buf, '/');
		if (!slash || slash == buf)
			return NULL;
		*slash = '\0';
		struct stat st;
		if (stat(buf, &st) != 0 || !(st.st_mode & S_IXOTH))
			return buf;
	}
}

/* Waits for a child; SIGKILLs it after timeout_ms. Exit status, or -1. */
static int wait_child(pid_t pid, int timeout_ms)
{
	int64_t end = agt_now_ms() + timeout_ms;
	int st;
	for (;;) {
		pid_t r = waitpid(pid, &st, WNOHANG);
		if (r == pid)
			return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
		if (r < 0 || agt_now_ms() > end)
			break;
		agt_sleep_ms(10);
	}
	kill(pid, SIGKILL);
	waitpid(pid, &st, 0);
	return -1;
}

/* agent_helper [--uid --gid] call URL ARGS... ; returns its one output line (malloc'ed). */
static char *helper_call(struct agt *a, bool drop, uid_t uid, gid_t gid, const char *const *args)
{
	char suid[16], sgid[16];
	snprintf(suid, sizeof suid, "%u", (unsigned)uid);
	snprintf(sgid, sizeof sgid, "%u", (unsigned)gid);
	char *argv[16];
	int n = 0;
	argv[n++] = wft_exe("tests/agent/agent_helper");
	if (drop) {
		argv[n++] = "--uid";
		argv[n++] = suid;
		argv[n++] = "--gid";
		argv[n++] = sgid;
	}
	argv[n++] = "call";
	argv[n++] = a->sock_url;
	for (size_t i = 0; args[i]; i++)
		argv[n++] = (char *)args[i];
	argv[n] = NULL;
	char *out = NULL, *err = NULL;
	int rc = agt_run(argv, &out, &err, 30, a->dir);
	cr_assert_eq(rc, 0, "agent_helper exited %d: %s%s", rc, out, err);
	free(err);
	return out;
}

static struct json_object *parse_json(const char *text, const char *what)
{
	struct json_object *o = json_tokener_parse(text);
	cr_assert_not_null(o, "%s: not JSON: %s", what, text);
	return o;
}

static struct json_object *jget(struct json_object *o, const char *key)
{
	struct json_object *v = NULL;
	cr_assert(json_object_object_get_ex(o, key, &v), "JSON has no '%s': %s", key,
	          json_object_to_json_string(o));
	return v;
}

static void write_file(const char *path, const char *text, mode_t mode)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
	cr_assert_geq(fd, 0, "%s: %s", path, strerror(errno));
	size_t n = strlen(text);
	cr_assert_eq(write(fd, text, n), (ssize_t)n);
	close(fd);
	chmod(path, mode);
}

static off_t file_size(const char *path)
{
	struct stat st;
	cr_assert_eq(stat(path, &st), 0, "%s: %s", path, strerror(errno));
	return st.st_size;
}

/* ---- 1. happy path ------------------------------------------------------------------------- */

Test(agent, happy_path)
{
	struct agt *a = agt_new("agent-happy");
	char *pa = agt_gen(a, "a", 1, NULL);
	char *pb = agt_gen(a, "b", 2, NULL);
	char *pc = agt_gen(a, "c", 3, NULL);
	char *marg = agt_printf("a=%s", pa);
	const char *args[] = {"--model", marg, "--io-backend", "auto", NULL};
	pid_t pid = agt_start(a, NULL, args);

	/* registered three ways: --model (above), agentctl register, the RegisterModel API */
	char *out, *err;
	int rc = agt_ctl(a, &out, &err, (const char *[]){"register", "b", pb, NULL});
	cr_assert_eq(rc, 0, "agentctl register: exit %d: %s", rc, err);
	cr_assert(strstr(out, "MODEL") && strstr(out, "DISK"), "agentctl register printed:\n%s",
	          out);
	Weightfloor__V1__Reply *r = agt_register(a, "c", pc, false);
	agt_expect_code(r, ST(OK), "register c");
	cr_assert_eq(agt_state(r), FS(DISK));
	cr_assert_str_eq(r->model_info->name, "c");
	cr_assert_eq(r->model_info->n_files, 1);
	cr_assert_str_eq(r->model_info->files[0]->path, real(pc));
	wf_ctl_reply_free(r);
	/* idempotent with the same file; another file under the same name is refused */
	r = agt_register(a, "c", pc, false);
	agt_expect_code(r, ST(OK), "register c again");
	wf_ctl_reply_free(r);
	r = agt_register(a, "c", pb, false);
	agt_expect_code(r, ST(FAILED_PRECONDITION), "register c with b's file");
	cr_assert(strstr(r->message, "already registered"), "%s", r->message);
	wf_ctl_reply_free(r);

	r = agt_ensure(a, "a", true);
	agt_expect_code(r, ST(OK), "ensure a");
	cr_assert_eq(agt_state(r), FS(HOST));
	Weightfloor__V1__ModelInfo *mi = r->model_info;
	char *hex_a = strdup(mi->digest_hex);

	/* ModelInfo against agentctl inspect --json of the same file */
	rc = agt_ctl(a, &out, &err, (const char *[]){"inspect", "--json", pa, NULL});
	cr_assert_eq(rc, 0, "agentctl inspect: exit %d: %s", rc, err);
	struct json_object *ins = parse_json(out, "inspect --json");
	cr_assert_str_eq(mi->digest_hex, json_object_get_string(jget(ins, "digest_hex")));
	cr_assert_eq(mi->total_bytes, (uint64_t)json_object_get_int64(jget(ins, "total_bytes")));
	cr_assert_eq(mi->expert_bytes, (uint64_t)json_object_get_int64(jget(ins, "expert_bytes")));
	cr_assert_eq(mi->tensor_count, (uint64_t)json_object_get_int64(jget(ins, "tensor_count")));
	cr_assert_str_eq(mi->format, "gguf");
	cr_assert_str_eq(mi->arch, "qwen3moe");
	cr_assert_eq(mi->n_files, 1);
	cr_assert_eq(mi->files[0]->size_bytes, (uint64_t)file_size(pa));
	cr_assert_geq(mi->holder_count, 1);
	cr_assert(has_pid(mi, pid), "agent pid %d not among the %zu holder pids", (int)pid,
	          mi->n_holder_pids);
	cr_assert_not_null(mi->progress);
	cr_assert_eq(mi->progress->bytes_done, mi->progress->bytes_total);
	cr_assert_gt(mi->last_used_unix_ms, 0);
	json_object_put(ins);

	/* the region and its lock files, with their modes */
	char *region = agt_region_path(a, mi->digest_hex, NULL);
	char *guard = agt_region_path(a, mi->digest_hex, ".guard");
	char *holders = agt_region_path(a, mi->digest_hex, ".holders");
	struct stat st;
	cr_assert_eq(stat(region, &st), 0, "%s: %s", region, strerror(errno));
	cr_assert(S_ISREG(st.st_mode));
	cr_assert_eq(st.st_mode & 07777, 0640, "region mode %o", st.st_mode & 07777);
	cr_assert_geq((uint64_t)st.st_size, mi->total_bytes);
	cr_assert_eq(stat(guard, &st), 0, "%s: %s", guard, strerror(errno));
	cr_assert_eq(st.st_mode & 07777, 0660, "guard mode %o", st.st_mode & 07777);
	cr_assert_eq(stat(holders, &st), 0, "%s: %s", holders, strerror(errno));
	cr_assert_eq(st.st_mode & 07777, 0660, "holders mode %o", st.st_mode & 07777);

	/* attach it as a worker would: checksums verify, and the bytes are the file's */
	struct wf_shm_region *reg = agt_attach_reader(a, mi->digest_hex, NULL);
	struct wf_diag d = {{0}};
	rc = wf_shm_region_verify(reg, &d);
	cr_assert_eq(rc, 0, "verify: %s", wf_diag_str(&d, rc));
	uint32_t nt = wf_shm_region_n_tensors(reg);
	cr_assert_eq(nt, mi->tensor_count);
	int fd = open(pa, O_RDONLY | O_CLOEXEC);
	cr_assert_geq(fd, 0);
	uint32_t picks[] = {0, nt / 2, nt - 1};
	for (size_t k = 0; k < 3; k++) {
		struct wf_shm_tensor_info ti;
		cr_assert_eq(wf_shm_region_tensor(reg, picks[k], &ti), 0);
		cr_assert_eq(ti.file, 0);
		cr_assert_gt(ti.nbytes, 0);
		void *buf = malloc(ti.nbytes);
		cr_assert_eq(pread(fd, buf, ti.nbytes, (off_t)ti.source_offset),
		             (ssize_t)ti.nbytes);
		cr_assert_eq(memcmp(buf, ti.data, ti.nbytes), 0,
		             "tensor %s: floor bytes differ from the file's at %llu", ti.name,
		             (unsigned long long)ti.source_offset);
		free(buf);
	}
	close(fd);
	wf_ctl_reply_free(r);
	/* the test process now holds the floor too */
	r = agt_model(a, "a");
	cr_assert_geq(r->model_info->holder_count, 2);
	cr_assert(has_pid(r->model_info, getpid()), "test pid not among holders");
	cr_assert(has_pid(r->model_info, pid), "agent pid not among holders");
	wf_ctl_reply_free(r);
	wf_shm_region_detach(reg);

	/* agentctl status and models */
	rc = agt_ctl(a, &out, &err, (const char *[]){"status", NULL});
	cr_assert_eq(rc, 0, "agentctl status: exit %d: %s", rc, err);
	cr_assert(strstr(out, a->floor), "status lacks the floor dir:\n%s", out);
	cr_assert(strstr(out, "models      3"), "status:\n%s", out);
	cr_assert(strstr(out, "\na ") && strstr(out, "HOST") && strstr(out, "\nb ") &&
	              strstr(out, "\nc "),
	          "status:\n%s", out);
	rc = agt_ctl(a, &out, &err, (const char *[]){"--json", "models", NULL});
	cr_assert_eq(rc, 0, "agentctl --json models: exit %d: %s", rc, err);
	struct json_object *ml = parse_json(out, "models --json");
	struct json_object *arr = jget(ml, "models");
	cr_assert_eq(json_object_array_length(arr), 3);
	bool seen_a = false;
	for (size_t i = 0; i < json_object_array_length(arr); i++) {
		struct json_object *m = json_object_array_get_idx(arr, i);
		const char *name = json_object_get_string(jget(m, "name"));
		const char *state = json_object_get_string(jget(m, "floor_state"));
		if (strcmp(name, "a") == 0) {
			seen_a = true;
			cr_assert_str_eq(state, "HOST");
			cr_assert_str_eq(json_object_get_string(jget(m, "digest_hex")), hex_a);
		} else {
			cr_assert_str_eq(state, "DISK", "%s", name);
		}
	}
	cr_assert(seen_a);
	json_object_put(ml);

	/* agentctl floor ensure with stdout and stderr not terminals: the table, no progress bar */
	rc = agt_ctl(a, &out, &err, (const char *[]){"floor", "ensure", "b", NULL});
	cr_assert_eq(rc, 0, "agentctl floor ensure b: exit %d: %s", rc, err);
	cr_assert(strstr(out, "MODEL") && strstr(out, "STATE") && strstr(out, "DIGEST"),
	          "no table header:\n%s", out);
	cr_assert(strstr(out, "\nb ") && strstr(out, "HOST"), "no row for b:\n%s", out);
	cr_assert_null(strchr(err, '\r'), "progress bar written to a non-terminal: %s", err);
	expect_state(a, "b", FS(HOST));

	r = agt_status(a);
	agt_expect_code(r, ST(OK), "status");
	cr_assert_eq(r->body_case, WEIGHTFLOOR__V1__REPLY__BODY_AGENT_STATUS);
	cr_assert_eq(r->agent_status->pid, (uint32_t)pid);
	cr_assert_str_eq(r->agent_status->floor_dir, a->floor);
	cr_assert_eq(r->agent_status->models->total, 3);
	cr_assert_eq(r->agent_status->models->host, 2);
	cr_assert_eq(r->agent_status->models->disk, 1);
	cr_assert_gt(r->agent_status->host_used_bytes, 0);
	cr_assert_leq(r->agent_status->host_used_bytes, r->agent_status->host_budget_bytes);
	wf_ctl_reply_free(r);

	rc = agt_stop(a, 10000);
	cr_assert_eq(rc, 0, "agent exit status %d on SIGTERM", rc);
}

/* ---- 2. one materialization for concurrent ensures ------------------------------------------ */

Test(agent, concurrent_ensures_materialize_once)
{
	struct agt *a = agt_new("agent-once");
	char *pm = agt_gen(a, "m", 7, NULL);
	char *pp = agt_gen(a, "ping", 8, NULL);
	char *marg = agt_printf("m=%s", pm);
	struct agt_opts o = {.env = {"WF_AGENT_FAULT_FILL_DELAY_MS=800"}};
	agt_start(a, &o, (const char *[]){"--model", marg, NULL});
	struct wf_ctl_sub *sub = agt_sub_synced(a, "ping", pp);

	enum { N = 8 };
	pid_t kids[N];
	char *outs[N];
	for (int i = 0; i < N; i++) {
		outs[i] = agt_printf("%s/ensure-%d.out", a->dir, i);
		char *argv[] = {wft_exe("tests/agent/agent_helper"),
		                "call",
		                a->sock_url,
		                "ensure",
		                "m",
		                "30000",
		                NULL};
		kids[i] = agt_spawn_to(argv, outs[i]);
	}
	for (int i = 0; i < N; i++) {
		int rc = wait_child(kids[i], 45000);
		char *text = wft_read_file(outs[i], NULL);
		cr_assert_eq(rc, 0, "child %d exited %d: %s", i, rc, text ? text : "");
		cr_assert(text && strncmp(text, "REPLY OK ", 9) == 0 && strstr(text, " HOST "),
		          "child %d: %s", i, text ? text : "(no output)");
		free(text);
	}

	/* exactly one MATERIALIZING -> HOST on the event socket */
	int n_mat = 0, n_host = 0, n_prog = 0;
	int64_t end = agt_now_ms() + 10000, quiet_until = 0;
	while (agt_now_ms() < end && !(quiet_until && agt_now_ms() > quiet_until)) {
		Weightfloor__V1__Event *ev = NULL;
		if (wf_ctl_sub_recv(sub, 100, &ev, NULL) != 0)
			continue;
		if (strcmp(ev->model, "m") == 0) {
			if (ev->kind == EK(FLOOR_STATE) && ev->floor_state == FS(MATERIALIZING))
				n_mat++;
			if (ev->kind == EK(FLOOR_STATE) && ev->floor_state == FS(HOST)) {
				n_host++;
				quiet_until = agt_now_ms() + 500; /* catch a second run, if any */
			}
			if (ev->kind == EK(PROGRESS))
				n_prog++;
		}
		wf_ctl_event_free(ev);
	}
	wf_ctl_sub_close(sub);
	cr_assert_eq(n_mat, 1, "%d MATERIALIZING events for 8 concurrent ensures", n_mat);
	cr_assert_eq(n_host, 1, "%d HOST events", n_host);
	cr_assert_geq(n_prog, 1);
	char *log = agt_log(a);
	cr_assert_eq(agt_count(log, "model m: MATERIALIZING"), 1, "log:\n%s", log);

	Weightfloor__V1__Reply *r = agt_model(a, "m");
	cr_assert_eq(agt_state(r), FS(HOST));
	cr_assert_eq(r->model_info->holder_count, 1, "only the agent holds the floor");
	char *region = agt_region_path(a, r->model_info->digest_hex, NULL);
	uint64_t ino = agt_inode(region);
	cr_assert_neq(ino, 0);
	wf_ctl_reply_free(r);
	/* and a ninth ensure reuses it */
	r = agt_ensure(a, "m", true);
	agt_expect_code(r, ST(OK), "ensure again");
	wf_ctl_reply_free(r);
	cr_assert_eq(agt_inode(region), ino);
}

/* ---- 3. model roots ------------------------------------------------------------------------ */

Test(agent, paths_outside_the_model_roots_are_refused)
{
	struct agt *a = agt_new("agent-roots");
	char *in = agt_gen(a, "in", 1, NULL);
	char *other = agt_printf("%s/other", a->dir), *evil = agt_printf("%s/models-evil", a->dir);
	cr_assert_eq(mkdir(other, 0755), 0);
	cr_assert_eq(mkdir(evil, 0755), 0);
	char *out_path = agt_printf("%s/out.gguf", other),
	     *evil_path = agt_printf("%s/x.gguf", evil);
	cr_assert_eq(rename(agt_gen(a, "out", 2, NULL), out_path), 0);
	cr_assert_eq(rename(agt_gen(a, "x", 3, NULL), evil_path), 0);
	char *link = agt_printf("%s/link.gguf", a->models);
	cr_assert_eq(symlink(out_path, link), 0);
	char *dots = agt_printf("%s/../other/out.gguf", a->models);

	char *cfg = agt_printf("%s/agent.json", a->dir);
	char *json = agt_printf("{\"model_roots\": [\"%s\"]}", a->models);
	write_file(cfg, json, 0644);
	agt_start(a, NULL, (const char *[]){"--config", cfg, NULL});

	Weightfloor__V1__Reply *r = agt_register(a, "in", in, false);
	agt_expect_code(r, ST(OK), "register inside the roots");
	wf_ctl_reply_free(r);
	const char *bad[] = {out_path, evil_path, link, dots};
	for (size_t i = 0; i < 4; i++) {
		r = agt_register(a, "bad", bad[i], false);
		agt_expect_code(r, ST(PERMISSION_DENIED), bad[i]);
		cr_assert(strstr(r->message, "outside the model roots"), "%s: message '%s'", bad[i],
		          r->message);
		cr_assert_eq(r->body_case, WEIGHTFLOOR__V1__REPLY__BODY__NOT_SET);
		wf_ctl_reply_free(r);
	}
	char *out, *err;
	int rc = agt_ctl(a, &out, &err, (const char *[]){"register", "bad", out_path, NULL});
	cr_assert_eq(rc, 6, "agentctl register outside the roots: exit %d", rc);
	cr_assert(strstr(err, "PERMISSION_DENIED") && strstr(err, "outside the model roots"),
	          "agentctl stderr: %s", err);

	r = agt_list(a);
	cr_assert_eq(r->model_list->n_models, 1, "only 'in' is registered");
	cr_assert_str_eq(r->model_list->models[0]->name, "in");
	wf_ctl_reply_free(r);
	agt_stop(a, 10000);

	/* at start, a configured model outside the roots is a configuration error */
	char *sock = agt_printf("ipc://%s/run/other.sock", a->dir);
	char *marg = agt_printf("bad=%s", out_path);
	char *argv[] = {wft_exe("agent/wf-agent"),
	                "--config",
	                cfg,
	                "--floor-dir",
	                a->floor,
	                "--socket",
	                sock,
	                "--events",
	                a->ev_url,
	                "--model",
	                marg,
	                NULL};
	rc = agt_run(argv, &out, &err, 20, a->dir);
	cr_assert_eq(rc, 1, "wf-agent with a model outside the roots: exit %d: %s", rc, err);
	cr_assert(strstr(err, "outside the model roots"), "stderr: %s", err);
	cr_assert_eq(agt_inode(sock + 6), 0, "socket file left behind");
}

/* ---- 4. unreadable model files (agent as uid 65534) ----------------------------------------- */

Test(agent, unreadable_model_file)
{
	require_root();
	struct agt *a = agt_new("agent-perm");
	const char *anc = untraversable_ancestor(a->dir);
	if (anc) {
		agt_fini();
		cr_skip_test("%s is not traversable by others: cannot run the agent as 65534", anc);
	}
	cr_assert_eq(chmod(a->dir, 0755), 0);
	cr_assert_eq(chown(a->run, 65534, 65534), 0);
	cr_assert_eq(mkdir(a->floor, 0750), 0);
	cr_assert_eq(chown(a->floor, 65534, 65534), 0);
	char *locked = agt_gen(a, "locked", 1, NULL);
	char *ok = agt_gen(a, "ok", 2, NULL);
	cr_assert_eq(chmod(locked, 0), 0);

	struct agt_opts o = {.drop = true, .uid = 65534, .gid = 65534};
	pid_t pid = agt_start(a, &o, NULL);
	char *procst = agt_printf("/proc/%d/status", (int)pid);
	char *pst = wft_read_file(procst, NULL);
	cr_assert(pst && strstr(pst, "\nUid:\t65534\t65534"), "agent is not uid 65534:\n%s", pst);

	/* registering a file the agent cannot read */
	Weightfloor__V1__Reply *r = agt_register(a, "locked", locked, false);
	cr_assert(r->code == ST(PERMISSION_DENIED) || r->code == ST(INVALID_ARGUMENT),
	          "register unreadable: %s (%s)", wf_proto_status_name(r->code), r->message);
	cr_assert(strstr(r->message, locked), "message does not name the file: %s", r->message);
	cr_assert(strstr(r->message, "Permission denied"), "message: %s", r->message);
	wf_ctl_reply_free(r);
	r = agt_list(a);
	cr_assert_eq(r->model_list->n_models, 0, "nothing registered");
	wf_ctl_reply_free(r);

	/* a file that becomes unreadable after registration */
	r = agt_register(a, "ok", ok, false);
	agt_expect_code(r, ST(OK), "register ok");
	char *hex = strdup(r->model_info->digest_hex);
	wf_ctl_reply_free(r);
	cr_assert_eq(chmod(ok, 0), 0);
	r = agt_ensure(a, "ok", true);
	cr_assert_neq(r->code, ST(OK), "ensure of an unreadable file succeeded");
	char *ensure_msg = strdup(r->message);
	Weightfloor__V1__Status ensure_code = r->code;
	wf_ctl_reply_free(r);
	r = agt_model(a, "ok");
	cr_assert_eq(agt_state(r), FS(FAILED));
	cr_assert(strstr(r->model_info->last_error, real(ok)), "last_error does not name %s: %s",
	          ok, r->model_info->last_error);
	cr_assert(strstr(r->model_info->last_error, "Permission denied"), "last_error: %s",
	          r->model_info->last_error);
	wf_ctl_reply_free(r);
	cr_assert_eq(agt_inode(agt_region_path(a, hex, NULL)), 0, "a failed region was left");

	/* it recovers once the file is readable again: FAILED is retried */
	cr_assert_eq(chmod(ok, 0644), 0);
	r = agt_ensure(a, "ok", true);
	agt_expect_code(r, ST(OK), "ensure after chmod 0644");
	cr_assert_eq(agt_state(r), FS(HOST));
	wf_ctl_reply_free(r);
	struct stat st;
	char *region = agt_region_path(a, hex, NULL);
	cr_assert_eq(stat(region, &st), 0);
	cr_assert_eq(st.st_uid, 65534);
	cr_assert_eq(st.st_mode & 07777, 0640);

	/* A failed materialization keeps its cause: an unreadable file is PERMISSION_DENIED, not
	 * INTERNAL. */
	cr_expect_eq(ensure_code, ST(PERMISSION_DENIED),
	             "ensure of an unreadable file answered %s (%s), want PERMISSION_DENIED",
	             wf_proto_status_name(ensure_code), ensure_msg);
	cr_assert_eq(agt_stop(a, 10000), 0);
}

/* ---- 5. a file truncated during materialization -------------------------------------------- */

static bool proc_has_open(pid_t pid, const char *path)
{
	char dir[64];
	snprintf(dir, sizeof dir, "/proc/%d/fd", (int)pid);
	DIR *d = opendir(dir);
	if (!d)
		return false;
	bool found = false;
	struct dirent *e;
	while (!found && (e = readdir(d))) {
		char p[512], target[PATH_MAX];
		snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
		ssize_t n = readlink(p, target, sizeof target - 1);
		if (n > 0) {
			target[n] = '\0';
			found = strcmp(target, path) == 0;
		}
	}
	closedir(d);
	return found;
}

Test(agent, file_truncated_during_materialization)
{
	struct agt *a = agt_new("agent-trunc");
	char *pm = agt_gen(a, "m", 5, NULL);
	char *rm = real(pm);
	char *marg = agt_printf("m=%s", pm);
	struct agt_opts o = {.env = {"WF_AGENT_FAULT_FILL_DELAY_MS=1500"}};
	pid_t pid = agt_start(a, &o, (const char *[]){"--model", marg, NULL});
	struct wf_ctl_sub *sub = agt_sub_synced(a, "ping", pm);

	Weightfloor__V1__Reply *r = agt_ensure(a, "m", false);
	agt_expect_code(r, ST(OK), "ensure without wait");
	cr_assert_eq(agt_state(r), FS(MATERIALIZING));
	char *hex = strdup(r->model_info->digest_hex);
	wf_ctl_reply_free(r);

	/* the materialization has the file open (and is held in the fault delay): cut it */
	int64_t end = agt_now_ms() + 10000;
	while (!proc_has_open(pid, rm)) {
		cr_assert(agt_now_ms() < end, "the agent never opened %s", rm);
		agt_sleep_ms(5);
	}
	agt_sleep_ms(100);
	off_t size = file_size(pm);
	cr_assert_eq(truncate(pm, size / 2), 0);

	r = agt_wait_settled(a, "m", 20000);
	cr_assert_eq(agt_state(r), FS(FAILED));
	const char *le = r->model_info->last_error;
	cr_assert(strstr(le, "changed") || strstr(le, "truncated"),
	          "last_error does not say changed/truncated: %s", le);
	cr_assert(strstr(le, rm), "last_error does not name the file: %s", le);
	wf_ctl_reply_free(r);

	/* nothing READY or half-written is left under the model's name */
	char *region = agt_region_path(a, hex, NULL);
	cr_assert_eq(agt_inode(region), 0, "%s left behind", region);
	DIR *d = opendir(a->floor);
	cr_assert_not_null(d);
	struct dirent *e;
	while ((e = readdir(d)))
		cr_assert(strncmp(e->d_name, "wf-", 3) != 0 || strchr(e->d_name, '.'),
		          "region file %s left in the floor dir", e->d_name);
	closedir(d);
	int rc = 0;
	agt_attach_reader(a, hex, &rc);
	cr_assert_eq(rc, -ENOENT, "reader attach after the failure: %s", wf_err_name(rc));

	/* an ERROR event told subscribers */
	bool got_error = false;
	end = agt_now_ms() + 5000;
	while (!got_error && agt_now_ms() < end) {
		Weightfloor__V1__Event *ev = NULL;
		if (wf_ctl_sub_recv(sub, 100, &ev, NULL) != 0)
			continue;
		if (ev->kind == EK(ERROR) && strcmp(ev->model, "m") == 0) {
			got_error = true;
			cr_assert_neq(ev->code, ST(OK));
			cr_assert(strstr(ev->message, "changed") ||
			              strstr(ev->message, "truncated"),
			          "%s", ev->message);
		}
		wf_ctl_event_free(ev);
	}
	wf_ctl_sub_close(sub);
	cr_assert(got_error, "no ERROR event for the failed materialization");
	cr_assert_eq(agt_stop(a, 10000), 0);
}

/* ---- 7. peers with another uid ------------------------------------------------------------- */

Test(agent, peer_uid_checks)
{
	require_root();
	struct agt *a = agt_new("agent-peer");
	const char *anc = untraversable_ancestor(a->dir);
	if (anc) {
		agt_fini();
		cr_skip_test("%s is not traversable by others: cannot connect as 65534", anc);
	}
	cr_assert_eq(chmod(a->dir, 0755), 0);
	const char *status[] = {"status", NULL};

	/* default: the socket file is 0660 root:root, so 65534 cannot even connect */
	agt_start(a, NULL, NULL);
	struct stat st;
	cr_assert_eq(stat(a->sock_path, &st), 0);
	cr_assert_eq(st.st_mode & 07777, 0660, "socket mode %o", st.st_mode & 07777);
	char *line = helper_call(a, true, 65534, 65534, status);
	cr_assert(strncmp(line, "OPEN WF_EPERMISSION ", 20) == 0, "uid 65534, 0660 socket: %s",
	          line);

	/* a connectable socket file: the server's own uid check refuses the peer */
	cr_assert_eq(chmod(a->sock_path, 0666), 0);
	line = helper_call(a, true, 65534, 65534, status);
	cr_assert(strncmp(line, "REPLY PERMISSION_DENIED 0 ", 26) == 0,
	          "uid 65534 on a 0666 socket: %s", line);
	/* root is always served, and the agent keeps serving */
	line = helper_call(a, false, 0, 0, status);
	cr_assert(strncmp(line, "REPLY OK ", 9) == 0, "root: %s", line);
	cr_assert_eq(agt_stop(a, 10000), 0);

	/* --allow-uid 65534: the same peer is served */
	agt_start(a, NULL, (const char *[]){"--allow-uid", "65534", NULL});
	cr_assert_eq(chmod(a->sock_path, 0666), 0);
	line = helper_call(a, true, 65534, 65534, status);
	cr_assert(strncmp(line, "REPLY OK ", 9) == 0, "--allow-uid 65534: %s", line);
	line = helper_call(a, true, 65533, 65533, status);
	cr_assert(strncmp(line, "REPLY PERMISSION_DENIED 0 ", 26) == 0, "uid 65533: %s", line);
	cr_assert_eq(agt_stop(a, 10000), 0);

	/* the designed path: --group gives the socket file to a group, allowed_gids admits it */
	char *cfg = agt_printf("%s/agent.json", a->dir);
	write_file(cfg, "{\"allowed_gids\": [65534]}", 0644);
	agt_start(a, NULL, (const char *[]){"--config", cfg, "--group", "65534", NULL});
	cr_assert_eq(stat(a->sock_path, &st), 0);
	cr_assert_eq(st.st_gid, 65534, "socket group %u", (unsigned)st.st_gid);
	cr_assert_eq(st.st_mode & 07777, 0660);
	line = helper_call(a, true, 65533, 65534, status);
	cr_assert(strncmp(line, "REPLY OK ", 9) == 0, "uid 65533 gid 65534: %s", line);
	line = helper_call(a, true, 65533, 65533, status);
	cr_assert(strncmp(line, "OPEN WF_EPERMISSION ", 20) == 0, "uid 65533 gid 65533: %s", line);
	cr_assert_eq(agt_stop(a, 10000), 0);
}

/* ---- 8. host budget and LRU ---------------------------------------------------------------- */

static uint64_t region_size_of(const char *path)
{
	struct wf_model *m = NULL;
	struct wf_diag d = {{0}};
	int rc = wf_model_open(path, &m, &d);
	cr_assert_eq(rc, 0, "%s: %s", path, wf_diag_str(&d, rc));
	struct wf_shm_layout lay;
	rc = wf_shm_layout_compute(m, 0, &lay, &d);
	cr_assert_eq(rc, 0, "layout: %s", wf_diag_str(&d, rc));
	wf_model_close(m);
	return lay.total_size;
}

static void set_mtime(const char *path, int ago_s)
{
	struct timespec ts[2];
	clock_gettime(CLOCK_REALTIME, &ts[0]);
	ts[0].tv_sec -= ago_s;
	ts[1] = ts[0];
	cr_assert_eq(utimensat(AT_FDCWD, path, ts, 0), 0);
}

Test(agent, host_budget_lru_pins_and_holders)
{
	struct agt *a = agt_new("agent-lru");
	char *p[3];
	const char *names[3] = {"a", "b", "c"};
	uint64_t rs = 0;
	for (int i = 0; i < 3; i++) {
		p[i] = agt_gen(a, names[i], i + 1, NULL);
		set_mtime(p[i], 300 - 100 * i); /* distinct digests whatever the clock resolution */
		uint64_t s = region_size_of(p[i]);
		rs = s > rs ? s : rs;
	}
	uint64_t budget = 2 * rs + rs / 2; /* two floors fit, three do not */
	char sbudget[32];
	snprintf(sbudget, sizeof sbudget, "%llu", (unsigned long long)budget);
	char *ma = agt_printf("a=%s", p[0]), *mb = agt_printf("b=%s", p[1]),
	     *mc = agt_printf("c=%s", p[2]);
	agt_start(a, NULL,
	          (const char *[]){"--host-budget", sbudget, "--model", ma, "--model", mb,
	                           "--model", mc, NULL});
	char *hb = agt_digest_of(a, "b");
	char *region_b = agt_region_path(a, hb, NULL);

	agt_ensure_ok(a, "a");
	agt_ensure_ok(a, "b");
	agt_ensure_ok(a, "a"); /* touch a: b is now the least recently used */
	cr_assert_neq(agt_inode(region_b), 0);
	agt_ensure_ok(a, "c");
	expect_state(a, "a", FS(HOST));
	expect_state(a, "b", FS(DISK));
	expect_state(a, "c", FS(HOST));
	cr_assert_eq(agt_inode(region_b), 0, "the evicted floor's region is still there");
	Weightfloor__V1__Reply *r = agt_status(a);
	cr_assert_eq(r->agent_status->host_budget_bytes, budget);
	cr_assert_leq(r->agent_status->host_used_bytes, budget);
	wf_ctl_reply_free(r);

	/* pinned floors are never evicted: no room for b */
	r = agt_pin(a, "a", true);
	agt_expect_code(r, ST(OK), "pin a");
	cr_assert_eq(agt_state(r), FS(PINNED_HOST));
	wf_ctl_reply_free(r);
	r = agt_pin(a, "c", true);
	agt_expect_code(r, ST(OK), "pin c");
	wf_ctl_reply_free(r);
	r = agt_ensure(a, "b", true);
	agt_expect_code(r, ST(RESOURCE_EXHAUSTED), "ensure b with a and c pinned");
	cr_assert(strstr(r->message, "budget"), "message does not name the budget: %s", r->message);
	cr_assert(strstr(r->message, "'b'"), "message does not name the model: %s", r->message);
	wf_ctl_reply_free(r);
	expect_state(a, "a", FS(PINNED_HOST));
	expect_state(a, "c", FS(PINNED_HOST));
	cr_assert_neq(agt_state(agt_model(a, "b")), FS(HOST));
	char *out, *err;
	int rc = agt_ctl(a, &out, &err, (const char *[]){"floor", "ensure", "b", NULL});
	cr_assert_eq(rc, 5, "agentctl floor ensure b over budget: exit %d", rc);
	cr_assert(strstr(err, "RESOURCE_EXHAUSTED") && strstr(err, "budget"), "stderr: %s", err);

	/* a floor another process holds is never evicted either */
	for (int i = 0; i < 3; i += 2) {
		r = agt_release(a, names[i]);
		agt_expect_code(r, ST(OK), "release");
		cr_assert_eq(agt_state(r), FS(DISK));
		wf_ctl_reply_free(r);
	}
	agt_ensure_ok(a, "b");
	struct wf_shm_region *held = agt_attach_reader(a, hb, NULL);
	uint64_t ino_b = agt_inode(region_b);
	agt_ensure_ok(a, "a");
	agt_ensure_ok(a, "c"); /* b is the LRU but held: a goes */
	expect_state(a, "b", FS(HOST));
	expect_state(a, "a", FS(DISK));
	expect_state(a, "c", FS(HOST));
	agt_ensure_ok(a, "a"); /* b still held: c goes */
	expect_state(a, "b", FS(HOST));
	expect_state(a, "c", FS(DISK));
	expect_state(a, "a", FS(HOST));
	cr_assert_eq(agt_inode(region_b), ino_b, "the held floor was replaced");
	r = agt_model(a, "b");
	cr_assert_geq(r->model_info->holder_count, 2);
	cr_assert(has_pid(r->model_info, getpid()));
	wf_ctl_reply_free(r);
	cr_assert_eq(wf_shm_region_verify(held, NULL), 0);

	/* once the reader lets go, b is evictable again */
	wf_shm_region_detach(held);
	agt_ensure_ok(a, "c");
	expect_state(a, "b", FS(DISK));
	expect_state(a, "a", FS(HOST));
	expect_state(a, "c", FS(HOST));
	cr_assert_eq(agt_inode(region_b), 0);
	cr_assert_eq(agt_stop(a, 10000), 0);
}

/* ---- 9. restart: re-adoption and cleanup ---------------------------------------------------- */

Test(agent, restart_readopts_and_cleans)
{
	struct agt *a = agt_new("agent-restart");
	char *pm = agt_gen(a, "m", 11, NULL);
	char *px = agt_gen(a, "x", 12, NULL);
	char *marg = agt_printf("m=%s", pm), *xarg = agt_printf("x=%s", px);
	pid_t pid1 = agt_start(a, NULL, (const char *[]){"--model", marg, "--model", xarg, NULL});
	agt_ensure_ok(a, "m");
	agt_ensure_ok(a, "x");
	char *hm = agt_digest_of(a, "m"), *hx = agt_digest_of(a, "x");
	char *region = agt_region_path(a, hm, NULL), *region_x = agt_region_path(a, hx, NULL);
	uint64_t ino = agt_inode(region);
	cr_assert_neq(ino, 0);

	int64_t t0 = agt_now_ms();
	int rc = agt_stop(a, 10000);
	int64_t took = agt_now_ms() - t0;
	/* 0: it exited on SIGTERM within agt_stop's 10 s (after them it is killed: -1). */
	cr_assert_eq(rc, 0, "SIGTERM: exit status %d after %lld ms", rc, (long long)took);
	cr_assert_eq(kill(pid1, 0), -1);
	char *log = agt_log(a);
	cr_assert(strstr(log, "floors stay"), "log:\n%s", log);
	cr_assert_eq(agt_inode(region), ino, "the floor did not survive the agent");
	cr_assert_neq(agt_inode(region_x), 0);
	cr_assert_eq(agt_inode(a->sock_path), 0, "socket file left after exit");

	/* debris for the next agent: a broken region, orphaned lock files */
	const char *broken_hex = "0123456789abcdef0123456789abcdef";
	const char *orphan_hex = "fedcba9876543210fedcba9876543210";
	char *broken = agt_region_path(a, broken_hex, NULL);
	char garbage[8192];
	for (size_t i = 0; i < sizeof garbage; i++)
		garbage[i] = (char)(i * 131 + 7);
	int fd = open(broken, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
	cr_assert_geq(fd, 0);
	cr_assert_eq(write(fd, garbage, sizeof garbage), (ssize_t)sizeof garbage);
	close(fd);
	char *og = agt_region_path(a, orphan_hex, ".guard");
	char *oh = agt_region_path(a, orphan_hex, ".holders");
	write_file(og, "", 0660);
	write_file(oh, "", 0660);

	/* the new agent knows m but not x */
	pid_t pid2 = agt_start(a, NULL, (const char *[]){"--model", marg, NULL});
	Weightfloor__V1__Reply *r = agt_model(a, "m");
	agt_expect_code(r, ST(OK), "status m");
	cr_assert_eq(agt_state(r), FS(HOST), "m is %s right after the restart",
	             agt_state_name(agt_state(r)));
	cr_assert(has_pid(r->model_info, pid2), "the new agent does not hold the floor");
	cr_assert_eq(r->model_info->progress->started_unix_ms, 0,
	             "the new agent materialized instead of adopting");
	wf_ctl_reply_free(r);
	cr_assert_eq(agt_inode(region), ino, "the region was rebuilt");
	agt_ensure_ok(a, "m");
	cr_assert_eq(agt_inode(region), ino, "ensure rebuilt the adopted region");

	log = agt_log(a);
	cr_assert(strstr(log, "re-adopted"), "log:\n%s", log);
	cr_assert(strstr(log, "1 floors re-adopted"), "log:\n%s", log);
	cr_assert(strstr(log, "3 broken or unowned removed"), "log:\n%s", log);
	cr_assert_null(strstr(log, "MATERIALIZING"), "log:\n%s", log);
	cr_assert_eq(agt_inode(broken), 0, "broken region not removed");
	cr_assert_eq(agt_inode(og), 0, "orphaned guard not removed");
	cr_assert_eq(agt_inode(oh), 0, "orphaned holders not removed");
	cr_assert_eq(agt_inode(region_x), 0, "unowned, unheld region not removed");
	char names[1024];
	/* region, guard, holders and the agent's keep marker */
	cr_assert_eq(agt_dir_count(a->floor, names, sizeof names), 4, "floor dir: %s", names);

	struct wf_shm_region *reg = agt_attach_reader(a, hm, NULL);
	cr_assert_eq(wf_shm_region_verify(reg, NULL), 0);
	wf_shm_region_detach(reg);
	cr_assert_eq(agt_stop(a, 10000), 0);
}

/* ---- 10. robustness ------------------------------------------------------------------------ */

static Weightfloor__V1__Reply *raw_exchange(nng_socket s, const void *buf, size_t len)
{
	cr_assert_eq(nng_send(s, (void *)buf, len, 0), 0);
	void *rb = NULL;
	size_t rl = 0;
	int rv = nng_recv(s, &rb, &rl, NNG_FLAG_ALLOC);
	cr_assert_eq(rv, 0, "no reply to a raw message: %s", nng_strerror(rv));
	Weightfloor__V1__Reply *r = weightfloor__v1__reply__unpack(NULL, rl, rb);
	nng_free(rb, rl);
	cr_assert_not_null(r, "the reply does not parse");
	return r;
}

Test(agent, malformed_and_invalid_requests)
{
	struct agt *a = agt_new("agent-robust");
	char *pm = agt_gen(a, "m", 3, NULL);
	char *marg = agt_printf("m=%s", pm);
	pid_t pid = agt_start(a, NULL, (const char *[]){"--model", marg, NULL});

	nng_socket s;
	cr_assert_eq(nng_req0_open(&s), 0);
	cr_assert_eq(nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, 10000), 0);
	cr_assert_eq(nng_socket_set_ms(s, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE), 0);
	cr_assert_eq(nng_dial(s, a->sock_url, NULL, 0), 0);
	unsigned char junk[64];
	memset(junk, 0xff, sizeof junk);
	Weightfloor__V1__Reply *r = raw_exchange(s, junk, sizeof junk);
	cr_assert_eq(r->code, ST(INVALID_ARGUMENT), "garbage: %s", wf_proto_status_name(r->code));
	cr_assert_eq(r->request_id, 0);
	weightfloor__v1__reply__free_unpacked(r, NULL);

	/* well-formed envelopes the server must still refuse */
	Weightfloor__V1__Request req = WEIGHTFLOOR__V1__REQUEST__INIT;
	Weightfloor__V1__AgentStatus as = WEIGHTFLOOR__V1__AGENT_STATUS__INIT;
	req.request_id = 77;
	req.api_version = (WF_PROTO_API_MAJOR + 1) << 16;
	req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_AGENT_STATUS;
	req.agent_status = &as;
	uint8_t buf[256];
	size_t n = weightfloor__v1__request__pack(&req, buf);
	r = raw_exchange(s, buf, n);
	cr_assert_eq(r->code, ST(INVALID_ARGUMENT), "api major 2: %s",
	             wf_proto_status_name(r->code));
	cr_assert_eq(r->request_id, 77);
	weightfloor__v1__reply__free_unpacked(r, NULL);
	req.api_version = WF_PROTO_API_VERSION;
	req.request_id = 78;
	req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY__NOT_SET;
	n = weightfloor__v1__request__pack(&req, buf);
	r = raw_exchange(s, buf, n);
	cr_assert_eq(r->code, ST(INVALID_ARGUMENT), "no body: %s", wf_proto_status_name(r->code));
	cr_assert_eq(r->request_id, 78);
	weightfloor__v1__reply__free_unpacked(r, NULL);
	nng_close(s);

	/* still serving */
	r = agt_status(a);
	agt_expect_code(r, ST(OK), "status after garbage");
	cr_assert_eq(r->agent_status->pid, (uint32_t)pid);
	wf_ctl_reply_free(r);

	/* unknown models */
	r = agt_ensure(a, "nope", true);
	agt_expect_code(r, ST(NOT_FOUND), "ensure unknown");
	cr_assert(strstr(r->message, "nope"), "%s", r->message);
	wf_ctl_reply_free(r);
	r = agt_model(a, "nope");
	agt_expect_code(r, ST(NOT_FOUND), "status unknown");
	wf_ctl_reply_free(r);
	r = agt_release(a, "nope");
	agt_expect_code(r, ST(NOT_FOUND), "release unknown");
	wf_ctl_reply_free(r);
	r = agt_pin(a, "nope", true);
	agt_expect_code(r, ST(NOT_FOUND), "pin unknown");
	wf_ctl_reply_free(r);

	/* bad RegisterModel requests */
	r = agt_register_paths(a, "zero", NULL, 0);
	agt_expect_code(r, ST(INVALID_ARGUMENT), "register with 0 paths");
	wf_ctl_reply_free(r);
	char *two[] = {pm, pm};
	r = agt_register_paths(a, "two", two, 2);
	agt_expect_code(r, ST(INVALID_ARGUMENT), "register with 2 paths");
	wf_ctl_reply_free(r);
	r = agt_register(a, "has space", pm, false);
	agt_expect_code(r, ST(INVALID_ARGUMENT), "name with a space");
	cr_assert(strstr(r->message, "has space"), "%s", r->message);
	wf_ctl_reply_free(r);
	r = agt_register(a, "", pm, false);
	agt_expect_code(r, ST(INVALID_ARGUMENT), "empty name");
	wf_ctl_reply_free(r);
	char longname[200];
	memset(longname, 'n', sizeof longname - 1);
	longname[sizeof longname - 1] = '\0';
	r = agt_register(a, longname, pm, false);
	agt_expect_code(r, ST(INVALID_ARGUMENT), "199-byte name");
	wf_ctl_reply_free(r);
	char *missing = agt_printf("%s/missing.gguf", a->models);
	r = agt_register(a, "missing", missing, false);
	cr_assert_neq(r->code, ST(OK));
	cr_assert(strstr(r->message, missing), "%s", r->message);
	wf_ctl_reply_free(r);
	char *text = agt_printf("%s/notes.gguf", a->models);
	write_file(text, "this is not a model\n", 0644);
	r = agt_register(a, "text", text, false);
	agt_expect_code(r, ST(INVALID_ARGUMENT), "a text file");
	wf_ctl_reply_free(r);

	r = agt_list(a);
	cr_assert_eq(r->model_list->n_models, 1, "bad registrations left models behind");
	wf_ctl_reply_free(r);
	r = agt_status(a);
	agt_expect_code(r, ST(OK), "status at the end");
	wf_ctl_reply_free(r);
	cr_assert_eq(agt_stop(a, 10000), 0);
}

/* ---- 11. events through agentctl watch ----------------------------------------------------- */

struct ev_line {
	uint64_t seq;
	char kind[32], model[64], state[32], message[128];
	uint64_t done, total;
};

static size_t parse_watch(const char *text, struct ev_line *v, size_t cap)
{
	size_t n = 0;
	const char *p = text;
	while (p && *p && n < cap) {
		const char *nl = strchr(p, '\n');
		size_t len = nl ? (size_t)(nl - p) : strlen(p);
		char *line = strndup(p, len);
		struct json_object *o = json_tokener_parse(line);
		cr_assert_not_null(o, "watch printed a line that is not JSON: %s", line);
		struct ev_line *e = &v[n++];
		e->seq = json_object_get_uint64(jget(o, "sequence"));
		snprintf(e->kind, sizeof e->kind, "%s", json_object_get_string(jget(o, "kind")));
		snprintf(e->model, sizeof e->model, "%s", json_object_get_string(jget(o, "model")));
		snprintf(e->state, sizeof e->state, "%s",
		         json_object_get_string(jget(o, "floor_state")));
		snprintf(e->message, sizeof e->message, "%s",
		         json_object_get_string(jget(o, "message")));
		e->done = json_object_get_uint64(jget(o, "bytes_done"));
		e->total = json_object_get_uint64(jget(o, "bytes_total"));
		json_object_put(o);
		free(line);
		p = nl ? nl + 1 : NULL;
	}
	return n;
}

Test(agent, watch_shows_states_and_progress)
{
	struct agt *a = agt_new("agent-watch");
	char *pm = agt_gen(a, "m", 4, NULL);
	char *pp = agt_gen(a, "ping", 9, NULL);
	char *marg = agt_printf("m=%s", pm);
	struct agt_opts o = {.env = {"WF_AGENT_FAULT_FILL_DELAY_MS=300"}};
	agt_start(a, &o, (const char *[]){"--model", marg, NULL});

	char *wout = agt_printf("%s/watch.out", a->dir);
	char *argv[] = {wft_exe("control/agentctl/agentctl"),
	                "--events",
	                a->ev_url,
	                "--json",
	                "watch",
	                "--for",
	                "5",
	                NULL};
	pid_t w = agt_spawn_to(argv, wout);
	/* PUB keeps no history: start only once watch is connected, and ping to prove it */
	int64_t end = agt_now_ms() + 10000;
	while (agt_event_peers(a) < 1) {
		cr_assert(agt_now_ms() < end, "agentctl watch never connected to %s", a->ev_url);
		agt_sleep_ms(10);
	}
	agt_sleep_ms(200);
	Weightfloor__V1__Reply *r;
	for (int i = 0; i < 3; i++) {
		r = agt_register(a, "ping", pp, false);
		wf_ctl_reply_free(r);
		agt_sleep_ms(100);
	}
	agt_ensure_ok(a, "m");
	r = agt_release(a, "m");
	agt_expect_code(r, ST(OK), "release");
	wf_ctl_reply_free(r);
	int rc = wait_child(w, 20000);
	char *text = wft_read_file(wout, NULL);
	cr_assert_eq(rc, 0, "agentctl watch exit %d: %s", rc, text);

	struct ev_line ev[256];
	size_t n = parse_watch(text, ev, 256);
	ssize_t i_ping = -1, i_mat = -1, i_prog = -1, i_host = -1, i_disk = -1;
	for (size_t i = 0; i < n; i++) {
		if (i > 0)
			cr_assert_eq(ev[i].seq, ev[i - 1].seq + 1, "events missed:\n%s", text);
		if (strcmp(ev[i].model, "ping") == 0 && i_ping < 0)
			i_ping = (ssize_t)i;
		if (strcmp(ev[i].model, "m") != 0)
			continue;
		if (!strcmp(ev[i].kind, "FLOOR_STATE") && !strcmp(ev[i].state, "MATERIALIZING"))
			i_mat = (ssize_t)i;
		if (!strcmp(ev[i].kind, "PROGRESS")) {
			cr_assert_gt(ev[i].total, 0);
			cr_assert_leq(ev[i].done, ev[i].total);
			i_prog = (ssize_t)i;
		}
		if (!strcmp(ev[i].kind, "FLOOR_STATE") && !strcmp(ev[i].state, "HOST"))
			i_host = (ssize_t)i;
		if (!strcmp(ev[i].kind, "FLOOR_STATE") && !strcmp(ev[i].state, "DISK"))
			i_disk = (ssize_t)i;
	}
	cr_assert_geq(i_ping, 0, "watch saw none of the pings (not subscribed in time):\n%s", text);
	cr_assert_gt(i_mat, i_ping, "no MATERIALIZING for m:\n%s", text);
	cr_assert_gt(i_prog, i_mat, "no PROGRESS for m after MATERIALIZING:\n%s", text);
	cr_assert_gt(i_host, i_prog, "no HOST for m after its progress:\n%s", text);
	cr_assert_eq(ev[i_prog].done, ev[i_prog].total, "last progress is not complete");
	cr_assert_str_eq(ev[i_host].message, "ready");
	cr_assert_gt(i_disk, i_host, "no DISK after release:\n%s", text);
	cr_assert_str_eq(ev[i_disk].message, "released");

	/* the human form of the same */
	char *out, *err;
	rc = agt_ctl(a, &out, &err, (const char *[]){"watch", "--count", "1", "--for", "1", NULL});
	cr_assert_eq(rc, 0, "agentctl watch (table): exit %d: %s", rc, err);
	cr_assert_eq(agt_stop(a, 10000), 0);
}

/* Registering an already registered model again is idempotent: it must not announce a state
 * the model is not in. */
Test(agent, reregistration_does_not_announce_a_false_state)
{
	struct agt *a = agt_new("agent-rereg");
	char *pm = agt_gen(a, "m", 4, NULL);
	char *pp = agt_gen(a, "ping", 9, NULL);
	char *marg = agt_printf("m=%s", pm);
	agt_start(a, NULL, (const char *[]){"--model", marg, NULL});
	agt_ensure_ok(a, "m");
	struct wf_ctl_sub *sub = agt_sub_synced(a, "ping", pp);
	Weightfloor__V1__Reply *r = agt_register(a, "m", pm, false);
	agt_expect_code(r, ST(OK), "register m again");
	cr_assert_eq(agt_state(r), FS(HOST));
	wf_ctl_reply_free(r);
	/* a marker after it (a new name, so it is announced): every event for m comes before it */
	r = agt_register(a, "ping2", pp, false);
	wf_ctl_reply_free(r);
	bool marker = false;
	int false_disk = 0;
	int64_t end = agt_now_ms() + 5000;
	while (!marker && agt_now_ms() < end) {
		Weightfloor__V1__Event *ev = NULL;
		if (wf_ctl_sub_recv(sub, 100, &ev, NULL) != 0)
			continue;
		if (!strcmp(ev->model, "m") && ev->kind == EK(FLOOR_STATE) &&
		    ev->floor_state != FS(HOST))
			false_disk++;
		if (!strcmp(ev->model, "ping2"))
			marker = true;
		wf_ctl_event_free(ev);
	}
	wf_ctl_sub_close(sub);
	cr_assert(marker);
	expect_state(a, "m", FS(HOST));
	/* An idempotent re-registration of a HOST model announces nothing: a subscriber mirroring
	 * states must not believe the floor was dropped. */
	cr_expect_eq(false_disk, 0,
	             "re-registering a HOST model published %d FLOOR_STATE event(s) with another "
	             "state",
	             false_disk);
	cr_assert_eq(agt_stop(a, 10000), 0);
}

/* ---- 12. flag and configuration errors ----------------------------------------------------- */

/* Runs wf-agent with extra flags, expects it to refuse; returns its stderr (malloc'ed). */
static char *expect_refusal(struct agt *a, char **extra, int want_rc, const char *want_msg)
{
	char *argv[32];
	int n = 0;
	argv[n++] = wft_exe("agent/wf-agent");
	argv[n++] = "--floor-dir";
	argv[n++] = a->floor;
	argv[n++] = "--socket";
	argv[n++] = a->sock_url;
	argv[n++] = "--events";
	argv[n++] = a->ev_url;
	for (size_t i = 0; extra[i]; i++)
		argv[n++] = extra[i];
	argv[n] = NULL;
	char *out, *err;
	int64_t t0 = agt_now_ms();
	int rc = agt_run(argv, &out, &err, 20, a->dir);
	cr_assert_eq(rc, want_rc, "wf-agent %s ...: exit %d, want %d; stderr: %s", extra[0], rc,
	             want_rc, err);
	cr_assert(strstr(err, want_msg), "wf-agent %s ...: stderr does not say '%s': %s", extra[0],
	          want_msg, err);
	cr_assert_lt(agt_now_ms() - t0, 10000);
	cr_assert_eq(agt_inode(a->sock_path), 0, "socket file left by a refused start");
	cr_assert_eq(agt_inode(a->ev_path), 0, "events socket file left by a refused start");
	free(out);
	return err;
}

Test(agent, flag_and_config_errors)
{
	struct agt *a = agt_new("agent-flags");
	char *pm = agt_gen(a, "m", 2, NULL);
	char *bad_key = agt_printf("%s/typo.json", a->dir);
	write_file(bad_key, "{\"floor_dirr\": \"/tmp/x\"}", 0644);
	char *bad_json = agt_printf("%s/broken.json", a->dir);
	write_file(bad_json, "{\"host_budget\": ", 0644);
	char *bad_budget = agt_printf("%s/budget.json", a->dir);
	write_file(bad_budget, "{\"host_budget\": \"lots\"}", 0644);
	char *missing = agt_printf("%s/absent/agent.json", a->dir);
	char *marg = agt_printf("m=%s", pm);
	char *mmissing = agt_printf("m=%s/models/absent.gguf", a->dir);

	expect_refusal(a, (char *[]){"--config", bad_key, NULL}, 1, "floor_dirr");
	char *err_json =
	    expect_refusal(a, (char *[]){"--config", bad_json, NULL}, 1, "invalid JSON");
	expect_refusal(a, (char *[]){"--config", bad_budget, NULL}, 1, "host_budget");
	expect_refusal(a, (char *[]){"--config", missing, NULL}, 1, missing);
	expect_refusal(a, (char *[]){"--host-budget", "lots", NULL}, 1, "lots");
	expect_refusal(a, (char *[]){"--io-backend", "floppy", NULL}, 1, "--io-backend");
	expect_refusal(a, (char *[]){"--model", "noequals", NULL}, 2, "NAME=PATH");
	expect_refusal(a, (char *[]){"--allow-uid", "bob", NULL}, 2, "bob");
	expect_refusal(a, (char *[]){"--no-such-flag", NULL}, 2, "usage");
	expect_refusal(a, (char *[]){"--model", mmissing, NULL}, 1, "absent.gguf");
	expect_refusal(a, (char *[]){"--model", marg, "--model", marg, NULL}, 1, "given twice");
	expect_refusal(a, (char *[]){"--group", "no-such-group-wf", NULL}, 1, "no-such-group-wf");

	/* Errors found while parsing the file name it, and json-c's "continue" (input ended early)
	 * is said in words. */
	cr_expect(strstr(err_json, bad_json), "a JSON syntax error does not name the file: %s",
	          err_json);

	/* --check-config validates and exits 0 without serving */
	char *argv[] = {wft_exe("agent/wf-agent"),
	                "--floor-dir",
	                a->floor,
	                "--socket",
	                a->sock_url,
	                "--events",
	                a->ev_url,
	                "--model",
	                marg,
	                "--check-config",
	                NULL};
	char *out, *err;
	int rc = agt_run(argv, &out, &err, 20, a->dir);
	cr_assert_eq(rc, 0, "--check-config: exit %d: %s", rc, err);
	cr_assert(strstr(out, "configuration valid") && strstr(out, "1 models"), "%s", out);
	cr_assert_eq(agt_inode(a->sock_path), 0);
}

/* ---- 13. --daemonize ----------------------------------------------------------------------- */

Test(agent, daemonize_exits_once_serving)
{
	struct agt *a = agt_new("agent-daemon");
	char *pm = agt_gen(a, "m", 2, NULL);
	char *marg = agt_printf("m=%s", pm);
	char *argv[] = {wft_exe("agent/wf-agent"),
	                "--floor-dir",
	                a->floor,
	                "--socket",
	                a->sock_url,
	                "--events",
	                a->ev_url,
	                "--model",
	                marg,
	                "--daemonize",
	                NULL};
	char *out, *err;
	int rc = agt_run(argv, &out, &err, 30, a->dir);
	cr_assert_eq(rc, 0, "wf-agent --daemonize: exit %d: %s", rc, err);
	/* serving already: no retries */
	rc = agt_ctl(a, &out, &err, (const char *[]){"--json", "status", NULL});
	cr_assert_eq(rc, 0, "agentctl status right after --daemonize: exit %d: %s", rc, err);
	struct json_object *o = parse_json(out, "status --json");
	pid_t pid = (pid_t)json_object_get_int64(jget(o, "pid"));
	json_object_put(o);
	agt_track_pid(pid);
	cr_assert_gt(pid, 0);
	char *stat_path = agt_printf("/proc/%d/stat", (int)pid);
	char *pst = wft_read_file(stat_path, NULL);
	cr_assert_not_null(pst);
	/* fields: pid (comm) state ppid pgrp session: the daemon leads its own session */
	char *rp = strrchr(pst, ')');
	int ppid = 0, pgrp = 0, sid = 0;
	char state;
	cr_assert_eq(sscanf(rp + 2, "%c %d %d %d", &state, &ppid, &pgrp, &sid), 4);
	cr_assert_eq(sid, pid, "the daemon is not a session leader");
	rc = agt_ctl(a, &out, &err, (const char *[]){"floor", "ensure", "m", NULL});
	cr_assert_eq(rc, 0, "floor ensure: %s", err);

	cr_assert_eq(kill(pid, SIGTERM), 0);
	int64_t end = agt_now_ms() + 10000;
	while (kill(pid, 0) == 0) {
		/* a zombie until init reaps it: look at the state */
		char *s = wft_read_file(stat_path, NULL);
		bool zombie = s && strstr(s, ") Z ");
		free(s);
		if (zombie)
			break;
		cr_assert(agt_now_ms() < end, "the daemon did not stop on SIGTERM");
		agt_sleep_ms(20);
	}
	cr_assert_eq(agt_inode(a->sock_path), 0, "socket file left after stop");
}

/* ---- shutdown while materializing ---------------------------------------------------------- */

Test(agent, sigterm_during_materialization)
{
	struct agt *a = agt_new("agent-term");
	char *pm = agt_gen(a, "m", 6, NULL);
	char *marg = agt_printf("m=%s", pm);
	struct agt_opts o = {.env = {"WF_AGENT_FAULT_FILL_DELAY_MS=20000"}};
	agt_start(a, &o, (const char *[]){"--model", marg, NULL});
	Weightfloor__V1__Reply *r = agt_ensure(a, "m", false);
	agt_expect_code(r, ST(OK), "ensure");
	cr_assert_eq(agt_state(r), FS(MATERIALIZING));
	char *hex = strdup(r->model_info->digest_hex);
	wf_ctl_reply_free(r);
	/* a waiting client: it must get an answer (or a dropped connection), not hang */
	char *wout = agt_printf("%s/waiter.out", a->dir);
	char *argv[] = {
	    wft_exe("tests/agent/agent_helper"), "call", a->sock_url, "ensure", "m", "30000", NULL};
	pid_t waiter = agt_spawn_to(argv, wout);
	agt_sleep_ms(500);

	int64_t t0 = agt_now_ms();
	int rc = agt_stop(a, 10000);
	/* 0: it exited on SIGTERM within agt_stop's 10 s (after them it is killed: -1). */
	cr_assert_eq(rc, 0, "exit status %d after %lld ms", rc, (long long)(agt_now_ms() - t0));
	rc = wait_child(waiter, 10000);
	char *line = wft_read_file(wout, NULL);
	cr_assert_eq(rc, 0, "waiting client: exit %d %s", rc, line ? line : "");
	cr_assert(line && (strncmp(line, "REPLY UNAVAILABLE", 17) == 0 ||
	                   strncmp(line, "CALL WF_ETRANSPORT", 18) == 0),
	          "waiting client got: %s", line ? line : "");
	/* the cancelled region is gone; a new agent starts clean */
	cr_assert_eq(agt_inode(agt_region_path(a, hex, NULL)), 0, "half-built region left");
	agt_start(a, NULL, (const char *[]){"--model", marg, NULL});
	expect_state(a, "m", FS(DISK));
	agt_ensure_ok(a, "m");
	cr_assert_eq(agt_stop(a, 10000), 0);
}

/* ---- the pread fallback reader ------------------------------------------------------------- */

Test(agent, pread_backend_materializes_the_same_bytes)
{
	struct agt *a = agt_new("agent-pread");
	char *pm = agt_gen(a, "m", 13, "16M");
	char *marg = agt_printf("m=%s", pm);
	agt_start(a, NULL, (const char *[]){"--io-backend", "pread", "--model", marg, NULL});
	Weightfloor__V1__Reply *r = agt_status(a);
	cr_assert_eq(r->agent_status->reader_backend,
	             WEIGHTFLOOR__V1__READER_BACKEND__READER_BACKEND_PREAD);
	wf_ctl_reply_free(r);
	agt_ensure_ok(a, "m");
	char *hex = agt_digest_of(a, "m");
	struct wf_shm_region *reg = agt_attach_reader(a, hex, NULL);
	struct wf_diag d = {{0}};
	int rc = wf_shm_region_verify(reg, &d);
	cr_assert_eq(rc, 0, "verify: %s", wf_diag_str(&d, rc));
	int fd = open(pm, O_RDONLY | O_CLOEXEC);
	cr_assert_geq(fd, 0);
	uint32_t nt = wf_shm_region_n_tensors(reg);
	for (uint32_t i = 0; i < nt; i++) {
		struct wf_shm_tensor_info ti;
		cr_assert_eq(wf_shm_region_tensor(reg, i, &ti), 0);
		void *buf = malloc(ti.nbytes);
		cr_assert_eq(pread(fd, buf, ti.nbytes, (off_t)ti.source_offset),
		             (ssize_t)ti.nbytes);
		cr_assert_eq(memcmp(buf, ti.data, ti.nbytes), 0, "tensor %s differs", ti.name);
		free(buf);
	}
	close(fd);
	wf_shm_region_detach(reg);
	cr_assert_eq(agt_stop(a, 10000), 0);
}
