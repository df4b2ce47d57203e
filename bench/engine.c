/* wf-bench engine: issue 10's CPU inference figures, each against an anchor measured in this run.
 *  decode_vs_bandwidth_bound  decode tokens/s (batch 1, in process, engine/engine.h on an mmap
 *                             of the model files) over the bound memory bandwidth sets: read
 *                             bandwidth (bench_read_bandwidth, same thread count) / weight bytes
 *                             one token reads (wf_engine_info.weight_bytes_per_token);
 *  decode_vs_llama_cpp        the same decode tokens/s over llama-bench's tg figure;
 *  prefill_vs_llama_cpp       prompt tokens/s (one batch) over llama-bench's pp figure;
 *  batch8_vs_batch1           aggregate decode tokens/s of 8 sequences in one batch per step over
 *                             batch 1;
 *  private_memory_over_model, first_token_vs_llama_cpp: real wf-agent and wf-worker processes
 *                             (worker.c).
 * llama.cpp's rows need --llama-bench PATH (a llama-bench of release b10573 built outside the
 * repository); without it they are reported as skipped. With --device SPEC, issue 11's table on
 * that device follows (engine_dev.c), and with --llama-bench-gpu PATH (a CUDA build of that
 * llama-bench) cache25_vs_llama_cpu_moe. */
#include "anchors.h"
#include "bench.h"
#include "report.h"

#include "base/error.h"
#include "engine/engine.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "worker/weights.h"

#include <errno.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The shape issue 10 measures llama.cpp on: qwen3moe, Q4_K experts, ~1.06 GB. */
static const char *const model_flags[] = {
    "--arch",         "qwen3moe",
    "--embd",         "1024",
    "--layers",       "12",
    "--experts",      "64",
    "--experts-used", "8",
    "--expert-ff",    "768",
    "--heads",        "16",
    "--kv-heads",     "4",
    "--head-dim",     "64",
    "--vocab",        "4096",
    "--types",        "experts=Q4_K,attn=Q8_0,embd=Q8_0,output=Q6_K",
    "--seed",         "10",
};

/* The model and its files mapped read-only through the worker's weight view (prefaulted, so the
 * timed decodes do not pay the first touch of every page, as a worker's floor view does not). */
struct view {
	struct wf_model *m;
	struct wf_weight_view w;
};

static void view_close(struct view *v)
{
	wf_weight_view_release(&v->w);
	wf_model_close(v->m);
	memset(v, 0, sizeof *v);
}

static int view_open(const char *path, struct view *v)
{
	struct wf_diag d = {{0}};
	int rc = wf_model_open(path, &v->m, &d);
	if (rc == 0)
		rc = wf_weight_view_map_files(v->m, &v->w, &d);
	if (rc < 0) {
		fprintf(stderr, "wf-bench: %s: %s\n", path, wf_diag_str(&d, rc));
		view_close(v);
	}
	return rc;
}

/* Deterministic token ids (like llama-bench's random ones: the experts a token picks vary). */
static int32_t next_token(uint64_t *state, uint32_t n_vocab)
{
	*state = *state * 6364136223846793005ull + 1442695040888963407ull;
	return (int32_t)((*state >> 33) % n_vocab);
}

/* Clears every sequence's KV. */
static void reset(struct wf_engine *e, uint32_t n_seq)
{
	for (uint32_t s = 0; s < n_seq; s++)
		wf_engine_seq_truncate(e, s, 0);
}

/* Prompt tokens/s: n_prompt tokens of sequence 0 in one batch, logits for the last one; the mean
 * of reps runs' tokens/s (as llama-bench averages). Negative on failure. */
