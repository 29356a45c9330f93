#!/usr/bin/env bash
# `strata quantize` against the I/O floor on a synthetic checkpoint of several GiB, in one run:
# reading the checkpoint once (`cat` to /dev/null), a weight-only streaming conversion, a
# calibrated run, the same calibrated run with --max_cpu_memory_gb forcing the activation store to
# spill (its output must equal the in-memory run's), and a cap below the least a run needs
# (refused). Peak RSS (/usr/bin/time) is set beside strata's memory bound, flagged when above. Prints a
# table last; deletes the checkpoint at the end.
#   bench/quantize_bench.sh [BIN_DIR (build/rel/bin)] [GIB (3)]
# BIN_DIR holds strata and make_synthetic from an optimized build:
#   cmake -S . -B build/rel -G Ninja -DSTRATA_CUDA=OFF -DCMAKE_BUILD_TYPE=Release
#   cmake --build build/rel --target strata make_synthetic
# Page cache: no root is needed. Before every timed read the checkpoint's pages are evicted with
# `dd iflag=nocache count=0` (posix_fadvise DONTNEED) and `fincore` reports how much stayed
# resident, so "cold" is measured, not assumed; a warm `cat` is timed too.
set -euo pipefail
bin=${1:-build/rel/bin} gib=${2:-3}
work=$(mktemp -d "${TMPDIR:-/tmp}/strata_quantize_bench.XXXXXX")
trap 'rm -rf "$work"' EXIT
src=$work/ckpt
"$bin/make_synthetic" "$src" --gib "$gib"
bytes=$(cat "$src"/*.safetensors | wc -c)
sync

evict() {
  sync
  for f in "$src"/*.safetensors; do dd if="$f" iflag=nocache count=0 status=none; done
}
resident() {  # percent of the checkpoint's bytes in the page cache
  fincore -b -n -o RES "$src"/*.safetensors | awk -v t="$bytes" '{s += $1} END {printf "%.0f%%", 100 * s / t}'
}
timed() {  # name, command...: wall seconds and peak RSS (KiB) into $work/<name>.time
  local name=$1; shift
  /usr/bin/time -f "%e %M" -o "$work/$name.time" "$@"
}
wall() { cut -d' ' -f1 "$work/$1.time"; }
rss_mib() { awk '{printf "%.0f", $2 / 1024}' "$work/$1.time"; }
bound_mib() { sed -n 's/^peak RSS .*; bound \([0-9.]*\) MiB.*/\1/p' "$work/$1.log"; }
least_mib() { sed -n 's/^peak RSS .*; least \([0-9.]*\) MiB.*/\1/p' "$work/$1.log"; }
sums() { (cd "$1" && find . -type f | sort | xargs sha256sum); }

# Calibration: 16 sequences of 64 random token ids, 4 per micro-batch.
python3 - > "$work/calib.jsonl" <<'PY'
import json, random
r = random.Random(7)
for _ in range(16):
    print(json.dumps([r.randrange(32000) for _ in range(64)]))
PY
calib=(--calib_data "$work/calib.jsonl" --calib_size 16 --calib_seq 64 --calib_min_tokens 1
       --batch_size 4)

evict; cold_before=$(resident)
timed cat_cold sh -c "cat '$src'/*.safetensors > /dev/null"
timed cat_warm sh -c "cat '$src'/*.safetensors > /dev/null"

evict; wo_before=$(resident)
timed weight_only "$bin/strata" quantize --model "$src" --export_path "$work/out_wo" \
  --recipe w4a16_nvfp4-kv_none > "$work/weight_only.log" 2>&1
rm -rf "$work/out_wo"

evict; cal_before=$(resident)
timed calibrated "$bin/strata" quantize --model "$src" --export_path "$work/out_cal" \
  --recipe nvfp4-kv_fp8 "${calib[@]}" > "$work/calibrated.log" 2>&1
sums "$work/out_cal" > "$work/cal.sums"
rm -rf "$work/out_cal"

# A cap halfway between the least (store spilled) and the full bound: the store must spill.
cap=$(awk -v b="$(bound_mib calibrated)" -v l="$(least_mib calibrated)" 'BEGIN {printf "%.6f", (b + l) / 2 / 1024}')
evict; sp_before=$(resident)
timed spilled "$bin/strata" quantize --model "$src" --export_path "$work/out_sp" \
  --recipe nvfp4-kv_fp8 "${calib[@]}" --max_cpu_memory_gb "$cap" > "$work/spilled.log" 2>&1
grep -q "bound [0-9.]* MiB (activation store spilled)" "$work/spilled.log" || { cat "$work/spilled.log"; echo "FAIL: the capped run did not spill"; exit 1; }
spill_same=no
diff -q "$work/cal.sums" <(sums "$work/out_sp") > /dev/null && spill_same=yes
rm -rf "$work/out_sp"

low=$(awk -v l="$(least_mib calibrated)" 'BEGIN {printf "%.6f", (l - 1) / 1024}')
refused=no
if ! "$bin/strata" quantize --model "$src" --export_path "$work/out_low" --recipe nvfp4-kv_fp8 \
  "${calib[@]}" --max_cpu_memory_gb "$low" > /dev/null 2> "$work/low.err"; then
  # Up front (nothing written), or once the exporter exists (the baseline measured again; an
  # empty export and a resume folder at step 0 are left).
  grep -q "is below" "$work/low.err" && refused=yes
  [ "$refused" = yes ] && [ ! -e "$work/out_low" ] && refused="yes, up front"
fi

for r in weight_only calibrated spilled; do
  echo "== $r"; cat "$work/$r.log"
done
echo "== --max_cpu_memory_gb $low"; cat "$work/low.err"
echo
echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo);" \
  "checkpoint $(awk -v b="$bytes" 'BEGIN {printf "%.2f GiB", b / 1073741824}'),"\
  "$(sed -n 's/.*"num_hidden_layers":\([0-9]*\).*/\1/p' "$src/config.json") Llama layers, bf16"
echo "page cache before each timed read (resident share of the checkpoint): cat cold $cold_before," \
  "weight-only $wo_before, calibrated $cal_before, spilled $sp_before"
printf '%-34s %9s %9s %11s %11s\n' "run" "wall s" "x cat" "peak MiB" "bound MiB"
row() {  # label, name
  printf '%-34s %9.1f %9.1f %11s %11s\n' "$1" "$(wall "$2")" \
    "$(awk -v a="$(wall "$2")" -v c="$(wall cat_cold)" 'BEGIN {print a / c}')" \
    "$(rss_mib "$2")" "${3:-}"
}
row "cat to /dev/null, cold" cat_cold
row "cat to /dev/null, warm" cat_warm
row "quantize w4a16_nvfp4 (weight-only)" weight_only "$(bound_mib weight_only)"
row "quantize nvfp4-kv_fp8, 16x64 tok" calibrated "$(bound_mib calibrated)"
row "  same, --max_cpu_memory_gb $(printf '%.4f' "$cap")" spilled "$(bound_mib spilled)"
for r in weight_only calibrated spilled; do  # a peak above strata's own bound is a bug
  awk -v p="$(rss_mib "$r")" -v b="$(bound_mib "$r")" 'BEGIN { exit !(p > b) }' &&
    echo "FLAG: $r: peak RSS $(rss_mib "$r") MiB above its memory bound $(bound_mib "$r") MiB"
done
echo "spilled output identical to in-memory: $spill_same; --max_cpu_memory_gb $low (below least" \
  "$(least_mib calibrated) MiB) refused: $refused"
