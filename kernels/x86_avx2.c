/* The AVX2 + FMA + F16C level (compiled with those target flags only; see x86_impl.h). */
#define WF_X86_AVX512 0
#define WF_X86_FILL   wf__kernels_avx2_fill
#include "kernels/x86_impl.h"
