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

/* Validation and derived fields common to every format (model/model.c). */
int wf__model_finish(struct wf_model *m, struct wf_diag *diag);

/* Classification by tensor name: ffn_{gate,up,down,gate_up}_exps (GGUF) and "...experts.N..."
 * or "...experts.{gate,up,down}..." (HF safetensors) are experts; shared experts (shexp,
 * shared_expert) and routers (ffn_gate_inp, .gate.weight) are dense. */
enum wf_tensor_class wf__tensor_classify(const char *name);

#endif
