#include "shm/fill.h"

#include "base/error.h"

#include <errno.h>
#include <stdlib.h>

int wf_shm_fill_from_files(void *ctx, const struct wf_shm_fill *job, struct wf_diag *diag)
{
	const struct wf_shm_fill_io *fi = ctx;
	struct wf_io_reader *rd = NULL;
	struct wf_io_copy_job *jobs = calloc(job->n_files ? job->n_files : 1, sizeof(*jobs));
	if (!jobs)
		return -ENOMEM;
	int rc = wf_io_reader_create(&fi->io, &rd);
	if (rc < 0) {
		wf_diag_set(diag, rc, "io reader: %s", wf_strerror(rc));
		goto out;
	}
	uint64_t total = 0;
	for (uint32_t i = 0; i < job->n_files; i++) {
		const struct wf_shm_fill_file *ff = &job->files[i];
		struct wf_io_file *file = NULL;
		rc = wf_io_file_open(rd, ff->path, 0, &file);
		if (rc < 0) {
			wf_diag_set(diag, rc, "%s: %s", ff->path, wf_strerror(rc));
			goto out;
		}
		struct wf_io_file_info info;
		wf_io_file_info(file, &info);
		if (info.size != ff->file_size || info.mtime_ns != ff->mtime_ns) {
			rc = wf_diag_set(diag, WF_ECHANGED,
					 "%s changed since it was inventoried (size %llu, now %llu)",
					 ff->path, (unsigned long long)ff->file_size,
					 (unsigned long long)info.size);
			goto out;
		}
		jobs[i] = (struct wf_io_copy_job){
			.file = file, .offset = ff->src_offset, .len = ff->copy_length, .dst = ff->dst};
		total += ff->copy_length;
	}
	if (fi->before_copy)
		fi->before_copy(fi->before_copy_ctx, total);
	struct wf_io_copy_ctl ctl = {
		.progress = fi->progress, .progress_ctx = fi->progress_ctx, .cancel = fi->cancel};
	rc = wf_io_copy_many(rd, jobs, job->n_files, &ctl);
	if (rc < 0) {
		const char *path = NULL;
		for (uint32_t i = 0; i < job->n_files && !path; i++)
			if (jobs[i].result == rc)
				path = job->files[i].path;
		const char *why = rc == WF_ECHANGED	? "changed during materialization"
				  : rc == WF_ETRUNCATED ? "truncated during materialization"
				  : rc == WF_ECANCELED	? "materialization cancelled"
							: wf_strerror(rc);
		if (path)
			wf_diag_set(diag, rc, "%s: %s", path, why);
		else
			wf_diag_set(diag, rc, "%s", why);
	}
out:
	wf_io_reader_destroy(rd); /* closes the files */
	free(jobs);
	return rc;
}
