/* The wire format itself: every body kind survives pack/unpack, field numbers keep to the ranges
 * that the versioning rules reserve, golden bytes pin the encoding, and unknown fields (a newer
 * peer) are carried, not rejected. */
#include "weightfloor.pb-c.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

static const ProtobufCFieldDescriptor *field_by_name(const ProtobufCMessageDescriptor *d,
                                                     const char *name)
{
	return protobuf_c_message_descriptor_get_field_by_name(d, name);
}

/* Packs m, unpacks it with its descriptor, and returns the copy (free with free_unpacked). */
static ProtobufCMessage *repack(const ProtobufCMessage *m)
{
	size_t n = protobuf_c_message_get_packed_size(m);
	uint8_t *buf = malloc(n ? n : 1);
	cr_assert(buf);
	cr_assert_eq(protobuf_c_message_pack(m, buf), n);
	ProtobufCMessage *out = protobuf_c_message_unpack(m->descriptor, NULL, n, buf);
	free(buf);
	cr_assert(out, "%s does not unpack", m->descriptor->name);
	return out;
}

/* Sets each member of the body oneof of an envelope in turn, with an empty message of the
 * member's type, and checks that the case survives the wire. Driven by the descriptor, so a body
 * added later is covered without touching this test. */
static void every_body(const ProtobufCMessageDescriptor *env, size_t case_offset, size_t *ret_n)
{
	size_t n = 0;
	for (unsigned i = 0; i < env->n_fields; i++) {
		const ProtobufCFieldDescriptor *f = &env->fields[i];
		if (!(f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF))
			continue;
		cr_assert_eq(f->type, PROTOBUF_C_TYPE_MESSAGE, "%s.%s", env->name, f->name);
		const ProtobufCMessageDescriptor *sub = f->descriptor;
		ProtobufCMessage *body = calloc(1, sub->sizeof_message);
		ProtobufCMessage *m = calloc(1, env->sizeof_message);
		cr_assert(body && m);
		protobuf_c_message_init(sub, body);
		protobuf_c_message_init(env, m);
		*(uint32_t *)((char *)m + f->quantifier_offset) = f->id;
		*(ProtobufCMessage **)((char *)m + f->offset) = body;
		cr_assert_eq(f->quantifier_offset, case_offset);

		ProtobufCMessage *back = repack(m);
		cr_expect_eq(*(uint32_t *)((char *)back + case_offset), f->id, "%s.%s", env->name,
		             f->name);
		cr_expect_not_null(*(ProtobufCMessage **)((char *)back + f->offset));
		protobuf_c_message_free_unpacked(back, NULL);
		free(body);
		free(m);
		n++;
	}
	*ret_n = n;
}

Test(messages, every_request_body_round_trips, .timeout = 10)
{
	size_t n;
	every_body(&weightfloor__v1__request__descriptor,
	           offsetof(Weightfloor__V1__Request, body_case), &n);
	cr_expect_eq(n, 23, "floor slice (10) + worker slice (13) request kinds");
}

Test(messages, every_reply_body_round_trips, .timeout = 10)
{
	size_t n;
	every_body(&weightfloor__v1__reply__descriptor, offsetof(Weightfloor__V1__Reply, body_case),
	           &n);
	cr_expect_eq(n, 11);
}

