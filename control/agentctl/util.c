#include "cli.h"

#include <json-c/json.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>

char *cli_fmt_bytes(uint64_t bytes, char *buf, size_t len)
{
	static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
	double v = (double)bytes;
	unsigned u = 0;
	while (v >= 1024.0 && u + 1 < sizeof(units) / sizeof(units[0])) {
		v /= 1024.0;
		u++;
	}
	if (u == 0)
		snprintf(buf, len, "%llu B", (unsigned long long)bytes);
	else if (v >= 100.0)
		snprintf(buf, len, "%.0f %s", v, units[u]);
	else if (v >= 10.0)
		snprintf(buf, len, "%.1f %s", v, units[u]);
	else
		snprintf(buf, len, "%.2f %s", v, units[u]);
	return buf;
}

void cli_json_print(struct json_object *obj)
{
	fputs(json_object_to_json_string_ext(obj, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE),
	      stdout);
	fputc('\n', stdout);
	json_object_put(obj);
}

void cli_err(const char *fmt, ...)
{
	va_list ap;
	fputs("agentctl: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

#include <unistd.h>

static bool progress_shown;

void cli_progress(struct cli *cli, const char *label, uint64_t done, uint64_t total, uint64_t rate)
{
	if (cli->quiet || cli->json || !isatty(STDERR_FILENO))
		return;
	char a[32], b[32], r[32];
	int width = 30, fill = total ? (int)((double)done / (double)total * width) : 0;
	if (fill > width)
		fill = width;
	char bar[64];
	for (int i = 0; i < width; i++)
		bar[i] = i < fill ? '#' : '.';
	bar[width] = '\0';
	fprintf(stderr, "\r%s [%s] %5.1f%%  %s / %s  %s/s   ", label, bar,
		total ? 100.0 * (double)done / (double)total : 0.0, cli_fmt_bytes(done, a, sizeof a),
		cli_fmt_bytes(total, b, sizeof b), cli_fmt_bytes(rate, r, sizeof r));
	fflush(stderr);
	progress_shown = true;
}

void cli_progress_end(struct cli *cli)
{
	(void)cli;
	if (progress_shown)
		fputc('\n', stderr);
	progress_shown = false;
}
