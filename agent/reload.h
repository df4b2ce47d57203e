/* Which tensors of a floor changed on disk, decided by content: the planning half of a reload
 * (`agentctl reload`, ReloadModel in docs/PROTOCOL.md). The floor manager (agent/floors.c)
 * publishes what a plan says changed, as one generation of the same floor (shm/layout.h,
 * "Generations"), and keeps the plan's file identities as the new baseline.
 *
 * The decision, per file, then per tensor:
 *  1. A file whose identity (size, mtime, ctime, device, inode) equals the baseline is not read:
 *     nothing in it changed. ctime is in the identity because a writer can restore a file's
 *     mtime (touch -d, utimensat) but not its ctime, which any write or attribute change moves.
 *  2. In a file whose identity moved, every floor tensor stored there is read from the file and
 *     hashed (xxh3-64, the floor's own checksum): a checksum equal to the floor entry's is
 *     UNCHANGED (a touched but unchanged file changes nothing), a different one CHANGED.
 *  3. Refused, by name and with the reason: a tensor whose shape or type changed (the floor's
 *     entries keep their type and size; a type change needs the engine's re-layout, not built),
 *     a tensor that vanished from the files, a tensor the files gained, and a model whose file
 *     list changed. One refusal refuses the whole reload: nothing is published, so the experts
 *     of one layer (gate, up, down) never mix versions.
 * The bytes of a CHANGED tensor are read once into memory the plan owns, hashed there, and
 * published from there: what was compared is what is published. A file whose identity moved
 * between the model reader's open and the end of the reads was written meanwhile (its bytes may
 * be half old, half new): the plan fails with WF_ECHANGED, and a reload after the writer is done
 * sees the whole new file.
 *
 * Files are read with pread through a descriptor whose device and inode must be those the model
 * reader recorded (a file replaced since, by a FIFO, a symlink or another file, is refused). */
#ifndef WF_AGENT_RELOAD_H
#define WF_AGENT_RELOAD_H

#include "base/diag.h"
#include "model/model.h"

#include <stdbool.h>
#include <stdint.h>

struct wf_shm_region;

/* What identifies a file's contents without reading them. */
struct wf_reload_ident {
	uint64_t size, dev, ino;
	int64_t mtime_ns, ctime_ns;
};

/* The identity wf_model_open() recorded for file i of model. */
struct wf_reload_ident wf_reload_ident_of(const struct wf_model_file *file);
/* True when path no longer has identity id (or cannot be stat'ed). */
bool wf_reload_ident_moved(const char *path, const struct wf_reload_ident *id);

enum wf_reload_status {
	WF_RELOAD_UNCHANGED = 0, /* listed only in counts */
	WF_RELOAD_CHANGED = 1,   /* new bytes in data */
	WF_RELOAD_REFUSED = 2,   /* why says why */
};

struct wf_reload_tensor {
	char *name;
	uint32_t index; /* in the floor; UINT32_MAX for a tensor the files gained */
	enum wf_reload_status status;
	uint64_t nbytes;
	uint64_t old_checksum, new_checksum;
	void *data; /* CHANGED: nbytes, owned by the plan */
	char why[192];
};

struct wf_reload_plan {
	uint32_t n_files, files_moved; /* files compared, and those whose identity moved */
	uint32_t n_unchanged;          /* tensors hashed and found equal to the floor */
	uint32_t n_changed, n_refused;
	uint64_t bytes_read, bytes_changed;
	struct wf_reload_tensor *tensors; /* the CHANGED and REFUSED ones, in floor order */
	uint32_t n_tensors;
	struct wf_reload_ident *idents; /* n_files: the files' identity as read now */
};

/* Plans a reload of the floor region (any attachment) against model, the model's files opened
 * again now (wf_model_open() of the same path), with baseline[n_baseline] the identities the
 * floor's bytes were last reconciled with. Returns 0 with *ret filled (refusals are entries, not
 * errors), or an error that stops the plan before any decision: WF_ESHARD (the file list
 * changed: diag says how), WF_ECHANGED (a file replaced or written while it was read), an I/O
 * errno, -ENOMEM. Reads no tensor of a file whose identity did not move. */
int wf_reload_plan(const struct wf_shm_region *region, const struct wf_model *model,
                   const struct wf_reload_ident *baseline, uint32_t n_baseline,
                   struct wf_reload_plan *ret, struct wf_diag *diag);
void wf_reload_plan_free(struct wf_reload_plan *plan);

#endif
