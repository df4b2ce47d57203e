/* Perplexity and KL divergence, llama-perplexity's method (worker/perplexity.h). Each scoring
 * function below names the llama.cpp function (tools/perplexity/perplexity.cpp, release b10573)
 * it imitates, with its float and double steps in the same places, so that the figures agree
 * to the digits llama.cpp prints rather than merely to a tolerance: the exponentials in float
 * summed in double; in the saving and KL paths log(sum) rounded to float before it is used.
 * llama.cpp spreads a chunk's tokens over threads and adds their partial sums in the order they
 * finish; we add them in token order (the sums differ in the last bits of a double).
 *
 * A chunk is one decode of n_ctx tokens with logits wanted from position n_ctx/2 on (the engine
 * cuts it into its micro-batches), llama.cpp's -b n_ctx; the sequence is forgotten before each
 * chunk (llama_memory_clear). */
#include "worker/perplexity.h"

#include "base/error.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* llama.cpp's nearest_int: round to nearest (ties to even) through the float's mantissa, for
 * |x| < 2^22. */
static inline int nearest_int(float fval)
{
	float val = fval + 12582912.f;
	int i;
	memcpy(&i, &val, sizeof(int));
	return (i & 0x007fffff) - 0x00400000;
}

/* Row length of the base file's log-probabilities in uint16 (llama.cpp's nv). */
static size_t row_len(uint32_t n_vocab)
{
	return 2 * (((size_t)n_vocab + 1) / 2) + 4;
}

/* llama.cpp's log_softmax(n_vocab, logits, tok): the token's log-probability, in double. */
static double log_softmax(uint32_t n_vocab, const float *logits, int32_t tok)
{
	float max_logit = logits[0];
	for (uint32_t i = 1; i < n_vocab; i++)
		max_logit = logits[i] > max_logit ? logits[i] : max_logit;
	double sum_exp = 0.0;
	for (uint32_t i = 0; i < n_vocab; i++)
		sum_exp += expf(logits[i] - max_logit);
	return (double)(logits[tok] - max_logit) - log(sum_exp);
}

/* llama.cpp's log_softmax(n_vocab, logits, log_prob, tok): writes the row of the base file and
 * returns the token's negative log-likelihood. */
static double log_softmax_save(uint32_t n_vocab, const float *logits, uint16_t *log_prob,
                               int32_t tok)
{
	float max_logit = logits[0], min_logit = logits[0];
	for (uint32_t i = 1; i < n_vocab; i++) {
		max_logit = logits[i] > max_logit ? logits[i] : max_logit;
		min_logit = logits[i] < min_logit ? logits[i] : min_logit;
	}
	min_logit = min_logit > max_logit - 16 ? min_logit : max_logit - 16;
	double sum_exp = 0.0;
	for (uint32_t i = 0; i < n_vocab; i++)
		sum_exp += expf(logits[i] - max_logit);
	const float log_sum_exp = (float)log(sum_exp);
	const float min_log_prob = min_logit - max_logit - log_sum_exp;
	const float scale = (max_logit - min_logit) / 65535.f;
	memcpy(log_prob, &scale, sizeof(float));
	memcpy(log_prob + 2, &min_log_prob, sizeof(float));
	log_prob += 4;
	if (scale != 0.0f) {
		const float inv_scale = 1 / scale;
		for (uint32_t i = 0; i < n_vocab; i++)
			log_prob[i] =
			    logits[i] > min_logit
			        ? (uint16_t)nearest_int(inv_scale * (logits[i] - min_logit))
			        : 0;
	} else {
		memset(log_prob, 0, n_vocab * sizeof(uint16_t));
	}
	if (n_vocab % 2)
		log_prob[n_vocab] = 0;
	return (double)(max_logit + log_sum_exp - logits[tok]);
}

/* llama.cpp's kl_divergence_result. */
struct kld_sums {
	double sum_nll, sum_nll2, sum_nll_base, sum_nll_base2, sum_nll_nll_base;
	double sum_kld, sum_kld2, sum_p_diff, sum_p_diff2, sum_p_diff4;
	float max_p_diff;
	size_t n_same_top, count;
};

