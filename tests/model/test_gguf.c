/* GGUF reader: hand-built files, valid and broken. Each broken file must fail with one exact code
 * and a diag that names the culprit; none may crash or leak (the ASan build runs these too). */
#include "base/error.h"
#include "common/wftest.h"
#include "model/model.h"

#include "gguf_build.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char *dir;

static void setup(void)
{
	dir = wft_tmpdir("gguf");
}

static void teardown(void)
{
	wft_rmtree(dir);
	free(dir);
}

TestSuite(gguf, .init = setup, .fini = teardown, .timeout = 60);

static char *in_dir(const char *name)
{
	char *p = NULL;
	cr_assert(asprintf(&p, "%s/%s", dir, name) > 0);
	return p;
}

static int open_buf(const struct gb *b, const char *name, struct wf_model **m, struct wf_diag *d)
{
	char *p = in_dir(name);
	gb_write(b, p);
	int rc = wf_model_open(p, m, d);
	free(p);
	return rc;
}

/* Asserts that the bytes fail to open with exactly `code` and that the diag mentions `needle`. */
static void expect_fail_named(const struct gb *b, const char *name, int code, const char *needle)
{
	struct wf_diag d = {{0}};
	struct wf_model *m = NULL;
	int rc = open_buf(b, name, &m, &d);
	cr_assert_eq(rc, code, "got %s (%s), want %s", wf_err_name(rc), d.msg, wf_err_name(code));
	cr_assert_null(m);
	if (needle)
		cr_assert(strstr(d.msg, needle), "diag '%s' does not mention '%s'", d.msg, needle);
}

static void expect_fail(const struct gb *b, int code, const char *needle)
{
	expect_fail_named(b, "t.gguf", code, needle);
}

static struct wf_model *expect_open(const struct gb *b, const char *name)
{
	struct wf_diag d = {{0}};
	struct wf_model *m = NULL;
	int rc = open_buf(b, name, &m, &d);
	cr_assert_eq(rc, 0, "open failed: %s: %s", wf_err_name(rc), wf_diag_str(&d, rc));
	cr_assert_not_null(m);
	return m;
}

/* F32 [8,4], Q8_0 [64,2], Q4_K [256,1,2] (an expert tensor), F32 [8] */
static const struct gt_tensor std_tensors[] = {
    {"token_embd.weight", WF_DTYPE_F32, 2, {8, 4}, 128},
    {"blk.0.attn_q.weight", WF_DTYPE_Q8_0, 2, {64, 2}, 4 * 34},
    {"blk.0.ffn_up_exps.weight", WF_DTYPE_Q4_K, 3, {256, 1, 2}, 2 * 144},
    {"output_norm.weight", WF_DTYPE_F32, 1, {8}, 32},
};
#define N_STD (sizeof(std_tensors) / sizeof(std_tensors[0]))

/* One pair of every value type, arrays of scalars and strings, nested arrays, an empty array and
 * a string value with a NUL in it. */
#define N_ALL_KV 19
static void all_types_kv(struct gb *b, void *ctx)
{
	(void)ctx;
	gb_str(b, "t.u8"), gb_u32(b, 0), gb_u8(b, 200);
	gb_str(b, "t.i8"), gb_u32(b, 1), gb_u8(b, (uint8_t)-5);
	gb_str(b, "t.u16"), gb_u32(b, 2), gb_u16(b, 60000);
	gb_str(b, "t.i16"), gb_u32(b, 3), gb_u16(b, (uint16_t)-300);
	gb_str(b, "t.i32"), gb_u32(b, 5), gb_u32(b, (uint32_t)-70000);
	gb_str(b, "t.f32"), gb_u32(b, 6), gb_f32(b, 0.5f);
	gb_kv_bool(b, "t.bool", true);
	gb_kv_str(b, "t.str", "hello");
	gb_str(b, "t.u64"), gb_u32(b, 10), gb_u64(b, 1ull << 40);
	gb_str(b, "t.i64"), gb_u32(b, 11), gb_u64(b, (uint64_t) - (1ll << 40));
	gb_str(b, "t.f64"), gb_u32(b, 12), gb_f64(b, 1e-300);
	/* [7, 8, 9] as u32 */
	gb_str(b, "t.arr_u32"), gb_u32(b, 9), gb_u32(b, 4), gb_u64(b, 3);
	gb_u32(b, 7), gb_u32(b, 8), gb_u32(b, 9);
	/* ["a", ""] */
	gb_str(b, "t.arr_str"), gb_u32(b, 9), gb_u32(b, 8), gb_u64(b, 2);
	gb_str(b, "a"), gb_str(b, "");
	/* [[1, 2], [3]] of i32 */
	gb_str(b, "t.nested"), gb_u32(b, 9), gb_u32(b, 9), gb_u64(b, 2);
	gb_u32(b, 5), gb_u64(b, 2), gb_u32(b, 1), gb_u32(b, 2);
	gb_u32(b, 5), gb_u64(b, 1), gb_u32(b, 3);
	/* [["x", "yz"]] */
	gb_str(b, "t.nested_str"), gb_u32(b, 9), gb_u32(b, 9), gb_u64(b, 1);
	gb_u32(b, 8), gb_u64(b, 2), gb_str(b, "x"), gb_str(b, "yz");
	/* [] of f32 */
	gb_str(b, "t.empty"), gb_u32(b, 9), gb_u32(b, 6), gb_u64(b, 0);
	/* "a\0b" */
	gb_str(b, "t.nul"), gb_u32(b, 8), gb_u64(b, 3), gb_bytes(b, "a\0b", 3);
	/* [true, false] */
	gb_str(b, "t.arr_bool"), gb_u32(b, 9), gb_u32(b, 7), gb_u64(b, 2), gb_u8(b, 1), gb_u8(b, 0);
	/* per-layer head counts: hp takes the largest */
	gb_str(b, "llama.attention.head_count_kv"), gb_u32(b, 9), gb_u32(b, 5), gb_u64(b, 3);
	gb_u32(b, 2), gb_u32(b, 4), gb_u32(b, 1);
}

