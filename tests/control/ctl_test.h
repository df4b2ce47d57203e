/* Shared pieces of the control-plane tests: an echo handler whose replies repeat the request's
 * fields, so a round trip proves that every field crossed the wire both ways, and small helpers.
 * No nng or server is created before a test body runs (Criterion forks per test). */
#ifndef WF_TESTS_CONTROL_CTL_TEST_H
#define WF_TESTS_CONTROL_CTL_TEST_H

#include "control/client.h"
#include "control/server.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#define ST(name) WEIGHTFLOOR__V1__STATUS__STATUS_##name

struct echo_state {
	atomic_int calls;
	atomic_int entered_block; /* a "block" request is inside the handler */
	atomic_uint last_uid;
	atomic_int last_pid;
	atomic_int last_transport;
	atomic_bool last_tls_verified;
};

/* The handler. ModelStatus names with special behaviour:
 *   "slow:<ms>"  sleeps <ms> (polling wf_ctl_call_closing) then answers
 *   "block"      waits for the server to close (10 s at most), then WF_EUNAVAILABLE
 *   "missing"    WF_ENOT_FOUND with a message
 *   "huge"       a ModelInfo whose last_error has 2 MiB
 *   "bad-status" returns 0 with code 99
 *   "positive"   returns 5
 *   "set-code"   sets NOT_RESIDENT itself, with a body (which the server must drop)
 * Every other request gets its fields echoed (see ctl_test.c). */
int echo_handle(void *ctx, const Weightfloor__V1__Request *req, Weightfloor__V1__Reply *reply,
                struct wf_ctl_call *call);

/* Creates and starts a server for "ipc://<dir>/<name>" with echo_handle and st. opts may be
 * NULL; its handle/ctx/url are overridden. Asserts on failure. */
struct wf_ctl_server *echo_server(const char *dir, const char *name, struct echo_state *st,
                                  const struct wf_ctl_server_opts *opts);
char *ipc_url(const char *dir, const char *name);

/* A ModelStatus request for name. */
void req_model_status(Weightfloor__V1__Request *req, Weightfloor__V1__ModelStatus *ms,
                      const char *name);

int64_t now_ms(void);
void sleep_ms(int ms);

#endif
