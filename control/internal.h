/* Shared internals of libwfcontrol: nng error translation, listening with the transport and peer
 * policy of transport.h, dialing, and the bounded allocator used for every unpack of peer bytes.
 * Not installed; nothing outside control/ includes it. */
#ifndef WF_CONTROL_INTERNAL_H
#define WF_CONTROL_INTERNAL_H

#include "base/diag.h"
#include "control/server.h"
#include "control/transport.h"

#include <nng/nng.h>
#include <protobuf-c/protobuf-c.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* nng encodes a length prefix and, for REQ/REP, a 4-byte request id per hop beside the body;
 * receive limits are the protobuf limit plus this slack. */
#define WF__CTL_SP_SLACK 64

/* Translates an nng error: NNG_ETIMEDOUT -> WF_ETIMEOUT, NNG_ECONNREFUSED/NNG_ECLOSED ->
 * WF_EUNAVAILABLE, NNG_EMSGSIZE -> WF_ELIMIT, ... (table in nngerr.c), and records
 * "<what>: <nng_strerror>" in diag. */
int wf__ctl_nng_err(int nng_rv, struct wf_diag *diag, const char *what);
/* The translation alone. */
int wf__ctl_nng_code(int nng_rv);

/* Peer policy of an ipc listener (transport.h: root, self, listed uids and gids). */
struct wf__ctl_auth {
	bool any;
	uid_t self;
	uid_t *uids;
	size_t n_uids;
	gid_t *gids;
	size_t n_gids;
};

/* A started listener, the configuration needed to start it again, and what was resolved.
 *
 * Why "again": in nng 1.5.2 a peer that connects and hangs up before the SP handshake completes
 * makes the transport fail the listener's accept with NNG_ECLOSED, which nng reads as "listener
 * closed" and stops accepting for good (nng issue #1518, fixed in 1.6.0). Any local process that
 * can open the socket could silence the agent that way, and nng's own stale-socket probe (a
 * second server trying the same path) does it by accident.
 *
 * sockshim.c keeps that from happening (EPIPE reads as ECONNRESET), and the watchdog below
 * replaces a listener that has stopped accepting anyway. On ipc it knows, not guesses: any pipe
 * the listener hands to the socket (ADD_PRE) proves it accepts, and when none came for a while
 * it connects a probe of its own (wf__ctl_listener_check). A tls listener cannot be probed
 * without a client certificate and keeps the older test: nng's "other" accept-error counter
 * (which also moves on every ordinary disconnect) against the pipes removed from the socket
 * (NNG_PIPE_EV_REM_POST); an error without a removed pipe to explain it, lasting
 * WF__CTL_STUCK_MS, is an accept that failed before any pipe existed. Pipes refused in the
 * ADD_PRE hook never count an error, so they are taken out of the removals. A replaced
 * listener's handshaken-but-unmatched connections are never freed by nng: replacing must stay
 * the exception. */
struct wf__ctl_listener {
	nng_socket sock;
	nng_listener l;
	bool have_l;
	enum wf_ctl_transport transport;
	char *url; /* as given, with a tcp port 0 replaced by the bound port (used on restart) */
	char *ipc_path; /* NULL unless ipc */
	int ipc_mode;
	gid_t ipc_group;
	bool insecure;
	char *tls_cert_key_file;
	char *tls_cert_file;
	char *tls_key_file;
	char *tls_ca_file;
	struct wf__ctl_auth auth;
	bool reject_denied;     /* close denied ipc peers at connect (PUB cannot answer them) */
	uint64_t errors_seen;   /* the listener's "other" stat when it was started */
	int listener_id;        /* nng id of the current listener (atomic: read by nng's threads) */
	uint64_t pipes_removed; /* REM_POST events of its pipes so far (atomic) */
	uint64_t removed_seen;  /* pipes_removed when the listener was started */
	int64_t unexplained_since_ms; /* errors exceed removals since then (monotonic ms); 0: not */
	unsigned restarts;
	bool shim_active; /* wf__ctl_sockshim_active() when listening started */
	/* The ipc probe (wf__ctl_listener_check). pipes_added counts the ADD_PRE events of the
	 * current listener: any increase proves that its accept loop runs. */
	uint16_t peer_proto;    /* SP protocol id of the socket's peers (REQ, SUB) */
	uint64_t pipes_added;   /* atomic */
	uint64_t pipes_started; /* ADD_POST events (atomic) */
	uint64_t pipes_refused; /* closed by the ADD_PRE hook (atomic) */
	uint64_t added_seen;    /* pipes_added at the last check that saw it move */
	int64_t progress_ms;    /* when it last moved (or listening started) */
	bool probing;           /* probe_fd is an open probe connection */
	int probe_fd;
	int64_t probe_ms; /* when the probe connected */
	/* Logging (transport.h, wf_ctl_listen_opts.log). */
	wf_ctl_log_fn log;
	void *log_arg;
	int64_t reported_ms, failed_log_ms;
	uint64_t refused_reported, foreign_reported;
};

