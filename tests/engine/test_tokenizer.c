/* The tokenizer (engine/tokenizer.h): llama.cpp's ids and pieces for every reference model, round
 * trips, edge cases, special tokens, a hand-made byte-level BPE vocabulary whose expected ids are
 * derived by hand in the comments, and bad metadata. */
#include "base/error.h"
#include "common/wftest.h"
#include "engine/tokenizer.h"
#include "engine/unicode_class.h"
#include "model/model.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

TestSuite(tokenizer, .timeout = 60);

static char *join(const char *a, const char *b)
{
	char *p = NULL;
	cr_assert(asprintf(&p, "%s/%s", a, b) > 0);
	return p;
}

static json_object *get(json_object *o, const char *key)
{
	json_object *v = NULL;
	cr_assert(json_object_object_get_ex(o, key, &v), "manifest lacks '%s'", key);
	return v;
}

static struct wf_tokenizer *tok_of(const char *folder, struct wf_model **ret_m,
                                   json_object **ret_man)
{
	char *mp = join(folder, "manifest.json");
	json_object *man = json_object_from_file(mp);
	cr_assert_not_null(man, "cannot parse %s", mp);
	char *path = join(folder, json_object_get_string(get(man, "load_this_file")));
	struct wf_model *m = NULL;
	struct wf_tokenizer *t = NULL;
	struct wf_diag d = {{0}};
	int rc = wf_model_open(path, &m, &d);
	cr_assert_eq(rc, 0, "%s: %s", path, wf_diag_str(&d, rc));
	rc = wf_tokenizer_create(&m->kv, &t, &d);
	cr_assert_eq(rc, 0, "%s: %s", path, wf_diag_str(&d, rc));
	free(mp);
	free(path);
	*ret_m = m;
	if (ret_man)
		*ret_man = man;
	else
		json_object_put(man);
	return t;
}

static struct wf_model *mixtral_m;
static struct wf_tokenizer *mixtral(void)
{
	const char *r = wft_reference_dir();
	cr_assert_not_null(r, "tests/data/reference/ is missing");
	char *f = join(r, "mixtral-tiny-f32");
	struct wf_tokenizer *t = tok_of(f, &mixtral_m, NULL);
	free(f);
	return t;
}

static void enc(const struct wf_tokenizer *t, const char *s, size_t len, bool add, bool parse,
                int32_t **ids, size_t *n)
{
	struct wf_diag d = {{0}};
	int rc = wf_tokenizer_encode(t, s, len, add, parse, ids, n, &d);
	cr_assert_eq(rc, 0, "encode: %s", wf_diag_str(&d, rc));
}

static char *dec(const struct wf_tokenizer *t, const int32_t *ids, size_t n, bool rm, bool unparse,
                 size_t *len)
{
	char *s = NULL;
	int rc = wf_tokenizer_decode(t, ids, n, rm, unparse, &s, len);
	cr_assert_eq(rc, 0, "decode: %s", wf_err_name(rc));
	return s;
}

