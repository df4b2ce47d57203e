/* A model rebuilt from its floor alone (wf_shm_region_model) equals the model wf_model_open()
 * gives for the files: every reference model (GGUF, split GGUF) and a wf-gen safetensors model.
 * And a damaged metadata section (shm/layout.h, model/meta.h) is an error at attach or at
 * rebuild, never a fault; an old-format region is refused by readers and rebuilt by an agent. */
#include "shmtest.h"

#include "base/error.h"
#include "common/wftest.h"
#include "model/meta.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

TestSuite(floor_model, .timeout = 120);

static char *tmp;
static struct wf_shm_config cfg;

static void setup(void)
{
	tmp = wft_tmpdir("shm-floor-model");
	memset(&cfg, 0, sizeof(cfg));
	cr_assert(asprintf((char **)&cfg.dir, "%s/floor", tmp) > 0);
}

static void teardown(void)
{
	wft_rmtree(tmp);
	free((char *)cfg.dir);
}

/* ---- comparison ---- */

static bool array_eq(const struct wf_kv_array *a, const struct wf_kv_array *b);

static bool str_eq(const struct wf_kv_str *a, const struct wf_kv_str *b)
{
	return a->n == b->n && memcmp(a->s, b->s, (size_t)a->n) == 0 && b->s[b->n] == 0;
}

static bool array_eq(const struct wf_kv_array *a, const struct wf_kv_array *b)
{
	if (a->elem != b->elem || a->n != b->n)
		return false;
	for (uint64_t i = 0; i < a->n; i++) {
		if (a->elem == WF_KV_STRING && !str_eq(&a->u.strs[i], &b->u.strs[i]))
			return false;
		if (a->elem == WF_KV_ARRAY && !array_eq(&a->u.arrays[i], &b->u.arrays[i]))
			return false;
	}
	if (a->elem != WF_KV_STRING && a->elem != WF_KV_ARRAY && a->n)
		return memcmp(a->u.scalars, b->u.scalars, a->n * wf_kv_type_size(a->elem)) == 0;
	return true;
}

static bool value_eq(const struct wf_kv_value *a, const struct wf_kv_value *b)
{
	if (a->type != b->type)
		return false;
	if (a->type == WF_KV_STRING)
		return str_eq(&a->u.str, &b->u.str);
	if (a->type == WF_KV_ARRAY)
		return array_eq(&a->u.arr, &b->u.arr);
	return memcmp(&a->u.u64, &b->u.u64, 8) == 0; /* bit for bit, doubles included */
}

static void models_equal(const struct wf_model *a, const struct wf_model *b, const char *what)
{
	cr_assert_eq(a->format, b->format, "%s: format", what);
	cr_assert_eq(a->n_files, b->n_files, "%s: files", what);
	for (uint32_t i = 0; i < a->n_files; i++) {
		const struct wf_model_file *x = &a->files[i], *y = &b->files[i];
		cr_assert_str_eq(x->path, y->path, "%s: file %u path", what, i);
		cr_assert(x->size == y->size && x->mtime_ns == y->mtime_ns &&
		              x->data_offset == y->data_offset && x->data_size == y->data_size &&
		              x->gguf_version == y->gguf_version && x->alignment == y->alignment &&
		              x->n_tensors == y->n_tensors,
		          "%s: file %u fields", what, i);
	}
	cr_assert_eq(a->n_tensors, b->n_tensors, "%s: tensors", what);
	for (uint32_t i = 0; i < a->n_tensors; i++) {
		const struct wf_tensor *x = &a->tensors[i], *y = &b->tensors[i];
		cr_assert_str_eq(x->name, y->name, "%s: tensor %u", what, i);
		cr_assert(x->dtype == y->dtype && x->n_dims == y->n_dims &&
		              memcmp(x->ne, y->ne, sizeof(x->ne)) == 0 && x->nbytes == y->nbytes &&
		              x->file == y->file && x->offset == y->offset &&
		              x->tclass == y->tclass,
		          "%s: tensor '%s' fields", what, x->name);
		cr_assert_eq(wf_model_find_tensor(b, x->name), y, "%s: find '%s'", what, x->name);
	}
	cr_assert(a->total_bytes == b->total_bytes && a->dense_bytes == b->dense_bytes &&
	              a->expert_bytes == b->expert_bytes &&
	              memcmp(a->bytes_by_dtype, b->bytes_by_dtype, sizeof(a->bytes_by_dtype)) ==
	                  0 &&
	              memcmp(a->count_by_dtype, b->count_by_dtype, sizeof(a->count_by_dtype)) == 0,
	          "%s: totals", what);
	cr_assert_str_eq(a->hp.arch, b->hp.arch, "%s: arch", what);
	cr_assert(memcmp((const char *)&a->hp + sizeof(a->hp.arch),
	                 (const char *)&b->hp + sizeof(b->hp.arch),
	                 sizeof(a->hp) - sizeof(a->hp.arch)) == 0,
	          "%s: hyperparameters", what);
	cr_assert_eq(a->kv.n, b->kv.n, "%s: key count", what);
	for (uint32_t i = 0; i < a->kv.n; i++) {
		cr_assert_str_eq(a->kv.items[i].key, b->kv.items[i].key, "%s: key %u", what, i);
		cr_assert(value_eq(&a->kv.items[i].v, &b->kv.items[i].v), "%s: value of '%s'", what,
		          a->kv.items[i].key);
	}
}

