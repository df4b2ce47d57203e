/* wf_stress: the reliability harness of wf-agent (docs/RELIABILITY.md).
 *
 *   wf_stress churn     [--clients 16] [--ops 4000] [--runs 3] [--size 64M] [--timeout-ms 10000]
 *                       [--stop-on-fail]
 *   wf_stress kill      [--trials 20] [--size 128M] [--time-limit S]
 *   wf_stress malformed [--messages 5000]
 *   wf_stress load      [--clients 64] [--requests 12800]
 *   wf_stress selftest
 *   common options:     [--seed N] [--stacks FILE] [--keep] [-v]
 *
 * Every subcommand starts real wf-agent processes through the integration-test harness
 * (tests/agent/agt.h: a private directory holding the floor directory, the model files from
 * wf-gen and the ipc:// sockets; agents run under agent_helper, so they die with this process),
 * injects its fault, prints one JSON line with what it counted on stdout, and exits 0 when
 * nothing failed, 1 when something did, 2 for bad usage. Diagnostics go to stderr.
 *
 *   churn      --clients threads, each with its own control client, send random EnsureFloor
 *              (wait or not), ReleaseFloor, PinHost, UnpinHost and ModelStatus for ONE model,
 *              every request with a timeout. A run fails when a request gets no reply in time
 *              (the agent is stuck), when a reply is INTERNAL or does not come at all, when the
 *              floor is not READY with the file's bytes afterwards, or when the agent does not
 *              exit with status 0 within 5 s of SIGTERM.
 *   kill       per trial: release the floor, ask for it again without waiting, SIGKILL the agent
 *              at a random moment of the copy (uniform over the measured fill time),
 *              restart it, ensure with wait. The floor must then be READY, its checksums valid
 *              and every tensor's bytes equal to the model file's, and the floor directory must
 *              hold only the region and its two lock files. A trial that fails any of it "lost".
 *   malformed  random bytes, protobuf-shaped garbage (random tags and wire types, lying
 *              lengths, deep nesting), mutated valid Requests and oversized messages over a raw
 *              nng REQ socket. Each must get a reply that parses as a Reply, or a dropped
 *              connection; then a valid AgentStatus on the same socket must succeed. At the end
 *              the agent's open descriptors (/proc/PID/fd) must come back to their count before
 *              the first message, and it must stop cleanly.
 *   load       --clients threads, each with its own client, send AgentStatus, ListModels and
 *              ModelStatus as fast as they can; every one must get an OK reply.
 *   selftest   plants each fault the checks look for (a stray file in the floor directory, a
 *              floor byte that differs from the file's, a connection's descriptor) and fails
 *              unless every one is caught: the checks above cannot pass vacuously.
 *
 * --stacks FILE: when the agent hangs (a request timed out, or SIGTERM did not stop it), append
 * `gdb -batch -ex 'thread apply all bt'` of it to FILE before it is killed.
 *
 * Harness steps that cannot fail in a sane environment (making the temporary directory, running
 * wf-gen, spawning a process) assert through Criterion, which outside a Criterion runner aborts;
 * a SIGABRT handler then names the step. --keep (or WF_TEST_KEEP=1) keeps the directories. */
#include "tests/agent/agt.h"

#include "base/error.h"
#include "model/model.h"
#include "proto/status.h"
#include "proto/version.h"
#include "shm/layout.h"
#include "shm/region.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define ST(x)   WEIGHTFLOOR__V1__STATUS__STATUS_##x
#define FS(x)   WEIGHTFLOOR__V1__FLOOR_STATE__FLOOR_STATE_##x
#define N_CODES 16   /* Status values counted by name; larger ones count as UNKNOWN */
#define STOP_MS 5000 /* an agent must exit this soon after SIGTERM */

/* ---- options and common helpers ------------------------------------------------------------ */

struct opts {
	unsigned clients, ops, runs, trials, messages, requests;
	int timeout_ms;
	const char *size;
	uint64_t seed;
	const char *stacks;
	double time_limit_s;
	bool stop_on_fail;
	bool verbose;
};

static const char *volatile g_step = "start";
static const char *volatile g_dir = "";

static void on_abort(int sig)
{
	(void)sig;
	static const char a[] = "wf_stress: harness step failed: ";
	static const char b[] = " (directory ";
	static const char c[] = ")\n";
	const char *s = g_step, *d = g_dir;
	ssize_t r = write(STDERR_FILENO, a, sizeof a - 1);
	r = write(STDERR_FILENO, s, strlen(s));
	r = write(STDERR_FILENO, b, sizeof b - 1);
	r = write(STDERR_FILENO, d, strlen(d));
	r = write(STDERR_FILENO, c, sizeof c - 1);
	(void)r;
	signal(SIGABRT, SIG_DFL);
	raise(SIGABRT);
}

static int64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static double secs_since(int64_t t0)
{
	return (double)(now_ns() - t0) / 1e9;
}

