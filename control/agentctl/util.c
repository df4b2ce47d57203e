#include "cli.h"

#include "base/error.h"
#include "proto/status.h"

#include <errno.h>
#include <json-c/json.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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

char *cli_fmt_duration(uint64_t ms, char *buf, size_t len)
{
	uint64_t s = ms / 1000, m = s / 60, h = m / 60, d = h / 24;
	if (d)
		snprintf(buf, len, "%llud %lluh", (unsigned long long)d,
		         (unsigned long long)(h % 24));
	else if (h)
		snprintf(buf, len, "%lluh %llum", (unsigned long long)h,
		         (unsigned long long)(m % 60));
	else if (m)
		snprintf(buf, len, "%llum %llus", (unsigned long long)m,
		         (unsigned long long)(s % 60));
	else if (s)
		snprintf(buf, len, "%llus", (unsigned long long)s);
	else
		snprintf(buf, len, "%llu ms", (unsigned long long)ms);
	return buf;
}

char *cli_fmt_progress(char *buf, size_t len, uint64_t done, uint64_t total, uint64_t rate,
                       int bar_width)
{
	char a[32], b[32], r[32], e[32];
	double frac = total ? (double)done / (double)total : 0.0;
	if (frac > 1.0)
		frac = 1.0;
	char bar[130] = "";
	if (bar_width > 0) {
		if (bar_width > 120)
			bar_width = 120;
		int fill = (int)(frac * bar_width);
		bar[0] = '[';
		for (int i = 0; i < bar_width; i++)
			bar[1 + i] = i < fill ? '#' : '.';
		bar[1 + bar_width] = ']';
		bar[2 + bar_width] = ' ';
		bar[3 + bar_width] = '\0';
	}
	if (rate)
		snprintf(r, sizeof r, "%s/s", cli_fmt_bytes(rate, e, sizeof e));
	else
		snprintf(r, sizeof r, "- B/s");
	if (done >= total && total)
		snprintf(e, sizeof e, "done");
	else if (rate && total > done)
		snprintf(e, sizeof e, "ETA %s",
		         cli_fmt_duration((total - done) * 1000 / rate, a, sizeof a));
	else
		snprintf(e, sizeof e, "ETA -");
	snprintf(buf, len, "%s%5.1f%%  %s / %s  %s  %s", bar, 100.0 * frac,
	         cli_fmt_bytes(done, a, sizeof a), cli_fmt_bytes(total, b, sizeof b), r, e);
	return buf;
}

void cli_json_print(struct cli *cli, struct json_object *obj)
{
	fputs(json_object_to_json_string_ext(obj, JSON_C_TO_STRING_PLAIN |
	                                              JSON_C_TO_STRING_NOSLASHESCAPE),
	      stdout);
	fputc('\n', stdout);
	fflush(stdout);
	json_object_put(obj);
	if (cli)
		cli->doc_printed = true;
}

int cli_exit_for_status(Weightfloor__V1__Status st)
{
	switch (st) {
	case WEIGHTFLOOR__V1__STATUS__STATUS_OK:
		return CLI_EXIT_OK;
	case WEIGHTFLOOR__V1__STATUS__STATUS_NOT_FOUND:
		return CLI_EXIT_NOT_FOUND;
	case WEIGHTFLOOR__V1__STATUS__STATUS_NOT_RESIDENT:
		return CLI_EXIT_NOT_RESIDENT;
	case WEIGHTFLOOR__V1__STATUS__STATUS_RESOURCE_EXHAUSTED:
		return CLI_EXIT_RESOURCE_EXHAUSTED;
	case WEIGHTFLOOR__V1__STATUS__STATUS_INVALID_ARGUMENT:
		return CLI_EXIT_INVALID_ARGUMENT;
	case WEIGHTFLOOR__V1__STATUS__STATUS_PERMISSION_DENIED:
		return CLI_EXIT_PERMISSION_DENIED;
	case WEIGHTFLOOR__V1__STATUS__STATUS_FAILED_PRECONDITION:
		return CLI_EXIT_FAILED_PRECONDITION;
	case WEIGHTFLOOR__V1__STATUS__STATUS_UNAVAILABLE:
		return CLI_EXIT_UNAVAILABLE;
	default:
		return CLI_EXIT_FAIL;
	}
}

int cli_exit_for_err(int err)
{
	/* The protocol's one mapping of codes to statuses, except where a local error means
	 * something else to a user at a shell: a shard or directory that is not there is "not
	 * found", and a connection that dropped means the agent is not available. */
	switch (err) {
	case -ENOTDIR:
	case WF_ESHARD:
		return CLI_EXIT_NOT_FOUND;
	case WF_ETRANSPORT:
		return CLI_EXIT_UNAVAILABLE;
	default:
		return cli_exit_for_status(wf_proto_status_from_err(err));
	}
}

