/* Publishing, end to end: a real wf-agent and a real wf-worker (host device) on ipc:// sockets.
 * PublishTensors (and `agentctl publish`) give a tensor of a model's floor new bytes as one new
 * generation: the reply says which, a subscriber sees the PUBLISHED event, the floor (attached
 * read-only here, as a worker does) serves the new bytes with a valid checksum, the worker logs
 * the event. Bad input (unknown model or tensor, a wrong size, a floor without one, a full spare
 * area) is refused with the right status and changes nothing; a restarted agent re-adopts the
 * published floor. Every wait polls a state with a deadline. */
#include "base/error.h"
#include "common/wftest.h"
#include "proto/status.h"
#include "shm/region.h"
#include "tests/agent/agt.h"

#include <criterion/criterion.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

TestSuite(agent_publish, .fini = agt_fini, .timeout = 180);

#define ST(x)   AGT_ST(x)
#define KIND(x) WEIGHTFLOOR__V1__EVENT_KIND__EVENT_KIND_##x

struct tensor {
	char name[256];
	uint32_t index;
	uint64_t nbytes;
};

/* The first tensor of r whose size is in [lo, hi]. */
static struct tensor pick(const struct wf_shm_region *r, uint64_t lo, uint64_t hi,
                          const char *not_this)
{
	for (uint32_t i = 0; i < wf_shm_region_n_tensors(r); i++) {
		struct wf_shm_tensor_info ti;
		cr_assert_eq(wf_shm_region_tensor(r, i, &ti), 0);
		if (ti.nbytes >= lo && ti.nbytes <= hi &&
		    (!not_this || strcmp(ti.name, not_this))) {
			struct tensor t = {.index = i, .nbytes = ti.nbytes};
			snprintf(t.name, sizeof t.name, "%s", ti.name);
			return t;
		}
	}
	cr_assert_fail("no tensor of %llu..%llu bytes", (unsigned long long)lo,
	               (unsigned long long)hi);
	return (struct tensor){0};
}

static uint8_t *bytes_of(uint64_t n, uint8_t seed)
{
	uint8_t *b = malloc(n ? n : 1);
	cr_assert_not_null(b);
	for (uint64_t i = 0; i < n; i++)
		b[i] = (uint8_t)(seed + i * 31);
	return b;
}

/* The next PUBLISHED event for model on sub (others skipped); asserts within 20 s. */
static Weightfloor__V1__Event *wait_published(struct wf_ctl_sub *sub, const char *model)
{
	int64_t end = agt_now_ms() + 20000;
	while (agt_now_ms() < end) {
		Weightfloor__V1__Event *ev = NULL;
		int rc = wf_ctl_sub_recv(sub, 200, &ev, NULL);
		if (rc == WF_ETIMEOUT || rc == WF_EFORMAT)
			continue;
		cr_assert_eq(rc, 0, "sub recv: %s", wf_strerror(rc));
		if (ev->kind == KIND(PUBLISHED) && strcmp(ev->model, model) == 0)
			return ev;
		wf_ctl_event_free(ev);
	}
	cr_assert_fail("no PUBLISHED event for %s within 20 s", model);
	return NULL;
}

/* Waits (20 s) until the worker's log holds needle. */
static void wait_worker_log(struct agt_worker *w, const char *needle)
{
	int64_t end = agt_now_ms() + 20000;
	for (;;) {
		char *log = agt_worker_log(w);
		bool found = strstr(log, needle) != NULL;
		if (found || agt_now_ms() >= end) {
			cr_assert(found, "the worker never logged '%s'; its log:\n%s", needle, log);
			free(log);
			return;
		}
		free(log);
		agt_sleep_ms(50);
	}
}

