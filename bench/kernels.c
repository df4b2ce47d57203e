/* wf-bench kernels [--device cuda:N] [--json] [--iterations N]: the CUDA backend's kernels
 * (kernels/backend.h, cuda/) against the device's own bandwidth, measured in the same run.
 *
 *  read_bandwidth          the anchor: the best of a device-to-device copy of 512 MiB (counted as
 *                          2 x 512 MiB moved) and the checksum kernel reading 512 MiB (a read-only
 *                          stream), GB/s.
 *  matvec_TYPE_nN          matmul of one 2048-wide matrix of ~256 MiB (larger than any L2, so
 *                          every call streams it from memory) with N = 1, 8 and 32 activation
 *                          rows: weight bytes / time per call, over read_bandwidth. Issue 18's
 *                          goal: >= 0.7 at N = 1 for every type; 8 and 32 are for the record.
 *  mul_mat_id_gate_up_nN   Qwen3-30B-A3B's expert shapes (128 experts, top 8): gate and up
 *  mul_mat_id_down_nN      (2048 -> 768, Q4_K, one call for both, x per token) and down
 *                          (768 -> 2048, Q4_K, x per choice), at N = 1 and 8 tokens: the distinct
 *                          experts' bytes / time per call, over read_bandwidth (for the record).
 *  attention_decode_4k     one token's attention over 4096 cached positions, 32 query heads over
 *                          4 KV heads of 128, F16 cache (8 MiB of K and V), 16 such caches used
 *                          in turn (as layers are, beyond L2): cache bytes / time per call.
 * Timing: device events around `iterations` calls (default 20) after 3 untimed ones, on one
 * stream; weights and caches hold arbitrary finite bytes (the kernels' speed does not depend on
 * the values). Without a CUDA device the mode prints the reason and exits 77. */
#include "anchors.h"
#include "bench.h"
#include "report.h"

#include "base/error.h"
#include "device/device.h"
#include "kernels/backend.h"
#include "model/dtype.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MiB ((size_t)1 << 20)

struct kb {
	struct wf_device *dev;
	struct wf_device_stream *s;
	const struct wf_backend_ops *ops;
	struct wf_backend_ctx *c;
	struct wf_device_event *t0, *t1;
	int iters;
	double anchor; /* bytes/s */
	char dev_name[160];
};

typedef int (*kb_call)(struct kb *k, int i, void *arg, struct wf_diag *diag);

/* Seconds per call: 3 untimed calls, then iters calls between two events. Negative on error. */
static double kb_time(struct kb *k, kb_call call, void *arg, const char *what)
{
	struct wf_diag d = {{0}};
	int rc = 0;
	double ms = 0;
	for (int i = 0; i < 3 && rc == 0; i++)
		rc = call(k, i, arg, &d);
	if (rc == 0)
		rc = wf_device_event_record(k->t0, k->s, &d);
	for (int i = 0; i < k->iters && rc == 0; i++)
		rc = call(k, i, arg, &d);
	if (rc == 0)
		rc = wf_device_event_record(k->t1, k->s, &d);
	if (rc == 0)
		rc = wf_device_event_synchronize(k->t1, &d);
	if (rc == 0)
		rc = wf_device_event_elapsed_ms(k->t0, k->t1, &ms, &d);
	if (rc < 0) {
		fprintf(stderr, "wf-bench kernels: %s: %s\n", what, wf_diag_str(&d, rc));
		return -1;
	}
	return ms / 1e3 / k->iters;
}

static void *kb_alloc(struct kb *k, size_t size, int fill)
{
	void *p = NULL;
	struct wf_diag d = {{0}};
	int rc = wf_device_mem_alloc(k->dev, size, &p, &d);
	if (rc == 0)
		rc = wf_device_memset_async(k->s, p, fill, size, &d);
	if (rc == 0)
		rc = wf_device_stream_synchronize(k->s, &d);
	if (rc < 0) {
		fprintf(stderr, "wf-bench kernels: %zu bytes of device memory: %s\n", size,
		        wf_diag_str(&d, rc));
		wf_device_mem_free(k->dev, p, NULL);
		return NULL;
	}
	return p;
}

