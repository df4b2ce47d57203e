/* /metrics, /healthz and /readyz of a real wf-agent (address from its config file's "metrics"
 * key) and a real wf-worker (--metrics), on free localhost ports: the text passes `promtool check
 * metrics`, carries the series of what happened (a materialization, a load, requests, the
 * worker's residency as the agent knows it), and a real Prometheus server scraping both returns
 * them through its query API. Also: a bad "metrics" address is refused by --check-config, and a
 * port in use stops the agent at start with the reason. */
#include "common/wftest.h"
#include "tests/agent/agt.h"
#include "tests/http/httpc.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern char **environ;

TestSuite(agent_metrics, .fini = agt_fini, .timeout = 90);

static void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	cr_assert_not_null(f, "%s", path);
	fputs(text, f);
	cr_assert_eq(fclose(f), 0);
}

/* GET path until it answers want (asserting, with the log, within timeout_ms). The body is the
 * caller's. */
static char *wait_status(uint16_t port, const char *path, int want, int timeout_ms, const char *log)
{
	int64_t end = agt_now_ms() + timeout_ms;
	struct httpc_reply r = {0};
	for (;;) {
		if (httpc_request(port, "GET", path, 2000, &r) == 0) {
			if (r.status == want) {
				free(r.head);
				return r.body;
			}
			httpc_reply_fini(&r);
		}
		cr_assert_lt(agt_now_ms(), end, "GET %s on port %u never answered %d; log:\n%s",
		             path, (unsigned)port, want, log);
		agt_sleep_ms(50);
	}
}

/* GET /metrics until it contains needle; returns the text (the caller's). */
static char *wait_metric(uint16_t port, const char *needle, const char *log)
{
	int64_t end = agt_now_ms() + 20000;
	for (;;) {
		char *t = wait_status(port, "/metrics", 200, 5000, log);
		if (strstr(t, needle))
			return t;
		cr_assert_lt(agt_now_ms(), end, "no '%s' in /metrics:\n%s\nlog:\n%s", needle, t,
		             log);
		free(t);
		agt_sleep_ms(100);
	}
}

static void promtool_check(struct agt *a, const char *name, const char *text)
{
	char *path = agt_printf("%s/%s.prom", a->dir, name);
	write_file(path, text);
	char *cmd = agt_printf("promtool check metrics < '%s'", path);
	char *argv[] = {"/bin/sh", "-c", cmd, NULL};
	char *out = NULL, *err = NULL;
	int rc = agt_run(argv, &out, &err, 20, a->dir);
	cr_assert_eq(rc, 0, "promtool check metrics (%s) failed (%d):\n%s%s", name, rc, out, err);
	free(out);
	free(err);
	free(cmd);
	free(path);
}

/* Prometheus through agent_helper (it dies with the test), logging into the test directory. */
static pid_t start_prometheus(struct agt *a, uint16_t port, uint16_t ap, uint16_t wp,
                              char **ret_log)
{
	char *cfg = agt_printf("%s/prometheus.yml", a->dir);
	char *text = agt_printf("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
	                        "scrape_configs:\n"
	                        "  - job_name: agent\n    static_configs:\n"
	                        "      - targets: ['127.0.0.1:%u']\n"
	                        "  - job_name: worker\n    static_configs:\n"
	                        "      - targets: ['127.0.0.1:%u']\n",
	                        (unsigned)ap, (unsigned)wp);
	write_file(cfg, text);
	char *cfg_arg = agt_printf("--config.file=%s", cfg);
	char *tsdb = agt_printf("--storage.tsdb.path=%s/tsdb", a->dir);
	char *listen = agt_printf("--web.listen-address=127.0.0.1:%u", (unsigned)port);
	char *log = agt_printf("%s/prometheus.log", a->dir);
	char *argv[] = {wft_exe("tests/agent/agent_helper"),
	                "--pdeathsig",
	                "exec",
	                "/usr/bin/prometheus",
	                cfg_arg,
	                tsdb,
	                listen,
	                NULL};
	posix_spawn_file_actions_t fa;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
	posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, log, O_WRONLY | O_CREAT | O_APPEND,
	                                 0644);
	posix_spawn_file_actions_adddup2(&fa, STDOUT_FILENO, STDERR_FILENO);
	pid_t pid;
	int rc = posix_spawn(&pid, argv[0], &fa, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	cr_assert_eq(rc, 0, "cannot start prometheus: %s", strerror(rc));
	agt_track_pid(pid);
	free(cfg);
	free(text);
	free(cfg_arg);
	free(tsdb);
	free(listen);
	*ret_log = log;
	return pid;
}

