/* Moving bytes for the cache (worker/cache_internal.h): floor -> device or file -> device. */
#include "worker/cache_internal.h"

#include "base/error.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>

static uint64_t align_up(uint64_t v, uint64_t a)
{
	return (v + a - 1) & ~(a - 1);
}

/* Attaches the model's floor if floors are configured and a READY one exists. Never waits on a
 * materialization in progress (NOWAIT): loading from the files meanwhile is as fast as waiting.
 * Returns 0 or the attach error (also kept in floor_error). */
int wf__cache_floor_attach(struct wf_cache *c, struct model *m, struct wf_diag *diag)
{
	struct wf_shm_region *r = NULL;
	int ret;

	if (m->region)
		return 0;
	if (!c->have_shm)
		return wf_diag_set(diag, WF_EUNSUPPORTED,
		                   "model '%s': no floor directory configured", m->name);
	ret =
	    wf_shm_region_attach(&c->shm, &m->digest, m->model,
	                         WF_SHM_ATTACH_READER | WF_SHM_ATTACH_NOWAIT, NULL, NULL, &r, diag);
	pthread_mutex_lock(&c->lock);
	m->floor_error = ret;
	if (ret == 0) {
		m->region = r;
		m->register_failed = false;
		if (!resident(m))
			m->state = WF_RESIDENCY_HOST;
	}
	pthread_mutex_unlock(&c->lock);
	return ret;
}

/* Unregisters and detaches the floor. Only when the model is not resident (nothing on the device
 * may still be read from the mapping: copies finished when the load returned). */
void wf__cache_floor_detach(struct wf_cache *c, struct model *m)
{
	struct wf_shm_region *r = m->region;

	if (!r)
		return;
	if (m->registered)
		(void)wf_device_host_unregister(c->dev, wf_shm_region_data(r), NULL);
	pthread_mutex_lock(&c->lock);
	m->region = NULL;
	m->registered = false;
	if (!resident(m))
		m->state = WF_RESIDENCY_DISK;
	pthread_mutex_unlock(&c->lock);
	wf_shm_region_detach(r);
}

void wf__cache_devcopy_free(struct wf_cache *c, struct devcopy *d)
{
	for (uint32_t i = 0; d->seg_ptr && i < d->n_segs; i++)
		if (d->seg_ptr[i])
			(void)wf_device_mem_free(c->dev, d->seg_ptr[i], NULL);
	free(d->seg_ptr);
	free(d->seg_size);
	free(d->tensors);
	free(d->src_off);
	free(d->seg_of);
	free(d->dev_off);
	*d = (struct devcopy){0};
}

/* Source offset of each of the set's tensors: in the floor (the current generation's bytes) or
 * in its file. */
static int source_offsets(struct model *m, struct devcopy *d, struct wf_diag *diag)
{
	const struct wf_model *mo = m->model;
	const struct wf_wset_def *def = &d->set->def;

	for (uint32_t k = 0; k < def->n_tensors; k++) {
		uint32_t i = def->tensors[k];

		if (!d->from_floor) {
			d->src_off[k] = mo->tensors[i].offset;
			continue;
		}
		struct wf_shm_tensor_info ti;
		int ret = wf_shm_region_tensor(m->region, i, &ti);
		if (ret < 0)
			return wf_diag_set(diag, ret, "model '%s': floor tensor %u: %s", m->name, i,
			                   wf_strerror(ret));
		if (ti.nbytes != mo->tensors[i].nbytes)
			return wf_diag_set(diag, WF_EFORMAT,
			                   "model '%s': floor tensor '%s' has %" PRIu64
			                   " bytes, the model %" PRIu64,
			                   m->name, mo->tensors[i].name, ti.nbytes,
			                   mo->tensors[i].nbytes);
		d->src_off[k] = ti.floor_offset;
	}
	return 0;
}

/* The device layout of one set (see the top of cache.h): per tensor a segment and an offset in
 * it. */
