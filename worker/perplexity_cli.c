/* wf-worker perplexity --model FILE --file TEXT [--ctx N] [--chunks N] [--threads N]
 *                     [--kv-type f16|f32] [--save-base FILE | --kl-base FILE] [--json]
 *
 * llama-perplexity offline (worker/perplexity.h has the method and the base file's layout): the
 * text is read whole, one trailing newline dropped, and tokenized as llama.cpp's
 * common_tokenize(ctx, text, add_special = true, parse_special = false) does; the running PPL
 * goes to stderr after each chunk ("[1]12.3456,[2]..."), the final estimate to stdout (stderr
 * with --json, whose one JSON object then is stdout). --save-base writes llama.cpp's
 * --kl-divergence-base file (under a temporary name, renamed when complete); --kl-base reads one
 * and prints what llama-perplexity --kl-divergence prints, the tokens taken from the file. */
#include "worker/perplexity.h"
#include "worker/ppljob.h"

#include "base/diag.h"
#include "base/error.h"
#include "base/units.h"
#include "engine/engine.h"
#include "engine/tokenizer.h"
#include "model/model.h"
#include "worker/weights.h"
#include "worker/wengine.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define TEXT_MAX (1ull << 30) /* bytes of text read */

static const char usage[] =
    "usage: wf-worker perplexity --model FILE --file TEXT [--ctx N (512)] [--chunks N]\n"
    "                            [--threads N] [--kv-type f16|f32]\n"
    "                            [--save-base FILE | --kl-base FILE] [--json]\n"
    "       (with --kl-base the tokens and the context come from the base file: --file and\n"
    "        --ctx are optional)\n";

struct cli {
	const char *model, *file, *save_base, *kl_base;
	uint32_t ctx, chunks, threads;
	bool ctx_set, json;
	enum wf_engine_kv_type kv_type;
	/* the running estimates, for --json */
	double *chunk_ppl;
	uint32_t n_chunk_ppl;
};

static int parse_u32(const char *s, uint32_t *ret)
{
	uint64_t v;
	int rc = wf_parse_uint(s, UINT32_MAX, &v);
	if (rc == 0)
		*ret = (uint32_t)v;
	return rc;
}

/* Exit code 2 on bad flags, with the usage. */
static int parse_args(int argc, char **argv, struct cli *c)
{
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		int bad = 0;
		if (strcmp(a, "--json") == 0) {
			c->json = true;
			continue;
		}
		if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
			fputs(usage, stdout);
			return 1;
		}
		if (!v) {
			bad = 1;
		} else if (strcmp(a, "--model") == 0) {
			c->model = v;
		} else if (strcmp(a, "--file") == 0) {
			c->file = v;
		} else if (strcmp(a, "--save-base") == 0) {
			c->save_base = v;
		} else if (strcmp(a, "--kl-base") == 0) {
			c->kl_base = v;
		} else if (strcmp(a, "--ctx") == 0) {
			bad = parse_u32(v, &c->ctx) < 0 || c->ctx < WF_PPL_MIN_CTX ||
			      c->ctx > WF_PPL_MAX_CTX;
			c->ctx_set = true;
		} else if (strcmp(a, "--chunks") == 0) {
			bad = parse_u32(v, &c->chunks) < 0 || c->chunks == 0;
		} else if (strcmp(a, "--threads") == 0) {
			bad = parse_u32(v, &c->threads) < 0 || c->threads == 0 ||
			      c->threads > WF_ENGINE_MAX_THREADS;
		} else if (strcmp(a, "--kv-type") == 0) {
			if (strcmp(v, "f16") == 0)
				c->kv_type = WF_ENGINE_KV_F16;
			else if (strcmp(v, "f32") == 0)
				c->kv_type = WF_ENGINE_KV_F32;
			else
				bad = 1;
		} else {
			bad = 1;
		}
		if (bad) {
			fprintf(stderr, "wf-worker perplexity: bad argument '%s%s%s'\n%s", a,
			        v ? " " : "", v ? v : "", usage);
			return 2;
		}
		i++;
	}
	const char *why = !c->model ? "--model is required"
	                  : c->save_base && c->kl_base
	                      ? "--save-base and --kl-base exclude each other"
	                  : !c->file && !c->kl_base ? "--file is required"
	                                            : NULL;
	if (why) {
		fprintf(stderr, "wf-worker perplexity: %s\n%s", why, usage);
		return 2;
	}
	return 0;
}

