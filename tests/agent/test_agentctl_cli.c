/* agentctl as scripts use it, against a real wf-agent: exit codes by status, JSON errors on
 * stdout, global flags anywhere, usage errors that say what was wrong, per-command --help, the
 * protocol's field names in JSON, one document per command, tables sized by their content, and
 * the progress line's rate/ETA formatting (a unit: bars need a terminal). */
#include "common/wftest.h"
#include "control/agentctl/cli.h"
#include "tests/agent/agt.h"
#include "tests/agent/agt_json.h"

#include <criterion/criterion.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

TestSuite(agentctl_cli, .fini = agt_fini, .timeout = 120);

static struct agt *started(const char *tag)
{
	struct agt *a = agt_new(tag);
	agt_start(a, NULL, NULL);
	return a;
}

Test(agentctl_cli, exit_codes_and_json_errors)
{
	struct agt *a = started("ctl-codes");
	char *out, *err;
	/* not found: 3, with the JSON error on stdout and the line on stderr */
	int rc = agt_ctl(a, &out, &err, (const char *[]){"models", "nosuch", "--json", NULL});
	cr_assert_eq(rc, CLI_EXIT_NOT_FOUND, "exit %d: %s", rc, err);
	struct json_object *o = agt_json_parse(out, "not found");
	struct json_object *e = agt_json_key(o, "error");
	cr_assert_str_eq(json_object_get_string(agt_json_key(e, "code")), "NOT_FOUND");
	cr_assert_eq(json_object_get_int(agt_json_key(e, "exit_code")), 3);
	cr_assert(strstr(json_object_get_string(agt_json_key(e, "message")), "nosuch"));
	cr_assert(strstr(err, "NOT_FOUND"), "stderr: %s", err);
	json_object_put(o);
	/* -q with --json: stdout only */
	rc = agt_ctl(a, &out, &err, (const char *[]){"-q", "-o", "json", "models", "nosuch", NULL});
	cr_assert_eq(rc, 3);
	cr_assert_str_eq(err, "");
	/* invalid argument: a file that is not a model */
	char *bad = agt_printf("%s/bad.gguf", a->models);
	FILE *f = fopen(bad, "w");
	fputs("this is not a model", f);
	fclose(f);
	rc = agt_ctl(a, &out, &err, (const char *[]){"inspect", bad, NULL});
	cr_assert_eq(rc, CLI_EXIT_INVALID_ARGUMENT, "inspect of garbage: exit %d: %s", rc, err);
	/* usage: 2, what was wrong and the hint */
	rc = agt_ctl(a, &out, &err, (const char *[]){"status", "extra", NULL});
	cr_assert_eq(rc, CLI_EXIT_USAGE);
	cr_assert(strstr(err, "unexpected argument 'extra'") &&
	              strstr(err, "agentctl status --help"),
	          "stderr: %s", err);
	rc = agt_ctl(a, &out, &err, (const char *[]){"pin", "m", "--frob", NULL});
	cr_assert_eq(rc, CLI_EXIT_USAGE);
	cr_assert(strstr(err, "--frob"), "stderr: %s", err);
	rc = agt_ctl(a, &out, &err, (const char *[]){"residency", "m", "moon", NULL});
	cr_assert_eq(rc, CLI_EXIT_USAGE);
	cr_assert(strstr(err, "moon"), "stderr: %s", err);
	rc = agt_ctl(a, &out, &err, (const char *[]){"--timeout", "soon", "status", NULL});
	cr_assert_eq(rc, CLI_EXIT_USAGE);
	/* agent down: 4 */
	cr_assert_eq(agt_stop(a, 10000), 0);
	rc =
	    agt_ctl(a, &out, &err, (const char *[]){"status", "--timeout", "1000", "--json", NULL});
	cr_assert_eq(rc, CLI_EXIT_UNAVAILABLE, "agent down: exit %d: %s", rc, err);
	o = agt_json_parse(out, "agent down");
	cr_assert_str_eq(json_object_get_string(agt_json_key(agt_json_key(o, "error"), "code")),
	                 "UNAVAILABLE");
	json_object_put(o);
}

Test(agentctl_cli, flags_anywhere_help_and_version)
{
	struct agt *a = started("ctl-flags");
	char *out, *err;
	/* --json after the command, -o json, and before: the same document */
	int rc = agt_ctl(a, &out, &err, (const char *[]){"status", "--json", NULL});
	cr_assert_eq(rc, 0, "%s", err);
	json_object_put(agt_json_parse(out, "status --json"));
	rc = agt_ctl(a, &out, &err,
	             (const char *[]){"status", "-o", "json", "--timeout=5000", NULL});
	cr_assert_eq(rc, 0, "%s", err);
	json_object_put(agt_json_parse(out, "status -o json"));
	rc = agt_ctl(a, &out, &err, (const char *[]){"-o", "yaml", "status", NULL});
	cr_assert_eq(rc, 2);
	cr_assert(strstr(err, "yaml"), "%s", err);
	/* each command's --help is its own */
	rc = agt_ctl(a, &out, &err, (const char *[]){"watch", "--help", NULL});
	cr_assert_eq(rc, 0);
	cr_assert(strstr(out, "agentctl watch") && strstr(out, "--count"), "%s", out);
	rc = agt_ctl(a, &out, &err, (const char *[]){"register", "--help", NULL});
	cr_assert(strstr(out, "agentctl register NAME PATH") && strstr(out, "--pin"), "%s", out);
	rc = agt_ctl(a, &out, &err, (const char *[]){"--version", NULL});
	cr_assert_eq(rc, 0);
	cr_assert(strncmp(out, "agentctl ", 9) == 0, "%s", out);
}

