/* The floor directory as a whole: listing regions for the agent's restart and removing the ones
 * nobody holds. Both follow the lock protocol of shm/region.h but never wait on a guard. */
#include "base/error.h"
#include "shm/shm_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

enum { KIND_REGION = 0, KIND_GUARD = 1, KIND_HOLDERS = 2, KIND_KEEP = 3 };

struct found {
	struct wf_digest digest;
	int kind;
};

static int found_cmp(const void *a, const void *b)
{
	const struct found *x = a, *y = b;
	if (x->digest.hi != y->digest.hi)
		return x->digest.hi < y->digest.hi ? -1 : 1;
	if (x->digest.lo != y->digest.lo)
		return x->digest.lo < y->digest.lo ? -1 : 1;
	return x->kind - y->kind;
}

/* "wf-<32 hex>", "wf-<32 hex>.guard", "wf-<32 hex>.holders"; anything else is not ours. */
static bool parse_name(const char *name, struct found *ret)
{
	if (strncmp(name, "wf-", 3) != 0 || strlen(name) < WF_SHM_NAME_LEN)
		return false;
	if (wf__shm_parse_hex(name + 3, &ret->digest) < 0)
		return false;
	const char *sfx = name + WF_SHM_NAME_LEN;
	if (strcmp(sfx, "") == 0)
		ret->kind = KIND_REGION;
	else if (strcmp(sfx, ".guard") == 0)
		ret->kind = KIND_GUARD;
	else if (strcmp(sfx, ".holders") == 0)
		ret->kind = KIND_HOLDERS;
	else if (strcmp(sfx, ".keep") == 0)
		ret->kind = KIND_KEEP;
	else
		return false;
	return true;
}

static bool exists(const char *path)
{
	struct stat st;
	return lstat(path, &st) == 0;
}

/* Maps and validates a region file read-only. 0 (READY, valid), or the validation error. Writes
 * the raw header (as found, valid or not) to *raw when the file holds one. */
static int check_region(const char *path, const struct wf_digest *digest, struct wf_shm_header *raw,
                        uint64_t *ret_size, struct wf_diag *diag)
{
	struct wf_shm_header h;
	struct stat st;
	int fd, rc;

	memset(raw, 0, sizeof(*raw));
	*ret_size = 0;
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return wf_diag_set(diag, -errno, "open %s: %s", path, strerror(errno));
	if (fstat(fd, &st) != 0) {
		rc = wf_diag_set(diag, -errno, "stat %s: %s", path, strerror(errno));
		goto out;
	}
	*ret_size = (uint64_t)st.st_size;
	if (!S_ISREG(st.st_mode)) {
		rc = wf_diag_set(diag, WF_EFORMAT, "not a regular file");
		goto out;
	}
	if ((uint64_t)st.st_size < WF_SHM_HEADER_SIZE) { /* nothing to map: validate says why */
		rc = wf__shm_validate(NULL, (uint64_t)st.st_size, digest, &h, diag);
		goto out;
	}
	void *base = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
	if (base == MAP_FAILED) {
		rc = wf_diag_set(diag, -errno, "map: %s", strerror(errno));
		goto out;
	}
	memcpy(raw, base, sizeof(*raw));
	rc = wf__shm_validate(base, (uint64_t)st.st_size, digest, &h, diag);
	munmap(base, (size_t)st.st_size);
out:
	close(fd);
	return rc;
}

/* A file of the entry that this process may not trust (wf__shm_check_file): 0, or
 * WF_EPERMISSION with e->why naming it. Absent files are fine. */
static int check_trust(struct wf_shm_scan_entry *e, const char *path, bool lock_file)
{
	struct stat st;
	char why[96];
	const char *name = strrchr(path, '/');

	if (lstat(path, &st) != 0 || wf__shm_check_file(&st, lock_file, why, sizeof(why)) == 0)
		return 0;
	snprintf(e->why, sizeof(e->why), "%s is %s", name ? name + 1 : path, why);
	return WF_EPERMISSION;
}

/* Is anyone attached? Only meaningful under the guard (nobody takes or drops SH meanwhile). */
static bool held(const char *holders)
{
	int fd;
	if (wf__shm_lockfile_open(holders, false, NULL, &fd) < 0)
		return false;
	bool busy = wf__shm_flock(fd, LOCK_EX | LOCK_NB) == -EAGAIN;
	close(fd);
	return busy;
}

