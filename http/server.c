/* The HTTP endpoint over libmicrohttpd (http/server.h). */
#include "http/server.h"

#include "base/error.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#define CONNECTION_LIMIT     32
#define PER_IP_LIMIT         8
#define CONNECTION_MEMORY    (16 * 1024)
#define CONNECTION_TIMEOUT_S 10
#define REASON_MAX           256

struct wf_http_server {
	struct MHD_Daemon *mhd;
	struct wf_http_opts opts;
	uint16_t port;
	pthread_mutex_t mu; /* ready, reason */
	bool ready;
	char reason[REASON_MAX];
};

int wf_http_addr_parse(const char *spec, struct sockaddr_storage *ret_addr, socklen_t *ret_len,
                       struct wf_diag *diag)
{
	if (!spec)
		return wf_diag_set(diag, WF_EINVAL, "no address given");
	const char *colon = strrchr(spec, ':');
	if (!colon)
		return wf_diag_set(diag, WF_EINVAL, "'%s' is not HOST:PORT (e.g. 127.0.0.1:9400)",
		                   spec);
	const char *port_s = colon + 1;
	char *end;
	errno = 0;
	unsigned long port = strtoul(port_s, &end, 10);
	if (!*port_s || *end || errno || port > 65535 || port_s[0] == '-' || port_s[0] == '+')
		return wf_diag_set(diag, WF_EINVAL, "'%s': the port must be a number in 0..65535",
		                   spec);
	char host[256];
	size_t hl = (size_t)(colon - spec);
	if (hl >= sizeof host)
		return wf_diag_set(diag, WF_EINVAL, "'%.64s...': the host is too long", spec);
	memcpy(host, spec, hl);
	host[hl] = '\0';
	if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']') {
		memmove(host, host + 1, hl - 2);
		host[hl - 2] = '\0';
	} else if (strchr(host, ':') || strchr(host, '[') || strchr(host, ']')) {
		return wf_diag_set(diag, WF_EINVAL,
		                   "'%s': write an IPv6 host in brackets "
		                   "([::1]:9400)",
		                   spec);
	}
	/* No host, or "localhost", is the IPv4 loopback without asking the resolver: a minimal
	 * root (a container, a fresh chroot) may have no /etc/hosts, and RFC 6761 lets localhost
	 * mean loopback by definition. */
	if (!host[0] || strcasecmp(host, "localhost") == 0)
		snprintf(host, sizeof host, "127.0.0.1");
	struct addrinfo hints = {
	    .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
	struct addrinfo *res = NULL;
	char port_buf[8];
	snprintf(port_buf, sizeof port_buf, "%lu", port);
	int g = getaddrinfo(host, port_buf, &hints, &res);
	if (g != 0 || !res)
		return wf_diag_set(diag, WF_ENOT_FOUND, "'%s': cannot resolve '%s': %s", spec, host,
		                   gai_strerror(g));
	memset(ret_addr, 0, sizeof(*ret_addr));
	memcpy(ret_addr, res->ai_addr, res->ai_addrlen);
	*ret_len = res->ai_addrlen;
	freeaddrinfo(res);
	return 0;
}

static enum MHD_Result reply(struct MHD_Connection *c, unsigned status, const char *type,
                             char *body, size_t len, enum MHD_ResponseMemoryMode mode, bool allow)
{
	struct MHD_Response *r = MHD_create_response_from_buffer(len, body, mode);
	if (!r) {
		if (mode == MHD_RESPMEM_MUST_FREE)
			free(body);
		return MHD_NO;
	}
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
	MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
	if (allow)
		MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
	enum MHD_Result ret = MHD_queue_response(c, status, r);
	MHD_destroy_response(r);
	return ret;
}

static enum MHD_Result reply_text(struct MHD_Connection *c, unsigned status, const char *line)
{
	char buf[REASON_MAX + 2];
	int n = snprintf(buf, sizeof buf, "%s\n", line);
	if (n < 0 || (size_t)n >= sizeof buf)
		n = (int)sizeof buf - 1;
	return reply(c, status, "text/plain; charset=utf-8", buf, (size_t)n, MHD_RESPMEM_MUST_COPY,
	             false);
}

