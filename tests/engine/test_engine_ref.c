/* The forward pass (engine/engine.h) against llama.cpp's own logits for every reference model
 * (tests/data/reference, criteria of its README), plus the engine's own promises: the split model
 * bitwise equal to the single file, results independent of the thread count and of what else is
 * in the batch, and clear errors for batches and models it cannot run. */
#include "base/error.h"
#include "common/wftest.h"
#include "engine/engine.h"
#include "eweights.h"
#include "model/model.h"
#include "ondev.h"
#include "worker/weights.h"

#include <criterion/criterion.h>
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

TestSuite(engine_ref, .timeout = 120);

struct ref {
	json_object *man;
	struct wf_model *m;
	struct wf_weight_view view;
	int32_t prompt[16], gen[16];
	uint32_t n_vocab, n_layer, n_expert;
	float *want;   /* [32][n_vocab]: prompt rows then gen rows */
	float *router; /* [n_layer][16][n_expert] prompt router logits */
};

static json_object *get(json_object *o, const char *key)
{
	json_object *v = NULL;
	cr_assert(json_object_object_get_ex(o, key, &v), "manifest lacks '%s'", key);
	return v;
}

static float *read_floats(const char *dir, const char *name, size_t want_n)
{
	char *p = NULL;
	cr_assert(asprintf(&p, "%s/%s", dir, name) > 0);
	size_t len = 0;
	char *buf = wft_read_file(p, &len);
	cr_assert_not_null(buf, "cannot read %s", p);
	cr_assert_eq(len, want_n * sizeof(float), "%s: %zu bytes, want %zu", p, len,
	             want_n * sizeof(float));
	free(p);
	return (float *)buf;
}

static void ref_open(const char *name, struct ref *r)
{
	memset(r, 0, sizeof(*r));
	char *dir = NULL, *mp = NULL, *path = NULL;
	cr_assert(asprintf(&dir, "%s/%s", wft_reference_dir(), name) > 0);
	cr_assert(asprintf(&mp, "%s/manifest.json", dir) > 0);
	r->man = json_object_from_file(mp);
	cr_assert_not_null(r->man, "cannot parse %s", mp);
	cr_assert(asprintf(&path, "%s/%s", dir,
	                   json_object_get_string(get(r->man, "load_this_file"))) > 0);
	struct wf_diag d = {{0}};
	int rc = wf_model_open(path, &r->m, &d);
	cr_assert_eq(rc, 0, "%s: %s", path, wf_diag_str(&d, rc));
	rc = wf_weight_view_map_files(r->m, &r->view, &d);
	cr_assert_eq(rc, 0, "%s: %s", path, wf_diag_str(&d, rc));
	json_object *pi = get(r->man, "prompt_ids"), *gi = get(r->man, "generated_ids");
	cr_assert_eq(json_object_array_length(pi), 16);
	cr_assert_geq(json_object_array_length(gi), 16);
	for (int i = 0; i < 16; i++) {
		r->prompt[i] = json_object_get_int(json_object_array_get_idx(pi, i));
		r->gen[i] = json_object_get_int(json_object_array_get_idx(gi, i));
	}
	json_object *hp = get(r->man, "hparams");
	r->n_vocab = (uint32_t)json_object_get_int(get(hp, "n_vocab"));
	r->n_layer = r->m->hp.n_layer;
	r->n_expert = r->m->hp.n_expert;
	float *p = read_floats(dir, "prompt_logits.bin", 16u * r->n_vocab);
	float *g = read_floats(dir, "gen_logits.bin", 16u * r->n_vocab);
	r->want = malloc(32u * r->n_vocab * sizeof(float));
	memcpy(r->want, p, 16u * r->n_vocab * sizeof(float));
	memcpy(r->want + 16u * r->n_vocab, g, 16u * r->n_vocab * sizeof(float));
	free(p);
	free(g);
	r->router =
	    read_floats(dir, "router_logits_prompt.bin", (size_t)r->n_layer * 16u * r->n_expert);
	free(dir);
	free(mp);
	free(path);
}

static void ref_close(struct ref *r)
{
	wf_weight_view_release(&r->view);
	wf_model_close(r->m);
	json_object_put(r->man);
	free(r->want);
	free(r->router);
}

static struct wf_engine *engine_of(const struct ref *r, const struct wf_engine_config *cfg)
{
	struct wf_engine *e = NULL;
	struct wf_diag d = {{0}};
	const struct wf_engine_config on = wft_on_device(*cfg);
	int rc = wft_engine_new(r->m, &r->view, &on, false, &e, &d);
	cr_assert_eq(rc, 0, "engine: %s", wf_diag_str(&d, rc));
	return e;
}

