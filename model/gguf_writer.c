#include "model/gguf_writer.h"

#include "base/error.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gguf_writer.c writes host-order integers and assumes a little-endian host"
#endif

#define GGUF_MAGIC     0x46554747u /* "GGUF" read as a little-endian u32 */
#define GGUF_VERSION   3u
#define DEFAULT_BUFFER (8u << 20)
#define DIRECT_ALIGN   4096u /* O_DIRECT: buffer address, size and file offset */
#define IO_DEPTH       3     /* writes in flight: the disks we measured want more than one */
#define N_BUFS         (IO_DEPTH + 1)
#define MAX_DIMS       4 /* GGML_MAX_DIMS: llama.cpp reads no more */

enum writer_state {
	STATE_BUILD = 0, /* metadata and tensor table may change */
	STATE_WRITING,   /* header written, data streaming */
	STATE_DONE,      /* every file renamed into place */
	STATE_FAILED,    /* an I/O step failed: only destroy is left */
};

struct kv_item {
	char *key;
	struct wf_kv_value v;
};

struct tensor_item {
	char *name;
	enum wf_dtype dtype;
	uint32_t n_dims;
	int64_t ne[MAX_DIMS];
	uint64_t nbytes;
	uint64_t offset; /* from the start of its file's data section */
	uint32_t file;
};

struct out_file {
	char *path;     /* final name */
	char *tmp_path; /* name while it is written */
	bool created;   /* tmp_path exists on disk */
	bool renamed;   /* path now holds it */
	uint32_t first_tensor;
	uint32_t n_tensors;
};

struct wf_gguf_writer {
	char *path;
	struct wf_gguf_writer_opts opts;
	enum writer_state state;

	struct kv_item *kvs;
	uint32_t n_kv, cap_kv;

	struct tensor_item *tensors;
	uint32_t n_tensors, cap_tensors;
	uint32_t *slots; /* open-addressing name index: tensor index + 1, 0 = empty */
	uint32_t n_slots;
	uint64_t data_bytes;

	struct out_file *files;
	uint32_t n_files;
	bool split;

	/* streaming position */
	int fd;
	bool direct; /* fd has O_DIRECT: only whole aligned buffers go through it */
	uint32_t cur_file;
	uint32_t cur_tensor;
	uint64_t cur_done;      /* bytes of cur_tensor already taken */
	uint64_t file_pos;      /* bytes put into the current file, buffered ones included */
	uint64_t bytes_written; /* bytes put into all files */

	/* N_BUFS buffers used round-robin: the caller fills one while I/O threads pwrite() the
	 * others at their own offsets, so that producing the bytes and up to IO_DEPTH writes
	 * (copies into the page cache, or DMAs with O_DIRECT) overlap. */
	uint8_t *bufs[N_BUFS];
	uint64_t buf_seq; /* sequence number of the buffer being filled: bufs[buf_seq % N] */
	uint64_t buf_off; /* file offset where that buffer's bytes go */
	size_t buf_len, buf_cap;

	pthread_t io_threads[IO_DEPTH];
	uint32_t io_started;
	bool io_sync_init;
	pthread_mutex_t io_mu;
	pthread_cond_t io_cv;
	bool io_quit;
	uint64_t io_submitted, io_taken, io_completed; /* sequence numbers */
	bool io_pending[N_BUFS];
	int io_fd[N_BUFS];
	uint64_t io_off[N_BUFS];
	size_t io_len[N_BUFS];
	int io_err; /* first -errno of any I/O thread */
};

static void io_stop(struct wf_gguf_writer *w);

static uint64_t align_up(uint64_t x, uint64_t a)
{
	return (x + a - 1) & ~(a - 1);
}

/* ---- metadata values: validation, deep copy, free --------------------------------------- */

static bool kv_scalar(enum wf_kv_type t)
{
	return t < WF_KV_TYPE_MAX_ && t != WF_KV_STRING && t != WF_KV_ARRAY;
}

/* Nesting depth is capped so that a caller's cyclic or absurd structure cannot recurse forever. */
#define MAX_NEST 16

static int check_array(const struct wf_kv_array *a, int depth)
{
	if (depth > MAX_NEST)
		return WF_ELIMIT;
	if ((unsigned)a->elem >= WF_KV_TYPE_MAX_)
		return WF_EUNKNOWN_TYPE;
	if (a->n == 0)
		return 0;
	if (kv_scalar(a->elem))
		return a->u.scalars ? 0 : WF_EINVAL;
	if (a->elem == WF_KV_STRING) {
		if (!a->u.strs)
			return WF_EINVAL;
		for (uint64_t i = 0; i < a->n; i++)
			if (!a->u.strs[i].s && a->u.strs[i].n)
				return WF_EINVAL;
		return 0;
	}
	if (!a->u.arrays)
		return WF_EINVAL;
	for (uint64_t i = 0; i < a->n; i++) {
		int r = check_array(&a->u.arrays[i], depth + 1);
		if (r < 0)
			return r;
	}
	return 0;
}

static int check_value(const struct wf_kv_value *v)
{
	if ((unsigned)v->type >= WF_KV_TYPE_MAX_)
		return WF_EUNKNOWN_TYPE;
	if (v->type == WF_KV_STRING)
		return v->u.str.s || !v->u.str.n ? 0 : WF_EINVAL;
	if (v->type == WF_KV_ARRAY)
		return check_array(&v->u.arr, 0);
	return 0;
}

static void free_array(struct wf_kv_array *a)
{
	if (a->elem == WF_KV_STRING && a->u.strs) {
		for (uint64_t i = 0; i < a->n; i++)
			free(a->u.strs[i].s);
		free(a->u.strs);
	} else if (a->elem == WF_KV_ARRAY && a->u.arrays) {
		for (uint64_t i = 0; i < a->n; i++)
			free_array(&a->u.arrays[i]);
		free(a->u.arrays);
	} else {
		free(a->u.scalars);
	}
	memset(a, 0, sizeof(*a));
}

