/* The REP server and the REQ client in one process, over ipc:// in a fresh directory per test. */
#include "tests/control/ctl_test.h"

#include "base/error.h"
#include "common/wftest.h"
#include "proto/status.h"
#include "proto/version.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define RB(name) WEIGHTFLOOR__V1__REQUEST__BODY_##name
#define PB(name) WEIGHTFLOOR__V1__REPLY__BODY_##name

static struct wf_ctl_client *open_client(const char *url, int timeout_ms,
                                         const struct wf_ctl_client_opts *opts)
{
	struct wf_ctl_client *c = NULL;
	struct wf_diag d = {{0}};
	int rv = wf_ctl_client_open(url, timeout_ms, opts, &c, &d);
	cr_assert_eq(rv, 0, "client open %s: %s", url, wf_diag_str(&d, rv));
	return c;
}

/* Calls and asserts that a reply came back; returns it. */
static Weightfloor__V1__Reply *call_ok(struct wf_ctl_client *c, const Weightfloor__V1__Request *req)
{
	Weightfloor__V1__Reply *reply = NULL;
	struct wf_diag d = {{0}};
	int rv = wf_ctl_client_call(c, req, &reply, &d);
	cr_assert_eq(rv, 0, "call (%s): %s",
	             req->body_case == RB(MODEL_STATUS) ? req->model_status->name : "-",
	             wf_diag_str(&d, rv));
	return reply;
}

static Weightfloor__V1__Reply *status_call(struct wf_ctl_client *c, const char *name)
{
	Weightfloor__V1__Request req;
	Weightfloor__V1__ModelStatus ms;
	req_model_status(&req, &ms, name);
	return call_ok(c, &req);
}

/* Sends raw bytes with a plain nng REQ socket (default options, as a foreign client would) and
 * returns the nng result; *ret_reply gets the unpacked reply when one came. */
static int raw_call(const char *url, const void *buf, size_t len, int timeout_ms,
                    Weightfloor__V1__Reply **ret_reply)
{
	nng_socket s;
	void *out = NULL;
	size_t n = 0;
	int rv;
	cr_assert_eq(nng_req0_open(&s), 0);
	nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, timeout_ms);
	nng_socket_set_ms(s, NNG_OPT_SENDTIMEO, timeout_ms);
	if ((rv = nng_dial(s, url, NULL, 0)) != 0)
		goto out;
	if ((rv = nng_send(s, (void *)buf, len, 0)) != 0)
		goto out;
	if ((rv = nng_recv(s, &out, &n, NNG_FLAG_ALLOC)) != 0)
		goto out;
	*ret_reply = weightfloor__v1__reply__unpack(NULL, n, out);
	cr_assert_not_null(*ret_reply, "the server's reply must parse");
	nng_free(out, n);
out:
	nng_close(s);
	return rv;
}

/* ---- round trip of every request kind -------------------------------------------------------- */