/* A floor's four files: the region, its guard and holders lock files, its keep marker. */
struct floor_paths {
	char *region, *guard, *holders, *keep;
};

static void floor_paths_free(struct floor_paths *p)
{
	free(p->region);
	free(p->guard);
	free(p->holders);
	free(p->keep);
}

/* 0 and *ret (floor_paths_free() it), or -ENOMEM with nothing to free. */
static int floor_paths_get(const struct wf_shm_config *cfg, const struct wf_digest *digest,
                           struct floor_paths *ret)
{
	struct floor_paths p = {0};
	int rc = wf__shm_paths(cfg, digest, &p.region, &p.guard, &p.holders);
	if (rc < 0)
		return rc;
	if (asprintf(&p.keep, "%s.keep", p.region) < 0) {
		p.keep = NULL;
		floor_paths_free(&p);
		return -ENOMEM;
	}
	*ret = p;
	return 0;
}

/* Classifies one digest; false if every file of it vanished meanwhile. */
static bool classify(const struct wf_shm_config *cfg, struct wf_shm_scan_entry *e)
{
	struct floor_paths p;
	struct wf_shm_header raw;
	struct wf_diag why;
	int gfd = -1, rc;
	bool keep = true;

	if (floor_paths_get(cfg, &e->digest, &p) < 0) {
		e->cls = WF_SHM_SCAN_BROKEN;
		e->error = -ENOMEM;
		snprintf(e->why, sizeof(e->why), "out of memory");
		return true;
	}
	const char *region = p.region, *guard = p.guard, *holders = p.holders, *keepf = p.keep;
	rc = wf__shm_lock_path(guard, LOCK_EX | LOCK_NB, false, NULL, &gfd);
	if (rc == -EAGAIN) {
		e->cls = WF_SHM_SCAN_BUSY;
		goto out;
	}
	/* Without a guard file nobody following the protocol is inside; look without the lock. */
	e->has_guard = rc == 0;
	e->has_region = exists(region);
	e->has_holders = exists(holders);
	e->has_keep = exists(keepf);
	if (!e->has_region) {
		keep = e->has_guard || e->has_holders || e->has_keep;
		e->cls = WF_SHM_SCAN_ORPHAN;
		goto out;
	}
	wf_diag_clear(&why);
	rc = check_region(region, &e->digest, &raw, &e->size, &why);
	if (raw.magic == WF_SHM_MAGIC) {
		e->state = raw.state;
		e->generation = raw.generation;
		e->n_tensors = raw.n_tensors;
		e->ready_ns = raw.ready_ns;
		e->materializer_pid = raw.materializer_pid;
	}
	if (rc < 0)
		snprintf(e->why, sizeof(e->why), "%s", wf_diag_str(&why, rc));
	/* A file planted by another user (or left writable to others) is never adopted. */
	if (rc == 0)
		rc = check_trust(e, region, false);
	if (rc == 0)
		rc = check_trust(e, guard, true);
	if (rc == 0)
		rc = check_trust(e, holders, true);
	if (rc == 0)
		rc = check_trust(e, keepf, false);
	e->cls = rc == 0 ? WF_SHM_SCAN_READY : WF_SHM_SCAN_BROKEN;
	if (rc < 0)
		e->error = rc;
	e->held = e->has_holders && held(holders);
out:
	if (gfd >= 0)
		close(gfd);
	floor_paths_free(&p);
	return keep;
}

