/* Expert post-fetch in wf-worker: a real wf-agent with two workers on ipc:// sockets, one whose
 * engines post-fetch experts to a bandwidth-throttled host device with an expert cache and one
 * whose engines compute every expert on the CPU. On the host device the logits are bitwise
 * those of the CPU path, so `agentctl generate --temp 0` gives the same ids; WorkerStatus (and
 * `agentctl workers --json`) carry the engine's metrics; bad post-fetch settings stop the
 * worker at start with exit status 2. */
#include "common/wftest.h"
#include "tests/agent/agt.h"
#include "tests/http/httpc.h"
#include "tests/worker/wref.h"

#include <criterion/criterion.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/wait.h>
#include <unistd.h>

TestSuite(postfetch_integ, .fini = agt_fini, .timeout = 240);

#define N_GEN 12

/* `agentctl workers --json` once every named worker is listed and reachable. */
static json_object *workers_json(struct agt *a)
{
	char *out = NULL, *err = NULL;
	int rc = agt_ctl(a, &out, &err, (const char *[]){"workers", "--json", NULL});
	cr_assert_eq(rc, 0, "agentctl workers: %s %s", out, err);
	json_object *o = json_tokener_parse(out);
	cr_assert_not_null(o, "not JSON: %s", out);
	free(out);
	free(err);
	return o;
}

/* The entry of worker id in a workers listing (borrowed), NULL when absent or unreachable. */
static json_object *find_worker(json_object *list, const char *id)
{
	json_object *arr = NULL, *v = NULL;
	if (!json_object_object_get_ex(list, "workers", &arr))
		return NULL;
	for (size_t i = 0; i < json_object_array_length(arr); i++) {
		json_object *w = json_object_array_get_idx(arr, i);
		if (json_object_object_get_ex(w, "worker_id", &v) &&
		    strcmp(json_object_get_string(v), id) == 0 &&
		    json_object_object_get_ex(w, "reachable", &v) && json_object_get_boolean(v))
			return w;
	}
	return NULL;
}

/* Greedy ids of one completion on worker id. */
static void generate(struct agt *a, struct agt_worker *w, const char *id, const char *prompt,
                     int32_t *ids)
{
	char *out = NULL, *err = NULL, max[16];
	snprintf(max, sizeof max, "%d", N_GEN);
	int rc = agt_ctl(a, &out, &err,
	                 (const char *[]){"generate", "tiny", "--worker", id, "--prompt-ids",
	                                  prompt, "--max-tokens", max, "--temp", "0",
	                                  "--ignore-eos", "--json", NULL});
	cr_assert_eq(rc, 0, "agentctl generate on %s: %d\n%s\n%s\nworker log:\n%s", id, rc, out,
	             err, agt_worker_log(w));
	size_t n = 0;
	for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
		json_object *o = json_tokener_parse(line), *v = NULL;
		cr_assert_not_null(o, "not JSON: %s", line);
		if (json_object_object_get_ex(o, "id", &v)) {
			cr_assert_lt(n, N_GEN, "more tokens than asked for");
			ids[n++] = json_object_get_int(v);
		}
		json_object_put(o);
	}
	cr_assert_eq(n, N_GEN, "%zu tokens from %s:\n%s", n, id, err);
	free(out);
	free(err);
}

/* The ModelResidency of "tiny" in worker entry w (borrowed). */
static json_object *model_entry(json_object *w)
{
	json_object *arr = NULL, *v = NULL;
	cr_assert(json_object_object_get_ex(w, "models", &arr));
	for (size_t i = 0; i < json_object_array_length(arr); i++) {
		json_object *m = json_object_array_get_idx(arr, i);
		if (json_object_object_get_ex(m, "model", &v) &&
		    strcmp(json_object_get_string(v), "tiny") == 0)
			return m;
	}
	cr_assert_fail("no model tiny in %s", json_object_to_json_string(w));
	return NULL;
}

static double num(json_object *m, const char *key)
{
	json_object *v = NULL;
	cr_assert(json_object_object_get_ex(m, key, &v), "no %s in %s", key,
	          json_object_to_json_string(m));
	return json_object_get_double(v);
}

