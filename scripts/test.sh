#!/usr/bin/env bash
# Builds weightfloor and passes every test: the README's test command, and what CI runs.
#  1. a Release build (-O3, CUDA compiled when the toolkit exists) in build-release, all CTest
#     labels: unit, integ, gpu (skipped, never passed, without a GPU);
#  2. an ASan+UBSan build (Debug) running the unit tests;
#  3. a ThreadSanitizer build (RelWithDebInfo) running the agent's, the worker's and the engine's
#     unit and integration tests; any race report, from a test or a daemon it started, fails it;
#  4. a clang libFuzzer build running each fuzz target for a short time.
# Set WF_TEST_QUICK=1 to run step 1 only.
#
# Setup and builds print one line per step; their output goes to a log in a private temporary
# directory, removed when the script passes and kept (its path printed) when it fails. Test
# results are shown as CTest prints them.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

logdir=$(mktemp -d "${TMPDIR:-/tmp}/weightfloor-test.XXXXXX")
wf_log_open "$logdir"
finish() {
	local rc=$?
	if [ "$rc" = 0 ]; then
		rm -rf "$logdir"
	else
		echo "test.sh: FAILED (exit $rc); build and setup log: $WF_LOG" >&2
	fi
}
trap finish EXIT

bash scripts/setup.sh

jobs=$(nproc)
log() { printf '\n== %s\n' "$*"; }

log "Release build, tests: unit, integ, gpu"
wf_build build-release -DCMAKE_BUILD_TYPE=Release
ctest --test-dir build-release --output-on-failure -j "$jobs" --timeout 600

[ "${WF_TEST_QUICK:-0}" = 1 ] && exit 0

log "sanitizer build (ASan+UBSan), unit tests"
wf_build build-asan -DCMAKE_BUILD_TYPE=Debug -DWF_SANITIZE=ON -DWF_WITH_CUDA=OFF
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	LSAN_OPTIONS=suppressions=$PWD/tests/lsan.supp:print_suppressions=0 \
	ctest --test-dir build-asan -L unit --output-on-failure -j "$jobs" --timeout 900

log "thread sanitizer build (TSan), agent, worker and engine tests"
wf_build build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DWF_SANITIZE=thread -DWF_WITH_CUDA=OFF
# Every process (tests, and the wf-agent and wf-worker they start) writes its reports to a file
# here, so a race inside a daemon fails the stage even where the test itself passes.
# Tests that run the agent as another uid (65534) need to read the suppressions and write their
# reports too: a clone under /root (0700) is not readable to them, and a mktemp directory is not
# writable, so the suppressions are copied into a sticky, world-writable directory (as /tmp is)
# under a traversable log directory.
tsan_logs=$logdir/tsan
rm -rf "$tsan_logs" && mkdir -p "$tsan_logs"
chmod 0711 "$logdir" && chmod 1777 "$tsan_logs"
install -m 0644 tests/tsan.supp "$tsan_logs/suppressions"
TSAN_OPTIONS="log_path=$tsan_logs/report second_deadlock_stack=1 print_suppressions=0 suppressions=$tsan_logs/suppressions" \
	ctest --test-dir build-tsan -R '^test_(agent|worker|engine)' --output-on-failure -j "$jobs" \
	--timeout 900
if compgen -G "$tsan_logs/report.*" >/dev/null; then
	cat "$tsan_logs"/report.* >&2
	echo "TSan: $(compgen -G "$tsan_logs/report.*" | wc -l) processes reported (above)" >&2
	exit 1
fi

log "fuzz build (clang libFuzzer + ASan+UBSan), short runs"
fuzz_args=(-DCMAKE_BUILD_TYPE=Debug -DWF_FUZZ=ON -DWF_WITH_CUDA=OFF)
# The fuzz targets are only known once the tree is configured.
CC=clang wf_step "configure build-fuzz" cmake -S . -B build-fuzz -G Ninja "${fuzz_args[@]}"
fuzz_targets=$(cmake --build build-fuzz --target help | sed -n 's/^\(fuzz_[a-z_]*\): .*/\1/p' | sort -u)
if [ -z "$fuzz_targets" ]; then
	echo "no fuzz targets found" >&2
	exit 1
fi
CC=clang wf_build build-fuzz --targets "${fuzz_targets//$'\n'/ }" "${fuzz_args[@]}"
ctest --test-dir build-fuzz -L fuzz --output-on-failure --timeout 600
