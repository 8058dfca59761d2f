#!/usr/bin/env bash
# Where a megakernel build spills: compiles it with line info for each knob
# define set given (on top of ptxas_check.sh's defaults), disassembles it
# with nvdisasm, and counts the local-memory loads and stores (LDL/STL) per
# source line, most first. Needs nvdisasm (the device machine has it; this
# machine does not). Usage (device tool):
#   scripts/spill_lines.sh "KT_THREADS=512 KT_GEMV_CODE=2" ...   (logs in $OUT)
set -uo pipefail
export PATH=/usr/local/cuda/bin:$PATH
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
for defs in "$@"; do
  tag=$(echo "$defs" | tr ' =' '__')
  # shellcheck disable=SC2086
  CUBIN_OUT=/tmp/spills.cubin NVCC_EXTRA=-lineinfo "$(dirname "$0")/ptxas_check.sh" $defs >"$OUT/ptxas_$tag.txt" 2>&1
  nvdisasm --print-line-info /tmp/spills.cubin >/tmp/spills.dis
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
  echo "== [$defs] $(grep -E 'registers|spill' "$OUT/ptxas_$tag.txt" | head -2 | tr -s ' ' | tr '\n' ' ')"
  head -30 "$OUT/spills_$tag.txt"
done
