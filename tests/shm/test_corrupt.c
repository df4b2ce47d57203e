/* Damaged regions: every corruption of an existing region is refused with an error code by a
 * reader and rebuilt by an agent; none crashes. Regions are damaged through a separate writable
 * mapping of the file, the way a bug or a stray process would. */
#include "shmtest.h"

#include "base/error.h"
#include "common/wftest.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static char *tmp, *floor_dir, *model_dir, *region_path;
static struct wf_shm_config cfg;
static struct wf_model *model;
static struct wf_digest digest;

static void setup(void)
{
	tmp = wft_tmpdir("shm-corrupt");
	cr_assert(asprintf(&floor_dir, "%s/floor", tmp) > 0);
	cr_assert(asprintf(&model_dir, "%s/model", tmp) > 0);
	cr_assert_eq(mkdir(model_dir, 0755), 0);
	struct shmt_spec spec = {
	    .n_files = 3, .tensors_per_file = 5, .tensor_bytes = 4096, .seed = 11};
	model = shmt_model_make(model_dir, &spec, true);
	cr_assert_not_null(model);
	shmt_digest(model, &digest);
	memset(&cfg, 0, sizeof(cfg));
	cfg.dir = floor_dir;
	cr_assert(asprintf(&region_path, "%s/wf-%016llx%016llx", floor_dir,
	                   (unsigned long long)digest.hi, (unsigned long long)digest.lo) > 0);
}

static void teardown(void)
{
	shmt_model_free(model);
	wft_rmtree(tmp);
}

/* Applies f to a writable mapping of the region file. */
static void with_rw(void (*f)(uint8_t *b, size_t size))
{
	size_t size = 0;
	uint8_t *b = shmt_map_rw(&cfg, model, &size);
	cr_assert_not_null(b);
	f(b, size);
	munmap(b, size);
}

static struct wf_shm_header *H(uint8_t *b)
{
	return (struct wf_shm_header *)b;
}

static struct wf_shm_tensor_entry *T(uint8_t *b, uint32_t i)
{
	return (struct wf_shm_tensor_entry *)(b + H(b)->tensor_table_offset) + i;
}

static struct wf_shm_file_entry *F(uint8_t *b, uint32_t i)
{
	return (struct wf_shm_file_entry *)(b + H(b)->file_table_offset) + i;
}

