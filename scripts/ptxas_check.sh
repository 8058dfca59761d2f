#!/usr/bin/env bash
# Compiles the CUDA megakernel for sm_90a at the full config with the given
# knob defines (on top of the defaults) and prints ptxas's registers, spills
# and shared memory: a quick check, without a GPU, that a knob setting fits.
# Usage: scripts/ptxas_check.sh [KT_NAME=value ...]   e.g. KT_PIPELINE=1 KT_THREADS=512
# With CUBIN_OUT=path the cubin is kept there (for cuobjdump -sass); NVCC_EXTRA adds nvcc flags.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
read -ra args <<< "$("$root/scripts/megakernel_defines.sh" "$@")"
out=$(mktemp -d)
trap '[ -n "${CUBIN_OUT:-}" ] && cp "$out/k.cubin" "$CUBIN_OUT"; rm -rf "$out"' EXIT
# shellcheck disable=SC2086
"$nvcc" -arch=sm_90a -O3 -cubin -std=c++17 ${NVCC_EXTRA:-} -I"$root" "${args[@]}" -Xptxas -v -o "$out/k.cubin" \
  -x cu "$root/kernels/kimi/cuda/megakernel.cu" 2>&1 | grep -E "Function properties|registers|spill|error" | grep -v "^ptxas info    : Compiling" || true
