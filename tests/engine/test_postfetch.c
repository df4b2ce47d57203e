/* Expert post-fetch (engine/postfetch.h) on the host device: every setting gives bitwise the
 * logits of the CPU-only engine (same bytes, same kernels), the copies are used when the policy
 * waits and skipped when it does not and they are slow, and bad settings are refused. Each
 * placement test runs twice: with the dense part on the CPU, and with it on the device from the
 * device weight store's copies (dense_on_device: the plan the CUDA engine takes). */
#include "base/error.h"
#include "common/wftest.h"
#include "device/device.h"
#include "engine/engine.h"
#include "engine/postfetch.h"
#include "eweights.h"
#include "model/model.h"
#include "ondev.h"
#include "worker/weights.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

TestSuite(postfetch, .timeout = 120);

static const int32_t prompt[16] = {1, 17, 300, 42,  99, 7,  256, 311,
                                   5, 63, 128, 400, 2,  77, 150, 203};

struct model {
	struct wf_model *m;
	struct wf_weight_view v;
};

static void model_open(struct model *md)
{
	char *p = NULL;
	cr_assert(asprintf(&p, "%s/qwen3moe-tiny-q4_k_m/qwen3moe-tiny-q4_k_m.gguf",
	                   wft_reference_dir()) > 0);
	struct wf_diag d = {{0}};
	int rc = wf_model_open(p, &md->m, &d);
	cr_assert_eq(rc, 0, "%s: %s", p, wf_diag_str(&d, rc));
	rc = wf_weight_view_map_files(md->m, &md->v, &d);
	cr_assert_eq(rc, 0, "%s", wf_diag_str(&d, rc));
	free(p);
}

static void model_close(struct model *md)
{
	wf_weight_view_release(&md->v);
	wf_model_close(md->m);
}

/* The prompt in one batch (logits for every position), then 8 greedy steps: 24 rows, with the
 * engine cfg describes (n_ctx 64 and 2 threads filled in). */
/* The placement tests' second run: the dense part on the device, from the store's copies. */
static bool dense_on_device;

static float *run_with(struct model *md, struct wf_engine_config cfg,
                       struct wf_engine_stats *ret_stats)
{
	cfg.n_ctx = 64;
	cfg.dense_on_device = cfg.device && (dense_on_device || wft_engine_device());
	cfg.n_threads = 2;
	struct wft_engine x;
	struct wf_diag d = {{0}};
	int rc = wft_engine_open(md->m, &md->v, &cfg, cfg.dense_on_device, &x, &d);
	cr_assert_eq(rc, 0, "engine: %s", wf_diag_str(&d, rc));
	struct wf_engine *e = x.e;
	struct wf_engine_info info;
	wf_engine_get_info(e, &info);
	if (cfg.dense_on_device) /* its KV cache and activations, never weights (the store's) */
		cr_assert_geq(info.device_bytes, info.kv_bytes, "%llu device bytes",
		              (unsigned long long)info.device_bytes);
	const size_t V = info.n_vocab;
	float *out = malloc(24 * V * sizeof(float));
	uint32_t pos[16], seq[16] = {0};
	bool want[16];
	for (uint32_t i = 0; i < 16; i++) {
		pos[i] = i;
		want[i] = true;
	}
	struct wf_engine_batch b = {16, prompt, pos, seq, want};
	cr_assert_eq(wf_engine_decode(e, &b, out, &d), 0, "%s", d.msg);
	for (uint32_t step = 0; step < 8; step++) {
		const float *last = out + (size_t)(15 + step) * V;
		int32_t tok = 0;
		for (uint32_t i = 1; i < V; i++)
			if (last[i] > last[tok])
				tok = (int32_t)i;
		uint32_t p = 16 + step, q = 0;
		bool w = true;
		struct wf_engine_batch one = {1, &tok, &p, &q, &w};
		cr_assert_eq(wf_engine_decode(e, &one, out + (size_t)(16 + step) * V, &d), 0, "%s",
		             d.msg);
	}
	wf_engine_get_stats(e, ret_stats);
	wft_engine_close(&x);
	return out;
}