static void c_magic(uint8_t *b, size_t s)
{
	(void)s;
	H(b)->magic ^= 1;
}
static void c_zero_header(uint8_t *b, size_t s)
{
	(void)s;
	memset(b, 0, 4096);
}
static void c_version(uint8_t *b, size_t s)
{
	H(b)->version = 99;
	shmt_fix_checksums(b, s);
}
static void c_header_flip(uint8_t *b, size_t s)
{
	(void)s;
	H(b)->n_files ^= 4;
}
static void c_reserved_flip(uint8_t *b, size_t s)
{
	(void)s;
	H(b)->reserved[1000] ^= 1;
}
static void c_tables_flip(uint8_t *b, size_t s)
{
	(void)s;
	T(b, 2)->nbytes ^= 1;
}
static void c_tensor_table_offset(uint8_t *b, size_t s)
{
	H(b)->tensor_table_offset = H(b)->total_size + 4096;
	shmt_fix_checksums(b, s);
}
static void c_file_table_size(uint8_t *b, size_t s)
{
	H(b)->file_table_size += 80;
	shmt_fix_checksums(b, s);
}
static void c_data_offset(uint8_t *b, size_t s)
{
	H(b)->data_offset += 8;
	shmt_fix_checksums(b, s);
}
static void c_sections_overlap(uint8_t *b, size_t s)
{
	H(b)->strings_offset = H(b)->tensor_table_offset;
	shmt_fix_checksums(b, s);
}
static void c_section_wraps(uint8_t *b, size_t s)
{
	H(b)->spare_size = UINT64_MAX - H(b)->spare_offset + 4096;
	shmt_fix_checksums(b, s);
}
static void c_n_tensors(uint8_t *b, size_t s)
{
	H(b)->n_tensors += 1;
	shmt_fix_checksums(b, s);
}
static void c_page_size(uint8_t *b, size_t s)
{
	H(b)->page_size = 3000;
	shmt_fix_checksums(b, s);
}
static void c_spare_used(uint8_t *b, size_t s)
{
	H(b)->spare_used = H(b)->spare_size + 1;
	shmt_fix_checksums(b, s);
}
static void c_tensor_floor_out(uint8_t *b, size_t s)
{
	T(b, 3)->floor_offset = H(b)->total_size;
	shmt_fix_checksums(b, s);
}
static void c_tensor_floor_shift(uint8_t *b, size_t s)
{
	T(b, 3)->floor_offset += 32; /* in bounds but no longer where its source offset says */
	shmt_fix_checksums(b, s);
}
static void c_tensor_huge(uint8_t *b, size_t s)
{
	T(b, 4)->nbytes = UINT64_MAX - 8;
	shmt_fix_checksums(b, s);
}
static void c_tensor_file(uint8_t *b, size_t s)
{
	T(b, 0)->file = 3;
	shmt_fix_checksums(b, s);
}
static void c_tensor_dims(uint8_t *b, size_t s)
{
	T(b, 0)->n_dims = 9;
	shmt_fix_checksums(b, s);
}
static void c_tensor_generation(uint8_t *b, size_t s)
{
	/* published at a generation the region has not reached (at its file's bytes, where a
	 * version back at them may be) */
	T(b, 1)->generation = 4;
	H(b)->generation = 2;
	shmt_fix_checksums(b, s);
}
static void c_tensor_spare_unused(uint8_t *b, size_t s)
{
	/* "published" into the spare area, past what it has handed out */
	T(b, 1)->generation = 2;
	T(b, 1)->floor_offset = H(b)->spare_offset;
	H(b)->generation = 2;
	shmt_fix_checksums(b, s);
}
static void c_name_offset(uint8_t *b, size_t s)
{
	T(b, 1)->name_offset = H(b)->strings_size;
	shmt_fix_checksums(b, s);
}
static void c_name_unterminated(uint8_t *b, size_t s)
{
	struct wf_shm_tensor_entry *t = T(b, 1);
	b[H(b)->strings_offset + t->name_offset + t->name_len] = 'x';
	shmt_fix_checksums(b, s);
}
static void c_name_duplicate(uint8_t *b, size_t s)
{
	T(b, 1)->name_offset = T(b, 0)->name_offset;
	T(b, 1)->name_len = T(b, 0)->name_len;
	shmt_fix_checksums(b, s);
}
static void c_file_floor(uint8_t *b, size_t s)
{
	F(b, 1)->floor_offset += 1;
	shmt_fix_checksums(b, s);
}
static void c_file_window(uint8_t *b, size_t s)
{
	F(b, 2)->window_length += 4096;
	shmt_fix_checksums(b, s);
}
static void c_file_path(uint8_t *b, size_t s)
{
	F(b, 0)->path_len = 0xffffffffu;
	shmt_fix_checksums(b, s);
}
static void c_file_tensor_count(uint8_t *b, size_t s)
{
	F(b, 0)->n_tensors += 1;
	shmt_fix_checksums(b, s);
}
static uint32_t *IDX(uint8_t *b)
{
	return (uint32_t *)(b + H(b)->name_index_offset);
}
static void c_index_flip(uint8_t *b, size_t s)
{
	(void)s;
	IDX(b)[4] ^= 1; /* checksum not repaired */
}
static void c_index_out_of_range(uint8_t *b, size_t s)
{
	IDX(b)[7] = H(b)->n_tensors;
	shmt_fix_checksums(b, s);
}
static void c_index_huge(uint8_t *b, size_t s)
{
	IDX(b)[0] = 0xffffffffu;
	shmt_fix_checksums(b, s);
}
static void c_index_unsorted(uint8_t *b, size_t s)
{
	uint32_t t = IDX(b)[2];
	IDX(b)[2] = IDX(b)[9];
	IDX(b)[9] = t;
	shmt_fix_checksums(b, s);
}
static void c_index_repeats(uint8_t *b, size_t s)
{
	IDX(b)[5] = IDX(b)[6]; /* one tensor twice, another missing */
	shmt_fix_checksums(b, s);
}
static void c_index_offset(uint8_t *b, size_t s)
{
	H(b)->name_index_offset += 2; /* misaligned */
	shmt_fix_checksums(b, s);
}
static void c_index_offset_out(uint8_t *b, size_t s)
{
	H(b)->name_index_offset = H(b)->total_size - 4;
	shmt_fix_checksums(b, s);
}
static void c_index_size(uint8_t *b, size_t s)
{
	H(b)->name_index_size -= 4;
	shmt_fix_checksums(b, s);
}
static void c_index_overlaps_tensors(uint8_t *b, size_t s)
{
	H(b)->name_index_offset = H(b)->tensor_table_offset + 128;
	shmt_fix_checksums(b, s);
}
static void c_version_1(uint8_t *b, size_t s)
{
	/* a region written by a version-1 agent: no name index */
	H(b)->version = 1;
	shmt_fix_checksums(b, s);
}

