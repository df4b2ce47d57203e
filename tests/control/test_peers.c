/* Peer authentication with real processes: a helper (ctl_peer_helper) that drops to another uid
 * before it connects (needs root; skipped otherwise), and TLS with certificates made by openssl.
 * Criterion's test processes already run nng, which refuses to work in a forked child, so the
 * peers are separate programs started with posix_spawn. */
#include "tests/control/ctl_test.h"

#include "base/error.h"
#include "common/wftest.h"
#include "control/pub.h"
#include "proto/status.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <nng/nng.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

/* What the helper prints: a return code (< 0), or REPLY_BASE + Status of the reply. */
#define REPLY_BASE 1000

static void require_root(void)
{
	if (geteuid() != 0)
		cr_skip_test("needs root to run peers under other uids");
}

struct bg_pub {
	struct wf_ctl_pub *pub;
	atomic_bool stop;
};

/* Keeps publishing while a subscriber peer runs: PUB keeps no history. */
static void *bg_publish(void *p)
{
	struct bg_pub *b = p;
	while (!atomic_load(&b->stop)) {
		Weightfloor__V1__Event ev = WEIGHTFLOOR__V1__EVENT__INIT;
		ev.kind = WEIGHTFLOOR__V1__EVENT_KIND__EVENT_KIND_WORKER;
		wf_ctl_pub_publish(b->pub, &ev, NULL);
		sleep_ms(10);
	}
	return NULL;
}

/* Runs the helper as uid:gid and returns what it printed. pub, if set, publishes meanwhile. */
static int run_peer(const char *dir, uid_t uid, gid_t gid, const char *what, const char *url,
                    struct wf_ctl_pub *pub)
{
	char suid[16], sgid[16];
	snprintf(suid, sizeof(suid), "%u", (unsigned)uid);
	snprintf(sgid, sizeof(sgid), "%u", (unsigned)gid);
	char *exe = wft_exe("tests/control/ctl_peer_helper");
	char *argv[] = {exe, suid, sgid, (char *)what, (char *)url, NULL};
	char *out = NULL;
	cr_assert(asprintf(&out, "%s/peer.out", dir) > 0);
	struct bg_pub b = {.pub = pub};
	pthread_t t;
	if (pub)
		pthread_create(&t, NULL, bg_publish, &b);
	int rc = wft_run(argv, out, NULL, 30);
	if (pub) {
		atomic_store(&b.stop, true);
		pthread_join(t, NULL);
	}
	cr_assert_eq(rc, 0, "%s exited with %d", exe, rc);
	free(exe);
	char *text = wft_read_file(out, NULL);
	cr_assert_not_null(text);
	int v = atoi(text);
	free(text);
	free(out);
	return v;
}

static const char *result_name(int v)
{
	static char buf[64];
	if (v >= REPLY_BASE)
		snprintf(buf, sizeof(buf), "reply %s", wf_proto_status_name(v - REPLY_BASE));
	else
		snprintf(buf, sizeof(buf), "error %s", wf_err_name(v));
	return buf;
}

