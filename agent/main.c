/* wf-agent: the per-node daemon that materializes each model's weights once into the floor and
 * serves the control API. See docs/man/wf-agent.md. */
#include "agent/config.h"
#include "agent/floors.h"
#include "agent/metrics.h"
#include "agent/reloadwatch.h"
#include "agent/service.h"
#include "agent/workers.h"
#include "base/error.h"
#include "base/log.h"
#include "base/notify.h"
#include "base/units.h"
#include "control/pub.h"
#include "control/server.h"
#include "http/server.h"
#include "proto/request.h"
#include "proto/status.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct agent {
	struct wf_agent_config cfg;
	struct wf_floors *floors;
	struct wf_ctl_pub *pub;
	struct wf_ctl_server *srv;
	struct wf_agent_service svc;
	struct wf_workers *workers;
	struct wf_agent_metrics *metrics; /* with --metrics */
	struct wf_http_server *http;
	struct wf_reload_watch *reload_watch; /* with --reload-dir or --watch */
};

static void usage(FILE *out)
{
	fprintf(
	    out,
	    "usage: wf-agent [OPTIONS]\n"
	    "  -c, --config FILE        JSON configuration (see docs/man/wf-agent.md)\n"
	    "      --floor-dir DIR      floor directory (default /dev/shm/weightfloor)\n"
	    "      --socket URL         control endpoint (default "
	    "ipc:///run/weightfloor/agent.sock)\n"
	    "      --events URL         event endpoint (default "
	    "ipc:///run/weightfloor/events.sock)\n"
	    "      --host-budget SIZE   bytes of floors held at once (e.g. 64G)\n"
	    "      --spare N%%|SIZE      spare area of new floors, for published tensors (default\n"
	    "                           2%% of the model, at least 1 MiB; 0: none)\n"
	    "      --group NAME|GID     group given read access to floors and sockets\n"
	    "      --model NAME=PATH    register a model (repeatable)\n"
	    "      --preload NAME=PATH  register and materialize at start (repeatable)\n"
	    "      --io-backend B       auto, uring or pread\n"
	    "      --allow-uid UID      ipc peer allowed besides root and the agent's uid "
	    "(repeatable)\n"
	    "      --tls-cert FILE      certificate (PEM) for tls+tcp:// endpoints\n"
	    "      --tls-key FILE       its private key (PEM; default: in --tls-cert)\n"
	    "      --tls-ca FILE        CA (PEM) that signs client certificates (required for "
	    "tls+tcp)\n"
	    "      --daemonize          detach once serving (the parent exits 0 when ready)\n"
	    "      --state-file PATH    registrations and pins kept across restarts (\"none\": "
	    "off;\n"
	    "                           default: agent-state.json beside an ipc:// socket)\n"
	    "      --janitor-interval MS  how often floors nobody holds are reaped (default 2000)\n"
	    "      --reload-dir DIR     serve reload requests written as files there (see\n"
	    "                           docs/man/wf-agent.md, RELOADS)\n"
	    "      --watch              reload a model when its files change (inotify)\n"
	    "      --metrics HOST:PORT  serve /metrics, /healthz and /readyz over HTTP there\n"
	    "                           (\":9400\": 127.0.0.1:9400; default: off)\n"
	    "      --check-config       validate the configuration and the models, then exit\n"
	    "      --log-format F       text (default; the journal's under systemd) or json\n"
	    "  -v, --verbose            debug logging\n"
	    "  -h, --help\n"
	    "      --version            print \"wf-agent VERSION\" and exit\n");
}

/* Config-file values first, then flags on top: flags are collected and applied afterwards. */
struct overrides {
	const char *config, *floor_dir, *socket, *events, *budget, *group, *io_backend, *state_file;
	const char *reload_dir;
	bool watch;
	const char *metrics;
	const char *log_format;
	const char *spare;
	uint32_t janitor_ms;
	const char *tls_cert, *tls_key, *tls_ca;
	char **models;
	size_t n_models;
	bool *preload;
	uid_t *uids;
	size_t n_uids;
	bool daemonize, check, verbose;
};

static int add_model_flag(struct overrides *o, const char *arg, bool preload)
{
	char **m = realloc(o->models, (o->n_models + 1) * sizeof(*m));
	if (!m)
		return -ENOMEM;
	o->models = m;
	bool *p = realloc(o->preload, (o->n_models + 1) * sizeof(*p));
	if (!p)
		return -ENOMEM;
	o->preload = p;
	o->models[o->n_models] = (char *)arg;
	o->preload[o->n_models] = preload;
	o->n_models++;
	return 0;
}

