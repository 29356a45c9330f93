#!/usr/bin/env bash
# Ranks on CPU (docs/SCALEOUT.md): `strata quantize` as one process, as `mpirun -np 2` (data
# parallel) and as `mpirun -np 2 ... --expert_parallel` on a synthetic Qwen3-MoE checkpoint shaped
# like tests/fixtures/models/qwen3_moe, scaled up; prints the wall time of each, the speedups over
# one process, the checkpoint bytes each rank read (their sum must equal one process's read), the
# peak RSS of each rank, the expert rows each rank sent with their exchange time, and checks that
# every output is byte-identical to one process's.
#   bench/mpi_bench.sh [BIN_DIR (build/rel/bin)] [GIB (0.5)] [RANKS (2)]
# BIN_DIR holds strata (built with MPI) and make_synthetic from an optimized build. Each rank
# gets cores / ranks threads; the speedup is bounded by the machine's cores.
set -euo pipefail
bin=${1:-build/rel/bin} gib=${2:-0.5} ranks=${3:-2}
command -v mpirun > /dev/null || { echo "mpirun not found"; exit 1; }
work=$(mktemp -d "${TMPDIR:-/tmp}/strata_mpi_bench.XXXXXX")
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
src=$work/ckpt
"$bin/make_synthetic" "$src" --arch qwen3_moe --gib "$gib" --hidden 1024 --vocab 8192 --experts 32 \
  --intermediate 512 --top_k 2
# Calibration: 32 sequences of 128 random token ids, 4 per micro-batch (8 micro-batches).
python3 - > "$work/calib.jsonl" <<'PY'
import json, random
r = random.Random(7)
for _ in range(32):
    print(json.dumps([r.randrange(8192) for _ in range(128)]))
PY
args=(quantize --model "$src" --calib_data "$work/calib.jsonl" --calib_size 32 --calib_seq 128
      --calib_min_tokens 1 --batch_size 4 --recipe nvfp4-kv_fp8 --device cpu -q)
sums() { (cd "$1" && find . -type f | sort | xargs sha256sum); }
cat "$src"/*.safetensors > /dev/null  # warm page cache for both runs

t0=$(date +%s.%N)
"$bin/strata" "${args[@]}" --export_path "$work/one" > "$work/one.log"
t1=$(date +%s.%N)
mpirun -np "$ranks" --oversubscribe --bind-to none "$bin/strata" "${args[@]}" \
  --export_path "$work/many" > "$work/many.log"
t2=$(date +%s.%N)
mpirun -np "$ranks" --oversubscribe --bind-to none "$bin/strata" "${args[@]}" --expert_parallel \
  --export_path "$work/ep" > "$work/ep.log"
t3=$(date +%s.%N)

secs() { awk -v a="$1" -v b="$2" 'BEGIN {print b - a}'; }
one_s=$(secs "$t0" "$t1") many_s=$(secs "$t1" "$t2") ep_s=$(secs "$t2" "$t3")
one_read=$(sed -n 's/^checkpoint bytes read: //p' "$work/one.log")
one_rss=$(sed -n 's/^peak RSS \([0-9.]*\) MiB.*/\1/p' "$work/one.log")
field() { sed -n "s/^$1//p" "$2"; }
identical() { diff <(sums "$work/one") <(sums "$1") > /dev/null && echo yes || echo no; }
same_dp=$(identical "$work/many") same_ep=$(identical "$work/ep")
printf 'checkpoint          %s (%s bytes of tensors)\n' "$(du -sh "$src" | cut -f1)" "$one_read"
printf 'cores               %s\n' "$(nproc)"
printf '1 process           %.2f s, peak RSS %s MiB\n' "$one_s" "$one_rss"
for mode in dp ep; do
  if [ $mode = dp ]; then s=$many_s log=$work/many.log same=$same_dp name="data parallel"; else s=$ep_s log=$work/ep.log same=$same_ep name="expert parallel"; fi
  printf '%d ranks, %s\n' "$ranks" "$name"
  printf '  wall              %.2f s (speedup %.2fx)\n' "$s" "$(awk -v a="$one_s" -v b="$s" 'BEGIN {print a / b}')"
  printf '  bytes read/rank   %s\n' "$(field 'ranks: [0-9]*; checkpoint bytes read per rank: ' "$log")"
  printf '  peak RSS/rank     %s MiB\n' "$(field 'peak RSS per rank, MiB: ' "$log")"
  [ $mode = dp ] || printf '  expert rows sent  %s (bytes, ms per rank)\n' "$(field 'expert exchange per rank (bytes sent to other ranks, ms): ' "$log")"
  printf '  byte-identical    %s\n' "$same"
done
[ "$same_dp" = yes ] && [ "$same_ep" = yes ] || exit 1
