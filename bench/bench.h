#ifndef WF_BENCH_BENCH_H
#define WF_BENCH_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct bench_opts {
	bool json;
	const char *dir;        /* model files (a disk directory, not tmpfs) */
	const char *floor_root; /* where floors are made (tmpfs) */
	const char *size;       /* model size for throughput figures */
	const char *only;       /* comma-separated sub-benchmarks, NULL: all */
	const char *wfgen;      /* path of wf-gen */
	const char *device;     /* residency: device spec; engine: the device rows' device (NULL:
	                           none of them) */
	int iterations;
	const char *model;       /* engine: the model (NULL: generate the model in dir) */
	const char *llama_bench; /* engine: a llama-bench to compare with (NULL: skip its rows) */
	unsigned threads;        /* engine: threads (0: the CPUs this process may run on) */
	const char
	    *llama_bench_gpu; /* engine: a CUDA llama-bench for the device rows (NULL: skip) */
	/* cachepolicy: greedy tokens to generate (0: 256), the prompt (ids "1,17,...", or a text
	 * through the model's tokenizer; neither: the reference models' prompt ids), and the LRFU
	 * half-lives in tokens ("16,64"; NULL: "16") */
	uint32_t tokens;
	bool random_tokens; /* cachepolicy: feed pseudo-random tokens, not the greedy ones */
	const char *prompt_ids, *prompt, *half_life;
};

/* What the engine mode's process rows (worker.c) need from its in-process part. */
struct bench_engine_ctx {
	const char *model_path;
	const char *agent_exe, *worker_exe;
	uint64_t model_bytes; /* tensor bytes */
	uint32_t n_vocab, n_threads;
	uint64_t kv_bytes, scratch_bytes; /* of the in-process engine, for the notes */
	uint32_t n_ctx, n_seq;            /* its config */
};

/* Writes to out the path of a program of the project: beside wf-bench once installed (bin/), else
 * in the build tree (bench/../build_dir/name), else the bare name (for $PATH). */
void bench_tool(const char *name, const char *build_dir, char *out, size_t len);

bool bench_selected(const struct bench_opts *o, const char *name);
int bench_floor(const struct bench_opts *o);
int bench_residency(const struct bench_opts *o);
int bench_engine(const struct bench_opts *o);
/* The CUDA backend's kernels against the device's measured bandwidth (bench/kernels.c): exits 77
 * (no figure) without a CUDA device. */
int bench_kernels(const struct bench_opts *o);
/* Issue 11's expert-cache policies on routing traces (bench/cachepolicy.c). */
int bench_cachepolicy(const struct bench_opts *o);
/* Reloading a tensor changed on disk into a floor (bench/hotswap.c, issue 20). */
int bench_hotswap(const struct bench_opts *o);
int bench_engine_workers(const struct bench_opts *o, const struct bench_engine_ctx *ctx);

/* Issue 11's rows (bench/postfetch.c): the same model through engines with a host device. */
struct wf_model;
struct wf_engine;
struct wf_engine_info;
struct wf_engine_weights;
struct bench_postfetch_ctx {
	const struct wf_model *model;
	const struct wf_engine_weights *weights; /* host bytes (the model's files) */
	uint32_t n_threads, n_gen;
	double cpu_decode;       /* tok/s of the CPU-only engine in the same run */
	uint64_t expert_bytes;   /* the model's routed expert bytes */
	uint64_t down_bytes_all; /* every down projection's bytes */
	uint64_t down_bytes_max; /* the largest one (a slot) */
	uint32_t n_down;         /* down projections: layers x experts */
	const char *kernels;     /* the CPU kernels' level, for the rows */
	/* decode tokens/s of engine e, measured as the CPU-only row was */
	double (*measure)(void *arg, struct wf_engine *e, const struct wf_engine_info *info);
	void *arg;
};
int bench_engine_postfetch(const struct bench_postfetch_ctx *c);

/* Decode tokens/s of an engine made from c's model with cfg (its n_ctx, n_seq_max and n_threads
 * are set here), measured by c->measure; with warm, one untimed measurement first (a cache
 * filled the way the timed one uses it). *ret_stats: the timed measurement's. Negative, with
 * the error on stderr, when the engine cannot be made or a decode fails. */
struct wf_engine_config;
struct wf_engine_stats;
double bench_engine_decode_cfg(const struct bench_postfetch_ctx *c, struct wf_engine_config *cfg,
                               bool warm, struct wf_engine_stats *ret_stats);

/* The device table (bench/engine_dev.c): the device forward pass (dense weights and KV cache on
 * the device) on the device spec names, its experts resident, on the CPU, post-fetched, or in
 * an expert cache. Prints the dev_* rows; fills ret with what the llama.cpp row needs. Returns
 * 0, or 1 with the error on stderr. */
struct bench_device_figures {
	double cache25; /* decode tok/s with the cache at 25% of expert bytes */
	uint64_t cache25_mb;
	char device[160]; /* wf_device_name */
	bool cuda;        /* the device is a GPU: the goals apply */
};
int bench_engine_device(const struct bench_postfetch_ctx *c, const char *spec,
                        struct bench_device_figures *ret);

#endif
