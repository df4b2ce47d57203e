#include "agent/config.h"

#include "base/error.h"
#include "base/units.h"
#include "http/server.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <json-c/json.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_CONFIG_BYTES (16u << 20)

int wf_agent_config_init(struct wf_agent_config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	cfg->gid = (gid_t)-1;
	cfg->floor_dir = strdup(WF_AGENT_DEFAULT_FLOOR_DIR);
	cfg->socket_url = strdup(WF_AGENT_DEFAULT_SOCKET);
	cfg->events_url = strdup(WF_AGENT_DEFAULT_EVENTS);
	cfg->io_backend = strdup("auto");
	cfg->max_message = 4u << 20;
	cfg->spare_percent = WF_AGENT_SPARE_PERCENT_DEFAULT;
	cfg->io_queue_depth = 64;
	cfg->io_chunk = 1u << 20;
	cfg->io_parallel_files = 4;
	if (!cfg->floor_dir || !cfg->socket_url || !cfg->events_url || !cfg->io_backend) {
		wf_agent_config_fini(cfg);
		return -ENOMEM;
	}
	return 0;
}

static void free_strv(char **v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(v[i]);
	free(v);
}

void wf_agent_config_fini(struct wf_agent_config *cfg)
{
	if (!cfg)
		return;
	free(cfg->floor_dir);
	free(cfg->group);
	free_strv(cfg->model_roots, cfg->n_model_roots);
	free(cfg->socket_url);
	free(cfg->events_url);
	free(cfg->tls_cert);
	free(cfg->tls_key);
	free(cfg->tls_ca);
	free(cfg->allowed_uids);
	free(cfg->allowed_gids);
	free(cfg->io_backend);
	free(cfg->state_file);
	free(cfg->reload_dir);
	free(cfg->metrics);
	free(cfg->log_format);
	for (size_t i = 0; i < cfg->n_models; i++) {
		free(cfg->models[i].name);
		free(cfg->models[i].path);
	}
	free(cfg->models);
	memset(cfg, 0, sizeof(*cfg));
	cfg->gid = (gid_t)-1;
}

/* Typed field readers: each names the key in the diag on failure. */
static int get_string(struct json_object *v, const char *key, char **out, struct wf_diag *diag)
{
	if (!json_object_is_type(v, json_type_string) || json_object_get_string_len(v) == 0)
		return wf_diag_set(diag, WF_EINVAL, "config: '%s' must be a non-empty string", key);
	char *s = strdup(json_object_get_string(v));
	if (!s)
		return -ENOMEM;
	free(*out);
	*out = s;
	return 0;
}

/* "metrics": an HTTP address as --metrics takes it (http/server.h), checked (and a host name
 * resolved) now so that --check-config catches it. */
static int metrics_addr_check(const char *addr, struct wf_diag *diag)
{
	struct sockaddr_storage ss;
	socklen_t sl;
	struct wf_diag d = {{0}};
	int rc = wf_http_addr_parse(addr, &ss, &sl, &d);
	if (rc < 0)
		return wf_diag_set(diag, rc, "config: 'metrics': %s", wf_diag_str(&d, rc));
	return 0;
}

static int get_size(struct json_object *v, const char *key, uint64_t *out, struct wf_diag *diag)
{
	if (json_object_is_type(v, json_type_int)) {
		int64_t i = json_object_get_int64(v);
		if (i < 0 || i == INT64_MAX)
			return wf_diag_set(diag, WF_EINVAL, "config: '%s' out of range", key);
		*out = (uint64_t)i;
		return 0;
	}
	if (json_object_is_type(v, json_type_string)) {
		uint64_t b;
		int rc = wf_parse_size(json_object_get_string(v), &b);
		if (rc < 0)
			return wf_diag_set(diag, rc, "config: '%s': '%s' is not a size (e.g. 64G)",
			                   key, json_object_get_string(v));
		*out = b;
		return 0;
	}
	return wf_diag_set(diag, WF_EINVAL, "config: '%s' must be a size (number or \"64G\")", key);
}

