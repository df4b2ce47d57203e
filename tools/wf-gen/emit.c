/* Writing a plan out: GGUF through model/gguf_writer.h with generator threads feeding one writer,
 * or Hugging Face style safetensors through model/safetensors_writer.h.
 *
 * GGUF pipeline: the tensors are cut into chunks (whole PRNG groups, up to CHUNK_BYTES), workers
 * fill chunks into a ring of buffers in any order, and the calling thread hands them to the
 * writer strictly in order. Filling and write()s into the page cache overlap; with the ring a
 * few chunks deep, neither side waits for long. */
#include "gen.h"

#include "base/error.h"
#include "model/gguf_writer.h"
#include "model/safetensors_writer.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define CHUNK_BYTES (8u << 20)

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- metadata --------------------------------------------------------------------------- */

static int set_metadata(struct wf_gguf_writer *w, const struct gen_plan *p,
                        const struct gen_vocab *v)
{
	const struct gen_config *c = &p->cfg;
	const struct gen_dims *d = &c->dims;
	const char *arch = gen_arch_name(c->arch);
	bool qwen = c->arch == GEN_ARCH_QWEN3MOE;
	bool quantized = false;
	for (uint32_t i = 0; i < p->n_tensors; i++)
		if (wf_dtype_info(p->tensors[i].dtype)->quantized)
			quantized = true;
	char name[128], key[128];
	if (c->name)
		snprintf(name, sizeof(name), "%s", c->name);
	else
		snprintf(name, sizeof(name), "wf-gen-%s-seed%llu", arch,
		         (unsigned long long)c->seed);

	int r = wf_gguf_writer_set_str(w, "general.architecture", arch);
#define SET(fn, k, val)                                                                            \
	do {                                                                                       \
		if (r == 0) {                                                                      \
			snprintf(key, sizeof(key), "%s.%s", arch, k);                              \
			r = fn(w, key, val);                                                       \
		}                                                                                  \
	} while (0)
	if (r == 0)
		r = wf_gguf_writer_set_str(w, "general.name", name);
	if (r == 0)
		r = wf_gguf_writer_set_u32(w, "general.file_type", gen_plan_file_type(p));
	if (r == 0 && quantized)
		r = wf_gguf_writer_set_u32(w, "general.quantization_version",
		                           2); /* GGML_QNT_VERSION */
	SET(wf_gguf_writer_set_u32, "context_length", d->ctx);
	SET(wf_gguf_writer_set_u32, "embedding_length", d->embd);
	SET(wf_gguf_writer_set_u32, "block_count", d->layers);
	SET(wf_gguf_writer_set_u32, "feed_forward_length", d->ff);
	SET(wf_gguf_writer_set_u32, "attention.head_count", d->heads);
	SET(wf_gguf_writer_set_u32, "attention.head_count_kv", d->kv_heads);
	SET(wf_gguf_writer_set_f32, "rope.freq_base", qwen ? 1e6f : 1e4f);
	SET(wf_gguf_writer_set_f32, "attention.layer_norm_rms_epsilon", qwen ? 1e-6f : 1e-5f);
	SET(wf_gguf_writer_set_u32, "expert_count", d->experts);
	SET(wf_gguf_writer_set_u32, "expert_used_count", d->experts_used);
	if (qwen) {
		SET(wf_gguf_writer_set_u32, "expert_feed_forward_length", d->expert_ff);
		SET(wf_gguf_writer_set_u32, "attention.key_length", d->head_dim);
		SET(wf_gguf_writer_set_u32, "attention.value_length", d->head_dim);
	} else {
		SET(wf_gguf_writer_set_u32, "rope.dimension_count", d->head_dim);
		SET(wf_gguf_writer_set_u32, "vocab_size", d->vocab);
		/* llama.cpp derives the head size from embd / heads unless told otherwise */
		if (d->heads * d->head_dim != d->embd) {
			SET(wf_gguf_writer_set_u32, "attention.key_length", d->head_dim);
			SET(wf_gguf_writer_set_u32, "attention.value_length", d->head_dim);
		}
	}
#undef SET
	if (r == 0)
		r = wf_gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
	if (r == 0)
		r = wf_gguf_writer_set_str_array(w, "tokenizer.ggml.tokens",
		                                 (const char *const *)v->tokens, v->n);
	if (r == 0)
		r = wf_gguf_writer_set_array(w, "tokenizer.ggml.scores", WF_KV_F32, v->scores,
		                             v->n);
	if (r == 0)
		r = wf_gguf_writer_set_array(w, "tokenizer.ggml.token_type", WF_KV_I32, v->types,
		                             v->n);
	if (r == 0)
		r = wf_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1);
	if (r == 0)
		r = wf_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2);
	if (r == 0)
		r = wf_gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", 0);
	if (r == 0)
		r = wf_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", true);
	if (r == 0)
		r = wf_gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", false);
	return r;
}

