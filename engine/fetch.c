/* Expert slots on the device: the post-fetch scratchpad and the device expert cache are one
 * mechanism, a set of device-memory slots each holding one expert's down projection, keyed by
 * (layer, expert), with the private copy streams and one event per slot.
 *
 * A step (one MoE layer of one decode) looks up each selected expert right after routing. A hit
 * (the cache kept it from an earlier step) needs no copy. A miss takes a free slot or, among the
 * slots this step does not use, the one whose expert has the lowest LRFU score (base/lru.h: uses
 * decayed by half every WF__FETCH_LRFU_HALF_LIFE tokens), and queues the copy from the floor there
 * (post-fetch is the cache's miss path). Why LRFU and not the budgets' LRU: with fewer slots than
 * one token's working set (layers x experts used), LRU evicts each layer's experts for the other
 * layers' just before the next token needs them, and hits nothing; measured on routing traces
 * with `wf-bench cachepolicy` (docs/BENCHMARKS.md, "Expert cache policy"). Gate and up compute
 * meanwhile; then each expert asks for its slot (wf__fetch_ready): the blocking policy waits on
 * the slot's event, the non-blocking one takes it only if the copy has completed, else the CPU
 * computes that expert from the floor. Without a cache (expert_cache_mb 0) the slots are the
 * scratchpad: every step forgets what the last one fetched. Copies of a later step go to the same
 * streams, so they queue behind any copy still in flight, and a slot is read only after its
 * event completed. */
#include "engine/engine_internal.h"

#include "base/error.h"
#include "base/lru.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define FETCH_STREAMS_DEDICATED 4u
#define NO_KEY                  UINT64_MAX

struct slot {
	uint64_t key; /* layer * n_expert + expert, NO_KEY: empty */
	bool failed;  /* its last copy could not be queued */
	bool whole;   /* gate and up were queued after the down projection */
};