static float *run_cached(struct model *md, struct wf_device *dev,
                         const struct wf_postfetch_settings *s, uint32_t cache_mb,
                         struct wf_engine_stats *ret_stats)
{
	struct wf_engine_config cfg = {.device = dev, .postfetch = s, .expert_cache_mb = cache_mb};
	return run_with(md, cfg, ret_stats);
}

static float *run(struct model *md, struct wf_device *dev, const struct wf_postfetch_settings *s,
                  struct wf_engine_stats *ret_stats)
{
	return run_cached(md, dev, s, 0, ret_stats);
}

/* The model, the CPU engine's logits to compare with, and a host device at bw. */
struct fixture {
	struct model md;
	float *want;
	struct wf_device *dev;
};

static void fixture_open(struct fixture *f, const char *device_spec)
{
	model_open(&f->md);
	struct wf_engine_stats st;
	f->want = run(&f->md, NULL, NULL, &st);
	cr_expect_eq(st.fetch_experts, 0);
	struct wf_diag d = {{0}};
	if ((f->dev = wft_engine_device())) /* the gpu build: its device, not the host's */
		return;
	cr_assert_eq(wf_device_open(device_spec, &f->dev, &d), 0, "%s", d.msg);
}

/* The same with a device that injects opts (device.h: bw=, fail=): the suite's device with them
 * on the gpu build (the CUDA backend takes the host backend's injections), else the host's. */
static void fixture_open_with(struct fixture *f, const char *opts)
{
	char spec[128];
	model_open(&f->md);
	struct wf_engine_stats st;
	f->want = run(&f->md, NULL, NULL, &st);
	cr_expect_eq(st.fetch_experts, 0);
	struct wf_diag d = {{0}};
#ifdef WFT_ENGINE_DEVICE
	(void)wft_engine_device(); /* registers the backend and its kernels */
	snprintf(spec, sizeof spec, "%s,%s", WFT_ENGINE_DEVICE, opts);
#else
	snprintf(spec, sizeof spec, "host:%s", opts);
#endif
	int rc = wf_device_open(spec, &f->dev, &d);
	cr_assert_eq(rc, 0, "%s: %s", spec, wf_diag_str(&d, rc));
}

static void fixture_close(struct fixture *f)
{
	if (f->dev != wft_engine_device())
		wf_device_close(f->dev);
	free(f->want);
	model_close(&f->md);
}

static void every_setting_gives_the_cpu_engines_logits(void)
{
	struct fixture fx;
	fixture_open(&fx, "host:bw=1G");
	struct wf_engine_stats st;

	struct {
		const char *what;
		struct wf_postfetch_settings s;
	} cases[] = {
	    {"blocking", {.enable = true, .block_on_miss = true}},
	    {"non-blocking", {.enable = true}},
	    {"one transfer a step", {.enable = true, .block_on_miss = true, .max_transfers = 1}},
	    {"1 MiB scratchpad, dedicated streams",
	     {.enable = true,
	      .block_on_miss = true,
	      .scratchpad_mb = 1,
	      .dedicated_streams = true}},
	    {"forced to the cpu", {.enable = true, .force_cpu = true}},
	    {"off", {.enable = false}},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		float *got = run(&fx.md, fx.dev, &cases[i].s, &st);
		char why[160];
		cr_expect(wft_rows_match(fx.want, got, 24, fx.md.m->hp.n_vocab, why, sizeof why),
		          "%s: logits differ: %s", cases[i].what, why);
		cr_log_info("%s: %llu copied, %llu used, %llu on the cpu, overlap %.2f",
		            cases[i].what, (unsigned long long)st.fetch_experts,
		            (unsigned long long)st.fetch_used,
		            (unsigned long long)st.fetch_fallbacks, st.fetch_overlap);
		const bool on = cases[i].s.enable && !cases[i].s.force_cpu;
		if (!on) {
			cr_expect_eq(st.fetch_experts, 0, "%s", cases[i].what);
		} else {
			cr_expect_gt(st.fetch_experts, 0, "%s", cases[i].what);
			cr_expect_eq(st.fetch_errors, 0, "%s", cases[i].what);
			cr_expect_eq(st.fetch_used + st.fetch_fallbacks, st.fetch_experts, "%s",
			             cases[i].what);
			cr_expect_gt(st.scratchpad_bytes, 0, "%s", cases[i].what);
		}
		if (on && cases[i].s.block_on_miss) {
			cr_expect_eq(st.fetch_fallbacks, 0, "%s: a blocking policy fell back",
			             cases[i].what);
			cr_expect_eq(st.fetch_used, st.fetch_experts, "%s", cases[i].what);
		}
		if (cases[i].s.max_transfers == 1)
			cr_expect_leq(st.fetch_experts, 24u * fx.md.m->hp.n_layer,
			              "at most one copy per layer and step");
		free(got);
	}
	fixture_close(&fx);
}

