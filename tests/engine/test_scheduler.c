/* The continuous-batching scheduler (engine/scheduler.h) on the strict F32 reference model
 * (tests/data/reference/mixtral-tiny-f32): llama.cpp's greedy ids, batched decode equal to
 * decoding alone, queueing beyond the engine's sequences, cancellation, stop strings, a full
 * context, and refused requests. */
#include "base/error.h"
#include "common/wftest.h"
#include "engine/engine.h"
#include "engine/scheduler.h"
#include "engine/tokenizer.h"
#include "model/model.h"
#include "worker/weights.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <json-c/json.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

TestSuite(scheduler, .timeout = 120);

struct fixture {
	struct wf_model *m;
	struct wf_weight_view view;
	struct wf_engine *e;
	struct wf_tokenizer *tok;
	struct wf_sched *s;
	int32_t prompt[64];
	size_t n_prompt;
	int32_t ref[64];
	size_t n_ref;
};

static void load_ids(json_object *man, const char *key, int32_t *out, size_t *n)
{
	json_object *a = NULL;
	cr_assert(json_object_object_get_ex(man, key, &a), "manifest lacks %s", key);
	*n = json_object_array_length(a);
	cr_assert_leq(*n, 64);
	for (size_t i = 0; i < *n; i++)
		out[i] = json_object_get_int(json_object_array_get_idx(a, i));
}

static void setup(struct fixture *f, uint32_t n_seq, uint32_t n_ctx, uint32_t n_batch)
{
	memset(f, 0, sizeof(*f));
	char *dir = NULL, *mp = NULL, *gguf = NULL;
	cr_assert(asprintf(&dir, "%s/mixtral-tiny-f32", wft_reference_dir()) > 0);
	cr_assert(asprintf(&mp, "%s/manifest.json", dir) > 0);
	json_object *man = json_object_from_file(mp);
	cr_assert_not_null(man, "cannot parse %s", mp);
	load_ids(man, "prompt_ids", f->prompt, &f->n_prompt);
	load_ids(man, "generated_ids", f->ref, &f->n_ref);
	json_object *lf = NULL;
	cr_assert(json_object_object_get_ex(man, "load_this_file", &lf));
	cr_assert(asprintf(&gguf, "%s/%s", dir, json_object_get_string(lf)) > 0);
	struct wf_diag d = {{0}};
	int rc = wf_model_open(gguf, &f->m, &d);
	cr_assert_eq(rc, 0, "%s: %s", gguf, wf_diag_str(&d, rc));
	rc = wf_weight_view_map_files(f->m, &f->view, &d);
	cr_assert_eq(rc, 0, "%s", wf_diag_str(&d, rc));
	/* F32 KV: the strict model's criteria are for exact arithmetic. */
	struct wf_engine_config ec = {
	    .n_ctx = n_ctx, .n_seq_max = n_seq, .n_threads = 2, .kv_type = WF_ENGINE_KV_F32};
	const struct wf_engine_weights w = wf_weight_view_engine(&f->view);
	rc = wf_engine_create(f->m, &w, &ec, &f->e, &d);
	cr_assert_eq(rc, 0, "engine: %s", wf_diag_str(&d, rc));
	rc = wf_tokenizer_create(&f->m->kv, &f->tok, &d);
	cr_assert_eq(rc, 0, "tokenizer: %s", wf_diag_str(&d, rc));
	struct wf_sched_config sc = {.n_batch = n_batch};
	rc = wf_sched_create(f->e, f->tok, &sc, &f->s, &d);
	cr_assert_eq(rc, 0, "scheduler: %s", wf_diag_str(&d, rc));
	json_object_put(man);
	free(dir);
	free(mp);
	free(gguf);
}

static void teardown(struct fixture *f)
{
	wf_sched_destroy(f->s);
	wf_tokenizer_destroy(f->tok);
	wf_engine_destroy(f->e);
	wf_weight_view_release(&f->view);
	wf_model_close(f->m);
}

/* One request's outcome, filled by the callbacks on the step thread. */
struct out {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int32_t ids[512];
	size_t n;
	char text[8192];
	size_t text_len;
	bool done;
	struct wf_sched_result res;
	bool cancel_on_first; /* cancel from the first token's callback */
	struct wf_sched *s;
	uint64_t id;
};