Test(server, round_trip_every_request, .timeout = 30)
{
	char *dir = wft_tmpdir("ctl");
	struct echo_state st = {0};
	struct wf_ctl_server *srv = echo_server(dir, "x.sock", &st, NULL);
	struct wf_ctl_client_opts co = {.client_name = "test-client"};
	struct wf_ctl_client *c = open_client(wf_ctl_server_url(srv), 5000, &co);
	Weightfloor__V1__Request req;
	Weightfloor__V1__Reply *r;
	uint64_t last_id = 0;

#define EXPECT_OK(r, body)                                                                         \
	do {                                                                                       \
		cr_assert_eq((r)->code, ST(OK), "%s: %s", wf_proto_status_name((r)->code),         \
		             (r)->message);                                                        \
		cr_expect_str_eq((r)->message, "");                                                \
		cr_expect_eq((r)->api_version, WF_PROTO_API_VERSION);                              \
		cr_expect_gt((r)->request_id, last_id);                                            \
		last_id = (r)->request_id;                                                         \
		cr_assert_eq((r)->body_case, PB(body));                                            \
	} while (0)

	/* RegisterModel: name, paths, pin_host */
	{
		Weightfloor__V1__RegisterModel b = WEIGHTFLOOR__V1__REGISTER_MODEL__INIT;
		char *paths[] = {"/models/q-00001-of-00002.gguf", "/models/q-00002-of-00002.gguf"};
		b.name = "qwen";
		b.n_paths = 2;
		b.paths = paths;
		b.pin_host = 1;
		weightfloor__v1__request__init(&req);
		req.body_case = RB(REGISTER_MODEL);
		req.register_model = &b;
		r = call_ok(c, &req);
		EXPECT_OK(r, MODEL_INFO);
		const Weightfloor__V1__ModelInfo *mi = r->model_info;
		cr_expect_str_eq(mi->name, "qwen");
		cr_assert_eq(mi->n_files, 2);
		cr_expect_str_eq(mi->files[0]->path, paths[0]);
		cr_expect_str_eq(mi->files[1]->path, paths[1]);
		cr_expect_eq(mi->files[1]->size_bytes, 1001);
		cr_expect(mi->pin_host);
		cr_expect_eq(mi->floor_state, WEIGHTFLOOR__V1__FLOOR_STATE__FLOOR_STATE_DISK);
		cr_expect_str_eq(mi->digest_hex, "00112233445566778899aabbccddeeff");
		cr_expect_str_eq(mi->format, "gguf");
		cr_expect_str_eq(mi->arch, "llama");
		cr_expect_eq(mi->total_bytes, 3ull << 32);
		cr_expect_eq(mi->dense_bytes, 1ull << 32);
		cr_expect_eq(mi->expert_bytes, 2ull << 32);
		cr_expect_eq(mi->tensor_count, 291);
		cr_expect_eq(mi->holder_count, 2);
		cr_assert_eq(mi->n_holder_pids, 2);
		cr_expect_eq(mi->holder_pids[1], 200);
		cr_expect_eq(mi->last_used_unix_ms, 1700000000123);
		wf_ctl_reply_free(r);
	}
	/* ListModels */
	{
		Weightfloor__V1__ListModels b = WEIGHTFLOOR__V1__LIST_MODELS__INIT;
		weightfloor__v1__request__init(&req);
		req.body_case = RB(LIST_MODELS);
		req.list_models = &b;
		r = call_ok(c, &req);
		EXPECT_OK(r, MODEL_LIST);
		cr_assert_eq(r->model_list->n_models, 2);
		cr_expect_str_eq(r->model_list->models[0]->name, "a");
		cr_expect_eq(r->model_list->models[1]->floor_state,
		             WEIGHTFLOOR__V1__FLOOR_STATE__FLOOR_STATE_PINNED_HOST);
		wf_ctl_reply_free(r);
	}
	/* ModelStatus */
	{
		r = status_call(c, "llama");
		EXPECT_OK(r, MODEL_INFO);
		cr_expect_str_eq(r->model_info->name, "llama");
		cr_expect_eq(r->model_info->floor_state,
		             WEIGHTFLOOR__V1__FLOOR_STATE__FLOOR_STATE_HOST);
		wf_ctl_reply_free(r);
	}
	/* EnsureFloor: name, wait, wait_timeout_ms */
	{
		Weightfloor__V1__EnsureFloor b = WEIGHTFLOOR__V1__ENSURE_FLOOR__INIT;
		b.name = "m1";
		b.wait = 1;
		b.wait_timeout_ms = 4321;
		weightfloor__v1__request__init(&req);
		req.body_case = RB(ENSURE_FLOOR);
		req.ensure_floor = &b;
		r = call_ok(c, &req);
		EXPECT_OK(r, MODEL_INFO);
		cr_expect_str_eq(r->model_info->name, "m1");
		cr_expect_eq(r->model_info->floor_state,
		             WEIGHTFLOOR__V1__FLOOR_STATE__FLOOR_STATE_HOST);
		cr_assert_not_null(r->model_info->progress);
		cr_expect_eq(r->model_info->progress->bytes_total, 4321);
		cr_expect_eq(r->model_info->progress->bytes_done, 7);
		cr_expect_eq(r->model_info->progress->rate_bytes_per_s, 1u << 30);
		wf_ctl_reply_free(r);
		b.wait = 0;
		r = call_ok(c, &req);
		EXPECT_OK(r, MODEL_INFO);
		cr_expect_eq(r->model_info->floor_state,
		             WEIGHTFLOOR__V1__FLOOR_STATE__FLOOR_STATE_MATERIALIZING);
		wf_ctl_reply_free(r);
	}
	/* ReleaseFloor, PinHost, UnpinHost */
	{
		Weightfloor__V1__ReleaseFloor rel = WEIGHTFLOOR__V1__RELEASE_FLOOR__INIT;
		Weightfloor__V1__PinHost pin = WEIGHTFLOOR__V1__PIN_HOST__INIT;
		Weightfloor__V1__UnpinHost unpin = WEIGHTFLOOR__V1__UNPIN_HOST__INIT;
		rel.name = "r1";
		pin.name = "p1";
		unpin.name = "u1";
		weightfloor__v1__request__init(&req);
		req.body_case = RB(RELEASE_FLOOR);
		req.release_floor = &rel;
		r = call_ok(c, &req);
		EXPECT_OK(r, MODEL_INFO);
		cr_expect_str_eq(r->model_info->name, "r1");
		cr_expect_eq(r->model_info->floor_state,
		             WEIGHTFLOOR__V1__FLOOR_STATE__FLOOR_STATE_DISK);
		wf_ctl_reply_free(r);
		req.body_case = RB(PIN_HOST);
		req.pin_host = &pin;
		r = call_ok(c, &req);
		EXPECT_OK(r, MODEL_INFO);
		cr_expect_str_eq(r->model_info->name, "p1");
		cr_expect_eq(r->model_info->floor_state,
		             WEIGHTFLOOR__V1__FLOOR_STATE__FLOOR_STATE_PINNED_HOST);
		wf_ctl_reply_free(r);
		req.body_case = RB(UNPIN_HOST);
		req.unpin_host = &unpin;
		r = call_ok(c, &req);
		EXPECT_OK(r, MODEL_INFO);
		cr_expect_str_eq(r->model_info->name, "u1");
		wf_ctl_reply_free(r);
	}
	/* AgentStatus: the handler echoes Request.client into floor_dir. */
	{
		Weightfloor__V1__AgentStatus b = WEIGHTFLOOR__V1__AGENT_STATUS__INIT;
		weightfloor__v1__request__init(&req);
		req.body_case = RB(AGENT_STATUS);
		req.agent_status = &b;
		r = call_ok(c, &req);
		EXPECT_OK(r, AGENT_STATUS);
		const Weightfloor__V1__AgentStatusReply *a = r->agent_status;
		cr_expect_str_eq(a->version, "test-1");
		cr_expect_str_eq(a->floor_dir, "test-client");
		cr_expect_eq(a->uptime_ms, 12345);
		cr_expect_eq(a->host_budget_bytes, 64ull << 30);
		cr_expect_eq(a->host_used_bytes, 3ull << 30);
		cr_expect_eq(a->reader_backend,
		             WEIGHTFLOOR__V1__READER_BACKEND__READER_BACKEND_IO_URING);
		cr_expect(a->o_direct);
		cr_assert_not_null(a->models);
		cr_expect_eq(a->models->total, 5);
		cr_expect_eq(a->models->failed, 1);
		cr_expect_eq(a->worker_count, 3);
		cr_expect_eq(a->pid, (uint32_t)getpid());
		wf_ctl_reply_free(r);
		/* An explicit Request.client wins over the client's name. */
		req.client = "explicit";
		r = call_ok(c, &req);
		EXPECT_OK(r, AGENT_STATUS);
		cr_expect_str_eq(r->agent_status->floor_dir, "explicit");
		wf_ctl_reply_free(r);
	}
	/* SetResidency: model, target, worker_id */
	{
		Weightfloor__V1__SetResidency b = WEIGHTFLOOR__V1__SET_RESIDENCY__INIT;
		b.model = "m2";
		b.target = WEIGHTFLOOR__V1__RESIDENCY__RESIDENCY_PINNED_DEVICE;
		b.worker_id = "gpu3";
		weightfloor__v1__request__init(&req);
		req.body_case = RB(SET_RESIDENCY);
		req.set_residency = &b;
		r = call_ok(c, &req);
		EXPECT_OK(r, RESIDENCY);
		cr_expect_str_eq(r->residency->model, "m2");
		cr_expect_eq(r->residency->state, b.target);
		cr_expect_str_eq(r->residency->worker_id, "gpu3");
		wf_ctl_reply_free(r);
	}
	/* Pin, Unpin, Evict */
	{
		Weightfloor__V1__Pin pin = WEIGHTFLOOR__V1__PIN__INIT;
		Weightfloor__V1__Unpin unpin = WEIGHTFLOOR__V1__UNPIN__INIT;
		Weightfloor__V1__Evict ev = WEIGHTFLOOR__V1__EVICT__INIT;
		pin.model = "pm";
		pin.worker_id = "w1";
		unpin.model = "um";
		unpin.worker_id = "w2";
		ev.model = "em";
		ev.worker_id = "w3";
		weightfloor__v1__request__init(&req);
		req.body_case = RB(PIN);
		req.pin = &pin;
		r = call_ok(c, &req);
		EXPECT_OK(r, RESIDENCY);
		cr_expect_str_eq(r->residency->model, "pm");
		cr_expect_str_eq(r->residency->worker_id, "w1");
		cr_expect_eq(r->residency->state,
		             WEIGHTFLOOR__V1__RESIDENCY__RESIDENCY_PINNED_DEVICE);
		wf_ctl_reply_free(r);
		req.body_case = RB(UNPIN);
		req.unpin = &unpin;
		r = call_ok(c, &req);
		EXPECT_OK(r, RESIDENCY);
		cr_expect_str_eq(r->residency->model, "um");
		cr_expect_str_eq(r->residency->worker_id, "w2");
		wf_ctl_reply_free(r);
		req.body_case = RB(EVICT);
		req.evict = &ev;
		r = call_ok(c, &req);
		EXPECT_OK(r, RESIDENCY);
		cr_expect_str_eq(r->residency->model, "em");
		cr_expect_str_eq(r->residency->worker_id, "w3");
		cr_expect_eq(r->residency->state, WEIGHTFLOOR__V1__RESIDENCY__RESIDENCY_DISK);
		wf_ctl_reply_free(r);
	}
	/* Prefetch: model, tensors, worker_id */
	{
		Weightfloor__V1__Prefetch b = WEIGHTFLOOR__V1__PREFETCH__INIT;
		char *tensors[] = {"blk.0.attn_q.weight", "blk.1.ffn_up_exps.weight"};
		b.model = "pf";
		b.n_tensors = 2;
		b.tensors = tensors;
		b.worker_id = "w4";
		weightfloor__v1__request__init(&req);
		req.body_case = RB(PREFETCH);
		req.prefetch = &b;
		r = call_ok(c, &req);
		EXPECT_OK(r, RESIDENCY);
		cr_expect_str_eq(r->residency->model, "pf");
		cr_expect_str_eq(r->residency->worker_id, "w4");
		cr_expect_eq(r->residency->bytes_total, 2);
		cr_expect_eq(r->residency->bytes_done, strlen(tensors[1]));
		wf_ctl_reply_free(r);
	}
	/* Compact: reload list, worker_id */
	{
		Weightfloor__V1__Compact b = WEIGHTFLOOR__V1__COMPACT__INIT;
		char *reload[] = {"a", "bb", "ccc"};
		b.n_reload = 3;
		b.reload = reload;
		b.worker_id = "gpu7";
		weightfloor__v1__request__init(&req);
		req.body_case = RB(COMPACT);
		req.compact = &b;
		r = call_ok(c, &req);
		EXPECT_OK(r, COMPACT);
		cr_assert_eq(r->compact->n_reloaded, 3);
		cr_expect_str_eq(r->compact->reloaded[2], "ccc");
		cr_expect_eq(r->compact->bytes_freed, 4);
		wf_ctl_reply_free(r);
	}
	/* WorkerStatus */
	{
		Weightfloor__V1__WorkerStatus b = WEIGHTFLOOR__V1__WORKER_STATUS__INIT;
		b.worker_id = "gpu1";
		weightfloor__v1__request__init(&req);
		req.body_case = RB(WORKER_STATUS);
		req.worker_status = &b;
		r = call_ok(c, &req);
		EXPECT_OK(r, WORKER_INFO);
		cr_expect_str_eq(r->worker_info->worker_id, "gpu1");
		wf_ctl_reply_free(r);
	}
	/* RegisterWorker: every field */
	{
		Weightfloor__V1__RegisterWorker b = WEIGHTFLOOR__V1__REGISTER_WORKER__INIT;
		b.pid = 4242;
		b.device_name = "NVIDIA H100 80GB HBM3";
		b.endpoint = "ipc:///run/weightfloor/worker-0.sock";
		b.device_total_bytes = 80ull << 30;
		b.device_budget_bytes = 70ull << 30;
		b.pinned_host_budget_bytes = 8ull << 30;
		b.worker_id = "gpu0";
		b.device_uuid = "GPU-1234";
		b.device_index = 5;
		weightfloor__v1__request__init(&req);
		req.body_case = RB(REGISTER_WORKER);
		req.register_worker = &b;
		r = call_ok(c, &req);
		EXPECT_OK(r, WORKER_INFO);
		const Weightfloor__V1__WorkerInfo *w = r->worker_info;
		cr_expect_str_eq(w->worker_id, "gpu0");
		cr_expect_eq(w->pid, 4242);
		cr_expect_str_eq(w->device_name, b.device_name);
		cr_expect_str_eq(w->endpoint, b.endpoint);
		cr_expect_eq(w->device_total_bytes, 80ull << 30);
		cr_expect_eq(w->device_budget_bytes, 70ull << 30);
		cr_expect_eq(w->pinned_host_budget_bytes, 8ull << 30);
		cr_expect_str_eq(w->device_uuid, "GPU-1234");
		cr_expect_eq(w->device_index, 5);
		wf_ctl_reply_free(r);
	}
	/* ListWorkers */
	{
		Weightfloor__V1__ListWorkers b = WEIGHTFLOOR__V1__LIST_WORKERS__INIT;
		weightfloor__v1__request__init(&req);
		req.body_case = RB(LIST_WORKERS);
		req.list_workers = &b;
		r = call_ok(c, &req);
		EXPECT_OK(r, WORKER_LIST);
		cr_assert_eq(r->worker_list->n_workers, 1);
		cr_expect_str_eq(r->worker_list->workers[0]->worker_id, "gpu0");
		wf_ctl_reply_free(r);
	}
#undef EXPECT_OK
	cr_expect_eq(atomic_load(&st.calls), 19);
	/* The handler saw who we are. */
	cr_expect_eq(atomic_load(&st.last_transport), WF_CTL_TRANSPORT_IPC);
	cr_expect_eq(atomic_load(&st.last_uid), (unsigned)geteuid());
	cr_expect_eq(atomic_load(&st.last_pid), (int)getpid());

	wf_ctl_client_close(c);
	wf_ctl_server_destroy(srv);
	wft_rmtree(dir);
	free(dir);
}