static int parse_args(int argc, char **argv, struct overrides *o)
{
	enum {
		O_FLOOR = 256,
		O_SOCKET,
		O_EVENTS,
		O_BUDGET,
		O_GROUP,
		O_MODEL,
		O_PRELOAD,
		O_IO,
		O_UID,
		O_DAEMON,
		O_CHECK,
		O_STATE,
		O_JANITOR,
		O_TLS_CERT,
		O_TLS_KEY,
		O_TLS_CA,
		O_VERSION,
		O_METRICS,
		O_LOG_FORMAT,
		O_SPARE,
		O_RELOAD_DIR,
		O_WATCH
	};
	static const struct option opts[] = {
	    {"config", required_argument, NULL, 'c'},
	    {"floor-dir", required_argument, NULL, O_FLOOR},
	    {"socket", required_argument, NULL, O_SOCKET},
	    {"events", required_argument, NULL, O_EVENTS},
	    {"host-budget", required_argument, NULL, O_BUDGET},
	    {"spare", required_argument, NULL, O_SPARE},
	    {"group", required_argument, NULL, O_GROUP},
	    {"model", required_argument, NULL, O_MODEL},
	    {"preload", required_argument, NULL, O_PRELOAD},
	    {"io-backend", required_argument, NULL, O_IO},
	    {"allow-uid", required_argument, NULL, O_UID},
	    {"tls-cert", required_argument, NULL, O_TLS_CERT},
	    {"tls-key", required_argument, NULL, O_TLS_KEY},
	    {"tls-ca", required_argument, NULL, O_TLS_CA},
	    {"daemonize", no_argument, NULL, O_DAEMON},
	    {"check-config", no_argument, NULL, O_CHECK},
	    {"state-file", required_argument, NULL, O_STATE},
	    {"janitor-interval", required_argument, NULL, O_JANITOR},
	    {"metrics", required_argument, NULL, O_METRICS},
	    {"reload-dir", required_argument, NULL, O_RELOAD_DIR},
	    {"watch", no_argument, NULL, O_WATCH},
	    {"log-format", required_argument, NULL, O_LOG_FORMAT},
	    {"verbose", no_argument, NULL, 'v'},
	    {"help", no_argument, NULL, 'h'},
	    {"version", no_argument, NULL, O_VERSION},
	    {0},
	};
	int c;
	while ((c = getopt_long(argc, argv, "c:vh", opts, NULL)) != -1) {
		switch (c) {
		case 'c':
			o->config = optarg;
			break;
		case O_FLOOR:
			o->floor_dir = optarg;
			break;
		case O_SOCKET:
			o->socket = optarg;
			break;
		case O_EVENTS:
			o->events = optarg;
			break;
		case O_BUDGET:
			o->budget = optarg;
			break;
		case O_SPARE:
			o->spare = optarg;
			break;
		case O_GROUP:
			o->group = optarg;
			break;
		case O_IO:
			o->io_backend = optarg;
			break;
		case O_STATE:
			o->state_file = optarg;
			break;
		case O_METRICS:
			o->metrics = optarg;
			break;
		case O_RELOAD_DIR:
			o->reload_dir = optarg;
			break;
		case O_WATCH:
			o->watch = true;
			break;
		case O_LOG_FORMAT: {
			enum wf_log_format f;
			if (wf_log_format_parse(optarg, &f) < 0) {
				fprintf(stderr,
				        "wf-agent: --log-format must be text or json, not '%s'\n",
				        optarg);
				return 2;
			}
			o->log_format = optarg;
			break;
		}
		case O_JANITOR: {
			char *end;
			unsigned long v = strtoul(optarg, &end, 10);
			if (*end || end == optarg || v < 10 || v > 3600000) {
				fprintf(stderr,
				        "wf-agent: --janitor-interval: '%s' is not a number of "
				        "milliseconds in [10, 3600000]\n",
				        optarg);
				return 2;
			}
			o->janitor_ms = (uint32_t)v;
			break;
		}
		case O_TLS_CERT:
			o->tls_cert = optarg;
			break;
		case O_TLS_KEY:
			o->tls_key = optarg;
			break;
		case O_TLS_CA:
			o->tls_ca = optarg;
			break;
		case O_MODEL:
		case O_PRELOAD:
			if (!strchr(optarg, '=') || optarg[0] == '=') {
				fprintf(stderr,
				        "wf-agent: --model/--preload take NAME=PATH, not '%s'\n",
				        optarg);
				return 2;
			}
			if (add_model_flag(o, optarg, c == O_PRELOAD) < 0)
				return 1;
			break;
		case O_UID: {
			char *end;
			unsigned long v = strtoul(optarg, &end, 10);
			if (*end || end == optarg || v >= (uid_t)-1) {
				fprintf(stderr, "wf-agent: --allow-uid: '%s' is not a uid\n",
				        optarg);
				return 2;
			}
			uid_t *u = realloc(o->uids, (o->n_uids + 1) * sizeof(*u));
			if (!u)
				return 1;
			o->uids = u;
			o->uids[o->n_uids++] = (uid_t)v;
			break;
		}
		case O_DAEMON:
			o->daemonize = true;
			break;
		case O_CHECK:
			o->check = true;
			break;
		case 'v':
			o->verbose = true;
			break;
		case 'h':
			usage(stdout);
			exit(0);
		case O_VERSION:
			printf("wf-agent %s\n", WF_VERSION);
			exit(0);
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "wf-agent: unexpected argument '%s'\n", argv[optind]);
		return 2;
	}
	return 0;
}

