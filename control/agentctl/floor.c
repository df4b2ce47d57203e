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
	case WEIGHTFLOOR__V1__FLOOR_STATE__FLOOR_STATE_DISK: return "DISK";
	case WEIGHTFLOOR__V1__FLOOR_STATE__FLOOR_STATE_MATERIALIZING: return "MATERIALIZING";
	case WEIGHTFLOOR__V1__FLOOR_STATE__FLOOR_STATE_HOST: return "HOST";
	case WEIGHTFLOOR__V1__FLOOR_STATE__FLOOR_STATE_PINNED_HOST: return "PINNED_HOST";
	case WEIGHTFLOOR__V1__FLOOR_STATE__FLOOR_STATE_FAILED: return "FAILED";
	default: return "?";
	}
}

static void models_table(Weightfloor__V1__ModelInfo **m, size_t n)
{
	char b1[32], b2[32], b3[32];
	printf("%-24s %-13s %10s %10s %10s %8s %7s  %-10s %s\n", "MODEL", "STATE", "SIZE", "IN RAM",
	       "EXPERTS", "TENSORS", "HOLDERS", "ARCH", "DIGEST");
	for (size_t i = 0; i < n; i++) {
		/* IN RAM and HOLDERS are what the floor directory holds now, whatever the state:
		 * a released floor that workers still map is DISK with bytes in RAM. */
		printf("%-24s %-13s %10s %10s %10s %8" PRIu64 " %7u  %-10s %.12s%s\n", m[i]->name,
		       state_name(m[i]->floor_state), cli_fmt_bytes(m[i]->total_bytes, b1, sizeof b1),
		       m[i]->region_present ? cli_fmt_bytes(m[i]->resident_bytes, b3, sizeof b3) : "-",
		       cli_fmt_bytes(m[i]->expert_bytes, b2, sizeof b2), m[i]->tensor_count,
		       m[i]->holder_count, m[i]->arch, m[i]->digest_hex,
		       m[i]->stale ? "  STALE: a file changed; release and ensure to reload" : "");
		if (m[i]->floor_state == WEIGHTFLOOR__V1__FLOOR_STATE__FLOOR_STATE_FAILED &&
		    m[i]->last_error && *m[i]->last_error)
			printf("  error: %s\n", m[i]->last_error);
	}
}

static int simple_opts(int argc, char **argv, struct cli *cli, const char *usage_text)
{
	static const struct option opts[] = {
		{"json", no_argument, NULL, 'j'},
		{"help", no_argument, NULL, 'h'},
		{0},
	};
	int c;
	optind = 0; /* 0, not 1: glibc then re-initializes, dropping main's "+" ordering */
	while ((c = getopt_long(argc, argv, "jh", opts, NULL)) != -1) {
		if (c == 'j') {
			cli->json = true;
		} else if (c == 'h') {
			printf("%s", usage_text);
			return -1;
		} else {
			return -2;
		}
	}
	return 0;
}

int cmd_models(struct cli *cli, int argc, char **argv)
{
	int o = simple_opts(argc, argv, cli, "usage: agentctl models [--json]\n");
	if (o)
		return o == -1 ? CLI_EXIT_OK : CLI_EXIT_USAGE;
	Weightfloor__V1__ListModels lm = WEIGHTFLOOR__V1__LIST_MODELS__INIT;
	Weightfloor__V1__Request req = WEIGHTFLOOR__V1__REQUEST__INIT;
	req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_LIST_MODELS;
	req.list_models = &lm;
	Weightfloor__V1__Reply *rep;
	int rc = cli_call(cli, "models", &req, 0, &rep);
	if (rc)
		return rc;
	if (rep->body_case != WEIGHTFLOOR__V1__REPLY__BODY_MODEL_LIST) {
		cli_err("models: the agent answered without a model list");
		wf_ctl_reply_free(rep);
		return CLI_EXIT_FAIL;
	}
	if (cli->json)
		cli_json_print(wf_pb_to_json(&rep->model_list->base));
	else
		models_table(rep->model_list->models, rep->model_list->n_models);
	wf_ctl_reply_free(rep);
	return CLI_EXIT_OK;
}

