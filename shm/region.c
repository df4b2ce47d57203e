/* Attach, materialize, detach, verify and the accessors of a floor region. The protocol is written
 * at the top of shm/region.h, the byte layout at the top of shm/layout.h. */
#include "base/error.h"
#include "model/meta.h"
#include "shm/shm_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/magic.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#ifndef HUGETLBFS_MAGIC
#define HUGETLBFS_MAGIC 0x958458f6
#endif

/* A reader spinning on an odd generation this long is looking at a publisher that died: give up
 * rather than hang (the next attacher rebuilds the region). */
#define SEQLOCK_MAX_SPINS (1u << 22)

#define ATTACH_FLAGS                                                                               \
	(WF_SHM_ATTACH_CREATE | WF_SHM_ATTACH_REBUILD | WF_SHM_ATTACH_NOWAIT |                     \
	 WF_SHM_ATTACH_STREAM | WF_SHM_ATTACH_OWNED | WF_SHM_ATTACH_VERIFY | WF_SHM_ATTACH_WRITE)

static int64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static const char *short_name(const struct wf_shm_region *r)
{
	const char *s = strrchr(r->path, '/');
	return s ? s + 1 : r->path;
}

/* mkdir -p; directories we create get the configured mode (not the umask's) and group. */
int wf__shm_make_dir(const struct wf_shm_config *cfg, const char *dir, struct wf_diag *diag)
{
	char *p = strdup(dir);
	int rc = 0;

	if (!p)
		return -ENOMEM;
	for (char *s = p + 1;; s++) {
		if (*s != '/' && *s != '\0')
			continue;
		char c = *s;
		*s = '\0';
		if (mkdir(p, wf__shm_dir_mode(cfg)) == 0) {
			int fd = open(p, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
			if (fd < 0 || fchmod(fd, wf__shm_dir_mode(cfg)) != 0 ||
			    wf__shm_apply_group(fd, cfg) < 0) {
				rc = wf_diag_set(diag, -errno, "floor directory %s: %s", p,
				                 strerror(errno));
				if (fd >= 0)
					close(fd);
				break;
			}
			close(fd);
		} else if (errno != EEXIST) {
			rc = wf_diag_set(diag, -errno, "create floor directory %s: %s", p,
			                 strerror(errno));
			break;
		}
		*s = c;
		if (c == '\0')
			break;
	}
	free(p);
	return rc;
}

/* The page size regions in dir must be multiples of: hugetlbfs maps and sizes whole huge pages. */
static int dir_page(const char *dir, uint64_t *ret_page, bool *ret_huge, struct wf_diag *diag)
{
	struct statfs sfs;
	if (statfs(dir, &sfs) != 0)
		return wf_diag_set(diag, -errno, "floor directory %s: %s", dir, strerror(errno));
	if ((uint32_t)sfs.f_type == (uint32_t)HUGETLBFS_MAGIC) {
		uint64_t b = (uint64_t)sfs.f_bsize;
		if (b < WF_SHM_PAGE || (b & (b - 1)) != 0)
			return wf_diag_set(diag, WF_EFORMAT, "hugetlbfs %s: page size %" PRIu64,
			                   dir, b);
		*ret_page = b;
		*ret_huge = true;
	} else {
		*ret_page = WF_SHM_PAGE;
		*ret_huge = false;
	}
	return 0;
}

/* The validated name index, in the mapping (shm/layout.h). */
static void set_index(struct wf_shm_region *r)
{
	r->name_index = (const uint32_t *)((const uint8_t *)r->base + r->hdr.name_index_offset);
}

static void unmap(struct wf_shm_region *r)
{
	if (r->base)
		munmap(r->base, r->size);
	r->base = NULL;
	r->size = 0;
	r->name_index = NULL;
}

/* Frees the handle without the release protocol: for failed attaches (the caller still holds the
 * guard) and after detach did its part. */
static void region_free(struct wf_shm_region *r)
{
	if (!r)
		return;
	unmap(r);
	if (r->fd >= 0)
		close(r->fd);
	if (r->holders_fd >= 0)
		close(r->holders_fd);
	free(r->rebuild_reason);
	free(r->dir);
	free(r->path);
	free(r->guard_path);
	free(r->holders_path);
	free(r->keep_path);
	free(r);
}

/* Maps an existing region file (r->fd) read-only and validates it. */
static int map_existing(struct wf_shm_region *r, const struct wf_model *model,
                        const struct wf_shm_layout *layout, struct wf_diag *diag)
{
	struct stat st;
	struct wf_shm_header h;
	void *base;
	int rc;

	if (fstat(r->fd, &st) != 0)
		return wf_diag_set(diag, -errno, "stat %s: %s", r->path, strerror(errno));
	if (!S_ISREG(st.st_mode))
		return wf_diag_set(diag, WF_EFORMAT, "%s is not a regular file", r->path);
	if ((uint64_t)st.st_size < WF_SHM_HEADER_SIZE) /* nothing to map: validate says why */
		return wf__shm_validate(NULL, (uint64_t)st.st_size, &r->digest, &h, diag);
	base = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, r->fd, 0);
	if (base == MAP_FAILED)
		return wf_diag_set(diag, -errno, "map %s: %s", r->path, strerror(errno));
	r->base = base;
	r->size = (uint64_t)st.st_size;
	rc = wf__shm_validate(base, r->size, &r->digest, &h, diag);
	if (rc == 0 && model)
		rc = wf__shm_match_model(base, &h, model, layout, diag);
	if (rc == 0) {
		r->hdr = h;
		set_index(r);
	}
	if (rc < 0)
		unmap(r);
	return rc;
}