const char *cli_exit_name(int exit_code)
{
	switch (exit_code) {
	case CLI_EXIT_OK:
		return "OK";
	case CLI_EXIT_USAGE:
		return "USAGE";
	case CLI_EXIT_NOT_FOUND:
		return "NOT_FOUND";
	case CLI_EXIT_UNAVAILABLE:
		return "UNAVAILABLE";
	case CLI_EXIT_RESOURCE_EXHAUSTED:
		return "RESOURCE_EXHAUSTED";
	case CLI_EXIT_PERMISSION_DENIED:
		return "PERMISSION_DENIED";
	case CLI_EXIT_INVALID_ARGUMENT:
		return "INVALID_ARGUMENT";
	case CLI_EXIT_FAILED_PRECONDITION:
		return "FAILED_PRECONDITION";
	case CLI_EXIT_NOT_RESIDENT:
		return "NOT_RESIDENT";
	default:
		return "FAILED";
	}
}

struct json_object *cli_error_json(int exit_code, const char *message)
{
	struct json_object *e = json_object_new_object();
	json_object_object_add(e, "code", json_object_new_string(cli_exit_name(exit_code)));
	json_object_object_add(e, "message", json_object_new_string(message ? message : ""));
	json_object_object_add(e, "exit_code", json_object_new_int(exit_code));
	struct json_object *o = json_object_new_object();
	json_object_object_add(o, "error", e);
	return o;
}

/* Threads of a concurrent --all command report through here too. */
static pthread_mutex_t err_mu = PTHREAD_MUTEX_INITIALIZER;

static int fail_msg(struct cli *cli, int exit_code, const char *hint, const char *msg)
{
	pthread_mutex_lock(&err_mu);
	/* With --json the error is on stdout as well: -q then keeps stderr clean for scripts. */
	if (!cli->json || !cli->quiet) {
		fprintf(stderr, "agentctl: %s\n", msg);
		if (hint)
			fprintf(stderr, "%s\n", hint);
	}
	if (!cli->err_exit) {
		cli->err_exit = exit_code;
		snprintf(cli->err_msg, sizeof cli->err_msg, "%s", msg);
	}
	pthread_mutex_unlock(&err_mu);
	return exit_code;
}

int cli_fail(struct cli *cli, int exit_code, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	return fail_msg(cli, exit_code, NULL, msg);
}

int cli_usage(struct cli *cli, const char *cmd, const char *fmt, ...)
{
	char hint[128], what[400], msg[512];
	snprintf(hint, sizeof hint, "Try 'agentctl %s%s--help' for more information.",
	         cmd ? cmd : "", cmd ? " " : "");
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(what, sizeof what, fmt, ap);
	va_end(ap);
	snprintf(msg, sizeof msg, "%s%s%s", cmd ? cmd : "", cmd ? ": " : "", what);
	return fail_msg(cli, CLI_EXIT_USAGE, hint, msg);
}

int cli_check_args(struct cli *cli, const char *cmd, int argc, char **argv, int first, int min,
                   int max, const char *names)
{
	int n = argc - first;
	if (n < min)
		return cli_usage(cli, cmd, "missing %s", names);
	if (max >= 0 && n > max)
		return cli_usage(cli, cmd, "unexpected argument '%s'", argv[first + max]);
	return 0;
}

int cli_bad_option(struct cli *cli, const char *cmd, int argc, char **argv)
{
	extern int optind, optopt;
	const char *arg = optind - 1 < argc && optind >= 1 ? argv[optind - 1] : "?";
	if (optopt && arg[0] == '-' && arg[1] != '-' && arg[1] != (char)optopt)
		return cli_usage(cli, cmd, "unknown option '-%c'", optopt);
	/* getopt leaves the option in argv[optind-1]; for a missing value it is that option. */
	char opt[64];
	snprintf(opt, sizeof opt, "%s", arg);
	char *eq = strchr(opt, '=');
	if (eq)
		*eq = '\0';
	return cli_usage(cli, cmd, "unknown option or missing value: '%s'", opt);
}

/* ---- tables -------------------------------------------------------------------------------- */

#define TABLE_MAX_COLS 16

struct row {
	char *cells[TABLE_MAX_COLS];
	char *note;
};

