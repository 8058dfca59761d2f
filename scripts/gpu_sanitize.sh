#!/usr/bin/env bash
# One device-machine run: a megakernel knob point validated under
# compute-sanitizer (memcheck by default), with the runner as a target: the
# first error's kind, kernel, source line and SASS offset (the build has
# -lineinfo), then the SASS of the build around it. For a point that fails
# with a device fault, to tell an out-of-bounds access from a trap or a
# hardware exception.
# Usage (device tool, with .devcarry carried):
#   scripts/gpu_sanitize.sh --knobs JSON [more bench args, e.g. --contexts 61]
#   SANITIZER_TOOL=racecheck|synccheck|initcheck picks another tool; SANITIZE_TIMEOUT seconds (300).
set -uo pipefail
. "$(dirname "$0")/device_env.sh"
export KTUNE_NO_CUPTI=1  # the sanitizer owns the injection, and its settings reach the runner (README)
# A build cache of its own, so the cubins in it are this run's.
export KTUNE_CACHE_DIR=/tmp/ktune-sanitize-cache
rm -rf "$KTUNE_CACHE_DIR"
tool=${SANITIZER_TOOL:-memcheck}
timeout "${SANITIZE_TIMEOUT:-300}" compute-sanitizer --tool "$tool" --target-processes all --print-limit "${SANITIZE_PRINT:-200}" \
  --show-backtrace device --log-file "$OUT/sanitizer.%p.log" \
  "$D/ktune" bench --backend cuda --size full --no-baseline --validate-only --seeds 1 "$@" >"$OUT/sanitize_run.log" 2>&1
echo "sanitized run exit $?"
grep -vE '"functions"' "$OUT/sanitize_run.log" | tail -12
for log in "$OUT"/sanitizer.*.log; do
  [ -s "$log" ] || continue
  echo "== $log: the first report, then every report's kind, place and block"
  sed -n '/^========= [A-Z]/,/^========= $/p' "$log" | head -12
  awk '/^========= [A-Z]/ && !/COMPUTE-SANITIZER|ERROR SUMMARY|Target application/ {kind = substr($0, 11)}
       /^=========     at / && kind != "" {at = (match($0, /\+0x[0-9a-f]+/) ? substr($0, RSTART, RLENGTH) : "?") " " $NF}
       /by thread/ && kind != "" {print kind " | " at " | " $NF; kind = ""}' "$log" | sort | uniq -c | sort -rn | head -20
  grep 'ERROR SUMMARY' "$log"
done
# The SASS of the run's builds, and around the first reported offset.
offset=$(grep -ohE '^=========     at .*\+0x[0-9a-f]+' "$OUT"/sanitizer.*.log 2>/dev/null | head -1 | sed 's/.*+0x//')
find "$KTUNE_CACHE_DIR" -name 'variant.cubin' | while read -r cubin; do
  name=$(basename "$(dirname "$cubin")")
  cuobjdump -sass "$cubin" >"/tmp/sass_$name.txt"
  gzip -c "/tmp/sass_$name.txt" >"$OUT/sass_$name.txt.gz" && echo "SASS of $cubin -> sass_$name.txt.gz"
  if [ -n "$offset" ]; then
    echo "== around offset 0x$offset"
    grep -n -B40 -A8 "/\*0*$offset\*/" "/tmp/sass_$name.txt" | cut -c1-150
  fi
done
