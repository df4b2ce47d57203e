/* agentctl generate: a completion of a model on a worker, printed as it is made.
 *
 * Generate starts the completion (through the agent's relay), then GenerateRead long polls it
 * until done (docs/PROTOCOL.md "Completions"). An interrupt (SIGINT, SIGTERM) cancels the
 * completion on the worker before exiting; a client killed outright stops reading, and the
 * worker cancels the completion after its idle time-out. */
#include "cli.h"

#include "base/error.h"
#include "base/units.h"
#include "control/client.h"

#include <errno.h>
#include <getopt.h>
#include <json-c/json.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#define GEN_POLL_MS  1000   /* each long poll's wait */
#define GEN_START_MS 600000 /* a first Generate may load the model: its default budget */
#define GEN_IDS_MAX  65536

static const char gen_help[] =
    "usage: agentctl generate MODEL PROMPT [OPTIONS]\n"
    "       agentctl generate MODEL --prompt-ids IDS [OPTIONS]\n"
    "  Generates text with MODEL on a worker and prints it as it is made; the timings (tokens/s)\n"
    "  follow on stderr.\n"
    "  --worker ID           the worker (without it the node must have exactly one)\n"
    "  --prompt-ids IDS      the prompt as comma-separated token ids (no BOS added)\n"
    "  --max-tokens N        tokens to generate at most (default 256)\n"
    "  --temp T              temperature; 0 (the default) is greedy\n"
    "  --top-k K             keep the K most likely tokens (0: off)\n"
    "  --top-p P             keep the smallest set of probability P (0 or 1: off)\n"
    "  --min-p P             drop tokens below P times the best one's probability (0: off)\n"
    "  --repeat-penalty R    penalty for the last 64 tokens (0 or 1: off)\n"
    "  --repeat-last-n N     tokens the penalty looks at (default 64)\n"
    "  --seed S              sampling seed (default: the worker picks one and reports it)\n"
    "  --stop S              stop before this text (repeatable, at most 16)\n"
    "  --ignore-eos          go on past the model's end-of-sequence token\n"
    "  --json prints JSON lines: one {\"index\",\"id\",\"text\"} per token, then one\n"
    "  {\"done\":true,\"finish\",...timings} line.\n";

static volatile sig_atomic_t interrupted;

static void on_signal(int sig)
{
	(void)sig;
	interrupted = 1;
}

static int parse_float(struct cli *cli, const char *flag, const char *s, float *out)
{
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (!*s || *end || errno || !isfinite(v))
		return cli_usage(cli, "generate", "%s: '%s' is not a number", flag, s);
	*out = (float)v;
	return 0;
}

static int parse_uint(struct cli *cli, const char *flag, const char *s, uint64_t max, uint64_t *out)
{
	uint64_t v;
	if (wf_parse_uint(s, max, &v) < 0)
		return cli_usage(cli, "generate", "%s: '%s' is not a number in 0..%llu", flag, s,
		                 (unsigned long long)max);
	*out = v;
	return 0;
}

static int parse_ids(struct cli *cli, const char *s, int32_t **ret, size_t *ret_n)
{
	int rc = wf_parse_ids(s, GEN_IDS_MAX, ret, ret_n);
	if (rc == -ENOMEM)
		return cli_fail(cli, CLI_EXIT_FAIL, "generate: out of memory");
	if (rc < 0)
		return cli_usage(cli, "generate",
		                 "--prompt-ids: '%s' is not a list of at most %d token ids (1,2,3)",
		                 s, GEN_IDS_MAX);
	return 0;
}

static const char *finish_name(Weightfloor__V1__FinishReason f)
{
	switch (f) {
	case WEIGHTFLOOR__V1__FINISH_REASON__FINISH_REASON_EOS:
		return "eos";
	case WEIGHTFLOOR__V1__FINISH_REASON__FINISH_REASON_STOP:
		return "stop";
	case WEIGHTFLOOR__V1__FINISH_REASON__FINISH_REASON_LENGTH:
		return "length";
	case WEIGHTFLOOR__V1__FINISH_REASON__FINISH_REASON_CONTEXT:
		return "context";
	case WEIGHTFLOOR__V1__FINISH_REASON__FINISH_REASON_CANCELED:
		return "canceled";
	case WEIGHTFLOOR__V1__FINISH_REASON__FINISH_REASON_ERROR:
		return "error";
	default:
		return "?";
	}
}

