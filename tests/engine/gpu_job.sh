#!/usr/bin/env bash
# One GPU-machine call for the GPU engine (docs/CUDA.md "The engine on the GPU"), run from a
# checkout that carries a strata built here (STRATA=path, default .bin/strata, or .bin/strata.xz
# unpacked): the GPU-vs-CPU export tests, the resume test on the GPU path, the DeepSeek refusal,
# and timings (the demo MoE, a synthetic Qwen3-MoE at real layer widths). Logs go to $OUT
# (tests.log, timing.log); a summary is printed last. Nothing in a test may reopen /dev/stderr
# (tee /dev/stderr truncates tests.log).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu_job_out}
mkdir -p "$OUT"
if [ -f .bin/strata.xz ] && [ ! -x .bin/strata ]; then
  if command -v xz > /dev/null; then xz -dc .bin/strata.xz > .bin/strata
  else python3 -c 'import lzma,sys,shutil; shutil.copyfileobj(lzma.open(sys.argv[1]), sys.stdout.buffer)' .bin/strata.xz > .bin/strata; fi
  chmod +x .bin/strata
fi
strata=$(pwd)/${STRATA:-.bin/strata}
tl=$OUT/tests.log tm=$OUT/timing.log
: > "$tl"; : > "$tm"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$tm"
ldd "$strata" | grep -E "not found|cublas|cudart" | tee -a "$tm"
"$strata" --version 2>&1 | tee -a "$tm"
summary=()
t() {  # t NAME CMD...: runs a test, logs it, records PASS/FAIL
  local name=$1; shift
  echo "=== $name: $*" >> "$tl"
  local t0=$(date +%s%N)
  if "$@" >> "$tl" 2>&1; then r=PASS; else r="FAIL($?)"; fi
  local dt=$((($(date +%s%N) - t0) / 1000000))
  summary+=("$r $name ${dt} ms")
  echo "--- $r $name" >> "$tl"
}
g=tests/engine/gpu_vs_cpu_test.sh
for m in llama qwen3 qwen3_moe qwen3_moe_nonorm kimi_linear mixtral glm4_moe minimax_m2 qwen3_next \
         qwen3_5_moe deepseek_v32; do
  t "gpu_vs_cpu.$m.fp32" bash $g "$strata" $m nvfp4-kv_fp8 fp32 0.01
  t "gpu_vs_cpu.$m.bf16" bash $g "$strata" $m nvfp4-kv_fp8 bf16 0.05
done
t gpu_vs_cpu.qwen3_moe.experts_only bash $g "$strata" qwen3_moe nvfp4_experts_only-kv_fp8 bf16 0.05
t gpu_vs_cpu.qwen3_moe.fp8 bash $g "$strata" qwen3_moe fp8-kv_fp8 fp32 0.01
t gpu_vs_cpu.qwen3_moe.host_store bash $g "$strata" qwen3_moe nvfp4-kv_fp8 fp32 0.01 --test_gpu_host_store
t gpu_vs_cpu.qwen3_moe.file_store bash $g "$strata" qwen3_moe nvfp4-kv_fp8 fp32 0.01 --test_gpu_host_store --test_activation_budget 1
t gpu_vs_cpu.qwen3_moe.warp_attention bash $g "$strata" qwen3_moe nvfp4-kv_fp8 fp32 0.01 --gpu_attention warp
t gpu_vs_cpu.qwen3_moe.exporter_quant bash $g "$strata" qwen3_moe nvfp4-kv_fp8 bf16 0.05 --gpu_quantize off
t gpu_vs_cpu.llama.exporter_quant_fp8 bash $g "$strata" llama fp8-kv_fp8 bf16 0.05 --gpu_quantize off
t kill_resume_gpu.qwen3_moe bash tests/engine/kill_resume_test.sh "$strata" qwen3_moe 4 20240601 --resume_every 0
t resume_cadence_gpu.qwen3_moe bash tests/engine/resume_cadence_test.sh "$strata" qwen3_moe
for m in kimi_k25_int4 deepseek_v3_mxfp4; do  # decompressed on the device: the bf16 bytes
  t "compressed_cuda.$m" bash tests/export/compressed_source_test.sh "$strata" $m nvfp4-kv_fp8 --device cuda
done

echo "== demo/tiny-moe (256 x 512 tokens, nvfp4_experts_only + fp8 kv)" >> "$tm"
for dev in cuda cpu; do
  rm -rf /tmp/demo_$dev
  t0=$(date +%s%N)
  "$strata" quantize --model demo/tiny-moe --qformat nvfp4_experts_only --kv_cache_qformat fp8 \
    --calib_data data/calib/essays_en.txt --device $dev --export_path /tmp/demo_$dev 2>&1 | grep -E "GPU:|quantized|peak RSS|error|warning" >> "$tm"
  echo "demo $dev wall $((($(date +%s%N) - t0) / 1000000)) ms" >> "$tm"
done
python3 tests/engine/compare_exports.py /tmp/demo_cpu /tmp/demo_cuda --rel 0.05 >> "$tm" 2>&1

echo "== synthetic Qwen3-MoE (2048 wide, 64 experts x 768, top-8, 32/4 heads x 128)" >> "$tm"
syn=/tmp/syn
python3 bench/gpu/make_synthetic_moe.py $syn --layers ${SYN_LAYERS:-4} --experts 64 --seqs ${SYN_SEQS:-128} --seq_len 512 >> "$tm" 2>&1
sync
t0=$(date +%s%N); cat $syn/model.safetensors > /dev/null; echo "read once (page cache warm): $((($(date +%s%N) - t0) / 1000000)) ms" >> "$tm"
for variant in "resident:" "pinned:--test_gpu_host_store" "exporter_quant:--gpu_quantize off"; do
  name=${variant%%:*} flags=${variant#*:}
  rm -rf /tmp/syn_out
  t0=$(date +%s%N)
  "$strata" quantize $flags --model $syn \
    --qformat nvfp4_experts_only --kv_cache_qformat fp8 --calib_data $syn/calib.jsonl \
    --calib_size ${SYN_SEQS:-128} --calib_min_tokens 1 --batch_size 8 --device cuda \
    --max_gpu_memory_gb 4 --export_path /tmp/syn_out 2>&1 | grep -E "GPU:|quantized|^time|^layers|peak RSS|error|warning" >> "$tm"
  echo "synthetic $name wall $((($(date +%s%N) - t0) / 1000000)) ms" >> "$tm"
done
echo "== summary" | tee -a "$tm"
printf '%s\n' "${summary[@]}" | tee -a "$tm"
grep -h "compared\|FAIL" "$tl" | head -40
tail -45 "$tm"
