/* The CPU kernel table: what the host backend (kernels/backend_host.c) calls per weight type.
 *
 * For a weight type W the engine quantizes each activation row once with
 * from_float[types[W].vec_dot_type] (ggml's type_traits_cpu from_float of the vec_dot_type) and
 * then calls types[W].gemm on a slice of weight rows and all the activation rows of a batch (or
 * types[W].vec_dot per row pair). A type with a NULL vec_dot is not supported.
 *
 * Levels: the table exists once per kernel level (enum wf_kernel_level): the plain-C reference
 * (kernels/ref.h, every build), and on x86-64 AVX2 (+FMA+F16C) and AVX-512 (F/BW/VL + VNNI),
 * compiled per file with their own target flags so the binary runs on any x86-64 and each level
 * is used only where the CPU (and the OS, for the AVX-512 register state) has it. The CPU table is
 * the best level the CPU has, or the one the environment variable WF_KERNELS=ref|avx2|avx512
 * names, read once when the table is first asked for. SIMD results differ from the reference only
 * by float summation order (integer block sums are exact); the activation quantizers and the
 * float numerics (softmax, swiglu, rope, tiled attention: llama.cpp's order lane by lane) are
 * bit-identical at every level.
 *
 * Activations: the SIMD integer dots rely on what the Q8_0/Q8_K quantizers write (|q| <= 127);
 * an activation block holding -128 is outside the contract. */
#ifndef WF_KERNELS_KERNELS_H
#define WF_KERNELS_KERNELS_H

#include "model/dtype.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef void (*wf_kernel_dequantize_row_fn)(const void *x, float *y, int64_t n);
typedef void (*wf_kernel_from_float_fn)(const float *x, void *y, int64_t n);
typedef float (*wf_kernel_vec_dot_fn)(int64_t n, const void *x, const void *y);
/* out[j * out_stride + i] = vec_dot(n, w + i * w_stride, act + j * act_stride) for i < n_rows and
 * j < n_act: strides in bytes for w and act (any multiple of the row's block size in bytes, as
 * GGUF rows are), in floats for out. The SIMD versions load each weight block once for several
 * activation rows, which is what makes batched decode and prefill cheaper than n_act dots. At a
 * given level out[j][i] is bit-identical to that level's vec_dot of the same two rows, whatever
 * n_rows and n_act are, so an engine's results do not depend on how it batches sequences.
 * Thread-safe (no state); the caller splits rows among threads. */
typedef void (*wf_kernel_gemm_fn)(int64_t n, const void *w, size_t w_stride, int64_t n_rows,
                                  const void *act, size_t act_stride, int64_t n_act, float *out,
                                  size_t out_stride);

struct wf_kernel_type_ops {
	wf_kernel_dequantize_row_fn dequantize_row; /* NULL: the type is not supported */
	wf_kernel_vec_dot_fn vec_dot;               /* x: this type, y: vec_dot_type */
	enum wf_dtype vec_dot_type;                 /* the activation type vec_dot takes */
	wf_kernel_gemm_fn gemm;                     /* batched vec_dot; NULL: loop over vec_dot */
};

/* Positions of one KV tile of llama.cpp's tiled CPU flash attention (GGML_FA_TILE_KV), and the
 * most query rows one attend_tiled call takes. */
#define WF_KERNELS_FA_TILE 64
#define WF_KERNELS_FA_ROWS 8
/* Floats of scratch one attend_tiled call needs at any level, for heads of head_dim floats. */
#define WF_KERNELS_FA_SCRATCH(head_dim)                                                            \
	((2u * WF_KERNELS_FA_TILE + 2u * WF_KERNELS_FA_ROWS) * (size_t)(head_dim) +                \
	 (size_t)WF_KERNELS_FA_ROWS * WF_KERNELS_FA_TILE + 16u)

/* Attention of n_q <= WF_KERNELS_FA_ROWS query rows of one head (row r: q + r * q_stride,
 * head_dim floats) over the same rows of an F16 cache, row r over the first n_kv[r] >= 1 of them
 * (k and v: the first position's head, positions kv_stride bytes apart), as ggml's
 * ggml_compute_forward_flash_attn_ext_tiled computes each row (kernels/cpu_ops.h,
 * wf_cpu_attend_tiled): out + r * out_stride, head_dim floats. scratch: WF_KERNELS_FA_SCRATCH
 * floats, the caller's per thread. */
typedef void (*wf_kernel_attend_tiled_fn)(uint32_t n_q, const float *q, size_t q_stride,
                                          const uint32_t *n_kv, const uint8_t *k, const uint8_t *v,
                                          size_t kv_stride, uint32_t head_dim, float scale,
                                          float *scratch, float *out, size_t out_stride);

struct wf_kernel_ops {
	struct wf_kernel_type_ops types[WF_DTYPE_GGML_COUNT_];
	/* Activation quantizers, by activation type (F32, F16, BF16, Q8_0, Q8_K); NULL elsewhere.
	 */
	wf_kernel_from_float_fn from_float[WF_DTYPE_GGML_COUNT_];
	/* The float numerics of kernels/cpu_ops.h that the host backend runs through the table, so
	 * that a level computes them faster: each gives the reference's floats bit for bit. Never
	 * NULL. */
	void (*softmax)(float *x, uint32_t n);                                /* wf_cpu_softmax */
	void (*swiglu)(const float *g, const float *u, float *y, uint32_t n); /* wf_cpu_swiglu */
	void (*rope)(float *x, uint32_t n_dims, const float *cs, bool neox);  /* wf_cpu_rope */
	wf_kernel_attend_tiled_fn attend_tiled;
};

/* The ops for a weight type, or NULL when ops has no kernels for it (or dtype is out of range). */
const struct wf_kernel_type_ops *wf_kernel_ops_type(const struct wf_kernel_ops *ops,
                                                    uint32_t dtype);

enum wf_kernel_level {
	WF_KERNEL_LEVEL_REF,    /* plain C (kernels/ref.h) */
	WF_KERNEL_LEVEL_AVX2,   /* x86-64 AVX2 + FMA + F16C */
	WF_KERNEL_LEVEL_AVX512, /* x86-64 AVX-512 F/BW/VL + VNNI (and the AVX2 set) */
	WF_KERNEL_LEVEL_MAX_
};

/* "ref", "avx2", "avx512"; NULL for a level out of range. */
const char *wf_kernel_level_name(enum wf_kernel_level level);

/* The ops of one level (static storage), or NULL when this build or this CPU lacks it. For tests
 * and benchmarks that compare levels; thread-safe. */
const struct wf_kernel_ops *wf_kernels_cpu_ops_level(enum wf_kernel_level level);

/* The level the CPU table uses: WF_KERNELS when set, else the best one the CPU has. Returns 0 and
 * writes ret_level, WF_EINVAL when WF_KERNELS names no level, or WF_EUNSUPPORTED when it names one
 * this build or CPU lacks. The choice is made once per process; thread-safe. */
int wf_kernels_cpu_level(enum wf_kernel_level *ret_level);

/* The CPU kernel ops of the chosen level (static storage), or NULL when WF_KERNELS is refused
 * (wf_kernels_cpu_level says why). */
const struct wf_kernel_ops *wf_kernels_cpu_ops(void);

#ifdef __cplusplus
}
#endif
#endif
