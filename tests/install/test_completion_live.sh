#!/usr/bin/env bash
# The bash completion asks a real agent for model names and worker ids: a wf-agent with two
# models (one a Hugging Face style name with a slash) and one wf-worker on ipc:// sockets in a
# temp dir; the connection flags typed before the command are passed on to those queries.
. "$(dirname "$0")/lib.sh"
B=$WF_BUILD_DIR
A=$B/control/agentctl/agentctl
. "$WF_SOURCE_DIR/completions/agentctl.bash" || exit 1
tmp=$(mktemp -d)
pids=()
cleanup() {
	local p
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
	rm -rf "$tmp"
}
trap cleanup EXIT

"$B/tools/wf-gen" -q -o "$tmp/m.gguf" --size 2M || { echo "FAIL: wf-gen" >&2; exit 1; }
"$B/agent/wf-agent" --floor-dir "$tmp/floors" --socket "ipc://$tmp/agent.sock" \
	--events "ipc://$tmp/events.sock" --state-file none \
	--model "Qwen/Qwen3-30B-A3B=$tmp/m.gguf" --model "tiny=$tmp/m.gguf" >"$tmp/agent.log" 2>&1 &
pids+=($!)
wait_for 20 "$A" --socket "ipc://$tmp/agent.sock" status || { cat "$tmp/agent.log" >&2; echo "FAIL: agent did not start" >&2; exit 1; }
"$B/worker/wf-worker" --device host --arena 64M --id "gpu-0.node-a" --endpoint "ipc://$tmp/w0.sock" \
	--agent "ipc://$tmp/agent.sock" --floor-dir "$tmp/floors" >"$tmp/worker.log" 2>&1 &
pids+=($!)
worker_listed() { "$A" --socket "ipc://$tmp/agent.sock" --json workers | grep -q '"gpu-0.node-a"'; }
wait_for 20 worker_listed || { cat "$tmp/worker.log" >&2; echo "FAIL: worker did not register" >&2; exit 1; }

comp() {
	COMP_WORDS=("$@")
	COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
	COMPREPLY=()
	_agentctl
	[ "${#COMPREPLY[@]}" -eq 0 ] || printf '%s\n' "${COMPREPLY[@]}" | sort
}
S=(--socket "ipc://$tmp/agent.sock")
models=$'Qwen/Qwen3-30B-A3B\ntiny'
check "pin MODEL lists both models" test "$(comp "$A" "${S[@]}" pin "")" = "$models"
check "a model prefix" test "$(comp "$A" "${S[@]}" evict Qw)" = "Qwen/Qwen3-30B-A3B"
check "floor ensure MODEL" test "$(comp "$A" "${S[@]}" floor ensure "")" = "$models"
check "models NAME" test "$(comp "$A" "${S[@]}" models t)" = "tiny"
check "residency MODEL" test "$(comp "$A" "${S[@]}" --json residency "")" = "$models"
check "compact MODEL..." test "$(comp "$A" "${S[@]}" compact tiny "")" = "$models"
check "--socket=URL form" test "$(comp "$A" "--socket=ipc://$tmp/agent.sock" unpin "")" = "$models"
check "--worker ID" test "$(comp "$A" "${S[@]}" pin tiny --worker "")" = "gpu-0.node-a"
check "no model names after pin MODEL" test -z "$(comp "$A" "${S[@]}" pin tiny "")"
# Without the connection flags the default socket is asked: not this agent.
check "the socket on the line is the one asked" test "$(comp "$A" pin "" | grep -c tiny)" = 0
finish
