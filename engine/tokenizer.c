/* Tokenizer: see tokenizer.h. The algorithms follow llama.cpp's src/llama-vocab.cpp (b10573); the
 * comments below name the llama.cpp behaviour each piece reproduces, since "what llama.cpp does"
 * is the specification and some of it is surprising. */
#include "engine/tokenizer.h"

#include "base/error.h"
#include "engine/unicode_class.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_TOKENS (1u << 24)

struct token {
	char *text;
	uint32_t len;
	float score;
	int32_t type; /* enum wf_token_type */
};

/* Open-addressed map from a byte string to an int32 value. Keys are borrowed. */
struct smap {
	uint32_t cap; /* power of two */
	struct {
		const char *key;
		uint32_t len;
		int32_t val;
	} * slots;
};

struct wf_tokenizer {
	enum wf_tokenizer_kind kind;
	uint32_t n;
	struct token *tokens;
	struct smap by_text;
	struct smap merges; /* BPE: "first second" -> rank */
	char **merge_keys;  /* owned storage of the merge keys */
	uint32_t n_merge_keys;
	int32_t bos, eos, unk;
	bool add_bos, add_eos, add_space_prefix, clean_spaces;
	int32_t *specials; /* ids of CONTROL, USER_DEFINED, UNKNOWN tokens, longest text first */
	uint32_t n_specials;
};

/* ---- string map ---- */

static uint64_t hash_bytes(const char *s, uint32_t n)
{
	uint64_t h = 1469598103934665603ull; /* FNV-1a */
	for (uint32_t i = 0; i < n; i++) {
		h ^= (unsigned char)s[i];
		h *= 1099511628211ull;
	}
	return h;
}

static int smap_init(struct smap *m, uint32_t n)
{
	uint32_t cap = 16;
	while (cap < 2 * (uint64_t)n + 1)
		cap <<= 1;
	m->slots = calloc(cap, sizeof(*m->slots));
	if (!m->slots)
		return -ENOMEM;
	m->cap = cap;
	return 0;
}

static int32_t smap_get(const struct smap *m, const char *key, uint32_t len)
{
	if (!m->cap)
		return WF_TOKEN_NULL;
	for (uint64_t i = hash_bytes(key, len) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
		if (!m->slots[i].key)
			return WF_TOKEN_NULL;
		if (m->slots[i].len == len && memcmp(m->slots[i].key, key, len) == 0)
			return m->slots[i].val;
	}
}

/* Inserts unless the key is present; returns false when it was (the map is never full: cap > 2n).
 */
static bool smap_put(struct smap *m, const char *key, uint32_t len, int32_t val)
{
	uint64_t i = hash_bytes(key, len) & (m->cap - 1);
	for (; m->slots[i].key; i = (i + 1) & (m->cap - 1))
		if (m->slots[i].len == len && memcmp(m->slots[i].key, key, len) == 0)
			return false;
	m->slots[i].key = key;
	m->slots[i].len = len;
	m->slots[i].val = val;
	return true;
}

/* ---- growable outputs ---- */

struct ids {
	int32_t *v;
	size_t n, cap;
};

/* Makes room for one more element in a growable array (*v, with *cap elements of size elem,
 * n in use), doubling from first. 0 or -ENOMEM (the array is unchanged then). */
static int grow(void **v, size_t *cap, size_t n, size_t elem, size_t first)
{
	if (n < *cap)
		return 0;
	size_t c = *cap ? 2 * *cap : first;
	void *nv = realloc(*v, c * elem);
	if (!nv)
		return -ENOMEM;
	*v = nv;
	*cap = c;
	return 0;
}

static int ids_push(struct ids *a, int32_t id)
{
	if (grow((void **)&a->v, &a->cap, a->n, sizeof(*a->v), 64) < 0)
		return -ENOMEM;
	a->v[a->n++] = id;
	return 0;
}

struct buf {
	char *p;
	size_t n, cap;
};

static int buf_put(struct buf *b, const void *s, size_t n)
{
	if (b->n + n + 1 > b->cap) {
		size_t cap = b->cap ? b->cap : 64;
		while (cap < b->n + n + 1)
			cap *= 2;
		char *p = realloc(b->p, cap);
		if (!p)
			return -ENOMEM;
		b->p = p;
		b->cap = cap;
	}
	memcpy(b->p + b->n, s, n);
	b->n += n;
	b->p[b->n] = 0;
	return 0;
}

/* ---- UTF-8 ---- */

