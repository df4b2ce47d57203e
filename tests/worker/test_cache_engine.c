/* The device weight store as an engine sees it (worker/cache.h, wf_cache_acquire_sets and the
 * refresh): the sets an engine computes from are loaded alone and held (the model cannot be
 * evicted under it), what the control plane pinned is what the engine gets (no second copy),
 * external mode loads nothing; a published generation gives the refreshed tensors new copies of
 * the floor's new bytes, the old ones stay until refresh_done, and the device goes back to its
 * baseline when everything is evicted. */
#include "base/error.h"
#include "common/wftest.h"
#include "engine/engine.h"
#include "shm/region.h"
#include "worker/cache.h"
#include "wtest.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MiB (1ull << 20)

TestSuite(cache_engine, .timeout = 120);

struct fx {
	char *dir, *floor_dir;
	struct wf_shm_config shm;
	struct wf_model *m;
	struct wf_shm_region *agent_floor;
	struct wf_device *dev;
	struct wf_cache *c;
	uint32_t id;
	size_t baseline;
	bool *wanted;
	void **ptrs;
};

static void fx_open(struct fx *f, const char *tag)
{
	memset(f, 0, sizeof(*f));
	f->dir = wft_tmpdir(tag);
	f->floor_dir = wt_shm_dir(tag);
	f->shm = (struct wf_shm_config){.dir = f->floor_dir, .spare_bytes = 4 * MiB};
	char path[512], err[600];
	snprintf(path, sizeof(path), "%s/moe.gguf", f->dir);
	snprintf(err, sizeof(err), "%s/gen.err", f->dir);
	char *gen = wft_exe("tools/wf-gen");
	char *argv[] = {gen,      "--arch", "qwen3moe", "--layers", "3",
	                "--seed", "7",      "-o",       path,       NULL};
	cr_assert_eq(wft_run(argv, NULL, err, 60), 0, "wf-gen failed (see %s)", err);
	free(gen);
	OKD(wf_model_open(path, &f->m, D));
	f->agent_floor = wt_floor_create(&f->shm, f->m);
	f->dev = wt_device("host:mem=512Mi");
	struct wf_cache_opts co = {.shm = &f->shm, .stage = {.n_buffers = 4, .buffer_size = MiB}};
	OKD(wf_cache_create(f->dev, &co, &f->c, D));
	f->baseline = wt_mem_free(f->dev);
	OKD(wf_cache_model_add(f->c, "moe", f->m, &f->id, D));
	f->wanted = calloc(f->m->n_tensors, sizeof(bool));
	f->ptrs = calloc(f->m->n_tensors, sizeof(void *));
	/* What a dense-on-device engine with layer 2's experts resident computes from there. */
	const struct wf_engine_config cfg = {
	    .device = f->dev, .dense_on_device = true, .experts_on_device = true, .n_cpu_moe = 2};
	OKD(wf_engine_device_tensors(f->m, &cfg, f->wanted, D));
}

static void fx_close(struct fx *f)
{
	wf_cache_destroy(f->c);
	cr_expect_eq(wt_mem_free(f->dev), f->baseline, "device memory back to its baseline");
	wf_device_close(f->dev);
	wf_shm_region_detach(f->agent_floor);
	wf_model_close(f->m);
	wft_rmtree(f->dir);
	wft_rmtree(f->floor_dir);
	free(f->dir);
	free(f->floor_dir);
	free(f->wanted);
	free(f->ptrs);
}

static struct wf_cache_model_status status_of(struct wf_cache *c)
{
	struct wf_cache_status *st;
	cr_assert_eq(wf_cache_status(c, &st), 0);
	struct wf_cache_model_status ms = st->models[0];
	wf_cache_status_free(st);
	return ms;
}

Test(cache_engine, the_sets_an_engine_computes_from_load_alone_and_are_held)
{
	struct fx f;
	fx_open(&f, "ce-hold");
	OKD(wf_cache_acquire_sets(f.c, f.id, f.wanted, f.ptrs, D));
	uint32_t n_sets, dense, l1, l2;
	OKD(wf_cache_wset_count(f.c, f.id, &n_sets));
	OKD(wf_cache_wset_find(f.c, f.id, "dense", &dense));
	OKD(wf_cache_wset_find(f.c, f.id, "blk.1.ffn_*_exps", &l1));
	OKD(wf_cache_wset_find(f.c, f.id, "blk.2.ffn_*_exps", &l2));
	struct wf_cache_wset_status ws;
	OKD(wf_cache_wset_status(f.c, f.id, dense, &ws));
	cr_expect_eq(ws.state, WF_RESIDENCY_DEVICE, "the dense set is loaded");
	OKD(wf_cache_wset_status(f.c, f.id, l2, &ws));
	cr_expect_eq(ws.state, WF_RESIDENCY_DEVICE, "layer 2's experts are loaded");
	OKD(wf_cache_wset_status(f.c, f.id, l1, &ws));
	cr_expect_eq(ws.state, WF_RESIDENCY_HOST, "layer 1's experts stay in the floor");
	for (uint32_t i = 0; i < f.m->n_tensors; i++)
		cr_expect_eq(f.ptrs[i] != NULL, f.wanted[i], "tensor %s", f.m->tensors[i].name);
	/* Held: not evicted, not an LRU victim, until released. */
	cr_expect_eq(status_of(f.c).acquired, 1);
	cr_expect_eq(wf_cache_evict(f.c, f.id, NULL), -EBUSY);
	OKD(wf_cache_release(f.c, f.id));
	OKD(wf_cache_evict(f.c, f.id, D));
	cr_expect_eq(wt_mem_free(f.dev), f.baseline);
	fx_close(&f);
}