/* llama.cpp's log_softmax(n_vocab, logits, base_log_prob, tok, kld): adds one token to the sums
 * and gives its KL divergence and p_diff. */
static void log_softmax_kld(uint32_t n_vocab, const float *logits, const uint16_t *base_log_prob,
                            int32_t tok, struct kld_sums *kld, float *ret_kld, float *ret_p_diff)
{
	float max_logit = logits[0];
	uint32_t imax = 0;
	for (uint32_t i = 1; i < n_vocab; i++) {
		if (logits[i] > max_logit) {
			max_logit = logits[i];
			imax = i;
		}
	}
	double sum_exp = 0.0;
	for (uint32_t i = 0; i < n_vocab; i++)
		sum_exp += expf(logits[i] - max_logit);
	const float log_sum_exp = (float)log(sum_exp);
	float scale, min_log_prob;
	memcpy(&scale, base_log_prob, sizeof(float));
	memcpy(&min_log_prob, base_log_prob + 2, sizeof(float));
	base_log_prob += 4;

	const float nll = max_logit + log_sum_exp - logits[tok];
	kld->sum_nll += nll;
	kld->sum_nll2 += nll * nll;

	const float nll_base = -(scale * base_log_prob[tok] + min_log_prob);
	kld->sum_nll_base += nll_base;
	kld->sum_nll_base2 += nll_base * nll_base;

	kld->sum_nll_nll_base += nll * nll_base;

	max_logit += log_sum_exp;
	double sum = 0;
	uint32_t imax_base = 0;
	float p_log_base_max = 0;
	for (uint32_t i = 0; i < n_vocab; i++) {
		const float p_log_base = scale * base_log_prob[i] + min_log_prob;
		if (i == 0 || p_log_base > p_log_base_max) {
			p_log_base_max = p_log_base;
			imax_base = i;
		}
		if (p_log_base > -16.f) {
			const float p_base = expf(p_log_base);
			sum += p_base * (p_log_base - logits[i] + max_logit);
		}
	}
	kld->sum_kld += sum;
	kld->sum_kld2 += sum * sum;
	kld->count++;
	if (imax == imax_base)
		kld->n_same_top++;

	const float p_base = expf(-nll_base);
	const float p = expf(-nll);
	const float p_diff = p - p_base;
	kld->sum_p_diff += p_diff;
	const double p_diff2 = p_diff * p_diff;
	kld->sum_p_diff2 += p_diff2;
	kld->sum_p_diff4 += p_diff2 * p_diff2;
	const float a = fabsf(p_diff);
	kld->max_p_diff = a > kld->max_p_diff ? a : kld->max_p_diff;
	*ret_kld = (float)sum;
	*ret_p_diff = p_diff;
}

/* kl_divergence()'s mean_and_uncertainty and covariance lambdas. */
static struct wf_ppl_est mean_and_uncertainty(double sum, double sum2, size_t count)
{
	if (count < 1)
		return (struct wf_ppl_est){0, 0};
	double f = sum / (double)count;
	double df = sum2 / (double)count - f * f;
	df = df > 0 && count > 10 ? sqrt(df / (double)(count - 1)) : 0.;
	return (struct wf_ppl_est){f, df};
}

static double covariance(double suma, double sumb, double sumab, size_t count)
{
	if (count < 10)
		return 0.0;
	const double n = (double)count;
	double var = sumab / n - (suma / n) * (sumb / n);
	var /= n - 1;
	return var;
}