/* ---- fill pipeline ----------------------------------------------------------------------- */

struct chunk {
	uint32_t tensor;
	uint64_t first, n; /* elements */
	uint64_t bytes;
};

struct pipe {
	const struct gen_plan *plan;
	struct chunk *chunks;
	uint64_t n_chunks;
	uint8_t **bufs;
	uint32_t n_bufs;

	pthread_mutex_t mu;
	pthread_cond_t cv;
	uint64_t next;     /* next chunk a worker takes */
	uint64_t consumed; /* chunks the writer is done with */
	int64_t *ready;    /* per buffer: the chunk it holds, -1 if none */
	bool stop;
};

static int make_chunks(const struct gen_plan *p, struct chunk **ret, uint64_t *ret_n)
{
	uint64_t n = 0, cap = 0;
	struct chunk *c = NULL;
	for (uint32_t i = 0; i < p->n_tensors; i++) {
		const struct gen_tensor *t = &p->tensors[i];
		const struct wf_dtype_info *ti = wf_dtype_info(t->dtype);
		uint64_t elems = t->nbytes / ti->type_size * ti->block_size;
		uint64_t group_bytes = GEN_GROUP / ti->block_size * ti->type_size;
		uint64_t per = CHUNK_BYTES / group_bytes;
		per = (per ? per : 1) * GEN_GROUP;
		for (uint64_t f = 0; f < elems; f += per) {
			if (n == cap) {
				cap = cap ? cap * 2 : 1024;
				struct chunk *nc = realloc(c, cap * sizeof(*nc));
				if (!nc) {
					free(c);
					return -ENOMEM;
				}
				c = nc;
			}
			uint64_t k = elems - f < per ? elems - f : per;
			c[n++] = (struct chunk){i, f, k, k / ti->block_size * ti->type_size};
		}
	}
	*ret = c;
	*ret_n = n;
	return 0;
}

static void *worker(void *arg)
{
	struct pipe *p = arg;
	pthread_mutex_lock(&p->mu);
	for (;;) {
		if (p->stop || p->next >= p->n_chunks)
			break;
		uint64_t k = p->next++;
		/* The buffer k % n_bufs is free once the writer has consumed chunk k - n_bufs. */
		while (!p->stop && k >= p->consumed + p->n_bufs)
			pthread_cond_wait(&p->cv, &p->mu);
		if (p->stop)
			break;
		pthread_mutex_unlock(&p->mu);
		const struct chunk *c = &p->chunks[k];
		gen_fill(&p->plan->tensors[c->tensor], c->first, c->n, p->bufs[k % p->n_bufs]);
		pthread_mutex_lock(&p->mu);
		p->ready[k % p->n_bufs] = (int64_t)k;
		pthread_cond_broadcast(&p->cv);
	}
	pthread_mutex_unlock(&p->mu);
	return NULL;
}

