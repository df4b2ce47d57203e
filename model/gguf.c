/* GGUF reader: headers only, through a small buffered cursor over pread.
 *
 * GGUF v2/v3 layout (little-endian; v3 only adds the possibility of big-endian files, which we
 * reject; v1 used u32 counts and is rejected):
 *
 *   u32 magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
 *   n_kv x      { str key | u32 type | value }
 *   n_tensors x { str name | u32 n_dims | i64 ne[n_dims] | u32 ggml type | u64 offset }
 *   padding to general.alignment (u32, default 32) | tensor data
 *
 * where str = u64 length + bytes (no NUL), bool = one byte 0 or 1, and an array value = u32
 * element type | u64 n | n values (arrays of arrays nest up to WF_MODEL_MAX_KV_DEPTH; llama.cpp
 * itself refuses them). Keys and tensor names must be non-empty and free of NULs. Tensor offsets
 * are relative to the data section and multiples of the alignment; the data section starts at the
 * end of the header rounded up to the alignment.
 *
 * Nothing here trusts a count: every count is capped (WF_MODEL_MAX_*), every claimed size is first
 * compared with the bytes the file still has (so a 100-byte file claiming 10^9 entries fails at
 * once with WF_ETRUNCATED or WF_ELIMIT), and vectors grow geometrically as entries are actually
 * read, so memory stays proportional to bytes read. */
#include "model/model_internal.h"

#include "base/error.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the GGUF reader assumes a LE host");

#define GGUF_DEFAULT_ALIGNMENT 32u
#define GGUF_MAX_DIMS          4u
#define CURSOR_BUF             (64u * 1024u)
/* Smallest encodings, for the "can the rest of the file hold this many?" checks. */
#define MIN_KV_BYTES    14u /* u64 key length, 1-byte key, u32 type, 1-byte value */
#define MIN_TINFO_BYTES 25u /* u64 name length, 1-byte name, u32 n_dims, u32 type, u64 offset */
#define MIN_STR_BYTES   8u  /* an empty string */
#define MIN_ARRAY_BYTES 12u /* u32 element type, u64 n = 0 */

typedef unsigned long long ull;

struct cursor {
	int fd;
	const char *path;
	uint64_t size; /* st_size at open */
	uint64_t pos;  /* next byte to read */
	uint64_t buf_off;
	size_t buf_len;
	uint8_t *buf;
	struct wf_diag *diag;
	char what[160]; /* what is being read, for messages */
};

/* One parsed file; tensors carry offsets relative to the data section until the model is put
 * together. */
struct gguf_file {
	char *path;
	struct wf_model_file id; /* real_path, dev, ino of the file opened */
	uint64_t size;
	int64_t mtime_ns;
	uint32_t version;
	uint32_t alignment;
	uint64_t data_offset;
	struct wf_kv_set kv;
	uint32_t n_tensors;
	struct wf_tensor *tensors;
};

