/* The llama.cpp reference models (tests/data/reference/): every folder's inventory must match its
 * manifest.json exactly, offsets must agree with an independent minimal GGUF walk in this file,
 * and the split model must be the single-file model byte for byte, tensor by tensor. */
#include "base/error.h"
#include "common/wftest.h"
#include "model/model.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

TestSuite(reference, .timeout = 120);

static const char *refdir(void)
{
	const char *r = wft_reference_dir();
	cr_assert_not_null(r, "tests/data/reference/ is missing from the repository: "
	                      "the reference test cannot pass without it");
	return r;
}

static char *join(const char *a, const char *b)
{
	char *p = NULL;
	cr_assert(asprintf(&p, "%s/%s", a, b) > 0);
	return p;
}

static const char *base_name(const char *p)
{
	const char *s = strrchr(p, '/');
	return s ? s + 1 : p;
}

static json_object *get(json_object *o, const char *key)
{
	json_object *v = NULL;
	cr_assert(json_object_object_get_ex(o, key, &v), "manifest lacks '%s'", key);
	return v;
}

static struct wf_model *open_model(const char *folder, json_object **ret_manifest)
{
	char *mpath = join(folder, "manifest.json");
	json_object *man = json_object_from_file(mpath);
	cr_assert_not_null(man, "cannot parse %s", mpath);
	char *path = join(folder, json_object_get_string(get(man, "load_this_file")));
	struct wf_model *m = NULL;
	struct wf_diag d = {{0}};
	int rc = wf_model_open(path, &m, &d);
	cr_assert_eq(rc, 0, "%s: %s: %s", path, wf_err_name(rc), wf_diag_str(&d, rc));
	free(path);
	free(mpath);
	*ret_manifest = man;
	return m;
}

/* ---- an independent, minimal GGUF walk: names and data offsets only ---- */

struct mini {
	const uint8_t *p;
	size_t n, pos;
};

static uint64_t mu64(struct mini *r)
{
	cr_assert(r->pos + 8 <= r->n);
	uint64_t v;
	memcpy(&v, r->p + r->pos, 8);
	r->pos += 8;
	return v;
}

static uint32_t mu32(struct mini *r)
{
	cr_assert(r->pos + 4 <= r->n);
	uint32_t v;
	memcpy(&v, r->p + r->pos, 4);
	r->pos += 4;
	return v;
}

static void mskip_value(struct mini *r, uint32_t type)
{
	static const size_t sz[13] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
	cr_assert(type < 13);
	if (type == 8) {
		r->pos += mu64(r);
	} else if (type == 9) {
		uint32_t et = mu32(r);
		uint64_t n = mu64(r);
		for (uint64_t i = 0; i < n; i++)
			mskip_value(r, et);
	} else {
		r->pos += sz[type];
	}
	cr_assert(r->pos <= r->n);
}

/* Checks every tensor's absolute offset against the file, walked without the library. */
static void check_offsets_independently(const struct wf_model *m, uint32_t f)
{
	size_t len;
	char *data = wft_read_file(m->files[f].path, &len);
	cr_assert_not_null(data);
	cr_assert_eq(len, m->files[f].size);
	struct mini r = {(const uint8_t *)data, len, 0};
	cr_assert_eq(memcmp(data, "GGUF", 4), 0);
	r.pos = 4;
	cr_assert_eq(mu32(&r), m->files[f].gguf_version);
	uint64_t nt = mu64(&r), nkv = mu64(&r);
	cr_assert_eq(nt, m->files[f].n_tensors);
	uint32_t align = 32;
	for (uint64_t i = 0; i < nkv; i++) {
		uint64_t kl = mu64(&r);
		bool is_align = kl == 17 && memcmp(r.p + r.pos, "general.alignment", 17) == 0;
		r.pos += kl;
		uint32_t type = mu32(&r);
		if (is_align) {
			cr_assert_eq(type, 4);
			align = mu32(&r);
		} else {
			mskip_value(&r, type);
		}
	}
	cr_assert_eq(m->files[f].alignment, align);
	char **names = calloc(nt, sizeof(*names));
	uint64_t *rel = calloc(nt, sizeof(*rel));
	for (uint64_t i = 0; i < nt; i++) {
		uint64_t nl = mu64(&r);
		names[i] = strndup((const char *)r.p + r.pos, nl);
		r.pos += nl;
		uint32_t nd = mu32(&r);
		r.pos += 8 * nd;
		mu32(&r);
		rel[i] = mu64(&r);
	}
	uint64_t data_off = (r.pos + align - 1) / align * align;
	cr_assert_eq(m->files[f].data_offset, data_off);
	for (uint64_t i = 0; i < nt; i++) {
		const struct wf_tensor *t = wf_model_find_tensor(m, names[i]);
		cr_assert_not_null(t, "%s", names[i]);
		cr_assert_eq(t->file, f);
		cr_assert_eq(t->offset, data_off + rel[i], "%s: %llu vs %llu", names[i],
		             (unsigned long long)t->offset,
		             (unsigned long long)(data_off + rel[i]));
		free(names[i]);
	}
	free(names);
	free(rel);
	free(data);
}

