/* Streaming safetensors writer, and the model.safetensors.index.json of a sharded model.
 *
 * File layout written (what model/safetensors.c reads):
 *
 *   u64 LE   N        header length; N is a multiple of 8, so the data starts 8-aligned
 *   N bytes  header   compact JSON built with json-c, padded at the end with spaces:
 *                     {"__metadata__": {...}, "<name>": {"dtype": "F32", "shape": [...],
 *                      "data_offsets": [begin, end]}, ...} with the tensors in add order
 *   data              every tensor's bytes, back to back, no padding
 *
 * The data section holds the tensors ordered by element size, largest first, and in add order
 * among equal sizes, as the reference writer does: every tensor then starts at a multiple of its
 * element size, so a reader may map the file and use the bytes in place. The header lists them
 * in add order; readers go by data_offsets.
 *
 * Use, in this order (one thread at a time; a writer has no locks):
 *   wf_st_writer_create()         remembers the path; creates nothing yet
 *   wf_st_writer_set_metadata()   optional __metadata__ pairs (string values, as the format says)
 *   wf_st_writer_add_tensor()     / _add_tensor_fill(): the tensor table, with where the bytes
 *                                 come from
 *   wf_st_writer_finish()         writes header and data to a temporary file beside path,
 *                                 optionally fsyncs, and renames it into place
 *   wf_st_writer_destroy()        always
 * Nothing appears at path unless finish succeeds: on failure the temporary file is removed.
 *
 * Errors: 0, -errno from the system, or WF_E*: WF_EINVAL (bad argument), WF_ESTATE (call after
 * finish or after a failed finish), WF_EDUPLICATE (tensor name given twice), WF_EUNKNOWN_TYPE
 * (not a safetensors dtype), WF_ELIMIT (more than WF_MODEL_MAX_DIMS dims, a name longer than
 * WF_MODEL_MAX_NAME, more than WF_MODEL_MAX_TENSORS tensors), WF_EOVERFLOW (shape too large).
 * Functions that take a diag say there what went wrong. */
#ifndef WF_MODEL_SAFETENSORS_WRITER_H
#define WF_MODEL_SAFETENSORS_WRITER_H

#include "base/diag.h"
#include "model/dtype.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct wf_st_writer;

struct wf_st_writer_opts {
	bool fsync;         /* fsync the file and its directory before finish returns */
	size_t buffer_size; /* staging buffer for fill callbacks; 0 = 4 MiB; at least 8 */
};

/* Produces bytes [offset, offset + len) of one tensor into buf. finish calls it with consecutive
 * ranges that cover the tensor exactly once, in order, each at most buffer_size bytes and made of
 * whole elements (offset and len are multiples of the element size). Called from the thread that
 * runs finish. Returns 0, or a negative code that aborts finish (and is returned by it). */
typedef int (*wf_st_fill_fn)(void *arg, uint64_t offset, void *buf, size_t len);

/* Prepares a writer for path. opts may be NULL for the defaults. Returns 0 and *ret_writer
 * (owned by the caller; free with wf_st_writer_destroy), or WF_EINVAL / -ENOMEM. */
int wf_st_writer_create(const char *path, const struct wf_st_writer_opts *opts,
                        struct wf_st_writer **ret_writer, struct wf_diag *diag);

/* Frees the writer; removes the temporary file of an unfinished write. Accepts NULL. */
void wf_st_writer_destroy(struct wf_st_writer *w);

/* Sets an __metadata__ pair (copied). Setting a key again replaces its value; the header lists
 * the keys in first-set order. Both must be valid UTF-8 without NUL (C strings), the key at most
 * WF_MODEL_MAX_NAME bytes; at most WF_MODEL_MAX_KV keys. */
int wf_st_writer_set_metadata(struct wf_st_writer *w, const char *key, const char *value,
                              struct wf_diag *diag);

/* Appends a tensor whose bytes are at data (borrowed: it must stay valid and unchanged until
 * finish returns). shape is in safetensors (row-major) order, shape[0] the slowest dimension;
 * n_dims may be 0 for a scalar; dims may be 0. The name (copied) must be non-empty valid UTF-8,
 * not "__metadata__". data may be NULL only if the tensor has no bytes. */
int wf_st_writer_add_tensor(struct wf_st_writer *w, const char *name, enum wf_dtype dtype,
                            uint32_t n_dims, const int64_t *shape, const void *data,
                            struct wf_diag *diag);

/* The same, with the bytes produced by fill(arg, ...) during finish. */
int wf_st_writer_add_tensor_fill(struct wf_st_writer *w, const char *name, enum wf_dtype dtype,
                                 uint32_t n_dims, const int64_t *shape, wf_st_fill_fn fill,
                                 void *arg, struct wf_diag *diag);

/* Writes the file and renames it into place. Once: later calls (and adds) return WF_ESTATE. */
int wf_st_writer_finish(struct wf_st_writer *w, struct wf_diag *diag);

/* Bytes of tensor data added so far (the data section's size). */
uint64_t wf_st_writer_data_bytes(const struct wf_st_writer *w);

/* Writes a Hugging Face model.safetensors.index.json at path (atomically, like the writer):
 *   {"metadata": {"total_size": <sum of tensor bytes>},
 *    "weight_map": {"<tensor>": "<shard>", ...}}      (weight_map sorted by tensor name)
 * shards are n_shards file names (no '/') of safetensors files in path's directory; each is
 * opened with wf_model_open() to list its tensors. Returns 0, WF_EINVAL for a bad shard name,
 * WF_EDUPLICATE when two shards hold one tensor name, or what opening a shard returned (diag
 * names the shard). */
int wf_st_index_write(const char *path, const char *const *shards, uint32_t n_shards, bool fsync,
                      struct wf_diag *diag);

#ifdef __cplusplus
}
#endif
#endif
