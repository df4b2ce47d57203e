/* wf-bench residency: moving a model onto a device through the worker's cache, as wf-worker does.
 *  floor_to_device   floor -> device in the default (AUTO-chosen) load mode, over a plain copy of
 *                    the same bytes into a fresh device allocation measured in the same run
 *                    (memcpy on the host device; cudaMemcpyAsync from one pinned buffer on CUDA);
 *                    the other mode is reported beside it;
 *  cold_file_load    a load from the model file with no floor (O_DIRECT staging), page cache
 *                    dropped, over fio's io_uring O_DIRECT read of the file;
 *  evict_mem         device free memory after evict over before the load (1.0 = all returned);
 *  host_link_throttle_s  one 64 MiB copy through the host device's throttle (host:bw=256Mi, the
 *                    tests' model of PCIe) over bytes/bw: how close to the link rate a copy
 *                    comes on this machine under its load (test_device_host asserts only that
 *                    it is never faster).
 * CUDA-only figures are reported as skipped on a machine without a GPU. */
#include "anchors.h"
#include "bench.h"
#include "report.h"

#include "base/error.h"
#include "device/device.h"
#include "model/model.h"
#include "shm/fill.h"
#include "shm/region.h"
#include "worker/cache.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct load_result {
	double seconds;
	enum wf_stage_mode mode;
	size_t free_before, free_after_evict;
	int rc;
};

/* One load of the model through a fresh cache: prefetch (wait), then evict. */
static struct load_result load_once(struct wf_device *dev, const struct wf_model *m,
                                    const struct wf_shm_config *shm, enum wf_stage_mode mode)
{
	struct load_result r = {.rc = 0};
	struct wf_cache *cache = NULL;
	struct wf_diag d = {{0}};
	struct wf_cache_opts co = {.shm = shm, .load_mode = mode};
	uint32_t id;
	size_t total;
	if ((r.rc = wf_cache_create(dev, &co, &cache, &d)) < 0 ||
	    (r.rc = wf_cache_model_add(cache, "bench", m, &id, &d)) < 0)
		goto out;
	wf_device_mem_info(dev, &r.free_before, &total, NULL);
	double t0 = bench_now();
	if ((r.rc = wf_cache_prefetch(cache, id, true, &d)) < 0)
		goto out;
	r.seconds = bench_now() - t0;
	struct wf_cache_status *st = NULL;
	if (wf_cache_status(cache, &st) == 0) {
		r.mode = st->models[0].last_load_mode;
		wf_cache_status_free(st);
	}
	if ((r.rc = wf_cache_evict(cache, id, &d)) < 0)
		goto out;
	wf_device_mem_info(dev, &r.free_after_evict, &total, NULL);
out:
	if (r.rc < 0)
		fprintf(stderr, "wf-bench: cache load: %s\n", wf_diag_str(&d, r.rc));
	wf_cache_close(cache);
	wf_cache_stop(cache);
	wf_cache_destroy(cache);
	return r;
}

/* The anchor: the same bytes copied into a fresh device allocation (so it pays the same first
 * touch of device pages a load pays). */
static double copy_anchor(struct wf_device *dev, const void *src, size_t n)
{
	void *dst = NULL, *pinned = NULL;
	struct wf_device_stream *s = NULL;
	double secs = -1;
	if (wf_device_mem_alloc(dev, n, &dst, NULL) < 0)
		return -1;
	if (wf_device_kind(dev) == WF_DEVICE_KIND_HOST) {
		double t0 = bench_now();
		memcpy(dst, src, n); /* host device memory is host memory */
		secs = bench_now() - t0;
	} else if (wf_device_pinned_alloc(dev, n, 0, &pinned, NULL) == 0 &&
	           wf_device_stream_create(dev, &s, NULL) == 0) {
		memcpy(pinned, src, n);
		double t0 = bench_now();
		if (wf_device_memcpy_async(s, dst, pinned, n, WF_DEVICE_COPY_H2D, NULL) == 0 &&
		    wf_device_stream_synchronize(s, NULL) == 0)
			secs = bench_now() - t0;
	}
	wf_device_stream_destroy(s);
	wf_device_pinned_free(dev, pinned, NULL);
	wf_device_mem_free(dev, dst, NULL);
	return secs;
}

