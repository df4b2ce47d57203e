/* wf-bench engine --device SPEC: issue 11's table on a device, with the dense part on the device
 * (from the device weight store's copies, the KV cache and activations on the device; always so
 * on CUDA, asked for with dense_on_device on the host device). Batch-1 decode tokens/s, measured as
 * the CPU rows are, with the routed experts
 *   dev_resident                  all resident on the device (n_cpu_moe 0), over the CPU engine
 *                                 without a device in the same run;
 *   dev_cpu_experts               all in the floor and computed by the CPU, post-fetch off
 *                                 (llama.cpp's --cpu-moe), over dev_resident;
 *   dev_postfetch_vs_cpu_experts  post-fetched (blocking, scratchpad only), over dev_cpu_experts;
 *   dev_cache25_vs_cpu_experts    an expert cache of 25% of the expert bytes (whole experts:
 *                                 a hit runs on the device), over dev_cpu_experts;
 *   dev_cache_full_vs_resident    a cache that holds every expert, warmed by one untimed
 *                                 measurement (so >= the working set), over dev_resident: the
 *                                 issue's goal >= 0.9 on a GPU.
 * Notes carry the overlap, the fallback rate (experts that asked for their slot and were computed
 * on the CPU after all), the hit rate, the whole hits and the device's name. On the host device
 * the "device" is this CPU, so the rows test the pipeline and price its copies; the goals apply to
 * a GPU only. */
#include "bench.h"
#include "report.h"

#include "device/device.h"
#include "engine/engine.h"
#include "engine/postfetch.h"
#include "model/model.h"

#include <stdio.h>
#include <string.h>

/* One configuration's figures. */
struct dev_row {
	double tps;
	struct wf_engine_stats st;
};

static double rate(uint64_t num, uint64_t den)
{
	return den ? (double)num / (double)den : 0.0;
}

/* "overlap 0.42, fallback rate 0.000, hit rate 0.871, 123 whole hits" */
static void fetch_notes(const struct wf_engine_stats *s, char *out, size_t len)
{
	char ov[32];
	if (s->fetch_overlap < 0)
		snprintf(ov, sizeof ov, "n/a");
	else
		snprintf(ov, sizeof ov, "%.3f", s->fetch_overlap);
	const double tok = s->tokens ? (double)s->tokens : 1.0;
	snprintf(
	    out, len,
	    "overlap %s, fallback rate %.3f, hit rate %.3f, %llu whole hits; %.2f MB copied per "
	    "token",
	    ov, rate(s->fetch_fallbacks, s->fetch_used + s->fetch_fallbacks),
	    rate(s->fetch_hits, s->fetch_hits + s->fetch_misses),
	    (unsigned long long)s->fetch_whole, s->fetch_bytes / 1e6 / tok);
}

/* Bytes of one whole-expert cache slot (down, gate, up, each 256-byte aligned, as engine/fetch.c
 * lays them out), and the number of (layer, expert) pairs. */
static void slot_shape(const struct wf_model *m, uint64_t *ret_slot, uint64_t *ret_n)
{
	static const char *const parts[] = {"ffn_down_exps", "ffn_gate_exps", "ffn_up_exps"};
	uint64_t slot = 0, n = 0;
	for (int p = 0; p < 3; p++) {
		uint64_t max = 0;
		for (uint32_t i = 0; i < m->n_tensors; i++) {
			const struct wf_tensor *t = &m->tensors[i];
			if (!strstr(t->name, parts[p]))
				continue;
			const uint64_t n_x = t->n_dims > 2 ? (uint64_t)t->ne[2] : 1;
			if (t->nbytes / n_x > max)
				max = t->nbytes / n_x;
			if (p == 0)
				n += n_x;
		}
		slot += (max + 255u) & ~(uint64_t)255u;
	}
	*ret_slot = slot;
	*ret_n = n;
}

int bench_engine_device(const struct bench_postfetch_ctx *c, const char *spec,
                        struct bench_device_figures *ret)
{
	struct wf_device *dev = NULL;
	struct wf_diag d = {{0}};
	int rc = wf_device_open(spec, &dev, &d);
	if (rc < 0) {
		fprintf(stderr, "wf-bench: device %s: %s\n", spec, wf_diag_str(&d, rc));
		return 1;
	}
	const char *name = wf_device_name(dev);
	const bool cuda = wf_device_kind(dev) == WF_DEVICE_KIND_CUDA;
	uint64_t slot, n_pairs;
	slot_shape(c->model, &slot, &n_pairs);
	uint64_t mb25 = c->expert_bytes / 4 >> 20;
	if (mb25 == 0)
		mb25 = 1; /* the cache's unit; the notes say what it came to */
	const uint64_t mb_full = (slot * n_pairs >> 20) + 1;

