#!/usr/bin/env bash
# One device-machine run: GPU facts, the GPU tests, probes and the bench of
# baseline vs megakernel at every decode shape. Logs go to $OUT.
# Usage (device tool, with .devcarry carried): scripts/gpu_check.sh [bench-args...]
set -uo pipefail
D=$PWD/.devcarry
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export KTUNE_GOLDEN_DIR=$D/golden KTUNE_SOURCE_DIR=$PWD KTUNE_RUNNER=$D/ktune-runner PATH=/usr/local/cuda/bin:$PATH
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
nvcc --version | tail -2
echo "== GPU tests"
timeout 300 "$D/test_agent" -ts=gpu 2>&1 | tee "$OUT/gpu_tests.log" | grep -vE "^\s*$" | tail -30
echo "== bench"
timeout 420 "$D/ktune" bench --backend cuda --size full --json "$OUT/bench.json" "$@" 2>&1 | tee "$OUT/bench.log" | tail -45