/* The reference protocol: 16 prompt ids in one batch (logits for every position), then the 16
 * reference ids fed one at a time. Writes 32 rows. */
static void run_teacher_forced(struct wf_engine *e, const struct ref *r, uint32_t seq, float *out)
{
	uint32_t pos[16], sq[16];
	bool want[16];
	for (int i = 0; i < 16; i++) {
		pos[i] = (uint32_t)i;
		sq[i] = seq;
		want[i] = true;
	}
	struct wf_diag d = {{0}};
	struct wf_engine_batch b = {16, r->prompt, pos, sq, want};
	int rc = wf_engine_decode(e, &b, out, &d);
	cr_assert_eq(rc, 0, "prompt: %s", wf_diag_str(&d, rc));
	for (int i = 0; i < 16; i++) {
		uint32_t p = 16u + (uint32_t)i;
		bool w = true;
		struct wf_engine_batch one = {1, &r->gen[i], &p, &seq, &w};
		rc = wf_engine_decode(e, &one, out + (size_t)(16 + i) * r->n_vocab, &d);
		cr_assert_eq(rc, 0, "step %d: %s", i, wf_diag_str(&d, rc));
	}
}

/* The README's criteria: strict (max-abs <= 0.02) for the F32 model; otherwise at most 2
 * positions above 0.5, none above 1.5, RMS <= 0.1; the argmax equal wherever the reference's
 * top-1/top-2 gap exceeds 0.5. */
static void check_criteria(const struct ref *r, const float *got, bool strict, float *ret_max,
                           float *ret_rms)
{
	for (size_t i = 0; i < 32u * r->n_vocab; i++)
		cr_assert(isfinite(got[i]), "row %zu: non-finite logit", i / r->n_vocab);
	const struct wft_criteria c = wft_measure(r->want, got, 32, r->n_vocab);
	if (strict) {
		cr_expect_leq(c.max_abs, 0.02f, "max-abs %.4f > 0.02", c.max_abs);
	} else {
		cr_expect_leq(c.rows_over, 2, "%zu positions > 0.5", c.rows_over);
		cr_expect_leq(c.max_abs, 1.5f, "max-abs %.3f > 1.5", c.max_abs);
		cr_expect_leq(c.rms, 0.1, "rms %.3f > 0.1", c.rms);
	}
	cr_expect_eq(c.argmax_bad, 0, "argmax differs at %zu confident positions", c.argmax_bad);
	*ret_max = c.max_abs;
	*ret_rms = (float)c.rms;
}

struct router_capture {
	const struct ref *r;
	float max_abs;
	uint32_t layers_seen;
};

static void capture_router(void *arg, uint32_t layer, uint32_t n, const float *logits)
{
	struct router_capture *c = arg;
	if (n != 16)
		return; /* the prompt batch only */
	const uint32_t X = c->r->n_expert;
	for (uint32_t t = 0; t < 16; t++)
		for (uint32_t x = 0; x < X; x++) {
			const float want = c->r->router[((size_t)layer * 16 + t) * X + x];
			const float dd = fabsf(want - logits[(size_t)t * X + x]);
			c->max_abs = dd > c->max_abs ? dd : c->max_abs;
		}
	c->layers_seen++;
}

static void check_model(const char *name, bool strict, float router_tol)
{
	struct ref r;
	ref_open(name, &r);
	struct wf_engine_config cfg = {.n_ctx = 64, .n_threads = 2};
	struct wf_engine *e = engine_of(&r, &cfg);
	struct router_capture cap = {&r, 0, 0};
	wf_engine_set_router_hook(e, capture_router, &cap);
	float *got = malloc(32u * r.n_vocab * sizeof(float));
	run_teacher_forced(e, &r, 0, got);
	float mx, rms;
	check_criteria(&r, got, strict, &mx, &rms);
	cr_log_info("%s: max-abs %.4f rms %.4f router max-abs %.4f", name, mx, rms, cap.max_abs);
	cr_expect_eq(cap.layers_seen, r.n_layer);
	cr_expect_leq(cap.max_abs, router_tol, "router logits differ by %.4f", cap.max_abs);
	if (strict) {
		/* Free-running greedy decoding gives the reference ids (the F32 model's smallest
		 * top-1/top-2 gap is 0.088, far above the engine's difference). */
		wf_engine_seq_truncate(e, 0, 16);
		int32_t tok = (int32_t)wft_argmax(got + 15u * r.n_vocab, r.n_vocab);
		for (uint32_t i = 0; i < 16; i++) {
			cr_expect_eq(tok, r.gen[i], "greedy id %u: %d, llama.cpp %d", i, tok,
			             r.gen[i]);
			uint32_t p = 16 + i, s = 0;
			bool w = true;
			struct wf_diag d = {{0}};
			struct wf_engine_batch one = {1, &tok, &p, &s, &w};
			cr_assert_eq(wf_engine_decode(e, &one, got, &d), 0);
			tok = (int32_t)wft_argmax(got, r.n_vocab);
		}
	}
	free(got);
	wft_engine_free(e);
	ref_close(&r);
}