/* The text file, whole (NUL-terminated), its one trailing newline dropped as llama.cpp's -f. */
static int read_text(const char *path, char **ret, size_t *ret_len, struct wf_diag *d)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return wf_diag_set(d, -errno, "%s: %s", path, strerror(errno));
	struct stat st;
	char *buf = NULL;
	int rc = 0;
	if (fstat(fd, &st) < 0) {
		rc = wf_diag_set(d, -errno, "%s: %s", path, strerror(errno));
		goto out;
	}
	if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size > TEXT_MAX) {
		rc = wf_diag_set(d, WF_EINVAL, "%s: not a regular file of at most %llu bytes", path,
		                 (unsigned long long)TEXT_MAX);
		goto out;
	}
	const size_t len = (size_t)st.st_size;
	buf = malloc(len + 1);
	if (!buf) {
		rc = wf_diag_set(d, -ENOMEM, "%s", path);
		goto out;
	}
	size_t got = 0;
	while (got < len) {
		ssize_t n = read(fd, buf + got, len - got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			rc = wf_diag_set(d, n < 0 ? -errno : WF_ECHANGED, "%s: %s", path,
			                 n < 0 ? strerror(errno) : "shrank while read");
			goto out;
		}
		got += (size_t)n;
	}
	buf[got] = 0;
	if (got && buf[got - 1] == '\n')
		buf[--got] = 0;
	*ret = buf;
	*ret_len = got;
	buf = NULL;
out:
	free(buf);
	close(fd);
	return rc;
}

static int on_chunk(void *arg, const struct wf_ppl_progress *p)
{
	struct cli *c = arg;
	if (!c->chunk_ppl && p->n_chunks) {
		c->chunk_ppl = calloc(p->n_chunks, sizeof(double));
		c->n_chunk_ppl = c->chunk_ppl ? p->n_chunks : 0;
	}
	if (c->chunk_ppl && p->chunk <= c->n_chunk_ppl)
		c->chunk_ppl[p->chunk - 1] = p->ppl;
	if (!p->kld) {
		fprintf(stderr, "[%u]%.4f,", p->chunk, p->ppl);
		if (p->chunk == p->n_chunks)
			fputc('\n', stderr);
		return 0;
	}
	const struct wf_ppl_kld *k = p->kld;
	if (p->chunk == 1)
		fprintf(stderr,
		        "chunk             PPL               ln(PPL(Q)/PPL(base))          KL "
		        "Divergence              Δp RMS            Same top p\n");
	fprintf(stderr,
	        "%4u    %9.4f ± %9.4f    %10.5f ± %10.5f    %10.5f ± %10.5f    %6.3f ± %6.3f %%"
	        "    %6.3f ± %6.3f %%\n",
	        p->chunk, k->ppl.val, k->ppl.err, k->ln_ratio.val, k->ln_ratio.err, k->kld.val,
	        k->kld.err, 100.0 * k->rms_p_diff.val, 100.0 * k->rms_p_diff.err,
	        100.0 * k->same_top.val, 100.0 * k->same_top.err);
	return 0;
}

