/* `wf-bench engine` on a tiny wf-gen model with --iterations 1: every row it can measure here
 * comes out with a finite, positive value and ratio (the in-process engine, the bandwidth anchor,
 * a real agent and worker); llama.cpp's rows are skipped with a reason when no llama-bench is
 * given. With WF_LLAMA_BENCH set to a llama-bench (llama.cpp b10573, built outside the
 * repository), its rows are checked too. */
#include "benchrows.h"
#include "common/wftest.h"

#include <criterion/criterion.h>
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *dir;

static void fini(void)
{
	if (dir)
		wft_rmtree(dir);
}

static void expect_measured(const char *out, const char *name)
{
	struct json_object *j = row(out, name);
	cr_assert(j, "no %s row in:\n%s", name, out);
	double v = num(j, "value"), a = num(j, "anchor_value"), r = num(j, "ratio");
	cr_expect(isfinite(v) && v > 0, "%s value %g", name, v);
	cr_expect(isfinite(a) && a > 0, "%s anchor %g", name, a);
	cr_expect(isfinite(r) && r > 0 && fabs(r - v / a) <= 1e-6 * r, "%s ratio %g (%g / %g)",
	          name, r, v, a);
	json_object_put(j);
}

static void expect_skipped(const char *out, const char *name)
{
	struct json_object *j = row(out, name), *s;
	cr_assert(j, "no %s row in:\n%s", name, out);
	cr_expect(json_object_object_get_ex(j, "skipped", &s) && strlen(json_object_get_string(s)),
	          "%s is not skipped with a reason: %s", name, json_object_to_json_string(j));
	json_object_put(j);
}

Test(bench_engine, tiny_model_every_row, .fini = fini, .timeout = 50)
{
	dir = wft_tmpdir("bench-engine");
	char model[4200], out[4200], err[4200];
	snprintf(model, sizeof model, "%s/tiny.gguf", dir);
	snprintf(out, sizeof out, "%s/out.jsonl", dir);
	snprintf(err, sizeof err, "%s/err.txt", dir);
	char *gen[] = {
	    wft_exe("tools/wf-gen"), "--arch", "qwen3moe", "--seed", "3", "-q", "-o", model, NULL};
	cr_assert_eq(wft_run(gen, NULL, NULL, 30), 0, "wf-gen");
	const char *llama = getenv("WF_LLAMA_BENCH");
	char *argv[] = {wft_exe("bench/wf-bench"),
	                "engine",
	                "--json",
	                "--model",
	                model,
	                "--iterations",
	                "1",
	                "--threads",
	                "2",
	                "--dir",
	                dir,
	                llama ? "--llama-bench" : NULL,
	                (char *)llama,
	                NULL};
	int rc = wft_run(argv, out, err, 40);
	char *o = wft_read_file(out, NULL), *e = wft_read_file(err, NULL);
	cr_assert_eq(rc, 0, "wf-bench engine exited %d\nstdout:\n%s\nstderr:\n%s", rc, o, e);
	expect_measured(o, "decode_vs_bandwidth_bound");
	expect_measured(o, "batch8_vs_batch1");
	expect_measured(o, "private_memory_over_model");
	expect_measured(o, "batch8_vs_bandwidth_bound");
	/* Issue 19's: pinned or not before a worker's first token (measured, whatever the ratio:
	 * speed belongs in the benchmark's figures, not in a test). */
	expect_measured(o, "first_token_pinned_vs_unpinned");
	/* Issue 11's rows (two host-device rates each; the first of each is checked). */
	expect_measured(o, "postfetch_vs_cpu_experts");
	expect_measured(o, "cache25_vs_cpu_experts");
	expect_measured(o, "cache_full_vs_resident");
	struct json_object *ov = row(o, "postfetch_overlap");
	cr_assert(ov, "no postfetch_overlap row");
	double f = num(ov, "value");
	cr_expect(f >= 0 && f <= 1, "postfetch_overlap %g is not a fraction", f);
	json_object_put(ov);
	if (llama) {
		expect_measured(o, "decode_vs_llama_cpp");
		expect_measured(o, "prefill_vs_llama_cpp");
		expect_measured(o, "first_token_vs_llama_cpp");
	} else {
		expect_skipped(o, "decode_vs_llama_cpp");
		expect_skipped(o, "prefill_vs_llama_cpp");
		expect_skipped(o, "first_token_vs_llama_cpp");
	}
	free(o);
	free(e);
}
