/* agentctl: the operators' client of wf-agent and wf-worker.
 *
 *   agentctl [GLOBAL OPTIONS] COMMAND [ARGS]
 *
 * Global options may come anywhere on the line (main takes them out of argv first); each command
 * parses the rest. */
#include "cli.h"

#include <json-c/json.h>
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
    {"publish", cmd_publish, "new bytes for tensors of a model's floor, one generation"},
    {"reload", cmd_reload, "load a model's changed tensors from its files into its floor"},
    {"perplexity", cmd_perplexity, "perplexity / KL divergence of MODEL on a worker; the sweep"},
    {"watch", cmd_watch, "follow the agent's events"},
    {"workers", cmd_workers, "the node's workers, devices, budgets and models"},
    {"residency", cmd_worker_verb, "residency MODEL disk|host|device|pinned_device"},
    {"pin", cmd_worker_verb, "load MODEL on a worker's device and pin it"},
    {"unpin", cmd_worker_verb, "make MODEL evictable on a worker"},
    {"evict", cmd_worker_verb, "free MODEL's device memory on a worker"},
    {"prefetch", cmd_worker_verb, "load MODEL on a worker's device"},
    {"compact", cmd_worker_verb, "free every unpinned device buffer, reload MODEL..."},
    {"generate", cmd_generate, "generate MODEL PROMPT: text from a worker, with tokens/s"},
};

static void usage(FILE *out)
{
	fprintf(out,
	        "usage: agentctl [GLOBAL OPTIONS] COMMAND [ARGS] [GLOBAL OPTIONS]\n\ncommands:\n");
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].summary);
	fprintf(out,
	        "\nglobal options (before or after the command):\n"
	        "  --socket URL            the agent's control URL ($WF_AGENT_SOCKET, else %s)\n"
	        "  --events URL            the agent's event URL ($WF_AGENT_EVENTS, else %s)\n"
	        "  --timeout MS            bound every request (default 10000)\n"
	        "  --json, -o json         one JSON document on stdout, errors included\n"
	        "  -o wide                 tables with extra columns\n"
	        "  -q, --quiet             no progress bars; with --json, no error line on stderr\n"
	        "  --version               print agentctl's version\n"
	        "For tls+tcp:// URLs:\n"
	        "  --tls-ca FILE           CA (PEM) that signed the agent's certificate "
	        "($WF_AGENT_TLS_CA)\n"
	        "  --tls-cert FILE         client certificate (PEM) to present "
	        "($WF_AGENT_TLS_CERT)\n"
	        "  --tls-key FILE          its private key (PEM; default: in --tls-cert) "
	        "($WF_AGENT_TLS_KEY)\n"
	        "  --tls-server-name NAME  name to verify in the agent's certificate "
	        "(default: the URL's host)\n"
	        "\n'agentctl COMMAND --help' describes a command. Exit status: 0 ok, 1 failure,\n"
	        "2 usage, 3 not found, 4 unavailable, 5 resource exhausted, 6 permission denied,\n"
	        "7 invalid argument, 8 failed precondition, 9 not resident (man agentctl).\n",
	        DEFAULT_SOCKET, DEFAULT_EVENTS);
}

/* Global options, taken out of argv wherever they are (before or after the command), so that
 * `agentctl models --json` and `agentctl --json models` mean the same. "--" ends them. */
struct gopt {
	const char *name; /* long form without "--" */
	char shrt;        /* short form, 0: none */
	bool arg;
	int key;
};

static const struct gopt gopts[] = {
    {"socket", 0, true, 's'},          {"events", 0, true, 'e'},   {"json", 0, false, 'j'},
    {"timeout", 0, true, 't'},         {"quiet", 'q', false, 'q'}, {"output", 'o', true, 'o'},
    {"tls-cert", 0, true, 'C'},        {"tls-key", 0, true, 'K'},  {"tls-ca", 0, true, 'A'},
    {"tls-server-name", 0, true, 'N'}, {"version", 0, false, 'V'},
};