static void kb_row(struct kb *k, const char *metric, double bytes, double secs, double goal,
                   const char *notes)
{
	const double gbs = bytes / secs / 1e9;
	struct bench_result r = {
	    .bench = "kernels",
	    .metric = metric,
	    .unit = "GB/s",
	    .value = gbs,
	    .anchor = "device read bandwidth (same run)",
	    .anchor_value = k->anchor / 1e9,
	    .ratio = gbs / (k->anchor / 1e9),
	    .goal = goal,
	    .goal_op = goal > 0 ? ">=" : NULL,
	    .notes = notes,
	};
	bench_report(&r);
}

/* ---- the anchor ----------------------------------------------------------------------------- */

struct copy_arg {
	void *a, *b;
	size_t size;
	uint64_t sum;
};

static int call_copy(struct kb *k, int i, void *arg, struct wf_diag *diag)
{
	struct copy_arg *c = arg;
	(void)i;
	return wf_device_memcpy_async(k->s, c->b, c->a, c->size, WF_DEVICE_COPY_D2D, diag);
}

static double anchor(struct kb *k)
{
	struct copy_arg c = {.size = 512 * MiB};
	c.a = kb_alloc(k, c.size, 1);
	c.b = c.a ? kb_alloc(k, c.size, 0) : NULL;
	if (!c.b) {
		wf_device_mem_free(k->dev, c.a, NULL);
		return -1;
	}
	const double t_copy = kb_time(k, call_copy, &c, "D2D copy");
	/* the checksum kernel: one read of every byte (it waits for its 8-byte result) */
	double t_read = -1;
	for (int i = 0; i < 1 + k->iters / 4; i++) {
		struct wf_diag d = {{0}};
		const double t = bench_now();
		if (wf_device_checksum(k->s, c.a, c.size, &c.sum, &d) < 0)
			break;
		const double dt = bench_now() - t;
		t_read = t_read < 0 || dt < t_read ? dt : t_read;
	}
	wf_device_mem_free(k->dev, c.a, NULL);
	wf_device_mem_free(k->dev, c.b, NULL);
	if (t_copy <= 0)
		return -1;
	const double copy = 2.0 * (double)c.size / t_copy;
	const double read = t_read > 0 ? (double)c.size / t_read : 0;
	char notes[256];
	snprintf(notes, sizeof notes,
	         "D2D copy of 512 MiB %.1f GB/s (2 x bytes / time), checksum read %.1f GB/s; %s",
	         copy / 1e9, read / 1e9, k->dev_name);
	k->anchor = copy > read ? copy : read;
	struct bench_result r = {.bench = "kernels",
	                         .metric = "read_bandwidth",
	                         .unit = "GB/s",
	                         .value = k->anchor / 1e9,
	                         .anchor = "itself (the best of copy and read)",
	                         .anchor_value = k->anchor / 1e9,
	                         .ratio = 1.0,
	                         .notes = notes};
	bench_report(&r);
	return k->anchor;
}

/* ---- mat-vec -------------------------------------------------------------------------------- */

struct mm_arg {
	struct wf_backend_matrix w[2];
	struct wf_backend_product p[2];
	unsigned n_products;
	const float *x;
	size_t xs;
	uint32_t n, k;
	const int32_t *ids;
	bool per_slot;
};

static int call_matmul(struct kb *k, int i, void *arg, struct wf_diag *diag)
{
	struct mm_arg *a = arg;
	(void)i;
	if (a->ids)
		return k->ops->mul_mat_id(k->c, a->n_products, a->p, a->ids, a->n, a->k, a->x,
		                          a->xs, a->per_slot, diag);
	return k->ops->matmul(k->c, a->n_products, a->p, a->x, a->xs, a->n, diag);
}