/* ---- hostile and broken input ---------------------------------------------------------------- */

Test(server, malformed_bytes_get_invalid_argument_and_server_goes_on, .timeout = 30)
{
	char *dir = wft_tmpdir("ctl");
	struct echo_state st = {0};
	struct wf_ctl_server *srv = echo_server(dir, "x.sock", &st, NULL);
	const char *url = wf_ctl_server_url(srv);
	Weightfloor__V1__Reply *r = NULL;

	srand(42);
	for (int i = 0; i < 20; i++) {
		uint8_t junk[512];
		size_t n = (size_t)(rand() % (int)sizeof(junk));
		for (size_t k = 0; k < n; k++)
			junk[k] = (uint8_t)rand();
		int rv = raw_call(url, junk, n, 3000, &r);
		cr_assert_eq(rv, 0, "junk %d: %s", i, nng_strerror(rv));
		cr_expect_eq(r->code, ST(INVALID_ARGUMENT), "junk %d: %s %s", i,
		             wf_proto_status_name(r->code), r->message);
		cr_expect_neq(r->message[0], '\0');
		weightfloor__v1__reply__free_unpacked(r, NULL);
	}
	/* Known-bad shapes. A truncated varint, and a length running past the end. */
	static const uint8_t trunc[] = {0x08, 0xff};
	static const uint8_t overrun[] = {0x1a, 0x7f, 'a'};
	cr_assert_eq(raw_call(url, trunc, sizeof(trunc), 3000, &r), 0);
	cr_expect_eq(r->code, ST(INVALID_ARGUMENT));
	cr_expect_eq(r->request_id, 0);
	cr_expect(strstr(r->message, "malformed"), "%s", r->message);
	weightfloor__v1__reply__free_unpacked(r, NULL);
	cr_assert_eq(raw_call(url, overrun, sizeof(overrun), 3000, &r), 0);
	cr_expect_eq(r->code, ST(INVALID_ARGUMENT));
	weightfloor__v1__reply__free_unpacked(r, NULL);
	/* Empty message: a Request with nothing set. */
	cr_assert_eq(raw_call(url, "", 0, 3000, &r), 0);
	cr_expect_eq(r->code, ST(INVALID_ARGUMENT));
	cr_expect_eq(r->request_id, 0);
	weightfloor__v1__reply__free_unpacked(r, NULL);
	cr_expect_eq(atomic_load(&st.calls), 0, "junk never reaches the handler");

	/* And a proper client is served as before. */
	struct wf_ctl_client *c = open_client(url, 3000, NULL);
	r = status_call(c, "after-junk");
	cr_expect_eq(r->code, ST(OK));
	cr_expect_str_eq(r->model_info->name, "after-junk");
	wf_ctl_reply_free(r);
	wf_ctl_client_close(c);
	wf_ctl_server_destroy(srv);
	wft_rmtree(dir);
	free(dir);
}

