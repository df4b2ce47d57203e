/* The front door: format detection, the validation every format shares, hparams, lookup. */
#include "model/model_internal.h"

#include "base/error.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef unsigned long long ull;

_Static_assert(WF_DTYPE_MAX_DIMS == WF_MODEL_MAX_DIMS, "wf_dtype_nbytes must take every shape");

/* ---- classification ---- */

static bool has_suffix(const char *s, const char *suffix)
{
	size_t n = strlen(s), k = strlen(suffix);
	return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* s points just past "experts."; HF names go on with an expert number or a fused projection. */
static bool hf_expert_tail(const char *s)
{
	return isdigit((unsigned char)s[0]) || strncmp(s, "gate", 4) == 0 ||
	       strncmp(s, "up", 2) == 0 || strncmp(s, "down", 4) == 0 || strncmp(s, "w1", 2) == 0 ||
	       strncmp(s, "w2", 2) == 0 || strncmp(s, "w3", 2) == 0;
}

enum wf_tensor_class wf__tensor_classify(const char *name)
{
	if (!name)
		return WF_TENSOR_DENSE;
	/* Shared experts run for every token: dense, whatever else the name says
	 * ("mlp.shared_experts.gate_proj" would otherwise match "experts.gate"). */
	if (strstr(name, "shexp") || strstr(name, "shared_expert"))
		return WF_TENSOR_DENSE;

	/* GGUF merged experts: blk.N.ffn_{gate,up,down,gate_up}_exps.{weight,bias,scale} */
	for (const char *p = strstr(name, "_exps"); p; p = strstr(p + 1, "_exps"))
		if (p[5] == '.' || p[5] == '\0')
			return WF_TENSOR_EXPERT;

	/* Pre-2024 GGUF (Mixtral before the merge): blk.N.ffn_gate.E.weight */
	static const char *const legacy[] = {"ffn_gate.", "ffn_up.", "ffn_down."};
	for (size_t i = 0; i < sizeof(legacy) / sizeof(legacy[0]); i++) {
		const char *p = strstr(name, legacy[i]);
		if (p && isdigit((unsigned char)p[strlen(legacy[i])]))
			return WF_TENSOR_EXPERT;
	}

	/* HF: ...mlp.experts.3.gate_proj.weight, ...block_sparse_moe.experts.0.w1.weight,
	 * ...mlp.experts.gate_up_proj (fused, gpt-oss). Routers (mlp.gate.weight, router.weight)
	 * do not match. */
	for (const char *p = strstr(name, "experts."); p; p = strstr(p + 1, "experts.")) {
		bool boundary = p == name || p[-1] == '.';
		if (boundary && hf_expert_tail(p + 8))
			return WF_TENSOR_EXPERT;
	}
	return WF_TENSOR_DENSE;
}

/* ---- hparams ---- */

static int arch_key(char *buf, size_t len, const char *arch, const char *suffix)
{
	int n = snprintf(buf, len, "%s.%s", arch, suffix);
	return n < 0 || (size_t)n >= len ? WF_ELIMIT : 0;
}

/* Largest element of an integer array; WF_EFORMAT for other element types or negatives. */
static int array_max(const struct wf_kv_array *a, uint64_t *ret)
{
	size_t sz = wf_kv_type_size(a->elem);
	if (a->elem == WF_KV_BOOL || a->elem == WF_KV_F32 || a->elem == WF_KV_F64 || sz == 0)
		return WF_EFORMAT;
	bool sgn = a->elem == WF_KV_I8 || a->elem == WF_KV_I16 || a->elem == WF_KV_I32 ||
	           a->elem == WF_KV_I64;
	uint64_t best = 0;
	const uint8_t *p = a->u.scalars;
	for (uint64_t i = 0; i < a->n; i++, p += sz) {
		uint64_t u = 0;
		int64_t s = 0;
		switch (sz) {
		case 1: {
			uint8_t x;
			memcpy(&x, p, 1);
			u = x;
			s = (int8_t)x;
			break;
		}
		case 2: {
			uint16_t x;
			memcpy(&x, p, 2);
			u = x;
			s = (int16_t)x;
			break;
		}
		case 4: {
			uint32_t x;
			memcpy(&x, p, 4);
			u = x;
			s = (int32_t)x;
			break;
		}
		default:
			memcpy(&u, p, 8);
			s = (int64_t)u;
			break;
		}
		if (sgn) {
			if (s < 0)
				return WF_EFORMAT;
			u = (uint64_t)s;
		}
		if (u > best)
			best = u;
	}
	*ret = best;
	return 0;
}

static int hp_u32(const struct wf_kv_set *kv, const char *arch, const char *suffix, uint32_t *out,
                  const char *path, struct wf_diag *diag)
{
	char key[128];
	if (arch_key(key, sizeof(key), arch, suffix))
		return wf_diag_set(diag, WF_ELIMIT, "'%s': key for %s is too long", path, suffix);
	const struct wf_kv *e = wf_kv_find(kv, key);
	if (!e)
		return 0;
	uint64_t v;
	int rc;
	if (e->v.type == WF_KV_ARRAY)
		rc = array_max(&e->v.u.arr, &v);
	else
		rc = wf_kv_get_u64(kv, key, &v);
	if (rc)
		return wf_diag_set(
		    diag, WF_EFORMAT,
		    "'%s': %s is %s, expected a non-negative integer (or an array of them)", path,
		    key, wf_kv_type_name(e->v.type));
	if (v > UINT32_MAX)
		return wf_diag_set(diag, WF_EFORMAT, "'%s': %s = %llu does not fit in 32 bits",
		                   path, key, (ull)v);
	*out = (uint32_t)v;
	return 0;
}

static int hp_f32(const struct wf_kv_set *kv, const char *arch, const char *suffix, float *out,
                  const char *path, struct wf_diag *diag)
{
	char key[128];
	if (arch_key(key, sizeof(key), arch, suffix))
		return wf_diag_set(diag, WF_ELIMIT, "'%s': key for %s is too long", path, suffix);
	double v;
	int rc = wf_kv_get_f64(kv, key, &v);
	if (rc == WF_ENOT_FOUND)
		return 0;
	if (rc)
		return wf_diag_set(diag, WF_EFORMAT, "'%s': %s is %s, expected a number", path, key,
		                   wf_kv_type_name(wf_kv_find(kv, key)->v.type));
	*out = (float)v;
	return 0;
}

int wf__hparams_from_gguf(struct wf_hparams *hp, const struct wf_kv_set *kv, const char *path,
                          struct wf_diag *diag)
{
	memset(hp, 0, sizeof(*hp));
	const char *arch;
	int rc = wf_kv_get_str(kv, "general.architecture", &arch);
	if (rc == WF_ENOT_FOUND)
		return 0; /* vocab-only files, adapters: no hparams, not an error */
	if (rc)
		return wf_diag_set(diag, WF_EFORMAT, "'%s': general.architecture is not a string",
		                   path);
	size_t alen = strlen(arch);
	if (alen >= sizeof(hp->arch))
		return wf_diag_set(diag, WF_ELIMIT,
		                   "'%s': general.architecture '%.64s...' is longer than %zu bytes",
		                   path, arch, sizeof(hp->arch) - 1);
	memcpy(hp->arch, arch, alen + 1);

	struct {
		const char *suffix;
		uint32_t *out;
	} u32s[] = {
	    {"block_count", &hp->n_layer},
	    {"embedding_length", &hp->n_embd},
	    {"attention.head_count", &hp->n_head},
	    {"attention.head_count_kv", &hp->n_head_kv},
	    {"attention.key_length", &hp->head_dim},
	    {"feed_forward_length", &hp->n_ff},
	    {"expert_feed_forward_length", &hp->n_ff_exp},
	    {"expert_count", &hp->n_expert},
	    {"expert_used_count", &hp->n_expert_used},
	    {"context_length", &hp->n_ctx_train},
	    {"rope.dimension_count", &hp->rope_dim},
	    {"vocab_size", &hp->n_vocab},
	};
	for (size_t i = 0; i < sizeof(u32s) / sizeof(u32s[0]); i++) {
		rc = hp_u32(kv, arch, u32s[i].suffix, u32s[i].out, path, diag);
		if (rc)
			return rc;
	}
	rc = hp_f32(kv, arch, "rope.freq_base", &hp->rope_freq_base, path, diag);
	if (!rc)
		rc = hp_f32(kv, arch, "attention.layer_norm_rms_epsilon", &hp->rms_eps, path, diag);
	if (rc)
		return rc;

	if (hp->head_dim == 0 && hp->n_head > 0)
		hp->head_dim = hp->n_embd / hp->n_head;
	if (hp->n_ff_exp == 0)
		hp->n_ff_exp = hp->n_ff;
	/* The vocabulary itself outranks a declared size: it is what the tokenizer will use. */
	const struct wf_kv_array *tokens;
	if (wf_kv_get_array(kv, "tokenizer.ggml.tokens", &tokens) == 0)
		hp->n_vocab = (uint32_t)tokens->n; /* <= WF_MODEL_MAX_ARRAY */
	return 0;
}

/* ---- validation ---- */

static int cmp_offset(const void *a, const void *b)
{
	const struct wf_tensor *x = a, *y = b;
	if (x->file != y->file)
		return x->file < y->file ? -1 : 1;
	if (x->offset != y->offset)
		return x->offset < y->offset ? -1 : 1;
	return strcmp(x->name, y->name);
}

static int cmp_name_idx(const void *a, const void *b, void *ctx)
{
	const struct wf_tensor *t = ctx;
	return strcmp(t[*(const uint32_t *)a].name, t[*(const uint32_t *)b].name);
}

static int check_tensor(struct wf_model *m, uint32_t i, struct wf_diag *diag)
{
	struct wf_tensor *t = &m->tensors[i];
	if (!t->name || !t->name[0])
		return wf_diag_set(diag, WF_EFORMAT, "tensor %u has no name", i);
	if (t->file >= m->n_files)
		return wf_diag_set(diag, WF_EINTERNAL, "tensor '%s' is in file %u of %u", t->name,
		                   t->file, m->n_files);
	const char *path = m->files[t->file].path;
	const struct wf_dtype_info *ti = wf_dtype_info(t->dtype);
	if (!ti)
		return wf_diag_set(diag, WF_EUNKNOWN_TYPE, "'%s': tensor '%s' has unknown type %u",
		                   path, t->name, (unsigned)t->dtype);
	if (t->n_dims > WF_MODEL_MAX_DIMS)
		return wf_diag_set(diag, WF_EFORMAT, "'%s': tensor '%s' has %u dimensions (max %u)",
		                   path, t->name, t->n_dims, WF_MODEL_MAX_DIMS);
	for (uint32_t d = t->n_dims; d < WF_MODEL_MAX_DIMS; d++)
		t->ne[d] = 1;
	uint64_t want;
	int rc = wf_dtype_nbytes(t->dtype, t->n_dims, t->ne, &want);
	if (rc)
		return wf_diag_set(diag, rc,
		                   "'%s': tensor '%s': %s shape [%lld, %lld, %lld, %lld]: %s", path,
		                   t->name, ti->name, (long long)t->ne[0], (long long)t->ne[1],
		                   (long long)t->ne[2], (long long)t->ne[3], wf_strerror(rc));
	if (t->nbytes != want)
		return wf_diag_set(diag, WF_EFORMAT,
		                   "'%s': tensor '%s' spans %llu bytes but its %s shape needs %llu",
		                   path, t->name, (ull)t->nbytes, ti->name, (ull)want);
	t->tclass = wf__tensor_classify(t->name);
	return 0;
}

int wf__model_finish(struct wf_model *m, struct wf_diag *diag)
{
	int rc;
	if (m->n_files == 0 || !m->files)
		return wf_diag_set(diag, WF_EINTERNAL, "model has no files");
	if (m->n_files > WF_MODEL_MAX_FILES)
		return wf_diag_set(diag, WF_ELIMIT, "model has %u files; the limit is %u",
		                   m->n_files, WF_MODEL_MAX_FILES);
	if (m->n_tensors > WF_MODEL_MAX_TENSORS)
		return wf_diag_set(diag, WF_ELIMIT, "model has %u tensors; the limit is %u",
		                   m->n_tensors, WF_MODEL_MAX_TENSORS);

	for (uint32_t i = 0; i < m->n_tensors; i++) {
		rc = check_tensor(m, i, diag);
		if (rc)
			return rc;
	}
	if (m->n_tensors > 1)
		qsort(m->tensors, m->n_tensors, sizeof(*m->tensors), cmp_offset);

	m->total_bytes = m->dense_bytes = m->expert_bytes = 0;
	memset(m->bytes_by_dtype, 0, sizeof(m->bytes_by_dtype));
	memset(m->count_by_dtype, 0, sizeof(m->count_by_dtype));
	for (uint32_t f = 0; f < m->n_files; f++) {
		m->files[f].n_tensors = 0;
		m->files[f].data_size = 0;
		if (m->files[f].alignment == 0)
			m->files[f].alignment = 1;
	}

	/* Sorted by (file, offset): a tensor overlaps an earlier one of its file iff it starts
	 * before the furthest end so far. Empty tensors occupy no bytes and may sit anywhere. */
	uint64_t max_end = 0;
	const struct wf_tensor *max_t = NULL;
	for (uint32_t i = 0; i < m->n_tensors; i++) {
		const struct wf_tensor *t = &m->tensors[i];
		struct wf_model_file *f = &m->files[t->file];
		uint64_t end;
		if (i == 0 || t->file != m->tensors[i - 1].file) {
			max_end = 0;
			max_t = NULL;
		}
		if (t->offset < f->data_offset)
			return wf_diag_set(
			    diag, WF_EFORMAT,
			    "'%s': tensor '%s' at offset %llu starts before the data "
			    "section at %llu",
			    f->path, t->name, (ull)t->offset, (ull)f->data_offset);
		if (__builtin_add_overflow(t->offset, t->nbytes, &end))
			return wf_diag_set(
			    diag, WF_EOVERFLOW,
			    "'%s': tensor '%s' at offset %llu + %llu bytes overflows", f->path,
			    t->name, (ull)t->offset, (ull)t->nbytes);
		if (end > f->size)
			return wf_diag_set(diag, WF_ETRUNCATED,
			                   "'%s': tensor '%s' ends at %llu past EOF %llu", f->path,
			                   t->name, (ull)end, (ull)f->size);
		if (t->nbytes > 0) {
			if (max_t && t->offset < max_end)
				return wf_diag_set(
				    diag, WF_EOVERLAP,
				    "'%s': tensor '%s' [%llu, %llu) overlaps tensor '%s' "
				    "[%llu, %llu)",
				    f->path, t->name, (ull)t->offset, (ull)end, max_t->name,
				    (ull)max_t->offset, (ull)max_end);
			if (end > max_end) {
				max_end = end;
				max_t = t;
			}
			/* The data section runs to the last tensor, padded to the alignment but
			 * never past EOF. */
			uint64_t a = f->alignment, len = end - f->data_offset;
			uint64_t padded = len + (a - len % a) % a;
			uint64_t avail = f->size - f->data_offset;
			uint64_t ds = padded < avail ? padded : avail;
			if (ds > f->data_size)
				f->data_size = ds;
		}
		f->n_tensors++;
		m->total_bytes += t->nbytes;
		if (t->tclass == WF_TENSOR_EXPERT)
			m->expert_bytes += t->nbytes;
		else
			m->dense_bytes += t->nbytes;
		m->bytes_by_dtype[t->dtype] += t->nbytes;
		m->count_by_dtype[t->dtype]++;
	}

	free(m->name_index);
	m->name_index = NULL;
	if (m->n_tensors == 0)
		return 0;
	m->name_index = malloc(m->n_tensors * sizeof(*m->name_index));
	if (!m->name_index)
		return -ENOMEM;
	for (uint32_t i = 0; i < m->n_tensors; i++)
		m->name_index[i] = i;
	qsort_r(m->name_index, m->n_tensors, sizeof(*m->name_index), cmp_name_idx, m->tensors);
	for (uint32_t i = 1; i < m->n_tensors; i++) {
		const struct wf_tensor *a = &m->tensors[m->name_index[i - 1]];
		const struct wf_tensor *b = &m->tensors[m->name_index[i]];
		if (strcmp(a->name, b->name) == 0)
			return wf_diag_set(
			    diag, WF_EDUPLICATE,
			    "duplicate tensor name '%s' (in '%s' at %llu and '%s' at %llu)",
			    a->name, m->files[a->file].path, (ull)a->offset, m->files[b->file].path,
			    (ull)b->offset);
	}
	return 0;
}

/* ---- opening files ---- */

static const char *file_kind(mode_t m)
{
	return S_ISFIFO(m)   ? "a FIFO"
	       : S_ISSOCK(m) ? "a socket"
	       : S_ISCHR(m)  ? "a character device"
	       : S_ISBLK(m)  ? "a block device"
	       : S_ISDIR(m)  ? "a directory"
	                     : "not a plain file";
}

int wf_model_file_open(const char *path, int *ret_fd, struct stat *ret_st, struct wf_diag *diag)
{
	struct stat st;
	int fd, fl, rc;

	if (!path || !ret_fd)
		return wf_diag_set(diag, WF_EINVAL, "wf_model_file_open: bad arguments");
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
	if (fd < 0)
		return -errno;
	if (fstat(fd, &st) != 0) {
		rc = wf_diag_set(diag, -errno, "'%s': fstat: %s", path, strerror(errno));
		goto err;
	}
	if (!S_ISREG(st.st_mode)) {
		rc = wf_diag_set(diag, WF_EFORMAT, "%s: not a regular file (%s)", path,
		                 file_kind(st.st_mode));
		goto err;
	}
	/* Regular files ignore O_NONBLOCK today; clear it so that no reader depends on that. */
	fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
		rc = wf_diag_set(diag, -errno, "'%s': fcntl: %s", path, strerror(errno));
		goto err;
	}
	if (ret_st)
		*ret_st = st;
	*ret_fd = fd;
	return 0;
err:
	close(fd);
	return rc;
}

