/* wf-worker as a process, with and without its agent: no request waits on an agent that is not
 * there or does not answer longer than the client's deadline, and a slow agent call for one model
 * does not hold up requests for others; a second worker claiming a live worker's id exits with a
 * clear message; --device cuda:0 without a GPU says so in plain words. Real wf-agent and
 * wf-worker processes on ipc:// sockets (the agent harness, tests/agent/agt.h). */
#include "base/error.h"
#include "common/wftest.h"
#include "proto/status.h"
#include "tests/agent/agt.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

TestSuite(worker_daemon, .fini = agt_fini, .timeout = 120);

static int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void wkr_spawn(struct agt_worker *w, struct agt *a, const char *id, const char *agent_url,
                      const char *const *extra)
{
	agt_spawn_worker(a, w, id, agent_url, NULL, extra);
}

/* Waits for the worker to exit; its status (0..255, 128+signal), or -1 at the time-out. */
static int wkr_wait_exit(struct agt_worker *w, int timeout_ms)
{
	int64_t end = now_ms() + timeout_ms;
	while (now_ms() < end) {
		int st;
		if (waitpid(w->pid, &st, WNOHANG) == w->pid)
			return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
		agt_sleep_ms(20);
	}
	return -1;
}

/* One request to url with its own client; *ret_ms is how long it took. Returns the call's rc;
 * on 0 *ret_reply is the caller's. */
static int call(const char *url, Weightfloor__V1__Request *req, int timeout_ms,
                Weightfloor__V1__Reply **ret_reply, int64_t *ret_ms, struct wf_diag *d)
{
	int64_t t0 = now_ms();
	int rc = agt_call_url(url, req, timeout_ms, ret_reply, d);
	*ret_ms = now_ms() - t0;
	return rc;
}

/* The model's residency on the worker (UNSPECIFIED when it does not list it). */
static Weightfloor__V1__Residency residency(const char *url, const char *model)
{
	int rc;
	Weightfloor__V1__Residency res = WEIGHTFLOOR__V1__RESIDENCY__RESIDENCY_UNSPECIFIED;
	Weightfloor__V1__Reply *r = agt_worker_status(url, 5000, &rc);
	cr_assert_eq(rc, 0);
	cr_assert_eq(r->body_case, WEIGHTFLOOR__V1__REPLY__BODY_WORKER_INFO);
	for (size_t i = 0; i < r->worker_info->n_models; i++)
		if (strcmp(r->worker_info->models[i]->model, model) == 0)
			res = r->worker_info->models[i]->state;
	wf_ctl_reply_free(r);
	return res;
}

enum cmd { CMD_PREFETCH, CMD_PIN, CMD_EVICT };

struct cmd_call {
	const char *url, *model;
	enum cmd cmd;
	int timeout_ms;
	int rc, code;
	char msg[512];
	int64_t ms;
};

static void *cmd_thread(void *arg)
{
	struct cmd_call *k = arg;
	Weightfloor__V1__Prefetch pf = WEIGHTFLOOR__V1__PREFETCH__INIT;
	Weightfloor__V1__Pin pin = WEIGHTFLOOR__V1__PIN__INIT;
	Weightfloor__V1__Evict ev = WEIGHTFLOOR__V1__EVICT__INIT;
	Weightfloor__V1__Request req = WEIGHTFLOOR__V1__REQUEST__INIT;
	switch (k->cmd) {
	case CMD_PREFETCH:
		pf.model = (char *)k->model;
		req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_PREFETCH;
		req.prefetch = &pf;
		break;
	case CMD_PIN:
		pin.model = (char *)k->model;
		req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_PIN;
		req.pin = &pin;
		break;
	case CMD_EVICT:
		ev.model = (char *)k->model;
		req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_EVICT;
		req.evict = &ev;
		break;
	}
	Weightfloor__V1__Reply *r = NULL;
	struct wf_diag d = {{0}};
	k->rc = call(k->url, &req, k->timeout_ms, &r, &k->ms, &d);
	if (k->rc == 0) {
		k->code = r->code;
		snprintf(k->msg, sizeof k->msg, "%s", r->message);
	} else {
		snprintf(k->msg, sizeof k->msg, "%s", wf_diag_str(&d, k->rc));
	}
	wf_ctl_reply_free(r);
	return NULL;
}

