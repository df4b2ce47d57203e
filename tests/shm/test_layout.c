/* Region layout arithmetic: section placement, windows, tensor floor offsets, limits, overflow. */
#include "base/error.h"
#include "model/meta.h"
#include "shm/layout.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A model built in memory only: layout never touches files. */
struct hand {
	struct wf_model m;
	struct wf_model_file files[3];
	struct wf_tensor tensors[6];
	char names[6][32];
};

static void hand_init(struct hand *h)
{
	memset(h, 0, sizeof(*h));
	static char *paths[] = {"/models/a.gguf", "/models/b-00002-of-00003.gguf", "/c.gguf"};
	/* data_offset not page-aligned, data ends mid-page; file 1 ends exactly at its data end. */
	const uint64_t doff[3] = {1000, 4096, 8200};
	const uint64_t dsize[3] = {5000, 12288, 64};
	const uint64_t fsize[3] = {7000, 4096 + 12288, 8264};
	for (int i = 0; i < 3; i++) {
		h->files[i].path = paths[i];
		h->files[i].data_offset = doff[i];
		h->files[i].data_size = dsize[i];
		h->files[i].size = fsize[i];
		h->files[i].mtime_ns = 1700000000000000000ll + i;
		h->files[i].gguf_version = 3;
		h->files[i].alignment = 32;
	}
	/* two tensors per file: the first at the start of the section, the second at its end */
	for (int i = 0; i < 6; i++) {
		struct wf_tensor *t = &h->tensors[i];
		uint32_t f = (uint32_t)(i / 2);
		snprintf(h->names[i], sizeof(h->names[i]), "blk.%d.w", i);
		t->name = h->names[i];
		t->file = f;
		t->dtype = WF_DTYPE_F32;
		t->n_dims = 1;
		t->nbytes = 32;
		t->ne[0] = 8;
		for (int d = 1; d < WF_MODEL_MAX_DIMS; d++)
			t->ne[d] = 1;
		t->offset = i % 2 ? doff[f] + dsize[f] - 32 : doff[f];
	}
	h->m.format = WF_MODEL_FORMAT_GGUF;
	h->m.n_files = 3;
	h->m.files = h->files;
	h->m.n_tensors = 6;
	h->m.tensors = h->tensors;
}

Test(layout, windows)
{
	struct wf_model_file f = {.data_offset = 1000, .data_size = 5000, .size = 7000};
	struct wf_shm_window w;
	cr_assert_eq(wf_shm_layout_window(&f, &w), 0);
	cr_assert_eq(w.offset, 0);
	cr_assert_eq(w.length, 8192);
	cr_assert_eq(w.copy_length, 7000, "window clipped at EOF");

	f = (struct wf_model_file){.data_offset = 8200, .data_size = 64, .size = 100000};
	cr_assert_eq(wf_shm_layout_window(&f, &w), 0);
	cr_assert_eq(w.offset, 8192);
	cr_assert_eq(w.length, 4096);
	cr_assert_eq(w.copy_length, 4096);

	f = (struct wf_model_file){.data_offset = 5000, .data_size = 0, .size = 5000};
	cr_assert_eq(wf_shm_layout_window(&f, &w), 0);
	cr_assert_eq(w.length, 0, "a file without tensors has an empty section");
	cr_assert_eq(w.copy_length, 0);

	f = (struct wf_model_file){.data_offset = UINT64_MAX - 10, .data_size = 100};
	cr_assert_eq(wf_shm_layout_window(&f, &w), WF_EOVERFLOW);
	f = (struct wf_model_file){.data_offset = UINT64_MAX - 4000, .data_size = 10};
	cr_assert_eq(wf_shm_layout_window(&f, &w), WF_EOVERFLOW, "align_up overflow");
}

