/* A caller-owned buffer in which library code explains a failure in words.
 *
 * Library code does not log. Where an error code alone would leave the user guessing (which
 * tensor, which offset, which shard), the function also fills a struct wf_diag that the caller
 * passes in (or NULL to skip). The first message set wins: a failure deep in a parser is not
 * overwritten by the generic context added on the way out. */
#ifndef WF_BASE_DIAG_H
#define WF_BASE_DIAG_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define WF_DIAG_MAX 512

struct wf_diag {
	char msg[WF_DIAG_MAX];
};

/* Formats into diag (if non-NULL and still empty) and returns code, so that a failure site reads
 *   return wf_diag_set(diag, WF_ETRUNCATED, "tensor '%s' ends past EOF", name);
 */
int wf_diag_set(struct wf_diag *diag, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Clears diag (accepts NULL). */
void wf_diag_clear(struct wf_diag *diag);

/* The message, or the generic wf_strerror(code) text when nothing was set. Never NULL. */
const char *wf_diag_str(const struct wf_diag *diag, int code);

#ifdef __cplusplus
}
#endif
#endif
