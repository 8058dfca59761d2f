#!/usr/bin/env bash
# Set-up command 1: installs what is missing, builds ktune, and runs a
# default tuning session (on the GPU when there is one, else on the host
# backend) into ktune.sqlite. KTUNE_BUDGET sets its length (default 2m).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)"
./build/ktune run --budget "${KTUNE_BUDGET:-2m}" --db ktune.sqlite