/* Materializes m's floor, rebuilds the model from it with a reader attach, compares. */
static void round_trip(const struct wf_model *m, const char *what)
{
	struct wf_digest dg;
	struct wf_shm_region *w = NULL, *r = NULL;
	struct wf_model *fm = NULL;
	struct wf_diag d = {{0}};
	wf_model_digest(m, &dg);
	int rc = wf_shm_region_attach(&cfg, &dg, m, WF_SHM_ATTACH_AGENT, shmt_fill, NULL, &w, &d);
	cr_assert_eq(rc, 0, "%s: materialize: %s", what, wf_diag_str(&d, rc));
	rc = wf_shm_region_attach(&cfg, &dg, NULL, WF_SHM_ATTACH_READER, NULL, NULL, &r, &d);
	cr_assert_eq(rc, 0, "%s: reader attach: %s", what, wf_diag_str(&d, rc));
	rc = wf_shm_region_model(r, &fm, &d);
	cr_assert_eq(rc, 0, "%s: model from floor: %s", what, wf_diag_str(&d, rc));
	models_equal(m, fm, what);
	struct wf_digest fd;
	wf_model_digest(fm, &fd);
	cr_assert(fd.hi == dg.hi && fd.lo == dg.lo, "%s: digest", what);
	/* the tensors' bytes are the floor's, in model order */
	char why[256];
	cr_assert_eq(shmt_check_bytes(r, fm, why, sizeof(why)), 0, "%s: %s", what, why);
	wf_model_close(fm);
	wf_shm_region_detach(r);
	wf_shm_region_detach(w);
}

static struct wf_model *open_reference(const char *folder)
{
	char *mpath = NULL, *path = NULL;
	cr_assert(asprintf(&mpath, "%s/manifest.json", folder) > 0);
	json_object *man = json_object_from_file(mpath), *v = NULL;
	cr_assert_not_null(man, "%s", mpath);
	cr_assert(json_object_object_get_ex(man, "load_this_file", &v));
	cr_assert(asprintf(&path, "%s/%s", folder, json_object_get_string(v)) > 0);
	struct wf_model *m = NULL;
	struct wf_diag d = {{0}};
	int rc = wf_model_open(path, &m, &d);
	cr_assert_eq(rc, 0, "%s: %s", path, wf_diag_str(&d, rc));
	json_object_put(man);
	free(mpath);
	free(path);
	return m;
}