Test(server, unsupported_body_version_and_id, .timeout = 30)
{
	char *dir = wft_tmpdir("ctl");
	struct echo_state st = {0};
	struct wf_ctl_server *srv = echo_server(dir, "x.sock", &st, NULL);
	const char *url = wf_ctl_server_url(srv);
	Weightfloor__V1__Reply *r = NULL;

	/* A newer client: id 5, api 1.3, body field 60 (an empty message) unknown to this build. */
	static const uint8_t newer[] = {0x08, 0x05, 0x10, 0x83, 0x80, 0x04, 0xe2, 0x03, 0x00};
	cr_assert_eq(raw_call(url, newer, sizeof(newer), 3000, &r), 0);
	cr_expect_eq(r->code, ST(INVALID_ARGUMENT));
	cr_expect_eq(r->request_id, 5);
	cr_expect(strstr(r->message, "unsupported request"), "%s", r->message);
	cr_expect(strstr(r->message, "60"), "%s", r->message);
	cr_expect_eq(r->body_case, PB(_NOT_SET));
	weightfloor__v1__reply__free_unpacked(r, NULL);

	/* Api major 2 with a body this build knows: still refused. */
	static const uint8_t major2[] = {0x08, 0x06, 0x10, 0x80, 0x80, 0x08, 0x92, 0x01, 0x00};
	cr_assert_eq(raw_call(url, major2, sizeof(major2), 3000, &r), 0);
	cr_expect_eq(r->code, ST(INVALID_ARGUMENT));
	cr_expect_eq(r->request_id, 6);
	cr_expect(strstr(r->message, "api_version 2.0"), "%s", r->message);
	weightfloor__v1__reply__free_unpacked(r, NULL);

	/* No api_version; request_id 0. */
	static const uint8_t nover[] = {0x08, 0x09, 0x92, 0x01, 0x00};
	cr_assert_eq(raw_call(url, nover, sizeof(nover), 3000, &r), 0);
	cr_expect_eq(r->code, ST(INVALID_ARGUMENT));
	cr_expect(strstr(r->message, "api_version"), "%s", r->message);
	weightfloor__v1__reply__free_unpacked(r, NULL);
	static const uint8_t noid[] = {0x10, 0x80, 0x80, 0x04, 0x92, 0x01, 0x00};
	cr_assert_eq(raw_call(url, noid, sizeof(noid), 3000, &r), 0);
	cr_expect_eq(r->code, ST(INVALID_ARGUMENT));
	cr_expect(strstr(r->message, "request_id"), "%s", r->message);
	weightfloor__v1__reply__free_unpacked(r, NULL);

	/* The same model_status body with a proper envelope reaches the handler. */
	static const uint8_t good[] = {0x08, 0x0a, 0x10, 0x80, 0x80, 0x04, 0x92, 0x01, 0x00};
	cr_assert_eq(raw_call(url, good, sizeof(good), 3000, &r), 0);
	cr_expect_eq(r->code, ST(OK), "%s", r->message);
	cr_expect_eq(r->request_id, 10);
	weightfloor__v1__reply__free_unpacked(r, NULL);
	cr_expect_eq(atomic_load(&st.calls), 1);

	/* A client-side request with no body is sent and refused by the server in the same way. */
	struct wf_ctl_client *c = open_client(url, 3000, NULL);
	Weightfloor__V1__Request req = WEIGHTFLOOR__V1__REQUEST__INIT;
	r = call_ok(c, &req);
	cr_expect_eq(r->code, ST(INVALID_ARGUMENT));
	cr_expect_neq(r->request_id, 0);
	cr_expect(strstr(r->message, "unsupported request"), "%s", r->message);
	wf_ctl_reply_free(r);
	wf_ctl_client_close(c);
	wf_ctl_server_destroy(srv);
	wft_rmtree(dir);
	free(dir);
}

