/* agentctl: the operators' client of wf-agent and wf-worker.
 *
 *   agentctl [GLOBAL OPTIONS] COMMAND [ARGS]
 *
 * Global options come before the command; each command parses its own. */
#include "cli.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_SOCKET "ipc:///run/weightfloor/agent.sock"
#define DEFAULT_EVENTS "ipc:///run/weightfloor/events.sock"

struct command {
	const char *name;
	int (*run)(struct cli *cli, int argc, char **argv);
	const char *summary;
};

static const struct command commands[] = {
	{"inspect", cmd_inspect, "print the inventory of model files (no agent needed)"},
	{"status", cmd_status, "the agent's state, host budget and models"},
	{"models", cmd_models, "registered models and their floor states"},
	{"register", cmd_register, "register a model with the agent"},
	{"floor", cmd_floor, "floor ensure|release|pin|unpin MODEL"},
	{"watch", cmd_watch, "follow the agent's events"},
	{"workers", cmd_workers, "the node's workers, devices, budgets and models"},
	{"residency", cmd_worker_verb, "residency MODEL disk|host|device|pinned_device"},
	{"pin", cmd_worker_verb, "load MODEL on a worker's device and pin it"},
	{"unpin", cmd_worker_verb, "make MODEL evictable on a worker"},
	{"evict", cmd_worker_verb, "free MODEL's device memory on a worker"},
	{"prefetch", cmd_worker_verb, "load MODEL on a worker's device"},
	{"compact", cmd_worker_verb, "free every unpinned device buffer, reload MODEL..."},
};

static void usage(FILE *out)
{
	fprintf(out, "usage: agentctl [--socket URL] [--events URL] [--json] [--timeout MS] [-q] "
		     "[--tls-* FILE] COMMAND [ARGS]\n\ncommands:\n");
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].summary);
	fprintf(out, "\n'agentctl COMMAND --help' describes a command.\n"
		     "The agent's URLs default to $WF_AGENT_SOCKET / $WF_AGENT_EVENTS, else\n"
		     "  %s\n  %s\n"
		     "For tls+tcp:// URLs:\n"
		     "  --tls-ca FILE           CA (PEM) that signed the agent's certificate "
		     "($WF_AGENT_TLS_CA)\n"
		     "  --tls-cert FILE         client certificate (PEM) to present "
		     "($WF_AGENT_TLS_CERT)\n"
		     "  --tls-key FILE          its private key (PEM; default: in --tls-cert) "
		     "($WF_AGENT_TLS_KEY)\n"
		     "  --tls-server-name NAME  name to verify in the agent's certificate "
		     "(default: the URL's host)\n",
		DEFAULT_SOCKET, DEFAULT_EVENTS);
}

int main(int argc, char **argv)
{
	struct cli cli = {
		.socket = getenv("WF_AGENT_SOCKET"),
		.events = getenv("WF_AGENT_EVENTS"),
		.timeout_ms = 10000,
	};
	if (!cli.socket || !*cli.socket)
		cli.socket = DEFAULT_SOCKET;
	if (!cli.events || !*cli.events)
		cli.events = DEFAULT_EVENTS;
	cli.tls.cert_file = getenv("WF_AGENT_TLS_CERT");
	cli.tls.key_file = getenv("WF_AGENT_TLS_KEY");
	cli.tls.ca_file = getenv("WF_AGENT_TLS_CA");

	static const struct option opts[] = {
		{"socket", required_argument, NULL, 's'},
		{"events", required_argument, NULL, 'e'},
		{"json", no_argument, NULL, 'j'},
		{"timeout", required_argument, NULL, 't'},
		{"quiet", no_argument, NULL, 'q'},
		{"tls-cert", required_argument, NULL, 'C'},
		{"tls-key", required_argument, NULL, 'K'},
		{"tls-ca", required_argument, NULL, 'A'},
		{"tls-server-name", required_argument, NULL, 'N'},
		{"help", no_argument, NULL, 'h'},
		{0},
	};
	int c;
	/* '+': stop at the first non-option, which is the command. */
	while ((c = getopt_long(argc, argv, "+s:e:jt:qh", opts, NULL)) != -1) {
		switch (c) {
		case 's':
			cli.socket = optarg;
			break;
		case 'e':
			cli.events = optarg;
			break;
		case 'j':
			cli.json = true;
			break;
		case 't': {
			char *end;
			long v = strtol(optarg, &end, 10);
			if (*end || v <= 0 || v > 24L * 3600 * 1000) {
				cli_err("--timeout: '%s' is not a number of milliseconds", optarg);
				return CLI_EXIT_USAGE;
			}
			cli.timeout_ms = (int)v;
			cli.timeout_given = true;
			break;
		}
		case 'q':
			cli.quiet = true;
			break;
		case 'C':
			cli.tls.cert_file = optarg;
			break;
		case 'K':
			cli.tls.key_file = optarg;
			break;
		case 'A':
			cli.tls.ca_file = optarg;
			break;
		case 'N':
			cli.tls.server_name = optarg;
			break;
		case 'h':
			usage(stdout);
			return CLI_EXIT_OK;
		default:
			usage(stderr);
			return CLI_EXIT_USAGE;
		}
	}
	/* Empty environment variables mean unset. */
	if (cli.tls.cert_file && !*cli.tls.cert_file)
		cli.tls.cert_file = NULL;
	if (cli.tls.key_file && !*cli.tls.key_file)
		cli.tls.key_file = NULL;
	if (cli.tls.ca_file && !*cli.tls.ca_file)
		cli.tls.ca_file = NULL;
	if (optind >= argc) {
		usage(stderr);
		return CLI_EXIT_USAGE;
	}
	const char *name = argv[optind];
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++) {
		if (strcmp(commands[i].name, name) == 0)
			return commands[i].run(&cli, argc - optind, argv + optind);
	}
	cli_err("unknown command '%s' (see agentctl --help)", name);
	return CLI_EXIT_USAGE;
}
