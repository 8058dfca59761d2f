#!/usr/bin/env bash
# One device-machine run: GPU facts, the GPU tests, probes, and the bench of
# the baseline against megakernel variants at every decode shape, with the
# default megakernel's per-phase profile. Logs go to $OUT.
# Usage (device tool, with .devcarry carried): scripts/gpu_check.sh [bench-args...]
set -uo pipefail
D=$PWD/.devcarry
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export KTUNE_GOLDEN_DIR=$D/golden KTUNE_SOURCE_DIR=$PWD KTUNE_RUNNER=$D/ktune-runner PATH=/usr/local/cuda/bin:$PATH
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
echo "== GPU tests"
timeout 300 "$D/test_agent" -ts=gpu 2>&1 | tee "$OUT/gpu_tests.log" | grep -E "^gpu |FAIL|ERROR|Status|SKIP"
echo "== bench"
timeout 480 "$D/ktune" bench --backend cuda --size full --json "$OUT/bench.json" "$@" 2>&1 | tee "$OUT/bench.log" |
  grep -vE '^baseline|^megakernel.*build|"functions"' | tail -80
