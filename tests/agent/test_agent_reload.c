/* Reloading a model's changed files into its floor, end to end (ReloadModel, `agentctl reload`):
 * a real wf-agent with model roots and a real wf-worker (host device, the dense part on the
 * device from the store's copies). Change is decided by content: a touched file reloads nothing;
 * a tensor rewritten in place with the file's mtime restored is found (ctime moved) and reloaded
 * as one generation, and the worker's next completion is a fresh engine's on the new file; a
 * changed shape, a truncated file, a FIFO or a symlink out of the roots in the file's place are
 * refused and change nothing; a reload event reaches the PUB socket and /metrics counts it.
 * Waits poll states with deadlines. */
#include "base/error.h"
#include "common/wftest.h"
#include "model/model.h"
#include "proto/status.h"
#include "shm/region.h"
#include "tests/agent/agt.h"
#include "tests/http/httpc.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

TestSuite(agent_reload, .fini = agt_fini, .timeout = 300);

#define PROMPT  "1,17,300,42,99,7,256,311"
#define N_GEN   "12"
#define KIND(x) WEIGHTFLOOR__V1__EVENT_KIND__EVENT_KIND_##x

/* The greedy ids of a completion of PROMPT on the worker, through the agent. */
static char *generate_ids(struct agt *a)
{
	char *ids = agt_generate_ids(a, "m", NULL, PROMPT, N_GEN);
	cr_assert_not_null(ids, "agentctl generate failed");
	return ids;
}

static Weightfloor__V1__Reply *reload(struct agt *a, bool dry)
{
	Weightfloor__V1__ReloadModel rm = WEIGHTFLOOR__V1__RELOAD_MODEL__INIT;
	rm.name = "m";
	rm.dry_run = dry;
	Weightfloor__V1__Request req = WEIGHTFLOOR__V1__REQUEST__INIT;
	req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_RELOAD_MODEL;
	req.reload_model = &rm;
	return agt_call(a, &req, 60000);
}

static void pwrite_all(const char *path, const void *b, size_t n, off_t off)
{
	int fd = open(path, O_WRONLY);
	cr_assert_geq(fd, 0, "%s", path);
	cr_assert_eq(pwrite(fd, b, n, off), (ssize_t)n);
	cr_assert_eq(close(fd), 0);
}

static struct timespec mtime_of(const char *path)
{
	struct stat st;
	cr_assert_eq(stat(path, &st), 0, "%s", path);
	return st.st_mtim;
}

static void set_mtime(const char *path, struct timespec t)
{
	struct timespec ts[2] = {t, t};
	cr_assert_eq(utimensat(AT_FDCWD, path, ts, 0), 0, "%s", path);
}

/* A reload that is refused as a whole: its status, a word of the message, the generation kept. */
static void expect_reload_error(struct agt *a, const struct wf_shm_region *r,
                                Weightfloor__V1__Status want, const char *needle)
{
	uint64_t gen = wf_shm_region_generation(r);
	Weightfloor__V1__Reply *rep = reload(a, false);
	agt_expect_code(rep, want, needle);
	cr_assert(rep->message && strstr(rep->message, needle), "'%s' not in: %s", needle,
	          rep->message);
	wf_ctl_reply_free(rep);
	cr_assert_eq(wf_shm_region_generation(r), gen, "a refused reload moved the generation");
}

/* Waits until the worker's log holds needle (20 s), never a failed refresh. */
static void wait_worker_log(struct agt_worker *w, const char *needle)
{
	for (int i = 0;; i++) {
		char *log = agt_worker_log(w);
		bool found = strstr(log, needle) != NULL;
		cr_assert(!strstr(log, "not applied"), "the worker failed a refresh:\n%s", log);
		free(log);
		if (found)
			return;
		cr_assert_lt(i, 200, "the worker never logged '%s'", needle);
		agt_sleep_ms(100);
	}
}

