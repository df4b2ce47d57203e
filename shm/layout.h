/* The byte layout of a floor region: one model's weights in one shared-memory file.
 *
 * A region is a file in the floor directory (tmpfs or hugetlbfs), named "wf-<digest hex>", that
 * the agent fills once and every worker maps read-only. It holds no pointers: every reference is
 * an offset from the start of the region. Integers are in the host's byte order (little-endian on
 * every supported platform); a floor never leaves its node, and a foreign reader sees a wrong
 * magic. The lock protocol that guards it is written at the top of shm/region.h.
 *
 *   offset              size                 what
 *   0                   4096                 header (struct wf_shm_header)
 *   file_table_offset   n_files * 80         file table (struct wf_shm_file_entry), = 4096
 *   tensor_table_offset n_tensors * 128      tensor table (struct wf_shm_tensor_entry), 64-aligned
 *   name_index_offset   n_tensors * 4        name index: u32 tensor indices by name, 64-aligned
 *                                            (= tensor_table_offset + tensor_table_size)
 *   strings_offset      strings_size         string pool: tensor names and file paths, each
 *                                            followed by a NUL that its length does not count
 *   meta_offset         meta_size            model metadata (since version 3), 8-aligned
 *                                            (= align8(strings_offset + strings_size)): format,
 *                                            hyperparameters, every key/value (model/meta.h)
 *   data_offset         data_size            data area, 4096-aligned: one section per file
 *   spare_offset        spare_size           spare area for published tensor versions, 4096-aligned
 *   total_size                               end; a multiple of page_size (4096, or the huge page
 *                                            size on hugetlbfs, which can only map whole pages)
 *
 * Header (4096 bytes; every field is checked before use):
 *     0  u64 magic               WF_SHM_MAGIC, the bytes "WFFLOOR\x1a"; stored last (release)
 *                                when the header is first written, so 0 means EMPTY
 *     8  u32 version             WF_SHM_VERSION
 *    12  u32 header_size         4096
 *    16  u64 digest_hi           the model digest (xxh3-128) that names the region
 *    24  u64 digest_lo
 *    32  u32 state               enum wf_shm_state; written last, with a release store
 *    36  u32 flags               WF_SHM_HDR_*
 *    40  u64 generation          seqlock for published tensor versions (below); even when stable
 *    48  u32 n_files
 *    52  u32 n_tensors
 *    56  u32 file_entry_size     80
 *    60  u32 tensor_entry_size   128
 *    64  u64 file_table_offset   and _size, then the same pair for the tensor table, the string
 *    ...                         pool, the data area and the spare area (offsets 64..143)
 *   144  u64 spare_used          bytes of the spare area handed out so far
 *   152  u64 total_size          the file's size
 *   160  u64 page_size           the size total_size is a multiple of
 *   168  i64 created_ns          CLOCK_REALTIME when materialization began
 *   176  i64 ready_ns            CLOCK_REALTIME when the region became READY
 *   184  i32 materializer_pid    the process that filled it (diagnostics only)
 *   188  u32 reserved0           zero
 *   192  u64 tables_checksum     xxh3-64 of the bytes [file_table_offset, data_offset): the file
 *                                table, the tensor table, the name index, the string pool, the
 *                                metadata section and the padding between them
 *   200  u64 header_checksum     xxh3-64 of the 4096 header bytes with this field zeroed and
 *                                state READY; so only a READY header can carry a valid one
 *   208  u64 name_index_offset   the name index (since version 2) ...
 *   216  u64 name_index_size     ... and its length, n_tensors * 4
 *   224  u64 meta_offset         the metadata section (since version 3) ...
 *   232  u64 meta_size           ... and its length (at most WF_SHM_MAX_META)
 *   240  u8  reserved[3856]      zero
 *
 * File entry (80 bytes), one per model file, in model order:
 *     0  u64 size                st_size the digest was computed from
 *     8  i64 mtime_ns            st_mtim the digest was computed from
 *    16  u64 data_offset         the file's tensor-data section ...
 *    24  u64 data_size           ... and its length
 *    32  u64 window_offset       align_down(data_offset, 4096): where the copy starts in the file
 *    40  u64 window_length       align_up(data_offset + data_size, 4096) - window_offset: the
 *                                section's length in the floor (0 when data_size is 0)
 *    48  u64 copy_length         min(window end, size) - window_offset: bytes that exist in the
 *                                file; the rest of the section stays zero
 *    56  u64 floor_offset        where the section starts in the region, 4096-aligned
 *    64  u64 path_offset         the path as opened, in the string pool (diagnostics only)
 *    72  u32 path_len
 *    76  u32 n_tensors           tensors stored in this file
 *
 * Tensor entry (128 bytes), one per tensor, in model order (file 0 by offset, then file 1, ...):
 *     0  u64 name_offset         in the string pool
 *     8  u32 name_len            1..WF_MODEL_MAX_NAME
 *    12  u32 dtype               enum wf_dtype
 *    16  u16 n_dims              0..WF_MODEL_MAX_DIMS
 *    18  u8  tclass              enum wf_tensor_class
 *    19  u8  reserved            zero
 *    20  u32 file                index into the file table
 *    24  i64 ne[8]               ggml order; unused dimensions are 1
 *    88  u64 nbytes
 *    96  u64 floor_offset        where the bytes are now: inside the file's section
 *                                (= section floor_offset + source_offset - window_offset) or, once
 *                                a new version is published, inside the spare area; a published
 *                                version equal to the file's bytes points back into the section
 *                                (since version 4)
 *   104  u64 source_offset       absolute offset of the tensor in its file
 *   112  u64 checksum            xxh3-64 of the nbytes at floor_offset
 *   120  u64 generation          header generation at which these bytes were published; 0 for the
 *                                bytes copied from the file
 *
 * Name index (n_tensors u32, since version 2): the tensor indices ordered by name, comparing
 * names as byte strings (memcmp over the shorter length, then the shorter name first; names hold
 * no NUL, so this is strcmp order). Written once at materialization, so that an attach does not
 * sort: wf_shm_region_find() binary-searches it in place. Validation checks every index is below
 * n_tensors and every name is strictly greater than the one before it; together that makes it a
 * permutation (equal indices would give equal names) and proves the names unique, in O(n).
 *
 * The floor keeps each file's bytes verbatim: section i holds the file bytes
 * [window_offset, window_offset + copy_length) at floor_offset, so materialization is a
 * sequential, page-aligned copy (O_DIRECT-able) and a tensor's bytes in the floor equal its bytes
 * in the file. GGUF headers and padding between tensors ride along; that is at most 4 KiB a file.
 *
 * Metadata section (since version 3): the bytes of wf_model_meta_encode() (model/meta.h, which
 * pins their layout): the model's format, struct wf_hparams, each file's GGUF version and
 * alignment, and every metadata key with its type and value, arrays included (tokenizer vocab,
 * merges, scores, token types). With the file and tensor tables it is everything
 * wf_shm_region_model() needs to rebuild the struct wf_model that wf_model_open() gives for the
 * files, so a worker that cannot see the files runs the model from the floor. safetensors
 * models store their __metadata__ as string keys and config.json's hyperparameters in hp. The
 * section is written once at materialization, never changed by a publish, and covered by
 * tables_checksum; every attach walks it (wf_model_meta_decode() without allocating: lengths and
 * counts against the bytes left and the WF_MODEL_MAX_* caps, NUL terminators, types, trailing
 * bytes), so a corrupt section is an error, never a fault.
 *
 * Generations (publishing changed tensors; the writer is shm/publish.c):
 *  1. The publisher holds the guard lock EX (shm/region.h), so attachers, which validate the
 *     header under the same lock, never see a publish half done.
 *  2. It appends the new bytes to the spare area at spare_offset + spare_used (64-aligned), which
 *     no reader looks at yet, and computes their xxh3-64. Not a version equal to the bytes the
 *     entry has now (it stays where they are) or to its bytes from the file (the entry points
 *     back into the file's section, which holds them for the region's life; since version 4):
 *     those take no spare room, so a tensor that oscillates between its file's bytes and others
 *     costs the others' room only.
 *  3. Seqlock write: generation += 1 (now odd), release fence; store the entry's floor_offset,
 *     checksum and generation (= the final even header generation), and spare_used; recompute
 *     tables_checksum and header_checksum (the latter for the final generation); then
 *     generation += 1 (even again) with a release store. So every even generation belongs to a
 *     whole region whose checksums hold. One publish of several tensors is one generation.
 *  4. Readers (wf_shm_region_tensor) load generation with acquire, retry while it is odd, copy the
 *     entry, fence, and retry if generation moved. The old bytes are never overwritten: the spare
 *     area only grows, so an upload that started from generation g keeps reading intact bytes
 *     after g+1 is published. Space comes back when the region is rebuilt.
 * A publisher that dies mid-publish leaves an odd generation; the next attacher treats the region
 * as broken (WF_ENOT_READY, checked before the header checksum, which the dead publisher may
 * already have rewritten for the generation it never reached) and rebuilds it. Bytes appended
 * past spare_used by a publish that failed are referenced by no entry and overwritten by the
 * next. The writer is shm/publish.c (wf_shm_region_publish()).
 * Why generations, and not a new region under a new digest ("a model name now points at other
 * weights", a design the protocol once carried as the HOTSWAP event): hot-swapping one tensor and
 * trainers' live updates both change a few tensors of a large model. A new region would copy the
 * whole model and hold it twice in RAM, and make every worker attach it and reload everything;
 * a generation copies the changed bytes once, and a worker re-uploads only the entries whose
 * generation moved. The region keeps the digest it was materialized under (its name); the
 * per-tensor checksum and generation describe the bytes it serves now. The cost: the spare area
 * is sized at materialization and comes back only when the region is rebuilt.
 *
 * Validation (shm/layout.c, on every attach): the header, then every section bound with overflow
 * checks (sections in order, inside total_size, 4096-aligned where stated), both checksums, every
 * string (inside the pool and NUL-terminated), every file section (aligned, inside the data area,
 * in order), every tensor (file index, n_dims, bytes inside its file's section and consistent with
 * source_offset, always for generation 0 and for a published version back at its file's
 * bytes, or inside the used spare area), the name index (in range, strictly increasing
 * names), the metadata section (walked as described above). A corrupt region yields an error code,
 * never a fault. Tensor bytes are checked against their checksums only by wf_shm_region_verify().
 *
 * Versions: 1 had no name index (readers sorted the names at every attach) and 3888 reserved
 * header bytes at 208; 2 had no metadata section (data_offset followed the string pool) and 3872
 * reserved bytes at 224, so a worker had to re-open the model's files for its key/values; 3 placed
 * every published version (generation > 0) in the spare area, and its readers refuse one back in
 * a file's section. A region of another version is refused with WF_EVERSION ("region format
 * version 2, expected 4"), and an agent rebuilds it (its attach uses WF_SHM_ATTACH_REBUILD). */
