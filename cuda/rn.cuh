/* Float arithmetic rounded as written, on the device and on the host alike: nvcc would otherwise
 * contract a * b + c into an FMA, which the CPU code these kernels imitate (no FMA in those
 * expressions) does not, and the host twins of the kernels (the unit tests' only check without
 * a GPU) would then not be the kernels' arithmetic. */
#ifndef WF_CUDA_RN_CUH
#define WF_CUDA_RN_CUH

static __host__ __device__ __forceinline__ float mul_rn(float a, float b)
{
#ifdef __CUDA_ARCH__
	return __fmul_rn(a, b);
#else
	return a * b;
#endif
}

static __host__ __device__ __forceinline__ float add_rn(float a, float b)
{
#ifdef __CUDA_ARCH__
	return __fadd_rn(a, b);
#else
	return a + b;
#endif
}

static __host__ __device__ __forceinline__ float sub_rn(float a, float b)
{
#ifdef __CUDA_ARCH__
	return __fsub_rn(a, b);
#else
	return a - b;
#endif
}

#endif
