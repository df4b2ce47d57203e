/* The metadata encoding of model/meta.h: writer, validating reader, and the assembly of a model
 * from stored tables. */
#include "model/meta.h"

#include "base/error.h"
#include "model/model_internal.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the metadata encoding is LE");
_Static_assert(sizeof(((struct wf_hparams *)0)->arch) == 64, "meta holds arch[64]");

typedef unsigned long long ull;

/* ---- encoding ---- */

struct wr {
	uint8_t *buf;
	size_t cap, pos;
	bool over; /* pos passed cap (or size_t): only counting from then on */
};

static void put(struct wr *w, const void *p, size_t n)
{
	size_t end;
	if (__builtin_add_overflow(w->pos, n, &end)) {
		w->over = true;
		return;
	}
	if (w->buf && end <= w->cap && n)
		memcpy(w->buf + w->pos, p, n);
	else if (end > w->cap)
		w->over = true;
	w->pos = end;
}

static void put_u32(struct wr *w, uint32_t v)
{
	put(w, &v, 4);
}

static void put_u64(struct wr *w, uint64_t v)
{
	put(w, &v, 8);
}

static void put_str(struct wr *w, const struct wf_kv_str *s)
{
	static const uint8_t nul;
	put_u64(w, s->n);
	put(w, s->s, (size_t)s->n);
	put(w, &nul, 1);
}

static int put_array(struct wr *w, const struct wf_kv_array *a, unsigned depth)
{
	if (depth > WF_MODEL_MAX_KV_DEPTH || a->n > WF_MODEL_MAX_ARRAY)
		return WF_ELIMIT;
	put_u32(w, (uint32_t)a->elem);
	put_u64(w, a->n);
	if (a->elem == WF_KV_STRING) {
		for (uint64_t i = 0; i < a->n; i++)
			put_str(w, &a->u.strs[i]);
	} else if (a->elem == WF_KV_ARRAY) {
		for (uint64_t i = 0; i < a->n; i++) {
			int rc = put_array(w, &a->u.arrays[i], depth + 1);
			if (rc)
				return rc;
		}
	} else {
		size_t sz = wf_kv_type_size(a->elem);
		if (sz == 0)
			return WF_EINVAL;
		put(w, a->u.scalars, (size_t)a->n * sz);
	}
	return 0;
}

static int put_value(struct wr *w, const struct wf_kv_value *v)
{
	put_u32(w, (uint32_t)v->type);
	switch (v->type) {
	case WF_KV_STRING:
		put_str(w, &v->u.str);
		return 0;
	case WF_KV_ARRAY:
		return put_array(w, &v->u.arr, 1);
	case WF_KV_F32:
	case WF_KV_F64:
		put(w, &v->u.f64, 8);
		return 0;
	case WF_KV_I8:
	case WF_KV_I16:
	case WF_KV_I32:
	case WF_KV_I64:
		put(w, &v->u.i64, 8);
		return 0;
	case WF_KV_U8:
	case WF_KV_U16:
	case WF_KV_U32:
	case WF_KV_U64:
	case WF_KV_BOOL:
		put_u64(w, v->u.u64);
		return 0;
	case WF_KV_TYPE_MAX_:
		break;
	}
	return WF_EINVAL;
}

int wf_model_meta_encode(const struct wf_model *m, void *buf, size_t cap, size_t *ret_len,
                         struct wf_diag *diag)
{
	struct wr w = {.buf = buf, .cap = buf ? cap : 0};
	uint8_t fixed[WF_MODEL_META_FIXED] = {0};
	int rc;

