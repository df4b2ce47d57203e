#include "proto/status.h"

#include "base/error.h"

#include <errno.h>

/* One row per Status: its short name and the canonical return code a client gets back. */
#define WF_PROTO_STATUS_MAP(X)                                                                     \
	X(OK, 0)                                                                                   \
	X(NOT_FOUND, WF_ENOT_FOUND)                                                                \
	X(NOT_RESIDENT, WF_ENOT_RESIDENT)                                                          \
	X(RESOURCE_EXHAUSTED, WF_ENO_SPACE)                                                        \
	X(INVALID_ARGUMENT, WF_EINVAL)                                                             \
	X(PERMISSION_DENIED, WF_EPERMISSION)                                                       \
	X(FAILED_PRECONDITION, WF_ESTATE)                                                          \
	X(UNAVAILABLE, WF_EUNAVAILABLE)                                                            \
	X(INTERNAL, WF_EINTERNAL)

#define ST(name) WEIGHTFLOOR__V1__STATUS__STATUS_##name

Weightfloor__V1__Status wf_proto_status_from_err(int err)
{
	if (err == 0)
		return ST(OK);
	switch (err) {
	case WF_ENOT_FOUND:
	case -ENOENT:
		return ST(NOT_FOUND);
	case WF_ENOT_RESIDENT:
		return ST(NOT_RESIDENT);
	case WF_ENO_SPACE:
	case WF_ELIMIT:
	case -ENOSPC:
	case -ENOMEM:
	case -EDQUOT:
	case -EFBIG:
	case -EMFILE:
	case -ENFILE:
		return ST(RESOURCE_EXHAUSTED);
	/* Bad request arguments, and model files that fail validation: either way the caller named
	 * something the agent cannot use, and retrying the same request will not help. */
	case WF_EINVAL:
	case WF_EUNSUPPORTED:
	case WF_EFORMAT:
	case WF_EMAGIC:
	case WF_EVERSION:
	case WF_ETRUNCATED:
	case WF_EOVERFLOW:
	case WF_EALIGN:
	case WF_EOVERLAP:
	case WF_EDUPLICATE:
	case WF_EUNKNOWN_TYPE:
	case WF_ESHARD:
	case -EINVAL:
	case -ENAMETOOLONG:
	case -ENOTDIR:
	case -EISDIR:
	case -ENOTSUP:
		return ST(INVALID_ARGUMENT);
	case WF_EPERMISSION:
	case -EACCES:
	case -EPERM:
		return ST(PERMISSION_DENIED);
	case WF_ESTATE:
	case WF_ENOT_READY:
	case WF_ECHANGED:
	case WF_ECHECKSUM:
	case -EEXIST:
	case -EBUSY:
		return ST(FAILED_PRECONDITION);
	/* Transient: the same request may succeed later. */
	case WF_EUNAVAILABLE:
	case WF_ETIMEOUT:
	case WF_ECANCELED:
	case -EAGAIN:
	case -EINTR:
	case -ETIMEDOUT:
	case -ECONNREFUSED:
		return ST(UNAVAILABLE);
	default:
		return ST(INTERNAL);
	}
}

int wf_proto_status_to_err(Weightfloor__V1__Status status)
{
	switch (status) {
#define TO_ERR_(name, code)                                                                        \
	case ST(name):                                                                             \
		return code;
		WF_PROTO_STATUS_MAP(TO_ERR_)
#undef TO_ERR_
	default:
		return WF_EPROTOCOL;
	}
}

const char *wf_proto_status_name(Weightfloor__V1__Status status)
{
	switch (status) {
	case ST(UNSPECIFIED):
		return "UNSPECIFIED";
#define NAME_(name, code)                                                                          \
	case ST(name):                                                                             \
		return #name;
		WF_PROTO_STATUS_MAP(NAME_)
#undef NAME_
	default:
		return "UNKNOWN";
	}
}

int wf_proto_status_valid(Weightfloor__V1__Status status)
{
	switch (status) {
#define VALID_(name, code) case ST(name):
		WF_PROTO_STATUS_MAP(VALID_)
#undef VALID_
		return 1;
	default:
		return 0;
	}
}