int wf__cache_layout(struct wf_cache *c, struct model *m, struct devcopy *d, struct wf_diag *diag)
{
	const struct wf_model *mo = m->model;
	uint32_t nt = d->set->def.n_tensors, seg = 0;
	uint64_t prev_src = 0, prev_src_end = 0, prev_dev = 0, prev_dev_end = 0;
	uint32_t prev_file = 0;
	bool empty = true;
	int ret;

	d->src_off = calloc(nt ? nt : 1, sizeof(*d->src_off));
	d->seg_of = calloc(nt ? nt : 1, sizeof(*d->seg_of));
	d->dev_off = calloc(nt ? nt : 1, sizeof(*d->dev_off));
	d->tensors = calloc(nt ? nt : 1, sizeof(*d->tensors));
	/* At most one segment per tensor. */
	d->seg_size = calloc(nt ? nt : 1, sizeof(*d->seg_size));
	d->seg_ptr = calloc(nt ? nt : 1, sizeof(*d->seg_ptr));
	if (!d->src_off || !d->seg_of || !d->dev_off || !d->tensors || !d->seg_size || !d->seg_ptr)
		return -ENOMEM;
	ret = source_offsets(m, d, diag);
	if (ret < 0)
		return ret;
	for (uint32_t k = 0; k < nt; k++) {
		uint32_t i = d->set->def.tensors[k];
		uint64_t src = d->src_off[k], nb = mo->tensors[i].nbytes, dev;
		uint32_t file = d->from_floor ? 0 : mo->tensors[i].file;

		if (!empty && file == prev_file && src >= prev_src_end &&
		    src - prev_src_end <= LAYOUT_GAP) {
			/* Keep the source spacing: this tensor and the previous one are then one
			 * read and one copy. */
			dev = prev_dev + (src - prev_src);
		} else {
			dev = align_up(prev_dev_end, LAYOUT_ALIGN) + src % LAYOUT_ALIGN;
		}
		if (c->opts.alloc_max && !empty && dev + nb > c->opts.alloc_max) {
			seg++;
			dev = src % LAYOUT_ALIGN;
		}
		if (dev + nb < dev)
			return wf_diag_set(diag, WF_EOVERFLOW, "model '%s': layout overflows",
			                   m->name);
		d->seg_of[k] = seg;
		d->dev_off[k] = dev;
		if (dev + nb > d->seg_size[seg])
			d->seg_size[seg] = dev + nb;
		prev_src = src;
		prev_src_end = src + nb;
		prev_dev = dev;
		prev_dev_end = dev + nb;
		prev_file = file;
		empty = false;
	}
	d->n_segs = nt ? seg + 1 : 0;
	d->bytes = 0;
	for (uint32_t s = 0; s < d->n_segs; s++) {
		/* A segment of zero-byte tensors still gets a (tiny) allocation. */
		if (!d->seg_size[s])
			d->seg_size[s] = 1;
		d->bytes += d->seg_size[s];
	}
	return 0;
}

void wf__cache_fill_pointers(struct devcopy *d)
{
	for (uint32_t k = 0; k < d->set->def.n_tensors; k++)
		d->tensors[k] = (unsigned char *)d->seg_ptr[d->seg_of[k]] + d->dev_off[k];
}

static void on_progress(void *vctx, uint64_t done, uint64_t total)
{
	struct progress_ctx *p = vctx;
	uint64_t now = p->base + done;
	(void)total;

	pthread_mutex_lock(&p->c->lock);
	p->m->load_done = now;
	pthread_mutex_unlock(&p->c->lock);
	if (now - p->last_event >= PROGRESS_EVENT || now == p->m->load_total) {
		p->last_event = now;
		wf__cache_emit(p->c, WF_CACHE_EVENT_PROGRESS, p->m, 0, NULL);
	}
}

/* Moves the bytes of the set's tensors into d's allocations. */
int wf__cache_transfer(struct wf_cache *c, struct model *m, struct devcopy *d,
                       struct progress_ctx *pc, struct wf_stage_stats *ret_stats,
                       struct wf_diag *diag)
{
	const struct wf_model *mo = m->model;
	const struct wf_wset_def *def = &d->set->def;
	uint64_t base = pc->base;
	struct wf_stage_ctl ctl = {
	    .mode = c->opts.load_mode,
	    .progress = on_progress,
	    .progress_ctx = pc,
	    .cancel = &c->cancel_flag,
	};
	struct wf_stage_item *items = calloc(def->n_tensors ? def->n_tensors : 1, sizeof(*items));
	struct wf_stage_stats st = {0}, total = {0};
	int ret = 0;

