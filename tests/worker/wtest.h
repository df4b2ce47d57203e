/* Support for the worker tests: hand-made models with tensors of chosen sizes in files of
 * pseudo-random bytes (no GGUF writer needed: the cache only reads the inventory), floors made
 * from them with a pread fill, and device helpers. Not thread-safe. */
#ifndef WF_TESTS_WORKER_WTEST_H
#define WF_TESTS_WORKER_WTEST_H

#include "device/device.h"
#include "model/model.h"
#include "shm/region.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A model in dir: n_files files "<tag>-0000N.bin"; file i holds the tensors
 * [i * per_file, (i + 1) * per_file) of sizes[] (per_file = ceil(n / n_files); the last file
 * the rest), packed at 32-byte alignment after a header of odd length, then a few trailing
 * bytes. Contents are pseudo-random from seed. Returns NULL on failure. */
struct wt_spec {
	const char *tag;
	unsigned n_files;
	const uint64_t *sizes;
	size_t n_tensors;
	uint32_t seed;
};
struct wf_model *wt_model_make(const char *dir, const struct wt_spec *spec);
void wt_model_free(struct wf_model *m);

/* A model of n_tensors tensors of `bytes` each (one file). */
struct wf_model *wt_model_uniform(const char *dir, const char *tag, size_t n_tensors,
                                  uint64_t bytes, uint32_t seed);

/* The fill callback: pread of each window into the section. */
int wt_fill(void *ctx, const struct wf_shm_fill *job, struct wf_diag *diag);

/* Attaches (creating) the floor of m in cfg's directory, as the agent would. Aborts the test on
 * failure. */
struct wf_shm_region *wt_floor_create(const struct wf_shm_config *cfg, const struct wf_model *m);

/* Opens a device by spec, aborting the test on failure. */
struct wf_device *wt_device(const char *spec);
size_t wt_mem_free(struct wf_device *dev);

/* A fresh private directory on tmpfs (/dev/shm) for floors, or under $TMPDIR when there is none.
 * Remove it with wft_rmtree(). */
char *wt_shm_dir(const char *tag);

double wt_now(void);
void wt_sleep_ms(unsigned ms);

/* Asserts that call returns 0, printing its diag; call uses D as its struct wf_diag *. */
#define OKD(call)                                                                                  \
	do {                                                                                       \
		struct wf_diag diag_ = {0};                                                        \
		int r_ = (call);                                                                   \
		cr_assert_eq(r_, 0, "%s: %s", #call, wf_diag_str(&diag_, r_));                     \
	} while (0)
#define D (&diag_)

#endif
