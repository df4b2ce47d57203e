/* URL policy, listening and dialing with it, peer credentials, and the unpack budget. */
#include "control/internal.h"

#include "base/error.h"

#include <nng/protocol/pubsub0/sub.h>
#include <nng/protocol/reqrep0/req.h>
#include <nng/supplemental/tls/tls.h>

#include <arpa/inet.h>
#include <errno.h>
#include <libgen.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

bool wf_ctl_tls_available(void)
{
	nng_tls_config *cfg = NULL;
	if (nng_tls_config_alloc(&cfg, NNG_TLS_MODE_CLIENT) != 0)
		return false;
	nng_tls_config_free(cfg);
	return true;
}

int wf_ctl_ipc_dir_ensure(const char *url, gid_t gid)
{
	if (strncmp(url, "ipc://", 6) != 0)
		return 0;
	char *copy = strdup(url + 6);
	if (!copy)
		return -ENOMEM;
	int rc = 0;
	const char *dir = dirname(copy);
	struct stat st;
	if (stat(dir, &st) != 0) {
		if (mkdir(dir, 0750) < 0 && errno != EEXIST)
			rc = -errno;
		else if (gid != (gid_t)-1 && chown(dir, (uid_t)-1, gid) < 0)
			rc = -errno;
	}
	free(copy);
	return rc;
}

static bool has_prefix(const char *s, const char *p)
{
	return strncmp(s, p, strlen(p)) == 0;
}

int wf__ctl_url_transport(const char *url, enum wf_ctl_transport *ret_t, struct wf_diag *diag)
{
	if (!url || !*url)
		return wf_diag_set(diag, WF_EINVAL, "empty url");
	if (has_prefix(url, "ipc://")) {
		if (!url[6])
			return wf_diag_set(diag, WF_EINVAL, "%s: no socket path", url);
		*ret_t = WF_CTL_TRANSPORT_IPC;
		return 0;
	}
	if (has_prefix(url, "tls+tcp://") || has_prefix(url, "tls+tcp4://") ||
	    has_prefix(url, "tls+tcp6://")) {
		*ret_t = WF_CTL_TRANSPORT_TLS;
		return 0;
	}
	if (has_prefix(url, "tcp://") || has_prefix(url, "tcp4://") || has_prefix(url, "tcp6://")) {
		*ret_t = WF_CTL_TRANSPORT_TCP;
		return 0;
	}
	/* abstract:// has no file mode and inproc:// no peer; neither fits the policy. */
	return wf_diag_set(diag, WF_EUNSUPPORTED,
	                   "%s: unsupported transport (use ipc://, tls+tcp:// or tcp://)", url);
}

/* ---- peers ---------------------------------------------------------------------------------- */

static int auth_init(struct wf__ctl_auth *a, const struct wf_ctl_listen_opts *o)
{
	memset(a, 0, sizeof(*a));
	a->any = o->allow_any_peer;
	a->self = geteuid();
	if (o->n_allowed_uids) {
		a->uids = calloc(o->n_allowed_uids, sizeof(*a->uids));
		if (!a->uids)
			return -ENOMEM;
		memcpy(a->uids, o->allowed_uids, o->n_allowed_uids * sizeof(*a->uids));
		a->n_uids = o->n_allowed_uids;
	}
	if (o->n_allowed_gids) {
		a->gids = calloc(o->n_allowed_gids, sizeof(*a->gids));
		if (!a->gids)
			return -ENOMEM;
		memcpy(a->gids, o->allowed_gids, o->n_allowed_gids * sizeof(*a->gids));
		a->n_gids = o->n_allowed_gids;
	}
	return 0;
}

static void auth_fini(struct wf__ctl_auth *a)
{
	free(a->uids);
	free(a->gids);
	memset(a, 0, sizeof(*a));
}

bool wf__ctl_auth_allows(const struct wf__ctl_auth *a, const struct wf_ctl_peer *peer)
{
	/* Only ipc peers carry credentials; tcp peers were admitted by TLS (or by the explicit
	 * allow_insecure_tcp) at the transport. */
	if (peer->transport != WF_CTL_TRANSPORT_IPC)
		return true;
	if (!peer->has_creds)
		return false;
	if (a->any || peer->uid == 0 || peer->uid == a->self)
		return true;
	for (size_t i = 0; i < a->n_uids; i++)
		if (a->uids[i] == peer->uid)
			return true;
	for (size_t i = 0; i < a->n_gids; i++)
		if (a->gids[i] == peer->gid)
			return true;
	return false;
}

static void format_addr(const nng_sockaddr *sa, char *buf, size_t len)
{
	char host[INET6_ADDRSTRLEN] = "";
	switch (sa->s_family) {
	case NNG_AF_INET:
		inet_ntop(AF_INET, &sa->s_in.sa_addr, host, sizeof(host));
		snprintf(buf, len, "%s:%u", host, ntohs(sa->s_in.sa_port));
		break;
	case NNG_AF_INET6:
		inet_ntop(AF_INET6, sa->s_in6.sa_addr, host, sizeof(host));
		snprintf(buf, len, "[%s]:%u", host, ntohs(sa->s_in6.sa_port));
		break;
	default:
		buf[0] = '\0';
	}
}

