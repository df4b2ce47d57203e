/* The listener watchdog (control/internal.h): nng 1.5.2 stops accepting for good once a peer
 * hangs up before the SP handshake (nng issue #1518), and libwfcontrol replaces the listener.
 *
 * Kept apart from test_server.c because the dead listener's objects are never freed inside nng
 * (its negotiated-but-unmatched connections keep them referenced), which LeakSanitizer reports:
 * CMake runs this executable with tests/lsan.supp (leaks allocated inside libnng only). */
#include "tests/control/ctl_test.h"

#include "base/error.h"
#include "common/wftest.h"
#include "control/pub.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define KIND(k) WEIGHTFLOOR__V1__EVENT_KIND__EVENT_KIND_##k

static struct wf_ctl_client *open_client(const char *url, int timeout_ms,
                                         const struct wf_ctl_client_opts *opts)
{
	struct wf_ctl_client *c = NULL;
	struct wf_diag d = {{0}};
	int rv = wf_ctl_client_open(url, timeout_ms, opts, &c, &d);
	cr_assert_eq(rv, 0, "client open %s: %s", url, wf_diag_str(&d, rv));
	return c;
}

static Weightfloor__V1__Reply *status_call(struct wf_ctl_client *c, const char *name)
{
	Weightfloor__V1__Request req;
	Weightfloor__V1__ModelStatus ms;
	Weightfloor__V1__Reply *r = NULL;
	struct wf_diag d = {{0}};
	req_model_status(&req, &ms, name);
	int rv = wf_ctl_client_call(c, &req, &r, &d);
	cr_assert_eq(rv, 0, "call (%s): %s", name, wf_diag_str(&d, rv));
	return r;
}

/* Connects to an ipc socket and hangs up before the SP handshake, as a crashed or impatient
 * client does. In nng 1.5.2 this stops the listener from accepting (nng issue #1518). */
static void hang_up_early(const char *url)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	cr_assert(strncmp(url, "ipc://", 6) == 0);
	cr_assert_lt(strlen(url + 6), sizeof(sa.sun_path));
	strcpy(sa.sun_path, url + 6);
	/* The listener may itself be in the middle of being replaced: retry briefly. */
	for (int i = 0; i < 100; i++) {
		int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		cr_assert_geq(fd, 0);
		int rv = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
		int e = errno;
		close(fd);
		if (rv == 0)
			return;
		cr_assert(e == ECONNREFUSED || e == ENOENT, "connect: %s", strerror(e));
		sleep_ms(10);
	}
	cr_assert_fail("never connected to %s", url);
}

/* Opens a client and calls ModelStatus until a reply comes or deadline_ms pass. For the moments
 * after nng's listener was replaced (listener_survives_early_hang_ups): a client may find no
 * listener (WF_EUNAVAILABLE), land on the old one and be dropped (WF_ETRANSPORT), or wait on it
 * (WF_ETIMEOUT). Returns the milliseconds it took; asserts that it was served. */
static int64_t serve_eventually(const char *url, const char *name, int deadline_ms)
{
	int64_t t0 = now_ms();
	int rv = -1;
	struct wf_diag d = {{0}};
	while (now_ms() - t0 < deadline_ms) {
		struct wf_ctl_client *c = NULL;
		wf_diag_clear(&d);
		rv = wf_ctl_client_open(url, 500, NULL, &c, &d);
		if (rv == 0) {
			Weightfloor__V1__Request req;
			Weightfloor__V1__ModelStatus ms;
			Weightfloor__V1__Reply *r = NULL;
			req_model_status(&req, &ms, name);
			rv = wf_ctl_client_call(c, &req, &r, &d);
			if (rv == WF_ETRANSPORT) /* the reconnect goes to the new listener */
				rv = wf_ctl_client_call(c, &req, &r, &d);
			if (rv == 0) {
				cr_expect_eq(r->code, ST(OK));
				wf_ctl_reply_free(r);
			}
			wf_ctl_client_close(c);
		}
		if (rv == 0)
			return now_ms() - t0;
		cr_log_info("%s: not yet: %s", name, wf_diag_str(&d, rv));
		sleep_ms(20);
	}
	cr_assert_fail("%s: not served within %d ms: %s", name, deadline_ms, wf_diag_str(&d, rv));
	return -1;
}

static struct wf_ctl_pub *make_pub(const char *dir)
{
	struct wf_ctl_pub_opts o = {0};
	struct wf_ctl_pub *pub = NULL;
	struct wf_diag d = {{0}};
	char *url = ipc_url(dir, "ev.sock");
	o.listen.url = url;
	int rv = wf_ctl_pub_create(&o, &pub, &d);
	free(url);
	cr_assert_eq(rv, 0, "pub: %s", wf_diag_str(&d, rv));
	return pub;
}

static struct wf_ctl_sub *make_sub(const char *url)
{
	struct wf_ctl_sub *sub = NULL;
	struct wf_diag d = {{0}};
	int rv = wf_ctl_sub_open(url, NULL, &sub, &d);
	cr_assert_eq(rv, 0, "sub: %s", wf_diag_str(&d, rv));
	return sub;
}

static uint64_t publish(struct wf_ctl_pub *pub, Weightfloor__V1__EventKind kind)
{
	Weightfloor__V1__Event ev = WEIGHTFLOOR__V1__EVENT__INIT;
	uint64_t seq = 0;
	ev.kind = kind;
	cr_assert_eq(wf_ctl_pub_publish(pub, &ev, &seq), 0);
	return seq;
}