static void build_std(struct gb *b, uint32_t version, uint32_t alignment)
{
	struct gt_model gm = {
	    .version = version,
	    .alignment = alignment,
	    .n_tensors = N_STD,
	    .tensors = std_tensors,
	    .n_extra_kv = N_ALL_KV,
	    .extra_kv = all_types_kv,
	};
	gt_build(b, &gm);
}

static void check_std_model(const struct wf_model *m, uint32_t version, uint32_t alignment)
{
	cr_assert_eq(m->format, WF_MODEL_FORMAT_GGUF);
	cr_assert_eq(m->n_files, 1);
	cr_assert_eq(m->files[0].gguf_version, version);
	cr_assert_eq(m->files[0].alignment, alignment);
	cr_assert_eq(m->files[0].data_offset % alignment, 0);
	cr_assert_eq(m->n_tensors, N_STD);
	cr_assert_eq(m->files[0].n_tensors, N_STD);
	cr_assert_eq(m->kv.n, GT_BUILTIN_KV + (alignment != 32) + N_ALL_KV);

	/* Tensors in file order with absolute, aligned, contiguous offsets. */
	uint64_t off = m->files[0].data_offset, total = 0;
	for (uint32_t i = 0; i < N_STD; i++) {
		const struct wf_tensor *t = &m->tensors[i];
		cr_assert_str_eq(t->name, std_tensors[i].name);
		cr_assert_eq(t->dtype, std_tensors[i].type);
		cr_assert_eq(t->n_dims, std_tensors[i].n_dims);
		for (uint32_t d = 0; d < WF_MODEL_MAX_DIMS; d++)
			cr_assert_eq(t->ne[d], d < t->n_dims ? std_tensors[i].ne[d] : 1);
		cr_assert_eq(t->nbytes, std_tensors[i].nbytes, "%s", t->name);
		cr_assert_eq(t->offset, off, "%s at %llu, want %llu", t->name,
		             (unsigned long long)t->offset, (unsigned long long)off);
		cr_assert_eq(t->file, 0);
		cr_assert_eq(wf_model_find_tensor(m, t->name), t);
		off += (t->nbytes + alignment - 1) / alignment * alignment;
		total += t->nbytes;
	}
	cr_assert_eq(m->total_bytes, total);
	cr_assert_eq(m->expert_bytes, 288);
	cr_assert_eq(m->dense_bytes, total - 288);
	cr_assert_eq(m->tensors[2].tclass, WF_TENSOR_EXPERT);
	cr_assert_eq(m->tensors[0].tclass, WF_TENSOR_DENSE);
	cr_assert_eq(m->count_by_dtype[WF_DTYPE_F32], 2);
	cr_assert_eq(m->bytes_by_dtype[WF_DTYPE_F32], 160);
	cr_assert_eq(m->count_by_dtype[WF_DTYPE_Q8_0], 1);
	cr_assert_eq(m->count_by_dtype[WF_DTYPE_Q4_K], 1);
	/* The last tensor ends the file exactly. */
	const struct wf_tensor *last = &m->tensors[N_STD - 1];
	cr_assert_eq(last->offset + last->nbytes, m->files[0].size);
	cr_assert_eq(m->files[0].data_size, m->files[0].size - m->files[0].data_offset);
	cr_assert_null(wf_model_find_tensor(m, "nope"));
	cr_assert_null(wf_model_find_tensor(m, ""));

	/* hparams */
	cr_assert_str_eq(m->hp.arch, "llama");
	cr_assert_eq(m->hp.n_layer, 1);
	cr_assert_eq(m->hp.n_embd, 64);
	cr_assert_eq(m->hp.n_head, 4);
	cr_assert_eq(m->hp.n_head_kv, 4); /* max of [2, 4, 1] */
	cr_assert_eq(m->hp.head_dim, 16); /* n_embd / n_head: no key_length */
	cr_assert_eq(m->hp.n_expert, 2);
	cr_assert_eq(m->hp.rope_freq_base, 10000.0f);
	cr_assert_eq(m->hp.n_vocab, 0);

	/* Every value type. */
	const struct wf_kv_set *kv = &m->kv;
	uint64_t u;
	int64_t s;
	double f;
	bool bo;
	const char *str;
	const struct wf_kv_array *a;
	cr_assert_eq(wf_kv_get_u64(kv, "t.u8", &u), 0);
	cr_assert_eq(u, 200);
	cr_assert_eq(wf_kv_find(kv, "t.u8")->v.type, WF_KV_U8);
	cr_assert_eq(wf_kv_get_i64(kv, "t.i8", &s), 0);
	cr_assert_eq(s, -5);
	cr_assert_eq(wf_kv_get_u64(kv, "t.i8", &u), WF_EFORMAT);
	cr_assert_eq(wf_kv_get_u64(kv, "t.u16", &u), 0);
	cr_assert_eq(u, 60000);
	cr_assert_eq(wf_kv_get_i64(kv, "t.i16", &s), 0);
	cr_assert_eq(s, -300);
	cr_assert_eq(wf_kv_get_i64(kv, "t.i32", &s), 0);
	cr_assert_eq(s, -70000);
	cr_assert_eq(wf_kv_get_f64(kv, "t.f32", &f), 0);
	cr_assert_eq(f, 0.5);
	cr_assert_eq(wf_kv_find(kv, "t.f32")->v.type, WF_KV_F32);
	cr_assert_eq(wf_kv_get_bool(kv, "t.bool", &bo), 0);
	cr_assert(bo);
	cr_assert_eq(wf_kv_get_str(kv, "t.str", &str), 0);
	cr_assert_str_eq(str, "hello");
	cr_assert_eq(wf_kv_get_u64(kv, "t.u64", &u), 0);
	cr_assert_eq(u, 1ull << 40);
	cr_assert_eq(wf_kv_get_i64(kv, "t.i64", &s), 0);
	cr_assert_eq(s, -(1ll << 40));
	cr_assert_eq(wf_kv_get_f64(kv, "t.f64", &f), 0);
	cr_assert_eq(f, 1e-300);
	cr_assert_eq(wf_kv_get_array(kv, "t.arr_u32", &a), 0);
	cr_assert_eq(a->elem, WF_KV_U32);
	cr_assert_eq(a->n, 3);
	cr_assert_eq(((const uint32_t *)a->u.scalars)[2], 9);
	cr_assert_eq(wf_kv_get_array(kv, "t.arr_str", &a), 0);
	cr_assert_eq(a->elem, WF_KV_STRING);
	cr_assert_eq(a->n, 2);
	cr_assert_str_eq(a->u.strs[0].s, "a");
	cr_assert_eq(a->u.strs[1].n, 0);
	cr_assert_str_eq(a->u.strs[1].s, "");
	cr_assert_eq(wf_kv_get_array(kv, "t.nested", &a), 0);
	cr_assert_eq(a->elem, WF_KV_ARRAY);
	cr_assert_eq(a->n, 2);
	cr_assert_eq(a->u.arrays[0].elem, WF_KV_I32);
	cr_assert_eq(a->u.arrays[0].n, 2);
	cr_assert_eq(((const int32_t *)a->u.arrays[0].u.scalars)[1], 2);
	cr_assert_eq(a->u.arrays[1].n, 1);
	cr_assert_eq(((const int32_t *)a->u.arrays[1].u.scalars)[0], 3);
	cr_assert_eq(wf_kv_get_array(kv, "t.nested_str", &a), 0);
	cr_assert_eq(a->u.arrays[0].elem, WF_KV_STRING);
	cr_assert_str_eq(a->u.arrays[0].u.strs[1].s, "yz");
	cr_assert_eq(wf_kv_get_array(kv, "t.empty", &a), 0);
	cr_assert_eq(a->elem, WF_KV_F32);
	cr_assert_eq(a->n, 0);
	const struct wf_kv *nul = wf_kv_find(kv, "t.nul");
	cr_assert_eq(nul->v.u.str.n, 3);
	cr_assert_eq(memcmp(nul->v.u.str.s, "a\0b", 4), 0);
	cr_assert_eq(wf_kv_get_array(kv, "t.arr_bool", &a), 0);
	cr_assert_eq(((const uint8_t *)a->u.scalars)[0], 1);
	/* Metadata keys stay in file order. */
	cr_assert_str_eq(kv->items[0].key, "general.architecture");
	cr_assert_str_eq(kv->items[kv->n - 1].key, "llama.attention.head_count_kv");
}

