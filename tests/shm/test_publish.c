/* Publishing new tensor versions (shm/layout.h "Generations", wf_shm_region_publish()): readers
 * see the new bytes, checksum and generation; old bytes stay in place; readers in other threads
 * and processes never see a torn entry; refused publishes change nothing; a publisher killed in
 * the seqlock window leaves a region every attacher treats as broken. */
#include "shmtest.h"

#include "base/error.h"
#include "common/wftest.h"
#include "shm/shm_internal.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char *tmp, *floor_dir, *model_dir;
static struct wf_shm_config cfg;
static struct wf_model *model;
static struct wf_digest digest;
static struct shmt_fill_ctx fill_ctx;

static void setup(void)
{
	tmp = wft_tmpdir("shm-publish");
	cr_assert(asprintf(&floor_dir, "%s/floor", tmp) > 0);
	cr_assert(asprintf(&model_dir, "%s/model", tmp) > 0);
	cr_assert_eq(mkdir(model_dir, 0755), 0);
	struct shmt_spec spec = {
	    .n_files = 2, .tensors_per_file = 4, .tensor_bytes = 8192, .seed = 11};
	model = shmt_model_make(model_dir, &spec, true);
	cr_assert_not_null(model);
	shmt_digest(model, &digest);
	memset(&cfg, 0, sizeof(cfg));
	cfg.dir = floor_dir;
	cfg.spare_bytes = 1 << 20;
	fill_ctx = (struct shmt_fill_ctx){0};
}

static void teardown(void)
{
	wf__shm_set_publish_hook(NULL, NULL);
	shmt_model_free(model);
	wft_rmtree(tmp);
}

static struct wf_shm_region *attach(unsigned flags)
{
	struct wf_shm_region *r = NULL;
	struct wf_diag diag;
	wf_diag_clear(&diag);
	bool writer = flags & (WF_SHM_ATTACH_CREATE | WF_SHM_ATTACH_REBUILD);
	int rc = wf_shm_region_attach(&cfg, &digest, writer ? model : NULL, flags,
	                              writer ? shmt_fill : NULL, &fill_ctx, &r, &diag);
	cr_assert_eq(rc, 0, "attach: %s", wf_diag_str(&diag, rc));
	return r;
}

static struct wf_shm_tensor_info info(const struct wf_shm_region *r, uint32_t i)
{
	struct wf_shm_tensor_info ti;
	int rc = wf_shm_region_tensor(r, i, &ti);
	cr_assert_eq(rc, 0, "tensor %u: %s", i, wf_strerror(rc));
	return ti;
}

/* New contents for tensor i of r: every byte `fill`. */
static struct wf_shm_publish_tensor version(const struct wf_shm_region *r, uint32_t i, uint8_t fill,
                                            uint8_t **ret_buf)
{
	struct wf_shm_tensor_info ti = info(r, i);
	uint8_t *buf = malloc(ti.nbytes);
	cr_assert_not_null(buf);
	memset(buf, fill, ti.nbytes);
	*ret_buf = buf;
	return (struct wf_shm_publish_tensor){
	    .index = i, .dtype = ti.dtype, .nbytes = ti.nbytes, .data = buf};
}

static uint64_t publish_ok(struct wf_shm_region *r, const struct wf_shm_publish_tensor *t,
                           uint32_t n)
{
	struct wf_diag diag;
	uint64_t g = 0;
	wf_diag_clear(&diag);
	int rc = wf_shm_region_publish(r, t, n, 0, &g, &diag);
	cr_assert_eq(rc, 0, "publish: %s", wf_diag_str(&diag, rc));
	return g;
}

static void verify_ok(const struct wf_shm_region *r)
{
	struct wf_diag diag;
	wf_diag_clear(&diag);
	int rc = wf_shm_region_verify(r, &diag);
	cr_assert_eq(rc, 0, "verify: %s", wf_diag_str(&diag, rc));
}

