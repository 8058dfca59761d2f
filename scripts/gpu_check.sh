#!/usr/bin/env bash
# One device-machine run: GPU facts, the GPU tests, probes, and the bench of
# the baseline against megakernel variants at every decode shape, with the
# default megakernel's per-phase profile. Logs go to $OUT.
# Usage (device tool, with .devcarry carried): scripts/gpu_check.sh [bench-args...]
set -uo pipefail
. "$(dirname "$0")/device_env.sh"
echo "== GPU tests"
timeout 300 "$D/test_agent" -ts=gpu 2>&1 | tee "$OUT/gpu_tests.log" | grep -E "^gpu |FAIL|ERROR|Status|SKIP"
echo "== bench"
timeout 480 "$D/ktune" bench --backend cuda --size full --json "$OUT/bench.json" "$@" 2>&1 | tee "$OUT/bench.log" |
  grep -vE '^baseline|^megakernel.*build|"functions"' | tail -80
