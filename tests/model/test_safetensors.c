/* safetensors reader and writer: round trips through wf_model_open(), sharded models with
 * config.json, and one test per malformed input, each asserting the exact code and a diag
 * substring. */
#include "base/error.h"
#include "common/wftest.h"
#include "model/model.h"
#include "model/safetensors_writer.h"

#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char *dir;

static void setup(void)
{
	dir = wft_tmpdir("st");
}

static void teardown(void)
{
	wft_rmtree(dir);
	free(dir);
}

TestSuite(safetensors, .init = setup, .fini = teardown);

static char *path_in(const char *name)
{
	char *p = NULL;
	cr_assert(asprintf(&p, "%s/%s", dir, name) > 0);
	return p;
}

/* Writes a raw safetensors file: u64 LE declared header length, the header text with ' turned
 * into " (to keep the C strings readable), then data_len bytes of 0x5a. */
static char *write_raw_len(const char *name, uint64_t declared, const char *hdr, size_t data_len)
{
	char *p = path_in(name);
	size_t n = strlen(hdr);
	char *text = strdup(hdr);
	FILE *f = fopen(p, "wb");
	uint8_t le[8];

	cr_assert(f && text);
	for (size_t i = 0; i < n; i++)
		if (text[i] == '\'')
			text[i] = '"';
	for (int i = 0; i < 8; i++)
		le[i] = (uint8_t)(declared >> (8 * i));
	cr_assert_eq(fwrite(le, 1, 8, f), 8);
	cr_assert_eq(fwrite(text, 1, n, f), n);
	for (size_t i = 0; i < data_len; i++)
		fputc(0x5a, f);
	cr_assert_eq(fclose(f), 0);
	free(text);
	return p;
}

static char *write_raw(const char *name, const char *hdr, size_t data_len)
{
	return write_raw_len(name, strlen(hdr), hdr, data_len);
}

/* Raw bytes (for NULs and invalid UTF-8): header of n bytes. */
static char *write_bytes(const char *name, const void *hdr, size_t n, size_t data_len)
{
	char *p = path_in(name);
	FILE *f = fopen(p, "wb");
	uint8_t le[8];

	cr_assert(f);
	for (int i = 0; i < 8; i++)
		le[i] = (uint8_t)((uint64_t)n >> (8 * i));
	cr_assert_eq(fwrite(le, 1, 8, f), 8);
	cr_assert_eq(fwrite(hdr, 1, n, f), n);
	for (size_t i = 0; i < data_len; i++)
		fputc(0, f);
	cr_assert_eq(fclose(f), 0);
	return p;
}

static void write_text(const char *name, const char *text)
{
	char *p = path_in(name);
	FILE *f = fopen(p, "w");
	cr_assert(f);
	for (const char *c = text; *c; c++)
		fputc(*c == '\'' ? '"' : *c, f);
	cr_assert_eq(fclose(f), 0);
	free(p);
}

static void expect_fail_at(const char *path, int code, const char *substr, int line)
{
	struct wf_model *m = NULL;
	struct wf_diag diag = {0};
	int rc = wf_model_open(path, &m, &diag);

	cr_assert_eq(rc, code, "line %d: %s: got %s (%s), want %s", line, path, wf_err_name(rc),
	             diag.msg, wf_err_name(code));
	cr_assert_null(m);
	cr_assert(strstr(diag.msg, substr), "line %d: diag '%s' lacks '%s'", line, diag.msg,
	          substr);
}
#define expect_fail(path, code, substr) expect_fail_at(path, code, substr, __LINE__)

/* One F32 tensor 'a' of shape [2] at [0, 8), inside a header with other entries around it. */
#define A_OK "'a':{'dtype':'F32','shape':[2],'data_offsets':[0,8]}"

static struct wf_model *open_ok(const char *path)
{
	struct wf_model *m = NULL;
	struct wf_diag diag = {0};
	int rc = wf_model_open(path, &m, &diag);
	cr_assert_eq(rc, 0, "%s: %s (%s)", path, wf_err_name(rc), diag.msg);
	cr_assert_not_null(m);
	return m;
}

/* ---- round trips ---- */

struct fill_ctx {
	int64_t base;
	int calls;
	int fail;
};

/* I64 values base, base+1, ... produced in pieces. */
static int fill_i64(void *arg, uint64_t off, void *buf, size_t len)
{
	struct fill_ctx *c = arg;
	c->calls++;
	if (c->fail)
		return -EIO;
	for (size_t i = 0; i < len; i++) {
		uint64_t byte = off + i;
		int64_t v = c->base + (int64_t)(byte / 8);
		((uint8_t *)buf)[i] = (uint8_t)((uint64_t)v >> (8 * (byte % 8)));
	}
	return 0;
}

static void *read_at(const char *path, uint64_t off, size_t len)
{
	void *buf = malloc(len ? len : 1);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	cr_assert(fd >= 0 && buf);
	cr_assert_eq(pread(fd, buf, len, (off_t)off), (ssize_t)len);
	close(fd);
	return buf;
}

