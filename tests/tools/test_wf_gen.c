/* wf-gen as a user runs it: determinism, what the default model holds (through wf_model_open),
 * usage errors, the numbers inside the quantized blocks, and --size. */
#include "common/wftest.h"
#include "tgguf.h"

#include "model/model.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char *dir;

static void setup(void)
{
	dir = wft_tmpdir("wf-gen");
}

static void teardown(void)
{
	wft_rmtree(dir);
	free(dir);
}

TestSuite(wf_gen, .init = setup, .fini = teardown, .timeout = 120);

static char *path_in(const char *name)
{
	char *p;
	cr_assert(asprintf(&p, "%s/%s", dir, name) > 0);
	return p;
}

/* Runs wf-gen with the NULL-terminated arguments; returns the exit status. stderr is kept in
 * dir/stderr.txt and returned through *ret_err when asked. */
static int gen(char **ret_err, ...)
{
	char *argv[64];
	int n = 0;
	argv[n++] = wft_exe("tools/wf-gen");
	va_list ap;
	va_start(ap, ret_err);
	for (char *a; n < 63 && (a = va_arg(ap, char *));)
		argv[n++] = a;
	va_end(ap);
	argv[n] = NULL;
	char *err = path_in("stderr.txt");
	int rc = wft_run(argv, NULL, err, 100);
	if (ret_err)
		*ret_err = wft_read_file(err, NULL);
	unlink(err);
	free(err);
	free(argv[0]);
	return rc;
}

static int count_entries(const char *d)
{
	DIR *dd = opendir(d);
	cr_assert_not_null(dd);
	int n = 0;
	struct dirent *e;
	while ((e = readdir(dd)))
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
			n++;
	closedir(dd);
	return n;
}

/* "<prefix>-00001-of-0000N.gguf" in dir, with N; NULL if there is none. */
static char *first_shard(const char *prefix, uint32_t *ret_n)
{
	for (uint32_t n = 1; n < 1000; n++) {
		char name[128];
		snprintf(name, sizeof(name), "%s-00001-of-%05u.gguf", prefix, n);
		char *p = path_in(name);
		struct stat st;
		if (stat(p, &st) == 0) {
			*ret_n = n;
			return p;
		}
		free(p);
	}
	return NULL;
}

static bool same_file(const char *a, const char *b)
{
	size_t la, lb;
	char *x = wft_read_file(a, &la), *y = wft_read_file(b, &lb);
	bool same = x && y && la == lb && memcmp(x, y, la) == 0;
	free(x);
	free(y);
	return same;
}

Test(wf_gen, same_flags_same_bytes)
{
	char *a = path_in("a.gguf"), *b = path_in("b.gguf"), *c = path_in("c.gguf");
	cr_assert_eq(gen(NULL, "--arch", "qwen3moe", "--seed", "7", "-o", a, "-q", NULL), 0);
	cr_assert_eq(
	    gen(NULL, "--arch", "qwen3moe", "--seed", "7", "--threads", "1", "-o", b, NULL), 0);
	cr_assert(same_file(a, b), "thread count must not change the bytes");
	cr_assert_eq(gen(NULL, "--arch", "qwen3moe", "--seed", "8", "-o", c, NULL), 0);
	cr_assert(!same_file(a, c), "another seed gives other weights");
	free(a);
	free(b);
	free(c);
}

