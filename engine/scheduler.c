#include "engine/scheduler.h"

#include "base/error.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct req {
	struct req *next; /* queue link */
	uint64_t id;
	int32_t *tokens;
	size_t n_tokens;
	char **stop;
	size_t n_stop, stop_max;
	uint32_t max_tokens;
	bool ignore_eos;
	wf_sched_token_fn on_token;
	wf_sched_done_fn on_done;
	void *arg;
	struct wf_sampler *sampler;
	bool cancel; /* under mu */
	/* Step thread only, from admission on. */
	uint32_t seq;
	size_t n_fed;  /* prompt tokens in the KV cache */
	bool decoding; /* prompt done: last is the next token to feed */
	int32_t last;
	uint32_t n_gen;
	char *pend;
	size_t pend_len, pend_cap;
	double t_submit, t_start, t_first, t_last;
};

/* Work for the step boundary (wf_sched_between): on the poster's stack until it is done. */
struct between {
	struct between *next;
	wf_sched_between_fn fn;
	void *arg;
	int rc;
	bool done;
};

struct wf_sched {
	struct wf_engine *engine;
	const struct wf_tokenizer *tok;
	uint32_t n_batch, n_seq, n_ctx, n_vocab;
	int32_t eos;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct req *qhead, *qtail;
	uint32_t nq;
	struct req **slot; /* [n_seq]; written under mu by the step thread, read by cancel */
	uint32_t running;
	struct between *bhead, *btail; /* under mu */
	bool ended;                    /* the step thread left its loop (under mu) */
	bool closing, started, joined;
	pthread_t thread;
	uint64_t next_id;
	struct wf_sched_stats stats; /* under mu */
	/* Step thread scratch, sized n_batch + n_seq entries. */
	int32_t *b_tok;
	uint32_t *b_pos, *b_seq;
	bool *b_want;
	struct req **b_req;
	struct req **order;
	float *logits; /* n_seq rows of n_vocab */
};

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

const char *wf_sched_finish_name(enum wf_sched_finish reason)
{
	static const char *const names[WF_SCHED_FINISH_MAX] = {"eos",     "stop",     "length",
	                                                       "context", "canceled", "error"};
	return (unsigned)reason < WF_SCHED_FINISH_MAX ? names[reason] : "?";
}

static void req_free(struct req *r)
{
	if (!r)
		return;
	free(r->tokens);
	for (size_t i = 0; i < r->n_stop; i++)
		free(r->stop[i]);
	free(r->stop);
	wf_sampler_destroy(r->sampler);
	free(r->pend);
	free(r);
}

static void *step_main(void *arg);

int wf_sched_create(struct wf_engine *engine, const struct wf_tokenizer *tok,
                    const struct wf_sched_config *cfg, struct wf_sched **ret_sched,
                    struct wf_diag *diag)
{
	struct wf_engine_info info;
	wf_engine_get_info(engine, &info);
	if (wf_tokenizer_n_vocab(tok) != info.n_vocab)
		return wf_diag_set(diag, WF_EINVAL,
		                   "the tokenizer has %u tokens, the model's output %u",
		                   wf_tokenizer_n_vocab(tok), info.n_vocab);
	struct wf_sched *s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->engine = engine;
	s->tok = tok;
	s->n_batch = cfg && cfg->n_batch ? cfg->n_batch : 512;
	s->n_seq = info.n_seq_max ? info.n_seq_max : 1;
	if (cfg && cfg->n_seq && cfg->n_seq < s->n_seq)
		s->n_seq = cfg->n_seq;
	s->n_ctx = info.n_ctx;
	s->n_vocab = info.n_vocab;
	s->eos = wf_tokenizer_eos(tok);
	s->next_id = 1;
	pthread_mutex_init(&s->mu, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&s->cv, &ca);
	pthread_condattr_destroy(&ca);
	size_t nb = (size_t)s->n_batch + s->n_seq;
	s->slot = calloc(s->n_seq, sizeof(*s->slot));
	s->order = calloc(s->n_seq, sizeof(*s->order));
	s->b_tok = calloc(nb, sizeof(*s->b_tok));
	s->b_pos = calloc(nb, sizeof(*s->b_pos));
	s->b_seq = calloc(nb, sizeof(*s->b_seq));
	s->b_want = calloc(nb, sizeof(*s->b_want));
	s->b_req = calloc(nb, sizeof(*s->b_req));
	s->logits = malloc((size_t)s->n_seq * s->n_vocab * sizeof(float));
	int rc = -ENOMEM;
	if (!s->slot || !s->order || !s->b_tok || !s->b_pos || !s->b_seq || !s->b_want ||
	    !s->b_req || !s->logits)
		goto err;
	rc = -pthread_create(&s->thread, NULL, step_main, s);
	if (rc < 0) {
		wf_diag_set(diag, rc, "scheduler: cannot start its thread");
		goto err;
	}
	s->started = true;
	*ret_sched = s;
	return 0;
err:
	wf_sched_destroy(s);
	return rc;
}

