/* Test inputs for the kernel suites (test_ref.c, test_simd.c): a seeded splitmix64 generator and
 * random weight rows of every type the kernels run, with scales of the magnitude real models
 * have. One generator state per test process (Criterion forks per test). */
#ifndef WF_TESTS_KERNELS_KGEN_H
#define WF_TESTS_KERNELS_KGEN_H

#include "model/dtype.h"

#include <stddef.h>
#include <stdint.h>

void kgen_seed(uint64_t s);
uint64_t kgen_u64(void);
float kgen_uniform(float lo, float hi);
void kgen_bytes(void *p, size_t n);
/* F16 bits of f (round to nearest even). */
uint16_t kgen_h(float f);
/* Bytes of a row of n elements of type t (asserts n fits its blocks). */
size_t kgen_row_bytes(enum wf_dtype t, int64_t n);
/* A random weight row: random bits, then F16 scales set to finite values of a real model's
 * magnitude (Q8_0 keeps -128 among its values, which a weight may hold). */
void kgen_weights(enum wf_dtype t, void *w, int64_t n);

#endif
