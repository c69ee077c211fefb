#!/usr/bin/env bash
# The main job: install what is missing, build the default preset, install the build into
# /usr/local, then regenerate the committed golden suite in memory and check that every file is
# byte-for-byte identical to golden/ (`attnref generate --verify`, exit 1 on any difference),
# printing the summary table.
# Extra arguments go to `attnref generate` (e.g. --case sdpa_basic, --threads 1).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake --preset default -DATTNREF_BUILD_TOOLS=ON
cmake --build build/default --target attnref_cli attnref_python
# Everything into /usr/local, so that after this set-up, from any directory: `attnref` is on PATH
# (/usr/local/bin), the command and the Python package find the suite in
# /usr/local/share/attnref/golden, `/usr/bin/python3 -c "import attnref"` works (Debian's python3
# reads /usr/local/lib/python3.X/dist-packages), and find_package(attnref) finds the headers.
sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
"${sudo_cmd[@]}" cmake --install build/default --prefix /usr/local
exec build/default/verify/attnref generate --verify --suite golden/suite.json "$@"
