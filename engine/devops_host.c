/* The device compute ops (devops.h) for the host backend, whose device memory is host memory:
 * each op waits for the stream (copies into its inputs may still be running on the backend's
 * copy thread), then computes in the caller's thread over the engine's pool with the same CPU
 * kernels (cpumm.c) and numerics (ops.c) as the CPU forward pass, so the device forward pass on
 * the host device gives the CPU engine's logits bit for bit. */
#include "engine/devops_host.h"

#include "base/error.h"
#include "device/device.h"
#include "engine/cpumm.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct host_ctx {
	struct wf_device_stream *stream;
	struct wf__cpu cpu;
	bool own_pool;
	struct wf_engine_dev_limits lim;
	uint8_t *qa; /* quantized activations: max_rows rows of the widest type */
	struct wf__mm_phase *ph;
	float *att; /* per thread: 2 * head_dim + max_kv + 16 floats */
	size_t att_floats;
	float *probs; /* max_expert floats */
	float *cs;    /* rope angles: head_dim floats */
};

static void host_ctx_destroy(void *ctx)
{
	struct host_ctx *c = ctx;
	if (!c)
		return;
	(void)wf_device_stream_synchronize(c->stream, NULL);
	if (c->own_pool)
		wf_pool_destroy(c->cpu.pool);
	free(c->qa);
	free(c->ph);
	free(c->att);
	free(c->probs);
	free(c->cs);
	free(c);
}

static int host_ctx_create(struct wf_device *dev, struct wf_device_stream *stream,
                           const struct wf_engine_dev_limits *lim, void **ret_ctx,
                           struct wf_diag *diag)
{
	if (wf_device_kind(dev) != WF_DEVICE_KIND_HOST || wf_device_stream_device(stream) != dev)
		return wf_diag_set(diag, WF_EINVAL,
		                   "host engine ops need a stream of a host device");
	struct host_ctx *c = calloc(1, sizeof(*c));
	if (!c)
		return wf_diag_set(diag, -ENOMEM, "host engine ops");
	c->stream = stream;
	c->lim = *lim;
	c->cpu.ops = wf_kernels_cpu_ops();
	int rc = 0;
	if (!c->cpu.ops) {
		rc = wf_diag_set(diag, WF_EUNSUPPORTED,
		                 "WF_KERNELS names a kernel level this CPU lacks");
		goto fail;
	}
	if (lim->host_pool) {
		c->cpu.pool = lim->host_pool;
	} else {
		if ((rc = wf_pool_create(lim->n_threads ? lim->n_threads : 1, &c->cpu.pool)) < 0) {
			wf_diag_set(diag, rc, "thread pool");
			goto fail;
		}
		c->own_pool = true;
	}
	c->cpu.n_threads = wf_pool_n_threads(c->cpu.pool);
	/* F32 is the widest activation type any weight pairs with (4 bytes an element). */
	const size_t width = (size_t)((lim->max_ne0 + 255) & ~(int64_t)255);
	c->att_floats = 2u * lim->head_dim + lim->max_kv + 16u;
	c->qa = malloc((size_t)lim->max_rows * width * sizeof(float) + 4096u);
	c->ph = malloc(sizeof(*c->ph));
	c->att = malloc((size_t)c->cpu.n_threads * c->att_floats * sizeof(float));
	c->probs = malloc(((size_t)lim->max_expert + 1) * sizeof(float));
	c->cs = malloc(((size_t)lim->head_dim + 2) * sizeof(float));
	if (!c->qa || !c->ph || !c->att || !c->probs || !c->cs) {
		rc = wf_diag_set(diag, -ENOMEM, "host engine ops buffers");
		goto fail;
	}
	c->ph->n_jobs = 0;
	*ret_ctx = c;
	return 0;
fail:
	host_ctx_destroy(c);
	return rc;
}

/* Every op's first step: the inputs are complete once the stream has drained. */
static int ready(struct host_ctx *c, struct wf_diag *diag)
{
	return wf_device_stream_synchronize(c->stream, diag);
}

static bool host_supports(enum wf_dtype type)
{
	const struct wf_kernel_ops *ops = wf_kernels_cpu_ops();
	return ops && wf_kernel_ops_type(ops, type) != NULL;
}

static int as_wt(const struct host_ctx *c, const struct wf_engine_dev_matrix *m, struct wf__wt *w,
                 struct wf_diag *diag)
{
	memset(w, 0, sizeof(*w));
	w->ops = wf_kernel_ops_type(c->cpu.ops, m->type);
	if (!w->ops)
		return wf_diag_set(diag, WF_EUNSUPPORTED, "no CPU kernels for type %u", m->type);
	w->data = m->data;
	w->type = m->type;
	w->ne[0] = m->ne0;
	w->ne[1] = m->ne1;
	w->ne[2] = 1;
	w->row_size = m->row_size;
	w->matrix_size = m->row_size * (size_t)m->ne1;
	return 0;
}

