/* The upper floor's promise: the logits do not depend on the placement. tests/data/golden holds
 * the logits of the engine this executor replaced (per CPU kernel level: the levels round
 * differently). Every placement on the host device (the CPU alone; the device computing the dense
 * part or not, from the device weight store's copies or the floor in place; resident experts;
 * the expert cache small and large; post-fetch blocking and not, one transfer a step, dedicated
 * streams, slow and failing copies) must give them bit for bit.
 *
 * Compiled again for CUDA (tests/cuda, WFT_ENGINE_DEVICE): the placements on the GPU against the
 * same files within the reference criteria, and the placements whose experts all run on the
 * device (resident, or the cache's whole hits once warm) against each other to 1e-4 (the same
 * kernels on the same bytes: only the grouping of rows per launch differs). */
#include "base/error.h"
#include "common/wftest.h"
#include "device/device.h"
#include "engine/engine.h"
#include "eweights.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "ondev.h"
#include "worker/weights.h"

#include <criterion/criterion.h>
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

TestSuite(engine_golden, .timeout = 300);

struct placement {
	const char *name;
	const char *device; /* NULL: no device */
	bool dense, copies, resident;
	uint32_t n_cpu_moe, cache_mb;
	bool nonblocking, dedicated, force_cpu;
	uint32_t max_transfers, scratchpad_mb;
};

static const struct placement placements[] = {
    {.name = "cpu"},
    {.name = "host, post-fetch to a cpu pass", .device = "host"},
    {.name = "host, dense on the device", .device = "host", .dense = true},
    {.name = "host, dense from the store", .device = "host", .dense = true, .copies = true},
    {.name = "host, all experts resident",
     .device = "host",
     .dense = true,
     .copies = true,
     .resident = true},
    {.name = "host, n-cpu-moe 1 split",
     .device = "host",
     .dense = true,
     .copies = true,
     .resident = true,
     .n_cpu_moe = 1},
    {.name = "host, cpu pass with resident layers",
     .device = "host",
     .copies = true,
     .resident = true,
     .n_cpu_moe = 2},
    {.name = "host, cpu-moe + 1 MiB cache", .device = "host", .dense = true, .cache_mb = 1},
    {.name = "host, cpu pass + 2 MiB cache of down projections", .device = "host", .cache_mb = 2},
    {.name = "host, 64 MiB cache (all whole)",
     .device = "host",
     .dense = true,
     .copies = true,
     .cache_mb = 64},
    {.name = "host, slow copies, non-blocking, cache",
     .device = "host:bw=1G",
     .dense = true,
     .cache_mb = 2,
     .nonblocking = true},
    {.name = "host, failing copies, cache", .device = "host:fail=3", .dense = true, .cache_mb = 1},
    {.name = "host, failing slow copies, non-blocking",
     .device = "host:bw=2G,fail=2",
     .nonblocking = true},
    {.name = "host, one transfer a step, dedicated streams, 1 MiB scratchpad",
     .device = "host:bw=4G",
     .dense = true,
     .max_transfers = 1,
     .dedicated = true,
     .scratchpad_mb = 1},
    {.name = "host, post-fetch off", .device = "host", .dense = true, .force_cpu = true},
};
#define N_PLACEMENTS (sizeof(placements) / sizeof(placements[0]))

struct golden {
	char model[64], kv[8];
	struct wf_model *m;
	struct wf_weight_view v;
	int32_t prompt[16], feed[16];
	uint32_t n_vocab;
	float *want; /* 32 rows */
};

static const char *level_name(void)
{
	enum wf_kernel_level level;
	cr_assert_eq(wf_kernels_cpu_level(&level), 0);
	return wf_kernel_level_name(level);
}

