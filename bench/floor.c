/* wf-bench floor: the four floor figures, each against an anchor measured in this run.
 *  cold   materialization throughput (the agent's materializer: shm attach + io_uring fill) with
 *         the page cache dropped, over fio's io_uring O_DIRECT sequential read of the same file;
 *  warm   the same with the file in the page cache, over `cat FILE > /dev/null`;
 *  share  8 processes attach one floor and read every page: sum of their PSS over the model size;
 *  attach p50/p99 of attaching a READY floor of a 10k-tensor model, over 1 ms. */
#include "anchors.h"
#include "bench.h"
#include "report.h"

#include "base/error.h"
#include "model/gguf_writer.h"
#include "model/model.h"
#include "shm/fill.h"
#include "shm/region.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static double cpu_secs(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
	       (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

/* CPU seconds (all threads of this process) of the last materialize(): with the machine shared,
 * the wall clock alone hides whether a change saved work or just had the cores to itself. */
static double last_cpu;

static int materialize(const char *floor_dir, struct wf_model *m, const struct wf_digest *dg,
                       double *ret_secs, struct wf_shm_region **ret_region)
{
	struct wf_shm_config cfg = {.dir = floor_dir};
	struct wf_shm_fill_io fi = {0};
	struct wf_diag d = {{0}};
	/* The standard fill qualifies for WF_SHM_ATTACH_STREAM (shm/region.h): page allocation
	 * then overlaps the reads instead of preceding them. */
	unsigned fl = WF_SHM_ATTACH_AGENT | WF_SHM_ATTACH_STREAM;
	double c0 = cpu_secs(), t0 = bench_now();
	int rc = wf_shm_region_attach(&cfg, dg, m, fl, wf_shm_fill_from_files, &fi, ret_region, &d);
	*ret_secs = bench_now() - t0;
	last_cpu = cpu_secs() - c0;
	if (rc < 0)
		fprintf(stderr, "wf-bench: materialize: %s\n", wf_diag_str(&d, rc));
	return rc;
}

/* The floor under any materialization: writing `bytes` from a hot 1 MiB buffer into fresh pages of
 * a file in floor_dir (tmpfs), which every materialization must do and cat never does. Seconds, or
 * -1. Runs with the model's page cache still warm, like the figure it is a note to. */
static double fresh_write_seconds(const char *floor_dir, uint64_t bytes)
{
	char path[4300];
	const size_t chunk = 1 << 20;
	char *buf = malloc(chunk);
	double secs = -1;

	if (!buf)
		return -1;
	memset(buf, 0x5a, chunk);
	snprintf(path, sizeof path, "%s/fresh-write-%d", floor_dir, (int)getpid());
	int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd >= 0) {
		double t0 = bench_now();
		uint64_t off = 0;
		while (off < bytes) {
			size_t n = bytes - off < chunk ? (size_t)(bytes - off) : chunk;
			if (pwrite(fd, buf, n, (off_t)off) != (ssize_t)n)
				break;
			off += n;
		}
		if (off == bytes)
			secs = bench_now() - t0;
		close(fd);
		unlink(path);
	}
	free(buf);
	return secs;
}