Test(server, oversized_request, .timeout = 30)
{
	char *dir = wft_tmpdir("ctl");
	struct echo_state st = {0};
	struct wf_ctl_server_opts so = {.max_request_size = 64 << 10};
	struct wf_ctl_server *srv = echo_server(dir, "x.sock", &st, &so);
	const char *url = wf_ctl_server_url(srv);
	struct wf_diag d = {{0}};
	Weightfloor__V1__Reply *r = NULL;
	size_t big = 200 << 10;
	char *name = malloc(big + 1);
	cr_assert(name);
	memset(name, 'n', big);
	name[big] = '\0';
	Weightfloor__V1__Request req;
	Weightfloor__V1__ModelStatus ms;
	req_model_status(&req, &ms, name);

	/* Our client, told that the server takes more than it does: it sends, the server's
	 * transport drops the connection, and the call fails at once instead of hanging. */
	struct wf_ctl_client_opts co = {.max_request_size = 8 << 20};
	struct wf_ctl_client *c = open_client(url, 4000, &co);
	int64_t t0 = now_ms();
	int rv = wf_ctl_client_call(c, &req, &r, &d);
	int64_t dt = now_ms() - t0;
	/* WF_ETRANSPORT is the property: a hang would end as WF_ETIMEOUT, at the 4 s time-out. */
	cr_expect_eq(rv, WF_ETRANSPORT, "%s: %s", wf_err_name(rv), wf_diag_str(&d, rv));
	cr_log_info("oversized, wf client: %s after %lld ms (%s)", wf_err_name(rv), (long long)dt,
	            wf_diag_str(&d, rv));

	/* The same client reconnects and is served. */
	r = status_call(c, "after-oversize");
	cr_expect_eq(r->code, ST(OK));
	wf_ctl_reply_free(r);

	/* (A foreign nng REQ client with default options: test_peers.c, in its own process.) */

	/* With the default limits, our client refuses to send more than the server takes. */
	struct wf_ctl_client *c2 = open_client(url, 4000, NULL);
	char *huge = malloc((5u << 20) + 1);
	cr_assert(huge);
	memset(huge, 'h', 5u << 20);
	huge[5u << 20] = '\0';
	req_model_status(&req, &ms, huge);
	wf_diag_clear(&d);
	rv = wf_ctl_client_call(c2, &req, &r, &d);
	cr_expect_eq(rv, WF_ELIMIT, "%s", wf_err_name(rv));
	cr_expect(strstr(wf_diag_str(&d, rv), "exceeds"), "%s", wf_diag_str(&d, rv));

	r = status_call(c2, "still-alive");
	cr_expect_eq(r->code, ST(OK));
	wf_ctl_reply_free(r);
	cr_expect_eq(atomic_load(&st.calls), 2);
	free(huge);
	free(name);
	wf_ctl_client_close(c);
	wf_ctl_client_close(c2);
	wf_ctl_server_destroy(srv);
	wft_rmtree(dir);
	free(dir);
}

Test(server, handler_errors_become_statuses, .timeout = 30)
{
	char *dir = wft_tmpdir("ctl");
	struct echo_state st = {0};
	struct wf_ctl_server_opts so = {.max_reply_size = 1 << 20};
	struct wf_ctl_server *srv = echo_server(dir, "x.sock", &st, &so);
	struct wf_ctl_client *c = open_client(wf_ctl_server_url(srv), 5000, NULL);
	Weightfloor__V1__Reply *r;

	r = status_call(c, "missing");
	cr_expect_eq(r->code, ST(NOT_FOUND));
	cr_expect_str_eq(r->message, "model 'missing' is not registered");
	cr_expect_eq(wf_proto_status_to_err(r->code), WF_ENOT_FOUND);
	wf_ctl_reply_free(r);

	r = status_call(c, "set-code");
	cr_expect_eq(r->code, ST(NOT_RESIDENT));
	cr_expect_str_eq(r->message, "not on the device");
	cr_expect_eq(r->body_case, PB(_NOT_SET), "no body with an error");
	wf_ctl_reply_free(r);

	r = status_call(c, "bad-status");
	cr_expect_eq(r->code, ST(INTERNAL));
	wf_ctl_reply_free(r);

	r = status_call(c, "positive");
	cr_expect_eq(r->code, ST(INTERNAL));
	cr_expect_neq(r->message[0], '\0');
	wf_ctl_reply_free(r);

	r = status_call(c, "huge");
	cr_expect_eq(r->code, ST(RESOURCE_EXHAUSTED));
	cr_expect(strstr(r->message, "exceeds"), "%s", r->message);
	cr_expect_eq(r->body_case, PB(_NOT_SET));
	wf_ctl_reply_free(r);

	r = status_call(c, "fine");
	cr_expect_eq(r->code, ST(OK));
	wf_ctl_reply_free(r);
	wf_ctl_client_close(c);
	wf_ctl_server_destroy(srv);
	wft_rmtree(dir);
	free(dir);
}

