#!/usr/bin/env bash
# Installs what is needed, builds strata, and runs the main job on the bundled demo: quantize
# demo/tiny-moe (a small Qwen3-MoE with its tokenizer) to NVFP4 on the routed experts with an
# FP8 KV cache, calibrating on the bundled corpus; inspect the result; and compare the
# perplexity of the source and the quantized model on held-out text (demo/eval.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
cmake --preset default >/dev/null
cmake --build --preset default -j "$(nproc)"
strata=build/default/bin/strata
out=build/demo-tiny-moe-nvfp4
rm -rf "$out"
"$strata" quantize --model demo/tiny-moe --qformat nvfp4_experts_only --kv_cache_qformat fp8 --export_path "$out"
"$strata" inspect "$out"
"$strata" tokenize --model demo/tiny-moe < demo/eval.txt > build/demo-eval-tokens.jsonl
echo "== perplexity on demo/eval.txt =="
printf "source (bf16):             "; "$strata" eval -q --model demo/tiny-moe --tokens build/demo-eval-tokens.jsonl | tail -1
printf "NVFP4 experts + FP8 KV:    "; "$strata" eval -q --model "$out" --tokens build/demo-eval-tokens.jsonl | tail -1