/* Builds the final configuration: defaults, the file, then the flags, expressed as a JSON
 * overlay so that flags get exactly the validation the file gets. */
static int build_config(struct agent *a, const struct overrides *o)
{
	struct wf_diag d = {{0}};
	int rc = wf_agent_config_init(&a->cfg);
	if (rc < 0)
		return rc;
	if (o->config && (rc = wf_agent_config_load(&a->cfg, o->config, &d)) < 0) {
		wf_log_error("%s", wf_diag_str(&d, rc));
		return rc;
	}
#define SET_STR(field, val)                                                                        \
	do {                                                                                       \
		if (val) {                                                                         \
			char *s_ = strdup(val);                                                    \
			if (!s_)                                                                   \
				return -ENOMEM;                                                    \
			free(a->cfg.field);                                                        \
			a->cfg.field = s_;                                                         \
		}                                                                                  \
	} while (0)
	SET_STR(floor_dir, o->floor_dir);
	SET_STR(socket_url, o->socket);
	SET_STR(events_url, o->events);
	SET_STR(group, o->group);
	SET_STR(state_file, o->state_file);
	SET_STR(metrics, o->metrics);
	SET_STR(reload_dir, o->reload_dir);
	if (o->watch)
		a->cfg.watch = true;
	SET_STR(tls_cert, o->tls_cert);
	SET_STR(tls_key, o->tls_key);
	SET_STR(tls_ca, o->tls_ca);
	if (o->io_backend) {
		if (strcmp(o->io_backend, "auto") && strcmp(o->io_backend, "uring") &&
		    strcmp(o->io_backend, "pread")) {
			wf_log_error("--io-backend must be auto, uring or pread");
			return WF_EINVAL;
		}
		SET_STR(io_backend, o->io_backend);
	}
#undef SET_STR
	if (a->cfg.floor_dir[0] != '/') {
		wf_log_error("--floor-dir %s is not an absolute path", a->cfg.floor_dir);
		return WF_EINVAL;
	}
	if (a->cfg.reload_dir && a->cfg.reload_dir[0] != '/') {
		wf_log_error("--reload-dir %s is not an absolute path", a->cfg.reload_dir);
		return WF_EINVAL;
	}
	if (a->cfg.state_file && a->cfg.state_file[0] != '/' && strcmp(a->cfg.state_file, "none")) {
		wf_log_error("--state-file %s is neither an absolute path nor \"none\"",
		             a->cfg.state_file);
		return WF_EINVAL;
	}
	if (a->cfg.metrics) {
		struct sockaddr_storage ss;
		socklen_t sl;
		if ((rc = wf_http_addr_parse(a->cfg.metrics, &ss, &sl, &d)) < 0) {
			wf_log_error("--metrics: %s", wf_diag_str(&d, rc));
			return rc;
		}
	}
	if (o->budget) {
		if (wf_parse_size(o->budget, &a->cfg.host_budget) < 0) {
			wf_log_error("--host-budget: '%s' is not a size (e.g. 64G)", o->budget);
			return WF_EINVAL;
		}
	}
	if (o->spare && (rc = wf_agent_config_set_spare(&a->cfg, o->spare, &d)) < 0) {
		wf_log_error("--%s", wf_diag_str(&d, rc));
		return rc;
	}
	if (o->n_uids) {
		uid_t *u =
		    realloc(a->cfg.allowed_uids, (a->cfg.n_allowed_uids + o->n_uids) * sizeof(*u));
		if (!u)
			return -ENOMEM;
		memcpy(u + a->cfg.n_allowed_uids, o->uids, o->n_uids * sizeof(*u));
		a->cfg.allowed_uids = u;
		a->cfg.n_allowed_uids += o->n_uids;
	}
	if (o->n_models) {
		size_t n = a->cfg.n_models + o->n_models;
		struct wf_agent_model_cfg *m = realloc(a->cfg.models, n * sizeof(*m));
		if (!m)
			return -ENOMEM;
		a->cfg.models = m;
		for (size_t i = 0; i < o->n_models; i++) {
			const char *eq = strchr(o->models[i], '=');
			struct wf_agent_model_cfg *mc = &m[a->cfg.n_models];
			memset(mc, 0, sizeof(*mc));
			mc->name = strndup(o->models[i], (size_t)(eq - o->models[i]));
			mc->path = strdup(eq + 1);
			mc->preload = o->preload[i];
			a->cfg.n_models++;
			if (!mc->name || !mc->path)
				return -ENOMEM;
			for (size_t j = 0; j + 1 < a->cfg.n_models; j++) {
				if (strcmp(m[j].name, mc->name) == 0) {
					wf_log_error("model '%s' given twice", mc->name);
					return WF_EINVAL;
				}
			}
		}
	}
	if ((rc = wf_agent_config_resolve(&a->cfg, &d)) < 0) {
		wf_log_error("%s", wf_diag_str(&d, rc));
		return rc;
	}
	return 0;
}
static Weightfloor__V1__FloorState pb_state(enum wf_floor_state s)
{
	return (Weightfloor__V1__FloorState)s; /* the enums share their numbers by design */
}

