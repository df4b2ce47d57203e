/* The Perplexity request on a worker: see worker/evaluate.h. */
#include "worker/evaluate.h"

#include "base/error.h"
#include "base/log.h"
#include "worker/completion.h"
#include "worker/ppljob.h"
#include "worker/refresh.h"
#include "worker/service.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* How long a Perplexity waits for this worker to apply a generation it names. */
#define GENERATION_WAIT_MS 30000

struct evaluate {
	struct wf_worker_svc *svc;
	struct wf_completions *cs;
	_Atomic(struct wf_worker_refresh *) refresh; /* set once the ear exists */
};

static struct evaluate ev_one; /* one per process: the service outlives every request */

static int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Waits until this worker has applied generation gen of floor hex for model (its refresh table
 * records a generation once the refresh has run), within the request's time. */
static int wait_generation(const struct evaluate *ev, const char *model, const char *hex,
                           uint64_t gen, struct wf_ctl_call *call, struct wf_diag *d)
{
	struct wf_digest want;
	if (wf_digest_parse(hex, &want) < 0)
		return wf_diag_set(d, WF_EINVAL,
		                   "perplexity: floor_digest '%s' is not 32 hex digits", hex);
	struct wf_worker_refresh *refresh = atomic_load(&ev->refresh);
	if (!refresh)
		return wf_diag_set(
		    d, WF_EUNAVAILABLE,
		    "perplexity: this worker does not hear the agent's events, so it "
		    "cannot wait for generation %llu",
		    (unsigned long long)gen);
	int left = wf_ctl_call_time_left_ms(call, GENERATION_WAIT_MS);
	const int64_t end = now_ms() + (left > 0 ? left : 0);
	for (;;) {
		struct wf_digest dg;
		uint64_t g = 0;
		if (wf_worker_refresh_generation(refresh, model, &dg, &g) && dg.hi == want.hi &&
		    dg.lo == want.lo && g >= gen)
			return 0;
		if (now_ms() >= end)
			return wf_diag_set(
			    d, WF_EUNAVAILABLE,
			    "model '%s': this worker has not applied generation %llu of "
			    "floor %.12s (last applied: %llu)",
			    model, (unsigned long long)gen, hex, (unsigned long long)g);
		struct timespec ts = {0, 10 * 1000 * 1000};
		nanosleep(&ts, NULL);
	}
}

struct ppl_run {
	const Weightfloor__V1__Perplexity *req;
	struct wf_ppl_job job;
	double *chunk_ppl; /* from the call's arena: n_chunks_planned entries */
	uint32_t n_chunk_ppl;
	struct wf_ctl_call *call;
	struct wf_diag *diag;
};

static int on_chunk(void *arg, const struct wf_ppl_progress *p)
{
	struct ppl_run *r = arg;
	if (!r->chunk_ppl && p->n_chunks) {
		r->chunk_ppl = wf_ctl_call_calloc(r->call, p->n_chunks, sizeof(double));
		r->n_chunk_ppl = r->chunk_ppl ? p->n_chunks : 0;
	}
	if (p->chunk <= r->n_chunk_ppl)
		r->chunk_ppl[p->chunk - 1] = p->ppl;
	return 0;
}

static int run(void *arg, struct wf_engine *engine, const struct wf_tokenizer *tok, uint32_t seq)
{
	struct ppl_run *r = arg;
	r->job.seq = seq;
	return wf_ppl_job_run(engine, tok, &r->job, r->diag);
}

static void fill_reply(const struct evaluate *ev, struct ppl_run *r,
                       Weightfloor__V1__PerplexityReply *pr)
{
	const struct wf_ppl_result *res = &r->job.result;
	pr->model = r->req->model;
	pr->worker_id = (char *)ev->svc->worker_id;
	pr->n_ctx = r->job.n_ctx_used;
	pr->chunks = res->n_chunks;
	pr->tokens_scored = res->n_scored;
	pr->ppl = res->ppl;
	pr->ppl_error = res->has_err ? res->ppl_err : 0;
	pr->chunk_ppl = r->chunk_ppl;
	pr->n_chunk_ppl =
	    r->chunk_ppl ? (res->n_chunks < r->n_chunk_ppl ? res->n_chunks : r->n_chunk_ppl) : 0;
	pr->seconds = res->seconds;
	if (!r->job.kl_base)
		return;
	const struct wf_ppl_kld *k = &r->job.kld;
	pr->kl = true;
	pr->ppl_base = k->ppl_base.val;
	pr->ppl_base_error = k->ppl_base.err;
	pr->kld = k->kld.val;
	pr->kld_error = k->kld.err;
	/* WF_PPL_KLD_QUANTILES: 1, 0.999, 0.99, 0.95, 0.9, 0.5, ... */
	pr->kld_p999 = k->kld_q[1];
	pr->kld_p99 = k->kld_q[2];
	pr->kld_median = k->kld_q[5];
	pr->same_top = k->same_top.val;
	pr->same_top_error = k->same_top.err;
}

