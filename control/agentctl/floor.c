/* agentctl commands of the floor slice: models, status, register, floor ensure|release|pin|unpin,
 * watch. */
#include "cli.h"
#include "pbjson.h"

#include "base/error.h"
#include "control/client.h"
#include "proto/status.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *state_name(Weightfloor__V1__FloorState s)
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
		return "?";
	}
}

static void models_table(struct cli *cli, Weightfloor__V1__ModelInfo **m, size_t n)
{
	static const char *const hdr[] = {"MODEL",   "STATE",   "SIZE", "IN RAM", "EXPERTS",
	                                  "TENSORS", "HOLDERS", "ARCH", "DIGEST", "FILES"};
	struct cli_table *t = cli_table_new(cli->wide ? 10 : 9, hdr, "..rrrrr...");
	char b[32];
	for (size_t i = 0; i < n; i++) {
		/* IN RAM and HOLDERS are what the floor directory holds now, whatever the state:
		 * a released floor that workers still map is DISK with bytes in RAM. */
		cli_table_addf(t, 0, "%s", m[i]->name);
		cli_table_addf(t, 1, "%s%s", state_name(m[i]->floor_state),
		               m[i]->stale ? " STALE" : "");
		cli_table_addf(t, 2, "%s", cli_fmt_bytes(m[i]->total_bytes, b, sizeof b));
		cli_table_addf(
		    t, 3, "%s",
		    m[i]->region_present ? cli_fmt_bytes(m[i]->resident_bytes, b, sizeof b) : "-");
		cli_table_addf(t, 4, "%s", cli_fmt_bytes(m[i]->expert_bytes, b, sizeof b));
		cli_table_addf(t, 5, "%" PRIu64, m[i]->tensor_count);
		cli_table_addf(t, 6, "%u", m[i]->holder_count);
		cli_table_addf(t, 7, "%s", m[i]->arch);
		cli_table_addf(t, 8, cli->wide ? "%s" : "%.12s", m[i]->digest_hex);
		if (cli->wide)
			cli_table_addf(t, 9, "%zu", m[i]->n_files);
		if (m[i]->stale)
			cli_table_note(t, "stale: a file changed; release and ensure to reload");
		if (m[i]->floor_state == WEIGHTFLOOR__V1__FLOOR_STATE__FLOOR_STATE_FAILED &&
		    m[i]->last_error && *m[i]->last_error)
			cli_table_note(t, "error: %s", m[i]->last_error);
	}
	cli_table_print(t, stdout);
	cli_table_free(t);
}

/* models NAME: everything the agent knows about one model. */
static void model_detail(const Weightfloor__V1__ModelInfo *m)
{
	char b1[32], b2[32], b3[32];
	printf("model       %s\n", m->name);
	printf("state       %s%s%s\n", state_name(m->floor_state),
	       m->pin_host ? " (pin requested)" : "",
	       m->stale ? ", STALE: a file changed; release and ensure to reload" : "");
	printf("format      %s, arch %s\n", m->format, m->arch[0] ? m->arch : "(unknown)");
	printf("digest      %s\n", m->digest_hex);
	printf("size        %s (%s dense, %s experts), %" PRIu64 " tensors\n",
	       cli_fmt_bytes(m->total_bytes, b1, sizeof b1),
	       cli_fmt_bytes(m->dense_bytes, b2, sizeof b2),
	       cli_fmt_bytes(m->expert_bytes, b3, sizeof b3), m->tensor_count);
	printf("in RAM      %s\n", m->region_present
	                               ? cli_fmt_bytes(m->resident_bytes, b1, sizeof b1)
	                               : "- (no floor)");
	printf("holders     %u", m->holder_count);
	for (size_t i = 0; i < m->n_holder_pids; i++)
		printf("%s%u", i ? ", " : " (pids ", m->holder_pids[i]);
	printf("%s\n", m->n_holder_pids ? ")" : "");
	if (m->progress && m->progress->bytes_total) {
		char line[160];
		printf("progress    %s\n",
		       cli_fmt_progress(line, sizeof line, m->progress->bytes_done,
		                        m->progress->bytes_total, m->progress->rate_bytes_per_s,
		                        0));
	}
	if (m->last_used_unix_ms) {
		struct timespec now;
		clock_gettime(CLOCK_REALTIME, &now);
		int64_t ago =
		    (int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000 - m->last_used_unix_ms;
		printf("last used   %s ago\n",
		       cli_fmt_duration(ago > 0 ? (uint64_t)ago : 0, b1, sizeof b1));
	}
	if (m->last_error && *m->last_error)
		printf("last error  %s\n", m->last_error);
	printf("files       %zu\n", m->n_files);
	static const char *const hdr[] = {"SIZE", "PATH"};
	struct cli_table *t = cli_table_new(2, hdr, "r.");
	for (size_t i = 0; i < m->n_files; i++) {
		cli_table_addf(t, 0, "%s", cli_fmt_bytes(m->files[i]->size_bytes, b1, sizeof b1));
		cli_table_addf(t, 1, "%s", m->files[i]->path);
	}
	cli_table_print(t, stdout);
	cli_table_free(t);
}

/* Options of commands that have none but --help. Returns 0, -1 after help, else the exit code
 * of a usage error. */
static int simple_opts(int argc, char **argv, struct cli *cli, const char *cmd,
                       const char *usage_text)
{
	static const struct option opts[] = {
	    {"help", no_argument, NULL, 'h'},
	    {0},
	};
	int c;
	optind = 0; /* 0, not 1: glibc then re-initializes (and permutes: options anywhere) */
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
		if (c == 'h') {
			printf("%s", usage_text);
			return -1;
		}
		return cli_bad_option(cli, cmd, argc, argv);
	}
	return 0;
}

