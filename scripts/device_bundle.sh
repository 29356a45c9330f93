#!/usr/bin/env bash
# Builds strata for the GPU machine here and packs it into .xfer/bundle/ of the repository this
# script lives in (any worktree), so a `run` call can carry it instead of building there.
#
#   bash scripts/device_bundle.sh [-j N] [--mpi]
#
# --mpi: built with MPI (GPU ranks under mpirun, docs/SCALEOUT.md), libmpi linked dynamically:
# Open MPI's libraries (libmpi.so.40 and what it loads) come from the GPU machine, whose mpirun
# must be Open MPI 4.x or 5.x (the same libmpi.so.40 ABI). run.sh finds them beside its mpirun.
#
# The build: Release, CUDA on (sm_90), tests and benches on, with STRATA_STATIC_DEPS=ON (and no MPI: one GPU, one process) so
# yaml-cpp, PCRE2, ICU, OpenBLAS and the C++ runtime are linked from their static archives; the
# GPU machine (Ubuntu 24.04, CUDA 13 toolkit, no apt) lacks most of them. The build directory is
# build/bundle. The binaries still load glibc, libgomp and the CUDA runtime, which that machine
# has; the script checks `ldd` of every binary against that list and fails on anything else.
#
# Paths: the tests compile in the source and build directories as absolute paths. To make them
# valid on the GPU machine too, the build uses two fixed paths, /tmp/strata-bundle/src (a link
# to this repository) and /tmp/strata-bundle/build (a link to build/bundle); there, the
# bundle's run.sh points the same two paths at the carried checkout and at the unpacked build.
#
# What lands in .xfer/bundle/: payload.tar.xz (bin/strata, bin/make_synthetic, the tests, the
# CTest files, and CMake's GoogleTestAddTests.cmake that ctest needs to list the gtest cases),
# run.sh, and BUILD_INFO. The payload is one solid xz stream with a large window: the binaries
# share big identical blocks (ICU's data, OpenBLAS), which it stores once.
set -euo pipefail

jobs=2
mpi=OFF
while [ $# -gt 0 ]; do
  case "$1" in
    -j) jobs="$2"; shift 2 ;;
    -j*) jobs="${1#-j}"; shift ;;
    --mpi) mpi=ON; shift ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "device_bundle: unknown argument $1 (use -j N)" >&2; exit 2 ;;
  esac
done

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
fixed=/tmp/strata-bundle
build_real="$root/build/bundle"
bundle="$root/.xfer/bundle"
limit_mib=60

command -v nvcc >/dev/null || { echo "device_bundle: nvcc not on PATH (export PATH=/usr/local/cuda/bin:\$PATH)" >&2; exit 1; }

# One bundle build at a time on this machine: the fixed paths are shared by every worktree.
mkdir -p "$fixed"
exec 9>"$fixed.lock"
flock -n 9 || { echo "device_bundle: another bundle build holds $fixed.lock; wait for it" >&2; exit 1; }

mkdir -p "$build_real"
[ -L "$fixed/build" ] || rm -rf "$fixed/build"  # a bundle run.sh unpacked here
ln -sfn "$root" "$fixed/src"
ln -sfn "$build_real" "$fixed/build"

# .xfer/ must never be committed: ignore it locally if the repository does not already.
if git -C "$root" rev-parse --git-dir >/dev/null 2>&1 && ! git -C "$root" check-ignore -q .xfer/bundle; then
  echo "/.xfer/" >>"$(git -C "$root" rev-parse --git-common-dir)/info/exclude"
fi

# --mpi: only the libraries a binary uses are recorded (libmpi, not the C++ bindings' libmpi_cxx,
# which Open MPI 5 no longer ships).
mpi_flags=()
[ "$mpi" = ON ] && mpi_flags=(-DCMAKE_EXE_LINKER_FLAGS=-Wl,--as-needed)
echo "== configure ($root, build in $build_real)"
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
(cd "$fixed/src" && cmake -S "$fixed/src" -B "$fixed/build" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DSTRATA_TESTS=ON -DSTRATA_BENCH=ON -DSTRATA_STATIC_DEPS=ON -DSTRATA_MPI=$mpi "${mpi_flags[@]}" "${launcher[@]}" >"$build_real/configure.log") ||
  { tail -30 "$build_real/configure.log"; exit 1; }
grep -q "^CMAKE_HOME_DIRECTORY:INTERNAL=$fixed/src$" "$build_real/CMakeCache.txt" ||
  { echo "device_bundle: CMake resolved the source path; tests would carry this machine's paths" >&2; exit 1; }

echo "== build (-j$jobs)"
(cd "$fixed/build" && ninja -j"$jobs" >"$build_real/build.log" 2>&1) || { tail -40 "$build_real/build.log"; exit 1; }

# strata, make_synthetic (bench/gpu_bench.sh writes its checkpoint with it), expert_gemm_bench
# (GPU only), kda_bench (device_check.sh --parts kda) and every test binary; the other benches stay
# here (they run on the CPU and would double the payload).
mapfile -t exes < <(cd "$build_real" && { echo bin/strata; echo bin/make_synthetic; echo bin/expert_gemm_bench; echo bin/kda_bench; echo bin/read_bench;
  find tests -path '*/CMakeFiles' -prune -o -type f -perm -u+x -print | grep -v -E '\.(sh|py|cmake)$'; } | sort)
