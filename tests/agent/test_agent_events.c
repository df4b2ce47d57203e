/* Residency events end to end: a real wf-worker (host device) reports its cache's changes to a
 * real wf-agent (ReportResidency), the agent publishes them as RESIDENCY events with the
 * worker's id, and `agentctl watch` prints them; ReportResidency from an id the agent does not
 * know is refused. */
#include "base/error.h"
#include "common/wftest.h"
#include "proto/status.h"
#include "tests/agent/agt.h"

#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

TestSuite(agent_events, .fini = agt_fini, .timeout = 120);

#define RES(x)     WEIGHTFLOOR__V1__RESIDENCY__RESIDENCY_##x
#define KIND(x)    WEIGHTFLOOR__V1__EVENT_KIND__EVENT_KIND_##x
#define REPORT_MAX 256 /* changes per ReportResidency, docs/PROTOCOL.md */

static char *slurp(const char *path)
{
	char *t = wft_read_file(path, NULL);
	return t ? t : strdup("");
}

/* Reads events until one of kind from worker_id (and model, state when given) arrives; asserts
 * within 20 s, with the worker's log. */
static Weightfloor__V1__Event *wait_event(struct wf_ctl_sub *sub, Weightfloor__V1__EventKind kind,
                                          const char *worker_id, const char *model,
                                          Weightfloor__V1__Residency state, const char *log)
{
	int64_t end = agt_now_ms() + 20000;
	while (agt_now_ms() < end) {
		Weightfloor__V1__Event *ev = NULL;
		struct wf_diag d = {{0}};
		int rc = wf_ctl_sub_recv(sub, 200, &ev, &d);
		if (rc == WF_ETIMEOUT)
			continue;
		cr_assert_eq(rc, 0, "sub recv: %s", wf_diag_str(&d, rc));
		bool mine = ev->worker_id && strcmp(ev->worker_id, worker_id) == 0;
		if (mine && ev->kind == kind && (!model || strcmp(ev->model, model) == 0) &&
		    (!state || ev->residency == state))
			return ev;
		wf_ctl_event_free(ev);
	}
	char *l = slurp(log);
	cr_assert_fail("no event kind %d worker %s model %s state %d in 20 s; worker log:\n%s",
	               (int)kind, worker_id, model ? model : "-", (int)state, l);
	return NULL;
}

static Weightfloor__V1__Reply *worker_cmd(struct agt *a, Weightfloor__V1__Request__BodyCase what,
                                          const char *model, const char *worker_id)
{
	Weightfloor__V1__Request req = WEIGHTFLOOR__V1__REQUEST__INIT;
	Weightfloor__V1__Pin pin = WEIGHTFLOOR__V1__PIN__INIT;
	Weightfloor__V1__Unpin unpin = WEIGHTFLOOR__V1__UNPIN__INIT;
	Weightfloor__V1__Evict ev = WEIGHTFLOOR__V1__EVICT__INIT;
	Weightfloor__V1__Prefetch pf = WEIGHTFLOOR__V1__PREFETCH__INIT;
	req.body_case = what;
	switch (what) {
	case WEIGHTFLOOR__V1__REQUEST__BODY_PIN:
		pin.model = (char *)model;
		pin.worker_id = (char *)worker_id;
		req.pin = &pin;
		break;
	case WEIGHTFLOOR__V1__REQUEST__BODY_UNPIN:
		unpin.model = (char *)model;
		unpin.worker_id = (char *)worker_id;
		req.unpin = &unpin;
		break;
	case WEIGHTFLOOR__V1__REQUEST__BODY_EVICT:
		ev.model = (char *)model;
		ev.worker_id = (char *)worker_id;
		req.evict = &ev;
		break;
	default:
		pf.model = (char *)model;
		pf.worker_id = (char *)worker_id;
		req.prefetch = &pf;
		break;
	}
	return agt_call(a, &req, 15000);
}

/* `agentctl watch` as a process of its own (killed with the test, agent_helper --pdeathsig),
 * its stdout and stderr in a file. It runs until the test has seen what it waits for and ends it
 * with ^C: no test depends on how long anything takes (--for is only a backstop). */
struct watcher {
	pid_t pid;
	char *path;
	int rc;
	char *out;
};

