#!/usr/bin/env bash
# One GPU-machine call for GPU ranks (docs/SCALEOUT.md "GPU ranks and NCCL"), run through the
# bundle of `scripts/device_bundle.sh --mpi` (libmpi from that machine):
#   STRATA_BUNDLE_SRC=$PWD bash BUNDLE/run.sh 'bash tests/engine/gpu_ranks_job.sh [SECONDS]'
# Probes the machine's MPI, runs the rank tests on the GPU (ctest engine.mpi_gpu.*, then the
# other gpu-labelled tests of the engine), and, while time is left, times one process against
# `mpirun -np 2` and `-np 4` (all ranks on the one GPU) on a synthetic Qwen3-MoE. Logs go to $OUT; a summary
# is printed last. SECONDS (default 200) bounds the whole job.
set -uo pipefail
OUT=${OUT:-/tmp/gpu_ranks_out}
mkdir -p "$OUT"
deadline=$(($(date +%s) + ${1:-200}))
left() { echo $((deadline - $(date +%s))); }
b=/tmp/strata-bundle/build
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1
{
  echo "== probe"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  command -v mpirun && readlink -f "$(command -v mpirun)"
  mpirun --version 2>&1 | head -2
  ls /usr/lib/x86_64-linux-gnu/libmpi* 2>&1 | head -5
  ldconfig -p | grep -E "libmpi\.|libopen-(pal|rte)" | head
  ldd "$b/bin/strata" | grep -E "mpi|open-|hwloc|event|not found"
  echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
  strata --version
  timeout 30 mpirun --oversubscribe --bind-to none -np 2 strata --version
} > "$OUT/probe.log" 2>&1
summary=()
if ! strata --version > /dev/null 2>&1; then
  summary+=("FAIL strata does not start (libmpi?)")
else
  timeout $(($(left) - 20)) ctest --test-dir "$b" -R '^engine\.mpi_gpu\.' --output-on-failure \
    > "$OUT/mpi_gpu.log" 2>&1
  summary+=("$(grep -E "tests passed|tests failed" "$OUT/mpi_gpu.log")")
  summary+=("$(grep -E "^ *[0-9]+/[0-9]+ Test" "$OUT/mpi_gpu.log")")
  if [ "$(left)" -gt 60 ]; then
    timeout $(($(left) - 30)) ctest --test-dir "$b" -L gpu -R '^engine\.' -E 'mpi_gpu' -j6 \
      --output-on-failure > "$OUT/gpu.log" 2>&1
    summary+=("gpu engine tests: $(grep -E "tests passed|tests failed" "$OUT/gpu.log")")
    summary+=("$(grep -E "\*\*\*Failed|\*\*\*Timeout" "$OUT/gpu.log")")
  fi
  if [ "$(left)" -gt 50 ]; then
    syn=/tmp/syn_ranks
    python3 bench/gpu/make_synthetic_moe.py $syn --layers 6 --experts 64 --seqs 64 --seq_len 512 \
      > "$OUT/timing.log" 2>&1
    a=(quantize --model $syn --qformat nvfp4_experts_only --kv_cache_qformat fp8
       --calib_data $syn/calib.jsonl --calib_size 64 --calib_min_tokens 1 --batch_size 8
       --device cuda --max_gpu_memory_gb 8)
    cat $syn/*.safetensors > /dev/null
    # one process; 2 ranks (exchange on the reader thread); 2 ranks with the exchange on the main
    # thread; 4 ranks. All on the one GPU.
    for run in one np2 np2_main np4; do
      [ "$(left)" -gt 20 ] || break
      rm -rf /tmp/syn_out_$run
      t0=$(date +%s%N)
      case $run in
        one) timeout $(left) strata "${a[@]}" --export_path /tmp/syn_out_$run > "$OUT/$run.out" 2>&1 ;;
        *) n=${run:2:1}; ex=thread; [ $run = np2_main ] && ex=main
           timeout $(left) mpirun --oversubscribe --bind-to none -np $n \
             strata "${a[@]}" --test_gpu_ranks_exchange $ex --export_path /tmp/syn_out_$run > "$OUT/$run.out" 2>&1 ;;
      esac
      echo "synthetic $run rc $? wall $((($(date +%s%N) - t0) / 1000000)) ms" >> "$OUT/timing.log"
      grep -E "GPU:|^ranks:|checkpoint bytes read" "$OUT/$run.out" >> "$OUT/timing.log"
      [ $run = one ] || { diff -q <(cd /tmp/syn_out_one && find . -type f | sort | xargs sha256sum) \
        <(cd /tmp/syn_out_$run && find . -type f | sort | xargs sha256sum) > /dev/null && echo "$run: identical to one" >> "$OUT/timing.log" || echo "$run: DIFFERS from one" >> "$OUT/timing.log"; }
    done
  fi
fi
echo "== probe"; cat "$OUT/probe.log" | head -30
echo "== failures"; grep -B2 -A25 "FAIL:" "$OUT/mpi_gpu.log" 2>/dev/null | head -60
echo "== timing"; cat "$OUT/timing.log" 2>/dev/null | tail -30
echo "== summary"; printf '%s\n' "${summary[@]}"
