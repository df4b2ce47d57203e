#ifndef WF_CONTROL_AGENTCTL_PBJSON_H
#define WF_CONTROL_AGENTCTL_PBJSON_H
#include <protobuf-c/protobuf-c.h>
struct json_object;
/* A new JSON object for msg (see pbjson.c). The caller releases it with json_object_put(). */
struct json_object *wf_pb_to_json(const ProtobufCMessage *msg);
#endif
