/* Mutual TLS end to end: certificates made by the openssl CLI, a real wf-agent listening on
 * tls+tcp://127.0.0.1:<free port> with --tls-cert/--tls-key/--tls-ca, and agentctl with and
 * without the right client certificate. Each refusal must say which side refused. */
#include "common/wftest.h"
#include "control/transport.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static char *dir;
static pid_t agent_pid;

static void cleanup(void)
{
	if (agent_pid > 0) {
		kill(agent_pid, SIGKILL);
		waitpid(agent_pid, NULL, 0);
		agent_pid = 0;
	}
	if (dir) {
		wft_rmtree(dir);
		free(dir);
		dir = NULL;
	}
}

static char *in_dir(const char *name)
{
	char *p = NULL;
	cr_assert(asprintf(&p, "%s/%s", dir, name) > 0);
	return p;
}

static int sh(const char *cmd)
{
	char *full = NULL, *log = in_dir("openssl.log");
	cr_assert(asprintf(&full, "cd '%s' && %s", dir, cmd) > 0);
	char *argv[] = {"/bin/sh", "-c", full, NULL};
	int rv = wft_run(argv, log, log, 60);
	free(full);
	free(log);
	return rv;
}

/* ca: the agent's CA. Server certificate for DNS:localhost (mbedTLS matches DNS names only);
 * cli: a client signed by ca; rogue: a client signed by another CA (other-ca). Keys apart from
 * certificates, as the flags take them. */
static void make_certs(void)
{
	if (access("/usr/bin/openssl", X_OK) != 0)
		cr_skip_test("openssl not installed");
	static const char *const cmds[] = {
	    "printf 'subjectAltName=DNS:localhost\\n' > srv.ext",
	    "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
	    "-keyout ca.key -out ca.pem -days 2 -subj /CN=wf-e2e-ca",
	    "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
	    "-keyout other-ca.key -out other-ca.pem -days 2 -subj /CN=wf-e2e-other-ca",
	    "openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
	    "-keyout srv.key -out srv.csr -subj /CN=localhost",
	    "openssl x509 -req -in srv.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
	    "-out srv.crt -days 2 -extfile srv.ext",
	    "openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
	    "-keyout cli.key -out cli.csr -subj /CN=operator",
	    "openssl x509 -req -in cli.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
	    "-out cli.crt -days 2",
	    "openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
	    "-keyout rogue.key -out rogue.csr -subj /CN=rogue",
	    "openssl x509 -req -in rogue.csr -CA other-ca.pem -CAkey other-ca.key "
	    "-CAcreateserial -out rogue.crt -days 2",
	};
	for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++)
		cr_assert_eq(sh(cmds[i]), 0, "%s (see %s/openssl.log)", cmds[i], dir);
}

/* A TCP port that was free a moment ago (bind to 0, read it back, close). */
static int free_port(void)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof(sa);
	cr_assert_geq(fd, 0);
	cr_assert_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	cr_assert_eq(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
	close(fd);
	return ntohs(sa.sin_port);
}

struct outcome {
	int status;
	char *err; /* agentctl's stderr */
};

/* agentctl --socket url --tls-server-name localhost <tls args...> status */
static struct outcome agentctl(const char *url, const char *const *tls_args)
{
	char *argv[16];
	int n = 0;
	argv[n++] = wft_exe("control/agentctl/agentctl");
	argv[n++] = "--socket";
	argv[n++] = (char *)url;
	argv[n++] = "--timeout";
	argv[n++] = "5000";
	argv[n++] = "--tls-server-name";
	argv[n++] = "localhost";
	for (; *tls_args; tls_args++)
		argv[n++] = (char *)*tls_args;
	argv[n++] = "status";
	argv[n] = NULL;
	char *out = in_dir("agentctl.out"), *err = in_dir("agentctl.err");
	struct outcome o = {.status = wft_run(argv, out, err, 30)};
	o.err = wft_read_file(err, NULL);
	cr_log_info("agentctl exit %d: %s", o.status, o.err ? o.err : "");
	free(out);
	free(err);
	return o;
}

