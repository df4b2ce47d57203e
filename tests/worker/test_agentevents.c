/* The worker's ear on its agent (worker/agentevents.h) against a real publisher and, for the
 * endpoint's discovery, a real control server answering AgentStatus: PUBLISHED events reach the
 * callback with their fields, other kinds and malformed ones do not; a publisher that goes and
 * comes back is heard again and the loss is told; the url is asked of the agent; shutdown is
 * prompt. Each test waits for states with a deadline, never for a wall-clock window. */
#include "base/error.h"
#include "common/wftest.h"
#include "control/client.h"
#include "control/pub.h"
#include "control/server.h"
#include "worker/agentevents.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define KIND(k) WEIGHTFLOOR__V1__EVENT_KIND__EVENT_KIND_##k
#define HEX     "0123456789abcdef00112233445566ff"

struct heard {
	pthread_mutex_t mu;
	int n_published, n_probe, n_lost, n_bad, n_no_url, n_subscribed;
	char model[64];
	struct wf_digest digest;
	uint64_t generation;
	uint32_t n_ids, ids[8];
};

static struct heard heard = {.mu = PTHREAD_MUTEX_INITIALIZER};

static int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
	nanosleep(&ts, NULL);
}

static void on_published(void *ctx, const char *model, const struct wf_digest *digest,
                         uint64_t generation, uint32_t n, const uint32_t *ids)
{
	cr_assert_eq(ctx, &heard);
	pthread_mutex_lock(&heard.mu);
	if (strcmp(model, "probe") == 0) {
		heard.n_probe++;
	} else {
		heard.n_published++;
		snprintf(heard.model, sizeof heard.model, "%s", model);
		heard.digest = *digest;
		heard.generation = generation;
		heard.n_ids = n < 8 ? n : 8;
		memcpy(heard.ids, ids, heard.n_ids * sizeof(*ids));
	}
	pthread_mutex_unlock(&heard.mu);
}

static void on_lost(void *ctx, uint64_t missed)
{
	(void)ctx;
	(void)missed;
	pthread_mutex_lock(&heard.mu);
	heard.n_lost++;
	pthread_mutex_unlock(&heard.mu);
}

static void on_note(void *ctx, enum wf_agent_events_note note, const char *text)
{
	(void)ctx;
	(void)text;
	pthread_mutex_lock(&heard.mu);
	if (note == WF_AGENT_EVENTS_BAD_EVENT)
		heard.n_bad++;
	else if (note == WF_AGENT_EVENTS_NO_URL)
		heard.n_no_url++;
	else if (note == WF_AGENT_EVENTS_SUBSCRIBED)
		heard.n_subscribed++;
	pthread_mutex_unlock(&heard.mu);
}

static int get(int *field)
{
	pthread_mutex_lock(&heard.mu);
	int v = *field;
	pthread_mutex_unlock(&heard.mu);
	return v;
}

static struct wf_ctl_pub *make_pub(const char *url)
{
	struct wf_ctl_pub_opts o = {.listen = {.url = url}};
	struct wf_ctl_pub *pub = NULL;
	struct wf_diag d = {{0}};
	int rv = wf_ctl_pub_create(&o, &pub, &d);
	cr_assert_eq(rv, 0, "pub: %s", wf_diag_str(&d, rv));
	return pub;
}

static void publish(struct wf_ctl_pub *pub, Weightfloor__V1__EventKind kind, const char *model,
                    const char *digest, uint64_t generation, uint32_t *ids, size_t n)
{
	Weightfloor__V1__Event ev = WEIGHTFLOOR__V1__EVENT__INIT;
	ev.kind = kind;
	ev.model = (char *)model;
	ev.digest = (char *)digest;
	ev.generation = generation;
	ev.tensor_ids = ids;
	ev.n_tensor_ids = n;
	int rv = wf_ctl_pub_publish(pub, &ev, NULL);
	cr_assert_eq(rv, 0, "publish: %s", wf_err_name(rv));
}

