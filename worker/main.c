/* wf-worker: one per GPU (or container). Attaches the node's floors, owns one device and its
 * weight cache, obeys residency commands on its own endpoint, and registers with the agent.
 * See docs/man/wf-worker.md. */
#include "base/error.h"
#include "base/log.h"
#include "base/notify.h"
#include "base/units.h"
#include "control/client.h"
#include "control/server.h"
#include "device/device.h"
#include "engine/postfetch.h"
#include "engine/tokenizer.h"
#include "http/server.h"
#include "model/model.h"
#include "proto/request.h"
#include "proto/status.h"
#include "worker/agentlink.h"
#include "worker/cache.h"
#include "worker/completion.h"
#include "worker/eval.h"
#include "worker/evaluate.h"
#include "worker/metrics.h"
#include "worker/perplexity.h"
#include "worker/refresh.h"
#include "worker/service.h"
#ifdef WF_HAVE_CUDA
#include "cuda/backend.h"
#include "cuda/device_cuda.h"
#endif

#include <errno.h>
#include <getopt.h>
#include <grp.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define NAMES_MAX 256 /* --model, --pin and --prefetch flags, each */

struct opts {
	const char *device, *id, *endpoint, *agent, *floor_dir, *mode, *load_mode;
	const char *metrics; /* --metrics HOST:PORT */
	double weight_fraction, wiggle;
	uint64_t max_scratch, arena, staging_size, alloc_max;
	unsigned staging_buffers;
	const char *models[NAMES_MAX];
	size_t n_models;
	const char *pins[NAMES_MAX];
	size_t n_pins;
	const char *prefetch[NAMES_MAX];
	size_t n_prefetch;
	uid_t uids[64];
	size_t n_uids;
	gid_t gids[64]; /* --allow-gid: peers whose primary group is one of these */
	size_t n_gids;
	struct wf_ctl_tls_opts tls;             /* tls+tcp:// endpoint and agent */
	struct wf_completion_opts completion;   /* Generate's engines */
	struct wf_postfetch_settings postfetch; /* the environment's, then --postfetch's */
	bool postfetch_asked; /* a WF_POSTFETCH_* variable, --postfetch or --expert-cache-mb */
	uint32_t expert_cache_mb;
	bool experts_on_device; /* --n-cpu-moe N */
	uint32_t n_cpu_moe;
	bool dense_on_device; /* --dense-on-device (implied on a GPU) */
	bool verbose;
	int log_format; /* enum wf_log_format; -1: not given */
};

static void usage(FILE *out)
{
	fprintf(
	    out,
	    "usage: wf-worker [OPTIONS]\n"
	    "  --device SPEC         auto (default), host[:mem=SIZE,bw=RATE], cuda:N\n"
	    "  --id ID               worker id (default: <device>-<pid>)\n"
	    "  --endpoint URL        this worker's control endpoint\n"
	    "                        (default ipc:///run/weightfloor/worker-<id>.sock)\n"
	    "  --agent URL|none      the agent (default ipc:///run/weightfloor/agent.sock)\n"
	    "  --floor-dir DIR       floors (default /dev/shm/weightfloor)\n"
	    "  --model NAME=PATH     a model this worker may load (repeatable; with an agent,\n"
	    "                        models registered there are found by name)\n"
	    "  --pin NAME            load and pin at start (repeatable)\n"
	    "  --prefetch NAME       load at start (repeatable)\n"
	    "  --mode self|external  self-managed (default): requests load and evict LRU;\n"
	    "                        external: the control plane decides (NOT_RESIDENT)\n"
	    "  --arena SIZE          usable device memory (default: free memory at start)\n"
	    "  --weight-fraction F   share of the arena for weights (default 0.90)\n"
	    "  --wiggle F            share of the arena kept free (default 0.05)\n"
	    "  --max-scratch SIZE    largest execution scratch (default 0)\n"
	    "  --load-mode M         auto (measure, keep the faster), staged or direct\n"
	    "  --staging-buffers N   pinned staging buffers (default 8)\n"
	    "  --staging-size SIZE   bytes each (default 8M)\n"
	    "  --alloc-max SIZE      split a model's device memory into allocations of at most "
	    "SIZE\n"
	    "  --allow-uid UID       ipc peer allowed besides root and our uid (repeatable)\n"
	    "  --allow-gid GROUP     ipc peers of this primary group (name or gid) allowed too\n"
	    "                        (repeatable; e.g. the agent's group under systemd)\n"
	    "  --tls-cert FILE       certificate (PEM) for a tls+tcp:// endpoint, also presented\n"
	    "                        to a tls+tcp:// agent\n"
	    "  --tls-key FILE        its private key (PEM; default: in --tls-cert)\n"
	    "  --ctx N               completions: KV positions per sequence (default: the\n"
	    "                        model's context, at most 4096)\n"
	    "  --seqs N              completions: concurrent sequences per model (default 8)\n"
	    "  --threads N           completions: engine threads (default: every CPU allowed)\n"
	    "  --postfetch NAME=VALUE\n"
	    "                        completions: an expert post-fetch setting (repeatable; names\n"
	    "                        as the WF_POSTFETCH_* variables, which apply first: enable,\n"
	    "                        force_cpu, block_on_miss, max_transfers, scratchpad_mb,\n"
	    "                        dedicated_streams, debug)\n"
	    "  --expert-cache-mb N   completions: a device expert cache of N MiB (default 0)\n"
	    "  --n-cpu-moe N         completions: experts of layers N and up resident on the "
	    "device,\n"
	    "                        the first N host-side\n"
	    "  --cpu-moe             completions: every layer's experts host-side (the default)\n"
	    "  --dense-on-device     completions on the host device: the device forward pass "
	    "(dense\n"
	    "                        weights and KV cache in device memory), as on a GPU, where "
	    "it\n"
	    "                        is always so\n"
	    "  --tls-ca FILE         CA (PEM) that signs the clients' and the agent's "
	    "certificates\n"
	    "  --metrics HOST:PORT   serve /metrics, /healthz and /readyz over HTTP there\n"
	    "                        (\":9401\": 127.0.0.1:9401; default: off)\n"
	    "  --log-format F        text (default; the journal's under systemd) or json\n"
	    "  -v, --verbose\n"
	    "  --version             print \"wf-worker VERSION\" and exit\n");
}