Test(wf_gen, split_holds_the_same_tensor_bytes)
{
	char *one = path_in("one.gguf"), *sp = path_in("sp.gguf");
	cr_assert_eq(gen(NULL, "--arch", "llama", "--seed", "3", "--types",
	                 "experts=Q4_0,attn=Q8_0,embd=F16,output=Q6_K", "-o", one, NULL),
	             0);
	char *err = NULL;
	cr_assert_eq(gen(&err, "--arch", "llama", "--seed", "3", "--types",
	                 "experts=Q4_0,attn=Q8_0,embd=F16,output=Q6_K", "--split-max-size", "1M",
	                 "-o", sp, NULL),
	             0, "%s", err);
	free(err);
	struct tg_file whole;
	cr_assert(tg_load(one, &whole));
	uint32_t seen = 0, n_files = 0;
	char *p1 = first_shard("sp", &n_files);
	cr_assert(p1 && n_files >= 2, "the split produced several shards");
	free(p1);
	for (uint32_t s = 1; s <= n_files; s++) {
		char name[64];
		snprintf(name, sizeof(name), "sp-%05u-of-%05u.gguf", s, n_files);
		char *p = path_in(name);
		struct tg_file f;
		cr_assert(tg_load(p, &f), "%s", p);
		cr_assert_eq(tg_kv(&f, "split.no")->u, s - 1);
		uint64_t shard_bytes = 0;
		for (uint32_t k = 0; k < f.n_tensors; k++) {
			const struct tg_tensor *t = &f.t[k];
			const struct tg_tensor *w = tg_tensor(&whole, t->name);
			cr_assert_not_null(w, "%s", t->name);
			uint64_t nb = tg_tensor_nbytes(t);
			cr_assert_eq(nb, tg_tensor_nbytes(w));
			cr_assert_eq(memcmp(tg_tensor_data(&f, t), tg_tensor_data(&whole, w), nb),
			             0, "%s differs between split and whole", t->name);
			shard_bytes += (nb + 31) / 32 * 32;
			seen++;
		}
		if (f.n_tensors > 1)
			cr_assert_leq(shard_bytes, 1u << 20, "shard %u over the limit", s);
		tg_free(&f);
		free(p);
	}
	cr_assert_eq(seen, whole.n_tensors);
	tg_free(&whole);
	free(one);
	free(sp);
}

static void expect_tensor(const struct wf_model *m, const char *name, enum wf_dtype t,
                          uint32_t n_dims, int64_t ne0, int64_t ne1, int64_t ne2)
{
	const struct wf_tensor *x = wf_model_find_tensor(m, name);
	cr_assert_not_null(x, "missing %s", name);
	cr_assert_eq(x->dtype, t, "%s dtype %d", name, x->dtype);
	cr_assert_eq(x->n_dims, n_dims, "%s n_dims", name);
	cr_assert_eq(x->ne[0], ne0, "%s ne0", name);
	cr_assert_eq(x->ne[1], ne1, "%s ne1", name);
	cr_assert_eq(x->ne[2], ne2, "%s ne2", name);
}