Test(gguf, v3_reads_every_value_type_and_tensor)
{
	struct gb b = {0};
	build_std(&b, 3, 0);
	struct wf_model *m = expect_open(&b, "std.gguf");
	check_std_model(m, 3, 32);
	wf_model_close(m);
	gb_free(&b);
}

Test(gguf, v2_reads_the_same)
{
	struct gb b = {0};
	build_std(&b, 2, 0);
	struct wf_model *m = expect_open(&b, "v2.gguf");
	check_std_model(m, 2, 32);
	wf_model_close(m);
	gb_free(&b);
}

Test(gguf, alignment_64_and_detection_by_magic)
{
	struct gb b = {0};
	build_std(&b, 3, 64);
	/* No .gguf suffix: found by its magic. */
	struct wf_model *m = expect_open(&b, "weights.bin");
	check_std_model(m, 3, 64);
	wf_model_close(m);
	gb_free(&b);
}

Test(gguf, every_truncation_fails_cleanly)
{
	struct gb b = {0};
	build_std(&b, 3, 0);
	char *p = in_dir("trunc.gguf");
	gb_write(&b, p);
	struct wf_model *m = NULL;
	cr_assert_eq(wf_model_open(p, &m, NULL), 0);
	wf_model_close(m);
	/* Shorten the same file one byte at a time: every prefix is a truncated file. */
	for (size_t len = b.n; len-- > 0;) {
		cr_assert_eq(truncate(p, (off_t)len), 0);
		struct wf_diag d = {{0}};
		m = NULL;
		int rc = wf_model_open(p, &m, &d);
		cr_assert_eq(rc, WF_ETRUNCATED, "length %zu of %zu: %s (%s)", len, b.n,
		             wf_err_name(rc), d.msg);
		cr_assert_null(m);
		cr_assert(d.msg[0] != '\0', "length %zu: empty diag", len);
	}
	free(p);
	gb_free(&b);
}

