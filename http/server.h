/* The daemons' HTTP endpoint (libmicrohttpd): GET /metrics, /healthz and /readyz.
 *
 *   /metrics  200, the registry rendered (http/metrics.h), Content-Type
 *             "text/plain; version=0.0.4; charset=utf-8"
 *   /healthz  200 "ok" while the daemon's loops run (the live callback says so); 503 and a
 *             one-line reason when it says they do not
 *   /readyz   200 "ready" once the daemon said so (wf_http_server_set_ready, and the ready
 *             callback when given); 503 and a one-line reason before and after
 *   other paths 404; methods other than GET and HEAD 405 (with Allow: GET, HEAD)
 *
 * One thread (libmicrohttpd's internal polling thread) serves every connection; each request
 * is answered from memory, so a slow client costs a connection slot, not the daemon. Limits:
 * 32 connections (8 per client address), 16 KiB of request memory per connection (longer
 * request lines or headers get 431/414 or a closed connection), 10 s idle time-out. Nothing
 * a client sends is interpreted beyond the method and the path.
 *
 * Library code: nothing here logs. */
#ifndef WF_HTTP_SERVER_H
#define WF_HTTP_SERVER_H

#include "base/diag.h"
#include "http/metrics.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Parses "HOST:PORT" (HOST an IPv4 address, "[IPv6]" or a name resolved now; omitted, as in
 * ":9400", it is 127.0.0.1) into *ret_addr and *ret_len. PORT 0..65535 (0: any free port).
 * Returns 0, WF_EINVAL (with the reason in diag) or the resolver's failure as WF_ENOT_FOUND. */
int wf_http_addr_parse(const char *spec, struct sockaddr_storage *ret_addr, socklen_t *ret_len,
                       struct wf_diag *diag);

/* A probe's answer: true when healthy / ready; else a one-line reason into reason[len]. Called
 * on the server's thread; must not block. */
typedef bool wf_http_probe_fn(void *ctx, char *reason, size_t len);

struct wf_http_opts {
	const char *addr;           /* "HOST:PORT" as wf_http_addr_parse() reads it */
	struct wf_metrics *metrics; /* borrowed; must outlive the server */
	wf_http_probe_fn *live;     /* optional: /healthz is 200 when NULL */
	wf_http_probe_fn *ready;    /* optional: consulted once set_ready(true) was called */
	void *ctx;
};

struct wf_http_server;

/* Binds and listens (SO_REUSEADDR, O_CLOEXEC), then starts the serving thread. The server
 * starts not ready ("starting"). Start it after the daemon blocked its signals: the thread
 * inherits the mask. Returns 0 and *ret, WF_EINVAL for a bad address, -errno of socket/bind/
 * listen (EADDRINUSE, EACCES, ...), or WF_EINTERNAL when libmicrohttpd refuses to start; the
 * reason in diag. */
int wf_http_server_start(const struct wf_http_opts *opts, struct wf_http_server **ret,
                         struct wf_diag *diag);

/* Readiness as the daemon sees it; reason (NULL: "not ready") is shown by /readyz while not
 * ready. Thread-safe. */
void wf_http_server_set_ready(struct wf_http_server *s, bool ready, const char *reason);

/* The bound port (the one chosen when the address said 0). */
uint16_t wf_http_server_port(const struct wf_http_server *s);

/* Stops the thread (closing every connection) and frees the server. Accepts NULL. */
void wf_http_server_destroy(struct wf_http_server *s);

#ifdef __cplusplus
}
#endif
#endif
