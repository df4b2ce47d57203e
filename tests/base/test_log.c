/* base/log: both line formats, the fields, escaping (text: control bytes; JSON: quotes,
 * backslashes, control bytes, invalid UTF-8) and the journal prefix. Each test sends fd 2 to a
 * file of its own (Criterion runs every test in its own process) and reads back what was
 * written. */
#include "base/error.h"
#include "base/log.h"

#include <criterion/criterion.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char path[] = "/tmp/wf-test-log-XXXXXX";

static void capture_stderr(void)
{
	int fd = mkstemp(path);
	cr_assert_geq(fd, 0);
	cr_assert_geq(dup2(fd, STDERR_FILENO), 0);
	close(fd);
	unsetenv("JOURNAL_STREAM");
}

/* Everything written so far (malloc'ed); removes the file. */
static char *captured(void)
{
	FILE *f = fopen(path, "r");
	cr_assert(f);
	static char buf[1 << 17];
	size_t n = fread(buf, 1, sizeof buf - 1, f);
	fclose(f);
	buf[n] = 0;
	unlink(path);
	return strdup(buf);
}

static int count_lines(const char *s)
{
	int n = 0;
	for (; *s; s++)
		n += *s == '\n';
	return n;
}

/* Parses one line as strict JSON with UTF-8 validation; asserts it is an object. */
static struct json_object *parse_line(const char *line)
{
	struct json_tokener *tok = json_tokener_new();
	json_tokener_set_flags(tok, JSON_TOKENER_STRICT | JSON_TOKENER_VALIDATE_UTF8);
	size_t len = strcspn(line, "\n");
	struct json_object *o = json_tokener_parse_ex(tok, line, (int)len);
	enum json_tokener_error e = json_tokener_get_error(tok);
	json_tokener_free(tok);
	cr_assert(o && e == json_tokener_success, "not strict JSON (%s): %.*s",
	          json_tokener_error_desc(e), (int)len, line);
	cr_assert(json_object_is_type(o, json_type_object), "not an object: %s", line);
	return o;
}

static const char *get_str(struct json_object *o, const char *key)
{
	struct json_object *v;
	if (!json_object_object_get_ex(o, key, &v) || !json_object_is_type(v, json_type_string))
		return NULL;
	return json_object_get_string(v);
}

Test(log, text_line_has_prefix_fields_and_message)
{
	capture_stderr();
	wf_log_init("wf-test", WF_LOG_INFO);
	wf_log_event(WF_LOG_WARN,
	             WF_LOG_F(.worker = "gpu0", .model = "qwen", .request_id = 42,
	                      .client = "agentctl", .event = "x", .code = WF_ENOT_FOUND),
	             "ensure_floor: %s", "NOT_FOUND");
	wf_log_info("plain %d", 7);
	char *out = captured();
	cr_assert_eq(count_lines(out), 2, "%s", out);
	char want[128];
	snprintf(want, sizeof want,
	         " warn  wf-test[%d]: worker gpu0: model qwen: request 42 from "
	         "agentctl: ensure_floor: NOT_FOUND\n",
	         (int)getpid());
	cr_assert(strstr(out, want), "no '%s' in:\n%s", want, out);
	/* "YYYY-MM-DDTHH:MM:SS.mmmZ " */
	cr_assert(strlen(out) > 24 && out[4] == '-' && out[10] == 'T' && out[23] == 'Z', "%s", out);
	snprintf(want, sizeof want, " info  wf-test[%d]: plain 7\n", (int)getpid());
	cr_assert(strstr(out, want), "no '%s' in:\n%s", want, out);
	free(out);
}

Test(log, text_escapes_control_bytes_so_one_event_is_one_line)
{
	capture_stderr();
	wf_log_init("wf-test", WF_LOG_INFO);
	wf_log_event(WF_LOG_INFO, WF_LOG_F(.model = "evil\nmodel"), "a\nb\tc\x1b[31md");
	char *out = captured();
	cr_assert_eq(count_lines(out), 1, "%s", out);
	cr_assert(strstr(out, "model evil\\nmodel: a\\nb\\tc\\x1b[31md\n"), "%s", out);
	free(out);
}