static void run_throughput(const struct bench_opts *o, const char *model_path, struct wf_model *m,
                           const struct wf_digest *dg, const char *floor_dir)
{
	bool want_cold = bench_selected(o, "cold"), want_warm = bench_selected(o, "warm");
	double bytes = (double)m->total_bytes;
	struct wf_shm_region *r = NULL;
	double secs;
	char note[256];

	/* cold */
	bool dropped = false;
	if (!want_cold)
		goto warm;
	dropped = bench_drop_caches();
	if (!dropped)
		bench_evict_file(model_path);
	double fio = bench_fio_read(model_path, true);
	if (!dropped)
		bench_evict_file(model_path);
	else
		bench_drop_caches();
	if (fio <= 0) {
		bench_skip("floor", "cold_materialize_GBps", "fio is not available or failed");
	} else if (materialize(floor_dir, m, dg, &secs, &r) == 0) {
		double v = bytes / secs;
		snprintf(note, sizeof note, "%.2f GB model; page cache %s; %.2f s wall, %.2f s CPU",
		         bytes / 1e9,
		         dropped ? "dropped" : "evicted with fadvise (no drop_caches permission)",
		         secs, last_cpu);
		bench_report(&(struct bench_result){.bench = "floor",
		                                    .metric = "cold_materialize_GBps",
		                                    .unit = "GB/s",
		                                    .value = v / 1e9,
		                                    .anchor = "fio io_uring O_DIRECT seq read GB/s",
		                                    .anchor_value = fio / 1e9,
		                                    .ratio = v / fio,
		                                    .goal = 0.95,
		                                    .goal_op = ">=",
		                                    .notes = note});
		wf_shm_region_detach(r);
		r = NULL;
	}

warm:
	if (!want_warm)
		return;
	/* warm: read the file once so it is cached, then the anchor, then us */
	double c1 = bench_cat_seconds(model_path);
	double cat = bench_cat_seconds(model_path);
	if (c1 < 0 || cat <= 0) {
		bench_skip("floor", "warm_materialize_GBps", "cat failed");
	} else if (materialize(floor_dir, m, dg, &secs, &r) == 0) {
		double v = bytes / secs, a = (double)m->files[0].size / cat;
		wf_shm_region_detach(r); /* its pages go back before the next figure */
		r = NULL;
		double fw = fresh_write_seconds(floor_dir, (uint64_t)bytes);
		snprintf(note, sizeof note,
		         "%.2f s wall, %.2f s CPU; materializing writes fresh tmpfs pages, which "
		         "cat never does: a plain pwrite of as many bytes into fresh pages here "
		         "takes %.2f s (%.2f GB/s); we reach %.2f of it",
		         secs, last_cpu, fw, fw > 0 ? bytes / fw / 1e9 : 0.0,
		         fw > 0 ? fw / secs : 0.0);
		bench_report(&(struct bench_result){.bench = "floor",
		                                    .metric = "warm_materialize_GBps",
		                                    .unit = "GB/s",
		                                    .value = v / 1e9,
		                                    .anchor = "cat FILE >/dev/null GB/s (cached)",
		                                    .anchor_value = a / 1e9,
		                                    .ratio = v / a,
		                                    .goal = 0.9,
		                                    .goal_op = ">=",
		                                    .notes = note});
	}
}

/* Pss of the mapping of path in this process, from /proc/self/smaps, in bytes. */
static long long mapping_pss(const char *path)
{
	FILE *f = fopen("/proc/self/smaps", "re");
	if (!f)
		return -1;
	char line[4608];
	bool in = false;
	long long pss = 0;
	while (fgets(line, sizeof line, f)) {
		size_t n = strlen(line);
		if (n && line[n - 1] == '\n')
			line[n - 1] = '\0';
		/* mapping header lines start with an address range "lo-hi perms ..." */
		if (strchr(line, '-') && strchr(line, ' ') &&
		    strspn(line, "0123456789abcdef-") == (size_t)(strchr(line, ' ') - line)) {
			size_t pl = strlen(path);
			in = n > pl && strcmp(line + strlen(line) - pl, path) == 0;
			continue;
		}
		long long kb;
		if (in && sscanf(line, "Pss: %lld kB", &kb) == 1)
			pss += kb * 1024;
	}
	fclose(f);
	return pss;
}

/* Children attach, touch every page, say so, wait until all have touched (PSS divides each page
 * among the processes mapping it at the moment it is read), then measure. Every child writes
 * exactly one record however it fares, so a failure can never leave the parent waiting. */
struct share_rec {
	int32_t rc; /* 0, or the attach error */
	int32_t pad;
	int64_t pss; /* bytes, -1 when not measured */
};

