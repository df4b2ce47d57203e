/* wf-gen: deterministic synthetic MoE models that llama.cpp loads and runs.
 *
 * Exit status: 0 done, 1 the model could not be written (nothing is left behind), 2 bad usage. */
#include "gen.h"

#include "base/error.h"
#include "base/units.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#define EXIT_USAGE 2

static const char usage_text[] =
    "usage: wf-gen [options] -o PATH\n"
    "\n"
    "Writes a deterministic, seeded Mixture-of-Experts model in GGUF (llama.cpp loads and runs\n"
    "it) or in Hugging Face safetensors form. The same flags always give the same bytes.\n"
    "\n"
    "model:\n"
    "  --arch qwen3moe|llama   architecture (llama = Mixtral-style MoE)    [qwen3moe]\n"
    "  --layers N              transformer blocks                           [3]\n"
    "  --embd N                embedding width                              [256]\n"
    "  --heads N               attention heads                              [8]\n"
    "  --kv-heads N            key/value heads (divides --heads)            [heads/2]\n"
    "  --head-dim N            size of one head                             [32]\n"
    "  --experts N             experts per layer                  [16; llama 8]\n"
    "  --experts-used N        experts per token                  [4; llama 2]\n"
    "  --expert-ff N           experts' hidden width            [256; llama 512]\n"
    "  --ff N                  feed_forward_length: unused by qwen3moe [3*expert-ff];\n"
    "                          the experts' width for llama (same as --expert-ff)\n"
    "  --vocab N               tokens (at least 333)                        [1024]\n"
    "  --ctx N                 context_length                               [2048]\n"
    "  --seed N                PRNG seed                                    [0]\n"
    "  --name TEXT             general.name                 [wf-gen-ARCH-seedN]\n"
    "  --size SIZE             scale the dims that were not given (layers, embd, experts,\n"
    "                          expert ff) to about SIZE bytes, e.g. 64M, 2G, 10G\n"
    "\n"
    "tensor types (F32 F16 BF16 Q8_0 Q4_0 Q4_K Q6_K; norms and the router are always F32):\n"
    "  --type-experts T        ffn_{gate,up,down}_exps                      [Q4_K]\n"
    "  --type-attn T           attn_{q,k,v,output}                          [Q8_0]\n"
    "  --type-embd T           token_embd                                   [Q8_0]\n"
    "  --type-output T         output                                       [Q6_K]\n"
    "  --type-dense T          dense FFN and shared experts (none in these archs) [Q8_0]\n"
    "  --types LIST            the same as a list: experts=Q4_K,attn=Q8_0,...\n"
    "                          Q4_K and Q6_K need every row width to be a multiple of 256,\n"
    "                          Q8_0 and Q4_0 of 32. safetensors takes F32 F16 BF16 [BF16].\n"
    "\n"
    "output:\n"
    "  -o, --output PATH       the .gguf file, or the directory for safetensors (required)\n"
    "  --format gguf|safetensors                                            [gguf]\n"
    "  --split-max-size SIZE   shards of at most SIZE tensor bytes, named like llama.cpp's\n"
    "                          PREFIX-00001-of-0000N.gguf (PATH must end in .gguf)\n"
    "  --alignment N           GGUF data alignment, a power of two          [32]\n"
    "  --threads N             generator threads                   [online CPUs]\n"
    "  --fsync                 fsync the files before returning\n"
    "  --buffered              write through the page cache; the default is O_DIRECT where\n"
    "                          the filesystem allows it (GGUF only)\n"
    "  --dry-run               print the plan, write nothing\n"
    "  -q, --quiet             no summary line\n"
    "  -h, --help              this text\n"
    "  --version               print \"wf-gen VERSION\" and exit\n";