	if (!m || !ret_len || (m->n_files && !m->files) || (m->kv.n && !m->kv.items))
		return wf_diag_set(diag, WF_EINVAL, "model metadata: no model");
	if (m->kv.n > WF_MODEL_MAX_KV || m->n_files > WF_MODEL_MAX_FILES)
		return wf_diag_set(diag, WF_ELIMIT, "model metadata: %u keys, %u files", m->kv.n,
		                   m->n_files);
	const struct wf_hparams *hp = &m->hp;
	uint32_t head[4] = {WF_MODEL_META_VERSION, (uint32_t)m->format, m->n_files, m->kv.n};
	const uint32_t u32s[12] = {hp->n_layer,       hp->n_embd,      hp->n_head,   hp->n_head_kv,
	                           hp->head_dim,      hp->n_ff,        hp->n_ff_exp, hp->n_expert,
	                           hp->n_expert_used, hp->n_ctx_train, hp->n_vocab,  hp->rope_dim};
	memcpy(fixed, head, sizeof(head));
	memcpy(fixed + 16, hp->arch, strnlen(hp->arch, sizeof(hp->arch) - 1));
	memcpy(fixed + 80, u32s, sizeof(u32s));
	memcpy(fixed + 128, &hp->rope_freq_base, 4);
	memcpy(fixed + 132, &hp->rms_eps, 4);
	put(&w, fixed, sizeof(fixed));
	for (uint32_t i = 0; i < m->n_files; i++) {
		put_u32(&w, m->files[i].gguf_version);
		put_u32(&w, m->files[i].alignment);
	}
	for (uint32_t i = 0; i < m->kv.n; i++) {
		const struct wf_kv *kv = &m->kv.items[i];
		size_t kn = kv->key ? strnlen(kv->key, WF_MODEL_MAX_NAME + 1) : 0;
		if (kn == 0 || kn > WF_MODEL_MAX_NAME)
			return wf_diag_set(diag, WF_ELIMIT,
			                   "model metadata: key %u has length %zu (1..%u)", i, kn,
			                   WF_MODEL_MAX_NAME);
		put_u32(&w, (uint32_t)kn);
		put(&w, kv->key, kn + 1);
		rc = put_value(&w, &kv->v);
		if (rc)
			return wf_diag_set(diag, rc, "model metadata: key '%s': %s value", kv->key,
			                   rc == WF_ELIMIT ? "oversized" : "invalid");
	}
	*ret_len = w.pos;
	if (w.over && buf)
		return wf_diag_set(diag, WF_ELIMIT, "model metadata: %zu bytes, room for %zu",
		                   w.pos, cap);
	return 0;
}

/* ---- decoding ---- */

struct rd {
	const uint8_t *b;
	size_t len, pos;
	struct wf_diag *diag;
};

static int short_of(struct rd *r, uint64_t n, const char *what)
{
	return wf_diag_set(r->diag, WF_ETRUNCATED,
	                   "model metadata: %s needs %llu bytes at byte %zu of %zu", what, (ull)n,
	                   r->pos, r->len);
}

static int get(struct rd *r, void *dst, uint64_t n, const char *what)
{
	if (n > r->len - r->pos)
		return short_of(r, n, what);
	if (dst)
		memcpy(dst, r->b + r->pos, (size_t)n);
	r->pos += (size_t)n;
	return 0;
}

static int get_u32(struct rd *r, uint32_t *v, const char *what)
{
	return get(r, v, 4, what);
}

static int get_u64(struct rd *r, uint64_t *v, const char *what)
{
	return get(r, v, 8, what);
}

/* u64 len, bytes, NUL. Checked against the bytes left before anything is allocated. */
static int get_str(struct rd *r, struct wf_kv_str *out, const char *what)
{
	uint64_t n = 0;
	int rc = get_u64(r, &n, what);
	if (rc)
		return rc;
	if (n >= r->len - r->pos) /* the bytes and the NUL */
		return short_of(r, n + 1, what);
	if (r->b[r->pos + n] != 0)
		return wf_diag_set(r->diag, WF_EFORMAT,
		                   "model metadata: %s at byte %zu is not NUL-terminated", what,
		                   r->pos);
	if (out) {
		char *s = malloc((size_t)n + 1);
		if (!s)
			return -ENOMEM;
		memcpy(s, r->b + r->pos, (size_t)n + 1);
		out->s = s;
		out->n = n;
	}
	r->pos += (size_t)n + 1;
	return 0;
}

static bool type_ok(uint32_t t)
{
	return t < WF_KV_TYPE_MAX_;
}

