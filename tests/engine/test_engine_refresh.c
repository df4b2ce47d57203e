/* The refresh seam at the engine (wf_engine_refresh) and the scheduler's step boundary
 * (wf_sched_between): an engine pointed at new bytes of some tensors computes, from its next
 * step on, exactly what a fresh engine on the new bytes computes; under 1,000 refreshes while 8
 * sequences decode, every step's logits are those of the old bytes or of the new, never a mix.
 * On the host device too, with the store's copies and the expert cache (a refreshed stack's
 * cached experts must be forgotten). */
#include "base/error.h"
#include "common/wftest.h"
#include "device/device.h"
#include "engine/engine.h"
#include "engine/scheduler.h"
#include "engine/tokenizer.h"
#include "eweights.h"
#include "model/model.h"
#include "ondev.h"
#include "worker/weights.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

TestSuite(engine_refresh, .timeout = 300);

#define N_SEQ 8
#define N_TOK 4

/* The model in two versions: A, the reference model, and B, a copy of its file in which some
 * tensors hold the bytes of the same tensor of another layer (same type and shape), so that the
 * logits differ visibly. A fresh engine on B is what an engine refreshed from A to B must compute;
 * B's own engine (with its store's copies on a device) also lends the refresh its new bytes. */
struct version {
	struct wf_model *m;
	struct wf_weight_view v;
	struct wf_worker_engine we; /* a fresh engine on this version */
};

struct versions {
	struct version a, b;
	char *dir;
	uint32_t ids[4];
	uint32_t n_ids;
	struct wf_device *dev;
};

static uint32_t tensor_index(const struct wf_model *m, const char *name)
{
	const struct wf_tensor *t = wf_model_find_tensor(m, name);
	cr_assert_not_null(t, "%s", name);
	return (uint32_t)(t - m->tensors);
}

static struct wf_engine_config config(struct wf_device *dev)
{
	struct wf_engine_config cfg = {.n_ctx = 64, .n_seq_max = N_SEQ, .n_threads = 2};
	if (dev) {
		cfg.device = dev;
		cfg.dense_on_device = true;
		cfg.expert_cache_mb = 64; /* every expert fits: the second step hits */
		cfg.experts_on_device = true;
		cfg.n_cpu_moe = 2; /* layers 0-1 host-side (post-fetch, cache), 2 resident */
	}
	return cfg;
}

static void version_open(struct version *ver, const char *path, struct wf_device *dev)
{
	struct wf_diag d = {{0}};
	cr_assert_eq(wf_model_open(path, &ver->m, &d), 0, "%s: %s", path, d.msg);
	cr_assert_eq(wf_weight_view_map_files(ver->m, &ver->v, &d), 0, "%s", d.msg);
	const struct wf_engine_weights w = wf_weight_view_engine(&ver->v);
	const struct wf_engine_config cfg = config(dev);
	const int rc = wf_worker_engine_open_files(ver->m, &w, &cfg, dev != NULL, &ver->we, &d);
	cr_assert_eq(rc, 0, "%s: %s", path, wf_diag_str(&d, rc));
}

static void version_close(struct version *ver)
{
	wf_worker_engine_close(&ver->we);
	wf_weight_view_release(&ver->v);
	wf_model_close(ver->m);
}

static void versions_open(struct versions *vs, struct wf_device *dev)
{
	memset(vs, 0, sizeof(*vs));
	vs->dev = dev;
	char *pa = NULL, *pb = NULL;
	cr_assert(asprintf(&pa, "%s/qwen3moe-tiny-q8_0/qwen3moe-tiny-q8_0.gguf",
	                   wft_reference_dir()) > 0);
	size_t len = 0;
	uint8_t *bytes = (uint8_t *)wft_read_file(pa, &len);
	cr_assert_not_null(bytes, "%s", pa);
	version_open(&vs->a, pa, dev);
	/* A dense matrix, two expert stacks, a norm: what a hot-swap or a trainer changes. */
	const char *pairs[][2] = {{"blk.0.attn_q.weight", "blk.2.attn_q.weight"},
	                          {"blk.1.ffn_down_exps.weight", "blk.2.ffn_down_exps.weight"},
	                          {"blk.0.ffn_gate_exps.weight", "blk.1.ffn_gate_exps.weight"},
	                          {"blk.1.attn_norm.weight", "blk.0.attn_norm.weight"}};
	const struct wf_model *m = vs->a.m;
	for (size_t i = 0; i < 4; i++) {
		const struct wf_tensor *to = &m->tensors[tensor_index(m, pairs[i][0])],
		                       *from = &m->tensors[tensor_index(m, pairs[i][1])];
		cr_assert_eq(to->nbytes, from->nbytes);
		cr_assert_eq(to->dtype, from->dtype);
		memcpy(bytes + to->offset, bytes + from->offset, to->nbytes);
		vs->ids[vs->n_ids++] = (uint32_t)(to - m->tensors);
	}
	vs->dir = wft_tmpdir("refresh");
	cr_assert(asprintf(&pb, "%s/b.gguf", vs->dir) > 0);
	FILE *f = fopen(pb, "wb");
	cr_assert_not_null(f);
	cr_assert_eq(fwrite(bytes, 1, len, f), len);
	cr_assert_eq(fclose(f), 0);
	version_open(&vs->b, pb, dev);
	free(bytes);
	free(pa);
	free(pb);
}

