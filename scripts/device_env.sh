# Sourced by the scripts that run on the device machine: where the carried
# binaries are (.devcarry, from scripts/device_pack.sh), where logs go
# ($OUT), and the environment ktune's GPU tests and benches read.
D=$PWD/.devcarry
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export KTUNE_GOLDEN_DIR=$D/golden KTUNE_SOURCE_DIR=$PWD KTUNE_RUNNER=$D/ktune-runner PATH=/usr/local/cuda/bin:$PATH
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
