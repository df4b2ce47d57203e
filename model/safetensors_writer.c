#include "model/safetensors_writer.h"

#include "base/error.h"
#include "model/model.h"

#include <json-c/json.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define DEFAULT_BUFFER (4u << 20)
#define ST_METADATA    "__metadata__"

typedef unsigned long long ull;

enum writer_state {
	STATE_BUILD = 0, /* metadata and tensors may be added */
	STATE_DONE,      /* the file is in place */
	STATE_FAILED,    /* finish failed: only destroy is left */
};

struct st_tensor {
	char *name;
	enum wf_dtype dtype;
	uint32_t n_dims;
	int64_t shape[WF_MODEL_MAX_DIMS];
	uint64_t nbytes;
	uint32_t elem_size; /* bytes per element: orders the data section */
	const void *data;
	wf_st_fill_fn fill;
	void *arg;
	uint64_t begin; /* data_offsets[0], set by finish */
};

struct st_meta {
	char *key;
	char *value;
};

struct wf_st_writer {
	char *path;
	struct wf_st_writer_opts opts;
	enum writer_state state;

	struct st_meta *meta;
	uint32_t n_meta, cap_meta;

	struct st_tensor *tensors;
	uint32_t n_tensors, cap_tensors;
	uint32_t *slots; /* open-addressing name set: tensor index + 1, 0 = empty */
	uint32_t n_slots;
	uint64_t data_bytes;

	char *tmp_path; /* exists on disk while finish runs */
};

/* Same rules as the reader's (model/safetensors.c): RFC 3629, which the reader enforces, so a
 * name the writer accepts is one the reader accepts. */
static bool utf8_valid(const char *s)
{
	const unsigned char *p = (const unsigned char *)s;

	while (*p) {
		uint32_t cp, min;
		size_t len;

		if (p[0] < 0x80) {
			p++;
			continue;
		}
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
			return false;
		}
		for (size_t i = 1; i < len; i++) {
			if ((p[i] & 0xc0) != 0x80) /* also stops at the NUL */
				return false;
			cp = cp << 6 | (p[i] & 0x3f);
		}
		if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
			return false;
		p += len;
	}
	return true;
}

static uint64_t hash_name(const char *s)
{
	uint64_t h = 1469598103934665603ull; /* FNV-1a */

	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 1099511628211ull;
	return h;
}

/* The slot for name: the one holding it, or the empty one where it would go. */
static uint32_t *slot_find(const struct wf_st_writer *w, const char *name)
{
	uint32_t mask = w->n_slots - 1;
	uint32_t i = (uint32_t)hash_name(name) & mask;

	for (;; i = (i + 1) & mask) {
		uint32_t *s = &w->slots[i];
		if (*s == 0 || strcmp(w->tensors[*s - 1].name, name) == 0)
			return s;
	}
}

/* Keeps the table at most half full. */
static int slots_reserve(struct wf_st_writer *w, uint32_t n)
{
	uint32_t want = 64;
	uint32_t *old = w->slots, old_n = w->n_slots;

	while (want < 2 * (uint64_t)n)
		want *= 2;
	if (want <= w->n_slots)
		return 0;
	w->slots = calloc(want, sizeof(*w->slots));
	if (!w->slots) {
		w->slots = old;
		return -ENOMEM;
	}
	w->n_slots = want;
	for (uint32_t i = 0; i < old_n; i++)
		if (old[i])
			*slot_find(w, w->tensors[old[i] - 1].name) = old[i];
	free(old);
	return 0;
}

int wf_st_writer_create(const char *path, const struct wf_st_writer_opts *opts,
                        struct wf_st_writer **ret_writer, struct wf_diag *diag)
{
	struct wf_st_writer *w;

	if (!path || !*path || !ret_writer)
		return wf_diag_set(diag, WF_EINVAL, "wf_st_writer_create: no path");
	w = calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	w->path = strdup(path);
	if (!w->path) {
		free(w);
		return -ENOMEM;
	}
	if (opts)
		w->opts = *opts;
	if (w->opts.buffer_size == 0)
		w->opts.buffer_size = DEFAULT_BUFFER;
	if (w->opts.buffer_size < 8) /* room for one element of every dtype */
		w->opts.buffer_size = 8;
	*ret_writer = w;
	return 0;
}

