/* The device weight cache on the host device: LRU order, pins, the two modes, models larger than
 * the budget, compaction, device memory back to its baseline, acquisitions against eviction,
 * cancel, floors that other processes release, loads straight from model files, and verification
 * of the device bytes. */
#include "base/error.h"
#include "common/wftest.h"
#include "worker/cache.h"
#include "wtest.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define KiB (1ull << 10)
#define MiB (1ull << 20)

#define MAX_MODELS 8

struct fx {
	char *dir, *floor_dir;
	struct wf_shm_config shm;
	struct wf_device *dev;
	struct wf_cache *c;
	struct wf_model *m[MAX_MODELS];
	struct wf_shm_region *floor[MAX_MODELS]; /* the "agent's" attachments */
	uint32_t id[MAX_MODELS];
	size_t n;
	size_t baseline;
};

struct fx_opts {
	const char *spec; /* device */
	enum wf_cache_mode mode;
	double fraction; /* 0: 0.5 */
	bool floors;     /* configure a floor directory */
	uint64_t alloc_max;
	enum wf_stage_mode load_mode;
};

static void fx_open(struct fx *f, const struct fx_opts *o)
{
	struct wf_cache_budget b = {0, o->fraction ? o->fraction : 0.5, 0.0, 0};
	struct wf_cache_opts co = {
	    .mode = o->mode,
	    .budget = &b,
	    .shm = o->floors ? &f->shm : NULL,
	    .stage = {.n_buffers = 4, .buffer_size = 1 * MiB},
	    .alloc_max = o->alloc_max,
	    .load_mode = o->load_mode,
	};

	memset(f, 0, sizeof(*f));
	f->dir = wft_tmpdir("wcache");
	f->floor_dir = wt_shm_dir("wcache-floor");
	f->shm.dir = f->floor_dir;
	co.shm = o->floors ? &f->shm : NULL;
	f->dev = wt_device(o->spec ? o->spec : "host:mem=64Mi");
	OKD(wf_cache_create(f->dev, &co, &f->c, D));
	f->baseline = wt_mem_free(f->dev);
}

static void fx_close(struct fx *f)
{
	wf_cache_destroy(f->c);
	cr_expect_eq(wt_mem_free(f->dev), f->baseline, "destroy frees every device byte");
	wf_device_close(f->dev);
	for (size_t i = 0; i < f->n; i++) {
		wf_shm_region_detach(f->floor[i]);
		wt_model_free(f->m[i]);
	}
	wft_rmtree(f->dir);
	wft_rmtree(f->floor_dir);
	free(f->dir);
	free(f->floor_dir);
}

/* Adds a model of n tensors of `each` bytes (with a floor made first when floor is set). */
static size_t fx_model(struct fx *f, const char *name, size_t n, uint64_t each, bool floor)
{
	size_t i = f->n++;

	cr_assert_lt(i, MAX_MODELS);
	f->m[i] = wt_model_uniform(f->dir, name, n, each, (uint32_t)(100 + i));
	if (floor)
		f->floor[i] = wt_floor_create(&f->shm, f->m[i]);
	OKD(wf_cache_model_add(f->c, name, f->m[i], &f->id[i], D));
	return i;
}

static struct wf_cache_model_status st_of(struct fx *f, size_t i)
{
	struct wf_cache_status *s;
	struct wf_cache_model_status ms = {0};
	bool found = false;

	cr_assert_eq(wf_cache_status(f->c, &s), 0);
	for (size_t k = 0; k < s->n_models; k++) {
		if (s->models[k].id == f->id[i]) {
			ms = s->models[k];
			found = true;
		}
	}
	wf_cache_status_free(s);
	cr_assert(found, "model %zu in status", i);
	return ms;
}

static enum wf_residency state_of(struct fx *f, size_t i)
{
	return st_of(f, i).state;
}

static bool on_device(struct fx *f, size_t i)
{
	enum wf_residency s = state_of(f, i);
	return s == WF_RESIDENCY_DEVICE || s == WF_RESIDENCY_PINNED_DEVICE;
}

/* acquire + release: one request's worth of use. */
static void use(struct fx *f, size_t i)
{
	OKD(wf_cache_acquire(f->c, f->id[i], NULL, D));
	cr_assert_eq(wf_cache_release(f->c, f->id[i]), 0);
}

static void verify(struct fx *f, size_t i)
{
	OKD(wf_cache_verify(f->c, f->id[i], D));
}

