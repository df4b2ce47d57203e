/* wf-agent against hostile files (issue 8), through real agents on ipc:// sockets:
 *   - shard siblings (GGUF split, sharded safetensors) that are symlinks out of the model roots,
 *     at registration and swapped in after it; a FIFO named like a shard sibling;
 *   - a floor directory someone else created; a READY floor whose tensor bytes were altered
 *     while no agent ran;
 *   - a model file rewritten in place during materialization with its mtime restored. */
#include "tests/agent/agt.h"

#include "base/error.h"
#include "common/wftest.h"
#include "model/model.h"
#include "shm/layout.h"
#include "shm/region.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define ST(x) WEIGHTFLOOR__V1__STATUS__STATUS_##x
#define FS(x) WEIGHTFLOOR__V1__FLOOR_STATE__FLOOR_STATE_##x

TestSuite(hostile, .fini = agt_fini, .timeout = 120);

static void write_file(const char *path, const char *text)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	cr_assert_geq(fd, 0, "%s: %s", path, strerror(errno));
	size_t n = strlen(text);
	cr_assert_eq(write(fd, text, n), (ssize_t)n);
	close(fd);
}

/* wf-gen with extra arguments (NULL-terminated), output in <dir>/models. */
static void gen(struct agt *a, const char *out, const char *const *args)
{
	char *argv[24];
	int n = 0;
	argv[n++] = wft_exe("tools/wf-gen");
	argv[n++] = "--arch";
	argv[n++] = "qwen3moe";
	for (; *args; args++)
		argv[n++] = (char *)*args;
	argv[n++] = "-o";
	argv[n++] = (char *)out;
	argv[n] = NULL;
	char *err = NULL;
	int rc = agt_run(argv, NULL, &err, 60, a->dir);
	cr_assert_eq(rc, 0, "wf-gen %s: exit %d: %s", out, rc, err ? err : "");
	free(err);
}

/* An agent whose model roots are <dir>/models. */
static void start_rooted(struct agt *a)
{
	char *cfg = agt_printf("%s/agent.json", a->dir);
	char *json = agt_printf("{\"model_roots\": [\"%s\"]}", a->models);
	write_file(cfg, json);
	agt_start(a, NULL, (const char *[]){"--config", cfg, NULL});
	free(cfg);
	free(json);
}

static void expect_refused(Weightfloor__V1__Reply *r, Weightfloor__V1__Status code,
                           const char *needle1, const char *needle2)
{
	cr_assert_eq(r->code, code, "code %d, want %d: %s", r->code, code, r->message);
	cr_assert(strstr(r->message, needle1) && strstr(r->message, needle2),
	          "message '%s' does not name '%s' and '%s'", r->message, needle1, needle2);
	wf_ctl_reply_free(r);
}

/* Moves path to <dir>/outside/<base> and puts a symlink to it in its place; returns the target. */
static char *move_out(struct agt *a, const char *path)
{
	char *outside = agt_printf("%s/outside", a->dir);
	mkdir(outside, 0755);
	const char *base = strrchr(path, '/') + 1;
	char *target = agt_printf("%s/%s", outside, base);
	cr_assert_eq(rename(path, target), 0, "%s: %s", path, strerror(errno));
	cr_assert_eq(symlink(target, path), 0);
	free(outside);
	return target;
}

/* ---- 1 and 2: shard siblings ---------------------------------------------------------------- */

Test(hostile, gguf_shard_sibling_outside_the_roots)
{
	struct agt *a = agt_new("hostile-gguf-roots");
	char *out = agt_printf("%s/s.gguf", a->models);
	gen(a, out, (const char *[]){"--seed", "3", "--split-max-size", "2M", NULL});
	char *first = agt_printf("%s/s-00001-of-00004.gguf", a->models);
	char *second = agt_printf("%s/s-00002-of-00004.gguf", a->models);
	cr_assert_eq(access(first, R_OK), 0, "wf-gen made no 4 shards");
	move_out(a, second);
	start_rooted(a);
	expect_refused(agt_register(a, "s", first, false), ST(PERMISSION_DENIED),
	               "s-00002-of-00004.gguf", "outside the model roots");
	Weightfloor__V1__Reply *r = agt_list(a);
	cr_assert_eq(r->model_list->n_models, 0);
	wf_ctl_reply_free(r);
	free(first);
	free(second);
	free(out);
}

