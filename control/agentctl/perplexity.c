/* agentctl perplexity MODEL --file TEXT ...: llama-perplexity's perplexity (or, against a base
 * file, its KL divergence) of the model as a worker serves it (Perplexity, docs/PROTOCOL.md);
 * and the researchers' sweep: --swap-loop --pre-reload CMD evaluates, runs CMD (which rewrites
 * tensor files), reloads the model's changed tensors into its floor, evaluates again against the
 * first evaluation's logits, and so on until a reload changes nothing, then prints the table of
 * iterations. */
#include "cli.h"
#include "pbjson.h"

#include "base/units.h"
#include "control/client.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* An evaluation reads and scores the whole text: without --timeout, wait this long for it (the
 * agent relays for at most 10 minutes). */
#define PPL_TIMEOUT_MS    (10 * 60 * 1000)
#define PPL_TEXT_MAX      ((size_t)64 << 20)
#define SWEEP_MAX_DEFAULT 100u
#define SWEEP_RELOAD_MS   (30 * 60 * 1000)

struct ppl_opts {
	const char *model, *file, *kl_base, *save_base, *worker, *pre_reload, *base_file;
	uint32_t ctx, chunks, max_iter;
	bool swap_loop;
	char *text;
	size_t text_len;
};

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int read_text(struct cli *cli, struct ppl_opts *o)
{
	int fd = open(o->file, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
	struct stat st;
	if (fd < 0)
		return cli_fail(cli, cli_exit_for_err(-errno), "perplexity: %s: %s", o->file,
		                strerror(errno));
	int rc = 0;
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (size_t)st.st_size > PPL_TEXT_MAX)
		rc = cli_fail(cli, CLI_EXIT_INVALID_ARGUMENT,
		              "perplexity: %s: not a regular file of at most %zu bytes", o->file,
		              PPL_TEXT_MAX);
	if (rc == 0 && !(o->text = malloc((size_t)st.st_size + 1)))
		rc = cli_fail(cli, CLI_EXIT_FAIL, "perplexity: out of memory");
	size_t got = 0;
	while (rc == 0 && got < (size_t)st.st_size) {
		ssize_t n = read(fd, o->text + got, (size_t)st.st_size - got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			rc = cli_fail(cli, CLI_EXIT_FAIL, "perplexity: %s: %s", o->file,
			              n < 0 ? strerror(errno) : "shrank while read");
		else
			got += (size_t)n;
	}
	close(fd);
	/* llama-perplexity's -f drops one trailing newline */
	if (rc == 0 && got && o->text[got - 1] == '\n')
		got--;
	o->text_len = got;
	return rc;
}

/* One Perplexity; kl_base/save_base as given, digest/gen: wait for that generation. */
static int evaluate(struct cli *cli, const struct ppl_opts *o, const char *worker, bool with_text,
                    const char *kl_base, const char *save_base, const char *digest, uint64_t gen,
                    Weightfloor__V1__Reply **ret)
{
	Weightfloor__V1__Perplexity p = WEIGHTFLOOR__V1__PERPLEXITY__INIT;
	p.model = (char *)o->model;
	p.worker_id = (char *)(worker ? worker : "");
	if (with_text) {
		p.text.data = (uint8_t *)o->text;
		p.text.len = o->text_len;
	}
	p.n_ctx = o->ctx;
	p.max_chunks = o->chunks;
	p.kl_base = (char *)(kl_base ? kl_base : "");
	p.save_base = (char *)(save_base ? save_base : "");
	p.floor_digest = (char *)(digest ? digest : "");
	p.min_generation = gen;
	Weightfloor__V1__Request req = WEIGHTFLOOR__V1__REQUEST__INIT;
	req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_PERPLEXITY;
	req.perplexity = &p;
	int rc = cli_call(cli, "perplexity", &req, cli->timeout_given ? 0 : PPL_TIMEOUT_MS, ret);
	if (rc == 0 && (*ret)->body_case != WEIGHTFLOOR__V1__REPLY__BODY_PERPLEXITY) {
		wf_ctl_reply_free(*ret);
		*ret = NULL;
		rc = cli_fail(cli, CLI_EXIT_FAIL, "perplexity: unexpected reply");
	}
	return rc;
}

static void print_one(const Weightfloor__V1__PerplexityReply *r)
{
	for (size_t i = 0; i < r->n_chunk_ppl; i++)
		printf("[%zu]%.4f,", i + 1, r->chunk_ppl[i]);
	printf("\n");
	if (r->kl) {
		printf("PPL(Q)    : %.6f\nPPL(base) : %.6f ± %.6f\n", r->ppl, r->ppl_base,
		       r->ppl_base_error);
		printf("Mean    KLD: %10.6f ± %10.6f\nMedian  KLD: %10.6f\n99.0%%   KLD: %10.6f\n"
		       "99.9%%   KLD: %10.6f\nSame top p: %.3f ± %.3f %%\n",
		       r->kld, r->kld_error, r->kld_median, r->kld_p99, r->kld_p999,
		       100.0 * r->same_top, 100.0 * r->same_top_error);
	} else {
		printf("Final estimate: PPL = %.4f +/- %.5f\n", r->ppl, r->ppl_error);
	}
	printf("(worker %s, context %u, %u chunks, %" PRIu64 " tokens scored, %.2f s)\n",
	       r->worker_id, r->n_ctx, r->chunks, r->tokens_scored, r->seconds);
}

/* Runs the sweep's command with the iteration in its environment. */
static int run_pre_reload(struct cli *cli, const struct ppl_opts *o, uint32_t iter)
{
	pid_t pid = fork();
	if (pid < 0)
		return cli_fail(cli, CLI_EXIT_FAIL, "perplexity: fork: %s", strerror(errno));
	if (pid == 0) {
		char it[16];
		snprintf(it, sizeof it, "%u", iter);
		setenv("WF_SWEEP_ITERATION", it, 1);
		setenv("WF_SWEEP_MODEL", o->model, 1);
		/* the command's output must not mix into a --json document */
		if (cli->json)
			dup2(STDERR_FILENO, STDOUT_FILENO);
		execl("/bin/sh", "sh", "-c", o->pre_reload, (char *)NULL);
		_exit(127);
	}
	int st = 0;
	while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
		;
	if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
		return 0;
	return cli_fail(cli, CLI_EXIT_FAIL,
	                "perplexity: --pre-reload command failed (%s %d) at iteration %u: the "
	                "sweep stops",
	                WIFEXITED(st) ? "exit" : "signal",
	                WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st), iter);
}

