/* Floor regions in one process (plus short forked children): attach modes, accessors, holders,
 * permissions, read-only mappings, verify, scan and remove. Each test uses its own temporary
 * floor directory. */
#include "shmtest.h"

#include "base/error.h"
#include "common/wftest.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char *tmp, *floor_dir, *model_dir, *count_path;
static struct wf_shm_config cfg;
static struct wf_model *model;
static struct wf_digest digest;
static struct shmt_fill_ctx fill_ctx;

static void setup(void)
{
	tmp = wft_tmpdir("shm-region");
	cr_assert(asprintf(&floor_dir, "%s/floor/sub", tmp) > 0);
	cr_assert(asprintf(&model_dir, "%s/model", tmp) > 0);
	cr_assert(asprintf(&count_path, "%s/fills", tmp) > 0);
	cr_assert_eq(mkdir(model_dir, 0755), 0);
	struct shmt_spec spec = {
	    .n_files = 3, .tensors_per_file = 5, .tensor_bytes = 8192, .seed = 7};
	model = shmt_model_make(model_dir, &spec, true);
	cr_assert_not_null(model);
	shmt_digest(model, &digest);
	memset(&cfg, 0, sizeof(cfg));
	cfg.dir = floor_dir;
	fill_ctx = (struct shmt_fill_ctx){.count_path = count_path};
}

static void teardown(void)
{
	shmt_model_free(model);
	wft_rmtree(tmp);
}

static char *floor_path(const char *suffix)
{
	char *p;
	cr_assert(asprintf(&p, "%s/wf-%016llx%016llx%s", floor_dir, (unsigned long long)digest.hi,
	                   (unsigned long long)digest.lo, suffix) > 0);
	return p;
}

static struct wf_shm_region *attach(unsigned flags)
{
	struct wf_shm_region *r = NULL;
	struct wf_diag diag;
	wf_diag_clear(&diag);
	int rc = wf_shm_region_attach(&cfg, &digest, flags ? model : NULL, flags,
	                              flags ? shmt_fill : NULL, &fill_ctx, &r, &diag);
	cr_assert_eq(rc, 0, "attach: %s", wf_diag_str(&diag, rc));
	return r;
}

static void assert_floor_empty(void)
{
	char names[1024];
	int n = shmt_count_entries(floor_dir, names, sizeof(names));
	cr_assert_eq(n, 0, "floor directory not empty: %s", names);
}

