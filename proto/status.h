/* Mapping between the project's return codes (0, -errno, WF_E*) and the protocol's Status.
 *
 * Servers turn a handler's negative return into a Reply code with wf_proto_status_from_err();
 * clients turn a Reply code back into a return code with wf_proto_status_to_err(). The mapping
 * is many-to-one on the way out (the wire has nine codes, the project dozens), and the way back
 * yields one canonical code per Status, so from_err(to_err(s)) == s for every valid s.
 *
 * All functions are pure and thread-safe. */
#ifndef WF_PROTO_STATUS_H
#define WF_PROTO_STATUS_H

#include "weightfloor.pb-c.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 0 -> STATUS_OK; negative codes as documented in docs/PROTOCOL.md ("Status codes");
 * positive values are programmer errors and map to STATUS_INTERNAL. */
Weightfloor__V1__Status wf_proto_status_from_err(int err);

/* STATUS_OK -> 0; every other Status to its canonical negative code (NOT_FOUND -> WF_ENOT_FOUND,
 * RESOURCE_EXHAUSTED -> WF_ENO_SPACE, INVALID_ARGUMENT -> WF_EINVAL, ...). STATUS_UNSPECIFIED
 * and values this build does not know (a newer peer) -> WF_EPROTOCOL. */
int wf_proto_status_to_err(Weightfloor__V1__Status status);

/* "OK", "NOT_FOUND", ..., "UNSPECIFIED"; "UNKNOWN" for values this build does not know. Static
 * string, never NULL. */
const char *wf_proto_status_name(Weightfloor__V1__Status status);

/* True for the values this build knows, STATUS_UNSPECIFIED excluded. */
int wf_proto_status_valid(Weightfloor__V1__Status status);

#ifdef __cplusplus
}
#endif
#endif
