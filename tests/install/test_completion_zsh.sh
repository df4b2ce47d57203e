#!/usr/bin/env bash
# The zsh completion of agentctl parses, and compinit binds it to agentctl through its #compdef
# line when its directory is on $fpath. Skipped (77) where zsh is not installed.
. "$(dirname "$0")/lib.sh"
command -v zsh >/dev/null || { echo "zsh not installed: skipped"; exit 77; }
f=$WF_SOURCE_DIR/completions/_agentctl
check "zsh -n _agentctl" zsh -n "$f"
check "#compdef agentctl" grep -qx '#compdef agentctl' "$f"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
out=$(HOME=$tmp zsh -fc "fpath=('$WF_SOURCE_DIR/completions' \$fpath); autoload -Uz compinit;
	compinit -u -d '$tmp/zcompdump'; print -r -- \$_comps[agentctl]; autoload -Uz +X _agentctl &&
	print loaded" 2>&1)
check "compinit binds agentctl to _agentctl (got: $out)" test "$out" = $'_agentctl\nloaded'
finish
