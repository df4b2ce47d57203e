/* A model's metadata as bytes: what struct wf_model holds beyond its tensor and file tables
 * (format, hyperparameters, each file's GGUF version and alignment, and every metadata key/value
 * with its type, arrays included), so that a reader that cannot see the files (a worker in a
 * container) rebuilds the same struct wf_model from a floor (shm/layout.h, metadata section).
 *
 * Encoding (version 1), every integer little-endian (the host order on every supported platform),
 * no alignment anywhere (the decoder reads with memcpy):
 *     0  u32 meta_version        WF_MODEL_META_VERSION
 *     4  u32 format              enum wf_model_format
 *     8  u32 n_files             must equal the floor's file count
 *    12  u32 n_kv                <= WF_MODEL_MAX_KV
 *    16  u8  arch[64]            hp.arch, NUL-terminated, zero-padded
 *    80  u32 n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_ff_exp, n_expert,
 *            n_expert_used, n_ctx_train, n_vocab, rope_dim   (struct wf_hparams order)
 *   128  f32 rope_freq_base
 *   132  f32 rms_eps
 *   136  u8  zero[8]
 *   144  n_files x { u32 gguf_version, u32 alignment }
 *   then n_kv records, in the model's order:
 *        u32 key_len (1..WF_MODEL_MAX_NAME), key bytes (no NUL among them), u8 0
 *        u32 type (enum wf_kv_type), then the value:
 *          U8..U64, I8..I64, BOOL:  u64 (in the type's range; signed types sign-extended;
 *                                   BOOL 0 or 1)
 *          F32, F64:                f64 (an F32 holds a float's exact value, NaN payload too)
 *          STRING:                  u64 len, len bytes (may hold NULs), u8 0
 *          ARRAY:                   u32 elem, u64 n (<= WF_MODEL_MAX_ARRAY), then n elements:
 *                                   scalars packed at their GGUF size (BOOL one byte 0/1),
 *                                   strings as above, arrays recursively (depth <=
 *                                   WF_MODEL_MAX_KV_DEPTH)
 *   the last record ends exactly at the section's end (trailing bytes are an error).
 * One spelling per model (padding zero, scalars in range): what decodes encodes back to the same
 * bytes. Nothing in it is trusted on decode: every length and count is checked against the bytes
 * left and against the WF_MODEL_MAX_* caps before anything is allocated. */
#ifndef WF_MODEL_META_H
#define WF_MODEL_META_H

#include "base/diag.h"
#include "model/model.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define WF_MODEL_META_VERSION 1u
#define WF_MODEL_META_FIXED   144u /* bytes before the per-file entries */

/* Encodes model's metadata into buf (cap bytes). buf may be NULL (cap 0) to learn the size.
 * Returns 0 and *ret_len (the bytes needed), WF_ELIMIT when cap is too small (then *ret_len is
 * still the size needed) or when a count exceeds a WF_MODEL_MAX_* cap, WF_EINVAL for a model
 * without its tables. Pure; thread-safe. */
int wf_model_meta_encode(const struct wf_model *model, void *buf, size_t cap, size_t *ret_len,
                         struct wf_diag *diag);

/* Decodes len bytes. With model NULL it only validates (no allocation: what a floor attach
 * does); otherwise it sets model->format, hp, kv and each files[i].gguf_version and alignment
 * (model->n_files must be set and equal the encoded count; model->kv must be empty). Returns 0,
 * or WF_EFORMAT / WF_ETRUNCATED / WF_ELIMIT / WF_EVERSION with diag saying what and at which
 * byte; on failure model->kv is left empty. Thread-safe. */
int wf_model_meta_decode(const void *buf, size_t len, struct wf_model *model, struct wf_diag *diag);

/* Completes a model that a caller assembled from stored tables (files with path, size,
 * mtime_ns, data_offset, alignment; tensors with name, dtype, n_dims, ne, nbytes, file, offset;
 * format, kv, hp): runs the checks wf_model_open() runs on every format (shapes, bounds,
 * overlaps, duplicate names), orders the tensors, classifies them, recomputes each file's
 * n_tensors and data_size and the totals, and builds the name index. Returns 0 or the error
 * wf_model_open() would give, with diag. The model stays safe to wf_model_close(). */
int wf_model_assemble(struct wf_model *model, struct wf_diag *diag);

#ifdef __cplusplus
}
#endif
#endif