static double measure_prefill(struct wf_engine *e, const struct wf_engine_info *info,
                              uint32_t n_prompt, int reps, float *logits)
{
	int32_t *tok = calloc(n_prompt, sizeof *tok);
	uint32_t *pos = calloc(n_prompt, sizeof *pos), *seq = calloc(n_prompt, sizeof *seq);
	double sum = 0;
	uint64_t rng = 1;
	int done = 0;
	if (!tok || !pos || !seq)
		goto out;
	for (uint32_t i = 0; i < n_prompt; i++)
		tok[i] = next_token(&rng, info->n_vocab), pos[i] = i, seq[i] = 0;
	for (int r = 0; r < reps; r++) {
		struct wf_engine_batch b = {.n = n_prompt, .tokens = tok, .pos = pos, .seq = seq};
		struct wf_diag d = {{0}};
		reset(e, 1);
		double t0 = bench_now();
		int rc = wf_engine_decode(e, &b, logits, &d);
		double secs = bench_now() - t0;
		if (rc < 0) {
			fprintf(stderr, "wf-bench: prefill: %s\n", wf_diag_str(&d, rc));
			goto out;
		}
		sum += n_prompt / secs;
		done++;
	}
out:
	free(tok);
	free(pos);
	free(seq);
	return done == reps ? sum / reps : -1;
}

/* Aggregate decode tokens/s of n_seq sequences decoding together from an empty cache, one token
 * per sequence per step, n_gen steps (llama-bench's tg: no prompt, random tokens); the mean over
 * reps. One untimed step first so the pool's threads and the weights' TLB entries are warm. */
static double measure_decode(struct wf_engine *e, const struct wf_engine_info *info, uint32_t n_seq,
                             uint32_t n_gen, int reps, float *logits)
{
	int32_t tok[8];
	uint32_t pos[8], seq[8];
	bool want[8];
	double sum = 0;
	uint64_t rng = 2;
	for (int r = -1; r < reps; r++) {
		uint32_t steps = r < 0 ? 1 : n_gen;
		reset(e, n_seq);
		double t0 = bench_now();
		for (uint32_t step = 0; step < steps; step++) {
			for (uint32_t s = 0; s < n_seq; s++)
				tok[s] = next_token(&rng, info->n_vocab), pos[s] = step, seq[s] = s,
				want[s] = true;
			struct wf_engine_batch b = {
			    .n = n_seq, .tokens = tok, .pos = pos, .seq = seq, .want_logits = want};
			struct wf_diag d = {{0}};
			int rc = wf_engine_decode(e, &b, logits, &d);
			if (rc < 0) {
				fprintf(stderr, "wf-bench: decode: %s\n", wf_diag_str(&d, rc));
				return -1;
			}
		}
		double secs = bench_now() - t0;
		if (r >= 0)
			sum += (double)n_seq * n_gen / secs;
	}
	return sum / reps;
}

struct measure_arg {
	uint32_t n_gen;
	int reps;
	float *logits;
};

/* Batch-1 decode of an engine built elsewhere (the post-fetch rows), as the CPU row measures. */
static double measure_one(void *arg, struct wf_engine *e, const struct wf_engine_info *info)
{
	const struct measure_arg *m = arg;
	return measure_decode(e, info, 1, m->n_gen, m->reps, m->logits);
}

/* ---- llama-bench ---- */

struct llama_figures {
	double pp, tg;     /* tokens/s of the pp and tg tests, negative when not run */
	double pg_seconds; /* mean seconds of a pg (prompt + decode) test, negative if none */
	char build[64];    /* build_commit */
	char cpu[128];     /* cpu_info */
	char gpu[128];     /* gpu_info (empty for a CPU build) */
};

static const char *jstr(struct json_object *o, const char *key)
{
	struct json_object *v;
	return json_object_object_get_ex(o, key, &v) ? json_object_get_string(v) : NULL;
}

static int64_t jint(struct json_object *o, const char *key)
{
	struct json_object *v;
	return json_object_object_get_ex(o, key, &v) ? json_object_get_int64(v) : -1;
}

