/* A floor directory that is too small: the attach fails at the start with -ENOSPC (fallocate), not
 * with SIGBUS later, and leaves nothing behind. Needs to mount a small tmpfs: the test runs in a
 * private mount namespace so the mount cannot leak, and is skipped (never passed) where mounting
 * is not permitted. Also a hugetlbfs smoke test, skipped without free huge pages. */
#include "shmtest.h"

#include "base/error.h"
#include "common/wftest.h"
#include "shm/fill.h"
#include "shm/shm_internal.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

static char *tmp, *floor_dir, *model_dir, *count_path;
static bool mounted;

static void setup(void)
{
	tmp = wft_tmpdir("shm-enospc");
	cr_assert(asprintf(&floor_dir, "%s/floor", tmp) > 0);
	cr_assert(asprintf(&model_dir, "%s/model", tmp) > 0);
	cr_assert(asprintf(&count_path, "%s/fills", tmp) > 0);
	cr_assert_eq(mkdir(model_dir, 0755), 0);
	cr_assert_eq(mkdir(floor_dir, 0755), 0);
	mounted = false;
}

static void teardown(void)
{
	if (mounted)
		umount2(floor_dir, MNT_DETACH);
	mounted = false;
	if (tmp)
		wft_rmtree(tmp);
	free(tmp);
	tmp = NULL;
}

/* Criterion does not run .fini after a skip: clean up first. */
#define SKIP(...)                                                                                  \
	do {                                                                                       \
		teardown();                                                                        \
		cr_skip_test(__VA_ARGS__);                                                         \
	} while (0)

/* Mounts fstype with opts on floor_dir in a private mount namespace; skips the test if that is
 * not permitted here. */
static void mount_or_skip(const char *fstype, const char *opts)
{
	if (unshare(CLONE_NEWNS) != 0)
		SKIP("cannot unshare the mount namespace (%s): mounting is not permitted",
		     strerror(errno));
	if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0)
		SKIP("cannot make mounts private: %s", strerror(errno));
	if (mount("none", floor_dir, fstype, 0, opts) != 0)
		SKIP("mount -t %s -o %s not permitted: %s", fstype, opts, strerror(errno));
	mounted = true;
}

Test(enospc, small_tmpfs_fails_at_start, .init = setup, .fini = teardown)
{
	mount_or_skip("tmpfs", "size=4m,mode=0750");

	/* ~8 MiB of tensors in 3 files: cannot fit in 4 MiB */
	struct shmt_spec big = {
	    .n_files = 3, .tensors_per_file = 4, .tensor_bytes = 688128, .seed = 3};
	struct wf_model *m = shmt_model_make(model_dir, &big, true);
	cr_assert_not_null(m);
	struct wf_digest d;
	shmt_digest(m, &d);
	struct wf_shm_config cfg = {.dir = floor_dir};
	struct shmt_fill_ctx fc = {.count_path = count_path};
	struct wf_shm_region *r = NULL;
	struct wf_diag diag;
	wf_diag_clear(&diag);
	int rc = wf_shm_region_attach(&cfg, &d, m, WF_SHM_ATTACH_AGENT, shmt_fill, &fc, &r, &diag);
	cr_assert_eq(rc, -ENOSPC, "%s (%s)", wf_err_name(rc), wf_diag_str(&diag, rc));
	cr_assert(strstr(diag.msg, floor_dir), "diag names the directory: %s", diag.msg);
	cr_assert(strstr(diag.msg, "needs"), "diag gives sizes: %s", diag.msg);
	cr_assert_not(shmt_exists(count_path), "fill never ran");
	char names[1024];
	cr_assert_eq(shmt_count_entries(floor_dir, names, sizeof(names)), 0, "left: %s", names);

	/* the space was given back: a model that fits attaches */
	struct shmt_spec small = {
	    .n_files = 2, .tensors_per_file = 4, .tensor_bytes = 65536, .seed = 4};
	char *small_dir;
	cr_assert(asprintf(&small_dir, "%s/small", tmp) > 0);
	cr_assert_eq(mkdir(small_dir, 0755), 0);
	struct wf_model *sm = shmt_model_make(small_dir, &small, true);
	struct wf_digest sd;
	shmt_digest(sm, &sd);
	wf_diag_clear(&diag);
	rc = wf_shm_region_attach(&cfg, &sd, sm, WF_SHM_ATTACH_AGENT, shmt_fill, &fc, &r, &diag);
	cr_assert_eq(rc, 0, "%s", wf_diag_str(&diag, rc));
	cr_assert_eq(wf_shm_region_verify(r, NULL), 0);

	/* the big one still does not fit beside it, and leaves the small one alone */
	rc = wf_shm_region_attach(&cfg, &d, m, WF_SHM_ATTACH_AGENT, shmt_fill, &fc, &r, NULL);
	cr_assert_eq(rc, -ENOSPC);
	cr_assert_eq(shmt_count_entries(floor_dir, NULL, 0), 3);
	wf_shm_region_detach(r);
	cr_assert_eq(shmt_count_entries(floor_dir, NULL, 0), 0);
	shmt_model_free(sm);
	shmt_model_free(m);
	free(small_dir);
}

