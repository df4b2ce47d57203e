/* Logging for executables (wf-agent, wf-worker, tools). Library code never calls this: it returns
 * codes and fills a struct wf_diag, and the executable logs once, with context.
 *
 * Lines go to stderr as "<ts> <level> <prog>[pid]: message"; under systemd (JOURNAL_STREAM set)
 * the timestamp is left out and the level is given as an sd-daemon "<N>" prefix so the journal
 * records it. Thread-safe (one write(2) per line). */
#ifndef WF_BASE_LOG_H
#define WF_BASE_LOG_H

#ifdef __cplusplus
extern "C" {
#endif

enum wf_log_level {
	WF_LOG_ERROR = 3,
	WF_LOG_WARN = 4,
	WF_LOG_INFO = 6,
	WF_LOG_DEBUG = 7,
};

void wf_log_init(const char *prog, enum wf_log_level max_level);
void wf_log(enum wf_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define wf_log_error(...) wf_log(WF_LOG_ERROR, __VA_ARGS__)
#define wf_log_warn(...) wf_log(WF_LOG_WARN, __VA_ARGS__)
#define wf_log_info(...) wf_log(WF_LOG_INFO, __VA_ARGS__)
#define wf_log_debug(...) wf_log(WF_LOG_DEBUG, __VA_ARGS__)

#ifdef __cplusplus
}
#endif
#endif
