/* safetensors reader: one file, or a sharded model described by model.safetensors.index.json.
 *
 * File layout (https://github.com/huggingface/safetensors, checked against
 * safetensors/src/tensor.rs of that repository, the reference implementation):
 *
 *   u64 LE   N          length of the header
 *   N bytes  header     UTF-8 JSON object, optionally padded at the end with spaces
 *   rest     data       the byte buffer that the tensors index
 *
 *   header = {"__metadata__": {"key": "value", ...},            (optional; string values only)
 *             "<tensor name>": {"dtype": "BF16", "shape": [d0, d1, ...],
 *                               "data_offsets": [begin, end]}, ...}
 *
 * shape is row-major (d0 varies slowest), so it is reversed into ggml's ne order here. data_offsets
 * are relative to the start of the data buffer and half-open. Like the reference implementation we
 * require the buffer to be indexed exactly: sorted by offset, the first tensor starts at 0, each
 * next tensor starts where the previous one ends, and the last one ends at the end of the file.
 * An overlap is WF_EOVERLAP; a hole between tensors, before the first or after the last is
 * WF_EFORMAT. Holes are rejected rather than tolerated because the reference rejects them too
 * (InvalidOffset / MetadataIncompleteBuffer): a file that other readers refuse should not become a
 * floor here, and bytes that belong to no tensor could hide data that a digest does not cover.
 *
 * A scalar (shape []) is a tensor with n_dims = 0 and one element; wf_dtype_nbytes() counts it as
 * such, and keeping n_dims = 0 (not 1) preserves the distinction between shape [] and shape [1]
 * for anything that writes the model back.
 *
 * The JSON is parsed with json-c, which has three traits that matter for hostile input:
 *  - an object with a repeated key keeps only the last value, silently. A repeated tensor name
 *    would then hide a tensor that another reader sees (a parser differential), so duplicates are
 *    found by a raw scan of the text (scan_json below) that counts the keys of every object: the
 *    parsed tree holds fewer keys than the text if and only if some key was repeated. The same
 *    scan names the duplicate for the message.
 *  - integer text that does not fit saturates (strtoll/strtoull) instead of failing, and a value
 *    at or past 2^63 - 1 reads back as INT64_MAX. No offset, size or dimension of a real file can
 *    reach 2^63 - 1, so every number must be a JSON integer in [0, INT64_MAX) (json_get_count).
 *  - a NUL byte ends the parse early, and raw control characters inside strings and over-long
 *    UTF-8 pass. The raw scan rejects those before json-c runs, together with nesting deeper than
 *    SCAN_MAX_DEPTH.
 * The scan also counts objects, arrays and separators, so that the memory json-c spends on a tree
 * (hundreds of bytes per object) is bounded by what a valid header of that many entries needs
 * before json-c allocates anything.
 *
 * Sharded models (model.safetensors.index.json: {"weight_map": {"<tensor>": "<shard>"}}): shard
 * names must be plain file names beside the index; files are ordered by shard name (so the digest
 * does not depend on weight_map order), each is opened once, model->kv is the first shard's
 * __metadata__, and weight_map must match the shards' headers exactly in both directions, else
 * WF_ESHARD naming the tensor and shard. config.json beside the model, when present, fills
 * model->hp from the Hugging Face keys (falling back to text_config for multimodal configs);
 * JSON null counts as absent, any other value of the wrong type or range is WF_EFORMAT.
 *
 * Only what the safetensors syntax alone can tell is checked here; model.c's wf__model_finish()
 * then checks what every format must satisfy (bounds, overlaps and duplicates across the model,
 * nbytes against shape), classifies, sorts and sums. */
#include "model/model_internal.h"

#include "base/error.h"

#include <json-c/json.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define ST_INDEX_NAME  "model.safetensors.index.json"
#define ST_SINGLE_NAME "model.safetensors"
#define ST_CONFIG_NAME "config.json"
#define ST_METADATA    "__metadata__"

/* Real config.json files are a few KiB; the cap leaves room for large label maps. */
#define ST_MAX_CONFIG (4u << 20)

/* Nesting depth accepted anywhere (the header needs 3, config.json rarely more than 5). */
#define SCAN_MAX_DEPTH 16

/* ---------------------------------------------------------------------------------------------
 * Raw JSON scan: runs over untrusted bytes before json-c, and again on the error path to name a
 * duplicate key. It does not validate JSON (json-c does); on text that is not JSON its counts are
 * meaningless but bounded, and json-c rejects the text afterwards.
 * ------------------------------------------------------------------------------------------- */

struct scan_member {
	size_t key_off, key_end; /* the key, quotes included */
	size_t val_off, val_end; /* the value's text, with any whitespace around it */
};

struct scan {
	struct scan_member *members; /* keys of the top-level object, in text order */
	size_t n_members;
	size_t cap_members;
	uint64_t n_keys;    /* object keys at any depth */
	uint64_t n_objects; /* '{' */
	uint64_t n_arrays;  /* '[' */
	uint64_t n_tokens;  /* '{' '[' ',' ':': one more bounds the number of values and keys */
};

static void scan_fini(struct scan *s)
{
	free(s->members);
	memset(s, 0, sizeof(*s));
}

/* Length of the UTF-8 sequence at p (RFC 3629: no overlong forms, no surrogates, nothing past
 * U+10FFFF), or 0 if it is invalid. json-c's own check lets overlong forms through, and names
 * travel on to protobuf string fields, whose other-language decoders reject invalid UTF-8. */
static size_t utf8_seq_len(const unsigned char *p, size_t n)
{
	uint32_t cp, min;
	size_t len;

	if (p[0] < 0x80)
		return 1;
	if (p[0] >= 0xc2 && p[0] <= 0xdf) {
		len = 2;
		cp = p[0] & 0x1f;
		min = 0x80;
	} else if ((p[0] & 0xf0) == 0xe0) {
		len = 3;
		cp = p[0] & 0x0f;
		min = 0x800;
	} else if (p[0] >= 0xf0 && p[0] <= 0xf4) {
		len = 4;
		cp = p[0] & 0x07;
		min = 0x10000;
	} else {
		return 0;
	}
	if (n < len)
		return 0;
	for (size_t i = 1; i < len; i++) {
		if ((p[i] & 0xc0) != 0x80)
			return 0;
		cp = cp << 6 | (p[i] & 0x3f);
	}
	if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
		return 0;
	return len;
}

static int scan_push_member(struct scan *s, size_t max_members, size_t key_off, size_t key_end,
                            const char *what, struct wf_diag *diag)
{
	if (s->n_members >= max_members)
		return wf_diag_set(diag, WF_ELIMIT, "%s: more than %zu top-level entries", what,
		                   max_members);
	if (s->n_members == s->cap_members) {
		size_t cap = s->cap_members ? s->cap_members * 2 : 64;
		struct scan_member *p = realloc(s->members, cap * sizeof(*p));
		if (!p)
			return -ENOMEM;
		s->members = p;
		s->cap_members = cap;
	}
	s->members[s->n_members++] = (struct scan_member){key_off, key_end, key_end, key_end};
	return 0;
}