static int run_pipeline(const struct gen_plan *plan, struct wf_gguf_writer *w, uint32_t threads,
                        struct wf_diag *diag)
{
	struct pipe p = {.plan = plan};
	pthread_t *tids = NULL;
	uint32_t started = 0;
	int r = make_chunks(plan, &p.chunks, &p.n_chunks);
	if (r < 0)
		return r;
	p.n_bufs = threads * 2 + 2;
	p.bufs = calloc(p.n_bufs, sizeof(*p.bufs));
	p.ready = malloc(p.n_bufs * sizeof(*p.ready));
	tids = calloc(threads, sizeof(*tids));
	if (!p.bufs || !p.ready || !tids) {
		r = -ENOMEM;
		goto out;
	}
	for (uint32_t i = 0; i < p.n_bufs; i++) {
		p.ready[i] = -1;
		if (posix_memalign((void **)&p.bufs[i], 4096, CHUNK_BYTES) != 0) {
			p.bufs[i] = NULL;
			r = -ENOMEM;
			goto out;
		}
	}
	pthread_mutex_init(&p.mu, NULL);
	pthread_cond_init(&p.cv, NULL);
	for (; started < threads; started++) {
		int e = pthread_create(&tids[started], NULL, worker, &p);
		if (e) {
			r = wf_diag_set(diag, -e, "cannot start a generator thread: %s",
			                strerror(e));
			break;
		}
	}
	for (uint64_t k = 0; r == 0 && k < p.n_chunks; k++) {
		uint32_t b = (uint32_t)(k % p.n_bufs);
		pthread_mutex_lock(&p.mu);
		while (p.ready[b] != (int64_t)k)
			pthread_cond_wait(&p.cv, &p.mu);
		pthread_mutex_unlock(&p.mu);
		r = wf_gguf_writer_write(w, p.bufs[b], p.chunks[k].bytes, diag);
		pthread_mutex_lock(&p.mu);
		p.ready[b] = -1;
		p.consumed = k + 1;
		pthread_cond_broadcast(&p.cv);
		pthread_mutex_unlock(&p.mu);
	}
	pthread_mutex_lock(&p.mu);
	p.stop = true;
	pthread_cond_broadcast(&p.cv);
	pthread_mutex_unlock(&p.mu);
	for (uint32_t i = 0; i < started; i++)
		pthread_join(tids[i], NULL);
	pthread_cond_destroy(&p.cv);
	pthread_mutex_destroy(&p.mu);
out:
	if (p.bufs)
		for (uint32_t i = 0; i < p.n_bufs; i++)
			free(p.bufs[i]);
	free(p.bufs);
	free(p.ready);
	free(tids);
	free(p.chunks);
	return r;
}

static int emit_gguf(const struct gen_plan *plan, const struct gen_vocab *vocab,
                     const struct gen_output *out, struct gen_stats *st, struct wf_diag *diag)
{
	struct wf_gguf_writer_opts o = {
	    .alignment = out->alignment,
	    .split_max_bytes = out->split_max_bytes,
	    .fsync = out->fsync,
	    .direct = !out->buffered,
	};
	struct wf_gguf_writer *w = NULL;
	int r = wf_gguf_writer_create(out->path, &o, &w, diag);
	if (r < 0)
		return r;
	r = set_metadata(w, plan, vocab);
	if (r < 0)
		wf_diag_set(diag, r, "metadata: %s", wf_strerror(r));
	for (uint32_t i = 0; r == 0 && i < plan->n_tensors; i++) {
		const struct gen_tensor *t = &plan->tensors[i];
		r = wf_gguf_writer_add_tensor(w, t->name, t->dtype, t->n_dims, t->ne, NULL, diag);
	}
	if (r == 0)
		r = wf_gguf_writer_write_header(w, diag);
	if (r == 0)
		r = run_pipeline(plan, w, out->threads, diag);
	if (r == 0)
		r = wf_gguf_writer_finish(w, diag);
	if (r == 0) {
		st->n_files = wf_gguf_writer_n_files(w);
		st->bytes = wf_gguf_writer_bytes_written(w);
		snprintf(st->first_path, sizeof(st->first_path), "%s",
		         wf_gguf_writer_file_path(w, 0));
	}
	wf_gguf_writer_destroy(w); /* removes every partial file unless finish succeeded */
	return r;
}

/* ---- safetensors -------------------------------------------------------------------------- */

struct st_tensor {
	char name[128];
	const struct gen_tensor *src;
	uint64_t first; /* element of src where this tensor starts (an expert's slice) */
	uint32_t n_dims;
	int64_t shape[2];
	uint64_t bytes;
	uint32_t shard;
};

static int st_fill(void *arg, uint64_t offset, void *buf, size_t len)
{
	const struct st_tensor *t = arg;
	size_t es = wf_dtype_info(t->src->dtype)->type_size;
	if (offset % es || len % es)
		return WF_EINTERNAL; /* the writer's chunks are multiples of 8 */
	gen_fill(t->src, t->first + offset / es, len / es, buf);
	return 0;
}