static int reload(struct cli *cli, const char *model, Weightfloor__V1__Reply **ret)
{
	Weightfloor__V1__ReloadModel rm = WEIGHTFLOOR__V1__RELOAD_MODEL__INIT;
	rm.name = (char *)model;
	Weightfloor__V1__Request req = WEIGHTFLOOR__V1__REQUEST__INIT;
	req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_RELOAD_MODEL;
	req.reload_model = &rm;
	int rc = cli_call(cli, "reload", &req, cli->timeout_given ? 0 : SWEEP_RELOAD_MS, ret);
	if (rc == 0 && (*ret)->body_case != WEIGHTFLOOR__V1__REPLY__BODY_RELOAD) {
		wf_ctl_reply_free(*ret);
		*ret = NULL;
		rc = cli_fail(cli, CLI_EXIT_FAIL, "reload: unexpected reply");
	}
	return rc;
}

struct sweep_row {
	uint32_t iter, tensors;
	double ppl, ppl_err, kld, kld_err, same_top, seconds;
};

static void print_row(const struct sweep_row *r, bool header)
{
	if (header)
		printf("%4s %8s %14s %12s %12s %10s %9s\n", "ITER", "TENSORS", "PPL", "±", "KLD",
		       "SAME TOP", "SECONDS");
	printf("%4u %8u %14.4f %12.5f %12.6f %9.3f%% %9.2f\n", r->iter, r->tensors, r->ppl,
	       r->ppl_err, r->kld, 100.0 * r->same_top, r->seconds);
	fflush(stdout);
}