Test(wf_gen, default_qwen3moe_inventory)
{
	char *p = path_in("q.gguf");
	cr_assert_eq(gen(NULL, "--arch", "qwen3moe", "--seed", "7", "-o", p, NULL), 0);
	struct wf_model *m;
	struct wf_diag diag = {0};
	int r = wf_model_open(p, &m, &diag);
	cr_assert_eq(r, 0, "%s", wf_diag_str(&diag, r));
	const struct wf_hparams *hp = &m->hp;
	cr_assert_str_eq(hp->arch, "qwen3moe");
	cr_assert_eq(hp->n_layer, 3);
	cr_assert_eq(hp->n_embd, 256);
	cr_assert_eq(hp->n_head, 8);
	cr_assert_eq(hp->n_head_kv, 4);
	cr_assert_eq(hp->head_dim, 32);
	cr_assert_eq(hp->n_ff, 768);
	cr_assert_eq(hp->n_ff_exp, 256);
	cr_assert_eq(hp->n_expert, 16);
	cr_assert_eq(hp->n_expert_used, 4);
	cr_assert_eq(hp->n_vocab, 1024);
	cr_assert_eq(hp->n_ctx_train, 2048);
	cr_assert_float_eq(hp->rope_freq_base, 1e6f, 1);
	cr_assert_float_eq(hp->rms_eps, 1e-6f, 1e-9);
	cr_assert_eq(m->n_tensors, 3 + 3 * 12);
	cr_assert_gt(m->total_bytes, 4u << 20);
	cr_assert_lt(m->total_bytes, 16u << 20, "a small model: a few MB");
	expect_tensor(m, "token_embd.weight", WF_DTYPE_Q8_0, 2, 256, 1024, 1);
	expect_tensor(m, "output_norm.weight", WF_DTYPE_F32, 1, 256, 1, 1);
	expect_tensor(m, "output.weight", WF_DTYPE_Q6_K, 2, 256, 1024, 1);
	for (int l = 0; l < 3; l++) {
		char n[64];
#define T(suffix, ...)                                                                             \
	snprintf(n, sizeof(n), "blk.%d." suffix, l);                                               \
	expect_tensor(m, n, __VA_ARGS__)
		T("attn_norm.weight", WF_DTYPE_F32, 1, 256, 1, 1);
		T("attn_q.weight", WF_DTYPE_Q8_0, 2, 256, 256, 1);
		T("attn_k.weight", WF_DTYPE_Q8_0, 2, 256, 128, 1);
		T("attn_v.weight", WF_DTYPE_Q8_0, 2, 256, 128, 1);
		T("attn_output.weight", WF_DTYPE_Q8_0, 2, 256, 256, 1);
		T("attn_q_norm.weight", WF_DTYPE_F32, 1, 32, 1, 1);
		T("attn_k_norm.weight", WF_DTYPE_F32, 1, 32, 1, 1);
		T("ffn_norm.weight", WF_DTYPE_F32, 1, 256, 1, 1);
		T("ffn_gate_inp.weight", WF_DTYPE_F32, 2, 256, 16, 1);
		T("ffn_gate_exps.weight", WF_DTYPE_Q4_K, 3, 256, 256, 16);
		T("ffn_up_exps.weight", WF_DTYPE_Q4_K, 3, 256, 256, 16);
		T("ffn_down_exps.weight", WF_DTYPE_Q4_K, 3, 256, 256, 16);
#undef T
	}
	cr_assert_eq(wf_model_find_tensor(m, "blk.0.ffn_up_exps.weight")->tclass, WF_TENSOR_EXPERT);
	cr_assert_eq(wf_model_find_tensor(m, "blk.0.ffn_gate_inp.weight")->tclass, WF_TENSOR_DENSE);
	const char *s;
	cr_assert_eq(wf_kv_get_str(&m->kv, "tokenizer.ggml.model", &s), 0);
	cr_assert_str_eq(s, "llama");
	const struct wf_kv_array *toks;
	cr_assert_eq(wf_kv_get_array(&m->kv, "tokenizer.ggml.tokens", &toks), 0);
	cr_assert_eq(toks->n, 1024);
	cr_assert_str_eq(toks->u.strs[1].s, "<s>");
	cr_assert_str_eq(toks->u.strs[3 + 0x41].s, "<0x41>");
	bool add_bos = false;
	cr_assert_eq(wf_kv_get_bool(&m->kv, "tokenizer.ggml.add_bos_token", &add_bos), 0);
	cr_assert(add_bos);
	wf_model_close(m);
	free(p);
}

Test(wf_gen, llama_split_inventory)
{
	char *p = path_in("mix.gguf");
	cr_assert_eq(gen(NULL, "--arch", "llama", "--layers", "2", "--embd", "512", "--expert-ff",
	                 "256", "--experts", "4", "--experts-used", "2", "--split-max-size", "2M",
	                 "-o", p, NULL),
	             0);
	struct wf_model *m;
	struct wf_diag diag = {0};
	uint32_t n_files = 0;
	char *first = first_shard("mix", &n_files);
	cr_assert_gt(n_files, 1);
	int r = wf_model_open(first, &m, &diag);
	cr_assert_eq(r, 0, "%s", wf_diag_str(&diag, r));
	cr_assert_eq(m->n_files, n_files);
	cr_assert_str_eq(m->hp.arch, "llama");
	cr_assert_eq(m->hp.n_ff, 256, "llama: feed_forward_length is the experts' width");
	cr_assert_eq(m->hp.n_expert, 4);
	cr_assert_eq(m->hp.rope_dim, 32);
	cr_assert_eq(m->n_tensors, 3 + 2 * 10, "no q/k norms in llama");
	cr_assert_null(wf_model_find_tensor(m, "blk.0.attn_q_norm.weight"));
	expect_tensor(m, "blk.1.ffn_down_exps.weight", WF_DTYPE_Q4_K, 3, 256, 512, 4);
	expect_tensor(m, "blk.1.ffn_gate_exps.weight", WF_DTYPE_Q4_K, 3, 512, 256, 4);
	wf_model_close(m);
	free(first);
	free(p);
}

