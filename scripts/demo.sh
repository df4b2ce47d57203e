#!/usr/bin/env bash
# The main job: set up, build, generate the default synthetic MoE model and inspect it.
# Output lands in $WF_DEMO_DIR (default ./demo-out).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$(nproc)"

out=${WF_DEMO_DIR:-$PWD/demo-out}
mkdir -p "$out"
model="$out/qwen3moe-demo.gguf"
echo "== wf-gen: default qwen3moe model -> $model"
./build/tools/wf-gen --arch qwen3moe --seed 7 -o "$model"
echo
echo "== agentctl inspect $model"
./build/control/agentctl/agentctl inspect "$model"
