/* sd_notify(3) without libsystemd: one datagram to $NOTIFY_SOCKET ("READY=1", "STOPPING=1",
 * "STATUS=..."), the protocol of systemd's Type=notify services. Both daemons (wf-agent and
 * wf-worker) use it, so it lives here rather than in either of them.
 *
 * A no-op returning 0 when NOTIFY_SOCKET is unset or empty (outside systemd). The socket may be a
 * path or, with a leading '@', a name in the abstract namespace. Thread-safe (a socket per call).
 * Returns 0 or -errno (-ENAMETOOLONG for an address that does not fit sockaddr_un). */
#ifndef WF_BASE_NOTIFY_H
#define WF_BASE_NOTIFY_H
#ifdef __cplusplus
extern "C" {
#endif
int wf_sd_notify(const char *state);
#ifdef __cplusplus
}
#endif
#endif
