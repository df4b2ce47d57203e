/* The host backend (backend.h): the CPU kernels (kernels.h), the CPU numerics (cpu_ops.h) and
 * products (cpu_matmul.h) over a thread pool, on host memory. With a stream (the host device) each
 * op first waits for it, since copies into its inputs may still run on the device's copy thread;
 * without one (no device: the CPU engine) it computes at once. Either way it computes in the
 * caller's thread and returns with the result written.
 *
 * Buffers: the quantized activations are sized for the worst case (F32 activations, max_rows
 * rows, three types at once) but mapped lazily (anonymous pages touched only when used), so a
 * context costs what its largest batch uses; mul_mat_id's expert-ordered results grow on demand
 * (a context that never sees a batch of several tokens per expert never allocates them). */
#include "kernels/backend.h"

#include "base/error.h"
#include "kernels/cpu_matmul.h"
#include "kernels/cpu_ops.h"
#include "kernels/pool.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define N_ACT WF_BACKEND_MAX_PRODUCTS /* distinct activation types one call may need */

struct wf_backend_ctx {
	struct wf_device_stream *stream; /* NULL: compute at once */
	struct wf_cpu cpu;
	bool own_pool;
	struct wf_backend_limits lim;
	uint8_t *qmap; /* the lazily mapped activations: N_ACT + 1 areas of qarea */
	size_t qmap_bytes, qarea;
	struct wf_cpu_mm_phase *ph;
	float *att; /* per thread: 2 * head_dim + max_kv + 16 floats, or WF_KERNELS_FA_SCRATCH */
	size_t att_floats;
	float *probs; /* max_expert floats */
	float *cs;    /* rope angles: head_dim floats */
	/* mul_mat_id's grouping: rows in expert order, and per group its matrix, first and count */
	uint32_t *order, *g_index, *g_first, *g_count, *tok_of;
	uint32_t *count_of; /* per stack matrix (max_stack) */
	float *tmp;         /* expert-ordered results of groups of several rows */
	size_t tmp_floats;
};

static void host_ctx_destroy(struct wf_backend_ctx *c)
{
	if (!c)
		return;
	if (c->stream)
		(void)wf_device_stream_synchronize(c->stream, NULL);
	if (c->own_pool)
		wf_pool_destroy(c->cpu.pool);
	if (c->qmap)
		munmap(c->qmap, c->qmap_bytes);
	free(c->ph);
	free(c->att);
	free(c->probs);
	free(c->cs);
	free(c->order);
	free(c->g_index);
	free(c->g_first);
	free(c->g_count);
	free(c->tok_of);
	free(c->count_of);
	free(c->tmp);
	free(c);
}