int wf_agent_config_set_spare(struct wf_agent_config *cfg, const char *value, struct wf_diag *diag)
{
	size_t len = value ? strlen(value) : 0;
	if (len > 1 && value[len - 1] == '%') {
		char *end;
		double pct = strtod(value, &end);
		if (end == value + len - 1 && pct > 0 && pct <= 100) {
			cfg->spare_percent = pct;
			cfg->spare_bytes = 0;
			return 0;
		}
	} else if (len > 0) {
		uint64_t b;
		if (wf_parse_size(value, &b) == 0) {
			cfg->spare_percent = 0;
			cfg->spare_bytes = b;
			return 0;
		}
	}
	return wf_diag_set(
	    diag, WF_EINVAL,
	    "spare: '%s' is neither a percentage of the model (\"2%%\", in (0, 100]) "
	    "nor a size (\"256M\", \"0\")",
	    value ? value : "");
}

uint64_t wf_agent_config_spare(const struct wf_agent_config *cfg, uint64_t model_bytes)
{
	if (cfg->spare_percent <= 0)
		return cfg->spare_bytes;
	double b = (double)model_bytes * cfg->spare_percent / 100.0;
	uint64_t spare = b >= 9.2e18 ? (uint64_t)INT64_MAX : (uint64_t)b;
	return spare < WF_AGENT_SPARE_MIN ? WF_AGENT_SPARE_MIN : spare;
}

static int get_u32(struct json_object *v, const char *key, uint32_t lo, uint32_t hi, uint32_t *out,
                   struct wf_diag *diag)
{
	if (!json_object_is_type(v, json_type_int))
		return wf_diag_set(diag, WF_EINVAL, "config: '%s' must be an integer", key);
	int64_t i = json_object_get_int64(v);
	if (i < lo || i > hi)
		return wf_diag_set(diag, WF_EINVAL, "config: '%s' = %lld outside [%u, %u]", key,
		                   (long long)i, lo, hi);
	*out = (uint32_t)i;
	return 0;
}

static int get_bool(struct json_object *v, const char *key, bool *out, struct wf_diag *diag)
{
	if (!json_object_is_type(v, json_type_boolean))
		return wf_diag_set(diag, WF_EINVAL, "config: '%s' must be true or false", key);
	*out = json_object_get_boolean(v);
	return 0;
}

static int get_ids(struct json_object *v, const char *key, uint32_t **out, size_t *n_out,
                   struct wf_diag *diag)
{
	if (!json_object_is_type(v, json_type_array))
		return wf_diag_set(diag, WF_EINVAL, "config: '%s' must be an array of ids", key);
	size_t n = json_object_array_length(v);
	if (n > 65536)
		return wf_diag_set(diag, WF_ELIMIT, "config: '%s' has too many entries", key);
	uint32_t *ids = calloc(n ? n : 1, sizeof(*ids));
	if (!ids)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		int rc =
		    get_u32(json_object_array_get_idx(v, i), key, 0, UINT32_MAX - 1, &ids[i], diag);
		if (rc < 0) {
			free(ids);
			return rc;
		}
	}
	free(*out);
	*out = ids;
	*n_out = n;
	return 0;
}

static int parse_io(struct wf_agent_config *cfg, struct json_object *io, struct wf_diag *diag)
{
	if (!json_object_is_type(io, json_type_object))
		return wf_diag_set(diag, WF_EINVAL, "config: 'io' must be an object");
	int rc = 0;
	json_object_object_foreach(io, key, v)
	{
		if (strcmp(key, "backend") == 0) {
			const char *s = json_object_get_string(v);
			if (!json_object_is_type(v, json_type_string) ||
			    (strcmp(s, "auto") && strcmp(s, "uring") && strcmp(s, "pread")))
				return wf_diag_set(
				    diag, WF_EINVAL,
				    "config: 'io.backend' must be auto, uring or pread");
			rc = get_string(v, "io.backend", &cfg->io_backend, diag);
		} else if (strcmp(key, "queue_depth") == 0) {
			rc = get_u32(v, "io.queue_depth", 1, 4096, &cfg->io_queue_depth, diag);
		} else if (strcmp(key, "chunk") == 0) {
			rc = get_size(v, "io.chunk", &cfg->io_chunk, diag);
			if (rc == 0 && (cfg->io_chunk < 4096 || cfg->io_chunk > (256u << 20) ||
			                cfg->io_chunk % 4096))
				rc = wf_diag_set(
				    diag, WF_EINVAL,
				    "config: 'io.chunk' must be a multiple of 4K in [4K, 256M]");
		} else if (strcmp(key, "parallel_files") == 0) {
			rc = get_u32(v, "io.parallel_files", 1, 256, &cfg->io_parallel_files, diag);
		} else {
			return wf_diag_set(diag, WF_EINVAL, "config: unknown key 'io.%s'", key);
		}
		if (rc < 0)
			return rc;
	}
	return 0;
}