static void watch_start(struct agt *a, struct watcher *w, bool json, const char *name)
{
	w->path = agt_printf("%s/%s.out", a->dir, name);
	char *argv[] = {wft_exe("tests/agent/agent_helper"),
	                "--pdeathsig",
	                "exec",
	                wft_exe("control/agentctl/agentctl"),
	                "--socket",
	                a->sock_url,
	                "--events",
	                a->ev_url,
	                "watch",
	                "--for",
	                "110",
	                json ? "--json" : NULL,
	                NULL};
	w->pid = agt_spawn_to(argv, w->path);
}

/* Waits until the watcher's output holds needle; asserts within 60 s (a backstop for a test
 * that would otherwise hang, not a measure). */
static void watch_wait_for(struct watcher *w, const char *needle)
{
	int64_t end = agt_now_ms() + 60000;
	for (;;) {
		char *t = slurp(w->path);
		bool found = strstr(t, needle) != NULL;
		if (found || agt_now_ms() > end) {
			cr_assert(found, "watch never printed '%s':\n%s", needle, t);
			free(t);
			return;
		}
		free(t);
		agt_sleep_ms(50);
	}
}

/* Ends the watcher with ^C (it exits 0 then), and reads what it printed into w->out. */
static void watch_stop(struct watcher *w)
{
	cr_assert_eq(kill(w->pid, SIGINT), 0);
	int st = 0;
	cr_assert_eq(waitpid(w->pid, &st, 0), w->pid);
	w->rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
	w->out = slurp(w->path);
}

/* Prefetch, pin, unpin and evict a model on a real worker: a subscriber and `agentctl watch`
 * (text and JSON Lines) see RESIDENCY events naming the worker: DEVICE, PINNED_DEVICE, DEVICE,
 * then DISK or HOST with the eviction's reason. */
Test(agent_events, residency_changes_reach_watch_with_worker_id)
{
	struct agt *a = agt_new("ev-res");
	char *pa = agt_gen(a, "A", 1, NULL), *pp = agt_gen(a, "ping", 2, NULL);
	agt_start(a, NULL, NULL);
	Weightfloor__V1__Reply *r = agt_register(a, "A", pa, false);
	agt_expect_code(r, AGT_ST(OK), "register A");
	wf_ctl_reply_free(r);
	struct wf_ctl_sub *sub = agt_sub_synced(a, "ping", pp);

	struct watcher wt = {0}, wj = {0};
	watch_start(a, &wt, false, "watch");
	watch_start(a, &wj, true, "watch-json");
	/* Ours and both watchers connected: events from here on reach all three. */
	int64_t end = agt_now_ms() + 60000;
	while (agt_event_peers(a) < 3 && agt_now_ms() < end)
		agt_sleep_ms(20);
	cr_assert_geq(agt_event_peers(a), 3, "agentctl watch did not connect");

	struct agt_worker wk;
	agt_spawn_worker(a, &wk, "w-ev.0", NULL, NULL, NULL);
	const char *log = wk.log;
	wf_ctl_event_free(wait_event(sub, KIND(WORKER), "w-ev.0", NULL, 0, log));

	/* Relayed through the agent; the worker resolves A with the agent (EnsureFloor) first, so
	 * its registration reply is back before the first change is reported. */
	r = worker_cmd(a, WEIGHTFLOOR__V1__REQUEST__BODY_PREFETCH, "A", "w-ev.0");
	agt_expect_code(r, AGT_ST(OK), "prefetch A on w-ev.0");
	wf_ctl_reply_free(r);
	Weightfloor__V1__Event *ev =
	    wait_event(sub, KIND(RESIDENCY), "w-ev.0", "A", RES(DEVICE), log);
	wf_ctl_event_free(ev);
	r = worker_cmd(a, WEIGHTFLOOR__V1__REQUEST__BODY_PIN, "A", "w-ev.0");
	agt_expect_code(r, AGT_ST(OK), "pin A on w-ev.0");
	wf_ctl_reply_free(r);
	ev = wait_event(sub, KIND(RESIDENCY), "w-ev.0", "A", RES(PINNED_DEVICE), log);
	wf_ctl_event_free(ev);
	r = worker_cmd(a, WEIGHTFLOOR__V1__REQUEST__BODY_UNPIN, "A", "w-ev.0");
	agt_expect_code(r, AGT_ST(OK), "unpin A on w-ev.0");
	wf_ctl_reply_free(r);
	ev = wait_event(sub, KIND(RESIDENCY), "w-ev.0", "A", RES(DEVICE), log);
	wf_ctl_event_free(ev);

	r = worker_cmd(a, WEIGHTFLOOR__V1__REQUEST__BODY_EVICT, "A", "w-ev.0");
	agt_expect_code(r, AGT_ST(OK), "evict A on w-ev.0");
	wf_ctl_reply_free(r);
	ev = wait_event(sub, KIND(RESIDENCY), "w-ev.0", "A", 0, log);
	while (ev->residency != RES(DISK) && ev->residency != RES(HOST)) {
		wf_ctl_event_free(ev);
		ev = wait_event(sub, KIND(RESIDENCY), "w-ev.0", "A", 0, log);
	}
	cr_expect(ev->message && strstr(ev->message, "evicted"), "eviction message: '%s'",
	          ev->message ? ev->message : "");
	wf_ctl_event_free(ev);
	wf_ctl_sub_close(sub);

	/* Our subscriber saw the eviction; the watchers see it too, then they are done. */
	watch_wait_for(&wt, " evicted");
	watch_wait_for(&wj, "evicted");
	watch_stop(&wt);
	watch_stop(&wj);
	cr_expect_eq(wt.rc, 0, "watch: %s", wt.out);
	cr_expect_eq(wj.rc, 0, "watch --json: %s", wj.out);
	cr_expect(strstr(wt.out, "worker w-ev.0 model A DEVICE"), "watch output:\n%s", wt.out);
	cr_expect(strstr(wt.out, "worker w-ev.0 model A PINNED_DEVICE"), "watch output:\n%s",
	          wt.out);
	cr_expect(strstr(wt.out, "worker w-ev.0 model A DISK evicted") ||
	              strstr(wt.out, "worker w-ev.0 model A HOST evicted"),
	          "watch output:\n%s", wt.out);
	cr_expect(strstr(wj.out, "\"residency\":\"PINNED_DEVICE\""), "%s", wj.out);
	/* JSON Lines: every residency line carries the worker's id (strtok_r cuts wj.out). */
	int lines = 0;
	for (char *save = NULL, *l = strtok_r(wj.out, "\n", &save); l;
	     l = strtok_r(NULL, "\n", &save)) {
		if (!strstr(l, "\"RESIDENCY\""))
			continue;
		lines++;
		cr_expect(strstr(l, "\"worker_id\":\"w-ev.0\"") ||
		              strstr(l, "\"worker_id\": \"w-ev.0\""),
		          "%s", l);
	}
	cr_expect_geq(lines, 3, "RESIDENCY lines in watch --json:\n%s", wj.out);
	free(wt.out);
	free(wj.out);
}

