#!/usr/bin/env bash
# One device-machine run: an unattended ktune session on the GPU for the
# given budget, then its history, trace and replay. Everything lands in $OUT.
# Usage: scripts/gpu_session.sh BUDGET [run-args...]
set -uo pipefail
. "$(dirname "$0")/device_env.sh"
budget=${1:-8m}
shift || true
"$D/ktune" run --task kimi-linear --size full --backend cuda --budget "$budget" --db "$OUT/session.sqlite" "$@" 2>&1 |
  tee "$OUT/session.log" | tail -60
"$D/ktune" trace export --db "$OUT/session.sqlite" 1 --out "$OUT/session.jsonl"
"$D/ktune" replay "$OUT/session.jsonl" --svg "$OUT/session.svg" > "$OUT/replay.txt" 2>&1
tail -25 "$OUT/replay.txt"