static int model_status(struct cli *cli, const char *what, const char *name,
                        Weightfloor__V1__Reply **ret);

int cmd_models(struct cli *cli, int argc, char **argv)
{
	int o = simple_opts(
	    argc, argv, cli, "models",
	    "usage: agentctl models [NAME] [--json] [-o wide]\n"
	    "  Without NAME: the registered models and their floor states, one per row\n"
	    "  (-o wide: the whole digest and the file count). With NAME: that model in\n"
	    "  detail (files, sizes, state, holders, bytes in RAM, progress, last error).\n"
	    "  --json: ModelList ({\"models\": [ModelInfo...]}), or one ModelInfo.\n");
	if (o)
		return o == -1 ? CLI_EXIT_OK : o;
	int rc = cli_check_args(cli, "models", argc, argv, optind, 0, 1, "");
	if (rc)
		return rc;
	Weightfloor__V1__Reply *rep;
	if (optind < argc) {
		rc = model_status(cli, "models", argv[optind], &rep);
		if (rc)
			return rc;
		if (rep->body_case != WEIGHTFLOOR__V1__REPLY__BODY_MODEL_INFO) {
			wf_ctl_reply_free(rep);
			return cli_fail(cli, CLI_EXIT_FAIL, "models: unexpected reply");
		}
		if (cli->json)
			cli_json_print(cli, wf_pb_to_json(&rep->model_info->base));
		else
			model_detail(rep->model_info);
		wf_ctl_reply_free(rep);
		return CLI_EXIT_OK;
	}
	Weightfloor__V1__ListModels lm = WEIGHTFLOOR__V1__LIST_MODELS__INIT;
	Weightfloor__V1__Request req = WEIGHTFLOOR__V1__REQUEST__INIT;
	req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_LIST_MODELS;
	req.list_models = &lm;
	rc = cli_call(cli, "models", &req, 0, &rep);
	if (rc)
		return rc;
	if (rep->body_case != WEIGHTFLOOR__V1__REPLY__BODY_MODEL_LIST) {
		wf_ctl_reply_free(rep);
		return cli_fail(cli, CLI_EXIT_FAIL,
		                "models: the agent answered without a model list");
	}
	if (cli->json)
		cli_json_print(cli, wf_pb_to_json(&rep->model_list->base));
	else
		models_table(cli, rep->model_list->models, rep->model_list->n_models);
	wf_ctl_reply_free(rep);
	return CLI_EXIT_OK;
}

