/* A SentencePiece-style ("llama") vocabulary that llama.cpp's SPM tokenizer can use.
 *
 * Layout, as in the shared reference models: <unk>=0 (UNKNOWN), <s>=1 and </s>=2 (CONTROL), the
 * 256 byte tokens <0x00>..<0xFF> at 3..258 (BYTE, the fallback for anything else), then merged
 * pieces with score -rank, then filler pieces when the merges run out, and last the single
 * characters (NORMAL). Pieces carry SentencePiece's "▁" (U+2581) for a leading space.
 *
 * The merges come from a small byte-pair training run over the built-in text below: the SPM
 * tokenizer merges adjacent symbols whose concatenation is in the vocabulary, highest score first,
 * so a merge hierarchy learned this way tokenizes common English words into few pieces. */
#include "gen.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SPACE "\xe2\x96\x81" /* ▁ */

/* llama_token_type (llama.h) */
enum {
	TOK_NORMAL = 1,
	TOK_UNKNOWN = 2,
	TOK_CONTROL = 3,
	TOK_BYTE = 6,
};

static const char corpus[] =
    "The quick brown fox jumps over the lazy dog. "
    "A model is a set of weights that turns a list of tokens into a list of scores. "
    "When the machine starts, the agent reads every file and keeps the weights in memory "
    "so that each worker can use them without reading the disk again. "
    "There are many experts in this model, and the router picks a few of them for each token. "
    "It is not a real language model, but it has the same shape as one, and that is what we "
    "want to test. Some of the people who work on it would like to make it faster, and some "
    "would like to make it smaller. What do you think about that? I think both are good ideas. "
    "This is the first line of a long story about a small town by the sea, where the wind was "
    "cold and the water was clear. The children played on the sand every morning, and their "
    "parents watched them from the houses on the hill. One day a ship came into the harbor "
    "with a red sail and a crew of strange men who spoke a language nobody could understand. "
    "They stayed for three days, and then they were gone, but the town never forgot them. "
    "Numbers like 1, 2, 3, 10, 42, 100 and 2024 appear in text as well as words. "
    "We can read, write, think, learn, build, run, test and measure; each of these words "
    "should be a single piece after training. Would you like to know more about how it "
    "works? Then read on: the next part explains the design in some detail. "
    "Memory is shared between processes, and the floor holds one copy of each model for the "
    "whole node. The workers attach to it, copy the weights to their devices, and serve "
    "requests from the control plane. If something goes wrong, the system should say what "
    "happened, where it happened, and what to do about it. "
    "He said that she had been there before, but they did not believe him at first. "
    "Good work takes time, and the best things in life are often the simple ones. "
    "Water, fire, earth and air were once thought to be the four elements of the world. "
    "Please open the door, turn on the light, and put the book back on the table. "
    "(This sentence is in parentheses.) \"This one is in quotes,\" said the writer. "
    "Everything should be made as simple as possible, but not simpler. "
    "In the beginning there was nothing, and then there was something, and after that "
    "everything changed for the better or for the worse, depending on who you ask. ";

/* Characters that get their own token, in this order, after everything else. */
static const char *const single_chars[] = {
    SPACE, "a", "b", "c", "d", "e", "f", "g", "h",  "i", "j", "k", "l", "m", "n",
    "o",   "p", "q", "r", "s", "t", "u", "v", "w",  "x", "y", "z", "A", "B", "C",
    "D",   "E", "F", "G", "H", "I", "J", "K", "L",  "M", "N", "O", "P", "Q", "R",
    "S",   "T", "U", "V", "W", "X", "Y", "Z", "0",  "1", "2", "3", "4", "5", "6",
    "7",   "8", "9", ".", ",", "!", "?", "'", "\"", "-", ":", ";", "(", ")",
};
#define N_SINGLE (sizeof(single_chars) / sizeof(single_chars[0]))
_Static_assert(3 + 256 + N_SINGLE == GEN_VOCAB_MIN, "GEN_VOCAB_MIN counts the fixed tokens");

/* ---- string set: piece text -> piece id ----------------------------------------------------- */

struct strset {
	char **keys; /* borrowed from the piece table */
	uint32_t *ids;
	uint32_t cap, n;
};

