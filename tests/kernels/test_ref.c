/* The plain-C reference kernels (kernels/ref.h) and the CPU kernel table (kernels/kernels.h).
 *
 * What pins them to ggml (llama.cpp b10573):
 *  - dequantize: blocks built by hand with known scales and values, expectations worked out on
 *    paper from ggml's formulas (so a wrong nibble order, scale packing or bias fails);
 *  - the activation quantizers: hand cases where roundf (Q8_0, halves away from zero) and
 *    ggml's nearest_int (Q8_K, halves to even) differ, the sign convention of Q8_K's d, the F16
 *    bits of Q8_0's d; random round trips within half a step;
 *  - vec_dot: on random blocks, against the double-precision dot of the dequantized operands
 *    (tight: only float rounding may differ) and against the unquantized activation (within the
 *    activation's quantization error bound); NMSE and max-abs are logged;
 *  - the reference models: the Q4_0, Q4_K and Q6_K tensors of the models that llama-quantize made
 *    from one F32 source dequantize to within their format's error of the Q8_0 model's tensors,
 *    which a wrong layout cannot do. */
#include "base/error.h"
#include "common/wftest.h"
#include "device/device.h"
#include "kernels/backend.h"
#include "kernels/kernels.h"
#include "kernels/ref.h"
#include "model/model.h"
#include "tests/kernels/kgen.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

TestSuite(kernels, .timeout = 120);

/* ---- helpers ------------------------------------------------------------------------------- */

/* The reference level whatever the CPU has (test_simd.c checks the SIMD levels against it). */
static const struct wf_kernel_ops *ops(void)
{
	return wf_kernels_cpu_ops_level(WF_KERNEL_LEVEL_REF);
}

/* ---- F16 / BF16 ---------------------------------------------------------------------------- */

Test(kernels, fp16_round_trip_and_ties)
{
	for (uint32_t i = 0; i < 0x10000; i++) {
		uint16_t v = (uint16_t)i;
		float f = wf_kernels_fp16_to_fp32(v);
		if ((v & 0x7c00) == 0x7c00 && (v & 0x3ff)) {
			cr_assert(isnan(f), "0x%04x", v);
			cr_assert(isnan(wf_kernels_fp16_to_fp32(kgen_h(f))));
			continue;
		}
		cr_assert_eq(kgen_h(f), v, "0x%04x -> %a -> 0x%04x", v, f, kgen_h(f));
	}
	cr_assert_eq(wf_kernels_fp16_to_fp32(0x3c00), 1.0f);
	cr_assert_eq(wf_kernels_fp16_to_fp32(0xc000), -2.0f);
	cr_assert_eq(wf_kernels_fp16_to_fp32(0x7bff), 65504.0f);
	cr_assert_eq(wf_kernels_fp16_to_fp32(0x0001), 0x1p-24f);
	/* ties to even, normal and subnormal, and the overflow edge */
	cr_assert_eq(kgen_h(1.0f + 0x1p-11f), 0x3c00);
	cr_assert_eq(kgen_h(1.0f + 3 * 0x1p-11f), 0x3c02);
	cr_assert_eq(kgen_h(0x1p-25f), 0x0000);
	cr_assert_eq(kgen_h(3 * 0x1p-25f), 0x0002);
	cr_assert_eq(kgen_h(65519.0f), 0x7bff);
	cr_assert_eq(kgen_h(65520.0f), 0x7c00);
	cr_assert_eq(kgen_h(-1e9f), 0xfc00);
	cr_assert_eq(kgen_h(-0.0f), 0x8000);
	cr_assert_eq(kgen_h(NAN) & 0x7e00, 0x7e00);
	/* 1/127: Q8_0's d for a block whose largest magnitude is 1 */
	cr_assert_eq(kgen_h(1.0f / 127.0f), 0x2008);
}

Test(kernels, bf16_conversions)
{
	cr_assert_eq(wf_kernels_fp32_to_bf16(1.0f), 0x3f80);
	cr_assert_eq(wf_kernels_bf16_to_fp32(0xc0a0), -5.0f);
	uint32_t tie_even = 0x3f808000u, tie_odd = 0x3f818000u;
	float f;
	memcpy(&f, &tie_even, 4);
	cr_assert_eq(wf_kernels_fp32_to_bf16(f), 0x3f80);
	memcpy(&f, &tie_odd, 4);
	cr_assert_eq(wf_kernels_fp32_to_bf16(f), 0x3f82);
	cr_assert(isnan(wf_kernels_bf16_to_fp32(wf_kernels_fp32_to_bf16(NAN))));
	for (uint32_t i = 0; i < 0x10000; i++) {
		float g = wf_kernels_bf16_to_fp32((uint16_t)i);
		if (!isnan(g))
			cr_assert_eq(wf_kernels_fp32_to_bf16(g), i);
	}
}

/* ---- (a) dequantize hand-built blocks ------------------------------------------------------ */

static void deq(enum wf_dtype t, const void *x, float *y, int64_t n)
{
	const struct wf_kernel_type_ops *o = wf_kernel_ops_type(ops(), t);

	cr_assert_not_null(o);
	o->dequantize_row(x, y, n);
}

