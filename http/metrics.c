/* The metrics registry and its text rendering (http/metrics.h). */
#include "http/metrics.h"

#include "base/error.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const double wf_metrics_seconds_buckets[] = {
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60, 150, 300, 600};
const size_t wf_metrics_seconds_buckets_n =
    sizeof wf_metrics_seconds_buckets / sizeof wf_metrics_seconds_buckets[0];

#define MAX_COLLECTORS 8

struct series {
	char *values[WF_METRIC_MAX_LABELS];
	double value;                            /* counter, gauge */
	uint64_t buckets[WF_METRIC_MAX_BUCKETS]; /* histogram: per bound, not cumulative */
	uint64_t count;                          /* histogram: every observation (+Inf) */
	double sum;
};

struct wf_metric {
	struct wf_metrics *reg;
	enum wf_metric_type type;
	char *name, *help;
	char *labels[WF_METRIC_MAX_LABELS];
	size_t n_labels;
	double bounds[WF_METRIC_MAX_BUCKETS];
	size_t n_bounds;
	struct series **series;
	size_t n_series, cap_series;
	struct wf_metric *next;
};

struct wf_metrics {
	pthread_mutex_t mu;        /* families and series */
	pthread_mutex_t render_mu; /* one render (collectors included) at a time */
	struct wf_metric *head, **tail;
	struct {
		wf_metrics_collect_fn *fn;
		void *ctx;
	} collectors[MAX_COLLECTORS];
	size_t n_collectors;
	uint64_t dropped;
};

int wf_metrics_create(struct wf_metrics **ret)
{
	struct wf_metrics *reg = calloc(1, sizeof(*reg));
	if (!reg)
		return -ENOMEM;
	pthread_mutex_init(&reg->mu, NULL);
	pthread_mutex_init(&reg->render_mu, NULL);
	reg->tail = &reg->head;
	*ret = reg;
	return 0;
}

static void series_free(struct series *s)
{
	if (!s)
		return;
	for (size_t i = 0; i < WF_METRIC_MAX_LABELS; i++)
		free(s->values[i]);
	free(s);
}

static void family_free(struct wf_metric *m)
{
	if (!m)
		return;
	for (size_t i = 0; i < m->n_series; i++)
		series_free(m->series[i]);
	free(m->series);
	for (size_t i = 0; i < m->n_labels; i++)
		free(m->labels[i]);
	free(m->name);
	free(m->help);
	free(m);
}

void wf_metrics_destroy(struct wf_metrics *reg)
{
	if (!reg)
		return;
	for (struct wf_metric *m = reg->head, *next; m; m = next) {
		next = m->next;
		family_free(m);
	}
	pthread_mutex_destroy(&reg->mu);
	pthread_mutex_destroy(&reg->render_mu);
	free(reg);
}

static bool name_ok(const char *s, bool colon)
{
	if (!s || !*s)
		return false;
	for (const char *p = s; *p; p++) {
		char c = *p;
		bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
		             (colon && c == ':');
		if (!alpha && !(p != s && c >= '0' && c <= '9'))
			return false;
	}
	return true;
}

static bool ends_with(const char *s, const char *suffix)
{
	size_t n = strlen(s), k = strlen(suffix);
	return n >= k && strcmp(s + n - k, suffix) == 0;
}

int wf_metrics_add(struct wf_metrics *reg, enum wf_metric_type type, const char *name,
                   const char *help, const char *const *labels, const double *bounds,
                   size_t n_bounds, struct wf_metric **ret)
{
	if ((unsigned)type >= WF_METRIC_TYPE_MAX || !name_ok(name, true) || !help ||
	    strchr(help, '\n'))
		return WF_EINVAL;
	if (type == WF_METRIC_COUNTER && !ends_with(name, "_total"))
		return WF_EINVAL;
	if ((type == WF_METRIC_HISTOGRAM) != (n_bounds > 0) || n_bounds > WF_METRIC_MAX_BUCKETS ||
	    (n_bounds && !bounds))
		return WF_EINVAL;
	for (size_t i = 0; i < n_bounds; i++)
		if (!isfinite(bounds[i]) || (i && !(bounds[i] > bounds[i - 1])))
			return WF_EINVAL;
	size_t n_labels = 0;
	for (; labels && labels[n_labels]; n_labels++) {
		const char *l = labels[n_labels];
		if (n_labels == WF_METRIC_MAX_LABELS || !name_ok(l, false) ||
		    strncmp(l, "__", 2) == 0 || (type == WF_METRIC_HISTOGRAM && !strcmp(l, "le")))
			return WF_EINVAL;
	}
	struct wf_metric *m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->reg = reg;
	m->type = type;
	m->name = strdup(name);
	m->help = strdup(help);
	m->n_bounds = n_bounds;
	if (n_bounds)
		memcpy(m->bounds, bounds, n_bounds * sizeof(*bounds));
	bool oom = !m->name || !m->help;
	for (size_t i = 0; i < n_labels; i++) {
		m->labels[i] = strdup(labels[i]);
		m->n_labels = i + 1;
		oom = oom || !m->labels[i];
	}
	if (oom) {
		family_free(m);
		return -ENOMEM;
	}
	pthread_mutex_lock(&reg->mu);
	for (struct wf_metric *o = reg->head; o; o = o->next) {
		if (strcmp(o->name, name) == 0) {
			pthread_mutex_unlock(&reg->mu);
			family_free(m);
			return WF_EDUPLICATE;
		}
	}
	*reg->tail = m;
	reg->tail = &m->next;
	pthread_mutex_unlock(&reg->mu);
	*ret = m;
	return 0;
}

