/* --log-format json end to end: a real wf-agent and a real wf-worker (host device) log as JSON
 * lines while they materialize a floor, refuse a request, register a worker and change its
 * residency; every line either wrote is parsed with json-c (strict, UTF-8 checked) and the
 * events carry their model, worker and request id. */
#include "base/error.h"
#include "common/wftest.h"
#include "tests/agent/agt.h"

#include <criterion/criterion.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

TestSuite(log_json, .fini = agt_fini, .timeout = 120);

static const char *get_str(struct json_object *o, const char *key)
{
	struct json_object *v;
	if (!json_object_object_get_ex(o, key, &v) || !json_object_is_type(v, json_type_string))
		return NULL;
	return json_object_get_string(v);
}

static bool str_is(struct json_object *o, const char *key, const char *want)
{
	const char *s = get_str(o, key);
	return s && strcmp(s, want) == 0;
}

/* Parses every line of log (asserting each is a strict JSON object with ts, level, prog, pid
 * and msg). Returns the lines as a JSON array (the caller's). */
static struct json_object *parse_all(const char *log, const char *prog)
{
	struct json_object *arr = json_object_new_array();
	int n = 0;
	for (const char *p = log; *p;) {
		const char *nl = strchr(p, '\n');
		cr_assert(nl, "the log does not end with a newline:\n%s", log);
		struct json_tokener *tok = json_tokener_new();
		json_tokener_set_flags(tok, JSON_TOKENER_STRICT | JSON_TOKENER_VALIDATE_UTF8);
		struct json_object *o = json_tokener_parse_ex(tok, p, (int)(nl - p));
		enum json_tokener_error e = json_tokener_get_error(tok);
		json_tokener_free(tok);
		cr_assert(o && e == json_tokener_success &&
		              json_object_is_type(o, json_type_object),
		          "line %d is not a JSON object (%s): %.*s", n + 1,
		          json_tokener_error_desc(e), (int)(nl - p), p);
		struct json_object *v;
		cr_assert(get_str(o, "ts") && get_str(o, "level") && get_str(o, "msg"),
		          "line %d lacks ts, level or msg: %.*s", n + 1, (int)(nl - p), p);
		cr_assert(str_is(o, "prog", prog), "line %d: prog: %.*s", n + 1, (int)(nl - p), p);
		cr_assert(json_object_object_get_ex(o, "pid", &v) &&
		              json_object_is_type(v, json_type_int) && json_object_get_int(v) > 0,
		          "line %d: pid: %.*s", n + 1, (int)(nl - p), p);
		json_object_array_add(arr, o);
		n++;
		p = nl + 1;
	}
	return arr;
}

/* The first line whose "event" is event and whose "model" (and "worker") match, or NULL. */
static struct json_object *find_event(struct json_object *arr, const char *event, const char *model,
                                      const char *worker)
{
	for (size_t i = 0; i < json_object_array_length(arr); i++) {
		struct json_object *o = json_object_array_get_idx(arr, i);
		if (str_is(o, "event", event) && (!model || str_is(o, "model", model)) &&
		    (!worker || str_is(o, "worker", worker)))
			return o;
	}
	return NULL;
}

/* Waits (20 s) until path holds needle; returns its text. */
static char *wait_file(const char *path, const char *needle)
{
	int64_t end = agt_now_ms() + 20000;
	for (;;) {
		char *t = wft_read_file(path, NULL);
		if (t && strstr(t, needle))
			return t;
		if (agt_now_ms() > end)
			cr_assert_fail("no '%s' in %s within 20 s:\n%s", needle, path, t ? t : "");
		free(t);
		agt_sleep_ms(50);
	}
}