int wf_model_fd_path(int fd, char **ret_path)
{
	char link[64], buf[PATH_MAX + 1];
	ssize_t n;

	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	n = readlink(link, buf, sizeof(buf) - 1);
	if (n < 0)
		return -errno;
	if ((size_t)n >= sizeof(buf) - 1)
		return -ENAMETOOLONG;
	buf[n] = '\0';
	char *p = strdup(buf);
	if (!p)
		return -ENOMEM;
	*ret_path = p;
	return 0;
}

int wf__model_record_file(struct wf_model_file *f, int fd, const struct stat *st)
{
	char *p = NULL;
	int rc = wf_model_fd_path(fd, &p);
	if (rc < 0)
		return rc;
	free(f->real_path);
	f->real_path = p;
	f->dev = (uint64_t)st->st_dev;
	f->ino = (uint64_t)st->st_ino;
	f->ctime_ns = (int64_t)st->st_ctim.tv_sec * 1000000000LL + st->st_ctim.tv_nsec;
	return 0;
}

int wf__model_record_aux(struct wf_model *m, int fd)
{
	char *p = NULL, **v;
	int rc = wf_model_fd_path(fd, &p);
	if (rc < 0)
		return rc;
	v = realloc(m->aux_paths, (m->n_aux + 1) * sizeof(*v));
	if (!v) {
		free(p);
		return -ENOMEM;
	}
	v[m->n_aux++] = p;
	m->aux_paths = v;
	return 0;
}

