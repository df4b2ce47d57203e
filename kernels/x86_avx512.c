/* The AVX-512 level: F/BW/VL + VNNI on top of the AVX2 set (compiled with those target flags
 * only; see x86_impl.h). */
#define WF_X86_AVX512 1
#define WF_X86_FILL   wf__kernels_avx512_fill
#include "kernels/x86_impl.h"