/* Budget 32 MiB of a 64 MiB arena; models of 10 MiB: three fit. */
Test(cache, lru_order)
{
	struct fx f;

	fx_open(&f, &(struct fx_opts){0});
	for (int i = 0; i < 4; i++) {
		char name[8] = {(char)('A' + i), 0};
		fx_model(&f, name, 4, 2560 * KiB, false);
	}
	use(&f, 0);
	use(&f, 1);
	use(&f, 2);
	cr_assert(on_device(&f, 0) && on_device(&f, 1) && on_device(&f, 2));
	use(&f, 0); /* A is now the most recent: B is the oldest */
	use(&f, 3);
	cr_expect(!on_device(&f, 1), "B was the LRU victim");
	cr_expect(on_device(&f, 0) && on_device(&f, 2) && on_device(&f, 3));
	use(&f, 1); /* now C is the oldest */
	cr_expect(!on_device(&f, 2), "C was the LRU victim");
	cr_expect(on_device(&f, 0) && on_device(&f, 1) && on_device(&f, 3));
	cr_expect_gt(st_of(&f, 1).lru_stamp, st_of(&f, 3).lru_stamp);
	cr_expect_eq(st_of(&f, 1).loads, 2);
	cr_expect_eq(st_of(&f, 1).evictions, 1);
	struct wf_cache_status *s;
	cr_assert_eq(wf_cache_status(f.c, &s), 0);
	cr_expect_eq(s->lru_evictions, 2);
	cr_expect_leq(s->resident_bytes, s->budget.on_demand);
	wf_cache_status_free(s);
	for (int i = 0; i < 4; i++)
		if (on_device(&f, (size_t)i))
			verify(&f, (size_t)i);
	fx_close(&f);
}

Test(cache, pinned_never_evicted)
{
	struct fx f;
	struct wf_diag diag = {0};

	fx_open(&f, &(struct fx_opts){0});
	for (int i = 0; i < 5; i++) {
		char name[8] = {(char)('A' + i), 0};
		fx_model(&f, name, 4, 2560 * KiB, false);
	}
	OKD(wf_cache_pin(f.c, f.id[0], D));
	cr_assert_eq(state_of(&f, 0), WF_RESIDENCY_PINNED_DEVICE);
	/* 22 MiB left on demand: two more fit, and cycling through the rest never takes A. */
	for (int round = 0; round < 3; round++)
		for (size_t i = 1; i < 5; i++) {
			use(&f, i);
			cr_expect_eq(state_of(&f, 0), WF_RESIDENCY_PINNED_DEVICE,
			             "round %d model %zu", round, i);
		}
	struct wf_cache_status *s;
	cr_assert_eq(wf_cache_status(f.c, &s), 0);
	cr_expect_eq(s->pinned_bytes, st_of(&f, 0).device_bytes);
	cr_expect_eq(s->budget.in.pinned, s->pinned_bytes);
	cr_expect_eq(s->budget.on_demand, s->budget.weight_pool - s->pinned_bytes);
	cr_expect_leq(s->resident_bytes, s->budget.on_demand);
	wf_cache_status_free(s);
	cr_expect_eq(wf_cache_evict(f.c, f.id[0], &diag), WF_ESTATE, "evicting a pinned model");
	verify(&f, 0);
	OKD(wf_cache_unpin(f.c, f.id[0], D));
	cr_expect_eq(state_of(&f, 0), WF_RESIDENCY_DEVICE);
	cr_expect_eq(wf_cache_unpin(f.c, f.id[0], NULL), WF_ESTATE);
	fx_close(&f);
}

Test(cache, pinned_overcommit_flagged)
{
	struct fx f;

	fx_open(&f, &(struct fx_opts){.fraction = 0.25}); /* 16 MiB pool */
	fx_model(&f, "A", 4, 2560 * KiB, false);
	fx_model(&f, "B", 4, 2560 * KiB, false);
	OKD(wf_cache_pin(f.c, f.id[0], D));
	OKD(wf_cache_pin(f.c, f.id[1], D));
	struct wf_cache_status *s;
	cr_assert_eq(wf_cache_status(f.c, &s), 0);
	cr_expect(s->budget.pinned_overcommit, "20 MiB pinned in a 16 MiB pool");
	cr_expect_eq(s->budget.on_demand, 0);
	wf_cache_status_free(s);
	verify(&f, 0);
	verify(&f, 1);
	fx_close(&f);
}

Test(cache, external_mode_not_resident)
{
	struct fx f;
	struct wf_diag diag = {0};
	struct wf_cache_view v;

	fx_open(&f, &(struct fx_opts){.mode = WF_CACHE_EXTERNAL});
	for (int i = 0; i < 4; i++) {
		char name[8] = {(char)('A' + i), 0};
		fx_model(&f, name, 4, 2560 * KiB, false);
	}
	cr_expect_eq(wf_cache_acquire(f.c, f.id[0], &v, &diag), WF_ENOT_RESIDENT);
	cr_expect(!on_device(&f, 0), "a request does not load in external mode");
	OKD(wf_cache_set_residency(f.c, f.id[0], WF_RESIDENCY_DEVICE, D));
	OKD(wf_cache_acquire(f.c, f.id[0], &v, D));
	cr_expect_eq(v.n_tensors, 4);
	cr_expect_not_null(v.tensors[3]);
	cr_expect_eq(wf_cache_release(f.c, f.id[0]), 0);
	cr_expect_eq(wf_cache_release(f.c, f.id[0]), WF_ESTATE);
	OKD(wf_cache_prefetch(f.c, f.id[1], true, D));
	OKD(wf_cache_set_residency(f.c, f.id[2], WF_RESIDENCY_DEVICE, D));
	/* Full: the control plane must evict; the cache does not pick victims for it. */
	wf_diag_clear(&diag);
	cr_expect_eq(wf_cache_set_residency(f.c, f.id[3], WF_RESIDENCY_DEVICE, &diag),
	             WF_ENO_SPACE);
	cr_expect(strstr(diag.msg, "external"), "%s", diag.msg);
	cr_expect(on_device(&f, 0) && on_device(&f, 1) && on_device(&f, 2));
	cr_expect_eq(st_of(&f, 3).last_error, WF_ENO_SPACE);
	OKD(wf_cache_evict(f.c, f.id[1], D));
	OKD(wf_cache_set_residency(f.c, f.id[3], WF_RESIDENCY_DEVICE, D));
	/* Self-managed from now on: a request loads and evicts the LRU (A). */
	cr_assert_eq(wf_cache_set_mode(f.c, WF_CACHE_SELF_MANAGED), 0);
	use(&f, 1);
	cr_expect(!on_device(&f, 0), "A was the LRU");
	fx_close(&f);
}

