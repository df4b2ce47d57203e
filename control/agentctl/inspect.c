/* agentctl inspect FILE...: the inventory of model files, read from their headers only. */
#include "cli.h"

#include "base/error.h"
#include "model/model.h"

#include <getopt.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <stdio.h>
#include <string.h>

static const char *dtype_name(enum wf_dtype t)
{
	const struct wf_dtype_info *di = wf_dtype_info(t);
	return di ? di->name : "?";
}

static struct json_object *hparams_json(const struct wf_hparams *hp)
{
	struct json_object *o = json_object_new_object();
	json_object_object_add(o, "arch", json_object_new_string(hp->arch));
#define U32(field) json_object_object_add(o, #field, json_object_new_int64(hp->field))
	U32(n_layer);
	U32(n_embd);
	U32(n_head);
	U32(n_head_kv);
	U32(head_dim);
	U32(n_ff);
	U32(n_ff_exp);
	U32(n_expert);
	U32(n_expert_used);
	U32(n_ctx_train);
	U32(n_vocab);
	U32(rope_dim);
#undef U32
	json_object_object_add(o, "rope_freq_base", json_object_new_double(hp->rope_freq_base));
	json_object_object_add(o, "rms_eps", json_object_new_double(hp->rms_eps));
	return o;
}

static struct json_object *model_json(const char *path, const struct wf_model *m,
                                      const char *digest)
{
	struct json_object *o = json_object_new_object();
	json_object_object_add(o, "path", json_object_new_string(path));
	json_object_object_add(o, "format",
	                       json_object_new_string(wf_model_format_name(m->format)));
	json_object_object_add(o, "digest_hex", json_object_new_string(digest));
	json_object_object_add(o, "hparams", hparams_json(&m->hp));
	json_object_object_add(o, "tensor_count", json_object_new_int64(m->n_tensors));
	json_object_object_add(o, "total_bytes", json_object_new_int64((int64_t)m->total_bytes));
	json_object_object_add(o, "dense_bytes", json_object_new_int64((int64_t)m->dense_bytes));
	json_object_object_add(o, "expert_bytes", json_object_new_int64((int64_t)m->expert_bytes));

	struct json_object *by = json_object_new_object();
	for (unsigned t = 0; t < WF_DTYPE_MAX_; t++) {
		if (!m->count_by_dtype[t])
			continue;
		struct json_object *e = json_object_new_object();
		json_object_object_add(e, "tensors", json_object_new_int64(m->count_by_dtype[t]));
		json_object_object_add(e, "bytes",
		                       json_object_new_int64((int64_t)m->bytes_by_dtype[t]));
		json_object_object_add(by, dtype_name(t), e);
	}
	json_object_object_add(o, "bytes_by_type", by);

	struct json_object *files = json_object_new_array();
	for (uint32_t i = 0; i < m->n_files; i++) {
		const struct wf_model_file *f = &m->files[i];
		struct json_object *e = json_object_new_object();
		json_object_object_add(e, "path", json_object_new_string(f->path));
		json_object_object_add(e, "size_bytes", json_object_new_int64((int64_t)f->size));
		json_object_object_add(e, "data_offset",
		                       json_object_new_int64((int64_t)f->data_offset));
		json_object_object_add(e, "tensors", json_object_new_int64(f->n_tensors));
		if (f->gguf_version)
			json_object_object_add(e, "gguf_version",
			                       json_object_new_int64(f->gguf_version));
		json_object_array_add(files, e);
	}
	json_object_object_add(o, "files", files);

	struct json_object *tensors = json_object_new_array();
	for (uint32_t i = 0; i < m->n_tensors; i++) {
		const struct wf_tensor *t = &m->tensors[i];
		struct json_object *e = json_object_new_object();
		json_object_object_add(e, "name", json_object_new_string(t->name));
		json_object_object_add(e, "type", json_object_new_string(dtype_name(t->dtype)));
		struct json_object *ne = json_object_new_array();
		for (uint32_t d = 0; d < t->n_dims; d++)
			json_object_array_add(ne, json_object_new_int64(t->ne[d]));
		json_object_object_add(e, "ne", ne);
		json_object_object_add(e, "bytes", json_object_new_int64((int64_t)t->nbytes));
		json_object_object_add(e, "file", json_object_new_int64(t->file));
		json_object_object_add(e, "offset", json_object_new_int64((int64_t)t->offset));
		json_object_object_add(
		    e, "class",
		    json_object_new_string(t->tclass == WF_TENSOR_EXPERT ? "expert" : "dense"));
		json_object_array_add(tensors, e);
	}
	json_object_object_add(o, "tensors", tensors);
	return o;
}

