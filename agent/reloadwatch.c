/* The reload watch and control directory: see agent/reloadwatch.h. */
#include "agent/reloadwatch.h"

#include "base/error.h"
#include "base/log.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define REFRESH_MS     1000 /* how often the watched directories are re-read */
#define MAX_DIRS       1024
#define MAX_PENDING    256
#define REQUEST_MAX    4096 /* bytes of a request file */
#define DIR_EVENTS     (IN_CLOSE_WRITE | IN_MOVED_TO | IN_ATTRIB)
#define CONTROL_EVENTS (IN_CLOSE_WRITE | IN_MOVED_TO)
#define REQUEST_SUFFIX ".request"
#define STATUS_SUFFIX  ".status"

struct pending {
	char *model;
	int64_t due_ms; /* reload when now passes it; moved on by every new event */
};

struct wf_reload_watch {
	struct wf_reload_watch_opts o;
	char *control_dir;
	int ino;          /* inotify descriptor */
	int control_wd;   /* -1: no control directory */
	int stop_pipe[2]; /* written to stop the thread */
	pthread_t thread;
	/* the watched directories of model files: wd and path; files: (model, path) */
	int wds[MAX_DIRS];
	char *dirs[MAX_DIRS];
	size_t n_dirs;
	struct wf_floor_model_file *files;
	size_t n_files;
	struct pending pend[MAX_PENDING];
	size_t n_pend;
};

static int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- the control directory ----------------------------------------------------------------- */

/* Writes NAME.status for the request file `req` (NAME.request) from a JSON object, via a
 * temporary file and rename. */
static void write_status(struct wf_reload_watch *w, const char *req, struct json_object *st)
{
	size_t base = strlen(req) - strlen(REQUEST_SUFFIX);
	char path[PATH_MAX], tmp[PATH_MAX];
	int n =
	    snprintf(path, sizeof path, "%s/%.*s%s", w->control_dir, (int)base, req, STATUS_SUFFIX);
	if (n < 0 || (size_t)n >= sizeof path ||
	    snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid()) >= (int)sizeof tmp)
		return;
	const char *text = json_object_to_json_string_ext(st, JSON_C_TO_STRING_PLAIN);
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
	if (fd < 0) {
		wf_log_warn("reload control: %s: %s", tmp, strerror(errno));
		return;
	}
	size_t len = strlen(text);
	bool ok = write(fd, text, len) == (ssize_t)len && write(fd, "\n", 1) == 1;
	ok = close(fd) == 0 && ok;
	if (!ok || rename(tmp, path) != 0) {
		wf_log_warn("reload control: writing %s: %s", path, strerror(errno));
		unlink(tmp);
	}
}

static struct json_object *status_of(uint64_t seq, const char *model, int rc,
                                     const struct wf_floor_reload_result *r, bool dry,
                                     const char *error)
{
	struct json_object *o = json_object_new_object();
	const struct wf_reload_plan *p = rc == 0 ? &r->plan : NULL;
	json_object_object_add(o, "seq", json_object_new_uint64(seq));
	json_object_object_add(o, "model", json_object_new_string(model ? model : ""));
	const char *result = rc < 0         ? "failed"
	                     : p->n_refused ? "refused"
	                     : dry          ? "dry_run"
	                     : r->published ? "published"
	                                    : "unchanged";
	json_object_object_add(o, "result", json_object_new_string(result));
	json_object_object_add(o, "error", json_object_new_string(error ? error : ""));
	if (!p)
		return o;
	json_object_object_add(o, "generation", json_object_new_uint64(r->generation));
	json_object_object_add(o, "files_changed", json_object_new_int64(p->files_moved));
	json_object_object_add(o, "tensors_reloaded", json_object_new_int64(p->n_changed));
	json_object_object_add(o, "tensors_unchanged", json_object_new_int64(p->n_unchanged));
	json_object_object_add(o, "tensors_refused", json_object_new_int64(p->n_refused));
	struct json_object *rel = json_object_new_array(), *ref = json_object_new_array();
	for (uint32_t i = 0; i < p->n_tensors; i++) {
		const struct wf_reload_tensor *t = &p->tensors[i];
		if (t->status == WF_RELOAD_CHANGED) {
			json_object_array_add(rel, json_object_new_string(t->name));
			continue;
		}
		struct json_object *e = json_object_new_object();
		json_object_object_add(e, "name", json_object_new_string(t->name));
		json_object_object_add(e, "reason", json_object_new_string(t->why));
		json_object_array_add(ref, e);
	}
	json_object_object_add(o, "reloaded", rel);
	json_object_object_add(o, "refused", ref);
	json_object_object_add(o, "seconds", json_object_new_double(r->seconds));
	return o;
}