Test(cache, model_bigger_than_budget)
{
	struct fx f;
	struct wf_diag diag = {0};

	fx_open(&f, &(struct fx_opts){0});
	fx_model(&f, "A", 4, 2560 * KiB, false);
	fx_model(&f, "B", 4, 2560 * KiB, false);
	fx_model(&f, "big", 8, 5 * MiB, false); /* 40 MiB > 32 MiB budget, < 64 MiB arena */
	use(&f, 0);
	use(&f, 1);
	use(&f, 2);
	cr_expect(!on_device(&f, 0) && !on_device(&f, 1), "everything evictable went");
	struct wf_cache_model_status ms = st_of(&f, 2);
	cr_expect_eq(ms.state, WF_RESIDENCY_DEVICE);
	cr_expect(ms.over_budget, "flagged");
	verify(&f, 2);
	struct wf_cache_status *s;
	cr_assert_eq(wf_cache_status(f.c, &s), 0);
	cr_expect(s->over_budget);
	wf_cache_status_free(s);
	/* Loading anything else evicts the big one again. */
	use(&f, 0);
	cr_expect(!on_device(&f, 2));

	/* External mode: only when nothing unpinned is resident. */
	cr_assert_eq(wf_cache_set_mode(f.c, WF_CACHE_EXTERNAL), 0);
	cr_expect_eq(wf_cache_set_residency(f.c, f.id[2], WF_RESIDENCY_DEVICE, &diag),
	             WF_ENO_SPACE);
	OKD(wf_cache_evict(f.c, f.id[0], D));
	OKD(wf_cache_set_residency(f.c, f.id[2], WF_RESIDENCY_DEVICE, D));
	cr_expect(st_of(&f, 2).over_budget);
	/* An acquired model in the way: no room even in self-managed mode. */
	OKD(wf_cache_evict(f.c, f.id[2], D));
	cr_assert_eq(wf_cache_set_mode(f.c, WF_CACHE_SELF_MANAGED), 0);
	OKD(wf_cache_acquire(f.c, f.id[0], NULL, D));
	cr_expect_eq(wf_cache_acquire(f.c, f.id[2], NULL, &diag), WF_ENO_SPACE);
	cr_expect_eq(wf_cache_release(f.c, f.id[0]), 0);
	fx_close(&f);
}

Test(cache, compact_frees_and_reloads)
{
	struct fx f;
	struct wf_diag diag = {0};

	fx_open(&f, &(struct fx_opts){0});
	fx_model(&f, "A", 4, 2560 * KiB, false);
	fx_model(&f, "B", 4, 2560 * KiB, false);
	fx_model(&f, "C", 2, 2560 * KiB, false);
	fx_model(&f, "P", 1, 2 * MiB, false);
	use(&f, 0);
	use(&f, 1);
	OKD(wf_cache_pin(f.c, f.id[3], D));
	size_t pinned_free = f.baseline - st_of(&f, 3).device_bytes;
	uint32_t list[] = {f.id[2], f.id[0]};

	/* An acquired unpinned model blocks it, and nothing changes. */
	OKD(wf_cache_acquire(f.c, f.id[1], NULL, D));
	cr_expect_eq(wf_cache_compact(f.c, list, 2, &diag), -EBUSY);
	cr_expect(on_device(&f, 0) && on_device(&f, 1) && !on_device(&f, 2));
	cr_assert_eq(wf_cache_release(f.c, f.id[1]), 0);

	OKD(wf_cache_compact(f.c, list, 2, D));
	cr_expect(on_device(&f, 0) && !on_device(&f, 1) && on_device(&f, 2));
	cr_expect_eq(state_of(&f, 3), WF_RESIDENCY_PINNED_DEVICE, "pinned stay");
	cr_expect_eq(st_of(&f, 0).loads, 2, "A reloaded");
	size_t want = pinned_free - st_of(&f, 0).device_bytes - st_of(&f, 2).device_bytes;
	size_t got = wt_mem_free(f.dev);
	/* The host arena counts whole pages per allocation. */
	cr_expect(got <= want && want - got < 3 * 4096, "free %zu, expected about %zu", got, want);
	verify(&f, 0);
	verify(&f, 2);
	verify(&f, 3);
	/* Empty list: only frees. */
	OKD(wf_cache_compact(f.c, NULL, 0, D));
	cr_expect(!on_device(&f, 0) && !on_device(&f, 2) && on_device(&f, 3));
	fx_close(&f);
}

