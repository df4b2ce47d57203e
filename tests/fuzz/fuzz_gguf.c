/* libFuzzer target: arbitrary bytes through the whole GGUF open path (header parse, shard
 * discovery, common validation, hparams), then through everything a caller does with a model
 * that opened: lookups, the digest, the metadata getters.
 *
 * The bytes go into one memfd that is rewritten per input and opened by its /proc path, so the
 * reader runs on a real file exactly as it does in production (pread through its cursor). */
#include "base/error.h"
#include "model/model_internal.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int memfd = -1;
static char path[64];

static void use(const struct wf_model *m)
{
	struct wf_digest d, e;
	char hex[WF_DIGEST_HEX_LEN];
	wf_model_digest(m, &d);
	wf_digest_hex(&d, hex);
	if (wf_digest_parse(hex, &e) != 0 || e.hi != d.hi || e.lo != d.lo)
		abort();
	uint64_t sum = 0;
	for (uint32_t i = 0; i < m->n_tensors; i++) {
		const struct wf_tensor *t = &m->tensors[i];
		if (wf_model_find_tensor(m, t->name) != t)
			abort();
		if (t->offset + t->nbytes > m->files[t->file].size)
			abort();
		sum += t->nbytes;
	}
	if (sum != m->total_bytes || m->dense_bytes + m->expert_bytes != sum)
		abort();
	for (uint32_t i = 0; i < m->kv.n; i++) {
		const char *key = m->kv.items[i].key;
		uint64_t u;
		int64_t s;
		double f;
		bool b;
		const char *str;
		const struct wf_kv_array *a;
		if (wf_kv_find(&m->kv, key) == NULL)
			abort();
		(void)wf_kv_get_u64(&m->kv, key, &u);
		(void)wf_kv_get_i64(&m->kv, key, &s);
		(void)wf_kv_get_f64(&m->kv, key, &f);
		(void)wf_kv_get_bool(&m->kv, key, &b);
		(void)wf_kv_get_str(&m->kv, key, &str);
		(void)wf_kv_get_array(&m->kv, key, &a);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (memfd < 0) {
		memfd = memfd_create("fuzz_gguf", MFD_CLOEXEC);
		if (memfd < 0)
			abort();
		snprintf(path, sizeof(path), "/proc/self/fd/%d", memfd);
	}
	if (ftruncate(memfd, 0) != 0)
		abort();
	for (size_t off = 0; off < size;) {
		ssize_t w = pwrite(memfd, data + off, size - off, (off_t)off);
		if (w <= 0)
			abort();
		off += (size_t)w;
	}

	struct wf_model *m = NULL;
	struct wf_diag diag = {{0}};
	int rc = wf__model_open_format(path, WF_MODEL_FORMAT_GGUF, &m, &diag);
	if (rc == 0) {
		use(m);
		wf_model_close(m);
	} else if (m != NULL || rc > 0) {
		abort(); /* failure must leave ret_model alone and return a negative code */
	} else if (diag.msg[0] == '\0' && rc != -ENOMEM) {
		/* every failure on bad bytes must say why */
		abort();
	}
	return 0;
}
