#include "agent/service.h"

#include "base/error.h"
#include "proto/status.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define WF_AGENT_VERSION WF_VERSION /* the CMake project version, one source for all */

static Weightfloor__V1__FloorState floor_state_pb(enum wf_floor_state s)
{
	switch (s) {
	case WF_FLOOR_DISK:
		return WEIGHTFLOOR__V1__FLOOR_STATE__FLOOR_STATE_DISK;
	case WF_FLOOR_MATERIALIZING:
		return WEIGHTFLOOR__V1__FLOOR_STATE__FLOOR_STATE_MATERIALIZING;
	case WF_FLOOR_HOST:
		return WEIGHTFLOOR__V1__FLOOR_STATE__FLOOR_STATE_HOST;
	case WF_FLOOR_PINNED_HOST:
		return WEIGHTFLOOR__V1__FLOOR_STATE__FLOOR_STATE_PINNED_HOST;
	case WF_FLOOR_FAILED:
		return WEIGHTFLOOR__V1__FLOOR_STATE__FLOOR_STATE_FAILED;
	}
	return WEIGHTFLOOR__V1__FLOOR_STATE__FLOOR_STATE_UNSPECIFIED;
}

/* Builds a ModelInfo in the call's arena from a snapshot. */
static Weightfloor__V1__ModelInfo *model_info(struct wf_ctl_call *call,
                                              const struct wf_floor_snapshot *s)
{
	Weightfloor__V1__ModelInfo *mi = wf_ctl_call_alloc(call, sizeof(*mi));
	Weightfloor__V1__Progress *pg = wf_ctl_call_alloc(call, sizeof(*pg));
	if (!mi || !pg)
		return NULL;
	weightfloor__v1__model_info__init(mi);
	weightfloor__v1__progress__init(pg);
	mi->name = wf_ctl_call_strdup(call, s->name);
	mi->digest_hex = wf_ctl_call_strdup(call, s->digest_hex);
	mi->format = wf_ctl_call_strdup(call, wf_model_format_name(s->format));
	mi->arch = wf_ctl_call_strdup(call, s->arch);
	mi->last_error = wf_ctl_call_strdup(call, s->last_error);
	if (!mi->name || !mi->digest_hex || !mi->format || !mi->arch || !mi->last_error)
		return NULL;
	mi->files = wf_ctl_call_calloc(call, s->n_files ? s->n_files : 1, sizeof(*mi->files));
	if (!mi->files)
		return NULL;
	for (uint32_t i = 0; i < s->n_files; i++) {
		Weightfloor__V1__FileInfo *fi = wf_ctl_call_alloc(call, sizeof(*fi));
		if (!fi)
			return NULL;
		weightfloor__v1__file_info__init(fi);
		fi->path = wf_ctl_call_strdup(call, s->files[i].path);
		if (!fi->path)
			return NULL;
		fi->size_bytes = s->files[i].size;
		mi->files[i] = fi;
	}
	mi->n_files = s->n_files;
	mi->total_bytes = s->total_bytes;
	mi->dense_bytes = s->dense_bytes;
	mi->expert_bytes = s->expert_bytes;
	mi->tensor_count = s->tensor_count;
	mi->floor_state = floor_state_pb(s->state);
	pg->bytes_done = s->bytes_done;
	pg->bytes_total = s->bytes_total;
	pg->rate_bytes_per_s = s->rate_bytes_per_s;
	pg->started_unix_ms = s->started_unix_ms;
	mi->progress = pg;
	mi->holder_count = s->holder_count;
	if (s->n_holder_pids) {
		mi->holder_pids = wf_ctl_call_calloc(call, s->n_holder_pids, sizeof(uint32_t));
		if (!mi->holder_pids)
			return NULL;
		for (uint32_t i = 0; i < s->n_holder_pids; i++)
			mi->holder_pids[i] = (uint32_t)s->holder_pids[i];
		mi->n_holder_pids = s->n_holder_pids;
	}
	mi->last_used_unix_ms = s->last_used_unix_ms;
	mi->registered_unix_ms = s->registered_unix_ms;
	mi->pin_host = s->pin_host;
	mi->region_present = s->region_present;
	mi->resident_bytes = s->resident_bytes;
	mi->stale = s->stale;
	return mi;
}

