/* One perplexity or KL run with its files: see worker/ppljob.h. */
#include "worker/ppljob.h"

#include "base/error.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int fd_write(void *arg, const void *buf, size_t len)
{
	const int fd = *(const int *)arg;
	const char *p = buf;
	while (len) {
		ssize_t w = write(fd, p, len);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += w;
		len -= (size_t)w;
	}
	return 0;
}

static ssize_t fd_read(void *arg, void *buf, size_t len)
{
	const int fd = *(const int *)arg;
	for (;;) {
		ssize_t n = read(fd, buf, len);
		if (n >= 0 || errno != EINTR)
			return n < 0 ? -errno : n;
	}
}

/* Opens a base file, reads its header and tokens, and checks its size against them, so that a
 * truncated file is refused before anything runs. *ret_fd is left at the first row. */
static int open_base(const char *path, int *ret_fd, struct wf_ppl_base *ret_base,
                     struct wf_diag *diag)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
	struct stat st;
	if (fd < 0)
		return wf_diag_set(diag, -errno, "%s: %s", path, strerror(errno));
	int rc = 0;
	if (fstat(fd, &st) < 0)
		rc = wf_diag_set(diag, -errno, "%s: %s", path, strerror(errno));
	else if (!S_ISREG(st.st_mode))
		rc = wf_diag_set(diag, WF_EINVAL, "%s: not a regular file", path);
	if (rc == 0) {
		struct wf_diag d = {{0}};
		if ((rc = wf_ppl_base_read_header(fd_read, &fd, ret_base, &d)) < 0)
			wf_diag_set(diag, rc, "%s: %s", path, wf_diag_str(&d, rc));
	}
	if (rc == 0) {
		const uint64_t want = wf_ppl_base_file_size(ret_base);
		if ((uint64_t)st.st_size != want)
			rc = wf_diag_set(
			    diag, (uint64_t)st.st_size < want ? WF_ETRUNCATED : WF_EFORMAT,
			    "%s: base file has %llu bytes, its header (n_ctx %u, n_vocab %u, %u "
			    "chunks) says %llu",
			    path, (unsigned long long)st.st_size, ret_base->n_ctx,
			    ret_base->n_vocab, ret_base->n_chunks, (unsigned long long)want);
	}
	if (rc < 0) {
		wf_ppl_base_fini(ret_base);
		close(fd);
		return rc;
	}
	*ret_fd = fd;
	return 0;
}

int wf_ppl_job_base_ctx(const char *kl_base, uint32_t *ret_n_ctx, struct wf_diag *diag)
{
	struct wf_ppl_base b = {0};
	int fd = -1;
	int rc = open_base(kl_base, &fd, &b, diag);
	if (rc < 0)
		return rc;
	*ret_n_ctx = b.n_ctx;
	wf_ppl_base_fini(&b);
	close(fd);
	return 0;
}

/* The text's tokens as llama-perplexity makes them, and whether the vocabulary adds BOS (the
 * special tokens an empty text gets say so). */
static int tokenize(const struct wf_tokenizer *tok, const char *text, size_t len, int32_t **ret,
                    size_t *ret_n, bool *ret_add_bos, struct wf_diag *diag)
{
	int32_t *empty = NULL;
	size_t n_empty = 0;
	int rc = wf_tokenizer_encode(tok, "", 0, true, false, &empty, &n_empty, diag);
	if (rc < 0)
		return rc;
	const int32_t bos = wf_tokenizer_bos(tok), eos = wf_tokenizer_eos(tok);
	*ret_add_bos = n_empty > 0 && empty[0] == bos;
	if (n_empty > (size_t)*ret_add_bos && empty[n_empty - 1] == eos)
		rc = wf_diag_set(diag, WF_EUNSUPPORTED,
		                 "the vocabulary adds EOS to every text (add_eos_token), which "
		                 "llama-perplexity refuses too");
	free(empty);
	if (rc == 0 && text)
		rc = wf_tokenizer_encode(tok, text, len, true, false, ret, ret_n, diag);
	return rc;
}

/* A new base file: a temporary name beside path, renamed into place by save_commit. */
struct save {
	const char *path;
	char *tmp;
	int fd;
};

static int save_begin(struct save *s, const char *path, struct wf_diag *diag)
{
	*s = (struct save){.path = path, .fd = -1};
	if (asprintf(&s->tmp, "%s.tmp.XXXXXX", path) < 0) {
		s->tmp = NULL;
		return -ENOMEM;
	}
	s->fd = mkostemp(s->tmp, O_CLOEXEC);
	if (s->fd < 0) {
		int rc = wf_diag_set(diag, -errno, "%s: %s", s->tmp, strerror(errno));
		free(s->tmp);
		s->tmp = NULL;
		return rc;
	}
	return 0;
}

