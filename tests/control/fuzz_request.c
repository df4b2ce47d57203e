/* libFuzzer target for the server's request path without sockets: unpack under the memory
 * budget, envelope checks, the echo handler, reply check and pack. Every input must produce a
 * reply that parses, with a valid status, and never STATUS_OK with request_id 0. */
#include "control/internal.h"
#include "proto/status.h"
#include "tests/control/ctl_test.h"

#include "base/error.h"

#include <stdlib.h>
#include <string.h>

/* The echo handler minus its deliberately slow names, which would only time the fuzzer out. */
static int fuzz_handle(void *ctx, const Weightfloor__V1__Request *req,
                       Weightfloor__V1__Reply *reply, struct wf_ctl_call *call)
{
	if (req->body_case == WEIGHTFLOOR__V1__REQUEST__BODY_MODEL_STATUS &&
	    (strncmp(req->model_status->name, "slow:", 5) == 0 ||
	     strcmp(req->model_status->name, "block") == 0))
		return WF_EUNAVAILABLE;
	return echo_handle(ctx, req, reply, call);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct echo_state st;
	static struct wf__ctl_listener lst = {
	    .transport = WF_CTL_TRANSPORT_IPC,
	    .auth = {.any = true},
	};
	static const struct wf_ctl_peer peer = {
	    .transport = WF_CTL_TRANSPORT_IPC, .has_creds = true, .uid = 0, .gid = 0, .pid = 1};
	static atomic_bool closing;
	const struct wf__ctl_dispatch d = {
	    .handle = fuzz_handle,
	    .ctx = &st,
	    .max_reply = 1 << 20,
	    .max_unpacked = 1 << 20,
	    .lst = &lst,
	    .peer = &peer,
	    .closing = &closing,
	};
	nng_msg *out = wf__ctl_answer(&d, (nng_pipe)NNG_PIPE_INITIALIZER, data, size);
	if (!out)
		abort();
	Weightfloor__V1__Reply *r =
	    weightfloor__v1__reply__unpack(NULL, nng_msg_len(out), nng_msg_body(out));
	if (!r || !wf_proto_status_valid(r->code) ||
	    (r->request_id == 0 && r->code == WEIGHTFLOOR__V1__STATUS__STATUS_OK))
		abort();
	weightfloor__v1__reply__free_unpacked(r, NULL);
	nng_msg_free(out);
	return 0;
}