static int parse_size_flag(const char *flag, const char *arg, uint64_t *out)
{
	if (wf_parse_size(arg, out) < 0) {
		fprintf(stderr, "wf-worker: %s: '%s' is not a size (e.g. 8G)\n", flag, arg);
		return 2;
	}
	return 0;
}

/* A whole number in [min, max] for a flag (base/units.h's one parser). */
/* --allow-gid: a group name (looked up now) or a number. */
static int parse_gid_flag(const char *arg, gid_t *out)
{
	char *end;
	errno = 0;
	unsigned long v = strtoul(arg, &end, 10);
	if (*arg && !*end && !errno && v < (gid_t)-1) {
		*out = (gid_t)v;
		return 0;
	}
	struct group gr, *res = NULL;
	char buf[4096];
	if (getgrnam_r(arg, &gr, buf, sizeof buf, &res) != 0 || !res) {
		fprintf(stderr, "wf-worker: --allow-gid: no group '%s'\n", arg);
		return 2;
	}
	*out = res->gr_gid;
	return 0;
}

static int parse_uint_flag(const char *flag, const char *arg, uint64_t min, uint64_t max,
                           uint64_t *out)
{
	uint64_t v;
	if (wf_parse_uint(arg, max, &v) < 0 || v < min) {
		fprintf(stderr, "wf-worker: %s takes %llu..%llu, not '%s'\n", flag,
		        (unsigned long long)min, (unsigned long long)max, arg);
		return 2;
	}
	*out = v;
	return 0;
}

/* One more repeatable --model, --pin or --prefetch; more than NAMES_MAX is refused, saying so. */
static int add_name(const char *flag, const char *arg, const char **names, size_t *n)
{
	if (*n == NAMES_MAX) {
		fprintf(stderr, "wf-worker: %s %s: at most %d %s flags\n", flag, arg, NAMES_MAX,
		        flag);
		return 2;
	}
	names[(*n)++] = arg;
	return 0;
}

static int parse_fraction(const char *flag, const char *arg, double *out)
{
	char *end;
	double v = strtod(arg, &end);
	if (*end || end == arg || !(v >= 0.0 && v <= 1.0)) {
		fprintf(stderr, "wf-worker: %s: '%s' is not a fraction in [0, 1]\n", flag, arg);
		return 2;
	}
	*out = v;
	return 0;
}