Test(safetensors, round_trip)
{
	char *p = path_in("rt.safetensors");
	struct wf_st_writer *w;
	struct wf_diag diag = {0};
	float f32[6] = {1, 2, 3, 4, 5, 6};
	uint16_t bf16[4] = {0x3f80, 0x4000, 0x4040, 0xbf80};
	uint8_t f8[6] = {0x38, 0x40, 0x44, 0x48, 0xb8, 0x00};
	uint8_t bools[5] = {1, 0, 1, 1, 0};
	uint16_t scalar = 0x3c00;
	struct fill_ctx fc = {.base = 1000};
	/* 64-byte staging buffer: the I64 fill runs in several calls */
	struct wf_st_writer_opts opts = {.buffer_size = 64, .fsync = true};

	cr_assert_eq(wf_st_writer_create(p, &opts, &w, &diag), 0);
	cr_assert_eq(wf_st_writer_set_metadata(w, "format", "pt", NULL), 0);
	cr_assert_eq(wf_st_writer_set_metadata(w, "note", "first", NULL), 0);
	cr_assert_eq(wf_st_writer_set_metadata(w, "note", "h\xc3\xa9llo \"quoted\"", NULL), 0);
	/* BF16 first: the writer still puts the 8-byte I64 first in the data section. */
	cr_assert_eq(
	    wf_st_writer_add_tensor(w, "b.bf16", WF_DTYPE_BF16, 1, (int64_t[]){4}, bf16, NULL), 0);
	cr_assert_eq(
	    wf_st_writer_add_tensor(w, "a.f32", WF_DTYPE_F32, 2, (int64_t[]){2, 3}, f32, NULL), 0);
	cr_assert_eq(
	    wf_st_writer_add_tensor(w, "c.f8", WF_DTYPE_F8_E4M3, 3, (int64_t[]){3, 1, 2}, f8, NULL),
	    0);
	cr_assert_eq(
	    wf_st_writer_add_tensor(w, "d.bool", WF_DTYPE_BOOL, 1, (int64_t[]){5}, bools, NULL), 0);
	cr_assert_eq(wf_st_writer_add_tensor_fill(w, "e.i64", WF_DTYPE_I64, 2, (int64_t[]){4, 5},
	                                          fill_i64, &fc, NULL),
	             0);
	cr_assert_eq(wf_st_writer_add_tensor(w, "s.scalar", WF_DTYPE_F16, 0, NULL, &scalar, NULL),
	             0);
	cr_assert_eq(
	    wf_st_writer_add_tensor(w, "z.empty", WF_DTYPE_U8, 2, (int64_t[]){0, 4}, NULL, NULL),
	    0);
	cr_assert_eq(wf_st_writer_data_bytes(w), 24 + 8 + 6 + 5 + 160 + 2 + 0);
	cr_assert_eq(wf_st_writer_finish(w, &diag), 0, "%s", diag.msg);
	cr_assert_eq(fc.calls, 3); /* 160 bytes in 64-byte pieces */
	cr_assert_eq(wf_st_writer_finish(w, NULL), WF_ESTATE);
	cr_assert_eq(wf_st_writer_add_tensor(w, "late", WF_DTYPE_U8, 0, NULL, f8, NULL), WF_ESTATE);
	wf_st_writer_destroy(w);

	struct wf_model *m = open_ok(p);
	cr_assert_eq(m->format, WF_MODEL_FORMAT_SAFETENSORS);
	cr_assert_eq(m->n_files, 1);
	cr_assert_eq(m->n_tensors, 7);
	const struct wf_model_file *f = &m->files[0];
	uint64_t *hlen = read_at(p, 0, 8);
	cr_assert_eq(f->data_offset, 8 + *hlen);
	cr_assert_eq(f->data_offset % 8, 0, "header padded to a multiple of 8");
	cr_assert_eq(f->size, f->data_offset + 205);
	cr_assert_eq(f->data_size, 205);
	cr_assert_eq(f->alignment, 1);
	cr_assert_eq(f->gguf_version, 0);
	cr_assert_eq(f->n_tensors, 7);
	cr_assert_eq(m->total_bytes, 205);
	free(hlen);

	struct {
		const char *name;
		enum wf_dtype dtype;
		uint32_t n_dims;
		int64_t ne[3];
		uint64_t nbytes;
		const void *data;
		uint32_t elem;
	} want[] = {
	    {"a.f32", WF_DTYPE_F32, 2, {3, 2, 1}, 24, f32, 4},
	    {"b.bf16", WF_DTYPE_BF16, 1, {4, 1, 1}, 8, bf16, 2},
	    {"c.f8", WF_DTYPE_F8_E4M3, 3, {2, 1, 3}, 6, f8, 1},
	    {"d.bool", WF_DTYPE_BOOL, 1, {5, 1, 1}, 5, bools, 1},
	    {"e.i64", WF_DTYPE_I64, 2, {5, 4, 1}, 160, NULL, 8},
	    {"s.scalar", WF_DTYPE_F16, 0, {1, 1, 1}, 2, &scalar, 2},
	    {"z.empty", WF_DTYPE_U8, 2, {4, 0, 1}, 0, NULL, 1},
	};
	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
		const struct wf_tensor *t = wf_model_find_tensor(m, want[i].name);
		cr_assert_not_null(t, "%s", want[i].name);
		cr_assert_eq(t->dtype, want[i].dtype, "%s", want[i].name);
		cr_assert_eq(t->n_dims, want[i].n_dims, "%s", want[i].name);
		for (int d = 0; d < 3; d++)
			cr_assert_eq(t->ne[d], want[i].ne[d], "%s ne[%d]", want[i].name, d);
		for (int d = 3; d < WF_MODEL_MAX_DIMS; d++)
			cr_assert_eq(t->ne[d], 1);
		cr_assert_eq(t->nbytes, want[i].nbytes, "%s", want[i].name);
		cr_assert_eq(t->file, 0);
		cr_assert_geq(t->offset, f->data_offset);
		cr_assert_eq((t->offset - f->data_offset) % want[i].elem, 0, "%s aligned",
		             want[i].name);
		uint8_t *got = read_at(p, t->offset, t->nbytes);
		if (want[i].data) {
			cr_assert_eq(memcmp(got, want[i].data, t->nbytes), 0, "%s bytes",
			             want[i].name);
		} else if (t->nbytes) {
			for (int k = 0; k < 20; k++) {
				int64_t v;
				memcpy(&v, got + 8 * k, 8);
				cr_assert_eq(v, 1000 + k);
			}
		}
		free(got);
	}
	/* The I64 tensor (largest element) comes first in the data section. */
	cr_assert_eq(wf_model_find_tensor(m, "e.i64")->offset, f->data_offset);
	cr_assert_eq(m->tensors[0].offset, f->data_offset, "tensors sorted by offset");

	const char *s;
	cr_assert_eq(m->kv.n, 2);
	cr_assert_eq(wf_kv_get_str(&m->kv, "format", &s), 0);
	cr_assert_str_eq(s, "pt");
	cr_assert_eq(wf_kv_get_str(&m->kv, "note", &s), 0);
	cr_assert_str_eq(s, "h\xc3\xa9llo \"quoted\"");
	cr_assert_eq(m->kv.items[0].v.type, WF_KV_STRING);
	cr_assert_str_eq(m->hp.arch, "", "no config.json: no hparams");
	cr_assert_eq(m->hp.n_layer, 0);
	wf_model_close(m);
	free(p);
}

Test(safetensors, empty_model)
{
	char *p = path_in("empty.safetensors");
	struct wf_st_writer *w;

	cr_assert_eq(wf_st_writer_create(p, NULL, &w, NULL), 0);
	cr_assert_eq(wf_st_writer_finish(w, NULL), 0);
	wf_st_writer_destroy(w);
	struct wf_model *m = open_ok(p);
	cr_assert_eq(m->n_tensors, 0);
	cr_assert_eq(m->files[0].data_offset, 16); /* "{}" padded to 8 */
	wf_model_close(m);
	free(p);
}

static int count_entries(const char *d)
{
	char cmd[512];
	snprintf(cmd, sizeof(cmd), "ls -A '%s' | wc -l", d);
	FILE *f = popen(cmd, "r");
	int n = -1;
	cr_assert(f);
	cr_assert_eq(fscanf(f, "%d", &n), 1);
	pclose(f);
	return n;
}

