#!/usr/bin/env bash
# The test command: installs what is missing, then builds and runs every test twice — an optimised
# GCC build (which also compiles the static tests with Clang 14 and builds a find_package consumer)
# and an AddressSanitizer + UndefinedBehaviorSanitizer build.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake --workflow --preset default
cmake --workflow --preset sanitize
