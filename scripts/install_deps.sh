#!/usr/bin/env bash
# Installs what strata needs to build and test, from Debian's packages. Idempotent: packages
# already present are skipped, so a machine that has them all needs no network.
# The CUDA toolkit is not a Debian package here; when nvcc is on PATH the CUDA backend builds too.
# The export tests run an independent checker written in Python with numpy (from PyPI).
# tests/cli/report_browser_test.sh opens `strata compare --report`'s page in a headless browser
# (Debian 12: chromium-headless-shell, from bookworm-security).
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libyaml-cpp-dev libpcre2-dev libopenblas-dev
  clang libclang-rt-dev clang-format
  python3
  libicu-dev
  libopenmpi-dev openmpi-bin
  chromium-headless-shell
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#packages[@]} packages present"
else
  echo "install_deps: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if ! python3 -c "import numpy" 2>/dev/null; then
  echo "install_deps: installing numpy for the test scripts"
  python3 -m pip install --quiet numpy || python3 -m pip install --quiet --break-system-packages numpy
fi