Test(cache, mem_info_back_to_baseline)
{
	struct fx f;

	fx_open(&f, &(struct fx_opts){.fraction = 0.9});
	fx_model(&f, "A", 7, 1234567, false);
	fx_model(&f, "B", 3, 3 * MiB + 5, false);
	fx_model(&f, "C", 1, 100, false);
	use(&f, 0);
	cr_expect_lt(wt_mem_free(f.dev), f.baseline - f.m[0]->total_bytes + 1);
	OKD(wf_cache_evict(f.c, f.id[0], D));
	cr_expect_eq(wt_mem_free(f.dev), f.baseline, "after evict");
	cr_expect_eq(st_of(&f, 0).device_bytes, 0);
	use(&f, 0);
	use(&f, 1);
	OKD(wf_cache_pin(f.c, f.id[2], D));
	OKD(wf_cache_acquire(f.c, f.id[1], NULL, D));
	struct wf_diag diag = {0};
	cr_expect_eq(wf_cache_release_all(f.c, &diag), -EBUSY, "acquired: nothing changes");
	cr_expect(on_device(&f, 0) && on_device(&f, 1) && on_device(&f, 2));
	cr_assert_eq(wf_cache_release(f.c, f.id[1]), 0);
	OKD(wf_cache_release_all(f.c, D));
	cr_expect_eq(wt_mem_free(f.dev), f.baseline, "after release_all");
	for (size_t i = 0; i < 3; i++)
		cr_expect_eq(state_of(&f, i), WF_RESIDENCY_DISK);
	struct wf_cache_status *s;
	cr_assert_eq(wf_cache_status(f.c, &s), 0);
	cr_expect_eq(s->pinned_bytes, 0);
	cr_expect_eq(s->budget.in.pinned, 0);
	cr_expect_eq(s->resident_bytes, 0);
	wf_cache_status_free(s);
	fx_close(&f);
}

Test(cache, acquire_holds_against_eviction)
{
	struct fx f;
	struct wf_diag diag = {0};
	struct wf_cache_view v;

	fx_open(&f, &(struct fx_opts){.floors = true});
	for (int i = 0; i < 4; i++) {
		char name[8] = {(char)('A' + i), 0};
		fx_model(&f, name, 4, 2560 * KiB, true);
	}
	OKD(wf_cache_acquire(f.c, f.id[0], &v, D)); /* A: the oldest, but held */
	use(&f, 1);
	use(&f, 2);
	cr_expect_eq(st_of(&f, 0).acquired, 1);
	cr_expect_eq(wf_cache_evict(f.c, f.id[0], &diag), -EBUSY);
	cr_expect_eq(wf_cache_set_residency(f.c, f.id[0], WF_RESIDENCY_HOST, &diag), -EBUSY);
	cr_expect_eq(wf_cache_model_remove(f.c, f.id[0], &diag), -EBUSY);
	use(&f, 3);
	cr_expect(on_device(&f, 0), "held A was skipped by the LRU");
	cr_expect(!on_device(&f, 1), "B went instead");
	/* The view stays valid while held. */
	cr_expect_eq(v.n_tensors, 4);
	verify(&f, 0);
	/* Two holders. */
	OKD(wf_cache_acquire(f.c, f.id[0], NULL, D));
	cr_expect_eq(st_of(&f, 0).acquired, 2);
	cr_assert_eq(wf_cache_release(f.c, f.id[0]), 0);
	cr_expect_eq(wf_cache_evict(f.c, f.id[0], &diag), -EBUSY);
	cr_assert_eq(wf_cache_release(f.c, f.id[0]), 0);
	OKD(wf_cache_evict(f.c, f.id[0], D));
	cr_expect_eq(state_of(&f, 0), WF_RESIDENCY_HOST);
	/* Everything held and no room: a request fails rather than evict. */
	use(&f, 0);
	for (size_t i = 0; i < 4; i++)
		if (on_device(&f, i))
			OKD(wf_cache_acquire(f.c, f.id[i], NULL, D));
	size_t out = 0;
	for (size_t i = 0; i < 4; i++)
		out = on_device(&f, i) ? out : i;
	cr_expect_eq(wf_cache_acquire(f.c, f.id[out], NULL, &diag), WF_ENO_SPACE, "%s", diag.msg);
	for (size_t i = 0; i < 4; i++)
		if (on_device(&f, i))
			cr_expect_eq(wf_cache_release(f.c, f.id[i]), 0);
	fx_close(&f);
}

static bool wait_for(struct fx *f, size_t i, bool (*pred)(const struct wf_cache_model_status *),
                     double seconds)
{
	double end = wt_now() + seconds;
	while (wt_now() < end) {
		struct wf_cache_model_status ms = st_of(f, i);
		if (pred(&ms))
			return true;
		wt_sleep_ms(2);
	}
	return false;
}