Test(log, levels_above_the_maximum_are_dropped)
{
	capture_stderr();
	wf_log_init("wf-test", WF_LOG_WARN);
	wf_log_info("not written");
	wf_log_debug("not written");
	wf_log_error("written");
	char *out = captured();
	cr_assert_eq(count_lines(out), 1, "%s", out);
	cr_assert(strstr(out, "error wf-test"), "%s", out);
	free(out);
}

Test(log, json_line_has_every_field)
{
	capture_stderr();
	wf_log_init("wf-test", WF_LOG_INFO);
	wf_log_set_format(WF_LOG_FORMAT_JSON);
	wf_log_event(WF_LOG_ERROR,
	             WF_LOG_F(.worker = "gpu0", .model = "qwen", .request_id = UINT64_MAX,
	                      .client = "cp-1", .completion = 9, .event = "request_failed",
	                      .code = WF_ENOT_FOUND),
	             "completion %d", 9);
	wf_log_info("no fields");
	char *out = captured();
	cr_assert_eq(count_lines(out), 2, "%s", out);
	struct json_object *o = parse_line(out);
	cr_expect_str_eq(get_str(o, "level"), "error");
	cr_expect_str_eq(get_str(o, "prog"), "wf-test");
	cr_expect_str_eq(get_str(o, "msg"), "completion 9");
	cr_expect_str_eq(get_str(o, "worker"), "gpu0");
	cr_expect_str_eq(get_str(o, "model"), "qwen");
	cr_expect_str_eq(get_str(o, "client"), "cp-1");
	cr_expect_str_eq(get_str(o, "event"), "request_failed");
	cr_expect_str_eq(get_str(o, "error"), "WF_ENOT_FOUND");
	const char *ts = get_str(o, "ts");
	cr_assert(ts && strlen(ts) == 24 && ts[10] == 'T' && ts[23] == 'Z', "ts %s", ts);
	struct json_object *v;
	cr_assert(json_object_object_get_ex(o, "pid", &v));
	cr_expect_eq(json_object_get_int(v), (int)getpid());
	cr_assert(json_object_object_get_ex(o, "request_id", &v));
	cr_expect_eq(json_object_get_uint64(v), UINT64_MAX);
	cr_assert(json_object_object_get_ex(o, "completion", &v));
	cr_expect_eq(json_object_get_uint64(v), 9);
	json_object_put(o);

	/* Unset fields are absent, not empty. */
	o = parse_line(strchr(out, '\n') + 1);
	cr_expect_str_eq(get_str(o, "msg"), "no fields");
	cr_expect_eq(json_object_object_length(o), 5, "%s", json_object_to_json_string(o));
	json_object_put(o);
	free(out);
}

Test(log, json_escapes_quotes_controls_and_invalid_utf8)
{
	capture_stderr();
	wf_log_init("wf-test", WF_LOG_INFO);
	wf_log_set_format(WF_LOG_FORMAT_JSON);
	/* A quote, a backslash, a newline, an escape, a slash, valid UTF-8 (é, €, 😀), a stray
	 * continuation byte, a truncated sequence, an overlong '/' and a surrogate. */
	const char *nasty =
	    "q\"b\\n\nesc\x1b/s é€😀 bad\x80 trunc\xe2\x82 over\xc0\xaf sur\xed\xa0\x80.";
	wf_log_event(WF_LOG_INFO, WF_LOG_F(.model = nasty, .worker = "w\"1"), "%s", nasty);
	char *out = captured();
	cr_assert_eq(count_lines(out), 1, "%s", out);
	cr_expect_null(strstr(out, "\\/"), "slashes need no escape: %s", out);
	struct json_object *o = parse_line(out);
	const char *want =
	    "q\"b\\n\nesc\x1b/s é€😀 bad\xef\xbf\xbd trunc\xef\xbf\xbd\xef\xbf\xbd over"
	    "\xef\xbf\xbd\xef\xbf\xbd sur\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd.";
	cr_expect_str_eq(get_str(o, "msg"), want);
	cr_expect_str_eq(get_str(o, "model"), want);
	cr_expect_str_eq(get_str(o, "worker"), "w\"1");
	json_object_put(o);
	free(out);
}