/* ---- timeouts and concurrency ------------------------------------------------------------- */

Test(server, request_timeout_with_slow_handler, .timeout = 30)
{
	char *dir = wft_tmpdir("ctl");
	struct echo_state st = {0};
	struct wf_ctl_server *srv = echo_server(dir, "x.sock", &st, NULL);
	struct wf_ctl_client *c = open_client(wf_ctl_server_url(srv), 300, NULL);
	Weightfloor__V1__Request req;
	Weightfloor__V1__ModelStatus ms;
	Weightfloor__V1__Reply *r = NULL;
	struct wf_diag d = {{0}};

	req_model_status(&req, &ms, "slow:2000");
	int64_t t0 = now_ms();
	int rv = wf_ctl_client_call(c, &req, &r, &d);
	int64_t dt = now_ms() - t0;
	/* Not before the client's 300 ms (nng's timers may fire a tick early), and not by waiting
	 * for the handler's 2 s: that would have been a reply, not WF_ETIMEOUT. The upper bound
	 * only catches a time-out gone far wrong. */
	cr_expect_eq(rv, WF_ETIMEOUT, "%s: %s", wf_err_name(rv), wf_diag_str(&d, rv));
	cr_expect_geq(dt, 250);
	cr_expect_lt(dt, 20 * 300, "timed out after %lld ms", (long long)dt);
	cr_expect(strstr(wf_diag_str(&d, rv), "no reply"), "%s", wf_diag_str(&d, rv));

	/* The slow handler still runs on one worker; the next request is served by another, on the
	 * same client, within the client's 300 ms (waiting for the slow one would take 1.7 s more).
	 * A late reply to the abandoned request is discarded by nng. */
	r = status_call(c, "quick");
	cr_expect_eq(r->code, ST(OK));
	cr_expect_str_eq(r->model_info->name, "quick");
	wf_ctl_reply_free(r);

	/* A per-call timeout longer than the client's default. */
	req_model_status(&req, &ms, "slow:500");
	wf_diag_clear(&d);
	rv = wf_ctl_client_call_timeout(c, &req, 3000, &r, &d);
	cr_expect_eq(rv, 0, "%s", wf_diag_str(&d, rv));
	if (rv == 0)
		wf_ctl_reply_free(r);
	wf_ctl_client_close(c);
	wf_ctl_server_destroy(srv);
	wft_rmtree(dir);
	free(dir);
}

struct slow_arg {
	struct wf_ctl_client *c;
	const char *name;
	int timeout_ms;
	int rv;
	Weightfloor__V1__Status code;
	int64_t done_ms;
};

static void *slow_thread(void *p)
{
	struct slow_arg *a = p;
	Weightfloor__V1__Request req;
	Weightfloor__V1__ModelStatus ms;
	Weightfloor__V1__Reply *r = NULL;
	req_model_status(&req, &ms, a->name);
	a->rv = wf_ctl_client_call_timeout(a->c, &req, a->timeout_ms, &r, NULL);
	a->done_ms = now_ms();
	if (a->rv == 0) {
		a->code = r->code;
		wf_ctl_reply_free(r);
	}
	return NULL;
}

Test(server, slow_request_does_not_block_others, .timeout = 30)
{
	char *dir = wft_tmpdir("ctl");
	struct echo_state st = {0};
	struct wf_ctl_server_opts so = {.nworkers = 2};
	struct wf_ctl_server *srv = echo_server(dir, "x.sock", &st, &so);
	struct wf_ctl_client *c = open_client(wf_ctl_server_url(srv), 5000, NULL);
	struct slow_arg a = {.c = c, .name = "slow:1500", .timeout_ms = 5000};
	pthread_t t;
	pthread_create(&t, NULL, slow_thread, &a);
	sleep_ms(100);
	int64_t t0 = now_ms();
	for (int i = 0; i < 10; i++) {
		Weightfloor__V1__Reply *r = status_call(c, "fast");
		cr_expect_eq(r->code, ST(OK));
		wf_ctl_reply_free(r);
	}
	/* Waiting for the slow one (1.5 s, started 0.1 s before) would take at least 1.4 s. */
	cr_expect_lt(now_ms() - t0, 1400, "fast requests waited for the slow one");
	pthread_join(t, NULL);
	cr_expect_eq(a.rv, 0);
	cr_expect_eq(a.code, ST(OK));
	wf_ctl_client_close(c);
	wf_ctl_server_destroy(srv);
	wft_rmtree(dir);
	free(dir);
}

struct many_arg {
	struct wf_ctl_client *c;
	int idx;
	int ok;
};

static void *many_thread(void *p)
{
	struct many_arg *a = p;
	char name[32];
	for (int i = 0; i < 50; i++) {
		Weightfloor__V1__Request req;
		Weightfloor__V1__ModelStatus ms;
		Weightfloor__V1__Reply *r = NULL;
		snprintf(name, sizeof(name), "t%d-%d", a->idx, i);
		req_model_status(&req, &ms, name);
		if (wf_ctl_client_call(a->c, &req, &r, NULL) == 0) {
			if (r->code == ST(OK) && strcmp(r->model_info->name, name) == 0)
				a->ok++;
			wf_ctl_reply_free(r);
		}
	}
	return NULL;
}

