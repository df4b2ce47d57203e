/* Criterion-side helpers of ctl_test.h (the echo handler is in echo_handler.c). */
#include "tests/control/ctl_test.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>

char *ipc_url(const char *dir, const char *name)
{
	char *u = NULL;
	cr_assert(asprintf(&u, "ipc://%s/%s", dir, name) > 0);
	return u;
}

void req_model_status(Weightfloor__V1__Request *req, Weightfloor__V1__ModelStatus *ms,
                      const char *name)
{
	weightfloor__v1__request__init(req);
	weightfloor__v1__model_status__init(ms);
	ms->name = (char *)name;
	req->body_case = WEIGHTFLOOR__V1__REQUEST__BODY_MODEL_STATUS;
	req->model_status = ms;
}

struct wf_ctl_server *echo_server(const char *dir, const char *name, struct echo_state *st,
                                  const struct wf_ctl_server_opts *opts)
{
	struct wf_ctl_server_opts o = {0};
	struct wf_ctl_server *srv = NULL;
	struct wf_diag d = {{0}};
	if (opts)
		o = *opts;
	o.handle = echo_handle;
	o.ctx = st;
	char *url = NULL;
	if (!o.listen.url)
		o.listen.url = url = ipc_url(dir, name);
	int rv = wf_ctl_server_create(&o, &srv, &d);
	free(url);
	cr_assert_eq(rv, 0, "server create: %s", wf_diag_str(&d, rv));
	cr_assert_eq(wf_ctl_server_start(srv), 0);
	return srv;
}
