/* `wf-bench engine --device host:bw=16G` on the tiny reference model (qwen3moe-tiny-q4_k_m, whose
 * context_length is 256) with --iterations 1: the whole device pipeline (dense weights and KV
 * cache on the device, experts resident, on the CPU, post-fetched, cached at 25% and whole)
 * runs in CI, and every dev_* row comes out as a JSON line with a finite, positive value and
 * ratio, naming the device. The llama.cpp GPU row is skipped with a reason, unless
 * WF_LLAMA_BENCH_GPU names a llama-bench (b10573) to run it with. */
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

/* A measured row: value, anchor and ratio finite and positive, ratio = value / anchor; its notes
 * contain each of the words. */
static void expect_measured(const char *out, const char *name, const char *const *words)
{
	struct json_object *j = row(out, name);
	cr_assert(j, "no %s row in:\n%s", name, out);
	double v = num(j, "value"), a = num(j, "anchor_value"), r = num(j, "ratio");
	cr_expect(isfinite(v) && v > 0, "%s value %g", name, v);
	cr_expect(isfinite(a) && a > 0, "%s anchor %g", name, a);
	cr_expect(isfinite(r) && r > 0 && fabs(r - v / a) <= 1e-6 * r, "%s ratio %g (%g / %g)",
	          name, r, v, a);
	const char *notes = str(j, "notes");
	for (; words && *words; words++)
		cr_expect(strstr(notes, *words), "%s notes lack '%s': %s", name, *words, notes);
	json_object_put(j);
}

static char *run_bench(char *const *argv, int *ret_rc)
{
	char out[4200], err[4200];
	snprintf(out, sizeof out, "%s/out.jsonl", dir);
	snprintf(err, sizeof err, "%s/err.txt", dir);
	int rc = wft_run(argv, out, err, 40);
	char *o = wft_read_file(out, NULL), *e = wft_read_file(err, NULL);
	if (rc != 0 && ret_rc == NULL)
		cr_assert_fail("wf-bench exited %d\nstdout:\n%s\nstderr:\n%s", rc, o, e);
	if (ret_rc)
		*ret_rc = rc;
	free(e);
	return o;
}

Test(bench_engine_dev, host_device_every_dev_row, .fini = fini, .timeout = 60)
{
	dir = wft_tmpdir("bench-engine-dev");
	char *model = NULL;
	cr_assert(asprintf(&model, "%s/qwen3moe-tiny-q4_k_m/qwen3moe-tiny-q4_k_m.gguf",
	                   wft_reference_dir()) > 0);
	const char *llama = getenv("WF_LLAMA_BENCH_GPU");
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
	                "--device",
	                "host:bw=16G",
	                llama ? "--llama-bench-gpu" : NULL,
	                (char *)llama,
	                NULL};
	char *o = run_bench(argv, NULL);
	static const char *const dev[] = {"host", NULL};
	static const char *const fetch[] = {"host",     "overlap",    "fallback rate",
	                                    "hit rate", "whole hits", NULL};
	expect_measured(o, "dev_resident", dev);
	expect_measured(o, "dev_cpu_experts", dev);
	expect_measured(o, "dev_postfetch_vs_cpu_experts", fetch);
	expect_measured(o, "dev_cache25_vs_cpu_experts", fetch);
	expect_measured(o, "dev_cache_full_vs_resident", fetch);
	/* the host rows still come first, the device rows beside them */
	expect_measured(o, "postfetch_vs_cpu_experts", NULL);
	/* a cache of every expert, warmed: every lookup of the timed run hits, and runs whole */
	struct json_object *full = row(o, "dev_cache_full_vs_resident");
	cr_expect(strstr(str(full, "notes"), "hit rate 1.000"), "%s", str(full, "notes"));
	cr_expect(!strstr(str(full, "notes"), ", 0 whole hits"), "%s", str(full, "notes"));
	/* no goal on the host device: the goals are a GPU's */
	struct json_object *g;
	cr_expect(!json_object_object_get_ex(full, "goal_op", &g), "%s",
	          json_object_to_json_string(full));
	json_object_put(full);
	struct json_object *l = row(o, "cache25_vs_llama_cpu_moe");
	cr_assert(l, "no cache25_vs_llama_cpu_moe row in:\n%s", o);
	if (llama) {
		json_object_put(l);
		expect_measured(o, "cache25_vs_llama_cpu_moe",
		                (const char *const[]){"-ncmoe", NULL});
	} else {
		cr_expect(strlen(str(l, "skipped")) > 0, "%s", json_object_to_json_string(l));
		json_object_put(l);
	}
	free(o);
	free(model);
}

/* Without --device the mode is what it was: no device rows. */
Test(bench_engine_dev, no_device_no_dev_rows, .fini = fini, .timeout = 60)
{
	dir = wft_tmpdir("bench-engine-dev");
	char *model = NULL;
	cr_assert(asprintf(&model, "%s/qwen3moe-tiny-q4_k_m/qwen3moe-tiny-q4_k_m.gguf",
	                   wft_reference_dir()) > 0);
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
	                NULL};
	char *o = run_bench(argv, NULL);
	struct json_object *j = row(o, "dev_resident");
	cr_expect(!j, "a dev_resident row without --device:\n%s", o);
	json_object_put(j);
	j = row(o, "cache25_vs_llama_cpu_moe");
	cr_expect(!j, "a cache25_vs_llama_cpu_moe row without --device:\n%s", o);
	json_object_put(j);
	free(o);
	free(model);
}

/* --llama-bench-gpu compares with the device rows, so it needs --device. */
Test(bench_engine_dev, llama_gpu_needs_device, .fini = fini, .timeout = 20)
{
	dir = wft_tmpdir("bench-engine-dev");
	char *argv[] = {wft_exe("bench/wf-bench"),  "engine", "--json", "--llama-bench-gpu",
	                "/nonexistent/llama-bench", "--dir",  dir,      NULL};
	int rc;
	char *o = run_bench(argv, &rc);
	cr_expect_eq(rc, 2, "exit %d, stdout:\n%s", rc, o);
	free(o);
}