Test(hostile, safetensors_shard_outside_the_roots)
{
	struct agt *a = agt_new("hostile-st-roots");
	char *dir = agt_printf("%s/st", a->models);
	gen(a, dir, (const char *[]){"--format", "safetensors", "--split-max-size", "2M", NULL});
	glob_t g;
	char *pat = agt_printf("%s/model-00002-of-*.safetensors", dir);
	cr_assert_eq(glob(pat, 0, NULL, &g), 0, "wf-gen made no shards");
	char *shard = strdup(g.gl_pathv[0]);
	const char *sname = strrchr(shard, '/') + 1;
	globfree(&g);
	free(pat);
	move_out(a, shard);
	start_rooted(a);
	expect_refused(agt_register(a, "st", dir, false), ST(PERMISSION_DENIED), sname,
	               "outside the model roots");
	/* the config read for hparams is a model file too */
	char *cfgjson = agt_printf("%s/config.json", dir);
	cr_assert_eq(unlink(shard), 0);
	cr_assert_eq(rename(agt_printf("%s/outside/%s", a->dir, sname), shard), 0);
	move_out(a, cfgjson);
	expect_refused(agt_register(a, "st", dir, false), ST(PERMISSION_DENIED), "config.json",
	               "outside the model roots");
	free(cfgjson);
	free(shard);
	free(dir);
}

/* Registered inside the roots, then a shard swapped for a symlink to an identical copy outside
 * (same size and mtime, so the inventory still looks fresh): the materializer must not read it. */
Test(hostile, shard_swapped_after_registration_is_not_read)
{
	struct agt *a = agt_new("hostile-swap");
	char *out = agt_printf("%s/s.gguf", a->models);
	gen(a, out, (const char *[]){"--seed", "4", "--split-max-size", "2M", NULL});
	char *first = agt_printf("%s/s-00001-of-00004.gguf", a->models);
	char *third = agt_printf("%s/s-00003-of-00004.gguf", a->models);
	start_rooted(a);
	Weightfloor__V1__Reply *r = agt_register(a, "s", first, false);
	cr_assert_eq(r->code, ST(OK), "%s", r->message);
	wf_ctl_reply_free(r);
	char *copy = agt_printf("%s/copy.gguf", a->dir);
	char *cmd = agt_printf("cp -p '%s' '%s'", third, copy);
	cr_assert_eq(system(cmd), 0);
	cr_assert_eq(unlink(third), 0);
	cr_assert_eq(symlink(copy, third), 0);
	r = agt_ensure(a, "s", true);
	cr_assert_neq(r->code, ST(OK), "a shard outside the roots was materialized");
	cr_assert(strstr(r->message, "s-00003-of-00004.gguf") &&
	              strstr(r->message, "no longer the file that was inventoried"),
	          "%s", r->message);
	wf_ctl_reply_free(r);
	char names[1024];
	cr_assert_eq(agt_dir_count(a->floor, names, sizeof names), 0, "left: %s", names);
	free(cmd);
	free(copy);
	free(first);
	free(third);
	free(out);
}

Test(hostile, fifo_shard_sibling_does_not_block_register, .timeout = 60)
{
	struct agt *a = agt_new("hostile-fifo");
	char *out = agt_printf("%s/s.gguf", a->models);
	gen(a, out, (const char *[]){"--seed", "5", "--split-max-size", "2M", NULL});
	char *first = agt_printf("%s/s-00001-of-00004.gguf", a->models);
	char *second = agt_printf("%s/s-00002-of-00004.gguf", a->models);
	cr_assert_eq(unlink(second), 0);
	cr_assert_eq(mkfifo(second, 0644), 0);
	agt_start(a, NULL, (const char *[]){NULL});
	expect_refused(agt_register(a, "s", first, false), ST(INVALID_ARGUMENT),
	               "s-00002-of-00004.gguf", "not a regular file");
	/* and the agent still answers */
	Weightfloor__V1__Reply *r = agt_status(a);
	cr_assert_eq(r->code, ST(OK));
	wf_ctl_reply_free(r);
	free(first);
	free(second);
	free(out);
}

