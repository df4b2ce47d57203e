/* The device checksum kernel (the definition is in device/checksum.h), one of the CUDA kernels
 * that cuda/ holds beside the device interface's CUDA backend (device_cuda.c). Included by C
 * code in cuda/ and by checksum.cu. */
#ifndef WF_CUDA_CHECKSUM_CUH
#define WF_CUDA_CHECKSUM_CUH

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Queues on stream the addition of the sum of wf_device_checksum_mix() over the words of
 * [ptr, ptr+size) into *d_acc (device memory, 8-byte aligned; the caller zeroes it first). The
 * caller applies wf_device_checksum_final(acc, size). ptr may have any alignment. Returns the
 * launch's error (cudaSuccess when queued). */
cudaError_t wf__cuda_checksum_launch(const void *ptr, size_t size, unsigned long long *d_acc,
                                     int sm_count, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
