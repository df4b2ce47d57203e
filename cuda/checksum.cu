/* Device checksum: each thread sums the mixes of a grid-stride set of 8-byte words, the block
 * reduces with warp shuffles, one atomicAdd per block. The sum is modulo 2^64 and so
 * independent of the order the GPU adds in: the result equals wf_device_checksum_host(). */
#include "cuda/checksum.cuh"

#include "device/checksum.h"

#define CHECKSUM_THREADS 256

static __device__ __forceinline__ uint64_t load_word(const unsigned char *p, uint64_t size,
                                                     uint64_t i, bool aligned)
{
	uint64_t base = 8 * i;
	if (aligned && base + 8 <= size)
		return __ldg(reinterpret_cast<const unsigned long long *>(p) + i);
	/* Unaligned start or the zero-padded last word: assemble little-endian bytes. */
	uint64_t w = 0;
	uint64_t n = size - base < 8 ? size - base : 8;
	for (uint64_t k = 0; k < n; k++)
		w |= (uint64_t)p[base + k] << (8 * k);
	return w;
}

static __global__ void __launch_bounds__(CHECKSUM_THREADS)
    checksum_kernel(const unsigned char *p, uint64_t size, unsigned long long *acc_out)
{
	__shared__ unsigned long long warp_sums[CHECKSUM_THREADS / 32];
	const uint64_t words = (size + 7) / 8;
	const bool aligned = (reinterpret_cast<uintptr_t>(p) & 7) == 0;
	uint64_t acc = 0;

	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < words;
	     i += (uint64_t)gridDim.x * blockDim.x)
		acc += wf_device_checksum_mix(load_word(p, size, i, aligned), i);

	for (int off = 16; off > 0; off >>= 1)
		acc += __shfl_down_sync(0xffffffffu, acc, off);
	const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	if (lane == 0)
		warp_sums[warp] = acc;
	__syncthreads();
	if (warp == 0) {
		acc = lane < CHECKSUM_THREADS / 32 ? warp_sums[lane] : 0;
		for (int off = 16; off > 0; off >>= 1)
			acc += __shfl_down_sync(0xffffffffu, acc, off);
		if (lane == 0)
			atomicAdd(acc_out, (unsigned long long)acc);
	}
}

extern "C" cudaError_t wf__cuda_checksum_launch(const void *ptr, size_t size,
                                                unsigned long long *d_acc, int sm_count,
                                                cudaStream_t stream)
{
	uint64_t words = ((uint64_t)size + 7) / 8;
	uint64_t blocks = (words + CHECKSUM_THREADS - 1) / CHECKSUM_THREADS;
	/* Enough blocks to fill the GPU a few times over; more only adds atomics. */
	uint64_t cap = (uint64_t)(sm_count > 0 ? sm_count : 1) * 8;

	if (blocks > cap)
		blocks = cap;
	if (blocks == 0)
		blocks = 1;
	checksum_kernel<<<(unsigned)blocks, CHECKSUM_THREADS, 0, stream>>>(
	    static_cast<const unsigned char *>(ptr), (uint64_t)size, d_acc);
	return cudaGetLastError();
}