int wf_sched_submit(struct wf_sched *s, const struct wf_sched_request *q, uint64_t *ret_id,
                    struct wf_diag *diag)
{
	if (!q->on_done)
		return wf_diag_set(diag, WF_EINVAL, "no completion callback");
	if (q->n_tokens == 0)
		return wf_diag_set(diag, WF_EINVAL, "empty prompt");
	if (q->n_tokens > s->n_ctx)
		return wf_diag_set(diag, WF_ELIMIT,
		                   "the prompt has %zu tokens, more than the context of %u",
		                   q->n_tokens, s->n_ctx);
	for (size_t i = 0; i < q->n_tokens; i++)
		if (q->tokens[i] < 0 || (uint32_t)q->tokens[i] >= s->n_vocab)
			return wf_diag_set(diag, WF_EINVAL,
			                   "prompt token %zu is %d, outside the vocabulary of %u",
			                   i, q->tokens[i], s->n_vocab);
	if (q->n_stop > WF_SCHED_STOP_MAX)
		return wf_diag_set(diag, WF_EINVAL, "%zu stop strings: at most %d", q->n_stop,
		                   WF_SCHED_STOP_MAX);
	struct req *r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	int rc = -ENOMEM;
	r->tokens = malloc(q->n_tokens * sizeof(*r->tokens));
	r->stop = calloc(q->n_stop ? q->n_stop : 1, sizeof(*r->stop));
	if (!r->tokens || !r->stop)
		goto err;
	memcpy(r->tokens, q->tokens, q->n_tokens * sizeof(*r->tokens));
	r->n_tokens = q->n_tokens;
	for (size_t i = 0; i < q->n_stop; i++) {
		size_t len = q->stop[i] ? strlen(q->stop[i]) : 0;
		if (len == 0 || len > WF_SCHED_STOP_LEN_MAX) {
			rc = wf_diag_set(diag, WF_EINVAL, "stop string %zu must be 1-%d bytes", i,
			                 WF_SCHED_STOP_LEN_MAX);
			goto err;
		}
		if (!(r->stop[i] = strdup(q->stop[i])))
			goto err;
		r->n_stop = i + 1;
		if (len > r->stop_max)
			r->stop_max = len;
	}
	if ((rc = wf_sampler_create(&q->sampling, s->n_vocab, &r->sampler, diag)) < 0)
		goto err;
	/* The penalty looks at the prompt too, as llama.cpp's server feeds it to its sampler. */
	for (size_t i = 0; i < q->n_tokens; i++)
		wf_sampler_accept(r->sampler, q->tokens[i]);
	r->max_tokens = q->max_tokens;
	r->ignore_eos = q->ignore_eos;
	r->on_token = q->on_token;
	r->on_done = q->on_done;
	r->arg = q->arg;
	r->t_submit = now_s();
	pthread_mutex_lock(&s->mu);
	if (s->closing)
		rc = wf_diag_set(diag, WF_ECANCELED, "the scheduler is shutting down");
	else if (s->nq >= WF_SCHED_QUEUE_MAX)
		rc = wf_diag_set(diag, WF_ELIMIT, "%u requests are waiting already", s->nq);
	else
		rc = 0;
	if (rc == 0) {
		r->id = s->next_id++;
		if (s->qtail)
			s->qtail->next = r;
		else
			s->qhead = r;
		s->qtail = r;
		s->nq++;
		*ret_id = r->id;
		pthread_cond_broadcast(&s->cv);
	}
	pthread_mutex_unlock(&s->mu);
	if (rc == 0)
		return 0;
err:
	req_free(r);
	return rc;
}