static int host_ctx_create(struct wf_device *dev, struct wf_device_stream *stream,
                           const struct wf_backend_limits *lim, struct wf_backend_ctx **ret_ctx,
                           struct wf_diag *diag)
{
	if ((dev && wf_device_kind(dev) != WF_DEVICE_KIND_HOST) || (!dev != !stream) ||
	    (stream && wf_device_stream_device(stream) != dev))
		return wf_diag_set(diag, WF_EINVAL,
		                   "the host backend takes a stream of a host device, or none");
	if (!lim->max_rows || !lim->max_ne0)
		return wf_diag_set(diag, WF_EINVAL, "host backend limits without rows or widths");
	struct wf_backend_ctx *c = calloc(1, sizeof(*c));
	if (!c)
		return wf_diag_set(diag, -ENOMEM, "host backend context");
	c->stream = stream;
	c->lim = *lim;
	c->cpu.ops = wf_kernels_cpu_ops();
	int rc = 0;
	if (!c->cpu.ops) {
		rc = wf_diag_set(diag, WF_EUNSUPPORTED,
		                 "WF_KERNELS names a kernel level this CPU or build lacks");
		goto fail;
	}
	if (lim->pool) {
		c->cpu.pool = lim->pool;
	} else {
		if ((rc = wf_pool_create(lim->n_threads ? lim->n_threads : 1, &c->cpu.pool)) < 0) {
			wf_diag_set(diag, rc, "thread pool of %u", lim->n_threads);
			goto fail;
		}
		c->own_pool = true;
	}
	c->cpu.n_threads = wf_pool_n_threads(c->cpu.pool);
	/* F32 is the widest activation type a weight pairs with (4 bytes an element). */
	const size_t width = (size_t)((lim->max_ne0 + 255) & ~(int64_t)255);
	c->qarea = (size_t)lim->max_rows * width * sizeof(float) + 4096u;
	c->qmap_bytes = c->qarea * (N_ACT + 1);
	void *q = mmap(NULL, c->qmap_bytes, PROT_READ | PROT_WRITE,
	               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (q == MAP_FAILED) {
		rc = wf_diag_set(diag, -ENOMEM, "host backend activations (%zu bytes)",
		                 c->qmap_bytes);
		goto fail;
	}
	c->qmap = q;
	const size_t rows = lim->max_rows, stack = lim->max_stack ? lim->max_stack : 1;
	c->att_floats = 2u * lim->head_dim + lim->max_kv + 16u;
	if (c->att_floats < WF_KERNELS_FA_SCRATCH(lim->head_dim))
		c->att_floats = WF_KERNELS_FA_SCRATCH(lim->head_dim);
	c->ph = malloc(sizeof(*c->ph));
	c->att = malloc((size_t)c->cpu.n_threads * c->att_floats * sizeof(float));
	c->probs = malloc(((size_t)lim->max_expert + 1) * sizeof(float));
	c->cs = malloc(((size_t)lim->head_dim + 2) * sizeof(float));
	c->order = malloc(rows * sizeof(uint32_t));
	c->g_index = malloc(rows * sizeof(uint32_t));
	c->g_first = malloc(rows * sizeof(uint32_t));
	c->g_count = malloc(rows * sizeof(uint32_t));
	c->tok_of = malloc(rows * sizeof(uint32_t));
	c->count_of = calloc(stack, sizeof(uint32_t));
	if (!c->ph || !c->att || !c->probs || !c->cs || !c->order || !c->g_index || !c->g_first ||
	    !c->g_count || !c->tok_of || !c->count_of) {
		rc = wf_diag_set(diag, -ENOMEM, "host backend buffers");
		goto fail;
	}
	c->ph->n_jobs = 0;
	*ret_ctx = c;
	return 0;
fail:
	host_ctx_destroy(c);
	return rc;
}

static uint64_t host_ctx_device_bytes(const struct wf_backend_ctx *c)
{
	(void)c;
	return 0;
}

/* Every op's first step: the inputs are complete once the stream has drained. */
static int ready(struct wf_backend_ctx *c, struct wf_diag *diag)
{
	return c->stream ? wf_device_stream_synchronize(c->stream, diag) : 0;
}

static bool host_supports(enum wf_dtype type)
{
	const struct wf_kernel_ops *ops = wf_kernels_cpu_ops();
	return ops && wf_kernel_ops_type(ops, type) != NULL;
}

static int type_ops(const struct wf_backend_ctx *c, const struct wf_backend_matrix *w,
                    const struct wf_kernel_type_ops **ret, struct wf_diag *diag)
{
	const struct wf_kernel_type_ops *t = wf_kernel_ops_type(c->cpu.ops, w->type);
	if (!t)
		return wf_diag_set(diag, WF_EUNSUPPORTED, "no CPU kernels for weight type %u",
		                   w->type);
	*ret = t;
	return 0;
}

/* The activation area for type act among the call's (at most N_ACT): the index of the area
 * that already holds it, or a new one. *fresh says whether it must be filled. */
static uint32_t act_slot(enum wf_dtype *types, uint32_t *n_types, enum wf_dtype act, bool *fresh)
{
	for (uint32_t i = 0; i < *n_types; i++)
		if (types[i] == act) {
			*fresh = false;
			return i;
		}
	types[*n_types] = act;
	*fresh = true;
	return (*n_types)++;
}

static int check_products(const struct wf_backend_ctx *c, uint32_t n_products,
                          const struct wf_backend_product *p, uint32_t rows,
                          const struct wf_kernel_type_ops **t, struct wf_diag *diag)
{
	if (n_products == 0 || n_products > WF_BACKEND_MAX_PRODUCTS)
		return wf_diag_set(diag, WF_EINVAL, "%u products in one call", n_products);
	if (rows > c->lim.max_rows)
		return wf_diag_set(diag, WF_EINVAL, "%u activation rows (at most %u)", rows,
		                   c->lim.max_rows);
	for (uint32_t i = 0; i < n_products; i++) {
		int rc = type_ops(c, p[i].w, &t[i], diag);
		if (rc < 0)
			return rc;
		if (p[i].w->ne0 != p[0].w->ne0 || p[i].w->ne0 > c->lim.max_ne0)
			return wf_diag_set(diag, WF_EINVAL, "products of rows of %lld elements",
			                   (long long)p[i].w->ne0);
	}
	return 0;
}

static int host_matmul(struct wf_backend_ctx *c, uint32_t n_products,
                       const struct wf_backend_product *p, const float *x, size_t x_stride,
                       uint32_t n, struct wf_diag *diag)
{
	const struct wf_kernel_type_ops *t[WF_BACKEND_MAX_PRODUCTS];
	int rc = ready(c, diag);
	if (rc == 0)
		rc = check_products(c, n_products, p, n, t, diag);
	if (rc < 0 || n == 0)
		return rc;
	/* The input quantized once per activation type, then every product in one pool run. */
	enum wf_dtype types[N_ACT];
	uint32_t n_types = 0;
	for (uint32_t i = 0; i < n_products; i++) {
		bool fresh;
		const uint32_t a = act_slot(types, &n_types, t[i]->vec_dot_type, &fresh);
		uint8_t *q = c->qmap + a * c->qarea;
		const size_t qs = wf_cpu_act_row_bytes(t[i]->vec_dot_type, p[i].w->ne0);
		if (fresh)
			wf_cpu_quantize_rows(&c->cpu, t[i]->vec_dot_type, x, x_stride, n,
			                     p[i].w->ne0, q);
		wf_cpu_mm_add(c->ph, t[i], p[i].w->data, p[i].w->row_size, p[i].w->ne0, p[i].w->ne1,
		              q, qs, n, p[i].y, p[i].y_stride);
	}
	wf_cpu_mm_run(&c->cpu, c->ph);
	return 0;
}

/* Groups mul_mat_id's rows by matrix: c->order lists the rows (t * k + j) with ids >= 0 in
 * matrix order, row order within (so each token's rows in token order, as ggml's mul_mat_id
 * walks them); g_* describe the groups. Returns the number of rows, or -1 for an id outside the
 * stack's bound. */
static int64_t group_rows(struct wf_backend_ctx *c, const int32_t *ids, uint32_t rows,
                          uint32_t *ret_groups)
{
	const uint32_t stack = c->lim.max_stack ? c->lim.max_stack : 1;
	uint32_t used = 0;
	for (uint32_t r = 0; r < rows; r++) {
		if (ids[r] < 0)
			continue;
		if ((uint32_t)ids[r] >= stack) {
			for (uint32_t q = 0; q < r; q++) /* leave the counters zeroed */
				if (ids[q] >= 0)
					c->count_of[ids[q]] = 0;
			return -1;
		}
		c->count_of[ids[r]]++;
		used++;
	}
	/* The matrices used, each once (the stack may be much larger than the rows: walk the
	 * rows' ids, not the stack). */
	uint32_t g = 0;
	for (uint32_t r = 0; r < rows; r++) {
		if (ids[r] < 0 || c->count_of[ids[r]] == 0)
			continue;
		c->g_index[g] = (uint32_t)ids[r];
		c->g_count[g] = c->count_of[ids[r]];
		c->count_of[ids[r]] = 0; /* seen: later rows of this matrix are skipped here */
		g++;
	}
	/* Sort the groups by matrix index (insertion sort: a decode step has k groups, a prompt at
	 * most the stack's matrices in use, and the ids of a step arrive nearly in any order). */
	for (uint32_t i = 1; i < g; i++) {
		const uint32_t xi = c->g_index[i], xc = c->g_count[i];
		uint32_t j = i;
		for (; j > 0 && c->g_index[j - 1] > xi; j--) {
			c->g_index[j] = c->g_index[j - 1];
			c->g_count[j] = c->g_count[j - 1];
		}
		c->g_index[j] = xi;
		c->g_count[j] = xc;
	}
	uint32_t at = 0;
	for (uint32_t i = 0; i < g; i++) {
		c->g_first[i] = at;
		c->count_of[c->g_index[i]] = i + 1; /* group of the matrix, + 1 */
		at += c->g_count[i];
		c->g_count[i] = 0; /* refilled below */
	}
	for (uint32_t r = 0; r < rows; r++) {
		if (ids[r] < 0)
			continue;
		const uint32_t gi = c->count_of[ids[r]] - 1;
		c->order[c->g_first[gi] + c->g_count[gi]++] = r;
	}
	for (uint32_t i = 0; i < g; i++)
		c->count_of[c->g_index[i]] = 0;
	*ret_groups = g;
	return used;
}

static int grow_tmp(struct wf_backend_ctx *c, size_t floats, struct wf_diag *diag)
{
	if (floats <= c->tmp_floats)
		return 0;
	float *t = realloc(c->tmp, floats * sizeof(float));
	if (!t)
		return wf_diag_set(diag, -ENOMEM, "host backend: %zu floats of expert results",
		                   floats);
	c->tmp = t;
	c->tmp_floats = floats;
	return 0;
}

static int host_mul_mat_id(struct wf_backend_ctx *c, uint32_t n_products,
                           const struct wf_backend_product *p, const int32_t *ids, uint32_t n,
                           uint32_t k, const float *x, size_t x_stride, bool x_per_slot,
                           struct wf_diag *diag)
{
	const struct wf_kernel_type_ops *t[WF_BACKEND_MAX_PRODUCTS];
	const uint32_t rows = n * k;
	int rc = ready(c, diag);
	if (rc == 0)
		rc = check_products(c, n_products, p, rows, t, diag);
	if (rc < 0 || rows == 0)
		return rc;
	uint32_t n_groups;
	const int64_t used = group_rows(c, ids, rows, &n_groups);
	if (used < 0)
		return wf_diag_set(diag, WF_EINVAL,
		                   "mul_mat_id: a matrix id outside the stack of %u",
		                   c->lim.max_stack);
	if (used == 0)
		return 0;
	/* Results of groups of several rows land in expert order, then go to their rows. */
	size_t tmp_floats = 0;
	for (uint32_t i = 0; i < n_products; i++)
		tmp_floats += (size_t)used * (size_t)p[i].w->ne1;
	for (uint32_t g = 0; g < n_groups; g++)
		if (c->g_count[g] > 1) {
			if ((rc = grow_tmp(c, tmp_floats, diag)) < 0)
				return rc;
			break;
		}
	/* The input rows, quantized once per activation type, in expert order: each token's row
	 * quantized once and copied to its experts' places (gate and up), or each choice's own row
	 * (down). */
	enum wf_dtype types[N_ACT];
	uint32_t n_types = 0;
	const uint8_t *qrows[WF_BACKEND_MAX_PRODUCTS];
	size_t qstride[WF_BACKEND_MAX_PRODUCTS];
	for (uint32_t i = 0; i < n_products; i++) {
		bool fresh;
		const enum wf_dtype act = t[i]->vec_dot_type;
		const uint32_t a = act_slot(types, &n_types, act, &fresh);
		uint8_t *q = c->qmap + a * c->qarea;
		const size_t qs = wf_cpu_act_row_bytes(act, p[i].w->ne0);
		qrows[i] = q;
		qstride[i] = qs;
		if (!fresh)
			continue;
		if (x_per_slot) {
			wf_cpu_quantize_rows_idx(&c->cpu, act, x, x_stride, c->order,
			                         (uint32_t)used, p[i].w->ne0, q);
		} else {
			uint8_t *tok =
			    c->qmap + N_ACT * c->qarea; /* the tokens' rows, then gathered */
			wf_cpu_quantize_rows(&c->cpu, act, x, x_stride, n, p[i].w->ne0, tok);
			for (int64_t r = 0; r < used; r++)
				memcpy(q + (size_t)r * qs, tok + (size_t)(c->order[r] / k) * qs,
				       qs);
		}
	}
	size_t tmp_at = 0;
	for (uint32_t i = 0; i < n_products; i++) {
		const struct wf_backend_matrix *w = p[i].w;
		for (uint32_t g = 0; g < n_groups; g++) {
			const uint32_t f = c->g_first[g], cnt = c->g_count[g];
			float *out = cnt == 1 ? p[i].y + (size_t)c->order[f] * p[i].y_stride
			                      : c->tmp + tmp_at + (size_t)f * (size_t)w->ne1;
			wf_cpu_mm_add(c->ph, t[i],
			              (const uint8_t *)w->data + (size_t)c->g_index[g] * w->stride,
			              w->row_size, w->ne0, w->ne1,
			              qrows[i] + (size_t)f * qstride[i], qstride[i], cnt, out,
			              (size_t)w->ne1);
		}
		tmp_at += (size_t)used * (size_t)w->ne1;
	}
	wf_cpu_mm_run(&c->cpu, c->ph);
	tmp_at = 0;
	for (uint32_t i = 0; i < n_products; i++) {
		const size_t ne1 = (size_t)p[i].w->ne1;
		for (uint32_t g = 0; g < n_groups; g++) {
			if (c->g_count[g] == 1)
				continue;
			for (uint32_t r = c->g_first[g]; r < c->g_first[g] + c->g_count[g]; r++)
				memcpy(p[i].y + (size_t)c->order[r] * p[i].y_stride,
				       c->tmp + tmp_at + (size_t)r * ne1, ne1 * sizeof(float));
		}
		tmp_at += (size_t)used * ne1;
	}
	return 0;
}

static int host_get_rows(struct wf_backend_ctx *c, const struct wf_backend_matrix *w,
                         const int32_t *ids, uint32_t n, float *y, struct wf_diag *diag)
{
	const struct wf_kernel_type_ops *t = NULL;
	int rc = ready(c, diag);
	if (rc == 0)
		rc = type_ops(c, w, &t, diag);
	for (uint32_t j = 0; rc == 0 && j < n; j++) {
		if (ids[j] < 0 || ids[j] >= w->ne1)
			return wf_diag_set(diag, WF_EINVAL, "row %d of %lld", ids[j],
			                   (long long)w->ne1);
		t->dequantize_row((const uint8_t *)w->data + (size_t)ids[j] * w->row_size,
		                  y + (size_t)j * w->ne0, w->ne0);
	}
	return rc;
}

static int host_copy_rows(struct wf_backend_ctx *c, const float *src, size_t src_stride,
                          const uint32_t *src_idx, uint32_t n, uint32_t len, float *dst,
                          size_t dst_stride, const uint32_t *dst_idx, struct wf_diag *diag)
{
	int rc = ready(c, diag);
	for (uint32_t r = 0; rc == 0 && r < n; r++)
		memmove(dst + (size_t)(dst_idx ? dst_idx[r] : r) * dst_stride,
		        src + (size_t)(src_idx ? src_idx[r] : r) * src_stride, len * sizeof(float));
	return rc;
}

static int host_rms_norm(struct wf_backend_ctx *c, const float *x, const float *w, float *y,
                         uint32_t rows, uint32_t len, size_t stride, float eps,
                         struct wf_diag *diag)
{
	int rc = ready(c, diag);
	for (uint32_t r = 0; rc == 0 && r < rows; r++)
		wf_cpu_rms_norm(x + (size_t)r * stride, w, y + (size_t)r * stride, len, eps);
	return rc;
}

static int host_rope(struct wf_backend_ctx *c, float *x, size_t x_stride, uint32_t n,
                     uint32_t n_heads, uint32_t head_dim, uint32_t n_dims, const int32_t *pos,
                     float base, enum wf_backend_rope kind, struct wf_diag *diag)
{
	int rc = ready(c, diag);
	if (rc == 0 && (n_dims > c->lim.head_dim || n_dims > head_dim))
		rc = wf_diag_set(diag, WF_EINVAL, "rope of %u dimensions", n_dims);
	const bool neox = kind == WF_BACKEND_ROPE_NEOX;
	for (uint32_t t = 0; rc == 0 && t < n; t++) {
		wf_cpu_rope_angles((uint32_t)pos[t], n_dims, base, c->cs);
		for (uint32_t h = 0; h < n_heads; h++)
			c->cpu.ops->rope(x + t * x_stride + (size_t)h * head_dim, n_dims, c->cs,
			                 neox);
	}
	return rc;
}

static int host_kv_store(struct wf_backend_ctx *c, const float *k, const float *v, uint32_t n,
                         uint32_t row, const uint32_t *dst_row, void *kc, void *vc,
                         enum wf_backend_kv type, struct wf_diag *diag)
{
	int rc = ready(c, diag);
	const size_t elem = type == WF_BACKEND_KV_F16 ? 2 : 4;
	for (uint32_t t = 0; rc == 0 && t < n; t++) {
		uint8_t *kd = (uint8_t *)kc + (size_t)dst_row[t] * row * elem;
		uint8_t *vd = (uint8_t *)vc + (size_t)dst_row[t] * row * elem;
		if (type == WF_BACKEND_KV_F16) {
			c->cpu.ops->from_float[WF_DTYPE_F16](k + (size_t)t * row, kd, row);
			c->cpu.ops->from_float[WF_DTYPE_F16](v + (size_t)t * row, vd, row);
		} else {
			memcpy(kd, k + (size_t)t * row, row * sizeof(float));
			memcpy(vd, v + (size_t)t * row, row * sizeof(float));
		}
	}
	return rc;
}

struct attn_job {
	struct wf_backend_ctx *c;
	const float *q;
	size_t q_stride;
	uint32_t n, n_head, n_head_kv, head_dim;
	const uint8_t *kc, *vc;
	enum wf_backend_kv type;
	const uint32_t *kv_first, *n_kv;
	float scale;
	float *out;
};

/* One query row of one head (the one-chunk path). */
static void attn_task(void *arg, uint32_t task, uint32_t thread)
{
	const struct attn_job *a = arg;
	const uint32_t t = task / a->n_head, h = task % a->n_head;
	const uint32_t kvh = h / (a->n_head / a->n_head_kv), D = a->head_dim;
	const size_t elem = a->type == WF_BACKEND_KV_F16 ? 2 : 4;
	const size_t row = (size_t)a->n_head_kv * D * elem;
	const size_t off = (size_t)a->kv_first[t] * row + (size_t)kvh * D * elem;
	wf_cpu_attend(a->q + t * a->q_stride + (size_t)h * D, a->kc + off, a->vc + off, row,
	              a->n_kv[t], D, a->scale, a->type, a->c->att + thread * a->c->att_floats,
	              a->out + t * a->q_stride + (size_t)h * D);
}

/* The tiled path: WF_KERNELS_FA_ROWS consecutive query rows of one head, so that the kernel
 * converts each K and V tile once for all of them; rows that start at another cache row (another
 * sequence) go in a call of their own. Blocks are taken last first: in a prompt they are the
 * longest, and the short ones left at the end balance the threads. */
static void attn_tiled_task(void *arg, uint32_t task, uint32_t thread)
{
	const struct attn_job *a = arg;
	const uint32_t n_blocks = (a->n + WF_KERNELS_FA_ROWS - 1) / WF_KERNELS_FA_ROWS;
	const uint32_t b = n_blocks - 1 - task / a->n_head, h = task % a->n_head;
	const uint32_t kvh = h / (a->n_head / a->n_head_kv), D = a->head_dim;
	const size_t row = (size_t)a->n_head_kv * D * sizeof(uint16_t);
	const uint32_t end = b * WF_KERNELS_FA_ROWS + WF_KERNELS_FA_ROWS < a->n
	                         ? b * WF_KERNELS_FA_ROWS + WF_KERNELS_FA_ROWS
	                         : a->n;
	float *scratch = a->c->att + thread * a->c->att_floats;
	for (uint32_t t = b * WF_KERNELS_FA_ROWS, e; t < end; t = e) {
		for (e = t + 1; e < end && a->kv_first[e] == a->kv_first[t];)
			e++;
		const size_t off =
		    (size_t)a->kv_first[t] * row + (size_t)kvh * D * sizeof(uint16_t);
		a->c->cpu.ops->attend_tiled(e - t, a->q + t * a->q_stride + (size_t)h * D,
		                            a->q_stride, a->n_kv + t, a->kc + off, a->vc + off, row,
		                            D, a->scale, scratch,
		                            a->out + t * a->q_stride + (size_t)h * D, a->q_stride);
	}
}

static int host_attention(struct wf_backend_ctx *c, const float *q, size_t q_stride, uint32_t n,
                          uint32_t n_head, uint32_t n_head_kv, uint32_t head_dim, const void *kc,
                          const void *vc, enum wf_backend_kv type, const uint32_t *kv_first,
                          const uint32_t *n_kv, float scale, float *out, struct wf_diag *diag)
{
	int rc = ready(c, diag);
	if (rc < 0)
		return rc;
	if (head_dim > c->lim.head_dim || !n_head_kv || n_head % n_head_kv)
		return wf_diag_set(diag, WF_EINVAL, "attention shape");
	for (uint32_t t = 0; t < n; t++)
		if (n_kv[t] == 0 || n_kv[t] > c->lim.max_kv)
			return wf_diag_set(diag, WF_EINVAL, "attention over %u positions", n_kv[t]);
	struct attn_job a = {c,  q,  q_stride, n,        n_head, n_head_kv, head_dim,
	                     kc, vc, type,     kv_first, n_kv,   scale,     out};
	/* ggml's CPU flash attention takes its tiled F32 path for a batch (all its sequences) of
	 * GGML_FA_TILE_Q rows or more, its one-chunk F16 path below that (F16 cache) */
	if (type == WF_BACKEND_KV_F16 && n >= WF_CPU_FA_TILE)
		wf_pool_run(c->cpu.pool, attn_tiled_task, &a,
		            (n + WF_KERNELS_FA_ROWS - 1) / WF_KERNELS_FA_ROWS * n_head);
	else
		wf_pool_run(c->cpu.pool, attn_task, &a, n * n_head);
	return 0;
}

static int host_route(struct wf_backend_ctx *c, const float *logits, uint32_t n, uint32_t n_expert,
                      uint32_t k, int32_t *ids, float *weights, struct wf_diag *diag)
{
	int rc = ready(c, diag);
	if (rc == 0 && (n_expert > c->lim.max_expert || k > n_expert || k == 0))
		rc = wf_diag_set(diag, WF_EINVAL, "route %u of %u experts", k, n_expert);
	for (uint32_t t = 0; rc == 0 && t < n; t++) {
		/* wf_cpu_route with the level's softmax */
		memcpy(c->probs, logits + (size_t)t * n_expert, n_expert * sizeof(float));
		c->cpu.ops->softmax(c->probs, n_expert);
		wf_cpu_route_top(c->probs, n_expert, k, ids + (size_t)t * k,
		                 weights + (size_t)t * k);
	}
	return rc;
}

static int host_swiglu(struct wf_backend_ctx *c, const float *g, const float *u, float *y,
                       size_t count, struct wf_diag *diag)
{
	int rc = ready(c, diag);
	if (rc == 0)
		c->cpu.ops->swiglu(g, u, y, (uint32_t)count);
	return rc;
}

static int host_add(struct wf_backend_ctx *c, float *y, const float *x, size_t count,
                    struct wf_diag *diag)
{
	int rc = ready(c, diag);
	for (size_t i = 0; rc == 0 && i < count; i++)
		y[i] += x[i];
	return rc;
}

static int host_moe_sum(struct wf_backend_ctx *c, const float *d, const float *weights, uint32_t n,
                        uint32_t k, uint32_t len, float *y, struct wf_diag *diag)
{
	int rc = ready(c, diag);
	if (rc == 0)
		wf_cpu_moe_sum(d, weights, n, k, len, y);
	return rc;
}

static const struct wf_backend_ops host_ops = {
    .name = "host",
    .version = WF_BACKEND_OPS_VERSION,
    .host_memory = true,
    .ctx_create = host_ctx_create,
    .ctx_destroy = host_ctx_destroy,
    .ctx_device_bytes = host_ctx_device_bytes,
    .supports = host_supports,
    .matmul = host_matmul,
    .mul_mat_id = host_mul_mat_id,
    .get_rows = host_get_rows,
    .copy_rows = host_copy_rows,
    .rms_norm = host_rms_norm,
    .rope = host_rope,
    .kv_store = host_kv_store,
    .attention = host_attention,
    .route = host_route,
    .swiglu = host_swiglu,
    .add = host_add,
    .moe_sum = host_moe_sum,
};

const struct wf_backend_ops *wf_backend_host(void)
{
	return &host_ops;
}
