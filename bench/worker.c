/* wf-bench engine, the rows that need real processes: a wf-agent holding the model's floor and
 * wf-worker processes generating from it over the control plane (Generate / GenerateRead).
 *  private_memory_over_model  a worker that has generated from the model: RSS minus the floor's
 *                             resident pages (/proc/PID/smaps), over the model's size;
 *  first_token_vs_llama_cpp   a new worker, the floor already made: process start to its first
 *                             generated token, over llama-bench's whole run (model load, a
 *                             16-token prompt, one generated token) with a warm page cache;
 *  first_token_pinned_vs_unpinned  a worker computing the dense part on its device (the host
 *                             device throttled to 16 GB/s, --dense-on-device): Generate to the
 *                             first token with the model pinned beforehand (the engine computes
 *                             from the store's copies at once) over the same without (the
 *                             engine's build loads the dense set into the store first).
 * Children are started with PR_SET_PDEATHSIG so that a benchmark that dies takes them along. */
#include "anchors.h"
#include "bench.h"
#include "report.h"

#include "base/error.h"
#include "control/client.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define PROMPT_TOKENS 16

/* fork + exec with stdout and stderr to log and the parent's death signalled (posix_spawn cannot
 * set PR_SET_PDEATHSIG). Only async-signal-safe calls between fork and exec: this process runs
 * nng threads. Returns the pid or -errno. */
static pid_t spawn_logged(char *const argv[], const char *log)
{
	int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	pid_t parent = getpid(), pid = fork();
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(127);
		dup2(fd, 1);
		dup2(fd, 2);
		execv(argv[0], argv);
		_exit(127);
	}
	int err = errno;
	close(fd);
	return pid < 0 ? -err : pid;
}

/* SIGTERM, then SIGKILL after 5 s; reaps. */
static void stop_child(pid_t pid)
{
	if (pid <= 0)
		return;
	kill(pid, SIGTERM);
	for (int i = 0; i < 500; i++) {
		if (waitpid(pid, NULL, WNOHANG) == pid)
			return;
		usleep(10000);
	}
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
}

static int call(struct wf_ctl_client *c, Weightfloor__V1__Request *req, int timeout_ms,
                Weightfloor__V1__Reply **ret, const char *what)
{
	struct wf_diag d = {{0}};
	Weightfloor__V1__Reply *r = NULL;
	int rc = wf_ctl_client_call_timeout(c, req, timeout_ms, &r, &d);
	if (rc == 0 && r->code != WEIGHTFLOOR__V1__STATUS__STATUS_OK) {
		fprintf(stderr, "wf-bench: %s: %s\n", what, r->message ? r->message : "refused");
		wf_ctl_reply_free(r);
		return WF_EPROTOCOL;
	}
	if (rc < 0) {
		fprintf(stderr, "wf-bench: %s: %s\n", what, wf_diag_str(&d, rc));
		return rc;
	}
	*ret = r;
	return 0;
}

/* Connects to a worker just started: tries every millisecond for up to 30 s (a client waiting for
 * the server would redial with nng's growing back-off, up to a second late, and that would be
 * measured as the worker's start). Fails at once when the worker has exited. */
static int connect_worker(pid_t pid, const char *url, struct wf_ctl_client **ret)
{
	struct wf_ctl_client_opts copts = {.client_name = "wf-bench"};
	double end = bench_now() + 30;
	while (bench_now() < end) {
		if (wf_ctl_client_open(url, 30000, &copts, ret, NULL) == 0)
			return 0;
		if (waitpid(pid, NULL, WNOHANG) == pid)
			return WF_EUNAVAILABLE;
		usleep(1000);
	}
	return WF_ETIMEOUT;
}

/* Generates up to max_tokens from PROMPT_TOKENS fixed ids on the worker behind c and returns
 * once the first token is there (first_only) or the completion is done. */
