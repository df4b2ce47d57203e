# shellcheck shell=bash
# Sourced by setup.sh, demo.sh and test.sh: quiet steps and locked builds.
#
# Every step sends its whole output to one log file ($WF_LOG) and prints one line: what it did
# and how long it took, or, when it fails, the end of the log and the log's path. Builds take an
# exclusive lock on their build directory, so two demos started at once in the same clone wait
# for each other instead of running two cmakes in one tree.

# wf_log_open <dir>: the log file of this run, <dir>/build.log (dir must exist).
wf_log_open() {
	WF_LOG=$1/build.log
	: >>"$WF_LOG"
	export WF_LOG
}

# wf_step <what> <command...>: runs the command with its output appended to $WF_LOG.
wf_step() {
	local what=$1 t0=$SECONDS rc=0
	shift
	printf '%s ... ' "$what"
	printf '\n== %s: %s\n' "$what" "$*" >>"$WF_LOG"
	"$@" >>"$WF_LOG" 2>&1 </dev/null || rc=$?
	if [ "$rc" = 0 ]; then
		printf 'ok (%d s)\n' $((SECONDS - t0))
		return 0
	fi
	printf 'FAILED (exit %d)\n' "$rc"
	tail -n 30 "$WF_LOG" | sed 's/^/  | /' >&2
	echo "full log: $WF_LOG" >&2
	return "$rc"
}

# wf_build <dir> [--targets "t1 t2"] [cmake configure args...]: configures and builds <dir> with
# Ninja, holding <dir>/.wf-build.lock throughout.
wf_build() {
	local dir=$1 targets="" fd rc=0
	shift
	if [ "${1:-}" = --targets ]; then
		targets=$2
		shift 2
	fi
	mkdir -p "$dir"
	exec {fd}>"$dir/.wf-build.lock"
	if ! flock -w 3600 "$fd"; then
		echo "cannot lock $dir/.wf-build.lock" >&2
		return 1
	fi
	wf_step "configure $dir ($*)" cmake -S . -B "$dir" -G Ninja "$@" || rc=$?
	if [ "$rc" = 0 ]; then
		# shellcheck disable=SC2086 # targets is a word list
		wf_step "build $dir" cmake --build "$dir" -j "$(nproc)" ${targets:+--target $targets} || rc=$?
	fi
	exec {fd}>&-
	return "$rc"
}