static void golden_open(const char *model, const char *kv, struct golden *g)
{
	memset(g, 0, sizeof(*g));
	snprintf(g->model, sizeof(g->model), "%s", model);
	snprintf(g->kv, sizeof(g->kv), "%s", kv);
	char *dir = NULL, *man = NULL, *path = NULL, *gp = NULL;
	cr_assert(asprintf(&dir, "%s/%s", wft_reference_dir(), model) > 0);
	cr_assert(asprintf(&man, "%s/manifest.json", dir) > 0);
	json_object *j = json_object_from_file(man), *o = NULL;
	cr_assert_not_null(j, "%s", man);
	cr_assert(json_object_object_get_ex(j, "load_this_file", &o));
	cr_assert(asprintf(&path, "%s/%s", dir, json_object_get_string(o)) > 0);
	json_object *pi = NULL, *gi = NULL;
	cr_assert(json_object_object_get_ex(j, "prompt_ids", &pi));
	cr_assert(json_object_object_get_ex(j, "generated_ids", &gi));
	for (int i = 0; i < 16; i++) {
		g->prompt[i] = json_object_get_int(json_object_array_get_idx(pi, i));
		g->feed[i] = json_object_get_int(json_object_array_get_idx(gi, i));
	}
	json_object_put(j);
	struct wf_diag d = {{0}};
	int rc = wf_model_open(path, &g->m, &d);
	cr_assert_eq(rc, 0, "%s: %s", path, wf_diag_str(&d, rc));
	rc = wf_weight_view_map_files(g->m, &g->v, &d);
	cr_assert_eq(rc, 0, "%s", wf_diag_str(&d, rc));
	g->n_vocab = g->m->hp.n_vocab;
	cr_assert(asprintf(&gp, "%s/tests/data/golden/%s.%s.%s.bin", wft_source_dir(), model, kv,
	                   level_name()) > 0);
	size_t len = 0;
	g->want = (float *)wft_read_file(gp, &len);
	cr_assert_not_null(g->want, "cannot read %s", gp);
	cr_assert_eq(len, 32u * g->n_vocab * sizeof(float), "%s: %zu bytes", gp, len);
	free(dir);
	free(man);
	free(path);
	free(gp);
}

static void golden_close(struct golden *g)
{
	wf_weight_view_release(&g->v);
	wf_model_close(g->m);
	free(g->want);
}

/* The reference protocol (the golden files' too): the 16 prompt ids in one batch with logits
 * for every position, then the 16 fed ids one step each. */
static float *run_passes(const struct golden *g, const struct placement *p, struct wf_device *dev,
                         int passes, struct wf_engine_stats *ret_stats)
{
	struct wf_postfetch_settings pf;
	wf_postfetch_settings_default(&pf);
	pf.block_on_miss = !p->nonblocking;
	pf.dedicated_streams = p->dedicated;
	pf.force_cpu = p->force_cpu;
	pf.max_transfers = p->max_transfers;
	pf.scratchpad_mb = p->scratchpad_mb;
	struct wf_engine_config cfg = {
	    .n_ctx = 64,
	    .n_threads = 2,
	    .kv_type = strcmp(g->kv, "f32") == 0 ? WF_ENGINE_KV_F32 : WF_ENGINE_KV_F16,
	    .device = dev,
	    .postfetch = &pf,
	    .expert_cache_mb = p->cache_mb,
	    .experts_on_device = p->resident,
	    .n_cpu_moe = p->n_cpu_moe,
	    .dense_on_device = p->dense,
	};
	struct wft_engine x;
	struct wf_diag d = {{0}};
	int rc = wft_engine_open(g->m, &g->v, &cfg, p->copies, &x, &d);
	cr_assert_eq(rc, 0, "%s, %s: %s", g->model, p->name, wf_diag_str(&d, rc));
	const size_t V = g->n_vocab;
	float *out = malloc(32 * V * sizeof(float));
	uint32_t pos[16], seq[16] = {0};
	bool want[16];
	for (uint32_t i = 0; i < 16; i++) {
		pos[i] = i;
		want[i] = true;
	}
	for (int pass = 0; pass < passes; pass++) {
		cr_assert_eq(wf_engine_seq_truncate(x.e, 0, 0), 0);
		struct wf_engine_batch b = {16, g->prompt, pos, seq, want};
		rc = wf_engine_decode(x.e, &b, out, &d);
		cr_assert_eq(rc, 0, "%s, %s: %s", g->model, p->name, wf_diag_str(&d, rc));
		for (uint32_t s = 0; s < 16; s++) {
			uint32_t ps = 16 + s, q = 0;
			bool w = true;
			struct wf_engine_batch one = {1, &g->feed[s], &ps, &q, &w};
			rc = wf_engine_decode(x.e, &one, out + (size_t)(16 + s) * V, &d);
			cr_assert_eq(rc, 0, "%s, %s, step %u: %s", g->model, p->name, s,
			             wf_diag_str(&d, rc));
		}
	}
	wf_engine_get_stats(x.e, ret_stats);
	wft_engine_close(&x);
	return out;
}

static float *run(const struct golden *g, const struct placement *p, struct wf_device *dev,
                  struct wf_engine_stats *ret_stats)
{
	return run_passes(g, p, dev, 1, ret_stats);
}

