#!/usr/bin/env bash
# Set-up command 2: installs what is missing, builds ktune and its tests,
# and runs the whole test suite (GPU tests report SKIPPED without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)"
cd build
ctest --output-on-failure --timeout 3000
