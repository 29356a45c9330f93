#!/usr/bin/env bash
# The GPU-machine side of scripts/device_bundle.sh, copied into .xfer/bundle/run.sh.
#
#   bash .xfer/bundle/run.sh ['commands']
#
# Unpacks payload.tar.xz to /tmp/strata-bundle/build, links /tmp/strata-bundle/src to the
# checkout this bundle was carried into (two folders above it), puts the binaries on PATH, and
# runs the commands with bash in the checkout's root. Without commands: the whole ctest suite.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
checkout=$(cd "$here/../.." && pwd -P)
fixed=/tmp/strata-bundle

if [ ! -x "$fixed/build/bin/strata" ]; then
  rm -rf "$fixed/build"
  mkdir -p "$fixed/build"
  if command -v xz >/dev/null; then
    xz -dc "$here/payload.tar.xz" | tar -C "$fixed/build" -xf -
  else
    python3 -c 'import lzma,sys,shutil; shutil.copyfileobj(lzma.open(sys.argv[1]), sys.stdout.buffer)' \
      "$here/payload.tar.xz" | tar -C "$fixed/build" -xf -
  fi
fi
ln -sfn "$checkout" "$fixed/src"

# ctest's gtest listing includes CMake's GoogleTestAddTests.cmake by the
# build machine's absolute path; put the carried copy there when this machine lacks it.
if [ -f "$fixed/build/.cmake/GoogleTestAddTests.path" ]; then
  module=$(cat "$fixed/build/.cmake/GoogleTestAddTests.path")
  if [ ! -f "$module" ]; then
    mkdir -p "$(dirname "$module")"
    cp "$fixed/build/.cmake/GoogleTestAddTests.cmake" "$module"
  fi
fi

export PATH="$fixed/build/bin:$PATH"
echo "strata bundle: $(head -1 "$here/BUILD_INFO"); source $fixed/src -> $checkout" >&2
cd "$checkout"
if [ $# -eq 0 ]; then
  exec ctest --test-dir "$fixed/build" --output-on-failure -j8
fi
exec bash -c "$*"
