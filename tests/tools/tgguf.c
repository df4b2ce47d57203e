#include "tgguf.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct cur {
	const uint8_t *p;
	size_t n, off;
	bool bad;
};

static const void *take(struct cur *c, size_t n)
{
	if (c->bad || n > c->n - c->off) {
		c->bad = true;
		return NULL;
	}
	const void *r = c->p + c->off;
	c->off += n;
	return r;
}

static uint64_t rd(struct cur *c, size_t n)
{
	const uint8_t *b = take(c, n);
	uint64_t v = 0;
	for (size_t i = 0; b && i < n; i++)
		v |= (uint64_t)b[i] << (8 * i);
	return v;
}

static char *rd_str(struct cur *c)
{
	uint64_t n = rd(c, 8);
	const char *s = take(c, n);
	if (!s)
		return NULL;
	char *r = malloc(n + 1);
	memcpy(r, s, n);
	r[n] = '\0';
	return r;
}

static size_t scalar_size(uint32_t t)
{
	static const size_t sz[13] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
	return t < 13 ? sz[t] : 0;
}

static void skip_value(struct cur *c, uint32_t t, int depth)
{
	if (depth > 8) {
		c->bad = true;
		return;
	}
	if (t == 8) {
		free(rd_str(c));
	} else if (t == 9) {
		uint32_t et = (uint32_t)rd(c, 4);
		uint64_t n = rd(c, 8);
		if (scalar_size(et)) {
			take(c, scalar_size(et) * n);
			return;
		}
		for (uint64_t i = 0; i < n && !c->bad; i++)
			skip_value(c, et, depth + 1);
	} else if (scalar_size(t)) {
		take(c, scalar_size(t));
	} else {
		c->bad = true;
	}
}

bool tg_load(const char *path, struct tg_file *f)
{
	memset(f, 0, sizeof(*f));
	FILE *fp = fopen(path, "rb");
	if (!fp)
		return false;
	fseek(fp, 0, SEEK_END);
	long sz = ftell(fp);
	fseek(fp, 0, SEEK_SET);
	f->bytes = malloc(sz > 0 ? (size_t)sz : 1);
	f->size = (size_t)sz;
	if (fread(f->bytes, 1, f->size, fp) != f->size) {
		fclose(fp);
		tg_free(f);
		return false;
	}
	fclose(fp);
	struct cur c = {f->bytes, f->size, 0, false};
	if (rd(&c, 4) != 0x46554747u)
		goto bad;
	f->version = (uint32_t)rd(&c, 4);
	f->n_tensors = (uint32_t)rd(&c, 8);
	f->n_kv = (uint32_t)rd(&c, 8);
	f->kv = calloc(f->n_kv + 1, sizeof(*f->kv));
	f->t = calloc(f->n_tensors + 1, sizeof(*f->t));
	f->alignment = 32;
	for (uint32_t i = 0; i < f->n_kv && !c.bad; i++) {
		struct tg_kv *k = &f->kv[i];
		k->key = rd_str(&c);
		k->type = (uint32_t)rd(&c, 4);
		k->val_off = c.off;
		if (k->type == 8) {
			k->s = rd_str(&c);
		} else if (k->type == 9) {
			size_t save = c.off;
			k->arr_type = (uint32_t)rd(&c, 4);
			k->arr_n = rd(&c, 8);
			c.off = save;
			skip_value(&c, 9, 0);
		} else if (k->type == 6) {
			uint32_t x = (uint32_t)rd(&c, 4);
			float v;
			memcpy(&v, &x, 4);
			k->f = v;
		} else if (k->type == 12) {
			uint64_t x = rd(&c, 8);
			memcpy(&k->f, &x, 8);
		} else if (scalar_size(k->type)) {
			size_t n = scalar_size(k->type);
			k->u = rd(&c, n);
			if ((k->type == 1 || k->type == 3 || k->type == 5) && n < 8 &&
			    (k->u >> (8 * n - 1)) & 1)
				k->u |= ~0ull << (8 * n);
		} else {
			c.bad = true;
		}
		if (k->key && strcmp(k->key, "general.alignment") == 0)
			f->alignment = (uint32_t)k->u;
	}
	for (uint32_t i = 0; i < f->n_tensors && !c.bad; i++) {
		struct tg_tensor *t = &f->t[i];
		t->name = rd_str(&c);
		t->n_dims = (uint32_t)rd(&c, 4);
		if (t->n_dims > 4)
			goto bad;
		for (uint32_t d = 0; d < 4; d++)
			t->ne[d] = d < t->n_dims ? rd(&c, 8) : 1;
		t->type = (uint32_t)rd(&c, 4);
		t->offset = rd(&c, 8);
	}
	if (c.bad || !f->alignment)
		goto bad;
	f->data_off = (c.off + f->alignment - 1) / f->alignment * f->alignment;
	return true;
bad:
	tg_free(f);
	return false;
}

void tg_free(struct tg_file *f)
{
	for (uint32_t i = 0; f->kv && i < f->n_kv; i++) {
		free(f->kv[i].key);
		free(f->kv[i].s);
	}
	for (uint32_t i = 0; f->t && i < f->n_tensors; i++)
		free(f->t[i].name);
	free(f->kv);
	free(f->t);
	free(f->bytes);
	memset(f, 0, sizeof(*f));
}

