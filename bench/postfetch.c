/* wf-bench engine, issue 11's rows: expert post-fetch and the device expert cache on the host
 * device throttled to imitate PCIe (16 and 32 GB/s), against the CPU engine with every expert
 * read from the floor, in the same run:
 *   postfetch_vs_cpu_experts  decode tokens/s with post-fetch (blocking, no cache) over CPU-only;
 *   cache25_vs_cpu_experts    with an expert cache of 25% of the model's expert bytes;
 *   cache_full_vs_resident    a cold cache that holds every expert over every expert resident
 *                             (loaded at create: --n-cpu-moe 0);
 *   postfetch_overlap         the fraction of the copy time hidden under compute (post-fetch row).
 * On the host device the fetched experts are computed by the same CPU kernels, so these rows
 * measure what the copies and their waits cost, not what a GPU would gain: the GPU figures come
 * from the device table (engine_dev.c) with `--device cuda:0`. */
#include "bench.h"
#include "report.h"

#include "base/error.h"
#include "device/device.h"
#include "engine/engine.h"
#include "engine/postfetch.h"
#include "worker/wengine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

double bench_engine_decode_cfg(const struct bench_postfetch_ctx *c, struct wf_engine_config *cfg,
                               bool warm, struct wf_engine_stats *ret_stats)
{
	/* the measurement's positions and a few more: a model's context_length may be short */
	cfg->n_ctx = c->n_gen + 8, cfg->n_seq_max = 1, cfg->n_threads = c->n_threads;
	struct wf_worker_engine we = {0};
	struct wf_diag d = {{0}};
	/* The device's copies from a store, as a worker's engine has them. */
	int rc = wf_worker_engine_open_files(c->model, c->weights, cfg, true, &we, &d);
	struct wf_engine *e = we.engine;
	if (rc < 0) {
		fprintf(stderr, "wf-bench: engine with %s: %s\n",
		        cfg->device ? wf_device_name(cfg->device) : "no device",
		        wf_diag_str(&d, rc));
		return -1;
	}
	struct wf_engine_info info;
	wf_engine_get_info(e, &info);
	double tps = warm ? c->measure(c->arg, e, &info) : 0;
	if (tps >= 0) {
		wf_engine_reset_stats(e);
		tps = c->measure(c->arg, e, &info);
		wf_engine_get_stats(e, ret_stats);
	}
	wf_worker_engine_close(&we);
	return tps;
}

static double decode_with(const struct bench_postfetch_ctx *c, struct wf_device *dev,
                          uint32_t cache_mb, bool resident, struct wf_engine_stats *ret_stats)
{
	struct wf_postfetch_settings s;
	wf_postfetch_settings_default(&s);
	struct wf_engine_config cfg = {.device = dev,
	                               .postfetch = &s,
	                               .expert_cache_mb = cache_mb,
	                               .experts_on_device = resident};
	return bench_engine_decode_cfg(c, &cfg, false, ret_stats);
}

