/* The agent's worker registry and relay against hostile or broken workers: endpoints that are the
 * agent itself or not usable urls, a worker that accepts requests and never answers (the agent
 * must keep serving its own requests and fail the relays within their deadline), and model
 * paths that are relative. Real wf-agent processes (agt.h); the hung worker is an nng REP socket
 * in the test process that never replies. */
#include "base/error.h"
#include "common/wftest.h"
#include "proto/status.h"
#include "tests/agent/agt.h"

#include <criterion/criterion.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

TestSuite(relay, .fini = agt_fini, .timeout = 90);

static int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static Weightfloor__V1__Reply *register_worker(struct agt *a, const char *id, const char *endpoint)
{
	Weightfloor__V1__RegisterWorker rw = WEIGHTFLOOR__V1__REGISTER_WORKER__INIT;
	rw.worker_id = (char *)id;
	rw.endpoint = (char *)endpoint;
	rw.pid = (uint32_t)getpid();
	rw.device_name = "fake";
	Weightfloor__V1__Request req = WEIGHTFLOOR__V1__REQUEST__INIT;
	req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_REGISTER_WORKER;
	req.register_worker = &rw;
	return agt_call(a, &req, 5000);
}

/* A Pin for worker id on a client of its own; the outcome and how long it took. */
struct pin_call {
	const char *url, *worker;
	int timeout_ms;
	int rc;   /* of the call: 0 when a reply came */
	int code; /* the reply's */
	char msg[512];
	int64_t ms; /* elapsed */
};

static void *pin_thread(void *arg)
{
	struct pin_call *p = arg;
	struct wf_ctl_client *c = NULL;
	struct wf_diag d = {{0}};
	int64_t t0 = now_ms();
	p->rc = wf_ctl_client_open(p->url, p->timeout_ms, NULL, &c, &d);
	if (p->rc == 0) {
		Weightfloor__V1__Pin pin = WEIGHTFLOOR__V1__PIN__INIT;
		pin.model = "m";
		pin.worker_id = (char *)p->worker;
		Weightfloor__V1__Request req = WEIGHTFLOOR__V1__REQUEST__INIT;
		req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_PIN;
		req.pin = &pin;
		Weightfloor__V1__Reply *r = NULL;
		p->rc = wf_ctl_client_call_timeout(c, &req, p->timeout_ms, &r, &d);
		if (p->rc == 0) {
			p->code = r->code;
			snprintf(p->msg, sizeof p->msg, "%s", r->message);
		} else {
			snprintf(p->msg, sizeof p->msg, "%s", wf_diag_str(&d, p->rc));
		}
		wf_ctl_reply_free(r);
	}
	wf_ctl_client_close(c);
	p->ms = now_ms() - t0;
	return NULL;
}

/* One agent request with its own short timeout; asserts it answered OK within limit_ms. */
static void quick(struct agt *a, Weightfloor__V1__Request *req, int limit_ms, const char *what)
{
	Weightfloor__V1__Reply *r = NULL;
	struct wf_diag d = {{0}};
	int64_t t0 = now_ms();
	int rc = wf_ctl_client_call_timeout(a->cli, req, limit_ms, &r, &d);
	int64_t ms = now_ms() - t0;
	cr_assert_eq(rc, 0, "%s during the hung relays: %s (after %lld ms)", what,
	             wf_diag_str(&d, rc), (long long)ms);
	cr_expect_eq(r->code, WEIGHTFLOOR__V1__STATUS__STATUS_OK, "%s: %s", what, r->message);
	cr_expect_lt(ms, limit_ms, "%s took %lld ms", what, (long long)ms);
	wf_ctl_reply_free(r);
}

