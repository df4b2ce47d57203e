/* wf-docgen: writes the generated parts of docs/ERRORS.md (the error table, from base/error.h's
 * WF_ERROR_MAP) and docs/PROTOCOL.md (the message and field reference, from the .proto files in
 * proto/), each between a BEGIN and an END marker line, leaving the hand-written prose around them
 * alone.
 *
 *   wf-docgen [--check] SOURCE_DIR
 *
 * Without --check the two files are rewritten in place (only when they change). With --check
 * nothing is written: the exit status is 1, naming the file and the first line that differs,
 * when a committed doc is not what the sources give (the test that keeps them from drifting).
 * Exit 2: a file cannot be read, has no markers, or a .proto line is not understood.
 *
 * The .proto reader knows the subset this project writes: top-level `message` and `enum`
 * blocks holding fields (`[repeated] TYPE name = N;`), enum values, `oneof` groups and
 * `reserved` lines. Comments: the `//` lines right above a declaration (no blank line between)
 * describe it; a `//` after a declaration on its line, continued by `//` lines whose `//` stands
 * in the same column, describes it too; comment blocks followed by a blank line are section
 * prose of the .proto and are left out. */
#include "base/error.h"

#include <dirent.h>
#include <errno.h>
#include <regex.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ERR_BEGIN "<!-- BEGIN GENERATED error table (wf-docgen from base/error.h; do not edit) -->"
#define ERR_END   "<!-- END GENERATED error table -->"
#define PROTO_BEGIN                                                                                \
	"<!-- BEGIN GENERATED message reference (wf-docgen from proto/*.proto; do not edit) -->"
#define PROTO_END "<!-- END GENERATED message reference -->"

struct str {
	char *p;
	size_t len, cap;
};

static void sputn(struct str *s, const char *t, size_t n)
{
	if (s->len + n + 1 > s->cap) {
		size_t cap = s->cap ? s->cap : 4096;
		while (cap < s->len + n + 1)
			cap *= 2;
		char *p = realloc(s->p, cap);
		if (!p) {
			fprintf(stderr, "wf-docgen: out of memory\n");
			exit(2);
		}
		s->p = p;
		s->cap = cap;
	}
	memcpy(s->p + s->len, t, n);
	s->len += n;
	s->p[s->len] = 0;
}

static void sput(struct str *s, const char *t)
{
	sputn(s, t, strlen(t));
}

