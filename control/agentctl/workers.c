/* agentctl commands of the worker slice, through the agent (which relays to each worker):
 * workers, residency, pin, unpin, evict, prefetch, compact. */
#include "cli.h"
#include "pbjson.h"

#include "control/client.h"

#include <getopt.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *residency_name(Weightfloor__V1__Residency r)
{
	switch (r) {
	case WEIGHTFLOOR__V1__RESIDENCY__RESIDENCY_DISK:
		return "DISK";
	case WEIGHTFLOOR__V1__RESIDENCY__RESIDENCY_HOST:
		return "HOST";
	case WEIGHTFLOOR__V1__RESIDENCY__RESIDENCY_DEVICE:
		return "DEVICE";
	case WEIGHTFLOOR__V1__RESIDENCY__RESIDENCY_PINNED_DEVICE:
		return "PINNED_DEVICE";
	default:
		return "?";
	}
}

/* "self-managed", "external" as wf-worker --mode and its log say; "-" from a worker that does
 * not say (older than the field). */
static const char *mode_name(Weightfloor__V1__ResidencyMode m)
{
	switch (m) {
	case WEIGHTFLOOR__V1__RESIDENCY_MODE__RESIDENCY_MODE_SELF_MANAGED:
		return "self-managed";
	case WEIGHTFLOOR__V1__RESIDENCY_MODE__RESIDENCY_MODE_EXTERNAL:
		return "external";
	default:
		return "-";
	}
}

static int parse_residency(const char *s, Weightfloor__V1__Residency *out)
{
	static const struct {
		const char *name;
		Weightfloor__V1__Residency r;
	} t[] = {
	    {"disk", WEIGHTFLOOR__V1__RESIDENCY__RESIDENCY_DISK},
	    {"host", WEIGHTFLOOR__V1__RESIDENCY__RESIDENCY_HOST},
	    {"device", WEIGHTFLOOR__V1__RESIDENCY__RESIDENCY_DEVICE},
	    {"pinned_device", WEIGHTFLOOR__V1__RESIDENCY__RESIDENCY_PINNED_DEVICE},
	    {"pinned-device", WEIGHTFLOOR__V1__RESIDENCY__RESIDENCY_PINNED_DEVICE},
	};
	for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
		if (strcasecmp(s, t[i].name) == 0) {
			*out = t[i].r;
			return 0;
		}
	}
	return -1;
}

static int list_workers(struct cli *cli, Weightfloor__V1__Reply **ret)
{
	Weightfloor__V1__ListWorkers lw = WEIGHTFLOOR__V1__LIST_WORKERS__INIT;
	Weightfloor__V1__Request req = WEIGHTFLOOR__V1__REQUEST__INIT;
	req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_LIST_WORKERS;
	req.list_workers = &lw;
	int rc = cli_call(cli, "workers", &req, 0, ret);
	if (rc == 0 && (*ret)->body_case != WEIGHTFLOOR__V1__REPLY__BODY_WORKER_LIST) {
		wf_ctl_reply_free(*ret);
		return cli_fail(cli, CLI_EXIT_FAIL,
		                "workers: the agent answered without a worker list");
	}
	return rc;
}

static int worker_status(struct cli *cli, struct wf_ctl_client **c, const char *id,
                         Weightfloor__V1__Reply **ret)
{
	Weightfloor__V1__WorkerStatus ws = WEIGHTFLOOR__V1__WORKER_STATUS__INIT;
	ws.worker_id = (char *)id;
	Weightfloor__V1__Request req = WEIGHTFLOOR__V1__REQUEST__INIT;
	req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_WORKER_STATUS;
	req.worker_status = &ws;
	int rc = c ? cli_call_on(cli, c, "worker status", &req, 0, ret)
	           : cli_call(cli, "worker status", &req, 0, ret);
	if (rc == 0 && (*ret)->body_case != WEIGHTFLOOR__V1__REPLY__BODY_WORKER_INFO) {
		wf_ctl_reply_free(*ret);
		return cli_fail(cli, CLI_EXIT_FAIL, "worker status %s: unexpected reply", id);
	}
	return rc;
}