static int parse_args(int argc, char **argv, struct opts *o)
{
	enum {
		O_DEVICE = 256,
		O_ID,
		O_ENDPOINT,
		O_AGENT,
		O_FLOOR,
		O_MODEL,
		O_PIN,
		O_PREFETCH,
		O_MODE,
		O_ARENA,
		O_FRACTION,
		O_WIGGLE,
		O_SCRATCH,
		O_LOADMODE,
		O_SBUF,
		O_SSIZE,
		O_ALLOCMAX,
		O_UID,
		O_GID,
		O_TLS_CERT,
		O_TLS_KEY,
		O_TLS_CA,
		O_VERSION,
		O_CTX,
		O_SEQS,
		O_THREADS,
		O_POSTFETCH,
		O_CACHE_MB,
		O_N_CPU_MOE,
		O_CPU_MOE,
		O_DENSE,
		O_METRICS,
		O_LOG_FORMAT
	};
	static const struct option lo[] = {
	    {"device", required_argument, NULL, O_DEVICE},
	    {"id", required_argument, NULL, O_ID},
	    {"endpoint", required_argument, NULL, O_ENDPOINT},
	    {"agent", required_argument, NULL, O_AGENT},
	    {"floor-dir", required_argument, NULL, O_FLOOR},
	    {"model", required_argument, NULL, O_MODEL},
	    {"pin", required_argument, NULL, O_PIN},
	    {"prefetch", required_argument, NULL, O_PREFETCH},
	    {"mode", required_argument, NULL, O_MODE},
	    {"arena", required_argument, NULL, O_ARENA},
	    {"weight-fraction", required_argument, NULL, O_FRACTION},
	    {"wiggle", required_argument, NULL, O_WIGGLE},
	    {"max-scratch", required_argument, NULL, O_SCRATCH},
	    {"load-mode", required_argument, NULL, O_LOADMODE},
	    {"staging-buffers", required_argument, NULL, O_SBUF},
	    {"staging-size", required_argument, NULL, O_SSIZE},
	    {"alloc-max", required_argument, NULL, O_ALLOCMAX},
	    {"allow-uid", required_argument, NULL, O_UID},
	    {"allow-gid", required_argument, NULL, O_GID},
	    {"tls-cert", required_argument, NULL, O_TLS_CERT},
	    {"tls-key", required_argument, NULL, O_TLS_KEY},
	    {"tls-ca", required_argument, NULL, O_TLS_CA},
	    {"ctx", required_argument, NULL, O_CTX},
	    {"seqs", required_argument, NULL, O_SEQS},
	    {"threads", required_argument, NULL, O_THREADS},
	    {"postfetch", required_argument, NULL, O_POSTFETCH},
	    {"expert-cache-mb", required_argument, NULL, O_CACHE_MB},
	    {"n-cpu-moe", required_argument, NULL, O_N_CPU_MOE},
	    {"cpu-moe", no_argument, NULL, O_CPU_MOE},
	    {"dense-on-device", no_argument, NULL, O_DENSE},
	    {"metrics", required_argument, NULL, O_METRICS},
	    {"log-format", required_argument, NULL, O_LOG_FORMAT},
	    {"verbose", no_argument, NULL, 'v'},
	    {"help", no_argument, NULL, 'h'},
	    {"version", no_argument, NULL, O_VERSION},
	    {0},
	};
	int c, rc;
	uint64_t v;
	while ((c = getopt_long(argc, argv, "vh", lo, NULL)) != -1) {
		switch (c) {
		case O_DEVICE:
			o->device = optarg;
			break;
		case O_ID:
			o->id = optarg;
			break;
		case O_ENDPOINT:
			o->endpoint = optarg;
			break;
		case O_AGENT:
			o->agent = optarg;
			break;
		case O_TLS_CERT:
			o->tls.cert_file = optarg;
			break;
		case O_TLS_KEY:
			o->tls.key_file = optarg;
			break;
		case O_TLS_CA:
			o->tls.ca_file = optarg;
			break;
		case O_FLOOR:
			o->floor_dir = optarg;
			break;
		case O_METRICS: {
			struct sockaddr_storage ss;
			socklen_t sl;
			struct wf_diag md = {{0}};
			if ((rc = wf_http_addr_parse(optarg, &ss, &sl, &md)) < 0) {
				fprintf(stderr, "wf-worker: --metrics: %s\n", wf_diag_str(&md, rc));
				return 2;
			}
			o->metrics = optarg;
			break;
		}
		case O_MODEL:
			if (!strchr(optarg, '=') || optarg[0] == '=') {
				fprintf(stderr, "wf-worker: --model takes NAME=PATH, not '%s'\n",
				        optarg);
				return 2;
			}
			if ((rc = add_name("--model", optarg, o->models, &o->n_models)))
				return rc;
			break;
		case O_PIN:
			if ((rc = add_name("--pin", optarg, o->pins, &o->n_pins)))
				return rc;
			break;
		case O_PREFETCH:
			if ((rc = add_name("--prefetch", optarg, o->prefetch, &o->n_prefetch)))
				return rc;
			break;
		case O_MODE:
			if (strcmp(optarg, "self") && strcmp(optarg, "external")) {
				fprintf(stderr, "wf-worker: --mode must be self or external\n");
				return 2;
			}
			o->mode = optarg;
			break;
		case O_ARENA:
			if ((rc = parse_size_flag("--arena", optarg, &o->arena)))
				return rc;
			break;
		case O_SCRATCH:
			if ((rc = parse_size_flag("--max-scratch", optarg, &o->max_scratch)))
				return rc;
			break;
		case O_SSIZE:
			if ((rc = parse_size_flag("--staging-size", optarg, &o->staging_size)))
				return rc;
			break;
		case O_ALLOCMAX:
			if ((rc = parse_size_flag("--alloc-max", optarg, &o->alloc_max)))
				return rc;
			break;
		case O_FRACTION:
			if ((rc = parse_fraction("--weight-fraction", optarg, &o->weight_fraction)))
				return rc;
			break;
		case O_WIGGLE:
			if ((rc = parse_fraction("--wiggle", optarg, &o->wiggle)))
				return rc;
			break;
		case O_LOADMODE:
			if (strcmp(optarg, "auto") && strcmp(optarg, "staged") &&
			    strcmp(optarg, "direct")) {
				fprintf(stderr,
				        "wf-worker: --load-mode must be auto, staged or direct\n");
				return 2;
			}
			o->load_mode = optarg;
			break;
		case O_SBUF:
			if ((rc = parse_uint_flag("--staging-buffers", optarg, 2, 256, &v)))
				return rc;
			o->staging_buffers = (unsigned)v;
			break;
		case O_UID:
			if (o->n_uids == 64) {
				fprintf(stderr, "wf-worker: --allow-uid: at most 64\n");
				return 2;
			}
			if ((rc = parse_uint_flag("--allow-uid", optarg, 0, UINT32_MAX - 1, &v)))
				return rc;
			o->uids[o->n_uids++] = (uid_t)v;
			break;
		case O_GID:
			if (o->n_gids == 64) {
				fprintf(stderr, "wf-worker: --allow-gid: at most 64\n");
				return 2;
			}
			if ((rc = parse_gid_flag(optarg, &o->gids[o->n_gids])))
				return rc;
			o->n_gids++;
			break;
		case O_CTX:
			if ((rc = parse_uint_flag("--ctx", optarg, 1, 1u << 20, &v)))
				return rc;
			o->completion.n_ctx = (uint32_t)v;
			break;
		case O_SEQS:
			if ((rc = parse_uint_flag("--seqs", optarg, 1, 256, &v)))
				return rc;
			o->completion.n_seq = (uint32_t)v;
			break;
		case O_THREADS:
			if ((rc = parse_uint_flag("--threads", optarg, 1, 256, &v)))
				return rc;
			o->completion.n_threads = (uint32_t)v;
			break;
		case O_POSTFETCH: {
			const char *eq = strchr(optarg, '=');
			char name[64];
			struct wf_diag d = {{0}};
			if (!eq || eq == optarg || (size_t)(eq - optarg) >= sizeof name) {
				fprintf(stderr,
				        "wf-worker: --postfetch takes NAME=VALUE, not '%s'\n",
				        optarg);
				return 2;
			}
			snprintf(name, sizeof name, "%.*s", (int)(eq - optarg), optarg);
			if ((rc = wf_postfetch_settings_set(&o->postfetch, name, eq + 1, &d)) < 0) {
				fprintf(stderr, "wf-worker: --postfetch %s: %s\n", optarg,
				        wf_diag_str(&d, rc));
				return 2;
			}
			o->postfetch_asked = true;
			break;
		}
		case O_CACHE_MB:
			if ((rc = parse_uint_flag("--expert-cache-mb", optarg, 0, UINT32_MAX, &v)))
				return rc;
			o->expert_cache_mb = (uint32_t)v;
			o->postfetch_asked = o->postfetch_asked || v > 0;
			break;
		case O_N_CPU_MOE:
			if ((rc = parse_uint_flag("--n-cpu-moe", optarg, 0, UINT32_MAX, &v)))
				return rc;
			o->n_cpu_moe = (uint32_t)v;
			o->experts_on_device = true;
			o->postfetch_asked = true;
			break;
		case O_CPU_MOE:
			o->experts_on_device = false;
			break;
		case O_DENSE:
			o->dense_on_device = true;
			o->postfetch_asked = true;
			break;
		case O_LOG_FORMAT: {
			enum wf_log_format f;
			if (wf_log_format_parse(optarg, &f) < 0) {
				fprintf(stderr,
				        "wf-worker: --log-format must be text or json, not '%s'\n",
				        optarg);
				return 2;
			}
			o->log_format = (int)f;
			break;
		}
		case 'v':
			o->verbose = true;
			break;
		case 'h':
			usage(stdout);
			exit(0);
		case O_VERSION:
			printf("wf-worker %s\n", WF_VERSION);
			exit(0);
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "wf-worker: unexpected argument '%s'\n", argv[optind]);
		return 2;
	}
	return 0;
}