Test(tls_e2e, agent_requires_client_certificates_of_its_ca, .timeout = 120, .fini = cleanup)
{
	if (!wf_ctl_tls_available())
		cr_skip_test("nng built without TLS");
	dir = wft_tmpdir("tlse2e");
	make_certs();
	char *floor = in_dir("floor"), *log = in_dir("agent.log");
	char *ca = in_dir("ca.pem"), *other_ca = in_dir("other-ca.pem");
	char *srv_crt = in_dir("srv.crt"), *srv_key = in_dir("srv.key");
	char *cli_crt = in_dir("cli.crt"), *cli_key = in_dir("cli.key");
	char *rogue_crt = in_dir("rogue.crt"), *rogue_key = in_dir("rogue.key");
	char *url = NULL, *ev_url = NULL;
	int port = free_port();
	cr_assert(asprintf(&url, "tls+tcp://127.0.0.1:%d", port) > 0);
	cr_assert(asprintf(&ev_url, "tls+tcp://127.0.0.1:%d", free_port()) > 0);

	char *argv[] = {wft_exe("agent/wf-agent"),
	                "--floor-dir",
	                floor,
	                "--socket",
	                url,
	                "--events",
	                ev_url,
	                "--tls-cert",
	                srv_crt,
	                "--tls-key",
	                srv_key,
	                "--tls-ca",
	                ca,
	                NULL};
	posix_spawn_file_actions_t fa;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	posix_spawn_file_actions_adddup2(&fa, 1, 2);
	cr_assert_eq(posix_spawn(&agent_pid, argv[0], &fa, NULL, argv, environ), 0);
	posix_spawn_file_actions_destroy(&fa);

	/* The right client certificate: served (retried while the agent starts). */
	const char *good[] = {"--tls-ca", ca, "--tls-cert", cli_crt, "--tls-key", cli_key, NULL};
	struct outcome o = {0};
	for (int i = 0; i < 100; i++) {
		free(o.err);
		o = agentctl(url, good);
		if (o.status == 0 || waitpid(agent_pid, NULL, WNOHANG) != 0)
			break;
		nanosleep(&(struct timespec){.tv_nsec = 100 * 1000 * 1000}, NULL);
	}
	cr_assert_eq(o.status, 0, "agentctl with the right certificate: %s (agent log %s: %s)",
	             o.err, log, wft_read_file(log, NULL));
	free(o.err);

	/* No client certificate. */
	const char *none[] = {"--tls-ca", ca, NULL};
	o = agentctl(url, none);
	cr_expect_eq(o.status, 6, "exit %d", o.status);
	cr_expect(o.err && strstr(o.err, "requires a client certificate"), "%s", o.err);
	free(o.err);

	/* A client certificate from another CA. */
	const char *rogue[] = {"--tls-ca",  ca,        "--tls-cert", rogue_crt,
	                       "--tls-key", rogue_key, NULL};
	o = agentctl(url, rogue);
	cr_expect_eq(o.status, 6, "exit %d", o.status);
	cr_expect(o.err && strstr(o.err, "refused the client certificate"), "%s", o.err);
	free(o.err);

	/* The right client certificate, but a CA that did not sign the agent's: the client
	 * refuses the server. */
	const char *wrong_ca[] = {"--tls-ca",  other_ca, "--tls-cert", cli_crt,
	                          "--tls-key", cli_key,  NULL};
	o = agentctl(url, wrong_ca);
	cr_expect_eq(o.status, 6, "exit %d", o.status);
	cr_expect(o.err && strstr(o.err, "server's certificate does not verify"), "%s", o.err);
	free(o.err);

	/* No CA at all: refused before connecting. */
	const char *no_ca[] = {"--tls-cert", cli_crt, "--tls-key", cli_key, NULL};
	o = agentctl(url, no_ca);
	cr_expect_eq(o.status, 4, "exit %d", o.status);
	cr_expect(o.err && strstr(o.err, "needs a CA file"), "%s", o.err);
	free(o.err);

	/* The environment works as the flags do, and the agent served on through all this. */
	setenv("WF_AGENT_TLS_CA", ca, 1);
	setenv("WF_AGENT_TLS_CERT", cli_crt, 1);
	setenv("WF_AGENT_TLS_KEY", cli_key, 1);
	const char *env_only[] = {NULL};
	o = agentctl(url, env_only);
	cr_expect_eq(o.status, 0, "agentctl with $WF_AGENT_TLS_*: %s", o.err);
	free(o.err);
	cr_expect_eq(waitpid(agent_pid, NULL, WNOHANG), 0, "the agent exited");
}
