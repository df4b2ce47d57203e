/* The pread backend: a pool of threads for hosts without io_uring. Each thread takes a chunk from
 * the submission list, does one pread(2) (short results go back to the common layer, which
 * resubmits the rest), and puts it on the completion list. The pool threads block every signal so
 * that the process's handlers run on its own threads. */
#include "io/internal.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct pool {
	pthread_mutex_t mu;
	pthread_cond_t work_cv; /* submission list non-empty, or stop */
	pthread_cond_t done_cv; /* completion list non-empty (CLOCK_MONOTONIC) */
	struct wf__io_chunk *sq, *sq_tail;
	struct wf__io_chunk *cq, *cq_tail;
	bool stop;
	bool mu_ok, work_ok, done_ok;
	unsigned nthreads;
	pthread_t *threads;
};

static struct pool *P(const struct wf_io_reader *r)
{
	return r->be;
}

static void push(struct wf__io_chunk **head, struct wf__io_chunk **tail, struct wf__io_chunk *c)
{
	c->next = NULL;
	if (*tail)
		(*tail)->next = c;
	else
		*head = c;
	*tail = c;
}

static struct wf__io_chunk *pop(struct wf__io_chunk **head, struct wf__io_chunk **tail)
{
	struct wf__io_chunk *c = *head;

	if (c) {
		*head = c->next;
		if (!*head)
			*tail = NULL;
		c->next = NULL;
	}
	return c;
}

static void *worker(void *arg)
{
	struct pool *p = arg;

	pthread_mutex_lock(&p->mu);
	for (;;) {
		struct wf__io_chunk *c;
		ssize_t n;

		while (!p->sq && !p->stop)
			pthread_cond_wait(&p->work_cv, &p->mu);
		if (!p->sq)
			break; /* stop, and nothing left to read */
		c = pop(&p->sq, &p->sq_tail);
		pthread_mutex_unlock(&p->mu);

		n = pread(c->fd, c->buf, c->len, (off_t)c->off);
		c->res = n < 0 ? -errno : (int)n;

		pthread_mutex_lock(&p->mu);
		push(&p->cq, &p->cq_tail, c);
		pthread_cond_signal(&p->done_cv);
	}
	pthread_mutex_unlock(&p->mu);
	return NULL;
}

static void pool_fini(struct wf_io_reader *r)
{
	struct pool *p = P(r);

	if (!p)
		return;
	if (p->threads) {
		pthread_mutex_lock(&p->mu);
		p->stop = true;
		pthread_cond_broadcast(&p->work_cv);
		pthread_mutex_unlock(&p->mu);
		for (unsigned i = 0; i < p->nthreads; i++)
			pthread_join(p->threads[i], NULL);
		free(p->threads);
	}
	if (p->done_ok)
		pthread_cond_destroy(&p->done_cv);
	if (p->work_ok)
		pthread_cond_destroy(&p->work_cv);
	if (p->mu_ok)
		pthread_mutex_destroy(&p->mu);
	free(p);
	r->be = NULL;
}

static int pool_init(struct wf_io_reader *r)
{
	pthread_condattr_t ca;
	sigset_t all, old;
	struct pool *p;
	int ret;

	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	r->be = p;
	ret = -pthread_mutex_init(&p->mu, NULL);
	if (ret < 0)
		goto err;
	p->mu_ok = true;
	ret = -pthread_cond_init(&p->work_cv, NULL);
	if (ret < 0)
		goto err;
	p->work_ok = true;
	ret = -pthread_condattr_init(&ca);
	if (ret < 0)
		goto err;
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	ret = -pthread_cond_init(&p->done_cv, &ca);
	pthread_condattr_destroy(&ca);
	if (ret < 0)
		goto err;
	p->done_ok = true;

	p->threads = calloc(r->opts.threads, sizeof(*p->threads));
	if (!p->threads) {
		ret = -ENOMEM;
		goto err;
	}
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	for (unsigned i = 0; i < r->opts.threads; i++) {
		ret = -pthread_create(&p->threads[i], NULL, worker, p);
		if (ret < 0)
			break;
		p->nthreads++;
	}
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (ret < 0)
		goto err;
	return 0;
err:
	pool_fini(r);
	return ret;
}

static void pool_queue(struct wf_io_reader *r, struct wf__io_chunk *c)
{
	struct pool *p = P(r);

	pthread_mutex_lock(&p->mu);
	push(&p->sq, &p->sq_tail, c);
	pthread_cond_signal(&p->work_cv);
	pthread_mutex_unlock(&p->mu);
}

static int pool_flush(struct wf_io_reader *r)
{
	(void)r;
	return 0;
}

static int pool_wait(struct wf_io_reader *r, struct wf__io_chunk **out, unsigned max, unsigned min,
                     int64_t timeout_ns)
{
	struct pool *p = P(r);
	struct timespec deadline;
	unsigned n = 0;

	if (timeout_ns > 0) {
		clock_gettime(CLOCK_MONOTONIC, &deadline);
		deadline.tv_sec += timeout_ns / 1000000000;
		deadline.tv_nsec += timeout_ns % 1000000000;
		if (deadline.tv_nsec >= 1000000000) {
			deadline.tv_sec++;
			deadline.tv_nsec -= 1000000000;
		}
	}
	pthread_mutex_lock(&p->mu);
	for (;;) {
		while (n < max && p->cq)
			out[n++] = pop(&p->cq, &p->cq_tail);
		if (n >= min || n == max || timeout_ns == 0)
			break;
		if (timeout_ns < 0) {
			pthread_cond_wait(&p->done_cv, &p->mu);
		} else if (pthread_cond_timedwait(&p->done_cv, &p->mu, &deadline) == ETIMEDOUT) {
			while (n < max && p->cq)
				out[n++] = pop(&p->cq, &p->cq_tail);
			break;
		}
	}
	pthread_mutex_unlock(&p->mu);
	return (int)n;
}

const struct wf__io_ops wf__io_pread_ops = {
    .name = "pread",
    .kind = WF_IO_BACKEND_PREAD,
    .init = pool_init,
    .fini = pool_fini,
    .queue = pool_queue,
    .flush = pool_flush,
    .wait = pool_wait,
};
