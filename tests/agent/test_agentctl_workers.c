/* agentctl over several real workers (wf-worker on the host device) through a real wf-agent:
 * `workers` shows each worker's id whole, its residency mode and when the agent last heard it,
 * and flags pinned over-commit; `pin`/`prefetch --all` act on every worker and print one JSON
 * document; an evict prints no progress. A WorkerStatus relayed by the agent carries the agent's
 * registration and last-heartbeat times. */
#include "common/wftest.h"
#include "control/agentctl/cli.h"
#include "tests/agent/agt.h"
#include "tests/agent/agt_json.h"

#include <criterion/criterion.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

TestSuite(agentctl_workers, .fini = agt_fini, .timeout = 180);

#define ID_SELF "gpu-0.node-a.example.internal"
#define ID_EXT  "gpu-1.node-a.example.internal"

/* WorkerStatus for id through the agent; NULL unless it came back OK. */
static Weightfloor__V1__Reply *relayed_status(struct agt *a, const char *id)
{
	Weightfloor__V1__WorkerStatus ws = WEIGHTFLOOR__V1__WORKER_STATUS__INIT;
	ws.worker_id = (char *)id;
	Weightfloor__V1__Request req = WEIGHTFLOOR__V1__REQUEST__INIT;
	req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_WORKER_STATUS;
	req.worker_status = &ws;
	Weightfloor__V1__Reply *r = agt_call(a, &req, 5000);
	if (r->code == AGT_ST(OK) && r->body_case == WEIGHTFLOOR__V1__REPLY__BODY_WORKER_INFO)
		return r;
	wf_ctl_reply_free(r);
	return NULL;
}

/* Waits until the agent relays a WorkerStatus to the worker (registered and serving). */
static void wait_served(struct agt *a, const char *id, const struct agt_worker *w)
{
	int64_t end = agt_now_ms() + 20000;
	Weightfloor__V1__Reply *r;
	while (!(r = relayed_status(a, id))) {
		cr_assert_lt(agt_now_ms(), end, "worker %s not served through the agent; log:\n%s",
		             id, agt_worker_log(w));
		agt_sleep_ms(50);
	}
	wf_ctl_reply_free(r);
}

/* The model's state on worker id as the worker reports it ("" when it does not list it). */
static Weightfloor__V1__Residency state_on(struct agt *a, const char *id, const char *model)
{
	Weightfloor__V1__Reply *r = relayed_status(a, id);
	cr_assert_not_null(r, "WorkerStatus %s", id);
	Weightfloor__V1__Residency s = WEIGHTFLOOR__V1__RESIDENCY__RESIDENCY_UNSPECIFIED;
	for (size_t i = 0; i < r->worker_info->n_models; i++)
		if (strcmp(r->worker_info->models[i]->model, model) == 0)
			s = r->worker_info->models[i]->state;
	wf_ctl_reply_free(r);
	return s;
}

/* The table line that starts with id (asserts there is one); malloc'ed. */
static char *row_of(const char *table, const char *id)
{
	for (const char *p = table; p && *p;) {
		const char *nl = strchr(p, '\n');
		size_t len = nl ? (size_t)(nl - p) : strlen(p);
		if (strncmp(p, id, strlen(id)) == 0 && (p[strlen(id)] == ' ' || len == strlen(id)))
			return strndup(p, len);
		p = nl ? nl + 1 : NULL;
	}
	cr_assert_fail("no row for '%s' in:\n%s", id, table);
	return NULL;
}

/* An agent with models A and B and two workers: ID_SELF self-managed, ID_EXT external. */
static struct agt *two_workers(const char *tag)
{
	struct agt *a = agt_new(tag);
	char *pa = agt_gen(a, "A", 1, NULL), *pb = agt_gen(a, "B", 2, NULL);
	agt_start(a, NULL, NULL);
	Weightfloor__V1__Reply *r = agt_register(a, "A", pa, false);
	agt_expect_code(r, AGT_ST(OK), "register A");
	wf_ctl_reply_free(r);
	r = agt_register(a, "B", pb, false);
	agt_expect_code(r, AGT_ST(OK), "register B");
	wf_ctl_reply_free(r);
	free(pa);
	free(pb);
	static struct agt_worker ws, we;
	agt_spawn_worker(a, &ws, ID_SELF, NULL, NULL, (const char *const[]){NULL});
	agt_spawn_worker(a, &we, ID_EXT, NULL, NULL,
	                 (const char *const[]){"--mode", "external", NULL});
	wait_served(a, ID_SELF, &ws);
	wait_served(a, ID_EXT, &we);
	return a;
}