/* A rate as a percentage, "-" when there was nothing to measure (-1). */
static const char *fmt_pct(double v, char *buf, size_t len)
{
	if (v < 0)
		snprintf(buf, len, "-");
	else
		snprintf(buf, len, "%.1f%%", v * 100.0);
	return buf;
}

/* The model's completion engine, as of its last finished completion (docs/PROTOCOL.md). */
static void engine_note(struct cli_table *t, const Weightfloor__V1__ModelResidency *m)
{
	char tps[32], fpt[32], ov[16], fb[16], hit[16], sp[32];
	if (m->decode_tokens_per_s > 0)
		snprintf(tps, sizeof tps, "%.1f", m->decode_tokens_per_s);
	else
		snprintf(tps, sizeof tps, "-");
	if (m->fetch_bytes_per_token >= 0)
		cli_fmt_bytes((uint64_t)(m->fetch_bytes_per_token + 0.5), fpt, sizeof fpt);
	else
		snprintf(fpt, sizeof fpt, "-");
	cli_table_note(
	    t,
	    "  engine: %llu completions, %llu tokens, %s tokens/s (last), fetched %s/token, "
	    "overlap %s, fallback %s, scratchpad %s, cache hit %s",
	    (unsigned long long)m->engine_completions, (unsigned long long)m->engine_tokens, tps,
	    fpt, fmt_pct(m->fetch_overlap, ov, sizeof ov),
	    fmt_pct(m->fetch_fallback_rate, fb, sizeof fb),
	    cli_fmt_bytes(m->scratchpad_bytes, sp, sizeof sp),
	    fmt_pct(m->cache_hit_rate, hit, sizeof hit));
}

/* What the worker holds of the model: its resident weight sets, and its engine's placement,
 * own device bytes and the experts its cache holds (docs/PROTOCOL.md "What a worker holds"). */
static void holds_note(struct cli_table *t, const Weightfloor__V1__ModelResidency *m)
{
	char line[1024], b[32];
	size_t at = 0;
	for (size_t i = 0; i < m->n_sets && at < sizeof line - 64; i++)
		at += (size_t)snprintf(line + at, sizeof line - at, "%s%s %s%s", i ? ", " : "",
		                       m->sets[i]->name,
		                       cli_fmt_bytes(m->sets[i]->device_bytes, b, sizeof b),
		                       m->sets[i]->pinned ? " pinned" : "");
	if (m->n_sets)
		cli_table_note(t, "  sets: %s", line);
	if (!m->placement || !m->placement[0])
		return;
	cli_table_note(t, "  placement: %s; own device bytes %s", m->placement,
	               cli_fmt_bytes(m->engine_device_bytes, b, sizeof b));
	if (!m->expert_slots)
		return;
	at = 0;
	for (size_t i = 0; i < m->n_cached_experts && at < sizeof line - 16; i++)
		at += (size_t)snprintf(line + at, sizeof line - at, "%s%u:%u", i ? " " : "",
		                       m->cached_experts[i] >> 16, m->cached_experts[i] & 0xffffu);
	cli_table_note(t, "  expert cache: %zu of %u slots hold experts (layer:expert) %s",
	               m->n_cached_experts, m->expert_slots, m->n_cached_experts ? line : "-");
}

