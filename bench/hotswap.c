/* wf-bench hotswap: reloading a tensor changed on disk into a model's floor (agent/reload.h: the
 * files reopened, the moved ones read and hashed, the changed tensor published as one
 * generation), the agent's work for `agentctl reload` without its RPC. Each timed reload starts
 * with the changed file out of the page cache, so its bytes come from the disk.
 *
 *  reload_one_tensor_1g, _4g  one 16 MiB tensor changed in a 1 GiB / 4 GiB model laid out one
 *                             tensor per shard (llama-gguf-split --split-max-tensors 1): seconds,
 *                             over the tensor's bytes at the disk's read bandwidth (fio, io_uring
 *                             O_DIRECT, on the shard itself). Goal <= 2.
 *  reload_one_tensor_4g_over_1g  the two times' ratio: flat in model size. Goal <= 1.2.
 *  reload_single_file_GBps    the same change in a 1 GiB single-file model, whose one file is
 *                             read whole (every tensor hashed): GB/s over fio's on the file.
 *                             Goal >= 0.8.
 * Not here: the generation stall of a worker (its refresh: test_engine_refresh bounds it to a
 * step boundary) and a sweep iteration against a llama.cpp restart (needs the peer).
 * WF_HOTSWAP_DEBUG=1 prints each reload's phases (open, attach, plan, publish) on stderr. */
#include "anchors.h"
#include "bench.h"
#include "report.h"

#include "agent/reload.h"
#include "base/error.h"
#include "model/gguf_writer.h"
#include "model/model.h"
#include "shm/fill.h"
#include "shm/layout.h"
#include "shm/region.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define HS_COLS   4096
#define HS_ROWS   1024 /* F32: 16 MiB a tensor */
#define HS_TENSOR ((size_t)HS_COLS * HS_ROWS * sizeof(float))

/* One model under test: its floor, held for the run, and the baseline its reloads move. */
struct hs_model {
	char path[4200];  /* as written (the prefix of the shards) */
	char first[4200]; /* what wf_model_open takes */
	char floor_dir[4200];
	struct wf_digest digest;
	struct wf_shm_region *held;
	struct wf_reload_ident *base;
	uint32_t n_files;
};

/* A model of n 16 MiB F32 tensors "t<i>", one per shard when split, each a distinct pattern. */
static int write_model(const char *path, uint32_t n, bool split)
{
	struct wf_gguf_writer_opts opt = {.split_max_tensors = split ? 1 : 0};
	struct wf_gguf_writer *w = NULL;
	struct wf_diag d = {{0}};
	uint32_t *buf = malloc(HS_TENSOR);
	int rc = buf ? wf_gguf_writer_create(path, &opt, &w, &d) : -ENOMEM;
	if (rc == 0)
		rc = wf_gguf_writer_set_str(w, "general.architecture", "llama");
	for (uint32_t i = 0; rc == 0 && i < n; i++) {
		char name[32];
		snprintf(name, sizeof name, "t%u", i);
		rc = wf_gguf_writer_add_tensor(w, name, WF_DTYPE_F32, 2,
		                               (const int64_t[]){HS_COLS, HS_ROWS}, NULL, &d);
	}
	if (rc == 0)
		rc = wf_gguf_writer_write_header(w, &d);
	for (uint32_t i = 0; rc == 0 && i < n; i++) {
		for (size_t k = 0; k < HS_TENSOR / 4; k++)
			buf[k] = (uint32_t)k * 2654435761u + i;
		rc = wf_gguf_writer_write(w, buf, HS_TENSOR, &d);
	}
	if (rc == 0)
		rc = wf_gguf_writer_finish(w, &d);
	wf_gguf_writer_destroy(w);
	free(buf);
	if (rc < 0)
		fprintf(stderr, "wf-bench: writing %s: %s\n", path, wf_diag_str(&d, rc));
	return rc;
}

