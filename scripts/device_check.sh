#!/usr/bin/env bash
# One device call's checks on the GPU machine, from the bundle (scripts/device_bundle.sh): the GPU
# tests, the ModelOpt peer (tests/peer/peer.sh) for chosen recipes, and GPU benchmarks, each with
# its own deadline so that one slow part cannot take the call; logs under $OUT/logs (or --out),
# and a short table printed last.
#
#   bash .xfer/bundle/run.sh 'bash scripts/device_check.sh [--parts tests,peer,bench,kda,read]
#        [--tests REGEX] [--recipes "R1 R2"] [--families "F1 F2"] [--bench "ARCH ..."]
#        [--bench_skip STEPS] [--bench_pairs N] [--bench_alt "FLAGS[|FLAGS]..."] [--peer_deadline S]
#        [--read_settings "W:q:R,..."] [--read_rounds N] [--read_write_gb G]'
#
# --parts     which parts run, in this order (default tests,peer); parts joined by + run at the
#             same time (tests+peer: neither is timed); kda: bench/kda_bench (a few seconds)
# --tests     a ctest -R regex over the `gpu` label (default: every GPU test)
# --recipes   peer recipes (default: the calibrated NVFP4 KV cache nvfp4-kv_nvfp4, the last of
#             issue 19's recipes to get a GPU peer run, 11 of 11 PASS on 2026-12-05;
#             docs/QUANTIZE.md "Parity with ModelOpt" lists what ran)
# --families  peer families (default: every fixture family with a transformers class)
# --peer_deadline  seconds the peer may take (default 420; one family a process: 11 families x
#             6 recipes took 202 s beside the GPU tests on 2026-12-05); a peer stopped at it still
#             reports the verdicts of the families that finished, read from their logs
# --bench     bench/gpu_bench.sh arches (qwen3_moe deepseek_v3 kimi_k2_int4 gpt_oss_mxfp4), capped
#             runs with the device profile, each stopped at 280 s (deadline 200 s): two fit in a
#             call beside nothing else (default "gpt_oss_mxfp4 kimi_k2_int4")
# --bench_skip gpu_bench.sh's --skip (default free,hf,peak). For qwen3_moe and deepseek_v3 this
#             leaves its ModelOpt layerwise + offload step on, stopped at the 200 s deadline (the
#             table then gives the layers it calibrated and its time a layer); add modelopt to
#             leave it out.
# --bench_pairs gpu_bench.sh's --pairs (default 1): N rounds of the read + write floor and the
#             strata runs, each ratio to the floor just before it (the disk's rate moves ~10%);
#             each round adds about a minute on the Qwen3 shape, and 90 s to the bench's limits
# --bench_alt gpu_bench.sh's --alt: with --bench_pairs, every pair also runs strata capped with
#             these flags added (an A/B of a setting in pairs; "FLAGS|FLAGS": one run a set);
#             40 s more a pair and a set in the limits
# --read_settings  the read part: bench/read_bench's --settings on the Qwen3-MoE bench checkpoint
#             (17 layers, 22.4 GB, made here), from a cold page cache each run (default: the
#             floor's cats, the warmer before 2026-12-05's seventh session, 8 streams beside
#             the reader and waited for (the default since), 12 streams waited for)
# --read_rounds    read_bench's --rounds (default 2): the list run that many times in turn
# --read_write_gb  GB written meanwhile (default 7.5, the Qwen3 export's size; 0: none)
# The peer, and gpu_bench.sh's ModelOpt step, need the wheels of tests/peer/fetch_wheels.sh carried
# as .whl/.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
bin=/tmp/strata-bundle/build/bin
out=${OUT:-out/device_check}
parts=tests,peer
tests=""
recipes="nvfp4-kv_nvfp4"
families="llama qwen3 qwen3_moe deepseek_v3 kimi_linear glm4_moe minimax_m2 mixtral qwen3_next
          deepseek_v32 gpt_oss"