Test(log_json, agent_and_worker_write_only_json_lines_with_ids)
{
	struct agt *a = agt_new("log-json");
	char *pa = agt_gen(a, "A", 1, NULL);
	agt_start(a, NULL, (const char *const[]){"--log-format", "json", NULL});
	Weightfloor__V1__Reply *r = agt_register(a, "A", pa, false);
	agt_expect_code(r, AGT_ST(OK), "register A");
	wf_ctl_reply_free(r);
	r = agt_ensure(a, "A", true);
	agt_expect_code(r, AGT_ST(OK), "ensure A");
	wf_ctl_reply_free(r);
	/* A refused request, with a name that needs escaping. */
	r = agt_ensure(a, "no\"such\\model\n", false);
	cr_assert_neq(r->code, AGT_ST(OK));
	uint64_t refused_id = r->request_id;
	wf_ctl_reply_free(r);

	struct agt_worker wk;
	agt_spawn_worker(a, &wk, "w-log.0", NULL, NULL,
	                 (const char *const[]){"--log-format", "json", NULL});
	agt_wait_worker_ready(&wk);
	/* Serving is not registered yet: the agent logs the registration. */
	free(wait_file(a->log, "\"worker\":\"w-log.0\",\"event\":\"worker\""));
	Weightfloor__V1__Request req = WEIGHTFLOOR__V1__REQUEST__INIT;
	Weightfloor__V1__Prefetch pf = WEIGHTFLOOR__V1__PREFETCH__INIT;
	pf.model = "A";
	pf.worker_id = "w-log.0";
	req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_PREFETCH;
	req.prefetch = &pf;
	r = agt_call(a, &req, 15000);
	agt_expect_code(r, AGT_ST(OK), "prefetch A on w-log.0");
	wf_ctl_reply_free(r);
	/* The worker logs the load, then reports it; the agent logs the report. */
	free(wait_file(wk.log, "\"event\":\"residency\""));
	free(wait_file(a->log, "\"event\":\"residency\""));
	cr_assert_eq(agt_stop(a, 10000), 0);

	char *log = agt_log(a);
	struct json_object *arr = parse_all(log, "wf-agent");
	cr_assert(find_event(arr, "floor_state", "A", NULL), "no floor_state for A:\n%s", log);
	struct json_object *o = find_event(arr, "request_failed", "no\"such\\model\n", NULL);
	cr_assert(o, "no request_failed naming the model:\n%s", log);
	struct json_object *v;
	cr_assert(json_object_object_get_ex(o, "request_id", &v));
	cr_expect_eq(json_object_get_uint64(v), refused_id, "%s", log);
	/* The test's client gives no name: the field is absent rather than empty. */
	cr_expect_null(get_str(o, "client"), "%s", log);
	cr_expect(str_is(o, "error", "WF_ENOT_FOUND"), "%s", log);
	cr_expect(find_event(arr, "worker", NULL, "w-log.0"), "no worker event:\n%s", log);
	cr_expect(find_event(arr, "residency", "A", "w-log.0"), "no residency event:\n%s", log);
	json_object_put(arr);
	free(log);

	log = wft_read_file(wk.log, NULL);
	cr_assert(log);
	arr = parse_all(log, "wf-worker");
	cr_expect(find_event(arr, "residency", "A", "w-log.0"), "worker log:\n%s", log);
	json_object_put(arr);
	free(log);
}

/* The config key does what the flag does; the flag wins over it. */
Test(log_json, config_key_log_format)
{
	struct agt *a = agt_new("log-cfg");
	char cfg[1024];
	snprintf(cfg, sizeof cfg, "%s/agent.json", a->dir);
	FILE *f = fopen(cfg, "w");
	cr_assert(f);
	fprintf(f, "{\"log_format\": \"json\"}\n");
	fclose(f);
	agt_start(a, NULL, (const char *const[]){"--config", cfg, NULL});
	cr_assert_eq(agt_stop(a, 10000), 0);
	char *log = agt_log(a);
	json_object_put(parse_all(log, "wf-agent"));
	free(log);

	agt_start(a, NULL, (const char *const[]){"--config", cfg, "--log-format", "text", NULL});
	cr_assert_eq(agt_stop(a, 10000), 0);
	log = agt_log(a);
	cr_assert(log[0] && log[0] != '{' && strstr(log, " info  wf-agent["), "%s", log);
	free(log);

	f = fopen(cfg, "w");
	cr_assert(f);
	fprintf(f, "{\"log_format\": \"xml\"}\n");
	fclose(f);
	pid_t pid = agt_spawn(a, NULL, (const char *const[]){"--config", cfg, NULL});
	cr_assert_gt(pid, 0);
	cr_assert_not(agt_wait_ready(a, 5000), "an agent with log_format xml started");
	log = agt_log(a);
	cr_expect(strstr(log, "'log_format' must be text or json"), "%s", log);
	free(log);
}