static int get_array(struct rd *r, struct wf_kv_array *a, unsigned depth, const char *key)
{
	uint32_t elem = 0;
	uint64_t n = 0;
	int rc = get_u32(r, &elem, "an array's element type");
	if (!rc)
		rc = get_u64(r, &n, "an array's length");
	if (rc)
		return rc;
	if (!type_ok(elem))
		return wf_diag_set(r->diag, WF_EFORMAT,
		                   "model metadata: key '%s': array element type %u", key, elem);
	if (elem == WF_KV_ARRAY && depth >= WF_MODEL_MAX_KV_DEPTH)
		return wf_diag_set(r->diag, WF_ELIMIT,
		                   "model metadata: key '%s': arrays nested deeper than %u", key,
		                   WF_MODEL_MAX_KV_DEPTH);
	if (n > WF_MODEL_MAX_ARRAY)
		return wf_diag_set(
		    r->diag, WF_ELIMIT,
		    "model metadata: key '%s': array of %llu elements (at most %llu)", key, (ull)n,
		    (ull)WF_MODEL_MAX_ARRAY);
	/* Smallest element: a scalar's size, an empty string (9), an empty array (12). */
	size_t sz = wf_kv_type_size((enum wf_kv_type)elem);
	uint64_t min = elem == WF_KV_STRING ? 9 : elem == WF_KV_ARRAY ? 12 : sz;
	if (n * min > r->len - r->pos) /* n <= 2^24, min <= 12: no overflow */
		return short_of(r, n * min, "an array's elements");
	if (a) {
		a->elem = (enum wf_kv_type)elem;
		a->n = 0; /* counts what is filled, for wf_kv_array_fini on failure */
	}
	if (elem == WF_KV_STRING || elem == WF_KV_ARRAY) {
		size_t esz =
		    elem == WF_KV_STRING ? sizeof(struct wf_kv_str) : sizeof(struct wf_kv_array);
		void *v = NULL;
		if (a && n && !(v = calloc((size_t)n, esz)))
			return -ENOMEM;
		if (a) {
			if (elem == WF_KV_STRING)
				a->u.strs = v;
			else
				a->u.arrays = v;
		}
		for (uint64_t i = 0; i < n; i++) {
			if (elem == WF_KV_STRING)
				rc = get_str(r, a ? &a->u.strs[i] : NULL, "an array's string");
			else
				rc = get_array(r, a ? &a->u.arrays[i] : NULL, depth + 1, key);
			/* A failed element counts too: a nested array may hold what it filled (its
			 * own n says how much), and a zeroed string frees as nothing. */
			if (a)
				a->n = i + 1;
			if (rc)
				return rc;
		}
		return 0;
	}
	const uint8_t *p = r->b + r->pos;
	if (elem == WF_KV_BOOL)
		for (uint64_t i = 0; i < n; i++)
			if (p[i] > 1)
				return wf_diag_set(r->diag, WF_EFORMAT,
				                   "model metadata: key '%s': bool element %llu is "
				                   "%u",
				                   key, (ull)i, p[i]);
	if (a && n) {
		if (!(a->u.scalars = malloc((size_t)(n * sz))))
			return -ENOMEM;
		memcpy(a->u.scalars, p, (size_t)(n * sz));
		a->n = n;
	}
	r->pos += (size_t)(n * sz);
	return 0;
}

/* The one spelling of a scalar of type t (model/meta.h): in range, sign-extended, an F32 a
 * float's exact value. Anything else no reader produces, and would not encode back the same. */
static bool scalar_ok(enum wf_kv_type t, uint64_t x)
{
	int64_t s = (int64_t)x;
	switch (t) {
	case WF_KV_U8:
		return x <= UINT8_MAX;
	case WF_KV_U16:
		return x <= UINT16_MAX;
	case WF_KV_U32:
		return x <= UINT32_MAX;
	case WF_KV_BOOL:
		return x <= 1;
	case WF_KV_I8:
		return s >= INT8_MIN && s <= INT8_MAX;
	case WF_KV_I16:
		return s >= INT16_MIN && s <= INT16_MAX;
	case WF_KV_I32:
		return s >= INT32_MIN && s <= INT32_MAX;
	case WF_KV_F32: {
		double d, back;
		memcpy(&d, &x, 8);
		back = (double)(float)d;
		return memcmp(&back, &d, 8) == 0;
	}
	default:
		return true; /* U64, I64, F64: every bit pattern */
	}
}