struct wf__fetch {
	struct wf_device *dev;
	struct wf_postfetch_settings s;
	bool cache;                    /* slots persist across steps */
	bool postfetch;                /* misses are copied */
	uint32_t n_resident, n_pinned; /* slots [0, n_resident) hold resident experts */
	uint8_t *mem;                  /* device memory, n_slots * slot_bytes */
	size_t slot_bytes;
	uint32_t n_slots, n_streams;
	uint32_t n_expert;
	struct slot *slots;
	struct wf_lru_item *lru;     /* per slot, for base/lru.h */
	int32_t *slot_of_key;        /* [n_layer * n_expert]: slot, -1 */
	struct wf_lrfu_score *score; /* [n_layer * n_expert]: kept when evicted */
	double lambda;               /* decay per step: 1 / (half-life x layers) */
	double *value;               /* per slot: its expert's LRFU rank, -INFINITY empty */
	uint64_t n_keys;
	uint64_t stamp;
	struct wf_device_stream *streams[FETCH_STREAMS_DEDICATED];
	struct wf_device_event **ev;       /* per slot: its down projection landed */
	struct wf_device_event **ev_whole; /* per slot: gate and up landed too (whole slots) */
	bool whole;
	size_t off_g, off_u;           /* whole slots: gate's and up's offsets in a slot */
	struct wf_device_event *start; /* timing: recorded before a step's first copy */
	int32_t last_slot[FETCH_STREAMS_DEDICATED]; /* this step's last copy per stream, -1 */
	uint32_t step_copies;
	uint64_t step_wait0;
	struct wf__fetch_stats st;
};

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int wf__fetch_create(struct wf_device *dev, const struct wf_postfetch_settings *s,
                     const struct wf__fetch_shape *shape, struct wf__fetch **ret,
                     struct wf_diag *diag)
{
	struct wf__fetch *f = calloc(1, sizeof(*f));
	if (!f)
		return wf_diag_set(diag, -ENOMEM, "post-fetch");
	f->dev = dev;
	f->s = *s;
	f->n_expert = shape->n_expert;
	f->postfetch = shape->postfetch;
	f->n_resident = shape->n_resident;
	f->slot_bytes = (shape->slot_bytes + 255u) & ~(size_t)255u;
	f->whole = shape->whole && shape->cache_mb && shape->postfetch;
	if (f->whole) { /* [down | gate | up], each 256-byte aligned */
		f->off_g = f->slot_bytes;
		f->off_u = f->off_g + ((shape->max_g + 255u) & ~(size_t)255u);
		f->slot_bytes = f->off_u + ((shape->max_u + 255u) & ~(size_t)255u);
	}
	uint64_t n = shape->step_experts;
	const char *what = "WF_POSTFETCH_SCRATCHPAD_MB";
	uint64_t mb = s->scratchpad_mb;
	if (shape->cache_mb) {
		f->cache = true;
		what = "the expert cache";
		mb = shape->cache_mb;
	}
	if (mb) {
		n = (mb << 20) / f->slot_bytes;
		if (n == 0) {
			free(f);
			return wf_diag_set(
			    diag, WF_EINVAL,
			    "%s of %llu MiB holds no expert's down projection (%zu bytes)", what,
			    (unsigned long long)mb, shape->slot_bytes);
		}
		const uint64_t all = (uint64_t)shape->n_layer * shape->n_expert;
		if (n > (f->cache ? all : shape->step_experts))
			n = f->cache ? all : shape->step_experts; /* more than could ever be used */
	}
	if (!f->postfetch)
		n = 0; /* no copies: the resident slots only */
	f->n_slots = (uint32_t)n + f->n_resident;
	if (f->n_slots == 0) {
		free(f);
		return wf_diag_set(diag, WF_EINVAL, "expert slots: none to make");
	}
	f->n_streams = s->dedicated_streams ? FETCH_STREAMS_DEDICATED : 1u;
	if (f->n_streams > f->n_slots)
		f->n_streams = f->n_slots;
	f->n_keys = (uint64_t)shape->n_layer * shape->n_expert;
	int rc;
	f->slots = calloc(f->n_slots, sizeof(*f->slots));
	f->lru = calloc(f->n_slots, sizeof(*f->lru));
	f->ev = calloc(f->n_slots, sizeof(*f->ev));
	f->ev_whole = calloc(f->n_slots, sizeof(*f->ev_whole));
	f->slot_of_key = malloc(f->n_keys * sizeof(*f->slot_of_key));
	f->score = calloc(f->n_keys, sizeof(*f->score));
	f->value = calloc(f->n_slots, sizeof(*f->value));
	f->lambda = 1.0 / (WF__FETCH_LRFU_HALF_LIFE * (shape->n_layer ? shape->n_layer : 1));
	if (!f->slots || !f->lru || !f->ev || !f->ev_whole || !f->slot_of_key || !f->score ||
	    !f->value) {
		rc = wf_diag_set(diag, -ENOMEM, "post-fetch");
		goto fail;
	}
	for (uint64_t k = 0; k < f->n_keys; k++)
		f->slot_of_key[k] = -1;
	for (uint32_t i = 0; i < f->n_slots; i++) {
		f->slots[i].key = NO_KEY;
		f->value[i] = -INFINITY;
		f->lru[i].bytes = f->slot_bytes;
		f->lru[i].pinned = i < f->n_resident;
	}
	if ((rc = wf_device_mem_alloc(dev, f->slot_bytes * f->n_slots, (void **)&f->mem, diag)) < 0)
		goto fail;
	for (uint32_t i = 0; i < f->n_streams; i++)
		if ((rc = wf_device_stream_create(dev, &f->streams[i], diag)) < 0)
			goto fail;
	for (uint32_t i = 0; i < f->n_slots; i++)
		if ((rc = wf_device_event_create(dev, WF_DEVICE_EVENT_TIMING, &f->ev[i], diag)) <
		        0 ||
		    (f->whole && (rc = wf_device_event_create(dev, 0, &f->ev_whole[i], diag)) < 0))
			goto fail;
	if ((rc = wf_device_event_create(dev, WF_DEVICE_EVENT_TIMING, &f->start, diag)) < 0)
		goto fail;
	f->st.scratchpad_bytes = (uint64_t)f->slot_bytes * (f->n_slots - f->n_resident);
	f->st.resident_bytes = (uint64_t)f->slot_bytes * f->n_resident;
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
	if (f->ev_whole)
		for (uint32_t i = 0; i < f->n_slots; i++)
			wf_device_event_destroy(f->ev_whole[i]);
	wf_device_event_destroy(f->start);
	for (uint32_t i = 0; i < FETCH_STREAMS_DEDICATED; i++)
		wf_device_stream_destroy(f->streams[i]);
	if (f->mem)
		(void)wf_device_mem_free(f->dev, f->mem, NULL);
	free(f->slots);
	free(f->lru);
	free(f->ev);
	free(f->ev_whole);
	free(f->slot_of_key);
	free(f->score);
	free(f->value);
	free(f);
}