Test(region, attach_agent_then_readers, .init = setup, .fini = teardown)
{
	struct wf_diag diag;
	char why[256];

	struct wf_shm_region *a = attach(WF_SHM_ATTACH_AGENT);
	cr_assert(wf_shm_region_materialized(a));
	cr_assert_null(wf_shm_region_rebuild_reason(a));
	cr_assert_eq(shmt_file_size(count_path), 1, "one fill");
	cr_assert_eq(wf_shm_region_state(a), WF_SHM_STATE_READY);
	cr_assert_eq(wf_shm_region_generation(a), 0);
	cr_assert_eq(wf_shm_region_n_tensors(a), 15);
	wf_diag_clear(&diag);
	cr_assert_eq(wf_shm_region_verify(a, &diag), 0, "%s", diag.msg);
	cr_assert_eq(shmt_check_bytes(a, model, why, sizeof(why)), 0, "%s", why);

	struct wf_shm_header h;
	wf_shm_region_header(a, &h);
	cr_assert_eq(h.magic, WF_SHM_MAGIC);
	cr_assert_eq(h.digest_hi, digest.hi);
	cr_assert_eq(h.digest_lo, digest.lo);
	cr_assert_eq(h.materializer_pid, getpid());
	cr_assert_eq(h.total_size, wf_shm_region_size(a));
	cr_assert_eq(h.total_size, (uint64_t)shmt_file_size(wf_shm_region_path(a)));
	cr_assert_geq(h.ready_ns, h.created_ns);
	cr_assert_eq(h.data_offset % 4096, 0);
	cr_assert_eq((uintptr_t)wf_shm_region_data(a) % 4096, 0);
	struct wf_digest d;
	wf_shm_region_digest(a, &d);
	cr_assert(d.hi == digest.hi && d.lo == digest.lo);

	struct wf_shm_tensor_info ti;
	cr_assert_eq(wf_shm_region_find(a, "blk.1.t3.weight", &ti), 0);
	cr_assert_eq(ti.nbytes, 8192 + 3 * 96);
	cr_assert_eq(ti.file, 1);
	cr_assert_eq(ti.tclass, WF_TENSOR_EXPERT);
	cr_assert_eq((const uint8_t *)ti.data - (const uint8_t *)wf_shm_region_data(a),
	             (ptrdiff_t)ti.floor_offset);
	/* pread of the region fd at floor_offset gives the same bytes (workers' io_uring path) */
	uint8_t buf[64];
	cr_assert_eq(pread(wf_shm_region_fd(a), buf, 64, (off_t)ti.floor_offset), 64);
	cr_assert_eq(memcmp(buf, ti.data, 64), 0);
	cr_assert_eq(wf_shm_region_find(a, "blk.1.t3.weigh", &ti), WF_ENOT_FOUND);
	cr_assert_eq(wf_shm_region_find(a, "blk.1.t3.weightx", &ti), WF_ENOT_FOUND);
	cr_assert_eq(wf_shm_region_find(a, "", &ti), WF_ENOT_FOUND);
	cr_assert_eq(wf_shm_region_tensor(a, 15, &ti), WF_ENOT_FOUND);

	/* a second agent attach and a reader find it READY: no second fill */
	struct wf_shm_region *b = attach(WF_SHM_ATTACH_AGENT);
	cr_assert_not(wf_shm_region_materialized(b));
	struct wf_shm_region *c = attach(WF_SHM_ATTACH_READER);
	cr_assert_eq(fcntl(wf_shm_region_fd(c), F_GETFL) & O_ACCMODE, O_RDONLY);
	cr_assert_eq(shmt_file_size(count_path), 1);
	cr_assert_eq(shmt_check_bytes(c, model, why, sizeof(why)), 0, "%s", why);

	size_t n = 0;
	pid_t pids[8];
	wf_diag_clear(&diag);
	cr_assert_eq(wf_shm_holder_pids(&cfg, &digest, pids, 8, &n, &diag), 0, "%s", diag.msg);
	n = shmt_holders(&cfg, &digest, 3, pids, 8);
	cr_assert_eq(n, 3, "three attachments hold the region");
	for (size_t i = 0; i < n; i++)
		cr_assert_eq(pids[i], getpid());

	bool sole = true;
	cr_assert_eq(wf_shm_region_sole_holder(a, &sole), 0);
	cr_assert_not(sole);
	wf_shm_region_detach(b);
	wf_shm_region_detach(c);
	cr_assert_eq(wf_shm_region_sole_holder(a, &sole), 0);
	cr_assert(sole);
	/* the query left us a holder: another attach and the pid list still see us */
	n = shmt_holders(&cfg, &digest, 1, pids, 8);
	cr_assert_eq(n, 1);
	cr_assert_eq(wf_shm_region_sole_holder(a, &sole), 0);
	cr_assert(sole);
	wf_shm_region_detach(a);
	assert_floor_empty();
	wf_shm_region_detach(NULL);
}

