#!/usr/bin/env bash
# Where a megakernel build spills: compiles it with line info for each knob
# define set given (on top of ptxas_check.sh's defaults), disassembles it
# with nvdisasm, and counts the local-memory loads and stores (LDL/STL) per
# source line, most first. Needs nvdisasm (the device machine has it; this
# machine does not). Usage (device tool):
#   scripts/spill_lines.sh "KT_THREADS=512 KT_GEMV_CODE=2" ...   (logs in $OUT)
# An argument ending in .cubin is disassembled as it is: one built here with
# line info, so the device spends no time compiling:
#   CUBIN_OUT=.devcarry/t384.cubin NVCC_EXTRA=-lineinfo scripts/ptxas_check.sh KT_THREADS=384
set -uo pipefail
export PATH=/usr/local/cuda/bin:$PATH
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
for defs in "$@"; do
  tag=$(basename "$defs" | tr ' =' '__')
  cubin=$defs
  if [[ $defs != *.cubin ]]; then
    cubin=/tmp/spills.cubin
    # shellcheck disable=SC2086
    CUBIN_OUT=$cubin NVCC_EXTRA=-lineinfo "$(dirname "$0")/ptxas_check.sh" $defs >"$OUT/ptxas_$tag.txt" 2>&1
  else
    cuobjdump -res-usage "$cubin" >"$OUT/ptxas_$tag.txt" 2>&1
  fi
  nvdisasm --print-line-info "$cubin" >/tmp/spills.dis
  awk '
    # the innermost frame, and the innermost megakernel.cu frame when the line is in a header
    /\/\/## File/ {
      line = ""; rest = $0
      while (match(rest, /"[^"]*", line [0-9]+/)) {
        frame = substr(rest, RSTART, RLENGTH); rest = substr(rest, RSTART + RLENGTH)
        split(frame, a, "\""); f = a[2]; sub(/.*\//, "", f); sub(/.*line /, "", frame)
        if (line == "") line = f ":" frame
        else if (f == "megakernel.cu" && line !~ /megakernel.cu/) { line = line " < " f ":" frame; break }
      }
      next
    }
    /[^A-Z]STL[. ]/ { c[line " STL"]++ }
    /[^A-Z]LDL[. ]/ { c[line " LDL"]++ }
    END { for (k in c) print c[k], k }' /tmp/spills.dis | sort -rn >"$OUT/spills_$tag.txt"
  echo "== [$defs] $(grep -E 'registers|spill|REG:' "$OUT/ptxas_$tag.txt" | head -2 | tr -s ' ' | tr '\n' ' ')"
  head -30 "$OUT/spills_$tag.txt"
done