Test(tokenizer, reference_models_match_llama_cpp)
{
	const char *r = wft_reference_dir();
	cr_assert_not_null(r, "tests/data/reference/ is missing");
	DIR *dir = opendir(r);
	cr_assert_not_null(dir);
	int checked = 0;
	struct dirent *de;
	while ((de = readdir(dir))) {
		if (de->d_name[0] == '.')
			continue;
		char *folder = join(r, de->d_name);
		char *mp = join(folder, "manifest.json");
		FILE *probe = fopen(mp, "r");
		if (!probe) {
			free(folder);
			free(mp);
			continue;
		}
		fclose(probe);
		struct wf_model *m;
		json_object *man;
		struct wf_tokenizer *t = tok_of(folder, &m, &man);
		json_object *tt = get(man, "tokenizer_test");
		const char *text = json_object_get_string(get(tt, "text"));
		bool add = json_object_get_boolean(get(tt, "add_special"));
		bool parse = json_object_get_boolean(get(tt, "parse_special"));
		json_object *jids = get(tt, "ids"), *jp = get(tt, "pieces");
		int32_t *ids;
		size_t n;
		enc(t, text, strlen(text), add, parse, &ids, &n);
		cr_assert_eq(n, json_object_array_length(jids), "%s: %zu ids, llama.cpp made %zu",
		             de->d_name, n, json_object_array_length(jids));
		for (size_t i = 0; i < n; i++) {
			cr_assert_eq(ids[i],
			             json_object_get_int(json_object_array_get_idx(jids, i)),
			             "%s: id %zu", de->d_name, i);
			char buf[256];
			int64_t pn = wf_tokenizer_piece(t, ids[i], true, 0, buf, sizeof(buf));
			cr_assert(pn >= 0 && pn < (int64_t)sizeof(buf));
			buf[pn] = 0;
			cr_assert_str_eq(buf,
			                 json_object_get_string(json_object_array_get_idx(jp, i)),
			                 "%s: piece %zu", de->d_name, i);
		}
		free(ids);
		wf_tokenizer_destroy(t);
		wf_model_close(m);
		json_object_put(man);
		free(folder);
		free(mp);
		checked++;
	}
	closedir(dir);
	cr_assert_geq(checked, 5, "only %d reference models found", checked);
}

static void round_trip(const struct wf_tokenizer *t, const char *s, size_t len)
{
	int32_t *ids;
	size_t n, out_len;
	enc(t, s, len, false, false, &ids, &n);
	char *back = dec(t, ids, n, false, false, &out_len);
	cr_assert_eq(out_len, len, "round trip of '%s': %zu bytes back, %zu in", s, out_len, len);
	cr_assert(memcmp(back, s, len) == 0, "round trip of '%s' gave '%s'", s, back);
	free(back);
	free(ids);
}