/* llama.cpp's unicode_len_utf8: by the lead byte's high nibble; a stray continuation byte is 1. */
static size_t utf8_len(unsigned char c)
{
	static const unsigned char lookup[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
	return lookup[c >> 4];
}

static size_t utf8_put(uint32_t cp, char out[4])
{
	if (cp < 0x80) {
		out[0] = (char)cp;
		return 1;
	}
	if (cp < 0x800) {
		out[0] = (char)(0xC0 | (cp >> 6));
		out[1] = (char)(0x80 | (cp & 0x3F));
		return 2;
	}
	if (cp < 0x10000) {
		out[0] = (char)(0xE0 | (cp >> 12));
		out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
		out[2] = (char)(0x80 | (cp & 0x3F));
		return 3;
	}
	out[0] = (char)(0xF0 | (cp >> 18));
	out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
	out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
	out[3] = (char)(0x80 | (cp & 0x3F));
	return 4;
}

/* llama.cpp's unicode_cpts_from_utf8: a malformed or truncated sequence becomes U+FFFD and
 * consumes one byte. Overlong forms are accepted as llama.cpp accepts them. */
static uint32_t utf8_next(const unsigned char *s, size_t n, size_t *pos)
{
	size_t i = *pos;
	unsigned char c = s[i];
	if (c < 0x80) {
		*pos = i + 1;
		return c;
	}
	size_t k = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
	if (k == 0 || i + k > n)
		goto bad;
	uint32_t cp = c & (k == 2 ? 0x1F : k == 3 ? 0x0F : 0x07);
	for (size_t j = 1; j < k; j++) {
		if ((s[i + j] & 0xC0) != 0x80)
			goto bad;
		cp = (cp << 6) | (s[i + j] & 0x3F);
	}
	*pos = i + k;
	return cp;
bad:
	*pos = i + 1;
	return 0xFFFD;
}

/* ---- loading ---- */

static int get_str_array(const struct wf_kv_set *kv, const char *key, bool required,
                         const struct wf_kv_array **ret, struct wf_diag *diag)
{
	const struct wf_kv *e = wf_kv_find(kv, key);
	if (!e) {
		if (required)
			return wf_diag_set(diag, WF_ENOT_FOUND, "the model has no %s", key);
		*ret = NULL;
		return 0;
	}
	if (e->v.type != WF_KV_ARRAY || e->v.u.arr.elem != WF_KV_STRING)
		return wf_diag_set(diag, WF_EFORMAT, "%s is not an array of strings", key);
	*ret = &e->v.u.arr;
	return 0;
}

/* An optional token id key: absent keeps *id; a value outside the vocabulary keeps it too
 * (llama.cpp warns and uses the default). */
static int get_id(const struct wf_kv_set *kv, const char *key, uint32_t n, int32_t *id,
                  struct wf_diag *diag)
{
	uint64_t v;
	int rc = wf_kv_get_u64(kv, key, &v);
	if (rc == WF_ENOT_FOUND)
		return 0;
	if (rc < 0)
		return wf_diag_set(diag, WF_EFORMAT, "%s is not an unsigned integer", key);
	if (v < n)
		*id = (int32_t)v;
	return 0;
}

static int get_flag(const struct wf_kv_set *kv, const char *key, bool *flag, struct wf_diag *diag)
{
	bool v;
	int rc = wf_kv_get_bool(kv, key, &v);
	if (rc == WF_ENOT_FOUND)
		return 0;
	if (rc < 0)
		return wf_diag_set(diag, WF_EFORMAT, "%s is not a boolean", key);
	*flag = v;
	return 0;
}

static int cmp_special(const void *a, const void *b, void *arg)
{
	const struct wf_tokenizer *t = arg;
	uint32_t la = t->tokens[*(const int32_t *)a].len;
	uint32_t lb = t->tokens[*(const int32_t *)b].len;
	if (la != lb)
		return la > lb ? -1 : 1;
	/* llama.cpp's std::sort leaves equal lengths in an unspecified order; ids make ours fixed
	 */
	return *(const int32_t *)a < *(const int32_t *)b ? -1 : 1;
}

static int load_merges(struct wf_tokenizer *t, const struct wf_kv_set *kv, struct wf_diag *diag)
{
	const struct wf_kv_array *m = NULL;
	int rc = get_str_array(kv, "tokenizer.ggml.merges", true, &m, diag);
	if (rc < 0)
		return rc;
	if (m->n > MAX_TOKENS)
		return wf_diag_set(diag, WF_ELIMIT, "tokenizer.ggml.merges has %llu entries",
		                   (unsigned long long)m->n);
	t->merge_keys = calloc(m->n ? m->n : 1, sizeof(char *));
	if (!t->merge_keys)
		return -ENOMEM;
	rc = smap_init(&t->merges, (uint32_t)m->n);
	if (rc < 0)
		return rc;
	for (uint64_t i = 0; i < m->n; i++) {
		/* llama.cpp splits at the first space after position 0; a merge without one becomes
		 * the pair ("", ""), which only the first such merge claims */
		const struct wf_kv_str *w = &m->u.strs[i];
		const char *sp = w->n > 1 ? memchr(w->s + 1, ' ', w->n - 1) : NULL;
		char *key = sp ? strndup(w->s, w->n) : strdup(" ");
		if (!key)
			return -ENOMEM;
		t->merge_keys[t->n_merge_keys++] = key;
		smap_put(&t->merges, key, (uint32_t)strlen(key), (int32_t)i);
	}
	return 0;
}

int wf_tokenizer_create(const struct wf_kv_set *kv, struct wf_tokenizer **ret_tok,
                        struct wf_diag *diag)
{
	struct wf_tokenizer *t = calloc(1, sizeof(*t));
	const char *model = NULL;
	int rc;
	if (!t)
		return -ENOMEM;

	rc = wf_kv_get_str(kv, "tokenizer.ggml.model", &model);
	if (rc == WF_ENOT_FOUND) {
		rc = wf_diag_set(diag, WF_ENOT_FOUND, "the model has no tokenizer.ggml.model");
		goto err;
	}
	if (rc < 0) {
		rc = wf_diag_set(diag, WF_EFORMAT, "tokenizer.ggml.model is not a string");
		goto err;
	}
	if (strcmp(model, "llama") == 0) {
		/* llama.cpp's SPM defaults, before the metadata overrides them */
		t->kind = WF_TOKENIZER_SPM;
		t->bos = 1;
		t->eos = 2;
		t->unk = 0;
		t->add_bos = true;
		t->add_space_prefix = true;
	} else if (strcmp(model, "gpt2") == 0) {
		const char *pre = NULL;
		t->kind = WF_TOKENIZER_BPE;
		t->bos = 11;
		t->eos = 11;
		t->unk = WF_TOKEN_NULL;
		t->clean_spaces = true;
		rc = wf_kv_get_str(kv, "tokenizer.ggml.pre", &pre);
		if (rc == 0 && strcmp(pre, "default") != 0) {
			rc = wf_diag_set(
			    diag, WF_EUNSUPPORTED,
			    "tokenizer.ggml.pre '%s': only the default pre-tokenizer is supported",
			    pre);
			goto err;
		}
		if (rc < 0 && rc != WF_ENOT_FOUND) {
			rc = wf_diag_set(diag, WF_EFORMAT, "tokenizer.ggml.pre is not a string");
			goto err;
		}
	} else {
		rc = wf_diag_set(diag, WF_EUNSUPPORTED,
		                 "unknown tokenizer.ggml.model '%s' (supported: llama, gpt2)",
		                 model);
		goto err;
	}
	rc = get_flag(kv, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix, diag);
	if (rc < 0)
		goto err;

	const struct wf_kv_array *toks = NULL, *scores = NULL, *types = NULL;
	rc = get_str_array(kv, "tokenizer.ggml.tokens", true, &toks, diag);
	if (rc < 0)
		goto err;
	if (toks->n == 0 || toks->n > MAX_TOKENS) {
		rc = wf_diag_set(diag, toks->n ? WF_ELIMIT : WF_EFORMAT,
		                 "tokenizer.ggml.tokens has %llu entries",
		                 (unsigned long long)toks->n);
		goto err;
	}
	t->n = (uint32_t)toks->n;
	const struct wf_kv *e = wf_kv_find(kv, "tokenizer.ggml.scores");
	if (e) {
		if (e->v.type != WF_KV_ARRAY ||
		    (e->v.u.arr.elem != WF_KV_F32 && e->v.u.arr.elem != WF_KV_I32)) {
			rc = wf_diag_set(diag, WF_EFORMAT,
			                 "tokenizer.ggml.scores is not an f32 or i32 array");
			goto err;
		}
		scores = &e->v.u.arr;
		if (scores->n < t->n) {
			rc = wf_diag_set(diag, WF_EFORMAT,
			                 "tokenizer.ggml.scores has %llu entries for %u tokens",
			                 (unsigned long long)scores->n, t->n);
			goto err;
		}
	}
	e = wf_kv_find(kv, "tokenizer.ggml.token_type");
	if (e) {
		if (e->v.type != WF_KV_ARRAY || e->v.u.arr.elem != WF_KV_I32) {
			rc = wf_diag_set(diag, WF_EFORMAT,
			                 "tokenizer.ggml.token_type is not an i32 array");
			goto err;
		}
		types = &e->v.u.arr;
		if (types->n < t->n) {
			rc = wf_diag_set(diag, WF_EFORMAT,
			                 "tokenizer.ggml.token_type has %llu entries for %u tokens",
			                 (unsigned long long)types->n, t->n);
			goto err;
		}
	}

	t->tokens = calloc(t->n, sizeof(*t->tokens));
	t->specials = calloc(t->n, sizeof(*t->specials));
	if (!t->tokens || !t->specials) {
		rc = -ENOMEM;
		goto err;
	}
	rc = smap_init(&t->by_text, t->n);
	if (rc < 0)
		goto err;
	for (uint32_t i = 0; i < t->n; i++) {
		struct token *k = &t->tokens[i];
		const struct wf_kv_str *s = &toks->u.strs[i];
		if (s->n == 0) {
			/* llama.cpp names empty tokens so that they stay distinct */
			if (asprintf(&k->text, "[EMPTY_%u]", i) < 0)
				k->text = NULL;
		} else {
			k->text = malloc(s->n + 1);
			if (k->text) {
				memcpy(k->text, s->s, s->n);
				k->text[s->n] = 0;
			}
		}
		if (!k->text) {
			rc = -ENOMEM;
			goto err;
		}
		k->len = s->n ? (uint32_t)s->n : (uint32_t)strlen(k->text);
		if (scores)
			k->score = scores->elem == WF_KV_F32
			               ? ((const float *)scores->u.scalars)[i]
			               : (float)((const int32_t *)scores->u.scalars)[i];
		k->type = WF_TOKEN_TYPE_NORMAL;
		if (types) {
			int32_t ty = ((const int32_t *)types->u.scalars)[i];
			k->type = ty >= WF_TOKEN_TYPE_NORMAL && ty <= WF_TOKEN_TYPE_BYTE
			              ? ty
			              : WF_TOKEN_TYPE_UNDEFINED;
		}
		/* llama.cpp asserts that texts are unique; a duplicate makes ids ambiguous */
		if (!smap_put(&t->by_text, k->text, k->len, (int32_t)i)) {
			rc = wf_diag_set(diag, WF_EFORMAT,
			                 "tokenizer.ggml.tokens: token %u '%s' is a duplicate", i,
			                 k->text);
			goto err;
		}
		if (k->type == WF_TOKEN_TYPE_CONTROL || k->type == WF_TOKEN_TYPE_USER_DEFINED ||
		    k->type == WF_TOKEN_TYPE_UNKNOWN)
			t->specials[t->n_specials++] = (int32_t)i;
	}
	if (t->kind == WF_TOKENIZER_BPE) {
		rc = load_merges(t, kv, diag);
		if (rc < 0)
			goto err;
	}

	/* defaults outside the vocabulary are disabled, as llama.cpp does */
	if (t->bos >= (int32_t)t->n)
		t->bos = WF_TOKEN_NULL;
	if (t->eos >= (int32_t)t->n)
		t->eos = WF_TOKEN_NULL;
	if (t->unk >= (int32_t)t->n)
		t->unk = WF_TOKEN_NULL;
	if ((rc = get_id(kv, "tokenizer.ggml.bos_token_id", t->n, &t->bos, diag)) < 0 ||
	    (rc = get_id(kv, "tokenizer.ggml.eos_token_id", t->n, &t->eos, diag)) < 0 ||
	    (rc = get_id(kv, "tokenizer.ggml.unknown_token_id", t->n, &t->unk, diag)) < 0 ||
	    (rc = get_flag(kv, "tokenizer.ggml.add_bos_token", &t->add_bos, diag)) < 0 ||
	    (rc = get_flag(kv, "tokenizer.ggml.add_eos_token", &t->add_eos, diag)) < 0)
		goto err;

	qsort_r(t->specials, t->n_specials, sizeof(*t->specials), cmp_special, t);
	*ret_tok = t;
	return 0;
err:
	wf_tokenizer_destroy(t);
	return rc;
}

void wf_tokenizer_destroy(struct wf_tokenizer *tok)
{
	if (!tok)
		return;
	if (tok->tokens)
		for (uint32_t i = 0; i < tok->n; i++)
			free(tok->tokens[i].text);
	for (uint32_t i = 0; i < tok->n_merge_keys; i++)
		free(tok->merge_keys[i]);
	free(tok->merge_keys);
	free(tok->tokens);
	free(tok->specials);
	free(tok->by_text.slots);
	free(tok->merges.slots);
	free(tok);
}

enum wf_tokenizer_kind wf_tokenizer_kind(const struct wf_tokenizer *tok)
{
	return tok->kind;
}
uint32_t wf_tokenizer_n_vocab(const struct wf_tokenizer *tok)
{
	return tok->n;
}
int32_t wf_tokenizer_bos(const struct wf_tokenizer *tok)
{
	return tok->bos;
}
int32_t wf_tokenizer_eos(const struct wf_tokenizer *tok)
{
	return tok->eos;
}

const char *wf_tokenizer_text(const struct wf_tokenizer *tok, int32_t id)
{
	return id >= 0 && (uint32_t)id < tok->n ? tok->tokens[id].text : NULL;
}

/* ---- shared merge machinery ---- */

struct sym {
	int32_t prev, next;
	const char *text;
	uint32_t n;
};

struct bigram {
	int32_t left, right;
	float score; /* SPM: higher first; BPE: the rank, lower first (stored negated) */
	uint32_t size;
};

struct heap {
	struct bigram *v;
	size_t n, cap;
};

/* a before b: higher score, then the leftmost pair (both llama.cpp queues' orders) */
static bool before(const struct bigram *a, const struct bigram *b)
{
	return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static int heap_push(struct heap *h, struct bigram b)
{
	if (grow((void **)&h->v, &h->cap, h->n, sizeof(*h->v), 64) < 0)
		return -ENOMEM;
	size_t i = h->n++;
	while (i > 0 && before(&b, &h->v[(i - 1) / 2])) {
		h->v[i] = h->v[(i - 1) / 2];
		i = (i - 1) / 2;
	}
	h->v[i] = b;
	return 0;
}

static struct bigram heap_pop(struct heap *h)
{
	struct bigram top = h->v[0], last = h->v[--h->n];
	size_t i = 0;
	for (;;) {
		size_t c = 2 * i + 1;
		if (c >= h->n)
			break;
		if (c + 1 < h->n && before(&h->v[c + 1], &h->v[c]))
			c++;
		if (!before(&h->v[c], &last))
			break;
		h->v[i] = h->v[c];
		i = c;
	}
	if (h->n)
		h->v[i] = last;
	return top;
}

struct session {
	const struct wf_tokenizer *t;
	struct sym *syms;
	size_t n_syms, cap_syms;
	struct heap heap;
	struct buf scratch;
};

static int split_symbols(struct session *s, const char *text, size_t len)
{
	s->n_syms = 0;
	if (len > s->cap_syms) {
		struct sym *v = realloc(s->syms, len * sizeof(*v));
		if (!v)
			return -ENOMEM;
		s->syms = v;
		s->cap_syms = len;
	}
	for (size_t off = 0; off < len;) {
		size_t n = utf8_len((unsigned char)text[off]);
		if (n > len - off)
			n = len - off;
		struct sym *y = &s->syms[s->n_syms];
		y->text = text + off;
		y->n = (uint32_t)n;
		y->prev = (int32_t)s->n_syms - 1;
		off += n;
		y->next = off == len ? -1 : (int32_t)s->n_syms + 1;
		s->n_syms++;
	}
	return 0;
}

static int add_bigram(struct session *s, int32_t left, int32_t right)
{
	if (left < 0 || right < 0)
		return 0;
	const struct sym *l = &s->syms[left], *r = &s->syms[right];
	uint32_t size = l->n + r->n;
	struct bigram b = {.left = left, .right = right, .size = size};
	if (s->t->kind == WF_TOKENIZER_SPM) {
		int32_t id = smap_get(&s->t->by_text, l->text, size); /* adjacent: one span */
		if (id == WF_TOKEN_NULL)
			return 0;
		b.score = s->t->tokens[id].score;
	} else {
		s->scratch.n = 0;
		int rc;
		if ((rc = buf_put(&s->scratch, l->text, l->n)) < 0 ||
		    (rc = buf_put(&s->scratch, " ", 1)) < 0 ||
		    (rc = buf_put(&s->scratch, r->text, r->n)) < 0)
			return rc;
		int32_t rank = smap_get(&s->t->merges, s->scratch.p, (uint32_t)s->scratch.n);
		if (rank == WF_TOKEN_NULL)
			return 0;
		b.score = -(float)rank;
		/* ranks above 2^24 would lose precision as floats; MAX_TOKENS caps merges there */
	}
	return heap_push(&s->heap, b);
}

/* Merges the symbols of text[0..len) until no pair is left (the loop both llama.cpp sessions
 * share). A queued pair is stale once either side merged elsewhere: its size no longer adds up. */
static int merge_all(struct session *s, const char *text, size_t len)
{
	int rc = split_symbols(s, text, len);
	if (rc < 0)
		return rc;
	s->heap.n = 0;
	for (size_t i = 1; i < s->n_syms; i++)
		if ((rc = add_bigram(s, (int32_t)i - 1, (int32_t)i)) < 0)
			return rc;
	while (s->heap.n) {
		struct bigram b = heap_pop(&s->heap);
		struct sym *l = &s->syms[b.left], *r = &s->syms[b.right];
		if (l->n == 0 || r->n == 0 || l->n + r->n != b.size)
			continue;
		l->n += r->n;
		r->n = 0;
		l->next = r->next;
		if (r->next >= 0)
			s->syms[r->next].prev = b.left;
		if ((rc = add_bigram(s, l->prev, b.left)) < 0 ||
		    (rc = add_bigram(s, b.left, l->next)) < 0)
			return rc;
	}
	return 0;
}

/* llama.cpp's byte_to_token for SPM: <0xXX>, else the one-byte token; else an error (llama.cpp
 * throws here). */
static int spm_byte_token(const struct wf_tokenizer *t, unsigned char c, int32_t *ret,
                          struct wf_diag *diag)
{
	static const char hex[] = "0123456789ABCDEF";
	char b[6] = {'<', '0', 'x', hex[c >> 4], hex[c & 15], '>'};
	int32_t id = smap_get(&t->by_text, b, 6);
	if (id == WF_TOKEN_NULL)
		id = smap_get(&t->by_text, (const char *)&c, 1);
	if (id == WF_TOKEN_NULL)
		return wf_diag_set(diag, WF_ENOT_FOUND, "byte 0x%02X has no token (no <0x%02X>)", c,
		                   c);
	*ret = id;
	return 0;
}

static int spm_fragment(struct session *s, const char *frag, size_t len, bool prefix,
                        struct ids *out, struct wf_diag *diag)
{
	struct buf text = {0};
	int rc = 0;
	static const char ws[3] = {(char)0xE2, (char)0x96, (char)0x81}; /* U+2581 */
	if (prefix && (rc = buf_put(&text, ws, 3)) < 0)
		goto out;
	for (size_t i = 0; i < len; i++)
		if ((rc = frag[i] == ' ' ? buf_put(&text, ws, 3) : buf_put(&text, frag + i, 1)) < 0)
			goto out;
	if (text.n == 0)
		goto out;
	if ((rc = merge_all(s, text.p, text.n)) < 0)
		goto out;
	for (int32_t i = 0; i != -1; i = s->syms[i].next) {
		const struct sym *y = &s->syms[i];
		int32_t id = smap_get(&s->t->by_text, y->text, y->n);
		if (id != WF_TOKEN_NULL) {
			if ((rc = ids_push(out, id)) < 0)
				goto out;
			continue;
		}
		/* A merged symbol is always a token; only single characters fall back to bytes, so
		 * llama.cpp's rev_merge re-segmentation never applies here. */
		for (uint32_t j = 0; j < y->n; j++) {
			if ((rc = spm_byte_token(s->t, (unsigned char)y->text[j], &id, diag)) < 0 ||
			    (rc = ids_push(out, id)) < 0)
				goto out;
		}
	}
out:
	free(text.p);
	return rc;
}

/* ---- BPE pre-tokenizer (llama.cpp's default regex list) ---- */

enum {
	C_OTHER = WF_UCLASS_OTHER,
	C_LETTER = WF_UCLASS_LETTER,
	C_NUMBER = WF_UCLASS_NUMBER,
	C_PUNCT = WF_UCLASS_PUNCT,
	C_SPACE = WF_UCLASS_SPACE,
	C_NONE = WF_UCLASS_UNASSIGNED,
};

static int cclass(uint32_t c)
{
	return (int)wf__unicode_class(c);
}

struct cps {
	uint32_t *cp;
	int *cls;
	size_t n;
};

struct spans {
	size_t *a; /* boundaries: segment i is [a[i], a[i+1]) */
	size_t n, cap;
};

static int spans_push(struct spans *s, size_t at)
{
	if (s->n && s->a[s->n - 1] == at)
		return 0;
	if (grow((void **)&s->a, &s->cap, s->n, sizeof(*s->a), 64) < 0)
		return -ENOMEM;
	s->a[s->n++] = at;
	return 0;
}

/* "[\p{P}\$\+<=>\^~\|]+": runs of punctuation and these symbols split from the rest. */
static bool pass1(const struct cps *c, size_t i)
{
	uint32_t x = c->cp[i];
	return c->cls[i] == C_PUNCT || x == '$' || x == '+' || x == '<' || x == '=' || x == '>' ||
	       x == '^' || x == '~' || x == '|';
}

/* One segment [b, e) through llama.cpp's hand-written GPT-2 pattern:
 * 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static int gpt2_split(const struct cps *c, size_t b, size_t e, struct spans *out)
{
	size_t pos = b;
	int rc;
#define CLS(i) ((i) < e ? c->cls[i] : -1)
#define CP(i)  ((i) < e ? c->cp[i] : 0xFFFFFFFFu)
	while (pos < e) {
		uint32_t x = c->cp[pos];
		if (x == '\'' && pos + 1 < e) {
			uint32_t y = CP(pos + 1);
			if (y == 's' || y == 't' || y == 'm' || y == 'd') {
				pos += 2;
				goto emit;
			}
			if (pos + 2 < e) {
				uint32_t z = CP(pos + 2);
				if ((y == 'r' && z == 'e') || (y == 'v' && z == 'e') ||
				    (y == 'l' && z == 'l')) {
					pos += 3;
					goto emit;
				}
			}
		}
		int k = x == ' ' ? CLS(pos + 1) : c->cls[pos];
		if (k == C_LETTER || k == C_NUMBER) {
			pos += x == ' ';
			while (CLS(pos) == k)
				pos++;
			goto emit;
		}
		if (k == C_PUNCT || k == C_OTHER) {
			pos += x == ' ';
			while (CLS(pos) == C_PUNCT || CLS(pos) == C_OTHER)
				pos++;
			goto emit;
		}
		size_t nws = 0;
		while (CLS(pos + nws) == C_SPACE)
			nws++;
		if (nws > 1 && pos + nws < e) {
			pos += nws - 1;
			goto emit;
		}
		pos += nws ? nws : 1;
	emit:
		if ((rc = spans_push(out, pos)) < 0)
			return rc;
	}
#undef CLS
#undef CP
	return 0;
}

/* Runs of the class accepted by match() become their own segments, as llama.cpp's regex split
 * keeps both the matches and the text between them. digits3: "[0-9][0-9][0-9]" (groups of three
 * from the left inside a run). */
static int split_runs(const struct cps *c, const struct spans *in, struct spans *out, int mode)
{
	int rc;
	if ((rc = spans_push(out, 0)) < 0)
		return rc;
	for (size_t s = 0; s + 1 < in->n; s++) {
		size_t b = in->a[s], e = in->a[s + 1];
		if (mode == 1) {
			if ((rc = gpt2_split(c, b, e, out)) < 0)
				return rc;
			continue;
		}
		size_t i = b;
		while (i < e) {
			size_t j = i;
			if (mode == 0) {
				bool m = pass1(c, i);
				while (j < e && pass1(c, j) == m)
					j++;
			} else if (mode == 2) {
				bool m = c->cls[i] == C_NUMBER;
				while (j < e && (c->cls[j] == C_NUMBER) == m)
					j++;
			} else {
#define D(k) (c->cp[k] >= '0' && c->cp[k] <= '9')
				if (i + 3 <= e && D(i) && D(i + 1) && D(i + 2))
					j = i + 3;
				else
					while (j < e &&
					       !(j + 3 <= e && D(j) && D(j + 1) && D(j + 2)))
						j++;
#undef D
			}
			if ((rc = spans_push(out, j)) < 0)
				return rc;
			i = j;
		}
	}
	return 0;
}

/* GPT-2's byte-to-unicode map: printable bytes stand for themselves, the others for 256+n. */
static uint32_t byte_to_cp(unsigned char b)
{
	if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)
		return b;
	uint32_t n = 0;
	for (unsigned x = 0; x < b; x++)
		if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174))
			n++;
	return 256 + n;
}