static int valid_model_name(const char *s)
{
	size_t n = strlen(s);
	if (n == 0 || n > 128)
		return 0;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      c == '-' || c == '_' || c == '.' || c == ':' || c == '/'))
			return 0;
	}
	return 1;
}

static int parse_models(struct wf_agent_config *cfg, struct json_object *arr, struct wf_diag *diag)
{
	if (!json_object_is_type(arr, json_type_array))
		return wf_diag_set(diag, WF_EINVAL, "config: 'models' must be an array");
	size_t n = json_object_array_length(arr);
	if (n > WF_AGENT_MAX_MODELS)
		return wf_diag_set(diag, WF_ELIMIT, "config: more than %d models",
		                   WF_AGENT_MAX_MODELS);
	struct wf_agent_model_cfg *models = calloc(n ? n : 1, sizeof(*models));
	if (!models)
		return -ENOMEM;
	int rc = 0;
	size_t i;
	for (i = 0; i < n; i++) {
		struct json_object *m = json_object_array_get_idx(arr, i);
		struct wf_agent_model_cfg *mc = &models[i];
		if (!json_object_is_type(m, json_type_object)) {
			rc = wf_diag_set(diag, WF_EINVAL, "config: models[%zu] must be an object",
			                 i);
			goto err;
		}
		json_object_object_foreach(m, key, v)
		{
			if (strcmp(key, "name") == 0)
				rc = get_string(v, "models[].name", &mc->name, diag);
			else if (strcmp(key, "path") == 0)
				rc = get_string(v, "models[].path", &mc->path, diag);
			else if (strcmp(key, "pin_host") == 0)
				rc = get_bool(v, "models[].pin_host", &mc->pin_host, diag);
			else if (strcmp(key, "preload") == 0)
				rc = get_bool(v, "models[].preload", &mc->preload, diag);
			else
				rc = wf_diag_set(diag, WF_EINVAL,
				                 "config: unknown key 'models[%zu].%s'", i, key);
			if (rc < 0)
				goto err;
		}
		if (!mc->name || !mc->path) {
			rc = wf_diag_set(diag, WF_EINVAL,
			                 "config: models[%zu] needs 'name' and 'path'", i);
			goto err;
		}
		if (!valid_model_name(mc->name)) {
			rc = wf_diag_set(
			    diag, WF_EINVAL,
			    "config: model name '%s' must be 1-128 of [A-Za-z0-9._:/-]", mc->name);
			goto err;
		}
		for (size_t j = 0; j < i; j++) {
			if (strcmp(models[j].name, mc->name) == 0) {
				rc = wf_diag_set(diag, WF_EINVAL, "config: model '%s' listed twice",
				                 mc->name);
				goto err;
			}
		}
	}
	for (size_t j = 0; j < cfg->n_models; j++) {
		free(cfg->models[j].name);
		free(cfg->models[j].path);
	}
	free(cfg->models);
	cfg->models = models;
	cfg->n_models = n;
	return 0;
err:
	for (size_t j = 0; j <= i && j < n; j++) {
		free(models[j].name);
		free(models[j].path);
	}
	free(models);
	return rc;
}

static int parse_roots(struct wf_agent_config *cfg, struct json_object *arr, struct wf_diag *diag)
{
	if (!json_object_is_type(arr, json_type_array))
		return wf_diag_set(diag, WF_EINVAL,
		                   "config: 'model_roots' must be an array of paths");
	size_t n = json_object_array_length(arr);
	if (n > 256)
		return wf_diag_set(diag, WF_ELIMIT, "config: too many model_roots");
	char **roots = calloc(n ? n : 1, sizeof(*roots));
	if (!roots)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		int rc =
		    get_string(json_object_array_get_idx(arr, i), "model_roots[]", &roots[i], diag);
		if (rc == 0 && roots[i][0] != '/')
			rc = wf_diag_set(diag, WF_EINVAL, "config: model root '%s' is not absolute",
			                 roots[i]);
		if (rc < 0) {
			free_strv(roots, n);
			return rc;
		}
	}
	free_strv(cfg->model_roots, cfg->n_model_roots);
	cfg->model_roots = roots;
	cfg->n_model_roots = n;
	return 0;
}