static uint64_t hash_str(const char *s)
{
	uint64_t h = 0xcbf29ce484222325ull;
	for (; *s; s++)
		h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
	return h;
}

static int strset_find(const struct strset *s, const char *k)
{
	if (!s->cap)
		return -1;
	for (uint32_t i = (uint32_t)hash_str(k) & (s->cap - 1);; i = (i + 1) & (s->cap - 1)) {
		if (!s->keys[i])
			return -1;
		if (strcmp(s->keys[i], k) == 0)
			return (int)s->ids[i];
	}
}

static int strset_add(struct strset *s, char *k, uint32_t id);

static int strset_grow(struct strset *s)
{
	struct strset n = {.cap = s->cap ? s->cap * 2 : 1024};
	n.keys = calloc(n.cap, sizeof(*n.keys));
	n.ids = calloc(n.cap, sizeof(*n.ids));
	if (!n.keys || !n.ids) {
		free(n.keys);
		free(n.ids);
		return -ENOMEM;
	}
	for (uint32_t i = 0; i < s->cap; i++)
		if (s->keys[i])
			strset_add(&n, s->keys[i], s->ids[i]);
	free(s->keys);
	free(s->ids);
	*s = n;
	return 0;
}

static int strset_add(struct strset *s, char *k, uint32_t id)
{
	if ((s->n + 1) * 2 > s->cap) {
		int r = strset_grow(s);
		if (r < 0)
			return r;
	}
	uint32_t i = (uint32_t)hash_str(k) & (s->cap - 1);
	while (s->keys[i])
		i = (i + 1) & (s->cap - 1);
	s->keys[i] = k;
	s->ids[i] = id;
	s->n++;
	return 0;
}

static void strset_fini(struct strset *s)
{
	free(s->keys);
	free(s->ids);
	memset(s, 0, sizeof(*s));
}

/* ---- byte-pair training ---------------------------------------------------------------------- */

struct piece_table {
	char **text;
	uint32_t n, cap;
	struct strset index;
};

static int piece_add(struct piece_table *t, const char *s, size_t len, uint32_t *ret_id)
{
	char *copy = strndup(s, len);
	if (!copy)
		return -ENOMEM;
	int have = strset_find(&t->index, copy);
	if (have >= 0) {
		free(copy);
		*ret_id = (uint32_t)have;
		return 0;
	}
	if (t->n == t->cap) {
		uint32_t cap = t->cap ? t->cap * 2 : 1024;
		char **n = realloc(t->text, cap * sizeof(*n));
		if (!n) {
			free(copy);
			return -ENOMEM;
		}
		t->text = n;
		t->cap = cap;
	}
	int r = strset_add(&t->index, copy, t->n);
	if (r < 0) {
		free(copy);
		return r;
	}
	t->text[t->n] = copy;
	*ret_id = t->n++;
	return 0;
}

static void piece_table_fini(struct piece_table *t)
{
	for (uint32_t i = 0; i < t->n; i++)
		free(t->text[i]);
	free(t->text);
	strset_fini(&t->index);
}

struct word {
	uint32_t *sym; /* piece ids */
	uint32_t n;
	uint32_t count;
};

struct pair_count {
	uint32_t a, b, count;
};

static int cmp_pair(const void *x, const void *y)
{
	const struct pair_count *p = x, *q = y;
	if (p->a != q->a)
		return p->a < q->a ? -1 : 1;
	if (p->b != q->b)
		return p->b < q->b ? -1 : 1;
	return 0;
}

static size_t utf8_len(unsigned char c)
{
	return c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
}