Test(kernels, dequant_float_types)
{
	uint16_t f16[3] = {0x3c00, 0xc000, 0x0001};
	uint16_t bf[3] = {0x3f80, 0xc0a0, 0x0001};
	float f32[3] = {1.5f, -0.0f, 3e38f}, y[3];

	deq(WF_DTYPE_F16, f16, y, 3);
	cr_assert(y[0] == 1.0f && y[1] == -2.0f && y[2] == 0x1p-24f);
	deq(WF_DTYPE_BF16, bf, y, 3);
	cr_assert(y[0] == 1.0f && y[1] == -5.0f && y[2] == 0x1p-133f);
	deq(WF_DTYPE_F32, f32, y, 3);
	cr_assert(memcmp(y, f32, sizeof(y)) == 0);
}

Test(kernels, dequant_q8_0_hand)
{
	struct wf_block_q8_0 b[2];
	float y[64];

	b[0].d = 0x3800; /* 0.5 */
	for (int j = 0; j < 32; j++)
		b[0].qs[j] = (int8_t)(j - 16);
	b[1].d = 0xc000; /* -2 */
	memset(b[1].qs, 0, 32);
	b[1].qs[7] = -128;
	b[1].qs[31] = 127;
	deq(WF_DTYPE_Q8_0, b, y, 64);
	cr_assert_eq(y[0], -8.0f);
	cr_assert_eq(y[31], 7.5f);
	cr_assert_eq(y[17], 0.5f);
	cr_assert_eq(y[32 + 7], 256.0f);
	cr_assert_eq(y[32 + 31], -254.0f);
	cr_assert_eq(y[32 + 8], 0.0f);
}

Test(kernels, dequant_q4_0_hand)
{
	struct wf_block_q4_0 b[1];
	float y[32];

	b[0].d = 0x4000;           /* 2 */
	memset(b[0].qs, 0x88, 16); /* both nibbles 8: zero */
	b[0].qs[0] = 0x1f;         /* element 0: 15-8, element 16: 1-8 */
	b[0].qs[15] = 0x80;        /* element 15: 0-8, element 31: 8-8 */
	deq(WF_DTYPE_Q4_0, b, y, 32);
	cr_assert_eq(y[0], 14.0f);
	cr_assert_eq(y[16], -14.0f);
	cr_assert_eq(y[15], -16.0f);
	cr_assert_eq(y[31], 0.0f);
	cr_assert_eq(y[5], 0.0f);
}

/* Scales for the K hand tests: sub-block 0 sc 3 m 2; 1: sc 7 m 1 (with top bits for 5 in the
 * spare bits of bytes 1 and 5); 5: sc 37 (0b100101) m 19 (0b010011); the rest 0. */
static void k_scales(uint8_t s[12])
{
	memset(s, 0, 12);
	s[0] = 3;
	s[4] = 2;
	s[1] = 0x80 | 7; /* top bits 2: sc5 = 5 | 2 << 4 = 37 */
	s[5] = 0x40 | 1; /* top bits 1: m5 = 3 | 1 << 4 = 19 */
	s[9] = 0x35;     /* sc5 low nibble 5, m5 low nibble 3 */
}

Test(kernels, dequant_q4_K_hand)
{
	struct wf_block_q4_K b[2];
	float all[512], *y = all + 256;

	memset(b, 0, sizeof(b));
	b[1].d = 0x3c00;    /* 1 */
	b[1].dmin = 0x3800; /* 0.5 */
	k_scales(b[1].scales);
	b[1].qs[0] = 0x9a;  /* element 0 (sub-block 0): 10; element 32 (sub-block 1): 9 */
	b[1].qs[70] = 0xc0; /* element 134 (sub-block 4): 0; element 166 (sub-block 5): 12 */
	deq(WF_DTYPE_Q4_K, b, all, 512);
	for (int i = 0; i < 256; i++)
		cr_assert_eq(all[i], 0.0f);
	cr_assert_eq(y[0], 1 * 3 * 10 - 0.5f * 2);
	cr_assert_eq(y[1], -1.0f); /* q 0 */
	cr_assert_eq(y[32], 7 * 9 - 0.5f * 1);
	cr_assert_eq(y[166], 37 * 12 - 0.5f * 19);
	cr_assert_eq(y[134], 0.0f); /* sub-block 4 has sc 0, m 0 */
	cr_assert_eq(y[160], -0.5f * 19);
}

Test(kernels, dequant_q5_K_hand)
{
	struct wf_block_q5_K b[1];
	float y[256];

	memset(b, 0, sizeof(b));
	b[0].d = 0x3c00;
	b[0].dmin = 0x3800;
	k_scales(b[0].scales);
	b[0].qs[0] = 0x9a;
	b[0].qh[0] = 0x03; /* fifth bit of element 0 (bit 0) and element 32 (bit 1) */
	b[0].qs[70] = 0xc0;
	b[0].qh[6] = 0x20; /* fifth bit of element 166 (sub-block 5), not of 134 (bit 4) */
	b[0].qh[1] = 0x01; /* element 1: q 0 + 16 */
	deq(WF_DTYPE_Q5_K, b, y, 256);
	cr_assert_eq(y[0], 3 * (10 + 16) - 0.5f * 2);
	cr_assert_eq(y[32], 7 * (9 + 16) - 0.5f * 1);
	cr_assert_eq(y[166], 37 * (12 + 16) - 0.5f * 19);
	cr_assert_eq(y[134], 0.0f);
	cr_assert_eq(y[1], 3 * 16 - 0.5f * 2);
	cr_assert_eq(y[33], 7 * 0 - 0.5f * 1);
}