Test(floor_model, every_reference_model, .init = setup, .fini = teardown)
{
	const char *ref = wft_reference_dir();
	cr_assert_not_null(ref, "tests/data/reference/ is missing");
	DIR *dir = opendir(ref);
	cr_assert_not_null(dir);
	int n = 0, split = 0;
	for (struct dirent *e; (e = readdir(dir));) {
		if (e->d_name[0] == '.' || e->d_type != DT_DIR)
			continue;
		char *folder = NULL;
		cr_assert(asprintf(&folder, "%s/%s", ref, e->d_name) > 0);
		struct wf_model *m = open_reference(folder);
		/* what the comparison must cover: a tokenizer with arrays of strings and numbers */
		const struct wf_kv_array *a = NULL;
		cr_assert_eq(wf_kv_get_array(&m->kv, "tokenizer.ggml.tokens", &a), 0, "%s",
		             e->d_name);
		cr_assert_eq(a->elem, WF_KV_STRING);
		split += m->n_files > 1;
		round_trip(m, e->d_name);
		wf_model_close(m);
		free(folder);
		n++;
	}
	closedir(dir);
	cr_assert_geq(n, 5, "reference models found: %d", n);
	cr_assert_geq(split, 1, "a split model among them");
}

Test(floor_model, safetensors_from_wf_gen, .init = setup, .fini = teardown)
{
	char *out = NULL, *err = NULL;
	cr_assert(asprintf(&out, "%s/st-model", tmp) > 0);
	cr_assert(asprintf(&err, "%s/wf-gen.err", tmp) > 0);
	char *gen = wft_exe("tools/wf-gen");
	char *argv[] = {gen,      "--format", "safetensors", "--arch", "qwen3moe",
	                "--seed", "5",        "-o",          out,      NULL};
	int rc = wft_run(argv, NULL, err, 100);
	cr_assert_eq(rc, 0, "wf-gen: %s", wft_read_file(err, NULL));
	struct wf_model *m = NULL;
	struct wf_diag d = {{0}};
	rc = wf_model_open(out, &m, &d);
	cr_assert_eq(rc, 0, "%s: %s", out, wf_diag_str(&d, rc));
	cr_assert_eq(m->format, WF_MODEL_FORMAT_SAFETENSORS);
	cr_assert_gt(m->hp.n_layer, 0, "config.json gave the hyperparameters");
	round_trip(m, "safetensors");
	wf_model_close(m);
	free(gen);
	free(out);
	free(err);
}