Test(region, reader_and_must_exist_create_nothing, .init = setup, .fini = teardown)
{
	struct wf_shm_region *r = NULL;
	struct wf_diag diag;

	wf_diag_clear(&diag);
	int rc =
	    wf_shm_region_attach(&cfg, &digest, NULL, WF_SHM_ATTACH_READER, NULL, NULL, &r, &diag);
	cr_assert_eq(rc, -ENOENT, "%s", wf_diag_str(&diag, rc));
	cr_assert_not(shmt_exists(floor_dir), "a reader does not create the directory");

	char *up;
	cr_assert(asprintf(&up, "%s/floor", tmp) > 0);
	cr_assert_eq(mkdir(up, 0750), 0);
	cr_assert_eq(mkdir(floor_dir, 0750), 0);
	wf_diag_clear(&diag);
	rc = wf_shm_region_attach(&cfg, &digest, NULL, WF_SHM_ATTACH_READER, NULL, NULL, &r, &diag);
	cr_assert_eq(rc, -ENOENT);
	cr_assert(strstr(diag.msg, "no floor region"), "%s", diag.msg);
	rc = wf_shm_region_attach(&cfg, &digest, model, WF_SHM_ATTACH_MUST_EXIST, shmt_fill, NULL,
	                          &r, NULL);
	cr_assert_eq(rc, -ENOENT);
	assert_floor_empty();

	/* arguments */
	cr_assert_eq(wf_shm_region_attach(&cfg, &digest, NULL, WF_SHM_ATTACH_AGENT, shmt_fill, NULL,
	                                  &r, NULL),
	             WF_EINVAL);
	cr_assert_eq(
	    wf_shm_region_attach(&cfg, &digest, model, WF_SHM_ATTACH_AGENT, NULL, NULL, &r, NULL),
	    WF_EINVAL);
	cr_assert_eq(wf_shm_region_attach(&cfg, &digest, NULL, 0x100, NULL, NULL, &r, NULL),
	             WF_EINVAL);
	assert_floor_empty();
	free(up);
}

Test(region, permissions_and_group, .init = setup, .fini = teardown)
{
	struct stat st;
	mode_t old = umask(077); /* the library must not let the umask decide */
	cfg.set_gid = true;
	cfg.gid = 4242;
	struct wf_shm_region *r = attach(WF_SHM_ATTACH_AGENT);
	umask(old);

	char *region = floor_path(""), *guard = floor_path(".guard"),
	     *holders = floor_path(".holders");
	cr_assert_eq(stat(region, &st), 0);
	cr_assert_eq(st.st_mode & 07777, 0640, "region mode %o", st.st_mode & 07777);
	cr_assert_eq(st.st_gid, 4242);
	cr_assert_eq(stat(guard, &st), 0);
	cr_assert_eq(st.st_mode & 07777, 0660, "guard mode %o", st.st_mode & 07777);
	cr_assert_eq(st.st_gid, 4242);
	cr_assert_eq(stat(holders, &st), 0);
	cr_assert_eq(st.st_mode & 07777, 0660, "holders mode %o", st.st_mode & 07777);
	cr_assert_eq(st.st_gid, 4242);
	cr_assert_eq(stat(floor_dir, &st), 0);
	cr_assert_eq(st.st_mode & 07777, 0750, "directory mode %o", st.st_mode & 07777);
	cr_assert_eq(st.st_gid, 4242);
	wf_shm_region_detach(r);
	assert_floor_empty();

	/* configured modes */
	cfg.set_gid = false;
	cfg.region_mode = 0600;
	cfg.lock_mode = 0600;
	r = attach(WF_SHM_ATTACH_AGENT);
	cr_assert_eq(stat(region, &st), 0);
	cr_assert_eq(st.st_mode & 07777, 0600);
	cr_assert_eq(st.st_gid, getgid());
	cr_assert_eq(stat(guard, &st), 0);
	cr_assert_eq(st.st_mode & 07777, 0600);
	wf_shm_region_detach(r);
	free(region);
	free(guard);
	free(holders);
}

/* Writes into a mapping that must be read-only, in a child: it must die of SIGSEGV. */
static int write_in_child(unsigned flags)
{
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		struct wf_shm_region *r;
		if (wf_shm_region_attach(&cfg, &digest, flags ? model : NULL, flags,
		                         flags ? shmt_fill : NULL, NULL, &r, NULL) != 0)
			_exit(2);
		struct wf_shm_tensor_info ti;
		if (wf_shm_region_tensor(r, 0, &ti) != 0)
			_exit(3);
		/* the default action, not a sanitizer's handler, so the parent sees SIGSEGV */
		signal(SIGSEGV, SIG_DFL);
		*(volatile uint8_t *)ti.data ^= 1;
		_exit(0);
	}
	int status;
	cr_assert_eq(waitpid(pid, &status, 0), pid);
	return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
}

