/* agentctl publish MODEL --tensor NAME=FILE [...]: new contents for tensors of a model's floor,
 * published by the agent as one generation (PublishTensors, docs/PROTOCOL.md).
 *
 * Two requests: a dry run with the names and the files' sizes only, so that an unknown tensor,
 * a file of the wrong size or a full spare area is refused before any byte travels; then the
 * publish with the bytes, checked first against the largest request the agent said it takes. */
#include "cli.h"
#include "pbjson.h"

#include "base/error.h"
#include "control/client.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The most one request may carry, whatever the agent says: its max_message is capped there. */
#define PUBLISH_MAX_REQUEST ((size_t)1 << 30)

struct pub_file {
	char *name;       /* the tensor (points into argv) */
	const char *path; /* the file */
	uint64_t size;
	uint8_t *data; /* read after the dry run */
};

/* NAME=FILE: the tensor name is everything before the first '=' (names hold none). */
static int add_tensor(struct cli *cli, struct pub_file **v, size_t *n, char *arg)
{
	char *eq = strchr(arg, '=');
	if (!eq || eq == arg || !eq[1])
		return cli_usage(cli, "publish", "--tensor takes NAME=FILE, not '%s'", arg);
	struct pub_file *nv = realloc(*v, (*n + 1) * sizeof(*nv));
	if (!nv)
		return cli_fail(cli, CLI_EXIT_FAIL, "publish: out of memory");
	*v = nv;
	*eq = '\0';
	nv[*n] = (struct pub_file){.name = arg, .path = eq + 1};
	(*n)++;
	return 0;
}

static int stat_file(struct cli *cli, struct pub_file *pf)
{
	struct stat st;
	if (stat(pf->path, &st) != 0)
		return cli_fail(cli, cli_exit_for_err(-errno), "publish: %s (tensor '%s'): %s",
		                pf->path, pf->name, strerror(errno));
	if (!S_ISREG(st.st_mode))
		return cli_fail(cli, CLI_EXIT_INVALID_ARGUMENT,
		                "publish: %s (tensor '%s') is not a regular file", pf->path,
		                pf->name);
	pf->size = (uint64_t)st.st_size;
	return 0;
}