static void c_state_materializing(uint8_t *b, size_t s)
{
	(void)s;
	H(b)->state = WF_SHM_STATE_MATERIALIZING;
}
static void c_state_failed(uint8_t *b, size_t s)
{
	(void)s;
	H(b)->state = WF_SHM_STATE_FAILED;
}
static void c_state_garbage(uint8_t *b, size_t s)
{
	(void)s;
	H(b)->state = 0x12345678;
}
static void c_odd_generation(uint8_t *b, size_t s)
{
	H(b)->generation = 3;
	shmt_fix_checksums(b, s);
}
static void c_digest(uint8_t *b, size_t s)
{
	H(b)->digest_lo ^= 1;
	shmt_fix_checksums(b, s);
}

/* Leaves an unheld READY region, damages it, and checks both kinds of attacher. */
static void run_case(const char *what, void (*corrupt)(uint8_t *, size_t), int want)
{
	struct wf_shm_region *r = NULL;
	struct wf_diag diag;
	int rc;

	cr_assert_eq(shmt_orphan_region(&cfg, model), 0, "%s: setup", what);
	with_rw(corrupt);

	wf_diag_clear(&diag);
	rc = wf_shm_region_attach(&cfg, &digest, NULL, WF_SHM_ATTACH_READER, NULL, NULL, &r, &diag);
	cr_assert_eq(rc, want, "%s: reader got %s (%s), wanted %s", what, wf_err_name(rc),
	             wf_diag_str(&diag, rc), wf_err_name(want));
	cr_assert_neq(diag.msg[0], '\0', "%s: diag explains", what);
	/* a creator that may not rebuild refuses the same way, and changes nothing */
	rc = wf_shm_region_attach(&cfg, &digest, model, WF_SHM_ATTACH_CREATE, shmt_fill, NULL, &r,
	                          NULL);
	cr_assert_lt(rc, 0, "%s: create-only attach", what);
	cr_assert(shmt_exists(region_path), "%s: the damaged region is still there", what);

	/* the agent rebuilds */
	wf_diag_clear(&diag);
	rc = wf_shm_region_attach(&cfg, &digest, model, WF_SHM_ATTACH_AGENT, shmt_fill, NULL, &r,
	                          &diag);
	cr_assert_eq(rc, 0, "%s: agent attach: %s", what, wf_diag_str(&diag, rc));
	cr_assert(wf_shm_region_materialized(r), "%s: rebuilt", what);
	cr_assert_not_null(wf_shm_region_rebuild_reason(r), "%s", what);
	cr_assert_eq(wf_shm_region_verify(r, NULL), 0, "%s", what);
	char why[256];
	cr_assert_eq(shmt_check_bytes(r, model, why, sizeof(why)), 0, "%s: %s", what, why);
	wf_shm_region_detach(r);
	char names[1024];
	cr_assert_eq(shmt_count_entries(floor_dir, names, sizeof(names)), 0, "%s: left %s", what,
	             names);
}

static void truncate_to(off_t size)
{
	cr_assert_eq(truncate(region_path, size), 0);
}

