/* The reference models (tests/data/reference) for the worker's completion suites: a model's file
 * and its manifest's prompt ids. */
#ifndef WF_TESTS_WORKER_WREF_H
#define WF_TESTS_WORKER_WREF_H

#include <stddef.h>

/* The path of folder's model (malloc'ed) and its prompt ids comma-separated in prompt (cap
 * bytes). Asserts (Criterion) that the manifest is there and readable. */
char *wref_model(const char *folder, char *prompt, size_t cap);

#endif
