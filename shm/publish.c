/* Publishing new tensor versions into a READY region: the writer's half of the generation
 * protocol written at the top of shm/layout.h ("Generations"); the readers' half is
 * wf_shm_region_tensor() in region.c.
 *
 * Decisions:
 *  - A writable view of its own. The attachment's mapping stays PROT_READ (a stray write in the
 *    agent must fault, not corrupt every worker's weights); the publish maps the region
 *    read-write for the length of the call and unmaps it. An mmap without MAP_POPULATE costs no
 *    page tables until touched, and only the header, the tensor entries and the new bytes are.
 *  - The new bytes go in with pwrite on tmpfs (no page-table entries in this process, as the
 *    fill does) and through the view on hugetlbfs, which has no write(). The spare area was
 *    reserved whole at materialization (region.c reserve_rest()), so neither can meet a full file
 *    system or SIGBUS.
 *  - The checksums of the bytes are computed from the floor, after the copy: the table then
 *    describes what readers read, whatever happens to the caller's buffer meanwhile.
 *  - tables_checksum and header_checksum are rewritten inside the seqlock's odd window (the
 *    header checksum computed for the even generation that ends it), so that every even
 *    generation a process can observe belongs to a whole, valid region, and a publisher killed
 *    anywhere in the window leaves an odd generation: WF_ENOT_READY for the next attacher
 *    (layout.c checks it before the header checksum). Readers already attached do not look at
 *    the checksums; attachers validate under the guard, which the publisher holds.
 *  - Everything that can be refused (indices, duplicates, types and sizes, space) is checked
 *    before the first byte is written, so a refused publish changes nothing; bytes appended
 *    past spare_used by a publish that then fails (pwrite error) are not referenced by any entry
 *    and are overwritten by the next publish. */
#include "base/error.h"
#include "model/dtype.h"
#include "shm/shm_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <unistd.h>

static void (*publish_hook)(void *arg);
static void *publish_hook_arg;

void wf__shm_set_publish_hook(void (*hook)(void *arg), void *arg)
{
	publish_hook = hook;
	publish_hook_arg = arg;
}

static const char *short_name(const struct wf_shm_region *r)
{
	const char *s = strrchr(r->path, '/');
	return s ? s + 1 : r->path;
}

static int pwrite_all(int fd, const uint8_t *p, uint64_t len, uint64_t offset)
{
	while (len > 0) {
		size_t chunk = len > (1u << 30) ? (size_t)1 << 30 : (size_t)len;
		ssize_t n = pwrite(fd, p, chunk, (off_t)offset);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			return -EIO;
		p += n;
		offset += (uint64_t)n;
		len -= (uint64_t)n;
	}
	return 0;
}

static const char *dtype_name(uint32_t dtype)
{
	const struct wf_dtype_info *di = wf_dtype_info(dtype);
	return di ? di->name : "?";
}

/* The arguments against the snapshot taken at attach (the fields they are compared with never
 * change after READY; the live entries are checked again under the guard). */
static int check_args(const struct wf_shm_region *r, const struct wf_shm_publish_tensor *t,
                      uint32_t n, bool dry, struct wf_diag *diag)
{
	const uint32_t n_tensors = r->hdr.n_tensors;
	uint8_t *seen = NULL;
	int rc = 0;

	if (!r->writable)
		return wf_diag_set(diag, WF_EPERMISSION,
		                   "publish to region %s: the attachment is read-only (attach it "
		                   "with WF_SHM_ATTACH_WRITE, as the region's owner)",
		                   short_name(r));
	if (n > n_tensors)
		return wf_diag_set(diag, WF_EINVAL,
		                   "publish to region %s: %" PRIu32
		                   " tensors, the region has %" PRIu32,
		                   short_name(r), n, n_tensors);
	seen = calloc((size_t)n_tensors / 8 + 1, 1);
	if (!seen)
		return -ENOMEM;
	for (uint32_t i = 0; i < n; i++) {
		uint32_t x = t[i].index;
		if (x >= n_tensors) {
			rc = wf_diag_set(diag, WF_ENOT_FOUND,
			                 "publish to region %s: tensor index %" PRIu32
			                 " (the region has %" PRIu32 ")",
			                 short_name(r), x, n_tensors);
			break;
		}
		if (seen[x / 8] & (1u << (x % 8))) {
			rc = wf_diag_set(diag, WF_EDUPLICATE,
			                 "publish to region %s: tensor index %" PRIu32
			                 " given twice",
			                 short_name(r), x);
			break;
		}
		seen[x / 8] |= (uint8_t)(1u << (x % 8));
		if (t[i].nbytes && !t[i].data && !dry) {
			rc = wf_diag_set(diag, WF_EINVAL,
			                 "publish: tensor index %" PRIu32 ": no data", x);
			break;
		}
	}
	free(seen);
	return rc;
}