static struct cmd_call run_cmd(const char *url, enum cmd cmd, const char *model, int timeout_ms)
{
	struct cmd_call k = {.url = url, .model = model, .cmd = cmd, .timeout_ms = timeout_ms};
	cmd_thread(&k);
	return k;
}

/* The agent is not running: requests for models the worker was given answer at once (loaded from
 * their files), and a model only the agent could name fails at once with UNAVAILABLE. */
Test(worker_daemon, no_agent_no_wait)
{
	struct agt *a = agt_new("wd-noagent");
	char *pa = agt_gen(a, "A", 1, NULL);
	char decl[600];
	snprintf(decl, sizeof decl, "A=%s", pa);
	struct agt_worker w;
	wkr_spawn(&w, a, "w0", NULL, (const char *const[]){"--model", decl, NULL});
	agt_wait_worker_ready(&w);

	/* A worker that waited on the missing agent would spend the request's whole 20 s. */
	struct cmd_call k = run_cmd(w.url, CMD_PREFETCH, "A", 20000);
	cr_assert_eq(k.rc, 0, "Prefetch A: no reply (%s) after %lld ms", k.msg, (long long)k.ms);
	cr_expect_eq(k.code, WEIGHTFLOOR__V1__STATUS__STATUS_OK, "%s", k.msg);
	cr_expect_lt(k.ms, 10000, "Prefetch A took %lld ms", (long long)k.ms);
	cr_expect_eq(residency(w.url, "A"), WEIGHTFLOOR__V1__RESIDENCY__RESIDENCY_DEVICE);

	k = run_cmd(w.url, CMD_PIN, "ghost", 20000);
	cr_assert_eq(k.rc, 0, "Pin ghost: no reply (%s) after %lld ms", k.msg, (long long)k.ms);
	cr_expect_eq(k.code, WEIGHTFLOOR__V1__STATUS__STATUS_UNAVAILABLE, "%s %s",
	             wf_proto_status_name(k.code), k.msg);
	cr_expect(strstr(k.msg, "agent") != NULL, "%s", k.msg);
	cr_expect_lt(k.ms, 10000, "Pin ghost took %lld ms", (long long)k.ms);
}

/* The agent hangs (SIGSTOP): a request for a model only the agent knows fails within its
 * deadline, and meanwhile requests for other models (new ones declared with --model, and loaded
 * ones) and status are answered. */