void wf_st_writer_destroy(struct wf_st_writer *w)
{
	if (!w)
		return;
	if (w->tmp_path)
		unlink(w->tmp_path);
	free(w->tmp_path);
	for (uint32_t i = 0; i < w->n_meta; i++) {
		free(w->meta[i].key);
		free(w->meta[i].value);
	}
	free(w->meta);
	for (uint32_t i = 0; i < w->n_tensors; i++)
		free(w->tensors[i].name);
	free(w->tensors);
	free(w->slots);
	free(w->path);
	free(w);
}

int wf_st_writer_set_metadata(struct wf_st_writer *w, const char *key, const char *value,
                              struct wf_diag *diag)
{
	char *v;

	if (!w || !key || !value)
		return wf_diag_set(diag, WF_EINVAL, "wf_st_writer_set_metadata: NULL argument");
	if (w->state != STATE_BUILD)
		return wf_diag_set(diag, WF_ESTATE, "%s: metadata after finish", w->path);
	if (strlen(key) > WF_MODEL_MAX_NAME)
		return wf_diag_set(diag, WF_ELIMIT, "%s: metadata key longer than %d bytes",
		                   w->path, WF_MODEL_MAX_NAME);
	if (!utf8_valid(key) || !utf8_valid(value))
		return wf_diag_set(diag, WF_EINVAL, "%s: metadata '%s' is not valid UTF-8", w->path,
		                   key);
	v = strdup(value);
	if (!v)
		return -ENOMEM;
	for (uint32_t i = 0; i < w->n_meta; i++) {
		if (strcmp(w->meta[i].key, key) == 0) {
			free(w->meta[i].value);
			w->meta[i].value = v;
			return 0;
		}
	}
	if (w->n_meta >= WF_MODEL_MAX_KV) {
		free(v);
		return wf_diag_set(diag, WF_ELIMIT, "%s: more than %d metadata keys", w->path,
		                   WF_MODEL_MAX_KV);
	}
	if (w->n_meta == w->cap_meta) {
		uint32_t cap = w->cap_meta ? w->cap_meta * 2 : 16;
		struct st_meta *p = realloc(w->meta, cap * sizeof(*p));
		if (!p) {
			free(v);
			return -ENOMEM;
		}
		w->meta = p;
		w->cap_meta = cap;
	}
	w->meta[w->n_meta].key = strdup(key);
	if (!w->meta[w->n_meta].key) {
		free(v);
		return -ENOMEM;
	}
	w->meta[w->n_meta++].value = v;
	return 0;
}

