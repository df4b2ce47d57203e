#!/usr/bin/env bash
# Builds weightfloor and passes every test: the README's test command, and what CI runs.
#  1. the normal build (CUDA compiled when the toolkit exists), all CTest labels:
#     unit, integ, gpu (skipped, never passed, without a GPU);
#  2. an ASan+UBSan build running the unit tests;
#  3. a clang libFuzzer build running each fuzz target for a short time.
# Set WF_TEST_QUICK=1 to run step 1 only.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

jobs=$(nproc)
log() { printf '\n== %s\n' "$*"; }

log "build (RelWithDebInfo)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$jobs"

log "tests: unit, integ, gpu"
ctest --test-dir build --output-on-failure -j "$jobs" --timeout 600

[ "${WF_TEST_QUICK:-0}" = 1 ] && exit 0

log "sanitizer build (ASan+UBSan), unit tests"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DWF_SANITIZE=ON -DWF_WITH_CUDA=OFF >/dev/null
cmake --build build-asan -j "$jobs"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	LSAN_OPTIONS=suppressions=$PWD/tests/lsan.supp:print_suppressions=0 \
	ctest --test-dir build-asan -L unit --output-on-failure -j "$jobs" --timeout 900

log "fuzz build (clang libFuzzer + ASan+UBSan), short runs"
CC=clang cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=Debug -DWF_FUZZ=ON -DWF_WITH_CUDA=OFF >/dev/null
fuzz_targets=$(cmake --build build-fuzz --target help | sed -n 's/^\(fuzz_[a-z_]*\): .*/\1/p' | sort -u)
if [ -z "$fuzz_targets" ]; then
	echo "no fuzz targets found" >&2
	exit 1
fi
cmake --build build-fuzz -j "$jobs" --target $fuzz_targets
ctest --test-dir build-fuzz -L fuzz --output-on-failure --timeout 600
