#include "device/checksum.h"

#include "device/device.h"

#include <string.h>

/* Words are read little-endian by memcpy; a big-endian host would need a byte swap here. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "little-endian hosts only");

uint64_t wf_device_checksum_host(const void *ptr, size_t size)
{
	const unsigned char *p = ptr;
	size_t words = size / 8;
	uint64_t acc = 0;

	for (size_t i = 0; i < words; i++) {
		uint64_t w;
		/* memcpy: any alignment; the project targets little-endian hosts only (x86-64,
		 * aarch64), matching the GPU's byte order. */
		memcpy(&w, p + 8 * i, 8);
		acc += wf_device_checksum_mix(w, i);
	}
	if (size % 8) {
		uint64_t w = 0;
		memcpy(&w, p + 8 * words, size % 8);
		acc += wf_device_checksum_mix(w, words);
	}
	return wf_device_checksum_final(acc, size);
}