static void versions_close(struct versions *vs)
{
	version_close(&vs->a);
	version_close(&vs->b);
	wft_rmtree(vs->dir);
	free(vs->dir);
}

/* The refresh to a version: its host bytes, and where its engine has store copies, those. */
static int refresh_to(struct wf_engine *e, const struct versions *vs, bool b, struct wf_diag *d)
{
	const struct version *ver = b ? &vs->b : &vs->a;
	struct wf_engine_weights w = wf_weight_view_engine(&ver->v);
	w.device = ver->we.device;
	return wf_engine_refresh(e, vs->n_ids, vs->ids, &w, d);
}

/* N_SEQ fresh sequences of N_TOK tokens in one batch (each from position 0): the logits of each
 * sequence's last token, N_SEQ rows. The logits depend on the weights only. */
static int step(struct wf_engine *e, int round, float *out, struct wf_diag *d)
{
	int32_t tok[N_SEQ * N_TOK];
	uint32_t pos[N_SEQ * N_TOK], seq[N_SEQ * N_TOK];
	bool want[N_SEQ * N_TOK];
	for (uint32_t s = 0; s < N_SEQ; s++) {
		(void)wf_engine_seq_truncate(e, s, 0);
		for (uint32_t i = 0; i < N_TOK; i++) {
			const uint32_t k = s * N_TOK + i;
			tok[k] = (int32_t)((7u + 31u * s + 13u * i + 5u * (uint32_t)round) % 1000u);
			pos[k] = i;
			seq[k] = s;
			want[k] = i == N_TOK - 1;
		}
	}
	struct wf_engine_batch b = {N_SEQ * N_TOK, tok, pos, seq, want};
	return wf_engine_decode(e, &b, out, d);
}

/* Logits of rounds 0..n_rounds-1 of a version's fresh engine. */
static float *reference(const struct version *ver, int n_rounds)
{
	const size_t V = ver->m->hp.n_vocab;
	float *out = malloc((size_t)n_rounds * N_SEQ * V * sizeof(float));
	struct wf_diag d = {{0}};
	for (int r = 0; r < n_rounds; r++)
		cr_assert_eq(step(ver->we.engine, r, out + (size_t)r * N_SEQ * V, &d), 0, "%s",
		             d.msg);
	return out;
}