Test(safetensors, writer_failure_leaves_nothing)
{
	char *p = path_in("fail.safetensors");
	struct wf_st_writer *w;
	struct wf_diag diag = {0};
	struct fill_ctx fc = {.fail = 1};

	cr_assert_eq(wf_st_writer_create(p, NULL, &w, NULL), 0);
	cr_assert_eq(wf_st_writer_add_tensor_fill(w, "x", WF_DTYPE_I64, 1, (int64_t[]){3}, fill_i64,
	                                          &fc, NULL),
	             0);
	cr_assert_eq(wf_st_writer_finish(w, &diag), -EIO);
	cr_assert(strstr(diag.msg, "fill callback of tensor 'x'"), "%s", diag.msg);
	cr_assert_eq(wf_st_writer_finish(w, NULL), WF_ESTATE);
	wf_st_writer_destroy(w);
	cr_assert_eq(access(p, F_OK), -1);
	cr_assert_eq(count_entries(dir), 0, "temporary file removed");

	/* destroy without finish: nothing was ever created */
	cr_assert_eq(wf_st_writer_create(p, NULL, &w, NULL), 0);
	wf_st_writer_destroy(w);
	cr_assert_eq(count_entries(dir), 0);

	/* a directory that does not exist */
	char *bad = path_in("no/such/dir.safetensors");
	cr_assert_eq(wf_st_writer_create(bad, NULL, &w, NULL), 0);
	wf_diag_clear(&diag);
	cr_assert_eq(wf_st_writer_finish(w, &diag), -ENOENT);
	cr_assert(strstr(diag.msg, "create"), "%s", diag.msg);
	wf_st_writer_destroy(w);
	free(bad);
	free(p);
}

Test(safetensors, writer_rejects_bad_input)
{
	char *p = path_in("w.safetensors");
	struct wf_st_writer *w;
	uint8_t b[16] = {0};

	cr_assert_eq(wf_st_writer_create(p, NULL, &w, NULL), 0);
	cr_assert_eq(wf_st_writer_add_tensor(w, "t", WF_DTYPE_U8, 1, (int64_t[]){4}, b, NULL), 0);
	cr_assert_eq(wf_st_writer_add_tensor(w, "t", WF_DTYPE_U8, 1, (int64_t[]){4}, b, NULL),
	             WF_EDUPLICATE);
	cr_assert_eq(wf_st_writer_add_tensor(w, "__metadata__", WF_DTYPE_U8, 0, NULL, b, NULL),
	             WF_EINVAL);
	cr_assert_eq(wf_st_writer_add_tensor(w, "", WF_DTYPE_U8, 0, NULL, b, NULL), WF_EINVAL);
	cr_assert_eq(wf_st_writer_add_tensor(w, "bad\xc0\x80", WF_DTYPE_U8, 0, NULL, b, NULL),
	             WF_EINVAL);
	cr_assert_eq(wf_st_writer_add_tensor(w, "q", WF_DTYPE_Q4_K, 1, (int64_t[]){256}, b, NULL),
	             WF_EUNKNOWN_TYPE);
	cr_assert_eq(wf_st_writer_add_tensor(w, "neg", WF_DTYPE_U8, 1, (int64_t[]){-1}, b, NULL),
	             WF_EINVAL);
	cr_assert_eq(
	    wf_st_writer_add_tensor(w, "nodata", WF_DTYPE_U8, 1, (int64_t[]){4}, NULL, NULL),
	    WF_EINVAL);
	cr_assert_eq(wf_st_writer_add_tensor(w, "big", WF_DTYPE_F64, 2,
	                                     (int64_t[]){INT64_MAX / 2, 4}, b, NULL),
	             WF_EOVERFLOW);
	cr_assert_eq(wf_st_writer_add_tensor(w, "dims", WF_DTYPE_U8, 9,
	                                     (int64_t[]){1, 1, 1, 1, 1, 1, 1, 1, 1}, b, NULL),
	             WF_ELIMIT);
	/* many tensors: the name set grows and still finds duplicates */
	for (int i = 0; i < 300; i++) {
		char name[32];
		snprintf(name, sizeof(name), "many.%d", i);
		cr_assert_eq(
		    wf_st_writer_add_tensor(w, name, WF_DTYPE_U8, 1, (int64_t[]){1}, b, NULL), 0);
	}
	cr_assert_eq(wf_st_writer_add_tensor(w, "many.17", WF_DTYPE_U8, 1, (int64_t[]){1}, b, NULL),
	             WF_EDUPLICATE);
	cr_assert_eq(wf_st_writer_finish(w, NULL), 0);
	wf_st_writer_destroy(w);
	struct wf_model *m = open_ok(p);
	cr_assert_eq(m->n_tensors, 301);
	wf_model_close(m);
	free(p);
}

/* ---- sharded models and config.json ---- */

static void write_shard(const char *name, const char *const *tensors, int n, uint32_t seed)
{
	char *p = path_in(name);
	struct wf_st_writer *w;
	struct wf_diag diag = {0};
	float data[64][8];

	cr_assert_eq(wf_st_writer_create(p, NULL, &w, &diag), 0);
	cr_assert_eq(wf_st_writer_set_metadata(w, "format", "pt", NULL), 0);
	cr_assert_eq(wf_st_writer_set_metadata(w, "shard", name, NULL), 0);
	for (int i = 0; i < n; i++) {
		for (int k = 0; k < 8; k++)
			data[i][k] = (float)(seed * 100 + i * 8 + k);
		cr_assert_eq(wf_st_writer_add_tensor(w, tensors[i], WF_DTYPE_F32, 2,
		                                     (int64_t[]){2, 4}, data[i], &diag),
		             0, "%s", diag.msg);
	}
	cr_assert_eq(wf_st_writer_finish(w, &diag), 0, "%s", diag.msg);
	wf_st_writer_destroy(w);
	free(p);
}

static const char *const shard1[] = {
    "model.embed_tokens.weight",
    "model.layers.0.self_attn.q_proj.weight",
    "model.layers.0.mlp.gate.weight",
};
static const char *const shard2[] = {
    "model.layers.0.mlp.experts.0.up_proj.weight",
    "model.layers.0.mlp.experts.1.up_proj.weight",
    "lm_head.weight",
};
#define SHARD1 "model-00001-of-00002.safetensors"
#define SHARD2 "model-00002-of-00002.safetensors"

static char *make_sharded(void)
{
	struct wf_diag diag = {0};
	char *index = path_in("model.safetensors.index.json");

	write_shard(SHARD1, shard1, 3, 1);
	write_shard(SHARD2, shard2, 3, 2);
	cr_assert_eq(wf_st_index_write(index, (const char *[]){SHARD2, SHARD1}, 2, true, &diag), 0,
	             "%s", diag.msg);
	return index;
}

