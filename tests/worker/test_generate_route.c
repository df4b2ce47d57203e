/* Completions through the agent with several workers: a Generate naming no worker goes to the
 * worker that holds the model, and more completions than the residency relays allow (2 per
 * worker) are followed through the agent at once. Real wf-agent and wf-worker processes on ipc://
 * sockets; the strict F32 reference model. */
#include "common/wftest.h"
#include "tests/agent/agt.h"
#include "tests/worker/wref.h"

#include <criterion/criterion.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

TestSuite(generate_route, .fini = agt_fini, .timeout = 180);

/* The worker_id of the final JSON line of `agentctl generate --json`. */
static char *final_worker(char *out)
{
	char *found = NULL;
	for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
		json_object *o = json_tokener_parse(line), *v = NULL;
		cr_assert_not_null(o, "not JSON: %s", line);
		if (json_object_object_get_ex(o, "worker_id", &v)) {
			free(found);
			found = strdup(json_object_get_string(v));
		}
		json_object_put(o);
	}
	cr_assert_not_null(found, "no worker_id in the output");
	return found;
}

/* An agent serving the strict F32 reference model as "tiny"; prompt gets its prompt ids. */
static struct agt *start_agent(char *prompt, size_t len)
{
	char *gguf = wref_model("mixtral-tiny-f32", prompt, len);
	struct agt *a = agt_new("wf-route");
	char *marg = agt_printf("tiny=%s", gguf);
	agt_start(a, NULL, (const char *[]){"--model", marg, NULL});
	free(marg);
	free(gguf);
	return a;
}

Test(generate_route, unnamed_worker_goes_to_the_one_holding_the_model)
{
	char prompt[1024];
	struct agt *a = start_agent(prompt, sizeof prompt);
	struct agt_worker w1, w2;
	agt_spawn_worker(a, &w1, "w1", NULL, NULL, (const char *[]){"--threads", "1", NULL});
	agt_spawn_worker(a, &w2, "w2", NULL, NULL, (const char *[]){"--threads", "1", NULL});
	agt_wait_worker_registered(a, &w1, "w1");
	agt_wait_worker_registered(a, &w2, "w2");

	/* Nobody holds the model yet: the agent still picks a (self-managed) worker. */
	char *out = NULL, *err = NULL;
	int rc = agt_ctl(a, &out, &err,
	                 (const char *[]){"generate", "tiny", "--prompt-ids", prompt,
	                                  "--max-tokens", "2", "--temp", "0", "--json", NULL});
	cr_assert_eq(rc, 0, "agentctl: %d\n%s\n%s", rc, out, err);
	char *first = final_worker(out);
	free(out);
	free(err);

	/* Load it on the other worker, and evict it from the first: completions follow it. */
	const char *other = strcmp(first, "w1") == 0 ? "w2" : "w1";
	rc = agt_ctl(a, &out, &err, (const char *[]){"pin", "tiny", "--worker", other, NULL});
	cr_assert_eq(rc, 0, "pin: %s %s", out, err);
	free(out);
	free(err);
	rc = agt_ctl(a, &out, &err, (const char *[]){"evict", "tiny", "--worker", first, NULL});
	free(out);
	free(err);
	int64_t end = agt_now_ms() + 10000;
	char *chosen = NULL;
	while (agt_now_ms() < end) {
		/* The pin's residency report reaches the agent asynchronously: retry until it has.
		 */
		rc = agt_ctl(a, &out, &err,
		             (const char *[]){"generate", "tiny", "--prompt-ids", prompt,
		                              "--max-tokens", "2", "--temp", "0", "--json", NULL});
		cr_assert_eq(rc, 0, "agentctl: %d\n%s\n%s", rc, out, err);
		free(chosen);
		chosen = final_worker(out);
		free(out);
		free(err);
		if (strcmp(chosen, other) == 0)
			break;
		agt_sleep_ms(200);
	}
	cr_expect_str_eq(chosen, other, "the completion went to %s, the model is pinned on %s",
	                 chosen, other);
	free(chosen);
	free(first);
}

Test(generate_route, more_completions_than_residency_relays_at_once)
{
	char prompt[1024];
	struct agt *a = start_agent(prompt, sizeof prompt);
	struct agt_worker w1;
	agt_spawn_worker(a, &w1, "w1", NULL, NULL, (const char *[]){"--threads", "1", NULL});
	agt_wait_worker_registered(a, &w1, "w1");
	/* Five clients at once, each following a 48-token completion (ignoring EOS) through the
	 * agent: with 2 relays per worker the third would be refused with UNAVAILABLE. */
	enum { N = 5 };
	pid_t kids[N];
	for (int i = 0; i < N; i++) {
		kids[i] = fork();
		cr_assert_geq(kids[i], 0);
		if (kids[i] == 0) {
			char *o = NULL, *e = NULL;
			int r =
			    agt_ctl(a, &o, &e,
			            (const char *[]){"generate", "tiny", "--prompt-ids", prompt,
			                             "--max-tokens", "48", "--ignore-eos", "--temp",
			                             "0.8", "--seed", "7", "--json", NULL});
			if (r != 0)
				fprintf(stderr, "client %d: exit %d\n%s\n%s\n", i, r, o, e);
			_exit(r == 0 ? 0 : 1);
		}
	}
	int failed = 0;
	for (int i = 0; i < N; i++) {
		int st;
		cr_assert_eq(waitpid(kids[i], &st, 0), kids[i]);
		failed += !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	}
	cr_expect_eq(failed, 0, "%d of %d concurrent completions failed; worker log:\n%s", failed,
	             N, agt_worker_log(&w1));
}

