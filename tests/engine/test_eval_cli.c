/* `wf-worker eval` as a process: the greedy ids of the strict reference model, logits rows in the
 * reference layout, and exit codes for bad flags and models it cannot run. */
#include "common/wftest.h"

#include <criterion/criterion.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

TestSuite(eval_cli, .timeout = 120);

static const char prompt[] = "1,17,300,42,99,7,256,311,5,63,128,400,2,77,150,203";

static char *last_line(const char *path)
{
	char *text = wft_read_file(path, NULL);
	cr_assert_not_null(text);
	size_t tl = strlen(text);
	while (tl && text[tl - 1] == '\n')
		text[--tl] = 0;
	const char *last = strrchr(text, '\n');
	char *r = strdup(last ? last + 1 : text);
	free(text);
	return r;
}

Test(eval_cli, greedy_ids_and_logits_rows)
{
	const char *r = wft_reference_dir();
	char *tmp = wft_tmpdir("evalcli");
	char *out = NULL, *bin = NULL, *gguf = NULL, *mp = NULL;
	cr_assert(asprintf(&out, "%s/out", tmp) > 0);
	cr_assert(asprintf(&bin, "%s/logits.bin", tmp) > 0);
	cr_assert(asprintf(&gguf, "%s/mixtral-tiny-f32/mixtral-tiny-f32.gguf", r) > 0);
	cr_assert(asprintf(&mp, "%s/mixtral-tiny-f32/manifest.json", r) > 0);
	json_object *man = json_object_from_file(mp), *ids, *hp, *nv;
	cr_assert_not_null(man);
	cr_assert(json_object_object_get_ex(man, "generated_ids", &ids));
	cr_assert(json_object_object_get_ex(man, "hparams", &hp));
	cr_assert(json_object_object_get_ex(hp, "n_vocab", &nv));
	char want[1024] = "";
	for (size_t k = 0; k < 16; k++)
		snprintf(want + strlen(want), sizeof(want) - strlen(want), "%s%d", k ? "," : "",
		         json_object_get_int(json_object_array_get_idx(ids, k)));
	char *exe = wft_exe("worker/wf-worker");
	char *argv[] = {exe,          "eval", "--model",  gguf, "--prompt",  (char *)prompt,
	                "--generate", "16",   "--logits", bin,  "--threads", "2",
	                NULL};
	cr_assert_eq(wft_run(argv, out, NULL, 60), 0);
	char *line = last_line(out);
	cr_expect_str_eq(line, want);
	size_t len = 0;
	char *logits = wft_read_file(bin, &len);
	cr_assert_not_null(logits);
	cr_expect_eq(len, 32u * (size_t)json_object_get_int(nv) * sizeof(float),
	             "16 prompt rows and 16 generated rows, got %zu bytes", len);
	free(logits);
	free(line);

	/* Bad flags: 2. A model that cannot be run: 1, with the reason. */
	char *bad1[] = {exe, "eval", "--model", gguf, "--prompt", "1,x", NULL};
	cr_expect_eq(wft_run(bad1, out, NULL, 60), 2);
	char *bad2[] = {exe,      "eval", "--model",    gguf, "--prompt", "1",
	                "--feed", "2",    "--generate", "3",  NULL};
	cr_expect_eq(wft_run(bad2, out, NULL, 60), 2);
	char *bad3[] = {exe, "eval", "--model", gguf, "--prompt", "1", "--threads", "0", NULL};
	cr_expect_eq(wft_run(bad3, out, NULL, 60), 2);
	char *toolong[] = {exe,     "eval", "--model", gguf, "--prompt", (char *)prompt,
	                   "--ctx", "8",    NULL};
	char *err = NULL;
	cr_assert(asprintf(&err, "%s/err", tmp) > 0);
	cr_expect_eq(wft_run(toolong, out, err, 60), 1);
	char *msg = wft_read_file(err, NULL);
	cr_expect(msg && strstr(msg, "context length"), "%s", msg ? msg : "");
	free(msg);
	char *oov[] = {exe, "eval", "--model", gguf, "--prompt", "1,99999", NULL};
	cr_expect_eq(wft_run(oov, out, NULL, 60), 1);
	char *missing[] = {exe, "eval", "--model", "/nonexistent.gguf", "--prompt", "1", NULL};
	cr_expect_eq(wft_run(missing, out, NULL, 60), 1);
	json_object_put(man);
	free(err);
	free(exe);
	free(out);
	free(bin);
	free(gguf);
	free(mp);
	wft_rmtree(tmp);
}
