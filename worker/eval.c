/* wf-worker eval --model FILE --prompt IDS [--feed IDS | --generate N] --logits OUT.bin
 *                [--threads N] [--kv-type f16|f32] [--ctx N]
 *
 * The prompt's ids run as one batch with logits for every position; then each fed or generated
 * token runs alone (one token per step). OUT.bin gets float32 rows of n_vocab: the prompt's, then
 * one per step. --generate N takes the greedy id (ties to the lowest) of each last row and prints
 * the N ids, comma-separated, as the last line of stdout. */
#include "worker/eval.h"

#include "base/diag.h"
#include "base/error.h"
#include "base/units.h"
#include "device/device.h"
#include "engine/engine.h"
#include "engine/postfetch.h"
#include "model/model.h"
#include "worker/weights.h"
#include "worker/wengine.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char usage[] =
    "usage: wf-worker eval --model FILE --prompt IDS [--feed IDS | --generate N]\n"
    "                      [--logits OUT.bin] [--threads N] [--kv-type f16|f32] [--ctx N]\n"
    "                      [--device SPEC [--expert-cache-mb N] [--n-cpu-moe N | --cpu-moe]\n"
    "                                     [--dense-on-device]]\n"
    "                      (post-fetch settings: the WF_POSTFETCH_* variables)\n";

static int parse_u32(const char *s, uint32_t *ret)
{
	uint64_t v;
	int rc = wf_parse_uint(s, UINT32_MAX, &v);
	if (rc == 0)
		*ret = (uint32_t)v;
	return rc;
}

static int32_t argmax(const float *row, uint32_t n)
{
	uint32_t best = 0;
	for (uint32_t i = 1; i < n; i++)
		if (row[i] > row[best])
			best = i;
	return (int32_t)best;
}

static int write_all(int fd, const void *buf, size_t len)
{
	const char *p = buf;
	while (len) {
		ssize_t w = write(fd, p, len);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += w;
		len -= (size_t)w;
	}
	return 0;
}

static void log_line(void *arg, const char *line)
{
	(void)arg;
	fprintf(stderr, "%s\n", line);
}

