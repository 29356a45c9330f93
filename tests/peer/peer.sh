#!/usr/bin/env bash
# ModelOpt 0.47 as a peer (issue 19): quantize the fixtures with ModelOpt itself and with strata on
# the same calibration tokens, and compare the exports tensor by tensor (tests/peer/modelopt_peer.py
# says how). One verdict line per family and recipe, "PEER <family> <recipe>: PASS|FAIL ...".
# Needs a CUDA machine with torch and transformers (the H200: torch 2.11, transformers 5.17) and
# the wheels nvidia-modelopt 0.47.0 needs beside them, in WHEELS (default .whl/; fetched on the
# development machine with tests/peer/fetch_wheels.sh); they are installed with --no-deps into a
# folder on PYTHONPATH, nothing system-wide.
#   tests/peer/peer.sh STRATA [WHEELS] [FAMILY...]
# WHEELS "-": use the nvidia-modelopt that python3 already imports (a virtual environment), install
# nothing.
# Environment: PEER_RECIPES (space-separated strata recipe names, default below), STRATA_FLAGS
# (extra flags for strata quantize, e.g. "--device cpu"), PEER_OUT (keep the exports there),
# PEER_SCALE_TOL (relative tolerance of input/KV scales, default 0.02), PEER_COMPARE_FLAGS (extra
# flags for modelopt_peer.py compare, e.g. "--ulp 1" when ModelOpt runs on a CPU), PEER_JOBS (families
# run at once, default 1: each family's lines are printed together when it ends, in the given order).
set -uo pipefail
strata=$(realpath "$1")
wheels=${2:-.whl}
[ "$wheels" = - ] || wheels=$(realpath "$wheels")
shift $(( $# >= 2 ? 2 : 1 ))
families=("$@")
[ ${#families[@]} -gt 0 ] || families=(llama qwen3 qwen3_moe deepseek_v3 kimi_linear glm4_moe minimax_m2
                                        mixtral qwen3_next qwen3_5_moe deepseek_v32 gpt_oss
                                        kimi_k25_int4)
recipes=(${PEER_RECIPES:-nvfp4-kv_fp8_cast fp8-kv_fp8_cast nvfp4_experts_only-kv_fp8_cast nvfp4-kv_fp8
         general/ptq/nvfp4_omlp_only-kv_fp8_cast
         general/ptq/nvfp4_experts_only_input_scale1-kv_fp8_cast
         general/ptq/nvfp4_default-kv_nvfp4_cast general/ptq/nvfp4_mlp_only-novit-kv_fp8
         general/ptq/mxfp4_mlp_weight_only general/ptq/nvfp4_mlp_weight_only
         general/ptq/nvfp4_act_headroom-kv_fp8_cast
         models/moonshotai/Kimi-K3/ptq/nvfp4_experts-fp8_pb_attention
         nvfp4-kv_fp8_affine nvfp4-kv_nvfp4_affine})
work=${PEER_OUT:-$(mktemp -d)}
mkdir -p "$work"
here=$(dirname "$(realpath "$0")")
. "$here/modelopt_env.sh"
modelopt_env python3 "$wheels" "$work/site" 2>&1 || { echo "PEER setup: FAIL: modelopt is not importable"; exit 1; }
if [ "${PEER_JOBS:-1}" -gt 1 ] && [ ${#families[@]} -gt 1 ]; then
  # One child per family, each with the wheels installed above (WHEELS "-", PYTHONPATH kept).
  for family in "${families[@]}"; do
    PEER_JOBS=1 PEER_OUT="$work" bash "$0" "$strata" - "$family" > "$work/$family.peer.log" 2>&1 &
    while [ "$(jobs -rp | wc -l)" -ge "$PEER_JOBS" ]; do wait -n; done
  done
  wait
  fails=0
  for family in "${families[@]}"; do
    grep -v '^PEER done' "$work/$family.peer.log" | grep -v '^modelopt '
    n=$(sed -n 's/^PEER done: \([0-9]*\) failing.*/\1/p' "$work/$family.peer.log")
    fails=$((fails + ${n:-1}))
  done
  echo "PEER done: $fails failing cases; exports under $work"
  [ "$fails" -eq 0 ]
  exit
fi
fails=0
for family in "${families[@]}"; do
  src=tests/fixtures/models/$family
  [ -d "$src" ] || { echo "PEER $family: SKIP (no fixture $src)"; continue; }
  tokens="$work/$family.tokens.jsonl"
  python3 tests/fixtures/tokens_jsonl.py "$src" > "$tokens"
  count=$(wc -l < "$tokens")
  for recipe in "${recipes[@]}"; do
    tag=${recipe//\//.}
    so="$work/$family.$tag.strata" mo="$work/$family.$tag.modelopt"
    rm -rf "$so" "$mo"
    if ! "$strata" quantize -q --model "$src" --recipe "$recipe" --calib_data "$tokens" \
           --calib_size "$count" --calib_min_tokens 1 --export_path "$so" ${STRATA_FLAGS:-} \
           > "$so.log" 2>&1; then
      echo "PEER $family $recipe: SKIP (strata refused: $(tail -1 "$so.log"))"
      continue
    fi
    if ! python3 "$here/modelopt_peer.py" export "$src" "$tokens" "$recipe" "$mo" > "$mo.log" 2>&1; then
      if grep -q "none of the targeted modules" "$mo.log"; then
        echo "PEER $family $recipe: SKIP (ModelOpt: the recipe targets no module of this model)"
        continue
      fi
      if grep -q "transformers cannot load it" "$mo.log"; then
        # kimi_k25 ships remote code only: ModelOpt has no model to quantize.
        echo "PEER $family $recipe: SKIP (transformers $(python3 -c 'import transformers; print(transformers.__version__)') has no class for this model type; ModelOpt cannot run it)"
        continue
      fi
      echo "PEER $family $recipe: ERROR (ModelOpt: $(grep -v '^\s*$' "$mo.log" | tail -1))"
      fails=$((fails + 1))
      continue
    fi
    python3 "$here/modelopt_peer.py" compare "$so" "$mo" "$family $recipe" \
      --scale_tol "${PEER_SCALE_TOL:-0.02}" --json "$work/$family.$tag.json" ${PEER_COMPARE_FLAGS:-} \
      || fails=$((fails + 1))
  done
done
echo "PEER done: $fails failing cases; exports under $work"
[ "$fails" -eq 0 ]