static void sprintf_(struct str *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sprintf_(struct str *s, const char *fmt, ...)
{
	char buf[4096];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	sput(s, buf);
}

/* Markdown table cells: a pipe would end the cell. */
static void sput_cell(struct str *s, const char *t)
{
	for (; *t; t++) {
		if (*t == '|')
			sput(s, "\\|");
		else
			sputn(s, t, 1);
	}
}

static char *read_text(const char *path)
{
	FILE *f = fopen(path, "r");
	if (!f) {
		fprintf(stderr, "wf-docgen: %s: %s\n", path, strerror(errno));
		exit(2);
	}
	struct str s = {0};
	char buf[65536];
	size_t n;
	while ((n = fread(buf, 1, sizeof buf, f)) > 0)
		sputn(&s, buf, n);
	fclose(f);
	if (!s.p)
		sput(&s, "");
	return s.p;
}

/* ---- the error table ---- */

static void gen_errors(struct str *out)
{
	sput(out, "| code | value | message |\n|---|---|---|\n");
#define ROW_(name, msg) sprintf_(out, "| `WF_E%s` | %d | %s |\n", #name, (int)WF_E##name, msg);
	WF_ERROR_MAP(ROW_)
#undef ROW_
}

/* ---- the .proto reader ---- */

struct decl {
	char *name, *type, *number, *oneof; /* type NULL for enum values; oneof NULL outside one */
	bool repeated;
	struct str doc;
};

struct item {
	bool is_enum;
	char *name;
	struct str doc, reserved;
	struct decl *decls;
	size_t n_decls;
};

struct proto {
	struct item *items;
	size_t n_items;
};

static char *dupn(const char *s, size_t n)
{
	char *d = malloc(n + 1);
	if (!d)
		exit(2);
	memcpy(d, s, n);
	d[n] = 0;
	return d;
}

static char *group(const char *line, const regmatch_t *m)
{
	return m->rm_so < 0 ? NULL : dupn(line + m->rm_so, (size_t)(m->rm_eo - m->rm_so));
}

/* Appends comment text to a doc, a space between pieces. */
static void doc_add(struct str *doc, const char *text)
{
	while (*text == ' ')
		text++;
	size_t n = strlen(text);
	while (n && (text[n - 1] == ' ' || text[n - 1] == '\r'))
		n--;
	if (!n)
		return;
	if (doc->len)
		sput(doc, " ");
	sputn(doc, text, n);
}

static void parse_proto(const char *path, struct proto *pr)
{
	regex_t re_open, re_field, re_value, re_oneof, re_reserved;
	if (regcomp(&re_open, "^(message|enum)[ \t]+([A-Za-z_][A-Za-z0-9_]*)[ \t]*\\{[ \t]*$",
	            REG_EXTENDED) ||
	    regcomp(
	        &re_field,
	        "^[ \t]*(repeated[ \t]+)?([A-Za-z_][A-Za-z0-9_.]*)[ \t]+([A-Za-z_][A-Za-z0-9_]*)"
	        "[ \t]*=[ \t]*([0-9]+)[ \t]*;[ \t]*(//(.*))?$",
	        REG_EXTENDED) ||
	    regcomp(&re_value,
	            "^[ \t]*([A-Z_][A-Z0-9_]*)[ \t]*=[ \t]*(-?[0-9]+)[ \t]*;[ \t]*(//(.*))?$",
	            REG_EXTENDED) ||
	    regcomp(&re_oneof, "^[ \t]*oneof[ \t]+([A-Za-z_][A-Za-z0-9_]*)[ \t]*\\{[ \t]*$",
	            REG_EXTENDED) ||
	    regcomp(&re_reserved, "^[ \t]*reserved[ \t]+([^;]*);[ \t]*(//(.*))?$", REG_EXTENDED)) {
		fprintf(stderr, "wf-docgen: regcomp failed\n");
		exit(2);
	}
	char *text = read_text(path);
	struct item *cur = NULL;
	char *oneof = NULL;
	struct str pending = {0};
	long trail_col = -1; /* column of the last declaration's trailing "//", -1: none */
	struct str *trail_doc = NULL;
	int lineno = 0;
	for (char *line = text, *next; line && *line; line = next) {
		next = strchr(line, '\n');
		if (next)
			*next++ = 0;
		lineno++;
		regmatch_t m[8];
		const char *p = line;
		while (*p == ' ' || *p == '\t')
			p++;
		if (!*p) { /* a blank line ends a comment block: section prose, not a description */
			pending.len = 0;
			trail_col = -1;
			continue;
		}
		if (p[0] == '/' && p[1] == '/') {
			if (trail_col >= 0 && p - line == trail_col && trail_doc) {
				doc_add(trail_doc, p + 2);
			} else {
				trail_col = -1;
				if (!pending.p)
					sput(&pending, "");
				doc_add(&pending, p + 2);
			}
			continue;
		}
		trail_col = -1;
		trail_doc = NULL;
		const char *leading = pending.len ? pending.p : "";
		if (!cur) {
			if (regexec(&re_open, line, 3, m, 0) == 0) {
				struct item *items =
				    realloc(pr->items, (pr->n_items + 1) * sizeof(*items));
				if (!items)
					exit(2);
				pr->items = items;
				cur = &pr->items[pr->n_items++];
				memset(cur, 0, sizeof(*cur));
				cur->is_enum = line[0] == 'e';
				cur->name = group(line, &m[2]);
				doc_add(&cur->doc, leading);
			} else if (strncmp(p, "syntax", 6) && strncmp(p, "package", 7) &&
			           strncmp(p, "option", 6) && strncmp(p, "import", 6)) {
				fprintf(stderr, "wf-docgen: %s:%d: not understood: %s\n", path,
				        lineno, line);
				exit(2);
			}
		} else if (*p == '}') {
			if (oneof) {
				free(oneof);
				oneof = NULL;
			} else {
				cur = NULL;
			}
		} else if (!cur->is_enum && regexec(&re_oneof, line, 2, m, 0) == 0) {
			oneof = group(line, &m[1]);
		} else if (regexec(&re_reserved, line, 4, m, 0) == 0) {
			char *what = group(line, &m[1]);
			if (cur->reserved.len)
				sput(&cur->reserved, "; ");
			sprintf_(&cur->reserved, "%s", what);
			free(what);
			struct str note = {0};
			doc_add(&note, leading);
			if (m[3].rm_so >= 0)
				doc_add(&note, line + m[3].rm_so);
			if (note.len)
				sprintf_(&cur->reserved, " (%s)", note.p);
			free(note.p);
		} else {
			bool is_value = cur->is_enum;
			if (regexec(is_value ? &re_value : &re_field, line, 7, m, 0) != 0) {
				fprintf(stderr, "wf-docgen: %s:%d: not understood: %s\n", path,
				        lineno, line);
				exit(2);
			}
			struct decl *ds = realloc(cur->decls, (cur->n_decls + 1) * sizeof(*ds));
			if (!ds)
				exit(2);
			cur->decls = ds;
			struct decl *d = &cur->decls[cur->n_decls++];
			memset(d, 0, sizeof(*d));
			int cm; /* the group holding the trailing comment's text */
			if (is_value) {
				d->name = group(line, &m[1]);
				d->number = group(line, &m[2]);
				cm = 4;
			} else {
				d->repeated = m[1].rm_so >= 0;
				d->type = group(line, &m[2]);
				d->name = group(line, &m[3]);
				d->number = group(line, &m[4]);
				d->oneof = oneof ? strdup(oneof) : NULL;
				cm = 6;
			}
			doc_add(&d->doc, leading);
			if (m[cm].rm_so >= 0) {
				doc_add(&d->doc, line + m[cm].rm_so);
				trail_col = m[cm].rm_so - 2;
				trail_doc = &d->doc;
			}
		}
		pending.len = 0;
		if (pending.p)
			pending.p[0] = 0;
	}
	if (cur) {
		fprintf(stderr, "wf-docgen: %s: '%s' is not closed\n", path, cur->name);
		exit(2);
	}
	free(pending.p);
	free(text);
	regfree(&re_open);
	regfree(&re_field);
	regfree(&re_value);
	regfree(&re_oneof);
	regfree(&re_reserved);
}

/* A type defined in the .proto links to its entry (GitHub's anchor for "#### `Name`" is the name
 * in lower case); scalars and foreign types are plain code. */
static void put_type(struct str *out, const struct proto *pr, const char *t)
{
	for (size_t i = 0; i < pr->n_items; i++)
		if (strcmp(pr->items[i].name, t) == 0) {
			sprintf_(out, "[`%s`](#", t);
			for (const char *c = t; *c; c++)
				sprintf_(out, "%c", *c >= 'A' && *c <= 'Z' ? *c - 'A' + 'a' : *c);
			sput(out, ")");
			return;
		}
	sprintf_(out, "`%s`", t);
}

static void gen_item(struct str *out, const struct proto *pr, const struct item *it)
{
	sprintf_(out, "#### `%s`\n\n", it->name);
	if (it->doc.len)
		sprintf_(out, "%s\n\n", it->doc.p);
	if (it->is_enum) {
		sput(out, "| value | number | meaning |\n|---|---|---|\n");
		for (size_t i = 0; i < it->n_decls; i++) {
			const struct decl *d = &it->decls[i];
			sprintf_(out, "| `%s` | %s | ", d->name, d->number);
			sput_cell(out, d->doc.len ? d->doc.p : "");
			sput(out, " |\n");
		}
	} else if (!it->n_decls) {
		sput(out, "No fields.\n");
	} else {
		sput(out, "| field | number | type | meaning |\n|---|---|---|---|\n");
		for (size_t i = 0; i < it->n_decls; i++) {
			const struct decl *d = &it->decls[i];
			sprintf_(out, "| `%s` | %s | %s", d->name, d->number,
			         d->repeated ? "repeated " : "");
			put_type(out, pr, d->type);
			if (d->oneof)
				sprintf_(out, " (oneof `%s`)", d->oneof);
			sput(out, " | ");
			sput_cell(out, d->doc.len ? d->doc.p : "");
			sput(out, " |\n");
		}
	}
	if (it->reserved.len)
		sprintf_(out, "\nReserved: %s.\n", it->reserved.p);
	sput(out, "\n");
}

static void gen_protocol(struct str *out, const struct proto *pr, const char *const *files,
                         size_t n_files)
{
	sput(out, "Generated from");
	for (size_t i = 0; i < n_files; i++)
		sprintf_(out, " `proto/%s`", files[i]);
	sput(out, ", in the order of the file.\n\n### Enums\n\n");
	for (size_t i = 0; i < pr->n_items; i++)
		if (pr->items[i].is_enum)
			gen_item(out, pr, &pr->items[i]);
	sput(out, "### Messages\n\n");
	for (size_t i = 0; i < pr->n_items; i++)
		if (!pr->items[i].is_enum)
			gen_item(out, pr, &pr->items[i]);
	while (out->len >= 2 && out->p[out->len - 1] == '\n' && out->p[out->len - 2] == '\n')
		out->p[--out->len] = 0;
}

static void proto_free(struct proto *pr)
{
	for (size_t i = 0; i < pr->n_items; i++) {
		struct item *it = &pr->items[i];
		for (size_t j = 0; j < it->n_decls; j++) {
			struct decl *d = &it->decls[j];
			free(d->name);
			free(d->type);
			free(d->number);
			free(d->oneof);
			free(d->doc.p);
		}
		free(it->decls);
		free(it->name);
		free(it->doc.p);
		free(it->reserved.p);
	}
	free(pr->items);
}

/* ---- splicing ---- */

/* doc with the lines between begin and end (markers kept) replaced by body. */
static char *splice(const char *path, const char *doc, const char *begin, const char *end,
                    const char *body)
{
	const char *b = strstr(doc, begin), *e = b ? strstr(b, end) : NULL;
	if (!b || !e || (b != doc && b[-1] != '\n') || (e[-1] != '\n')) {
		fprintf(stderr, "wf-docgen: %s: no \"%s\" ... \"%s\" lines\n", path, begin, end);
		exit(2);
	}
	struct str s = {0};
	sputn(&s, doc, (size_t)(b - doc) + strlen(begin));
	sput(&s, "\n");
	sput(&s, body);
	sput(&s, e);
	return s.p;
}

/* Writes (or with check, compares) path; returns 0, or 1 when check finds a difference. */
static int update(const char *path, const char *old, const char *new, bool check)
{
	if (strcmp(old, new) == 0)
		return 0;
	if (check) {
		int line = 1;
		const char *a = old, *b = new;
		for (; *a && *a == *b; a++, b++)
			line += *a == '\n';
		fprintf(stderr,
		        "wf-docgen: %s differs from its sources from line %d on: run "
		        "`cmake --build build --target docs` and commit the result\n",
		        path, line);
		return 1;
	}
	char tmp[4096];
	snprintf(tmp, sizeof tmp, "%s.tmp", path);
	FILE *f = fopen(tmp, "w");
	if (!f || fputs(new, f) < 0 || fclose(f) != 0 || rename(tmp, path) != 0) {
		fprintf(stderr, "wf-docgen: writing %s: %s\n", path, strerror(errno));
		exit(2);
	}
	printf("wf-docgen: wrote %s\n", path);
	return 0;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(int argc, char **argv)
{
	bool check = argc == 3 && strcmp(argv[1], "--check") == 0;
	if (argc != 2 + check) {
		fprintf(stderr, "usage: wf-docgen [--check] SOURCE_DIR\n");
		return 2;
	}
	const char *src = argv[1 + check];
	char path[4096];
	int rc = 0;

	snprintf(path, sizeof path, "%s/docs/ERRORS.md", src);
	struct str body = {0};
	gen_errors(&body);
	char *doc = read_text(path);
	char *new = splice(path, doc, ERR_BEGIN, ERR_END, body.p);
	rc |= update(path, doc, new, check);
	free(doc);
	free(new);
	free(body.p);

	/* Every .proto file, in name order, so the output does not depend on readdir. */
	snprintf(path, sizeof path, "%s/proto", src);
	DIR *dir = opendir(path);
	if (!dir) {
		fprintf(stderr, "wf-docgen: %s: %s\n", path, strerror(errno));
		return 2;
	}
	char *files[64];
	size_t n_files = 0;
	struct dirent *de;
	while ((de = readdir(dir)) && n_files < 64) {
		size_t n = strlen(de->d_name);
		if (n > 6 && strcmp(de->d_name + n - 6, ".proto") == 0)
			files[n_files++] = strdup(de->d_name);
	}
	closedir(dir);
	qsort(files, n_files, sizeof *files, cmp_str);
	struct proto pr = {0};
	for (size_t i = 0; i < n_files; i++) {
		snprintf(path, sizeof path, "%s/proto/%s", src, files[i]);
		parse_proto(path, &pr);
	}
	body = (struct str){0};
	gen_protocol(&body, &pr, (const char *const *)files, n_files);
	sput(&body, "\n");
	snprintf(path, sizeof path, "%s/docs/PROTOCOL.md", src);
	doc = read_text(path);
	new = splice(path, doc, PROTO_BEGIN, PROTO_END, body.p);
	rc |= update(path, doc, new, check);
	free(doc);
	free(new);
	free(body.p);
	proto_free(&pr);
	for (size_t i = 0; i < n_files; i++)
		free(files[i]);
	return rc;
}
