/* Random but valid weights, generated straight into ggml's block formats.
 *
 * Every type aims at weights with a given mean and std once dequantized; the quantized blocks are
 * built from random codes rather than by quantizing floats, which is both faster and guaranteed
 * in range. Block layouts follow ggml-common.h and the dequantize_row_* functions of
 * ggml-quants.c (llama.cpp b10573):
 *   Q8_0: f16 d | int8 q[32]                       w = d*q
 *   Q4_0: f16 d | u8 qs[16]                        w = d*(nibble - 8); low nibbles are elements
 *                                                  0..15, high nibbles 16..31
 *   Q4_K: f16 d | f16 dmin | u8 scales[12] | u8 qs[128]
 *         8 sub-blocks of 32 with 6-bit scale sc and min m: w = d*sc*q - dmin*m
 *   Q6_K: u8 ql[128] | u8 qh[64] | int8 scales[16] | f16 d
 *         16 sub-blocks of 16: w = d*scale*(q6 - 32)
 * Sub-block scales are positive and drawn from a range picked per tensor (scale_range()).
 * Codes are drawn so that the weights have mean zero: Q4_0 and Q6_K never use their lone most
 * negative code (it is replaced by the zero code), Q4_K uses dmin = 7.5*d and m = sc so that
 * w = d*sc*(q - 7.5). */
#include "gen.h"

#include <math.h>
#include <string.h>

/* ---- PRNG: wyrand (one 64x64->128 multiply per 64 bits), seeded through splitmix64 -------- */

static inline uint64_t splitmix64(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

struct rng {
	uint64_t s;
};

static inline uint64_t rng_next(struct rng *r)
{
	r->s += 0xa0761d6478bd642full;
	__uint128_t t = (__uint128_t)r->s * (r->s ^ 0xe7037ed1a0b428dbull);
	return (uint64_t)(t >> 64) ^ (uint64_t)t;
}

/* Uniform in [0, 1) from the top 24 bits. */
static inline float rng_unit(struct rng *r)
{
	return (float)(rng_next(r) >> 40) * (1.0f / 16777216.0f);
}

uint64_t gen_tensor_seed(uint64_t seed, const char *name)
{
	uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a of the name */
	for (; *name; name++)
		h = (h ^ (uint8_t)*name) * 0x100000001b3ull;
	return splitmix64(splitmix64(seed) ^ h);
}

static void rng_group(struct rng *r, uint64_t tensor_seed, uint64_t group)
{
	r->s = splitmix64(tensor_seed ^ splitmix64(group + 0x632be59bd9b4e019ull));
}

/* ---- float conversions -------------------------------------------------------------------- */

uint16_t gen_f32_to_f16(float f)
{
	uint32_t x;
	memcpy(&x, &f, 4);
	uint32_t sign = (x >> 16) & 0x8000u;
	uint32_t ax = x & 0x7fffffffu;
	if (ax >= 0x7f800000u) /* inf or nan */
		return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0));
	if (ax >= 0x477ff000u) /* rounds to >= 65520: overflow to inf */
		return (uint16_t)(sign | 0x7c00u);
	if (ax < 0x38800000u) {       /* below 2^-14: subnormal half (or zero) */
		if (ax < 0x33000000u) /* below 2^-25: rounds to zero */
			return (uint16_t)sign;
		uint32_t e = ax >> 23;
		uint32_t m = (ax & 0x7fffffu) | 0x800000u;
		uint32_t shift = 126 - e; /* value m * 2^(e - 150) in units of 2^-24 */
		uint32_t q = m >> shift;
		uint32_t rem = m & ((1u << shift) - 1);
		uint32_t half = 1u << (shift - 1);
		if (rem > half || (rem == half && (q & 1)))
			q++;
		return (uint16_t)(sign | q);
	}
	/* normal: rebias the exponent, round the mantissa to 10 bits, nearest even */
	uint32_t r = ax - 0x38000000u; /* exponent -112 */
	uint32_t q = r >> 13;
	uint32_t rem = r & 0x1fffu;
	if (rem > 0x1000u || (rem == 0x1000u && (q & 1)))
		q++;
	return (uint16_t)(sign | q);
}