Test(worker_daemon, hung_agent_bounded_and_not_serialized)
{
	struct agt *a = agt_new("wd-hung");
	char *pa = agt_gen(a, "A", 1, NULL), *pb = agt_gen(a, "B", 2, NULL),
	     *pc = agt_gen(a, "C", 3, NULL);
	agt_start(a, NULL, NULL);
	const char *names[] = {"A", "C"};
	const char *paths[] = {pa, pc};
	for (int i = 0; i < 2; i++) {
		Weightfloor__V1__Reply *r = agt_register(a, names[i], paths[i], false);
		cr_assert_eq(r->code, WEIGHTFLOOR__V1__STATUS__STATUS_OK, "%s", r->message);
		wf_ctl_reply_free(r);
	}
	char decl[600];
	snprintf(decl, sizeof decl, "B=%s", pb);
	struct agt_worker w;
	wkr_spawn(&w, a, "w0", NULL,
	          (const char *const[]){"--model", decl, "--prefetch", "A", NULL});
	agt_wait_worker_ready(&w);
	int64_t end = now_ms() + 30000;
	while (residency(w.url, "A") != WEIGHTFLOOR__V1__RESIDENCY__RESIDENCY_DEVICE) {
		cr_assert_lt(now_ms(), end, "A not loaded at start; log:\n%s", agt_worker_log(&w));
		agt_sleep_ms(50);
	}

	cr_assert_eq(kill(a->pid, SIGSTOP), 0);
	struct cmd_call kc = {.url = w.url, .model = "C", .cmd = CMD_PREFETCH, .timeout_ms = 8000};
	pthread_t th;
	cr_assert_eq(pthread_create(&th, NULL, cmd_thread, &kc), 0);

	struct cmd_call kb = run_cmd(w.url, CMD_PREFETCH, "B", 6000);
	int rc;
	/* Answered within its own 4 s, while C's Prefetch waits 8 s on the hung agent: not
	 * serialized behind it. */
	Weightfloor__V1__Reply *r = agt_worker_status(w.url, 4000, &rc);
	cr_expect_eq(rc, 0, "WorkerStatus while the agent hangs");
	wf_ctl_reply_free(r);
	struct cmd_call ka = run_cmd(w.url, CMD_EVICT, "A", 4000);
	pthread_join(th, NULL);
	/* agentctl straight at the worker: --timeout bounds a residency command too. */
	char *argv[] = {wft_exe("control/agentctl/agentctl"),
	                "--socket",
	                w.url,
	                "--timeout",
	                "3000",
	                "prefetch",
	                "C",
	                NULL};
	char *out = NULL, *err = NULL;
	int64_t t0 = now_ms();
	rc = agt_run(argv, &out, &err, 30, a->dir);
	int64_t ctl_ms = now_ms() - t0;
	kill(a->pid, SIGCONT);
	cr_expect_eq(rc, 4, "agentctl prefetch C: exit %d: %s", rc, err);
	/* Unbounded, it would wait on the hung agent until agt_run's 30 s. */
	cr_expect_lt(ctl_ms, 15000, "agentctl prefetch C took %lld ms", (long long)ctl_ms);
	cr_expect(strstr(err, "UNAVAILABLE") != NULL, "agentctl: %s", err);
	free(out);
	free(err);

	cr_expect_eq(kb.rc, 0, "Prefetch B (declared) waited: %s after %lld ms", kb.msg,
	             (long long)kb.ms);
	cr_expect_eq(kb.code, WEIGHTFLOOR__V1__STATUS__STATUS_OK, "Prefetch B: %s", kb.msg);
	cr_expect_eq(ka.rc, 0, "Evict A (loaded): %s after %lld ms", ka.msg, (long long)ka.ms);
	cr_expect_eq(ka.code, WEIGHTFLOOR__V1__STATUS__STATUS_OK, "Evict A: %s", ka.msg);
	cr_expect_eq(kc.rc, 0, "Prefetch C got no reply within its deadline: %s after %lld ms",
	             kc.msg, (long long)kc.ms);
	cr_expect_eq(kc.code, WEIGHTFLOOR__V1__STATUS__STATUS_UNAVAILABLE, "Prefetch C: %s %s",
	             wf_proto_status_name(kc.code), kc.msg);
}

static bool listed(struct agt *a, const char *id, pid_t pid)
{
	Weightfloor__V1__ListWorkers lw = WEIGHTFLOOR__V1__LIST_WORKERS__INIT;
	Weightfloor__V1__Request req = WEIGHTFLOOR__V1__REQUEST__INIT;
	req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_LIST_WORKERS;
	req.list_workers = &lw;
	Weightfloor__V1__Reply *r = agt_call(a, &req, 5000);
	bool found = false;
	cr_assert_eq(r->body_case, WEIGHTFLOOR__V1__REPLY__BODY_WORKER_LIST);
	for (size_t i = 0; i < r->worker_list->n_workers; i++)
		if (strcmp(r->worker_list->workers[i]->worker_id, id) == 0 &&
		    r->worker_list->workers[i]->pid == (uint32_t)pid)
			found = true;
	wf_ctl_reply_free(r);
	return found;
}

