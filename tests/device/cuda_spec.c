/* The CUDA backend's spec options (cuda:N[,fail=N,bw=RATE,sticky=N]) refused before any GPU is
 * touched: a bad spec says why, the same with or without a GPU. Runs everywhere (label unit);
 * the options' behaviour is in the contract (contract.c, test_cuda_contract on a GPU). */
#include "base/error.h"
#include "cuda/device_cuda.h"
#include "device/device.h"

#include <criterion/criterion.h>

Test(cuda_spec, bad_specs_are_refused_with_a_reason)
{
	static const char *bad[] = {"cuda:x",      "cuda:0,",        "cuda:,fail=1",
	                            "cuda:0,fail", "cuda:0,fail=x",  "cuda:0,nope=1",
	                            "cuda:0,=3",   "cuda:-1",        "cuda:0,bw=1Q",
	                            "cuda:1,2",    "cuda:sticky=-1", "cuda:0,sticky=3,"};
	cr_assert_eq(wf_device_backend_register(wf_cuda_device_ops()), 0);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct wf_device *dev = (struct wf_device *)0x1;
		struct wf_diag d = {0};
		cr_expect_eq(wf_device_open(bad[i], &dev, &d), WF_EINVAL, "%s: %s", bad[i], d.msg);
		cr_expect_str_not_empty(d.msg, "%s", bad[i]);
		cr_expect_eq(dev, (struct wf_device *)0x1, "%s: ret_dev written", bad[i]);
	}
}