/* Every value type, arrays of arrays, a string holding NULs, an empty array: encode, decode. */
Test(floor_model, meta_every_type)
{
	struct wf_model m = {0};
	struct wf_model_file files[2] = {{.gguf_version = 3, .alignment = 32},
	                                 {.gguf_version = 2, .alignment = 64}};
	m.format = WF_MODEL_FORMAT_GGUF;
	m.n_files = 2;
	m.files = files;
	strcpy(m.hp.arch, "qwen3moe");
	m.hp.n_layer = 3;
	m.hp.rms_eps = 1e-6f;
	static uint16_t u16s[3] = {1, 2, 65535};
	static uint8_t bools[2] = {0, 1};
	static int32_t inner0[2] = {-1, 7}, inner1[1] = {42};
	static struct wf_kv_array inner[3] = {{.elem = WF_KV_I32, .n = 2, .u.scalars = inner0},
	                                      {.elem = WF_KV_I32, .n = 1, .u.scalars = inner1},
	                                      {.elem = WF_KV_F64, .n = 0}};
	static char nul_str[] = {'a', 0, 'b'};
	static struct wf_kv_str strs[2] = {{.s = "x", .n = 1}, {.s = "", .n = 0}};
	struct wf_kv items[] = {
	    {"u8", {.type = WF_KV_U8, .u.u64 = 255}},
	    {"i8", {.type = WF_KV_I8, .u.i64 = -128}},
	    {"u16", {.type = WF_KV_U16, .u.u64 = 65535}},
	    {"i16", {.type = WF_KV_I16, .u.i64 = -3}},
	    {"u32", {.type = WF_KV_U32, .u.u64 = 4000000000u}},
	    {"i32", {.type = WF_KV_I32, .u.i64 = -2000000000}},
	    {"f32", {.type = WF_KV_F32, .u.f64 = (double)0.1f}},
	    {"bool", {.type = WF_KV_BOOL, .u.u64 = 1}},
	    {"str", {.type = WF_KV_STRING, .u.str = {nul_str, 3}}},
	    {"u64", {.type = WF_KV_U64, .u.u64 = UINT64_MAX}},
	    {"i64", {.type = WF_KV_I64, .u.i64 = INT64_MIN}},
	    {"f64", {.type = WF_KV_F64, .u.f64 = -1e300}},
	    {"a.u16",
	     {.type = WF_KV_ARRAY, .u.arr = {.elem = WF_KV_U16, .n = 3, .u.scalars = u16s}}},
	    {"a.bool",
	     {.type = WF_KV_ARRAY, .u.arr = {.elem = WF_KV_BOOL, .n = 2, .u.scalars = bools}}},
	    {"a.str",
	     {.type = WF_KV_ARRAY, .u.arr = {.elem = WF_KV_STRING, .n = 2, .u.strs = strs}}},
	    {"a.arr",
	     {.type = WF_KV_ARRAY, .u.arr = {.elem = WF_KV_ARRAY, .n = 3, .u.arrays = inner}}},
	    {"a.empty", {.type = WF_KV_ARRAY, .u.arr = {.elem = WF_KV_U8, .n = 0}}},
	};
	m.kv.n = sizeof(items) / sizeof(items[0]);
	m.kv.items = items;
	size_t len = 0;
	cr_assert_eq(wf_model_meta_encode(&m, NULL, 0, &len, NULL), 0);
	uint8_t *buf = malloc(len);
	size_t len2 = 0;
	cr_assert_eq(wf_model_meta_encode(&m, buf, len - 1, &len2, NULL), WF_ELIMIT);
	cr_assert_eq(wf_model_meta_encode(&m, buf, len, &len2, NULL), 0);
	cr_assert_eq(len2, len);
	cr_assert_eq(wf_model_meta_decode(buf, len, NULL, NULL), 0);

	struct wf_model_file files2[2] = {{0}};
	struct wf_model back = {.n_files = 2, .files = files2};
	struct wf_diag d = {{0}};
	int rc = wf_model_meta_decode(buf, len, &back, &d);
	cr_assert_eq(rc, 0, "%s", wf_diag_str(&d, rc));
	cr_assert_eq(back.format, WF_MODEL_FORMAT_GGUF);
	cr_assert(memcmp(&back.hp, &m.hp, sizeof(m.hp)) == 0);
	cr_assert(files2[1].gguf_version == 2 && files2[1].alignment == 64);
	cr_assert_eq(back.kv.n, m.kv.n);
	for (uint32_t i = 0; i < m.kv.n; i++) {
		cr_assert_str_eq(back.kv.items[i].key, items[i].key);
		cr_assert(value_eq(&items[i].v, &back.kv.items[i].v), "value of '%s'",
		          items[i].key);
	}
	wf_kv_set_fini(&back.kv);

	/* every strict prefix is an error, never a fault; so is a byte more */
	for (size_t k = 0; k < len; k++)
		cr_assert_lt(wf_model_meta_decode(buf, k, NULL, NULL), 0, "prefix %zu", k);
	uint8_t *more = malloc(len + 1);
	memcpy(more, buf, len);
	more[len] = 0;
	cr_assert_eq(wf_model_meta_decode(more, len + 1, NULL, NULL), WF_EFORMAT);
	/* and every prefix decoded into a model frees what it built (ASan/valgrind see leaks) */
	for (size_t k = 0; k < len; k++) {
		struct wf_model_file f3[2] = {{0}};
		struct wf_model b3 = {.n_files = 2, .files = f3};
		cr_assert_lt(wf_model_meta_decode(buf, k, &b3, NULL), 0);
		cr_assert_eq(b3.kv.n, 0);
	}
	free(more);
	free(buf);
}

/* ---- damaged metadata in a region ---- */

static struct wf_model *ref_model;
static struct wf_digest ref_digest;
static char *region_path;

static void setup_ref(void)
{
	setup();
	const char *ref = wft_reference_dir();
	cr_assert_not_null(ref);
	char *folder = NULL;
	cr_assert(asprintf(&folder, "%s/qwen3moe-tiny-q8_0", ref) > 0);
	ref_model = open_reference(folder);
	free(folder);
	wf_model_digest(ref_model, &ref_digest);
	struct wf_shm_region *w = NULL;
	struct wf_diag d = {{0}};
	int rc = wf_shm_region_attach(&cfg, &ref_digest, ref_model, WF_SHM_ATTACH_AGENT, shmt_fill,
	                              NULL, &w, &d);
	cr_assert_eq(rc, 0, "%s", wf_diag_str(&d, rc));
	/* the keep marker leaves the region in place when the last holder goes */
	cr_assert_eq(wf_shm_region_set_keep(&cfg, &ref_digest, true, NULL), 0);
	wf_shm_region_detach(w);
	cr_assert(asprintf(&region_path, "%s/wf-%016llx%016llx", cfg.dir,
	                   (unsigned long long)ref_digest.hi,
	                   (unsigned long long)ref_digest.lo) > 0);
}

