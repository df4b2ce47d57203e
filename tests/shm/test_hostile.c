/* Hostile floor directories and model files (issue 8): a floor directory or region planted by
 * another user, tensor bytes altered behind a valid header, a FIFO or a swapped file in place of a
 * model file, a file rewritten in place with its mtime restored; and the keep marker that lets the
 * agent keep a floor nobody holds, with wf_shm_region_reap(). */
#include "shmtest.h"

#include "base/error.h"
#include "common/wftest.h"
#include "shm/fill.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define NOBODY 65534

static char *tmp, *floor_dir, *model_dir;
static struct wf_shm_config cfg;
static struct wf_model *model;
static struct wf_digest digest;

static void setup(void)
{
	tmp = wft_tmpdir("shm-hostile");
	cr_assert(asprintf(&floor_dir, "%s/floor", tmp) > 0);
	cr_assert(asprintf(&model_dir, "%s/model", tmp) > 0);
	cr_assert_eq(mkdir(model_dir, 0755), 0);
	struct shmt_spec spec = {
	    .n_files = 2, .tensors_per_file = 3, .tensor_bytes = 8192, .seed = 11};
	model = shmt_model_make(model_dir, &spec, true);
	cr_assert_not_null(model);
	shmt_digest(model, &digest);
	memset(&cfg, 0, sizeof(cfg));
	cfg.dir = floor_dir;
}

static void teardown(void)
{
	shmt_model_free(model);
	wft_rmtree(tmp);
	free(floor_dir);
	free(model_dir);
}

static char *floor_path(const char *suffix)
{
	char *p, hex[WF_DIGEST_HEX_LEN];
	wf_digest_hex(&digest, hex);
	cr_assert(asprintf(&p, "%s/wf-%s%s", floor_dir, hex, suffix) > 0);
	return p;
}

static struct wf_shm_region *attach(unsigned flags, int want)
{
	struct wf_shm_region *r = NULL;
	struct wf_diag d;
	struct shmt_fill_ctx fc = {0};
	wf_diag_clear(&d);
	int rc = wf_shm_region_attach(&cfg, &digest, model, flags, shmt_fill, &fc, &r, &d);
	cr_assert_eq(rc, want, "attach 0x%x: %s, want %s: %s", flags, wf_err_name(rc),
	             wf_err_name(want), wf_diag_str(&d, rc));
	return r;
}

/* A READY region left behind with no holder, as a stopped agent leaves it. */
static void make_ready(void)
{
	wf_shm_region_abandon(attach(WF_SHM_ATTACH_AGENT, 0));
}

/* ---- the floor directory ------------------------------------------------------------------ */

Test(hostile, dir_check_creates_and_refuses_foreign_dirs, .init = setup, .fini = teardown)
{
	struct wf_diag d;
	struct stat st;
	wf_diag_clear(&d);
	cr_assert_eq(wf_shm_dir_check(&cfg, &d), 0, "%s", d.msg);
	cr_assert_eq(lstat(floor_dir, &st), 0);
	cr_assert(S_ISDIR(st.st_mode));
	cr_assert_eq(st.st_mode & 07777, 0750);
	cr_assert_eq(wf_shm_dir_check(&cfg, NULL), 0, "idempotent");

	/* created first by someone else */
	cr_assert_eq(chown(floor_dir, NOBODY, NOBODY), 0);
	wf_diag_clear(&d);
	cr_assert_eq(wf_shm_dir_check(&cfg, &d), WF_EPERMISSION);
	cr_assert(strstr(d.msg, "owned by uid 65534"), "%s", d.msg);
	cr_assert_eq(chown(floor_dir, geteuid(), getegid()), 0);

	/* writable by others */
	cr_assert_eq(chmod(floor_dir, 0777), 0);
	wf_diag_clear(&d);
	cr_assert_eq(wf_shm_dir_check(&cfg, &d), WF_EPERMISSION);
	cr_assert(strstr(d.msg, "mode 0777"), "%s", d.msg);
	cr_assert_eq(chmod(floor_dir, 0770), 0);
	cr_assert_eq(wf_shm_dir_check(&cfg, NULL), WF_EPERMISSION, "group-writable");
	cr_assert_eq(chmod(floor_dir, 0750), 0);

	/* a symlink to a directory someone else controls */
	char *real = NULL;
	cr_assert(asprintf(&real, "%s/real", tmp) > 0);
	cr_assert_eq(rmdir(floor_dir), 0);
	cr_assert_eq(mkdir(real, 0750), 0);
	cr_assert_eq(symlink(real, floor_dir), 0);
	wf_diag_clear(&d);
	cr_assert_eq(wf_shm_dir_check(&cfg, &d), WF_EPERMISSION);
	cr_assert(strstr(d.msg, "symlink"), "%s", d.msg);
	cr_assert_eq(unlink(floor_dir), 0);

	/* an ancestor writable by others without the sticky bit */
	char *anc = NULL, *sub = NULL;
	cr_assert(asprintf(&anc, "%s/open", tmp) > 0);
	cr_assert(asprintf(&sub, "%s/open/floor", tmp) > 0);
	cr_assert_eq(mkdir(anc, 0777), 0);
	cr_assert_eq(chmod(anc, 0777), 0);
	struct wf_shm_config c2 = {.dir = sub};
	wf_diag_clear(&d);
	cr_assert_eq(wf_shm_dir_check(&c2, &d), WF_EPERMISSION);
	cr_assert(strstr(d.msg, "ancestor"), "%s", d.msg);
	cr_assert_eq(chmod(anc, 01777), 0); /* like /dev/shm: fine */
	wf_diag_clear(&d);
	cr_assert_eq(wf_shm_dir_check(&c2, &d), 0, "%s", d.msg);
	free(anc);
	free(sub);
	free(real);
}

