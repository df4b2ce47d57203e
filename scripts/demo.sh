#!/usr/bin/env bash
# The main job: set up, build, generate the default synthetic MoE model, inspect it, start an
# agent and two workers (the host device when there is no GPU) that share one floor, pin the model
# on both, and show `agentctl workers` and `agentctl status`. Everything runs in a private
# directory ($WF_DEMO_DIR, default ./demo-out) with its own floor directory and sockets, and is
# stopped at the end (WF_DEMO_KEEP=1 leaves the processes running).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$(nproc)"

out=${WF_DEMO_DIR:-$PWD/demo-out}
mkdir -p "$out/models" "$out/run" "$out/log"
out=$(cd "$out" && pwd)
floor=/dev/shm/weightfloor-demo-$(id -u)
model="$out/models/qwen3moe-demo.gguf"
agent_url="ipc://$out/run/agent.sock"
events_url="ipc://$out/run/events.sock"
ctl() { ./build/control/agentctl/agentctl --socket "$agent_url" --events "$events_url" "$@"; }

pids=()
cleanup() {
	if [ "${WF_DEMO_KEEP:-0}" = 1 ]; then
		echo "left running: pids ${pids[*]:-} (floor $floor, sockets in $out/run)"
		return
	fi
	for p in "${pids[@]:-}"; do [ -n "$p" ] && kill -TERM "$p" 2>/dev/null || true; done
	for p in "${pids[@]:-}"; do [ -n "$p" ] && wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

echo "== wf-gen: default qwen3moe model -> $model"
[ -f "$model" ] || ./build/tools/wf-gen --arch qwen3moe --seed 7 -o "$model"
echo
echo "== agentctl inspect"
ctl inspect "$model"

echo
echo "== wf-agent (floor $floor, log $out/log/agent.log)"
./build/agent/wf-agent --floor-dir "$floor" --socket "$agent_url" --events "$events_url" \
	--model "demo=$model" >"$out/log/agent.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do ctl status >/dev/null 2>&1 && break; sleep 0.1; done
ctl floor ensure demo

for w in a b; do
	echo "== wf-worker worker-$w (log $out/log/worker-$w.log)"
	./build/worker/wf-worker --device auto --id "worker-$w" --endpoint "ipc://$out/run/worker-$w.sock" \
		--agent "$agent_url" --floor-dir "$floor" >"$out/log/worker-$w.log" 2>&1 &
	pids+=($!)
done
for _ in $(seq 100); do
	[ "$(ctl --json workers 2>/dev/null | grep -o '"worker_id"' | wc -l)" -ge 2 ] && break
	sleep 0.1
done

echo
echo "== agentctl pin demo --all"
ctl pin demo --all
echo
echo "== agentctl workers"
ctl workers
echo
echo "== agentctl status"
ctl status
