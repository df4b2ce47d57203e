#include "common/wftest.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#ifndef WF_SOURCE_DIR_DEFAULT
#define WF_SOURCE_DIR_DEFAULT "."
#endif
#ifndef WF_BUILD_DIR_DEFAULT
#define WF_BUILD_DIR_DEFAULT "."
#endif
#ifndef WF_REFERENCE_DIR_DEFAULT
#define WF_REFERENCE_DIR_DEFAULT "tests/data/reference"
#endif

const char *wft_source_dir(void)
{
	const char *s = getenv("WF_SOURCE_DIR");
	return s && *s ? s : WF_SOURCE_DIR_DEFAULT;
}

const char *wft_build_dir(void)
{
	const char *s = getenv("WF_BUILD_DIR");
	return s && *s ? s : WF_BUILD_DIR_DEFAULT;
}

const char *wft_reference_dir(void)
{
	/* The repository's own copy, by the path CMake compiled in: tests never read test data
	 * from outside the clone, so a fresh clone passes on its own. */
	const char *dir = WF_REFERENCE_DIR_DEFAULT;
	struct stat st;
	if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
		return NULL;
	return dir;
}

char *wft_exe(const char *rel)
{
	char *p = NULL;
	if (asprintf(&p, "%s/%s", wft_build_dir(), rel) < 0)
		abort();
	return p;
}

char *wft_tmpdir(const char *tag)
{
	const char *base = getenv("TMPDIR");
	char *p = NULL;
	if (asprintf(&p, "%s/wftest-%s-XXXXXX", base && *base ? base : "/tmp", tag) < 0)
		abort();
	if (!mkdtemp(p)) {
		fprintf(stderr, "mkdtemp %s: %s\n", p, strerror(errno));
		abort();
	}
	return p;
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	remove(path);
	return 0;
}

void wft_rmtree(const char *path)
{
	if (path)
		nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

int wft_run(char *const argv[], const char *out_path, const char *err_path, int timeout_s)
{
	posix_spawn_file_actions_t fa;
	posix_spawn_file_actions_init(&fa);
	if (out_path)
		posix_spawn_file_actions_addopen(&fa, 1, out_path, O_WRONLY | O_CREAT | O_TRUNC,
		                                 0644);
	if (err_path)
		posix_spawn_file_actions_addopen(&fa, 2, err_path, O_WRONLY | O_CREAT | O_TRUNC,
		                                 0644);
	pid_t pid;
	int rc = posix_spawn(&pid, argv[0], &fa, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	if (rc != 0)
		return -1;
	struct timespec start, now;
	clock_gettime(CLOCK_MONOTONIC, &start);
	for (;;) {
		int status;
		pid_t r = waitpid(pid, &status, WNOHANG);
		if (r == pid) {
			if (WIFEXITED(status))
				return WEXITSTATUS(status);
			return 128 + WTERMSIG(status);
		}
		if (r < 0 && errno != EINTR)
			return -1;
		clock_gettime(CLOCK_MONOTONIC, &now);
		if (now.tv_sec - start.tv_sec >= timeout_s) {
			kill(pid, SIGKILL);
			waitpid(pid, &status, 0);
			return 128 + SIGKILL;
		}
		struct timespec ts = {0, 5 * 1000 * 1000};
		nanosleep(&ts, NULL);
	}
}

char *wft_read_file(const char *path, size_t *ret_len)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	size_t cap = 4096, len = 0;
	char *buf = malloc(cap + 1);
	for (;;) {
		if (len == cap) {
			cap *= 2;
			buf = realloc(buf, cap + 1);
		}
		size_t n = fread(buf + len, 1, cap - len, f);
		if (n == 0)
			break;
		len += n;
	}
	fclose(f);
	buf[len] = '\0';
	if (ret_len)
		*ret_len = len;
	return buf;
}

bool wft_wait_past_ctime(const char *path)
{
	struct stat st;
	struct timespec now;
	if (stat(path, &st) != 0)
		return false;
	for (int i = 0; i < 2000; i++) {
		clock_gettime(CLOCK_REALTIME_COARSE, &now);
		if (now.tv_sec > st.st_ctim.tv_sec ||
		    (now.tv_sec == st.st_ctim.tv_sec && now.tv_nsec > st.st_ctim.tv_nsec))
			return true;
		usleep(1000);
	}
	return false;
}
