/* Weight views for the engine: file mappings or a floor's tensors. */
#include "worker/weights.h"

#include "base/error.h"
#include "shm/region.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22 /* Linux 5.14 */
#endif

/* Prefaulting: a new worker's first tokens touch most of a MoE model's pages (a 16-token prompt
 * routes to nearly every expert); populating the page tables in bulk, on several threads,
 * replaces a fault per 64 KiB (the kernel's fault-around) inside the first token's compute.
 * Best effort: a kernel without MADV_POPULATE_READ just faults as before. */
struct populate_slice {
	uint8_t *p;
	size_t len;
	pthread_t thread;
	bool started;
};

static void *populate_main(void *arg)
{
	struct populate_slice *s = arg;
	(void)madvise(s->p, s->len, MADV_POPULATE_READ);
	return NULL;
}

static void populate(const void *base, size_t len)
{
	enum { MAX_THREADS = 8 };
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	size_t n = cpus < 1 ? 1 : cpus > MAX_THREADS ? MAX_THREADS : (size_t)cpus;
	const size_t page = 4096;
	uint8_t *start = (uint8_t *)((uintptr_t)base & ~(uintptr_t)(page - 1));
	len += (size_t)((const uint8_t *)base - start);
	size_t slice = (len / n + page - 1) & ~(page - 1);
	struct populate_slice sl[MAX_THREADS] = {{0}};
	for (size_t i = 0; i < n && slice; i++) {
		const size_t off = i * slice;
		if (off >= len)
			break;
		sl[i].p = start + off;
		sl[i].len = len - off < slice ? len - off : slice;
		if (i + 1 < n)
			sl[i].started =
			    pthread_create(&sl[i].thread, NULL, populate_main, &sl[i]) == 0;
		if (!sl[i].started)
			populate_main(&sl[i]);
	}
	for (size_t i = 0; i < n; i++)
		if (sl[i].started)
			pthread_join(sl[i].thread, NULL);
}

int wf_weight_view_map_files(const struct wf_model *model, struct wf_weight_view *ret_view,
                             struct wf_diag *diag)
{
	struct wf_weight_view v = {0};
	int rc = -ENOMEM;
	wf_diag_clear(diag);
	v.tensor_data = calloc(model->n_tensors ? model->n_tensors : 1, sizeof(*v.tensor_data));
	v.maps = calloc(model->n_files ? model->n_files : 1, sizeof(*v.maps));
	v.own_maps = true;
	if (!v.tensor_data || !v.maps) {
		wf_diag_set(diag, rc, "weight view");
		goto fail;
	}
	for (uint32_t f = 0; f < model->n_files; f++) {
		const struct wf_model_file *mf = &model->files[f];
		int fd;
		struct stat st;
		rc = wf_model_file_open(mf->path, &fd, &st, diag);
		if (rc < 0) {
			if (diag->msg[0] == '\0')
				wf_diag_set(diag, rc, "%s", mf->path);
			goto fail;
		}
		if ((mf->dev || mf->ino) &&
		    ((uint64_t)st.st_dev != mf->dev || (uint64_t)st.st_ino != mf->ino ||
		     (uint64_t)st.st_size != mf->size)) {
			close(fd);
			rc = wf_diag_set(diag, WF_ECHANGED, "%s changed since it was read",
			                 mf->path);
			goto fail;
		}
		if (mf->size == 0) {
			close(fd);
			continue;
		}
		void *p = mmap(NULL, mf->size, PROT_READ, MAP_SHARED, fd, 0);
		close(fd);
		if (p == MAP_FAILED) {
			rc = wf_diag_set(diag, -errno, "mmap %s", mf->path);
			goto fail;
		}
		v.maps[f] = (struct wf_engine_mapping){p, mf->size};
		v.n_maps = f + 1;
	}
	for (uint32_t i = 0; i < model->n_tensors; i++) {
		const struct wf_tensor *t = &model->tensors[i];
		v.tensor_data[i] = (const uint8_t *)v.maps[t->file].base + t->offset;
	}
	for (uint32_t f = 0; f < v.n_maps; f++)
		if (v.maps[f].base)
			populate(v.maps[f].base, v.maps[f].len);
	*ret_view = v;
	return 0;
fail:
	wf_weight_view_release(&v);
	return rc;
}

int wf_weight_view_from_floor(const struct wf_model *model, const struct wf_shm_region *region,
                              struct wf_weight_view *ret_view, struct wf_diag *diag)
{
	struct wf_weight_view v = {0};
	if (wf_shm_region_n_tensors(region) != model->n_tensors)
		return wf_diag_set(diag, WF_EFORMAT, "the floor holds %u tensors, the model %u",
		                   wf_shm_region_n_tensors(region), model->n_tensors);
	v.tensor_data = calloc(model->n_tensors ? model->n_tensors : 1, sizeof(*v.tensor_data));
	v.maps = calloc(1, sizeof(*v.maps));
	if (!v.tensor_data || !v.maps) {
		free(v.tensor_data);
		free(v.maps);
		return wf_diag_set(diag, -ENOMEM, "weight view");
	}
	v.maps[0] =
	    (struct wf_engine_mapping){wf_shm_region_data(region), wf_shm_region_size(region)};
	v.n_maps = 1;
	for (uint32_t i = 0; i < model->n_tensors; i++) {
		struct wf_shm_tensor_info info;
		int rc = wf_shm_region_tensor(region, i, &info);
		if (rc < 0 || info.nbytes != model->tensors[i].nbytes) {
			free(v.tensor_data);
			free(v.maps);
			return wf_diag_set(diag, rc < 0 ? rc : WF_EFORMAT,
			                   "floor entry %u does not match tensor '%s'", i,
			                   model->tensors[i].name);
		}
		v.tensor_data[i] = info.data;
	}
	populate(wf_shm_region_data(region), wf_shm_region_size(region));
	*ret_view = v;
	return 0;
}

void wf_weight_view_release(struct wf_weight_view *view)
{
	for (uint32_t f = 0; view->own_maps && f < view->n_maps; f++)
		if (view->maps[f].base)
			munmap((void *)view->maps[f].base, view->maps[f].len);
	free(view->maps);
	free(view->tensor_data);
	memset(view, 0, sizeof(*view));
}

struct wf_engine_weights wf_weight_view_engine(const struct wf_weight_view *view)
{
	return (struct wf_engine_weights){
	    .host = view->tensor_data,
	    .device = NULL,
	    .maps = view->maps,
	    .n_maps = view->n_maps,
	};
}