Test(corrupt, header_and_tables, .init = setup, .fini = teardown)
{
	run_case("magic", c_magic, WF_EMAGIC);
	run_case("zeroed header (EMPTY)", c_zero_header, WF_ENOT_READY);
	run_case("version", c_version, WF_EVERSION);
	run_case("header byte", c_header_flip, WF_ECHECKSUM);
	run_case("reserved header byte", c_reserved_flip, WF_ECHECKSUM);
	run_case("table byte", c_tables_flip, WF_ECHECKSUM);
	run_case("tensor table offset", c_tensor_table_offset, WF_EFORMAT);
	run_case("file table size", c_file_table_size, WF_EFORMAT);
	run_case("data offset", c_data_offset, WF_EFORMAT);
	run_case("overlapping sections", c_sections_overlap, WF_EFORMAT);
	run_case("section end wraps", c_section_wraps, WF_EFORMAT);
	run_case("tensor count", c_n_tensors, WF_EFORMAT);
	run_case("page size", c_page_size, WF_EFORMAT);
	run_case("spare used", c_spare_used, WF_EFORMAT);
	run_case("digest", c_digest, WF_EFORMAT);
}

Test(corrupt, entries, .init = setup, .fini = teardown)
{
	run_case("tensor floor offset out", c_tensor_floor_out, WF_EFORMAT);
	run_case("tensor floor offset shifted", c_tensor_floor_shift, WF_EFORMAT);
	run_case("tensor nbytes", c_tensor_huge, WF_EFORMAT);
	run_case("tensor file", c_tensor_file, WF_EFORMAT);
	run_case("tensor dims", c_tensor_dims, WF_EFORMAT);
	run_case("tensor generation", c_tensor_generation, WF_EFORMAT);
	run_case("tensor in unused spare", c_tensor_spare_unused, WF_EFORMAT);
	run_case("name offset", c_name_offset, WF_EFORMAT);
	run_case("name without NUL", c_name_unterminated, WF_EFORMAT);
	run_case("duplicate name", c_name_duplicate, WF_EDUPLICATE);
	run_case("file floor offset", c_file_floor, WF_EFORMAT);
	run_case("file window", c_file_window, WF_EFORMAT);
	run_case("file path", c_file_path, WF_EFORMAT);
	run_case("file tensor count", c_file_tensor_count, WF_EFORMAT);
}

Test(corrupt, name_index, .init = setup, .fini = teardown)
{
	run_case("index byte", c_index_flip, WF_ECHECKSUM);
	run_case("index entry past the table", c_index_out_of_range, WF_EFORMAT);
	run_case("index entry 2^32-1", c_index_huge, WF_EFORMAT);
	run_case("index out of name order", c_index_unsorted, WF_EFORMAT);
	run_case("index repeats a tensor", c_index_repeats, WF_EDUPLICATE);
	run_case("index offset misaligned", c_index_offset, WF_EFORMAT);
	run_case("index offset out of the region", c_index_offset_out, WF_EFORMAT);
	run_case("index size", c_index_size, WF_EFORMAT);
	run_case("index over the tensor table", c_index_overlaps_tensors, WF_EFORMAT);
	run_case("version 1 region", c_version_1, WF_EVERSION);
}

Test(corrupt, states, .init = setup, .fini = teardown)
{
	run_case("MATERIALIZING", c_state_materializing, WF_ENOT_READY);
	run_case("FAILED", c_state_failed, WF_ENOT_READY);
	run_case("unknown state", c_state_garbage, WF_ENOT_READY);
	run_case("odd generation", c_odd_generation, WF_ENOT_READY);
}

static void c_none(uint8_t *b, size_t s)
{
	(void)b;
	(void)s;
}