int cmd_workers(struct cli *cli, int argc, char **argv)
{
	static const struct option opts[] = {{"help", no_argument, NULL, 'h'}, {0}};
	int c;
	optind = 0; /* 0, not 1: glibc then re-initializes (and permutes: options anywhere) */
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
		if (c == 'h') {
			printf(
			    "usage: agentctl workers [--json] [-o wide]\n"
			    "  The node's workers: id, residency mode (self-managed or external), "
			    "pid,\n"
			    "  device (whole name), device memory total, on-demand budget and "
			    "use,\n"
			    "  pinned device bytes / weight pool (OVER: pinned over-commit), "
			    "pinned host\n"
			    "  memory, endpoint; then each model's residency and device bytes, and "
			    "for\n"
			    "  a model its weight sets on the device, and with a completion engine "
			    "its\n"
			    "  placement, own device bytes, the experts its cache holds and its\n"
			    "  metrics (tokens/s of the last\n"
			    "  completion, post-fetched bytes per token, copy overlap, fallback "
			    "rate,\n"
			    "  scratchpad bytes, expert cache hit rate). -o wide\n"
			    "  adds the device index and uuid and the last heartbeat. --json:\n"
			    "  {\"workers\": [WorkerInfo + \"reachable\"]}, \"mode\" SELF_MANAGED "
			    "or\n"
			    "  EXTERNAL.\n");
			return CLI_EXIT_OK;
		}
		return cli_bad_option(cli, "workers", argc, argv);
	}
	int rc = cli_check_args(cli, "workers", argc, argv, optind, 0, 0, "");
	if (rc)
		return rc;
	Weightfloor__V1__Reply *rep;
	rc = list_workers(cli, &rep);
	if (rc)
		return rc;
	const Weightfloor__V1__WorkerList *wl = rep->worker_list;
	struct json_object *arr = cli->json ? json_object_new_array() : NULL;
	/* Pinned host memory is a wide column: workers report it only when they pin host memory
	 * of their own (a budget of 0 says nothing). */
	static const char *const hdr[] = {"WORKER", "MODE", "PID",    "DEVICE",   "TOTAL",
	                                  "BUDGET", "USED", "PINNED", "ENDPOINT", "PINNED HOST",
	                                  "INDEX",  "UUID", "SEEN"};
	struct cli_table *t = cli_table_new(cli->wide ? 13 : 9, hdr, "..r.rrrr.rr..");
	/* A worker's own status is what it holds now; errors polling it are shown per row. */
	struct cli quiet = *cli;
	quiet.quiet = true;
	quiet.json = true;
	int64_t now_ms;
	{
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		now_ms = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
	}
	for (size_t i = 0; i < wl->n_workers; i++) {
		const Weightfloor__V1__WorkerInfo *w = wl->workers[i];
		Weightfloor__V1__Reply *st = NULL;
		/* The agent's entry says who the worker is; the worker itself says what it holds.
		 */
		bool live = worker_status(&quiet, NULL, w->worker_id, &st) == 0;
		Weightfloor__V1__WorkerInfo *wi =
		    live ? st->worker_info : (Weightfloor__V1__WorkerInfo *)w;
		if (cli->json) {
			struct json_object *o = wf_pb_to_json(&wi->base);
			json_object_object_add(o, "reachable", json_object_new_boolean(live));
			json_object_array_add(arr, o);
		} else {
			char b[32];
			char b2[32];
			cli_table_addf(t, 0, "%s", wi->worker_id);
			cli_table_addf(t, 1, "%s", mode_name(wi->mode));
			cli_table_addf(t, 2, "%u", wi->pid);
			cli_table_addf(t, 3, "%s", wi->device_name);
			cli_table_addf(t, 4, "%s",
			               cli_fmt_bytes(wi->device_total_bytes, b, sizeof b));
			cli_table_addf(t, 5, "%s",
			               cli_fmt_bytes(wi->device_budget_bytes, b, sizeof b));
			cli_table_addf(t, 6, "%s",
			               cli_fmt_bytes(wi->device_used_bytes, b, sizeof b));
			/* pinned device bytes against the weight pool; beyond it an over-commit */
			if (live)
				cli_table_addf(
				    t, 7, "%s / %s%s",
				    cli_fmt_bytes(wi->device_pinned_bytes, b, sizeof b),
				    cli_fmt_bytes(wi->device_weight_pool_bytes, b2, sizeof b2),
				    wi->device_pinned_overcommit ? " OVER" : "");
			else
				cli_table_addf(t, 7, "-");
			cli_table_addf(t, 8, "%s%s", wi->endpoint, live ? "" : " (unreachable)");
			if (cli->wide) {
				/* pinned host memory; over-commit shows as used > budget */
				cli_table_addf(
				    t, 9, "%s / %s%s",
				    cli_fmt_bytes(wi->pinned_host_used_bytes, b, sizeof b),
				    cli_fmt_bytes(wi->pinned_host_budget_bytes, b2, sizeof b2),
				    wi->pinned_host_budget_bytes && wi->pinned_host_used_bytes >
				                                        wi->pinned_host_budget_bytes
				        ? " OVER"
				        : "");
				cli_table_addf(t, 10, "%d", wi->device_index);
				cli_table_addf(t, 11, "%s", wi->device_uuid);
				int64_t ago = now_ms - wi->last_seen_unix_ms;
				cli_table_addf(t, 12, "%s ago",
				               cli_fmt_duration(wi->last_seen_unix_ms && ago > 0
				                                    ? (uint64_t)ago
				                                    : 0,
				                                b, sizeof b));
			}
			for (size_t k = 0; live && k < wi->n_models; k++) {
				const Weightfloor__V1__ModelResidency *m = wi->models[k];
				cli_table_note(t, "%s  %s  %s on device", m->model,
				               residency_name(m->state),
				               cli_fmt_bytes(m->device_bytes, b, sizeof b));
				holds_note(t, m);
				if (m->engine)
					engine_note(t, m);
			}
		}
		wf_ctl_reply_free(st);
	}
	if (cli->json) {
		struct json_object *o = json_object_new_object();
		json_object_object_add(o, "workers", arr);
		cli_json_print(cli, o);
	} else {
		cli_table_print(t, stdout);
	}
	cli_table_free(t);
	wf_ctl_reply_free(rep);
	return CLI_EXIT_OK;
}

