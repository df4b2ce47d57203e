/* Helper process for test_peers: drops to the given uid/gid, then acts as a control-plane peer
 * and prints one integer: a return code (< 0) or 1000 + the reply's Status.
 *
 *   ctl_peer_helper UID GID call URL   AgentStatus request
 *   ctl_peer_helper UID GID sub URL    waits 1.5 s for one event (0: got one)
 *   ctl_peer_helper UID GID raw-big URL  a plain nng REQ socket with nng's defaults sends 200 KiB
 *                                        and waits 700 ms; prints nng's error number
 *
 * A separate program because Criterion's test processes already run nng (its runner protocol),
 * and nng refuses to run in a forked child: the tests posix_spawn this instead. */
#include "control/client.h"

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>

#include <errno.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int call_agent_status(const char *url)
{
	struct wf_ctl_client *c = NULL;
	Weightfloor__V1__Reply *r = NULL;
	Weightfloor__V1__Request req = WEIGHTFLOOR__V1__REQUEST__INIT;
	Weightfloor__V1__AgentStatus as = WEIGHTFLOOR__V1__AGENT_STATUS__INIT;
	int rv = wf_ctl_client_open(url, 2000, NULL, &c, NULL);
	if (rv < 0)
		return rv;
	req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_AGENT_STATUS;
	req.agent_status = &as;
	rv = wf_ctl_client_call(c, &req, &r, NULL);
	if (rv == 0) {
		rv = 1000 + (int)r->code;
		/* Refusals come before the request is read: their id is 0. */
		if (r->code == WEIGHTFLOOR__V1__STATUS__STATUS_PERMISSION_DENIED &&
		    r->request_id != 0)
			rv = -9999;
		wf_ctl_reply_free(r);
	}
	wf_ctl_client_close(c);
	return rv;
}

static int sub_one_event(const char *url)
{
	struct wf_ctl_sub *sub = NULL;
	Weightfloor__V1__Event *ev = NULL;
	int rv = wf_ctl_sub_open(url, NULL, &sub, NULL);
	if (rv < 0)
		return rv;
	rv = wf_ctl_sub_recv(sub, 1500, &ev, NULL);
	wf_ctl_event_free(ev);
	wf_ctl_sub_close(sub);
	return rv;
}

/* What a foreign client (nng defaults: REQ resends after a reconnect) sees when its message is
 * larger than the server's limit. The socket is not closed: nng 1.5.2 can hang in nng_close()
 * while tearing down a pipe with a large send in flight, and the process exit is enough. */
static int raw_big(const char *url)
{
	size_t big = 200u << 10;
	char *buf = calloc(1, big);
	nng_socket s;
	void *out = NULL;
	size_t n = 0;
	int rv;
	if (!buf || nng_req0_open(&s) != 0)
		return -ENOMEM;
	nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, 700);
	nng_socket_set_ms(s, NNG_OPT_SENDTIMEO, 700);
	if ((rv = nng_dial(s, url, NULL, 0)) == 0 && (rv = nng_send(s, buf, big, 0)) == 0 &&
	    (rv = nng_recv(s, &out, &n, NNG_FLAG_ALLOC)) == 0)
		nng_free(out, n);
	return rv;
}

int main(int argc, char **argv)
{
	if (argc != 5) {
		fprintf(stderr, "usage: %s UID GID call|sub URL\n", argv[0]);
		return 2;
	}
	uid_t uid = (uid_t)strtoul(argv[1], NULL, 10);
	gid_t gid = (gid_t)strtoul(argv[2], NULL, 10);
	if (setgroups(0, NULL) != 0 || setgid(gid) != 0 || setuid(uid) != 0) {
		fprintf(stderr, "drop to %u:%u: %s\n", (unsigned)uid, (unsigned)gid,
		        strerror(errno));
		return 3;
	}
	int rv;
	if (strcmp(argv[3], "call") == 0)
		rv = call_agent_status(argv[4]);
	else if (strcmp(argv[3], "sub") == 0)
		rv = sub_one_event(argv[4]);
	else if (strcmp(argv[3], "raw-big") == 0)
		rv = raw_big(argv[4]);
	else
		return 2;
	printf("%d\n", rv);
	fflush(stdout);
	_exit(0);
}
