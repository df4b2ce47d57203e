#include "agent/state.h"

#include "base/error.h"

#include <errno.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define STATE_VERSION    1
#define STATE_MAX_MODELS 4096
#define STATE_MAX_BYTES  (1u << 20)

void wf_agent_state_fini(struct wf_agent_state *st)
{
	if (!st)
		return;
	for (size_t i = 0; i < st->n_models; i++) {
		free(st->models[i].name);
		free(st->models[i].path);
	}
	free(st->models);
	st->models = NULL;
	st->n_models = 0;
}

static int read_all(const char *path, char **ret_buf, size_t *ret_len, struct wf_diag *diag)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	if (fd < 0)
		return errno == ENOENT
		           ? -ENOENT
		           : wf_diag_set(diag, -errno, "state file %s: %s", path, strerror(errno));
	struct stat st;
	int rc = 0;
	char *buf = NULL;
	if (fstat(fd, &st) < 0) {
		rc = wf_diag_set(diag, -errno, "state file %s: %s", path, strerror(errno));
		goto out;
	}
	if (!S_ISREG(st.st_mode)) {
		rc = wf_diag_set(diag, WF_EFORMAT, "state file %s is not a regular file", path);
		goto out;
	}
	if (st.st_size > STATE_MAX_BYTES) {
		rc = wf_diag_set(diag, WF_EFORMAT, "state file %s is larger than %u bytes", path,
		                 STATE_MAX_BYTES);
		goto out;
	}
	buf = malloc((size_t)st.st_size + 1);
	if (!buf) {
		rc = -ENOMEM;
		goto out;
	}
	size_t got = 0;
	while (got < (size_t)st.st_size) {
		ssize_t r = read(fd, buf + got, (size_t)st.st_size - got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			rc = wf_diag_set(diag, r < 0 ? -errno : WF_ETRUNCATED,
			                 "state file %s: read: %s", path,
			                 r < 0 ? strerror(errno) : "short read");
			goto out;
		}
		got += (size_t)r;
	}
	buf[got] = '\0';
	*ret_buf = buf;
	*ret_len = got;
	buf = NULL;
out:
	free(buf);
	close(fd);
	return rc;
}

static int bad(struct wf_diag *diag, const char *path, const char *what)
{
	return wf_diag_set(diag, WF_EFORMAT,
	                   "state file %s: %s (fix or move it aside; the agent will not start "
	                   "without knowing what it served)",
	                   path, what);
}

int wf_agent_state_load(const char *path, struct wf_agent_state *ret, struct wf_diag *diag)
{
	char *buf = NULL;
	size_t len = 0;
	struct json_object *root = NULL;
	struct wf_agent_state st = {0};
	memset(ret, 0, sizeof(*ret));
	int rc = read_all(path, &buf, &len, diag);
	if (rc == -ENOENT)
		return 0;
	if (rc < 0)
		return rc;
	struct json_tokener *tok = json_tokener_new();
	if (!tok) {
		free(buf);
		return -ENOMEM;
	}
	root = json_tokener_parse_ex(tok, buf, (int)len);
	bool complete = json_tokener_get_error(tok) == json_tokener_success &&
	                json_tokener_get_parse_end(tok) == len;
	json_tokener_free(tok);
	free(buf);
	if (!root || !complete) {
		rc = bad(diag, path, "not valid JSON");
		goto out;
	}
	struct json_object *v, *models;
	if (!json_object_is_type(root, json_type_object) ||
	    !json_object_object_get_ex(root, "version", &v) ||
	    !json_object_is_type(v, json_type_int) || json_object_get_int64(v) != STATE_VERSION) {
		rc = bad(diag, path, "no \"version\": 1");
		goto out;
	}
	if (!json_object_object_get_ex(root, "models", &models) ||
	    !json_object_is_type(models, json_type_array)) {
		rc = bad(diag, path, "no \"models\" array");
		goto out;
	}
	size_t n = json_object_array_length(models);
	if (n > STATE_MAX_MODELS) {
		rc = bad(diag, path, "more than 4096 models");
		goto out;
	}
	st.models = calloc(n ? n : 1, sizeof(*st.models));
	if (!st.models) {
		rc = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < n; i++) {
		struct json_object *m = json_object_array_get_idx(models, i), *name, *p, *api, *pin;
		if (!json_object_is_type(m, json_type_object) ||
		    !json_object_object_get_ex(m, "name", &name) ||
		    !json_object_is_type(name, json_type_string) ||
		    !json_object_object_get_ex(m, "path", &p) ||
		    !json_object_is_type(p, json_type_string) ||
		    !json_object_object_get_ex(m, "api", &api) ||
		    !json_object_is_type(api, json_type_boolean) ||
		    !json_object_object_get_ex(m, "pin_host", &pin) ||
		    !json_object_is_type(pin, json_type_boolean)) {
			rc = bad(diag, path, "a model entry lacks name, path, api or pin_host");
			goto out;
		}
		struct wf_agent_state_model *sm = &st.models[st.n_models++];
		sm->name = strdup(json_object_get_string(name));
		sm->path = strdup(json_object_get_string(p));
		sm->api = json_object_get_boolean(api);
		sm->pin_host = json_object_get_boolean(pin);
		if (!sm->name || !sm->path) {
			rc = -ENOMEM;
			goto out;
		}
	}
	*ret = st;
	st = (struct wf_agent_state){0};
out:
	wf_agent_state_fini(&st);
	json_object_put(root);
	return rc;
}