/* config.json in the shape Hugging Face transformers writes for Qwen3-MoE / Mixtral. */
static int write_config(const char *path, const struct gen_plan *p, bool do_fsync,
                        struct wf_diag *diag)
{
	const struct gen_config *c = &p->cfg;
	const struct gen_dims *d = &c->dims;
	bool qwen = c->arch == GEN_ARCH_QWEN3MOE;
	const char *dt = "float32";
	for (int i = 0; i < GEN_N_TYPED_CLASSES; i++)
		if (c->types[i] == WF_DTYPE_BF16)
			dt = "bfloat16";
		else if (c->types[i] == WF_DTYPE_F16 && dt[0] != 'b')
			dt = "float16";
	char *tmp = NULL;
	if (asprintf(&tmp, "%s.tmp-%ld", path, (long)getpid()) < 0)
		return -ENOMEM;
	int r = 0;
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
	FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
	if (!f) {
		r = -errno;
		if (fd >= 0)
			close(fd);
		wf_diag_set(diag, r, "create %s: %s", tmp, strerror(-r));
		free(tmp);
		return r;
	}
	fprintf(f, "{\n  \"architectures\": [\"%s\"],\n  \"model_type\": \"%s\",\n",
	        qwen ? "Qwen3MoeForCausalLM" : "MixtralForCausalLM",
	        qwen ? "qwen3_moe" : "mixtral");
	fprintf(f, "  \"hidden_size\": %u,\n  \"intermediate_size\": %u,\n", d->embd, d->ff);
	if (qwen)
		fprintf(f,
		        "  \"moe_intermediate_size\": %u,\n  \"num_experts\": %u,\n"
		        "  \"norm_topk_prob\": true,\n  \"decoder_sparse_step\": 1,\n"
		        "  \"mlp_only_layers\": [],\n",
		        d->expert_ff, d->experts);
	else
		fprintf(f, "  \"num_local_experts\": %u,\n", d->experts);
	fprintf(
	    f,
	    "  \"num_experts_per_tok\": %u,\n  \"num_hidden_layers\": %u,\n"
	    "  \"num_attention_heads\": %u,\n  \"num_key_value_heads\": %u,\n"
	    "  \"head_dim\": %u,\n  \"vocab_size\": %u,\n  \"max_position_embeddings\": %u,\n"
	    "  \"rms_norm_eps\": %s,\n  \"rope_theta\": %s,\n  \"hidden_act\": \"silu\",\n"
	    "  \"tie_word_embeddings\": false,\n  \"bos_token_id\": 1,\n  \"eos_token_id\": 2,\n"
	    "  \"torch_dtype\": \"%s\"\n}\n",
	    d->experts_used, d->layers, d->heads, d->kv_heads, d->head_dim, d->vocab, d->ctx,
	    qwen ? "1e-06" : "1e-05", qwen ? "1000000.0" : "10000.0", dt);
	if (fflush(f) != 0 || (do_fsync && fsync(fileno(f)) != 0))
		r = -errno;
	if (fclose(f) != 0 && r == 0)
		r = -errno;
	if (r == 0 && rename(tmp, path) != 0)
		r = -errno;
	if (r < 0) {
		wf_diag_set(diag, r, "write %s: %s", path, strerror(-r));
		unlink(tmp);
	}
	free(tmp);
	return r;
}

static int emit_safetensors(const struct gen_plan *plan, const struct gen_output *out,
                            struct gen_stats *st, struct wf_diag *diag)
{
	/* One Hugging Face tensor per GGUF tensor, and one per expert for the stacked experts. */
	uint64_t n = 0;
	for (uint32_t i = 0; i < plan->n_tensors; i++)
		n += plan->tensors[i].n_dims == 3 ? (uint64_t)plan->tensors[i].ne[2] : 1;
	struct st_tensor *ts = calloc(n, sizeof(*ts));
	char **shard_paths = NULL, **shard_names = NULL;
	uint32_t n_shards = 1, done = 0;
	bool made_dir = false;
	char *index_path = NULL, *config_path = NULL;
	int r = 0;
	if (!ts)
		return -ENOMEM;
	uint64_t k = 0, shard_bytes = 0;
	for (uint32_t i = 0; i < plan->n_tensors; i++) {
		const struct gen_tensor *g = &plan->tensors[i];
		uint64_t experts = g->n_dims == 3 ? (uint64_t)g->ne[2] : 1;
		uint64_t per = g->nbytes / experts;
		for (uint64_t e = 0; e < experts; e++, k++) {
			struct st_tensor *t = &ts[k];
			t->src = g;
			if (g->n_dims == 3) {
				snprintf(t->name, sizeof(t->name), g->hf_name, (unsigned)e);
				t->first = e * (uint64_t)g->ne[0] * (uint64_t)g->ne[1];
			} else {
				snprintf(t->name, sizeof(t->name), "%s", g->hf_name);
			}
			t->n_dims = g->n_dims == 1 ? 1 : 2;
			t->shape[0] =
			    g->n_dims == 1 ? g->ne[0] : g->ne[1]; /* row-major: reversed */
			t->shape[1] = g->ne[0];
			t->bytes = per;
			if (out->split_max_bytes && shard_bytes > 0 &&
			    shard_bytes + per > out->split_max_bytes) {
				n_shards++;
				shard_bytes = 0;
			}
			t->shard = n_shards - 1;
			shard_bytes += per;
		}
	}
	bool sharded = out->split_max_bytes != 0;