static void teardown_ref(void)
{
	wf_model_close(ref_model);
	free(region_path);
	teardown();
}

static uint8_t *map_rw(size_t *ret_size)
{
	int fd = open(region_path, O_RDWR | O_CLOEXEC);
	cr_assert_geq(fd, 0);
	struct stat st;
	cr_assert_eq(fstat(fd, &st), 0);
	uint8_t *b = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	cr_assert_neq(b, MAP_FAILED);
	*ret_size = (size_t)st.st_size;
	return b;
}

/* After a deliberate change, the checksums are made right again, so that the metadata checks
 * themselves must catch it (a stray bit flip would fail the tables checksum first). */
static void reseal(uint8_t *b)
{
	struct wf_shm_header *h = (struct wf_shm_header *)b;
	h->tables_checksum =
	    wf_shm_checksum(b + h->file_table_offset, h->data_offset - h->file_table_offset);
	h->header_checksum = wf_shm_header_checksum(h);
}

static int reader_attach(struct wf_diag *d)
{
	struct wf_shm_region *r = NULL;
	int rc =
	    wf_shm_region_attach(&cfg, &ref_digest, NULL, WF_SHM_ATTACH_READER, NULL, NULL, &r, d);
	if (rc == 0) {
		struct wf_model *m = NULL;
		rc = wf_shm_region_model(r, &m, d);
		wf_model_close(m);
		wf_shm_region_detach(r);
	}
	return rc;
}

/* The byte offset in the section of the u32 type that follows key (its record's value). */
static uint64_t value_at(const uint8_t *meta, uint64_t size, const char *key)
{
	size_t kn = strlen(key);
	for (uint64_t o = 4; o + kn + 1 < size; o++)
		if (memcmp(meta + o, key, kn + 1) == 0) {
			uint32_t len;
			memcpy(&len, meta + o - 4, 4);
			if (len == kn)
				return o + kn + 1;
		}
	cr_assert_fail("key %s not in the metadata", key);
	return 0;
}

struct damage {
	const char *name;
	int want;
	void (*f)(uint8_t *b, uint8_t *meta, uint64_t size);
};

static void d_n_kv(uint8_t *b, uint8_t *meta, uint64_t size)
{
	(void)b, (void)size;
	uint32_t v = UINT32_MAX;
	memcpy(meta + 12, &v, 4);
}

static void d_n_kv_plus(uint8_t *b, uint8_t *meta, uint64_t size)
{
	(void)b, (void)size;
	uint32_t v;
	memcpy(&v, meta + 12, 4);
	v += 1;
	memcpy(meta + 12, &v, 4);
}

static void d_arch_unterminated(uint8_t *b, uint8_t *meta, uint64_t size)
{
	(void)b, (void)size;
	memset(meta + 16, 'a', 64);
}

static void d_truncated(uint8_t *b, uint8_t *meta, uint64_t size)
{
	(void)meta, (void)size;
	((struct wf_shm_header *)b)->meta_size -= 3;
}

static void d_key_len(uint8_t *b, uint8_t *meta, uint64_t size)
{
	(void)b;
	uint64_t o = value_at(meta, size, "general.architecture");
	uint32_t v = 0x7fffffff;
	memcpy(meta + o - strlen("general.architecture") - 1 - 4, &v, 4);
}

static void d_key_nul(uint8_t *b, uint8_t *meta, uint64_t size)
{
	(void)b;
	uint64_t o = value_at(meta, size, "general.architecture");
	meta[o - 3] = 0;
}

static void d_value_type(uint8_t *b, uint8_t *meta, uint64_t size)
{
	(void)b;
	uint32_t t = 13;
	memcpy(meta + value_at(meta, size, "general.architecture"), &t, 4);
}