/* OWNED: may this process trust the file fd (a region or lock file) it opened in the floor
 * directory? 0 or WF_EPERMISSION with diag naming the file and why. */
static int check_owned(int fd, const char *path, bool lock_file, struct wf_diag *diag)
{
	struct stat st;
	char why[96];

	if (fstat(fd, &st) != 0)
		return wf_diag_set(diag, -errno, "stat %s: %s", path, strerror(errno));
	if (wf__shm_check_file(&st, lock_file, why, sizeof(why)) < 0)
		return wf_diag_set(diag, WF_EPERMISSION, "%s is %s: not trusted", path, why);
	return 0;
}

static int reserve(int fd, uint64_t off, uint64_t len)
{
	if (len == 0 || fallocate(fd, 0, (off_t)off, (off_t)len) == 0)
		return 0;
	if (errno != EOPNOTSUPP)
		return -errno;
	/* A filesystem without fallocate (not tmpfs, not hugetlbfs): glibc writes the blocks. */
	int e = posix_fallocate(fd, (off_t)off, (off_t)len);
	return e ? -e : 0;
}

/* Reserving the data area as the fill writes it (WF_SHM_ATTACH_STREAM). A write to tmpfs allocates
 * the pages it touches, so a fill writing in order reserves as it goes; only what it skips (and,
 * after it, what it never wrote) needs fallocate. Why not fallocate everything first: the pages
 * would be allocated in one pass and written in another, and fallocate holds the inode lock for
 * its whole range, as a write does, so nothing overlaps the allocation. Why not a helper thread
 * fallocating ahead: it only made the writer spin on the inode lock (an eighth of the CPU samples
 * of a cold 1 GB fill in rwsem_spin_on_owner). Measured per GB from a hot buffer on a 2-vCPU VM:
 * fallocate then pwrite 0.36-0.40 s, pwrite into holes 0.32-0.38 s; and the allocation overlaps
 * the fill's reads instead of preceding them. */
struct wf__shm_reserve {
	pthread_mutex_t mu;
	uint64_t done; /* [0, done) is reserved */
	uint64_t end;  /* the region's size */
	int err;       /* first failure: every later write gets it */
};

/* Test hook (wf__shm_set_reserve_fault()): reserving or writing fails with fault_err from
 * fault_from on, as on a file system that fills up there. */
static uint64_t fault_from = UINT64_MAX;
static int fault_err;

void wf__shm_set_reserve_fault(uint64_t from, int err)
{
	fault_from = from;
	fault_err = err;
}

static int reserve_range(int fd, uint64_t off, uint64_t len)
{
	if (off + len <= fault_from)
		return reserve(fd, off, len);
	int e = off < fault_from ? reserve(fd, off, fault_from - off) : 0;
	return e < 0 ? e : fault_err;
}

/* [0, from) is reserved; the fill's writes and reserve_rest() reserve the rest. */
static int reserve_init(struct wf_shm_region *r, uint64_t from, uint64_t end)
{
	struct wf__shm_reserve *rs = calloc(1, sizeof(*rs));

	if (!rs)
		return -ENOMEM;
	rs->done = from;
	rs->end = end;
	pthread_mutex_init(&rs->mu, NULL);
	r->reserve = rs;
	return 0;
}

static void reserve_fini(struct wf_shm_region *r)
{
	if (!r->reserve)
		return;
	pthread_mutex_destroy(&r->reserve->mu);
	free(r->reserve);
	r->reserve = NULL;
}

/* Before a write at offset: reserves the gap [done, offset) it would leave. 0 or the (sticky)
 * error. */
static int reserve_before(struct wf_shm_region *r, uint64_t offset)
{
	struct wf__shm_reserve *rs = r->reserve;
	int e;

	if (!rs)
		return 0;
	pthread_mutex_lock(&rs->mu);
	if (rs->err == 0 && rs->done < offset) {
		e = reserve_range(r->fd, rs->done, offset - rs->done);
		if (e < 0)
			rs->err = e;
		else
			rs->done = offset;
	}
	e = rs->err;
	pthread_mutex_unlock(&rs->mu);
	return e;
}

/* After a write of [offset, end) (rc: its result): its pages are allocated, the last one whole;
 * the frontier moves past them if the write began inside it. A write that failed for lack of
 * space fails the reservation. */
static int reserve_after(struct wf_shm_region *r, uint64_t offset, uint64_t end, int rc)
{
	struct wf__shm_reserve *rs = r->reserve;
	uint64_t to = (end + WF_SHM_PAGE - 1) & ~(uint64_t)(WF_SHM_PAGE - 1);

	if (!rs)
		return rc;
	pthread_mutex_lock(&rs->mu);
	if (rc == -ENOSPC && rs->err == 0)
		rs->err = rc;
	if (rc == 0 && offset <= rs->done && rs->done < to)
		rs->done = to < rs->end ? to : rs->end;
	pthread_mutex_unlock(&rs->mu);
	return rc;
}

/* After the fill: what it did not write (padding, the spare area). 0 or the error. */
static int reserve_rest(struct wf_shm_region *r)
{
	return r->reserve ? reserve_before(r, r->reserve->end) : 0;
}

static int write_all(int fd, const uint8_t *p, size_t len, uint64_t offset)
{
	if (offset + len > fault_from)
		return fault_err;
	while (len > 0) {
		ssize_t n = pwrite(fd, p, len, (off_t)offset);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			return -EIO;
		p += n;
		offset += (uint64_t)n;
		len -= (size_t)n;
	}
	return 0;
}

