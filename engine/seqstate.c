/* The sequences' state between steps (engine_internal.h, struct wf__seqstate), and the memory the
 * engine computes on. */
#include "engine/engine_internal.h"

#include "base/error.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/mman.h>

void *wf__mem_alloc(struct wf_device *dev, size_t bytes, struct wf_diag *diag)
{
	if (dev) {
		void *p = NULL;
		return wf_device_mem_alloc(dev, bytes ? bytes : 1, &p, diag) < 0 ? NULL : p;
	}
	/* Untouched pages cost nothing: a long context that is never filled takes no memory. */
	void *p = mmap(NULL, bytes ? bytes : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
	               -1, 0);
	if (p == MAP_FAILED) {
		wf_diag_set(diag, -ENOMEM, "%zu bytes", bytes);
		return NULL;
	}
	return p;
}

void wf__mem_free(struct wf_device *dev, void *p, size_t bytes)
{
	if (!p)
		return;
	if (dev)
		(void)wf_device_mem_free(dev, p, NULL);
	else
		munmap(p, bytes ? bytes : 1);
}

int wf__seqstate_init(struct wf__seqstate *s, struct wf_device *dev, enum wf_backend_kv type,
                      uint32_t n_layer, uint32_t n_seq, uint32_t n_ctx, uint32_t kv_row,
                      struct wf_diag *diag)
{
	s->dev = dev;
	s->kv_type = type;
	s->n_layer = n_layer;
	s->n_seq = n_seq;
	s->n_ctx = n_ctx;
	s->kv_row = kv_row;
	s->elem = type == WF_BACKEND_KV_F16 ? 2 : 4;
	s->layer_bytes = (size_t)n_seq * n_ctx * kv_row * s->elem;
	s->len = calloc(n_seq, sizeof(*s->len));
	s->recurrent = calloc(n_layer ? n_layer : 1, sizeof(*s->recurrent));
	if (!s->len || !s->recurrent)
		return wf_diag_set(diag, -ENOMEM, "sequence state");
	const size_t bytes = s->layer_bytes * n_layer;
	if (!(s->k = wf__mem_alloc(dev, bytes, diag)) || !(s->v = wf__mem_alloc(dev, bytes, diag)))
		return wf_diag_set(diag, -ENOMEM, "KV cache of %u x %u positions (%zu bytes)",
		                   n_seq, n_ctx, 2 * bytes);
	return 0;
}

void wf__seqstate_fini(struct wf__seqstate *s)
{
	const size_t bytes = s->layer_bytes * s->n_layer;
	wf__mem_free(s->dev, s->k, bytes);
	wf__mem_free(s->dev, s->v, bytes);
	wf__mem_free(s->dev, s->rs, s->rs_bytes * s->n_layer * s->n_seq);
	free(s->len);
	free(s->recurrent);
	s->k = s->v = s->rs = NULL;
	s->len = NULL;
	s->recurrent = NULL;
}

int wf__seqstate_truncate(struct wf__seqstate *s, uint32_t seq, uint32_t pos)
{
	if (seq >= s->n_seq)
		return WF_EINVAL;
	if (pos >= s->len[seq])
		return 0;
	if (pos > 0 && s->rs_bytes)
		return WF_EUNSUPPORTED; /* a recurrent state cannot be rewound to a position */
	s->len[seq] = pos;
	return 0;
}

uint64_t wf__seqstate_bytes(const struct wf__seqstate *s)
{
	return 2ull * s->layer_bytes * s->n_layer + (uint64_t)s->rs_bytes * s->n_layer * s->n_seq;
}