static int add_tensor(struct wf_st_writer *w, const char *name, enum wf_dtype dtype,
                      uint32_t n_dims, const int64_t *shape, const void *data, wf_st_fill_fn fill,
                      void *arg, struct wf_diag *diag)
{
	const struct wf_dtype_info *ti;
	int64_t ne[WF_MODEL_MAX_DIMS];
	struct st_tensor *t;
	uint64_t nbytes;
	uint32_t *slot;
	int r;

	if (!w || !name || (n_dims > 0 && !shape))
		return wf_diag_set(diag, WF_EINVAL, "wf_st_writer_add_tensor: NULL argument");
	if (w->state != STATE_BUILD)
		return wf_diag_set(diag, WF_ESTATE, "%s: tensor '%s' added after finish", w->path,
		                   name);
	if (!*name || strcmp(name, ST_METADATA) == 0 || !utf8_valid(name))
		return wf_diag_set(diag, WF_EINVAL,
		                   "%s: tensor name '%s' is empty, reserved or not UTF-8", w->path,
		                   name);
	if (strlen(name) > WF_MODEL_MAX_NAME)
		return wf_diag_set(diag, WF_ELIMIT, "%s: tensor name longer than %d bytes", w->path,
		                   WF_MODEL_MAX_NAME);
	ti = wf_dtype_info(dtype);
	if (!ti || !wf_dtype_is_safetensors(dtype))
		return wf_diag_set(diag, WF_EUNKNOWN_TYPE,
		                   "%s: tensor '%s': %s is not a safetensors dtype", w->path, name,
		                   ti ? ti->name : "unknown type");
	if (n_dims > WF_MODEL_MAX_DIMS)
		return wf_diag_set(diag, WF_ELIMIT, "%s: tensor '%s': %u dimensions, more than %d",
		                   w->path, name, n_dims, WF_MODEL_MAX_DIMS);
	for (uint32_t i = 0; i < n_dims; i++) {
		if (shape[i] < 0)
			return wf_diag_set(diag, WF_EINVAL, "%s: tensor '%s': shape[%u] = %lld",
			                   w->path, name, i, (long long)shape[i]);
		ne[i] = shape[n_dims - 1 - i];
	}
	r = wf_dtype_nbytes(dtype, n_dims, ne, &nbytes);
	if (r < 0)
		return wf_diag_set(diag, r, "%s: tensor '%s': %s", w->path, name, wf_strerror(r));
	if (nbytes > INT64_MAX - 1 - w->data_bytes)
		return wf_diag_set(diag, WF_EOVERFLOW, "%s: tensor '%s': data section past 2^63",
		                   w->path, name);
	if (nbytes > 0 && !data && !fill)
		return wf_diag_set(diag, WF_EINVAL, "%s: tensor '%s': no data", w->path, name);
	if (w->n_tensors >= WF_MODEL_MAX_TENSORS)
		return wf_diag_set(diag, WF_ELIMIT, "%s: more than %u tensors", w->path,
		                   WF_MODEL_MAX_TENSORS);

	r = slots_reserve(w, w->n_tensors + 1);
	if (r < 0)
		return r;
	slot = slot_find(w, name);
	if (*slot)
		return wf_diag_set(diag, WF_EDUPLICATE, "%s: tensor '%s' added twice", w->path,
		                   name);
	if (w->n_tensors == w->cap_tensors) {
		uint32_t cap = w->cap_tensors ? w->cap_tensors * 2 : 64;
		struct st_tensor *p = realloc(w->tensors, cap * sizeof(*p));
		if (!p)
			return -ENOMEM;
		w->tensors = p;
		w->cap_tensors = cap;
	}
	t = &w->tensors[w->n_tensors];
	memset(t, 0, sizeof(*t));
	t->name = strdup(name);
	if (!t->name)
		return -ENOMEM;
	t->dtype = dtype;
	t->n_dims = n_dims;
	for (uint32_t i = 0; i < n_dims; i++)
		t->shape[i] = shape[i];
	t->nbytes = nbytes;
	t->elem_size = ti->type_size / ti->block_size;
	t->data = data;
	t->fill = fill;
	t->arg = arg;
	*slot = ++w->n_tensors;
	w->data_bytes += nbytes;
	return 0;
}

int wf_st_writer_add_tensor(struct wf_st_writer *w, const char *name, enum wf_dtype dtype,
                            uint32_t n_dims, const int64_t *shape, const void *data,
                            struct wf_diag *diag)
{
	return add_tensor(w, name, dtype, n_dims, shape, data, NULL, NULL, diag);
}

int wf_st_writer_add_tensor_fill(struct wf_st_writer *w, const char *name, enum wf_dtype dtype,
                                 uint32_t n_dims, const int64_t *shape, wf_st_fill_fn fill,
                                 void *arg, struct wf_diag *diag)
{
	if (!fill)
		return wf_diag_set(diag, WF_EINVAL, "wf_st_writer_add_tensor_fill: no callback");
	return add_tensor(w, name, dtype, n_dims, shape, NULL, fill, arg, diag);
}

uint64_t wf_st_writer_data_bytes(const struct wf_st_writer *w)
{
	return w ? w->data_bytes : 0;
}