/* The next RELOADED event for m (20 s). */
static Weightfloor__V1__Event *wait_reloaded(struct wf_ctl_sub *sub)
{
	int64_t end = agt_now_ms() + 20000;
	while (agt_now_ms() < end) {
		Weightfloor__V1__Event *ev = NULL;
		int rc = wf_ctl_sub_recv(sub, 200, &ev, NULL);
		if (rc == WF_ETIMEOUT || rc == WF_EFORMAT)
			continue;
		cr_assert_eq(rc, 0, "sub recv: %s", wf_strerror(rc));
		if (ev->kind == KIND(RELOADED) && strcmp(ev->model, "m") == 0)
			return ev;
		wf_ctl_event_free(ev);
	}
	cr_assert_fail("no RELOADED event within 20 s");
	return NULL;
}

Test(agent_reload, changed_tensors_by_content_reach_floor_and_worker)
{
	struct agt *a = agt_new("reload");
	char *pa = agt_gen(a, "m", 3, NULL), *pp = agt_gen(a, "ping", 4, NULL);
	struct wf_model *m = NULL;
	struct wf_diag d = {{0}};
	cr_assert_eq(wf_model_open(pa, &m, &d), 0, "%s", d.msg);
	/* The new version: layer 0's query projection takes layer 1's bytes (same type, shape). */
	const struct wf_tensor *changed = wf_model_find_tensor(m, "blk.0.attn_q.weight"),
	                       *source = wf_model_find_tensor(m, "blk.1.attn_q.weight");
	cr_assert(changed && source && changed->nbytes == source->nbytes);
	size_t len = 0;
	uint8_t *orig = (uint8_t *)wft_read_file(pa, &len);
	cr_assert_not_null(orig);
	char *pb = agt_printf("%s/b.gguf", a->dir);
	uint8_t *nb = malloc(len);
	memcpy(nb, orig, len);
	memcpy(nb + changed->offset, orig + source->offset, changed->nbytes);
	FILE *fb = fopen(pb, "wb");
	cr_assert_eq(fwrite(nb, 1, len, fb), len);
	cr_assert_eq(fclose(fb), 0);
	char *want_a = agt_eval_ids(a, pa, PROMPT, N_GEN),
	     *want_b = agt_eval_ids(a, pb, PROMPT, N_GEN);
	cr_assert_str_neq(want_a, want_b, "the two versions must generate differently");

	char *cfg = agt_printf("%s/agent.json", a->dir);
	uint16_t port = httpc_free_port();
	cr_assert(port);
	char *json = agt_printf("{\"model_roots\": [\"%s\"], \"metrics\": \"127.0.0.1:%u\"}",
	                        a->models, (unsigned)port);
	FILE *fc = fopen(cfg, "w");
	fputs(json, fc);
	fclose(fc);
	char *marg = agt_printf("m=%s", pa);
	agt_start(a, NULL,
	          (const char *[]){"--config", cfg, "--model", marg, "--spare", "8M", NULL});
	struct agt_worker w;
	agt_spawn_worker(a, &w, "w1", NULL, "host:mem=512Mi",
	                 (const char *const[]){"--dense-on-device", "--threads", "2", NULL});
	agt_wait_worker_registered(a, &w, "w1");
	struct wf_ctl_sub *sub = agt_sub_synced(a, "ping", pp);
	agt_ensure_ok(a, "m");
	char *hex = agt_digest_of(a, "m");
	struct wf_shm_region *r = agt_attach_reader(a, hex, NULL);
	char *got = generate_ids(a);
	cr_expect_str_eq(got, want_a, "before the reload: the model as materialized");
	free(got);
	/* The worker must be listening before the publish it is to hear (PUB keeps no history):
	 * publish the tensor's current bytes until it has applied one. */
	for (int i = 0;; i++) {
		Weightfloor__V1__Reply *rep = agt_publish(
		    a, "m", changed->name, orig + changed->offset, changed->nbytes, false);
		agt_expect_code(rep, AGT_ST(OK), "sync publish");
		wf_ctl_reply_free(rep);
		char *log = agt_worker_log(&w);
		const bool heard = strstr(log, "refreshed in") != NULL;
		free(log);
		if (heard)
			break;
		cr_assert_lt(i, 60, "the worker never applied a publish");
		agt_sleep_ms(200);
	}
	uint64_t gen = wf_shm_region_generation(r);

	/* Nothing changed on disk: no file is read. */
	Weightfloor__V1__Reply *rep = reload(a, false);
	agt_expect_code(rep, AGT_ST(OK), "reload of unchanged files");
	cr_assert_eq(rep->reload->files_changed, 0);
	cr_assert_eq(rep->reload->bytes_read, 0);
	cr_assert_not(rep->reload->published);
	wf_ctl_reply_free(rep);
	Weightfloor__V1__Event *ev = wait_reloaded(sub);
	cr_assert_eq(ev->code, AGT_ST(OK));
	wf_ctl_event_free(ev);

	/* Touched, not changed: the file is read, every tensor is unchanged, nothing published. */
	cr_assert(wft_wait_past_ctime(pa));
	cr_assert_eq(utimensat(AT_FDCWD, pa, NULL, 0), 0);
	rep = reload(a, false);
	agt_expect_code(rep, AGT_ST(OK), "reload of a touched file");
	cr_assert_eq(rep->reload->files_changed, 1);
	cr_assert_eq(rep->reload->tensors_unchanged, m->n_tensors);
	cr_assert_eq(rep->reload->tensors_reloaded, 0);
	cr_assert_not(rep->reload->published);
	cr_assert_eq(rep->reload->generation, gen);
	wf_ctl_reply_free(rep);
	cr_assert_eq(wf_shm_region_generation(r), gen);

	/* One tensor rewritten in place with the size and the mtime of the baseline (the touched
	 * file's) restored: only the ctime gives it away, and a later ctime than the touch's needs
	 * the coarse clock to tick first. A dry run (agentctl, --json): found, nothing published.
	 */
	struct timespec t1 = mtime_of(pa);
	cr_assert(wft_wait_past_ctime(pa));
	pwrite_all(pa, orig + source->offset, changed->nbytes, (off_t)changed->offset);
	set_mtime(pa, t1);
	char *out = NULL, *err = NULL;
	int rc = agt_ctl(a, &out, &err,
	                 (const char *const[]){"reload", "m", "--dry-run", "--json", NULL});
	cr_assert_eq(rc, 0, "agentctl reload --dry-run: exit %d: %s", rc, err);
	struct json_object *doc = json_tokener_parse(out), *jv = NULL;
	cr_assert_not_null(doc, "not JSON: %s", out);
	cr_assert(json_object_object_get_ex(doc, "tensors_reloaded", &jv), "%s", out);
	cr_assert_eq(json_object_get_int(jv), 1, "%s", out);
	json_object_put(doc);
	free(out);
	free(err);
	cr_assert_eq(wf_shm_region_generation(r), gen, "a dry run published");

	rc = agt_ctl(a, &out, &err, (const char *const[]){"reload", "m", NULL});
	cr_assert_eq(rc, 0, "agentctl reload: exit %d: %s", rc, err);
	cr_assert(strstr(out, "published") && strstr(out, changed->name), "%s", out);
	free(out);
	free(err);
	gen = wf_shm_region_generation(r);
	struct wf_shm_tensor_info ti;
	cr_assert_eq(wf_shm_region_find(r, changed->name, &ti), 0);
	cr_assert_eq(ti.generation, gen);
	cr_assert_eq(memcmp(ti.data, orig + source->offset, changed->nbytes), 0);
	rc = wf_shm_region_verify(r, &d);
	cr_assert_eq(rc, 0, "verify: %s", wf_diag_str(&d, rc));
	char *line = agt_printf("published at generation %llu", (unsigned long long)gen);
	wait_worker_log(&w, line);
	got = generate_ids(a);
	cr_expect_str_eq(got, want_b, "after the reload: a fresh engine's on the new file");
	free(got);
	/* the baseline moved with it: the same files again change nothing */
	rep = reload(a, false);
	agt_expect_code(rep, AGT_ST(OK), "reload after a reload");
	cr_assert_eq(rep->reload->files_changed, 0);
	wf_ctl_reply_free(rep);

	/* Refused, nothing changed: a model whose shapes changed (another size, renamed over the
	 * file: a new inode), a truncated file, a FIFO, a symlink out of the model roots. */
	char *other = agt_gen(a, "other", 5, "2M");
	cr_assert_eq(rename(other, pa), 0);
	rc = agt_ctl(a, &out, &err, (const char *const[]){"reload", "m", NULL});
	cr_assert_eq(rc, 8, "agentctl reload of other shapes: exit %d: %s %s", rc, out, err);
	cr_assert(strstr(out, "shape changed") && strstr(err, "nothing was published"), "%s\n%s",
	          out, err);
	free(out);
	free(err);
	cr_assert_eq(wf_shm_region_generation(r), gen);

	FILE *ft = fopen(pa, "wb");
	cr_assert_eq(fwrite(nb, 1, len / 2, ft), len / 2);
	cr_assert_eq(fclose(ft), 0);
	expect_reload_error(a, r, AGT_ST(INVALID_ARGUMENT), pa);

	cr_assert_eq(unlink(pa), 0);
	cr_assert_eq(mkfifo(pa, 0644), 0);
	expect_reload_error(a, r, AGT_ST(INVALID_ARGUMENT), "regular file");

	cr_assert_eq(unlink(pa), 0);
	cr_assert_eq(symlink(pb, pa), 0); /* pb lies in the test's dir, outside <dir>/models */
	expect_reload_error(a, r, AGT_ST(PERMISSION_DENIED), "root");
	got = generate_ids(a);
	cr_expect_str_eq(got, want_b, "refused reloads changed what the worker computes");
	free(got);

	/* /metrics counts them by result */
	struct httpc_reply hr = {0};
	cr_assert_eq(httpc_request(port, "GET", "/metrics", 5000, &hr), 0);
	cr_assert_eq(hr.status, 200);
	const char *metrics = hr.body;
	cr_assert(strstr(metrics, "weightfloor_reloads_total{model=\"m\",result=\"published\"} 1"),
	          "%s", metrics);
	cr_assert(strstr(metrics, "weightfloor_reloads_total{model=\"m\",result=\"refused\"} 1"),
	          "%s", metrics);
	httpc_reply_fini(&hr);

	wf_shm_region_detach(r);
	wf_ctl_sub_close(sub);
	wf_model_close(m);
	free(line);
	free(hex);
	free(orig);
	free(nb);
	free(want_a);
	free(want_b);
	free(marg);
	free(cfg);
	free(json);
	free(pb);
	free(pa);
	free(pp);
}

