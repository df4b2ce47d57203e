/* agentctl internals: shared option state, output helpers and the subcommand table.
 *
 * Every subcommand is `int cmd_<name>(struct cli *cli, int argc, char **argv)` returning the
 * process exit code: 0 success, 1 the operation failed, 2 usage error. Human output goes to
 * stdout as aligned tables; --json prints JSON (one document per line) instead. Errors go to
 * stderr once, with context. */
#ifndef WF_CONTROL_AGENTCTL_CLI_H
#define WF_CONTROL_AGENTCTL_CLI_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

struct json_object;

struct cli {
	bool json;          /* --json */
	bool quiet;         /* -q: no progress bars */
	const char *socket; /* agent control URL (--socket, $WF_AGENT_SOCKET, default) */
	const char *events; /* agent event URL (--events, $WF_AGENT_EVENTS, default) */
	int timeout_ms;     /* per request (--timeout) */
};

#define CLI_EXIT_OK 0
#define CLI_EXIT_FAIL 1
#define CLI_EXIT_USAGE 2

/* "1.50 GiB", "512 B": binary units, 3 significant digits. Returns buf. */
char *cli_fmt_bytes(uint64_t bytes, char *buf, size_t len);

/* Prints a JSON value on one line to stdout and releases it. */
void cli_json_print(struct json_object *obj);

/* Prints "agentctl: <what>: <why>" to stderr. */
void cli_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

int cmd_inspect(struct cli *cli, int argc, char **argv);

#endif