/* ---- files ---- */

static int write_all(int fd, const void *buf, size_t len)
{
	const char *p = buf;

	while (len > 0) {
		ssize_t r = write(fd, p, len);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += r;
		len -= (size_t)r;
	}
	return 0;
}

/* Creates "<path>.tmp.XXXXXX" beside path: the rename into place then stays in one filesystem. */
static int tmp_create(const char *path, char **ret_tmp, int *ret_fd, struct wf_diag *diag)
{
	char *tmp = NULL;
	int fd, r;

	if (asprintf(&tmp, "%s.tmp.XXXXXX", path) < 0)
		return -ENOMEM;
	fd = mkostemp(tmp, O_CLOEXEC);
	if (fd < 0) {
		r = -errno;
		wf_diag_set(diag, r, "create %s: %s", tmp, strerror(-r));
		free(tmp);
		return r;
	}
	/* mkostemp makes 0600; model files are read by other users (the agent, workers). */
	if (fchmod(fd, 0644) < 0) {
		r = -errno;
		wf_diag_set(diag, r, "chmod %s: %s", tmp, strerror(-r));
		close(fd);
		unlink(tmp);
		free(tmp);
		return r;
	}
	*ret_tmp = tmp;
	*ret_fd = fd;
	return 0;
}

static int fsync_dir_of(const char *path, struct wf_diag *diag)
{
	const char *slash = strrchr(path, '/');
	char *dir = slash ? (slash == path ? strdup("/") : strndup(path, (size_t)(slash - path)))
	                  : strdup(".");
	int fd, r = 0;

	if (!dir)
		return -ENOMEM;
	fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0 || fsync(fd) < 0) {
		r = -errno;
		wf_diag_set(diag, r, "fsync directory %s: %s", dir, strerror(-r));
	}
	if (fd >= 0)
		close(fd);
	free(dir);
	return r;
}

/* Closes fd and renames tmp to path (fsyncing first when asked). On failure tmp is left for the
 * caller to unlink. */
static int tmp_commit(int fd, const char *tmp, const char *path, bool do_fsync,
                      struct wf_diag *diag)
{
	int r;

	if (do_fsync && fsync(fd) < 0) {
		r = -errno;
		close(fd);
		return wf_diag_set(diag, r, "fsync %s: %s", tmp, strerror(-r));
	}
	if (close(fd) < 0) {
		r = -errno;
		return wf_diag_set(diag, r, "close %s: %s", tmp, strerror(-r));
	}
	if (rename(tmp, path) < 0) {
		r = -errno;
		return wf_diag_set(diag, r, "rename %s to %s: %s", tmp, path, strerror(-r));
	}
	return do_fsync ? fsync_dir_of(path, diag) : 0;
}

/* ---- finish ---- */

static int json_add(struct json_object *o, const char *key, struct json_object *v)
{
	if (!v)
		return -ENOMEM;
	if (json_object_object_add(o, key, v) < 0) {
		json_object_put(v);
		return -ENOMEM;
	}
	return 0;
}

static int json_push(struct json_object *a, struct json_object *v)
{
	if (!v)
		return -ENOMEM;
	if (json_object_array_add(a, v) < 0) {
		json_object_put(v);
		return -ENOMEM;
	}
	return 0;
}

static int tensor_json(const struct st_tensor *t, struct json_object **ret)
{
	struct json_object *o = json_object_new_object(), *shape = NULL, *off = NULL;
	int r = -ENOMEM;

	if (!o)
		return -ENOMEM;
	shape = json_object_new_array();
	off = json_object_new_array();
	if (!shape || !off)
		goto err;
	for (uint32_t i = 0; i < t->n_dims; i++) {
		r = json_push(shape, json_object_new_int64(t->shape[i]));
		if (r < 0)
			goto err;
	}
	r = json_push(off, json_object_new_int64((int64_t)t->begin));
	if (r == 0)
		r = json_push(off, json_object_new_int64((int64_t)(t->begin + t->nbytes)));
	if (r < 0)
		goto err;
	r = json_add(o, "dtype", json_object_new_string(wf_dtype_info(t->dtype)->name));
	if (r < 0)
		goto err;
	r = json_add(o, "shape", shape);
	shape = NULL; /* owned by o now, or freed by json_add */
	if (r < 0)
		goto err;
	r = json_add(o, "data_offsets", off);
	off = NULL;
	if (r < 0)
		goto err;
	*ret = o;
	return 0;
err:
	json_object_put(shape);
	json_object_put(off);
	json_object_put(o);
	return r;
}