/* Where tensor e's bytes from its file lie in the region: its file's section keeps them for the
 * region's life (publishes only append to the spare area). */
static uint64_t original_place(const struct wf_shm_header *h, const uint8_t *base,
                               const struct wf_shm_tensor_entry *e)
{
	const struct wf_shm_file_entry *fe =
	    (const void *)(base + h->file_table_offset + (uint64_t)e->file * sizeof(*fe));
	return fe->floor_offset + (e->source_offset - fe->window_offset);
}

/* Where each new version goes: a version equal to the bytes the tensor has now stays there, and
 * one equal to its bytes from its file goes back to them (the file's section, which still holds
 * them), so that a tensor that returns to its original bytes, as a sweep's sanity slot does,
 * takes no spare room however often it does (a comparison of the bytes costs less than the copy
 * it saves); every other one goes 64-aligned after spare_used, in the order given. Checks every
 * entry's type and size (live, under the guard) and the room left. Writes place[], reused[] and
 * *ret_used (the new spare_used). */
static int plan(const struct wf_shm_region *r, const struct wf_shm_header *h, const uint8_t *base,
                const struct wf_shm_publish_tensor *t, uint32_t n, uint64_t *place, bool *reused,
                uint64_t *ret_used, struct wf_diag *diag)
{
	const struct wf_shm_tensor_entry *tt = (const void *)(base + h->tensor_table_offset);
	const char *pool = (const char *)base + h->strings_offset;
	uint64_t cursor = h->spare_used, need = 0;

	for (uint32_t i = 0; i < n; i++) {
		const struct wf_shm_tensor_entry *e = &tt[t[i].index];
		/* validated a moment ago under the guard: the name is inside the pool */
		const char *name = pool + e->name_offset;
		int nl = (int)e->name_len;
		if (t[i].dtype != e->dtype)
			return wf_diag_set(
			    diag, WF_EINVAL,
			    "publish to region %s: tensor '%.*s' is of type %s, the new "
			    "version of type %s: a publish keeps the type (changing "
			    "it is not supported)",
			    short_name(r), nl, name, dtype_name(e->dtype), dtype_name(t[i].dtype));
		if (t[i].nbytes != e->nbytes)
			return wf_diag_set(diag, WF_EINVAL,
			                   "publish to region %s: tensor '%.*s' is %" PRIu64
			                   " bytes, the new version %" PRIu64
			                   ": a publish keeps the size",
			                   short_name(r), nl, name, e->nbytes, t[i].nbytes);
		/* the bytes it has now, or those from its file: no copy, no spare room */
		const uint64_t here[2] = {e->floor_offset, original_place(h, base, e)};
		for (int k = 0; k < 2 && t[i].data && !reused[i]; k++)
			if (memcmp(base + here[k], t[i].data, (size_t)e->nbytes) == 0) {
				reused[i] = true;
				place[i] = here[k];
			}
		if (reused[i])
			continue;
		uint64_t at =
		    (cursor + WF_SHM_SPARE_ALIGN - 1) & ~(uint64_t)(WF_SHM_SPARE_ALIGN - 1);
		if (at < cursor || __builtin_add_overflow(at, e->nbytes, &cursor))
			return wf_diag_set(diag, WF_EOVERFLOW, "publish: spare offsets overflow");
		place[i] = h->spare_offset + at;
		need += e->nbytes;
	}
	if (cursor > h->spare_size)
		return wf_diag_set(diag, WF_ENO_SPACE,
		                   "publish to region %s: the spare area is exhausted: %" PRIu64
		                   " bytes of %" PRIu64 " used, %" PRIu64
		                   " free; the new versions need %" PRIu64 " (%" PRIu64
		                   " with alignment); the space comes back only when the region "
		                   "is made anew",
		                   short_name(r), h->spare_used, h->spare_size,
		                   h->spare_size - h->spare_used, need, cursor - h->spare_used);
	*ret_used = cursor;
	return 0;
}