Test(layout, sections)
{
	struct hand h;
	struct wf_shm_layout l;
	struct wf_diag diag;
	hand_init(&h);
	wf_diag_clear(&diag);
	cr_assert_eq(wf_shm_layout_compute(&h.m, 10000, &l, &diag), 0, "%s", diag.msg);
	cr_assert_eq(l.n_files, 3);
	cr_assert_eq(l.n_tensors, 6);
	cr_assert_eq(l.file_table_offset, 4096);
	cr_assert_eq(l.file_table_size, 3 * 80);
	cr_assert_eq(l.tensor_table_offset % 64, 0);
	cr_assert_geq(l.tensor_table_offset, l.file_table_offset + l.file_table_size);
	cr_assert_eq(l.tensor_table_size, 6 * 128);
	cr_assert_eq(l.name_index_offset, l.tensor_table_offset + l.tensor_table_size);
	cr_assert_eq(l.name_index_offset % 64, 0);
	cr_assert_eq(l.name_index_size, 6 * 4);
	cr_assert_eq(l.strings_offset, l.name_index_offset + l.name_index_size);
	size_t strings = 0;
	for (int i = 0; i < 3; i++)
		strings += strlen(h.files[i].path) + 1;
	for (int i = 0; i < 6; i++)
		strings += strlen(h.names[i]) + 1;
	cr_assert_eq(l.strings_size, strings);
	cr_assert_eq(l.data_offset % 4096, 0);
	cr_assert_geq(l.data_offset, l.strings_offset + l.strings_size);
	cr_assert_eq(l.data_size, 8192 + 12288 + 4096);
	cr_assert_eq(l.spare_offset, l.data_offset + l.data_size);
	cr_assert_eq(l.spare_size, 12288, "spare rounds up to pages");
	cr_assert_eq(l.total_size, l.spare_offset + l.spare_size);
	cr_assert_eq(l.total_size % 4096, 0);

	cr_assert_eq(wf_shm_layout_compute(&h.m, 0, &l, NULL), 0);
	cr_assert_eq(l.spare_size, 0);
}

Test(layout, tables_and_floor_offsets)
{
	struct hand h;
	struct wf_shm_layout l;
	hand_init(&h);
	cr_assert_eq(wf_shm_layout_compute(&h.m, 0, &l, NULL), 0);
	uint8_t *buf = malloc(l.data_offset);
	memset(buf, 0xee, l.data_offset);
	cr_assert_eq(wf_shm_layout_write(&h.m, &l, buf, l.data_offset - 1, NULL), WF_EINVAL);
	cr_assert_eq(wf_shm_layout_write(&h.m, &l, buf, l.data_offset, NULL), 0);
	const struct wf_shm_file_entry *fe = (const void *)(buf + l.file_table_offset);
	const struct wf_shm_tensor_entry *te = (const void *)(buf + l.tensor_table_offset);
	const char *pool = (const char *)buf + l.strings_offset;

	uint64_t section = l.data_offset;
	for (int i = 0; i < 3; i++) {
		cr_assert_eq(fe[i].floor_offset, section, "file %d section is packed", i);
		cr_assert_eq(fe[i].floor_offset % 4096, 0);
		cr_assert_eq(fe[i].window_offset, h.files[i].data_offset & ~4095ull);
		cr_assert_eq(fe[i].size, h.files[i].size);
		cr_assert_eq(fe[i].mtime_ns, h.files[i].mtime_ns);
		cr_assert_eq(fe[i].n_tensors, 2);
		cr_assert_str_eq(pool + fe[i].path_offset, h.files[i].path);
		cr_assert_eq(fe[i].path_len, strlen(h.files[i].path));
		section += fe[i].window_length;
	}
	cr_assert_eq(fe[0].copy_length, 7000);
	cr_assert_eq(fe[1].copy_length, 12288);
	for (int i = 0; i < 6; i++) {
		const struct wf_tensor *t = &h.tensors[i];
		const struct wf_shm_file_entry *f = &fe[t->file];
		cr_assert_eq(te[i].floor_offset, f->floor_offset + (t->offset - f->window_offset),
		             "tensor %d: floor offset follows its file offset", i);
		cr_assert_eq(te[i].floor_offset % 32, t->offset % 32);
		cr_assert_leq(te[i].floor_offset + te[i].nbytes,
		              f->floor_offset + f->window_length);
		cr_assert_eq(te[i].source_offset, t->offset);
		cr_assert_eq(te[i].nbytes, 32);
		cr_assert_eq(te[i].file, t->file);
		cr_assert_eq(te[i].checksum, 0);
		cr_assert_eq(te[i].generation, 0);
		cr_assert_str_eq(pool + te[i].name_offset, t->name);
	}
	/* the name index lists every tensor once, in strcmp order of the names */
	const uint32_t *idx = (const void *)(buf + l.name_index_offset);
	bool seen[6] = {false};
	for (int k = 0; k < 6; k++) {
		cr_assert_lt(idx[k], 6);
		cr_assert_not(seen[idx[k]], "index %d repeats tensor %u", k, idx[k]);
		seen[idx[k]] = true;
		if (k > 0)
			cr_assert_lt(strcmp(pool + te[idx[k - 1]].name_offset,
			                    pool + te[idx[k]].name_offset),
			             0, "index %d is in name order", k);
	}
	/* padding between the tables is zeroed, so tables_checksum is reproducible */
	for (uint64_t o = l.file_table_offset + l.file_table_size; o < l.tensor_table_offset; o++)
		cr_assert_eq(buf[o], 0);
	for (uint64_t o = l.strings_offset + l.strings_size; o < l.meta_offset; o++)
		cr_assert_eq(buf[o], 0);
	for (uint64_t o = l.meta_offset + l.meta_size; o < l.data_offset; o++)
		cr_assert_eq(buf[o], 0);
	/* the metadata section: 8-aligned after the pool, the model's own encoding */
	cr_assert_eq(l.meta_offset % 8, 0);
	cr_assert_geq(l.meta_offset, l.strings_offset + l.strings_size);
	cr_assert_lt(l.meta_offset, l.strings_offset + l.strings_size + 8);
	size_t mlen = 0;
	cr_assert_eq(wf_model_meta_encode(&h.m, NULL, 0, &mlen, NULL), 0);
	cr_assert_eq(mlen, l.meta_size);
	cr_assert_eq(wf_model_meta_decode(buf + l.meta_offset, (size_t)l.meta_size, NULL, NULL), 0);
	free(buf);
}