static void free_value(struct wf_kv_value *v)
{
	if (v->type == WF_KV_STRING)
		free(v->u.str.s);
	else if (v->type == WF_KV_ARRAY)
		free_array(&v->u.arr);
	memset(v, 0, sizeof(*v));
}

static int copy_str(struct wf_kv_str *dst, const struct wf_kv_str *src)
{
	if (src->n >= SIZE_MAX)
		return WF_EOVERFLOW;
	dst->s = malloc(src->n + 1);
	if (!dst->s)
		return -ENOMEM;
	if (src->n)
		memcpy(dst->s, src->s, src->n);
	dst->s[src->n] = '\0';
	dst->n = src->n;
	return 0;
}

static int copy_array(struct wf_kv_array *dst, const struct wf_kv_array *src)
{
	memset(dst, 0, sizeof(*dst));
	dst->elem = src->elem;
	if (src->n == 0)
		return 0;
	if (kv_scalar(src->elem)) {
		size_t es = wf_kv_type_size(src->elem);
		if (src->n > SIZE_MAX / es)
			return WF_EOVERFLOW;
		dst->u.scalars = malloc(src->n * es);
		if (!dst->u.scalars)
			return -ENOMEM;
		memcpy(dst->u.scalars, src->u.scalars, src->n * es);
		dst->n = src->n;
		return 0;
	}
	if (src->elem == WF_KV_STRING) {
		dst->u.strs = calloc(src->n, sizeof(*dst->u.strs));
		if (!dst->u.strs)
			return -ENOMEM;
		dst->n = src->n; /* from here free_array() can undo a partial copy */
		for (uint64_t i = 0; i < src->n; i++) {
			int r = copy_str(&dst->u.strs[i], &src->u.strs[i]);
			if (r < 0)
				return r;
		}
		return 0;
	}
	dst->u.arrays = calloc(src->n, sizeof(*dst->u.arrays));
	if (!dst->u.arrays)
		return -ENOMEM;
	dst->n = src->n;
	for (uint64_t i = 0; i < src->n; i++) {
		int r = copy_array(&dst->u.arrays[i], &src->u.arrays[i]);
		if (r < 0)
			return r;
	}
	return 0;
}

static int copy_value(struct wf_kv_value *dst, const struct wf_kv_value *src)
{
	int r = 0;
	memset(dst, 0, sizeof(*dst));
	dst->type = src->type;
	if (src->type == WF_KV_STRING)
		r = copy_str(&dst->u.str, &src->u.str);
	else if (src->type == WF_KV_ARRAY)
		r = copy_array(&dst->u.arr, &src->u.arr);
	else
		dst->u = src->u;
	if (r < 0)
		free_value(dst);
	return r;
}

/* ---- create / destroy --------------------------------------------------------------------- */

int wf_gguf_writer_create(const char *path, const struct wf_gguf_writer_opts *opts,
                          struct wf_gguf_writer **ret_writer, struct wf_diag *diag)
{
	struct wf_gguf_writer_opts o = {0};
	if (opts)
		o = *opts;
	if (!path || !*path || !ret_writer)
		return wf_diag_set(diag, WF_EINVAL, "gguf writer: no output path");
	if (o.alignment == 0)
		o.alignment = WF_GGUF_DEFAULT_ALIGNMENT;
	if (o.alignment & (o.alignment - 1) || o.alignment > (1u << 30))
		return wf_diag_set(diag, WF_EINVAL,
		                   "gguf writer: alignment %u is not a power of two", o.alignment);
	if (o.buffer_size == 0)
		o.buffer_size = DEFAULT_BUFFER;
	/* Whole pages, as O_DIRECT wants them. */
	o.buffer_size =
	    align_up(o.buffer_size < DIRECT_ALIGN ? DIRECT_ALIGN : o.buffer_size, DIRECT_ALIGN);

	struct wf_gguf_writer *w = calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	w->fd = -1;
	w->opts = o;
	w->split = o.split || o.split_max_bytes || o.split_max_tensors;
	w->path = strdup(path);
	if (!w->path)
		goto nomem;
	if (w->split) {
		size_t n = strlen(path);
		if (n < 5 || strcmp(path + n - 5, ".gguf") != 0 || n == 5 || path[n - 6] == '/') {
			wf_gguf_writer_destroy(w);
			return wf_diag_set(
			    diag, WF_EINVAL,
			    "gguf writer: a split output needs a name ending in .gguf, "
			    "got '%s'",
			    path);
		}
	}
	*ret_writer = w;
	return 0;
nomem:
	wf_gguf_writer_destroy(w);
	return -ENOMEM;
}

static void close_fd(struct wf_gguf_writer *w)
{
	if (w->fd >= 0)
		close(w->fd);
	w->fd = -1;
}

void wf_gguf_writer_destroy(struct wf_gguf_writer *w)
{
	if (!w)
		return;
	io_stop(w);
	close_fd(w);
	for (uint32_t i = 0; i < w->n_files; i++) {
		struct out_file *f = &w->files[i];
		/* Not finished: nothing of this run may stay behind, neither temporaries nor files
		 * already renamed by a finish that failed half-way. */
		if (w->state != STATE_DONE) {
			if (f->created && !f->renamed)
				unlink(f->tmp_path);
			if (f->renamed)
				unlink(f->path);
		}
		free(f->path);
		free(f->tmp_path);
	}
	free(w->files);
	for (uint32_t i = 0; i < w->n_kv; i++) {
		free(w->kvs[i].key);
		free_value(&w->kvs[i].v);
	}
	free(w->kvs);
	for (uint32_t i = 0; i < w->n_tensors; i++)
		free(w->tensors[i].name);
	free(w->tensors);
	free(w->slots);
	for (int i = 0; i < N_BUFS; i++)
		free(w->bufs[i]);
	free(w->path);
	free(w);
}

