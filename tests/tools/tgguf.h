/* An independent, minimal GGUF reader and ggml dequantizer for the tools tests.
 *
 * Deliberately separate from model/gguf.c and tools/wf-gen: a test that checks wf-gen's or the
 * writer's bytes with the code that produced them proves nothing. Written from the GGUF spec and
 * ggml's dequantize_row_* (ggml-quants.c); trusts its input (test files only). */
#ifndef WF_TESTS_TOOLS_TGGUF_H
#define WF_TESTS_TOOLS_TGGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct tg_kv {
	char *key;
	uint32_t type;     /* GGUF value type */
	uint32_t arr_type; /* element type when type == 9 */
	uint64_t arr_n;
	uint64_t u;     /* integer / bool scalars (sign-extended for signed types) */
	double f;       /* float scalars */
	char *s;        /* string scalars */
	size_t val_off; /* offset of the value in the file */
};

struct tg_tensor {
	char *name;
	uint32_t n_dims;
	uint64_t ne[4];
	uint32_t type;
	uint64_t offset; /* relative to the data section */
};

struct tg_file {
	uint8_t *bytes;
	size_t size;
	uint32_t version;
	uint32_t n_kv, n_tensors;
	struct tg_kv *kv;
	struct tg_tensor *t;
	uint32_t alignment;
	uint64_t data_off;
};

/* Loads and parses a whole file; false on any error. */
bool tg_load(const char *path, struct tg_file *f);
void tg_free(struct tg_file *f);
const struct tg_kv *tg_kv(const struct tg_file *f, const char *key);
const struct tg_tensor *tg_tensor(const struct tg_file *f, const char *name);
/* Bytes per row of ne[0] elements and block geometry for the types the tests use. */
bool tg_type_geom(uint32_t type, uint32_t *block, uint32_t *bytes);
uint64_t tg_tensor_nbytes(const struct tg_tensor *t);
const uint8_t *tg_tensor_data(const struct tg_file *f, const struct tg_tensor *t);
/* Dequantizes n elements (a multiple of the block size) of a tensor of type `type`. */
bool tg_dequant(uint32_t type, const uint8_t *src, size_t n, float *dst);
float tg_f16(uint16_t h);

#endif
