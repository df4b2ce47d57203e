/* The one libc call of nng 1.5.2 that this library overrides: sendmsg(), so that writing to a
 * stream socket whose peer is gone fails with ECONNRESET instead of EPIPE.
 *
 * Why: nng 1.5.2's ipc, tcp and tls transports send their 8-byte SP header as soon as they have
 * accepted a connection. When the peer has already hung up, sendmsg() fails with EPIPE, which nng
 * translates to NNG_ECLOSED and hands to the socket's listener as the result of its accept; the
 * listener reads NNG_ECLOSED as "I was closed" and never accepts again (nng issue #1518, fixed in
 * nng 1.6.0). Any process that can open the socket could silence the agent or a worker by
 * connecting and hanging up; a storm of such connections did it within a few hundred tries.
 * Replacing the dead listener (the watchdog in transport.c) is not enough on its own: nng never
 * frees the connections that finished the handshake on a dead listener, so every replacement
 * leaked their descriptors.
 *
 * ECONNRESET means the same thing to every caller ("the peer is gone"), and nng's listener treats
 * it as a remote condition and keeps accepting. Only stream sockets are remapped, only on EPIPE;
 * everything else goes to the C library's sendmsg() untouched.
 *
 * The definition takes effect because the executable that links this static library defines
 * sendmsg and libnng.so calls it through its PLT: the dynamic linker binds libnng's reference to
 * the executable's definition (the same interposition that replacement allocators use).
 * wf__ctl_sockshim_active() says whether that happened (it does not when libwfcontrol is built
 * as a shared library loaded after libc). */
#include "control/internal.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <sys/socket.h>

typedef ssize_t (*sendmsg_fn)(int, const struct msghdr *, int);

static sendmsg_fn real_sendmsg;
static pthread_once_t real_once = PTHREAD_ONCE_INIT;

static void find_real(void)
{
	real_sendmsg = (sendmsg_fn)dlsym(RTLD_NEXT, "sendmsg");
}

ssize_t sendmsg(int fd, const struct msghdr *msg, int flags)
{
	pthread_once(&real_once, find_real);
	if (!real_sendmsg) {
		errno = ENOSYS;
		return -1;
	}
	ssize_t n = real_sendmsg(fd, msg, flags);
	if (n < 0 && errno == EPIPE) {
		int type = 0;
		socklen_t len = sizeof(type);
		if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) == 0 && type == SOCK_STREAM)
			errno = ECONNRESET;
		else
			errno = EPIPE;
	}
	return n;
}

bool wf__ctl_sockshim_active(void)
{
	return dlsym(RTLD_DEFAULT, "sendmsg") == (void *)sendmsg;
}
