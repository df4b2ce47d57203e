#include "base/diag.h"

#include "base/error.h"

#include <stdarg.h>
#include <stdio.h>

int wf_diag_set(struct wf_diag *diag, int code, const char *fmt, ...)
{
	if (diag && diag->msg[0] == '\0') {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(diag->msg, sizeof(diag->msg), fmt, ap);
		va_end(ap);
	}
	return code;
}

void wf_diag_clear(struct wf_diag *diag)
{
	if (diag)
		diag->msg[0] = '\0';
}

const char *wf_diag_str(const struct wf_diag *diag, int code)
{
	if (diag && diag->msg[0])
		return diag->msg;
	return wf_strerror(code);
}