/* Replies with the model's current info (after a request that acted on it). */
static int reply_model(struct wf_agent_service *svc, const char *name,
                       Weightfloor__V1__Reply *reply, struct wf_ctl_call *call)
{
	struct wf_floor_snapshot s;
	struct wf_diag d = {{0}};
	int rc = wf_floors_snapshot(svc->floors, name, &s, &d);
	if (rc < 0) {
		reply->message = wf_ctl_call_strdup(call, wf_diag_str(&d, rc));
		return rc;
	}
	Weightfloor__V1__ModelInfo *mi = model_info(call, &s);
	wf_floor_snapshot_fini(&s);
	if (!mi)
		return -ENOMEM;
	reply->body_case = WEIGHTFLOOR__V1__REPLY__BODY_MODEL_INFO;
	reply->model_info = mi;
	return 0;
}

static int fail(Weightfloor__V1__Reply *reply, struct wf_ctl_call *call, int rc,
                const struct wf_diag *d)
{
	reply->message = wf_ctl_call_strdup(call, wf_diag_str(d, rc));
	return rc;
}

static bool call_closing(const void *arg)
{
	return wf_ctl_call_closing(arg);
}

static int do_list(struct wf_agent_service *svc, Weightfloor__V1__Reply *reply,
                   struct wf_ctl_call *call)
{
	struct wf_floor_snapshot *v = NULL;
	size_t n = 0;
	int rc = wf_floors_list(svc->floors, &v, &n);
	if (rc < 0)
		return rc;
	Weightfloor__V1__ModelList *ml = wf_ctl_call_alloc(call, sizeof(*ml));
	Weightfloor__V1__ModelInfo **items = wf_ctl_call_calloc(call, n ? n : 1, sizeof(*items));
	if (!ml || !items)
		rc = -ENOMEM;
	for (size_t i = 0; rc == 0 && i < n; i++) {
		items[i] = model_info(call, &v[i]);
		if (!items[i])
			rc = -ENOMEM;
	}
	for (size_t i = 0; i < n; i++)
		wf_floor_snapshot_fini(&v[i]);
	free(v);
	if (rc < 0)
		return rc;
	weightfloor__v1__model_list__init(ml);
	ml->models = items;
	ml->n_models = n;
	reply->body_case = WEIGHTFLOOR__V1__REPLY__BODY_MODEL_LIST;
	reply->model_list = ml;
	return 0;
}