/* Offsets in each file: aligned and contiguous with padding, as llama.cpp writes them, and the
 * file ends within one alignment unit of the last tensor. */
static void check_layout(const struct wf_model *m)
{
	for (uint32_t i = 0; i < m->n_tensors; i++) {
		const struct wf_tensor *t = &m->tensors[i];
		const struct wf_model_file *f = &m->files[t->file];
		cr_assert_eq(t->offset % f->alignment, 0, "%s", t->name);
		uint64_t expect = f->data_offset;
		if (i > 0 && m->tensors[i - 1].file == t->file) {
			const struct wf_tensor *p = &m->tensors[i - 1];
			expect = (p->offset + p->nbytes + f->alignment - 1) / f->alignment *
			         f->alignment;
		}
		cr_assert_eq(t->offset, expect, "%s is not where llama.cpp would put it", t->name);
		if (i + 1 == m->n_tensors || m->tensors[i + 1].file != t->file) {
			uint64_t end = t->offset + t->nbytes;
			cr_assert(end <= f->size && f->size - end < f->alignment,
			          "%s: end %llu size %llu", f->path, (unsigned long long)end,
			          (unsigned long long)f->size);
			cr_assert_eq(f->data_size, f->size - f->data_offset);
		}
	}
}

static void check_kv(const struct wf_model *m, json_object *man)
{
	json_object *kv = get(man, "gguf_kv");
	uint32_t n_checked = 0;
	json_object_object_foreach(kv, key, val)
	{
		if (strncmp(key, "GGUF.", 5) == 0) {
			int64_t want = json_object_get_int64(val);
			if (strcmp(key, "GGUF.version") == 0)
				cr_assert_eq(m->files[0].gguf_version, want);
			else if (strcmp(key, "GGUF.tensor_count") == 0)
				cr_assert_eq(m->files[0].n_tensors, want);
			else if (strcmp(key, "GGUF.kv_count") == 0)
				cr_assert_eq(m->kv.n, want);
			else
				cr_assert_fail("unknown pseudo-key %s", key);
			continue;
		}
		const struct wf_kv *e = wf_kv_find(&m->kv, key);
		cr_assert_not_null(e, "key %s missing", key);
		n_checked++;
		switch (json_object_get_type(val)) {
		case json_type_boolean: {
			bool b;
			cr_assert_eq(wf_kv_get_bool(&m->kv, key, &b), 0, "%s", key);
			cr_assert_eq(b, json_object_get_boolean(val), "%s", key);
			break;
		}
		case json_type_int: {
			int64_t i;
			cr_assert_eq(wf_kv_get_i64(&m->kv, key, &i), 0, "%s", key);
			cr_assert_eq(i, json_object_get_int64(val), "%s", key);
			break;
		}
		case json_type_double: {
			double d;
			cr_assert_eq(wf_kv_get_f64(&m->kv, key, &d), 0, "%s", key);
			/* The manifest prints the f32 widened to double, shortest round trip. */
			cr_assert_eq(d, json_object_get_double(val), "%s: %.17g vs %.17g", key, d,
			             json_object_get_double(val));
			break;
		}
		case json_type_string: {
			const char *s = json_object_get_string(val);
			unsigned long long n;
			if (sscanf(s, "<array of %llu>", &n) == 1) {
				const struct wf_kv_array *a;
				cr_assert_eq(wf_kv_get_array(&m->kv, key, &a), 0, "%s", key);
				cr_assert_eq(a->n, n, "%s", key);
			} else {
				const char *got;
				cr_assert_eq(wf_kv_get_str(&m->kv, key, &got), 0, "%s", key);
				cr_assert_str_eq(got, s, "%s", key);
			}
			break;
		}
		default:
			cr_assert_fail("unexpected manifest value for %s", key);
		}
	}
	/* Together with kv_count this makes the key sets equal. */
	cr_assert_eq(n_checked, m->kv.n);
}

