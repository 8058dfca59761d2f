#!/usr/bin/env bash
# Compiles the CUDA megakernel for sm_90a at the full config with the given
# knob defines (on top of the defaults) and prints ptxas's registers, spills
# and shared memory: a quick check, without a GPU, that a knob setting fits.
# Usage: scripts/ptxas_check.sh [KT_NAME=value ...]   e.g. KT_PIPELINE=1 KT_THREADS=512
# With CUBIN_OUT=path the cubin is kept there (for cuobjdump -sass); NVCC_EXTRA adds nvcc flags.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
declare -A d=(
  [KT_D]=2304 [KT_KH]=32 [KT_KD]=128 [KT_MH]=32 [KT_R]=512 [KT_NOPE]=128 [KT_ROPE]=64 [KT_VH]=128
  [KT_E]=64 [KT_TOPK]=8 [KT_NSH]=1 [KT_I]=1024 [KT_G]=128 [KT_LAYERS]=4 [KT_PATTERN_M]=8
  [KT_ROPE_THETA]=10000.0 [KT_SCALING]=2.446 [KT_EPS]=1e-06
  [KT_THREADS]=256 [KT_BLOCKS_PER_SM]=1 [KT_BARRIER]=2 [KT_DEQUANT]=1 [KT_UNROLL]=2 [KT_LOAD_HINT]=1
  [KT_PREFETCH]=0 [KT_ATTN_HEADS]=16 [KT_ATTN]=1 [KT_WAVES]=1 [KT_STAGES]=12 [KT_EARLY]=1 [KT_PIPELINE]=1
  [KT_SCALES]=2 [KT_PROFILE]=0 [KT_SCHED]=0 [KT_LEAD]=1 [KT_ATTN_ROWS]=32 [KT_ATTN_DEPTH]=0 [KT_NUMBERING]=0 [KT_GEMV_CODE]=1 [KT_SPLIT_COST]=1 [KT_CACHE_HINT]=1 [KT_HANDOFF]=1 [KT_KDA_START]=0 [KT_REDUCE]=0 [KT_MOE_REDUCE]=1 [KT_LAUNCH_PREFETCH]=1 [KT_LOGITS]=1 [KT_GATHER]=1 [KT_PREDICT]=0 [KT_PREDICT_STREAM]=0 [KT_FEED]=4)
for kv in "$@"; do d[${kv%%=*}]=${kv#*=}; done
args=()
for k in "${!d[@]}"; do args+=("-D$k=${d[$k]}"); done
out=$(mktemp -d)
trap '[ -n "${CUBIN_OUT:-}" ] && cp "$out/k.cubin" "$CUBIN_OUT"; rm -rf "$out"' EXIT
# shellcheck disable=SC2086
"$nvcc" -arch=sm_90a -O3 -cubin -std=c++17 ${NVCC_EXTRA:-} -I"$root" "${args[@]}" -Xptxas -v -o "$out/k.cubin" \
  -x cu "$root/kernels/kimi/cuda/megakernel.cu" 2>&1 | grep -E "Function properties|registers|spill|error" | grep -v "^ptxas info    : Compiling" || true
