/* The HTTP endpoint (http/server.h) in this process on a free localhost port: addresses, the
 * routes and their status codes, the probes, and hostile input (malformed, oversized, partial
 * and random requests, more connections than allowed), after each of which the server must
 * still answer. */
#include "base/error.h"
#include "http/server.h"
#include "tests/http/httpc.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static uint16_t port_of(const struct sockaddr_storage *ss)
{
	return ntohs(ss->ss_family == AF_INET6 ? ((const struct sockaddr_in6 *)ss)->sin6_port
	                                       : ((const struct sockaddr_in *)ss)->sin_port);
}

Test(http_server, addresses)
{
	struct sockaddr_storage ss;
	socklen_t sl;
	struct wf_diag d = {{0}};
	cr_assert_eq(wf_http_addr_parse(":9400", &ss, &sl, &d), 0);
	cr_assert_eq(ss.ss_family, AF_INET);
	cr_assert_eq(((struct sockaddr_in *)&ss)->sin_addr.s_addr, htonl(INADDR_LOOPBACK));
	cr_assert_eq(port_of(&ss), 9400);
	cr_assert_eq(wf_http_addr_parse("0.0.0.0:0", &ss, &sl, &d), 0);
	cr_assert_eq(((struct sockaddr_in *)&ss)->sin_addr.s_addr, htonl(INADDR_ANY));
	cr_assert_eq(wf_http_addr_parse("[::1]:65535", &ss, &sl, &d), 0);
	cr_assert_eq(ss.ss_family, AF_INET6);
	cr_assert_eq(port_of(&ss), 65535);
	cr_assert_eq(wf_http_addr_parse("localhost:1", &ss, &sl, &d), 0); /* no resolver needed */
	cr_assert_eq(ss.ss_family, AF_INET);
	cr_assert_eq(((struct sockaddr_in *)&ss)->sin_addr.s_addr, htonl(INADDR_LOOPBACK));
	const char *bad[] = {"9400", ":",      ":65536",  ":-1",        ":+1",
	                     ":12x", "::1:80", "[::1:80", "127.0.0.1:", ""};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
		cr_assert_eq(wf_http_addr_parse(bad[i], &ss, &sl, &d), WF_EINVAL, "'%s'", bad[i]);
	cr_assert_eq(wf_http_addr_parse("no-such-host.invalid:80", &ss, &sl, &d), WF_ENOT_FOUND);
}

struct fixture {
	struct wf_metrics *reg;
	struct wf_http_server *srv;
	uint16_t port;
	bool live, ready;
	char why[64];
};

static bool live_fn(void *ctx, char *reason, size_t len)
{
	struct fixture *f = ctx;
	if (!f->live)
		snprintf(reason, len, "%s", f->why);
	return f->live;
}

static bool ready_fn(void *ctx, char *reason, size_t len)
{
	struct fixture *f = ctx;
	if (!f->ready)
		snprintf(reason, len, "%s", f->why);
	return f->ready;
}

static void start(struct fixture *f)
{
	memset(f, 0, sizeof(*f));
	f->live = f->ready = true;
	struct wf_metric *c;
	cr_assert_eq(wf_metrics_create(&f->reg), 0);
	cr_assert_eq(wf_metrics_add(f->reg, WF_METRIC_COUNTER, "wf_test_total", "A test counter.",
	                            NULL, NULL, 0, &c),
	             0);
	cr_assert_eq(wf_metric_add(c, NULL, 5), 0);
	struct wf_http_opts o = {
	    .addr = "127.0.0.1:0", .metrics = f->reg, .live = live_fn, .ready = ready_fn, .ctx = f};
	struct wf_diag d = {{0}};
	int rc = wf_http_server_start(&o, &f->srv, &d);
	cr_assert_eq(rc, 0, "%s", wf_diag_str(&d, rc));
	f->port = wf_http_server_port(f->srv);
	cr_assert_gt(f->port, 0);
}

static void stop(struct fixture *f)
{
	wf_http_server_destroy(f->srv);
	wf_metrics_destroy(f->reg);
}

static int get(struct fixture *f, const char *method, const char *path, struct httpc_reply *r)
{
	cr_assert_eq(httpc_request(f->port, method, path, 5000, r), 0, "%s %s: no connection",
	             method, path);
	return r->status;
}