int cmd_status(struct cli *cli, int argc, char **argv)
{
	int o = simple_opts(
	    argc, argv, cli, "status",
	    "usage: agentctl status [--json] [-o wide]\n"
	    "  The agent: version, uptime, floor directory, host budget and use, reader\n"
	    "  backend, model counts, workers, orphan floors; then its models' table.\n"
	    "  --json: one object, AgentStatusReply's fields with the per-state counts\n"
	    "  under \"model_counts\" and the models (ModelInfo) under \"models\".\n");
	if (o)
		return o == -1 ? CLI_EXIT_OK : o;
	int rc = cli_check_args(cli, "status", argc, argv, optind, 0, 0, "");
	if (rc)
		return rc;
	Weightfloor__V1__AgentStatus as = WEIGHTFLOOR__V1__AGENT_STATUS__INIT;
	Weightfloor__V1__Request req = WEIGHTFLOOR__V1__REQUEST__INIT;
	req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_AGENT_STATUS;
	req.agent_status = &as;
	Weightfloor__V1__Reply *rep, *models = NULL;
	rc = cli_call(cli, "status", &req, 0, &rep);
	if (rc)
		return rc;
	Weightfloor__V1__ListModels lm = WEIGHTFLOOR__V1__LIST_MODELS__INIT;
	req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_LIST_MODELS;
	req.list_models = &lm;
	rc = cli_call(cli, "status", &req, 0, &models);
	if (rc) {
		wf_ctl_reply_free(rep);
		return rc;
	}
	const Weightfloor__V1__AgentStatusReply *s = rep->agent_status;
	if (rep->body_case != WEIGHTFLOOR__V1__REPLY__BODY_AGENT_STATUS ||
	    models->body_case != WEIGHTFLOOR__V1__REPLY__BODY_MODEL_LIST) {
		rc = cli_fail(cli, CLI_EXIT_FAIL, "status: unexpected reply from the agent");
	} else if (cli->json) {
		/* One document: the agent's fields, its models under "models" as in ModelList (the
		 * reply's own "models" summary moves to "model_counts"). */
		struct json_object *j = wf_pb_to_json(&s->base);
		struct json_object *counts = NULL;
		if (json_object_object_get_ex(j, "models", &counts)) {
			json_object_get(counts);
			json_object_object_del(j, "models");
			json_object_object_add(j, "model_counts", counts);
		}
		struct json_object *ml = wf_pb_to_json(&models->model_list->base), *arr = NULL;
		if (json_object_object_get_ex(ml, "models", &arr))
			json_object_object_add(j, "models", json_object_get(arr));
		json_object_put(ml);
		cli_json_print(cli, j);
	} else {
		char b1[32], b2[32];
		const Weightfloor__V1__ModelsSummary *ms = s->models;
		printf("agent       %s pid %u on %s, up %s\n", s->version, s->pid, s->hostname,
		       cli_fmt_duration(s->uptime_ms, b1, sizeof b1));
		printf("floor       %s\n", s->floor_dir);
		printf("host budget %s used of %s\n",
		       cli_fmt_bytes(s->host_used_bytes, b1, sizeof b1),
		       cli_fmt_bytes(s->host_budget_bytes, b2, sizeof b2));
		printf("reader      %s%s\n",
		       s->reader_backend == WEIGHTFLOOR__V1__READER_BACKEND__READER_BACKEND_IO_URING
		           ? "io_uring"
		           : "pread thread pool (io_uring unavailable)",
		       s->o_direct ? " with O_DIRECT" : ", buffered");
		if (ms)
			printf("models      %u: %u pinned, %u host, %u materializing, %u disk, %u "
			       "failed\n",
			       ms->total, ms->pinned_host, ms->host, ms->materializing, ms->disk,
			       ms->failed);
		printf("workers     %u\n", s->worker_count);
		if (s->orphan_count) {
			printf("orphans     %u floors no model points to, %s in RAM\n",
			       s->orphan_count, cli_fmt_bytes(s->orphan_bytes, b1, sizeof b1));
			for (size_t i = 0; i < s->n_orphan_floors; i++)
				printf("            wf-%s  %s, %u holders%s\n",
				       s->orphan_floors[i]->digest_hex,
				       cli_fmt_bytes(s->orphan_floors[i]->resident_bytes, b1,
				                     sizeof b1),
				       s->orphan_floors[i]->holder_count,
				       s->orphan_floors[i]->kept ? ", kept" : "");
		}
		printf("\n");
		models_table(cli, models->model_list->models, models->model_list->n_models);
	}
	wf_ctl_reply_free(models);
	wf_ctl_reply_free(rep);
	return rc;
}

