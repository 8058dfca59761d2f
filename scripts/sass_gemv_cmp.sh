#!/usr/bin/env bash
# Compiles the megakernel for several knob define sets on this machine and
# dumps each build's SASS (cuobjdump), to compare the out-of-line GEMV loop
# (gemv_segment_shared) across builds. Usage (device tool):
#   scripts/sass_gemv_cmp.sh "DEFS_A" "DEFS_B" ...   e.g. "" "KT_KDA_START=1"
# With NVCC_EXTRA=-rdc=true the builds are linked by nvlink first, as the
# cuda backend builds variants.
set -uo pipefail
export PATH=/usr/local/cuda/bin:$PATH
mkdir -p "$OUT/sass"
i=0
for defs in "$@"; do
  # shellcheck disable=SC2086
  CUBIN_OUT=/tmp/k$i.cubin scripts/ptxas_check.sh $defs > "$OUT/sass/ptxas$i.txt" 2>&1
  case "${NVCC_EXTRA:-}" in
    *rdc*) nvlink -arch=sm_90a -o /tmp/k$i.linked.cubin /tmp/k$i.cubin && mv /tmp/k$i.linked.cubin /tmp/k$i.cubin ;;
  esac
  cuobjdump -sass /tmp/k$i.cubin > "$OUT/sass/k$i.sass"
  echo "$i [$defs]: $(grep -c 'HMMA' "$OUT/sass/k$i.sass") HMMA, $(wc -l < "$OUT/sass/k$i.sass") lines"
  i=$((i+1))
done