/* Copies the new versions to their places (not those that return to their file's bytes) and
 * hashes them there. */
static int copy_in(const struct wf_shm_region *r, uint8_t *wbase, bool huge,
                   const struct wf_shm_publish_tensor *t, uint32_t n, const uint64_t *place,
                   const bool *reused, uint64_t *sums, struct wf_diag *diag)
{
	for (uint32_t i = 0; i < n; i++) {
		if (reused[i]) {
		} else if (huge) {
			memcpy(wbase + place[i], t[i].data, (size_t)t[i].nbytes);
		} else {
			int rc = pwrite_all(r->fd, t[i].data, t[i].nbytes, place[i]);
			if (rc < 0)
				return wf_diag_set(diag, rc,
				                   "publish to region %s: write at %" PRIu64 ": %s",
				                   short_name(r), place[i], strerror(-rc));
		}
		sums[i] = wf_shm_checksum(wbase + place[i], (size_t)t[i].nbytes);
	}
	return 0;
}

/* The seqlock write (shm/layout.h, step 3), with the checksums inside the odd window. */
static uint64_t switch_entries(uint8_t *wbase, const struct wf_shm_header *h,
                               const struct wf_shm_publish_tensor *t, uint32_t n,
                               const uint64_t *place, const uint64_t *sums, uint64_t new_used)
{
	struct wf_shm_header *live = (struct wf_shm_header *)wbase;
	struct wf_shm_tensor_entry *tt = (void *)(wbase + h->tensor_table_offset);
	const uint64_t g = h->generation, next = g + 2;

	__atomic_store_n(&live->generation, g + 1, __ATOMIC_RELAXED);
	__atomic_thread_fence(__ATOMIC_RELEASE);
	for (uint32_t i = 0; i < n; i++) {
		struct wf_shm_tensor_entry *e = &tt[t[i].index];
		__atomic_store_n(&e->floor_offset, place[i], __ATOMIC_RELAXED);
		__atomic_store_n(&e->checksum, sums[i], __ATOMIC_RELAXED);
		__atomic_store_n(&e->generation, next, __ATOMIC_RELAXED);
	}
	__atomic_store_n(&live->spare_used, new_used, __ATOMIC_RELAXED);
	if (publish_hook)
		publish_hook(publish_hook_arg);
	/* Nobody validates checksums while we hold the guard; they are ready before the
	 * generation turns even. */
	__atomic_store_n(&live->tables_checksum,
	                 wf_shm_checksum(wbase + h->file_table_offset,
	                                 (size_t)(h->data_offset - h->file_table_offset)),
	                 __ATOMIC_RELAXED);
	struct wf_shm_header final;
	memcpy(&final, live, sizeof(final));
	final.generation = next;
	__atomic_store_n(&live->header_checksum, wf_shm_header_checksum(&final), __ATOMIC_RELAXED);
	__atomic_store_n(&live->generation, next, __ATOMIC_RELEASE);
	return next;
}

int wf_shm_region_publish(struct wf_shm_region *r, const struct wf_shm_publish_tensor *t,
                          uint32_t n, unsigned flags, uint64_t *ret_generation,
                          struct wf_diag *diag)
{
	const bool dry = flags & WF_SHM_PUBLISH_DRY_RUN;
	struct wf_shm_header h;
	uint64_t *place = NULL, *sums = NULL, used = 0, gen;
	bool *reused = NULL;
	void *wbase = MAP_FAILED;
	int gfd = -1, rc;

