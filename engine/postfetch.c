/* Post-fetch settings: one table of names, parsed the same way from flags, config keys and the
 * environment. */
#include "engine/postfetch.h"

#include "base/error.h"
#include "base/units.h"

#include <ctype.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

extern char **environ;

#define PREFIX "WF_POSTFETCH_"

enum kind { KIND_BOOL, KIND_U32 };

static const struct setting {
	const char *name; /* upper case, without the prefix */
	enum kind kind;
	size_t offset;
	uint32_t max;
} settings[] = {
    {"ENABLE", KIND_BOOL, offsetof(struct wf_postfetch_settings, enable), 1},
    {"FORCE_CPU", KIND_BOOL, offsetof(struct wf_postfetch_settings, force_cpu), 1},
    {"BLOCK_ON_MISS", KIND_BOOL, offsetof(struct wf_postfetch_settings, block_on_miss), 1},
    {"MAX_TRANSFERS", KIND_U32, offsetof(struct wf_postfetch_settings, max_transfers),
     WF_POSTFETCH_MAX_TRANSFERS_MAX},
    {"SCRATCHPAD_MB", KIND_U32, offsetof(struct wf_postfetch_settings, scratchpad_mb),
     WF_POSTFETCH_SCRATCHPAD_MB_MAX},
    {"DEDICATED_STREAMS", KIND_BOOL, offsetof(struct wf_postfetch_settings, dedicated_streams), 1},
    {"DEBUG", KIND_BOOL, offsetof(struct wf_postfetch_settings, debug), 1},
};

void wf_postfetch_settings_default(struct wf_postfetch_settings *s)
{
	*s = (struct wf_postfetch_settings){.enable = true, .block_on_miss = true};
}

/* name without the prefix, '-' read as '_', any case; false if it does not fit. */
static bool normalize(const char *name, char *out, size_t cap)
{
	if (strncasecmp(name, PREFIX, strlen(PREFIX)) == 0)
		name += strlen(PREFIX);
	size_t n = strlen(name);
	if (n == 0 || n >= cap)
		return false;
	for (size_t i = 0; i < n; i++)
		out[i] = name[i] == '-' ? '_' : (char)toupper((unsigned char)name[i]);
	out[n] = '\0';
	return true;
}

static int parse_bool(const char *v, bool *ret)
{
	static const char *const yes[] = {"1", "true", "yes", "on"};
	static const char *const no[] = {"0", "false", "no", "off"};
	for (size_t i = 0; i < 4; i++) {
		if (strcasecmp(v, yes[i]) == 0) {
			*ret = true;
			return 0;
		}
		if (strcasecmp(v, no[i]) == 0) {
			*ret = false;
			return 0;
		}
	}
	return WF_EINVAL;
}

int wf_postfetch_settings_set(struct wf_postfetch_settings *s, const char *name, const char *value,
                              struct wf_diag *diag)
{
	char key[64];
	if (!name || !value || !normalize(name, key, sizeof key))
		return wf_diag_set(diag, WF_ENOT_FOUND, "unknown post-fetch setting '%s'",
		                   name ? name : "");
	for (size_t i = 0; i < sizeof(settings) / sizeof(settings[0]); i++) {
		const struct setting *st = &settings[i];
		if (strcmp(st->name, key) != 0)
			continue;
		char *field = (char *)s + st->offset;
		if (st->kind == KIND_BOOL) {
			bool b;
			if (parse_bool(value, &b) < 0)
				return wf_diag_set(diag, WF_EINVAL,
				                   PREFIX
				                   "%s: '%s' is not 0, 1, true, false, yes, no, on "
				                   "or off",
				                   st->name, value);
			*(bool *)(void *)field = b;
			return 0;
		}
		uint64_t v;
		if (wf_parse_uint(value, st->max, &v) < 0)
			return wf_diag_set(diag, WF_EINVAL,
			                   PREFIX "%s: '%s' is not a whole number from 0 to %u",
			                   st->name, value, st->max);
		*(uint32_t *)(void *)field = (uint32_t)v;
		return 0;
	}
	return wf_diag_set(diag, WF_ENOT_FOUND,
	                   "unknown post-fetch setting '%s' (ENABLE, FORCE_CPU, BLOCK_ON_MISS, "
	                   "MAX_TRANSFERS, SCRATCHPAD_MB, DEDICATED_STREAMS, DEBUG)",
	                   name);
}

int wf_postfetch_settings_from_env(struct wf_postfetch_settings *s, struct wf_diag *diag)
{
	for (char **e = environ; e && *e; e++) {
		if (strncmp(*e, PREFIX, strlen(PREFIX)) != 0)
			continue;
		const char *eq = strchr(*e, '=');
		char name[96];
		size_t n = eq ? (size_t)(eq - *e) : strlen(*e);
		if (!eq || n >= sizeof name)
			return wf_diag_set(diag, WF_EINVAL, "malformed environment entry '%.64s'",
			                   *e);
		memcpy(name, *e, n);
		name[n] = '\0';
		int rc = wf_postfetch_settings_set(s, name, eq + 1, diag);
		if (rc < 0)
			return rc;
	}
	return 0;
}
