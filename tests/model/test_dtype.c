/* The dtype table against ggml at llama.cpp b10573, the kv helpers, tensor classification. */
#include "base/error.h"
#include "model/dtype.h"
#include "model/kv.h"
#include "model/model_internal.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

/* Every ggml type at b10573: number, name, elements per block, bytes per block, as printed by a
 * program compiled against that tag's ggml-common.h and type_traits (and equal to gguf-py's
 * GGML_QUANT_SIZES). */
static const struct {
	uint32_t id;
	const char *name;
	uint32_t bs, ts;
	bool q;
} ggml[] = {
    {0, "F32", 1, 4, false},        {1, "F16", 1, 2, false},        {2, "Q4_0", 32, 18, true},
    {3, "Q4_1", 32, 20, true},      {6, "Q5_0", 32, 22, true},      {7, "Q5_1", 32, 24, true},
    {8, "Q8_0", 32, 34, true},      {9, "Q8_1", 32, 36, true},      {10, "Q2_K", 256, 84, true},
    {11, "Q3_K", 256, 110, true},   {12, "Q4_K", 256, 144, true},   {13, "Q5_K", 256, 176, true},
    {14, "Q6_K", 256, 210, true},   {15, "Q8_K", 256, 292, true},   {16, "IQ2_XXS", 256, 66, true},
    {17, "IQ2_XS", 256, 74, true},  {18, "IQ3_XXS", 256, 98, true}, {19, "IQ1_S", 256, 50, true},
    {20, "IQ4_NL", 32, 18, true},   {21, "IQ3_S", 256, 110, true},  {22, "IQ2_S", 256, 82, true},
    {23, "IQ4_XS", 256, 136, true}, {24, "I8", 1, 1, false},        {25, "I16", 1, 2, false},
    {26, "I32", 1, 4, false},       {27, "I64", 1, 8, false},       {28, "F64", 1, 8, false},
    {29, "IQ1_M", 256, 56, true},   {30, "BF16", 1, 2, false},      {34, "TQ1_0", 256, 54, true},
    {35, "TQ2_0", 256, 66, true},   {39, "MXFP4", 32, 17, true},    {40, "NVFP4", 64, 36, true},
    {41, "Q1_0", 128, 18, true},    {42, "Q2_0", 64, 18, true},
};

Test(dtype, table_matches_ggml_b10573)
{
	size_t n = sizeof(ggml) / sizeof(ggml[0]);
	for (size_t i = 0; i < n; i++) {
		const struct wf_dtype_info *ti = wf_dtype_info(ggml[i].id);
		cr_assert_not_null(ti, "%s", ggml[i].name);
		cr_assert_eq(ti->dtype, ggml[i].id);
		cr_assert_str_eq(ti->name, ggml[i].name);
		cr_assert_eq(ti->block_size, ggml[i].bs, "%s", ggml[i].name);
		cr_assert_eq(ti->type_size, ggml[i].ts, "%s", ggml[i].name);
		cr_assert_eq(ti->quantized, ggml[i].q, "%s", ggml[i].name);
		enum wf_dtype d;
		cr_assert_eq(wf_dtype_from_name(ggml[i].name, &d), 0);
		cr_assert_eq(d, ggml[i].id);
	}
	/* Every other number below the count is a retired hole. */
	uint32_t holes = 0;
	for (uint32_t id = 0; id < WF_DTYPE_GGML_COUNT_; id++)
		if (!wf_dtype_info(id))
			holes++;
	cr_assert_eq(holes, WF_DTYPE_GGML_COUNT_ - n);
	uint32_t retired[] = {4, 5, 31, 32, 33, 36, 37, 38};
	for (size_t i = 0; i < sizeof(retired) / sizeof(retired[0]); i++)
		cr_assert_null(wf_dtype_info(retired[i]));
	cr_assert_eq(WF_DTYPE_GGML_COUNT_, 43);
	cr_assert_null(wf_dtype_info(WF_DTYPE_GGML_COUNT_));
	cr_assert_null(wf_dtype_info(63));
	cr_assert_null(wf_dtype_info(WF_DTYPE_MAX_));
	cr_assert_null(wf_dtype_info(UINT32_MAX));
}

