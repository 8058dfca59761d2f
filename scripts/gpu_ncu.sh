#!/usr/bin/env bash
# One device-machine run: Nsight Compute on the megakernel's first launches
# under `ktune bench` (with --seeds 1 these are the validation steps, one per
# context in the order 2048, 8192, 16384). Writes to $OUT the sections'
# details, and the per-source-line and per-SASS-instruction stall samples
# (where inside the one launch the warps wait, and on what).
# Usage (device tool, with .devcarry carried):
#   scripts/gpu_ncu.sh [bench args: --knobs JSON]   (NCU_COUNT=3 launches;
#   NCU_TIMEOUT=480 seconds for the profiled run, less when it follows a bench in one call)
set -uo pipefail
. "$(dirname "$0")/device_env.sh"
export KTUNE_NO_CUPTI=1  # the profiler owns CUPTI (README)
rep=/tmp/mk
timeout "${NCU_TIMEOUT:-480}" ncu --target-processes all -k ktune_k0 -c "${NCU_COUNT:-3}" --import-source yes \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy \
  --section SchedulerStats --section WarpStateStats --section SourceCounters -f -o "$rep" \
  "$D/ktune" bench --backend cuda --size full --no-baseline --seeds 1 --samples 3 "$@" >"$OUT/ncu_run.log" 2>&1
echo "ncu exit $?"
grep -vE '"functions"' "$OUT/ncu_run.log" | tail -25
ls -la "$rep.ncu-rep"
ncu -i "$rep.ncu-rep" --page details --csv >"$OUT/details.csv" 2>&1 || echo "details failed"
ncu -i "$rep.ncu-rep" --page source --print-source cuda --csv 2>&1 | gzip >"$OUT/src_cuda.csv.gz"
ncu -i "$rep.ncu-rep" --page source --print-source sass --csv 2>&1 | gzip >"$OUT/src_sass.csv.gz"
ls -la "$OUT"
