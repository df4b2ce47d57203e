/* The KV cache: one contiguous block per layer and sequence, so that a sequence's positions are
 * rows in position order (the order llama.cpp's single-sequence cache visits them in). */
#include "engine/engine_internal.h"

#include "base/error.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/mman.h>

int wf__kv_init(struct wf__kv *kv, enum wf_engine_kv_type type, uint32_t n_layer, uint32_t n_seq,
                uint32_t n_ctx, uint32_t row)
{
	kv->type = type;
	kv->n_layer = n_layer;
	kv->n_seq = n_seq;
	kv->n_ctx = n_ctx;
	kv->row = row;
	kv->elem = type == WF_ENGINE_KV_F16 ? 2 : 4;
	const size_t bytes = (size_t)n_layer * n_seq * n_ctx * row * kv->elem;
	/* Untouched pages cost nothing: a long context that is never filled takes no memory. */
	kv->bytes = bytes;
	kv->k = wf__map_zeroed(bytes);
	kv->v = wf__map_zeroed(bytes);
	kv->len = calloc(n_seq, sizeof(*kv->len));
	if (!kv->k || !kv->v || !kv->len) {
		wf__kv_fini(kv);
		return -ENOMEM;
	}
	return 0;
}

void wf__kv_fini(struct wf__kv *kv)
{
	wf__unmap(kv->k, kv->bytes);
	wf__unmap(kv->v, kv->bytes);
	free(kv->len);
	kv->k = kv->v = NULL;
	kv->len = NULL;
}

void *wf__map_zeroed(size_t bytes)
{
	void *p = mmap(NULL, bytes ? bytes : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
	               -1, 0);
	return p == MAP_FAILED ? NULL : p;
}

void wf__unmap(void *p, size_t bytes)
{
	if (p)
		munmap(p, bytes ? bytes : 1);
}
