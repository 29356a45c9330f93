#!/usr/bin/env bash
# Byte identity of two strata builds (a refactor's before and after): every fixture model,
# quantized with each given recipe by both binaries on the same device, must give byte-identical
# exports (every file but the run record strata_run.json). Prints one line per case and a
# summary; exit 1 on any difference.
#   tests/engine/identity_test.sh BEFORE_STRATA AFTER_STRATA DEVICE [RECIPE...]
# DEVICE: cpu or cuda. Default recipes: nvfp4-kv_fp8 fp8-kv_fp8.
set -uo pipefail
before=$1 after=$2 device=$3
shift 3
recipes=("$@")
[ ${#recipes[@]} -eq 0 ] && recipes=(nvfp4-kv_fp8 fp8-kv_fp8)
cd "$(dirname "$0")/../.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail=0 cases=0
for src in tests/fixtures/models/*/; do
  model=$(basename "$src")
  python3 tests/fixtures/tokens_jsonl.py "$src" > "$work/tokens.jsonl"
  count=$(wc -l < "$work/tokens.jsonl")
  for recipe in "${recipes[@]}"; do
    common=(quantize -q --model "$src" --recipe "$recipe" --calib_data "$work/tokens.jsonl"
            --calib_size "$count" --calib_min_tokens 1 --batch_size 2 --device "$device")
    [ "$device" = cuda ] && common+=(--max_gpu_memory_gb 1)
    rm -rf "$work/a" "$work/b" "$work/a.strata_resume" "$work/b.strata_resume"
    "$before" "${common[@]}" --export_path "$work/a" >"$work/a.log" 2>&1; ra=$?
    "$after" "${common[@]}" --export_path "$work/b" >"$work/b.log" 2>&1; rb=$?
    cases=$((cases + 1))
    if [ $ra -ne $rb ]; then
      echo "DIFF  $model $recipe: exit $ra before, $rb after"; tail -2 "$work/b.log"; fail=1; continue
    fi
    if [ $ra -ne 0 ]; then
      if diff <(tail -1 "$work/a.log") <(tail -1 "$work/b.log") >/dev/null; then
        echo "same  $model $recipe (both refused: $(tail -1 "$work/a.log" | cut -c1-100))"
      else
        echo "DIFF  $model $recipe: refused differently"; tail -1 "$work/a.log"; tail -1 "$work/b.log"; fail=1
      fi
      continue
    fi
    # strata_run.json records the run's identity, the strata version included: two builds of
    # different versions write different ones (and a build before it writes none).
    if diff -r -x strata_run.json "$work/a" "$work/b" >/dev/null; then
      echo "same  $model $recipe ($(ls "$work/a" | wc -l) files)"
    else
      echo "DIFF  $model $recipe:"; diff -rq -x strata_run.json "$work/a" "$work/b" | head -5; fail=1
    fi
  done
done
echo "identity ($device): $cases cases, $([ $fail -eq 0 ] && echo 'all byte-identical' || echo 'DIFFERENCES')"
exit $fail
