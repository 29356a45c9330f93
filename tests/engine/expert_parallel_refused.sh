#!/usr/bin/env bash
# gpt-oss's experts are written fused, one tensor per projection and layer that one rank writes
# (export/modelopt.h): under mpirun, --expert_parallel stops before any work with one line saying
# so, and the same run without it gives one process's bytes (tests/engine/mpi_test.sh covers that).
#   tests/engine/expert_parallel_refused.sh STRATA MODEL
# Exits 77 (ctest: skipped) when mpirun is not installed.
set -uo pipefail
strata=$1 model=$2
command -v mpirun > /dev/null || { echo "mpirun not found: skipped"; exit 77; }
src=tests/fixtures/models/$model
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Open MPI's session folder goes under TMPDIR (/tmp/ompi.<host>.<uid> by default, shared): two
# mpiruns starting at once (ctest -j) race to create it ("File exists"). One per test instead.
mkdir "$work/tmp" && export TMPDIR=$work/tmp
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1
python3 tests/fixtures/tokens_jsonl.py "$src/reference.safetensors" > "$work/tokens.jsonl"
count=$(wc -l < "$work/tokens.jsonl")
timeout 120 env "ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" \
  mpirun --oversubscribe --bind-to none -np 2 "$strata" quantize --model "$src" \
  --calib_data "$work/tokens.jsonl" --calib_size "$count" --calib_min_tokens 1 --batch_size 2 \
  --recipe nvfp4-kv_fp8 --expert_parallel --export_path "$work/out" > "$work/stdout" 2> "$work/stderr"
rc=$?
cat "$work/stderr"
[ "$rc" -ne 0 ] || { echo "FAIL: --expert_parallel on $model did not stop"; exit 1; }
grep -qF -- "--expert_parallel: gpt-oss's experts are written fused" "$work/stderr" \
  || { echo "FAIL: stderr lacks the refusal"; exit 1; }
[ ! -e "$work/out" ] || { echo "FAIL: the export directory was created"; exit 1; }
echo ok