int wf__fetch_pin(struct wf__fetch *f, uint32_t layer, uint32_t expert, const void *src,
                  size_t bytes, struct wf_diag *diag)
{
	if (f->n_pinned >= f->n_resident || bytes > f->slot_bytes)
		return wf_diag_set(diag, WF_EINVAL, "resident expert slots exhausted");
	const uint32_t slot = f->n_pinned;
	struct wf_device_stream *st = f->streams[slot % f->n_streams];
	int rc = wf_device_memcpy_async(st, f->mem + (size_t)slot * f->slot_bytes, src, bytes,
	                                WF_DEVICE_COPY_H2D, diag);
	if (rc == 0)
		rc = wf_device_event_record(f->ev[slot], st, diag);
	if (rc == 0)
		rc = wf_device_event_synchronize(f->ev[slot], diag);
	if (rc < 0)
		return rc;
	const uint64_t key = (uint64_t)layer * f->n_expert + expert;
	f->slots[slot].key = key;
	f->slot_of_key[key] = (int32_t)slot;
	f->n_pinned++;
	return 0;
}

static void forget(struct wf__fetch *f, uint32_t slot)
{
	if (f->slots[slot].key != NO_KEY)
		f->slot_of_key[f->slots[slot].key] = -1;
	f->slots[slot].key = NO_KEY;
	f->value[slot] = -INFINITY;
}

/* Queues the copy of src (bytes) into a slot at off, then records ev (when not NULL) on the
 * slot's stream: an event covers every copy queued since the slot's last one, so the failure of
 * any of them shows on it. */
static bool queue_copy(struct wf__fetch *f, uint32_t slot, size_t off, const void *src,
                       size_t bytes, struct wf_device_event *ev)
{
	/* A slot always takes its copies on the same stream: a copy into it that a non-blocking
	 * step did not wait for is then finished before the next one lands. */
	struct wf_device_stream *st = f->streams[slot % f->n_streams];
	return wf_device_memcpy_async(st, f->mem + (size_t)slot * f->slot_bytes + off, src, bytes,
	                              WF_DEVICE_COPY_H2D, NULL) == 0 &&
	       (!ev || wf_device_event_record(ev, st, NULL) == 0);
}