	struct wf_postfetch_settings on, off;
	wf_postfetch_settings_default(&on);
	off = on;
	off.enable = false;
	struct wf_engine_config base = {.device = dev, .dense_on_device = true, .postfetch = &on};
	struct wf_engine_config resident = base, cpu = base, pf = base, c25 = base, full = base;
	/* no post-fetch where nothing is fetched: no scratchpad held beside the resident experts */
	resident.experts_on_device = true, resident.n_cpu_moe = 0, resident.postfetch = &off;
	cpu.postfetch = &off;
	c25.expert_cache_mb = (uint32_t)mb25;
	full.expert_cache_mb = (uint32_t)mb_full;
	struct dev_row r_res, r_cpu, r_pf, r_25, r_full;
	r_res.tps = bench_engine_decode_cfg(c, &resident, false, &r_res.st);
	r_cpu.tps = r_res.tps < 0 ? -1 : bench_engine_decode_cfg(c, &cpu, false, &r_cpu.st);
	r_pf.tps = r_cpu.tps < 0 ? -1 : bench_engine_decode_cfg(c, &pf, false, &r_pf.st);
	r_25.tps = r_pf.tps < 0 ? -1 : bench_engine_decode_cfg(c, &c25, false, &r_25.st);
	r_full.tps = r_25.tps < 0 ? -1 : bench_engine_decode_cfg(c, &full, true, &r_full.st);
	int ret_code = 1;
	if (r_full.tps <= 0 || r_res.tps <= 0 || r_cpu.tps <= 0)
		goto out;

	char notes[768], fetch[256];
	/* the goals are the for a GPU; the host device's rows are records */
	const char *goal_op = cuda ? ">=" : NULL;
	snprintf(notes, sizeof notes,
	         "%s; dense weights, KV cache and all %llu experts on the device (n_cpu_moe 0, "
	         "%.0f MB); anchor: the CPU engine without a device, %u threads",
	         name, (unsigned long long)n_pairs, c->expert_bytes / 1e6, c->n_threads);
	bench_report(&(struct bench_result){.bench = "engine",
	                                    .metric = "dev_resident",
	                                    .value = r_res.tps,
	                                    .unit = "tok/s",
	                                    .anchor = "CPU engine, no device, same run",
	                                    .anchor_value = c->cpu_decode,
	                                    .ratio = r_res.tps / c->cpu_decode,
	                                    .notes = notes,
	                                    .kernels = c->kernels});
	snprintf(notes, sizeof notes,
	         "%s; dense weights and KV cache on the device, every expert computed by the CPU "
	         "from the floor, post-fetch off (llama.cpp's --cpu-moe), %u threads",
	         name, c->n_threads);
	bench_report(&(struct bench_result){.bench = "engine",
	                                    .metric = "dev_cpu_experts",
	                                    .value = r_cpu.tps,
	                                    .unit = "tok/s",
	                                    .anchor = "dev_resident, same run",
	                                    .anchor_value = r_res.tps,
	                                    .ratio = r_cpu.tps / r_res.tps,
	                                    .notes = notes,
	                                    .kernels = c->kernels});
	fetch_notes(&r_pf.st, fetch, sizeof fetch);
	snprintf(notes, sizeof notes, "%s; post-fetch, blocking, scratchpad %.1f MB; %s", name,
	         r_pf.st.scratchpad_bytes / 1e6, fetch);
	bench_report(&(struct bench_result){.bench = "engine",
	                                    .metric = "dev_postfetch_vs_cpu_experts",
	                                    .value = r_pf.tps,
	                                    .unit = "tok/s",
	                                    .anchor = "dev_cpu_experts, same run",
	                                    .anchor_value = r_cpu.tps,
	                                    .ratio = r_pf.tps / r_cpu.tps,
	                                    .notes = notes,
	                                    .kernels = c->kernels});
	fetch_notes(&r_25.st, fetch, sizeof fetch);
	snprintf(notes, sizeof notes,
	         "%s; expert cache %llu MiB (25%% of %.1f MB of expert bytes; whole experts, %llu "
	         "of %llu fit), cold at the start; %s",
	         name, (unsigned long long)mb25, c->expert_bytes / 1e6,
	         (unsigned long long)(r_25.st.scratchpad_bytes / (slot ? slot : 1)),
	         (unsigned long long)n_pairs, fetch);
	bench_report(&(struct bench_result){.bench = "engine",
	                                    .metric = "dev_cache25_vs_cpu_experts",
	                                    .value = r_25.tps,
	                                    .unit = "tok/s",
	                                    .anchor = "dev_cpu_experts, same run",
	                                    .anchor_value = r_cpu.tps,
	                                    .ratio = r_25.tps / r_cpu.tps,
	                                    .notes = notes,
	                                    .kernels = c->kernels});
	fetch_notes(&r_full.st, fetch, sizeof fetch);
	snprintf(notes, sizeof notes,
	         "%s; expert cache %llu MiB (every expert whole), warmed by one untimed "
	         "measurement; %s%s",
	         name, (unsigned long long)mb_full, fetch,
	         cuda ? "" : "; goal 0.9 on a GPU, none on the host device");
	bench_report(&(struct bench_result){.bench = "engine",
	                                    .metric = "dev_cache_full_vs_resident",
	                                    .value = r_full.tps,
	                                    .unit = "tok/s",
	                                    .anchor = "dev_resident, same run",
	                                    .anchor_value = r_res.tps,
	                                    .ratio = r_full.tps / r_res.tps,
	                                    .goal = 0.9,
	                                    .goal_op = goal_op,
	                                    .notes = notes,
	                                    .kernels = c->kernels});

	ret->cache25 = r_25.tps;
	ret->cache25_mb = mb25;
	snprintf(ret->device, sizeof ret->device, "%s", name);
	ret->cuda = cuda;
	ret_code = 0;
out:
	wf_device_close(dev);
	return ret_code;
}
