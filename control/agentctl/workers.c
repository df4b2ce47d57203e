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
	case WEIGHTFLOOR__V1__RESIDENCY__RESIDENCY_DISK: return "DISK";
	case WEIGHTFLOOR__V1__RESIDENCY__RESIDENCY_HOST: return "HOST";
	case WEIGHTFLOOR__V1__RESIDENCY__RESIDENCY_DEVICE: return "DEVICE";
	case WEIGHTFLOOR__V1__RESIDENCY__RESIDENCY_PINNED_DEVICE: return "PINNED_DEVICE";
	default: return "?";
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
		cli_err("workers: the agent answered without a worker list");
		wf_ctl_reply_free(*ret);
		return CLI_EXIT_FAIL;
	}
	return rc;
}

static int worker_status(struct cli *cli, const char *id, Weightfloor__V1__Reply **ret)
{
	Weightfloor__V1__WorkerStatus ws = WEIGHTFLOOR__V1__WORKER_STATUS__INIT;
	ws.worker_id = (char *)id;
	Weightfloor__V1__Request req = WEIGHTFLOOR__V1__REQUEST__INIT;
	req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_WORKER_STATUS;
	req.worker_status = &ws;
	int rc = cli_call(cli, "worker status", &req, 0, ret);
	if (rc == 0 && (*ret)->body_case != WEIGHTFLOOR__V1__REPLY__BODY_WORKER_INFO) {
		cli_err("worker status %s: unexpected reply", id);
		wf_ctl_reply_free(*ret);
		return CLI_EXIT_FAIL;
	}
	return rc;
}

int cmd_workers(struct cli *cli, int argc, char **argv)
{
	static const struct option opts[] = {
		{"json", no_argument, NULL, 'j'}, {"help", no_argument, NULL, 'h'}, {0}};
	int c;
	optind = 0; /* 0, not 1: glibc then re-initializes, dropping main's "+" ordering */
	while ((c = getopt_long(argc, argv, "jh", opts, NULL)) != -1) {
		if (c == 'j')
			cli->json = true;
		else if (c == 'h') {
			printf("usage: agentctl workers [--json]\n  The node's workers, their devices, "
			       "budgets and models.\n");
			return CLI_EXIT_OK;
		} else
			return CLI_EXIT_USAGE;
	}
	Weightfloor__V1__Reply *rep;
	int rc = list_workers(cli, &rep);
	if (rc)
		return rc;
	const Weightfloor__V1__WorkerList *wl = rep->worker_list;
	struct json_object *arr = cli->json ? json_object_new_array() : NULL;
	if (!cli->json)
		printf("%-16s %7s %-28s %10s %10s %10s  %s\n", "WORKER", "PID", "DEVICE", "TOTAL",
		       "BUDGET", "USED", "ENDPOINT");
	for (size_t i = 0; i < wl->n_workers; i++) {
		const Weightfloor__V1__WorkerInfo *w = wl->workers[i];
		Weightfloor__V1__Reply *st = NULL;
		/* The agent's entry says who the worker is; the worker itself says what it holds. */
		bool live = worker_status(cli, w->worker_id, &st) == 0;
		const Weightfloor__V1__WorkerInfo *wi = live ? st->worker_info : w;
		if (cli->json) {
			struct json_object *o = wf_pb_to_json(&wi->base);
			json_object_object_add(o, "reachable", json_object_new_boolean(live));
			json_object_array_add(arr, o);
		} else {
			char b1[32], b2[32], b3[32];
			printf("%-16s %7u %-28.28s %10s %10s %10s  %s%s\n", wi->worker_id, wi->pid,
			       wi->device_name, cli_fmt_bytes(wi->device_total_bytes, b1, sizeof b1),
			       cli_fmt_bytes(wi->device_budget_bytes, b2, sizeof b2),
			       cli_fmt_bytes(wi->device_used_bytes, b3, sizeof b3), wi->endpoint,
			       live ? "" : "  (unreachable)");
			for (size_t k = 0; live && k < wi->n_models; k++) {
				const Weightfloor__V1__ModelResidency *m = wi->models[k];
				printf("  %-22s %-14s %10s on device\n", m->model,
				       residency_name(m->state),
				       cli_fmt_bytes(m->device_bytes, b1, sizeof b1));
			}
		}
		wf_ctl_reply_free(st);
	}
	if (cli->json) {
		struct json_object *o = json_object_new_object();
		json_object_object_add(o, "workers", arr);
		cli_json_print(o);
	}
	wf_ctl_reply_free(rep);
	return CLI_EXIT_OK;
}