static void model_fini(struct hs_model *hm)
{
	wf_shm_region_detach(hm->held);
	hm->held = NULL;
	free(hm->base);
	hm->base = NULL;
	rmdir(hm->floor_dir);
}

/* Writes the model, materializes its floor (held until model_fini) and takes the baseline. */
static int model_init(const struct bench_opts *o, struct hs_model *hm, const char *tag, uint32_t n,
                      bool split)
{
	snprintf(hm->path, sizeof hm->path, "%s/hotswap-%s.gguf", o->dir, tag);
	if (split)
		snprintf(hm->first, sizeof hm->first, "%s/hotswap-%s-00001-of-%05u.gguf", o->dir,
		         tag, n);
	else
		snprintf(hm->first, sizeof hm->first, "%s", hm->path);
	snprintf(hm->floor_dir, sizeof hm->floor_dir, "%s/wf-bench-hotswap-%d", o->floor_root,
	         (int)getpid());
	if ((mkdir(o->dir, 0755) < 0 && errno != EEXIST) || write_model(hm->path, n, split) < 0)
		return -1;
	struct wf_model *m = NULL;
	struct wf_diag d = {{0}};
	int rc = wf_model_open(hm->first, &m, &d);
	if (rc == 0) {
		wf_model_digest(m, &hm->digest);
		/* room for every iteration's new version of the tensor */
		struct wf_shm_config cfg = {
		    .dir = hm->floor_dir, .spare_bytes = (uint64_t)(o->iterations + 2) * HS_TENSOR};
		struct wf_shm_fill_io fi = {0};
		rc = wf_shm_region_attach(&cfg, &hm->digest, m, WF_SHM_ATTACH_AGENT,
		                          wf_shm_fill_from_files, &fi, &hm->held, &d);
	}
	/* the disk quiet before the timed reloads: no writeback of the model competes with them */
	sync();
	if (rc == 0) {
		hm->n_files = m->n_files;
		hm->base = calloc(m->n_files, sizeof(*hm->base));
		for (uint32_t i = 0; hm->base && i < m->n_files; i++)
			hm->base[i] = wf_reload_ident_of(&m->files[i]);
		rc = hm->base ? 0 : -ENOMEM;
	}
	if (rc < 0)
		fprintf(stderr, "wf-bench: %s: %s\n", hm->first, wf_diag_str(&d, rc));
	wf_model_close(m);
	return rc;
}

/* Rewrites tensor `name` in place with a pattern of its own (seed), then drops the file from
 * the page cache. *ret_file: the file holding it. */
static int change_tensor(const struct hs_model *hm, const char *name, uint32_t seed, char *ret_file,
                         size_t len)
{
	struct wf_model *m = NULL;
	struct wf_diag d = {{0}};
	int rc = wf_model_open(hm->first, &m, &d);
	const struct wf_tensor *t = rc == 0 ? wf_model_find_tensor(m, name) : NULL;
	uint32_t *buf = t ? malloc(t->nbytes) : NULL;
	int fd = buf ? open(m->files[t->file].path, O_WRONLY | O_CLOEXEC) : -1;
	rc = fd < 0 ? -1 : 0;
	if (rc == 0) {
		for (size_t k = 0; k < t->nbytes / 4; k++)
			buf[k] = (uint32_t)k * 40503u + seed;
		rc = pwrite(fd, buf, t->nbytes, (off_t)t->offset) == (ssize_t)t->nbytes ? 0 : -1;
		close(fd);
		snprintf(ret_file, len, "%s", m->files[t->file].path);
		bench_evict_file(ret_file);
	}
	free(buf);
	wf_model_close(m);
	return rc;
}

/* One reload as the agent does it: reopen, plan against the floor, publish the changed tensors;
 * the plan's identities become the baseline. Seconds, or -1. */