Test(agentctl_cli, json_shapes_and_tables)
{
	struct agt *a = started("ctl-json");
	char *pm = agt_gen(a, "m", 3, NULL);
	const char *longname = "Qwen/Qwen3-30B-A3B-Instruct-2507-GGUF:Q4_K_M";
	char *out, *err;
	int rc = agt_ctl(a, &out, &err, (const char *[]){"register", longname, pm, NULL});
	cr_assert_eq(rc, 0, "register: %s", err);
	/* the table holds the whole name and the columns after it line up under their header */
	rc = agt_ctl(a, &out, &err, (const char *[]){"models", NULL});
	cr_assert_eq(rc, 0, "%s", err);
	const char *row = strstr(out, longname);
	cr_assert_not_null(row, "name cut:\n%s", out);
	const char *st_hdr = strstr(out, "STATE");
	cr_assert_not_null(st_hdr);
	cr_assert_eq(st_hdr - out, strstr(row, "DISK") - row, "STATE column misaligned:\n%s", out);
	/* models NAME: the detail */
	rc = agt_ctl(a, &out, &err, (const char *[]){"models", longname, NULL});
	cr_assert_eq(rc, 0, "%s", err);
	cr_assert(strstr(out, "holders") && strstr(out, pm) && strstr(out, "digest"), "%s", out);

	/* inspect: the protocol's names; several files: one array */
	rc = agt_ctl(a, &out, &err, (const char *[]){"inspect", pm, "--json", NULL});
	cr_assert_eq(rc, 0, "%s", err);
	struct json_object *o = agt_json_parse(out, "inspect");
	cr_assert_geq(strlen(json_object_get_string(agt_json_key(o, "digest_hex"))), 32);
	struct json_object *f0 = json_object_array_get_idx(agt_json_key(o, "files"), 0);
	cr_assert_gt(json_object_get_int64(agt_json_key(f0, "size_bytes")), 0);
	json_object_put(o);
	rc = agt_ctl(a, &out, &err, (const char *[]){"inspect", pm, pm, "--json", NULL});
	cr_assert_eq(rc, 0, "%s", err);
	o = agt_json_parse(out, "inspect A B");
	cr_assert(json_object_is_type(o, json_type_array));
	cr_assert_eq(json_object_array_length(o), 2);
	json_object_put(o);

	/* status: models under "models", counts under "model_counts" */
	rc = agt_ctl(a, &out, &err, (const char *[]){"status", "--json", NULL});
	cr_assert_eq(rc, 0, "%s", err);
	o = agt_json_parse(out, "status");
	struct json_object *ms = agt_json_key(o, "models");
	cr_assert(json_object_is_type(ms, json_type_array));
	cr_assert_str_eq(
	    json_object_get_string(agt_json_key(json_object_array_get_idx(ms, 0), "name")),
	    longname);
	cr_assert_eq(json_object_get_int(agt_json_key(agt_json_key(o, "model_counts"), "total")),
	             1);
	agt_json_key(o, "pid");
	cr_assert_not(json_object_object_get_ex(o, "model_list", NULL));
	json_object_put(o);

	/* compact --all --json with no worker: one document saying why */
	rc = agt_ctl(a, &out, &err, (const char *[]){"compact", "--all", "--json", NULL});
	cr_assert_eq(rc, CLI_EXIT_NOT_FOUND, "%s", err);
	o = agt_json_parse(out, "compact --all");
	agt_json_key(o, "error");
	json_object_put(o);
	/* human uptime */
	rc = agt_ctl(a, &out, &err, (const char *[]){"status", NULL});
	cr_assert(strstr(out, ", up ") && !strstr(out, " s\n"), "%s", out);
}

Test(agentctl_cli, progress_line_format)
{
	char buf[256], b2[32];
	cli_fmt_progress(buf, sizeof buf, 512ull << 20, 1024ull << 20, 256ull << 20, 10);
	cr_assert_str_eq(buf, "[#####.....]  50.0%  512 MiB / 1.00 GiB  256 MiB/s  ETA 2s");
	cli_fmt_progress(buf, sizeof buf, 1024, 1024, 0, 4);
	cr_assert_str_eq(buf, "[####] 100.0%  1.00 KiB / 1.00 KiB  - B/s  done");
	cli_fmt_progress(buf, sizeof buf, 0, 1000, 0, 0);
	cr_assert_str_eq(buf, "  0.0%  0 B / 1000 B  - B/s  ETA -");
	cr_assert_str_eq(cli_fmt_duration(3 * 86400000ull + 4 * 3600000ull, b2, sizeof b2),
	                 "3d 4h");
	cr_assert_str_eq(cli_fmt_duration(12 * 60000ull + 5000, b2, sizeof b2), "12m 5s");
	cr_assert_str_eq(cli_fmt_duration(850, b2, sizeof b2), "850 ms");
}