/* llama-perplexity --kl-divergence's closing statistics, its format to the byte. */
static void print_kld(FILE *f, const struct wf_ppl_kld *k)
{
	static const char *const kl[WF_PPL_KLD_NQ] = {"Maximum KLD", "99.9%   KLD", "99.0%   KLD",
	                                              "95.0%   KLD", "90.0%   KLD", "Median  KLD",
	                                              "10.0%   KLD", " 5.0%   KLD", " 1.0%   KLD",
	                                              " 0.1%   KLD", "Minimum KLD"};
	static const char *const dl[WF_PPL_DP_NQ] = {
	    "Maximum Δp", "99.9%   Δp", "99.0%   Δp", "95.0%   Δp", "90.0%   Δp",
	    "75.0%   Δp", "Median  Δp", "25.0%   Δp", "10.0%   Δp", " 5.0%   Δp",
	    " 1.0%   Δp", " 0.1%   Δp", "Minimum Δp"};
	fprintf(f, "====== Perplexity statistics ======\n");
	fprintf(f, "Mean PPL(Q)                   : %10.6f ± %10.6f\n", k->ppl.val, k->ppl.err);
	fprintf(f, "Mean PPL(base)                : %10.6f ± %10.6f\n", k->ppl_base.val,
	        k->ppl_base.err);
	fprintf(f, "Cor(ln(PPL(Q)), ln(PPL(base))): %6.2f%%\n", 100.0 * k->cor);
	fprintf(f, "Mean ln(PPL(Q)/PPL(base))     : %10.6f ± %10.6f\n", k->ln_ratio.val,
	        k->ln_ratio.err);
	fprintf(f, "Mean PPL(Q)/PPL(base)         : %10.6f ± %10.6f\n", k->ratio.val, k->ratio.err);
	fprintf(f, "Mean PPL(Q)-PPL(base)         : %10.6f ± %10.6f\n", k->diff.val, k->diff.err);
	fprintf(f, "\n====== KL divergence statistics ======\n");
	fprintf(f, "Mean    KLD: %10.6f ± %10.6f\n", k->kld.val, k->kld.err);
	for (int i = 0; i < WF_PPL_KLD_NQ; i++)
		fprintf(f, "%s: %10.6f\n", kl[i], (double)k->kld_q[i]);
	fprintf(f, "\n====== Token probability statistics ======\n");
	fprintf(f, "Mean    Δp: %6.3f ± %5.3f %%\n", 100.0 * k->p_diff.val, 100.0 * k->p_diff.err);
	for (int i = 0; i < WF_PPL_DP_NQ; i++)
		fprintf(f, "%s: %6.3f%%\n", dl[i], 100.0 * (double)k->p_diff_q[i]);
	fprintf(f, "RMS Δp    : %6.3f ± %5.3f %%\n", 100.0 * k->rms_p_diff.val,
	        100.0 * k->rms_p_diff.err);
	fprintf(f, "Same top p: %6.3f ± %5.3f %%\n", 100.0 * k->same_top.val,
	        100.0 * k->same_top.err);
}

/* JSON: a string, and a number (null where not finite). */
static void json_str(const char *s)
{
	putchar('"');
	for (; *s; s++) {
		const unsigned char ch = (unsigned char)*s;
		if (ch == '"' || ch == '\\')
			printf("\\%c", ch);
		else if (ch < 0x20)
			printf("\\u%04x", ch);
		else
			putchar(ch);
	}
	putchar('"');
}

static void json_num(double v)
{
	if (isfinite(v))
		printf("%.10g", v);
	else
		printf("null");
}

static void json_est(const char *name, struct wf_ppl_est e)
{
	printf(",\"%s\":", name);
	json_num(e.val);
	printf(",\"%s_err\":", name);
	json_num(e.err);
}

static void print_json(const struct cli *c, uint32_t n_ctx, const struct wf_ppl_result *r,
                       const struct wf_ppl_kld *k)
{
	printf("{\"model\":");
	json_str(c->model);
	printf(",\"mode\":\"%s\",\"ctx\":%u,\"chunks\":%u,\"tokens_scored\":%llu,\"ppl\":",
	       k ? "kl-divergence" : "perplexity", n_ctx, r->n_chunks,
	       (unsigned long long)r->n_scored);
	json_num(r->ppl);
	printf(",\"ppl_err\":");
	if (r->has_err)
		json_num(r->ppl_err);
	else
		printf("null");
	printf(",\"seconds\":%.3f,\"chunk_ppl\":[", r->seconds);
	for (uint32_t i = 0; i < c->n_chunk_ppl; i++) {
		printf("%s", i ? "," : "");
		json_num(c->chunk_ppl[i]);
	}
	printf("]");
	if (c->save_base) {
		printf(",\"saved_base\":");
		json_str(c->save_base);
	}
	if (k) {
		static const float kq[WF_PPL_KLD_NQ] = WF_PPL_KLD_QUANTILES;
		static const float dq[WF_PPL_DP_NQ] = WF_PPL_DP_QUANTILES;
		printf(",\"kl_base\":");
		json_str(c->kl_base);
		printf(",\"has_stats\":%s", k->has_stats ? "true" : "false");
		json_est("ppl_base", k->ppl_base);
		printf(",\"cor\":");
		json_num(k->cor);
		json_est("ln_ratio", k->ln_ratio);
		json_est("ratio", k->ratio);
		json_est("diff", k->diff);
		json_est("kld", k->kld);
		json_est("p_diff", k->p_diff);
		json_est("rms_p_diff", k->rms_p_diff);
		json_est("same_top", k->same_top);
		printf(",\"kld_quantiles\":{");
		for (int i = 0; i < WF_PPL_KLD_NQ; i++) {
			printf("%s\"%g\":", i ? "," : "", (double)kq[i]);
			json_num(k->kld_q[i]);
		}
		printf("},\"p_diff_quantiles\":{");
		for (int i = 0; i < WF_PPL_DP_NQ; i++) {
			printf("%s\"%g\":", i ? "," : "", (double)dq[i]);
			json_num(k->p_diff_q[i]);
		}
		printf("}");
	}
	printf("}\n");
}

