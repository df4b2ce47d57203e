/* A set of disjoint address ranges, kept sorted: the front end's record of the device
 * allocations, pinned buffers and registrations it handed out. Lookups are binary searches, so
 * checking both sides of every copy stays cheap with thousands of tensors. Not thread-safe: the
 * owner locks. Internal to libwfdevice. */
#ifndef WF_DEVICE_RANGES_H
#define WF_DEVICE_RANGES_H

#include <stddef.h>
#include <stdint.h>

struct wf__device_range {
	uintptr_t base;
	size_t size;
};

struct wf__device_ranges {
	struct wf__device_range *v;
	size_t n, cap;
};

/* Adds [base, base+size). WF_EOVERLAP if it overlaps a member, -ENOMEM. */
int wf__device_ranges_add(struct wf__device_ranges *rs, uintptr_t base, size_t size);
/* Removes the range starting exactly at base; writes its size to *ret_size (optional).
 * WF_EINVAL when there is none. */
int wf__device_ranges_remove(struct wf__device_ranges *rs, uintptr_t base, size_t *ret_size);
/* 1 when [p, p+size) lies inside one member, else 0. size 0 asks whether p itself does. */
int wf__device_ranges_contains(const struct wf__device_ranges *rs, uintptr_t p, size_t size);
/* 1 when [p, p+size) touches any member. */
int wf__device_ranges_touches(const struct wf__device_ranges *rs, uintptr_t p, size_t size);
/* Frees the storage; the set is empty afterwards. */
void wf__device_ranges_fini(struct wf__device_ranges *rs);

#endif
