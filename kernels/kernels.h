/* The engine's CPU kernel table: what it calls per weight type, registered with the device layer
 * (device.h, struct wf_device_kernel_table) for WF_DEVICE_KIND_HOST, so that an engine finds its
 * kernels through wf_device_kernels(dev) whichever backend it runs on. The CUDA kernels will sit
 * behind the same lookup for WF_DEVICE_KIND_CUDA.
 *
 * For a weight type W the engine quantizes each activation row once with
 * from_float[types[W].vec_dot_type] (ggml's type_traits_cpu from_float of the vec_dot_type) and
 * then calls types[W].vec_dot per weight row. A type with a NULL vec_dot is not supported.
 * Today the table holds the plain-C reference (kernels/ref.h); SIMD paths chosen at run time will
 * replace entries behind the same layout. */
#ifndef WF_KERNELS_KERNELS_H
#define WF_KERNELS_KERNELS_H

#include "model/dtype.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped whenever struct wf_kernel_ops changes layout; the table's `version` carries it. */
#define WF_KERNEL_OPS_VERSION 1u

typedef void (*wf_kernel_dequantize_row_fn)(const void *x, float *y, int64_t n);
typedef void (*wf_kernel_from_float_fn)(const float *x, void *y, int64_t n);
typedef float (*wf_kernel_vec_dot_fn)(int64_t n, const void *x, const void *y);

struct wf_kernel_type_ops {
	wf_kernel_dequantize_row_fn dequantize_row; /* NULL: the type is not supported */
	wf_kernel_vec_dot_fn vec_dot;               /* x: this type, y: vec_dot_type */
	enum wf_dtype vec_dot_type;                 /* the activation type vec_dot takes */
};

struct wf_kernel_ops {
	struct wf_kernel_type_ops types[WF_DTYPE_GGML_COUNT_];
	/* Activation quantizers, by activation type (F32, F16, BF16, Q8_0, Q8_K); NULL elsewhere. */
	wf_kernel_from_float_fn from_float[WF_DTYPE_GGML_COUNT_];
};

/* The ops for a weight type, or NULL when ops has no kernels for it (or dtype is out of range). */
const struct wf_kernel_type_ops *wf_kernel_ops_type(const struct wf_kernel_ops *ops,
                                                    uint32_t dtype);

/* The CPU kernel ops (static storage). */
const struct wf_kernel_ops *wf_kernels_cpu_ops(void);

/* Registers the CPU table for WF_DEVICE_KIND_HOST (name "cpu", version WF_KERNEL_OPS_VERSION).
 * Idempotent and thread-safe; returns 0, or WF_EDUPLICATE when another table holds the kind. */
int wf_kernels_cpu_register(void);

#ifdef __cplusplus
}
#endif
#endif
