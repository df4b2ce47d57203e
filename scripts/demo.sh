#!/usr/bin/env bash
# The main job: set up, build, generate the default synthetic MoE model, inspect it, start an
# agent and two workers (the host device when there is no GPU) that share one floor, pin the model
# on both, show `agentctl workers` and `agentctl status`, and then the point of it all: the
# proportional set size (PSS) of each process's mapping of the floor region, which adds up to one
# copy of the model in RAM however many processes map it.
#
# Everything runs in private temporary directories (mktemp): the model, sockets and logs under
# $TMPDIR (default /tmp), the floor under /dev/shm. All of it, and every process, is gone when the
# script ends; on failure the logs are kept and their path printed. Several demos may run at once
# in one clone: they share the build directory (build-release, built under a lock).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

tmp=$(mktemp -d "${TMPDIR:-/tmp}/weightfloor-demo.XXXXXX")
floor=$(mktemp -d /dev/shm/weightfloor-demo.XXXXXX)
mkdir -p "$tmp/log" "$tmp/run" "$tmp/models"
wf_log_open "$tmp/log"

pids=()
cleanup() {
	local rc=$? p
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	# Wait for each to exit (up to 10 s), then SIGKILL what is left: nothing outlives the demo.
	for _ in $(seq 100); do
		local alive=0
		for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
		[ "$alive" = 0 ] && break
		sleep 0.1
	done
	for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	rm -rf "$floor"
	if [ "$rc" = 0 ]; then
		rm -rf "$tmp"
	else
		rm -rf "$tmp/run" "$tmp/models"
		echo "demo: FAILED (exit $rc); logs kept in $tmp/log" >&2
	fi
}
trap cleanup EXIT

bash scripts/setup.sh
wf_build build-release -DCMAKE_BUILD_TYPE=Release
bin=$PWD/build-release

model="$tmp/models/qwen3moe-demo.gguf"
agent_url="ipc://$tmp/run/agent.sock"
events_url="ipc://$tmp/run/events.sock"
ctl() { "$bin/control/agentctl/agentctl" --socket "$agent_url" --events "$events_url" "$@"; }

# until <seconds> <command...>: polls the command every 0.1 s; fails after the time-out.
until_ok() {
	local n=$(($1 * 10))
	shift
	for _ in $(seq "$n"); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
	echo "demo: timed out waiting for: $*" >&2
	return 1
}
n_workers() { [ "$(ctl --json workers 2>/dev/null | grep -o '"worker_id"' | wc -l)" -ge 2 ]; }

wf_step "wf-gen: default qwen3moe model" "$bin/tools/wf-gen" --arch qwen3moe --seed 7 -o "$model"
echo
echo "== agentctl inspect"
ctl inspect "$model"

echo
echo "== wf-agent (floor $floor)"
"$bin/agent/wf-agent" --floor-dir "$floor" --socket "$agent_url" --events "$events_url" \
	--model "demo=$model" >"$tmp/log/agent.log" 2>&1 &
agent_pid=$!
pids+=("$agent_pid")
until_ok 20 ctl status
ctl floor ensure demo

declare -A who=([$agent_pid]=wf-agent)
for w in a b; do
	echo "== wf-worker worker-$w"
	"$bin/worker/wf-worker" --device auto --id "worker-$w" --endpoint "ipc://$tmp/run/worker-$w.sock" \
		--agent "$agent_url" --floor-dir "$floor" >"$tmp/log/worker-$w.log" 2>&1 &
	pids+=($!)
	who[$!]=worker-$w
done
until_ok 20 n_workers

echo
echo "== agentctl pin demo --all"
ctl pin demo --all
echo
echo "== agentctl workers"
ctl workers
echo
echo "== agentctl status"
ctl status

# The floor region is the one file wf-<digest> (no suffix: .guard and .holders are lock files).
region=$(find "$floor" -maxdepth 1 -type f -regex '.*/wf-[0-9a-f]+' | head -n 1)
[ -n "$region" ] || { echo "demo: no region file in $floor" >&2; exit 1; }
region_kb=$(($(stat -c %s "$region") / 1024))
model_kb=$(($(stat -c %s "$model") / 1024))

# kB of Rss and Pss of the process's mappings of exactly that file, from /proc/PID/smaps.
floor_mem() {
	awk -v path="$region" '
		/^[0-9a-f]+-[0-9a-f]+ / { mine = ($6 == path) ; next }
		mine && $1 == "Rss:" { rss += $2 }
		mine && $1 == "Pss:" { pss += $2 }
		END { printf "%d %d\n", rss, pss }' "/proc/$1/smaps"
}
mib() { awk -v k="$1" 'BEGIN { printf "%.2f MiB", k / 1024 }'; }

echo
echo "== one copy in RAM: PSS of each process's mapping of the floor region"
echo "   region $region"
echo "   model file $(mib "$model_kb"), floor region $(mib "$region_kb")"
echo
printf '   %-10s %8s %14s %14s\n' PROCESS PID "RSS (floor)" "PSS (floor)"
sum_rss=0 sum_pss=0
for p in "${pids[@]}"; do
	read -r rss pss < <(floor_mem "$p")
	printf '   %-10s %8d %14s %14s\n' "${who[$p]}" "$p" "$(mib "$rss")" "$(mib "$pss")"
	sum_rss=$((sum_rss + rss)) sum_pss=$((sum_pss + pss))
done
printf '   %-10s %8s %14s %14s\n' sum "" "$(mib "$sum_rss")" "$(mib "$sum_pss")"
echo
awk -v r="$sum_rss" -v p="$sum_pss" -v z="$region_kb" 'BEGIN {
	printf "   RSS sum %.2f x region size: each process counts every shared page it touched\n", r / z
	if (p >= 0.95 * z && p <= 1.05 * z)
		verdict = "one copy in RAM, shared by every process that maps it"
	else
		verdict = "not one full copy: PSS counts only the pages these processes have touched"
	printf "   PSS sum %.2f x region size: %s\n", p / z, verdict
}'

# The engine: text from the default model through a worker, printed as it is made, tokens/s on
# stderr. The worker reads the weights from the floor above (its own read-only mapping of the
# same pages). wf-gen's weights are random, so the text is too.
echo
echo "== agentctl generate demo \"Once upon a time\" --worker worker-a --max-tokens 32"
ctl generate demo "Once upon a time" --worker worker-a --max-tokens 32 --seed 1 --temp 0.8
