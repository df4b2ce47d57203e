/* Region layout: where things go (pure arithmetic), writing the tables, and validating a region
 * found in the floor directory. Everything read from a region is bounds-checked here before any
 * other file of the module dereferences it. */
#include "base/error.h"
#include "model/meta.h"
#include "shm/shm_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#define FILE_ENTRY_SIZE       ((uint64_t)sizeof(struct wf_shm_file_entry))
#define TENSOR_ENTRY_SIZE     ((uint64_t)sizeof(struct wf_shm_tensor_entry))
#define NAME_INDEX_ENTRY_SIZE ((uint64_t)sizeof(uint32_t))

/* One load of a field of the shared region: never repeated by the compiler between a check and a
 * use, whatever another process writes meanwhile. */
#define LOAD(field) __atomic_load_n(&(field), __ATOMIC_RELAXED)

/* a must be a power of two. True on overflow. */
static bool align_up_ovf(uint64_t v, uint64_t a, uint64_t *ret)
{
	uint64_t t;
	if (__builtin_add_overflow(v, a - 1, &t))
		return true;
	*ret = t & ~(a - 1);
	return false;
}

/* [off, off + len) inside [lo, hi), without overflow. */
static bool range_in(uint64_t off, uint64_t len, uint64_t lo, uint64_t hi)
{
	uint64_t end;
	if (off < lo || __builtin_add_overflow(off, len, &end))
		return false;
	return end <= hi;
}

uint64_t wf_shm_checksum(const void *p, size_t n)
{
	return XXH3_64bits(p, n);
}

uint64_t wf_shm_header_checksum(const struct wf_shm_header *h)
{
	struct wf_shm_header c;
	memcpy(&c, h, sizeof(c));
	c.header_checksum = 0;
	c.state = WF_SHM_STATE_READY;
	return XXH3_64bits(&c, sizeof(c));
}

const char *wf_shm_state_name(uint32_t state)
{
	switch (state) {
	case WF_SHM_STATE_EMPTY:
		return "EMPTY";
	case WF_SHM_STATE_MATERIALIZING:
		return "MATERIALIZING";
	case WF_SHM_STATE_READY:
		return "READY";
	case WF_SHM_STATE_FAILED:
		return "FAILED";
	}
	return "?";
}

int wf_shm_layout_window(const struct wf_model_file *file, struct wf_shm_window *ret_window)
{
	struct wf_shm_window w = {0};
	uint64_t end, aend;

	w.offset = file->data_offset & ~(uint64_t)(WF_SHM_PAGE - 1);
	if (file->data_size == 0) {
		*ret_window = w;
		return 0;
	}
	if (__builtin_add_overflow(file->data_offset, file->data_size, &end) ||
	    align_up_ovf(end, WF_SHM_PAGE, &aend))
		return WF_EOVERFLOW;
	w.length = aend - w.offset;
	/* The aligned end may pass EOF: those bytes do not exist and the section keeps zeros. */
	uint64_t cend = aend < file->size ? aend : file->size;
	w.copy_length = cend > w.offset ? cend - w.offset : 0;
	*ret_window = w;
	return 0;
}

int wf_shm_layout_compute(const struct wf_model *m, uint64_t spare_bytes,
                          struct wf_shm_layout *ret_layout, struct wf_diag *diag)
{
	struct wf_shm_layout l = {0};
	uint64_t strings = 0, data = 0, t;
	int rc;

	if (!m || !ret_layout)
		return wf_diag_set(diag, WF_EINVAL, "layout: no model");
	if (m->n_files == 0 || !m->files)
		return wf_diag_set(diag, WF_EINVAL, "layout: the model has no files");
	if (m->n_tensors > 0 && !m->tensors)
		return wf_diag_set(diag, WF_EINVAL, "layout: %" PRIu32 " tensors but no table",
		                   m->n_tensors);
	if (m->n_files > WF_MODEL_MAX_FILES)
		return wf_diag_set(diag, WF_ELIMIT, "layout: %" PRIu32 " files (at most %u)",
		                   m->n_files, WF_MODEL_MAX_FILES);
	if (m->n_tensors > WF_MODEL_MAX_TENSORS)
		return wf_diag_set(diag, WF_ELIMIT, "layout: %" PRIu32 " tensors (at most %u)",
		                   m->n_tensors, WF_MODEL_MAX_TENSORS);