/* A residency command runs in a thread while the main thread shows the load's progress from
 * WorkerStatus polls (the client is thread-safe: each call has its own context). */
struct pending {
	struct cli *cli;
	const char *what;
	Weightfloor__V1__Request *req;
	Weightfloor__V1__Reply *rep;
	int rc;
	volatile int done;
};

static void *run_call(void *arg)
{
	struct pending *p = arg;
	/* A load can take minutes: 30 of them unless --timeout says otherwise. The request carries
	 * it as its deadline, which bounds the agent's relay and the worker's calls to the agent. */
	p->rc = cli_call(p->cli, p->what, p->req,
			 p->cli->timeout_given ? p->cli->timeout_ms : 30 * 60 * 1000, &p->rep);
	__atomic_store_n(&p->done, 1, __ATOMIC_RELEASE);
	return NULL;
}

static int call_with_progress(struct cli *cli, const char *what, const char *worker,
			      const char *model, Weightfloor__V1__Request *req,
			      Weightfloor__V1__Reply **ret)
{
	struct pending p = {.cli = cli, .what = what, .req = req};
	pthread_t t;
	if (pthread_create(&t, NULL, run_call, &p) != 0) {
		run_call(&p);
	} else {
		/* quiet polling: errors here are the command's to report, not the poll's */
		struct cli quiet = *cli;
		quiet.quiet = true;
		while (!__atomic_load_n(&p.done, __ATOMIC_ACQUIRE)) {
			struct timespec ts = {0, 200 * 1000 * 1000};
			nanosleep(&ts, NULL);
			if (__atomic_load_n(&p.done, __ATOMIC_ACQUIRE) || !model || cli->quiet ||
			    cli->json || !isatty(STDERR_FILENO))
				continue;
			Weightfloor__V1__Reply *st = NULL;
			if (worker_status(&quiet, worker ? worker : "", &st) != 0)
				continue;
			for (size_t k = 0; k < st->worker_info->n_models; k++) {
				const Weightfloor__V1__ModelResidency *m = st->worker_info->models[k];
				if (strcmp(m->model, model) == 0 && m->bytes_total &&
				    m->bytes_done < m->bytes_total)
					cli_progress(cli, model, m->bytes_done, m->bytes_total, 0);
			}
			wf_ctl_reply_free(st);
		}
		pthread_join(t, NULL);
	}
	cli_progress_end(cli);
	*ret = p.rep;
	return p.rc;
}

static void print_residency(struct cli *cli, Weightfloor__V1__Reply *rep)
{
	if (rep->body_case == WEIGHTFLOOR__V1__REPLY__BODY_RESIDENCY) {
		const Weightfloor__V1__ModelResidency *m = rep->residency;
		if (cli->json) {
			cli_json_print(wf_pb_to_json(&m->base));
		} else {
			char b[32];
			printf("%-16s %-22s %-14s %10s on device\n", m->worker_id, m->model,
			       residency_name(m->state), cli_fmt_bytes(m->device_bytes, b, sizeof b));
		}
	} else if (rep->body_case == WEIGHTFLOOR__V1__REPLY__BODY_COMPACT) {
		const Weightfloor__V1__CompactReply *c = rep->compact;
		if (cli->json) {
			cli_json_print(wf_pb_to_json(&c->base));
		} else {
			char b1[32], b2[32];
			printf("compacted: %s freed, %s reloaded (%zu models) in %" PRIu64 " ms\n",
			       cli_fmt_bytes(c->bytes_freed, b1, sizeof b1),
			       cli_fmt_bytes(c->bytes_moved, b2, sizeof b2), c->n_reloaded,
			       c->duration_ms);
		}
	}
}

