/* The reload planner (agent/reload.h) on a real floor region of a GGUF model laid out one tensor
 * per shard, as the per-tensor sweep tools lay models out: files whose identity did not move are
 * not read (one changed tensor reads one tensor's bytes, whatever the model's size); a changed
 * tensor is found by content and its new bytes are the plan's; a changed shape, a vanished and a
 * new tensor are refused by name; a changed file list and a file replaced after the model was
 * opened fail the plan. */
#include "agent/reload.h"

#include "base/error.h"
#include "common/wftest.h"
#include "model/gguf_writer.h"
#include "model/model.h"
#include "shm/layout.h"
#include "shm/region.h"
#include "shm/shmtest.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define N_T  6
#define ROWS 4
#define COLS 64 /* F32: 1 KiB a tensor */

static char *tmp, *path;
static struct wf_shm_config cfg;
static struct wf_model *m0;
static struct wf_shm_region *region;
static struct wf_reload_ident *base;

static void tensor_bytes(float *v, size_t n, uint32_t seed)
{
	for (size_t i = 0; i < n; i++)
		v[i] = (float)((seed * 2654435761u + (uint32_t)i * 40503u) % 1000u) / 1000.0f;
}

/* A model of n F32 tensors names[i] (shape COLS x rows[i]), one tensor per shard, tensor i's
 * values from seeds[i]. */
static void write_model(const char *const *names, const int64_t *rows, const uint32_t *seeds,
                        uint32_t n)
{
	struct wf_gguf_writer_opts o = {.split_max_tensors = 1};
	struct wf_gguf_writer *w = NULL;
	struct wf_diag d = {{0}};
	cr_assert_eq(wf_gguf_writer_create(path, &o, &w, &d), 0, "%s", d.msg);
	cr_assert_eq(wf_gguf_writer_set_str(w, "general.architecture", "llama"), 0);
	for (uint32_t i = 0; i < n; i++) {
		int64_t ne[2] = {COLS, rows[i]};
		cr_assert_eq(wf_gguf_writer_add_tensor(w, names[i], WF_DTYPE_F32, 2, ne, NULL, &d),
		             0, "%s", d.msg);
	}
	cr_assert_eq(wf_gguf_writer_write_header(w, &d), 0, "%s", d.msg);
	for (uint32_t i = 0; i < n; i++) {
		size_t k = (size_t)COLS * (size_t)rows[i];
		float *v = malloc(k * sizeof(*v));
		tensor_bytes(v, k, seeds[i]);
		cr_assert_eq(wf_gguf_writer_write(w, v, k * sizeof(*v), &d), 0, "%s", d.msg);
		free(v);
	}
	cr_assert_eq(wf_gguf_writer_finish(w, &d), 0, "%s", d.msg);
	wf_gguf_writer_destroy(w);
}

static const char *const names0[N_T] = {"t0", "t1", "t2", "t3", "t4", "t5"};
static const int64_t rows0[N_T] = {ROWS, ROWS, ROWS, ROWS, ROWS, ROWS};
static const uint32_t seeds0[N_T] = {1, 2, 3, 4, 5, 6};

static struct wf_model *open_model(void)
{
	char *first = NULL;
	cr_assert(asprintf(&first, "%s/m-00001-of-%05u.gguf", tmp, N_T) > 0);
	struct wf_model *m = NULL;
	struct wf_diag d = {{0}};
	int rc = wf_model_open(first, &m, &d);
	free(first);
	cr_assert_eq(rc, 0, "open: %s", wf_diag_str(&d, rc));
	return m;
}

static void setup(void)
{
	tmp = wft_tmpdir("reload-plan");
	cr_assert(asprintf(&path, "%s/m.gguf", tmp) > 0);
	write_model(names0, rows0, seeds0, N_T);
	m0 = open_model();
	cr_assert_eq(m0->n_files, N_T);
	char *floor_dir = NULL;
	cr_assert(asprintf(&floor_dir, "%s/floor", tmp) > 0);
	cfg = (struct wf_shm_config){.dir = floor_dir, .spare_bytes = 1 << 20};
	struct wf_digest dg;
	wf_model_digest(m0, &dg);
	static struct shmt_fill_ctx fc;
	struct wf_diag d = {{0}};
	int rc =
	    wf_shm_region_attach(&cfg, &dg, m0, WF_SHM_ATTACH_CREATE, shmt_fill, &fc, &region, &d);
	cr_assert_eq(rc, 0, "attach: %s", wf_diag_str(&d, rc));
	base = calloc(m0->n_files, sizeof(*base));
	for (uint32_t i = 0; i < m0->n_files; i++)
		base[i] = wf_reload_ident_of(&m0->files[i]);
}

static void teardown(void)
{
	wf_shm_region_detach(region);
	wf_model_close(m0);
	free(base);
	free((char *)cfg.dir);
	wft_rmtree(tmp);
	free(tmp);
	free(path);
}

TestSuite(reload_plan, .init = setup, .fini = teardown, .timeout = 60);

static struct wf_reload_plan plan_now(struct wf_model *m, int want_rc)
{
	struct wf_reload_plan p = {0};
	struct wf_diag d = {{0}};
	int rc = wf_reload_plan(region, m, base, N_T, &p, &d);
	cr_assert_eq(rc, want_rc, "plan: %d, want %d: %s", rc, want_rc, wf_diag_str(&d, rc));
	return p;
}