/* A probe's reason made one printable line. */
static void one_line(char *s)
{
	for (char *p = s; *p; p++)
		if (*p == '\n' || *p == '\r' || (unsigned char)*p < 0x20)
			*p = ' ';
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls)
{
	(void)version;
	(void)upload_data;
	(void)con_cls;
	struct wf_http_server *s = cls;
	if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0) {
		/* Answered before any body is read; libmicrohttpd discards the rest and closes. */
		*upload_data_size = 0;
		static const char msg[] = "method not allowed\n";
		return reply(c, MHD_HTTP_METHOD_NOT_ALLOWED, "text/plain; charset=utf-8",
		             (char *)msg, sizeof msg - 1, MHD_RESPMEM_PERSISTENT, true);
	}
	if (strcmp(url, "/metrics") == 0) {
		char *text = NULL;
		size_t len = 0;
		if (wf_metrics_render(s->opts.metrics, &text, &len) < 0)
			return reply_text(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory");
		return reply(c, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", text, len,
		             MHD_RESPMEM_MUST_FREE, false);
	}
	char reason[REASON_MAX] = "";
	if (strcmp(url, "/healthz") == 0) {
		if (s->opts.live && !s->opts.live(s->opts.ctx, reason, sizeof reason)) {
			one_line(reason);
			return reply_text(c, MHD_HTTP_SERVICE_UNAVAILABLE,
			                  reason[0] ? reason : "not healthy");
		}
		return reply_text(c, MHD_HTTP_OK, "ok");
	}
	if (strcmp(url, "/readyz") == 0) {
		pthread_mutex_lock(&s->mu);
		bool ready = s->ready;
		snprintf(reason, sizeof reason, "%s", s->reason);
		pthread_mutex_unlock(&s->mu);
		if (ready && s->opts.ready)
			ready = s->opts.ready(s->opts.ctx, reason, sizeof reason);
		if (!ready) {
			one_line(reason);
			return reply_text(c, MHD_HTTP_SERVICE_UNAVAILABLE,
			                  reason[0] ? reason : "not ready");
		}
		return reply_text(c, MHD_HTTP_OK, "ready");
	}
	return reply_text(c, MHD_HTTP_NOT_FOUND, "not found (try /metrics, /healthz, /readyz)");
}

/* libmicrohttpd's own messages are dropped: library code does not log, and nothing it says
 * about a client's bad bytes is the daemon's business. */
static void mhd_log(void *cls, const char *fmt, va_list ap)
{
	(void)cls;
	(void)fmt;
	(void)ap;
}

int wf_http_server_start(const struct wf_http_opts *opts, struct wf_http_server **ret,
                         struct wf_diag *diag)
{
	struct sockaddr_storage ss;
	socklen_t sl = 0;
	int rc = wf_http_addr_parse(opts->addr, &ss, &sl, diag);
	if (rc < 0)
		return rc;
	if (!opts->metrics)
		return wf_diag_set(diag, WF_EINVAL, "no metrics registry");
	int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return wf_diag_set(diag, -errno, "socket: %s", strerror(errno));
	int one = 1;
	(void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (ss.ss_family == AF_INET6)
		(void)setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
	if (bind(fd, (struct sockaddr *)&ss, sl) < 0) {
		rc = -errno;
		close(fd);
		return wf_diag_set(diag, rc, "bind %s: %s", opts->addr, strerror(-rc));
	}
	if (listen(fd, 64) < 0) {
		rc = -errno;
		close(fd);
		return wf_diag_set(diag, rc, "listen %s: %s", opts->addr, strerror(-rc));
	}
	struct sockaddr_storage bound;
	socklen_t bl = sizeof bound;
	uint16_t port = 0;
	if (getsockname(fd, (struct sockaddr *)&bound, &bl) == 0)
		port =
		    ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
		                                      : ((struct sockaddr_in *)&bound)->sin_port);

	struct wf_http_server *s = calloc(1, sizeof(*s));
	if (!s) {
		close(fd);
		return -ENOMEM;
	}
	s->opts = *opts;
	s->port = port;
	pthread_mutex_init(&s->mu, NULL);
	snprintf(s->reason, sizeof s->reason, "starting");
	unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
	                 (ss.ss_family == AF_INET6 ? MHD_USE_IPv6 : 0);
	s->mhd = MHD_start_daemon(flags, 0, NULL, NULL, on_request, s, MHD_OPTION_LISTEN_SOCKET,
	                          (MHD_socket)fd, MHD_OPTION_CONNECTION_LIMIT,
	                          (unsigned)CONNECTION_LIMIT, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
	                          (unsigned)PER_IP_LIMIT, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
	                          (size_t)CONNECTION_MEMORY, MHD_OPTION_CONNECTION_TIMEOUT,
	                          (unsigned)CONNECTION_TIMEOUT_S, MHD_OPTION_EXTERNAL_LOGGER,
	                          mhd_log, NULL, MHD_OPTION_END);
	if (!s->mhd) {
		close(fd);
		pthread_mutex_destroy(&s->mu);
		free(s);
		return wf_diag_set(diag, WF_EINTERNAL, "libmicrohttpd did not start on %s",
		                   opts->addr);
	}
	*ret = s;
	return 0;
}

void wf_http_server_set_ready(struct wf_http_server *s, bool ready, const char *reason)
{
	pthread_mutex_lock(&s->mu);
	s->ready = ready;
	snprintf(s->reason, sizeof s->reason, "%s", reason ? reason : "not ready");
	pthread_mutex_unlock(&s->mu);
}

uint16_t wf_http_server_port(const struct wf_http_server *s)
{
	return s->port;
}

void wf_http_server_destroy(struct wf_http_server *s)
{
	if (!s)
		return;
	if (s->mhd)
		MHD_stop_daemon(s->mhd); /* closes the listening socket too */
	pthread_mutex_destroy(&s->mu);
	free(s);
}