static int handle(void *ctx, const Weightfloor__V1__Request *req, int agent_ms,
                  Weightfloor__V1__Reply *reply, struct wf_ctl_call *call)
{
	struct evaluate *ev = ctx;
	const Weightfloor__V1__Perplexity *m = req->perplexity;
	struct wf_diag d = {{0}};
	int rc = 0;
	if (!m->model || !*m->model)
		rc = wf_diag_set(&d, WF_EINVAL, "perplexity: no model named");
	else if (m->kl_base && *m->kl_base && m->save_base && *m->save_base)
		rc = wf_diag_set(&d, WF_EINVAL, "perplexity: give kl_base or save_base, not both");
	else if (!(m->kl_base && *m->kl_base) && !m->text.len)
		rc = wf_diag_set(&d, WF_EINVAL, "perplexity: no text (and no kl_base)");
	else if (m->text.len && memchr(m->text.data, 0, m->text.len))
		rc = wf_diag_set(&d, WF_EINVAL, "perplexity: the text holds a NUL byte");
	if (rc == 0 && m->min_generation)
		rc = wait_generation(ev, m->model, m->floor_digest ? m->floor_digest : "",
		                     m->min_generation, call, &d);
	struct ppl_run r = {.req = m, .call = call, .diag = &d};
	char *text = NULL;
	if (rc == 0 && m->text.len && !(text = wf_ctl_call_alloc(call, m->text.len + 1)))
		rc = -ENOMEM;
	if (rc == 0) {
		if (text) {
			memcpy(text, m->text.data, m->text.len);
			text[m->text.len] = '\0';
		}
		r.job = (struct wf_ppl_job){
		    .text = text,
		    .text_len = m->text.len,
		    .kl_base = m->kl_base && *m->kl_base ? m->kl_base : NULL,
		    .save_base = m->save_base && *m->save_base ? m->save_base : NULL,
		    .n_ctx = m->n_ctx,
		    .max_chunks = m->max_chunks,
		    .progress = on_chunk,
		    .progress_arg = &r};
		rc = wf_completion_with_engine(ev->cs, m->model, agent_ms, run, &r, &d);
	}
	if (rc < 0) {
		reply->message = wf_ctl_call_strdup(call, wf_diag_str(&d, rc));
		return rc;
	}
	Weightfloor__V1__PerplexityReply *pr = wf_ctl_call_alloc(call, sizeof(*pr));
	if (!pr)
		return -ENOMEM;
	weightfloor__v1__perplexity_reply__init(pr);
	fill_reply(ev, &r, pr);
	wf_log_event(
	    WF_LOG_INFO,
	    WF_LOG_F(.worker = ev->svc->worker_id, .model = m->model, .event = "perplexity"),
	    "perplexity %.4f +/- %.5f over %u chunks of %u (%.2f s)%s", pr->ppl, pr->ppl_error,
	    pr->chunks, pr->n_ctx, pr->seconds, pr->kl ? " (KL against a base)" : "");
	reply->body_case = WEIGHTFLOOR__V1__REPLY__BODY_PERPLEXITY;
	reply->perplexity = pr;
	return 0;
}

void wf_evaluate_set_refresh(struct wf_worker_refresh *refresh)
{
	atomic_store(&ev_one.refresh, refresh);
}

int wf_evaluate_serve(struct wf_worker_svc *svc, struct wf_completions *cs)
{
	static const struct wf_worker_svc_ext ext = {.handle = handle};
	static const Weightfloor__V1__Request__BodyCase kinds[] = {
	    WEIGHTFLOOR__V1__REQUEST__BODY_PERPLEXITY};
	ev_one.svc = svc;
	ev_one.cs = cs;
	return wf_worker_svc_extend(svc, &ext, &ev_one, kinds, 1);
}