int bench_engine_postfetch(const struct bench_postfetch_ctx *c)
{
	const double cpu = c->cpu_decode;
	const uint64_t cache25 = c->expert_bytes / 4 >> 20;
	const uint64_t full = c->down_bytes_all >> 20;
	const char *rates[] = {"16G", "32G"};
	for (int r = 0; r < 2; r++) {
		char spec[64], notes[512];
		snprintf(spec, sizeof spec, "host:bw=%s", rates[r]);
		struct wf_device *dev = NULL;
		struct wf_diag d = {{0}};
		int rc = wf_device_open(spec, &dev, &d);
		if (rc < 0) {
			fprintf(stderr, "wf-bench: %s: %s\n", spec, wf_diag_str(&d, rc));
			return 1;
		}
		struct wf_engine_stats pf, c25, cold, warm;
		const double t_pf = decode_with(c, dev, 0, false, &pf);
		const double t_25 =
		    decode_with(c, dev, (uint32_t)(cache25 ? cache25 : 1), false, &c25);
		const double t_cold = decode_with(c, dev, (uint32_t)(full + 1), false, &cold);
		const double t_warm = decode_with(c, dev, 0, true, &warm);
		wf_device_close(dev);
		if (t_pf < 0 || t_25 < 0 || t_cold < 0 || t_warm < 0)
			return 1;
		/* per token: the stats count every decode of the measurement, warm-up included */
		const double tok = pf.tokens ? (double)pf.tokens : 1.0;
		const double tok25 = c25.tokens ? (double)c25.tokens : 1.0;
		snprintf(
		    notes, sizeof notes,
		    "%s; blocking, scratchpad %.1f MB; %.1f MB fetched per token; %llu of %llu "
		    "fetched experts computed from the copy; CPU-only decode %.2f tok/s",
		    spec, pf.scratchpad_bytes / 1e6, pf.fetch_bytes / 1e6 / tok,
		    (unsigned long long)pf.fetch_used, (unsigned long long)pf.fetch_experts, cpu);
		bench_report(&(struct bench_result){.bench = "engine",
		                                    .metric = "postfetch_vs_cpu_experts",
		                                    .value = t_pf,
		                                    .unit = "tok/s",
		                                    .anchor = "CPU experts only, same run",
		                                    .anchor_value = cpu,
		                                    .ratio = t_pf / cpu,
		                                    .notes = notes,
		                                    .kernels = c->kernels});
		snprintf(notes, sizeof notes,
		         "%s; copy time hidden under compute, over the steps whose copies all "
		         "completed; %.1f MB fetched per token",
		         spec, pf.fetch_bytes / 1e6 / tok);
		bench_report(
		    &(struct bench_result){.bench = "engine",
		                           .metric = "postfetch_overlap",
		                           .value = pf.fetch_overlap < 0 ? 0 : pf.fetch_overlap,
		                           .unit = "fraction",
		                           .anchor = "copy time",
		                           .anchor_value = 1,
		                           .ratio = pf.fetch_overlap < 0 ? 0 : pf.fetch_overlap,
		                           .notes = notes,
		                           .kernels = c->kernels});
		const uint64_t l25 = c25.fetch_hits + c25.fetch_misses;
		snprintf(notes, sizeof notes,
		         "%s; cache %llu MiB (25%% of %.0f MB of expert bytes; its slots hold down "
		         "projections, %llu of the model's %u); hit rate %.3f; %.1f MB fetched per "
		         "token",
		         spec, (unsigned long long)cache25, c->expert_bytes / 1e6,
		         (unsigned long long)(c25.scratchpad_bytes /
		                              (c->down_bytes_max ? c->down_bytes_max : 1)),
		         c->n_down, l25 ? (double)c25.fetch_hits / (double)l25 : 0.0,
		         c25.fetch_bytes / 1e6 / tok25);
		bench_report(&(struct bench_result){.bench = "engine",
		                                    .metric = "cache25_vs_cpu_experts",
		                                    .value = t_25,
		                                    .unit = "tok/s",
		                                    .anchor = "CPU experts only, same run",
		                                    .anchor_value = cpu,
		                                    .ratio = t_25 / cpu,
		                                    .notes = notes,
		                                    .kernels = c->kernels});
		const uint64_t lc = cold.fetch_hits + cold.fetch_misses;
		snprintf(
		    notes, sizeof notes,
		    "%s; a cache of every down projection (%llu MiB), cold: hit rate %.3f; "
		    "resident: all %u down projections loaded at create (--n-cpu-moe 0, %.0f MB)",
		    spec, (unsigned long long)(full + 1),
		    lc ? (double)cold.fetch_hits / (double)lc : 0.0, c->n_down,
		    warm.resident_bytes / 1e6);
		bench_report(&(struct bench_result){.bench = "engine",
		                                    .metric = "cache_full_vs_resident",
		                                    .value = t_cold,
		                                    .unit = "tok/s",
		                                    .anchor = "every expert resident, same run",
		                                    .anchor_value = t_warm,
		                                    .ratio = t_cold / t_warm,
		                                    .notes = notes,
		                                    .kernels = c->kernels});
	}
	return 0;
}
