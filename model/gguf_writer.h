/* Streaming GGUF v3 writer, single file or llama.cpp-style shards.
 *
 * File layout written (all integers little-endian; GGUF v3 as read by ggml's gguf.cpp):
 *
 *   u32 magic "GGUF" | u32 version = 3 | u64 n_tensors | u64 n_kv
 *   n_kv x { string key | u32 type | value }
 *            string = u64 length + bytes (no NUL)
 *            array  = u32 elem_type + u64 n + n elements (nested arrays recurse)
 *   n_tensors x { string name | u32 n_dims | u64 ne[n_dims] | u32 ggml type | u64 offset }
 *            offset is relative to the data section and a multiple of the alignment
 *   zero padding up to the alignment
 *   data section: each tensor's bytes followed by zero padding up to the alignment
 *
 * Use, in this order (one thread; the writer is not thread-safe):
 *   wf_gguf_writer_create()            opens nothing yet, only remembers where to write
 *   wf_gguf_writer_set_*()             metadata, kept in insertion order (setting a key again
 *                                      replaces its value in place)
 *   wf_gguf_writer_add_tensor()        the tensor table, in file order
 *   wf_gguf_writer_write_header()      plans shards, opens the first file, writes its header
 *   wf_gguf_writer_write()             the tensors' bytes, concatenated in table order and without
 *                                      padding, in chunks of any size; the writer inserts padding
 *                                      and moves to the next shard between tensors
 *   wf_gguf_writer_finish()            pads, optionally fsyncs, renames every file into place
 *   wf_gguf_writer_destroy()           always; before finish it removes every partial file
 *
 * Output goes through four buffers of opts.buffer_size used in turn: the caller fills one while
 * three private I/O threads (started by write_header, joined by finish or destroy) pwrite() the
 * others, optionally with O_DIRECT, so that producing the bytes and several writes overlap.
 *
 * No output path ever holds a half-written file: each file is written under a temporary name in
 * the target directory and all of them are renamed only once the last byte is written. If a
 * rename fails half-way, the files already renamed are removed again.
 *
 * Sharding (opts.split_max_bytes or opts.split_max_tensors) follows llama-gguf-split: files are
 * named "<prefix>-00001-of-0000N.gguf" where <prefix> is the path without its ".gguf" suffix; the
 * first shard carries all metadata, every shard carries split.no (u16, 0-based), split.count
 * (u16) and split.tensors.count (i32, the model's total), appended after the other keys. A new
 * shard starts before a tensor when the shard's padded tensor data would otherwise exceed
 * split_max_bytes (header bytes do not count, as in gguf-split), so a tensor never straddles two
 * shards, and a tensor larger than the limit gets a shard of its own. Non-first shards also carry
 * general.alignment when it is not the default, since readers assume 32 otherwise.
 *
 * Errors: 0 on success, -errno from the system, or WF_E* (WF_EINVAL for misuse and bad
 * arguments, WF_ESTATE for calls out of order, WF_EDUPLICATE, WF_ELIMIT, WF_EALIGN, ...). On
 * failure the diag (optional) says what and where. After a failed write_header, write or finish
 * the writer is poisoned: every later call returns WF_ESTATE and destroy cleans up. */
#ifndef WF_MODEL_GGUF_WRITER_H
#define WF_MODEL_GGUF_WRITER_H

#include "base/diag.h"
#include "model/dtype.h"
#include "model/kv.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define WF_GGUF_DEFAULT_ALIGNMENT 32
#define WF_GGUF_WRITER_MAX_NAME   63 /* GGML_MAX_NAME is 64 with the NUL: llama.cpp rejects more */
#define WF_GGUF_WRITER_MAX_SHARDS 65535 /* split.count is a u16 */

struct wf_gguf_writer;

struct wf_gguf_writer_opts {
	uint32_t alignment;       /* power of two, 0 = 32; written as general.alignment if not 32 */
	uint64_t split_max_bytes; /* 0 = no limit; max padded tensor bytes per shard */
	uint32_t split_max_tensors; /* 0 = no limit; max tensors per shard */
	bool split;         /* shard names even if one file results (implied by the limits) */
	bool fsync;         /* fsync files and directory before finish returns */
	bool direct;        /* O_DIRECT where the filesystem allows it (not tmpfs): skips
	                       the page cache, which is much faster on some disks and
	                       does not evict the rest of the cache; silently buffered
	                       where refused */
	size_t buffer_size; /* each of the four write buffers, 0 = 8 MiB (rounded up to
	                       4 KiB) */
};

