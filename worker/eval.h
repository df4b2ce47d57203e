/* `wf-worker eval`: the engine offline, from a model's files (no agent, no device), writing
 * logits in the layout of tests/data/reference so that any setting can be compared with any
 * other and with llama.cpp's own outputs. */
#ifndef WF_WORKER_EVAL_H
#define WF_WORKER_EVAL_H

/* argv[0] is "eval". Returns the process exit code: 0, 1 (the model or a run failed), 2 (bad
 * flags). */
int wf_worker_eval_main(int argc, char **argv);

#endif
