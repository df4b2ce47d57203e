/* Typed metadata key/value pairs (GGUF metadata, safetensors __metadata__).
 *
 * Values keep their GGUF type so that a writer can reproduce them exactly. Arrays of scalars are
 * stored packed (little-endian host order, elem_size bytes each), arrays of strings as string
 * vectors, and arrays of arrays recursively (the GGUF reader allows WF_MODEL_MAX_KV_DEPTH levels).
 * Strings are NUL-terminated copies and also carry their length (GGUF strings may contain NULs;
 * such a string compares by its length). BOOL values are 0 or 1: the reader rejects other bytes. */
#ifndef WF_MODEL_KV_H
#define WF_MODEL_KV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* GGUF's own numbering of value types. */
enum wf_kv_type {
	WF_KV_U8 = 0,
	WF_KV_I8 = 1,
	WF_KV_U16 = 2,
	WF_KV_I16 = 3,
	WF_KV_U32 = 4,
	WF_KV_I32 = 5,
	WF_KV_F32 = 6,
	WF_KV_BOOL = 7,
	WF_KV_STRING = 8,
	WF_KV_ARRAY = 9,
	WF_KV_U64 = 10,
	WF_KV_I64 = 11,
	WF_KV_F64 = 12,
	WF_KV_TYPE_MAX_
};

struct wf_kv_str {
	char *s;    /* NUL-terminated */
	uint64_t n; /* length without the NUL */
};

struct wf_kv_value;

struct wf_kv_array {
	enum wf_kv_type elem;
	uint64_t n;
	union {
		void *scalars;          /* elem is a scalar type: n * wf_kv_type_size(elem) bytes */
		struct wf_kv_str *strs; /* elem == WF_KV_STRING */
		struct wf_kv_array *arrays; /* elem == WF_KV_ARRAY: n nested arrays */
	} u;
};

struct wf_kv_value {
	enum wf_kv_type type;
	union {
		uint64_t u64; /* U8, U16, U32, U64, BOOL (0/1) */
		int64_t i64;  /* I8, I16, I32, I64 */
		double f64;   /* F32, F64 */
		struct wf_kv_str str;
		struct wf_kv_array arr;
	} u;
};

struct wf_kv {
	char *key; /* non-empty, no NUL bytes (the GGUF reader rejects such keys) */
	struct wf_kv_value v;
};

struct wf_kv_set {
	uint32_t n;
	struct wf_kv *items; /* in file order */
};

/* Bytes of one scalar of type t (U8 -> 1, F64 -> 8, BOOL -> 1), 0 for STRING/ARRAY/invalid. */
size_t wf_kv_type_size(enum wf_kv_type t);
/* "u8", "i32", "f32", "bool", "string", "array", ... */
const char *wf_kv_type_name(enum wf_kv_type t);

/* Lookup by exact key; NULL if absent. Linear: metadata is small and looked up at open only. */
const struct wf_kv *wf_kv_find(const struct wf_kv_set *set, const char *key);

/* Typed getters: 0 on success; WF_ENOT_FOUND if absent; WF_EFORMAT if the stored type cannot be
 * converted losslessly (any integer type converts to u64/i64 when in range; F32/F64 to double). */
int wf_kv_get_u64(const struct wf_kv_set *set, const char *key, uint64_t *ret);
int wf_kv_get_i64(const struct wf_kv_set *set, const char *key, int64_t *ret);
int wf_kv_get_f64(const struct wf_kv_set *set, const char *key, double *ret);
int wf_kv_get_bool(const struct wf_kv_set *set, const char *key, bool *ret);
/* Borrowed pointer into the set. */
int wf_kv_get_str(const struct wf_kv_set *set, const char *key, const char **ret);
int wf_kv_get_array(const struct wf_kv_set *set, const char *key, const struct wf_kv_array **ret);

/* Frees everything the set owns and zeroes it; accepts an empty set. */
void wf_kv_set_fini(struct wf_kv_set *set);
/* Frees a value's owned memory (strings, arrays), recursively, and zeroes it; accepts NULL. */
void wf_kv_value_fini(struct wf_kv_value *v);
/* Frees an array's elements (recursively for arrays of arrays) and zeroes it; accepts NULL. Only
 * the first n elements are looked at, so a reader that fails midway sets n to what it filled. */
void wf_kv_array_fini(struct wf_kv_array *a);

#ifdef __cplusplus
}
#endif
#endif
