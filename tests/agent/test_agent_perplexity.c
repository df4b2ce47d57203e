/* The researchers' loop end to end (issue 20): a real wf-agent and wf-worker serving a reference
 * model. `agentctl perplexity` on the worker gives exactly what the offline `wf-worker
 * perplexity` gives on the same file; the sweep (`--swap-loop --pre-reload CMD`) evaluates,
 * swaps a tensor on disk, reloads, evaluates against the first evaluation's logits, restores
 * the file (the sanity slot: the baseline's PPL bit for bit, KLD that of the model against its
 * own base), and stops when a reload changes nothing. Waits poll states with deadlines. */
#include "common/wftest.h"
#include "model/model.h"
#include "tests/agent/agt.h"

#include <criterion/criterion.h>
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

TestSuite(agent_perplexity, .fini = agt_fini, .timeout = 600);

static char *data_path(const char *rel)
{
	return agt_printf("%s/tests/data/%s", wft_source_dir(), rel);
}

static void copy_file(const char *from, const char *to)
{
	size_t len = 0;
	char *b = wft_read_file(from, &len);
	cr_assert_not_null(b, "%s", from);
	FILE *f = fopen(to, "wb");
	cr_assert_not_null(f, "%s", to);
	cr_assert_eq(fwrite(b, 1, len, f), len);
	cr_assert_eq(fclose(f), 0);
	free(b);
}

static double jnum(struct json_object *o, const char *key)
{
	struct json_object *v = NULL;
	cr_assert(json_object_object_get_ex(o, key, &v), "no %s in %s", key,
	          json_object_to_json_string(o));
	return json_object_get_double(v);
}

