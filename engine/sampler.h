/* Token sampling with llama.cpp's semantics (release b10573, src/llama-sampling.cpp and
 * common/sampling.cpp's default chain), but with its own PRNG so that a seed means the same
 * draws on every machine and C library.
 *
 * The chain, in llama.cpp's order, each stage skipped at its neutral value:
 *   1. repetition penalty: every distinct token among the last repeat_last_n accepted tokens has
 *      its logit divided by repeat_penalty when positive, multiplied when zero or negative
 *      (neutral: 1);
 *   2. top-k: the k largest logits (neutral: 0);
 *   3. top-p: the smallest prefix, by descending probability, whose probability sums to at least
 *      top_p (the token that crosses it is kept; neutral: 1);
 *   4. min-p: tokens whose probability is at least min_p times the largest one's, i.e. whose logit
 *      is at least max + log(min_p) (neutral: 0);
 *   5. temperature: logits divided by it, then softmax and one draw.
 * A temperature <= 0 is greedy: the penalties still apply (as llama.cpp's chain, where a zero
 * temperature keeps only the largest logit), then the largest logit wins; ties go to the lowest
 * token id, as do ties in every sort above, so the outcome never depends on a sort's stability.
 *
 * The draw: u = the next 53 bits of a SplitMix64 stream seeded with seed, as a double in [0, 1);
 * the first candidate whose cumulative probability exceeds u, candidates in the order the chain
 * left them (descending logit after top-k or top-p, else by id). Probability
 * sums run in double over float exp(): only expf() may differ between C libraries, by an ulp.
 *
 * Not thread-safe: one sampler per sequence. */
#ifndef WF_ENGINE_SAMPLER_H
#define WF_ENGINE_SAMPLER_H

#include "base/diag.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define WF_SAMPLER_LAST_N_MAX 8192u /* repeat_last_n's cap */

struct wf_sampler_params {
	float temperature;      /* <= 0: greedy */
	int32_t top_k;          /* 0: off; < 0 refused */
	float top_p;            /* in [0, 1]; 1: off */
	float min_p;            /* in [0, 1]; 0: off */
	float repeat_penalty;   /* > 0; 1: off */
	uint32_t repeat_last_n; /* tokens of history the penalty looks at; 0: off */
	uint64_t seed;
};

/* Greedy, every filter off, repeat_last_n 64 (llama.cpp's), seed 0. */
void wf_sampler_params_default(struct wf_sampler_params *ret_params);

/* WF_EINVAL, with diag naming the parameter, for a NaN or infinite float, top_k < 0, top_p or
 * min_p outside [0, 1], repeat_penalty <= 0, or repeat_last_n above WF_SAMPLER_LAST_N_MAX;
 * else 0. */
int wf_sampler_params_check(const struct wf_sampler_params *params, struct wf_diag *diag);

struct wf_sampler;

/* A sampler over n_vocab logits (> 0). Errors: those of wf_sampler_params_check, WF_EINVAL for
 * n_vocab 0, -ENOMEM. */
int wf_sampler_create(const struct wf_sampler_params *params, uint32_t n_vocab,
                      struct wf_sampler **ret_sampler, struct wf_diag *diag);
/* Accepts NULL. */
void wf_sampler_destroy(struct wf_sampler *sampler);

/* Adds a token to the penalty's history (prompt tokens too, as llama.cpp's server does). Ids
 * outside [0, n_vocab) are ignored. */
void wf_sampler_accept(struct wf_sampler *sampler, int32_t token);

/* Picks the next token from n_vocab logits (not modified; NaN logits are never picked unless
 * every logit is NaN). Does not accept it: call wf_sampler_accept with the result. */
int32_t wf_sampler_sample(struct wf_sampler *sampler, const float *logits);

#ifdef __cplusplus
}
#endif
#endif