int wf_worker_perplexity_main(int argc, char **argv)
{
	struct cli c = {.ctx = WF_PPL_DEFAULT_CTX, .kv_type = WF_ENGINE_KV_F16};
	int rc = parse_args(argc, argv, &c);
	if (rc)
		return rc == 1 ? 0 : rc;

	struct wf_diag d = {{0}};
	struct wf_model *m = NULL;
	struct wf_weight_view view = {0};
	struct wf_worker_engine we = {0};
	struct wf_tokenizer *tok = NULL;
	char *text = NULL;
	size_t text_len = 0;
	const char *what = c.model; /* what an error message starts with */

	/* The base file's context sizes the engine; a bad file is refused before anything runs. */
	if (c.kl_base) {
		uint32_t base_ctx = 0;
		what = c.kl_base;
		if ((rc = wf_ppl_job_base_ctx(c.kl_base, &base_ctx, &d)) < 0)
			goto out;
		if (c.ctx_set && c.ctx != base_ctx) {
			rc =
			    wf_diag_set(&d, WF_EFORMAT,
			                "base file was computed with a context of %u, not --ctx %u",
			                base_ctx, c.ctx);
			goto out;
		}
		c.ctx = base_ctx;
	}
	if (c.file && !c.kl_base) {
		what = c.file;
		if ((rc = read_text(c.file, &text, &text_len, &d)) < 0)
			goto out;
	}

	what = c.model;
	if ((rc = wf_model_open(c.model, &m, &d)) < 0 ||
	    (rc = wf_tokenizer_create(&m->kv, &tok, &d)) < 0 ||
	    (rc = wf_weight_view_map_files(m, &view, &d)) < 0)
		goto out;
	struct wf_engine_config cfg = {
	    .n_ctx = c.ctx, .n_seq_max = 1, .n_threads = c.threads, .kv_type = c.kv_type};
	const struct wf_engine_weights weights = wf_weight_view_engine(&view);
	if ((rc = wf_worker_engine_open_files(m, &weights, &cfg, false, &we, &d)) < 0)
		goto out;
	struct wf_ppl_job job = {.text = text,
	                         .text_len = text_len,
	                         .kl_base = c.kl_base,
	                         .save_base = c.kl_base ? NULL : c.save_base,
	                         .n_ctx = c.ctx,
	                         .max_chunks = c.chunks,
	                         .seq = 0,
	                         .progress = on_chunk,
	                         .progress_arg = &c};
	what = c.kl_base ? c.kl_base : c.save_base ? c.save_base : c.file;
	if ((rc = wf_ppl_job_run(we.engine, tok, &job, &d)) < 0)
		goto out;
	const struct wf_ppl_result r = job.result;
	FILE *human = c.json ? stderr : stdout;
	if (c.kl_base) {
		fputc('\n', stderr);
		if (job.kld.has_stats)
			print_kld(human, &job.kld);
		else
			fprintf(stderr,
			        "(fewer than 100 tokens scored: no statistics, as llama.cpp)\n");
	} else if (r.has_err) {
		fprintf(human, "Final estimate: PPL = %.4f +/- %.5f\n", r.ppl, r.ppl_err);
	} else {
		fprintf(stderr, "Unexpected negative standard deviation of log(prob)\n");
	}
	if (c.json)
		print_json(&c, c.ctx, &r, c.kl_base ? &job.kld : NULL);
	rc = 0;
out:
	if (rc < 0)
		fprintf(stderr, "wf-worker perplexity: %s: %s\n", what, wf_diag_str(&d, rc));
	free(c.chunk_ppl);
	free(text);
	wf_worker_engine_close(&we);
	wf_tokenizer_destroy(tok);
	wf_weight_view_release(&view);
	wf_model_close(m);
	return rc < 0 ? 1 : 0;
}
