/* agentctl internals: shared option state, output helpers and the subcommand table.
 *
 * Every subcommand is `int cmd_<name>(struct cli *cli, int argc, char **argv)` returning the
 * process exit code (the table below). Human output goes to stdout as tables whose column widths
 * come from the content; --json (-o json) prints exactly one JSON document on stdout instead,
 * errors included. Errors go to stderr once, with context. */
#ifndef WF_CONTROL_AGENTCTL_CLI_H
#define WF_CONTROL_AGENTCTL_CLI_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "control/transport.h"
#include "weightfloor.pb-c.h"

struct json_object;

enum cli_output { CLI_OUT_TABLE, CLI_OUT_WIDE, CLI_OUT_JSON };

struct cli {
	bool json;          /* --json or -o json */
	bool wide;          /* -o wide: extra columns */
	bool quiet;         /* -q: no progress bars */
	const char *socket; /* agent control URL (--socket, $WF_AGENT_SOCKET, default) */
	const char *events; /* agent event URL (--events, $WF_AGENT_EVENTS, default) */
	int timeout_ms;     /* per request (--timeout) */
	/* The largest request the client sends (0: WF_CTL_MAX_REQUEST_DEFAULT); read when the
	 * process's client is opened. */
	size_t max_request_size;
	bool timeout_given; /* --timeout was given: it bounds long commands too */
	/* tls+tcp:// (--tls-cert/--tls-key/--tls-ca/--tls-server-name, or $WF_AGENT_TLS_CERT,
	 * $WF_AGENT_TLS_KEY, $WF_AGENT_TLS_CA) */
	struct wf_ctl_tls_opts tls;
	/* The first error reported (cli_fail): printed as {"error": ...} with --json when the
	 * command printed no document of its own. */
	int err_exit;
	char err_msg[512];
	bool doc_printed; /* a JSON document went to stdout */
};

/* Exit codes: one per protocol status class, so scripts can branch without parsing messages.
 * Local errors map to the same classes (cannot reach the agent: UNAVAILABLE; a missing file:
 * NOT_FOUND; a malformed one: INVALID_ARGUMENT). Documented in docs/man/agentctl.md. */
#define CLI_EXIT_OK                  0 /* success */
#define CLI_EXIT_FAIL                1 /* any other failure (INTERNAL, unexpected reply) */
#define CLI_EXIT_USAGE               2 /* bad flags or arguments: nothing was sent */
#define CLI_EXIT_NOT_FOUND           3 /* no such model, worker or file */
#define CLI_EXIT_UNAVAILABLE         4 /* agent or worker not running, not answering, timed out */
#define CLI_EXIT_RESOURCE_EXHAUSTED  5 /* budget, memory, disk */
#define CLI_EXIT_PERMISSION_DENIED   6 /* peer not allowed, path outside the model roots */
#define CLI_EXIT_INVALID_ARGUMENT    7 /* the agent refused the request's content, bad model file */
#define CLI_EXIT_FAILED_PRECONDITION 8 /* not valid in the current state */
#define CLI_EXIT_NOT_RESIDENT        9 /* the model is not materialized where it must be */

/* The exit code for a reply status, for a -errno / WF_E* code; the status name of an exit code
 * ("NOT_FOUND", "USAGE", "FAILED" for 1). */
int cli_exit_for_status(Weightfloor__V1__Status st);
int cli_exit_for_err(int err);
const char *cli_exit_name(int exit_code);

/* Reports an error: "agentctl: <message>" on stderr (with --json, unless -q), and remembers the
 * first one for the JSON error document. Returns exit_code. */
