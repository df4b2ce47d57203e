/* The CPU reference for the CUDA matmul tests (mmref.h). */
#include "tests/cuda/mmref.h"

#include "kernels/kernels.h"
#include "tests/kernels/kgen.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>

const enum wf_dtype mmref_types[MMREF_N_TYPES] = {
    WF_DTYPE_F32,  WF_DTYPE_F16,  WF_DTYPE_BF16, WF_DTYPE_Q8_0,
    WF_DTYPE_Q4_0, WF_DTYPE_Q4_K, WF_DTYPE_Q5_K, WF_DTYPE_Q6_K,
};

const char *mmref_name(enum wf_dtype t)
{
	return wf_dtype_info(t)->name;
}

int64_t mmref_block(enum wf_dtype t)
{
	return wf_dtype_info(t)->block_size;
}

void *mmref_matrix(enum wf_dtype t, int64_t ne0, int64_t ne1, size_t *ret_row_size)
{
	size_t row = kgen_row_bytes(t, ne0);
	unsigned char *w = malloc(row * (size_t)ne1);

	cr_assert_not_null(w);
	for (int64_t i = 0; i < ne1; i++)
		kgen_weights(t, w + (size_t)i * row, ne0);
	*ret_row_size = row;
	return w;
}

void mmref_dequant(enum wf_dtype t, const void *w, size_t row_size, int64_t ne0, int64_t ne1,
                   float *out)
{
	const struct wf_kernel_ops *ops = wf_kernels_cpu_ops_level(WF_KERNEL_LEVEL_REF);
	const struct wf_kernel_type_ops *to = ops ? wf_kernel_ops_type(ops, t) : NULL;

	cr_assert(to && to->dequantize_row, "no reference dequantize_row for %s", mmref_name(t));
	for (int64_t i = 0; i < ne1; i++)
		to->dequantize_row((const unsigned char *)w + (size_t)i * row_size, out + i * ne0,
		                   ne0);
}

void mmref_matmul(const float *wd, int64_t ne0, int64_t ne1, const float *x, size_t xs, uint32_t n,
                  double *ref)
{
	for (uint32_t j = 0; j < n; j++) {
		for (int64_t i = 0; i < ne1; i++) {
			double s = 0.0;
			for (int64_t k = 0; k < ne0; k++)
				s +=
				    (double)wd[i * ne0 + k] * (double)x[(size_t)j * xs + (size_t)k];
			ref[(size_t)j * (size_t)ne1 + (size_t)i] = s;
		}
	}
}

void mmref_error(const float *y, size_t ys, const double *ref, int64_t ne1, uint32_t n,
                 double *ret_nmse, double *ret_max_rel)
{
	double err2 = 0.0, ref2 = 0.0, max_abs = 0.0;

	for (uint32_t j = 0; j < n; j++) {
		for (int64_t i = 0; i < ne1; i++) {
			double r = ref[(size_t)j * (size_t)ne1 + (size_t)i];
			double e = (double)y[(size_t)j * ys + (size_t)i] - r;
			if (isnan(e))
				e = INFINITY;
			err2 += e * e;
			ref2 += r * r;
			if (fabs(e) > max_abs)
				max_abs = fabs(e);
		}
	}
	double rms = sqrt(ref2 / ((double)n * (double)ne1));
	*ret_nmse = ref2 > 0 ? err2 / ref2 : err2;
	*ret_max_rel = rms > 0 ? max_abs / rms : max_abs;
}

float *mmref_acts(uint32_t n, size_t stride)
{
	float *x = malloc((size_t)n * stride * sizeof(float));

	cr_assert_not_null(x);
	for (size_t i = 0; i < (size_t)n * stride; i++)
		x[i] = kgen_uniform(-1.0f, 1.0f);
	return x;
}
