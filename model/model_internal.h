/* Internal contract between model.c (the front door) and the format loaders.
 *
 * wf_model_open() detects the format, calls one loader to fill a zeroed struct wf_model (format,
 * files with size/mtime/data_offset, tensors with name/dtype/shape/file/offset, kv, hp where the
 * format carries it), then calls wf__model_finish(), which is the one place that validates what
 * every format must satisfy (bounds, overlap, duplicate names, nbytes vs shape), classifies
 * tensors, orders them, builds the name index and computes the totals. A loader therefore checks
 * only its own syntax, but must cap every count and size it allocates for (WF_MODEL_MAX_*). */
#ifndef WF_MODEL_MODEL_INTERNAL_H
#define WF_MODEL_MODEL_INTERNAL_H

#include "model/model.h"

/* GGUF (model/gguf.c): one file or a set of shards found from any one of them. */
int wf__gguf_load(struct wf_model *m, const char *path, struct wf_diag *diag);

/* safetensors (model/safetensors.c): a .safetensors file, an index.json, or a directory. */
int wf__safetensors_load(struct wf_model *m, const char *path, struct wf_diag *diag);

/* wf_model_open() without the detection: runs the given format's loader on path, then
 * wf__model_finish(). The name of path plays no part in choosing the parser, which is what the
 * fuzz targets need (they open "/proc/self/fd/N"). */
int wf__model_open_format(const char *path, enum wf_model_format format,
                          struct wf_model **ret_model, struct wf_diag *diag);

/* Validation and derived fields common to every format (model/model.c). The loader sets each
 * tensor's nbytes to the size the file gives it (safetensors: end - begin; GGUF: from the shape)
 * and finish checks it against dtype and shape. Finish also sets unused ne[] to 1, recomputes
 * files[].n_tensors and data_size, treats alignment 0 as 1, and fills tclass, the totals and
 * the name index. On failure the model is still safe to pass to wf_model_close(). */
int wf__model_finish(struct wf_model *m, struct wf_diag *diag);

/* hp from GGUF-style metadata ("general.architecture", then "<arch>.block_count", ...). Zero
 * fields where a key is absent; WF_EFORMAT (naming the key and path) where one has the wrong type
 * or does not fit; per-layer integer arrays give their largest element. (model/model.c) */
int wf__hparams_from_gguf(struct wf_hparams *hp, const struct wf_kv_set *kv, const char *path,
                          struct wf_diag *diag);

/* Classification by tensor name: ffn_{gate,up,down,gate_up}_exps (GGUF; any suffix: .weight,
 * .bias, .scale), the pre-2024 per-expert GGUF names ffn_{gate,up,down}.N, and "...experts.N..."
 * or "...experts.{gate,up,down,w1,w2,w3}..." (HF safetensors, "experts" a whole name segment) are
 * experts; shared experts (shexp, shared_expert) and routers (ffn_gate_inp, .gate.weight,
 * router.weight) are dense. NULL is dense. */
enum wf_tensor_class wf__tensor_classify(const char *name);

/* Records in f what the reader opened on fd (fstat st): real_path from the descriptor, dev, ino.
 * 0 or -errno. (model/model.c) */
struct stat;
int wf__model_record_file(struct wf_model_file *f, int fd, const struct stat *st);
/* Appends the resolved path of fd (a metadata file the reader opened) to m->aux_paths. */
int wf__model_record_aux(struct wf_model *m, int fd);

#endif