static Weightfloor__V1__ModelInfo *info_of(Weightfloor__V1__Reply *rep)
{
	return rep->body_case == WEIGHTFLOOR__V1__REPLY__BODY_MODEL_INFO ? rep->model_info : NULL;
}

static int model_status(struct cli *cli, const char *what, const char *name,
                        Weightfloor__V1__Reply **ret)
{
	Weightfloor__V1__ModelStatus ms = WEIGHTFLOOR__V1__MODEL_STATUS__INIT;
	ms.name = (char *)name;
	Weightfloor__V1__Request req = WEIGHTFLOOR__V1__REQUEST__INIT;
	req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_MODEL_STATUS;
	req.model_status = &ms;
	return cli_call(cli, what, &req, 0, ret);
}

static void print_info(struct cli *cli, Weightfloor__V1__Reply *rep)
{
	Weightfloor__V1__ModelInfo *mi = info_of(rep);
	if (!mi)
		return;
	if (cli->json)
		cli_json_print(cli, wf_pb_to_json(&mi->base));
	else
		models_table(cli, &mi, 1);
}

static volatile sig_atomic_t interrupted;
static void on_sigint(int sig)
{
	(void)sig;
	interrupted = 1;
}

/* ensure: starts the materialization, then follows it with ModelStatus polls and a progress bar,
 * so a lost connection or ^C never cancels the agent's work. */
static int floor_ensure(struct cli *cli, const char *name, bool wait, int timeout_s)
{
	Weightfloor__V1__EnsureFloor ef = WEIGHTFLOOR__V1__ENSURE_FLOOR__INIT;
	ef.name = (char *)name;
	ef.wait = false;
	Weightfloor__V1__Request req = WEIGHTFLOOR__V1__REQUEST__INIT;
	req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_ENSURE_FLOOR;
	req.ensure_floor = &ef;
	Weightfloor__V1__Reply *rep;
	int rc = cli_call(cli, "floor ensure", &req, 0, &rep);
	if (rc || !wait) {
		if (!rc)
			print_info(cli, rep);
		wf_ctl_reply_free(rc ? NULL : rep);
		return rc;
	}
	signal(SIGINT, on_sigint);
	struct timespec t0, now;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	char label[64];
	snprintf(label, sizeof label, "%.40s", name);
	struct cli_rate rate = {0};
	for (;;) {
		Weightfloor__V1__ModelInfo *mi = info_of(rep);
		if (!mi) {
			rc = cli_fail(cli, CLI_EXIT_FAIL, "floor ensure: unexpected reply");
			break;
		}
		if (mi->floor_state != WEIGHTFLOOR__V1__FLOOR_STATE__FLOOR_STATE_MATERIALIZING) {
			if (mi->progress && mi->progress->bytes_total)
				cli_progress(cli, label, mi->progress->bytes_total,
				             mi->progress->bytes_total,
				             mi->progress->rate_bytes_per_s);
			cli_progress_end(cli);
			if (mi->floor_state == WEIGHTFLOOR__V1__FLOOR_STATE__FLOOR_STATE_FAILED) {
				rc = cli_fail(cli, CLI_EXIT_FAIL,
				              "floor ensure %s: materialization failed: %s", name,
				              mi->last_error);
			} else if (mi->floor_state ==
			           WEIGHTFLOOR__V1__FLOOR_STATE__FLOOR_STATE_DISK) {
				rc = cli_fail(cli, CLI_EXIT_FAILED_PRECONDITION,
				              "floor ensure %s: materialization was cancelled",
				              name);
			} else {
				print_info(cli, rep);
			}
			break;
		}
		if (mi->progress)
			cli_progress(cli, label, mi->progress->bytes_done,
			             mi->progress->bytes_total,
			             mi->progress->rate_bytes_per_s
			                 ? mi->progress->rate_bytes_per_s
			                 : cli_rate_update(&rate, mi->progress->bytes_done));
		clock_gettime(CLOCK_MONOTONIC, &now);
		if (interrupted || (timeout_s > 0 && now.tv_sec - t0.tv_sec >= timeout_s)) {
			cli_progress_end(cli);
			rc = cli_fail(cli, interrupted ? CLI_EXIT_FAIL : CLI_EXIT_UNAVAILABLE,
			              "floor ensure %s: %s; the agent goes on materializing", name,
			              interrupted ? "interrupted" : "timed out");
			break;
		}
		struct timespec ts = {0, 200 * 1000 * 1000};
		nanosleep(&ts, NULL);
		wf_ctl_reply_free(rep);
		rep = NULL;
		if ((rc = model_status(cli, "floor ensure", name, &rep)))
			return rc;
	}
	wf_ctl_reply_free(rep);
	signal(SIGINT, SIG_DFL);
	return rc;
}

