/* The echo handler of ctl_test.h, kept free of Criterion so that the fuzz target can use it. */
#include "tests/control/ctl_test.h"

#include "base/error.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define RB(name) WEIGHTFLOOR__V1__REQUEST__BODY_##name
#define PB(name) WEIGHTFLOOR__V1__REPLY__BODY_##name

int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void sleep_ms(int ms)
{
	struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000};
	nanosleep(&ts, NULL);
}

/* ---- echo bodies --------------------------------------------------------------------------- */

#define NEW(call, type) ((type *)wf_ctl_call_alloc(call, sizeof(type)))

static Weightfloor__V1__ModelInfo *model_info(struct wf_ctl_call *call, const char *name,
                                              Weightfloor__V1__FloorState state)
{
	Weightfloor__V1__ModelInfo *mi = NEW(call, Weightfloor__V1__ModelInfo);
	if (!mi)
		return NULL;
	weightfloor__v1__model_info__init(mi);
	mi->name = wf_ctl_call_strdup(call, name);
	mi->floor_state = state;
	mi->digest_hex = "00112233445566778899aabbccddeeff";
	mi->format = "gguf";
	mi->arch = "llama";
	mi->total_bytes = 3ull << 32;
	mi->dense_bytes = 1ull << 32;
	mi->expert_bytes = 2ull << 32;
	mi->tensor_count = 291;
	mi->holder_count = 2;
	mi->n_holder_pids = 2;
	mi->holder_pids = wf_ctl_call_calloc(call, 2, sizeof(uint32_t));
	if (!mi->holder_pids)
		return NULL;
	mi->holder_pids[0] = 100;
	mi->holder_pids[1] = 200;
	mi->last_used_unix_ms = 1700000000123;
	return mi;
}

static Weightfloor__V1__ModelResidency *residency(struct wf_ctl_call *call, const char *model,
                                                  Weightfloor__V1__Residency state,
                                                  const char *worker)
{
	Weightfloor__V1__ModelResidency *r = NEW(call, Weightfloor__V1__ModelResidency);
	if (!r)
		return NULL;
	weightfloor__v1__model_residency__init(r);
	r->model = wf_ctl_call_strdup(call, model);
	r->state = state;
	r->worker_id = wf_ctl_call_strdup(call, worker);
	return r;
}

static Weightfloor__V1__WorkerInfo *worker_info(struct wf_ctl_call *call, const char *id)
{
	Weightfloor__V1__WorkerInfo *w = NEW(call, Weightfloor__V1__WorkerInfo);
	if (!w)
		return NULL;
	weightfloor__v1__worker_info__init(w);
	w->worker_id = wf_ctl_call_strdup(call, id);
	return w;
}

static int special(const char *name, Weightfloor__V1__Reply *reply, struct wf_ctl_call *call,
                   struct echo_state *st, bool *ret_done)
{
	*ret_done = true;
	if (strncmp(name, "slow:", 5) == 0) {
		int ms = atoi(name + 5);
		int64_t end = now_ms() + ms;
		while (now_ms() < end && !wf_ctl_call_closing(call))
			sleep_ms(5);
		*ret_done = false;
		return 0;
	}
	if (strcmp(name, "block") == 0) {
		atomic_store(&st->entered_block, 1);
		int64_t end = now_ms() + 10000;
		while (now_ms() < end && !wf_ctl_call_closing(call))
			sleep_ms(5);
		reply->message = "server shutting down";
		return WF_EUNAVAILABLE;
	}
	if (strcmp(name, "missing") == 0) {
		reply->message = wf_ctl_call_printf(call, "model '%s' is not registered", name);
		return WF_ENOT_FOUND;
	}
	if (strcmp(name, "huge") == 0) {
		Weightfloor__V1__ModelInfo *mi = model_info(call, name, 0);
		size_t n = 2u << 20;
		char *s = wf_ctl_call_alloc(call, n + 1);
		if (!mi || !s)
			return -ENOMEM;
		memset(s, 'x', n);
		mi->last_error = s;
		reply->body_case = PB(MODEL_INFO);
		reply->model_info = mi;
		return 0;
	}
	if (strcmp(name, "bad-status") == 0) {
		reply->code = (Weightfloor__V1__Status)99;
		return 0;
	}
	if (strcmp(name, "positive") == 0)
		return 5;
	if (strcmp(name, "set-code") == 0) {
		reply->code = ST(NOT_RESIDENT);
		reply->message = "not on the device";
		reply->body_case = PB(MODEL_INFO);
		reply->model_info = model_info(call, name, 0);
		return 0;
	}
	*ret_done = false;
	return 0;
}