Test(engine_ref, mixtral_f32_strict)
{
	check_model("mixtral-tiny-f32", true, 1e-3f);
}

/* Router tolerance for quantized models: the router is F32 but its input carries the activation
 * quantization noise of the layers before it (README: 0.03-0.09 between llama.cpp kernels). */
Test(engine_ref, qwen3moe_q8_0)
{
	check_model("qwen3moe-tiny-q8_0", false, 0.25f);
}

Test(engine_ref, qwen3moe_q4_0)
{
	check_model("qwen3moe-tiny-q4_0", false, 0.25f);
}

Test(engine_ref, qwen3moe_q4_k_m)
{
	check_model("qwen3moe-tiny-q4_k_m", false, 0.25f);
}

Test(engine_ref, split_model_bitwise_equal_to_single_file)
{
	struct ref a, b;
	ref_open("qwen3moe-tiny-q4_k_m", &a);
	ref_open("qwen3moe-tiny-q4_k_m-split", &b);
	cr_assert_gt(b.m->n_files, 1, "the split model should have several shards");
	struct wf_engine_config cfg = {.n_ctx = 64, .n_threads = 2};
	struct wf_engine *ea = engine_of(&a, &cfg), *eb = engine_of(&b, &cfg);
	float *ga = malloc(32u * a.n_vocab * sizeof(float)),
	      *gb = malloc(32u * b.n_vocab * sizeof(float));
	run_teacher_forced(ea, &a, 0, ga);
	run_teacher_forced(eb, &b, 0, gb);
	char why[160];
	cr_expect(wft_rows_match(ga, gb, 32u, a.n_vocab, why, sizeof why),
	          "split model logits differ from the single file: %s", why);
	free(ga);
	free(gb);
	wft_engine_free(ea);
	wft_engine_free(eb);
	ref_close(&a);
	ref_close(&b);
}

Test(engine_ref, f32_kv_cache_within_strict_tolerance)
{
	struct ref r;
	ref_open("mixtral-tiny-f32", &r);
	struct wf_engine_config cfg = {.n_ctx = 64, .n_threads = 2, .kv_type = WF_ENGINE_KV_F32};
	struct wf_engine *e = engine_of(&r, &cfg);
	float *got = malloc(32u * r.n_vocab * sizeof(float));
	run_teacher_forced(e, &r, 0, got);
	float mx, rms;
	check_criteria(&r, got, true, &mx, &rms);
	free(got);
	wft_engine_free(e);
	ref_close(&r);
}

/* One thread or three: every row is computed by one thread in a fixed order, so bitwise equal. */
Test(engine_ref, thread_count_does_not_change_results)
{
	struct ref r;
	ref_open("qwen3moe-tiny-q4_k_m", &r);
	struct wf_engine_config c1 = {.n_ctx = 64, .n_threads = 1},
	                        c3 = {.n_ctx = 64, .n_threads = 3};
	struct wf_engine *e1 = engine_of(&r, &c1), *e3 = engine_of(&r, &c3);
	float *g1 = malloc(32u * r.n_vocab * sizeof(float)),
	      *g3 = malloc(32u * r.n_vocab * sizeof(float));
	run_teacher_forced(e1, &r, 0, g1);
	run_teacher_forced(e3, &r, 0, g3);
	char why[160];
	cr_expect(wft_rows_match(g1, g3, 32u, r.n_vocab, why, sizeof why), "%s", why);
	free(g1);
	free(g3);
	wft_engine_free(e1);
	wft_engine_free(e3);
	ref_close(&r);
}

/* Three sequences decoded together (their prompts in one batch, then one token each per step)
 * give each sequence bitwise the logits it gets alone. */