/* Validates opts->url against the policy of transport.h, installs the pipe-notify hook that
 * rejects ipc peers whose credentials cannot be read (and, when reject_denied, peers that the
 * policy denies), starts listening on sock, then sets the socket file's mode and group.
 * lst is initialised in place because the hook keeps a pointer to it: it must not move while
 * sock is open. On failure nothing is left listening and lst is zeroed. */
int wf__ctl_listen(nng_socket sock, const struct wf_ctl_listen_opts *opts, const char *default_url,
                   bool reject_denied, struct wf__ctl_listener *lst, struct wf_diag *diag);
/* Frees what wf__ctl_listen() resolved; the nng listener itself goes with its socket. Accepts a
 * zeroed struct. */
void wf__ctl_listener_fini(struct wf__ctl_listener *lst);

/* One watchdog pass: when accept errors that no removed pipe explains have lasted
 * WF__CTL_STUCK_MS (or an earlier restart failed), closes the listener (which drops its
 * connections; clients reconnect by themselves) and listens again with the same configuration.
 * Returns 1 after a restart, 0 when nothing was needed (or nng has no statistics), or a negative
 * code when listening again failed (the next pass retries). Not thread-safe against itself; call
 * from one thread. */
int wf__ctl_listener_check(struct wf__ctl_listener *lst);

/* A thread that runs wf__ctl_listener_check() every WF__CTL_WATCH_MS. An ipc listener that has
 * handed no connection to its socket for WF__CTL_PROBE_IDLE_MS gets a probe connection; if that
 * one is not handed over either within WF__CTL_PROBE_WAIT_MS (nng's accept loop pauses 100 ms
 * after each failed handshake, so this leaves room for several), the listener is replaced. */
#define WF__CTL_WATCH_MS      50
#define WF__CTL_STUCK_MS      100
#define WF__CTL_PROBE_IDLE_MS 1000
#define WF__CTL_PROBE_WAIT_MS 1000
struct wf__ctl_watchdog {
	struct wf__ctl_listener *lst;
	pthread_t thread;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool init;
	bool running;
	bool stop;
};
int wf__ctl_watchdog_start(struct wf__ctl_watchdog *w, struct wf__ctl_listener *lst);
/* Asks the thread to stop; does not block. */
void wf__ctl_watchdog_close(struct wf__ctl_watchdog *w);
/* close(), joins the thread and frees; accepts a zeroed or stopped watchdog. */
void wf__ctl_watchdog_stop(struct wf__ctl_watchdog *w);

/* Fills peer for pipe p. Returns 0, or a negative code when an ipc peer's credentials cannot be
 * read (the caller must then treat the peer as not allowed). */
int wf__ctl_peer_get(nng_pipe p, enum wf_ctl_transport t, struct wf_ctl_peer *peer);
bool wf__ctl_auth_allows(const struct wf__ctl_auth *auth, const struct wf_ctl_peer *peer);

/* What the server needs to answer one request, apart from its sockets (so that a fuzzer can
 * drive it without any). */
struct wf__ctl_dispatch {
	wf_ctl_handle_fn handle;
	void *ctx;
	size_t max_reply;
	size_t max_unpacked;
	const struct wf__ctl_listener *lst; /* transport and peer policy */
	const struct wf_ctl_peer *peer;     /* non-NULL: this peer, instead of asking the pipe */
	const atomic_bool *closing;
};

/* Checks and answers one request message of len bytes received on pipe (server.h lists the
 * checks). Returns the packed Reply, or NULL when out of memory. */
nng_msg *wf__ctl_answer(const struct wf__ctl_dispatch *d, nng_pipe pipe, const void *buf,
                        size_t len);

/* Dials url on sock (client side: REQ or SUB), applying the TLS and insecure-tcp rules. When
 * block is false the dialer connects (and reconnects) in the background. */
int wf__ctl_dial(nng_socket sock, const char *url, const struct wf_ctl_tls_opts *tls,
                 bool allow_insecure_tcp, bool block, struct wf_diag *diag);

/* Scheme of url, or -1 (WF_EUNSUPPORTED in diag) for schemes this library refuses. */
int wf__ctl_url_transport(const char *url, enum wf_ctl_transport *ret_t, struct wf_diag *diag);

/* A protobuf-c allocator with a budget: an unpack of peer bytes fails (returns NULL) instead of
 * allocating more than cap bytes in total. protobuf-c can turn a 2-byte field into a 100-byte
 * struct, so the message size limit alone does not bound memory. Free the result with the same
 * allocator (or wf__ctl_free_allocator: the budget only matters while allocating). */
struct wf__ctl_budget {
	ProtobufCAllocator a;
	size_t used;
	size_t cap;
	bool exceeded; /* an allocation was refused: the unpack failed for the budget */
};
void wf__ctl_budget_init(struct wf__ctl_budget *b, size_t cap);
extern ProtobufCAllocator wf__ctl_free_allocator;

/* True when this library's sendmsg() (sockshim.c: EPIPE on a stream socket reads as ECONNRESET,
 * which keeps nng 1.5.2's listeners accepting) is the one libnng calls. Thread-safe. */
bool wf__ctl_sockshim_active(void);

/* Milliseconds on CLOCK_REALTIME / CLOCK_MONOTONIC. */
int64_t wf__ctl_unix_ms(void);
int64_t wf__ctl_mono_ms(void);

#endif