enum {
	OPT_ARCH = 256,
	OPT_LAYERS,
	OPT_EMBD,
	OPT_HEADS,
	OPT_KV_HEADS,
	OPT_HEAD_DIM,
	OPT_EXPERTS,
	OPT_EXPERTS_USED,
	OPT_EXPERT_FF,
	OPT_FF,
	OPT_VOCAB,
	OPT_CTX,
	OPT_SEED,
	OPT_NAME,
	OPT_SIZE,
	OPT_TYPE_EXPERTS,
	OPT_TYPE_ATTN,
	OPT_TYPE_EMBD,
	OPT_TYPE_OUTPUT,
	OPT_TYPE_DENSE,
	OPT_TYPES,
	OPT_FORMAT,
	OPT_SPLIT,
	OPT_ALIGNMENT,
	OPT_THREADS,
	OPT_FSYNC,
	OPT_BUFFERED,
	OPT_DRY_RUN,
	OPT_VERSION,
};

static const struct option long_opts[] = {
    {"arch", required_argument, NULL, OPT_ARCH},
    {"layers", required_argument, NULL, OPT_LAYERS},
    {"embd", required_argument, NULL, OPT_EMBD},
    {"heads", required_argument, NULL, OPT_HEADS},
    {"kv-heads", required_argument, NULL, OPT_KV_HEADS},
    {"head-dim", required_argument, NULL, OPT_HEAD_DIM},
    {"experts", required_argument, NULL, OPT_EXPERTS},
    {"experts-used", required_argument, NULL, OPT_EXPERTS_USED},
    {"expert-ff", required_argument, NULL, OPT_EXPERT_FF},
    {"ff", required_argument, NULL, OPT_FF},
    {"vocab", required_argument, NULL, OPT_VOCAB},
    {"ctx", required_argument, NULL, OPT_CTX},
    {"seed", required_argument, NULL, OPT_SEED},
    {"name", required_argument, NULL, OPT_NAME},
    {"size", required_argument, NULL, OPT_SIZE},
    {"type-experts", required_argument, NULL, OPT_TYPE_EXPERTS},
    {"type-attn", required_argument, NULL, OPT_TYPE_ATTN},
    {"type-embd", required_argument, NULL, OPT_TYPE_EMBD},
    {"type-output", required_argument, NULL, OPT_TYPE_OUTPUT},
    {"type-dense", required_argument, NULL, OPT_TYPE_DENSE},
    {"types", required_argument, NULL, OPT_TYPES},
    {"format", required_argument, NULL, OPT_FORMAT},
    {"split-max-size", required_argument, NULL, OPT_SPLIT},
    {"alignment", required_argument, NULL, OPT_ALIGNMENT},
    {"threads", required_argument, NULL, OPT_THREADS},
    {"fsync", no_argument, NULL, OPT_FSYNC},
    {"buffered", no_argument, NULL, OPT_BUFFERED},
    {"dry-run", no_argument, NULL, OPT_DRY_RUN},
    {"output", required_argument, NULL, 'o'},
    {"quiet", no_argument, NULL, 'q'},
    {"help", no_argument, NULL, 'h'},
    {"version", no_argument, NULL, OPT_VERSION},
    {NULL, 0, NULL, 0},
};

static const char *opt_name(int val)
{
	for (const struct option *o = long_opts; o->name; o++)
		if (o->val == val)
			return o->name;
	return "?";
}

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage_error(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "wf-gen: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n(see wf-gen --help)\n");
	va_end(ap);
	return EXIT_USAGE;
}

static int parse_u64(const char *s, uint64_t *ret)
{
	if (!s || !isdigit((unsigned char)*s))
		return WF_EINVAL;
	errno = 0;
	char *end;
	unsigned long long v = strtoull(s, &end, 0);
	if (errno || *end)
		return WF_EINVAL;
	*ret = v;
	return 0;
}

static int parse_u32(const char *s, uint32_t *ret)
{
	uint64_t v;
	if (parse_u64(s, &v) < 0 || v > UINT32_MAX)
		return WF_EINVAL;
	*ret = (uint32_t)v;
	return 0;
}

static int parse_type(const char *s, enum wf_dtype *ret)
{
	char up[16];
	size_t n = strlen(s);
	if (n == 0 || n >= sizeof(up))
		return WF_EINVAL;
	for (size_t i = 0; i <= n; i++)
		up[i] = (char)toupper((unsigned char)s[i]);
	enum wf_dtype t;
	if (wf_dtype_from_name(up, &t) < 0 || !gen_dtype_supported(t))
		return WF_EINVAL;
	*ret = t;
	return 0;
}