Test(publish, readers_see_one_new_generation_and_old_bytes_stay, .init = setup, .fini = teardown)
{
	struct wf_shm_region *a = attach(WF_SHM_ATTACH_AGENT);
	struct wf_shm_region *rd = attach(WF_SHM_ATTACH_READER);
	const uint32_t n = wf_shm_region_n_tensors(a);

	/* an upload that started from generation 0 holds these */
	struct wf_shm_tensor_info old1 = info(rd, 1), old5 = info(rd, 5);
	uint8_t *copy1 = malloc(old1.nbytes);
	memcpy(copy1, old1.data, old1.nbytes);

	uint8_t *b1, *b5;
	struct wf_shm_publish_tensor t[2] = {version(a, 1, 0xa1, &b1), version(a, 5, 0xa5, &b5)};
	uint64_t g = publish_ok(a, t, 2);
	cr_assert_eq(g, 2, "one publish is one generation: 0 -> 2");
	cr_assert_eq(wf_shm_region_generation(rd), 2);

	for (uint32_t i = 0; i < n; i++) {
		struct wf_shm_tensor_info ti = info(rd, i);
		struct wf_shm_header h;
		wf_shm_region_header(rd, &h);
		if (i == 1 || i == 5) {
			const uint8_t *want = i == 1 ? b1 : b5;
			cr_assert_eq(ti.generation, 2);
			cr_assert_eq(memcmp(ti.data, want, ti.nbytes), 0, "tensor %u bytes", i);
			cr_assert_eq(ti.checksum, wf_shm_checksum(want, ti.nbytes));
			cr_assert_geq(ti.floor_offset, h.spare_offset);
			cr_assert_eq((ti.floor_offset - h.spare_offset) % WF_SHM_SPARE_ALIGN, 0);
			cr_assert_eq(ti.nbytes, (i == 1 ? old1 : old5).nbytes);
		} else {
			cr_assert_eq(ti.generation, 0, "tensor %u was not published", i);
			cr_assert_lt(ti.floor_offset, h.spare_offset);
		}
	}
	/* the old versions are intact where they were */
	cr_assert_eq(memcmp(old1.data, copy1, old1.nbytes), 0);
	cr_assert_eq(wf_shm_checksum(old1.data, old1.nbytes), old1.checksum);
	cr_assert_eq(wf_shm_checksum(old5.data, old5.nbytes), old5.checksum);
	verify_ok(a);
	verify_ok(rd);

	uint64_t size = 0, used = 0;
	wf_shm_region_spare(rd, &size, &used);
	cr_assert_eq(size, 1 << 20);
	cr_assert_eq(used, ((old1.nbytes + 63) & ~63ull) + old5.nbytes);

	/* a fresh attacher validates the published region (checksums rewritten) and finds it */
	struct wf_shm_region *fresh = attach(WF_SHM_ATTACH_READER);
	cr_assert_eq(info(fresh, 5).generation, 2);
	cr_assert_eq(memcmp(info(fresh, 5).data, b5, old5.nbytes), 0);
	wf_shm_region_detach(fresh);

	/* and the agent's adoption (every tensor re-hashed) accepts it without a rebuild */
	struct wf_shm_region *adopt = attach(WF_SHM_ATTACH_MUST_EXIST | WF_SHM_ATTACH_VERIFY);
	cr_assert_not(wf_shm_region_materialized(adopt));
	wf_shm_region_detach(adopt);

	/* a second publish of one of them: generation 4, the first version stays in place too */
	struct wf_shm_tensor_info v1 = info(rd, 1);
	uint8_t *b1b;
	struct wf_shm_publish_tensor t2 = version(a, 1, 0xb1, &b1b);
	cr_assert_eq(publish_ok(a, &t2, 1), 4);
	cr_assert_eq(info(rd, 1).generation, 4);
	cr_assert_eq(info(rd, 5).generation, 2);
	cr_assert_eq(memcmp(info(rd, 1).data, b1b, v1.nbytes), 0);
	cr_assert_eq(memcmp(v1.data, b1, v1.nbytes), 0, "generation 2's bytes were overwritten");
	verify_ok(rd);

	free(copy1);
	free(b1);
	free(b5);
	free(b1b);
	wf_shm_region_detach(rd);
	wf_shm_region_detach(a);
}

/* A tensor that returns to its bytes from the file goes back to them (its file's section), and
 * a version equal to the bytes it has now stays where they are: an A, B, A, B, ... oscillation
 * takes the spare room of one B a cycle, never of an A, and a repeat takes none. */