static void check_tensors(const struct wf_model *m, json_object *man)
{
	json_object *files = get(man, "model_files");
	cr_assert_eq(m->n_files, json_object_array_length(files));
	for (uint32_t f = 0; f < m->n_files; f++) {
		json_object *jf = json_object_array_get_idx(files, f);
		cr_assert_str_eq(base_name(m->files[f].path),
		                 json_object_get_string(get(jf, "file")));
		cr_assert_eq((int64_t)m->files[f].size, json_object_get_int64(get(jf, "bytes")));
		cr_assert_eq(m->files[f].n_tensors, json_object_get_int64(get(jf, "n_tensors")));
		cr_assert_eq(m->files[f].gguf_version, 3);
		cr_assert_eq(m->files[f].alignment, 32);
	}

	json_object *ts = get(man, "tensors");
	size_t n = json_object_array_length(ts);
	cr_assert_eq(m->n_tensors, n);
	uint32_t experts = 0;
	for (size_t i = 0; i < n; i++) {
		json_object *jt = json_object_array_get_idx(ts, i);
		const char *name = json_object_get_string(get(jt, "name"));
		const struct wf_tensor *t = wf_model_find_tensor(m, name);
		cr_assert_not_null(t, "tensor %s missing", name);
		/* The manifest lists tensors in file order, as does the model. */
		cr_assert_eq(t, &m->tensors[i], "%s is at %td, manifest says %zu", name,
		             t - m->tensors, i);
		cr_assert_str_eq(wf_dtype_info(t->dtype)->name,
		                 json_object_get_string(get(jt, "type")), "%s", name);
		json_object *ne = get(jt, "ne");
		cr_assert_eq(t->n_dims, json_object_array_length(ne), "%s", name);
		for (uint32_t d = 0; d < t->n_dims; d++)
			cr_assert_eq(t->ne[d],
			             json_object_get_int64(json_object_array_get_idx(ne, d)),
			             "%s ne[%u]", name, d);
		cr_assert_str_eq(base_name(m->files[t->file].path),
		                 json_object_get_string(get(jt, "file")), "%s", name);
		bool exps = strstr(name, "_exps.") != NULL;
		cr_assert_eq(t->tclass, exps ? WF_TENSOR_EXPERT : WF_TENSOR_DENSE, "%s", name);
		experts += exps;
	}
	cr_assert_eq(experts, 3 * m->hp.n_layer);

	json_object *counts = get(man, "tensor_type_counts");
	uint32_t total = 0;
	json_object_object_foreach(counts, tname, cnt)
	{
		enum wf_dtype d;
		cr_assert_eq(wf_dtype_from_name(tname, &d), 0, "%s", tname);
		cr_assert_eq(m->count_by_dtype[d], json_object_get_int64(cnt), "%s", tname);
		total += (uint32_t)json_object_get_int64(cnt);
	}
	cr_assert_eq(total, m->n_tensors);
	uint64_t sum = 0;
	for (uint32_t i = 0; i < m->n_tensors; i++)
		sum += m->tensors[i].nbytes;
	cr_assert_eq(m->total_bytes, sum);
	cr_assert_eq(m->dense_bytes + m->expert_bytes, sum);
}