Test(kernels, dequant_q6_K_hand)
{
	struct wf_block_q6_K b[1];
	float y[256];

	memset(b, 0, sizeof(b));
	b[0].d = 0x3400; /* 0.25 */
	b[0].scales[0] = -3;
	b[0].scales[2] = 5;
	b[0].scales[4] = 2;
	b[0].scales[6] = -128;
	b[0].scales[9] = 7;
	b[0].ql[0] = 0x5f;
	b[0].ql[32] = 0x21;
	b[0].qh[0] = 0x87; /* 2 bits each: 3 (element 0), 1 (32), 0 (64), 2 (96) */
	b[0].ql[64 + 17] = 0x0c;
	b[0].qh[32 + 17] = 0x02; /* element 128 + 17: 12 | 2 << 4 */
	deq(WF_DTYPE_Q6_K, b, y, 256);
	cr_assert_eq(y[0], 0.25f * -3 * (63 - 32));
	cr_assert_eq(y[32], 0.25f * 5 * (17 - 32));
	cr_assert_eq(y[64], 0.25f * 2 * (5 - 32));
	cr_assert_eq(y[96], 0.25f * -128 * (34 - 32));
	cr_assert_eq(y[128 + 17], 0.25f * 7 * (44 - 32));
	cr_assert_eq(y[1], 0.25f * -3 * -32); /* all-zero bits are -32, not 0 */
	cr_assert_eq(y[16], 0.0f);            /* scales[1] is 0 */
}

/* ---- (c) activation quantizers ------------------------------------------------------------- */

Test(kernels, quantize_q8_0_hand)
{
	float x[64] = {2.5f, -2.5f, 0.5f, -0.5f, 1.5f, 127.0f, -126.6f};
	struct wf_block_q8_0 b[2];

	for (int j = 0; j < 32; j++)
		x[32 + j] = (j == 3) ? -1.0f : 0.25f;
	wf_kernels_ref_quantize_row_q8_0(x, b, 64);
	cr_assert_eq(b[0].d, 0x3c00);                 /* 127 / 127 */
	int8_t want[7] = {2, -2, 0, 0, 2, 127, -127}; /* ties to even, as ggml's x86 quantizer */
	for (int j = 0; j < 7; j++)
		cr_assert_eq(b[0].qs[j], want[j], "qs[%d] = %d", j, b[0].qs[j]);
	cr_assert_eq(b[1].d, 0x2008); /* F16 of 1/127 */
	cr_assert_eq(b[1].qs[3], -127);
	cr_assert_eq(b[1].qs[0], 32); /* 0.25 * 127 = 31.75 */

	float z[32] = {0};
	wf_kernels_ref_quantize_row_q8_0(z, b, 32);
	cr_assert_eq(b[0].d, 0);
	for (int j = 0; j < 32; j++)
		cr_assert_eq(b[0].qs[j], 0);
}

Test(kernels, quantize_q8_K_hand)
{
	static float x[512];
	static struct wf_block_q8_K b[2];

	memset(x, 0, sizeof(x));
	x[0] = 2.5f, x[1] = -2.5f, x[2] = 3.5f, x[3] = 0.5f, x[4] = 1.5f, x[5] = 127.0f;
	x[20] = -127.0f; /* same magnitude later: the first one decides the sign */
	x[256 + 9] = -127.0f;
	x[256 + 10] = 2.5f;
	wf_kernels_ref_quantize_row_q8_K(x, b, 512);
	/* max +127 first: iscale = -1, so d = -1 and each value flips sign; halves go to even */
	cr_assert_eq(b[0].d, -1.0f);
	int8_t want[6] = {-2, 2, -4, 0, -2, -127};
	for (int j = 0; j < 6; j++)
		cr_assert_eq(b[0].qs[j], want[j], "qs[%d] = %d", j, b[0].qs[j]);
	cr_assert_eq(b[0].qs[20], 127);
	cr_assert_eq(b[0].bsums[0], -2 + 2 - 4 + 0 - 2 - 127);
	cr_assert_eq(b[0].bsums[1], 127);
	cr_assert_eq(b[1].d, 1.0f);
	cr_assert_eq(b[1].qs[9], -127);
	cr_assert_eq(b[1].qs[10], 2);

	memset(x, 0, sizeof(x));
	memset(b, 0x55, sizeof(b));
	wf_kernels_ref_quantize_row_q8_K(x, b, 256);
	cr_assert_eq(b[0].d, 0.0f);
	for (int j = 0; j < 256; j++)
		cr_assert_eq(b[0].qs[j], 0);
	for (int g = 0; g < 16; g++)
		cr_assert_eq(b[0].bsums[g], 0);
}

