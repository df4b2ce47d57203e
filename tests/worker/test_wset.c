/* Weight sets: the classification of a wf-gen qwen3moe model into "dense" and one expert set per
 * layer, and the cache loading, pinning and evicting one set alone while the rest of the model
 * stays on DISK or HOST. */
#include "base/error.h"
#include "common/wftest.h"
#include "worker/cache.h"
#include "wtest.h"

#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MiB (1ull << 20)

#define LAYERS 3

/* A qwen3moe GGUF of LAYERS layers made by wf-gen in dir, opened. */
static struct wf_model *gen_model(const char *dir)
{
	char path[512], err[600];
	struct wf_model *m = NULL;

	snprintf(path, sizeof(path), "%s/moe.gguf", dir);
	snprintf(err, sizeof(err), "%s/gen.err", dir);
	char *gen = wft_exe("tools/wf-gen");
	char *argv[] = {gen,      "--arch", "qwen3moe", "--layers", "3",
	                "--seed", "7",      "-o",       path,       NULL};
	cr_assert_eq(wft_run(argv, NULL, err, 60), 0, "wf-gen failed (see %s)", err);
	free(gen); /* the leak check of the sanitizer stage sees it otherwise */
	OKD(wf_model_open(path, &m, D));
	return m;
}

/* The layer in a GGUF tensor name "blk.N....", or -1. */
static int layer_in(const char *name)
{
	int n;
	return sscanf(name, "blk.%d.", &n) == 1 ? n : -1;
}

Test(wset, classify_qwen3moe_dense_and_one_set_per_layer)
{
	char *dir = wft_tmpdir("wset-class");
	struct wf_model *m = gen_model(dir);
	struct wf_wset_def *sets = NULL;
	uint32_t n = 0, n_expert_tensors = 0;
	unsigned *seen = calloc(m->n_tensors, sizeof(*seen));

	OKD(wf_wset_classify(m, &sets, &n));
	cr_assert_eq(n, 1 + LAYERS, "dense + one expert set per layer, got %u", n);
	cr_assert_str_eq(sets[0].name, "dense");
	for (uint32_t s = 0; s < n; s++) {
		uint64_t bytes = 0;
		char want[WF_WSET_NAME_MAX];

		if (s > 0) {
			snprintf(want, sizeof(want), "blk.%u.ffn_*_exps", s - 1);
			cr_assert_str_eq(sets[s].name, want);
			cr_assert_eq(sets[s].n_tensors, 3, "%s: gate, up, down", sets[s].name);
		}
		for (uint32_t k = 0; k < sets[s].n_tensors; k++) {
			uint32_t i = sets[s].tensors[k];
			const struct wf_tensor *t = &m->tensors[i];

			cr_assert_lt(i, m->n_tensors);
			if (k)
				cr_assert_gt(i, sets[s].tensors[k - 1], "model order");
			seen[i]++;
			bytes += t->nbytes;
			if (s == 0) {
				cr_assert_eq(t->tclass, WF_TENSOR_DENSE, "%s in dense", t->name);
			} else {
				cr_assert_eq(t->tclass, WF_TENSOR_EXPERT, "%s in %s", t->name,
				             sets[s].name);
				cr_assert_eq(layer_in(t->name), (int)s - 1, "%s in %s", t->name,
				             sets[s].name);
				cr_assert(strstr(t->name, "_exps"), "%s", t->name);
				n_expert_tensors++;
			}
		}
		cr_assert_eq(bytes, sets[s].bytes, "%s: bytes", sets[s].name);
	}
	for (uint32_t i = 0; i < m->n_tensors; i++)
		cr_assert_eq(seen[i], 1, "tensor %s is in %u sets", m->tensors[i].name, seen[i]);
	cr_assert_eq(n_expert_tensors, 3 * LAYERS);
	wf_wset_defs_free(sets, n);
	free(seen);
	wf_model_close(m);
	wft_rmtree(dir);
	free(dir);
}

static enum wf_residency model_state(struct wf_cache *c, uint64_t *ret_device_bytes,
                                     uint64_t *ret_resident, uint64_t *ret_pinned)
{
	struct wf_cache_status *st;

	cr_assert_eq(wf_cache_status(c, &st), 0);
	cr_assert_eq(st->n_models, 1);
	enum wf_residency s = st->models[0].state;
	*ret_device_bytes = st->models[0].device_bytes;
	*ret_resident = st->resident_bytes;
	*ret_pinned = st->pinned_bytes;
	wf_cache_status_free(st);
	return s;
}