int wf__ctl_peer_get(nng_pipe p, enum wf_ctl_transport t, struct wf_ctl_peer *peer)
{
	memset(peer, 0, sizeof(*peer));
	peer->transport = t;
	peer->pipe_id = (uint32_t)nng_pipe_id(p);
	if (t == WF_CTL_TRANSPORT_IPC) {
		uint64_t uid, gid, pid;
		int rv = nng_pipe_get_uint64(p, NNG_OPT_IPC_PEER_UID, &uid);
		if (rv == 0)
			rv = nng_pipe_get_uint64(p, NNG_OPT_IPC_PEER_GID, &gid);
		if (rv != 0)
			return wf__ctl_nng_code(rv);
		peer->has_creds = true;
		peer->uid = (uid_t)uid;
		peer->gid = (gid_t)gid;
		if (nng_pipe_get_uint64(p, NNG_OPT_IPC_PEER_PID, &pid) == 0)
			peer->pid = (pid_t)pid;
		return 0;
	}
	nng_sockaddr sa;
	if (nng_pipe_get_addr(p, NNG_OPT_REMADDR, &sa) == 0)
		format_addr(&sa, peer->addr, sizeof(peer->addr));
	if (t == WF_CTL_TRANSPORT_TLS) {
		bool v = false;
		if (nng_pipe_get_bool(p, NNG_OPT_TLS_VERIFIED, &v) == 0)
			peer->tls_verified = v;
	}
	return 0;
}

static bool of_current_listener(const struct wf__ctl_listener *lst, nng_pipe p)
{
	return nng_listener_id(nng_pipe_listener(p)) ==
	       __atomic_load_n(&lst->listener_id, __ATOMIC_ACQUIRE);
}

/* Runs on an nng thread for each connection of the socket. ADD_PRE comes before a new
 * connection joins: closing the pipe here is the only way to refuse a peer on a socket that
 * cannot answer (PUB), and the right way to refuse one whose credentials cannot even be read.
 * Every ADD_PRE of the current listener also proves that its accept loop is alive (the probe in
 * wf__ctl_listener_check waits for one). ADD_POST follows only for pipes that the protocol
 * accepted: the difference counts peers of another SP protocol, which nng drops by itself. */
static void pipe_event(nng_pipe p, nng_pipe_ev ev, void *arg)
{
	struct wf__ctl_listener *lst = arg;
	if (!of_current_listener(lst, p))
		return; /* a dialer's pipe, or one of a listener already replaced */
	if (ev == NNG_PIPE_EV_REM_POST) {
		__atomic_add_fetch(&lst->pipes_removed, 1, __ATOMIC_RELEASE);
		return;
	}
	if (ev == NNG_PIPE_EV_ADD_POST) {
		__atomic_add_fetch(&lst->pipes_started, 1, __ATOMIC_RELEASE);
		return;
	}
	if (ev != NNG_PIPE_EV_ADD_PRE)
		return;
	__atomic_add_fetch(&lst->pipes_added, 1, __ATOMIC_RELEASE);
	if (lst->transport != WF_CTL_TRANSPORT_IPC)
		return;
	struct wf_ctl_peer peer;
	if (wf__ctl_peer_get(p, lst->transport, &peer) != 0 ||
	    (lst->reject_denied && !wf__ctl_auth_allows(&lst->auth, &peer))) {
		/* A pipe refused here never started I/O, so nng counts no error for it, yet its
		 * REM_POST follows: take it back in advance, or each refused peer would bank a
		 * removal that hides one failed accept from the tls watchdog. */
		__atomic_sub_fetch(&lst->pipes_removed, 1, __ATOMIC_RELEASE);
		__atomic_add_fetch(&lst->pipes_refused, 1, __ATOMIC_RELEASE);
		nng_pipe_close(p);
	}
}

/* ---- listen / dial ------------------------------------------------------------------------- */

/* The whole of a PEM file, NUL-terminated, up to 1 MiB. */
static int read_pem(const char *path, char **ret_text)
{
	FILE *f = fopen(path, "re");
	if (!f)
		return -errno;
	size_t cap = 1 << 20, n;
	char *buf = malloc(cap + 1);
	if (!buf) {
		fclose(f);
		return -ENOMEM;
	}
	n = fread(buf, 1, cap + 1, f);
	int err = ferror(f) ? -EIO : 0;
	fclose(f);
	if (!err && n > cap)
		err = WF_ELIMIT;
	if (err) {
		free(buf);
		return err;
	}
	buf[n] = '\0';
	*ret_text = buf;
	return 0;
}