int wf_shm_fill_write(const struct wf_shm_fill *job, uint64_t offset, const void *buf, size_t len)
{
	struct wf_shm_region *r;
	uint64_t end;
	int e;

	if (!job || !job->region || (len && !buf) || __builtin_add_overflow(offset, len, &end))
		return WF_EINVAL;
	r = job->region;
	if (offset < r->hdr.data_offset || end > r->hdr.data_offset + r->hdr.data_size)
		return WF_EINVAL;
	if (job->hugetlbfs) { /* never STREAM: reserved already */
		memcpy((uint8_t *)job->base + offset, buf, len);
		return 0;
	}
	e = reserve_before(r, offset);
	if (e < 0)
		return e;
	return reserve_after(r, offset, end, write_all(job->region_fd, buf, len, offset));
}

/* The error of a failed reservation, with what the directory can still hold. */
static int space_error(const struct wf_shm_region *r, const struct wf_shm_layout *lay,
                       uint64_t size, int rc, struct wf_diag *diag)
{
	struct statvfs vfs;
	uint64_t avail = 0;

	if (statvfs(r->dir, &vfs) == 0)
		avail = (uint64_t)vfs.f_bavail * vfs.f_frsize;
	return wf_diag_set(diag, rc,
	                   "floor directory %s cannot hold region %s: it needs %" PRIu64
	                   " bytes (%" PRIu64 " of tensor data, %" PRIu64 " of tables, %" PRIu64
	                   " spare), %" PRIu64 " are free: %s",
	                   r->dir, short_name(r), size, lay->data_size, lay->data_offset,
	                   lay->spare_size, avail, strerror(-rc));
}

/* STREAM's early answer for a directory that is plainly too small, where the full fallocate would
 * have given it. A tmpfs without a size limit reports no blocks: then only fallocate can tell. */
static bool plainly_too_small(const struct wf_shm_region *r, uint64_t size)
{
	struct statvfs vfs;

	if (statvfs(r->dir, &vfs) != 0 || vfs.f_blocks == 0)
		return false;
	return (uint64_t)vfs.f_bavail * vfs.f_frsize < size;
}

/* Where each tensor's bytes go, for the fill's streaming checksums. */
static struct wf_shm_fill_tensor *fill_tensors(const struct wf_shm_tensor_entry *te, uint32_t n)
{
	struct wf_shm_fill_tensor *t = calloc(n ? n : 1, sizeof(*t));

	if (!t)
		return NULL;
	for (uint32_t i = 0; i < n; i++)
		t[i] = (struct wf_shm_fill_tensor){
		    .floor_offset = te[i].floor_offset, .nbytes = te[i].nbytes, .file = te[i].file};
	return t;
}

/* Gives the new region file its mode and group, reserves it and maps it (r->base, r->size). */
static int prepare_file(struct wf_shm_region *r, const struct wf_shm_config *cfg,
                        const struct wf_shm_layout *lay, uint64_t size, bool stream,
                        struct wf_diag *diag)
{
	int fd = r->fd, rc;
	if (fchmod(fd, wf__shm_region_mode(cfg)) != 0 || wf__shm_apply_group(fd, cfg) < 0)
		return wf_diag_set(diag, -errno, "set mode/group of %s: %s", r->path,
		                   strerror(errno));
	/* Reserve every page before the region can become READY: a full tmpfs fails here with
	 * ENOSPC instead of killing us, or a worker, with SIGBUS on first touch. STREAM checks the
	 * free space, reserves the tables now (they are written through the mapping below), and
	 * leaves the data area to wf_shm_fill_write() and reserve_rest(). */
	if (stream && plainly_too_small(r, size))
		return space_error(r, lay, size, -ENOSPC, diag);
	rc = stream ? ftruncate(fd, (off_t)size) == 0 ? 0 : -errno : 0;
	if (rc == 0)
		rc = reserve(fd, 0, stream ? lay->data_offset : size);
	if (rc == 0 && stream)
		rc = reserve_init(r, lay->data_offset, size);
	if (rc < 0)
		return space_error(r, lay, size, rc, diag);
	/* The data is written with pwrite (wf_shm_fill_write()) or through this mapping; a pwrite
	 * fill leaves it without page table entries for the data, so it costs nothing. */
	void *base = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (base == MAP_FAILED)
		return wf_diag_set(diag, -errno, "map %s: %s", r->path, strerror(errno));
	r->base = base;
	r->size = size;
	return 0;
}

/* The header is written whole with magic 0, then the magic last with release: a process killed
 * before that leaves a zero magic, which every reader takes for EMPTY (not READY) rather than
 * for a damaged region. State MATERIALIZING. Returns the live header. */
static struct wf_shm_header *write_header(struct wf_shm_region *r, const struct wf_shm_layout *lay,
                                          uint64_t size, uint64_t page, bool huge)
{
	struct wf_shm_header hl;
	memset(&hl, 0, sizeof(hl));
	hl.version = WF_SHM_VERSION;
	hl.header_size = WF_SHM_HEADER_SIZE;
	hl.digest_hi = r->digest.hi;
	hl.digest_lo = r->digest.lo;
	hl.state = WF_SHM_STATE_MATERIALIZING;
	hl.flags = huge ? WF_SHM_HDR_HUGETLB : 0;
	hl.generation = 0;
	hl.n_files = lay->n_files;
	hl.n_tensors = lay->n_tensors;
	hl.file_entry_size = sizeof(struct wf_shm_file_entry);
	hl.tensor_entry_size = sizeof(struct wf_shm_tensor_entry);
	hl.file_table_offset = lay->file_table_offset;
	hl.file_table_size = lay->file_table_size;
	hl.tensor_table_offset = lay->tensor_table_offset;
	hl.tensor_table_size = lay->tensor_table_size;
	hl.name_index_offset = lay->name_index_offset;
	hl.name_index_size = lay->name_index_size;
	hl.meta_offset = lay->meta_offset;
	hl.meta_size = lay->meta_size;
	hl.strings_offset = lay->strings_offset;
	hl.strings_size = lay->strings_size;
	hl.data_offset = lay->data_offset;
	hl.data_size = lay->data_size;
	/* Rounding to a huge page leaves slack at the end: it is spare area for free. */
	hl.spare_offset = lay->spare_offset;
	hl.spare_size = size - lay->spare_offset;
	hl.spare_used = 0;
	hl.total_size = size;
	hl.page_size = page;
	hl.created_ns = now_ns();
	hl.materializer_pid = (int32_t)getpid();
	struct wf_shm_header *h = r->base;
	memcpy(h, &hl, sizeof(hl));
	__atomic_store_n(&h->magic, WF_SHM_MAGIC, __ATOMIC_RELEASE);
	r->hdr = *h;
	set_index(r);
	return h;
}