/* ---- regions and lock files not ours ------------------------------------------------------ */

Test(hostile, foreign_or_writable_regions_are_not_trusted, .init = setup, .fini = teardown)
{
	char *region = floor_path(""), *guard = floor_path(".guard");
	make_ready();
	struct stat st0;
	cr_assert_eq(stat(region, &st0), 0);

	/* planted by another user: the scan says BROKEN, an OWNED reader refuses, the agent
	 * rebuilds */
	cr_assert_eq(chown(region, NOBODY, NOBODY), 0);
	struct wf_shm_scan_entry *ents = NULL;
	size_t n = 0;
	cr_assert_eq(wf_shm_dir_scan(&cfg, &ents, &n, NULL), 0);
	cr_assert_eq(n, 1);
	cr_assert_eq(ents[0].cls, WF_SHM_SCAN_BROKEN);
	cr_assert_eq(ents[0].error, WF_EPERMISSION);
	cr_assert(strstr(ents[0].why, "owned by uid 65534"), "%s", ents[0].why);
	free(ents);
	attach(WF_SHM_ATTACH_READER | WF_SHM_ATTACH_OWNED, WF_EPERMISSION);
	/* a plain reader (a worker) does not check owners */
	wf_shm_region_detach(attach(WF_SHM_ATTACH_READER, 0));
	make_ready();
	cr_assert_eq(chown(region, NOBODY, NOBODY), 0);
	struct wf_shm_region *r = attach(WF_SHM_ATTACH_AGENT | WF_SHM_ATTACH_OWNED, 0);
	cr_assert(wf_shm_region_materialized(r), "a foreign region was adopted");
	cr_assert(strstr(wf_shm_region_rebuild_reason(r), "owned by uid 65534"), "%s",
	          wf_shm_region_rebuild_reason(r));
	struct stat st;
	cr_assert_eq(stat(region, &st), 0);
	cr_assert_eq(st.st_uid, geteuid());
	wf_shm_region_abandon(r);

	/* world-writable */
	cr_assert_eq(chmod(region, 0666), 0);
	cr_assert_eq(wf_shm_dir_scan(&cfg, &ents, &n, NULL), 0);
	cr_assert_eq(ents[0].cls, WF_SHM_SCAN_BROKEN);
	cr_assert(strstr(ents[0].why, "writable by others"), "%s", ents[0].why);
	free(ents);
	r = attach(WF_SHM_ATTACH_MUST_EXIST | WF_SHM_ATTACH_VERIFY, 0);
	cr_assert(wf_shm_region_materialized(r));
	wf_shm_region_abandon(r);

	/* a lock file not ours: refused, and BROKEN in the scan */
	cr_assert_eq(chown(guard, NOBODY, NOBODY), 0);
	attach(WF_SHM_ATTACH_MUST_EXIST | WF_SHM_ATTACH_OWNED, WF_EPERMISSION);
	cr_assert_eq(wf_shm_dir_scan(&cfg, &ents, &n, NULL), 0);
	cr_assert_eq(ents[0].cls, WF_SHM_SCAN_BROKEN);
	cr_assert(strstr(ents[0].why, ".guard is owned by uid 65534"), "%s", ents[0].why);
	free(ents);
	/* the agent's removal of what is BROKEN and unheld clears it */
	cr_assert_eq(wf_shm_region_remove(&cfg, &digest, 0, NULL), 0);
	cr_assert_eq(shmt_count_entries(floor_dir, NULL, 0), 0);
	free(region);
	free(guard);
}

