#!/usr/bin/env bash
# One device-machine run for kernel work: GPU facts, optionally the PyTorch
# export checked on the GPU, then `ktune bench` of megakernel knob sets
# (each validated against the oracle, timed, and profiled per phase).
# Logs go to $OUT.
# Usage (device tool, with .devcarry carried):
#   scripts/gpu_bench.sh [--export KNOBS_JSON] [bench args: --knobs JSON ...]
set -uo pipefail
. "$(dirname "$0")/device_env.sh"
if [ "${1:-}" = "--export" ]; then
  echo "== export $2"
  "$D/ktune" export --knobs "$2" --out /tmp/kimi_module --force | tee "$OUT/export.log"
  PYTHONUNBUFFERED=1 timeout 300 python3 export/test_export_gpu.py /tmp/kimi_module 2>&1 | tee -a "$OUT/export.log" |
    grep -vE "^ok: " | tail -30
  shift 2
fi
echo "== bench"
timeout 500 "$D/ktune" bench --backend cuda --size full --json "$OUT/bench.json" "$@" 2>&1 | tee "$OUT/bench.log" |
  grep -vE '^baseline|^megakernel.*build|"functions"' | tail -90
