/* A persistent thread pool for the host backend's parallel loops: n_threads - 1 workers created
 * once, plus the caller's thread, which takes part in every run.
 *
 * A run splits [0, n_tasks) among the threads: each task index is executed exactly once, by
 * whichever thread claims it first (an atomic counter, so uneven tasks balance themselves), and
 * wf_pool_run returns when every task is done. Between runs the workers spin briefly and then
 * sleep on a futex, so a decode step (hundreds of runs per token) pays no wake-up cost while an
 * idle engine burns no CPU.
 *
 * One run at a time: wf_pool_run must not be called concurrently, nor from inside a task. */
#ifndef WF_KERNELS_POOL_H
#define WF_KERNELS_POOL_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct wf_pool;

/* task: the index in [0, n_tasks); thread: the executing thread's index in [0, n_threads)
 * (0 is the caller), for per-thread scratch buffers. */
typedef void (*wf_pool_task_fn)(void *arg, uint32_t task, uint32_t thread);

/* n_threads >= 1 (1: no workers, runs inline). Returns 0 and *ret_pool, WF_EINVAL for 0 or more
 * than 256 threads, or -errno of pthread_create (nothing left running). */
int wf_pool_create(uint32_t n_threads, struct wf_pool **ret_pool);
/* Joins the workers; accepts NULL. */
void wf_pool_destroy(struct wf_pool *pool);
uint32_t wf_pool_n_threads(const struct wf_pool *pool);

/* Runs fn(arg, task, thread) for every task in [0, n_tasks) and returns when all are done.
 * n_tasks 0 returns at once. Memory written by the tasks is visible to the caller on return. */
void wf_pool_run(struct wf_pool *pool, wf_pool_task_fn fn, void *arg, uint32_t n_tasks);

#ifdef __cplusplus
}
#endif
#endif