static void what(struct cursor *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void what(struct cursor *c, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(c->what, sizeof(c->what), fmt, ap);
	va_end(ap);
}

/* Fails unless n more bytes exist in the file and within the header limit. */
static int cur_need(struct cursor *c, uint64_t n)
{
	uint64_t end;
	if (__builtin_add_overflow(c->pos, n, &end) || end > c->size)
		return wf_diag_set(
		    c->diag, WF_ETRUNCATED,
		    "'%s': truncated: %s needs %llu bytes at offset %llu, the file ends "
		    "at %llu",
		    c->path, c->what, (ull)n, (ull)c->pos, (ull)c->size);
	if (end > WF_MODEL_MAX_HEADER)
		return wf_diag_set(c->diag, WF_ELIMIT,
		                   "'%s': %s at offset %llu runs past the %llu-byte header limit",
		                   c->path, c->what, (ull)c->pos, (ull)WF_MODEL_MAX_HEADER);
	return 0;
}

static int cur_fill(struct cursor *c)
{
	uint64_t want = c->size - c->pos;
	if (want > CURSOR_BUF)
		want = CURSOR_BUF;
	ssize_t r;
	do
		r = pread(c->fd, c->buf, want, (off_t)c->pos);
	while (r < 0 && errno == EINTR);
	if (r < 0)
		return wf_diag_set(c->diag, -errno, "'%s': read at offset %llu: %s", c->path,
		                   (ull)c->pos, strerror(errno));
	if (r == 0)
		return wf_diag_set(
		    c->diag, WF_ECHANGED,
		    "'%s': file ends at %llu while reading %s; it was %llu bytes at open", c->path,
		    (ull)c->pos, c->what, (ull)c->size);
	c->buf_off = c->pos;
	c->buf_len = (size_t)r;
	return 0;
}

static int cur_read(struct cursor *c, void *dst, uint64_t n)
{
	int rc = cur_need(c, n);
	if (rc)
		return rc;
	uint8_t *out = dst;
	while (n > 0) {
		if (c->pos < c->buf_off || c->pos >= c->buf_off + c->buf_len) {
			rc = cur_fill(c);
			if (rc)
				return rc;
		}
		size_t off = (size_t)(c->pos - c->buf_off);
		size_t k = c->buf_len - off;
		if (k > n)
			k = (size_t)n;
		memcpy(out, c->buf + off, k);
		out += k;
		c->pos += k;
		n -= k;
	}
	return 0;
}

static int rd_u32(struct cursor *c, uint32_t *v)
{
	return cur_read(c, v, sizeof(*v));
}

static int rd_u64(struct cursor *c, uint64_t *v)
{
	return cur_read(c, v, sizeof(*v));
}

/* Grows *vec (elem bytes each) so that it holds at least need elements, doubling up to max: the
 * capacity never runs far ahead of what was read. */
static int grow(void **vec, uint64_t *cap, uint64_t need, uint64_t max, size_t elem)
{
	if (need <= *cap)
		return 0;
	uint64_t n = *cap ? *cap * 2 : 16;
	if (n < need)
		n = need;
	if (n > max)
		n = max;
	void *p = realloc(*vec, (size_t)n * elem);
	if (!p)
		return -ENOMEM;
	*vec = p;
	*cap = n;
	return 0;
}

/* A GGUF string: a length, then that many bytes. Names (keys, tensor names) must be non-empty and
 * free of NULs, since they are looked up as C strings; values may hold anything. */
static int rd_str(struct cursor *c, uint64_t max, bool name, struct wf_kv_str *out)
{
	uint64_t n;
	int rc = rd_u64(c, &n);
	if (rc)
		return rc;
	if (n > max)
		return wf_diag_set(
		    c->diag, WF_ELIMIT,
		    "'%s': %s at offset %llu is a string of %llu bytes, the limit is %llu", c->path,
		    c->what, (ull)(c->pos - 8), (ull)n, (ull)max);
	if (name && n == 0)
		return wf_diag_set(c->diag, WF_EFORMAT, "'%s': %s at offset %llu is empty", c->path,
		                   c->what, (ull)(c->pos - 8));
	rc = cur_need(c, n);
	if (rc)
		return rc;
	char *s = malloc((size_t)n + 1);
	if (!s)
		return -ENOMEM;
	rc = cur_read(c, s, n);
	if (rc) {
		free(s);
		return rc;
	}
	s[n] = '\0';
	if (name && memchr(s, '\0', (size_t)n)) {
		free(s);
		return wf_diag_set(c->diag, WF_EFORMAT,
		                   "'%s': %s at offset %llu contains a NUL byte", c->path, c->what,
		                   (ull)(c->pos - n));
	}
	out->s = s;
	out->n = n;
	return 0;
}

static int check_bools(struct cursor *c, const uint8_t *b, uint64_t n, uint64_t at)
{
	for (uint64_t i = 0; i < n; i++)
		if (b[i] > 1)
			return wf_diag_set(c->diag, WF_EFORMAT,
			                   "'%s': %s: bool at offset %llu is %u, not 0 or 1",
			                   c->path, c->what, (ull)(at + i), b[i]);
	return 0;
}

static int rd_scalar(struct cursor *c, enum wf_kv_type t, struct wf_kv_value *v)
{
	union {
		uint8_t u8;
		int8_t i8;
		uint16_t u16;
		int16_t i16;
		uint32_t u32;
		int32_t i32;
		uint64_t u64;
		int64_t i64;
		float f32;
		double f64;
	} x;
	uint64_t at = c->pos;
	int rc = cur_read(c, &x, wf_kv_type_size(t));
	if (rc)
		return rc;
	v->type = t;
	switch (t) {
	case WF_KV_U8:
		v->u.u64 = x.u8;
		break;
	case WF_KV_I8:
		v->u.i64 = x.i8;
		break;
	case WF_KV_U16:
		v->u.u64 = x.u16;
		break;
	case WF_KV_I16:
		v->u.i64 = x.i16;
		break;
	case WF_KV_U32:
		v->u.u64 = x.u32;
		break;
	case WF_KV_I32:
		v->u.i64 = x.i32;
		break;
	case WF_KV_U64:
		v->u.u64 = x.u64;
		break;
	case WF_KV_I64:
		v->u.i64 = x.i64;
		break;
	case WF_KV_F32:
		v->u.f64 = x.f32;
		break;
	case WF_KV_F64:
		v->u.f64 = x.f64;
		break;
	case WF_KV_BOOL:
		rc = check_bools(c, &x.u8, 1, at);
		if (rc)
			return rc;
		v->u.u64 = x.u8;
		break;
	default:
		return WF_EINTERNAL;
	}
	return 0;
}

/* Reads an array body into a (zeroed by the caller). On failure a->n counts the elements that are
 * complete (or allocated and zeroed, for nested arrays), so wf_kv_array_fini() frees exactly
 * what exists. depth is this array's nesting level, 1 for a top-level array value. */
static int rd_array(struct cursor *c, struct wf_kv_array *a, unsigned depth)
{
	uint32_t et;
	uint64_t n;
	int rc = rd_u32(c, &et);
	if (rc)
		return rc;
	if (et >= WF_KV_TYPE_MAX_)
		return wf_diag_set(c->diag, WF_EFORMAT,
		                   "'%s': %s: invalid array element type %u at offset %llu",
		                   c->path, c->what, et, (ull)(c->pos - 4));
	rc = rd_u64(c, &n);
	if (rc)
		return rc;
	if (n > WF_MODEL_MAX_ARRAY)
		return wf_diag_set(
		    c->diag, WF_ELIMIT,
		    "'%s': %s: array of %llu elements at offset %llu, the limit is %llu", c->path,
		    c->what, (ull)n, (ull)(c->pos - 8), (ull)WF_MODEL_MAX_ARRAY);
	a->elem = (enum wf_kv_type)et;
	a->n = 0;

	if (et == WF_KV_ARRAY) {
		if (n > 0 && depth >= WF_MODEL_MAX_KV_DEPTH)
			return wf_diag_set(c->diag, WF_ELIMIT,
			                   "'%s': %s: arrays nested deeper than %u at offset %llu",
			                   c->path, c->what, WF_MODEL_MAX_KV_DEPTH, (ull)c->pos);
		rc = cur_need(c, n * MIN_ARRAY_BYTES);
		if (rc)
			return rc;
		uint64_t cap = 0;
		for (uint64_t i = 0; i < n; i++) {
			rc = grow((void **)&a->u.arrays, &cap, i + 1, n, sizeof(*a->u.arrays));
			if (rc)
				return rc;
			memset(&a->u.arrays[i], 0, sizeof(a->u.arrays[i]));
			a->n = i + 1;
			rc = rd_array(c, &a->u.arrays[i], depth + 1);
			if (rc)
				return rc;
		}
	} else if (et == WF_KV_STRING) {
		rc = cur_need(c, n * MIN_STR_BYTES);
		if (rc)
			return rc;
		uint64_t cap = 0;
		for (uint64_t i = 0; i < n; i++) {
			rc = grow((void **)&a->u.strs, &cap, i + 1, n, sizeof(*a->u.strs));
			if (rc)
				return rc;
			rc = rd_str(c, WF_MODEL_MAX_HEADER, false, &a->u.strs[i]);
			if (rc)
				return rc;
			a->n = i + 1;
		}
	} else {
		/* The bytes are in the file (cur_need), so one allocation of their size is bounded
		 * by what is read. */
		uint64_t bytes = n * wf_kv_type_size(a->elem);
		rc = cur_need(c, bytes);
		if (rc || n == 0)
			return rc;
		a->u.scalars = malloc((size_t)bytes);
		if (!a->u.scalars)
			return -ENOMEM;
		uint64_t at = c->pos;
		rc = cur_read(c, a->u.scalars, bytes);
		if (!rc && a->elem == WF_KV_BOOL)
			rc = check_bools(c, a->u.scalars, n, at);
		if (rc) {
			free(a->u.scalars);
			a->u.scalars = NULL;
			return rc;
		}
		a->n = n;
	}
	return 0;
}

static int rd_value(struct cursor *c, uint32_t type, struct wf_kv_value *v)
{
	if (type >= WF_KV_TYPE_MAX_)
		return wf_diag_set(c->diag, WF_EFORMAT,
		                   "'%s': %s: invalid value type %u at offset %llu", c->path,
		                   c->what, type, (ull)(c->pos - 4));
	if (type == WF_KV_STRING) {
		v->type = WF_KV_STRING;
		return rd_str(c, WF_MODEL_MAX_HEADER, false, &v->u.str);
	}
	if (type == WF_KV_ARRAY) {
		v->type = WF_KV_ARRAY;
		return rd_array(c, &v->u.arr, 1);
	}
	return rd_scalar(c, (enum wf_kv_type)type, v);
}

static int cmp_kv_ptr(const void *a, const void *b)
{
	const struct wf_kv *x = *(const struct wf_kv *const *)a,
	                   *y = *(const struct wf_kv *const *)b;
	return strcmp(x->key, y->key);
}

/* O(n log n) so that 65536 keys cost nothing. */
static int check_duplicate_keys(struct cursor *c, const struct wf_kv_set *set)
{
	if (set->n < 2)
		return 0;
	const struct wf_kv **idx = malloc(set->n * sizeof(*idx));
	if (!idx)
		return -ENOMEM;
	for (uint32_t i = 0; i < set->n; i++)
		idx[i] = &set->items[i];
	qsort(idx, set->n, sizeof(*idx), cmp_kv_ptr);
	int rc = 0;
	for (uint32_t i = 1; i < set->n; i++) {
		if (strcmp(idx[i - 1]->key, idx[i]->key) == 0) {
			rc = wf_diag_set(c->diag, WF_EDUPLICATE,
			                 "'%s': duplicate metadata key '%s'", c->path, idx[i]->key);
			break;
		}
	}
	free(idx);
	return rc;
}

static int rd_kvs(struct cursor *c, uint64_t n_kv, struct wf_kv_set *set)
{
	uint64_t cap = 0;
	for (uint64_t i = 0; i < n_kv; i++) {
		int rc = grow((void **)&set->items, &cap, i + 1, n_kv, sizeof(*set->items));
		if (rc)
			return rc;
		struct wf_kv kv = {0};
		struct wf_kv_str key = {0};
		uint32_t type;

		what(c, "metadata key %llu", (ull)i);
		rc = rd_str(c, WF_MODEL_MAX_NAME, true, &key);
		if (rc)
			return rc;
		kv.key = key.s;
		what(c, "metadata key '%.100s'", kv.key);
		rc = rd_u32(c, &type);
		if (!rc)
			rc = rd_value(c, type, &kv.v);
		if (rc) {
			free(kv.key);
			wf_kv_value_fini(&kv.v);
			return rc;
		}
		set->items[set->n++] = kv;
	}
	return check_duplicate_keys(c, set);
}

static int rd_tensor_info(struct cursor *c, uint64_t i, uint32_t alignment, struct wf_tensor *t)
{
	struct wf_kv_str name = {0};
	uint32_t n_dims, type;
	uint64_t offset;

	what(c, "name of tensor %llu", (ull)i);
	int rc = rd_str(c, WF_MODEL_MAX_NAME, true, &name);
	if (rc)
		return rc;
	t->name = name.s;
	what(c, "info of tensor '%.100s'", t->name);
	rc = rd_u32(c, &n_dims);
	if (rc)
		return rc;
	if (n_dims > GGUF_MAX_DIMS)
		return wf_diag_set(c->diag, WF_EFORMAT,
		                   "'%s': tensor '%s' has %u dimensions, GGUF allows at most %u",
		                   c->path, t->name, n_dims, GGUF_MAX_DIMS);
	t->n_dims = n_dims;
	for (uint32_t d = 0; d < WF_MODEL_MAX_DIMS; d++)
		t->ne[d] = 1;
	for (uint32_t d = 0; d < n_dims; d++) {
		rc = cur_read(c, &t->ne[d], sizeof(t->ne[d]));
		if (rc)
			return rc;
		if (t->ne[d] < 0)
			return wf_diag_set(c->diag, WF_EFORMAT,
			                   "'%s': tensor '%s' has negative extent ne[%u] = %lld",
			                   c->path, t->name, d, (long long)t->ne[d]);
	}
	rc = rd_u32(c, &type);
	if (!rc)
		rc = rd_u64(c, &offset);
	if (rc)
		return rc;

	const struct wf_dtype_info *ti = type < WF_DTYPE_GGML_COUNT_ ? wf_dtype_info(type) : NULL;
	if (!ti)
		return wf_diag_set(
		    c->diag, WF_EUNKNOWN_TYPE, "'%s': tensor '%s' has ggml type %u, which is %s",
		    c->path, t->name, type,
		    type < WF_DTYPE_GGML_COUNT_ ? "retired by ggml" : "not a ggml type");
	t->dtype = (enum wf_dtype)type;

	rc = wf_dtype_nbytes(type, n_dims, t->ne, &t->nbytes);
	if (rc == WF_EALIGN)
		return wf_diag_set(
		    c->diag, rc,
		    "'%s': tensor '%s': ne[0] = %lld is not a multiple of the %s block "
		    "size %u",
		    c->path, t->name, (long long)t->ne[0], ti->name, ti->block_size);
	if (rc)
		return wf_diag_set(
		    c->diag, rc,
		    "'%s': tensor '%s': shape [%lld, %lld, %lld, %lld] of %s is too large", c->path,
		    t->name, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
		    (long long)t->ne[3], ti->name);
	if (offset % alignment != 0)
		return wf_diag_set(
		    c->diag, WF_EALIGN,
		    "'%s': tensor '%s' offset %llu is not a multiple of the alignment %u", c->path,
		    t->name, (ull)offset, alignment);
	t->offset = offset;
	return 0;
}

static int rd_alignment(struct cursor *c, const struct wf_kv_set *kv, uint32_t *ret)
{
	const struct wf_kv *a = wf_kv_find(kv, "general.alignment");
	if (!a) {
		*ret = GGUF_DEFAULT_ALIGNMENT;
		return 0;
	}
	/* llama.cpp accepts only u32 here; a reader that took other types would open files that
	 * llama.cpp refuses. */
	if (a->v.type != WF_KV_U32)
		return wf_diag_set(c->diag, WF_EFORMAT,
		                   "'%s': general.alignment is %s, must be u32", c->path,
		                   wf_kv_type_name(a->v.type));
	uint64_t v = a->v.u.u64;
	if (v == 0 || (v & (v - 1)) != 0)
		return wf_diag_set(c->diag, WF_EALIGN,
		                   "'%s': general.alignment %llu is not a nonzero power of two",
		                   c->path, (ull)v);
	*ret = (uint32_t)v;
	return 0;
}

static void gguf_file_fini(struct gguf_file *f)
{
	if (!f)
		return;
	free(f->path);
	free(f->id.real_path);
	wf_kv_set_fini(&f->kv);
	for (uint32_t i = 0; f->tensors && i < f->n_tensors; i++)
		free(f->tensors[i].name);
	free(f->tensors);
	memset(f, 0, sizeof(*f));
}

static int64_t mtime_ns(const struct stat *st)
{
	int64_t ns;
	if (__builtin_mul_overflow((int64_t)st->st_mtim.tv_sec, (int64_t)1000000000, &ns) ||
	    __builtin_add_overflow(ns, (int64_t)st->st_mtim.tv_nsec, &ns))
		return st->st_mtim.tv_sec < 0 ? INT64_MIN : INT64_MAX;
	return ns;
}

/* Parses the header of an open GGUF file into f (zeroed by the caller; freed by the caller with
 * gguf_file_fini whatever happens). */
static int gguf_file_parse(int fd, const char *path, struct gguf_file *f, struct wf_diag *diag)
{
	struct cursor c = {.fd = fd, .path = path, .diag = diag};
	struct stat st;
	int rc;

	f->path = strdup(path);
	if (!f->path)
		return -ENOMEM;
	if (fstat(fd, &st) != 0)
		return wf_diag_set(diag, -errno, "'%s': fstat: %s", path, strerror(errno));
	if (!S_ISREG(st.st_mode))
		return wf_diag_set(diag, WF_EFORMAT, "'%s' is not a regular file", path);
	rc = wf__model_record_file(&f->id, fd, &st);
	if (rc < 0)
		return wf_diag_set(diag, rc, "'%s': resolving the opened file: %s", path,
		                   strerror(-rc));
	f->size = (uint64_t)st.st_size;
	f->mtime_ns = mtime_ns(&st);
	c.size = f->size;
	c.buf = malloc(CURSOR_BUF);
	if (!c.buf)
		return -ENOMEM;

	char magic[4];
	uint32_t version;
	uint64_t n_tensors, n_kv;
	what(&c, "the magic");
	rc = cur_read(&c, magic, 4);
	if (rc)
		goto out;
	if (memcmp(magic, "GGUF", 4) != 0) {
		rc = wf_diag_set(
		    diag, WF_EMAGIC,
		    "'%s' is not a GGUF file: magic is %02x %02x %02x %02x, not 'GGUF'", path,
		    (uint8_t)magic[0], (uint8_t)magic[1], (uint8_t)magic[2], (uint8_t)magic[3]);
		goto out;
	}
	what(&c, "the version");
	rc = rd_u32(&c, &version);
	if (rc)
		goto out;
	if ((version & 0xffffu) == 0 && version != 0 && __builtin_bswap32(version) <= 3) {
		/* A big-endian GGUF keeps the magic bytes but stores every number byte-swapped. */
		rc = wf_diag_set(diag, WF_EUNSUPPORTED,
		                 "'%s' is a big-endian GGUF (version %u byte-swapped); only "
		                 "little-endian files are supported",
		                 path, __builtin_bswap32(version));
		goto out;
	}
	if (version != 2 && version != 3) {
		rc = wf_diag_set(diag, WF_EVERSION, "'%s': GGUF version %u is not supported (%s)",
		                 path, version, version == 1 ? "v1 is obsolete" : "only v2 and v3");
		goto out;
	}
	f->version = version;

	what(&c, "the tensor count");
	rc = rd_u64(&c, &n_tensors);
	if (rc)
		goto out;
	what(&c, "the metadata count");
	rc = rd_u64(&c, &n_kv);
	if (rc)
		goto out;
	if (n_tensors > WF_MODEL_MAX_TENSORS || n_kv > WF_MODEL_MAX_KV) {
		rc = wf_diag_set(
		    diag, WF_ELIMIT,
		    "'%s': header claims %llu tensors and %llu metadata keys; the limits are "
		    "%u and %u",
		    path, (ull)n_tensors, (ull)n_kv, WF_MODEL_MAX_TENSORS, WF_MODEL_MAX_KV);
		goto out;
	}
	what(&c, "%llu metadata keys and %llu tensor infos", (ull)n_kv, (ull)n_tensors);
	rc = cur_need(&c, n_kv * MIN_KV_BYTES + n_tensors * MIN_TINFO_BYTES);
	if (rc)
		goto out;

	rc = rd_kvs(&c, n_kv, &f->kv);
	if (rc)
		goto out;
	rc = rd_alignment(&c, &f->kv, &f->alignment);
	if (rc)
		goto out;

	uint64_t cap = 0;
	for (uint64_t i = 0; i < n_tensors; i++) {
		rc = grow((void **)&f->tensors, &cap, i + 1, n_tensors, sizeof(*f->tensors));
		if (rc)
			goto out;
		memset(&f->tensors[i], 0, sizeof(f->tensors[i]));
		f->n_tensors = (uint32_t)i + 1;
		rc = rd_tensor_info(&c, i, f->alignment, &f->tensors[i]);
		if (rc)
			goto out;
	}

	/* The header is at most 1 GiB and the alignment a u32, so this cannot overflow. */
	f->data_offset = (c.pos + f->alignment - 1) / f->alignment * f->alignment;
	for (uint32_t i = 0; i < f->n_tensors; i++) {
		struct wf_tensor *t = &f->tensors[i];
		if (__builtin_add_overflow(t->offset, f->data_offset, &t->offset)) {
			rc = wf_diag_set(
			    diag, WF_EOVERFLOW,
			    "'%s': tensor '%s' offset overflows past the data section at "
			    "%llu",
			    path, t->name, (ull)f->data_offset);
			goto out;
		}
	}
out:
	free(c.buf);
	return rc;
}

static int open_and_parse(const char *path, struct gguf_file *f, struct wf_diag *diag)
{
	int fd;
	int rc = wf_model_file_open(path, &fd, NULL, diag);
	if (rc < 0)
		return wf_diag_set(diag, rc, "cannot open '%s': %s", path, strerror(-rc));
	rc = gguf_file_parse(fd, path, f, diag);
	close(fd);
	return rc;
}

/* split.count / split.no as stored by llama-gguf-split (u16) or any other integer type.
 * Returns 0 with *ret = dflt when absent. */
static int split_key(const struct gguf_file *f, const char *key, uint64_t dflt, uint64_t *ret,
                     struct wf_diag *diag)
{
	int rc = wf_kv_get_u64(&f->kv, key, ret);
	if (rc == WF_ENOT_FOUND) {
		*ret = dflt;
		return 0;
	}
	if (rc)
		return wf_diag_set(diag, WF_ESHARD, "'%s': %s is not a non-negative integer",
		                   f->path, key);
	return 0;
}

static int load_shards(struct gguf_file *shards, uint32_t count, uint32_t named, const char *prefix,
                       struct wf_diag *diag)
{
	const struct gguf_file *first = &shards[named];
	uint64_t total = first->n_tensors;
	char *path = NULL;
	int rc = 0;

	for (uint32_t i = 0; i < count; i++) {
		if (i == named)
			continue;
		free(path);
		if (asprintf(&path, "%s-%05u-of-%05u.gguf", prefix, i + 1, count) < 0) {
			path = NULL;
			return -ENOMEM;
		}
		/* O_NONBLOCK and a regular-file check: a FIFO planted under a sibling's name
		 * must fail the open, not hang it. */
		int fd;
		rc = wf_model_file_open(path, &fd, NULL, diag);
		if (rc < 0) {
			if (rc == -ENOENT)
				rc = wf_diag_set(
				    diag, WF_ESHARD,
				    "missing shard '%s' (%u of %u; '%s' says split.count "
				    "%u)",
				    path, i + 1, count, first->path, count);
			else
				rc = wf_diag_set(diag, rc, "cannot open shard '%s': %s", path,
				                 wf_strerror(rc));
			goto out;
		}
		rc = gguf_file_parse(fd, path, &shards[i], diag);
		close(fd);
		if (rc)
			goto out;

		uint64_t c, no;
		rc = split_key(&shards[i], "split.count", 0, &c, diag);
		if (!rc)
			rc = split_key(&shards[i], "split.no", UINT64_MAX, &no, diag);
		if (rc)
			goto out;
		if (c != count) {
			rc = wf_diag_set(diag, WF_ESHARD,
			                 "shard '%s' says split.count %llu but '%s' says %u", path,
			                 (ull)c, first->path, count);
			goto out;
		}
		if (no != i) {
			rc = wf_diag_set(
			    diag, WF_ESHARD,
			    "shard '%s' should be split.no %u by its name but says %lld", path, i,
			    no == UINT64_MAX ? -1ll : (long long)no);
			goto out;
		}
		total += shards[i].n_tensors;
		if (total > WF_MODEL_MAX_TENSORS) {
			rc = wf_diag_set(diag, WF_ELIMIT,
			                 "shards up to '%s' hold %llu tensors; the limit is %u",
			                 path, (ull)total, WF_MODEL_MAX_TENSORS);
			goto out;
		}
	}

	/* llama.cpp requires split.tensors.count in the first shard; llama-gguf-split writes it in
	 * every shard, and any shard that has it must agree. */
	for (uint32_t i = 0; i < count; i++) {
		uint64_t want;
		rc = split_key(&shards[i], "split.tensors.count", UINT64_MAX, &want, diag);
		if (rc)
			goto out;
		if (want == UINT64_MAX && i == 0) {
			rc = wf_diag_set(diag, WF_ESHARD,
			                 "first shard '%s' has no split.tensors.count",
			                 shards[0].path);
			goto out;
		}
		if (want != UINT64_MAX && want != total) {
			rc =
			    wf_diag_set(diag, WF_ESHARD,
			                "'%s' says split.tensors.count %llu but the %u shards hold "
			                "%llu tensors",
			                shards[i].path, (ull)want, count, (ull)total);
			goto out;
		}
	}
out:
	free(path);
	return rc;
}

/* Moves the parsed files into the model: offsets are already absolute. */
static int fill_model(struct wf_model *m, struct gguf_file *shards, uint32_t count)
{
	uint64_t total = 0;
	for (uint32_t i = 0; i < count; i++)
		total += shards[i].n_tensors;

	m->format = WF_MODEL_FORMAT_GGUF;
	m->files = calloc(count, sizeof(*m->files));
	m->tensors = total ? calloc((size_t)total, sizeof(*m->tensors)) : NULL;
	if (!m->files || (total && !m->tensors))
		return -ENOMEM;
	m->n_files = count;
	for (uint32_t i = 0; i < count; i++) {
		struct gguf_file *f = &shards[i];
		struct wf_model_file *mf = &m->files[i];
		mf->path = f->path;
		f->path = NULL;
		mf->size = f->size;
		mf->mtime_ns = f->mtime_ns;
		mf->data_offset = f->data_offset;
		mf->gguf_version = f->version;
		mf->alignment = f->alignment;
		mf->n_tensors = f->n_tensors;
		mf->real_path = f->id.real_path;
		f->id.real_path = NULL;
		mf->dev = f->id.dev;
		mf->ino = f->id.ino;
		mf->ctime_ns = f->id.ctime_ns;
		for (uint32_t j = 0; j < f->n_tensors; j++) {
			struct wf_tensor *t = &m->tensors[m->n_tensors++];
			*t = f->tensors[j];
			t->file = i;
			f->tensors[j].name = NULL;
		}
	}
	m->kv = shards[0].kv;
	memset(&shards[0].kv, 0, sizeof(shards[0].kv));
	return 0;
}

int wf__gguf_load(struct wf_model *m, const char *path, struct wf_diag *diag)
{
	struct gguf_file named = {0};
	struct gguf_file *shards = NULL;
	char *prefix = NULL;
	uint32_t count = 1;
	uint64_t c, no;

	int rc = open_and_parse(path, &named, diag);
	if (rc)
		goto out;
	rc = split_key(&named, "split.count", 1, &c, diag);
	if (rc)
		goto out;
	if (c <= 1) {
		shards = calloc(1, sizeof(*shards));
		if (!shards) {
			rc = -ENOMEM;
			goto out;
		}
		shards[0] = named;
		memset(&named, 0, sizeof(named));
	} else {
		if (c > WF_MODEL_MAX_FILES) {
			rc = wf_diag_set(diag, WF_ELIMIT,
			                 "'%s': split.count %llu exceeds the limit %u", path,
			                 (ull)c, WF_MODEL_MAX_FILES);
			goto out;
		}
		count = (uint32_t)c;
		rc = split_key(&named, "split.no", UINT64_MAX, &no, diag);
		if (rc)
			goto out;
		if (no == UINT64_MAX) {
			rc = wf_diag_set(diag, WF_ESHARD, "'%s' has split.count %u but no split.no",
			                 path, count);
			goto out;
		}
		if (no >= c) {
			rc = wf_diag_set(diag, WF_ESHARD,
			                 "'%s': split.no %llu is out of range for "
			                 "split.count %u",
			                 path, (ull)no, count);
			goto out;
		}
		char suffix[64];
		snprintf(suffix, sizeof(suffix), "-%05u-of-%05u.gguf", (unsigned)no + 1, count);
		size_t pl = strlen(path), sl = strlen(suffix);
		if (pl <= sl || strcmp(path + pl - sl, suffix) != 0) {
			rc = wf_diag_set(
			    diag, WF_ESHARD,
			    "'%s' is shard %llu of %u but its name does not end in '%s', "
			    "so its siblings cannot be found",
			    path, (ull)no + 1, count, suffix);
			goto out;
		}
		prefix = strndup(path, pl - sl);
		shards = calloc(count, sizeof(*shards));
		if (!prefix || !shards) {
			rc = -ENOMEM;
			goto out;
		}
		shards[no] = named;
		memset(&named, 0, sizeof(named));
		rc = load_shards(shards, count, (uint32_t)no, prefix, diag);
		if (rc)
			goto out;
	}

	rc = fill_model(m, shards, count);
	if (rc)
		goto out;
	rc = wf__hparams_from_gguf(&m->hp, &m->kv, m->files[0].path, diag);
out:
	gguf_file_fini(&named);
	for (uint32_t i = 0; shards && i < count; i++)
		gguf_file_fini(&shards[i]);
	free(shards);
	free(prefix);
	return rc;
}
