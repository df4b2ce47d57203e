/* `wf-worker tokenize --model FILE TEXT` prints llama.cpp's ids for each reference model, as its
 * last line. */
#include "common/wftest.h"

#include <criterion/criterion.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

TestSuite(tokenize_cli, .timeout = 120);

static const char *const models[] = {
    "mixtral-tiny-f32",     "qwen3moe-tiny-q8_0",         "qwen3moe-tiny-q4_0",
    "qwen3moe-tiny-q4_k_m", "qwen3moe-tiny-q4_k_m-split",
};

Test(tokenize_cli, prints_the_manifest_ids)
{
	const char *r = wft_reference_dir();
	cr_assert_not_null(r, "tests/data/reference/ is missing");
	char *tmp = wft_tmpdir("tokcli");
	char *out = NULL;
	cr_assert(asprintf(&out, "%s/out", tmp) > 0);
	for (size_t i = 0; i < sizeof(models) / sizeof(models[0]); i++) {
		char *mp = NULL, *gguf = NULL;
		cr_assert(asprintf(&mp, "%s/%s/manifest.json", r, models[i]) > 0);
		json_object *man = json_object_from_file(mp), *v, *tt, *ids;
		cr_assert_not_null(man, "%s", mp);
		cr_assert(json_object_object_get_ex(man, "load_this_file", &v));
		cr_assert(asprintf(&gguf, "%s/%s/%s", r, models[i], json_object_get_string(v)) > 0);
		cr_assert(json_object_object_get_ex(man, "tokenizer_test", &tt));
		cr_assert(json_object_object_get_ex(tt, "text", &v));
		cr_assert(json_object_object_get_ex(tt, "ids", &ids));
		char want[4096] = "";
		for (size_t k = 0; k < json_object_array_length(ids); k++)
			snprintf(want + strlen(want), sizeof(want) - strlen(want), "%s%d",
			         k ? "," : "",
			         json_object_get_int(json_object_array_get_idx(ids, k)));
		char *argv[] = {wft_exe("worker/wf-worker"),       "tokenize", "--model", gguf,
		                (char *)json_object_get_string(v), NULL};
		int st = wft_run(argv, out, NULL, 60);
		cr_assert_eq(st, 0, "%s: wf-worker tokenize exited %d", models[i], st);
		char *text = wft_read_file(out, NULL);
		cr_assert_not_null(text);
		size_t tl = strlen(text);
		while (tl && text[tl - 1] == '\n')
			text[--tl] = 0;
		const char *last = strrchr(text, '\n');
		last = last ? last + 1 : text;
		cr_assert_str_eq(last, want, "%s", models[i]);
		free(text);
		free(gguf);
		free(mp);
		json_object_put(man);
	}
	/* a model that is not there: a clear error and a non-zero exit */
	char *argv[] = {wft_exe("worker/wf-worker"), "tokenize", "--model",
	                "/nonexistent.gguf",         "x",        NULL};
	cr_assert_eq(wft_run(argv, out, NULL, 60), 1);
	free(out);
	wft_rmtree(tmp);
}
