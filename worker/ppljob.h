/* One perplexity or KL-divergence run on an engine, with its files: the part that `wf-worker
 * perplexity` (offline, worker/perplexity_cli.c) and a worker serving the Perplexity request
 * (worker/completion.c) share around worker/perplexity.h's I/O-free method: the text tokenized
 * as llama-perplexity does (common_tokenize(ctx, text, add_special = true, parse_special =
 * false); BOS substituted per chunk when the vocabulary adds it), the KL base file opened and its
 * size checked against its header before anything runs, a new base file written under a
 * temporary name in its directory and renamed into place only once whole (a failed or canceled
 * run leaves nothing half-written). */
#ifndef WF_WORKER_PPLJOB_H
#define WF_WORKER_PPLJOB_H

#include "base/diag.h"
#include "engine/engine.h"
#include "engine/tokenizer.h"
#include "worker/perplexity.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define WF_PPL_DEFAULT_CTX 512u /* llama-perplexity's -c default */

struct wf_ppl_job {
	/* In. Perplexity mode: text (its tokens must number at least 2 * n_ctx), and optionally
	 * save_base. KL mode: kl_base (text unused; the base file holds the tokens). */
	const char *text;
	size_t text_len;
	const char *kl_base;   /* a path, or NULL */
	const char *save_base; /* a path, or NULL */
	uint32_t n_ctx;        /* 0: the base file's (KL), else WF_PPL_DEFAULT_CTX; in KL mode
	                          another value than the file's is refused */
	uint32_t max_chunks;   /* 0: all */
	uint32_t seq;          /* the engine sequence to run in */
	wf_ppl_progress_fn progress;
	void *progress_arg;
	/* Out. */
	uint32_t n_ctx_used;
	uint32_t n_chunks_planned; /* chunks the run will do (known before it starts) */
	struct wf_ppl_result result;
	struct wf_ppl_kld kld; /* KL mode only */
};

/* The context a KL base file was computed with (reads its header), for a caller that must size
 * an engine before running. Errors as wf_ppl_job_run's for the file. */
int wf_ppl_job_base_ctx(const char *kl_base, uint32_t *ret_n_ctx, struct wf_diag *diag);

/* Runs job on engine (its sequence job->seq must be free; it is empty again afterwards) with
 * tok, the model's tokenizer. Returns 0 and the job's outputs; errors, with diag saying which
 * file or figure: the file's errno, WF_EMAGIC / WF_ETRUNCATED / WF_EFORMAT (a base file that is
 * not one, is cut short, or belongs to another vocabulary or context), WF_EINVAL (a text too
 * short, a context below WF_PPL_MIN_CTX), WF_ELIMIT (a context past the engine's),
 * WF_EUNSUPPORTED (a vocabulary that adds EOS, which llama-perplexity refuses too), and those of
 * wf_ppl_perplexity / wf_ppl_kl_divergence. */
int wf_ppl_job_run(struct wf_engine *engine, const struct wf_tokenizer *tok, struct wf_ppl_job *job,
                   struct wf_diag *diag);

#endif