static int class_from_name(const char *s, size_t n, enum gen_class *ret)
{
	for (int i = 0; i < GEN_N_TYPED_CLASSES; i++) {
		const char *name = gen_class_name((enum gen_class)i);
		if (strlen(name) == n && strncmp(name, s, n) == 0) {
			*ret = (enum gen_class)i;
			return 0;
		}
	}
	return WF_EINVAL;
}

/* "experts=Q4_K,attn=Q8_0,..." */
static int parse_types(const char *list, struct gen_config *cfg)
{
	const char *p = list;
	while (*p) {
		const char *comma = strchr(p, ',');
		size_t len = comma ? (size_t)(comma - p) : strlen(p);
		const char *eq = memchr(p, '=', len);
		char item[64];
		snprintf(item, sizeof(item), "%.*s", (int)len, p);
		if (!eq)
			return usage_error("--types: '%s' is not CLASS=TYPE", item);
		enum gen_class c;
		if (class_from_name(p, (size_t)(eq - p), &c) < 0)
			return usage_error("--types: unknown class in '%s' (experts, attn, embd, "
			                   "output, dense)",
			                   item);
		char type[32];
		snprintf(type, sizeof(type), "%.*s", (int)(len - (size_t)(eq - p) - 1), eq + 1);
		if (parse_type(type, &cfg->types[c]) < 0)
			return usage_error("--types: unsupported type '%s' (F32 F16 BF16 Q8_0 Q4_0 "
			                   "Q4_K Q6_K)",
			                   type);
		p += len;
		if (*p == ',')
			p++;
	}
	return 0;
}

static void print_plan(FILE *f, const struct gen_plan *p, uint64_t est)
{
	const struct gen_dims *d = &p->cfg.dims;
	fprintf(
	    f,
	    "arch %s: layers %u, embd %u, heads %u/%u x %u, experts %u (used %u), expert ff %u, "
	    "ff %u, vocab %u, ctx %u, seed %llu\n",
	    gen_arch_name(p->cfg.arch), d->layers, d->embd, d->heads, d->kv_heads, d->head_dim,
	    d->experts, d->experts_used, d->expert_ff, d->ff, d->vocab, d->ctx,
	    (unsigned long long)p->cfg.seed);
	fprintf(f, "types:");
	for (int i = 0; i < GEN_N_TYPED_CLASSES; i++)
		fprintf(f, " %s=%s", gen_class_name((enum gen_class)i),
		        wf_dtype_info(p->cfg.types[i])->name);
	fprintf(f, " (norms, router: F32)\n");
	fprintf(f, "%u tensors, %llu bytes of tensor data, about %llu bytes in files\n",
	        p->n_tensors, (unsigned long long)p->data_bytes, (unsigned long long)est);
}