uint16_t gen_f32_to_bf16(float f)
{
	uint32_t x;
	memcpy(&x, &f, 4);
	if ((x & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((x >> 16) | 0x40u); /* quiet nan */
	x += 0x7fffu + ((x >> 16) & 1u);
	return (uint16_t)(x >> 16);
}

static float f16_to_f32(uint16_t h)
{
	/* Only for the block scales this file makes, which are finite and normal (f16_scale()). */
	uint32_t x =
	    ((uint32_t)(h & 0x8000u) << 16) | (((uint32_t)(h & 0x7fffu) << 13) + 0x38000000u);
	float v;
	memcpy(&v, &x, 4);
	return v;
}

/* ---- per type ----------------------------------------------------------------------------- */

/* Triangular(-1, 1) from one 64-bit draw: variance 1/6, so scale by sqrt(6) for unit std. */
static inline float tri(struct rng *r)
{
	uint64_t x = rng_next(r);
	float a = (float)(uint32_t)x, b = (float)(uint32_t)(x >> 32);
	return (a + b) * (1.0f / 4294967296.0f) - 1.0f;
}

#define SQRT6 2.44948974278f

static void fill_f32(const struct gen_tensor *t, struct rng *r, uint64_t n, float *out)
{
	float k = t->std * SQRT6, mu = t->mean;
	for (uint64_t i = 0; i < n; i++)
		out[i] = mu + k * tri(r);
}

static void fill_f16(const struct gen_tensor *t, struct rng *r, uint64_t n, uint16_t *out)
{
	float k = t->std * SQRT6, mu = t->mean;
	for (uint64_t i = 0; i < n; i++)
		out[i] = gen_f32_to_f16(mu + k * tri(r));
}

static void fill_bf16(const struct gen_tensor *t, struct rng *r, uint64_t n, uint16_t *out)
{
	float k = t->std * SQRT6, mu = t->mean;
	for (uint64_t i = 0; i < n; i++)
		out[i] = gen_f32_to_bf16(mu + k * tri(r));
}

/* Per-block scale jitter, uniform in [0.75, 1.25): blocks of a real model do not share one scale.
 * Its mean square is 1 + 1/48, which the block scales divide out. */
static inline float jitter(struct rng *r)
{
	return 0.75f + 0.5f * rng_unit(r);
}
#define JITTER_RMS 1.01036297f

/* Scales stored as f16: keep them normal and finite even for absurd std requests. */
static uint16_t f16_scale(float d)
{
	if (!(d >= 6.2e-5f))
		d = 6.2e-5f;
	if (d > 60000.0f)
		d = 60000.0f;
	return gen_f32_to_f16(d);
}

static void fill_q8_0(const struct gen_tensor *t, struct rng *r, uint64_t nb, uint8_t *out)
{
	/* Codes uniform on [-127, 127] with -128 folded onto 0: std sqrt(5397.5). */
	const float base = t->std / (73.4677f * JITTER_RMS);
	for (uint64_t b = 0; b < nb; b++, out += 34) {
		uint16_t d = f16_scale(base * jitter(r));
		memcpy(out, &d, 2);
		for (int i = 0; i < 4; i++) {
			uint64_t x = rng_next(r);
			memcpy(out + 2 + 8 * i, &x, 8);
		}
		for (int i = 0; i < 32; i++)
			if (out[2 + i] == 0x80)
				out[2 + i] = 0;
	}
}

static void fill_q4_0(const struct gen_tensor *t, struct rng *r, uint64_t nb, uint8_t *out)
{
	/* Nibbles 1..15 with 0 folded onto 8: codes -7..7, mean 0, std sqrt(17.5). */
	const float base = t->std / (4.18330f * JITTER_RMS);
	for (uint64_t b = 0; b < nb; b++, out += 18) {
		uint16_t d = f16_scale(base * jitter(r));
		memcpy(out, &d, 2);
		uint64_t x[2] = {rng_next(r), rng_next(r)};
		memcpy(out + 2, x, 16);
		for (int i = 0; i < 16; i++) {
			uint8_t v = out[2 + i];
			if ((v & 0x0f) == 0)
				v |= 0x08;
			if ((v & 0xf0) == 0)
				v |= 0x80;
			out[2 + i] = v;
		}
	}
}

/* Sub-block scales are drawn uniformly from [hi/2, hi]. hi is the largest of the ladder that
 * keeps the f16 super-block scale d a normal number for this std: the 6-bit (Q4_K) or 8-bit
 * (Q6_K) sub-block scales leave the rest of the magnitude to d, and a small std with large
 * sub-block scales would push d into f16 subnormals. */
static void scale_range(float std, float code_std, const int *ladder, int n, int *ret_lo,
                        int *ret_hi, float *ret_rms)
{
	int lo = 0, hi = 0;
	float rms = 0;
	for (int i = 0; i < n; i++) {
		hi = ladder[i];
		lo = (hi + 1) / 2;
		float mean = 0.5f * (float)(lo + hi), span = (float)(hi - lo + 1);
		rms = sqrtf(mean * mean + (span * span - 1.0f) / 12.0f);
		if (std / (rms * code_std * JITTER_RMS) * 0.75f >= 6.2e-5f)
			break;
	}
	*ret_lo = lo;
	*ret_hi = hi;
	*ret_rms = rms;
}

static void fill_q4_k(const struct gen_tensor *t, struct rng *r, uint64_t nb, uint8_t *out)
{
	/* q uniform on 0..15 around 7.5: code std sqrt(21.25). */
	static const int ladder[] = {63, 31, 15, 7};
	int lo, hi;
	float rms;
	scale_range(t->std, 4.60977f, ladder, 4, &lo, &hi, &rms);
	const uint64_t mask = (uint64_t)(hi - lo); /* span is a power of two */
	const float base = t->std / (rms * 4.60977f * JITTER_RMS);
	for (uint64_t b = 0; b < nb; b++, out += 144) {
		float df = base * jitter(r);
		uint16_t d = f16_scale(df);
		uint16_t dmin = f16_scale(7.5f * f16_to_f32(d));
		memcpy(out, &d, 2);
		memcpy(out + 2, &dmin, 2);
		uint8_t sc[8];
		uint64_t x = rng_next(r);
		for (int j = 0; j < 8; j++)
			sc[j] = (uint8_t)(lo + (int)((x >> (8 * j)) & mask));
		/* 6-bit packing read back by get_scale_min_k4(): scales and mins of sub-blocks 0..3
		 * in the low 6 bits of bytes 0..3 / 4..7; sub-blocks 4..7 keep their low 4 bits in
		 * bytes 8..11 (scale low nibble, min high nibble) and their top 2 bits in the top
		 * bits of bytes 0..3 (scales) and 4..7 (mins). Here min == scale. */
		uint8_t *s = out + 4;
		for (int j = 0; j < 4; j++) {
			uint8_t up = sc[j + 4];
			s[j] = (uint8_t)(sc[j] | ((up >> 4) << 6));
			s[j + 4] = (uint8_t)(sc[j] | ((up >> 4) << 6));
			s[j + 8] = (uint8_t)((up & 0x0f) | ((up & 0x0f) << 4));
		}
		for (int i = 0; i < 16; i++) {
			uint64_t q = rng_next(r);
			memcpy(out + 16 + 8 * i, &q, 8);
		}
	}
}

static void fill_q6_k(const struct gen_tensor *t, struct rng *r, uint64_t nb, uint8_t *out)
{
	/* codes -31..31: code std sqrt(325.5) */
	static const int ladder[] = {127, 63, 31, 15, 7};
	int lo, hi;
	float rms;
	scale_range(t->std, 18.0416f, ladder, 5, &lo, &hi, &rms);
	const float span = (float)(hi - lo + 1);
	const float base = t->std / (rms * 18.0416f * JITTER_RMS);
	for (uint64_t b = 0; b < nb; b++, out += 210) {
		uint8_t *ql = out, *qh = out + 128;
		int8_t *scales = (int8_t *)(out + 192);
		for (int i = 0; i < 24; i++) {
			uint64_t q = rng_next(r);
			memcpy(out + 8 * i, &q, 8); /* ql and qh: 192 random bytes */
		}
		for (int i = 0; i < 16; i++)
			scales[i] = (int8_t)(lo + (int)(rng_unit(r) * span));
		uint16_t d = f16_scale(base * jitter(r));
		memcpy(out + 208, &d, 2);
		/* The code q6 = 0 (-32 once dequantized) has no positive twin: make it 32 (zero) by
		 * setting the high bits to 2. Element layout per half of 128 as in
		 * dequantize_row_q6_K: ql[l] low/high nibble and ql[l+32] low/high nibble pair with
		 * bit pairs 0,2,4,6 of qh[l]. */
		for (int h = 0; h < 2; h++) {
			uint8_t *L = ql + 64 * h, *H = qh + 32 * h;
			for (int l = 0; l < 32; l++) {
				uint8_t hb = H[l];
				if ((L[l] & 0x0f) == 0 && ((hb >> 0) & 3) == 0)
					hb |= 2u << 0;
				if ((L[l + 32] & 0x0f) == 0 && ((hb >> 2) & 3) == 0)
					hb |= 2u << 2;
				if ((L[l] >> 4) == 0 && ((hb >> 4) & 3) == 0)
					hb |= 2u << 4;
				if ((L[l + 32] >> 4) == 0 && ((hb >> 6) & 3) == 0)
					hb |= 2u << 6;
				H[l] = hb;
			}
		}
	}
}

void gen_fill(const struct gen_tensor *t, uint64_t first, uint64_t n, void *out)
{
	const struct wf_dtype_info *ti = wf_dtype_info(t->dtype);
	uint8_t *p = out;
	uint64_t group = first / GEN_GROUP;
	/* Float types draw exactly one number per element, so a start inside a group is a jump of
	 * the (additive) wyrand state; block types always start on a group. */
	uint64_t skip = ti->block_size == 1 ? first % GEN_GROUP : 0;
	while (n) {
		uint64_t take = GEN_GROUP - skip;
		if (take > n)
			take = n;
		struct rng r;
		rng_group(&r, t->seed, group);
		r.s += skip * 0xa0761d6478bd642full;
		skip = 0;
		uint64_t nb = take / ti->block_size;
		switch (t->dtype) {
		case WF_DTYPE_F32:
			fill_f32(t, &r, take, (float *)(void *)p);
			break;
		case WF_DTYPE_F16:
			fill_f16(t, &r, take, (uint16_t *)(void *)p);
			break;
		case WF_DTYPE_BF16:
			fill_bf16(t, &r, take, (uint16_t *)(void *)p);
			break;
		case WF_DTYPE_Q8_0:
			fill_q8_0(t, &r, nb, p);
			break;
		case WF_DTYPE_Q4_0:
			fill_q4_0(t, &r, nb, p);
			break;
		case WF_DTYPE_Q4_K:
			fill_q4_k(t, &r, nb, p);
			break;
		case WF_DTYPE_Q6_K:
			fill_q6_k(t, &r, nb, p);
			break;
		default:
			memset(p, 0, nb * ti->type_size); /* unreachable: the plan checks types */
			break;
		}
		p += nb * ti->type_size;
		n -= take;
		group++;
	}
}