Test(server, concurrent_calls_on_one_client, .timeout = 60)
{
	char *dir = wft_tmpdir("ctl");
	struct echo_state st = {0};
	struct wf_ctl_server *srv = echo_server(dir, "x.sock", &st, NULL);
	struct wf_ctl_client *c = open_client(wf_ctl_server_url(srv), 5000, NULL);
	pthread_t t[8];
	struct many_arg a[8];
	for (int i = 0; i < 8; i++) {
		a[i] = (struct many_arg){.c = c, .idx = i};
		pthread_create(&t[i], NULL, many_thread, &a[i]);
	}
	for (int i = 0; i < 8; i++) {
		pthread_join(t[i], NULL);
		cr_expect_eq(a[i].ok, 50, "thread %d: %d of 50", i, a[i].ok);
	}
	wf_ctl_client_close(c);
	wf_ctl_server_destroy(srv);
	wft_rmtree(dir);
	free(dir);
}

Test(server, stop_is_prompt_with_a_client_mid_request, .timeout = 30)
{
	char *dir = wft_tmpdir("ctl");
	struct echo_state st = {0};
	struct wf_ctl_server *srv = echo_server(dir, "x.sock", &st, NULL);
	struct wf_ctl_client *c = open_client(wf_ctl_server_url(srv), 8000, NULL);
	struct slow_arg a = {.c = c, .name = "block", .timeout_ms = 8000};
	pthread_t t;
	pthread_create(&t, NULL, slow_thread, &a);
	int64_t until = now_ms() + 5000;
	while (!atomic_load(&st.entered_block) && now_ms() < until)
		sleep_ms(5);
	cr_assert(atomic_load(&st.entered_block), "the request never reached the handler");

	int64_t t0 = now_ms();
	wf_ctl_server_close(srv);
	int64_t t_close = now_ms() - t0;
	wf_ctl_server_stop(srv);
	wf_ctl_server_destroy(srv);
	int64_t t_stop = now_ms() - t0;
	/* The handler blocks for 10 s unless the server closes: close and stop that waited for it
	 * would take that long. */
	cr_expect_lt(t_close, 5000, "close must not block (%lld ms)", (long long)t_close);
	cr_expect_lt(t_stop, 5000, "stop took %lld ms", (long long)t_stop);

	pthread_join(t, NULL);
	/* The client learns promptly: either the handler's UNAVAILABLE reply made it out before
	 * the socket closed, or the connection drop. */
	cr_expect(a.rv == WF_ETRANSPORT || (a.rv == 0 && a.code == ST(UNAVAILABLE)),
	          "client got %s / %s", wf_err_name(a.rv), wf_proto_status_name(a.code));
	cr_expect_lt(a.done_ms - t0, 5000); /* its own time-out is 8 s, the handler's 10 s */
	cr_log_info("stop: close %lld ms, stop+destroy %lld ms; client: %s %s", (long long)t_close,
	            (long long)t_stop, wf_err_name(a.rv),
	            a.rv == 0 ? wf_proto_status_name(a.code) : "");
	wf_ctl_client_close(c);
	wft_rmtree(dir);
	free(dir);
}

Test(server, lifecycle_idle_and_unstarted, .timeout = 30)
{
	char *dir = wft_tmpdir("ctl");
	struct echo_state st = {0};
	/* Idle server: stop is prompt with every worker blocked in a receive. */
	struct wf_ctl_server *srv = echo_server(dir, "a.sock", &st, NULL);
	int64_t t0 = now_ms();
	wf_ctl_server_close(srv);
	wf_ctl_server_close(srv); /* idempotent */
	wf_ctl_server_stop(srv);
	wf_ctl_server_stop(srv);
	cr_expect_lt(now_ms() - t0, 5000); /* a worker left in its receive would never return */
	wf_ctl_server_destroy(srv);

	/* Created, never started: destroy alone is enough. */
	struct wf_ctl_server_opts o = {.handle = echo_handle, .ctx = &st};
	o.listen.url = ipc_url(dir, "b.sock");
	struct wf_diag d = {{0}};
	srv = NULL;
	cr_assert_eq(wf_ctl_server_create(&o, &srv, &d), 0, "%s", d.msg);
	wf_ctl_server_destroy(srv);
	wf_ctl_server_destroy(NULL);
	free((char *)o.listen.url);
	wft_rmtree(dir);
	free(dir);
}

/* ---- transport policy ------------------------------------------------------------------------ */

Test(server, ipc_socket_mode_group_and_cleanup, .timeout = 30)
{
	char *dir = wft_tmpdir("ctl");
	struct echo_state st = {0};
	struct wf_ctl_server_opts so = {0};
	bool root = geteuid() == 0;
	if (root)
		so.listen.ipc_group = 65534;
	struct wf_ctl_server *srv = echo_server(dir, "x.sock", &st, &so);
	char *path = NULL;
	cr_assert(asprintf(&path, "%s/x.sock", dir) > 0);
	struct stat sb;
	cr_assert_eq(stat(path, &sb), 0, "%s: %s", path, strerror(errno));
	cr_expect(S_ISSOCK(sb.st_mode));
	cr_expect_eq(sb.st_mode & 07777, 0660, "mode %o", (unsigned)(sb.st_mode & 07777));
	if (root)
		cr_expect_eq(sb.st_gid, 65534);

	wf_ctl_server_destroy(srv);
	cr_expect_neq(stat(path, &sb), 0, "socket file left behind");

	/* An explicit mode. */
	so.listen.ipc_mode = 0600;
	srv = echo_server(dir, "y.sock", &st, &so);
	free(path);
	cr_assert(asprintf(&path, "%s/y.sock", dir) > 0);
	cr_assert_eq(stat(path, &sb), 0);
	cr_expect_eq(sb.st_mode & 07777, 0600);
	wf_ctl_server_destroy(srv);
	free(path);
	wft_rmtree(dir);
	free(dir);
}

