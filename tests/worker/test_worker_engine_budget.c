/* An engine's device memory in wf-worker's device budget (issue 11): a real wf-agent with the
 * reference model "tiny" (qwen3moe, post-fetched to a host device with an 8 MiB expert cache, so
 * its engine holds device bytes) and a second model "other" (mixtral-tiny-f32, weights only).
 * Workers get budgets sized from what the engine and "other" measure on a worker with room:
 *   - a Generate charges the engine's bytes: WorkerStatus device_used_bytes rises by exactly
 *     them (the engine's scratchpad; no experts are resident), and the worker logs an engine
 *     event line with the post-fetch figures when the completion ends;
 *   - a budget below the engine's bytes refuses the Generate with RESOURCE_EXHAUSTED naming the
 *     budget, evicts nothing, leaves nothing charged, and the worker goes on serving;
 *   - loading "other" into a budget that holds either but not both evicts the idle engine
 *     (logged), and the next Generate builds it again, evicting "other". */
#include "common/wftest.h"
#include "tests/agent/agt.h"
#include "tests/worker/wref.h"

#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

TestSuite(engine_budget, .fini = agt_fini, .timeout = 240);

#define N_GEN 6

struct fixture {
	struct agt *a;
	char prompt[1024];
	int32_t ids[256];
	size_t n_ids;
	char *tiny, *other;
};

static void setup(struct fixture *f, const char *tag)
{
	memset(f, 0, sizeof(*f));
	f->tiny = wref_model("qwen3moe-tiny-q4_k_m", f->prompt, sizeof f->prompt);
	char unused[1024];
	f->other = wref_model("mixtral-tiny-f32", unused, sizeof unused);
	for (char *p = f->prompt; *p && f->n_ids < 256;) {
		f->ids[f->n_ids++] = (int32_t)strtol(p, &p, 10);
		while (*p == ',')
			p++;
	}
	cr_assert_gt(f->n_ids, 0);
	f->a = agt_new(tag);
	char *m1 = agt_printf("tiny=%s", f->tiny), *m2 = agt_printf("other=%s", f->other);
	agt_start(f->a, NULL, (const char *[]){"--model", m1, "--model", m2, NULL});
	free(m1);
	free(m2);
}

static void teardown(struct fixture *f)
{
	free(f->tiny);
	free(f->other);
}

/* A post-fetching worker whose on-demand budget is exactly arena bytes (fraction 1, no wiggle). */
static void spawn(struct fixture *f, struct agt_worker *w, const char *id, uint64_t arena)
{
	char *ar = agt_printf("%" PRIu64, arena);
	agt_spawn_worker(f->a, w, id, NULL, "host:mem=256Mi",
	                 (const char *[]){"--threads", "1", "--postfetch", "enable=1",
	                                  "--postfetch", "block_on_miss=1", "--expert-cache-mb",
	                                  "8", "--arena", ar, "--weight-fraction", "1", "--wiggle",
	                                  "0", NULL});
	agt_wait_worker_ready(w);
	free(ar);
}

/* WorkerStatus (asserted OK); the caller frees it. */
static Weightfloor__V1__Reply *status(struct agt_worker *w)
{
	int rc = 0;
	Weightfloor__V1__Reply *r = agt_worker_status(w->url, 10000, &rc);
	cr_assert(r && rc == 0 && r->code == AGT_ST(OK) && r->worker_info,
	          "WorkerStatus: rc %d %s\n%s", rc, r ? r->message : "", agt_worker_log(w));
	return r;
}

static uint64_t used(struct agt_worker *w)
{
	Weightfloor__V1__Reply *r = status(w);
	uint64_t u = r->worker_info->device_used_bytes;
	wf_ctl_reply_free(r);
	return u;
}

/* The model's entry in a WorkerStatus reply (borrowed), NULL when not listed. */
static Weightfloor__V1__ModelResidency *entry(Weightfloor__V1__Reply *r, const char *model)
{
	for (size_t i = 0; i < r->worker_info->n_models; i++)
		if (strcmp(r->worker_info->models[i]->model, model) == 0)
			return r->worker_info->models[i];
	return NULL;
}

