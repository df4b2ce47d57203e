/* wf_sd_notify (base/notify.h): the datagram systemd's Type=notify expects, on a path socket and
 * on an abstract one, nothing without NOTIFY_SOCKET, and an error (not a truncated address) for a
 * path that does not fit. */
#include "base/notify.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

/* A datagram socket bound at addr (len bytes of sockaddr_un). */
static int bound(const struct sockaddr_un *sa, socklen_t len)
{
	int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	cr_assert_geq(fd, 0);
	cr_assert_eq(bind(fd, (const struct sockaddr *)sa, len), 0, "bind: %s", strerror(errno));
	return fd;
}

/* The next datagram within 5 s, as a string (static buffer); asserts one came. */
static const char *recv_one(int fd)
{
	static char buf[256];
	struct pollfd p = {.fd = fd, .events = POLLIN};
	cr_assert_eq(poll(&p, 1, 5000), 1, "no datagram within 5 s");
	ssize_t n = recv(fd, buf, sizeof buf - 1, 0);
	cr_assert_geq(n, 0);
	buf[n] = '\0';
	return buf;
}

Test(notify, path_socket)
{
	char dir[] = "/tmp/wf-notify.XXXXXX";
	cr_assert_not_null(mkdtemp(dir));
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	snprintf(sa.sun_path, sizeof sa.sun_path, "%s/notify", dir);
	int fd = bound(&sa, sizeof sa);
	cr_assert_eq(setenv("NOTIFY_SOCKET", sa.sun_path, 1), 0);
	cr_assert_eq(wf_sd_notify("READY=1"), 0);
	cr_assert_str_eq(recv_one(fd), "READY=1");
	cr_assert_eq(wf_sd_notify("STOPPING=1"), 0);
	cr_assert_str_eq(recv_one(fd), "STOPPING=1");
	close(fd);
	unlink(sa.sun_path);
	rmdir(dir);
}

Test(notify, abstract_socket)
{
	/* '@name' in NOTIFY_SOCKET is "\0name" on the wire, with no trailing NUL in the length. */
	char name[64];
	snprintf(name, sizeof name, "@wf-notify-test-%d", (int)getpid());
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	size_t n = strlen(name);
	memcpy(sa.sun_path, name, n);
	sa.sun_path[0] = '\0';
	int fd = bound(&sa, (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n));
	cr_assert_eq(setenv("NOTIFY_SOCKET", name, 1), 0);
	cr_assert_eq(wf_sd_notify("STATUS=serving"), 0);
	cr_assert_str_eq(recv_one(fd), "STATUS=serving");
	close(fd);
}

Test(notify, unset_is_a_no_op)
{
	cr_assert_eq(unsetenv("NOTIFY_SOCKET"), 0);
	cr_assert_eq(wf_sd_notify("READY=1"), 0);
	cr_assert_eq(setenv("NOTIFY_SOCKET", "", 1), 0);
	cr_assert_eq(wf_sd_notify("READY=1"), 0);
}

Test(notify, errors)
{
	char longp[200];
	memset(longp, 'x', sizeof longp - 1);
	longp[0] = '/';
	longp[sizeof longp - 1] = '\0';
	cr_assert_eq(setenv("NOTIFY_SOCKET", longp, 1), 0);
	cr_assert_eq(wf_sd_notify("READY=1"), -ENAMETOOLONG);
	/* Nobody listening: the sender's error, not a crash or a hang. */
	cr_assert_eq(setenv("NOTIFY_SOCKET", "/nonexistent/wf-notify", 1), 0);
	cr_assert_eq(wf_sd_notify("READY=1"), -ENOENT);
}
