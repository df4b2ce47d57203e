/* Blocking copies of large file ranges: the materializer's path.
 *
 * Each job becomes one internal request on the reader's shared queue, so several files stream
 * through the same queue depth; the calling thread pumps completions, reports progress and polls
 * the cancel flag between waits of at most POLL_NS. */
#include "io/internal.h"

#include "base/error.h"

#include <errno.h>
#include <stdlib.h>

#define POLL_NS (50 * 1000 * 1000LL)

static bool cancel_requested(const struct wf_io_copy_ctl *ctl)
{
	return ctl && ctl->cancel && __atomic_load_n(ctl->cancel, __ATOMIC_ACQUIRE);
}

/* The end check: a file that changed under the copy makes its bytes suspect even when every read
 * succeeded, and turns an early EOF into the more useful WF_ECHANGED. */
static int check_after(struct wf_io_copy_job *job)
{
	int ret;

	if (job->result != 0 && job->result != WF_ETRUNCATED)
		return job->result;
	ret = wf_io_file_check(job->file);
	if (ret < 0)
		return ret;
	return job->result;
}

static void fail_all(struct wf_io_reader *r, struct wf__io_req *reqs, size_t n, int err)
{
	for (size_t i = 0; i < n; i++)
		wf__io_req_fail(r, &reqs[i], err);
}

int wf_io_copy_many(struct wf_io_reader *r, struct wf_io_copy_job *jobs, size_t n,
                    const struct wf_io_copy_ctl *ctl)
{
	uint64_t interval =
	    ctl && ctl->progress_interval ? ctl->progress_interval : WF_IO_PROGRESS_DEFAULT;
	uint64_t total = 0, reported = 0, threshold;
	unsigned per_pump;
	struct wf__io_req *reqs;
	bool stopping = false, user_cancel = false;
	int ret = 0;

	if (!r || (n && !jobs))
		return WF_EINVAL;
	for (size_t i = 0; i < n; i++) {
		struct wf_io_copy_job *j = &jobs[i];
		if (!j->file || j->file->reader != r || j->file->closed || (j->len && !j->dst))
			return WF_EINVAL;
		if (j->offset + j->len < j->offset ||
		    (uintptr_t)j->dst + j->len < (uintptr_t)j->dst || total + j->len < total ||
		    j->len > SIZE_MAX)
			return WF_EOVERFLOW;
		total += j->len;
	}
	/* The start check: refuse before reading anything when a file already differs from what
	 * was opened, or is too short for its job. */
	for (size_t i = 0; i < n; i++) {
		struct wf_io_copy_job *j = &jobs[i];
		j->result = wf_io_file_check(j->file);
		if (j->result == 0 && j->offset + j->len > j->file->size)
			j->result = WF_ETRUNCATED;
		if (j->result < 0 && ret == 0)
			ret = j->result;
	}
	if (ret < 0) {
		for (size_t i = 0; i < n; i++)
			if (jobs[i].result == 0)
				jobs[i].result = WF_ECANCELED;
		return ret;
	}
	if (cancel_requested(ctl)) {
		for (size_t i = 0; i < n; i++)
			jobs[i].result = WF_ECANCELED;
		return WF_ECANCELED;
	}

	/* Each wakeup handles at most half an interval of chunks (P bytes), and a report is due
	 * once interval - P bytes have come in since the last: then reports are between half an
	 * interval and an interval apart (or one chunk apart when chunks exceed the interval). */
	per_pump = (unsigned)(interval / 2 / r->opts.chunk_size);
	if (!per_pump)
		per_pump = 1;
	threshold = interval > (uint64_t)per_pump * r->opts.chunk_size
	                ? interval - (uint64_t)per_pump * r->opts.chunk_size
	                : 1;

	reqs = calloc(n ? n : 1, sizeof(*reqs));
	if (!reqs)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		struct wf__io_req *q = &reqs[i];
		q->file = jobs[i].file;
		q->off = jobs[i].offset;
		q->len = jobs[i].len;
		q->dst = jobs[i].dst;
		q->job = &jobs[i];
		r->active_internal++;
		wf__io_req_start(r, q);
	}

	for (;;) {
		size_t left = 0;
		uint64_t done = 0;

		for (size_t i = 0; i < n; i++) {
			left += !reqs[i].completed;
			done += reqs[i].done;
			/* One failure fails the set: stop the others instead of reading on. */
			if (!stopping && reqs[i].completed && reqs[i].err) {
				stopping = true;
				fail_all(r, reqs, n, WF_ECANCELED);
			}
		}
		if (ctl && ctl->progress && done - reported >= threshold && done < total) {
			ctl->progress(ctl->progress_ctx, done, total);
			reported = done;
		}
		if (!left)
			break;
		if (!stopping && cancel_requested(ctl)) {
			stopping = user_cancel = true;
			fail_all(r, reqs, n, WF_ECANCELED);
			continue;
		}
		ret = wf__io_pump(r, POLL_NS, per_pump);
		if (ret < 0) {
			/* The backend is broken: fail everything and let reads in flight drain. If
			 * even that fails, reqs stays allocated since chunks may still point at it.
			 */
			fail_all(r, reqs, n, ret);
			stopping = true;
			for (int tries = 0; r->inflight && tries < 100; tries++)
				if (wf__io_pump(r, POLL_NS, per_pump) < 0)
					break;
			if (r->inflight)
				return ret;
		}
	}
	free(reqs);

	/* Result: the first real failure in array order; cancellation only when nothing else
	 * failed. */
	ret = 0;
	for (size_t i = 0; i < n; i++) {
		jobs[i].result = check_after(&jobs[i]);
		if (jobs[i].result < 0 && jobs[i].result != WF_ECANCELED && ret == 0)
			ret = jobs[i].result;
	}
	if (ret == 0) {
		for (size_t i = 0; i < n; i++)
			if (jobs[i].result < 0)
				ret = jobs[i].result;
	}
	if (ret == 0 && user_cancel)
		ret = WF_ECANCELED;
	if (ret == 0 && ctl && ctl->progress)
		ctl->progress(ctl->progress_ctx, total, total);
	return ret;
}

int wf_io_copy(struct wf_io_reader *r, struct wf_io_file *f, uint64_t offset, uint64_t len,
               void *dst, const struct wf_io_copy_ctl *ctl)
{
	struct wf_io_copy_job job = {.file = f, .offset = offset, .len = len, .dst = dst};

	return wf_io_copy_many(r, &job, 1, ctl);
}