/* What the fill is told of each file, from the file table just written. NULL: out of memory. */
static struct wf_shm_fill_file *fill_files(const struct wf_model *model,
                                           const struct wf_shm_layout *lay, uint8_t *base)
{
	struct wf_shm_fill_file *files = calloc(lay->n_files, sizeof(*files));
	if (!files)
		return NULL;
	const struct wf_shm_file_entry *fe = (const void *)(base + lay->file_table_offset);
	for (uint32_t i = 0; i < lay->n_files; i++) {
		files[i].path = model->files[i].path;
		files[i].file_size = fe[i].size;
		files[i].mtime_ns = fe[i].mtime_ns;
		files[i].src_offset = fe[i].window_offset;
		files[i].copy_length = fe[i].copy_length;
		files[i].floor_offset = fe[i].floor_offset;
		files[i].section_length = fe[i].window_length;
		files[i].dst = base + fe[i].floor_offset;
		files[i].dev = model->files[i].dev;
		files[i].ino = model->files[i].ino;
	}
	return files;
}

/* The filled region made READY: tensor checksums, the tables' and the header's, READY last with
 * release, and the mapping read-only. */
static int seal(struct wf_shm_region *r, const struct wf_shm_layout *lay, struct wf_shm_header *h,
                const uint64_t *sums, bool sums_set, struct wf_diag *diag)
{
	uint8_t *base = r->base;
	struct wf_shm_tensor_entry *te = (void *)(base + lay->tensor_table_offset);
	/* tmpfs and hugetlbfs have no backing store: the page cache is the floor, and the fd and
	 * every mapping see the same pages, so there is nothing for msync to write. Checksums
	 * hashed by the fill while the bytes streamed past spare a second pass over the region
	 * (on tmpfs through fresh page table entries, which cost more than the hashing). */
	for (uint32_t i = 0; i < lay->n_tensors; i++)
		te[i].checksum =
		    sums_set ? sums[i]
		             : wf_shm_checksum(base + te[i].floor_offset, (size_t)te[i].nbytes);
	h->tables_checksum = wf_shm_checksum(base + lay->file_table_offset,
	                                     lay->data_offset - lay->file_table_offset);
	h->ready_ns = now_ns();
	h->header_checksum = wf_shm_header_checksum(h);
	/* READY last, with release: whoever sees it sees every byte above. */
	__atomic_store_n(&h->state, WF_SHM_STATE_READY, __ATOMIC_RELEASE);
	r->hdr = *h;
	/* The agent keeps a read-only view like everyone else: a stray write faults here instead of
	 * corrupting every worker's weights. A publish maps a writable view of its own for the
	 * length of the call (shm/publish.c). Only the pages written through the mapping have
	 * entries to change. */
	if (mprotect(base, (size_t)r->size, PROT_READ) != 0)
		return wf_diag_set(diag, -errno, "mprotect %s: %s", r->path, strerror(errno));
	return 0;
}

/* Creates the region file from scratch (the caller holds the guard and has unlinked any old one),
 * fills it and makes it READY. On failure the file is gone. */
static int materialize(struct wf_shm_region *r, const struct wf_shm_config *cfg,
                       const struct wf_model *model, const struct wf_shm_layout *lay, uint64_t page,
                       bool huge, bool stream, wf_shm_fill_fn fill, void *fill_ctx,
                       struct wf_diag *diag)
{
	struct wf_shm_fill_file *files = NULL;
	struct wf_shm_fill_tensor *tensors = NULL;
	uint64_t *sums = NULL;
	bool sums_set = false;
	int fd, rc;

	uint64_t size = (lay->total_size + page - 1) & ~(page - 1);
	if (size < lay->total_size || size > (uint64_t)INT64_MAX)
		return wf_diag_set(diag, WF_EOVERFLOW, "region %s: size %" PRIu64 " overflows",
		                   short_name(r), lay->total_size);
	/* The fill of a hugetlbfs region writes through the mapping: reserve everything first. */
	stream = stream && !huge;
	fd = open(r->path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW,
	          wf__shm_region_mode(cfg));
	if (fd < 0)
		return wf_diag_set(diag, -errno, "create %s: %s", r->path, strerror(errno));
	r->fd = fd;
	if ((rc = prepare_file(r, cfg, lay, size, stream, diag)) < 0)
		goto fail;
	if ((rc = wf_shm_layout_write(model, lay, r->base, size, diag)) < 0)
		goto fail;
	struct wf_shm_header *h = write_header(r, lay, size, page, huge);