static void expect_alive(struct fixture *f, const char *after)
{
	struct httpc_reply r;
	cr_assert_eq(httpc_request(f->port, "GET", "/healthz", 5000, &r), 0,
	             "no connection after %s", after);
	cr_assert_eq(r.status, 200, "after %s: %s", after, r.head);
	cr_assert_str_eq(r.body, "ok\n");
	httpc_reply_fini(&r);
}

Test(http_server, routes_and_status_codes)
{
	struct fixture f;
	start(&f);
	struct httpc_reply r;
	cr_assert_eq(get(&f, "GET", "/metrics", &r), 200);
	cr_assert_not_null(strstr(r.head, "Content-Type: text/plain; version=0.0.4; charset=utf-8"),
	                   "%s", r.head);
	cr_assert_not_null(strstr(r.body, "# TYPE wf_test_total counter\nwf_test_total 5\n"), "%s",
	                   r.body);
	httpc_reply_fini(&r);
	cr_assert_eq(get(&f, "GET", "/metrics?name[]=x", &r), 200, "a query string is ignored");
	httpc_reply_fini(&r);
	cr_assert_eq(get(&f, "HEAD", "/metrics", &r), 200);
	cr_assert_eq(r.body_len, 0, "HEAD has no body");
	httpc_reply_fini(&r);
	cr_assert_eq(get(&f, "GET", "/healthz", &r), 200);
	cr_assert_str_eq(r.body, "ok\n");
	httpc_reply_fini(&r);

	/* Not ready until the daemon says so, whatever the callback says. */
	cr_assert_eq(get(&f, "GET", "/readyz", &r), 503);
	cr_assert_str_eq(r.body, "starting\n");
	httpc_reply_fini(&r);
	wf_http_server_set_ready(f.srv, true, NULL);
	cr_assert_eq(get(&f, "GET", "/readyz", &r), 200);
	cr_assert_str_eq(r.body, "ready\n");
	httpc_reply_fini(&r);
	f.ready = false;
	snprintf(f.why, sizeof f.why, "not registered\nwith the agent");
	cr_assert_eq(get(&f, "GET", "/readyz", &r), 503);
	cr_assert_str_eq(r.body, "not registered with the agent\n", "one line");
	httpc_reply_fini(&r);
	f.ready = true;
	wf_http_server_set_ready(f.srv, false, "stopping");
	cr_assert_eq(get(&f, "GET", "/readyz", &r), 503);
	cr_assert_str_eq(r.body, "stopping\n");
	httpc_reply_fini(&r);

	f.live = false;
	snprintf(f.why, sizeof f.why, "loop stuck");
	cr_assert_eq(get(&f, "GET", "/healthz", &r), 503);
	cr_assert_str_eq(r.body, "loop stuck\n");
	httpc_reply_fini(&r);
	f.live = true;

	const char *methods[] = {"POST", "PUT", "DELETE", "OPTIONS", "PATCH", "BREW"};
	for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++) {
		cr_assert_eq(get(&f, methods[i], "/metrics", &r), 405, "%s", methods[i]);
		cr_assert_not_null(strstr(r.head, "Allow: GET, HEAD"), "%s", r.head);
		httpc_reply_fini(&r);
	}
	/* (libmicrohttpd unescapes the path: "/readyz%00" is "/readyz", which is harmless.) */
	const char *paths[] = {"/",           "/metrics/",   "/METRICS", "/healthz/x",
	                       "/../metrics", "/metrics%2f", "*"};
	for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
		int st = get(&f, "GET", paths[i], &r);
		cr_assert(st == 404 || st == 400, "%s: %d", paths[i], st);
		httpc_reply_fini(&r);
	}
	stop(&f);
}

Test(http_server, a_port_in_use_is_refused_with_its_errno)
{
	struct fixture f;
	start(&f);
	char addr[32];
	snprintf(addr, sizeof addr, "127.0.0.1:%u", (unsigned)f.port);
	struct wf_http_opts o = {.addr = addr, .metrics = f.reg};
	struct wf_http_server *s2 = NULL;
	struct wf_diag d = {{0}};
	cr_assert_eq(wf_http_server_start(&o, &s2, &d), -EADDRINUSE);
	cr_assert_not_null(strstr(wf_diag_str(&d, -EADDRINUSE), addr));
	stop(&f);
}

static void send_raw(struct fixture *f, const void *bytes, size_t len, const char *what)
{
	size_t n = 0;
	char *back = httpc_raw(f->port, bytes, len, 3000, &n);
	free(back);
	expect_alive(f, what);
}

