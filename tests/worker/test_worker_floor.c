/* With an agent, wf-worker builds its model from the floor alone: the model's file is gone (renamed
 * away after the agent materialized its floor, as in a container that cannot see the model
 * files), and the worker, never given a path, still loads the model and reports it resident.
 * Real wf-agent and wf-worker processes on ipc:// sockets (tests/agent/agt.h). */
#include "base/error.h"
#include "common/wftest.h"
#include "tests/agent/agt.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

TestSuite(worker_floor, .fini = agt_fini, .timeout = 120);

static Weightfloor__V1__Residency residency(const char *url, const char *model)
{
	int rc;
	Weightfloor__V1__Residency res = WEIGHTFLOOR__V1__RESIDENCY__RESIDENCY_UNSPECIFIED;
	Weightfloor__V1__Reply *r = agt_worker_status(url, 2000, &rc);
	cr_assert_eq(rc, 0);
	cr_assert_eq(r->body_case, WEIGHTFLOOR__V1__REPLY__BODY_WORKER_INFO);
	for (size_t i = 0; i < r->worker_info->n_models; i++)
		if (strcmp(r->worker_info->models[i]->model, model) == 0)
			res = r->worker_info->models[i]->state;
	wf_ctl_reply_free(r);
	return res;
}

Test(worker_floor, loads_from_the_floor_without_the_files)
{
	struct agt *a = agt_new("wf-floor");
	char *pm = agt_gen(a, "m", 43, NULL);
	char *marg = agt_printf("m=%s", pm);
	agt_start(a, NULL, (const char *[]){"--model", marg, NULL});
	agt_ensure_ok(a, "m");

	/* The file goes: from now on only the floor holds the model. */
	char *gone = agt_printf("%s.gone", pm);
	cr_assert_eq(rename(pm, gone), 0);
	cr_assert_neq(access(pm, F_OK), 0);

	struct agt_worker w;
	agt_spawn_worker(a, &w, "w1", NULL, NULL, NULL);
	agt_wait_worker_ready(&w);

	Weightfloor__V1__Pin pin = WEIGHTFLOOR__V1__PIN__INIT;
	pin.model = "m";
	Weightfloor__V1__Request req = WEIGHTFLOOR__V1__REQUEST__INIT;
	req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_PIN;
	req.pin = &pin;
	Weightfloor__V1__Reply *r = NULL;
	struct wf_diag d = {{0}};
	int rc = agt_call_url(w.url, &req, 20000, &r, &d);
	cr_assert_eq(rc, 0, "pin: %s", wf_diag_str(&d, rc));
	cr_assert_eq(r->code, AGT_ST(OK), "pin: %s\nworker log:\n%s", r->message,
	             agt_worker_log(&w));
	wf_ctl_reply_free(r);
	cr_assert_eq(residency(w.url, "m"), WEIGHTFLOOR__V1__RESIDENCY__RESIDENCY_PINNED_DEVICE,
	             "worker log:\n%s", agt_worker_log(&w));
	cr_assert_eq(access(pm, F_OK), -1, "nothing recreated the file");
	cr_assert_eq(agt_stop(a, 10000), 0);
	free(gone);
	free(marg);
	free(pm);
}