[ ${#exes[@]} -gt 0 ] || { echo "device_bundle: no executables built" >&2; exit 1; }

echo "== shared libraries (allowed: glibc, libgomp, CUDA runtime/cuBLAS, NCCL, MPI, libgcc_s and libstdc++ (NCCL brings them; Ubuntu 24.04 has newer ones))"
allowed='^(linux-vdso\.so|/lib64/ld-linux-x86-64\.so|ld-linux-x86-64\.so|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libgomp\.so|libcudart\.so|libcublas\.so|libcublasLt\.so|libnccl\.so|libmpi\.so|libmpi_cxx\.so|libgcc_s\.so|libstdc\+\+\.so)'
# With --mpi, Open MPI's libraries and theirs (hwloc, libevent, PMIx, ...).
[ "$mpi" = ON ] && allowed="${allowed%)}|libopen-rte\.so|libopen-pal\.so|libhwloc\.so|libevent.*\.so|libpmix\.so|libz\.so|libudev\.so|libltdl\.so|libfabric\.so|libucp\.so|libucs\.so|libucm\.so|libuct\.so|libibverbs\.so|librdmacm\.so|libnl-.*\.so|libcap\.so|libmunge\.so|libpsm.*\.so|libefa\.so|libatomic\.so|libnuma\.so|libgfortran\.so|libquadmath\.so|libcrypto\.so|libssl\.so)"
bad=0
declare -A seen=()
for e in "${exes[@]}"; do
  while read -r lib _; do
    [ -n "$lib" ] || continue
    seen[$lib]=1
    if ! [[ "$lib" =~ $allowed ]]; then
      echo "  $e needs $lib, which the GPU machine may lack" >&2
      bad=1
    fi
  done < <(ldd "$build_real/$e" | awk '{print $1}')
done
echo "  ${!seen[*]}"
[ "$bad" = 0 ] || { echo "device_bundle: a binary needs a library outside the list above" >&2; exit 1; }
[ -z "${seen[libmpi.so.40]:-}" ] || echo "  note: MPI is linked dynamically; the GPU machine has mpirun, check its libmpi"

echo "== pack"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
for e in "${exes[@]}"; do
  mkdir -p "$stage/$(dirname "$e")"
  strip --strip-debug -o "$stage/$e" "$build_real/$e"
done
# CTest's files, so `ctest --test-dir /tmp/strata-bundle/build` works there, and the module
# the gtest listing scripts include (its absolute path is recreated by run.sh).
(cd "$build_real" && find . -path ./CMakeFiles -prune -o \( -name 'CTestTestfile.cmake' -o -name '*_include.cmake' \
  -o -name '*_tests.cmake' \) -print | while read -r f; do mkdir -p "$stage/$(dirname "$f")"; cp "$f" "$stage/$f"; done)
gtest_module=$(grep -h -o '/[^"]*GoogleTestAddTests.cmake' -r "$build_real/tests" --include='*_include.cmake' | head -1 || true)
if [ -n "$gtest_module" ]; then
  mkdir -p "$stage/.cmake"
  cp "$gtest_module" "$stage/.cmake/GoogleTestAddTests.cmake"
  echo "$gtest_module" >"$stage/.cmake/GoogleTestAddTests.path"
fi
rm -rf "$bundle"
mkdir -p "$bundle"
# One solid stream with a 192 MiB window, so identical blocks across binaries (ICU's data,
# OpenBLAS) are stored once; preset 3's match finder is several times faster than the default's.
tar -C "$stage" -cf - . | xz -T1 --lzma2=preset=3,dict=192MiB >"$bundle/payload.tar.xz"
{
  echo "commit $(git -C "$root" rev-parse HEAD 2>/dev/null)$(git -C "$root" diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "mpi $mpi"
  echo "built $(date -u +%FT%TZ) on $(uname -n), $(g++ --version | head -1), $(nvcc --version | tail -1)"
  echo "source path $fixed/src, build path $fixed/build"
  echo "executables: ${exes[*]}"
} >"$bundle/BUILD_INFO"
cp "$root/scripts/device_bundle_run.sh" "$bundle/run.sh"
chmod +x "$bundle/run.sh"

size_mib=$(du -sm "$bundle" | cut -f1)
echo "== .xfer/bundle: ${size_mib} MiB ($(ls "$bundle" | tr '\n' ' '))"
if [ "$size_mib" -gt "$limit_mib" ]; then
  echo "device_bundle: the bundle is over ${limit_mib} MiB; the run tool carries 64 MiB with the tree" >&2
  exit 1
fi
cat <<EOF

On the GPU machine (the bundle unpacks to $fixed; tests see this checkout as their source):
  run  carry: [".xfer/bundle"]
       command: bash .xfer/bundle/run.sh 'strata --version && ctest --test-dir $fixed/build -j16 --output-on-failure'
run.sh unpacks, links $fixed/src to the checkout, puts $fixed/build/bin on PATH and the CUDA
libraries on LD_LIBRARY_PATH, then runs its argument with bash in the checkout (no argument: the
whole ctest suite). The GPU benchmark (docs/PERFORMANCE.md):
       command: bash .xfer/bundle/run.sh 'bash bench/gpu_bench.sh --bin $fixed/build/bin'
From a copy under .xfer/<name>/ (a helper's): carry [".xfer/<name>"] and call
STRATA_BUNDLE_SRC=\$PWD bash .xfer/<name>/.xfer/bundle/run.sh '...' from the checkout's root.
EOF