static void one_set_alone(bool floors)
{
	char *dir = wft_tmpdir("wset-load");
	char *floor_dir = wt_shm_dir("wset-floor");
	struct wf_shm_config shm = {.dir = floor_dir};
	struct wf_model *m = gen_model(dir);
	struct wf_shm_region *agent_floor = floors ? wt_floor_create(&shm, m) : NULL;
	struct wf_device *dev = wt_device("host:mem=256Mi");
	struct wf_cache_budget b = {0, 0.9, 0.0, 0};
	struct wf_cache_opts co = {
	    .budget = &b,
	    .shm = floors ? &shm : NULL,
	    .stage = {.n_buffers = 4, .buffer_size = 1 * MiB},
	};
	enum wf_residency host = floors ? WF_RESIDENCY_HOST : WF_RESIDENCY_DISK;
	struct wf_cache *c;
	struct wf_cache_wset_status ws;
	uint32_t id, set, n_sets;
	uint64_t dev_bytes, resident, pinned;

	OKD(wf_cache_create(dev, &co, &c, D));
	size_t baseline = wt_mem_free(dev);
	OKD(wf_cache_model_add(c, "moe", m, &id, D));
	OKD(wf_cache_wset_count(c, id, &n_sets));
	cr_assert_eq(n_sets, 1 + LAYERS);
	OKD(wf_cache_wset_find(c, id, "blk.1.ffn_*_exps", &set));
	cr_assert_eq(wf_cache_wset_find(c, id, "blk.9.ffn_*_exps", &set), WF_ENOT_FOUND);
	OKD(wf_cache_wset_find(c, id, "blk.1.ffn_*_exps", &set));

	/* Load layer 1's experts alone. */
	OKD(wf_cache_wset_load(c, id, set, false, D));
	OKD(wf_cache_wset_status(c, id, set, &ws));
	cr_assert_eq(ws.state, WF_RESIDENCY_DEVICE);
	cr_assert_geq(ws.device_bytes, ws.bytes);
	/* Three tensors back to back in the source: padding between them at most. */
	cr_assert_leq(ws.device_bytes, ws.bytes + 3 * 4096, "%" PRIu64 " for %" PRIu64,
	              ws.device_bytes, ws.bytes);
	/* The host device rounds each allocation up to whole pages. */
	size_t used = baseline - wt_mem_free(dev), page = (size_t)sysconf(_SC_PAGESIZE);
	cr_assert(used >= ws.device_bytes && used < ws.device_bytes + ws.n_allocs * page,
	          "the device holds that set's bytes and nothing else: %zu used, %" PRIu64
	          " in %u allocations",
	          used, ws.device_bytes, ws.n_allocs);
	cr_assert_eq(model_state(c, &dev_bytes, &resident, &pinned), host,
	             "a model with one set resident is not resident");
	cr_assert_eq(dev_bytes, ws.device_bytes);
	cr_assert_eq(resident, ws.device_bytes);
	cr_assert_eq(pinned, 0);
	for (uint32_t s = 0; s < n_sets; s++) {
		struct wf_cache_wset_status o;
		OKD(wf_cache_wset_status(c, id, s, &o));
		if (s != set)
			cr_assert_eq(o.state, host, "set %s stays %s", o.name,
			             wf_residency_name(host));
	}
	/* External requests cannot use a partial model. */
	cr_assert_eq(wf_cache_set_mode(c, WF_CACHE_EXTERNAL), 0);
	cr_assert_eq(wf_cache_acquire(c, id, NULL, NULL), WF_ENOT_RESIDENT);
	cr_assert_eq(wf_cache_set_mode(c, WF_CACHE_SELF_MANAGED), 0);

	/* Evict it: the device is back where it was. */
	OKD(wf_cache_wset_evict(c, id, set, D));
	OKD(wf_cache_wset_status(c, id, set, &ws));
	cr_assert_eq(ws.state, host);
	cr_assert_eq(ws.device_bytes, 0);
	cr_assert_eq(wt_mem_free(dev), baseline);
	cr_assert_eq(model_state(c, &dev_bytes, &resident, &pinned), host);
	cr_assert_eq(dev_bytes, 0);

	/* Pinned alone: it counts as pinned, and a model eviction refuses it. */
	OKD(wf_cache_wset_load(c, id, set, true, D));
	OKD(wf_cache_wset_status(c, id, set, &ws));
	cr_assert_eq(ws.state, WF_RESIDENCY_PINNED_DEVICE);
	(void)model_state(c, &dev_bytes, &resident, &pinned);
	cr_assert_eq(pinned, ws.device_bytes);
	cr_assert_eq(resident, 0);
	cr_assert_eq(wf_cache_evict(c, id, NULL), WF_ESTATE);

	/* The rest of the model joins it; the set loaded alone holds the right bytes. */
	OKD(wf_cache_prefetch(c, id, true, D));
	cr_assert_eq(model_state(c, &dev_bytes, &resident, &pinned), WF_RESIDENCY_DEVICE);
	cr_assert_eq(pinned, ws.device_bytes);
	cr_assert_geq(baseline - wt_mem_free(dev), dev_bytes);
	OKD(wf_cache_verify(c, id, D));
	OKD(wf_cache_wset_evict(c, id, set, D));
	cr_assert_eq(model_state(c, &dev_bytes, &resident, &pinned), host);
	OKD(wf_cache_set_residency(c, id, host, D));
	cr_assert_eq(wt_mem_free(dev), baseline);

	wf_cache_destroy(c);
	wf_device_close(dev);
	wf_shm_region_detach(agent_floor);
	wf_model_close(m);
	wft_rmtree(dir);
	wft_rmtree(floor_dir);
	free(dir);
	free(floor_dir);
}