/* llama-bench -o json: an array of tests, each with n_prompt, n_gen, avg_ns, avg_ts. */
static int llama_parse(const char *json_path, struct llama_figures *ret)
{
	struct json_object *j = json_object_from_file(json_path);
	struct llama_figures f = {.pp = -1, .tg = -1, .pg_seconds = -1};
	if (!j || !json_object_is_type(j, json_type_array)) {
		json_object_put(j);
		return WF_EFORMAT;
	}
	for (size_t i = 0; i < json_object_array_length(j); i++) {
		struct json_object *t = json_object_array_get_idx(j, i), *v;
		if (!json_object_object_get_ex(t, "avg_ts", &v))
			continue;
		double ts = json_object_get_double(v);
		int64_t np = jint(t, "n_prompt"), ng = jint(t, "n_gen");
		if (np > 0 && ng == 0)
			f.pp = ts;
		else if (np == 0 && ng > 0)
			f.tg = ts;
		else if (np > 0 && ng > 0)
			f.pg_seconds = (double)jint(t, "avg_ns") / 1e9;
		const char *s;
		if ((s = jstr(t, "build_commit")))
			snprintf(f.build, sizeof f.build, "%s", s);
		if ((s = jstr(t, "cpu_info")))
			snprintf(f.cpu, sizeof f.cpu, "%s", s);
		if ((s = jstr(t, "gpu_info")))
			snprintf(f.gpu, sizeof f.gpu, "%s", s);
	}
	json_object_put(j);
	*ret = f;
	return 0;
}

/* Runs llama-bench with args (after -m MODEL -t N -o json) into a temporary file and parses it;
 * *ret_wall is the process's wall time. */
static int llama_run(const char *exe, const char *model, unsigned threads, const char *const *args,
                     struct llama_figures *ret, double *ret_wall)
{
	char out[] = "/tmp/wf-bench-llama-XXXXXX", t[16];
	int fd = mkstemp(out);
	if (fd < 0)
		return -errno;
	close(fd);
	snprintf(t, sizeof t, "%u", threads);
	const char *argv[32] = {exe, "-m", model, "-t", t, "-o", "json"};
	size_t n = 7;
	for (; *args && n < 31; args++)
		argv[n++] = *args;
	argv[n] = NULL;
	double t0 = bench_now();
	int st = bench_run((char *const *)argv, out);
	double wall = bench_now() - t0;
	int rc = st == 0 ? llama_parse(out, ret) : -EIO;
	if (st != 0)
		fprintf(stderr, "wf-bench: %s exited with %d\n", exe, st);
	unlink(out);
	if (rc == 0 && ret_wall)
		*ret_wall = wall;
	return rc;
}

/* cache25_vs_llama_cpu_moe: the device table's cache-at-25% decode over llama-bench (CUDA
 * build) with every layer on the GPU but every layer's experts on the CPU. b10573's llama-bench
 * has no --cpu-moe (llama-cli's flag); -ncmoe N keeps the experts of the first N layers on the
 * CPU, so N = the model's layer count is the same placement. Skipped without a path; 1 when it
 * was given and failed. */
static int llama_gpu(const struct bench_opts *o, const char *model,
                     const struct wf_engine_info *info, uint32_t n_gen, int reps,
                     const struct bench_device_figures *df, const char *level)
{
	if (!o->llama_bench_gpu) {
		bench_skip("engine", "cache25_vs_llama_cpu_moe", "no --llama-bench-gpu PATH given");
		return 0;
	}
	char n[16], r[16], ncmoe[16], notes[768];
	snprintf(n, sizeof n, "%u", n_gen);
	snprintf(r, sizeof r, "%d", reps);
	snprintf(ncmoe, sizeof ncmoe, "%u", info->n_layer);
	const char *args[] = {"-ngl", "99", "-ncmoe", ncmoe, "-p", "0", "-n", n, "-r", r, NULL};
	struct llama_figures lf;
	if (llama_run(o->llama_bench_gpu, model, info->n_threads, args, &lf, NULL) < 0 ||
	    lf.tg <= 0) {
		fprintf(stderr, "wf-bench: %s -ngl 99 -ncmoe %s gave no tg figure\n",
		        o->llama_bench_gpu, ncmoe);
		return 1;
	}
	snprintf(notes, sizeof notes,
	         "llama-bench %s -ngl 99 -ncmoe %s -t %u -p 0 -n %u -r %d (build %s, %s); ours: "
	         "%s, dense on the device, expert cache %llu MiB (25%% of expert bytes), %u tokens "
	         "from an empty KV cache, mean of %d",
	         o->llama_bench_gpu, ncmoe, info->n_threads, n_gen, reps, lf.build,
	         lf.gpu[0] ? lf.gpu : lf.cpu, df->device, (unsigned long long)df->cache25_mb, n_gen,
	         reps);
	bench_report(&(struct bench_result){
	    .bench = "engine",
	    .metric = "cache25_vs_llama_cpu_moe",
	    .value = df->cache25,
	    .unit = "tok/s",
	    .anchor = "llama-bench tg, -ngl 99, experts on the CPU",
	    .anchor_value = lf.tg,
	    .ratio = df->cache25 / lf.tg,
	    .goal = 1.5,
	    .goal_op = df->cuda ? ">=" : NULL, /* the goal is a GPU's */
	    .notes = notes,
	    .kernels = level});
	return 0;
}

