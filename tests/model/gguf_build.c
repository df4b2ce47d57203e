#include "gguf_build.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void gb_free(struct gb *b)
{
	free(b->p);
	memset(b, 0, sizeof(*b));
}

void gb_bytes(struct gb *b, const void *p, size_t n)
{
	if (b->n + n > b->cap) {
		size_t cap = b->cap ? b->cap : 256;
		while (cap < b->n + n)
			cap *= 2;
		b->p = realloc(b->p, cap);
		if (!b->p)
			abort();
		b->cap = cap;
	}
	if (n)
		memcpy(b->p + b->n, p, n);
	b->n += n;
}

/* The test host is little-endian (the library asserts it), so raw bytes are GGUF bytes. */
void gb_u8(struct gb *b, uint8_t v)
{
	gb_bytes(b, &v, 1);
}
void gb_u16(struct gb *b, uint16_t v)
{
	gb_bytes(b, &v, 2);
}
void gb_u32(struct gb *b, uint32_t v)
{
	gb_bytes(b, &v, 4);
}
void gb_u64(struct gb *b, uint64_t v)
{
	gb_bytes(b, &v, 8);
}
void gb_f32(struct gb *b, float v)
{
	gb_bytes(b, &v, 4);
}
void gb_f64(struct gb *b, double v)
{
	gb_bytes(b, &v, 8);
}

void gb_str(struct gb *b, const char *s)
{
	gb_u64(b, strlen(s));
	gb_bytes(b, s, strlen(s));
}

void gb_pad(struct gb *b, size_t align)
{
	static const uint8_t zero[256];
	while (b->n % align)
		gb_bytes(b, zero, 1);
}

void gb_header(struct gb *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv)
{
	gb_bytes(b, "GGUF", 4);
	gb_u32(b, version);
	gb_u64(b, n_tensors);
	gb_u64(b, n_kv);
}

void gb_kv_u32(struct gb *b, const char *key, uint32_t v)
{
	gb_str(b, key);
	gb_u32(b, 4);
	gb_u32(b, v);
}

void gb_kv_u16(struct gb *b, const char *key, uint16_t v)
{
	gb_str(b, key);
	gb_u32(b, 2);
	gb_u16(b, v);
}

void gb_kv_f32(struct gb *b, const char *key, float v)
{
	gb_str(b, key);
	gb_u32(b, 6);
	gb_f32(b, v);
}

void gb_kv_str(struct gb *b, const char *key, const char *v)
{
	gb_str(b, key);
	gb_u32(b, 8);
	gb_str(b, v);
}

void gb_kv_bool(struct gb *b, const char *key, bool v)
{
	gb_str(b, key);
	gb_u32(b, 7);
	gb_u8(b, v ? 1 : 0);
}

void gb_tinfo(struct gb *b, const char *name, uint32_t n_dims, const int64_t *ne, uint32_t type,
              uint64_t offset)
{
	gb_str(b, name);
	gb_u32(b, n_dims);
	for (uint32_t i = 0; i < n_dims; i++)
		gb_bytes(b, &ne[i], 8);
	gb_u32(b, type);
	gb_u64(b, offset);
}

void gb_write(const struct gb *b, const char *path)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0) {
		perror(path);
		abort();
	}
	size_t off = 0;
	while (off < b->n) {
		ssize_t w = write(fd, b->p + off, b->n - off);
		if (w <= 0) {
			perror(path);
			abort();
		}
		off += (size_t)w;
	}
	close(fd);
}

size_t gt_build(struct gb *b, const struct gt_model *m)
{
	size_t base = b->n;
	uint32_t align = m->alignment ? m->alignment : 32;
	gb_header(b, m->version ? m->version : 3, m->n_tensors,
	          GT_BUILTIN_KV + (m->alignment ? 1 : 0) + m->n_extra_kv);
	gb_kv_str(b, "general.architecture", "llama");
	gb_kv_u32(b, "llama.block_count", 1);
	gb_kv_u32(b, "llama.embedding_length", 64);
	gb_kv_u32(b, "llama.attention.head_count", 4);
	gb_kv_u32(b, "llama.expert_count", 2);
	gb_kv_f32(b, "llama.rope.freq_base", 10000.0f);
	if (m->alignment)
		gb_kv_u32(b, "general.alignment", m->alignment);
	if (m->extra_kv)
		m->extra_kv(b, m->ctx);

	uint64_t off = 0;
	for (uint32_t i = 0; i < m->n_tensors; i++) {
		const struct gt_tensor *t = &m->tensors[i];
		gb_tinfo(b, t->name, t->n_dims, t->ne, t->type, off);
		off += t->nbytes;
		off = (off + align - 1) / align * align;
	}
	gb_pad(b, align);
	size_t data = b->n - base;
	for (uint32_t i = 0; i < m->n_tensors; i++) {
		const struct gt_tensor *t = &m->tensors[i];
		for (uint64_t k = 0; k < t->nbytes; k++)
			gb_u8(b, (uint8_t)(i * 31 + k));
		if (i + 1 < m->n_tensors)
			gb_pad(b, align);
	}
	return data;
}
