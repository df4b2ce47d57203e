/* Model digest: xxh3-128 over the byte stream that model.h spells out. */
#include "model/model.h"

#include "base/error.h"

#include <string.h>

/* For XXH3_state_t on the stack: wf_model_digest() cannot fail, so it must not allocate. */
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the digest stream is little-endian");

static void put_u32(XXH3_state_t *st, uint32_t v)
{
	XXH3_128bits_update(st, &v, sizeof(v));
}

static void put_u64(XXH3_state_t *st, uint64_t v)
{
	XXH3_128bits_update(st, &v, sizeof(v));
}

void wf_model_digest(const struct wf_model *model, struct wf_digest *ret_digest)
{
	XXH3_state_t st;
	XXH3_INITSTATE(&st);
	XXH3_128bits_reset(&st);

	put_u32(&st, WF_DIGEST_VERSION);
	put_u32(&st, model->n_files);
	put_u32(&st, model->n_tensors);
	for (uint32_t i = 0; i < model->n_files; i++) {
		const struct wf_model_file *f = &model->files[i];
		put_u64(&st, f->size);
		put_u64(&st, (uint64_t)f->mtime_ns);
		put_u64(&st, f->data_offset);
	}
	for (uint32_t i = 0; i < model->n_tensors; i++) {
		const struct wf_tensor *t = &model->tensors[i];
		size_t len = strlen(t->name); /* <= WF_MODEL_MAX_NAME: fits in u32 */
		put_u32(&st, (uint32_t)len);
		XXH3_128bits_update(&st, t->name, len);
		put_u32(&st, (uint32_t)t->dtype);
		put_u32(&st, t->n_dims);
		for (uint32_t d = 0; d < t->n_dims && d < WF_MODEL_MAX_DIMS; d++)
			put_u64(&st, (uint64_t)t->ne[d]);
		put_u64(&st, t->nbytes);
		put_u32(&st, t->file);
		put_u64(&st, t->offset);
	}
	XXH128_hash_t h = XXH3_128bits_digest(&st);
	ret_digest->hi = h.high64;
	ret_digest->lo = h.low64;
}

void wf_digest_hex(const struct wf_digest *digest, char out[WF_DIGEST_HEX_LEN])
{
	static const char hex[] = "0123456789abcdef";
	for (int i = 0; i < 16; i++) {
		out[i] = hex[(digest->hi >> (60 - 4 * i)) & 0xf];
		out[16 + i] = hex[(digest->lo >> (60 - 4 * i)) & 0xf];
	}
	out[32] = '\0';
}

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

int wf_digest_parse(const char *hex, struct wf_digest *ret_digest)
{
	if (!hex)
		return WF_EINVAL;
	uint64_t v[2] = {0, 0};
	for (int i = 0; i < 32; i++) {
		int x = hexval(hex[i]); /* stops at a NUL: hexval('\0') < 0 */
		if (x < 0)
			return WF_EINVAL;
		v[i / 16] = v[i / 16] << 4 | (uint64_t)x;
	}
	if (hex[32] != '\0')
		return WF_EINVAL;
	ret_digest->hi = v[0];
	ret_digest->lo = v[1];
	return 0;
}