/* Splits the corpus into "▁word" units with their counts, each as a list of character pieces. */
static int load_words(struct piece_table *pt, struct word **ret_words, uint32_t *ret_n)
{
	struct word *words = NULL;
	uint32_t n = 0, cap = 0;
	const char *p = corpus;
	int r = 0;
	char buf[256];
	while (*p) {
		while (*p == ' ')
			p++;
		if (!*p)
			break;
		size_t len = 0;
		memcpy(buf, SPACE, 3);
		len = 3;
		while (*p && *p != ' ' && len < sizeof(buf) - 1)
			buf[len++] = *p++;
		buf[len] = '\0';
		uint32_t i;
		for (i = 0; i < n; i++) {
			/* Rebuild the word text to compare: small corpus, simple search. */
			char tmp[256];
			size_t tl = 0;
			for (uint32_t k = 0; k < words[i].n; k++) {
				size_t sl = strlen(pt->text[words[i].sym[k]]);
				memcpy(tmp + tl, pt->text[words[i].sym[k]], sl);
				tl += sl;
			}
			if (tl == len && memcmp(tmp, buf, len) == 0)
				break;
		}
		if (i < n) {
			words[i].count++;
			continue;
		}
		if (n == cap) {
			cap = cap ? cap * 2 : 256;
			struct word *nw = realloc(words, cap * sizeof(*nw));
			if (!nw) {
				r = -ENOMEM;
				goto fail;
			}
			words = nw;
		}
		struct word *w = &words[n];
		w->sym = malloc(len * sizeof(*w->sym));
		w->n = 0;
		w->count = 1;
		if (!w->sym) {
			r = -ENOMEM;
			goto fail;
		}
		n++;
		for (size_t k = 0; k < len;) {
			size_t cl = utf8_len((unsigned char)buf[k]);
			r = piece_add(pt, buf + k, cl, &w->sym[w->n]);
			if (r < 0)
				goto fail;
			w->n++;
			k += cl;
		}
	}
	*ret_words = words;
	*ret_n = n;
	return 0;
fail:
	for (uint32_t i = 0; i < n; i++)
		free(words[i].sym);
	free(words);
	return r;
}

/* Learns up to max_new new pieces. Each round merges the most frequent adjacent pair (ties to
 * the lowest ids: deterministic) everywhere; a merge whose text already exists adds no piece.
 * Writes the new piece ids in merge order to out. */
static int train(struct piece_table *pt, struct word *words, uint32_t n_words, uint32_t max_new,
                 uint32_t *out, uint32_t *ret_n)
{
	uint32_t total = 0;
	for (uint32_t i = 0; i < n_words; i++)
		total += words[i].n;
	struct pair_count *pairs = malloc((total + 1) * sizeof(*pairs));
	if (!pairs)
		return -ENOMEM;
	uint32_t made = 0;
	int r = 0;
	while (made < max_new) {
		uint32_t np = 0;
		for (uint32_t i = 0; i < n_words; i++)
			for (uint32_t k = 0; k + 1 < words[i].n; k++)
				pairs[np++] = (struct pair_count){
				    words[i].sym[k], words[i].sym[k + 1], words[i].count};
		if (np == 0)
			break;
		qsort(pairs, np, sizeof(*pairs), cmp_pair);
		struct pair_count best = {0, 0, 0};
		for (uint32_t i = 0; i < np;) {
			uint32_t j = i, c = 0;
			while (j < np && pairs[j].a == pairs[i].a && pairs[j].b == pairs[i].b)
				c += pairs[j++].count;
			if (c > best.count)
				best = (struct pair_count){pairs[i].a, pairs[i].b, c};
			i = j;
		}
		char buf[512];
		int len = snprintf(buf, sizeof(buf), "%s%s", pt->text[best.a], pt->text[best.b]);
		if (len < 0 || (size_t)len >= sizeof(buf))
			break;
		uint32_t before = pt->n, id;
		r = piece_add(pt, buf, (size_t)len, &id);
		if (r < 0)
			break;
		if (pt->n > before)
			out[made++] = id;
		for (uint32_t i = 0; i < n_words; i++) {
			struct word *w = &words[i];
			uint32_t o = 0;
			for (uint32_t k = 0; k < w->n; k++) {
				if (k + 1 < w->n && w->sym[k] == best.a &&
				    w->sym[k + 1] == best.b) {
					w->sym[o++] = id;
					k++;
				} else {
					w->sym[o++] = w->sym[k];
				}
			}
			w->n = o;
		}
	}
	free(pairs);
	*ret_n = made;
	return r;
}

/* ---- the vocabulary ------------------------------------------------------------------------ */

void gen_vocab_fini(struct gen_vocab *v)
{
	if (!v)
		return;
	if (v->tokens)
		for (uint32_t i = 0; i < v->n; i++)
			free(v->tokens[i]);
	free(v->tokens);
	free(v->scores);
	free(v->types);
	memset(v, 0, sizeof(*v));
}

