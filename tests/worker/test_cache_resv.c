/* Reservations in the device weight cache (worker/cache.h): bytes an owner holds on the device
 * (a completion engine's), counted against the on-demand budget and evicted by the same LRU as
 * the models' unpinned sets. An idle one goes for a load that needs the room (its owner called
 * back, once, on the manager thread); an acquired one never; one that cannot fit evicts nothing;
 * external mode evicts nothing for one; a budget change evicts an idle one; a drop forgets it
 * without a call. Host device. */
#include "base/error.h"
#include "common/wftest.h"
#include "worker/cache.h"
#include "wtest.h"

#include <criterion/criterion.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MiB (1ull << 20)

struct fx {
	char *dir;
	struct wf_device *dev;
	struct wf_cache *c;
	struct wf_model *m;
	uint32_t id;
	atomic_int calls;
	uint32_t last_resv;
	char why[64];
};

static void on_evict(void *ctx, uint32_t resv, const char *why)
{
	struct fx *f = ctx;
	f->last_resv = resv;
	snprintf(f->why, sizeof f->why, "%s", why);
	atomic_fetch_add(&f->calls, 1);
}

/* On-demand budget 16 MiB (half of a 32 MiB arena); one model "m" of 8 MiB. */
static void fx_open(struct fx *f)
{
	struct wf_cache_budget b = {32 * MiB, 0.5, 0.0, 0};
	struct wf_cache_opts co = {.budget = &b, .stage = {.n_buffers = 4, .buffer_size = 1 * MiB}};
	memset(f, 0, sizeof(*f));
	f->dir = wft_tmpdir("wresv");
	f->dev = wt_device("host:mem=128Mi");
	OKD(wf_cache_create(f->dev, &co, &f->c, D));
	f->m = wt_model_uniform(f->dir, "m", 8, 1 * MiB, 11);
	OKD(wf_cache_model_add(f->c, "m", f->m, &f->id, D));
}

static void fx_close(struct fx *f)
{
	wf_cache_destroy(f->c);
	wf_device_close(f->dev);
	wt_model_free(f->m);
	wft_rmtree(f->dir);
	free(f->dir);
}

static struct wf_cache_status *st(struct fx *f)
{
	struct wf_cache_status *s;
	cr_assert_eq(wf_cache_status(f->c, &s), 0);
	return s;
}

static uint64_t reserved(struct fx *f)
{
	struct wf_cache_status *s = st(f);
	uint64_t b = s->reserved_bytes;
	wf_cache_status_free(s);
	return b;
}

static enum wf_residency state(struct fx *f)
{
	struct wf_cache_status *s = st(f);
	enum wf_residency r = s->models[0].state;
	wf_cache_status_free(s);
	return r;
}

Test(cache_resv, idle_reservation_is_evicted_for_a_load)
{
	struct fx f;
	fx_open(&f);
	uint32_t r = 0;
	OKD(wf_cache_resv_create(f.c, "engine", 10 * MiB, on_evict, &f, &r, D));
	cr_assert_neq(r, 0);
	cr_expect_eq(reserved(&f), 10 * MiB);
	cr_assert_eq(wf_cache_resv_release(f.c, r), 0);
	cr_expect_eq(wf_cache_resv_release(f.c, r), WF_ESTATE, "released twice");
	/* 10 + 8 > 16: the idle reservation goes. */
	OKD(wf_cache_set_residency(f.c, f.id, WF_RESIDENCY_DEVICE, D));
	cr_expect_eq(atomic_load(&f.calls), 1);
	cr_expect_eq(f.last_resv, r);
	cr_expect_str_eq(f.why, "lru");
	cr_expect_eq(reserved(&f), 0);
	cr_expect_eq(wf_cache_resv_acquire(f.c, r), WF_ENOT_FOUND);
	struct wf_cache_status *s = st(&f);
	cr_expect_eq(s->models[0].state, WF_RESIDENCY_DEVICE);
	cr_expect_eq(s->lru_evictions, 1);
	wf_cache_status_free(s);
	/* The owner's drop after the eviction is a no-op, and no second call comes. */
	wf_cache_resv_drop(f.c, r);
	cr_expect_eq(atomic_load(&f.calls), 1);
	fx_close(&f);
}

Test(cache_resv, acquired_reservation_is_never_a_victim)
{
	struct fx f;
	fx_open(&f);
	uint32_t r = 0;
	OKD(wf_cache_resv_create(f.c, "engine", 10 * MiB, on_evict, &f, &r, D));
	/* Held by its creation: the load cannot make room. */
	struct wf_diag d = {{0}};
	cr_expect_eq(wf_cache_set_residency(f.c, f.id, WF_RESIDENCY_DEVICE, &d), WF_ENO_SPACE, "%s",
	             d.msg);
	cr_expect_eq(atomic_load(&f.calls), 0);
	cr_expect_eq(reserved(&f), 10 * MiB);
	/* A second hold, one release: still held. */
	cr_assert_eq(wf_cache_resv_acquire(f.c, r), 0);
	cr_assert_eq(wf_cache_resv_release(f.c, r), 0);
	cr_expect_eq(wf_cache_set_residency(f.c, f.id, WF_RESIDENCY_DEVICE, NULL), WF_ENO_SPACE);
	cr_expect_eq(atomic_load(&f.calls), 0);
	cr_assert_eq(wf_cache_resv_release(f.c, r), 0);
	OKD(wf_cache_set_residency(f.c, f.id, WF_RESIDENCY_DEVICE, D));
	cr_expect_eq(atomic_load(&f.calls), 1);
	fx_close(&f);
}

