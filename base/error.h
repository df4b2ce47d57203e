/* weightfloor error codes.
 *
 * Every function that can fail returns int: 0 on success, -errno for system errors, or one of the
 * negative WF_E* codes below for conditions errno cannot name. The codes sit far below any errno
 * value (-4096 and down), so one int carries both kinds without ambiguity.
 *
 * WF_ERROR_MAP is the single list: it yields the enum, wf_strerror() and wf_err_name() at once.
 * Foreign errors (nng, CUDA, protobuf-c, io_uring CQE results) are translated at the edge of the
 * module that calls them. */
#ifndef WF_BASE_ERROR_H
#define WF_BASE_ERROR_H

#ifdef __cplusplus
extern "C" {
#endif

#define WF_ERROR_MAP(X)                                                                            \
	X(FORMAT, "malformed data")                                                                \
	X(MAGIC, "wrong magic number")                                                             \
	X(VERSION, "unsupported format version")                                                   \
	X(TRUNCATED, "data truncated")                                                             \
	X(OVERFLOW, "size or offset overflows")                                                    \
	X(LIMIT, "count or size exceeds a limit")                                                  \
	X(ALIGN, "bad alignment")                                                                  \
	X(OVERLAP, "overlapping ranges")                                                           \
	X(DUPLICATE, "duplicate name")                                                             \
	X(UNKNOWN_TYPE, "unknown type")                                                            \
	X(SHARD, "missing or inconsistent shard")                                                  \
	X(NOT_FOUND, "not found")                                                                  \
	X(CHANGED, "file changed while it was read")                                               \
	X(CHECKSUM, "checksum mismatch")                                                           \
	X(NOT_READY, "region is not ready")                                                        \
	X(STATE, "operation not valid in the current state")                                       \
	X(NOT_RESIDENT, "model is not resident")                                                   \
	X(NO_SPACE, "budget exhausted")                                                            \
	X(PERMISSION, "permission denied")                                                         \
	X(CANCELED, "operation canceled")                                                          \
	X(TIMEOUT, "operation timed out")                                                          \
	X(UNAVAILABLE, "service unavailable")                                                      \
	X(PROTOCOL, "protocol error")                                                              \
	X(TRANSPORT, "transport error")                                                            \
	X(DEVICE, "device error")                                                                  \
	X(UNSUPPORTED, "not supported")                                                            \
	X(INVAL, "invalid argument")                                                               \
	X(INTERNAL, "internal error")

enum wf_error {
	WF_E_BASE_ = -4096,
#define WF_ERROR_ENUM_(name, msg) WF_E##name,
	WF_ERROR_MAP(WF_ERROR_ENUM_)
#undef WF_ERROR_ENUM_
	    WF_E_MAX_
};
/* The enum counts up from WF_E_BASE_: WF_EFORMAT == -4095, WF_EMAGIC == -4094, ... Each is < -4000.
 */

/* Message for a return code: WF_E* messages, strerror() text for -errno, "success" for 0.
 * Thread-safe; the string is static. */
const char *wf_strerror(int code);

/* Symbolic name ("WF_ETRUNCATED", "ENOENT"), static string; "E?" for unknown codes. */
const char *wf_err_name(int code);

/* True if code is one of the WF_E* codes. */
int wf_is_wf_error(int code);

#ifdef __cplusplus
}
#endif
#endif