/* PublishTensors carries bytes, and the PUBLISHED event its list, intact (API 1.4). */
Test(messages, publish_request_and_event_round_trip, .timeout = 10)
{
	uint8_t bytes[5] = {0, 1, 0xff, 0x80, 7};
	Weightfloor__V1__TensorBytes tb = WEIGHTFLOOR__V1__TENSOR_BYTES__INIT;
	Weightfloor__V1__TensorBytes *tbp = &tb;
	tb.name = "blk.0.attn_q.weight";
	tb.data.data = bytes;
	tb.data.len = sizeof bytes;
	Weightfloor__V1__PublishTensors pt = WEIGHTFLOOR__V1__PUBLISH_TENSORS__INIT;
	pt.name = "m";
	pt.tensors = &tbp;
	pt.n_tensors = 1;
	Weightfloor__V1__Request req = WEIGHTFLOOR__V1__REQUEST__INIT;
	req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_PUBLISH_TENSORS;
	req.publish_tensors = &pt;
	Weightfloor__V1__Request *r = (Weightfloor__V1__Request *)repack(&req.base);
	cr_assert_eq(r->body_case, WEIGHTFLOOR__V1__REQUEST__BODY_PUBLISH_TENSORS);
	cr_assert_eq(r->publish_tensors->n_tensors, 1);
	cr_assert_str_eq(r->publish_tensors->tensors[0]->name, "blk.0.attn_q.weight");
	cr_assert_eq(r->publish_tensors->tensors[0]->data.len, sizeof bytes);
	cr_assert_eq(memcmp(r->publish_tensors->tensors[0]->data.data, bytes, sizeof bytes), 0);
	protobuf_c_message_free_unpacked(&r->base, NULL);

	uint32_t ids[3] = {0, 17, 70000};
	char *names[3] = {"a", "b", "c"};
	Weightfloor__V1__Event ev = WEIGHTFLOOR__V1__EVENT__INIT;
	ev.kind = WEIGHTFLOOR__V1__EVENT_KIND__EVENT_KIND_PUBLISHED;
	ev.digest = "0123456789abcdef0123456789abcdef";
	ev.generation = 6;
	ev.tensor_ids = ids;
	ev.n_tensor_ids = 3;
	ev.tensor_names = names;
	ev.n_tensor_names = 3;
	Weightfloor__V1__Event *e = (Weightfloor__V1__Event *)repack(&ev.base);
	cr_assert_eq(e->kind, 8);
	cr_assert_str_eq(e->digest, ev.digest);
	cr_assert_eq(e->generation, 6);
	cr_assert_eq(e->n_tensor_ids, 3);
	cr_assert_eq(e->tensor_ids[2], 70000);
	cr_assert_str_eq(e->tensor_names[1], "b");
	protobuf_c_message_free_unpacked(&e->base, NULL);
}

/* The number ranges of the versioning rules in weightfloor.proto. */
static void check_ranges(const ProtobufCMessageDescriptor *d)
{
	for (unsigned i = 0; i < d->n_fields; i++) {
		const ProtobufCFieldDescriptor *f = &d->fields[i];
		if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF)
			cr_expect(f->id >= 16 && f->id <= 63, "%s.%s = %u", d->name, f->name,
			          f->id);
		else
			cr_expect(f->id >= 1 && f->id <= 15, "%s.%s = %u", d->name, f->name, f->id);
	}
}

Test(messages, field_number_ranges, .timeout = 10)
{
	check_ranges(&weightfloor__v1__request__descriptor);
	check_ranges(&weightfloor__v1__reply__descriptor);
	/* Floor bodies below 40, worker bodies from 40. */
	cr_expect_lt(field_by_name(&weightfloor__v1__request__descriptor, "agent_status")->id, 40);
	cr_expect_geq(field_by_name(&weightfloor__v1__request__descriptor, "set_residency")->id,
	              40);
	cr_expect_geq(field_by_name(&weightfloor__v1__request__descriptor, "list_workers")->id, 40);
}

/* Pins the wire encoding: renumbering a field or changing a type breaks this test, as it would
 * break every deployed peer. */
Test(messages, golden_bytes, .timeout = 10)
{
	static const uint8_t golden[] = {0x08, 0x07, 0x10, 0x80, 0x80, 0x04, 0x1a,
	                                 0x01, 0x74, 0x82, 0x01, 0x09, 0x0a, 0x01,
	                                 0x6d, 0x12, 0x02, 0x2f, 0x61, 0x18, 0x01};
	Weightfloor__V1__Request req = WEIGHTFLOOR__V1__REQUEST__INIT;
	Weightfloor__V1__RegisterModel rm = WEIGHTFLOOR__V1__REGISTER_MODEL__INIT;
	char *paths[] = {"/a"};
	rm.name = "m";
	rm.n_paths = 1;
	rm.paths = paths;
	rm.pin_host = 1;
	req.request_id = 7;
	req.api_version = 1u << 16;
	req.client = "t";
	req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_REGISTER_MODEL;
	req.register_model = &rm;
	uint8_t buf[64];
	size_t n = weightfloor__v1__request__get_packed_size(&req);
	cr_assert_eq(n, sizeof(golden));
	weightfloor__v1__request__pack(&req, buf);
	cr_expect_arr_eq(buf, golden, sizeof(golden));

	/* Enum values are wire values too. */
	cr_expect_eq(WEIGHTFLOOR__V1__STATUS__STATUS_OK, 1);
	cr_expect_eq(WEIGHTFLOOR__V1__STATUS__STATUS_INTERNAL, 9);
	cr_expect_eq(WEIGHTFLOOR__V1__FLOOR_STATE__FLOOR_STATE_FAILED, 5);
	cr_expect_eq(WEIGHTFLOOR__V1__RESIDENCY__RESIDENCY_PINNED_DEVICE, 4);
	cr_expect_eq(WEIGHTFLOOR__V1__EVENT_KIND__EVENT_KIND_WORKER, 6);
}

