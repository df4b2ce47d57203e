/* wf-bench MODE [--json]: weightfloor's benchmarks. Each figure is printed beside an anchor
 * measured in the same run and their ratio, with the goal the issue sets. See
 * docs/BENCHMARKS.md. */
#include "bench.h"
#include "report.h"

#include "base/units.h"
#include "device/device.h"
#ifdef WF_HAVE_CUDA
#include "cuda/backend.h"
#include "cuda/device_cuda.h"
#endif

#include <getopt.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

bool bench_selected(const struct bench_opts *o, const char *name)
{
	if (!o->only)
		return true;
	size_t n = strlen(name);
	for (const char *p = o->only; (p = strstr(p, name)); p += n)
		if ((p == o->only || p[-1] == ',') && (p[n] == ',' || p[n] == '\0'))
			return true;
	return false;
}

void bench_tool(const char *name, const char *build_dir, char *out, size_t len)
{
	/* Installed, the tools sit beside us (bin/); in the build tree, in a sibling directory of
	 * bench/. */
	char self[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
	if (n > 0) {
		self[n] = '\0';
		const char *dir = dirname(self);
		snprintf(out, len, "%s/%s", dir, name);
		if (access(out, X_OK) == 0)
			return;
		snprintf(out, len, "%s/../%s/%s", dir, build_dir, name);
		if (access(out, X_OK) == 0)
			return;
	}
	snprintf(out, len, "%s", name);
}

static void usage(FILE *out)
{
	fprintf(
	    out,
	    "usage: wf-bench floor [--json] [--dir DIR] [--floor-root DIR] [--size SIZE]\n"
	    "                [--only cold,warm,share,attach] [--iterations N]\n"
	    "       wf-bench residency [--json] [--device SPEC] [--dir DIR] [--size SIZE]\n"
	    "                [--only floor,cold,throttle]\n"
	    "       wf-bench engine [--json] [--model FILE] [--llama-bench PATH] [--threads N]\n"
	    "                [--device SPEC [--llama-bench-gpu PATH]] [--dir DIR]\n"
	    "                [--floor-root DIR] [--iterations N]\n"
	    "       wf-bench kernels [--json] [--device cuda:N] [--iterations N]\n"
	    "       wf-bench cachepolicy [--json] [--model FILE] [--tokens N]\n"
	    "                [--prompt-ids LIST | --prompt TEXT] [--half-life LIST]\n"
	    "                [--random-tokens]\n"
	    "                [--threads N] [--dir DIR]\n"
	    "       wf-bench hotswap [--json] [--dir DIR] [--floor-root DIR] [--only "
	    "split,single]\n"
	    "                [--iterations N]\n"
	    "  --dir         where model files are generated (default /var/tmp/wf-bench;\n"
	    "                must be a disk file system for the cold figure)\n"
	    "  --floor-root  where floors are made (default /dev/shm)\n"
	    "  --size        model size for throughput figures (default 2G)\n"
	    "  --model       engine: the model (default: generate issue 10's 1 GB qwen3moe\n"
	    "                Q4_K model in --dir, once)\n"
	    "  --llama-bench engine: a llama-bench (llama.cpp b10573) to compare with\n"
	    "  --device      residency: the device (default auto); engine: also run the\n"
	    "                device rows (dev_*) on it (cuda:0, host:bw=16G, ...);\n"
	    "                kernels: the CUDA device (default cuda:0; none: exit 77)\n"
	    "  --llama-bench-gpu engine: a CUDA llama-bench (b10573) run with -ngl 99 and\n"
	    "                every layer's experts on the CPU, against the dev cache row\n"
	    "  --threads     engine: threads for both (default: the CPUs we may run on)\n"
	    "  --tokens      cachepolicy: greedy tokens generated after the prompt (256)\n"
	    "  --prompt-ids  cachepolicy: the prompt as token ids (default: the reference\n"
	    "                models' 16 ids); --prompt TEXT: through the model's tokenizer\n"
	    "  --half-life   cachepolicy: LRFU half-lives in tokens, comma-separated (16;\n"
	    "                0: no decay, LFU)\n"
	    "  --random-tokens cachepolicy: after the prompt, a fixed pseudo-random token\n"
	    "                stream instead of greedy decoding\n"
	    "  --iterations  repetitions of each figure; engine: 1 also shortens the runs\n"
	    "  wf-bench --version prints \"wf-bench VERSION\".\n");
}

int main(int argc, char **argv)
{
	static char wfgen[PATH_MAX];
	struct bench_opts o = {.dir = "/var/tmp/wf-bench", .floor_root = "/dev/shm", .size = "2G"};
	bench_tool("wf-gen", "tools", wfgen, sizeof wfgen);
	o.wfgen = wfgen;
	if (argc >= 2 && strcmp(argv[1], "--version") == 0) {
		printf("wf-bench %s\n", WF_VERSION);
		return 0;
	}
	if (argc < 2 || argv[1][0] == '-') {
		usage(argc < 2 ? stderr : stdout);
		return argc < 2 ? 2 : 0;
	}
	const char *mode = argv[1];
	static const struct option opts[] = {
	    {"json", no_argument, NULL, 'j'},
	    {"dir", required_argument, NULL, 'd'},
	    {"floor-root", required_argument, NULL, 'f'},
	    {"size", required_argument, NULL, 's'},
	    {"only", required_argument, NULL, 'o'},
	    {"iterations", required_argument, NULL, 'i'},
	    {"device", required_argument, NULL, 'D'},
	    {"model", required_argument, NULL, 'm'},
	    {"llama-bench", required_argument, NULL, 'L'},
	    {"llama-bench-gpu", required_argument, NULL, 'G'},
	    {"threads", required_argument, NULL, 't'},
	    {"tokens", required_argument, NULL, 'T'},
	    {"prompt-ids", required_argument, NULL, 'P'},
	    {"prompt", required_argument, NULL, 'p'},
	    {"half-life", required_argument, NULL, 'H'},
	    {"random-tokens", no_argument, NULL, 'R'},
	    {"help", no_argument, NULL, 'h'},
	    {0},
	};
	int c;
	optind = 2;
	while ((c = getopt_long(argc, argv, "jh", opts, NULL)) != -1) {
		switch (c) {
		case 'j':
			o.json = true;
			break;
		case 'd':
			o.dir = optarg;
			break;
		case 'f':
			o.floor_root = optarg;
			break;
		case 's':
			o.size = optarg;
			break;
		case 'o':
			o.only = optarg;
			break;
		case 'i':
			o.iterations = atoi(optarg);
			break;
		case 'D':
			o.device = optarg;
			break;
		case 'm':
			o.model = optarg;
			break;
		case 'L':
			o.llama_bench = optarg;
			break;
		case 'G':
			o.llama_bench_gpu = optarg;
			break;
		case 't': {
			uint64_t t;
			if (wf_parse_uint(optarg, 256, &t) < 0 || t < 1) {
				fprintf(stderr, "wf-bench: --threads '%s' is not 1..256\n", optarg);
				return 2;
			}
			o.threads = (unsigned)t;
			break;
		}
		case 'T': {
			uint64_t t;
			if (wf_parse_uint(optarg, 65536, &t) < 0 || t < 1) {
				fprintf(stderr, "wf-bench: --tokens '%s' is not 1..65536\n",
				        optarg);
				return 2;
			}
			o.tokens = (uint32_t)t;
			break;
		}
		case 'P':
			o.prompt_ids = optarg;
			break;
		case 'p':
			o.prompt = optarg;
			break;
		case 'H':
			o.half_life = optarg;
			break;
		case 'R':
			o.random_tokens = true;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (o.llama_bench_gpu && !o.device) {
		fprintf(stderr, "wf-bench: --llama-bench-gpu needs --device (the device rows it is "
		                "compared with)\n");
		return 2;
	}
	/* Before any device is opened: the CUDA device backend and its compute backend. */
#ifdef WF_HAVE_CUDA
	wf_device_backend_register(wf_cuda_device_ops());
	wf_cuda_backend_register();
#endif
	bench_report_init(o.json);
	if (strcmp(mode, "floor") == 0)
		return bench_floor(&o);
	if (strcmp(mode, "residency") == 0)
		return bench_residency(&o);
	if (strcmp(mode, "engine") == 0)
		return bench_engine(&o);
	if (strcmp(mode, "cachepolicy") == 0)
		return bench_cachepolicy(&o);
	if (strcmp(mode, "kernels") == 0)
		return bench_kernels(&o);
	if (strcmp(mode, "hotswap") == 0)
		return bench_hotswap(&o);
	fprintf(stderr, "wf-bench: unknown mode '%s'\n", mode);
	usage(stderr);
	return 2;
}
