/* Expert slots on the device: the post-fetch scratchpad and the device expert cache are one
 * mechanism, a set of device-memory slots each holding one expert's down projection (and, in the
 * cache of an engine whose device computes the dense part, its gate and up: whole; exec.c says
 * why), keyed by (layer, expert), with private copy streams and one event per slot.
 *
 * A step (one MoE layer of one decode) looks up each selected expert right after routing. A hit
 * (the cache kept it from an earlier step) needs no copy. A miss takes a free slot or, among the
 * slots this step does not use, the one whose expert has the lowest LRFU score (base/lru.h: uses
 * decayed by half every WF_ENGINE_CACHE_HALF_LIFE tokens), and queues the copy from the floor there
 * (post-fetch is the cache's miss path). Why LRFU and not the budgets' LRU: with fewer slots than
 * one token's working set (layers x experts used), LRU evicts each layer's experts for the other
 * layers' just before the next token needs them, and hits nothing; measured on routing traces
 * with `wf-bench cachepolicy` (docs/BENCHMARKS.md, "Expert cache policy"). Without a cache
 * (expert_cache_mb 0) the slots are the scratchpad: every step forgets what the last one fetched.
 *
 * Waiting. The device reads a slot after its copy in stream order (wf__fetch_use makes the
 * reader's stream wait for the slot's event), so no host thread spins per expert; the CPU's
 * share of the step runs meanwhile, and one host wait per copy stream afterwards
 * (wf__fetch_settle) learns whether a copy failed after its reader was queued (the engine then
 * recomputes those rows on the CPU). A slot is refilled only behind the device's last read of
 * the slots (wf__fetch_readers_done records an event the copy streams wait on), so a queued
 * kernel never reads a slot that a later step's copy overwrites. Copies of a later step go to
 * the same streams, so they queue behind any copy still in flight. */
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
	bool cache;   /* slots persist across steps */
	uint8_t *mem; /* device memory, n_slots * slot_bytes */
	size_t slot_bytes;
	uint32_t n_slots, n_streams;
	uint32_t n_expert;
	struct slot *slots;
	_Atomic uint64_t *akey;      /* per slot: its key, for readers on other threads */
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
	size_t off_g, off_u;             /* whole slots: gate's and up's offsets in a slot */
	struct wf_device_event *start;   /* timing: recorded before a step's first copy */
	struct wf_device_event *readers; /* the device's last read of the slots */
	bool readers_pending;            /* recorded since the copy streams last waited on it */
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

static void set_key(struct wf__fetch *f, uint32_t slot, uint64_t key)
{
	f->slots[slot].key = key;
	atomic_store_explicit(&f->akey[slot], key, memory_order_relaxed);
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
	f->slot_bytes = (shape->slot_bytes + 255u) & ~(size_t)255u;
	f->whole = shape->whole && shape->cache_mb;
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
			const size_t slot = f->slot_bytes;
			free(f);
			return wf_diag_set(diag, WF_EINVAL,
			                   "%s of %llu MiB holds no expert (%zu bytes a slot)",
			                   what, (unsigned long long)mb, slot);
		}
		const uint64_t all = (uint64_t)shape->n_layer * shape->n_expert;
		if (n > (f->cache ? all : shape->step_experts))
			n = f->cache ? all : shape->step_experts; /* more than could ever be used */
	}
	f->n_slots = (uint32_t)n;
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
	f->akey = calloc(f->n_slots, sizeof(*f->akey));
	f->lru = calloc(f->n_slots, sizeof(*f->lru));
	f->ev = calloc(f->n_slots, sizeof(*f->ev));
	f->ev_whole = calloc(f->n_slots, sizeof(*f->ev_whole));
	f->slot_of_key = malloc(f->n_keys * sizeof(*f->slot_of_key));
	f->score = calloc(f->n_keys, sizeof(*f->score));
	f->value = calloc(f->n_slots, sizeof(*f->value));
	f->lambda = 1.0 / (WF_ENGINE_CACHE_HALF_LIFE * (shape->n_layer ? shape->n_layer : 1));
	if (!f->slots || !f->akey || !f->lru || !f->ev || !f->ev_whole || !f->slot_of_key ||
	    !f->score || !f->value) {
		rc = wf_diag_set(diag, -ENOMEM, "post-fetch");
		goto fail;
	}
	for (uint64_t k = 0; k < f->n_keys; k++)
		f->slot_of_key[k] = -1;
	for (uint32_t i = 0; i < f->n_slots; i++) {
		set_key(f, i, NO_KEY);
		f->value[i] = -INFINITY;
		f->lru[i].bytes = f->slot_bytes;
	}
	if ((rc = wf_device_mem_alloc(dev, f->slot_bytes * f->n_slots, (void **)&f->mem, diag)) < 0)
		goto fail;
	for (uint32_t i = 0; i < f->n_streams; i++)
		if ((rc = wf_device_stream_create(dev, &f->streams[i], diag)) < 0)
			goto fail;
	/* Blocking-sync events: the one host wait per step (settle) sleeps rather than spins. */
	const unsigned evf = WF_DEVICE_EVENT_TIMING | WF_DEVICE_EVENT_BLOCKING_SYNC;
	for (uint32_t i = 0; i < f->n_slots; i++)
		if ((rc = wf_device_event_create(dev, evf, &f->ev[i], diag)) < 0 ||
		    (f->whole && (rc = wf_device_event_create(dev, 0, &f->ev_whole[i], diag)) < 0))
			goto fail;
	if ((rc = wf_device_event_create(dev, evf, &f->start, diag)) < 0 ||
	    (rc = wf_device_event_create(dev, 0, &f->readers, diag)) < 0)
		goto fail;
	f->st.scratchpad_bytes = (uint64_t)f->slot_bytes * f->n_slots;
	*ret = f;
	return 0;
