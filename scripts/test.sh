#!/usr/bin/env bash
# Builds strata and runs the whole test suite: the release build (with the CUDA backend compiled
# when nvcc is present; GPU tests are labelled `gpu` and run only on a GPU machine), then the
# CPU tests again under AddressSanitizer and UndefinedBehaviorSanitizer, less those labelled
# `release_only` (tests/CMakeLists.txt says which and why), then a short run of the fuzz targets.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh

jobs=$(nproc)
echo "== release build =="
# The `ci` preset (CMakePresets.json): the default preset's release build with one CUDA
# architecture (the suite runs no GPU code; the default preset, for real builds, compiles sm_90
# and sm_100), without benches and GPU test binaries (the CUDA libraries they test still compile,
# into strata), without debug info (-g changes no generated code, and costs a third of the
# compile), with the test binaries' own sources at -O0 (the libraries under test keep -O2), and
# as a unity build: batches of 16 C++ sources compiled as one, which halves the compile (each
# batch parses the standard and test headers once). CUDA sources compile one by one. The default
# preset builds file by file, so a source that compiles only beside its batch fails there.
cmake --preset ci -DCMAKE_CUDA_ARCHITECTURES="${STRATA_TEST_CUDA_ARCHS:-90}" >/dev/null
cmake --build --preset ci -j "$jobs"
ctest --preset ci -j "$jobs"

echo "== ASan + UBSan build =="
# The `asan` preset: clang at -O0 with line tables only (-g1: file and line in every report, at
# half the compile time of gcc with -g), CPU only, in unity batches as above, and with the libFuzzer
# targets, whose libraries carry coverage instrumentation beside the sanitizers; one build serves
# the tests and the fuzz run.
cmake --preset asan >/dev/null
cmake --build --preset asan -j "$jobs"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --preset asan -j "$jobs"

echo "== short fuzz run =="
# The libFuzzer targets (fuzz/, docs/FUZZING.md) from the build above, run for a few seconds each
# from their seed corpora alone: a smoke test that the targets build, start and find nothing
# quickly. Their seeds and committed findings are also replayed by the ctest runs above
# (FuzzReplay, FuzzRegressions); the long campaign is scripts/fuzz_campaign.sh.
rm -rf build/asan/corpus-work
STRATA_FUZZ_PRESET=asan STRATA_FUZZ_WORK=build/asan/corpus-work STRATA_FUZZ_JOBS="$jobs" \
  scripts/fuzz.sh "${STRATA_TEST_FUZZ_SECONDS:-3}"