Test(cache_resv, one_that_cannot_fit_evicts_nothing)
{
	struct fx f;
	fx_open(&f);
	OKD(wf_cache_set_residency(f.c, f.id, WF_RESIDENCY_DEVICE, D));
	uint32_t r = 0;
	struct wf_diag d = {{0}};
	/* Larger than the whole budget (a model that size would load, flagged). */
	cr_expect_eq(wf_cache_resv_create(f.c, "engine", 17 * MiB, on_evict, &f, &r, &d),
	             WF_ENO_SPACE);
	cr_expect(strstr(d.msg, "engine") && strstr(d.msg, "budget"), "%s", d.msg);
	cr_expect_eq(state(&f), WF_RESIDENCY_DEVICE, "the model was evicted for nothing");
	/* Fits only by evicting a model in use. */
	cr_assert_eq(wf_cache_acquire(f.c, f.id, NULL, NULL), 0);
	cr_expect_eq(wf_cache_resv_create(f.c, "engine", 10 * MiB, on_evict, &f, &r, NULL),
	             WF_ENO_SPACE);
	cr_expect_eq(state(&f), WF_RESIDENCY_DEVICE);
	cr_expect_eq(reserved(&f), 0);
	cr_assert_eq(wf_cache_release(f.c, f.id), 0);
	/* Idle now: self-managed, the model goes for it. */
	OKD(wf_cache_resv_create(f.c, "engine", 10 * MiB, on_evict, &f, &r, D));
	cr_expect_neq(state(&f), WF_RESIDENCY_DEVICE);
	cr_expect_eq(reserved(&f), 10 * MiB);
	fx_close(&f);
}

Test(cache_resv, external_mode_evicts_nothing_for_a_reservation)
{
	struct fx f;
	fx_open(&f);
	OKD(wf_cache_set_residency(f.c, f.id, WF_RESIDENCY_DEVICE, D));
	cr_assert_eq(wf_cache_set_mode(f.c, WF_CACHE_EXTERNAL), 0);
	uint32_t r = 0;
	struct wf_diag d = {{0}};
	cr_expect_eq(wf_cache_resv_create(f.c, "engine", 10 * MiB, on_evict, &f, &r, &d),
	             WF_ENO_SPACE);
	cr_expect(strstr(d.msg, "external"), "%s", d.msg);
	cr_expect_eq(state(&f), WF_RESIDENCY_DEVICE);
	/* What fits beside it is fine. */
	OKD(wf_cache_resv_create(f.c, "engine", 8 * MiB, on_evict, &f, &r, D));
	cr_expect_eq(reserved(&f), 8 * MiB);
	fx_close(&f);
}

Test(cache_resv, budget_change_evicts_and_drop_forgets)
{
	struct fx f;
	fx_open(&f);
	uint32_t r1 = 0, r2 = 0;
	OKD(wf_cache_resv_create(f.c, "e1", 6 * MiB, on_evict, &f, &r1, D));
	OKD(wf_cache_resv_create(f.c, "e2", 6 * MiB, on_evict, &f, &r2, D));
	cr_assert_eq(wf_cache_resv_release(f.c, r1), 0);
	cr_assert_eq(wf_cache_resv_release(f.c, r2), 0);
	struct wf_cache_status *s = st(&f);
	cr_expect_eq(s->reserved_bytes, 12 * MiB);
	cr_expect_eq(s->n_reservations, 2);
	cr_expect(!s->over_budget);
	wf_cache_status_free(s);
	/* A 10 MiB budget holds one: the older (r1, released first) goes. */
	struct wf_cache_budget b = {20 * MiB, 0.5, 0.0, 0};
	OKD(wf_cache_set_budget(f.c, &b, D));
	cr_expect_eq(atomic_load(&f.calls), 1);
	cr_expect_eq(f.last_resv, r1);
	cr_expect_eq(reserved(&f), 6 * MiB);
	/* A drop forgets it without a call. */
	wf_cache_resv_drop(f.c, r2);
	wf_cache_resv_drop(f.c, r2);
	wf_cache_resv_drop(NULL, 0);
	cr_expect_eq(reserved(&f), 0);
	cr_expect_eq(atomic_load(&f.calls), 1);
	cr_expect_eq(wf_cache_resv_acquire(f.c, r2), WF_ENOT_FOUND);
	/* Nothing left to evict. */
	cr_expect_eq(wf_cache_evict_oldest(f.c, NULL), WF_ENO_SPACE);
	fx_close(&f);
}