/* External residency: a model the control plane sends back to disk loses its engine, so the
 * worker no longer holds its floor and the next Generate is refused until the model is attached
 * again. */
Test(generate_route, disk_residency_drops_the_engine)
{
	char prompt[1024];
	struct agt *a = start_agent(prompt, sizeof prompt);
	struct agt_worker w1;
	agt_spawn_worker(a, &w1, "w1", NULL, NULL,
	                 (const char *[]){"--threads", "1", "--mode", "external", NULL});
	agt_wait_worker_registered(a, &w1, "w1");
	const char *gen[] = {
	    "generate", "tiny", "--prompt-ids", prompt, "--max-tokens", "2", "--temp", "0", NULL};
	char *out = NULL, *err = NULL;
	/* Not attached yet: refused. */
	cr_expect_neq(agt_ctl(a, &out, &err, gen), 0, "%s", out);
	cr_expect(err && strstr(err, "NOT_RESIDENT"), "%s", err ? err : "");
	free(out);
	free(err);
	int rc = agt_ctl(a, &out, &err, (const char *[]){"residency", "tiny", "host", NULL});
	cr_assert_eq(rc, 0, "residency host: %s %s", out, err);
	free(out);
	free(err);
	rc = agt_ctl(a, &out, &err, gen);
	cr_assert_eq(rc, 0, "generate after attach: %s %s\n%s", out, err, agt_worker_log(&w1));
	free(out);
	free(err);
	rc = agt_ctl(a, &out, &err, (const char *[]){"residency", "tiny", "disk", NULL});
	cr_assert_eq(rc, 0, "residency disk: %s %s", out, err);
	free(out);
	free(err);
	rc = agt_ctl(a, &out, &err, gen);
	cr_expect_neq(rc, 0, "a model back on disk still generated: %s", out);
	cr_expect(err && strstr(err, "NOT_RESIDENT"), "%s", err ? err : "");
	free(out);
	free(err);
}

/* Copies the reference model with its general.architecture value rewritten to ARCH (same
 * length), the way a GGUF of an architecture the engine does not run looks to the worker. */
static char *copy_with_arch(const char *src, const char *dir, const char *arch)
{
	size_t len = 0;
	char *buf = wft_read_file(src, &len);
	cr_assert_not_null(buf, "%s", src);
	static const char key[] = "general.architecture";
	char *at = memmem(buf, len, key, sizeof key - 1);
	cr_assert_not_null(at, "no general.architecture in %s", src);
	char *val = at + sizeof key - 1 + 4 + 8; /* type u32, string length u64 */
	uint64_t n;
	memcpy(&n, val - 8, 8);
	cr_assert_eq(n, strlen(arch), "the value is %llu bytes", (unsigned long long)n);
	memcpy(val, arch, n);
	char *dst = agt_printf("%s/%s.gguf", dir, arch);
	FILE *f = fopen(dst, "wb");
	cr_assert_not_null(f);
	cr_assert_eq(fwrite(buf, 1, len, f), len);
	cr_assert_eq(fclose(f), 0);
	free(buf);
	return dst;
}

/* A model of an architecture the engine does not run is refused with the reason, and the worker
 * goes on serving the model it can run. */
Test(generate_route, unsupported_model_refused_and_the_other_served)
{
	char prompt[1024];
	char *gguf = wref_model("mixtral-tiny-f32", prompt, sizeof prompt);
	struct agt *a = agt_new("wf-route");
	char *bad = copy_with_arch(gguf, a->models, "lxama");
	char *marg = agt_printf("tiny=%s", gguf), *barg = agt_printf("odd=%s", bad);
	agt_start(a, NULL, (const char *[]){"--model", marg, "--model", barg, NULL});
	struct agt_worker w1;
	agt_spawn_worker(a, &w1, "w1", NULL, NULL, (const char *[]){"--threads", "1", NULL});
	agt_wait_worker_registered(a, &w1, "w1");
	char *out = NULL, *err = NULL;
	int rc = agt_ctl(
	    a, &out, &err,
	    (const char *[]){"generate", "odd", "--prompt-ids", prompt, "--max-tokens", "2", NULL});
	cr_expect_neq(rc, 0, "an unsupported architecture generated: %s", out);
	cr_expect(err && strstr(err, "lxama") && strstr(err, "not supported"), "%s",
	          err ? err : "");
	free(out);
	free(err);
	for (int i = 0; i < 2; i++) {
		rc = agt_ctl(a, &out, &err,
		             (const char *[]){"generate", "tiny", "--prompt-ids", prompt,
		                              "--max-tokens", "2", "--temp", "0", NULL});
		cr_expect_eq(rc, 0, "the good model after the bad one: %s %s\n%s", out, err,
		             agt_worker_log(&w1));
		free(out);
		free(err);
	}
	free(marg);
	free(barg);
	free(bad);
	free(gguf);
}
