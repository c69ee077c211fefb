#!/usr/bin/env bash
# The main job: install what is missing, build the default preset, then regenerate the committed
# golden suite in memory and check that every file is byte-for-byte identical to golden/
# (`attnref generate --verify`, exit 1 on any difference), printing the summary table. It also
# builds and installs the Python package `attnref`.
# Extra arguments go to `attnref generate` (e.g. --case sdpa_basic, --threads 1).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake --preset default -DATTNREF_BUILD_TOOLS=ON
cmake --build build/default --target attnref_cli attnref_python
# The Python package into /usr/local (Debian's python3 reads /usr/local/lib/python3.X/dist-packages),
# so that `/usr/bin/python3 -c "import attnref"` works after this set-up.
sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
"${sudo_cmd[@]}" cmake --install build/default --component python --prefix /usr/local
exec build/default/verify/attnref generate --verify --suite golden/suite.json "$@"