/* ---- 3: poisoned floors --------------------------------------------------------------------- */

Test(hostile, floor_dir_of_another_user_refused_at_start)
{
	struct agt *a = agt_new("hostile-floordir");
	cr_assert_eq(mkdir(a->floor, 0755), 0);
	cr_assert_eq(chown(a->floor, 65534, 65534), 0);
	pid_t pid = agt_spawn(a, NULL, (const char *[]){NULL});
	int st = 0;
	bool exited = false;
	for (int i = 0; i < 1000 && !exited; i++) {
		if (waitpid(pid, &st, WNOHANG) == pid)
			exited = true;
		else
			agt_sleep_ms(20);
	}
	char *log = agt_log(a);
	cr_assert(exited, "the agent started on a floor directory owned by uid 65534:\n%s", log);
	a->pid = 0;
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) != 0, "status 0x%x", st);
	cr_assert(strstr(log, a->floor) && strstr(log, "owned by uid 65534"), "log:\n%s", log);
	free(log);
}

/* Every tensor of the model at path equals its bytes in the floor. */
static void expect_floor_equals_files(struct agt *a, const char *path)
{
	struct wf_model *m = NULL;
	struct wf_diag d = {{0}};
	cr_assert_eq(wf_model_open(path, &m, &d), 0, "%s", d.msg);
	struct wf_digest dg;
	wf_model_digest(m, &dg);
	struct wf_shm_config cfg = {.dir = a->floor};
	struct wf_shm_region *r = NULL;
	int rc = wf_shm_region_attach(&cfg, &dg, m, WF_SHM_ATTACH_READER, NULL, NULL, &r, &d);
	cr_assert_eq(rc, 0, "%s", d.msg);
	for (uint32_t i = 0; i < m->n_tensors; i++) {
		const struct wf_tensor *t = &m->tensors[i];
		struct wf_shm_tensor_info ti;
		cr_assert_eq(wf_shm_region_find(r, t->name, &ti), 0);
		uint8_t *buf = malloc(t->nbytes ? t->nbytes : 1);
		int fd = open(m->files[t->file].path, O_RDONLY | O_CLOEXEC);
		cr_assert_eq(pread(fd, buf, t->nbytes, (off_t)t->offset), (ssize_t)t->nbytes);
		close(fd);
		cr_assert_eq(memcmp(buf, ti.data, t->nbytes), 0, "tensor %s differs from the file",
		             t->name);
		free(buf);
	}
	wf_shm_region_detach(r);
	wf_model_close(m);
}

Test(hostile, tampered_floor_is_rebuilt_not_adopted)
{
	struct agt *a = agt_new("hostile-tamper");
	char *pm = agt_gen(a, "m", 7, NULL);
	char *marg = agt_printf("m=%s", pm);
	agt_start(a, NULL, (const char *[]){"--model", marg, NULL});
	Weightfloor__V1__Reply *r = agt_ensure(a, "m", true);
	cr_assert_eq(r->code, ST(OK), "%s", r->message);
	wf_ctl_reply_free(r);
	r = agt_model(a, "m");
	char *region = agt_region_path(a, r->model_info->digest_hex, NULL);
	wf_ctl_reply_free(r);
	cr_assert_eq(agt_stop(a, 10000), 0);
	cr_assert_eq(access(region, F_OK), 0, "the stopped agent did not leave its floor");

	/* alter one tensor's bytes; header and tables stay valid */
	int fd = open(region, O_RDWR | O_CLOEXEC);
	cr_assert_geq(fd, 0);
	struct stat st;
	cr_assert_eq(fstat(fd, &st), 0);
	uint8_t *base = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	cr_assert_neq(base, MAP_FAILED);
	const struct wf_shm_header *h = (const void *)base;
	const struct wf_shm_tensor_entry *te = (const void *)(base + h->tensor_table_offset);
	uint32_t k = h->n_tensors / 2;
	cr_assert_gt(te[k].nbytes, 8);
	base[te[k].floor_offset + 5] ^= 0xff;
	munmap(base, (size_t)st.st_size);
	close(fd);

	agt_start(a, NULL, (const char *[]){"--model", marg, NULL});
	r = agt_model(a, "m");
	cr_assert(agt_state(r) == FS(HOST) || agt_state(r) == FS(DISK), "state %s",
	          agt_state_name(agt_state(r)));
	wf_ctl_reply_free(r);
	r = agt_ensure(a, "m", true);
	cr_assert_eq(r->code, ST(OK), "%s", r->message);
	wf_ctl_reply_free(r);
	expect_floor_equals_files(a, pm);
	free(region);
	free(marg);
	free(pm);
}