static void d_string_len(uint8_t *b, uint8_t *meta, uint64_t size)
{
	(void)b;
	uint64_t n = UINT64_MAX - 3;
	memcpy(meta + value_at(meta, size, "general.architecture") + 4, &n, 8);
}

static void d_string_unterminated(uint8_t *b, uint8_t *meta, uint64_t size)
{
	(void)b;
	uint64_t o = value_at(meta, size, "general.architecture") + 4, n;
	memcpy(&n, meta + o, 8);
	meta[o + 8 + n] = 'x';
}

static void d_array_count_cap(uint8_t *b, uint8_t *meta, uint64_t size)
{
	(void)b;
	uint64_t n = 1ull << 40;
	memcpy(meta + value_at(meta, size, "tokenizer.ggml.tokens") + 8, &n, 8);
}

static void d_array_count_bytes(uint8_t *b, uint8_t *meta, uint64_t size)
{
	(void)b;
	uint64_t n = 1ull << 24; /* within the cap, past the bytes */
	memcpy(meta + value_at(meta, size, "tokenizer.ggml.tokens") + 8, &n, 8);
}

static void d_array_elem(uint8_t *b, uint8_t *meta, uint64_t size)
{
	(void)b;
	uint32_t t = 99;
	memcpy(meta + value_at(meta, size, "tokenizer.ggml.tokens") + 4, &t, 4);
}

static void d_array_string_len(uint8_t *b, uint8_t *meta, uint64_t size)
{
	(void)b;
	uint64_t n = 1ull << 62; /* the first token's length */
	memcpy(meta + value_at(meta, size, "tokenizer.ggml.tokens") + 16, &n, 8);
}

static void d_files(uint8_t *b, uint8_t *meta, uint64_t size)
{
	(void)b, (void)size;
	uint32_t v = 2;
	memcpy(meta + 8, &v, 4);
}

static void d_meta_offset(uint8_t *b, uint8_t *meta, uint64_t size)
{
	(void)meta, (void)size;
	((struct wf_shm_header *)b)->meta_offset += 4; /* misaligned */
}

static void d_meta_past_data(uint8_t *b, uint8_t *meta, uint64_t size)
{
	(void)meta, (void)size;
	struct wf_shm_header *h = (struct wf_shm_header *)b;
	h->meta_size = h->data_offset - h->meta_offset + 8;
}

static void d_version(uint8_t *b, uint8_t *meta, uint64_t size)
{
	(void)meta, (void)size;
	((struct wf_shm_header *)b)->version = 2;
}

static const struct damage damages[] = {
    {"n_kv overflowing", WF_ELIMIT, d_n_kv},
    {"n_kv one more than stored", WF_ETRUNCATED, d_n_kv_plus},
    {"architecture unterminated", WF_EFORMAT, d_arch_unterminated},
    {"section truncated", WF_ETRUNCATED, d_truncated},
    {"key length", WF_EFORMAT, d_key_len},
    {"NUL inside a key", WF_EFORMAT, d_key_nul},
    {"value type", WF_EFORMAT, d_value_type},
    {"string length", WF_ETRUNCATED, d_string_len},
    {"string unterminated", WF_EFORMAT, d_string_unterminated},
    {"array count over the cap", WF_ELIMIT, d_array_count_cap},
    {"array count past the bytes", WF_ETRUNCATED, d_array_count_bytes},
    {"array element type", WF_EFORMAT, d_array_elem},
    {"array string length", WF_ETRUNCATED, d_array_string_len},
    {"file count", WF_EFORMAT, d_files},
    {"section misaligned", WF_EFORMAT, d_meta_offset},
    {"section into the data area", WF_EFORMAT, d_meta_past_data},
    {"format version 2", WF_EVERSION, d_version},
};