/* Runs one greedy completion of N_GEN tokens of tiny to its end. Returns the Generate's status
 * code; on an error *msg (when not NULL) gets the message (malloc'ed). */
static int generate(struct fixture *f, struct agt_worker *w, char **msg)
{
	Weightfloor__V1__Sampling sp = WEIGHTFLOOR__V1__SAMPLING__INIT;
	sp.top_k = 1;
	Weightfloor__V1__Generate g = WEIGHTFLOOR__V1__GENERATE__INIT;
	g.model = "tiny";
	g.prompt_ids = f->ids;
	g.n_prompt_ids = f->n_ids;
	g.sampling = &sp;
	g.max_tokens = N_GEN;
	g.ignore_eos = true;
	g.wait_ms = 10000;
	Weightfloor__V1__Request req = WEIGHTFLOOR__V1__REQUEST__INIT;
	req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_GENERATE;
	req.generate = &g;
	Weightfloor__V1__Reply *r = NULL;
	struct wf_diag d = {{0}};
	int rc = agt_call_url(w->url, &req, 60000, &r, &d);
	cr_assert_eq(rc, 0, "generate: %s\n%s", wf_diag_str(&d, rc), agt_worker_log(w));
	int code = r->code;
	if (msg)
		*msg = strdup(r->message ? r->message : "");
	if (code != AGT_ST(OK)) {
		wf_ctl_reply_free(r);
		return code;
	}
	uint64_t id = r->generate->completion_id;
	uint32_t n = r->generate->n_tokens;
	bool done = r->generate->done;
	wf_ctl_reply_free(r);
	int64_t end = agt_now_ms() + 60000;
	while (!done) {
		cr_assert_lt(agt_now_ms(), end, "completion %" PRIu64 " never ended", id);
		Weightfloor__V1__GenerateRead rd = WEIGHTFLOOR__V1__GENERATE_READ__INIT;
		rd.completion_id = id;
		rd.after = n;
		rd.wait_ms = 5000;
		Weightfloor__V1__Request rq = WEIGHTFLOOR__V1__REQUEST__INIT;
		rq.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_GENERATE_READ;
		rq.generate_read = &rd;
		rc = agt_call_url(w->url, &rq, 20000, &r, &d);
		cr_assert_eq(rc, 0, "read: %s", wf_diag_str(&d, rc));
		cr_assert_eq(r->code, AGT_ST(OK), "read: %s", r->message);
		n = r->generate->first + r->generate->n_tokens;
		done = r->generate->done;
		if (done)
			cr_assert_eq(r->generate->finish,
			             WEIGHTFLOOR__V1__FINISH_REASON__FINISH_REASON_LENGTH, "%s",
			             r->generate->error ? r->generate->error : "");
		wf_ctl_reply_free(r);
	}
	cr_assert_eq(n, N_GEN);
	return code;
}

/* SetResidency of model to target on the worker; returns the status code. */
static int set_residency(struct agt_worker *w, const char *model, Weightfloor__V1__Residency target,
                         char **msg)
{
	Weightfloor__V1__SetResidency sr = WEIGHTFLOOR__V1__SET_RESIDENCY__INIT;
	sr.model = (char *)model;
	sr.target = target;
	Weightfloor__V1__Request req = WEIGHTFLOOR__V1__REQUEST__INIT;
	req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_SET_RESIDENCY;
	req.set_residency = &sr;
	Weightfloor__V1__Reply *r = NULL;
	struct wf_diag d = {{0}};
	int rc = agt_call_url(w->url, &req, 60000, &r, &d);
	cr_assert_eq(rc, 0, "set residency: %s", wf_diag_str(&d, rc));
	int code = r->code;
	if (msg)
		*msg = strdup(r->message ? r->message : "");
	wf_ctl_reply_free(r);
	return code;
}

#define RES(x) WEIGHTFLOOR__V1__RESIDENCY__RESIDENCY_##x