	files = fill_files(model, lay, r->base);
	tensors = fill_tensors((const void *)((uint8_t *)r->base + lay->tensor_table_offset),
	                       lay->n_tensors);
	sums = calloc(lay->n_tensors ? lay->n_tensors : 1, sizeof(*sums));
	if (!files || !tensors || !sums) {
		rc = -ENOMEM;
		goto fail;
	}
	struct wf_shm_fill job = {
	    .region = r,
	    .model = model,
	    .region_fd = fd,
	    .base = r->base,
	    .region_size = size,
	    .page_size = page,
	    .hugetlbfs = huge,
	    .n_files = lay->n_files,
	    .files = files,
	    .n_tensors = lay->n_tensors,
	    .tensors = tensors,
	    .checksums = sums,
	    .checksums_set = &sums_set,
	};
	r->materialized = true;
	rc = fill(fill_ctx, &job, diag);
	/* The region is reserved completely before it can be READY. A failed reservation is the
	 * error to report, whatever the fill made of it. */
	int rs = rc == 0 ? reserve_rest(r) : r->reserve ? r->reserve->err : 0;
	if (rs < 0) {
		__atomic_store_n(&h->state, WF_SHM_STATE_FAILED, __ATOMIC_RELEASE);
		wf_diag_clear(diag); /* the fill only saw its echo in wf_shm_fill_write() */
		rc = space_error(r, lay, size, rs, diag);
		goto fail;
	}
	if (rc != 0) {
		if (rc > 0)
			rc = WF_EINTERNAL;
		__atomic_store_n(&h->state, WF_SHM_STATE_FAILED, __ATOMIC_RELEASE);
		wf_diag_set(diag, rc, "filling region %s failed: %s", short_name(r),
		            wf_strerror(rc));
		goto fail;
	}
	reserve_fini(r);
	if ((rc = seal(r, lay, h, sums, sums_set, diag)) < 0)
		goto fail;
	free(files);
	free(tensors);
	free(sums);
	return 0;

fail:
	reserve_fini(r);
	free(files);
	free(tensors);
	free(sums);
	unmap(r);
	close(r->fd);
	r->fd = -1;
	unlink(r->path);
	return rc;
}

/* After a failed attach, under the guard: lock files without a region and without holders would
 * be orphans; remove them. */
static void drop_orphans(struct wf_shm_region *r)
{
	struct stat st;
	int hfd = r->holders_fd;
	bool own = false;

	if (stat(r->path, &st) == 0 || errno != ENOENT)
		return;
	if (hfd < 0) {
		if (wf__shm_lockfile_open(r->holders_path, false, NULL, &hfd) < 0)
			hfd = -1;
		own = hfd >= 0;
	}
	if (hfd >= 0 && wf__shm_flock(hfd, LOCK_EX | LOCK_NB) < 0)
		goto out;
	unlink(r->holders_path);
	unlink(r->guard_path);
out:
	if (own)
		close(hfd);
}