static const char *residency_name(Weightfloor__V1__Residency r)
{
	const ProtobufCEnumValue *v =
	    protobuf_c_enum_descriptor_get_value(&weightfloor__v1__residency__descriptor, (int)r);
	/* "RESIDENCY_DEVICE" -> "DEVICE", as the worker and agentctl print it */
	return !v ? "?" : strncmp(v->name, "RESIDENCY_", 10) == 0 ? v->name + 10 : v->name;
}

static void log_request_failure(const Weightfloor__V1__Request *req, int rv,
                                Weightfloor__V1__Status st, const char *message)
{
	struct wf_proto_request_desc rd;
	wf_proto_request_describe(req, &rd);
	wf_log_event(st == WEIGHTFLOOR__V1__STATUS__STATUS_INTERNAL ? WF_LOG_ERROR : WF_LOG_INFO,
	             WF_LOG_F(.request_id = req->request_id, .client = req->client,
	                      .model = rd.model, .worker = rd.worker, .event = "request_failed",
	                      .code = rv < 0 ? rv : wf_proto_status_to_err(st)),
	             "%s: %s: %s", rd.kind, wf_proto_status_name(st), message);
}

/* Bytes of tensor ids and names one PUBLISHED event carries at most: the rest of the event is
 * small, and the publisher refuses events over WF_CTL_MAX_EVENT_DEFAULT (64 KiB). */
#define PUBLISHED_EVENT_LIST_BYTES (48u << 10)

/* A publish, announced: one Event of kind PUBLISHED, or, when its tensor list would not fit in
 * one event, several with the same digest and generation, each with a part of the list (ids and
 * their names together); the parts together are the publish's (docs/PROTOCOL.md). */
static void publish_published(struct agent *a, Weightfloor__V1__Event *e,
                              const struct wf_floor_event *ev)
{
	e->kind = WEIGHTFLOOR__V1__EVENT_KIND__EVENT_KIND_PUBLISHED;
	e->digest = (char *)(ev->digest_hex ? ev->digest_hex : "");
	e->generation = ev->generation;
	uint32_t i = 0, n = ev->n_tensors;
	do {
		size_t bytes = 0;
		uint32_t k = i;
		while (k < n) {
			size_t add = 8 + (ev->tensor_names ? strlen(ev->tensor_names[k]) + 3 : 0);
			if (k > i && bytes + add > PUBLISHED_EVENT_LIST_BYTES)
				break;
			bytes += add;
			k++;
		}
		e->n_tensor_ids = k - i;
		e->tensor_ids = (uint32_t *)(ev->tensor_ids + i);
		e->n_tensor_names = ev->tensor_names ? k - i : 0;
		e->tensor_names = ev->tensor_names ? (char **)(ev->tensor_names + i) : NULL;
		int rc = wf_ctl_pub_publish(a->pub, e, NULL);
		if (rc < 0)
			wf_log_event(WF_LOG_ERROR,
			             WF_LOG_F(.model = ev->model, .event = "published", .code = rc),
			             "cannot announce generation %llu: %s",
			             (unsigned long long)ev->generation, wf_strerror(rc));
		i = k;
	} while (i < n);
}

/* "a, b, c and 5 more" of a publish's tensor names, for its log line. */
static void names_summary(const struct wf_floor_event *ev, char *buf, size_t len)
{
	size_t at = 0;
	uint32_t i = 0;
	buf[0] = '\0';
	for (; ev->tensor_names && i < ev->n_tensors && i < 4 && at < len; i++) {
		int w = snprintf(buf + at, len - at, "%s%s", i ? ", " : "", ev->tensor_names[i]);
		if (w < 0)
			break;
		at += (size_t)w;
	}
	if (i < ev->n_tensors && at < len)
		snprintf(buf + at, len - at, "%sand %u more", i ? " " : "", ev->n_tensors - i);
}