Test(dtype, safetensors_types)
{
	static const struct {
		const char *name;
		enum wf_dtype d;
		uint32_t ts;
	} st[] = {
	    {"U8", WF_DTYPE_U8, 1},           {"U16", WF_DTYPE_U16, 2},
	    {"U32", WF_DTYPE_U32, 4},         {"U64", WF_DTYPE_U64, 8},
	    {"BOOL", WF_DTYPE_BOOL, 1},       {"F8_E4M3", WF_DTYPE_F8_E4M3, 1},
	    {"F8_E5M2", WF_DTYPE_F8_E5M2, 1}, {"I8", WF_DTYPE_I8, 1},
	    {"I16", WF_DTYPE_I16, 2},         {"I32", WF_DTYPE_I32, 4},
	    {"I64", WF_DTYPE_I64, 8},         {"F16", WF_DTYPE_F16, 2},
	    {"BF16", WF_DTYPE_BF16, 2},       {"F32", WF_DTYPE_F32, 4},
	    {"F64", WF_DTYPE_F64, 8},
	};
	for (size_t i = 0; i < sizeof(st) / sizeof(st[0]); i++) {
		enum wf_dtype d;
		cr_assert_eq(wf_dtype_from_name(st[i].name, &d), 0, "%s", st[i].name);
		cr_assert_eq(d, st[i].d);
		const struct wf_dtype_info *ti = wf_dtype_info(d);
		cr_assert_eq(ti->block_size, 1);
		cr_assert_eq(ti->type_size, st[i].ts);
		cr_assert(!ti->quantized);
	}
	enum wf_dtype d = WF_DTYPE_F32;
	cr_assert_eq(wf_dtype_from_name("q4_K", &d), WF_EUNKNOWN_TYPE); /* case-sensitive */
	cr_assert_eq(wf_dtype_from_name("", &d), WF_EUNKNOWN_TYPE);
	cr_assert_eq(wf_dtype_from_name(NULL, &d), WF_EUNKNOWN_TYPE);
	cr_assert_eq(d, WF_DTYPE_F32, "written on failure");
}

Test(dtype, nbytes)
{
	uint64_t n = 12345;
	int64_t q4k[3] = {256, 256, 16};
	cr_assert_eq(wf_dtype_nbytes(WF_DTYPE_Q4_K, 3, q4k, &n), 0);
	cr_assert_eq(n, 256ull * 16 * 144);
	int64_t q8[2] = {64, 3};
	cr_assert_eq(wf_dtype_nbytes(WF_DTYPE_Q8_0, 2, q8, &n), 0);
	cr_assert_eq(n, 2 * 3 * 34);
	int64_t f[2] = {5, 7};
	cr_assert_eq(wf_dtype_nbytes(WF_DTYPE_BF16, 2, f, &n), 0);
	cr_assert_eq(n, 70);
	cr_assert_eq(wf_dtype_nbytes(WF_DTYPE_F32, 0, NULL, &n), 0);
	cr_assert_eq(n, 4);
	int64_t zero[2] = {0, 1ll << 62};
	cr_assert_eq(wf_dtype_nbytes(WF_DTYPE_F32, 2, zero, &n), 0);
	cr_assert_eq(n, 0);

	n = 99;
	int64_t row[1] = {100};
	cr_assert_eq(wf_dtype_nbytes(WF_DTYPE_Q4_K, 1, row, &n), WF_EALIGN);
	cr_assert_eq(wf_dtype_nbytes(WF_DTYPE_MXFP4, 1, row, &n), WF_EALIGN);
	int64_t neg[2] = {0, -1};
	cr_assert_eq(wf_dtype_nbytes(WF_DTYPE_F32, 2, neg, &n), WF_EFORMAT);
	int64_t big[2] = {1ll << 32, 1ll << 32};
	cr_assert_eq(wf_dtype_nbytes(WF_DTYPE_I8, 2, big, &n), WF_EOVERFLOW);
	int64_t bytes[2] = {1ll << 31, 1ll << 31};
	cr_assert_eq(wf_dtype_nbytes(WF_DTYPE_I8, 2, bytes, &n), 0); /* 2^62 bytes */
	cr_assert_eq(wf_dtype_nbytes(WF_DTYPE_I16, 2, bytes, &n), WF_EOVERFLOW);
	cr_assert_eq(wf_dtype_nbytes(4, 1, row, &n), WF_EUNKNOWN_TYPE);
	int64_t nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
	cr_assert_eq(wf_dtype_nbytes(WF_DTYPE_F32, 9, nine, &n), WF_EINVAL);
	cr_assert_eq(n, 1ull << 62, "written only on success");
}

/* ---- kv ---- */

