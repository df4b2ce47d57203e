/* The agent keeps its word: registrations and pins survive restarts, floors survive any stop
 * order, what nobody holds is reaped and counted, status tells what is in the directory, a failed
 * command changes nothing, and no peer holding a floor's lock can freeze the registry.
 * Real wf-agent processes on ipc:// sockets (agt.h). */
#include "tests/agent/agt.h"

#include "base/error.h"
#include "proto/status.h"
#include "shm/region.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define ST(x) AGT_ST(x)
#define FS(x) AGT_FS(x)

TestSuite(agent_word, .fini = agt_fini, .timeout = 90);

static Weightfloor__V1__ModelInfo *model_info(struct agt *a, const char *name,
                                              Weightfloor__V1__Reply **ret_reply)
{
	Weightfloor__V1__Reply *r = agt_model(a, name);
	agt_expect_code(r, ST(OK), name);
	*ret_reply = r;
	return r->model_info;
}

/* A wf-gen model NAME (seed) in the test directory, as a --model NAME=PATH argument. */
static char *model_flag(struct agt *a, const char *name, int seed)
{
	return agt_printf("%s=%s", name, agt_gen(a, name, seed, NULL));
}

static char *state_path(struct agt *a)
{
	char *p = NULL;
	cr_assert(asprintf(&p, "%s/agent-state.json", a->run) > 0);
	return p;
}

/* Polls cond(a, arg) every 20 ms for up to ms. */
static bool eventually(bool (*cond)(struct agt *, const void *), struct agt *a, const void *arg,
                       int ms)
{
	int64_t end = agt_now_ms() + ms;
	do {
		if (cond(a, arg))
			return true;
		agt_sleep_ms(20);
	} while (agt_now_ms() < end);
	return cond(a, arg);
}

static bool path_gone(struct agt *a, const void *path)
{
	(void)a;
	return agt_inode(path) == 0;
}

Test(agent_word, api_registrations_and_pins_survive_a_restart)
{
	struct agt *a = agt_new("word-restart");
	char *pm = agt_gen(a, "m", 21, NULL);
	char *pn = agt_gen(a, "n", 22, NULL);
	agt_start(a, NULL, NULL);
	Weightfloor__V1__Reply *r = agt_register(a, "m", pm, true);
	agt_expect_code(r, ST(OK), "register m pinned");
	wf_ctl_reply_free(r);
	r = agt_register(a, "n", pn, false);
	agt_expect_code(r, ST(OK), "register n");
	wf_ctl_reply_free(r);
	agt_ensure_ok(a, "m");
	char *hm = agt_digest_of(a, "m");
	char *region = agt_region_path(a, hm, NULL);
	uint64_t ino = agt_inode(region);
	cr_assert_neq(ino, 0);
	struct stat st;
	cr_assert_eq(stat(state_path(a), &st), 0, "no state file beside the socket");

	cr_assert_eq(agt_stop(a, 10000), 0);
	cr_assert_eq(agt_inode(region), ino, "the pinned floor did not survive the stop");

	pid_t pid2 = agt_start(a, NULL, NULL);
	Weightfloor__V1__ModelInfo *mi = model_info(a, "m", &r);
	cr_assert_eq(mi->floor_state, FS(PINNED_HOST), "m is %s after the restart",
	             agt_state_name(mi->floor_state));
	cr_assert(mi->pin_host);
	cr_assert_eq(mi->progress->started_unix_ms, 0, "re-materialized instead of re-adopted");
	bool holds = false;
	for (size_t i = 0; i < mi->n_holder_pids; i++)
		holds |= mi->holder_pids[i] == (uint32_t)pid2;
	cr_assert(holds, "the new agent does not hold the floor");
	wf_ctl_reply_free(r);
	mi = model_info(a, "n", &r);
	cr_assert_eq(mi->floor_state, FS(DISK));
	cr_assert_not(mi->pin_host);
	wf_ctl_reply_free(r);
	cr_assert_eq(agt_inode(region), ino, "the floor was rebuilt");

	/* unpin is persisted too */
	r = agt_pin(a, "m", false);
	agt_expect_code(r, ST(OK), "unpin m");
	wf_ctl_reply_free(r);
	cr_assert_eq(agt_stop(a, 10000), 0);
	agt_start(a, NULL, NULL);
	mi = model_info(a, "m", &r);
	cr_assert_eq(mi->floor_state, FS(HOST), "m is %s", agt_state_name(mi->floor_state));
	cr_assert_not(mi->pin_host);
	wf_ctl_reply_free(r);
	cr_assert_eq(agt_stop(a, 10000), 0);
}