/* PUB keeps no history: publish probes until the ear hears one (the subscription is live). */
static void sync_ear(struct wf_ctl_pub *pub)
{
	int before = get(&heard.n_probe);
	int64_t until = now_ms() + 10000;
	uint32_t id = 0;
	while (get(&heard.n_probe) == before && now_ms() < until) {
		publish(pub, KIND(PUBLISHED), "probe", HEX, 0, &id, 1);
		sleep_ms(20);
	}
	cr_assert_gt(get(&heard.n_probe), before, "the ear never heard a probe");
}

static void wait_for(int *field, int at_least, const char *what)
{
	int64_t until = now_ms() + 10000;
	while (get(field) < at_least && now_ms() < until)
		sleep_ms(10);
	cr_assert_geq(get(field), at_least, "%s: %d, want %d", what, get(field), at_least);
}

static struct wf_agent_events *make_ear(const char *url, struct wf_ctl_client *agent)
{
	struct wf_agent_events_opts o = {.url = url,
	                                 .agent = agent,
	                                 .on_published = on_published,
	                                 .on_lost = on_lost,
	                                 .on_note = on_note,
	                                 .ctx = &heard,
	                                 .redial_ms = 100};
	struct wf_agent_events *ae = NULL;
	cr_assert_eq(wf_agent_events_create(&o, &ae), 0);
	return ae;
}

Test(agentevents, published_events_reach_the_callback, .timeout = 60)
{
	char *dir = wft_tmpdir("ear");
	char *url = NULL;
	cr_assert(asprintf(&url, "ipc://%s/ev.sock", dir) > 0);
	struct wf_ctl_pub *pub = make_pub(url);
	struct wf_agent_events *ae = make_ear(url, NULL);
	sync_ear(pub);

	/* other kinds and a PUBLISHED event without a valid digest are not delivered */
	publish(pub, KIND(FLOOR_STATE), "m", NULL, 0, NULL, 0);
	publish(pub, KIND(PUBLISHED), "m", "not-a-digest", 6, NULL, 0);
	uint32_t ids[3] = {1, 5, 7};
	publish(pub, KIND(PUBLISHED), "m", HEX, 4, ids, 3);
	wait_for(&heard.n_published, 1, "published events heard");
	pthread_mutex_lock(&heard.mu);
	cr_assert_eq(heard.n_published, 1, "a malformed or other event was delivered");
	cr_assert_str_eq(heard.model, "m");
	cr_assert_eq(heard.generation, 4);
	cr_assert_eq(heard.n_ids, 3);
	cr_assert(heard.ids[0] == 1 && heard.ids[1] == 5 && heard.ids[2] == 7);
	struct wf_digest want;
	cr_assert_eq(wf_digest_parse(HEX, &want), 0);
	cr_assert(heard.digest.hi == want.hi && heard.digest.lo == want.lo);
	cr_assert_eq(heard.n_bad, 1, "the malformed event was not told");
	cr_assert_eq(heard.n_lost, 0, "nothing was lost yet");
	pthread_mutex_unlock(&heard.mu);

	/* the publisher goes and comes back (an agent restart): heard again, the loss told */
	wf_ctl_pub_destroy(pub);
	pub = make_pub(url);
	sync_ear(pub);
	wait_for(&heard.n_lost, 1, "loss told after a publisher restart");
	publish(pub, KIND(PUBLISHED), "m", HEX, 8, ids, 1);
	wait_for(&heard.n_published, 2, "published after the restart");
	pthread_mutex_lock(&heard.mu);
	cr_assert_eq(heard.generation, 8);
	pthread_mutex_unlock(&heard.mu);

	/* shutdown: close does not block, stop joins, destroy frees; NULL is fine */
	int64_t t0 = now_ms();
	wf_agent_events_close(ae);
	wf_agent_events_stop(ae);
	wf_agent_events_destroy(ae);
	/* Bounded by one receive poll or one AgentStatus call (1 s): only a stop that never came
	 * back, or one far off, fails. */
	cr_assert_lt(now_ms() - t0, 20000, "stop took %lld ms", (long long)(now_ms() - t0));
	wf_agent_events_destroy(NULL);
	wf_agent_events_close(NULL);
	wf_ctl_pub_destroy(pub);
	wft_rmtree(dir);
	free(dir);
	free(url);
}