static bool loading_started(const struct wf_cache_model_status *ms)
{
	return ms->loading && ms->load_done > 0;
}

static bool load_over(const struct wf_cache_model_status *ms)
{
	return !ms->loading && (ms->last_error || ms->state >= WF_RESIDENCY_DEVICE);
}

/* 16 MiB at 50 MB/s: a third of a second to load, long enough to cancel in the middle. */
Test(cache, cancel_mid_load_leaves_nothing)
{
	for (int floors = 0; floors < 2; floors++) {
		struct fx f;
		fx_open(&f, &(struct fx_opts){
		                .spec = "host:mem=64Mi,bw=50M", .fraction = 0.9, .floors = floors});
		fx_model(&f, "slow", 8, 2 * MiB, floors);
		fx_model(&f, "next", 1, 1 * MiB, floors);
		OKD(wf_cache_prefetch(f.c, f.id[0], false, D));
		OKD(wf_cache_prefetch(f.c, f.id[1], false, D));
		cr_assert(wait_for(&f, 0, loading_started, 10), "load started");
		cr_expect_eq(wf_cache_cancel(f.c, f.id[1]), 0, "queued load dropped");
		cr_expect_eq(wf_cache_cancel(f.c, f.id[0]), 0);
		cr_assert(wait_for(&f, 0, load_over, 10), "load ended");
		struct wf_cache_model_status ms = st_of(&f, 0);
		cr_expect_eq(ms.last_error, WF_ECANCELED, "%s", ms.last_error_msg);
		cr_expect(!on_device(&f, 0));
		cr_expect_lt(ms.load_done, ms.load_total, "stopped in the middle");
		wt_sleep_ms(50);
		cr_expect(!on_device(&f, 1), "the queued prefetch never ran");
		cr_expect_eq(wt_mem_free(f.dev), f.baseline, "no device memory left behind");
		cr_expect_eq(wf_cache_cancel(f.c, WF_CACHE_ANY), WF_ESTATE, "nothing to cancel");
		/* And the cache still loads afterwards. */
		OKD(wf_cache_prefetch(f.c, f.id[1], true, D));
		verify(&f, 1);
		fx_close(&f);
	}
}

/* A second process (the "agent") creates the floor and releases it while our load runs: the
 * cache's own attachment keeps the mapping and the file alive; when the cache lets go last, the
 * region is removed. */
static int count_regions(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int n = 0;

	if (!d)
		return -1;
	while ((e = readdir(d)))
		n += strncmp(e->d_name, "wf-", 3) == 0 && !strchr(e->d_name, '.');
	closedir(d);
	return n;
}

Test(cache, floor_released_by_another_process, .timeout = 60)
{
	struct fx f;
	int up[2], down[2];
	char c = 0;
	pid_t pid;
	int status;

	memset(&f, 0, sizeof(f));
	f.dir = wft_tmpdir("wcache-proc");
	f.floor_dir = wt_shm_dir("wcache-proc-floor");
	f.shm.dir = f.floor_dir;
	f.m[0] = wt_model_uniform(f.dir, "shared", 8, 2 * MiB, 77);
	f.n = 1;
	cr_assert_eq(pipe(up), 0);
	cr_assert_eq(pipe(down), 0);
	/* Fork before any device exists in this process. */
	pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		struct wf_shm_region *r = NULL;
		/* Only the parent writes down[]: its death (a failed assertion) is our EOF. */
		close(down[1]);
		close(up[0]);
		struct wf_digest dg;
		wf_model_digest(f.m[0], &dg);
		int ret = wf_shm_region_attach(&f.shm, &dg, f.m[0], WF_SHM_ATTACH_AGENT, wt_fill,
		                               NULL, &r, NULL);
		if (ret < 0 || write(up[1], "r", 1) != 1)
			_exit(1);
		if (read(down[0], &c, 1) != 1)
			_exit(2);
		wf_shm_region_detach(r);
		_exit(0);
	}
	close(up[1]);
	close(down[0]);
	cr_assert_eq(read(up[0], &c, 1), 1, "child made the floor");

	struct wf_cache_budget b = {0, 0.9, 0.0, 0};
	struct wf_cache_opts co = {
	    .budget = &b, .shm = &f.shm, .stage = {.n_buffers = 4, .buffer_size = 1 * MiB}};
	f.dev = wt_device("host:mem=64Mi,bw=50M");
	OKD(wf_cache_create(f.dev, &co, &f.c, D));
	f.baseline = wt_mem_free(f.dev);
	OKD(wf_cache_model_add(f.c, "shared", f.m[0], &f.id[0], D));
	cr_expect_eq(state_of(&f, 0), WF_RESIDENCY_HOST, "floor attached at add");

	OKD(wf_cache_prefetch(f.c, f.id[0], false, D));
	cr_assert(wait_for(&f, 0, loading_started, 10));
	cr_assert_eq(write(down[1], "x", 1), 1);
	cr_assert_eq(waitpid(pid, &status, 0), pid);
	cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d", status);
	cr_expect_eq(count_regions(f.floor_dir), 1, "our attachment keeps the region");
	cr_assert(wait_for(&f, 0, load_over, 20));
	struct wf_cache_model_status ms = st_of(&f, 0);
	cr_expect_eq(ms.state, WF_RESIDENCY_DEVICE, "%s", ms.last_error_msg);
	cr_expect(ms.last_load_from_floor);
	cr_expect(ms.floor);
	verify(&f, 0);
	/* Evict and reload from the floor nobody else holds. */
	OKD(wf_cache_evict(f.c, f.id[0], D));
	cr_expect_eq(state_of(&f, 0), WF_RESIDENCY_HOST);
	OKD(wf_cache_prefetch(f.c, f.id[0], true, D));
	verify(&f, 0);
	/* DISK: the last holder lets go and the region goes with it. */
	OKD(wf_cache_set_residency(f.c, f.id[0], WF_RESIDENCY_DISK, D));
	cr_expect_eq(state_of(&f, 0), WF_RESIDENCY_DISK);
	cr_expect_eq(count_regions(f.floor_dir), 0, "region removed by its last holder");
	/* Without a floor it loads from the files. */
	use(&f, 0);
	cr_expect(!st_of(&f, 0).last_load_from_floor);
	verify(&f, 0);
	close(up[0]);
	close(down[1]);
	fx_close(&f);
}