static void run_throttle(void)
{
	const size_t n = 64u << 20;
	const double ideal = (double)n / (256.0 * (1 << 20));
	struct wf_device *dev = NULL;
	struct wf_device_stream *s = NULL;
	struct wf_diag d = {{0}};
	void *dst = NULL, *src = NULL;
	double secs = -1;
	int rc = wf_device_open("host:bw=256Mi", &dev, &d);
	if (rc == 0 && (rc = wf_device_stream_create(dev, &s, &d)) == 0 &&
	    (rc = wf_device_mem_alloc(dev, n, &dst, &d)) == 0 &&
	    (rc = wf_device_pinned_alloc(dev, n, 0, &src, &d)) == 0) {
		memset(src, 7, n);
		memset(dst, 0, n); /* fault the pages in first: the clock measures the link only */
		double t0 = bench_now();
		if ((rc = wf_device_memcpy_async(s, dst, src, n, WF_DEVICE_COPY_H2D, &d)) == 0 &&
		    (rc = wf_device_stream_synchronize(s, &d)) == 0)
			secs = bench_now() - t0;
	}
	if (rc < 0)
		fprintf(stderr, "wf-bench: host throttle: %s\n", wf_diag_str(&d, rc));
	else
		bench_report(&(struct bench_result){
		    .bench = "residency-host",
		    .metric = "host_link_throttle_s",
		    .unit = "s",
		    .value = secs,
		    .anchor = "bytes / bw (64 MiB at 256 MiB/s)",
		    .anchor_value = ideal,
		    .ratio = secs / ideal,
		    .goal = 1.2,
		    .goal_op = "<=",
		    .notes = "host:bw=256Mi, one H2D copy; at least 1.0 by construction"});
	wf_device_stream_destroy(s);
	wf_device_pinned_free(dev, src, NULL);
	wf_device_mem_free(dev, dst, NULL);
	wf_device_close(dev);
}