int cmd_status(struct cli *cli, int argc, char **argv)
{
	int o = simple_opts(argc, argv, cli,
			    "usage: agentctl status [--json]\n  The agent's state and its models.\n");
	if (o)
		return o == -1 ? CLI_EXIT_OK : CLI_EXIT_USAGE;
	Weightfloor__V1__AgentStatus as = WEIGHTFLOOR__V1__AGENT_STATUS__INIT;
	Weightfloor__V1__Request req = WEIGHTFLOOR__V1__REQUEST__INIT;
	req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_AGENT_STATUS;
	req.agent_status = &as;
	Weightfloor__V1__Reply *rep, *models = NULL;
	int rc = cli_call(cli, "status", &req, 0, &rep);
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
		cli_err("status: unexpected reply from the agent");
		rc = CLI_EXIT_FAIL;
	} else if (cli->json) {
		struct json_object *j = wf_pb_to_json(&s->base);
		json_object_object_add(j, "model_list", wf_pb_to_json(&models->model_list->base));
		cli_json_print(j);
	} else {
		char b1[32], b2[32];
		const Weightfloor__V1__ModelsSummary *ms = s->models;
		printf("agent       %s pid %u on %s, up %" PRIu64 " s\n", s->version, s->pid,
		       s->hostname, s->uptime_ms / 1000);
		printf("floor       %s\n", s->floor_dir);
		printf("host budget %s used of %s\n", cli_fmt_bytes(s->host_used_bytes, b1, sizeof b1),
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
			printf("orphans     %u floors no model points to, %s in RAM\n", s->orphan_count,
			       cli_fmt_bytes(s->orphan_bytes, b1, sizeof b1));
			for (size_t i = 0; i < s->n_orphan_floors; i++)
				printf("            wf-%s  %s, %u holders%s\n",
				       s->orphan_floors[i]->digest_hex,
				       cli_fmt_bytes(s->orphan_floors[i]->resident_bytes, b1, sizeof b1),
				       s->orphan_floors[i]->holder_count,
				       s->orphan_floors[i]->kept ? ", kept" : "");
		}
		printf("\n");
		models_table(models->model_list->models, models->model_list->n_models);
	}
	wf_ctl_reply_free(models);
	wf_ctl_reply_free(rep);
	return rc;
}

static Weightfloor__V1__ModelInfo *info_of(Weightfloor__V1__Reply *rep)
{
	return rep->body_case == WEIGHTFLOOR__V1__REPLY__BODY_MODEL_INFO ? rep->model_info : NULL;
}

static int model_status(struct cli *cli, const char *name, Weightfloor__V1__Reply **ret)
{
	Weightfloor__V1__ModelStatus ms = WEIGHTFLOOR__V1__MODEL_STATUS__INIT;
	ms.name = (char *)name;
	Weightfloor__V1__Request req = WEIGHTFLOOR__V1__REQUEST__INIT;
	req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_MODEL_STATUS;
	req.model_status = &ms;
	return cli_call(cli, "floor ensure", &req, 0, ret);
}

static void print_info(struct cli *cli, Weightfloor__V1__Reply *rep)
{
	Weightfloor__V1__ModelInfo *mi = info_of(rep);
	if (!mi)
		return;
	if (cli->json) {
		cli_json_print(wf_pb_to_json(&mi->base));
	} else {
		models_table(&mi, 1);
	}
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
	snprintf(label, sizeof label, "%.24s", name);
	for (;;) {
		Weightfloor__V1__ModelInfo *mi = info_of(rep);
		if (!mi) {
			cli_err("floor ensure: unexpected reply");
			rc = CLI_EXIT_FAIL;
			break;
		}
		if (mi->floor_state != WEIGHTFLOOR__V1__FLOOR_STATE__FLOOR_STATE_MATERIALIZING) {
			if (mi->progress && mi->progress->bytes_total)
				cli_progress(cli, label, mi->progress->bytes_total,
					     mi->progress->bytes_total, mi->progress->rate_bytes_per_s);
			cli_progress_end(cli);
			if (mi->floor_state == WEIGHTFLOOR__V1__FLOOR_STATE__FLOOR_STATE_FAILED) {
				cli_err("floor ensure %s: materialization failed: %s", name,
					mi->last_error);
				rc = CLI_EXIT_FAIL;
			} else if (mi->floor_state == WEIGHTFLOOR__V1__FLOOR_STATE__FLOOR_STATE_DISK) {
				cli_err("floor ensure %s: materialization was cancelled", name);
				rc = CLI_EXIT_FAIL;
			} else {
				print_info(cli, rep);
			}
			break;
		}
		if (mi->progress)
			cli_progress(cli, label, mi->progress->bytes_done, mi->progress->bytes_total,
				     mi->progress->rate_bytes_per_s);
		clock_gettime(CLOCK_MONOTONIC, &now);
		if (interrupted || (timeout_s > 0 && now.tv_sec - t0.tv_sec >= timeout_s)) {
			cli_progress_end(cli);
			cli_err("floor ensure %s: %s; the agent goes on materializing", name,
				interrupted ? "interrupted" : "timed out");
			rc = CLI_EXIT_FAIL;
			break;
		}
		struct timespec ts = {0, 200 * 1000 * 1000};
		nanosleep(&ts, NULL);
		wf_ctl_reply_free(rep);
		rep = NULL;
		if ((rc = model_status(cli, name, &rep)))
			return rc;
	}
	wf_ctl_reply_free(rep);
	signal(SIGINT, SIG_DFL);
	return rc;
}

