/* The one place where nng's error numbers become the project's return codes. */
#include "control/internal.h"

#include "base/error.h"

#include <errno.h>

int wf__ctl_nng_code(int rv)
{
	if (rv == 0)
		return 0;
	/* nng passes system errors through as NNG_ESYSERR | errno. */
	if (rv & NNG_ESYSERR) {
		int e = rv & ~NNG_ESYSERR;
		return e > 0 ? -e : WF_EINTERNAL;
	}
	if (rv & NNG_ETRANERR)
		return WF_ETRANSPORT;
	switch (rv) {
	case NNG_ETIMEDOUT:
		return WF_ETIMEOUT;
	case NNG_ECONNREFUSED:
	case NNG_ECLOSED:
	case NNG_EUNREACHABLE:
		return WF_EUNAVAILABLE;
	/* The connection went away under a request. Requests are not resent (see client.c), so the
	 * caller learns of it instead of waiting for its timeout. */
	case NNG_ECONNRESET:
	case NNG_ECONNABORTED:
	case NNG_ECONNSHUT:
	case NNG_ECRYPTO:
		return WF_ETRANSPORT;
	case NNG_EMSGSIZE:
		return WF_ELIMIT;
	case NNG_ENOMEM:
		return -ENOMEM;
	case NNG_EINVAL:
	case NNG_EADDRINVAL:
	case NNG_EBADTYPE:
	case NNG_EAMBIGUOUS:
	case NNG_ENOARG:
		return WF_EINVAL;
	case NNG_ENOTSUP:
		return WF_EUNSUPPORTED;
	case NNG_EADDRINUSE:
		return -EADDRINUSE;
	case NNG_EPERM:
	case NNG_EPEERAUTH:
		return WF_EPERMISSION;
	case NNG_ECANCELED:
	case NNG_EINTR:
		return WF_ECANCELED;
	case NNG_EPROTO:
		return WF_EPROTOCOL;
	case NNG_ESTATE:
	case NNG_EBUSY:
		return WF_ESTATE;
	case NNG_ENOENT:
		return -ENOENT;
	case NNG_EAGAIN:
		return -EAGAIN;
	case NNG_ENOSPC:
		return -ENOSPC;
	case NNG_ENOFILES:
		return -EMFILE;
	case NNG_EEXIST:
		return -EEXIST;
	case NNG_EREADONLY:
	case NNG_EWRITEONLY:
		return WF_EINVAL;
	default:
		return WF_EINTERNAL;
	}
}

int wf__ctl_nng_err(int rv, struct wf_diag *diag, const char *what)
{
	return wf_diag_set(diag, wf__ctl_nng_code(rv), "%s: %s", what, nng_strerror(rv));
}
