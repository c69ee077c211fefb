#!/usr/bin/env bash
# Installs the Debian 12 packages attnref needs, only those that are missing.
set -euo pipefail
packages=(g++ clang cmake ninja-build pkg-config libboost-dev libboost-test-dev libfmt-dev libmpfr-dev
          libmpfi-dev libgmp-dev nlohmann-json3-dev libcli11-dev libssl-dev libclang-rt-14-dev
          python3-numpy python3-matplotlib
          googletest libgtest-dev pybind11-dev python3-pybind11 python3-pytest python3-torch
          libopenblas-dev libopenblas0-pthread slurm-wlm python3-yaml python3-dev python3-mpmath
          python3-onnx nodejs)
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
# ONNX Runtime for the conformance adapters (tools/conform, docs/conformance.md), from the npm registry
# into tools/conform/node_modules. --ignore-scripts: its postinstall script reaches a host outside the
# registries; the CPU binaries ship inside the package. Offline, this step is skipped with one line and
# the conformance table runs without ONNX Runtime.
ort_version=1.30.0
conform_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/tools/conform"
if ! command -v npm >/dev/null; then
  echo "attnref: npm not found: the conformance table skips ONNX Runtime (Debian: apt-get install npm)"
elif [ ! -f "$conform_dir/node_modules/onnxruntime-node/package.json" ] ||
   ! grep -q "\"version\": \"$ort_version\"" "$conform_dir/node_modules/onnxruntime-node/package.json"; then
  if (cd "$conform_dir" && npm install --ignore-scripts --no-save --no-audit --no-fund \
        "onnxruntime-node@$ort_version" >/dev/null 2>&1); then
    echo "attnref: installed onnxruntime-node $ort_version into tools/conform/node_modules"
  else
    echo "attnref: onnxruntime-node not installed (npm registry unreachable?): the conformance table skips ONNX Runtime"
  fi
fi
