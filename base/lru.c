#include "base/lru.h"

#include <math.h>

static bool evictable(const struct wf_lru_item *it)
{
	return !it->pinned && !it->busy;
}

/* a before b in eviction order. */
static bool older(const struct wf_lru_item *items, size_t a, size_t b)
{
	if (items[a].last_used != items[b].last_used)
		return items[a].last_used < items[b].last_used;
	return a < b;
}

/* Max-heap on eviction order (the newest at the root), so that heapsort leaves v ascending. */
static void sift_down(const struct wf_lru_item *items, size_t *v, size_t root, size_t n)
{
	for (;;) {
		size_t top = root, l = 2 * root + 1, r = l + 1;
		if (l < n && older(items, v[top], v[l]))
			top = l;
		if (r < n && older(items, v[top], v[r]))
			top = r;
		if (top == root)
			return;
		size_t t = v[root];
		v[root] = v[top];
		v[top] = t;
		root = top;
	}
}

/* In place, allocation-free: the expert cache plans over thousands of slices. */
static void sort_oldest_first(const struct wf_lru_item *items, size_t *v, size_t n)
{
	for (size_t i = n / 2; i-- > 0;)
		sift_down(items, v, i, n);
	for (size_t end = n; end > 1; end--) {
		size_t t = v[0];
		v[0] = v[end - 1];
		v[end - 1] = t;
		sift_down(items, v, 0, end - 1);
	}
}

enum wf_lru_fit wf_lru_plan(const struct wf_lru_item *items, size_t n, uint64_t budget,
                            uint64_t used, uint64_t need, size_t *victims, size_t *ret_n_victims)
{
	uint64_t movable = 0, fixed;
	size_t n_cand = 0, nv = 0;
	enum wf_lru_fit fit;

	*ret_n_victims = 0;
	if (need <= budget && used <= budget - need)
		return WF_LRU_FITS;
	for (size_t i = 0; i < n; i++) {
		if (!evictable(&items[i]))
			continue;
		victims[n_cand++] = i;
		movable += items[i].bytes;
	}
	fixed = used > movable ? used - movable : 0;
	if (need > budget) {
		if (fixed > 0)
			return WF_LRU_NO_ROOM;
		fit = WF_LRU_OVERSIZED;
	} else {
		if (fixed > budget - need)
			return WF_LRU_NO_ROOM;
		fit = WF_LRU_FITS;
	}
	sort_oldest_first(items, victims, n_cand);
	for (size_t k = 0; k < n_cand; k++) {
		if (fit == WF_LRU_FITS && used <= budget - need)
			break;
		uint64_t b = items[victims[k]].bytes;
		used = used > b ? used - b : 0;
		nv++;
	}
	*ret_n_victims = nv;
	return fit;
}

size_t wf_lru_oldest(const struct wf_lru_item *items, size_t n)
{
	size_t best = n;

	for (size_t i = 0; i < n; i++)
		if (evictable(&items[i]) && (best == n || older(items, i, best)))
			best = i;
	return best;
}

double wf_lrfu_value(const struct wf_lrfu_score *s, uint64_t now, double lambda)
{
	return s->crf * exp2(-lambda * (double)(now - s->stamp));
}

void wf_lrfu_touch(struct wf_lrfu_score *s, uint64_t now, double lambda)
{
	s->crf = wf_lrfu_value(s, now, lambda) + 1.0;
	s->stamp = now;
}

double wf_lrfu_rank(const struct wf_lrfu_score *s, double lambda)
{
	return s->crf > 0 ? log2(s->crf) + lambda * (double)s->stamp : -INFINITY;
}

size_t wf_lrfu_victim(const struct wf_lru_item *items, const double *value, size_t n)
{
	size_t best = n;

	for (size_t i = 0; i < n; i++) {
		if (!evictable(&items[i]))
			continue;
		if (best == n || value[i] < value[best] ||
		    (value[i] == value[best] && items[i].last_used < items[best].last_used))
			best = i;
	}
	return best;
}