/* Random rows, blocks with very different scales: every value within half a step of its input. */
Test(kernels, quantize_round_trips)
{
	enum { N = 7 * 256 };
	static float x[N], y[N];
	static struct wf_block_q8_0 q0[N / 32];
	static struct wf_block_q8_K qk[N / 256];

	kgen_seed(0x5eed0001);
	for (int trial = 0; trial < 20; trial++) {
		for (int i = 0; i < N; i++)
			x[i] = kgen_uniform(-1, 1) * powf(10.0f, (float)((i / 64) % 5) - 2);

		wf_kernels_ref_quantize_row_q8_0(x, q0, N);
		wf_kernels_ref_dequantize_row_q8_0(q0, y, N);
		for (int b = 0; b < N / 32; b++) {
			float amax = 0, bound;
			int at127 = 0;
			for (int j = 0; j < 32; j++)
				amax = fmaxf(amax, fabsf(x[b * 32 + j]));
			float d = amax / 127, d16 = wf_kernels_fp16_to_fp32(q0[b].d);
			cr_assert_eq(q0[b].d, kgen_h(d));
			/* half a step, plus what storing d as F16 moves a value by */
			bound = d / 2 * 1.0001f + 127 * fabsf(d16 - d);
			for (int j = 0; j < 32; j++) {
				cr_assert_leq(fabsf(x[b * 32 + j] - y[b * 32 + j]), bound);
				at127 |= abs(q0[b].qs[j]) == 127;
			}
			cr_assert(at127);
		}

		wf_kernels_ref_quantize_row_q8_K(x, qk, N);
		wf_kernels_ref_dequantize_row_q8_K(qk, y, N);
		for (int b = 0; b < N / 256; b++) {
			float d = fabsf(qk[b].d);
			for (int j = 0; j < 256; j++)
				cr_assert_leq(fabsf(x[b * 256 + j] - y[b * 256 + j]),
				              d / 2 * 1.0001f);
			for (int g = 0; g < 16; g++) {
				int s = 0;
				for (int j = 0; j < 16; j++)
					s += qk[b].qs[g * 16 + j];
				cr_assert_eq(qk[b].bsums[g], s);
			}
		}
	}
}

/* ---- (b) vec_dot against float dots -------------------------------------------------------- */

static void check_vec_dot(enum wf_dtype t, const int64_t *sizes, int n_sizes)
{
	const struct wf_kernel_type_ops *o = wf_kernel_ops_type(ops(), t);
	const struct wf_dtype_info *ti = wf_dtype_info(t);
	double err2_q = 0, ref2_q = 0, err2_y = 0, ref2_y = 0, maxabs_q = 0, maxabs_y = 0;

	cr_assert_not_null(o);
	wf_kernel_from_float_fn quant = ops()->from_float[o->vec_dot_type];
	wf_kernel_dequantize_row_fn act_deq = NULL;
	switch (o->vec_dot_type) {
	case WF_DTYPE_F32:
		act_deq = wf_kernels_ref_dequantize_row_f32;
		break;
	case WF_DTYPE_F16:
		act_deq = wf_kernels_ref_dequantize_row_f16;
		break;
	case WF_DTYPE_BF16:
		act_deq = wf_kernels_ref_dequantize_row_bf16;
		break;
	case WF_DTYPE_Q8_0:
		act_deq = wf_kernels_ref_dequantize_row_q8_0;
		break;
	case WF_DTYPE_Q8_K:
		act_deq = wf_kernels_ref_dequantize_row_q8_K;
		break;
	default:
		cr_assert_fail("activation type %d", o->vec_dot_type);
	}
	cr_assert_not_null(quant);

	kgen_seed(0x5eed0100 + (uint64_t)t);
	for (int s = 0; s < n_sizes; s++) {
		int64_t n = sizes[s];
		void *w = malloc(kgen_row_bytes(t, n));
		void *yq = malloc(kgen_row_bytes(o->vec_dot_type, n));
		float *wf = malloc((size_t)n * sizeof(float));
		float *y = malloc((size_t)n * sizeof(float));
		float *yd = malloc((size_t)n * sizeof(float));
		cr_assert(w && yq && wf && y && yd);

		for (int trial = 0; trial < 16; trial++) {
			kgen_weights(t, w, n);
			for (int64_t i = 0; i < n; i++)
				y[i] = kgen_uniform(-1, 1) * (i % 97 == 0 ? 8.0f : 1.0f);
			quant(y, yq, n);
			o->dequantize_row(w, wf, n);
			act_deq(yq, yd, n);

			double ref_q = 0, mag_q = 0, ref_y = 0, mag_y = 0, bound_y = 0;
			for (int64_t i = 0; i < n; i++) {
				cr_assert(isfinite(wf[i]));
				ref_q += (double)wf[i] * yd[i];
				mag_q += fabs((double)wf[i] * yd[i]);
				ref_y += (double)wf[i] * y[i];
				mag_y += fabs((double)wf[i] * y[i]);
				bound_y += fabs((double)wf[i]) * fabs((double)y[i] - yd[i]);
			}
			double got = o->vec_dot(n, w, yq);
			double eq = fabs(got - ref_q), ey = fabs(got - ref_y);

			/* only float rounding separates the kernel from the exact dot of its
			 * operands */
			cr_assert_leq(eq, 1e-5 * mag_q + 1e-30,
			              "%s n=%ld: %.9g vs %.9g (|terms| %.3g)", ti->name, (long)n,
			              got, ref_q, mag_q);
			/* and the activation's quantization error bounds the distance to the float
			 * dot */
			cr_assert_leq(ey, bound_y + 1e-5 * mag_y + 1e-30,
			              "%s n=%ld: %.9g vs float %.9g (bound %.3g)", ti->name,
			              (long)n, got, ref_y, bound_y);
			err2_q += eq * eq, ref2_q += ref_q * ref_q, maxabs_q = fmax(maxabs_q, eq);
			err2_y += ey * ey, ref2_y += ref_y * ref_y, maxabs_y = fmax(maxabs_y, ey);
		}
		free(w), free(yq), free(wf), free(y), free(yd);
	}
	double nmse_q = err2_q / ref2_q, nmse_y = err2_y / ref2_y;
	cr_log_info("%-5s vec_dot vs dequant dot: NMSE %.3g max-abs %.3g; vs float activation: "
	            "NMSE %.3g max-abs %.3g",
	            ti->name, nmse_q, maxabs_q, nmse_y, maxabs_y);
	cr_assert_lt(nmse_q, 1e-10, "%s: NMSE %.3g", ti->name, nmse_q);
	/* Q8 activations cost about 1e-5 of NMSE; F16/BF16 less */
	cr_assert_lt(nmse_y, 1e-3, "%s: NMSE vs float %.3g", ti->name, nmse_y);
}

