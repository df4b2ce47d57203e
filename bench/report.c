#include "report.h"

#include <json-c/json.h>
#include <stdio.h>
#include <string.h>

static bool as_json;
static bool header_done;

void bench_report_init(bool json)
{
	as_json = json;
}

static bool passes(const struct bench_result *r)
{
	return strcmp(r->goal_op, ">=") == 0 ? r->ratio >= r->goal : r->ratio <= r->goal;
}

static void header(void)
{
	if (header_done)
		return;
	header_done = true;
	printf("%-10s %-28s %14s %-8s %-34s %14s %8s %10s\n", "BENCH", "METRIC", "VALUE", "UNIT",
	       "ANCHOR", "ANCHOR VALUE", "RATIO", "GOAL");
}

void bench_report(const struct bench_result *r)
{
	if (as_json) {
		struct json_object *o = json_object_new_object();
		json_object_object_add(o, "bench", json_object_new_string(r->bench));
		json_object_object_add(o, "metric", json_object_new_string(r->metric));
		json_object_object_add(o, "value", json_object_new_double(r->value));
		json_object_object_add(o, "unit", json_object_new_string(r->unit));
		json_object_object_add(o, "anchor", json_object_new_string(r->anchor));
		json_object_object_add(o, "anchor_value", json_object_new_double(r->anchor_value));
		json_object_object_add(o, "ratio", json_object_new_double(r->ratio));
		if (r->goal_op) { /* rows without a goal here (figures for the record) have none */
			json_object_object_add(o, "goal", json_object_new_double(r->goal));
			json_object_object_add(o, "goal_op", json_object_new_string(r->goal_op));
			json_object_object_add(o, "pass", json_object_new_boolean(passes(r)));
		}
		if (r->notes)
			json_object_object_add(o, "notes", json_object_new_string(r->notes));
		if (r->kernels)
			json_object_object_add(o, "kernels", json_object_new_string(r->kernels));
		puts(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN |
		                                           JSON_C_TO_STRING_NOSLASHESCAPE));
		json_object_put(o);
	} else {
		header();
		char goal[32];
		if (r->goal_op)
			snprintf(goal, sizeof goal, "%s %.2f%s", r->goal_op, r->goal,
			         passes(r) ? "" : " !");
		else
			snprintf(goal, sizeof goal, "-");
		printf("%-10s %-28s %14.4g %-8s %-34s %14.4g %8.3f %10s\n", r->bench, r->metric,
		       r->value, r->unit, r->anchor, r->anchor_value, r->ratio, goal);
		if (r->notes)
			printf("%-10s   note: %s\n", "", r->notes);
		if (r->kernels)
			printf("%-10s   kernels: %s\n", "", r->kernels);
	}
	fflush(stdout);
}

void bench_skip(const char *bench, const char *metric, const char *reason)
{
	if (as_json) {
		struct json_object *o = json_object_new_object();
		json_object_object_add(o, "bench", json_object_new_string(bench));
		json_object_object_add(o, "metric", json_object_new_string(metric));
		json_object_object_add(o, "skipped", json_object_new_string(reason));
		puts(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN |
		                                           JSON_C_TO_STRING_NOSLASHESCAPE));
		json_object_put(o);
	} else {
		header();
		printf("%-10s %-28s skipped: %s\n", bench, metric, reason);
	}
	fflush(stdout);
}