Test(agent_word, a_floor_survives_any_stop_order)
{
	struct agt *a = agt_new("word-order");
	char *marg = model_flag(a, "m", 23);
	agt_start(a, NULL, (const char *[]){"--model", marg, NULL});
	agt_ensure_ok(a, "m");
	char *hm = agt_digest_of(a, "m");
	char *region = agt_region_path(a, hm, NULL);
	uint64_t ino = agt_inode(region);

	/* the agent stops first; the worker that stays is the last holder when it detaches */
	struct wf_shm_region *w = agt_attach_reader(a, hm, NULL);
	cr_assert_eq(agt_stop(a, 10000), 0);
	wf_shm_region_detach(w);
	cr_assert_eq(agt_inode(region), ino,
	             "the last worker's detach removed a floor the agent meant to keep");

	agt_start(a, NULL, (const char *[]){"--model", marg, NULL});
	Weightfloor__V1__Reply *r = NULL;
	Weightfloor__V1__ModelInfo *mi = model_info(a, "m", &r);
	cr_assert_eq(mi->floor_state, FS(HOST));
	cr_assert_eq(mi->progress->started_unix_ms, 0, "re-materialized instead of re-adopted");
	wf_ctl_reply_free(r);

	/* once the agent lets go, the last holder's detach does remove it */
	w = agt_attach_reader(a, hm, NULL);
	r = agt_release(a, "m");
	agt_expect_code(r, ST(OK), "release");
	wf_ctl_reply_free(r);
	cr_assert_eq(agt_inode(region), ino, "released while a worker holds it: must stay");
	wf_shm_region_detach(w);
	cr_assert_eq(agt_inode(region), 0, "the last holder did not remove a released floor");
	cr_assert_eq(agt_stop(a, 10000), 0);
}

static bool reaped_and_nothing_used(struct agt *a, const void *arg)
{
	(void)arg;
	Weightfloor__V1__Reply *r = agt_status(a);
	bool ok = r->agent_status->reaped_count >= 1 && r->agent_status->host_used_bytes == 0;
	wf_ctl_reply_free(r);
	return ok;
}

Test(agent_word, status_tells_the_truth_and_the_janitor_reaps)
{
	struct agt *a = agt_new("word-reap");
	char *marg = model_flag(a, "m", 24);
	agt_start(a, NULL, (const char *[]){"--model", marg, "--janitor-interval", "50", NULL});
	agt_ensure_ok(a, "m");
	char *hm = agt_digest_of(a, "m");
	char *region = agt_region_path(a, hm, NULL);
	pid_t w1 = agt_hold_floor(a, hm);
	pid_t w2 = agt_hold_floor(a, hm);

	Weightfloor__V1__Reply *r = agt_release(a, "m");
	agt_expect_code(r, ST(OK), "release");
	wf_ctl_reply_free(r);
	Weightfloor__V1__ModelInfo *mi = model_info(a, "m", &r);
	cr_assert_eq(mi->floor_state, FS(DISK));
	cr_assert(mi->region_present, "status hides a floor two workers hold");
	cr_assert_eq(mi->holder_count, 2, "holders: %u, want the two workers", mi->holder_count);
	cr_assert_gt(mi->resident_bytes, 0, "resident bytes of a held floor are 0");
	uint64_t resident = mi->resident_bytes;
	wf_ctl_reply_free(r);
	agt_sleep_ms(200); /* a few janitor passes: the held floor is counted, not reaped */
	cr_assert_neq(agt_inode(region), 0, "the janitor removed a held floor");
	r = agt_status(a);
	cr_assert_geq(r->agent_status->host_used_bytes, resident,
	              "host_used %llu does not count the held floor's %llu bytes",
	              (unsigned long long)r->agent_status->host_used_bytes,
	              (unsigned long long)resident);
	wf_ctl_reply_free(r);

	/* both workers die without detaching: nobody holds it; the janitor reaps it */
	kill(w1, SIGKILL);
	kill(w2, SIGKILL);
	waitpid(w1, NULL, 0);
	waitpid(w2, NULL, 0);
	cr_assert(eventually(path_gone, a, region, 3000),
	          "a floor nobody holds was not reaped within 3 s");
	/* the pass that unlinked it publishes its counts when it ends */
	cr_assert(eventually(reaped_and_nothing_used, a, NULL, 3000),
	          "after the reap: reaped_count 0 or host_used not 0");
	char names[1024];
	cr_assert_eq(agt_dir_count(a->floor, names, sizeof names), 0, "left in the floor dir: %s",
	             names);
	cr_assert_eq(agt_stop(a, 10000), 0);
}

