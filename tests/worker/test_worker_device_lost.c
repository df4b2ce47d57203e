/* A worker whose device is lost (a sticky error) turns /readyz red, then exits with status 3
 * for its supervisor to restart it (wf-worker@.service: Restart=on-failure): never a green
 * worker failing every request. The loss is injected: the host device's sticky=N (label integ,
 * everywhere), or on a GPU the CUDA backend's sticky=N, a real illegal address in a kernel
 * (WFT_WORKER_DEVICE, test_cuda_worker_device_lost, label gpu). A completion on the lost device
 * fails with the device's error; the test then waits for the states (red, exited), asserting no
 * time window. Real wf-agent and wf-worker processes (tests/agent/agt.h). */
#include "common/wftest.h"
#include "tests/agent/agt.h"
#include "tests/http/httpc.h"
#include "tests/worker/wref.h"

#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef WFT_WORKER_DEVICE
/* The first copy loses the device; the engine runs on it (--dense-on-device), as on a GPU. */
#define WFT_WORKER_DEVICE "host:mem=256Mi,sticky=1"
#endif

TestSuite(worker_device_lost, .fini = agt_fini, .timeout = 180);

/* GET /readyz: its status (0 when nothing answered) and, when red, whether it names the loss. */
static int readyz(uint16_t port, bool *ret_says_lost)
{
	struct httpc_reply r = {0};
	int st = 0;
	*ret_says_lost = false;
	if (httpc_request(port, "GET", "/readyz", 5000, &r) == 0) {
		st = r.status;
		*ret_says_lost = r.body && strstr(r.body, "device lost");
	}
	httpc_reply_fini(&r);
	return st;
}

Test(worker_device_lost, readyz_turns_red_and_the_worker_exits_for_a_restart)
{
	char prompt[1024];
	char *gguf = wref_model("qwen3moe-tiny-q4_k_m", prompt, sizeof prompt);
	struct agt *a = agt_new("wf-lost");
	agt_start(a, NULL, (const char *[]){"--model", agt_printf("tiny=%s", gguf), NULL});
	const uint16_t port = httpc_free_port();
	struct agt_worker w;
	agt_spawn_worker(a, &w, "wl", NULL, WFT_WORKER_DEVICE,
	                 (const char *[]){"--threads", "1", "--dense-on-device", "--metrics",
	                                  agt_printf("127.0.0.1:%u", (unsigned)port), NULL});
	agt_wait_worker_registered(a, &w, "wl");
	bool lost;
	int st;
	while ((st = readyz(port, &lost)) != 200) {
		cr_assert(waitpid(w.pid, NULL, WNOHANG) == 0,
		          "the worker exited before any copy:\n%s", agt_worker_log(&w));
		agt_sleep_ms(20);
	}

	/* The completion's copies reach the injected fault: it fails, with the device's error. */
	char *out = NULL, *err = NULL;
	int rc =
	    agt_ctl(a, &out, &err,
	            (const char *[]){"generate", "tiny", "--worker", "wl", "--prompt-ids", prompt,
	                             "--max-tokens", "4", "--temp", "0", "--json", NULL});
	cr_expect_neq(rc, 0, "a completion on a lost device succeeded:\n%s", out);
	cr_log_info("generate: rc %d: %s", rc, err);
	free(out);
	free(err);

	/* Red, saying why, then gone with status 3. The worker waits for a red answer before it
	 * exits (at most 10 s), so polling sees it. */
	bool red = false;
	int status = 0;
	for (;;) {
		pid_t p = waitpid(w.pid, &status, WNOHANG);
		if (p == w.pid)
			break;
		cr_assert_eq(p, 0);
		st = readyz(port, &lost);
		if (st == 503 && lost)
			red = true;
		else if (st == 200)
			cr_assert(!red, "/readyz green again after red:\n%s", agt_worker_log(&w));
		agt_sleep_ms(20);
	}
	char *log = agt_worker_log(&w);
	cr_assert(WIFEXITED(status), "the worker died of signal %d:\n%s",
	          WIFSIGNALED(status) ? WTERMSIG(status) : 0, log);
	cr_assert_eq(WEXITSTATUS(status), 3, "exit status %d:\n%s", WEXITSTATUS(status), log);
	cr_assert(red, "/readyz never answered red before the exit:\n%s", log);
	cr_assert(strstr(log, "lost"), "the log does not say the device was lost:\n%s", log);
	free(log);
}