/* Applies the top-level object to a scratch copy so that a failure leaves cfg untouched. */
static int apply(struct wf_agent_config *cfg, struct json_object *root, struct wf_diag *diag)
{
	if (!json_object_is_type(root, json_type_object))
		return wf_diag_set(diag, WF_EINVAL, "config: top level must be a JSON object");
	int rc = 0;
	json_object_object_foreach(root, key, v)
	{
		if (strcmp(key, "floor_dir") == 0)
			rc = get_string(v, key, &cfg->floor_dir, diag);
		else if (strcmp(key, "group") == 0)
			rc = get_string(v, key, &cfg->group, diag);
		else if (strcmp(key, "host_budget") == 0)
			rc = get_size(v, key, &cfg->host_budget, diag);
		else if (strcmp(key, "spare") == 0) {
			char num[32];
			const char *val = NULL;
			if (json_object_is_type(v, json_type_int) &&
			    json_object_get_int64(v) >= 0) {
				snprintf(num, sizeof num, "%lld",
				         (long long)json_object_get_int64(v));
				val = num;
			} else if (json_object_is_type(v, json_type_string)) {
				val = json_object_get_string(v);
			} else {
				return wf_diag_set(diag, WF_EINVAL,
				                   "config: 'spare' must be \"N%%\" or a size");
			}
			struct wf_diag d = {{0}};
			rc = wf_agent_config_set_spare(cfg, val, &d);
			if (rc < 0)
				rc = wf_diag_set(diag, rc, "config: %s", wf_diag_str(&d, rc));
		} else if (strcmp(key, "model_roots") == 0)
			rc = parse_roots(cfg, v, diag);
		else if (strcmp(key, "socket") == 0)
			rc = get_string(v, key, &cfg->socket_url, diag);
		else if (strcmp(key, "events") == 0)
			rc = get_string(v, key, &cfg->events_url, diag);
		else if (strcmp(key, "state_file") == 0)
			rc = get_string(v, key, &cfg->state_file, diag);
		else if (strcmp(key, "reload_dir") == 0)
			rc = get_string(v, key, &cfg->reload_dir, diag);
		else if (strcmp(key, "watch") == 0)
			rc = get_bool(v, key, &cfg->watch, diag);
		else if (strcmp(key, "metrics") == 0) {
			rc = get_string(v, key, &cfg->metrics, diag);
			if (rc == 0)
				rc = metrics_addr_check(cfg->metrics, diag);
		} else if (strcmp(key, "log_format") == 0) {
			const char *f = json_object_get_string(v);
			if (!json_object_is_type(v, json_type_string) ||
			    (strcmp(f, "text") && strcmp(f, "json")))
				return wf_diag_set(diag, WF_EINVAL,
				                   "config: 'log_format' must be text or json");
			rc = get_string(v, "log_format", &cfg->log_format, diag);
		} else if (strcmp(key, "tls_cert") == 0)
			rc = get_string(v, key, &cfg->tls_cert, diag);
		else if (strcmp(key, "tls_key") == 0)
			rc = get_string(v, key, &cfg->tls_key, diag);
		else if (strcmp(key, "tls_ca") == 0)
			rc = get_string(v, key, &cfg->tls_ca, diag);
		else if (strcmp(key, "allowed_uids") == 0)
			rc = get_ids(v, key, (uint32_t **)&cfg->allowed_uids, &cfg->n_allowed_uids,
			             diag);
		else if (strcmp(key, "allowed_gids") == 0)
			rc = get_ids(v, key, (uint32_t **)&cfg->allowed_gids, &cfg->n_allowed_gids,
			             diag);
		else if (strcmp(key, "max_message") == 0) {
			rc = get_size(v, key, &cfg->max_message, diag);
			if (rc == 0 && (cfg->max_message < 4096 || cfg->max_message > (1u << 30)))
				rc = wf_diag_set(diag, WF_EINVAL,
				                 "config: 'max_message' must be in [4K, 1G]");
		} else if (strcmp(key, "io") == 0)
			rc = parse_io(cfg, v, diag);
		else if (strcmp(key, "models") == 0)
			rc = parse_models(cfg, v, diag);
		else
			rc = wf_diag_set(diag, WF_EINVAL, "config: unknown key '%s'", key);
		if (rc < 0)
			return rc;
	}
	if (cfg->floor_dir[0] != '/')
		return wf_diag_set(diag, WF_EINVAL, "config: floor_dir '%s' is not absolute",
		                   cfg->floor_dir);
	if (cfg->state_file && cfg->state_file[0] != '/' && strcmp(cfg->state_file, "none") != 0)
		return wf_diag_set(diag, WF_EINVAL,
		                   "config: state_file '%s' is neither absolute nor \"none\"",
		                   cfg->state_file);
	if (cfg->reload_dir && cfg->reload_dir[0] != '/')
		return wf_diag_set(diag, WF_EINVAL, "config: reload_dir '%s' is not absolute",
		                   cfg->reload_dir);
	return 0;
}

