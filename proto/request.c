#include "proto/request.h"

#include <stddef.h>
#include <string.h>

/* The string field of that name in a body message, or NULL (absent, another type, empty). */
static const char *body_string(const ProtobufCMessage *body, const char *name)
{
	const ProtobufCFieldDescriptor *f =
	    protobuf_c_message_descriptor_get_field_by_name(body->descriptor, name);
	if (!f || f->type != PROTOBUF_C_TYPE_STRING || f->label == PROTOBUF_C_LABEL_REPEATED)
		return NULL;
	const char *s = *(const char *const *)((const char *)body + f->offset);
	return s && *s ? s : NULL;
}

void wf_proto_request_describe(const Weightfloor__V1__Request *req,
                               struct wf_proto_request_desc *ret_desc)
{
	struct wf_proto_request_desc d = {.kind = "none"};
	const ProtobufCFieldDescriptor *f = NULL;
	if (req->body_case != WEIGHTFLOOR__V1__REQUEST__BODY__NOT_SET)
		f = protobuf_c_message_descriptor_get_field(&weightfloor__v1__request__descriptor,
		                                            (unsigned)req->body_case);
	if (f && f->type == PROTOBUF_C_TYPE_MESSAGE) {
		d.kind = f->name;
		const ProtobufCMessage *body =
		    *(const ProtobufCMessage *const *)((const char *)req + f->offset);
		if (body) {
			d.model = body_string(body, "model");
			if (!d.model)
				d.model = body_string(body, "name");
			d.worker = body_string(body, "worker_id");
		}
	}
	*ret_desc = d;
}