/* ---- metadata ----------------------------------------------------------------------------- */

static bool reserved_key(const char *key)
{
	return strcmp(key, "general.alignment") == 0 || strncmp(key, "split.", 6) == 0;
}

int wf_gguf_writer_set_kv(struct wf_gguf_writer *w, const char *key, const struct wf_kv_value *v,
                          struct wf_diag *diag)
{
	if (!w || !key || !v)
		return WF_EINVAL;
	if (w->state != STATE_BUILD)
		return wf_diag_set(diag, WF_ESTATE, "gguf writer: key '%s' set after the header",
		                   key);
	if (!*key || strlen(key) > 65535)
		return wf_diag_set(diag, WF_EINVAL, "gguf writer: bad key length");
	if (reserved_key(key))
		return wf_diag_set(diag, WF_EINVAL,
		                   "gguf writer: key '%s' is written by the writer itself "
		                   "(use the alignment and split options)",
		                   key);
	int r = check_value(v);
	if (r < 0)
		return wf_diag_set(diag, r, "gguf writer: malformed value for key '%s'", key);

	struct wf_kv_value copy;
	r = copy_value(&copy, v);
	if (r < 0)
		return r;
	for (uint32_t i = 0; i < w->n_kv; i++) {
		if (strcmp(w->kvs[i].key, key) == 0) {
			free_value(&w->kvs[i].v);
			w->kvs[i].v = copy;
			return 0;
		}
	}
	if (w->n_kv == w->cap_kv) {
		uint32_t cap = w->cap_kv ? w->cap_kv * 2 : 32;
		struct kv_item *n = realloc(w->kvs, cap * sizeof(*n));
		if (!n)
			goto nomem;
		w->kvs = n;
		w->cap_kv = cap;
	}
	w->kvs[w->n_kv].key = strdup(key);
	if (!w->kvs[w->n_kv].key)
		goto nomem;
	w->kvs[w->n_kv].v = copy;
	w->n_kv++;
	return 0;
nomem:
	free_value(&copy);
	return -ENOMEM;
}

static int set_scalar(struct wf_gguf_writer *w, const char *key, enum wf_kv_type t, uint64_t u,
                      int64_t i, double f)
{
	struct wf_kv_value v = {.type = t};
	switch (t) {
	case WF_KV_I32:
		v.u.i64 = i;
		break;
	case WF_KV_F32:
		v.u.f64 = f;
		break;
	default:
		v.u.u64 = u;
		break;
	}
	return wf_gguf_writer_set_kv(w, key, &v, NULL);
}

int wf_gguf_writer_set_u32(struct wf_gguf_writer *w, const char *key, uint32_t v)
{
	return set_scalar(w, key, WF_KV_U32, v, 0, 0);
}

int wf_gguf_writer_set_i32(struct wf_gguf_writer *w, const char *key, int32_t v)
{
	return set_scalar(w, key, WF_KV_I32, 0, v, 0);
}

int wf_gguf_writer_set_u64(struct wf_gguf_writer *w, const char *key, uint64_t v)
{
	return set_scalar(w, key, WF_KV_U64, v, 0, 0);
}

int wf_gguf_writer_set_f32(struct wf_gguf_writer *w, const char *key, float v)
{
	return set_scalar(w, key, WF_KV_F32, 0, 0, v);
}

int wf_gguf_writer_set_bool(struct wf_gguf_writer *w, const char *key, bool v)
{
	return set_scalar(w, key, WF_KV_BOOL, v ? 1 : 0, 0, 0);
}

int wf_gguf_writer_set_str(struct wf_gguf_writer *w, const char *key, const char *s)
{
	if (!s)
		return WF_EINVAL;
	struct wf_kv_value v = {.type = WF_KV_STRING};
	v.u.str.s = (char *)s; /* only read: set_kv copies */
	v.u.str.n = strlen(s);
	return wf_gguf_writer_set_kv(w, key, &v, NULL);
}

int wf_gguf_writer_set_array(struct wf_gguf_writer *w, const char *key, enum wf_kv_type elem,
                             const void *data, uint64_t n)
{
	if (!kv_scalar(elem))
		return WF_EINVAL;
	struct wf_kv_value v = {.type = WF_KV_ARRAY};
	v.u.arr.elem = elem;
	v.u.arr.n = n;
	v.u.arr.u.scalars = (void *)data;
	return wf_gguf_writer_set_kv(w, key, &v, NULL);
}

int wf_gguf_writer_set_str_array(struct wf_gguf_writer *w, const char *key, const char *const *strs,
                                 uint64_t n)
{
	if (n && !strs)
		return WF_EINVAL;
	if (n > SIZE_MAX / sizeof(struct wf_kv_str))
		return WF_EOVERFLOW;
	/* A borrowed view: the strings are copied once, by set_kv. */
	struct wf_kv_str *view = n ? malloc(n * sizeof(*view)) : NULL;
	if (n && !view)
		return -ENOMEM;
	for (uint64_t i = 0; i < n; i++) {
		if (!strs[i]) {
			free(view);
			return WF_EINVAL;
		}
		view[i].s = (char *)strs[i];
		view[i].n = strlen(strs[i]);
	}
	struct wf_kv_value v = {.type = WF_KV_ARRAY};
	v.u.arr.elem = WF_KV_STRING;
	v.u.arr.n = n;
	v.u.arr.u.strs = view;
	int r = wf_gguf_writer_set_kv(w, key, &v, NULL);
	free(view);
	return r;
}

/* ---- tensor table ------------------------------------------------------------------------- */

