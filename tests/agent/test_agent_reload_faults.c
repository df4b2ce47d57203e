/* Reloads cut by kill -9 (issue 20, "Faults"): a real wf-agent reloads a tensor rewritten on
 * disk (`agentctl reload`) and is killed at a random point of it, over and over. After each kill
 * a restarted agent serves the model: its floor verifies and holds the files' new bytes (the
 * files' identities moved, so the restarted agent's floor is made from them); every other region
 * left in the floor directory verifies, or is one a publish never finished (odd generation),
 * which attachers refuse; nothing is left behind once the janitor has passed: only the model's
 * floor and its keep marker remain. And a worker killed at a random point of the refresh a
 * reload starts: a new one serves the floor's new bytes (a fresh engine's on the new file), and
 * the next reload has nothing to do. Trials: WF_RELOAD_FAULT_TRIALS (default 4 agent kills and
 * 2 worker kills; the long mode is 200). Waits poll states with deadlines. */
#include "base/error.h"
#include "common/wftest.h"
#include "model/model.h"
#include "shm/region.h"
#include "tests/agent/agt.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

TestSuite(agent_reload_faults, .fini = agt_fini, .timeout = 1800);

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next_rand(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

/* Every region file in the floor directory attaches and verifies, or is refused as a publish
 * that never finished. Returns how many regions there are. */
static int check_regions(struct agt *a)
{
	DIR *d = opendir(a->floor);
	cr_assert_not_null(d, "%s", a->floor);
	int n = 0;
	struct dirent *de;
	while ((de = readdir(d))) {
		const char *nm = de->d_name;
		/* regions are "wf-" and 32 hex digits; markers and locks have suffixes */
		if (strncmp(nm, "wf-", 3) != 0 || strlen(nm) != 35)
			continue;
		n++;
		int rc = 0;
		struct wf_shm_region *r = agt_attach_reader(a, nm + 3, &rc);
		if (!r) {
			cr_assert(rc == WF_ENOT_READY || rc == -ENOENT,
			          "region %s: attach %s, not a publish that never finished", nm,
			          wf_strerror(rc));
			continue;
		}
		struct wf_diag dg = {{0}};
		rc = wf_shm_region_verify(r, &dg);
		cr_assert_eq(rc, 0, "region %s: %s", nm, wf_diag_str(&dg, rc));
		wf_shm_region_detach(r);
	}
	closedir(d);
	return n;
}

Test(agent_reload_faults, kill_9_at_random_points_of_reloads)
{
	const char *env = getenv("WF_RELOAD_FAULT_TRIALS");
	int trials = env ? atoi(env) : 4;
	struct agt *a = agt_new("reload-faults");
	char *pm = agt_gen(a, "m", 7, "64M");
	char *marg = agt_printf("m=%s", pm);
	const char *const args[] = {"--model", marg, "--spare", "32M", "--janitor-interval",
	                            "200",     NULL};
	agt_start(a, NULL, args);
	agt_ensure_ok(a, "m");

	struct wf_model *m = NULL;
	struct wf_diag d = {{0}};
	cr_assert_eq(wf_model_open(pm, &m, &d), 0, "%s", d.msg);
	char *agentctl = wft_exe("control/agentctl/agentctl");
	int window_ms = 30; /* the kill's range; widened to a measured reload below */
	for (int trial = 0; trial < trials; trial++) {
		/* a tensor of at least 64 KiB gets new bytes in place */
		const struct wf_tensor *t;
		do
			t = &m->tensors[next_rand() % m->n_tensors];
		while (t->nbytes < (64u << 10));
		uint8_t *nb = malloc(t->nbytes);
		for (uint64_t i = 0; i < t->nbytes; i++)
			nb[i] = (uint8_t)next_rand();
		int fd = open(pm, O_WRONLY);
		cr_assert_geq(fd, 0);
		cr_assert_eq(pwrite(fd, nb, t->nbytes, (off_t)t->offset), (ssize_t)t->nbytes);
		close(fd);

		char *out = agt_printf("%s/reload-%d.out", a->dir, trial);
		char *const argv[] = {agentctl, "--socket", a->sock_url, "reload", "m", NULL};
		int64_t t0 = agt_now_ms();
		pid_t c = agt_spawn_to(argv, out);
		int delay = (int)(next_rand() % (uint64_t)window_ms);
		agt_sleep_ms(delay);
		kill(a->pid, SIGKILL);
		agt_stop(a, 10000);
		int st = 0;
		cr_assert_eq(waitpid(c, &st, 0), c);
		if (trial == 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0) {
			/* the reload beat the kill: aim the next ones inside its duration */
			int took = (int)(agt_now_ms() - t0);
			window_ms = took > window_ms ? took : window_ms;
		}

		agt_start(a, NULL, args);
		agt_ensure_ok(a, "m");
		char *hex = agt_digest_of(a, "m");
		struct wf_shm_region *r = agt_attach_reader(a, hex, NULL);
		struct wf_shm_tensor_info ti;
		cr_assert_eq(wf_shm_region_find(r, t->name, &ti), 0);
		cr_assert_eq(memcmp(ti.data, nb, t->nbytes), 0,
		             "trial %d (kill after %d ms): %s does not hold the file's new bytes",
		             trial, delay, t->name);
		wf_shm_region_detach(r);
		/* a reload now has nothing to do: the floor is the files' */
		char *o = NULL, *e = NULL;
		int rc = agt_ctl(a, &o, &e, (const char *const[]){"reload", "m", NULL});
		cr_assert_eq(rc, 0, "trial %d: reload after restart: %s%s", trial, o, e);
		cr_assert(strstr(o, "nothing changed"), "trial %d: %s", trial, o);
		free(o);
		free(e);
		check_regions(a);
		/* nothing leaks: the janitor removes every region but the model's */
		for (int i = 0;; i++) {
			char names[4096];
			int n = check_regions(a);
			if (n == 1)
				break;
			agt_dir_count(a->floor, names, sizeof names);
			cr_assert_lt(i, 200, "trial %d: %d regions left in the floor directory: %s",
			             trial, n, names);
			agt_sleep_ms(100);
		}
		free(hex);
		free(out);
		free(nb);
	}
	wf_model_close(m);
	free(marg);
	free(pm);
}

/* The greedy ids of a completion of PROMPT through the agent on worker id, or NULL when it
 * failed (a worker not answering yet). */
#define PROMPT "1,17,300,42,99,7,256,311"

/* generate_ids, asked again until the worker answers (20 s). */
static char *generate_ids_wait(struct agt *a, const char *id)
{
	for (int i = 0;; i++) {
		char *ids = agt_generate_ids(a, "m", id, PROMPT, "8");
		if (ids)
			return ids;
		cr_assert_lt(i, 200, "worker %s never served a completion", id);
		agt_sleep_ms(100);
	}
}

/* A worker killed at a random point of the refresh a reload starts: restarted, it serves the
 * floor's new bytes (a fresh engine's on the new file), and the reload after it has nothing to
 * do. */
Test(agent_reload_faults, worker_killed_during_the_refresh)
{
	const char *env = getenv("WF_RELOAD_FAULT_TRIALS");
	int trials = env ? (atoi(env) + 1) / 2 : 2;
	struct agt *a = agt_new("reload-wkill");
	char *pm = agt_gen(a, "m", 3, NULL);
	char *marg = agt_printf("m=%s", pm);
	agt_start(a, NULL, (const char *[]){"--model", marg, "--spare", "32M", NULL});
	agt_ensure_ok(a, "m");
	struct wf_model *m = NULL;
	struct wf_diag d = {{0}};
	cr_assert_eq(wf_model_open(pm, &m, &d), 0, "%s", d.msg);
	const struct wf_tensor *t = wf_model_find_tensor(m, "blk.0.attn_q.weight");
	cr_assert_not_null(t);
	for (int trial = 0; trial < trials; trial++) {
		struct agt_worker w;
		char id[16];
		snprintf(id, sizeof id, "w%d", trial);
		agt_spawn_worker(
		    a, &w, id, NULL, "host:mem=512Mi",
		    (const char *const[]){"--dense-on-device", "--threads", "2", NULL});
		agt_wait_worker_registered(a, &w, id);
		free(generate_ids_wait(a, id)); /* its engine exists: the refresh has work */
		uint8_t *nb = malloc(t->nbytes);
		for (uint64_t i = 0; i < t->nbytes; i++)
			nb[i] = (uint8_t)next_rand();
		int fd = open(pm, O_WRONLY);
		cr_assert_eq(pwrite(fd, nb, t->nbytes, (off_t)t->offset), (ssize_t)t->nbytes);
		close(fd);
		free(nb);
		char *o = NULL, *e = NULL;
		cr_assert_eq(agt_ctl(a, &o, &e, (const char *const[]){"reload", "m", NULL}), 0,
		             "%s", e);
		free(o);
		free(e);
		agt_sleep_ms((int)(next_rand() % 20));
		kill(w.pid, SIGKILL);
		waitpid(w.pid, NULL, 0);
		/* a new worker serves the floor's new bytes: the ids of a fresh engine on the file
		 */
		struct agt_worker w2;
		snprintf(id, sizeof id, "v%d", trial);
		agt_spawn_worker(
		    a, &w2, id, NULL, "host:mem=512Mi",
		    (const char *const[]){"--dense-on-device", "--threads", "2", NULL});
		agt_wait_worker_registered(a, &w2, id);
		char *want = agt_eval_ids(a, pm, PROMPT, "8"), *got = generate_ids_wait(a, id);
		cr_expect_str_eq(got, want, "trial %d: the restarted worker's completion", trial);
		free(got);
		free(want);
		cr_assert_eq(agt_ctl(a, &o, &e, (const char *const[]){"reload", "m", NULL}), 0);
		cr_expect(strstr(o, "nothing changed"), "trial %d: %s", trial, o);
		free(o);
		free(e);
		kill(w2.pid, SIGKILL);
		waitpid(w2.pid, NULL, 0);
	}
	wf_model_close(m);
	free(marg);
	free(pm);
}