/* Scans t[0, n). max_members caps the top-level keys (and so the allocation). */
static int scan_json(const char *t, size_t n, size_t max_members, const char *what, struct scan *s,
                     struct wf_diag *diag)
{
	const unsigned char *u = (const unsigned char *)t;
	bool is_obj[SCAN_MAX_DEPTH], want_key[SCAN_MAX_DEPTH];
	int depth = 0;
	size_t i = 0;
	int r;

	memset(s, 0, sizeof(*s));
	while (i < n) {
		unsigned char c = u[i];

		if (c == '"') {
			bool key = depth > 0 && is_obj[depth - 1] && want_key[depth - 1];
			size_t start = i++;

			for (;;) {
				if (i >= n)
					return 0; /* unterminated: json-c reports it */
				c = u[i];
				if (c == '"')
					break;
				if (c < 0x20)
					return wf_diag_set(diag, WF_EFORMAT,
					                   "%s: control character 0x%02x inside a "
					                   "string at byte %zu",
					                   what, c, i);
				if (c == '\\') {
					/* json-c cuts keys at a NUL (it stores them as C strings),
					 * so "a\u0000b" would silently become "a". */
					if (key && i + 5 < n && u[i + 1] == 'u' &&
					    memcmp(t + i + 2, "0000", 4) == 0)
						return wf_diag_set(diag, WF_EFORMAT,
						                   "%s: key with a NUL character "
						                   "(\\u0000) at byte %zu",
						                   what, start);
					i += 2;
					continue;
				}
				if (c >= 0x80) {
					size_t l = utf8_seq_len(u + i, n - i);
					if (!l)
						return wf_diag_set(diag, WF_EFORMAT,
						                   "%s: invalid UTF-8 at byte %zu",
						                   what, i);
					i += l;
					continue;
				}
				i++;
			}
			i++;
			if (key) {
				want_key[depth - 1] = false;
				s->n_keys++;
				if (depth == 1) {
					r = scan_push_member(s, max_members, start, i, what, diag);
					if (r < 0)
						return r;
				}
			}
			continue;
		}
		switch (c) {
		case '{':
		case '[':
			if (depth == SCAN_MAX_DEPTH)
				return wf_diag_set(
				    diag, WF_EFORMAT,
				    "%s: JSON nested deeper than %d levels at byte %zu", what,
				    SCAN_MAX_DEPTH, i);
			is_obj[depth] = c == '{';
			want_key[depth] = c == '{';
			depth++;
			if (c == '{')
				s->n_objects++;
			else
				s->n_arrays++;
			s->n_tokens++;
			break;
		case '}':
		case ']':
			if (depth == 1 && s->n_members)
				s->members[s->n_members - 1].val_end = i;
			if (depth > 0)
				depth--;
			break;
		case ',':
			s->n_tokens++;
			if (depth > 0 && is_obj[depth - 1])
				want_key[depth - 1] = true;
			if (depth == 1 && s->n_members)
				s->members[s->n_members - 1].val_end = i;
			break;
		case ':':
			s->n_tokens++;
			if (depth == 1 && s->n_members)
				s->members[s->n_members - 1].val_off = i + 1;
			break;
		case ' ':
		case '\t':
		case '\n':
		case '\r':
			break;
		default:
			/* json-c stops at a NUL as if the text ended there, so a NUL would
			 * let garbage after it pass; other control bytes are invalid JSON. */
			if (c < 0x20)
				return wf_diag_set(diag, WF_EFORMAT,
				                   "%s: control byte 0x%02x at byte %zu", what, c,
				                   i);
			break;
		}
		i++;
	}
	return 0;
}

/* Decodes the JSON string at t[0, n) (quotes included) into a malloc'ed C string. */
static char *json_decode_key(const char *t, size_t n)
{
	struct json_tokener *tok = json_tokener_new();
	struct json_object *o;
	char *s = NULL;

	if (!tok)
		return NULL;
	/* A string at the end of the input is complete: only numbers need a terminator. */
	o = json_tokener_parse_ex(tok, t, (int)n);
	if (o && json_object_is_type(o, json_type_string))
		s = strdup(json_object_get_string(o));
	json_object_put(o);
	json_tokener_free(tok);
	return s;
}

