/* The flock side of the floor protocol (shm/region.h): lock files, the unlink race, file names,
 * the sole-holder query and holder pids from /proc/locks. */
#include "base/error.h"
#include "shm/shm_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

/* An unlinked-and-recreated lock file makes us retry; this many retries in a row means something
 * outside the protocol keeps replacing the file. */
#define LOCK_MAX_RETRIES 10000

const char *wf__shm_dir(const struct wf_shm_config *cfg)
{
	return cfg && cfg->dir && cfg->dir[0] ? cfg->dir : WF_SHM_DEFAULT_DIR;
}

mode_t wf__shm_region_mode(const struct wf_shm_config *cfg)
{
	return cfg && cfg->region_mode ? cfg->region_mode & 07777 : 0640;
}

mode_t wf__shm_lock_mode(const struct wf_shm_config *cfg)
{
	return cfg && cfg->lock_mode ? cfg->lock_mode & 07777 : 0660;
}

mode_t wf__shm_dir_mode(const struct wf_shm_config *cfg)
{
	return cfg && cfg->dir_mode ? cfg->dir_mode & 07777 : 0750;
}

_Static_assert(WF_SHM_NAME_LEN + 1 == 3 + WF_DIGEST_HEX_LEN, "wf- and the digest's hex");

void wf__shm_name(const struct wf_digest *d, char out[WF_SHM_NAME_LEN + 1])
{
	memcpy(out, "wf-", 3);
	wf_digest_hex(d, out + 3);
}

int wf__shm_parse_hex(const char *hex, struct wf_digest *ret_digest)
{
	char buf[WF_DIGEST_HEX_LEN];
	/* wf_digest_parse() wants the 32 digits alone; in a file name a suffix may follow. */
	if (strnlen(hex, WF_DIGEST_HEX_LEN - 1) < WF_DIGEST_HEX_LEN - 1)
		return WF_EFORMAT;
	memcpy(buf, hex, WF_DIGEST_HEX_LEN - 1);
	buf[WF_DIGEST_HEX_LEN - 1] = '\0';
	return wf_digest_parse(buf, ret_digest) == 0 ? 0 : WF_EFORMAT;
}

int wf__shm_paths(const struct wf_shm_config *cfg, const struct wf_digest *digest,
                  char **ret_region, char **ret_guard, char **ret_holders)
{
	char name[WF_SHM_NAME_LEN + 1];
	const char *dir = wf__shm_dir(cfg);
	char *r = NULL, *g = NULL, *h = NULL;

	wf__shm_name(digest, name);
	if (asprintf(&r, "%s/%s", dir, name) < 0)
		r = NULL;
	if (asprintf(&g, "%s/%s.guard", dir, name) < 0)
		g = NULL;
	if (asprintf(&h, "%s/%s.holders", dir, name) < 0)
		h = NULL;
	if (!r || !g || !h) {
		free(r);
		free(g);
		free(h);
		return -ENOMEM;
	}
	*ret_region = r;
	*ret_guard = g;
	*ret_holders = h;
	return 0;
}

int wf__shm_flock(int fd, int op)
{
	for (;;) {
		if (flock(fd, op) == 0)
			return 0;
		if (errno == EINTR)
			continue;
		return errno == EWOULDBLOCK ? -EAGAIN : -errno;
	}
}

int wf__shm_flock_timed(int fd, int op, int wait_ms)
{
	if (wait_ms < 0 || (op & LOCK_NB))
		return wf__shm_flock(fd, op);
	/* flock has no timeout: poll, backing off from 1 to 10 ms. */
	struct timespec t0, t;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (long nap_us = 1000;; nap_us = nap_us < 10000 ? nap_us * 2 : 10000) {
		int rc = wf__shm_flock(fd, op | LOCK_NB);
		if (rc != -EAGAIN)
			return rc;
		clock_gettime(CLOCK_MONOTONIC, &t);
		long spent = (t.tv_sec - t0.tv_sec) * 1000L + (t.tv_nsec - t0.tv_nsec) / 1000000L;
		if (spent >= wait_ms)
			return -EAGAIN;
		usleep((useconds_t)nap_us);
	}
}