int cmd_floor(struct cli *cli, int argc, char **argv)
{
	static const char *usage_text =
		"usage: agentctl floor ensure|release|pin|unpin MODEL [--json]\n"
		"  ensure   materialize the model's floor (progress bar; --no-wait returns at once,\n"
		"           --wait-timeout S gives up waiting after S seconds)\n"
		"  release  drop the agent's hold; the floor goes when no process holds it\n"
		"  pin      keep the floor (materializing it if needed); never evicted\n"
		"  unpin    make it evictable again\n";
	static const struct option opts[] = {
		{"json", no_argument, NULL, 'j'},
		{"no-wait", no_argument, NULL, 'n'},
		{"wait-timeout", required_argument, NULL, 't'},
		{"help", no_argument, NULL, 'h'},
		{0},
	};
	bool wait = true;
	int timeout_s = 0, c;
	optind = 0; /* 0, not 1: glibc then re-initializes, dropping main's "+" ordering */
	while ((c = getopt_long(argc, argv, "jnh", opts, NULL)) != -1) {
		switch (c) {
		case 'j': cli->json = true; break;
		case 'n': wait = false; break;
		case 't': timeout_s = atoi(optarg); if (timeout_s <= 0) { cli_err("floor: --wait-timeout takes seconds > 0"); return CLI_EXIT_USAGE; } break;
		case 'h': printf("%s", usage_text); return CLI_EXIT_OK;
		default: fputs(usage_text, stderr); return CLI_EXIT_USAGE;
		}
	}
	if (argc - optind != 2) {
		fputs(usage_text, stderr);
		return CLI_EXIT_USAGE;
	}
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
		cli_err("floor: unknown action '%s'", verb);
		fputs(usage_text, stderr);
		return CLI_EXIT_USAGE;
	}
	char what[64];
	snprintf(what, sizeof what, "floor %s %.32s", verb, name);
	Weightfloor__V1__Reply *rep;
	int rc = cli_call(cli, what, &req, 0, &rep);
	if (rc)
		return rc;
	print_info(cli, rep);
	wf_ctl_reply_free(rep);
	/* pin of a model on disk starts a materialization: follow it like ensure does. */
	if (strcmp(verb, "pin") == 0 && wait)
		return floor_ensure(cli, name, true, timeout_s);
	return CLI_EXIT_OK;
}

int cmd_register(struct cli *cli, int argc, char **argv)
{
	static const char *usage_text = "usage: agentctl register NAME PATH [--pin] [--json]\n"
					"  Registers a model with the agent (PATH: a GGUF file or any "
					"shard, a safetensors file, index.json or directory).\n";
	static const struct option opts[] = {
		{"json", no_argument, NULL, 'j'},
		{"pin", no_argument, NULL, 'p'},
		{"help", no_argument, NULL, 'h'},
		{0},
	};
	bool pin = false;
	int c;
	optind = 0; /* 0, not 1: glibc then re-initializes, dropping main's "+" ordering */
	while ((c = getopt_long(argc, argv, "jph", opts, NULL)) != -1) {
		switch (c) {
		case 'j': cli->json = true; break;
		case 'p': pin = true; break;
		case 'h': printf("%s", usage_text); return CLI_EXIT_OK;
		default: fputs(usage_text, stderr); return CLI_EXIT_USAGE;
		}
	}
	if (argc - optind != 2) {
		fputs(usage_text, stderr);
		return CLI_EXIT_USAGE;
	}
	/* The agent refuses relative paths (its working directory is not ours): send the
	 * absolute one. A path that does not exist here is sent only when it is absolute already:
	 * it may exist on the agent's side (another mount namespace, a container). */
	const char *arg = argv[optind + 1];
	char *abs = realpath(arg, NULL);
	if (!abs && arg[0] != '/') {
		cli_err("register: %s: %s (a relative path must exist here; give an absolute path "
			"for a file that only the agent can see)",
			arg, strerror(errno));
		return CLI_EXIT_FAIL;
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
	case WEIGHTFLOOR__V1__EVENT_KIND__EVENT_KIND_FLOOR_STATE: return "floor";
	case WEIGHTFLOOR__V1__EVENT_KIND__EVENT_KIND_PROGRESS: return "progress";
	case WEIGHTFLOOR__V1__EVENT_KIND__EVENT_KIND_RESIDENCY: return "residency";
	case WEIGHTFLOOR__V1__EVENT_KIND__EVENT_KIND_HOTSWAP: return "hotswap";
	case WEIGHTFLOOR__V1__EVENT_KIND__EVENT_KIND_ERROR: return "error";
	case WEIGHTFLOOR__V1__EVENT_KIND__EVENT_KIND_WORKER: return "worker";
	default: return "?";
	}
}