	if (!items)
		return -ENOMEM;
	for (uint32_t k = 0; k < def->n_tensors; k++)
		items[k] =
		    (struct wf_stage_item){d->src_off[k], mo->tensors[def->tensors[k]].nbytes,
		                           d->tensors[k], d->seg_of[k] + 1};
	if (d->from_floor) {
		struct wf_stage_src src = {
		    .fd = wf_shm_region_fd(m->region),
		    .map = wf_shm_region_data(m->region),
		    .map_size = (size_t)wf_shm_region_size(m->region),
		};
		/* Register the floor once per attachment, not per load: pinning a large
		 * mapping costs (cudaHostRegister walks every page). */
		if (ctl.mode != WF_STAGE_MODE_STAGED && !m->registered && !m->register_failed) {
			struct wf_diag rd = {0};
			int r = wf_device_host_register(c->dev, src.map, src.map_size,
			                                WF_DEVICE_REGISTER_READONLY, NULL, &rd);
			if (r == 0)
				m->registered = true;
			else if (ctl.mode == WF_STAGE_MODE_DIRECT)
				ret = wf_diag_set(diag, r, "model '%s': registering the floor: %s",
				                  m->name, wf_diag_str(&rd, r));
			else
				m->register_failed = true;
		}
		if (ret < 0)
			goto out;
		if (!m->registered)
			ctl.mode = WF_STAGE_MODE_STAGED;
		src.map_registered = m->registered;
		/* A small model would measure call overheads, not rates: wait for a real one. */
		if (ctl.mode == WF_STAGE_MODE_AUTO && m->registered &&
		    def->bytes >= WF_CACHE_CALIBRATE_MIN) {
			struct wf_stage_info si;
			wf_stage_info(c->stage, &si);
			if (!si.calibrated) {
				ret = wf_stage_calibrate(c->stage, &src, items, def->n_tensors,
				                         WF_CACHE_CALIBRATE_MAX, &c->cancel_flag,
				                         NULL, NULL, diag);
				if (ret < 0)
					goto out;
			}
		}
		ret = wf_stage_load(c->stage, &src, items, def->n_tensors, &ctl, &total, diag);
		if (ret < 0)
			goto out;
	} else {
		double seconds = 0;

		/* One load per file, its tensors in model order. */
		ctl.mode = WF_STAGE_MODE_STAGED;
		for (uint32_t f = 0; f < mo->n_files; f++) {
			const struct wf_model_file *mf = &mo->files[f];
			struct wf_stage_src src = {
			    .fd = -1,
			    .path = mf->path,
			    .expect_size = mf->size,
			    .expect_mtime_ns = mf->mtime_ns,
			};
			size_t k = 0;
			uint64_t bytes = 0;

			for (uint32_t p = 0; p < def->n_tensors; p++) {
				uint32_t i = def->tensors[p];
				if (mo->tensors[i].file != f)
					continue;
				items[k] =
				    (struct wf_stage_item){d->src_off[p], mo->tensors[i].nbytes,
				                           d->tensors[p], d->seg_of[p] + 1};
				bytes += mo->tensors[i].nbytes;
				k++;
			}
			if (!k)
				continue;
			ret = wf_stage_load(c->stage, &src, items, k, &ctl, &st, diag);
			if (ret < 0)
				goto out;
			pc->base += bytes;
			seconds += st.seconds;
			total.bytes += st.bytes;
			total.bytes_read += st.bytes_read;
			total.batches += st.batches;
			total.reads += st.reads;
			total.copies += st.copies;
			total.mode = st.mode;
		}
		total.seconds = seconds;
		total.gbps = seconds > 0 ? (double)total.bytes / seconds / 1e9 : 0;
	}
	pc->base = base + def->bytes;
	*ret_stats = total;
out:
	free(items);
	return ret;
}

/* Verifies one resident set against its source (floor, or each model file in turn). */
static int verify_set(struct wf_cache *c, struct model *m, const struct wset *set,
                      struct wf_stage_item *items, uint32_t *index, struct wf_diag *diag)
{
	const struct wf_model *mo = m->model;
	const struct wf_wset_def *def = &set->def;
	int ret = 0;

	for (uint32_t f = 0; f < (set->from_floor ? 1u : mo->n_files); f++) {
		struct wf_stage_src src = {.fd = -1};
		size_t k = 0, bad = 0;

		if (set->from_floor) {
			src.fd = wf_shm_region_fd(m->region);
			src.map = wf_shm_region_data(m->region);
			src.map_size = (size_t)wf_shm_region_size(m->region);
		} else {
			src.path = mo->files[f].path;
		}
		for (uint32_t p = 0; p < def->n_tensors; p++) {
			uint32_t i = def->tensors[p];
			if (!set->from_floor && mo->tensors[i].file != f)
				continue;
			index[k] = i;
			items[k++] = (struct wf_stage_item){m->src_off[i], mo->tensors[i].nbytes,
			                                    m->tensors[i], 0};
		}
		struct wf_diag vd = {0};
		ret = wf_stage_verify(c->dev, &src, items, k, &bad, &vd);
		if (ret < 0) {
			const char *tn =
			    ret == WF_ECHECKSUM && bad < k ? mo->tensors[index[bad]].name : "?";
			return wf_diag_set(diag, ret, "verify: model '%s' tensor '%s': %s", m->name,
			                   tn, wf_diag_str(&vd, ret));
		}
	}
	return 0;
}

int wf_cache_verify(struct wf_cache *c, uint32_t id, struct wf_diag *diag)
{
	const struct wf_model *mo;
	struct wf_stage_item *items = NULL;
	uint32_t *index = NULL;
	struct model *m;
	int ret;

	if (!c)
		return WF_EINVAL;
	pthread_mutex_lock(&c->lock);
	ret = wf__cache_try_acquire_locked(c, id, NULL);
	m = wf__cache_find_locked(c, id);
	pthread_mutex_unlock(&c->lock);
	if (ret < 0)
		return wf_diag_set(diag, ret, "verify: no model with id %u", id);
	if (ret == 0)
		return wf_diag_set(diag, WF_ENOT_RESIDENT, "verify: model '%s' is not resident",
		                   m->name);
	/* Held: the device copy, its source offsets and the floor attachment stay as they are. */
	mo = m->model;
	items = calloc(mo->n_tensors ? mo->n_tensors : 1, sizeof(*items));
	index = calloc(mo->n_tensors ? mo->n_tensors : 1, sizeof(*index));
	if (!items || !index) {
		ret = -ENOMEM;
		goto out;
	}
	ret = 0;
	for (uint32_t s = 0; s < m->n_sets && ret == 0; s++)
		ret = verify_set(c, m, &m->sets[s], items, index, diag);
out:
	free(items);
	free(index);
	(void)wf_cache_release(c, id);
	return ret;
}