/* A residency command runs in a thread per worker, each with its own client, while the main
 * thread shows the loads' progress from WorkerStatus polls: one bar per worker, redrawn in place
 * on a terminal; on anything else no bars, only the final lines. */
struct job {
	struct cli cli; /* a copy: its first error is this worker's */
	struct wf_ctl_client *client;
	const char *verb, *model, *state, *worker;
	char **reload;
	size_t n_reload;
	Weightfloor__V1__Reply *rep;
	int rc;
	int done; /* atomic */
	/* progress, main thread only */
	uint64_t bytes_done, bytes_total;
	struct cli_rate rate;
	bool bar;
};

static bool verb_loads(const char *verb, const char *state)
{
	/* evict, unpin and compact free memory at once: no bar for them */
	if (strcmp(verb, "pin") == 0 || strcmp(verb, "prefetch") == 0)
		return true;
	return strcmp(verb, "residency") == 0 && state &&
	       (strcasecmp(state, "device") == 0 || strncasecmp(state, "pinned", 6) == 0);
}

static void *run_job(void *arg)
{
	struct job *j = arg;
	Weightfloor__V1__Request req = WEIGHTFLOOR__V1__REQUEST__INIT;
	Weightfloor__V1__SetResidency sr = WEIGHTFLOOR__V1__SET_RESIDENCY__INIT;
	Weightfloor__V1__Pin pn = WEIGHTFLOOR__V1__PIN__INIT;
	Weightfloor__V1__Unpin up = WEIGHTFLOOR__V1__UNPIN__INIT;
	Weightfloor__V1__Evict ev = WEIGHTFLOOR__V1__EVICT__INIT;
	Weightfloor__V1__Prefetch pf = WEIGHTFLOOR__V1__PREFETCH__INIT;
	Weightfloor__V1__Compact cp = WEIGHTFLOOR__V1__COMPACT__INIT;
	char *wid = (char *)(j->worker ? j->worker : "");
	const char *verb = j->verb;
	if (strcmp(verb, "residency") == 0) {
		parse_residency(j->state, &sr.target); /* checked by the caller */
		sr.model = (char *)j->model;
		sr.worker_id = wid;
		req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_SET_RESIDENCY;
		req.set_residency = &sr;
	} else if (strcmp(verb, "pin") == 0) {
		pn.model = (char *)j->model;
		pn.worker_id = wid;
		req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_PIN;
		req.pin = &pn;
	} else if (strcmp(verb, "unpin") == 0) {
		up.model = (char *)j->model;
		up.worker_id = wid;
		req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_UNPIN;
		req.unpin = &up;
	} else if (strcmp(verb, "evict") == 0) {
		ev.model = (char *)j->model;
		ev.worker_id = wid;
		req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_EVICT;
		req.evict = &ev;
	} else if (strcmp(verb, "prefetch") == 0) {
		pf.model = (char *)j->model;
		pf.worker_id = wid;
		req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_PREFETCH;
		req.prefetch = &pf;
	} else {
		cp.reload = j->reload;
		cp.n_reload = j->n_reload;
		cp.worker_id = wid;
		req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_COMPACT;
		req.compact = &cp;
	}
	char what[160];
	snprintf(what, sizeof what, "%s%s%.64s%s%.32s", verb, j->model ? " " : "",
	         j->model ? j->model : "", j->worker ? " on " : "", j->worker ? j->worker : "");
	/* A load can take minutes: 30 of them unless --timeout says otherwise. The request carries
	 * it as its deadline, which bounds the agent's relay and the worker's calls to the agent.
	 */
	j->rc = cli_call_on(&j->cli, &j->client, what, &req,
	                    j->cli.timeout_given ? j->cli.timeout_ms : 30 * 60 * 1000, &j->rep);
	__atomic_store_n(&j->done, 1, __ATOMIC_RELEASE);
	return NULL;
}