	l.n_files = m->n_files;
	l.n_tensors = m->n_tensors;
	l.file_table_offset = WF_SHM_HEADER_SIZE;
	l.file_table_size = (uint64_t)m->n_files * FILE_ENTRY_SIZE; /* capped counts: no overflow */
	l.tensor_table_offset = (l.file_table_offset + l.file_table_size + 63) & ~(uint64_t)63;
	l.tensor_table_size = (uint64_t)m->n_tensors * TENSOR_ENTRY_SIZE;
	l.name_index_offset = l.tensor_table_offset + l.tensor_table_size;
	l.name_index_size = (uint64_t)m->n_tensors * NAME_INDEX_ENTRY_SIZE;
	l.strings_offset = l.name_index_offset + l.name_index_size;

	for (uint32_t i = 0; i < m->n_files; i++) {
		const struct wf_model_file *f = &m->files[i];
		struct wf_shm_window w;
		if (!f->path)
			return wf_diag_set(diag, WF_EINVAL, "layout: file %" PRIu32 " has no path",
			                   i);
		size_t n = strnlen(f->path, WF_SHM_MAX_PATH + 1);
		if (n > WF_SHM_MAX_PATH)
			return wf_diag_set(diag, WF_ELIMIT,
			                   "layout: path of file %" PRIu32 " is over %u bytes", i,
			                   WF_SHM_MAX_PATH);
		strings += n + 1;
		rc = wf_shm_layout_window(f, &w);
		if (rc < 0)
			return wf_diag_set(diag, rc,
			                   "layout: file '%s': data section at %" PRIu64
			                   " + %" PRIu64 " overflows",
			                   f->path, f->data_offset, f->data_size);
		if (f->data_offset + f->data_size > f->size)
			return wf_diag_set(diag, WF_ETRUNCATED,
			                   "layout: file '%s': data section ends at %" PRIu64
			                   ", past its size %" PRIu64,
			                   f->path, f->data_offset + f->data_size, f->size);
		if (__builtin_add_overflow(data, w.length, &data))
			return wf_diag_set(diag, WF_EOVERFLOW,
			                   "layout: data sections overflow at file '%s'", f->path);
	}
	for (uint32_t i = 0; i < m->n_tensors; i++) {
		const struct wf_tensor *ts = &m->tensors[i];
		if (!ts->name)
			return wf_diag_set(diag, WF_EINVAL,
			                   "layout: tensor %" PRIu32 " has no name", i);
		size_t n = strnlen(ts->name, WF_MODEL_MAX_NAME + 1);
		if (n == 0 || n > WF_MODEL_MAX_NAME)
			return wf_diag_set(diag, n ? WF_ELIMIT : WF_EFORMAT,
			                   "layout: tensor %" PRIu32
			                   ": name length %zu not in 1..%u",
			                   i, n, WF_MODEL_MAX_NAME);
		strings += n + 1;
		if (ts->file >= m->n_files)
			return wf_diag_set(diag, WF_EFORMAT,
			                   "layout: tensor '%s': file %" PRIu32 " of %" PRIu32,
			                   ts->name, ts->file, m->n_files);
		if (ts->n_dims > WF_MODEL_MAX_DIMS)
			return wf_diag_set(diag, WF_EFORMAT,
			                   "layout: tensor '%s': %" PRIu32 " dimensions", ts->name,
			                   ts->n_dims);
		const struct wf_model_file *f = &m->files[ts->file];
		if (!range_in(ts->offset, ts->nbytes, f->data_offset,
		              f->data_offset + f->data_size)) {
			uint64_t end;
			rc = __builtin_add_overflow(ts->offset, ts->nbytes, &end) ? WF_EOVERFLOW
			                                                          : WF_EFORMAT;
			return wf_diag_set(diag, rc,
			                   "layout: tensor '%s': bytes %" PRIu64 " + %" PRIu64
			                   " outside the data section [%" PRIu64 ", +%" PRIu64
			                   ") of '%s'",
			                   ts->name, ts->offset, ts->nbytes, f->data_offset,
			                   f->data_size, f->path);
		}
	}
	if (strings > WF_SHM_MAX_STRINGS)
		return wf_diag_set(diag, WF_ELIMIT, "layout: %" PRIu64 " bytes of names and paths",
		                   strings);
	l.strings_size = strings;
	size_t meta = 0;
	rc = wf_model_meta_encode(m, NULL, 0, &meta, diag);
	if (rc < 0)
		return rc;
	if (meta > WF_SHM_MAX_META)
		return wf_diag_set(diag, WF_ELIMIT, "layout: %zu bytes of model metadata", meta);
	l.meta_offset = (l.strings_offset + l.strings_size + WF_SHM_META_ALIGN - 1) &
	                ~(uint64_t)(WF_SHM_META_ALIGN - 1);
	l.meta_size = meta;
	if (align_up_ovf(l.meta_offset + l.meta_size, WF_SHM_PAGE, &l.data_offset))
		return wf_diag_set(diag, WF_EOVERFLOW, "layout: tables overflow");
	l.data_size = data;
	if (__builtin_add_overflow(l.data_offset, l.data_size, &l.spare_offset) ||
	    align_up_ovf(spare_bytes, WF_SHM_PAGE, &l.spare_size) ||
	    __builtin_add_overflow(l.spare_offset, l.spare_size, &t) ||
	    t > (uint64_t)INT64_MAX) /* off_t for fallocate and mmap */
		return wf_diag_set(diag, WF_EOVERFLOW,
		                   "layout: region size overflows (data %" PRIu64 ", spare %" PRIu64
		                   ")",
		                   data, spare_bytes);
	l.total_size = t;
	*ret_layout = l;
	return 0;
}

