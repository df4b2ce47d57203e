/* wf-agent on a floor directory that is too small: a 4 MiB tmpfs and a ~6.5 MB model.
 *
 * The test process moves into a private mount namespace (the agent it starts inherits it), so the
 * mount cannot leak. Where mounting is not permitted the tests are skipped, and main() then exits
 * 77 so that CTest reports the executable as skipped rather than passed. */
#include "tests/agent/agt.h"

#include "base/error.h"
#include "common/wftest.h"
#include "proto/status.h"

#include <criterion/criterion.h>
#include <criterion/hooks.h>
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#define ST(x) WEIGHTFLOOR__V1__STATUS__STATUS_##x
#define FS(x) WEIGHTFLOOR__V1__FLOOR_STATE__FLOOR_STATE_##x

TestSuite(enospc, .fini = agt_fini, .timeout = 60);

/* Mounts a 4 MiB tmpfs on a->floor in a private mount namespace, or skips the test. */
static void mount_small_tmpfs_or_skip(struct agt *a)
{
	const char *why = NULL;
	int err = 0;
	if (mkdir(a->floor, 0750) != 0) {
		why = "mkdir";
		err = errno;
	} else if (unshare(CLONE_NEWNS) != 0) {
		why = "unshare(CLONE_NEWNS)";
		err = errno;
	} else if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) {
		why = "making mounts private";
		err = errno;
	} else if (mount("none", a->floor, "tmpfs", 0, "size=4m,mode=0750") != 0) {
		why = "mount -t tmpfs -o size=4m";
		err = errno;
	}
	if (why) {
		agt_fini(); /* Criterion runs no .fini after a skip */
		cr_skip_test("%s: %s: mounting is not permitted here", why, strerror(err));
	}
	a->mounted = strdup(a->floor);
}

static void expect_empty(const char *dir)
{
	char names[1024];
	int n = agt_dir_count(dir, names, sizeof names);
	cr_assert_eq(n, 0, "%s is not empty: %s", dir, names);
}

Test(enospc, materialization_fails_cleanly)
{
	struct agt *a = agt_new("agent-enospc");
	mount_small_tmpfs_or_skip(a);
	char *pm = agt_gen(a, "m", 7, NULL); /* ~6.5 MB: cannot fit in 4 MiB */
	char *marg = NULL;
	cr_assert(asprintf(&marg, "m=%s", pm) > 0);
	agt_start(a, NULL, (const char *[]){"--host-budget", "1G", "--model", marg, NULL});

	Weightfloor__V1__Reply *r = agt_ensure(a, "m", true);
	char *msg = strdup(r->message ? r->message : "");
	Weightfloor__V1__Status code = r->code;
	wf_ctl_reply_free(r);
	cr_assert_neq(code, ST(OK), "a 6.5 MB floor fit in a 4 MiB tmpfs");
	cr_assert(strstr(msg, "No space left") || strstr(msg, "ENOSPC"),
	          "the error does not say the directory is full: %s", msg);

	r = agt_model(a, "m");
	cr_assert_eq(agt_state(r), FS(FAILED));
	cr_assert(strstr(r->model_info->last_error, "No space left") ||
	              strstr(r->model_info->last_error, "ENOSPC"),
	          "last_error: %s", r->model_info->last_error);
	wf_ctl_reply_free(r);
	expect_empty(a->floor);

	/* the agent goes on serving, and the next try fails the same way without debris */
	r = agt_ensure(a, "m", true);
	cr_assert_neq(r->code, ST(OK));
	wf_ctl_reply_free(r);
	expect_empty(a->floor);
	r = agt_status(a);
	cr_assert_eq(r->code, ST(OK));
	cr_assert_eq(r->agent_status->host_used_bytes, 0,
	             "a failed floor counts against the budget");
	wf_ctl_reply_free(r);
	cr_assert_eq(agt_stop(a, 10000), 0);

	/* A failed materialization keeps its cause: a full floor directory is RESOURCE_EXHAUSTED.
	 */
	cr_expect_eq(code, ST(RESOURCE_EXHAUSTED),
	             "ensure answered %s (%s), want RESOURCE_EXHAUSTED", wf_proto_status_name(code),
	             msg);
}

/* Without --host-budget the agent sizes its budget from the floor file system (when that is
 * smaller than half the memory): the model is refused up front, by the budget. */
Test(enospc, default_budget_follows_the_file_system)
{
	struct agt *a = agt_new("agent-fsbudget");
	mount_small_tmpfs_or_skip(a);
	char *pm = agt_gen(a, "m", 7, NULL);
	char *marg = NULL;
	cr_assert(asprintf(&marg, "m=%s", pm) > 0);
	agt_start(a, NULL, (const char *[]){"--model", marg, NULL});

	Weightfloor__V1__Reply *r = agt_status(a);
	cr_assert_eq(r->agent_status->host_budget_bytes, 4u << 20, "budget %llu",
	             (unsigned long long)r->agent_status->host_budget_bytes);
	wf_ctl_reply_free(r);
	r = agt_ensure(a, "m", true);
	cr_assert_eq(r->code, ST(RESOURCE_EXHAUSTED), "ensure: %s (%s)",
	             wf_proto_status_name(r->code), r->message);
	cr_assert(strstr(r->message, "budget"), "%s", r->message);
	wf_ctl_reply_free(r);
	expect_empty(a->floor);
	cr_assert_eq(agt_stop(a, 10000), 0);
}

static size_t n_skipped, n_failed;

ReportHook(POST_ALL)(struct criterion_global_stats *stats)
{
	n_skipped = stats->tests_skipped;
	n_failed = stats->tests_failed + stats->tests_crashed;
}

int main(int argc, char *argv[])
{
	struct criterion_test_set *tests = criterion_initialize();
	int result = 0;
	if (criterion_handle_args(argc, argv, true))
		result = !criterion_run_all_tests(tests);
	criterion_finalize(tests);
	if (result == 0 && n_failed == 0 && n_skipped > 0)
		return 77; /* CTest: skipped, never passed */
	return result;
}