Test(gguf, wrong_magic)
{
	struct gb b = {0};
	build_std(&b, 3, 0);
	memcpy(b.p, "GGUG", 4);
	expect_fail(&b, WF_EMAGIC, "magic");
	/* Without the .gguf suffix the sniffer says it. */
	expect_fail_named(&b, "blob", WF_EMAGIC, "neither GGUF");
	gb_free(&b);
}

Test(gguf, versions_1_and_4_and_big_endian)
{
	struct gb b = {0};
	build_std(&b, 1, 0);
	expect_fail(&b, WF_EVERSION, "version 1");
	gb_free(&b);
	build_std(&b, 4, 0);
	expect_fail(&b, WF_EVERSION, "version 4");
	gb_free(&b);
	build_std(&b, 0x03000000u, 0); /* v3 written big-endian */
	expect_fail(&b, WF_EUNSUPPORTED, "big-endian");
	gb_free(&b);
	build_std(&b, 0, 0);
	/* version 0 is not big-endian anything */
	memset(b.p + 4, 0, 4);
	expect_fail(&b, WF_EVERSION, "version 0");
	gb_free(&b);
}

Test(gguf, absurd_counts_fail_fast)
{
	struct gb b = {0};
	gb_header(&b, 3, 0, 1000000000ull);
	gb_kv_u32(&b, "a", 1);
	expect_fail(&b, WF_ELIMIT, "metadata keys");
	gb_free(&b);

	gb_header(&b, 3, 1ull << 40, 0);
	expect_fail(&b, WF_ELIMIT, "tensors");
	gb_free(&b);

	/* Within the caps but far more than a 100-byte file can hold. */
	gb_header(&b, 3, 1000, 60000);
	gb_kv_u32(&b, "a", 1);
	while (b.n < 100)
		gb_u8(&b, 0);
	expect_fail(&b, WF_ETRUNCATED, "60000 metadata keys");
	gb_free(&b);

	/* An array claiming 2^24 + 1 elements, and one claiming 10^6 in a tiny file. */
	gb_header(&b, 3, 0, 1);
	gb_str(&b, "big"), gb_u32(&b, 9), gb_u32(&b, 4), gb_u64(&b, (1ull << 24) + 1);
	expect_fail(&b, WF_ELIMIT, "'big'");
	gb_free(&b);
	gb_header(&b, 3, 0, 1);
	gb_str(&b, "big"), gb_u32(&b, 9), gb_u32(&b, 8), gb_u64(&b, 1000000);
	expect_fail(&b, WF_ETRUNCATED, "'big'");
	gb_free(&b);
}

Test(gguf, string_lengths)
{
	struct gb b = {0};
	/* Key length 2^64 - 1: over the name limit. */
	gb_header(&b, 3, 0, 1);
	gb_u64(&b, UINT64_MAX), gb_bytes(&b, "abc", 3);
	gb_pad(&b, 64); /* room for the one key the header claims */
	expect_fail(&b, WF_ELIMIT, "metadata key 0");
	gb_free(&b);
	/* Value length 2^63: over the header limit. */
	gb_header(&b, 3, 0, 1);
	gb_str(&b, "s"), gb_u32(&b, 8), gb_u64(&b, 1ull << 63);
	expect_fail(&b, WF_ELIMIT, "'s'");
	gb_free(&b);
	/* Value length 2^20 in a small file. */
	gb_header(&b, 3, 0, 1);
	gb_str(&b, "s"), gb_u32(&b, 8), gb_u64(&b, 1u << 20), gb_bytes(&b, "xyz", 3);
	expect_fail(&b, WF_ETRUNCATED, "'s'");
	gb_free(&b);
	/* Empty key, and a key with a NUL. */
	gb_header(&b, 3, 0, 1);
	gb_str(&b, ""), gb_u32(&b, 4), gb_u32(&b, 1);
	expect_fail(&b, WF_EFORMAT, "empty");
	gb_free(&b);
	gb_header(&b, 3, 0, 1);
	gb_u64(&b, 3), gb_bytes(&b, "a\0b", 3), gb_u32(&b, 4), gb_u32(&b, 1);
	expect_fail(&b, WF_EFORMAT, "NUL");
	gb_free(&b);
}

Test(gguf, bad_value_types)
{
	struct gb b = {0};
	gb_header(&b, 3, 0, 1);
	gb_str(&b, "k"), gb_u32(&b, 13), gb_u32(&b, 0);
	expect_fail(&b, WF_EFORMAT, "'k'");
	gb_free(&b);
	gb_header(&b, 3, 0, 1);
	gb_str(&b, "k"), gb_u32(&b, 9), gb_u32(&b, 77), gb_u64(&b, 0);
	expect_fail(&b, WF_EFORMAT, "element type 77");
	gb_free(&b);
	gb_header(&b, 3, 0, 1);
	gb_str(&b, "k"), gb_u32(&b, 7), gb_u8(&b, 2);
	expect_fail(&b, WF_EFORMAT, "not 0 or 1");
	gb_free(&b);
	gb_header(&b, 3, 0, 2);
	gb_kv_u32(&b, "same", 1), gb_kv_u32(&b, "same", 2);
	expect_fail(&b, WF_EDUPLICATE, "'same'");
	gb_free(&b);
}