int cmd_floor(struct cli *cli, int argc, char **argv)
{
	static const char *usage_text =
	    "usage: agentctl floor ensure|release|pin|unpin MODEL [--no-wait] [--wait-timeout S]\n"
	    "  ensure   materialize the model's floor (progress bar on a terminal; --no-wait\n"
	    "           returns at once, --wait-timeout S gives up waiting after S seconds: exit "
	    "4)\n"
	    "  release  drop the agent's hold; the floor goes when no process holds it\n"
	    "  pin      keep the floor (materializing it if needed); never evicted\n"
	    "  unpin    make it evictable again\n"
	    "  Prints the model's row (--json: its ModelInfo).\n";
	static const struct option opts[] = {
	    {"no-wait", no_argument, NULL, 'n'},
	    {"wait-timeout", required_argument, NULL, 't'},
	    {"help", no_argument, NULL, 'h'},
	    {0},
	};
	bool wait = true;
	int timeout_s = 0, c;
	optind = 0; /* 0, not 1: glibc then re-initializes (and permutes: options anywhere) */
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":nh", opts, NULL)) != -1) {
		switch (c) {
		case 'n':
			wait = false;
			break;
		case 't':
			timeout_s = atoi(optarg);
			if (timeout_s <= 0)
				return cli_usage(cli, "floor",
				                 "--wait-timeout takes seconds > 0, not '%s'",
				                 optarg);
			break;
		case 'h':
			printf("%s", usage_text);
			return CLI_EXIT_OK;
		default:
			return cli_bad_option(cli, "floor", argc, argv);
		}
	}
	int rc = cli_check_args(cli, "floor", argc, argv, optind, 2, 2, "ACTION and MODEL");
	if (rc)
		return rc;
	const char *verb = argv[optind], *name = argv[optind + 1];
	if (strcmp(verb, "ensure") == 0)
		return floor_ensure(cli, name, wait, timeout_s);

	Weightfloor__V1__Request req = WEIGHTFLOOR__V1__REQUEST__INIT;
	Weightfloor__V1__ReleaseFloor rf = WEIGHTFLOOR__V1__RELEASE_FLOOR__INIT;
	Weightfloor__V1__PinHost ph = WEIGHTFLOOR__V1__PIN_HOST__INIT;
	Weightfloor__V1__UnpinHost uh = WEIGHTFLOOR__V1__UNPIN_HOST__INIT;
	if (strcmp(verb, "release") == 0) {
		rf.name = (char *)name;
		req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_RELEASE_FLOOR;
		req.release_floor = &rf;
	} else if (strcmp(verb, "pin") == 0) {
		ph.name = (char *)name;
		req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_PIN_HOST;
		req.pin_host = &ph;
	} else if (strcmp(verb, "unpin") == 0) {
		uh.name = (char *)name;
		req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_UNPIN_HOST;
		req.unpin_host = &uh;
	} else {
		return cli_usage(cli, "floor",
		                 "unknown action '%s' (ensure, release, pin or unpin)", verb);
	}
	bool follow = strcmp(verb, "pin") == 0 && wait;
	char what[64];
	snprintf(what, sizeof what, "floor %s %.32s", verb, name);
	Weightfloor__V1__Reply *rep;
	rc = cli_call(cli, what, &req, 0, &rep);
	if (rc)
		return rc;
	/* pin of a model on disk starts a materialization: follow it like ensure does, which
	 * prints the final row (printing this reply's too would show the table twice). */
	if (!follow)
		print_info(cli, rep);
	wf_ctl_reply_free(rep);
	if (follow)
		return floor_ensure(cli, name, true, timeout_s);
	return CLI_EXIT_OK;
}