Test(messages, unknown_fields_are_carried, .timeout = 10)
{
	/* A newer client: envelope 7/1.0/"t", a body field 99 this build does not know (varint 1),
	 * and an unknown field 15 in the envelope. */
	static const uint8_t bytes[] = {0x08, 0x07, 0x10, 0x80, 0x80, 0x04, 0x1a,
	                                0x01, 0x74, 0x98, 0x06, 0x01, 0x78, 0x05};
	Weightfloor__V1__Request *req =
	    weightfloor__v1__request__unpack(NULL, sizeof(bytes), bytes);
	cr_assert_not_null(req);
	cr_expect_eq(req->request_id, 7);
	cr_expect_str_eq(req->client, "t");
	cr_expect_eq(req->body_case, WEIGHTFLOOR__V1__REQUEST__BODY__NOT_SET);
	cr_assert_eq(req->base.n_unknown_fields, 2);
	cr_expect_eq(req->base.unknown_fields[0].tag, 99);
	cr_expect_eq(req->base.unknown_fields[1].tag, 15);
	weightfloor__v1__request__free_unpacked(req, NULL);

	/* A newer field inside a known body: ignored, the rest intact. */
	static const uint8_t nested[] = {
	    0x08, 0x01, 0x92, 0x01, 0x05,
	    0x0a, 0x01, 0x78, 0x50, 0x01}; /* model_status{name "x", f10=1} */
	req = weightfloor__v1__request__unpack(NULL, sizeof(nested), nested);
	cr_assert_not_null(req);
	cr_assert_eq(req->body_case, WEIGHTFLOOR__V1__REQUEST__BODY_MODEL_STATUS);
	cr_expect_str_eq(req->model_status->name, "x");
	weightfloor__v1__request__free_unpacked(req, NULL);
}

Test(messages, junk_is_rejected_or_harmless, .timeout = 30)
{
	/* Not a proof, but a smoke check that unpack never crashes on noise (the fuzz target does
	 * the real work). */
	srand(1234);
	uint8_t buf[256];
	for (int it = 0; it < 20000; it++) {
		size_t n = (size_t)(rand() % (int)sizeof(buf));
		for (size_t i = 0; i < n; i++)
			buf[i] = (uint8_t)rand();
		Weightfloor__V1__Request *req = weightfloor__v1__request__unpack(NULL, n, buf);
		weightfloor__v1__request__free_unpacked(req, NULL);
	}
}

Test(messages, event_round_trip, .timeout = 10)
{
	Weightfloor__V1__Event ev = WEIGHTFLOOR__V1__EVENT__INIT;
	ev.sequence = 42;
	ev.time_unix_ms = 1700000000000;
	ev.kind = WEIGHTFLOOR__V1__EVENT_KIND__EVENT_KIND_PROGRESS;
	ev.epoch = 0xdeadbeefcafef00dull;
	ev.model = "qwen";
	ev.bytes_done = 1ull << 33;
	ev.bytes_total = 1ull << 34;
	ev.message = "reading";
	Weightfloor__V1__Event *back = (Weightfloor__V1__Event *)repack(&ev.base);
	cr_expect_eq(back->sequence, 42);
	cr_expect_eq(back->time_unix_ms, 1700000000000);
	cr_expect_eq(back->kind, ev.kind);
	cr_expect_eq(back->epoch, ev.epoch);
	cr_expect_str_eq(back->model, "qwen");
	cr_expect_eq(back->bytes_done, 1ull << 33);
	cr_expect_eq(back->bytes_total, 1ull << 34);
	cr_expect_str_eq(back->message, "reading");
	weightfloor__v1__event__free_unpacked(back, NULL);
}
