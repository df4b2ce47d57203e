/* model/gguf_writer: the bytes it writes (checked with the independent reader in tgguf.c and with
 * wf_model_open), sharding like llama-gguf-split, and that nothing is left behind on failure. */
#include "common/wftest.h"
#include "tgguf.h"

#include "base/error.h"
#include "model/gguf_writer.h"
#include "model/model.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static char *dir;

static void setup(void)
{
	dir = wft_tmpdir("gguf-writer");
}

static void teardown(void)
{
	wft_rmtree(dir);
	free(dir);
}

TestSuite(gguf_writer, .init = setup, .fini = teardown, .timeout = 60);

static char *path_in(const char *name)
{
	char *p;
	cr_assert(asprintf(&p, "%s/%s", dir, name) > 0);
	return p;
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

/* Deterministic test bytes: byte i of tensor k. */
static uint8_t pattern(uint32_t k, uint64_t i)
{
	return (uint8_t)(i * 131 + k * 17 + (i >> 9));
}

static void stream_all(struct wf_gguf_writer *w, size_t chunk)
{
	uint32_t n = wf_gguf_writer_n_tensors(w);
	size_t cap = 1 << 20;
	uint8_t *buf = malloc(cap);
	for (uint32_t k = 0; k < n; k++) {
		uint64_t nb = wf_gguf_writer_tensor_nbytes(w, k);
		for (uint64_t off = 0; off < nb;) {
			size_t len = nb - off < chunk ? (size_t)(nb - off) : chunk;
			if (len > cap) {
				cap = len;
				buf = realloc(buf, cap);
			}
			for (size_t i = 0; i < len; i++)
				buf[i] = pattern(k, off + i);
			struct wf_diag diag = {0};
			int r = wf_gguf_writer_write(w, buf, len, &diag);
			cr_assert_eq(r, 0, "write: %s", wf_diag_str(&diag, r));
			off += len;
		}
	}
	free(buf);
}

static void check_tensor_bytes(const struct tg_file *f, const struct tg_tensor *t, uint32_t k)
{
	const uint8_t *p = tg_tensor_data(f, t);
	cr_assert_not_null(p, "%s ends past EOF", t->name);
	uint64_t nb = tg_tensor_nbytes(t);
	for (uint64_t i = 0; i < nb; i++)
		cr_assert_eq(p[i], pattern(k, i), "%s byte %llu", t->name, (unsigned long long)i);
	uint64_t end = t->offset + nb, pad = (end + f->alignment - 1) / f->alignment * f->alignment;
	for (uint64_t i = end; i < pad && f->data_off + i < f->size; i++)
		cr_assert_eq(f->bytes[f->data_off + i], 0, "padding after %s", t->name);
}

Test(gguf_writer, every_kv_type_round_trips)
{
	char *path = path_in("kv.gguf");
	struct wf_gguf_writer *w;
	struct wf_diag diag = {0};
	cr_assert_eq(wf_gguf_writer_create(path, NULL, &w, &diag), 0);

	struct wf_kv_value v;
	memset(&v, 0, sizeof(v));
	v.type = WF_KV_U8, v.u.u64 = 200;
	cr_assert_eq(wf_gguf_writer_set_kv(w, "t.u8", &v, NULL), 0);
	v.type = WF_KV_I8, v.u.i64 = -100;
	cr_assert_eq(wf_gguf_writer_set_kv(w, "t.i8", &v, NULL), 0);
	v.type = WF_KV_U16, v.u.u64 = 65000;
	cr_assert_eq(wf_gguf_writer_set_kv(w, "t.u16", &v, NULL), 0);
	v.type = WF_KV_I16, v.u.i64 = -30000;
	cr_assert_eq(wf_gguf_writer_set_kv(w, "t.i16", &v, NULL), 0);
	cr_assert_eq(wf_gguf_writer_set_u32(w, "t.u32", 4000000000u), 0);
	cr_assert_eq(wf_gguf_writer_set_i32(w, "t.i32", -2000000000), 0);
	cr_assert_eq(wf_gguf_writer_set_f32(w, "t.f32", 1.5f), 0);
	cr_assert_eq(wf_gguf_writer_set_bool(w, "t.bool", true), 0);
	cr_assert_eq(wf_gguf_writer_set_str(w, "t.str", "héllo"), 0);
	cr_assert_eq(wf_gguf_writer_set_u64(w, "t.u64", 1ull << 60), 0);
	v.type = WF_KV_I64, v.u.i64 = -(1ll << 60);
	cr_assert_eq(wf_gguf_writer_set_kv(w, "t.i64", &v, NULL), 0);
	v.type = WF_KV_F64, v.u.f64 = 0.1;
	cr_assert_eq(wf_gguf_writer_set_kv(w, "t.f64", &v, NULL), 0);
	/* a string with an embedded NUL keeps its length */
	v.type = WF_KV_STRING, v.u.str.s = "a\0b", v.u.str.n = 3;
	cr_assert_eq(wf_gguf_writer_set_kv(w, "t.nul", &v, NULL), 0);
	int16_t arr[3] = {-1, 2, -3};
	cr_assert_eq(wf_gguf_writer_set_array(w, "t.arr_i16", WF_KV_I16, arr, 3), 0);
	const char *strs[2] = {"x", "yz"};
	cr_assert_eq(wf_gguf_writer_set_str_array(w, "t.arr_str", strs, 2), 0);
	cr_assert_eq(wf_gguf_writer_set_array(w, "t.arr_empty", WF_KV_U32, NULL, 0), 0);
	/* array of two arrays of i32 */
	int32_t a0[2] = {1, 2}, a1[1] = {3};
	struct wf_kv_array inner[2] = {
	    {.elem = WF_KV_I32, .n = 2, .u.scalars = a0},
	    {.elem = WF_KV_I32, .n = 1, .u.scalars = a1},
	};
	v.type = WF_KV_ARRAY, v.u.arr.elem = WF_KV_ARRAY, v.u.arr.n = 2, v.u.arr.u.arrays = inner;
	cr_assert_eq(wf_gguf_writer_set_kv(w, "t.nested", &v, NULL), 0);
	/* setting again replaces in place */
	cr_assert_eq(wf_gguf_writer_set_u32(w, "t.u32", 7), 0);

	int64_t ne[1] = {8};
	cr_assert_eq(wf_gguf_writer_add_tensor(w, "x", WF_DTYPE_F32, 1, ne, NULL, &diag), 0);
	cr_assert_eq(wf_gguf_writer_write_header(w, &diag), 0);
	stream_all(w, 5);
	cr_assert_eq(wf_gguf_writer_finish(w, &diag), 0, "%s", diag.msg);
	wf_gguf_writer_destroy(w);

	struct tg_file f;
	cr_assert(tg_load(path, &f));
	cr_assert_eq(f.version, 3);
	cr_assert_eq(f.n_kv, 17);
	cr_assert_str_eq(f.kv[4].key, "t.u32", "replacing keeps the position");
	cr_assert_eq(tg_kv(&f, "t.u8")->type, 0);
	cr_assert_eq(tg_kv(&f, "t.u8")->u, 200);
	cr_assert_eq((int64_t)tg_kv(&f, "t.i8")->u, -100);
	cr_assert_eq(tg_kv(&f, "t.u16")->u, 65000);
	cr_assert_eq((int64_t)tg_kv(&f, "t.i16")->u, -30000);
	cr_assert_eq(tg_kv(&f, "t.u32")->u, 7);
	cr_assert_eq((int64_t)tg_kv(&f, "t.i32")->u, -2000000000);
	cr_assert_float_eq(tg_kv(&f, "t.f32")->f, 1.5, 0);
	cr_assert_eq(tg_kv(&f, "t.bool")->type, 7);
	cr_assert_eq(tg_kv(&f, "t.bool")->u, 1);
	cr_assert_str_eq(tg_kv(&f, "t.str")->s, "héllo");
	cr_assert_eq(tg_kv(&f, "t.u64")->u, 1ull << 60);
	cr_assert_eq((int64_t)tg_kv(&f, "t.i64")->u, -(1ll << 60));
	cr_assert_float_eq(tg_kv(&f, "t.f64")->f, 0.1, 0);
	cr_assert_eq(tg_kv(&f, "t.arr_i16")->arr_type, 3);
	cr_assert_eq(tg_kv(&f, "t.arr_i16")->arr_n, 3);
	cr_assert_eq(tg_kv(&f, "t.arr_str")->arr_type, 8);
	cr_assert_eq(tg_kv(&f, "t.arr_empty")->arr_n, 0);
	cr_assert_eq(tg_kv(&f, "t.nested")->arr_type, 9);
	cr_assert_eq(tg_kv(&f, "t.nested")->arr_n, 2);
	/* t.nul: u64 length 3 then 'a' 0 'b' */
	const uint8_t *nul = f.bytes + tg_kv(&f, "t.nul")->val_off;
	cr_assert_eq(nul[0], 3);
	cr_assert_eq(memcmp(nul + 8, "a\0b", 3), 0);
	check_tensor_bytes(&f, &f.t[0], 0);
	tg_free(&f);

	/* The project's reader agrees, nested array included. */
	struct wf_model *m;
	int r = wf_model_open(path, &m, &diag);
	cr_assert_eq(r, 0, "wf_model_open: %s", wf_diag_str(&diag, r));
	const struct wf_kv *kv = wf_kv_find(&m->kv, "t.nested");
	cr_assert_not_null(kv);
	cr_assert_eq(kv->v.u.arr.n, 2);
	cr_assert_eq(kv->v.u.arr.u.arrays[0].n, 2);
	cr_assert_eq(((int32_t *)kv->v.u.arr.u.arrays[1].u.scalars)[0], 3);
	kv = wf_kv_find(&m->kv, "t.nul");
	cr_assert_eq(kv->v.u.str.n, 3);
	wf_model_close(m);
	free(path);
}

/* A small mixed table: odd sizes so that padding is exercised. */
static void add_mixed(struct wf_gguf_writer *w)
{
	struct wf_diag diag = {0};
	int64_t a[1] = {3};         /* F32: 12 bytes */
	int64_t b[2] = {32, 5};     /* Q8_0: 170 bytes */
	int64_t c[3] = {256, 3, 2}; /* Q4_K: 864 bytes */
	int64_t d[2] = {7, 1};      /* F16: 14 bytes */
	int64_t e[1] = {300000};    /* F32: 1.2 MB, more than a small buffer */
	cr_assert_eq(wf_gguf_writer_add_tensor(w, "a", WF_DTYPE_F32, 1, a, NULL, &diag), 0);
	cr_assert_eq(wf_gguf_writer_add_tensor(w, "b", WF_DTYPE_Q8_0, 2, b, NULL, &diag), 0);
	cr_assert_eq(wf_gguf_writer_add_tensor(w, "c", WF_DTYPE_Q4_K, 3, c, NULL, &diag), 0);
	cr_assert_eq(wf_gguf_writer_add_tensor(w, "d", WF_DTYPE_F16, 2, d, NULL, &diag), 0);
	cr_assert_eq(wf_gguf_writer_add_tensor(w, "e", WF_DTYPE_F32, 1, e, NULL, &diag), 0);
	cr_assert_eq(wf_gguf_writer_set_str(w, "general.architecture", "test"), 0);
}

static void write_mixed(const char *path, const struct wf_gguf_writer_opts *o, size_t chunk)
{
	struct wf_gguf_writer *w;
	struct wf_diag diag = {0};
	cr_assert_eq(wf_gguf_writer_create(path, o, &w, &diag), 0, "%s", diag.msg);
	add_mixed(w);
	cr_assert_eq(wf_gguf_writer_write_header(w, &diag), 0, "%s", diag.msg);
	stream_all(w, chunk);
	cr_assert_eq(wf_gguf_writer_finish(w, &diag), 0, "%s", diag.msg);
	wf_gguf_writer_destroy(w);
}

static void check_mixed_file(const char *path, uint32_t alignment)
{
	struct tg_file f;
	cr_assert(tg_load(path, &f), "%s", path);
	cr_assert_eq(f.alignment, alignment);
	cr_assert_eq(f.data_off % alignment, 0);
	cr_assert_eq(f.n_tensors, 5);
	uint64_t expect_off = 0;
	for (uint32_t k = 0; k < 5; k++) {
		cr_assert_eq(f.t[k].offset, expect_off, "%s offset", f.t[k].name);
		cr_assert_eq(f.t[k].offset % alignment, 0);
		check_tensor_bytes(&f, &f.t[k], k);
		expect_off += (tg_tensor_nbytes(&f.t[k]) + alignment - 1) / alignment * alignment;
	}
	cr_assert_eq(f.size, f.data_off + expect_off, "the last tensor is padded too");
	tg_free(&f);
}

Test(gguf_writer, offsets_padding_and_chunking)
{
	/* chunk sizes: 1 byte, odd, and larger than the buffer (pass-through path) */
	size_t chunks[] = {1, 4099, 3 << 20};
	for (size_t i = 0; i < 3; i++) {
		char *path = path_in("mixed.gguf");
		struct wf_gguf_writer_opts o = {.buffer_size = 64 << 10};
		write_mixed(path, &o, chunks[i]);
		check_mixed_file(path, 32);
		free(path);
	}
	/* O_DIRECT with a buffer smaller than the data: whole buffers direct, the tail buffered */
	char *dpath = path_in("direct.gguf");
	struct wf_gguf_writer_opts od = {.direct = true, .buffer_size = 64 << 10};
	write_mixed(dpath, &od, 50000);
	check_mixed_file(dpath, 32);
	free(dpath);
	char *path = path_in("mixed64.gguf");
	struct wf_gguf_writer_opts o = {.alignment = 64, .fsync = true, .direct = true};
	write_mixed(path, &o, 1000);
	check_mixed_file(path, 64);
	struct tg_file f;
	cr_assert(tg_load(path, &f));
	cr_assert_eq(tg_kv(&f, "general.alignment")->type, 4, "general.alignment is a u32");
	cr_assert_eq(tg_kv(&f, "general.alignment")->u, 64);
	tg_free(&f);
	free(path);
	cr_assert_eq(count_entries(dir), 3, "no temporaries left");
}

Test(gguf_writer, split_like_gguf_split)
{
	char *path = path_in("m.gguf");
	/* a, b, c fit in 1100 padded bytes; d would not; e is larger than the limit */
	struct wf_gguf_writer_opts o = {.split_max_bytes = 1100};
	write_mixed(path, &o, 777);
	free(path);
	cr_assert_eq(count_entries(dir), 3);
	const char *names[3] = {"m-00001-of-00003.gguf", "m-00002-of-00003.gguf",
	                        "m-00003-of-00003.gguf"};
	const uint32_t first[3] = {0, 3, 4}, count[3] = {3, 1, 1};
	for (uint32_t s = 0; s < 3; s++) {
		char *p = path_in(names[s]);
		struct tg_file f;
		cr_assert(tg_load(p, &f), "%s", p);
		cr_assert_eq(f.n_tensors, count[s], "%s", names[s]);
		const struct tg_kv *no = tg_kv(&f, "split.no"), *cnt = tg_kv(&f, "split.count"),
		                   *tc = tg_kv(&f, "split.tensors.count");
		cr_assert(no && cnt && tc);
		cr_assert_eq(no->type, 2, "split.no is u16");
		cr_assert_eq(cnt->type, 2, "split.count is u16");
		cr_assert_eq(tc->type, 5, "split.tensors.count is i32");
		cr_assert_eq(no->u, s);
		cr_assert_eq(cnt->u, 3);
		cr_assert_eq(tc->u, 5);
		/* metadata only in the first shard */
		cr_assert_eq(tg_kv(&f, "general.architecture") != NULL, s == 0);
		cr_assert_eq(f.n_kv, s == 0 ? 4 : 3);
		for (uint32_t k = 0; k < count[s]; k++) {
			cr_assert_eq(f.t[k].offset % 32, 0);
			check_tensor_bytes(&f, &f.t[k], first[s] + k);
		}
		tg_free(&f);
		free(p);
	}
	/* one model through the project's reader, from any shard */
	char *p2 = path_in(names[1]);
	struct wf_model *m;
	struct wf_diag diag = {0};
	int r = wf_model_open(p2, &m, &diag);
	cr_assert_eq(r, 0, "%s", wf_diag_str(&diag, r));
	cr_assert_eq(m->n_files, 3);
	cr_assert_eq(m->n_tensors, 5);
	cr_assert_not_null(wf_model_find_tensor(m, "e"));
	wf_model_close(m);
	free(p2);
}

Test(gguf_writer, split_by_tensor_count_with_alignment)
{
	char *path = path_in("t.gguf");
	struct wf_gguf_writer_opts o = {.split_max_tensors = 2, .alignment = 128};
	write_mixed(path, &o, 4096);
	free(path);
	for (uint32_t s = 0; s < 3; s++) {
		char *p;
		cr_assert(asprintf(&p, "%s/t-%05u-of-00003.gguf", dir, s + 1) > 0);
		struct tg_file f;
		cr_assert(tg_load(p, &f), "%s", p);
		cr_assert_eq(f.n_tensors, s < 2 ? 2 : 1);
		cr_assert_not_null(tg_kv(&f, "general.alignment"),
		                   "every shard says its alignment");
		cr_assert_eq(f.alignment, 128);
		for (uint32_t k = 0; k < f.n_tensors; k++)
			check_tensor_bytes(&f, &f.t[k], 2 * s + k);
		tg_free(&f);
		free(p);
	}
}

Test(gguf_writer, single_shard_split_naming)
{
	char *path = path_in("one.gguf");
	struct wf_gguf_writer_opts o = {.split = true};
	write_mixed(path, &o, 1 << 20);
	free(path);
	char *p = path_in("one-00001-of-00001.gguf");
	struct tg_file f;
	cr_assert(tg_load(p, &f));
	cr_assert_eq(tg_kv(&f, "split.count")->u, 1);
	tg_free(&f);
	free(p);
}

Test(gguf_writer, misuse_is_refused)
{
	char *path = path_in("bad.gguf");
	struct wf_gguf_writer *w;
	struct wf_diag diag = {0};
	struct wf_gguf_writer_opts o = {.alignment = 48};
	cr_assert_eq(wf_gguf_writer_create(path, &o, &w, &diag), WF_EINVAL);
	struct wf_gguf_writer_opts so = {.split_max_bytes = 10};
	cr_assert_eq(wf_gguf_writer_create("/tmp/x.bin", &so, &w, NULL), WF_EINVAL);

	cr_assert_eq(wf_gguf_writer_create(path, NULL, &w, &diag), 0);
	cr_assert_eq(wf_gguf_writer_set_u32(w, "general.alignment", 64), WF_EINVAL);
	cr_assert_eq(wf_gguf_writer_set_u32(w, "split.count", 2), WF_EINVAL);
	int64_t ne[5] = {32, 1, 1, 1, 1};
	cr_assert_eq(wf_gguf_writer_add_tensor(w, "x", WF_DTYPE_F32, 0, ne, NULL, NULL), WF_EINVAL);
	cr_assert_eq(wf_gguf_writer_add_tensor(w, "x", WF_DTYPE_F32, 5, ne, NULL, NULL), WF_EINVAL);
	int64_t odd[1] = {33};
	cr_assert_eq(wf_gguf_writer_add_tensor(w, "x", WF_DTYPE_Q8_0, 1, odd, NULL, NULL),
	             WF_EALIGN);
	int64_t neg[2] = {32, -1};
	cr_assert_eq(wf_gguf_writer_add_tensor(w, "x", WF_DTYPE_F32, 2, neg, NULL, NULL),
	             WF_EINVAL);
	cr_assert_eq(wf_gguf_writer_add_tensor(w, "x", (enum wf_dtype)4, 1, ne, NULL, NULL),
	             WF_EUNKNOWN_TYPE);
	char longname[80];
	memset(longname, 'n', sizeof(longname) - 1);
	longname[79] = '\0';
	cr_assert_eq(wf_gguf_writer_add_tensor(w, longname, WF_DTYPE_F32, 1, ne, NULL, NULL),
	             WF_ELIMIT);
	uint32_t idx = 99;
	cr_assert_eq(wf_gguf_writer_add_tensor(w, "x", WF_DTYPE_F32, 1, ne, &idx, NULL), 0);
	cr_assert_eq(idx, 0);
	wf_diag_clear(&diag);
	cr_assert_eq(wf_gguf_writer_add_tensor(w, "x", WF_DTYPE_F32, 1, ne, NULL, &diag),
	             WF_EDUPLICATE);
	cr_assert(strstr(diag.msg, "'x'"), "diag names the tensor: %s", diag.msg);
	cr_assert_eq(wf_gguf_writer_write(w, "z", 1, NULL), WF_ESTATE, "write before the header");
	cr_assert_eq(wf_gguf_writer_write_header(w, NULL), 0);
	cr_assert_eq(wf_gguf_writer_set_u32(w, "late", 1), WF_ESTATE);
	cr_assert_eq(wf_gguf_writer_add_tensor(w, "y", WF_DTYPE_F32, 1, ne, NULL, NULL), WF_ESTATE);
	float data[32] = {0};
	cr_assert_eq(wf_gguf_writer_write(w, data, 64, NULL), 0);
	cr_assert_eq(wf_gguf_writer_finish(w, NULL), WF_ETRUNCATED, "half a tensor");
	cr_assert_eq(wf_gguf_writer_finish(w, NULL), WF_ESTATE, "poisoned after a failure");
	wf_gguf_writer_destroy(w);
	cr_assert_eq(count_entries(dir), 0, "nothing left behind");

	cr_assert_eq(wf_gguf_writer_create(path, NULL, &w, NULL), 0);
	cr_assert_eq(wf_gguf_writer_add_tensor(w, "x", WF_DTYPE_F32, 1, ne, NULL, NULL), 0);
	cr_assert_eq(wf_gguf_writer_write_header(w, NULL), 0);
	float more[40] = {0};
	cr_assert_eq(wf_gguf_writer_write(w, more, sizeof(more), NULL), WF_EOVERFLOW);
	wf_gguf_writer_destroy(w);
	cr_assert_eq(count_entries(dir), 0);
	wf_gguf_writer_destroy(NULL);
	free(path);
}

Test(gguf_writer, abandoned_split_write_leaves_nothing_and_keeps_old_file)
{
	char *old = path_in("keep.gguf");
	FILE *fp = fopen(old, "w");
	fputs("old", fp);
	fclose(fp);
	struct wf_gguf_writer *w;
	struct wf_gguf_writer_opts o = {.split_max_tensors = 1};
	cr_assert_eq(wf_gguf_writer_create(old, &o, &w, NULL), 0);
	add_mixed(w);
	cr_assert_eq(wf_gguf_writer_write_header(w, NULL), 0);
	/* complete three tensors (three shards closed or open), then give up */
	uint8_t buf[2048] = {0};
	cr_assert_eq(wf_gguf_writer_write(w, buf, 12 + 170 + 864, NULL), 0);
	cr_assert_eq(wf_gguf_writer_n_files(w), 5);
	wf_gguf_writer_destroy(w);
	cr_assert_eq(count_entries(dir), 1, "only the untouched old file");
	size_t len;
	char *text = wft_read_file(old, &len);
	cr_assert_str_eq(text, "old");
	free(text);
	free(old);
}

Test(gguf_writer, missing_directory_fails_cleanly)
{
	char *path = path_in("nodir/x.gguf");
	struct wf_gguf_writer *w;
	struct wf_diag diag = {0};
	cr_assert_eq(wf_gguf_writer_create(path, NULL, &w, NULL), 0);
	int r = wf_gguf_writer_write_header(w, &diag);
	cr_assert_eq(r, -ENOENT);
	cr_assert(strstr(diag.msg, "nodir"), "%s", diag.msg);
	wf_gguf_writer_destroy(w);
	free(path);
}
