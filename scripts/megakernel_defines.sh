#!/usr/bin/env bash
# Prints the nvcc -D flags that compile the CUDA megakernel at the full-size
# config with the knobs' defaults (as the renderer would prepend them),
# overridden by KT_NAME=value arguments. For compiling the megakernel, or a
# study that includes it, outside the renderer: scripts/ptxas_check.sh and
# kernels/kimi/cuda/dev/consumer_rate.cu use it.
# Usage: scripts/megakernel_defines.sh [KT_NAME=value ...]
set -euo pipefail
declare -A d=(
  [KT_D]=2304 [KT_KH]=32 [KT_KD]=128 [KT_MH]=32 [KT_R]=512 [KT_NOPE]=128 [KT_ROPE]=64 [KT_VH]=128
  [KT_E]=64 [KT_TOPK]=8 [KT_NSH]=1 [KT_I]=1024 [KT_G]=128 [KT_LAYERS]=4 [KT_PATTERN_M]=8
  [KT_ROPE_THETA]=10000.0 [KT_SCALING]=2.446 [KT_EPS]=1e-06
  [KT_THREADS]=256 [KT_BLOCKS_PER_SM]=1 [KT_BARRIER]=2 [KT_DEQUANT]=1 [KT_UNROLL]=2 [KT_LOAD_HINT]=1
  [KT_PREFETCH]=0 [KT_ATTN_HEADS]=16 [KT_ATTN]=1 [KT_WAVES]=1 [KT_STAGES]=12 [KT_EARLY]=1 [KT_PIPELINE]=1
  [KT_SCALES]=2 [KT_PROFILE]=0 [KT_SCHED]=0 [KT_LEAD]=1 [KT_ATTN_ROWS]=32 [KT_ATTN_DEPTH]=0 [KT_NUMBERING]=3 [KT_GEMV_CODE]=1 [KT_SPLIT_COST]=1 [KT_CACHE_HINT]=1 [KT_HANDOFF]=1 [KT_KDA_START]=0 [KT_DOWN_START]=0 [KT_REDUCE]=0 [KT_MOE_REDUCE]=1 [KT_LAUNCH_PREFETCH]=1 [KT_LOGITS]=1 [KT_GATHER]=1 [KT_PREDICT]=0 [KT_PREDICT_STREAM]=0 [KT_FEED]=4 [KT_FEED_Q]=2 [KT_INFLIGHT]=0 [KT_HOLD]=2 [KT_ATTN_CHAINS]=1 [KT_FLOW]=0 [KT_ATTN_EARLY]=0 [KT_ATTN_ROLLED]=0 [KT_ATTN_PARTS]=1 [KT_ATTN_FEED]=1 [KT_ATTN_FIRST]=0 [KT_HELPERS]=0 [KT_HOLD_RELEASE]=0 [KT_HOLD_SCOPE]=0 [KT_REPACK_ORDER]=0 [KT_LIGHT_WARPS]=0 [KT_LOADER_REGS]=88)
for kv in "$@"; do d[${kv%%=*}]=${kv#*=}; done
for k in "${!d[@]}"; do printf -- '-D%s=%s ' "$k" "${d[$k]}"; done
echo