/* Polls the query API until the result of query names every needle (a series from the right
 * job), asserting with Prometheus's log within 25 s. */
static void wait_query(uint16_t port, const char *query, const char *const *needles,
                       const char *log_path)
{
	char *path = agt_printf("/api/v1/query?query=%s", query);
	int64_t end = agt_now_ms() + 25000;
	char *last = NULL;
	for (;;) {
		struct httpc_reply r;
		if (httpc_request(port, "GET", path, 3000, &r) == 0) {
			bool all = r.status == 200 && strstr(r.body, "\"status\":\"success\"");
			for (size_t i = 0; all && needles[i]; i++)
				all = strstr(r.body, needles[i]) != NULL;
			free(last);
			last = strdup(r.body);
			httpc_reply_fini(&r);
			if (all)
				break;
		}
		if (agt_now_ms() > end) {
			char *log = wft_read_file(log_path, NULL);
			cr_assert_fail("Prometheus never returned %s for %s; last answer:\n%s\n"
			               "prometheus log:\n%s",
			               needles[0], query, last ? last : "(none)",
			               log ? log : "(none)");
		}
		agt_sleep_ms(200);
	}
	free(last);
	free(path);
}

Test(agent_metrics, agent_and_worker_scraped_by_prometheus)
{
	struct agt *a = agt_new("metrics");
	char *model = agt_gen(a, "m", 1, NULL);
	uint16_t ap = httpc_free_port(), wp = httpc_free_port(), pp = httpc_free_port();
	cr_assert(ap && wp && pp && ap != wp && wp != pp && ap != pp);

	/* The agent's address from its config file; the worker's from the flag. */
	char *cfg = agt_printf("%s/agent.json", a->dir);
	char *json = agt_printf("{\"metrics\": \"127.0.0.1:%u\"}\n", (unsigned)ap);
	write_file(cfg, json);
	char *preload = agt_printf("m=%s", model);
	agt_start(a, NULL, (const char *const[]){"-c", cfg, "--preload", preload, NULL});
	char *alog = agt_log(a);
	char *body = wait_status(ap, "/readyz", 200, 20000, alog);
	cr_assert_str_eq(body, "ready\n");
	free(body);
	body = wait_status(ap, "/healthz", 200, 5000, alog);
	free(body);
	agt_wait_settled(a, "m", 20000);

	struct agt_worker w;
	char *wmetrics = agt_printf("127.0.0.1:%u", (unsigned)wp);
	agt_spawn_worker(a, &w, "w1", NULL, NULL,
	                 (const char *const[]){"--metrics", wmetrics, "--prefetch", "m", NULL});
	agt_wait_worker_ready(&w);
	char *wlog = agt_worker_log(&w);
	body = wait_status(wp, "/readyz", 200, 20000, wlog);
	cr_assert_str_eq(body, "ready\n");
	free(body);

	/* What happened is in the text, and the text is valid. */
	char *wt =
	    wait_metric(wp, "weightfloor_model_residency{model=\"m\",state=\"DEVICE\"} 1\n", wlog);
	cr_assert_not_null(strstr(wt, "weightfloor_loads_total{result=\"ok\"} 1\n"), "%s", wt);
	cr_assert_not_null(strstr(wt, "weightfloor_load_duration_seconds_count 1\n"), "%s", wt);
	cr_assert_not_null(strstr(wt, "weightfloor_worker_info{worker=\"w1\""), "%s", wt);
	cr_assert_not_null(strstr(wt, "# TYPE weightfloor_device_budget_bytes gauge\n"
	                              "weightfloor_device_budget_bytes "),
	                   "%s", wt);
	promtool_check(a, "worker", wt);
	char *at = wait_metric(
	    ap, "weightfloor_worker_residency{worker=\"w1\",model=\"m\",state=\"DEVICE\"} 1\n",
	    alog);
	cr_assert_not_null(strstr(at, "weightfloor_floors{state=\"HOST\"} 1\n"), "%s", at);
	cr_assert_not_null(strstr(at, "weightfloor_floor_state{model=\"m\",state=\"HOST\"} 1\n"),
	                   "%s", at);
	cr_assert_not_null(strstr(at, "weightfloor_materializations_total{result=\"ok\"} 1\n"),
	                   "%s", at);
	cr_assert_not_null(strstr(at, "weightfloor_materialize_duration_seconds_count 1\n"), "%s",
	                   at);
	cr_assert_not_null(
	    strstr(at, "weightfloor_requests_total{kind=\"register_worker\",status=\"OK\"} "), "%s",
	    at);
	cr_assert_not_null(strstr(at, "weightfloor_workers 1\n"), "%s", at);
	promtool_check(a, "agent", at);
	free(wt);
	free(at);

	/* A real Prometheus scrapes both and answers for their series. */
	char *plog = NULL;
	start_prometheus(a, pp, ap, wp, &plog);
	wait_query(pp, "up", (const char *const[]){"\"job\":\"agent\"", "\"job\":\"worker\"", NULL},
	           plog);
	wait_query(pp, "weightfloor_floor_state",
	           (const char *const[]){"\"job\":\"agent\"", "\"model\":\"m\"",
	                                 "\"state\":\"HOST\"", NULL},
	           plog);
	wait_query(pp, "weightfloor_model_residency",
	           (const char *const[]){"\"job\":\"worker\"", "\"model\":\"m\"",
	                                 "\"state\":\"DEVICE\"", NULL},
	           plog);
	wait_query(pp, "weightfloor_requests_total",
	           (const char *const[]){"\"job\":\"agent\"", "\"kind\":\"register_worker\"", NULL},
	           plog);
	/* Both targets healthy: no scrape failed (up is 0 for a failed one). */
	wait_query(pp, "min(up)", (const char *const[]){"\"1\"]", NULL}, plog);

	/* Stopping: the agent answers /readyz 503 "stopping" or is gone; never a crash. */
	cr_assert_eq(agt_stop(a, 10000), 0);
	free(plog);
	free(wlog);
	free(alog);
	free(wmetrics);
	free(preload);
	free(json);
	free(cfg);
	free(model);
}