static void on_floor_event(void *ctx, const struct wf_floor_event *ev)
{
	struct agent *a = ctx;
	wf_agent_metrics_floor_event(a->metrics, ev);
	Weightfloor__V1__Event e = WEIGHTFLOOR__V1__EVENT__INIT;
	e.model = (char *)ev->model;
	e.floor_state = pb_state(ev->state);
	e.message = (char *)(ev->message ? ev->message : "");
	switch (ev->kind) {
	case WF_FLOOR_EV_STATE:
		e.kind = WEIGHTFLOOR__V1__EVENT_KIND__EVENT_KIND_FLOOR_STATE;
		if (ev->message && *ev->message)
			wf_log_event(WF_LOG_INFO,
			             WF_LOG_F(.model = ev->model, .event = "floor_state"),
			             "%s (%s)", wf_floor_state_name(ev->state), ev->message);
		else
			wf_log_event(WF_LOG_INFO,
			             WF_LOG_F(.model = ev->model, .event = "floor_state"), "%s",
			             wf_floor_state_name(ev->state));
		break;
	case WF_FLOOR_EV_PROGRESS:
		e.kind = WEIGHTFLOOR__V1__EVENT_KIND__EVENT_KIND_PROGRESS;
		e.bytes_done = ev->bytes_done;
		e.bytes_total = ev->bytes_total;
		e.rate_bytes_per_s = ev->rate_bytes_per_s;
		break;
	case WF_FLOOR_EV_STALE:
		e.kind = WEIGHTFLOOR__V1__EVENT_KIND__EVENT_KIND_STALE;
		wf_log_event(WF_LOG_WARN, WF_LOG_F(.model = ev->model, .event = "stale"), "%s",
		             ev->message ? ev->message : "stale floor");
		break;
	case WF_FLOOR_EV_PUBLISHED: {
		char names[512];
		names_summary(ev, names, sizeof names);
		wf_log_event(WF_LOG_INFO, WF_LOG_F(.model = ev->model, .event = "published"),
		             "published generation %llu of floor %s: %u tensor%s, %llu bytes (%s)",
		             (unsigned long long)ev->generation, ev->digest_hex, ev->n_tensors,
		             ev->n_tensors == 1 ? "" : "s", (unsigned long long)ev->bytes_done,
		             names);
		if (a->pub)
			publish_published(a, &e, ev);
		return;
	}
	case WF_FLOOR_EV_RELOADED:
		e.kind = WEIGHTFLOOR__V1__EVENT_KIND__EVENT_KIND_RELOADED;
		e.code = wf_proto_status_from_err(ev->code);
		e.digest = (char *)(ev->digest_hex ? ev->digest_hex : "");
		e.generation = ev->generation;
		wf_log_event(ev->code ? WF_LOG_WARN : WF_LOG_INFO,
		             WF_LOG_F(.model = ev->model, .event = "reloaded", .code = ev->code),
		             "%s (%.3f s)", ev->message, ev->seconds);
		break;
	case WF_FLOOR_EV_ERROR:
		e.kind = WEIGHTFLOOR__V1__EVENT_KIND__EVENT_KIND_ERROR;
		e.code = wf_proto_status_from_err(ev->code);
		wf_log_event(WF_LOG_ERROR,
		             WF_LOG_F(.model = ev->model, .event = "floor_error", .code = ev->code),
		             "%s", ev->message ? ev->message : wf_strerror(ev->code));
		break;
	}
	if (a->pub)
		wf_ctl_pub_publish(a->pub, &e, NULL);
}

static void on_worker_event(void *ctx, const char *worker_id, const char *message)
{
	struct agent *a = ctx;
	wf_log_event(WF_LOG_INFO, WF_LOG_F(.worker = worker_id, .event = "worker"), "%s", message);
	Weightfloor__V1__Event e = WEIGHTFLOOR__V1__EVENT__INIT;
	e.kind = WEIGHTFLOOR__V1__EVENT_KIND__EVENT_KIND_WORKER;
	e.worker_id = (char *)worker_id;
	e.message = (char *)message;
	if (a->pub)
		wf_ctl_pub_publish(a->pub, &e, NULL);
}