/* Bytes altered behind a valid header and tables: VERIFY rebuilds instead of adopting. */
Test(hostile, tampered_tensor_bytes_are_rebuilt_on_verify, .init = setup, .fini = teardown)
{
	char why[256];
	make_ready();
	size_t size = 0;
	uint8_t *base = shmt_map_rw(&cfg, model, &size);
	cr_assert_not_null(base);
	const struct wf_shm_header *h = (const void *)base;
	cr_assert_eq(h->state, WF_SHM_STATE_READY);
	const struct wf_shm_tensor_entry *te = (const void *)(base + h->tensor_table_offset);
	base[te[4].floor_offset + 100] ^= 0x5a; /* the table and header stay valid */
	munmap(base, size);

	/* without VERIFY the region validates and would be adopted as is */
	struct wf_shm_region *r = attach(WF_SHM_ATTACH_MUST_EXIST | WF_SHM_ATTACH_OWNED, 0);
	cr_assert_not(wf_shm_region_materialized(r));
	cr_assert_eq(wf_shm_region_verify(r, NULL), WF_ECHECKSUM);
	wf_shm_region_abandon(r);

	/* a reader that may not rebuild refuses it */
	attach(WF_SHM_ATTACH_READER | WF_SHM_ATTACH_VERIFY, WF_ECHECKSUM);

	r = attach(WF_SHM_ATTACH_MUST_EXIST | WF_SHM_ATTACH_VERIFY, 0);
	cr_assert(wf_shm_region_materialized(r), "the tampered region was adopted");
	cr_assert(strstr(wf_shm_region_rebuild_reason(r), "checksum"), "%s",
	          wf_shm_region_rebuild_reason(r));
	cr_assert_eq(shmt_check_bytes(r, model, why, sizeof(why)), 0, "%s", why);
	wf_shm_region_detach(r);
}

/* ---- model files that are not what they seem ---------------------------------------------- */

static int fill_files(const struct wf_shm_fill_io *fi, struct wf_diag *d)
{
	struct wf_shm_region *r = NULL;
	wf_diag_clear(d);
	int rc =
	    wf_shm_region_attach(&cfg, &digest, model, WF_SHM_ATTACH_AGENT | WF_SHM_ATTACH_STREAM,
	                         wf_shm_fill_from_files, (void *)fi, &r, d);
	if (rc == 0)
		wf_shm_region_detach(r);
	return rc;
}

Test(hostile, fill_refuses_a_fifo_without_blocking, .init = setup, .fini = teardown, .timeout = 20)
{
	struct wf_shm_fill_io fi = {.io = {.flags = WF_IO_OPT_NO_ENV}};
	struct wf_diag d;
	cr_assert_eq(unlink(model->files[1].path), 0);
	cr_assert_eq(mkfifo(model->files[1].path, 0600), 0);
	int rc = fill_files(&fi, &d);
	cr_assert_eq(rc, WF_EFORMAT, "%s: %s", wf_err_name(rc), d.msg);
	cr_assert(strstr(d.msg, "not a regular file"), "%s", d.msg);
	cr_assert_eq(shmt_count_entries(floor_dir, NULL, 0), 0);
}

/* The file the model's reader opened, by dev/ino: a path swapped for a copy with the same size
 * and mtime (a symlink out of the model roots, say) is not read. */
