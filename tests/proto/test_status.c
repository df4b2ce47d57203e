/* Status <-> return-code mapping: the table of docs/PROTOCOL.md, and round trips. */
#include "base/error.h"
#include "proto/status.h"
#include "proto/version.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <string.h>

#define ST(name) WEIGHTFLOOR__V1__STATUS__STATUS_##name

struct row {
	int err;
	Weightfloor__V1__Status status;
};

/* The mapping the brief and docs/PROTOCOL.md promise. */
static const struct row table[] = {
    {0, ST(OK)},
    {WF_ENOT_FOUND, ST(NOT_FOUND)},
    {-ENOENT, ST(NOT_FOUND)},
    {WF_ENOT_RESIDENT, ST(NOT_RESIDENT)},
    {-ENOSPC, ST(RESOURCE_EXHAUSTED)},
    {WF_ENO_SPACE, ST(RESOURCE_EXHAUSTED)},
    {-ENOMEM, ST(RESOURCE_EXHAUSTED)},
    {WF_ELIMIT, ST(RESOURCE_EXHAUSTED)},
    {WF_EINVAL, ST(INVALID_ARGUMENT)},
    {-EINVAL, ST(INVALID_ARGUMENT)},
    {WF_EFORMAT, ST(INVALID_ARGUMENT)},
    {WF_ETRUNCATED, ST(INVALID_ARGUMENT)},
    {WF_EMAGIC, ST(INVALID_ARGUMENT)},
    {WF_EUNSUPPORTED, ST(INVALID_ARGUMENT)},
    {WF_EPERMISSION, ST(PERMISSION_DENIED)},
    {-EACCES, ST(PERMISSION_DENIED)},
    {-EPERM, ST(PERMISSION_DENIED)},
    {WF_ESTATE, ST(FAILED_PRECONDITION)},
    {-EBUSY, ST(FAILED_PRECONDITION)},
    {-EEXIST, ST(FAILED_PRECONDITION)},
    {WF_EUNAVAILABLE, ST(UNAVAILABLE)},
    {WF_ETIMEOUT, ST(UNAVAILABLE)},
    {WF_ECANCELED, ST(UNAVAILABLE)},
    {-EAGAIN, ST(UNAVAILABLE)},
    {WF_EINTERNAL, ST(INTERNAL)},
    {WF_EDEVICE, ST(INTERNAL)},
    {WF_ETRANSPORT, ST(INTERNAL)},
    {-EIO, ST(INTERNAL)},
    {-EBADF, ST(INTERNAL)},
    {12345, ST(INTERNAL)}, /* positive: a caller bug, never OK */
};

Test(status, table, .timeout = 10)
{
	for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++)
		cr_expect_eq(wf_proto_status_from_err(table[i].err), table[i].status,
		             "%s (%d) -> %s, expected %s", wf_err_name(table[i].err), table[i].err,
		             wf_proto_status_name(wf_proto_status_from_err(table[i].err)),
		             wf_proto_status_name(table[i].status));
}

Test(status, every_wf_error_maps_to_a_valid_non_ok_status, .timeout = 10)
{
	for (int e = WF_E_BASE_ + 1; e < WF_E_MAX_; e++) {
		Weightfloor__V1__Status s = wf_proto_status_from_err(e);
		cr_expect(wf_proto_status_valid(s), "%s", wf_err_name(e));
		cr_expect_neq(s, ST(OK), "%s", wf_err_name(e));
	}
	for (int e = 1; e < 134; e++)
		cr_expect_neq(wf_proto_status_from_err(-e), ST(OK), "errno %d", e);
}

Test(status, round_trip_through_canonical_code, .timeout = 10)
{
	for (int s = ST(OK); s <= ST(INTERNAL); s++) {
		cr_assert(wf_proto_status_valid(s));
		int err = wf_proto_status_to_err(s);
		cr_expect_eq((int)wf_proto_status_from_err(err), s, "%s -> %s -> %s",
		             wf_proto_status_name(s), wf_err_name(err),
		             wf_proto_status_name(wf_proto_status_from_err(err)));
		cr_expect_eq(err == 0, s == ST(OK));
	}
	cr_expect_eq(wf_proto_status_to_err(ST(NOT_FOUND)), WF_ENOT_FOUND);
	cr_expect_eq(wf_proto_status_to_err(ST(RESOURCE_EXHAUSTED)), WF_ENO_SPACE);
	cr_expect_eq(wf_proto_status_to_err(ST(INVALID_ARGUMENT)), WF_EINVAL);
	cr_expect_eq(wf_proto_status_to_err(ST(PERMISSION_DENIED)), WF_EPERMISSION);
	cr_expect_eq(wf_proto_status_to_err(ST(FAILED_PRECONDITION)), WF_ESTATE);
	cr_expect_eq(wf_proto_status_to_err(ST(UNAVAILABLE)), WF_EUNAVAILABLE);
	cr_expect_eq(wf_proto_status_to_err(ST(INTERNAL)), WF_EINTERNAL);
}

Test(status, unspecified_and_unknown_are_not_success, .timeout = 10)
{
	cr_expect_not(wf_proto_status_valid(ST(UNSPECIFIED)));
	cr_expect_eq(wf_proto_status_to_err(ST(UNSPECIFIED)), WF_EPROTOCOL);
	cr_expect_eq(wf_proto_status_to_err((Weightfloor__V1__Status)77), WF_EPROTOCOL);
	cr_expect_str_eq(wf_proto_status_name(ST(UNSPECIFIED)), "UNSPECIFIED");
	cr_expect_str_eq(wf_proto_status_name((Weightfloor__V1__Status)77), "UNKNOWN");
}

Test(status, names, .timeout = 10)
{
	static const char *const names[] = {"OK",
	                                    "NOT_FOUND",
	                                    "NOT_RESIDENT",
	                                    "RESOURCE_EXHAUSTED",
	                                    "INVALID_ARGUMENT",
	                                    "PERMISSION_DENIED",
	                                    "FAILED_PRECONDITION",
	                                    "UNAVAILABLE",
	                                    "INTERNAL"};
	for (int s = ST(OK); s <= ST(INTERNAL); s++)
		cr_expect_str_eq(wf_proto_status_name(s), names[s - ST(OK)]);
}

Test(version, encoding, .timeout = 10)
{
	cr_expect_eq(WF_PROTO_API_VERSION_MAJOR(WF_PROTO_API_VERSION), WF_PROTO_API_MAJOR);
	cr_expect_eq(WF_PROTO_API_VERSION_MINOR(WF_PROTO_API_VERSION), WF_PROTO_API_MINOR);
	cr_expect_eq(WF_PROTO_API_VERSION_MAJOR((2u << 16) | 7), 2u);
	cr_expect_eq(WF_PROTO_API_VERSION_MINOR((2u << 16) | 7), 7u);
}
