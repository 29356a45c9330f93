#!/usr/bin/env bash
# strata compare on the GPU against the CPU (ctest label gpu; exit 77 = skipped without a GPU):
#   tests/engine/gpu_compare_test.sh STRATA MODEL RECIPE GEMM REL [FLAGS...]
# 1. The exact case: MODEL against its own copy with --device cuda: every KL exactly 0, top-1
#    exactly 1, every layer error exactly 0 (both models run the same device code on the same
#    bits).
# 2. MODEL quantized with RECIPE (on the CPU, once), then `strata compare MODEL EXPORT` with
#    --device cpu and --device cuda --gpu_gemm GEMM (FLAGS to the GPU run, e.g. a small
#    --max_gpu_memory_gb and --test_gpu_chunk_tokens for chunks of one sequence; with FLAGS the
#    run must report more than one chunk): the serving simulation is bit-identical
#    (tests/ops/cuda/fake_quant_test.cpp), so the numbers differ only by the GEMMs' summation
#    order (fp32) or their bf16 inputs (bf16), and by the few quantized values that this moves
#    across a rounding boundary. Bounds (REL, docs/COMPARE.md "On the GPU"): mean KL, every
#    layer's rel_error and rel_error_end_to_end within REL relative (+1e-6 absolute: layers the
#    recipe leaves unquantized have errors near 0); both mean NLLs (the logs of the perplexities:
#    a perplexity exponentiates the NLL's difference, and the fixtures' quantized ones reach 1e13)
#    within REL / 10 relative; top-1 agreement and routing agreements within 2 * REL absolute.
set -euo pipefail
strata=$1 model=$2 recipe=$3 gemm=$4 rel=$5
shift 5
if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "no GPU: skipped"
  exit 77
fi
src=tests/fixtures/models/$model
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 tests/fixtures/tokens_jsonl.py "$src" > "$work/tokens.jsonl"
count=$(wc -l < "$work/tokens.jsonl")
cp -r "$src" "$work/copy"
"$strata" compare -q "$src" "$work/copy" --tokens "$work/tokens.jsonl" --device cuda \
  --gpu_gemm "$gemm" --json "$work/self.json" "$@" >/dev/null
"$strata" quantize -q --model "$src" --recipe "$recipe" --calib_data "$work/tokens.jsonl" \
  --calib_size "$count" --calib_min_tokens 1 --device cpu --export_path "$work/export" >/dev/null
"$strata" compare -q "$src" "$work/export" --tokens "$work/tokens.jsonl" --device cpu \
  --json "$work/cpu.json" >/dev/null
"$strata" compare "$src" "$work/export" --tokens "$work/tokens.jsonl" --device cuda \
  --gpu_gemm "$gemm" --json "$work/gpu.json" "$@" > "$work/gpu.log" 2>&1 ||
  { cat "$work/gpu.log"; exit 1; }
chunks=$(sed -n 's/.*compare on the GPU: \([0-9]*\) chunk(s).*/\1/p' "$work/gpu.log")
echo "GPU compare: ${chunks:-?} chunk(s)"
if [ $# -gt 0 ] && ! [ "${chunks:-0}" -gt 1 ]; then
  echo "FAIL: the capped GPU compare ran in ${chunks:-an unknown number of} chunk(s), not several"
  cat "$work/gpu.log"
  exit 1
fi
python3 - "$work" "$rel" <<'PY'
import json, math, sys
work, rel = sys.argv[1], float(sys.argv[2])
self_ = json.load(open(f"{work}/self.json"))
assert self_["device"] == "cuda", self_["device"]
for k in ("mean_kl", "median_kl", "p99_kl", "max_kl"):
    assert self_[k] == 0.0, (k, self_[k])
assert self_["top1_agreement"] == 1.0, self_["top1_agreement"]
for l in self_["layers"]:
    assert l["rel_error"] == 0.0 and l["rel_error_end_to_end"] == 0.0, l
for e in self_["experts"]:
    assert e["routing_agreement"] == 1.0 and e["tokens_source"] == e["tokens_quantized"], e
cpu, gpu = json.load(open(f"{work}/cpu.json")), json.load(open(f"{work}/gpu.json"))
assert cpu["device"] == "cpu" and gpu["device"] == "cuda"
for k in ("activations_simulated", "kv_cache_simulated", "positions", "predicted"):
    assert cpu[k] == gpu[k], (k, cpu[k], gpu[k])
bad = []
def near(what, a, b, r, floor=0.0):
    if abs(a - b) > r * abs(a) + floor:
        bad.append(f"{what}: cpu {a:.6g} gpu {b:.6g} (bound {r} relative + {floor})")
near("mean_kl", cpu["mean_kl"], gpu["mean_kl"], rel, 1e-7)
near("nll_source", math.log(cpu["ppl_source"]), math.log(gpu["ppl_source"]), rel / 10)
near("nll_quantized", math.log(cpu["ppl_quantized"]), math.log(gpu["ppl_quantized"]), rel / 10)
near("top1_agreement", cpu["top1_agreement"], gpu["top1_agreement"], 0, 2 * rel)
for a, b in zip(cpu["layers"], gpu["layers"]):
    near(f"layer {a['index']} rel_error", a["rel_error"], b["rel_error"], rel, 1e-6)
    near(f"layer {a['index']} end to end", a["rel_error_end_to_end"], b["rel_error_end_to_end"], rel, 1e-6)
for a, b in zip(cpu["experts"], gpu["experts"]):
    near(f"{a['router']} routing", a["routing_agreement"], b["routing_agreement"], 0, 2 * rel)
print(f"cpu: mean KL {cpu['mean_kl']:.6g} top-1 {cpu['top1_agreement']:.4f}; "
      f"gpu: mean KL {gpu['mean_kl']:.6g} top-1 {gpu['top1_agreement']:.4f}")
if bad:
    print("\n".join(bad))
    sys.exit(1)
PY