static void sync_sub(struct wf_ctl_pub *pub, struct wf_ctl_sub *sub)
{
	Weightfloor__V1__Event *ev = NULL;
	int64_t until = now_ms() + 5000;
	bool live = false;
	while (!live && now_ms() < until) {
		publish(pub, KIND(WORKER));
		if (wf_ctl_sub_recv(sub, 20, &ev, NULL) == 0) {
			wf_ctl_event_free(ev);
			live = true;
		}
	}
	cr_assert(live, "subscription never became live");
	while (wf_ctl_sub_recv(sub, 100, &ev, NULL) == 0)
		wf_ctl_event_free(ev);
}

Test(listener, server_survives_early_hang_ups, .timeout = 60)
{
	char *dir = wft_tmpdir("lst");
	struct echo_state st = {0};
	struct wf_ctl_server *srv = echo_server(dir, "x.sock", &st, NULL);
	const char *url = wf_ctl_server_url(srv);
	/* A long-lived client connected before the trouble. */
	struct wf_ctl_client_opts co = {.wait_for_server = true};
	struct wf_ctl_client *old = open_client(url, 3000, &co);
	Weightfloor__V1__Reply *r = status_call(old, "before");
	wf_ctl_reply_free(r);

	for (int round = 0; round < 3; round++) {
		/* nng 1.5.2 stops accepting after this (nng #1518); the watchdog replaces the
		 * listener within WF__CTL_WATCH_MS. */
		hang_up_early(url);
		/* Served at all is the property (a dead listener never serves again); how soon
		 * (the watchdog's WF__CTL_WATCH_MS) depends on the machine's load. */
		int64_t dt = serve_eventually(url, "right-after", 10000);
		cr_log_info("round %d: served %lld ms after the hang-up", round, (long long)dt);
		hang_up_early(url);
		sleep_ms(300);
		dt = serve_eventually(url, "a-moment-later", 10000);
		cr_log_info("round %d: served %lld ms after a moment", round, (long long)dt);
	}
	/* The old client lost its connection with the old listener and reconnects; calls may fail
	 * with WF_ETRANSPORT on the way, never hang. */
	Weightfloor__V1__Request req;
	Weightfloor__V1__ModelStatus ms;
	struct wf_diag d = {{0}};
	req_model_status(&req, &ms, "old-client");
	int rv = -1;
	for (int i = 0; i < 5 && rv != 0; i++) {
		rv = wf_ctl_client_call(old, &req, &r, &d);
		if (rv != 0)
			cr_expect(rv == WF_ETRANSPORT || rv == WF_ETIMEOUT, "%s", wf_err_name(rv));
	}
	cr_expect_eq(rv, 0, "%s", wf_diag_str(&d, rv));
	if (rv == 0)
		wf_ctl_reply_free(r);
	wf_ctl_client_close(old);
	wf_ctl_server_destroy(srv);
	wft_rmtree(dir);
	free(dir);
}

Test(listener, second_server_on_the_same_path, .timeout = 60)
{
	char *dir = wft_tmpdir("lst");
	struct echo_state st = {0};
	struct wf_ctl_server_opts so = {0};
	bool root = geteuid() == 0;
	if (root)
		so.listen.ipc_group = 65534;
	struct wf_ctl_server *srv = echo_server(dir, "x.sock", &st, &so);
	char *path = NULL;
	cr_assert(asprintf(&path, "%s/x.sock", dir) > 0);
	struct stat sb;

	/* A second server on the same path is refused, and the first keeps its socket. */
	struct wf_ctl_server_opts o2 = {.handle = echo_handle, .ctx = &st};
	o2.listen.url = wf_ctl_server_url(srv);
	struct wf_ctl_server *srv2 = NULL;
	struct wf_diag d = {{0}};
	int rv = wf_ctl_server_create(&o2, &srv2, &d);
	cr_expect_eq(rv, -EADDRINUSE, "%s: %s", wf_err_name(rv), wf_diag_str(&d, rv));
	cr_expect_eq(stat(path, &sb), 0);
	/* nng's stale-socket probe behind that refusal connects and hangs up, which used to leave
	 * the first server deaf (nng #1518): it must still serve. */
	serve_eventually(wf_ctl_server_url(srv), "first-still-serves", 3000);
	/* The replacement listener's socket file gets the same mode and group (the group a moment
	 * after the bind). */
	int64_t until = now_ms() + 2000;
	while ((stat(path, &sb) != 0 || (root && sb.st_gid != 65534)) && now_ms() < until)
		sleep_ms(10);
	cr_expect_eq(sb.st_mode & 07777, 0660, "mode after a listener restart");
	if (root)
		cr_expect_eq(sb.st_gid, 65534, "group after a listener restart");

	wf_ctl_server_destroy(srv);
	free(path);
	wft_rmtree(dir);
	free(dir);
}

Test(listener, publisher_survives_early_hang_ups, .timeout = 30)
{
	char *dir = wft_tmpdir("lst");
	struct wf_ctl_pub *pub = make_pub(dir);
	const char *url = wf_ctl_pub_url(pub);
	/* Connect and hang up before the handshake (nng #1518 would stop the listener). */
	hang_up_early(url);
	sleep_ms(300);
	struct wf_ctl_sub *sub = make_sub(url);
	sync_sub(pub, sub);
	uint64_t s = publish(pub, KIND(FLOOR_STATE));
	Weightfloor__V1__Event *ev = NULL;
	cr_assert_eq(wf_ctl_sub_recv(sub, 2000, &ev, NULL), 0);
	cr_expect_eq(ev->sequence, s);
	wf_ctl_event_free(ev);
	wf_ctl_sub_close(sub);
	wf_ctl_pub_destroy(pub);
	wft_rmtree(dir);
	free(dir);
}