Test(agent_word, orphan_floors_are_listed)
{
	struct agt *a = agt_new("word-orphan");
	char *marg = model_flag(a, "m", 25);
	agt_start(a, NULL, (const char *[]){"--model", marg, "--janitor-interval", "50", NULL});
	agt_ensure_ok(a, "m");
	char *hm = agt_digest_of(a, "m");
	pid_t w = agt_hold_floor(a, hm);
	/* the next agent does not know m: its floor, held by a worker, is an orphan */
	cr_assert_eq(agt_stop(a, 10000), 0);
	unlink(state_path(a)); /* m came from a flag: there may be none */
	agt_start(a, NULL, (const char *[]){"--janitor-interval", "50", NULL});
	agt_sleep_ms(300);
	Weightfloor__V1__Reply *r = agt_status(a);
	Weightfloor__V1__AgentStatusReply *st = r->agent_status;
	cr_assert_eq(st->orphan_count, 1, "orphans: %u", st->orphan_count);
	cr_assert_eq(st->n_orphan_floors, 1);
	cr_assert_str_eq(st->orphan_floors[0]->digest_hex, hm);
	cr_assert_eq(st->orphan_floors[0]->holder_count, 1);
	cr_assert_gt(st->orphan_bytes, 0);
	cr_assert_geq(st->host_used_bytes, st->orphan_bytes);
	wf_ctl_reply_free(r);
	char *out = NULL, *err = NULL;
	cr_assert_eq(agt_ctl(a, &out, &err, (const char *[]){"status", NULL}), 0, "%s", err);
	cr_assert(strstr(out, "orphans     1 floors") && strstr(out, hm), "agentctl status:\n%s",
	          out);
	kill(w, SIGKILL);
	waitpid(w, NULL, 0);
	char *region = agt_region_path(a, hm, NULL);
	cr_assert(eventually(path_gone, a, region, 3000), "the orphan was not reaped");
	cr_assert_eq(agt_stop(a, 10000), 0);
}

Test(agent_word, a_refused_pin_changes_nothing)
{
	struct agt *a = agt_new("word-pin");
	char *marg = model_flag(a, "m", 26);
	agt_start(a, NULL, (const char *[]){"--model", marg, "--host-budget", "64K", NULL});
	Weightfloor__V1__Reply *r = agt_pin(a, "m", true);
	agt_expect_code(r, ST(RESOURCE_EXHAUSTED), "pin over budget");
	wf_ctl_reply_free(r);
	Weightfloor__V1__ModelInfo *mi = model_info(a, "m", &r);
	cr_assert_not(mi->pin_host, "a refused pin was recorded");
	cr_assert_eq(mi->floor_state, FS(DISK));
	wf_ctl_reply_free(r);
	char *out = NULL, *err = NULL;
	int rc = agt_ctl(a, &out, &err, (const char *[]){"floor", "pin", "m", NULL});
	cr_assert_neq(rc, 0, "agentctl floor pin over budget succeeded: %s", out);
	mi = model_info(a, "m", &r);
	cr_assert_not(mi->pin_host, "agentctl's refused pin was recorded");
	wf_ctl_reply_free(r);
	/* and nothing of it reaches the next agent */
	cr_assert_eq(agt_stop(a, 10000), 0);
	agt_start(a, NULL, (const char *[]){"--model", marg, "--host-budget", "64K", NULL});
	mi = model_info(a, "m", &r);
	cr_assert_not(mi->pin_host);
	wf_ctl_reply_free(r);
	cr_assert_eq(agt_stop(a, 10000), 0);
}

