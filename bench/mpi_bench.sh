#!/usr/bin/env bash
# Ranks on CPU (docs/SCALEOUT.md): `strata quantize` as one process and as `mpirun -np 2` on a
# synthetic Qwen3-MoE checkpoint shaped like tests/fixtures/models/qwen3_moe, scaled up; prints
# the wall time of each, the speedup of 2 ranks over 1, the checkpoint bytes each rank read (their
# sum must equal one process's read) and checks the two outputs are byte-identical.
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
      --calib_min_tokens 1 --batch_size 4 --recipe nvfp4-kv_fp8 -q)
sums() { (cd "$1" && find . -type f | sort | xargs sha256sum); }
cat "$src"/*.safetensors > /dev/null  # warm page cache for both runs

t0=$(date +%s.%N)
"$bin/strata" "${args[@]}" --export_path "$work/one" > "$work/one.log"
t1=$(date +%s.%N)
mpirun -np "$ranks" --oversubscribe --bind-to none "$bin/strata" "${args[@]}" \
  --export_path "$work/many" > "$work/many.log"
t2=$(date +%s.%N)

one_s=$(awk -v a="$t0" -v b="$t1" 'BEGIN {print b - a}')
many_s=$(awk -v a="$t1" -v b="$t2" 'BEGIN {print b - a}')
one_read=$(sed -n 's/^checkpoint bytes read: //p' "$work/one.log")
per_rank=$(sed -n 's/^ranks: [0-9]*; checkpoint bytes read per rank: //p' "$work/many.log")
identical=no
diff <(sums "$work/one") <(sums "$work/many") > /dev/null && identical=yes
printf 'checkpoint        %s (%s bytes of tensors)\n' "$(du -sh "$src" | cut -f1)" "$one_read"
printf 'cores             %s\n' "$(nproc)"
printf '1 process         %.2f s\n' "$one_s"
printf '%d ranks           %.2f s\n' "$ranks" "$many_s"
printf 'speedup           %.2fx\n' "$(awk -v a="$one_s" -v b="$many_s" 'BEGIN {print a / b}')"
printf 'bytes read/rank   %s\n' "$per_rank"
printf 'one process read  %s\n' "$one_read"
printf 'byte-identical    %s\n' "$identical"
[ "$identical" = yes ] || exit 1
