/* The RMS norm and RoPE of the CUDA backend (norm_rope.h; numerics of kernels/cpu_ops.c
 * wf_cpu_rms_norm, wf_cpu_rope_angles and wf_cpu_rope).
 *
 * RMS norm: one block of 256 threads per row; each thread sums its elements' float squares in
 * double (as the CPU), a warp-shuffle and shared-memory reduction in double (FP64 adds are half
 * rate on H100 and one per element: negligible against the row's load). RoPE: one block per
 * token; its angles are computed once into shared memory and every head of the token rotated
 * with them. The CPU advances the angle by repeated float multiplication with a step powf()
 * made once; the kernel does the same products with the step computed on the host by the same
 * powf, so the angles are the CPU's bit for bit and only sincosf's last ulp can differ. */
#include "cuda/backend_ctx.h"
#include "cuda/norm_rope.h"
#include "cuda/rn.cuh"

#include "base/error.h"

#include <math.h>

#define NORM_THREADS 256
#define ROPE_THREADS 256
/* n_dims floats of angles in dynamic shared memory: far below the 48 KiB default. */
#define ROPE_MAX_DIMS 8192u

/* Pair i's angle: pos times step^i, multiplied in the CPU's order. */
static __host__ __device__ __forceinline__ float rope_theta(int32_t pos, uint32_t pair,
                                                            float theta_scale)
{
	float theta = (float)pos;
	for (uint32_t j = 0; j < pair; j++)
		theta = mul_rn(theta, theta_scale);
	return theta;
}

/* The two elements pair i (its first element i0 = 2i) rotates: adjacent, or the two halves. */
static __host__ __device__ __forceinline__ void rope_pair(enum wf_backend_rope kind, uint32_t i0,
                                                          uint32_t n_dims, uint32_t *a, uint32_t *b)
{
	if (kind == WF_BACKEND_ROPE_NEOX) {
		*a = i0 / 2;
		*b = i0 / 2 + n_dims / 2;
	} else {
		*a = i0;
		*b = i0 + 1;
	}
}

static __host__ __device__ __forceinline__ void rope_rotate(float *x, uint32_t a, uint32_t b,
                                                            float c, float s)
{
	const float x0 = x[a], x1 = x[b];
	/* as the host backend (kernels/cpu_scalar.h, llama.cpp's -mfma build): x0 * c fused with
	 * the rounded x1 * s, x0 * s fused with the rounded x1 * c */
	x[a] = fmaf(x0, c, -mul_rn(x1, s));
	x[b] = fmaf(x0, s, mul_rn(x1, c));
}

/* The scale from the row's sum of squares, as the CPU: mean in float, 1 / sqrtf(mean + eps). */
static __host__ __device__ __forceinline__ float norm_scale(double sum, uint32_t len, float eps)
{
	const float mean = (float)(sum / len);
	return 1.0f / sqrtf(add_rn(mean, eps));
}

static __global__ void __launch_bounds__(NORM_THREADS)
    rms_norm_kernel(const float *x, const float *w, float *y, uint32_t len, size_t stride,
                    float eps)
{
	__shared__ double warp_part[NORM_THREADS / 32];
	__shared__ float scale_all;
	/* y may alias x: every thread reads its elements for the sum, the block synchronizes, and
	 * each element is then read again and written by the one thread that owns it. */
	const float *xr = x + (size_t)blockIdx.x * stride;
	float *yr = y + (size_t)blockIdx.x * stride;
	const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

	double s = 0.0;
	for (uint32_t i = threadIdx.x; i < len; i += NORM_THREADS)
		s += (double)mul_rn(xr[i], xr[i]);
	for (int off = 16; off > 0; off >>= 1)
		s += __shfl_xor_sync(0xffffffffu, s, off);
	if (lane == 0)
		warp_part[warp] = s;
	__syncthreads();
	if (threadIdx.x == 0) {
		double t = 0.0;
		for (unsigned i = 0; i < NORM_THREADS / 32; i++)
			t += warp_part[i];
		scale_all = norm_scale(t, len, eps);
	}
	__syncthreads();
	const float scale = scale_all;
	for (uint32_t i = threadIdx.x; i < len; i += NORM_THREADS)
		yr[i] = w ? mul_rn(mul_rn(xr[i], scale), w[i]) : mul_rn(xr[i], scale);
}

extern "C" int wf__cuda_rms_norm(struct wf_backend_ctx *c, const float *x, const float *w, float *y,
                                 uint32_t rows, uint32_t len, size_t stride, float eps,
                                 struct wf_diag *diag)
{
	if (len == 0 || (rows > 1 && stride < len) || ((!x || !y) && rows))
		return wf_diag_set(diag, WF_EINVAL, "rms_norm: %u rows of %u, stride %zu", rows,
		                   len, stride);
	if (rows == 0)
		return 0;
	rms_norm_kernel<<<rows, NORM_THREADS, 0, c->stream>>>(x, w, y, len, stride, eps);
	return wf__cuda_launched(diag, "rms_norm");
}