/* Name order of the index (shm/layout.h): bytes, then length; strcmp order for NUL-free names. */
static int name_order(const char *a, uint32_t alen, const char *b, uint32_t blen)
{
	int c = memcmp(a, b, alen < blen ? alen : blen);
	if (c)
		return c;
	return (alen > blen) - (alen < blen);
}

static int model_name_cmp(const void *a, const void *b, void *arg)
{
	const struct wf_model *m = arg;
	return strcmp(m->tensors[*(const uint32_t *)a].name, m->tensors[*(const uint32_t *)b].name);
}

int wf_shm_layout_write(const struct wf_model *m, const struct wf_shm_layout *l, void *base,
                        uint64_t base_size, struct wf_diag *diag)
{
	if (!m || !l || !base || base_size < l->data_offset || l->n_files != m->n_files ||
	    l->n_tensors != m->n_tensors ||
	    l->name_index_offset < l->tensor_table_offset + l->tensor_table_size ||
	    l->name_index_size != (uint64_t)l->n_tensors * NAME_INDEX_ENTRY_SIZE ||
	    l->name_index_offset + l->name_index_size > l->strings_offset ||
	    l->meta_offset < l->strings_offset + l->strings_size ||
	    l->meta_offset + l->meta_size > l->data_offset)
		return wf_diag_set(diag, WF_EINVAL, "layout: buffer or layout does not fit");
	uint8_t *b = base;
	struct wf_shm_file_entry *fe = (struct wf_shm_file_entry *)(b + l->file_table_offset);
	struct wf_shm_tensor_entry *te = (struct wf_shm_tensor_entry *)(b + l->tensor_table_offset);
	char *pool = (char *)(b + l->strings_offset);
	uint64_t sp = 0, floor = l->data_offset;

	/* Padding is zeroed too: tables_checksum covers it. */
	memset(b + l->file_table_offset, 0, l->data_offset - l->file_table_offset);
	for (uint32_t i = 0; i < m->n_files; i++) {
		const struct wf_model_file *f = &m->files[i];
		struct wf_shm_window w = {0};
		size_t n = strlen(f->path);
		wf_shm_layout_window(f, &w); /* checked by wf_shm_layout_compute() */
		fe[i].size = f->size;
		fe[i].mtime_ns = f->mtime_ns;
		fe[i].data_offset = f->data_offset;
		fe[i].data_size = f->data_size;
		fe[i].window_offset = w.offset;
		fe[i].window_length = w.length;
		fe[i].copy_length = w.copy_length;
		fe[i].floor_offset = floor;
		fe[i].path_offset = sp;
		fe[i].path_len = (uint32_t)n;
		memcpy(pool + sp, f->path, n + 1);
		sp += n + 1;
		floor += w.length;
	}
	for (uint32_t i = 0; i < m->n_tensors; i++) {
		const struct wf_tensor *ts = &m->tensors[i];
		const struct wf_shm_file_entry *f = &fe[ts->file];
		size_t n = strlen(ts->name);
		te[i].name_offset = sp;
		te[i].name_len = (uint32_t)n;
		te[i].dtype = (uint32_t)ts->dtype;
		te[i].n_dims = (uint16_t)ts->n_dims;
		te[i].tclass = (uint8_t)ts->tclass;
		te[i].file = ts->file;
		for (int d = 0; d < WF_MODEL_MAX_DIMS; d++)
			te[i].ne[d] = ts->ne[d];
		te[i].nbytes = ts->nbytes;
		te[i].floor_offset = f->floor_offset + (ts->offset - f->window_offset);
		te[i].source_offset = ts->offset;
		fe[ts->file].n_tensors++;
		memcpy(pool + sp, ts->name, n + 1);
		sp += n + 1;
	}
	size_t meta = 0;
	int rc = wf_model_meta_encode(m, b + l->meta_offset, (size_t)l->meta_size, &meta, diag);
	if (rc < 0)
		return rc;
	if (meta != l->meta_size)
		return wf_diag_set(diag, WF_EINVAL,
		                   "layout: model metadata is %zu bytes, the layout has %" PRIu64,
		                   meta, l->meta_size);
	/* The name index, sorted here once so that no attach has to. */
	uint32_t *idx = (uint32_t *)(b + l->name_index_offset);
	for (uint32_t i = 0; i < m->n_tensors; i++)
		idx[i] = i;
	qsort_r(idx, m->n_tensors, sizeof(*idx), model_name_cmp, (void *)m);
	for (uint32_t i = 1; i < m->n_tensors; i++)
		if (strcmp(m->tensors[idx[i - 1]].name, m->tensors[idx[i]].name) == 0)
			return wf_diag_set(diag, WF_EDUPLICATE, "layout: tensor '%s' appears twice",
			                   m->tensors[idx[i]].name);
	return 0;
}