Test(agentctl_workers, modes_ids_and_last_seen)
{
	struct agt *a = two_workers("ctlw-modes");
	char *out, *err;
	int rc = agt_ctl(a, &out, &err, (const char *[]){"workers", NULL});
	cr_assert_eq(rc, 0, "workers: exit %d: %s", rc, err);
	cr_assert(strstr(out, "MODE"), "a MODE column:\n%s", out);
	char *row = row_of(out, ID_SELF);
	cr_expect(strstr(row, " self-managed "), "mode of %s: %s", ID_SELF, row);
	free(row);
	row = row_of(out, ID_EXT);
	cr_expect(strstr(row, " external "), "mode of %s: %s", ID_EXT, row);
	cr_expect_not(strstr(row, "OVER"), "nothing pinned, no over-commit: %s", row);
	free(row);
	free(out);
	free(err);

	rc = agt_ctl(a, &out, &err, (const char *[]){"workers", "--json", NULL});
	cr_assert_eq(rc, 0, "workers --json: exit %d: %s", rc, err);
	struct json_object *o = agt_json_parse(out, "workers --json");
	struct json_object *arr = agt_json_key(o, "workers");
	cr_assert_eq(json_object_array_length(arr), 2, "%s", out);
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	int64_t now = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
	for (size_t i = 0; i < 2; i++) {
		struct json_object *w = json_object_array_get_idx(arr, i);
		const char *id = json_object_get_string(agt_json_key(w, "worker_id"));
		const char *mode = json_object_get_string(agt_json_key(w, "mode"));
		bool ext = strcmp(id, ID_EXT) == 0;
		cr_expect(ext || strcmp(id, ID_SELF) == 0, "worker_id %s", id);
		cr_expect_str_eq(mode, ext ? "EXTERNAL" : "SELF_MANAGED", "mode of %s", id);
		int64_t seen = json_object_get_int64(agt_json_key(w, "last_seen_unix_ms"));
		cr_expect(seen > 0 && seen <= now + 1000 && seen > now - 60000,
		          "last_seen_unix_ms of %s: %lld (now %lld)", id, (long long)seen,
		          (long long)now);
		cr_expect(json_object_get_int64(agt_json_key(w, "registered_unix_ms")) > 0);
		cr_expect(json_object_get_boolean(agt_json_key(w, "reachable")));
		cr_expect_not(json_object_get_boolean(agt_json_key(w, "device_pinned_overcommit")));
	}
	json_object_put(o);
	free(out);
	free(err);

	/* The relay itself fills the agent's times, whoever asks. */
	Weightfloor__V1__Reply *r = relayed_status(a, ID_EXT);
	cr_assert_not_null(r);
	cr_expect_gt(r->worker_info->last_seen_unix_ms, 0, "relayed last_seen_unix_ms");
	cr_expect_gt(r->worker_info->registered_unix_ms, 0, "relayed registered_unix_ms");
	cr_expect_eq(r->worker_info->mode,
	             WEIGHTFLOOR__V1__RESIDENCY_MODE__RESIDENCY_MODE_EXTERNAL);
	wf_ctl_reply_free(r);
	/* and ListWorkers has the mode from the registration, without asking the worker */
	Weightfloor__V1__ListWorkers lw = WEIGHTFLOOR__V1__LIST_WORKERS__INIT;
	Weightfloor__V1__Request req = WEIGHTFLOOR__V1__REQUEST__INIT;
	req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_LIST_WORKERS;
	req.list_workers = &lw;
	r = agt_call(a, &req, 5000);
	cr_assert_eq(r->body_case, WEIGHTFLOOR__V1__REPLY__BODY_WORKER_LIST);
	cr_assert_eq(r->worker_list->n_workers, 2);
	for (size_t i = 0; i < 2; i++) {
		const Weightfloor__V1__WorkerInfo *w = r->worker_list->workers[i];
		cr_expect_eq(w->mode,
		             strcmp(w->worker_id, ID_EXT) == 0
		                 ? WEIGHTFLOOR__V1__RESIDENCY_MODE__RESIDENCY_MODE_EXTERNAL
		                 : WEIGHTFLOOR__V1__RESIDENCY_MODE__RESIDENCY_MODE_SELF_MANAGED,
		             "ListWorkers mode of %s", w->worker_id);
	}
	wf_ctl_reply_free(r);
}

/* Checks a --all --json document: {"workers": [2 entries]}, each with a worker_id of ours and
 * the state wanted. */
static void expect_all_doc(const char *out, const char *what, const char *state)
{
	struct json_object *o = agt_json_parse(out, what);
	struct json_object *arr = agt_json_key(o, "workers");
	cr_assert_eq(json_object_array_length(arr), 2, "%s: %s", what, out);
	bool seen_self = false, seen_ext = false;
	for (size_t i = 0; i < 2; i++) {
		struct json_object *w = json_object_array_get_idx(arr, i);
		const char *id = json_object_get_string(agt_json_key(w, "worker_id"));
		seen_self |= strcmp(id, ID_SELF) == 0;
		seen_ext |= strcmp(id, ID_EXT) == 0;
		cr_expect_str_eq(json_object_get_string(agt_json_key(w, "state")), state,
		                 "%s on %s: %s", what, id, out);
	}
	cr_expect(seen_self && seen_ext, "%s: both workers: %s", what, out);
	json_object_put(o);
}