Test(wset, one_expert_set_alone_from_files)
{
	one_set_alone(false);
}

Test(wset, one_expert_set_alone_from_floor)
{
	one_set_alone(true);
}

static struct wf_cache_model_status model_status(struct wf_cache *c, uint32_t id)
{
	struct wf_cache_status *st;
	struct wf_cache_model_status ms = {0};

	cr_assert_eq(wf_cache_status(c, &st), 0);
	for (size_t i = 0; i < st->n_models; i++)
		if (st->models[i].id == id)
			ms = st->models[i];
	wf_cache_status_free(st);
	cr_assert_eq(ms.id, id);
	return ms;
}

/* The budget sees sets: a set loaded alone is an LRU victim like a model (reason "lru"), and a
 * model completing itself must fit as a whole, as it would loading from nothing. */
Test(wset, budget_counts_sets)
{
	char *dir = wft_tmpdir("wset-lru");
	struct wf_model *m = gen_model(dir);
	struct wf_device *dev = wt_device("host:mem=256Mi");
	struct wf_cache_budget b = {0, 1.0, 0.0, 0};
	struct wf_cache_opts co = {.budget = &b, .stage = {.n_buffers = 4, .buffer_size = 1 * MiB}};
	struct wf_cache *c;
	struct wf_cache_wset_status ws;
	uint32_t a, bb, set;

	OKD(wf_cache_create(dev, &co, &c, D));
	OKD(wf_cache_model_add(c, "a", m, &a, D));
	OKD(wf_cache_model_add(c, "b", m, &bb, D));
	OKD(wf_cache_prefetch(c, bb, true, D));
	uint64_t whole = model_status(c, bb).device_bytes;
	OKD(wf_cache_evict(c, bb, D));
	OKD(wf_cache_wset_find(c, a, "blk.0.ffn_*_exps", &set));

	/* Room for one model, not for one model and a set. */
	b.arena = whole + 4096;
	OKD(wf_cache_set_budget(c, &b, D));
	OKD(wf_cache_wset_load(c, a, set, false, D));
	OKD(wf_cache_prefetch(c, bb, true, D));
	OKD(wf_cache_wset_status(c, a, set, &ws));
	cr_assert_eq(ws.state, WF_RESIDENCY_DISK, "a's set was the LRU victim");
	cr_assert_eq(model_status(c, bb).state, WF_RESIDENCY_DEVICE);
	cr_assert(!model_status(c, bb).over_budget);
	OKD(wf_cache_evict(c, bb, D));

	/* A budget one byte short of the model: loading a set first must not sneak the model
	 * under it; the whole is over budget, and flagged, either way. */
	b.arena = whole - 1;
	OKD(wf_cache_set_budget(c, &b, D));
	OKD(wf_cache_wset_load(c, a, set, false, D));
	cr_assert(!model_status(c, a).over_budget);
	OKD(wf_cache_prefetch(c, a, true, D));
	cr_assert_eq(model_status(c, a).state, WF_RESIDENCY_DEVICE);
	cr_assert(model_status(c, a).over_budget, "the model is larger than the budget");

	wf_cache_destroy(c);
	wf_device_close(dev);
	wf_model_close(m);
	wft_rmtree(dir);
	free(dir);
}