Test(safetensors, sharded_round_trip_with_config)
{
	char *index = make_sharded();

	write_text("config.json",
	           "{'architectures': ['Qwen3MoeForCausalLM'], 'model_type': 'qwen3_moe',\n"
	           " 'num_hidden_layers': 48, 'hidden_size': 2048, 'num_attention_heads': 32,\n"
	           " 'num_key_value_heads': 4, 'head_dim': 128, 'intermediate_size': 6144,\n"
	           " 'moe_intermediate_size': 768, 'num_experts': 128, 'num_experts_per_tok': 8,\n"
	           " 'max_position_embeddings': 40960, 'vocab_size': 151936,\n"
	           " 'rope_theta': 1000000.0, 'rms_norm_eps': 1e-06, 'rope_scaling': null,\n"
	           " 'torch_dtype': 'bfloat16', 'sliding_window': null}\n");

	struct wf_model *m = open_ok(index);
	cr_assert_eq(m->n_files, 2);
	cr_assert_eq(m->n_tensors, 6);
	char *p1 = path_in(SHARD1), *p2 = path_in(SHARD2);
	cr_assert_str_eq(m->files[0].path, p1, "shards in name order");
	cr_assert_str_eq(m->files[1].path, p2);
	for (int i = 0; i < 3; i++) {
		const struct wf_tensor *a = wf_model_find_tensor(m, shard1[i]);
		const struct wf_tensor *b = wf_model_find_tensor(m, shard2[i]);
		cr_assert(a && b);
		cr_assert_eq(a->file, 0);
		cr_assert_eq(b->file, 1);
		cr_assert_eq(a->ne[0], 4);
		cr_assert_eq(a->ne[1], 2);
		float *v = read_at(p2, b->offset, b->nbytes);
		cr_assert_eq(v[0], (float)(200 + i * 8));
		cr_assert_eq(v[7], (float)(200 + i * 8 + 7));
		free(v);
	}
	cr_assert_eq(wf_model_find_tensor(m, shard2[0])->tclass, WF_TENSOR_EXPERT);
	cr_assert_eq(wf_model_find_tensor(m, shard1[2])->tclass, WF_TENSOR_DENSE, "router");
	cr_assert_eq(m->expert_bytes, 64);
	cr_assert_eq(m->total_bytes, 6 * 32);

	const char *s;
	cr_assert_eq(wf_kv_get_str(&m->kv, "shard", &s), 0);
	cr_assert_str_eq(s, SHARD1, "metadata of the first shard");

	cr_assert_str_eq(m->hp.arch, "qwen3_moe");
	cr_assert_eq(m->hp.n_layer, 48);
	cr_assert_eq(m->hp.n_embd, 2048);
	cr_assert_eq(m->hp.n_head, 32);
	cr_assert_eq(m->hp.n_head_kv, 4);
	cr_assert_eq(m->hp.head_dim, 128);
	cr_assert_eq(m->hp.n_ff, 6144);
	cr_assert_eq(m->hp.n_ff_exp, 768);
	cr_assert_eq(m->hp.n_expert, 128);
	cr_assert_eq(m->hp.n_expert_used, 8);
	cr_assert_eq(m->hp.n_ctx_train, 40960);
	cr_assert_eq(m->hp.n_vocab, 151936);
	cr_assert_eq(m->hp.rope_dim, 128);
	cr_assert_float_eq(m->hp.rope_freq_base, 1e6f, 1);
	cr_assert_float_eq(m->hp.rms_eps, 1e-6f, 1e-12);

	/* The directory and the index path are the same model. */
	struct wf_model *m2 = open_ok(dir);
	struct wf_digest d1, d2;
	wf_model_digest(m, &d1);
	wf_model_digest(m2, &d2);
	cr_assert(d1.hi == d2.hi && d1.lo == d2.lo);
	cr_assert_str_eq(m2->hp.arch, "qwen3_moe");
	wf_model_close(m2);
	wf_model_close(m);

	/* The index itself: HF layout, sorted weight_map, total_size. */
	char *text = wft_read_file(index, NULL);
	cr_assert(strstr(text, "\"total_size\": 192"), "%s", text);
	cr_assert(strstr(text, "\"lm_head.weight\": \"" SHARD2 "\""), "%s", text);
	cr_assert(strstr(text, "lm_head.weight") < strstr(text, "model.embed_tokens.weight"));
	free(text);
	free(p1);
	free(p2);
	free(index);
}

Test(safetensors, directory_with_single_file_and_text_config)
{
	char *p = path_in("model.safetensors");
	struct wf_st_writer *w;
	uint8_t b[4] = {0};

	cr_assert_eq(wf_st_writer_create(p, NULL, &w, NULL), 0);
	cr_assert_eq(wf_st_writer_add_tensor(w, "t", WF_DTYPE_U8, 1, (int64_t[]){4}, b, NULL), 0);
	cr_assert_eq(wf_st_writer_finish(w, NULL), 0);
	wf_st_writer_destroy(w);
	/* Multimodal configs keep the language model's settings in text_config. */
	write_text("config.json",
	           "{'model_type': 'mistral3', 'text_config': {'model_type': "
	           "'mistral', 'hidden_size': 5120, 'num_attention_heads': 32, "
	           "'head_dim': null, 'num_hidden_layers': 40, 'rope_theta': 1e9, "
	           "'partial_rotary_factor': 0.5}, 'vision_config': {'hidden_size': 1024}}");
	struct wf_model *m = open_ok(dir);
	cr_assert_eq(m->n_tensors, 1);
	cr_assert_str_eq(m->hp.arch, "mistral3");
	cr_assert_eq(m->hp.n_embd, 5120);
	cr_assert_eq(m->hp.n_layer, 40);
	cr_assert_eq(m->hp.head_dim, 160, "n_embd / n_head when head_dim is null");
	cr_assert_eq(m->hp.rope_dim, 80);
	wf_model_close(m);
	free(p);
}

Test(safetensors, empty_directory)
{
	expect_fail(dir, WF_ENOT_FOUND, "neither");
}

Test(safetensors, shard_missing)
{
	char *index = make_sharded();
	char *p2 = path_in(SHARD2);
	cr_assert_eq(unlink(p2), 0);
	expect_fail(index, WF_ESHARD, SHARD2);
	expect_fail(index, WF_ESHARD, "is missing");
	free(p2);
	free(index);
}

Test(safetensors, shard_map_names_absent_tensor)
{
	write_shard(SHARD1, shard1, 2, 1);
	write_text("model.safetensors.index.json",
	           "{'metadata': {'total_size': 64}, 'weight_map': {"
	           "'model.embed_tokens.weight': '" SHARD1 "',"
	           "'model.layers.0.self_attn.q_proj.weight': '" SHARD1 "',"
	           "'ghost.weight': '" SHARD1 "'}}");
	expect_fail(dir, WF_ESHARD, "'ghost.weight' in shard " SHARD1 ", which does not hold it");
}

Test(safetensors, shard_tensor_absent_from_map)
{
	write_shard(SHARD1, shard1, 3, 1);
	write_text("model.safetensors.index.json",
	           "{'weight_map': {'model.embed_tokens.weight': '" SHARD1 "',"
	           "'model.layers.0.self_attn.q_proj.weight': '" SHARD1 "'}}");
	expect_fail(dir, WF_ESHARD, "'model.layers.0.mlp.gate.weight' in shard");
	expect_fail(dir, WF_ESHARD, "is not in weight_map");
}