Test(publish, original_bytes_return_to_their_place, .init = setup, .fini = teardown)
{
	struct wf_shm_region *a = attach(WF_SHM_ATTACH_AGENT);
	struct wf_shm_region *rd = attach(WF_SHM_ATTACH_READER);
	const struct wf_shm_tensor_info orig = info(rd, 2);
	uint8_t *ab = malloc(orig.nbytes);
	memcpy(ab, orig.data, orig.nbytes);
	struct wf_shm_publish_tensor back = {
	    .index = 2, .dtype = orig.dtype, .nbytes = orig.nbytes, .data = ab};
	uint64_t size = 0, used = 0, used_before = 0;
	for (int cycle = 0; cycle < 3; cycle++) {
		uint8_t *bb;
		struct wf_shm_publish_tensor t = version(a, 2, (uint8_t)(0x40 + cycle), &bb);
		publish_ok(a, &t, 1);
		const struct wf_shm_tensor_info vb = info(rd, 2);
		wf_shm_region_spare(rd, &size, &used);
		cr_assert_gt(used, used_before, "cycle %d: B took no room", cycle);
		used_before = used;
		/* the same bytes again: where they are, no room */
		uint64_t g = publish_ok(a, &t, 1);
		wf_shm_region_spare(rd, &size, &used);
		cr_assert_eq(used, used_before, "cycle %d: a repeat took room", cycle);
		cr_assert_eq(info(rd, 2).floor_offset, vb.floor_offset);
		cr_assert_eq(info(rd, 2).generation, g);
		/* back to the file's bytes: their place, no room, B's bytes intact for its readers
		 */
		g = publish_ok(a, &back, 1);
		const struct wf_shm_tensor_info va = info(rd, 2);
		wf_shm_region_spare(rd, &size, &used);
		cr_assert_eq(used, used_before, "cycle %d: A took room", cycle);
		cr_assert_eq(va.floor_offset, orig.floor_offset);
		cr_assert_eq(va.generation, g);
		cr_assert_eq(va.checksum, orig.checksum);
		cr_assert_eq(memcmp(vb.data, bb, vb.nbytes), 0, "B's bytes were overwritten");
		verify_ok(rd);
		free(bb);
	}
	/* a fresh attacher accepts entries that point back into a file's section */
	struct wf_shm_region *fresh = attach(WF_SHM_ATTACH_MUST_EXIST | WF_SHM_ATTACH_VERIFY);
	cr_assert_not(wf_shm_region_materialized(fresh));
	wf_shm_region_detach(fresh);
	free(ab);
	wf_shm_region_detach(rd);
	wf_shm_region_detach(a);
}

Test(publish, write_attachment_publishes_reader_cannot, .init = setup, .fini = teardown)
{
	struct wf_shm_region *a = attach(WF_SHM_ATTACH_AGENT);
	struct wf_shm_region *w = attach(WF_SHM_ATTACH_WRITE | WF_SHM_ATTACH_OWNED);
	cr_assert_not(wf_shm_region_materialized(w));
	cr_assert_eq(fcntl(wf_shm_region_fd(w), F_GETFL) & O_ACCMODE, O_RDWR);
	struct wf_shm_region *rd = attach(WF_SHM_ATTACH_READER);

	uint8_t *b;
	struct wf_shm_publish_tensor t = version(w, 2, 0x5a, &b);
	struct wf_diag diag;
	uint64_t g = 77;
	wf_diag_clear(&diag);
	cr_assert_eq(wf_shm_region_publish(rd, &t, 1, 0, &g, &diag), WF_EPERMISSION);
	cr_assert(strstr(diag.msg, "read-only"), "%s", diag.msg);
	cr_assert_eq(g, 77, "ret_generation written on failure");
	cr_assert_eq(wf_shm_region_generation(rd), 0);

	cr_assert_eq(publish_ok(w, &t, 1), 2);
	cr_assert_eq(memcmp(info(rd, 2).data, b, t.nbytes), 0);
	verify_ok(rd);
	/* the WRITE attachment's mapping stays read-only like everyone's (only the publish maps
	 * a writable view, for its own length) */
	cr_assert_eq(wf_shm_region_generation(w), 2);

	/* WRITE alone creates nothing */
	wf_shm_region_detach(rd);
	wf_shm_region_detach(w);
	wf_shm_region_detach(a);
	struct wf_shm_region *none = NULL;
	cr_assert_eq(
	    wf_shm_region_attach(&cfg, &digest, NULL, WF_SHM_ATTACH_WRITE, NULL, NULL, &none, NULL),
	    -ENOENT);
	free(b);
}

