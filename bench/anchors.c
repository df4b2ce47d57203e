#include "anchors.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <json-c/json.h>
#include <pthread.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
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

int bench_run(char *const argv[], const char *out_path)
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
	char *argv[] = {"fio",
	                "--name=anchor",
	                fname,
	                "--rw=read",
	                "--bs=1M",
	                "--iodepth=64",
	                "--ioengine=io_uring",
	                direct ? "--direct=1" : "--direct=0",
	                "--readonly",
	                "--output-format=json",
	                NULL};
	double bw = -1;
	if (bench_run(argv, out) == 0) {
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
	if (bench_run(argv, NULL) != 0)
		return -1;
	return bench_now() - t0;
}

int bench_gen_model(const char *wfgen, const char *path, const char *size, int seed)
{
	char s[16];
	snprintf(s, sizeof s, "%d", seed);
	char *argv[] = {(char *)wfgen, "--arch", "qwen3moe",   "--size", (char *)size, "--seed", s,
	                "-q",          "-o",     (char *)path, NULL};
	return bench_run(argv, NULL) == 0 ? 0 : -1;
}

/* Eight 16-byte accumulators: enough independent adds that a core's loads, not the add
 * latency, set the pace; 16-byte vectors exist on every x86-64 (and as two words elsewhere), so
 * the anchor needs no CPU dispatch. */
typedef uint64_t bw_vec __attribute__((vector_size(16)));

struct bw_thread {
	const bw_vec *p;
	size_t n; /* vectors, a multiple of 8 */
	uint64_t sink;
	pthread_t tid;
};

static void *bw_main(void *arg)
{
	struct bw_thread *t = arg;
	bw_vec a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, a4 = {0}, a5 = {0}, a6 = {0}, a7 = {0};
	for (size_t i = 0; i < t->n; i += 8) {
		a0 += t->p[i + 0], a1 += t->p[i + 1], a2 += t->p[i + 2], a3 += t->p[i + 3];
		a4 += t->p[i + 4], a5 += t->p[i + 5], a6 += t->p[i + 6], a7 += t->p[i + 7];
	}
	bw_vec s = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
	t->sink = s[0] + s[1]; /* read by the caller, so the loop cannot be optimized away */
	return NULL;
}

double bench_read_bandwidth(unsigned n_threads, size_t bytes, int passes)
{
	if (n_threads < 1 || passes < 1)
		return -1;
	const size_t chunk = 8 * sizeof(bw_vec) * (size_t)n_threads;
	bytes -= bytes % chunk;
	if (bytes == 0)
		return -1;
	struct bw_thread *th = calloc(n_threads, sizeof *th);
	if (!th)
		return -1;
	void *buf = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buf == MAP_FAILED) {
		free(th);
		return -1;
	}
	/* Distinct non-zero bytes: reading untouched anonymous memory would map the shared zero
	 * page and measure the cache, not memory. */
	for (size_t i = 0; i < bytes; i += 4096)
		memset((char *)buf + i, (int)((i >> 12) | 1) & 0xff,
		       bytes - i < 4096 ? bytes - i : 4096);

	double best = -1;
	volatile uint64_t sink = 0;
	size_t per = bytes / n_threads / sizeof(bw_vec);
	/* Threads are created per pass: a pass reads at least 1 GiB (tens of milliseconds at the
	 * least), next to which a thread's creation (tens of microseconds) does not show. */
	for (int pass = 0; pass < passes; pass++) {
		unsigned started = 0;
		double t0 = bench_now();
		for (; started < n_threads; started++) {
			th[started].p = (const bw_vec *)buf + per * started;
			th[started].n = per;
			if (pthread_create(&th[started].tid, NULL, bw_main, &th[started]) != 0)
				break;
		}
		for (unsigned i = 0; i < started; i++) {
			pthread_join(th[i].tid, NULL);
			sink += th[i].sink;
		}
		double secs = bench_now() - t0;
		if (started < n_threads) {
			best = -1;
			break;
		}
		if (secs > 0 && (double)bytes / secs > best)
			best = (double)bytes / secs;
	}
	(void)sink;
	munmap(buf, bytes);
	free(th);
	return best;
}

size_t bench_read_bandwidth_size(void)
{
	uint64_t llc = 0;
	/* The largest cache any index of cpu0 reports (the last level). */
	for (int i = 0; i < 8; i++) {
		char path[96], buf[64];
		snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
		FILE *f = fopen(path, "re");
		if (!f)
			continue;
		if (fgets(buf, sizeof buf, f)) {
			char *end;
			uint64_t v = strtoull(buf, &end, 10);
			if (*end == 'K')
				v <<= 10;
			else if (*end == 'M')
				v <<= 20;
			if (v > llc)
				llc = v;
		}
		fclose(f);
	}
	uint64_t size = 4 * llc, min = 1ull << 30;
	long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
	uint64_t max = pages > 0 && psize > 0 ? (uint64_t)pages * (uint64_t)psize / 8 : min;
	if (size < min)
		size = min;
	if (size > max)
		size = max < min ? min : max;
	return (size_t)size;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb, (void)flag, (void)ftw;
	remove(path);
	return 0;
}

void bench_rmtree(const char *path)
{
	nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}
