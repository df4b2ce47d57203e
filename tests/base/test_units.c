/* The one size syntax (base/units.h): every suffix is a power of 1024, in flags, config files and
 * device specs alike. */
#include "base/error.h"
#include "base/units.h"

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>

#define KiB (1ull << 10)
#define MiB (1ull << 20)
#define GiB (1ull << 30)
#define TiB (1ull << 40)

static void expect(const char *s, int rc, uint64_t want)
{
	uint64_t v = 777;
	int got = wf_parse_size(s, &v);
	cr_assert_eq(got, rc, "'%s': rc %d want %d", s, got, rc);
	if (rc == 0)
		cr_assert_eq(v, want, "'%s': %llu want %llu", s, (unsigned long long)v,
		             (unsigned long long)want);
	else
		cr_assert_eq(v, 777, "'%s': output written on failure", s);
}

Test(units, plain_bytes)
{
	expect("0", 0, 0);
	expect("1", 0, 1);
	expect("4096", 0, 4096);
	expect("4096B", 0, 4096);
	expect("9223372036854775808", 0, 1ull << 63);
}

Test(units, short_suffixes_are_binary)
{
	expect("1K", 0, KiB);
	expect("8M", 0, 8 * MiB);
	expect("8G", 0, 8 * GiB);
	expect("2T", 0, 2 * TiB);
	expect("1P", 0, 1ull << 50);
	expect("8g", 0, 8 * GiB);
}

Test(units, iec_suffixes_mean_the_same)
{
	expect("1Ki", 0, KiB);
	expect("8Mi", 0, 8 * MiB);
	expect("8Gi", 0, 8 * GiB);
	expect("2Ti", 0, 2 * TiB);
	expect("8GiB", 0, 8 * GiB);
}

/* "GB" exists in people's fingers; it gets the one meaning, not 10^9. */
Test(units, b_suffixes_are_binary_too)
{
	expect("1KB", 0, KiB);
	expect("8GB", 0, 8 * GiB);
	expect("8 GB", 0, 8 * GiB);
	expect("3TB", 0, 3 * TiB);
}

Test(units, fractions_round_to_bytes)
{
	expect("1.5K", 0, 1536);
	expect("0.5G", 0, GiB / 2);
	expect("1.25Mi", 0, MiB + MiB / 4);
}

Test(units, rejects)
{
	static const char *bad[] = {"",   " ",   "+1",  "-1",    ".5", "1.",  "1e9", "0x10",
	                            "8X", "8Gx", "8iB", "8 G B", "G",  "1GG", "nan", "inf"};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
		expect(bad[i], WF_EINVAL, 0);
	uint64_t v;
	cr_assert_eq(wf_parse_size(NULL, &v), WF_EINVAL);
}

Test(units, overflow)
{
	expect("9223372036854775809", WF_EOVERFLOW, 0);
	expect("18446744073709551616", WF_EOVERFLOW, 0);
	expect("8388609T", WF_EOVERFLOW, 0);
	expect("8193P", WF_EOVERFLOW, 0);
}

/* wf_parse_uint: digits only, at most max. */
Test(units, whole_numbers)
{
	uint64_t v = 777;
	cr_expect_eq(wf_parse_uint("0", 10, &v), 0);
	cr_expect_eq(v, 0);
	cr_expect_eq(wf_parse_uint("4096", 4096, &v), 0);
	cr_expect_eq(v, 4096);
	cr_expect_eq(wf_parse_uint("18446744073709551615", UINT64_MAX, &v), 0);
	cr_expect_eq(v, UINT64_MAX);
	v = 777;
	cr_expect_eq(wf_parse_uint("4097", 4096, &v), WF_EOVERFLOW);
	cr_expect_eq(wf_parse_uint("18446744073709551616", UINT64_MAX, &v), WF_EOVERFLOW);
	const char *bad[] = {"", "-1", "+1", " 1", "1 ", "1k", "0x10", "1.5", "12a"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		cr_expect_eq(wf_parse_uint(bad[i], UINT64_MAX, &v), WF_EINVAL, "'%s'", bad[i]);
	cr_expect_eq(wf_parse_uint(NULL, 1, &v), WF_EINVAL);
	cr_expect_eq(v, 777, "a refused value writes nothing");
}

/* wf_parse_ids: "1,17,300", nothing looser. */
Test(units, id_lists)
{
	int32_t *ids = NULL;
	size_t n = 0;
	cr_assert_eq(wf_parse_ids("1,17,300,2147483647", 8, &ids, &n), 0);
	cr_expect_eq(n, 4);
	cr_expect(ids[0] == 1 && ids[1] == 17 && ids[2] == 300 && ids[3] == INT32_MAX);
	free(ids);
	cr_assert_eq(wf_parse_ids("0", 1, &ids, &n), 0);
	cr_expect(n == 1 && ids[0] == 0);
	free(ids);
	const char *bad[] = {"", ",", "1,", ",1", "1,,2", "1, 2", "-1", "2147483648", "1;2", "x"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		cr_expect_eq(wf_parse_ids(bad[i], 8, &ids, &n), WF_EINVAL, "'%s'", bad[i]);
	cr_expect_eq(wf_parse_ids("1,2,3", 2, &ids, &n), WF_ELIMIT);
}
