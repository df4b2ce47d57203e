/* The refresh seam end to end (docs/ARCHITECTURE.md "Changing weights while serving"): a real
 * wf-agent and wf-worker (host device, the dense part on the device from the store's copies).
 * The agent publishes new bytes of a tensor into the model's floor (PublishTensors, as
 * `agentctl publish` does); the worker hears the PUBLISHED event, the store re-uploads its copy,
 * the engine swaps at its step boundary: the next completion's greedy tokens are those of a fresh
 * engine on a model file holding the new bytes (`wf-worker eval`), without a restart or a reload
 * of the model. Waits poll states with deadlines. */
#include "base/error.h"
#include "common/wftest.h"
#include "model/model.h"
#include "proto/status.h"
#include "tests/agent/agt.h"

#include <criterion/criterion.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

TestSuite(agent_refresh, .fini = agt_fini, .timeout = 240);

#define PROMPT "1,17,300,42,99,7,256,311"
#define N_GEN  "12"

/* The greedy ids of a completion of PROMPT on the worker, through the agent. */
static char *generate_ids(struct agt *a)
{
	char *ids = agt_generate_ids(a, "m", NULL, PROMPT, N_GEN);
	cr_assert_not_null(ids, "agentctl generate failed");
	return ids;
}

/* A copy of model file src at dst in which tensor `to` holds the bytes of tensor `from` (same
 * type and size): the new version of the model, as a file. */
static void write_swapped(const char *src, const char *dst, const struct wf_tensor *to,
                          const struct wf_tensor *from)
{
	size_t len = 0;
	uint8_t *b = (uint8_t *)wft_read_file(src, &len);
	cr_assert_not_null(b, "%s", src);
	memcpy(b + to->offset, b + from->offset, to->nbytes);
	FILE *f = fopen(dst, "wb");
	cr_assert_not_null(f, "%s", dst);
	cr_assert_eq(fwrite(b, 1, len, f), len);
	cr_assert_eq(fclose(f), 0);
	free(b);
}

Test(agent_refresh, a_published_tensor_reaches_the_next_completion)
{
	struct agt *a = agt_new("refresh");
	char *pa = agt_gen(a, "m", 3, NULL);
	struct wf_model *m = NULL;
	struct wf_diag d = {{0}};
	cr_assert_eq(wf_model_open(pa, &m, &d), 0, "%s", d.msg);
	/* The new version: layer 0's query projection takes layer 1's bytes (same type and shape),
	 * which changes every logit. */
	const struct wf_tensor *changed = wf_model_find_tensor(m, "blk.0.attn_q.weight"),
	                       *source = wf_model_find_tensor(m, "blk.1.attn_q.weight");
	cr_assert(changed && source);
	cr_assert_eq(changed->nbytes, source->nbytes);
	cr_assert_eq(changed->dtype, source->dtype);
	char *pb = agt_printf("%s/b.gguf", a->dir);
	write_swapped(pa, pb, changed, source);
	char *want_a = agt_eval_ids(a, pa, PROMPT, N_GEN),
	     *want_b = agt_eval_ids(a, pb, PROMPT, N_GEN);
	cr_assert_str_neq(want_a, want_b, "the two versions must generate differently");
	size_t len = 0;
	uint8_t *bytes = (uint8_t *)wft_read_file(pa, &len);
	uint8_t *new_bytes = malloc(source->nbytes);
	memcpy(new_bytes, bytes + source->offset, source->nbytes);
	free(bytes);

	char *marg = agt_printf("m=%s", pa);
	agt_start(a, NULL, (const char *[]){"--model", marg, "--spare", "8M", NULL});
	struct agt_worker w;
	agt_spawn_worker(a, &w, "w1", NULL, "host:mem=512Mi",
	                 (const char *const[]){"--dense-on-device", "--threads", "2", NULL});
	agt_wait_worker_registered(a, &w, "w1");
	agt_ensure_ok(a, "m");

	char *got = generate_ids(a);
	cr_expect_str_eq(got, want_a, "before the publish: the model as materialized");
	free(got);

	/* The worker must be listening before the publish it is to hear (PUB keeps no history):
	 * publish the tensor's current bytes again until the worker has applied one. */
	size_t alen = 0;
	uint8_t *abytes = (uint8_t *)wft_read_file(pa, &alen);
	for (int i = 0;; i++) {
		Weightfloor__V1__Reply *rep =
		    agt_publish(a, "m", "blk.0.attn_q.weight", abytes + changed->offset,
		                changed->nbytes, false);
		agt_expect_code(rep, AGT_ST(OK), "sync publish");
		wf_ctl_reply_free(rep);
		char *log = agt_worker_log(&w);
		const bool heard = strstr(log, "refreshed in") != NULL;
		free(log);
		if (heard)
			break;
		cr_assert_lt(i, 60, "the worker never applied a publish");
		agt_sleep_ms(200);
	}
	free(abytes);
	got = generate_ids(a);
	cr_expect_str_eq(got, want_a, "the same bytes again: nothing changes");
	free(got);

	/* The publish under test. */
	Weightfloor__V1__Reply *rep =
	    agt_publish(a, "m", "blk.0.attn_q.weight", new_bytes, source->nbytes, false);
	agt_expect_code(rep, AGT_ST(OK), "publish");
	const uint64_t gen = rep->publish->generation;
	wf_ctl_reply_free(rep);
	char *line = agt_printf("published at generation %llu", (unsigned long long)gen);
	for (int i = 0;; i++) {
		char *log = agt_worker_log(&w);
		const bool done = strstr(log, line) != NULL;
		cr_assert(!strstr(log, "not applied"), "the worker failed the refresh:\n%s", log);
		free(log);
		if (done)
			break;
		cr_assert_lt(i, 200, "the worker never applied generation %llu",
		             (unsigned long long)gen);
		agt_sleep_ms(100);
	}
	got = generate_ids(a);
	cr_expect_str_eq(got, want_b, "after the publish: a fresh engine's on the new bytes");
	free(got);

	/* Evicting and generating again rebuilds the engine from the store: still the new bytes. */
	char *out = NULL, *err = NULL;
	int rc =
	    agt_ctl(a, &out, &err, (const char *const[]){"evict", "m", "--worker", "w1", NULL});
	cr_expect_eq(rc, 0, "agentctl evict: %s %s", out, err);
	free(out);
	free(err);
	got = generate_ids(a);
	cr_expect_str_eq(got, want_b, "rebuilt after an eviction: the floor's new bytes");
	free(got);

	free(line);
	free(new_bytes);
	free(want_a);
	free(want_b);
	free(marg);
	free(pb);
	free(pa);
	wf_model_close(m);
}