Test(agentctl_workers, all_workers_pin_prefetch_and_quiet_evict)
{
	struct agt *a = two_workers("ctlw-all");
	char *out, *err;
	int rc = agt_ctl(a, &out, &err, (const char *[]){"prefetch", "B", "--all", "--json", NULL});
	cr_assert_eq(rc, 0, "prefetch --all --json: exit %d: %s", rc, err);
	expect_all_doc(out, "prefetch B --all --json", "DEVICE");
	free(out);
	free(err);
	cr_expect_eq(state_on(a, ID_SELF, "B"), WEIGHTFLOOR__V1__RESIDENCY__RESIDENCY_DEVICE);
	cr_expect_eq(state_on(a, ID_EXT, "B"), WEIGHTFLOOR__V1__RESIDENCY__RESIDENCY_DEVICE);

	rc = agt_ctl(a, &out, &err, (const char *[]){"pin", "A", "--all", NULL});
	cr_assert_eq(rc, 0, "pin --all: exit %d: %s", rc, err);
	/* a row per worker, ids whole */
	free(row_of(out, ID_SELF));
	free(row_of(out, ID_EXT));
	free(out);
	free(err);
	cr_expect_eq(state_on(a, ID_SELF, "A"),
	             WEIGHTFLOOR__V1__RESIDENCY__RESIDENCY_PINNED_DEVICE);
	cr_expect_eq(state_on(a, ID_EXT, "A"), WEIGHTFLOOR__V1__RESIDENCY__RESIDENCY_PINNED_DEVICE);

	rc = agt_ctl(a, &out, &err, (const char *[]){"pin", "A", "--all", "--json", NULL});
	cr_assert_eq(rc, 0, "pin --all --json: exit %d: %s", rc, err);
	expect_all_doc(out, "pin A --all --json", "PINNED_DEVICE");
	free(out);
	free(err);

	/* An evict frees memory at once: no progress, not even on stderr. */
	rc = agt_ctl(a, &out, &err, (const char *[]){"evict", "B", "--worker", ID_EXT, NULL});
	cr_assert_eq(rc, 0, "evict: exit %d: %s", rc, err);
	cr_expect_not(strchr(err, '%'), "no progress frames on stderr: %s", err);
	cr_expect_not(strchr(err, '\r'), "no progress frames on stderr: %s", err);
	char *row = row_of(out, ID_EXT);
	cr_expect(strstr(row, " B "), "evict row: %s", row);
	free(row);
	free(out);
	free(err);
	cr_expect_neq(state_on(a, ID_EXT, "B"), WEIGHTFLOOR__V1__RESIDENCY__RESIDENCY_DEVICE);
	cr_expect_eq(state_on(a, ID_SELF, "B"), WEIGHTFLOOR__V1__RESIDENCY__RESIDENCY_DEVICE,
	             "the other worker keeps B");
}

/* Pinning more than the worker's weight pool is allowed and flagged: `workers` marks it. */
Test(agentctl_workers, pinned_overcommit_marked)
{
	struct agt *a = agt_new("ctlw-over");
	char *pa = agt_gen(a, "A", 1, NULL);
	agt_start(a, NULL, NULL);
	Weightfloor__V1__Reply *r = agt_register(a, "A", pa, false);
	agt_expect_code(r, AGT_ST(OK), "register A");
	wf_ctl_reply_free(r);
	free(pa);
	/* a 32 MiB device with a tenth for weights: a ~3 MiB pool, less than one model (~6.5 MB) */
	struct agt_worker w;
	agt_spawn_worker(a, &w, ID_SELF, NULL, "host:mem=32Mi",
	                 (const char *const[]){"--weight-fraction", "0.1", NULL});
	wait_served(a, ID_SELF, &w);

	char *out, *err;
	int rc = agt_ctl(a, &out, &err, (const char *[]){"workers", NULL});
	cr_assert_eq(rc, 0, "workers: exit %d: %s", rc, err);
	char *row = row_of(out, ID_SELF);
	cr_expect_not(strstr(row, "OVER"), "nothing pinned yet: %s", row);
	free(row);
	free(out);
	free(err);

	rc = agt_ctl(a, &out, &err, (const char *[]){"pin", "A", NULL});
	cr_assert_eq(rc, 0, "pin A: exit %d: %s\n%s", rc, err, agt_worker_log(&w));
	free(out);
	free(err);

	rc = agt_ctl(a, &out, &err, (const char *[]){"workers", NULL});
	cr_assert_eq(rc, 0, "workers: exit %d: %s", rc, err);
	row = row_of(out, ID_SELF);
	cr_expect(strstr(row, "OVER"), "pinned over-commit marked:\n%s", out);
	free(row);
	free(out);
	free(err);

	rc = agt_ctl(a, &out, &err, (const char *[]){"workers", "--json", NULL});
	cr_assert_eq(rc, 0);
	struct json_object *o = agt_json_parse(out, "workers --json");
	struct json_object *w0 = json_object_array_get_idx(agt_json_key(o, "workers"), 0);
	cr_assert_not_null(w0, "%s", out);
	cr_expect(json_object_get_boolean(agt_json_key(w0, "device_pinned_overcommit")), "%s", out);
	cr_expect_gt(json_object_get_int64(agt_json_key(w0, "device_pinned_bytes")),
	             json_object_get_int64(agt_json_key(w0, "device_weight_pool_bytes")), "%s",
	             out);
	json_object_put(o);
	free(out);
	free(err);
}