/* Reads a request file: "SEQ MODEL [dry-run]". 0, or WF_EINVAL with why. */
static int read_request(struct wf_reload_watch *w, const char *name, uint64_t *ret_seq, char *model,
                        size_t model_len, bool *ret_dry, char *why, size_t why_len)
{
	char path[PATH_MAX], buf[REQUEST_MAX + 1];
	if (snprintf(path, sizeof path, "%s/%s", w->control_dir, name) >= (int)sizeof path)
		return snprintf(why, why_len, "the name is too long"), WF_EINVAL;
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	struct stat st;
	if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
		snprintf(why, why_len, "%s", fd < 0 ? strerror(errno) : "not a regular file");
		if (fd >= 0)
			close(fd);
		return WF_EINVAL;
	}
	ssize_t n = read(fd, buf, REQUEST_MAX);
	close(fd);
	if (n < 0)
		return snprintf(why, why_len, "%s", strerror(errno)), WF_EINVAL;
	buf[n] = '\0';
	char *save = NULL, *tok_seq = strtok_r(buf, " \t\r\n", &save);
	char *tok_model = strtok_r(NULL, " \t\r\n", &save);
	char *tok_mode = strtok_r(NULL, " \t\r\n", &save);
	char *end = NULL;
	errno = 0;
	unsigned long long seq = tok_seq ? strtoull(tok_seq, &end, 10) : 0;
	if (!tok_seq || *end || errno || tok_seq[0] == '-')
		return snprintf(why, why_len, "expected \"SEQ MODEL [dry-run]\", SEQ a decimal"),
		       WF_EINVAL;
	*ret_seq = seq;
	if (!tok_model || strlen(tok_model) >= model_len)
		return snprintf(why, why_len, "no model named (or the name is too long)"),
		       WF_EINVAL;
	snprintf(model, model_len, "%s", tok_model);
	*ret_dry = tok_mode && strcmp(tok_mode, "dry-run") == 0;
	if ((tok_mode && !*ret_dry) || strtok_r(NULL, " \t\r\n", &save))
		return snprintf(why, why_len, "unexpected words after the model (only dry-run)"),
		       WF_EINVAL;
	return 0;
}

static bool has_suffix(const char *s, const char *suffix)
{
	size_t a = strlen(s), b = strlen(suffix);
	return a > b && strcmp(s + a - b, suffix) == 0;
}

static void serve_request(struct wf_reload_watch *w, const char *name)
{
	if (!has_suffix(name, REQUEST_SUFFIX))
		return;
	uint64_t seq = 0;
	char model[256] = "", why[256] = "";
	bool dry = false;
	struct json_object *st;
	if (read_request(w, name, &seq, model, sizeof model, &dry, why, sizeof why) < 0) {
		char msg[320];
		snprintf(msg, sizeof msg, "bad request %s: %s", name, why);
		wf_log_warn("reload control: %s", msg);
		st = status_of(seq, model, WF_EINVAL, NULL, dry, msg);
	} else {
		struct wf_floor_reload_result r;
		struct wf_diag d = {{0}};
		int rc = wf_floors_reload(w->o.floors, model, dry, &r, &d);
		st = status_of(seq, model, rc, &r, dry, rc < 0 ? wf_diag_str(&d, rc) : NULL);
		if (rc == 0)
			wf_floor_reload_result_fini(&r);
	}
	write_status(w, name, st);
	json_object_put(st);
}

/* Requests left in the directory before the agent started. */
static void serve_existing(struct wf_reload_watch *w)
{
	DIR *dir = opendir(w->control_dir);
	if (!dir)
		return;
	struct dirent *de;
	while ((de = readdir(dir)))
		serve_request(w, de->d_name);
	closedir(dir);
}

/* ---- the model files ---------------------------------------------------------------------- */

static void dir_of(const char *path, char *out, size_t len)
{
	const char *slash = strrchr(path, '/');
	if (!slash)
		snprintf(out, len, ".");
	else if (slash == path)
		snprintf(out, len, "/");
	else
		snprintf(out, len, "%.*s", (int)(slash - path), path);
}

