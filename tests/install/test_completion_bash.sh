#!/usr/bin/env bash
# The bash completion of agentctl, sourced from the source tree and driven the way bash drives it
# (COMP_WORDS, COMP_CWORD, then COMPREPLY): commands, flags and fixed values complete, and nothing
# agentctl's own --help texts list is missing from them.
. "$(dirname "$0")/lib.sh"
A=$WF_BUILD_DIR/control/agentctl/agentctl
# shellcheck source=/dev/null
. "$WF_SOURCE_DIR/completions/agentctl.bash" || { echo "FAIL: sourcing the completion" >&2; exit 1; }
complete -p agentctl | grep -q -- '-F _agentctl agentctl' || fail "complete -p agentctl names _agentctl"

# comp WORD...: the completions of the last word (possibly empty), one a line, sorted.
comp() {
	COMP_WORDS=("$@")
	COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
	COMPREPLY=()
	_agentctl
	[ "${#COMPREPLY[@]}" -eq 0 ] || printf '%s\n' "${COMPREPLY[@]}" | sort
}
# has "DESCRIPTION" "EXPECTED WORDS" WORD...: every expected word is among the completions.
has() {
	local what=$1 want=$2 w got
	shift 2
	got=$(comp "$@")
	for w in $want; do
		grep -qx -- "$w" <<<"$got" || { fail "$what: '$w' missing from [$(echo $got)]"; return; }
	done
	pass "$what"
}

# Commands: the fixed list, and every command agentctl --help lists.
has "commands" "inspect status models register floor publish watch workers residency pin unpin evict prefetch compact generate" "$A" ""
help_cmds=$("$A" --help | sed -n '/^commands:/,/^$/p' | awk 'NR > 1 && NF { print $1 }')
[ -n "$help_cmds" ] || fail "agentctl --help lists no commands"
has "every command in agentctl --help" "$help_cmds" "$A" ""
has "a command prefix" "prefetch" "$A" "pr"
[ "$(comp "$A" pr)" = "prefetch" ] || fail "'pr' completes to prefetch only"

# Global flags: every long flag agentctl --help shows, plus -o/--output and --version.
has "global flags" "--socket --events --json --timeout --quiet --tls-ca --tls-cert --tls-key --tls-server-name --output --version --help" "$A" "--"
has "every flag in agentctl --help" "$("$A" --help | flags_of)" "$A" "--"
has "global flags after the command" "--socket --json --timeout" "$A" "status" "--"

# Per-command flags, checked against each command's own --help.
for c in inspect status models register publish watch workers residency pin unpin evict prefetch compact generate; do
	want=$("$A" "$c" --help 2>&1 | flags_of)
	has "$c flags (from agentctl $c --help)" "$want" "$A" "$c" "--"
done
want=$("$A" floor --help 2>&1 | flags_of)
has "floor ensure flags (from agentctl floor --help)" "$want" "$A" floor ensure "--"
has "worker verbs take --worker and --all" "--worker --all --json" "$A" pin qwen "--"
has "watch flags" "--count --for" "$A" watch "--"
has "generate flags" "--worker --max-tokens --temp --top-k --top-p --min-p --repeat-penalty --seed --stop --prompt-ids" "$A" generate qwen "--"
has "floor ensure flags" "--no-wait --wait-timeout" "$A" floor ensure "--"

# Fixed values.
has "floor sub-commands" "ensure release pin unpin" "$A" floor ""
has "residency states" "disk host device pinned_device" "$A" residency qwen ""
has "residency states after global flags" "disk host device pinned_device" "$A" --socket ipc:///x --json residency qwen ""
has "-o values" "json wide" "$A" -o ""
has "--output values" "json wide" "$A" --output ""

# File arguments.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
touch "$tmp/model-00001-of-00002.gguf"
has "inspect completes files" "$tmp/model-00001-of-00002.gguf" "$A" inspect "$tmp/model-"
has "register's PATH completes files" "$tmp/model-00001-of-00002.gguf" "$A" register qwen "$tmp/model-"
has "publish --tensor NAME=FILE completes the FILE" "blk.0.w=$tmp/model-00001-of-00002.gguf" "$A" publish qwen --tensor "blk.0.w=$tmp/model-"
has "publish --tensor NAME = FILE (split at =) completes the FILE" "$tmp/model-00001-of-00002.gguf" "$A" publish qwen --tensor blk.0.w = "$tmp/model-"
has "publish flags" "--tensor --dry-run" "$A" publish qwen "--"

# No agent there: model names complete to nothing, at once, with nothing on the terminal.
start=$SECONDS
out=$(comp "$A" --socket "ipc://$tmp/none.sock" pin "" 2>&1)
check "no agent: no model names" test -z "$out"
# agentctl's --timeout 2000 bounds it; only a completion that hangs fails here.
check "no agent: answers without hanging" test $((SECONDS - start)) -le 10
finish