static Weightfloor__V1__Reply *report(struct agt *a, const char *id, size_t n)
{
	Weightfloor__V1__ResidencyChange *cv = calloc(n ? n : 1, sizeof(*cv));
	Weightfloor__V1__ResidencyChange **cp = calloc(n ? n : 1, sizeof(*cp));
	cr_assert(cv && cp);
	for (size_t i = 0; i < n; i++) {
		Weightfloor__V1__ResidencyChange c = WEIGHTFLOOR__V1__RESIDENCY_CHANGE__INIT;
		c.model = "forged";
		c.state = RES(PINNED_DEVICE);
		cv[i] = c;
		cp[i] = &cv[i];
	}
	Weightfloor__V1__ReportResidency rr = WEIGHTFLOOR__V1__REPORT_RESIDENCY__INIT;
	rr.worker_id = (char *)id;
	rr.n_changes = n;
	rr.changes = cp;
	Weightfloor__V1__Request req = WEIGHTFLOOR__V1__REQUEST__INIT;
	req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_REPORT_RESIDENCY;
	req.report_residency = &rr;
	Weightfloor__V1__Reply *r = agt_call(a, &req, 5000);
	free(cv);
	free(cp);
	return r;
}

/* Reports from an id no worker registered are refused (NOT_FOUND) and publish nothing; too many
 * changes in one report are INVALID_ARGUMENT even from a registered worker. */