static int dup_strv(char **src, size_t n, char ***out)
{
	char **v = calloc(n ? n : 1, sizeof(*v));
	if (!v)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		if (!(v[i] = strdup(src[i]))) {
			free_strv(v, n);
			return -ENOMEM;
		}
	}
	*out = v;
	return 0;
}

/* Deep copy so parse failures can be rolled back. */
static int config_copy(const struct wf_agent_config *src, struct wf_agent_config *dst)
{
	*dst = *src;
	dst->floor_dir = dst->group = dst->socket_url = dst->events_url = dst->io_backend = NULL;
	dst->state_file = dst->metrics = dst->log_format = dst->reload_dir = NULL;
	dst->tls_cert = dst->tls_key = dst->tls_ca = NULL;
	dst->model_roots = NULL;
	dst->allowed_uids = NULL;
	dst->allowed_gids = NULL;
	dst->models = NULL;
	dst->n_model_roots = dst->n_allowed_uids = dst->n_allowed_gids = dst->n_models = 0;
#define DUP(f)                                                                                     \
	if (src->f && !(dst->f = strdup(src->f)))                                                  \
		goto oom;
	DUP(floor_dir);
	DUP(group);
	DUP(socket_url);
	DUP(events_url);
	DUP(tls_cert);
	DUP(tls_key);
	DUP(tls_ca);
	DUP(io_backend);
	DUP(state_file);
	DUP(metrics);
	DUP(log_format);
	DUP(reload_dir);
#undef DUP
	if (dup_strv(src->model_roots, src->n_model_roots, &dst->model_roots) < 0)
		goto oom;
	dst->n_model_roots = src->n_model_roots;
	size_t nu = src->n_allowed_uids, ng = src->n_allowed_gids;
	dst->allowed_uids = calloc(nu ? nu : 1, sizeof(uid_t));
	dst->allowed_gids = calloc(ng ? ng : 1, sizeof(gid_t));
	if (!dst->allowed_uids || !dst->allowed_gids)
		goto oom;
	if (nu)
		memcpy(dst->allowed_uids, src->allowed_uids, nu * sizeof(uid_t));
	if (ng)
		memcpy(dst->allowed_gids, src->allowed_gids, ng * sizeof(gid_t));
	dst->n_allowed_uids = nu;
	dst->n_allowed_gids = ng;
	dst->models = calloc(src->n_models ? src->n_models : 1, sizeof(*dst->models));
	if (!dst->models)
		goto oom;
	for (size_t i = 0; i < src->n_models; i++) {
		dst->models[i] = src->models[i];
		dst->models[i].name = strdup(src->models[i].name);
		dst->models[i].path = strdup(src->models[i].path);
		dst->n_models = i + 1;
		if (!dst->models[i].name || !dst->models[i].path)
			goto oom;
	}
	return 0;
oom:
	wf_agent_config_fini(dst);
	return -ENOMEM;
}