Test(floor_model, damaged_metadata_is_an_error, .init = setup_ref, .fini = teardown_ref)
{
	size_t size;
	uint8_t *b = map_rw(&size);
	struct wf_shm_header *h = (struct wf_shm_header *)b;
	uint64_t meta_size = h->meta_size;
	uint64_t tables_end = h->data_offset;
	uint8_t *saved = malloc(tables_end);
	memcpy(saved, b, tables_end);
	struct wf_diag d = {{0}};
	cr_assert_eq(reader_attach(&d), 0, "%s", wf_diag_str(&d, -1));
	for (size_t i = 0; i < sizeof(damages) / sizeof(damages[0]); i++) {
		damages[i].f(b, b + h->meta_offset, meta_size);
		reseal(b);
		int rc = reader_attach(&d);
		cr_assert_eq(rc, damages[i].want, "%s: %s (%s)", damages[i].name, wf_err_name(rc),
		             wf_diag_str(&d, rc));
		memcpy(b, saved, (size_t)tables_end);
		cr_assert_eq(reader_attach(&d), 0, "restored after %s", damages[i].name);
	}
	free(saved);
	munmap(b, size);
}

/* An agent rebuilds a region of the previous format; a reader only refuses it. */
Test(floor_model, old_format_rebuilt_by_agent, .init = setup_ref, .fini = teardown_ref)
{
	size_t size;
	uint8_t *b = map_rw(&size);
	d_version(b, NULL, 0);
	reseal(b);
	munmap(b, size);
	struct wf_diag d = {{0}};
	int rc = reader_attach(&d);
	cr_assert_eq(rc, WF_EVERSION, "%s", wf_diag_str(&d, rc));
	cr_assert(strstr(wf_diag_str(&d, rc), "version 2, expected 4"), "%s", wf_diag_str(&d, rc));
	struct wf_shm_region *w = NULL;
	rc = wf_shm_region_attach(&cfg, &ref_digest, ref_model, WF_SHM_ATTACH_AGENT, shmt_fill,
	                          NULL, &w, &d);
	cr_assert_eq(rc, 0, "%s", wf_diag_str(&d, rc));
	cr_assert(wf_shm_region_materialized(w));
	cr_assert_not_null(wf_shm_region_rebuild_reason(w));
	wf_shm_region_detach(w);
	cr_assert_eq(reader_attach(&d), 0);
}

/* Random bytes in the section, checksums made right: an error or a model, never a fault. And a
 * section damaged after attach (no reseal) is caught by the rebuild's own decode. */
Test(floor_model, random_metadata_bytes, .init = setup_ref, .fini = teardown_ref)
{
	size_t size;
	uint8_t *b = map_rw(&size);
	struct wf_shm_header *h = (struct wf_shm_header *)b;
	uint64_t mo = h->meta_offset, ms = h->meta_size;
	uint8_t *saved = malloc(ms);
	memcpy(saved, b + mo, ms);
	unsigned seed = 20261124, errors = 0;
	const int trials = 400;
	for (int t = 0; t < trials; t++) {
		int flips = 1 + (int)(rand_r(&seed) % 4);
		for (int k = 0; k < flips; k++) {
			/* bias towards the fixed part and the first records, where counts are */
			uint64_t span = (rand_r(&seed) & 1) ? (ms < 4096 ? ms : 4096) : ms;
			b[mo + rand_r(&seed) % span] ^= (uint8_t)(1u << (rand_r(&seed) % 8));
		}
		reseal(b);
		struct wf_diag d = {{0}};
		errors += reader_attach(&d) != 0;
		memcpy(b + mo, saved, ms);
	}
	reseal(b);
	cr_log_info("random metadata damage: %u of %d trials refused", errors, trials);
	cr_assert_gt(errors, 0);

	struct wf_shm_region *r = NULL;
	cr_assert_eq(wf_shm_region_attach(&cfg, &ref_digest, NULL, WF_SHM_ATTACH_READER, NULL, NULL,
	                                  &r, NULL),
	             0);
	uint32_t big = UINT32_MAX;
	memcpy(b + mo + 12, &big, 4); /* after attach: the rebuild must still refuse it */
	struct wf_model *m = NULL;
	struct wf_diag d = {{0}};
	cr_assert_eq(wf_shm_region_model(r, &m, &d), WF_ELIMIT, "%s", wf_diag_str(&d, -1));
	cr_assert_null(m);
	memcpy(b + mo, saved, ms);
	wf_shm_region_detach(r);
	free(saved);
	munmap(b, size);
}
