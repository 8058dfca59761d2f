#!/usr/bin/env bash
# Installs the Debian packages ktune needs that are missing, and nothing
# else. The CUDA toolkit (nvcc, CUPTI) is optional: without it ktune builds
# the host backend only and the GPU tests report SKIPPED.
set -euo pipefail
packages=(g++ cmake make pkg-config sqlite3 libsqlite3-dev libcurl4-openssl-dev nlohmann-json3-dev libcli11-dev
          doctest-dev python3 python3-numpy python3-torch)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
sudo=""
[ "$(id -u)" -ne 0 ] && sudo=sudo
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if ! command -v nvcc >/dev/null 2>&1 && [ ! -x /usr/local/cuda/bin/nvcc ]; then
  # Debian ships the toolkit in non-free; try it, carry on without it.
  if ! DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq nvidia-cuda-toolkit >/dev/null 2>&1; then
    echo "note: no CUDA toolkit (nvcc); building the host backend only"
  fi
fi