static const int64_t float_sizes[] = {1, 7, 33, 1001};
static const int64_t b32_sizes[] = {32, 96, 224};
static const int64_t k_sizes[] = {256, 768, 1792};

Test(kernels, vec_dot_f32)
{
	check_vec_dot(WF_DTYPE_F32, float_sizes, 4);
}
Test(kernels, vec_dot_f16)
{
	check_vec_dot(WF_DTYPE_F16, float_sizes, 4);
}
Test(kernels, vec_dot_bf16)
{
	check_vec_dot(WF_DTYPE_BF16, float_sizes, 4);
}
Test(kernels, vec_dot_q8_0)
{
	check_vec_dot(WF_DTYPE_Q8_0, b32_sizes, 3);
}
Test(kernels, vec_dot_q4_0)
{
	check_vec_dot(WF_DTYPE_Q4_0, b32_sizes, 3);
}
Test(kernels, vec_dot_q4_K)
{
	check_vec_dot(WF_DTYPE_Q4_K, k_sizes, 3);
}
Test(kernels, vec_dot_q5_K)
{
	check_vec_dot(WF_DTYPE_Q5_K, k_sizes, 3);
}
Test(kernels, vec_dot_q6_K)
{
	check_vec_dot(WF_DTYPE_Q6_K, k_sizes, 3);
}

/* ---- bit for bit against ggml -------------------------------------------------------------- */

/* golden-gen begin: the inputs of the golden test, one row per case. The expected values below
 * were produced by running ggml b10573's own functions (dequantize_row_*, quantize_row_q8_0_ref,
 * quantize_row_q8_K_ref, ggml_vec_dot_*_generic, built with gcc -std=c11 -O2 for baseline x86-64,
 * outside this repository) on exactly these inputs. */
#define GOLDEN_CASES                                                                               \
	{                                                                                          \
		{WF_DTYPE_Q8_0, 32}, {WF_DTYPE_Q8_0, 224}, {WF_DTYPE_Q4_0, 32},                    \
		    {WF_DTYPE_Q4_0, 224}, {WF_DTYPE_Q4_K, 256}, {WF_DTYPE_Q4_K, 1792},             \
		    {WF_DTYPE_Q5_K, 256}, {WF_DTYPE_Q5_K, 1792}, {WF_DTYPE_Q6_K, 256},             \
		{                                                                                  \
			WF_DTYPE_Q6_K, 1792                                                        \
		}                                                                                  \
	}