static size_t row_bytes(enum wf_dtype t, int64_t ne0)
{
	const struct wf_dtype_info *info = wf_dtype_info(t);
	return (size_t)(ne0 / info->block_size) * info->type_size;
}

static int matvec_rows(struct kb *k, float *x, float *y)
{
	static const enum wf_dtype types[] = {WF_DTYPE_F32,  WF_DTYPE_F16,  WF_DTYPE_BF16,
	                                      WF_DTYPE_Q8_0, WF_DTYPE_Q4_0, WF_DTYPE_Q4_K,
	                                      WF_DTYPE_Q5_K, WF_DTYPE_Q6_K};
	static const uint32_t ns[] = {1, 8, 32};
	const int64_t ne0 = 2048;
	for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++) {
		const size_t row = row_bytes(types[ti], ne0);
		const int64_t ne1 = (int64_t)(256 * MiB / row) & ~(int64_t)255;
		/* 0x11 bytes: finite F16, BF16 and F32 values, small block scales */
		void *w = kb_alloc(k, row * (size_t)ne1, 0x11);
		if (!w)
			return -1;
		for (size_t ni = 0; ni < sizeof(ns) / sizeof(ns[0]); ni++) {
			struct mm_arg a = {.n_products = 1, .x = x, .xs = ne0, .n = ns[ni]};
			a.w[0] = (struct wf_backend_matrix){w, types[ti], ne0, ne1, row, 0};
			a.p[0] = (struct wf_backend_product){&a.w[0], y, (size_t)ne1};
			char metric[64], notes[200];
			snprintf(metric, sizeof metric, "matvec_%s_n%u",
			         wf_dtype_info(types[ti])->name, ns[ni]);
			const double t = kb_time(k, call_matmul, &a, metric);
			if (t <= 0) {
				wf_device_mem_free(k->dev, w, NULL);
				return -1;
			}
			snprintf(notes, sizeof notes, "%lld x %lld, %.1f MiB, %.1f us per call",
			         (long long)ne1, (long long)ne0, (double)(row * ne1) / MiB,
			         t * 1e6);
			kb_row(k, metric, (double)(row * (size_t)ne1), t, ns[ni] == 1 ? 0.7 : 0,
			       notes);
		}
		wf_device_mem_free(k->dev, w, NULL);
	}
	return 0;
}

/* Qwen3-30B-A3B's experts: ids of n tokens, 8 distinct of 128 each, spread so that a batch of
 * tokens shares some experts (as real routing does); returns the distinct experts. */
static uint32_t make_ids(int32_t *ids, uint32_t n)
{
	bool used[128] = {false};
	uint32_t distinct = 0;
	for (uint32_t t = 0; t < n; t++)
		for (uint32_t j = 0; j < 8; j++) {
			const int32_t e = (int32_t)((t * 37 + j * 13 + (j > 5 ? t : 0)) % 128);
			ids[t * 8 + j] = e;
			distinct += !used[e];
			used[e] = true;
		}
	return distinct;
}