static void wait_listed(struct agt *a, const char *id, const struct agt_worker *w)
{
	int64_t end = now_ms() + 20000;
	while (!listed(a, id, w->pid)) {
		cr_assert_lt(now_ms(), end, "worker %s (pid %d) not registered; its log:\n%s", id,
		             (int)w->pid, agt_worker_log(w));
		agt_sleep_ms(50);
	}
}

/* A second worker with a live worker's id exits non-zero saying why; once the first is gone, a
 * new one takes the id. */
Test(worker_daemon, duplicate_id_exits)
{
	struct agt *a = agt_new("wd-dup");
	agt_start(a, NULL, NULL);
	struct agt_worker w1, w2, w3;
	wkr_spawn(&w1, a, "dup", NULL, (const char *const[]){NULL});
	wait_listed(a, "dup", &w1);

	/* Same id, its own endpoint. */
	char ep[600];
	snprintf(ep, sizeof ep, "ipc://%s/dup-2.sock", a->run);
	wkr_spawn(&w2, a, "dup", NULL, (const char *const[]){"--endpoint", ep, NULL});
	int st = wkr_wait_exit(&w2, 20000);
	char *log = agt_worker_log(&w2);
	cr_expect(st > 0 && st < 128, "the duplicate exits non-zero (status %d); its log:\n%s", st,
	          log);
	cr_expect(strstr(log, "already registered") != NULL, "says why:\n%s", log);
	free(log);
	cr_expect(listed(a, "dup", w1.pid), "the first keeps its registration");

	kill(w1.pid, SIGKILL);
	waitpid(w1.pid, NULL, 0);
	snprintf(ep, sizeof ep, "ipc://%s/dup-3.sock", a->run);
	wkr_spawn(&w3, a, "dup", NULL, (const char *const[]){"--endpoint", ep, NULL});
	wait_listed(a, "dup", &w3);
}

/* --device cuda:0 on a machine without a GPU (or its driver). */
Test(worker_daemon, cuda_without_gpu_says_so)
{
#ifndef WF_HAVE_CUDA
	cr_skip_test("wf-worker was built without CUDA");
#else
	if (access("/dev/nvidia0", F_OK) == 0)
		cr_skip_test("a GPU is present");
	struct agt *a = agt_new("wd-cuda");
	char ep[600];
	snprintf(ep, sizeof ep, "ipc://%s/w.sock", a->run);
	char *argv[] = {wft_exe("worker/wf-worker"),
	                "--device",
	                "cuda:0",
	                "--agent",
	                "none",
	                "--endpoint",
	                ep,
	                NULL};
	char *out = NULL, *err = NULL;
	int rc = agt_run(argv, &out, &err, 30, a->dir);
	cr_expect(rc > 0 && rc < 128, "exits non-zero (status %d)", rc);
	cr_expect(strstr(err, "no CUDA driver found") || strstr(err, "no CUDA GPU found"),
	          "plain message: %s", err);
	cr_expect(!strstr(err, "cudaError"), "no CUDA error names: %s", err);
	free(out);
	free(err);
#endif
}

/* More --pin (or --prefetch, --model) flags than the worker keeps: refused with a message, not a
 * silent exit 2. */
Test(worker_daemon, too_many_pins_says_so)
{
	struct agt *a = agt_new("wd-pins");
	enum { N = 258 };
	char *argv[2 * N + 2] = {wft_exe("worker/wf-worker")};
	char names[N][16];
	for (int i = 0; i < N; i++) {
		snprintf(names[i], sizeof names[i], "m%d", i);
		argv[1 + 2 * i] = "--pin";
		argv[2 + 2 * i] = names[i];
	}
	char *out = NULL, *err = NULL;
	int rc = agt_run(argv, &out, &err, 30, a->dir);
	cr_expect_eq(rc, 2, "exit status %d", rc);
	cr_expect(strstr(err, "--pin m256: at most 256 --pin flags"), "says why: '%s'", err);
	free(out);
	free(err);
}

