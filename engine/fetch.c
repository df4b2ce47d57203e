/* Expert post-fetch on the device interface: the scratchpad, the private copy streams, one event
 * per slot, and the accounting behind the post-fetch metrics.
 *
 * A step (one MoE layer of one decode) issues the copies of the selected experts' down
 * projections into consecutive slots right after routing; gate and up compute meanwhile; then
 * each expert asks for its copy (wf__fetch_ready): blocking waits on the slot's event, the
 * non-blocking policy takes the copy only if its event has completed. The scratchpad is reused by
 * the next step: its copies go to the same streams, so they queue behind any copy of this step
 * still in flight, and a slot is read only after its event completed. */
#include "engine/engine_internal.h"

#include "base/error.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define FETCH_STREAMS_DEDICATED 4u

struct wf__fetch {
	struct wf_device *dev;
	struct wf_postfetch_settings s;
	uint8_t *scratch; /* device memory */
	size_t slot_bytes;
	uint32_t n_slots, n_streams;
	struct wf_device_stream *streams[FETCH_STREAMS_DEDICATED];
	struct wf_device_event **ev;    /* per slot */
	struct wf_device_event *start;  /* timing: recorded before a step's first copy */
	int32_t last_slot[FETCH_STREAMS_DEDICATED]; /* this step's last slot per stream, -1 */
	/* this step */
	uint32_t issued;
	uint64_t step_wait0; /* st.wait_ns when it began */
	bool *failed; /* per slot: the copy could not be queued */
	struct wf__fetch_stats st;
};

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int wf__fetch_create(struct wf_device *dev, const struct wf_postfetch_settings *s,
                     size_t slot_bytes, uint32_t auto_slots, struct wf__fetch **ret,
                     struct wf_diag *diag)
{
	if (wf_device_kind(dev) != WF_DEVICE_KIND_HOST)
		return wf_diag_set(diag, WF_EUNSUPPORTED,
		                   "post-fetch computes fetched experts with the host device's "
		                   "kernels only: the CUDA engine is not built yet (set "
		                   "WF_POSTFETCH_ENABLE=0 or WF_POSTFETCH_FORCE_CPU=1)");
	struct wf__fetch *f = calloc(1, sizeof(*f));
	if (!f)
		return wf_diag_set(diag, -ENOMEM, "post-fetch");
	f->dev = dev;
	f->s = *s;
	f->slot_bytes = (slot_bytes + 255u) & ~(size_t)255u;
	uint64_t n = auto_slots;
	if (s->scratchpad_mb) {
		n = ((uint64_t)s->scratchpad_mb << 20) / f->slot_bytes;
		if (n == 0) {
			free(f);
			return wf_diag_set(diag, WF_EINVAL,
			                   "WF_POSTFETCH_SCRATCHPAD_MB=%u holds no expert's down "
			                   "projection (%zu bytes)",
			                   s->scratchpad_mb, slot_bytes);
		}
		if (n > auto_slots)
			n = auto_slots; /* more than a step can use */
	}
	if (s->max_transfers && n > s->max_transfers)
		n = s->max_transfers;
	f->n_slots = (uint32_t)n;
	f->n_streams = s->dedicated_streams ? FETCH_STREAMS_DEDICATED : 1u;
	if (f->n_streams > f->n_slots)
		f->n_streams = f->n_slots;
	int rc;
	f->ev = calloc(f->n_slots, sizeof(*f->ev));
	f->failed = calloc(f->n_slots, sizeof(*f->failed));
	if (!f->ev || !f->failed) {
		rc = wf_diag_set(diag, -ENOMEM, "post-fetch");
		goto fail;
	}
	if ((rc = wf_device_mem_alloc(dev, f->slot_bytes * f->n_slots, (void **)&f->scratch,
	                              diag)) < 0)
		goto fail;
	for (uint32_t i = 0; i < f->n_streams; i++)
		if ((rc = wf_device_stream_create(dev, &f->streams[i], diag)) < 0)
			goto fail;
	for (uint32_t i = 0; i < f->n_slots; i++)
		if ((rc = wf_device_event_create(dev, WF_DEVICE_EVENT_TIMING, &f->ev[i], diag)) < 0)
			goto fail;
	if ((rc = wf_device_event_create(dev, WF_DEVICE_EVENT_TIMING, &f->start, diag)) < 0)
		goto fail;
	f->st.scratchpad_bytes = (uint64_t)f->slot_bytes * f->n_slots;
	*ret = f;
	return 0;
fail:
	wf__fetch_destroy(f);
	return rc;
}