int cmd_register(struct cli *cli, int argc, char **argv)
{
	static const char *usage_text =
	    "usage: agentctl register NAME PATH [--pin]\n"
	    "  Registers a model with the agent. PATH: a GGUF file or any shard, a safetensors\n"
	    "  file, index.json or directory; a relative PATH must exist here and is sent\n"
	    "  absolute. --pin also pins its floor in host memory. Prints the model's row\n"
	    "  (--json: its ModelInfo).\n";
	static const struct option opts[] = {
	    {"pin", no_argument, NULL, 'p'},
	    {"help", no_argument, NULL, 'h'},
	    {0},
	};
	bool pin = false;
	int c;
	optind = 0; /* 0, not 1: glibc then re-initializes (and permutes: options anywhere) */
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":ph", opts, NULL)) != -1) {
		switch (c) {
		case 'p':
			pin = true;
			break;
		case 'h':
			printf("%s", usage_text);
			return CLI_EXIT_OK;
		default:
			return cli_bad_option(cli, "register", argc, argv);
		}
	}
	int crc = cli_check_args(cli, "register", argc, argv, optind, 2, 2, "NAME and PATH");
	if (crc)
		return crc;
	/* The agent refuses relative paths (its working directory is not ours): send the
	 * absolute one. A path that does not exist here is sent only when it is absolute already:
	 * it may exist on the agent's side (another mount namespace, a container). */
	const char *arg = argv[optind + 1];
	char *abs = realpath(arg, NULL);
	if (!abs && arg[0] != '/') {
		return cli_fail(
		    cli, cli_exit_for_err(-errno),
		    "register: %s: %s (a relative path must exist here; give an absolute "
		    "path for a file that only the agent can see)",
		    arg, strerror(errno));
	}
	char *path = abs ? abs : (char *)arg;
	Weightfloor__V1__RegisterModel rm = WEIGHTFLOOR__V1__REGISTER_MODEL__INIT;
	rm.name = argv[optind];
	rm.paths = &path;
	rm.n_paths = 1;
	rm.pin_host = pin;
	Weightfloor__V1__Request req = WEIGHTFLOOR__V1__REQUEST__INIT;
	req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_REGISTER_MODEL;
	req.register_model = &rm;
	Weightfloor__V1__Reply *rep;
	int rc = cli_call(cli, "register", &req, 0, &rep);
	free(abs);
	if (rc)
		return rc;
	print_info(cli, rep);
	wf_ctl_reply_free(rep);
	return CLI_EXIT_OK;
}

static const char *event_kind(Weightfloor__V1__EventKind k)
{
	switch (k) {
	case WEIGHTFLOOR__V1__EVENT_KIND__EVENT_KIND_FLOOR_STATE:
		return "floor";
	case WEIGHTFLOOR__V1__EVENT_KIND__EVENT_KIND_PROGRESS:
		return "progress";
	case WEIGHTFLOOR__V1__EVENT_KIND__EVENT_KIND_RESIDENCY:
		return "residency";
	case WEIGHTFLOOR__V1__EVENT_KIND__EVENT_KIND_ERROR:
		return "error";
	case WEIGHTFLOOR__V1__EVENT_KIND__EVENT_KIND_WORKER:
		return "worker";
	case WEIGHTFLOOR__V1__EVENT_KIND__EVENT_KIND_STALE:
		return "stale";
	case WEIGHTFLOOR__V1__EVENT_KIND__EVENT_KIND_PUBLISHED:
		return "published";
	case WEIGHTFLOOR__V1__EVENT_KIND__EVENT_KIND_RELOADED:
		return "reloaded"; /* its message says what the reload found */
	default:
		return "?";
	}
}

static const char *residency_state_name(Weightfloor__V1__Residency r)
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
		return "UNKNOWN";
	}
}