Test(region, mappings_are_read_only, .init = setup, .fini = teardown)
{
	struct wf_shm_region *r = attach(WF_SHM_ATTACH_AGENT);
	cr_assert_eq(write_in_child(WF_SHM_ATTACH_READER), 128 + SIGSEGV, "reader mapping");
	cr_assert_eq(write_in_child(WF_SHM_ATTACH_AGENT), 128 + SIGSEGV, "agent mapping");
	struct wf_diag diag;
	wf_diag_clear(&diag);
	cr_assert_eq(wf_shm_region_verify(r, &diag), 0, "%s", diag.msg);
	wf_shm_region_detach(r);
	assert_floor_empty();
}

Test(region, verify_names_flipped_tensor, .init = setup, .fini = teardown)
{
	struct wf_shm_region *r = attach(WF_SHM_ATTACH_AGENT);
	struct wf_shm_tensor_info ti;
	struct wf_diag diag;
	size_t size;

	cr_assert_eq(wf_shm_region_find(r, "blk.2.t1.weight", &ti), 0);
	uint8_t *rw = shmt_map_rw(&cfg, model, &size);
	cr_assert_not_null(rw);
	rw[ti.floor_offset + ti.nbytes / 2] ^= 0x10;
	wf_diag_clear(&diag);
	int rc = wf_shm_region_verify(r, &diag);
	cr_assert_eq(rc, WF_ECHECKSUM);
	cr_assert(strstr(diag.msg, "'blk.2.t1.weight'"), "diag names the tensor: %s", diag.msg);
	rw[ti.floor_offset + ti.nbytes / 2] ^= 0x10;
	cr_assert_eq(wf_shm_region_verify(r, NULL), 0);
	/* a byte of the section outside any tensor (GGUF header bytes) is not a tensor's */
	rw[wf_shm_region_size(r) - 1] ^= 1;
	cr_assert_eq(wf_shm_region_verify(r, NULL), 0);
	munmap(rw, size);
	wf_shm_region_detach(r);
}

Test(region, fill_failure_leaves_nothing, .init = setup, .fini = teardown)
{
	struct wf_shm_region *r = NULL;
	struct wf_diag diag;

	fill_ctx.fail_with = WF_ECANCELED;
	wf_diag_clear(&diag);
	int rc = wf_shm_region_attach(&cfg, &digest, model, WF_SHM_ATTACH_AGENT, shmt_fill,
	                              &fill_ctx, &r, &diag);
	cr_assert_eq(rc, WF_ECANCELED);
	cr_assert(strstr(diag.msg, "injected"), "%s", diag.msg);
	assert_floor_empty();

	/* a source file touched after the model was read: the fill says WF_ECHANGED */
	fill_ctx.fail_with = 0;
	struct timespec ts[2] = {{0, UTIME_OMIT}, {12345, 0}};
	cr_assert_eq(utimensat(AT_FDCWD, model->files[1].path, ts, 0), 0);
	wf_diag_clear(&diag);
	rc = wf_shm_region_attach(&cfg, &digest, model, WF_SHM_ATTACH_AGENT, shmt_fill, &fill_ctx,
	                          &r, &diag);
	cr_assert_eq(rc, WF_ECHANGED, "%s", wf_diag_str(&diag, rc));
	assert_floor_empty();
}