Test(cache, load_from_files_without_floor)
{
	const uint64_t sizes[] = {1, 4097, 3 * MiB + 7, 65536, 333, 2 * MiB, 17, 1 * MiB + 1};
	struct fx f;

	for (int floors = 0; floors < 2; floors++) {
		/* floors == 1: a floor directory is configured but holds nothing for the model. */
		fx_open(&f, &(struct fx_opts){.fraction = 0.9, .floors = floors});
		f.m[0] = wt_model_make(f.dir, &(struct wt_spec){"files", 3, sizes, 8, 5});
		cr_assert(f.m[0]);
		f.n = 1;
		OKD(wf_cache_model_add(f.c, "files", f.m[0], &f.id[0], D));
		struct wf_cache_model_status ms = st_of(&f, 0);
		cr_expect_eq(ms.state, WF_RESIDENCY_DISK);
		cr_expect(!ms.floor);
		if (floors)
			cr_expect_eq(ms.floor_error, -ENOENT);
		use(&f, 0);
		ms = st_of(&f, 0);
		cr_expect_eq(ms.state, WF_RESIDENCY_DEVICE);
		cr_expect(!ms.last_load_from_floor);
		cr_expect_eq(ms.last_load_mode, WF_STAGE_MODE_STAGED);
		cr_expect_gt(ms.last_load_gbps, 0);
		verify(&f, 0);
		if (floors) {
			struct wf_diag diag = {0};
			cr_expect_eq(wf_cache_set_residency(f.c, f.id[0], WF_RESIDENCY_HOST, &diag),
			             -ENOENT, "%s", diag.msg);
		}
		fx_close(&f);
	}
}

Test(cache, verify_detects_corruption)
{
	struct fx f;
	struct wf_cache_view v;
	struct wf_device_stream *s;
	struct wf_diag diag = {0};

	fx_open(&f, &(struct fx_opts){.floors = true});
	fx_model(&f, "A", 5, 100000, true);
	OKD(wf_cache_acquire(f.c, f.id[0], &v, D));
	verify(&f, 0);
	OKD(wf_device_stream_create(f.dev, &s, D));
	OKD(wf_device_memset_async(s, (char *)v.tensors[3] + 99999, 0x5a, 1, D));
	OKD(wf_device_stream_synchronize(s, D));
	wf_device_stream_destroy(s);
	cr_expect_eq(wf_cache_verify(f.c, f.id[0], &diag), WF_ECHECKSUM);
	cr_expect(strstr(diag.msg, f.m[0]->tensors[3].name), "%s", diag.msg);
	cr_assert_eq(wf_cache_release(f.c, f.id[0]), 0);
	OKD(wf_cache_evict(f.c, f.id[0], D));
	cr_expect_eq(wf_cache_verify(f.c, f.id[0], &diag), WF_ENOT_RESIDENT);
	fx_close(&f);
}

