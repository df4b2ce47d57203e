/* Helper process for the agent integration tests.
 *
 *   agent_helper [--uid U --gid G] [--pdeathsig] exec PROG [ARGS...]
 *       drops to U:G (setgroups(0), setgid, setuid) when asked, arranges to be killed with the
 *       test process (PR_SET_PDEATHSIG, set after the drop since a credential change clears it),
 *       then execs PROG: how the tests start every wf-agent, so that an agent never outlives a
 *       test that crashed or timed out. PROG is opened before the drop and executed through that
 *       descriptor (fexecve): U need not be able to walk the path to the build tree, which a
 *       clone under /root (mode 0700) does not allow.
 *   agent_helper [--uid U --gid G] call URL status
 *   agent_helper [--uid U --gid G] call URL ensure NAME TIMEOUT_MS
 *       one request (AgentStatus, or EnsureFloor with wait) through the control client library;
 *       prints one line and exits 0:
 *         OPEN <errname> <message>                  wf_ctl_client_open() failed
 *         CALL <errname> <message>                  no reply
 *         REPLY <STATUS> <request_id> <FLOORSTATE|-> <message>
 *
 * A separate program because Criterion's test processes already run nng (its runner protocol), and
 * nng does not work in a fork()ed child: the tests posix_spawn this instead. */
#include "base/error.h"
#include "control/client.h"
#include "proto/status.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <grp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

static const char *state_name(Weightfloor__V1__FloorState s)
{
	switch (s) {
	case WEIGHTFLOOR__V1__FLOOR_STATE__FLOOR_STATE_DISK:
		return "DISK";
	case WEIGHTFLOOR__V1__FLOOR_STATE__FLOOR_STATE_MATERIALIZING:
		return "MATERIALIZING";
	case WEIGHTFLOOR__V1__FLOOR_STATE__FLOOR_STATE_HOST:
		return "HOST";
	case WEIGHTFLOOR__V1__FLOOR_STATE__FLOOR_STATE_PINNED_HOST:
		return "PINNED_HOST";
	case WEIGHTFLOOR__V1__FLOOR_STATE__FLOOR_STATE_FAILED:
		return "FAILED";
	default:
		return "-";
	}
}

static int do_call(int argc, char **argv)
{
	if (argc < 2)
		return 2;
	const char *url = argv[0], *what = argv[1];
	Weightfloor__V1__Request req = WEIGHTFLOOR__V1__REQUEST__INIT;
	Weightfloor__V1__AgentStatus as = WEIGHTFLOOR__V1__AGENT_STATUS__INIT;
	Weightfloor__V1__EnsureFloor ef = WEIGHTFLOOR__V1__ENSURE_FLOOR__INIT;
	int timeout_ms = 10000;
	if (strcmp(what, "status") == 0 && argc == 2) {
		req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_AGENT_STATUS;
		req.agent_status = &as;
	} else if (strcmp(what, "ensure") == 0 && argc == 4) {
		ef.name = argv[2];
		ef.wait = true;
		ef.wait_timeout_ms = (uint32_t)strtoul(argv[3], NULL, 10);
		timeout_ms = (int)ef.wait_timeout_ms + 5000;
		req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_ENSURE_FLOOR;
		req.ensure_floor = &ef;
	} else {
		return 2;
	}
	struct wf_ctl_client *c = NULL;
	struct wf_diag d = {{0}};
	struct wf_ctl_client_opts o = {.client_name = "agent_helper"};
	int rc = wf_ctl_client_open(url, timeout_ms, &o, &c, &d);
	if (rc < 0) {
		printf("OPEN %s %s\n", wf_err_name(rc), wf_diag_str(&d, rc));
		return 0;
	}
	Weightfloor__V1__Reply *rep = NULL;
	rc = wf_ctl_client_call_timeout(c, &req, timeout_ms, &rep, &d);
	if (rc < 0) {
		printf("CALL %s %s\n", wf_err_name(rc), wf_diag_str(&d, rc));
	} else {
		const char *st = "-";
		if (rep->body_case == WEIGHTFLOOR__V1__REPLY__BODY_MODEL_INFO)
			st = state_name(rep->model_info->floor_state);
		printf("REPLY %s %llu %s %s\n", wf_proto_status_name(rep->code),
		       (unsigned long long)rep->request_id, st, rep->message ? rep->message : "");
		wf_ctl_reply_free(rep);
	}
	wf_ctl_client_close(c);
	return 0;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"uid", required_argument, NULL, 'u'},
	    {"gid", required_argument, NULL, 'g'},
	    {"pdeathsig", no_argument, NULL, 'p'},
	    {0},
	};
	bool drop = false, pdeath = false;
	uid_t uid = 0;
	gid_t gid = 0;
	pid_t parent = getppid();
	int c;
	while ((c = getopt_long(argc, argv, "+u:g:p", opts, NULL)) != -1) {
		switch (c) {
		case 'u':
			uid = (uid_t)strtoul(optarg, NULL, 10);
			drop = true;
			break;
		case 'g':
			gid = (gid_t)strtoul(optarg, NULL, 10);
			drop = true;
			break;
		case 'p':
			pdeath = true;
			break;
		default:
			return 2;
		}
	}
	if (optind >= argc) {
		fprintf(stderr,
		        "usage: agent_helper [--uid U --gid G] [--pdeathsig] exec|call ...\n");
		return 2;
	}
	const char *cmd = argv[optind];
	int prog_fd = -1;
	if (strcmp(cmd, "exec") == 0) {
		if (optind + 1 >= argc)
			return 2;
		/* O_CLOEXEC is fine for an ELF program: the kernel has read it before closing fds.
		 */
		prog_fd = open(argv[optind + 1], O_RDONLY | O_CLOEXEC);
		if (prog_fd < 0) {
			fprintf(stderr, "agent_helper: open %s: %s\n", argv[optind + 1],
			        strerror(errno));
			return 127;
		}
	}
	if (drop && (setgroups(0, NULL) != 0 || setgid(gid) != 0 || setuid(uid) != 0)) {
		fprintf(stderr, "agent_helper: drop to %u:%u: %s\n", (unsigned)uid, (unsigned)gid,
		        strerror(errno));
		return 3;
	}
	if (pdeath) {
		if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0)
			return 3;
		if (getppid() != parent) /* the test died before the prctl */
			return 3;
	}
	if (prog_fd >= 0) {
		fexecve(prog_fd, argv + optind + 1, environ);
		fprintf(stderr, "agent_helper: exec %s: %s\n", argv[optind + 1], strerror(errno));
		return 127;
	}
	if (strcmp(cmd, "call") == 0)
		return do_call(argc - optind - 1, argv + optind + 1);
	return 2;
}
