/* Continuous batching over one engine: every request in flight advances in the same decode step.
 *
 * A request gets one of the engine's sequences (n_seq_max of them; more requests wait in a FIFO
 * queue). One step thread loops: it admits queued requests to free sequences, builds one batch of
 * every decoding sequence's next token plus prompt tokens of sequences still in their prompt
 * (chunked: at most n_batch tokens per step, decoding tokens first so that new prompts never
 * stall the ones already generating), calls wf_engine_decode once, and samples each sequence
 * whose last token was in the batch. So a node serving 8 requests reads each expert once per
 * step, not 8 times.
 *
 * Output: each sampled token is turned into text with wf_tokenizer_piece (special tokens give
 * none) and appended to the request's pending bytes; bytes leave (the piece callback) once they
 * are a complete UTF-8 character and cannot be the start of a stop string. A request finishes
 * on the vocabulary's EOS, a stop string (the text before it is emitted, the stop string and
 * what follows are not), max_tokens, a full context (the sequence reached n_ctx: reason CONTEXT),
 * cancellation, or an engine error; then its sequence is truncated to 0 for the next request.
 *
 * Callbacks run on the step thread with no scheduler lock held; they must not block for long
 * (they hold up every request) and must not call wf_sched_stop/destroy. They may call
 * wf_sched_submit and wf_sched_cancel. After the done callback the request is gone: its id is
 * never reused (ids count up from 1).
 *
 * Thread-safe: submit and cancel from any thread. Shutdown in three steps: close (every request,
 * queued or running, finishes with CANCELED; new submits fail with WF_ECANCELED; does not block),
 * stop (joins the step thread), destroy. */
#ifndef WF_ENGINE_SCHEDULER_H
#define WF_ENGINE_SCHEDULER_H

#include "base/diag.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "engine/tokenizer.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define WF_SCHED_STOP_MAX     16   /* stop strings per request */
#define WF_SCHED_STOP_LEN_MAX 256  /* bytes per stop string */
#define WF_SCHED_QUEUE_MAX    1024 /* requests waiting for a sequence */

enum wf_sched_finish {
	WF_SCHED_FINISH_EOS = 0,  /* the model produced its end-of-sequence token */
	WF_SCHED_FINISH_STOP,     /* a stop string */
	WF_SCHED_FINISH_LENGTH,   /* max_tokens generated */
	WF_SCHED_FINISH_CONTEXT,  /* the sequence filled the context (n_ctx positions) */
	WF_SCHED_FINISH_CANCELED, /* wf_sched_cancel or wf_sched_close */
	WF_SCHED_FINISH_ERROR,    /* the engine failed (error, message) */
	WF_SCHED_FINISH_MAX
};

/* "eos", "stop", "length", "context", "canceled", "error"; "?" out of range. Static. */
const char *wf_sched_finish_name(enum wf_sched_finish reason);

struct wf_sched_result {
	enum wf_sched_finish reason;
	int error;                 /* ERROR: the engine's code; CONTEXT: WF_ELIMIT; else 0 */
	char message[WF_DIAG_MAX]; /* why, for ERROR and CONTEXT */
	uint32_t n_prompt;         /* prompt tokens */
	uint32_t n_gen;       /* tokens sampled (the EOS token and one that completed a stop string
	                         included) */
	double queue_s;       /* submit to a sequence being assigned */
	double prompt_s;      /* assigned to the first token sampled (prompt processing) */
	double decode_s;      /* first token sampled to the last */
	double first_token_s; /* submit to the first token sampled; 0 when none was */
};

/* One sampled token: its id and the bytes released with it (len may be 0: held back, or a
 * special token; a later call may release more than one token's bytes). A request canceled or
 * failed with bytes still held gets them in one last call with token WF_TOKEN_NULL. */
typedef void (*wf_sched_token_fn)(void *arg, int32_t token, const char *text, size_t len);
/* Exactly once per accepted request. */
typedef void (*wf_sched_done_fn)(void *arg, const struct wf_sched_result *result);

struct wf_sched_request {
	const int32_t *tokens; /* the prompt, copied; at least one, each < n_vocab */
	size_t n_tokens;       /* at most n_ctx */
	struct wf_sampler_params sampling;
	uint32_t max_tokens;     /* 0: until EOS, a stop string or a full context */
	const char *const *stop; /* copied */
	size_t n_stop;
	bool ignore_eos;            /* keep going past EOS (benchmarks) */
	wf_sched_token_fn on_token; /* optional */
	wf_sched_done_fn on_done;   /* required */
	void *arg;
};

struct wf_sched_config {
	uint32_t n_batch; /* tokens per decode step; 0: 512 */
	/* The engine sequences requests get: 0 .. n_seq-1 (0, or more than the engine has: all of
	 * them). The others are the caller's, for work it runs through wf_sched_between (a
	 * perplexity evaluation, worker/ppljob.h), which never meets a request's KV cache. */
	uint32_t n_seq;
};

struct wf_sched;

/* Starts the step thread over engine and tok (borrowed: both must outlive the scheduler, and
 * nothing else may decode on engine meanwhile). Returns 0, WF_EINVAL (vocabularies of the engine
 * and tokenizer differ), -ENOMEM, -errno of pthread_create. */
int wf_sched_create(struct wf_engine *engine, const struct wf_tokenizer *tok,
                    const struct wf_sched_config *cfg, struct wf_sched **ret_sched,
                    struct wf_diag *diag);

/* Queues a request. Returns 0 and *ret_id (its callbacks may run before this returns); on an
 * error no callback is ever called: WF_EINVAL (empty prompt, a token out of the vocabulary, bad
 * sampling, too many or too long stop strings, no on_done: diag says which), WF_ELIMIT (a prompt
 * longer than the context; the queue is full), WF_ECANCELED (closed), -ENOMEM. */
int wf_sched_submit(struct wf_sched *sched, const struct wf_sched_request *req, uint64_t *ret_id,
                    struct wf_diag *diag);

/* Asks request id to finish with CANCELED (at the next step; a queued one at once, on the step
 * thread). Returns 0, or WF_ENOT_FOUND when it has finished already or never existed. */
int wf_sched_cancel(struct wf_sched *sched, uint64_t id);

/* Runs fn(arg, engine) on the step thread between two steps, never under a decode, and returns
 * its result: the step boundary of the refresh seam (wf_engine_refresh there). Blocks until it
 * has run: at once when no request runs, else after the step in progress. Works posted together
 * run in posting order. Once the step thread has ended (after wf_sched_stop) fn runs in the
 * caller's thread. fn must not call the scheduler. Thread-safe. */
typedef int (*wf_sched_between_fn)(void *arg, struct wf_engine *engine);
int wf_sched_between(struct wf_sched *sched, wf_sched_between_fn fn, void *arg);

struct wf_sched_stats {
	uint32_t running, queued;
	uint64_t steps, tokens_decoded, requests_done;
};
void wf_sched_get_stats(struct wf_sched *sched, struct wf_sched_stats *ret_stats);

void wf_sched_close(struct wf_sched *sched);
void wf_sched_stop(struct wf_sched *sched);
/* Stops if needed and frees; accepts NULL. */
void wf_sched_destroy(struct wf_sched *sched);

#ifdef __cplusplus
}
#endif
#endif