/* Schedules a reload of model once its files have been quiet for the debounce time. */
static void pend_model(struct wf_reload_watch *w, const char *model)
{
	uint32_t debounce = w->o.debounce_ms ? w->o.debounce_ms : 500;
	size_t k = 0;
	while (k < w->n_pend && strcmp(w->pend[k].model, model) != 0)
		k++;
	if (k == w->n_pend) {
		char *m = w->n_pend < MAX_PENDING ? strdup(model) : NULL;
		if (!m)
			return;
		w->pend[w->n_pend++].model = m;
	}
	w->pend[k].due_ms = now_ms() + debounce;
}

/* An event on file `name` in watched directory wd: the models holding it become pending. */
static void file_event(struct wf_reload_watch *w, int wd, const char *name)
{
	const char *dir = NULL;
	for (size_t k = 0; k < w->n_dirs && !dir; k++)
		if (w->wds[k] == wd)
			dir = w->dirs[k];
	if (!dir)
		return;
	for (size_t i = 0; i < w->n_files; i++) {
		char fdir[PATH_MAX];
		const char *slash = strrchr(w->files[i].path, '/');
		dir_of(w->files[i].path, fdir, sizeof fdir);
		if (slash && strcmp(slash + 1, name) == 0 && strcmp(fdir, dir) == 0)
			pend_model(w, w->files[i].model);
	}
}

/* Re-reads the held models' files and watches their directories (a directory already watched
 * keeps its watch; inotify_add_watch of the same inode returns the same wd). */
static void refresh_dirs(struct wf_reload_watch *w)
{
	struct wf_floor_model_file *files = NULL;
	size_t n = 0;
	if (wf_floors_held_files(w->o.floors, &files, &n) < 0)
		return;
	/* A model watched for the first time gets one reload (by identity, cheap when nothing
	 * moved): its files may have changed before its directory was watched. */
	for (size_t i = 0; i < n; i++) {
		bool seen = false;
		for (size_t k = 0; k < w->n_files && !seen; k++)
			seen = strcmp(w->files[k].model, files[i].model) == 0;
		if (!seen)
			pend_model(w, files[i].model);
	}
	wf_floor_model_files_free(w->files, w->n_files);
	w->files = files;
	w->n_files = n;
	for (size_t i = 0; i < n; i++) {
		char dir[PATH_MAX];
		dir_of(files[i].path, dir, sizeof dir);
		bool known = false;
		for (size_t k = 0; k < w->n_dirs && !known; k++)
			known = strcmp(w->dirs[k], dir) == 0;
		if (known || w->n_dirs == MAX_DIRS)
			continue;
		int wd = inotify_add_watch(w->ino, dir, DIR_EVENTS);
		if (wd < 0) {
			wf_log_warn("reload watch: %s: %s", dir, strerror(errno));
			continue;
		}
		char *copy = strdup(dir);
		if (!copy) {
			inotify_rm_watch(w->ino, wd); /* watched on the next refresh */
			continue;
		}
		w->wds[w->n_dirs] = wd;
		w->dirs[w->n_dirs++] = copy;
	}
}

/* Reloads the pending models whose files have been quiet long enough. */
static void run_due(struct wf_reload_watch *w)
{
	int64_t now = now_ms();
	size_t k = 0;
	while (k < w->n_pend) {
		if (w->pend[k].due_ms > now) {
			k++;
			continue;
		}
		struct wf_floor_reload_result r;
		struct wf_diag d = {{0}};
		int rc = wf_floors_reload(w->o.floors, w->pend[k].model, false, &r, &d);
		if (rc == 0)
			wf_floor_reload_result_fini(&r);
		else if (rc != WF_ENOT_RESIDENT)
			wf_log_warn("reload watch: %s", wf_diag_str(&d, rc));
		free(w->pend[k].model);
		w->pend[k] = w->pend[--w->n_pend]; /* k again: the moved one is not yet looked at */
	}
}

/* ---- the thread ---------------------------------------------------------------------------- */

/* Milliseconds until the next thing to do: the earliest pending reload or the next refresh. */
static int next_timeout(const struct wf_reload_watch *w, int64_t next_refresh)
{
	int64_t now = now_ms(), due = next_refresh;
	for (size_t k = 0; k < w->n_pend; k++)
		if (w->pend[k].due_ms < due)
			due = w->pend[k].due_ms;
	return due <= now ? 0 : (int)(due - now);
}