int wf__shm_same_file(int fd, const char *path)
{
	struct stat a, b;
	if (fstat(fd, &a) != 0)
		return -errno;
	if (stat(path, &b) != 0)
		return errno == ENOENT ? 0 : -errno;
	return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

int wf__shm_check_file(const struct stat *st, bool lock_file, char *why, size_t why_len)
{
	mode_t bad = lock_file ? S_IWOTH : (S_IWGRP | S_IWOTH);

	if (!S_ISREG(st->st_mode)) {
		snprintf(why, why_len, "not a regular file");
		return WF_EPERMISSION;
	}
	if (st->st_uid != geteuid()) {
		snprintf(why, why_len, "owned by uid %u, not by uid %u", (unsigned)st->st_uid,
		         (unsigned)geteuid());
		return WF_EPERMISSION;
	}
	if (st->st_mode & bad) {
		snprintf(why, why_len, "mode %04o is writable by %s",
		         (unsigned)(st->st_mode & 07777),
		         st->st_mode & S_IWOTH ? "others" : "the group");
		return WF_EPERMISSION;
	}
	return 0;
}

bool wf__shm_keep_exists(const char *path)
{
	struct stat st;
	return lstat(path, &st) == 0;
}

int wf__shm_apply_group(int fd, const struct wf_shm_config *cfg)
{
	if (cfg && cfg->set_gid && fchown(fd, (uid_t)-1, cfg->gid) != 0)
		return -errno;
	return 0;
}

int wf__shm_lockfile_open(const char *path, bool create, const struct wf_shm_config *cfg,
                          int *ret_fd)
{
	const int flags = O_RDONLY | O_CLOEXEC | O_NOFOLLOW;
	int fd, rc;

	for (int tries = 0; tries < LOCK_MAX_RETRIES; tries++) {
		if (create) {
			/* O_EXCL tells us whether the file is ours to give its mode and group: the
			 * umask must not decide them, and someone else's file is not ours to
			 * chmod. */
			fd = open(path, flags | O_CREAT | O_EXCL, wf__shm_lock_mode(cfg));
			if (fd >= 0) {
				if (fchmod(fd, wf__shm_lock_mode(cfg)) != 0 ||
				    (rc = wf__shm_apply_group(fd, cfg)) < 0) {
					rc = -errno;
					close(fd);
					return rc;
				}
				*ret_fd = fd;
				return 0;
			}
			if (errno != EEXIST)
				return -errno;
		}
		fd = open(path, flags);
		if (fd >= 0) {
			*ret_fd = fd;
			return 0;
		}
		if (errno != ENOENT || !create)
			return -errno;
		/* Unlinked between our two opens: try again. */
	}
	return -EAGAIN;
}

int wf__shm_lock_path(const char *path, int op, bool create, const struct wf_shm_config *cfg,
                      int *ret_fd)
{
	return wf__shm_lock_path_timed(path, op, create, cfg, -1, ret_fd);
}

int wf__shm_lock_path_timed(const char *path, int op, bool create, const struct wf_shm_config *cfg,
                            int wait_ms, int *ret_fd)
{
	for (int tries = 0; tries < LOCK_MAX_RETRIES; tries++) {
		int fd = -1, rc;
		rc = wf__shm_lockfile_open(path, create, cfg, &fd);
		if (rc < 0)
			return rc;
		rc = wf__shm_flock_timed(fd, op, wait_ms);
		if (rc < 0) {
			close(fd);
			return rc;
		}
		/* A last holder may have unlinked the file while we waited for it: our lock would
		 * then sit on an orphan inode that nobody else will ever lock. */
		rc = wf__shm_same_file(fd, path);
		if (rc == 1) {
			*ret_fd = fd;
			return 0;
		}
		close(fd);
		if (rc < 0)
			return rc;
	}
	return -EAGAIN;
}

int wf_shm_region_sole_holder(struct wf_shm_region *r, bool *ret_sole)
{
	int gfd, rc, rc2;

	if (!r || !ret_sole || r->holders_fd < 0)
		return WF_EINVAL;
	rc = wf__shm_lock_path(r->guard_path, LOCK_EX, false, NULL, &gfd);
	if (rc < 0)
		return rc;
	/* Under the guard nobody else takes or drops the holders lock, so the conversions below,
	 * which are not atomic, cannot let an attach or a last-holder unlink slip in. */
	rc = wf__shm_flock(r->holders_fd, LOCK_EX | LOCK_NB);
	/* Either way we go back to SH: after success that is a downgrade; after failure Linux has
	 * already dropped our SH lock and we must take it again (it cannot block: others hold
	 * only SH). */
	rc2 = wf__shm_flock(r->holders_fd, LOCK_SH);
	close(gfd);
	if (rc2 < 0)
		return rc2;
	if (rc < 0 && rc != -EAGAIN)
		return rc;
	*ret_sole = rc == 0;
	return 0;
}

/* One pass over /proc/locks: the FLOCK holders of st's inode, up to cap of them in pids, all of
 * them counted in *ret_n. 0 or -errno. */
static int scan_locks(const struct stat *st, pid_t *pids, size_t cap, size_t *ret_n)
{
	char line[256];
	size_t n = 0;
	FILE *f = fopen("/proc/locks", "re");
	if (!f)
		return -errno;
	/* "1: FLOCK  ADVISORY  READ  1234 00:1a:5678 0 EOF"; waiters' lines carry "->": skip. */
	while (fgets(line, sizeof(line), f)) {
		char type[16], mode[16], rw[16];
		int pid;
		unsigned maj, min;
		unsigned long long ino;
		if (strstr(line, "->"))
			continue;
		if (sscanf(line, "%*d: %15s %15s %15s %d %x:%x:%llu", type, mode, rw, &pid, &maj,
		           &min, &ino) != 7)
			continue;
		if (strcmp(type, "FLOCK") != 0 || ino != (unsigned long long)st->st_ino ||
		    maj != major(st->st_dev) || min != minor(st->st_dev))
			continue;
		if (n < cap)
			pids[n] = pid;
		n++;
	}
	fclose(f);
	*ret_n = n;
	return 0;
}

/* The kernel lists /proc/locks a page at a time, so while other processes take or drop locks a
 * read can show an entry twice or miss one; reads are repeated until two in a row agree. */
#define HOLDER_READS_MAX 8

int wf_shm_holder_pids(const struct wf_shm_config *cfg, const struct wf_digest *digest, pid_t *pids,
                       size_t cap, size_t *ret_n, struct wf_diag *diag)
{
	char *region = NULL, *guard = NULL, *holders = NULL;
	pid_t *prev = NULL;
	struct stat st;
	size_t n = 0, prev_n = 0;
	int rc;

	if (!digest || !ret_n || (cap && !pids))
		return WF_EINVAL;
	rc = wf__shm_paths(cfg, digest, &region, &guard, &holders);
	if (rc < 0)
		return rc;
	if (stat(holders, &st) != 0) {
		rc = wf_diag_set(diag, -errno, "stat %s: %s", holders, strerror(errno));
		goto out;
	}
	if (cap && !(prev = calloc(cap, sizeof(*prev)))) {
		rc = -ENOMEM;
		goto out;
	}
	for (int i = 0; i < HOLDER_READS_MAX; i++) {
		if ((rc = scan_locks(&st, pids, cap, &n)) < 0) {
			rc = wf_diag_set(diag, rc, "read /proc/locks: %s", strerror(-rc));
			goto out;
		}
		size_t shown = n < cap ? n : cap;
		if (i > 0 && n == prev_n && memcmp(pids, prev, shown * sizeof(*pids)) == 0)
			break;
		if (shown)
			memcpy(prev, pids, shown * sizeof(*pids));
		prev_n = n;
	}
	*ret_n = n;
	rc = 0;
out:
	free(prev);
	free(region);
	free(guard);
	free(holders);
	return rc;
}