int cli_fail(struct cli *cli, int exit_code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* A usage error of command cmd (NULL: agentctl itself): what was wrong, then a one-line hint to
 * --help. Returns CLI_EXIT_USAGE. */
int cli_usage(struct cli *cli, const char *cmd, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Checks the number of positional arguments: at least min, at most max (-1: any). Refuses the
 * first extra one by name. names: for "missing MODEL" messages. */
int cli_check_args(struct cli *cli, const char *cmd, int argc, char **argv, int first, int min,
                   int max, const char *names);
/* getopt's failure ('?' or ':') as a usage error naming the option. */
int cli_bad_option(struct cli *cli, const char *cmd, int argc, char **argv);
/* The error object {"error": {"code", "message", "exit_code"}} (new reference). */
struct json_object *cli_error_json(int exit_code, const char *message);

/* "3d 4h", "12m 5s", "45s", "850 ms" */
char *cli_fmt_duration(uint64_t ms, char *buf, size_t len);
/* One progress line without the bar's terminal control: "[####....]  42.0%  1.2 GiB / 3 GiB
 * 512 MiB/s  ETA 4s". rate 0: unknown ("-"), and no ETA. bar_width 0: no bar. */
char *cli_fmt_progress(char *buf, size_t len, uint64_t done, uint64_t total, uint64_t rate,
                       int bar_width);

/* A table whose column widths come from its content. Cells are copied. */
struct cli_table;
struct cli_table *cli_table_new(int ncols, const char *const *headers, const char *right_align);
void cli_table_addf(struct cli_table *t, int col, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Adds a line printed as is after the current row (an error, a note), indented by two. */
void cli_table_note(struct cli_table *t, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void cli_table_print(struct cli_table *t, FILE *out);
void cli_table_free(struct cli_table *t);

/* "1.50 GiB", "512 B": binary units, 3 significant digits. Returns buf. */
char *cli_fmt_bytes(uint64_t bytes, char *buf, size_t len);

/* Prints a JSON value on one line to stdout and releases it; marks cli->doc_printed. */
void cli_json_print(struct cli *cli, struct json_object *obj);

/* Sends req to the agent (timeout_ms <= 0: the --timeout value). On a reply with STATUS_OK
 * returns CLI_EXIT_OK and *ret_reply (free with wf_ctl_reply_free); otherwise reports the error
 * (cli_fail) with `what` as context and returns its exit code. With c NULL, the process's
 * client; else that one (opened on first use: one per thread for concurrent commands). */
int cli_call(struct cli *cli, const char *what, Weightfloor__V1__Request *req, int timeout_ms,
             Weightfloor__V1__Reply **ret_reply);
struct wf_ctl_client;
int cli_call_on(struct cli *cli, struct wf_ctl_client **c, const char *what,
                Weightfloor__V1__Request *req, int timeout_ms, Weightfloor__V1__Reply **ret_reply);

/* Renders a progress bar on stderr when it is a terminal (and not -q); done/total bytes. */
void cli_progress(struct cli *cli, const char *label, uint64_t done, uint64_t total, uint64_t rate);
void cli_progress_end(struct cli *cli);

/* Client-side transfer rate, for servers that send none: bytes over time since the first
 * sample. */
struct cli_rate {
	uint64_t first_done;
	int64_t first_ms; /* 0: no sample yet */
};
uint64_t cli_rate_update(struct cli_rate *r, uint64_t done);

int cmd_inspect(struct cli *cli, int argc, char **argv);
int cmd_models(struct cli *cli, int argc, char **argv);
int cmd_status(struct cli *cli, int argc, char **argv);
int cmd_floor(struct cli *cli, int argc, char **argv);
int cmd_register(struct cli *cli, int argc, char **argv);
int cmd_watch(struct cli *cli, int argc, char **argv);
int cmd_reload(struct cli *cli, int argc, char **argv);
int cmd_perplexity(struct cli *cli, int argc, char **argv);
int cmd_workers(struct cli *cli, int argc, char **argv);
/* residency, pin, unpin, evict, prefetch, compact: argv[0] names the verb. */
int cmd_worker_verb(struct cli *cli, int argc, char **argv);
/* generate MODEL PROMPT [--worker ID] [sampling...]: prints text as it is made (--json: JSON
 * lines, the one exception to one document per command). */
int cmd_generate(struct cli *cli, int argc, char **argv);
/* publish MODEL --tensor NAME=FILE...: PublishTensors, after a dry run with the sizes. */
int cmd_publish(struct cli *cli, int argc, char **argv);

#endif