int wf_shm_dir_scan(const struct wf_shm_config *cfg, struct wf_shm_scan_entry **ret_entries,
                    size_t *ret_n, struct wf_diag *diag)
{
	const char *dir = wf__shm_dir(cfg);
	struct found *found = NULL;
	struct wf_shm_scan_entry *out = NULL;
	size_t n_found = 0, cap = 0, n = 0;
	struct dirent *de;
	DIR *d;
	int rc = 0;

	if (!ret_entries || !ret_n)
		return WF_EINVAL;
	d = opendir(dir); /* glibc opens it O_CLOEXEC */
	if (!d) {
		if (errno == ENOENT) {
			*ret_entries = NULL;
			*ret_n = 0;
			return 0;
		}
		return wf_diag_set(diag, -errno, "open floor directory %s: %s", dir,
		                   strerror(errno));
	}
	while ((errno = 0, de = readdir(d)) != NULL) {
		struct found f;
		if (!parse_name(de->d_name, &f))
			continue;
		if (n_found == cap) {
			size_t nc = cap ? cap * 2 : 64;
			struct found *nf = realloc(found, nc * sizeof(*nf));
			if (!nf) {
				rc = -ENOMEM;
				goto out;
			}
			found = nf;
			cap = nc;
		}
		found[n_found++] = f;
	}
	if (errno != 0) {
		rc = wf_diag_set(diag, -errno, "read floor directory %s: %s", dir, strerror(errno));
		goto out;
	}
	if (n_found) {
		qsort(found, n_found, sizeof(*found), found_cmp);
		out = calloc(n_found, sizeof(*out));
		if (!out) {
			rc = -ENOMEM;
			goto out;
		}
	}
	for (size_t i = 0; i < n_found;) {
		struct wf_shm_scan_entry *e = &out[n];
		memset(e, 0, sizeof(*e));
		e->digest = found[i].digest;
		for (; i < n_found && found[i].digest.hi == e->digest.hi &&
		       found[i].digest.lo == e->digest.lo;
		     i++) {
			e->has_region |= found[i].kind == KIND_REGION;
			e->has_guard |= found[i].kind == KIND_GUARD;
			e->has_holders |= found[i].kind == KIND_HOLDERS;
		}
		if (classify(cfg, e))
			n++;
	}
	if (n == 0) {
		free(out);
		out = NULL;
	}
	*ret_entries = out;
	*ret_n = n;
	out = NULL;
out:
	closedir(d);
	free(found);
	free(out);
	return rc;
}

/* Unlinks a region's files in the protocol's order (region, marker, holders, guard; keepf may be
 * NULL to keep the marker), stopping at the first failure. Files already gone are fine. */
static int unlink_all(const char *region, const char *keepf, const char *holders, const char *guard,
                      struct wf_diag *diag)
{
	const char *files[] = {region, keepf, holders, guard};
	for (size_t i = 0; i < sizeof files / sizeof files[0]; i++)
		if (files[i] && unlink(files[i]) != 0 && errno != ENOENT)
			return wf_diag_set(diag, -errno, "remove %s: %s", files[i],
			                   strerror(errno));
	return 0;
}

/* Takes the holders lock exclusively without waiting, so that nobody can be attached (a missing
 * file: nobody ever was). 0 and *ret_fd (-1 without a file; the caller closes it), -EBUSY, or
 * -errno, with diag. */
static int holders_exclusive(const char *holders, const char *name, int *ret_fd,
                             struct wf_diag *diag)
{
	int fd = -1;
	int rc = wf__shm_lockfile_open(holders, false, NULL, &fd);
	if (rc == 0 && wf__shm_flock(fd, LOCK_EX | LOCK_NB) < 0) {
		close(fd);
		return wf_diag_set(diag, -EBUSY, "region %s is attached by some process", name);
	}
	if (rc < 0 && rc != -ENOENT)
		return wf_diag_set(diag, rc, "open %s: %s", holders, strerror(-rc));
	*ret_fd = rc == 0 ? fd : -1;
	return 0;
}

int wf_shm_region_remove(const struct wf_shm_config *cfg, const struct wf_digest *digest,
                         unsigned flags, struct wf_diag *diag)
{
	char name[WF_SHM_NAME_LEN + 1];
	struct floor_paths p;
	int gfd = -1, hfd = -1, rc;

	if (!digest || (flags & ~WF_SHM_REMOVE_BROKEN_ONLY))
		return wf_diag_set(diag, WF_EINVAL, "remove: bad arguments");
	if ((rc = floor_paths_get(cfg, digest, &p)) < 0)
		return rc;
	const char *region = p.region, *guard = p.guard, *holders = p.holders, *keepf = p.keep;
	wf__shm_name(digest, name);
	if (!exists(region) && !exists(guard) && !exists(holders) && !exists(keepf)) {
		rc = wf_diag_set(diag, -ENOENT, "no floor region %s in %s", name, wf__shm_dir(cfg));
		goto out;
	}
	/* Creating the guard is fine: a region whose guard went missing still needs one to be
	 * removed safely, and it is unlinked below with the rest. */
	rc = wf__shm_lock_path(guard, LOCK_EX | LOCK_NB, true, cfg, &gfd);
	if (rc < 0) {
		rc = wf_diag_set(diag, rc == -EAGAIN ? -EBUSY : rc,
		                 "region %s is being attached or materialized", name);
		goto out;
	}
	if ((rc = holders_exclusive(holders, name, &hfd, diag)) < 0)
		goto out;
	if ((flags & WF_SHM_REMOVE_BROKEN_ONLY) && exists(region)) {
		struct wf_shm_header raw;
		uint64_t size;
		struct wf_diag why;
		wf_diag_clear(&why);
		if (check_region(region, digest, &raw, &size, &why) == 0) {
			rc = wf_diag_set(diag, WF_ESTATE, "region %s is READY and valid", name);
			goto out;
		}
	}
	rc = unlink_all(region, keepf, holders, guard, diag);
out:
	if (hfd >= 0)
		close(hfd);
	if (gfd >= 0)
		close(gfd);
	floor_paths_free(&p);
	return rc;
}