int wf_shm_region_attach(const struct wf_shm_config *cfg, const struct wf_digest *digest,
                         const struct wf_model *model, unsigned flags, wf_shm_fill_fn fill,
                         void *fill_ctx, struct wf_shm_region **ret_region, struct wf_diag *diag)
{
	const bool may_create = flags & WF_SHM_ATTACH_CREATE;
	const bool may_rebuild = flags & WF_SHM_ATTACH_REBUILD;
	const bool writer = may_create || may_rebuild;
	/* WRITE opens for publishing but, unlike the writer modes, creates and removes nothing. */
	const bool rdwr = writer || (flags & WF_SHM_ATTACH_WRITE);
	const bool owned = flags & (WF_SHM_ATTACH_OWNED | WF_SHM_ATTACH_VERIFY);
	struct wf_shm_layout layout;
	struct wf_shm_region *r = NULL;
	struct wf_diag why;
	uint64_t page = WF_SHM_PAGE;
	bool huge = false, build = false;
	int gfd = -1, rc;

	if (!digest || !ret_region || (flags & ~ATTACH_FLAGS))
		return wf_diag_set(diag, WF_EINVAL, "attach: bad arguments");
	if (writer && (!model || !fill))
		return wf_diag_set(diag, WF_EINVAL,
		                   "attach: creating or rebuilding a region needs a model and a "
		                   "fill callback");
	if (model) {
		rc = wf_shm_layout_compute(model, cfg ? cfg->spare_bytes : 0, &layout, diag);
		if (rc < 0)
			return rc;
	}
	r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	r->fd = r->holders_fd = -1;
	r->writable = rdwr;
	r->digest = *digest;
	r->dir = strdup(wf__shm_dir(cfg));
	if (!r->dir || wf__shm_paths(cfg, digest, &r->path, &r->guard_path, &r->holders_path) < 0 ||
	    asprintf(&r->keep_path, "%s.keep", r->path) < 0) {
		r->keep_path = NULL;
		rc = -ENOMEM;
		goto fail;
	}
	if (may_create) {
		rc = wf__shm_make_dir(cfg, r->dir, diag);
		if (rc < 0)
			goto fail;
	}
	rc = dir_page(r->dir, &page, &huge, diag);
	if (rc < 0)
		goto fail;

	rc =
	    wf__shm_lock_path(r->guard_path, LOCK_EX | (flags & WF_SHM_ATTACH_NOWAIT ? LOCK_NB : 0),
	                      may_create, cfg, &gfd);
	if (rc == -ENOENT) {
		rc = wf_diag_set(diag, rc, "no floor region %s in %s", short_name(r), r->dir);
		goto fail;
	} else if (rc == -EAGAIN) {
		rc = wf_diag_set(diag, rc, "region %s is busy (being attached or materialized)",
		                 short_name(r));
		goto fail;
	} else if (rc < 0) {
		rc = wf_diag_set(diag, rc, "lock %s: %s", r->guard_path, strerror(-rc));
		goto fail;
	}

	if (owned) {
		rc = check_owned(gfd, r->guard_path, true, diag);
		if (rc < 0)
			goto fail;
	}

	/* Under the guard: nobody else creates, fills, rebuilds or unlinks this region now. */
	r->fd = open(r->path, (rdwr ? O_RDWR : O_RDONLY) | O_CLOEXEC | O_NOFOLLOW);
	if (r->fd < 0) {
		if (errno != ENOENT) {
			rc = wf_diag_set(diag, -errno, "open %s: %s", r->path, strerror(errno));
			goto fail;
		}
		if (!may_create) {
			rc = wf_diag_set(diag, -ENOENT, "no floor region %s in %s", short_name(r),
			                 r->dir);
			goto fail;
		}
		build = true;
	} else {
		wf_diag_clear(&why);
		/* OWNED before anything is read from it: a region planted by someone else is
		 * replaced (or refused), never adopted; VERIFY also re-hashes every tensor, so
		 * bytes altered behind a valid header and tables are caught. */
		rc = owned ? check_owned(r->fd, r->path, false, &why) : 0;
		if (rc == 0)
			rc = map_existing(r, model, model ? &layout : NULL, &why);
		if (rc == 0 && (flags & WF_SHM_ATTACH_VERIFY)) {
			rc = wf_shm_region_verify(r, &why);
			if (rc < 0)
				unmap(r);
		}
		if (rc < 0 && !may_rebuild) {
			rc = wf_diag_set(diag, rc, "region %s in %s: %s", short_name(r), r->dir,
			                 wf_diag_str(&why, rc));
			goto fail;
		}
		if (rc < 0) {
			/* Replace, never truncate: a process still mapping the old inode keeps
			 * valid pages instead of taking SIGBUS. */
			r->rebuild_reason = strdup(wf_diag_str(&why, rc));
			close(r->fd);
			r->fd = -1;
			if (unlink(r->path) != 0 && errno != ENOENT) {
				rc = wf_diag_set(diag, -errno, "remove broken %s: %s", r->path,
				                 strerror(errno));
				goto fail;
			}
			build = true;
		}
	}

	/* Files are created in the order guard, holders, region, so that a region never exists
	 * without its holders file. */
	rc = wf__shm_lockfile_open(r->holders_path, writer, cfg, &r->holders_fd);
	if (rc < 0) {
		if (rc == -ENOENT)
			rc = wf_diag_set(diag, WF_ENOT_READY, "region %s has no holders lock file",
			                 short_name(r));
		else
			rc = wf_diag_set(diag, rc, "open %s: %s", r->holders_path, strerror(-rc));
		goto fail;
	}
	if (owned) {
		rc = check_owned(r->holders_fd, r->holders_path, true, diag);
		if (rc < 0)
			goto fail;
	}
	if (build) {
		rc = materialize(r, cfg, model, &layout, page, huge, flags & WF_SHM_ATTACH_STREAM,
		                 fill, fill_ctx, diag);
		if (rc < 0)
			goto fail;
	}
	rc = wf__shm_flock(r->holders_fd, LOCK_SH);
	if (rc == 0 && wf__shm_same_file(r->holders_fd, r->holders_path) != 1)
		rc = -ESTALE; /* only a process outside the protocol replaces it under the guard */
	if (rc < 0) {
		rc = wf_diag_set(diag, rc, "lock %s: %s", r->holders_path, strerror(-rc));
		goto fail;
	}
	close(gfd);
	*ret_region = r;
	return 0;

fail:
	if (gfd >= 0) {
		unmap(r);
		if (writer)
			drop_orphans(r);
		close(gfd);
	}
	region_free(r);
	return rc;
}

void wf_shm_region_detach(struct wf_shm_region *r)
{
	int gfd;

	if (!r)
		return;
	unmap(r);
	if (r->fd >= 0)
		close(r->fd);
	r->fd = -1;
	if (r->holders_fd >= 0 &&
	    wf__shm_lock_path(r->guard_path, LOCK_EX, false, NULL, &gfd) == 0) {
		wf__shm_flock(r->holders_fd, LOCK_UN);
		/* Nobody can take SH while we hold the guard: success means no holder is left. The
		 * agent's keep marker (wf_shm_region_set_keep()) says it means to keep the floor
		 * even when nobody holds it (it stopped, or gave up its hold to re-take it). */
		if (wf__shm_flock(r->holders_fd, LOCK_EX | LOCK_NB) == 0 &&
		    !(r->keep_path && wf__shm_keep_exists(r->keep_path))) {
			/* A holder without write access to the directory fails here and leaves the
			 * files for the agent, which sees a READY region nobody holds. */
			unlink(r->path);
			unlink(r->holders_path);
			unlink(r->guard_path);
		}
		close(r->holders_fd);
		r->holders_fd = -1;
		close(gfd);
	}
	/* Without a guard file (removed by someone outside the protocol) closing the holders fd is
	 * all we can do: region_free() does it. */
	region_free(r);
}

void wf_shm_region_abandon(struct wf_shm_region *r)
{
	if (!r)
		return;
	/* Closing the holders fd drops our SH lock as process exit would; without the guard and the
	 * last-holder check nothing is unlinked, so a READY region stays for the next attacher. */
	unmap(r);
	region_free(r);
}

int wf_shm_region_tensor(const struct wf_shm_region *r, uint32_t index,
                         struct wf_shm_tensor_info *ret_info)
{
	const struct wf_shm_header *live;
	const struct wf_shm_tensor_entry *e;
	struct wf_shm_tensor_info ti = {0};
	uint64_t g1, g2;