/* A worker's cache change (ReportResidency), published for `agentctl watch` and control planes. */
static void on_worker_residency(void *ctx, const char *worker_id,
                                const Weightfloor__V1__ResidencyChange *c)
{
	struct agent *a = ctx;
	Weightfloor__V1__Event e = WEIGHTFLOOR__V1__EVENT__INIT;
	e.kind = WEIGHTFLOOR__V1__EVENT_KIND__EVENT_KIND_RESIDENCY;
	e.worker_id = (char *)worker_id;
	e.model = c->model;
	e.residency = c->state;
	e.message = c->message;
	wf_log_event(WF_LOG_INFO,
	             WF_LOG_F(.worker = worker_id, .model = c->model, .event = "residency"),
	             "%s%s%s", residency_name(c->state), c->message && *c->message ? ": " : "",
	             c->message ? c->message : "");
	if (c->time_unix_ms > 0)
		e.time_unix_ms = c->time_unix_ms;
	if (a->pub)
		wf_ctl_pub_publish(a->pub, &e, NULL);
}

#define STOP_GRACE_S 10

static void *stop_deadline(void *arg)
{
	(void)arg;
	sleep(STOP_GRACE_S);
	static const char msg[] = "wf-agent: requests still running "
	                          "10 s after the stop signal; "
	                          "exiting without waiting for them\n";
	ssize_t w = write(STDERR_FILENO, msg, sizeof msg - 1);
	(void)w;
	_exit(1);
	return NULL;
}

/* Concurrent requests. Relays to workers may take half (agent/workers.h), so a hung worker
 * never takes the threads that status, listing and EnsureFloor need. Completions followed
 * through the agent (one long poll each) get threads of their own on top. */
#define AGENT_REQUEST_THREADS    8
#define AGENT_COMPLETION_THREADS 32

/* One line per failed request, with its id, client, kind, model and worker, so that a client's
 * error can be found in the agent's log (the request id is the one the client chose). Relays
 * to workers are included: the worker logs its side under the agent's own request id. */
static int handle_logged(void *ctx, const Weightfloor__V1__Request *req,
                         Weightfloor__V1__Reply *reply, struct wf_ctl_call *call)
{
	int rv = wf_agent_service_handle(ctx, req, reply, call);
	Weightfloor__V1__Status st = rv < 0 ? wf_proto_status_from_err(rv) : reply->code;
	if (rv < 0 || st != WEIGHTFLOOR__V1__STATUS__STATUS_OK)
		log_request_failure(req, rv, st,
		                    reply->message && *reply->message ? reply->message
		                                                      : wf_strerror(rv));
	return rv;
}

/* The control library's lines (listener replaced, peers turned away) into the agent's log. */
static void log_ctl(void *arg, int level, const char *line)
{
	(void)arg;
	wf_log((enum wf_log_level)level, "%s", line);
}

static int start_services(struct agent *a)
{
	struct wf_diag d = {{0}};
	struct wf_ctl_listen_opts lo = {
	    .ipc_mode = 0660,
	    .ipc_group = a->cfg.gid,
	    .allowed_uids = a->cfg.allowed_uids,
	    .n_allowed_uids = a->cfg.n_allowed_uids,
	    .allowed_gids = a->cfg.allowed_gids,
	    .n_allowed_gids = a->cfg.n_allowed_gids,
	    .log = log_ctl,
	    .tls = {.cert_file = a->cfg.tls_cert,
	            .key_file = a->cfg.tls_key,
	            .ca_file = a->cfg.tls_ca},
	};
	int rc;
	if ((rc = wf_ctl_ipc_dir_ensure(a->cfg.socket_url, a->cfg.gid)) < 0 ||
	    (rc = wf_ctl_ipc_dir_ensure(a->cfg.events_url, a->cfg.gid)) < 0) {
		wf_log_error("cannot create the socket directory: %s", wf_strerror(rc));
		return rc;
	}
	struct wf_ctl_pub_opts po = {.listen = lo};
	po.listen.url = a->cfg.events_url;
	if ((rc = wf_ctl_pub_create(&po, &a->pub, &d)) < 0) {
		wf_log_error("events %s: %s", a->cfg.events_url, wf_diag_str(&d, rc));
		return rc;
	}
	struct wf_ctl_server_opts so = {
	    .listen = lo,
	    .max_request_size = a->cfg.max_message,
	    .handle = a->metrics ? wf_agent_metrics_handle : handle_logged,
	    .ctx = a->metrics ? (void *)a->metrics : (void *)&a->svc,
	    .nworkers = AGENT_REQUEST_THREADS + AGENT_COMPLETION_THREADS,
	};
	so.listen.url = a->cfg.socket_url;
	if ((rc = wf_ctl_server_create(&so, &a->srv, &d)) < 0) {
		wf_log_error("control %s: %s", a->cfg.socket_url, wf_diag_str(&d, rc));
		return rc;
	}
	if ((rc = wf_ctl_server_start(a->srv)) < 0) {
		wf_log_error("control server threads: %s", wf_strerror(rc));
		return rc;
	}
	return 0;
}

