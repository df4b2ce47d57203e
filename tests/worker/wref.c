/* Reference models for the completion suites. */
#include "tests/worker/wref.h"

#include "common/wftest.h"
#include "tests/agent/agt.h"

#include <criterion/criterion.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char *wref_model(const char *folder, char *prompt, size_t cap)
{
	char *dir = agt_printf("%s/%s", wft_reference_dir(), folder);
	char *mp = agt_printf("%s/manifest.json", dir);
	json_object *man = json_object_from_file(mp), *v = NULL;
	cr_assert_not_null(man, "cannot parse %s", mp);
	cr_assert(json_object_object_get_ex(man, "load_this_file", &v));
	char *gguf = agt_printf("%s/%s", dir, json_object_get_string(v));
	cr_assert(json_object_object_get_ex(man, "prompt_ids", &v));
	prompt[0] = 0;
	for (size_t i = 0; i < json_object_array_length(v); i++)
		snprintf(prompt + strlen(prompt), cap - strlen(prompt), "%s%d", i ? "," : "",
		         json_object_get_int(json_object_array_get_idx(v, i)));
	json_object_put(man);
	free(dir);
	free(mp);
	return gguf;
}
