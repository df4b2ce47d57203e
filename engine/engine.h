/* The inference engine: a GGUF Mixture-of-Experts model's forward pass with llama.cpp's semantics
 * (release b10573): architectures "qwen3moe" and "llama" (Mixtral-style, or dense), each written
 * once (engine/arch/), weight types F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K, a KV cache in
 * F16 (default) or F32, several sequences decoded in one batch.
 *
 * Weights are a view the caller owns: per tensor its bytes in host memory (the floor mapping, or
 * an mmap of the files where no agent exists), and where the node's device weight store holds
 * one, its copy in the device's memory. The engine reads them where they lie (host memory in
 * place on the host backend; device copies on a device) for its life, never copies a weight
 * into memory of its own, and never frees the view; wf_engine_refresh() points it at new bytes
 * of some tensors between decodes. It never touches shm, io or control.
 *
 * Threads: an engine owns a persistent thread pool (cfg.n_threads, the caller's thread counted)
 * and runs one decode at a time. wf_engine_decode, wf_engine_refresh and wf_engine_seq_* must not
 * be called concurrently on one engine (the batching scheduler serialises them); the getters may
 * be called from any thread. */
#ifndef WF_ENGINE_ENGINE_H
#define WF_ENGINE_ENGINE_H

#include "base/diag.h"
#include "engine/postfetch.h"
#include "model/model.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define WF_ENGINE_MAX_SEQ     256 /* sequences one engine holds KV slots for */
#define WF_ENGINE_MAX_THREADS 256
/* The expert cache's LRFU half-life in tokens (a middle value of those `wf-bench cachepolicy`
 * tried; its simulator takes this constant to replay the engine's rule). */
#define WF_ENGINE_CACHE_HALF_LIFE 16.0

enum wf_engine_kv_type {
	WF_ENGINE_KV_F16 = 0, /* llama.cpp's default */
	WF_ENGINE_KV_F32 = 1,
	WF_ENGINE_KV_MAX
};

struct wf_device;

/* Where the work runs: the placement plan (engine/exec.c), from these settings:
 *   no device            everything on the host backend (the CPU), weights read in place.
 *   a CUDA device        the dense part (attention, norms, router, output) and the KV cache on
 *                        the device, from the device weight store's copies of the dense
 *                        tensors; experts per layer as below.
 *   the host device      CI's model of a GPU: the dense part on the device's stream only with
 *                        dense_on_device (its memory is host memory: device copies where the
 *                        store has them, the floor in place otherwise), else on the CPU.
 * Experts: layers n_cpu_moe and up are resident when experts_on_device (llama.cpp's
 * --n-cpu-moe N; --cpu-moe is none resident): computed on the device from the store's copies of
 * their expert stacks, routed on the device (no host wait). The other layers' experts are
 * host-side, in the floor: right after routing the selected ones are looked up in the expert
 * cache (a whole expert computed on the device; a cached down projection as below),
 * post-fetched (down projection copied to a slot while the CPU computes gate and up, then
 * computed on the device), or computed on the CPU. */
struct wf_engine_config {
	uint32_t n_ctx;     /* KV positions per sequence; 0: the model's context_length
	                       (capped at 4096 when the model says more, to bound memory) */
	uint32_t n_seq_max; /* sequences with their own KV cache; 0: 1 */
	uint32_t n_threads; /* 0: the CPUs this process may run on */
	enum wf_engine_kv_type kv_type;
	/* NULL: CPU only. Must outlive the engine; its kind's backend must be registered
	 * (kernels/backend.h). */
	struct wf_device *device;
	const struct wf_postfetch_settings *postfetch; /* NULL: the defaults */
	/* A device expert cache of this many MiB (0: the post-fetch scratchpad only): experts stay
	 * in device slots across steps and requests (whole where the device computes the dense
	 * part, else their down projections), the lowest LRFU score evicted (engine/fetch.c),
	 * post-fetch filling the misses. Needs post-fetch. */
	uint32_t expert_cache_mb;
	bool experts_on_device; /* needs a device */
	uint32_t n_cpu_moe;
	bool dense_on_device; /* the host device only (always so on CUDA); needs a device */
};

/* One mapping the view's host pointers lie in (a file mapping, or the floor region): post-fetch
 * registers each mapping that holds host-side experts with the device, so its copies are DMA. */