Test(server, url_policy, .timeout = 30)
{
	struct echo_state st = {0};
	struct wf_ctl_server_opts o = {.handle = echo_handle, .ctx = &st};
	struct wf_ctl_server *srv = NULL;
	struct wf_diag d = {{0}};
	int rv;

	o.listen.url = "tcp://127.0.0.1:0";
	rv = wf_ctl_server_create(&o, &srv, &d);
	cr_expect_eq(rv, WF_EINVAL, "%s", wf_err_name(rv));
	cr_expect(strstr(wf_diag_str(&d, rv), "allow_insecure_tcp"), "%s", d.msg);

	wf_diag_clear(&d);
	o.listen.url = "tls+tcp://127.0.0.1:0";
	rv = wf_ctl_server_create(&o, &srv, &d);
	cr_expect_eq(rv, WF_EINVAL, "%s: %s", wf_err_name(rv), d.msg);

	wf_diag_clear(&d);
	o.listen.url = "inproc://x";
	rv = wf_ctl_server_create(&o, &srv, &d);
	cr_expect_eq(rv, WF_EUNSUPPORTED, "%s", wf_err_name(rv));
	o.listen.url = "ws://127.0.0.1:0/x";
	cr_expect_eq(wf_ctl_server_create(&o, &srv, NULL), WF_EUNSUPPORTED);
	o.listen.url = "ipc://";
	cr_expect_eq(wf_ctl_server_create(&o, &srv, NULL), WF_EINVAL);
	o.handle = NULL;
	o.listen.url = "ipc:///tmp/never";
	cr_expect_eq(wf_ctl_server_create(&o, &srv, NULL), WF_EINVAL);

	/* Clients follow the same rule. */
	struct wf_ctl_client *c = NULL;
	cr_expect_eq(wf_ctl_client_open("tcp://127.0.0.1:1", 100, NULL, &c, NULL), WF_EINVAL);
	cr_expect_eq(wf_ctl_client_open("inproc://x", 100, NULL, &c, NULL), WF_EUNSUPPORTED);
	cr_log_info("nng TLS available: %s", wf_ctl_tls_available() ? "yes" : "no");
}

Test(server, plain_tcp_when_allowed, .timeout = 30)
{
	struct echo_state st = {0};
	struct wf_ctl_server_opts so = {0};
	so.listen.url = "tcp://127.0.0.1:0";
	so.listen.allow_insecure_tcp = true;
	struct wf_ctl_server *srv = echo_server(NULL, NULL, &st, &so);
	const char *url = wf_ctl_server_url(srv);
	cr_expect(strncmp(url, "tcp://127.0.0.1:", 16) == 0 && strcmp(url + 16, "0") != 0, "%s",
	          url);
	struct wf_ctl_client_opts co = {.allow_insecure_tcp = true};
	struct wf_ctl_client *c = open_client(url, 3000, &co);
	Weightfloor__V1__Reply *r = status_call(c, "over-tcp");
	cr_expect_eq(r->code, ST(OK));
	wf_ctl_reply_free(r);
	cr_expect_eq(atomic_load(&st.last_transport), WF_CTL_TRANSPORT_TCP);
	wf_ctl_client_close(c);
	wf_ctl_server_destroy(srv);
}

Test(client, no_server_and_wait_for_server, .timeout = 30)
{
	char *dir = wft_tmpdir("ctl");
	char *url = ipc_url(dir, "x.sock");
	struct wf_ctl_client *c = NULL;
	struct wf_diag d = {{0}};

	/* Refused at once, not after waiting out the 10 s given. */
	int64_t t0 = now_ms();
	int rv = wf_ctl_client_open(url, 10000, NULL, &c, &d);
	cr_expect_eq(rv, WF_EUNAVAILABLE, "%s: %s", wf_err_name(rv), wf_diag_str(&d, rv));
	cr_expect_lt(now_ms() - t0, 5000);

	/* A worker that starts before the agent: open succeeds, calls wait for the server. */
	struct wf_ctl_client_opts co = {.wait_for_server = true};
	c = open_client(url, 300, &co);
	Weightfloor__V1__Request req;
	Weightfloor__V1__ModelStatus ms;
	Weightfloor__V1__Reply *r = NULL;
	req_model_status(&req, &ms, "early");
	wf_diag_clear(&d);
	rv = wf_ctl_client_call(c, &req, &r, &d);
	cr_expect_eq(rv, WF_ETIMEOUT, "%s", wf_err_name(rv));
	cr_expect(strstr(wf_diag_str(&d, rv), "not connected"), "%s", d.msg);

	struct echo_state st = {0};
	struct wf_ctl_server *srv = echo_server(dir, "x.sock", &st, NULL);
	wf_diag_clear(&d);
	rv = wf_ctl_client_call_timeout(c, &req, 3000, &r, &d);
	cr_expect_eq(rv, 0, "%s", wf_diag_str(&d, rv));
	if (rv == 0) {
		cr_expect_eq(r->code, ST(OK));
		wf_ctl_reply_free(r);
	}

	/* The agent restarts: the old connection drops, the client reconnects by itself. A call
	 * that races the teardown of the old connection fails with WF_ETRANSPORT (requests are
	 * never resent); the retry goes out on the new one. */
	wf_ctl_server_destroy(srv);
	srv = echo_server(dir, "x.sock", &st, NULL);
	wf_diag_clear(&d);
	rv = wf_ctl_client_call_timeout(c, &req, 3000, &r, &d);
	if (rv == WF_ETRANSPORT) {
		cr_log_info("first call after restart: %s", wf_diag_str(&d, rv));
		wf_diag_clear(&d);
		rv = wf_ctl_client_call_timeout(c, &req, 3000, &r, &d);
	}
	cr_expect_eq(rv, 0, "after restart: %s", wf_diag_str(&d, rv));
	if (rv == 0)
		wf_ctl_reply_free(r);
	wf_ctl_client_close(c);
	wf_ctl_server_destroy(srv);
	free(url);
	wft_rmtree(dir);
	free(dir);
}