Test(agent_events, report_from_unregistered_id_refused)
{
	struct agt *a = agt_new("ev-unreg");
	char *pp = agt_gen(a, "ping", 2, NULL);
	agt_start(a, NULL, NULL);
	struct wf_ctl_sub *sub = agt_sub_synced(a, "ping", pp);

	Weightfloor__V1__Reply *r = report(a, "nobody", 1);
	agt_expect_code(r, AGT_ST(NOT_FOUND), "report from an unregistered id");
	cr_expect(r->message && strstr(r->message, "nobody"), "%s", r->message);
	wf_ctl_reply_free(r);
	r = report(a, "", 1);
	agt_expect_code(r, AGT_ST(INVALID_ARGUMENT), "report without an id");
	wf_ctl_reply_free(r);

	struct agt_worker wk;
	agt_spawn_worker(a, &wk, "w-ev.1", NULL, NULL, NULL);
	const char *log = wk.log;
	wf_ctl_event_free(wait_event(sub, KIND(WORKER), "w-ev.1", NULL, 0, log));
	r = report(a, "w-ev.1", REPORT_MAX + 1);
	agt_expect_code(r, AGT_ST(INVALID_ARGUMENT), "report with too many changes");
	wf_ctl_reply_free(r);
	r = report(a, "w-ev.1", 1);
	agt_expect_code(r, AGT_ST(OK), "report from the registered worker");
	wf_ctl_reply_free(r);

	/* Only the accepted report was published: the first RESIDENCY event is w-ev.1's. */
	int64_t end = agt_now_ms() + 10000;
	bool got = false;
	while (!got && agt_now_ms() < end) {
		Weightfloor__V1__Event *ev = NULL;
		struct wf_diag d = {{0}};
		if (wf_ctl_sub_recv(sub, 200, &ev, &d) != 0)
			continue;
		if (ev->kind == KIND(RESIDENCY)) {
			cr_expect_str_eq(ev->worker_id, "w-ev.1");
			cr_expect_str_eq(ev->model, "forged");
			cr_expect_eq(ev->residency, RES(PINNED_DEVICE));
			got = true;
		}
		wf_ctl_event_free(ev);
	}
	cr_expect(got, "the accepted report was not published");
	wf_ctl_sub_close(sub);
}

/* One request straight to the worker's endpoint (no agent involved). */
static void worker_direct(const char *url, Weightfloor__V1__Request__BodyCase what,
                          const char *model)
{
	struct wf_ctl_client *c = NULL;
	struct wf_diag d = {{0}};
	int rc = wf_ctl_client_open(url, 5000, NULL, &c, &d);
	cr_assert_eq(rc, 0, "open %s: %s", url, wf_diag_str(&d, rc));
	Weightfloor__V1__Request req = WEIGHTFLOOR__V1__REQUEST__INIT;
	Weightfloor__V1__Evict ev = WEIGHTFLOOR__V1__EVICT__INIT;
	Weightfloor__V1__Prefetch pf = WEIGHTFLOOR__V1__PREFETCH__INIT;
	req.body_case = what;
	if (what == WEIGHTFLOOR__V1__REQUEST__BODY_EVICT) {
		ev.model = (char *)model;
		req.evict = &ev;
	} else {
		pf.model = (char *)model;
		req.prefetch = &pf;
	}
	Weightfloor__V1__Reply *r = NULL;
	rc = wf_ctl_client_call_timeout(c, &req, 10000, &r, &d);
	cr_assert_eq(rc, 0, "call %s: %s", url, wf_diag_str(&d, rc));
	agt_expect_code(r, AGT_ST(OK), "direct worker request");
	wf_ctl_reply_free(r);
	wf_ctl_client_close(c);
}

/* The agent goes away: a change the worker makes meanwhile is dropped, not replayed, and the
 * first change reported after the agent is back (and the worker re-registered) says how many
 * were lost; the worker kept serving throughout. */
