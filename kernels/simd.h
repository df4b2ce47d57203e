/* Internal to libwfkernels: the SIMD levels' table fillers (kernels/x86_avx2.c, x86_avx512.c).
 *
 * Each x86 file is compiled with its own target flags (kernels/CMakeLists.txt), so nothing in it
 * may run before table.c has checked that the CPU and the OS support the level: a filler replaces
 * the entries its level speeds up (vec_dot, gemm, activation quantizers, the float numerics) in a
 * table that already holds the reference, and leaves the rest (dequantize_row) as they are. */
#ifndef WF_KERNELS_SIMD_H
#define WF_KERNELS_SIMD_H

#include "kernels/kernels.h"

void wf__kernels_avx2_fill(struct wf_kernel_ops *ops);
void wf__kernels_avx512_fill(struct wf_kernel_ops *ops);

#endif