static const char *const models[][2] = {
    {"mixtral-tiny-f32", "f16"},     {"mixtral-tiny-f32", "f32"},     {"qwen3moe-tiny-q4_0", "f16"},
    {"qwen3moe-tiny-q4_k_m", "f16"}, {"qwen3moe-tiny-q4_k_m", "f32"}, {"qwen3moe-tiny-q8_0", "f16"},
};

/* The placement's device: in the GPU build the suite's device, with the placement's injections
 * (bw=, fail=: the CUDA backend takes them as the host's does). */
static struct wf_device *open_device(const char *spec)
{
#ifdef WFT_ENGINE_DEVICE
	char gpu[128];
#endif
	if (wft_engine_device()) {
		const char *opts = spec ? strchr(spec, ':') : NULL;
		if (!opts)
			return wft_engine_device(); /* every placement on it */
#ifdef WFT_ENGINE_DEVICE
		snprintf(gpu, sizeof(gpu), "%s,%s", WFT_ENGINE_DEVICE, opts + 1);
		spec = gpu;
#endif
	}
	if (!spec)
		return NULL;
	struct wf_device *dev = NULL;
	struct wf_diag d = {{0}};
	int rc = wf_device_open(spec, &dev, &d);
	cr_assert_eq(rc, 0, "%s: %s", spec, wf_diag_str(&d, rc));
	return dev;
}

static void check_placement(size_t pi)
{
	const struct placement *p = &placements[pi];
	struct wf_device *dev = open_device(p->device);
	uint64_t copies = 0, errors = 0, fallbacks = 0, resident = 0;
	for (size_t mi = 0; mi < sizeof(models) / sizeof(models[0]); mi++) {
		struct golden g;
		golden_open(models[mi][0], models[mi][1], &g);
		struct wf_engine_stats st;
		float *got = run(&g, p, dev, &st);
		char why[160];
		cr_expect(wft_rows_match(g.want, got, 32, g.n_vocab, why, sizeof(why)),
		          "%s (%s KV), %s: %s", g.model, g.kv, p->name, why);
		copies += st.fetch_experts;
		errors += st.fetch_errors;
		fallbacks += st.fetch_fallbacks;
		resident += st.resident_lookups;
		free(got);
		golden_close(&g);
	}
	/* The placement did what it says (not a vacuous pass). */
	const bool pf = dev && !p->force_cpu && !(p->resident && p->n_cpu_moe == 0);
	if (pf)
		cr_expect_gt(copies, 0, "%s: no expert was post-fetched", p->name);
	else
		cr_expect_eq(copies, 0, "%s: experts were post-fetched", p->name);
	if (p->device && strstr(p->device, "fail="))
		cr_expect_gt(errors, 0, "%s: no copy failed", p->name);
	if (p->resident)
		cr_expect_gt(resident, 0, "%s: no resident expert was used", p->name);
	(void)fallbacks;
	if (dev != wft_engine_device())
		wf_device_close(dev);
}