static void count_copy(void *ctx, uint64_t total)
{
	(void)total;
	(*(int *)ctx)++;
}

Test(enospc, small_tmpfs_stream_fails_before_reading, .init = setup, .fini = teardown)
{
	mount_or_skip("tmpfs", "size=4m,mode=0750");

	/* WF_SHM_ATTACH_STREAM reserves the data area while the fill reads, but a directory that
	 * plainly cannot hold the region still fails at the start, before a byte is read */
	struct shmt_spec big = {
	    .n_files = 3, .tensors_per_file = 4, .tensor_bytes = 688128, .seed = 3};
	struct wf_model *m = shmt_model_make(model_dir, &big, true);
	cr_assert_not_null(m);
	struct wf_digest d;
	shmt_digest(m, &d);
	struct wf_shm_config cfg = {.dir = floor_dir};
	int copies = 0;
	struct wf_shm_fill_io fi = {.before_copy = count_copy, .before_copy_ctx = &copies};
	struct wf_shm_region *r = NULL;
	struct wf_diag diag;
	wf_diag_clear(&diag);
	int rc = wf_shm_region_attach(&cfg, &d, m, WF_SHM_ATTACH_AGENT | WF_SHM_ATTACH_STREAM,
	                              wf_shm_fill_from_files, &fi, &r, &diag);
	cr_assert_eq(rc, -ENOSPC, "%s (%s)", wf_err_name(rc), wf_diag_str(&diag, rc));
	cr_assert(strstr(diag.msg, floor_dir), "diag names the directory: %s", diag.msg);
	cr_assert(strstr(diag.msg, "needs"), "diag gives sizes: %s", diag.msg);
	cr_assert_eq(copies, 0, "nothing was read");
	char names[1024];
	cr_assert_eq(shmt_count_entries(floor_dir, names, sizeof(names)), 0, "left: %s", names);

	/* and a model that fits streams in */
	struct shmt_spec small = {
	    .n_files = 2, .tensors_per_file = 4, .tensor_bytes = 65536, .seed = 4};
	char *small_dir;
	cr_assert(asprintf(&small_dir, "%s/small", tmp) > 0);
	cr_assert_eq(mkdir(small_dir, 0755), 0);
	struct wf_model *sm = shmt_model_make(small_dir, &small, true);
	struct wf_digest sd;
	shmt_digest(sm, &sd);
	wf_diag_clear(&diag);
	rc = wf_shm_region_attach(&cfg, &sd, sm, WF_SHM_ATTACH_AGENT | WF_SHM_ATTACH_STREAM,
	                          wf_shm_fill_from_files, &fi, &r, &diag);
	cr_assert_eq(rc, 0, "%s", wf_diag_str(&diag, rc));
	cr_assert_eq(copies, 1);
	cr_assert_eq(wf_shm_region_verify(r, NULL), 0);
	char why[256];
	cr_assert_eq(shmt_check_bytes(r, sm, why, sizeof(why)), 0, "%s", why);
	wf_shm_region_detach(r);
	cr_assert_eq(shmt_count_entries(floor_dir, NULL, 0), 0);
	shmt_model_free(sm);
	shmt_model_free(m);
	free(small_dir);
}