int wf_shm_region_set_keep(const struct wf_shm_config *cfg, const struct wf_digest *digest,
                           bool keep, struct wf_diag *diag)
{
	char why[96];
	struct floor_paths p;
	struct stat st;
	int gfd = -1, fd, rc;

	if (!digest)
		return wf_diag_set(diag, WF_EINVAL, "set_keep: bad arguments");
	if ((rc = floor_paths_get(cfg, digest, &p)) < 0)
		return rc;
	const char *region = p.region, *guard = p.guard, *holders = p.holders, *keepf = p.keep;
	/* Bounded: a peer may sit on the guard as long as it likes (the lock file is readable by
	 * the floor group); the agent retries from its janitor rather than hang a request. */
	rc = wf__shm_lock_path_timed(guard, LOCK_EX, true, cfg, WF_SHM_KEEP_WAIT_MS, &gfd);
	if (rc < 0) {
		rc = wf_diag_set(diag, rc == -EAGAIN ? -EBUSY : rc, "lock %s: %s", guard,
		                 rc == -EAGAIN ? "held by another process" : strerror(-rc));
		goto out;
	}
	/* Someone else's marker (or one writable by others) is not ours to honour: replace it. */
	if (lstat(keepf, &st) == 0 &&
	    (!keep || wf__shm_check_file(&st, false, why, sizeof(why)) < 0) && unlink(keepf) != 0 &&
	    errno != ENOENT) {
		rc = wf_diag_set(diag, -errno, "remove %s: %s", keepf, strerror(errno));
		goto out;
	}
	if (keep) {
		fd = open(keepf, O_RDONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW,
		          wf__shm_region_mode(cfg));
		if (fd < 0 && errno != EEXIST) {
			rc = wf_diag_set(diag, -errno, "create %s: %s", keepf, strerror(errno));
			goto out;
		}
		if (fd >= 0) {
			rc = fchmod(fd, wf__shm_region_mode(cfg)) == 0
			         ? wf__shm_apply_group(fd, cfg)
			         : -errno;
			close(fd);
			if (rc < 0) {
				unlink(keepf);
				rc = wf_diag_set(diag, rc, "set mode/group of %s: %s", keepf,
				                 strerror(-rc));
				goto out;
			}
		}
	}
	/* A guard we created for a region that does not exist would be an orphan. */
	if (!exists(region) && !exists(holders))
		unlink(guard);
	rc = 0;
out:
	if (gfd >= 0)
		close(gfd);
	floor_paths_free(&p);
	return rc;
}

int wf_shm_region_reap(const struct wf_shm_config *cfg, const struct wf_digest *digest,
                       struct wf_diag *diag)
{
	char name[WF_SHM_NAME_LEN + 1];
	struct floor_paths p;
	int gfd = -1, hfd = -1, rc;

	if (!digest)
		return wf_diag_set(diag, WF_EINVAL, "reap: bad arguments");
	if ((rc = floor_paths_get(cfg, digest, &p)) < 0)
		return rc;
	const char *region = p.region, *guard = p.guard, *holders = p.holders, *keepf = p.keep;
	wf__shm_name(digest, name);
	rc = wf__shm_lock_path(guard, LOCK_EX | LOCK_NB, false, NULL, &gfd);
	if (rc == -EAGAIN) {
		rc = wf_diag_set(diag, -EBUSY, "region %s is being attached or materialized", name);
		goto out;
	}
	if (rc < 0 && rc != -ENOENT) {
		rc = wf_diag_set(diag, rc, "lock %s: %s", guard, strerror(-rc));
		goto out;
	}
	/* No guard file: nobody following the protocol is inside; a region without one is still
	 * ours to look at. */
	if (!exists(region)) {
		rc = wf_diag_set(diag, -ENOENT, "no floor region %s in %s", name, wf__shm_dir(cfg));
		goto out;
	}
	if ((rc = holders_exclusive(holders, name, &hfd, diag)) < 0)
		goto out;
	if (exists(keepf)) {
		rc = wf_diag_set(diag, WF_ESTATE, "region %s has a keep marker", name);
		goto out;
	}
	rc = unlink_all(region, NULL, holders, guard, diag);
out:
	if (hfd >= 0)
		close(hfd);
	if (gfd >= 0)
		close(gfd);
	floor_paths_free(&p);
	return rc;
}