static int mmid_rows(struct kb *k, float *x, float *y)
{
	const size_t row_gu = row_bytes(WF_DTYPE_Q4_K, 2048), row_d = row_bytes(WF_DTYPE_Q4_K, 768);
	const size_t gu = row_gu * 768, dn = row_d * 2048; /* one expert's matrix */
	void *gate = kb_alloc(k, gu * 128, 0x11), *up = gate ? kb_alloc(k, gu * 128, 0x11) : NULL;
	void *down = up ? kb_alloc(k, dn * 128, 0x11) : NULL;
	int32_t *dids = down ? kb_alloc(k, 8 * 8 * sizeof(int32_t), 0) : NULL;
	int rc = dids ? 0 : -1;
	for (uint32_t n = 1; n <= 8 && rc == 0; n += 7) {
		int32_t ids[64];
		const uint32_t distinct = make_ids(ids, n);
		struct wf_diag d = {{0}};
		if (wf_device_memcpy_async(k->s, dids, ids, n * 8 * sizeof(int32_t),
		                           WF_DEVICE_COPY_H2D, &d) < 0 ||
		    wf_device_stream_synchronize(k->s, &d) < 0) {
			fprintf(stderr, "wf-bench kernels: ids: %s\n", d.msg);
			rc = -1;
			break;
		}
		for (int which = 0; which < 2 && rc == 0; which++) {
			struct mm_arg a = {.x = x, .n = n, .k = 8, .ids = dids};
			size_t bytes;
			if (which == 0) {
				a.n_products = 2;
				a.xs = 2048;
				a.w[0] = (struct wf_backend_matrix){gate, WF_DTYPE_Q4_K, 2048,
				                                    768,  row_gu,        gu};
				a.w[1] = a.w[0];
				a.w[1].data = up;
				a.p[0] = (struct wf_backend_product){&a.w[0], y, 768};
				a.p[1] = (struct wf_backend_product){&a.w[1], y + 64 * 768, 768};
				bytes = 2 * gu * distinct;
			} else {
				a.n_products = 1;
				a.xs = 768;
				a.per_slot = true;
				a.w[0] = (struct wf_backend_matrix){down, WF_DTYPE_Q4_K, 768,
				                                    2048, row_d,         dn};
				a.p[0] = (struct wf_backend_product){&a.w[0], y, 2048};
				bytes = dn * distinct;
			}
			char metric[64], notes[200];
			snprintf(metric, sizeof metric, "mul_mat_id_%s_n%u",
			         which ? "down" : "gate_up", n);
			const double t = kb_time(k, call_matmul, &a, metric);
			if (t <= 0) {
				rc = -1;
				break;
			}
			snprintf(
			    notes, sizeof notes,
			    "Q4_K, 128 experts, top 8, %u distinct: %.2f MiB, %.1f us per call",
			    distinct, (double)bytes / MiB, t * 1e6);
			kb_row(k, metric, (double)bytes, t, 0, notes);
		}
	}
	wf_device_mem_free(k->dev, gate, NULL);
	wf_device_mem_free(k->dev, up, NULL);
	wf_device_mem_free(k->dev, down, NULL);
	wf_device_mem_free(k->dev, dids, NULL);
	return rc;
}

/* ---- attention ------------------------------------------------------------------------------ */

#define ATT_CACHES 16

struct att_arg {
	void *kc[ATT_CACHES], *vc[ATT_CACHES];
	const float *q;
	float *out;
	const uint32_t *first, *n_kv;
};

static int call_attention(struct kb *k, int i, void *arg, struct wf_diag *diag)
{
	struct att_arg *a = arg;
	return k->ops->attention(k->c, a->q, 32 * 128, 1, 32, 4, 128, a->kc[i % ATT_CACHES],
	                         a->vc[i % ATT_CACHES], WF_BACKEND_KV_F16, a->first, a->n_kv,
	                         0.08838835f, a->out, diag);
}

static int attention_rows(struct kb *k, float *x, float *y)
{
	const size_t cache = (size_t)4096 * 4 * 128 * 2;
	struct att_arg a = {.q = x, .out = y};
	int rc = 0;
	/* 0x2c2c: F16 0.0645, finite scores and values */
	for (int i = 0; i < ATT_CACHES && rc == 0; i++) {
		a.kc[i] = kb_alloc(k, cache, 0x2c);
		a.vc[i] = a.kc[i] ? kb_alloc(k, cache, 0x2c) : NULL;
		rc = a.vc[i] ? 0 : -1;
	}
	const uint32_t pos[2] = {0, 4096};
	uint32_t *dpos = rc == 0 ? kb_alloc(k, sizeof(pos), 0) : NULL;
	struct wf_diag d = {{0}};
	if (dpos &&
	    (wf_device_memcpy_async(k->s, dpos, pos, sizeof(pos), WF_DEVICE_COPY_H2D, &d) < 0 ||
	     wf_device_stream_synchronize(k->s, &d) < 0))
		rc = -1;
	if (rc == 0 && dpos) {
		a.first = dpos;
		a.n_kv = dpos + 1;
		const double t = kb_time(k, call_attention, &a, "attention");
		char notes[200];
		snprintf(
		    notes, sizeof notes,
		    "1 token, 4096 positions, 32 heads over 4 of 128, F16 cache (%.0f MiB K+V), "
		    "%d caches in turn, %.1f us per call",
		    2.0 * cache / MiB, ATT_CACHES, t * 1e6);
		if (t > 0)
			kb_row(k, "attention_decode_4k", 2.0 * (double)cache, t, 0, notes);
		else
			rc = -1;
	}
	for (int i = 0; i < ATT_CACHES; i++) {
		wf_device_mem_free(k->dev, a.kc[i], NULL);
		wf_device_mem_free(k->dev, a.vc[i], NULL);
	}
	wf_device_mem_free(k->dev, dpos, NULL);
	return rc;
}