#ifndef WF_SHM_LAYOUT_H
#define WF_SHM_LAYOUT_H

#include "base/diag.h"
#include "model/model.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define WF_SHM_MAGIC       0x1a524f4f4c464657ull /* "WFFLOOR\x1a" read as a little-endian u64 */
#define WF_SHM_VERSION     4u
#define WF_SHM_HEADER_SIZE 4096u
#define WF_SHM_PAGE        4096u /* alignment of windows, sections and the data area */
#define WF_SHM_SPARE_ALIGN 64u   /* alignment of published tensor versions in the spare area */
#define WF_SHM_MAX_PATH    4096u /* bytes of a file path kept for diagnostics */
#define WF_SHM_MAX_STRINGS (1ull << 32) /* bytes of string pool */
#define WF_SHM_MAX_META    (1ull << 31) /* bytes of metadata section (> WF_MODEL_MAX_HEADER) */
#define WF_SHM_META_ALIGN  8u

enum wf_shm_state {
	WF_SHM_STATE_EMPTY = 0, /* a zero-filled (or 0-byte) file: nothing written yet */
	WF_SHM_STATE_MATERIALIZING = 1,
	WF_SHM_STATE_READY = 2,
	WF_SHM_STATE_FAILED = 3,
	WF_SHM_STATE_MAX_
};