/* Writes text to dir/name through a temporary name and a rename, as a script should. */
static void put_request(const char *dir, const char *name, const char *text)
{
	char *tmp = agt_printf("%s/.%s.tmp", dir, name), *path = agt_printf("%s/%s", dir, name);
	FILE *f = fopen(tmp, "w");
	cr_assert_not_null(f, "%s", tmp);
	fputs(text, f);
	cr_assert_eq(fclose(f), 0);
	cr_assert_eq(rename(tmp, path), 0);
	free(tmp);
	free(path);
}

/* Waits (20 s) for dir/name to hold a JSON object whose seq is seq; returns it. */
static struct json_object *wait_status(const char *dir, const char *name, uint64_t seq)
{
	char *path = agt_printf("%s/%s", dir, name);
	for (int i = 0;; i++) {
		struct json_object *o = json_object_from_file(path), *js = NULL;
		if (o && json_object_object_get_ex(o, "seq", &js) &&
		    (uint64_t)json_object_get_int64(js) == seq) {
			free(path);
			return o;
		}
		json_object_put(o);
		cr_assert_lt(i, 400, "no status with seq %llu in %s", (unsigned long long)seq,
		             path);
		agt_sleep_ms(50);
	}
}

static const char *jstr(struct json_object *o, const char *key)
{
	struct json_object *v = NULL;
	cr_assert(json_object_object_get_ex(o, key, &v), "no %s in %s", key,
	          json_object_to_json_string(o));
	return json_object_get_string(v);
}