static void run_sharing(const char *floor_dir, struct wf_model *m, const struct wf_digest *dg)
{
	enum { NPROC = 8 };
	struct wf_shm_region *held = NULL;
	double secs;
	if (materialize(floor_dir, m, dg, &secs, &held) < 0)
		return;
	/* go: one byte per child to start measuring; release: closed by the parent (EOF for all)
	 * when every record is in. Separate pipes, so no child can take another's byte. */
	int touched[2], go[2], rec[2], release[2];
	if (pipe(touched) < 0 || pipe(go) < 0 || pipe(rec) < 0 || pipe(release) < 0)
		return;
	pid_t pids[NPROC];
	for (int i = 0; i < NPROC; i++) {
		pids[i] = fork();
		if (pids[i] != 0)
			continue;
		close(touched[0]);
		close(go[1]);
		close(rec[0]);
		close(release[1]);
		struct wf_shm_config cfg = {.dir = floor_dir};
		struct wf_shm_region *r = NULL;
		struct share_rec out = {.pss = -1};
		out.rc = wf_shm_region_attach(&cfg, dg, NULL, WF_SHM_ATTACH_READER, NULL, NULL, &r,
		                              NULL);
		if (out.rc == 0) {
			const volatile unsigned char *b = wf_shm_region_data(r);
			uint64_t sz = wf_shm_region_size(r);
			unsigned sum = 0;
			for (uint64_t off = 0; off < sz; off += 4096)
				sum += b[off];
			(void)sum;
		}
		char c = 't';
		if (write(touched[1], &c, 1) != 1 || read(go[0], &c, 1) < 0)
			_exit(1);
		if (out.rc == 0)
			out.pss = mapping_pss(wf_shm_region_path(r));
		if (write(rec[1], &out, sizeof out) != (ssize_t)sizeof out)
			_exit(1);
		/* stay mapped until every child has measured: the parent closes release */
		if (read(release[0], &c, 1) < 0)
			_exit(1);
		_exit(0);
	}
	close(touched[1]);
	close(rec[1]);
	close(go[0]);
	close(release[0]);
	char c;
	for (int i = 0; i < NPROC; i++)
		if (read(touched[0], &c, 1) != 1)
			break;
	if (write(go[1], "gggggggg", NPROC) != NPROC)
		perror("wf-bench: share");
	long long total = 0;
	int got = 0, first_err = 0;
	for (int i = 0; i < NPROC; i++) {
		struct share_rec r;
		if (read(rec[0], &r, sizeof r) != (ssize_t)sizeof r)
			break;
		if (r.rc == 0 && r.pss >= 0) {
			total += r.pss;
			got++;
		} else if (!first_err) {
			first_err = r.rc ? r.rc : -EIO;
		}
	}
	close(go[1]);
	close(release[1]); /* releases the children */
	for (int i = 0; i < NPROC; i++)
		waitpid(pids[i], NULL, 0);
	close(touched[0]);
	close(rec[0]);
	if (got != NPROC) {
		char why[160];
		snprintf(why, sizeof why, "%d of %d children could not attach or measure (%s)",
		         NPROC - got, NPROC, wf_strerror(first_err));
		bench_skip("floor", "share_pss_over_model", why);
	} else {
		double size = (double)wf_shm_region_size(held);
		char note[128];
		snprintf(note, sizeof note,
		         "%d processes, region %.0f MiB; a private copy each = %d.0", NPROC,
		         size / 1048576.0, NPROC);
		bench_report(&(struct bench_result){.bench = "floor",
		                                    .metric = "share_pss_over_model",
		                                    .unit = "x",
		                                    .value = (double)total / size,
		                                    .anchor = "region size (1 copy)",
		                                    .anchor_value = 1.0,
		                                    .ratio = (double)total / size,
		                                    .goal = 1.05,
		                                    .goal_op = "<=",
		                                    .notes = note});
	}
	wf_shm_region_detach(held);
}