/* The own certificate and key of tls, when it names them. */
static int tls_own_cert(nng_tls_config *cfg, const struct wf_ctl_tls_opts *tls,
                        struct wf_diag *diag)
{
	char *cert = NULL, *key = NULL;
	int rv;
	if (!tls->cert_file) {
		if (!tls->cert_key_file)
			return 0;
		rv = nng_tls_config_cert_key_file(cfg, tls->cert_key_file, NULL);
		if (rv != 0)
			return wf_diag_set(diag, wf__ctl_nng_code(rv), "tls certificate/key %s: %s",
			                   tls->cert_key_file, nng_strerror(rv));
		return 0;
	}
	const char *key_path = tls->key_file ? tls->key_file : tls->cert_file;
	if ((rv = read_pem(tls->cert_file, &cert)) < 0) {
		rv = wf_diag_set(diag, rv, "tls certificate %s: %s", tls->cert_file,
		                 wf_strerror(rv));
		goto out;
	}
	if ((rv = read_pem(key_path, &key)) < 0) {
		rv = wf_diag_set(diag, rv, "tls key %s: %s", key_path, wf_strerror(rv));
		goto out;
	}
	if ((rv = nng_tls_config_own_cert(cfg, cert, key, NULL)) != 0)
		rv = wf_diag_set(diag, wf__ctl_nng_code(rv),
		                 "tls certificate %s with key %s: %s (not PEM, encrypted, or not a "
		                 "matching pair)",
		                 tls->cert_file, key_path, nng_strerror(rv));
out:
	free(cert);
	if (key) {
		explicit_bzero(key, strlen(key));
		free(key);
	}
	return rv;
}

static int tls_setup(nng_tls_mode mode, const struct wf_ctl_tls_opts *tls, bool insecure,
                     const char *url, nng_tls_config **ret_cfg, struct wf_diag *diag)
{
	nng_tls_config *cfg = NULL;
	nng_url *u = NULL;
	int rv = nng_tls_config_alloc(&cfg, mode);
	if (rv != 0)
		return wf__ctl_nng_err(rv, diag, "tls config (is nng built with TLS?)");
	if ((rv = tls_own_cert(cfg, tls, diag)) < 0)
		goto err;
	if (tls->ca_file) {
		rv = nng_tls_config_ca_file(cfg, tls->ca_file);
		if (rv == 0)
			rv = nng_tls_config_auth_mode(cfg, NNG_TLS_AUTH_MODE_REQUIRED);
		if (rv != 0) {
			rv = wf_diag_set(diag, wf__ctl_nng_code(rv), "tls CA file %s: %s",
			                 tls->ca_file, nng_strerror(rv));
			goto err;
		}
	} else if (insecure) {
		rv = nng_tls_config_auth_mode(cfg, NNG_TLS_AUTH_MODE_NONE);
		if (rv != 0) {
			rv = wf__ctl_nng_err(rv, diag, "tls auth mode");
			goto err;
		}
	} else {
		rv = wf_diag_set(
		    diag, WF_EINVAL,
		    "%s: tls+tcp needs a CA file to verify the %s (or allow_insecure_tcp)", url,
		    mode == NNG_TLS_MODE_SERVER ? "clients" : "server");
		goto err;
	}
	if (mode == NNG_TLS_MODE_CLIENT) {
		const char *name = tls->server_name;
		if (!name && nng_url_parse(&u, url) == 0)
			name = u->u_hostname;
		if (name && *name && (rv = nng_tls_config_server_name(cfg, name)) != 0) {
			rv = wf__ctl_nng_err(rv, diag, "tls server name");
			goto err;
		}
	}
	nng_url_free(u);
	*ret_cfg = cfg;
	return 0;
err:
	nng_url_free(u);
	nng_tls_config_free(cfg);
	return rv;
}

/* url with a tcp port 0 replaced by the port the listener was given. */
static char *resolve_url(nng_listener l, const char *url, enum wf_ctl_transport t)
{
	char *out = NULL;
	nng_url *u = NULL;
	int port = 0;
	if (t == WF_CTL_TRANSPORT_IPC || nng_url_parse(&u, url) != 0 ||
	    strcmp(u->u_port, "0") != 0 ||
	    nng_listener_get_int(l, NNG_OPT_TCP_BOUND_PORT, &port) != 0) {
		nng_url_free(u);
		return strdup(url);
	}
	const char *host = u->u_hostname;
	bool v6 = strchr(host, ':') != NULL;
	if (asprintf(&out, "%s://%s%s%s:%d", u->u_scheme, v6 ? "[" : "", host, v6 ? "]" : "",
	             port) < 0)
		out = NULL;
	nng_url_free(u);
	return out;
}

/* Creates and starts lst->l on url with the stored configuration, then sets the socket file's
 * group. On failure nothing is left listening. */