static int generate(struct wf_ctl_client *c, uint32_t n_vocab, uint32_t max_tokens, bool first_only)
{
	int32_t ids[PROMPT_TOKENS];
	for (int i = 0; i < PROMPT_TOKENS; i++)
		ids[i] = (int32_t)((7u + 131u * (unsigned)i) % n_vocab);
	Weightfloor__V1__Generate g = WEIGHTFLOOR__V1__GENERATE__INIT;
	g.model = "bench";
	g.prompt_ids = ids;
	g.n_prompt_ids = PROMPT_TOKENS;
	g.max_tokens = max_tokens;
	g.ignore_eos = true;
	g.wait_ms = 10000;
	Weightfloor__V1__Request req = WEIGHTFLOOR__V1__REQUEST__INIT;
	req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_GENERATE;
	req.generate = &g;
	Weightfloor__V1__Reply *r = NULL;
	/* A worker's first request builds its engine from the floor: allow a cold machine time. */
	int rc = call(c, &req, 60000, &r, "Generate");
	if (rc < 0)
		return rc;
	uint64_t id = r->generate ? r->generate->completion_id : 0;
	for (;;) {
		const Weightfloor__V1__GenerateReply *gr = r->generate;
		if (!gr) {
			rc = WF_EPROTOCOL;
			break;
		}
		if (gr->done && gr->finish == WEIGHTFLOOR__V1__FINISH_REASON__FINISH_REASON_ERROR) {
			fprintf(stderr, "wf-bench: Generate: %s\n",
			        gr->error ? gr->error : "error");
			rc = WF_EINTERNAL;
			break;
		}
		if ((first_only && gr->first + gr->n_tokens > 0) || gr->done)
			break;
		Weightfloor__V1__GenerateRead rd = WEIGHTFLOOR__V1__GENERATE_READ__INIT;
		rd.completion_id = id;
		rd.after = gr->first + (uint32_t)gr->n_tokens;
		rd.wait_ms = 10000;
		req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_GENERATE_READ;
		req.generate_read = &rd;
		wf_ctl_reply_free(r);
		r = NULL;
		if ((rc = call(c, &req, 30000, &r, "GenerateRead")) < 0)
			return rc;
	}
	wf_ctl_reply_free(r);
	return rc;
}

/* Pins the model on the worker (the store loads every set and keeps it). */
static int pin(struct wf_ctl_client *c)
{
	Weightfloor__V1__Pin p = WEIGHTFLOOR__V1__PIN__INIT;
	p.model = "bench";
	Weightfloor__V1__Request req = WEIGHTFLOOR__V1__REQUEST__INIT;
	req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_PIN;
	req.pin = &p;
	Weightfloor__V1__Reply *r = NULL;
	int rc = call(c, &req, 120000, &r, "Pin");
	wf_ctl_reply_free(r);
	return rc;
}

static double median(double *v, int n)
{
	for (int i = 1; i < n; i++)
		for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
			double x = v[j];
			v[j] = v[j - 1], v[j - 1] = x;
		}
	return n ? v[n / 2] : -1;
}

/* Resident bytes of a process: all of them, and those of mappings under floor_dir. */
struct smaps_sum {
	uint64_t rss, floor_rss, anon, private_bytes;
};

static int smaps_read(pid_t pid, const char *floor_dir, struct smaps_sum *ret)
{
	char path[64], line[4608];
	snprintf(path, sizeof path, "/proc/%d/smaps", (int)pid);
	FILE *f = fopen(path, "re");
	if (!f)
		return -errno;
	struct smaps_sum s = {0};
	size_t dl = strlen(floor_dir);
	bool in_floor = false;
	while (fgets(line, sizeof line, f)) {
		unsigned long long a, b, kb;
		char perms[8], key[64];
		/* A mapping's header, "start-end perms offset dev inode   [path]", then its fields
		 * "Key:   N kB". */
		if (sscanf(line, "%llx-%llx %7s ", &a, &b, perms) == 3) {
			const char *p = strchr(line, '/');
			in_floor = p && strncmp(p, floor_dir, dl) == 0 && p[dl] == '/';
			continue;
		}
		if (sscanf(line, "%63[^:]: %llu kB", key, &kb) != 2)
			continue;
		uint64_t bytes = (uint64_t)kb << 10;
		if (strcmp(key, "Rss") == 0) {
			s.rss += bytes;
			if (in_floor)
				s.floor_rss += bytes;
		} else if (strcmp(key, "Anonymous") == 0) {
			s.anon += bytes;
		} else if (!in_floor && (strcmp(key, "Private_Clean") == 0 ||
		                         strcmp(key, "Private_Dirty") == 0)) {
			s.private_bytes += bytes;
		}
	}
	fclose(f);
	*ret = s;
	return 0;
}

