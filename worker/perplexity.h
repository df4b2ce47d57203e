/* Perplexity and KL divergence of a model over a text: llama.cpp's llama-perplexity (release
 * b10573, tools/perplexity/perplexity.cpp, perplexity() and kl_divergence()) on our engine, so a
 * researcher's figures from either program can be compared with the other's.
 *
 * The method. The text's tokens are cut into chunks of n_ctx tokens (the chunks that fit, or
 * fewer); a chunk runs alone in a fresh sequence (its KV forgotten first), its first token
 * replaced by BOS when the vocabulary says add_bos. Only the second half is scored, so every
 * prediction has at least n_ctx/2 tokens of context: with first = n_ctx/2, the logits of
 * positions first .. n_ctx-2 predict tokens first+1 .. n_ctx-1 (n_ctx-1-first tokens a chunk).
 * A token's negative log-likelihood is max + log(sum exp(l_i - max)) - l_tok, the exponentials in
 * float summed in double, exactly as llama.cpp's log_softmax. PPL = exp(mean nll) and its
 * uncertainty (llama.cpp's "Final estimate: PPL = X +/- Y") is PPL * sqrt(var(nll) / (count-1)).
 *
 * The KL-divergence base file (llama.cpp's --kl-divergence-base FILE, read by --kl-divergence;
 * host byte order, which is little-endian on every machine either program runs on; no padding):
 *   char     magic[8]  "_logits_"
 *   int32    n_ctx
 *   int32    n_vocab
 *   int32    n_chunk
 *   int32    tokens[n_chunk * n_ctx]   the text's tokens, as tokenized (BOS not substituted)
 *   per chunk, per scored position (n_ctx-1-n_ctx/2 rows), a row of nv = 2*((n_vocab+1)/2) + 4
 *   uint16:
 *     float32  scale         (max - min) / 65535, min = max(min logit, max logit - 16)
 *     float32  min_log_prob  min - max - log(sum exp(l_i - max))
 *     uint16   q[n_vocab]    round((l_i - min) / scale) where l_i > min, else 0:
 *                            log p_i = scale * q_i + min_log_prob
 *     uint16   0             when n_vocab is odd
 * The base model's PPL is computed from the quantized log-probabilities, the model under test's
 * from its own logits; KLD(base || test) per token sums p_base * (log p_base - log p_test) over
 * the tokens whose base log-probability exceeds -16.
 *
 * No I/O here: the caller tokenizes, and moves the base file's bytes through the callbacks below.
 * Not thread-safe on one engine (it decodes): one run at a time, nothing else decoding on it. */
#ifndef WF_WORKER_PERPLEXITY_H
#define WF_WORKER_PERPLEXITY_H

#include "base/diag.h"
#include "engine/engine.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

#define WF_PPL_MAGIC     "_logits_"
#define WF_PPL_MIN_CTX   4u
#define WF_PPL_MAX_CTX   (1u << 20)
#define WF_PPL_MAX_VOCAB (1u << 24)
/* Tokens a base file may hold (n_chunk * n_ctx): 1 GiB of them. */
#define WF_PPL_MAX_TOKENS (1ull << 28)

/* The quantiles llama-perplexity --kl-divergence prints, largest first: 1 is the maximum, 0 the
 * minimum, 0.5 its median (the mean of the two middle values for an even count). */
#define WF_PPL_KLD_NQ 11
#define WF_PPL_KLD_QUANTILES                                                                       \
	{                                                                                          \
		1.0f, 0.999f, 0.990f, 0.950f, 0.900f, 0.5f, 0.100f, 0.050f, 0.010f, 0.001f, 0.0f   \
	}
#define WF_PPL_DP_NQ 13
#define WF_PPL_DP_QUANTILES                                                                        \
	{                                                                                          \
		1.0f, 0.999f, 0.990f, 0.950f, 0.900f, 0.750f, 0.5f, 0.250f, 0.100f, 0.050f,        \
		    0.010f, 0.001f, 0.0f                                                           \
	}

/* A value with llama.cpp's uncertainty. */
struct wf_ppl_est {
	double val, err;
};

/* What llama-perplexity --kl-divergence prints, running per chunk (the quantiles at the end
 * only). p_diff is p_test(tok) - p_base(tok) of the actual next token; fractions, not percent. */
struct wf_ppl_kld {
	struct wf_ppl_est ppl, ppl_base;
	double cor;                        /* of ln PPL(Q) and ln PPL(base), a fraction */
	struct wf_ppl_est ln_ratio, ratio; /* ln(PPL/PPL(base)), PPL/PPL(base) */
	struct wf_ppl_est diff;            /* PPL - PPL(base) */
	struct wf_ppl_est kld;             /* mean KL divergence */
	struct wf_ppl_est p_diff, rms_p_diff;
	struct wf_ppl_est same_top;   /* fraction of tokens whose argmax agrees */
	float kld_q[WF_PPL_KLD_NQ];   /* WF_PPL_KLD_QUANTILES order */
	float p_diff_q[WF_PPL_DP_NQ]; /* WF_PPL_DP_QUANTILES order */
	bool
	    has_stats; /* count >= 100: llama.cpp prints the statistics (and quantiles) only then */
};