void wf__fetch_step(struct wf__fetch *f, uint32_t layer, uint32_t n, const uint32_t *experts,
                    const struct wf__fetch_src *src, int32_t *ret_slot, bool *ret_whole)
{
	f->stamp++;
	f->step_copies = 0;
	f->step_wait0 = f->st.wait_ns;
	for (uint32_t s = 0; s < FETCH_STREAMS_DEDICATED; s++)
		f->last_slot[s] = -1;
	if (!f->cache) /* the scratchpad: nothing survives a step (resident slots do) */
		for (uint32_t i = f->n_resident; i < f->n_slots; i++)
			forget(f, i);
	for (uint32_t i = 0; i < f->n_slots; i++)
		f->lru[i].busy = false;
	bool started = false;
	for (uint32_t i = 0; i < n; i++) {
		const uint64_t key = (uint64_t)layer * f->n_expert + experts[i];
		int32_t slot = f->slot_of_key[key];
		if (ret_whole)
			ret_whole[i] = false;
		if (slot >= 0 && (uint32_t)slot < f->n_resident) {
			f->st.resident++;
			ret_slot[i] = slot;
			continue;
		}
		wf_lrfu_touch(&f->score[key], f->stamp, f->lambda);
		if (slot >= 0)
			f->value[slot] = wf_lrfu_rank(&f->score[key], f->lambda);
		if (slot >= 0 && !f->slots[slot].failed) {
			f->st.hits++;
			f->lru[slot].busy = true;
			f->lru[slot].last_used = f->stamp;
			ret_slot[i] = slot;
			/* Whole once gate and up have landed, the down projection too (a failed
			 * copy of it reports on its own event only); until then the down projection
			 * only. A failed gate/up copy is queued again below. */
			if (ret_whole && f->slots[slot].whole) {
				const int q = wf_device_event_query(f->ev_whole[slot], NULL);
				if (q == 0 && wf_device_event_query(f->ev[slot], NULL) == 0) {
					ret_whole[i] = true;
					f->st.whole++;
				} else if (q < 0 && q != -EAGAIN) {
					f->slots[slot].whole = false;
					f->st.errors++;
				}
			}
			continue;
		}
		f->st.misses++;
		ret_slot[i] = -1;
		if (!f->postfetch || (f->s.max_transfers && f->step_copies >= f->s.max_transfers))
			continue;
		/* An empty slot first, else the lowest rank among those this step does not use
		 * (ranks change only with their key's use: nothing to decay here). */
		const size_t victim = wf_lrfu_victim(f->lru, f->value, f->n_slots);
		if (victim >= f->n_slots)
			continue; /* every slot holds an expert of this step */
		slot = (int32_t)victim;
		forget(f, (uint32_t)slot);
		if (!started) {
			(void)wf_device_event_record(f->start, f->streams[0], NULL);
			started = true;
		}
		struct slot *sl = &f->slots[slot];
		sl->whole = false;
		sl->failed =
		    !queue_copy(f, (uint32_t)slot, 0, src[i].d, src[i].d_bytes, f->ev[slot]);
		f->lru[slot].busy = true;
		f->lru[slot].last_used = f->stamp;
		f->step_copies++;
		if (sl->failed) {
			f->st.errors++;
			f->st.fallbacks++;
			continue; /* the slot stays empty; the CPU computes this expert */
		}
		sl->key = key;
		f->slot_of_key[key] = slot;
		f->value[slot] = wf_lrfu_rank(&f->score[key], f->lambda);
		f->last_slot[slot % f->n_streams] = slot;
		f->st.experts++;
		f->st.bytes += src[i].d_bytes;
		ret_slot[i] = slot;
	}
	if (!f->whole)
		return;
	/* Gate and up of this step's copies, behind every down projection of the step: the
	 * copies this step waits for land first, the rest serves the steps after. */
	for (uint32_t i = 0; i < n; i++) {
		const int32_t slot = ret_slot[i];
		if (slot < 0 || (uint32_t)slot < f->n_resident || f->slots[slot].whole ||
		    f->lru[slot].last_used != f->stamp || (ret_whole && ret_whole[i]) ||
		    !src[i].g || !src[i].u)
			continue;
		if (f->slots[slot].key != (uint64_t)layer * f->n_expert + experts[i])
			continue;
		const bool ok =
		    queue_copy(f, (uint32_t)slot, f->off_g, src[i].g, src[i].g_bytes, NULL) &&
		    queue_copy(f, (uint32_t)slot, f->off_u, src[i].u, src[i].u_bytes,
		               f->ev_whole[slot]);
		if (!ok) {
			f->st.errors++;
			continue; /* the down projection stays usable; gate and up stay on the CPU
			           */
		}
		f->slots[slot].whole = true;
		f->st.bytes += src[i].g_bytes + src[i].u_bytes;
	}
}

void wf__fetch_stacks(const struct wf__fetch *f, const void **ret_d, const void **ret_g,
                      const void **ret_u, size_t *ret_stride)
{
	*ret_d = f->mem;
	*ret_g = f->mem + f->off_g;
	*ret_u = f->mem + f->off_u;
	*ret_stride = f->slot_bytes;
}

const void *wf__fetch_ready(struct wf__fetch *f, int32_t slot)
{
	if (slot < 0)
		return NULL;
	int rc = wf_device_event_query(f->ev[slot], NULL);
	if (rc == -EAGAIN && f->s.block_on_miss) {
		const uint64_t t0 = now_ns();
		rc = wf_device_event_synchronize(f->ev[slot], NULL);
		f->st.wait_ns += now_ns() - t0;
	}
	if (rc < 0) { /* still in flight under the non-blocking policy, or a device error */
		if (rc != -EAGAIN) {
			f->st.errors++;
			forget(f, (uint32_t)slot); /* its bytes are not to be trusted */
		}
		f->st.fallbacks++;
		return NULL;
	}
	f->st.used++;
	return f->mem + (size_t)slot * f->slot_bytes;
}

void wf__fetch_end_step(struct wf__fetch *f)
{
	if (!f->step_copies)
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
	const uint64_t sp = f->st.scratchpad_bytes, rb = f->st.resident_bytes;
	memset(&f->st, 0, sizeof(f->st));
	f->st.scratchpad_bytes = sp;
	f->st.resident_bytes = rb;
}
