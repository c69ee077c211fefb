#!/usr/bin/env bash
# The main job: install what is missing, build the default preset, then regenerate the committed
# golden suite in memory and check that every file is byte-for-byte identical to golden/
# (`attnref generate --verify`, exit 1 on any difference), printing the summary table.
# Extra arguments go to `attnref generate` (e.g. --case sdpa_basic, --threads 1).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake --preset default -DATTNREF_BUILD_TOOLS=ON
cmake --build build/default --target attnref_cli
exec build/default/verify/attnref generate --verify --suite golden/suite.json "$@"