/* A GGUF with n tiny F32 tensors: what attach cost depends on is the tensor count. */
static int write_many_tensors(const char *path, unsigned n)
{
	struct wf_gguf_writer *w = NULL;
	struct wf_diag d = {{0}};
	int rc = wf_gguf_writer_create(path, NULL, &w, &d);
	if (rc < 0)
		goto out;
	wf_gguf_writer_set_str(w, "general.architecture", "bench");
	int64_t ne[1] = {64};
	char name[64];
	for (unsigned i = 0; i < n && rc == 0; i++) {
		snprintf(name, sizeof name, "blk.%u.tensor.%u.weight", i / 16, i % 16);
		rc = wf_gguf_writer_add_tensor(w, name, WF_DTYPE_F32, 1, ne, NULL, &d);
	}
	if (rc == 0)
		rc = wf_gguf_writer_write_header(w, &d);
	float data[64];
	for (unsigned i = 0; i < n && rc == 0; i++) {
		for (int k = 0; k < 64; k++)
			data[k] = (float)(i + k);
		rc = wf_gguf_writer_write(w, data, sizeof data, &d);
	}
	if (rc == 0)
		rc = wf_gguf_writer_finish(w, &d);
out:
	if (rc < 0)
		fprintf(stderr, "wf-bench: writing %s: %s\n", path, wf_diag_str(&d, rc));
	wf_gguf_writer_destroy(w);
	return rc;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static void run_attach(const struct bench_opts *o, const char *dir, const char *floor_dir)
{
	char path[4200];
	snprintf(path, sizeof path, "%s/attach-10k.gguf", dir);
	const unsigned nt = 10000;
	if (write_many_tensors(path, nt) < 0)
		return;
	struct wf_model *m = NULL;
	struct wf_diag d = {{0}};
	if (wf_model_open(path, &m, &d) < 0) {
		fprintf(stderr, "wf-bench: %s: %s\n", path, d.msg);
		return;
	}
	struct wf_digest dg;
	wf_model_digest(m, &dg);
	struct wf_shm_region *held = NULL;
	double secs;
	if (materialize(floor_dir, m, &dg, &secs, &held) < 0) {
		wf_model_close(m);
		return;
	}
	int iters = o->iterations ? o->iterations : 2000;
	double *t = calloc((size_t)iters, sizeof(*t));
	struct wf_shm_config cfg = {.dir = floor_dir};
	for (int i = 0; i < iters; i++) {
		struct wf_shm_region *r = NULL;
		double t0 = bench_now();
		int rc = wf_shm_region_attach(&cfg, &dg, NULL, WF_SHM_ATTACH_READER, NULL, NULL, &r,
		                              NULL);
		t[i] = bench_now() - t0;
		if (rc < 0) {
			fprintf(stderr, "wf-bench: attach: %s\n", wf_strerror(rc));
			iters = i;
			break;
		}
		wf_shm_region_detach(r);
	}
	if (iters > 10) {
		qsort(t, (size_t)iters, sizeof(*t), cmp_d);
		double p50 = t[iters / 2] * 1e3, p99 = t[(int)(iters * 0.99)] * 1e3;
		char note[160];
		snprintf(note, sizeof note,
		         "%u tensors, %d attaches (reader mode, validated), p50 %.3f ms", nt, iters,
		         p50);
		bench_report(&(struct bench_result){.bench = "floor",
		                                    .metric = "attach_p99_ms",
		                                    .unit = "ms",
		                                    .value = p99,
		                                    .anchor = "1 ms",
		                                    .anchor_value = 1.0,
		                                    .ratio = p99 / 1.0,
		                                    .goal = 1.0,
		                                    .goal_op = "<=",
		                                    .notes = note});
		bench_report(&(struct bench_result){.bench = "floor",
		                                    .metric = "attach_p50_ms",
		                                    .unit = "ms",
		                                    .value = p50,
		                                    .anchor = "1 ms",
		                                    .anchor_value = 1.0,
		                                    .ratio = p50,
		                                    .goal = 1.0,
		                                    .goal_op = "<=",
		                                    .notes = NULL});
	}
	free(t);
	wf_shm_region_detach(held);
	wf_model_close(m);
	unlink(path);
}

int bench_floor(const struct bench_opts *o)
{
	char model_path[4200], floor_dir[4200];
	snprintf(model_path, sizeof model_path, "%s/floor-bench-%s.gguf", o->dir, o->size);
	snprintf(floor_dir, sizeof floor_dir, "%s/wf-bench-floor-%d", o->floor_root, (int)getpid());
	if (mkdir(o->dir, 0755) < 0 && errno != EEXIST) {
		fprintf(stderr, "wf-bench: %s: %s\n", o->dir, strerror(errno));
		return 1;
	}
	struct stat st;
	if (stat(model_path, &st) != 0 && bench_gen_model(o->wfgen, model_path, o->size, 11) < 0) {
		fprintf(stderr, "wf-bench: could not generate %s with %s\n", model_path, o->wfgen);
		return 1;
	}
	struct wf_model *m = NULL;
	struct wf_diag d = {{0}};
	int rc = wf_model_open(model_path, &m, &d);
	if (rc < 0) {
		fprintf(stderr, "wf-bench: %s: %s\n", model_path, wf_diag_str(&d, rc));
		return 1;
	}
	struct wf_digest dg;
	wf_model_digest(m, &dg);
	if (bench_selected(o, "cold") || bench_selected(o, "warm"))
		run_throughput(o, model_path, m, &dg, floor_dir);
	if (bench_selected(o, "share"))
		run_sharing(floor_dir, m, &dg);
	if (bench_selected(o, "attach"))
		run_attach(o, o->dir, floor_dir);
	wf_model_close(m);
	rmdir(floor_dir);
	return 0;
}