static struct json_object *row_json(const struct sweep_row *r)
{
	struct json_object *o = json_object_new_object();
	json_object_object_add(o, "iteration", json_object_new_int64(r->iter));
	json_object_object_add(o, "tensors_changed", json_object_new_int64(r->tensors));
	json_object_object_add(o, "ppl", json_object_new_double(r->ppl));
	json_object_object_add(o, "ppl_error", json_object_new_double(r->ppl_err));
	json_object_object_add(o, "kld", json_object_new_double(r->kld));
	json_object_object_add(o, "kld_error", json_object_new_double(r->kld_err));
	json_object_object_add(o, "same_top", json_object_new_double(r->same_top));
	json_object_object_add(o, "seconds", json_object_new_double(r->seconds));
	return o;
}

/* One iteration after the first: the command, the reload, the evaluation against the base.
 * *ret_done when the reload changed nothing. */
static int sweep_step(struct cli *cli, const struct ppl_opts *o, const char *worker, uint32_t it,
                      struct sweep_row *row, bool *ret_done)
{
	Weightfloor__V1__Reply *rr = NULL, *pr = NULL;
	const double t0 = now_s();
	int rc = run_pre_reload(cli, o, it);
	if (rc == 0)
		rc = reload(cli, o->model, &rr);
	if (rc)
		return rc;
	const Weightfloor__V1__ReloadReply *rl = rr->reload;
	if (rl->tensors_refused) {
		for (size_t i = 0; i < rl->n_tensors; i++)
			if (rl->tensors[i]->outcome ==
			    WEIGHTFLOOR__V1__RELOAD_OUTCOME__RELOAD_OUTCOME_REFUSED)
				fprintf(stderr, "agentctl: refused: %s: %s\n", rl->tensors[i]->name,
				        rl->tensors[i]->reason);
		rc = cli_fail(cli, CLI_EXIT_FAILED_PRECONDITION,
		              "perplexity: the reload of iteration %u refused %u tensor(s): the "
		              "sweep stops",
		              it, rl->tensors_refused);
	} else if (!rl->tensors_reloaded) {
		*ret_done = true;
	} else {
		rc = evaluate(cli, o, worker, false, o->base_file, NULL, rl->digest_hex,
		              rl->generation, &pr);
		if (rc == 0) {
			const Weightfloor__V1__PerplexityReply *p = pr->perplexity;
			*row = (struct sweep_row){.iter = it,
			                          .tensors = rl->tensors_reloaded,
			                          .ppl = p->ppl,
			                          .ppl_err = p->ppl_error,
			                          .kld = p->kld,
			                          .kld_err = p->kld_error,
			                          .same_top = p->same_top,
			                          .seconds = now_s() - t0};
		}
	}
	wf_ctl_reply_free(pr);
	wf_ctl_reply_free(rr);
	return rc;
}