static uint64_t hash_name(const char *s)
{
	uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
	for (; *s; s++)
		h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
	return h;
}

static int find_slot(const struct wf_gguf_writer *w, const char *name, uint32_t *ret_slot)
{
	uint32_t mask = w->n_slots - 1;
	uint32_t s = (uint32_t)hash_name(name) & mask;
	for (;;) {
		uint32_t v = w->slots[s];
		if (v == 0) {
			*ret_slot = s;
			return 0;
		}
		if (strcmp(w->tensors[v - 1].name, name) == 0) {
			*ret_slot = s;
			return 1;
		}
		s = (s + 1) & mask;
	}
}

static int grow_slots(struct wf_gguf_writer *w)
{
	uint32_t n = w->n_slots ? w->n_slots * 2 : 256;
	uint32_t *slots = calloc(n, sizeof(*slots));
	if (!slots)
		return -ENOMEM;
	free(w->slots);
	w->slots = slots;
	w->n_slots = n;
	for (uint32_t i = 0; i < w->n_tensors; i++) {
		uint32_t s;
		find_slot(w, w->tensors[i].name, &s);
		w->slots[s] = i + 1;
	}
	return 0;
}

int wf_gguf_writer_add_tensor(struct wf_gguf_writer *w, const char *name, enum wf_dtype dtype,
                              uint32_t n_dims, const int64_t *ne, uint32_t *ret_index,
                              struct wf_diag *diag)
{
	if (!w || !name || (!ne && n_dims))
		return WF_EINVAL;
	if (w->state != STATE_BUILD)
		return wf_diag_set(diag, WF_ESTATE,
		                   "gguf writer: tensor '%s' added after the header", name);
	size_t len = strlen(name);
	if (len == 0)
		return wf_diag_set(diag, WF_EINVAL, "gguf writer: empty tensor name");
	if (len > WF_GGUF_WRITER_MAX_NAME)
		return wf_diag_set(diag, WF_ELIMIT,
		                   "gguf writer: tensor name '%s' is %zu bytes, ggml allows %d",
		                   name, len, WF_GGUF_WRITER_MAX_NAME);
	if (n_dims < 1 || n_dims > MAX_DIMS)
		return wf_diag_set(diag, WF_EINVAL, "gguf writer: tensor '%s' has %u dims (1..%d)",
		                   name, n_dims, MAX_DIMS);
	const struct wf_dtype_info *ti = wf_dtype_info(dtype);
	if (!ti || dtype >= WF_DTYPE_GGML_COUNT_)
		return wf_diag_set(diag, WF_EUNKNOWN_TYPE,
		                   "gguf writer: tensor '%s' has no ggml type (%d)", name,
		                   (int)dtype);
	for (uint32_t d = 0; d < n_dims; d++)
		if (ne[d] <= 0)
			return wf_diag_set(diag, WF_EINVAL,
			                   "gguf writer: tensor '%s' ne[%u] = %lld is not positive",
			                   name, d, (long long)ne[d]);
	uint64_t nbytes;
	int r = wf_dtype_nbytes(dtype, n_dims, ne, &nbytes);
	if (r == WF_EALIGN)
		return wf_diag_set(
		    diag, r,
		    "gguf writer: tensor '%s' ne[0] = %lld is not a multiple of %s's "
		    "block size %u",
		    name, (long long)ne[0], ti->name, ti->block_size);
	if (r < 0)
		return wf_diag_set(diag, r, "gguf writer: tensor '%s': bad shape for %s", name,
		                   ti->name);
	if (w->data_bytes + align_up(nbytes, w->opts.alignment) < w->data_bytes)
		return wf_diag_set(diag, WF_EOVERFLOW, "gguf writer: total size overflows");

	if (w->n_tensors >= UINT32_MAX / 2 - 1)
		return wf_diag_set(diag, WF_ELIMIT, "gguf writer: too many tensors");
	if ((uint64_t)(w->n_tensors + 1) * 2 > w->n_slots) {
		r = grow_slots(w);
		if (r < 0)
			return r;
	}
	uint32_t slot;
	if (find_slot(w, name, &slot))
		return wf_diag_set(diag, WF_EDUPLICATE, "gguf writer: tensor '%s' added twice",
		                   name);
	if (w->n_tensors == w->cap_tensors) {
		uint32_t cap = w->cap_tensors ? w->cap_tensors * 2 : 64;
		struct tensor_item *n = realloc(w->tensors, cap * sizeof(*n));
		if (!n)
			return -ENOMEM;
		w->tensors = n;
		w->cap_tensors = cap;
	}
	struct tensor_item *t = &w->tensors[w->n_tensors];
	memset(t, 0, sizeof(*t));
	t->name = strdup(name);
	if (!t->name)
		return -ENOMEM;
	t->dtype = dtype;
	t->n_dims = n_dims;
	for (uint32_t d = 0; d < MAX_DIMS; d++)
		t->ne[d] = d < n_dims ? ne[d] : 1;
	t->nbytes = nbytes;
	w->slots[slot] = w->n_tensors + 1;
	w->data_bytes += nbytes;
	if (ret_index)
		*ret_index = w->n_tensors;
	w->n_tensors++;
	return 0;
}

/* ---- buffered output ---------------------------------------------------------------------- */

