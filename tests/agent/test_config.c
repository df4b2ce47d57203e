#include "agent/config.h"
#include "base/error.h"
#include "common/wftest.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int parse(struct wf_agent_config *cfg, const char *json, struct wf_diag *d)
{
	return wf_agent_config_parse(cfg, json, strlen(json), d);
}

Test(config, defaults_and_full_file)
{
	struct wf_agent_config cfg;
	cr_assert_eq(wf_agent_config_init(&cfg), 0);
	cr_assert_str_eq(cfg.floor_dir, "/dev/shm/weightfloor");
	cr_assert_eq(cfg.io_queue_depth, 64);
	struct wf_diag d = {{0}};
	const char *j =
	    "{\"floor_dir\":\"/tmp/f\",\"group\":\"0\",\"host_budget\":\"2G\","
	    "\"model_roots\":[\"/models\",\"/data\"],\"socket\":\"ipc:///tmp/a.sock\","
	    "\"allowed_uids\":[1000,1001],\"max_message\":\"1M\","
	    "\"io\":{\"backend\":\"pread\",\"queue_depth\":32,\"chunk\":\"2M\"},"
	    "\"models\":[{\"name\":\"q\",\"path\":\"/models/q.gguf\",\"pin_host\":true},"
	    "{\"name\":\"m\",\"path\":\"/models/m.gguf\",\"preload\":true}],"
	    "\"reload_dir\":\"/run/r\",\"watch\":true}";
	cr_assert_eq(parse(&cfg, j, &d), 0, "%s", d.msg);
	cr_assert_str_eq(cfg.floor_dir, "/tmp/f");
	cr_assert_eq(cfg.host_budget, 2ull << 30);
	cr_assert_eq(cfg.n_model_roots, 2);
	cr_assert_str_eq(cfg.model_roots[1], "/data");
	cr_assert_eq(cfg.n_allowed_uids, 2);
	cr_assert_eq(cfg.allowed_uids[1], 1001);
	cr_assert_eq(cfg.max_message, 1u << 20);
	cr_assert_str_eq(cfg.io_backend, "pread");
	cr_assert_eq(cfg.io_chunk, 2u << 20);
	cr_assert_eq(cfg.n_models, 2);
	cr_assert(cfg.models[0].pin_host && !cfg.models[0].preload);
	cr_assert(cfg.models[1].preload);
	cr_assert_str_eq(cfg.reload_dir, "/run/r");
	cr_assert(cfg.watch);
	cr_assert_eq(wf_agent_config_resolve(&cfg, &d), 0);
	cr_assert_eq(cfg.gid, 0);
	wf_agent_config_fini(&cfg);
}

/* The spare area of new floors: a share of the model with a floor, or an absolute size. */
Test(config, spare_percent_or_size)
{
	struct wf_agent_config cfg;
	struct wf_diag d = {{0}};
	cr_assert_eq(wf_agent_config_init(&cfg), 0);
	cr_assert_eq(cfg.spare_percent, WF_AGENT_SPARE_PERCENT_DEFAULT);
	cr_assert_eq(wf_agent_config_spare(&cfg, 100ull << 30), 2ull << 30, "2%% of 100 GiB");
	cr_assert_eq(wf_agent_config_spare(&cfg, 6u << 20), WF_AGENT_SPARE_MIN, "the minimum");
	cr_assert_eq(parse(&cfg, "{\"spare\":\"0.5%\"}", &d), 0, "%s", d.msg);
	cr_assert_eq(wf_agent_config_spare(&cfg, 1000ull << 20), 5ull << 20);
	cr_assert_eq(parse(&cfg, "{\"spare\":\"256M\"}", &d), 0, "%s", d.msg);
	cr_assert_eq(wf_agent_config_spare(&cfg, 100ull << 30), 256u << 20);
	cr_assert_eq(wf_agent_config_spare(&cfg, 1), 256u << 20, "a size is exact");
	cr_assert_eq(parse(&cfg, "{\"spare\":0}", &d), 0, "%s", d.msg);
	cr_assert_eq(wf_agent_config_spare(&cfg, 100ull << 30), 0, "no spare area");
	cr_assert_eq(wf_agent_config_set_spare(&cfg, "10%", &d), 0);
	cr_assert_eq(wf_agent_config_spare(&cfg, 100u << 20), 10u << 20);
	cr_assert_eq(wf_agent_config_set_spare(&cfg, "%", &d), WF_EINVAL);
	cr_assert(strstr(d.msg, "percentage"), "%s", d.msg);
	cr_assert_eq(wf_agent_config_spare(&cfg, 100u << 20), 10u << 20, "unchanged on failure");
	wf_agent_config_fini(&cfg);
}