Test(safetensors, shard_map_wrong_shard)
{
	char *index = make_sharded();
	/* the same tensor in both shards: the map can name only one of them */
	write_shard(SHARD2, (const char *const[]){"lm_head.weight", "model.embed_tokens.weight"}, 2,
	            2);
	write_text("model.safetensors.index.json",
	           "{'weight_map': {'model.embed_tokens.weight': '" SHARD1 "',"
	           "'model.layers.0.self_attn.q_proj.weight': '" SHARD1 "',"
	           "'model.layers.0.mlp.gate.weight': '" SHARD1 "',"
	           "'lm_head.weight': '" SHARD2 "'}}");
	expect_fail(index, WF_ESHARD, "weight_map puts it in " SHARD1);
	free(index);
}

Test(safetensors, index_malformed)
{
	write_shard(SHARD1, shard1, 1, 1);
	write_text("model.safetensors.index.json", "{'metadata': {}}");
	expect_fail(dir, WF_EFORMAT, "no weight_map object");
	write_text("model.safetensors.index.json", "{'weight_map': {}}");
	expect_fail(dir, WF_EFORMAT, "weight_map is empty");
	write_text("model.safetensors.index.json",
	           "{'weight_map': {'model.embed_tokens.weight': '../" SHARD1 "'}}");
	expect_fail(dir, WF_EFORMAT, "not a shard file name");
	write_text("model.safetensors.index.json",
	           "{'weight_map': {'model.embed_tokens.weight': 7}}");
	expect_fail(dir, WF_EFORMAT, "not a shard file name");
	write_text("model.safetensors.index.json",
	           "{'weight_map': {'model.embed_tokens.weight': '" SHARD1 "',"
	           "'model.embed_tokens.weight': '" SHARD2 "'}}");
	expect_fail(dir, WF_EDUPLICATE,
	            "duplicate key 'model.embed_tokens.weight' in 'weight_map'");
	write_text("model.safetensors.index.json", "{'weight_map': ");
	expect_fail(dir, WF_EFORMAT, "invalid JSON");
}

Test(safetensors, index_write_rejects)
{
	struct wf_diag diag = {0};
	char *index = path_in("model.safetensors.index.json");

	write_shard(SHARD1, shard1, 2, 1);
	write_shard(SHARD2, shard1, 1, 2);
	cr_assert_eq(wf_st_index_write(index, (const char *[]){SHARD1, SHARD2}, 2, false, &diag),
	             WF_EDUPLICATE);
	cr_assert(strstr(diag.msg, "'model.embed_tokens.weight'"), "%s", diag.msg);
	cr_assert_eq(wf_st_index_write(index, (const char *[]){"../x"}, 1, false, NULL), WF_EINVAL);
	cr_assert_eq(wf_st_index_write(index, (const char *[]){"nope.safetensors"}, 1, false, NULL),
	             -ENOENT);
	cr_assert_eq(access(index, F_OK), -1);
	free(index);
}

Test(safetensors, config_malformed)
{
	char *p = write_raw("model.safetensors", "{" A_OK "}", 8);
	write_text("config.json", "{'num_hidden_layers': -1}");
	expect_fail(p, WF_EFORMAT, "num_hidden_layers must be an integer");
	write_text("config.json", "{'hidden_size': 4096.0}");
	expect_fail(p, WF_EFORMAT, "hidden_size");
	write_text("config.json", "{'rms_norm_eps': 'small'}");
	expect_fail(p, WF_EFORMAT, "rms_norm_eps is a string");
	write_text("config.json", "{'model_type': 'llama',");
	expect_fail(p, WF_EFORMAT, "config.json: invalid JSON");
	write_text("config.json", "{'vocab_size': 5, 'vocab_size': 6}");
	expect_fail(p, WF_EDUPLICATE, "duplicate key 'vocab_size'");
	free(p);
}

/* ---- malformed files: sizes and the header length ---- */

Test(safetensors, file_shorter_than_length_field)
{
	char *p = path_in("short.safetensors");
	FILE *f = fopen(p, "wb");
	fwrite("\x02\0\0\0\0", 1, 5, f);
	fclose(f);
	expect_fail(p, WF_ETRUNCATED, "too short for the 8-byte header length");
	free(p);
}

Test(safetensors, header_length_beyond_file)
{
	char *p = write_raw_len("len.safetensors", 1000, "{}", 0);
	expect_fail(p, WF_ETRUNCATED, "header length 1000 exceeds the 2 bytes after the length");
	free(p);
}

Test(safetensors, header_length_over_limit)
{
	/* A sparse file large enough that only the limit can refuse the length. */
	char *p = write_raw_len("huge.safetensors", WF_MODEL_MAX_HEADER + 1, "{}", 0);
	cr_assert_eq(truncate(p, (off_t)WF_MODEL_MAX_HEADER + 64), 0);
	expect_fail(p, WF_ELIMIT, "exceeds the limit of 1073741824");
	free(p);
}

Test(safetensors, empty_header)
{
	char *p = write_raw_len("e.safetensors", 0, "", 16);
	expect_fail(p, WF_EFORMAT, "empty header");
	free(p);
}

/* ---- malformed JSON ---- */

Test(safetensors, invalid_json)
{
	char *p = write_raw("j.safetensors", "{'a': {'dtype': 'F32',", 0);
	expect_fail(p, WF_EFORMAT, "invalid JSON");
	free(p);
	p = write_raw("j2.safetensors", "{'a': [1,]}", 0);
	expect_fail(p, WF_EFORMAT, "invalid JSON at byte");
	free(p);
	p = write_raw("j3.safetensors", "{} x", 0);
	expect_fail(p, WF_EFORMAT, "invalid JSON");
	free(p);
	p = write_raw("j4.safetensors", "{'a': 1} {}", 0);
	expect_fail(p, WF_EFORMAT, "invalid JSON");
	free(p);
	p = write_raw("j5.safetensors", "{'a': nul}", 0);
	expect_fail(p, WF_EFORMAT, "invalid JSON");
	free(p);
}

Test(safetensors, padding_spaces_accepted)
{
	char *p = write_raw("pad.safetensors", "{" A_OK "}      \n\t ", 8);
	struct wf_model *m = open_ok(p);
	cr_assert_eq(m->n_tensors, 1);
	wf_model_close(m);
	free(p);
}

Test(safetensors, nul_byte_in_header)
{
	/* json-c would stop at the NUL and accept what came before it. */
	static const char hdr[] = "{}\0 garbage";
	char *p = write_bytes("nul.safetensors", hdr, sizeof(hdr) - 1, 0);
	expect_fail(p, WF_EFORMAT, "control byte 0x00 at byte 2");
	free(p);
}

