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

#include "control/transport.h"
#include "weightfloor.pb-c.h"

struct json_object;

struct cli {
	bool json;          /* --json */
	bool quiet;         /* -q: no progress bars */
	const char *socket; /* agent control URL (--socket, $WF_AGENT_SOCKET, default) */
	const char *events; /* agent event URL (--events, $WF_AGENT_EVENTS, default) */
	int timeout_ms;     /* per request (--timeout) */
	bool timeout_given; /* --timeout was given: it bounds long commands too */
	/* tls+tcp:// (--tls-cert/--tls-key/--tls-ca/--tls-server-name, or $WF_AGENT_TLS_CERT,
	 * $WF_AGENT_TLS_KEY, $WF_AGENT_TLS_CA) */
	struct wf_ctl_tls_opts tls;
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

/* Sends req to the agent (timeout_ms <= 0: the --timeout value). On a reply with STATUS_OK
 * returns CLI_EXIT_OK and *ret_reply (free with wf_ctl_reply_free); otherwise prints the error
 * with `what` as context and returns CLI_EXIT_FAIL. */
int cli_call(struct cli *cli, const char *what, Weightfloor__V1__Request *req, int timeout_ms,
	     Weightfloor__V1__Reply **ret_reply);

/* Renders a progress bar on stderr when it is a terminal (and not -q); done/total bytes. */
void cli_progress(struct cli *cli, const char *label, uint64_t done, uint64_t total, uint64_t rate);
void cli_progress_end(struct cli *cli);

int cmd_inspect(struct cli *cli, int argc, char **argv);
int cmd_models(struct cli *cli, int argc, char **argv);
int cmd_status(struct cli *cli, int argc, char **argv);
int cmd_floor(struct cli *cli, int argc, char **argv);
int cmd_register(struct cli *cli, int argc, char **argv);
int cmd_watch(struct cli *cli, int argc, char **argv);
int cmd_workers(struct cli *cli, int argc, char **argv);
/* residency, pin, unpin, evict, prefetch, compact: argv[0] names the verb. */
int cmd_worker_verb(struct cli *cli, int argc, char **argv);

#endif
