/* The CPU kernel table and its registration with the device layer. */
#include "kernels/kernels.h"

#include "device/device.h"
#include "kernels/ref.h"

#define TYPE(dt, deq, dot, act) \
	[WF_DTYPE_##dt] = {wf_kernels_ref_dequantize_row_##deq, wf_kernels_ref_vec_dot_##dot, \
	                   WF_DTYPE_##act}

/* The pairing of weight and activation types is ggml's type_traits_cpu vec_dot_type at b10573. */
static const struct wf_kernel_ops cpu_ops = {
    .types =
        {
            TYPE(F32, f32, f32_f32, F32),
            TYPE(F16, f16, f16_f16, F16),
            TYPE(BF16, bf16, bf16_bf16, BF16),
            TYPE(Q8_0, q8_0, q8_0_q8_0, Q8_0),
            TYPE(Q4_0, q4_0, q4_0_q8_0, Q8_0),
            TYPE(Q4_K, q4_K, q4_K_q8_K, Q8_K),
            TYPE(Q5_K, q5_K, q5_K_q8_K, Q8_K),
            TYPE(Q6_K, q6_K, q6_K_q8_K, Q8_K),
        },
    .from_float =
        {
            [WF_DTYPE_F32] = wf_kernels_ref_quantize_row_f32,
            [WF_DTYPE_F16] = wf_kernels_ref_quantize_row_f16,
            [WF_DTYPE_BF16] = wf_kernels_ref_quantize_row_bf16,
            [WF_DTYPE_Q8_0] = wf_kernels_ref_quantize_row_q8_0,
            [WF_DTYPE_Q8_K] = wf_kernels_ref_quantize_row_q8_K,
        },
};

#undef TYPE

static const struct wf_device_kernel_table cpu_table = {
    .kind = WF_DEVICE_KIND_HOST,
    .name = "cpu",
    .version = WF_KERNEL_OPS_VERSION,
    .ops = &cpu_ops,
};

const struct wf_kernel_type_ops *wf_kernel_ops_type(const struct wf_kernel_ops *ops,
                                                    uint32_t dtype)
{
	if (!ops || dtype >= WF_DTYPE_GGML_COUNT_ || !ops->types[dtype].vec_dot)
		return NULL;
	return &ops->types[dtype];
}

const struct wf_kernel_ops *wf_kernels_cpu_ops(void)
{
	return &cpu_ops;
}

int wf_kernels_cpu_register(void)
{
	return wf_device_kernels_register(&cpu_table);
}
