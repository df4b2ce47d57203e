/* Parsing of human sizes ("64G", "1.5GiB", "4096") shared by every flag and config field. */
#ifndef WF_BASE_UNITS_H
#define WF_BASE_UNITS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Parses a byte size: digits with an optional fraction and an optional binary suffix
 * K/M/G/T/P (also KB, KiB, ... all powers of 1024; 'B' alone allowed). Rejects empty input,
 * negative numbers, trailing garbage and values above 2^63. Returns 0 and *ret_bytes, or
 * WF_EINVAL / WF_EOVERFLOW. */
int wf_parse_size(const char *s, uint64_t *ret_bytes);

#ifdef __cplusplus
}
#endif
#endif
