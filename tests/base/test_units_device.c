/* A device spec's sizes go through the project's size parser: "host:mem=8G" is 8 GiB, as 8G is
 * to every flag and config field (it once meant 8x10^9 bytes here). Checked through
 * wf_device_open(), the API that parses --device. */
#include "base/error.h"
#include "device/device.h"

#include <criterion/criterion.h>
#include <stdint.h>

static size_t arena_of(const char *spec)
{
	struct wf_device *dev = NULL;
	size_t free_b = 0, total = 0;
	cr_assert_eq(wf_device_open(spec, &dev, NULL), 0, "open %s", spec);
	cr_assert_eq(wf_device_mem_info(dev, &free_b, &total, NULL), 0);
	wf_device_close(dev);
	return total;
}

Test(units_device, host_mem_8G_is_8_GiB)
{
	cr_assert_eq(arena_of("host:mem=8G"), 8ull << 30);
	cr_assert_eq(arena_of("host:mem=8Gi"), 8ull << 30);
	cr_assert_eq(arena_of("host:mem=8GB"), 8ull << 30);
	cr_assert_eq(arena_of("host:mem=1.5G,bw=12G"), 3ull << 29);
	cr_assert_eq(arena_of("host:mem=64M,chunk=4K"), 64ull << 20);
}

Test(units_device, bad_sizes_are_refused)
{
	static const char *bad[] = {"host:mem=8X", "host:mem=1e9", "host:mem=-1",
	                            "host:mem=",   "host:bw=12Q",  "host:mem=0"};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		struct wf_device *dev = NULL;
		cr_assert_eq(wf_device_open(bad[i], &dev, NULL), WF_EINVAL, "%s", bad[i]);
		cr_assert_null(dev);
	}
}