#define WF_SHM_HDR_HUGETLB 0x1u /* created on hugetlbfs; page_size is the huge page size */

struct wf_shm_header {
	uint64_t magic;
	uint32_t version;
	uint32_t header_size;
	uint64_t digest_hi;
	uint64_t digest_lo;
	uint32_t state;
	uint32_t flags;
	uint64_t generation;
	uint32_t n_files;
	uint32_t n_tensors;
	uint32_t file_entry_size;
	uint32_t tensor_entry_size;
	uint64_t file_table_offset;
	uint64_t file_table_size;
	uint64_t tensor_table_offset;
	uint64_t tensor_table_size;
	uint64_t strings_offset;
	uint64_t strings_size;
	uint64_t data_offset;
	uint64_t data_size;
	uint64_t spare_offset;
	uint64_t spare_size;
	uint64_t spare_used;
	uint64_t total_size;
	uint64_t page_size;
	int64_t created_ns;
	int64_t ready_ns;
	int32_t materializer_pid;
	uint32_t reserved0;
	uint64_t tables_checksum;
	uint64_t header_checksum;
	uint64_t name_index_offset;
	uint64_t name_index_size;
	uint64_t meta_offset;
	uint64_t meta_size;
	uint8_t reserved[3856];
};

struct wf_shm_file_entry {
	uint64_t size;
	int64_t mtime_ns;
	uint64_t data_offset;
	uint64_t data_size;
	uint64_t window_offset;
	uint64_t window_length;
	uint64_t copy_length;
	uint64_t floor_offset;
	uint64_t path_offset;
	uint32_t path_len;
	uint32_t n_tensors;
};