/* A string of the pool: inside it, NUL-terminated, no NUL inside (names compare by bytes). */
static bool string_ok(const char *pool, uint64_t pool_size, uint64_t off, uint64_t len)
{
	if (!range_in(off, len, 0, pool_size) || off + len >= pool_size)
		return false;
	/* One pass: len exactly when the first NUL is the terminator. */
	return strnlen(pool + off, (size_t)len + 1) == len;
}

/* Walks one section of the header: it must start at or after *cursor, be aligned, and end inside
 * the region; the cursor moves to its end. */
static bool section_ok(uint64_t off, uint64_t size, uint64_t align, uint64_t total,
                       uint64_t *cursor)
{
	if ((off & (align - 1)) != 0 || !range_in(off, size, *cursor, total))
		return false;
	*cursor = off + size;
	return true;
}

/* The header, taken once into *h (later checks use the snapshot, never the live header a rogue
 * writer could change): magic, version, state, checksums, digest, sizes, and the sections in
 * order and in bounds. */
/* The sections in the header's order, aligned and inside the region, and the tables' checksum. */
static int validate_sections(const uint8_t *b, uint64_t size, const struct wf_shm_header *h,
                             struct wf_diag *diag)
{
	uint64_t cursor = WF_SHM_HEADER_SIZE;
	if (h->file_table_size != h->n_files * FILE_ENTRY_SIZE ||
	    h->tensor_table_size != h->n_tensors * TENSOR_ENTRY_SIZE ||
	    h->name_index_size != h->n_tensors * NAME_INDEX_ENTRY_SIZE ||
	    h->strings_size > WF_SHM_MAX_STRINGS ||
	    !section_ok(h->file_table_offset, h->file_table_size, 8, size, &cursor) ||
	    !section_ok(h->tensor_table_offset, h->tensor_table_size, 8, size, &cursor) ||
	    !section_ok(h->name_index_offset, h->name_index_size, 4, size, &cursor) ||
	    !section_ok(h->strings_offset, h->strings_size, 1, size, &cursor) ||
	    h->meta_size > WF_SHM_MAX_META ||
	    !section_ok(h->meta_offset, h->meta_size, WF_SHM_META_ALIGN, size, &cursor) ||
	    !section_ok(h->data_offset, h->data_size, WF_SHM_PAGE, size, &cursor) ||
	    !section_ok(h->spare_offset, h->spare_size, WF_SHM_PAGE, size, &cursor) ||
	    h->spare_used > h->spare_size)
		return wf_diag_set(diag, WF_EFORMAT,
		                   "region sections out of order or bounds: files %" PRIu64
		                   "+%" PRIu64 ", tensors %" PRIu64 "+%" PRIu64
		                   ", name index %" PRIu64 "+%" PRIu64 ", strings %" PRIu64
		                   "+%" PRIu64 ", metadata %" PRIu64 "+%" PRIu64 ", data %" PRIu64
		                   "+%" PRIu64 ", spare %" PRIu64 "+%" PRIu64 " (used %" PRIu64
		                   "), total %" PRIu64,
		                   h->file_table_offset, h->file_table_size, h->tensor_table_offset,
		                   h->tensor_table_size, h->name_index_offset, h->name_index_size,
		                   h->strings_offset, h->strings_size, h->meta_offset, h->meta_size,
		                   h->data_offset, h->data_size, h->spare_offset, h->spare_size,
		                   h->spare_used, size);
	uint64_t sum =
	    wf_shm_checksum(b + h->file_table_offset, h->data_offset - h->file_table_offset);
	if (sum != h->tables_checksum)
		return wf_diag_set(diag, WF_ECHECKSUM,
		                   "region tables checksum 0x%016" PRIx64
		                   ", computed 0x%016" PRIx64,
		                   h->tables_checksum, sum);
	return 0;
}