static int pwrite_all(int fd, const uint8_t *b, size_t n, uint64_t off)
{
	while (n) {
		/* Linux moves at most ~2 GiB per write(); keep each call below that. */
		size_t chunk = n > (1u << 30) ? (1u << 30) : n;
		ssize_t k = pwrite(fd, b, chunk, (off_t)off);
		if (k < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (k == 0)
			return -EIO;
		b += k;
		n -= (size_t)k;
		off += (uint64_t)k;
	}
	return 0;
}

static void *io_main(void *arg)
{
	struct wf_gguf_writer *w = arg;
	pthread_mutex_lock(&w->io_mu);
	for (;;) {
		while (w->io_taken == w->io_submitted && !w->io_quit)
			pthread_cond_wait(&w->io_cv, &w->io_mu);
		if (w->io_taken == w->io_submitted)
			break; /* quit, and nothing left to write */
		uint32_t b = (uint32_t)(w->io_taken++ % N_BUFS);
		int fd = w->io_fd[b];
		uint64_t off = w->io_off[b];
		size_t len = w->io_len[b];
		bool skip = w->io_err != 0; /* the file is lost anyway */
		pthread_mutex_unlock(&w->io_mu);
		int r = skip ? 0 : pwrite_all(fd, w->bufs[b], len, off);
		pthread_mutex_lock(&w->io_mu);
		if (r < 0 && w->io_err == 0)
			w->io_err = r;
		w->io_pending[b] = false;
		w->io_completed++;
		pthread_cond_broadcast(&w->io_cv);
	}
	pthread_mutex_unlock(&w->io_mu);
	return NULL;
}

static int io_start(struct wf_gguf_writer *w)
{
	pthread_mutex_init(&w->io_mu, NULL);
	pthread_cond_init(&w->io_cv, NULL);
	w->io_sync_init = true;
	for (; w->io_started < IO_DEPTH; w->io_started++) {
		int e = pthread_create(&w->io_threads[w->io_started], NULL, io_main, w);
		if (e)
			return -e; /* io_stop() joins the ones that started */
	}
	return 0;
}

static int io_error(struct wf_gguf_writer *w, int r, struct wf_diag *diag)
{
	return wf_diag_set(diag, r, "write %s: %s", w->files[w->cur_file].tmp_path, strerror(-r));
}

/* Waits until every submitted write is done; returns the first I/O error so far. */
static int io_wait_all(struct wf_gguf_writer *w, struct wf_diag *diag)
{
	pthread_mutex_lock(&w->io_mu);
	while (w->io_completed != w->io_submitted)
		pthread_cond_wait(&w->io_cv, &w->io_mu);
	int r = w->io_err;
	pthread_mutex_unlock(&w->io_mu);
	return r < 0 ? io_error(w, r, diag) : 0;
}

static void io_stop(struct wf_gguf_writer *w)
{
	if (!w->io_sync_init)
		return;
	pthread_mutex_lock(&w->io_mu);
	w->io_quit = true;
	pthread_cond_broadcast(&w->io_cv);
	pthread_mutex_unlock(&w->io_mu);
	for (uint32_t i = 0; i < w->io_started; i++)
		pthread_join(w->io_threads[i], NULL);
	w->io_started = 0;
	pthread_cond_destroy(&w->io_cv);
	pthread_mutex_destroy(&w->io_mu);
	w->io_sync_init = false;
}

/* Queues the full current buffer for the I/O threads and moves on to the next one, waiting
 * until its previous write is done. */
static int flush_full(struct wf_gguf_writer *w, struct wf_diag *diag)
{
	uint32_t b = (uint32_t)(w->buf_seq % N_BUFS);
	pthread_mutex_lock(&w->io_mu);
	w->io_fd[b] = w->fd;
	w->io_off[b] = w->buf_off;
	w->io_len[b] = w->buf_len;
	w->io_pending[b] = true;
	w->io_submitted++;
	pthread_cond_broadcast(&w->io_cv);
	uint32_t next = (uint32_t)((w->buf_seq + 1) % N_BUFS);
	while (w->io_pending[next])
		pthread_cond_wait(&w->io_cv, &w->io_mu);
	int r = w->io_err;
	pthread_mutex_unlock(&w->io_mu);
	w->buf_seq++;
	w->buf_off += w->buf_len;
	w->buf_len = 0;
	return r < 0 ? io_error(w, r, diag) : 0;
}

/* Writes whatever is buffered, after every queued write: the end of a file. A tail shorter than
 * the O_DIRECT granularity is written with O_DIRECT switched off. */
static int flush_tail(struct wf_gguf_writer *w, struct wf_diag *diag)
{
	int r = io_wait_all(w, diag);
	if (r < 0 || !w->buf_len)
		return r;
	if (w->direct && w->buf_len % DIRECT_ALIGN) {
		int fl = fcntl(w->fd, F_GETFL);
		if (fl < 0 || fcntl(w->fd, F_SETFL, fl & ~O_DIRECT) < 0) {
			r = -errno;
			return wf_diag_set(diag, r, "fcntl %s: %s", w->files[w->cur_file].tmp_path,
			                   strerror(errno));
		}
		w->direct = false;
	}
	r = pwrite_all(w->fd, w->bufs[w->buf_seq % N_BUFS], w->buf_len, w->buf_off);
	if (r < 0)
		return io_error(w, r, diag);
	w->buf_off += w->buf_len;
	w->buf_len = 0;
	return 0;
}

static int put(struct wf_gguf_writer *w, const void *p, size_t n, struct wf_diag *diag)
{
	const uint8_t *b = p;
	w->file_pos += n;
	w->bytes_written += n;
	while (n) {
		size_t take = w->buf_cap - w->buf_len;
		if (take > n)
			take = n;
		memcpy(w->bufs[w->buf_seq % N_BUFS] + w->buf_len, b, take);
		w->buf_len += take;
		b += take;
		n -= take;
		if (w->buf_len == w->buf_cap) {
			int r = flush_full(w, diag);
			if (r < 0)
				return r;
		}
	}
	return 0;
}

static int put_zeros(struct wf_gguf_writer *w, uint64_t n, struct wf_diag *diag)
{
	w->file_pos += n;
	w->bytes_written += n;
	while (n) {
		size_t take = w->buf_cap - w->buf_len;
		if (take > n)
			take = n;
		memset(w->bufs[w->buf_seq % N_BUFS] + w->buf_len, 0, take);
		w->buf_len += take;
		n -= take;
		if (w->buf_len == w->buf_cap) {
			int r = flush_full(w, diag);
			if (r < 0)
				return r;
		}
	}
	return 0;
}

static int put_u32(struct wf_gguf_writer *w, uint32_t v, struct wf_diag *diag)
{
	return put(w, &v, 4, diag);
}

static int put_u64(struct wf_gguf_writer *w, uint64_t v, struct wf_diag *diag)
{
	return put(w, &v, 8, diag);
}

static int put_str(struct wf_gguf_writer *w, const char *s, uint64_t n, struct wf_diag *diag)
{
	int r = put_u64(w, n, diag);
	return r < 0 ? r : put(w, s, n, diag);
}

static int put_scalar(struct wf_gguf_writer *w, const struct wf_kv_value *v, struct wf_diag *diag)
{
	union {
		uint8_t u8;
		uint16_t u16;
		uint32_t u32;
		uint64_t u64;
		float f32;
		double f64;
	} x;
	switch (v->type) {
	case WF_KV_U8:
	case WF_KV_BOOL:
		x.u8 = v->type == WF_KV_BOOL ? (v->u.u64 != 0) : (uint8_t)v->u.u64;
		break;
	case WF_KV_I8:
		x.u8 = (uint8_t)(int8_t)v->u.i64;
		break;
	case WF_KV_U16:
		x.u16 = (uint16_t)v->u.u64;
		break;
	case WF_KV_I16:
		x.u16 = (uint16_t)(int16_t)v->u.i64;
		break;
	case WF_KV_U32:
		x.u32 = (uint32_t)v->u.u64;
		break;
	case WF_KV_I32:
		x.u32 = (uint32_t)(int32_t)v->u.i64;
		break;
	case WF_KV_F32:
		x.f32 = (float)v->u.f64;
		break;
	case WF_KV_U64:
		x.u64 = v->u.u64;
		break;
	case WF_KV_I64:
		x.u64 = (uint64_t)v->u.i64;
		break;
	case WF_KV_F64:
		x.f64 = v->u.f64;
		break;
	default:
		return WF_EINTERNAL;
	}
	return put(w, &x, wf_kv_type_size(v->type), diag);
}

static int put_array(struct wf_gguf_writer *w, const struct wf_kv_array *a, struct wf_diag *diag)
{
	int r = put_u32(w, (uint32_t)a->elem, diag);
	if (r == 0)
		r = put_u64(w, a->n, diag);
	if (r < 0 || a->n == 0)
		return r;
	if (kv_scalar(a->elem)) {
		/* Packed host-order scalars are the GGUF encoding already (BOOL is one byte). */
		return put(w, a->u.scalars, a->n * wf_kv_type_size(a->elem), diag);
	}
	for (uint64_t i = 0; i < a->n && r == 0; i++) {
		if (a->elem == WF_KV_STRING)
			r = put_str(w, a->u.strs[i].s, a->u.strs[i].n, diag);
		else
			r = put_array(w, &a->u.arrays[i], diag);
	}
	return r;
}

static int put_kv(struct wf_gguf_writer *w, const char *key, const struct wf_kv_value *v,
                  struct wf_diag *diag)
{
	int r = put_str(w, key, strlen(key), diag);
	if (r == 0)
		r = put_u32(w, (uint32_t)v->type, diag);
	if (r < 0)
		return r;
	if (v->type == WF_KV_STRING)
		return put_str(w, v->u.str.s, v->u.str.n, diag);
	if (v->type == WF_KV_ARRAY)
		return put_array(w, &v->u.arr, diag);
	return put_scalar(w, v, diag);
}

/* ---- files -------------------------------------------------------------------------------- */

static char *dir_of(const char *path)
{
	const char *slash = strrchr(path, '/');
	if (!slash)
		return strdup(".");
	if (slash == path)
		return strdup("/");
	return strndup(path, (size_t)(slash - path));
}

/* Creates a fresh temporary beside the final path. O_EXCL with a random suffix (rather than
 * mkstemp) so that the file gets the usual 0666 & ~umask mode without touching the umask. */
static int create_tmp(struct out_file *f, struct wf_diag *diag)
{
	static unsigned counter;
	const char *slash = strrchr(f->path, '/');
	const char *base = slash ? slash + 1 : f->path;
	int dir_len = slash ? (int)(slash - f->path + 1) : 0;
	for (int attempt = 0; attempt < 100; attempt++) {
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^
		             ((uint64_t)getpid() << 16) ^
		             __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED);
		x *= 0x9e3779b97f4a7c15ull;
		free(f->tmp_path);
		f->tmp_path = NULL;
		if (asprintf(&f->tmp_path, "%.*s.%s.tmp-%06llx", dir_len, f->path, base,
		             (unsigned long long)(x >> 40)) < 0) {
			f->tmp_path = NULL;
			return -ENOMEM;
		}
		int fd = open(f->tmp_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
		if (fd >= 0) {
			f->created = true;
			return fd;
		}
		if (errno != EEXIST) {
			int e = -errno;
			return wf_diag_set(diag, e, "create %s: %s", f->tmp_path, strerror(errno));
		}
	}
	return wf_diag_set(diag, -EEXIST, "create a temporary beside %s: names taken", f->path);
}

static int plan_files(struct wf_gguf_writer *w, struct wf_diag *diag)
{
	uint32_t n_files = 1;
	uint64_t size = 0;
	uint32_t count = 0;
	const uint64_t a = w->opts.alignment;
	for (uint32_t i = 0; i < w->n_tensors; i++) {
		struct tensor_item *t = &w->tensors[i];
		uint64_t padded = align_up(t->nbytes, a);
		bool full = (w->opts.split_max_bytes && size + padded > w->opts.split_max_bytes) ||
		            (w->opts.split_max_tensors && count >= w->opts.split_max_tensors);
		if (count > 0 && full) {
			n_files++;
			size = 0;
			count = 0;
		}
		t->file = n_files - 1;
		t->offset = size;
		size += padded;
		count++;
	}
	if (n_files > WF_GGUF_WRITER_MAX_SHARDS)
		return wf_diag_set(diag, WF_ELIMIT,
		                   "gguf writer: %u shards, split.count allows %u: raise the limit",
		                   n_files, WF_GGUF_WRITER_MAX_SHARDS);
	w->files = calloc(n_files, sizeof(*w->files));
	if (!w->files)
		return -ENOMEM;
	w->n_files = n_files;
	for (uint32_t i = 0; i < w->n_tensors; i++) {
		struct out_file *f = &w->files[w->tensors[i].file];
		if (f->n_tensors++ == 0)
			f->first_tensor = i;
	}
	for (uint32_t i = 0; i < n_files; i++) {
		struct out_file *f = &w->files[i];
		if (!w->split) {
			f->path = strdup(w->path);
		} else {
			size_t n = strlen(w->path) - 5; /* without ".gguf", checked at create */
			if (asprintf(&f->path, "%.*s-%05u-of-%05u.gguf", (int)n, w->path, i + 1,
			             n_files) < 0)
				f->path = NULL;
		}
		if (!f->path)
			return -ENOMEM;
	}
	return 0;
}

static int put_u16_kv(struct wf_gguf_writer *w, const char *key, uint16_t v, struct wf_diag *diag)
{
	struct wf_kv_value kv = {.type = WF_KV_U16};
	kv.u.u64 = v;
	return put_kv(w, key, &kv, diag);
}

static int write_file_header(struct wf_gguf_writer *w, uint32_t fi, struct wf_diag *diag)
{
	const struct out_file *f = &w->files[fi];
	bool custom_align = w->opts.alignment != WF_GGUF_DEFAULT_ALIGNMENT;
	uint64_t n_kv = (fi == 0 ? w->n_kv : 0) + (custom_align ? 1 : 0) + (w->split ? 3 : 0);
	int r = put_u32(w, GGUF_MAGIC, diag);
	if (r == 0)
		r = put_u32(w, GGUF_VERSION, diag);
	if (r == 0)
		r = put_u64(w, f->n_tensors, diag);
	if (r == 0)
		r = put_u64(w, n_kv, diag);
	for (uint32_t i = 0; fi == 0 && i < w->n_kv && r == 0; i++)
		r = put_kv(w, w->kvs[i].key, &w->kvs[i].v, diag);
	if (r == 0 && custom_align) {
		struct wf_kv_value kv = {.type = WF_KV_U32};
		kv.u.u64 = w->opts.alignment;
		r = put_kv(w, "general.alignment", &kv, diag);
	}
	if (r == 0 && w->split) {
		/* The order llama-gguf-split leaves them in (it re-sets split.count last). */
		struct wf_kv_value kv = {.type = WF_KV_I32};
		kv.u.i64 = (int64_t)w->n_tensors;
		r = put_u16_kv(w, "split.no", (uint16_t)fi, diag);
		if (r == 0)
			r = put_kv(w, "split.tensors.count", &kv, diag);
		if (r == 0)
			r = put_u16_kv(w, "split.count", (uint16_t)w->n_files, diag);
	}
	for (uint32_t i = 0; i < f->n_tensors && r == 0; i++) {
		const struct tensor_item *t = &w->tensors[f->first_tensor + i];
		r = put_str(w, t->name, strlen(t->name), diag);
		if (r == 0)
			r = put_u32(w, t->n_dims, diag);
		for (uint32_t d = 0; d < t->n_dims && r == 0; d++)
			r = put_u64(w, (uint64_t)t->ne[d], diag);
		if (r == 0)
			r = put_u32(w, (uint32_t)t->dtype, diag);
		if (r == 0)
			r = put_u64(w, t->offset, diag);
	}
	if (r < 0)
		return r;
	uint64_t pos = w->file_pos;
	return put_zeros(w, align_up(pos, w->opts.alignment) - pos, diag);
}

static int sync_fd(struct wf_gguf_writer *w, struct wf_diag *diag)
{
	if (!w->opts.fsync)
		return 0;
	if (fsync(w->fd) < 0) {
		int e = -errno;
		return wf_diag_set(diag, e, "fsync %s: %s", w->files[w->cur_file].tmp_path,
		                   strerror(errno));
	}
	return 0;
}

/* Flushes and closes the current file (it keeps its temporary name until finish). */
static int close_file(struct wf_gguf_writer *w, struct wf_diag *diag)
{
	int r = flush_tail(w, diag);
	if (r == 0)
		r = sync_fd(w, diag);
	if (r == 0 && close(w->fd) < 0) {
		r = -errno;
		wf_diag_set(diag, r, "close %s: %s", w->files[w->cur_file].tmp_path,
		            strerror(errno));
	}
	if (r < 0)
		close_fd(w);
	w->fd = -1;
	return r;
}

static int open_file(struct wf_gguf_writer *w, uint32_t fi, struct wf_diag *diag)
{
	int fd = create_tmp(&w->files[fi], diag);
	if (fd < 0)
		return fd;
	w->fd = fd;
	w->cur_file = fi;
	w->file_pos = 0;
	w->buf_off = 0;
	/* O_DIRECT where the filesystem takes it (not every one does: set after open, so that a
	 * refusal costs nothing); the buffers are aligned and written whole from offset 0. */
	w->direct = false;
	if (w->opts.direct) {
		int fl = fcntl(fd, F_GETFL);
		if (fl >= 0 && fcntl(fd, F_SETFL, fl | O_DIRECT) == 0)
			w->direct = true;
	}
	return write_file_header(w, fi, diag);
}

int wf_gguf_writer_write_header(struct wf_gguf_writer *w, struct wf_diag *diag)
{
	if (!w)
		return WF_EINVAL;
	if (w->state != STATE_BUILD)
		return wf_diag_set(diag, WF_ESTATE, "gguf writer: header already written");
	w->state = STATE_FAILED; /* until it worked */
	w->buf_cap = w->opts.buffer_size;
	for (int i = 0; i < N_BUFS; i++) {
		if (posix_memalign((void **)&w->bufs[i], DIRECT_ALIGN, w->buf_cap) != 0) {
			w->bufs[i] = NULL;
			return -ENOMEM;
		}
	}
	int r = io_start(w);
	if (r < 0)
		return wf_diag_set(diag, r, "gguf writer: cannot start the I/O thread");
	r = plan_files(w, diag);
	if (r == 0)
		r = open_file(w, 0, diag);
	if (r < 0)
		return r;
	w->cur_tensor = 0;
	w->cur_done = 0;
	w->state = STATE_WRITING;
	return 0;
}

/* After the last byte of cur_tensor: its padding, then the next shard if the next tensor lives
 * there. */
static int end_tensor(struct wf_gguf_writer *w, struct wf_diag *diag)
{
	const struct tensor_item *t = &w->tensors[w->cur_tensor];
	int r = put_zeros(w, align_up(t->nbytes, w->opts.alignment) - t->nbytes, diag);
	if (r < 0)
		return r;
	w->cur_tensor++;
	w->cur_done = 0;
	if (w->cur_tensor < w->n_tensors && w->tensors[w->cur_tensor].file != w->cur_file) {
		r = close_file(w, diag);
		if (r == 0)
			r = open_file(w, w->tensors[w->cur_tensor].file, diag);
	}
	return r;
}

int wf_gguf_writer_write(struct wf_gguf_writer *w, const void *data, size_t n, struct wf_diag *diag)
{
	if (!w || (!data && n))
		return WF_EINVAL;
	if (w->state != STATE_WRITING)
		return wf_diag_set(diag, WF_ESTATE,
		                   "gguf writer: write before the header or after "
		                   "a failure");
	const uint8_t *p = data;
	while (n) {
		if (w->cur_tensor >= w->n_tensors) {
			w->state = STATE_FAILED;
			return wf_diag_set(diag, WF_EOVERFLOW,
			                   "gguf writer: %zu bytes past the last tensor", n);
		}
		const struct tensor_item *t = &w->tensors[w->cur_tensor];
		uint64_t left = t->nbytes - w->cur_done;
		size_t take = left < n ? (size_t)left : n;
		int r = put(w, p, take, diag);
		if (r == 0) {
			w->cur_done += take;
			p += take;
			n -= take;
			if (w->cur_done == t->nbytes)
				r = end_tensor(w, diag);
		}
		if (r < 0) {
			w->state = STATE_FAILED;
			return r;
		}
	}
	return 0;
}

static int sync_dir(const char *path, struct wf_diag *diag)
{
	char *dir = dir_of(path);
	if (!dir)
		return -ENOMEM;
	int r = 0;
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0 || fsync(fd) < 0) {
		r = -errno;
		wf_diag_set(diag, r, "fsync directory %s: %s", dir, strerror(errno));
	}
	if (fd >= 0)
		close(fd);
	free(dir);
	return r;
}