/* ---- cache events: the log, the metrics and the agent ---------------------------------------- */

/* This worker's id, for the fields of its event lines; set once, before any thread logs. */
static const char *log_worker;

/* Where the cache's events go besides the log; both set before the cache is created. */
struct cache_events {
	struct wf_agentlink *link;
	struct wf_worker_metrics *metrics; /* with --metrics: loads counted from cache events */
};

static void on_cache_event(void *ctx, const struct wf_cache_event *ev)
{
	struct cache_events *ce = ctx;
	wf_worker_metrics_cache_event(ce->metrics, ev);
	wf_agentlink_cache_event(ce->link, ev);
	switch (ev->type) {
	case WF_CACHE_EVENT_RESIDENCY:
		wf_log_event(
		    WF_LOG_INFO,
		    WF_LOG_F(.worker = log_worker, .model = ev->name, .event = "residency"), "%s%s",
		    wf_residency_name(ev->state),
		    ev->over_budget ? " (larger than the whole budget: loaded after evicting "
		                      "everything else)"
		                    : "");
		break;
	case WF_CACHE_EVENT_LOAD_FAILED:
		wf_log_event(WF_LOG_ERROR,
		             WF_LOG_F(.worker = log_worker, .model = ev->name,
		                      .event = "load_failed", .code = ev->error),
		             "load failed: %s", ev->msg ? ev->msg : wf_strerror(ev->error));
		break;
	case WF_CACHE_EVENT_EVICTED:
		wf_log_event(WF_LOG_INFO,
		             WF_LOG_F(.worker = log_worker, .model = ev->name, .event = "evicted"),
		             "evicted (%s)", ev->msg ? ev->msg : "command");
		break;
	default:
		break;
	}
}

/* ---- The device's health -------------------------------------------------------------------- */

/* A device that hit a sticky error (CUDA: an illegal address, a launch failure) fails every call
 * until the process restarts, so a worker that went on would answer every request with an error
 * while its probes stayed green. A thread polls wf_device_health() (cheap, non-blocking); when
 * the device is lost, /readyz turns red with the reason, and the main thread is woken (SIGTERM)
 * to drain and exit with WF_WORKER_EXIT_DEVICE_LOST, for its supervisor to restart it
 * (wf-worker@.service: Restart=on-failure). The drain waits until /readyz has answered red once
 * (a load balancer that polls it has learnt), at most DEVICE_LOST_DRAIN_MS, and not at all
 * without --metrics; then the usual shutdown finishes the requests in flight. */
#define DEVICE_POLL_MS             250
#define DEVICE_LOST_DRAIN_MS       10000
#define WF_WORKER_EXIT_DEVICE_LOST 3

struct devwatch {
	struct wf_device *dev;
	atomic_bool lost;
	char why[WF_DIAG_MAX]; /* written before lost is set */
	atomic_int red_served; /* /readyz answers since the loss */
	bool stop;             /* under mu */
	bool running;
	pthread_t thread;
	pthread_mutex_t mu;
	pthread_cond_t cv;
};