/* The floor's tensor t reads want, with a checksum that matches it, at generation gen. */
static void expect_floor(const struct wf_shm_region *r, const struct tensor *t, const uint8_t *want,
                         uint64_t gen)
{
	struct wf_shm_tensor_info ti;
	cr_assert_eq(wf_shm_region_find(r, t->name, &ti), 0, "tensor %s", t->name);
	cr_assert_eq(ti.index, t->index);
	cr_assert_eq(ti.generation, gen, "%s at generation %llu, want %llu", t->name,
	             (unsigned long long)ti.generation, (unsigned long long)gen);
	cr_assert_eq(memcmp(ti.data, want, t->nbytes), 0, "%s does not read the new bytes",
	             t->name);
	cr_assert_eq(ti.checksum, wf_shm_checksum(want, t->nbytes));
	struct wf_diag d = {{0}};
	int rc = wf_shm_region_verify(r, &d);
	cr_assert_eq(rc, 0, "verify: %s", wf_diag_str(&d, rc));
}

/* A refused request: its status, a word of its message, and the floor's generation unchanged. */
static void expect_refused(struct agt *a, const struct wf_shm_region *r, const char *model,
                           const char *tensor, const uint8_t *data, uint64_t size,
                           Weightfloor__V1__Status want, const char *needle)
{
	uint64_t gen = wf_shm_region_generation(r);
	Weightfloor__V1__Reply *rep = agt_publish(a, model, tensor, data, size, false);
	agt_expect_code(rep, want, tensor);
	cr_assert(rep->message && strstr(rep->message, needle), "'%s' not in: %s", needle,
	          rep->message);
	cr_assert_eq(rep->body_case, WEIGHTFLOOR__V1__REPLY__BODY__NOT_SET);
	wf_ctl_reply_free(rep);
	cr_assert_eq(wf_shm_region_generation(r), gen, "a refused publish moved the generation");
}

static void write_bytes(const char *path, const uint8_t *b, uint64_t n)
{
	FILE *f = fopen(path, "wb");
	cr_assert_not_null(f);
	cr_assert_eq(fwrite(b, 1, n, f), n);
	cr_assert_eq(fclose(f), 0);
}