static bool values_equal(const struct series *s, const char *const *values, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		const char *v = values && values[i] ? values[i] : "";
		if (strcmp(s->values[i], v) != 0)
			return false;
	}
	return true;
}

/* The series for values, created when missing. Called with the lock held; NULL with *ret_rc
 * set when it cannot be had. */
static struct series *series_get_locked(struct wf_metric *m, const char *const *values, int *ret_rc)
{
	for (size_t i = 0; i < m->n_series; i++)
		if (values_equal(m->series[i], values, m->n_labels))
			return m->series[i];
	if (m->n_series == WF_METRIC_MAX_SERIES) {
		m->reg->dropped++;
		*ret_rc = WF_ELIMIT;
		return NULL;
	}
	if (m->n_series == m->cap_series) {
		size_t cap = m->cap_series ? 2 * m->cap_series : 4;
		struct series **v = realloc(m->series, cap * sizeof(*v));
		if (!v)
			goto oom;
		m->series = v;
		m->cap_series = cap;
	}
	struct series *s = calloc(1, sizeof(*s));
	if (!s)
		goto oom;
	for (size_t i = 0; i < m->n_labels; i++) {
		s->values[i] = strdup(values && values[i] ? values[i] : "");
		if (!s->values[i]) {
			series_free(s);
			goto oom;
		}
	}
	m->series[m->n_series++] = s;
	return s;
oom:
	m->reg->dropped++;
	*ret_rc = -ENOMEM;
	return NULL;
}

int wf_metric_add(struct wf_metric *m, const char *const *values, double v)
{
	if (m->type == WF_METRIC_HISTOGRAM || (m->type == WF_METRIC_COUNTER && !(v >= 0)))
		return WF_EINVAL;
	int rc = 0;
	pthread_mutex_lock(&m->reg->mu);
	struct series *s = series_get_locked(m, values, &rc);
	if (s)
		s->value += v;
	pthread_mutex_unlock(&m->reg->mu);
	return rc;
}

int wf_metric_set(struct wf_metric *m, const char *const *values, double v)
{
	if (m->type == WF_METRIC_HISTOGRAM)
		return WF_EINVAL;
	int rc = 0;
	pthread_mutex_lock(&m->reg->mu);
	struct series *s = series_get_locked(m, values, &rc);
	if (s) {
		if (m->type == WF_METRIC_COUNTER && v < s->value)
			rc = WF_EINVAL; /* a counter never goes down */
		else
			s->value = v;
	}
	pthread_mutex_unlock(&m->reg->mu);
	return rc;
}

int wf_metric_observe(struct wf_metric *m, const char *const *values, double v)
{
	if (m->type != WF_METRIC_HISTOGRAM || isnan(v))
		return WF_EINVAL;
	int rc = 0;
	pthread_mutex_lock(&m->reg->mu);
	struct series *s = series_get_locked(m, values, &rc);
	if (s) {
		for (size_t i = 0; i < m->n_bounds; i++) {
			if (v <= m->bounds[i]) {
				s->buckets[i]++;
				break;
			}
		}
		s->count++;
		s->sum += v;
	}
	pthread_mutex_unlock(&m->reg->mu);
	return rc;
}

void wf_metric_clear(struct wf_metric *m)
{
	pthread_mutex_lock(&m->reg->mu);
	for (size_t i = 0; i < m->n_series; i++)
		series_free(m->series[i]);
	m->n_series = 0;
	pthread_mutex_unlock(&m->reg->mu);
}

int wf_metrics_collector_add(struct wf_metrics *reg, wf_metrics_collect_fn *fn, void *ctx)
{
	int rc = 0;
	pthread_mutex_lock(&reg->render_mu);
	if (reg->n_collectors == MAX_COLLECTORS) {
		rc = WF_ELIMIT;
	} else {
		reg->collectors[reg->n_collectors].fn = fn;
		reg->collectors[reg->n_collectors].ctx = ctx;
		reg->n_collectors++;
	}
	pthread_mutex_unlock(&reg->render_mu);
	return rc;
}

/* ---- rendering ---------------------------------------------------------------------------- */