/* The header JSON (owned by the returned tree, which the caller puts). */
static int header_json(struct wf_st_writer *w, struct json_object **ret_root)
{
	struct json_object *root = json_object_new_object();
	int r = 0;

	if (!root)
		return -ENOMEM;
	if (w->n_meta > 0) {
		struct json_object *md = json_object_new_object();
		r = json_add(root, ST_METADATA, md);
		for (uint32_t i = 0; r == 0 && i < w->n_meta; i++)
			r = json_add(md, w->meta[i].key, json_object_new_string(w->meta[i].value));
	}
	for (uint32_t i = 0; r == 0 && i < w->n_tensors; i++) {
		struct json_object *t;
		r = tensor_json(&w->tensors[i], &t);
		if (r == 0 && json_object_object_add_ex(root, w->tensors[i].name, t,
		                                        JSON_C_OBJECT_ADD_KEY_IS_NEW) < 0) {
			json_object_put(t);
			r = -ENOMEM;
		}
	}
	if (r < 0) {
		json_object_put(root);
		return r;
	}
	*ret_root = root;
	return 0;
}

/* Data section order: element size descending, add order among equals (a stable sort). */
static int cmp_layout(const void *a, const void *b, void *ctx)
{
	const struct st_tensor *t = ctx;
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	if (t[x].elem_size != t[y].elem_size)
		return t[x].elem_size > t[y].elem_size ? -1 : 1;
	return x < y ? -1 : x > y;
}

static int write_tensor(struct wf_st_writer *w, int fd, const struct st_tensor *t, char *buf,
                        struct wf_diag *diag)
{
	int r;

	if (t->nbytes == 0)
		return 0;
	if (t->data) {
		r = write_all(fd, t->data, t->nbytes);
		if (r < 0)
			return wf_diag_set(diag, r, "write %s: %s", w->tmp_path, strerror(-r));
		return 0;
	}
	/* Whole elements per call, so that a callback may generate values rather than bytes. */
	size_t chunk = w->opts.buffer_size - w->opts.buffer_size % t->elem_size;
	for (uint64_t off = 0; off < t->nbytes;) {
		size_t len = t->nbytes - off < chunk ? (size_t)(t->nbytes - off) : chunk;
		r = t->fill(t->arg, off, buf, len);
		if (r < 0)
			return wf_diag_set(diag, r, "%s: fill callback of tensor '%s' failed: %s",
			                   w->path, t->name, wf_strerror(r));
		r = write_all(fd, buf, len);
		if (r < 0)
			return wf_diag_set(diag, r, "write %s: %s", w->tmp_path, strerror(-r));
		off += len;
	}
	return 0;
}