static int validate_header(const uint8_t *b, uint64_t size, const struct wf_digest *digest,
                           struct wf_shm_header *ret_h, struct wf_diag *diag)
{
	struct wf_shm_header h;
	int rc;

	/* A creator killed between open and fallocate leaves 0 bytes; one killed before its
	 * header was complete leaves a zero magic (the magic is written last). Both are EMPTY:
	 * not ready, rather than damaged. */
	if (size == 0)
		return wf_diag_set(diag, WF_ENOT_READY, "region is EMPTY (0 bytes)");
	if (size < WF_SHM_HEADER_SIZE)
		return wf_diag_set(diag, WF_ETRUNCATED,
		                   "region is %" PRIu64 " bytes, shorter than its header", size);
	memcpy(&h, b, sizeof(h));
	if (h.magic == 0)
		return wf_diag_set(diag, WF_ENOT_READY, "region is EMPTY (no header yet)");
	if (h.magic != WF_SHM_MAGIC)
		return wf_diag_set(diag, WF_EMAGIC, "region magic is 0x%016" PRIx64, h.magic);
	if (h.version != WF_SHM_VERSION)
		return wf_diag_set(diag, WF_EVERSION,
		                   "region format version %" PRIu32 ", expected %u", h.version,
		                   WF_SHM_VERSION);
	if (h.header_size != WF_SHM_HEADER_SIZE)
		return wf_diag_set(diag, WF_EFORMAT, "region header size %" PRIu32, h.header_size);
	if (h.state != WF_SHM_STATE_READY)
		return wf_diag_set(diag, WF_ENOT_READY, "region state is %s",
		                   wf_shm_state_name(h.state));
	/* Before the header checksum: a publisher that died between the two halves of its seqlock
	 * write left the generation odd and the checksum written for the even one to come, so the
	 * checksum would fail too, and "a publish never finished" is the truer answer. */
	if (h.generation & 1)
		return wf_diag_set(diag, WF_ENOT_READY,
		                   "region generation %" PRIu64 " is odd: a publish never finished",
		                   h.generation);
	uint64_t sum = wf_shm_header_checksum(&h);
	if (sum != h.header_checksum)
		return wf_diag_set(diag, WF_ECHECKSUM,
		                   "region header checksum 0x%016" PRIx64
		                   ", computed 0x%016" PRIx64,
		                   h.header_checksum, sum);
	if (digest && (h.digest_hi != digest->hi || h.digest_lo != digest->lo)) {
		char want[WF_SHM_NAME_LEN + 1], got[WF_SHM_NAME_LEN + 1];
		struct wf_digest g = {h.digest_hi, h.digest_lo};
		wf__shm_name(digest, want);
		wf__shm_name(&g, got);
		return wf_diag_set(diag, WF_EFORMAT, "region header names %s, expected %s", got + 3,
		                   want + 3);
	}
	if (h.total_size != size)
		return wf_diag_set(diag, h.total_size > size ? WF_ETRUNCATED : WF_EFORMAT,
		                   "region file is %" PRIu64 " bytes, header says %" PRIu64, size,
		                   h.total_size);
	if (h.page_size < WF_SHM_PAGE || (h.page_size & (h.page_size - 1)) != 0 ||
	    h.total_size % h.page_size != 0)
		return wf_diag_set(diag, WF_EFORMAT,
		                   "region page size %" PRIu64 " (total %" PRIu64 ")", h.page_size,
		                   h.total_size);
	if (h.file_entry_size != FILE_ENTRY_SIZE || h.tensor_entry_size != TENSOR_ENTRY_SIZE)
		return wf_diag_set(diag, WF_EFORMAT, "region entry sizes %" PRIu32 "/%" PRIu32,
		                   h.file_entry_size, h.tensor_entry_size);
	if (h.n_files == 0 || h.n_files > WF_MODEL_MAX_FILES || h.n_tensors > WF_MODEL_MAX_TENSORS)
		return wf_diag_set(diag, WF_ELIMIT,
		                   "region has %" PRIu32 " files, %" PRIu32 " tensors", h.n_files,
		                   h.n_tensors);
	if ((rc = validate_sections(b, size, &h, diag)) < 0)
		return rc;
	*ret_h = h;
	return 0;
}

