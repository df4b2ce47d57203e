/* Control-plane clients: request/reply (agentctl, workers, external control planes) and event
 * subscription (agentctl watch).
 *
 * Requests are never resent by the transport: if the connection drops while a request is out,
 * the call fails at once with WF_ETRANSPORT rather than being delivered twice (RegisterModel and
 * EnsureFloor are not idempotent). The caller decides whether to retry. Every call has a
 * timeout. */
#ifndef WF_CONTROL_CLIENT_H
#define WF_CONTROL_CLIENT_H

#include "base/diag.h"
#include "control/transport.h"
#include "weightfloor.pb-c.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct wf_ctl_client;
struct wf_ctl_sub;

/* Zero-initialised fields take the defaults. Read during open only. */
struct wf_ctl_client_opts {
	const char *client_name; /* Request.client when a request leaves it empty */
	size_t max_request_size; /* a larger packed Request fails with WF_ELIMIT before it is sent;
	                            0: WF_CTL_MAX_REQUEST_DEFAULT (the server's default limit) */
	size_t max_reply_size;   /* 0: WF_CTL_MAX_REPLY_DEFAULT; for a subscriber, the largest
	                            event, 0: WF_CTL_MAX_EVENT_DEFAULT */
	/* false: open fails with WF_EUNAVAILABLE when nothing listens at the url. true: open
	 * succeeds and connects in the background (requests wait for the connection, within their
	 * timeout), as workers that start before the agent need. Both reconnect after a drop. */
	bool wait_for_server;
	bool allow_insecure_tcp; /* permit tcp://, and tls+tcp:// without verifying the server */
	struct wf_ctl_tls_opts tls;
};

/* Connects to a server. timeout_ms is the default per-call timeout (0: WF_CTL_TIMEOUT_DEFAULT_MS);
 * opts may be NULL. Returns 0, WF_EUNAVAILABLE (nobody listens), WF_EPERMISSION (the socket file
 * refuses us), WF_EINVAL/WF_EUNSUPPORTED (url, options), or another translated nng error. */
int wf_ctl_client_open(const char *url, int timeout_ms, const struct wf_ctl_client_opts *opts,
                       struct wf_ctl_client **ret_client, struct wf_diag *diag);

/* Sends req and waits for its reply within the client's timeout. The client sets request_id
 * (unique per client, never 0) and api_version in what it sends, and client when req->client
 * is empty; req itself is not modified.
 *
 * Returns 0 when a reply arrived, whatever its code: *ret_reply is then the caller's, to free
 * with wf_ctl_reply_free(); wf_proto_status_to_err(reply->code) turns the code into a return
 * code. A reply with request_id 0 is the server refusing the envelope itself (permission,
 * malformed) and is returned too; its code is never STATUS_OK.
 * Errors (no reply): WF_ELIMIT (request larger than max_request_size), WF_ETIMEOUT,
 * WF_ETRANSPORT (connection dropped: server gone, or it refused the message as too large),
 * WF_EUNAVAILABLE (client closed), WF_EPROTOCOL (the reply does not parse or answers another
 * request), -ENOMEM. diag says which.
 * Thread-safe: concurrent calls on one client each use their own nng context. */
int wf_ctl_client_call(struct wf_ctl_client *client, const Weightfloor__V1__Request *req,
                       Weightfloor__V1__Reply **ret_reply, struct wf_diag *diag);
/* The same with an explicit timeout (EnsureFloor with wait needs longer than the default). */
int wf_ctl_client_call_timeout(struct wf_ctl_client *client, const Weightfloor__V1__Request *req,
                               int timeout_ms, Weightfloor__V1__Reply **ret_reply,
                               struct wf_diag *diag);

/* Waits up to timeout_ms (0: not at all) for the client to have a connection to the server.
 * Returns 0 when it has one, WF_EUNAVAILABLE when it has none (nothing listens, or the server
 * does not complete the handshake: stopped or hung). For callers that must not spend a
 * request's whole budget on a server that is not there (a call waits for the connection within
 * its timeout). Thread-safe. */
int wf_ctl_client_wait_connected(struct wf_ctl_client *client, int timeout_ms);

/* Frees a reply from wf_ctl_client_call(). Accepts NULL. */
void wf_ctl_reply_free(Weightfloor__V1__Reply *reply);

/* Closes the connection. Calls still in progress on other threads must have returned. Accepts
 * NULL. */
void wf_ctl_client_close(struct wf_ctl_client *client);

/* ---- events -------------------------------------------------------------------------------- */

/* Subscribes to every event of a publisher (pub.h). opts may be NULL; client_name and
 * max_request_size are unused. Events published before the connection is up are not seen (PUB
 * keeps no history); a subscriber that falls behind loses events, which shows as a jump in
 * Event.sequence. */
int wf_ctl_sub_open(const char *url, const struct wf_ctl_client_opts *opts,
                    struct wf_ctl_sub **ret_sub, struct wf_diag *diag);

/* Waits up to timeout_ms (< 0: forever) for the next event. Returns 0 and an event to free with
 * wf_ctl_event_free(), WF_ETIMEOUT when none came, WF_EFORMAT for a message that is not an Event
 * (it is consumed; call again), or another translated nng error. One receiving thread at a
 * time. */
int wf_ctl_sub_recv(struct wf_ctl_sub *sub, int timeout_ms, Weightfloor__V1__Event **ret_event,
                    struct wf_diag *diag);

void wf_ctl_event_free(Weightfloor__V1__Event *event);

/* Accepts NULL. */
void wf_ctl_sub_close(struct wf_ctl_sub *sub);

#ifdef __cplusplus
}
#endif
#endif
