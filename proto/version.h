/* Version of the control protocol in proto/weightfloor.proto (package weightfloor.v1).
 *
 * Request.api_version and Reply.api_version carry (major << 16) | minor. The minor grows with
 * every compatible addition (a new field, a new request kind); the major grows only for an
 * incompatible change, and a server refuses requests of another major. See docs/PROTOCOL.md. */
#ifndef WF_PROTO_VERSION_H
#define WF_PROTO_VERSION_H

#define WF_PROTO_API_MAJOR            1u
#define WF_PROTO_API_MINOR            6u
#define WF_PROTO_API_VERSION          ((WF_PROTO_API_MAJOR << 16) | WF_PROTO_API_MINOR)
#define WF_PROTO_API_VERSION_MAJOR(v) ((unsigned)(v) >> 16)
#define WF_PROTO_API_VERSION_MINOR(v) ((unsigned)(v)&0xffffu)

#endif
