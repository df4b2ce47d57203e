/* Completions through the control plane: a real wf-agent and wf-worker on ipc:// sockets, the
 * strict F32 reference model registered with the agent, and `agentctl generate` giving
 * llama.cpp's greedy ids; refused input that leaves the worker serving; and a client that stops
 * reading, whose completion the worker cancels. */
#include "base/error.h"
#include "common/wftest.h"
#include "tests/agent/agt.h"

#include <criterion/criterion.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

TestSuite(generate_integ, .fini = agt_fini, .timeout = 180);

struct ref {
	char *gguf;
	char prompt[1024]; /* "1,17,..." */
	int32_t gen[64];
	size_t n_gen;
};

static void load_ref(struct ref *r)
{
	char *dir = agt_printf("%s/mixtral-tiny-f32", wft_reference_dir());
	char *mp = agt_printf("%s/manifest.json", dir);
	json_object *man = json_object_from_file(mp), *v = NULL;
	cr_assert_not_null(man, "cannot parse %s", mp);
	cr_assert(json_object_object_get_ex(man, "load_this_file", &v));
	r->gguf = agt_printf("%s/%s", dir, json_object_get_string(v));
	cr_assert(json_object_object_get_ex(man, "prompt_ids", &v));
	r->prompt[0] = 0;
	for (size_t i = 0; i < json_object_array_length(v); i++)
		snprintf(r->prompt + strlen(r->prompt), sizeof r->prompt - strlen(r->prompt),
		         "%s%d", i ? "," : "",
		         json_object_get_int(json_object_array_get_idx(v, i)));
	cr_assert(json_object_object_get_ex(man, "generated_ids", &v));
	r->n_gen = json_object_array_length(v);
	cr_assert_leq(r->n_gen, 64);
	for (size_t i = 0; i < r->n_gen; i++)
		r->gen[i] = json_object_get_int(json_object_array_get_idx(v, i));
	json_object_put(man);
	free(dir);
	free(mp);
}

/* An agent with the reference model as "tiny" and one worker. */
static struct agt *start(struct ref *ref, struct agt_worker *w, const char *const *worker_args)
{
	load_ref(ref);
	struct agt *a = agt_new("wf-gen");
	char *marg = agt_printf("tiny=%s", ref->gguf);
	agt_start(a, NULL, (const char *[]){"--model", marg, NULL});
	agt_spawn_worker(a, w, "w1", NULL, NULL, worker_args);
	agt_wait_worker_registered(a, w, "w1"); /* the Generates go through the agent */
	free(marg);
	return a;
}

Test(generate_integ, agentctl_greedy_ids_equal_llama_cpp)
{
	struct ref ref;
	struct agt_worker w;
	struct agt *a = start(&ref, &w, (const char *[]){"--threads", "2", NULL});
	char *out = NULL, *err = NULL, *max = agt_printf("%zu", ref.n_gen);
	int rc = agt_ctl(a, &out, &err,
	                 (const char *[]){"generate", "tiny", "--prompt-ids", ref.prompt,
	                                  "--max-tokens", max, "--temp", "0", "--json", NULL});
	cr_assert_eq(rc, 0, "agentctl: %d\n%s\n%s\nworker log:\n%s", rc, out, err,
	             agt_worker_log(&w));
	/* JSON lines: one per token, then the end. */
	size_t n = 0;
	json_object *last = NULL;
	for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
		json_object *o = json_tokener_parse(line), *v = NULL;
		cr_assert_not_null(o, "not JSON: %s", line);
		if (json_object_object_get_ex(o, "id", &v)) {
			cr_assert_lt(n, ref.n_gen, "more tokens than asked for");
			cr_assert_eq(json_object_get_int(v), ref.gen[n],
			             "token %zu: %d, llama.cpp %d", n, json_object_get_int(v),
			             ref.gen[n]);
			n++;
			json_object_put(o);
		} else {
			json_object_put(last);
			last = o;
		}
	}
	cr_assert_eq(n, ref.n_gen);
	cr_assert_not_null(last);
	json_object *v = NULL;
	cr_assert(json_object_object_get_ex(last, "finish", &v));
	cr_assert_str_eq(json_object_get_string(v), "length");
	cr_assert(json_object_object_get_ex(last, "decode_tokens_per_s", &v));
	cr_assert_gt(json_object_get_double(v), 0.0);
	cr_assert(json_object_object_get_ex(last, "generated_tokens", &v));
	cr_assert_eq((size_t)json_object_get_int(v), ref.n_gen);
	json_object_put(last);
	free(out);
	free(err);

	/* A text prompt, the human output: text on stdout, tokens/s on stderr. */
	rc = agt_ctl(a, &out, &err,
	             (const char *[]){"generate", "tiny", "Hello", "--max-tokens", "4", NULL});
	cr_assert_eq(rc, 0, "%s\n%s", out, err);
	cr_assert(strstr(err, "tokens/s"), "stderr: %s", err);
	free(out);
	free(err);
	free(max);
}