/* The figures kl_divergence() prints from the sums (per chunk, and at the end). */
static void kld_figures(const struct kld_sums *k, struct wf_ppl_kld *r)
{
	const struct wf_ppl_est log_ppl = mean_and_uncertainty(k->sum_nll, k->sum_nll2, k->count);
	r->ppl.val = exp(log_ppl.val);
	r->ppl.err = r->ppl.val * log_ppl.err;
	const struct wf_ppl_est log_ppl_base =
	    mean_and_uncertainty(k->sum_nll_base, k->sum_nll_base2, k->count);
	r->ppl_base.val = exp(log_ppl_base.val);
	r->ppl_base.err = r->ppl_base.val * log_ppl_base.err;
	const double log_ppl_cov =
	    covariance(k->sum_nll, k->sum_nll_base, k->sum_nll_nll_base, k->count);
	r->cor = log_ppl_cov / (log_ppl.err * log_ppl_base.err);
	r->ln_ratio.val = log_ppl.val - log_ppl_base.val;
	r->ln_ratio.err = sqrt(log_ppl.err * log_ppl.err + log_ppl_base.err * log_ppl_base.err -
	                       2.0 * log_ppl_cov);
	r->ratio.val = exp(r->ln_ratio.val);
	r->ratio.err = r->ratio.val * r->ln_ratio.err;
	const double ppl_cov = r->ppl.val * r->ppl_base.val * log_ppl_cov;
	r->diff.val = r->ppl.val - r->ppl_base.val;
	r->diff.err =
	    sqrt(r->ppl.err * r->ppl.err + r->ppl_base.err * r->ppl_base.err - 2.0 * ppl_cov);
	r->kld = mean_and_uncertainty(k->sum_kld, k->sum_kld2, k->count);
	r->p_diff = mean_and_uncertainty(k->sum_p_diff, k->sum_p_diff2, k->count);
	const struct wf_ppl_est mse =
	    mean_and_uncertainty(k->sum_p_diff2, k->sum_p_diff4, k->count);
	r->rms_p_diff.val = sqrt(mse.val);
	r->rms_p_diff.err = 0.5 / r->rms_p_diff.val * mse.err;
	const double n = (double)k->count;
	r->same_top.val = (double)k->n_same_top / n;
	r->same_top.err = sqrt(r->same_top.val * (1 - r->same_top.val) / (n - 1));
	r->has_stats = k->count >= 100;
}

static int cmp_float(const void *a, const void *b)
{
	const float x = *(const float *)a, y = *(const float *)b;
	return (x > y) - (x < y);
}

/* kl_divergence()'s percentile lambda (its arithmetic in float), and its median. */
static float percentile(const float *v, size_t n, float fraction)
{
	if (fraction <= 0)
		return v[0];
	if (fraction >= 1)
		return v[n - 1];
	float p = fraction * (float)(n - 1);
	size_t ip = (size_t)p;
	p -= (float)ip;
	return (1 - p) * v[ip] + p * v[ip + 1 < n ? ip + 1 : n - 1];
}

static float median(const float *v, size_t n)
{
	return n % 2 == 0 ? 0.5f * (v[n / 2] + v[n / 2 - 1]) : v[n / 2];
}

static void quantiles(float *v, size_t n, const float *fractions, size_t nq, float *ret)
{
	qsort(v, n, sizeof(float), cmp_float);
	for (size_t i = 0; i < nq; i++)
		ret[i] = fractions[i] == 0.5f ? median(v, n) : percentile(v, n, fractions[i]);
}

/* One run's buffers: a chunk's batch and the logits of its scored half. */
struct run {
	struct wf_engine *e;
	const struct wf_ppl_params *p;
	uint32_t n_ctx, first, n_rows, n_vocab;
	int32_t *tok;
	uint32_t *pos, *seq;
	bool *want;
	float *logits; /* (n_ctx - first) rows of n_vocab */
	double t0;
};

static void run_fini(struct run *r)
{
	free(r->tok);
	free(r->pos);
	free(r->seq);
	free(r->want);
	free(r->logits);
}