/* ---- the mode ---- */

/* The SIMD level the engine's CPU kernels run at (WF_KERNELS or the best the CPU has), for the
 * JSON lines; NULL when WF_KERNELS names a level this CPU lacks (the engine then fails too). */
static const char *kernel_level(void)
{
	enum wf_kernel_level l;
	return wf_kernels_cpu_level(&l) == 0 ? wf_kernel_level_name(l) : NULL;
}

static void ensure_model(const struct bench_opts *o, char *path, size_t len)
{
	if (o->model) {
		snprintf(path, len, "%s", o->model);
		return;
	}
	snprintf(path, len, "%s/engine-qwen3moe-q4k.gguf", o->dir);
}

int bench_engine(const struct bench_opts *o)
{
	char model_path[4200];
	struct stat st;
	ensure_model(o, model_path, sizeof model_path);
	if (!o->model) {
		if (mkdir(o->dir, 0755) < 0 && errno != EEXIST) {
			fprintf(stderr, "wf-bench: %s: %s\n", o->dir, strerror(errno));
			return 1;
		}
		if (stat(model_path, &st) != 0) {
			const char *argv[40] = {o->wfgen};
			size_t n = 1;
			for (size_t i = 0; i < sizeof model_flags / sizeof *model_flags; i++)
				argv[n++] = model_flags[i];
			argv[n++] = "-q", argv[n++] = "-o", argv[n++] = model_path, argv[n] = NULL;
			if (bench_run((char *const *)argv, NULL) != 0) {
				fprintf(stderr, "wf-bench: could not generate %s\n", model_path);
				return 1;
			}
		}
	}
	const int reps = o->iterations > 0 ? o->iterations : 3;
	/* llama-bench's defaults (-p 512 -n 128), cut down for the CI's tiny --iterations 1 runs */
	const uint32_t n_prompt = o->iterations == 1 ? 64 : 512,
	               n_gen = o->iterations == 1 ? 16 : 128;

	struct view v = {0};
	struct wf_engine *e = NULL;
	float *logits = NULL;
	struct wf_diag d = {{0}};
	int ret = 1, rc;
	if (view_open(model_path, &v) < 0)
		return 1;
	struct wf_engine_config cfg = {
	    .n_ctx = n_prompt > n_gen ? n_prompt : n_gen, .n_seq_max = 8, .n_threads = o->threads};
	const struct wf_engine_weights weights = wf_weight_view_engine(&v.w);
	if ((rc = wf_engine_create(v.m, &weights, &cfg, &e, &d)) < 0) {
		fprintf(stderr, "wf-bench: engine: %s: %s\n", model_path, wf_diag_str(&d, rc));
		goto out;
	}
	struct wf_engine_info info;
	wf_engine_get_info(e, &info);
	logits = malloc((size_t)info.n_vocab * 8 * sizeof *logits);
	if (!logits)
		goto out;

	char notes[512];
	const char *level = kernel_level();
	double pp = measure_prefill(e, &info, n_prompt, reps, logits);
	double tg = measure_decode(e, &info, 1, n_gen, reps, logits);
	struct wf_engine_stats st8;
	wf_engine_reset_stats(e);
	double tg8 = measure_decode(e, &info, 8, n_gen, reps, logits);
	wf_engine_get_stats(e, &st8);
	double bw = bench_read_bandwidth(info.n_threads, bench_read_bandwidth_size(),
	                                 reps < 3 ? reps + 1 : reps);
	if (pp < 0 || tg < 0 || tg8 < 0 || bw < 0)
		goto out;

	double bound = bw / (double)info.weight_bytes_per_token;
	snprintf(notes, sizeof notes,
	         "%u threads; %.3g GB read per token; read bandwidth %.2f GB/s (%zu MiB buffer); "
	         "bound %.1f tokens/s; %u tokens from an empty cache, mean of %d",
	         info.n_threads, info.weight_bytes_per_token / 1e9, bw / 1e9,
	         bench_read_bandwidth_size() >> 20, bound, n_gen, reps);
	bench_report(&(struct bench_result){.bench = "engine",
	                                    .metric = "decode_vs_bandwidth_bound",
	                                    .value = tg,
	                                    .unit = "tok/s",
	                                    .anchor = "read bandwidth / bytes per token",
	                                    .anchor_value = bound,
	                                    .ratio = tg / bound,
	                                    .goal = 0.85,
	                                    .goal_op = ">=",
	                                    .notes = notes,
	                                    .kernels = level});

	/* With routing spread over the experts, 8 tokens select many more distinct experts than
	 * one does, so a step reads more bytes: the batch's own bandwidth bound says how far 8
	 * sequences can go on this model, whatever the kernels. */
	const double bytes8 = st8.tokens ? (double)st8.weight_bytes / (double)st8.tokens : 0;
	const double bound8 = bytes8 > 0 ? bw / bytes8 : 0;
	snprintf(notes, sizeof notes,
	         "%u sequences x %u steps from empty caches; batch 1: %.2f tok/s; a batch-8 step "
	         "reads %.3g GB (%.3g GB a token), so memory bandwidth allows %.1f tok/s, %.2f x "
	         "batch 1's bound",
	         8u, n_gen, tg, bytes8 * 8 / 1e9, bytes8 / 1e9, bound8, bound8 / bound);
	bench_report(&(struct bench_result){.bench = "engine",
	                                    .metric = "batch8_vs_batch1",
	                                    .value = tg8,
	                                    .unit = "tok/s",
	                                    .anchor = "batch-1 decode, same run",
	                                    .anchor_value = tg,
	                                    .ratio = tg8 / tg,
	                                    .goal = 3,
	                                    .goal_op = ">=",
	                                    .notes = notes,
	                                    .kernels = level});
	snprintf(notes, sizeof notes,
	         "8 sequences; %.3g GB of weights read per token (engine's count of the experts "
	         "each step selects); read bandwidth %.2f GB/s",
	         bytes8 / 1e9, bw / 1e9);
	bench_report(&(struct bench_result){.bench = "engine",
	                                    .metric = "batch8_vs_bandwidth_bound",
	                                    .value = tg8,
	                                    .unit = "tok/s",
	                                    .anchor = "read bandwidth / bytes per token at batch 8",
	                                    .anchor_value = bound8,
	                                    .ratio = bound8 > 0 ? tg8 / bound8 : 0,
	                                    .goal = 0.85,
	                                    .goal_op = ">=",
	                                    .notes = notes,
	                                    .kernels = level});

	if (!o->llama_bench) {
		bench_skip("engine", "decode_vs_llama_cpp", "no --llama-bench PATH given");
		bench_skip("engine", "prefill_vs_llama_cpp", "no --llama-bench PATH given");
	} else {
		char p[16], n[16], r[16];
		snprintf(p, sizeof p, "%u", n_prompt);
		snprintf(n, sizeof n, "%u", n_gen);
		snprintf(r, sizeof r, "%d", reps);
		const char *args[] = {"-p", p, "-n", n, "-r", r, NULL};
		struct llama_figures lf;
		if (llama_run(o->llama_bench, model_path, info.n_threads, args, &lf, NULL) < 0 ||
		    lf.pp <= 0 || lf.tg <= 0) {
			bench_skip("engine", "decode_vs_llama_cpp",
			           "llama-bench failed (see stderr)");
			bench_skip("engine", "prefill_vs_llama_cpp",
			           "llama-bench failed (see stderr)");
		} else {
			snprintf(notes, sizeof notes,
			         "llama-bench %s -t %u -n %u -r %d (build %s, %s); ours: %u tokens "
			         "from an empty cache, mean of %d",
			         o->llama_bench, info.n_threads, n_gen, reps, lf.build, lf.cpu,
			         n_gen, reps);
			bench_report(
			    &(struct bench_result){.bench = "engine",
			                           .metric = "decode_vs_llama_cpp",
			                           .value = tg,
			                           .unit = "tok/s",
			                           .anchor = "llama-bench tg, same model/threads",
			                           .anchor_value = lf.tg,
			                           .ratio = tg / lf.tg,
			                           .goal = 1.15,
			                           .goal_op = ">=",
			                           .notes = notes,
			                           .kernels = level});
			snprintf(
			    notes, sizeof notes,
			    "llama-bench -t %u -p %u -r %d; ours: %u tokens in one batch, mean of "
			    "%d",
			    info.n_threads, n_prompt, reps, n_prompt, reps);
			bench_report(
			    &(struct bench_result){.bench = "engine",
			                           .metric = "prefill_vs_llama_cpp",
			                           .value = pp,
			                           .unit = "tok/s",
			                           .anchor = "llama-bench pp, same model/threads",
			                           .anchor_value = lf.pp,
			                           .ratio = pp / lf.pp,
			                           .goal = 1.0,
			                           .goal_op = ">=",
			                           .notes = notes,
			                           .kernels = level});
		}
	}
	/* Issue 11's rows: post-fetch and the expert cache on a throttled host device. */
	{
		struct measure_arg ma = {n_gen, reps, logits};
		struct bench_postfetch_ctx pc = {.model = v.m,
		                                 .weights = &weights,
		                                 .n_threads = info.n_threads,
		                                 .n_gen = n_gen,
		                                 .cpu_decode = tg,
		                                 .expert_bytes = v.m->expert_bytes,
		                                 .kernels = level,
		                                 .measure = measure_one,
		                                 .arg = &ma};
		for (uint32_t i = 0; i < v.m->n_tensors; i++) {
			const struct wf_tensor *t = &v.m->tensors[i];
			if (!strstr(t->name, "ffn_down_exps"))
				continue;
			const uint64_t n_x = t->n_dims > 2 ? (uint64_t)t->ne[2] : 1;
			pc.down_bytes_all += t->nbytes;
			pc.n_down += (uint32_t)n_x;
			if (t->nbytes / n_x > pc.down_bytes_max)
				pc.down_bytes_max = t->nbytes / n_x;
		}
		if (pc.n_down && bench_engine_postfetch(&pc) != 0)
			goto out;
		/* The same table on --device with the device forward pass, and llama.cpp on a
		 * GPU with its experts on the CPU. */
		if (o->device) {
			struct bench_device_figures df;
			if (!pc.n_down) {
				fprintf(stderr,
				        "wf-bench: %s has no routed experts for the device "
				        "rows\n",
				        model_path);
				goto out;
			}
			if (bench_engine_device(&pc, o->device, &df) != 0)
				goto out;
			if (llama_gpu(o, model_path, &info, n_gen, reps, &df, level) != 0)
				goto out;
		}
	}
	struct bench_engine_ctx ctx = {.model_path = model_path,
	                               .model_bytes = v.m->total_bytes,
	                               .n_vocab = info.n_vocab,
	                               .n_threads = info.n_threads,
	                               .kv_bytes = info.kv_bytes,
	                               .scratch_bytes = info.scratch_bytes,
	                               .n_ctx = info.n_ctx,
	                               .n_seq = info.n_seq_max};
	char agent_exe[4096], worker_exe[4096];
	bench_tool("wf-agent", "agent", agent_exe, sizeof agent_exe);
	bench_tool("wf-worker", "worker", worker_exe, sizeof worker_exe);
	ctx.agent_exe = agent_exe, ctx.worker_exe = worker_exe;
	/* The worker rows run without the in-process engine's threads and pages in the way. */
	free(logits);
	logits = NULL;
	wf_engine_destroy(e);
	e = NULL;
	ret = bench_engine_workers(o, &ctx);
out:
	free(logits);
	wf_engine_destroy(e);
	view_close(&v);
	return ret;
}