Test(cache, residency_transitions)
{
	struct fx f;
	struct wf_diag diag = {0};

	fx_open(&f, &(struct fx_opts){.floors = true, .mode = WF_CACHE_EXTERNAL});
	fx_model(&f, "A", 3, 1 * MiB, true);
	cr_expect_eq(state_of(&f, 0), WF_RESIDENCY_HOST);
	OKD(wf_cache_set_residency(f.c, f.id[0], WF_RESIDENCY_DISK, D));
	cr_expect_eq(state_of(&f, 0), WF_RESIDENCY_DISK);
	OKD(wf_cache_set_residency(f.c, f.id[0], WF_RESIDENCY_HOST, D));
	cr_expect_eq(state_of(&f, 0), WF_RESIDENCY_HOST);
	OKD(wf_cache_set_residency(f.c, f.id[0], WF_RESIDENCY_PINNED_DEVICE, D));
	cr_expect_eq(state_of(&f, 0), WF_RESIDENCY_PINNED_DEVICE);
	cr_expect(st_of(&f, 0).last_load_from_floor);
	verify(&f, 0);
	OKD(wf_cache_set_residency(f.c, f.id[0], WF_RESIDENCY_DEVICE, D));
	cr_expect_eq(state_of(&f, 0), WF_RESIDENCY_DEVICE);
	OKD(wf_cache_set_residency(f.c, f.id[0], WF_RESIDENCY_PINNED_DEVICE, D));
	cr_expect_eq(st_of(&f, 0).loads, 1, "pinning a resident model does not reload it");
	OKD(wf_cache_set_residency(f.c, f.id[0], WF_RESIDENCY_HOST, D));
	cr_expect_eq(state_of(&f, 0), WF_RESIDENCY_HOST);
	cr_expect_eq(wt_mem_free(f.dev), f.baseline);
	OKD(wf_cache_set_residency(f.c, f.id[0], WF_RESIDENCY_DEVICE, D));
	OKD(wf_cache_set_residency(f.c, f.id[0], WF_RESIDENCY_DISK, D));
	cr_expect_eq(state_of(&f, 0), WF_RESIDENCY_DISK);
	cr_expect_eq(wt_mem_free(f.dev), f.baseline);
	/* Lookups and misuse. */
	uint32_t id;
	cr_expect_eq(wf_cache_model_find(f.c, "A", &id), 0);
	cr_expect_eq(id, f.id[0]);
	cr_expect_eq(wf_cache_model_find(f.c, "nope", &id), WF_ENOT_FOUND);
	cr_expect_eq(wf_cache_model_add(f.c, "A", f.m[0], &id, &diag), WF_EDUPLICATE);
	cr_expect_eq(wf_cache_evict(f.c, 999, &diag), WF_ENOT_FOUND);
	cr_expect_eq(wf_cache_set_residency(f.c, f.id[0], WF_RESIDENCY_MAX, &diag), WF_EINVAL);
	OKD(wf_cache_model_remove(f.c, f.id[0], D));
	cr_expect_eq(wf_cache_model_find(f.c, "A", &id), WF_ENOT_FOUND);
	fx_close(&f);
}

/* Floors: AUTO calibrates once and picks a mode; DIRECT and STAGED can be forced. */
Test(cache, load_modes_from_floor)
{
	for (int mode = WF_STAGE_MODE_AUTO; mode < WF_STAGE_MODE_MAX; mode++) {
		struct fx f;
		fx_open(&f, &(struct fx_opts){.floors = true,
		                              .fraction = 0.9,
		                              .load_mode = (enum wf_stage_mode)mode});
		fx_model(&f, "A", 6, 3 * MiB + 1000, true);
		use(&f, 0);
		struct wf_cache_model_status ms = st_of(&f, 0);
		cr_expect(ms.last_load_from_floor);
		if (mode != WF_STAGE_MODE_AUTO)
			cr_expect_eq((int)ms.last_load_mode, mode);
		verify(&f, 0);
		struct wf_cache_status *s;
		cr_assert_eq(wf_cache_status(f.c, &s), 0);
		if (mode == WF_STAGE_MODE_AUTO) {
			cr_expect(s->stage.calibrated);
			cr_expect_eq(ms.last_load_mode, s->stage.preferred);
			cr_log_info("calibration: staged %.2f GB/s, direct %.2f GB/s -> %s",
			            s->stage.staged_gbps, s->stage.direct_gbps,
			            wf_stage_mode_name(s->stage.preferred));
		}
		wf_cache_status_free(s);
		fx_close(&f);
	}
}

Test(cache, split_allocations)
{
	struct fx f;

	fx_open(&f, &(struct fx_opts){.floors = true, .fraction = 0.9, .alloc_max = 1 * MiB});
	fx_model(&f, "A", 10, 300 * KiB, true);
	fx_model(&f, "B", 2, 3 * MiB, false); /* tensors larger than alloc_max: one each */
	use(&f, 0);
	use(&f, 1);
	cr_expect_geq(st_of(&f, 0).n_allocs, 3);
	cr_expect_eq(st_of(&f, 1).n_allocs, 2);
	verify(&f, 0);
	verify(&f, 1);
	OKD(wf_cache_release_all(f.c, D));
	cr_expect_eq(wt_mem_free(f.dev), f.baseline);
	fx_close(&f);
}

struct events {
	pthread_mutex_t lock;
	unsigned residency, progress, evicted, failed;
};

static void on_event(void *ctx, const struct wf_cache_event *ev)
{
	struct events *e = ctx;
	pthread_mutex_lock(&e->lock);
	e->residency += ev->type == WF_CACHE_EVENT_RESIDENCY;
	e->progress += ev->type == WF_CACHE_EVENT_PROGRESS;
	e->evicted += ev->type == WF_CACHE_EVENT_EVICTED;
	e->failed += ev->type == WF_CACHE_EVENT_LOAD_FAILED;
	pthread_mutex_unlock(&e->lock);
}