bench="gpt_oss_mxfp4 kimi_k2_int4"
bench_skip=free,hf,peak
bench_pairs=1
bench_alt=""
peer_deadline=420
read_settings="8:c:4,8:n:4:16:16384,8:y:4:256:1024,8:y:4:256:1024:wait,12:y:4:256:1024:wait"
read_rounds=2
read_write_gb=7.5
while [ $# -gt 0 ]; do
  case "$1" in
    --parts) parts="$2"; shift 2 ;;
    --tests) tests="$2"; shift 2 ;;
    --recipes) recipes="$2"; shift 2 ;;
    --families) families="$2"; shift 2 ;;
    --bench) bench="$2"; shift 2 ;;
    --bench_skip) bench_skip="$2"; shift 2 ;;
    --bench_pairs) bench_pairs="$2"; shift 2 ;;
    --bench_alt) bench_alt="$2"; shift 2 ;;
    --peer_deadline) peer_deadline="$2"; shift 2 ;;
    --read_settings) read_settings="$2"; shift 2 ;;
    --read_rounds) read_rounds="$2"; shift 2 ;;
    --read_write_gb) read_write_gb="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    -h|--help) sed -n '2,40p' "$0"; exit 0 ;;
    *) echo "device_check: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -x "$bin/strata" ] || { echo "device_check: no strata in $bin (run under the bundle's run.sh)" >&2; exit 2; }
logs=$out/logs
mkdir -p "$logs"
elapsed() { echo $(( $(date +%s) - $1 ))s; }

# One part; its summary lines go to $logs/summary_PART.txt, so that parts can run side by side.
run_part() {
  local part=$1 t0 rc summary=()
  t0=$(date +%s)
  case "$part" in
    tests)
      (cd /tmp/strata-bundle/build && timeout 330 ctest -L gpu ${tests:+-R "$tests"} -j 6 \
         --timeout 240 --output-on-failure) > "$logs/ctest_gpu.log" 2>&1
      rc=$?
      summary+=("tests rc=$rc $(elapsed "$t0"): $(grep -E "tests passed" "$logs/ctest_gpu.log" | tail -1)")
      while read -r line; do summary+=("  $line"); done \
        < <(grep -E "\*\*\*(Failed|Timeout)|\(Failed\)|\(Timeout\)" "$logs/ctest_gpu.log" | head -20)
      ;;
    peer)
      # shellcheck disable=SC2086
      PEER_OUT=/tmp/device_check_peer PEER_JOBS=12 STRATA_FLAGS="--calib_precision bf16_ops" \
        PEER_SCALE_TOL=0.005 PEER_RECIPES="$(echo $recipes)" \
        timeout "$peer_deadline" bash tests/peer/peer.sh "$bin/strata" .whl $families \
        > "$logs/peer.log" 2>&1
      rc=$?
      summary+=("peer rc=$rc $(elapsed "$t0")")
      # peer.sh prints the families' verdicts when all have ended; stopped at the deadline, the
      # verdicts are in each family's own log.
      if [ $rc -eq 124 ]; then
        pkill -f "tests/peer/" 2>/dev/null; sleep 1
        cat /tmp/device_check_peer/*.peer.log > "$logs/peer_families.log" 2>/dev/null
        summary+=("  (stopped at ${peer_deadline} s; verdicts of the cases that finished)")
        while read -r line; do summary+=("  $line"); done < <(grep "^PEER" "$logs/peer_families.log" | grep -v "^PEER done")
      else
        while read -r line; do summary+=("  $line"); done < <(grep "^PEER" "$logs/peer.log")
      fi
      ;;
    bench)
      for arch in $bench; do
        t1=$(date +%s)
        extra=$((90 * (bench_pairs - 1)))  # each further pair's floor and runs
        [ -n "$bench_alt" ] &&
          extra=$((extra + 40 * bench_pairs * ($(tr -cd '|' <<<"$bench_alt" | wc -c) + 1)))
        timeout $((280 + extra)) bash bench/gpu_bench.sh --arch "$arch" --bin "$bin" \
          --skip "$bench_skip" --profile --deadline $((200 + extra)) --pairs "$bench_pairs" \
          ${bench_alt:+--alt "$bench_alt"} \
          --out "$out/bench_$arch" \
          --work /var/tmp/strata_gpu_bench \
          > "$logs/bench_$arch.log" 2>&1
        rc=$?
        # Stopped at its deadline, the harness wrote no table: keep strata's own logs (their
        # phase breakdowns) and free the disk for the next arch.
        if [ $rc -eq 124 ]; then
          mkdir -p "$out/bench_$arch"
          tar -C /var/tmp/strata_gpu_bench -czf "$out/bench_$arch/strata_logs.tgz" logs 2>/dev/null
          rm -rf /var/tmp/strata_gpu_bench/ckpt /var/tmp/strata_gpu_bench/out_*
        fi
        summary+=("bench $arch rc=$rc $(elapsed "$t1")")
        while read -r line; do summary+=("  $line"); done < <(tail -12 "$logs/bench_$arch.log")
      done
      ;;
    kda)
      # The gated delta rule at Kimi-Linear-48B's sizes, then Qwen3-Next's decay per head
      # (docs/PERFORMANCE.md "The Kimi-Linear recurrence").
      { timeout 120 "$bin/kda_bench"; timeout 120 "$bin/kda_bench" --head_decay --heads 32; } \
        > "$logs/kda_bench.log" 2>&1
      rc=$?
      summary+=("kda rc=$rc $(elapsed "$t0")")
      while read -r line; do summary+=("  $line"); done < "$logs/kda_bench.log"
      ;;
    read)
      # The loop's read pattern alone (bench/read_bench), on the Qwen3-MoE bench checkpoint.
      rd=/var/tmp/strata_read_bench
      rm -rf "$rd" && mkdir -p "$rd"
      dev=$(basename "$(df --output=source "$rd" | tail -1)")
      q=/sys/class/block/$dev/queue
      [ -d "$q" ] || q=/sys/class/block/$(basename "$(readlink -f "/sys/class/block/$dev/..")")/queue
      summary+=("  disk $dev: read_ahead_kb $(cat "$q/read_ahead_kb" 2>/dev/null), max_sectors_kb $(cat "$q/max_sectors_kb" 2>/dev/null), nr_requests $(cat "$q/nr_requests" 2>/dev/null), $(cat "$q/scheduler" 2>/dev/null)")
      { timeout 120 "$bin/make_synthetic" "$rd/ckpt" --arch qwen3_moe --layers 17 && sync &&
          timeout 480 "$bin/read_bench" "$rd/ckpt" --settings "$read_settings" \
            --rounds "$read_rounds" --write_gb "$read_write_gb" --out "$rd"; } \
        > "$logs/read_bench.log" 2>&1
      rc=$?
      rm -rf "$rd"
      summary+=("read rc=$rc $(elapsed "$t0")")
      while read -r line; do summary+=("  $line"); done < <(grep -v "^\[" "$logs/read_bench.log" | tail -30)
      ;;
    *) summary+=("device_check: unknown part $part (tests, peer, bench, kda, read)") ;;
  esac
  printf '%s\n' "${summary[@]}" > "$logs/summary_$part.txt"
}

# Groups run in order; the parts of one group (joined by +) run at the same time.
for group in ${parts//,/ }; do
  for part in ${group//+/ }; do run_part "$part" & done
  wait
done
echo "== device_check summary (logs in $logs)"
for group in ${parts//,/ }; do
  for part in ${group//+/ }; do cat "$logs/summary_$part.txt"; done
done