static struct wf_kv_set make_set(void)
{
	struct wf_kv_set s = {0};
	s.n = 9;
	s.items = calloc(s.n, sizeof(*s.items));
	const char *keys[] = {"u", "neg", "big", "f", "b", "s", "a", "i8", "u64max"};
	for (uint32_t i = 0; i < s.n; i++)
		s.items[i].key = strdup(keys[i]);
	s.items[0].v = (struct wf_kv_value){.type = WF_KV_U32, .u.u64 = 7};
	s.items[1].v = (struct wf_kv_value){.type = WF_KV_I32, .u.i64 = -3};
	s.items[2].v = (struct wf_kv_value){.type = WF_KV_U64, .u.u64 = (1ull << 53) + 1};
	s.items[3].v = (struct wf_kv_value){.type = WF_KV_F32, .u.f64 = 1.5};
	s.items[4].v = (struct wf_kv_value){.type = WF_KV_BOOL, .u.u64 = 1};
	s.items[5].v.type = WF_KV_STRING;
	s.items[5].v.u.str.s = strdup("text");
	s.items[5].v.u.str.n = 4;
	s.items[6].v.type = WF_KV_ARRAY;
	s.items[6].v.u.arr.elem = WF_KV_ARRAY;
	s.items[6].v.u.arr.n = 1;
	s.items[6].v.u.arr.u.arrays = calloc(1, sizeof(struct wf_kv_array));
	s.items[6].v.u.arr.u.arrays[0].elem = WF_KV_STRING;
	s.items[6].v.u.arr.u.arrays[0].n = 2;
	s.items[6].v.u.arr.u.arrays[0].u.strs = calloc(2, sizeof(struct wf_kv_str));
	s.items[6].v.u.arr.u.arrays[0].u.strs[0].s = strdup("x");
	s.items[6].v.u.arr.u.arrays[0].u.strs[1].s = strdup("y");
	s.items[7].v = (struct wf_kv_value){.type = WF_KV_I8, .u.i64 = 5};
	s.items[8].v = (struct wf_kv_value){.type = WF_KV_U64, .u.u64 = UINT64_MAX};
	return s;
}

Test(kv, getters_convert_only_losslessly)
{
	struct wf_kv_set s = make_set();
	uint64_t u;
	int64_t i;
	double f;
	bool b;
	const char *str;
	const struct wf_kv_array *a;

	cr_assert_eq(wf_kv_get_u64(&s, "u", &u), 0);
	cr_assert_eq(u, 7);
	cr_assert_eq(wf_kv_get_i64(&s, "u", &i), 0);
	cr_assert_eq(i, 7);
	cr_assert_eq(wf_kv_get_f64(&s, "u", &f), 0);
	cr_assert_eq(f, 7.0);
	cr_assert_eq(wf_kv_get_u64(&s, "neg", &u), WF_EFORMAT);
	cr_assert_eq(wf_kv_get_i64(&s, "neg", &i), 0);
	cr_assert_eq(i, -3);
	cr_assert_eq(wf_kv_get_f64(&s, "neg", &f), 0);
	cr_assert_eq(f, -3.0);
	cr_assert_eq(wf_kv_get_f64(&s, "big", &f), WF_EFORMAT, "2^53+1 is not exact in a double");
	cr_assert_eq(wf_kv_get_i64(&s, "u64max", &i), WF_EFORMAT);
	cr_assert_eq(wf_kv_get_u64(&s, "u64max", &u), 0);
	cr_assert_eq(u, UINT64_MAX);
	cr_assert_eq(wf_kv_get_i64(&s, "i8", &i), 0);
	cr_assert_eq(i, 5);
	cr_assert_eq(wf_kv_get_u64(&s, "i8", &u), 0);
	cr_assert_eq(u, 5);
	cr_assert_eq(wf_kv_get_f64(&s, "f", &f), 0);
	cr_assert_eq(f, 1.5);
	cr_assert_eq(wf_kv_get_u64(&s, "f", &u), WF_EFORMAT);
	cr_assert_eq(wf_kv_get_bool(&s, "b", &b), 0);
	cr_assert(b);
	cr_assert_eq(wf_kv_get_u64(&s, "b", &u), WF_EFORMAT);
	cr_assert_eq(wf_kv_get_bool(&s, "u", &b), WF_EFORMAT);
	cr_assert_eq(wf_kv_get_str(&s, "s", &str), 0);
	cr_assert_str_eq(str, "text");
	cr_assert_eq(wf_kv_get_str(&s, "u", &str), WF_EFORMAT);
	cr_assert_eq(wf_kv_get_array(&s, "a", &a), 0);
	cr_assert_eq(a->n, 1);
	cr_assert_str_eq(a->u.arrays[0].u.strs[1].s, "y");
	cr_assert_eq(wf_kv_get_array(&s, "s", &a), WF_EFORMAT);
	cr_assert_eq(wf_kv_get_u64(&s, "absent", &u), WF_ENOT_FOUND);
	cr_assert_eq(wf_kv_get_str(&s, "absent", &str), WF_ENOT_FOUND);
	cr_assert_null(wf_kv_find(&s, "absent"));
	cr_assert_null(wf_kv_find(NULL, "u"));
	cr_assert_eq(wf_kv_find(&s, "f"), &s.items[3]);

	wf_kv_set_fini(&s);
	cr_assert_eq(s.n, 0);
	cr_assert_null(s.items);
	wf_kv_set_fini(&s); /* again: empty is fine */
	wf_kv_value_fini(NULL);
	wf_kv_array_fini(NULL);
}