Test(peers, server_checks_peer_uid_and_gid, .timeout = 60)
{
	require_root();
	char *dir = wft_tmpdir("peers");
	cr_assert_eq(chmod(dir, 0755), 0);
	struct echo_state st = {0};
	static const uid_t uids[] = {65533};
	static const gid_t gids[] = {4242};
	/* A world-connectable socket file, so that only the uid/gid policy stands in the way. */
	struct wf_ctl_server_opts so = {0};
	so.listen.ipc_mode = 0666;
	so.listen.allowed_uids = uids;
	so.listen.n_allowed_uids = 1;
	so.listen.allowed_gids = gids;
	so.listen.n_allowed_gids = 1;
	struct wf_ctl_server *srv = echo_server(dir, "x.sock", &st, &so);
	const char *url = wf_ctl_server_url(srv);

	int v = run_peer(dir, 65534, 65534, "call", url, NULL);
	cr_expect_eq(v, REPLY_BASE + ST(PERMISSION_DENIED), "uid 65534: %s", result_name(v));
	cr_expect_eq(atomic_load(&st.calls), 0, "the handler never sees a denied peer");

	v = run_peer(dir, 65533, 65533, "call", url, NULL);
	cr_expect_eq(v, REPLY_BASE + ST(OK), "uid 65533: %s", result_name(v));
	cr_expect_eq(atomic_load(&st.last_uid), 65533);
	cr_expect_gt(atomic_load(&st.last_pid), 0, "peer pid from SO_PEERCRED");
	cr_expect_neq(atomic_load(&st.last_pid), getpid());

	v = run_peer(dir, 65534, 4242, "call", url, NULL);
	cr_expect_eq(v, REPLY_BASE + ST(OK), "gid 4242: %s", result_name(v));
	cr_expect_eq(atomic_load(&st.calls), 2);

	/* Root is always allowed, and so is the server's own uid (root here too). */
	v = run_peer(dir, 0, 0, "call", url, NULL);
	cr_expect_eq(v, REPLY_BASE + ST(OK), "root: %s", result_name(v));
	wf_ctl_server_destroy(srv);
	wft_rmtree(dir);
	free(dir);
}

Test(peers, socket_file_mode_keeps_others_out, .timeout = 60)
{
	require_root();
	char *dir = wft_tmpdir("peers");
	cr_assert_eq(chmod(dir, 0755), 0);
	struct echo_state st = {0};
	static const uid_t uids[] = {65534};
	/* The policy would admit 65534, but the default 0660 root:root file does not. */
	struct wf_ctl_server_opts so = {0};
	so.listen.allowed_uids = uids;
	so.listen.n_allowed_uids = 1;
	struct wf_ctl_server *srv = echo_server(dir, "x.sock", &st, &so);
	int v = run_peer(dir, 65534, 65534, "call", wf_ctl_server_url(srv), NULL);
	cr_expect_eq(v, WF_EPERMISSION, "%s", result_name(v));
	wf_ctl_server_destroy(srv);
	wft_rmtree(dir);
	free(dir);
}

Test(peers, publisher_drops_denied_subscribers, .timeout = 60)
{
	require_root();
	char *dir = wft_tmpdir("peers");
	cr_assert_eq(chmod(dir, 0755), 0);
	static const uid_t uids[] = {65533};
	struct wf_ctl_pub_opts po = {0};
	char *url = ipc_url(dir, "ev.sock");
	po.listen.url = url;
	po.listen.ipc_mode = 0666;
	po.listen.allowed_uids = uids;
	po.listen.n_allowed_uids = 1;
	struct wf_ctl_pub *pub = NULL;
	struct wf_diag d = {{0}};
	cr_assert_eq(wf_ctl_pub_create(&po, &pub, &d), 0, "%s", d.msg);

	int v = run_peer(dir, 65533, 65533, "sub", wf_ctl_pub_url(pub), pub);
	cr_expect_eq(v, 0, "allowed subscriber: %s", result_name(v));

	v = run_peer(dir, 65534, 65534, "sub", wf_ctl_pub_url(pub), pub);
	cr_expect_neq(v, 0, "a denied subscriber must not receive events");
	cr_log_info("denied subscriber sees: %s", result_name(v));

	/* Refused peers must not hide a hang-up before the handshake (nng #1518) from the listener
	 * watchdog: refuse a few more, hang up early, and an allowed subscriber still gets in. */
	for (int i = 0; i < 3; i++)
		run_peer(dir, 65534, 65534, "sub", wf_ctl_pub_url(pub), NULL);
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	strcpy(sa.sun_path, wf_ctl_pub_url(pub) + 6);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0, "%s", strerror(errno));
	close(fd);
	sleep_ms(500);
	v = run_peer(dir, 65533, 65533, "sub", wf_ctl_pub_url(pub), pub);
	cr_expect_eq(v, 0, "allowed subscriber after refusals and a hang-up: %s", result_name(v));
	wf_ctl_pub_destroy(pub);
	free(url);
	wft_rmtree(dir);
	free(dir);
}