fail:
	wf__fetch_destroy(f);
	return rc;
}

static void sync_streams(struct wf__fetch *f)
{
	for (uint32_t i = 0; i < FETCH_STREAMS_DEDICATED; i++)
		if (f->streams[i])
			(void)wf_device_stream_synchronize(f->streams[i], NULL);
}

void wf__fetch_destroy(struct wf__fetch *f)
{
	if (!f)
		return;
	sync_streams(f);
	if (f->ev)
		for (uint32_t i = 0; i < f->n_slots; i++)
			wf_device_event_destroy(f->ev[i]);
	if (f->ev_whole)
		for (uint32_t i = 0; i < f->n_slots; i++)
			wf_device_event_destroy(f->ev_whole[i]);
	wf_device_event_destroy(f->start);
	wf_device_event_destroy(f->readers);
	for (uint32_t i = 0; i < FETCH_STREAMS_DEDICATED; i++)
		wf_device_stream_destroy(f->streams[i]);
	if (f->mem)
		(void)wf_device_mem_free(f->dev, f->mem, NULL);
	free(f->slots);
	free(f->akey);
	free(f->lru);
	free(f->ev);
	free(f->ev_whole);
	free(f->slot_of_key);
	free(f->score);
	free(f->value);
	free(f);
}

static void forget(struct wf__fetch *f, uint32_t slot)
{
	if (f->slots[slot].key != NO_KEY)
		f->slot_of_key[f->slots[slot].key] = -1;
	set_key(f, slot, NO_KEY);
	f->slots[slot].whole = false;
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

/* A hit: whole once gate and up have landed, the down projection too (a failed copy of it
 * reports on its own event only); until then the down projection only. A failed gate/up copy is
 * queued again by the step. */
static bool hit_whole(struct wf__fetch *f, uint32_t slot)
{
	if (!f->slots[slot].whole)
		return false;
	const int q = wf_device_event_query(f->ev_whole[slot], NULL);
	if (q == 0 && wf_device_event_query(f->ev[slot], NULL) == 0) {
		f->st.whole++;
		return true;
	}
	if (q < 0 && q != -EAGAIN) {
		f->slots[slot].whole = false;
		f->st.errors++;
	}
	return false;
}

void wf__fetch_step(struct wf__fetch *f, uint32_t layer, uint32_t n, const uint32_t *experts,
                    const struct wf__fetch_src *src, int32_t *ret_slot, bool *ret_whole)
{
	f->stamp++;
	f->step_copies = 0;
	f->step_wait0 = f->st.wait_ns;
	for (uint32_t s = 0; s < FETCH_STREAMS_DEDICATED; s++)
		f->last_slot[s] = -1;
	if (!f->cache) /* the scratchpad: nothing survives a step */
		for (uint32_t i = 0; i < f->n_slots; i++)
			forget(f, i);
	for (uint32_t i = 0; i < f->n_slots; i++)
		f->lru[i].busy = false;
	bool started = false;
	for (uint32_t i = 0; i < n; i++) {
		const uint64_t key = (uint64_t)layer * f->n_expert + experts[i];
		int32_t slot = f->slot_of_key[key];
		ret_whole[i] = false;
		wf_lrfu_touch(&f->score[key], f->stamp, f->lambda);
		if (slot >= 0)
			f->value[slot] = wf_lrfu_rank(&f->score[key], f->lambda);
		if (slot >= 0 && !f->slots[slot].failed) {
			f->st.hits++;
			f->lru[slot].busy = true;
			f->lru[slot].last_used = f->stamp;
			ret_slot[i] = slot;
			ret_whole[i] = f->whole && hit_whole(f, (uint32_t)slot);
			continue;
		}
		f->st.misses++;
		ret_slot[i] = -1;
		if (f->s.max_transfers && f->step_copies >= f->s.max_transfers)
			continue;
		/* An empty slot first, else the lowest rank among those this step does not use
		 * (ranks change only with their key's use: nothing to decay here). */
		const size_t victim = wf_lrfu_victim(f->lru, f->value, f->n_slots);
		if (victim >= f->n_slots)
			continue; /* every slot holds an expert of this step */
		slot = (int32_t)victim;
		forget(f, (uint32_t)slot);
		if (!started) {
			/* Behind the device's last read of the slots, and timed from here. */
			if (f->readers_pending) {
				for (uint32_t s = 0; s < f->n_streams; s++)
					(void)wf_device_stream_wait_event(f->streams[s], f->readers,
					                                  NULL);
				f->readers_pending = false;
			}
			(void)wf_device_event_record(f->start, f->streams[0], NULL);
			started = true;
		}
		struct slot *sl = &f->slots[slot];
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
		set_key(f, (uint32_t)slot, key);
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
		if (slot < 0 || f->slots[slot].whole || f->lru[slot].last_used != f->stamp ||
		    ret_whole[i] || !src[i].g || !src[i].u)
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

static int fallback(struct wf__fetch *f, uint32_t slot, int rc)
{
	if (rc != -EAGAIN) {
		f->st.errors++;
		forget(f, slot); /* its bytes are not to be trusted */
	}
	f->st.fallbacks++;
	return rc;
}

int wf__fetch_use(struct wf__fetch *f, int32_t slot, struct wf_device_stream *reader,
                  bool reader_waits_on_host)
{
	if (slot < 0)
		return WF_EINVAL;
	int rc = wf_device_event_query(f->ev[slot], NULL);
	if (rc == -EAGAIN && f->s.block_on_miss) {
		/* A reader that computes in the calling thread (the host device's backend) blocks
		 * the host for the copy when it runs: that wait is timed here, for the overlap
		 * figure. Its outcome is left to the reader's stream wait and wf__fetch_settle, as
		 * a device's would be. */
		if (reader_waits_on_host) {
			const uint64_t t0 = now_ns();
			(void)wf_device_event_synchronize(f->ev[slot], NULL);
			f->st.wait_ns += now_ns() - t0;
		}
		rc = wf_device_stream_wait_event(reader, f->ev[slot], NULL);
	}
	if (rc < 0) /* still in flight under the non-blocking policy, or a device error */
		return fallback(f, (uint32_t)slot, rc);
	f->st.used++;
	return 0;
}

bool wf__fetch_settle(struct wf__fetch *f, uint32_t n, const int32_t *slots, bool *ret_bad)
{
	const uint64_t t0 = now_ns();
	/* The step's last copy of each stream: the copies before it on the stream are done too. */
	for (uint32_t s = 0; s < f->n_streams; s++)
		if (f->last_slot[s] >= 0)
			(void)wf_device_event_synchronize(f->ev[f->last_slot[s]], NULL);
	bool good = true;
	for (uint32_t i = 0; i < n; i++) {
		int rc = wf_device_event_query(f->ev[slots[i]], NULL);
		if (rc == -EAGAIN) /* a hit whose copy (an earlier step's) is still landing */
			rc = wf_device_event_synchronize(f->ev[slots[i]], NULL);
		ret_bad[i] = rc != 0;
		if (rc != 0) {
			good = false;
			f->st.used--;
			(void)fallback(f, (uint32_t)slots[i], rc < 0 ? rc : WF_EDEVICE);
		}
	}
	f->st.wait_ns += now_ns() - t0;
	return good;
}

void wf__fetch_readers_done(struct wf__fetch *f, struct wf_device_stream *reader,
                            bool reader_waits_on_host)
{
	/* On the host device a marker on the reader's stream costs its next op a round trip
	 * through the stream's thread, per layer, for reads that are already over: measured, 8
	 * times the context switches of a 512-token decode with a cache of down projections, and
	 * cache25_vs_cpu_experts 0.94 of the engine this one replaced instead of 1.01. */
	if (reader_waits_on_host)
		return;
	if (wf_device_event_record(f->readers, reader, NULL) == 0)
		f->readers_pending = true;
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

void wf__fetch_forget_layer(struct wf__fetch *f, uint32_t layer)
{
	sync_streams(f);
	for (uint32_t i = 0; i < f->n_slots; i++)
		if (f->slots[i].key != NO_KEY && f->slots[i].key / f->n_expert == layer)
			forget(f, i);
}

uint32_t wf__fetch_n_slots(const struct wf__fetch *f)
{
	return f->n_slots;
}

uint32_t wf__fetch_keys(const struct wf__fetch *f, uint32_t *ret_keys, uint32_t max)
{
	uint32_t n = 0;
	for (uint32_t i = 0; i < f->n_slots; i++) {
		const uint64_t k = atomic_load_explicit(&f->akey[i], memory_order_relaxed);
		if (k == NO_KEY)
			continue;
		if (n < max)
			ret_keys[n] = (uint32_t)((k / f->n_expert) << 16 | (k % f->n_expert));
		n++;
	}
	return n;
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