Test(layout, name_index)
{
	struct hand h;
	struct wf_shm_layout l;
	hand_init(&h);
	/* model order is not name order; prefixes sort first, bytes compare unsigned */
	static const char *names[6] = {"z", "blk.1", "blk.10", "blk", "\xc3\xa9", "blk.1a"};
	static const int want[6] = {3, 1, 2, 5, 0, 4}; /* model indices in name order */
	for (int i = 0; i < 6; i++)
		snprintf(h.names[i], sizeof(h.names[i]), "%s", names[i]);
	cr_assert_eq(wf_shm_layout_compute(&h.m, 0, &l, NULL), 0);
	uint8_t *buf = calloc(1, l.data_offset);
	cr_assert_eq(wf_shm_layout_write(&h.m, &l, buf, l.data_offset, NULL), 0);
	const uint32_t *idx = (const void *)(buf + l.name_index_offset);
	for (int k = 0; k < 6; k++)
		cr_assert_eq(idx[k], (uint32_t)want[k], "entry %d: tensor %u, want %d", k, idx[k],
		             want[k]);

	/* a duplicate name cannot be indexed: refused when the tables are written */
	snprintf(h.names[5], sizeof(h.names[5]), "blk.1");
	struct wf_diag diag;
	wf_diag_clear(&diag);
	cr_assert_eq(wf_shm_layout_write(&h.m, &l, buf, l.data_offset, &diag), WF_EDUPLICATE);
	cr_assert(strstr(diag.msg, "'blk.1'"), "%s", diag.msg);

	/* a layout without a name index (as built by hand, or by code older than version 2) is
	 * refused rather than written over the header */
	struct wf_shm_layout bad = l;
	bad.name_index_offset = 0;
	cr_assert_eq(wf_shm_layout_write(&h.m, &bad, buf, l.data_offset, NULL), WF_EINVAL);
	free(buf);
}

Test(layout, rejects_bad_models)
{
	struct hand h;
	struct wf_shm_layout l;
	struct wf_diag diag;

	hand_init(&h);
	h.tensors[3].offset += 1; /* now ends one byte past file 1's data section */
	wf_diag_clear(&diag);
	cr_assert_eq(wf_shm_layout_compute(&h.m, 0, &l, &diag), WF_EFORMAT);
	cr_assert(strstr(diag.msg, "blk.3.w"), "diag names the tensor: %s", diag.msg);

	hand_init(&h);
	h.tensors[0].offset = h.files[0].data_offset - 1;
	cr_assert_eq(wf_shm_layout_compute(&h.m, 0, &l, NULL), WF_EFORMAT, "before the section");

	hand_init(&h);
	h.tensors[2].file = 3;
	cr_assert_eq(wf_shm_layout_compute(&h.m, 0, &l, NULL), WF_EFORMAT);

	hand_init(&h);
	h.tensors[2].n_dims = 9;
	cr_assert_eq(wf_shm_layout_compute(&h.m, 0, &l, NULL), WF_EFORMAT);

	hand_init(&h);
	h.files[2].size = 8000; /* data ends at 8264 */
	cr_assert_eq(wf_shm_layout_compute(&h.m, 0, &l, NULL), WF_ETRUNCATED);

	hand_init(&h);
	h.names[4][0] = '\0';
	cr_assert_eq(wf_shm_layout_compute(&h.m, 0, &l, NULL), WF_EFORMAT, "empty name");

	hand_init(&h);
	char *long_name = malloc(WF_MODEL_MAX_NAME + 2);
	memset(long_name, 'x', WF_MODEL_MAX_NAME + 1);
	long_name[WF_MODEL_MAX_NAME + 1] = '\0';
	h.tensors[1].name = long_name;
	cr_assert_eq(wf_shm_layout_compute(&h.m, 0, &l, NULL), WF_ELIMIT);
	free(long_name);

	hand_init(&h);
	h.m.n_files = WF_MODEL_MAX_FILES + 1; /* rejected before the array is read */
	cr_assert_eq(wf_shm_layout_compute(&h.m, 0, &l, NULL), WF_ELIMIT);
	hand_init(&h);
	h.m.n_tensors = WF_MODEL_MAX_TENSORS + 1;
	cr_assert_eq(wf_shm_layout_compute(&h.m, 0, &l, NULL), WF_ELIMIT);

	hand_init(&h);
	h.m.n_files = 0;
	cr_assert_eq(wf_shm_layout_compute(&h.m, 0, &l, NULL), WF_EINVAL);
	cr_assert_eq(wf_shm_layout_compute(NULL, 0, &l, NULL), WF_EINVAL);
	hand_init(&h);
	h.files[1].path = NULL;
	cr_assert_eq(wf_shm_layout_compute(&h.m, 0, &l, NULL), WF_EINVAL);
}