int cmd_watch(struct cli *cli, int argc, char **argv)
{
	static const char *usage_text =
		"usage: agentctl watch [--count N] [--for SECONDS] [--json]\n"
		"  Prints the agent's events (floor states, progress, errors, workers) as they "
		"come.\n";
	static const struct option opts[] = {
		{"json", no_argument, NULL, 'j'},
		{"count", required_argument, NULL, 'n'},
		{"for", required_argument, NULL, 'f'},
		{"help", no_argument, NULL, 'h'},
		{0},
	};
	long count = -1, secs = -1;
	int c;
	optind = 0; /* 0, not 1: glibc then re-initializes, dropping main's "+" ordering */
	while ((c = getopt_long(argc, argv, "jn:f:h", opts, NULL)) != -1) {
		switch (c) {
		case 'j': cli->json = true; break;
		case 'n': count = atol(optarg); break;
		case 'f': secs = atol(optarg); break;
		case 'h': printf("%s", usage_text); return CLI_EXIT_OK;
		default: fputs(usage_text, stderr); return CLI_EXIT_USAGE;
		}
	}
	if (optind != argc || count == 0 || secs == 0) {
		fputs(usage_text, stderr);
		return CLI_EXIT_USAGE;
	}
	struct wf_ctl_sub *sub = NULL;
	struct wf_diag d = {{0}};
	struct wf_ctl_client_opts so = {.tls = cli->tls};
	int rc = wf_ctl_sub_open(cli->events, &so, &sub, &d);
	if (rc < 0) {
		cli_err("watch: %s: %s", cli->events, wf_diag_str(&d, rc));
		return CLI_EXIT_FAIL;
	}
	signal(SIGINT, on_sigint);
	struct timespec t0, now;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	uint64_t last_seq = 0;
	while (!interrupted && count != 0) {
		clock_gettime(CLOCK_MONOTONIC, &now);
		if (secs > 0 && now.tv_sec - t0.tv_sec >= secs)
			break;
		Weightfloor__V1__Event *ev = NULL;
		rc = wf_ctl_sub_recv(sub, 200, &ev, &d);
		if (rc == WF_ETIMEOUT || rc == WF_EFORMAT)
			continue;
		if (rc < 0) {
			cli_err("watch: %s", wf_diag_str(&d, rc));
			wf_ctl_sub_close(sub);
			return CLI_EXIT_FAIL;
		}
		if (cli->json) {
			cli_json_print(wf_pb_to_json(&ev->base));
		} else {
			char b1[32], b2[32];
			if (last_seq && ev->sequence > last_seq + 1)
				printf("(%" PRIu64 " events missed)\n", ev->sequence - last_seq - 1);
			time_t t = (time_t)(ev->time_unix_ms / 1000);
			struct tm tm;
			localtime_r(&t, &tm);
			printf("%02d:%02d:%02d %-9s %-20s", tm.tm_hour, tm.tm_min, tm.tm_sec,
			       event_kind(ev->kind), ev->model);
			if (ev->kind == WEIGHTFLOOR__V1__EVENT_KIND__EVENT_KIND_PROGRESS)
				printf(" %s / %s", cli_fmt_bytes(ev->bytes_done, b1, sizeof b1),
				       cli_fmt_bytes(ev->bytes_total, b2, sizeof b2));
			else if (ev->kind == WEIGHTFLOOR__V1__EVENT_KIND__EVENT_KIND_FLOOR_STATE)
				printf(" %s", state_name(ev->floor_state));
			if (ev->message && *ev->message)
				printf(" %s", ev->message);
			printf("\n");
			fflush(stdout);
		}
		last_seq = ev->sequence;
		wf_ctl_event_free(ev);
		if (count > 0)
			count--;
	}
	wf_ctl_sub_close(sub);
	return CLI_EXIT_OK;
}