static void read_events(struct wf_reload_watch *w)
{
	char buf[16384] __attribute__((aligned(__alignof__(struct inotify_event))));
	for (;;) {
		ssize_t n = read(w->ino, buf, sizeof buf);
		if (n <= 0)
			return; /* EAGAIN: drained */
		for (char *p = buf; p < buf + n;) {
			const struct inotify_event *ev = (const struct inotify_event *)p;
			p += sizeof(*ev) + ev->len;
			if (!ev->len)
				continue;
			if (ev->wd == w->control_wd)
				serve_request(w, ev->name);
			else if (w->o.watch_files)
				file_event(w, ev->wd, ev->name);
		}
	}
}

static void *watch_main(void *arg)
{
	struct wf_reload_watch *w = arg;
	if (w->control_dir)
		serve_existing(w);
	int64_t next_refresh = 0;
	for (;;) {
		if (w->o.watch_files && now_ms() >= next_refresh) {
			refresh_dirs(w);
			next_refresh = now_ms() + REFRESH_MS;
		}
		struct pollfd pf[2] = {{.fd = w->ino, .events = POLLIN},
		                       {.fd = w->stop_pipe[0], .events = POLLIN}};
		int timeout = w->o.watch_files ? next_timeout(w, next_refresh) : -1;
		int rc = poll(pf, 2, timeout);
		if (rc < 0 && errno != EINTR)
			break;
		if (pf[1].revents)
			break;
		if (pf[0].revents & POLLIN)
			read_events(w);
		run_due(w);
	}
	return NULL;
}

static void watch_free(struct wf_reload_watch *w)
{
	if (w->ino >= 0)
		close(w->ino);
	for (int i = 0; i < 2; i++)
		if (w->stop_pipe[i] >= 0)
			close(w->stop_pipe[i]);
	for (size_t k = 0; k < w->n_dirs; k++)
		free(w->dirs[k]);
	for (size_t k = 0; k < w->n_pend; k++)
		free(w->pend[k].model);
	wf_floor_model_files_free(w->files, w->n_files);
	free(w->control_dir);
	free(w);
}

int wf_reload_watch_start(const struct wf_reload_watch_opts *o, struct wf_reload_watch **ret,
                          struct wf_diag *diag)
{
	*ret = NULL;
	if (!o->control_dir && !o->watch_files)
		return 0;
	struct wf_reload_watch *w = calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	w->o = *o;
	w->ino = w->control_wd = w->stop_pipe[0] = w->stop_pipe[1] = -1;
	int rc = 0;
	if (o->control_dir && !(w->control_dir = strdup(o->control_dir)))
		rc = -ENOMEM;
	if (rc == 0 && pipe2(w->stop_pipe, O_CLOEXEC | O_NONBLOCK) != 0)
		rc = wf_diag_set(diag, -errno, "reload watch: pipe: %s", strerror(errno));
	if (rc == 0 && (w->ino = inotify_init1(IN_NONBLOCK | IN_CLOEXEC)) < 0)
		rc = wf_diag_set(diag, -errno, "reload watch: inotify: %s", strerror(errno));
	if (rc == 0 && w->control_dir) {
		struct stat st;
		if (mkdir(w->control_dir, 0700) != 0 && errno != EEXIST)
			rc = wf_diag_set(diag, -errno, "reload directory %s: %s", w->control_dir,
			                 strerror(errno));
		else if (stat(w->control_dir, &st) != 0 || !S_ISDIR(st.st_mode))
			rc = wf_diag_set(diag, WF_EINVAL, "reload directory %s is not a directory",
			                 w->control_dir);
		else if ((w->control_wd =
		              inotify_add_watch(w->ino, w->control_dir, CONTROL_EVENTS)) < 0)
			rc = wf_diag_set(diag, -errno, "reload directory %s: inotify: %s",
			                 w->control_dir, strerror(errno));
	}
	if (rc == 0 && (rc = -pthread_create(&w->thread, NULL, watch_main, w)) < 0)
		wf_diag_set(diag, rc, "reload watch: thread: %s", strerror(-rc));
	if (rc < 0) {
		watch_free(w);
		return rc;
	}
	*ret = w;
	return 0;
}

void wf_reload_watch_stop(struct wf_reload_watch *w)
{
	if (!w)
		return;
	ssize_t n = write(w->stop_pipe[1], "x", 1);
	(void)n;
	pthread_join(w->thread, NULL);
	watch_free(w);
}