static int cp_to_byte(uint32_t cp)
{
	if (cp < 256)
		return (cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || cp >= 174 ? (int)cp
		                                                                        : -1;
	uint32_t n = 0;
	for (unsigned x = 0; x < 256; x++)
		if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174))
			if (256 + n++ == cp)
				return (int)x;
	return -1;
}

static int bpe_fragment(struct session *s, const char *frag, size_t len, struct ids *out)
{
	struct cps c = {0};
	struct spans sp[2] = {{0}};
	struct buf word = {0};
	int rc = -ENOMEM;
	c.cp = malloc((len + 1) * sizeof(*c.cp));
	c.cls = malloc((len + 1) * sizeof(*c.cls));
	if (!c.cp || !c.cls)
		goto out;
	for (size_t pos = 0; pos < len;) {
		c.cp[c.n] = utf8_next((const unsigned char *)frag, len, &pos);
		c.cls[c.n] = cclass(c.cp[c.n]);
		c.n++;
	}
	if ((rc = spans_push(&sp[0], 0)) < 0 || (rc = spans_push(&sp[0], c.n)) < 0)
		goto out;
	for (int mode = 0; mode < 4; mode++) {
		struct spans *in = &sp[mode & 1], *o = &sp[!(mode & 1)];
		o->n = 0;
		if ((rc = split_runs(&c, in, o, mode)) < 0)
			goto out;
	}
	/* after four passes the result is back in sp[0] */
	for (size_t w = 0; w + 1 < sp[0].n; w++) {
		word.n = 0;
		for (size_t i = sp[0].a[w]; i < sp[0].a[w + 1]; i++) {
			char u[4], m[4];
			size_t nu = utf8_put(c.cp[i], u);
			for (size_t j = 0; j < nu; j++) {
				size_t nm = utf8_put(byte_to_cp((unsigned char)u[j]), m);
				if ((rc = buf_put(&word, m, nm)) < 0)
					goto out;
			}
		}
		if ((rc = merge_all(s, word.p, word.n)) < 0)
			goto out;
		for (int32_t i = 0; i != -1 && s->n_syms; i = s->syms[i].next) {
			const struct sym *y = &s->syms[i];
			int32_t id = smap_get(&s->t->by_text, y->text, y->n);
			if (id != WF_TOKEN_NULL) {
				if ((rc = ids_push(out, id)) < 0)
					goto out;
				continue;
			}
			/* llama.cpp tries each raw byte of the mapped text as a token and drops
			 * those that are not */
			for (uint32_t j = 0; j < y->n; j++) {
				id = smap_get(&s->t->by_text, y->text + j, 1);
				if (id != WF_TOKEN_NULL && (rc = ids_push(out, id)) < 0)
					goto out;
			}
		}
	}
	rc = 0;
out:
	free(c.cp);
	free(c.cls);
	free(sp[0].a);
	free(sp[1].a);
	free(word.p);
	return rc;
}