int wf_st_writer_finish(struct wf_st_writer *w, struct wf_diag *diag)
{
	struct json_object *root = NULL;
	uint32_t *order = NULL;
	const char *text;
	char *buf = NULL, *hdr = NULL;
	size_t text_len, n;
	uint64_t pos = 0;
	int fd = -1, r;

	if (!w)
		return wf_diag_set(diag, WF_EINVAL, "wf_st_writer_finish: NULL writer");
	if (w->state != STATE_BUILD)
		return wf_diag_set(diag, WF_ESTATE, "%s: finish called twice or after a failure",
		                   w->path);
	w->state = STATE_FAILED; /* until everything below succeeds */

	order = malloc((w->n_tensors ? w->n_tensors : 1) * sizeof(*order));
	if (!order) {
		r = -ENOMEM;
		goto out;
	}
	for (uint32_t i = 0; i < w->n_tensors; i++)
		order[i] = i;
	qsort_r(order, w->n_tensors, sizeof(*order), cmp_layout, w->tensors);
	for (uint32_t i = 0; i < w->n_tensors; i++) {
		w->tensors[order[i]].begin = pos;
		pos += w->tensors[order[i]].nbytes;
	}

	r = header_json(w, &root);
	if (r < 0)
		goto out;
	text = json_object_to_json_string_length(
	    root, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE, &text_len);
	if (!text) {
		r = -ENOMEM;
		goto out;
	}
	/* 8 + n is then a multiple of 8: the data section starts aligned. */
	n = (text_len + 7) & ~(size_t)7;
	if (n > WF_MODEL_MAX_HEADER) {
		r = wf_diag_set(diag, WF_ELIMIT,
		                "%s: header of %zu bytes exceeds the limit of %llu", w->path, n,
		                (ull)WF_MODEL_MAX_HEADER);
		goto out;
	}
	hdr = malloc(8 + n);
	buf = malloc(w->opts.buffer_size);
	if (!hdr || !buf) {
		r = -ENOMEM;
		goto out;
	}
	for (int i = 0; i < 8; i++)
		hdr[i] = (char)(((uint64_t)n >> (8 * i)) & 0xff);
	memcpy(hdr + 8, text, text_len);
	memset(hdr + 8 + text_len, ' ', n - text_len);

	r = tmp_create(w->path, &w->tmp_path, &fd, diag);
	if (r < 0)
		goto out;
	r = write_all(fd, hdr, 8 + n);
	if (r < 0) {
		wf_diag_set(diag, r, "write %s: %s", w->tmp_path, strerror(-r));
		goto out;
	}
	for (uint32_t i = 0; i < w->n_tensors; i++) {
		r = write_tensor(w, fd, &w->tensors[order[i]], buf, diag);
		if (r < 0)
			goto out;
	}
	r = tmp_commit(fd, w->tmp_path, w->path, w->opts.fsync, diag);
	fd = -1;
	if (r < 0)
		goto out;
	free(w->tmp_path);
	w->tmp_path = NULL;
	w->state = STATE_DONE;
out:
	if (fd >= 0)
		close(fd);
	if (r < 0 && w->tmp_path) {
		unlink(w->tmp_path);
		free(w->tmp_path);
		w->tmp_path = NULL;
	}
	json_object_put(root);
	free(hdr);
	free(buf);
	free(order);
	return r;
}

/* ---- index.json ---- */

struct map_entry {
	const char *tensor;
	const char *shard;
	uint64_t nbytes;
};

static int cmp_map_entry(const void *a, const void *b)
{
	return strcmp(((const struct map_entry *)a)->tensor, ((const struct map_entry *)b)->tensor);
}

int wf_st_index_write(const char *path, const char *const *shards, uint32_t n_shards, bool fsync,
                      struct wf_diag *diag)
{
	struct wf_model **models = NULL;
	struct map_entry *map = NULL;
	struct json_object *root = NULL, *md = NULL, *wmap = NULL;
	const char *slash, *text;
	char *tmp = NULL;
	size_t n_map = 0, text_len;
	uint64_t total = 0;
	int fd = -1, r = 0;

	if (!path || !*path || (n_shards > 0 && !shards))
		return wf_diag_set(diag, WF_EINVAL, "wf_st_index_write: NULL argument");
	if (n_shards == 0 || n_shards > WF_MODEL_MAX_FILES)
		return wf_diag_set(diag, WF_EINVAL, "%s: %u shards", path, n_shards);
	slash = strrchr(path, '/');

