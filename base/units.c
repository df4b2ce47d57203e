#include "base/units.h"

#include "base/error.h"

#include <ctype.h>
#include <math.h>
#include <stdlib.h>
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
	case 'K': shift = 10; s++; break;
	case 'M': shift = 20; s++; break;
	case 'G': shift = 30; s++; break;
	case 'T': shift = 40; s++; break;
	case 'P': shift = 50; s++; break;
	default: break;
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