/* ---- special-token partition and the top level ---- */

struct frag {
	size_t off, len;
	int32_t id; /* WF_TOKEN_NULL: raw text */
};

struct frags {
	struct frag *v;
	size_t n, cap;
};

static int frags_insert(struct frags *f, size_t at, struct frag x)
{
	if (grow((void **)&f->v, &f->cap, f->n, sizeof(*f->v), 16) < 0)
		return -ENOMEM;
	memmove(f->v + at + 1, f->v + at, (f->n - at) * sizeof(*f->v));
	f->v[at] = x;
	f->n++;
	return 0;
}

static const char *find_bytes(const char *h, size_t hn, const char *n, size_t nn)
{
	return nn <= hn ? memmem(h, hn, n, nn) : NULL;
}

/* llama.cpp's tokenizer_st_partition: for each special token, longest first, every raw fragment
 * is cut at each of its occurrences, left to right. */
static int partition(const struct wf_tokenizer *t, const char *text, struct frags *f,
                     bool parse_special)
{
	int rc;
	for (uint32_t s = 0; s < t->n_specials; s++) {
		int32_t id = t->specials[s];
		const struct token *k = &t->tokens[id];
		if (!parse_special && k->type != WF_TOKEN_TYPE_USER_DEFINED)
			continue;
		for (size_t i = 0; i < f->n; i++) {
			if (f->v[i].id != WF_TOKEN_NULL)
				continue;
			struct frag r = f->v[i];
			const char *m = find_bytes(text + r.off, r.len, k->text, k->len);
			if (!m)
				continue;
			size_t at = (size_t)(m - text);
			struct frag left = {r.off, at - r.off, WF_TOKEN_NULL};
			struct frag tokf = {at, k->len, id};
			struct frag right = {at + k->len, r.off + r.len - at - k->len,
			                     WF_TOKEN_NULL};
			size_t j = i;
			if (left.len) {
				f->v[j++] = left;
				if ((rc = frags_insert(f, j, tokf)) < 0)
					return rc;
			} else {
				f->v[j] = tokf;
			}
			if (right.len) {
				if ((rc = frags_insert(f, j + 1, right)) < 0)
					return rc;
			}
			i = j; /* the loop's i++ moves on to the right part, searched again */
		}
	}
	return 0;
}

