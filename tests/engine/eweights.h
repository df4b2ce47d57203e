/* Engines for the tests, with or without the device weight store: wft_engine_open builds an engine
 * on a model's file view with wf_worker_engine_open_files (worker/wengine.h): with copies asked
 * for (and always on a device that cannot read host memory, CUDA) a store of its own on the
 * engine's device loads the sets the engine computes from on the device. */
#ifndef WFT_ENGINE_EWEIGHTS_H
#define WFT_ENGINE_EWEIGHTS_H

#include "engine/engine.h"
#include "worker/weights.h"
#include "worker/wengine.h"

#include <stdbool.h>
#include <string.h>

struct wft_engine {
	struct wf_engine *e;
	struct wf_worker_engine we;
};

static inline void wft_engine_close(struct wft_engine *x)
{
	wf_worker_engine_close(&x->we);
	x->e = NULL;
}

static inline int wft_engine_open(const struct wf_model *m, const struct wf_weight_view *v,
                                  const struct wf_engine_config *cfg, bool copies,
                                  struct wft_engine *x, struct wf_diag *diag)
{
	memset(x, 0, sizeof(*x));
	const struct wf_engine_weights w = wf_weight_view_engine(v);
	const int rc = wf_worker_engine_open_files(m, &w, cfg, copies, &x->we, diag);
	x->e = rc == 0 ? x->we.engine : NULL;
	return rc;
}

/* The same for suites that keep engines as plain pointers: the store lives until
 * wft_engine_free (a few at a time). */
#define WFT_ENGINES_MAX 16
static struct wft_engine wft_engines_live[WFT_ENGINES_MAX];

static inline int wft_engine_new(const struct wf_model *m, const struct wf_weight_view *v,
                                 const struct wf_engine_config *cfg, bool copies,
                                 struct wf_engine **ret, struct wf_diag *diag)
{
	for (int i = 0; i < WFT_ENGINES_MAX; i++) {
		if (wft_engines_live[i].e)
			continue;
		int rc = wft_engine_open(m, v, cfg, copies, &wft_engines_live[i], diag);
		if (rc == 0)
			*ret = wft_engines_live[i].e;
		return rc;
	}
	return -24; /* -EMFILE: too many engines alive in one test */
}

static inline void wft_engine_free(struct wf_engine *e)
{
	for (int i = 0; e && i < WFT_ENGINES_MAX; i++)
		if (wft_engines_live[i].e == e)
			wft_engine_close(&wft_engines_live[i]);
}

#endif