static int host_matmul(void *ctx, const struct wf_engine_dev_matrix *m, const float *x,
                       size_t x_stride, uint32_t n, float *y, size_t y_stride, struct wf_diag *diag)
{
	struct host_ctx *c = ctx;
	struct wf__wt w;
	int rc = ready(c, diag);
	if (rc == 0 && n > c->lim.max_rows)
		rc = wf_diag_set(diag, WF_EINVAL, "matmul of %u rows (at most %u)", n,
		                 c->lim.max_rows);
	if (rc == 0)
		rc = as_wt(c, m, &w, diag);
	if (rc == 0 && n)
		wf__matmul(&c->cpu, c->ph, &w, x, x_stride, n, c->qa, y, y_stride);
	return rc;
}

static int host_matmul_experts(void *ctx, const struct wf_engine_dev_matrix *m, size_t stride,
                               uint32_t n_groups, const uint32_t *index, const uint32_t *first,
                               const uint32_t *count, const float *x, size_t x_stride, float *y,
                               size_t y_stride, struct wf_diag *diag)
{
	struct host_ctx *c = ctx;
	struct wf__wt w;
	int rc = ready(c, diag);
	if (rc == 0)
		rc = as_wt(c, m, &w, diag);
	if (rc < 0)
		return rc;
	/* Every group's rows quantized once, then one pool run over all the groups' products. */
	uint32_t rows = 0;
	for (uint32_t g = 0; g < n_groups; g++)
		rows = first[g] + count[g] > rows ? first[g] + count[g] : rows;
	if (rows > c->lim.max_rows || n_groups > WF__MM_MAX_JOBS)
		return wf_diag_set(diag, WF_EINVAL, "expert matmul of %u rows in %u groups", rows,
		                   n_groups);
	const size_t qs = wf__act_row_bytes(w.ops->vec_dot_type, m->ne0);
	for (uint32_t g = 0; g < n_groups; g++)
		wf__quantize_rows(&c->cpu, w.ops->vec_dot_type, x + first[g] * x_stride, x_stride,
		                  count[g], m->ne0, c->qa + first[g] * qs);
	for (uint32_t g = 0; g < n_groups; g++)
		wf__mm_add(c->ph, &w, 0, (const uint8_t *)m->data + index[g] * stride,
		           c->qa + first[g] * qs, qs, count[g], y + first[g] * y_stride, y_stride);
	wf__mm_run(&c->cpu, c->ph);
	return 0;
}

static int host_get_rows(void *ctx, const struct wf_engine_dev_matrix *m, const int32_t *ids,
                         uint32_t n, float *y, struct wf_diag *diag)
{
	struct host_ctx *c = ctx;
	struct wf__wt w;
	int rc = ready(c, diag);
	if (rc == 0)
		rc = as_wt(c, m, &w, diag);
	for (uint32_t j = 0; rc == 0 && j < n; j++) {
		if (ids[j] < 0 || ids[j] >= m->ne1)
			return wf_diag_set(diag, WF_EINVAL, "row %d of %lld", ids[j],
			                   (long long)m->ne1);
		w.ops->dequantize_row((const uint8_t *)m->data + (size_t)ids[j] * m->row_size,
		                      y + (size_t)j * m->ne0, m->ne0);
	}
	return rc;
}

static int host_rms_norm(void *ctx, const float *x, const float *w, float *y, uint32_t rows,
                         uint32_t len, size_t stride, float eps, struct wf_diag *diag)
{
	int rc = ready(ctx, diag);
	for (uint32_t r = 0; rc == 0 && r < rows; r++)
		wf__rms_norm(x + (size_t)r * stride, w, y + (size_t)r * stride, len, eps);
	return rc;
}

static int host_rope(void *ctx, float *x, size_t x_stride, uint32_t n, uint32_t n_heads,
                     uint32_t head_dim, uint32_t n_dims, const int32_t *pos, float base,
                     enum wf_engine_dev_rope kind, struct wf_diag *diag)
{
	struct host_ctx *c = ctx;
	int rc = ready(c, diag);
	if (rc == 0 && n_dims > c->lim.head_dim)
		rc = wf_diag_set(diag, WF_EINVAL, "rope of %u dimensions", n_dims);
	for (uint32_t t = 0; rc == 0 && t < n; t++) {
		wf__rope_angles((uint32_t)pos[t], n_dims, base, c->cs);
		for (uint32_t h = 0; h < n_heads; h++)
			wf__rope(x + t * x_stride + (size_t)h * head_dim, n_dims, c->cs,
			         (enum wf__rope_kind)kind);
	}
	return rc;
}

