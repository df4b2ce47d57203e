#include "base/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *log_prog = "weightfloor";
static enum wf_log_level log_max = WF_LOG_INFO;
static int log_journal;

void wf_log_init(const char *prog, enum wf_log_level max_level)
{
	log_prog = prog;
	log_max = max_level;
	log_journal = getenv("JOURNAL_STREAM") != NULL;
}

void wf_log(enum wf_log_level level, const char *fmt, ...)
{
	if (level > log_max)
		return;
	static const char *const names[8] = {"", "", "", "error", "warn", "", "info", "debug"};
	char line[2048];
	int n;
	if (log_journal) {
		n = snprintf(line, sizeof line, "<%d>%s: ", (int)level, log_prog);
	} else {
		struct timespec ts;
		struct tm tm;
		clock_gettime(CLOCK_REALTIME, &ts);
		gmtime_r(&ts.tv_sec, &tm);
		n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %-5s %s[%d]: ",
			     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
			     tm.tm_sec, ts.tv_nsec / 1000000, names[level & 7], log_prog,
			     (int)getpid());
	}
	if (n < 0 || (size_t)n >= sizeof line)
		n = 0;
	va_list ap;
	va_start(ap, fmt);
	int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
	va_end(ap);
	size_t len = (size_t)n + (m < 0 ? 0 : ((size_t)m >= sizeof line - (size_t)n - 1
						   ? sizeof line - (size_t)n - 2
						   : (size_t)m));
	line[len++] = '\n';
	ssize_t w = write(STDERR_FILENO, line, len);
	(void)w;
}
