/* The tests' HTTP client (httpc.h). */
#include "httpc.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int connect_local(uint16_t port)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
		int e = -errno;
		close(fd);
		return e;
	}
	return fd;
}

char *httpc_raw(uint16_t port, const void *bytes, size_t len, int timeout_ms, size_t *ret_len)
{
	int fd = connect_local(port);
	if (fd < 0)
		return NULL;
	int64_t end = now_ms() + timeout_ms;
	const char *p = bytes;
	while (len > 0) {
		ssize_t w = send(fd, p, len, MSG_NOSIGNAL);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			break; /* the server may close on bad bytes: read what it said */
		p += w;
		len -= (size_t)w;
	}
	shutdown(fd, SHUT_WR);
	size_t cap = 4096, n = 0;
	char *buf = malloc(cap + 1);
	for (;;) {
		int left = (int)(end - now_ms());
		if (left <= 0)
			break;
		struct pollfd pfd = {.fd = fd, .events = POLLIN};
		if (poll(&pfd, 1, left) <= 0)
			break;
		if (n == cap) {
			cap *= 2;
			buf = realloc(buf, cap + 1);
		}
		ssize_t r = recv(fd, buf + n, cap - n, 0);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		n += (size_t)r;
	}
	close(fd);
	buf[n] = '\0';
	*ret_len = n;
	return buf;
}

int httpc_request(uint16_t port, const char *method, const char *path, int timeout_ms,
                  struct httpc_reply *ret)
{
	char req[1024];
	int k =
	    snprintf(req, sizeof req, "%s %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", method, path);
	size_t n = 0;
	char *all = httpc_raw(port, req, (size_t)k, timeout_ms, &n);
	if (!all)
		return -ECONNREFUSED;
	memset(ret, 0, sizeof(*ret));
	char *sep = strstr(all, "\r\n\r\n");
	size_t head_len = sep ? (size_t)(sep - all) : n;
	ret->head = strndup(all, head_len);
	const char *body = sep ? sep + 4 : all + n;
	ret->body_len = n - (size_t)(body - all);
	ret->body = malloc(ret->body_len + 1);
	memcpy(ret->body, body, ret->body_len);
	ret->body[ret->body_len] = '\0';
	int major, minor, status;
	if (sscanf(all, "HTTP/%d.%d %d", &major, &minor, &status) == 3)
		ret->status = status;
	free(all);
	return 0;
}

void httpc_reply_fini(struct httpc_reply *r)
{
	free(r->head);
	free(r->body);
	memset(r, 0, sizeof(*r));
}

uint16_t httpc_free_port(void)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in sa = {.sin_family = AF_INET};
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	socklen_t sl = sizeof sa;
	uint16_t port = 0;
	if (fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
	    getsockname(fd, (struct sockaddr *)&sa, &sl) == 0)
		port = ntohs(sa.sin_port);
	if (fd >= 0)
		close(fd);
	return port;
}