static int listener_start(struct wf__ctl_listener *lst, const char *url, struct wf_diag *diag)
{
	nng_tls_config *cfg = NULL;
	nng_listener l;
	int rv;

	if ((rv = nng_listener_create(&l, lst->sock, url)) != 0)
		return wf_diag_set(diag, wf__ctl_nng_code(rv), "%s: %s", url, nng_strerror(rv));
	if (lst->transport == WF_CTL_TRANSPORT_IPC) {
		rv = nng_listener_set_int(l, NNG_OPT_IPC_PERMISSIONS, lst->ipc_mode & 07777);
		if (rv != 0) {
			rv = wf__ctl_nng_err(rv, diag, "ipc socket permissions");
			goto err;
		}
	} else if (lst->transport == WF_CTL_TRANSPORT_TLS) {
		const struct wf_ctl_tls_opts tls = {.cert_file = lst->tls_cert_file,
		                                    .key_file = lst->tls_key_file,
		                                    .cert_key_file = lst->tls_cert_key_file,
		                                    .ca_file = lst->tls_ca_file};
		if ((rv = tls_setup(NNG_TLS_MODE_SERVER, &tls, lst->insecure, url, &cfg, diag)) < 0)
			goto err;
		rv = nng_listener_set_ptr(l, NNG_OPT_TLS_CONFIG, cfg);
		nng_tls_config_free(cfg); /* the listener holds its own reference */
		if (rv != 0) {
			rv = wf__ctl_nng_err(rv, diag, "tls config");
			goto err;
		}
	}
	/* Before start: pipes of this listener are counted from its first connection on. */
	__atomic_store_n(&lst->listener_id, nng_listener_id(l), __ATOMIC_RELEASE);
	if ((rv = nng_listener_start(l, 0)) != 0) {
		if (rv == NNG_EADDRINUSE)
			rv = wf_diag_set(diag, -EADDRINUSE, "%s: another server is listening", url);
		else
			rv = wf_diag_set(diag, wf__ctl_nng_code(rv), "listen %s: %s", url,
			                 nng_strerror(rv));
		goto err;
	}
	/* nng chmods the socket right after bind; the group is ours to set. Until then the file
	 * has the umask's mode, which is why the peer check exists at all and why the socket's
	 * directory should not be world-writable. */
	if (lst->transport == WF_CTL_TRANSPORT_IPC && lst->ipc_group != 0 &&
	    lst->ipc_group != (gid_t)-1 && chown(lst->ipc_path, (uid_t)-1, lst->ipc_group) != 0) {
		rv = wf_diag_set(diag, -errno, "chown %s to group %u: %s", lst->ipc_path,
		                 (unsigned)lst->ipc_group, strerror(errno));
		goto err;
	}
	lst->l = l;
	lst->have_l = true;
	return 0;
err:
	nng_listener_close(l);
	return rv;
}

/* The direct child of scope called name, or NULL. */
static nng_stat *stat_child(nng_stat *scope, const char *name)
{
	for (nng_stat *c = nng_stat_child(scope); c; c = nng_stat_next(c))
		if (strcmp(nng_stat_name(c), name) == 0)
			return c;
	return NULL;
}

/* The "listener" scope whose "id" child is id, searched depth-first. nng 1.5.2's own
 * nng_stat_find_listener() ignores the id below the root and returns the first listener of the
 * process, so it cannot be used with more than one. */
static nng_stat *find_listener(nng_stat *st, int id)
{
	for (; st; st = nng_stat_next(st)) {
		if (nng_stat_type(st) == NNG_STAT_SCOPE &&
		    strcmp(nng_stat_name(st), "listener") == 0) {
			nng_stat *sid = stat_child(st, "id");
			if (sid && nng_stat_value(sid) == (uint64_t)id)
				return st;
			continue;
		}
		nng_stat *found = find_listener(nng_stat_child(st), id);
		if (found)
			return found;
	}
	return NULL;
}

/* The listener's count of accept errors that nng files under "other" (NNG_ECLOSED among them),
 * or -1 when nng keeps no statistics. */
static int64_t listener_errors(nng_listener l)
{
	nng_stat *all = NULL, *ls, *st;
	int64_t v = -1;
	if (nng_stats_get(&all) != 0)
		return -1;
	if ((ls = find_listener(all, nng_listener_id(l))) && (st = stat_child(ls, "other")))
		v = (int64_t)nng_stat_value(st);
	nng_stats_free(all);
	return v;
}