static int run_init(struct run *r, struct wf_engine *e, const struct wf_ppl_params *p,
                    uint32_t n_ctx, struct wf_diag *diag)
{
	memset(r, 0, sizeof(*r));
	struct wf_engine_info info;
	wf_engine_get_info(e, &info);
	if (n_ctx < WF_PPL_MIN_CTX || n_ctx > WF_PPL_MAX_CTX)
		return wf_diag_set(diag, WF_EINVAL, "context of %u tokens: must be %u to %u", n_ctx,
		                   WF_PPL_MIN_CTX, WF_PPL_MAX_CTX);
	if (n_ctx > info.n_ctx)
		return wf_diag_set(diag, WF_ELIMIT,
		                   "context of %u tokens exceeds the engine's context of %u", n_ctx,
		                   info.n_ctx);
	if (p->seq >= info.n_seq_max)
		return wf_diag_set(diag, WF_EINVAL, "sequence %u is out of range (%u sequences)",
		                   p->seq, info.n_seq_max);
	if (p->add_bos && (p->bos < 0 || (uint32_t)p->bos >= info.n_vocab))
		return wf_diag_set(diag, WF_EINVAL, "BOS %d is outside the vocabulary of %u",
		                   p->bos, info.n_vocab);
	r->e = e;
	r->p = p;
	r->n_ctx = n_ctx;
	r->first = n_ctx / 2;
	r->n_rows = n_ctx - 1 - r->first;
	r->n_vocab = info.n_vocab;
	r->tok = malloc(n_ctx * sizeof(*r->tok));
	r->pos = malloc(n_ctx * sizeof(*r->pos));
	r->seq = malloc(n_ctx * sizeof(*r->seq));
	r->want = malloc(n_ctx * sizeof(*r->want));
	r->logits = malloc((size_t)(n_ctx - r->first) * info.n_vocab * sizeof(float));
	if (!r->tok || !r->pos || !r->seq || !r->want || !r->logits) {
		run_fini(r);
		return wf_diag_set(diag, -ENOMEM, "perplexity buffers for a context of %u", n_ctx);
	}
	for (uint32_t i = 0; i < n_ctx; i++) {
		r->pos[i] = i;
		r->seq[i] = p->seq;
		r->want[i] = i >= r->first;
	}
	r->t0 = now_s();
	return 0;
}

static int check_tokens(const int32_t *tokens, size_t n, uint32_t n_vocab, struct wf_diag *diag)
{
	for (size_t i = 0; i < n; i++)
		if (tokens[i] < 0 || (uint32_t)tokens[i] >= n_vocab)
			return wf_diag_set(diag, WF_EINVAL,
			                   "token %d (at %zu) is outside the vocabulary of %u",
			                   tokens[i], i, n_vocab);
	return 0;
}

/* Runs one chunk of n_ctx tokens in a fresh sequence: r->logits gets the scored half's rows. */
static int run_chunk(struct run *r, const int32_t *chunk, struct wf_diag *diag)
{
	int rc = wf_engine_seq_truncate(r->e, r->p->seq, 0);
	if (rc < 0)
		return wf_diag_set(diag, rc, "sequence %u", r->p->seq);
	memcpy(r->tok, chunk, r->n_ctx * sizeof(*r->tok));
	if (r->p->add_bos)
		r->tok[0] = r->p->bos;
	const struct wf_engine_batch b = {r->n_ctx, r->tok, r->pos, r->seq, r->want};
	return wf_engine_decode(r->e, &b, r->logits, diag);
}

static int report(struct run *r, uint32_t chunk, uint32_t n_chunks, uint64_t n_scored, double ppl,
                  const struct wf_ppl_kld *kld)
{
	if (!r->p->progress)
		return 0;
	const struct wf_ppl_progress pr = {chunk, n_chunks, n_scored, ppl, now_s() - r->t0, kld};
	return r->p->progress(r->p->progress_arg, &pr);
}

static int write_header(wf_ppl_write_fn save, void *arg, uint32_t n_ctx, uint32_t n_vocab,
                        uint32_t n_chunks, const int32_t *tokens)
{
	char h[20];
	const int32_t v[3] = {(int32_t)n_ctx, (int32_t)n_vocab, (int32_t)n_chunks};
	memcpy(h, WF_PPL_MAGIC, 8);
	memcpy(h + 8, v, sizeof(v));
	int rc = save(arg, h, sizeof(h));
	if (rc == 0)
		rc = save(arg, tokens, (size_t)n_chunks * n_ctx * sizeof(int32_t));
	return rc;
}