static void *devwatch_main(void *arg)
{
	struct devwatch *w = arg;
	pthread_mutex_lock(&w->mu);
	while (!w->stop) {
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_nsec += DEVICE_POLL_MS * 1000000L;
		ts.tv_sec += ts.tv_nsec / 1000000000L;
		ts.tv_nsec %= 1000000000L;
		pthread_cond_timedwait(&w->cv, &w->mu, &ts);
		if (w->stop)
			break;
		struct wf_diag d = {{0}};
		int rc = wf_device_health(w->dev, &d);
		if (rc == 0)
			continue;
		snprintf(w->why, sizeof w->why, "%s", wf_diag_str(&d, rc));
		atomic_store(&w->lost, true);
		wf_log_event(
		    WF_LOG_ERROR, WF_LOG_F(.worker = log_worker, .event = "device_lost"),
		    "device %s lost: %s; /readyz is red, exiting (status %d) for a restart",
		    wf_device_name(w->dev), w->why, WF_WORKER_EXIT_DEVICE_LOST);
		kill(getpid(), SIGTERM); /* main's sigwait */
		break;
	}
	pthread_mutex_unlock(&w->mu);
	return NULL;
}

static void devwatch_stop(struct devwatch *w)
{
	if (!w->running)
		return;
	pthread_mutex_lock(&w->mu);
	w->stop = true;
	pthread_cond_broadcast(&w->cv);
	pthread_mutex_unlock(&w->mu);
	pthread_join(w->thread, NULL);
	w->running = false;
}

/* The agent refused this worker for good (worker/agentlink.h): main's sigwait takes it. */
static void on_refused(void *ctx)
{
	(void)ctx;
	kill(getpid(), SIGTERM);
}

/* ---- /healthz and /readyz ------------------------------------------------------------------ */

struct probes {
	struct wf_agentlink *link; /* set before the HTTP endpoint starts */
	struct devwatch *dw;
	atomic_bool serving; /* the control endpoint listens */
};

/* Ready: serving, and registered with the agent when there is one (a worker the agent does not
 * know is unreachable through it and cannot have floors ensured). */
static bool worker_ready(void *ctx, char *reason, size_t len)
{
	struct probes *p = ctx;
	if (atomic_load(&p->dw->lost)) {
		snprintf(reason, len, "device lost: %s", p->dw->why);
		atomic_fetch_add(&p->dw->red_served, 1);
		return false;
	}
	if (!atomic_load(&p->serving)) {
		snprintf(reason, len, "starting: the control endpoint is not serving yet");
		return false;
	}
	if (wf_agentlink_started(p->link) && !wf_agentlink_registered(p->link)) {
		snprintf(reason, len, "not registered with the agent");
		return false;
	}
	return true;
}

/* Live: the registration loop turns (every WF_AGENTLINK_HEARTBEAT_MS, each call bounded by
 * 3 s). */
static bool worker_live(void *ctx, char *reason, size_t len)
{
	struct probes *p = ctx;
	if (!wf_agentlink_started(p->link))
		return true;
	int64_t age = wf_agentlink_beat_age_ms(p->link);
	if (age > 12 * WF_AGENTLINK_HEARTBEAT_MS) {
		snprintf(reason, len, "the registration loop has not turned for %lld ms",
		         (long long)age);
		return false;
	}
	return true;
}

/* One line per failed request (id, client, kind, model) and one per completion started (its id
 * next to the request's, so the "completion N done" line can be traced to the request). */
static int handle_logged(void *ctx, const Weightfloor__V1__Request *req,
                         Weightfloor__V1__Reply *reply, struct wf_ctl_call *call)
{
	int rv = wf_worker_svc_handle(ctx, req, reply, call);
	Weightfloor__V1__Status st = rv < 0 ? wf_proto_status_from_err(rv) : reply->code;
	struct wf_proto_request_desc rd;
	wf_proto_request_describe(req, &rd);
	if (rv < 0 || st != WEIGHTFLOOR__V1__STATUS__STATUS_OK) {
		wf_log_event(
		    st == WEIGHTFLOOR__V1__STATUS__STATUS_INTERNAL ? WF_LOG_ERROR : WF_LOG_INFO,
		    WF_LOG_F(.worker = log_worker, .model = rd.model, .request_id = req->request_id,
		             .client = req->client, .event = "request_failed",
		             .code = rv < 0 ? rv : wf_proto_status_to_err(st)),
		    "%s: %s: %s", rd.kind, wf_proto_status_name(st),
		    reply->message && *reply->message ? reply->message : wf_strerror(rv));
	} else if (req->body_case == WEIGHTFLOOR__V1__REQUEST__BODY_GENERATE &&
	           reply->body_case == WEIGHTFLOOR__V1__REPLY__BODY_GENERATE && reply->generate) {
		wf_log_event(WF_LOG_INFO,
		             WF_LOG_F(.worker = log_worker, .model = rd.model,
		                      .request_id = req->request_id, .client = req->client,
		                      .completion = reply->generate->completion_id,
		                      .event = "completion_started"),
		             "completion %" PRIu64 " started", reply->generate->completion_id);
	}
	return rv;
}

/* The control library's lines (listener replaced, peers turned away) into the worker's log. */
static void log_ctl(void *arg, int level, const char *line)
{
	(void)arg;
	wf_log((enum wf_log_level)level, "%s", line);
}

/* `wf-worker tokenize --model FILE [--no-special] [--parse-special] TEXT`: the model's tokenizer
 * offline (no agent, no device), printing the ids comma-separated as the last line so that any
 * engine's tokenizer can be compared with llama.cpp's. */