int bench_kernels(const struct bench_opts *o)
{
	const char *spec = o->device ? o->device : "cuda:0";
	struct kb k = {.iters = o->iterations > 0 ? o->iterations : 20};
	struct wf_diag d = {{0}};
	int rc = wf_device_open(spec, &k.dev, &d);
	if (rc < 0 || wf_device_kind(k.dev) != WF_DEVICE_KIND_CUDA) {
		char why[600];
		snprintf(why, sizeof why, "no CUDA device (%s: %s)", spec,
		         rc < 0 ? wf_diag_str(&d, rc) : "not a CUDA device");
		fprintf(stderr, "wf-bench kernels: %s: skipped\n", why);
		bench_skip("kernels", "read_bandwidth", why);
		wf_device_close(k.dev);
		return 77;
	}
	snprintf(k.dev_name, sizeof k.dev_name, "%s", wf_device_name(k.dev));
	k.ops = wf_backend_for(k.dev);
	if (!k.ops) {
		fprintf(stderr, "wf-bench kernels: no compute backend registered for %s\n", spec);
		wf_device_close(k.dev);
		return 1;
	}
	const struct wf_backend_limits lim = {.max_rows = 256,
	                                      .max_expert = 128,
	                                      .max_stack = 128,
	                                      .max_ne0 = 2048,
	                                      .max_ne1 = 1 << 20,
	                                      .max_kv = 4096,
	                                      .head_dim = 128};
	float *x = NULL, *y = NULL;
	int ret = 1;
	if ((rc = wf_device_stream_create(k.dev, &k.s, &d)) < 0 ||
	    (rc = wf_device_event_create(k.dev, WF_DEVICE_EVENT_TIMING, &k.t0, &d)) < 0 ||
	    (rc = wf_device_event_create(k.dev, WF_DEVICE_EVENT_TIMING, &k.t1, &d)) < 0 ||
	    (rc = k.ops->ctx_create(k.dev, k.s, &lim, &k.c, &d)) < 0) {
		fprintf(stderr, "wf-bench kernels: %s: %s\n", spec, wf_diag_str(&d, rc));
		goto out;
	}
	/* activations: 64 rows of 2048 (finite, 0x3c3c3c3c = 0.0115 as F32); outputs: the
	 * largest matrix's rows times 32 */
	x = kb_alloc(&k, 64 * 2048 * sizeof(float), 0x3c);
	y = x ? kb_alloc(&k, (size_t)32 * (256 * MiB / 576) * sizeof(float) + 64 * MiB, 0) : NULL;
	if (!y || anchor(&k) <= 0 || matvec_rows(&k, x, y) < 0 || mmid_rows(&k, x, y) < 0 ||
	    attention_rows(&k, x, y) < 0)
		goto out;
	ret = 0;
out:
	wf_device_mem_free(k.dev, x, NULL);
	wf_device_mem_free(k.dev, y, NULL);
	if (k.ops && k.c)
		k.ops->ctx_destroy(k.c);
	wf_device_event_destroy(k.t0);
	wf_device_event_destroy(k.t1);
	wf_device_stream_destroy(k.s);
	wf_device_close(k.dev);
	return ret;
}