int echo_handle(void *ctx, const Weightfloor__V1__Request *req, Weightfloor__V1__Reply *reply,
                struct wf_ctl_call *call)
{
	struct echo_state *st = ctx;
	const struct wf_ctl_peer *peer = wf_ctl_call_peer(call);
	atomic_fetch_add(&st->calls, 1);
	atomic_store(&st->last_uid, peer->uid);
	atomic_store(&st->last_pid, peer->pid);
	atomic_store(&st->last_transport, peer->transport);
	atomic_store(&st->last_tls_verified, peer->tls_verified);

	switch (req->body_case) {
	case RB(REGISTER_MODEL): {
		const Weightfloor__V1__RegisterModel *r = req->register_model;
		Weightfloor__V1__ModelInfo *mi = model_info(call, r->name, 1);
		if (!mi)
			return -ENOMEM;
		mi->n_files = r->n_paths;
		mi->files = wf_ctl_call_calloc(call, r->n_paths, sizeof(*mi->files));
		for (size_t i = 0; i < r->n_paths; i++) {
			Weightfloor__V1__FileInfo *f = NEW(call, Weightfloor__V1__FileInfo);
			if (!f || !mi->files)
				return -ENOMEM;
			weightfloor__v1__file_info__init(f);
			f->path = wf_ctl_call_strdup(call, r->paths[i]);
			f->size_bytes = 1000 + i;
			mi->files[i] = f;
		}
		mi->pin_host = r->pin_host;
		reply->body_case = PB(MODEL_INFO);
		reply->model_info = mi;
		return 0;
	}
	case RB(LIST_MODELS): {
		Weightfloor__V1__ModelList *ml = NEW(call, Weightfloor__V1__ModelList);
		if (!ml)
			return -ENOMEM;
		weightfloor__v1__model_list__init(ml);
		ml->n_models = 2;
		ml->models = wf_ctl_call_calloc(call, 2, sizeof(*ml->models));
		if (!ml->models)
			return -ENOMEM;
		ml->models[0] = model_info(call, "a", 3);
		ml->models[1] = model_info(call, "b", 4);
		reply->body_case = PB(MODEL_LIST);
		reply->model_list = ml;
		return 0;
	}
	case RB(MODEL_STATUS): {
		bool done;
		int rv = special(req->model_status->name, reply, call, st, &done);
		if (done)
			return rv;
		reply->body_case = PB(MODEL_INFO);
		reply->model_info = model_info(call, req->model_status->name, 3);
		return 0;
	}
	case RB(ENSURE_FLOOR): {
		const Weightfloor__V1__EnsureFloor *e = req->ensure_floor;
		Weightfloor__V1__ModelInfo *mi = model_info(call, e->name, e->wait ? 3 : 2);
		Weightfloor__V1__Progress *p = NEW(call, Weightfloor__V1__Progress);
		if (!mi || !p)
			return -ENOMEM;
		weightfloor__v1__progress__init(p);
		p->bytes_total = e->wait_timeout_ms;
		p->bytes_done = 7;
		p->rate_bytes_per_s = 1u << 30;
		mi->progress = p;
		reply->body_case = PB(MODEL_INFO);
		reply->model_info = mi;
		return 0;
	}
	case RB(RELEASE_FLOOR):
		reply->body_case = PB(MODEL_INFO);
		reply->model_info = model_info(call, req->release_floor->name, 1);
		return 0;
	case RB(PIN_HOST):
		reply->body_case = PB(MODEL_INFO);
		reply->model_info = model_info(call, req->pin_host->name, 4);
		return 0;
	case RB(UNPIN_HOST):
		reply->body_case = PB(MODEL_INFO);
		reply->model_info = model_info(call, req->unpin_host->name, 3);
		return 0;
	case RB(AGENT_STATUS): {
		Weightfloor__V1__AgentStatusReply *a = NEW(call, Weightfloor__V1__AgentStatusReply);
		Weightfloor__V1__ModelsSummary *s = NEW(call, Weightfloor__V1__ModelsSummary);
		if (!a || !s)
			return -ENOMEM;
		weightfloor__v1__agent_status_reply__init(a);
		weightfloor__v1__models_summary__init(s);
		a->version = "test-1";
		a->uptime_ms = 12345;
		a->floor_dir = wf_ctl_call_strdup(call, req->client); /* echo the client name */
		a->host_budget_bytes = 64ull << 30;
		a->host_used_bytes = 3ull << 30;
		a->reader_backend = WEIGHTFLOOR__V1__READER_BACKEND__READER_BACKEND_IO_URING;
		a->o_direct = 1;
		s->total = 5;
		s->host = 2;
		s->failed = 1;
		a->models = s;
		a->worker_count = 3;
		a->pid = (uint32_t)getpid();
		reply->body_case = PB(AGENT_STATUS);
		reply->agent_status = a;
		return 0;
	}
	case RB(SET_RESIDENCY): {
		const Weightfloor__V1__SetResidency *r = req->set_residency;
		reply->body_case = PB(RESIDENCY);
		reply->residency = residency(call, r->model, r->target, r->worker_id);
		return 0;
	}
	case RB(PIN):
		reply->body_case = PB(RESIDENCY);
		reply->residency = residency(call, req->pin->model, 4, req->pin->worker_id);
		return 0;
	case RB(UNPIN):
		reply->body_case = PB(RESIDENCY);
		reply->residency = residency(call, req->unpin->model, 3, req->unpin->worker_id);
		return 0;
	case RB(EVICT):
		reply->body_case = PB(RESIDENCY);
		reply->residency = residency(call, req->evict->model, 1, req->evict->worker_id);
		return 0;
	case RB(PREFETCH): {
		const Weightfloor__V1__Prefetch *p = req->prefetch;
		Weightfloor__V1__ModelResidency *r = residency(call, p->model, 3, p->worker_id);
		if (!r)
			return -ENOMEM;
		r->bytes_total = p->n_tensors;
		r->bytes_done = p->n_tensors ? strlen(p->tensors[p->n_tensors - 1]) : 0;
		reply->body_case = PB(RESIDENCY);
		reply->residency = r;
		return 0;
	}
	case RB(COMPACT): {
		const Weightfloor__V1__Compact *c = req->compact;
		Weightfloor__V1__CompactReply *cr = NEW(call, Weightfloor__V1__CompactReply);
		if (!cr)
			return -ENOMEM;
		weightfloor__v1__compact_reply__init(cr);
		cr->n_reloaded = c->n_reload;
		cr->reloaded = c->reload; /* the request outlives the packing of the reply */
		cr->bytes_freed = strlen(c->worker_id);
		reply->body_case = PB(COMPACT);
		reply->compact = cr;
		return 0;
	}
	case RB(WORKER_STATUS):
		reply->body_case = PB(WORKER_INFO);
		reply->worker_info = worker_info(call, req->worker_status->worker_id);
		return 0;
	case RB(REGISTER_WORKER): {
		const Weightfloor__V1__RegisterWorker *r = req->register_worker;
		Weightfloor__V1__WorkerInfo *w =
		    worker_info(call, *r->worker_id ? r->worker_id : "w-assigned");
		if (!w)
			return -ENOMEM;
		w->pid = r->pid;
		w->device_name = wf_ctl_call_strdup(call, r->device_name);
		w->endpoint = wf_ctl_call_strdup(call, r->endpoint);
		w->device_total_bytes = r->device_total_bytes;
		w->device_budget_bytes = r->device_budget_bytes;
		w->pinned_host_budget_bytes = r->pinned_host_budget_bytes;
		w->device_uuid = wf_ctl_call_strdup(call, r->device_uuid);
		w->device_index = r->device_index;
		reply->body_case = PB(WORKER_INFO);
		reply->worker_info = w;
		return 0;
	}
	case RB(LIST_WORKERS): {
		Weightfloor__V1__WorkerList *wl = NEW(call, Weightfloor__V1__WorkerList);
		if (!wl)
			return -ENOMEM;
		weightfloor__v1__worker_list__init(wl);
		wl->n_workers = 1;
		wl->workers = wf_ctl_call_calloc(call, 1, sizeof(*wl->workers));
		if (!wl->workers)
			return -ENOMEM;
		wl->workers[0] = worker_info(call, "gpu0");
		reply->body_case = PB(WORKER_LIST);
		reply->worker_list = wl;
		return 0;
	}
	default:
		return WF_EINTERNAL; /* the server filters unset bodies: unreachable */
	}
}