/* Every refusal leaves the region as it was: generation, spare use, entries. */
static void expect_refused(struct wf_shm_region *r, const struct wf_shm_publish_tensor *t,
                           uint32_t n, int want, const char *needle)
{
	struct wf_diag diag;
	uint64_t g = 77, size0, used0, size1, used1;
	uint64_t gen0 = wf_shm_region_generation(r);
	wf_shm_region_spare(r, &size0, &used0);
	wf_diag_clear(&diag);
	int rc = wf_shm_region_publish(r, t, n, 0, &g, &diag);
	cr_assert_eq(rc, want, "publish: %s, want %s (%s)", wf_strerror(rc), wf_strerror(want),
	             diag.msg);
	cr_assert(!needle || strstr(diag.msg, needle), "'%s' not in: %s", needle, diag.msg);
	cr_assert_eq(g, 77);
	cr_assert_eq(wf_shm_region_generation(r), gen0);
	wf_shm_region_spare(r, &size1, &used1);
	cr_assert_eq(used1, used0, "spare_used moved");
	verify_ok(r);
}

Test(publish, bad_input_changes_nothing, .init = setup, .fini = teardown)
{
	struct wf_shm_region *a = attach(WF_SHM_ATTACH_AGENT);
	const uint32_t n = wf_shm_region_n_tensors(a);
	uint8_t *b0, *b3;
	struct wf_shm_publish_tensor t0 = version(a, 0, 1, &b0), t3 = version(a, 3, 3, &b3);

	uint64_t g;
	cr_assert_eq(wf_shm_region_publish(a, &t0, 0, 0, &g, NULL), WF_EINVAL, "no tensors");
	cr_assert_eq(wf_shm_region_publish(a, NULL, 1, 0, &g, NULL), WF_EINVAL);
	cr_assert_eq(wf_shm_region_publish(NULL, &t0, 1, 0, &g, NULL), WF_EINVAL);

	struct wf_shm_publish_tensor bad = t0;
	bad.index = n;
	expect_refused(a, &bad, 1, WF_ENOT_FOUND, "index");
	struct wf_shm_publish_tensor dup[3] = {t0, t3, t0};
	expect_refused(a, dup, 3, WF_EDUPLICATE, "twice");
	bad = t3;
	bad.nbytes -= 1;
	/* the good one first: nothing of it may land either */
	struct wf_shm_publish_tensor pair[2] = {t0, bad};
	expect_refused(a, pair, 2, WF_EINVAL, "keeps the size");
	bad = t3;
	bad.dtype = bad.dtype == WF_DTYPE_F16 ? WF_DTYPE_F32 : WF_DTYPE_F16;
	expect_refused(a, &bad, 1, WF_EINVAL, "type");
	bad = t3;
	bad.data = NULL;
	expect_refused(a, &bad, 1, WF_EINVAL, "no data");

	/* a dry run checks and writes nothing; it needs no bytes */
	struct wf_shm_publish_tensor sizes[2] = {t0, t3};
	sizes[0].data = sizes[1].data = NULL;
	cr_assert_eq(wf_shm_region_publish(a, sizes, 2, WF_SHM_PUBLISH_DRY_RUN, &g, NULL), 0);
	cr_assert_eq(g, 0, "a dry run answers the current generation");
	cr_assert_eq(wf_shm_region_generation(a), 0);
	cr_assert_eq(info(a, 0).generation, 0);
	struct wf_shm_publish_tensor dry_bad = bad;
	dry_bad.dtype = t3.dtype;
	dry_bad.nbytes += 1;
	cr_assert_eq(wf_shm_region_publish(a, &dry_bad, 1, WF_SHM_PUBLISH_DRY_RUN, &g, NULL),
	             WF_EINVAL);
	cr_assert_eq(wf_shm_region_publish(a, &t0, 1, 0x80, &g, NULL), WF_EINVAL, "flags");

	/* after all that, a good publish is generation 2 */
	cr_assert_eq(publish_ok(a, pair, 1), 2);
	free(b0);
	free(b3);
	wf_shm_region_detach(a);
}

