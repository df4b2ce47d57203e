#include "model/kv.h"

#include "base/error.h"

#include <stdlib.h>
#include <string.h>

size_t wf_kv_type_size(enum wf_kv_type t)
{
	switch (t) {
	case WF_KV_U8:
	case WF_KV_I8:
	case WF_KV_BOOL:
		return 1;
	case WF_KV_U16:
	case WF_KV_I16:
		return 2;
	case WF_KV_U32:
	case WF_KV_I32:
	case WF_KV_F32:
		return 4;
	case WF_KV_U64:
	case WF_KV_I64:
	case WF_KV_F64:
		return 8;
	case WF_KV_STRING:
	case WF_KV_ARRAY:
	case WF_KV_TYPE_MAX_:
		break;
	}
	return 0;
}

const char *wf_kv_type_name(enum wf_kv_type t)
{
	static const char *const names[WF_KV_TYPE_MAX_] = {
	    [WF_KV_U8] = "u8",       [WF_KV_I8] = "i8",     [WF_KV_U16] = "u16",
	    [WF_KV_I16] = "i16",     [WF_KV_U32] = "u32",   [WF_KV_I32] = "i32",
	    [WF_KV_F32] = "f32",     [WF_KV_BOOL] = "bool", [WF_KV_STRING] = "string",
	    [WF_KV_ARRAY] = "array", [WF_KV_U64] = "u64",   [WF_KV_I64] = "i64",
	    [WF_KV_F64] = "f64",
	};
	if ((unsigned)t >= WF_KV_TYPE_MAX_)
		return "invalid";
	return names[t];
}

const struct wf_kv *wf_kv_find(const struct wf_kv_set *set, const char *key)
{
	if (!set || !key)
		return NULL;
	for (uint32_t i = 0; i < set->n; i++)
		if (strcmp(set->items[i].key, key) == 0)
			return &set->items[i];
	return NULL;
}

static bool is_unsigned(enum wf_kv_type t)
{
	return t == WF_KV_U8 || t == WF_KV_U16 || t == WF_KV_U32 || t == WF_KV_U64;
}

static bool is_signed(enum wf_kv_type t)
{
	return t == WF_KV_I8 || t == WF_KV_I16 || t == WF_KV_I32 || t == WF_KV_I64;
}

int wf_kv_get_u64(const struct wf_kv_set *set, const char *key, uint64_t *ret)
{
	const struct wf_kv *kv = wf_kv_find(set, key);
	if (!kv)
		return WF_ENOT_FOUND;
	if (is_unsigned(kv->v.type)) {
		*ret = kv->v.u.u64;
		return 0;
	}
	if (is_signed(kv->v.type) && kv->v.u.i64 >= 0) {
		*ret = (uint64_t)kv->v.u.i64;
		return 0;
	}
	return WF_EFORMAT;
}

int wf_kv_get_i64(const struct wf_kv_set *set, const char *key, int64_t *ret)
{
	const struct wf_kv *kv = wf_kv_find(set, key);
	if (!kv)
		return WF_ENOT_FOUND;
	if (is_signed(kv->v.type)) {
		*ret = kv->v.u.i64;
		return 0;
	}
	if (is_unsigned(kv->v.type) && kv->v.u.u64 <= (uint64_t)INT64_MAX) {
		*ret = (int64_t)kv->v.u.u64;
		return 0;
	}
	return WF_EFORMAT;
}

int wf_kv_get_f64(const struct wf_kv_set *set, const char *key, double *ret)
{
	const struct wf_kv *kv = wf_kv_find(set, key);
	if (!kv)
		return WF_ENOT_FOUND;
	/* Integers are accepted where a double holds them exactly (|v| <= 2^53): a writer that
	 * stored rope.freq_base as u32 10000 means the same number. */
	const uint64_t exact = 1ull << 53;
	if (kv->v.type == WF_KV_F32 || kv->v.type == WF_KV_F64) {
		*ret = kv->v.u.f64;
		return 0;
	}
	if (is_unsigned(kv->v.type) && kv->v.u.u64 <= exact) {
		*ret = (double)kv->v.u.u64;
		return 0;
	}
	if (is_signed(kv->v.type) && kv->v.u.i64 <= (int64_t)exact &&
	    kv->v.u.i64 >= -(int64_t)exact) {
		*ret = (double)kv->v.u.i64;
		return 0;
	}
	return WF_EFORMAT;
}

int wf_kv_get_bool(const struct wf_kv_set *set, const char *key, bool *ret)
{
	const struct wf_kv *kv = wf_kv_find(set, key);
	if (!kv)
		return WF_ENOT_FOUND;
	if (kv->v.type != WF_KV_BOOL)
		return WF_EFORMAT;
	*ret = kv->v.u.u64 != 0;
	return 0;
}

int wf_kv_get_str(const struct wf_kv_set *set, const char *key, const char **ret)
{
	const struct wf_kv *kv = wf_kv_find(set, key);
	if (!kv)
		return WF_ENOT_FOUND;
	if (kv->v.type != WF_KV_STRING)
		return WF_EFORMAT;
	*ret = kv->v.u.str.s;
	return 0;
}

int wf_kv_get_array(const struct wf_kv_set *set, const char *key, const struct wf_kv_array **ret)
{
	const struct wf_kv *kv = wf_kv_find(set, key);
	if (!kv)
		return WF_ENOT_FOUND;
	if (kv->v.type != WF_KV_ARRAY)
		return WF_EFORMAT;
	*ret = &kv->v.u.arr;
	return 0;
}

/* A half-built array (a parse that failed midway) has n set to the elements actually filled in,
 * so this frees exactly what exists. */
void wf_kv_array_fini(struct wf_kv_array *a)
{
	if (!a)
		return;
	if (a->elem == WF_KV_STRING) {
		for (uint64_t i = 0; a->u.strs && i < a->n; i++)
			free(a->u.strs[i].s);
		free(a->u.strs);
	} else if (a->elem == WF_KV_ARRAY) {
		for (uint64_t i = 0; a->u.arrays && i < a->n; i++)
			wf_kv_array_fini(&a->u.arrays[i]);
		free(a->u.arrays);
	} else {
		free(a->u.scalars);
	}
	memset(a, 0, sizeof(*a));
}

void wf_kv_value_fini(struct wf_kv_value *v)
{
	if (!v)
		return;
	if (v->type == WF_KV_STRING)
		free(v->u.str.s);
	else if (v->type == WF_KV_ARRAY)
		wf_kv_array_fini(&v->u.arr);
	memset(v, 0, sizeof(*v));
}

void wf_kv_set_fini(struct wf_kv_set *set)
{
	if (!set)
		return;
	for (uint32_t i = 0; set->items && i < set->n; i++) {
		free(set->items[i].key);
		wf_kv_value_fini(&set->items[i].v);
	}
	free(set->items);
	set->items = NULL;
	set->n = 0;
}