int bench_residency(const struct bench_opts *o)
{
	char model_path[4200], floor_dir[4200];
	if (bench_selected(o, "throttle"))
		run_throttle();
	if (!bench_selected(o, "floor") && !bench_selected(o, "cold"))
		return 0;
	snprintf(model_path, sizeof model_path, "%s/floor-bench-%s.gguf", o->dir, o->size);
	snprintf(floor_dir, sizeof floor_dir, "%s/wf-bench-res-%d", o->floor_root, (int)getpid());
	if (mkdir(o->dir, 0755) < 0 && errno != EEXIST)
		return 1;
	struct stat st;
	if (stat(model_path, &st) != 0 && bench_gen_model(o->wfgen, model_path, o->size, 11) < 0) {
		fprintf(stderr, "wf-bench: could not generate %s\n", model_path);
		return 1;
	}
	struct wf_model *m = NULL;
	struct wf_diag d = {{0}};
	int rc = wf_model_open(model_path, &m, &d);
	if (rc < 0) {
		fprintf(stderr, "wf-bench: %s: %s\n", model_path, wf_diag_str(&d, rc));
		return 1;
	}
	/* main() registered the CUDA backend where it is built in */
	const char *spec = o->device ? o->device : "auto";
	struct wf_device *dev = NULL;
	if ((rc = wf_device_open(spec, &dev, &d)) < 0) {
		fprintf(stderr, "wf-bench: device %s: %s\n", spec, wf_diag_str(&d, rc));
		wf_model_close(m);
		return 1;
	}
	bool cuda = wf_device_kind(dev) == WF_DEVICE_KIND_CUDA;
	const char *bench = cuda ? "residency-cuda" : "residency-host";
	double bytes = (double)m->total_bytes;

	/* the floor, made once */
	struct wf_shm_config shm = {.dir = floor_dir};
	struct wf_shm_fill_io fi = {0};
	struct wf_shm_region *floor = NULL;
	struct wf_digest dg;
	wf_model_digest(m, &dg);
	if ((rc = wf_shm_region_attach(&shm, &dg, m, WF_SHM_ATTACH_AGENT | WF_SHM_ATTACH_STREAM,
	                               wf_shm_fill_from_files, &fi, &floor, &d)) < 0) {
		fprintf(stderr, "wf-bench: floor: %s\n", wf_diag_str(&d, rc));
		goto out;
	}

	if (bench_selected(o, "floor")) {
		/* AUTO calibrates on the first load and keeps the faster mode: that is the default.
		 */
		struct load_result def = load_once(dev, m, &shm, WF_STAGE_MODE_AUTO);
		double anchor =
		    copy_anchor(dev, wf_shm_region_data(floor), wf_shm_region_size(floor));
		/* a second AUTO load runs in the chosen mode without calibrating */
		struct load_result def2 = load_once(dev, m, &shm, def.mode);
		enum wf_stage_mode other_mode =
		    def.mode == WF_STAGE_MODE_DIRECT ? WF_STAGE_MODE_STAGED : WF_STAGE_MODE_DIRECT;
		struct load_result other = load_once(dev, m, &shm, other_mode);
		if (def.rc == 0 && def2.rc == 0 && anchor > 0) {
			double v = bytes / def2.seconds,
			       a = (double)wf_shm_region_size(floor) / anchor;
			char note[200];
			snprintf(note, sizeof note, "default mode %s on %s; %.2f GB model",
			         wf_stage_mode_name(def.mode), wf_device_name(dev), bytes / 1e9);
			bench_report(&(struct bench_result){
			    .bench = bench,
			    .metric = "floor_to_device_GBps",
			    .unit = "GB/s",
			    .value = v / 1e9,
			    .anchor = cuda ? "cudaMemcpyAsync from one pinned buffer GB/s"
			                   : "memcpy floor->fresh device allocation GB/s",
			    .anchor_value = a / 1e9,
			    .ratio = v / a,
			    .goal = 0.9,
			    .goal_op = ">=",
			    .notes = note});
			if (other.rc == 0) {
				double ov = bytes / other.seconds;
				snprintf(note, sizeof note, "the non-default mode, for comparison");
				char metric[64];
				snprintf(metric, sizeof metric, "floor_to_device_%s_GBps",
				         wf_stage_mode_name(other_mode));
				bench_report(&(struct bench_result){.bench = bench,
				                                    .metric = metric,
				                                    .unit = "GB/s",
				                                    .value = ov / 1e9,
				                                    .anchor = "same anchor",
				                                    .anchor_value = a / 1e9,
				                                    .ratio = ov / a,
				                                    .goal = 0.9,
				                                    .goal_op = ">=",
				                                    .notes = note});
			}
			bench_report(&(struct bench_result){
			    .bench = bench,
			    .metric = "evict_free_mem_ratio",
			    .unit = "x",
			    .value = (double)def2.free_after_evict / (double)def2.free_before,
			    .anchor = "device free memory before the load",
			    .anchor_value = (double)def2.free_before,
			    .ratio = (double)def2.free_after_evict / (double)def2.free_before,
			    .goal = 0.999,
			    .goal_op = ">=",
			    .notes = "free memory after evict / before load"});
		}
	}

	if (bench_selected(o, "cold")) {
		bool dropped = bench_drop_caches();
		if (!dropped)
			bench_evict_file(model_path);
		double fio = bench_fio_read(model_path, true);
		if (dropped)
			bench_drop_caches();
		else
			bench_evict_file(model_path);
		struct load_result cold = load_once(dev, m, NULL, WF_STAGE_MODE_STAGED);
		if (fio <= 0) {
			bench_skip(bench, "cold_file_load_GBps", "fio is not available or failed");
		} else if (cold.rc == 0) {
			double v = bytes / cold.seconds;
			bench_report(&(struct bench_result){
			    .bench = bench,
			    .metric = "cold_file_load_GBps",
			    .unit = "GB/s",
			    .value = v / 1e9,
			    .anchor = "fio io_uring O_DIRECT seq read GB/s",
			    .anchor_value = fio / 1e9,
			    .ratio = v / fio,
			    .goal = 0.9,
			    .goal_op = ">=",
			    .notes = dropped ? "no floor: staged from the file, page cache dropped"
			                     : "no floor; page cache evicted with fadvise"});
		}
	}
	if (!cuda) {
		const char *why =
		    "no CUDA device on this machine (run with --device cuda:0 on a GPU)";
		bench_skip("residency-cuda", "floor_to_device_GBps", why);
		bench_skip("residency-cuda", "time_to_resident_10GB_s", why);
		bench_skip("residency-cuda", "evict_free_mem_ratio", why);
	}
out:
	wf_shm_region_detach(floor);
	rmdir(floor_dir);
	wf_device_close(dev);
	wf_model_close(m);
	return rc < 0 ? 1 : 0;
}