Test(tokenizer, spm_round_trips)
{
	struct wf_tokenizer *t = mixtral();
	static const char *cases[] = {
	    "The quick brown fox jumps over the lazy dog",
	    "Hello, world! 123 + 456 = 579; (a|b) ~x",
	    "  leading and trailing spaces  ",
	    "tabs\tand\nnewlines\r\n",
	    "h\xc3\xa9llo w\xc3\xb6rld, na\xc3\xafve caf\xc3\xa9",
	    "\xe4\xbd\xa0\xe5\xa5\xbd\xe4\xb8\x96\xe7\x95\x8c", /* CJK: not in the vocab, bytes */
	    "llama \xf0\x9f\xa6\x99 and \xf0\x9f\x98\x80\xf0\x9f\x91\x8d", /* emoji */
	    "   ",
	    " ",
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		round_trip(t, cases[i], strlen(cases[i]));
	wf_tokenizer_destroy(t);
	wf_model_close(mixtral_m);
}

Test(tokenizer, spm_byte_fallback)
{
	struct wf_tokenizer *t = mixtral();
	/* The llama emoji is no token of this vocabulary: its four bytes become <0xF0> <0x9F>
	 * <0xA6> <0x99>, ids 3 + byte. */
	int32_t *ids;
	size_t n;
	enc(t, "\xf0\x9f\xa6\x99", 4, false, false, &ids, &n);
	cr_assert_geq(n, 5);
	cr_assert_eq(ids[n - 4], 3 + 0xF0);
	cr_assert_eq(ids[n - 3], 3 + 0x9F);
	cr_assert_eq(ids[n - 2], 3 + 0xA6);
	cr_assert_eq(ids[n - 1], 3 + 0x99);
	cr_assert_str_eq(wf_tokenizer_text(t, ids[n - 4]), "<0xF0>");
	char b;
	cr_assert_eq(wf_tokenizer_piece(t, ids[n - 4], false, 0, &b, 1), 1);
	cr_assert_eq((unsigned char)b, 0xF0);
	free(ids);
	/* Invalid UTF-8: a lone lead byte and a stray continuation byte go to byte tokens too and
	 * come back unchanged. */
	static const char bad[] = "ab\xc3(x\x80y\xff";
	round_trip(t, bad, sizeof(bad) - 1);
	enc(t, bad, sizeof(bad) - 1, false, false, &ids, &n);
	bool saw_c3 = false, saw_80 = false, saw_ff = false;
	for (size_t i = 0; i < n; i++) {
		saw_c3 |= ids[i] == 3 + 0xC3;
		saw_80 |= ids[i] == 3 + 0x80;
		saw_ff |= ids[i] == 3 + 0xFF;
	}
	cr_assert(saw_c3 && saw_80 && saw_ff, "invalid bytes did not fall back to <0xXX> tokens");
	free(ids);
	wf_tokenizer_destroy(t);
	wf_model_close(mixtral_m);
}

Test(tokenizer, spm_edge_cases)
{
	struct wf_tokenizer *t = mixtral();
	int32_t *ids;
	size_t n, len;
	/* empty text: only the BOS with add_special, nothing without */
	enc(t, "", 0, true, false, &ids, &n);
	cr_assert_eq(n, 1);
	cr_assert_eq(ids[0], 1);
	free(ids);
	enc(t, "", 0, false, false, &ids, &n);
	cr_assert_eq(n, 0);
	free(ids);
	/* only spaces: the prefix plus one U+2581 per space, and back */
	enc(t, "   ", 3, false, false, &ids, &n);
	cr_assert_geq(n, 1);
	char *s = dec(t, ids, n, false, false, &len);
	cr_assert_str_eq(s, "   ");
	free(s);
	free(ids);
	/* a text far longer than the longest token */
	size_t big = 20000;
	char *longtext = malloc(big + 1);
	for (size_t i = 0; i < big; i++)
		longtext[i] = "the lazy dog "[i % 13];
	longtext[big] = 0;
	round_trip(t, longtext, big);
	free(longtext);
	/* with the BOS: llama.cpp keeps the prefix space after it (remove_special drops the BOS but
	 * not the space; unparse_special false writes the BOS as nothing) */
	enc(t, "The fox", 7, true, false, &ids, &n);
	cr_assert_eq(ids[0], 1);
	s = dec(t, ids, n, true, false, &len);
	cr_assert_str_eq(s, " The fox");
	free(s);
	s = dec(t, ids, n, false, true, &len);
	cr_assert_str_eq(s, "<s> The fox");
	free(s);
	free(ids);
	/* an id out of range */
	char b[8];
	cr_assert_eq(wf_tokenizer_piece(t, 512, true, 0, b, sizeof(b)), WF_EINVAL);
	cr_assert_eq(wf_tokenizer_piece(t, -1, true, 0, b, sizeof(b)), WF_EINVAL);
	int32_t bad_id = 9999;
	cr_assert_eq(wf_tokenizer_decode(t, &bad_id, 1, false, false, &s, &len), WF_EINVAL);
	wf_tokenizer_destroy(t);
	wf_model_close(mixtral_m);
}

Test(tokenizer, spm_special_tokens_in_text)
{
	struct wf_tokenizer *t = mixtral();
	int32_t *plain, *ids;
	size_t np, n;
	enc(t, "fox", 3, false, false, &plain, &np);
	/* parse_special: "<s>" and "</s>" are their ids, and the text after a special token gets
	 * the space prefix again */
	enc(t, "<s>fox</s>", 10, true, true, &ids, &n);
	cr_assert_eq(n, 1 + 1 + np + 1);
	cr_assert_eq(ids[0], 1);
	cr_assert_eq(ids[1], 1);
	cr_assert(memcmp(ids + 2, plain, np * sizeof(*ids)) == 0);
	cr_assert_eq(ids[n - 1], 2);
	free(ids);
	/* without parse_special they are plain text: no id 1 or 2 past the BOS */
	enc(t, "<s>fox</s>", 10, true, false, &ids, &n);
	cr_assert_eq(ids[0], 1);
	for (size_t i = 1; i < n; i++)
		cr_assert(ids[i] != 1 && ids[i] != 2, "id %d at %zu", ids[i], i);
	size_t len;
	char *s = dec(t, ids + 1, n - 1, false, false, &len);
	cr_assert_str_eq(s, "<s>fox</s>");
	free(s);
	free(ids);
	free(plain);
	wf_tokenizer_destroy(t);
	wf_model_close(mixtral_m);
}

/* ---- hand-made metadata ---- */

static struct wf_kv *kv_add(struct wf_kv_set *set, const char *key, enum wf_kv_type type)
{
	set->items = realloc(set->items, (set->n + 1) * sizeof(*set->items));
	struct wf_kv *e = &set->items[set->n++];
	memset(e, 0, sizeof(*e));
	e->key = strdup(key);
	e->v.type = type;
	return e;
}

static void kv_str(struct wf_kv_set *set, const char *key, const char *val)
{
	struct wf_kv *e = kv_add(set, key, WF_KV_STRING);
	e->v.u.str.s = strdup(val);
	e->v.u.str.n = strlen(val);
}

static void kv_strs(struct wf_kv_set *set, const char *key, const char *const *v, size_t n)
{
	struct wf_kv *e = kv_add(set, key, WF_KV_ARRAY);
	e->v.u.arr.elem = WF_KV_STRING;
	e->v.u.arr.n = n;
	e->v.u.arr.u.strs = calloc(n ? n : 1, sizeof(struct wf_kv_str));
	for (size_t i = 0; i < n; i++) {
		e->v.u.arr.u.strs[i].s = strdup(v[i]);
		e->v.u.arr.u.strs[i].n = strlen(v[i]);
	}
}

static void kv_scalars(struct wf_kv_set *set, const char *key, enum wf_kv_type elem, const void *v,
                       size_t n)
{
	struct wf_kv *e = kv_add(set, key, WF_KV_ARRAY);
	e->v.u.arr.elem = elem;
	e->v.u.arr.n = n;
	e->v.u.arr.u.scalars = malloc(n * 4 + 1);
	memcpy(e->v.u.arr.u.scalars, v, n * 4);
}

static void kv_u32(struct wf_kv_set *set, const char *key, uint32_t v)
{
	kv_add(set, key, WF_KV_U32)->v.u.u64 = v;
}

static void kv_bool(struct wf_kv_set *set, const char *key, bool v)
{
	kv_add(set, key, WF_KV_BOOL)->v.u.u64 = v;
}

/* A byte-level BPE vocabulary. "Ġ" is the GPT-2 character of byte 0x20, "Ċ" of 0x0A. */
static const char *const bpe_tokens[] = {
    "<|endoftext|>",
    "h",
    "e",
    "l",
    "o",
    "\xc4\xa0",
    "w",
    "r",
    "d",
    "!", /* 0-9 */
    "he",
    "ll",
    "hell",
    "hello",
    "\xc4\xa0w",
    "or",
    "\xc4\xa0wor",
    "1",
    "2",
    "3", /* 10-19 */
    "4",
    "12",
    "123",
    "\xc4\x8a",
    "'",
    "s",
    "ld",
    "x",
    "y",
    "z", /* 20-29 */
    "xy",
    "yz",
    "\xc3\x83\xc2\xa9",
    "l\xc3\x83\xc2\xa9", /* 30-33 */
    "`",
    "\xc3\x8d\xc2\xb8",
    "`\xc3\x8d\xc2\xb8", /* 34-36 */
};
static const char *const bpe_merges[] = {
    "h e",
    "l l",
    "he ll",
    "hell o",
    "\xc4\xa0 w",
    "o r",
    "\xc4\xa0w or",
    "1 2",
    "12 3",
    "l d",
    "y z",
    "x y", /* ranks 10, 11: the lower rank wins where both apply */
    "\xc3\x83 \xc2\xa9",
    "l \xc3\x83\xc2\xa9", /* "é" is bytes C3 A9, GPT-2 characters Ã © */
    "\xc3\x8d \xc2\xb8",
    "` \xc3\x8d\xc2\xb8", /* U+0378 (unassigned) is bytes CD B8: Í ¸ */
};

static void bpe_kv(struct wf_kv_set *set)
{
	size_t n = sizeof(bpe_tokens) / sizeof(bpe_tokens[0]);
	int32_t types[64];
	for (size_t i = 0; i < n; i++)
		types[i] = i == 0 ? WF_TOKEN_TYPE_CONTROL : WF_TOKEN_TYPE_NORMAL;
	kv_str(set, "tokenizer.ggml.model", "gpt2");
	kv_strs(set, "tokenizer.ggml.tokens", bpe_tokens, n);
	kv_scalars(set, "tokenizer.ggml.token_type", WF_KV_I32, types, n);
	kv_strs(set, "tokenizer.ggml.merges", bpe_merges,
	        sizeof(bpe_merges) / sizeof(bpe_merges[0]));
	kv_u32(set, "tokenizer.ggml.bos_token_id", 0);
	kv_u32(set, "tokenizer.ggml.eos_token_id", 0);
	kv_bool(set, "tokenizer.ggml.add_bos_token", true);
}

static void expect_ids(const struct wf_tokenizer *t, const char *s, bool add, bool parse,
                       const int32_t *want, size_t nwant)
{
	int32_t *ids;
	size_t n;
	enc(t, s, strlen(s), add, parse, &ids, &n);
	cr_assert_eq(n, nwant, "'%s': %zu ids, expected %zu", s, n, nwant);
	for (size_t i = 0; i < n; i++)
		cr_assert_eq(ids[i], want[i], "'%s': id %zu is %d, expected %d", s, i, ids[i],
		             want[i]);
	free(ids);
}

Test(tokenizer, bpe_hand_made_vocabulary)
{
	struct wf_kv_set set = {0};
	bpe_kv(&set);
	struct wf_tokenizer *t = NULL;
	struct wf_diag d = {{0}};
	int rc = wf_tokenizer_create(&set, &t, &d);
	cr_assert_eq(rc, 0, "%s", wf_diag_str(&d, rc));
	cr_assert_eq(wf_tokenizer_kind(t), WF_TOKENIZER_BPE);

	/* "hello world!": words "hello", " world", "!" ('!' is split off as punctuation first).
	 * hello: h+e (rank 0), l+l (1), he+ll (2), hell+o (3) -> 13.
	 * Ġworld: Ġ+w (4), o+r (5), Ġw+or (6), l+d (9) -> Ġwor ld = 16 26. "!" -> 9. BOS 0 first.
	 */
	expect_ids(t, "hello world!", true, false, (const int32_t[]){0, 13, 16, 26, 9}, 5);
	expect_ids(t, "hello world!", false, false, (const int32_t[]){13, 16, 26, 9}, 4);
	/* digits: "1234 12" -> "1234", " 12" (GPT-2 pattern) -> "1234", " ", "12" (\p{N}+) ->
	 * "123", "4", " ", "12" (groups of three). 1+2 (7), 12+3 (8) -> 22; 4 -> 20; Ġ -> 5; 12
	 * -> 21. */
	expect_ids(t, "1234 12", false, false, (const int32_t[]){22, 20, 5, 21}, 4);
	/* the apostrophe is punctuation for the first pattern, so "'s" never forms: he ' s */
	expect_ids(t, "he's", false, false, (const int32_t[]){10, 24, 25}, 3);
	/* "xyz": y+z has rank 10, x+y rank 11; the lower rank merges first, leaving x yz */
	expect_ids(t, "xyz", false, false, (const int32_t[]){27, 31}, 2);
	/* "lé": é is a letter, so "lé" is one word and l+é (rank 13) merges across the two bytes'
	 * characters: 33. Were é not a letter, the words "l" "é" would give 3 32. */
	expect_ids(t, "l\xc3\xa9", false, false, (const int32_t[]){33}, 1);
	char pb[8];
	cr_assert_eq(wf_tokenizer_piece(t, 33, false, 0, pb, sizeof(pb)), 3);
	cr_assert(memcmp(pb, "l\xc3\xa9", 3) == 0);
	/* an unassigned code point is a word of its own in llama.cpp's GPT-2 splitter, even after a
	 * symbol ('`'): "`" and U+0378 stay apart although "`" + U+0378 (rank 15) is a merge */
	expect_ids(t, "`\xcd\xb8", false, false, (const int32_t[]){34, 35}, 2);
	/* a newline is its own word, byte 0x0A as Ċ */
	expect_ids(t, "hello\n", false, false, (const int32_t[]){13, 23}, 2);
	/* a character outside the vocabulary is dropped, as llama.cpp drops it */
	expect_ids(t, "hev", false, false, (const int32_t[]){10}, 1);
	/* the control token is parsed only with parse_special */
	expect_ids(t, "hello<|endoftext|>", false, true, (const int32_t[]){13, 0}, 2);
	int32_t *ids;
	size_t n;
	enc(t, "hello<|endoftext|>", 18, false, false, &ids, &n);
	for (size_t i = 0; i < n; i++)
		cr_assert_neq(ids[i], 0);
	free(ids);

	/* pieces through the byte map, and detokenization */
	char buf[32];
	int64_t pn = wf_tokenizer_piece(t, 16, false, 0, buf, sizeof(buf));
	cr_assert_eq(pn, 4);
	cr_assert(memcmp(buf, " wor", 4) == 0);
	pn = wf_tokenizer_piece(t, 23, false, 0, buf, sizeof(buf));
	cr_assert_eq(pn, 1);
	cr_assert_eq(buf[0], '\n');
	cr_assert_eq(wf_tokenizer_piece(t, 0, false, 0, buf, sizeof(buf)), 0);
	cr_assert_eq(wf_tokenizer_piece(t, 0, true, 0, buf, sizeof(buf)), 13);
	size_t len;
	char *s = dec(t, (const int32_t[]){0, 13, 16, 26, 9, 23}, 6, true, false, &len);
	cr_assert_str_eq(s, "hello world!\n");
	free(s);
	wf_tokenizer_destroy(t);
	wf_kv_set_fini(&set);
}

Test(tokenizer, unicode_classes)
{
	cr_assert_eq(wf__unicode_class('a'), WF_UCLASS_LETTER);
	cr_assert_eq(wf__unicode_class(0xE9), WF_UCLASS_LETTER);   /* é */
	cr_assert_eq(wf__unicode_class(0x4E2D), WF_UCLASS_LETTER); /* 中 */
	cr_assert_eq(wf__unicode_class('7'), WF_UCLASS_NUMBER);
	cr_assert_eq(wf__unicode_class(0xB2), WF_UCLASS_NUMBER);  /* ² */
	cr_assert_eq(wf__unicode_class(0x663), WF_UCLASS_NUMBER); /* Arabic-Indic three */
	cr_assert_eq(wf__unicode_class('\''), WF_UCLASS_PUNCT);
	cr_assert_eq(wf__unicode_class(0x2026), WF_UCLASS_PUNCT);  /* … */
	cr_assert_eq(wf__unicode_class('$'), WF_UCLASS_OTHER);     /* a symbol, Sc */
	cr_assert_eq(wf__unicode_class(0x1F999), WF_UCLASS_OTHER); /* 🦙 */
	cr_assert_eq(wf__unicode_class(0x301), WF_UCLASS_OTHER);   /* a combining mark */
	cr_assert_eq(wf__unicode_class(0x3000), WF_UCLASS_SPACE);
	cr_assert_eq(wf__unicode_class('\n'), WF_UCLASS_SPACE);
	cr_assert_eq(wf__unicode_class(0xFFFD), WF_UCLASS_OTHER); /* the replacement character */
	cr_assert_eq(wf__unicode_class(0x110000), WF_UCLASS_UNASSIGNED);
	cr_assert_eq(wf__unicode_class(0x10FFFF), WF_UCLASS_UNASSIGNED); /* a noncharacter, Cn */
	cr_assert_eq(wf__unicode_class(0x378), WF_UCLASS_UNASSIGNED);
}

/* SPM merge order on a hand-made vocabulary: the highest score merges first, and between equal
 * scores the leftmost pair. */
static struct wf_tokenizer *spm_tiny(float s_ab, float s_bc)
{
	static const char *const toks[] = {"<unk>", "<s>", "</s>", "\xe2\x96\x81", "a", "b",
	                                   "c",     "ab",  "bc"};
	float scores[9] = {0, 0, 0, -1, -1, -1, -1, s_ab, s_bc};
	int32_t types[9] = {2, 3, 3, 1, 1, 1, 1, 1, 1};
	struct wf_kv_set set = {0};
	kv_str(&set, "tokenizer.ggml.model", "llama");
	kv_strs(&set, "tokenizer.ggml.tokens", toks, 9);
	kv_scalars(&set, "tokenizer.ggml.scores", WF_KV_F32, scores, 9);
	kv_scalars(&set, "tokenizer.ggml.token_type", WF_KV_I32, types, 9);
	kv_bool(&set, "tokenizer.ggml.add_space_prefix", false);
	struct wf_tokenizer *t = NULL;
	struct wf_diag d = {{0}};
	cr_assert_eq(wf_tokenizer_create(&set, &t, &d), 0, "%s", d.msg);
	wf_kv_set_fini(&set);
	return t;
}

Test(tokenizer, spm_merge_order)
{
	struct wf_tokenizer *t = spm_tiny(-2, -2);
	/* equal scores: "ab" is the leftmost pair */
	expect_ids(t, "abc", false, false, (const int32_t[]){7, 6}, 2);
	/* add_bos_token absent: llama.cpp's SPM default adds the BOS; no space prefix as told */
	expect_ids(t, "abc", true, false, (const int32_t[]){1, 7, 6}, 3);
	wf_tokenizer_destroy(t);
	t = spm_tiny(-3, -2);
	expect_ids(t, "abc", false, false, (const int32_t[]){4, 8}, 2);
	/* a space is U+2581 without the prefix too */
	expect_ids(t, "a c", false, false, (const int32_t[]){4, 3, 6}, 3);
	wf_tokenizer_destroy(t);
}

static void bpe_kv(struct wf_kv_set *set);

/* Arbitrary bytes never crash either tokenizer, and every id is in the vocabulary. */
Test(tokenizer, random_bytes)
{
	struct wf_kv_set set = {0};
	bpe_kv(&set);
	struct wf_tokenizer *bpe = NULL;
	struct wf_diag d = {{0}};
	cr_assert_eq(wf_tokenizer_create(&set, &bpe, &d), 0, "%s", d.msg);
	struct wf_tokenizer *t = mixtral();
	unsigned seed = 12345;
	char buf[512];
	for (int iter = 0; iter < 2000; iter++) {
		size_t len = (size_t)(rand_r(&seed) % sizeof(buf));
		for (size_t i = 0; i < len; i++)
			buf[i] = (char)(rand_r(&seed) & 0xFF);
		int32_t *ids = NULL;
		size_t n = 0;
		const struct wf_tokenizer *k = iter & 16 ? bpe : t;
		enc(k, buf, len, iter & 1, iter & 2, &ids, &n);
		for (size_t i = 0; i < n; i++)
			cr_assert(ids[i] >= 0 && (uint32_t)ids[i] < wf_tokenizer_n_vocab(k));
		size_t dl;
		free(dec(k, ids, n, iter & 4, iter & 8, &dl));
		free(ids);
	}
	wf_tokenizer_destroy(bpe);
	wf_kv_set_fini(&set);
	wf_tokenizer_destroy(t);
	wf_model_close(mixtral_m);
}

static int create_err(struct wf_kv_set *set, const char *want_in_msg)
{
	struct wf_tokenizer *t = NULL;
	struct wf_diag d = {{0}};
	int rc = wf_tokenizer_create(set, &t, &d);
	cr_assert_lt(rc, 0, "bad metadata accepted");
	cr_assert_null(t);
	cr_assert(strstr(d.msg, want_in_msg), "diag '%s' does not mention '%s'", d.msg,
	          want_in_msg);
	wf_kv_set_fini(set);
	return rc;
}

Test(tokenizer, bad_metadata)
{
	struct wf_kv_set set = {0};
	/* nothing at all */
	cr_assert_eq(create_err(&set, "tokenizer.ggml.model"), WF_ENOT_FOUND);
	/* an unknown model */
	kv_str(&set, "tokenizer.ggml.model", "bert");
	kv_strs(&set, "tokenizer.ggml.tokens", bpe_tokens, 3);
	cr_assert_eq(create_err(&set, "bert"), WF_EUNSUPPORTED);
	/* no tokens */
	kv_str(&set, "tokenizer.ggml.model", "llama");
	cr_assert_eq(create_err(&set, "tokenizer.ggml.tokens"), WF_ENOT_FOUND);
	/* tokens of the wrong type */
	kv_str(&set, "tokenizer.ggml.model", "llama");
	kv_u32(&set, "tokenizer.ggml.tokens", 5);
	cr_assert_eq(create_err(&set, "tokenizer.ggml.tokens"), WF_EFORMAT);
	/* fewer scores than tokens */
	float scores[2] = {0, -1};
	kv_str(&set, "tokenizer.ggml.model", "llama");
	kv_strs(&set, "tokenizer.ggml.tokens", bpe_tokens, 5);
	kv_scalars(&set, "tokenizer.ggml.scores", WF_KV_F32, scores, 2);
	cr_assert_eq(create_err(&set, "scores"), WF_EFORMAT);
	/* fewer token types than tokens */
	int32_t types[2] = {1, 1};
	kv_str(&set, "tokenizer.ggml.model", "llama");
	kv_strs(&set, "tokenizer.ggml.tokens", bpe_tokens, 5);
	kv_scalars(&set, "tokenizer.ggml.token_type", WF_KV_I32, types, 2);
	cr_assert_eq(create_err(&set, "token_type"), WF_EFORMAT);
	/* a duplicate token */
	static const char *const dup[] = {"a", "b", "a"};
	kv_str(&set, "tokenizer.ggml.model", "llama");
	kv_strs(&set, "tokenizer.ggml.tokens", dup, 3);
	cr_assert_eq(create_err(&set, "duplicate"), WF_EFORMAT);
	/* gpt2 without merges, and with a pre-tokenizer this build does not have */
	kv_str(&set, "tokenizer.ggml.model", "gpt2");
	kv_strs(&set, "tokenizer.ggml.tokens", bpe_tokens, 5);
	cr_assert_eq(create_err(&set, "merges"), WF_ENOT_FOUND);
	kv_str(&set, "tokenizer.ggml.model", "gpt2");
	kv_str(&set, "tokenizer.ggml.pre", "qwen2");
	kv_strs(&set, "tokenizer.ggml.tokens", bpe_tokens, 5);
	cr_assert_eq(create_err(&set, "qwen2"), WF_EUNSUPPORTED);
	/* an SPM vocabulary without byte tokens: a byte it cannot spell is an error, not a crash */
	static const char *const tiny[] = {"<unk>", "<s>", "</s>", "a"};
	kv_str(&set, "tokenizer.ggml.model", "llama");
	kv_strs(&set, "tokenizer.ggml.tokens", tiny, 4);
	struct wf_tokenizer *t = NULL;
	struct wf_diag d = {{0}};
	cr_assert_eq(wf_tokenizer_create(&set, &t, &d), 0, "%s", d.msg);
	int32_t *ids = NULL;
	size_t n = 0;
	int rc = wf_tokenizer_encode(t, "a", 1, true, false, &ids, &n, &d);
	cr_assert_eq(rc, WF_ENOT_FOUND, "%s", wf_err_name(rc));
	cr_assert(strstr(d.msg, "0xE2"), "%s", d.msg);
	wf_tokenizer_destroy(t);
	wf_kv_set_fini(&set);
}