int wf_sched_cancel(struct wf_sched *s, uint64_t id)
{
	int rc = WF_ENOT_FOUND;
	pthread_mutex_lock(&s->mu);
	for (struct req *r = s->qhead; r; r = r->next)
		if (r->id == id) {
			r->cancel = true;
			rc = 0;
		}
	for (uint32_t i = 0; i < s->n_seq && rc < 0; i++)
		if (s->slot[i] && s->slot[i]->id == id) {
			s->slot[i]->cancel = true;
			rc = 0;
		}
	if (rc == 0)
		pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
	return rc;
}

void wf_sched_get_stats(struct wf_sched *s, struct wf_sched_stats *ret)
{
	pthread_mutex_lock(&s->mu);
	*ret = s->stats;
	ret->running = s->running;
	ret->queued = s->nq;
	pthread_mutex_unlock(&s->mu);
}

/* ---- the step thread ------------------------------------------------------------------------ */

/* Ends r: the sequence is freed for the next request, then the done callback. r must have left
 * the queue; a running r leaves its slot here. */
static void finish(struct wf_sched *s, struct req *r, bool running, enum wf_sched_finish why,
                   int error, const char *msg)
{
	if (running) {
		pthread_mutex_lock(&s->mu);
		s->slot[r->seq] = NULL;
		s->running--;
		pthread_mutex_unlock(&s->mu);
		(void)wf_engine_seq_truncate(s->engine, r->seq, 0);
	}
	struct wf_sched_result res;
	memset(&res, 0, sizeof(res));
	res.reason = why;
	res.error = error;
	if (msg)
		snprintf(res.message, sizeof res.message, "%s", msg);
	res.n_prompt = (uint32_t)r->n_tokens;
	res.n_gen = r->n_gen;
	double end = now_s();
	double start = r->t_start ? r->t_start : end;
	res.queue_s = start - r->t_submit;
	if (r->n_gen) {
		res.prompt_s = r->t_first - start;
		res.decode_s = r->t_last - r->t_first;
		res.first_token_s = r->t_first - r->t_submit;
	}
	r->on_done(r->arg, &res);
	pthread_mutex_lock(&s->mu);
	s->stats.requests_done++;
	pthread_mutex_unlock(&s->mu);
	req_free(r);
}

/* Where the bytes that may leave end: before any suffix that could begin a stop string, and
 * before an incomplete UTF-8 character at the end. */
static size_t releasable(const struct req *r)
{
	size_t n = r->pend_len, safe = n;
	if (r->stop_max) {
		size_t from = n > r->stop_max - 1 ? n - (r->stop_max - 1) : 0;
		for (size_t i = from; i < n && safe == n; i++)
			for (size_t k = 0; k < r->n_stop; k++) {
				size_t tail = n - i, sl = strlen(r->stop[k]);
				if (tail < sl && memcmp(r->pend + i, r->stop[k], tail) == 0) {
					safe = i;
					break;
				}
			}
	}
	/* The last character of [0, safe): its lead byte within 4 bytes of the end. */
	for (size_t back = 1; back <= 4 && back <= safe; back++) {
		unsigned char c = (unsigned char)r->pend[safe - back];
		if ((c & 0xC0) == 0x80)
			continue; /* a continuation byte: look further back */
		size_t need = c >= 0xF0 && c < 0xF8 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
		if (back < need)
			safe -= back;
		break;
	}
	return safe;
}

