#include "base/diag.h"
#include "base/error.h"
#include "base/units.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

Test(error, names_and_messages_cover_every_code)
{
	for (int c = WF_E_BASE_ + 1; c < WF_E_MAX_; c++) {
		cr_assert(wf_is_wf_error(c));
		cr_assert(c < -4000, "code %d collides with errno range", c);
		cr_assert_str_neq(wf_strerror(c), "unknown error");
		cr_assert(strncmp(wf_err_name(c), "WF_E", 4) == 0);
	}
	cr_assert_str_eq(wf_err_name(WF_ETRUNCATED), "WF_ETRUNCATED");
	cr_assert_str_eq(wf_strerror(WF_ETRUNCATED), "data truncated");
	cr_assert_str_eq(wf_err_name(-ENOSPC), "ENOSPC");
	cr_assert_str_eq(wf_strerror(0), "success");
	cr_assert(!wf_is_wf_error(-ENOENT));
	cr_assert_str_eq(wf_err_name(12345), "E?");
}

Test(diag, first_message_wins)
{
	struct wf_diag d = {{0}};
	cr_assert_eq(wf_diag_set(&d, WF_EFORMAT, "inner %d", 1), WF_EFORMAT);
	wf_diag_set(&d, WF_EINVAL, "outer");
	cr_assert_str_eq(wf_diag_str(&d, WF_EFORMAT), "inner 1");
	wf_diag_clear(&d);
	cr_assert_str_eq(wf_diag_str(&d, WF_EFORMAT), "malformed data");
	cr_assert_eq(wf_diag_set(NULL, -EIO, "ignored"), -EIO);
	cr_assert_str_eq(wf_diag_str(NULL, -ENOENT), strerror(ENOENT));
}

Test(units, parse_size)
{
	struct {
		const char *s;
		int rc;
		uint64_t v;
	} cases[] = {
	    {"0", 0, 0},
	    {"4096", 0, 4096},
	    {"1K", 0, 1024},
	    {"1KiB", 0, 1024},
	    {"2M", 0, 2u << 20},
	    {"64G", 0, 64ull << 30},
	    {"1.5G", 0, 3ull << 29},
	    {"3T", 0, 3ull << 40},
	    {"10 MB", 0, 10u << 20},
	    {" 7b ", 0, 7},
	    {"", WF_EINVAL, 0},
	    {"-1", WF_EINVAL, 0},
	    {"G", WF_EINVAL, 0},
	    {"1X", WF_EINVAL, 0},
	    {"1.", WF_EINVAL, 0},
	    {"1GG", WF_EINVAL, 0},
	    {"99999999999999999999", WF_EOVERFLOW, 0},
	    {"16777216T", WF_EOVERFLOW, 0},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		uint64_t v = 12345;
		int rc = wf_parse_size(cases[i].s, &v);
		cr_assert_eq(rc, cases[i].rc, "'%s': rc %d want %d", cases[i].s, rc, cases[i].rc);
		if (rc == 0)
			cr_assert_eq(v, cases[i].v, "'%s': %llu want %llu", cases[i].s,
			             (unsigned long long)v, (unsigned long long)cases[i].v);
		else
			cr_assert_eq(v, 12345, "output written on failure");
	}
	cr_assert_eq(wf_parse_size(NULL, NULL), WF_EINVAL);
}

/* docs/ERRORS.md lists every code with its value and message: the table cannot drift from the
 * X-macro. */
Test(error, docs_table_matches)
{
	char path[4096];
	snprintf(path, sizeof path, "%s/docs/ERRORS.md",
	         getenv("WF_SOURCE_DIR") ? getenv("WF_SOURCE_DIR") : ".");
	FILE *f = fopen(path, "r");
	cr_assert(f, "cannot open %s", path);
	static char text[1 << 16];
	size_t n = fread(text, 1, sizeof text - 1, f);
	text[n] = '\0';
	fclose(f);
	for (int c = WF_E_BASE_ + 1; c < WF_E_MAX_; c++) {
		char row[256];
		snprintf(row, sizeof row, "| `%s` | %d | %s |", wf_err_name(c), c, wf_strerror(c));
		cr_assert(strstr(text, row), "docs/ERRORS.md lacks the row: %s", row);
	}
}
