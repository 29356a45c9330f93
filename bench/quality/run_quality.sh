#!/usr/bin/env bash
# The quality benchmark of docs/QUALITY.md: trains an MoE (or takes one), quantizes it with every
# recipe of bench/quality/recipes/, compares each export with the source (`strata compare`) and
# prints the table.
#
#   bash bench/quality/run_quality.sh --bin DIR (--data FILE.tar.xz|DIR | --model DIR) [--out DIR]
#        [--work DIR] [--seconds 150] [--preset full|toy] [--python python3] [--gpu auto|yes|no]
#        [--rows bf16,fp8,...] [--weights_only] [--calib_seqs N] [--eval_seqs N] [--budget S]
#        [--compare_device cpu|cuda]
#
# --bin DIR     the folder holding `strata` (the bundle's: /tmp/strata-bundle/build/bin)
# --data        make_tokens.py's quality_data.tar.xz (or its unpacked quality_data folder): the
#               model is trained on it (train_moe.py, --seconds, --preset), calibrated on its
#               calib.jsonl and compared on its heldout.jsonl
# --model DIR   compare this model instead of training one; without --data, calibration uses the
#               bundled corpus (strata's default) and compare its default data/calib/heldout
# --out DIR     logs, JSON, reports and the table (default $OUT when set, else out/quality)
# --work DIR    the model and the exports (large; default /tmp/strata-quality)
# --gpu         quantize on the GPU (`--device cuda`): auto = when nvidia-smi works; every
#               row, the searches included (docs/QUANTIZE.md "Scale search")
# --compare_device  where `strata compare` runs (default: compare's own default, the GPU when
#               there is one)
# --rows        the rows to run, in this order (default: all: bf16 nvfp4_max nvfp4_local_hessian
#               nvfp4_fp8_scale_sweep nvfp4_mse nvfp4_experts_only fp8; the table lists them in
#               its own order)
# --weights_only also compare every NVFP4 export with --no_act_sim (weights only), to show
#               the weights' share of the KL
# --calib_seqs N, --eval_seqs N: use only the first N sequences of calib.jsonl / heldout.jsonl
# --budget S    start no row (and no weights-only comparison) once S seconds have passed since
#               the start; the rows left out are named (default 0: no limit). The table is
#               rewritten after every row, so a run stopped from outside still leaves one.
#
# bf16 is the source against itself (KL 0, top-1 1: the sanity row). Every export is compared
# with `strata compare SRC EXPORT --json --report` (activations simulated; KV cache unquantized in
# every recipe). The table (table.py) goes to stdout and OUT/table.md; OUT/results.json has every
# number; OUT/report/<row>/ the report pages and their PNG plots; OUT/logs/ every log.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
root=$(cd "$here/../.." && pwd -P)
bin="" data="" model="" out="${OUT:-$root/out/quality}" work=/tmp/strata-quality
compare_dev=()
seconds=150 preset=full python=python3 gpu=auto weights_only=0 calib_seqs=0 eval_seqs=0 budget=0
rows="bf16,nvfp4_max,nvfp4_local_hessian,nvfp4_fp8_scale_sweep,nvfp4_mse,nvfp4_experts_only,fp8"
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin="$2"; shift 2 ;;
    --data) data="$2"; shift 2 ;;
    --model) model="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --work) work="$2"; shift 2 ;;
    --seconds) seconds="$2"; shift 2 ;;
    --preset) preset="$2"; shift 2 ;;
    --python) python="$2"; shift 2 ;;
    --gpu) gpu="$2"; shift 2 ;;
    --rows) rows="$2"; shift 2 ;;
    --weights_only) weights_only=1; shift ;;
    --calib_seqs) calib_seqs="$2"; shift 2 ;;
    --eval_seqs) eval_seqs="$2"; shift 2 ;;
    --budget) budget="$2"; shift 2 ;;
    --compare_device) compare_dev=(--device "$2"); shift 2 ;;
    -h|--help) sed -n '2,33p' "$0"; exit 0 ;;
    *) echo "run_quality: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
strata="$bin/strata"
[ -x "$strata" ] || { echo "run_quality: no strata in --bin '$bin' (give the folder holding it)" >&2; exit 2; }
[ -n "$data$model" ] || { echo "run_quality: give --data (to train) or --model" >&2; exit 2; }
case "$gpu" in
  auto) if nvidia-smi -L >/dev/null 2>&1; then gpu=yes; else gpu=no; fi ;;
  yes|no) ;;
  *) echo "run_quality: --gpu takes auto, yes or no" >&2; exit 2 ;;
esac
max_device=cpu
[ "$gpu" = yes ] && max_device=cuda

mkdir -p "$out/logs" "$out/json" "$out/report" "$work"
out=$(cd "$out" && pwd -P)
work=$(cd "$work" && pwd -P)
t_begin=$(date +%s.%N)
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
# True once --budget seconds have passed since the start.
over_budget() { [ "$budget" != 0 ] && awk -v e="$(since "$t_begin")" -v b="$budget" 'BEGIN { exit !(e >= b) }'; }
echo "== run_quality: $($strata --version 2>&1 | head -1); $(nproc) CPUs; max and mse/sweep rows on $max_device; out $out; work $work"

