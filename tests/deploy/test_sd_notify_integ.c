/* Type=notify readiness of both daemons, as wf-agent.service and wf-worker@.service rely on:
 * a real wf-agent and a real wf-worker, each with its own NOTIFY_SOCKET, send READY=1 once they
 * serve (the endpoint answers by then) and STOPPING=1 on SIGTERM, in that order. */
#include "agent/agt.h"
#include "common/wftest.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

TestSuite(sd_notify, .fini = agt_fini, .timeout = 120);

/* A datagram socket bound at dir/name; its path in *ret_path (malloc'ed). */
static int notify_socket(const char *dir, const char *name, char **ret_path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int n = snprintf(sa.sun_path, sizeof sa.sun_path, "%s/%s", dir, name);
	cr_assert(n > 0 && (size_t)n < sizeof sa.sun_path, "socket path too long");
	int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	cr_assert_geq(fd, 0);
	cr_assert_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0, "bind: %s", strerror(errno));
	*ret_path = strdup(sa.sun_path);
	return fd;
}

/* The next datagram within timeout_ms into buf; false when none came. */
static bool next_message(int fd, int timeout_ms, char *buf, size_t len)
{
	struct pollfd p = {.fd = fd, .events = POLLIN};
	if (poll(&p, 1, timeout_ms) != 1)
		return false;
	ssize_t n = recv(fd, buf, len - 1, 0);
	if (n < 0)
		return false;
	buf[n] = '\0';
	return true;
}

static void expect_message(int fd, const char *want, const char *who, const char *log)
{
	char buf[256];
	cr_assert(next_message(fd, 20000, buf, sizeof buf), "%s sent no %s within 20 s; log:\n%s",
	          who, want, log);
	cr_assert_str_eq(buf, want, "%s sent '%s' where '%s' was due; log:\n%s", who, buf, want,
	                 log);
}

Test(sd_notify, agent_and_worker_ready_then_stopping)
{
	struct agt *a = agt_new("sdnotify");
	char *apath, *wpath;
	int afd = notify_socket(a->dir, "agent.notify", &apath);
	int wfd = notify_socket(a->dir, "worker.notify", &wpath);

	char env[600];
	snprintf(env, sizeof env, "NOTIFY_SOCKET=%s", apath);
	struct agt_opts o = {.env = {env}};
	agt_start(a, &o, NULL); /* returns once AgentStatus answers */
	char *log = agt_log(a);
	expect_message(afd, "READY=1", "wf-agent", log);
	free(log);

	/* The worker inherits the test's environment (agt_spawn_worker). */
	cr_assert_eq(setenv("NOTIFY_SOCKET", wpath, 1), 0);
	struct agt_worker w;
	agt_spawn_worker(a, &w, "w0", NULL, NULL, NULL);
	unsetenv("NOTIFY_SOCKET");
	char buf[256];
	bool got = next_message(wfd, 20000, buf, sizeof buf);
	log = agt_worker_log(&w);
	cr_assert(got, "wf-worker sent no READY=1 within 20 s; log:\n%s", log);
	cr_assert_str_eq(buf, "READY=1", "wf-worker sent '%s' first; log:\n%s", buf, log);
	free(log);
	/* READY=1 promises a serving endpoint: WorkerStatus answers at once. */
	agt_wait_worker_ready(&w);

	cr_assert_eq(kill(w.pid, SIGTERM), 0);
	log = agt_worker_log(&w);
	expect_message(wfd, "STOPPING=1", "wf-worker", log);
	free(log);
	int st;
	cr_assert_eq(waitpid(w.pid, &st, 0), w.pid);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "wf-worker exit status %#x", st);

	cr_assert_eq(agt_stop(a, 15000), 0);
	log = agt_log(a);
	expect_message(afd, "STOPPING=1", "wf-agent", log);
	free(log);
	/* Nothing after STOPPING=1 (no second READY=1 from a restart loop). */
	cr_assert_not(next_message(afd, 0, buf, sizeof buf), "wf-agent sent '%s' after stopping",
	              buf);
	close(afd);
	close(wfd);
	free(apath);
	free(wpath);
}