Test(postfetch, every_setting_gives_the_cpu_engines_logits)
{
	every_setting_gives_the_cpu_engines_logits();
}

Test(postfetch, every_setting_gives_the_cpu_engines_logits_on_the_device_path)
{
	dense_on_device = true;
	every_setting_gives_the_cpu_engines_logits();
}

/* Copies far slower than the compute (bw=, on the host device and on CUDA): the non-blocking
 * policy computes on the CPU instead, and the result is still the same. */
static void slow_copies_fall_back_to_the_cpu(void)
{
	struct fixture fx;
	fixture_open_with(&fx, "bw=4M");
	struct wf_engine_stats st;
	struct wf_postfetch_settings s = {.enable = true};
	float *got = run(&fx.md, fx.dev, &s, &st);
	char why[160];
	cr_expect(wft_rows_match(fx.want, got, 24, fx.md.m->hp.n_vocab, why, sizeof why), "%s",
	          why);
	cr_expect_gt(st.fetch_fallbacks, 0, "no expert fell back with copies at 4 MB/s");
	free(got);
	fixture_close(&fx);
}

Test(postfetch, slow_copies_fall_back_to_the_cpu)
{
	slow_copies_fall_back_to_the_cpu();
}

Test(postfetch, slow_copies_fall_back_to_the_cpu_on_the_device_path)
{
	dense_on_device = true;
	slow_copies_fall_back_to_the_cpu();
}

/* A device whose copies fail (fail=N, on the host device and on CUDA: every Nth copy from the
 * registered floor fails, alternately when queued and when it runs, reported by its event):
 * each failed expert is computed on the CPU instead, counted, and the logits stay the CPU
 * engine's. */
static void failing_copies_fall_back_and_are_counted(void)
{
	struct fixture fx;
	fixture_open_with(&fx, "bw=1G,fail=3");
	struct wf_engine_stats st;
	const struct wf_postfetch_settings policies[] = {{.enable = true, .block_on_miss = true},
	                                                 {.enable = true}};
	const uint32_t caches[] = {0, 2};
	for (size_t p = 0; p < 2; p++)
		for (size_t c = 0; c < 2; c++) {
			float *got = run_cached(&fx.md, fx.dev, &policies[p], caches[c], &st);
			char why[160];
			cr_expect(
			    wft_rows_match(fx.want, got, 24, fx.md.m->hp.n_vocab, why, sizeof why),
			    "cache %u MiB, blocking %d: %s", caches[c],
			    (int)policies[p].block_on_miss, why);
			cr_expect_gt(st.fetch_errors, 0, "cache %u MiB: no failure seen",
			             caches[c]);
			cr_expect_gt(st.fetch_fallbacks, 0, "cache %u MiB: nothing fell back",
			             caches[c]);
			cr_log_info(
			    "fail=3, cache %u MiB, blocking %d: %llu errors, %llu fallbacks, %llu "
			    "used",
			    caches[c], (int)policies[p].block_on_miss,
			    (unsigned long long)st.fetch_errors,
			    (unsigned long long)st.fetch_fallbacks,
			    (unsigned long long)st.fetch_used);
			free(got);
		}
	fixture_close(&fx);
}

Test(postfetch, failing_copies_fall_back_and_are_counted)
{
	failing_copies_fall_back_and_are_counted();
}

Test(postfetch, failing_copies_fall_back_and_are_counted_on_the_device_path)
{
	dense_on_device = true;
	failing_copies_fall_back_and_are_counted();
}