static int host_kv_store(void *ctx, const float *k, const float *v, uint32_t n, uint32_t row,
                         const uint32_t *dst_row, void *kc, void *vc, enum wf_engine_dev_kv type,
                         struct wf_diag *diag)
{
	struct host_ctx *c = ctx;
	int rc = ready(c, diag);
	const size_t elem = type == WF_ENGINE_DEV_KV_F16 ? 2 : 4;
	for (uint32_t t = 0; rc == 0 && t < n; t++) {
		uint8_t *kd = (uint8_t *)kc + (size_t)dst_row[t] * row * elem;
		uint8_t *vd = (uint8_t *)vc + (size_t)dst_row[t] * row * elem;
		if (type == WF_ENGINE_DEV_KV_F16) {
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
	struct host_ctx *c;
	const float *q;
	size_t q_stride;
	uint32_t n_head, n_head_kv, head_dim;
	const uint8_t *kc, *vc;
	enum wf_engine_dev_kv type;
	const uint32_t *kv_first, *n_kv;
	float scale;
	float *out;
};

static void attn_task(void *arg, uint32_t task, uint32_t thread)
{
	const struct attn_job *a = arg;
	const uint32_t t = task / a->n_head, h = task % a->n_head;
	const uint32_t kvh = h / (a->n_head / a->n_head_kv), D = a->head_dim;
	const size_t elem = a->type == WF_ENGINE_DEV_KV_F16 ? 2 : 4;
	const size_t row = (size_t)a->n_head_kv * D * elem;
	const size_t off = (size_t)a->kv_first[t] * row + (size_t)kvh * D * elem;
	wf__attend(a->q + t * a->q_stride + (size_t)h * D, a->kc + off, a->vc + off, row,
	           a->n_kv[t], D, a->scale,
	           a->type == WF_ENGINE_DEV_KV_F16 ? WF_ENGINE_KV_F16 : WF_ENGINE_KV_F32,
	           a->c->att + thread * a->c->att_floats, a->out + t * a->q_stride + (size_t)h * D);
}

static int host_attention(void *ctx, const float *q, size_t q_stride, uint32_t n, uint32_t n_head,
                          uint32_t n_head_kv, uint32_t head_dim, const void *kc, const void *vc,
                          enum wf_engine_dev_kv type, const uint32_t *kv_first,
                          const uint32_t *n_kv, float scale, float *out, struct wf_diag *diag)
{
	struct host_ctx *c = ctx;
	int rc = ready(c, diag);
	if (rc < 0)
		return rc;
	if (head_dim > c->lim.head_dim || !n_head_kv || n_head % n_head_kv)
		return wf_diag_set(diag, WF_EINVAL, "attention shape");
	for (uint32_t t = 0; t < n; t++)
		if (n_kv[t] == 0 || n_kv[t] > c->lim.max_kv)
			return wf_diag_set(diag, WF_EINVAL, "attention over %u positions", n_kv[t]);
	struct attn_job a = {c,  q,    q_stride, n_head, n_head_kv, head_dim, kc,
	                     vc, type, kv_first, n_kv,   scale,     out};
	wf_pool_run(c->cpu.pool, attn_task, &a, n * n_head);
	return 0;
}

static int host_route(void *ctx, const float *logits, uint32_t n, uint32_t n_expert, uint32_t k,
                      int32_t *ids, float *weights, struct wf_diag *diag)
{
	struct host_ctx *c = ctx;
	int rc = ready(c, diag);
	if (rc == 0 && (n_expert > c->lim.max_expert || k > n_expert))
		rc = wf_diag_set(diag, WF_EINVAL, "route %u of %u experts", k, n_expert);
	for (uint32_t t = 0; rc == 0 && t < n; t++)
		wf__route(logits + (size_t)t * n_expert, n_expert, k, c->probs, ids + (size_t)t * k,
		          weights + (size_t)t * k);
	return rc;
}

static int host_gather(void *ctx, const float *x, const uint32_t *idx, uint32_t n, uint32_t len,
                       float *y, struct wf_diag *diag)
{
	int rc = ready(ctx, diag);
	for (uint32_t r = 0; rc == 0 && r < n; r++)
		memmove(y + (size_t)r * len, x + (size_t)idx[r] * len, len * sizeof(float));
	return rc;
}

static int host_swiglu(void *ctx, const float *g, const float *u, float *y, size_t count,
                       struct wf_diag *diag)
{
	int rc = ready(ctx, diag);
	if (rc == 0)
		wf__swiglu(g, u, y, (uint32_t)count);
	return rc;
}

static int host_add(void *ctx, float *y, const float *x, size_t count, struct wf_diag *diag)
{
	int rc = ready(ctx, diag);
	for (size_t i = 0; rc == 0 && i < count; i++)
		y[i] += x[i];
	return rc;
}

static int host_moe_sum(void *ctx, const float *down, const uint32_t *slot_of, const float *weights,
                        uint32_t n, uint32_t k, uint32_t len, float *y, struct wf_diag *diag)
{
	int rc = ready(ctx, diag);
	if (rc == 0)
		wf__moe_sum(down, slot_of, weights, n, k, len, y);
	return rc;
}

static const struct wf_engine_dev_ops host_ops = {
    .name = "host",
    .ctx_create = host_ctx_create,
    .ctx_destroy = host_ctx_destroy,
    .supports = host_supports,
    .matmul = host_matmul,
    .matmul_experts = host_matmul_experts,
    .get_rows = host_get_rows,
    .rms_norm = host_rms_norm,
    .rope = host_rope,
    .kv_store = host_kv_store,
    .attention = host_attention,
    .route = host_route,
    .gather = host_gather,
    .swiglu = host_swiglu,
    .add = host_add,
    .moe_sum = host_moe_sum,
};

const struct wf_engine_dev_ops *wf__devops_host(void)
{
	return &host_ops;
}
