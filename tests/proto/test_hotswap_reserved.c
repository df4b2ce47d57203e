/* One hot-swap design: changed tensors are published as generations inside the floor region
 * (shm/layout.h). The other design, "a model name now points at other weights" (EventKind 4
 * HOTSWAP with Event.digest_hex 14), was removed; its numbers stay reserved so that no later
 * field takes them with another meaning (docs/PROTOCOL.md, versioning rule 1). */
#include "weightfloor.pb-c.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

Test(proto_hotswap, digest_design_is_gone)
{
	cr_assert_null(
	    protobuf_c_enum_descriptor_get_value(&weightfloor__v1__event_kind__descriptor, 4),
	    "EventKind 4 (HOTSWAP) is reserved, not defined");
	cr_assert_null(protobuf_c_enum_descriptor_get_value_by_name(
	    &weightfloor__v1__event_kind__descriptor, "EVENT_KIND_HOTSWAP"));
	cr_assert_null(
	    protobuf_c_message_descriptor_get_field(&weightfloor__v1__event__descriptor, 14),
	    "Event field 14 (digest_hex) is reserved, not defined");
	cr_assert_null(protobuf_c_message_descriptor_get_field_by_name(
	    &weightfloor__v1__event__descriptor, "digest_hex"));
	/* The kinds around the gap keep their numbers. */
	cr_assert_eq(WEIGHTFLOOR__V1__EVENT_KIND__EVENT_KIND_RESIDENCY, 3);
	cr_assert_eq(WEIGHTFLOOR__V1__EVENT_KIND__EVENT_KIND_ERROR, 5);
	/* The generation design's event took new numbers, not the old ones. */
	cr_assert_eq(WEIGHTFLOOR__V1__EVENT_KIND__EVENT_KIND_PUBLISHED, 8);
	cr_assert_eq(protobuf_c_message_descriptor_get_field_by_name(
	                 &weightfloor__v1__event__descriptor, "digest")
	                 ->id,
	             15);
}

/* The numbers are reserved in the .proto itself, where protoc enforces them. */
Test(proto_hotswap, numbers_are_reserved_in_the_proto)
{
	char path[4096];
	const char *src = getenv("WF_SOURCE_DIR");
	snprintf(path, sizeof path, "%s/proto/weightfloor.proto", src ? src : ".");
	FILE *f = fopen(path, "r");
	cr_assert(f, "cannot open %s", path);
	static char text[1 << 18];
	size_t n = fread(text, 1, sizeof text - 1, f);
	text[n] = '\0';
	fclose(f);
	cr_assert(strstr(text, "reserved 4;"), "EventKind: reserved 4");
	cr_assert(strstr(text, "reserved \"EVENT_KIND_HOTSWAP\";"));
	cr_assert(strstr(text, "reserved 14;"), "Event: reserved 14");
	cr_assert(strstr(text, "reserved \"digest_hex\";"));
}
