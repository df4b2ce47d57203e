#!/usr/bin/env bash
# The whole GPU proof in one call (issue 18): build, every gpu test, compute-sanitizer and the
# GPU benchmarks on a machine that has a GPU and CUDA but none of our Debian libraries and no
# network. docs/BENCHMARKS.md ("The GPU proof") says how to run it.
#
#   scripts/gpu-check.sh --prepare     here (Debian bookworm, root, network): apt-get download
#                                      the packages the build and the tests need, with the
#                                      libraries they load, into .gpu/ (ignored; it travels with
#                                      the tree: carry [".gpu"]). Idempotent; refuses when the
#                                      tree and .gpu/ would exceed the 64 MiB that travel.
#   scripts/gpu-check.sh [--out DIR]   on the GPU machine: prints what it relies on, exits 77
#                                      without a GPU; unpacks .gpu/*.deb into a private prefix
#                                      (never over /), builds Release for this GPU's
#                                      architecture only against that prefix, runs every test
#                                      labelled gpu (serially), wf-bench kernels, residency and
#                                      engine on cuda:0, then compute-sanitizer memcheck and
#                                      racecheck on the contract, backend and engine gpu tests.
#                                      Logs and JSON go to DIR (default $OUT, else
#                                      build-gpu/out), 8 files at most; a summary table is
#                                      printed last (and saved). Every
#                                      step has its own time limit inside one budget (465 s, so
#                                      the whole run stays under 8 minutes), and a failed step
#                                      does not stop the next ones. Exit 0 when every step
#                                      passed, 1 otherwise, 77 without a GPU.
#   scripts/gpu-check.sh --no-gpu-build-check [--out DIR]
#                                      here, without a GPU: the device run's unpack, configure
#                                      and build, inside a private mount namespace in which the
#                                      system's copies of every carried package file are hidden
#                                      (bind-mounted over), so the build can only succeed from
#                                      .gpu/; then checks that CMake found everything under the
#                                      prefix, that the binaries load our libraries from it
#                                      (ldd), runs the gpu tests (they skip: no GPU) and one
#                                      integration test whose processes load every carried
#                                      library.
#
# Environment: WF_GPU_BUDGET_S (465), WF_GPU_CAP_SCALE (multiplies every limit: 1 on the device,
# 10 in the simulation), WF_GPU_ARCH (from nvidia-smi's compute_cap; 90 for an
# H100/H200), WF_GPU_BENCH_ITERATIONS (1), WF_GPU_PREFIX, WF_GPU_BUILD (under build-gpu/).
# An optional anchor: .gpu/llama-bench (a CUDA llama-bench of llama.cpp b10573, with any
# libraries it needs beside it in .gpu/) is passed to wf-bench engine as --llama-bench-gpu.
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 1
GPU_DIR=$ROOT/.gpu
TRAVEL_LIMIT=${WF_GPU_TRAVEL_LIMIT:-$((64 << 20))} # what the device tool takes: tree + carried folders
TRAVEL_MARGIN=$((2 << 20)) # room for the tree to grow between --prepare and the run
MULTIARCH=x86_64-linux-gnu

# What the build compiles against (headers, .so links, .pc files) and runs at build time
# (protoc-c, pkg-config). scripts/setup.sh installs the same from Debian; CMakeLists.txt and
# cmake/*.cmake find them (pkg_check_modules, find_library for nng and criterion, protoc-c).
DEV_PKGS=(liburing-dev libnng-dev libprotobuf-c-dev protobuf-c-compiler libcriterion-dev
          libxxhash-dev libjson-c-dev libmicrohttpd-dev pkgconf pkgconf-bin)
# Assumed on any machine that has a C compiler and nvcc; never carried, never shadowed.
BASE_PKGS=" libc6 libgcc-s1 libstdc++6 gcc-12-base zlib1g libcrypt1 debconf dpkg perl-base "

usage() {
	sed -n '2,/^set -uo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'
}

MODE=device
OUTDIR=${OUT:-}
while [ $# -gt 0 ]; do
	case $1 in
	--prepare) MODE=prepare ;;
	--no-gpu-build-check) MODE=simulate ;;
	--_in-namespace) MODE=simulate-inside ;;
	--out)
		OUTDIR=${2:?--out needs a directory}
		shift
		;;
	-h | --help)
		usage
		exit 0
		;;
	*)
		echo "gpu-check: unknown argument '$1' (--prepare, --no-gpu-build-check, --out DIR)" >&2
		exit 2
		;;
	esac
	shift
done

mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }

# ---- --prepare: the packages -------------------------------------------------------------------

# The packages to carry: DEV_PKGS and, recursively, what they depend on, except other -dev
# packages (we link dynamically: their headers are not needed) and BASE_PKGS. The first of a
# set of alternatives is taken; virtual packages are skipped (a real one follows them). One
# apt-cache call per level of the graph.
package_closure() {
	local -A seen=()
	local level=("${DEV_PKGS[@]}") next p dep line alt
	while [ ${#level[@]} -gt 0 ]; do
		next=()
		for p in "${level[@]}"; do
			seen[$p]=1
			echo "$p"
		done
		alt=0
		while IFS= read -r line; do
			case $line in
			"  |Depends: "* | "  |PreDepends: "*)
				[ $alt = 1 ] && continue
				alt=1
				dep=${line#*: }
				;;
			"  Depends: "* | "  PreDepends: "*)
				if [ $alt = 1 ]; then
					alt=0
					continue
				fi
				dep=${line#*: }
				;;
			*) continue ;;
			esac
			dep=${dep%%:*} # an :any or :amd64 qualifier
			case $dep in "<"*) continue ;; esac
			case " ${DEV_PKGS[*]} " in
			*" $dep "*) ;;
			*) case $dep in *-dev | *-dev-bin) continue ;; esac ;;
			esac
			case $BASE_PKGS in *" $dep "*) continue ;; esac
			[ -n "${seen[$dep]:-}" ] && continue
			seen[$dep]=1
			next+=("$dep")
		done < <(apt-cache depends --no-recommends --no-suggests --no-conflicts --no-breaks \
			--no-replaces --no-enhances "${level[@]}" 2>/dev/null)
		for p in "${next[@]}"; do seen[$p]=""; done
		level=("${next[@]}")
	done
}

