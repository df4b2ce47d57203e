#include "cli.h"

#include <json-c/json.h>
#include <stdarg.h>
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