Test(engine_ref, batched_sequences_equal_alone)
{
	struct ref r;
	ref_open("qwen3moe-tiny-q4_k_m", &r);
	const uint32_t V = r.n_vocab;
	struct wf_engine_config cfg = {.n_ctx = 64, .n_seq_max = 4, .n_threads = 2};
	struct wf_engine *alone = engine_of(&r, &cfg), *batch = engine_of(&r, &cfg);
	char why[160];
	/* Prompts: the reference prompt's first 16, 11 and 7 ids, offset so they differ. */
	const uint32_t plen[3] = {16, 11, 7};
	int32_t toks[34];
	uint32_t pos[34], seq[34];
	bool want[34];
	uint32_t n = 0;
	for (uint32_t s = 0; s < 3; s++)
		for (uint32_t i = 0; i < plen[s]; i++) {
			toks[n] = (r.prompt[i] + (int32_t)(s * 37)) % (int32_t)V;
			pos[n] = i;
			seq[n] = s + 1; /* sequence 0 stays unused: slots need not be dense */
			want[n] = i == plen[s] - 1;
			n++;
		}
	float *bl = malloc(3u * V * sizeof(float)), *al = malloc(V * sizeof(float));
	struct wf_diag d = {{0}};
	struct wf_engine_batch b = {n, toks, pos, seq, want};
	cr_assert_eq(wf_engine_decode(batch, &b, bl, &d), 0, "%s", wf_diag_str(&d, -1));
	/* The same prompts alone, each in its own sequence of the other engine. */
	uint32_t off = 0;
	int32_t next[3];
	for (uint32_t s = 0; s < 3; s++) {
		struct wf_engine_batch one = {plen[s], toks + off, pos + off, seq + off, NULL};
		cr_assert_eq(wf_engine_decode(alone, &one, al, &d), 0);
		cr_expect(wft_rows_match(al, bl + (size_t)s * V, 1, V, why, sizeof why),
		          "sequence %u's prompt logits differ in a batch: %s", s + 1, why);
		next[s] = (int32_t)wft_argmax(al, V);
		off += plen[s];
	}
	/* Five decode steps: all three in one batch vs one at a time. */
	for (int step = 0; step < 5; step++) {
		int32_t bt[3];
		uint32_t bp[3], bs[3];
		bool bw[3] = {true, true, true};
		for (uint32_t s = 0; s < 3; s++) {
			bt[s] = next[s];
			bp[s] = plen[s] + (uint32_t)step;
			bs[s] = s + 1;
		}
		struct wf_engine_batch bb = {3, bt, bp, bs, bw};
		cr_assert_eq(wf_engine_decode(batch, &bb, bl, &d), 0);
		for (uint32_t s = 0; s < 3; s++) {
			struct wf_engine_batch one = {1, &bt[s], &bp[s], &bs[s], &bw[s]};
			cr_assert_eq(wf_engine_decode(alone, &one, al, &d), 0);
			cr_expect(wft_rows_match(al, bl + (size_t)s * V, 1, V, why, sizeof why),
			          "step %d: sequence %u differs in a batch: %s", step, s + 1, why);
			next[s] = (int32_t)wft_argmax(al, V);
		}
	}
	free(bl);
	free(al);
	wft_engine_free(alone);
	wft_engine_free(batch);
	ref_close(&r);
}

