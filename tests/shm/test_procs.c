/* Many processes on one floor (tests/shm/shm_helper.c does the attaching): a 16-way race to
 * materialize, a materializer SIGKILLed at random points while a reader keeps attaching, and
 * attach/detach loops that must leave an empty directory. Each test has its own floor dir. */
#include "shmtest.h"

#include "base/error.h"
#include "common/wftest.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static char *tmp, *floor_dir, *model_dir, *helper;
static struct wf_shm_config cfg;
static struct wf_model *model;
static struct wf_digest digest;
static struct shmt_spec spec = {
    .n_files = 3, .tensors_per_file = 8, .tensor_bytes = 16384, .seed = 21};
static char a_n[16], a_tpf[16], a_bytes[32], a_seed[16];

static void setup(void)
{
	tmp = wft_tmpdir("shm-procs");
	cr_assert(asprintf(&floor_dir, "%s/floor", tmp) > 0);
	cr_assert(asprintf(&model_dir, "%s/model", tmp) > 0);
	cr_assert_eq(mkdir(model_dir, 0755), 0);
	model = shmt_model_make(model_dir, &spec, true);
	cr_assert_not_null(model);
	shmt_digest(model, &digest);
	memset(&cfg, 0, sizeof(cfg));
	cfg.dir = floor_dir;
	helper = wft_exe("tests/shm/shm-helper");
	cr_assert_eq(access(helper, X_OK), 0, "helper %s not built", helper);
	snprintf(a_n, sizeof(a_n), "%u", spec.n_files);
	snprintf(a_tpf, sizeof(a_tpf), "%u", spec.tensors_per_file);
	snprintf(a_bytes, sizeof(a_bytes), "%llu", (unsigned long long)spec.tensor_bytes);
	snprintf(a_seed, sizeof(a_seed), "%u", spec.seed);
}

static void teardown(void)
{
	shmt_model_free(model);
	wft_rmtree(tmp);
}

/* argv for the helper: MODE FLOOR MODEL N TPF BYTES SEED then up to 4 extra args. */
static pid_t spawn_helper(const char *mode, const char *out, const char *x0, const char *x1,
                          const char *x2, const char *x3)
{
	char *argv[] = {helper, (char *)mode, floor_dir,  model_dir,  a_n,        a_tpf, a_bytes,
	                a_seed, (char *)x0,   (char *)x1, (char *)x2, (char *)x3, NULL};
	pid_t pid = shmt_spawn(argv, out);
	cr_assert_gt(pid, 0, "spawn %s", helper);
	return pid;
}

static char *path_in(const char *dir, const char *name)
{
	char *p;
	cr_assert(asprintf(&p, "%s/%s", dir, name) > 0);
	return p;
}

static char *tail_of(const char *path)
{
	char *s = wft_read_file(path, NULL);
	return s ? s : strdup("(no output)");
}

static void assert_floor_empty(void)
{
	char names[1024];
	int n = shmt_count_entries(floor_dir, names, sizeof(names));
	cr_assert(n <= 0, "floor directory not empty: %s", names);
}

Test(procs, sixteen_attachers_one_fill, .init = setup, .fini = teardown, .timeout = 120)
{
	enum { N = 16 };
	char *sync = path_in(tmp, "sync"), *count = path_in(tmp, "fills");
	cr_assert_eq(mkdir(sync, 0755), 0);
	pid_t pids[N];
	char *outs[N];
	for (int i = 0; i < N; i++) {
		char name[32];
		snprintf(name, sizeof(name), "race.%d.out", i);
		outs[i] = path_in(tmp, name);
		pids[i] = spawn_helper("race", outs[i], count, sync, NULL, NULL);
	}
	/* let them all reach the start line, then release them at once */
	shmt_sleep_ms(200);
	char *start = path_in(sync, "start"), *release = path_in(sync, "release");
	cr_assert_eq(shmt_touch(start), 0);
	/* all 16 attached at once (16 attached.* files + start) before anyone may detach */
	for (int t = 0; t < 60000 && shmt_count_entries(sync, NULL, 0) < N + 1; t += 5)
		shmt_sleep_ms(5);
	cr_assert_eq(shmt_count_entries(sync, NULL, 0), N + 1, "not all attached");
	cr_assert_eq(shmt_file_size(count), 1, "exactly one fill among %d racers", N);

	/* from here, a reader in this process sees the same bytes */
	struct wf_shm_region *r;
	cr_assert_eq(
	    wf_shm_region_attach(&cfg, &digest, NULL, WF_SHM_ATTACH_READER, NULL, NULL, &r, NULL),
	    0);
	size_t n_holders = 0;
	cr_assert_eq(wf_shm_holder_pids(&cfg, &digest, NULL, 0, &n_holders, NULL), 0);
	n_holders = shmt_holders(&cfg, &digest, N + 1, NULL, 0);
	cr_assert_eq(n_holders, N + 1);
	char why[256];
	cr_assert_eq(shmt_check_bytes(r, model, why, sizeof(why)), 0, "%s", why);
	wf_shm_region_detach(r);

	cr_assert_eq(shmt_touch(release), 0);
	int materialized = 0;
	for (int i = 0; i < N; i++) {
		int st = shmt_wait(pids[i], 60);
		char *out = tail_of(outs[i]);
		cr_assert_eq(st, 0, "racer %d exited %d: %s", i, st, out);
		materialized += strstr(out, "materialized=1") != NULL;
		free(out);
	}
	cr_assert_eq(materialized, 1);
	cr_assert_eq(shmt_file_size(count), 1);
	assert_floor_empty();
}

