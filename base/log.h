/* Logging for executables (wf-agent, wf-worker, tools). Library code never calls this: it returns
 * codes and fills a struct wf_diag, and the executable logs once, with context.
 *
 * One line per event, one write(2) per line (thread-safe; lines from threads never interleave).
 * Each event may carry structured fields (struct wf_log_fields: the model, the worker, the
 * request id, ...). Two formats:
 *
 *   text  "<ts> <level> <prog>[pid]: [worker W: ][model M: ][request N[ from C]: ]message".
 *         Under systemd (JOURNAL_STREAM names our stderr) the timestamp is left out and the level
 *         is given as an sd-daemon "<N>" prefix so the journal records it.
 *   json  one object per line: {"ts","level","prog","pid","msg", then the fields that are set:
 *         "model","worker","request_id","client","completion","event","error"}. Strings are
 *         escaped by json-c; bytes that are not UTF-8 become U+FFFD, so every line parses as
 *         strict JSON. Under systemd the "<N>" prefix is kept (the journal strips it and stores
 *         the object as MESSAGE with the right priority).
 *
 * Control characters in text lines are written as \n, \t, \xNN: a model name or a peer's message
 * never starts a second line. */
#ifndef WF_BASE_LOG_H
#define WF_BASE_LOG_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum wf_log_level {
	WF_LOG_ERROR = 3,
	WF_LOG_WARN = 4,
	WF_LOG_INFO = 6,
	WF_LOG_DEBUG = 7,
};

enum wf_log_format {
	WF_LOG_FORMAT_TEXT,
	WF_LOG_FORMAT_JSON,
	WF_LOG_FORMAT_MAX,
};

/* What an event is about; every member is optional (NULL or 0: not set). Strings are only read
 * during the call. */
struct wf_log_fields {
	const char *model;
	const char *worker;
	uint64_t request_id; /* the protocol's Request.request_id (never 0 when set) */
	const char *client;  /* Request.client */
	uint64_t completion; /* a completion's id (GenerateReply.completion_id) */
	const char *event;   /* a stable event name for filters: "floor_state", "evicted", ... */
	int code;            /* a return code (-errno or WF_E*): json "error": its symbolic name */
};

/* Sets the program name (kept, not copied), the most verbose level written, and reads
 * JOURNAL_STREAM. Call once from main() before any thread logs. */
void wf_log_init(const char *prog, enum wf_log_level max_level);

/* Chooses the line format (default text). Call from main() before any thread logs. */
void wf_log_set_format(enum wf_log_format format);

/* "text" or "json" into *ret_format: 0, or WF_EINVAL for anything else. */
int wf_log_format_parse(const char *name, enum wf_log_format *ret_format);

/* One event; fields may be NULL. */
void wf_log_event(enum wf_log_level level, const struct wf_log_fields *fields, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

void wf_log(enum wf_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* wf_log_event(WF_LOG_INFO, WF_LOG_F(.model = name, .worker = id), "loaded") */
#define WF_LOG_F(...) (&(const struct wf_log_fields){__VA_ARGS__})

#define wf_log_error(...) wf_log(WF_LOG_ERROR, __VA_ARGS__)
#define wf_log_warn(...)  wf_log(WF_LOG_WARN, __VA_ARGS__)
#define wf_log_info(...)  wf_log(WF_LOG_INFO, __VA_ARGS__)
#define wf_log_debug(...) wf_log(WF_LOG_DEBUG, __VA_ARGS__)

#ifdef __cplusplus
}
#endif
#endif
