#!/usr/bin/env bash
# Installs what is needed, builds strata, and runs it on the bundled demo checkpoint.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
cmake --preset default >/dev/null
cmake --build --preset default -j "$(nproc)"
build/default/bin/strata inspect demo/tiny-llama