static void draw_bars(struct job *jobs, size_t n, bool multi, int *lines_drawn)
{
	char line[256];
	if (*lines_drawn > 0)
		fprintf(stderr, "\033[%dA", *lines_drawn);
	int drawn = 0;
	for (size_t i = 0; i < n; i++) {
		struct job *j = &jobs[i];
		if (!j->bar)
			continue;
		uint64_t rate = cli_rate_update(&j->rate, j->bytes_done);
		cli_fmt_progress(line, sizeof line, j->bytes_done, j->bytes_total, rate, 30);
		fprintf(stderr, "\r\033[K%s%s%s %s\n", multi && j->worker ? j->worker : "",
		        multi && j->worker ? " " : "", j->model, line);
		drawn++;
	}
	fflush(stderr);
	*lines_drawn = drawn;
}

static void run_jobs(struct cli *cli, struct job *jobs, size_t n)
{
	pthread_t th[n ? n : 1];
	bool started[n ? n : 1];
	for (size_t i = 0; i < n; i++) {
		started[i] = pthread_create(&th[i], NULL, run_job, &jobs[i]) == 0;
		if (!started[i])
			run_job(&jobs[i]);
	}
	bool bars = !cli->quiet && !cli->json && isatty(STDERR_FILENO) && n &&
	            verb_loads(jobs[0].verb, jobs[0].state);
	int lines = 0;
	struct cli quiet = *cli;
	quiet.quiet = quiet.json = true; /* polling errors are the command's to report */
	for (;;) {
		bool all_done = true;
		for (size_t i = 0; i < n; i++)
			all_done &= __atomic_load_n(&jobs[i].done, __ATOMIC_ACQUIRE) != 0;
		if (all_done)
			break;
		struct timespec ts = {0, 200 * 1000 * 1000};
		nanosleep(&ts, NULL);
		if (!bars)
			continue;
		for (size_t i = 0; i < n; i++) {
			struct job *j = &jobs[i];
			if (__atomic_load_n(&j->done, __ATOMIC_ACQUIRE))
				continue;
			Weightfloor__V1__Reply *st = NULL;
			if (worker_status(&quiet, NULL, j->worker ? j->worker : "", &st) != 0)
				continue;
			for (size_t k = 0; k < st->worker_info->n_models; k++) {
				const Weightfloor__V1__ModelResidency *m =
				    st->worker_info->models[k];
				if (strcmp(m->model, j->model) == 0 && m->bytes_total) {
					j->bytes_done = m->bytes_done;
					j->bytes_total = m->bytes_total;
					j->bar = true;
				}
			}
			wf_ctl_reply_free(st);
		}
		draw_bars(jobs, n, n > 1, &lines);
	}
	for (size_t i = 0; i < n; i++)
		if (started[i])
			pthread_join(th[i], NULL);
	if (bars && lines) {
		/* the final frame: 100% for the loads that succeeded */
		for (size_t i = 0; i < n; i++)
			if (jobs[i].rc == 0 && jobs[i].bar)
				jobs[i].bytes_done = jobs[i].bytes_total;
		draw_bars(jobs, n, n > 1, &lines);
	}
	for (size_t i = 0; i < n; i++) {
		wf_ctl_client_close(jobs[i].client);
		jobs[i].client = NULL;
	}
}

