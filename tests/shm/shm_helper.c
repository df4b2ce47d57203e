/* A process for the multi-process floor tests: attaches a hand-made model's region in one of a
 * few patterns and reports through its exit status (0 good; 2 attach, 3 verify, 4 bytes, 5 state,
 * 6 usage, 7 unexpected error) and one line on stdout.
 *
 *   shm-helper MODE FLOORDIR MODELDIR N_FILES TENSORS_PER_FILE TENSOR_BYTES SEED ARGS...
 *   race   COUNTFILE SYNCDIR   wait for SYNCDIR/start, attach (agent), check everything, create
 *                              SYNCDIR/attached.<pid>, wait for SYNCDIR/release, detach
 *   slow   COUNTFILE STARTED CHUNK SLEEP_US
 *                              attach (agent) with a slow fill, check, hold for 30 s (to be killed)
 *   reader STOPFILE            until STOPFILE exists: attach (reader); on success check READY,
 *                              verify and bytes; -ENOENT and WF_ENOT_READY are fine
 *   loop   SECONDS agent|reader  attach/detach for SECONDS, checking one tensor each time */
#include "shmtest.h"

#include "base/error.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static struct wf_model *model;
static struct wf_digest digest;
static struct wf_shm_config cfg;

static int check(struct wf_shm_region *r, bool full)
{
	struct wf_diag diag;
	char why[256];
	if (wf_shm_region_state(r) != WF_SHM_STATE_READY) {
		printf("state %s\n", wf_shm_state_name(wf_shm_region_state(r)));
		return 5;
	}
	wf_diag_clear(&diag);
	int rc = wf_shm_region_verify(r, &diag);
	if (rc < 0) {
		printf("verify: %s\n", wf_diag_str(&diag, rc));
		return 3;
	}
	if (full && shmt_check_bytes(r, model, why, sizeof(why)) < 0) {
		printf("bytes: %s\n", why);
		return 4;
	}
	return 0;
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void wait_for(const char *path, double timeout_s)
{
	double end = now_s() + timeout_s;
	while (!shmt_exists(path) && now_s() < end)
		shmt_sleep_ms(1);
}

static int mode_race(char **av)
{
	struct shmt_fill_ctx fc = {.count_path = av[0]};
	char start[4096], mine[4096], release[4096];
	struct wf_shm_region *r;
	struct wf_diag diag;

	snprintf(start, sizeof(start), "%s/start", av[1]);
	snprintf(mine, sizeof(mine), "%s/attached.%d", av[1], (int)getpid());
	snprintf(release, sizeof(release), "%s/release", av[1]);
	wait_for(start, 30);
	wf_diag_clear(&diag);
	int rc = wf_shm_region_attach(&cfg, &digest, model, WF_SHM_ATTACH_AGENT, shmt_fill, &fc, &r,
	                              &diag);
	if (rc < 0) {
		printf("attach: %s\n", wf_diag_str(&diag, rc));
		return 2;
	}
	int st = check(r, true);
	bool filled = wf_shm_region_materialized(r);
	shmt_touch(mine);
	wait_for(release, 60);
	wf_shm_region_detach(r);
	printf("done materialized=%d\n", (int)filled);
	return st;
}

static int mode_slow(char **av)
{
	struct shmt_fill_ctx fc = {.count_path = av[0],
	                           .started_path = av[1],
	                           .chunk = (size_t)strtoull(av[2], NULL, 0),
	                           .sleep_us = (unsigned)strtoul(av[3], NULL, 0)};
	struct wf_shm_region *r;
	struct wf_diag diag;

	wf_diag_clear(&diag);
	int rc = wf_shm_region_attach(&cfg, &digest, model, WF_SHM_ATTACH_AGENT, shmt_fill, &fc, &r,
	                              &diag);
	if (rc < 0) {
		printf("attach: %s\n", wf_diag_str(&diag, rc));
		return 2;
	}
	int st = check(r, true);
	printf("ready\n");
	fflush(stdout);
	shmt_sleep_ms(30000);
	wf_shm_region_detach(r);
	return st;
}

static int mode_reader(char **av)
{
	unsigned ok = 0, not_ready = 0, absent = 0;
	while (!shmt_exists(av[0])) {
		struct wf_shm_region *r;
		struct wf_diag diag;
		wf_diag_clear(&diag);
		int rc = wf_shm_region_attach(&cfg, &digest, NULL, WF_SHM_ATTACH_READER, NULL, NULL,
		                              &r, &diag);
		if (rc == -ENOENT) {
			absent++;
			shmt_sleep_ms(1);
			continue;
		}
		if (rc == WF_ENOT_READY) {
			not_ready++;
			shmt_sleep_ms(1);
			continue;
		}
		if (rc < 0) {
			printf("attach: %s (%s)\n", wf_diag_str(&diag, rc), wf_err_name(rc));
			return 7;
		}
		int st = check(r, true);
		wf_shm_region_detach(r);
		if (st) {
			printf("after %u good attaches\n", ok);
			return st;
		}
		ok++;
	}
	printf("ok=%u not_ready=%u absent=%u\n", ok, not_ready, absent);
	return 0;
}

static int mode_loop(char **av)
{
	double end = now_s() + strtod(av[0], NULL);
	bool agent = strcmp(av[1], "agent") == 0;
	unsigned ok = 0, other = 0, n = 0;

	while (now_s() < end) {
		struct wf_shm_region *r;
		struct wf_diag diag;
		wf_diag_clear(&diag);
		int rc = agent ? wf_shm_region_attach(&cfg, &digest, model, WF_SHM_ATTACH_AGENT,
		                                      shmt_fill, NULL, &r, &diag)
		               : wf_shm_region_attach(&cfg, &digest, NULL, WF_SHM_ATTACH_READER,
		                                      NULL, NULL, &r, &diag);
		if (!agent && (rc == -ENOENT || rc == WF_ENOT_READY)) {
			other++;
			continue;
		}
		if (rc < 0) {
			printf("attach: %s (%s)\n", wf_diag_str(&diag, rc), wf_err_name(rc));
			return 2;
		}
		/* One tensor per round, byte-checked against its checksum. */
		struct wf_shm_tensor_info ti;
		uint32_t i = n++ % wf_shm_region_n_tensors(r);
		rc = wf_shm_region_tensor(r, i, &ti);
		if (rc < 0 || wf_shm_checksum(ti.data, ti.nbytes) != ti.checksum) {
			printf("tensor %u bad\n", i);
			return 3;
		}
		if (n % 7 == 0)
			usleep(500);
		wf_shm_region_detach(r);
		ok++;
	}
	printf("ok=%u other=%u\n", ok, other);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc < 8) {
		fprintf(stderr, "usage: shm-helper MODE FLOORDIR MODELDIR N TPF BYTES SEED ...\n");
		return 6;
	}
	struct shmt_spec spec = {
	    .n_files = (unsigned)atoi(argv[4]),
	    .tensors_per_file = (unsigned)atoi(argv[5]),
	    .tensor_bytes = strtoull(argv[6], NULL, 0),
	    .seed = (uint32_t)strtoul(argv[7], NULL, 0),
	};
	cfg.dir = argv[2];
	model = shmt_model_make(argv[3], &spec, false);
	if (!model) {
		printf("model: %s\n", strerror(errno));
		return 6;
	}
	shmt_digest(model, &digest);
	setvbuf(stdout, NULL, _IOLBF, 0);
	const char *mode = argv[1];
	char **av = argv + 8;
	int n = argc - 8, rc = 6;
	if (strcmp(mode, "race") == 0 && n >= 2)
		rc = mode_race(av);
	else if (strcmp(mode, "slow") == 0 && n >= 4)
		rc = mode_slow(av);
	else if (strcmp(mode, "reader") == 0 && n >= 1)
		rc = mode_reader(av);
	else if (strcmp(mode, "loop") == 0 && n >= 2)
		rc = mode_loop(av);
	shmt_model_free(model);
	return rc;
}