Test(region, nowait_and_busy_guard, .init = setup, .fini = teardown)
{
	struct wf_shm_region *r = attach(WF_SHM_ATTACH_AGENT);
	char *guard = floor_path(".guard");
	int fd = open(guard, O_RDONLY | O_CLOEXEC);
	cr_assert_geq(fd, 0);
	cr_assert_eq(flock(fd, LOCK_EX), 0);

	struct wf_shm_region *r2 = NULL;
	int rc =
	    wf_shm_region_attach(&cfg, &digest, NULL, WF_SHM_ATTACH_READER | WF_SHM_ATTACH_NOWAIT,
	                         NULL, NULL, &r2, NULL);
	cr_assert_eq(rc, -EAGAIN);

	struct wf_shm_scan_entry *e = NULL;
	size_t n = 0;
	cr_assert_eq(wf_shm_dir_scan(&cfg, &e, &n, NULL), 0);
	cr_assert_eq(n, 1);
	cr_assert_eq(e[0].cls, WF_SHM_SCAN_BUSY);
	free(e);
	cr_assert_eq(wf_shm_region_remove(&cfg, &digest, 0, NULL), -EBUSY);
	close(fd);

	rc = wf_shm_region_attach(&cfg, &digest, NULL, WF_SHM_ATTACH_READER | WF_SHM_ATTACH_NOWAIT,
	                          NULL, NULL, &r2, NULL);
	cr_assert_eq(rc, 0);
	wf_shm_region_detach(r2);
	wf_shm_region_detach(r);
	assert_floor_empty();
	free(guard);
}

Test(region, crashed_agent_leaves_ready_region, .init = setup, .fini = teardown)
{
	cr_assert_eq(shmt_orphan_region(&cfg, model), 0);
	cr_assert_eq(shmt_count_entries(floor_dir, NULL, 0), 3, "region and lock files remain");

	struct wf_shm_scan_entry *e = NULL;
	size_t n = 0;
	cr_assert_eq(wf_shm_dir_scan(&cfg, &e, &n, NULL), 0);
	cr_assert_eq(n, 1);
	cr_assert_eq(e[0].cls, WF_SHM_SCAN_READY);
	cr_assert_not(e[0].held, "the dead agent's lock is gone");
	cr_assert(e[0].has_region && e[0].has_guard && e[0].has_holders);
	cr_assert_eq(e[0].state, WF_SHM_STATE_READY);
	cr_assert_eq(e[0].n_tensors, 15);
	cr_assert(e[0].digest.hi == digest.hi && e[0].digest.lo == digest.lo);
	free(e);

	/* re-adopted without a fill, then removed by its last holder */
	struct wf_shm_region *r = attach(WF_SHM_ATTACH_MUST_EXIST);
	cr_assert_not(wf_shm_region_materialized(r));
	cr_assert_eq(wf_shm_region_verify(r, NULL), 0);
	wf_shm_region_detach(r);
	assert_floor_empty();
}