/* Prints the tokens of one reply; returns how many it held. */
static uint32_t print_tokens(struct cli *cli, const Weightfloor__V1__GenerateReply *g,
                             bool *ended_nl)
{
	for (size_t i = 0; i < g->n_tokens; i++) {
		const Weightfloor__V1__GeneratedToken *t = g->tokens[i];
		if (cli->json) {
			struct json_object *o = json_object_new_object();
			json_object_object_add(o, "index", json_object_new_int64(g->first + i));
			json_object_object_add(o, "id", json_object_new_int(t->id));
			json_object_object_add(o, "text",
			                       json_object_new_string_len(
			                           (const char *)t->text.data, (int)t->text.len));
			printf("%s\n", json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
			json_object_put(o);
		} else if (t->text.len) {
			fwrite(t->text.data, 1, t->text.len, stdout);
			*ended_nl = t->text.data[t->text.len - 1] == '\n';
		}
	}
	fflush(stdout);
	return (uint32_t)g->n_tokens;
}

/* The final line: the outcome and the timings. Returns the exit code for the finish. */
static int print_end(struct cli *cli, const Weightfloor__V1__GenerateReply *g, bool ended_nl)
{
	const Weightfloor__V1__GenerateTimings *t = g->timings;
	int rc = CLI_EXIT_OK;
	if (g->finish == WEIGHTFLOOR__V1__FINISH_REASON__FINISH_REASON_ERROR)
		rc = CLI_EXIT_FAIL;
	else if (g->finish == WEIGHTFLOOR__V1__FINISH_REASON__FINISH_REASON_CANCELED)
		rc = CLI_EXIT_UNAVAILABLE;
	if (cli->json) {
		struct json_object *o = json_object_new_object();
		json_object_object_add(o, "done", json_object_new_boolean(1));
		json_object_object_add(o, "finish", json_object_new_string(finish_name(g->finish)));
		if (g->error && *g->error)
			json_object_object_add(o, "error", json_object_new_string(g->error));
		json_object_object_add(o, "completion_id",
		                       json_object_new_uint64(g->completion_id));
		json_object_object_add(o, "worker_id", json_object_new_string(g->worker_id));
		json_object_object_add(o, "model", json_object_new_string(g->model));
		json_object_object_add(o, "seed", json_object_new_uint64(g->seed));
		if (t) {
			json_object_object_add(o, "prompt_tokens",
			                       json_object_new_int64(t->prompt_tokens));
			json_object_object_add(o, "generated_tokens",
			                       json_object_new_int64(t->generated_tokens));
			json_object_object_add(o, "queue_ms", json_object_new_double(t->queue_ms));
			json_object_object_add(o, "prompt_ms",
			                       json_object_new_double(t->prompt_ms));
			json_object_object_add(o, "decode_ms",
			                       json_object_new_double(t->decode_ms));
			json_object_object_add(o, "time_to_first_token_ms",
			                       json_object_new_double(t->time_to_first_token_ms));
			json_object_object_add(o, "prompt_tokens_per_s",
			                       json_object_new_double(t->prompt_tokens_per_s));
			json_object_object_add(o, "decode_tokens_per_s",
			                       json_object_new_double(t->decode_tokens_per_s));
		}
		printf("%s\n", json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
		json_object_put(o);
		fflush(stdout);
		cli->doc_printed = true;
	} else {
		if (!ended_nl)
			putchar('\n');
		fflush(stdout);
		if (t)
			fprintf(stderr,
			        "agentctl: %u prompt tokens at %.1f tokens/s, %u generated at %.1f "
			        "tokens/s, first token after %.1f ms (%s, worker %s, seed %llu)\n",
			        t->prompt_tokens, t->prompt_tokens_per_s, t->generated_tokens,
			        t->decode_tokens_per_s, t->time_to_first_token_ms,
			        finish_name(g->finish), g->worker_id, (unsigned long long)g->seed);
	}
	if (g->finish == WEIGHTFLOOR__V1__FINISH_REASON__FINISH_REASON_ERROR ||
	    g->finish == WEIGHTFLOOR__V1__FINISH_REASON__FINISH_REASON_CONTEXT ||
	    g->finish == WEIGHTFLOOR__V1__FINISH_REASON__FINISH_REASON_CANCELED) {
		if (rc)
			cli_fail(cli, rc, "generate: %s%s%s", finish_name(g->finish),
			         g->error && *g->error ? ": " : "", g->error ? g->error : "");
		else if (!cli->json)
			fprintf(stderr, "agentctl: generate: %s\n",
			        g->error && *g->error ? g->error : finish_name(g->finish));
	}
	return rc;
}

int cmd_generate(struct cli *cli, int argc, char **argv)
{
	enum {
		O_WORKER = 256,
		O_IDS,
		O_MAX,
		O_TEMP,
		O_TOPK,
		O_TOPP,
		O_MINP,
		O_PEN,
		O_LASTN,
		O_SEED,
		O_STOP,
		O_NOEOS
	};
	static const struct option opts[] = {
	    {"worker", required_argument, NULL, O_WORKER},
	    {"prompt-ids", required_argument, NULL, O_IDS},
	    {"max-tokens", required_argument, NULL, O_MAX},
	    {"temp", required_argument, NULL, O_TEMP},
	    {"top-k", required_argument, NULL, O_TOPK},
	    {"top-p", required_argument, NULL, O_TOPP},
	    {"min-p", required_argument, NULL, O_MINP},
	    {"repeat-penalty", required_argument, NULL, O_PEN},
	    {"repeat-last-n", required_argument, NULL, O_LASTN},
	    {"seed", required_argument, NULL, O_SEED},
	    {"stop", required_argument, NULL, O_STOP},
	    {"ignore-eos", no_argument, NULL, O_NOEOS},
	    {"help", no_argument, NULL, 'h'},
	    {0},
	};
	Weightfloor__V1__Generate g = WEIGHTFLOOR__V1__GENERATE__INIT;
	Weightfloor__V1__Sampling sp = WEIGHTFLOOR__V1__SAMPLING__INIT;
	char *stops[16];
	size_t n_stop = 0;
	int32_t *ids = NULL;
	size_t n_ids = 0;
	uint64_t v = 0;
	int c, rc = 0;
	optind = 0;
	opterr = 0;
	while (rc == 0 && (c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
		switch (c) {
		case O_WORKER:
			g.worker_id = optarg;
			break;
		case O_IDS:
			free(ids);
			ids = NULL;
			rc = parse_ids(cli, optarg, &ids, &n_ids);
			break;
		case O_MAX:
			if (!(rc = parse_uint(cli, "--max-tokens", optarg, UINT32_MAX, &v)))
				g.max_tokens = (uint32_t)v;
			break;
		/* Values are sent as given: the worker checks them and names a bad one. */
		case O_TEMP:
			rc = parse_float(cli, "--temp", optarg, &sp.temperature);
			break;
		case O_TOPK: {
			char *end;
			errno = 0;
			long k = strtol(optarg, &end, 10);
			if (!*optarg || *end || errno || k < INT32_MIN || k > INT32_MAX)
				rc = cli_usage(cli, "generate", "--top-k: '%s' is not a number",
				               optarg);
			sp.top_k = (int32_t)k;
			break;
		}
		case O_TOPP:
			rc = parse_float(cli, "--top-p", optarg, &sp.top_p);
			break;
		case O_MINP:
			rc = parse_float(cli, "--min-p", optarg, &sp.min_p);
			break;
		case O_PEN:
			rc = parse_float(cli, "--repeat-penalty", optarg, &sp.repeat_penalty);
			break;
		case O_LASTN:
			if (!(rc = parse_uint(cli, "--repeat-last-n", optarg, UINT32_MAX, &v)))
				sp.repeat_last_n = (uint32_t)v;
			break;
		case O_SEED:
			rc = parse_uint(cli, "--seed", optarg, UINT64_MAX, &sp.seed);
			break;
		case O_STOP:
			if (n_stop == 16)
				rc = cli_usage(cli, "generate", "--stop: at most 16");
			else
				stops[n_stop++] = optarg;
			break;
		case O_NOEOS:
			g.ignore_eos = true;
			break;
		case 'h':
			printf("%s", gen_help);
			free(ids);
			return CLI_EXIT_OK;
		default:
			free(ids);
			return cli_bad_option(cli, "generate", argc, argv);
		}
	}
	if (rc) {
		free(ids);
		return rc;
	}
	if ((rc = cli_check_args(cli, "generate", argc, argv, optind, ids ? 1 : 2, ids ? 1 : 2,
	                         ids ? "MODEL" : "MODEL and PROMPT"))) {
		free(ids);
		return rc;
	}
	g.model = argv[optind];
	if (!ids)
		g.prompt = argv[optind + 1];
	g.prompt_ids = ids;
	g.n_prompt_ids = n_ids;
	g.sampling = &sp;
	g.stop = stops;
	g.n_stop = n_stop;
	g.wait_ms = 200;

	Weightfloor__V1__Request req = WEIGHTFLOOR__V1__REQUEST__INIT;
	req.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_GENERATE;
	req.generate = &g;
	Weightfloor__V1__Reply *rep = NULL;
	rc = cli_call(cli, "generate", &req, cli->timeout_given ? cli->timeout_ms : GEN_START_MS,
	              &rep);
	free(ids);
	if (rc)
		return rc;
	if (rep->body_case != WEIGHTFLOOR__V1__REPLY__BODY_GENERATE) {
		wf_ctl_reply_free(rep);
		return cli_fail(cli, CLI_EXIT_FAIL, "generate: the reply has no completion");
	}
	struct sigaction sa = {.sa_handler = on_signal};
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);

	bool ended_nl = true;
	uint64_t gid = rep->generate->completion_id;
	char worker[128];
	snprintf(worker, sizeof worker, "%s", rep->generate->worker_id);
	uint32_t have = print_tokens(cli, rep->generate, &ended_nl);
	while (!rep->generate->done) {
		Weightfloor__V1__GenerateRead rd = WEIGHTFLOOR__V1__GENERATE_READ__INIT;
		rd.completion_id = gid;
		rd.after = have;
		rd.wait_ms = GEN_POLL_MS;
		rd.worker_id = worker; /* the relay must reach the worker that holds it */
		rd.cancel = interrupted != 0;
		Weightfloor__V1__Request rq = WEIGHTFLOOR__V1__REQUEST__INIT;
		rq.body_case = WEIGHTFLOOR__V1__REQUEST__BODY_GENERATE_READ;
		rq.generate_read = &rd;
		Weightfloor__V1__Reply *next = NULL;
		rc = cli_call(cli, "generate", &rq, GEN_POLL_MS + cli->timeout_ms, &next);
		if (rc) {
			wf_ctl_reply_free(rep);
			return rc;
		}
		wf_ctl_reply_free(rep);
		rep = next;
		if (rep->body_case != WEIGHTFLOOR__V1__REPLY__BODY_GENERATE) {
			wf_ctl_reply_free(rep);
			return cli_fail(cli, CLI_EXIT_FAIL,
			                "generate: the reply has no completion");
		}
		have += print_tokens(cli, rep->generate, &ended_nl);
	}
	rc = print_end(cli, rep->generate, ended_nl);
	if (interrupted && rc == CLI_EXIT_UNAVAILABLE)
		rc = 130; /* the shell's code for an interrupt */
	wf_ctl_reply_free(rep);
	return rc;
}