	struct stat sb;
	if (stat(out->path, &sb) == 0) {
		if (!S_ISDIR(sb.st_mode)) {
			r = wf_diag_set(diag, WF_EINVAL,
			                "%s exists and is not a directory (--format safetensors "
			                "writes a model directory)",
			                out->path);
			goto out;
		}
	} else if (mkdir(out->path, 0777) == 0) {
		made_dir = true;
	} else {
		r = -errno;
		wf_diag_set(diag, r, "mkdir %s: %s", out->path, strerror(errno));
		goto out;
	}
	shard_paths = calloc(n_shards, sizeof(*shard_paths));
	shard_names = calloc(n_shards, sizeof(*shard_names));
	if (!shard_paths || !shard_names) {
		r = -ENOMEM;
		goto out;
	}
	for (uint32_t s = 0; s < n_shards; s++) {
		int len = sharded ? asprintf(&shard_names[s], "model-%05u-of-%05u.safetensors",
		                             s + 1, n_shards)
		                  : asprintf(&shard_names[s], "model.safetensors");
		if (len < 0 || asprintf(&shard_paths[s], "%s/%s", out->path, shard_names[s]) < 0) {
			r = -ENOMEM;
			goto out;
		}
	}
	for (uint32_t s = 0; s < n_shards && r == 0; s++) {
		struct wf_st_writer_opts o = {.fsync = out->fsync, .buffer_size = CHUNK_BYTES};
		struct wf_st_writer *w = NULL;
		r = wf_st_writer_create(shard_paths[s], &o, &w, diag);
		if (r == 0)
			r = wf_st_writer_set_metadata(w, "format", "pt", diag);
		for (uint64_t i = 0; i < n && r == 0; i++) {
			if (ts[i].shard != s)
				continue;
			r = wf_st_writer_add_tensor_fill(w, ts[i].name, ts[i].src->dtype,
			                                 ts[i].n_dims, ts[i].shape, st_fill, &ts[i],
			                                 diag);
		}
		if (r == 0)
			r = wf_st_writer_finish(w, diag);
		wf_st_writer_destroy(w);
		if (r == 0) {
			done++;
			if (stat(shard_paths[s], &sb) == 0)
				st->bytes += (uint64_t)sb.st_size;
		}
	}
	if (r == 0 && sharded) {
		if (asprintf(&index_path, "%s/model.safetensors.index.json", out->path) < 0) {
			index_path = NULL;
			r = -ENOMEM;
		} else {
			r = wf_st_index_write(index_path, (const char *const *)shard_names,
			                      n_shards, out->fsync, diag);
		}
	}
	if (r == 0) {
		if (asprintf(&config_path, "%s/config.json", out->path) < 0) {
			config_path = NULL;
			r = -ENOMEM;
		} else {
			r = write_config(config_path, plan, out->fsync, diag);
		}
	}
	if (r == 0) {
		st->n_files = n_shards;
		snprintf(st->first_path, sizeof(st->first_path), "%s", shard_paths[0]);
	} else {
		/* Leave nothing of this run behind. */
		for (uint32_t s = 0; s < done; s++)
			unlink(shard_paths[s]);
		if (index_path)
			unlink(index_path);
		if (made_dir)
			rmdir(out->path);
	}
out:
	if (shard_paths)
		for (uint32_t s = 0; s < n_shards; s++)
			free(shard_paths[s]);
	if (shard_names)
		for (uint32_t s = 0; s < n_shards; s++)
			free(shard_names[s]);
	free(shard_paths);
	free(shard_names);
	free(index_path);
	free(config_path);
	free(ts);
	return r;
}

int gen_emit(const struct gen_plan *plan, const struct gen_vocab *vocab,
             const struct gen_output *out, struct gen_stats *ret_stats, struct wf_diag *diag)
{
	struct gen_stats st = {0};
	double t0 = now_s();
	int r = out->safetensors ? emit_safetensors(plan, out, &st, diag)
	                         : emit_gguf(plan, vocab, out, &st, diag);
	st.seconds = now_s() - t0;
	if (r == 0)
		*ret_stats = st;
	return r;
}