/* Usage errors: exit 2, a message that says what is wrong, and no file at all. */
static void expect_usage_error(const char *needle, ...)
{
	char *argv[32];
	int n = 0;
	argv[n++] = wft_exe("tools/wf-gen");
	char *out = path_in("bad.gguf");
	argv[n++] = "-o"; /* first, so that a case may give its own -o */
	argv[n++] = out;
	va_list ap;
	va_start(ap, needle);
	for (char *a; n < 30 && (a = va_arg(ap, char *));)
		argv[n++] = a;
	va_end(ap);
	argv[n] = NULL;
	char *errp;
	cr_assert(asprintf(&errp, "%s.err", dir) > 0); /* beside dir: keep dir empty */
	int rc = wft_run(argv, NULL, errp, 30);
	char *err = wft_read_file(errp, NULL);
	cr_assert_eq(rc, 2, "exit %d for '%s': %s", rc, needle, err);
	cr_assert(err && strstr(err, needle), "expected '%s' in: %s", needle, err);
	cr_assert_eq(count_entries(dir), 0, "no output left for '%s'", needle);
	free(err);
	unlink(errp);
	free(errp);
	free(out);
	free(argv[0]);
}

Test(wf_gen, usage_errors)
{
	expect_usage_error("--arch 'gpt2' is not supported", "--arch", "gpt2", NULL);
	expect_usage_error("--type-experts 'Q5_K' is not supported", "--type-experts", "Q5_K",
	                   NULL);
	expect_usage_error("--types: unsupported type 'Q3'", "--types", "experts=Q3", NULL);
	expect_usage_error("unknown class", "--types", "ffn=Q8_0", NULL);
	expect_usage_error("--experts must be at least 1", "--experts", "0", NULL);
	expect_usage_error("--experts-used must be 1..--experts (8)", "--experts", "8",
	                   "--experts-used", "9", NULL);
	expect_usage_error("not a multiple of 256", "--embd", "320", "--type-experts", "Q4_K",
	                   NULL);
	expect_usage_error("--expert-ff", "--expert-ff", "384", "--type-experts", "Q6_K",
	                   "--type-attn", "F16", NULL);
	expect_usage_error("not a multiple of 32", "--embd", "48", "--types",
	                   "experts=F16,attn=Q8_0,embd=F16,output=F16", NULL);
	expect_usage_error("--kv-heads must divide --heads", "--heads", "8", "--kv-heads", "3",
	                   NULL);
	expect_usage_error("--layers 'x2' is not a non-negative integer", "--layers", "x2", NULL);
	expect_usage_error("--size '12Q' is not a size", "--size", "12Q", NULL);
	expect_usage_error("--vocab must be", "--vocab", "100", NULL);
	expect_usage_error("--ff 300 and --expert-ff 512 differ", "--arch", "llama", "--ff", "300",
	                   "--expert-ff", "512", NULL);
	expect_usage_error("cannot hold Q4_K", "--format", "safetensors", "--type-experts", "Q4_K",
	                   NULL);
	expect_usage_error("unexpected argument", "stray", NULL);
	expect_usage_error("needs -o PREFIX.gguf", "--split-max-size", "1M", "-o", "/tmp/x.bin",
	                   NULL);

	char *err = NULL;
	cr_assert_eq(gen(&err, "--seed", "1", NULL), 2, "-o is required");
	cr_assert(strstr(err, "no output"), "%s", err);
	free(err);
	cr_assert_eq(gen(&err, "--bogus", NULL), 2);
	free(err);
	cr_assert_eq(gen(&err, "--help", NULL), 0);
	free(err);
}