static double mono(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

Test(procs, materializer_killed_at_random_points, .init = setup, .fini = teardown, .timeout = 240)
{
	enum { TRIALS = 60 };
	char *stop = path_in(tmp, "stop"), *reader_out = path_in(tmp, "reader.out");
	char *count = path_in(tmp, "fills"), *started = path_in(tmp, "started");
	char *slow_out = path_in(tmp, "slow.out");
	char region[4096];
	snprintf(region, sizeof(region), "%s/wf-%016llx%016llx", floor_dir,
	         (unsigned long long)digest.hi, (unsigned long long)digest.lo);
	pid_t reader = spawn_helper("reader", reader_out, stop, NULL, NULL, NULL);
	unsigned seed = (unsigned)time(NULL);
	int killed_in_fill = 0, rebuilt = 0, found_ready = 0;
	/* about 50 chunks of 8 KiB with 2 ms pauses: a fill of ~100-150 ms to kill inside */
	const char *chunk = "8192", *sleep_us = "2000";
	double fill_s = 0.15;

	cr_log_info("kill trials seed %u", seed);
	for (int trial = 0; trial < TRIALS; trial++) {
		unlink(started);
		pid_t m = spawn_helper("slow", slow_out, count, started, chunk, sleep_us);
		double t0 = mono();
		if (trial % 6 == 0) {
			/* anywhere from exec to lock to early fill */
			shmt_sleep_ms((unsigned)(rand_r(&seed) % 30));
		} else {
			while (!shmt_exists(started) && mono() - t0 < 20)
				shmt_sleep_ms(1);
			cr_assert(shmt_exists(started), "trial %d: fill never started", trial);
			/* uniformly inside the fill, and a little past it (checksums, READY) */
			shmt_sleep_ms((unsigned)(rand_r(&seed) % (unsigned)(fill_s * 1.3 * 1000)));
			killed_in_fill++;
		}
		kill(m, SIGKILL);
		int st = shmt_wait(m, 10);
		cr_assert(st == 128 + SIGKILL || st == 0, "trial %d: materializer exited %d", trial,
		          st);

		/* the next agent attach finds READY or rebuilds; either way it is whole */
		struct wf_shm_region *r;
		struct wf_diag diag;
		struct shmt_fill_ctx fc = {.count_path = count};
		wf_diag_clear(&diag);
		int rc = wf_shm_region_attach(&cfg, &digest, model, WF_SHM_ATTACH_AGENT, shmt_fill,
		                              &fc, &r, &diag);
		cr_assert_eq(rc, 0, "trial %d: %s", trial, wf_diag_str(&diag, rc));
		if (wf_shm_region_materialized(r))
			rebuilt++;
		else
			found_ready++;
		cr_assert_eq(wf_shm_region_state(r), WF_SHM_STATE_READY);
		wf_diag_clear(&diag);
		cr_assert_eq(wf_shm_region_verify(r, &diag), 0, "trial %d: %s", trial, diag.msg);
		char why[256];
		cr_assert_eq(shmt_check_bytes(r, model, why, sizeof(why)), 0, "trial %d: %s", trial,
		             why);
		wf_shm_region_detach(r);
		/* The reader may still hold it; its detach, as the last holder, removes it. Start
		 * the next trial from an empty floor so that there is a fill to kill. */
		double t1 = mono();
		while (shmt_exists(region) && mono() - t1 < 10)
			shmt_sleep_ms(1);
		cr_assert_not(shmt_exists(region), "trial %d: region outlived its holders", trial);
	}
	cr_assert_eq(shmt_touch(stop), 0);
	int st = shmt_wait(reader, 60);
	char *out = tail_of(reader_out);
	cr_assert_eq(st, 0, "reader saw a bad region (exit %d): %s", st, out);
	cr_log_info("%d trials (%d killed inside fill): %d rebuilt, %d found READY; reader: %s",
	            TRIALS, killed_in_fill, rebuilt, found_ready, out);
	cr_assert_gt(rebuilt, TRIALS / 2, "most kills land before READY (%d rebuilt)", rebuilt);
	cr_assert(strstr(out, "ok="), "%s", out);
	free(out);
	assert_floor_empty();
}

Test(procs, attach_detach_loops_leave_nothing, .init = setup, .fini = teardown, .timeout = 120)
{
	enum { AGENTS = 4, READERS = 2 };
	pid_t pids[AGENTS + READERS];
	char *outs[AGENTS + READERS];
	for (int i = 0; i < AGENTS + READERS; i++) {
		char name[32];
		snprintf(name, sizeof(name), "loop.%d.out", i);
		outs[i] = path_in(tmp, name);
		pids[i] =
		    spawn_helper("loop", outs[i], "3", i < AGENTS ? "agent" : "reader", NULL, NULL);
	}
	unsigned total = 0;
	for (int i = 0; i < AGENTS + READERS; i++) {
		int st = shmt_wait(pids[i], 60);
		char *out = tail_of(outs[i]);
		cr_assert_eq(st, 0, "looper %d exited %d: %s", i, st, out);
		unsigned ok = 0;
		sscanf(out, "ok=%u", &ok);
		total += ok;
		free(out);
	}
	cr_log_info("%u attach/detach rounds", total);
	cr_assert_gt(total, 100);
	assert_floor_empty();
}
