/* JSON assertions for the agentctl suites (agentctl --json output parsed with json-c). */
#ifndef WF_TESTS_AGENT_AGT_JSON_H
#define WF_TESTS_AGENT_AGT_JSON_H

struct json_object;

/* Parses text as exactly one JSON document (only blanks may follow); asserts, naming what. */
struct json_object *agt_json_parse(const char *text, const char *what);
/* The value of key k in object o; asserts that it exists. */
struct json_object *agt_json_key(struct json_object *o, const char *k);

#endif