Test(kv, type_sizes_and_names)
{
	cr_assert_eq(wf_kv_type_size(WF_KV_U8), 1);
	cr_assert_eq(wf_kv_type_size(WF_KV_BOOL), 1);
	cr_assert_eq(wf_kv_type_size(WF_KV_I16), 2);
	cr_assert_eq(wf_kv_type_size(WF_KV_F32), 4);
	cr_assert_eq(wf_kv_type_size(WF_KV_F64), 8);
	cr_assert_eq(wf_kv_type_size(WF_KV_STRING), 0);
	cr_assert_eq(wf_kv_type_size(WF_KV_ARRAY), 0);
	cr_assert_eq(wf_kv_type_size((enum wf_kv_type)99), 0);
	cr_assert_str_eq(wf_kv_type_name(WF_KV_U8), "u8");
	cr_assert_str_eq(wf_kv_type_name(WF_KV_I32), "i32");
	cr_assert_str_eq(wf_kv_type_name(WF_KV_STRING), "string");
	cr_assert_str_eq(wf_kv_type_name(WF_KV_ARRAY), "array");
	cr_assert_str_eq(wf_kv_type_name(WF_KV_F64), "f64");
	cr_assert_str_eq(wf_kv_type_name((enum wf_kv_type)99), "invalid");
}

Test(classify, expert_and_dense_names)
{
	static const char *const experts[] = {
	    "blk.0.ffn_gate_exps.weight",
	    "blk.12.ffn_up_exps.weight",
	    "blk.1.ffn_down_exps.weight",
	    "blk.3.ffn_gate_up_exps.weight",
	    "blk.0.ffn_down_exps.bias",
	    "blk.0.ffn_gate.3.weight", /* pre-merge Mixtral GGUF */
	    "model.layers.0.mlp.experts.3.gate_proj.weight",
	    "model.layers.0.block_sparse_moe.experts.7.w2.weight",
	    "model.layers.5.mlp.experts.gate_up_proj",
	    "model.layers.5.mlp.experts.down_proj_bias",
	};
	static const char *const dense[] = {
	    "token_embd.weight",
	    "blk.0.ffn_gate_inp.weight",
	    "blk.0.ffn_gate.weight",
	    "blk.0.ffn_gate_shexp.weight",
	    "blk.0.ffn_down_shexp.weight",
	    "blk.0.ffn_gate_inp_shexp.weight",
	    "blk.0.exp_probs_b.bias",
	    "blk.0.attn_q.weight",
	    "model.layers.0.mlp.gate.weight",
	    "model.layers.0.mlp.shared_expert.gate_proj.weight",
	    "model.layers.0.mlp.shared_experts.gate_proj.weight",
	    "model.layers.0.mlp.shared_expert_gate.weight",
	    "model.layers.0.block_sparse_moe.gate.weight",
	    "model.layers.0.mlp.router.weight",
	    "model.layers.0.mlp.gate.e_score_correction_bias",
	    "myexperts.3.weight",
	    "",
	};
	for (size_t i = 0; i < sizeof(experts) / sizeof(experts[0]); i++)
		cr_assert_eq(wf__tensor_classify(experts[i]), WF_TENSOR_EXPERT, "%s", experts[i]);
	for (size_t i = 0; i < sizeof(dense) / sizeof(dense[0]); i++)
		cr_assert_eq(wf__tensor_classify(dense[i]), WF_TENSOR_DENSE, "%s", dense[i]);
	cr_assert_eq(wf__tensor_classify(NULL), WF_TENSOR_DENSE);
}
