/* Relative model paths never name a file in the agent's working directory by accident: the agent
 * refuses them from the API, agentctl sends absolute paths (and refuses a relative one that does
 * not exist where it runs), and a config file's relative paths mean "beside the config file".
 * The agent and agentctl run in different working directories, each holding a different
 * models/A.gguf. */
#include "base/error.h"
#include "common/wftest.h"
#include "proto/status.h"
#include "tests/agent/agt.h"

#include <criterion/criterion.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

TestSuite(paths, .fini = agt_fini, .timeout = 90);

static char *xstr(const char *fmt, const char *a, const char *b)
{
	char *s = NULL;
	cr_assert(asprintf(&s, fmt, a, b) >= 0);
	return s;
}

static bool registered(struct agt *a, const char *name)
{
	Weightfloor__V1__Reply *r = agt_model(a, name);
	bool ok = r->code == WEIGHTFLOOR__V1__STATUS__STATUS_OK;
	wf_ctl_reply_free(r);
	return ok;
}

Test(paths, relative_paths_never_resolve_in_the_agents_cwd)
{
	struct agt *a = agt_new("paths-rel");
	/* The agent runs in <dir>, where models/A.gguf exists. */
	char *pa = agt_gen(a, "A", 1, NULL);
	cr_assert_eq(chdir(a->dir), 0);
	agt_start(a, NULL, NULL);

	/* From the API: refused, although the agent could open it. */
	Weightfloor__V1__Reply *r = agt_register(a, "A", "models/A.gguf", false);
	cr_expect_eq(r->code, WEIGHTFLOOR__V1__STATUS__STATUS_INVALID_ARGUMENT, "%s %s",
	             wf_proto_status_name(r->code), r->message);
	cr_expect(strstr(r->message, "absolute") != NULL, "%s", r->message);
	wf_ctl_reply_free(r);
	cr_expect(!registered(a, "A"));

	/* agentctl in another directory, without a models/A.gguf: a clear error, nothing sent. */
	char *elsewhere = xstr("%s/%s", a->dir, "elsewhere");
	cr_assert_eq(mkdir(elsewhere, 0755), 0);
	cr_assert_eq(chdir(elsewhere), 0);
	char *out = NULL, *err = NULL;
	int rc = agt_ctl(a, &out, &err, (const char *[]){"register", "A", "models/A.gguf", NULL});
	cr_expect_eq(rc, 3, "agentctl register of a path missing here: exit %d (%s)", rc, out);
	cr_expect(strstr(err, "models/A.gguf") && strstr(err, "absolute"), "stderr: %s", err);
	cr_expect(!registered(a, "A"), "the agent's own models/A.gguf was not registered");
	free(out);
	free(err);

	/* A relative path that exists here is sent absolute: this directory's file, not the
	 * agent's. */
	char *mine_dir = xstr("%s/%s", elsewhere, "models");
	cr_assert_eq(mkdir(mine_dir, 0755), 0);
	char *mine = xstr("%s/%s", mine_dir, "A.gguf");
	char *cp[] = {"/bin/cp", pa, mine, NULL};
	cr_assert_eq(agt_run(cp, NULL, NULL, 30, a->dir), 0);
	rc = agt_ctl(a, &out, &err, (const char *[]){"register", "A", "models/A.gguf", NULL});
	cr_expect_eq(rc, 0, "agentctl register: exit %d: %s", rc, err);
	free(out);
	free(err);
	r = agt_model(a, "A");
	cr_assert_eq(r->code, WEIGHTFLOOR__V1__STATUS__STATUS_OK, "%s", r->message);
	cr_assert_eq(r->model_info->n_files, 1);
	char real[PATH_MAX];
	cr_assert_not_null(realpath(mine, real));
	cr_expect_str_eq(r->model_info->files[0]->path, real);
	wf_ctl_reply_free(r);

	/* An absolute path that does not exist here is still sent (it may exist only on the
	 * agent's side): the agent answers for it. */
	rc = agt_ctl(a, &out, &err, (const char *[]){"register", "B", "/nonexistent/B.gguf", NULL});
	cr_expect_eq(rc, 3, "exit %d: %s", rc, err);
	cr_expect(strstr(err, "relative path must exist here") == NULL, "the agent's error: %s",
	          err);
	free(out);
	free(err);
}

Test(paths, config_file_paths_are_relative_to_the_config_file)
{
	struct agt *a = agt_new("paths-cfg");
	agt_gen(a, "C", 3, NULL);
	char *cfg_dir = xstr("%s/%s", a->dir, "etc");
	cr_assert_eq(mkdir(cfg_dir, 0755), 0);
	char *cfg = xstr("%s/%s", cfg_dir, "agent.json");
	FILE *f = fopen(cfg, "w");
	cr_assert_not_null(f);
	fprintf(f,
	        "{\"model_roots\": [\"%s\"], "
	        "\"models\": [{\"name\": \"C\", \"path\": \"../models/C.gguf\"}]}",
	        a->models);
	fclose(f);
	/* The agent's working directory is elsewhere. */
	cr_assert_eq(chdir("/"), 0);
	agt_start(a, NULL, (const char *[]){"--config", cfg, NULL});
	Weightfloor__V1__Reply *r = agt_model(a, "C");
	cr_assert_eq(r->code, WEIGHTFLOOR__V1__STATUS__STATUS_OK, "%s %s",
	             wf_proto_status_name(r->code), r->message);
	char real[PATH_MAX];
	char *want = xstr("%s/%s", a->models, "C.gguf");
	cr_assert_not_null(realpath(want, real));
	cr_expect_str_eq(r->model_info->files[0]->path, real);
	wf_ctl_reply_free(r);
}
