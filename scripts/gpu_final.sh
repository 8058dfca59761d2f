#!/usr/bin/env bash
# The last device run of a work session: the weights cache (probe), the
# PyTorch export checked on the GPU, then the bench of the best variant of
# a recorded session against the baseline. Logs go to $OUT.
# Usage: scripts/gpu_final.sh DB VARIANT
set -uo pipefail
. "$(dirname "$0")/device_env.sh"
db=$1
variant=$2
timeout 60 "$D/ktune" probe --backend cuda --size full --runner "$D/ktune-runner" > "$OUT/probe.log" 2>&1
"$D/ktune" export --db "$db" "$variant" --out /tmp/kimi_module --force
timeout 270 python3 export/test_export_gpu.py /tmp/kimi_module 2>&1 | tee "$OUT/export_gpu.log" | tail -40
timeout 150 "$D/ktune" bench --backend cuda --size full --db "$db" --variant "$variant" --samples 40 --seeds 3 \
  --json "$OUT/bench_final.json" 2>&1 | tee "$OUT/bench_final.log" | grep -vE '"functions"' | tail -22
