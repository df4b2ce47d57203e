/* main() for GPU test executables: exit 77 (CTest: skipped) when there is no GPU, else run the
 * Criterion tests as usual.
 *
 * The probe runs in a forked child: initialising CUDA in this process would break every test
 * process Criterion forks from it (CUDA is not fork-safe), and the style guide keeps CUDA out of
 * Criterion's parent. */
#include "cuda/device_cuda.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

static int gpu_count_in_child(void)
{
	int status;
	pid_t pid = fork();

	if (pid < 0)
		return -1;
	if (pid == 0) {
		int n = wf_cuda_device_count();
		_exit(n > 100 ? 100 : n);
	}
	if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status))
		return -1;
	return WEXITSTATUS(status);
}

int main(int argc, char *argv[])
{
	int n = gpu_count_in_child();

	if (n < 0) {
		fprintf(stderr, "GPU probe crashed\n");
		return 1;
	}
	if (n == 0) {
		fprintf(stderr, "no CUDA device: skipped\n");
		return 77;
	}
	struct criterion_test_set *tests = criterion_initialize();
	int result = 0;
	if (criterion_handle_args(argc, argv, true))
		result = !criterion_run_all_tests(tests);
	criterion_finalize(tests);
	return result;
}