static int do_status(struct wf_agent_service *svc, Weightfloor__V1__Reply *reply,
                     struct wf_ctl_call *call)
{
	struct wf_floors_status st;
	wf_floors_status(svc->floors, &st);
	Weightfloor__V1__AgentStatusReply *ar = wf_ctl_call_alloc(call, sizeof(*ar));
	Weightfloor__V1__ModelsSummary *ms = wf_ctl_call_alloc(call, sizeof(*ms));
	if (!ar || !ms)
		return -ENOMEM;
	weightfloor__v1__agent_status_reply__init(ar);
	weightfloor__v1__models_summary__init(ms);
	char host[256] = "";
	gethostname(host, sizeof host - 1);
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	int64_t mono = (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
	ar->version = WF_AGENT_VERSION;
	ar->uptime_ms = (uint64_t)(mono - svc->started_mono_ns) / 1000000u;
	ar->floor_dir = wf_ctl_call_strdup(call, svc->cfg->floor_dir);
	ar->hostname = wf_ctl_call_strdup(call, host);
	ar->events_url = wf_ctl_call_strdup(call, svc->cfg->events_url ? svc->cfg->events_url : "");
	if (!ar->floor_dir || !ar->hostname || !ar->events_url)
		return -ENOMEM;
	ar->host_budget_bytes = st.host_budget;
	ar->host_used_bytes = st.host_used;
	ar->reader_backend = strcmp(st.reader_backend, "io_uring") == 0
	                         ? WEIGHTFLOOR__V1__READER_BACKEND__READER_BACKEND_IO_URING
	                         : WEIGHTFLOOR__V1__READER_BACKEND__READER_BACKEND_PREAD;
	ar->o_direct = st.o_direct;
	ms->total = st.n_models;
	ms->disk = st.n_disk;
	ms->materializing = st.n_materializing;
	ms->host = st.n_host;
	ms->pinned_host = st.n_pinned;
	ms->failed = st.n_failed;
	ar->models = ms;
	uint32_t listed =
	    st.n_orphans < WF_FLOORS_MAX_ORPHANS ? st.n_orphans : WF_FLOORS_MAX_ORPHANS;
	if (listed) {
		ar->orphan_floors = wf_ctl_call_calloc(call, listed, sizeof(*ar->orphan_floors));
		if (!ar->orphan_floors)
			return -ENOMEM;
		for (uint32_t i = 0; i < listed; i++) {
			Weightfloor__V1__OrphanFloor *o = wf_ctl_call_alloc(call, sizeof(*o));
			if (!o)
				return -ENOMEM;
			weightfloor__v1__orphan_floor__init(o);
			o->digest_hex = wf_ctl_call_strdup(call, st.orphans[i].digest_hex);
			if (!o->digest_hex)
				return -ENOMEM;
			o->resident_bytes = st.orphans[i].resident_bytes;
			o->holder_count = st.orphans[i].holder_count;
			o->kept = st.orphans[i].kept;
			ar->orphan_floors[i] = o;
		}
		ar->n_orphan_floors = listed;
	}
	ar->orphan_bytes = st.orphan_bytes;
	ar->orphan_count = st.n_orphans;
	ar->reaped_count = st.reaped;
	ar->worker_count = svc->worker_count ? svc->worker_count(svc->worker_ctx) : 0;
	ar->pid = (uint32_t)getpid();
	ar->started_unix_ms = svc->started_unix_ms;
	reply->body_case = WEIGHTFLOOR__V1__REPLY__BODY_AGENT_STATUS;
	reply->agent_status = ar;
	return 0;
}

/* PublishTensors: the request's checks (what the floor manager cannot see: names present, data
 * and size consistent), then wf_floors_publish(). The tensors' bytes are read from the request
 * in place. */
static int do_publish(struct wf_agent_service *svc, const Weightfloor__V1__PublishTensors *m,
                      Weightfloor__V1__Reply *reply, struct wf_ctl_call *call)
{
	struct wf_diag d = {{0}};
	if (!m->name || !*m->name)
		return fail(reply, call, WF_EINVAL, &(struct wf_diag){"publish: name the model"});
	if (m->n_tensors == 0)
		return fail(reply, call, WF_EINVAL,
		            &(struct wf_diag){"publish: give at least one tensor"});
	if (m->n_tensors > WF_MODEL_MAX_TENSORS)
		return fail(reply, call, WF_ELIMIT,
		            &(struct wf_diag){"publish: more tensors than a model can have"});
	uint32_t n = (uint32_t)m->n_tensors;
	struct wf_floor_publish_tensor *t = wf_ctl_call_calloc(call, n, sizeof(*t));
	uint32_t *ids = wf_ctl_call_calloc(call, n, sizeof(*ids));
	char **names = wf_ctl_call_calloc(call, n, sizeof(*names));
	if (!t || !ids || !names)
		return -ENOMEM;
	for (uint32_t i = 0; i < n; i++) {
		const Weightfloor__V1__TensorBytes *tb = m->tensors[i];
		uint64_t len = tb->data.len;
		if (!tb->name || !*tb->name)
			return fail(reply, call,
			            wf_diag_set(&d, WF_EINVAL, "publish: tensor %u has no name", i),
			            &d);
		if (tb->size && len && tb->size != len)
			return fail(
			    reply, call,
			    wf_diag_set(&d, WF_EINVAL,
			                "publish: tensor '%s': size %llu, but %llu bytes of "
			                "data",
			                tb->name, (unsigned long long)tb->size,
			                (unsigned long long)len),
			    &d);
		if (!m->dry_run && !len && tb->size)
			return fail(reply, call,
			            wf_diag_set(&d, WF_EINVAL,
			                        "publish: tensor '%s': no data (only a dry run may "
			                        "give the size alone)",
			                        tb->name),
			            &d);
		t[i] = (struct wf_floor_publish_tensor){.name = tb->name,
		                                        .data = len ? tb->data.data : NULL,
		                                        .nbytes = len ? len : tb->size};
		names[i] = tb->name; /* the request outlives the reply's packing */
	}
	struct wf_floor_publish_result res;
	int rc = wf_floors_publish(svc->floors, m->name, t, n, m->dry_run, ids, &res, &d);
	if (rc < 0)
		return fail(reply, call, rc, &d);
	Weightfloor__V1__PublishReply *pr = wf_ctl_call_alloc(call, sizeof(*pr));
	if (!pr)
		return -ENOMEM;
	weightfloor__v1__publish_reply__init(pr);
	pr->name = m->name;
	pr->digest_hex = wf_ctl_call_strdup(call, res.digest_hex);
	if (!pr->digest_hex)
		return -ENOMEM;
	pr->generation = res.generation;
	pr->n_tensor_ids = n;
	pr->tensor_ids = ids;
	pr->n_tensor_names = n;
	pr->tensor_names = names;
	pr->spare_bytes = res.spare_bytes;
	pr->spare_used_bytes = res.spare_used;
	pr->max_request_bytes = svc->cfg->max_message;
	reply->body_case = WEIGHTFLOOR__V1__REPLY__BODY_PUBLISH;
	reply->publish = pr;
	return 0;
}

/* Reply entries at most: the counts are always whole, the list stops here (a reload that
 * refuses every tensor of a large model must still fit the agent's max_message). */
#define RELOAD_REPLY_MAX_TENSORS 4096u

static Weightfloor__V1__TensorReload *reload_entry(struct wf_ctl_call *call,
                                                   const struct wf_reload_tensor *t)
{
	Weightfloor__V1__TensorReload *e = wf_ctl_call_alloc(call, sizeof(*e));
	if (!e)
		return NULL;
	weightfloor__v1__tensor_reload__init(e);
	e->name = wf_ctl_call_strdup(call, t->name);
	e->reason = wf_ctl_call_strdup(call, t->why);
	if (!e->name || !e->reason)
		return NULL;
	e->outcome = t->status == WF_RELOAD_CHANGED
	                 ? WEIGHTFLOOR__V1__RELOAD_OUTCOME__RELOAD_OUTCOME_RELOADED
	                 : WEIGHTFLOOR__V1__RELOAD_OUTCOME__RELOAD_OUTCOME_REFUSED;
	e->size = t->nbytes;
	e->old_checksum = t->old_checksum;
	e->new_checksum = t->new_checksum;
	return e;
}

static int reload_reply(const Weightfloor__V1__ReloadModel *m,
                        const struct wf_floor_reload_result *r, Weightfloor__V1__Reply *reply,
                        struct wf_ctl_call *call)
{
	const struct wf_reload_plan *p = &r->plan;
	Weightfloor__V1__ReloadReply *rr = wf_ctl_call_alloc(call, sizeof(*rr));
	if (!rr)
		return -ENOMEM;
	weightfloor__v1__reload_reply__init(rr);
	rr->name = m->name;
	rr->digest_hex = wf_ctl_call_strdup(call, r->digest_hex);
	uint32_t n =
	    p->n_tensors < RELOAD_REPLY_MAX_TENSORS ? p->n_tensors : RELOAD_REPLY_MAX_TENSORS;
	rr->tensors = wf_ctl_call_calloc(call, n ? n : 1, sizeof(*rr->tensors));
	if (!rr->digest_hex || !rr->tensors)
		return -ENOMEM;
	for (uint32_t i = 0; i < n; i++)
		if (!(rr->tensors[i] = reload_entry(call, &p->tensors[i])))
			return -ENOMEM;
	rr->n_tensors = n;
	rr->generation = r->generation;
	rr->published = r->published;
	rr->dry_run = m->dry_run;
	rr->files = p->n_files;
	rr->files_changed = p->files_moved;
	rr->tensors_unchanged = p->n_unchanged;
	rr->tensors_reloaded = p->n_changed;
	rr->tensors_refused = p->n_refused;
	rr->bytes_read = p->bytes_read;
	rr->bytes_reloaded = p->bytes_changed;
	rr->seconds = r->seconds;
	reply->body_case = WEIGHTFLOOR__V1__REPLY__BODY_RELOAD;
	reply->reload = rr;
	return 0;
}

/* ReloadModel: wf_floors_reload(), its plan as the reply. */
static int do_reload(struct wf_agent_service *svc, const Weightfloor__V1__ReloadModel *m,
                     Weightfloor__V1__Reply *reply, struct wf_ctl_call *call)
{
	struct wf_diag d = {{0}};
	if (!m->name || !*m->name)
		return fail(reply, call, WF_EINVAL, &(struct wf_diag){"reload: name the model"});
	struct wf_floor_reload_result r;
	int rc = wf_floors_reload(svc->floors, m->name, m->dry_run, &r, &d);
	if (rc < 0)
		return fail(reply, call, rc, &d);
	rc = reload_reply(m, &r, reply, call);
	wf_floor_reload_result_fini(&r);
	return rc;
}

int wf_agent_service_handle(void *ctx, const Weightfloor__V1__Request *req,
                            Weightfloor__V1__Reply *reply, struct wf_ctl_call *call)
{
	struct wf_agent_service *svc = ctx;
	struct wf_diag d = {{0}};
	int rc;
	switch (req->body_case) {
	case WEIGHTFLOOR__V1__REQUEST__BODY_REGISTER_MODEL: {
		const Weightfloor__V1__RegisterModel *m = req->register_model;
		if (m->n_paths != 1)
			return fail(
			    reply, call, WF_EINVAL,
			    &(struct wf_diag){"register: give exactly one path (a GGUF file "
			                      "or any shard of a split model, a safetensors "
			                      "file, index.json or directory)"});
		/* A relative path would resolve against the agent's working directory, which the
		 * client knows nothing about: it would silently name another file. */
		if (!m->paths[0] || m->paths[0][0] != '/')
			return fail(reply, call, WF_EINVAL,
			            &(struct wf_diag){"register: the path must be absolute (the "
			                              "agent's working directory is not the "
			                              "client's; agentctl sends absolute paths)"});
		rc = wf_floors_register(svc->floors, m->name, m->paths[0], m->pin_host, &d);
		if (rc < 0)
			return fail(reply, call, rc, &d);
		if (m->pin_host && (rc = wf_floors_pin(svc->floors, m->name, true, &d)) < 0)
			return fail(reply, call, rc, &d);
		return reply_model(svc, m->name, reply, call);
	}
	case WEIGHTFLOOR__V1__REQUEST__BODY_LIST_MODELS:
		return do_list(svc, reply, call);
	case WEIGHTFLOOR__V1__REQUEST__BODY_MODEL_STATUS:
		return reply_model(svc, req->model_status->name, reply, call);
	case WEIGHTFLOOR__V1__REQUEST__BODY_ENSURE_FLOOR: {
		const Weightfloor__V1__EnsureFloor *m = req->ensure_floor;
		/* A wait never outlasts the client: it ends a little before the client's deadline
		 * so that the reply (UNAVAILABLE, still materializing) reaches it. */
		uint32_t wait_ms = m->wait_timeout_ms;
		if (m->wait) {
			int left = wf_ctl_call_time_left_ms(call, INT32_MAX);
			int margin = left / 20 < 200 ? left / 20 : 200;
			if (left - margin <= 0)
				return fail(reply, call, WF_ETIMEOUT,
				            &(struct wf_diag){"the request's deadline has passed"});
			if (left != INT32_MAX &&
			    (wait_ms == 0 || (uint32_t)(left - margin) < wait_ms))
				wait_ms = (uint32_t)(left - margin);
		}
		rc = wf_floors_ensure(svc->floors, m->name, m->wait, wait_ms, call_closing, call,
		                      &d);
		if (rc < 0)
			return fail(reply, call, rc, &d);
		return reply_model(svc, m->name, reply, call);
	}
	case WEIGHTFLOOR__V1__REQUEST__BODY_RELEASE_FLOOR:
		rc = wf_floors_release(svc->floors, req->release_floor->name, &d);
		if (rc < 0)
			return fail(reply, call, rc, &d);
		return reply_model(svc, req->release_floor->name, reply, call);
	case WEIGHTFLOOR__V1__REQUEST__BODY_PIN_HOST:
	case WEIGHTFLOOR__V1__REQUEST__BODY_UNPIN_HOST: {
		bool pin = req->body_case == WEIGHTFLOOR__V1__REQUEST__BODY_PIN_HOST;
		const char *name = pin ? req->pin_host->name : req->unpin_host->name;
		rc = wf_floors_pin(svc->floors, name, pin, &d);
		if (rc < 0)
			return fail(reply, call, rc, &d);
		return reply_model(svc, name, reply, call);
	}
	case WEIGHTFLOOR__V1__REQUEST__BODY_AGENT_STATUS:
		return do_status(svc, reply, call);
	case WEIGHTFLOOR__V1__REQUEST__BODY_PUBLISH_TENSORS:
		return do_publish(svc, req->publish_tensors, reply, call);
	case WEIGHTFLOOR__V1__REQUEST__BODY_RELOAD_MODEL:
		return do_reload(svc, req->reload_model, reply, call);
	default:
		if (svc->worker_handle)
			return svc->worker_handle(svc->worker_handle_ctx, req, reply, call);
		reply->message = "not served by the agent: send worker requests to the worker's "
		                 "endpoint (agentctl workers lists them)";
		return WF_EUNSUPPORTED;
	}
}