/* ---- the url asked of the agent ---------------------------------------------------------- */

static _Atomic(const char *) served_events_url;

static int status_handler(void *ctx, const Weightfloor__V1__Request *req,
                          Weightfloor__V1__Reply *reply, struct wf_ctl_call *call)
{
	(void)ctx;
	if (req->body_case != WEIGHTFLOOR__V1__REQUEST__BODY_AGENT_STATUS)
		return WF_EUNSUPPORTED;
	Weightfloor__V1__AgentStatusReply *ar = wf_ctl_call_alloc(call, sizeof(*ar));
	if (!ar)
		return -ENOMEM;
	weightfloor__v1__agent_status_reply__init(ar);
	ar->events_url = (char *)atomic_load(&served_events_url);
	reply->body_case = WEIGHTFLOOR__V1__REPLY__BODY_AGENT_STATUS;
	reply->agent_status = ar;
	return 0;
}

Test(agentevents, url_is_asked_of_the_agent, .timeout = 60)
{
	char *dir = wft_tmpdir("ear-ask");
	char *ev_url = NULL, *ctl_url = NULL;
	cr_assert(asprintf(&ev_url, "ipc://%s/ev.sock", dir) > 0);
	cr_assert(asprintf(&ctl_url, "ipc://%s/agent.sock", dir) > 0);
	atomic_store(&served_events_url, ""); /* an agent older than 1.4 says nothing at first */
	struct wf_ctl_server_opts so = {.listen = {.url = ctl_url}, .handle = status_handler};
	struct wf_ctl_server *srv = NULL;
	struct wf_diag d = {{0}};
	int rv = wf_ctl_server_create(&so, &srv, &d);
	cr_assert_eq(rv, 0, "server: %s", wf_diag_str(&d, rv));
	cr_assert_eq(wf_ctl_server_start(srv), 0);
	struct wf_ctl_client *agent = NULL;
	struct wf_ctl_client_opts co = {.wait_for_server = true};
	rv = wf_ctl_client_open(ctl_url, 2000, &co, &agent, &d);
	cr_assert_eq(rv, 0, "client: %s", wf_diag_str(&d, rv));

	struct wf_agent_events *ae = make_ear(NULL, agent);
	wait_for(&heard.n_no_url, 1, "an agent that does not say where its events are");
	struct wf_ctl_pub *pub = make_pub(ev_url);
	atomic_store(&served_events_url, ev_url);
	sync_ear(pub);
	uint32_t id = 3;
	publish(pub, KIND(PUBLISHED), "asked", HEX, 2, &id, 1);
	wait_for(&heard.n_published, 1, "published through the asked url");
	pthread_mutex_lock(&heard.mu);
	cr_assert_str_eq(heard.model, "asked");
	pthread_mutex_unlock(&heard.mu);

	wf_agent_events_destroy(ae);
	wf_ctl_client_close(agent);
	wf_ctl_server_destroy(srv);
	wf_ctl_pub_destroy(pub);
	wft_rmtree(dir);
	free(dir);
	free(ev_url);
	free(ctl_url);
}

Test(agentevents, bad_options)
{
	struct wf_agent_events *ae = NULL;
	struct wf_agent_events_opts o = {.url = "ipc:///nonexistent/ev.sock"};
	cr_assert_eq(wf_agent_events_create(&o, &ae), WF_EINVAL, "no callback");
	o.url = NULL;
	o.on_published = on_published;
	cr_assert_eq(wf_agent_events_create(&o, &ae), WF_EINVAL, "neither url nor agent");
	cr_assert_null(ae);
}