const struct tg_kv *tg_kv(const struct tg_file *f, const char *key)
{
	for (uint32_t i = 0; i < f->n_kv; i++)
		if (f->kv[i].key && strcmp(f->kv[i].key, key) == 0)
			return &f->kv[i];
	return NULL;
}

const struct tg_tensor *tg_tensor(const struct tg_file *f, const char *name)
{
	for (uint32_t i = 0; i < f->n_tensors; i++)
		if (strcmp(f->t[i].name, name) == 0)
			return &f->t[i];
	return NULL;
}

bool tg_type_geom(uint32_t type, uint32_t *block, uint32_t *bytes)
{
	switch (type) {
	case 0:
		*block = 1, *bytes = 4;
		return true; /* F32 */
	case 1:
		*block = 1, *bytes = 2;
		return true; /* F16 */
	case 30:
		*block = 1, *bytes = 2;
		return true; /* BF16 */
	case 2:
		*block = 32, *bytes = 18;
		return true; /* Q4_0 */
	case 8:
		*block = 32, *bytes = 34;
		return true; /* Q8_0 */
	case 12:
		*block = 256, *bytes = 144;
		return true; /* Q4_K */
	case 14:
		*block = 256, *bytes = 210;
		return true; /* Q6_K */
	default:
		return false;
	}
}

uint64_t tg_tensor_nbytes(const struct tg_tensor *t)
{
	uint32_t block, bytes;
	if (!tg_type_geom(t->type, &block, &bytes))
		return 0;
	return t->ne[0] / block * bytes * t->ne[1] * t->ne[2] * t->ne[3];
}

const uint8_t *tg_tensor_data(const struct tg_file *f, const struct tg_tensor *t)
{
	uint64_t end = f->data_off + t->offset + tg_tensor_nbytes(t);
	if (end > f->size)
		return NULL;
	return f->bytes + f->data_off + t->offset;
}

float tg_f16(uint16_t h)
{
	int e = (h >> 10) & 31, m = h & 1023;
	float v;
	if (e == 0)
		v = (float)m * 0x1p-24f;
	else if (e == 31)
		v = m ? NAN : INFINITY;
	else
		v = ldexpf((float)(1024 + m), e - 25);
	return (h & 0x8000) ? -v : v;
}

static uint16_t u16(const uint8_t *p)
{
	return (uint16_t)(p[0] | p[1] << 8);
}

bool tg_dequant(uint32_t type, const uint8_t *x, size_t n, float *y)
{
	switch (type) {
	case 0:
		memcpy(y, x, n * 4);
		return true;
	case 1:
		for (size_t i = 0; i < n; i++)
			y[i] = tg_f16(u16(x + 2 * i));
		return true;
	case 30:
		for (size_t i = 0; i < n; i++) {
			uint32_t b = (uint32_t)u16(x + 2 * i) << 16;
			memcpy(&y[i], &b, 4);
		}
		return true;
	case 8: /* Q8_0: d, int8 q[32] */
		for (size_t b = 0; b < n / 32; b++, x += 34) {
			float d = tg_f16(u16(x));
			for (int j = 0; j < 32; j++)
				*y++ = d * (float)(int8_t)x[2 + j];
		}
		return true;
	case 2: /* Q4_0: d, qs[16]; low nibbles first half */
		for (size_t b = 0; b < n / 32; b++, x += 18, y += 32) {
			float d = tg_f16(u16(x));
			for (int j = 0; j < 16; j++) {
				y[j] = d * (float)((x[2 + j] & 15) - 8);
				y[j + 16] = d * (float)((x[2 + j] >> 4) - 8);
			}
		}
		return true;
	case 12: /* Q4_K */
		for (size_t b = 0; b < n / 256; b++, x += 144) {
			float d = tg_f16(u16(x)), dmin = tg_f16(u16(x + 2));
			const uint8_t *s = x + 4, *q = x + 16;
			for (int j = 0; j < 8; j++) {
				int sc, m;
				if (j < 4) {
					sc = s[j] & 63;
					m = s[j + 4] & 63;
				} else {
					sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
					m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
				}
				/* sub-block j: 32 elements, nibble (j&1 ? high : low) of q[(j/2)*32
				 * + l] */
				for (int l = 0; l < 32; l++) {
					int v = (j & 1) ? q[(j / 2) * 32 + l] >> 4
					                : q[(j / 2) * 32 + l] & 15;
					*y++ = d * (float)sc * (float)v - dmin * (float)m;
				}
			}
		}
		return true;
	case 14: /* Q6_K: ql[128] qh[64] scales[16] d */
		for (size_t b = 0; b < n / 256; b++, x += 210) {
			const uint8_t *ql = x, *qh = x + 128;
			const int8_t *sc = (const int8_t *)(x + 192);
			float d = tg_f16(u16(x + 208));
			for (int i = 0; i < 256; i++) {
				int half = i / 128, r = i % 128, quarter = r / 32, l = r % 32;
				const uint8_t *L = ql + 64 * half, *H = qh + 32 * half;
				int lo = quarter == 0   ? L[l] & 15
				         : quarter == 1 ? L[l + 32] & 15
				         : quarter == 2 ? L[l] >> 4
				                        : L[l + 32] >> 4;
				int hi = (H[l] >> (2 * quarter)) & 3;
				int q = (lo | hi << 4) - 32;
				int s = sc[8 * half + l / 16 + 2 * quarter];
				*y++ = d * (float)s * (float)q;
			}
		}
		return true;
	default:
		return false;
	}
}