Test(postfetch_integ, ids_equal_the_cpu_path_and_metrics_are_reported)
{
	char prompt[1024];
	char *gguf = wref_model("qwen3moe-tiny-q4_k_m", prompt, sizeof prompt);
	struct agt *a = agt_new("wf-pf");
	char *marg = agt_printf("tiny=%s", gguf);
	agt_start(a, NULL, (const char *[]){"--model", marg, NULL});
	struct agt_worker wpf, wcpu, wdev;
	/* The environment turns post-fetch off for both; wpf's flag turns it back on (flags over
	 * the environment), wcpu follows the environment. */
	setenv("WF_POSTFETCH_ENABLE", "0", 1);
	agt_spawn_worker(a, &wpf, "wpf", NULL, "host:mem=256Mi,bw=1G",
	                 (const char *[]){"--threads", "1", "--postfetch", "enable=1",
	                                  "--postfetch", "block_on_miss=1", "--expert-cache-mb",
	                                  "8", NULL});
	agt_spawn_worker(a, &wcpu, "wcpu", NULL, NULL, (const char *[]){"--threads", "1", NULL});
	unsetenv("WF_POSTFETCH_ENABLE");
	/* The device forward pass, as on a GPU: dense weights and KV cache on the device, the last
	 * layer's experts resident, the others post-fetched into a cache that keeps them whole. */
	const uint16_t mport = httpc_free_port();
	char *maddr = agt_printf("127.0.0.1:%u", (unsigned)mport);
	agt_spawn_worker(a, &wdev, "wdev", NULL, "host:mem=256Mi,bw=1G",
	                 (const char *[]){"--threads", "1", "--dense-on-device",
	                                  "--expert-cache-mb", "8", "--n-cpu-moe", "2", "--metrics",
	                                  maddr, NULL});
	agt_wait_worker_registered(a, &wpf, "wpf");
	agt_wait_worker_registered(a, &wcpu, "wcpu");
	agt_wait_worker_registered(a, &wdev, "wdev");

	int32_t ids_pf[N_GEN], ids_cpu[N_GEN];
	generate(a, &wpf, "wpf", prompt, ids_pf);
	generate(a, &wcpu, "wcpu", prompt, ids_cpu);
	for (int i = 0; i < N_GEN; i++)
		cr_expect_eq(ids_pf[i], ids_cpu[i], "token %d: %d with post-fetch, %d without", i,
		             ids_pf[i], ids_cpu[i]);
	int32_t ids_dev[N_GEN];
	generate(a, &wdev, "wdev", prompt, ids_dev);
	for (int i = 0; i < N_GEN; i++)
		cr_expect_eq(ids_dev[i], ids_cpu[i],
		             "token %d: %d on the device path, %d on the cpu", i, ids_dev[i],
		             ids_cpu[i]);
	/* Its engine's figures on /metrics, as Prometheus reads them. */
	struct httpc_reply hr = {0};
	cr_assert_eq(httpc_request(mport, "GET", "/metrics", 5000, &hr), 0);
	cr_assert_eq(hr.status, 200);
	const char *series[] = {"weightfloor_engine_completions_total{model=\"tiny\"} 1",
	                        "weightfloor_engine_tokens_total{model=\"tiny\"}",
	                        "weightfloor_postfetch_bytes_total{model=\"tiny\"}",
	                        "weightfloor_expert_cache_hit_ratio{model=\"tiny\"}",
	                        "weightfloor_device_reserved_bytes"};
	for (size_t i = 0; i < sizeof(series) / sizeof(series[0]); i++)
		cr_expect(strstr(hr.body, series[i]) != NULL, "no %s in:\n%s", series[i], hr.body);
	httpc_reply_fini(&hr);
	free(maddr);
	/* A second completion: the expert cache kept experts across requests. */
	generate(a, &wpf, "wpf", prompt, ids_pf);
	for (int i = 0; i < N_GEN; i++)
		cr_expect_eq(ids_pf[i], ids_cpu[i], "second run, token %d", i);

	json_object *list = workers_json(a);
	json_object *w = find_worker(list, "wpf");
	cr_assert_not_null(w);
	json_object *m = model_entry(w), *v = NULL;
	cr_assert(json_object_object_get_ex(m, "engine", &v) && json_object_get_boolean(v),
	          "no engine metrics: %s", json_object_to_json_string(m));
	cr_expect_eq(num(m, "engine_completions"), 2.0);
	const double tokens = num(m, "engine_tokens");
	cr_expect_geq(tokens, 2.0 * N_GEN, "engine_tokens %g", tokens);
	cr_expect_gt(num(m, "fetch_bytes"), 0.0, "%s", json_object_to_json_string(m));
	cr_expect_gt(num(m, "fetch_experts"), 0.0);
	cr_expect_gt(num(m, "fetch_bytes_per_token"), 0.0);
	cr_expect_leq(num(m, "fetch_bytes_per_token"), num(m, "fetch_bytes"));
	cr_expect_gt(num(m, "scratchpad_bytes"), 0.0);
	/* 8 MiB holds every expert of this model: later steps hit. */
	const double hit = num(m, "cache_hit_rate");
	cr_expect(hit > 0.0 && hit <= 1.0, "cache_hit_rate %g", hit);
	const double hits = num(m, "fetch_hits"), misses = num(m, "fetch_misses");
	cr_expect_float_eq(hit, hits / (hits + misses), 1e-9);
	/* Blocking on a miss: nothing fell back to the CPU. */
	cr_expect_eq(num(m, "fetch_fallback_rate"), 0.0);
	cr_expect_eq(num(m, "fetch_fallbacks"), 0.0);
	const double ov = num(m, "fetch_overlap");
	cr_expect(ov >= -1.0 && ov <= 1.0, "fetch_overlap %g", ov);
	cr_expect_gt(num(m, "decode_tokens_per_s"), 0.0);

	/* Without post-fetch: an engine, no fetches, rates with nothing to divide by are -1. */
	w = find_worker(list, "wcpu");
	cr_assert_not_null(w);
	m = model_entry(w);
	cr_assert(json_object_object_get_ex(m, "engine", &v) && json_object_get_boolean(v));
	cr_expect_eq(num(m, "fetch_bytes"), 0.0);
	cr_expect_eq(num(m, "scratchpad_bytes"), 0.0);
	cr_expect_eq(num(m, "cache_hit_rate"), -1.0);
	cr_expect_eq(num(m, "fetch_fallback_rate"), -1.0);
	cr_expect_gt(num(m, "decode_tokens_per_s"), 0.0);
	json_object_put(list);

	/* The table shows the metrics on a detail line. */
	char *out = NULL, *err = NULL;
	int rc = agt_ctl(a, &out, &err, (const char *[]){"workers", NULL});
	cr_assert_eq(rc, 0, "%s %s", out, err);
	cr_expect(strstr(out, "cache hit") && strstr(out, "tokens/s"), "agentctl workers:\n%s",
	          out);
	free(out);
	free(err);
	free(marg);
	free(gguf);
}