	models = calloc(n_shards, sizeof(*models));
	if (!models)
		return -ENOMEM;
	for (uint32_t i = 0; i < n_shards; i++) {
		char *sp = NULL;

		if (!shards[i] || !*shards[i] || strchr(shards[i], '/') ||
		    strcmp(shards[i], ".") == 0 || strcmp(shards[i], "..") == 0) {
			r = wf_diag_set(diag, WF_EINVAL, "%s: shard '%s' is not a file name", path,
			                shards[i] ? shards[i] : "(null)");
			goto out;
		}
		if (asprintf(&sp, "%.*s%s", slash ? (int)(slash - path + 1) : 0, path, shards[i]) <
		    0) {
			r = -ENOMEM;
			goto out;
		}
		r = wf_model_open(sp, &models[i], diag);
		free(sp);
		if (r < 0)
			goto out;
		if (models[i]->format != WF_MODEL_FORMAT_SAFETENSORS) {
			r = wf_diag_set(diag, WF_EINVAL, "%s: shard %s is not safetensors", path,
			                shards[i]);
			goto out;
		}
		n_map += models[i]->n_tensors;
	}
	if (n_map > WF_MODEL_MAX_TENSORS) {
		r = wf_diag_set(diag, WF_ELIMIT, "%s: more than %u tensors", path,
		                WF_MODEL_MAX_TENSORS);
		goto out;
	}
	map = malloc((n_map ? n_map : 1) * sizeof(*map));
	if (!map) {
		r = -ENOMEM;
		goto out;
	}
	n_map = 0;
	for (uint32_t i = 0; i < n_shards; i++) {
		for (uint32_t j = 0; j < models[i]->n_tensors; j++) {
			const struct wf_tensor *t = &models[i]->tensors[j];
			map[n_map++] = (struct map_entry){t->name, shards[i], t->nbytes};
			total += t->nbytes;
		}
	}
	qsort(map, n_map, sizeof(*map), cmp_map_entry);
	for (size_t i = 1; i < n_map; i++) {
		if (strcmp(map[i - 1].tensor, map[i].tensor) == 0) {
			r = wf_diag_set(diag, WF_EDUPLICATE,
			                "%s: tensor '%s' is in shards %s and %s", path,
			                map[i].tensor, map[i - 1].shard, map[i].shard);
			goto out;
		}
	}

	root = json_object_new_object();
	md = json_object_new_object();
	wmap = json_object_new_object();
	if (!root || !md || !wmap) {
		json_object_put(md);
		json_object_put(wmap);
		r = -ENOMEM;
		goto out;
	}
	r = json_add(root, "metadata", md);
	if (r == 0)
		r = json_add(md, "total_size", json_object_new_int64((int64_t)total));
	if (r == 0)
		r = json_add(root, "weight_map", wmap);
	else
		json_object_put(wmap);
	for (size_t i = 0; r == 0 && i < n_map; i++) {
		struct json_object *v = json_object_new_string(map[i].shard);
		if (!v || json_object_object_add_ex(wmap, map[i].tensor, v,
		                                    JSON_C_OBJECT_ADD_KEY_IS_NEW) < 0) {
			json_object_put(v);
			r = -ENOMEM;
		}
	}
	if (r < 0)
		goto out;
	text = json_object_to_json_string_length(root,
	                                         JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_SPACED |
	                                             JSON_C_TO_STRING_NOSLASHESCAPE,
	                                         &text_len);
	if (!text) {
		r = -ENOMEM;
		goto out;
	}
	r = tmp_create(path, &tmp, &fd, diag);
	if (r < 0)
		goto out;
	r = write_all(fd, text, text_len);
	if (r == 0)
		r = write_all(fd, "\n", 1);
	if (r < 0) {
		wf_diag_set(diag, r, "write %s: %s", tmp, strerror(-r));
		goto out;
	}
	r = tmp_commit(fd, tmp, path, fsync, diag);
	fd = -1;
	if (r == 0) {
		free(tmp);
		tmp = NULL;
	}
out:
	if (fd >= 0)
		close(fd);
	if (tmp) {
		unlink(tmp);
		free(tmp);
	}
	json_object_put(root);
	free(map);
	for (uint32_t i = 0; models && i < n_shards; i++)
		wf_model_close(models[i]);
	free(models);
	return r;
}
