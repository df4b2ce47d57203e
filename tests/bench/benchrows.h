/* Reading wf-bench's JSON lines in the bench suites: the row of a metric and its fields, every
 * line required to parse. */
#ifndef WFT_BENCH_BENCHROWS_H
#define WFT_BENCH_BENCHROWS_H

#include <criterion/criterion.h>
#include <json-c/json.h>
#include <stdlib.h>
#include <string.h>

/* The JSON line whose metric is name (a new reference), or NULL; every line must parse. */
static inline struct json_object *row(const char *out, const char *name)
{
	char *copy = strdup(out), *save = NULL;
	struct json_object *found = NULL;
	for (char *l = strtok_r(copy, "\n", &save); l && !found; l = strtok_r(NULL, "\n", &save)) {
		struct json_object *j = json_tokener_parse(l), *m;
		cr_assert(j, "not a JSON line: %s", l);
		if (json_object_object_get_ex(j, "metric", &m) &&
		    strcmp(json_object_get_string(m), name) == 0)
			found = j;
		else
			json_object_put(j);
	}
	free(copy);
	return found;
}

static inline double num(struct json_object *j, const char *key)
{
	struct json_object *v;
	cr_assert(json_object_object_get_ex(j, key, &v), "no %s in %s", key,
	          json_object_to_json_string(j));
	return json_object_get_double(v);
}

static inline const char *str(struct json_object *j, const char *key)
{
	struct json_object *v;
	cr_assert(json_object_object_get_ex(j, key, &v), "no %s in %s", key,
	          json_object_to_json_string(j));
	return json_object_get_string(v);
}

#endif