static void out_init(struct out *o)
{
	memset(o, 0, sizeof(*o));
	pthread_mutex_init(&o->mu, NULL);
	pthread_cond_init(&o->cv, NULL);
}

static void on_tok(void *arg, int32_t t, const char *text, size_t len)
{
	struct out *o = arg;
	pthread_mutex_lock(&o->mu);
	if (t != WF_TOKEN_NULL && o->n < 512)
		o->ids[o->n++] = t;
	if (o->text_len + len < sizeof o->text) {
		memcpy(o->text + o->text_len, text, len);
		o->text_len += len;
	}
	bool cancel = o->cancel_on_first && o->n == 1;
	pthread_mutex_unlock(&o->mu);
	if (cancel) /* not cr_assert: this is the step thread */
		(void)wf_sched_cancel(o->s, o->id);
}

static void on_done(void *arg, const struct wf_sched_result *r)
{
	struct out *o = arg;
	pthread_mutex_lock(&o->mu);
	o->res = *r;
	o->done = true;
	pthread_cond_broadcast(&o->cv);
	pthread_mutex_unlock(&o->mu);
}

static void wait_done(struct out *o)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += 60;
	pthread_mutex_lock(&o->mu);
	while (!o->done)
		cr_assert_neq(pthread_cond_timedwait(&o->cv, &o->mu, &ts), ETIMEDOUT,
		              "request did not finish in 60 s");
	pthread_mutex_unlock(&o->mu);
}

static uint64_t submit(struct fixture *f, struct out *o, const int32_t *p, size_t n,
                       uint32_t max_tokens, const char *const *stop, size_t n_stop)
{
	struct wf_sched_request q = {.tokens = p,
	                             .n_tokens = n,
	                             .max_tokens = max_tokens,
	                             .stop = stop,
	                             .n_stop = n_stop,
	                             .on_token = on_tok,
	                             .on_done = on_done,
	                             .arg = o};
	wf_sampler_params_default(&q.sampling);
	struct wf_diag d = {{0}};
	o->s = f->s;
	/* The id is written before any callback can want it: callbacks lock o->mu. */
	pthread_mutex_lock(&o->mu);
	int rc = wf_sched_submit(f->s, &q, &o->id, &d);
	pthread_mutex_unlock(&o->mu);
	cr_assert_eq(rc, 0, "submit: %s", wf_diag_str(&d, rc));
	return o->id;
}

Test(scheduler, greedy_ids_equal_llama_cpp)
{
	struct fixture f;
	setup(&f, 1, 0, 0);
	struct out o;
	out_init(&o);
	submit(&f, &o, f.prompt, f.n_prompt, (uint32_t)f.n_ref, NULL, 0);
	wait_done(&o);
	cr_assert_eq(o.res.reason, WF_SCHED_FINISH_LENGTH, "finish %s: %s",
	             wf_sched_finish_name(o.res.reason), o.res.message);
	cr_assert_eq(o.n, f.n_ref);
	for (size_t i = 0; i < f.n_ref; i++)
		cr_assert_eq(o.ids[i], f.ref[i], "token %zu: %d, llama.cpp %d", i, o.ids[i],
		             f.ref[i]);
	cr_assert_eq(o.res.n_prompt, f.n_prompt);
	cr_assert_eq(o.res.n_gen, f.n_ref);
	cr_assert_gt(o.res.first_token_s, 0.0);
	teardown(&f);
}

/* Eight different prompts (rotations of the reference prompt, of several lengths) on an engine
 * with three sequences and a batch of 8 tokens: queueing, chunked prompts and mixed
 * prompt/decode batches. Each must give the tokens it gives alone. */
