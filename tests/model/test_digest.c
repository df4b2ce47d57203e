/* wf_model_digest: what changes it and what does not, and its exact definition in model.h. */
#include "base/error.h"
#include "common/wftest.h"
#include "model/model.h"

#include "gguf_build.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

static char *dir;

static void setup(void)
{
	dir = wft_tmpdir("digest");
}

static void teardown(void)
{
	wft_rmtree(dir);
	free(dir);
}

TestSuite(digest, .init = setup, .fini = teardown, .timeout = 60);

static char *in_dir(const char *name)
{
	char *p = NULL;
	cr_assert(asprintf(&p, "%s/%s", dir, name) > 0);
	return p;
}

static void set_mtime(const char *path, time_t sec, long nsec)
{
	struct timespec ts[2] = {{sec, nsec}, {sec, nsec}};
	cr_assert_eq(utimensat(AT_FDCWD, path, ts, 0), 0);
}

static struct wf_digest digest_of(const char *path)
{
	struct wf_model *m = NULL;
	struct wf_diag d = {{0}};
	int rc = wf_model_open(path, &m, &d);
	cr_assert_eq(rc, 0, "%s: %s", path, wf_diag_str(&d, rc));
	struct wf_digest g;
	wf_model_digest(m, &g);
	wf_model_close(m);
	return g;
}

static bool same(struct wf_digest a, struct wf_digest b)
{
	return a.hi == b.hi && a.lo == b.lo;
}

/* Writes a two-tensor model; the first tensor's type and shape are parameters, and its byte
 * size stays 64 so that the file length does not change with them. */
static void write_model(const char *path, uint32_t type, int64_t ne0, int64_t ne1)
{
	struct gt_tensor t[2] = {
	    {"a.weight", type, 2, {ne0, ne1}, 64},
	    {"blk.0.ffn_down_exps.weight", WF_DTYPE_F32, 3, {4, 2, 2}, 64},
	};
	struct gt_model gm = {.n_tensors = 2, .tensors = t};
	struct gb b = {0};
	gt_build(&b, &gm);
	gb_write(&b, path);
	gb_free(&b);
	set_mtime(path, 1700000000, 123456789);
}

