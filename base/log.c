#include "base/log.h"

#include "base/error.h"

#include <json-c/json.h>

#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* A message is cut at this many bytes; an escaped text line or a JSON object stays well within
 * LINE_MAX below even when every byte needs escaping. */
#define MSG_MAX   2048
#define LINE_MAX_ 32768

static const char *log_prog = "weightfloor";
static enum wf_log_level log_max = WF_LOG_INFO;
static enum wf_log_format log_format = WF_LOG_FORMAT_TEXT;
static bool log_journal;

/* JOURNAL_STREAM is "<dev>:<ino>" of the journal's socket; it is inherited by children whose
 * stderr goes elsewhere (a test harness, `2>file`), so it counts only when it names fd 2. */
static bool stderr_is_journal(void)
{
	const char *js = getenv("JOURNAL_STREAM");
	if (!js || !*js)
		return false;
	unsigned long long dev, ino;
	char tail;
	if (sscanf(js, "%llu:%llu%c", &dev, &ino, &tail) != 2)
		return false;
	struct stat st;
	if (fstat(STDERR_FILENO, &st) < 0)
		return false;
	return (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
}

void wf_log_init(const char *prog, enum wf_log_level max_level)
{
	log_prog = prog;
	log_max = max_level;
	log_journal = stderr_is_journal();
}

void wf_log_set_format(enum wf_log_format format)
{
	if (format >= 0 && format < WF_LOG_FORMAT_MAX)
		log_format = format;
}

int wf_log_format_parse(const char *name, enum wf_log_format *ret_format)
{
	if (!name)
		return WF_EINVAL;
	if (strcmp(name, "text") == 0)
		*ret_format = WF_LOG_FORMAT_TEXT;
	else if (strcmp(name, "json") == 0)
		*ret_format = WF_LOG_FORMAT_JSON;
	else
		return WF_EINVAL;
	return 0;
}

static const char *level_name(enum wf_log_level level)
{
	static const char *const names[8] = {"", "", "", "error", "warn", "", "info", "debug"};
	return names[level & 7];
}

struct buf {
	char *p;
	size_t len, cap; /* one byte is always kept for the final newline */
};

static void put(struct buf *b, const char *s, size_t n)
{
	if (b->len + n > b->cap - 1)
		n = b->cap - 1 - b->len;
	memcpy(b->p + b->len, s, n);
	b->len += n;
}

static void putf(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void putf(struct buf *b, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
	va_end(ap);
	if (n > 0)
		b->len += (size_t)n < b->cap - 1 - b->len ? (size_t)n : b->cap - 1 - b->len;
}

/* Text lines: a control byte becomes an escape, so one event is one line whatever it quotes. */
static void put_escaped(struct buf *b, const char *s)
{
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;
		if (c == '\n')
			put(b, "\\n", 2);
		else if (c == '\t')
			put(b, "\\t", 2);
		else if (c < 0x20 || c == 0x7f)
			putf(b, "\\x%02x", c);
		else
			put(b, s, 1);
	}
}

/* Length of the valid UTF-8 sequence at s (1-4), or 0 (a stray, overlong or surrogate). */
static size_t utf8_seq(const unsigned char *s)
{
	if (s[0] < 0x80)
		return 1;
	size_t n;
	uint32_t cp;
	if ((s[0] & 0xe0) == 0xc0)
		n = 2, cp = s[0] & 0x1f;
	else if ((s[0] & 0xf0) == 0xe0)
		n = 3, cp = s[0] & 0x0f;
	else if ((s[0] & 0xf8) == 0xf0)
		n = 4, cp = s[0] & 0x07;
	else
		return 0;
	for (size_t i = 1; i < n; i++) {
		if ((s[i] & 0xc0) != 0x80) /* also stops at the terminating NUL */
			return 0;
		cp = (cp << 6) | (s[i] & 0x3f);
	}
	static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
	if (cp < min[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
		return 0;
	return n;
}

/* A copy of s that is valid UTF-8 (invalid bytes become U+FFFD), for JSON strings. */
static struct json_object *json_str(const char *s)
{
	size_t len = strlen(s), n = 0;
	char stackbuf[512];
	char *out = len * 3 + 1 <= sizeof stackbuf ? stackbuf : malloc(len * 3 + 1);
	if (!out)
		return json_object_new_string("");
	for (const unsigned char *p = (const unsigned char *)s; *p;) {
		size_t k = utf8_seq(p);
		if (k) {
			memcpy(out + n, p, k);
			n += k;
			p += k;
		} else {
			memcpy(out + n, "\xef\xbf\xbd", 3);
			n += 3;
			p++;
		}
	}
	out[n] = 0;
	struct json_object *o = json_object_new_string_len(out, (int)n);
	if (out != stackbuf)
		free(out);
	return o;
}

/* Optional fields: absent when NULL or empty (a client that gave no name). */
static void add_str(struct json_object *o, const char *key, const char *v)
{
	if (v && *v)
		json_object_object_add(o, key, json_str(v));
}

static void render_json(struct buf *b, enum wf_log_level level, const struct wf_log_fields *f,
                        const char *ts, const char *msg)
{
	struct json_object *o = json_object_new_object();
	if (!o) {
		putf(b, "{\"level\":\"%s\",\"msg\":\"(out of memory)\"}", level_name(level));
		return;
	}
	json_object_object_add(o, "ts", json_object_new_string(ts));
	json_object_object_add(o, "level", json_object_new_string(level_name(level)));
	json_object_object_add(o, "prog", json_str(log_prog));
	json_object_object_add(o, "pid", json_object_new_int((int)getpid()));
	json_object_object_add(o, "msg", json_str(msg));
	if (f) {
		add_str(o, "model", f->model);
		add_str(o, "worker", f->worker);
		if (f->request_id)
			json_object_object_add(o, "request_id",
			                       json_object_new_uint64(f->request_id));
		add_str(o, "client", f->client);
		if (f->completion)
			json_object_object_add(o, "completion",
			                       json_object_new_uint64(f->completion));
		add_str(o, "event", f->event);
		if (f->code)
			add_str(o, "error", wf_err_name(f->code));
	}
	const char *s = json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN |
	                                                      JSON_C_TO_STRING_NOSLASHESCAPE);
	put(b, s, strlen(s));
	json_object_put(o);
}

static void render_text_fields(struct buf *b, const struct wf_log_fields *f)
{
	if (!f)
		return;
	if (f->worker && *f->worker) {
		put(b, "worker ", 7);
		put_escaped(b, f->worker);
		put(b, ": ", 2);
	}
	if (f->model && *f->model) {
		put(b, "model ", 6);
		put_escaped(b, f->model);
		put(b, ": ", 2);
	}
	if (f->request_id) {
		putf(b, "request %" PRIu64, f->request_id);
		if (f->client && *f->client) {
			put(b, " from ", 6);
			put_escaped(b, f->client);
		}
		put(b, ": ", 2);
	}
}

static void log_v(enum wf_log_level level, const struct wf_log_fields *f, const char *fmt,
                  va_list ap)
{
	if (level > log_max)
		return;
	char msg[MSG_MAX];
	if (vsnprintf(msg, sizeof msg, fmt, ap) < 0)
		msg[0] = 0;

	char line[LINE_MAX_];
	struct buf b = {line, 0, sizeof line};
	char ts[64];
	struct timespec now;
	struct tm tm;
	clock_gettime(CLOCK_REALTIME, &now);
	gmtime_r(&now.tv_sec, &tm);
	snprintf(ts, sizeof ts, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", tm.tm_year + 1900,
	         tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
	         now.tv_nsec / 1000000);

	if (log_journal)
		putf(&b, "<%d>", (int)level);
	if (log_format == WF_LOG_FORMAT_JSON) {
		render_json(&b, level, f, ts, msg);
	} else {
		if (log_journal)
			putf(&b, "%s: ", log_prog);
		else
			putf(&b, "%s %-5s %s[%d]: ", ts, level_name(level), log_prog,
			     (int)getpid());
		render_text_fields(&b, f);
		put_escaped(&b, msg);
	}
	line[b.len++] = '\n';
	ssize_t w = write(STDERR_FILENO, line, b.len);
	(void)w;
}

void wf_log_event(enum wf_log_level level, const struct wf_log_fields *fields, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	log_v(level, fields, fmt, ap);
	va_end(ap);
}

void wf_log(enum wf_log_level level, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	log_v(level, NULL, fmt, ap);
	va_end(ap);
}
