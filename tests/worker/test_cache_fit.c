/* Loads that can never fit fail before they change anything: a model larger than the arena (less
 * what is pinned), or than the device's free memory plus what eviction could free, fails with
 * WF_ENO_SPACE and every resident model stays. Models larger than the budget that do fit still
 * load (test_cache.c, model_bigger_than_budget). Host device. */
#include "base/error.h"
#include "common/wftest.h"
#include "worker/cache.h"
#include "wtest.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#define MiB (1ull << 20)

struct fx {
	char *dir;
	struct wf_device *dev;
	struct wf_cache *c;
	struct wf_model *m[6];
	uint32_t id[6];
	size_t n;
};

/* arena 0: the device's free memory. */
static void fx_open(struct fx *f, const char *spec, uint64_t arena)
{
	struct wf_cache_budget b = {arena, 0.5, 0.0, 0};
	struct wf_cache_opts co = {
	    .budget = &b,
	    .stage = {.n_buffers = 4, .buffer_size = 1 * MiB},
	};
	memset(f, 0, sizeof(*f));
	f->dir = wft_tmpdir("wfit");
	f->dev = wt_device(spec);
	OKD(wf_cache_create(f->dev, &co, &f->c, D));
}

static void fx_close(struct fx *f)
{
	wf_cache_destroy(f->c);
	wf_device_close(f->dev);
	for (size_t i = 0; i < f->n; i++)
		wt_model_free(f->m[i]);
	wft_rmtree(f->dir);
	free(f->dir);
}

static size_t fx_model(struct fx *f, const char *name, size_t n, uint64_t each)
{
	size_t i = f->n++;
	f->m[i] = wt_model_uniform(f->dir, name, n, each, (uint32_t)(7 + i));
	OKD(wf_cache_model_add(f->c, name, f->m[i], &f->id[i], D));
	return i;
}

static enum wf_residency state_of(struct fx *f, size_t i)
{
	struct wf_cache_status *s;
	enum wf_residency r = WF_RESIDENCY_MAX;
	cr_assert_eq(wf_cache_status(f->c, &s), 0);
	for (size_t k = 0; k < s->n_models; k++)
		if (s->models[k].id == f->id[i])
			r = s->models[k].state;
	wf_cache_status_free(s);
	return r;
}

static uint64_t evictions(struct fx *f)
{
	struct wf_cache_status *s;
	cr_assert_eq(wf_cache_status(f->c, &s), 0);
	uint64_t n = s->evictions;
	wf_cache_status_free(s);
	return n;
}

/* Larger than the device: every loaded model stays, in both kinds of request. */
Test(cache_fit, larger_than_the_device_evicts_nothing)
{
	struct fx f;
	struct wf_diag diag = {0};
	fx_open(&f, "host:mem=16Mi", 0);
	size_t a = fx_model(&f, "A", 2, 1 * MiB);
	size_t b = fx_model(&f, "B", 2, 1 * MiB);
	size_t p = fx_model(&f, "P", 2, 1 * MiB);
	size_t huge = fx_model(&f, "huge", 4, 5 * MiB); /* 20 MiB on a 16 MiB device */
	OKD(wf_cache_prefetch(f.c, f.id[a], true, D));
	OKD(wf_cache_prefetch(f.c, f.id[b], true, D));
	OKD(wf_cache_pin(f.c, f.id[p], D));
	uint64_t ev = evictions(&f);

	cr_expect_eq(wf_cache_prefetch(f.c, f.id[huge], true, &diag), WF_ENO_SPACE, "%s", diag.msg);
	cr_expect(strstr(diag.msg, "nothing was evicted") != NULL, "%s", diag.msg);
	wf_diag_clear(&diag);
	cr_expect_eq(wf_cache_acquire(f.c, f.id[huge], NULL, &diag), WF_ENO_SPACE, "%s", diag.msg);
	wf_diag_clear(&diag);
	cr_expect_eq(wf_cache_pin(f.c, f.id[huge], &diag), WF_ENO_SPACE, "%s", diag.msg);
	cr_expect_eq(state_of(&f, a), WF_RESIDENCY_DEVICE);
	cr_expect_eq(state_of(&f, b), WF_RESIDENCY_DEVICE);
	cr_expect_eq(state_of(&f, p), WF_RESIDENCY_PINNED_DEVICE);
	cr_expect_neq(state_of(&f, huge), WF_RESIDENCY_DEVICE);
	cr_expect_eq(evictions(&f), ev, "no model was evicted");
	fx_close(&f);
}

/* The arena is the policy limit even where the device has more: a model larger than the arena
 * less the pinned bytes fails, one that fits after evicting everything still loads. */
Test(cache_fit, arena_less_pinned_is_the_limit)
{
	struct fx f;
	struct wf_diag diag = {0};
	fx_open(&f, "host:mem=64Mi", 16 * MiB);
	size_t a = fx_model(&f, "A", 2, 2 * MiB);
	size_t p = fx_model(&f, "P", 2, 2 * MiB);
	size_t big = fx_model(&f, "big", 4, 3 * MiB);   /* 12 MiB: over the 8 MiB budget */
	size_t huge = fx_model(&f, "huge", 3, 5 * MiB); /* 15 MiB > 16 - 4 pinned */
	OKD(wf_cache_prefetch(f.c, f.id[a], true, D));
	OKD(wf_cache_pin(f.c, f.id[p], D));
	uint64_t ev = evictions(&f);

	cr_expect_eq(wf_cache_prefetch(f.c, f.id[huge], true, &diag), WF_ENO_SPACE, "%s", diag.msg);
	cr_expect(strstr(diag.msg, "arena") != NULL, "%s", diag.msg);
	cr_expect_eq(state_of(&f, a), WF_RESIDENCY_DEVICE);
	cr_expect_eq(evictions(&f), ev);

	/* Over budget but within the arena: loads after evicting A, as before. */
	OKD(wf_cache_prefetch(f.c, f.id[big], true, D));
	cr_expect_eq(state_of(&f, big), WF_RESIDENCY_DEVICE);
	cr_expect_neq(state_of(&f, a), WF_RESIDENCY_DEVICE);
	cr_expect_eq(state_of(&f, p), WF_RESIDENCY_PINNED_DEVICE);
	fx_close(&f);
}
