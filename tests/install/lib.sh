# Sourced by the packaging tests. Exit codes: 0 pass, 1 fail, 77 skip.
set -u
: "${WF_SOURCE_DIR:?}" "${WF_BUILD_DIR:?}" "${WF_VERSION:?}"
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
pass() { echo "ok: $*"; }
# check DESCRIPTION COMMAND...: passes when the command succeeds.
check() {
	local what=$1
	shift
	if "$@"; then pass "$what"; else fail "$what"; return 1; fi
}
finish() {
	if [ "$fails" -ne 0 ]; then
		echo "$fails check(s) failed" >&2
		exit 1
	fi
	exit 0
}
# wait_for SECONDS COMMAND...: polls COMMAND every 50 ms until it succeeds; 1 on time-out.
wait_for() {
	local deadline=$((SECONDS + $1))
	shift
	until "$@" >/dev/null 2>&1; do
		[ "$SECONDS" -lt "$deadline" ] || return 1
		sleep 0.05
	done
}
# The long flags a help text or man page names, one a line; "--tls-*" placeholders are left out.
flags_of() {
	sed 's/--[a-z0-9-]*\*//g' | grep -o -- '--[a-z][a-z0-9-]*[a-z0-9]' | sort -u
}