/* splitmix64: one independent stream per thread, reproducible from --seed */
static uint64_t rng_next(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static uint64_t rng_below(uint64_t *s, uint64_t n)
{
	return n ? rng_next(s) % n : 0;
}

static void rng_fill(uint64_t *s, uint8_t *p, size_t n)
{
	while (n >= 8) {
		uint64_t v = rng_next(s);
		memcpy(p, &v, 8);
		p += 8;
		n -= 8;
	}
	uint64_t v = rng_next(s);
	memcpy(p, &v, n);
}

static void sleep_ns(int64_t ns)
{
	if (ns <= 0)
		return;
	struct timespec ts = {ns / 1000000000LL, ns % 1000000000LL};
	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

static void logv(const struct opts *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void logv(const struct opts *o, const char *fmt, ...)
{
	if (!o->verbose)
		return;
	va_list ap;
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
}

/* Latencies in microseconds; percentiles by sorting once at the end. */
struct lat {
	uint32_t *us;
	size_t n, cap;
};

static void lat_push(struct lat *l, int64_t ns)
{
	if (l->n == l->cap) {
		size_t cap = l->cap ? 2 * l->cap : 1024;
		uint32_t *p = realloc(l->us, cap * sizeof(*p));
		if (!p)
			return; /* a lost sample only thins the statistics */
		l->us = p;
		l->cap = cap;
	}
	int64_t us = ns / 1000;
	l->us[l->n++] = us > UINT32_MAX ? UINT32_MAX : (uint32_t)us;
}

static void lat_merge(struct lat *dst, const struct lat *src)
{
	for (size_t i = 0; i < src->n; i++)
		lat_push(dst, (int64_t)src->us[i] * 1000);
}

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	return (x > y) - (x < y);
}

static void lat_sort(struct lat *l)
{
	if (l->n)
		qsort(l->us, l->n, sizeof(*l->us), cmp_u32);
}

/* p in [0,1] of sorted samples, in milliseconds */
static double lat_ms(const struct lat *l, double p)
{
	if (!l->n)
		return 0;
	size_t i = (size_t)(p * (double)(l->n - 1) + 0.5);
	return (double)l->us[i] / 1000.0;
}

static void lat_free(struct lat *l)
{
	free(l->us);
	l->us = NULL;
	l->n = l->cap = 0;
}

static void codes_json(FILE *f, const unsigned long *codes)
{
	fputc('{', f);
	bool first = true;
	for (int i = 0; i < N_CODES; i++) {
		if (!codes[i])
			continue;
		fprintf(f, "%s\"%s\":%lu", first ? "" : ",",
		        i == N_CODES - 1 ? "UNKNOWN"
		                         : wf_proto_status_name((Weightfloor__V1__Status)i),
		        codes[i]);
		first = false;
	}
	fputc('}', f);
}

static void count_code(unsigned long *codes, Weightfloor__V1__Status s)
{
	codes[(unsigned)s < N_CODES - 1 ? (unsigned)s : N_CODES - 1]++;
}

/* ---- requests -------------------------------------------------------------------------------- */

enum op {
	OP_ENSURE_WAIT,
	OP_ENSURE,
	OP_RELEASE,
	OP_PIN,
	OP_UNPIN,
	OP_MODEL_STATUS,
	OP_AGENT_STATUS,
	OP_LIST,
	OP_MAX_
};

static const char *const op_names[OP_MAX_] = {
    "ensure-wait", "ensure", "release", "pin", "unpin", "model-status", "agent-status", "list"};

/* One request; the reply is the caller's. Returns the client's code (0 when a reply came). */
static int call_op(struct wf_ctl_client *c, enum op op, const char *name, int timeout_ms,
                   Weightfloor__V1__Reply **ret_reply, struct wf_diag *diag)
{
	Weightfloor__V1__Request req = WEIGHTFLOOR__V1__REQUEST__INIT;
	Weightfloor__V1__EnsureFloor ef = WEIGHTFLOOR__V1__ENSURE_FLOOR__INIT;
	Weightfloor__V1__ReleaseFloor rf = WEIGHTFLOOR__V1__RELEASE_FLOOR__INIT;
	Weightfloor__V1__PinHost ph = WEIGHTFLOOR__V1__PIN_HOST__INIT;
	Weightfloor__V1__UnpinHost uh = WEIGHTFLOOR__V1__UNPIN_HOST__INIT;
	Weightfloor__V1__ModelStatus ms = WEIGHTFLOOR__V1__MODEL_STATUS__INIT;
	Weightfloor__V1__AgentStatus as = WEIGHTFLOOR__V1__AGENT_STATUS__INIT;
	Weightfloor__V1__ListModels lm = WEIGHTFLOOR__V1__LIST_MODELS__INIT;
	char *n = (char *)name;

	switch (op) {
	case OP_ENSURE_WAIT:
	case OP_ENSURE:
		ef.name = n;
		ef.wait = op == OP_ENSURE_WAIT;
		/* The agent answers UNAVAILABLE after this; the client waits longer, so a missing
		 * reply means a stuck agent, not a slow copy. */
		ef.wait_timeout_ms = ef.wait ? (uint32_t)(timeout_ms / 2) : 0;
		req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_ENSURE_FLOOR;
		req.ensure_floor = &ef;
		break;
	case OP_RELEASE:
		rf.name = n;
		req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_RELEASE_FLOOR;
		req.release_floor = &rf;
		break;
	case OP_PIN:
		ph.name = n;
		req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_PIN_HOST;
		req.pin_host = &ph;
		break;
	case OP_UNPIN:
		uh.name = n;
		req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_UNPIN_HOST;
		req.unpin_host = &uh;
		break;
	case OP_MODEL_STATUS:
		ms.name = n;
		req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_MODEL_STATUS;
		req.model_status = &ms;
		break;
	case OP_AGENT_STATUS:
		req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_AGENT_STATUS;
		req.agent_status = &as;
		break;
	case OP_LIST:
	default:
		req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_LIST_MODELS;
		req.list_models = &lm;
		break;
	}
	return wf_ctl_client_call_timeout(c, &req, timeout_ms, ret_reply, diag);
}

static Weightfloor__V1__FloorState reply_state(const Weightfloor__V1__Reply *r)
{
	return r && r->body_case == WEIGHTFLOOR__V1__REPLY__BODY_MODEL_INFO && r->model_info
	           ? r->model_info->floor_state
	           : FS(UNSPECIFIED);
}

/* ---- agent processes ------------------------------------------------------------------------- */

/* Starts an agent and waits until it answers; false (with its log on stderr) if it does not. */
static bool agent_up(struct agt *a, const char *const *args)
{
	g_step = "spawn wf-agent";
	agt_spawn(a, NULL, args);
	if (agt_wait_ready(a, 20000))
		return true;
	char *log = agt_log(a);
	fprintf(stderr, "wf_stress: wf-agent did not become ready; its log:\n%s\n", log);
	free(log);
	agt_stop(a, 2000);
	return false;
}

static void dump_stacks(const struct opts *o, struct agt *a, const char *why)
{
	if (!o->stacks || a->pid <= 0)
		return;
	char spid[16];
	snprintf(spid, sizeof spid, "%d", (int)a->pid);
	char *argv[] = {"/usr/bin/gdb", "-p", spid, "-batch", "-ex", "thread apply all bt", NULL};
	char *out = NULL;
	agt_run((char *const *)argv, &out, NULL, 60, a->dir);
	FILE *f = fopen(o->stacks, "ae");
	if (f) {
		fprintf(f, "==== wf-agent pid %s: %s\n%s\n", spid, why, out ? out : "");
		fclose(f);
	}
	free(out);
}

/* SIGTERM; the exit status (0..255, 128+signal) if the agent exits within STOP_MS, else -1 after
 * the stacks are taken and it is SIGKILLed. */
static int agent_term(const struct opts *o, struct agt *a)
{
	wf_ctl_client_close(a->cli);
	a->cli = NULL;
	if (a->pid <= 0)
		return -1;
	kill(a->pid, SIGTERM);
	int64_t end = now_ns() + (int64_t)STOP_MS * 1000000;
	while (now_ns() < end) {
		int st;
		if (waitpid(a->pid, &st, WNOHANG) == a->pid) {
			a->pid = 0;
			return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
		}
		sleep_ns(5 * 1000000);
	}
	dump_stacks(o, a, "did not exit within 5 s of SIGTERM");
	agt_stop(a, 0);
	return -1;
}

static void agent_kill9(struct agt *a)
{
	wf_ctl_client_close(a->cli);
	a->cli = NULL;
	if (a->pid <= 0)
		return;
	kill(a->pid, SIGKILL);
	waitpid(a->pid, NULL, 0);
	a->pid = 0;
}

static void log_tail(struct agt *a, int lines)
{
	char *log = agt_log(a);
	size_t n = strlen(log);
	const char *p = log + n;
	while (p > log && lines >= 0) {
		p--;
		if (*p == '\n')
			lines--;
	}
	fprintf(stderr, "---- %s (tail)\n%s\n----\n", a->log ? a->log : "agent log", p);
	free(log);
}

static char *xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *xasprintf(const char *fmt, ...)
{
	va_list ap;
	char *p = NULL;
	va_start(ap, fmt);
	int n = vasprintf(&p, fmt, ap);
	va_end(ap);
	if (n < 0) {
		fprintf(stderr, "wf_stress: out of memory\n");
		exit(1);
	}
	return p;
}

static struct agt *stage(const char *tag)
{
	g_step = "create the test directory";
	struct agt *a = agt_new(tag);
	g_dir = a->dir;
	return a;
}

/* ---- floor checks ---------------------------------------------------------------------------- */

/* The floor directory holds wf-HEX, wf-HEX.guard and wf-HEX.holders, and may hold the agent's
 * keep marker wf-HEX.keep; anything else is a stray file (a temporary, an orphaned lock, a second
 * region). */
static bool floor_files_ok(struct agt *a, const char *hex, char *why, size_t len)
{
	static const char *const suffix[] = {"", ".guard", ".holders", ".keep"};
	char stray[256] = "";
	size_t sl = 0;
	unsigned seen = 0;
	DIR *d = opendir(a->floor);
	if (!d) {
		snprintf(why, len, "%s: %s", a->floor, strerror(errno));
		return false;
	}
	struct dirent *de;
	while ((de = readdir(d))) {
		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		bool known = false;
		for (unsigned i = 0; i < 4 && !known; i++) {
			char want[64];
			snprintf(want, sizeof want, "wf-%s%s", hex, suffix[i]);
			if (strcmp(de->d_name, want) == 0) {
				seen |= 1u << i;
				known = true;
			}
		}
		if (!known && sl + 1 < sizeof stray)
			sl += (size_t)snprintf(stray + sl, sizeof stray - sl, " %s", de->d_name);
	}
	closedir(d);
	if ((seen & 7u) == 7u && !stray[0])
		return true;
	snprintf(why, len, "floor directory:%s%s%s%s", seen & 1u ? "" : " no region",
	         seen & 2u ? "" : " no guard", seen & 4u ? "" : " no holders file",
	         stray[0] ? "; stray files:" : "");
	if (stray[0] && strlen(why) + 1 < len)
		snprintf(why + strlen(why), len - strlen(why), "%.200s", stray);
	return false;
}

/* The region is READY, its checksums hold, and every tensor's bytes equal the model file's at
 * the tensor's source offset. Attaches as a reader, as a worker would. */
static bool floor_bytes_ok(struct agt *a, const char *hex, const char *model_path, char *why,
                           size_t len)
{
	struct wf_digest dg;
	struct wf_shm_config cfg = {.dir = a->floor};
	struct wf_shm_region *r = NULL;
	struct wf_diag d = {{0}};
	bool ok = false;
	int fd = -1;
	uint8_t *map = MAP_FAILED;
	struct stat st;

	int rc = wf_digest_parse(hex, &dg);
	if (rc < 0) {
		snprintf(why, len, "digest '%s' does not parse", hex);
		return false;
	}
	rc = wf_shm_region_attach(&cfg, &dg, NULL, WF_SHM_ATTACH_READER, NULL, NULL, &r, &d);
	if (rc < 0) {
		snprintf(why, len, "attach as reader: %s", wf_diag_str(&d, rc));
		return false;
	}
	if (wf_shm_region_state(r) != WF_SHM_STATE_READY) {
		snprintf(why, len, "region state %u, not READY", wf_shm_region_state(r));
		goto out;
	}
	if ((rc = wf_shm_region_verify(r, &d)) < 0) {
		snprintf(why, len, "verify: %s", wf_diag_str(&d, rc));
		goto out;
	}
	fd = open(model_path, O_RDONLY | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &st) < 0) {
		snprintf(why, len, "%s: %s", model_path, strerror(errno));
		goto out;
	}
	map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	if (map == MAP_FAILED) {
		snprintf(why, len, "mmap %s: %s", model_path, strerror(errno));
		goto out;
	}
	uint32_t nt = wf_shm_region_n_tensors(r);
	if (nt == 0) {
		snprintf(why, len, "region has no tensors");
		goto out;
	}
	for (uint32_t i = 0; i < nt; i++) {
		struct wf_shm_tensor_info ti;
		if ((rc = wf_shm_region_tensor(r, i, &ti)) < 0) {
			snprintf(why, len, "tensor %u: %s", i, wf_strerror(rc));
			goto out;
		}
		if (ti.file != 0 || ti.source_offset > (uint64_t)st.st_size ||
		    ti.nbytes > (uint64_t)st.st_size - ti.source_offset) {
			snprintf(why, len, "tensor %s lies outside the model file", ti.name);
			goto out;
		}
		if (memcmp(ti.data, map + ti.source_offset, ti.nbytes) != 0) {
			snprintf(why, len, "tensor %s: floor bytes differ from the file's",
			         ti.name);
			goto out;
		}
	}
	ok = true;
out:
	if (map != MAP_FAILED)
		munmap(map, (size_t)st.st_size);
	if (fd >= 0)
		close(fd);
	wf_shm_region_detach(r);
	return ok;
}

/* State byte of the region header as the dead agent left it: -1 no region file, -2 unreadable
 * or not even a magic yet (EMPTY), else enum wf_shm_state. */
static int region_state_on_disk(struct agt *a, const char *hex)
{
	char *p = agt_region_path(a, hex, NULL);
	int fd = open(p, O_RDONLY | O_CLOEXEC);
	free(p);
	if (fd < 0)
		return -1;
	struct wf_shm_header h;
	ssize_t n = pread(fd, &h, sizeof h, 0);
	close(fd);
	if (n != (ssize_t)sizeof h || h.magic != WF_SHM_MAGIC)
		return -2;
	return (int)h.state;
}

/* ---- churn ----------------------------------------------------------------------------------- */

struct churn_run {
	const char *url;
	int timeout_ms;
	atomic_int stop;      /* set by the first timeout or failed open: the others finish up */
	atomic_int timed_out; /* a request got no reply in time: the agent is stuck */
	atomic_int hung;      /* the stacks were taken */
};

struct churn_thread {
	pthread_t th;
	struct churn_run *run;
	uint64_t rng;
	unsigned ops;
	struct lat lat;
	unsigned long codes[N_CODES];
	unsigned long done, timeouts, transport;
	int open_rc;
	bool joined;
	char first_err[256];
};

static enum op churn_pick(uint64_t *rng)
{
	/* weights: ensure-wait 25, ensure 20, release 20, pin 10, unpin 10, model-status 15 */
	uint64_t x = rng_below(rng, 100);
	return x < 25   ? OP_ENSURE_WAIT
	       : x < 45 ? OP_ENSURE
	       : x < 65 ? OP_RELEASE
	       : x < 75 ? OP_PIN
	       : x < 85 ? OP_UNPIN
	                : OP_MODEL_STATUS;
}

static void *churn_main(void *arg)
{
	struct churn_thread *t = arg;
	struct churn_run *run = t->run;
	struct wf_ctl_client *c = NULL;
	struct wf_diag d = {{0}};
	t->open_rc = wf_ctl_client_open(run->url, run->timeout_ms, NULL, &c, &d);
	if (t->open_rc < 0) {
		snprintf(t->first_err, sizeof t->first_err, "open: %s",
		         wf_diag_str(&d, t->open_rc));
		atomic_store(&run->stop, 1);
		return NULL;
	}
	for (unsigned i = 0; i < t->ops && !atomic_load(&run->stop); i++) {
		enum op op = churn_pick(&t->rng);
		Weightfloor__V1__Reply *r = NULL;
		wf_diag_clear(&d);
		int64_t t0 = now_ns();
		int rc = call_op(c, op, "m", run->timeout_ms, &r, &d);
		lat_push(&t->lat, now_ns() - t0);
		t->done++;
		if (rc == 0) {
			count_code(t->codes, r->code);
			wf_ctl_reply_free(r);
			continue;
		}
		if (rc == WF_ETIMEOUT) {
			t->timeouts++;
			atomic_store(&run->timed_out, 1);
			atomic_store(&run->stop, 1);
		} else {
			t->transport++;
		}
		if (!t->first_err[0])
			snprintf(t->first_err, sizeof t->first_err, "%s: %s", op_names[op],
			         wf_diag_str(&d, rc));
	}
	wf_ctl_client_close(c);
	return NULL;
}

static int cmd_churn(const struct opts *o)
{
	unsigned long codes[N_CODES] = {0};
	unsigned long done = 0, timeouts = 0, transport = 0, hangs = 0, bad_exit = 0, lost = 0;
	unsigned failed = 0, runs_done = 0;
	struct lat all = {0};
	int64_t t_start = now_ns();
	uint64_t model_bytes = 0;
	char failed_ids[256] = "";
	size_t fl = 0;

	for (unsigned run = 0; run < o->runs; run++) {
		if (o->time_limit_s > 0 && secs_since(t_start) > o->time_limit_s)
			break;
		struct agt *a = stage("stress-churn");
		g_step = "generate the model with wf-gen";
		char *path = agt_gen(a, "m", (int)(o->seed % 100000), o->size);
		struct stat st;
		if (stat(path, &st) == 0)
			model_bytes = (uint64_t)st.st_size;
		char *marg = xasprintf("m=%s", path);
		bool run_failed = false;
		const char *args[] = {"--model", marg, NULL};
		if (!agent_up(a, args)) {
			run_failed = true;
			goto end_run;
		}

		struct churn_run cr = {.url = a->sock_url, .timeout_ms = o->timeout_ms};
		struct churn_thread *th = calloc(o->clients, sizeof(*th));
		if (!th) {
			fprintf(stderr, "wf_stress: out of memory\n");
			exit(1);
		}
		int64_t t0 = now_ns();
		for (unsigned i = 0; i < o->clients; i++) {
			th[i].run = &cr;
			th[i].rng = o->seed * 1000003u + run * 131u + i;
			th[i].ops = o->ops / o->clients + (i < o->ops % o->clients);
			if (pthread_create(&th[i].th, NULL, churn_main, &th[i]) != 0) {
				fprintf(stderr, "wf_stress: pthread_create failed\n");
				exit(1);
			}
		}
		/* Watch for the first timeout while the threads run, to take the stacks while the
		 * agent is stuck rather than after the clients gave up. */
		bool joined = false;
		while (!joined) {
			if (atomic_load(&cr.timed_out) && !atomic_exchange(&cr.hung, 1))
				dump_stacks(o, a, "a churn request timed out");
			joined = true;
			for (unsigned i = 0; i < o->clients; i++) {
				if (!th[i].joined)
					th[i].joined = pthread_tryjoin_np(th[i].th, NULL) == 0;
				joined &= th[i].joined;
			}
			if (!joined)
				sleep_ns(20 * 1000000);
		}
		double secs = secs_since(t0);
		unsigned long r_done = 0, r_to = 0, r_tr = 0, r_int = 0;
		char first_err[256] = "";
		for (unsigned i = 0; i < o->clients; i++) {
			r_done += th[i].done;
			r_to += th[i].timeouts;
			r_tr += th[i].transport;
			r_int += th[i].codes[ST(INTERNAL)] + th[i].codes[ST(UNSPECIFIED)] +
			         th[i].codes[N_CODES - 1];
			for (int k = 0; k < N_CODES; k++)
				codes[k] += th[i].codes[k];
			lat_merge(&all, &th[i].lat);
			lat_free(&th[i].lat);
			if (!first_err[0] && th[i].first_err[0])
				memcpy(first_err, th[i].first_err, sizeof first_err);
			if (th[i].open_rc < 0)
				run_failed = true;
		}
		done += r_done;
		timeouts += r_to;
		transport += r_tr;
		if (r_to || r_tr || r_int)
			run_failed = true;

		/* The floor must come back whole after the churn (when the agent still answers). */
		char why[512] = "";
		if (!run_failed) {
			Weightfloor__V1__Reply *r = NULL;
			struct wf_diag d = {{0}};
			int rc = call_op(a->cli, OP_ENSURE_WAIT, "m", 60000, &r, &d);
			Weightfloor__V1__FloorState fs = reply_state(r);
			if (rc < 0 || r->code != ST(OK) ||
			    (fs != FS(HOST) && fs != FS(PINNED_HOST))) {
				snprintf(why, sizeof why, "final ensure: %s",
				         rc < 0          ? wf_diag_str(&d, rc)
				         : r->message[0] ? r->message
				                         : wf_proto_status_name(r->code));
			} else if (floor_files_ok(a, r->model_info->digest_hex, why, sizeof why) &&
			           floor_bytes_ok(a, r->model_info->digest_hex, path, why,
			                          sizeof why)) {
				why[0] = '\0';
			}
			wf_ctl_reply_free(r);
			if (why[0]) {
				lost++;
				run_failed = true;
			}
		}
		free(th);

		int ex = agent_term(o, a);
		if (ex < 0)
			hangs++;
		else if (ex != 0)
			bad_exit++;
		if (ex != 0)
			run_failed = true;
		fprintf(stderr,
		        "churn run %u: %lu requests in %.1f s, %lu timed out, %lu transport "
		        "errors, %lu INTERNAL; %s; stop: %s%s%s\n",
		        run + 1, r_done, secs, r_to, r_tr, r_int,
		        why[0]       ? why
		        : run_failed ? "floor not checked"
		                     : "floor READY and intact",
		        ex < 0    ? "no exit within 5 s of SIGTERM (killed)"
		        : ex == 0 ? "exit 0"
		                  : "bad exit",
		        first_err[0] ? "; first error: " : "", first_err);
		if (run_failed)
			log_tail(a, 15);
	end_run:
		if (run_failed) {
			failed++;
			if (fl + 16 < sizeof failed_ids)
				fl += (size_t)snprintf(failed_ids + fl, sizeof failed_ids - fl,
				                       "%s%u", fl ? "," : "", run + 1);
		}
		runs_done++;
		free(marg);
		free(path);
		agt_fini();
		if (run_failed && o->stop_on_fail)
			break;
	}
	lat_sort(&all);
	printf(
	    "{\"test\":\"churn\",\"clients\":%u,\"ops_per_run\":%u,\"runs\":%u,\"failed_runs\":%u,"
	    "\"failed_run_ids\":[%s],\"requests\":%lu,\"timeouts\":%lu,\"transport_errors\":%lu,"
	    "\"sigterm_hangs\":%lu,\"bad_exits\":%lu,\"floor_lost\":%lu,\"p50_ms\":%.2f,"
	    "\"p99_ms\":%.2f,\"max_ms\":%.2f,\"codes\":",
	    o->clients, o->ops, runs_done, failed, failed_ids, done, timeouts, transport, hangs,
	    bad_exit, lost, lat_ms(&all, 0.5), lat_ms(&all, 0.99), lat_ms(&all, 1.0));
	codes_json(stdout, codes);
	printf(",\"model_bytes\":%" PRIu64 ",\"timeout_ms\":%d,\"seed\":%" PRIu64
	       ",\"elapsed_s\":%.1f}\n",
	       model_bytes, o->timeout_ms, o->seed, secs_since(t_start));
	lat_free(&all);
	return failed ? 1 : 0;
}

/* ---- kill ------------------------------------------------------------------------------------ */

/* Ensure with wait on the running agent; 0 and the digest when the floor is complete. */
static int ensure_ready(struct agt *a, int timeout_ms, char hex[WF_DIGEST_HEX_LEN], char *why,
                        size_t len)
{
	Weightfloor__V1__Reply *r = NULL;
	struct wf_diag d = {{0}};
	int rc = call_op(a->cli, OP_ENSURE_WAIT, "m", timeout_ms, &r, &d);
	if (rc < 0) {
		snprintf(why, len, "ensure: %s", wf_diag_str(&d, rc));
		return rc;
	}
	Weightfloor__V1__FloorState fs = reply_state(r);
	if (r->code != ST(OK) || (fs != FS(HOST) && fs != FS(PINNED_HOST))) {
		snprintf(why, len, "ensure: %s %s", wf_proto_status_name(r->code), r->message);
		rc = WF_ESTATE;
	} else {
		snprintf(hex, WF_DIGEST_HEX_LEN, "%s", r->model_info->digest_hex);
	}
	wf_ctl_reply_free(r);
	return rc;
}

static int cmd_kill(const struct opts *o)
{
	uint64_t rng = o->seed ^ 0x6b696c6cull;
	unsigned long lost = 0, restart_fail = 0, ensure_fail = 0, mismatch = 0, stray = 0;
	unsigned long before_region = 0, mid_fill = 0, after_ready = 0, trials = 0;
	int64_t t_start = now_ns();
	char why[512] = "";
	char hex[WF_DIGEST_HEX_LEN] = "";
	int rcode = 0;

	struct agt *a = stage("stress-kill");
	g_step = "generate the model with wf-gen";
	char *path = agt_gen(a, "m", (int)(o->seed % 100000), o->size);
	struct stat st;
	uint64_t model_bytes = stat(path, &st) == 0 ? (uint64_t)st.st_size : 0;
	char *marg = xasprintf("m=%s", path);
	const char *args[] = {"--model", marg, NULL};
	if (!agent_up(a, args)) {
		rcode = 1;
		goto out;
	}
	/* Calibration: how long one fill takes here (the median of three after the first, cold
	 * one), so that the kills land inside it; each clean fill after a restart refines it. */
	int64_t t0 = now_ns();
	if (ensure_ready(a, 120000, hex, why, sizeof why) < 0) {
		fprintf(stderr, "wf_stress: first materialization failed: %s\n", why);
		rcode = 1;
		goto out;
	}
	double fill_first_ms = (double)(now_ns() - t0) / 1e6;
	double cal[3];
	for (int k = 0; k < 3; k++) {
		Weightfloor__V1__Reply *r = NULL;
		struct wf_diag d = {{0}};
		char hx[WF_DIGEST_HEX_LEN];
		if (call_op(a->cli, OP_RELEASE, "m", 10000, &r, &d) < 0) {
			fprintf(stderr, "wf_stress: release: %s\n", wf_diag_str(&d, WF_EINTERNAL));
			rcode = 1;
			goto out;
		}
		wf_ctl_reply_free(r);
		t0 = now_ns();
		if (ensure_ready(a, 120000, hx, why, sizeof why) < 0) {
			fprintf(stderr, "wf_stress: calibration fill failed: %s\n", why);
			rcode = 1;
			goto out;
		}
		cal[k] = (double)(now_ns() - t0);
	}
	double fill_ns = cal[0] < cal[1] ? (cal[1] < cal[2]   ? cal[1]
	                                    : cal[0] < cal[2] ? cal[2]
	                                                      : cal[0])
	                                 : (cal[0] < cal[2]   ? cal[0]
	                                    : cal[1] < cal[2] ? cal[2]
	                                                      : cal[1]);
	int64_t trial_sum_ns = 0;

	for (unsigned i = 0; i < o->trials; i++) {
		if (o->time_limit_s > 0 && secs_since(t_start) > o->time_limit_s)
			break;
		int64_t tt = now_ns(), delay = 0;
		int on_disk = -1;
		bool bad = false;
		why[0] = '\0';
		Weightfloor__V1__Reply *r = NULL;
		struct wf_diag d = {{0}};

		/* From a complete floor to none, then a fresh copy that the kill interrupts. */
		if (call_op(a->cli, OP_RELEASE, "m", 10000, &r, &d) < 0 || r->code != ST(OK)) {
			snprintf(why, sizeof why, "release before the kill failed");
			wf_ctl_reply_free(r);
			bad = true;
			goto judge;
		}
		wf_ctl_reply_free(r);
		r = NULL;
		delay = (int64_t)rng_below(&rng, (uint64_t)fill_ns + 1);
		int64_t ts = now_ns();
		if (call_op(a->cli, OP_ENSURE, "m", 10000, &r, &d) < 0 || r->code != ST(OK)) {
			snprintf(why, sizeof why, "ensure (no wait) before the kill failed");
			wf_ctl_reply_free(r);
			bad = true;
			goto judge;
		}
		wf_ctl_reply_free(r);
		r = NULL;
		sleep_ns(ts + delay - now_ns());
		agent_kill9(a);
		on_disk = region_state_on_disk(a, hex);
		if (on_disk == -1)
			before_region++;
		else if (on_disk == WF_SHM_STATE_READY)
			after_ready++;
		else
			mid_fill++;

		if (!agent_up(a, args)) {
			restart_fail++;
			bad = true;
			snprintf(why, sizeof why, "restart failed");
			goto judge;
		}
		char hex2[WF_DIGEST_HEX_LEN] = "";
		int64_t te = now_ns();
		if (ensure_ready(a, 120000, hex2, why, sizeof why) < 0) {
			ensure_fail++;
			bad = true;
			goto judge;
		}
		/* a clean fill after the restart refines the kill window */
		if (on_disk != WF_SHM_STATE_READY)
			fill_ns = 0.8 * fill_ns + 0.2 * (double)(now_ns() - te);
		if (strcmp(hex, hex2) != 0) {
			snprintf(why, sizeof why, "digest changed: %s -> %s", hex, hex2);
			mismatch++;
			bad = true;
		} else if (!floor_files_ok(a, hex, why, sizeof why)) {
			stray++;
			bad = true;
		} else if (!floor_bytes_ok(a, hex, path, why, sizeof why)) {
			mismatch++;
			bad = true;
		}
	judge:
		trials++;
		trial_sum_ns += now_ns() - tt;
		logv(o, "kill trial %u: kill after %.1f ms, region %s; %s\n", i + 1,
		     (double)delay / 1e6,
		     on_disk == -1                   ? "absent"
		     : on_disk == WF_SHM_STATE_READY ? "READY"
		                                     : "partial",
		     bad ? why : "floor READY, bytes equal, no stray files");
		if (bad) {
			lost++;
			fprintf(stderr, "kill trial %u LOST: %s\n", i + 1, why);
			if (a->pid > 0)
				log_tail(a, 15);
			/* go on from a running agent with a good floor, if one can be had */
			if (a->pid <= 0 && !agent_up(a, args))
				break;
		}
		if (!o->verbose && (i + 1) % 25 == 0)
			fprintf(stderr, "kill: %u trials, %lu lost, %.0f s\n", i + 1, lost,
			        secs_since(t_start));
	}
	int ex = agent_term(o, a);
	if (ex != 0) {
		fprintf(stderr, "wf_stress: the agent's final stop: %s\n",
		        ex < 0 ? "no exit within 5 s of SIGTERM" : "non-zero exit status");
		rcode = 1;
	}
	printf("{\"test\":\"kill\",\"trials\":%lu,\"lost\":%lu,\"restart_failures\":%lu,"
	       "\"ensure_failures\":%lu,\"byte_mismatches\":%lu,\"stray_files\":%lu,"
	       "\"killed_before_region\":%lu,\"killed_mid_fill\":%lu,\"killed_after_ready\":%lu,"
	       "\"final_exit\":%d,\"model_bytes\":%" PRIu64
	       ",\"first_fill_ms\":%.1f,\"fill_ms\":%.1f,"
	       "\"trial_ms_mean\":%.1f,\"seed\":%" PRIu64 ",\"elapsed_s\":%.1f}\n",
	       trials, lost, restart_fail, ensure_fail, mismatch, stray, before_region, mid_fill,
	       after_ready, ex, model_bytes, fill_first_ms, fill_ns / 1e6,
	       trials ? (double)trial_sum_ns / 1e6 / (double)trials : 0.0, o->seed,
	       secs_since(t_start));
	if (lost || trials == 0)
		rcode = 1;
out:
	free(marg);
	free(path);
	agt_fini();
	return rcode;
}

/* ---- malformed ------------------------------------------------------------------------------- */

static size_t put_varint(uint8_t *p, uint64_t v)
{
	size_t n = 0;
	do {
		p[n++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
		v >>= 7;
	} while (v);
	return n;
}

/* Protobuf-shaped garbage: fields with request-like and random numbers, every wire type (the
 * invalid ones too), lengths that lie, varints that overflow, and nesting up to 200 deep. At
 * most cap bytes; returns the length. */
static size_t shaped(uint64_t *rng, uint8_t *buf, size_t cap, int depth)
{
	static const uint32_t known[] = {1, 2, 3, 4, 16, 17, 18, 19, 20, 21, 22, 23, 40, 47, 48};
	size_t n = 0;
	unsigned fields = 1 + (unsigned)rng_below(rng, 6);
	for (unsigned f = 0; f < fields && n + 32 < cap; f++) {
		uint64_t num = rng_below(rng, 4)
		                   ? known[rng_below(rng, sizeof known / sizeof *known)]
		                   : rng_below(rng, (1u << 29) + 1);
		unsigned wt = rng_below(rng, 8) ? (unsigned[]){0, 1, 2, 5}[rng_below(rng, 4)]
		                                : (unsigned)rng_below(rng, 8);
		n += put_varint(buf + n, num << 3 | wt);
		switch (wt) {
		case 0:
			if (rng_below(rng, 10) == 0) {
				memset(buf + n, 0xff, 11); /* an 11-byte varint: too long */
				n += 11;
			} else {
				n += put_varint(buf + n, rng_next(rng) >> rng_below(rng, 64));
			}
			break;
		case 1:
			rng_fill(rng, buf + n, 8);
			n += 8;
			break;
		case 5:
			rng_fill(rng, buf + n, 4);
			n += 4;
			break;
		case 2: {
			uint8_t tmp[4096];
			size_t room = cap - n - 12 < sizeof tmp ? cap - n - 12 : sizeof tmp;
			size_t body;
			if (depth < 200 && rng_below(rng, 3) != 0)
				body = shaped(rng, tmp, room, depth + 1);
			else {
				body = (size_t)rng_below(rng, room < 64 ? room + 1 : 65);
				rng_fill(rng, tmp, body);
			}
			uint64_t claimed = body;
			uint64_t lie = rng_below(rng, 12);
			if (lie == 0)
				claimed = body + 1 + rng_below(rng, 100);
			else if (lie == 1)
				claimed = rng_next(rng) >> rng_below(rng, 64);
			else if (lie == 2 && body)
				claimed = body - 1;
			n += put_varint(buf + n, claimed);
			memcpy(buf + n, tmp, body);
			n += body;
			break;
		}
		default: /* 3, 4 (groups) and the undefined 6, 7: no payload */
			break;
		}
	}
	return n;
}

/* A valid Request of a random kind, packed; 0 if it does not fit. */
static size_t pack_valid(uint64_t *rng, const char *model_path, uint8_t *buf, size_t cap)
{
	static const char *const names[] = {"m", "m", "m", "m2", "", "no-such-model"};
	Weightfloor__V1__Request req = WEIGHTFLOOR__V1__REQUEST__INIT;
	Weightfloor__V1__RegisterModel rm = WEIGHTFLOOR__V1__REGISTER_MODEL__INIT;
	Weightfloor__V1__ListModels lm = WEIGHTFLOOR__V1__LIST_MODELS__INIT;
	Weightfloor__V1__ModelStatus ms = WEIGHTFLOOR__V1__MODEL_STATUS__INIT;
	Weightfloor__V1__EnsureFloor ef = WEIGHTFLOOR__V1__ENSURE_FLOOR__INIT;
	Weightfloor__V1__ReleaseFloor rf = WEIGHTFLOOR__V1__RELEASE_FLOOR__INIT;
	Weightfloor__V1__PinHost ph = WEIGHTFLOOR__V1__PIN_HOST__INIT;
	Weightfloor__V1__UnpinHost uh = WEIGHTFLOOR__V1__UNPIN_HOST__INIT;
	Weightfloor__V1__AgentStatus as = WEIGHTFLOOR__V1__AGENT_STATUS__INIT;
	Weightfloor__V1__ListWorkers lw = WEIGHTFLOOR__V1__LIST_WORKERS__INIT;
	Weightfloor__V1__WorkerStatus ws = WEIGHTFLOOR__V1__WORKER_STATUS__INIT;
	char *name = (char *)names[rng_below(rng, sizeof names / sizeof *names)];
	char *paths[2] = {(char *)model_path, "/nonexistent/model.gguf"};

	req.request_id = 1 + rng_below(rng, UINT32_MAX);
	req.api_version = WF_PROTO_API_VERSION;
	req.client = "wf_stress";
	req.deadline_ms = (uint32_t)rng_below(rng, 20000);
	switch (rng_below(rng, 11)) {
	case 0:
		rm.name = name;
		rm.paths = paths + rng_below(rng, 2);
		rm.n_paths = 1;
		rm.pin_host = rng_below(rng, 2);
		req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_REGISTER_MODEL;
		req.register_model = &rm;
		break;
	case 1:
		req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_LIST_MODELS;
		req.list_models = &lm;
		break;
	case 2:
		ms.name = name;
		req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_MODEL_STATUS;
		req.model_status = &ms;
		break;
	case 3:
		ef.name = name;
		ef.wait = rng_below(rng, 2);
		ef.wait_timeout_ms = (uint32_t)rng_below(rng, 2000);
		req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_ENSURE_FLOOR;
		req.ensure_floor = &ef;
		break;
	case 4:
		rf.name = name;
		req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_RELEASE_FLOOR;
		req.release_floor = &rf;
		break;
	case 5:
		ph.name = name;
		req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_PIN_HOST;
		req.pin_host = &ph;
		break;
	case 6:
		uh.name = name;
		req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_UNPIN_HOST;
		req.unpin_host = &uh;
		break;
	case 7:
		req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_LIST_WORKERS;
		req.list_workers = &lw;
		break;
	case 8:
		ws.worker_id = name;
		req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_WORKER_STATUS;
		req.worker_status = &ws;
		break;
	default:
		req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_AGENT_STATUS;
		req.agent_status = &as;
		break;
	}
	size_t n = weightfloor__v1__request__get_packed_size(&req);
	return n <= cap ? weightfloor__v1__request__pack(&req, buf) : 0;
}

/* One to four byte-level mutations of buf[0..n); returns the new length (<= cap). */
static size_t mutate(uint64_t *rng, uint8_t *buf, size_t n, size_t cap)
{
	static const uint8_t special[] = {0x00, 0x01, 0x7f, 0x80, 0xff, 0x08, 0x0a, 0x12};
	unsigned k = 1 + (unsigned)rng_below(rng, 4);
	for (unsigned i = 0; i < k; i++) {
		size_t pos = (size_t)rng_below(rng, n ? n : 1);
		switch (rng_below(rng, 7)) {
		case 0:
			if (n)
				buf[pos] ^= (uint8_t)(1u << rng_below(rng, 8));
			break;
		case 1:
			if (n)
				buf[pos] = (uint8_t)rng_next(rng);
			break;
		case 2:
			n = (size_t)rng_below(rng, n + 1);
			break;
		case 3: {
			size_t add = 1 + (size_t)rng_below(rng, 16);
			if (n + add > cap)
				break;
			memmove(buf + pos + add, buf + pos, n - pos);
			rng_fill(rng, buf + pos, add);
			n += add;
			break;
		}
		case 4: {
			size_t len = (size_t)rng_below(rng, n - pos + 1);
			if (n + len > cap)
				break;
			memcpy(buf + n, buf + pos, len);
			n += len;
			break;
		}
		case 5: {
			size_t len = 1 + (size_t)rng_below(rng, 11);
			if (pos + len > cap)
				break;
			memset(buf + pos, 0xff, len);
			if (pos + len > n)
				n = pos + len;
			break;
		}
		default:
			if (n)
				buf[pos] = special[rng_below(rng, sizeof special)];
			break;
		}
	}
	return n;
}

static int raw_open(const char *url, int timeout_ms, nng_socket *ret_sock)
{
	nng_socket s;
	int rv = nng_req0_open(&s);
	if (rv != 0)
		return rv;
	/* No resends: a request that the server drops with its connection fails at once with
	 * ECONNRESET/ECONNSHUT, which is how a dropped connection shows. */
	if ((rv = nng_socket_set_ms(s, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE)) != 0 ||
	    (rv = nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, timeout_ms)) != 0 ||
	    (rv = nng_socket_set_ms(s, NNG_OPT_SENDTIMEO, timeout_ms)) != 0 ||
	    (rv = nng_socket_set_ms(s, NNG_OPT_RECONNMINT, 10)) != 0 ||
	    (rv = nng_socket_set_ms(s, NNG_OPT_RECONNMAXT, 100)) != 0 ||
	    (rv = nng_socket_set_size(s, NNG_OPT_RECVMAXSZ, 16u << 20)) != 0 ||
	    (rv = nng_dial(s, url, NULL, 0)) != 0) {
		nng_close(s);
		return rv;
	}
	*ret_sock = s;
	return 0;
}

enum raw_result { RAW_REPLY, RAW_DROPPED, RAW_TIMEOUT, RAW_BAD_REPLY, RAW_ERROR };

static enum raw_result raw_exchange(nng_socket s, const void *buf, size_t len,
                                    Weightfloor__V1__Reply **ret_reply, int *ret_rv)
{
	int rv = nng_send(s, (void *)buf, len, 0);
	*ret_rv = rv;
	if (rv == NNG_ETIMEDOUT)
		return RAW_TIMEOUT;
	if (rv != 0)
		return RAW_ERROR;
	void *rb = NULL;
	size_t rl = 0;
	rv = nng_recv(s, &rb, &rl, NNG_FLAG_ALLOC);
	*ret_rv = rv;
	if (rv == NNG_ECONNRESET || rv == NNG_ECONNSHUT || rv == NNG_ECLOSED)
		return RAW_DROPPED;
	if (rv == NNG_ETIMEDOUT)
		return RAW_TIMEOUT;
	if (rv != 0)
		return RAW_ERROR;
	Weightfloor__V1__Reply *r = weightfloor__v1__reply__unpack(NULL, rl, rb);
	nng_free(rb, rl);
	if (!r)
		return RAW_BAD_REPLY;
	*ret_reply = r;
	return RAW_REPLY;
}

static int count_fds(pid_t pid)
{
	char p[64];
	snprintf(p, sizeof p, "/proc/%d/fd", (int)pid);
	return agt_dir_count(p, NULL, 0);
}

/* ReleaseFloor for every registered model (ListModels); failures show in the fd count. */
static void release_all(struct agt *a)
{
	Weightfloor__V1__Reply *r = NULL;
	struct wf_diag d = {{0}};
	if (call_op(a->cli, OP_LIST, NULL, 10000, &r, &d) < 0)
		return;
	if (r->code == ST(OK) && r->body_case == WEIGHTFLOOR__V1__REPLY__BODY_MODEL_LIST) {
		for (size_t i = 0; i < r->model_list->n_models; i++) {
			Weightfloor__V1__Reply *rr = NULL;
			call_op(a->cli, OP_RELEASE, r->model_list->models[i]->name, 10000, &rr, &d);
			wf_ctl_reply_free(rr);
		}
	}
	wf_ctl_reply_free(r);
}

/* The agent's descriptors and what they point at, for a report of a leak. */
static void list_fds(pid_t pid)
{
	char dir[64];
	snprintf(dir, sizeof dir, "/proc/%d/fd", (int)pid);
	DIR *d = opendir(dir);
	if (!d)
		return;
	struct dirent *de;
	fprintf(stderr, "wf-agent %d descriptors:", (int)pid);
	while ((de = readdir(d))) {
		if (de->d_name[0] == '.')
			continue;
		char p[384], target[256];
		snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
		ssize_t n = readlink(p, target, sizeof target - 1);
		target[n > 0 ? n : 0] = '\0';
		fprintf(stderr, " %s->%s", de->d_name, target);
	}
	fputc('\n', stderr);
	closedir(d);
}

static int cmd_malformed(const struct opts *o)
{
	enum { K_RANDOM, K_SHAPED, K_MUTATED, K_OVERSIZE, K_MAX };
	static const char *const kind_names[K_MAX] = {"random", "shaped", "mutated", "oversize"};
	unsigned long kinds[K_MAX] = {0}, codes[N_CODES] = {0};
	unsigned long replies = 0, dropped = 0, timeouts = 0, bad_replies = 0, errors = 0;
	unsigned long status_fail = 0, sent = 0;
	uint64_t rng = o->seed ^ 0x6d616c66ull;
	int64_t t_start = now_ns();
	int rcode = 0, fd_base = -1, fd_after = -1, ex = -1;
	bool alive = true;
	const size_t max_req = WF_CTL_MAX_REQUEST_DEFAULT;
	size_t cap = max_req + (256u << 10);
	uint8_t *buf = malloc(cap);
	nng_socket s = NNG_SOCKET_INITIALIZER;
	bool s_open = false;
	if (!buf) {
		fprintf(stderr, "wf_stress: out of memory\n");
		return 1;
	}

	struct agt *a = stage("stress-malformed");
	g_step = "generate the model with wf-gen";
	char *path = agt_gen(a, "m", (int)(o->seed % 100000), NULL);
	char *marg = xasprintf("m=%s", path);
	/* a small budget: mutated requests may register and ensure models under random names */
	const char *args[] = {"--model", marg, "--host-budget", "64M", NULL};
	if (!agent_up(a, args)) {
		rcode = 1;
		goto out;
	}
	pid_t pid = a->pid;
	fd_base = count_fds(pid);
	int rv = raw_open(a->sock_url, o->timeout_ms, &s);
	if (rv != 0) {
		fprintf(stderr, "wf_stress: raw socket: %s\n", nng_strerror(rv));
		rcode = 1;
		goto out;
	}
	s_open = true;

	for (unsigned i = 0; i < o->messages; i++) {
		size_t n;
		int kind;
		uint64_t x = rng_below(&rng, 2000);
		if (x == 0) {
			kind = K_OVERSIZE;
			n = max_req + 1 + (size_t)rng_below(&rng, 128u << 10);
			rng_fill(&rng, buf, n);
		} else if (x < 600) {
			kind = K_RANDOM;
			uint64_t sz = rng_below(&rng, 10);
			n = (size_t)(sz < 7   ? rng_below(&rng, 65)
			             : sz < 9 ? rng_below(&rng, 4097)
			                      : rng_below(&rng, 65537));
			rng_fill(&rng, buf, n);
		} else if (x < 1000) {
			kind = K_SHAPED;
			n = shaped(&rng, buf, 65536, 0);
		} else {
			kind = K_MUTATED;
			n = pack_valid(&rng, path, buf, 65536);
			n = mutate(&rng, buf, n, 65536);
		}
		kinds[kind]++;
		sent++;
		Weightfloor__V1__Reply *r = NULL;
		int nrv = 0;
		switch (raw_exchange(s, buf, n, &r, &nrv)) {
		case RAW_REPLY:
			replies++;
			count_code(codes, r->code);
			weightfloor__v1__reply__free_unpacked(r, NULL);
			break;
		case RAW_DROPPED:
			dropped++;
			break;
		case RAW_TIMEOUT:
			timeouts++;
			fprintf(stderr,
			        "malformed message %u (%s, %zu bytes): no reply within %d ms\n",
			        i + 1, kind_names[kind], n, o->timeout_ms);
			break;
		case RAW_BAD_REPLY:
			bad_replies++;
			fprintf(stderr, "malformed message %u (%s): the reply does not parse\n",
			        i + 1, kind_names[kind]);
			break;
		default:
			errors++;
			fprintf(stderr, "malformed message %u (%s): %s\n", i + 1, kind_names[kind],
			        nng_strerror(nrv));
			break;
		}

		/* Then a valid request on the same socket must work. */
		Weightfloor__V1__Request req = WEIGHTFLOOR__V1__REQUEST__INIT;
		Weightfloor__V1__AgentStatus as = WEIGHTFLOOR__V1__AGENT_STATUS__INIT;
		req.request_id = 0x100000000ull + i;
		req.api_version = WF_PROTO_API_VERSION;
		req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_AGENT_STATUS;
		req.agent_status = &as;
		uint8_t ok_buf[64];
		size_t ok_n = weightfloor__v1__request__pack(&req, ok_buf);
		r = NULL;
		enum raw_result res = raw_exchange(s, ok_buf, ok_n, &r, &nrv);
		if (res != RAW_REPLY || r->code != ST(OK) || r->request_id != req.request_id ||
		    r->body_case != WEIGHTFLOOR__V1__REPLY__BODY_AGENT_STATUS ||
		    r->agent_status->pid != (uint32_t)pid) {
			status_fail++;
			fprintf(stderr, "AgentStatus after malformed message %u (%s) failed: %s\n",
			        i + 1, kind_names[kind],
			        res == RAW_REPLY     ? wf_proto_status_name(r->code)
			        : res == RAW_DROPPED ? "connection dropped"
			                             : nng_strerror(nrv));
		}
		if (r)
			weightfloor__v1__reply__free_unpacked(r, NULL);
		if (status_fail > 10 || (i % 500 == 0 && kill(pid, 0) != 0)) {
			alive = kill(pid, 0) == 0;
			break;
		}
		if (!o->verbose && (i + 1) % 10000 == 0)
			fprintf(stderr, "malformed: %u messages, %.0f s\n", i + 1,
			        secs_since(t_start));
	}
	nng_close(s);
	s_open = false;
	int st;
	alive = alive && waitpid(pid, &st, WNOHANG) == 0;

	/* Every descriptor the messages cost must come back once our connection is gone and the
	 * floors that mutated requests may have made (RegisterModel and EnsureFloor are among the
	 * valid requests mutated) are released; nng closes pipes asynchronously, so wait for it. */
	if (alive) {
		release_all(a);
		int64_t end = now_ns() + 5000LL * 1000000;
		do {
			fd_after = count_fds(pid);
			if (fd_after <= fd_base)
				break;
			sleep_ns(20 * 1000000);
		} while (now_ns() < end);
		if (fd_after > fd_base)
			list_fds(pid);
		Weightfloor__V1__Reply *r = NULL;
		struct wf_diag d = {{0}};
		if (call_op(a->cli, OP_AGENT_STATUS, NULL, 10000, &r, &d) < 0 || r->code != ST(OK))
			status_fail++;
		wf_ctl_reply_free(r);
		ex = agent_term(o, a);
	} else {
		log_tail(a, 20);
		a->pid = 0;
	}
	printf(
	    "{\"test\":\"malformed\",\"messages\":%lu,\"replies\":%lu,\"dropped\":%lu,"
	    "\"timeouts\":%lu,\"bad_replies\":%lu,\"errors\":%lu,\"status_failures\":%lu,"
	    "\"agent_alive\":%s,\"fd_baseline\":%d,\"fd_after\":%d,\"final_exit\":%d,\"kinds\":{",
	    sent, replies, dropped, timeouts, bad_replies, errors, status_fail,
	    alive ? "true" : "false", fd_base, fd_after, ex);
	for (int k = 0; k < K_MAX; k++)
		printf("%s\"%s\":%lu", k ? "," : "", kind_names[k], kinds[k]);
	printf("},\"codes\":");
	codes_json(stdout, codes);
	printf(",\"seed\":%" PRIu64 ",\"elapsed_s\":%.1f}\n", o->seed, secs_since(t_start));
	if (timeouts || bad_replies || errors || status_fail || !alive || fd_after > fd_base ||
	    ex != 0)
		rcode = 1;
out:
	if (s_open)
		nng_close(s);
	free(buf);
	free(marg);
	free(path);
	agt_fini();
	return rcode;
}

/* ---- load ------------------------------------------------------------------------------------ */

#define LOAD_MODELS 8

struct load_thread {
	pthread_t th;
	const char *url;
	pthread_barrier_t *start;
	int timeout_ms;
	uint64_t rng;
	unsigned requests;
	struct lat lat;
	unsigned long done, failures;
	char first_err[256];
};

static void *load_main(void *arg)
{
	struct load_thread *t = arg;
	struct wf_ctl_client *c = NULL;
	struct wf_diag d = {{0}};
	int rc = wf_ctl_client_open(t->url, t->timeout_ms, NULL, &c, &d);
	pthread_barrier_wait(t->start);
	if (rc < 0) {
		t->failures = t->requests;
		snprintf(t->first_err, sizeof t->first_err, "open: %s", wf_diag_str(&d, rc));
		return NULL;
	}
	for (unsigned i = 0; i < t->requests; i++) {
		uint64_t x = rng_below(&t->rng, 3);
		enum op op = x == 0 ? OP_AGENT_STATUS : x == 1 ? OP_LIST : OP_MODEL_STATUS;
		char name[16];
		snprintf(name, sizeof name, "m%u", (unsigned)rng_below(&t->rng, LOAD_MODELS));
		Weightfloor__V1__Reply *r = NULL;
		wf_diag_clear(&d);
		int64_t t0 = now_ns();
		rc = call_op(c, op, name, t->timeout_ms, &r, &d);
		lat_push(&t->lat, now_ns() - t0);
		t->done++;
		if (rc == 0 && r->code == ST(OK)) {
			wf_ctl_reply_free(r);
			continue;
		}
		t->failures++;
		if (!t->first_err[0])
			snprintf(t->first_err, sizeof t->first_err, "%s: %s", op_names[op],
			         rc < 0 ? wf_diag_str(&d, rc) : wf_proto_status_name(r->code));
		wf_ctl_reply_free(r);
	}
	wf_ctl_client_close(c);
	return NULL;
}

static int cmd_load(const struct opts *o)
{
	int64_t t_start = now_ns();
	int rcode = 0, ex = -1;
	unsigned long done = 0, failures = 0;
	struct lat all = {0};
	double secs = 0;
	struct agt *a = stage("stress-load");
	g_step = "generate the model with wf-gen";
	char *path = agt_gen(a, "m", (int)(o->seed % 100000), NULL);
	char *margs[LOAD_MODELS];
	const char *args[2 * LOAD_MODELS + 1];
	for (int i = 0; i < LOAD_MODELS; i++) {
		margs[i] = xasprintf("m%d=%s", i, path);
		args[2 * i] = "--model";
		args[2 * i + 1] = margs[i];
	}
	args[2 * LOAD_MODELS] = NULL;
	if (!agent_up(a, args)) {
		rcode = 1;
		goto out;
	}
	struct load_thread *th = calloc(o->clients, sizeof(*th));
	pthread_barrier_t bar;
	if (!th || pthread_barrier_init(&bar, NULL, o->clients + 1) != 0) {
		fprintf(stderr, "wf_stress: out of memory\n");
		exit(1);
	}
	for (unsigned i = 0; i < o->clients; i++) {
		th[i].url = a->sock_url;
		th[i].start = &bar;
		th[i].timeout_ms = o->timeout_ms;
		th[i].rng = o->seed * 7919u + i;
		th[i].requests = o->requests / o->clients + (i < o->requests % o->clients);
		if (pthread_create(&th[i].th, NULL, load_main, &th[i]) != 0) {
			fprintf(stderr, "wf_stress: pthread_create failed\n");
			exit(1);
		}
	}
	pthread_barrier_wait(&bar); /* every client connected: time only the requests */
	int64_t t0 = now_ns();
	for (unsigned i = 0; i < o->clients; i++) {
		pthread_join(th[i].th, NULL);
		done += th[i].done;
		failures += th[i].failures;
		lat_merge(&all, &th[i].lat);
		lat_free(&th[i].lat);
		if (th[i].first_err[0] && failures == th[i].failures)
			fprintf(stderr, "load: first failure: %s\n", th[i].first_err);
	}
	secs = secs_since(t0);
	pthread_barrier_destroy(&bar);
	free(th);
	ex = agent_term(o, a);
	lat_sort(&all);
	printf(
	    "{\"test\":\"load\",\"clients\":%u,\"requests\":%lu,\"failures\":%lu,\"p50_ms\":%.2f,"
	    "\"p99_ms\":%.2f,\"max_ms\":%.2f,\"req_per_s\":%.0f,\"final_exit\":%d,\"seed\":%" PRIu64
	    ",\"elapsed_s\":%.1f}\n",
	    o->clients, done, failures, lat_ms(&all, 0.5), lat_ms(&all, 0.99), lat_ms(&all, 1.0),
	    secs > 0 ? (double)done / secs : 0.0, ex, o->seed, secs_since(t_start));
	if (failures || ex != 0 || done != o->requests)
		rcode = 1;
out:
	lat_free(&all);
	for (int i = 0; i < LOAD_MODELS; i++)
		free(margs[i]);
	free(path);
	agt_fini();
	return rcode;
}

/* ---- selftest -------------------------------------------------------------------------------- */

/* The checks above must be able to fail: plant each fault they look for and see it caught. */
static int cmd_selftest(const struct opts *o)
{
	int fails = 0, rcode = 0;
	char why[512] = "", hex[WF_DIGEST_HEX_LEN] = "";
	struct agt *a = stage("stress-selftest");
	g_step = "generate the model with wf-gen";
	char *path = agt_gen(a, "m", (int)(o->seed % 100000), NULL);
	char *marg = xasprintf("m=%s", path);
	const char *args[] = {"--model", marg, NULL};
	if (!agent_up(a, args) || ensure_ready(a, 60000, hex, why, sizeof why) < 0) {
		fprintf(stderr, "selftest: no floor to check: %s\n", why);
		rcode = 1;
		goto out;
	}
	if (!floor_files_ok(a, hex, why, sizeof why) ||
	    !floor_bytes_ok(a, hex, path, why, sizeof why)) {
		fprintf(stderr, "selftest: a good floor fails the checks: %s\n", why);
		fails++;
	}

	/* a stray file beside the region */
	char *stray = xasprintf("%s/wf-%s.tmp", a->floor, hex);
	int fd = open(stray, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd >= 0)
		close(fd);
	if (floor_files_ok(a, hex, why, sizeof why)) {
		fprintf(stderr, "selftest: a stray file went unnoticed\n");
		fails++;
	}
	logv(o, "selftest: stray file: %s\n", why);
	unlink(stray);
	free(stray);

	/* floor bytes that differ from the file's: change one byte of the last tensor in the file
	 * (the floor keeps the bytes it copied) */
	fd = open(path, O_RDWR | O_CLOEXEC);
	struct stat st;
	if (fd < 0 || fstat(fd, &st) < 0) {
		fprintf(stderr, "selftest: %s: %s\n", path, strerror(errno));
		fails++;
	} else {
		uint8_t b;
		off_t off = st.st_size - 1;
		if (pread(fd, &b, 1, off) == 1) {
			b ^= 0x5a;
			if (pwrite(fd, &b, 1, off) != 1)
				fails++;
		}
		if (floor_bytes_ok(a, hex, path, why, sizeof why)) {
			fprintf(stderr, "selftest: a byte mismatch went unnoticed\n");
			fails++;
		}
		logv(o, "selftest: changed byte: %s\n", why);
	}
	if (fd >= 0)
		close(fd);

	/* the descriptor count sees a connection come and go */
	int base = count_fds(a->pid), with = -1, after = -1;
	nng_socket s;
	if (raw_open(a->sock_url, 5000, &s) == 0) {
		int64_t end = now_ns() + 5000LL * 1000000;
		while ((with = count_fds(a->pid)) <= base && now_ns() < end)
			sleep_ns(10 * 1000000);
		nng_close(s);
		while ((after = count_fds(a->pid)) > base && now_ns() < end)
			sleep_ns(10 * 1000000);
	}
	if (with <= base || after != base) {
		fprintf(stderr, "selftest: fd count %d, %d with a connection, %d after\n", base,
		        with, after);
		fails++;
	}
	logv(o, "selftest: fds %d, %d with a connection, %d after\n", base, with, after);

	int ex = agent_term(o, a);
	if (ex != 0)
		fails++;
	printf("{\"test\":\"selftest\",\"failures\":%d,\"final_exit\":%d}\n", fails, ex);
	rcode = fails ? 1 : 0;
out:
	free(marg);
	free(path);
	agt_fini();
	return rcode;
}

/* ---- main ------------------------------------------------------------------------------------ */

static const char usage[] =
    "usage: wf_stress churn|kill|malformed|load|selftest [options]\n"
    "  --clients N      client threads (churn 16, load 64)\n"
    "  --ops N          churn: requests per run over all clients [4000]\n"
    "  --runs N         churn: runs, each with a fresh agent [3]\n"
    "  --trials N       kill: SIGKILL trials [20]\n"
    "  --messages N     malformed: hostile messages [5000]\n"
    "  --requests N     load: requests over all clients [12800]\n"
    "  --size SIZE      model size for wf-gen (churn 64M, kill 128M)\n"
    "  --timeout-ms N   per-request timeout [10000]\n"
    "  --time-limit S   churn, kill: start no new run or trial after S seconds\n"
    "  --stop-on-fail   churn: no more runs after the first that fails\n"
    "  --seed N         random seed [time]\n"
    "  --stacks FILE    append gdb stacks of a hung agent to FILE\n"
    "  --keep           keep the test directories\n"
    "  -v, --verbose    one line per trial\n";

static bool parse_uint(const char *s, unsigned *ret)
{
	char *end;
	errno = 0;
	unsigned long v = strtoul(s, &end, 10);
	if (errno || end == s || *end || v == 0 || v > 100000000ul)
		return false;
	*ret = (unsigned)v;
	return true;
}

int main(int argc, char **argv)
{
	enum {
		O_CLIENTS = 256,
		O_OPS,
		O_RUNS,
		O_TRIALS,
		O_MESSAGES,
		O_REQUESTS,
		O_SIZE,
		O_TIMEOUT,
		O_SEED,
		O_STACKS,
		O_KEEP,
		O_LIMIT,
		O_STOP
	};
	static const struct option lo[] = {
	    {"clients", required_argument, NULL, O_CLIENTS},
	    {"ops", required_argument, NULL, O_OPS},
	    {"runs", required_argument, NULL, O_RUNS},
	    {"trials", required_argument, NULL, O_TRIALS},
	    {"messages", required_argument, NULL, O_MESSAGES},
	    {"requests", required_argument, NULL, O_REQUESTS},
	    {"size", required_argument, NULL, O_SIZE},
	    {"timeout-ms", required_argument, NULL, O_TIMEOUT},
	    {"time-limit", required_argument, NULL, O_LIMIT},
	    {"seed", required_argument, NULL, O_SEED},
	    {"stacks", required_argument, NULL, O_STACKS},
	    {"keep", no_argument, NULL, O_KEEP},
	    {"stop-on-fail", no_argument, NULL, O_STOP},
	    {"verbose", no_argument, NULL, 'v'},
	    {"help", no_argument, NULL, 'h'},
	    {0},
	};
	if (argc < 2 || argv[1][0] == '-') {
		fputs(usage, argc < 2 ? stderr : stdout);
		return argc < 2 ? 2 : 0;
	}
	const char *cmd = argv[1];
	struct opts o = {.ops = 4000,
	                 .runs = 3,
	                 .trials = 20,
	                 .messages = 5000,
	                 .requests = 12800,
	                 .timeout_ms = 10000,
	                 .seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20)};
	unsigned timeout = 0;
	int c;
	optind = 2;
	while ((c = getopt_long(argc, argv, "vh", lo, NULL)) != -1) {
		bool ok = true;
		switch (c) {
		case O_CLIENTS:
			ok = parse_uint(optarg, &o.clients);
			break;
		case O_OPS:
			ok = parse_uint(optarg, &o.ops);
			break;
		case O_RUNS:
			ok = parse_uint(optarg, &o.runs);
			break;
		case O_TRIALS:
			ok = parse_uint(optarg, &o.trials);
			break;
		case O_MESSAGES:
			ok = parse_uint(optarg, &o.messages);
			break;
		case O_REQUESTS:
			ok = parse_uint(optarg, &o.requests);
			break;
		case O_SIZE:
			o.size = optarg;
			break;
		case O_TIMEOUT:
			ok = parse_uint(optarg, &timeout) && timeout <= 600000;
			o.timeout_ms = (int)timeout;
			break;
		case O_LIMIT:
			o.time_limit_s = atof(optarg);
			ok = o.time_limit_s > 0;
			break;
		case O_SEED:
			o.seed = strtoull(optarg, NULL, 0);
			break;
		case O_STACKS:
			o.stacks = optarg;
			break;
		case O_KEEP:
			setenv("WF_TEST_KEEP", "1", 1);
			break;
		case O_STOP:
			o.stop_on_fail = true;
			break;
		case 'v':
			o.verbose = true;
			break;
		case 'h':
			fputs(usage, stdout);
			return 0;
		default:
			ok = false;
			break;
		}
		if (!ok) {
			fprintf(stderr, "wf_stress: bad option value\n%s", usage);
			return 2;
		}
	}
	if (optind != argc) {
		fprintf(stderr, "wf_stress: unexpected argument '%s'\n%s", argv[optind], usage);
		return 2;
	}
	signal(SIGPIPE, SIG_IGN);
	struct sigaction sa = {.sa_handler = on_abort};
	sigaction(SIGABRT, &sa, NULL);
	setvbuf(stdout, NULL, _IOLBF, 0);

	if (strcmp(cmd, "churn") == 0) {
		if (!o.clients)
			o.clients = 16;
		if (!o.size)
			o.size = "64M";
		return cmd_churn(&o);
	}
	if (strcmp(cmd, "kill") == 0) {
		if (!o.size)
			o.size = "128M";
		return cmd_kill(&o);
	}
	if (strcmp(cmd, "malformed") == 0)
		return cmd_malformed(&o);
	if (strcmp(cmd, "selftest") == 0)
		return cmd_selftest(&o);
	if (strcmp(cmd, "load") == 0) {
		if (!o.clients)
			o.clients = 64;
		return cmd_load(&o);
	}
	fprintf(stderr, "wf_stress: unknown command '%s'\n%s", cmd, usage);
	return 2;
}