int wf_tokenizer_encode(const struct wf_tokenizer *tok, const char *text, size_t len,
                        bool add_special, bool parse_special, int32_t **ret_ids, size_t *ret_n,
                        struct wf_diag *diag)
{
	struct frags f = {0};
	struct ids out = {0};
	struct session s = {.t = tok};
	int rc = 0;
	if (len && (rc = frags_insert(&f, 0, (struct frag){0, len, WF_TOKEN_NULL})) < 0)
		goto out;
	if ((rc = partition(tok, text, &f, parse_special)) < 0)
		goto out;
	if (add_special && tok->add_bos && tok->bos != WF_TOKEN_NULL &&
	    (rc = ids_push(&out, tok->bos)) < 0)
		goto out;
	bool prev_special = true; /* SPM: the text's start counts as after a special token */
	for (size_t i = 0; i < f.n; i++) {
		if (f.v[i].id != WF_TOKEN_NULL) {
			if ((rc = ids_push(&out, f.v[i].id)) < 0)
				goto out;
			prev_special = true;
			continue;
		}
		if (tok->kind == WF_TOKENIZER_SPM)
			rc = spm_fragment(&s, text + f.v[i].off, f.v[i].len,
			                  tok->add_space_prefix && prev_special, &out, diag);
		else
			rc = bpe_fragment(&s, text + f.v[i].off, f.v[i].len, &out);
		if (rc < 0)
			goto out;
		prev_special = false;
	}
	if (add_special && tok->add_eos && tok->eos != WF_TOKEN_NULL &&
	    (rc = ids_push(&out, tok->eos)) < 0)
		goto out;
	*ret_ids = out.v;
	*ret_n = out.n;
	out.v = NULL;
out:
	free(out.v);
	free(f.v);
	free(s.syms);
	free(s.heap.v);
	free(s.scratch.p);
	return rc;
}