static int get_value(struct rd *r, struct wf_kv_value *v, const char *key)
{
	uint32_t t = 0;
	uint64_t x = 0;
	int rc = get_u32(r, &t, "a value's type");
	if (rc)
		return rc;
	if (!type_ok(t))
		return wf_diag_set(r->diag, WF_EFORMAT, "model metadata: key '%s': value type %u",
		                   key, t);
	if (t == WF_KV_STRING) {
		rc = get_str(r, v ? &v->u.str : NULL, "a string value");
		if (!rc && v)
			v->type = WF_KV_STRING;
		return rc;
	}
	if (t == WF_KV_ARRAY) {
		if (v)
			v->type = WF_KV_ARRAY;
		return get_array(r, v ? &v->u.arr : NULL, 1, key);
	}
	rc = get_u64(r, &x, "a scalar value");
	if (rc)
		return rc;
	if (!scalar_ok((enum wf_kv_type)t, x))
		return wf_diag_set(r->diag, WF_EFORMAT,
		                   "model metadata: key '%s': 0x%016llx is not a %s", key, (ull)x,
		                   wf_kv_type_name((enum wf_kv_type)t));
	if (v) {
		v->type = (enum wf_kv_type)t;
		memcpy(&v->u.u64, &x, 8); /* the union's 8 bytes, whichever member */
	}
	return 0;
}