static int cmd_tokenize(int argc, char **argv)
{
	const char *model_path = NULL, *text = NULL;
	bool add_special = true, parse_special = false;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--model") == 0 && i + 1 < argc)
			model_path = argv[++i];
		else if (strcmp(argv[i], "--no-special") == 0)
			add_special = false;
		else if (strcmp(argv[i], "--parse-special") == 0)
			parse_special = true;
		else if (strcmp(argv[i], "--") == 0 && i + 1 < argc && !text)
			text = argv[++i];
		else if (argv[i][0] != '-' && !text)
			text = argv[i];
		else {
			fprintf(stderr, "usage: wf-worker tokenize --model FILE [--no-special] "
			                "[--parse-special] TEXT\n");
			return 2;
		}
	}
	if (!model_path || !text) {
		fprintf(stderr, "usage: wf-worker tokenize --model FILE [--no-special] "
		                "[--parse-special] TEXT\n");
		return 2;
	}
	struct wf_diag d = {{0}};
	struct wf_model *m = NULL;
	struct wf_tokenizer *tok = NULL;
	int32_t *ids = NULL;
	size_t n = 0;
	int rc = wf_model_open(model_path, &m, &d);
	if (rc == 0)
		rc = wf_tokenizer_create(&m->kv, &tok, &d);
	if (rc == 0)
		rc = wf_tokenizer_encode(tok, text, strlen(text), add_special, parse_special, &ids,
		                         &n, &d);
	if (rc < 0) {
		fprintf(stderr, "wf-worker tokenize: %s: %s\n", model_path, wf_diag_str(&d, rc));
	} else {
		for (size_t i = 0; i < n; i++)
			printf("%s%d", i ? "," : "", ids[i]);
		printf("\n");
	}
	free(ids);
	wf_tokenizer_destroy(tok);
	wf_model_close(m);
	return rc < 0 ? 1 : 0;
}

int main(int argc, char **argv)
{
	if (argc > 1 && strcmp(argv[1], "tokenize") == 0)
		return cmd_tokenize(argc - 1, argv + 1);
	if (argc > 1 && strcmp(argv[1], "eval") == 0) {
#ifdef WF_HAVE_CUDA
		wf_device_backend_register(wf_cuda_device_ops());
		wf_cuda_backend_register();
#endif
		return wf_worker_eval_main(argc - 1, argv + 1);
	}
	if (argc > 1 && strcmp(argv[1], "perplexity") == 0)
		return wf_worker_perplexity_main(argc - 1, argv + 1);
	struct opts o = {.device = "auto",
	                 .agent = "ipc:///run/weightfloor/agent.sock",
	                 .floor_dir = "/dev/shm/weightfloor",
	                 .mode = "self",
	                 .load_mode = "auto",
	                 .weight_fraction = -1,
	                 .wiggle = -1,
	                 .log_format = -1};
	/* Post-fetch: the defaults, the WF_POSTFETCH_* variables over them, the flags over those.
	 */
	wf_postfetch_settings_default(&o.postfetch);
	{
		struct wf_diag pd = {{0}};
		int prc = wf_postfetch_settings_from_env(&o.postfetch, &pd);
		if (prc < 0) {
			fprintf(stderr, "wf-worker: %s\n", wf_diag_str(&pd, prc));
			return 2;
		}
		for (char **e = environ; e && *e; e++)
			o.postfetch_asked |= strncmp(*e, "WF_POSTFETCH_", 13) == 0;
	}
	int rc = parse_args(argc, argv, &o);
	if (rc)
		return rc;
	if (o.expert_cache_mb && (!o.postfetch.enable || o.postfetch.force_cpu)) {
		fprintf(stderr, "wf-worker: --expert-cache-mb needs post-fetch (its miss path): "
		                "not with enable=0 or force_cpu=1\n");
		return 2;
	}
	wf_log_init("wf-worker", o.verbose ? WF_LOG_DEBUG : WF_LOG_INFO);
	if (o.log_format >= 0)
		wf_log_set_format((enum wf_log_format)o.log_format);

	sigset_t sigs;
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGINT);
	sigaddset(&sigs, SIGTERM);
	sigaddset(&sigs, SIGHUP);
	pthread_sigmask(SIG_BLOCK, &sigs, NULL);
	signal(SIGPIPE, SIG_IGN);

#ifdef WF_HAVE_CUDA
	wf_device_backend_register(wf_cuda_device_ops());
	wf_cuda_backend_register();
