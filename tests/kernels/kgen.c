/* Test inputs for the kernel suites. */
#include "tests/kernels/kgen.h"

#include "kernels/ref.h"

#include <criterion/criterion.h>

static uint64_t rng_state;

void kgen_seed(uint64_t s)
{
	rng_state = s;
}

uint64_t kgen_u64(void)
{
	/* splitmix64 */
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

float kgen_uniform(float lo, float hi)
{
	return lo + (hi - lo) * (float)((double)(kgen_u64() >> 11) * 0x1p-53);
}

void kgen_bytes(void *p, size_t n)
{
	uint8_t *b = p;

	for (size_t i = 0; i < n; i++)
		b[i] = (uint8_t)kgen_u64();
}

uint16_t kgen_h(float f)
{
	return wf_kernels_fp32_to_fp16(f);
}

size_t kgen_row_bytes(enum wf_dtype t, int64_t n)
{
	const struct wf_dtype_info *info = wf_dtype_info(t);

	cr_assert_not_null(info);
	cr_assert_eq(n % info->block_size, 0);
	return (size_t)(n / info->block_size) * info->type_size;
}

void kgen_weights(enum wf_dtype t, void *w, int64_t n)
{
	kgen_bytes(w, kgen_row_bytes(t, n));
	switch (t) {
	case WF_DTYPE_F32:
		for (int64_t i = 0; i < n; i++)
			((float *)w)[i] = kgen_uniform(-0.1f, 0.1f);
		break;
	case WF_DTYPE_F16:
		for (int64_t i = 0; i < n; i++)
			((uint16_t *)w)[i] = kgen_h(kgen_uniform(-0.1f, 0.1f));
		break;
	case WF_DTYPE_BF16:
		for (int64_t i = 0; i < n; i++)
			((uint16_t *)w)[i] = wf_kernels_fp32_to_bf16(kgen_uniform(-0.1f, 0.1f));
		break;
	case WF_DTYPE_Q8_0:
		for (int64_t i = 0; i < n / 32; i++)
			((struct wf_block_q8_0 *)w)[i].d = kgen_h(kgen_uniform(1e-4f, 1e-3f));
		break;
	case WF_DTYPE_Q4_0:
		for (int64_t i = 0; i < n / 32; i++)
			((struct wf_block_q4_0 *)w)[i].d = kgen_h(kgen_uniform(-0.02f, 0.02f));
		break;
	case WF_DTYPE_Q4_K:
		for (int64_t i = 0; i < n / 256; i++) {
			((struct wf_block_q4_K *)w)[i].d = kgen_h(kgen_uniform(1e-4f, 1e-3f));
			((struct wf_block_q4_K *)w)[i].dmin = kgen_h(kgen_uniform(1e-4f, 1e-3f));
		}
		break;
	case WF_DTYPE_Q5_K:
		for (int64_t i = 0; i < n / 256; i++) {
			((struct wf_block_q5_K *)w)[i].d = kgen_h(kgen_uniform(1e-4f, 1e-3f));
			((struct wf_block_q5_K *)w)[i].dmin = kgen_h(kgen_uniform(1e-4f, 1e-3f));
		}
		break;
	case WF_DTYPE_Q6_K:
		for (int64_t i = 0; i < n / 256; i++)
			((struct wf_block_q6_K *)w)[i].d = kgen_h(kgen_uniform(-1e-4f, 1e-4f));
		break;
	default:
		cr_assert_fail("no generator for %d", t);
	}
}