# Data: unpack the archive once.
calib_args=() eval_args=()
if [ -n "$data" ]; then
  if [ -f "$data" ]; then
    rm -rf "$work/quality_data"
    tar -C "$work" -xJf "$data"
    data="$work/quality_data"
  fi
  [ -f "$data/meta.json" ] || { echo "run_quality: $data is not make_tokens.py's quality_data" >&2; exit 2; }
  calib="$data/calib.jsonl" heldout="$data/heldout.jsonl"
  if [ "$calib_seqs" != 0 ]; then head -n "$calib_seqs" "$data/calib.jsonl" >"$work/calib.jsonl"; calib="$work/calib.jsonl"; fi
  if [ "$eval_seqs" != 0 ]; then head -n "$eval_seqs" "$data/heldout.jsonl" >"$work/heldout.jsonl"; heldout="$work/heldout.jsonl"; fi
  n_calib=$(grep -c . "$calib")
  calib_len=$(head -1 "$calib" | tr ',' '\n' | wc -l)
  calib_args=(--calib_data "$calib" --calib_size "$n_calib" --calib_seq "$calib_len")
  eval_args=(--tokens "$heldout")
fi

# The model: trained here unless given.
if [ -z "$model" ]; then
  model="$work/model"
  echo "== train ($preset, ${seconds} s) -> $model"
  t=$(date +%s.%N)
  "$python" "$here/train_moe.py" --data "$data" --out "$model" --seconds "$seconds" --preset "$preset" \
    2>&1 | tee "$out/logs/train.log"
  cp "$model/train_summary.json" "$out/json/train_summary.json"
  echo "train: $(since "$t") s" | tee -a "$out/logs/train.log"
fi
[ -f "$model/config.json" ] || { echo "run_quality: $model has no config.json" >&2; exit 2; }

# One row: quantize (unless bf16), compare, remember the times.
: >"$out/times.tsv"
run_row() {
  local row="$1" export="$work/export_$1" device=$max_device q_s=0 c_s log
  if [ "$row" = bf16 ]; then
    export="$model"
  else
    local recipe="$here/recipes/$row.yaml"
    [ -f "$recipe" ] || { echo "run_quality: unknown row '$row' (no $recipe)" >&2; exit 2; }
    log="$out/logs/$row.quantize.log"
    echo "== $row: quantize on $device"
    local t=$(date +%s.%N)
    rm -rf "$export"
    "$strata" quantize --model "$model" --export_path "$export" --recipe "$recipe" --device "$device" \
      "${calib_args[@]}" >"$log" 2>&1 || { tail -20 "$log"; echo "run_quality: $row: quantize failed ($log)" >&2; exit 1; }
    q_s=$(since "$t")
    echo "   $q_s s"
  fi
  echo "== $row: compare"
  local t=$(date +%s.%N)
  log="$out/logs/$row.compare.log"
  "$strata" compare "$model" "$export" "${eval_args[@]}" ${compare_dev[@]+"${compare_dev[@]}"} --json "$out/json/$row.json" \
    --report "$out/report/$row" >"$log" 2>&1 || { tail -20 "$log"; echo "run_quality: $row: compare failed ($log)" >&2; exit 1; }
  c_s=$(since "$t")
  grep -E "^  mean|^top-1|^perplexity" "$log" | sed 's/^/   /'
  echo "   $c_s s"
  if [ "$weights_only" = 1 ] && [[ "$row" == nvfp4* ]] && over_budget; then
    echo "   weights-only comparison skipped: --budget $budget s reached"
  elif [ "$weights_only" = 1 ] && [[ "$row" == nvfp4* ]]; then
    "$strata" compare "$model" "$export" "${eval_args[@]}" ${compare_dev[@]+"${compare_dev[@]}"} --no_act_sim --json "$out/json/$row.weights.json" \
      >"$out/logs/$row.weights.compare.log" 2>&1 || { tail -20 "$out/logs/$row.weights.compare.log"; exit 1; }
    grep -E "^  mean" "$out/logs/$row.weights.compare.log" | sed 's/^/   weights only: /'
  fi
  printf '%s\t%s\t%s\t%s\n' "$row" "$device" "$q_s" "$c_s" >>"$out/times.tsv"
}

IFS=, read -r -a row_list <<<"$rows"
skipped=()
for row in "${row_list[@]}"; do
  if over_budget; then skipped+=("$row"); continue; fi
  run_row "$row"
  "$python" "$here/table.py" "$out" >"$out/table.md"
done

echo "== table ($(since "$t_begin") s in all)"
[ ${#skipped[@]} = 0 ] || echo "rows not run (--budget $budget s reached): ${skipped[*]}" | tee "$out/skipped.txt"
cat "$out/table.md"