/* ---- pieces and detokenization ---- */

static int piece_into(const struct wf_tokenizer *t, int32_t id, bool special, int lstrip,
                      struct buf *b)
{
	if (id < 0 || (uint32_t)id >= t->n)
		return WF_EINVAL;
	const struct token *k = &t->tokens[id];
	size_t start = b->n;
	int rc = 0;
	switch (k->type) {
	case WF_TOKEN_TYPE_CONTROL:
	case WF_TOKEN_TYPE_UNKNOWN:
		if (special)
			rc = buf_put(b, k->text, k->len);
		break;
	case WF_TOKEN_TYPE_USER_DEFINED:
		rc = buf_put(b, k->text, k->len);
		break;
	case WF_TOKEN_TYPE_NORMAL:
		if (t->kind == WF_TOKENIZER_SPM) {
			for (uint32_t i = 0; i < k->len && rc == 0; i++) {
				if (i + 2 < k->len && (unsigned char)k->text[i] == 0xE2 &&
				    (unsigned char)k->text[i + 1] == 0x96 &&
				    (unsigned char)k->text[i + 2] == 0x81) {
					rc = buf_put(b, " ", 1);
					i += 2;
				} else {
					rc = buf_put(b, k->text + i, 1);
				}
			}
		} else {
			/* llama_decode_text: each character back to its byte; one outside the map
			 * is written as llama.cpp writes it */
			for (size_t pos = 0; pos < k->len && rc == 0;) {
				size_t p0 = pos;
				uint32_t cp =
				    utf8_next((const unsigned char *)k->text, k->len, &pos);
				int byte = cp_to_byte(cp);
				if (byte >= 0) {
					char c = (char)byte;
					rc = buf_put(b, &c, 1);
				} else {
					char u[4], hx[3];
					size_t nu = utf8_put(cp, u);
					(void)p0;
					rc = buf_put(b, "[UNK_BYTE_0x", 12);
					for (size_t j = 0; j < nu && rc == 0; j++) {
						snprintf(hx, sizeof(hx), "%02x",
						         (unsigned char)u[j]);
						rc = buf_put(b, hx, 2);
					}
					if (rc == 0)
						rc = buf_put(b, k->text, k->len);
					if (rc == 0)
						rc = buf_put(b, "]", 1);
				}
			}
		}
		break;
	case WF_TOKEN_TYPE_BYTE: {
		/* llama.cpp: strtol of the two characters after "<0x" */
		unsigned v = 0;
		for (uint32_t i = 3; i < 5 && i < k->len; i++) {
			char ch = k->text[i];
			int d = ch >= '0' && ch <= '9'   ? ch - '0'
			        : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
			        : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10
			                                 : -1;
			if (d < 0)
				break;
			v = v * 16 + (unsigned)d;
		}
		char c = (char)v;
		rc = buf_put(b, &c, 1);
		break;
	}
	default: /* UNUSED, UNDEFINED: nothing, as llama.cpp */
		break;
	}
	if (rc < 0)
		return rc;
	size_t drop = 0;
	while ((int)drop < lstrip && start + drop < b->n && b->p[start + drop] == ' ')
		drop++;
	if (drop) {
		memmove(b->p + start, b->p + start + drop, b->n - start - drop);
		b->n -= drop;
		b->p[b->n] = 0;
	}
	return 0;
}