/* --daemonize: the child does everything; the parent waits for its one-byte "ready" (exit 0) or
 * for the pipe to close without it (exit 1), so `wf-agent --daemonize && agentctl status` works. */
static int daemonize(int *ret_ready_fd)
{
	int p[2];
	if (pipe2(p, O_CLOEXEC) < 0)
		return -errno;
	pid_t pid = fork();
	if (pid < 0)
		return -errno;
	if (pid > 0) {
		close(p[1]);
		char b;
		ssize_t r;
		do
			r = read(p[0], &b, 1);
		while (r < 0 && errno == EINTR);
		_exit(r == 1 ? 0 : 1);
	}
	close(p[0]);
	if (setsid() < 0)
		return -errno;
	int null = open("/dev/null", O_RDWR | O_CLOEXEC);
	if (null >= 0) {
		dup2(null, STDIN_FILENO);
		dup2(null, STDOUT_FILENO);
		close(null);
	}
	*ret_ready_fd = p[1];
	return 0;
}

int main(int argc, char **argv)
{
	struct overrides o = {0};
	int rc = parse_args(argc, argv, &o);
	if (rc)
		return rc;
	wf_log_init("wf-agent", o.verbose ? WF_LOG_DEBUG : WF_LOG_INFO);
	enum wf_log_format log_format;
	if (o.log_format && wf_log_format_parse(o.log_format, &log_format) == 0)
		wf_log_set_format(log_format);

	int ready_fd = -1;
	if (o.daemonize && !o.check && (rc = daemonize(&ready_fd)) < 0) {
		wf_log_error("daemonize: %s", wf_strerror(rc));
		return 1;
	}

	/* Signals are taken synchronously by the main thread; every other thread inherits the
	 * mask, so none of them is interrupted. */
	sigset_t sigs;
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGINT);
	sigaddset(&sigs, SIGTERM);
	sigaddset(&sigs, SIGHUP);
	pthread_sigmask(SIG_BLOCK, &sigs, NULL);
	signal(SIGPIPE, SIG_IGN);

	struct agent a = {0};
	int exit_code = 1;
	struct wf_diag d = {{0}};
	if (build_config(&a, &o) < 0)
		goto out;
	/* The flag was applied at once (so that errors in the file are logged in its format); the
	 * file's key counts only without it. */
	if (!o.log_format && a.cfg.log_format &&
	    wf_log_format_parse(a.cfg.log_format, &log_format) == 0)
		wf_log_set_format(log_format);

	/* The HTTP endpoint comes up first, not ready, so that probes see "starting" (and
	 * /healthz) while floors are re-adopted, which may take a while. */
	if (a.cfg.metrics && !o.check) {
		if ((rc = wf_agent_metrics_create(&a.metrics)) < 0) {
			wf_log_error("metrics: %s", wf_strerror(rc));
			goto out;
		}
		struct wf_http_opts ho = {.addr = a.cfg.metrics,
		                          .metrics = wf_agent_metrics_registry(a.metrics),
		                          .live = wf_agent_metrics_live,
		                          .ctx = a.metrics};
		if ((rc = wf_http_server_start(&ho, &a.http, &d)) < 0) {
			wf_log_error("--metrics %s: %s", a.cfg.metrics, wf_diag_str(&d, rc));
			goto out;
		}
		wf_http_server_set_ready(a.http, false, "starting: recovering floors");
		wf_log_info("metrics and health on http://%s (port %u)", a.cfg.metrics,
		            (unsigned)wf_http_server_port(a.http));
	}

	char *state_file = NULL;
	if (wf_agent_config_state_path(&a.cfg, &state_file) < 0)
		goto out;
	struct wf_floors_opts fo = {.cfg = &a.cfg,
	                            .on_event = on_floor_event,
	                            .event_ctx = &a,
	                            .state_file = state_file,
	                            .janitor_interval_ms = o.janitor_ms};
	rc = wf_floors_create(&fo, &a.floors, &d);
	free(state_file);
	if (rc < 0) {
		wf_log_error("%s", wf_diag_str(&d, rc));
		goto out;
	}
	struct wf_floors_status st;
	wf_floors_status(a.floors, &st);
	if (st.uring_err)
		wf_log_warn("io_uring unavailable (%s): materializing with the pread thread pool",
		            wf_strerror(st.uring_err));
	if (o.check) {
		printf("configuration valid: %u models, floor %s, budget %llu bytes, reader %s%s\n",
		       st.n_models, a.cfg.floor_dir, (unsigned long long)st.host_budget,
		       st.reader_backend, st.o_direct ? " (O_DIRECT)" : "");
		exit_code = 0;
		goto out;
	}
	wf_log_info("floor %s, host budget %llu bytes, reader %s%s, %u models registered",
	            a.cfg.floor_dir, (unsigned long long)st.host_budget, st.reader_backend,
	            st.o_direct ? " with O_DIRECT" : " (buffered)", st.n_models);

	uint32_t adopted = 0, removed = 0;
	wf_diag_clear(&d);
	if ((rc = wf_floors_adopt(a.floors, &adopted, &removed, &d)) < 0)
		wf_log_warn("scanning %s: %s", a.cfg.floor_dir, wf_diag_str(&d, rc));
	else
		wf_log_info(
		    "floor directory scan: %u floors re-adopted, %u broken or unowned removed",
		    adopted, removed);

	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	if ((rc = wf_workers_create(on_worker_event, &a, &a.workers)) < 0) {
		wf_log_error("worker registry: %s", wf_strerror(rc));
		goto out;
	}
	if ((rc = wf_workers_set_self(a.workers, a.cfg.socket_url, a.cfg.events_url,
	                              AGENT_REQUEST_THREADS)) < 0) {
		wf_log_error("worker registry: %s", wf_strerror(rc));
		goto out;
	}
	wf_workers_set_completion_relays(a.workers, AGENT_COMPLETION_THREADS);
	wf_workers_set_residency_fn(a.workers, on_worker_residency, &a);
	a.svc.worker_count = wf_workers_count;
	a.svc.worker_ctx = a.workers;
	a.svc.worker_handle = wf_workers_handle;
	a.svc.worker_handle_ctx = a.workers;
	if (a.metrics) {
		wf_agent_metrics_bind(a.metrics, a.floors, a.workers);
		wf_agent_metrics_wrap(a.metrics, handle_logged, &a.svc);
	}
	a.svc.floors = a.floors;
	a.svc.cfg = &a.cfg;
	a.svc.started_mono_ns = (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
	clock_gettime(CLOCK_REALTIME, &ts);
	a.svc.started_unix_ms = (int64_t)ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
	if (start_services(&a) < 0)
		goto out;
	wf_log_info("serving %s, events on %s", wf_ctl_server_url(a.srv), a.cfg.events_url);
	wf_floors_preload(a.floors);
	struct wf_reload_watch_opts ro = {
	    .floors = a.floors, .control_dir = a.cfg.reload_dir, .watch_files = a.cfg.watch};
	wf_diag_clear(&d);
	if ((rc = wf_reload_watch_start(&ro, &a.reload_watch, &d)) < 0) {
		wf_log_error("%s", wf_diag_str(&d, rc));
		goto out;
	}
	if (a.reload_watch)
		wf_log_info("reloads: %s%s%s", a.cfg.watch ? "watching the models' files; " : "",
		            a.cfg.reload_dir ? "requests from files in " : "",
		            a.cfg.reload_dir ? a.cfg.reload_dir : "");
	if (a.http)
		wf_http_server_set_ready(a.http, true, NULL);
	wf_sd_notify("READY=1");
	if (ready_fd >= 0) {
		ssize_t w = write(ready_fd, "1", 1);
		(void)w;
		close(ready_fd);
		ready_fd = -1;
	}

	for (;;) {
		int sig = 0;
		if (sigwait(&sigs, &sig) != 0)
			continue;
		if (sig == SIGHUP) {
			wf_log_info(
			    "SIGHUP: configuration reload is not supported; restart the agent "
			    "(floors are re-adopted)");
			continue;
		}
		wf_log_info("signal %d: stopping (floors stay for the next agent)", sig);
		break;
	}
	/* Stopping must not depend on every request finishing: past the grace period the process
	 * exits anyway (floors, markers and the state file are consistent at every moment). */
	pthread_t stopper;
	if (pthread_create(&stopper, NULL, stop_deadline, NULL) == 0)
		pthread_detach(stopper);
	wf_sd_notify("STOPPING=1");
	if (a.http)
		wf_http_server_set_ready(a.http, false, "stopping");
	exit_code = 0;
out:
	wf_reload_watch_stop(a.reload_watch); /* it calls into the floors */
	if (a.srv) {
		wf_ctl_server_close(a.srv);
		wf_ctl_server_stop(a.srv);
	}
	wf_ctl_server_destroy(a.srv);
	/* The endpoint's collector reads the floors and the workers: it goes before them. */
	wf_http_server_destroy(a.http);
	wf_floors_destroy(a.floors);
	wf_workers_destroy(a.workers);
	wf_ctl_pub_destroy(a.pub);
	wf_agent_metrics_destroy(a.metrics);
	wf_agent_config_fini(&a.cfg);
	free(o.models);
	free(o.preload);
	free(o.uids);
	if (ready_fd >= 0)
		close(ready_fd);
	return exit_code;
}