/* Waits (10 s) for needle in the worker's log. */
static char *wait_log(struct agt_worker *w, const char *needle)
{
	int64_t end = agt_now_ms() + 10000;
	for (;;) {
		char *log = agt_worker_log(w);
		if (strstr(log, needle))
			return log;
		if (agt_now_ms() > end)
			cr_assert_fail("no '%s' in the worker's log:\n%s", needle, log);
		free(log);
		agt_sleep_ms(50);
	}
}

/* What the engine and "other" hold, from a worker with room: the engine's scratchpad (its device
 * memory without resident experts, as the engine metrics report it) and the loaded weights. */
static void measure(struct fixture *f, uint64_t *engine, uint64_t *other)
{
	struct agt_worker w;
	spawn(f, &w, "wbig", 64u << 20);
	cr_assert_eq(generate(f, &w, NULL), AGT_ST(OK));
	cr_assert_eq(set_residency(&w, "other", RES(DEVICE), NULL), AGT_ST(OK));
	Weightfloor__V1__Reply *r = status(&w);
	Weightfloor__V1__ModelResidency *m = entry(r, "tiny");
	cr_assert(m && m->engine, "no engine for tiny after a Generate");
	*engine = m->scratchpad_bytes;
	m = entry(r, "other");
	cr_assert(m && m->device_bytes > 0);
	*other = m->device_bytes;
	wf_ctl_reply_free(r);
	cr_assert_gt(*engine, 0);
	cr_assert_lt(*other, *engine, "the budgets below assume the weights are the smaller");
}

Test(engine_budget, generate_charges_the_engine_and_logs_its_event)
{
	struct fixture f;
	setup(&f, "wf-ebud1");
	struct agt_worker w;
	spawn(&f, &w, "w1", 64u << 20);
	const uint64_t before = used(&w);
	cr_assert_eq(before, 0, "device_used_bytes %" PRIu64 " before anything ran", before);
	cr_assert_eq(generate(&f, &w, NULL), AGT_ST(OK));
	Weightfloor__V1__Reply *r = status(&w);
	const uint64_t after = r->worker_info->device_used_bytes;
	Weightfloor__V1__ModelResidency *m = entry(r, "tiny");
	cr_assert(m && m->engine, "no engine for tiny after a Generate");
	cr_assert_gt(m->scratchpad_bytes, 0);
	/* Without resident experts the engine's device memory is its scratchpad (the expert
	 * cache's slots included). */
	cr_expect_eq(after - before, m->scratchpad_bytes,
	             "device_used_bytes rose by %" PRIu64 ", the engine holds %" PRIu64,
	             after - before, m->scratchpad_bytes);
	/* The weights stayed where they were (the engine reads the floor): only the engine. */
	cr_expect_eq(m->device_bytes, 0);
	const uint64_t engine = m->scratchpad_bytes;
	wf_ctl_reply_free(r);

	/* The engine event line, with the post-fetch figures. */
	char *log = wait_log(&w, "model tiny: completion ");
	const char *line = strstr(log, "model tiny: completion ");
	char one[512];
	snprintf(one, sizeof one, "%.*s", (int)strcspn(line, "\n"), line);
	cr_expect(strstr(one, "tokens/s") && strstr(one, "post-fetch") &&
	              strstr(one, "bytes/token") && strstr(one, "overlap") &&
	              strstr(one, "fallback rate") && strstr(one, "scratchpad") &&
	              strstr(one, "hit rate"),
	          "event line: %s", one);
	char *sp = agt_printf("scratchpad %" PRIu64 " bytes", engine);
	cr_expect(strstr(one, sp), "no '%s' in: %s", sp, one);
	free(sp);
	free(log);

	/* Both fit here: the engine stays, and both count. */
	cr_assert_eq(set_residency(&w, "other", RES(DEVICE), NULL), AGT_ST(OK));
	r = status(&w);
	m = entry(r, "other");
	cr_assert(m && m->device_bytes > 0);
	cr_expect_eq(r->worker_info->device_used_bytes, engine + m->device_bytes);
	cr_expect(entry(r, "tiny")->engine);
	wf_ctl_reply_free(r);
	teardown(&f);
}

