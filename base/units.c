#include "base/units.h"

#include "base/error.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

int wf_parse_size(const char *s, uint64_t *ret_bytes)
{
	if (!s)
		return WF_EINVAL;
	while (isspace((unsigned char)*s))
		s++;
	if (!isdigit((unsigned char)*s))
		return WF_EINVAL; /* no sign, no leading dot, not empty */

	/* Integer part exactly (doubles lose precision past 2^53), fraction separately. */
	uint64_t whole = 0;
	while (isdigit((unsigned char)*s)) {
		if (__builtin_mul_overflow(whole, 10, &whole) ||
		    __builtin_add_overflow(whole, (uint64_t)(*s - '0'), &whole))
			return WF_EOVERFLOW;
		s++;
	}
	double frac = 0.0, scale = 0.1;
	if (*s == '.') {
		s++;
		if (!isdigit((unsigned char)*s))
			return WF_EINVAL;
		while (isdigit((unsigned char)*s)) {
			frac += (*s - '0') * scale;
			scale /= 10.0;
			s++;
		}
	}

	while (*s == ' ')
		s++;
	unsigned shift = 0;
	switch (toupper((unsigned char)*s)) {
	case 'K':
		shift = 10;
		s++;
		break;
	case 'M':
		shift = 20;
		s++;
		break;
	case 'G':
		shift = 30;
		s++;
		break;
	case 'T':
		shift = 40;
		s++;
		break;
	case 'P':
		shift = 50;
		s++;
		break;
	default:
		break;
	}
	if (shift && (*s == 'i' || *s == 'I'))
		s++;
	if (*s == 'B' || *s == 'b')
		s++;
	while (isspace((unsigned char)*s))
		s++;
	if (*s != '\0')
		return WF_EINVAL;

	uint64_t bytes;
	if (shift && whole > (UINT64_MAX >> shift))
		return WF_EOVERFLOW;
	bytes = whole << shift;
	uint64_t extra = (uint64_t)llround(frac * (double)(1ull << shift));
	if (__builtin_add_overflow(bytes, extra, &bytes) || bytes > (1ull << 63))
		return WF_EOVERFLOW;
	*ret_bytes = bytes;
	return 0;
}

int wf_parse_uint(const char *s, uint64_t max, uint64_t *ret_value)
{
	if (!s || !*s)
		return WF_EINVAL;
	uint64_t v = 0;
	for (; *s; s++) {
		if (!isdigit((unsigned char)*s))
			return WF_EINVAL;
		if (__builtin_mul_overflow(v, 10, &v) ||
		    __builtin_add_overflow(v, (uint64_t)(*s - '0'), &v))
			return WF_EOVERFLOW;
	}
	if (v > max)
		return WF_EOVERFLOW;
	*ret_value = v;
	return 0;
}

int wf_parse_ids(const char *s, size_t max_n, int32_t **ret_ids, size_t *ret_n)
{
	if (!s || !*s)
		return WF_EINVAL;
	size_t n = 1;
	for (const char *p = s; *p; p++)
		n += *p == ',';
	if (n > max_n)
		return WF_ELIMIT;
	int32_t *ids = malloc(n * sizeof(*ids));
	if (!ids)
		return -ENOMEM;
	const char *p = s;
	for (size_t i = 0; i < n; i++) {
		const char *comma = strchr(p, ',');
		const size_t len = comma ? (size_t)(comma - p) : strlen(p);
		char one[24];
		uint64_t v;
		if (len == 0 || len >= sizeof one) {
			free(ids);
			return WF_EINVAL;
		}
		memcpy(one, p, len);
		one[len] = '\0';
		if (wf_parse_uint(one, INT32_MAX, &v) < 0) {
			free(ids);
			return WF_EINVAL;
		}
		ids[i] = (int32_t)v;
		p += len + 1;
	}
	*ret_ids = ids;
	*ret_n = n;
	return 0;
}