	if (!r || !r->base || !t || n == 0 || !ret_generation || (flags & ~WF_SHM_PUBLISH_DRY_RUN))
		return wf_diag_set(diag, WF_EINVAL,
		                   "publish: bad arguments (no region or no tensors)");
	rc = check_args(r, t, n, dry, diag);
	if (rc < 0)
		return rc;
	place = calloc(n, sizeof(*place));
	sums = calloc(n, sizeof(*sums));
	reused = calloc(n, sizeof(*reused));
	if (!place || !sums || !reused) {
		rc = -ENOMEM;
		goto out;
	}

	rc = wf__shm_lock_path(r->guard_path, LOCK_EX, false, NULL, &gfd);
	if (rc < 0) {
		rc = rc == -ENOENT
		         ? wf_diag_set(diag, WF_ESTATE,
		                       "publish to region %s: it was removed (no guard file)",
		                       short_name(r))
		         : wf_diag_set(diag, rc, "lock %s: %s", r->guard_path, strerror(-rc));
		goto out;
	}
	/* Under the guard: nobody else publishes, rebuilds or removes the region now. It must still
	 * be the file we map: a rebuild replaces the inode, and publishing into the old one would
	 * reach nobody. */
	rc = wf__shm_same_file(r->fd, r->path);
	if (rc != 1) {
		rc =
		    wf_diag_set(diag, rc < 0 ? rc : WF_ESTATE,
		                "publish to region %s: the file was replaced or removed since this "
		                "attach",
		                short_name(r));
		goto out;
	}
	if (!dry) {
		wbase = mmap(NULL, (size_t)r->size, PROT_READ | PROT_WRITE, MAP_SHARED, r->fd, 0);
		if (wbase == MAP_FAILED) {
			rc = wf_diag_set(diag, -errno, "map %s writable: %s", r->path,
			                 strerror(errno));
			goto out;
		}
	}
	/* A dry run reads through the attachment's own (read-only) mapping of the same inode. */
	uint8_t *view = dry ? r->base : wbase;
	/* The live header and tables, whole (READY, an even generation, both checksums, every
	 * bound): what the entries are switched in must be what attachers would accept. */
	struct wf_diag why;
	wf_diag_clear(&why);
	rc = wf__shm_validate(view, r->size, &r->digest, &h, &why);
	if (rc < 0) {
		wf_diag_set(diag, rc, "publish to region %s: %s", short_name(r),
		            wf_diag_str(&why, rc));
		goto out;
	}
	if (h.n_tensors != r->hdr.n_tensors ||
	    h.tensor_table_offset != r->hdr.tensor_table_offset) {
		rc = wf_diag_set(diag, WF_ESTATE,
		                 "publish to region %s: its tables moved since attach",
		                 short_name(r));
		goto out;
	}
	rc = plan(r, &h, view, t, n, place, reused, &used, diag);
	if (rc < 0 || dry) {
		if (rc == 0)
			*ret_generation = h.generation;
		goto out;
	}
	rc =
	    copy_in(r, wbase, (h.flags & WF_SHM_HDR_HUGETLB) != 0, t, n, place, reused, sums, diag);
	if (rc < 0)
		goto out;
	/* r->hdr stays the snapshot of the attach: other threads read it without a lock, and the
	 * fields they use do not change. */
	gen = switch_entries(wbase, &h, t, n, place, sums, used);
	*ret_generation = gen;
	rc = 0;
out:
	if (wbase != MAP_FAILED)
		munmap(wbase, (size_t)r->size);
	if (gfd >= 0)
		close(gfd);
	free(place);
	free(reused);
	free(sums);
	return rc;
}

void wf_shm_region_spare(const struct wf_shm_region *r, uint64_t *ret_size, uint64_t *ret_used)
{
	const struct wf_shm_header *live = r->base;
	*ret_size = r->hdr.spare_size;
	*ret_used = __atomic_load_n(&live->spare_used, __ATOMIC_ACQUIRE);
}