extern "C" void wf__cuda_rms_norm_host(const float *x, const float *w, float *y, uint32_t len,
                                       float eps)
{
	double part[NORM_THREADS], warps[NORM_THREADS / 32];
	for (uint32_t t = 0; t < NORM_THREADS; t++) {
		part[t] = 0.0;
		for (uint32_t i = t; i < len; i += NORM_THREADS)
			part[t] += (double)(x[i] * x[i]);
	}
	for (uint32_t wi = 0; wi < NORM_THREADS / 32; wi++) {
		double v[32];
		for (int l = 0; l < 32; l++)
			v[l] = part[32 * wi + l];
		for (int off = 16; off > 0; off >>= 1) {
			double nv[32];
			for (int l = 0; l < 32; l++)
				nv[l] = v[l] + v[l ^ off];
			for (int l = 0; l < 32; l++)
				v[l] = nv[l];
		}
		warps[wi] = v[0];
	}
	double t = 0.0;
	for (uint32_t i = 0; i < NORM_THREADS / 32; i++)
		t += warps[i];
	const float scale = norm_scale(t, len, eps);
	for (uint32_t i = 0; i < len; i++)
		y[i] = w ? (x[i] * scale) * w[i] : x[i] * scale;
}

static __global__ void __launch_bounds__(ROPE_THREADS)
    rope_kernel(float *x, size_t x_stride, uint32_t n_heads, uint32_t head_dim, uint32_t n_dims,
                const int32_t *pos, float theta_scale, enum wf_backend_rope kind)
{
	extern __shared__ float cs[]; /* n_dims: cos, sin of each pair */
	const uint32_t half = n_dims / 2;
	const int32_t p = pos[blockIdx.x];

	for (uint32_t i = threadIdx.x; i < half; i += ROPE_THREADS) {
		float s, co;
		sincosf(rope_theta(p, i, theta_scale), &s, &co);
		cs[2 * i] = co;
		cs[2 * i + 1] = s;
	}
	__syncthreads();
	float *xt = x + (size_t)blockIdx.x * x_stride;
	for (uint32_t k = threadIdx.x; k < n_heads * half; k += ROPE_THREADS) {
		const uint32_t h = k / half, i0 = 2 * (k % half);
		uint32_t a, b;
		rope_pair(kind, i0, n_dims, &a, &b);
		rope_rotate(xt + (size_t)h * head_dim, a, b, cs[i0], cs[i0 + 1]);
	}
}

extern "C" float wf__cuda_rope_theta_scale(float base, uint32_t n_dims)
{
	return powf(base, -2.0f / (float)n_dims);
}

extern "C" int wf__cuda_rope(struct wf_backend_ctx *c, float *x, size_t x_stride, uint32_t n,
                             uint32_t n_heads, uint32_t head_dim, uint32_t n_dims,
                             const int32_t *pos, float base, enum wf_backend_rope kind,
                             struct wf_diag *diag)
{
	if (n_dims == 0 || n_dims % 2 || n_dims > head_dim || n_dims > ROPE_MAX_DIMS ||
	    (kind != WF_BACKEND_ROPE_NORM && kind != WF_BACKEND_ROPE_NEOX) ||
	    (uint64_t)n_heads * n_dims / 2 > UINT32_MAX ||
	    (n > 1 && x_stride < (size_t)n_heads * head_dim))
		return wf_diag_set(diag, WF_EINVAL,
		                   "rope: %u heads of %u, %u rotated, kind %d, stride %zu", n_heads,
		                   head_dim, n_dims, (int)kind, x_stride);
	if (n == 0 || n_heads == 0)
		return 0;
	rope_kernel<<<n, ROPE_THREADS, n_dims * sizeof(float), c->stream>>>(
	    x, x_stride, n_heads, head_dim, n_dims, pos, wf__cuda_rope_theta_scale(base, n_dims),
	    kind);
	return wf__cuda_launched(diag, "rope");
}

extern "C" void wf__cuda_rope_angles_host(int32_t pos, uint32_t n_dims, float theta_scale,
                                          float *cs)
{
	for (uint32_t i = 0; i < n_dims / 2; i++) {
		const float theta = rope_theta(pos, i, theta_scale);
		cs[2 * i] = cosf(theta);
		cs[2 * i + 1] = sinf(theta);
	}
}

extern "C" void wf__cuda_rope_head_host(float *x, uint32_t n_dims, const float *cs,
                                        enum wf_backend_rope kind)
{
	for (uint32_t i0 = 0; i0 < n_dims; i0 += 2) {
		uint32_t a, b;
		rope_pair(kind, i0, n_dims, &a, &b);
		rope_rotate(x, a, b, cs[i0], cs[i0 + 1]);
	}
}

extern "C" int wf__cuda_norm_rope_preload(struct wf_diag *diag)
{
	cudaFuncAttributes attr;
	cudaError_t e = cudaFuncGetAttributes(&attr, rms_norm_kernel);
	if (e == cudaSuccess)
		e = cudaFuncGetAttributes(&attr, rope_kernel);
	return e == cudaSuccess ? 0 : wf__cuda_fail(e, diag, "loading the norm and rope kernels");
}