Test(log, json_stays_one_valid_line_when_the_message_is_cut)
{
	capture_stderr();
	wf_log_init("wf-test", WF_LOG_INFO);
	wf_log_set_format(WF_LOG_FORMAT_JSON);
	/* Every byte escaped six-fold ("\u0001"), and far longer than the message limit. */
	char big[10000];
	memset(big, 1, sizeof big - 1);
	big[sizeof big - 1] = 0;
	wf_log_event(WF_LOG_INFO, WF_LOG_F(.model = big + 9000), "%s", big);
	char *out = captured();
	cr_assert_eq(count_lines(out), 1);
	struct json_object *o = parse_line(out);
	cr_expect_gt(strlen(get_str(o, "msg")), 1000);
	json_object_put(o);
	free(out);
}

/* Under systemd: a "<N>" priority prefix, no timestamp; in JSON the prefix precedes the object
 * (the journal strips it). JOURNAL_STREAM counts only when it names our stderr. */
Test(log, journal_prefix_only_when_journal_stream_is_our_stderr)
{
	capture_stderr();
	struct stat st;
	cr_assert_eq(fstat(STDERR_FILENO, &st), 0);
	char js[64];
	snprintf(js, sizeof js, "%llu:%llu", (unsigned long long)st.st_dev,
	         (unsigned long long)st.st_ino);
	setenv("JOURNAL_STREAM", js, 1);
	wf_log_init("wf-test", WF_LOG_INFO);
	wf_log_event(WF_LOG_WARN, WF_LOG_F(.model = "m"), "text");
	wf_log_set_format(WF_LOG_FORMAT_JSON);
	wf_log_event(WF_LOG_ERROR, WF_LOG_F(.model = "m"), "json");

	/* Another stream (inherited by a child whose stderr went elsewhere): plain lines. */
	snprintf(js, sizeof js, "%llu:%llu", (unsigned long long)st.st_dev,
	         (unsigned long long)st.st_ino + 1);
	setenv("JOURNAL_STREAM", js, 1);
	wf_log_init("wf-test", WF_LOG_INFO);
	wf_log_set_format(WF_LOG_FORMAT_TEXT);
	wf_log_info("plain");
	char *out = captured();
	cr_assert_eq(count_lines(out), 3, "%s", out);
	cr_assert_eq(strncmp(out, "<4>wf-test: model m: text\n", 26), 0, "%s", out);
	const char *second = strchr(out, '\n') + 1;
	cr_assert_eq(strncmp(second, "<3>{", 4), 0, "%s", out);
	struct json_object *o = parse_line(second + 3);
	cr_expect_str_eq(get_str(o, "msg"), "json");
	json_object_put(o);
	const char *third = strchr(second, '\n') + 1;
	cr_assert_neq(third[0], '<', "%s", out);
	cr_assert(strstr(third, " info  wf-test["), "%s", out);
	free(out);
}

Test(log, format_names)
{
	enum wf_log_format f = WF_LOG_FORMAT_MAX;
	cr_expect_eq(wf_log_format_parse("text", &f), 0);
	cr_expect_eq(f, WF_LOG_FORMAT_TEXT);
	cr_expect_eq(wf_log_format_parse("json", &f), 0);
	cr_expect_eq(f, WF_LOG_FORMAT_JSON);
	f = WF_LOG_FORMAT_MAX;
	cr_expect_eq(wf_log_format_parse("JSON", &f), WF_EINVAL);
	cr_expect_eq(wf_log_format_parse("", &f), WF_EINVAL);
	cr_expect_eq(wf_log_format_parse(NULL, &f), WF_EINVAL);
	cr_expect_eq(f, WF_LOG_FORMAT_MAX, "ret_format untouched on failure");
}