int gen_vocab_build(uint32_t n, struct gen_vocab *ret_vocab)
{
	if (n < GEN_VOCAB_MIN)
		return -EINVAL;
	struct gen_vocab v = {.n = n};
	struct piece_table pt = {0};
	struct word *words = NULL;
	uint32_t n_words = 0, n_merges = 0;
	uint32_t *merged = NULL;
	int r = -ENOMEM;

	v.tokens = calloc(n, sizeof(*v.tokens));
	v.scores = calloc(n, sizeof(*v.scores));
	v.types = calloc(n, sizeof(*v.types));
	if (!v.tokens || !v.scores || !v.types)
		goto out;

	/* Fixed part first so that trained pieces can never collide with it. */
	uint32_t id;
	const char *special[3] = {"<unk>", "<s>", "</s>"};
	const int special_type[3] = {TOK_UNKNOWN, TOK_CONTROL, TOK_CONTROL};
	for (int i = 0; i < 3; i++) {
		if ((r = piece_add(&pt, special[i], strlen(special[i]), &id)) < 0)
			goto out;
		v.types[i] = special_type[i];
	}
	for (int b = 0; b < 256; b++) {
		char s[8];
		snprintf(s, sizeof(s), "<0x%02X>", b);
		if ((r = piece_add(&pt, s, strlen(s), &id)) < 0)
			goto out;
		v.types[3 + b] = TOK_BYTE;
	}
	for (size_t i = 0; i < N_SINGLE; i++)
		if ((r = piece_add(&pt, single_chars[i], strlen(single_chars[i]), &id)) < 0)
			goto out;

	uint32_t n_pieces = n - GEN_VOCAB_MIN;
	merged = malloc((n_pieces + 1) * sizeof(*merged));
	if (!merged) {
		r = -ENOMEM;
		goto out;
	}
	if ((r = load_words(&pt, &words, &n_words)) < 0)
		goto out;
	if ((r = train(&pt, words, n_words, n_pieces, merged, &n_merges)) < 0)
		goto out;

	/* Fillers when the text runs out of merges: "▁" plus base-26 letter strings, which the
	 * tokenizer can reach too but rarely will. */
	uint32_t n_fill = n_pieces - n_merges;
	for (uint64_t k = 0; n_fill > 0; k++) {
		char s[32];
		memcpy(s, SPACE, 3);
		size_t len = 3;
		char rev[16];
		size_t rl = 0;
		uint64_t x = k + 26 * 26; /* three letters and up: "▁baa", "▁bab", ... */
		do {
			rev[rl++] = (char)('a' + x % 26);
			x /= 26;
		} while (x && rl < sizeof(rev));
		while (rl)
			s[len++] = rev[--rl];
		uint32_t before = pt.n;
		if ((r = piece_add(&pt, s, len, &id)) < 0)
			goto out;
		if (pt.n > before) {
			merged[n_merges++] = id;
			n_fill--;
		}
	}

	/* Token order: special + bytes (piece ids 0..258), merges/fillers, single characters.
	 * The vocabulary gets its own copies; the table frees the rest. */
	uint32_t t = 0;
	for (; t < 259; t++)
		v.tokens[t] = strdup(pt.text[t]);
	for (uint32_t i = 0; i < n_merges; i++, t++) {
		v.tokens[t] = strdup(pt.text[merged[i]]);
		v.scores[t] = -(float)i;
		v.types[t] = TOK_NORMAL;
	}
	for (size_t i = 0; i < N_SINGLE; i++, t++) {
		v.tokens[t] = strdup(pt.text[259 + i]);
		v.scores[t] = -(float)(n_merges + i);
		v.types[t] = TOK_NORMAL;
	}
	for (uint32_t i = 0; i < n; i++) {
		if (!v.tokens[i]) {
			r = -ENOMEM;
			goto out;
		}
	}
	*ret_vocab = v;
	memset(&v, 0, sizeof(v));
	r = 0;
out:
	gen_vocab_fini(&v);
	for (uint32_t i = 0; i < n_words; i++)
		free(words[i].sym);
	free(words);
	free(merged);
	piece_table_fini(&pt);
	return r;
}