static int set_global(struct cli *cli, int key, const char *val)
{
	switch (key) {
	case 's':
		cli->socket = val;
		break;
	case 'e':
		cli->events = val;
		break;
	case 'j':
		cli->json = true;
		break;
	case 'q':
		cli->quiet = true;
		break;
	case 'C':
		cli->tls.cert_file = val;
		break;
	case 'K':
		cli->tls.key_file = val;
		break;
	case 'A':
		cli->tls.ca_file = val;
		break;
	case 'N':
		cli->tls.server_name = val;
		break;
	case 't': {
		char *end;
		long v = strtol(val, &end, 10);
		if (!*val || *end || v <= 0 || v > 24L * 3600 * 1000)
			return cli_usage(
			    cli, NULL,
			    "--timeout: '%s' is not a number of milliseconds (1..86400000)", val);
		cli->timeout_ms = (int)v;
		cli->timeout_given = true;
		break;
	}
	case 'o':
		if (strcmp(val, "json") == 0)
			cli->json = true;
		else if (strcmp(val, "wide") == 0)
			cli->wide = true;
		else if (strcmp(val, "table") == 0)
			cli->json = cli->wide = false;
		else
			return cli_usage(cli, NULL, "-o: '%s' is not json, wide or table", val);
		break;
	}
	return 0;
}

/* Removes the global options from argv (compacting it); returns the new argc or -exit code. */
static int take_globals(struct cli *cli, int argc, char **argv, bool *version)
{
	int n = 1;
	bool ended = false;
	for (int i = 1; i < argc; i++) {
		char *a = argv[i];
		if (ended || a[0] != '-' || a[1] == '\0') {
			argv[n++] = a;
			continue;
		}
		if (strcmp(a, "--") == 0) {
			ended = true;
			argv[n++] = a;
			continue;
		}
		const struct gopt *g = NULL;
		const char *val = NULL;
		for (size_t k = 0; k < sizeof gopts / sizeof gopts[0] && !g; k++) {
			size_t l = strlen(gopts[k].name);
			if (a[1] == '-' && strncmp(a + 2, gopts[k].name, l) == 0 &&
			    (a[2 + l] == '\0' || (a[2 + l] == '=' && gopts[k].arg))) {
				g = &gopts[k];
				val = a[2 + l] == '=' ? a + 3 + l : NULL;
			} else if (a[1] != '-' && gopts[k].shrt && a[1] == gopts[k].shrt) {
				/* -q, -o json, -ojson */
				if (!gopts[k].arg && a[2] != '\0')
					continue;
				g = &gopts[k];
				val = gopts[k].arg && a[2] ? a + 2 : NULL;
			}
		}
		if (!g) {
			argv[n++] = a; /* the command's own option */
			continue;
		}
		if (g->arg && !val) {
			if (i + 1 >= argc)
				return -cli_usage(cli, NULL, "option '%s' needs a value", a);
			val = argv[++i];
		}
		if (g->key == 'V') {
			*version = true;
			continue;
		}
		int rc = set_global(cli, g->key, val);
		if (rc)
			return -rc;
	}
	argv[n] = NULL;
	return n;
}

static int finish(struct cli *cli, int rc)
{
	/* With --json an error is a document on stdout, unless the command printed its own (an
	 * --all command reports each worker's error in its document). */
	if (rc != CLI_EXIT_OK && cli->json && !cli->doc_printed)
		cli_json_print(
		    cli, cli_error_json(rc, cli->err_msg[0] ? cli->err_msg : cli_exit_name(rc)));
	fflush(stdout);
	return rc;
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

	bool version = false;
	int n = take_globals(&cli, argc, argv, &version);
	if (n < 0)
		return finish(&cli, -n);
	argc = n;
	if (version) {
		if (cli.json) {
			struct json_object *o = json_object_new_object();
			json_object_object_add(o, "version",
			                       json_object_new_string(AGENTCTL_VERSION));
			cli_json_print(&cli, o);
		} else {
			printf("agentctl %s\n", AGENTCTL_VERSION);
		}
		return CLI_EXIT_OK;
	}
	/* Empty environment variables mean unset. */
	if (cli.tls.cert_file && !*cli.tls.cert_file)
		cli.tls.cert_file = NULL;
	if (cli.tls.key_file && !*cli.tls.key_file)
		cli.tls.key_file = NULL;
	if (cli.tls.ca_file && !*cli.tls.ca_file)
		cli.tls.ca_file = NULL;
	if (argc < 2)
		return finish(&cli, cli_usage(&cli, NULL, "no COMMAND given"));
	const char *name = argv[1];
	if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0 || strcmp(name, "help") == 0) {
		usage(stdout);
		return CLI_EXIT_OK;
	}
	if (name[0] == '-')
		return finish(&cli, cli_usage(&cli, NULL, "unknown option '%s'", name));
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++) {
		if (strcmp(commands[i].name, name) == 0)
			return finish(&cli, commands[i].run(&cli, argc - 1, argv + 1));
	}
	return finish(&cli, cli_usage(&cli, NULL, "unknown command '%s'", name));
}
