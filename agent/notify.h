/* sd_notify(3) without libsystemd: one datagram to $NOTIFY_SOCKET ("READY=1", "STOPPING=1",
 * "STATUS=..."). A no-op outside systemd. Returns 0 or -errno. */
#ifndef WF_AGENT_NOTIFY_H
#define WF_AGENT_NOTIFY_H
int wf_sd_notify(const char *state);
#endif