static int64_t mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void lst_log(const struct wf__ctl_listener *lst, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void lst_log(const struct wf__ctl_listener *lst, int level, const char *fmt, ...)
{
	char line[512];
	va_list ap;
	if (!lst->log)
		return;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	lst->log(lst->log_arg, level, line);
}

static char *strdup_or_null(const char *s, bool *ret_fail)
{
	char *d = NULL;
	if (s && !(d = strdup(s)))
		*ret_fail = true;
	return d;
}

int wf__ctl_listen(nng_socket sock, const struct wf_ctl_listen_opts *o, const char *default_url,
                   bool reject_denied, struct wf__ctl_listener *lst, struct wf_diag *diag)
{
	const char *url = o->url ? o->url : default_url;
	enum wf_ctl_transport t;
	bool notify = false, nomem = false;
	int rv;

	memset(lst, 0, sizeof(*lst));
	if ((rv = wf__ctl_url_transport(url, &t, diag)) < 0)
		return rv;
	if (t == WF_CTL_TRANSPORT_TCP && !o->allow_insecure_tcp)
		return wf_diag_set(diag, WF_EINVAL,
		                   "%s: plain tcp is unauthenticated; use tls+tcp:// or set "
		                   "allow_insecure_tcp",
		                   url);
	if (t == WF_CTL_TRANSPORT_TLS && !o->tls.cert_key_file && !o->tls.cert_file)
		return wf_diag_set(diag, WF_EINVAL, "%s: tls+tcp needs a certificate and key file",
		                   url);
	lst->sock = sock;
	lst->transport = t;
	lst->reject_denied = reject_denied;
	lst->ipc_mode = o->ipc_mode ? o->ipc_mode : WF_CTL_DEFAULT_IPC_MODE;
	lst->ipc_group = o->ipc_group;
	lst->shim_active = wf__ctl_sockshim_active();
	lst->log = o->log;
	lst->log_arg = o->log_arg;
	lst->insecure = o->allow_insecure_tcp;
	lst->tls_cert_key_file = strdup_or_null(o->tls.cert_key_file, &nomem);
	lst->tls_cert_file = strdup_or_null(o->tls.cert_file, &nomem);
	lst->tls_key_file = strdup_or_null(o->tls.key_file, &nomem);
	lst->tls_ca_file = strdup_or_null(o->tls.ca_file, &nomem);
	if (t == WF_CTL_TRANSPORT_IPC)
		lst->ipc_path = strdup_or_null(url + strlen("ipc://"), &nomem);
	if (nomem || auth_init(&lst->auth, o) < 0) {
		rv = wf_diag_set(diag, -ENOMEM, "out of memory");
		goto err;
	}

	if ((rv = nng_pipe_notify(sock, NNG_PIPE_EV_ADD_PRE, pipe_event, lst)) != 0 ||
	    (rv = nng_pipe_notify(sock, NNG_PIPE_EV_ADD_POST, pipe_event, lst)) != 0 ||
	    (rv = nng_pipe_notify(sock, NNG_PIPE_EV_REM_POST, pipe_event, lst)) != 0) {
		rv = wf__ctl_nng_err(rv, diag, "pipe notify");
		goto err;
	}
	notify = true;
	if ((rv = listener_start(lst, url, diag)) < 0)
		goto err;
	if (!(lst->url = resolve_url(lst->l, url, t))) {
		rv = wf_diag_set(diag, -ENOMEM, "out of memory");
		goto err;
	}
	int64_t e = listener_errors(lst->l);
	lst->errors_seen = e > 0 ? (uint64_t)e : 0;
	lst->progress_ms = mono_ms();
	int peer = 0;
	nng_socket_get_int(sock, NNG_OPT_PEER, &peer);
	lst->peer_proto = (uint16_t)peer;
	if (!lst->shim_active)
		lst_log(lst, 4,
		        "%s: libnng does not call this program's sendmsg(); peers that hang up "
		        "early can stop the listener until the watchdog replaces it",
		        lst->url);
	return 0;
err:
	if (lst->have_l)
		nng_listener_close(lst->l);
	if (notify) {
		nng_pipe_notify(sock, NNG_PIPE_EV_ADD_PRE, NULL, NULL);
		nng_pipe_notify(sock, NNG_PIPE_EV_ADD_POST, NULL, NULL);
		nng_pipe_notify(sock, NNG_PIPE_EV_REM_POST, NULL, NULL);
	}
	wf__ctl_listener_fini(lst);
	memset(lst, 0, sizeof(*lst));
	return rv;
}

/* Reports, at most once per WF_CTL_LOG_INTERVAL_MS, the peers turned away since the last line. */
static void report_peers(struct wf__ctl_listener *lst, int64_t now)
{
	if (!lst->log || now - lst->reported_ms < WF_CTL_LOG_INTERVAL_MS)
		return;
	uint64_t refused = __atomic_load_n(&lst->pipes_refused, __ATOMIC_ACQUIRE);
	uint64_t started = __atomic_load_n(&lst->pipes_started, __ATOMIC_ACQUIRE);
	uint64_t added = __atomic_load_n(&lst->pipes_added, __ATOMIC_ACQUIRE);
	/* A pipe between its ADD_PRE and ADD_POST reads as foreign for a moment: report only
	 * growth, and never count the same pipe twice. */
	uint64_t foreign = added - started - refused;
	bool any = false;
	if (refused > lst->refused_reported) {
		lst_log(
		    lst, 4,
		    "%s: refused %llu connection(s) at connect (peer credentials unreadable or not "
		    "allowed)",
		    lst->url, (unsigned long long)(refused - lst->refused_reported));
		lst->refused_reported = refused;
		any = true;
	}
	if (foreign > lst->foreign_reported && foreign < (UINT64_C(1) << 62)) {
		lst_log(lst, 4, "%s: dropped %llu connection(s) that spoke another SP protocol",
		        lst->url, (unsigned long long)(foreign - lst->foreign_reported));
		lst->foreign_reported = foreign;
		any = true;
	}
	if (any)
		lst->reported_ms = now;
}

static void probe_close(struct wf__ctl_listener *lst)
{
	if (lst->probing)
		close(lst->probe_fd);
	lst->probing = false;
	lst->probe_ms = 0;
}

/* Connects to the ipc listener as a peer of the socket's protocol would and sends the SP
 * header ("\0SP\0", protocol id, two reserved bytes). Returns 1 when the probe is under way,
 * 0 when nothing could be concluded (the backlog is full), -ENOENT or -ECONNREFUSED when
 * nothing listens on the path any more. */
static int probe_open(struct wf__ctl_listener *lst)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	uint8_t hdr[8] = {0, 'S', 'P', 0, (uint8_t)(lst->peer_proto >> 8), (uint8_t)lst->peer_proto,
	                  0, 0};
	if (strlen(lst->ipc_path) >= sizeof(sa.sun_path))
		return 0;
	strcpy(sa.sun_path, lst->ipc_path);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return 0;
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int e = errno;
		close(fd);
		return e == ENOENT || e == ECONNREFUSED ? -e : 0;
	}
	if (send(fd, hdr, sizeof(hdr), MSG_NOSIGNAL) != (ssize_t)sizeof(hdr)) {
		close(fd);
		return 0;
	}
	lst->probe_fd = fd;
	lst->probing = true;
	return 1;
}