/* Length of the valid UTF-8 sequence at p (1-4), or 0 when it is not one. */
static size_t utf8_len(const unsigned char *p)
{
	if (p[0] < 0x80)
		return 1;
	size_t n;
	uint32_t cp;
	if ((p[0] & 0xe0) == 0xc0) {
		n = 2;
		cp = p[0] & 0x1f;
	} else if ((p[0] & 0xf0) == 0xe0) {
		n = 3;
		cp = p[0] & 0x0f;
	} else if ((p[0] & 0xf8) == 0xf0) {
		n = 4;
		cp = p[0] & 0x07;
	} else {
		return 0;
	}
	for (size_t i = 1; i < n; i++) {
		if ((p[i] & 0xc0) != 0x80) /* also stops at the NUL */
			return 0;
		cp = (cp << 6) | (p[i] & 0x3f);
	}
	static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
	if (cp < min[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
		return 0;
	return n;
}

/* Writes s escaped: backslash and newline always, the double quote in label values. */
static void put_escaped(FILE *f, const char *s, bool quote)
{
	const unsigned char *p = (const unsigned char *)s;
	while (*p) {
		size_t n = utf8_len(p);
		if (n == 0) {
			fputc('?', f);
			p++;
		} else if (*p == '\\') {
			fputs("\\\\", f);
			p++;
		} else if (*p == '\n') {
			fputs("\\n", f);
			p++;
		} else if (quote && *p == '"') {
			fputs("\\\"", f);
			p++;
		} else {
			fwrite(p, 1, n, f);
			p += n;
		}
	}
}

/* A float as the format reads it (Go's ParseFloat): "+Inf", "-Inf", "NaN", integers without
 * an exponent up to 2^53, else the shortest of %.15g and %.17g that reads back exactly. */
static void put_number(FILE *f, double v)
{
	if (isnan(v)) {
		fputs("NaN", f);
		return;
	}
	if (isinf(v)) {
		fputs(v > 0 ? "+Inf" : "-Inf", f);
		return;
	}
	if (v == floor(v) && fabs(v) <= 9007199254740992.0) {
		fprintf(f, "%.0f", v);
		return;
	}
	char buf[40];
	snprintf(buf, sizeof buf, "%.15g", v);
	if (strtod(buf, NULL) != v)
		snprintf(buf, sizeof buf, "%.17g", v);
	fputs(buf, f);
}

/* name{labels[,le="x"]} */
static void put_series_name(FILE *f, const struct wf_metric *m, const struct series *s,
                            const char *suffix, const double *le)
{
	fputs(m->name, f);
	fputs(suffix, f);
	if (m->n_labels == 0 && !le)
		return;
	fputc('{', f);
	for (size_t i = 0; i < m->n_labels; i++) {
		fprintf(f, "%s%s=\"", i ? "," : "", m->labels[i]);
		put_escaped(f, s->values[i], true);
		fputc('"', f);
	}
	if (le) {
		fprintf(f, "%sle=\"", m->n_labels ? "," : "");
		put_number(f, *le);
		fputc('"', f);
	}
	fputc('}', f);
}

static void render_family(FILE *f, const struct wf_metric *m)
{
	static const char *const type_name[] = {"counter", "gauge", "histogram"};
	fprintf(f, "# HELP %s ", m->name);
	put_escaped(f, m->help, false);
	fprintf(f, "\n# TYPE %s %s\n", m->name, type_name[m->type]);
	for (size_t i = 0; i < m->n_series; i++) {
		const struct series *s = m->series[i];
		if (m->type != WF_METRIC_HISTOGRAM) {
			put_series_name(f, m, s, "", NULL);
			fputc(' ', f);
			put_number(f, s->value);
			fputc('\n', f);
			continue;
		}
		uint64_t cum = 0;
		for (size_t b = 0; b <= m->n_bounds; b++) {
			double le = b < m->n_bounds ? m->bounds[b] : INFINITY;
			cum = b < m->n_bounds ? cum + s->buckets[b] : s->count;
			put_series_name(f, m, s, "_bucket", &le);
			fprintf(f, " %llu\n", (unsigned long long)cum);
		}
		put_series_name(f, m, s, "_sum", NULL);
		fputc(' ', f);
		put_number(f, s->sum);
		fputc('\n', f);
		put_series_name(f, m, s, "_count", NULL);
		fprintf(f, " %llu\n", (unsigned long long)s->count);
	}
}

int wf_metrics_render(struct wf_metrics *reg, char **ret_text, size_t *ret_len)
{
	pthread_mutex_lock(&reg->render_mu);
	for (size_t i = 0; i < reg->n_collectors; i++)
		reg->collectors[i].fn(reg->collectors[i].ctx);
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);
	if (!f) {
		pthread_mutex_unlock(&reg->render_mu);
		return -ENOMEM;
	}
	pthread_mutex_lock(&reg->mu);
	for (const struct wf_metric *m = reg->head; m; m = m->next)
		render_family(f, m);
	uint64_t dropped = reg->dropped;
	pthread_mutex_unlock(&reg->mu);
	fprintf(f,
	        "# HELP weightfloor_metrics_dropped_total Series updates dropped (too many series "
	        "in a family, or no memory).\n"
	        "# TYPE weightfloor_metrics_dropped_total counter\n"
	        "weightfloor_metrics_dropped_total %llu\n",
	        (unsigned long long)dropped);
	int bad = ferror(f);
	if (fclose(f) != 0 || bad) {
		free(text);
		pthread_mutex_unlock(&reg->render_mu);
		return -ENOMEM;
	}
	pthread_mutex_unlock(&reg->render_mu);
	*ret_text = text;
	*ret_len = len;
	return 0;
}