int main(int argc, char **argv)
{
	struct gen_config cfg = {.arch = GEN_ARCH_QWEN3MOE};
	for (int i = 0; i < GEN_N_TYPED_CLASSES; i++)
		cfg.types[i] = WF_DTYPE_MAX_; /* "not given" */
	struct gen_output out = {0};
	bool quiet = false, dry_run = false;
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	out.threads = ncpu < 1 ? 1 : ncpu > 16 ? 16 : (uint32_t)ncpu;

	int opt;
	while ((opt = getopt_long(argc, argv, "o:qh", long_opts, NULL)) != -1) {
		uint32_t *dim = NULL;
		uint32_t bit = 0;
		int cls = -1;
		switch (opt) {
		case 'h':
			fputs(usage_text, stdout);
			return 0;
		case OPT_VERSION:
			printf("wf-gen %s\n", WF_VERSION);
			return 0;
		case 'q':
			quiet = true;
			continue;
		case 'o':
			out.path = optarg;
			continue;
		case OPT_ARCH:
			if (gen_arch_from_name(optarg, &cfg.arch) < 0)
				return usage_error("--arch '%s' is not supported (qwen3moe, llama)",
				                   optarg);
			continue;
		case OPT_LAYERS:
			dim = &cfg.dims.layers, bit = GEN_DIM_LAYERS;
			break;
		case OPT_EMBD:
			dim = &cfg.dims.embd, bit = GEN_DIM_EMBD;
			break;
		case OPT_HEADS:
			dim = &cfg.dims.heads, bit = GEN_DIM_HEADS;
			break;
		case OPT_KV_HEADS:
			dim = &cfg.dims.kv_heads, bit = GEN_DIM_KV_HEADS;
			break;
		case OPT_HEAD_DIM:
			dim = &cfg.dims.head_dim, bit = GEN_DIM_HEAD_DIM;
			break;
		case OPT_EXPERTS:
			dim = &cfg.dims.experts, bit = GEN_DIM_EXPERTS;
			break;
		case OPT_EXPERTS_USED:
			dim = &cfg.dims.experts_used, bit = GEN_DIM_EXPERTS_USED;
			break;
		case OPT_EXPERT_FF:
			dim = &cfg.dims.expert_ff, bit = GEN_DIM_EXPERT_FF;
			break;
		case OPT_FF:
			dim = &cfg.dims.ff, bit = GEN_DIM_FF;
			break;
		case OPT_VOCAB:
			dim = &cfg.dims.vocab, bit = GEN_DIM_VOCAB;
			break;
		case OPT_CTX:
			dim = &cfg.dims.ctx, bit = GEN_DIM_CTX;
			break;
		case OPT_SEED:
			if (parse_u64(optarg, &cfg.seed) < 0)
				return usage_error("--seed '%s' is not a non-negative integer",
				                   optarg);
			continue;
		case OPT_NAME:
			cfg.name = optarg;
			continue;
		case OPT_SIZE:
			if (wf_parse_size(optarg, &cfg.target_size) < 0 || cfg.target_size == 0)
				return usage_error("--size '%s' is not a size like 64M or 2G",
				                   optarg);
			continue;
		case OPT_TYPE_EXPERTS:
			cls = GEN_CLASS_EXPERTS;
			break;
		case OPT_TYPE_ATTN:
			cls = GEN_CLASS_ATTN;
			break;
		case OPT_TYPE_EMBD:
			cls = GEN_CLASS_EMBD;
			break;
		case OPT_TYPE_OUTPUT:
			cls = GEN_CLASS_OUTPUT;
			break;
		case OPT_TYPE_DENSE:
			cls = GEN_CLASS_DENSE;
			break;
		case OPT_TYPES: {
			int r = parse_types(optarg, &cfg);
			if (r)
				return r;
			continue;
		}
		case OPT_FORMAT:
			if (strcmp(optarg, "gguf") == 0)
				out.safetensors = false;
			else if (strcmp(optarg, "safetensors") == 0)
				out.safetensors = true;
			else
				return usage_error("--format '%s' is not gguf or safetensors",
				                   optarg);
			continue;
		case OPT_SPLIT:
			if (wf_parse_size(optarg, &out.split_max_bytes) < 0 ||
			    out.split_max_bytes == 0)
				return usage_error("--split-max-size '%s' is not a size like 100M",
				                   optarg);
			continue;
		case OPT_ALIGNMENT:
			if (parse_u32(optarg, &out.alignment) < 0 || out.alignment < 1 ||
			    (out.alignment & (out.alignment - 1)) || out.alignment > (1u << 20))
				return usage_error("--alignment '%s' is not a power of two up to "
				                   "1M",
				                   optarg);
			continue;
		case OPT_THREADS:
			if (parse_u32(optarg, &out.threads) < 0 || out.threads < 1 ||
			    out.threads > 256)
				return usage_error("--threads '%s' is not 1..256", optarg);
			continue;
		case OPT_FSYNC:
			out.fsync = true;
			continue;
		case OPT_BUFFERED:
			out.buffered = true;
			continue;
		case OPT_DRY_RUN:
			dry_run = true;
			continue;
		default:
			fprintf(stderr, "(see wf-gen --help)\n");
			return EXIT_USAGE;
		}
		if (dim) {
			if (parse_u32(optarg, dim) < 0)
				return usage_error("--%s '%s' is not a non-negative integer",
				                   opt_name(opt), optarg);
			cfg.dims_set |= bit;
		} else {
			if (parse_type(optarg, &cfg.types[cls]) < 0)
				return usage_error(
				    "--type-%s '%s' is not supported (F32 F16 BF16 Q8_0 "
				    "Q4_0 Q4_K Q6_K)",
				    gen_class_name((enum gen_class)cls), optarg);
		}
	}
	if (optind < argc)
		return usage_error("unexpected argument '%s'", argv[optind]);
	if (!out.path && !dry_run)
		return usage_error("no output: give -o PATH");
	if (out.safetensors) {
		/* safetensors has no ggml block types: default to BF16, refuse quantized types */
		for (int i = 0; i < GEN_N_TYPED_CLASSES; i++) {
			if (cfg.types[i] == WF_DTYPE_MAX_)
				cfg.types[i] = WF_DTYPE_BF16;
			else if (wf_dtype_info(cfg.types[i])->quantized)
				return usage_error(
				    "--format safetensors cannot hold %s (--type-%s): "
				    "use F32, F16 or BF16",
				    wf_dtype_info(cfg.types[i])->name,
				    gen_class_name((enum gen_class)i));
		}
		if (out.alignment)
			return usage_error("--alignment applies to GGUF only");
	} else if (out.split_max_bytes && out.path) {
		size_t n = strlen(out.path);
		if (n < 6 || strcmp(out.path + n - 5, ".gguf") != 0 || out.path[n - 6] == '/')
			return usage_error(
			    "--split-max-size needs -o PREFIX.gguf (shards are named "
			    "PREFIX-00001-of-0000N.gguf), got '%s'",
			    out.path);
	}

	gen_config_defaults(&cfg);
	if (cfg.target_size) {
		double err = gen_config_fit_size(&cfg);
		if (err > 0.10 && !quiet)
			fprintf(
			    stderr,
			    "wf-gen: warning: --size %llu can only be met within %.0f%% with the "
			    "dims given\n",
			    (unsigned long long)cfg.target_size, err * 100.0);
	}
	struct wf_diag diag = {0};
	struct gen_plan plan;
	int r = gen_plan_build(&cfg, &plan, &diag);
	if (r < 0)
		return usage_error("%s", wf_diag_str(&diag, r));
	if (dry_run) {
		print_plan(stdout, &plan, gen_config_bytes(&plan.cfg));
		gen_plan_fini(&plan);
		return 0;
	}

	struct gen_vocab vocab;
	r = gen_vocab_build(cfg.dims.vocab, &vocab);
	if (r < 0) {
		fprintf(stderr, "wf-gen: building the vocabulary: %s\n", wf_strerror(r));
		gen_plan_fini(&plan);
		return 1;
	}
	struct gen_stats st;
	r = gen_emit(&plan, &vocab, &out, &st, &diag);
	if (r < 0) {
		fprintf(stderr, "wf-gen: %s: %s\n", out.path, wf_diag_str(&diag, r));
	} else if (!quiet) {
		double mb = (double)st.bytes / 1e6;
		fprintf(
		    stderr,
		    "wf-gen: %s %s, %u tensors, %llu bytes (%.1f MB) in %u file%s, %.2f s, %.0f "
		    "MB/s: %s\n",
		    gen_arch_name(cfg.arch), out.safetensors ? "safetensors" : "gguf",
		    plan.n_tensors, (unsigned long long)st.bytes, mb, st.n_files,
		    st.n_files == 1 ? "" : "s", st.seconds, st.seconds > 0 ? mb / st.seconds : 0.0,
		    st.first_path);
	}
	gen_vocab_fini(&vocab);
	gen_plan_fini(&plan);
	return r < 0 ? 1 : 0;
}