Test(agent_publish, publish_reaches_floor_event_and_worker)
{
	struct agt *a = agt_new("publish");
	char *pm = agt_gen(a, "m", 3, NULL), *pp = agt_gen(a, "ping", 4, NULL);
	char *marg = agt_printf("m=%s", pm);
	/* a spare area of 256 KiB: room for the small publishes below, not for a big tensor */
	agt_start(a, NULL, (const char *[]){"--model", marg, "--spare", "256K", NULL});
	struct agt_worker w;
	agt_spawn_worker(a, &w, "w1", NULL, NULL, NULL);
	agt_wait_worker_registered(a, &w, "w1");
	struct wf_ctl_sub *sub = agt_sub_synced(a, "ping", pp);

	/* a model without a floor: NOT_RESIDENT; then the floor, attached here read-only */
	Weightfloor__V1__Reply *rep = agt_publish(a, "m", "output_norm.weight", NULL, 4, true);
	agt_expect_code(rep, ST(NOT_RESIDENT), "publish before ensure");
	cr_assert(strstr(rep->message, "ensure"), "%s", rep->message);
	wf_ctl_reply_free(rep);
	agt_ensure_ok(a, "m");
	char *hex = agt_digest_of(a, "m");
	struct wf_shm_region *r = agt_attach_reader(a, hex, NULL);
	struct wf_shm_header h;
	wf_shm_region_header(r, &h);
	cr_assert_eq(h.spare_size, 256 << 10, "the agent's --spare: %llu",
	             (unsigned long long)h.spare_size);
	cr_assert_eq(wf_shm_region_generation(r), 0);
	struct tensor small = pick(r, 256, 16384, NULL);
	struct tensor other = pick(r, 256, 16384, small.name);
	struct tensor big = pick(r, (256 << 10) + 1, UINT64_MAX, NULL);

	/* The worker must be listening before the publish it is to hear: publish the small
	 * tensor until its log shows one (PUB keeps no history). */
	uint64_t gen = 0;
	char *line = NULL;
	for (uint8_t seed = 1;; seed++) {
		uint8_t *b = bytes_of(small.nbytes, seed);
		rep = agt_publish(a, "m", small.name, b, small.nbytes, false);
		agt_expect_code(rep, ST(OK), "sync publish");
		gen = rep->publish->generation;
		wf_ctl_reply_free(rep);
		free(b);
		free(line);
		line = agt_printf("published at generation %llu", (unsigned long long)gen);
		char *log = agt_worker_log(&w);
		bool heard = strstr(log, line) != NULL;
		free(log);
		if (heard)
			break;
		cr_assert_lt(seed, 40, "the worker never heard a publish");
		agt_sleep_ms(100);
	}
	/* drain the events of those */
	Weightfloor__V1__Event *ev = NULL;
	while (wf_ctl_sub_recv(sub, 300, &ev, NULL) == 0)
		wf_ctl_event_free(ev);

	/* the publish under test: reply, event, floor, worker */
	uint8_t *nb = bytes_of(other.nbytes, 0x5a);
	rep = agt_publish(a, "m", other.name, nb, other.nbytes, false);
	agt_expect_code(rep, ST(OK), "publish");
	cr_assert_eq(rep->body_case, WEIGHTFLOOR__V1__REPLY__BODY_PUBLISH);
	Weightfloor__V1__PublishReply *pr = rep->publish;
	cr_assert_eq(pr->generation, gen + 2, "one publish is one generation");
	gen = pr->generation;
	cr_assert_str_eq(pr->name, "m");
	cr_assert_str_eq(pr->digest_hex, hex);
	cr_assert_eq(pr->n_tensor_ids, 1);
	cr_assert_eq(pr->tensor_ids[0], other.index);
	cr_assert_str_eq(pr->tensor_names[0], other.name);
	cr_assert_eq(pr->spare_bytes, 256 << 10);
	cr_assert_gt(pr->spare_used_bytes, 0);
	cr_assert_eq(pr->max_request_bytes, 4 << 20);
	wf_ctl_reply_free(rep);

	ev = wait_published(sub, "m");
	cr_assert_str_eq(ev->digest, hex);
	cr_assert_eq(ev->generation, gen);
	cr_assert_eq(ev->n_tensor_ids, 1);
	cr_assert_eq(ev->tensor_ids[0], other.index);
	cr_assert_eq(ev->n_tensor_names, 1);
	cr_assert_str_eq(ev->tensor_names[0], other.name);
	wf_ctl_event_free(ev);

	expect_floor(r, &other, nb, gen);
	free(line);
	line = agt_printf("model m: tensors [%u] published at generation %llu", other.index,
	                  (unsigned long long)gen);
	wait_worker_log(&w, line);

	/* once through agentctl, with --json */
	uint8_t *cb = bytes_of(small.nbytes, 0xc3);
	char *file = agt_printf("%s/small.bin", a->dir);
	write_bytes(file, cb, small.nbytes);
	char *targ = agt_printf("%s=%s", small.name, file);
	char *out = NULL, *err = NULL;
	int rc = agt_ctl(a, &out, &err,
	                 (const char *const[]){"publish", "m", "--tensor", targ, "--json", NULL});
	cr_assert_eq(rc, 0, "agentctl publish: exit %d: %s", rc, err);
	struct json_object *doc = json_tokener_parse(out);
	cr_assert_not_null(doc, "not JSON: %s", out);
	struct json_object *jg = NULL, *jids = NULL;
	cr_assert(json_object_object_get_ex(doc, "generation", &jg), "%s", out);
	cr_assert_eq((uint64_t)json_object_get_int64(jg), gen + 2, "%s", out);
	cr_assert(json_object_object_get_ex(doc, "tensor_ids", &jids), "%s", out);
	cr_assert_eq(json_object_get_int(json_object_array_get_idx(jids, 0)), (int)small.index);
	json_object_put(doc);
	gen += 2;
	ev = wait_published(sub, "m");
	cr_assert_eq(ev->generation, gen);
	wf_ctl_event_free(ev);
	expect_floor(r, &small, cb, gen);
	free(line);
	line = agt_printf("model m: tensors [%u] published at generation %llu", small.index,
	                  (unsigned long long)gen);
	wait_worker_log(&w, line);
	char *alog = agt_log(a);
	cr_assert(strstr(alog, "published generation"), "the agent logged no publish:\n%s", alog);
	free(alog);
	free(out);
	free(err);

	/* bad input: refused, nothing changed */
	expect_refused(a, r, "nosuch", small.name, cb, small.nbytes, ST(NOT_FOUND), "nosuch");
	expect_refused(a, r, "m", "blk.0.nosuch.weight", cb, small.nbytes, ST(NOT_FOUND),
	               "blk.0.nosuch.weight");
	expect_refused(a, r, "m", small.name, cb, small.nbytes - 1, ST(INVALID_ARGUMENT), "bytes");
	uint8_t *bb = bytes_of(big.nbytes, 7);
	if (big.nbytes + 64 <= (4u << 20))
		expect_refused(a, r, "m", big.name, bb, big.nbytes, ST(RESOURCE_EXHAUSTED),
		               "spare");
	rep = agt_publish(a, "m", big.name, NULL, big.nbytes, true);
	agt_expect_code(rep, ST(RESOURCE_EXHAUSTED), "dry run of the big tensor");
	wf_ctl_reply_free(rep);
	/* agentctl refuses a file of the wrong size in its check: no bytes sent, exit 7 */
	uint8_t *longer = bytes_of(small.nbytes + 1, 0xc3);
	write_bytes(file, longer, small.nbytes + 1);
	free(longer);
	rc = agt_ctl(a, &out, &err, (const char *const[]){"publish", "m", "--tensor", targ, NULL});
	cr_assert_eq(rc, 7, "agentctl publish of a wrong size: exit %d: %s", rc, err);
	cr_assert(strstr(err, "publish (check)") && strstr(err, "INVALID_ARGUMENT"), "%s", err);
	cr_assert_eq(wf_shm_region_generation(r), gen);
	free(out);
	free(err);
	/* a dry run changes nothing and says the current generation */
	rep = agt_publish(a, "m", small.name, NULL, small.nbytes, true);
	agt_expect_code(rep, ST(OK), "dry run");
	cr_assert_eq(rep->publish->generation, gen);
	wf_ctl_reply_free(rep);
	cr_assert_eq(wf_shm_region_generation(r), gen);

	/* the stale watch speaks of files only: a publish changed none */
	agt_sleep_ms(300);
	rep = agt_model(a, "m");
	cr_assert_not(rep->model_info->stale, "a publish made the floor STALE");
	wf_ctl_reply_free(rep);

	/* a restarted agent re-adopts the published floor, generation and bytes included */
	wf_shm_region_detach(r);
	cr_assert_eq(agt_stop(a, 10000), 0);
	agt_start(a, NULL, (const char *[]){"--model", marg, "--spare", "256K", NULL});
	rep = agt_model(a, "m");
	cr_assert(agt_state(rep) == AGT_FS(HOST), "after restart: %s",
	          agt_state_name(agt_state(rep)));
	wf_ctl_reply_free(rep);
	r = agt_attach_reader(a, hex, NULL);
	cr_assert_eq(wf_shm_region_generation(r), gen);
	expect_floor(r, &small, cb, gen);
	wf_shm_region_detach(r);

	wf_ctl_sub_close(sub);
	free(nb);
	free(cb);
	free(bb);
	free(line);
	free(file);
	free(targ);
	free(hex);
	free(marg);
	free(pm);
	free(pp);
}