Test(scheduler, batched_equals_alone_with_queueing)
{
	enum { N = 8, GEN = 12 };
	struct fixture f;
	setup(&f, 3, 0, 8);
	int32_t p[N][64];
	size_t plen[N];
	for (int k = 0; k < N; k++) {
		plen[k] = 3 + (size_t)k * 2 <= f.n_prompt ? 3 + (size_t)k * 2 : f.n_prompt;
		for (size_t i = 0; i < plen[k]; i++)
			p[k][i] = f.prompt[(i + (size_t)k) % f.n_prompt];
	}
	static struct out alone[N], together[N];
	for (int k = 0; k < N; k++) {
		out_init(&alone[k]);
		submit(&f, &alone[k], p[k], plen[k], GEN, NULL, 0);
		wait_done(&alone[k]);
		cr_assert_eq(alone[k].n, GEN);
	}
	for (int k = 0; k < N; k++) {
		out_init(&together[k]);
		submit(&f, &together[k], p[k], plen[k], GEN, NULL, 0);
	}
	struct wf_sched_stats st;
	wf_sched_get_stats(f.s, &st);
	cr_assert_leq(st.running, 3);
	for (int k = 0; k < N; k++) {
		wait_done(&together[k]);
		cr_assert_eq(together[k].res.reason, WF_SCHED_FINISH_LENGTH);
		cr_assert_eq(together[k].n, GEN);
		for (int i = 0; i < GEN; i++)
			cr_assert_eq(together[k].ids[i], alone[k].ids[i],
			             "request %d token %d: %d batched, %d alone", k, i,
			             together[k].ids[i], alone[k].ids[i]);
	}
	/* At most 3 ran at once, so some waited. */
	int queued = 0;
	for (int k = 0; k < N; k++)
		queued += together[k].res.queue_s > 0.0005;
	cr_assert_gt(queued, 0);
	teardown(&f);
}

Test(scheduler, cancel_ends_a_running_and_a_queued_request)
{
	struct fixture f;
	setup(&f, 1, 0, 0);
	struct out run, wait;
	out_init(&run);
	out_init(&wait);
	run.cancel_on_first = true;
	submit(&f, &run, f.prompt, f.n_prompt, 0, NULL, 0);
	uint64_t wid = submit(&f, &wait, f.prompt, 4, 0, NULL, 0);
	/* The second waits for the only sequence, or has it by now: either way it ends. */
	cr_assert_eq(wf_sched_cancel(f.s, wid), 0);
	wait_done(&run);
	wait_done(&wait);
	cr_assert_eq(run.res.reason, WF_SCHED_FINISH_CANCELED);
	cr_assert_lt(run.n, 4, "canceled after %zu tokens", run.n);
	cr_assert_eq(wait.res.reason, WF_SCHED_FINISH_CANCELED);
	cr_assert_eq(wf_sched_cancel(f.s, wid), WF_ENOT_FOUND);
	/* The sequence is free again: a new request runs to its end. */
	struct out again;
	out_init(&again);
	submit(&f, &again, f.prompt, f.n_prompt, (uint32_t)f.n_ref, NULL, 0);
	wait_done(&again);
	cr_assert_eq(again.n, f.n_ref);
	for (size_t i = 0; i < f.n_ref; i++)
		cr_assert_eq(again.ids[i], f.ref[i]);
	teardown(&f);
}

/* n_ctx 24 and a prompt of 16: positions 16..23 take 8 fed tokens, and the 9th sampled token has
 * no position left. */
Test(scheduler, full_context_ends_with_a_reason)
{
	struct fixture f;
	setup(&f, 1, 24, 0);
	struct out o;
	out_init(&o);
	submit(&f, &o, f.prompt, f.n_prompt, 0, NULL, 0);
	wait_done(&o);
	cr_assert_eq(o.res.reason, WF_SCHED_FINISH_CONTEXT, "finish %s",
	             wf_sched_finish_name(o.res.reason));
	cr_assert_eq(o.res.error, WF_ELIMIT);
	cr_assert(strstr(o.res.message, "24"), "%s", o.res.message);
	cr_assert_eq(o.n, 24 - f.n_prompt + 1);
	teardown(&f);
}

/* The stop string spans two tokens' pieces: the text before it comes out, it and the rest do
 * not, and nothing of it leaked out earlier. */