/* The earliest complete stop string in the pending bytes, or SIZE_MAX. */
static size_t stop_at(const struct req *r)
{
	size_t best = SIZE_MAX;
	for (size_t k = 0; k < r->n_stop; k++) {
		size_t sl = strlen(r->stop[k]);
		for (size_t i = 0; i + sl <= r->pend_len && i < best; i++)
			if (memcmp(r->pend + i, r->stop[k], sl) == 0) {
				best = i;
				break;
			}
	}
	return best;
}

static int pend_append(struct req *r, const char *p, size_t n)
{
	if (r->pend_len + n > r->pend_cap) {
		size_t cap = r->pend_cap ? r->pend_cap * 2 : 64;
		while (cap < r->pend_len + n)
			cap *= 2;
		char *np = realloc(r->pend, cap);
		if (!np)
			return -ENOMEM;
		r->pend = np;
		r->pend_cap = cap;
	}
	memcpy(r->pend + r->pend_len, p, n);
	r->pend_len += n;
	return 0;
}

/* Gives the token and the bytes that may leave to the caller, then drops them. */
static void emit(struct req *r, int32_t tok, size_t len)
{
	if (r->on_token)
		r->on_token(r->arg, tok, r->pend ? r->pend : "", len);
	if (len) {
		memmove(r->pend, r->pend + len, r->pend_len - len);
		r->pend_len -= len;
	}
}

/* A token sampled for r: output, then whether r goes on. Returns true when r finished. */
static bool take_token(struct wf_sched *s, struct req *r, int32_t tok)
{
	double t = now_s();
	if (r->n_gen++ == 0)
		r->t_first = t;
	r->t_last = t;
	wf_sampler_accept(r->sampler, tok);
	if (!r->ignore_eos && tok == s->eos) {
		emit(r, tok, r->pend_len);
		finish(s, r, true, WF_SCHED_FINISH_EOS, 0, NULL);
		return true;
	}
	char buf[256];
	int64_t n = wf_tokenizer_piece(s->tok, tok, false, 0, buf, sizeof buf);
	int rc = 0;
	if (n > (int64_t)sizeof buf) {
		char *big = malloc((size_t)n);
		if (!big)
			rc = -ENOMEM;
		else if (wf_tokenizer_piece(s->tok, tok, false, 0, big, (size_t)n) == n)
			rc = pend_append(r, big, (size_t)n);
		free(big);
	} else if (n > 0) {
		rc = pend_append(r, buf, (size_t)n);
	}
	if (rc < 0) {
		emit(r, tok, r->pend_len);
		finish(s, r, true, WF_SCHED_FINISH_ERROR, rc, "out of memory for the output");
		return true;
	}
	size_t at = stop_at(r);
	if (at != SIZE_MAX) {
		emit(r, tok, at);
		finish(s, r, true, WF_SCHED_FINISH_STOP, 0, NULL);
		return true;
	}
	if (r->max_tokens && r->n_gen >= r->max_tokens) {
		emit(r, tok, r->pend_len);
		finish(s, r, true, WF_SCHED_FINISH_LENGTH, 0, NULL);
		return true;
	}
	if (wf_engine_seq_len(s->engine, r->seq) >= s->n_ctx) {
		char msg[128];
		snprintf(msg, sizeof msg, "the sequence filled the context of %u tokens", s->n_ctx);
		emit(r, tok, r->pend_len);
		finish(s, r, true, WF_SCHED_FINISH_CONTEXT, WF_ELIMIT, msg);
		return true;
	}
	emit(r, tok, releasable(r));
	r->last = tok;
	r->decoding = true;
	return false;
}

/* Takes queued requests into free sequences and collects the canceled ones (queued or running)
 * into *ret_cancel. Under mu. */