Test(safetensors, control_character_in_string)
{
	static const char hdr[] = "{\"a\tb\": {}}";
	char *p = write_bytes("ctl.safetensors", hdr, sizeof(hdr) - 1, 0);
	expect_fail(p, WF_EFORMAT, "control character 0x09 inside a string");
	free(p);
}

Test(safetensors, invalid_utf8)
{
	/* overlong encoding of '/', which json-c's own check lets through */
	static const char hdr[] = "{\"a\xc0\xaf\": {}}";
	char *p = write_bytes("utf.safetensors", hdr, sizeof(hdr) - 1, 0);
	expect_fail(p, WF_EFORMAT, "invalid UTF-8 at byte 3");
	free(p);
}

Test(safetensors, top_level_not_object)
{
	char *p = write_raw("arr.safetensors", "[]", 0);
	expect_fail(p, WF_EFORMAT, "top level is a JSON array, not an object");
	free(p);
	p = write_raw("str.safetensors", "'x'", 0);
	expect_fail(p, WF_EFORMAT, "top level is a JSON string");
	free(p);
}

Test(safetensors, nesting_too_deep)
{
	char *p =
	    write_raw("deep.safetensors", "{'a': [[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]}", 0);
	expect_fail(p, WF_EFORMAT, "nested deeper than 16 levels");
	free(p);
}

Test(safetensors, too_many_objects_for_entries)
{
	char *p =
	    write_raw("objs.safetensors", "{'a': {'dtype': 'F32', 'x': {}, 'y': {}, 'z': {}}}", 0);
	expect_fail(p, WF_EFORMAT, "more than any safetensors header");
	free(p);
}

Test(safetensors, too_many_tensors)
{
	/* WF_MODEL_MAX_TENSORS + 2 entries: refused by the scan before json-c builds a tree. */
	size_t n = (size_t)WF_MODEL_MAX_TENSORS + 2, cap = n * 16 + 16, len = 0;
	char *hdr = malloc(cap);
	cr_assert(hdr);
	hdr[len++] = '{';
	for (size_t i = 0; i < n; i++)
		len += (size_t)snprintf(hdr + len, cap - len, "%s\"t%zu\":0", i ? "," : "", i);
	hdr[len++] = '}';
	char *p = write_bytes("many.safetensors", hdr, len, 0);
	expect_fail(p, WF_ELIMIT, "more than 1048577 top-level entries");
	free(hdr);
	free(p);
}

/* ---- malformed entries ---- */

Test(safetensors, entry_not_object)
{
	char *p = write_raw("x.safetensors", "{'a': 5}", 0);
	expect_fail(p, WF_EFORMAT, "tensor 'a': entry is a int, not an object");
	free(p);
}

Test(safetensors, entry_missing_fields)
{
	char *p = write_raw("m1.safetensors", "{'a': {'shape': [2], 'data_offsets': [0, 8]}}", 8);
	expect_fail(p, WF_EFORMAT, "tensor 'a' has no dtype");
	free(p);
	p = write_raw("m2.safetensors", "{'a': {'dtype': 'F32', 'data_offsets': [0, 8]}}", 8);
	expect_fail(p, WF_EFORMAT, "tensor 'a' has no shape");
	free(p);
	p = write_raw("m3.safetensors", "{'a': {'dtype': 'F32', 'shape': [2]}}", 8);
	expect_fail(p, WF_EFORMAT, "tensor 'a' has no data_offsets");
	free(p);
}

Test(safetensors, entry_wrong_types)
{
	char *p = write_raw("t1.safetensors",
	                    "{'a': {'dtype': 5, 'shape': [2], 'data_offsets': [0, 8]}}", 8);
	expect_fail(p, WF_EFORMAT, "tensor 'a': dtype is a int, not a string");
	free(p);
	p = write_raw("t2.safetensors",
	              "{'a': {'dtype': 'F32', 'shape': '2', 'data_offsets': [0, 8]}}", 8);
	expect_fail(p, WF_EFORMAT, "tensor 'a': shape is a string, not a array");
	free(p);
	p = write_raw("t3.safetensors", "{'a': {'dtype': 'F32', 'shape': [2], 'data_offsets': 8}}",
	              8);
	expect_fail(p, WF_EFORMAT, "tensor 'a': data_offsets is a int, not a array");
	free(p);
	p = write_raw("t4.safetensors",
	              "{'a': {'dtype': 'F32', 'shape': [2], 'data_offsets': [0, 8, 16]}}", 16);
	expect_fail(p, WF_EFORMAT, "data_offsets has 3 elements, not 2");
	free(p);
	p = write_raw("t5.safetensors",
	              "{'a': {'dtype': 'F32', 'shape': [null], 'data_offsets': [0, 8]}}", 8);
	expect_fail(p, WF_EFORMAT, "shape[0] must be a non-negative integer, not a null");
	free(p);
	p = write_raw("t6.safetensors", "{'__metadata__': {'k': 1}," A_OK "}", 8);
	expect_fail(p, WF_EFORMAT,
	            "__metadata__ 'k' is a int; safetensors metadata values are "
	            "strings");
	free(p);
	p = write_raw("t7.safetensors", "{'__metadata__': [], " A_OK "}", 8);
	expect_fail(p, WF_EFORMAT, "__metadata__ is a array, not an object");
	free(p);
}

Test(safetensors, metadata_null_is_absent)
{
	char *p = write_raw("mn.safetensors", "{'__metadata__': null, " A_OK "}", 8);
	struct wf_model *m = open_ok(p);
	cr_assert_eq(m->kv.n, 0);
	wf_model_close(m);
	free(p);
}

Test(safetensors, unknown_entry_fields_ignored)
{
	/* As in the reference implementation (serde ignores unknown fields). */
	char *p = write_raw(
	    "uf.safetensors",
	    "{'a': {'dtype': 'F32', 'shape': [2], 'data_offsets': [0, 8], 'extra': [1, 'x']}}", 8);
	struct wf_model *m = open_ok(p);
	cr_assert_eq(m->n_tensors, 1);
	wf_model_close(m);
	free(p);
}

Test(safetensors, numbers_non_integer)
{
	char *p = write_raw("n1.safetensors",
	                    "{'a': {'dtype': 'F32', 'shape': [2.0], 'data_offsets': [0, 8]}}", 8);
	expect_fail(p, WF_EFORMAT, "shape[0] must be a non-negative integer, not a double");
	free(p);
	p = write_raw("n2.safetensors",
	              "{'a': {'dtype': 'F32', 'shape': [2], 'data_offsets': [0, 8e0]}}", 8);
	expect_fail(p, WF_EFORMAT, "data_offsets[1] must be a non-negative integer, not a double");
	free(p);
	p = write_raw("n3.safetensors",
	              "{'a': {'dtype': 'F32', 'shape': [2], 'data_offsets': [0, '8']}}", 8);
	expect_fail(p, WF_EFORMAT, "data_offsets[1] must be a non-negative integer, not a string");
	free(p);
}

