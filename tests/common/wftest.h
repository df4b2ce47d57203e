/* Helpers for Criterion tests: where things are, and private temporary directories.
 * Not thread-safe; call from the test process only. */
#ifndef WF_TESTS_COMMON_WFTEST_H
#define WF_TESTS_COMMON_WFTEST_H

#include <stdbool.h>
#include <stddef.h>

/* Repository root (WF_SOURCE_DIR set by CTest, else the compile-time source dir). */
const char *wft_source_dir(void);
/* Build directory (WF_BUILD_DIR, else the compile-time binary dir). */
const char *wft_build_dir(void);
/* tests/data/reference in the repository (the llama.cpp reference models), or NULL if absent. */
const char *wft_reference_dir(void);
/* Path of a built executable: "<build>/<rel>", e.g. wft_exe("tools/wf-gen"). Static buffer per
 * call site is not needed: the result is malloc'ed and never freed (tests are short-lived). */
char *wft_exe(const char *rel);

/* Creates a fresh private directory (mode 0700) under $TMPDIR or /tmp and returns its path
 * (malloc'ed). Aborts the test on failure. */
char *wft_tmpdir(const char *tag);
/* Removes a directory tree; ignores errors. */
void wft_rmtree(const char *path);

/* Runs argv (posix_spawn, stdout/stderr to the given files or inherited when NULL), waits with a
 * timeout in seconds (SIGKILL on expiry), and returns the exit status (0..255), 128+signal when
 * killed by a signal, or -1 on spawn failure. */
int wft_run(char *const argv[], const char *out_path, const char *err_path, int timeout_s);

/* Reads a whole file (malloc'ed, NUL-appended). Returns NULL on failure; *ret_len is optional. */
char *wft_read_file(const char *path, size_t *ret_len);

/* Waits (on CLOCK_REALTIME_COARSE, up to about 2 s) until a change made now would get a later
 * ctime than path's last change: the ctime has the coarse clock's resolution. False if the file
 * cannot be stat'ed or the clock did not get there. */
bool wft_wait_past_ctime(const char *path);

#endif