/* The metadata, walked without allocating: lengths, counts, terminators, types. */
static int validate_meta(const uint8_t *b, const struct wf_shm_header *h, struct wf_diag *diag)
{
	int rc = wf_model_meta_decode(b + h->meta_offset, (size_t)h->meta_size, NULL, diag);
	if (rc < 0)
		return rc; /* diag says "model metadata: ..." */
	uint32_t meta_files;
	memcpy(&meta_files, b + h->meta_offset + 8, sizeof(meta_files));
	if (meta_files != h->n_files)
		return wf_diag_set(diag, WF_EFORMAT,
		                   "region metadata describes %" PRIu32
		                   " files, the header %" PRIu32,
		                   meta_files, h->n_files);
	return 0;
}

/* The file table: path strings, each file's window where the layout puts it, in order inside
 * the data area, and the tensors they hold adding up. */
static int validate_files(const uint8_t *b, const struct wf_shm_header *h, struct wf_diag *diag)
{
	const char *pool = (const char *)b + h->strings_offset;
	uint64_t data_end = h->data_offset + h->data_size, n_in_files = 0;
	uint64_t cursor = h->data_offset;
	for (uint32_t i = 0; i < h->n_files; i++) {
		struct wf_shm_file_entry e;
		struct wf_shm_window w;
		memcpy(&e, b + h->file_table_offset + i * FILE_ENTRY_SIZE, sizeof(e));
		if (!string_ok(pool, h->strings_size, e.path_offset, e.path_len))
			return wf_diag_set(diag, WF_EFORMAT,
			                   "region file %" PRIu32 ": bad path string", i);
		struct wf_model_file mf = {
		    .size = e.size, .data_offset = e.data_offset, .data_size = e.data_size};
		if (wf_shm_layout_window(&mf, &w) < 0 || w.offset != e.window_offset ||
		    w.length != e.window_length || w.copy_length != e.copy_length ||
		    (e.floor_offset & (WF_SHM_PAGE - 1)) != 0 ||
		    !range_in(e.floor_offset, e.window_length, cursor, data_end))
			return wf_diag_set(diag, WF_EFORMAT,
			                   "region file %" PRIu32 " ('%s'): window %" PRIu64
			                   "+%" PRIu64 " (copy %" PRIu64
			                   ") at floor offset %" PRIu64
			                   " is inconsistent or outside the data area",
			                   i, pool + e.path_offset, e.window_offset,
			                   e.window_length, e.copy_length, e.floor_offset);
		cursor = e.floor_offset + e.window_length;
		n_in_files += e.n_tensors;
	}
	if (n_in_files != h->n_tensors)
		return wf_diag_set(diag, WF_EFORMAT,
		                   "region files hold %" PRIu64 " tensors, header says %" PRIu32,
		                   n_in_files, h->n_tensors);
	return 0;
}

/* The tensor table: names, files, dimensions, and each tensor's bytes inside its file's source
 * section and at its place in the floor (the data area, or the spare area once published). */