static void copy_file(const char *from, const char *to)
{
	size_t n;
	char *data = wft_read_file(from, &n);
	cr_assert_not_null(data);
	struct gb b = {.p = (uint8_t *)data, .n = n, .cap = n};
	gb_write(&b, to);
	free(data);
	struct stat st;
	cr_assert_eq(stat(from, &st), 0);
	set_mtime(to, st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
}

Test(digest, stable_and_sensitive)
{
	char *p = in_dir("m.gguf");
	write_model(p, WF_DTYPE_F32, 4, 4);
	struct wf_digest d0 = digest_of(p);
	cr_assert(same(d0, digest_of(p)), "two opens differ");

	/* Touched: new digest; the old mtime back: the old digest. */
	set_mtime(p, 1700000000, 123456790);
	struct wf_digest d1 = digest_of(p);
	cr_assert(!same(d0, d1));
	set_mtime(p, 1700000000, 123456789);
	cr_assert(same(d0, digest_of(p)));

	/* Same bytes and mtime elsewhere: same digest (paths are not covered). */
	char *sub = in_dir("moved");
	cr_assert_eq(mkdir(sub, 0700), 0);
	char *q = NULL;
	cr_assert(asprintf(&q, "%s/other-name.gguf", sub) > 0);
	copy_file(p, q);
	cr_assert(same(d0, digest_of(q)));

	/* Type changed (F32 [4,4] -> F16 [8,4], 64 bytes each), same size and mtime. */
	write_model(p, WF_DTYPE_F16, 8, 4);
	struct wf_digest d2 = digest_of(p);
	cr_assert(!same(d0, d2));
	/* Shape changed (F32 [4,4] -> [2,8]). */
	write_model(p, WF_DTYPE_F32, 2, 8);
	struct wf_digest d3 = digest_of(p);
	cr_assert(!same(d0, d3));
	cr_assert(!same(d2, d3));
	/* And back. */
	write_model(p, WF_DTYPE_F32, 4, 4);
	cr_assert(same(d0, digest_of(p)));
	free(p);
	free(q);
	free(sub);
}

Test(digest, reference_model_copied_keeps_its_digest)
{
	const char *ref = wft_reference_dir();
	cr_assert_not_null(ref, "tests/data/reference is missing");
	char *src = NULL;
	cr_assert(asprintf(&src, "%s/mixtral-tiny-f32/mixtral-tiny-f32.gguf", ref) > 0);
	char *dst = in_dir("copy.gguf");
	copy_file(src, dst);
	cr_assert(same(digest_of(src), digest_of(dst)));
	set_mtime(dst, 1, 0);
	cr_assert(!same(digest_of(src), digest_of(dst)));
	free(src);
	free(dst);
}

static void feed(XXH3_state_t *st, const void *p, size_t n)
{
	XXH3_128bits_update(st, p, n);
}

/* An independent rendering of model.h's definition. */
Test(digest, matches_the_documented_stream)
{
	char *p = in_dir("m.gguf");
	write_model(p, WF_DTYPE_F32, 4, 4);
	struct wf_model *m = NULL;
	cr_assert_eq(wf_model_open(p, &m, NULL), 0);

	XXH3_state_t *st = XXH3_createState();
	XXH3_128bits_reset(st);
	uint32_t u32 = 1;
	cr_assert_eq(WF_DIGEST_VERSION, 1);
	feed(st, &u32, 4);
	u32 = 1, feed(st, &u32, 4); /* n_files */
	u32 = 2, feed(st, &u32, 4); /* n_tensors */
	struct stat sb;
	cr_assert_eq(stat(p, &sb), 0);
	uint64_t u64 = (uint64_t)sb.st_size;
	feed(st, &u64, 8);
	int64_t i64 = (int64_t)sb.st_mtim.tv_sec * 1000000000 + sb.st_mtim.tv_nsec;
	feed(st, &i64, 8);
	u64 = m->files[0].data_offset, feed(st, &u64, 8);
	cr_assert_eq(u64 % 32, 0);
	const char *names[2] = {"a.weight", "blk.0.ffn_down_exps.weight"};
	int64_t ne[2][3] = {{4, 4}, {4, 2, 2}};
	uint32_t nd[2] = {2, 3};
	for (int t = 0; t < 2; t++) {
		u32 = (uint32_t)strlen(names[t]), feed(st, &u32, 4);
		feed(st, names[t], strlen(names[t]));
		u32 = WF_DTYPE_F32, feed(st, &u32, 4);
		feed(st, &nd[t], 4);
		feed(st, ne[t], 8 * nd[t]);
		u64 = 64, feed(st, &u64, 8);
		u32 = 0, feed(st, &u32, 4);
		u64 = m->files[0].data_offset + 64 * (uint64_t)t, feed(st, &u64, 8);
	}
	XXH128_hash_t h = XXH3_128bits_digest(st);
	XXH3_freeState(st);

	struct wf_digest g;
	wf_model_digest(m, &g);
	cr_assert_eq(g.hi, h.high64);
	cr_assert_eq(g.lo, h.low64);
	wf_model_close(m);
	free(p);
}

Test(digest, hex_round_trip)
{
	struct wf_digest d = {0x0123456789abcdefull, 0xfedcba9876543210ull}, e;
	char hex[WF_DIGEST_HEX_LEN];
	wf_digest_hex(&d, hex);
	cr_assert_str_eq(hex, "0123456789abcdeffedcba9876543210");
	cr_assert_eq(wf_digest_parse(hex, &e), 0);
	cr_assert(same(d, e));
	cr_assert_eq(wf_digest_parse("0123456789ABCDEFFEDCBA9876543210", &e), 0);
	cr_assert(same(d, e));

	e.hi = e.lo = 7;
	cr_assert_eq(wf_digest_parse("0123456789abcdeffedcba987654321", &e), WF_EINVAL);
	cr_assert_eq(wf_digest_parse("0123456789abcdeffedcba98765432100", &e), WF_EINVAL);
	cr_assert_eq(wf_digest_parse("0123456789abcdeffedcba987654321g", &e), WF_EINVAL);
	cr_assert_eq(wf_digest_parse(" 123456789abcdeffedcba9876543210", &e), WF_EINVAL);
	cr_assert_eq(wf_digest_parse("", &e), WF_EINVAL);
	cr_assert_eq(wf_digest_parse(NULL, &e), WF_EINVAL);
	cr_assert_eq(e.hi, 7, "written only on success");

	struct wf_digest z = {0, 0};
	wf_digest_hex(&z, hex);
	cr_assert_str_eq(hex, "00000000000000000000000000000000");
	struct wf_digest x = {UINT64_MAX, 1};
	wf_digest_hex(&x, hex);
	cr_assert_eq(wf_digest_parse(hex, &e), 0);
	cr_assert(same(x, e));
}