int wf_agent_config_parse(struct wf_agent_config *cfg, const char *json, size_t len,
                          struct wf_diag *diag)
{
	if (len > MAX_CONFIG_BYTES)
		return wf_diag_set(diag, WF_ELIMIT, "config: larger than %u bytes",
		                   MAX_CONFIG_BYTES);
	struct json_tokener *tok = json_tokener_new();
	if (!tok)
		return -ENOMEM;
	struct json_object *root = json_tokener_parse_ex(tok, json, (int)len);
	enum json_tokener_error jerr = json_tokener_get_error(tok);
	size_t used = json_tokener_get_parse_end(tok);
	json_tokener_free(tok);
	if (!root || jerr != json_tokener_success) {
		json_object_put(root);
		return wf_diag_set(diag, WF_EFORMAT, "config: invalid JSON at byte %zu: %s", used,
		                   jerr == json_tokener_continue ? "unexpected end of input"
		                                                 : json_tokener_error_desc(jerr));
	}
	for (; used < len; used++) {
		if (json[used] != ' ' && json[used] != '\n' && json[used] != '\t' &&
		    json[used] != '\r') {
			json_object_put(root);
			return wf_diag_set(diag, WF_EFORMAT,
			                   "config: trailing bytes after JSON at %zu", used);
		}
	}
	struct wf_agent_config tmp;
	int rc = config_copy(cfg, &tmp);
	if (rc == 0)
		rc = apply(&tmp, root, diag);
	json_object_put(root);
	if (rc < 0) {
		wf_agent_config_fini(&tmp);
		return rc;
	}
	wf_agent_config_fini(cfg);
	*cfg = tmp;
	return 0;
}

/* Makes *p absolute against dir (the config file's directory) when it is relative. */
static int absolutize(char **p, const char *dir)
{
	if (!*p || (*p)[0] == '/')
		return 0;
	char *abs = NULL;
	if (asprintf(&abs, "%s/%s", dir, *p) < 0)
		return -ENOMEM;
	free(*p);
	*p = abs;
	return 0;
}

/* Relative model paths in a config file mean "beside the config file", never the
 * agent's working directory (which depends on how it was started). */
static int resolve_relative(struct wf_agent_config *cfg, const char *config_path)
{
	char *abs = realpath(config_path, NULL);
	if (!abs)
		return -errno;
	char *slash = strrchr(abs, '/');
	if (slash == abs)
		slash[1] = '\0'; /* "/agent.json": the root */
	else
		*slash = '\0';
	int rc = 0;
	for (size_t i = 0; rc == 0 && i < cfg->n_models; i++)
		rc = absolutize(&cfg->models[i].path, abs);
	free(abs);
	return rc;
}

int wf_agent_config_load(struct wf_agent_config *cfg, const char *path, struct wf_diag *diag)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return wf_diag_set(diag, -errno, "config %s: %s", path, strerror(errno));
	struct stat st;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size > MAX_CONFIG_BYTES) {
		close(fd);
		return wf_diag_set(diag, WF_EINVAL, "config %s: not a regular file under 16 MiB",
		                   path);
	}
	size_t len = (size_t)st.st_size;
	char *buf = malloc(len + 1);
	if (!buf) {
		close(fd);
		return -ENOMEM;
	}
	size_t got = 0;
	while (got < len) {
		ssize_t r = read(fd, buf + got, len - got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		got += (size_t)r;
	}
	close(fd);
	struct wf_diag inner = {{0}};
	int rc = wf_agent_config_parse(cfg, buf, got, &inner);
	free(buf);
	if (rc < 0)
		/* "config: ..." becomes "config /etc/weightfloor/agent.json: ..." */
		return wf_diag_set(diag, rc, "config %s:%s", path,
		                   strncmp(inner.msg, "config:", 7) == 0 ? inner.msg + 7
		                                                         : inner.msg);
	if ((rc = resolve_relative(cfg, path)) < 0)
		return wf_diag_set(diag, rc, "config %s: %s", path, strerror(-rc));
	return 0;
}

/* The configured group is the one that may use the floors and the sockets: its members are
 * allowed ipc peers too, not only owners of the socket file. */