Test(safetensors, numbers_negative)
{
	char *p = write_raw("neg1.safetensors",
	                    "{'a': {'dtype': 'F32', 'shape': [-2], 'data_offsets': [0, 8]}}", 8);
	expect_fail(p, WF_EFORMAT, "shape[0] is negative (-2)");
	free(p);
	/* saturates to INT64_MIN in json-c: still negative */
	p = write_raw("neg2.safetensors",
	              "{'a': {'dtype': 'F32', 'shape': [2], "
	              "'data_offsets': [-99999999999999999999999, 8]}}",
	              8);
	expect_fail(p, WF_EFORMAT, "data_offsets[0] is negative");
	free(p);
}

Test(safetensors, numbers_too_large)
{
	/* json-c saturates these to UINT64_MAX / INT64_MAX instead of failing */
	char *p = write_raw("big1.safetensors",
	                    "{'a': {'dtype': 'F32', 'shape': [99999999999999999999999], "
	                    "'data_offsets': [0, 8]}}",
	                    8);
	expect_fail(p, WF_EOVERFLOW, "shape[0] is out of range");
	free(p);
	p = write_raw("big2.safetensors",
	              "{'a': {'dtype': 'F32', 'shape': [2], "
	              "'data_offsets': [0, 18446744073709551615]}}",
	              8);
	expect_fail(p, WF_EOVERFLOW, "data_offsets[1] is out of range");
	free(p);
	p = write_raw("big3.safetensors",
	              "{'a': {'dtype': 'F32', 'shape': [9223372036854775807], "
	              "'data_offsets': [0, 8]}}",
	              8);
	expect_fail(p, WF_EOVERFLOW, "shape[0] is out of range");
	free(p);
	/* each dimension fits, the product does not */
	p = write_raw("big4.safetensors",
	              "{'a': {'dtype': 'F32', 'shape': [4294967296, 4294967296], "
	              "'data_offsets': [0, 8]}}",
	              8);
	expect_fail(p, WF_EOVERFLOW, "shape and dtype give no byte size");
	free(p);
}

Test(safetensors, unknown_dtype)
{
	char *p = write_raw("d1.safetensors",
	                    "{'a': {'dtype': 'F17', 'shape': [2], 'data_offsets': [0, 8]}}", 8);
	expect_fail(p, WF_EUNKNOWN_TYPE, "tensor 'a': unknown dtype 'F17'");
	free(p);
	/* ggml's names are not safetensors dtypes */
	p = write_raw("d2.safetensors",
	              "{'a': {'dtype': 'Q4_K', 'shape': [256], 'data_offsets': [0, 144]}}", 144);
	expect_fail(p, WF_EUNKNOWN_TYPE, "unknown dtype 'Q4_K'");
	free(p);
	/* a format dtype without a wf_dtype */
	p = write_raw("d3.safetensors",
	              "{'a': {'dtype': 'F4', 'shape': [2], 'data_offsets': [0, 1]}}", 1);
	expect_fail(p, WF_EUNKNOWN_TYPE, "unknown dtype 'F4'");
	free(p);
	p = write_raw("d4.safetensors",
	              "{'a': {'dtype': 'F32\\u0000', 'shape': [2], 'data_offsets': [0, 8]}}", 8);
	expect_fail(p, WF_EUNKNOWN_TYPE, "unknown dtype");
	free(p);
}

Test(safetensors, too_many_dims)
{
	char *p = write_raw("dims.safetensors",
	                    "{'a': {'dtype': 'U8', 'shape': [1,1,1,1,1,1,1,1,1], "
	                    "'data_offsets': [0, 1]}}",
	                    1);
	expect_fail(p, WF_ELIMIT, "tensor 'a': 9 dimensions, more than 8");
	free(p);
}

Test(safetensors, eight_dims_and_scalar_accepted)
{
	char *p = write_raw("d8.safetensors",
	                    "{'a': {'dtype': 'U8', 'shape': [1,2,1,1,1,1,1,3], "
	                    "'data_offsets': [0, 6]}, "
	                    "'s': {'dtype': 'F64', 'shape': [], 'data_offsets': [6, 14]}}",
	                    14);
	struct wf_model *m = open_ok(p);
	const struct wf_tensor *a = wf_model_find_tensor(m, "a");
	cr_assert_eq(a->n_dims, 8);
	cr_assert_eq(a->ne[0], 3);
	cr_assert_eq(a->ne[6], 2);
	cr_assert_eq(a->ne[7], 1);
	const struct wf_tensor *s = wf_model_find_tensor(m, "s");
	cr_assert_eq(s->n_dims, 0);
	cr_assert_eq(s->nbytes, 8);
	wf_model_close(m);
	free(p);
}

/* ---- malformed data_offsets ---- */

Test(safetensors, offsets_begin_after_end)
{
	char *p = write_raw("be.safetensors",
	                    "{'a': {'dtype': 'U8', 'shape': [0], 'data_offsets': [8, 4]}}", 8);
	expect_fail(p, WF_EFORMAT, "tensor 'a': data_offsets begin 8 > end 4");
	free(p);
}

Test(safetensors, offsets_beyond_data)
{
	char *p = write_raw("bd.safetensors",
	                    "{'a': {'dtype': 'F32', 'shape': [4], 'data_offsets': [0, 16]}}", 12);
	expect_fail(p, WF_ETRUNCATED, "tensor 'a': data_offsets end 16 beyond data section 12");
	free(p);
}

Test(safetensors, offsets_size_mismatch)
{
	char *p = write_raw("sm.safetensors",
	                    "{'a': {'dtype': 'BF16', 'shape': [2, 3], 'data_offsets': [0, 8]}}", 8);
	expect_fail(p, WF_EFORMAT,
	            "tensor 'a': data_offsets span 8 bytes but dtype BF16 and shape "
	            "need 12");
	free(p);
}

Test(safetensors, offsets_overlap)
{
	char *p = write_raw("ov.safetensors",
	                    "{'a': {'dtype': 'F32', 'shape': [4], 'data_offsets': [0, 16]},"
	                    " 'b': {'dtype': 'F32', 'shape': [2], 'data_offsets': [8, 16]}}",
	                    16);
	expect_fail(p, WF_EOVERLAP, "tensors 'a' [0, 16) and 'b' [8, 16) overlap");
	free(p);
	/* an empty tensor inside another one: the reference refuses it too */
	p = write_raw("ov2.safetensors",
	              "{'a': {'dtype': 'F32', 'shape': [4], 'data_offsets': [0, 16]},"
	              " 'e': {'dtype': 'F32', 'shape': [0], 'data_offsets': [8, 8]}}",
	              16);
	expect_fail(p, WF_EOVERLAP, "overlap");
	free(p);
}

