#!/usr/bin/env bash
# The roff pages built from docs/man/*.md: each renders with man -l (tables through tbl), has the
# NAME line whatis parses ("name - summary"), and names every long flag its binary's --help lists,
# so that a flag added to a binary without its man page fails here.
. "$(dirname "$0")/lib.sh"
[ "${WF_MAN_PAGES:-ON}" != OFF ] || { echo "built with -DWF_MAN_PAGES=OFF: skipped"; exit 77; }
B=$WF_BUILD_DIR
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
render() {
	if command -v man >/dev/null; then
		MANWIDTH=120 LC_ALL=C.UTF-8 man -P cat -l "$1"
	else
		groff -man -t -Tutf8 "$1"
	fi
}
for page in agentctl:1:control/agentctl/agentctl wf-agent:8:agent/wf-agent wf-worker:8:worker/wf-worker; do
	IFS=: read -r name sec bin <<<"$page"
	f=$B/man/$name.$sec
	check "$name.$sec built" test -s "$f" || continue
	check "$name.$sec: .TH ${name^^} $sec" grep -q "^\.TH ${name^^} $sec " "$f"
	text=$(render "$f" 2>"$tmp/$name.$sec.err")
	check "$name.$sec renders" test -n "$text"
	check "$name.$sec: no roff errors ($(head -c 300 "$tmp/$name.$sec.err"))" \
		bash -c "! grep -qi 'error' '$tmp/$name.$sec.err'"
	grep -q "^       $name - " <<<"$text" || fail "$name.$sec: NAME line is '$name - ...'"
	# Tables became boxes, not raw tbl requests.
	grep -q '^\.TS' "$f" && { grep -q '\.TS\|T{' <<<"$text" && fail "$name.$sec: tbl did not run"; }
	# Flags: from the roff source with font escapes removed (rendered text may break lines at a
	# hyphen). --help and --version are every binary's; agentctl's page may not list them.
	src=$(sed -e 's/\\f[BIRCP]//g' -e 's/\\-/-/g' "$f")
	before=$fails
	for flag in $("$B/$bin" --help 2>&1 | flags_of); do
		case $flag in --help | --version) continue ;; esac
		grep -q -- "$flag" <<<"$src" || fail "$name.$sec does not mention $flag (from $name --help)"
	done
	[ "$fails" -ne "$before" ] || pass "$name.$sec names every flag of $name --help"
done
finish