/* Runs one command on one worker (worker NULL: the agent picks the only one). */
static int one(struct cli *cli, const char *verb, const char *model, const char *state,
	       char **reload, size_t n_reload, const char *worker)
{
	Weightfloor__V1__Request req = WEIGHTFLOOR__V1__REQUEST__INIT;
	Weightfloor__V1__SetResidency sr = WEIGHTFLOOR__V1__SET_RESIDENCY__INIT;
	Weightfloor__V1__Pin pn = WEIGHTFLOOR__V1__PIN__INIT;
	Weightfloor__V1__Unpin up = WEIGHTFLOOR__V1__UNPIN__INIT;
	Weightfloor__V1__Evict ev = WEIGHTFLOOR__V1__EVICT__INIT;
	Weightfloor__V1__Prefetch pf = WEIGHTFLOOR__V1__PREFETCH__INIT;
	Weightfloor__V1__Compact cp = WEIGHTFLOOR__V1__COMPACT__INIT;
	char *wid = (char *)(worker ? worker : "");
	if (strcmp(verb, "residency") == 0) {
		if (parse_residency(state, &sr.target) < 0) {
			cli_err("residency: STATE must be disk, host, device or pinned_device");
			return CLI_EXIT_USAGE;
		}
		sr.model = (char *)model;
		sr.worker_id = wid;
		req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_SET_RESIDENCY;
		req.set_residency = &sr;
	} else if (strcmp(verb, "pin") == 0) {
		pn.model = (char *)model;
		pn.worker_id = wid;
		req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_PIN;
		req.pin = &pn;
	} else if (strcmp(verb, "unpin") == 0) {
		up.model = (char *)model;
		up.worker_id = wid;
		req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_UNPIN;
		req.unpin = &up;
	} else if (strcmp(verb, "evict") == 0) {
		ev.model = (char *)model;
		ev.worker_id = wid;
		req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_EVICT;
		req.evict = &ev;
	} else if (strcmp(verb, "prefetch") == 0) {
		pf.model = (char *)model;
		pf.worker_id = wid;
		req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_PREFETCH;
		req.prefetch = &pf;
	} else {
		cp.reload = reload;
		cp.n_reload = n_reload;
		cp.worker_id = wid;
		req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_COMPACT;
		req.compact = &cp;
	}
	char what[160];
	snprintf(what, sizeof what, "%s%s%.64s%s%.32s", verb, model ? " " : "", model ? model : "",
		 worker ? " on " : "", worker ? worker : "");
	Weightfloor__V1__Reply *rep = NULL;
	int rc = call_with_progress(cli, what, worker, model, &req, &rep);
	if (rc)
		return rc;
	print_residency(cli, rep);
	wf_ctl_reply_free(rep);
	return CLI_EXIT_OK;
}

/* residency MODEL STATE | pin MODEL | unpin MODEL | evict MODEL | prefetch MODEL |
 * compact [MODEL...], each with [--worker ID | --all]. */
int cmd_worker_verb(struct cli *cli, int argc, char **argv)
{
	const char *verb = argv[0];
	static const struct option opts[] = {
		{"json", no_argument, NULL, 'j'},
		{"worker", required_argument, NULL, 'w'},
		{"all", no_argument, NULL, 'a'},
		{"help", no_argument, NULL, 'h'},
		{0},
	};
	const char *worker = NULL;
	bool all = false;
	int c;
	optind = 0; /* 0, not 1: glibc then re-initializes, dropping main's "+" ordering */
	while ((c = getopt_long(argc, argv, "jw:ah", opts, NULL)) != -1) {
		switch (c) {
		case 'j': cli->json = true; break;
		case 'w': worker = optarg; break;
		case 'a': all = true; break;
		case 'h':
			printf("usage: agentctl residency MODEL disk|host|device|pinned_device\n"
			       "       agentctl pin|unpin|evict|prefetch MODEL\n"
			       "       agentctl compact [MODEL...]    (reload MODELs after freeing)\n"
			       "  each with --worker ID, or --all for every worker; without either\n"
			       "  the node must have exactly one worker.\n");
			return CLI_EXIT_OK;
		default: return CLI_EXIT_USAGE;
		}
	}
	int nargs = argc - optind;
	bool is_residency = strcmp(verb, "residency") == 0, is_compact = strcmp(verb, "compact") == 0;
	if ((is_residency && nargs != 2) || (!is_residency && !is_compact && nargs != 1) ||
	    (worker && all)) {
		cli_err("%s: wrong arguments (see agentctl %s --help)", verb, verb);
		return CLI_EXIT_USAGE;
	}
	const char *model = is_compact ? NULL : argv[optind];
	const char *state = is_residency ? argv[optind + 1] : NULL;
	char **reload = is_compact ? argv + optind : NULL;
	size_t n_reload = is_compact ? (size_t)nargs : 0;
	if (!all)
		return one(cli, verb, model, state, reload, n_reload, worker);

	Weightfloor__V1__Reply *wl;
	int rc = list_workers(cli, &wl);
	if (rc)
		return rc;
	if (wl->worker_list->n_workers == 0) {
		cli_err("%s --all: no worker is registered", verb);
		rc = CLI_EXIT_FAIL;
	}
	for (size_t i = 0; i < wl->worker_list->n_workers; i++) {
		int r = one(cli, verb, model, state, reload, n_reload,
			    wl->worker_list->workers[i]->worker_id);
		if (r && !rc)
			rc = r;
	}
	wf_ctl_reply_free(wl);
	return rc;
}