Test(layout, rejects_overflow)
{
	struct hand h;
	struct wf_shm_layout l;
	struct wf_diag diag;

	hand_init(&h);
	wf_diag_clear(&diag);
	cr_assert_eq(wf_shm_layout_compute(&h.m, UINT64_MAX, &l, &diag), WF_EOVERFLOW, "spare");
	cr_assert_eq(wf_shm_layout_compute(&h.m, UINT64_MAX - 8192, &l, NULL), WF_EOVERFLOW);
	cr_assert_eq(wf_shm_layout_compute(&h.m, (uint64_t)INT64_MAX, &l, NULL), WF_EOVERFLOW,
	             "past off_t");

	/* a data section that wraps */
	hand_init(&h);
	h.m.n_tensors = 0;
	h.files[0].data_offset = UINT64_MAX - 100;
	h.files[0].data_size = 1000;
	h.files[0].size = UINT64_MAX;
	cr_assert_eq(wf_shm_layout_compute(&h.m, 0, &l, NULL), WF_EOVERFLOW);

	/* sections that fit one by one but not summed */
	hand_init(&h);
	h.m.n_tensors = 0;
	for (int i = 0; i < 3; i++) {
		h.files[i].data_offset = 0;
		h.files[i].data_size = 1ull << 63;
		h.files[i].size = 1ull << 63;
	}
	wf_diag_clear(&diag);
	cr_assert_eq(wf_shm_layout_compute(&h.m, 0, &l, &diag), WF_EOVERFLOW);
	cr_assert(strstr(diag.msg, "/models/b-00002-of-00003.gguf"), "%s", diag.msg);
	for (int i = 0; i < 3; i++)
		h.files[i].data_size = h.files[i].size = 1ull << 62;
	h.m.n_files = 2; /* 2^63 + tables: past INT64_MAX, which is all off_t can say */
	cr_assert_eq(wf_shm_layout_compute(&h.m, 0, &l, NULL), WF_EOVERFLOW);
	h.m.n_files = 1;
	cr_assert_eq(wf_shm_layout_compute(&h.m, 0, &l, NULL), 0, "2^62 alone is fine");
	cr_assert_eq(l.data_size, 1ull << 62);

	/* a tensor whose end wraps */
	hand_init(&h);
	h.tensors[0].nbytes = UINT64_MAX - 10;
	cr_assert_eq(wf_shm_layout_compute(&h.m, 0, &l, NULL), WF_EOVERFLOW);
}

Test(layout, header_checksum_and_static_layout)
{
	cr_assert_eq(sizeof(struct wf_shm_header), 4096);
	cr_assert_eq(sizeof(struct wf_shm_file_entry), 80);
	cr_assert_eq(sizeof(struct wf_shm_tensor_entry), 128);
	cr_assert_eq(offsetof(struct wf_shm_header, header_checksum), 200);
	uint8_t magic[8];
	uint64_t m = WF_SHM_MAGIC;
	memcpy(magic, &m, 8);
	cr_assert_eq(memcmp(magic, "WFFLOOR\x1a", 8), 0, "magic bytes on a little-endian host");

	struct wf_shm_header *h = calloc(1, sizeof(*h));
	h->magic = WF_SHM_MAGIC;
	h->n_tensors = 7;
	uint64_t a = wf_shm_header_checksum(h);
	h->header_checksum = 12345;
	h->state = WF_SHM_STATE_MATERIALIZING;
	cr_assert_eq(wf_shm_header_checksum(h), a, "checksum ignores its own field and the state");
	h->n_tensors = 8;
	cr_assert_neq(wf_shm_header_checksum(h), a);
	h->n_tensors = 7;
	h->reserved[100] = 1;
	cr_assert_neq(wf_shm_header_checksum(h), a, "reserved bytes are covered");
	free(h);
	cr_assert_str_eq(wf_shm_state_name(WF_SHM_STATE_READY), "READY");
	cr_assert_str_eq(wf_shm_state_name(99), "?");
}