static uint64_t golden_next(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static float golden_float(uint64_t *s, float lo, float hi)
{
	return lo + (hi - lo) * (float)((double)(golden_next(s) >> 11) * 0x1p-53);
}

static uint64_t fnv1a(const void *p, size_t n)
{
	const uint8_t *b = p;
	uint64_t hash = 0xcbf29ce484222325ull;

	for (size_t i = 0; i < n; i++)
		hash = (hash ^ b[i]) * 0x100000001b3ull;
	return hash;
}

/* Random block bits with finite F16 scales where the block keeps them, and an activation row. */
static void golden_inputs(enum wf_dtype t, int64_t n, void *w, float *x)
{
	const struct wf_dtype_info *info = wf_dtype_info(t);
	uint64_t s = 0x601de000u + (uint64_t)t * 0x10000u + (uint64_t)n;
	uint8_t *b = w;
	int64_t nblk = n / info->block_size;

	for (size_t i = 0; i < (size_t)nblk * info->type_size; i++)
		b[i] = (uint8_t)golden_next(&s);
	for (int64_t k = 0; k < nblk; k++) {
		uint8_t *p = b + (size_t)k * info->type_size;
		uint16_t d;
		if (t == WF_DTYPE_Q6_K) {
			d = wf_kernels_fp32_to_fp16(golden_float(&s, -1e-3f, 1e-3f));
			memcpy(p + 208, &d, 2);
			continue;
		}
		d = wf_kernels_fp32_to_fp16(golden_float(&s, -2e-3f, 2e-3f));
		memcpy(p, &d, 2);
		if (t == WF_DTYPE_Q4_K || t == WF_DTYPE_Q5_K) {
			d = wf_kernels_fp32_to_fp16(golden_float(&s, 0.0f, 2e-3f));
			memcpy(p + 2, &d, 2);
		}
	}
	for (int64_t i = 0; i < n; i++)
		x[i] = golden_float(&s, -1.0f, 1.0f) * (i % 61 == 0 ? 6.0f : 1.0f);
}
/* golden-gen end */

static const struct {
	uint32_t dot_bits; /* ggml_vec_dot_*_generic's float, as bits */
	uint64_t deq_hash; /* FNV-1a of dequantize_row_*'s floats */
	uint64_t act_hash; /* FNV-1a of quantize_row_q8_0_ref / q8_K_ref's blocks */
} golden[] = {
    {0xbdcaf962u, 0x922a68352e8422e3ull, 0x38a00a14b93bc0a6ull}, /* Q8_0 n=32: -0x1.95f2c4p-4 */
    {0x3fba0379u, 0x4c562f9dd99a69faull, 0x2eec8feefd88147bull}, /* Q8_0 n=224: 0x1.7406f2p+0 */
    {0x3ac4fefau, 0xd4490c354046ac11ull, 0x0d90c46a639d6506ull}, /* Q4_0 n=32: 0x1.89fdf4p-10 */
    {0xbde6dba1u, 0x622488715016a1daull, 0x251b354194958392ull}, /* Q4_0 n=224: -0x1.cdb742p-4 */
    {0xc0d1bdeau, 0x9f367af154baa255ull, 0x0ab635b385927e08ull}, /* Q4_K n=256: -0x1.a37bd4p+2 */
    {0x40117fe0u, 0x254b22ac4906345full, 0xe3f803efea182496ull}, /* Q4_K n=1792: 0x1.22ffcp+1 */
    {0x403a62f9u, 0x9923fdd1a43cca77ull, 0xe737c653fd6fe61bull}, /* Q5_K n=256: 0x1.74c5f2p+1 */
    {0xc25e76edu, 0x404738abcabf8fe9ull, 0x715cb5b267ccc623ull}, /* Q5_K n=1792: -0x1.bceddap+5 */
    {0xc10097acu, 0x3e396c0fafeacf54ull, 0xa2d9d264c6a8661full}, /* Q6_K n=256: -0x1.012f58p+3 */
    {0x41e17af4u, 0x61f48409db795a6cull, 0x711a27c03dd02d38ull}, /* Q6_K n=1792: 0x1.c2f5e8p+4 */
};

Test(kernels, matches_ggml_bit_for_bit)
{
	static const struct {
		enum wf_dtype t;
		int64_t n;
	} cases[] = GOLDEN_CASES;
	static uint8_t w[8192], act[8192];
	static float x[2048], y[2048];

	cr_assert_eq(sizeof(cases) / sizeof(cases[0]), sizeof(golden) / sizeof(golden[0]));
	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		const struct wf_kernel_type_ops *o = wf_kernel_ops_type(ops(), cases[c].t);
		int64_t n = cases[c].n;
		const char *name = wf_dtype_info(cases[c].t)->name;

		golden_inputs(cases[c].t, n, w, x);
		ops()->from_float[o->vec_dot_type](x, act, n);
		o->dequantize_row(w, y, n);
		float dot = o->vec_dot(n, w, act);
		uint32_t bits;
		memcpy(&bits, &dot, 4);
		cr_expect_eq(fnv1a(y, (size_t)n * sizeof(float)), golden[c].deq_hash,
		             "%s n=%ld: dequantized values differ from ggml's", name, (long)n);
		cr_expect_eq(fnv1a(act, kgen_row_bytes(o->vec_dot_type, n)), golden[c].act_hash,
		             "%s n=%ld: quantized activations differ from ggml's", name, (long)n);
		cr_expect_eq(bits, golden[c].dot_bits, "%s n=%ld: dot %a, ggml's 0x%08x", name,
		             (long)n, dot, golden[c].dot_bits);
	}
}

/* ---- (d) the reference models' tensors ----------------------------------------------------- */

static struct wf_model *open_ref(const char *name)
{
	const char *dir = wft_reference_dir();
	char path[4096];
	struct wf_model *m = NULL;
	struct wf_diag diag = {{0}};

	cr_assert_not_null(dir, "tests/data/reference/ is missing");
	snprintf(path, sizeof(path), "%s/%s/%s.gguf", dir, name, name);
	int ret = wf_model_open(path, &m, &diag);
	cr_assert_eq(ret, 0, "%s: %s", path, diag.msg);
	return m;
}