static int sweep(struct cli *cli, const struct ppl_opts *o)
{
	Weightfloor__V1__Reply *pr = NULL;
	char worker[256] = "";
	snprintf(worker, sizeof worker, "%s", o->worker ? o->worker : "");
	const double t0 = now_s();
	/* Iteration 0: the baseline's logits saved as the base of the others, then the baseline
	 * against them, so that every row is computed the same way (KL mode): a restored file
	 * gives row 0 again to the bit. */
	int rc = evaluate(cli, o, worker, true, NULL, o->base_file, NULL, 0, &pr);
	if (rc)
		return rc;
	/* every later evaluation on the same worker, whose file system holds the base */
	snprintf(worker, sizeof worker, "%s", pr->perplexity->worker_id);
	wf_ctl_reply_free(pr);
	pr = NULL;
	if ((rc = evaluate(cli, o, worker, false, o->base_file, NULL, NULL, 0, &pr)))
		return rc;
	const Weightfloor__V1__PerplexityReply *p0 = pr->perplexity;
	struct sweep_row row = {.iter = 0,
	                        .ppl = p0->ppl,
	                        .ppl_err = p0->ppl_error,
	                        .kld = p0->kld,
	                        .kld_err = p0->kld_error,
	                        .same_top = p0->same_top,
	                        .seconds = now_s() - t0};
	wf_ctl_reply_free(pr);
	struct json_object *rows = cli->json ? json_object_new_array() : NULL;
	if (rows)
		json_object_array_add(rows, row_json(&row));
	else
		print_row(&row, true);
	bool done = false;
	uint32_t it = 1;
	for (; rc == 0 && !done && it <= o->max_iter; it++) {
		rc = sweep_step(cli, o, worker, it, &row, &done);
		if (rc == 0 && !done) {
			if (rows)
				json_object_array_add(rows, row_json(&row));
			else
				print_row(&row, false);
		}
	}
	if (rc == 0 && !done)
		fprintf(stderr, "agentctl: perplexity: stopped after --max-iterations %u\n",
		        o->max_iter);
	else if (rc == 0 && !rows)
		printf("(iteration %u: the reload changed nothing: done)\n", it - 1);
	if (rows) {
		struct json_object *doc = json_object_new_object();
		json_object_object_add(doc, "model", json_object_new_string(o->model));
		json_object_object_add(doc, "worker_id", json_object_new_string(worker));
		json_object_object_add(doc, "iterations", rows);
		if (rc == 0)
			cli_json_print(cli, doc);
		else
			json_object_put(doc);
	}
	return rc;
}