# Bytes of what travels besides .gpu/: tracked and untracked-not-ignored files.
tree_bytes() {
	git -C "$ROOT" ls-files -z --cached --others --exclude-standard |
		(cd "$ROOT" && xargs -0 -r stat -c %s -- 2>/dev/null) | awk '{ s += $1 } END { print s + 0 }'
}

prepare() {
	if [ "$(id -u)" != 0 ]; then
		echo "gpu-check --prepare: run as root (apt-get)" >&2
		return 1
	fi
	if ! command -v apt-get >/dev/null || ! command -v apt-cache >/dev/null; then
		echo "gpu-check --prepare: needs Debian's apt (bookworm, as scripts/setup.sh)" >&2
		return 1
	fi
	grep -qx "/.gpu/" "$ROOT/.gitignore" 2>/dev/null ||
		echo "gpu-check --prepare: warning: /.gpu/ is not in .gitignore" >&2
	mkdir -p "$GPU_DIR"
	if ! apt-cache show --no-all-versions "${DEV_PKGS[0]}" >/dev/null 2>&1; then
		echo "gpu-check --prepare: apt-get update (no package lists)"
		apt-get -o Acquire::Retries=3 update -qq || return 1
	fi
	local pkgs=() p file want=() have=0 missing=() fetch=()
	mapfile -t pkgs < <(package_closure)
	local manifest=$GPU_DIR/MANIFEST.txt tmp pkg ver arch size
	tmp=$(mktemp)
	# One record per package: its candidate's name, version, architecture and size. The file
	# is named as apt-get download names it (an epoch's ':' as %3a).
	while IFS='|' read -r pkg ver arch size; do
		[ -n "$pkg" ] || continue
		file="${pkg}_${ver//:/%3a}_${arch}.deb"
		want+=("$file")
		printf '%s %s %s\n' "$pkg" "$ver" "$file" >>"$tmp"
		if [ -f "$GPU_DIR/$file" ] && [ "$(stat -c %s "$GPU_DIR/$file")" = "$size" ]; then
			have=$((have + 1))
		else
			fetch+=("$pkg")
		fi
	done < <(apt-cache show --no-all-versions "${pkgs[@]}" 2>/dev/null | awk '
		/^Package:/ { p = $2 } /^Version:/ { v = $2 } /^Architecture:/ { a = $2 }
		/^Size:/ { s = $2 } /^$/ { if (p != "") print p "|" v "|" a "|" s; p = "" }
		END { if (p != "") print p "|" v "|" a "|" s }')
	for p in "${pkgs[@]}"; do
		grep -q "^$p " "$tmp" || missing+=("$p")
	done
	if [ ${#missing[@]} -gt 0 ]; then
		echo "gpu-check --prepare: no candidate for: ${missing[*]}" >&2
		rm -f "$tmp"
		return 1
	fi
	if [ ${#fetch[@]} -gt 0 ] && ! (cd "$GPU_DIR" &&
		apt-get -o APT::Sandbox::User=root -o Acquire::Retries=3 download -qq "${fetch[@]}" >/dev/null); then
		echo "gpu-check --prepare: apt-get download ${fetch[*]} failed" >&2
		rm -f "$tmp"
		return 1
	fi
	for file in "${want[@]}"; do
		[ -f "$GPU_DIR/$file" ] || {
			echo "gpu-check --prepare: $file missing after apt-get download" >&2
			rm -f "$tmp"
			return 1
		}
	done
	# Other versions of these packages (an older --prepare) go; nothing else in .gpu/ is touched.
	local f keep
	for f in "$GPU_DIR"/*.deb; do
		[ -e "$f" ] || continue
		keep=0
		for file in "${want[@]}"; do [ "${f##*/}" = "$file" ] && keep=1 && break; done
		[ $keep = 1 ] || {
			echo "gpu-check --prepare: removing stale ${f##*/}"
			rm -f "$f"
		}
	done
	mv "$tmp" "$manifest"
	local debs tree total budget
	debs=$(du -cb "$GPU_DIR" | tail -n 1 | cut -f1)
	tree=$(tree_bytes)
	total=$((debs + tree))
	budget=$((TRAVEL_LIMIT - TRAVEL_MARGIN - tree))
	echo "gpu-check --prepare: ${#pkgs[@]} packages in .gpu/ ($have present, ${#fetch[@]} fetched):"
	echo "  .gpu/ $(mib "$debs") (budget $(mib "$budget")), tree $(mib "$tree"), together $(mib "$total") of $(mib "$TRAVEL_LIMIT")"
	if [ "$debs" -gt "$budget" ]; then
		echo "gpu-check --prepare: REFUSED: .gpu/ ($(mib "$debs")) is over its budget ($(mib "$budget")):" \
			"the tree and .gpu/ must stay under $(mib "$TRAVEL_LIMIT") with $(mib "$TRAVEL_MARGIN") to spare." \
			"Remove what else lies in .gpu/ (a llama-bench?) or shrink the tree." >&2
		return 1
	fi
	echo "gpu-check --prepare: done; carry .gpu with the tree: run(command=\"scripts/gpu-check.sh --out \$OUT\", carry=[\".gpu\"])"
}

if [ "$MODE" = prepare ]; then
	prepare
	exit $?
fi

# ---- The run: steps, their budget, the summary --------------------------------------------------

T_START=$(date +%s)
BUDGET=${WF_GPU_BUDGET_S:-465}
NPROC=$(nproc 2>/dev/null || echo 4)
if [ "$MODE" = device ]; then
	PREFIX=${WF_GPU_PREFIX:-$ROOT/build-gpu/prefix}
	BUILD=${WF_GPU_BUILD:-$ROOT/build-gpu/build}
	OUTDIR=${OUTDIR:-$ROOT/build-gpu/out}
else
	PREFIX=${WF_GPU_PREFIX:-$ROOT/build-gpucheck/prefix}
	BUILD=${WF_GPU_BUILD:-$ROOT/build-gpucheck/build}
	OUTDIR=${OUTDIR:-$ROOT/build-gpucheck/out}
fi
LIBDIR=$PREFIX/usr/lib/$MULTIARCH
LIBPATH=$LIBDIR:$PREFIX/lib/$MULTIARCH # both, as Debian packages use both
LDDIR=$PREFIX/ld # the carried libraries the processes load (LD_LIBRARY_PATH)
mkdir -p "$OUTDIR" || exit 1
SUMMARY=$OUTDIR/summary.txt
BUILD_LOG=$OUTDIR/build.log
TESTS_LOG=$OUTDIR/gpu-tests.log
SAN_LOG=$OUTDIR/sanitizer.log
BENCH_LOG=$OUTDIR/bench.log
# The 8 files that come back (the tool takes 8 at most, 16 MiB each): these five, and
# kernels.json, residency.json, engine.json.
: >"$BUILD_LOG"

ROWS=()
FAILED=0
say() { printf '%s\n' "$*" | tee -a "$SUMMARY"; }
elapsed() { echo $(($(date +%s) - T_START)); }
# The simulation builds on whatever CPUs are here (2 shared ones, say): its limits are scaled.
SCALE=${WF_GPU_CAP_SCALE:-1}
[ "$MODE" != device ] && SCALE=${WF_GPU_CAP_SCALE:-10}
BUDGET=$((BUDGET * SCALE))
# step_budget CAP RESERVE: seconds for a step: at most CAP, leaving RESERVE for the steps after.
step_budget() {
	local cap=$(($1 * SCALE)) left=$((BUDGET - $(elapsed) - $2 * SCALE))
	[ "$left" -gt "$cap" ] && left=$cap
	echo "$left"
}
# row STEP RESULT SECONDS FIGURES
row() {
	ROWS+=("$(printf '%-12s %-8s %5s  %s' "$1" "$2" "$3" "$4")")
	case $2 in ok | skipped | partial) ;; *) FAILED=1 ;; esac
}
# The result word for a step's return code (sanitizers: 2 is partial).
result() {
	case $1 in 0) echo ok ;; 2) echo partial ;; *) echo FAIL ;; esac
}
# Caps a log at 15 MiB (its head and tail), for the device tool's 16 MiB per file.
cap_log() {
	local f=$1 max=$((15 << 20))
	[ -f "$f" ] && [ "$(stat -c %s "$f")" -gt "$max" ] || return 0
	{
		head -c $((max / 3)) "$f"
		printf '\n[... %s cut ...]\n' "$(mib $(($(stat -c %s "$f") - max)))"
		tail -c $((max * 2 / 3)) "$f"
	} >"$f.cut" && mv "$f.cut" "$f"
}
print_summary() {
	say ""
	say "== gpu-check summary ($(date -u +%FT%TZ), $(elapsed) s of $BUDGET)"
	say "$(printf '%-12s %-8s %5s  %s' step result s figures)"
	local r
	for r in "${ROWS[@]}"; do say "$r"; done
	say "logs and JSON: $OUTDIR ($(cd "$OUTDIR" && ls | tr '\n' ' '))"
}