static void admit_locked(struct wf_sched *s, struct req **ret_cancel)
{
	struct req **pp = &s->qhead, *prev = NULL;
	while (*pp) {
		struct req *r = *pp;
		if (r->cancel || s->closing) {
			*pp = r->next;
			if (s->qtail == r)
				s->qtail = prev;
			s->nq--;
			r->next = *ret_cancel;
			*ret_cancel = r;
			continue;
		}
		prev = r;
		pp = &r->next;
	}
	for (uint32_t i = 0; i < s->n_seq && s->qhead; i++) {
		if (s->slot[i])
			continue;
		struct req *r = s->qhead;
		s->qhead = r->next;
		if (!s->qhead)
			s->qtail = NULL;
		s->nq--;
		r->next = NULL;
		r->seq = i;
		r->t_start = now_s();
		s->slot[i] = r;
		s->running++;
	}
}

/* The boundary's work, in posting order, with mu held (dropped while each runs). */
static void run_between_locked(struct wf_sched *s)
{
	while (s->bhead) {
		struct between *b = s->bhead;
		s->bhead = b->next;
		if (!s->bhead)
			s->btail = NULL;
		pthread_mutex_unlock(&s->mu);
		const int rc = b->fn(b->arg, s->engine);
		pthread_mutex_lock(&s->mu);
		b->rc = rc;
		b->done = true;
		pthread_cond_broadcast(&s->cv);
	}
}

int wf_sched_between(struct wf_sched *s, wf_sched_between_fn fn, void *arg)
{
	struct between b = {.fn = fn, .arg = arg};
	pthread_mutex_lock(&s->mu);
	if (s->ended || !s->started) { /* no step thread: nothing decodes */
		pthread_mutex_unlock(&s->mu);
		return fn(arg, s->engine);
	}
	if (s->btail)
		s->btail->next = &b;
	else
		s->bhead = &b;
	s->btail = &b;
	pthread_cond_broadcast(&s->cv);
	while (!b.done)
		pthread_cond_wait(&s->cv, &s->mu);
	pthread_mutex_unlock(&s->mu);
	return b.rc;
}