struct cli_table {
	int ncols;
	char *headers[TABLE_MAX_COLS];
	bool right[TABLE_MAX_COLS];
	struct row *rows;
	size_t n, cap;
	int cur_col; /* cli_table_addf: the column being filled of the last row */
};

struct cli_table *cli_table_new(int ncols, const char *const *headers, const char *right_align)
{
	struct cli_table *t = calloc(1, sizeof(*t));
	if (!t)
		abort(); /* a CLI out of memory has nothing better to do */
	t->ncols = ncols > TABLE_MAX_COLS ? TABLE_MAX_COLS : ncols;
	for (int i = 0; i < t->ncols; i++) {
		t->headers[i] = strdup(headers[i]);
		t->right[i] = right_align && right_align[i] == 'r';
	}
	return t;
}

static struct row *new_row(struct cli_table *t)
{
	if (t->n == t->cap) {
		t->cap = t->cap ? t->cap * 2 : 8;
		t->rows = realloc(t->rows, t->cap * sizeof(*t->rows));
		if (!t->rows)
			abort();
	}
	struct row *r = &t->rows[t->n++];
	memset(r, 0, sizeof(*r));
	return r;
}

void cli_table_addf(struct cli_table *t, int col, const char *fmt, ...)
{
	struct row *r = col == 0 || !t->n ? new_row(t) : &t->rows[t->n - 1];
	if (col >= t->ncols)
		return;
	va_list ap;
	va_start(ap, fmt);
	free(r->cells[col]);
	if (vasprintf(&r->cells[col], fmt, ap) < 0)
		r->cells[col] = NULL;
	va_end(ap);
}

void cli_table_note(struct cli_table *t, const char *fmt, ...)
{
	if (!t->n)
		return;
	struct row *r = &t->rows[t->n - 1];
	char *s = NULL;
	va_list ap;
	va_start(ap, fmt);
	if (vasprintf(&s, fmt, ap) < 0)
		s = NULL;
	va_end(ap);
	if (!s)
		return;
	if (r->note) {
		char *j = NULL;
		if (asprintf(&j, "%s\n  %s", r->note, s) >= 0) {
			free(r->note);
			r->note = j;
		}
		free(s);
	} else {
		r->note = s;
	}
}

void cli_table_print(struct cli_table *t, FILE *out)
{
	size_t w[TABLE_MAX_COLS];
	for (int i = 0; i < t->ncols; i++) {
		w[i] = strlen(t->headers[i]);
		for (size_t k = 0; k < t->n; k++) {
			size_t l = t->rows[k].cells[i] ? strlen(t->rows[k].cells[i]) : 0;
			if (l > w[i])
				w[i] = l;
		}
	}
	for (size_t k = 0; k <= t->n; k++) {
		char *const *cells = k == 0 ? t->headers : t->rows[k - 1].cells;
		/* the last column is not padded: no trailing blanks */
		for (int i = 0; i < t->ncols; i++) {
			const char *c = cells[i] ? cells[i] : "";
			bool last = i == t->ncols - 1;
			if (t->right[i])
				fprintf(out, "%*s%s", (int)w[i], c, last ? "" : "  ");
			else if (last)
				fputs(c, out);
			else
				fprintf(out, "%-*s  ", (int)w[i], c);
		}
		fputc('\n', out);
		if (k > 0 && t->rows[k - 1].note)
			fprintf(out, "  %s\n", t->rows[k - 1].note);
	}
}

void cli_table_free(struct cli_table *t)
{
	if (!t)
		return;
	for (int i = 0; i < t->ncols; i++)
		free(t->headers[i]);
	for (size_t k = 0; k < t->n; k++) {
		for (int i = 0; i < t->ncols; i++)
			free(t->rows[k].cells[i]);
		free(t->rows[k].note);
	}
	free(t->rows);
	free(t);
}

/* ---- progress ------------------------------------------------------------------------------- */

static bool progress_shown;

void cli_progress(struct cli *cli, const char *label, uint64_t done, uint64_t total, uint64_t rate)
{
	if (cli->quiet || cli->json || !isatty(STDERR_FILENO))
		return;
	char line[256];
	cli_fmt_progress(line, sizeof line, done, total, rate, 30);
	fprintf(stderr, "\r%s %s\033[K", label, line);
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

uint64_t cli_rate_update(struct cli_rate *r, uint64_t done)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	int64_t now = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
	if (!r->first_ms || done < r->first_done) {
		r->first_ms = now;
		r->first_done = done;
		return 0;
	}
	int64_t dt = now - r->first_ms;
	return dt > 0 ? (done - r->first_done) * 1000 / (uint64_t)dt : 0;
}