static struct json_object *job_json(const struct job *j)
{
	struct json_object *o;
	if (j->rc) {
		o = cli_error_json(j->rc, j->cli.err_msg);
	} else if (j->rep->body_case == WEIGHTFLOOR__V1__REPLY__BODY_RESIDENCY) {
		o = wf_pb_to_json(&j->rep->residency->base);
	} else if (j->rep->body_case == WEIGHTFLOOR__V1__REPLY__BODY_COMPACT) {
		o = wf_pb_to_json(&j->rep->compact->base);
	} else {
		o = json_object_new_object();
	}
	const char *wid =
	    j->worker ? j->worker
	              : (j->rep && j->rep->body_case == WEIGHTFLOOR__V1__REPLY__BODY_RESIDENCY
	                     ? j->rep->residency->worker_id
	                     : "");
	json_object_object_add(o, "worker_id", json_object_new_string(wid));
	return o;
}

static void jobs_table(const struct job *jobs, size_t n)
{
	static const char *const hdr[] = {"WORKER", "MODEL", "STATE", "ON DEVICE"};
	static const char *const chdr[] = {"WORKER", "FREED", "RELOADED", "MODELS", "TIME"};
	bool compact = strcmp(jobs[0].verb, "compact") == 0;
	struct cli_table *t =
	    compact ? cli_table_new(5, chdr, ".rrrr") : cli_table_new(4, hdr, "...r");
	char b[32];
	for (size_t i = 0; i < n; i++) {
		const struct job *j = &jobs[i];
		if (j->rc)
			continue; /* its error is on stderr */
		if (j->rep->body_case == WEIGHTFLOOR__V1__REPLY__BODY_RESIDENCY) {
			const Weightfloor__V1__ModelResidency *m = j->rep->residency;
			cli_table_addf(t, 0, "%s",
			               m->worker_id[0] ? m->worker_id
			                               : (j->worker ? j->worker : ""));
			cli_table_addf(t, 1, "%s", m->model);
			cli_table_addf(t, 2, "%s", residency_name(m->state));
			cli_table_addf(t, 3, "%s", cli_fmt_bytes(m->device_bytes, b, sizeof b));
		} else if (j->rep->body_case == WEIGHTFLOOR__V1__REPLY__BODY_COMPACT) {
			const Weightfloor__V1__CompactReply *c = j->rep->compact;
			cli_table_addf(t, 0, "%s", j->worker ? j->worker : "");
			cli_table_addf(t, 1, "%s", cli_fmt_bytes(c->bytes_freed, b, sizeof b));
			cli_table_addf(t, 2, "%s", cli_fmt_bytes(c->bytes_moved, b, sizeof b));
			cli_table_addf(t, 3, "%zu", c->n_reloaded);
			cli_table_addf(t, 4, "%" PRIu64 " ms", c->duration_ms);
		}
	}
	cli_table_print(t, stdout);
	cli_table_free(t);
}

static const char verb_help[] =
    "usage: agentctl residency MODEL disk|host|device|pinned_device [--worker ID | --all]\n"
    "       agentctl pin|unpin|evict|prefetch MODEL [--worker ID | --all]\n"
    "       agentctl compact [MODEL...] [--worker ID | --all]\n"
    "  Moves MODEL on a worker: pin loads it on the device and keeps it there, unpin makes it\n"
    "  evictable, evict frees its device memory, prefetch loads it; compact frees every\n"
    "  unpinned device buffer, then reloads the MODELs listed.\n"
    "  --worker ID  the worker (without it the node must have exactly one)\n"
    "  --all        every worker at once, one progress bar each on a terminal\n"
    "  Prints a row per worker (WORKER MODEL STATE ON DEVICE). --json: the ModelResidency\n"
    "  (compact: CompactReply) object with \"worker_id\"; with --all one document\n"
    "  {\"workers\": [...]}, a worker that failed as {\"worker_id\", \"error\": {...}}.\n";

/* residency MODEL STATE | pin MODEL | unpin MODEL | evict MODEL | prefetch MODEL |
 * compact [MODEL...], each with [--worker ID | --all]. */
