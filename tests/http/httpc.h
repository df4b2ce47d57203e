/* A minimal HTTP/1.0 client for the tests: one request per connection to 127.0.0.1, the whole
 * answer read until the server closes. Also raw sends for hostile-input tests. */
#ifndef WF_TESTS_HTTP_HTTPC_H
#define WF_TESTS_HTTP_HTTPC_H

#include <stddef.h>
#include <stdint.h>

struct httpc_reply {
	int status; /* 0 when no status line came back */
	char *head; /* the status line and headers (malloc'ed) */
	char *body; /* malloc'ed, NUL-terminated */
	size_t body_len;
};

/* "METHOD path" to 127.0.0.1:port with a timeout; returns 0 and *ret, or -errno. */
int httpc_request(uint16_t port, const char *method, const char *path, int timeout_ms,
                  struct httpc_reply *ret);
/* Sends raw bytes, then reads what comes back until close or timeout (returned, malloc'ed,
 * NULL on connection failure); *ret_len its length. */
char *httpc_raw(uint16_t port, const void *bytes, size_t len, int timeout_ms, size_t *ret_len);
void httpc_reply_fini(struct httpc_reply *r);
/* A port nothing listens on now (bound to 0 and released). */
uint16_t httpc_free_port(void);

#endif