/* ---- 4: torn floors ------------------------------------------------------------------------- */

Test(hostile, rewrite_in_place_with_mtime_restored_fails_materialization)
{
	struct agt *a = agt_new("hostile-torn");
	char *pm = agt_gen(a, "m", 8, NULL);
	struct agt_opts o = {.env = {"WF_AGENT_FAULT_FILL_DELAY_MS=3000"}};
	agt_start(a, &o, (const char *[]){NULL});
	Weightfloor__V1__Reply *r = agt_register(a, "m", pm, false);
	cr_assert_eq(r->code, ST(OK), "%s", r->message);
	wf_ctl_reply_free(r);
	struct stat st0;
	cr_assert_eq(stat(pm, &st0), 0);
	struct wf_model *m = NULL;
	cr_assert_eq(wf_model_open(pm, &m, NULL), 0);
	uint64_t at = m->tensors[m->n_tensors / 2].offset;
	wf_model_close(m);

	cr_assert(wft_wait_past_ctime(pm), "the coarse clock did not pass %s's ctime", pm);
	r = agt_ensure(a, "m", false);
	cr_assert_eq(r->code, ST(OK), "%s", r->message);
	wf_ctl_reply_free(r);
	/* The fault hook holds the fill with the files opened and checked; it publishes the total
	 * first, which is how we know we are inside it. */
	bool in_delay = false;
	for (int i = 0; i < 500 && !in_delay; i++) {
		r = agt_model(a, "m");
		in_delay = agt_state(r) == FS(MATERIALIZING) && r->model_info->progress &&
		           r->model_info->progress->bytes_total > 0 &&
		           r->model_info->progress->bytes_done == 0;
		wf_ctl_reply_free(r);
		if (!in_delay)
			agt_sleep_ms(5);
	}
	cr_assert(in_delay, "never saw the materialization held by the fault hook");
	int fd = open(pm, O_WRONLY | O_CLOEXEC);
	cr_assert_geq(fd, 0);
	uint8_t junk[256];
	memset(junk, 0x3c, sizeof junk);
	cr_assert_eq(pwrite(fd, junk, sizeof junk, (off_t)at), (ssize_t)sizeof junk);
	struct timespec ts[2] = {{0, UTIME_OMIT}, st0.st_mtim};
	cr_assert_eq(futimens(fd, ts), 0);
	close(fd);
	struct stat st1;
	cr_assert_eq(stat(pm, &st1), 0);
	cr_assert_eq(st1.st_size, st0.st_size);
	cr_assert_eq(st1.st_mtim.tv_sec, st0.st_mtim.tv_sec);
	cr_assert_eq(st1.st_mtim.tv_nsec, st0.st_mtim.tv_nsec);

	r = agt_wait_settled(a, "m", 60000);
	cr_assert_eq(agt_state(r), FS(FAILED), "a torn floor became %s",
	             agt_state_name(agt_state(r)));
	cr_assert(strstr(r->model_info->last_error, "changed during materialization"), "%s",
	          r->model_info->last_error);
	wf_ctl_reply_free(r);
	char names[1024];
	cr_assert_eq(agt_dir_count(a->floor, names, sizeof names), 0, "left: %s", names);
	r = agt_model(a, "m");
	char *region = agt_region_path(a, r->model_info->digest_hex, NULL);
	wf_ctl_reply_free(r);
	cr_assert_neq(access(region, F_OK), 0, "a region was left: %s", region);
	free(region);
	free(pm);
}
