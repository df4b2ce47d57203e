/* agentctl reload MODEL [--dry-run]: the tensors of MODEL's files that changed on disk, loaded
 * into its floor as one generation (ReloadModel, docs/PROTOCOL.md); workers refresh exactly
 * those. Prints a line of counts and a table of the reloaded and refused tensors. Exit status:
 * the reply's, and FAILED_PRECONDITION when a tensor was refused (nothing was published). */
#include "cli.h"
#include "pbjson.h"

#include "control/client.h"

#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>

/* A reload reads the changed files whole: without --timeout, wait this long for it. */
#define RELOAD_TIMEOUT_MS (30 * 60 * 1000)

static void print_reload(const Weightfloor__V1__ReloadReply *r)
{
	char b1[32], b2[32];
	const char *what = r->tensors_refused ? "refused, nothing published"
	                   : r->dry_run       ? "dry run, nothing published"
	                   : r->published     ? "published"
	                                      : "nothing changed";
	printf("model %s (floor %.12s): %s; generation %" PRIu64 "\n", r->name, r->digest_hex, what,
	       r->generation);
	printf("%u of %u files changed, %s read; tensors: %u reloaded (%s), %u unchanged, %u "
	       "refused; %.3f s\n",
	       r->files_changed, r->files, cli_fmt_bytes(r->bytes_read, b1, sizeof b1),
	       r->tensors_reloaded, cli_fmt_bytes(r->bytes_reloaded, b2, sizeof b2),
	       r->tensors_unchanged, r->tensors_refused, r->seconds);
	if (!r->n_tensors)
		return;
	static const char *const hdr[] = {"TENSOR", "OUTCOME", "SIZE", "REASON"};
	struct cli_table *t = cli_table_new(4, hdr, "..r.");
	for (size_t i = 0; i < r->n_tensors; i++) {
		const Weightfloor__V1__TensorReload *e = r->tensors[i];
		bool ok = e->outcome == WEIGHTFLOOR__V1__RELOAD_OUTCOME__RELOAD_OUTCOME_RELOADED;
		cli_table_addf(t, 0, "%s", e->name);
		cli_table_addf(t, 1, "%s",
		               ok ? (r->published ? "reloaded" : "would reload") : "refused");
		cli_table_addf(t, 2, "%s", ok ? cli_fmt_bytes(e->size, b1, sizeof b1) : "-");
		cli_table_addf(t, 3, "%s", ok ? "" : e->reason);
	}
	cli_table_print(t, stdout);
	cli_table_free(t);
	uint32_t listed = (uint32_t)r->n_tensors;
	if (listed < r->tensors_reloaded + r->tensors_refused)
		printf("(%u more not listed)\n", r->tensors_reloaded + r->tensors_refused - listed);
}

int cmd_reload(struct cli *cli, int argc, char **argv)
{
	static const char *usage_text =
	    "usage: agentctl reload MODEL [--dry-run]\n"
	    "  Loads the tensors of MODEL's files that changed on disk into its floor, all as one\n"
	    "  new generation; workers refresh exactly those, between two decode steps. Files\n"
	    "  whose size, times and inode are unchanged are not read; in the others each tensor\n"
	    "  is compared by content (its checksum). A tensor whose shape or type changed, that\n"
	    "  vanished or is new is refused, and then nothing is published. --dry-run: read and\n"
	    "  compare only. --json: the ReloadReply.\n";
	static const struct option opts[] = {
	    {"dry-run", no_argument, NULL, 'n'},
	    {"help", no_argument, NULL, 'h'},
	    {0},
	};
	bool dry = false;
	int c, rc = 0;
	optind = 0; /* glibc re-initializes (and permutes: options anywhere) */
	opterr = 0;
	while (rc == 0 && (c = getopt_long(argc, argv, ":nh", opts, NULL)) != -1) {
		switch (c) {
		case 'n':
			dry = true;
			break;
		case 'h':
			printf("%s", usage_text);
			return CLI_EXIT_OK;
		default:
			rc = cli_bad_option(cli, "reload", argc, argv);
		}
	}
	if (rc == 0)
		rc = cli_check_args(cli, "reload", argc, argv, optind, 1, 1, "MODEL");
	if (rc)
		return rc;
	Weightfloor__V1__ReloadModel rm = WEIGHTFLOOR__V1__RELOAD_MODEL__INIT;
	rm.name = argv[optind];
	rm.dry_run = dry;
	Weightfloor__V1__Request req = WEIGHTFLOOR__V1__REQUEST__INIT;
	req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_RELOAD_MODEL;
	req.reload_model = &rm;
	Weightfloor__V1__Reply *rep = NULL;
	rc = cli_call(cli, "reload", &req, cli->timeout_given ? 0 : RELOAD_TIMEOUT_MS, &rep);
	if (rc == 0 && rep->body_case != WEIGHTFLOOR__V1__REPLY__BODY_RELOAD)
		rc = cli_fail(cli, CLI_EXIT_FAIL, "reload: unexpected reply");
	if (rc == 0) {
		const Weightfloor__V1__ReloadReply *r = rep->reload;
		if (cli->json)
			cli_json_print(cli, wf_pb_to_json(&r->base));
		else
			print_reload(r);
		if (r->tensors_refused && !cli->json)
			rc = cli_fail(cli, CLI_EXIT_FAILED_PRECONDITION,
			              "reload: %u tensor(s) refused: nothing was published",
			              r->tensors_refused);
		else if (r->tensors_refused)
			rc = CLI_EXIT_FAILED_PRECONDITION;
	}
	wf_ctl_reply_free(rep);
	return rc;
}
