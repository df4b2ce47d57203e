#include "base/error.h"

#include <errno.h>
#include <string.h>

static const char *const messages[] = {
#define WF_ERROR_MSG_(name, msg) msg,
    WF_ERROR_MAP(WF_ERROR_MSG_)
#undef WF_ERROR_MSG_
};

static const char *const names[] = {
#define WF_ERROR_NAME_(name, msg) "WF_E" #name,
    WF_ERROR_MAP(WF_ERROR_NAME_)
#undef WF_ERROR_NAME_
};

_Static_assert(sizeof(messages) / sizeof(messages[0]) == (unsigned)(WF_E_MAX_ - WF_E_BASE_ - 1),
               "one message per code");

int wf_is_wf_error(int code)
{
	return code > WF_E_BASE_ && code < WF_E_MAX_;
}

const char *wf_strerror(int code)
{
	if (code == 0)
		return "success";
	if (wf_is_wf_error(code))
		return messages[code - WF_E_BASE_ - 1];
	if (code < 0 && code > -4096)
		return strerror(-code); /* glibc's strerror is thread-safe for known codes */
	return "unknown error";
}

const char *wf_err_name(int code)
{
	if (code == 0)
		return "OK";
	if (wf_is_wf_error(code))
		return names[code - WF_E_BASE_ - 1];
	if (code < 0 && code > -4096) {
		const char *n = strerrorname_np(-code);
		return n ? n : "E?";
	}
	return "E?";
}
