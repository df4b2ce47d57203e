/* The control-plane server: a REP socket that unpacks each Request, checks it, hands it to a
 * handler and sends the Reply back.
 *
 * Concurrency: nworkers threads, each with its own nng context, so a slow request (EnsureFloor
 * with wait) does not hold up the others; the handler is called from those threads, possibly
 * concurrently, and must be thread-safe.
 *
 * What the handler never sees (the server answers by itself, and keeps serving):
 *   - a request from an ipc peer that the listen policy does not allow: STATUS_PERMISSION_DENIED,
 *     request_id 0, and the bytes are not parsed at all (a peer whose credentials cannot be read
 *     is disconnected instead, before it can send anything);
 *   - bytes that do not unpack as a Request, or unpack to more than max_unpacked_size:
 *     STATUS_INVALID_ARGUMENT, request_id 0;
 *   - api_version of another major (or 0), request_id 0, or an unset/unknown body:
 *     STATUS_INVALID_ARGUMENT with the request's id ("unsupported request" for the body);
 *   - a message larger than max_request_size: the nng transport drops the connection before the
 *     message exists, so no reply is possible. Clients (client.h) refuse to send such messages
 *     themselves and see a dropped connection as WF_ETRANSPORT at once, never a hang.
 *
 * Lifecycle: create (binds: errors such as a busy address show here) and start (threads), then
 * the three steps of every object with asynchronous work in this tree: close (no new requests;
 * does not block), stop (waits for the handlers in progress, then closes the socket), destroy. */
#ifndef WF_CONTROL_SERVER_H
#define WF_CONTROL_SERVER_H

#include "base/diag.h"
#include "control/transport.h"
#include "weightfloor.pb-c.h"

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

struct wf_ctl_server;
/* One request in progress: the peer, and an arena for the reply. Valid only during the handler
 * call that receives it. */
struct wf_ctl_call;

/* Fills reply for req. The server has already set reply->request_id, reply->api_version and
 * reply->code = STATUS_OK, and the body is unset.
 *
 * Return 0 to send reply as filled (the handler may set another code and message itself), or a
 * negative code (-errno, WF_E*): the server then sends wf_proto_status_from_err(code) with the
 * handler's reply->message, or wf_strerror(code) when the handler left it empty, and no body.
 *
 * Everything reply points to must stay valid until the handler's caller has packed it, after the
 * handler returns: allocate it with wf_ctl_call_alloc()/_strdup()/_printf() (freed after the
 * reply is sent), point into req (valid until the reply is packed), or at static data. Never at
 * data another thread may change. */
typedef int (*wf_ctl_handle_fn)(void *ctx, const Weightfloor__V1__Request *req,
                                Weightfloor__V1__Reply *reply, struct wf_ctl_call *call);

struct wf_ctl_server_opts {
	struct wf_ctl_listen_opts listen; /* url NULL: WF_CTL_DEFAULT_URL */
	size_t max_request_size;          /* packed Request bytes; 0: WF_CTL_MAX_REQUEST_DEFAULT */
	size_t max_reply_size;    /* packed Reply bytes; 0: WF_CTL_MAX_REPLY_DEFAULT. A larger
	                             reply is replaced by STATUS_RESOURCE_EXHAUSTED. */
	size_t max_unpacked_size; /* memory for one unpacked Request; 0: 8 * max_request_size */
	unsigned nworkers;        /* concurrent requests; 0: 4; at most 64 */
	unsigned
	    send_timeout_ms; /* a reply that cannot be queued in this time is dropped; 0: 1000 */
	wf_ctl_handle_fn handle; /* required */
	void *ctx;               /* passed to handle */
};

/* Creates the server and starts listening (clients may connect and queue requests; nothing is
 * served before wf_ctl_server_start()). Returns 0, WF_EINVAL (bad options or url), WF_EUNSUPPORTED
 * (transport), -EADDRINUSE (another server has the address), -errno or WF_E* from nng; diag says
 * which. opts is not kept. */
int wf_ctl_server_create(const struct wf_ctl_server_opts *opts, struct wf_ctl_server **ret_srv,
                         struct wf_diag *diag);

/* Starts the worker threads, and a watchdog thread that replaces the listener when nng 1.5.2
 * stops accepting after a peer hung up mid-handshake (nng issue #1518; the replacement drops the
 * current connections, whose clients reconnect by themselves). Returns 0 or -errno
 * (pthread_create); on failure the threads that did start are still running and
 * wf_ctl_server_close/stop/destroy take them down. Call once. */
int wf_ctl_server_start(struct wf_ctl_server *srv);

/* Stops taking requests: workers waiting for one return, and wf_ctl_call_closing() turns true for
 * handlers in progress. Does not block; thread-safe; idempotent. */
void wf_ctl_server_close(struct wf_ctl_server *srv);

/* close(), then waits for the worker threads (so for handlers in progress: long handlers must
 * poll wf_ctl_call_closing()) and closes the socket, which drops the connections and removes the
 * ipc socket file. Not from a handler. Idempotent. */
void wf_ctl_server_stop(struct wf_ctl_server *srv);

/* stop() if needed, then frees. Accepts NULL. */
void wf_ctl_server_destroy(struct wf_ctl_server *srv);

/* The listening URL, with a tcp port 0 replaced by the bound port. Owned by srv. */
const char *wf_ctl_server_url(const struct wf_ctl_server *srv);

/* ---- inside a handler ---------------------------------------------------------------------- */

const struct wf_ctl_peer *wf_ctl_call_peer(const struct wf_ctl_call *call);

/* True once the server is closing: a handler that waits (EnsureFloor with wait) should give up
 * and return WF_EUNAVAILABLE. Thread-safe. */
bool wf_ctl_call_closing(const struct wf_ctl_call *call);

/* Milliseconds left of the client's budget (Request.deadline_ms, counted from when the server
 * took the request), at most cap_ms (> 0), which is also the answer when the client gave none;
 * 0 once it has passed (answer WF_ETIMEOUT without starting anything). Thread-safe. */
int wf_ctl_call_time_left_ms(const struct wf_ctl_call *call, int cap_ms);

/* Zeroed memory that lives until the reply has been sent. NULL on overflow or out of memory
 * (return -ENOMEM then). */
void *wf_ctl_call_alloc(struct wf_ctl_call *call, size_t size);
/* size elements of elem_size bytes, with overflow checked. */
void *wf_ctl_call_calloc(struct wf_ctl_call *call, size_t n, size_t elem_size);
char *wf_ctl_call_strdup(struct wf_ctl_call *call, const char *s);
char *wf_ctl_call_printf(struct wf_ctl_call *call, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#ifdef __cplusplus
}
#endif
#endif
