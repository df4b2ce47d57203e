/* Thread pool. A run is published seqlock-style through gen: the caller makes gen odd, waits
 * until no worker is inside a run (active == 0), writes the run's fields, and makes gen even. A
 * worker announces itself in active before it reads gen, and runs only on an even gen it has not
 * run yet, so it never reads a run's fields while the caller writes them, and a late worker that
 * wakes for a finished run claims nothing (next is past n_tasks). Workers spin on gen for a while,
 * then sleep on a futex keyed on it. The run ends when done reaches n_tasks. */
#include "kernels/pool.h"

#include "base/error.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

/* Spins before a worker sleeps: long enough to cover the gap between two runs of one decode step
 * (microseconds), short enough that an idle engine goes quiet at once. */
#define POOL_SPIN 20000

struct pool_worker {
	struct wf_pool *pool;
	uint32_t index;
	pthread_t thread;
};

struct wf_pool {
	uint32_t n_threads;
	struct pool_worker *workers; /* n_threads - 1 */
	uint32_t n_started;

	/* The current run, published by a release store of gen. */
	wf_pool_task_fn fn;
	void *arg;
	uint32_t n_tasks;
	_Atomic uint32_t next;   /* next task to claim */
	_Atomic uint32_t done;   /* tasks finished */
	_Atomic uint32_t gen;    /* odd while a run is being written; the futex word */
	_Atomic uint32_t active; /* workers between their claim of a run and its end */
	_Atomic uint32_t sleepers;
	_Atomic bool stop;
};

static long futex(_Atomic uint32_t *word, int op, uint32_t val)
{
	return syscall(SYS_futex, (uint32_t *)word, op | FUTEX_PRIVATE_FLAG, val, NULL, NULL, 0);
}

static void run_tasks(struct wf_pool *pool, uint32_t thread)
{
	uint32_t n = pool->n_tasks;
	for (;;) {
		uint32_t t = atomic_fetch_add_explicit(&pool->next, 1, memory_order_relaxed);
		if (t >= n)
			break;
		pool->fn(pool->arg, t, thread);
		atomic_fetch_add_explicit(&pool->done, 1, memory_order_release);
	}
}

static void *worker_main(void *p)
{
	struct pool_worker *w = p;
	struct wf_pool *pool = w->pool;
	uint32_t seen = atomic_load_explicit(&pool->gen, memory_order_acquire);
	int spins = 0;
	for (;;) {
		if (atomic_load_explicit(&pool->stop, memory_order_acquire))
			return NULL;
		uint32_t g = atomic_load_explicit(&pool->gen, memory_order_relaxed);
		if (g != seen && (g & 1u) == 0) {
			atomic_fetch_add_explicit(&pool->active, 1, memory_order_seq_cst);
			g = atomic_load_explicit(&pool->gen, memory_order_seq_cst);
			if (g != seen && (g & 1u) == 0) {
				seen = g;
				run_tasks(pool, w->index);
			}
			atomic_fetch_sub_explicit(&pool->active, 1, memory_order_release);
			spins = 0;
			continue;
		}
		if (++spins < POOL_SPIN) {
			cpu_relax();
			continue;
		}
		atomic_fetch_add_explicit(&pool->sleepers, 1, memory_order_seq_cst);
		/* Re-check after announcing the sleep: a run published in between is seen here, or
		 * its wake-up finds this worker counted. */
		if (atomic_load_explicit(&pool->gen, memory_order_seq_cst) == g &&
		    !atomic_load_explicit(&pool->stop, memory_order_seq_cst))
			futex(&pool->gen, FUTEX_WAIT, g);
		atomic_fetch_sub_explicit(&pool->sleepers, 1, memory_order_seq_cst);
		spins = 0;
	}
}

int wf_pool_create(uint32_t n_threads, struct wf_pool **ret_pool)
{
	if (n_threads == 0 || n_threads > 256)
		return WF_EINVAL;
	struct wf_pool *pool = calloc(1, sizeof(*pool));
	if (!pool)
		return -ENOMEM;
	pool->n_threads = n_threads;
	if (n_threads > 1) {
		pool->workers = calloc(n_threads - 1, sizeof(*pool->workers));
		if (!pool->workers) {
			free(pool);
			return -ENOMEM;
		}
	}
	for (uint32_t i = 0; i + 1 < n_threads; i++) {
		struct pool_worker *w = &pool->workers[i];
		w->pool = pool;
		w->index = i + 1;
		int rc = pthread_create(&w->thread, NULL, worker_main, w);
		if (rc != 0) {
			wf_pool_destroy(pool);
			return -rc;
		}
		pool->n_started++;
	}
	*ret_pool = pool;
	return 0;
}

void wf_pool_destroy(struct wf_pool *pool)
{
	if (!pool)
		return;
	atomic_store_explicit(&pool->stop, true, memory_order_seq_cst);
	atomic_fetch_add_explicit(&pool->gen, 2, memory_order_seq_cst);
	futex(&pool->gen, FUTEX_WAKE, INT_MAX);
	for (uint32_t i = 0; i < pool->n_started; i++)
		pthread_join(pool->workers[i].thread, NULL);
	free(pool->workers);
	free(pool);
}

uint32_t wf_pool_n_threads(const struct wf_pool *pool)
{
	return pool->n_threads;
}

void wf_pool_run(struct wf_pool *pool, wf_pool_task_fn fn, void *arg, uint32_t n_tasks)
{
	if (n_tasks == 0)
		return;
	if (pool->n_threads == 1 || n_tasks == 1) {
		for (uint32_t t = 0; t < n_tasks; t++)
			fn(arg, t, 0);
		return;
	}
	atomic_fetch_add_explicit(&pool->gen, 1, memory_order_seq_cst); /* odd: writing */
	while (atomic_load_explicit(&pool->active, memory_order_seq_cst) != 0)
		cpu_relax();
	pool->fn = fn;
	pool->arg = arg;
	pool->n_tasks = n_tasks;
	atomic_store_explicit(&pool->next, 0, memory_order_relaxed);
	atomic_store_explicit(&pool->done, 0, memory_order_relaxed);
	atomic_fetch_add_explicit(&pool->gen, 1, memory_order_seq_cst); /* even: published */
	if (atomic_load_explicit(&pool->sleepers, memory_order_seq_cst) > 0)
		futex(&pool->gen, FUTEX_WAKE, INT_MAX);
	run_tasks(pool, 0);
	while (atomic_load_explicit(&pool->done, memory_order_acquire) < n_tasks)
		cpu_relax();
}
