#!/usr/bin/env bash
# Expert parallelism on GPU ranks (docs/SCALEOUT.md "Expert parallel on GPU ranks"): one process
# against `mpirun -np 2` and `-np 4 ... --expert_parallel`, every rank on the one GPU (through
# tests/engine/gpu_rank_env.sh's NCCL environment), on a synthetic Qwen3-MoE
# (bench/gpu/make_synthetic_moe.py). Prints per run: the wall time, the bytes each rank read of the
# checkpoint and their sum (which must equal one process's read), and per layer and rank the
# expert all-to-all's bytes sent and received (to and from other ranks) and its time (NCCL on the
# device; the counts' exchange on the host); and whether the export is byte-identical to one
# process's (the script fails if not, or if the reads do not sum to one read).
#
#   bash bench/gpu_expert_bench.sh [--bin DIR] [--layers N] [--experts E] [--seqs S] [--seq_len L]
#                                  [--gb GIB] [--out DIR]
# Through the bundle (scripts/device_bundle.sh --mpi):
#   bash .xfer/bundle/run.sh 'bash bench/gpu_expert_bench.sh --bin /tmp/strata-bundle/build/bin'
set -uo pipefail
bin=""
layers=4 experts=64 seqs=64 seq_len=512 gb=8 out=/tmp/gpu_expert_bench
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin=$2; shift 2 ;;
    --layers) layers=$2; shift 2 ;;
    --experts) experts=$2; shift 2 ;;
    --seqs) seqs=$2; shift 2 ;;
    --seq_len) seq_len=$2; shift 2 ;;
    --gb) gb=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "gpu_expert_bench: unknown argument $1" >&2; exit 2 ;;
  esac
done
strata=${bin:+$bin/}strata
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}  # NCCL's own account of a failure, in the output
mkdir -p "$out"
syn=$out/model
[ -f "$syn/config.json" ] || python3 "$here/bench/gpu/make_synthetic_moe.py" "$syn" --layers "$layers" \
  --experts "$experts" --seqs "$seqs" --seq_len "$seq_len" > "$out/make.log" 2>&1 ||
  { cat "$out/make.log"; echo "FAIL: synthetic checkpoint"; exit 1; }
cat "$syn"/*.safetensors > /dev/null  # page cache warm for every run
a=(quantize --model "$syn" --qformat nvfp4_experts_only --kv_cache_qformat fp8
   --calib_data "$syn/calib.jsonl" --calib_size "$seqs" --calib_min_tokens 1 --batch_size 8
   --device cuda --max_gpu_memory_gb "$gb")
sums() { (cd "$1" && find . -type f | sort | xargs sha256sum); }
status=0
echo "synthetic Qwen3-MoE: $layers layers of $experts experts, $seqs x $seq_len tokens, $(du -sb "$syn" | cut -f1) bytes; --max_gpu_memory_gb $gb per rank"
for run in one ep2 ep4; do
  rm -rf "$out/export_$run" "$out/logs_$run"
  t0=$(date +%s%N)
  if [ $run = one ]; then
    "$strata" "${a[@]}" --export_path "$out/export_$run" > "$out/$run.out" 2> "$out/$run.err"
  else
    n=${run#ep}
    timeout 900 mpirun --oversubscribe --bind-to none -np "$n" bash "$here/tests/engine/gpu_rank_env.sh" \
      "$strata" "${a[@]}" --expert_parallel --log_dir "$out/logs_$run" --export_path "$out/export_$run" \
      > "$out/$run.out" 2> "$out/$run.err"
  fi
  rc=$?
  wall=$((($(date +%s%N) - t0) / 1000000))
  echo "== $run: rc $rc, wall $wall ms"
  if [ $rc -ne 0 ]; then tail -20 "$out/$run.err"; echo "FAIL: $run"; status=1; continue; fi
  grep -E "GPU: " "$out/$run.err" | head -4
  if [ $run = one ]; then
    one_read=$(sed -n 's/^checkpoint bytes read: //p' "$out/$run.out")
    echo "bytes read: $one_read"
    sums "$out/export_one" > "$out/one.sums"
    continue
  fi
  line=$(grep "^ranks:" "$out/$run.out")
  echo "$line"
  sum=$(sed -n 's/^ranks: .*(sum \([0-9]*\))$/\1/p' <<< "$line")
  if [ "$sum" = "$one_read" ]; then echo "reads sum to one read: yes"; else echo "FAIL: reads sum to $sum, one read is $one_read"; status=1; fi
  grep "^expert exchange per rank" "$out/$run.out"
  grep "^peak RSS per rank" "$out/$run.out"
  # Per layer and rank: the expert all-to-all's bytes and time (every rank's log, --log_dir).
  echo "expert all-to-all per layer (rank: sent bytes, received bytes, exchanges, NCCL device ms, counts host ms):"
  for f in "$out/logs_$run"/rank-*.log; do
    r=$(basename "$f" .log)
    sed -n 's/.*expert all-to-all: layer \([0-9]*\): sent \([0-9]*\) bytes, received \([0-9]*\) bytes (other ranks), \([0-9]*\) exchanges in \([0-9.e+-]*\) ms on the device (NCCL), counts \([0-9.e+-]*\) ms on the host.*/\1 \2 \3 \4 \5 \6/p' "$f" |
      while read -r l s rcv x dms hms; do echo "  layer $l $r: $s, $rcv, $x, $dms, $hms"; done
  done | sort -k2,2n -k3,3
  if diff -q "$out/one.sums" <(sums "$out/export_$run") > /dev/null; then
    echo "identical to one process: yes"
  else
    echo "FAIL: $run's export differs from one process's"
    status=1
  fi
done
[ $status -eq 0 ] && echo "PASS: gpu_expert_bench" || echo "FAIL: gpu_expert_bench"
exit $status