Test(wf_gen, write_failure_leaves_nothing)
{
	char *p = path_in("missing/dir/m.gguf");
	char *err = NULL;
	cr_assert_eq(gen(&err, "-o", p, NULL), 1);
	cr_assert(strstr(err, "missing"), "%s", err);
	free(err);
	cr_assert_eq(count_entries(dir), 0);
	free(p);
}

/* Intended std of the dequantized weights, as documented by wf-gen (spec.c): 1/sqrt(fan_in) for
 * projections, 2/sqrt(embd) for the router, 3/sqrt(embd) for the output head, 1 for the
 * embeddings; norms around 1 with std 0.05. */
static double intended_std(const char *name, double embd, double q_dim, double ff)
{
	if (strstr(name, "_norm"))
		return 0.05;
	if (strstr(name, "token_embd"))
		return 1.0;
	if (strcmp(name, "output.weight") == 0)
		return 3.0 / sqrt(embd);
	if (strstr(name, "ffn_gate_inp"))
		return 2.0 / sqrt(embd);
	if (strstr(name, "attn_output"))
		return 1.0 / sqrt(q_dim);
	if (strstr(name, "ffn_down"))
		return 1.0 / sqrt(ff);
	return 1.0 / sqrt(embd);
}

static void check_blocks(const char *types, const char *arch)
{
	char *p = path_in("blocks.gguf");
	char *err = NULL;
	cr_assert_eq(gen(&err, "--arch", arch, "--seed", "11", "--types", types, "-o", p, NULL), 0,
	             "%s", err);
	free(err);
	struct tg_file f;
	cr_assert(tg_load(p, &f));
	const double embd = 256, q_dim = 8 * 32, ff = strcmp(arch, "llama") ? 256 : 512;
	for (uint32_t k = 0; k < f.n_tensors; k++) {
		const struct tg_tensor *t = &f.t[k];
		uint64_t n = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
		float *y = malloc(n * sizeof(float));
		cr_assert(tg_dequant(t->type, tg_tensor_data(&f, t), n, y), "%s type %u", t->name,
		          t->type);
		double sum = 0, sq = 0;
		for (uint64_t i = 0; i < n; i++) {
			cr_assert(isfinite(y[i]), "%s[%llu] = %f", t->name, (unsigned long long)i,
			          y[i]);
			sum += y[i];
		}
		double mean = sum / (double)n;
		for (uint64_t i = 0; i < n; i++)
			sq += (y[i] - mean) * (y[i] - mean);
		double sd = sqrt(sq / (double)n);
		double want = intended_std(t->name, embd, q_dim, ff);
		double want_mean = strstr(t->name, "_norm") ? 1.0 : 0.0;
		/* small tensors (norms: 32 elements) get more slack */
		double tol = n < 1000 ? 0.45 : 0.12;
		cr_assert(fabs(sd / want - 1.0) < tol, "%s (type %u): std %g, intended %g", t->name,
		          t->type, sd, want);
		cr_assert(fabs(mean - want_mean) < 0.1 * want + (n < 1000 ? 0.05 : 0.0),
		          "%s (type %u): mean %g", t->name, t->type, mean);
		free(y);
	}
	/* the block scales themselves: finite, positive, and f16-normal */
	const struct tg_tensor *ex = tg_tensor(&f, "blk.0.ffn_up_exps.weight");
	uint32_t block, bytes;
	cr_assert(tg_type_geom(ex->type, &block, &bytes));
	const uint8_t *b = tg_tensor_data(&f, ex);
	for (int i = 0; i < 64 && block > 1; i++, b += bytes) {
		uint16_t h;
		memcpy(&h, ex->type == 14 ? b + 208 : b, 2);
		float d = tg_f16(h);
		cr_assert(isfinite(d) && d > 0 && (h & 0x7c00), "block %d scale %g", i, d);
	}
	tg_free(&f);
	unlink(p);
	free(p);
}

