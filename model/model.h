/* The model inventory: one view of a GGUF or safetensors model, single file or sharded.
 *
 * wf_model_open() reads only headers (never tensor data): the metadata, the tensor table, and each
 * file's size and mtime. Everything it returns is validated: every tensor lies inside its file's
 * data section, tensors of one file do not overlap, names are unique, types are known, sizes agree
 * with shapes, and counts are capped (WF_MODEL_MAX_*) so that hostile headers cannot cause
 * unbounded allocation.
 *
 * Ownership: the struct wf_model and everything it points to belong to the model and are freed by
 * wf_model_close(). A model is immutable after open and may be read from many threads. */
#ifndef WF_MODEL_MODEL_H
#define WF_MODEL_MODEL_H

#include "base/diag.h"
#include "model/dtype.h"
#include "model/kv.h"

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define WF_MODEL_MAX_DIMS    8            /* GGUF allows 4; safetensors shapes are capped at 8 */
#define WF_MODEL_MAX_FILES   4096         /* shards */
#define WF_MODEL_MAX_TENSORS (1u << 20)   /* per model */
#define WF_MODEL_MAX_NAME    1024         /* bytes in a tensor name or key */
#define WF_MODEL_MAX_KV      65536        /* metadata entries per file */
#define WF_MODEL_MAX_ARRAY   (1ull << 24) /* elements in one metadata array (vocabularies) */
#define WF_MODEL_MAX_HEADER                                                                        \
	(1ull << 30)            /* bytes of header (GGUF metadata+infos, safetensors JSON) */
#define WF_MODEL_MAX_KV_DEPTH 8 /* nesting of GGUF arrays of arrays */

enum wf_model_format {
	WF_MODEL_FORMAT_GGUF = 1,
	WF_MODEL_FORMAT_SAFETENSORS = 2,
};

enum wf_tensor_class {
	WF_TENSOR_DENSE = 0,  /* attention, norms, embeddings, router, shared experts */
	WF_TENSOR_EXPERT = 1, /* routed expert weights (ffn_*_exps, ...experts.N...) */
};

struct wf_model_file {
	char *path;            /* as opened (absolute if the caller passed one) */
	uint64_t size;         /* st_size at open */
	int64_t mtime_ns;      /* st_mtim at open */
	uint64_t data_offset;  /* start of the tensor-data section in this file */
	uint64_t data_size;    /* bytes from data_offset to the end of the last tensor, padded up to
	                          the alignment but never past EOF; 0 for a file without tensors */
	uint32_t gguf_version; /* 2 or 3; 0 for safetensors */
	uint32_t alignment;    /* GGUF general.alignment (default 32); 1 for safetensors.
	                          data_offset and every GGUF tensor offset are multiples of it. */
	uint32_t n_tensors;    /* tensors stored in this file */
	char *real_path;       /* the file the reader actually opened, resolved from its descriptor:
	                          what a confinement check (the agent's model roots) must look at,
	                          since path or a shard sibling may be a symlink */
	uint64_t dev, ino;     /* identity of that file at open: whoever opens path again later
	                          (the materializer) must find this file, else WF_ECHANGED */
	int64_t ctime_ns;      /* st_ctim at open: a writer can restore mtime, never ctime, so a
	                          reload (agent/reload.h) looks at files whose ctime moved too */
};

struct wf_tensor {
	char *name;
	enum wf_dtype dtype;
	uint32_t n_dims;
	int64_t
	    ne[WF_MODEL_MAX_DIMS]; /* ggml order: ne[0] is the contiguous dimension. For safetensors
	                              the shape is reversed into this order; unused dims are 1. */
	uint64_t nbytes;
	uint32_t file;   /* index into model->files */
	uint64_t offset; /* absolute byte offset in that file */
	enum wf_tensor_class tclass;
};

/* Hyper-parameters read from metadata ("<arch>.block_count", ...) for GGUF, or config.json for
 * safetensors when present. Zero where the model does not say. */
struct wf_hparams {
	char arch[64];
	uint32_t n_layer;
	uint32_t n_embd;
	uint32_t n_head;
	uint32_t n_head_kv;
	uint32_t head_dim; /* attention.key_length, or n_embd / n_head */
	uint32_t n_ff;     /* feed_forward_length */
	uint32_t n_ff_exp; /* expert_feed_forward_length (falls back to n_ff) */
	uint32_t n_expert;
	uint32_t n_expert_used;
	uint32_t n_ctx_train;
	uint32_t n_vocab; /* tokenizer.ggml.tokens length, or <arch>.vocab_size */
	uint32_t rope_dim;
	float rope_freq_base;
	float rms_eps;
};

struct wf_model {
	enum wf_model_format format;
	uint32_t n_files;
	struct wf_model_file *files;
	uint32_t n_tensors;
	struct wf_tensor
	    *tensors;        /* in file order: file 0's tensors by offset, then file 1's, ... */
	struct wf_kv_set kv; /* GGUF: the metadata of shard 0 (split.no == 0), whichever
	                        shard was named; the others' keys are read, checked and
	                        dropped. safetensors: __metadata__ */
	struct wf_hparams hp;
	uint64_t total_bytes; /* sum of tensor nbytes */
	uint64_t dense_bytes;
	uint64_t expert_bytes;
	uint64_t bytes_by_dtype[WF_DTYPE_MAX_];
	uint32_t count_by_dtype[WF_DTYPE_MAX_];