/* True when the server's 8-byte SP header has reached the probe: its side of the handshake is
 * done, so hanging up now cannot fail the server's send. */
static bool probe_answered(const struct wf__ctl_listener *lst)
{
	uint8_t buf[8];
	return recv(lst->probe_fd, buf, sizeof(buf), MSG_PEEK | MSG_DONTWAIT) ==
	       (ssize_t)sizeof(buf);
}

/* The tls listener cannot be probed without a client certificate of its CA: it keeps the older
 * test, accept errors that no removed pipe explains (internal.h). Returns true when stuck. */
static bool errors_unexplained(struct wf__ctl_listener *lst, int64_t now)
{
	int64_t e = listener_errors(lst->l);
	if (e < 0)
		return false; /* no statistics: nothing to go by */
	uint64_t removed = __atomic_load_n(&lst->pipes_removed, __ATOMIC_ACQUIRE);
	uint64_t errs = (uint64_t)e - lst->errors_seen;
	uint64_t pipes = removed - lst->removed_seen;
	if (errs <= pipes) {
		lst->unexplained_since_ms = 0;
		return false;
	}
	/* The error may be counted a moment before its pipe's removal is reported: only an
	 * excess that lasts is a failed accept. */
	if (!lst->unexplained_since_ms) {
		lst->unexplained_since_ms = now;
		return false;
	}
	return now - lst->unexplained_since_ms >= WF__CTL_STUCK_MS;
}

int wf__ctl_listener_check(struct wf__ctl_listener *lst)
{
	int64_t now = mono_ms();
	const char *why = "listening again after a failed restart";
	report_peers(lst, now);
	if (lst->have_l) {
		if (lst->transport != WF_CTL_TRANSPORT_IPC) {
			if (!errors_unexplained(lst, now))
				return 0;
			why = "accept failed (nng #1518)";
			goto replace;
		}
		/* Any connection the listener hands to the socket proves it accepts. */
		uint64_t added = __atomic_load_n(&lst->pipes_added, __ATOMIC_ACQUIRE);
		if (added != lst->added_seen) {
			lst->added_seen = added;
			lst->progress_ms = now;
			if (lst->probing && probe_answered(lst))
				probe_close(lst);
			return 0;
		}
		if (lst->probing) {
			if (now - lst->probe_ms < WF__CTL_PROBE_WAIT_MS)
				return 0;
			probe_close(lst);
			why = "its own probe connection was not accepted";
			goto replace;
		}
		if (now - lst->progress_ms < WF__CTL_PROBE_IDLE_MS)
			return 0;
		int rv = probe_open(lst);
		if (rv < 0) {
			why = rv == -ENOENT ? "the socket file was removed"
			                    : "nothing listens on the socket file";
			goto replace;
		}
		if (rv == 0)
			lst->progress_ms = now; /* inconclusive: try again later */
		else
			lst->probe_ms = now;
		return 0;
	replace:
		nng_listener_close(lst->l);
		lst->have_l = false;
	}
	int rv = listener_start(lst, lst->url, NULL);
	if (rv < 0) {
		if (now - lst->failed_log_ms >= WF_CTL_LOG_INTERVAL_MS) {
			lst_log(lst, 3, "%s: cannot listen again (%s); retrying", lst->url,
			        wf_strerror(rv));
			lst->failed_log_ms = now;
		}
		return rv;
	}
	int64_t e = listener_errors(lst->l);
	lst->errors_seen = e > 0 ? (uint64_t)e : 0;
	lst->removed_seen = __atomic_load_n(&lst->pipes_removed, __ATOMIC_ACQUIRE);
	lst->unexplained_since_ms = 0;
	lst->added_seen = __atomic_load_n(&lst->pipes_added, __ATOMIC_ACQUIRE);
	lst->progress_ms = now;
	lst->restarts++;
	lst_log(lst, 4, "%s: listener stopped accepting (%s); replaced it (restart %u)", lst->url,
	        why, lst->restarts);
	return 1;
}