/* The expert cache: every size, from one slot to every expert of the model, gives the same
 * logits; a cache that holds the whole model hits ever more as decoding goes on, and misses only
 * what it never saw. (The tiny model: 3 layers x 16 experts, down projections of 42 KiB.) */
static void every_cache_size_gives_the_cpu_engines_logits(void)
{
	struct fixture fx;
	fixture_open(&fx, "host:bw=1G");
	struct wf_engine_stats st;
	const uint32_t sizes[] = {1, 2, 64};
	const struct wf_postfetch_settings policies[] = {{.enable = true, .block_on_miss = true},
	                                                 {.enable = true}};
	for (size_t p = 0; p < 2; p++)
		for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
			float *got = run_cached(&fx.md, fx.dev, &policies[p], sizes[i], &st);
			char why[160];
			cr_expect(
			    wft_rows_match(fx.want, got, 24, fx.md.m->hp.n_vocab, why, sizeof why),
			    "cache %u MiB, %s: logits differ: %s", sizes[i],
			    policies[p].block_on_miss ? "blocking" : "non-blocking", why);
			cr_expect_leq(st.fetch_experts, st.fetch_misses,
			              "a copy for every miss at most");
			cr_expect_gt(st.fetch_hits + st.fetch_misses, 0);
			cr_log_info(
			    "cache %u MiB: %llu hits, %llu misses, %llu copied, %.1f MB slots",
			    sizes[i], (unsigned long long)st.fetch_hits,
			    (unsigned long long)st.fetch_misses,
			    (unsigned long long)st.fetch_experts, st.scratchpad_bytes / 1e6);
			if (sizes[i] == 64 && policies[p].block_on_miss) {
				/* All 48 experts fit: at most 48 misses (one per expert ever seen).
				 */
				cr_expect_leq(st.fetch_misses, 48u);
				cr_expect_gt(st.fetch_hits, st.fetch_misses);
				cr_expect_eq(st.fetch_experts, st.fetch_misses);
				/* Where the device computes the dense part the cache keeps experts
				 * whole (hits run wholly on the device), else down projections. */
				if (dense_on_device || wft_engine_device())
					cr_expect_gt(st.fetch_whole, 0);
				else
					cr_expect_eq(st.fetch_whole, 0);
			}
			free(got);
		}
	/* A cache without post-fetch is refused: its misses would have no way in. */
	struct wf_postfetch_settings off = {.enable = false};
	struct wf_engine_config cfg = {
	    .n_ctx = 64, .device = fx.dev, .postfetch = &off, .expert_cache_mb = 8};
	struct wf_engine *e = NULL;
	struct wf_diag d = {{0}};
	const struct wf_engine_weights w = wf_weight_view_engine(&fx.md.v);
	cr_expect_eq(wf_engine_create(fx.md.m, &w, &cfg, &e, &d), WF_EINVAL);
	cr_expect_null(e);
	fixture_close(&fx);
}

Test(postfetch, every_cache_size_gives_the_cpu_engines_logits)
{
	every_cache_size_gives_the_cpu_engines_logits();
}

Test(postfetch, every_cache_size_gives_the_cpu_engines_logits_on_the_device_path)
{
	dense_on_device = true;
	every_cache_size_gives_the_cpu_engines_logits();
}

/* Placement (--n-cpu-moe N): the experts of layers N and up resident on the device, the first N
 * host-side (post-fetched or on the CPU): every split gives the same logits. */