/* Reads the whole file; it must still be the size the dry run was given. */
static int read_file(struct cli *cli, struct pub_file *pf)
{
	int fd = open(pf->path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return cli_fail(cli, cli_exit_for_err(-errno), "publish: %s: %s", pf->path,
		                strerror(errno));
	pf->data = malloc(pf->size ? pf->size : 1);
	uint64_t got = 0;
	ssize_t r = 0;
	while (pf->data && got < pf->size) {
		r = read(fd, pf->data + got, pf->size - got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		got += (uint64_t)r;
	}
	char extra;
	bool longer = got == pf->size && read(fd, &extra, 1) > 0;
	int err = r < 0 ? errno : 0;
	close(fd);
	if (!pf->data)
		return cli_fail(cli, CLI_EXIT_FAIL, "publish: %s: out of memory", pf->path);
	if (err)
		return cli_fail(cli, CLI_EXIT_FAIL, "publish: read %s: %s", pf->path,
		                strerror(err));
	if (got != pf->size || longer)
		return cli_fail(cli, CLI_EXIT_FAILED_PRECONDITION,
		                "publish: %s changed while it was read (%" PRIu64
		                " bytes when checked): nothing was published",
		                pf->path, pf->size);
	return 0;
}

static void print_reply(struct cli *cli, const Weightfloor__V1__PublishReply *pr,
                        const struct pub_file *files, bool dry)
{
	if (cli->json) {
		cli_json_print(cli, wf_pb_to_json(&pr->base));
		return;
	}
	char b1[32], b2[32], b3[32];
	if (dry)
		printf("dry run: model %s (floor %.12s) at generation %" PRIu64
		       " would take these tensors; spare %s of %s used\n",
		       pr->name, pr->digest_hex, pr->generation,
		       cli_fmt_bytes(pr->spare_used_bytes, b1, sizeof b1),
		       cli_fmt_bytes(pr->spare_bytes, b2, sizeof b2));
	else
		printf("model %s (floor %.12s): published generation %" PRIu64
		       "; spare %s of %s used\n",
		       pr->name, pr->digest_hex, pr->generation,
		       cli_fmt_bytes(pr->spare_used_bytes, b1, sizeof b1),
		       cli_fmt_bytes(pr->spare_bytes, b2, sizeof b2));
	static const char *const hdr[] = {"ID", "TENSOR", "SIZE"};
	struct cli_table *t = cli_table_new(3, hdr, "r.r");
	for (size_t i = 0; i < pr->n_tensor_ids; i++) {
		cli_table_addf(t, 0, "%" PRIu32, pr->tensor_ids[i]);
		cli_table_addf(t, 1, "%s", i < pr->n_tensor_names ? pr->tensor_names[i] : "?");
		cli_table_addf(t, 2, "%s", cli_fmt_bytes(files[i].size, b3, sizeof b3));
	}
	cli_table_print(t, stdout);
	cli_table_free(t);
}

/* One PublishTensors; with data false, the dry run with the sizes alone. */
static int send_publish(struct cli *cli, const char *model, struct pub_file *files, size_t n,
                        bool data, size_t max_request, Weightfloor__V1__Reply **ret)
{
	Weightfloor__V1__TensorBytes *tb = calloc(n, sizeof(*tb));
	Weightfloor__V1__TensorBytes **tbp = calloc(n, sizeof(*tbp));
	if (!tb || !tbp) {
		free(tb);
		free(tbp);
		return cli_fail(cli, CLI_EXIT_FAIL, "publish: out of memory");
	}
	for (size_t i = 0; i < n; i++) {
		weightfloor__v1__tensor_bytes__init(&tb[i]);
		tb[i].name = files[i].name;
		tb[i].size = files[i].size;
		if (data) {
			tb[i].data.data = files[i].data;
			tb[i].data.len = files[i].size;
		}
		tbp[i] = &tb[i];
	}
	Weightfloor__V1__PublishTensors pt = WEIGHTFLOOR__V1__PUBLISH_TENSORS__INIT;
	pt.name = (char *)model;
	pt.tensors = tbp;
	pt.n_tensors = n;
	pt.dry_run = !data;
	Weightfloor__V1__Request req = WEIGHTFLOOR__V1__REQUEST__INIT;
	req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_PUBLISH_TENSORS;
	req.publish_tensors = &pt;
	int rc;
	/* The envelope adds a few dozen bytes to the body. */
	size_t size = protobuf_c_message_get_packed_size(&req.base) + 64;
	if (data && max_request && size > max_request) {
		char b1[32], b2[32];
		rc = cli_fail(cli, CLI_EXIT_RESOURCE_EXHAUSTED,
		              "publish: the request would be %s, the agent takes at most %s "
		              "(its max_message): publish fewer tensors at a time, or raise "
		              "max_message; nothing was published",
		              cli_fmt_bytes(size, b1, sizeof b1),
		              cli_fmt_bytes(max_request, b2, sizeof b2));
	} else {
		rc = cli_call(cli, data ? "publish" : "publish (check)", &req, 0, ret);
	}
	free(tb);
	free(tbp);
	return rc;
}

int cmd_publish(struct cli *cli, int argc, char **argv)
{
	static const char *usage_text =
	    "usage: agentctl publish MODEL --tensor NAME=FILE [--tensor NAME=FILE]... [--dry-run]\n"
	    "  Publishes new contents for tensors of MODEL's floor, all as one new generation\n"
	    "  of the floor; workers refresh exactly those tensors. Each FILE holds the tensor's\n"
	    "  raw bytes, exactly its size (its type and shape stay). The agent first checks the\n"
	    "  names, the sizes and the room in the floor's spare area: when one is wrong, no\n"
	    "  byte is sent and nothing changes. Prints the generation and each tensor's id\n"
	    "  (--json: the PublishReply). --dry-run: the check alone.\n";
	static const struct option opts[] = {
	    {"tensor", required_argument, NULL, 't'},
	    {"dry-run", no_argument, NULL, 'n'},
	    {"help", no_argument, NULL, 'h'},
	    {0},
	};
	struct pub_file *files = NULL;
	size_t n = 0;
	bool dry = false;
	int c, rc = 0;
	optind = 0; /* 0, not 1: glibc then re-initializes (and permutes: options anywhere) */
	opterr = 0;
	while (rc == 0 && (c = getopt_long(argc, argv, ":t:nh", opts, NULL)) != -1) {
		switch (c) {
		case 't':
			rc = add_tensor(cli, &files, &n, optarg);
			break;
		case 'n':
			dry = true;
			break;
		case 'h':
			printf("%s", usage_text);
			free(files);
			return CLI_EXIT_OK;
		default:
			rc = cli_bad_option(cli, "publish", argc, argv);
		}
	}
	if (rc == 0)
		rc = cli_check_args(cli, "publish", argc, argv, optind, 1, 1, "MODEL");
	if (rc == 0 && n == 0)
		rc = cli_usage(cli, "publish", "give at least one --tensor NAME=FILE");
	for (size_t i = 0; rc == 0 && i < n; i++)
		rc = stat_file(cli, &files[i]);
	if (rc) {
		free(files);
		return rc;
	}
	const char *model = argv[optind];
	/* A request of up to the agent's limit must not be refused here first. */
	cli->max_request_size = PUBLISH_MAX_REQUEST;

	Weightfloor__V1__Reply *rep = NULL;
	rc = send_publish(cli, model, files, n, false, 0, &rep);
	if (rc == 0 && rep->body_case != WEIGHTFLOOR__V1__REPLY__BODY_PUBLISH)
		rc = cli_fail(cli, CLI_EXIT_FAIL, "publish: unexpected reply");
	if (rc == 0 && dry)
		print_reply(cli, rep->publish, files, true);
	if (rc == 0 && !dry) {
		size_t max = (size_t)rep->publish->max_request_bytes;
		for (size_t i = 0; rc == 0 && i < n; i++)
			rc = read_file(cli, &files[i]);
		wf_ctl_reply_free(rep);
		rep = NULL;
		if (rc == 0)
			rc = send_publish(cli, model, files, n, true, max, &rep);
		if (rc == 0 && rep->body_case != WEIGHTFLOOR__V1__REPLY__BODY_PUBLISH)
			rc = cli_fail(cli, CLI_EXIT_FAIL, "publish: unexpected reply");
		if (rc == 0)
			print_reply(cli, rep->publish, files, false);
	}
	wf_ctl_reply_free(rep);
	for (size_t i = 0; i < n; i++)
		free(files[i].data);
	free(files);
	return rc;
}
