/* A tiny GGUF writer for tests: raw little-endian bytes, so that tests can also write what no
 * honest writer would (bad magic, absurd counts, broken shapes). Aborts on allocation failure. */
#ifndef WF_TESTS_MODEL_GGUF_BUILD_H
#define WF_TESTS_MODEL_GGUF_BUILD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct gb {
	uint8_t *p;
	size_t n, cap;
};

void gb_free(struct gb *b);
void gb_bytes(struct gb *b, const void *p, size_t n);
void gb_u8(struct gb *b, uint8_t v);
void gb_u16(struct gb *b, uint16_t v);
void gb_u32(struct gb *b, uint32_t v);
void gb_u64(struct gb *b, uint64_t v);
void gb_f32(struct gb *b, float v);
void gb_f64(struct gb *b, double v);
void gb_str(struct gb *b, const char *s); /* u64 length + bytes */
void gb_pad(struct gb *b, size_t align);  /* zero bytes up to a multiple of align */
/* Header: magic "GGUF", version, counts. */
void gb_header(struct gb *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv);
/* One metadata pair of a scalar type: key, u32 type, value (the low bytes of v). */
void gb_kv_u32(struct gb *b, const char *key, uint32_t v);
void gb_kv_u16(struct gb *b, const char *key, uint16_t v);
void gb_kv_f32(struct gb *b, const char *key, float v);
void gb_kv_str(struct gb *b, const char *key, const char *v);
void gb_kv_bool(struct gb *b, const char *key, bool v);
/* Tensor info: name, n_dims, ne, ggml type, relative offset. */
void gb_tinfo(struct gb *b, const char *name, uint32_t n_dims, const int64_t *ne, uint32_t type,
              uint64_t offset);
/* Writes the buffer to path (0644); aborts on failure. */
void gb_write(const struct gb *b, const char *path);

/* A whole small model: an "llama" arch with a few hparams and the given tensors laid out
 * contiguously at the default alignment (32) or `alignment` (when nonzero, written as
 * general.alignment). The data are a byte pattern; the file ends exactly at the end of the last
 * tensor, so any shorter prefix is truncated. */
struct gt_tensor {
	const char *name;
	uint32_t type;
	uint32_t n_dims;
	int64_t ne[4];
	uint64_t nbytes; /* bytes of data to lay out for it */
};
struct gt_model {
	uint32_t version;   /* 0 means 3 */
	uint32_t alignment; /* 0: no general.alignment key (32) */
	uint32_t n_tensors;
	const struct gt_tensor *tensors;
	/* extra metadata written after the built-in keys */
	uint32_t n_extra_kv;
	void (*extra_kv)(struct gb *b, void *ctx);
	void *ctx;
};
/* Appends the model to b. Returns the offset of the data section. */
size_t gt_build(struct gb *b, const struct gt_model *m);
/* The number of metadata keys gt_build writes itself (before the extra ones). */
#define GT_BUILTIN_KV 6

#endif