Test(agent_events, changes_while_agent_down_are_counted_not_replayed)
{
	struct agt *a = agt_new("ev-down");
	char *pa = agt_gen(a, "A", 1, NULL), *pp = agt_gen(a, "ping", 2, NULL);
	agt_start(a, NULL, NULL);
	Weightfloor__V1__Reply *r = agt_register(a, "A", pa, false);
	agt_expect_code(r, AGT_ST(OK), "register A");
	wf_ctl_reply_free(r);
	struct wf_ctl_sub *sub = agt_sub_synced(a, "ping", pp);
	char url[512];
	struct agt_worker wk;
	agt_spawn_worker(a, &wk, "w-ev.2", NULL, NULL, NULL);
	const char *log = wk.log;
	snprintf(url, sizeof url, "ipc://%s/w-ev.2.sock", a->run);
	wf_ctl_event_free(wait_event(sub, KIND(WORKER), "w-ev.2", NULL, 0, log));
	r = worker_cmd(a, WEIGHTFLOOR__V1__REQUEST__BODY_PREFETCH, "A", "w-ev.2");
	agt_expect_code(r, AGT_ST(OK), "prefetch A on w-ev.2");
	wf_ctl_reply_free(r);
	wf_ctl_event_free(wait_event(sub, KIND(RESIDENCY), "w-ev.2", "A", RES(DEVICE), log));
	wf_ctl_sub_close(sub);

	cr_assert_eq(agt_stop(a, 10000), 0);
	/* Wait until the worker knows the agent is gone, so the eviction below is dropped at
	 * once rather than tried against a dead socket. */
	int64_t end = agt_now_ms() + 20000;
	char *l = NULL;
	for (;;) {
		free(l);
		l = slurp(log);
		if (strstr(l, "agent unreachable") || agt_now_ms() > end)
			break;
		agt_sleep_ms(50);
	}
	cr_assert(strstr(l, "agent unreachable"), "worker log:\n%s", l);
	free(l);
	worker_direct(url, WEIGHTFLOOR__V1__REQUEST__BODY_EVICT, "A");

	agt_start(a, NULL, NULL);
	sub = agt_sub_synced(a, "ping-again", pp);
	/* Re-registered (its WORKER event may have gone out before the subscription was up: the
	 * worker's log says it). */
	end = agt_now_ms() + 20000;
	for (l = NULL;;) {
		free(l);
		l = slurp(log);
		if (agt_count(l, "registered with the agent") >= 2 || agt_now_ms() > end)
			break;
		agt_sleep_ms(50);
	}
	cr_assert_geq(agt_count(l, "registered with the agent"), 2, "worker log:\n%s", l);
	free(l);
	worker_direct(url, WEIGHTFLOOR__V1__REQUEST__BODY_PREFETCH, "A");
	/* Not replayed: the first change the agent publishes is the new one, not the eviction. */
	Weightfloor__V1__Event *ev = wait_event(sub, KIND(RESIDENCY), "w-ev.2", "A", 0, log);
	cr_expect_eq(ev->residency, RES(DEVICE));
	cr_expect(ev->message &&
	              strstr(ev->message, "1 earlier residency changes were not reported"),
	          "message: '%s'", ev->message ? ev->message : "");
	wf_ctl_event_free(ev);
	/* Told once: the next change carries no count. */
	worker_direct(url, WEIGHTFLOOR__V1__REQUEST__BODY_EVICT, "A");
	ev = wait_event(sub, KIND(RESIDENCY), "w-ev.2", "A", 0, log);
	cr_expect(ev->residency == RES(DISK) || ev->residency == RES(HOST), "state %d",
	          (int)ev->residency);
	cr_expect(!strstr(ev->message, "not reported"), "message: '%s'", ev->message);
	wf_ctl_event_free(ev);
	wf_ctl_sub_close(sub);
}

/* `agentctl watch` outlives an agent restart (the subscriber reconnects) and says so when the
 * events come from a new publisher. */
Test(agent_events, watch_announces_an_agent_restart)
{
	struct agt *a = agt_new("ev-restart");
	char *pa = agt_gen(a, "A", 3, NULL), *pb = agt_gen(a, "B", 4, NULL);
	agt_start(a, NULL, NULL);
	struct watcher wt = {0};
	watch_start(a, &wt, false, "watch");
	int64_t end = agt_now_ms() + 60000;
	while (agt_event_peers(a) < 1 && agt_now_ms() < end)
		agt_sleep_ms(20);
	cr_assert_geq(agt_event_peers(a), 1, "agentctl watch did not connect");
	/* an event from the first agent, so that watch knows its epoch */
	Weightfloor__V1__Reply *r = agt_register(a, "A", pa, false);
	agt_expect_code(r, AGT_ST(OK), "register A");
	wf_ctl_reply_free(r);
	watch_wait_for(&wt, " A ");
	cr_assert_eq(agt_stop(a, 10000), 0);
	agt_start(a, NULL, NULL);
	/* The watcher redials (however long the restart took); register until one of the new
	 * agent's events has reached it. */
	end = agt_now_ms() + 60000;
	char *out = NULL;
	for (int i = 0; agt_now_ms() < end; i++) {
		char name[32];
		snprintf(name, sizeof name, "B%d", i);
		r = agt_register(a, name, pb, false);
		wf_ctl_reply_free(r);
		free(out);
		out = slurp(wt.path);
		if (strstr(out, "agent restarted"))
			break;
		agt_sleep_ms(200);
	}
	watch_stop(&wt);
	cr_assert(strstr(wt.out, "agent restarted"), "watch did not announce the restart:\n%s",
	          wt.out);
	cr_expect_eq(wt.rc, 0, "watch: %s", wt.out);
	free(out);
	free(wt.out);
	cr_assert_eq(agt_stop(a, 10000), 0);
}