Test(corrupt, sizes, .init = setup, .fini = teardown)
{
	static const struct {
		const char *what;
		off_t size; /* < 0: current size + |size| */
		int want;
	} cases[] = {
	    {"truncated to half", -1, WF_ETRUNCATED},
	    {"truncated into the header", 100, WF_ETRUNCATED},
	    {"empty file (EMPTY)", 0, WF_ENOT_READY},
	    {"grown", -2, WF_EFORMAT},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct wf_shm_region *r = NULL;
		struct wf_diag diag;
		cr_assert_eq(shmt_orphan_region(&cfg, model), 0);
		long long cur = shmt_file_size(region_path);
		off_t size = cases[i].size == -1   ? cur / 2
		             : cases[i].size == -2 ? cur + 8192
		                                   : cases[i].size;
		truncate_to(size);
		wf_diag_clear(&diag);
		int rc = wf_shm_region_attach(&cfg, &digest, NULL, WF_SHM_ATTACH_READER, NULL, NULL,
		                              &r, &diag);
		cr_assert_eq(rc, cases[i].want, "%s: %s (%s)", cases[i].what, wf_err_name(rc),
		             wf_diag_str(&diag, rc));
		rc = wf_shm_region_attach(&cfg, &digest, model, WF_SHM_ATTACH_AGENT, shmt_fill,
		                          NULL, &r, NULL);
		cr_assert_eq(rc, 0, "%s", cases[i].what);
		cr_assert(wf_shm_region_materialized(r));
		cr_assert_eq(wf_shm_region_verify(r, NULL), 0);
		wf_shm_region_detach(r);
		cr_assert_eq(shmt_count_entries(floor_dir, NULL, 0), 0);
	}
	(void)c_none;
}

Test(corrupt, region_of_another_model, .init = setup, .fini = teardown)
{
	/* Same digest name, but the tables describe other files: an agent with the model sees the
	 * mismatch and rebuilds; a reader without the model cannot tell and attaches. */
	struct shmt_spec spec = {
	    .n_files = 2, .tensors_per_file = 3, .tensor_bytes = 1024, .seed = 12};
	char *other_dir;
	cr_assert(asprintf(&other_dir, "%s/other", tmp) > 0);
	cr_assert_eq(mkdir(other_dir, 0755), 0);
	struct wf_model *other = shmt_model_make(other_dir, &spec, true);
	struct wf_shm_region *r;
	struct shmt_fill_ctx none = {0};
	cr_assert_eq(wf_shm_region_attach(&cfg, &digest, other, WF_SHM_ATTACH_AGENT, shmt_fill,
	                                  &none, &r, NULL),
	             0, "a region named by our digest, filled from another model");
	struct wf_shm_region *r2 = NULL;
	cr_assert_eq(
	    wf_shm_region_attach(&cfg, &digest, model, WF_SHM_ATTACH_READER, NULL, NULL, &r2, NULL),
	    WF_EFORMAT, "a reader that passes the model checks the tables");
	struct wf_diag diag;
	wf_diag_clear(&diag);
	cr_assert_eq(wf_shm_region_attach(&cfg, &digest, model, WF_SHM_ATTACH_AGENT, shmt_fill,
	                                  &none, &r2, &diag),
	             0, "%s", diag.msg);
	cr_assert(wf_shm_region_materialized(r2));
	cr_assert(strstr(wf_shm_region_rebuild_reason(r2), "the model needs"), "%s",
	          wf_shm_region_rebuild_reason(r2));
	/* the first holder keeps its (old) mapping: replaced, not truncated, so no SIGBUS */
	cr_assert_eq(wf_shm_region_verify(r, NULL), 0);
	char why[256];
	cr_assert_eq(shmt_check_bytes(r, other, why, sizeof(why)), 0, "%s", why);
	cr_assert_eq(shmt_check_bytes(r2, model, why, sizeof(why)), 0, "%s", why);
	wf_shm_region_detach(r);
	cr_assert(shmt_exists(region_path), "r2 still holds the name");
	wf_shm_region_detach(r2);
	cr_assert_eq(shmt_count_entries(floor_dir, NULL, 0), 0);
	shmt_model_free(other);
	free(other_dir);
}

Test(corrupt, held_region_damaged_then_rebuilt, .init = setup, .fini = teardown)
{
	struct wf_shm_region *a, *b;
	cr_assert_eq(wf_shm_region_attach(&cfg, &digest, model, WF_SHM_ATTACH_AGENT, shmt_fill,
	                                  NULL, &a, NULL),
	             0);
	struct wf_shm_tensor_info ti;
	cr_assert_eq(wf_shm_region_tensor(a, 5, &ti), 0);
	with_rw(c_magic);
	cr_assert_eq(wf_shm_region_attach(&cfg, &digest, model, WF_SHM_ATTACH_AGENT, shmt_fill,
	                                  NULL, &b, NULL),
	             0);
	cr_assert(wf_shm_region_materialized(b));
	/* a's mapping is the old inode: its tensor bytes are intact and readable */
	cr_assert_eq(wf_shm_checksum(ti.data, ti.nbytes), ti.checksum);
	cr_assert_eq(wf_shm_region_verify(b, NULL), 0);
	wf_shm_region_detach(a);
	wf_shm_region_detach(b);
	cr_assert_eq(shmt_count_entries(floor_dir, NULL, 0), 0);
}