Test(http_server, hostile_requests_never_stop_it)
{
	struct fixture f;
	start(&f);
	static const char *const cases[] = {
	    "",
	    "\r\n\r\n",
	    "GET\r\n\r\n",
	    "GET /metrics\r\n\r\n",
	    "GET /metrics HTTP/9.9\r\n\r\n",
	    "GET /metrics HTTP/1.1\r\n\r\n", /* no Host */
	    "GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
	    "GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n\r\n",
	    "GET /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nZZZ\r\n",
	    "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\nabc",
	    "GET /metrics HTTP/1.1\r\nHost: x\r\n: no-name\r\n\r\n",
	    "GET /metrics HTTP/1.1\r\nHost: x\r\nX: \x01\x02\x7f\r\n\r\n",
	    "GET /me\ttrics HTTP/1.0\r\n\r\n",
	    "GET /metrics HTTP/1.0\n\n",
	    "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", /* a TLS ClientHello's start */
	    "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
		send_raw(&f, cases[i], strlen(cases[i]), cases[i]);
	/* NUL bytes inside the request line and headers. */
	static const char nul[] = "GET /met\0rics HTTP/1.0\r\nHo\0st: x\r\n\r\n";
	send_raw(&f, nul, sizeof nul - 1, "NUL bytes");
	/* A request line and a header far beyond the connection's memory. */
	size_t big = 256 * 1024;
	char *b = malloc(big + 64);
	memset(b, 'a', big + 64);
	memcpy(b, "GET /", 5);
	memcpy(b + big, " HTTP/1.0\r\n\r\n", 13);
	send_raw(&f, b, big + 13, "a 256 KiB request line");
	memcpy(b, "GET /metrics HTTP/1.0\r\nX-Big: ", 30);
	send_raw(&f, b, big + 13, "a 256 KiB header");
	/* Many small headers. */
	size_t n = 0;
	n += (size_t)sprintf(b, "GET /metrics HTTP/1.0\r\n");
	while (n < big)
		n += (size_t)sprintf(b + n, "H%zu: v\r\n", n);
	n += (size_t)sprintf(b + n, "\r\n");
	send_raw(&f, b, n, "thousands of headers");
	free(b);
	stop(&f);
}

Test(http_server, random_and_mutated_requests_never_stop_it)
{
	struct fixture f;
	start(&f);
	/* Seeded, so a failure is reproducible: WF_TEST_SEED overrides. */
	unsigned seed =
	    getenv("WF_TEST_SEED") ? (unsigned)strtoul(getenv("WF_TEST_SEED"), NULL, 0) : 1313u;
	srand(seed);
	static const char base[] =
	    "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: */*\r\n\r\n";
	char buf[512];
	for (int t = 0; t < 300; t++) {
		size_t len;
		if (t % 2) {
			len = (size_t)(rand() % (int)sizeof buf);
			for (size_t i = 0; i < len; i++)
				buf[i] = (char)(rand() & 0xff);
		} else {
			len = sizeof base - 1;
			memcpy(buf, base, len);
			for (int k = 0; k < 1 + rand() % 8; k++)
				buf[rand() % (int)len] = (char)(rand() & 0xff);
		}
		size_t got = 0;
		char *back = httpc_raw(f.port, buf, len, 2000, &got);
		cr_assert_not_null(back, "trial %d (seed %u): connection refused", t, seed);
		free(back);
	}
	expect_alive(&f, "300 random and mutated requests");
	stop(&f);
}

Test(http_server, more_connections_than_allowed_do_not_stop_it)
{
	struct fixture f;
	start(&f);
	int fds[64];
	for (int i = 0; i < 64; i++) {
		fds[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(f.port)};
		sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		(void)connect(fds[i], (struct sockaddr *)&sa, sizeof sa);
		/* Half a request: each holds a slot until it is closed (or times out). */
		(void)send(fds[i], "GET /metr", 9, MSG_NOSIGNAL);
	}
	for (int i = 0; i < 64; i++)
		close(fds[i]);
	/* The slots come back as the server sees the closes. */
	struct httpc_reply r;
	int status = 0;
	for (int tries = 0; tries < 100 && status != 200; tries++) {
		if (httpc_request(f.port, "GET", "/healthz", 2000, &r) == 0) {
			status = r.status;
			httpc_reply_fini(&r);
		}
		if (status != 200)
			usleep(20000);
	}
	cr_assert_eq(status, 200);
	stop(&f);
}
