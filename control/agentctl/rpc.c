/* agentctl's connection to the agent: one client per process, opened on first use. */
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

int cli_call(struct cli *cli, const char *what, Weightfloor__V1__Request *req, int timeout_ms,
	     Weightfloor__V1__Reply **ret_reply)
{
	struct wf_diag d = {{0}};
	int rc;
	if (!client) {
		struct wf_ctl_client_opts o = {.client_name = "agentctl", .tls = cli->tls};
		rc = wf_ctl_client_open(cli->socket, cli->timeout_ms, &o, &client, &d);
		if (rc < 0) {
			cli_err("%s: cannot reach the agent at %s: %s", what, cli->socket,
				wf_diag_str(&d, rc));
			return CLI_EXIT_FAIL;
		}
		atexit(close_client);
	}
	Weightfloor__V1__Reply *rep = NULL;
	rc = wf_ctl_client_call_timeout(client, req, timeout_ms > 0 ? timeout_ms : cli->timeout_ms,
					&rep, &d);
	if (rc < 0) {
		cli_err("%s: %s", what, wf_diag_str(&d, rc));
		return CLI_EXIT_FAIL;
	}
	if (rep->code != WEIGHTFLOOR__V1__STATUS__STATUS_OK) {
		cli_err("%s: %s: %s", what, wf_proto_status_name(rep->code),
			rep->message && *rep->message ? rep->message : "(no detail)");
		wf_ctl_reply_free(rep);
		return CLI_EXIT_FAIL;
	}
	*ret_reply = rep;
	return CLI_EXIT_OK;
}