/* The directory fills up while a STREAM fill runs (simulated: the reservation helper fails at a
 * chosen offset). The fill, waiting for that range, fails; or, when only the spare area is left
 * to reserve, the attach fails after the fill. Either way -ENOSPC, the usual diag, nothing left,
 * and no byte was ever written outside reserved space (no SIGBUS: the fill writes with pwrite). */
Test(enospc, stream_reservation_fails_midway, .init = setup, .fini = teardown)
{
	struct shmt_spec spec = {
	    .n_files = 2, .tensors_per_file = 4, .tensor_bytes = 200000 & ~31, .seed = 7};
	struct wf_model *m = shmt_model_make(model_dir, &spec, true);
	cr_assert_not_null(m);
	struct wf_digest d;
	shmt_digest(m, &d);
	struct wf_shm_config cfg = {.dir = floor_dir, .spare_bytes = 1 << 20};
	struct wf_shm_layout l;
	cr_assert_eq(wf_shm_layout_compute(m, cfg.spare_bytes, &l, NULL), 0);
	const uint64_t at[] = {l.data_offset, l.data_offset + 3 * 65536, l.spare_offset,
	                       l.spare_offset + 4096};
	for (size_t i = 0; i < sizeof(at) / sizeof(at[0]); i++) {
		wf__shm_set_reserve_fault(at[i], -ENOSPC);
		struct wf_shm_fill_io fi = {.io = {.chunk_size = 65536, .flags = WF_IO_OPT_NO_ENV}};
		struct wf_shm_region *r = NULL;
		struct wf_diag diag;
		wf_diag_clear(&diag);
		int rc =
		    wf_shm_region_attach(&cfg, &d, m, WF_SHM_ATTACH_AGENT | WF_SHM_ATTACH_STREAM,
		                         wf_shm_fill_from_files, &fi, &r, &diag);
		cr_assert_eq(rc, -ENOSPC, "fault at %llu: %s (%s)", (unsigned long long)at[i],
		             wf_err_name(rc), wf_diag_str(&diag, rc));
		cr_assert(strstr(diag.msg, "needs"), "diag gives sizes: %s", diag.msg);
		char names[1024];
		cr_assert_eq(shmt_count_entries(floor_dir, names, sizeof(names)), 0, "left: %s",
		             names);
	}
	/* without the fault it works, in the same directory */
	wf__shm_set_reserve_fault(UINT64_MAX, 0);
	struct wf_shm_fill_io fi = {0};
	struct wf_shm_region *r = NULL;
	cr_assert_eq(wf_shm_region_attach(&cfg, &d, m, WF_SHM_ATTACH_AGENT | WF_SHM_ATTACH_STREAM,
	                                  wf_shm_fill_from_files, &fi, &r, NULL),
	             0);
	cr_assert_eq(wf_shm_region_verify(r, NULL), 0);
	wf_shm_region_detach(r);
	shmt_model_free(m);
}

static long free_huge_pages(long *ret_size_kb)
{
	FILE *f = fopen("/proc/meminfo", "re");
	char line[256];
	long free_pages = 0;
	*ret_size_kb = 0;
	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f)) {
		sscanf(line, "HugePages_Free: %ld", &free_pages);
		sscanf(line, "Hugepagesize: %ld kB", ret_size_kb);
	}
	fclose(f);
	return free_pages;
}

