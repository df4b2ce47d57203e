/* wf-bench MODE [--json]: weightfloor's benchmarks. Each figure is printed beside an anchor
 * measured in the same run and their ratio, with the goal the issue sets. See
 * docs/BENCHMARKS.md. */
#include "bench.h"
#include "report.h"

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

static void usage(FILE *out)
{
	fprintf(out, "usage: wf-bench floor [--json] [--dir DIR] [--floor-root DIR] [--size SIZE]\n"
		     "                [--only cold,warm,share,attach] [--iterations N]\n"
		     "       wf-bench residency [--json] [--device SPEC] [--dir DIR] [--size SIZE]\n"
		     "                [--only floor,cold]\n"
		     "  --dir         where model files are generated (default /var/tmp/wf-bench;\n"
		     "                must be a disk file system for the cold figure)\n"
		     "  --floor-root  where floors are made (default /dev/shm)\n"
		     "  --size        model size for throughput figures (default 2G)\n"
		     "  wf-bench --version prints \"wf-bench VERSION\".\n");
}

int main(int argc, char **argv)
{
	static char wfgen[PATH_MAX];
	struct bench_opts o = {.dir = "/var/tmp/wf-bench", .floor_root = "/dev/shm", .size = "2G"};
	/* wf-gen sits beside us once installed (bin/), and in a sibling directory in the build tree
	 * (bench/ and tools/); else $PATH finds it. */
	char self[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
	if (n > 0) {
		self[n] = '\0';
		const char *dir = dirname(self);
		snprintf(wfgen, sizeof wfgen, "%s/wf-gen", dir);
		if (access(wfgen, X_OK) != 0)
			snprintf(wfgen, sizeof wfgen, "%s/../tools/wf-gen", dir);
		o.wfgen = access(wfgen, X_OK) == 0 ? wfgen : "wf-gen";
	} else {
		o.wfgen = "wf-gen";
	}
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
		{"help", no_argument, NULL, 'h'},
		{0},
	};
	int c;
	optind = 2;
	while ((c = getopt_long(argc, argv, "jh", opts, NULL)) != -1) {
		switch (c) {
		case 'j': o.json = true; break;
		case 'd': o.dir = optarg; break;
		case 'f': o.floor_root = optarg; break;
		case 's': o.size = optarg; break;
		case 'o': o.only = optarg; break;
		case 'i': o.iterations = atoi(optarg); break;
		case 'D': o.device = optarg; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	bench_report_init(o.json);
	if (strcmp(mode, "floor") == 0)
		return bench_floor(&o);
	if (strcmp(mode, "residency") == 0)
		return bench_residency(&o);
	fprintf(stderr, "wf-bench: unknown mode '%s'\n", mode);
	usage(stderr);
	return 2;
}