void wf__fetch_destroy(struct wf__fetch *f)
{
	if (!f)
		return;
	for (uint32_t i = 0; i < FETCH_STREAMS_DEDICATED; i++)
		if (f->streams[i])
			(void)wf_device_stream_synchronize(f->streams[i], NULL);
	if (f->ev)
		for (uint32_t i = 0; i < f->n_slots; i++)
			wf_device_event_destroy(f->ev[i]);
	wf_device_event_destroy(f->start);
	for (uint32_t i = 0; i < FETCH_STREAMS_DEDICATED; i++)
		wf_device_stream_destroy(f->streams[i]);
	if (f->scratch)
		(void)wf_device_mem_free(f->dev, f->scratch, NULL);
	free(f->ev);
	free(f->failed);
	free(f);
}

uint32_t wf__fetch_issue(struct wf__fetch *f, uint32_t n, const void *const *src,
                         const size_t *bytes)
{
	f->issued = n < f->n_slots ? n : f->n_slots;
	f->step_wait0 = f->st.wait_ns;
	for (uint32_t i = 0; i < FETCH_STREAMS_DEDICATED; i++)
		f->last_slot[i] = -1;
	if (f->issued)
		(void)wf_device_event_record(f->start, f->streams[0], NULL);
	for (uint32_t i = 0; i < f->issued; i++) {
		struct wf_device_stream *st = f->streams[i % f->n_streams];
		f->failed[i] = wf_device_memcpy_async(st, f->scratch + (size_t)i * f->slot_bytes, src[i],
		                                      bytes[i], WF_DEVICE_COPY_H2D, NULL) < 0 ||
		               wf_device_event_record(f->ev[i], st, NULL) < 0;
		if (f->failed[i]) {
			f->st.errors++;
			continue;
		}
		f->last_slot[i % f->n_streams] = (int32_t)i;
		f->st.experts++;
		f->st.bytes += bytes[i];
	}
	return f->issued;
}

const void *wf__fetch_ready(struct wf__fetch *f, uint32_t slot)
{
	if (slot >= f->issued)
		return NULL; /* not fetched this step (max_transfers, scratchpad): the CPU's */
	if (f->failed[slot]) {
		f->st.fallbacks++;
		return NULL;
	}
	int rc = wf_device_event_query(f->ev[slot], NULL);
	if (rc == -EAGAIN && f->s.block_on_miss) {
		const uint64_t t0 = now_ns();
		rc = wf_device_event_synchronize(f->ev[slot], NULL);
		f->st.wait_ns += now_ns() - t0;
	}
	if (rc < 0) { /* still pending (non-blocking policy), or a device error */
		f->st.errors += rc != -EAGAIN;
		f->st.fallbacks++;
		return NULL;
	}
	f->st.used++;
	return f->scratch + (size_t)slot * f->slot_bytes;
}

void wf__fetch_end_step(struct wf__fetch *f)
{
	if (!f->issued)
		return;
	/* The step's copy time, start to the last copy of every stream, when they have all
	 * completed (a copy the non-blocking policy did not wait for may not have). */
	double ms = 0;
	for (uint32_t s = 0; s < f->n_streams; s++) {
		if (f->last_slot[s] < 0)
			continue;
		double m;
		if (wf_device_event_elapsed_ms(f->start, f->ev[f->last_slot[s]], &m, NULL) < 0)
			return;
		ms = m > ms ? m : ms;
	}
	f->st.steps_timed++;
	f->st.copy_ns += (uint64_t)(ms * 1e6);
	f->st.wait_ns_timed += f->st.wait_ns - f->step_wait0;
}

void wf__fetch_get_stats(const struct wf__fetch *f, struct wf__fetch_stats *ret)
{
	*ret = f->st;
}

void wf__fetch_reset_stats(struct wf__fetch *f)
{
	const uint64_t sp = f->st.scratchpad_bytes;
	memset(&f->st, 0, sizeof(f->st));
	f->st.scratchpad_bytes = sp;
}