# ---- Step: what we rely on ---------------------------------------------------------------------

CC_ARCH=""
preamble() {
	: >"$SUMMARY"
	say "== gpu-check $MODE, $(date -u +%FT%TZ), commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '(no .git)')"
	say "host:        $(uname -srm), $NPROC CPUs, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo)"
	say "os:          $(. /etc/os-release 2>/dev/null && echo "${PRETTY_NAME:-?}")"
	say "glibc:       $(getconf GNU_LIBC_VERSION 2>/dev/null || ldd --version 2>/dev/null | head -n 1)"
	if command -v nvidia-smi >/dev/null; then
		local q
		q=$(nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv,noheader 2>&1 | head -n 1)
		say "nvidia-smi:  $q"
		CC_ARCH=$(cut -d, -f3 <<<"$q" | tr -d ' .')
	else
		say "nvidia-smi:  not found"
	fi
	local nvcc=${CUDACXX:-}
	[ -z "$nvcc" ] && nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
	NVCC=$nvcc
	say "nvcc:        $([ -x "$nvcc" ] && "$nvcc" --version | grep -m1 release | sed 's/.*release/release/' || echo "not found")"
	SANITIZER=$(command -v compute-sanitizer || echo "$(dirname "$nvcc")/compute-sanitizer")
	say "sanitizer:   $([ -x "$SANITIZER" ] && "$SANITIZER" --version 2>&1 | grep -m1 -i version || echo "not found")"
	say "cmake:       $(cmake --version 2>/dev/null | head -n 1 || echo "not found")"
	say "ninja:       $(ninja --version 2>/dev/null || echo "not found")"
	say "cc:          $(cc --version 2>/dev/null | head -n 1 || echo "not found")"
	say "python3:     $(python3 --version 2>&1)"
	say "dpkg-deb:    $(command -v dpkg-deb || echo "not found (ar + tar instead)")"
	say ".gpu/:       $(ls "$GPU_DIR"/*.deb 2>/dev/null | wc -l) packages, $(du -sh "$GPU_DIR" 2>/dev/null | cut -f1)$([ -x "$GPU_DIR/llama-bench" ] && echo ", llama-bench")"
}