#define PLACEMENT_TEST(i)                                                                          \
	Test(engine_golden, placement_##i)                                                         \
	{                                                                                          \
		check_placement(i);                                                                \
	}
PLACEMENT_TEST(0)
PLACEMENT_TEST(1)
PLACEMENT_TEST(2)
PLACEMENT_TEST(3)
PLACEMENT_TEST(4)
PLACEMENT_TEST(5)
PLACEMENT_TEST(6)
PLACEMENT_TEST(7)
PLACEMENT_TEST(8)
PLACEMENT_TEST(9)
PLACEMENT_TEST(10)
PLACEMENT_TEST(11)
PLACEMENT_TEST(12)
PLACEMENT_TEST(13)
PLACEMENT_TEST(14)

Test(engine_golden, every_placement_has_a_test)
{
	cr_assert_eq(N_PLACEMENTS, 15);
}

/* Device memory goes back to its level before an engine was made once the engine is destroyed
 * and its store has evicted what it loaded (the host device counts exactly; a GPU's context and
 * cuBLAS's first use are warmed up by a first round, then the second must return to the byte). */
Test(engine_golden, device_memory_back_to_baseline)
{
	struct wf_device *dev = open_device("host");
	struct golden g;
	golden_open("qwen3moe-tiny-q4_k_m", "f16", &g);
	const struct placement p = {.name = "cache, resident, copies",
	                            .device = "host",
	                            .dense = true,
	                            .copies = true,
	                            .resident = true,
	                            .n_cpu_moe = 1,
	                            .cache_mb = 8};
	struct wf_engine_stats st;
	free(run(&g, &p, dev, &st)); /* warm-up */
	size_t free0 = 0, free1 = 0, total = 0;
	cr_assert_eq(wf_device_mem_info(dev, &free0, &total, NULL), 0);
	free(run(&g, &p, dev, &st));
	cr_assert_eq(wf_device_mem_info(dev, &free1, &total, NULL), 0);
	cr_expect_eq(free1, free0, "%s: %zu bytes free before an engine, %zu after",
	             wf_device_name(dev), free0, free1);
	golden_close(&g);
	if (dev != wft_engine_device())
		wf_device_close(dev);
}

#ifdef WFT_ENGINE_DEVICE
/* Device against device: the placements whose experts all run on the GPU (every layer resident;
 * the expert cache holding every expert whole, warmed by a first pass) compute the same products
 * from the same bytes, only from another stack: 1e-4 of each other on every decode row. */
Test(engine_golden, device_placements_agree_with_each_other)
{
	struct wf_device *dev = wft_engine_device();
	struct golden g;
	golden_open("qwen3moe-tiny-q4_k_m", "f16", &g);
	const struct placement resident = {
	    .name = "resident", .dense = true, .copies = true, .resident = true};
	const struct placement cached = {
	    .name = "cache", .dense = true, .copies = true, .cache_mb = 64};
	struct wf_engine_stats st;
	float *a = run(&g, &resident, dev, &st);
	float *b = run(&g, &cached, dev, &st);
	const size_t V = g.n_vocab;
	float worst = 0;
	/* Rows 24..31: by then every expert the prompt and the first steps chose is cached whole.
	 */
	for (size_t i = 24 * V; i < 32 * V; i++) {
		const float dd = fabsf(a[i] - b[i]);
		worst = dd > worst ? dd : worst;
	}
	cr_expect_gt(st.fetch_whole, 0, "the cache ran experts whole");
	cr_expect_leq(worst, 1e-4f, "resident vs whole-slot cache: max-abs %g", worst);
	free(a);
	free(b);
	golden_close(&g);
}
#endif

/* A device lost under a running engine (a sticky error: the host device's sticky=N, a real
 * illegal address on a GPU): the decode that meets it fails with WF_EDEVICE and says so, every
 * later one fails too (never a wrong result), and the engine still goes away without hanging. */
Test(engine_golden, a_lost_device_fails_the_decode)
{
	struct golden g;
	golden_open("qwen3moe-tiny-q4_k_m", "f16", &g);
	/* Past the loads and the first steps' copies: the device is lost mid-decode. */
	struct wf_device *dev = open_device("host:sticky=200");
	struct wf_postfetch_settings pf;
	wf_postfetch_settings_default(&pf);
	const struct wf_engine_config cfg = {.n_ctx = 64,
	                                     .n_threads = 2,
	                                     .device = dev,
	                                     .postfetch = &pf,
	                                     .dense_on_device = true,
	                                     .expert_cache_mb = 1};
	struct wft_engine x;
	struct wf_diag d = {{0}};
	int rc = wft_engine_open(g.m, &g.v, &cfg, true, &x, &d);
	cr_assert_eq(rc, 0, "%s", wf_diag_str(&d, rc));
	float *out = malloc(16 * g.n_vocab * sizeof(float));
	uint32_t pos[16], seq[16] = {0};
	bool want[16] = {0};
	int first_error = 0, steps = 0;
	for (int round = 0; round < 64 && !first_error; round++, steps++) {
		cr_assert_eq(wf_engine_seq_truncate(x.e, 0, 0), 0);
		for (uint32_t i = 0; i < 16; i++)
			pos[i] = i;
		want[15] = true;
		struct wf_engine_batch b = {16, g.prompt, pos, seq, want};
		first_error = wf_engine_decode(x.e, &b, out, &d);
	}
	cr_expect_eq(first_error, WF_EDEVICE, "after %d decodes: %s", steps,
	             wf_diag_str(&d, first_error));
	cr_expect_eq(wf_device_health(dev, NULL), WF_EDEVICE);
	struct wf_engine_batch b = {16, g.prompt, pos, seq, want};
	cr_expect_lt(wf_engine_decode(x.e, &b, out, &d), 0, "a lost device never decodes again");
	wft_engine_close(&x); /* returns: nothing waits for work the lost device will not do */
	free(out);
	golden_close(&g);
	wf_device_close(dev);
}
