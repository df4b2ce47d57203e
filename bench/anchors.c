#include "anchors.h"

#include <errno.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

double bench_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

bool bench_drop_caches(void)
{
	sync();
	int fd = open("/proc/sys/vm/drop_caches", O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return false;
	bool ok = write(fd, "3\n", 2) == 2;
	close(fd);
	return ok;
}

void bench_evict_file(const char *path)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return;
	fdatasync(fd);
	posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
	close(fd);
}

/* Runs argv with stdout to out_path (or /dev/null), returns the exit status or -1. */
static int run(char *const argv[], const char *out_path)
{
	posix_spawn_file_actions_t fa;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_addopen(&fa, 1, out_path ? out_path : "/dev/null",
					 O_WRONLY | O_CREAT | O_TRUNC, 0600);
	pid_t pid;
	int rc = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	if (rc != 0)
		return -1;
	int st;
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

double bench_fio_read(const char *path, bool direct)
{
	char out[] = "/tmp/wf-bench-fio-XXXXXX";
	int fd = mkstemp(out);
	if (fd < 0)
		return -1;
	close(fd);
	char fname[4200];
	snprintf(fname, sizeof fname, "--filename=%s", path);
	char *argv[] = {"fio", "--name=anchor", fname, "--rw=read", "--bs=1M", "--iodepth=64",
			"--ioengine=io_uring", direct ? "--direct=1" : "--direct=0", "--readonly",
			"--output-format=json", NULL};
	double bw = -1;
	if (run(argv, out) == 0) {
		struct json_object *j = json_object_from_file(out), *jobs, *job, *rd, *b;
		if (j && json_object_object_get_ex(j, "jobs", &jobs) &&
		    (job = json_object_array_get_idx(jobs, 0)) &&
		    json_object_object_get_ex(job, "read", &rd) &&
		    json_object_object_get_ex(rd, "bw_bytes", &b))
			bw = (double)json_object_get_int64(b);
		json_object_put(j);
	}
	unlink(out);
	return bw;
}

double bench_cat_seconds(const char *path)
{
	char *argv[] = {"cat", (char *)path, NULL};
	double t0 = bench_now();
	if (run(argv, NULL) != 0)
		return -1;
	return bench_now() - t0;
}

int bench_gen_model(const char *wfgen, const char *path, const char *size, int seed)
{
	char s[16];
	snprintf(s, sizeof s, "%d", seed);
	char *argv[] = {(char *)wfgen, "--arch", "qwen3moe", "--size", (char *)size, "--seed", s,
			"-q", "-o", (char *)path, NULL};
	return run(argv, NULL) == 0 ? 0 : -1;
}