static void every_placement_gives_the_cpu_engines_logits(void)
{
	struct fixture fx;
	fixture_open(&fx, "host:bw=1G");
	struct wf_engine_stats st;
	const uint32_t n_layer = fx.md.m->hp.n_layer;
	for (int pf = 0; pf < 2; pf++)
		for (uint32_t n_cpu = 0; n_cpu <= n_layer; n_cpu++) {
			struct wf_postfetch_settings s = {.enable = pf == 1, .block_on_miss = true};
			struct wf_engine_config cfg = {.device = fx.dev,
			                               .postfetch = &s,
			                               .experts_on_device = true,
			                               .n_cpu_moe = n_cpu};
			float *got = run_with(&fx.md, cfg, &st);
			char why[160];
			cr_expect(
			    wft_rows_match(fx.want, got, 24, fx.md.m->hp.n_vocab, why, sizeof why),
			    "n_cpu_moe %u, post-fetch %d: logits differ: %s", n_cpu, pf, why);
			cr_expect_eq(st.resident_bytes > 0, n_cpu < n_layer, "n_cpu_moe %u", n_cpu);
			cr_expect_eq(st.resident_lookups > 0, n_cpu < n_layer, "n_cpu_moe %u",
			             n_cpu);
			cr_expect_eq(st.fetch_experts > 0, pf == 1 && n_cpu > 0,
			             "n_cpu_moe %u, post-fetch %d: %llu copies", n_cpu, pf,
			             (unsigned long long)st.fetch_experts);
			free(got);
		}
	/* Resident experts need a device. */
	struct wf_engine_config bad = {.n_ctx = 64, .experts_on_device = true};
	struct wf_engine *e = NULL;
	struct wf_diag d = {{0}};
	const struct wf_engine_weights w = wf_weight_view_engine(&fx.md.v);
	cr_expect_eq(wf_engine_create(fx.md.m, &w, &bad, &e, &d), WF_EINVAL);
	fixture_close(&fx);
}

Test(postfetch, every_placement_gives_the_cpu_engines_logits)
{
	every_placement_gives_the_cpu_engines_logits();
}

Test(postfetch, every_placement_gives_the_cpu_engines_logits_on_the_device_path)
{
	dense_on_device = true;
	every_placement_gives_the_cpu_engines_logits();
}

Test(postfetch, settings_by_name_and_from_the_environment)
{
	struct wf_postfetch_settings s;
	wf_postfetch_settings_default(&s);
	cr_expect(s.enable && s.block_on_miss && !s.force_cpu && !s.max_transfers &&
	          !s.scratchpad_mb && !s.dedicated_streams && !s.debug);
	struct wf_diag d = {{0}};
	cr_expect_eq(wf_postfetch_settings_set(&s, "block-on-miss", "off", &d), 0);
	cr_expect(!s.block_on_miss);
	cr_expect_eq(wf_postfetch_settings_set(&s, "WF_POSTFETCH_MAX_TRANSFERS", "12", &d), 0);
	cr_expect_eq(s.max_transfers, 12);
	cr_expect_eq(wf_postfetch_settings_set(&s, "scratchpad_mb", "64", &d), 0);
	cr_expect_eq(s.scratchpad_mb, 64);
	d.msg[0] = 0;
	cr_expect_eq(wf_postfetch_settings_set(&s, "max_transfers", "4097", &d), WF_EINVAL);
	cr_expect(strstr(d.msg, "MAX_TRANSFERS") != NULL, "%s", d.msg);
	d.msg[0] = 0;
	cr_expect_eq(wf_postfetch_settings_set(&s, "max_transfers", "-1", &d), WF_EINVAL);
	d.msg[0] = 0;
	cr_expect_eq(wf_postfetch_settings_set(&s, "enable", "maybe", &d), WF_EINVAL);
	cr_expect(strstr(d.msg, "maybe") != NULL, "%s", d.msg);
	d.msg[0] = 0;
	cr_expect_eq(wf_postfetch_settings_set(&s, "speed", "1", &d), WF_ENOT_FOUND);
	cr_expect_eq(s.max_transfers, 12, "a refused value changes nothing");

	wf_postfetch_settings_default(&s);
	setenv("WF_POSTFETCH_FORCE_CPU", "yes", 1);
	setenv("WF_POSTFETCH_DEDICATED_STREAMS", "1", 1);
	cr_expect_eq(wf_postfetch_settings_from_env(&s, &d), 0, "%s", d.msg);
	cr_expect(s.force_cpu && s.dedicated_streams);
	setenv("WF_POSTFETCH_SCRATCH_MB", "1", 1); /* a typo is refused, not ignored */
	d.msg[0] = 0;
	cr_expect_eq(wf_postfetch_settings_from_env(&s, &d), WF_ENOT_FOUND);
	cr_expect(strstr(d.msg, "SCRATCH_MB") != NULL, "%s", d.msg);
}