static double reload_once(struct hs_model *hm, uint64_t *ret_read, uint32_t *ret_changed)
{
	struct wf_model *m = NULL;
	struct wf_shm_region *w = NULL;
	struct wf_reload_plan p = {0};
	struct wf_diag d = {{0}};
	struct wf_shm_config cfg = {.dir = hm->floor_dir};
	double t0 = bench_now();
	int rc = wf_model_open(hm->first, &m, &d);
	double t_open = bench_now();
	if (rc == 0)
		rc = wf_shm_region_attach(&cfg, &hm->digest, NULL,
		                          WF_SHM_ATTACH_WRITE | WF_SHM_ATTACH_OWNED, NULL, NULL, &w,
		                          &d);
	double t_attach = bench_now();
	if (rc == 0)
		rc = wf_reload_plan(w, m, hm->base, hm->n_files, &p, &d);
	double t_plan = bench_now();
	struct wf_shm_publish_tensor *pt = calloc(p.n_changed ? p.n_changed : 1, sizeof(*pt));
	uint32_t k = 0;
	for (uint32_t i = 0; rc == 0 && pt && i < p.n_tensors; i++)
		if (p.tensors[i].status == WF_RELOAD_CHANGED) {
			struct wf_shm_tensor_info ti;
			rc = wf_shm_region_tensor(w, p.tensors[i].index, &ti);
			pt[k++] = (struct wf_shm_publish_tensor){.index = ti.index,
			                                         .dtype = ti.dtype,
			                                         .nbytes = ti.nbytes,
			                                         .data = p.tensors[i].data};
		}
	uint64_t gen = 0;
	if (rc == 0 && k)
		rc = wf_shm_region_publish(w, pt, k, 0, &gen, &d);
	double secs = bench_now() - t0;
	if (getenv("WF_HOTSWAP_DEBUG"))
		fprintf(stderr, "reload: open %.4f attach %.4f plan %.4f publish %.4f s\n",
		        t_open - t0, t_attach - t_open, t_plan - t_attach, t0 + secs - t_plan);
	if (rc == 0) {
		memcpy(hm->base, p.idents, hm->n_files * sizeof(*hm->base));
		*ret_read = p.bytes_read;
		*ret_changed = p.n_changed;
	} else {
		fprintf(stderr, "wf-bench: reload %s: %s\n", hm->first, wf_diag_str(&d, rc));
	}
	free(pt);
	wf_reload_plan_free(&p);
	wf_shm_region_detach(w);
	wf_model_close(m);
	return rc == 0 ? secs : -1;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* Median seconds of o->iterations reloads of one changed tensor (the middle one); *ret_file
 * the file it lies in, *ret_read the bytes the last reload read. */
static double median_reload(const struct bench_opts *o, struct hs_model *hm, uint32_t n,
                            char *ret_file, size_t len, uint64_t *ret_read)
{
	double s[16];
	int it = o->iterations < 1 ? 1 : o->iterations > 16 ? 16 : o->iterations;
	char name[32];
	snprintf(name, sizeof name, "t%u", n / 2);
	for (int i = 0; i < it; i++) {
		uint32_t changed = 0;
		if (change_tensor(hm, name, (uint32_t)i + 7, ret_file, len) < 0)
			return -1;
		s[i] = reload_once(hm, ret_read, &changed);
		if (s[i] < 0 || changed != 1) {
			fprintf(stderr, "wf-bench: hotswap: the reload found %u changed tensors\n",
			        changed);
			return -1;
		}
	}
	qsort(s, (size_t)it, sizeof s[0], cmp_double);
	return s[it / 2];
}

static double run_split(const struct bench_opts *o, const char *tag, uint32_t n, double *ret_fio)
{
	struct hs_model hm = {0};
	char file[4200];
	uint64_t read = 0;
	double secs = -1;
	if (model_init(o, &hm, tag, n, true) == 0) {
		secs = median_reload(o, &hm, n, file, sizeof file, &read);
		*ret_fio = secs > 0 ? bench_fio_read(file, true) : -1;
	}
	model_fini(&hm);
	if (secs > 0 && *ret_fio > 0) {
		char metric[64], notes[256];
		double anchor = (double)HS_TENSOR / *ret_fio;
		snprintf(metric, sizeof metric, "reload_one_tensor_%s", tag);
		snprintf(notes, sizeof notes,
		         "%u shards of one 16 MiB tensor; %llu bytes read; median of %d", n,
		         (unsigned long long)read, o->iterations < 1 ? 1 : o->iterations);
		bench_report(&(struct bench_result){
		    .bench = "hotswap",
		    .metric = metric,
		    .unit = "s",
		    .value = secs,
		    .anchor = "tensor bytes at fio io_uring O_DIRECT read bandwidth (s)",
		    .anchor_value = anchor,
		    .ratio = secs / anchor,
		    .goal = 2,
		    .goal_op = "<=",
		    .notes = notes});
	}
	return secs;
}

static void run_single(const struct bench_opts *o)
{
	struct hs_model hm = {0};
	char file[4200];
	uint64_t read = 0;
	double secs = -1, fio = -1;
	if (model_init(o, &hm, "single-1g", 64, false) == 0) {
		secs = median_reload(o, &hm, 64, file, sizeof file, &read);
		if (secs > 0)
			bench_evict_file(file);
		fio = secs > 0 ? bench_fio_read(file, true) : -1;
	}
	model_fini(&hm);
	unlink(hm.path);
	if (secs <= 0 || fio <= 0) {
		bench_skip("hotswap", "reload_single_file_GBps",
		           secs <= 0 ? "the reload failed" : "fio is not available or failed");
		return;
	}
	double v = (double)read / secs / 1e9;
	bench_report(&(struct bench_result){.bench = "hotswap",
	                                    .metric = "reload_single_file_GBps",
	                                    .unit = "GB/s",
	                                    .value = v,
	                                    .anchor = "fio io_uring O_DIRECT seq read GB/s",
	                                    .anchor_value = fio / 1e9,
	                                    .ratio = v * 1e9 / fio,
	                                    .goal = 0.8,
	                                    .goal_op = ">=",
	                                    .notes = "1 GiB in one file: every tensor read "
	                                             "and hashed, one published"});
}

/* The shards of a split model (written by model_init), removed after its rows. */
static void remove_shards(const struct bench_opts *o, const char *tag, uint32_t n)
{
	for (uint32_t i = 1; i <= n; i++) {
		char p[4200];
		snprintf(p, sizeof p, "%s/hotswap-%s-%05u-of-%05u.gguf", o->dir, tag, i, n);
		unlink(p);
	}
}

int bench_hotswap(const struct bench_opts *opts)
{
	struct bench_opts oo = *opts;
	if (oo.iterations < 1)
		oo.iterations = 3;
	const struct bench_opts *o = &oo;
	double fio1 = -1, fio4 = -1, s1 = -1, s4 = -1;
	if (bench_selected(o, "split")) {
		s1 = run_split(o, "1g", 64, &fio1);
		remove_shards(o, "1g", 64);
		s4 = run_split(o, "4g", 256, &fio4);
		remove_shards(o, "4g", 256);
		if (s1 > 0 && s4 > 0)
			bench_report(&(struct bench_result){
			    .bench = "hotswap",
			    .metric = "reload_one_tensor_4g_over_1g",
			    .unit = "x",
			    .value = s4 / s1,
			    .anchor = "reload_one_tensor_1g (s)",
			    .anchor_value = s1,
			    .ratio = s4 / s1,
			    .goal = 1.2,
			    .goal_op = "<=",
			    .notes = "flat in model size: only the moved shard is read"});
		else
			bench_skip("hotswap", "reload_one_tensor_4g_over_1g",
			           "a reload or fio failed");
	}
	if (bench_selected(o, "single"))
		run_single(o);
	return 0;
}