void wf__ctl_listener_fini(struct wf__ctl_listener *lst)
{
	if (!lst)
		return;
	probe_close(lst);
	auth_fini(&lst->auth);
	free(lst->url);
	free(lst->ipc_path);
	free(lst->tls_cert_key_file);
	free(lst->tls_cert_file);
	free(lst->tls_key_file);
	free(lst->tls_ca_file);
	lst->url = NULL;
	lst->ipc_path = NULL;
	lst->tls_cert_key_file = NULL;
	lst->tls_cert_file = NULL;
	lst->tls_key_file = NULL;
	lst->tls_ca_file = NULL;
}

/* ---- watchdog ------------------------------------------------------------------------------ */

static void *watchdog_main(void *arg)
{
	struct wf__ctl_watchdog *w = arg;
	pthread_mutex_lock(&w->mu);
	while (!w->stop) {
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_nsec += WF__CTL_WATCH_MS * 1000000L;
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		pthread_cond_timedwait(&w->cv, &w->mu, &ts);
		if (w->stop)
			break;
		pthread_mutex_unlock(&w->mu);
		wf__ctl_listener_check(w->lst);
		pthread_mutex_lock(&w->mu);
	}
	pthread_mutex_unlock(&w->mu);
	return NULL;
}

int wf__ctl_watchdog_start(struct wf__ctl_watchdog *w, struct wf__ctl_listener *lst)
{
	pthread_condattr_t ca;
	int rv;

	memset(w, 0, sizeof(*w));
	w->lst = lst;
	if ((rv = pthread_condattr_init(&ca)) != 0)
		return -rv;
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	rv = pthread_cond_init(&w->cv, &ca);
	pthread_condattr_destroy(&ca);
	if (rv != 0)
		return -rv;
	if ((rv = pthread_mutex_init(&w->mu, NULL)) != 0) {
		pthread_cond_destroy(&w->cv);
		return -rv;
	}
	w->init = true;
	if ((rv = pthread_create(&w->thread, NULL, watchdog_main, w)) != 0)
		return -rv;
	w->running = true;
	return 0;
}

void wf__ctl_watchdog_close(struct wf__ctl_watchdog *w)
{
	if (!w->init)
		return;
	pthread_mutex_lock(&w->mu);
	w->stop = true;
	pthread_cond_signal(&w->cv);
	pthread_mutex_unlock(&w->mu);
}

void wf__ctl_watchdog_stop(struct wf__ctl_watchdog *w)
{
	if (!w->init)
		return;
	wf__ctl_watchdog_close(w);
	if (w->running) {
		pthread_join(w->thread, NULL);
		w->running = false;
	}
	pthread_mutex_destroy(&w->mu);
	pthread_cond_destroy(&w->cv);
	w->init = false;
}

/* After a failed TLS handshake, finds out which side refused: dials once more, without verifying
 * the server but presenting the same certificate, on a scratch socket of the same protocol, and
 * hangs up at once (nothing is sent). If that handshake succeeds, the server accepted this client
 * and its own certificate is what failed; otherwise the server refused this client. */
static int tls_explain(nng_socket sock, const char *url, const struct wf_ctl_tls_opts *tls,
                       int nng_rv, struct wf_diag *diag)
{
	struct wf_ctl_tls_opts loose = *tls;
	nng_tls_config *cfg = NULL;
	nng_socket s;
	nng_dialer d;
	int proto = 0, rv;
	loose.ca_file = NULL;
	nng_socket_get_int(sock, NNG_OPT_PROTO, &proto);
	rv = proto == 0x21 ? nng_sub0_open(&s) : nng_req0_open(&s);
	if (rv == 0) {
		if ((rv = nng_dialer_create(&d, s, url)) == 0 &&
		    (rv = tls_setup(NNG_TLS_MODE_CLIENT, &loose, true, url, &cfg, NULL)) == 0) {
			rv = nng_dialer_set_ptr(d, NNG_OPT_TLS_CONFIG, cfg);
			nng_tls_config_free(cfg);
			if (rv == 0)
				rv = nng_dialer_start(d, 0);
		}
		nng_close(s);
	}
	bool has_cert = tls->cert_file || tls->cert_key_file;
	if (rv == 0) {
		nng_url *u = NULL;
		const char *name = tls->server_name;
		if (!name && nng_url_parse(&u, url) == 0)
			name = u->u_hostname;
		rv = wf_diag_set(
		    diag, WF_EPERMISSION,
		    "%s: the server's certificate does not verify against %s (signed by "
		    "another CA, expired, or its DNS names do not include '%s': mbedTLS "
		    "matches DNS names only, give the name with --tls-server-name)",
		    url, tls->ca_file ? tls->ca_file : "the CA file", name ? name : "");
		nng_url_free(u);
		return rv;
	}
	if (!has_cert)
		return wf_diag_set(diag, WF_EPERMISSION,
		                   "%s: TLS handshake failed (%s): the server requires a client "
		                   "certificate (give one signed by the CA the server trusts)",
		                   url, nng_strerror(nng_rv));
	return wf_diag_set(diag, WF_EPERMISSION,
	                   "%s: TLS handshake failed (%s): the server refused the client "
	                   "certificate %s (not signed by the CA the server trusts, or expired)",
	                   url, nng_strerror(nng_rv),
	                   tls->cert_file ? tls->cert_file : tls->cert_key_file);
}