int cmd_worker_verb(struct cli *cli, int argc, char **argv)
{
	const char *verb = argv[0];
	static const struct option opts[] = {
	    {"worker", required_argument, NULL, 'w'},
	    {"all", no_argument, NULL, 'a'},
	    {"help", no_argument, NULL, 'h'},
	    {0},
	};
	const char *worker = NULL;
	bool all = false;
	int c;
	optind = 0; /* 0, not 1: glibc then re-initializes (and permutes: options anywhere) */
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":w:ah", opts, NULL)) != -1) {
		switch (c) {
		case 'w':
			worker = optarg;
			break;
		case 'a':
			all = true;
			break;
		case 'h':
			printf("%s", verb_help);
			return CLI_EXIT_OK;
		default:
			return cli_bad_option(cli, verb, argc, argv);
		}
	}
	bool is_residency = strcmp(verb, "residency") == 0,
	     is_compact = strcmp(verb, "compact") == 0;
	int rc = is_residency
	             ? cli_check_args(cli, verb, argc, argv, optind, 2, 2, "MODEL and STATE")
	         : is_compact ? 0
	                      : cli_check_args(cli, verb, argc, argv, optind, 1, 1, "MODEL");
	if (rc)
		return rc;
	if (worker && all)
		return cli_usage(cli, verb, "--worker and --all exclude each other");
	const char *model = is_compact ? NULL : argv[optind];
	const char *state = is_residency ? argv[optind + 1] : NULL;
	Weightfloor__V1__Residency target;
	if (is_residency && parse_residency(state, &target) < 0)
		return cli_usage(cli, verb, "STATE '%s' is not disk, host, device or pinned_device",
		                 state);
	char **reload = is_compact ? argv + optind : NULL;
	size_t n_reload = is_compact ? (size_t)(argc - optind) : 0;

	Weightfloor__V1__Reply *wl = NULL;
	size_t n = 1;
	if (all) {
		if ((rc = list_workers(cli, &wl)))
			return rc;
		n = wl->worker_list->n_workers;
		if (n == 0) {
			wf_ctl_reply_free(wl);
			return cli_fail(cli, CLI_EXIT_NOT_FOUND,
			                "%s --all: no worker is registered", verb);
		}
	}
	struct job *jobs = calloc(n, sizeof(*jobs));
	if (!jobs) {
		wf_ctl_reply_free(wl);
		return cli_fail(cli, CLI_EXIT_FAIL, "%s: out of memory", verb);
	}
	for (size_t i = 0; i < n; i++) {
		jobs[i].cli = *cli;
		jobs[i].cli.err_exit = 0;
		jobs[i].cli.err_msg[0] = '\0';
		jobs[i].verb = verb;
		jobs[i].model = model;
		jobs[i].state = state;
		jobs[i].reload = reload;
		jobs[i].n_reload = n_reload;
		jobs[i].worker = all ? wl->worker_list->workers[i]->worker_id : worker;
	}
	run_jobs(cli, jobs, n);
	rc = CLI_EXIT_OK;
	for (size_t i = 0; i < n; i++) {
		if (jobs[i].rc && !rc) {
			rc = jobs[i].rc;
			/* the command's error, for the JSON error document of a single worker */
			cli->err_exit = jobs[i].rc;
			snprintf(cli->err_msg, sizeof cli->err_msg, "%s", jobs[i].cli.err_msg);
		}
	}
	if (cli->json) {
		if (all) {
			struct json_object *arr = json_object_new_array();
			for (size_t i = 0; i < n; i++)
				json_object_array_add(arr, job_json(&jobs[i]));
			struct json_object *o = json_object_new_object();
			json_object_object_add(o, "workers", arr);
			cli_json_print(cli, o);
		} else if (!jobs[0].rc) {
			cli_json_print(cli, job_json(&jobs[0]));
		}
	} else if (rc == 0 || all) {
		jobs_table(jobs, n);
	}
	for (size_t i = 0; i < n; i++)
		wf_ctl_reply_free(jobs[i].rep);
	free(jobs);
	wf_ctl_reply_free(wl);
	return rc;
}