/* depth levels of arrays, the innermost holding one u8 42. */
static void nested(struct gb *b, int depth)
{
	if (depth == 1) {
		gb_u32(b, 0), gb_u64(b, 1), gb_u8(b, 42);
		return;
	}
	gb_u32(b, 9), gb_u64(b, 1);
	nested(b, depth - 1);
}

Test(gguf, nesting_depth_is_capped)
{
	struct gb b = {0};
	gb_header(&b, 3, 0, 1);
	gb_str(&b, "deep"), gb_u32(&b, 9);
	nested(&b, WF_MODEL_MAX_KV_DEPTH);
	struct wf_model *m = expect_open(&b, "deep.gguf");
	const struct wf_kv_array *a;
	cr_assert_eq(wf_kv_get_array(&m->kv, "deep", &a), 0);
	for (int i = 1; i < WF_MODEL_MAX_KV_DEPTH; i++) {
		cr_assert_eq(a->elem, WF_KV_ARRAY);
		cr_assert_eq(a->n, 1);
		a = &a->u.arrays[0];
	}
	cr_assert_eq(a->elem, WF_KV_U8);
	cr_assert_eq(((const uint8_t *)a->u.scalars)[0], 42);
	cr_assert_eq(m->n_tensors, 0);
	cr_assert_eq(m->files[0].data_size, 0);
	cr_assert_null(wf_model_find_tensor(m, "x"));
	wf_model_close(m);
	gb_free(&b);

	gb_header(&b, 3, 0, 1);
	gb_str(&b, "deep"), gb_u32(&b, 9);
	nested(&b, WF_MODEL_MAX_KV_DEPTH + 1);
	expect_fail(&b, WF_ELIMIT, "nested deeper");
	gb_free(&b);
}

/* One tensor after one key, data_bytes of data at the default alignment. */
static void one_tensor(struct gb *b, const char *name, uint32_t n_dims, const int64_t *ne,
                       uint32_t type, uint64_t rel, size_t data_bytes)
{
	gb_header(b, 3, 1, 1);
	gb_kv_str(b, "general.architecture", "llama");
	gb_tinfo(b, name, n_dims, ne, type, rel);
	gb_pad(b, 32);
	for (size_t i = 0; i < data_bytes; i++)
		gb_u8(b, 0xab);
}

Test(gguf, tensor_shapes)
{
	struct gb b = {0};
	int64_t five[5] = {4, 1, 1, 1, 1};
	one_tensor(&b, "five_dims", 5, five, WF_DTYPE_F32, 0, 16);
	expect_fail(&b, WF_EFORMAT, "'five_dims' has 5 dimensions");
	gb_free(&b);

	int64_t neg[2] = {4, -1};
	one_tensor(&b, "negative", 2, neg, WF_DTYPE_F32, 0, 16);
	expect_fail(&b, WF_EFORMAT, "'negative'");
	gb_free(&b);

	int64_t huge[2] = {1ll << 40, 1ll << 40};
	one_tensor(&b, "huge", 2, huge, WF_DTYPE_F32, 0, 16);
	expect_fail(&b, WF_EOVERFLOW, "'huge'");
	gb_free(&b);

	/* Fits in elements, not in bytes. */
	int64_t big[2] = {1ll << 31, 1ll << 31};
	one_tensor(&b, "big_bytes", 2, big, WF_DTYPE_F32, 0, 16);
	expect_fail(&b, WF_EOVERFLOW, "'big_bytes'");
	gb_free(&b);

	int64_t row[2] = {100, 2};
	one_tensor(&b, "q4k_row", 2, row, WF_DTYPE_Q4_K, 0, 16);
	expect_fail(&b, WF_EALIGN, "'q4k_row'");
	gb_free(&b);

	/* A scalar (n_dims 0) and an empty tensor are valid. */
	one_tensor(&b, "scalar", 0, NULL, WF_DTYPE_F32, 0, 4);
	struct wf_model *m = expect_open(&b, "scalar.gguf");
	cr_assert_eq(m->tensors[0].nbytes, 4);
	cr_assert_eq(m->tensors[0].ne[0], 1);
	wf_model_close(m);
	gb_free(&b);
	int64_t zero[2] = {0, 7};
	one_tensor(&b, "empty", 2, zero, WF_DTYPE_F32, 0, 0);
	m = expect_open(&b, "empty.gguf");
	cr_assert_eq(m->tensors[0].nbytes, 0);
	wf_model_close(m);
	gb_free(&b);
}

Test(gguf, tensor_types)
{
	struct gb b = {0};
	int64_t ne[1] = {32};
	uint32_t bad[] = {4, 5, 31, 36, 38, WF_DTYPE_GGML_COUNT_, 64, 99, UINT32_MAX};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		one_tensor(&b, "typed", 1, ne, bad[i], 0, 128);
		char want[64];
		snprintf(want, sizeof(want), "'typed' has ggml type %u", bad[i]);
		expect_fail(&b, WF_EUNKNOWN_TYPE, want);
		gb_free(&b);
	}
	one_tensor(&b, "typed", 1, ne, 4, 0, 128);
	expect_fail(&b, WF_EUNKNOWN_TYPE, "retired");
	gb_free(&b);
	/* The newest types of b10573 are accepted. */
	int64_t ne128[1] = {128};
	one_tensor(&b, "q1", 1, ne128, WF_DTYPE_Q1_0, 0, 18);
	struct wf_model *m = expect_open(&b, "q1.gguf");
	cr_assert_eq(m->tensors[0].nbytes, 18);
	wf_model_close(m);
	gb_free(&b);
}

