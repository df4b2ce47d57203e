/* The event publisher: a PUB socket on which the agent (and workers) announce floor state,
 * progress, residency, errors, worker changes and stale files as weightfloor.v1.Event messages.
 *
 * Publishing never blocks: nng's PUB queues up to queue_depth messages per subscriber and drops
 * the newest for a subscriber that is that far behind, so a stuck `agentctl watch` cannot stall
 * the agent. Each published event gets the next sequence number (1, 2, 3, ...) and the
 * publisher's random epoch, so a subscriber can tell a gap (lost events) from a restart.
 *
 * ipc subscribers are checked against the same uid/gid policy as the server (transport.h); a
 * PUB socket cannot answer, so a denied subscriber's connection is closed when it connects. */
#ifndef WF_CONTROL_PUB_H
#define WF_CONTROL_PUB_H

#include "base/diag.h"
#include "control/transport.h"
#include "weightfloor.pb-c.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct wf_ctl_pub;

struct wf_ctl_pub_opts {
	struct wf_ctl_listen_opts listen; /* url NULL: WF_CTL_DEFAULT_EVENTS_URL */
	size_t max_event_size;            /* packed bytes; 0: WF_CTL_MAX_EVENT_DEFAULT */
	unsigned queue_depth;             /* messages per subscriber; 0: 1024; at most 8192 */
};

/* Creates the publisher and starts listening, with the listener watchdog described at
 * wf_ctl_server_start(). Returns 0 or an error as wf_ctl_server_create(). */
int wf_ctl_pub_create(const struct wf_ctl_pub_opts *opts, struct wf_ctl_pub **ret_pub,
                      struct wf_diag *diag);

/* Publishes a copy of ev with sequence and epoch set, and time_unix_ms set to now when ev leaves
 * it 0 (ev itself is not modified). Returns 0 and the sequence number given (ret_sequence may be
 * NULL), WF_ELIMIT for an event larger than max_event_size, or -ENOMEM; a failed publish uses no
 * sequence number. Thread-safe; events from concurrent callers go out in sequence order. */
int wf_ctl_pub_publish(struct wf_ctl_pub *pub, const Weightfloor__V1__Event *ev,
                       uint64_t *ret_sequence);

/* The listening URL (tcp port resolved). Owned by pub. */
const char *wf_ctl_pub_url(const struct wf_ctl_pub *pub);
uint64_t wf_ctl_pub_epoch(const struct wf_ctl_pub *pub);

/* Closes the socket (subscribers see the connection go) and frees. Accepts NULL. No publish may
 * be in progress. */
void wf_ctl_pub_destroy(struct wf_ctl_pub *pub);

#ifdef __cplusplus
}
#endif
#endif