/* Prepares a writer for `path` (a file name ending in .gguf when splitting). opts may be NULL for
 * the defaults. Creates no file yet. Returns 0 and *ret_writer, or WF_EINVAL for a bad option. */
int wf_gguf_writer_create(const char *path, const struct wf_gguf_writer_opts *opts,
                          struct wf_gguf_writer **ret_writer, struct wf_diag *diag);

/* Removes every file not yet renamed into place, frees everything. Accepts NULL. */
void wf_gguf_writer_destroy(struct wf_gguf_writer *w);

/* Metadata, before write_header. The value is deep-copied (strings, arrays, nested arrays).
 * "general.alignment" and "split.*" belong to the writer and are refused (WF_EINVAL). */
int wf_gguf_writer_set_kv(struct wf_gguf_writer *w, const char *key, const struct wf_kv_value *v,
                          struct wf_diag *diag);
int wf_gguf_writer_set_u32(struct wf_gguf_writer *w, const char *key, uint32_t v);
int wf_gguf_writer_set_i32(struct wf_gguf_writer *w, const char *key, int32_t v);
int wf_gguf_writer_set_u64(struct wf_gguf_writer *w, const char *key, uint64_t v);
int wf_gguf_writer_set_f32(struct wf_gguf_writer *w, const char *key, float v);
int wf_gguf_writer_set_bool(struct wf_gguf_writer *w, const char *key, bool v);
int wf_gguf_writer_set_str(struct wf_gguf_writer *w, const char *key, const char *s);
/* Array of scalars: n elements of type elem (not STRING or ARRAY), packed, host order. */
int wf_gguf_writer_set_array(struct wf_gguf_writer *w, const char *key, enum wf_kv_type elem,
                             const void *data, uint64_t n);
/* Array of NUL-terminated strings. */
int wf_gguf_writer_set_str_array(struct wf_gguf_writer *w, const char *key, const char *const *strs,
                                 uint64_t n);

/* Appends a tensor to the table (before write_header). ne is in ggml order (ne[0] contiguous),
 * 1 <= n_dims <= 4, every ne > 0, ne[0] a multiple of the type's block size. Returns 0 and the
 * index in *ret_index (optional), or WF_EINVAL / WF_EUNKNOWN_TYPE / WF_EALIGN / WF_EOVERFLOW /
 * WF_EDUPLICATE / WF_ELIMIT (name longer than WF_GGUF_WRITER_MAX_NAME bytes). */
int wf_gguf_writer_add_tensor(struct wf_gguf_writer *w, const char *name, enum wf_dtype dtype,
                              uint32_t n_dims, const int64_t *ne, uint32_t *ret_index,
                              struct wf_diag *diag);

/* Freezes metadata and table, assigns tensors to shards, creates the first file and writes its
 * header. A model with no tensors is valid (one file). */
int wf_gguf_writer_write_header(struct wf_gguf_writer *w, struct wf_diag *diag);

/* Streams tensor bytes: the concatenation of every tensor's data in table order, without the
 * padding. Chunks may be of any size and may span tensors; the data is copied before this
 * returns. Writing past the last tensor is WF_EOVERFLOW. An I/O error may surface one call
 * later than the write that caused it (the writes are asynchronous), and at the latest from
 * finish. */
int wf_gguf_writer_write(struct wf_gguf_writer *w, const void *data, size_t n,
                         struct wf_diag *diag);

/* Checks that every tensor got all its bytes (WF_ETRUNCATED otherwise), writes the final padding,
 * fsyncs if asked, and renames every file into place. */
int wf_gguf_writer_finish(struct wf_gguf_writer *w, struct wf_diag *diag);

/* Inspection. n_files and file_path are valid after write_header (file_path is the final name);
 * the tensor getters after add_tensor. bytes_written counts every byte put in any file. */
uint32_t wf_gguf_writer_n_tensors(const struct wf_gguf_writer *w);
uint64_t wf_gguf_writer_tensor_nbytes(const struct wf_gguf_writer *w, uint32_t index);
uint32_t wf_gguf_writer_n_files(const struct wf_gguf_writer *w);
const char *wf_gguf_writer_file_path(const struct wf_gguf_writer *w, uint32_t file);
uint64_t wf_gguf_writer_bytes_written(const struct wf_gguf_writer *w);

#ifdef __cplusplus
}
#endif
#endif