static int save_commit(struct save *s, struct wf_diag *diag)
{
	if (fsync(s->fd) < 0 || fchmod(s->fd, 0644) < 0)
		return wf_diag_set(diag, -errno, "%s: %s", s->tmp, strerror(errno));
	const int cr = close(s->fd);
	s->fd = -1;
	if (cr < 0 || rename(s->tmp, s->path) < 0)
		return wf_diag_set(diag, -errno, "%s: %s", s->path, strerror(errno));
	free(s->tmp);
	s->tmp = NULL;
	return 0;
}

static void save_abort(struct save *s)
{
	if (s->fd >= 0)
		close(s->fd);
	if (s->tmp) {
		unlink(s->tmp);
		free(s->tmp);
	}
	*s = (struct save){.fd = -1};
}

static int run_kl(struct wf_engine *engine, const struct wf_tokenizer *tok, struct wf_ppl_job *j,
                  struct wf_ppl_params *p, struct wf_diag *diag)
{
	struct wf_ppl_base base = {0};
	int fd = -1;
	bool add_bos = false;
	int rc = open_base(j->kl_base, &fd, &base, diag);
	if (rc == 0 && j->n_ctx && j->n_ctx != base.n_ctx)
		rc = wf_diag_set(diag, WF_EFORMAT,
		                 "%s: the base was computed with a context of %u, not %u",
		                 j->kl_base, base.n_ctx, j->n_ctx);
	if (rc == 0)
		rc = tokenize(tok, NULL, 0, NULL, NULL, &add_bos, diag);
	if (rc == 0) {
		p->n_ctx = j->n_ctx_used = base.n_ctx;
		p->add_bos = add_bos;
		j->n_chunks_planned =
		    j->max_chunks && j->max_chunks < base.n_chunks ? j->max_chunks : base.n_chunks;
		struct wf_diag d = {{0}};
		rc = wf_ppl_kl_divergence(engine, &base, fd_read, &fd, p, &j->result, &j->kld, &d);
		if (rc < 0)
			wf_diag_set(diag, rc, "%s: %s", j->kl_base, wf_diag_str(&d, rc));
	}
	if (fd >= 0)
		close(fd);
	wf_ppl_base_fini(&base);
	return rc;
}

static int run_ppl(struct wf_engine *engine, const struct wf_tokenizer *tok, struct wf_ppl_job *j,
                   struct wf_ppl_params *p, struct wf_diag *diag)
{
	int32_t *ids = NULL;
	size_t n = 0;
	bool add_bos = false;
	struct save sv = {.fd = -1};
	const uint32_t ctx = j->n_ctx ? j->n_ctx : WF_PPL_DEFAULT_CTX;
	int rc = tokenize(tok, j->text ? j->text : "", j->text_len, &ids, &n, &add_bos, diag);
	if (rc == 0 && n < 2 * (size_t)ctx)
		rc =
		    wf_diag_set(diag, WF_EINVAL,
		                "you need at least %u tokens to evaluate perplexity with a context "
		                "of %u: the text tokenizes to only %zu",
		                2 * ctx, ctx, n);
	if (rc == 0 && j->save_base)
		rc = save_begin(&sv, j->save_base, diag);
	if (rc == 0) {
		p->n_ctx = j->n_ctx_used = ctx;
		p->add_bos = add_bos;
		const size_t fit = n / ctx;
		j->n_chunks_planned =
		    (uint32_t)(j->max_chunks && j->max_chunks < fit ? j->max_chunks : fit);
		rc = wf_ppl_perplexity(engine, ids, n, p, sv.fd >= 0 ? fd_write : NULL, &sv.fd,
		                       &j->result, diag);
	}
	if (rc == 0 && sv.fd >= 0)
		rc = save_commit(&sv, diag);
	save_abort(&sv);
	free(ids);
	return rc;
}

int wf_ppl_job_run(struct wf_engine *engine, const struct wf_tokenizer *tok, struct wf_ppl_job *job,
                   struct wf_diag *diag)
{
	struct wf_engine_info info;
	wf_engine_get_info(engine, &info);
	if (wf_tokenizer_n_vocab(tok) != info.n_vocab)
		return wf_diag_set(diag, WF_EUNSUPPORTED,
		                   "the vocabulary has %u tokens but the output %u rows",
		                   wf_tokenizer_n_vocab(tok), info.n_vocab);
	struct wf_ppl_params p = {.max_chunks = job->max_chunks,
	                          .bos = wf_tokenizer_bos(tok),
	                          .seq = job->seq,
	                          .progress = job->progress,
	                          .progress_arg = job->progress_arg};
	return job->kl_base ? run_kl(engine, tok, job, &p, diag)
	                    : run_ppl(engine, tok, job, &p, diag);
}
