#include "device/ranges.h"

#include "base/error.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* Index of the first member with base > p (so the candidate containing p is the one before). */
static size_t upper(const struct wf__device_ranges *rs, uintptr_t p)
{
	size_t lo = 0, hi = rs->n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (rs->v[mid].base <= p)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* [p, p+size) with the end clamped, so a range ending at the top of the address space is fine. */
static uintptr_t end_of(uintptr_t p, size_t size)
{
	return size > UINTPTR_MAX - p ? UINTPTR_MAX : p + size;
}

int wf__device_ranges_touches(const struct wf__device_ranges *rs, uintptr_t p, size_t size)
{
	uintptr_t end = end_of(p, size ? size : 1);
	size_t i = upper(rs, p);
	if (i > 0 && end_of(rs->v[i - 1].base, rs->v[i - 1].size) > p)
		return 1;
	return i < rs->n && rs->v[i].base < end;
}

int wf__device_ranges_contains(const struct wf__device_ranges *rs, uintptr_t p, size_t size)
{
	size_t i = upper(rs, p);
	if (i == 0)
		return 0;
	const struct wf__device_range *r = &rs->v[i - 1];
	uintptr_t rend = end_of(r->base, r->size);
	if (p >= rend)
		return 0;
	return size <= rend - p;
}

int wf__device_ranges_add(struct wf__device_ranges *rs, uintptr_t base, size_t size)
{
	if (size == 0)
		return WF_EINVAL;
	if (wf__device_ranges_touches(rs, base, size))
		return WF_EOVERLAP;
	if (rs->n == rs->cap) {
		size_t cap = rs->cap ? rs->cap * 2 : 16;
		struct wf__device_range *v = realloc(rs->v, cap * sizeof(*v));
		if (!v)
			return -ENOMEM;
		rs->v = v;
		rs->cap = cap;
	}
	size_t i = upper(rs, base);
	memmove(&rs->v[i + 1], &rs->v[i], (rs->n - i) * sizeof(rs->v[0]));
	rs->v[i] = (struct wf__device_range){.base = base, .size = size};
	rs->n++;
	return 0;
}

int wf__device_ranges_remove(struct wf__device_ranges *rs, uintptr_t base, size_t *ret_size)
{
	size_t i = upper(rs, base);
	if (i == 0 || rs->v[i - 1].base != base)
		return WF_EINVAL;
	i--;
	size_t size = rs->v[i].size;
	memmove(&rs->v[i], &rs->v[i + 1], (rs->n - i - 1) * sizeof(rs->v[0]));
	rs->n--;
	if (ret_size)
		*ret_size = size;
	return 0;
}

void wf__device_ranges_fini(struct wf__device_ranges *rs)
{
	free(rs->v);
	*rs = (struct wf__device_ranges){0};
}