Test(hostile, fill_reads_only_the_inventoried_file, .init = setup, .fini = teardown)
{
	struct wf_shm_fill_io fi = {.io = {.flags = WF_IO_OPT_NO_ENV}};
	struct wf_diag d;
	struct stat st;
	for (uint32_t i = 0; i < model->n_files; i++) {
		cr_assert_eq(stat(model->files[i].path, &st), 0);
		model->files[i].dev = (uint64_t)st.st_dev;
		model->files[i].ino = (uint64_t)st.st_ino;
	}
	/* a copy outside, same bytes, size and mtime, and a symlink to it in place */
	char *outside = NULL, *cmd = NULL;
	cr_assert(asprintf(&outside, "%s/outside.bin", tmp) > 0);
	cr_assert(asprintf(&cmd, "cp -p '%s' '%s'", model->files[0].path, outside) > 0);
	cr_assert_eq(system(cmd), 0);
	cr_assert_eq(unlink(model->files[0].path), 0);
	cr_assert_eq(symlink(outside, model->files[0].path), 0);
	int rc = fill_files(&fi, &d);
	cr_assert_eq(rc, WF_ECHANGED, "%s: %s", wf_err_name(rc), d.msg);
	cr_assert(strstr(d.msg, "no longer the file that was inventoried"), "%s", d.msg);
	cr_assert_eq(shmt_count_entries(floor_dir, NULL, 0), 0);
	free(outside);
	free(cmd);
}

/* Rewritten in place during the copy, size and mtime restored: the ctime tells. */
struct rewrite {
	const char *path;
	uint64_t at;
	struct timespec mtime;
};

static void rewrite_in_place(void *ctx, uint64_t total)
{
	struct rewrite *w = ctx;
	(void)total;
	int fd = open(w->path, O_WRONLY | O_CLOEXEC);
	cr_assert_geq(fd, 0);
	uint8_t junk[64];
	memset(junk, 0xa5, sizeof(junk));
	cr_assert_eq(pwrite(fd, junk, sizeof(junk), (off_t)w->at), (ssize_t)sizeof(junk));
	struct timespec ts[2] = {{0, UTIME_OMIT}, w->mtime};
	cr_assert_eq(futimens(fd, ts), 0);
	close(fd);
}

Test(hostile, fill_catches_a_rewrite_with_the_mtime_restored, .init = setup, .fini = teardown)
{
	struct stat st;
	const char *p = model->files[1].path;
	cr_assert_eq(stat(p, &st), 0);
	struct rewrite w = {.path = p, .at = model->tensors[4].offset, .mtime = st.st_mtim};
	struct wf_shm_fill_io fi = {.io = {.flags = WF_IO_OPT_NO_ENV},
	                            .before_copy = rewrite_in_place,
	                            .before_copy_ctx = &w};
	struct wf_diag d;
	cr_assert(wft_wait_past_ctime(p), "the coarse clock did not pass %s's ctime", p);
	int rc = fill_files(&fi, &d);
	cr_assert_eq(rc, WF_ECHANGED, "a torn floor became READY: %s (%s)", wf_err_name(rc), d.msg);
	cr_assert(strstr(d.msg, p) && strstr(d.msg, "changed during materialization"), "%s", d.msg);
	cr_assert_eq(shmt_count_entries(floor_dir, NULL, 0), 0);
	/* size and mtime are what the digest covers, unchanged: only the ctime moved */
	struct stat st2;
	cr_assert_eq(stat(p, &st2), 0);
	cr_assert_eq(st2.st_size, st.st_size);
	cr_assert_eq(st2.st_mtim.tv_nsec, st.st_mtim.tv_nsec);
}

/* ---- the keep marker ---------------------------------------------------------------------- */