Test(publish, spare_exhausted, .init = setup, .fini = teardown)
{
	cfg.spare_bytes = 20000; /* 20480: two 8 KiB versions fit, with alignment, a third not */
	struct wf_shm_region *a = attach(WF_SHM_ATTACH_AGENT);
	uint8_t *b0, *b1, *b4;
	struct wf_shm_publish_tensor t0 = version(a, 0, 1, &b0), t1 = version(a, 1, 2, &b1),
	                             t4 = version(a, 4, 4, &b4);
	cr_assert_eq(publish_ok(a, &t0, 1), 2);
	struct wf_shm_publish_tensor both[2] = {t1, t4};
	expect_refused(a, both, 2, WF_ENO_SPACE, "spare area is exhausted");
	cr_assert_eq(info(a, 1).generation, 0, "part of a refused publish landed");
	cr_assert_eq(publish_ok(a, &t1, 1), 4);
	expect_refused(a, &t4, 1, WF_ENO_SPACE, "spare");
	uint64_t g = 0;
	cr_assert_eq(wf_shm_region_publish(a, &t4, 1, WF_SHM_PUBLISH_DRY_RUN, &g, NULL),
	             WF_ENO_SPACE, "a dry run sees the room too");

	/* a region made without a spare area refuses every publish */
	struct wf_shm_region *rd = attach(WF_SHM_ATTACH_READER);
	wf_shm_region_detach(rd);
	free(b0);
	free(b1);
	free(b4);
	wf_shm_region_detach(a);
	cfg.spare_bytes = 0;
	a = attach(WF_SHM_ATTACH_AGENT);
	t0 = version(a, 0, 9, &b0);
	expect_refused(a, &t0, 1, WF_ENO_SPACE, "0 free");
	free(b0);
	wf_shm_region_detach(a);
}

/* ---- readers racing a publisher ----------------------------------------------------------- */

#define RACE_TENSOR   3
#define RACE_VERSIONS 400

/* One read: the entry is whole when its checksum is the hash of the bytes it points at, its
 * bytes are one version (all bytes equal), and generations never go back. 0 or a reason. */
static const char *check_read(const struct wf_shm_region *r, uint64_t *last_gen)
{
	struct wf_shm_tensor_info ti;
	if (wf_shm_region_tensor(r, RACE_TENSOR, &ti) != 0)
		return "tensor read failed";
	if (ti.generation < *last_gen)
		return "generation went back";
	*last_gen = ti.generation;
	if (wf_shm_checksum(ti.data, ti.nbytes) != ti.checksum)
		return "torn entry: checksum does not match the bytes it points at";
	if (ti.generation) {
		const uint8_t *p = ti.data;
		for (uint64_t k = 1; k < ti.nbytes; k++)
			if (p[k] != p[0])
				return "mixed bytes in one version";
	}
	return NULL;
}

struct race {
	struct wf_shm_region *r;
	atomic_bool stop;
	atomic_ulong reads;
	const char *why;
};

static void *reader_thread(void *arg)
{
	struct race *rc = arg;
	uint64_t last = 0;
	while (!atomic_load(&rc->stop)) {
		const char *why = check_read(rc->r, &last);
		if (why) {
			rc->why = why;
			break;
		}
		atomic_fetch_add(&rc->reads, 1);
	}
	return NULL;
}

Test(publish, concurrent_readers_never_see_a_torn_entry, .init = setup, .fini = teardown,
     .timeout = 120)
{
	cfg.spare_bytes = 4u << 20; /* RACE_VERSIONS versions of ~8.5 KB */
	struct wf_shm_region *a = attach(WF_SHM_ATTACH_AGENT);
	char *stop_path;
	cr_assert(asprintf(&stop_path, "%s/stop", tmp) > 0);

	/* a reader in another process (its own attachment; shm only, no nng in it) */
	pid_t child = fork();
	cr_assert_geq(child, 0);
	if (child == 0) {
		struct wf_shm_region *r = NULL;
		if (wf_shm_region_attach(&cfg, &digest, NULL, WF_SHM_ATTACH_READER, NULL, NULL, &r,
		                         NULL) != 0)
			_exit(2);
		uint64_t last = 0, reads = 0;
		while (!shmt_exists(stop_path) || reads < 1000) {
			const char *why = check_read(r, &last);
			if (why) {
				fprintf(stderr, "child reader: %s\n", why);
				_exit(3);
			}
			reads++;
		}
		/* every publish was done before the stop file: this read sees the last one */
		if (check_read(r, &last))
			_exit(3);
		_exit(last == 2 * RACE_VERSIONS ? 0 : 4);
	}

	struct race rc = {.r = attach(WF_SHM_ATTACH_READER)};
	atomic_init(&rc.stop, false);
	atomic_init(&rc.reads, 0);
	pthread_t th[2];
	for (int i = 0; i < 2; i++)
		cr_assert_eq(pthread_create(&th[i], NULL, reader_thread, &rc), 0);
	for (uint32_t v = 1; v <= RACE_VERSIONS && !rc.why; v++) {
		uint8_t *b;
		struct wf_shm_publish_tensor t = version(a, RACE_TENSOR, (uint8_t)v, &b);
		cr_assert_eq(publish_ok(a, &t, 1), 2 * (uint64_t)v);
		free(b);
	}
	atomic_store(&rc.stop, true);
	for (int i = 0; i < 2; i++)
		pthread_join(th[i], NULL);
	cr_assert_null(rc.why, "reader thread: %s", rc.why);
	cr_assert_gt(atomic_load(&rc.reads), 0);
	cr_assert_eq(shmt_touch(stop_path), 0);
	int st = shmt_wait(child, 60);
	cr_assert_eq(st, 0, "child reader exited %d", st);
	verify_ok(rc.r);
	wf_shm_region_detach(rc.r);
	wf_shm_region_detach(a);
	free(stop_path);
}