static int validate_tensors(const uint8_t *b, const struct wf_shm_header *h, struct wf_diag *diag)
{
	const char *pool = (const char *)b + h->strings_offset;
	/* Fields are loaded one by one (each once: the region is shared memory) rather than by
	 * copying whole entries: a 128-byte struct copy compiles to rep movs, whose startup and
	 * store-forwarding stall cost more than the checks themselves at 10k entries. */
	const struct wf_shm_tensor_entry *tt = (const void *)(b + h->tensor_table_offset);
	const struct wf_shm_file_entry *ft = (const void *)(b + h->file_table_offset);
	for (uint32_t i = 0; i < h->n_tensors; i++) {
		const struct wf_shm_tensor_entry *e = &tt[i];
		uint64_t name_offset = LOAD(e->name_offset);
		uint32_t name_len = LOAD(e->name_len);
		uint32_t file = LOAD(e->file);
		uint16_t n_dims = LOAD(e->n_dims);
		if (name_len == 0 || name_len > WF_MODEL_MAX_NAME ||
		    !string_ok(pool, h->strings_size, name_offset, name_len))
			return wf_diag_set(diag, WF_EFORMAT,
			                   "region tensor %" PRIu32 ": bad name string", i);
		const char *name = pool + name_offset;
		if (file >= h->n_files || n_dims > WF_MODEL_MAX_DIMS)
			return wf_diag_set(diag, WF_EFORMAT,
			                   "region tensor '%.*s': file %" PRIu32 ", %u dimensions",
			                   (int)name_len, name, file, n_dims);
		const struct wf_shm_file_entry *f = &ft[file];
		uint64_t nbytes = LOAD(e->nbytes), floor_offset = LOAD(e->floor_offset);
		uint64_t source_offset = LOAD(e->source_offset), generation = LOAD(e->generation);
		uint64_t f_data_offset = LOAD(f->data_offset);
		bool in_source = range_in(source_offset, nbytes, f_data_offset,
		                          f_data_offset + LOAD(f->data_size));
		/* at its file's bytes (never published, or published back to them), or a
		 * published version in the used spare area */
		const bool at_file =
		    in_source && floor_offset == LOAD(f->floor_offset) +
		                                     (source_offset - LOAD(f->window_offset));
		const bool placed =
		    generation <= h->generation &&
		    (at_file || (generation && range_in(floor_offset, nbytes, h->spare_offset,
		                                        h->spare_offset + h->spare_used)));
		if (!in_source || !placed)
			return wf_diag_set(
			    diag, WF_EFORMAT,
			    "region tensor '%.*s': %" PRIu64 " bytes at floor offset %" PRIu64
			    " (source offset %" PRIu64 ", generation %" PRIu64
			    ") outside its section",
			    (int)name_len, name, nbytes, floor_offset, source_offset, generation);
	}
	return 0;
}

/* The name index: in range and strictly increasing names, which makes it a permutation and the
 * names unique without sorting anything (shm/layout.h). Entries are re-read from shared memory,
 * so their bounds are checked again before a name is compared. */
static int validate_name_index(const uint8_t *b, const struct wf_shm_header *h,
                               struct wf_diag *diag)
{
	const char *pool = (const char *)b + h->strings_offset;
	const struct wf_shm_tensor_entry *tt = (const void *)(b + h->tensor_table_offset);
	const uint32_t *idx = (const uint32_t *)(b + h->name_index_offset);
	const char *prev = NULL;
	uint32_t prev_len = 0;
	for (uint32_t k = 0; k < h->n_tensors; k++) {
		uint32_t t = LOAD(idx[k]);
		if (t >= h->n_tensors)
			return wf_diag_set(diag, WF_EFORMAT,
			                   "region name index entry %" PRIu32 ": tensor %" PRIu32
			                   " of %" PRIu32,
			                   k, t, h->n_tensors);
		uint64_t off = LOAD(tt[t].name_offset);
		uint32_t len = LOAD(tt[t].name_len);
		if (len == 0 || len > WF_MODEL_MAX_NAME || !range_in(off, len, 0, h->strings_size))
			return wf_diag_set(diag, WF_EFORMAT,
			                   "region tensor %" PRIu32 ": bad name string", t);
		const char *name = pool + off;
		if (prev) {
			int c = name_order(prev, prev_len, name, len);
			if (c == 0)
				return wf_diag_set(diag, WF_EDUPLICATE,
				                   "region tensor '%.*s' appears twice", (int)len,
				                   name);
			if (c > 0)
				return wf_diag_set(diag, WF_EFORMAT,
				                   "region name index is out of name order at "
				                   "entry %" PRIu32 " ('%.*s' after '%.*s')",
				                   k, (int)len, name, (int)prev_len, prev);
		}
		prev = name;
		prev_len = len;
	}
	return 0;
}

