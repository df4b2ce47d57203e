/* Parsing of human sizes ("64G", "1.5GiB", "4096") shared by every flag and config field. */
#ifndef WF_BASE_UNITS_H
#define WF_BASE_UNITS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The project's one size parser: every size in a flag, a config file or a device spec
 * ("host:mem=8G,bw=12G") goes through it, so a size means the same everywhere.
 *
 * Syntax: digits, an optional fraction, optional blanks, an optional suffix. K, M, G, T, P are
 * powers of 1024, and so are Ki/Mi/Gi/Ti/Pi and KB/MB/GB/TB/PB/KiB/... (case-insensitive; a
 * lone B means bytes). There are no decimal (power-of-1000) sizes: "8GB" is 8 GiB, not 8e9
 * bytes, because a second meaning for the same letters is how 8G once meant 8 GiB to --arena and
 * 8x10^9 bytes to --device host:mem=8G. Fractions round to the nearest byte ("1.5K" = 1536).
 *
 * Rejects NULL, empty input, signs, a leading or trailing dot, trailing garbage (WF_EINVAL) and
 * values above 2^63 (WF_EOVERFLOW). Returns 0 and writes *ret_bytes only on success.
 * Thread-safe, no allocation. */
int wf_parse_size(const char *s, uint64_t *ret_bytes);

#ifdef __cplusplus
}
#endif
#endif