Test(hostile, keep_marker_outlives_the_last_holder, .init = setup, .fini = teardown)
{
	char *region = floor_path(""), *keep = floor_path(".keep");
	struct wf_shm_region *agent = attach(WF_SHM_ATTACH_AGENT, 0);
	struct wf_shm_region *reader = attach(WF_SHM_ATTACH_READER, 0);
	cr_assert_eq(wf_shm_region_set_keep(&cfg, &digest, true, NULL), 0);
	cr_assert_eq(wf_shm_region_set_keep(&cfg, &digest, true, NULL), 0, "idempotent");
	struct stat st;
	cr_assert_eq(stat(keep, &st), 0);
	cr_assert_eq(st.st_mode & 07777, 0640);
	cr_assert_eq(st.st_uid, geteuid());
	/* the agent stops first (gives up its hold), the reader detaches last: the floor stays */
	wf_shm_region_detach(agent);
	wf_shm_region_detach(reader);
	cr_assert(shmt_exists(region), "the last holder removed a kept floor");

	struct wf_shm_scan_entry *ents = NULL;
	size_t n = 0;
	cr_assert_eq(wf_shm_dir_scan(&cfg, &ents, &n, NULL), 0);
	cr_assert_eq(n, 1);
	cr_assert_eq(ents[0].cls, WF_SHM_SCAN_READY);
	cr_assert(ents[0].has_keep);
	cr_assert_not(ents[0].held);
	free(ents);

	/* reap respects the marker */
	cr_assert_eq(wf_shm_region_reap(&cfg, &digest, NULL), WF_ESTATE);
	cr_assert(shmt_exists(region));

	/* cleared: the next last holder removes it */
	cr_assert_eq(wf_shm_region_set_keep(&cfg, &digest, false, NULL), 0);
	cr_assert_eq(wf_shm_region_set_keep(&cfg, &digest, false, NULL), 0, "idempotent");
	cr_assert_not(shmt_exists(keep));
	reader = attach(WF_SHM_ATTACH_READER, 0);
	wf_shm_region_detach(reader);
	cr_assert_not(shmt_exists(region));
	cr_assert_eq(shmt_count_entries(floor_dir, NULL, 0), 0);
	free(region);
	free(keep);
}

Test(hostile, keep_before_the_region_and_remove, .init = setup, .fini = teardown)
{
	char names[512];
	char *keep = floor_path(".keep"), *region = floor_path("");
	cr_assert_eq(mkdir(floor_dir, 0750), 0);
	/* set before materializing: only the marker is left */
	cr_assert_eq(wf_shm_region_set_keep(&cfg, &digest, true, NULL), 0);
	cr_assert_eq(shmt_count_entries(floor_dir, names, sizeof(names)), 1, "%s", names);
	cr_assert(shmt_exists(keep));
	struct wf_shm_scan_entry *ents = NULL;
	size_t n = 0;
	cr_assert_eq(wf_shm_dir_scan(&cfg, &ents, &n, NULL), 0);
	cr_assert_eq(n, 1);
	cr_assert_eq(ents[0].cls, WF_SHM_SCAN_ORPHAN);
	cr_assert(ents[0].has_keep);
	cr_assert_not(ents[0].has_region);
	free(ents);
	cr_assert_eq(wf_shm_region_reap(&cfg, &digest, NULL), -ENOENT);

	/* materialized and released: still there */
	wf_shm_region_detach(attach(WF_SHM_ATTACH_AGENT, 0));
	cr_assert(shmt_exists(region));
	/* a marker planted by someone else is replaced by ours */
	cr_assert_eq(chown(keep, NOBODY, NOBODY), 0);
	cr_assert_eq(wf_shm_region_set_keep(&cfg, &digest, true, NULL), 0);
	struct stat st;
	cr_assert_eq(stat(keep, &st), 0);
	cr_assert_eq(st.st_uid, geteuid());
	/* the explicit removal takes the marker too */
	cr_assert_eq(wf_shm_region_remove(&cfg, &digest, 0, NULL), 0);
	cr_assert_eq(shmt_count_entries(floor_dir, names, sizeof(names)), 0, "%s", names);
	free(keep);
	free(region);
}

Test(hostile, reap_semantics, .init = setup, .fini = teardown)
{
	char *region = floor_path("");
	cr_assert_eq(wf_shm_region_reap(&cfg, &digest, NULL), -ENOENT);
	struct wf_shm_region *r = attach(WF_SHM_ATTACH_AGENT, 0);
	cr_assert_eq(wf_shm_region_reap(&cfg, &digest, NULL), -EBUSY, "held");
	cr_assert(shmt_exists(region));
	wf_shm_region_abandon(r); /* unheld, no marker */
	cr_assert(shmt_exists(region));
	cr_assert_eq(wf_shm_region_reap(&cfg, &digest, NULL), 0);
	cr_assert_eq(shmt_count_entries(floor_dir, NULL, 0), 0);
	free(region);
}