Test(relay, hung_worker_does_not_starve_the_agent)
{
	struct agt *a = agt_new("relay-hung");
	agt_start(a, NULL, NULL);

	/* Accepts connections and requests, never replies. */
	char url[512];
	snprintf(url, sizeof url, "ipc://%s/hung.sock", a->run);
	nng_socket rep;
	cr_assert_eq(nng_rep0_open(&rep), 0);
	cr_assert_eq(nng_listen(rep, url, NULL, 0), 0);

	Weightfloor__V1__Reply *r = register_worker(a, "hung", url);
	cr_assert_eq(r->code, WEIGHTFLOOR__V1__STATUS__STATUS_OK, "%s", r->message);
	wf_ctl_reply_free(r);

	enum { N = 8, DEADLINE = 6000 };
	struct pin_call pins[N];
	pthread_t th[N];
	for (int i = 0; i < N; i++) {
		pins[i] =
		    (struct pin_call){.url = a->sock_url, .worker = "hung", .timeout_ms = DEADLINE};
		cr_assert_eq(pthread_create(&th[i], NULL, pin_thread, &pins[i]), 0);
	}
	/* While the relays hang, the agent's own requests answer at once. */
	int64_t end = now_ms() + DEADLINE;
	int rounds = 0;
	while (now_ms() < end) {
		Weightfloor__V1__AgentStatus as = WEIGHTFLOOR__V1__AGENT_STATUS__INIT;
		Weightfloor__V1__Request req = WEIGHTFLOOR__V1__REQUEST__INIT;
		req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_AGENT_STATUS;
		req.agent_status = &as;
		quick(a, &req, 2000, "AgentStatus");
		Weightfloor__V1__ListModels lm = WEIGHTFLOOR__V1__LIST_MODELS__INIT;
		req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_LIST_MODELS;
		req.list_models = &lm;
		quick(a, &req, 2000, "ListModels");
		Weightfloor__V1__ListWorkers lw = WEIGHTFLOOR__V1__LIST_WORKERS__INIT;
		req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_LIST_WORKERS;
		req.list_workers = &lw;
		quick(a, &req, 2000, "ListWorkers");
		rounds++;
		agt_sleep_ms(100);
	}
	cr_expect_gt(rounds, 5);
	int relayed = 0;
	for (int i = 0; i < N; i++) {
		pthread_join(th[i], NULL);
		/* Every Pin gets an answer (from the agent, not the client's time-out), an error
		 * that says what happened, within its deadline. */
		cr_expect_eq(pins[i].rc, 0, "pin %d: no reply: %s", i, pins[i].msg);
		cr_expect(pins[i].code == WEIGHTFLOOR__V1__STATUS__STATUS_UNAVAILABLE ||
		              pins[i].code == WEIGHTFLOOR__V1__STATUS__STATUS_RESOURCE_EXHAUSTED,
		          "pin %d: %s %s", i, wf_proto_status_name(pins[i].code), pins[i].msg);
		cr_expect(strstr(pins[i].msg, "hung") != NULL, "pin %d names the worker: %s", i,
		          pins[i].msg);
		relayed += strstr(pins[i].msg, "no answer within") != NULL;
	}
	cr_expect_gt(relayed, 0, "some Pins were relayed and timed out at the worker");
	cr_expect_lt(relayed, N, "not all: the rest were refused at once");
	nng_close(rep);
}

Test(relay, own_sockets_and_bad_urls_are_refused_as_endpoints)
{
	struct agt *a = agt_new("relay-self");
	agt_start(a, NULL, NULL);
	char alias[600], rel[600];
	snprintf(alias, sizeof alias, "ipc://%s/../run/./agent.sock", a->run);
	snprintf(rel, sizeof rel, "ipc://run/agent.sock");
	const char *bad[] = {a->sock_url,
	                     a->ev_url,
	                     alias,
	                     rel,
	                     "inproc://w",
	                     "tcp://127.0.0.1:7000",
	                     "tls+tcp://nohost",
	                     "tls+tcp://h:0",
	                     "ipc:///run/with space.sock",
	                     "hello"};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		Weightfloor__V1__Reply *r = register_worker(a, "self", bad[i]);
		cr_expect_eq(r->code, WEIGHTFLOOR__V1__STATUS__STATUS_INVALID_ARGUMENT,
		             "endpoint %s: %s %s", bad[i], wf_proto_status_name(r->code),
		             r->message);
		wf_ctl_reply_free(r);
	}
	/* Nothing was registered: a Pin for it is answered at once, not relayed to ourselves. */
	struct pin_call p = {.url = a->sock_url, .worker = "self", .timeout_ms = 5000};
	pin_thread(&p);
	cr_expect_eq(p.rc, 0, "%s", p.msg);
	/* Relayed to ourselves, it would have hung to the client's 5 s time-out instead. */
	cr_expect_eq(p.code, WEIGHTFLOOR__V1__STATUS__STATUS_NOT_FOUND, "%s", p.msg);

	/* A good endpoint still registers. */
	char ok[600];
	snprintf(ok, sizeof ok, "ipc://%s/w0.sock", a->run);
	Weightfloor__V1__Reply *r = register_worker(a, "w0", ok);
	cr_expect_eq(r->code, WEIGHTFLOOR__V1__STATUS__STATUS_OK, "%s", r->message);
	wf_ctl_reply_free(r);
	r = register_worker(a, "w1", "tls+tcp://[::1]:7443");
	cr_expect_eq(r->code, WEIGHTFLOOR__V1__STATUS__STATUS_OK, "%s", r->message);
	wf_ctl_reply_free(r);
}