struct wf_engine_mapping {
	const void *base;
	size_t len;
};

/* The weights, per tensor of the model (model->tensors order). host[i]: tensor i's nbytes in
 * host memory (NULL for tensors the engine does not use). device (NULL: no copies): device[i] a
 * copy of them in the engine device's memory where the device weight store holds one (NULL
 * where it does not). The engine reads a device copy where it computes on the device, host bytes
 * where it computes on the host; a device that cannot read host memory (CUDA) needs the copies
 * of every tensor wf_engine_device_tensors() names. maps: the mappings host[] lies in (optional:
 * without them post-fetch copies are not registered, so slower, never wrong). */
struct wf_engine_weights {
	const void *const *host;
	void *const *device;
	const struct wf_engine_mapping *maps;
	uint32_t n_maps;
};

/* The architecture-level view of a model, resolved at create. */
struct wf_engine_info {
	const char *arch; /* "qwen3moe" or "llama" */
	uint32_t n_vocab, n_embd, n_layer, n_head, n_head_kv, head_dim;
	uint32_t n_expert, n_expert_used, n_ff_exp; /* 0 for a dense model */
	uint32_t n_ctx, n_seq_max, n_threads;
	uint64_t weight_bytes_per_token; /* bytes of weights one decode token reads (dense + the
	                                    used experts' share); the bandwidth bound's numerator */
	uint64_t kv_bytes;               /* the KV cache, all sequences */
	uint64_t scratch_bytes;          /* activations and quantized copies at the largest batch */
	uint64_t device_bytes;           /* device memory the engine itself holds for its life: KV
	                                    cache, activations, expert slots, its backend's
	                                    workspaces; never weights (the store's). 0 without a
	                                    device. A worker charges it to its device budget. */
	uint64_t slot_bytes;   /* of device_bytes: the expert slots (scratchpad or cache) */
	uint32_t n_slots;      /* expert slots */
	const char *placement; /* what runs where, one line ("dense: cuda, experts:
	                          layers 0-23 host-side (post-fetch, cache 2048 MiB),
	                          24-47 resident"); static for the engine's life */
};

struct wf_engine;

/* Marks in ret_wanted[] (model->n_tensors booleans) the tensors the engine computes from on the
 * device under cfg: the dense ones when the device computes the dense part, the resident layers'
 * expert stacks. The caller's device weight store loads them and passes their copies in the
 * view (required on CUDA; on the host device they may also be read in place). Errors as
 * wf_engine_create's for the model and cfg. */
int wf_engine_device_tensors(const struct wf_model *model, const struct wf_engine_config *cfg,
                             bool *ret_wanted, struct wf_diag *diag);

/* Checks the model (architecture, every tensor it needs with the right type and shape) and
 * builds an engine. weights and model must outlive the engine (or be refreshed). Errors, with
 * diag naming the tensor or key at fault: WF_EUNSUPPORTED (an architecture or weight type the
 * engine does not run), WF_ENOT_FOUND (a missing tensor or key), WF_EFORMAT (a tensor of the
 * wrong shape, inconsistent hyperparameters), WF_ENOT_RESIDENT (a tensor the device must compute
 * from has no device copy), WF_EINVAL (cfg out of range), -ENOMEM. */
int wf_engine_create(const struct wf_model *model, const struct wf_engine_weights *weights,
                     const struct wf_engine_config *cfg, struct wf_engine **ret_engine,
                     struct wf_diag *diag);
/* Stops the pool and frees everything the engine allocated; accepts NULL. */
void wf_engine_destroy(struct wf_engine *engine);

void wf_engine_get_info(const struct wf_engine *engine, struct wf_engine_info *ret_info);

/* Points the engine at new bytes of n tensors (model tensor indices; each with its new host
 * pointer in weights->host and, where the store refreshed its copy, its new device pointer in
 * weights->device; other entries are ignored): the refresh seam of docs/ARCHITECTURE.md. Called
 * between decodes (the scheduler's step boundary, never under a running step): the next decode
 * reads the new bytes, and when it returns, nothing the engine queued reads the old ones any
 * more (expert slots holding a refreshed stack's experts are forgotten), so the caller may free
 * them. A tensor's type and shape must not change (WF_EFORMAT, nothing changed). WF_EINVAL for an
 * index out of range; a tensor the engine does not use is ignored. */