/* ---- open / close / lookup ---- */

static bool is_file(const char *dir, const char *name)
{
	char *p = NULL;
	struct stat st;
	if (asprintf(&p, "%s/%s", dir, name) < 0)
		return false;
	bool ok = stat(p, &st) == 0 && S_ISREG(st.st_mode);
	free(p);
	return ok;
}

static int detect(const char *path, enum wf_model_format *ret, struct wf_diag *diag)
{
	struct stat st;
	if (stat(path, &st) != 0)
		return wf_diag_set(diag, -errno, "cannot open '%s': %s", path, strerror(errno));
	if (S_ISDIR(st.st_mode)) {
		if (is_file(path, "model.safetensors.index.json") ||
		    is_file(path, "model.safetensors")) {
			*ret = WF_MODEL_FORMAT_SAFETENSORS;
			return 0;
		}
		return wf_diag_set(diag, WF_ENOT_FOUND,
		                   "directory '%s' holds neither model.safetensors.index.json nor "
		                   "model.safetensors",
		                   path);
	}
	/* A FIFO or a device would block or stream forever under a header reader. */
	if (!S_ISREG(st.st_mode))
		return wf_diag_set(diag, WF_EINVAL,
		                   "'%s' is neither a regular file nor a directory", path);
	if (has_suffix(path, ".gguf")) {
		*ret = WF_MODEL_FORMAT_GGUF;
		return 0;
	}
	if (has_suffix(path, ".safetensors") || has_suffix(path, ".safetensors.index.json")) {
		*ret = WF_MODEL_FORMAT_SAFETENSORS;
		return 0;
	}

	/* No telling name (a memfd, a blob store path): look at the bytes. safetensors starts
	 * with a u64 header length and then the JSON's '{'. */
	unsigned char head[9];
	int fd;
	int rc = wf_model_file_open(path, &fd, NULL, diag);
	if (rc < 0)
		return wf_diag_set(diag, rc, "cannot open '%s': %s", path, strerror(-rc));
	ssize_t n;
	do
		n = pread(fd, head, sizeof(head), 0);
	while (n < 0 && errno == EINTR);
	int err = errno;
	close(fd);
	if (n < 0)
		return wf_diag_set(diag, -err, "'%s': read: %s", path, strerror(err));
	if (n >= 4 && memcmp(head, "GGUF", 4) == 0) {
		*ret = WF_MODEL_FORMAT_GGUF;
		return 0;
	}
	if (n == 9 && head[8] == '{') {
		*ret = WF_MODEL_FORMAT_SAFETENSORS;
		return 0;
	}
	if (n < 4)
		return wf_diag_set(diag, WF_ETRUNCATED,
		                   "'%s' is %zd bytes long: too short to be a model", path, n);
	return wf_diag_set(
	    diag, WF_EMAGIC,
	    "'%s' is neither GGUF (no 'GGUF' magic) nor safetensors (no JSON header)", path);
}