/* Seconds of llama-bench's whole run of one 16-token prompt and one generated token, model load
 * included: the median of reps runs, after one untimed run that warms the page cache. */
static double llama_first_token(const char *exe, const char *model, unsigned threads, int reps)
{
	char t[16];
	snprintf(t, sizeof t, "%u", threads);
	char *argv[] = {(char *)exe, "-m",  (char *)model, "-t", t,   "-p",          "0", "-n",
	                "0",         "-pg", "16,1",        "-r", "1", "--no-warmup", NULL};
	double v[16];
	int n = 0;
	for (int r = -1; r < reps && n < 16; r++) {
		double t0 = bench_now();
		if (bench_run(argv, NULL) != 0)
			return -1;
		if (r >= 0)
			v[n++] = bench_now() - t0;
	}
	for (int i = 1; i < n; i++)
		for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
			double x = v[j];
			v[j] = v[j - 1], v[j - 1] = x;
		}
	return n ? v[n / 2] : -1;
}

int bench_engine_workers(const struct bench_opts *o, const struct bench_engine_ctx *ctx)
{
	char dir[] = "/tmp/wf-bench-engine-XXXXXX";
	char floor_dir[4200], agent_url[128], ev_url[128], log[160], wurl[128], notes[512];
	char model_arg[4300];
	struct wf_ctl_client *agent = NULL, *w = NULL;
	pid_t agent_pid = -1, wpid = -1;
	int ret = 1, rc;
	const int reps = o->iterations > 0 ? o->iterations : 3;

	if (!mkdtemp(dir))
		return 1;
	snprintf(floor_dir, sizeof floor_dir, "%s/wf-bench-engine-%d", o->floor_root,
	         (int)getpid());
	if (mkdir(floor_dir, 0700) < 0) {
		fprintf(stderr, "wf-bench: %s: %s\n", floor_dir, strerror(errno));
		goto out;
	}
	snprintf(agent_url, sizeof agent_url, "ipc://%s/agent.sock", dir);
	snprintf(ev_url, sizeof ev_url, "ipc://%s/events.sock", dir);
	snprintf(log, sizeof log, "%s/agent.log", dir);
	snprintf(model_arg, sizeof model_arg, "bench=%s", ctx->model_path);
	char *aargv[] = {(char *)ctx->agent_exe,
	                 "--floor-dir",
	                 floor_dir,
	                 "--socket",
	                 agent_url,
	                 "--events",
	                 ev_url,
	                 "--state-file",
	                 "none",
	                 "--model",
	                 model_arg,
	                 NULL};
	if ((agent_pid = spawn_logged(aargv, log)) < 0) {
		fprintf(stderr, "wf-bench: %s: %s\n", ctx->agent_exe, strerror((int)-agent_pid));
		goto out;
	}
	struct wf_ctl_client_opts copts = {.client_name = "wf-bench", .wait_for_server = true};
	struct wf_diag d = {{0}};
	if ((rc = wf_ctl_client_open(agent_url, 30000, &copts, &agent, &d)) < 0) {
		fprintf(stderr, "wf-bench: agent: %s\n", wf_diag_str(&d, rc));
		goto out;
	}
	Weightfloor__V1__EnsureFloor ef = WEIGHTFLOOR__V1__ENSURE_FLOOR__INIT;
	ef.name = "bench";
	ef.wait = true;
	ef.wait_timeout_ms = 120000;
	Weightfloor__V1__Request req = WEIGHTFLOOR__V1__REQUEST__INIT;
	req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_ENSURE_FLOOR;
	req.ensure_floor = &ef;
	Weightfloor__V1__Reply *r = NULL;
	if (call(agent, &req, 125000, &r, "EnsureFloor (see the agent's log)") < 0)
		goto out;
	wf_ctl_reply_free(r);

	/* Private memory: a worker that has run the model (its engine built, KV cache used). */
	snprintf(wurl, sizeof wurl, "ipc://%s/w0.sock", dir);
	snprintf(log, sizeof log, "%s/worker-0.log", dir);
	char threads[16], nctx[16], nseq[16];
	snprintf(threads, sizeof threads, "%u", ctx->n_threads);
	snprintf(nctx, sizeof nctx, "%u", ctx->n_ctx);
	snprintf(nseq, sizeof nseq, "%u", ctx->n_seq);
	/* The in-process engine's config, so that the KV and scratch figures in the notes are the
	 * worker's. */
	char *wargv[] = {(char *)ctx->worker_exe,
	                 "--id",
	                 "bench-0",
	                 "--endpoint",
	                 wurl,
	                 "--agent",
	                 agent_url,
	                 "--floor-dir",
	                 floor_dir,
	                 "--device",
	                 "host",
	                 "--threads",
	                 threads,
	                 "--ctx",
	                 nctx,
	                 "--seqs",
	                 nseq,
	                 NULL};
	if ((wpid = spawn_logged(wargv, log)) < 0 || connect_worker(wpid, wurl, &w) < 0 ||
	    generate(w, ctx->n_vocab, 32, false) < 0) {
		fprintf(stderr, "wf-bench: worker (log %s) could not generate\n", log);
		goto out;
	}
	struct smaps_sum s = {0};
	if ((rc = smaps_read(wpid, floor_dir, &s)) < 0) {
		fprintf(stderr, "wf-bench: /proc/%d/smaps: %s\n", (int)wpid, strerror(-rc));
		goto out;
	}
	double priv = (double)(s.rss - s.floor_rss);
	snprintf(notes, sizeof notes,
	         "RSS %.1f MB, floor pages %.1f MB; private (clean+dirty, outside the floor) %.1f "
	         "MB, anonymous %.1f MB; the engine's KV cache %.1f MB and scratch %.1f MB at "
	         "the bench's config (%u positions x %u sequences)",
	         s.rss / 1e6, s.floor_rss / 1e6, s.private_bytes / 1e6, s.anon / 1e6,
	         ctx->kv_bytes / 1e6, ctx->scratch_bytes / 1e6, ctx->n_ctx, ctx->n_seq);
	bench_report(&(struct bench_result){.bench = "engine",
	                                    .metric = "private_memory_over_model",
	                                    .value = priv / 1e6,
	                                    .unit = "MB",
	                                    .anchor = "model size",
	                                    .anchor_value = ctx->model_bytes / 1e6,
	                                    .ratio = priv / (double)ctx->model_bytes,
	                                    .goal = 0.05,
	                                    .goal_op = "<=",
	                                    .notes = notes});
	wf_ctl_client_close(w);
	w = NULL;
	stop_child(wpid);
	wpid = -1;

	/* First token: fresh workers, the floor made; the median of reps starts. */
	double v[16];
	int n = 0;
	for (int i = 0; i < reps && i < 16; i++) {
		char id[32];
		snprintf(id, sizeof id, "bench-%d", i + 1);
		snprintf(wurl, sizeof wurl, "ipc://%s/w%d.sock", dir, i + 1);
		snprintf(log, sizeof log, "%s/worker-%d.log", dir, i + 1);
		wargv[2] = id;
		wargv[4] = wurl;
		double t0 = bench_now();
		if ((wpid = spawn_logged(wargv, log)) < 0 || connect_worker(wpid, wurl, &w) < 0 ||
		    generate(w, ctx->n_vocab, 1, true) < 0) {
			fprintf(stderr, "wf-bench: worker (log %s) could not generate\n", log);
			goto out;
		}
		v[n++] = bench_now() - t0;
		wf_ctl_client_close(w);
		w = NULL;
		stop_child(wpid);
		wpid = -1;
	}
	double ours = median(v, n);
	double theirs = o->llama_bench ? llama_first_token(o->llama_bench, ctx->model_path,
	                                                   ctx->n_threads, reps)
	                               : -1;
	if (theirs <= 0) {
		snprintf(notes, sizeof notes, "%s; ours: %.1f ms (median of %d)",
		         o->llama_bench ? "llama-bench failed" : "no --llama-bench PATH given",
		         ours * 1e3, n);
		bench_skip("engine", "first_token_vs_llama_cpp", notes);
	} else {
		snprintf(
		    notes, sizeof notes,
		    "ours: wf-worker spawn to its first token over the control plane (%d-token "
		    "prompt, floor made, agent running), median of %d; llama.cpp: wall time of "
		    "`llama-bench -t %u -p 0 -n 0 -pg 16,1 -r 1 --no-warmup` (process start, "
		    "model load from a warm page cache, prompt, one token, exit), median of %d",
		    PROMPT_TOKENS, n, ctx->n_threads, reps);
		bench_report(&(struct bench_result){.bench = "engine",
		                                    .metric = "first_token_vs_llama_cpp",
		                                    .value = ours * 1e3,
		                                    .unit = "ms",
		                                    .anchor = "llama-bench load + pp16 + tg1",
		                                    .anchor_value = theirs * 1e3,
		                                    .ratio = ours / theirs,
		                                    .goal = 0.1,
		                                    .goal_op = "<=",
		                                    .notes = notes});
	}
	/* Pinned before the first Generate, or not: fresh workers computing the dense part on a
	 * throttled host device, the first token timed from the Generate (the pin, when there is
	 * one, before it). */
	double t_pin[2][16];
	int n_pin[2] = {0, 0};
	char *dargv[sizeof wargv / sizeof wargv[0] + 2];
	memcpy(dargv, wargv, sizeof wargv);
	dargv[10] = "host:bw=16G";
	size_t na = 0;
	while (dargv[na])
		na++;
	dargv[na] = "--dense-on-device";
	dargv[na + 1] = NULL;
	for (int i = 0; i < 2 * reps && i < 32; i++) {
		const int pinned = i % 2;
		char id[32];
		snprintf(id, sizeof id, "bench-pin-%d", i);
		snprintf(wurl, sizeof wurl, "ipc://%s/wp%d.sock", dir, i);
		snprintf(log, sizeof log, "%s/worker-pin-%d.log", dir, i);
		dargv[2] = id;
		dargv[4] = wurl;
		if ((wpid = spawn_logged(dargv, log)) < 0 || connect_worker(wpid, wurl, &w) < 0 ||
		    (pinned && pin(w) < 0)) {
			fprintf(stderr, "wf-bench: worker (log %s) could not start or pin\n", log);
			goto out;
		}
		const double t0 = bench_now();
		if (generate(w, ctx->n_vocab, 1, true) < 0) {
			fprintf(stderr, "wf-bench: worker (log %s) could not generate\n", log);
			goto out;
		}
		t_pin[pinned][n_pin[pinned]++] = bench_now() - t0;
		wf_ctl_client_close(w);
		w = NULL;
		stop_child(wpid);
		wpid = -1;
	}
	const double pinned_s = median(t_pin[1], n_pin[1]), unpinned_s = median(t_pin[0], n_pin[0]);
	snprintf(notes, sizeof notes,
	         "Generate to the first token of a %d-token prompt on a fresh worker with "
	         "--device host:bw=16G --dense-on-device, the model pinned before (the engine "
	         "computes from the store's copies) or not (its build loads the dense set into the "
	         "store first); medians of %d each",
	         PROMPT_TOKENS, n_pin[1]);
	bench_report(&(struct bench_result){.bench = "engine",
	                                    .metric = "first_token_pinned_vs_unpinned",
	                                    .value = pinned_s * 1e3,
	                                    .unit = "ms",
	                                    .anchor = "the same, unpinned",
	                                    .anchor_value = unpinned_s * 1e3,
	                                    .ratio = pinned_s / unpinned_s,
	                                    .goal = 1.0,
	                                    .goal_op = "<=",
	                                    .notes = notes});
	ret = 0;
out:
	wf_ctl_client_close(w);
	stop_child(wpid);
	wf_ctl_client_close(agent);
	stop_child(agent_pid);
	if (ret != 0)
		fprintf(stderr, "wf-bench: logs kept in %s\n", dir);
	else
		bench_rmtree(dir);
	bench_rmtree(floor_dir);
	return ret;
}