Test(region, scan_classifies_and_remove, .init = setup, .fini = teardown)
{
	/* READY, held */
	struct wf_shm_region *r = attach(WF_SHM_ATTACH_AGENT);
	/* broken: garbage region file with its lock files */
	struct wf_digest broken = {0x1111, 0x2222}, orphan = {0x3333, 0x4444};
	char path[4096];
	snprintf(path, sizeof(path), "%s/wf-%016x%016x", floor_dir, 0x1111, 0x2222);
	int fd = open(path, O_WRONLY | O_CREAT, 0640);
	cr_assert_eq(write(fd, "garbage", 7), 7);
	close(fd);
	strcat(path, ".guard");
	cr_assert_eq(shmt_touch(path), 0);
	/* orphaned lock files */
	snprintf(path, sizeof(path), "%s/wf-%016x%016x.guard", floor_dir, 0x3333, 0x4444);
	cr_assert_eq(shmt_touch(path), 0);
	snprintf(path, sizeof(path), "%s/wf-%016x%016x.holders", floor_dir, 0x3333, 0x4444);
	cr_assert_eq(shmt_touch(path), 0);
	/* not ours */
	snprintf(path, sizeof(path), "%s/wf-xyz", floor_dir);
	cr_assert_eq(shmt_touch(path), 0);
	snprintf(path, sizeof(path), "%s/wf-%016x%016x.tmp", floor_dir, 0x5, 0x6);
	cr_assert_eq(shmt_touch(path), 0);

	struct wf_shm_scan_entry *e = NULL;
	size_t n = 0;
	cr_assert_eq(wf_shm_dir_scan(&cfg, &e, &n, NULL), 0);
	cr_assert_eq(n, 3);
	int seen = 0;
	for (size_t i = 0; i < n; i++) {
		if (e[i].digest.hi == broken.hi) {
			cr_assert_eq(e[i].cls, WF_SHM_SCAN_BROKEN);
			cr_assert_eq(e[i].error, WF_ETRUNCATED, "%s", e[i].why);
			cr_assert_not(e[i].has_holders);
			seen |= 1;
		} else if (e[i].digest.hi == orphan.hi) {
			cr_assert_eq(e[i].cls, WF_SHM_SCAN_ORPHAN);
			cr_assert_not(e[i].has_region);
			seen |= 2;
		} else {
			cr_assert(e[i].digest.hi == digest.hi && e[i].digest.lo == digest.lo);
			cr_assert_eq(e[i].cls, WF_SHM_SCAN_READY, "%s", e[i].why);
			cr_assert(e[i].held);
			seen |= 4;
		}
	}
	cr_assert_eq(seen, 7);
	for (size_t i = 1; i < n; i++)
		cr_assert(
		    e[i - 1].digest.hi < e[i].digest.hi ||
		    (e[i - 1].digest.hi == e[i].digest.hi && e[i - 1].digest.lo < e[i].digest.lo));
	free(e);

	struct wf_diag diag;
	wf_diag_clear(&diag);
	cr_assert_eq(wf_shm_region_remove(&cfg, &digest, 0, &diag), -EBUSY, "held");
	cr_assert_eq(wf_shm_region_remove(&cfg, &broken, WF_SHM_REMOVE_BROKEN_ONLY, NULL), 0);
	cr_assert_eq(wf_shm_region_remove(&cfg, &orphan, WF_SHM_REMOVE_BROKEN_ONLY, NULL), 0);
	cr_assert_eq(wf_shm_region_remove(&cfg, &orphan, 0, NULL), -ENOENT);
	wf_shm_region_detach(r);

	/* a READY region nobody holds: BROKEN_ONLY refuses, plain remove takes it */
	cr_assert_eq(shmt_orphan_region(&cfg, model), 0);
	cr_assert_eq(wf_shm_region_remove(&cfg, &digest, WF_SHM_REMOVE_BROKEN_ONLY, NULL),
	             WF_ESTATE);
	cr_assert_eq(wf_shm_region_remove(&cfg, &digest, 0, NULL), 0);

	char names[1024];
	cr_assert_eq(shmt_count_entries(floor_dir, names, sizeof(names)), 2, "left: %s", names);
	cr_assert_eq(wf_shm_dir_scan(&cfg, &e, &n, NULL), 0);
	cr_assert_eq(n, 0);
	cr_assert_null(e);

	/* a missing directory is an empty floor */
	cfg.dir = "/nonexistent/weightfloor-test";
	cr_assert_eq(wf_shm_dir_scan(&cfg, &e, &n, NULL), 0);
	cr_assert_eq(n, 0);
}

Test(region, spare_area_and_generation_fields, .init = setup, .fini = teardown)
{
	cfg.spare_bytes = 10000;
	struct wf_shm_region *r = attach(WF_SHM_ATTACH_AGENT);
	struct wf_shm_header h;
	wf_shm_region_header(r, &h);
	cr_assert_eq(h.spare_size, 12288);
	cr_assert_eq(h.spare_used, 0);
	cr_assert_eq(h.spare_offset, h.data_offset + h.data_size);
	cr_assert_eq(h.total_size, h.spare_offset + h.spare_size);
	cr_assert_eq(h.generation, 0);
	for (uint32_t i = 0; i < wf_shm_region_n_tensors(r); i++) {
		struct wf_shm_tensor_info ti;
		cr_assert_eq(wf_shm_region_tensor(r, i, &ti), 0);
		cr_assert_eq(ti.generation, 0);
		cr_assert_lt(ti.floor_offset, h.spare_offset);
	}
	/* a different spare size does not make an existing region a mismatch */
	cfg.spare_bytes = 0;
	struct wf_shm_region *r2 = attach(WF_SHM_ATTACH_AGENT);
	cr_assert_not(wf_shm_region_materialized(r2));
	wf_shm_region_detach(r2);
	wf_shm_region_detach(r);
}