int wf_model_meta_decode(const void *buf, size_t len, struct wf_model *m, struct wf_diag *diag)
{
	struct rd r = {.b = buf, .len = len, .diag = diag};
	uint8_t fixed[WF_MODEL_META_FIXED];
	uint32_t head[4];
	int rc;

	if (!buf && len)
		return wf_diag_set(diag, WF_EINVAL, "model metadata: no buffer");
	if (m && m->kv.n)
		return wf_diag_set(diag, WF_EINVAL, "model metadata: the model has keys already");
	rc = get(&r, fixed, sizeof(fixed), "the fixed part");
	if (rc)
		return rc;
	memcpy(head, fixed, sizeof(head));
	if (head[0] != WF_MODEL_META_VERSION)
		return wf_diag_set(diag, WF_EVERSION, "model metadata version %u, expected %u",
		                   head[0], WF_MODEL_META_VERSION);
	if (head[1] != WF_MODEL_FORMAT_GGUF && head[1] != WF_MODEL_FORMAT_SAFETENSORS)
		return wf_diag_set(diag, WF_EFORMAT, "model metadata: format %u", head[1]);
	if (head[2] == 0 || head[2] > WF_MODEL_MAX_FILES || (m && head[2] != m->n_files))
		return wf_diag_set(diag, WF_EFORMAT, "model metadata: %u files%s", head[2],
		                   m ? ", the tables hold another count" : "");
	if (head[3] > WF_MODEL_MAX_KV)
		return wf_diag_set(diag, WF_ELIMIT, "model metadata: %u keys (at most %u)", head[3],
		                   WF_MODEL_MAX_KV);
	const uint8_t *nul = memchr(fixed + 16, 0, 64);
	if (nul == NULL)
		return wf_diag_set(diag, WF_EFORMAT,
		                   "model metadata: architecture is not NUL-terminated");
	for (const uint8_t *p = nul; p < fixed + 80; p++)
		if (*p)
			return wf_diag_set(diag, WF_EFORMAT,
			                   "model metadata: architecture is not zero-padded");
	for (size_t i = 136; i < WF_MODEL_META_FIXED; i++)
		if (fixed[i])
			return wf_diag_set(diag, WF_EFORMAT,
			                   "model metadata: reserved byte %zu is not zero", i);
	if ((uint64_t)head[2] * 8 > r.len - r.pos)
		return short_of(&r, (uint64_t)head[2] * 8, "the file entries");
	for (uint32_t i = 0; i < head[2]; i++) {
		uint32_t fv[2];
		get(&r, fv, 8, "a file entry");
		if (fv[0] > 3 || fv[1] == 0 || (fv[1] & (fv[1] - 1)) != 0)
			return wf_diag_set(diag, WF_EFORMAT,
			                   "model metadata: file %u: GGUF version %u, alignment %u",
			                   i, fv[0], fv[1]);
		if (m) {
			m->files[i].gguf_version = fv[0];
			m->files[i].alignment = fv[1];
		}
	}
	/* A key record is at least 4 + 1 + 1 + 4 + 8 bytes. */
	if ((uint64_t)head[3] * 18 > r.len - r.pos)
		return short_of(&r, (uint64_t)head[3] * 18, "the key records");
	struct wf_kv *items = NULL;
	if (m && head[3] && !(items = calloc(head[3], sizeof(*items))))
		return -ENOMEM;
	uint32_t n = 0;
	for (; n < head[3]; n++) {
		uint32_t kn = 0;
		rc = get_u32(&r, &kn, "a key's length");
		if (rc)
			goto fail;
		if (kn == 0 || kn > WF_MODEL_MAX_NAME) {
			rc = wf_diag_set(diag, WF_EFORMAT,
			                 "model metadata: key %u has length %u (1..%u)", n, kn,
			                 WF_MODEL_MAX_NAME);
			goto fail;
		}
		if ((uint64_t)kn + 1 > r.len - r.pos) {
			rc = short_of(&r, (uint64_t)kn + 1, "a key");
			goto fail;
		}
		const char *key = (const char *)r.b + r.pos;
		if (memchr(key, 0, kn) || key[kn] != 0) {
			rc = wf_diag_set(diag, WF_EFORMAT,
			                 "model metadata: key %u at byte %zu holds a NUL or lacks "
			                 "its terminator",
			                 n, r.pos);
			goto fail;
		}
		r.pos += kn + 1;
		if (items && !(items[n].key = strndup(key, kn))) {
			rc = -ENOMEM;
			goto fail;
		}
		/* The key is NUL-terminated in the buffer: messages may print it. */
		rc = get_value(&r, items ? &items[n].v : NULL, key);
		if (rc) {
			if (items)
				n++; /* its key and partial value are freed below */
			goto fail;
		}
	}
	if (r.pos != r.len) {
		rc = wf_diag_set(diag, WF_EFORMAT,
		                 "model metadata: %zu bytes after the last key (of %zu)",
		                 r.len - r.pos, r.len);
		goto fail;
	}
	if (m) {
		struct wf_hparams *hp = &m->hp;
		uint32_t u32s[12];
		memset(hp, 0, sizeof(*hp));
		memcpy(hp->arch, fixed + 16, 64);
		memcpy(u32s, fixed + 80, sizeof(u32s));
		uint32_t *dst[12] = {&hp->n_layer,     &hp->n_embd,   &hp->n_head,
		                     &hp->n_head_kv,   &hp->head_dim, &hp->n_ff,
		                     &hp->n_ff_exp,    &hp->n_expert, &hp->n_expert_used,
		                     &hp->n_ctx_train, &hp->n_vocab,  &hp->rope_dim};
		for (int i = 0; i < 12; i++)
			*dst[i] = u32s[i];
		memcpy(&hp->rope_freq_base, fixed + 128, 4);
		memcpy(&hp->rms_eps, fixed + 132, 4);
		m->format = (enum wf_model_format)head[1];
		m->kv.items = items;
		m->kv.n = n;
	}
	return 0;
fail:
	if (items) {
		struct wf_kv_set s = {.n = n, .items = items};
		wf_kv_set_fini(&s);
	}
	return rc;
}

int wf_model_assemble(struct wf_model *m, struct wf_diag *diag)
{
	if (!m)
		return wf_diag_set(diag, WF_EINVAL, "wf_model_assemble: no model");
	return wf__model_finish(m, diag);
}
