/* The CPU kernel tables (one per level) and the choice among them. */
#include "kernels/kernels.h"

#include "base/error.h"
#include "kernels/cpu_ops.h"
#include "kernels/ref.h"
#include "kernels/simd.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define TYPE(dt, deq, dot, act)                                                                    \
	[WF_DTYPE_##dt] = {wf_kernels_ref_dequantize_row_##deq, wf_kernels_ref_vec_dot_##dot,      \
	                   WF_DTYPE_##act, wf_kernels_ref_gemm_##dot}

/* The pairing of weight and activation types is ggml's type_traits_cpu vec_dot_type at b10573. */
static const struct wf_kernel_ops ref_ops = {
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
    .softmax = wf_cpu_softmax,
    .swiglu = wf_cpu_swiglu,
    .rope = wf__cpu_rope_ref,
    .attend_tiled = wf__cpu_attend_tiled_ref,
};

#undef TYPE

static const char *const level_names[WF_KERNEL_LEVEL_MAX_] = {
    [WF_KERNEL_LEVEL_REF] = "ref",
    [WF_KERNEL_LEVEL_AVX2] = "avx2",
    [WF_KERNEL_LEVEL_AVX512] = "avx512",
};

/* Built once (pthread_once) and read-only afterwards. */
static struct {
	pthread_once_t once;
	struct wf_kernel_ops ops[WF_KERNEL_LEVEL_MAX_];
	bool have[WF_KERNEL_LEVEL_MAX_];
	int choice_err; /* 0, or why WF_KERNELS was refused */
	enum wf_kernel_level choice;
} cpu = {.once = PTHREAD_ONCE_INIT};

#if defined(WF_KERNELS_X86)
#include <cpuid.h>

/* __builtin_cpu_supports also checks that the OS saves the AVX / AVX-512 register state. F16C
 * comes from CPUID itself: clang's __builtin_cpu_supports does not know it. */
static bool cpu_has_avx2(void)
{
	unsigned int eax, ebx, ecx, edx;

	__builtin_cpu_init();
	if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || !(ecx & bit_F16C))
		return false;
	return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

static bool cpu_has_avx512(void)
{
	return cpu_has_avx2() && __builtin_cpu_supports("avx512f") &&
	       __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
	       __builtin_cpu_supports("avx512vnni");
}
#endif

static void cpu_build(void)
{
	const char *want = getenv("WF_KERNELS");

	cpu.ops[WF_KERNEL_LEVEL_REF] = ref_ops;
	cpu.have[WF_KERNEL_LEVEL_REF] = true;
#if defined(WF_KERNELS_X86)
	if (cpu_has_avx2()) {
		cpu.ops[WF_KERNEL_LEVEL_AVX2] = ref_ops;
		wf__kernels_avx2_fill(&cpu.ops[WF_KERNEL_LEVEL_AVX2]);
		cpu.have[WF_KERNEL_LEVEL_AVX2] = true;
	}
	if (cpu_has_avx512()) {
		cpu.ops[WF_KERNEL_LEVEL_AVX512] = ref_ops;
		wf__kernels_avx512_fill(&cpu.ops[WF_KERNEL_LEVEL_AVX512]);
		cpu.have[WF_KERNEL_LEVEL_AVX512] = true;
	}
#endif
	cpu.choice = WF_KERNEL_LEVEL_REF;
	for (int l = 0; l < WF_KERNEL_LEVEL_MAX_; l++)
		if (cpu.have[l])
			cpu.choice = (enum wf_kernel_level)l;
	if (want && want[0]) {
		int l = 0;

		while (l < WF_KERNEL_LEVEL_MAX_ && strcmp(want, level_names[l]) != 0)
			l++;
		if (l == WF_KERNEL_LEVEL_MAX_)
			cpu.choice_err = WF_EINVAL;
		else if (!cpu.have[l])
			cpu.choice_err = WF_EUNSUPPORTED;
		else
			cpu.choice = (enum wf_kernel_level)l;
	}
}

static void cpu_init(void)
{
	pthread_once(&cpu.once, cpu_build);
}

const char *wf_kernel_level_name(enum wf_kernel_level level)
{
	return (unsigned)level < WF_KERNEL_LEVEL_MAX_ ? level_names[level] : NULL;
}

const struct wf_kernel_ops *wf_kernels_cpu_ops_level(enum wf_kernel_level level)
{
	if ((unsigned)level >= WF_KERNEL_LEVEL_MAX_)
		return NULL;
	cpu_init();
	return cpu.have[level] ? &cpu.ops[level] : NULL;
}

int wf_kernels_cpu_level(enum wf_kernel_level *ret_level)
{
	cpu_init();
	if (cpu.choice_err)
		return cpu.choice_err;
	*ret_level = cpu.choice;
	return 0;
}

const struct wf_kernel_type_ops *wf_kernel_ops_type(const struct wf_kernel_ops *ops, uint32_t dtype)
{
	if (!ops || dtype >= WF_DTYPE_GGML_COUNT_ || !ops->types[dtype].vec_dot)
		return NULL;
	return &ops->types[dtype];
}

const struct wf_kernel_ops *wf_kernels_cpu_ops(void)
{
	cpu_init();
	return cpu.choice_err ? NULL : &cpu.ops[cpu.choice];
}