Test(agent_reload, watch_and_control_directory)
{
	struct agt *a = agt_new("reload-watch");
	char *pa = agt_gen(a, "m", 3, NULL);
	char *ctl = agt_printf("%s/reload", a->dir);
	char *marg = agt_printf("m=%s", pa);
	agt_start(a, NULL,
	          (const char *[]){"--model", marg, "--spare", "8M", "--watch", "--reload-dir", ctl,
	                           NULL});
	agt_ensure_ok(a, "m");
	char *hex = agt_digest_of(a, "m");
	struct wf_shm_region *r = agt_attach_reader(a, hex, NULL);

	/* a dry run through the control directory: nothing changed on disk */
	put_request(ctl, "a.request", "7 m dry-run\n");
	struct json_object *st = wait_status(ctl, "a.status", 7);
	cr_assert_str_eq(jstr(st, "result"), "dry_run");
	cr_assert_str_eq(jstr(st, "model"), "m");
	json_object_put(st);

	/* a tensor rewritten on disk: the watch reloads it by itself */
	struct wf_model *m = NULL;
	struct wf_diag d = {{0}};
	cr_assert_eq(wf_model_open(pa, &m, &d), 0, "%s", d.msg);
	const struct wf_tensor *t = wf_model_find_tensor(m, "blk.0.attn_q.weight");
	uint8_t *nb = malloc(t->nbytes);
	for (uint64_t i = 0; i < t->nbytes; i++)
		nb[i] = (uint8_t)(i * 7 + 1);
	pwrite_all(pa, nb, t->nbytes, (off_t)t->offset);
	for (int i = 0;; i++) {
		struct wf_shm_tensor_info ti;
		cr_assert_eq(wf_shm_region_find(r, t->name, &ti), 0);
		if (ti.generation > 0 && memcmp(ti.data, nb, t->nbytes) == 0)
			break;
		cr_assert_lt(i, 400, "the watch never reloaded %s", t->name);
		agt_sleep_ms(50);
	}

	/* through the control directory again: the floor is the files' now */
	put_request(ctl, "a.request", "8 m\n");
	st = wait_status(ctl, "a.status", 8);
	cr_assert_str_eq(jstr(st, "result"), "unchanged", "%s", json_object_to_json_string(st));
	json_object_put(st);
	/* bad requests get a status that says why */
	put_request(ctl, "b.request", "x m\n");
	st = wait_status(ctl, "b.status", 0);
	cr_assert_str_eq(jstr(st, "result"), "failed");
	cr_assert(strstr(jstr(st, "error"), "SEQ"), "%s", jstr(st, "error"));
	json_object_put(st);
	put_request(ctl, "b.request", "9 nosuch\n");
	st = wait_status(ctl, "b.status", 9);
	cr_assert_str_eq(jstr(st, "result"), "failed");
	cr_assert(strstr(jstr(st, "error"), "nosuch"), "%s", jstr(st, "error"));
	json_object_put(st);

	wf_shm_region_detach(r);
	wf_model_close(m);
	free(nb);
	free(hex);
	free(marg);
	free(ctl);
	free(pa);
}