int wf_agent_state_format(const struct wf_agent_state *st, char **ret_json)
{
	struct json_object *root = json_object_new_object(), *models = json_object_new_array();
	int rc = -ENOMEM;
	if (!root || !models) {
		json_object_put(models);
		goto out;
	}
	json_object_object_add(root, "version", json_object_new_int(STATE_VERSION));
	json_object_object_add(root, "models", models);
	for (size_t i = 0; i < st->n_models; i++) {
		const struct wf_agent_state_model *sm = &st->models[i];
		struct json_object *m = json_object_new_object();
		if (!m)
			goto out;
		json_object_object_add(m, "name", json_object_new_string(sm->name));
		json_object_object_add(m, "path", json_object_new_string(sm->path));
		json_object_object_add(m, "api", json_object_new_boolean(sm->api));
		json_object_object_add(m, "pin_host", json_object_new_boolean(sm->pin_host));
		json_object_array_add(models, m);
	}
	const char *s = json_object_to_json_string_ext(root, JSON_C_TO_STRING_PRETTY |
	                                                         JSON_C_TO_STRING_NOSLASHESCAPE);
	char *out = s ? strdup(s) : NULL;
	if (!out)
		goto out;
	*ret_json = out;
	rc = 0;
out:
	json_object_put(root);
	return rc;
}

static int mkdir_parents(const char *dir)
{
	char buf[PATH_MAX];
	if (snprintf(buf, sizeof buf, "%s", dir) >= (int)sizeof buf)
		return -ENAMETOOLONG;
	for (char *p = buf + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = '\0';
		if (mkdir(buf, 0750) < 0 && errno != EEXIST)
			return -errno;
		*p = '/';
	}
	if (mkdir(buf, 0750) < 0 && errno != EEXIST)
		return -errno;
	return 0;
}

int wf_agent_state_write(const char *path, const char *json, struct wf_diag *diag)
{
	char dirbuf[PATH_MAX], tmp[PATH_MAX];
	if (snprintf(dirbuf, sizeof dirbuf, "%s", path) >= (int)sizeof dirbuf ||
	    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp)
		return wf_diag_set(diag, -ENAMETOOLONG, "state file %s: name too long", path);
	const char *dir = dirname(dirbuf);
	int rc = mkdir_parents(dir);
	if (rc < 0)
		return wf_diag_set(diag, rc, "state directory %s: %s", dir, wf_strerror(rc));
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0640);
	if (fd < 0)
		return wf_diag_set(diag, -errno, "state file %s: %s", tmp, strerror(errno));
	size_t len = strlen(json), off = 0;
	while (off < len) {
		ssize_t w = write(fd, json + off, len - off);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0) {
			rc = wf_diag_set(diag, -errno, "state file %s: write: %s", tmp,
			                 strerror(errno));
			goto fail;
		}
		off += (size_t)w;
	}
	if (write(fd, "\n", 1) != 1 || fsync(fd) < 0) {
		rc = wf_diag_set(diag, -errno, "state file %s: %s", tmp, strerror(errno));
		goto fail;
	}
	close(fd);
	fd = -1;
	if (rename(tmp, path) < 0) {
		rc = wf_diag_set(diag, -errno, "state file %s: rename: %s", path, strerror(errno));
		goto fail;
	}
	int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd >= 0) {
		(void)fsync(dfd); /* best effort: the rename is what makes it atomic */
		close(dfd);
	}
	return 0;
fail:
	if (fd >= 0)
		close(fd);
	unlink(tmp);
	return rc;
}