/* ---- a publisher killed in the seqlock window ---------------------------------------------- */

static void die(void *arg)
{
	(void)arg;
	raise(SIGKILL);
}

Test(publish, killed_publisher_leaves_a_region_attachers_rebuild, .init = setup, .fini = teardown)
{
	/* made and left READY with no holder (a keep marker would do the same) */
	cr_assert_eq(shmt_orphan_region(&cfg, model), 0);
	pid_t child = fork();
	cr_assert_geq(child, 0);
	if (child == 0) {
		struct wf_shm_region *w = NULL;
		if (wf_shm_region_attach(&cfg, &digest, NULL, WF_SHM_ATTACH_WRITE, NULL, NULL, &w,
		                         NULL) != 0)
			_exit(2);
		struct wf_shm_tensor_info ti;
		if (wf_shm_region_tensor(w, 2, &ti) != 0)
			_exit(3);
		uint8_t *b = malloc(ti.nbytes);
		memset(b, 0xee, ti.nbytes);
		struct wf_shm_publish_tensor t = {
		    .index = 2, .dtype = ti.dtype, .nbytes = ti.nbytes, .data = b};
		wf__shm_set_publish_hook(die, NULL);
		uint64_t g;
		wf_shm_region_publish(w, &t, 1, 0, &g, NULL);
		_exit(4); /* the hook kills us first */
	}
	int st = shmt_wait(child, 30);
	cr_assert_eq(st, 128 + SIGKILL, "the publisher was not killed in its window: %d", st);

	/* a reader refuses it, saying why */
	struct wf_shm_region *r = NULL;
	struct wf_diag diag;
	wf_diag_clear(&diag);
	int rc =
	    wf_shm_region_attach(&cfg, &digest, NULL, WF_SHM_ATTACH_READER, NULL, NULL, &r, &diag);
	cr_assert_eq(rc, WF_ENOT_READY, "reader attach: %s (%s)", wf_strerror(rc), diag.msg);
	cr_assert(strstr(diag.msg, "publish never finished"), "%s", diag.msg);

	/* the scan calls it broken */
	struct wf_shm_scan_entry *e = NULL;
	size_t n = 0;
	cr_assert_eq(wf_shm_dir_scan(&cfg, &e, &n, NULL), 0);
	cr_assert_eq(n, 1);
	cr_assert_eq(e[0].cls, WF_SHM_SCAN_BROKEN, "scan class %d", e[0].cls);
	cr_assert_eq(e[0].generation % 2, 1);
	free(e);

	/* the agent's attach rebuilds it from the files: generation 0, the files' bytes */
	fill_ctx = (struct shmt_fill_ctx){0};
	struct wf_shm_region *a = attach(WF_SHM_ATTACH_AGENT | WF_SHM_ATTACH_OWNED);
	cr_assert(wf_shm_region_materialized(a));
	cr_assert_not_null(wf_shm_region_rebuild_reason(a));
	cr_assert(strstr(wf_shm_region_rebuild_reason(a), "odd"), "%s",
	          wf_shm_region_rebuild_reason(a));
	cr_assert_eq(wf_shm_region_generation(a), 0);
	char why[256];
	cr_assert_eq(shmt_check_bytes(a, model, why, sizeof why), 0, "%s", why);
	verify_ok(a);
	wf_shm_region_detach(a);
}