Test(config, bad_input_is_named_and_leaves_config_unchanged)
{
	struct {
		const char *json, *needle;
	} cases[] = {
	    {"{\"florr_dir\":\"/x\"}", "unknown key 'florr_dir'"},
	    {"{\"io\":{\"depth\":3}}", "unknown key 'io.depth'"},
	    {"{\"host_budget\":\"lots\"}", "host_budget"},
	    {"{\"host_budget\":-5}", "host_budget"},
	    {"{\"floor_dir\":\"relative\"}", "not absolute"},
	    {"{\"io\":{\"chunk\":\"1000\"}}", "io.chunk"},
	    {"{\"io\":{\"backend\":\"spdk\"}}", "io.backend"},
	    {"{\"models\":[{\"name\":\"a\"}]}", "needs 'name' and 'path'"},
	    {"{\"models\":[{\"name\":\"a b\",\"path\":\"/x\"}]}", "model name"},
	    {"{\"models\":[{\"name\":\"a\",\"path\":\"/x\"},{\"name\":\"a\",\"path\":\"/y\"}]}",
	     "listed twice"},
	    {"{\"model_roots\":[\"rel\"]}", "not absolute"},
	    {"[1,2]", "top level"},
	    {"{\"floor_dir\":", "invalid JSON"},
	    {"{} x", "trailing"},
	    {"{\"spare\":\"lots\"}", "spare"},
	    {"{\"spare\":\"150%\"}", "spare"},
	    {"{\"spare\":\"0%\"}", "spare"},
	    {"{\"spare\":-1}", "spare"},
	    {"{\"spare\":true}", "spare"},
	    {"{\"reload_dir\":\"rel\"}", "reload_dir 'rel' is not absolute"},
	    {"{\"watch\":\"yes\"}", "watch"},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct wf_agent_config cfg;
		struct wf_diag d = {{0}};
		wf_agent_config_init(&cfg);
		int rc = parse(&cfg, cases[i].json, &d);
		cr_assert(rc < 0, "accepted %s", cases[i].json);
		cr_assert(strstr(d.msg, cases[i].needle), "'%s': diag '%s' lacks '%s'",
		          cases[i].json, d.msg, cases[i].needle);
		cr_assert_str_eq(cfg.floor_dir, "/dev/shm/weightfloor",
		                 "config changed on failure");
		cr_assert_eq(cfg.n_models, 0);
		wf_agent_config_fini(&cfg);
	}
}

Test(config, model_roots_confine_paths)
{
	char *dir = wft_tmpdir("roots");
	char root[512], inside[600], outside[700], evil[600];
	snprintf(root, sizeof root, "%s/models", dir);
	snprintf(inside, sizeof inside, "%s/a.gguf", root);
	snprintf(evil, sizeof evil, "%s/models-evil", dir);
	mkdir(root, 0755);
	mkdir(evil, 0755);
	snprintf(outside, sizeof outside, "%s/b.gguf", evil);
	fclose(fopen(inside, "w"));
	fclose(fopen(outside, "w"));
	struct wf_agent_config cfg;
	wf_agent_config_init(&cfg);
	char json[1024];
	snprintf(json, sizeof json, "{\"model_roots\":[\"%s\"]}", root);
	struct wf_diag d = {{0}};
	cr_assert_eq(parse(&cfg, json, &d), 0, "%s", d.msg);
	char *res = NULL;
	cr_assert_eq(wf_agent_config_check_path(&cfg, inside, &res, &d), 0, "%s", d.msg);
	free(res);
	char sneaky[800];
	snprintf(sneaky, sizeof sneaky, "%s/../models-evil/b.gguf", root);
	cr_assert_eq(wf_agent_config_check_path(&cfg, sneaky, &res, &d), WF_EPERMISSION);
	cr_assert(strstr(d.msg, "outside the model roots"));
	wf_diag_clear(&d);
	cr_assert_eq(wf_agent_config_check_path(&cfg, outside, &res, &d), WF_EPERMISSION);
	cr_assert_eq(wf_agent_config_check_path(&cfg, "/nonexistent/x.gguf", &res, &d), -ENOENT);
	wf_agent_config_fini(&cfg);
	wft_rmtree(dir);
	free(dir);
}
