#!/usr/bin/env bash
# Builds the libFuzzer targets for a machine without clang or the -dev libraries (the GPU
# machine, whose 16 cores run the campaign of scripts/fuzz_campaign.sh) and packs them into
# .xfer/fuzz/targets.tar.xz:
#   bash scripts/fuzz_bundle.sh [-j N]
# The `fuzz` preset's flags (clang, ASan + UBSan, coverage) with STRATA_STATIC_DEPS=ON (yaml-cpp,
# PCRE2, ICU and the C++ runtime from their static archives, as scripts/device_bundle.sh does), in
# build/fuzz-static; the binaries are stripped (a finding is replayed here from its input) and
# must load nothing but glibc. There:
#   mkdir -p /tmp/fz && tar -C /tmp/fz -xJf .xfer/fuzz/targets.tar.xz
#   STRATA_FUZZ_BIN=/tmp/fz/bin STRATA_FUZZ_CONCURRENT=1 scripts/fuzz_campaign.sh 3600 4 ...
set -euo pipefail
jobs=2
while [ $# -gt 0 ]; do
  case "$1" in
    -j) jobs="$2"; shift 2 ;;
    -j*) jobs="${1#-j}"; shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "fuzz_bundle: unknown argument $1 (use -j N)" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/.."
build=build/fuzz-static
out=.xfer/fuzz
targets=(safetensors_fuzz index_fuzz tokenizer_json_fuzz tiktoken_fuzz recipe_fuzz resume_fuzz)
cmake --preset fuzz -B "$build" -DSTRATA_STATIC_DEPS=ON >"$build.configure.log" 2>&1 ||
  { tail -20 "$build.configure.log"; exit 1; }
cmake --build "$build" -j "$jobs" --target "${targets[@]}" >"$build.build.log" 2>&1 ||
  { tail -40 "$build.build.log"; exit 1; }
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$out"
for t in "${targets[@]}"; do
  strip -o "$stage/bin/$t" "$build/fuzz/$t"
  extra=$(ldd "$stage/bin/$t" | awk '{print $1}' | grep -vE '^(linux-vdso\.so|libc\.so|libm\.so|/lib64/ld-linux)' || true)
  [ -z "$extra" ] || { echo "fuzz_bundle: $t loads $extra (only glibc may stay dynamic)" >&2; exit 1; }
done
git rev-parse --short HEAD >"$stage/bin/COMMIT"
tar -C "$stage" -cf - bin | xz -9e -T"$jobs" >"$out/targets.tar.xz"
echo "fuzz_bundle: $out/targets.tar.xz ($(du -h "$out/targets.tar.xz" | cut -f1), at $(cat "$stage/bin/COMMIT"))"