Test(agent_metrics, bad_addresses_are_refused_at_start)
{
	struct agt *a = agt_new("metrics-bad");
	char *cfg = agt_printf("%s/agent.json", a->dir);
	write_file(cfg, "{\"metrics\": \"127.0.0.1:99999\"}\n");
	char *argv[] = {
	    wft_exe("agent/wf-agent"), "--check-config", "-c", cfg, "--floor-dir", a->floor, NULL};
	char *out = NULL, *err = NULL;
	int rc = agt_run(argv, &out, &err, 20, a->dir);
	cr_assert_neq(rc, 0, "a bad metrics address passed --check-config:\n%s%s", out, err);
	cr_assert_not_null(strstr(err, "'metrics'"), "%s", err);
	free(out);
	free(err);

	/* A port in use: the agent stops at start and says why. */
	uint16_t busy = httpc_free_port();
	char *taken = agt_printf("127.0.0.1:%u", (unsigned)busy);
	/* Hold the port with a first agent's endpoint. */
	agt_start(a, NULL, (const char *const[]){"--metrics", taken, NULL});
	char *argv2[] = {wft_exe("agent/wf-agent"),
	                 "--floor-dir",
	                 a->floor,
	                 "--socket",
	                 agt_printf("ipc://%s/second.sock", a->run),
	                 "--events",
	                 agt_printf("ipc://%s/second-ev.sock", a->run),
	                 "--state-file",
	                 "none",
	                 "--metrics",
	                 taken,
	                 NULL};
	rc = agt_run(argv2, &out, &err, 20, a->dir);
	cr_assert_neq(rc, 0, "a second agent started on a port in use:\n%s%s", out, err);
	cr_assert_not_null(strstr(err, "Address already in use"), "%s", err);
	free(out);
	free(err);
	free(taken);
	free(cfg);
}