Test(corrupt, symlink_is_not_followed, .init = setup, .fini = teardown)
{
	char *target;
	cr_assert(asprintf(&target, "%s/elsewhere", tmp) > 0);
	cr_assert_eq(shmt_touch(target), 0);
	cr_assert_eq(mkdir(floor_dir, 0750), 0);
	cr_assert_eq(symlink(target, region_path), 0);
	struct wf_shm_region *r = NULL;
	int rc =
	    wf_shm_region_attach(&cfg, &digest, NULL, WF_SHM_ATTACH_READER, NULL, NULL, &r, NULL);
	cr_assert_lt(rc, 0);
	rc = wf_shm_region_attach(&cfg, &digest, model, WF_SHM_ATTACH_AGENT, shmt_fill, NULL, &r,
	                          NULL);
	cr_assert_eq(rc, -ELOOP);
	cr_assert_eq(shmt_file_size(target), 0, "the link target was not written");
	free(target);
}

/* Random damage to the header and tables, with and without repaired checksums: a reader gets an
 * error or a region whose every access stays in bounds; nothing crashes. */
Test(corrupt, random_damage_never_crashes, .init = setup, .fini = teardown)
{
	struct wf_shm_region *keeper, *r;
	size_t size;
	cr_assert_eq(wf_shm_region_attach(&cfg, &digest, model, WF_SHM_ATTACH_AGENT, shmt_fill,
	                                  NULL, &keeper, NULL),
	             0);
	uint8_t *b = shmt_map_rw(&cfg, model, &size);
	cr_assert_not_null(b);
	struct wf_shm_header h0;
	memcpy(&h0, b, sizeof(h0));
	size_t n = h0.data_offset;
	uint8_t *saved = malloc(n);
	memcpy(saved, b, n);
	uint64_t s = 0x1234567;
	unsigned attached = 0, refused = 0;
	for (int iter = 0; iter < 3000; iter++) {
		int k = 1 + (int)(s % 4);
		for (int j = 0; j < k; j++) {
			s = s * 6364136223846793005ull + 1442695040888963407ull;
			/* favour the header's 208 meaningful bytes and the entries */
			size_t pos = (s >> 33) % 3 == 0 ? (size_t)((s >> 20) % 208)
			                                : (size_t)((s >> 20) % n);
			b[pos] = (uint8_t)(s >> 8);
		}
		if (iter % 4 != 0)
			shmt_fix_checksums(b, size);
		int rc = wf_shm_region_attach(&cfg, &digest, NULL, WF_SHM_ATTACH_READER, NULL, NULL,
		                              &r, NULL);
		if (rc == 0) {
			attached++;
			for (uint32_t i = 0; i < wf_shm_region_n_tensors(r); i++) {
				struct wf_shm_tensor_info ti;
				if (wf_shm_region_tensor(r, i, &ti) == 0) {
					cr_assert_leq(ti.floor_offset + ti.nbytes,
					              wf_shm_region_size(r));
					struct wf_shm_tensor_info tj;
					cr_assert_eq(wf_shm_region_find(r, ti.name, &tj), 0);
				}
			}
			rc = wf_shm_region_verify(r, NULL);
			cr_assert(rc == 0 || rc == WF_ECHECKSUM, "verify: %s", wf_err_name(rc));
			wf_shm_region_detach(r);
		} else {
			cr_assert_lt(rc, 0);
			refused++;
		}
		memcpy(b, saved, n);
	}
	cr_assert_gt(refused, 300, "damage is caught (%u refused, %u attached)", refused, attached);
	cr_assert_gt(attached, 0, "harmless damage (reserved bytes, padding) is accepted");
	munmap(b, size);
	free(saved);
	cr_assert_eq(wf_shm_region_verify(keeper, NULL), 0);
	wf_shm_region_detach(keeper);
	cr_assert_eq(shmt_count_entries(floor_dir, NULL, 0), 0);
}