Test(peers, foreign_client_with_an_oversized_request, .timeout = 60)
{
	char *dir = wft_tmpdir("peers");
	struct echo_state st = {0};
	struct wf_ctl_server_opts so = {.max_request_size = 64 << 10};
	struct wf_ctl_server *srv = echo_server(dir, "x.sock", &st, &so);
	/* A plain nng REQ socket with nng's defaults: the server's transport drops each copy of the
	 * message, nng resends after every reconnect, and the client sees its own timeout. */
	int v = run_peer(dir, geteuid(), getegid(), "raw-big", wf_ctl_server_url(srv), NULL);
	cr_expect_eq(v, NNG_ETIMEDOUT, "foreign client saw nng error %d (%s)", v, nng_strerror(v));
	cr_log_info("foreign client, oversized request: %s", nng_strerror(v));
	/* The server serves on. */
	struct wf_ctl_client *c = NULL;
	struct wf_diag d = {{0}};
	int rv = wf_ctl_client_open(wf_ctl_server_url(srv), 3000, NULL, &c, &d);
	cr_assert_eq(rv, 0, "%s", wf_diag_str(&d, rv));
	Weightfloor__V1__Request req;
	Weightfloor__V1__ModelStatus ms;
	Weightfloor__V1__Reply *r = NULL;
	req_model_status(&req, &ms, "after-foreign");
	rv = wf_ctl_client_call(c, &req, &r, &d);
	if (rv == WF_ETRANSPORT) /* connected while the listener was being replaced */
		rv = wf_ctl_client_call(c, &req, &r, &d);
	cr_expect_eq(rv, 0, "%s", wf_diag_str(&d, rv));
	if (rv == 0)
		wf_ctl_reply_free(r);
	wf_ctl_client_close(c);
	wf_ctl_server_destroy(srv);
	wft_rmtree(dir);
	free(dir);
}

/* ---- TLS ------------------------------------------------------------------------------------ */

static int sh(const char *dir, const char *cmd)
{
	char *full = NULL;
	cr_assert(asprintf(&full, "cd '%s' && %s", dir, cmd) > 0);
	char *argv[] = {"/bin/sh", "-c", full, NULL};
	char *log = NULL;
	cr_assert(asprintf(&log, "%s/openssl.log", dir) > 0);
	int rv = wft_run(argv, log, log, 60);
	free(full);
	free(log);
	return rv;
}

/* A CA, a server certificate for localhost/127.0.0.1 and a client certificate, all P-256. */
static void make_certs(const char *dir)
{
	if (access("/usr/bin/openssl", X_OK) != 0)
		cr_skip_test("openssl not installed");
	static const char *const cmds[] = {
	    "printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\n' > srv.ext",
	    "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
	    "-keyout ca.key -out ca.pem -days 2 -subj /CN=wf-test-ca",
	    "openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
	    "-keyout srv.key -out srv.csr -subj /CN=localhost",
	    "openssl x509 -req -in srv.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
	    "-out srv.crt -days 2 -extfile srv.ext",
	    "openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
	    "-keyout cli.key -out cli.csr -subj /CN=wf-control-plane",
	    "openssl x509 -req -in cli.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
	    "-out cli.crt -days 2",
	    "cat srv.crt srv.key > srv.pem && cat cli.crt cli.key > cli.pem",
	};
	for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++)
		cr_assert_eq(sh(dir, cmds[i]), 0, "%s (see %s/openssl.log)", cmds[i], dir);
}

static char *path_in(const char *dir, const char *name)
{
	char *p = NULL;
	cr_assert(asprintf(&p, "%s/%s", dir, name) > 0);
	return p;
}