Test(cache, events_and_budget_changes)
{
	struct events ev = {.lock = PTHREAD_MUTEX_INITIALIZER};
	struct wf_cache_budget b = {0, 0.9, 0.0, 0};
	struct wf_cache_opts co = {.budget = &b, .event = on_event, .event_ctx = &ev};
	struct wf_device *dev = wt_device("host:mem=64Mi");
	char *dir = wft_tmpdir("wcache-ev");
	struct wf_cache *c;
	struct wf_model *m[3];
	uint32_t id[3];

	OKD(wf_cache_create(dev, &co, &c, D));
	for (int i = 0; i < 3; i++) {
		char name[8] = {(char)('A' + i), 0};
		m[i] = wt_model_uniform(dir, name, 4, 2560 * KiB, (uint32_t)i);
		OKD(wf_cache_model_add(c, name, m[i], &id[i], D));
		OKD(wf_cache_acquire(c, id[i], NULL, D));
		cr_assert_eq(wf_cache_release(c, id[i]), 0);
	}
	/* Shrink the budget: the LRU goes until the rest fits (self-managed). */
	b.weight_fraction = 0.35; /* 22.4 MiB: two models */
	OKD(wf_cache_set_budget(c, &b, D));
	struct wf_cache_status *s;
	cr_assert_eq(wf_cache_status(c, &s), 0);
	cr_expect_eq(s->models[0].state, WF_RESIDENCY_DISK, "A was the oldest");
	cr_expect_eq(s->models[1].state, WF_RESIDENCY_DEVICE);
	cr_expect_leq(s->resident_bytes, s->budget.on_demand);
	cr_expect_eq(s->budget.in.arena, 64 * MiB);
	cr_expect(s->budget.in.weight_fraction == 0.35);
	wf_cache_status_free(s);
	b.weight_fraction = 1.5;
	struct wf_diag diag = {0};
	cr_expect_eq(wf_cache_set_budget(c, &b, &diag), WF_EINVAL);
	b.weight_fraction = 0.9;
	b.max_scratch = 40 * MiB; /* pool = 64 - 40 = 24 MiB */
	OKD(wf_cache_set_budget(c, &b, D));
	cr_assert_eq(wf_cache_status(c, &s), 0);
	cr_expect(s->budget.scratch_limited);
	cr_expect_eq(s->budget.weight_pool, 24 * MiB);
	wf_cache_status_free(s);
	wf_cache_destroy(c);
	cr_expect_geq(ev.residency, 6);
	cr_expect_geq(ev.progress, 3);
	cr_expect_geq(ev.evicted, 1);
	cr_expect_eq(ev.failed, 0);
	wf_device_close(dev);
	for (int i = 0; i < 3; i++)
		wt_model_free(m[i]);
	wft_rmtree(dir);
	free(dir);
}

/* Requests on several threads while the control plane evicts and prefetches: every request sees a
 * resident model with intact bytes, and the books balance at the end. */
struct stress {
	struct fx *f;
	unsigned seed;
	int errors;
};

static void *requester(void *arg)
{
	struct stress *s = arg;
	for (int k = 0; k < 60; k++) {
		size_t i = (size_t)(rand_r(&s->seed) % 4);
		struct wf_cache_view v;
		int ret = wf_cache_acquire(s->f->c, s->f->id[i], &v, NULL);
		if (ret == WF_ENO_SPACE)
			continue; /* everything held by the other requesters */
		if (ret < 0 || v.n_tensors != 2 || !v.tensors[1]) {
			s->errors++;
			continue;
		}
		if (k % 10 == 0 && wf_cache_verify(s->f->c, s->f->id[i], NULL) < 0)
			s->errors++;
		if (wf_cache_release(s->f->c, s->f->id[i]) < 0)
			s->errors++;
	}
	return NULL;
}

Test(cache, concurrent_requests, .timeout = 120)
{
	struct fx f;
	pthread_t t[3];
	struct stress s[3];

	fx_open(&f, &(struct fx_opts){.floors = true});
	for (int i = 0; i < 4; i++) {
		char name[8] = {(char)('A' + i), 0};
		fx_model(&f, name, 2, 5 * MiB, i % 2 == 0);
	}
	for (int i = 0; i < 3; i++) {
		s[i] = (struct stress){&f, (unsigned)i * 7 + 1, 0};
		cr_assert_eq(pthread_create(&t[i], NULL, requester, &s[i]), 0);
	}
	for (int k = 0; k < 30; k++) {
		size_t i = (size_t)k % 4;
		int ret = wf_cache_evict(f.c, f.id[i], NULL);
		cr_expect(ret == 0 || ret == -EBUSY, "evict: %d", ret);
		ret = wf_cache_prefetch(f.c, f.id[(i + 2) % 4], true, NULL);
		cr_expect(ret == 0 || ret == WF_ENO_SPACE, "prefetch: %d", ret);
	}
	for (int i = 0; i < 3; i++) {
		pthread_join(t[i], NULL);
		cr_expect_eq(s[i].errors, 0, "requester %d", i);
	}
	for (size_t i = 0; i < 4; i++)
		cr_expect_eq(st_of(&f, i).acquired, 0);
	OKD(wf_cache_release_all(f.c, D));
	cr_expect_eq(wt_mem_free(f.dev), f.baseline);
	fx_close(&f);
}