int wf_engine_refresh(struct wf_engine *engine, uint32_t n, const uint32_t *tensors,
                      const struct wf_engine_weights *weights, struct wf_diag *diag);

/* One decode step: n tokens, each of one sequence at one position. Tokens of one sequence must
 * come in increasing position order, and each position must be the sequence's next (its KV
 * length): a prompt is a run of consecutive positions, a decode step one token per sequence. A
 * token attends to its sequence's positions up to and including its own. */
struct wf_engine_batch {
	uint32_t n;
	const int32_t *tokens;
	const uint32_t *pos;
	const uint32_t *seq;     /* < n_seq_max */
	const bool *want_logits; /* NULL: logits for the last token only */
};

/* Runs the batch and writes n_vocab float logits per token whose want_logits is set, in batch
 * order, to logits (the caller's array of at least that many rows). Returns 0; WF_EINVAL for a
 * token id out of the vocabulary, a sequence out of range or positions that do not continue the
 * sequence (nothing is computed then); WF_ELIMIT when a sequence would pass n_ctx (diag says the
 * context length); -ENOMEM. On an error no KV cache changes. */
int wf_engine_decode(struct wf_engine *engine, const struct wf_engine_batch *batch, float *logits,
                     struct wf_diag *diag);

/* The KV length of a sequence (its next position). */
uint32_t wf_engine_seq_len(const struct wf_engine *engine, uint32_t seq);
/* Forgets a sequence's KV from position pos on (0: the whole sequence), so its slots can be
 * reused or the sequence rewound. WF_EINVAL for a sequence out of range. */
int wf_engine_seq_truncate(struct wf_engine *engine, uint32_t seq, uint32_t pos);

/* What the decodes so far did: tokens computed, and bytes of weights read (each matrix once per
 * decode step however many tokens use it, each routed expert once per layer and step, one
 * embedding row per token), the figure a bandwidth bound divides by. */
struct wf_engine_stats {
	uint64_t decodes, tokens, weight_bytes;
	/* Post-fetch (zero without it): down projections copied and their bytes, those computed
	 * from the copy, those computed on the CPU after all (copy not done under the non-blocking
	 * policy, or failed), copy or event failures, the scratchpad's size, and the fraction of
	 * the copy time hidden under compute (1 - time blocked / copy time, over the steps whose
	 * copies all completed; -1 before any). */
	uint64_t fetch_experts, fetch_bytes, fetch_used, fetch_fallbacks, fetch_errors;
	uint64_t scratchpad_bytes;
	double fetch_overlap;
	/* The slots' lookups: selected experts found in a slot (the expert cache kept them), or
	 * not. Hit rate = hits / (hits + misses). */
	uint64_t fetch_hits, fetch_misses;
	/* Hits that ran wholly on the device (the device forward pass caches gate and up too; the
	 * CPU's experts and these compute at the same time). */
	uint64_t fetch_whole;
	/* Resident experts: lookups of experts of resident layers, and their device bytes. */
	uint64_t resident_lookups, resident_bytes;
};
void wf_engine_get_stats(const struct wf_engine *engine, struct wf_engine_stats *ret_stats);
void wf_engine_reset_stats(struct wf_engine *engine);

/* The experts the expert cache holds now: up to max (layer << 16 | expert) keys into ret_keys,
 * the count of filled slots returned. Thread-safe (a snapshot; may be a step old). */
uint32_t wf_engine_cached_experts(const struct wf_engine *engine, uint32_t *ret_keys, uint32_t max);

/* Where WF_POSTFETCH_DEBUG lines go (one per layer and step); none without it. */
typedef void (*wf_engine_log_fn)(void *arg, const char *line);
void wf_engine_set_log(struct wf_engine *engine, wf_engine_log_fn fn, void *arg);

/* Debug and test hook: when set, the engine writes each layer's router logits (before softmax)
 * for every token of the next decodes, [n_layer][n][n_expert] per decode, to the callback. */
typedef void (*wf_engine_router_fn)(void *arg, uint32_t layer, uint32_t n_tokens,
                                    const float *router_logits);
void wf_engine_set_router_hook(struct wf_engine *engine, wf_engine_router_fn fn, void *arg);

#ifdef __cplusplus
}
#endif
#endif