int wf_worker_eval_main(int argc, char **argv)
{
	const char *model_path = NULL, *prompt = NULL, *feed = NULL, *out_path = NULL,
	           *device_spec = NULL;
	uint32_t generate = 0, threads = 0, ctx = 0, cache_mb = 0, n_cpu_moe = 0;
	bool experts_on_device = false, dense_on_device = false;
	bool have_generate = false;
	enum wf_engine_kv_type kv_type = WF_ENGINE_KV_F16;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		int bad = 0;
		if (strcmp(a, "--cpu-moe") == 0) { /* the default: every expert host-side */
			experts_on_device = false;
			continue;
		}
		if (strcmp(a, "--dense-on-device") == 0) { /* implied on CUDA */
			dense_on_device = true;
			continue;
		}
		if (!v) {
			bad = 1;
		} else if (strcmp(a, "--model") == 0) {
			model_path = v;
		} else if (strcmp(a, "--prompt") == 0) {
			prompt = v;
		} else if (strcmp(a, "--feed") == 0) {
			feed = v;
		} else if (strcmp(a, "--logits") == 0) {
			out_path = v;
		} else if (strcmp(a, "--device") == 0) {
			device_spec = v;
		} else if (strcmp(a, "--generate") == 0) {
			bad = parse_u32(v, &generate) < 0;
			have_generate = true;
		} else if (strcmp(a, "--threads") == 0) {
			bad = parse_u32(v, &threads) < 0 || threads == 0 ||
			      threads > WF_ENGINE_MAX_THREADS;
		} else if (strcmp(a, "--n-cpu-moe") == 0) {
			bad = parse_u32(v, &n_cpu_moe) < 0;
			experts_on_device = true;
		} else if (strcmp(a, "--expert-cache-mb") == 0) {
			bad = parse_u32(v, &cache_mb) < 0;
		} else if (strcmp(a, "--ctx") == 0) {
			bad = parse_u32(v, &ctx) < 0;
		} else if (strcmp(a, "--kv-type") == 0) {
			if (strcmp(v, "f16") == 0)
				kv_type = WF_ENGINE_KV_F16;
			else if (strcmp(v, "f32") == 0)
				kv_type = WF_ENGINE_KV_F32;
			else
				bad = 1;
		} else {
			bad = 1;
		}
		if (bad) {
			fprintf(stderr, "wf-worker eval: bad argument '%s%s%s'\n%s", a,
			        v ? " " : "", v ? v : "", usage);
			return 2;
		}
		i++;
	}
	if (!model_path || !prompt || (feed && have_generate)) {
		fputs(usage, stderr);
		return 2;
	}
	int32_t *prompt_ids = NULL, *feed_ids = NULL;
	size_t n_prompt_ids = 0, n_feed_ids = 0;
	if (wf_parse_ids(prompt, UINT32_MAX, &prompt_ids, &n_prompt_ids) < 0 ||
	    (feed && wf_parse_ids(feed, UINT32_MAX, &feed_ids, &n_feed_ids) < 0)) {
		fprintf(stderr,
		        "wf-worker eval: ids must be comma-separated non-negative integers\n");
		free(prompt_ids);
		return 2;
	}
	const uint32_t n_prompt = (uint32_t)n_prompt_ids, n_feed = (uint32_t)n_feed_ids;
	const uint32_t n_steps = feed ? n_feed : generate;

	struct wf_diag d = {{0}};
	struct wf_model *m = NULL;
	struct wf_weight_view view = {0};
	struct wf_engine *e = NULL;
	struct wf_worker_engine we = {0};
	struct wf_device *dev = NULL;
	struct wf_postfetch_settings pf;
	wf_postfetch_settings_default(&pf);
	float *logits = NULL;
	int32_t *gen = NULL;
	uint32_t *pos = NULL, *seq = NULL;
	bool *want = NULL;
	int fd = -1, rc;
	if ((rc = wf_postfetch_settings_from_env(&pf, &d)) < 0) {
		fprintf(stderr, "wf-worker eval: %s\n", wf_diag_str(&d, rc));
		free(prompt_ids);
		free(feed_ids);
		return 2;
	}
	if ((rc = wf_model_open(model_path, &m, &d)) < 0 ||
	    (rc = wf_weight_view_map_files(m, &view, &d)) < 0)
		goto out;
	if (device_spec && (rc = wf_device_open(device_spec, &dev, &d)) < 0)
		goto out;
	struct wf_engine_config cfg = {.n_ctx = ctx,
	                               .n_seq_max = 1,
	                               .n_threads = threads,
	                               .kv_type = kv_type,
	                               .device = dev,
	                               .postfetch = &pf,
	                               .expert_cache_mb = cache_mb,
	                               .experts_on_device = experts_on_device,
	                               .n_cpu_moe = n_cpu_moe,
	                               .dense_on_device = dense_on_device};
	const struct wf_engine_weights weights = wf_weight_view_engine(&view);
	if ((rc = wf_worker_engine_open_files(m, &weights, &cfg, false, &we, &d)) < 0)
		goto out;
	e = we.engine;
	if (pf.debug)
		wf_engine_set_log(e, log_line, NULL);
	struct wf_engine_info info;
	wf_engine_get_info(e, &info);
	const size_t V = info.n_vocab;
	logits = malloc(sizeof(float) * V * (n_prompt > 1 ? n_prompt : 1));
	gen = calloc(n_steps + 1, sizeof(*gen));
	pos = calloc(n_prompt, sizeof(*pos));
	seq = calloc(n_prompt, sizeof(*seq));
	want = calloc(n_prompt, sizeof(*want));
	if (!logits || !gen || !pos || !seq || !want) {
		rc = wf_diag_set(&d, -ENOMEM, "logits");
		goto out;
	}
	if (out_path) {
		fd = open(out_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
		if (fd < 0) {
			rc = wf_diag_set(&d, -errno, "%s", out_path);
			goto out;
		}
	}
	for (uint32_t i = 0; i < n_prompt; i++) {
		pos[i] = i;
		want[i] = true;
	}
	struct wf_engine_batch b = {n_prompt, prompt_ids, pos, seq, want};
	if ((rc = wf_engine_decode(e, &b, logits, &d)) < 0)
		goto out;
	if (fd >= 0 && (rc = write_all(fd, logits, sizeof(float) * V * n_prompt)) < 0) {
		wf_diag_set(&d, rc, "%s", out_path);
		goto out;
	}
	int32_t next = argmax(logits + V * (n_prompt - 1), (uint32_t)V);
	for (uint32_t s = 0; s < n_steps; s++) {
		const int32_t tok = feed ? feed_ids[s] : next;
		gen[s] = tok;
		uint32_t p = n_prompt + s, q = 0;
		bool w = true;
		struct wf_engine_batch one = {1, &tok, &p, &q, &w};
		if ((rc = wf_engine_decode(e, &one, logits, &d)) < 0)
			goto out;
		if (fd >= 0 && (rc = write_all(fd, logits, sizeof(float) * V)) < 0) {
			wf_diag_set(&d, rc, "%s", out_path);
			goto out;
		}
		next = argmax(logits, (uint32_t)V);
	}
	if (dev) {
		struct wf_engine_stats st;
		wf_engine_get_stats(e, &st);
		const uint64_t looked = st.fetch_hits + st.fetch_misses;
		fprintf(
		    stderr,
		    "post-fetch: hit rate %.3f, %llu down projections copied (%.1f MB), %llu "
		    "computed from the device, %llu on the cpu, %llu errors, overlap %.2f, slots "
		    "%.1f MB, resident experts %.1f MB (%llu lookups)\n",
		    looked ? (double)st.fetch_hits / (double)looked : 0.0,
		    (unsigned long long)st.fetch_experts, st.fetch_bytes / 1e6,
		    (unsigned long long)st.fetch_used, (unsigned long long)st.fetch_fallbacks,
		    (unsigned long long)st.fetch_errors, st.fetch_overlap,
		    st.scratchpad_bytes / 1e6, st.resident_bytes / 1e6,
		    (unsigned long long)st.resident_lookups);
	}
	if (have_generate) {
		for (uint32_t s = 0; s < n_steps; s++)
			printf("%s%d", s ? "," : "", gen[s]);
		printf("\n");
	}
	rc = 0;
out:
	if (fd >= 0 && close(fd) < 0 && rc == 0)
		rc = wf_diag_set(&d, -errno, "%s", out_path);
	if (rc < 0)
		fprintf(stderr, "wf-worker eval: %s: %s\n", model_path, wf_diag_str(&d, rc));
	free(logits);
	free(gen);
	free(pos);
	free(seq);
	free(want);
	free(prompt_ids);
	free(feed_ids);
	wf_worker_engine_close(&we);
	wf_device_close(dev);
	wf_weight_view_release(&view);
	wf_model_close(m);
	return rc < 0 ? 1 : 0;
}
