/* Any protobuf-c message as JSON, walking its descriptor: field names as in the .proto, enums by
 * name (their prefix trimmed: "FLOOR_STATE_HOST" -> "HOST"), 64-bit integers as JSON numbers
 * (json-c keeps int64 exact), unset oneof members and proto3 defaults included as they are. */
#include "pbjson.h"

#include <json-c/json.h>
#include <protobuf-c/protobuf-c.h>
#include <string.h>

static const char *enum_short(const ProtobufCEnumDescriptor *ed, int value)
{
	const ProtobufCEnumValue *ev = protobuf_c_enum_descriptor_get_value(ed, value);
	if (!ev)
		return NULL;
	/* "FLOOR_STATE_HOST" in enum FloorState: drop the common prefix up to the last '_' that
	 * the enum's own name accounts for. Simplest robust rule: strip the shared prefix of all
	 * value names. */
	const char *first = ed->values[0].name;
	size_t p = strlen(first);
	for (unsigned i = 1; i < ed->n_values; i++) {
		size_t k = 0;
		while (k < p && ed->values[i].name[k] == first[k])
			k++;
		p = k;
	}
	while (p > 0 && first[p - 1] != '_')
		p--;
	return ev->name + p;
}

static struct json_object *scalar(const ProtobufCFieldDescriptor *fd, const void *p)
{
	switch (fd->type) {
	case PROTOBUF_C_TYPE_INT32:
	case PROTOBUF_C_TYPE_SINT32:
	case PROTOBUF_C_TYPE_SFIXED32:
		return json_object_new_int64(*(const int32_t *)p);
	case PROTOBUF_C_TYPE_UINT32:
	case PROTOBUF_C_TYPE_FIXED32:
		return json_object_new_int64(*(const uint32_t *)p);
	case PROTOBUF_C_TYPE_INT64:
	case PROTOBUF_C_TYPE_SINT64:
	case PROTOBUF_C_TYPE_SFIXED64:
		return json_object_new_int64(*(const int64_t *)p);
	case PROTOBUF_C_TYPE_UINT64:
	case PROTOBUF_C_TYPE_FIXED64:
		return json_object_new_uint64(*(const uint64_t *)p);
	case PROTOBUF_C_TYPE_FLOAT:
		return json_object_new_double(*(const float *)p);
	case PROTOBUF_C_TYPE_DOUBLE:
		return json_object_new_double(*(const double *)p);
	case PROTOBUF_C_TYPE_BOOL:
		return json_object_new_boolean(*(const protobuf_c_boolean *)p);
	case PROTOBUF_C_TYPE_ENUM: {
		const char *n = enum_short(fd->descriptor, *(const int *)p);
		return n ? json_object_new_string(n) : json_object_new_int(*(const int *)p);
	}
	case PROTOBUF_C_TYPE_STRING: {
		const char *s = *(char *const *)p;
		return json_object_new_string(s ? s : "");
	}
	case PROTOBUF_C_TYPE_BYTES: {
		const ProtobufCBinaryData *b = p;
		return json_object_new_int64((int64_t)b->len); /* length only: no binary on a tty */
	}
	case PROTOBUF_C_TYPE_MESSAGE: {
		const ProtobufCMessage *m = *(ProtobufCMessage *const *)p;
		return m ? wf_pb_to_json(m) : NULL;
	}
	}
	return NULL;
}

static size_t elem_size(ProtobufCType t)
{
	switch (t) {
	case PROTOBUF_C_TYPE_INT64:
	case PROTOBUF_C_TYPE_SINT64:
	case PROTOBUF_C_TYPE_SFIXED64:
	case PROTOBUF_C_TYPE_UINT64:
	case PROTOBUF_C_TYPE_FIXED64:
	case PROTOBUF_C_TYPE_DOUBLE:
		return 8;
	case PROTOBUF_C_TYPE_STRING:
	case PROTOBUF_C_TYPE_MESSAGE:
		return sizeof(void *);
	case PROTOBUF_C_TYPE_BYTES:
		return sizeof(ProtobufCBinaryData);
	case PROTOBUF_C_TYPE_BOOL:
		return sizeof(protobuf_c_boolean);
	default:
		return 4;
	}
}

struct json_object *wf_pb_to_json(const ProtobufCMessage *msg)
{
	const ProtobufCMessageDescriptor *d = msg->descriptor;
	struct json_object *o = json_object_new_object();
	const char *base = (const char *)msg;
	for (unsigned i = 0; i < d->n_fields; i++) {
		const ProtobufCFieldDescriptor *fd = &d->fields[i];
		if (fd->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
			uint32_t which = *(const uint32_t *)(base + fd->quantifier_offset);
			if (which != fd->id)
				continue;
		}
		if (fd->label == PROTOBUF_C_LABEL_REPEATED) {
			size_t n = *(const size_t *)(base + fd->quantifier_offset);
			const char *arr = *(char *const *)(base + fd->offset);
			struct json_object *a = json_object_new_array();
			for (size_t k = 0; k < n; k++) {
				struct json_object *v = scalar(fd, arr + k * elem_size(fd->type));
				if (v)
					json_object_array_add(a, v);
			}
			json_object_object_add(o, fd->name, a);
			continue;
		}
		struct json_object *v = scalar(fd, base + fd->offset);
		if (v)
			json_object_object_add(o, fd->name, v);
	}
	return o;
}