/* The whole tensor dequantized, row by row, through the table. */
static float *read_dequant(const struct wf_model *m, const struct wf_tensor *t, int64_t *ret_n)
{
	const struct wf_kernel_type_ops *o = wf_kernel_ops_type(ops(), t->dtype);
	int64_t n = 1;

	cr_assert_not_null(o, "%s: type %d", t->name, t->dtype);
	for (uint32_t d = 0; d < t->n_dims; d++)
		n *= t->ne[d];
	uint8_t *raw = malloc(t->nbytes);
	float *out = malloc((size_t)n * sizeof(float));
	cr_assert(raw && out);
	int fd = open(m->files[t->file].path, O_RDONLY | O_CLOEXEC);
	cr_assert_geq(fd, 0);
	cr_assert_eq(pread(fd, raw, t->nbytes, (off_t)t->offset), (ssize_t)t->nbytes);
	close(fd);
	size_t rb = kgen_row_bytes(t->dtype, t->ne[0]);
	cr_assert_eq(rb * (size_t)(n / t->ne[0]), t->nbytes, "%s", t->name);
	for (int64_t r = 0; r < n / t->ne[0]; r++)
		o->dequantize_row(raw + (size_t)r * rb, out + r * t->ne[0], t->ne[0]);
	free(raw);
	*ret_n = n;
	return out;
}

/* Every quantized tensor of `name` dequantizes to finite values with a plausible spread, and
 * to within `max_nmse` of the same tensor in the Q8_0 model (made from the same F32 weights). */
static void check_model(const char *name, double max_nmse_4, double max_nmse_6)
{
	struct wf_model *m = open_ref(name), *q8 = open_ref("qwen3moe-tiny-q8_0");
	int checked = 0;

	for (uint32_t i = 0; i < m->n_tensors; i++) {
		const struct wf_tensor *t = &m->tensors[i];
		if (!wf_dtype_info(t->dtype)->quantized)
			continue;
		int64_t n, n8;
		float *v = read_dequant(m, t, &n);
		double sum = 0, sum2 = 0, amax = 0;
		for (int64_t k = 0; k < n; k++) {
			cr_assert(isfinite(v[k]), "%s[%ld]", t->name, (long)k);
			sum += v[k], sum2 += (double)v[k] * v[k], amax = fmax(amax, fabs(v[k]));
		}
		double mean = sum / n, sd = sqrt(sum2 / n - mean * mean);
		cr_assert_gt(sd, 1e-4, "%s: sd %g", t->name, sd);
		cr_assert_lt(fabs(mean), 0.2 * sd + 1e-3, "%s: mean %g sd %g", t->name, mean, sd);
		cr_assert_lt(amax, 100 * sd, "%s: max %g sd %g", t->name, amax, sd);

		const struct wf_tensor *t8 = wf_model_find_tensor(q8, t->name);
		cr_assert_not_null(t8, "%s", t->name);
		float *v8 = read_dequant(q8, t8, &n8);
		cr_assert_eq(n, n8);
		double e2 = 0, r2 = 0;
		for (int64_t k = 0; k < n; k++) {
			e2 += ((double)v[k] - v8[k]) * ((double)v[k] - v8[k]);
			r2 += (double)v8[k] * v8[k];
		}
		double lim = t->dtype == WF_DTYPE_Q6_K ? max_nmse_6 : max_nmse_4;
		cr_log_info("%s %s (%s): mean %.3g sd %.3g max %.3g, NMSE vs Q8_0 %.3g", name,
		            t->name, wf_dtype_info(t->dtype)->name, mean, sd, amax, e2 / r2);
		cr_assert_lt(e2 / r2, lim, "%s %s: NMSE vs Q8_0 %.3g", name, t->name, e2 / r2);
		free(v), free(v8);
		checked++;
	}
	cr_assert_gt(checked, 0);
	wf_model_close(m);
	wf_model_close(q8);
}

Test(kernels, reference_q8_0_tensors)
{
	struct wf_model *m = open_ref("qwen3moe-tiny-q8_0");
	int checked = 0;

	for (uint32_t i = 0; i < m->n_tensors; i++) {
		const struct wf_tensor *t = &m->tensors[i];
		if (t->dtype != WF_DTYPE_Q8_0)
			continue;
		int64_t n;
		float *v = read_dequant(m, t, &n);
		double sum = 0, sum2 = 0;
		for (int64_t k = 0; k < n; k++) {
			cr_assert(isfinite(v[k]));
			sum += v[k], sum2 += (double)v[k] * v[k];
		}
		double mean = sum / n, sd = sqrt(sum2 / n - mean * mean);
		cr_assert_gt(sd, 1e-4, "%s", t->name);
		cr_assert_lt(fabs(mean), 0.2 * sd + 1e-3, "%s: mean %g sd %g", t->name, mean, sd);
		free(v);
		checked++;
	}
	cr_assert_eq(checked, 23);
	wf_model_close(m);
}