int64_t wf_tokenizer_piece(const struct wf_tokenizer *tok, int32_t id, bool special, int lstrip,
                           char *buf, size_t cap)
{
	struct buf b = {0};
	int rc = piece_into(tok, id, special, lstrip, &b);
	if (rc < 0) {
		free(b.p);
		return rc;
	}
	if (b.n && cap)
		memcpy(buf, b.p, b.n < cap ? b.n : cap);
	int64_t n = (int64_t)b.n;
	free(b.p);
	return n;
}

/* llama.cpp's clean_spaces passes for BPE output: " ?", " !", " .", " ," lose the space; a lone
 * "'" between spaces loses both; " 's", " 'm", " 're", " 've" lose the space. */
static void clean_spaces(struct buf *b)
{
	char *t = b->p;
	size_t total, n;
	if (!b->n)
		return;
	n = b->n;
	total = 1;
	for (size_t i = 1; i < n; i++) {
		char x = t[i];
		if (t[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ','))
			total--;
		t[total++] = x;
	}
	n = total;
	total = 1;
	for (size_t i = 1; i < n; i++) {
		char x = t[i];
		if (x == '\'' && i + 1 < n && t[i - 1] == ' ' && t[i + 1] == ' ') {
			total--;
			t[++i] = 0;
		}
		t[total++] = x;
	}
	n = total;
	total = 1;
	for (size_t i = 1; i < n; i++) {
		char x = t[i];
		if (t[i - 1] == ' ' && x == '\'' && i + 1 < n) {
			char x1 = t[i + 1];
			if (x1 == 's' || x1 == 'm')
				total--;
			else if (x1 != 't' && x1 != 'd' && i + 2 < n) {
				char x2 = t[i + 2];
				if ((x1 == 'r' && x2 == 'e') || (x1 == 'v' && x2 == 'e'))
					total--;
			}
		}
		t[total++] = x;
	}
	b->n = total;
	t[total] = 0;
}

int wf_tokenizer_decode(const struct wf_tokenizer *tok, const int32_t *ids, size_t n,
                        bool remove_special, bool unparse_special, char **ret_text, size_t *ret_len)
{
	struct buf b = {0};
	int rc;
	bool remove_space = tok->add_space_prefix;
	if (remove_special && tok->add_bos && n > 0 && ids[0] == tok->bos) {
		remove_space = false; /* llama.cpp keeps the space after a dropped BOS */
		n--;
		ids++;
	}
	if (remove_special && tok->add_eos && n > 0 && ids[n - 1] == tok->eos)
		n--;
	if ((rc = buf_put(&b, "", 0)) < 0)
		goto err;
	for (size_t i = 0; i < n; i++) {
		if ((rc = piece_into(tok, ids[i], unparse_special, remove_space, &b)) < 0)
			goto err;
		remove_space = false;
	}
	if (tok->clean_spaces)
		clean_spaces(&b);
	*ret_text = b.p;
	*ret_len = b.n;
	return 0;
err:
	free(b.p);
	return rc;
}