int wf_ppl_perplexity(struct wf_engine *engine, const int32_t *tokens, size_t n_tokens,
                      const struct wf_ppl_params *params, wf_ppl_write_fn save, void *save_arg,
                      struct wf_ppl_result *ret, struct wf_diag *diag)
{
	struct run r;
	uint16_t *rows = NULL;
	int rc = run_init(&r, engine, params, params->n_ctx, diag);
	if (rc < 0)
		return rc;
	const uint32_t n_ctx = r.n_ctx;
	if (n_tokens < 2 * (size_t)n_ctx) {
		rc =
		    wf_diag_set(diag, WF_EINVAL,
		                "you need at least %u tokens to evaluate perplexity with a context "
		                "of %u: the text tokenizes to only %zu",
		                2 * n_ctx, n_ctx, n_tokens);
		goto out;
	}
	size_t n_max = n_tokens / n_ctx;
	if (save && n_max * n_ctx > WF_PPL_MAX_TOKENS)
		n_max = WF_PPL_MAX_TOKENS / n_ctx;
	if (n_max > UINT32_MAX)
		n_max = UINT32_MAX;
	const uint32_t n_chunks =
	    (uint32_t)(params->max_chunks && params->max_chunks < n_max ? params->max_chunks
	                                                                : n_max);
	if ((rc = check_tokens(tokens, (size_t)n_chunks * n_ctx, r.n_vocab, diag)) < 0)
		goto out;
	const size_t nv = row_len(r.n_vocab);
	if (save) {
		rows = malloc((size_t)r.n_rows * nv * sizeof(*rows));
		if (!rows) {
			rc = wf_diag_set(diag, -ENOMEM, "log-probability rows");
			goto out;
		}
		if ((rc = write_header(save, save_arg, n_ctx, r.n_vocab, n_chunks, tokens)) < 0) {
			wf_diag_set(diag, rc, "writing the base file's header");
			goto out;
		}
	}
	double nll = 0.0, nll2 = 0.0;
	uint64_t count = 0;
	for (uint32_t i = 0; i < n_chunks; i++) {
		const int32_t *chunk = tokens + (size_t)i * n_ctx;
		if ((rc = run_chunk(&r, chunk, diag)) < 0)
			goto out;
		const int32_t *next = chunk + r.first + 1;
		for (uint32_t j = 0; j < r.n_rows; j++) {
			const float *row = r.logits + (size_t)j * r.n_vocab;
			const double v =
			    save ? log_softmax_save(r.n_vocab, row, rows + j * nv, next[j])
			         : -log_softmax(r.n_vocab, row, next[j]);
			nll += v;
			nll2 += v * v;
		}
		count += r.n_rows;
		if (save &&
		    (rc = save(save_arg, rows, (size_t)r.n_rows * nv * sizeof(*rows))) < 0) {
			wf_diag_set(diag, rc, "writing chunk %u of the base file", i + 1);
			goto out;
		}
		if ((rc = report(&r, i + 1, n_chunks, count, exp(nll / (double)count), NULL)) < 0) {
			wf_diag_set(diag, rc, "stopped after chunk %u", i + 1);
			goto out;
		}
	}
	/* perplexity()'s final estimate */
	nll2 /= (double)count;
	nll /= (double)count;
	const double ppl = exp(nll);
	nll2 -= nll * nll;
	const bool has_err = nll2 > 0;
	*ret =
	    (struct wf_ppl_result){.ppl = ppl,
	                           .ppl_err = has_err ? sqrt(nll2 / (double)(count - 1)) * ppl : 0,
	                           .has_err = has_err,
	                           .n_chunks = n_chunks,
	                           .n_scored = count,
	                           .seconds = now_s() - r.t0};
	rc = 0;
out:
	wf_engine_seq_truncate(engine, params->seq, 0);
	free(rows);
	run_fini(&r);
	return rc;
}