static const struct wf_reload_tensor *entry(const struct wf_reload_plan *p, const char *name)
{
	for (uint32_t i = 0; i < p->n_tensors; i++)
		if (strcmp(p->tensors[i].name, name) == 0)
			return &p->tensors[i];
	return NULL;
}

Test(reload_plan, unmoved_files_are_not_read)
{
	struct wf_model *m = open_model();
	struct wf_reload_plan p = plan_now(m, 0);
	cr_assert_eq(p.n_files, N_T);
	cr_assert_eq(p.files_moved, 0);
	cr_assert_eq(p.bytes_read, 0);
	cr_assert_eq(p.n_tensors, 0);
	wf_reload_plan_free(&p);
	wf_model_close(m);
}

Test(reload_plan, one_rewritten_tensor_reads_one_file)
{
	const struct wf_tensor *t = wf_model_find_tensor(m0, "t3");
	float v[COLS * ROWS];
	tensor_bytes(v, COLS * ROWS, 99);
	int fd = open(m0->files[t->file].path, O_WRONLY);
	cr_assert_geq(fd, 0);
	cr_assert_eq(pwrite(fd, v, sizeof v, (off_t)t->offset), (ssize_t)sizeof v);
	close(fd);

	struct wf_model *m = open_model();
	struct wf_reload_plan p = plan_now(m, 0);
	cr_assert_eq(p.files_moved, 1);
	cr_assert_eq(p.bytes_read, sizeof v, "read %llu bytes for one tensor",
	             (unsigned long long)p.bytes_read);
	cr_assert_eq(p.n_changed, 1);
	cr_assert_eq(p.n_unchanged, 0);
	cr_assert_eq(p.n_refused, 0);
	const struct wf_reload_tensor *e = entry(&p, "t3");
	cr_assert_not_null(e);
	cr_assert_eq(e->status, WF_RELOAD_CHANGED);
	cr_assert_eq(e->nbytes, sizeof v);
	cr_assert_eq(memcmp(e->data, v, sizeof v), 0);
	cr_assert_eq(e->new_checksum, wf_shm_checksum(v, sizeof v));
	struct wf_shm_tensor_info ti;
	cr_assert_eq(wf_shm_region_find(region, "t3", &ti), 0);
	cr_assert_eq(e->old_checksum, ti.checksum);
	cr_assert_eq(p.idents[t->file].ino, m->files[t->file].ino);
	wf_reload_plan_free(&p);
	wf_model_close(m);
}

Test(reload_plan, shape_vanished_and_new_tensors_are_refused_by_name)
{
	static const char *const names[N_T] = {"t0", "t1", "t2", "t3", "t4", "u5"};
	static const int64_t rows[N_T] = {ROWS, ROWS / 2, ROWS, ROWS, ROWS, ROWS};
	write_model(names, rows, seeds0, N_T); /* every file anew: all moved */
	struct wf_model *m = open_model();
	struct wf_reload_plan p = plan_now(m, 0);
	cr_assert_eq(p.files_moved, N_T);
	cr_assert_eq(p.n_unchanged, 4, "t0, t2, t3, t4 hold the same bytes");
	cr_assert_eq(p.n_changed, 0);
	cr_assert_eq(p.n_refused, 3);
	const struct wf_reload_tensor *e = entry(&p, "t1");
	cr_assert(e && e->status == WF_RELOAD_REFUSED &&
	              strstr(e->why, "shape changed from 64x4 to 64x2"),
	          "%s", e ? e->why : "t1 not listed");
	e = entry(&p, "t5");
	cr_assert(e && e->status == WF_RELOAD_REFUSED && strstr(e->why, "vanished"), "%s",
	          e ? e->why : "t5 not listed");
	e = entry(&p, "u5");
	cr_assert(e && e->status == WF_RELOAD_REFUSED && e->index == UINT32_MAX &&
	              strstr(e->why, "new"),
	          "%s", e ? e->why : "u5 not listed");
	wf_reload_plan_free(&p);
	wf_model_close(m);
}

Test(reload_plan, another_file_list_or_a_replaced_file_fails_the_plan)
{
	struct wf_reload_plan p = {0};
	struct wf_diag d = {{0}};
	struct wf_model *m = open_model();
	int rc = wf_reload_plan(region, m, base, N_T - 1, &p, &d);
	cr_assert_eq(rc, WF_ESHARD, "%s", wf_diag_str(&d, rc));
	cr_assert(strstr(d.msg, "file"), "%s", d.msg);
	wf_model_close(m);

	/* t2's shard written anew (moved), then replaced by another inode after the open */
	static const uint32_t seeds[N_T] = {1, 2, 33, 4, 5, 6};
	write_model(names0, rows0, seeds, N_T);
	m = open_model();
	const char *p2 = m->files[wf_model_find_tensor(m, "t2")->file].path;
	char *copy = NULL;
	cr_assert(asprintf(&copy, "%s.copy", p2) > 0);
	size_t len = 0;
	char *b = wft_read_file(p2, &len);
	FILE *f = fopen(copy, "wb");
	cr_assert_eq(fwrite(b, 1, len, f), len);
	fclose(f);
	cr_assert_eq(rename(copy, p2), 0);
	wf_diag_clear(&d);
	rc = wf_reload_plan(region, m, base, N_T, &p, &d);
	cr_assert_eq(rc, WF_ECHANGED, "%s", wf_diag_str(&d, rc));
	cr_assert(strstr(d.msg, "replaced"), "%s", d.msg);
	free(b);
	free(copy);
	wf_model_close(m);
}