static void check_hparams(const struct wf_model *m, json_object *man)
{
	json_object *hp = get(man, "hparams");
	cr_assert_str_eq(m->hp.arch, json_object_get_string(get(hp, "arch")));
	cr_assert_str_eq(m->hp.arch, json_object_get_string(get(man, "arch")));
	cr_assert_eq((int64_t)m->hp.n_vocab, json_object_get_int64(get(hp, "n_vocab")));
	cr_assert_eq((int64_t)m->hp.n_ctx_train, json_object_get_int64(get(hp, "n_ctx")));
	cr_assert_eq((int64_t)m->hp.n_embd, json_object_get_int64(get(hp, "n_embd")));
	cr_assert_eq((int64_t)m->hp.n_layer, json_object_get_int64(get(hp, "n_layer")));
	cr_assert_eq((int64_t)m->hp.n_head, json_object_get_int64(get(hp, "n_head")));
	cr_assert_eq((int64_t)m->hp.n_head_kv, json_object_get_int64(get(hp, "n_head_kv")));
	cr_assert_eq((int64_t)m->hp.head_dim, json_object_get_int64(get(hp, "head_dim")));
	cr_assert_eq((int64_t)m->hp.n_ff, json_object_get_int64(get(hp, "n_ff")));
	cr_assert_eq((int64_t)m->hp.n_ff_exp, json_object_get_int64(get(hp, "n_ff_exp")));
	cr_assert_eq((int64_t)m->hp.n_expert, json_object_get_int64(get(hp, "n_expert")));
	cr_assert_eq((int64_t)m->hp.n_expert_used, json_object_get_int64(get(hp, "n_expert_used")));
	double base = json_object_get_double(get(hp, "rope_base"));
	double eps = json_object_get_double(get(hp, "rms_eps"));
	cr_assert_eq(m->hp.rope_freq_base, (float)base);
	cr_assert_eq(m->hp.rms_eps, (float)eps);
}

Test(reference, every_folder_matches_its_manifest)
{
	const char *ref = refdir();
	DIR *d = opendir(ref);
	cr_assert_not_null(d);
	struct dirent *de;
	int folders = 0;
	while ((de = readdir(d))) {
		if (de->d_name[0] == '.')
			continue;
		char *folder = join(ref, de->d_name);
		char *mpath = join(folder, "manifest.json");
		struct stat st;
		bool has = stat(mpath, &st) == 0;
		free(mpath);
		if (!has) {
			free(folder);
			continue;
		}
		json_object *man;
		struct wf_model *m = open_model(folder, &man);
		cr_assert_eq(m->format, WF_MODEL_FORMAT_GGUF);
		check_hparams(m, man);
		check_kv(m, man);
		check_tensors(m, man);
		check_layout(m);
		for (uint32_t f = 0; f < m->n_files; f++)
			check_offsets_independently(m, f);
		wf_model_close(m);
		json_object_put(man);
		free(folder);
		folders++;
	}
	closedir(d);
	cr_assert_geq(folders, 5, "only %d reference folders", folders);
}

Test(reference, real_hparams)
{
	const char *ref = refdir();
	char *folder = join(ref, "mixtral-tiny-f32");
	json_object *man;
	struct wf_model *m = open_model(folder, &man);
	cr_assert_str_eq(m->hp.arch, "llama");
	cr_assert_eq(m->hp.n_layer, 2);
	cr_assert_eq(m->hp.n_embd, 64);
	cr_assert_eq(m->hp.n_expert, 8);
	cr_assert_eq(m->hp.n_expert_used, 2);
	cr_assert_eq(m->hp.n_ff, 96);
	cr_assert_eq(m->hp.n_ff_exp, 96); /* no expert_feed_forward_length: falls back */
	cr_assert_eq(m->hp.n_head, 4);
	cr_assert_eq(m->hp.n_head_kv, 2);
	cr_assert_eq(m->hp.head_dim, 16); /* no key_length: n_embd / n_head */
	cr_assert_eq(m->hp.n_vocab, 512);
	cr_assert_eq(m->hp.n_ctx_train, 256);
	cr_assert_eq(m->hp.rope_dim, 16);
	cr_assert_float_eq(m->hp.rope_freq_base, 1e4f, 1e-3);
	cr_assert_float_eq(m->hp.rms_eps, 1e-5f, 1e-12);
	cr_assert_eq(m->n_tensors, 23);
	cr_assert_eq(m->count_by_dtype[WF_DTYPE_F32], 23);
	/* 2 layers x 3 expert tensors of 64*96*8 floats */
	cr_assert_eq(m->expert_bytes, 2ull * 3 * 64 * 96 * 8 * 4);
	wf_model_close(m);
	json_object_put(man);
	free(folder);

	folder = join(ref, "qwen3moe-tiny-q4_k_m");
	m = open_model(folder, &man);
	cr_assert_str_eq(m->hp.arch, "qwen3moe");
	cr_assert_eq(m->hp.n_layer, 3);
	cr_assert_eq(m->hp.n_embd, 256);
	cr_assert_eq(m->hp.n_head, 8);
	cr_assert_eq(m->hp.n_head_kv, 4);
	cr_assert_eq(m->hp.head_dim, 32);
	cr_assert_eq(m->hp.n_ff, 768);
	cr_assert_eq(m->hp.n_ff_exp, 256);
	cr_assert_eq(m->hp.n_expert, 16);
	cr_assert_eq(m->hp.n_expert_used, 4);
	cr_assert_eq(m->hp.n_vocab, 1024);
	cr_assert_float_eq(m->hp.rope_freq_base, 1e6f, 1e-1);
	cr_assert_float_eq(m->hp.rms_eps, 1e-6f, 1e-13);
	cr_assert_eq(m->count_by_dtype[WF_DTYPE_Q4_K], 20);
	cr_assert_eq(m->count_by_dtype[WF_DTYPE_Q6_K], 3);
	cr_assert_eq(m->count_by_dtype[WF_DTYPE_F32], 16);
	const struct wf_tensor *t = wf_model_find_tensor(m, "blk.2.ffn_down_exps.weight");
	cr_assert_eq(t->dtype, WF_DTYPE_Q6_K);
	cr_assert_eq(t->nbytes, 256ull * 16 * 210);
	wf_model_close(m);
	json_object_put(man);
	free(folder);
}