static void model_print(const char *path, const struct wf_model *m, const char *digest)
{
	char b1[32], b2[32], b3[32];
	const struct wf_hparams *hp = &m->hp;
	printf("model     %s\n", path);
	printf("format    %s", wf_model_format_name(m->format));
	if (m->format == WF_MODEL_FORMAT_GGUF && m->n_files)
		printf(" v%u", m->files[0].gguf_version);
	printf(", %u file%s\n", m->n_files, m->n_files == 1 ? "" : "s");
	printf("arch      %s\n", hp->arch[0] ? hp->arch : "(unknown)");
	printf("digest    %s\n", digest);
	printf("hparams   layers %u, embd %u, heads %u/%u x %u, ff %u, experts %u (%u used), "
	       "expert ff %u, vocab %u, ctx %u\n",
	       hp->n_layer, hp->n_embd, hp->n_head, hp->n_head_kv, hp->head_dim, hp->n_ff,
	       hp->n_expert, hp->n_expert_used, hp->n_ff_exp, hp->n_vocab, hp->n_ctx_train);
	printf("tensors   %u\n", m->n_tensors);
	printf("bytes     %s total, %s dense, %s experts\n",
	       cli_fmt_bytes(m->total_bytes, b1, sizeof b1),
	       cli_fmt_bytes(m->dense_bytes, b2, sizeof b2),
	       cli_fmt_bytes(m->expert_bytes, b3, sizeof b3));
	printf("\n%-10s %8s %12s\n", "TYPE", "TENSORS", "BYTES");
	for (unsigned t = 0; t < WF_DTYPE_MAX_; t++) {
		if (m->count_by_dtype[t])
			printf("%-10s %8u %12s\n", dtype_name(t), m->count_by_dtype[t],
			       cli_fmt_bytes(m->bytes_by_dtype[t], b1, sizeof b1));
	}
	printf("\n%-5s %12s %8s  %s\n", "FILE", "SIZE", "TENSORS", "PATH");
	for (uint32_t i = 0; i < m->n_files; i++)
		printf("%-5u %12s %8u  %s\n", i, cli_fmt_bytes(m->files[i].size, b1, sizeof b1),
		       m->files[i].n_tensors, m->files[i].path);
}

static const char inspect_help[] =
    "usage: agentctl inspect FILE... [--json]\n"
    "  Prints the inventory of GGUF or safetensors models, read from their headers (no agent\n"
    "  needed): architecture, hyper-parameters, bytes by type, dense vs expert bytes, shards,\n"
    "  digest. A shard, an index.json or a directory opens the whole model.\n"
    "  --json  one document: an object for one FILE, an array of them for several (each with\n"
    "          \"path\"; a FILE that cannot be read is {\"path\", \"error\"}), listing every\n"
    "          tensor. Field names as in ModelInfo: digest_hex, total_bytes, files[].size_bytes.\n";

int cmd_inspect(struct cli *cli, int argc, char **argv)
{
	static const struct option opts[] = {
	    {"help", no_argument, NULL, 'h'},
	    {0},
	};
	int c;
	optind = 0; /* 0, not 1: glibc then re-initializes (and permutes: options anywhere) */
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
		switch (c) {
		case 'h':
			printf("%s", inspect_help);
			return CLI_EXIT_OK;
		default:
			return cli_bad_option(cli, "inspect", argc, argv);
		}
	}
	int rc_all = cli_check_args(cli, "inspect", argc, argv, optind, 1, -1, "FILE");
	if (rc_all)
		return rc_all;
	bool many = argc - optind > 1;
	struct json_object *arr = cli->json && many ? json_object_new_array() : NULL;
	for (int i = optind; i < argc; i++) {
		struct wf_model *m = NULL;
		struct wf_diag diag = {{0}};
		int rc = wf_model_open(argv[i], &m, &diag);
		if (rc < 0) {
			char msg[512];
			snprintf(msg, sizeof msg, "inspect %s: %s (%s)", argv[i],
			         wf_diag_str(&diag, rc), wf_err_name(rc));
			int ex = cli_fail(cli, cli_exit_for_err(rc), "%s", msg);
			if (arr) {
				struct json_object *e = cli_error_json(ex, msg);
				json_object_object_add(e, "path", json_object_new_string(argv[i]));
				json_object_array_add(arr, e);
			}
			if (!rc_all)
				rc_all = ex;
			continue;
		}
		struct wf_digest d;
		char hex[WF_DIGEST_HEX_LEN];
		wf_model_digest(m, &d);
		wf_digest_hex(&d, hex);
		if (arr) {
			json_object_array_add(arr, model_json(argv[i], m, hex));
		} else if (cli->json) {
			cli_json_print(cli, model_json(argv[i], m, hex));
		} else {
			if (i > optind)
				printf("\n");
			model_print(argv[i], m, hex);
		}
		wf_model_close(m);
	}
	if (arr)
		cli_json_print(cli, arr);
	return rc_all;
}