	if (!r || !r->base || !ret_info)
		return WF_EINVAL;
	if (index >= r->hdr.n_tensors)
		return WF_ENOT_FOUND;
	live = r->base;
	e = (const void *)((const uint8_t *)r->base + r->hdr.tensor_table_offset +
	                   (uint64_t)index * sizeof(*e));
	/* Seqlock read (shm/layout.h): the fields a publish changes are read between two equal,
	 * even generations. */
	for (uint32_t spins = 0;; spins++) {
		g1 = __atomic_load_n(&live->generation, __ATOMIC_ACQUIRE);
		if (!(g1 & 1)) {
			ti.floor_offset = __atomic_load_n(&e->floor_offset, __ATOMIC_RELAXED);
			ti.checksum = __atomic_load_n(&e->checksum, __ATOMIC_RELAXED);
			ti.generation = __atomic_load_n(&e->generation, __ATOMIC_RELAXED);
			__atomic_thread_fence(__ATOMIC_ACQUIRE);
			g2 = __atomic_load_n(&live->generation, __ATOMIC_RELAXED);
			if (g1 == g2)
				break;
		}
		if (spins >= SEQLOCK_MAX_SPINS)
			return WF_ESTATE;
		if (spins >= 64)
			sched_yield();
	}
	/* The rest never changes after READY, but it is shared memory: re-check what we index. */
	ti.index = index;
	ti.name_len = e->name_len;
	ti.nbytes = e->nbytes;
	if (e->name_offset >= r->hdr.strings_size ||
	    r->hdr.strings_size - e->name_offset <= ti.name_len ||
	    wf__shm_tensor_bounds(&r->hdr, ti.floor_offset, ti.nbytes) < 0)
		return WF_EFORMAT;
	ti.name = (const char *)r->base + r->hdr.strings_offset + e->name_offset;
	ti.dtype = e->dtype;
	ti.n_dims = e->n_dims;
	ti.tclass = e->tclass;
	for (int d = 0; d < WF_MODEL_MAX_DIMS; d++)
		ti.ne[d] = e->ne[d];
	ti.file = e->file;
	ti.source_offset = e->source_offset;
	ti.data = (const uint8_t *)r->base + ti.floor_offset;
	*ret_info = ti;
	return 0;
}

int wf_shm_region_find(const struct wf_shm_region *r, const char *name,
                       struct wf_shm_tensor_info *ret_info)
{
	if (!r || !r->base || !name || !ret_info || !r->name_index)
		return WF_EINVAL;
	const struct wf_shm_tensor_entry *t =
	    (const void *)((const uint8_t *)r->base + r->hdr.tensor_table_offset);
	const char *pool = (const char *)r->base + r->hdr.strings_offset;
	size_t len = strlen(name);
	uint32_t lo = 0, hi = r->hdr.n_tensors;

	/* The index and the entries were validated at attach, but they are shared memory: every
	 * value is loaded once and bounds-checked before it is used. */
	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;
		uint32_t ti = __atomic_load_n(&r->name_index[mid], __ATOMIC_RELAXED);
		if (ti >= r->hdr.n_tensors)
			return WF_EFORMAT;
		uint64_t off = __atomic_load_n(&t[ti].name_offset, __ATOMIC_RELAXED);
		uint32_t nl = __atomic_load_n(&t[ti].name_len, __ATOMIC_RELAXED);
		if (off >= r->hdr.strings_size || r->hdr.strings_size - off < nl)
			return WF_EFORMAT;
		size_t n = nl < len ? nl : len;
		int c = memcmp(pool + off, name, n);
		if (c == 0)
			c = (nl > len) - (nl < len);
		if (c == 0)
			return wf_shm_region_tensor(r, ti, ret_info);
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return WF_ENOT_FOUND;
}

int wf_shm_region_verify(const struct wf_shm_region *r, struct wf_diag *diag)
{
	if (!r || !r->base)
		return wf_diag_set(diag, WF_EINVAL, "verify: no region");
	for (uint32_t i = 0; i < r->hdr.n_tensors; i++) {
		struct wf_shm_tensor_info ti;
		int rc = wf_shm_region_tensor(r, i, &ti);
		if (rc < 0)
			return wf_diag_set(diag, rc, "region %s: tensor %" PRIu32 ": %s",
			                   short_name(r), i, wf_strerror(rc));
		uint64_t sum = wf_shm_checksum(ti.data, (size_t)ti.nbytes);
		if (sum != ti.checksum)
			return wf_diag_set(diag, WF_ECHECKSUM,
			                   "region %s: tensor '%s' (index %" PRIu32 ", %" PRIu64
			                   " bytes at floor offset %" PRIu64
			                   "): checksum 0x%016" PRIx64
			                   ", the table says 0x%016" PRIx64,
			                   short_name(r), ti.name, i, ti.nbytes, ti.floor_offset,
			                   sum, ti.checksum);
	}
	return 0;
}

uint32_t wf_shm_region_n_tensors(const struct wf_shm_region *r)
{
	return r->hdr.n_tensors;
}

void wf_shm_region_header(const struct wf_shm_region *r, struct wf_shm_header *ret_header)
{
	*ret_header = r->hdr;
}

uint32_t wf_shm_region_state(const struct wf_shm_region *r)
{
	return __atomic_load_n(&((const struct wf_shm_header *)r->base)->state, __ATOMIC_ACQUIRE);
}

uint64_t wf_shm_region_generation(const struct wf_shm_region *r)
{
	return __atomic_load_n(&((const struct wf_shm_header *)r->base)->generation,
	                       __ATOMIC_ACQUIRE);
}

const void *wf_shm_region_data(const struct wf_shm_region *r)
{
	return r->base;
}