/* After each chunk. ppl is the running estimate exp(mean nll) llama-perplexity prints as
 * "[chunk]ppl,"; kld the running KL figures in KL mode (quantiles not filled), else NULL. */
struct wf_ppl_progress {
	uint32_t chunk; /* 1-based, the chunk just done */
	uint32_t n_chunks;
	uint64_t n_scored; /* tokens scored so far */
	double ppl;
	double seconds; /* since the run began */
	const struct wf_ppl_kld *kld;
};
/* Returns 0 to go on, a negative code to stop the run (which returns it). */
typedef int (*wf_ppl_progress_fn)(void *arg, const struct wf_ppl_progress *p);

/* Writes len bytes of the base file: 0 or a negative code. */
typedef int (*wf_ppl_write_fn)(void *arg, const void *buf, size_t len);
/* Reads up to len bytes of the base file: the count read (less than len only at its end), or a
 * negative code. */
typedef ssize_t (*wf_ppl_read_fn)(void *arg, void *buf, size_t len);

struct wf_ppl_params {
	uint32_t n_ctx;      /* tokens a chunk, >= WF_PPL_MIN_CTX and <= the engine's n_ctx; in KL
	                        mode 0 takes the base file's, and another value is refused */
	uint32_t max_chunks; /* 0: every chunk the tokens (or the base file) hold */
	bool add_bos;        /* replace each chunk's first token by bos (llama.cpp: when the
	                        vocabulary's add_bos_token) */
	int32_t bos;
	uint32_t
	    seq; /* the engine sequence to run in (forgotten before each chunk and at the end) */
	wf_ppl_progress_fn progress; /* NULL: none */
	void *progress_arg;
};

struct wf_ppl_result {
	double ppl;
	double ppl_err; /* llama.cpp's +/-; 0 with has_err false where its variance is not
	                   positive (llama.cpp prints an error instead of the estimate) */
	bool has_err;
	uint32_t n_chunks; /* chunks run */
	uint64_t n_scored; /* tokens scored */
	double seconds;
};

/* The base file's header and tokens (owned; wf_ppl_base_fini frees them). */
struct wf_ppl_base {
	uint32_t n_ctx, n_vocab, n_chunks;
	int32_t *tokens; /* n_chunks * n_ctx */
};

/* Perplexity of the engine's model over tokens[0..n) (at least 2 * n_ctx of them, llama.cpp's
 * floor: WF_EINVAL otherwise). With save non-NULL also writes the base file (header, tokens, then
 * each chunk's rows as it is done) through save; the PPL then comes from llama.cpp's saving path
 * (the same up to float rounding). Returns 0 and *ret; WF_EINVAL (bad params, a token outside the
 * vocabulary), WF_ELIMIT (n_ctx past the engine's), the engine's, save's or progress's error,
 * -ENOMEM. The engine's sequence params->seq is empty afterwards. */
int wf_ppl_perplexity(struct wf_engine *engine, const int32_t *tokens, size_t n_tokens,
                      const struct wf_ppl_params *params, wf_ppl_write_fn save, void *save_arg,
                      struct wf_ppl_result *ret, struct wf_diag *diag);

/* Reads a base file's header and tokens through read. Errors: WF_EMAGIC (not such a file),
 * WF_ETRUNCATED (it ends early), WF_EFORMAT (sizes out of range, a token outside its vocabulary),
 * WF_ELIMIT (past the WF_PPL_MAX_* caps), read's error, -ENOMEM. */
int wf_ppl_base_read_header(wf_ppl_read_fn read, void *arg, struct wf_ppl_base *ret_base,
                            struct wf_diag *diag);
/* The whole file's size in bytes for this header (to refuse a truncated file before running). */
uint64_t wf_ppl_base_file_size(const struct wf_ppl_base *base);
/* Frees the tokens; accepts NULL and a zeroed base. */
void wf_ppl_base_fini(struct wf_ppl_base *base);

/* KL divergence of the engine's model against a base file whose header and tokens are base and
 * whose rows read continues to give (right after wf_ppl_base_read_header's bytes). Runs every chunk
 * of the file (or params->max_chunks). Returns 0 with *ret (ret->ppl: the model's own figures,
 * *ret_kld the rest); WF_EFORMAT (a base of another vocabulary or context: diag says which),
 * WF_ETRUNCATED (its rows end early), and the errors of wf_ppl_perplexity. */
int wf_ppl_kl_divergence(struct wf_engine *engine, const struct wf_ppl_base *base,
                         wf_ppl_read_fn read, void *read_arg, const struct wf_ppl_params *params,
                         struct wf_ppl_result *ret, struct wf_ppl_kld *ret_kld,
                         struct wf_diag *diag);

/* `wf-worker perplexity` (worker/perplexity_cli.c): argv[0] is "perplexity". Returns the exit
 * code: 0, 1 (the model, the files or the run failed), 2 (bad flags). */
int wf_worker_perplexity_main(int argc, char **argv);

#ifdef __cplusplus
}
#endif
#endif