Test(enospc, hugetlbfs_region, .init = setup, .fini = teardown)
{
	long kb;
	long pages = free_huge_pages(&kb);
	if (pages < 4)
		SKIP("hugetlbfs: %ld free huge pages (need 4)", pages);
	char opts[64];
	snprintf(opts, sizeof(opts), "mode=0750,size=%ldk", 4 * kb); /* 4 huge pages at most */
	mount_or_skip("hugetlbfs", opts);

	struct shmt_spec spec = {
	    .n_files = 2, .tensors_per_file = 3, .tensor_bytes = 100000 & ~31, .seed = 5};
	struct wf_model *m = shmt_model_make(model_dir, &spec, true);
	struct wf_digest d;
	shmt_digest(m, &d);
	struct wf_shm_config cfg = {.dir = floor_dir};
	struct wf_shm_region *r = NULL;
	struct wf_diag diag;
	wf_diag_clear(&diag);
	int rc = wf_shm_region_attach(&cfg, &d, m, WF_SHM_ATTACH_AGENT, shmt_fill, NULL, &r, &diag);
	cr_assert_eq(rc, 0, "%s", wf_diag_str(&diag, rc));
	struct wf_shm_header h;
	wf_shm_region_header(r, &h);
	cr_assert(h.flags & WF_SHM_HDR_HUGETLB);
	cr_assert_eq(h.page_size, (uint64_t)kb * 1024);
	cr_assert_eq(h.total_size % h.page_size, 0);
	cr_assert_eq(wf_shm_region_verify(r, NULL), 0);
	char why[256];
	cr_assert_eq(shmt_check_bytes(r, m, why, sizeof(why)), 0, "%s", why);
	struct wf_shm_region *r2 = NULL;
	rc = wf_shm_region_attach(&cfg, &d, NULL, WF_SHM_ATTACH_READER, NULL, NULL, &r2, NULL);
	cr_assert_eq(rc, 0);
	wf_shm_region_detach(r2);

	/* the standard fill reads straight into the mapping here (no write() on hugetlbfs); STREAM
	 * is ignored: everything is reserved first */
	char *other_dir;
	cr_assert(asprintf(&other_dir, "%s/other", tmp) > 0);
	cr_assert_eq(mkdir(other_dir, 0755), 0);
	struct shmt_spec ospec = {
	    .n_files = 2, .tensors_per_file = 3, .tensor_bytes = 50016, .seed = 8};
	struct wf_model *om = shmt_model_make(other_dir, &ospec, true);
	struct wf_digest od;
	shmt_digest(om, &od);
	struct wf_shm_fill_io fi = {0};
	wf_diag_clear(&diag);
	rc = wf_shm_region_attach(&cfg, &od, om, WF_SHM_ATTACH_AGENT | WF_SHM_ATTACH_STREAM,
	                          wf_shm_fill_from_files, &fi, &r2, &diag);
	cr_assert_eq(rc, 0, "%s", wf_diag_str(&diag, rc));
	cr_assert_eq(wf_shm_region_verify(r2, NULL), 0);
	cr_assert_eq(shmt_check_bytes(r2, om, why, sizeof(why)), 0, "%s", why);
	wf_shm_region_detach(r2);
	shmt_model_free(om);
	free(other_dir);

	/* more than the mount's 4 huge pages: ENOSPC at the start here too */
	char *big_dir;
	cr_assert(asprintf(&big_dir, "%s/big", tmp) > 0);
	cr_assert_eq(mkdir(big_dir, 0755), 0);
	struct shmt_spec big = {
	    .n_files = 1, .tensors_per_file = 4, .tensor_bytes = (uint64_t)kb * 1024, .seed = 6};
	struct wf_model *bm = shmt_model_make(big_dir, &big, true);
	struct wf_digest bd;
	shmt_digest(bm, &bd);
	wf_diag_clear(&diag);
	rc = wf_shm_region_attach(&cfg, &bd, bm, WF_SHM_ATTACH_AGENT, shmt_fill, NULL, &r2, &diag);
	cr_assert_eq(rc, -ENOSPC, "%s (%s)", wf_err_name(rc), wf_diag_str(&diag, rc));
	cr_assert_eq(shmt_count_entries(floor_dir, NULL, 0), 3, "only the first region's files");
	wf_shm_region_detach(r);
	cr_assert_eq(shmt_count_entries(floor_dir, NULL, 0), 0);
	shmt_model_free(bm);
	shmt_model_free(m);
	free(big_dir);
}