uint64_t wf_shm_region_size(const struct wf_shm_region *r)
{
	return r->size;
}

int wf_shm_region_fd(const struct wf_shm_region *r)
{
	return r->fd;
}

const char *wf_shm_region_path(const struct wf_shm_region *r)
{
	return r->path;
}

void wf_shm_region_digest(const struct wf_shm_region *r, struct wf_digest *ret_digest)
{
	*ret_digest = r->digest;
}

bool wf_shm_region_materialized(const struct wf_shm_region *r)
{
	return r->materialized;
}

const char *wf_shm_region_rebuild_reason(const struct wf_shm_region *r)
{
	return r->rebuild_reason;
}

/* A string of the pool, copied: bounds re-checked (shared memory), and the copy's length must be
 * the stored one (a NUL inside would make the name another). */
static int pool_dup(const struct wf_shm_region *r, uint64_t off, uint32_t len, char **ret)
{
	const struct wf_shm_header *h = &r->hdr;
	if (off >= h->strings_size || h->strings_size - off <= len)
		return WF_EFORMAT;
	char *s = strndup((const char *)r->base + h->strings_offset + off, len);
	if (!s)
		return -ENOMEM;
	if (strlen(s) != len) {
		free(s);
		return WF_EFORMAT;
	}
	*ret = s;
	return 0;
}

int wf_shm_region_model(const struct wf_shm_region *r, struct wf_model **ret_model,
                        struct wf_diag *diag)
{
	struct wf_model *m = NULL;
	uint8_t *meta = NULL;
	int rc;

	wf_diag_clear(diag);
	if (!r || !r->base || !ret_model)
		return wf_diag_set(diag, WF_EINVAL, "region model: bad arguments");
	const struct wf_shm_header *h = &r->hdr; /* validated at attach */
	const uint8_t *b = r->base;
	if (!(m = calloc(1, sizeof(*m))) || !(m->files = calloc(h->n_files, sizeof(*m->files))) ||
	    (h->n_tensors && !(m->tensors = calloc(h->n_tensors, sizeof(*m->tensors))))) {
		rc = -ENOMEM;
		goto fail;
	}
	m->n_files = h->n_files;
	m->n_tensors = h->n_tensors; /* names are NULL until filled: wf_model_close() copes */
	for (uint32_t i = 0; i < h->n_files; i++) {
		struct wf_shm_file_entry e;
		struct wf_model_file *f = &m->files[i];
		memcpy(&e, b + h->file_table_offset + (uint64_t)i * sizeof(e), sizeof(e));
		rc = pool_dup(r, e.path_offset, e.path_len, &f->path);
		if (rc < 0) {
			rc = rc == -ENOMEM
			         ? rc
			         : wf_diag_set(diag, rc, "region file %" PRIu32 ": bad path string",
			                       i);
			goto fail;
		}
		f->size = e.size;
		f->mtime_ns = e.mtime_ns;
		f->data_offset = e.data_offset;
		f->data_size = e.data_size;
	}
	for (uint32_t i = 0; i < h->n_tensors; i++) {
		struct wf_shm_tensor_info ti;
		struct wf_tensor *t = &m->tensors[i];
		rc = wf_shm_region_tensor(r, i, &ti);
		if (rc == 0)
			rc = pool_dup(r, (uint64_t)(ti.name - (const char *)b - h->strings_offset),
			              ti.name_len, &t->name);
		if (rc < 0) {
			rc = rc == -ENOMEM ? rc
			                   : wf_diag_set(diag, rc, "region tensor %" PRIu32 ": %s",
			                                 i, wf_strerror(rc));
			goto fail;
		}
		t->dtype = (enum wf_dtype)ti.dtype;
		t->n_dims = ti.n_dims;
		memcpy(t->ne, ti.ne, sizeof(t->ne));
		t->nbytes = ti.nbytes;
		t->file = ti.file;
		t->offset = ti.source_offset; /* as in the file: the digest covers it */
	}
	/* One private snapshot of the section, so that what is checked is what is kept. */
	if (!(meta = malloc(h->meta_size ? (size_t)h->meta_size : 1))) {
		rc = -ENOMEM;
		goto fail;
	}
	memcpy(meta, b + h->meta_offset, (size_t)h->meta_size);
	rc = wf_model_meta_decode(meta, (size_t)h->meta_size, m, diag);
	if (rc < 0)
		goto fail;
	rc = wf_model_assemble(m, diag);
	if (rc < 0)
		goto fail;
	for (uint32_t i = 0; i < h->n_files; i++) {
		struct wf_shm_file_entry e;
		memcpy(&e, b + h->file_table_offset + (uint64_t)i * sizeof(e), sizeof(e));
		if (e.data_size != m->files[i].data_size || e.n_tensors != m->files[i].n_tensors) {
			rc = wf_diag_set(diag, WF_EFORMAT,
			                 "region file %" PRIu32 ": %" PRIu64 " data bytes, %" PRIu32
			                 " tensors; its tensors give %" PRIu64 ", %" PRIu32,
			                 i, e.data_size, e.n_tensors, m->files[i].data_size,
			                 m->files[i].n_tensors);
			goto fail;
		}
	}
	/* The tables rebuild the model the region is named after, or they are not its tables. */
	struct wf_digest d;
	wf_model_digest(m, &d);
	if (d.hi != r->digest.hi || d.lo != r->digest.lo) {
		rc = wf_diag_set(diag, WF_EFORMAT,
		                 "region %s: its tables give another model digest", r->path);
		goto fail;
	}
	free(meta);
	*ret_model = m;
	return 0;
fail:
	free(meta);
	wf_model_close(m);
	return rc;
}