static void next_step_is_a_fresh_engines(struct wf_device *dev)
{
	struct versions vs;
	versions_open(&vs, dev);
	const size_t V = vs.a.m->hp.n_vocab;
	float *want_a = reference(&vs.a, 2), *want_b = reference(&vs.b, 2);
	cr_assert(memcmp(want_a, want_b, N_SEQ * V * sizeof(float)) != 0,
	          "the two versions must give different logits");
	/* The engine under test: on A, with a store of its own. */
	struct version e;
	char *pa = NULL;
	cr_assert(asprintf(&pa, "%s/qwen3moe-tiny-q8_0/qwen3moe-tiny-q8_0.gguf",
	                   wft_reference_dir()) > 0);
	version_open(&e, pa, dev);
	free(pa);
	struct wf_diag d = {{0}};
	float *got = malloc(N_SEQ * V * sizeof(float));
	char why[160];
	cr_assert_eq(step(e.we.engine, 0, got, &d), 0, "%s", d.msg);
	cr_expect(wft_rows_match(want_a, got, N_SEQ, V, why, sizeof why), "before: %s", why);
	cr_assert_eq(refresh_to(e.we.engine, &vs, true, &d), 0, "%s", d.msg);
	cr_assert_eq(step(e.we.engine, 1, got, &d), 0, "%s", d.msg);
	cr_expect(wft_rows_match(want_b + N_SEQ * V, got, N_SEQ, V, why, sizeof why),
	          "after the refresh: %s", why);
	cr_assert_eq(refresh_to(e.we.engine, &vs, false, &d), 0, "%s", d.msg);
	cr_assert_eq(step(e.we.engine, 1, got, &d), 0, "%s", d.msg);
	cr_expect(wft_rows_match(want_a + N_SEQ * V, got, N_SEQ, V, why, sizeof why),
	          "back to the old bytes: %s", why);
	/* A changed type or size is not a refresh: refused, nothing changed. */
	struct wf_tensor *t = &e.m->tensors[vs.ids[0]];
	const uint64_t nb = t->nbytes;
	t->nbytes = nb / 2;
	d.msg[0] = 0;
	cr_expect_eq(refresh_to(e.we.engine, &vs, true, &d), WF_EFORMAT);
	cr_expect(strstr(d.msg, t->name) != NULL, "%s", d.msg);
	t->nbytes = nb;
	const uint32_t bad = e.m->n_tensors;
	const struct wf_engine_weights w = wf_weight_view_engine(&e.v);
	cr_expect_eq(wf_engine_refresh(e.we.engine, 1, &bad, &w, &d), WF_EINVAL);
	cr_assert_eq(step(e.we.engine, 1, got, &d), 0, "%s", d.msg);
	cr_expect(wft_rows_match(want_a + N_SEQ * V, got, N_SEQ, V, why, sizeof why),
	          "after refused refreshes: %s", why);
	version_close(&e);
	free(got);
	free(want_a);
	free(want_b);
	versions_close(&vs);
}

Test(engine_refresh, the_next_step_is_a_fresh_engines_on_the_new_bytes)
{
	next_step_is_a_fresh_engines(wft_engine_device());
}

/* A test again on the host device (the CPU build's model of a GPU): the GPU build runs it on its
 * device instead. */
static void on_the_host_device(const char *spec, void (*test)(struct wf_device *))
{
	if (wft_engine_device())
		cr_skip_test("the GPU build runs the test above on its device");
	struct wf_device *dev = NULL;
	struct wf_diag d = {{0}};
	cr_assert_eq(wf_device_open(spec, &dev, &d), 0, "%s", d.msg);
	test(dev);
	wf_device_close(dev);
}

Test(engine_refresh, on_the_host_device_with_the_store_and_the_cache)
{
	on_the_host_device("host:bw=4G", next_step_is_a_fresh_engines);
}

/* 1,000 refreshes, posted by another thread at the scheduler's step boundary while steps of 8
 * sequences run: every step's logits are all old or all new, and each version is decoded from
 * (the refresher posts its next flip once a step has run). In sanitizer and unoptimized builds
 * (scripts/test.sh's ASan and TSan stages, 5 to 60 times slower here) 100 of them: every
 * interleaving of a refresh and a step occurs in each one, so the race detector sees them all;
 * the Release stage runs the thousand (and at least 200 steps, 50 there). */
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__) || !defined(__OPTIMIZE__)
#define N_REFRESH  100
#define N_STEP_MIN 50
#else
#define N_REFRESH  1000
#define N_STEP_MIN 200
#endif
struct stress {
	struct versions *vs;
	struct wf_sched *sched;
	atomic_int version; /* what the engine runs from: set by the boundary work */
	atomic_bool stop;
	atomic_int refreshes;
	atomic_int steps; /* steps run so far (do_step) */
};

struct flip {
	struct stress *st;
	bool to_b;
};

static int do_flip(void *arg, struct wf_engine *e)
{
	struct flip *f = arg;
	struct wf_diag d = {{0}};
	const int rc = refresh_to(e, f->st->vs, f->to_b, &d);
	if (rc == 0)
		atomic_store(&f->st->version, f->to_b);
	return rc;
}