/* An ancestor of the floor directory through which someone else could replace it. 0 or
 * WF_EPERMISSION with diag. */
static int check_ancestor(const char *p, struct wf_diag *diag)
{
	struct stat st;
	uid_t me = geteuid();

	if (lstat(p, &st) != 0)
		return wf_diag_set(diag, -errno, "floor directory ancestor %s: %s", p,
		                   strerror(errno));
	if (S_ISLNK(st.st_mode)) {
		if (st.st_uid != 0 && st.st_uid != me)
			return wf_diag_set(
			    diag, WF_EPERMISSION,
			    "floor directory ancestor %s is a symlink owned by uid %u", p,
			    (unsigned)st.st_uid);
		if (stat(p, &st) != 0)
			return wf_diag_set(diag, -errno, "floor directory ancestor %s: %s", p,
			                   strerror(errno));
	}
	if (st.st_uid != 0 && st.st_uid != me)
		return wf_diag_set(
		    diag, WF_EPERMISSION,
		    "floor directory ancestor %s is owned by uid %u (neither root nor "
		    "us): its owner could replace the floor directory",
		    p, (unsigned)st.st_uid);
	if ((st.st_mode & (S_IWGRP | S_IWOTH)) && !(st.st_mode & S_ISVTX))
		return wf_diag_set(diag, WF_EPERMISSION,
		                   "floor directory ancestor %s has mode %04o: writable by others "
		                   "without the sticky bit, so anyone could replace the floor "
		                   "directory",
		                   p, (unsigned)(st.st_mode & 07777));
	return 0;
}

int wf_shm_dir_check(const struct wf_shm_config *cfg, struct wf_diag *diag)
{
	const char *dir = wf__shm_dir(cfg);
	struct stat st;
	char *p;
	int fd, rc;

	rc = wf__shm_make_dir(cfg, dir, diag);
	if (rc < 0)
		return rc;
	p = strdup(dir);
	if (!p)
		return -ENOMEM;
	for (char *s = p + 1; *s; s++) {
		if (*s != '/')
			continue;
		*s = '\0';
		rc = check_ancestor(p, diag);
		*s = '/';
		if (rc < 0) {
			free(p);
			return rc;
		}
	}
	free(p);
	fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		rc = -errno;
		/* O_NOFOLLOW | O_DIRECTORY on a symlink fails with ELOOP or ENOTDIR. */
		if ((rc == -ELOOP || rc == -ENOTDIR) && lstat(dir, &st) == 0 && S_ISLNK(st.st_mode))
			return wf_diag_set(diag, WF_EPERMISSION,
			                   "floor directory %s is a symlink: refusing it (someone "
			                   "else may have made it); remove it or choose another "
			                   "directory",
			                   dir);
		return wf_diag_set(diag, rc, "floor directory %s: %s", dir, strerror(-rc));
	}
	rc = fstat(fd, &st) == 0 ? 0 : -errno;
	close(fd);
	if (rc < 0)
		return wf_diag_set(diag, rc, "floor directory %s: %s", dir, strerror(-rc));
	if (st.st_uid != geteuid())
		return wf_diag_set(diag, WF_EPERMISSION,
		                   "floor directory %s is owned by uid %u, not by this process's "
		                   "uid %u: someone else may have created it to plant floors; "
		                   "remove it or choose another directory",
		                   dir, (unsigned)st.st_uid, (unsigned)geteuid());
	if (st.st_mode & (S_IWGRP | S_IWOTH))
		return wf_diag_set(diag, WF_EPERMISSION,
		                   "floor directory %s has mode %04o: it must not be writable by "
		                   "the group or others (chmod go-w it)",
		                   dir, (unsigned)(st.st_mode & 07777));
	return 0;
}