int wf__shm_validate(const void *base, uint64_t size, const struct wf_digest *digest,
                     struct wf_shm_header *ret_header, struct wf_diag *diag)
{
	const uint8_t *b = base;
	struct wf_shm_header h;
	int rc = validate_header(b, size, digest, &h, diag);
	if (rc == 0)
		rc = validate_meta(b, &h, diag);
	if (rc == 0)
		rc = validate_files(b, &h, diag);
	if (rc == 0)
		rc = validate_tensors(b, &h, diag);
	if (rc == 0)
		rc = validate_name_index(b, &h, diag);
	if (rc == 0)
		*ret_header = h;
	return rc;
}

int wf__shm_match_model(const void *base, const struct wf_shm_header *h, const struct wf_model *m,
                        const struct wf_shm_layout *l, struct wf_diag *diag)
{
	const uint8_t *b = base;
	const char *pool = (const char *)b + h->strings_offset;
	uint64_t floor = l->data_offset;

	if (h->n_files != m->n_files || h->n_tensors != m->n_tensors ||
	    h->data_offset != l->data_offset || h->data_size != l->data_size)
		return wf_diag_set(
		    diag, WF_EFORMAT,
		    "region holds %" PRIu32 " files, %" PRIu32 " tensors, %" PRIu64
		    " data bytes; the model needs %" PRIu32 ", %" PRIu32 ", %" PRIu64,
		    h->n_files, h->n_tensors, h->data_size, m->n_files, m->n_tensors, l->data_size);
	for (uint32_t i = 0; i < m->n_files; i++) {
		const struct wf_model_file *mf = &m->files[i];
		struct wf_shm_file_entry e;
		struct wf_shm_window w;
		memcpy(&e, b + h->file_table_offset + i * FILE_ENTRY_SIZE, sizeof(e));
		if (wf_shm_layout_window(mf, &w) < 0 || e.size != mf->size ||
		    e.mtime_ns != mf->mtime_ns || e.data_offset != mf->data_offset ||
		    e.data_size != mf->data_size || e.floor_offset != floor)
			return wf_diag_set(diag, WF_EFORMAT,
			                   "region file %" PRIu32 " does not match '%s'", i,
			                   mf->path);
		floor += w.length;
	}
	for (uint32_t i = 0; i < m->n_tensors; i++) {
		const struct wf_tensor *ts = &m->tensors[i];
		struct wf_shm_tensor_entry e;
		memcpy(&e, b + h->tensor_table_offset + i * TENSOR_ENTRY_SIZE, sizeof(e));
		bool same = e.name_len == strlen(ts->name) &&
		            memcmp(pool + e.name_offset, ts->name, e.name_len) == 0 &&
		            e.dtype == (uint32_t)ts->dtype && e.n_dims == ts->n_dims &&
		            e.file == ts->file && e.nbytes == ts->nbytes &&
		            e.source_offset == ts->offset;
		for (int d = 0; same && d < WF_MODEL_MAX_DIMS; d++)
			same = e.ne[d] == ts->ne[d];
		if (!same)
			return wf_diag_set(diag, WF_EFORMAT,
			                   "region tensor %" PRIu32
			                   " does not match model tensor '%s'",
			                   i, ts->name);
	}
	/* The same digest with other key/values means the files were rewritten in place with
	 * the same sizes and mtimes; rare, but then the floor must not answer with stale ones. */
	if (h->meta_size != l->meta_size)
		return wf_diag_set(diag, WF_EFORMAT,
		                   "region metadata is %" PRIu64 " bytes; the model's is %" PRIu64,
		                   h->meta_size, l->meta_size);
	size_t n = 0;
	uint8_t *want = malloc(l->meta_size ? (size_t)l->meta_size : 1);
	if (!want)
		return -ENOMEM;
	int rc = wf_model_meta_encode(m, want, (size_t)l->meta_size, &n, diag);
	if (rc == 0 && memcmp(want, b + h->meta_offset, n) != 0)
		rc = wf_diag_set(diag, WF_EFORMAT, "region metadata does not match the model's");
	free(want);
	return rc;
}

int wf__shm_tensor_bounds(const struct wf_shm_header *h, uint64_t floor_offset, uint64_t nbytes)
{
	return range_in(floor_offset, nbytes, h->data_offset, h->spare_offset + h->spare_size)
	           ? 0
	           : WF_EFORMAT;
}