Test(wf_gen, quant_blocks_decode_to_intended_weights)
{
	check_blocks("experts=Q4_K,attn=Q8_0,embd=Q4_0,output=Q6_K", "qwen3moe");
	check_blocks("experts=Q6_K,attn=Q4_K,embd=Q6_K,output=Q8_0", "llama");
	check_blocks("experts=Q4_0,attn=Q6_K,embd=Q4_K,output=Q4_0", "qwen3moe");
	check_blocks("experts=F16,attn=BF16,embd=F32,output=F16", "llama");
}

static void check_size(const char *arch, const char *size, double bytes)
{
	char *p = path_in("sized.gguf");
	char *err = NULL;
	cr_assert_eq(gen(&err, "--arch", arch, "--size", size, "-o", p, NULL), 0, "%s", err);
	free(err);
	struct stat st;
	cr_assert_eq(stat(p, &st), 0);
	double rel = ((double)st.st_size - bytes) / bytes;
	cr_assert(fabs(rel) < 0.10, "%s --size %s: %lld bytes (%+.1f%%)", arch, size,
	          (long long)st.st_size, rel * 100);
	struct wf_model *m;
	struct wf_diag diag = {0};
	int r = wf_model_open(p, &m, &diag);
	cr_assert_eq(r, 0, "%s", wf_diag_str(&diag, r));
	cr_assert_eq(m->hp.n_embd % 256, 0, "K-quant friendly shapes");
	cr_assert_eq(m->hp.n_ff_exp % 256, 0);
	wf_model_close(m);
	unlink(p);
	free(p);
}

Test(wf_gen, size_within_ten_percent)
{
	check_size("qwen3moe", "64M", 64.0 * 1024 * 1024);
	check_size("llama", "64M", 64.0 * 1024 * 1024);
	check_size("qwen3moe", "20M", 20.0 * 1024 * 1024);
}

Test(wf_gen, safetensors_output)
{
	char *d = path_in("st");
	char *err = NULL;
	cr_assert_eq(gen(&err, "--format", "safetensors", "--arch", "qwen3moe", "--seed", "5", "-o",
	                 d, NULL),
	             0, "%s", err);
	free(err);
	struct wf_model *m;
	struct wf_diag diag = {0};
	int r = wf_model_open(d, &m, &diag);
	cr_assert_eq(r, 0, "%s", wf_diag_str(&diag, r));
	cr_assert_eq(m->format, WF_MODEL_FORMAT_SAFETENSORS);
	cr_assert_eq(m->hp.n_expert, 16);
	cr_assert_eq(m->hp.n_layer, 3);
	cr_assert_eq(m->n_tensors, 3 + 3 * (9 + 3 * 16));
	const struct wf_tensor *t =
	    wf_model_find_tensor(m, "model.layers.2.mlp.experts.15.down_proj.weight");
	cr_assert_not_null(t);
	cr_assert_eq(t->dtype, WF_DTYPE_BF16);
	cr_assert_eq(t->ne[0], 256);
	cr_assert_eq(t->tclass, WF_TENSOR_EXPERT);
	wf_model_close(m);

	/* sharded, with the index */
	char *d2 = path_in("st2");
	cr_assert_eq(gen(&err, "--format", "safetensors", "--arch", "llama", "--split-max-size",
	                 "1M", "-o", d2, NULL),
	             0, "%s", err);
	free(err);
	r = wf_model_open(d2, &m, &diag);
	cr_assert_eq(r, 0, "%s", wf_diag_str(&diag, r));
	cr_assert_gt(m->n_files, 1);
	cr_assert_not_null(
	    wf_model_find_tensor(m, "model.layers.0.block_sparse_moe.experts.7.w2.weight"));
	wf_model_close(m);
	free(d);
	free(d2);
}