	/* Resolved paths of the other files the reader opened for metadata only (safetensors:
	 * the index.json and config.json), for the same confinement checks as files[].real_path. */
	uint32_t n_aux;
	char **aux_paths;

	/* Private to model.c: tensor indices sorted by name (strcmp), for wf_model_find_tensor. */
	uint32_t *name_index;
};

/* Opens a model by path, detecting the format:
 *  - "*.gguf": a GGUF file (v2 or v3, little-endian). If its metadata says split.count > 1 it is
 *    one shard of a set: its name must end in "-%05d-of-%05d.gguf" (split.no + 1, split.count), the
 *    llama.cpp convention, and the siblings are found beside it by that name and opened as one
 *    model (any shard may be named). The metadata decides, not the name: a file named like a shard
 *    but without split.count is a single-file model. Each shard's split.no/split.count must agree
 *    and the tensor total must equal split.tensors.count, else WF_ESHARD (naming a missing file);
 *  - "*.safetensors": one safetensors file;
 *  - "*.safetensors.index.json", or a directory holding model.safetensors.index.json or a single
 *    model.safetensors: a sharded or single safetensors model (config.json beside it fills hp);
 *  - any other name: by magic ("GGUF", or a safetensors header length followed by '{'), so
 *    "/proc/self/fd/N" works. WF_EUNSUPPORTED if this build has no safetensors reader.
 * GGUF hparams come from "<general.architecture>.*" keys; where a model stores a per-layer array
 * (head_count, head_count_kv, feed_forward_length in some archs) hp holds its largest element.
 * Clears diag first. Returns 0 and *ret_model, or a negative code with diag saying what is wrong
 * and where. Thread-safe (no shared state). */
int wf_model_open(const char *path, struct wf_model **ret_model, struct wf_diag *diag);

struct stat;

/* Opens a file that a model reader or the materializer reads bytes from, safely against hostile
 * directory entries: O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK (a FIFO or a device planted under
 * a model file's name must not block the open), fstat, refusal of anything that is not a regular
 * file, then O_NONBLOCK cleared. Every model file open goes through here (GGUF files and shards,
 * safetensors files, shards, index and config files, shm/fill.c's data reads).
 * Returns 0 with *ret_fd (the caller closes it) and, if ret_st is not NULL, its fstat; -errno of
 * open(2) with diag untouched (so that the caller can say "missing shard"); WF_EFORMAT with diag
 * "PATH: not a regular file (a FIFO)" for a FIFO, socket, device or directory; or -errno of
 * fstat/fcntl with diag set. Thread-safe. */
int wf_model_file_open(const char *path, int *ret_fd, struct stat *ret_st, struct wf_diag *diag);

/* The resolved path of an open descriptor (readlink of /proc/self/fd/N): the file itself, not
 * whatever its name points to now. Returns 0 and a malloc'ed string, or -errno. */
int wf_model_fd_path(int fd, char **ret_path);

/* Frees the model; accepts NULL. */
void wf_model_close(struct wf_model *model);

/* Tensor by name, or NULL (also for a NULL model or name). O(log n): the model keeps a sorted
 * index. */
const struct wf_tensor *wf_model_find_tensor(const struct wf_model *model, const char *name);

/* Content-addressed identity of the model (xxh3-128), the name of its floor:
 * covers the digest format version, each file's size, mtime and data offset, and each tensor's
 * name, dtype, shape, nbytes, file index and offset, in tensor order. Paths are not covered: the
 * same files moved elsewhere keep their digest; a touched or rewritten file gets a new one.
 *
 * Exactly, XXH3_128bits (seed 0) over this byte stream, every integer little-endian:
 *   u32 WF_DIGEST_VERSION, u32 n_files, u32 n_tensors,
 *   per file:   u64 size, i64 mtime_ns, u64 data_offset,
 *   per tensor: u32 name length, the name's bytes (no NUL), u32 dtype, u32 n_dims,
 *               i64 ne[0..n_dims), u64 nbytes, u32 file, u64 offset
 * and hi/lo are the hash's high64/low64 halves. The counts and lengths make the encoding
 * unambiguous. Pure function of the struct; thread-safe. */
struct wf_digest {
	uint64_t hi, lo;
};
#define WF_DIGEST_VERSION 1
void wf_model_digest(const struct wf_model *model, struct wf_digest *ret_digest);

/* 32 lowercase hex characters plus NUL, hi then lo. */
#define WF_DIGEST_HEX_LEN 33
void wf_digest_hex(const struct wf_digest *digest, char out[WF_DIGEST_HEX_LEN]);
/* Inverse of wf_digest_hex: exactly 32 hex digits (either case) then NUL; WF_EINVAL otherwise. */
int wf_digest_parse(const char *hex, struct wf_digest *ret_digest);

/* "gguf" / "safetensors"; "unknown" for anything else. Static string. */
const char *wf_model_format_name(enum wf_model_format format);

#ifdef __cplusplus
}
#endif
#endif
