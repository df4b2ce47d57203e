/* Parsing of human sizes ("64G", "1.5GiB", "4096") shared by every flag and config field. */
#ifndef WF_BASE_UNITS_H
#define WF_BASE_UNITS_H

#include <stddef.h>
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

/* The project's one whole-number parser, for counts in flags, variables and config values:
 * decimal digits only (no sign, no blanks, no suffix, not empty), at most max. Returns 0 and
 * writes *ret_value only on success; WF_EINVAL for anything else, WF_EOVERFLOW above max.
 * Thread-safe, no allocation. */
int wf_parse_uint(const char *s, uint64_t max, uint64_t *ret_value);

/* Token ids written "1,17,300": whole numbers as wf_parse_uint takes them, each at most
 * INT32_MAX, separated by single commas, at least one and at most max_n. Returns 0 with
 * *ret_ids (malloc'ed, the caller frees) and *ret_n; WF_EINVAL for anything else (diag-free: the
 * caller says which flag), WF_ELIMIT past max_n, -ENOMEM. */
int wf_parse_ids(const char *s, size_t max_n, int32_t **ret_ids, size_t *ret_n);

#ifdef __cplusplus
}
#endif
#endif