static int parse_args(struct cli *cli, int argc, char **argv, struct ppl_opts *o)
{
	static const char *usage_text =
	    "usage: agentctl perplexity MODEL --file TEXT [--ctx N] [--chunks N] [--worker ID]\n"
	    "                           [--kl-base FILE | --save-base FILE]\n"
	    "       agentctl perplexity MODEL --file TEXT --swap-loop --pre-reload CMD\n"
	    "                           [--base-file FILE] [--max-iterations N] [--ctx N]\n"
	    "                           [--chunks N] [--worker ID]\n"
	    "  llama-perplexity's perplexity of MODEL over TEXT as a worker serves it (context N,\n"
	    "  default 512; the second half of each chunk scored), or with --kl-base its KL\n"
	    "  divergence against a base file (--save-base writes one). The files are on the\n"
	    "  worker's file system. --swap-loop: evaluate, then repeatedly run CMD (sh -c; it\n"
	    "  rewrites tensor files; WF_SWEEP_ITERATION and WF_SWEEP_MODEL in its environment),\n"
	    "  reload the changed tensors into the floor and evaluate against the first\n"
	    "  evaluation's logits (saved to --base-file, default /tmp/wf-sweep-PID.kld), until a\n"
	    "  reload changes nothing (at most --max-iterations, default 100); one table row\n"
	    "  per iteration: tensors changed, PPL, KLD, same top token, seconds.\n";
	static const struct option opts[] = {
	    {"file", required_argument, NULL, 'f'},
	    {"ctx", required_argument, NULL, 'c'},
	    {"chunks", required_argument, NULL, 'n'},
	    {"worker", required_argument, NULL, 'w'},
	    {"kl-base", required_argument, NULL, 'k'},
	    {"save-base", required_argument, NULL, 's'},
	    {"swap-loop", no_argument, NULL, 'l'},
	    {"pre-reload", required_argument, NULL, 'p'},
	    {"base-file", required_argument, NULL, 'b'},
	    {"max-iterations", required_argument, NULL, 'm'},
	    {"help", no_argument, NULL, 'h'},
	    {0},
	};
	int c, rc = 0;
	uint64_t v;
	optind = 0;
	opterr = 0;
	while (rc == 0 &&
	       (c = getopt_long(argc, argv, ":f:c:n:w:k:s:lp:b:m:h", opts, NULL)) != -1) {
		switch (c) {
		case 'f':
			o->file = optarg;
			break;
		case 'w':
			o->worker = optarg;
			break;
		case 'k':
			o->kl_base = optarg;
			break;
		case 's':
			o->save_base = optarg;
			break;
		case 'l':
			o->swap_loop = true;
			break;
		case 'p':
			o->pre_reload = optarg;
			break;
		case 'b':
			o->base_file = optarg;
			break;
		case 'c':
		case 'n':
		case 'm':
			if (wf_parse_uint(optarg, c == 'c' ? (1u << 20) : UINT32_MAX, &v) < 0 ||
			    (c == 'c' && v < 4) || (c == 'm' && v == 0))
				return cli_usage(cli, "perplexity", "--%s: '%s' is out of range",
				                 c == 'c'   ? "ctx"
				                 : c == 'n' ? "chunks"
				                            : "max-iterations",
				                 optarg);
			*(c == 'c' ? &o->ctx : c == 'n' ? &o->chunks : &o->max_iter) = (uint32_t)v;
			break;
		case 'h':
			printf("%s", usage_text);
			return -1;
		default:
			rc = cli_bad_option(cli, "perplexity", argc, argv);
		}
	}
	if (rc == 0)
		rc = cli_check_args(cli, "perplexity", argc, argv, optind, 1, 1, "MODEL");
	if (rc)
		return rc;
	o->model = argv[optind];
	if (o->kl_base && o->save_base)
		return cli_usage(cli, "perplexity", "give --kl-base or --save-base, not both");
	if (o->swap_loop && (!o->pre_reload || !o->file || o->kl_base || o->save_base))
		return cli_usage(cli, "perplexity",
		                 "--swap-loop needs --pre-reload CMD and --file, and takes neither "
		                 "--kl-base nor --save-base (the base is --base-file)");
	if (!o->swap_loop && (o->pre_reload || o->base_file || o->max_iter))
		return cli_usage(
		    cli, "perplexity",
		    "--pre-reload, --base-file and --max-iterations go with --swap-loop");
	if (!o->file && !o->kl_base)
		return cli_usage(cli, "perplexity", "give --file TEXT (or --kl-base FILE)");
	return 0;
}

int cmd_perplexity(struct cli *cli, int argc, char **argv)
{
	struct ppl_opts o = {0};
	char base[64];
	int rc = parse_args(cli, argc, argv, &o);
	if (rc)
		return rc < 0 ? CLI_EXIT_OK : rc;
	if (o.swap_loop && !o.base_file) {
		snprintf(base, sizeof base, "/tmp/wf-sweep-%d.kld", (int)getpid());
		o.base_file = base;
	}
	if (!o.max_iter)
		o.max_iter = SWEEP_MAX_DEFAULT;
	if (o.file && (rc = read_text(cli, &o)))
		return rc;
	/* the request carries the text: up to the agent's max_message */
	cli->max_request_size = o.text_len + ((size_t)1 << 20);
	if (o.swap_loop) {
		rc = sweep(cli, &o);
	} else {
		Weightfloor__V1__Reply *rep = NULL;
		rc = evaluate(cli, &o, o.worker, !o.kl_base, o.kl_base, o.save_base, NULL, 0, &rep);
		if (rc == 0) {
			if (cli->json)
				cli_json_print(cli, wf_pb_to_json(&rep->perplexity->base));
			else
				print_one(rep->perplexity);
		}
		wf_ctl_reply_free(rep);
	}
	free(o.text);
	return rc;
}
