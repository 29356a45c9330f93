#!/usr/bin/env bash
# The GPU-machine side of scripts/device_bundle.sh, copied into .xfer/bundle/run.sh.
#
#   bash .xfer/bundle/run.sh ['commands']
#
# Unpacks payload.tar.xz to /tmp/strata-bundle/build, links /tmp/strata-bundle/src to the
# checkout this bundle was carried into (two folders above it, or $STRATA_BUNDLE_SRC), puts the
# binaries on PATH and the CUDA libraries on LD_LIBRARY_PATH, and runs the commands with bash in
# the checkout's root. Without commands: the whole ctest suite.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
checkout=$(cd "${STRATA_BUNDLE_SRC:-$here/../..}" && pwd -P)  # the tests' source tree
fixed=/tmp/strata-bundle

# Unpacked once per bundle: another bundle unpacked earlier on the same machine is replaced.
if ! cmp -s "$here/BUILD_INFO" "$fixed/build/.BUILD_INFO"; then
  rm -rf "$fixed/build"
  mkdir -p "$fixed/build"
  if command -v xz >/dev/null; then
    xz -dc "$here/payload.tar.xz" | tar -C "$fixed/build" -xf -
  else
    python3 -c 'import lzma,sys,shutil; shutil.copyfileobj(lzma.open(sys.argv[1]), sys.stdout.buffer)' \
      "$here/payload.tar.xz" | tar -C "$fixed/build" -xf -
  fi
  cp "$here/BUILD_INFO" "$fixed/build/.BUILD_INFO"
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

# The CUDA runtime (and cuBLAS, NCCL) come from that machine: the toolkit's library folders
# first, then the ones PyTorch's wheels carry, for whatever `ldd` (or the cuBLAS probe) still
# cannot find.
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda/lib; do
  [ -d "$d" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
done
# A bundle built with --mpi loads libmpi.so.40 from that machine: the library folder of the Open MPI
# its mpirun belongs to, unless the loader already finds it.
if ldd "$fixed/build/bin/strata" | grep -q "libmpi.*not found" && command -v mpirun >/dev/null; then
  prefix=$(dirname "$(dirname "$(readlink -f "$(command -v mpirun)")")")
  for d in "$prefix/lib" "$prefix/lib64" "$prefix/lib/x86_64-linux-gnu"; do
    [ -e "$d/libmpi.so.40" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
  done
fi
# cuBLAS is loaded at its first use (ops/cuda/gemm.cu), so ldd does not list it: looked for too.
cublas_found() {
  ldconfig -p 2>/dev/null | grep -q "libcublas\.so\." && return 0
  local d IFS=:
  for d in ${LD_LIBRARY_PATH:-}; do compgen -G "$d/libcublas.so.*" >/dev/null && return 0; done
  return 1
}
if ldd "$fixed/build/bin/strata" | grep -q "not found" || ! cublas_found; then
  for d in $(python3 -c 'import nvidia, os; [print(os.path.join(p, s, "lib")) for p in nvidia.__path__ for s in os.listdir(p)]' 2>/dev/null); do
    [ -d "$d" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
  done
  missing=$(ldd "$fixed/build/bin/strata" | grep "not found" || true)
  [ -z "$missing" ] || echo "strata bundle: still missing: $missing" >&2
fi
export PATH="$fixed/build/bin:$PATH"
echo "strata bundle: $(head -1 "$here/BUILD_INFO"); source $fixed/src -> $checkout" >&2
cd "$checkout"
if [ $# -eq 0 ]; then
  exec ctest --test-dir "$fixed/build" --output-on-failure -j8
fi
exec bash -c "$*"
