#include "tests/agent/agt_json.h"

#include <criterion/criterion.h>
#include <json-c/json.h>
#include <string.h>

struct json_object *agt_json_parse(const char *text, const char *what)
{
	struct json_tokener *tok = json_tokener_new();
	struct json_object *o = json_tokener_parse_ex(tok, text, (int)strlen(text));
	cr_assert_not_null(o, "%s: not JSON: %s", what, text);
	/* exactly one document: only blanks after it */
	size_t off = json_tokener_get_parse_end(tok);
	cr_assert(strspn(text + off, " \n") == strlen(text + off), "%s: more than one document: %s",
	          what, text);
	json_tokener_free(tok);
	return o;
}

struct json_object *agt_json_key(struct json_object *o, const char *k)
{
	struct json_object *v = NULL;
	cr_assert(json_object_object_get_ex(o, k, &v), "no key '%s' in %s", k,
	          json_object_to_json_string(o));
	return v;
}