Test(agent_perplexity, on_a_worker_and_the_swap_loop)
{
	struct agt *a = agt_new("ppl");
	char *src = data_path("reference/qwen3moe-tiny-q8_0/qwen3moe-tiny-q8_0.gguf");
	char *text = data_path("perplexity/text.txt");
	char *pm = agt_printf("%s/m.gguf", a->models), *po = agt_printf("%s/orig.gguf", a->dir),
	     *pb = agt_printf("%s/b.gguf", a->dir);
	copy_file(src, pm);
	copy_file(src, po);
	/* the swapped version: layer 0's query projection holds layer 1's bytes */
	struct wf_model *m = NULL;
	struct wf_diag d = {{0}};
	cr_assert_eq(wf_model_open(pm, &m, &d), 0, "%s", d.msg);
	const struct wf_tensor *t0 = wf_model_find_tensor(m, "blk.0.attn_q.weight"),
	                       *t1 = wf_model_find_tensor(m, "blk.1.attn_q.weight");
	cr_assert(t0 && t1 && t0->nbytes == t1->nbytes);
	size_t len = 0;
	uint8_t *bytes = (uint8_t *)wft_read_file(pm, &len);
	memcpy(bytes + t0->offset, bytes + t1->offset, t0->nbytes);
	FILE *f = fopen(pb, "wb");
	cr_assert_eq(fwrite(bytes, 1, len, f), len);
	cr_assert_eq(fclose(f), 0);
	free(bytes);

	/* offline, on the file */
	char *exe = wft_exe("worker/wf-worker");
	char *const argv[] = {exe,     "perplexity", "--model",  pm,  "--file", text,
	                      "--ctx", "128",        "--chunks", "4", "--json", NULL};
	char *out = NULL, *err = NULL;
	cr_assert_eq(agt_run(argv, &out, &err, 120, a->dir), 0, "wf-worker perplexity: %s", err);
	struct json_object *off = json_tokener_parse(out);
	cr_assert_not_null(off, "%s", out);
	const double ppl_offline = jnum(off, "ppl");
	json_object_put(off);
	free(out);
	free(err);

	char *marg = agt_printf("m=%s", pm);
	agt_start(a, NULL, (const char *[]){"--model", marg, "--spare", "16M", NULL});
	struct agt_worker w;
	agt_spawn_worker(a, &w, "w1", NULL, NULL, (const char *const[]){"--threads", "2", NULL});
	agt_wait_worker_registered(a, &w, "w1");
	agt_ensure_ok(a, "m");

	/* on the worker: the same figure, to the bit */
	int rc = agt_ctl(a, &out, &err,
	                 (const char *const[]){"perplexity", "m", "--file", text, "--ctx", "128",
	                                       "--chunks", "4", "--json", NULL});
	cr_assert_eq(rc, 0, "agentctl perplexity: exit %d: %s", rc, err);
	struct json_object *on = json_tokener_parse(out);
	cr_assert_not_null(on, "%s", out);
	/* the offline JSON prints 10 significant digits */
	cr_expect_lt(fabs(jnum(on, "ppl") / ppl_offline - 1), 1e-9, "worker %.10f, offline %.10f",
	             jnum(on, "ppl"), ppl_offline);
	cr_expect_eq(jnum(on, "chunks"), 4);
	json_object_put(on);
	free(out);
	free(err);

	/* The sweep: 1 swaps the tensor in, 2 restores the file, 3 changes nothing. */
	char *script = agt_printf("%s/pre.sh", a->dir);
	char *body = agt_printf("case \"$WF_SWEEP_ITERATION\" in\n"
	                        "1) cp '%s' '%s' ;;\n"
	                        "2) cp '%s' '%s' ;;\n"
	                        "esac\n",
	                        pb, pm, po, pm);
	f = fopen(script, "w");
	fputs(body, f);
	fclose(f);
	char *cmd = agt_printf("sh %s", script);
	char *basef = agt_printf("%s/base.kld", a->dir);
	rc = agt_ctl(a, &out, &err,
	             (const char *const[]){"perplexity", "m", "--file", text, "--ctx", "128",
	                                   "--chunks", "4", "--swap-loop", "--pre-reload", cmd,
	                                   "--base-file", basef, "--json", NULL});
	cr_assert_eq(rc, 0, "agentctl perplexity --swap-loop: exit %d: %s\n%s", rc, err, out);
	struct json_object *doc = json_tokener_parse(out), *iters = NULL;
	cr_assert_not_null(doc, "%s", out);
	cr_assert(json_object_object_get_ex(doc, "iterations", &iters), "%s", out);
	cr_assert_eq(json_object_array_length(iters), 3, "iterations 0, 1, 2: %s", out);
	struct json_object *i0 = json_object_array_get_idx(iters, 0),
	                   *i1 = json_object_array_get_idx(iters, 1),
	                   *i2 = json_object_array_get_idx(iters, 2);
	/* row 0: the baseline against its own logits (KLD zero but for the base file's 16-bit
	 * log-probabilities) */
	cr_expect_lt(fabs(jnum(i0, "ppl") / ppl_offline - 1), 1e-6, "%s", out);
	cr_expect_lt(fabs(jnum(i0, "kld")), 1e-5, "%s", out);
	cr_expect_eq(jnum(i0, "same_top"), 1.0);
	cr_expect_eq(jnum(i1, "tensors_changed"), 1);
	cr_expect_gt(fabs(jnum(i1, "ppl") / ppl_offline - 1), 1e-6, "the swap changed nothing");
	cr_expect_gt(jnum(i1, "kld"), 1e-4, "%s", out);
	/* the sanity slot: restored, row 0 to the bit */
	cr_expect_eq(jnum(i2, "tensors_changed"), 1);
	cr_expect_eq(jnum(i2, "ppl"), jnum(i0, "ppl"), "restored: %.17g, baseline %.17g",
	             jnum(i2, "ppl"), jnum(i0, "ppl"));
	cr_expect_eq(jnum(i2, "kld"), jnum(i0, "kld"), "restored: KLD %.17g, baseline %.17g",
	             jnum(i2, "kld"), jnum(i0, "kld"));
	cr_expect_eq(jnum(i2, "same_top"), 1.0);
	json_object_put(doc);
	free(out);
	free(err);

	/* bad input: refused with a message, nothing runs */
	rc = agt_ctl(a, &out, &err, (const char *const[]){"perplexity", "m", NULL});
	cr_expect_eq(rc, 2, "no --file: exit %d", rc);
	free(out);
	free(err);
	rc = agt_ctl(
	    a, &out, &err,
	    (const char *const[]){"perplexity", "m", "--file", text, "--ctx", "4096", NULL});
	cr_expect_eq(rc, 7, "a text too short for the context: exit %d: %s", rc, err);
	cr_expect(strstr(err, "at least"), "%s", err);
	free(out);
	free(err);

	wf_model_close(m);
	free(exe);
	free(src);
	free(text);
	free(pm);
	free(po);
	free(pb);
	free(marg);
	free(script);
	free(body);
	free(cmd);
	free(basef);
}