Test(safetensors, offsets_hole)
{
	char *p = write_raw("h1.safetensors",
	                    "{'a': {'dtype': 'F32', 'shape': [2], 'data_offsets': [0, 8]},"
	                    " 'b': {'dtype': 'F32', 'shape': [2], 'data_offsets': [12, 20]}}",
	                    20);
	expect_fail(p, WF_EFORMAT, "data bytes [8, 12) before tensor 'b' belong to no tensor");
	free(p);
	p = write_raw("h2.safetensors",
	              "{'a': {'dtype': 'F32', 'shape': [2], 'data_offsets': [4, 12]}}", 12);
	expect_fail(p, WF_EFORMAT, "data bytes [0, 4) before tensor 'a'");
	free(p);
	p = write_raw("h3.safetensors", "{" A_OK "}", 9);
	expect_fail(p, WF_EFORMAT, "1 bytes after the last tensor belong to no tensor");
	free(p);
}

Test(safetensors, offsets_out_of_order_accepted)
{
	/* Header order is free; only the offsets must tile the buffer. Empty tensors may sit at any
	 * boundary. */
	char *p =
	    write_raw("oo.safetensors",
	              "{'b': {'dtype': 'F32', 'shape': [1], 'data_offsets': [8, 12]},"
	              " 'e': {'dtype': 'I8', 'shape': [3, 0], 'data_offsets': [8, 8]}," A_OK "}",
	              12);
	struct wf_model *m = open_ok(p);
	cr_assert_eq(m->n_tensors, 3);
	cr_assert_str_eq(m->tensors[0].name, "a");
	cr_assert_eq(wf_model_find_tensor(m, "b")->offset, m->files[0].data_offset + 8);
	wf_model_close(m);
	free(p);
}

/* ---- duplicates and names ---- */

Test(safetensors, duplicate_tensor_name)
{
	/* json-c keeps the last of two equal keys; without the raw scan this file would open with
	 * one tensor and 8 unindexed bytes, or with a tensor that other readers do not see. */
	char *p = write_raw("dup.safetensors",
	                    "{'a': {'dtype': 'F32', 'shape': [2], 'data_offsets': [0, 8]},"
	                    " 'a': {'dtype': 'F32', 'shape': [2], 'data_offsets': [8, 16]}}",
	                    16);
	expect_fail(p, WF_EDUPLICATE, "duplicate tensor name 'a'");
	free(p);
	/* the same name spelt with an escape */
	p = write_raw("dup2.safetensors",
	              "{'ab': {'dtype': 'F32', 'shape': [2], 'data_offsets': [0, 8]},"
	              " '\\u0061b': {'dtype': 'F32', 'shape': [2], 'data_offsets': [8, 16]}}",
	              16);
	expect_fail(p, WF_EDUPLICATE, "duplicate tensor name 'ab'");
	free(p);
	p = write_raw("dup3.safetensors",
	              "{'__metadata__': {}, " A_OK ", '__metadata__': {'a': 'b'}}", 8);
	expect_fail(p, WF_EDUPLICATE, "duplicate key '__metadata__'");
	free(p);
}

Test(safetensors, duplicate_field_in_entry)
{
	char *p = write_raw("dupf.safetensors",
	                    "{'a': {'dtype': 'F32', 'shape': [2], 'dtype': 'I32', "
	                    "'data_offsets': [0, 8]}}",
	                    8);
	expect_fail(p, WF_EDUPLICATE, "duplicate key 'dtype' in 'a'");
	free(p);
	p = write_raw("dupm.safetensors", "{'__metadata__': {'k': 'x', 'k': 'y'}, " A_OK "}", 8);
	expect_fail(p, WF_EDUPLICATE, "duplicate key 'k' in '__metadata__'");
	free(p);
}

Test(safetensors, nul_in_name)
{
	/* json-c keeps keys as C strings: "a\u0000b" would become "a" */
	char *p =
	    write_raw("nul2.safetensors",
	              "{'a\\u0000b': {'dtype': 'F32', 'shape': [2], 'data_offsets': [0, 8]}}", 8);
	expect_fail(p, WF_EFORMAT, "key with a NUL character");
	free(p);
}

Test(safetensors, long_name)
{
	char hdr[2048];
	char name[WF_MODEL_MAX_NAME + 2];
	memset(name, 'n', sizeof(name) - 1);
	name[sizeof(name) - 1] = '\0';
	snprintf(hdr, sizeof(hdr), "{'%s': {'dtype': 'U8', 'shape': [1], 'data_offsets': [0, 1]}}",
	         name);
	char *p = write_raw("ln.safetensors", hdr, 1);
	expect_fail(p, WF_ELIMIT, "tensor name longer than 1024 bytes");
	free(p);
}

Test(safetensors, fifo_refused_without_blocking)
{
	/* A FIFO under a shard's or config's name must fail the open, not hang it. */
	char *index = make_sharded();
	char *p2 = path_in(SHARD2);
	cr_assert_eq(unlink(p2), 0);
	cr_assert_eq(mkfifo(p2, 0600), 0);
	expect_fail(index, WF_EFORMAT, SHARD2 ": not a regular file");
	cr_assert_eq(unlink(p2), 0);
	write_shard(SHARD2, shard2, 3, 2);
	char *cfg = path_in("config.json");
	cr_assert_eq(mkfifo(cfg, 0600), 0);
	expect_fail(index, WF_EFORMAT, "config.json: not a regular file");
	free(cfg);
	free(p2);
	free(index);
}

static int fill_check_elems(void *arg, uint64_t off, void *buf, size_t len)
{
	int *calls = arg;
	(*calls)++;
	cr_assert_eq(off % 8, 0, "offset %llu", (unsigned long long)off);
	cr_assert_eq(len % 8, 0, "len %zu", len);
	cr_assert_leq(len, 20);
	memset(buf, 0x11, len);
	return 0;
}

Test(safetensors, fill_ranges_are_whole_elements)
{
	char *p = path_in("fe.safetensors");
	struct wf_st_writer *w;
	struct wf_st_writer_opts opts = {.buffer_size = 20};
	int calls = 0;

	cr_assert_eq(wf_st_writer_create(p, &opts, &w, NULL), 0);
	cr_assert_eq(wf_st_writer_add_tensor_fill(w, "x", WF_DTYPE_F64, 1, (int64_t[]){5},
	                                          fill_check_elems, &calls, NULL),
	             0);
	cr_assert_eq(wf_st_writer_finish(w, NULL), 0);
	wf_st_writer_destroy(w);
	cr_assert_eq(calls, 3); /* 16 + 16 + 8 bytes */
	struct wf_model *m = open_ok(p);
	cr_assert_eq(m->total_bytes, 40);
	wf_model_close(m);
	free(p);
}