int wf__model_open_format(const char *path, enum wf_model_format format,
                          struct wf_model **ret_model, struct wf_diag *diag)
{
	int rc;
	struct wf_model *m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	if (format == WF_MODEL_FORMAT_GGUF)
		rc = wf__gguf_load(m, path, diag);
	else if (format == WF_MODEL_FORMAT_SAFETENSORS)
		rc = wf__safetensors_load(m, path, diag);
	else
		rc = wf_diag_set(diag, WF_EINVAL, "unknown model format %d", (int)format);
	if (!rc)
		rc = wf__model_finish(m, diag);
	if (rc) {
		wf_model_close(m);
		return rc;
	}
	*ret_model = m;
	return 0;
}

int wf_model_open(const char *path, struct wf_model **ret_model, struct wf_diag *diag)
{
	wf_diag_clear(diag);
	if (!path || !ret_model)
		return wf_diag_set(diag, WF_EINVAL, "wf_model_open: NULL %s",
		                   path ? "ret_model" : "path");
	enum wf_model_format fmt = 0; /* no format: wf__model_open_format refuses it */
	int rc = detect(path, &fmt, diag);
	if (rc)
		return rc;
	return wf__model_open_format(path, fmt, ret_model, diag);
}

void wf_model_close(struct wf_model *model)
{
	if (!model)
		return;
	for (uint32_t i = 0; model->files && i < model->n_files; i++) {
		free(model->files[i].path);
		free(model->files[i].real_path);
	}
	for (uint32_t i = 0; model->aux_paths && i < model->n_aux; i++)
		free(model->aux_paths[i]);
	free(model->aux_paths);
	free(model->files);
	for (uint32_t i = 0; model->tensors && i < model->n_tensors; i++)
		free(model->tensors[i].name);
	free(model->tensors);
	wf_kv_set_fini(&model->kv);
	free(model->name_index);
	free(model);
}

const struct wf_tensor *wf_model_find_tensor(const struct wf_model *model, const char *name)
{
	if (!model || !name || !model->name_index)
		return NULL;
	uint32_t lo = 0, hi = model->n_tensors;
	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;
		const struct wf_tensor *t = &model->tensors[model->name_index[mid]];
		int c = strcmp(t->name, name);
		if (c == 0)
			return t;
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

const char *wf_model_format_name(enum wf_model_format format)
{
	switch (format) {
	case WF_MODEL_FORMAT_GGUF:
		return "gguf";
	case WF_MODEL_FORMAT_SAFETENSORS:
		return "safetensors";
	}
	return "unknown";
}
