/* The CPU reference the CUDA matmul tests compare with: weight matrices of random valid blocks
 * (tests/kernels/kgen.h), rows dequantized by the reference kernel level, and a
 * double-precision matmul over them. Shared by test_cuda_dequant.c (host) and
 * test_cuda_matmul.c (GPU). */
#ifndef WF_TESTS_CUDA_MMREF_H
#define WF_TESTS_CUDA_MMREF_H

#include "model/dtype.h"

#include <stddef.h>
#include <stdint.h>

/* The weight types the CUDA kernels take (= the CPU engine's). */
#define MMREF_N_TYPES 8
extern const enum wf_dtype mmref_types[MMREF_N_TYPES];

const char *mmref_name(enum wf_dtype t);
/* Elements per block (1 for plain types). */
int64_t mmref_block(enum wf_dtype t);
/* ne1 rows of ne0 elements of random valid blocks, row_size bytes apart (the minimum); free(). */
void *mmref_matrix(enum wf_dtype t, int64_t ne0, int64_t ne1, size_t *ret_row_size);
/* out[i * ne0 + k]: the reference dequantize_row of every row. */
void mmref_dequant(enum wf_dtype t, const void *w, size_t row_size, int64_t ne0, int64_t ne1,
                   float *out);
/* ref[j * ne1 + i] = sum_k wd[i * ne0 + k] * x[j * xs + k], in double. */
void mmref_matmul(const float *wd, int64_t ne0, int64_t ne1, const float *x, size_t xs, uint32_t n,
                  double *ref);
/* y[j * ys + i] against ref: NMSE over all outputs and the largest |error| over the outputs'
 * rms. */
void mmref_error(const float *y, size_t ys, const double *ref, int64_t ne1, uint32_t n,
                 double *ret_nmse, double *ret_max_rel);
/* n * stride floats, uniform in [-1, 1). */
float *mmref_acts(uint32_t n, size_t stride);

#endif