Test(cache_engine, a_pinned_model_is_what_the_engine_gets_and_bytes_count_once)
{
	struct fx f;
	fx_open(&f, "ce-pin");
	OKD(wf_cache_pin(f.c, f.id, D));
	const size_t after_pin = wt_mem_free(f.dev);
	const struct wf_cache_model_status pinned = status_of(f.c);
	OKD(wf_cache_acquire_sets(f.c, f.id, f.wanted, f.ptrs, D));
	cr_expect_eq(wt_mem_free(f.dev), after_pin, "no second copy of anything");
	cr_expect_eq(status_of(f.c).device_bytes, pinned.device_bytes);
	cr_expect_eq(status_of(f.c).state, WF_RESIDENCY_PINNED_DEVICE);
	for (uint32_t i = 0; i < f.m->n_tensors; i++)
		cr_expect_eq(f.ptrs[i] != NULL, f.wanted[i]);
	OKD(wf_cache_release(f.c, f.id));
	fx_close(&f);
}

Test(cache_engine, external_mode_loads_nothing)
{
	struct fx f;
	fx_open(&f, "ce-ext");
	cr_assert_eq(wf_cache_set_mode(f.c, WF_CACHE_EXTERNAL), 0);
	OKD(wf_cache_acquire_sets(f.c, f.id, f.wanted, f.ptrs, D));
	cr_expect_eq(wt_mem_free(f.dev), f.baseline, "nothing loaded");
	for (uint32_t i = 0; i < f.m->n_tensors; i++)
		cr_expect_null(f.ptrs[i]);
	OKD(wf_cache_release(f.c, f.id));
	fx_close(&f);
}

/* Reads a device copy back (the host device: device memory is host memory). */
static bool device_equals(const void *dev_ptr, const void *host, size_t n)
{
	return memcmp(dev_ptr, host, n) == 0;
}

Test(cache_engine, a_published_generation_refreshes_the_resident_copies)
{
	struct fx f;
	fx_open(&f, "ce-refresh");
	OKD(wf_cache_acquire_sets(f.c, f.id, f.wanted, f.ptrs, D));
	/* Publish new bytes for a dense tensor and for one of layer 1's (host-side) stacks. */
	const struct wf_tensor *q = wf_model_find_tensor(f.m, "blk.0.attn_q.weight");
	const struct wf_tensor *g1 = wf_model_find_tensor(f.m, "blk.1.ffn_gate_exps.weight");
	cr_assert(q && g1);
	const uint32_t ids[2] = {(uint32_t)(q - f.m->tensors), (uint32_t)(g1 - f.m->tensors)};
	uint8_t *nq = malloc(q->nbytes), *ng = malloc(g1->nbytes);
	for (uint64_t i = 0; i < q->nbytes; i++)
		nq[i] = (uint8_t)(i * 7 + 3);
	for (uint64_t i = 0; i < g1->nbytes; i++)
		ng[i] = (uint8_t)(i * 5 + 1);
	const struct wf_shm_publish_tensor pub[2] = {{ids[0], q->dtype, q->nbytes, nq},
	                                             {ids[1], g1->dtype, g1->nbytes, ng}};
	uint64_t gen = 0;
	OKD(wf_shm_region_publish(f.agent_floor, pub, 2, 0, &gen, D));
	const size_t before = wt_mem_free(f.dev);
	void *fresh[2] = {NULL, NULL};
	OKD(wf_cache_refresh(f.c, f.id, 2, ids, fresh, D));
	cr_assert_not_null(fresh[0], "the dense tensor is resident: it gets a new copy");
	cr_expect_null(fresh[1], "layer 1's experts are not resident: nothing to copy");
	cr_expect(device_equals(fresh[0], nq, q->nbytes), "the new copy holds the published bytes");
	cr_expect(fresh[0] != f.ptrs[ids[0]], "a new copy, not the old one overwritten");
	cr_expect(!device_equals(f.ptrs[ids[0]], nq, q->nbytes),
	          "the old copy keeps the old bytes for the engines still reading it");
	cr_expect_lt(wt_mem_free(f.dev), before);
	/* A second refresh supersedes the first copy, which goes at refresh_done. */
	for (uint64_t i = 0; i < q->nbytes; i++)
		nq[i] ^= 0x5a;
	OKD(wf_shm_region_publish(f.agent_floor, pub, 1, 0, &gen, D));
	void *fresh2 = NULL;
	OKD(wf_cache_refresh(f.c, f.id, 1, ids, &fresh2, D));
	cr_assert_not_null(fresh2);
	cr_expect(device_equals(fresh2, nq, q->nbytes));
	const size_t two = wt_mem_free(f.dev);
	OKD(wf_cache_refresh_done(f.c, f.id));
	cr_expect_gt(wt_mem_free(f.dev), two, "the superseded copy is freed");
	/* An acquire now gets the new copy. */
	OKD(wf_cache_release(f.c, f.id));
	OKD(wf_cache_acquire_sets(f.c, f.id, f.wanted, f.ptrs, D));
	cr_expect_eq(f.ptrs[ids[0]], fresh2);
	/* Bad input changes nothing. */
	const uint32_t bad = f.m->n_tensors;
	void *none = NULL;
	cr_expect_eq(wf_cache_refresh(f.c, f.id, 1, &bad, &none, NULL), WF_EINVAL);
	OKD(wf_cache_release(f.c, f.id));
	/* Evicting the model frees the refreshed copies too: fx_close checks the baseline. */
	OKD(wf_cache_evict(f.c, f.id, D));
	cr_expect_eq(wt_mem_free(f.dev), f.baseline);
	free(nq);
	free(ng);
	fx_close(&f);
}