Test(agent_word, a_peer_on_the_guard_lock_freezes_nothing)
{
	struct agt *a = agt_new("word-guard");
	char *marg = model_flag(a, "m", 27), *narg = model_flag(a, "n", 28);
	agt_start(a, NULL, (const char *[]){"--model", marg, "--model", narg, NULL});
	agt_ensure_ok(a, "m");
	char *hm = agt_digest_of(a, "m");
	/* a floor-group member (read access is all it needs) sits on m's guard lock */
	char *guard = agt_region_path(a, hm, ".guard");
	int gfd = open(guard, O_RDONLY | O_CLOEXEC);
	cr_assert_geq(gfd, 0, "%s: %s", guard, strerror(errno));
	cr_assert_eq(flock(gfd, LOCK_EX), 0);

	int64_t t0 = agt_now_ms();
	Weightfloor__V1__Reply *r = agt_release(a, "m");
	agt_expect_code(r, ST(OK), "release m while its guard is held");
	wf_ctl_reply_free(r);
	r = agt_status(a);
	agt_expect_code(r, ST(OK), "status");
	wf_ctl_reply_free(r);
	r = agt_list(a);
	agt_expect_code(r, ST(OK), "list");
	wf_ctl_reply_free(r);
	agt_ensure_ok(a, "n");
	int64_t took = agt_now_ms() - t0;
	/* They answered OK while the guard was still held, so none waited for it (that would
	 * have been until the close below); the time is for the log. */
	cr_log_info("release, status, list and another model's ensure took %lld ms with a peer "
	            "on m's guard",
	            (long long)took);
	close(gfd);
	/* and it stops on SIGTERM (agt_stop kills it after 10 s, and says so: not 0) */
	cr_assert_eq(agt_stop(a, 10000), 0);
}

Test(agent_word, relative_paths_are_refused)
{
	struct agt *a = agt_new("word-relative");
	agt_gen(a, "m", 29, NULL);
	agt_start(a, NULL, NULL);
	Weightfloor__V1__Reply *r = agt_register(a, "m", "models/m.gguf", false);
	agt_expect_code(r, ST(INVALID_ARGUMENT), "relative path");
	cr_assert(strstr(r->message, "absolute"), "message: %s", r->message);
	wf_ctl_reply_free(r);
	cr_assert_eq(agt_stop(a, 10000), 0);
}

static bool is_stale(struct agt *a, const void *name)
{
	Weightfloor__V1__Reply *r = agt_model(a, name);
	bool stale = r->code == ST(OK) && r->model_info->stale;
	wf_ctl_reply_free(r);
	return stale;
}

Test(agent_word, a_changed_file_is_reported_stale)
{
	struct agt *a = agt_new("word-stale");
	char *pm = agt_gen(a, "m", 30, NULL);
	char *marg = agt_printf("m=%s", pm);
	agt_start(a, NULL, (const char *[]){"--model", marg, "--janitor-interval", "50", NULL});
	agt_ensure_ok(a, "m");
	cr_assert_not(is_stale(a, "m"));
	struct timespec ts[2];
	clock_gettime(CLOCK_REALTIME, &ts[0]);
	ts[0].tv_sec -= 1000;
	ts[1] = ts[0];
	cr_assert_eq(utimensat(AT_FDCWD, pm, ts, 0), 0);
	cr_assert(eventually(is_stale, a, "m", 3000), "a changed file was not reported");
	char *log = agt_log(a);
	cr_assert(strstr(log, "changed since the floor was materialized"), "log:\n%s", log);
	/* release and ensure serve the new file */
	Weightfloor__V1__Reply *r = agt_release(a, "m");
	wf_ctl_reply_free(r);
	agt_ensure_ok(a, "m");
	cr_assert_not(is_stale(a, "m"));
	cr_assert_eq(agt_stop(a, 10000), 0);
}

Test(agent_word, a_bad_state_file_is_refused_with_its_name)
{
	struct agt *a = agt_new("word-badstate");
	char *sp = state_path(a);
	FILE *fp = fopen(sp, "w");
	cr_assert_not_null(fp);
	fputs("{\"version\": 1, \"models\": [{\"name\": 3}]}", fp);
	fclose(fp);
	agt_spawn(a, NULL, NULL);
	cr_assert_not(agt_wait_ready(a, 3000), "the agent started over a bad state file");
	char *log = agt_log(a);
	cr_assert(strstr(log, sp) && strstr(log, "state file"), "log does not name it:\n%s", log);
}