static void *step_main(void *arg)
{
	struct wf_sched *s = arg;
	for (;;) {
		struct req *canceled = NULL;
		pthread_mutex_lock(&s->mu);
		while (!s->closing && s->nq == 0 && s->running == 0 && !s->bhead)
			pthread_cond_wait(&s->cv, &s->mu);
		run_between_locked(s);
		bool closing = s->closing;
		admit_locked(s, &canceled);
		/* Running requests to end now, in slot order. */
		uint32_t n_order = 0;
		for (uint32_t i = 0; i < s->n_seq; i++)
			if (s->slot[i])
				s->order[n_order++] = s->slot[i];
		pthread_mutex_unlock(&s->mu);
		while (canceled) {
			struct req *r = canceled;
			canceled = r->next;
			finish(s, r, false, WF_SCHED_FINISH_CANCELED, 0, NULL);
		}
		/* Oldest first, so that prompts are processed in arrival order. */
		for (uint32_t i = 1; i < n_order; i++)
			for (uint32_t j = i; j > 0 && s->order[j - 1]->id > s->order[j]->id; j--) {
				struct req *t = s->order[j];
				s->order[j] = s->order[j - 1];
				s->order[j - 1] = t;
			}
		uint32_t live = 0;
		for (uint32_t i = 0; i < n_order; i++) {
			struct req *r = s->order[i];
			pthread_mutex_lock(&s->mu);
			bool cancel = r->cancel;
			pthread_mutex_unlock(&s->mu);
			if (cancel || closing) {
				if (r->pend_len)
					emit(r, WF_TOKEN_NULL, r->pend_len);
				finish(s, r, true, WF_SCHED_FINISH_CANCELED, 0, NULL);
			} else {
				s->order[live++] = r;
			}
		}
		if (closing) {
			pthread_mutex_lock(&s->mu);
			bool drained = s->nq == 0 && s->running == 0;
			if (drained) { /* work posted from now on runs in its poster's thread */
				s->ended = true;
				run_between_locked(s);
			}
			pthread_mutex_unlock(&s->mu);
			if (drained)
				break;
			continue;
		}
		if (live == 0)
			continue;
		/* The batch: every decoding sequence's next token, then prompt chunks. */
		uint32_t n = 0, n_logits = 0;
		for (uint32_t i = 0; i < live; i++) {
			struct req *r = s->order[i];
			if (!r->decoding)
				continue;
			s->b_tok[n] = r->last;
			s->b_pos[n] = wf_engine_seq_len(s->engine, r->seq);
			s->b_seq[n] = r->seq;
			s->b_want[n] = true;
			s->b_req[n] = r;
			n++;
			n_logits++;
		}
		for (uint32_t i = 0; i < live && n < s->n_batch; i++) {
			struct req *r = s->order[i];
			if (r->decoding)
				continue;
			size_t left = r->n_tokens - r->n_fed, room = s->n_batch - n;
			size_t take = left < room ? left : room;
			uint32_t pos = wf_engine_seq_len(s->engine, r->seq);
			for (size_t k = 0; k < take; k++) {
				s->b_tok[n] = r->tokens[r->n_fed + k];
				s->b_pos[n] = pos + (uint32_t)k;
				s->b_seq[n] = r->seq;
				s->b_want[n] = r->n_fed + k + 1 == r->n_tokens;
				s->b_req[n] = r;
				n_logits += s->b_want[n];
				n++;
			}
			r->n_fed += take;
		}
		struct wf_engine_batch b = {.n = n,
		                            .tokens = s->b_tok,
		                            .pos = s->b_pos,
		                            .seq = s->b_seq,
		                            .want_logits = s->b_want};
		struct wf_diag d = {{0}};
		int rc = wf_engine_decode(s->engine, &b, s->logits, &d);
		pthread_mutex_lock(&s->mu);
		s->stats.steps++;
		if (rc == 0)
			s->stats.tokens_decoded += n;
		pthread_mutex_unlock(&s->mu);
		if (rc < 0) {
			/* Nothing was computed and no KV changed: every sequence in the batch
			 * fails (the engine cannot say which one it refused). */
			for (uint32_t i = 0; i < live; i++) {
				struct req *r = s->order[i];
				if (r->pend_len)
					emit(r, WF_TOKEN_NULL, r->pend_len);
				finish(s, r, true, WF_SCHED_FINISH_ERROR, rc, wf_diag_str(&d, rc));
			}
			continue;
		}
		uint32_t row = 0;
		for (uint32_t i = 0; i < n; i++) {
			if (!s->b_want[i])
				continue;
			struct req *r = s->b_req[i];
			int32_t tok =
			    wf_sampler_sample(r->sampler, s->logits + (size_t)row++ * s->n_vocab);
			(void)take_token(s, r, tok);
		}
		(void)n_logits;
	}
	return NULL;
}

void wf_sched_close(struct wf_sched *s)
{
	if (!s)
		return;
	pthread_mutex_lock(&s->mu);
	s->closing = true;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
}

void wf_sched_stop(struct wf_sched *s)
{
	if (!s || !s->started || s->joined)
		return;
	wf_sched_close(s);
	pthread_join(s->thread, NULL);
	s->joined = true;
}

void wf_sched_destroy(struct wf_sched *s)
{
	if (!s)
		return;
	wf_sched_stop(s);
	/* Nothing is left once the thread has drained; requests of a scheduler whose thread never
	 * started cannot exist (submit needs one). */
	free(s->slot);
	free(s->order);
	free(s->b_tok);
	free(s->b_pos);
	free(s->b_seq);
	free(s->b_want);
	free(s->b_req);
	free(s->logits);
	pthread_cond_destroy(&s->cv);
	pthread_mutex_destroy(&s->mu);
	free(s);
}
