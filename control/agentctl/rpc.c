/* agentctl's connection to the agent: one client per process (or per thread of an --all
 * command), opened on first use. */
#include "cli.h"

#include "base/error.h"
#include "control/client.h"
#include "proto/status.h"

#include <stdlib.h>

static struct wf_ctl_client *client;

static void close_client(void)
{
	wf_ctl_client_close(client);
	client = NULL;
}

int cli_call_on(struct cli *cli, struct wf_ctl_client **c, const char *what,
                Weightfloor__V1__Request *req, int timeout_ms, Weightfloor__V1__Reply **ret_reply)
{
	struct wf_diag d = {{0}};
	int rc;
	if (!*c) {
		struct wf_ctl_client_opts o = {.client_name = "agentctl",
		                               .max_request_size = cli->max_request_size,
		                               .tls = cli->tls};
		rc = wf_ctl_client_open(cli->socket, cli->timeout_ms, &o, c, &d);
		if (rc < 0) {
			/* the agent cannot be reached: UNAVAILABLE, unless it refused us (TLS) */
			int ex = cli_exit_for_err(rc);
			return cli_fail(
			    cli, ex == CLI_EXIT_PERMISSION_DENIED ? ex : CLI_EXIT_UNAVAILABLE,
			    "%s: cannot reach the agent at %s: %s", what, cli->socket,
			    wf_diag_str(&d, rc));
		}
		if (c == &client)
			atexit(close_client);
	}
	Weightfloor__V1__Reply *rep = NULL;
	rc = wf_ctl_client_call_timeout(*c, req, timeout_ms > 0 ? timeout_ms : cli->timeout_ms,
	                                &rep, &d);
	if (rc < 0) {
		int ex = cli_exit_for_err(rc);
		/* a failed exchange with the agent is the agent being unreachable, unless the
		 * request itself was refused locally (too large, malformed) */
		if (ex == CLI_EXIT_FAIL)
			ex = CLI_EXIT_UNAVAILABLE;
		return cli_fail(cli, ex, "%s: %s", what, wf_diag_str(&d, rc));
	}
	if (rep->code != WEIGHTFLOOR__V1__STATUS__STATUS_OK) {
		int ex = cli_fail(cli, cli_exit_for_status(rep->code), "%s: %s: %s", what,
		                  wf_proto_status_name(rep->code),
		                  rep->message && *rep->message ? rep->message : "(no detail)");
		wf_ctl_reply_free(rep);
		return ex;
	}
	*ret_reply = rep;
	return CLI_EXIT_OK;
}

int cli_call(struct cli *cli, const char *what, Weightfloor__V1__Request *req, int timeout_ms,
             Weightfloor__V1__Reply **ret_reply)
{
	return cli_call_on(cli, &client, what, req, timeout_ms, ret_reply);
}
