/* The forward pass of a GGUF Mixture-of-Experts model on the CPU, with llama.cpp's semantics
 * (release b10573): architectures "qwen3moe" and "llama" (Mixtral-style, or dense), weight types
 * F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K, activations quantized as ggml does (Q8_0 / Q8_K),
 * a KV cache in F16 (default) or F32, and several sequences decoded in one batch.
 *
 * Weights are a view: the caller hands one pointer per tensor of the model (the floor mapping, or
 * an mmap of the files where no agent exists), and the engine reads them in place for its whole
 * life. It never copies weights, never touches shm, io or control, and never frees the view.
 *
 * Threads: an engine owns a persistent thread pool (cfg.n_threads, the caller's thread counted)
 * and runs one decode at a time. wf_engine_decode and wf_engine_seq_* must not be called
 * concurrently on one engine (the batching scheduler serialises them); the read-only getters may
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

enum wf_engine_kv_type {
	WF_ENGINE_KV_F16 = 0, /* llama.cpp's default */
	WF_ENGINE_KV_F32 = 1,
	WF_ENGINE_KV_MAX
};

struct wf_device;

struct wf_engine_config {
	uint32_t n_ctx;     /* KV positions per sequence; 0: the model's context_length
	                       (capped at 4096 when the model says more, to bound memory) */
	uint32_t n_seq_max; /* sequences with their own KV cache; 0: 1 */
	uint32_t n_threads; /* 0: the CPUs this process may run on */
	enum wf_engine_kv_type kv_type;
	/* The device the engine computes on, and post-fetch (engine/postfetch.h): with a device,
	 * the selected host-side experts' down projections are copied to it right after routing
	 * and computed from there. NULL device: CPU only. postfetch NULL: the defaults. The device
	 * must outlive the engine. A CUDA device runs the whole forward pass there (dense weights,
	 * KV cache and activations in device memory, engine/devops.h, with the CUDA kernels
	 * registered for it); the host device does so only when dense_on_device says so, and
	 * otherwise computes the fetched experts with the CPU forward pass. */
	struct wf_device *device;
	const struct wf_postfetch_settings *postfetch;
	/* A device expert cache of this many MiB (0: none, the post-fetch scratchpad only): down
	 * projections (whole experts in the device forward pass) stay in device slots across steps
	 * and requests, the lowest LRFU score evicted (engine/fetch.c), post-fetch filling the
	 * misses. Needs post-fetch. */
	uint32_t expert_cache_mb;
	/* Placement of the routed experts (llama.cpp's --cpu-moe / --n-cpu-moe N): false, the
	 * default, keeps every layer's experts host-side in the floor (computed on the CPU or
	 * post-fetched); true makes the experts of layers n_cpu_moe and up resident on the device
	 * (loaded at create, never evicted; the first n_cpu_moe layers stay host-side). Needs a
	 * device. */
	bool experts_on_device;
	uint32_t n_cpu_moe;
	/* Dense weights, the KV cache and activations in device memory, the forward pass computed
	 * by the device's engine ops: always on CUDA; on the host device, CI's model of a GPU, only
	 * when set (its results are the CPU engine's bit for bit). Needs a device. */
	bool dense_on_device;
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
	uint64_t device_bytes;           /* device memory the engine holds for its life (dense
	                                    weights, KV cache, activations, expert slots and
	                                    workspaces on the device); 0 without a device. A
	                                    worker charges it to its device budget. */
};

struct wf_engine;

/* Checks the model (architecture, every tensor it needs with the right type and shape) and
 * builds an engine. tensor_data[i] points at the bytes of model->tensors[i] (model->tensors[i]
 * .nbytes readable bytes); pointers for tensors the engine does not use may be NULL. model and
 * tensor_data must outlive the engine. Errors, with diag naming the tensor or key at fault:
 * WF_EUNSUPPORTED (an architecture or weight type the engine does not run), WF_ENOT_FOUND (a
 * missing tensor or key), WF_EFORMAT (a tensor of the wrong shape, inconsistent hyperparameters),
 * WF_EINVAL (cfg out of range), -ENOMEM. */
int wf_engine_create(const struct wf_model *model, const void *const *tensor_data,
                     const struct wf_engine_config *cfg, struct wf_engine **ret_engine,
                     struct wf_diag *diag);
/* Stops the pool and frees everything the engine allocated; accepts NULL. */
void wf_engine_destroy(struct wf_engine *engine);

void wf_engine_get_info(const struct wf_engine *engine, struct wf_engine_info *ret_info);

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