static uint64_t hash_range(const char *path, uint64_t off, uint64_t n)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	cr_assert_geq(fd, 0);
	uint8_t *buf = malloc(n ? n : 1);
	cr_assert_eq(pread(fd, buf, n, (off_t)off), (ssize_t)n);
	close(fd);
	uint64_t h = XXH3_64bits(buf, n);
	free(buf);
	return h;
}

Test(reference, split_equals_single)
{
	const char *ref = refdir();
	char *f1 = join(ref, "qwen3moe-tiny-q4_k_m"), *f2 = join(ref, "qwen3moe-tiny-q4_k_m-split");
	json_object *m1j, *m2j;
	struct wf_model *one = open_model(f1, &m1j), *split = open_model(f2, &m2j);
	cr_assert_eq(one->n_files, 1);
	cr_assert_eq(split->n_files, 2);
	cr_assert_eq(split->files[0].n_tensors, 20);
	cr_assert_eq(split->files[1].n_tensors, 19);
	cr_assert_eq(split->n_tensors, one->n_tensors);
	cr_assert_eq(memcmp(&split->hp, &one->hp, sizeof(one->hp)), 0, "hparams differ");
	cr_assert_eq(split->total_bytes, one->total_bytes);
	cr_assert_eq(split->expert_bytes, one->expert_bytes);
	for (uint32_t i = 0; i < one->n_tensors; i++) {
		const struct wf_tensor *a = &one->tensors[i];
		const struct wf_tensor *b = wf_model_find_tensor(split, a->name);
		cr_assert_not_null(b, "%s missing from the split model", a->name);
		cr_assert_eq(a->dtype, b->dtype, "%s", a->name);
		cr_assert_eq(a->n_dims, b->n_dims, "%s", a->name);
		cr_assert_eq(memcmp(a->ne, b->ne, sizeof(a->ne)), 0, "%s", a->name);
		cr_assert_eq(a->nbytes, b->nbytes, "%s", a->name);
		/* The same bytes at both offsets: the offsets are right. */
		cr_assert_eq(hash_range(one->files[0].path, a->offset, a->nbytes),
		             hash_range(split->files[b->file].path, b->offset, b->nbytes),
		             "%s: bytes differ", a->name);
	}
	/* Opening the second shard gives the same model. */
	char *second = join(f2, "qwen3moe-tiny-q4_k_m-00002-of-00002.gguf");
	struct wf_model *again = NULL;
	cr_assert_eq(wf_model_open(second, &again, NULL), 0);
	struct wf_digest d1, d2;
	wf_model_digest(split, &d1);
	wf_model_digest(again, &d2);
	cr_assert(d1.hi == d2.hi && d1.lo == d2.lo);
	cr_assert_eq(again->kv.n, split->kv.n);
	wf_model_close(again);
	free(second);

	wf_model_close(one);
	wf_model_close(split);
	json_object_put(m1j);
	json_object_put(m2j);
	free(f1);
	free(f2);
}