int wf__ctl_dial(nng_socket sock, const char *url, const struct wf_ctl_tls_opts *tls, bool insecure,
                 bool block, struct wf_diag *diag)
{
	enum wf_ctl_transport t;
	nng_dialer d;
	nng_tls_config *cfg = NULL;
	int rv;

	if ((rv = wf__ctl_url_transport(url, &t, diag)) < 0)
		return rv;
	if (t == WF_CTL_TRANSPORT_TCP && !insecure)
		return wf_diag_set(diag, WF_EINVAL,
		                   "%s: plain tcp is unauthenticated; use tls+tcp:// or set "
		                   "allow_insecure_tcp",
		                   url);
	if ((rv = nng_dialer_create(&d, sock, url)) != 0)
		return wf_diag_set(diag, wf__ctl_nng_code(rv), "%s: %s", url, nng_strerror(rv));
	if (t == WF_CTL_TRANSPORT_TLS) {
		static const struct wf_ctl_tls_opts none;
		if ((rv = tls_setup(NNG_TLS_MODE_CLIENT, tls ? tls : &none, insecure, url, &cfg,
		                    diag)) < 0)
			goto err;
		rv = nng_dialer_set_ptr(d, NNG_OPT_TLS_CONFIG, cfg);
		nng_tls_config_free(cfg);
		if (rv != 0) {
			rv = wf__ctl_nng_err(rv, diag, "tls config");
			goto err;
		}
	}
	/* Reconnect quickly after an agent restart, but do not hammer a dead one. */
	nng_dialer_set_ms(d, NNG_OPT_RECONNMINT, 50);
	nng_dialer_set_ms(d, NNG_OPT_RECONNMAXT, 1000);
	if ((rv = nng_dialer_start(d, block ? 0 : NNG_FLAG_NONBLOCK)) != 0) {
		switch (rv) {
		case NNG_ECONNREFUSED:
		case NNG_ENOENT:
		case NNG_EUNREACHABLE:
			rv = wf_diag_set(diag, WF_EUNAVAILABLE, "%s: no server is listening (%s)",
			                 url, nng_strerror(rv));
			break;
		case NNG_EPERM:
			rv = wf_diag_set(diag, WF_EPERMISSION,
			                 "%s: not allowed to connect (socket file mode or group)",
			                 url);
			break;
		case NNG_ECRYPTO:
		case NNG_EPEERAUTH:
		case NNG_ECONNSHUT:
		case NNG_ECONNRESET:
		case NNG_ECLOSED:
			if (t == WF_CTL_TRANSPORT_TLS && tls) {
				rv = tls_explain(sock, url, tls, rv, diag);
				break;
			}
			/* fall through */
		default:
			rv = wf_diag_set(diag, wf__ctl_nng_code(rv), "connect %s: %s", url,
			                 nng_strerror(rv));
		}
		goto err;
	}
	return 0;
err:
	nng_dialer_close(d);
	return rv;
}

/* ---- unpack budget -------------------------------------------------------------------------- */

static void *budget_alloc(void *data, size_t size)
{
	struct wf__ctl_budget *b = data;
	if (size > b->cap - b->used) {
		b->exceeded = true;
		return NULL;
	}
	b->used += size;
	return malloc(size);
}

static void plain_free(void *data, void *p)
{
	(void)data;
	free(p);
}

static void *refuse_alloc(void *data, size_t size)
{
	(void)data;
	(void)size;
	return NULL;
}

void wf__ctl_budget_init(struct wf__ctl_budget *b, size_t cap)
{
	b->a.alloc = budget_alloc;
	b->a.free = plain_free;
	b->a.allocator_data = b;
	b->used = 0;
	b->cap = cap;
	b->exceeded = false;
}

ProtobufCAllocator wf__ctl_free_allocator = {
    .alloc = refuse_alloc,
    .free = plain_free,
    .allocator_data = NULL,
};

int64_t wf__ctl_unix_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t wf__ctl_mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}
