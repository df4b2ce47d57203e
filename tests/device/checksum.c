/* The checksum definition (device/checksum.h), pinned by values computed with an independent
 * Python implementation of the same spec, so a change to the host function, the shared mix or
 * the CUDA kernel cannot go unnoticed. */
#include "device/device.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

Test(device_checksum, known_values)
{
	unsigned char ramp[4096];
	for (size_t i = 0; i < sizeof(ramp); i++)
		ramp[i] = (unsigned char)i;
	unsigned char *zeros = calloc(1, 1 << 20);
	cr_assert(zeros);

	cr_assert_eq(wf_device_checksum_host(NULL, 0), 0x6393d51c06c618dcull);
	cr_assert_eq(wf_device_checksum_host("weightfloor", 11), 0x0b4b097c44d27930ull);
	cr_assert_eq(wf_device_checksum_host("weightfloor", 12), 0x7d2a460a41c44f67ull);
	cr_assert_eq(wf_device_checksum_host(ramp, sizeof(ramp)), 0x107bf6407c9ee39dull);
	cr_assert_eq(wf_device_checksum_host(zeros, 1 << 20), 0x480b9e674b1c3e3bull);
	free(zeros);
}

Test(device_checksum, position_and_length_matter)
{
	unsigned char a[64], b[64];
	for (int i = 0; i < 64; i++)
		a[i] = (unsigned char)(i * 7 + 1);
	memcpy(b, a, 64);
	/* Swap two 8-byte words: same multiset of words, different positions. */
	memcpy(b, a + 8, 8);
	memcpy(b + 8, a, 8);
	cr_assert_neq(wf_device_checksum_host(a, 64), wf_device_checksum_host(b, 64));
	/* A trailing zero byte changes the length and so the sum. */
	cr_assert_neq(wf_device_checksum_host(a, 60), wf_device_checksum_host(a, 59));
	/* One flipped bit anywhere. */
	memcpy(b, a, 64);
	b[37] ^= 0x10;
	cr_assert_neq(wf_device_checksum_host(a, 64), wf_device_checksum_host(b, 64));
}

Test(device_checksum, alignment_does_not_matter)
{
	unsigned char buf[1000 + 8];
	for (int i = 0; i < 1000; i++)
		buf[i] = (unsigned char)(i ^ (i >> 3));
	uint64_t ref = wf_device_checksum_host(buf, 1000);
	for (int off = 1; off < 8; off++) {
		memmove(buf + off, buf + off - 1, 1000);
		cr_assert_eq(wf_device_checksum_host(buf + off, 1000), ref, "offset %d", off);
	}
}
