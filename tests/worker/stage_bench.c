/* wf-stage-bench: the staging pipeline's rates against a plain memcpy of the same bytes, for
 * tuning the ring (buffer count and size, copy streams) on a given device.
 *
 *   wf-stage-bench [-d SPEC] [-s MiB] [-t MiB per tensor] [-n buffers] [-b buffer KiB]
 *                  [-c streams] [-r reps] [-D floor dir] [-f] [-R] [-m staged|direct]
 *                  [-q io queue depth] [-k io chunk KiB]
 *
 * -f also loads from the model file (staged, O_DIRECT), -R skips registering the ring with the
 * io reader. WF_IO_BACKEND=pread|uring picks the reader. Prints one line per mode with the best
 * of the repetitions and its ratio to memcpy (measured in the same run, from the same floor
 * mapping into the same device allocation). Not a test: numbers depend on the machine. */
#include "base/error.h"
#include "device/device.h"
#include "io/reader.h"
#include "shm/region.h"
#include "worker/stage.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MiB (1ull << 20)

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int die(const char *what, int ret, const struct wf_diag *d)
{
	fprintf(stderr, "wf-stage-bench: %s: %s\n", what, wf_diag_str(d, ret));
	exit(1);
}

static int fill(void *ctx, const struct wf_shm_fill *job, struct wf_diag *diag)
{
	(void)ctx;
	for (uint32_t i = 0; i < job->n_files; i++) {
		const struct wf_shm_fill_file *f = &job->files[i];
		int fd = open(f->path, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			return wf_diag_set(diag, -errno, "open %s", f->path);
		for (uint64_t off = 0; off < f->copy_length;) {
			ssize_t r = pread(fd, (char *)f->dst + off, (size_t)(f->copy_length - off),
			                  (off_t)(f->src_offset + off));
			if (r <= 0) {
				close(fd);
				return wf_diag_set(diag, r < 0 ? -errno : WF_ETRUNCATED, "read");
			}
			off += (uint64_t)r;
		}
		close(fd);
	}
	return 0;
}

int main(int argc, char **argv)
{
	const char *spec = "host:mem=4Gi", *floor_dir = "/dev/shm";
	uint64_t size = 512 * MiB, tensor = 4 * MiB;
	struct wf_stage_opts so = {0};
	struct wf_io_opts ioo = {0};
	int reps = 3, opt, from_file = 0, only = 0;
	struct wf_diag d = {0};
	int ret;

	while ((opt = getopt(argc, argv, "d:s:t:n:b:c:r:D:fRm:q:k:")) != -1) {
		switch (opt) {
		case 'd':
			spec = optarg;
			break;
		case 's':
			size = strtoull(optarg, NULL, 0) * MiB;
			break;
		case 't':
			tensor = strtoull(optarg, NULL, 0) * MiB;
			break;
		case 'n':
			so.n_buffers = (unsigned)atoi(optarg);
			break;
		case 'b':
			so.buffer_size = strtoull(optarg, NULL, 0) << 10;
			break;
		case 'c':
			so.n_streams = (unsigned)atoi(optarg);
			break;
		case 'r':
			reps = atoi(optarg);
			break;
		case 'D':
			floor_dir = optarg;
			break;
		case 'f':
			from_file = 1;
			break;
		case 'q':
			ioo.queue_depth = (unsigned)atoi(optarg);
			break;
		case 'k':
			ioo.chunk_size = strtoull(optarg, NULL, 0) << 10;
			break;
		case 'R':
			so.flags |= WF_STAGE_OPT_NO_REGISTER;
			break;
		case 'm':
			only = strcmp(optarg, "direct") == 0 ? WF_STAGE_MODE_DIRECT
			                                     : WF_STAGE_MODE_STAGED;
			break;
		default:
			fprintf(stderr, "usage: see the top of tests/worker/stage_bench.c\n");
			return 2;
		}
	}
	if (!tensor || size < tensor)
		return 2;

	/* One file of n tensors, packed at 32 bytes after a 4000-byte header. */
	char dir[] = "/tmp/wf-stage-bench-XXXXXX", fdir[4096], path[4200];
	if (!mkdtemp(dir))
		return 1;
	snprintf(fdir, sizeof(fdir), "%s/wf-stage-bench-floor-%d", floor_dir, (int)getpid());
	mkdir(fdir, 0700);
	snprintf(path, sizeof(path), "%s/model.bin", dir);
	size_t nt = (size_t)(size / tensor);
	struct wf_model m = {
	    .format = WF_MODEL_FORMAT_GGUF, .n_files = 1, .n_tensors = (uint32_t)nt};
	struct wf_model_file mf = {.path = path, .data_offset = 4000, .alignment = 32};
	struct wf_tensor *ts = calloc(nt, sizeof(*ts));
	char(*names)[32] = calloc(nt, 32);
	uint64_t off = 4000;
	for (size_t i = 0; i < nt; i++) {
		snprintf(names[i], 32, "t%zu", i);
		ts[i] = (struct wf_tensor){.name = names[i],
		                           .dtype = WF_DTYPE_I8,
		                           .n_dims = 1,
		                           .nbytes = tensor,
		                           .file = 0,
		                           .offset = off};
		ts[i].ne[0] = (int64_t)tensor;
		for (int k = 1; k < WF_MODEL_MAX_DIMS; k++)
			ts[i].ne[k] = 1;
		off += (tensor + 31) & ~31ull;
		m.total_bytes += tensor;
	}
	mf.data_size = off - 4000;
	mf.n_tensors = (uint32_t)nt;
	{
		int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
		char *buf = malloc(16 * MiB);
		for (size_t i = 0; i < 16 * MiB; i++)
			buf[i] = (char)(i * 2654435761u >> 13);
		for (uint64_t w = 0; w < off;) {
			size_t n = off - w < 16 * MiB ? (size_t)(off - w) : 16 * MiB;
			if (write(fd, buf, n) != (ssize_t)n)
				return 1;
			w += n;
		}
		free(buf);
		close(fd);
		struct stat st;
		stat(path, &st);
		mf.size = (uint64_t)st.st_size;
		mf.mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
	}
	m.files = &mf;
	m.tensors = ts;

	struct wf_shm_config cfg = {.dir = fdir};
	struct wf_digest dg;
	struct wf_shm_region *r;
	wf_model_digest(&m, &dg);
	ret = wf_shm_region_attach(&cfg, &dg, &m, WF_SHM_ATTACH_AGENT, fill, NULL, &r, &d);
	if (ret < 0)
		die("floor", ret, &d);

	struct wf_device *dev;
	struct wf_io_reader *io;
	struct wf_stage *st;
	void *dmem;
	if ((ret = wf_device_open(spec, &dev, &d)) < 0)
		die("device", ret, &d);
	if ((ret = wf_io_reader_create(&ioo, &io)) < 0)
		die("io", ret, &d);
	if ((ret = wf_stage_create(dev, io, &so, &st, &d)) < 0)
		die("stage", ret, &d);
	struct wf_stage_item *items = calloc(nt, sizeof(*items));
	struct wf_shm_tensor_info ti0, ti;
	wf_shm_region_tensor(r, 0, &ti0);
	if ((ret = wf_device_mem_alloc(dev, (size_t)(off - 4000), &dmem, &d)) < 0)
		die("device memory", ret, &d);
	for (size_t i = 0; i < nt; i++) {
		wf_shm_region_tensor(r, (uint32_t)i, &ti);
		items[i] =
		    (struct wf_stage_item){ti.floor_offset, tensor,
		                           (char *)dmem + (ti.floor_offset - ti0.floor_offset), 1};
	}
	struct wf_stage_src src = {.fd = wf_shm_region_fd(r),
	                           .map = wf_shm_region_data(r),
	                           .map_size = (size_t)wf_shm_region_size(r)};
	struct wf_stage_info info;
	wf_stage_info(st, &info);
	struct wf_io_reader_info ri;
	wf_io_reader_info(io, &ri);
	printf("device %s; reader %s; %zu x %zu MiB tensors; ring %u x %zu KiB, %u streams, "
	       "io-registered %d\n",
	       wf_device_name(dev), ri.backend_name, nt, (size_t)(tensor >> 20), info.n_buffers,
	       info.buffer_size >> 10, info.n_streams, (int)info.io_registered);

	double mc = 0;
	size_t span = (size_t)(off - 4000);
	for (int i = 0; i < reps; i++) {
		double t0 = now();
		memcpy(dmem, (const char *)src.map + ti0.floor_offset, span);
		double g = (double)span / (now() - t0) / 1e9;
		mc = g > mc ? g : mc;
	}
	printf("memcpy          %7.2f GB/s\n", mc);
	for (int mode = WF_STAGE_MODE_STAGED; mode <= WF_STAGE_MODE_DIRECT; mode++) {
		if (only && mode != only)
			continue;
		struct wf_stage_ctl ctl = {.mode = (enum wf_stage_mode)mode};
		struct wf_stage_stats s, best = {0};
		for (int i = 0; i < reps; i++) {
			if ((ret = wf_stage_load(st, &src, items, nt, &ctl, &s, &d)) < 0)
				die("load", ret, &d);
			if (s.gbps > best.gbps)
				best = s;
		}
		printf("%-15s %7.2f GB/s  ratio %.2f  (%" PRIu64 " batches, %" PRIu64 " copies)\n",
		       mode == WF_STAGE_MODE_STAGED ? "staged (floor)" : "direct (floor)",
		       best.gbps, best.gbps / mc, best.batches, best.copies);
	}
	if (from_file) {
		struct wf_stage_src fsrc = {.fd = -1, .path = path};
		struct wf_stage_stats s, best = {0};
		for (size_t i = 0; i < nt; i++)
			items[i].offset = ts[i].offset;
		for (int i = 0; i < reps; i++) {
			if ((ret = wf_stage_load(st, &fsrc, items, nt, NULL, &s, &d)) < 0)
				die("file load", ret, &d);
			if (s.gbps > best.gbps)
				best = s;
		}
		printf("staged (file)   %7.2f GB/s  ratio %.2f\n", best.gbps, best.gbps / mc);
	}
	wf_device_mem_free(dev, dmem, NULL);
	wf_stage_destroy(st);
	wf_io_reader_destroy(io);
	wf_device_close(dev);
	wf_shm_region_detach(r);
	rmdir(fdir);
	unlink(path);
	rmdir(dir);
	free(items);
	free(ts);
	free(names);
	return 0;
}