/* " generation 4 of floor 3f2a9c01b2d4: 2 tensors [0 token_embd.weight, 7 blk.0.ffn_up]" */
static void print_published(const Weightfloor__V1__Event *ev)
{
	printf(" generation %" PRIu64 " of floor %.12s: %zu tensor%s [", ev->generation,
	       ev->digest ? ev->digest : "", ev->n_tensor_ids, ev->n_tensor_ids == 1 ? "" : "s");
	size_t shown = ev->n_tensor_ids < 8 ? ev->n_tensor_ids : 8;
	for (size_t i = 0; i < shown; i++)
		printf("%s%u%s%s", i ? ", " : "", ev->tensor_ids[i],
		       i < ev->n_tensor_names ? " " : "",
		       i < ev->n_tensor_names ? ev->tensor_names[i] : "");
	if (shown < ev->n_tensor_ids)
		printf(", %zu more", ev->n_tensor_ids - shown);
	printf("]");
}

/* Seconds since t0 on CLOCK_MONOTONIC. */
static double since(const struct timespec *t0)
{
	struct timespec now;
	clock_gettime(CLOCK_MONOTONIC, &now);
	return (double)(now.tv_sec - t0->tv_sec) + (double)(now.tv_nsec - t0->tv_nsec) * 1e-9;
}

/* Subscribes to the agent's events. A connection the agent reset or shut (it is starting,
 * stopping or being replaced) is dialed again, and so, with again, is an agent not listening (a
 * restart in progress); each try waits twice as long as the one before (0.1 s, at most 2 s),
 * until ^C or the watch's end (secs after t0; < 0: none). Other errors, and nothing listening
 * on the first connection, end it at once. Returns 0 and *ret_sub, or the last error. */
static int watch_open(struct cli *cli, bool again, const struct timespec *t0, long secs,
                      struct wf_ctl_sub **ret_sub, struct wf_diag *diag)
{
	struct wf_ctl_client_opts so = {.tls = cli->tls};
	long wait_ms = 100;
	for (;;) {
		wf_diag_clear(diag);
		int rc = wf_ctl_sub_open(cli->events, &so, ret_sub, diag);
		bool transient = rc == WF_ETRANSPORT || (again && rc == WF_EUNAVAILABLE);
		if (rc == 0 || !transient || interrupted)
			return rc;
		for (long slept = 0; slept < wait_ms && !interrupted; slept += 20) {
			if (secs > 0 && since(t0) >= (double)secs)
				return rc;
			nanosleep(&(struct timespec){.tv_nsec = 20 * 1000000L}, NULL);
		}
		wait_ms = wait_ms * 2 > 2000 ? 2000 : wait_ms * 2;
	}
}

