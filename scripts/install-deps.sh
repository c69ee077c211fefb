#!/usr/bin/env bash
# Installs the Debian 12 packages attnref needs, only those that are missing.
set -euo pipefail
packages=(g++ clang cmake ninja-build pkg-config libboost-dev libboost-test-dev libfmt-dev libmpfr-dev
          libmpfi-dev libgmp-dev nlohmann-json3-dev libcli11-dev libssl-dev libclang-rt-14-dev
          python3-numpy python3-matplotlib
          googletest libgtest-dev pybind11-dev python3-pybind11 python3-pytest python3-torch
          libopenblas-dev libopenblas0-pthread slurm-wlm python3-yaml python3-dev python3-mpmath)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "attnref: installing missing Debian packages: ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