/* Reads exactly len bytes: 0, 1 when the file ends first, or read's error. */
static int read_exact(wf_ppl_read_fn read, void *arg, void *buf, size_t len)
{
	char *p = buf;
	while (len) {
		const ssize_t n = read(arg, p, len);
		if (n < 0)
			return (int)n;
		if (n == 0)
			return 1;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

int wf_ppl_base_read_header(wf_ppl_read_fn read, void *arg, struct wf_ppl_base *ret_base,
                            struct wf_diag *diag)
{
	char h[20];
	int rc = read_exact(read, arg, h, 8);
	if (rc < 0)
		return wf_diag_set(diag, rc, "reading the base file");
	if (rc > 0 || memcmp(h, WF_PPL_MAGIC, 8) != 0)
		return wf_diag_set(diag, WF_EMAGIC,
		                   "not a file of log-probabilities (llama-perplexity's "
		                   "--kl-divergence-base): no '_logits_' magic");
	rc = read_exact(read, arg, h + 8, 12);
	if (rc < 0)
		return wf_diag_set(diag, rc, "reading the base file");
	if (rc > 0)
		return wf_diag_set(diag, WF_ETRUNCATED, "base file ends in its header");
	int32_t v[3];
	memcpy(v, h + 8, sizeof(v));
	if (v[0] < (int32_t)WF_PPL_MIN_CTX || v[1] < 1 || v[2] < 1)
		return wf_diag_set(diag, WF_EFORMAT,
		                   "base file's header is out of range: n_ctx %d, n_vocab %d, "
		                   "n_chunk %d",
		                   v[0], v[1], v[2]);
	if ((uint32_t)v[0] > WF_PPL_MAX_CTX || (uint32_t)v[1] > WF_PPL_MAX_VOCAB ||
	    (uint64_t)v[0] * (uint64_t)v[2] > WF_PPL_MAX_TOKENS)
		return wf_diag_set(diag, WF_ELIMIT,
		                   "base file's header passes the caps: n_ctx %d (at most %u), "
		                   "n_vocab %d (%u), %llu tokens (%llu)",
		                   v[0], WF_PPL_MAX_CTX, v[1], WF_PPL_MAX_VOCAB,
		                   (unsigned long long)((uint64_t)v[0] * (uint64_t)v[2]),
		                   (unsigned long long)WF_PPL_MAX_TOKENS);
	const size_t n = (size_t)v[0] * (size_t)v[2];
	int32_t *tokens = malloc(n * sizeof(*tokens));
	if (!tokens)
		return wf_diag_set(diag, -ENOMEM, "%zu tokens of the base file", n);
	rc = read_exact(read, arg, tokens, n * sizeof(*tokens));
	if (rc != 0) {
		free(tokens);
		return rc < 0 ? wf_diag_set(diag, rc, "reading the base file")
		              : wf_diag_set(diag, WF_ETRUNCATED, "base file ends in its tokens");
	}
	for (size_t i = 0; i < n; i++) {
		if (tokens[i] < 0 || tokens[i] >= v[1]) {
			rc = wf_diag_set(
			    diag, WF_EFORMAT,
			    "base file's token %d (at %zu) is outside its vocabulary of %d",
			    tokens[i], i, v[1]);
			free(tokens);
			return rc;
		}
	}
	*ret_base = (struct wf_ppl_base){(uint32_t)v[0], (uint32_t)v[1], (uint32_t)v[2], tokens};
	return 0;
}

uint64_t wf_ppl_base_file_size(const struct wf_ppl_base *b)
{
	const uint64_t n_rows = b->n_ctx - 1 - b->n_ctx / 2;
	return 20 + 4ull * b->n_ctx * b->n_chunks +
	       2ull * row_len(b->n_vocab) * n_rows * b->n_chunks;
}

void wf_ppl_base_fini(struct wf_ppl_base *base)
{
	if (!base)
		return;
	free(base->tokens);
	base->tokens = NULL;
}

int wf_ppl_kl_divergence(struct wf_engine *engine, const struct wf_ppl_base *base,
                         wf_ppl_read_fn read, void *read_arg, const struct wf_ppl_params *params,
                         struct wf_ppl_result *ret, struct wf_ppl_kld *ret_kld,
                         struct wf_diag *diag)
{
	struct wf_engine_info info;
	wf_engine_get_info(engine, &info);
	if (base->n_vocab != info.n_vocab)
		return wf_diag_set(diag, WF_EFORMAT,
		                   "base file is of a vocabulary of %u tokens, the model's has %u",
		                   base->n_vocab, info.n_vocab);
	if (params->n_ctx && params->n_ctx != base->n_ctx)
		return wf_diag_set(diag, WF_EFORMAT,
		                   "base file was computed with a context of %u, not %u",
		                   base->n_ctx, params->n_ctx);
	struct run r;
	uint16_t *rows = NULL;
	float *kld_values = NULL, *p_diff_values = NULL;
	int rc = run_init(&r, engine, params, base->n_ctx, diag);
	if (rc < 0)
		return rc;
	const uint32_t n_ctx = r.n_ctx;
	const uint32_t n_chunks = params->max_chunks && params->max_chunks < base->n_chunks
	                              ? params->max_chunks
	                              : base->n_chunks;
	const size_t nv = row_len(r.n_vocab), n_values = (size_t)r.n_rows * n_chunks;
	rows = malloc((size_t)r.n_rows * nv * sizeof(*rows));
	kld_values = malloc(n_values * sizeof(float));
	p_diff_values = malloc(n_values * sizeof(float));
	if (!rows || !kld_values || !p_diff_values) {
		rc = wf_diag_set(diag, -ENOMEM, "KL divergence buffers");
		goto out;
	}
	struct kld_sums k = {0};
	struct wf_ppl_kld fig = {0};
	for (uint32_t i = 0; i < n_chunks; i++) {
		const int32_t *chunk = base->tokens + (size_t)i * n_ctx;
		if ((rc = run_chunk(&r, chunk, diag)) < 0)
			goto out;
		rc = read_exact(read, read_arg, rows, (size_t)r.n_rows * nv * sizeof(*rows));
		if (rc != 0) {
			rc = rc < 0 ? wf_diag_set(diag, rc, "reading the base file")
			            : wf_diag_set(diag, WF_ETRUNCATED,
			                          "base file ends in chunk %u's log-probabilities",
			                          i + 1);
			goto out;
		}
		const int32_t *next = chunk + r.first + 1;
		for (uint32_t j = 0; j < r.n_rows; j++) {
			const size_t at = (size_t)i * r.n_rows + j;
			log_softmax_kld(r.n_vocab, r.logits + (size_t)j * r.n_vocab, rows + j * nv,
			                next[j], &k, &kld_values[at], &p_diff_values[at]);
		}
		kld_figures(&k, &fig);
		if ((rc = report(&r, i + 1, n_chunks, k.count, fig.ppl.val, &fig)) < 0) {
			wf_diag_set(diag, rc, "stopped after chunk %u", i + 1);
			goto out;
		}
	}
	static const float kq[WF_PPL_KLD_NQ] = WF_PPL_KLD_QUANTILES;
	static const float dq[WF_PPL_DP_NQ] = WF_PPL_DP_QUANTILES;
	quantiles(kld_values, n_values, kq, WF_PPL_KLD_NQ, fig.kld_q);
	quantiles(p_diff_values, n_values, dq, WF_PPL_DP_NQ, fig.p_diff_q);
	*ret = (struct wf_ppl_result){.ppl = fig.ppl.val,
	                              .ppl_err = fig.ppl.err,
	                              .has_err = fig.ppl.err > 0,
	                              .n_chunks = n_chunks,
	                              .n_scored = k.count,
	                              .seconds = now_s() - r.t0};
	*ret_kld = fig;
	rc = 0;
out:
	wf_engine_seq_truncate(engine, params->seq, 0);
	free(rows);
	free(kld_values);
	free(p_diff_values);
	run_fini(&r);
	return rc;
}