has_gpu() {
	command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU '
}

# ---- Step: unpack into the private prefix -------------------------------------------------------

# deb_extract DEB DIR: dpkg-deb -x, or ar + tar where dpkg is missing.
deb_extract() {
	if command -v dpkg-deb >/dev/null; then
		dpkg-deb -x "$1" "$2"
		return
	fi
	local member
	member=$(ar t "$1" | grep '^data\.tar') || return 1
	case $member in
	*.xz) ar p "$1" "$member" | tar -xJ -C "$2" ;;
	*.zst) ar p "$1" "$member" | zstd -dc | tar -x -C "$2" ;;
	*.gz) ar p "$1" "$member" | tar -xz -C "$2" ;;
	*) ar p "$1" "$member" | tar -x -C "$2" ;;
	esac
}

unpack() {
	local debs=("$GPU_DIR"/*.deb) d n_ours=0 so all=${1:-0}
	if [ ! -e "${debs[0]}" ]; then
		echo "no .gpu/*.deb: run scripts/gpu-check.sh --prepare on a Debian machine and carry .gpu" >>"$BUILD_LOG"
		return 1
	fi
	rm -rf "$PREFIX"
	mkdir -p "$PREFIX/bin" "$LDDIR" || return 1
	for d in "${debs[@]}"; do
		deb_extract "$d" "$PREFIX" || {
			echo "cannot unpack $d" >>"$BUILD_LOG"
			return 1
		}
	done
	# The .pc files say prefix=/usr: pkg-config rewrites their paths under the prefix
	# (PKG_CONFIG_SYSROOT_DIR). Requires.private names packages a static link would need
	# (libmicrohttpd's gnutls): we link dynamically and carry no -dev of those.
	sed -i '/^Requires.private:/d' "$LIBDIR"/pkgconfig/*.pc "$PREFIX"/usr/share/pkgconfig/*.pc 2>/dev/null
	# The build's own tools, each with the carried libraries (and only it).
	printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$LIBPATH" "$PREFIX/usr/bin/pkgconf" >"$PREFIX/bin/pkg-config"
	printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$LIBPATH" "$PREFIX/usr/bin/protoc-c" >"$PREFIX/bin/protoc-c"
	# Warnings stay warnings on the device: its compiler (gcc 13 or newer) may warn where
	# Debian's gcc 12, which the project's -Werror is kept clean with, does not; the build log
	# keeps them and the summary counts them.
	printf '#!/bin/sh\nexec "$@" -Wno-error\n' >"$PREFIX/bin/cc-no-werror"
	printf '#!/bin/sh\nexec "$@" -Xcompiler=-Wno-error\n' >"$PREFIX/bin/nvcc-no-werror"
	chmod +x "$PREFIX"/bin/*
	# The libraries processes load: on the device machine only those its system lacks (the
	# system's copy of a soname is ABI-compatible and newer), in the simulation all of them.
	local have_sys soname
	have_sys=$(ldconfig -p 2>/dev/null | awk '{ print $1 }' | sort -u)
	for so in "$LIBDIR"/*.so.* "$PREFIX/lib/$MULTIARCH"/*.so.*; do
		[ -f "$so" ] && [ ! -L "$so" ] || continue
		soname=$(readelf -d "$so" 2>/dev/null | sed -n 's/.*Library soname: \[\(.*\)\].*/\1/p')
		[ -n "$soname" ] || continue
		if [ "$all" = 1 ] || ! grep -qx "$soname" <<<"$have_sys"; then
			ln -sf "$so" "$LDDIR/$soname"
			n_ours=$((n_ours + 1))
		fi
	done
	UNPACK_FIGURES="${#debs[@]} packages; $n_ours libraries from the prefix"
	echo "unpacked ${#debs[@]} packages into $PREFIX; LD_LIBRARY_PATH=$LDDIR: $(ls "$LDDIR" | tr '\n' ' ')" >>"$BUILD_LOG"
}

# ---- Steps: configure and build -----------------------------------------------------------------

# configure SECONDS
configure() {
	local arch=$CUDA_ARCH
	local cuda=()
	[ -x "$NVCC" ] && cuda=(-DCMAKE_CUDA_COMPILER="$NVCC" -DCMAKE_CUDA_ARCHITECTURES="$arch"
		-DCMAKE_CUDA_COMPILER_LAUNCHER="$PREFIX/bin/nvcc-no-werror")
	# A rerun on the same machine (after a fix) builds incrementally; the simulation's proof
	# starts from nothing.
	[ "$MODE" = device ] || rm -rf "$BUILD"
	timeout "$1" env PKG_CONFIG_LIBDIR="$LIBDIR/pkgconfig:$PREFIX/usr/share/pkgconfig" \
		PKG_CONFIG_PATH= PKG_CONFIG_SYSROOT_DIR="$PREFIX" \
		PKG_CONFIG_ALLOW_SYSTEM_CFLAGS=1 PKG_CONFIG_ALLOW_SYSTEM_LIBS=1 \
		cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
		-DWF_MAN_PAGES=OFF -DCMAKE_PREFIX_PATH="$PREFIX/usr" \
		-DPKG_CONFIG_EXECUTABLE="$PREFIX/bin/pkg-config" -DPROTOC_C="$PREFIX/bin/protoc-c" \
		-DCMAKE_C_STANDARD_INCLUDE_DIRECTORIES="$PREFIX/usr/include" \
		-DCMAKE_C_COMPILER_LAUNCHER="$PREFIX/bin/cc-no-werror" \
		-DCMAKE_EXE_LINKER_FLAGS="-Wl,-rpath-link,$LIBPATH" \
		-DCMAKE_SHARED_LINKER_FLAGS="-Wl,-rpath-link,$LIBPATH" \
		"${cuda[@]}" >>"$BUILD_LOG" 2>&1
}

gpu_tests() { ctest --test-dir "$BUILD" -N -L gpu 2>/dev/null | sed -n 's/^ *Test *#[0-9]*: \([^ ]*\).*/\1/p'; }

# build SECONDS: the targets the run needs: the gpu tests (their add_dependencies bring
# wf-worker, wf-agent, ...), the benchmarks and what they spawn; everything when the list cannot
# be read.
build() {
	local targets
	targets=$(gpu_tests | tr '\n' ' ')
	if [ -z "$targets" ]; then
		timeout "$1" cmake --build "$BUILD" -j "$NPROC" >>"$BUILD_LOG" 2>&1
		return
	fi
	# shellcheck disable=SC2086
	timeout "$1" cmake --build "$BUILD" -j "$NPROC" --target $targets wf-bench wf-gen wf-worker \
		wf-agent ${EXTRA_TARGETS:-} >>"$BUILD_LOG" 2>&1
}

# ---- Step: the gpu tests ------------------------------------------------------------------------

# run_gpu_tests SECONDS: every test labelled gpu, one at a time, each with its own limit (at
# most 150 s and what is left), so a hang costs one test, not the step.
run_gpu_tests() {
	local end=$(($(date +%s) + $1)) name left rc pass=0 fail=0 skip=0 cut=0 failed="" notrun=0
	: >"$TESTS_LOG"
	for name in $(gpu_tests); do
		left=$((end - $(date +%s)))
		if [ $left -lt 10 ]; then
			notrun=$((notrun + 1))
			echo "==== $name: not run (no time left)" >>"$TESTS_LOG"
			continue
		fi
		[ $left -gt 150 ] && left=150
		echo "==== $name (limit ${left}s)" >>"$TESTS_LOG"
		LD_LIBRARY_PATH=$LDDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
			timeout --kill-after=10 "$left" ctest --test-dir "$BUILD" -R "^$name\$" \
			--output-on-failure --timeout "$left" >>"$TESTS_LOG" 2>&1
		rc=$?
		if [ $rc = 124 ] || [ $rc = 137 ]; then
			cut=$((cut + 1))
			failed+="$name(time) "
		elif tail -n 20 "$TESTS_LOG" | grep -q 'tests did not run'; then
			skip=$((skip + 1))
		elif [ $rc = 0 ]; then
			pass=$((pass + 1))
		else
			fail=$((fail + 1))
			failed+="$name "
		fi
	done
	TESTS_FIGURES="$pass passed, $fail failed, $skip skipped, $cut cut at their limit, $notrun not run${failed:+; failed: $failed}"
	[ $fail = 0 ] && [ $cut = 0 ] && [ $notrun = 0 ]
}

# ---- Steps: compute-sanitizer -------------------------------------------------------------------

# The gpu tests under the sanitizer: the contract's and the engine's (by name, so new ones of
# either family are included). One line per test: "name<TAB>command words" (from ctest's JSON).
sanitizer_tests() {
	ctest --test-dir "$BUILD" -L gpu --show-only=json-v1 2>/dev/null | python3 -c '
import json, sys, re
d = json.load(sys.stdin)
for t in d.get("tests", []):
    if re.search(r"contract|engine|backend", t["name"]):
        print(t["name"] + "\t" + "\t".join(t["command"]))
'
}

# The tests a Criterion binary holds, "suite/name" per line (its --list output).
criterion_list() {
	"$1" --list 2>/dev/null | awk '
		/^[^ │├└].*: [0-9]+ tests?$/ { suite = $1; sub(/:$/, "", suite); next }
		/[├└]── / { t = $0; sub(/.*[├└]── /, "", t); print suite "/" t }'
}

# run_sanitizer TOOL SECONDS: the contract binary whole (its tests are short), then the engine
# binaries test by test, one test of each in turn, until the time is spent. Returns 1 on any
# error the tool reported, or a test that failed under it; 2 when clean but some tests were
# skipped, cut or not reached (time).
run_sanitizer() {
	local tool=$1 secs=$2 end=$(($(date +%s) + $2)) errors=0 runs=0 bad=0 notrun=0
	local -a names cmds queue=()
	local name cmd line
	{
		echo "==== compute-sanitizer --tool $tool ($secs s)"
	} >>"$SAN_LOG"
	if [ ! -x "$SANITIZER" ]; then
		SAN_FIGURES="compute-sanitizer not found"
		return 1
	fi
	while IFS=$'\t' read -r name cmd; do
		names+=("$name")
		cmds+=("$cmd")
	done < <(sanitizer_tests | awk -F'\t' '{ printf "%s\t%s\n", $1, $2 }')
	if [ ${#names[@]} -eq 0 ]; then
		SAN_FIGURES="no contract or engine gpu test found"
		return 1
	fi
	# The work list: "bin<TAB>filter" (filter empty: the whole binary).
	local i j max=0
	local -a lists=()
	for i in "${!names[@]}"; do
		if [[ ${names[$i]} == *contract* ]]; then
			queue+=("${cmds[$i]}"$'\t')
		else
			lists[$i]=$(criterion_list "${cmds[$i]}")
			local n
			n=$(grep -c . <<<"${lists[$i]}")
			[ "$n" -gt $max ] && max=$n
		fi
	done
	for ((j = 1; j <= max; j++)); do
		for i in "${!lists[@]}"; do
			line=$(sed -n "${j}p" <<<"${lists[$i]}")
			[ -n "$line" ] && queue+=("${cmds[$i]}"$'\t'"$line")
		done
	done
	local item bin filter left out rc n
	for item in "${queue[@]}"; do
		bin=${item%%$'\t'*}
		filter=${item#*$'\t'}
		left=$((end - $(date +%s)))
		if [ $left -lt 5 ]; then
			notrun=$((notrun + 1))
			continue
		fi
		echo "---- ${bin##*/} ${filter:-(all tests)}" >>"$SAN_LOG"
		out=$(mktemp)
		(
			cd "$BUILD" &&
				LD_LIBRARY_PATH=$LDDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
					WF_SOURCE_DIR=$ROOT WF_BUILD_DIR=$BUILD WF_TEST_SANITIZER=1 \
					timeout --kill-after=5 "$left" "$SANITIZER" --tool "$tool" \
					--target-processes all --print-limit 20 --error-exitcode 86 \
					"$bin" --jobs 1 ${filter:+--filter "$filter"}
		) >"$out" 2>&1
		rc=$?
		cat "$out" >>"$SAN_LOG"
		n=$(sed -n 's/.*ERROR SUMMARY: \([0-9]*\) error.*/\1/p' "$out" | awk '{ s += $1 } END { print s + 0 }')
		errors=$((errors + n))
		runs=$((runs + 1))
		if [ $rc = 124 ] || [ $rc = 137 ]; then
			echo "---- timed out" >>"$SAN_LOG"
			notrun=$((notrun + 1))
		elif [ $rc = 77 ]; then
			echo "---- skipped (exit 77)" >>"$SAN_LOG"
			notrun=$((notrun + 1))
		elif [ $rc != 0 ]; then
			bad=$((bad + 1))
		fi
		rm -f "$out"
	done
	SAN_FIGURES="$runs runs (contract whole, engine tests one by one), $errors errors, $bad failed under the tool, $notrun skipped, cut or not run (time)"
	cap_log "$SAN_LOG"
	[ $errors = 0 ] && [ $bad = 0 ] || return 1
	[ $notrun = 0 ] || return 2
}

# ---- Steps: the benchmarks ----------------------------------------------------------------------

# A line of figures from wf-bench's JSON lines: each row with a goal as metric=ratio(goal), then
# the count of the others and of the skipped.
bench_figures() {
	python3 - "$1" <<'EOF'
import json, sys
rows, skipped, other = [], 0, 0
for line in open(sys.argv[1], errors="replace"):
    line = line.strip()
    if not line.startswith("{"):
        continue
    try:
        r = json.loads(line)
    except ValueError:
        continue
    if "skipped" in r:
        skipped += 1
    elif r.get("goal_op"):
        rows.append("%s %.3g (goal %s %.3g%s)" % (r["metric"], r.get("ratio", r.get("value", 0)),
                    r["goal_op"], r.get("goal", 0), "" if r.get("pass") else ", MISSED"))
    else:
        other += 1
print("; ".join(rows) + ("; " if rows else "") + "%d records, %d skipped" % (other, skipped))
EOF
}

run_bench() {
	local what=$1 t=$2 json=$3
	shift 3
	echo "==== wf-bench $what $* (${t} s)" >>"$BENCH_LOG"
	LD_LIBRARY_PATH=$LDDIR${LLAMA_LIB:+:$LLAMA_LIB}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
		timeout --kill-after=10 "$t" "$BUILD/bench/wf-bench" "$what" --json "$@" \
		>"$json" 2>>"$BENCH_LOG"
	local rc=$?
	[ $rc = 124 ] && echo "==== timed out after ${t}s" >>"$BENCH_LOG"
	cat "$json" >>"$BENCH_LOG"
	BENCH_FIGURES=$([ -s "$json" ] && bench_figures "$json" || echo "no JSON (rc $rc)")
	[ $rc = 124 ] && BENCH_FIGURES="timed out after ${t}s; $BENCH_FIGURES"
	return $rc
}

# ---- The simulation's checks (no GPU) -----------------------------------------------------------

# Every library and program CMake found lies under the prefix, and the binaries load the
# carried sonames from it.
check_isolation() {
	local cache=$BUILD/CMakeCache.txt bad=0 line k v found=0
	while IFS= read -r line; do
		k=${line%%=*}
		v=${line#*=}
		case $k in *-ADVANCED:*) continue ;; esac
		case $k in
		NNG_LIB:* | NNG_INCLUDE:* | CRITERION_LIB:* | PROTOC_C:* | PKG_CONFIG_EXECUTABLE:* | pkgcfg_lib_*)
			found=$((found + 1))
			case $v in
			"$PREFIX"/*) echo "  cache ok: ${k%%:*} = $v" ;;
			*)
				echo "  cache NOT FROM THE PREFIX: ${k%%:*} = $v"
				bad=1
				;;
			esac
			;;
		*_INCLUDE_DIRS:INTERNAL | *_INCLUDEDIR:INTERNAL | *_LIBDIR:INTERNAL)
			case $k in URING_* | XXHASH_* | JSONC_* | PROTOBUFC_* | MHD_*) ;; *) continue ;; esac
			for x in ${v//;/ }; do
				found=$((found + 1))
				case $x in
				"$PREFIX"/*) echo "  cache ok: ${k%%:*} = $x" ;;
				*)
					echo "  cache NOT FROM THE PREFIX: ${k%%:*} = $x"
					bad=1
					;;
				esac
			done
			;;
		esac
	done <"$cache"
	[ $found -ge 9 ] || {
		echo "  only $found cache entries checked (expected 9 or more)"
		bad=1
	}
	local ours bin lib path n=0 bad_ldd=0
	ours=$(ls "$LDDIR")
	for bin in "$BUILD"/tests/cuda/test_cuda_* "$BUILD"/tests/worker/test_*device_lost \
		"$BUILD"/worker/wf-worker "$BUILD"/agent/wf-agent "$BUILD"/bench/wf-bench; do
		[ -x "$bin" ] || continue
		while read -r lib _ path _; do
			grep -qx "$lib" <<<"$ours" || continue
			n=$((n + 1))
			case $path in
			"$PREFIX"/* | "$LDDIR"/*) ;;
			*)
				echo "  ldd: ${bin##*/} loads $lib from $path, not the prefix"
				bad_ldd=1
				;;
			esac
		done < <(LD_LIBRARY_PATH=$LDDIR ldd "$bin" 2>/dev/null | grep '=>')
	done
	echo "  ldd: $n loads of carried libraries by the binaries, all from the prefix: $([ $bad_ldd = 0 ] && echo yes || echo no)"
	[ $bad = 0 ] && [ $bad_ldd = 0 ]
}

# Hides, in this mount namespace, every file of the carried packages that the system has
# installed: bind-mounted over with an empty file, so a header, library, .pc file or program
# found there is unusable. Files the build's own tools load (cmake's libcurl needs libssl, ...)
# stay: those are runtime libraries, and the ldd check shows our binaries take the prefix's.
hide_system_copies() {
	local tools_libs p f n=0 kept=0
	tools_libs=$(for t in cmake ctest ninja cc gcc ld nvcc python3 bash git dpkg-deb tar xz; do
		t=$(command -v "$t") && ldd "$t" 2>/dev/null
	done | awk '/=>/ { print $3 }' | xargs -r readlink -f | sort -u)
	local cc1
	cc1=$(gcc -print-prog-name=cc1 2>/dev/null)
	[ -x "$cc1" ] && tools_libs+=$'\n'$(ldd "$cc1" | awk '/=>/ { print $3 }' | xargs -r readlink -f)
	for p in $(awk '{ print $1 }' "$GPU_DIR/MANIFEST.txt"); do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || continue
		while IFS= read -r f; do
			[ -f "$f" ] || continue
			case $f in /usr/share/doc/* | /usr/share/man/* | /usr/share/lintian/*) continue ;; esac
			if grep -qx "$(readlink -f "$f")" <<<"$tools_libs"; then
				kept=$((kept + 1))
				echo "kept (the build's tools load it): $f"
				continue
			fi
			mount --bind /dev/null "$f" && n=$((n + 1))
		done < <(dpkg -L "$p")
	done
	echo "hid $n system files of the carried packages ($kept kept: loaded by the build's tools)"
}

# ---- Main ---------------------------------------------------------------------------------------

if [ "$MODE" = simulate ]; then
	if [ "$(id -u)" != 0 ] || ! command -v unshare >/dev/null; then
		echo "gpu-check --no-gpu-build-check: needs root and unshare (a private mount namespace)" >&2
		exit 1
	fi
	[ -f "$GPU_DIR/MANIFEST.txt" ] || {
		echo "gpu-check --no-gpu-build-check: no .gpu/MANIFEST.txt: run --prepare first" >&2
		exit 1
	}
	exec unshare --mount --propagation private -- "$0" --_in-namespace --out "$OUTDIR"
fi

preamble
if [ "$MODE" = device ] && ! has_gpu; then
	say "gpu-check: no GPU here (nvidia-smi $(command -v nvidia-smi >/dev/null && echo "lists none" || echo "is missing")):" \
		"this is the run for a GPU machine (docs/BENCHMARKS.md, \"The GPU proof\");" \
		"without one, scripts/gpu-check.sh --no-gpu-build-check checks the build. Exit 77 (skipped)."
	exit 77
fi

t0=$(date +%s)
if [ "$MODE" = simulate-inside ]; then
	hide_system_copies >>"$BUILD_LOG" 2>&1
	say "$(tail -n 1 "$BUILD_LOG")"
	# The integration test whose processes load every carried library (nng, protobuf-c,
	# microhttpd, json-c, criterion, liburing, xxhash).
	EXTRA_TARGETS="test_worker_device_lost agentctl"
	unpack 1
else
	unpack 0
fi
rc=$?
row unpack "$([ $rc = 0 ] && echo ok || echo FAIL)" $(($(date +%s) - t0)) "${UNPACK_FIGURES:-see build.log}"
if [ $rc != 0 ]; then
	print_summary
	exit 1
fi

# Minimum seconds kept for each later step (build 60, tests 60, residency 30, engine 60,
# memcheck 30, racecheck 20): a slow step takes from the caps of the later ones, never all of it.
CUDA_ARCH=${WF_GPU_ARCH:-${CC_ARCH:-90}}
t0=$(date +%s)
configure "$(step_budget 90 260)" 2>>"$BUILD_LOG"
rc=$?
cuda_on=$(grep -o 'CUDA is ON[^)]*)' "$BUILD_LOG" | tail -n 1)
row configure "$([ $rc = 0 ] && echo ok || echo FAIL)" $(($(date +%s) - t0)) "${cuda_on:-CUDA not found}; arch $CUDA_ARCH"
if [ $rc != 0 ]; then
	tail -n 30 "$BUILD_LOG"
	print_summary
	exit 1
fi

t0=$(date +%s)
t=$(step_budget 200 200)
build "$t"
rc=$?
warnings=$(grep -c 'warning:' "$BUILD_LOG")
row build "$([ $rc = 0 ] && echo ok || echo FAIL)" $(($(date +%s) - t0)) \
	"$(gpu_tests | wc -l) gpu tests; $warnings compiler warnings$([ $rc = 124 ] && echo "; timed out after ${t}s")"
cap_log "$BUILD_LOG"
if [ $rc != 0 ]; then
	grep -m 20 -E 'error|FAILED' "$BUILD_LOG"
	print_summary
	exit 1
fi

if [ "$MODE" = simulate-inside ]; then
	t0=$(date +%s)
	check_isolation >>"$BUILD_LOG" 2>&1
	rc=$?
	row isolation "$([ $rc = 0 ] && echo ok || echo FAIL)" $(($(date +%s) - t0)) \
		"$(grep -c 'cache ok' "$BUILD_LOG") cache paths under the prefix; $(grep '  ldd:' "$BUILD_LOG" | tail -n 1 | sed 's/^ *ldd: //')"
	t0=$(date +%s)
	run_gpu_tests "$(step_budget 120 0)"
	rc=$?
	row gpu-tests "$([ $rc = 0 ] && echo ok || echo FAIL)" $(($(date +%s) - t0)) "$TESTS_FIGURES (no GPU here)"
	t0=$(date +%s)
	echo "==== test_worker_device_lost (integ, host device)" >>"$TESTS_LOG"
	LD_LIBRARY_PATH=$LDDIR timeout 240 ctest --test-dir "$BUILD" -R '^test_worker_device_lost$' \
		--output-on-failure >>"$TESTS_LOG" 2>&1
	rc=$?
	row integ "$([ $rc = 0 ] && echo ok || echo FAIL)" $(($(date +%s) - t0)) \
		"test_worker_device_lost: wf-agent, wf-worker, agentctl on the carried libraries"
	print_summary
	exit $FAILED
fi

t0=$(date +%s)
run_gpu_tests "$(step_budget 170 140)"
rc=$?
row gpu-tests "$([ $rc = 0 ] && echo ok || echo FAIL)" $(($(date +%s) - t0)) "$TESTS_FIGURES"

: >"$BENCH_LOG"
bdir=$(mktemp -d "${TMPDIR:-/var/tmp}/wf-gpu-bench.XXXXXX")
t0=$(date +%s)
run_bench kernels "$(step_budget 45 140)" "$OUTDIR/kernels.json" --device cuda:0
rc=$?
row kernels "$([ $rc = 0 ] && echo ok || echo FAIL)" $(($(date +%s) - t0)) "$BENCH_FIGURES"

t0=$(date +%s)
run_bench residency "$(step_budget 60 110)" "$OUTDIR/residency.json" --device cuda:0 \
	--dir "$bdir" --size 1G
rc=$?
row residency "$([ $rc = 0 ] && echo ok || echo FAIL)" $(($(date +%s) - t0)) "$BENCH_FIGURES"

t0=$(date +%s)
llama=()
if [ -x "$GPU_DIR/llama-bench" ]; then
	llama=(--llama-bench-gpu "$GPU_DIR/llama-bench")
	LLAMA_LIB=$GPU_DIR
fi
run_bench engine "$(step_budget 150 50)" "$OUTDIR/engine.json" --device cuda:0 --dir "$bdir" \
	--threads "$NPROC" --iterations "${WF_GPU_BENCH_ITERATIONS:-1}" "${llama[@]}"
rc=$?
row engine "$([ $rc = 0 ] && echo ok || echo FAIL)" $(($(date +%s) - t0)) \
	"$BENCH_FIGURES$([ ${#llama[@]} = 0 ] && echo "; no .gpu/llama-bench: no llama.cpp GPU anchor")"
rm -rf "$bdir"

t0=$(date +%s)
: >"$SAN_LOG"
run_sanitizer memcheck "$(step_budget 90 20)"
rc=$?
row memcheck "$(result $rc)" $(($(date +%s) - t0)) "$SAN_FIGURES"
t0=$(date +%s)
run_sanitizer racecheck "$(step_budget 60 0)"
rc=$?
row racecheck "$(result $rc)" $(($(date +%s) - t0)) "$SAN_FIGURES"

cap_log "$BENCH_LOG"
cap_log "$TESTS_LOG"
cap_log "$SAN_LOG"
print_summary
exit $FAILED