Test(engine_budget, engine_larger_than_the_budget_is_refused_and_the_worker_serves)
{
	struct fixture f;
	setup(&f, "wf-ebud2");
	uint64_t engine = 0, other = 0;
	measure(&f, &engine, &other);

	/* Too small for the engine, room for "other": the Generate is refused, "other" stays. */
	struct agt_worker ws;
	spawn(&f, &ws, "wsmall", engine - 1);
	cr_assert_eq(set_residency(&ws, "other", RES(DEVICE), NULL), AGT_ST(OK));
	char *msg = NULL;
	int code = generate(&f, &ws, &msg);
	cr_expect_eq(code, AGT_ST(RESOURCE_EXHAUSTED), "code %d: %s", code, msg);
	cr_expect(strstr(msg, "budget") && strstr(msg, "tiny"), "message: %s", msg);
	free(msg);
	Weightfloor__V1__Reply *r = status(&ws);
	cr_expect_eq(r->worker_info->device_used_bytes, other,
	             "after the refusal %" PRIu64 " used, %" PRIu64 " expected",
	             r->worker_info->device_used_bytes, other);
	Weightfloor__V1__ModelResidency *m = entry(r, "other");
	cr_expect(m && m->state == RES(DEVICE), "'other' was evicted for an engine that failed");
	m = entry(r, "tiny");
	cr_expect(!m || !m->engine, "an engine was left behind");
	wf_ctl_reply_free(r);
	/* Still serving: the same request gets the same answer, the process is alive. */
	cr_expect_eq(generate(&f, &ws, NULL), AGT_ST(RESOURCE_EXHAUSTED));
	cr_assert_eq(waitpid(ws.pid, NULL, WNOHANG), 0, "the worker exited");
	teardown(&f);
}

Test(engine_budget, a_load_that_needs_the_room_evicts_the_engine_then_it_is_rebuilt)
{
	struct fixture f;
	setup(&f, "wf-ebud3");
	uint64_t engine = 0, other = 0;
	measure(&f, &engine, &other);

	/* Room for either, not both. */
	struct agt_worker wm;
	char *msg = NULL;
	spawn(&f, &wm, "wmid", engine + other / 2);
	cr_assert_eq(generate(&f, &wm, NULL), AGT_ST(OK));
	cr_expect_eq(used(&wm), engine);
	/* Loading "other" evicts the idle engine. */
	cr_assert_eq(set_residency(&wm, "other", RES(DEVICE), &msg), AGT_ST(OK), "%s\n%s", msg,
	             agt_worker_log(&wm));
	free(msg);
	Weightfloor__V1__Reply *r = status(&wm);
	cr_expect_eq(r->worker_info->device_used_bytes, other);
	Weightfloor__V1__ModelResidency *m = entry(r, "other");
	cr_expect(m && m->state == RES(DEVICE));
	m = entry(r, "tiny");
	cr_expect(!m || !m->engine, "the engine survived the load that needed its room");
	wf_ctl_reply_free(r);
	free(wait_log(&wm, "model tiny: engine evicted (lru)"));
	/* The next Generate builds it again, and now "other" goes. */
	cr_assert_eq(generate(&f, &wm, NULL), AGT_ST(OK));
	r = status(&wm);
	cr_expect_eq(r->worker_info->device_used_bytes, engine);
	m = entry(r, "tiny");
	cr_expect(m && m->engine && m->engine_completions == 1, "rebuilt engine: %s",
	          m && m->engine ? "completions != 1" : "none");
	m = entry(r, "other");
	cr_expect(m && m->state != RES(DEVICE) && m->state != RES(PINNED_DEVICE),
	          "'other' still on the device beside the engine");
	wf_ctl_reply_free(r);
	cr_assert_eq(waitpid(wm.pid, NULL, WNOHANG), 0, "the worker exited");
	teardown(&f);
}

/* One device weight store (issue 19): a pinned model is what the engine computes from. A worker
 * computing the dense part on the device (--dense-on-device, host device) with the model pinned,
 * then a completion: its device bytes are the model's once plus the engine's own (KV cache,
 * activations, expert slots), within 5% of that sum, never the weights twice; WorkerStatus (and
 * `agentctl workers`) say which sets are resident and which experts the cache holds; an eviction
 * of the idle engine's model succeeds, and the next completion rebuilds (and reloads) it. */
