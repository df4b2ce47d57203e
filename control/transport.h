/* Transports and peer authentication shared by the control-plane server, the event publisher
 * and their clients.
 *
 * URLs:
 *   ipc:///run/weightfloor/agent.sock   the default. The socket file gets mode 0660 (and a group
 *                                       when asked); each peer's uid/gid (SO_PEERCRED) is
 *                                       checked against an allow list.
 *   tls+tcp://host:port                 remote control planes. The listener needs a certificate;
 *                                       clients must present one signed by tls.ca_file, unless
 *                                       allow_insecure_tcp is set.
 *   tcp://host:port                     plain TCP, unauthenticated: only with allow_insecure_tcp.
 * Other schemes (inproc, ws, abstract, zerotier) are refused with WF_EUNSUPPORTED.
 *
 * The options structs are read during the create/open call only: the library copies what it
 * keeps, so the caller may free them afterwards. */
#ifndef WF_CONTROL_TRANSPORT_H
#define WF_CONTROL_TRANSPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

#define WF_CTL_DEFAULT_URL        "ipc:///run/weightfloor/agent.sock"
#define WF_CTL_DEFAULT_EVENTS_URL "ipc:///run/weightfloor/events.sock"
#define WF_CTL_DEFAULT_IPC_MODE   0660
/* Bytes of one packed Request (the server's receive limit) and of one packed Reply. A client
 * refuses to send more than its max_request_size, and the server's transport drops a connection
 * that announces more (see docs/PROTOCOL.md, "Size limits"). */
#define WF_CTL_MAX_REQUEST_DEFAULT ((size_t)4 << 20)
#define WF_CTL_MAX_REPLY_DEFAULT   ((size_t)16 << 20)
#define WF_CTL_MAX_EVENT_DEFAULT   ((size_t)64 << 10)
#define WF_CTL_TIMEOUT_DEFAULT_MS  10000

enum wf_ctl_transport {
	WF_CTL_TRANSPORT_IPC = 0,
	WF_CTL_TRANSPORT_TCP = 1, /* plain, unauthenticated */
	WF_CTL_TRANSPORT_TLS = 2, /* tls+tcp */
	WF_CTL_TRANSPORT_MAX
};

/* TLS files (PEM). The own certificate comes either from cert_file (the certificate, or a chain
 * starting with it) and key_file (its private key; NULL: the key is in cert_file too), or from
 * cert_key_file (both in one file); cert_file wins when both are given. Unencrypted keys only.
 * Listener: a certificate is required; ca_file makes client certificates mandatory and verified
 * against it (mutual TLS); without ca_file the listener is refused unless allow_insecure_tcp.
 * Dialer: ca_file verifies the server (required unless allow_insecure_tcp); the certificate is
 * presented to servers that require one; server_name defaults to the URL's host. */
struct wf_ctl_tls_opts {
	const char *cert_file;
	const char *key_file;
	const char *cert_key_file;
	const char *ca_file;
	const char *server_name;
};

/* A line for the program's log, at a syslog level (3 error, 4 warning, 6 info). Called from a
 * library thread (never an nng callback, never while a request is being served). */
typedef void (*wf_ctl_log_fn)(void *arg, int level, const char *line);
/* Each kind of line (peers refused, peers of another protocol dropped) is logged at most once
 * per this many ms, with the count since the previous line. */
#define WF_CTL_LOG_INTERVAL_MS 10000

/* Where and how a server or publisher listens. Zero-initialised fields take the defaults. */
struct wf_ctl_listen_opts {
	const char *url;         /* NULL: WF_CTL_DEFAULT_URL (server) or _EVENTS_URL (publisher) */
	bool allow_insecure_tcp; /* permit tcp://, and tls+tcp:// without client certificates */
	int ipc_mode;            /* socket file mode; 0: WF_CTL_DEFAULT_IPC_MODE */
	gid_t ipc_group;         /* chown the socket file to this group; 0 or (gid_t)-1: leave it */
	/* ipc peers allowed besides root and the listener's own effective uid. The gid compared is
	 * the peer's effective gid at connect time (SO_PEERCRED has no supplementary groups): a
	 * user who has the group only as a supplementary group must be listed by uid. */
	const uid_t *allowed_uids;
	size_t n_allowed_uids;
	const gid_t *allowed_gids;
	size_t n_allowed_gids;
	/* Skip the uid/gid check and let the socket file's mode and group decide alone. */
	bool allow_any_peer;
	struct wf_ctl_tls_opts tls;
	/* Optional: told when the listener had to be replaced (it stopped accepting) and, rate
	 * limited, about connections turned away before they could send a request. */
	wf_ctl_log_fn log;
	void *log_arg;
};

/* Who sent a request. Filled by the server for each request. */
struct wf_ctl_peer {
	enum wf_ctl_transport transport;
	uint32_t pipe_id; /* nng pipe id: one per connection, for logs */
	bool has_creds;   /* ipc: uid/gid/pid below are valid */
	uid_t uid;
	gid_t gid;
	pid_t pid;         /* 0 when unknown */
	bool tls_verified; /* tls: the peer presented a certificate that verified */
	char addr[64];     /* tcp/tls: "192.0.2.1:40000" or "[2001:db8::1]:40000"; ipc: "" */
};

/* True if the nng library this process links was built with TLS (Debian's libnng 1.5.2 is, with
 * mbedTLS). Thread-safe. */
bool wf_ctl_tls_available(void);

/* For an ipc:// url, creates the socket's directory (one level, mode 0750, and group gid unless
 * (gid_t)-1) when it does not exist yet, as /run/weightfloor on a fresh boot. Other transports:
 * nothing. Returns 0 or -errno. Daemons call it before listening. */
int wf_ctl_ipc_dir_ensure(const char *url, gid_t gid);

#ifdef __cplusplus
}
#endif
#endif
