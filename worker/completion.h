/* Completions on a worker: Generate and GenerateRead (docs/PROTOCOL.md "Completions"). A
 * completion is one inference run: a prompt in, tokens out. ("Generation" is a floor's tensor
 * version, shm/layout.h.)
 *
 * Per model, the first Generate builds an engine whose weights are read in place: from the
 * worker's own read-only attachment of the model's floor (tensor i at the floor's offset for it,
 * shared pages, no private copy), or, where the model has no floor (no agent), from a shared
 * read-only mmap of the model files (the page cache's pages). A tokenizer and a continuous-
 * batching scheduler (engine/scheduler.h) go with it; they live until the worker stops.
 *
 * An engine with a device holds device memory for its life (post-fetch scratchpad, expert cache
 * slots, resident experts: wf_engine_info.device_bytes). Those bytes are a reservation in the
 * worker's device budget (worker/cache.h): built only when they fit, after the LRU evicted what
 * it may (else the Generate fails with WF_ENO_SPACE and no engine is left); each completion
 * holds the reservation from its start to its end, so an engine with completions running is
 * never evicted (the choice made: no completion is cut, and none waits); its last step ends the
 * hold and makes it the most recently used. When the cache evicts an idle engine, it is freed at
 * once (its finished completions stay readable) and the next Generate builds it again. When a
 * completion ends, one line goes to the worker's log with the engine's figures (tokens/s, and
 * with post-fetch: bytes fetched per token, overlap, fallback rate, scratchpad, hit rate).
 *
 * An engine has one sequence more than its scheduler hands to completions (n_seq + 1, its KV cache
 * included): the evaluations' (wf_completion_with_engine), which never meet a completion's.
 *
 * A model with no engine yet follows the worker's residency mode: self-managed loads it (the
 * floor through the agent, as Pin does); external needs the model attached first (HOST or above,
 * by a residency command), else WF_ENOT_RESIDENT.
 *
 * A completion is kept in a table with the tokens made so far; GenerateRead long-polls it. A
 * completion nobody has read for its idle time-out is canceled (the client went away); a finished
 * one stays readable for that long (at least WF_COMPLETION_IDLE_MS) after its end or last read.
 * Thread-safe: the control server's threads call in concurrently. Shutdown: close (wakes every long
 * poll; does not block), then destroy (cancels every completion and frees the engines), after the
 * control server has stopped. */
#ifndef WF_WORKER_COMPLETION_H
#define WF_WORKER_COMPLETION_H

#include "base/diag.h"
#include "control/server.h"

#include <stdint.h>

struct wf_worker_svc;

#define WF_COMPLETION_MAX          256   /* completions kept at once (running or unread) */
#define WF_COMPLETION_MODELS_MAX   16    /* models with an engine */
#define WF_COMPLETION_WAIT_MAX_MS  10000 /* longest long poll */
#define WF_COMPLETION_IDLE_MS      5000  /* default idle time-out */
#define WF_COMPLETION_IDLE_MAX_MS  600000
#define WF_COMPLETION_MAX_TOKENS   256  /* default max_tokens */
#define WF_COMPLETION_REPLY_TOKENS 1024 /* tokens in one reply at most */

struct wf_device;
struct wf_postfetch_settings;

struct wf_completion_opts {
	uint32_t n_ctx;     /* 0: the engine's default (the model's, capped at 4096) */
	uint32_t n_seq;     /* concurrent sequences per model; 0: 8 */
	uint32_t n_threads; /* 0: the engine's default (every CPU this process may use) */
	uint32_t n_batch;   /* 0: the scheduler's default */
	/* Expert post-fetch (engine/postfetch.h): the device the engines fetch experts to, NULL
	 * for CPU-only engines; the settings (NULL: the defaults) and the expert cache's MiB.
	 * Borrowed: they must outlive the wf_completions. */
	struct wf_device *device;
	const struct wf_postfetch_settings *postfetch;
	uint32_t expert_cache_mb;
	/* Placement (--n-cpu-moe N / --cpu-moe): experts of layers n_cpu_moe and up resident on
	 * the device when experts_on_device. */
	bool experts_on_device;
	uint32_t n_cpu_moe;
	/* The device forward pass on the host device (always so on a GPU). */
	bool dense_on_device;
};

/* A model's engine, as of its last finished completion (the engine's counters are read on the
 * engine's own thread when a completion ends, never while it decodes). Rates with nothing to
 * divide by are -1. */
struct wf_completion_metrics {
	uint64_t completions; /* finished on this engine */
	uint64_t tokens;      /* tokens the engine computed (prompts and generated) */
	uint64_t fetch_experts, fetch_bytes, fetch_used, fetch_fallbacks, fetch_hits, fetch_misses;
	uint64_t scratchpad_bytes;
	double fetch_bytes_per_token; /* fetch_bytes / tokens */
	double fetch_overlap;         /* fraction of the copy time hidden under compute */
	double fallback_rate;         /* fallbacks / (used + fallbacks): experts meant for the
	                                 device that the CPU computed after all */
	double cache_hit_rate;        /* hits / (hits + misses) */
	double decode_tokens_per_s;   /* the last finished completion's (first token to last) */
};

struct wf_completions;

/* svc is borrowed (its cache, models and agent) and serves Generate and GenerateRead through
 * this module from here on (wf_worker_svc_extend: call before the control server starts). When a
 * model goes back to disk (SetResidency DISK), its engine is no longer used for new completions,
 * those in progress end CANCELED, and the engine, with its attachment of the floor, is freed
 * once nothing refers to it. A model's residency carries its engine's metrics. Returns 0,
 * -ENOMEM, -errno of pthread_create, or the service's refusal (WF_ELIMIT, WF_EINVAL). */
int wf_completion_create(struct wf_worker_svc *svc, const struct wf_completion_opts *opts,
                         struct wf_completions **ret);
void wf_completion_close(struct wf_completions *cs);
/* Accepts NULL. The service must not be serving any more (its control server stopped). */
void wf_completion_destroy(struct wf_completions *cs);

/* The metrics of a model's engine. Returns 0, or WF_ENOT_FOUND when the model has no engine
 * (never generated on this worker, or retired). */
/* Runs fn on the model's engine (found or built as for a Generate, and held meanwhile) between
 * two steps of its scheduler, in a sequence of its own that no completion uses (seq, empty when
 * fn starts and to be left empty): the completions of the model pause while it runs. For
 * evaluations (Perplexity, worker/evaluate.h). Returns fn's result, or model_get's errors
 * (WF_ENOT_FOUND, WF_ENOT_RESIDENT, WF_ENO_SPACE, ...). Thread-safe. */
struct wf_engine;
struct wf_tokenizer;
typedef int (*wf_completion_engine_fn)(void *arg, struct wf_engine *engine,
                                       const struct wf_tokenizer *tok, uint32_t seq);
int wf_completion_with_engine(struct wf_completions *cs, const char *model, int agent_ms,
                              wf_completion_engine_fn fn, void *arg, struct wf_diag *diag);

int wf_completion_model_metrics(struct wf_completions *cs, const char *name,
                                struct wf_completion_metrics *ret);

#endif