/* Each refused with its exit code and a message naming the fault; the worker still serves. */
Test(generate_integ, bad_input_refused_worker_keeps_serving)
{
	struct ref ref;
	struct agt_worker w;
	struct agt *a = start(&ref, &w, NULL);
	struct {
		const char *const *args;
		int exit_code;
		const char *says;
	} cases[] = {
	    {(const char *[]){"generate", "tiny", "Hi", "--top-p", "-0.5", NULL}, 7, "top_p"},
	    {(const char *[]){"generate", "tiny", "Hi", "--repeat-penalty", "-1", NULL}, 7,
	     "repeat_penalty"},
	    {(const char *[]){"generate", "tiny", "Hi", "--top-k", "-3", NULL}, 7, "top_k"},
	    {(const char *[]){"generate", "tiny", "Hi", "--min-p", "1.5", NULL}, 7, "min_p"},
	    {(const char *[]){"generate", "tiny", "", NULL}, 7, "empty prompt"},
	    {(const char *[]){"generate", "nosuch", "Hi", NULL}, 3, "nosuch"},
	    {(const char *[]){"generate", "tiny", "--prompt-ids", "1,2,99999", NULL}, 7,
	     "vocabulary"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		char *out = NULL, *err = NULL;
		int rc = agt_ctl(a, &out, &err, cases[i].args);
		cr_assert_eq(rc, cases[i].exit_code, "case %zu: exit %d, want %d: %s", i, rc,
		             cases[i].exit_code, err);
		cr_assert(strstr(err, cases[i].says), "case %zu: '%s' does not say '%s'", i, err,
		          cases[i].says);
		free(out);
		free(err);
	}
	/* A prompt longer than the model's context (256). */
	char ids[4096] = "1";
	for (int i = 1; i < 300; i++)
		strcat(ids, ",5");
	char *out = NULL, *err = NULL;
	int rc =
	    agt_ctl(a, &out, &err, (const char *[]){"generate", "tiny", "--prompt-ids", ids, NULL});
	cr_assert_eq(rc, 7, "exit %d: %s", rc, err);
	cr_assert(strstr(err, "context"), "%s", err);
	free(out);
	free(err);
	/* Still serving, and still right. */
	char *max = agt_printf("%zu", ref.n_gen);
	rc = agt_ctl(a, &out, &err,
	             (const char *[]){"generate", "tiny", "--prompt-ids", ref.prompt,
	                              "--max-tokens", max, "--json", NULL});
	cr_assert_eq(rc, 0, "%s", err);
	cr_assert_eq((size_t)agt_count(out, "\"id\":"), ref.n_gen);
	char *first = agt_printf("\"id\":%d,", ref.gen[0]);
	cr_assert(strstr(out, first), "%s", out);
	cr_assert_eq(waitpid(w.pid, NULL, WNOHANG), 0, "the worker exited");
	free(first);
	free(max);
	free(out);
	free(err);
}

static Weightfloor__V1__Reply *read_gen(const char *url, uint64_t id, uint32_t after)
{
	Weightfloor__V1__GenerateRead rd = WEIGHTFLOOR__V1__GENERATE_READ__INIT;
	rd.completion_id = id;
	rd.after = after;
	Weightfloor__V1__Request req = WEIGHTFLOOR__V1__REQUEST__INIT;
	req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_GENERATE_READ;
	req.generate_read = &rd;
	Weightfloor__V1__Reply *r = NULL;
	struct wf_diag d = {{0}};
	int rc = agt_call_url(url, &req, 5000, &r, &d);
	cr_assert_eq(rc, 0, "read: %s", wf_diag_str(&d, rc));
	return r;
}

/* A client that starts a long completion and stops reading: after its idle time-out the worker
 * cancels it, and the completion stays readable to say so. The model is a wf-gen one with a
 * 2048-token context on one thread, so 2000 tokens take far longer than the time-out. */
Test(generate_integ, client_gone_cancels)
{
	struct agt *a = agt_new("wf-gen-gone");
	char *pm = agt_gen(a, "m", 7, NULL);
	char *marg = agt_printf("m=%s", pm);
	agt_start(a, NULL, (const char *[]){"--model", marg, NULL});
	struct agt_worker w;
	agt_spawn_worker(a, &w, "w1", NULL, NULL, (const char *[]){"--threads", "1", NULL});
	agt_wait_worker_ready(&w);

	Weightfloor__V1__Generate g = WEIGHTFLOOR__V1__GENERATE__INIT;
	g.model = "m";
	g.prompt = "Once upon a time";
	g.max_tokens = 2000;
	g.ignore_eos = true;
	g.idle_timeout_ms = 300;
	Weightfloor__V1__Request req = WEIGHTFLOOR__V1__REQUEST__INIT;
	req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_GENERATE;
	req.generate = &g;
	Weightfloor__V1__Reply *r = NULL;
	struct wf_diag d = {{0}};
	int rc = agt_call_url(w.url, &req, 60000, &r, &d);
	cr_assert_eq(rc, 0, "generate: %s", wf_diag_str(&d, rc));
	cr_assert_eq(r->code, AGT_ST(OK), "%s\n%s", r->message, agt_worker_log(&w));
	uint64_t id = r->generate->completion_id;
	wf_ctl_reply_free(r);
	/* Stop reading. Each look below is itself a read (it would keep the completion alive), so
	 * wait longer before each one: the worker's reaper ticks every 250 ms. */
	bool canceled = false;
	for (int wait = 800; wait <= 6400 && !canceled; wait *= 2) {
		agt_sleep_ms(wait);
		r = read_gen(w.url, id, 0);
		cr_assert_eq(r->code, AGT_ST(OK), "read: %s", r->message);
		if (r->generate->done) {
			cr_assert_eq(r->generate->finish,
			             WEIGHTFLOOR__V1__FINISH_REASON__FINISH_REASON_CANCELED,
			             "finished by itself (%d) before the time-out could act",
			             (int)r->generate->finish);
			cr_assert_lt(r->generate->timings->generated_tokens, 2000);
			canceled = true;
		}
		wf_ctl_reply_free(r);
	}
	cr_assert(canceled, "not canceled after the client stopped reading");
	free(marg);
	free(pm);
}
