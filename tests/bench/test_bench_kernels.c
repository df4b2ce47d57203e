/* `wf-bench kernels`: without a CUDA device it says why, prints a skipped row and exits 77 (the
 * GPU script's run of it must not mistake a missing GPU for a figure); with one, every row comes
 * out as a JSON line with a finite, positive value and ratio, the mat-vec rows at n = 1 with
 * issue 18's goal (>= 0.7 of the measured read bandwidth). */
#include "benchrows.h"
#include "common/wftest.h"

#include <criterion/criterion.h>
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *dir;

static void fini(void)
{
	if (dir)
		wft_rmtree(dir);
}

static void expect_row(const char *out, const char *name, bool goal)
{
	struct json_object *j = row(out, name);
	cr_assert(j, "no %s row in:\n%s", name, out);
	const double v = num(j, "value"), a = num(j, "anchor_value"), r = num(j, "ratio");
	cr_expect(isfinite(v) && v > 0, "%s value %g", name, v);
	cr_expect(isfinite(a) && a > 0, "%s anchor %g", name, a);
	cr_expect(isfinite(r) && r > 0 && fabs(r - v / a) <= 1e-6 * r, "%s ratio %g", name, r);
	struct json_object *g;
	cr_expect(json_object_object_get_ex(j, "goal_op", &g) == goal, "%s: goal %s", name,
	          json_object_to_json_string(j));
	json_object_put(j);
}

Test(bench_kernels, rows_or_skipped, .fini = fini, .timeout = 120)
{
	dir = wft_tmpdir("bench-kernels");
	char out[4200], err[4200];
	snprintf(out, sizeof out, "%s/out.jsonl", dir);
	snprintf(err, sizeof err, "%s/err.txt", dir);
	char *argv[] = {wft_exe("bench/wf-bench"), "kernels", "--json", "--iterations", "2", NULL};
	const int rc = wft_run(argv, out, err, 100);
	char *o = wft_read_file(out, NULL), *e = wft_read_file(err, NULL);
	if (rc == 77) {
		struct json_object *j = row(o, "read_bandwidth");
		cr_assert(j, "no skipped row in:\n%s", o);
		cr_expect(strstr(str(j, "skipped"), "no CUDA device"), "%s",
		          json_object_to_json_string(j));
		cr_expect(strstr(e, "skipped"), "stderr: %s", e);
		json_object_put(j);
	} else {
		cr_assert_eq(rc, 0, "wf-bench kernels exited %d\nstdout:\n%s\nstderr:\n%s", rc, o,
		             e);
		expect_row(o, "read_bandwidth", false);
		static const char *const types[] = {"F32",  "F16",  "BF16", "Q8_0",
		                                    "Q4_0", "Q4_K", "Q5_K", "Q6_K"};
		char name[64];
		for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
			snprintf(name, sizeof name, "matvec_%s_n1", types[i]);
			expect_row(o, name, true);
			snprintf(name, sizeof name, "matvec_%s_n32", types[i]);
			expect_row(o, name, false);
		}
		expect_row(o, "mul_mat_id_gate_up_n1", false);
		expect_row(o, "mul_mat_id_down_n8", false);
		expect_row(o, "attention_decode_4k", false);
	}
	free(o);
	free(e);
}