static uint32_t agent_holders(struct agt *a, const char *model)
{
	Weightfloor__V1__Reply *r = agt_model(a, model);
	agt_expect_code(r, AGT_ST(OK), model);
	uint32_t n = r->model_info->holder_count;
	wf_ctl_reply_free(r);
	return n;
}

/* After the agent released a model's floor (and it went, nobody holding it), a worker loading the
 * model again asks the agent for the floor instead of quietly reading the files itself: the
 * node keeps one copy, and the agent sees the worker among its holders. */
Test(worker_daemon, a_reload_after_release_uses_the_floor_again)
{
	struct agt *a = agt_new("wd-refloor");
	char *pm = agt_gen(a, "m", 41, NULL);
	char *marg = NULL;
	cr_assert(asprintf(&marg, "m=%s", pm) > 0);
	agt_start(a, NULL, (const char *[]){"--model", marg, NULL});
	struct agt_worker w;
	wkr_spawn(&w, a, "w1", NULL, NULL);
	agt_wait_worker_ready(&w);

	struct cmd_call k = run_cmd(w.url, CMD_PIN, "m", 20000);
	cr_assert(k.rc == 0 && k.code == WEIGHTFLOOR__V1__STATUS__STATUS_OK, "pin: %s", k.msg);
	cr_assert_eq(agent_holders(a, "m"), 2, "agent and worker should hold the floor");
	char *hex = agt_digest_of(a, "m");
	char *region = agt_region_path(a, hex, NULL);

	/* the worker drops the model to DISK (and lets go of the floor), the agent releases: the
	 * floor goes */
	Weightfloor__V1__Unpin up = WEIGHTFLOOR__V1__UNPIN__INIT;
	up.model = "m";
	Weightfloor__V1__Request req = WEIGHTFLOOR__V1__REQUEST__INIT;
	req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_UNPIN;
	req.unpin = &up;
	Weightfloor__V1__Reply *r = NULL;
	int64_t ms;
	cr_assert_eq(call(w.url, &req, 10000, &r, &ms, NULL), 0);
	wf_ctl_reply_free(r);
	Weightfloor__V1__SetResidency sr = WEIGHTFLOOR__V1__SET_RESIDENCY__INIT;
	sr.model = "m";
	sr.target = WEIGHTFLOOR__V1__RESIDENCY__RESIDENCY_DISK;
	req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_SET_RESIDENCY;
	req.set_residency = &sr;
	cr_assert_eq(call(w.url, &req, 10000, &r, &ms, NULL), 0);
	agt_expect_code(r, AGT_ST(OK), "to DISK");
	wf_ctl_reply_free(r);
	r = agt_release(a, "m");
	agt_expect_code(r, AGT_ST(OK), "release");
	wf_ctl_reply_free(r);
	int64_t end = now_ms() + 5000;
	while (agt_inode(region) != 0 && now_ms() < end)
		agt_sleep_ms(20);
	cr_assert_eq(agt_inode(region), 0, "the released floor is still there");

	/* the next load comes from a floor again, which the agent made for it */
	k = run_cmd(w.url, CMD_PIN, "m", 20000);
	cr_assert(k.rc == 0 && k.code == WEIGHTFLOOR__V1__STATUS__STATUS_OK, "pin again: %s",
	          k.msg);
	cr_assert_neq(agt_inode(region), 0, "the worker loaded without a floor");
	cr_assert_eq(agent_holders(a, "m"), 2, "the worker does not hold the floor it loaded from");
	cr_assert_eq(agt_stop(a, 10000), 0);
}