Test(peers, tls_with_client_certificates, .timeout = 120)
{
	if (!wf_ctl_tls_available())
		cr_skip_test("nng built without TLS");
	char *dir = wft_tmpdir("tls");
	make_certs(dir);
	char *ca = path_in(dir, "ca.pem"), *srv_pem = path_in(dir, "srv.pem"),
	     *cli_pem = path_in(dir, "cli.pem");
	struct echo_state st = {0};
	struct wf_diag d = {{0}};
	int rv;

	/* A TLS listener without a CA would let anyone in: refused unless insecure. */
	struct wf_ctl_server_opts so = {.handle = echo_handle, .ctx = &st};
	struct wf_ctl_server *srv = NULL;
	so.listen.url = "tls+tcp://127.0.0.1:0";
	so.listen.tls.cert_key_file = srv_pem;
	rv = wf_ctl_server_create(&so, &srv, &d);
	cr_expect_eq(rv, WF_EINVAL, "%s: %s", wf_err_name(rv), d.msg);

	so.listen.tls.ca_file = ca;
	srv = echo_server(NULL, NULL, &st, &so);
	const char *url = wf_ctl_server_url(srv);
	cr_expect(strncmp(url, "tls+tcp://127.0.0.1:", 20) == 0, "%s", url);

	/* A verified client with its certificate. */
	struct wf_ctl_client_opts co = {0};
	co.tls.ca_file = ca;
	co.tls.cert_key_file = cli_pem;
	co.tls.server_name = "localhost";
	struct wf_ctl_client *c = NULL;
	wf_diag_clear(&d);
	rv = wf_ctl_client_open(url, 5000, &co, &c, &d);
	cr_assert_eq(rv, 0, "%s", wf_diag_str(&d, rv));
	Weightfloor__V1__Request req;
	Weightfloor__V1__ModelStatus ms;
	Weightfloor__V1__Reply *r = NULL;
	req_model_status(&req, &ms, "over-tls");
	wf_diag_clear(&d);
	rv = wf_ctl_client_call(c, &req, &r, &d);
	cr_assert_eq(rv, 0, "%s", wf_diag_str(&d, rv));
	cr_expect_eq(r->code, ST(OK));
	cr_expect_str_eq(r->model_info->name, "over-tls");
	wf_ctl_reply_free(r);
	cr_expect_eq(atomic_load(&st.last_transport), WF_CTL_TRANSPORT_TLS);
	cr_expect(atomic_load(&st.last_tls_verified));
	wf_ctl_client_close(c);

	/* No CA on the client side: refused before connecting. */
	struct wf_ctl_client_opts noca = {0};
	noca.tls.cert_key_file = cli_pem;
	cr_expect_eq(wf_ctl_client_open(url, 1000, &noca, &c, NULL), WF_EINVAL);

	/* A client without a certificate does not get a request through. */
	struct wf_ctl_client_opts nocert = {0};
	nocert.tls.ca_file = ca;
	nocert.tls.server_name = "localhost";
	int calls = atomic_load(&st.calls);
	wf_diag_clear(&d);
	rv = wf_ctl_client_open(url, 1000, &nocert, &c, &d);
	if (rv == 0) {
		req_model_status(&req, &ms, "no-cert");
		rv = wf_ctl_client_call(c, &req, &r, &d);
		if (rv == 0)
			wf_ctl_reply_free(r);
		wf_ctl_client_close(c);
	}
	cr_expect_neq(rv, 0, "a client without a certificate was served");
	cr_expect_eq(atomic_load(&st.calls), calls);
	cr_log_info("tls client without certificate: %s (%s)", wf_err_name(rv),
	            wf_diag_str(&d, rv));

	/* A server certificate for another name is not accepted. */
	struct wf_ctl_client_opts wrong = co;
	wrong.tls.server_name = "not-this-host";
	wf_diag_clear(&d);
	rv = wf_ctl_client_open(url, 1000, &wrong, &c, &d);
	if (rv == 0) {
		rv = wf_ctl_client_call(c, &req, &r, &d);
		if (rv == 0)
			wf_ctl_reply_free(r);
		wf_ctl_client_close(c);
	}
	cr_expect_neq(rv, 0, "server name mismatch accepted");

	wf_ctl_server_destroy(srv);
	free(ca);
	free(srv_pem);
	free(cli_pem);
	wft_rmtree(dir);
	free(dir);
}
