/* libFuzzer target: arbitrary bytes through wf_model_open() as safetensors.
 *
 * An input is written to a file in a private directory and opened through the public entry
 * point, so format detection, the loader and wf__model_finish() all run:
 *  - most inputs become "single/m.safetensors" (a name that routes any bytes to the safetensors
 *    reader, including ones too short or with a length no JSON follows);
 *  - inputs that start with '{' (never a plausible header length: its low byte would be 0x7b and
 *    the next bytes text) become both "sharded/model.safetensors.index.json" and
 *    "sharded/config.json", beside two fixed valid shards a.safetensors (tensors "x", "z") and
 *    b.safetensors ("y"). That reaches the weight_map cross-checks and, for an input that is a
 *    valid index, the config.json reader on the same bytes.
 * The target checks invariants of every model it manages to open, so that a reader bug that
 * yields an inconsistent model is a crash rather than a silent pass. */
#include "model/model.h"
#include "model/safetensors_writer.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char root[PATH_MAX];
static char single_path[PATH_MAX];
static char index_path[PATH_MAX];
static char config_path[PATH_MAX];

static void die(const char *what)
{
	fprintf(stderr, "fuzz_safetensors: %s: %s\n", what, strerror(errno));
	abort();
}

static void write_file(const char *path, const uint8_t *data, size_t size)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0)
		die(path);
	while (size > 0) {
		ssize_t r = write(fd, data, size);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			die(path);
		data += r;
		size -= (size_t)r;
	}
	if (close(fd) < 0)
		die(path);
}

static void make_shard(const char *name, const char *const *tensors, int n)
{
	char path[PATH_MAX + 32];
	struct wf_st_writer *w;
	struct wf_diag diag = {0};
	static const float data[2] = {1.0f, 2.0f};

	snprintf(path, sizeof(path), "%s/sharded/%s", root, name);
	if (wf_st_writer_create(path, NULL, &w, &diag) < 0)
		goto fail;
	for (int i = 0; i < n; i++)
		if (wf_st_writer_add_tensor(w, tensors[i], WF_DTYPE_F32, 1, (int64_t[]){2}, data,
		                            &diag) < 0)
			goto fail;
	if (wf_st_writer_finish(w, &diag) < 0)
		goto fail;
	wf_st_writer_destroy(w);
	return;
fail:
	fprintf(stderr, "fuzz_safetensors: shard %s: %s\n", path, diag.msg);
	abort();
}

static void cleanup(void)
{
	static const char *const files[] = {
	    "single/m.safetensors", "sharded/model.safetensors.index.json", "sharded/config.json",
	    "sharded/a.safetensors", "sharded/b.safetensors"};
	char path[PATH_MAX + 64];

	for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
		snprintf(path, sizeof(path), "%s/%s", root, files[i]);
		unlink(path);
	}
	snprintf(path, sizeof(path), "%s/single", root);
	rmdir(path);
	snprintf(path, sizeof(path), "%s/sharded", root);
	rmdir(path);
	rmdir(root);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	const char *base = getenv("TMPDIR");
	char sub[PATH_MAX + 16];
	struct stat st;

	(void)argc;
	(void)argv;
	/* tmpfs when there is one: the target rewrites a file per input. */
	if (!base || !*base)
		base = stat("/dev/shm", &st) == 0 && access("/dev/shm", W_OK) == 0 ? "/dev/shm"
		                                                                   : "/tmp";
	snprintf(root, sizeof(root), "%s/wf-fuzz-st-XXXXXX", base);
	if (!mkdtemp(root))
		die(root);
	atexit(cleanup);
	snprintf(sub, sizeof(sub), "%s/single", root);
	if (mkdir(sub, 0700) < 0)
		die(sub);
	snprintf(sub, sizeof(sub), "%s/sharded", root);
	if (mkdir(sub, 0700) < 0)
		die(sub);
	snprintf(single_path, sizeof(single_path), "%s/single/m.safetensors", root);
	snprintf(index_path, sizeof(index_path), "%s/sharded/model.safetensors.index.json", root);
	snprintf(config_path, sizeof(config_path), "%s/sharded/config.json", root);
	make_shard("a.safetensors", (const char *const[]){"x", "z"}, 2);
	make_shard("b.safetensors", (const char *const[]){"y"}, 1);
	return 0;
}

/* What every opened model must satisfy, whatever the bytes were. */
static void check_model(const struct wf_model *m)
{
	uint64_t total = 0, per_file[4] = {0};

	if (m->format != WF_MODEL_FORMAT_SAFETENSORS || m->n_files == 0 || m->n_files > 2)
		abort();
	for (uint32_t i = 0; i < m->n_tensors; i++) {
		const struct wf_tensor *t = &m->tensors[i];
		const struct wf_model_file *f;

		if (t->file >= m->n_files || t->n_dims > WF_MODEL_MAX_DIMS || !t->name)
			abort();
		f = &m->files[t->file];
		if (t->offset < f->data_offset || t->offset + t->nbytes > f->size)
			abort();
		if (wf_model_find_tensor(m, t->name) != t)
			abort();
		total += t->nbytes;
		per_file[t->file] += t->nbytes;
	}
	if (total != m->total_bytes)
		abort();
	/* safetensors tensors tile each file's data section exactly */
	for (uint32_t i = 0; i < m->n_files; i++)
		if (m->files[i].alignment != 1 ||
		    per_file[i] != m->files[i].size - m->files[i].data_offset)
			abort();
	for (uint32_t i = 0; i < m->kv.n; i++)
		if (m->kv.items[i].v.type != WF_KV_STRING || !m->kv.items[i].v.u.str.s)
			abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct wf_model *m = NULL;
	struct wf_diag diag = {0};
	const char *path;

	if (size > 0 && data[0] == '{') {
		write_file(index_path, data, size);
		write_file(config_path, data, size);
		path = index_path;
	} else {
		write_file(single_path, data, size);
		path = single_path;
	}
	if (wf_model_open(path, &m, &diag) == 0) {
		check_model(m);
		wf_model_close(m);
	} else if (m != NULL || diag.msg[sizeof(diag.msg) - 1] != '\0') {
		abort(); /* ret_model written on failure, or an unterminated diag */
	}
	return 0;
}
