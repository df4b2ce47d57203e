/* Evaluations on a worker: the Perplexity request (docs/PROTOCOL.md), llama-perplexity's
 * perplexity or KL divergence (worker/ppljob.h) of a model over a text, run on the model's own
 * engine between two of its steps (wf_completion_with_engine), so that it measures exactly the
 * weights the worker serves, hot-swapped tensors included, without loading anything. */
#ifndef WF_WORKER_EVALUATE_H
#define WF_WORKER_EVALUATE_H

struct wf_worker_svc;
struct wf_completions;
struct wf_worker_refresh;

/* Registers the Perplexity request with the service (its dispatch table, worker/service.h);
 * cs must outlive the service. 0, or the service's error. One per process. */
int wf_evaluate_serve(struct wf_worker_svc *svc, struct wf_completions *cs);
/* The published generations this worker applied (worker/refresh.h), once its ear on the agent's
 * events exists; until then (or without an agent) a request that asks to wait for a generation
 * fails. Thread-safe; refresh must outlive the service. */
void wf_evaluate_set_refresh(struct wf_worker_refresh *refresh);

#endif