static int cmp_str_ptr(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Finds a key that occurs twice among the scanned top-level members of t (offset base), and
 * writes it (malloc'ed) to *ret; *ret stays NULL if none is found. */
static int find_dup_key(const char *t, const struct scan *s, char **ret)
{
	char **keys;
	int r = 0;

	*ret = NULL;
	keys = calloc(s->n_members ? s->n_members : 1, sizeof(*keys));
	if (!keys)
		return -ENOMEM;
	for (size_t i = 0; i < s->n_members; i++) {
		keys[i] = json_decode_key(t + s->members[i].key_off,
		                          s->members[i].key_end - s->members[i].key_off);
		if (!keys[i]) {
			r = -ENOMEM;
			goto out;
		}
	}
	qsort(keys, s->n_members, sizeof(*keys), cmp_str_ptr);
	for (size_t i = 1; i < s->n_members; i++) {
		if (strcmp(keys[i - 1], keys[i]) == 0) {
			*ret = strdup(keys[i]);
			if (!*ret)
				r = -ENOMEM;
			break;
		}
	}
out:
	for (size_t i = 0; i < s->n_members; i++)
		free(keys[i]);
	free(keys);
	return r;
}

static uint64_t json_count_keys(struct json_object *o)
{
	uint64_t n = 0;

	if (json_object_is_type(o, json_type_object)) {
		struct json_object_iterator it = json_object_iter_begin(o);
		struct json_object_iterator end = json_object_iter_end(o);
		for (; !json_object_iter_equal(&it, &end); json_object_iter_next(&it))
			n += 1 + json_count_keys(json_object_iter_peek_value(&it));
	} else if (json_object_is_type(o, json_type_array)) {
		size_t len = json_object_array_length(o);
		for (size_t i = 0; i < len; i++)
			n += json_count_keys(json_object_array_get_idx(o, i));
	}
	return n;
}

/* Rejects repeated keys (see the top of the file). entry names what a top-level key is ("tensor
 * name", "key"). */
static int check_duplicates(const char *t, const struct scan *s, struct json_object *root,
                            const char *what, const char *entry, struct wf_diag *diag)
{
	struct json_object_iterator it, end;
	char *name = NULL;
	size_t i = 0;
	int r;

	if (json_count_keys(root) == s->n_keys)
		return 0;

	if (json_object_object_length(root) != (int)s->n_members) {
		r = find_dup_key(t, s, &name);
		if (r < 0)
			return r;
		if (name) {
			r = wf_diag_set(diag, WF_EDUPLICATE, "%s: duplicate %s '%s'", what,
			                strcmp(name, ST_METADATA) == 0 ? "key" : entry, name);
			free(name);
			return r;
		}
	}
	/* Top-level keys are unique here, and json-c iterates an object in insertion order, so the
	 * i-th member of the text is the i-th of the tree. */
	it = json_object_iter_begin(root);
	end = json_object_iter_end(root);
	for (; !json_object_iter_equal(&it, &end) && i < s->n_members;
	     json_object_iter_next(&it), i++) {
		struct json_object *v = json_object_iter_peek_value(&it);
		const struct scan_member *mb = &s->members[i];
		struct scan sub;

		if (!json_object_is_type(v, json_type_object) || mb->val_end <= mb->val_off)
			continue;
		r = scan_json(t + mb->val_off, mb->val_end - mb->val_off, SIZE_MAX, what, &sub,
		              NULL);
		if (r == 0 && (size_t)json_object_object_length(v) != sub.n_members)
			r = find_dup_key(t + mb->val_off, &sub, &name);
		scan_fini(&sub);
		if (r < 0)
			return r;
		if (name) {
			r = wf_diag_set(diag, WF_EDUPLICATE, "%s: duplicate key '%s' in '%s'", what,
			                name, json_object_iter_peek_name(&it));
			free(name);
			return r;
		}
	}
	return wf_diag_set(diag, WF_EDUPLICATE, "%s: duplicate key in a nested JSON object", what);
}

/* Parses text[0, len), which scan_json has accepted, into an object. */
static int json_parse_object(const char *text, size_t len, const char *what,
                             struct json_object **ret_root, struct wf_diag *diag)
{
	struct json_tokener *tok;
	struct json_object *root;
	enum json_tokener_error err;
	size_t end;

	if (len > INT_MAX)
		return wf_diag_set(diag, WF_ELIMIT, "%s: %zu bytes of JSON", what, len);
	tok = json_tokener_new_ex(SCAN_MAX_DEPTH + 2);
	if (!tok)
		return -ENOMEM;
	json_tokener_set_flags(tok, JSON_TOKENER_STRICT | JSON_TOKENER_VALIDATE_UTF8);
	root = json_tokener_parse_ex(tok, text, (int)len);
	err = json_tokener_get_error(tok);
	end = json_tokener_get_parse_end(tok);
	json_tokener_free(tok);
	if (!root) {
		if (err == json_tokener_continue)
			return wf_diag_set(diag, WF_EFORMAT,
			                   "%s: invalid JSON: the text ends inside a value", what);
		return wf_diag_set(diag, WF_EFORMAT, "%s: invalid JSON at byte %zu: %s", what, end,
		                   json_tokener_error_desc(err));
	}
	/* Strict mode rejects trailing characters, and the scan rejected NULs, so the whole text
	 * was consumed; check anyway rather than rely on both. */
	if (end != len) {
		json_object_put(root);
		return wf_diag_set(diag, WF_EFORMAT,
		                   "%s: trailing bytes after the JSON at byte %zu", what, end);
	}
	if (!json_object_is_type(root, json_type_object)) {
		enum json_type ty = json_object_get_type(root);
		json_object_put(root);
		return wf_diag_set(diag, WF_EFORMAT, "%s: top level is a JSON %s, not an object",
		                   what, json_type_to_name(ty));
	}
	*ret_root = root;
	return 0;
}

/* A JSON integer in [0, INT64_MAX): see the top of the file for why INT64_MAX itself is out. */
static int json_get_count(struct json_object *o, const char *what, const char *tname,
                          const char *field, uint64_t *ret, struct wf_diag *diag)
{
	int64_t v;

	if (!json_object_is_type(o, json_type_int))
		return wf_diag_set(diag, WF_EFORMAT,
		                   "%s: tensor '%s': %s must be a non-negative integer, not a %s",
		                   what, tname, field, json_type_to_name(json_object_get_type(o)));
	v = json_object_get_int64(o);
	if (v < 0)
		return wf_diag_set(diag, WF_EFORMAT, "%s: tensor '%s': %s is negative (%lld)", what,
		                   tname, field, (long long)v);
	if (v == INT64_MAX)
		return wf_diag_set(diag, WF_EOVERFLOW,
		                   "%s: tensor '%s': %s is out of range (2^63 - 1 or more)", what,
		                   tname, field);
	*ret = (uint64_t)v;
	return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Files
 * ------------------------------------------------------------------------------------------- */

static int pread_full(int fd, void *buf, size_t len, uint64_t off)
{
	char *p = buf;

	while (len > 0) {
		ssize_t r = pread(fd, p, len, (off_t)off);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (r == 0)
			return WF_ECHANGED; /* shorter than fstat said a moment ago */
		p += r;
		len -= (size_t)r;
		off += (uint64_t)r;
	}
	return 0;
}

static char *path_join(const char *dir, const char *name)
{
	char *p = NULL;

	if (!dir)
		return strdup(name);
	if (asprintf(&p, "%s/%s", dir, name) < 0)
		return NULL;
	return p;
}

/* The directory part of path (malloc'ed) in *ret_dir, or NULL when path has no '/'. */
static int path_dir(const char *path, char **ret_dir)
{
	const char *slash = strrchr(path, '/');

	*ret_dir = NULL;
	if (!slash)
		return 0;
	*ret_dir = slash == path ? strdup("/") : strndup(path, (size_t)(slash - path));
	return *ret_dir ? 0 : -ENOMEM;
}

/* Reads a whole small JSON file (index.json, config.json). A missing file is -ENOENT without a
 * diag, so that callers can treat it as absent. */
static int read_text_file(struct wf_model *m, const char *path, uint64_t max, char **ret_buf,
                          size_t *ret_len, struct wf_diag *diag)
{
	struct stat st;
	char *buf = NULL;
	int fd, r;

	/* A FIFO planted under a model's name must not hang the open (wf_model_file_open). */
	r = wf_model_file_open(path, &fd, &st, diag);
	if (r == -ENOENT)
		return r;
	if (r < 0)
		return wf_diag_set(diag, r, "open %s: %s", path, wf_strerror(r));
	r = wf__model_record_aux(m, fd);
	if (r < 0) {
		wf_diag_set(diag, r, "%s: resolving the opened file: %s", path, wf_strerror(r));
		goto out;
	}
	if ((uint64_t)st.st_size > max) {
		r = wf_diag_set(diag, WF_ELIMIT, "%s: %llu bytes, more than the %llu allowed", path,
		                (unsigned long long)st.st_size, (unsigned long long)max);
		goto out;
	}
	buf = malloc((size_t)st.st_size + 1);
	if (!buf) {
		r = -ENOMEM;
		goto out;
	}
	r = pread_full(fd, buf, (size_t)st.st_size, 0);
	if (r < 0) {
		wf_diag_set(diag, r, "read %s: %s", path, wf_strerror(r));
		free(buf);
		goto out;
	}
	buf[st.st_size] = '\0';
	*ret_buf = buf;
	*ret_len = (size_t)st.st_size;
out:
	close(fd);
	return r;
}

/* ---------------------------------------------------------------------------------------------
 * One .safetensors file
 * ------------------------------------------------------------------------------------------- */
static int load_metadata(struct json_object *md, const char *what, struct wf_kv_set *kv,
                         struct wf_diag *diag)
{
	struct json_object_iterator it, end;
	int n;

	/* The reference reads __metadata__ as Option<HashMap<String, String>>: null is absent. */
	if (json_object_is_type(md, json_type_null))
		return 0;
	if (!json_object_is_type(md, json_type_object))
		return wf_diag_set(diag, WF_EFORMAT, "%s: __metadata__ is a %s, not an object",
		                   what, json_type_to_name(json_object_get_type(md)));
	n = json_object_object_length(md);
	if ((uint64_t)n > WF_MODEL_MAX_KV)
		return wf_diag_set(diag, WF_ELIMIT, "%s: %d __metadata__ entries, more than %d",
		                   what, n, WF_MODEL_MAX_KV);
	it = json_object_iter_begin(md);
	end = json_object_iter_end(md);
	for (; !json_object_iter_equal(&it, &end); json_object_iter_next(&it)) {
		const char *key = json_object_iter_peek_name(&it);
		struct json_object *v = json_object_iter_peek_value(&it);
		if (!json_object_is_type(v, json_type_string))
			return wf_diag_set(diag, WF_EFORMAT,
			                   "%s: __metadata__ '%s' is a %s; safetensors metadata "
			                   "values are strings",
			                   what, key, json_type_to_name(json_object_get_type(v)));
		if (strlen(key) > WF_MODEL_MAX_NAME)
			return wf_diag_set(diag, WF_ELIMIT,
			                   "%s: __metadata__ key longer than %d bytes", what,
			                   WF_MODEL_MAX_NAME);
	}
	if (!kv || n == 0)
		return 0;

	kv->items = calloc((size_t)n, sizeof(*kv->items));
	if (!kv->items)
		return -ENOMEM;
	it = json_object_iter_begin(md);
	for (; !json_object_iter_equal(&it, &end); json_object_iter_next(&it)) {
		struct json_object *v = json_object_iter_peek_value(&it);
		struct wf_kv *item = &kv->items[kv->n];
		size_t len = (size_t)json_object_get_string_len(v);

		item->key = strdup(json_object_iter_peek_name(&it));
		item->v.type = WF_KV_STRING;
		item->v.u.str.s = malloc(len + 1);
		item->v.u.str.n = len;
		/* Count the item before checking, so that a failure frees what it holds. */
		kv->n++;
		if (!item->key || !item->v.u.str.s)
			return -ENOMEM;
		memcpy(item->v.u.str.s, json_object_get_string(v), len);
		item->v.u.str.s[len] = '\0';
	}
	return 0;
}

/* Looks up a field of a tensor entry with the given JSON type. */
static int entry_field(struct json_object *e, const char *key, enum json_type type,
                       const char *what, const char *tname, struct json_object **ret,
                       struct wf_diag *diag)
{
	struct json_object *v;

	if (!json_object_object_get_ex(e, key, &v))
		return wf_diag_set(diag, WF_EFORMAT, "%s: tensor '%s' has no %s", what, tname, key);
	if (!json_object_is_type(v, type))
		return wf_diag_set(diag, WF_EFORMAT, "%s: tensor '%s': %s is a %s, not a %s", what,
		                   tname, key, json_type_to_name(json_object_get_type(v)),
		                   json_type_to_name(type));
	*ret = v;
	return 0;
}

/* Fills t (name set by the caller) from a tensor entry; *ret_begin/end are its data_offsets. */
static int load_tensor(struct json_object *e, const char *what, uint64_t data_size,
                       struct wf_tensor *t, uint64_t *ret_begin, struct wf_diag *diag)
{
	struct json_object *jdtype, *jshape, *joff;
	uint64_t dims[WF_MODEL_MAX_DIMS], off[2], nbytes;
	const char *dname;
	size_t n_dims;
	char field[32];
	int r;

	if (!json_object_is_type(e, json_type_object))
		return wf_diag_set(diag, WF_EFORMAT,
		                   "%s: tensor '%s': entry is a %s, not an object", what, t->name,
		                   json_type_to_name(json_object_get_type(e)));
	r = entry_field(e, "dtype", json_type_string, what, t->name, &jdtype, diag);
	if (r < 0)
		return r;
	r = entry_field(e, "shape", json_type_array, what, t->name, &jshape, diag);
	if (r < 0)
		return r;
	r = entry_field(e, "data_offsets", json_type_array, what, t->name, &joff, diag);
	if (r < 0)
		return r;

	dname = json_object_get_string(jdtype);
	if (wf_dtype_from_name(dname, &t->dtype) < 0 || !wf_dtype_is_safetensors(t->dtype) ||
	    strlen(dname) != (size_t)json_object_get_string_len(jdtype))
		return wf_diag_set(diag, WF_EUNKNOWN_TYPE, "%s: tensor '%s': unknown dtype '%s'",
		                   what, t->name, dname);

	n_dims = json_object_array_length(jshape);
	if (n_dims > WF_MODEL_MAX_DIMS)
		return wf_diag_set(diag, WF_ELIMIT, "%s: tensor '%s': %zu dimensions, more than %d",
		                   what, t->name, n_dims, WF_MODEL_MAX_DIMS);
	for (size_t i = 0; i < n_dims; i++) {
		snprintf(field, sizeof(field), "shape[%zu]", i);
		r = json_get_count(json_object_array_get_idx(jshape, i), what, t->name, field,
		                   &dims[i], diag);
		if (r < 0)
			return r;
	}
	if (json_object_array_length(joff) != 2)
		return wf_diag_set(diag, WF_EFORMAT,
		                   "%s: tensor '%s': data_offsets has %zu elements, not 2", what,
		                   t->name, json_object_array_length(joff));
	for (size_t i = 0; i < 2; i++) {
		snprintf(field, sizeof(field), "data_offsets[%zu]", i);
		r = json_get_count(json_object_array_get_idx(joff, i), what, t->name, field,
		                   &off[i], diag);
		if (r < 0)
			return r;
	}

	/* safetensors shape is row-major; ggml's ne[0] is the contiguous dimension. */
	t->n_dims = (uint32_t)n_dims;
	for (size_t i = 0; i < WF_MODEL_MAX_DIMS; i++)
		t->ne[i] = i < n_dims ? (int64_t)dims[n_dims - 1 - i] : 1;
	r = wf_dtype_nbytes(t->dtype, t->n_dims, t->ne, &nbytes);
	if (r < 0)
		return wf_diag_set(diag, r,
		                   "%s: tensor '%s': shape and dtype give no byte size: %s", what,
		                   t->name, wf_strerror(r));

	if (off[0] > off[1])
		return wf_diag_set(diag, WF_EFORMAT,
		                   "%s: tensor '%s': data_offsets begin %llu > end %llu", what,
		                   t->name, (unsigned long long)off[0], (unsigned long long)off[1]);
	if (off[1] > data_size)
		return wf_diag_set(
		    diag, WF_ETRUNCATED,
		    "%s: tensor '%s': data_offsets end %llu beyond data section %llu", what,
		    t->name, (unsigned long long)off[1], (unsigned long long)data_size);
	if (off[1] - off[0] != nbytes)
		return wf_diag_set(diag, WF_EFORMAT,
		                   "%s: tensor '%s': data_offsets span %llu bytes but dtype %s and "
		                   "shape need %llu",
		                   what, t->name, (unsigned long long)(off[1] - off[0]), dname,
		                   (unsigned long long)nbytes);
	t->nbytes = nbytes;
	*ret_begin = off[0];
	return 0;
}

static int cmp_tensor_offset(const void *a, const void *b)
{
	const struct wf_tensor *x = a, *y = b;

	if (x->offset != y->offset)
		return x->offset < y->offset ? -1 : 1;
	if (x->nbytes != y->nbytes)
		return x->nbytes < y->nbytes ? -1 : 1;
	return strcmp(x->name, y->name);
}

/* The tensors of one file, sorted by offset, must tile its data section exactly. */
static int check_tiling(const struct wf_tensor *t, uint32_t n, const struct wf_model_file *f,
                        const char *what, struct wf_diag *diag)
{
	uint64_t expect = 0;

	for (uint32_t i = 0; i < n; i++) {
		uint64_t begin = t[i].offset - f->data_offset;
		if (begin < expect)
			return wf_diag_set(diag, WF_EOVERLAP,
			                   "%s: tensors '%s' [%llu, %llu) and '%s' [%llu, %llu) "
			                   "overlap",
			                   what, t[i - 1].name,
			                   (unsigned long long)(t[i - 1].offset - f->data_offset),
			                   (unsigned long long)expect, t[i].name,
			                   (unsigned long long)begin,
			                   (unsigned long long)(begin + t[i].nbytes));
		if (begin > expect)
			return wf_diag_set(
			    diag, WF_EFORMAT,
			    "%s: data bytes [%llu, %llu) before tensor '%s' belong to "
			    "no tensor (safetensors indexes the whole buffer)",
			    what, (unsigned long long)expect, (unsigned long long)begin, t[i].name);
		expect = begin + t[i].nbytes;
	}
	if (expect != f->data_size)
		return wf_diag_set(diag, WF_EFORMAT,
		                   "%s: %llu bytes after the last tensor belong to no tensor "
		                   "(safetensors indexes the whole buffer)",
		                   what, (unsigned long long)(f->data_size - expect));
	return 0;
}

/* Reads and checks the header of m->files[fi] and appends its tensors to m->tensors. kv receives
 * __metadata__ (NULL to skip). index names the index.json that listed this file as a shard (NULL
 * for a single file): a missing shard is then WF_ESHARD. */
static int load_file(struct wf_model *m, uint32_t fi, struct wf_kv_set *kv, const char *index,
                     struct wf_diag *diag)
{
	struct wf_model_file *f = &m->files[fi];
	const char *what = f->path;
	struct json_object *root = NULL;
	struct scan sc = {0};
	struct stat st;
	char *hdr = NULL;
	uint8_t lenbuf[8];
	uint64_t n = 0;
	uint32_t base = m->n_tensors, count;
	int fd, r;

	r = wf_model_file_open(f->path, &fd, &st, diag); /* see read_text_file */
	if (r < 0) {
		if (index && r == -ENOENT)
			return wf_diag_set(diag, WF_ESHARD, "shard %s named in %s is missing",
			                   f->path, index);
		return wf_diag_set(diag, r, "open %s: %s", f->path, wf_strerror(r));
	}
	r = wf__model_record_file(f, fd, &st);
	if (r < 0) {
		wf_diag_set(diag, r, "%s: resolving the opened file: %s", what, wf_strerror(r));
		goto out;
	}
	f->size = (uint64_t)st.st_size;
	f->mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
	f->alignment = 1;
	f->gguf_version = 0;

	if (f->size < 8) {
		r = wf_diag_set(diag, WF_ETRUNCATED,
		                "%s: %llu bytes, too short for the 8-byte header length", what,
		                (unsigned long long)f->size);
		goto out;
	}
	r = pread_full(fd, lenbuf, sizeof(lenbuf), 0);
	if (r < 0) {
		wf_diag_set(diag, r, "read %s: %s", what, wf_strerror(r));
		goto out;
	}
	for (int i = 7; i >= 0; i--)
		n = n << 8 | lenbuf[i];
	/* Both caps come before the allocation: a forged length can cost neither memory nor a
	 * long read. */
	if (n > f->size - 8) {
		r = wf_diag_set(diag, WF_ETRUNCATED,
		                "%s: header length %llu exceeds the %llu bytes after the length "
		                "field",
		                what, (unsigned long long)n, (unsigned long long)(f->size - 8));
		goto out;
	}
	if (n > WF_MODEL_MAX_HEADER) {
		r = wf_diag_set(diag, WF_ELIMIT, "%s: header length %llu exceeds the limit of %llu",
		                what, (unsigned long long)n,
		                (unsigned long long)WF_MODEL_MAX_HEADER);
		goto out;
	}
	if (n == 0) {
		r = wf_diag_set(diag, WF_EFORMAT, "%s: empty header", what);
		goto out;
	}
	f->data_offset = 8 + n;
	f->data_size = f->size - f->data_offset;
	hdr = malloc((size_t)n);
	if (!hdr) {
		r = -ENOMEM;
		goto out;
	}
	r = pread_full(fd, hdr, (size_t)n, 8);
	if (r < 0) {
		wf_diag_set(diag, r, "read %s: %s", what, wf_strerror(r));
		goto out;
	}

	r = scan_json(hdr, (size_t)n, (size_t)WF_MODEL_MAX_TENSORS + 1, what, &sc, diag);
	if (r < 0)
		goto out;
	/* What a valid header of this many entries can hold: one object per entry plus the top,
	 * two arrays per entry (shape, data_offsets; room left for unknown fields), and about 18
	 * separators per entry plus two per metadata pair. Anything past that is rejected before
	 * json-c allocates a tree for it. */
	if (sc.n_objects > sc.n_members + 1 || sc.n_arrays > 4 * (uint64_t)sc.n_members + 16 ||
	    sc.n_tokens > 32 * (uint64_t)sc.n_members + 2 * (uint64_t)WF_MODEL_MAX_KV + 64) {
		r = wf_diag_set(diag, WF_EFORMAT,
		                "%s: header has %llu objects, %llu arrays and %llu separators for "
		                "%zu entries, more than any safetensors header of that size",
		                what, (unsigned long long)sc.n_objects,
		                (unsigned long long)sc.n_arrays, (unsigned long long)sc.n_tokens,
		                sc.n_members);
		goto out;
	}
	r = json_parse_object(hdr, (size_t)n, what, &root, diag);
	if (r < 0)
		goto out;
	r = check_duplicates(hdr, &sc, root, what, "tensor name", diag);
	if (r < 0)
		goto out;

	count = (uint32_t)sc.n_members;
	if (json_object_object_get_ex(root, ST_METADATA, NULL))
		count--;
	if (count > WF_MODEL_MAX_TENSORS - m->n_tensors) {
		r = wf_diag_set(diag, WF_ELIMIT, "%s: more than %u tensors in the model", what,
		                WF_MODEL_MAX_TENSORS);
		goto out;
	}
	if (count > 0) {
		struct wf_tensor *p = realloc(m->tensors, (base + count) * sizeof(*p));
		if (!p) {
			r = -ENOMEM;
			goto out;
		}
		m->tensors = p;
	}

	{
		struct json_object_iterator it = json_object_iter_begin(root);
		struct json_object_iterator end = json_object_iter_end(root);
		for (; !json_object_iter_equal(&it, &end); json_object_iter_next(&it)) {
			const char *name = json_object_iter_peek_name(&it);
			struct json_object *v = json_object_iter_peek_value(&it);
			struct wf_tensor *t;
			uint64_t begin = 0;

			if (strcmp(name, ST_METADATA) == 0) {
				r = load_metadata(v, what, kv, diag);
				if (r < 0)
					goto out;
				continue;
			}
			if (strlen(name) > WF_MODEL_MAX_NAME) {
				r = wf_diag_set(diag, WF_ELIMIT,
				                "%s: tensor name longer than %d bytes: '%.64s...'",
				                what, WF_MODEL_MAX_NAME, name);
				goto out;
			}
			t = &m->tensors[m->n_tensors];
			memset(t, 0, sizeof(*t));
			t->name = strdup(name);
			if (!t->name) {
				r = -ENOMEM;
				goto out;
			}
			/* Counted now so that a failure below still frees the name. */
			m->n_tensors++;
			t->file = fi;
			r = load_tensor(v, what, f->data_size, t, &begin, diag);
			if (r < 0)
				goto out;
			t->offset = f->data_offset + begin;
		}
	}

	f->n_tensors = m->n_tensors - base;
	if (f->n_tensors > 1)
		qsort(m->tensors + base, f->n_tensors, sizeof(*m->tensors), cmp_tensor_offset);
	/* With no tensors m->tensors may be NULL: no arithmetic on it. */
	r = check_tiling(f->n_tensors ? m->tensors + base : NULL, f->n_tensors, f, what, diag);
out:
	json_object_put(root);
	scan_fini(&sc);
	free(hdr);
	close(fd);
	return r;
}

/* ---------------------------------------------------------------------------------------------
 * Sharded models: model.safetensors.index.json
 *   {"metadata": {"total_size": N, ...}, "weight_map": {"<tensor>": "<shard file>", ...}}
 * ------------------------------------------------------------------------------------------- */

static int cmp_tensor_name_ptr(const void *a, const void *b)
{
	const struct wf_tensor *x = *(const struct wf_tensor *const *)a;
	const struct wf_tensor *y = *(const struct wf_tensor *const *)b;

	return strcmp(x->name, y->name);
}

/* Each weight_map entry names a tensor its shard holds, and each shard tensor is in weight_map
 * under that shard. */
static int check_weight_map(const struct wf_model *m, struct json_object *wmap, const char *index,
                            char **shards, struct wf_diag *diag)
{
	struct wf_tensor **by_name = NULL;
	int r = 0;

	for (uint32_t i = 0; i < m->n_tensors; i++) {
		const struct wf_tensor *t = &m->tensors[i];
		struct json_object *v;
		const char *want = shards[t->file];

		if (!json_object_object_get_ex(wmap, t->name, &v))
			return wf_diag_set(diag, WF_ESHARD,
			                   "%s: tensor '%s' in shard %s is not in weight_map",
			                   index, t->name, want);
		if (strcmp(json_object_get_string(v), want) != 0)
			return wf_diag_set(
			    diag, WF_ESHARD,
			    "%s: tensor '%s' is in shard %s but weight_map puts it in "
			    "%s",
			    index, t->name, want, json_object_get_string(v));
	}
	/* Each tensor matched a distinct entry (names are unique within a shard, and a name in
	 * two shards fails above), so equal counts mean every entry is matched. */
	if ((uint64_t)json_object_object_length(wmap) == m->n_tensors)
		return 0;

	by_name = malloc((m->n_tensors ? m->n_tensors : 1) * sizeof(*by_name));
	if (!by_name)
		return -ENOMEM;
	for (uint32_t i = 0; i < m->n_tensors; i++)
		by_name[i] = &m->tensors[i];
	qsort(by_name, m->n_tensors, sizeof(*by_name), cmp_tensor_name_ptr);
	{
		struct json_object_iterator it = json_object_iter_begin(wmap);
		struct json_object_iterator end = json_object_iter_end(wmap);
		for (; !json_object_iter_equal(&it, &end); json_object_iter_next(&it)) {
			struct wf_tensor key = {.name = (char *)json_object_iter_peek_name(&it)};
			struct wf_tensor *kp = &key;
			if (!bsearch(&kp, by_name, m->n_tensors, sizeof(*by_name),
			             cmp_tensor_name_ptr)) {
				r = wf_diag_set(
				    diag, WF_ESHARD,
				    "%s: weight_map puts tensor '%s' in shard %s, which "
				    "does not hold it",
				    index, key.name,
				    json_object_get_string(json_object_iter_peek_value(&it)));
				break;
			}
		}
	}
	free(by_name);
	if (r == 0)
		r = wf_diag_set(diag, WF_EINTERNAL, "%s: weight_map does not match the shards",
		                index);
	return r;
}

/* A shard must be a plain file name beside the index: weight_map comes from the model's
 * publisher, and "../" or an absolute path would make us read files outside the model. */
static bool shard_name_ok(struct json_object *v)
{
	const char *s = json_object_get_string(v);
	size_t len = (size_t)json_object_get_string_len(v);

	return len > 0 && strlen(s) == len && !strchr(s, '/') && strcmp(s, ".") != 0 &&
	       strcmp(s, "..") != 0;
}

static int load_index(struct wf_model *m, const char *index, struct wf_diag *diag)
{
	struct json_object *root = NULL, *wmap;
	struct scan sc = {0};
	char *text = NULL, *dir = NULL;
	char **shards = NULL;
	size_t len = 0, n_entries, n_shards = 0;
	int r;

	r = read_text_file(m, index, WF_MODEL_MAX_HEADER, &text, &len, diag);
	if (r == -ENOENT)
		return wf_diag_set(diag, r, "open %s: %s", index, strerror(ENOENT));
	if (r < 0)
		return r;
	r = scan_json(text, len, 64, index, &sc, diag);
	if (r < 0)
		goto out;
	/* An index is a few objects and one string pair per tensor. */
	if (sc.n_objects > 256 || sc.n_arrays > 256 ||
	    sc.n_tokens > 2 * (uint64_t)WF_MODEL_MAX_TENSORS + 4096) {
		r = wf_diag_set(diag, WF_ELIMIT, "%s: too many JSON values for an index", index);
		goto out;
	}
	r = json_parse_object(text, len, index, &root, diag);
	if (r < 0)
		goto out;
	r = check_duplicates(text, &sc, root, index, "key", diag);
	if (r < 0)
		goto out;
	if (!json_object_object_get_ex(root, "weight_map", &wmap) ||
	    !json_object_is_type(wmap, json_type_object)) {
		r = wf_diag_set(diag, WF_EFORMAT, "%s: no weight_map object", index);
		goto out;
	}
	n_entries = (size_t)json_object_object_length(wmap);
	if (n_entries == 0) {
		r = wf_diag_set(diag, WF_EFORMAT, "%s: weight_map is empty", index);
		goto out;
	}
	if (n_entries > WF_MODEL_MAX_TENSORS) {
		r = wf_diag_set(diag, WF_ELIMIT, "%s: %zu tensors, more than %u", index, n_entries,
		                WF_MODEL_MAX_TENSORS);
		goto out;
	}

	/* The distinct shard names, sorted: file order (and so the digest) does not depend on the
	 * order of weight_map. They point into the json-c tree. */
	shards = malloc(n_entries * sizeof(*shards));
	if (!shards) {
		r = -ENOMEM;
		goto out;
	}
	{
		struct json_object_iterator it = json_object_iter_begin(wmap);
		struct json_object_iterator end = json_object_iter_end(wmap);
		for (; !json_object_iter_equal(&it, &end); json_object_iter_next(&it)) {
			struct json_object *v = json_object_iter_peek_value(&it);
			if (!json_object_is_type(v, json_type_string) || !shard_name_ok(v)) {
				r = wf_diag_set(diag, WF_EFORMAT,
				                "%s: weight_map entry '%s' is not a shard file "
				                "name beside the index",
				                index, json_object_iter_peek_name(&it));
				goto out;
			}
			shards[n_shards++] = (char *)json_object_get_string(v);
		}
	}
	qsort(shards, n_shards, sizeof(*shards), cmp_str_ptr);
	{
		size_t u = 0;
		for (size_t i = 0; i < n_shards; i++)
			if (u == 0 || strcmp(shards[u - 1], shards[i]) != 0)
				shards[u++] = shards[i];
		n_shards = u;
	}
	if (n_shards > WF_MODEL_MAX_FILES) {
		r = wf_diag_set(diag, WF_ELIMIT, "%s: %zu shards, more than %d", index, n_shards,
		                WF_MODEL_MAX_FILES);
		goto out;
	}

	r = path_dir(index, &dir);
	if (r < 0)
		goto out;
	m->files = calloc(n_shards, sizeof(*m->files));
	if (!m->files) {
		r = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < n_shards; i++) {
		m->files[i].path = path_join(dir, shards[i]);
		m->n_files++;
		if (!m->files[i].path) {
			r = -ENOMEM;
			goto out;
		}
	}
	/* Each shard is opened once; like GGUF, the first shard's metadata is the model's. */
	for (uint32_t i = 0; i < m->n_files; i++) {
		r = load_file(m, i, i == 0 ? &m->kv : NULL, index, diag);
		if (r < 0)
			goto out;
	}
	r = check_weight_map(m, wmap, index, shards, diag);
out:
	free(shards);
	free(dir);
	json_object_put(root);
	scan_fini(&sc);
	free(text);
	return r;
}

/* ---------------------------------------------------------------------------------------------
 * config.json (Hugging Face) -> hparams
 * ------------------------------------------------------------------------------------------- */

struct hp_u32_key {
	const char *key;
	size_t off;
};

/* Several names for one field: the first present wins. */
static const struct hp_u32_key hp_u32_keys[] = {
    {"num_hidden_layers", offsetof(struct wf_hparams, n_layer)},
    {"hidden_size", offsetof(struct wf_hparams, n_embd)},
    {"num_attention_heads", offsetof(struct wf_hparams, n_head)},
    {"num_key_value_heads", offsetof(struct wf_hparams, n_head_kv)},
    {"head_dim", offsetof(struct wf_hparams, head_dim)},
    {"intermediate_size", offsetof(struct wf_hparams, n_ff)},
    {"moe_intermediate_size", offsetof(struct wf_hparams, n_ff_exp)},
    {"num_experts", offsetof(struct wf_hparams, n_expert)},
    {"num_local_experts", offsetof(struct wf_hparams, n_expert)},
    {"n_routed_experts", offsetof(struct wf_hparams, n_expert)},
    {"num_experts_per_tok", offsetof(struct wf_hparams, n_expert_used)},
    {"max_position_embeddings", offsetof(struct wf_hparams, n_ctx_train)},
    {"vocab_size", offsetof(struct wf_hparams, n_vocab)},
    {"rotary_dim", offsetof(struct wf_hparams, rope_dim)},
    {"qk_rope_head_dim", offsetof(struct wf_hparams, rope_dim)},
};

/* The value of key in the top level, else in text_config (multimodal models keep the language
 * model's settings there). JSON null counts as absent: configs write "head_dim": null. */
static struct json_object *config_get(struct json_object *root, struct json_object *text_cfg,
                                      const char *key)
{
	struct json_object *v;

	if (json_object_object_get_ex(root, key, &v) && !json_object_is_type(v, json_type_null))
		return v;
	if (text_cfg && json_object_object_get_ex(text_cfg, key, &v) &&
	    !json_object_is_type(v, json_type_null))
		return v;
	return NULL;
}

static int config_number(struct json_object *v, const char *path, const char *key, double *ret,
                         struct wf_diag *diag)
{
	double d;

	if (!json_object_is_type(v, json_type_double) && !json_object_is_type(v, json_type_int))
		return wf_diag_set(diag, WF_EFORMAT, "%s: %s is a %s, not a number", path, key,
		                   json_type_to_name(json_object_get_type(v)));
	d = json_object_get_double(v);
	if (!isfinite(d) || d < 0 || d > 3.0e38)
		return wf_diag_set(diag, WF_EFORMAT, "%s: %s = %g is out of range", path, key, d);
	*ret = d;
	return 0;
}

static int load_config(struct wf_model *m, struct wf_hparams *hp, const char *path,
                       struct wf_diag *diag)
{
	struct json_object *root = NULL, *text_cfg = NULL, *v;
	struct wf_hparams h = {0};
	struct scan sc = {0};
	char *text = NULL;
	size_t len = 0;
	double d;
	int r;

	r = read_text_file(m, path, ST_MAX_CONFIG, &text, &len, diag);
	if (r == -ENOENT)
		return 0; /* no config.json: hparams stay zero */
	if (r < 0)
		return r;
	r = scan_json(text, len, 65536, path, &sc, diag);
	if (r < 0)
		goto out;
	if (sc.n_objects > 4096 || sc.n_arrays > 65536 || sc.n_tokens > (1u << 20)) {
		r = wf_diag_set(diag, WF_ELIMIT, "%s: too many JSON values for a config", path);
		goto out;
	}
	r = json_parse_object(text, len, path, &root, diag);
	if (r < 0)
		goto out;
	r = check_duplicates(text, &sc, root, path, "key", diag);
	if (r < 0)
		goto out;
	if (json_object_object_get_ex(root, "text_config", &v) &&
	    json_object_is_type(v, json_type_object))
		text_cfg = v;

	v = config_get(root, text_cfg, "model_type");
	if (v) {
		if (!json_object_is_type(v, json_type_string) ||
		    (size_t)json_object_get_string_len(v) >= sizeof(h.arch) ||
		    strlen(json_object_get_string(v)) != (size_t)json_object_get_string_len(v)) {
			r = wf_diag_set(diag, WF_EFORMAT,
			                "%s: model_type must be a string shorter than %zu bytes",
			                path, sizeof(h.arch));
			goto out;
		}
		memcpy(h.arch, json_object_get_string(v), (size_t)json_object_get_string_len(v));
	}
	for (size_t i = 0; i < sizeof(hp_u32_keys) / sizeof(hp_u32_keys[0]); i++) {
		uint32_t *field = (uint32_t *)((char *)&h + hp_u32_keys[i].off);
		int64_t x;

		v = config_get(root, text_cfg, hp_u32_keys[i].key);
		if (!v || *field != 0)
			continue;
		x = json_object_get_int64(v);
		if (!json_object_is_type(v, json_type_int) || x < 0 || x > UINT32_MAX) {
			r = wf_diag_set(diag, WF_EFORMAT,
			                "%s: %s must be an integer in [0, 2^32), not %s", path,
			                hp_u32_keys[i].key, json_object_to_json_string(v));
			goto out;
		}
		*field = (uint32_t)x;
	}
	v = config_get(root, text_cfg, "rope_theta");
	if (!v) {
		/* transformers 5 moved it into rope_parameters */
		struct json_object *rp = config_get(root, text_cfg, "rope_parameters");
		if (rp && json_object_is_type(rp, json_type_object))
			json_object_object_get_ex(rp, "rope_theta", &v);
	}
	if (v) {
		r = config_number(v, path, "rope_theta", &d, diag);
		if (r < 0)
			goto out;
		h.rope_freq_base = (float)d;
	}
	v = config_get(root, text_cfg, "rms_norm_eps");
	if (v) {
		r = config_number(v, path, "rms_norm_eps", &d, diag);
		if (r < 0)
			goto out;
		h.rms_eps = (float)d;
	}

	/* Derived values, as the GGUF converter would write them. */
	if (h.head_dim == 0 && h.n_head > 0)
		h.head_dim = h.n_embd / h.n_head;
	if (h.n_ff_exp == 0)
		h.n_ff_exp = h.n_ff;
	if (h.rope_dim == 0) {
		v = config_get(root, text_cfg, "partial_rotary_factor");
		h.rope_dim = h.head_dim;
		if (v) {
			r = config_number(v, path, "partial_rotary_factor", &d, diag);
			if (r < 0)
				goto out;
			if (d > 1) {
				r = wf_diag_set(diag, WF_EFORMAT,
				                "%s: partial_rotary_factor %g is above 1", path, d);
				goto out;
			}
			h.rope_dim = (uint32_t)(h.head_dim * d);
		}
	}
	*hp = h;
out:
	json_object_put(root);
	scan_fini(&sc);
	free(text);
	return r;
}

/* ---------------------------------------------------------------------------------------------
 * Entry point
 * ------------------------------------------------------------------------------------------- */

static bool has_suffix(const char *s, const char *suffix)
{
	size_t n = strlen(s), k = strlen(suffix);

	return n >= k && strcmp(s + n - k, suffix) == 0;
}

static int load_single(struct wf_model *m, const char *path)
{
	m->files = calloc(1, sizeof(*m->files));
	if (!m->files)
		return -ENOMEM;
	m->files[0].path = strdup(path);
	if (!m->files[0].path)
		return -ENOMEM;
	m->n_files = 1;
	return 0;
}

/* On failure m may hold part of what was loaded, always consistently (counts cover exactly the
 * initialised entries), for the caller to free as a whole. */
int wf__safetensors_load(struct wf_model *m, const char *path, struct wf_diag *diag)
{
	char *dir = NULL, *target = NULL, *config = NULL;
	bool index = false;
	struct stat st;
	int r;

	m->format = WF_MODEL_FORMAT_SAFETENSORS;
	if (stat(path, &st) < 0)
		return wf_diag_set(diag, -errno, "stat %s: %s", path, strerror(errno));
	if (S_ISDIR(st.st_mode)) {
		dir = strdup(path);
		target = path_join(path, ST_INDEX_NAME);
		if (!dir || !target) {
			r = -ENOMEM;
			goto out;
		}
		if (access(target, F_OK) == 0) {
			index = true;
		} else {
			free(target);
			target = path_join(path, ST_SINGLE_NAME);
			if (!target) {
				r = -ENOMEM;
				goto out;
			}
			if (access(target, F_OK) != 0) {
				r = wf_diag_set(diag, WF_ENOT_FOUND,
				                "%s: no %s or %s in this directory", path,
				                ST_INDEX_NAME, ST_SINGLE_NAME);
				goto out;
			}
		}
	} else {
		target = strdup(path);
		if (!target) {
			r = -ENOMEM;
			goto out;
		}
		r = path_dir(path, &dir);
		if (r < 0)
			goto out;
		index = has_suffix(path, ".json");
	}

	if (index) {
		r = load_index(m, target, diag);
	} else {
		r = load_single(m, target);
		if (r == 0)
			r = load_file(m, 0, &m->kv, NULL, diag);
	}
	if (r < 0)
		goto out;

	config = path_join(dir, ST_CONFIG_NAME);
	if (!config) {
		r = -ENOMEM;
		goto out;
	}
	r = load_config(m, &m->hp, config, diag);
out:
	free(config);
	free(target);
	free(dir);
	return r;
}