Test(scheduler, stop_string_across_tokens)
{
	struct fixture f;
	setup(&f, 1, 0, 0);
	char text[4096] = "";
	size_t len = 0, cut = 0, k;
	for (k = 0; k < f.n_ref; k++) {
		char piece[256];
		int64_t n = wf_tokenizer_piece(f.tok, f.ref[k], false, 0, piece, sizeof piece);
		cr_assert(n >= 0 && n < 256);
		if (k >= 3 && len > 0 && n > 0) {
			cut = len - 1; /* the last byte of the text so far + this piece's first */
			memcpy(text + len, piece, (size_t)n);
			len += (size_t)n;
			break;
		}
		memcpy(text + len, piece, (size_t)n);
		len += (size_t)n;
	}
	cr_assert_lt(k, f.n_ref, "no two non-empty pieces to span");
	char stop[3] = {text[cut], text[cut + 1], 0};
	/* The stop must not occur earlier in the text, or the cut would be elsewhere. */
	char *first = NULL;
	for (size_t i = 0; i + 1 < len && !first; i++)
		if (text[i] == stop[0] && text[i + 1] == stop[1])
			first = text + i;
	size_t want = (size_t)(first - text);
	const char *stops[] = {"never-in-the-output", stop};
	struct out o;
	out_init(&o);
	submit(&f, &o, f.prompt, f.n_prompt, 0, stops, 2);
	wait_done(&o);
	cr_assert_eq(o.res.reason, WF_SCHED_FINISH_STOP, "finish %s",
	             wf_sched_finish_name(o.res.reason));
	cr_assert_eq(o.text_len, want, "emitted %zu bytes, want %zu", o.text_len, want);
	cr_assert(memcmp(o.text, text, want) == 0);
	teardown(&f);
}

Test(scheduler, bad_requests_refused_before_any_callback)
{
	struct fixture f;
	setup(&f, 1, 32, 0);
	struct out o;
	out_init(&o);
	struct wf_sched_request q = {
	    .tokens = f.prompt, .n_tokens = 0, .on_done = on_done, .arg = &o};
	wf_sampler_params_default(&q.sampling);
	struct wf_diag d = {{0}};
	uint64_t id;
	wf_diag_clear(&d);
	cr_assert_eq(wf_sched_submit(f.s, &q, &id, &d), WF_EINVAL);
	cr_assert(strstr(d.msg, "empty"), "%s", d.msg);
	int32_t longp[33];
	for (int i = 0; i < 33; i++)
		longp[i] = f.prompt[i % f.n_prompt];
	q.tokens = longp;
	q.n_tokens = 33;
	wf_diag_clear(&d);
	cr_assert_eq(wf_sched_submit(f.s, &q, &id, &d), WF_ELIMIT);
	cr_assert(strstr(d.msg, "context"), "%s", d.msg);
	int32_t bad[2] = {1, 512};
	q.tokens = bad;
	q.n_tokens = 2;
	wf_diag_clear(&d);
	cr_assert_eq(wf_sched_submit(f.s, &q, &id, &d), WF_EINVAL);
	q.tokens = f.prompt;
	q.n_tokens = 4;
	q.sampling.top_p = -1.0f;
	wf_diag_clear(&d);
	cr_assert_eq(wf_sched_submit(f.s, &q, &id, &d), WF_EINVAL);
	cr_assert(strstr(d.msg, "top_p"), "%s", d.msg);
	wf_sampler_params_default(&q.sampling);
	const char *stops[] = {""};
	q.stop = stops;
	q.n_stop = 1;
	wf_diag_clear(&d);
	cr_assert_eq(wf_sched_submit(f.s, &q, &id, &d), WF_EINVAL);
	cr_assert_not(o.done);
	teardown(&f);
}

/* Closing ends what runs and what waits with CANCELED; later submits are refused. */
Test(scheduler, close_cancels_everything)
{
	struct fixture f;
	setup(&f, 1, 0, 0);
	struct out a, b;
	out_init(&a);
	out_init(&b);
	submit(&f, &a, f.prompt, f.n_prompt, 0, NULL, 0);
	submit(&f, &b, f.prompt, f.n_prompt, 0, NULL, 0);
	wf_sched_close(f.s);
	wait_done(&a);
	wait_done(&b);
	cr_assert(a.res.reason == WF_SCHED_FINISH_CANCELED || a.res.reason == WF_SCHED_FINISH_EOS ||
	          a.res.reason == WF_SCHED_FINISH_CONTEXT);
	cr_assert_eq(b.res.reason, WF_SCHED_FINISH_CANCELED);
	struct out c;
	out_init(&c);
	struct wf_sched_request q = {
	    .tokens = f.prompt, .n_tokens = 4, .on_done = on_done, .arg = &c};
	wf_sampler_params_default(&q.sampling);
	uint64_t id;
	struct wf_diag d = {{0}};
	cr_assert_eq(wf_sched_submit(f.s, &q, &id, &d), WF_ECANCELED);
	teardown(&f);
}