static int allow_gid(struct wf_agent_config *cfg, gid_t gid)
{
	for (size_t i = 0; i < cfg->n_allowed_gids; i++)
		if (cfg->allowed_gids[i] == gid)
			return 0;
	gid_t *v = realloc(cfg->allowed_gids, (cfg->n_allowed_gids + 1) * sizeof(*v));
	if (!v)
		return -ENOMEM;
	v[cfg->n_allowed_gids++] = gid;
	cfg->allowed_gids = v;
	return 0;
}

int wf_agent_config_resolve(struct wf_agent_config *cfg, struct wf_diag *diag)
{
	if (!cfg->group) {
		cfg->gid = (gid_t)-1;
		return 0;
	}
	char *end;
	unsigned long v = strtoul(cfg->group, &end, 10);
	if (*end == '\0' && end != cfg->group) {
		cfg->gid = (gid_t)v;
		return allow_gid(cfg, cfg->gid);
	}
	struct group gr, *res = NULL;
	char buf[4096];
	int e = getgrnam_r(cfg->group, &gr, buf, sizeof(buf), &res);
	if (e != 0 || !res)
		return wf_diag_set(diag, WF_ENOT_FOUND, "config: group '%s' does not exist",
		                   cfg->group);
	cfg->gid = res->gr_gid;
	return allow_gid(cfg, cfg->gid);
}

int wf_agent_config_state_path(const struct wf_agent_config *cfg, char **ret_path)
{
	*ret_path = NULL;
	if (cfg->state_file)
		return strcmp(cfg->state_file, "none") == 0
		           ? 0
		           : ((*ret_path = strdup(cfg->state_file)) ? 0 : -ENOMEM);
	const char *sock = cfg->socket_url;
	const char *slash = strncmp(sock, "ipc://", 6) == 0 ? strrchr(sock + 6, '/') : NULL;
	char *p = NULL;
	int n = slash && sock[6] == '/'
	            ? asprintf(&p, "%.*s/agent-state.json", (int)(slash - (sock + 6)), sock + 6)
	            : asprintf(&p, "%s", WF_AGENT_DEFAULT_STATE_FILE);
	if (n < 0)
		return -ENOMEM;
	*ret_path = p;
	return 0;
}

/* Is the resolved path res under one of the model roots? (A root that cannot be resolved admits
 * nothing.) */
static bool under_roots(const struct wf_agent_config *cfg, const char *res)
{
	if (cfg->n_model_roots == 0)
		return true;
	for (size_t i = 0; i < cfg->n_model_roots; i++) {
		char *root = realpath(cfg->model_roots[i], NULL);
		if (!root)
			continue;
		size_t n = strlen(root);
		/* "/models" admits "/models/a.gguf" but not "/models-evil/a.gguf". */
		bool ok = strncmp(res, root, n) == 0 &&
		          (res[n] == '/' || res[n] == '\0' || (n == 1 && root[0] == '/'));
		free(root);
		if (ok)
			return true;
	}
	return false;
}

int wf_agent_config_check_path(const struct wf_agent_config *cfg, const char *path,
                               char **ret_resolved, struct wf_diag *diag)
{
	char *res = realpath(path, NULL);
	if (!res)
		return wf_diag_set(diag, -errno, "model path %s: %s", path, strerror(errno));
	if (under_roots(cfg, res)) {
		*ret_resolved = res;
		return 0;
	}
	int rc = wf_diag_set(diag, WF_EPERMISSION, "model path %s (%s) is outside the model roots",
	                     path, res);
	free(res);
	return rc;
}

int wf_agent_config_check_model(const struct wf_agent_config *cfg, const struct wf_model *model,
                                struct wf_diag *diag)
{
	if (cfg->n_model_roots == 0)
		return 0;
	for (uint32_t i = 0; i < model->n_files; i++) {
		const struct wf_model_file *f = &model->files[i];
		/* A reader that recorded nothing is not one we can vouch for. */
		if (!f->real_path || !under_roots(cfg, f->real_path))
			return wf_diag_set(diag, WF_EPERMISSION,
			                   "model file %s (%s) is outside the model roots", f->path,
			                   f->real_path ? f->real_path : "not resolved");
	}
	for (uint32_t i = 0; i < model->n_aux; i++)
		if (!under_roots(cfg, model->aux_paths[i]))
			return wf_diag_set(diag, WF_EPERMISSION,
			                   "model metadata file %s is outside the model roots",
			                   model->aux_paths[i]);
	return 0;
}