/* wf-worker with args; asserts exit status 2 and a message naming `name`. */
static void expect_refused(struct agt *a, const char *const *args, const char *name)
{
	char *argv[24];
	int n = 0;
	argv[n++] = wft_exe("worker/wf-worker");
	for (size_t i = 0; args[i]; i++)
		argv[n++] = (char *)args[i];
	argv[n++] = "--agent";
	argv[n++] = "none";
	argv[n++] = "--floor-dir";
	argv[n++] = a->floor;
	argv[n++] = "--endpoint";
	argv[n++] = agt_printf("ipc://%s/bad.sock", a->run);
	argv[n] = NULL;
	char *out = NULL, *err = NULL;
	int rc = agt_run(argv, &out, &err, 15, a->dir);
	cr_expect_eq(rc, 2, "wf-worker %s: exit %d\n%s\n%s", args[0], rc, out, err);
	cr_expect(strcasestr(err, name), "wf-worker %s %s: no '%s' in: %s", args[0],
	          args[1] ? args[1] : "", name, err);
	free(out);
	free(err);
}

Test(postfetch_integ, bad_settings_exit_2_naming_the_setting)
{
	struct agt *a = agt_new("wf-pfbad");
	expect_refused(a, (const char *[]){"--postfetch", "block_on_miss=2", NULL},
	               "block_on_miss");
	expect_refused(a, (const char *[]){"--postfetch", "max_transfers=99999", NULL},
	               "max_transfers");
	expect_refused(a, (const char *[]){"--postfetch", "no_such_setting=1", NULL},
	               "no_such_setting");
	expect_refused(a, (const char *[]){"--postfetch", "block_on_miss", NULL}, "NAME=VALUE");
	expect_refused(a, (const char *[]){"--expert-cache-mb", "lots", NULL}, "expert-cache-mb");
	expect_refused(a,
	               (const char *[]){"--postfetch", "enable=0", "--expert-cache-mb", "8", NULL},
	               "expert-cache-mb");
	/* The environment is read too, and refused the same way. */
	setenv("WF_POSTFETCH_FORCE_CPU", "maybe", 1);
	expect_refused(a, (const char *[]){"--id", "x", NULL}, "FORCE_CPU");
	unsetenv("WF_POSTFETCH_FORCE_CPU");
}