Test(gguf, tensor_bounds)
{
	struct gb b = {0};
	int64_t ne[1] = {8};
	one_tensor(&b, "short", 1, ne, WF_DTYPE_F32, 0, 31);
	expect_fail(&b, WF_ETRUNCATED, "tensor 'short' ends at");
	gb_free(&b);

	one_tensor(&b, "far", 1, ne, WF_DTYPE_F32, 1ull << 40, 32);
	expect_fail(&b, WF_ETRUNCATED, "'far'");
	gb_free(&b);

	one_tensor(&b, "wrap", 1, ne, WF_DTYPE_F32, UINT64_MAX - 31, 32);
	expect_fail(&b, WF_EOVERFLOW, "'wrap'");
	gb_free(&b);

	one_tensor(&b, "skew", 1, ne, WF_DTYPE_F32, 16, 64);
	expect_fail(&b, WF_EALIGN, "'skew' offset 16");
	gb_free(&b);
}

static void two_tensors(struct gb *b, const char *n1, uint64_t o1, const char *n2, uint64_t o2)
{
	int64_t ne[1] = {16}; /* 64 bytes of F32 */
	gb_header(b, 3, 2, 0);
	gb_tinfo(b, n1, 1, ne, WF_DTYPE_F32, o1);
	gb_tinfo(b, n2, 1, ne, WF_DTYPE_F32, o2);
	gb_pad(b, 32);
	for (int i = 0; i < 256; i++)
		gb_u8(b, (uint8_t)i);
}

Test(gguf, overlap_and_duplicates)
{
	struct gb b = {0};
	two_tensors(&b, "first", 0, "second", 32);
	expect_fail(&b, WF_EOVERLAP, "'second'");
	gb_free(&b);
	/* Order in the header does not matter. */
	two_tensors(&b, "late", 96, "early", 64);
	expect_fail(&b, WF_EOVERLAP, "'early'");
	gb_free(&b);
	two_tensors(&b, "twin", 0, "twin", 64);
	expect_fail(&b, WF_EDUPLICATE, "duplicate tensor name 'twin'");
	gb_free(&b);
	/* Out of order but disjoint: fine, and the model lists them by offset. */
	two_tensors(&b, "b_late", 128, "a_early", 0);
	struct wf_model *m = expect_open(&b, "ok.gguf");
	cr_assert_str_eq(m->tensors[0].name, "a_early");
	cr_assert_str_eq(m->tensors[1].name, "b_late");
	cr_assert_eq(m->tensors[1].offset - m->tensors[0].offset, 128);
	cr_assert_str_eq(wf_model_find_tensor(m, "b_late")->name, "b_late");
	/* Only what lies up to the last tensor belongs to the data section. */
	cr_assert_eq(m->files[0].data_size, 192);
	wf_model_close(m);
	gb_free(&b);
	/* A tensor name with a NUL byte, and an empty one. */
	int64_t ne[1] = {8};
	gb_header(&b, 3, 1, 0);
	gb_u64(&b, 3), gb_bytes(&b, "a\0b", 3), gb_u32(&b, 1), gb_bytes(&b, ne, 8);
	gb_u32(&b, 0), gb_u64(&b, 0);
	expect_fail(&b, WF_EFORMAT, "NUL");
	gb_free(&b);
	one_tensor(&b, "", 1, ne, WF_DTYPE_F32, 0, 32);
	expect_fail(&b, WF_EFORMAT, "empty");
	gb_free(&b);
}

static void align_kv(struct gb *b, uint32_t type, uint64_t v)
{
	int64_t ne[1] = {8};
	gb_header(b, 3, 1, 1);
	gb_str(b, "general.alignment"), gb_u32(b, type);
	if (type == 10)
		gb_u64(b, v);
	else
		gb_u32(b, (uint32_t)v);
	gb_tinfo(b, "w", 1, ne, WF_DTYPE_F32, 0);
	gb_pad(b, 64);
	for (int i = 0; i < 32; i++)
		gb_u8(b, 1);
}

Test(gguf, alignment_values)
{
	struct gb b = {0};
	uint32_t bad[] = {0, 3, 48, 0x80000001u};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		align_kv(&b, 4, bad[i]);
		expect_fail(&b, WF_EALIGN, "general.alignment");
		gb_free(&b);
	}
	align_kv(&b, 10, 32);
	expect_fail(&b, WF_EFORMAT, "must be u32");
	gb_free(&b);
	align_kv(&b, 4, 1);
	struct wf_model *m = expect_open(&b, "a1.gguf");
	cr_assert_eq(m->files[0].alignment, 1);
	wf_model_close(m);
	gb_free(&b);
}

