/* What a Request is about, for servers' logs: its kind and the model and worker it names. */
#ifndef WF_PROTO_REQUEST_H
#define WF_PROTO_REQUEST_H

#include "weightfloor.pb-c.h"

#ifdef __cplusplus
extern "C" {
#endif

struct wf_proto_request_desc {
	const char *kind;   /* the body's field name ("ensure_floor"); "none" without a body */
	const char *model;  /* the body's "model" or "name" string; NULL if none or empty */
	const char *worker; /* the body's "worker_id" string; NULL if none or empty */
};

/* Fills *ret_desc with pointers into req (valid as long as req is) or static strings. Works from
 * the generated descriptors, so a request kind added to the .proto is described without a
 * change here. Pure and thread-safe. */
void wf_proto_request_describe(const Weightfloor__V1__Request *req,
                               struct wf_proto_request_desc *ret_desc);

#ifdef __cplusplus
}
#endif
#endif
