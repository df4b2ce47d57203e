/* The CUDA backend where there may be no GPU (label unit, runs everywhere CUDA is compiled in):
 * the probe reports a count and never fails, "cuda:0" fails cleanly with the CUDA error in words
 * when there is no device, and "auto" falls back to host and says why. Each Criterion test is its
 * own forked process, so CUDA is initialised only in children. */
#include "base/error.h"
#include "cuda/device_cuda.h"
#include "device/device.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <string.h>

Test(cuda_probe, count_is_never_an_error)
{
	int n = wf_cuda_device_count();
	cr_assert_geq(n, 0);
	cr_assert_eq(wf_cuda_device_ops()->probe(), n);
	cr_assert_eq(wf_cuda_device_count(), n, "stable");
}

Test(cuda_probe, open_and_auto)
{
	struct wf_device *dev = NULL;
	struct wf_diag diag = {0};
	int n = wf_cuda_device_count();

	cr_assert_eq(wf_device_open("cuda:0", &dev, &diag), WF_ENOT_FOUND, "not registered yet");
	cr_assert(strstr(diag.msg, "not registered"), "%s", diag.msg);
	cr_assert_eq(wf_device_backend_register(wf_cuda_device_ops()), 0);

	wf_diag_clear(&diag);
	int ret = wf_device_open("cuda:0", &dev, &diag);
	if (n == 0) {
		cr_assert_eq(ret, -ENODEV, "%s", wf_diag_str(&diag, ret));
		cr_assert(strstr(diag.msg, "cuda"), "%s", diag.msg);
	} else {
		cr_assert_eq(ret, 0, "%s", wf_diag_str(&diag, ret));
		wf_device_close(dev);
	}

	ret = wf_device_open("auto", &dev, &diag);
	cr_assert_eq(ret, 0, "%s", wf_diag_str(&diag, ret));
	if (n == 0) {
		cr_assert_eq(wf_device_kind(dev), WF_DEVICE_KIND_HOST);
		cr_assert_str_eq(wf_device_selection(dev),
		                 "auto: cuda probe found no device; using host");
	} else {
		cr_assert_eq(wf_device_kind(dev), WF_DEVICE_KIND_CUDA);
	}
	wf_device_close(dev);
}