#endif
	int exit_code = 1;
	struct wf_diag d = {{0}};
	struct wf_device *dev = NULL;
	struct wf_cache *cache = NULL;
	struct wf_ctl_server *srv = NULL;
	struct wf_worker_svc svc;
	struct wf_agentlink *link = NULL;
	struct wf_completions *completions = NULL;
	static struct cache_events events;
	struct wf_worker_metrics *metrics = NULL;
	struct wf_http_server *http = NULL;
	static struct probes probes;
	struct wf_worker_refresh *refresh = NULL;
	static struct devwatch dw = {.mu = PTHREAD_MUTEX_INITIALIZER};
	probes.dw = &dw;
	char id[64], endpoint[512];
	wf_worker_svc_init(&svc);
	/* Before the cache (its events are queued for the agent from the first) and the probes. */
	if ((rc = wf_agentlink_create(&svc, on_refused, NULL, &link)) < 0) {
		wf_log_error("agent link: %s", wf_strerror(rc));
		goto out;
	}
	events.link = link;
	probes.link = link;

	/* The HTTP endpoint first, not ready, so that probes answer while the device opens. */
	if (o.metrics) {
		if ((rc = wf_worker_metrics_create(&metrics)) < 0) {
			wf_log_error("metrics: %s", wf_strerror(rc));
			goto out;
		}
		events.metrics = metrics;
		struct wf_http_opts ho = {.addr = o.metrics,
		                          .metrics = wf_worker_metrics_registry(metrics),
		                          .live = worker_live,
		                          .ready = worker_ready,
		                          .ctx = &probes};
		if ((rc = wf_http_server_start(&ho, &http, &d)) < 0) {
			wf_log_error("--metrics %s: %s", o.metrics, wf_diag_str(&d, rc));
			goto out;
		}
		wf_log_info("metrics and health on http://%s (port %u)", o.metrics,
		            (unsigned)wf_http_server_port(http));
	}
	if ((rc = wf_device_open(o.device, &dev, &d)) < 0) {
		wf_log_error("device %s: %s", o.device, wf_diag_str(&d, rc));
		goto out;
	}
	wf_log_info("device %s (%s)", wf_device_name(dev), wf_device_selection(dev));
	dw.dev = dev;
	{
		/* The condition variable waits on CLOCK_MONOTONIC, as devwatch_main's deadline. */
		pthread_condattr_t ca;
		pthread_condattr_init(&ca);
		pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
		pthread_cond_init(&dw.cv, &ca);
		pthread_condattr_destroy(&ca);
	}
	dw.running = pthread_create(&dw.thread, NULL, devwatch_main, &dw) == 0;
	if (o.id)
		snprintf(id, sizeof id, "%s", o.id);
	else
		snprintf(id, sizeof id, "%s-%d",
		         wf_device_kind(dev) == WF_DEVICE_KIND_HOST ? "host" : "gpu",
		         (int)getpid());
	if (o.endpoint)
		snprintf(endpoint, sizeof endpoint, "%s", o.endpoint);
	else
		snprintf(endpoint, sizeof endpoint, "ipc:///run/weightfloor/worker-%s.sock", id);

	struct wf_cache_budget budget = {
	    .arena = o.arena,
	    .weight_fraction =
	        o.weight_fraction >= 0 ? o.weight_fraction : WF_DEVBUDGET_FRACTION_DEFAULT,
	    .wiggle_fraction = o.wiggle >= 0 ? o.wiggle : WF_DEVBUDGET_WIGGLE_DEFAULT,
	    .max_scratch = o.max_scratch,
	};
	struct wf_shm_config shm = {.dir = o.floor_dir};
	struct wf_cache_opts co = {
	    .mode = strcmp(o.mode, "external") == 0 ? WF_CACHE_EXTERNAL : WF_CACHE_SELF_MANAGED,
	    .budget = &budget,
	    .shm = &shm,
	    .stage = {.n_buffers = o.staging_buffers, .buffer_size = o.staging_size},
	    .load_mode = strcmp(o.load_mode, "staged") == 0   ? WF_STAGE_MODE_STAGED
	                 : strcmp(o.load_mode, "direct") == 0 ? WF_STAGE_MODE_DIRECT
	                                                      : WF_STAGE_MODE_AUTO,
	    .alloc_max = o.alloc_max,
	    .event = on_cache_event,
	    .event_ctx = &events,
	};
	if ((rc = wf_cache_create(dev, &co, &cache, &d)) < 0) {
		wf_log_error("device cache: %s", wf_diag_str(&d, rc));
		goto out;
	}
	svc.worker_id = id;
	log_worker = id;
	svc.endpoint = endpoint;
	svc.dev = dev;
	svc.cache = cache;
	svc.shm = &shm;
	for (size_t i = 0; i < o.n_models; i++) {
		char name[256];
		const char *eq = strchr(o.models[i], '=');
		snprintf(name, sizeof name, "%.*s", (int)(eq - o.models[i]), o.models[i]);
		if ((rc = wf_worker_svc_declare(&svc, name, eq + 1, &d)) < 0) {
			wf_log_error("--model %s: %s", o.models[i], wf_diag_str(&d, rc));
			goto out;
		}
	}
	if (strcmp(o.agent, "none") != 0) {
		struct wf_ctl_client_opts ao = {
		    .client_name = id, .wait_for_server = true, .tls = o.tls};
		if ((rc = wf_ctl_client_open(o.agent, 10000, &ao, &svc.agent, &d)) < 0) {
			wf_log_error("agent %s: %s", o.agent, wf_diag_str(&d, rc));
			goto out;
		}
	}

	/* Completion engines and the worker's device. A GPU runs them (the device forward pass:
	 * dense weights and the KV cache on it, experts resident, post-fetched, cached or on the
	 * CPU as the flags say). On the host device post-fetch only models a GPU's copies (the
	 * same CPU computes either way, after waiting for them), so engines use it only when
	 * asked; otherwise they are CPU engines reading the floor. */
	if (wf_device_kind(dev) != WF_DEVICE_KIND_HOST || o.postfetch_asked) {
		o.completion.device = dev;
		o.completion.postfetch = &o.postfetch;
		o.completion.expert_cache_mb = o.expert_cache_mb;
		o.completion.experts_on_device = o.experts_on_device;
		o.completion.n_cpu_moe = o.n_cpu_moe;
		o.completion.dense_on_device = o.dense_on_device;
		wf_log_info("completions: engines on %s%s (expert post-fetch %s, block_on_miss %d, "
		            "expert cache %u MiB, %s)",
		            wf_device_name(dev),
		            wf_device_kind(dev) != WF_DEVICE_KIND_HOST || o.dense_on_device
		                ? ""
		                : " for experts only",
		            o.postfetch.enable && !o.postfetch.force_cpu ? "on" : "off",
		            (int)o.postfetch.block_on_miss, o.expert_cache_mb,
		            o.experts_on_device ? "resident experts from --n-cpu-moe"
		                                : "experts host-side");
	}
	if ((rc = wf_completion_create(&svc, &o.completion, &completions)) < 0) {
		wf_log_error("completions: %s", wf_strerror(rc));
		goto out;
	}
	if ((rc = wf_evaluate_serve(&svc, completions)) < 0) {
		wf_log_error("evaluations: %s", wf_strerror(rc));
		goto out;
	}
	struct wf_ctl_server_opts so = {
	    /* Long polls (GenerateRead) hold a thread each while they wait. */
	    .nworkers = 32,
	    .listen = {.url = endpoint,
	               .allowed_uids = o.uids,
	               .n_allowed_uids = o.n_uids,
	               .allowed_gids = o.gids,
	               .n_allowed_gids = o.n_gids,
	               .log = log_ctl,
	               .tls = o.tls},
	    .handle = metrics ? wf_worker_metrics_handle : handle_logged,
	    .ctx = metrics ? (void *)metrics : (void *)&svc,
	};
	if (metrics) {
		wf_worker_metrics_wrap(metrics, handle_logged, &svc);
		wf_worker_metrics_bind(metrics, &svc, completions);
	}
	if ((rc = wf_ctl_ipc_dir_ensure(endpoint, (gid_t)-1)) < 0) {
		wf_log_error("endpoint directory for %s: %s", endpoint, wf_strerror(rc));
		goto out;
	}
	if ((rc = wf_ctl_server_create(&so, &srv, &d)) < 0) {
		wf_log_error("endpoint %s: %s", endpoint, wf_diag_str(&d, rc));
		goto out;
	}
	if ((rc = wf_ctl_server_start(srv)) < 0) {
		wf_log_error("server threads: %s", wf_strerror(rc));
		goto out;
	}
	wf_log_info("worker '%s' serving %s (%s mode)", id, wf_ctl_server_url(srv),
	            wf_cache_mode_name(co.mode));
	/* Type=notify (wf-worker@.service): up once the endpoint answers. Models named by --pin
	 * and --prefetch load afterwards, so a large one cannot run past the start timeout. */
	wf_sd_notify("READY=1");
	if (svc.agent) {
		if ((rc = wf_agentlink_start(link)) < 0)
			wf_log_error("agent link threads: %s; not registering with the agent",
			             wf_strerror(rc));
		if ((rc = wf_worker_refresh_create(svc.agent, &o.tls, &svc, &refresh)) < 0)
			wf_log_error("agent events: %s", wf_strerror(rc));
		wf_evaluate_set_refresh(refresh);
	}
	atomic_store(&probes.serving, true);
	if (http)
		wf_http_server_set_ready(http, true, NULL);
	for (size_t i = 0; i < o.n_pins + o.n_prefetch; i++) {
		bool pin = i < o.n_pins;
		const char *name = pin ? o.pins[i] : o.prefetch[i - o.n_pins];
		uint32_t mid;
		wf_diag_clear(&d);
		rc = wf_worker_svc_resolve(&svc, name, WF_WORKER_AGENT_MAX_MS, true, &mid, &d);
		if (rc == 0)
			rc = pin ? wf_cache_pin(cache, mid, &d)
			         : wf_cache_prefetch(cache, mid, true, &d);
		if (rc < 0)
			wf_log_error("%s %s: %s", pin ? "--pin" : "--prefetch", name,
			             wf_diag_str(&d, rc));
	}

	for (;;) {
		int sig = 0;
		if (sigwait(&sigs, &sig) != 0 || sig == SIGHUP)
			continue;
		if (!wf_agentlink_refused(link) && !atomic_load(&dw.lost))
			wf_log_info("signal %d: stopping", sig);
		break;
	}
	wf_sd_notify("STOPPING=1");
	exit_code = wf_agentlink_refused(link) ? 1 : 0;
	if (atomic_load(&dw.lost)) {
		/* /readyz is red already (worker_ready): let a probe see it, briefly. */
		for (int waited = 0;
		     http && atomic_load(&dw.red_served) == 0 && waited < DEVICE_LOST_DRAIN_MS;
		     waited += 50)
			usleep(50 * 1000);
		exit_code = WF_WORKER_EXIT_DEVICE_LOST;
	}
	if (http)
		wf_http_server_set_ready(http, false,
		                         atomic_load(&dw.lost) ? "device lost" : "stopping");
out:
	devwatch_stop(&dw);
	wf_agentlink_stop(link);
	/* The endpoint's collector reads the cache and the engines: it goes before them. */
	wf_http_server_destroy(http);
	/* Wakes the long polls, so the server stops at once. */
	wf_completion_close(completions);
	if (srv) {
		wf_ctl_server_close(srv);
		wf_ctl_server_stop(srv);
	}
	wf_ctl_server_destroy(srv);
	/* The cache's manager first: it calls into the engines when it evicts one, so it must be
	 * gone before they are. */
	wf_cache_close(cache);
	wf_cache_stop(cache);
	wf_completion_destroy(completions);
	wf_cache_destroy(cache);
	wf_evaluate_set_refresh(NULL);
	wf_worker_refresh_destroy(refresh); /* its ear uses the agent client */
	wf_agentlink_destroy(link);         /* after the cache: its events go to the link */
	wf_ctl_client_close(svc.agent);
	wf_worker_svc_fini(&svc);
	wf_device_close(dev);
	wf_worker_metrics_destroy(metrics);
	return exit_code;
}