Test(engine_ref, bad_batches_are_refused_and_change_nothing)
{
	struct ref r;
	ref_open("mixtral-tiny-f32", &r);
	struct wf_engine_config cfg = {.n_ctx = 8, .n_seq_max = 2, .n_threads = 2};
	struct wf_engine *e = engine_of(&r, &cfg);
	float *out = malloc(16u * r.n_vocab * sizeof(float));
	struct wf_diag d = {{0}};
	uint32_t pos[16], seq[16] = {0};
	for (uint32_t i = 0; i < 16; i++)
		pos[i] = i;
	/* Longer than the context. */
	struct wf_engine_batch b = {9, r.prompt, pos, seq, NULL};
	cr_expect_eq(wf_engine_decode(e, &b, out, &d), WF_ELIMIT);
	cr_expect(strstr(d.msg, "context length of 8") != NULL, "%s", d.msg);
	cr_expect_eq(wf_engine_seq_len(e, 0), 0);
	/* A token outside the vocabulary. */
	int32_t bad_tok[2] = {1, (int32_t)r.n_vocab};
	struct wf_engine_batch bt = {2, bad_tok, pos, seq, NULL};
	cr_expect_eq(wf_engine_decode(e, &bt, out, &d), WF_EINVAL);
	/* A gap in positions; a sequence out of range. */
	uint32_t gap[2] = {0, 2}, far[1] = {5};
	struct wf_engine_batch bg = {2, r.prompt, gap, seq, NULL};
	cr_expect_eq(wf_engine_decode(e, &bg, out, &d), WF_EINVAL);
	struct wf_engine_batch bs = {1, r.prompt, pos, far, NULL};
	cr_expect_eq(wf_engine_decode(e, &bs, out, &d), WF_EINVAL);
	cr_expect_eq(wf_engine_seq_len(e, 0), 0);
	/* The engine still works: 8 tokens fit exactly, the ninth does not. */
	struct wf_engine_batch ok = {8, r.prompt, pos, seq, NULL};
	cr_expect_eq(wf_engine_decode(e, &ok, out, &d), 0, "%s", d.msg);
	cr_expect_eq(wf_engine_seq_len(e, 0), 8);
	uint32_t p8 = 8;
	struct wf_engine_batch ninth = {1, r.prompt, &p8, seq, NULL};
	cr_expect_eq(wf_engine_decode(e, &ninth, out, &d), WF_ELIMIT);
	cr_expect_eq(wf_engine_seq_truncate(e, 0, 0), 0);
	cr_expect_eq(wf_engine_seq_len(e, 0), 0);
	cr_expect_eq(wf_engine_seq_truncate(e, 2, 0), WF_EINVAL);
	free(out);
	wft_engine_free(e);
	ref_close(&r);
}

static int create_rc(struct wf_model *m, const struct wf_weight_view *v, struct wf_diag *d)
{
	struct wf_engine *e = NULL;
	struct wf_engine_config cfg = {.n_ctx = 16, .n_threads = 1};
	const struct wf_engine_weights w = wf_weight_view_engine(v);
	int rc = wf_engine_create(m, &w, &cfg, &e, d);
	wf_engine_destroy(e);
	return rc;
}

Test(engine_ref, models_the_engine_cannot_run_are_refused)
{
	struct ref r;
	ref_open("qwen3moe-tiny-q8_0", &r);
	struct wf_diag d = {{0}};
	/* An unsupported architecture. */
	char arch[64];
	memcpy(arch, r.m->hp.arch, sizeof(arch));
	snprintf(r.m->hp.arch, sizeof(r.m->hp.arch), "gpt2");
	cr_expect_eq(create_rc(r.m, &r.view, &d), WF_EUNSUPPORTED);
	cr_expect(strstr(d.msg, "gpt2") != NULL, "%s", d.msg);
	memcpy(r.m->hp.arch, arch, sizeof(arch));
	/* A tensor of the wrong shape. */
	struct wf_tensor *t = (struct wf_tensor *)wf_model_find_tensor(r.m, "blk.1.attn_k.weight");
	cr_assert_not_null(t);
	int64_t ne1 = t->ne[1];
	t->ne[1] = ne1 / 2;
	cr_expect_eq(create_rc(r.m, &r.view, &d), WF_EFORMAT);
	cr_expect(strstr(d.msg, "blk.1.attn_k.weight") != NULL, "%s", d.msg);
	t->ne[1] = ne1;
	/* A weight type without kernels. */
	enum wf_dtype dt = t->dtype;
	t->dtype = WF_DTYPE_IQ2_XXS;
	cr_expect_eq(create_rc(r.m, &r.view, &d), WF_EUNSUPPORTED);
	cr_expect(strstr(d.msg, "IQ2_XXS") != NULL, "%s", d.msg);
	t->dtype = dt;
	/* A missing tensor (its name changed to one the architecture does not know). */
	char *name = t->name;
	t->name = (char *)"blk.1.attn_k.bias";
	cr_expect_lt(create_rc(r.m, &r.view, &d), 0);
	t->name = name;
	/* A context longer than the model's. */
	struct wf_engine *e = NULL;
	struct wf_engine_config big = {.n_ctx = r.m->hp.n_ctx_train + 1, .n_threads = 1};
	const struct wf_engine_weights w = wf_weight_view_engine(&r.view);
	cr_expect_eq(wf_engine_create(r.m, &w, &big, &e, &d), WF_ELIMIT);
	cr_expect_null(e);
	/* And the untouched model still runs. */
	cr_expect_eq(create_rc(r.m, &r.view, &d), 0, "%s", d.msg);
	ref_close(&r);
}