Test(kernels, reference_q4_0_tensors)
{
	check_model("qwen3moe-tiny-q4_0", 0.02, 0.02);
}
Test(kernels, reference_q4_K_q6_K_tensors)
{
	check_model("qwen3moe-tiny-q4_k_m", 0.01, 0.002);
}

/* ---- (e) the table ------------------------------------------------------------------------- */

Test(kernels, table_types)
{
	static const struct {
		enum wf_dtype w, act;
		size_t block_bytes;
	} want[] = {
	    {WF_DTYPE_F32, WF_DTYPE_F32, 4},
	    {WF_DTYPE_F16, WF_DTYPE_F16, 2},
	    {WF_DTYPE_BF16, WF_DTYPE_BF16, 2},
	    {WF_DTYPE_Q8_0, WF_DTYPE_Q8_0, sizeof(struct wf_block_q8_0)},
	    {WF_DTYPE_Q4_0, WF_DTYPE_Q8_0, sizeof(struct wf_block_q4_0)},
	    {WF_DTYPE_Q4_K, WF_DTYPE_Q8_K, sizeof(struct wf_block_q4_K)},
	    {WF_DTYPE_Q5_K, WF_DTYPE_Q8_K, sizeof(struct wf_block_q5_K)},
	    {WF_DTYPE_Q6_K, WF_DTYPE_Q8_K, sizeof(struct wf_block_q6_K)},
	};
	int n_types = 0;

	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
		const struct wf_kernel_type_ops *o = wf_kernel_ops_type(ops(), want[i].w);
		cr_assert_not_null(o);
		cr_assert_not_null(o->dequantize_row);
		cr_assert_eq(o->vec_dot_type, want[i].act);
		cr_assert_not_null(ops()->from_float[want[i].act]);
		cr_assert_eq(wf_dtype_info(want[i].w)->type_size, want[i].block_bytes);
	}
	cr_assert_eq(wf_dtype_info(WF_DTYPE_Q8_K)->type_size, sizeof(struct wf_block_q8_K));
	for (uint32_t t = 0; t < WF_DTYPE_GGML_COUNT_; t++)
		n_types += wf_kernel_ops_type(ops(), t) != NULL;
	cr_assert_eq(n_types, 8);
	cr_assert_null(wf_kernel_ops_type(ops(), WF_DTYPE_Q2_K));
	cr_assert_null(wf_kernel_ops_type(ops(), WF_DTYPE_GGML_COUNT_));
	cr_assert_null(wf_kernel_ops_type(ops(), 1000));
	cr_assert_null(wf_kernel_ops_type(NULL, WF_DTYPE_F32));
}

/* The backends by device kind (kernels/backend.h): the host backend from the start, one table
 * per kind, refusals of anything else. */
Test(kernels, backends_registered_per_kind)
{
	const struct wf_backend_ops *host = wf_backend_host();
	cr_assert_not_null(host);
	cr_assert_str_eq(host->name, "host");
	cr_assert_eq(host->version, WF_BACKEND_OPS_VERSION);
	cr_assert(host->host_memory);
	cr_assert_eq(wf_backend_for_kind(WF_DEVICE_KIND_HOST), host);
	cr_assert_eq(wf_backend_for(NULL), host, "no device: the CPU");
	/* nothing in this process registered CUDA's */
	cr_assert_null(wf_backend_for_kind(WF_DEVICE_KIND_CUDA));
	cr_assert_null(wf_backend_for_kind(WF_DEVICE_KIND_MAX));
	struct wf_device *dev = NULL;
	struct wf_diag diag = {{0}};
	cr_assert_eq(wf_device_open("host", &dev, &diag), 0, "%s", diag.msg);
	cr_assert_eq(wf_backend_for(dev), host, "a host device finds it through its kind");
	wf_device_close(dev);
	/* Another table for a kind that has one is refused; the same again is a no-op. */
	static struct wf_backend_ops other;
	other = *host;
	other.name = "other";
	cr_assert_eq(wf_backend_register(WF_DEVICE_KIND_HOST, &other), WF_EDUPLICATE);
	cr_assert_eq(wf_backend_register(WF_DEVICE_KIND_HOST, host), 0);
	cr_assert_eq(wf_backend_register(WF_DEVICE_KIND_CUDA, &other), 0);
	cr_assert_eq(wf_backend_register(WF_DEVICE_KIND_CUDA, &other), 0);
	cr_assert_eq(wf_backend_for_kind(WF_DEVICE_KIND_CUDA), &other);
	static struct wf_backend_ops another;
	another = other;
	cr_assert_eq(wf_backend_register(WF_DEVICE_KIND_CUDA, &another), WF_EDUPLICATE);
	/* A table built against another header, a NULL one, a kind out of range. */
	static struct wf_backend_ops old;
	old = *host;
	old.version = WF_BACKEND_OPS_VERSION - 1;
	cr_assert_eq(wf_backend_register(WF_DEVICE_KIND_CUDA, &old), WF_EINVAL);
	cr_assert_eq(wf_backend_register(WF_DEVICE_KIND_CUDA, NULL), WF_EINVAL);
	cr_assert_eq(wf_backend_register(WF_DEVICE_KIND_MAX, host), WF_EINVAL);
}