Test(engine_budget, a_pinned_model_is_what_the_engine_runs_from_and_bytes_count_once)
{
	struct fixture f;
	setup(&f, "budget-once");
	struct agt_worker w;
	agt_spawn_worker(f.a, &w, "wonce", NULL, "host:mem=256Mi",
	                 (const char *[]){"--threads", "1", "--dense-on-device",
	                                  "--expert-cache-mb", "2", NULL});
	agt_wait_worker_ready(&w);
	agt_wait_worker_registered(f.a, &w, "wonce");
	cr_assert_eq(set_residency(&w, "tiny", RES(PINNED_DEVICE), NULL), AGT_ST(OK));
	Weightfloor__V1__Reply *r = status(&w);
	const uint64_t model_bytes = entry(r, "tiny")->device_bytes, before = used(&w);
	wf_ctl_reply_free(r);
	cr_assert_gt(model_bytes, 0);
	cr_assert_eq(generate(&f, &w, NULL), AGT_ST(OK));
	r = status(&w);
	Weightfloor__V1__ModelResidency *m = entry(r, "tiny");
	cr_assert(m && m->engine && m->placement, "an engine after the completion");
	const uint64_t after = r->worker_info->device_used_bytes;
	cr_expect_eq(m->device_bytes, model_bytes, "the pinned sets did not grow");
	cr_expect_gt(m->engine_device_bytes, 0, "its KV cache and activations");
	cr_expect_leq(after, (model_bytes + m->engine_device_bytes) * 105 / 100,
	              "device bytes %llu for a model of %llu and an engine of %llu: the weights "
	              "are on the device once",
	              (unsigned long long)after, (unsigned long long)model_bytes,
	              (unsigned long long)m->engine_device_bytes);
	cr_expect_eq(after, before + m->engine_device_bytes, "the engine adds only its own bytes");
	cr_expect(strstr(m->placement, "dense: host") != NULL, "%s", m->placement);
	cr_expect_gt(m->n_sets, 0);
	bool dense = false;
	for (size_t i = 0; i < m->n_sets; i++)
		dense |= strcmp(m->sets[i]->name, "dense") == 0 && m->sets[i]->pinned;
	cr_expect(dense, "the pinned dense set is listed");
	cr_expect_gt(m->expert_slots, 0);
	cr_expect_gt(m->n_cached_experts, 0, "the expert cache holds experts after a completion");
	for (size_t i = 0; i < m->n_cached_experts; i++)
		cr_expect_lt(m->cached_experts[i] >> 16, 3u, "layer of a cached expert");
	wf_ctl_reply_free(r);
	/* agentctl says the same. */
	char *out = NULL, *err = NULL;
	int rc = agt_ctl(f.a, &out, &err, (const char *const[]){"workers", NULL});
	cr_assert_eq(rc, 0, "%s", err);
	cr_expect(strstr(out, "sets: dense") && strstr(out, "expert cache:") &&
	              strstr(out, "placement:"),
	          "agentctl workers:\n%s", out);
	free(out);
	free(err);
	/* Unpin and evict: the idle engine lets go, the model leaves the device; the next
	 * completion rebuilds the engine, loading the dense set again (self-managed). */
	cr_assert_eq(set_residency(&w, "tiny", RES(DEVICE), NULL), AGT_ST(OK));
	char *msg = NULL;
	cr_assert_eq(set_residency(&w, "tiny", RES(HOST), &msg), AGT_ST(OK), "%s", msg);
	free(msg);
	r = status(&w);
	cr_expect_eq(entry(r, "tiny")->device_bytes, 0, "nothing of tiny on the device");
	wf_ctl_reply_free(r);
	cr_assert_eq(generate(&f, &w, NULL), AGT_ST(OK));
	r = status(&w);
	m = entry(r, "tiny");
	cr_expect(m && m->engine && m->n_sets > 0, "rebuilt, with the dense set loaded");
	wf_ctl_reply_free(r);
	teardown(&f);
}