int cmd_watch(struct cli *cli, int argc, char **argv)
{
	static const char *usage_text =
	    "usage: agentctl watch [--count N] [--for SECONDS] [--json]\n"
	    "  Prints the agent's events as they come: floor states, progress, errors, workers\n"
	    "  registering or gone (with the worker's id), residency changes on the workers'\n"
	    "  devices (\"worker ID model NAME STATE\"), published generations of a floor\n"
	    "  (\"published MODEL generation G of floor DIGEST: N tensors [ID NAME, ...]\"), and\n"
	    "  \"agent restarted\" when the agent's event epoch changes. Stops after N events or\n"
	    "  S seconds, else on ^C; a lost connection to the agent is dialed again until then.\n"
	    "  --json: JSON Lines, one Event object per line.\n";
	static const struct option opts[] = {
	    {"count", required_argument, NULL, 'n'},
	    {"for", required_argument, NULL, 'f'},
	    {"help", no_argument, NULL, 'h'},
	    {0},
	};
	long count = -1, secs = -1;
	int c;
	optind = 0; /* 0, not 1: glibc then re-initializes (and permutes: options anywhere) */
	opterr = 0;
	char *end;
	while ((c = getopt_long(argc, argv, ":n:f:h", opts, NULL)) != -1) {
		switch (c) {
		case 'n':
			count = strtol(optarg, &end, 10);
			if (*end || count <= 0)
				return cli_usage(cli, "watch", "--count: '%s' is not a number > 0",
				                 optarg);
			break;
		case 'f':
			secs = strtol(optarg, &end, 10);
			if (*end || secs <= 0)
				return cli_usage(cli, "watch",
				                 "--for: '%s' is not a number of seconds > 0",
				                 optarg);
			break;
		case 'h':
			printf("%s", usage_text);
			return CLI_EXIT_OK;
		default:
			return cli_bad_option(cli, "watch", argc, argv);
		}
	}
	int crc = cli_check_args(cli, "watch", argc, argv, optind, 0, 0, "");
	if (crc)
		return crc;
	struct wf_ctl_sub *sub = NULL;
	struct wf_diag d = {{0}};
	signal(SIGINT, on_sigint);
	struct timespec t0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	int rc = watch_open(cli, false, &t0, secs, &sub, &d);
	if (rc < 0 && !interrupted)
		return cli_fail(cli, CLI_EXIT_UNAVAILABLE, "watch: %s: %s", cli->events,
		                wf_diag_str(&d, rc));
	uint64_t last_seq = 0, last_epoch = 0;
	while (sub && !interrupted && count != 0) {
		if (secs > 0 && since(&t0) >= (double)secs)
			break;
		Weightfloor__V1__Event *ev = NULL;
		rc = wf_ctl_sub_recv(sub, 200, &ev, &d);
		if (rc == WF_ETIMEOUT || rc == WF_EFORMAT)
			continue;
		if (rc < 0) {
			/* The connection went (nng redials by itself, but a socket that reports an
			 * error is done): subscribe again, as at the start. */
			wf_ctl_sub_close(sub);
			sub = NULL;
			fprintf(stderr, "agentctl: watch: %s; dialing again\n",
			        wf_diag_str(&d, rc));
			rc = watch_open(cli, true, &t0, secs, &sub, &d);
			if (rc < 0 && !interrupted && !(secs > 0 && since(&t0) >= (double)secs))
				return cli_fail(cli, CLI_EXIT_UNAVAILABLE, "watch: %s: %s",
				                cli->events, wf_diag_str(&d, rc));
			continue;
		}
		/* A new epoch is a new publisher: the agent restarted (its sequence starts over).
		 */
		bool restarted = last_epoch && ev->epoch != last_epoch;
		if (cli->json) {
			cli_json_print(cli, wf_pb_to_json(&ev->base));
		} else {
			char b1[32], b2[32];
			time_t t = (time_t)(ev->time_unix_ms / 1000);
			struct tm tm;
			localtime_r(&t, &tm);
			if (restarted)
				printf("%02d:%02d:%02d agent restarted (event epoch %" PRIx64 ")\n",
				       tm.tm_hour, tm.tm_min, tm.tm_sec, ev->epoch);
			else if (last_seq && ev->sequence > last_seq + 1)
				printf("(%" PRIu64 " events missed)\n",
				       ev->sequence - last_seq - 1);
			/* Worker events name the worker (their model is empty or secondary). */
			char subject[512];
			if (ev->worker_id && *ev->worker_id)
				snprintf(subject, sizeof subject, "worker %s%s%s", ev->worker_id,
				         ev->model && *ev->model ? " model " : "",
				         ev->model ? ev->model : "");
			else
				snprintf(subject, sizeof subject, "%s", ev->model ? ev->model : "");
			printf("%02d:%02d:%02d %-9s %-20s", tm.tm_hour, tm.tm_min, tm.tm_sec,
			       event_kind(ev->kind), subject);
			if (ev->kind == WEIGHTFLOOR__V1__EVENT_KIND__EVENT_KIND_PROGRESS)
				printf(" %s / %s", cli_fmt_bytes(ev->bytes_done, b1, sizeof b1),
				       cli_fmt_bytes(ev->bytes_total, b2, sizeof b2));
			else if (ev->kind == WEIGHTFLOOR__V1__EVENT_KIND__EVENT_KIND_FLOOR_STATE)
				printf(" %s", state_name(ev->floor_state));
			else if (ev->kind == WEIGHTFLOOR__V1__EVENT_KIND__EVENT_KIND_RESIDENCY)
				printf(" %s", residency_state_name(ev->residency));
			else if (ev->kind == WEIGHTFLOOR__V1__EVENT_KIND__EVENT_KIND_PUBLISHED)
				print_published(ev);
			if (ev->message && *ev->message)
				printf(" %s", ev->message);
			printf("\n");
			fflush(stdout);
		}
		last_seq = ev->sequence;
		last_epoch = ev->epoch;
		wf_ctl_event_free(ev);
		if (count > 0)
			count--;
	}
	wf_ctl_sub_close(sub);
	return CLI_EXIT_OK;
}