Test(gguf, hparams_wrong_types)
{
	struct gb b = {0};
	gb_header(&b, 3, 0, 2);
	gb_kv_str(&b, "general.architecture", "llama");
	gb_kv_str(&b, "llama.block_count", "two");
	expect_fail(&b, WF_EFORMAT, "llama.block_count");
	gb_free(&b);
	gb_header(&b, 3, 0, 2);
	gb_kv_str(&b, "general.architecture", "llama");
	gb_str(&b, "llama.embedding_length"), gb_u32(&b, 10), gb_u64(&b, 1ull << 33);
	expect_fail(&b, WF_EFORMAT, "32 bits");
	gb_free(&b);
	/* No architecture: no hparams, but the file opens. */
	gb_header(&b, 3, 0, 1);
	gb_kv_u32(&b, "llama.block_count", 3);
	struct wf_model *m = expect_open(&b, "noarch.gguf");
	cr_assert_eq(m->hp.n_layer, 0);
	cr_assert_str_eq(m->hp.arch, "");
	wf_model_close(m);
	gb_free(&b);
}

/* ---- shards ---- */

struct shard_opt {
	int count_key; /* split.count written (0: the real count) */
	int no_key;    /* 0: the real index as split.no; else no_key - 1 */
	int total;     /* split.tensors.count (0: the real total, -1: omitted) */
	const char *dup;
};

/* Shard i of n, named <dir>/m-0000i-of-0000n.gguf, with tensors "s<i>.a" and "s<i>.b". */
static void write_shard(uint32_t i, uint32_t n, struct shard_opt o)
{
	struct gb b = {0};
	uint32_t n_kv = 2 + (o.total >= 0) + (i == 0 ? 2 : 0);
	gb_header(&b, 3, 2, n_kv);
	if (i == 0) {
		gb_kv_str(&b, "general.architecture", "llama");
		gb_kv_u32(&b, "llama.block_count", 7);
	}
	gb_kv_u16(&b, "split.no", (uint16_t)(o.no_key ? (uint32_t)o.no_key - 1 : i));
	gb_kv_u16(&b, "split.count", (uint16_t)(o.count_key ? (uint32_t)o.count_key : n));
	if (o.total >= 0) {
		gb_str(&b, "split.tensors.count"), gb_u32(&b, 5);
		gb_u32(&b, o.total ? (uint32_t)o.total : 2 * n);
	}
	char a[32], c[32];
	snprintf(a, sizeof(a), "s%u.a", i);
	snprintf(c, sizeof(c), "s%u.b", i);
	int64_t ne[1] = {4};
	gb_tinfo(&b, o.dup ? o.dup : a, 1, ne, WF_DTYPE_F32, 0);
	gb_tinfo(&b, c, 1, ne, WF_DTYPE_F32, 32);
	gb_pad(&b, 32);
	for (int k = 0; k < 48; k++)
		gb_u8(&b, (uint8_t)(i + k));
	char name[64];
	snprintf(name, sizeof(name), "m-%05u-of-%05u.gguf", i + 1, n);
	char *p = in_dir(name);
	gb_write(&b, p);
	free(p);
	gb_free(&b);
}

static int open_shard(uint32_t i, uint32_t n, struct wf_model **m, struct wf_diag *d)
{
	char name[64];
	snprintf(name, sizeof(name), "m-%05u-of-%05u.gguf", i + 1, n);
	char *p = in_dir(name);
	int rc = wf_model_open(p, m, d);
	free(p);
	return rc;
}

static void expect_shard_fail(uint32_t named, uint32_t n, int code, const char *needle)
{
	struct wf_diag d = {{0}};
	struct wf_model *m = NULL;
	int rc = open_shard(named, n, &m, &d);
	cr_assert_eq(rc, code, "got %s (%s), want %s", wf_err_name(rc), d.msg, wf_err_name(code));
	cr_assert_null(m);
	cr_assert(strstr(d.msg, needle), "diag '%s' does not mention '%s'", d.msg, needle);
}

Test(gguf, shards_open_from_any_shard)
{
	for (uint32_t i = 0; i < 3; i++)
		write_shard(i, 3, (struct shard_opt){0});
	for (uint32_t named = 0; named < 3; named++) {
		struct wf_model *m = NULL;
		struct wf_diag d = {{0}};
		int rc = open_shard(named, 3, &m, &d);
		cr_assert_eq(rc, 0, "%s: %s", wf_err_name(rc), d.msg);
		cr_assert_eq(m->n_files, 3);
		cr_assert_eq(m->n_tensors, 6);
		for (uint32_t f = 0; f < 3; f++) {
			char want[64];
			snprintf(want, sizeof(want), "m-%05u-of-00003.gguf", f + 1);
			cr_assert(strstr(m->files[f].path, want), "%s", m->files[f].path);
			cr_assert_eq(m->files[f].n_tensors, 2);
		}
		for (uint32_t t = 0; t < 6; t++) {
			char want[16];
			snprintf(want, sizeof(want), "s%u.%c", t / 2, t % 2 ? 'b' : 'a');
			cr_assert_str_eq(m->tensors[t].name, want);
			cr_assert_eq(m->tensors[t].file, t / 2);
			cr_assert_eq(m->tensors[t].offset,
			             m->files[t / 2].data_offset + (t % 2) * 32);
		}
		/* kv is shard 0's, whichever was named. */
		cr_assert_eq(m->kv.n, 5);
		cr_assert_str_eq(m->hp.arch, "llama");
		cr_assert_eq(m->hp.n_layer, 7);
		wf_model_close(m);
	}
}