struct wf_shm_tensor_entry {
	uint64_t name_offset;
	uint32_t name_len;
	uint32_t dtype;
	uint16_t n_dims;
	uint8_t tclass;
	uint8_t reserved;
	uint32_t file;
	int64_t ne[8];
	uint64_t nbytes;
	uint64_t floor_offset;
	uint64_t source_offset;
	uint64_t checksum;
	uint64_t generation;
};

/* The layout is the contract between processes built at different times: pin every offset. */
#define WF_SHM_AT_(type, field, off)                                                               \
	_Static_assert(offsetof(struct type, field) == (off), #type "." #field " moved")
WF_SHM_AT_(wf_shm_header, magic, 0);
WF_SHM_AT_(wf_shm_header, version, 8);
WF_SHM_AT_(wf_shm_header, header_size, 12);
WF_SHM_AT_(wf_shm_header, digest_hi, 16);
WF_SHM_AT_(wf_shm_header, digest_lo, 24);
WF_SHM_AT_(wf_shm_header, state, 32);
WF_SHM_AT_(wf_shm_header, flags, 36);
WF_SHM_AT_(wf_shm_header, generation, 40);
WF_SHM_AT_(wf_shm_header, n_files, 48);
WF_SHM_AT_(wf_shm_header, n_tensors, 52);
WF_SHM_AT_(wf_shm_header, file_entry_size, 56);
WF_SHM_AT_(wf_shm_header, tensor_entry_size, 60);
WF_SHM_AT_(wf_shm_header, file_table_offset, 64);
WF_SHM_AT_(wf_shm_header, file_table_size, 72);
WF_SHM_AT_(wf_shm_header, tensor_table_offset, 80);
WF_SHM_AT_(wf_shm_header, tensor_table_size, 88);
WF_SHM_AT_(wf_shm_header, strings_offset, 96);
WF_SHM_AT_(wf_shm_header, strings_size, 104);
WF_SHM_AT_(wf_shm_header, data_offset, 112);
WF_SHM_AT_(wf_shm_header, data_size, 120);
WF_SHM_AT_(wf_shm_header, spare_offset, 128);
WF_SHM_AT_(wf_shm_header, spare_size, 136);
WF_SHM_AT_(wf_shm_header, spare_used, 144);
WF_SHM_AT_(wf_shm_header, total_size, 152);
WF_SHM_AT_(wf_shm_header, page_size, 160);
WF_SHM_AT_(wf_shm_header, created_ns, 168);
WF_SHM_AT_(wf_shm_header, ready_ns, 176);
WF_SHM_AT_(wf_shm_header, materializer_pid, 184);
WF_SHM_AT_(wf_shm_header, reserved0, 188);
WF_SHM_AT_(wf_shm_header, tables_checksum, 192);
WF_SHM_AT_(wf_shm_header, header_checksum, 200);
WF_SHM_AT_(wf_shm_header, name_index_offset, 208);
WF_SHM_AT_(wf_shm_header, name_index_size, 216);
WF_SHM_AT_(wf_shm_header, meta_offset, 224);
WF_SHM_AT_(wf_shm_header, meta_size, 232);
WF_SHM_AT_(wf_shm_header, reserved, 240);
_Static_assert(sizeof(struct wf_shm_header) == WF_SHM_HEADER_SIZE, "header is one page");

WF_SHM_AT_(wf_shm_file_entry, size, 0);
WF_SHM_AT_(wf_shm_file_entry, mtime_ns, 8);
WF_SHM_AT_(wf_shm_file_entry, data_offset, 16);
WF_SHM_AT_(wf_shm_file_entry, data_size, 24);
WF_SHM_AT_(wf_shm_file_entry, window_offset, 32);
WF_SHM_AT_(wf_shm_file_entry, window_length, 40);
WF_SHM_AT_(wf_shm_file_entry, copy_length, 48);
WF_SHM_AT_(wf_shm_file_entry, floor_offset, 56);
WF_SHM_AT_(wf_shm_file_entry, path_offset, 64);
WF_SHM_AT_(wf_shm_file_entry, path_len, 72);
WF_SHM_AT_(wf_shm_file_entry, n_tensors, 76);
_Static_assert(sizeof(struct wf_shm_file_entry) == 80, "file entry is 80 bytes");

WF_SHM_AT_(wf_shm_tensor_entry, name_offset, 0);
WF_SHM_AT_(wf_shm_tensor_entry, name_len, 8);
WF_SHM_AT_(wf_shm_tensor_entry, dtype, 12);
WF_SHM_AT_(wf_shm_tensor_entry, n_dims, 16);
WF_SHM_AT_(wf_shm_tensor_entry, tclass, 18);
WF_SHM_AT_(wf_shm_tensor_entry, reserved, 19);
WF_SHM_AT_(wf_shm_tensor_entry, file, 20);
WF_SHM_AT_(wf_shm_tensor_entry, ne, 24);
WF_SHM_AT_(wf_shm_tensor_entry, nbytes, 88);
WF_SHM_AT_(wf_shm_tensor_entry, floor_offset, 96);
WF_SHM_AT_(wf_shm_tensor_entry, source_offset, 104);
WF_SHM_AT_(wf_shm_tensor_entry, checksum, 112);
WF_SHM_AT_(wf_shm_tensor_entry, generation, 120);
_Static_assert(sizeof(struct wf_shm_tensor_entry) == 128, "tensor entry is 128 bytes");
_Static_assert(WF_MODEL_MAX_DIMS == 8, "tensor entry holds ne[8]");
#undef WF_SHM_AT_

/* Where everything goes for one model; pure arithmetic, no I/O. All offsets are from the start of
 * the region. total_size is a multiple of WF_SHM_PAGE; a hugetlbfs region rounds it further. */
struct wf_shm_layout {
	uint32_t n_files;
	uint32_t n_tensors;
	uint64_t file_table_offset;
	uint64_t file_table_size;
	uint64_t tensor_table_offset;
	uint64_t tensor_table_size;
	uint64_t strings_offset;
	uint64_t strings_size;
	uint64_t data_offset;
	uint64_t data_size;
	uint64_t spare_offset;
	uint64_t spare_size;
	uint64_t total_size;
	/* Added with version 2; last, so that code naming the fields above is unaffected. */
	uint64_t name_index_offset;
	uint64_t name_index_size;
	/* Added with version 3. */
	uint64_t meta_offset;
	uint64_t meta_size;
};

/* The page-aligned window of one file that its floor section holds. */
struct wf_shm_window {
	uint64_t offset;      /* in the file, 4096-aligned */
	uint64_t length;      /* section length in the floor, a multiple of 4096 */
	uint64_t copy_length; /* bytes of the window that exist in the file (<= length) */
};

/* The window of a file: [align_down(data_offset), align_up(data_offset + data_size)), empty when
 * data_size is 0. Returns 0, or WF_EOVERFLOW. Pure. */
int wf_shm_layout_window(const struct wf_model_file *file, struct wf_shm_window *ret_window);

/* Computes the layout of a model's region with spare_bytes (rounded up to 4096) of spare area.
 * Checks what the floor relies on: counts and name/path lengths within the WF_MODEL_MAX_* and
 * WF_SHM_MAX_* caps (WF_ELIMIT), every tensor inside its file's data section and n_dims <= 8
 * (WF_EFORMAT), no arithmetic overflow anywhere (WF_EOVERFLOW), non-NULL arrays and at least one
 * file (WF_EINVAL). Pure and thread-safe; diag names the offending file or tensor. */
int wf_shm_layout_compute(const struct wf_model *model, uint64_t spare_bytes,
                          struct wf_shm_layout *ret_layout, struct wf_diag *diag);

/* Writes the file table, tensor table, name index and string pool of layout (from
 * wf_shm_layout_compute() on the same model) into base, which must hold at least
 * layout->data_offset bytes; per-tensor checksums are left 0 and generations 0. Does not touch the
 * header or the data area. Sorts the names (O(n log n), once per materialization). Returns 0,
 * WF_EINVAL when base is too small, or WF_EDUPLICATE (diag names it) when two tensors share a
 * name. */
int wf_shm_layout_write(const struct wf_model *model, const struct wf_shm_layout *layout,
                        void *base, uint64_t base_size, struct wf_diag *diag);

/* xxh3-64 (seed 0) of n bytes: the checksum of tensors and of the tables. */
uint64_t wf_shm_checksum(const void *p, size_t n);

/* The header checksum of h: xxh3-64 of the header with header_checksum zeroed and state READY. */
uint64_t wf_shm_header_checksum(const struct wf_shm_header *h);

/* "EMPTY", "MATERIALIZING", "READY", "FAILED", or "?". */
const char *wf_shm_state_name(uint32_t state);

#ifdef __cplusplus
}
#endif
#endif
