/* The device checksum: one definition for the host function, the host backend and the CUDA
 * kernel, so a test can prove that the bytes on a device equal the bytes of a file.
 *
 * Definition, for a buffer of n bytes:
 *   word i (0 <= i < ceil(n/8)) is bytes [8i, 8i+8) read little-endian, the last word
 *   zero-padded;
 *   acc = sum over i of wf_device_checksum_mix(word_i, i), modulo 2^64;
 *   checksum = wf_device_checksum_final(acc, n).
 * The sum is order-independent, so a GPU reduces it in any order and gets the same value; the
 * word index inside the mix makes it position-dependent (swapping two words changes it) and
 * the length in the final step tells "ab" from "ab\0". Not cryptographic: it catches
 * corruption, truncation and misplacement, not an adversary.
 *
 * C11 and CUDA: nvcc compiles the same inline functions for the device. */
#ifndef WF_DEVICE_CHECKSUM_H
#define WF_DEVICE_CHECKSUM_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifdef __CUDACC__
#define WF_DEVICE_HD __host__ __device__
#else
#define WF_DEVICE_HD
#endif

#define WF_DEVICE_CHECKSUM_K1 0x9E3779B97F4A7C15ull
#define WF_DEVICE_CHECKSUM_K2 0xD6E8FEB86659FD93ull

/* MurmurHash3's 64-bit finaliser: a bijection that spreads every input bit. */
static inline WF_DEVICE_HD uint64_t wf_device_checksum_fmix(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xFF51AFD7ED558CCDull;
	x ^= x >> 33;
	x *= 0xC4CEB9FE1A85EC53ull;
	x ^= x >> 33;
	return x;
}

static inline WF_DEVICE_HD uint64_t wf_device_checksum_mix(uint64_t word, uint64_t index)
{
	return wf_device_checksum_fmix(word ^
	                               (index * WF_DEVICE_CHECKSUM_K1 + WF_DEVICE_CHECKSUM_K2));
}

static inline WF_DEVICE_HD uint64_t wf_device_checksum_final(uint64_t acc, uint64_t size)
{
	return wf_device_checksum_fmix(acc ^ wf_device_checksum_fmix(size ^ WF_DEVICE_CHECKSUM_K1));
}

#ifdef __cplusplus
}
#endif
#endif