Test(gguf, shard_missing)
{
	for (uint32_t i = 0; i < 3; i++)
		write_shard(i, 3, (struct shard_opt){0});
	char *p = in_dir("m-00003-of-00003.gguf");
	unlink(p);
	free(p);
	expect_shard_fail(0, 3, WF_ESHARD, "m-00003-of-00003.gguf");
	expect_shard_fail(1, 3, WF_ESHARD, "missing shard");
}

Test(gguf, shard_inconsistent)
{
	write_shard(0, 3, (struct shard_opt){0});
	write_shard(1, 3, (struct shard_opt){.count_key = 4});
	write_shard(2, 3, (struct shard_opt){0});
	expect_shard_fail(0, 3, WF_ESHARD, "split.count 4");

	write_shard(1, 3, (struct shard_opt){.no_key = 3}); /* says split.no 2 */
	expect_shard_fail(0, 3, WF_ESHARD, "m-00002-of-00003.gguf");

	write_shard(1, 3, (struct shard_opt){0});
	write_shard(0, 3, (struct shard_opt){.total = 7});
	expect_shard_fail(2, 3, WF_ESHARD, "split.tensors.count 7");

	write_shard(0, 3, (struct shard_opt){.total = -1});
	expect_shard_fail(1, 3, WF_ESHARD, "no split.tensors.count");

	write_shard(0, 3, (struct shard_opt){0});
	write_shard(2, 3, (struct shard_opt){.dup = "s0.a"});
	expect_shard_fail(0, 3, WF_EDUPLICATE, "'s0.a'");
}

/* A FIFO named like a shard sibling used to block the open forever (issue 8): the siblings are
 * opened with O_NONBLOCK and refused when they are not regular files. */
Test(gguf, shard_fifo_refused_without_blocking, .timeout = 10)
{
	for (uint32_t i = 0; i < 2; i++)
		write_shard(i, 2, (struct shard_opt){0});
	char *p = in_dir("m-00002-of-00002.gguf");
	cr_assert_eq(unlink(p), 0);
	cr_assert_eq(mkfifo(p, 0600), 0);
	expect_shard_fail(0, 2, WF_EFORMAT, "not a regular file (a FIFO)");
	free(p);
}

/* The reader records the file it actually opened: a shard that is a symlink reports its target,
 * which is what a confinement check must look at. */
Test(gguf, shards_record_the_files_opened)
{
	for (uint32_t i = 0; i < 2; i++)
		write_shard(i, 2, (struct shard_opt){0});
	char *p = in_dir("m-00002-of-00002.gguf"), *elsewhere = in_dir("elsewhere");
	char *target = NULL;
	cr_assert_eq(mkdir(elsewhere, 0700), 0);
	cr_assert(asprintf(&target, "%s/real-shard.gguf", elsewhere) > 0);
	cr_assert_eq(rename(p, target), 0);
	cr_assert_eq(symlink(target, p), 0);
	struct wf_model *m = NULL;
	struct wf_diag d = {{0}};
	cr_assert_eq(open_shard(0, 2, &m, &d), 0, "%s", d.msg);
	char *real = realpath(target, NULL);
	struct stat st;
	cr_assert_eq(stat(target, &st), 0);
	cr_assert_str_eq(m->files[1].path, p);
	cr_assert_str_eq(m->files[1].real_path, real);
	cr_assert_eq(m->files[1].dev, (uint64_t)st.st_dev);
	cr_assert_eq(m->files[1].ino, (uint64_t)st.st_ino);
	char *real0 = realpath(m->files[0].path, NULL);
	cr_assert_str_eq(m->files[0].real_path, real0);
	wf_model_close(m);
	free(real);
	free(real0);
	free(target);
	free(elsewhere);
	free(p);
}

Test(gguf, shard_badly_named)
{
	for (uint32_t i = 0; i < 2; i++)
		write_shard(i, 2, (struct shard_opt){0});
	char *from = in_dir("m-00001-of-00002.gguf"), *to = in_dir("renamed.gguf");
	cr_assert_eq(rename(from, to), 0);
	struct wf_diag d = {{0}};
	struct wf_model *m = NULL;
	cr_assert_eq(wf_model_open(to, &m, &d), WF_ESHARD);
	cr_assert(strstr(d.msg, "-00001-of-00002.gguf"), "%s", d.msg);
	free(from);
	free(to);
}

Test(gguf, bad_arguments_and_paths)
{
	struct wf_diag d = {{0}};
	struct wf_model *m = NULL;
	cr_assert_eq(wf_model_open(NULL, &m, &d), WF_EINVAL);
	char *p = in_dir("absent.gguf");
	cr_assert_eq(wf_model_open(p, &m, &d), -ENOENT);
	cr_assert(strstr(d.msg, "absent.gguf"));
	free(p);
	/* A FIFO must not block the open. */
	char *fifo = in_dir("pipe.gguf");
	cr_assert_eq(mkfifo(fifo, 0600), 0);
	cr_assert_eq(wf_model_open(fifo, &m, &d), WF_EINVAL);
	free(fifo);
	/* A directory without a model. */
	cr_assert_eq(wf_model_open(dir, &m, &d), WF_ENOT_FOUND);
	cr_assert_null(m);
	wf_model_close(NULL);
	cr_assert_str_eq(wf_model_format_name(WF_MODEL_FORMAT_GGUF), "gguf");
	cr_assert_str_eq(wf_model_format_name(WF_MODEL_FORMAT_SAFETENSORS), "safetensors");
}
