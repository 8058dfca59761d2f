#!/usr/bin/env bash
# Packs what a run on the device machine needs into .devcarry/ (ignored by
# git; name it in the device tool's `carry`): stripped ktune, ktune-runner,
# the GPU test binary, the probe kernels, the GEMV engine, hand-off,
# instruction-fetch, consumer-rate, fused-MoE, merged-o_proj and step's-shape
# studies (the last also at 12 consumer warps), CUPTI, and the small golden file.
# Usage: scripts/device_pack.sh [build-dir]
set -euo pipefail
build=${1:-build}
root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/.devcarry
rm -rf "$out"
mkdir -p "$out/golden"
for f in ktune ktune-runner ktune_probes.cubin gemv_engine handoff_probe icache_probe consumer_rate moe_fused oproj_merge step_shape step_shape_t384 tests/test_agent; do
  cp "$root/$build/$f" "$out/"
done
strip "$out/ktune" "$out/ktune-runner" "$out/test_agent"
cupti=$(ls /usr/local/cuda/lib/libcupti.so.13 /usr/local/cuda/lib64/libcupti.so.13 2>/dev/null | head -1 || true)
[ -n "$cupti" ] && cp -L "$cupti" "$out/"
golden=${KTUNE_GOLDEN_DIR:-$root/../shared/golden}
[ -f "$golden/kimi-tiny.safetensors" ] && cp "$golden/kimi-tiny.safetensors" "$out/golden/"
du -sh "$out"