static void *refresher(void *arg)
{
	struct stress *st = arg;
	for (int i = 0; i < N_REFRESH && !atomic_load(&st->stop); i++) {
		struct flip f = {st, i % 2 == 0};
		if (wf_sched_between(st->sched, do_flip, &f) < 0)
			break;
		const int after = atomic_load(&st->steps);
		atomic_fetch_add(&st->refreshes, 1);
		/* The next flip once a step has run on this version, so that both versions are
		 * decoded from whatever the threads' timing (a state, not a lucky interleaving:
		 * under TSan the flips could otherwise all run before the steps). */
		while (atomic_load(&st->steps) == after && !atomic_load(&st->stop)) {
			struct timespec ts = {0, 100 * 1000};
			nanosleep(&ts, NULL);
		}
	}
	return NULL;
}

/* The steps run as boundary work too: the scheduler's step thread is the only one that touches
 * the engine, so a step and a refresh can only ever follow one another. */
struct check {
	struct stress *st;
	const float *want_a, *want_b;
	float *got;
	int round, mixed, old, new_;
	size_t V;
};

static int do_step(void *arg, struct wf_engine *e)
{
	struct check *c = arg;
	struct wf_diag d = {{0}};
	const int rc = step(e, c->round % 2, c->got, &d);
	atomic_fetch_add(&c->st->steps, 1);
	if (rc < 0)
		return rc;
	const size_t rows = N_SEQ * c->V * sizeof(float);
	const size_t off = (size_t)(c->round % 2) * N_SEQ * c->V;
	char why[160];
	if (wft_rows_match(c->want_a + off, c->got, N_SEQ, c->V, why, sizeof why))
		c->old++;
	else if (wft_rows_match(c->want_b + off, c->got, N_SEQ, c->V, why, sizeof why))
		c->new_++;
	else
		c->mixed++;
	(void)rows;
	return 0;
}

static void thousand_refreshes(struct wf_device *dev)
{
	struct versions vs;
	versions_open(&vs, dev);
	const size_t V = vs.a.m->hp.n_vocab;
	float *want_a = reference(&vs.a, 2), *want_b = reference(&vs.b, 2);
	struct version e;
	char *pa = NULL;
	cr_assert(asprintf(&pa, "%s/qwen3moe-tiny-q8_0/qwen3moe-tiny-q8_0.gguf",
	                   wft_reference_dir()) > 0);
	version_open(&e, pa, dev);
	free(pa);
	struct wf_diag d = {{0}};
	struct wf_worker_engine we = e.we;
	struct wf_tokenizer *tok = NULL;
	cr_assert_eq(wf_tokenizer_create(&e.m->kv, &tok, &d), 0, "%s", d.msg);
	struct stress st = {.vs = &vs};
	cr_assert_eq(wf_sched_create(we.engine, tok, NULL, &st.sched, &d), 0, "%s", d.msg);
	pthread_t th;
	cr_assert_eq(pthread_create(&th, NULL, refresher, &st), 0);
	struct check c = {.st = &st, .want_a = want_a, .want_b = want_b, .V = V};
	c.got = malloc(N_SEQ * V * sizeof(float));
	/* Steps until the refresher is done, and at least N_STEP_MIN. */
	for (c.round = 0; c.round < N_STEP_MIN || atomic_load(&st.refreshes) < N_REFRESH;
	     c.round++) {
		cr_assert_eq(wf_sched_between(st.sched, do_step, &c), 0);
		if (c.round > 100000)
			break;
	}
	atomic_store(&st.stop, true);
	pthread_join(th, NULL);
	cr_log_info("%s: %d steps: %d on the old bytes, %d on the new, %d mixed; %d refreshes",
	            dev ? wf_device_name(dev) : "cpu", c.round, c.old, c.new_, c.mixed,
	            atomic_load(&st.refreshes));
	cr_expect_eq(c.mixed, 0, "%d steps computed from a mix of the two versions", c.mixed);
	cr_expect_eq(atomic_load(&st.refreshes), N_REFRESH);
	cr_expect_gt(c.old, 0);
	cr_expect_gt(c.new_, 0);
	wf_sched_destroy(st.sched);
	wf_tokenizer_destroy(tok);
	(void)we;
	version_close(&e);
	free(c.got);
	free(want_a);
	free(want_b);
	versions_close(&vs);
}

Test(engine_refresh, a_thousand_refreshes_while_eight_sequences_decode)
{
	thousand_refreshes(wft_engine_device());
}

Test(engine_refresh, a_thousand_refreshes_on_the_host_device_with_the_store_and_the_cache)
{
	on_the_host_device("host", thousand_refreshes);
}