int wf_gguf_writer_finish(struct wf_gguf_writer *w, struct wf_diag *diag)
{
	if (!w)
		return WF_EINVAL;
	if (w->state != STATE_WRITING)
		return wf_diag_set(diag, WF_ESTATE,
		                   "gguf writer: finish before the header or after "
		                   "a failure");
	w->state = STATE_FAILED;
	if (w->cur_tensor < w->n_tensors) {
		const struct tensor_item *t = &w->tensors[w->cur_tensor];
		return wf_diag_set(diag, WF_ETRUNCATED,
		                   "gguf writer: tensor '%s' got %llu of %llu bytes (%u of %u "
		                   "tensors complete)",
		                   t->name, (unsigned long long)w->cur_done,
		                   (unsigned long long)t->nbytes, w->cur_tensor, w->n_tensors);
	}
	int r = close_file(w, diag);
	io_stop(w);
	if (r < 0)
		return r;
	for (uint32_t i = 0; i < w->n_files; i++) {
		struct out_file *f = &w->files[i];
		if (rename(f->tmp_path, f->path) < 0) {
			r = -errno;
			return wf_diag_set(diag, r, "rename %s to %s: %s", f->tmp_path, f->path,
			                   strerror(errno));
		}
		f->renamed = true;
	}
	if (w->opts.fsync) {
		r = sync_dir(w->path, diag);
		if (r < 0)
			return r;
	}
	w->state = STATE_DONE;
	return 0;
}

/* ---- inspection --------------------------------------------------------------------------- */

uint32_t wf_gguf_writer_n_tensors(const struct wf_gguf_writer *w)
{
	return w ? w->n_tensors : 0;
}

uint64_t wf_gguf_writer_tensor_nbytes(const struct wf_gguf_writer *w, uint32_t index)
{
	return w && index < w->n_tensors ? w->tensors[index].nbytes : 0;
}

uint32_t wf_gguf_writer_n_files(const struct wf_gguf_writer *w)
{
	return w ? w->n_files : 0;
}

const char *wf_gguf_writer_file_path(const struct wf_gguf_writer *w, uint32_t file)
{
	return w && file < w->n_files ? w->files[file].path : NULL;
}

uint64_t wf_gguf_writer_bytes_written(const struct wf_gguf_writer *w)
{
	return w ? w->bytes_written : 0;
}
