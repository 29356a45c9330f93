#!/usr/bin/env bash
# The GPU benchmark of docs/PERFORMANCE.md, in one call on the GPU machine: a synthetic bf16
# Qwen3-MoE checkpoint (Qwen3-30B-A3B shapes, 17 layers: 11.2 B parameters, 22.4 GB) written to
# local disk, 512 x 512 calibration token ids, the time to read the checkpoint once cold, the
# machine's bf16 matmul rate, `strata quantize` (NVFP4 experts-only, FP8 KV cache) unconstrained
# and with --max_gpu_memory_gb at a tenth of the checkpoint, each from a cold page cache, and the
# baseline a user has today (transformers loads the checkpoint onto the GPU and runs the same
# tokens with an amax hook on every linear input: bench/hf_baseline.py). Prints one table with
# every number and ratio, and writes it to OUT/gpu_bench.md with the logs in OUT/gpu_bench_logs.tgz.
# The peer beside them (step modelopt): ModelOpt 0.47's own path for a model larger than the GPU,
# layerwise calibration with offload (general/ptq/nvfp4_experts_only-kv_fp8_layerwise_offload) at
# the capped run's GPU memory, on the same checkpoint and tokens, then its export
# (bench/modelopt_layerwise.py), under its own time limit: the table says how far it got when it
# does not finish. With --arch deepseek_v3 the checkpoint is DeepSeek-V3-shaped, all bf16 (MLA, 3
# dense layers then 256 routed experts top-8 in grouped sigmoid routing with a shared expert; 61
# layers, 20.2 GB: bench/make_synthetic.cpp --arch deepseek_v3), with the transformers baseline
# and the ModelOpt peer. With --arch kimi_k2_int4 the checkpoint is instead Kimi-K2-Thinking-shaped (MLA, 384 routed
# experts top-8 stored as compressed-tensors pack-quantized INT4, the rest bf16; 61 layers, 20.8
# GB: make_synthetic --arch kimi_k2) and neither the transformers baseline nor ModelOpt runs. With
# --arch gpt_oss_mxfp4 it is gpt-oss-120b-shaped (36 layers of sliding and full attention with
# sinks, 128 experts top-4 stored as fused MXFP4 blocks and scales, the rest bf16; 20.7 GB:
# make_synthetic --arch gpt_oss), also without the transformers baseline and ModelOpt.
#
#   bench/gpu_bench.sh [--arch qwen3_moe|deepseek_v3|kimi_k2_int4|gpt_oss_mxfp4] [--bin DIR]
#                      [--work DIR] [--out DIR] [--layers 17|61|61|36] [--seqs 512]
#                      [--seq_len 512] [--micro_batch 16] [--batch_size N] [--cap_gb X]
#                      [--skip strata,free,compare,hf,modelopt,read,write,peak] [--deadline SECONDS]
#                      [--keep] [--small] [--before DIR] [--wheels DIR] [--modelopt_timeout S]
#                      [--hf_timeout S]
#                      [--profile] [--strata_flag FLAG]... [--pairs N] [--alt "FLAGS"]
#
# --arch: the checkpoint (default qwen3_moe). kimi_k2_int4 skips the transformers baseline and
#   ModelOpt: transformers 5.17 has no kimi_k2 model of its own (Kimi ships remote code) and would
#   need the compressed-tensors package to read INT4. gpt_oss_mxfp4 skips them too:
#   bench/hf_baseline.py and the ModelOpt step are not yet checked on transformers' MXFP4 loading
#   (which needs its own kernels on the GPU).
# --bin: where strata and make_synthetic are (default: the directory of `strata` on PATH).
# --work: checkpoint and outputs (default: strata_gpu_bench in the disk-backed one of /var/tmp,
#   /tmp, $HOME, . with the most room; needs the checkpoint + ~40%).
# --out: results (default $OUT when set, else ./gpu_bench_out).
# --before DIR: another strata build (DIR/strata, e.g. the commit before a refactor) runs each
#   strata step too, right before this one, on the same checkpoint and tokens; the table adds its
#   times and the ratio, and the two exports are compared byte for byte.
# --small: a tiny checkpoint and 16 x 64 tokens, to check the harness on any machine (CPU too).
# --skip: steps left out; free is strata's unconstrained run alone (the capped run still runs);
#   compare is `strata compare` of the source with the unconstrained run's export (which needs it).
# --deadline: start no further step once this many seconds have passed (the table still prints);
#   the ModelOpt step is also stopped at it.
# --wheels: where nvidia-modelopt 0.47's wheels are (tests/peer/fetch_wheels.sh; default .whl/ of
#   this repository when it has one, else "-": the modelopt that python3 (or $PYTHON) imports);
#   installed as tests/peer/peer.sh does (tests/peer/modelopt_env.sh), into WORK/modelopt_site.
# --hf_timeout: the most seconds the transformers baseline may take (default 600), less where the
#   deadline comes first (but at least 30); stopped, the table's notes say so.
# --modelopt_timeout: the most seconds the ModelOpt step may take (default 600), less where the
#   deadline comes first; when it is stopped the table gives the layers it calibrated and its time
#   a layer.
# --profile: strata runs with --gpu_profile; the table adds its device time by part of the forward.
# --strata_flag: one more argument for every strata run (repeat it: --strata_flag --gpu_gemm
#   --strata_flag fp32).
# --pairs N: after the table's runs, N - 1 more rounds of the read + write floor followed by the
#   strata runs (unconstrained unless skipped, and capped), each strata run's ratio to the floor
#   measured right before it: this disk's rate moves by about 10% from minute to minute
#   (docs/PERFORMANCE.md), so a ratio is read from pairs, not from one run. The table's notes give
#   every pair and the median ratio. Needs the write step (its staged export bytes stay in
#   /dev/shm until the last pair).
# --alt "FLAGS[|FLAGS]...": with --pairs, every pair also runs strata capped with these flags added
#   (e.g. "--test_gpu_read 8:none"), right after the capped run: an A/B of a setting in pairs, each
#   ratio to the same floor as the capped run beside it. Several sets, separated by |, run one
#   after another in every pair as alt, alt2, alt3, ...
# strata runs only if `strata quantize --help` offers --device (the GPU engine); the capped run
# only if it offers --max_gpu_memory_gb. A CPU-only strata runs only with --small.
#
# Cold cache: before every timed step the page cache is dropped (`echo 3 >
# /proc/sys/vm/drop_caches`, as root) or, where that is refused, the checkpoint's pages are
# evicted with posix_fadvise(DONTNEED) (`dd iflag=nocache count=0`); the table says which, and
# how much of the checkpoint stayed resident (fincore) before each step.
set -uo pipefail
export PYTHONUNBUFFERED=1
t_start=$EPOCHREALTIME
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)

bin="" work="" out="${OUT:-$PWD/gpu_bench_out}" arch=qwen3_moe layers="" seqs=512 seq_len=512
micro_batch=16 batch_size="" cap_gb="" skip="" deadline=0 keep=0 small=0 before=""
wheels="" modelopt_timeout=600 hf_timeout=600 pairs=1 alt=""
strata_flags=()
py=${PYTHON:-python3}
while [ $# -gt 0 ]; do
  case "$1" in
    --arch) arch=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --layers) layers=$2; shift 2 ;;
    --seqs) seqs=$2; shift 2 ;;
    --seq_len) seq_len=$2; shift 2 ;;
    --micro_batch) micro_batch=$2; shift 2 ;;
    --batch_size) batch_size=$2; shift 2 ;;
    --cap_gb) cap_gb=$2; shift 2 ;;
    --skip) skip=$2; shift 2 ;;
    --deadline) deadline=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    --before) before=$2; shift 2 ;;
    --small) small=1; shift ;;
    --wheels) wheels=$2; shift 2 ;;
    --modelopt_timeout) modelopt_timeout=$2; shift 2 ;;
    --hf_timeout) hf_timeout=$2; shift 2 ;;
    --profile) strata_flags+=(--gpu_profile); shift ;;
    --strata_flag) strata_flags+=("$2"); shift 2 ;;
    --pairs) pairs=$2; shift 2 ;;
    --alt) alt=$2; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"; exit 0 ;;
    *) echo "gpu_bench: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
# Per arch: make_synthetic's arguments, the default layer count, and for the disk check the GB
# of one layer, of the rest, and the export's size as a fraction of the checkpoint (plus what
# the write floor's test file takes while the checkpoint is there).
case "$arch" in
  qwen3_moe) synth_arch=qwen3_moe def_layers=17 layer_gb=1.246 rest_gb=1.245 disk_factor=1.45 ;;
  deepseek_v3) synth_arch=deepseek_v3 def_layers=61 layer_gb=0.338 rest_gb=0.53 disk_factor=1.45 ;;
  kimi_k2_int4)  # INT4 experts become NVFP4 ones of the same size: the export is as large
    synth_arch=kimi_k2 def_layers=61 layer_gb=0.333 rest_gb=0.88 disk_factor=2.05
    skip="${skip:+$skip,}hf,modelopt" ;;
  gpt_oss_mxfp4)  # MXFP4 experts (4.25 bits a value) become NVFP4 ones (4.5): a little larger
    synth_arch=gpt_oss def_layers=36 layer_gb=0.539 rest_gb=1.29 disk_factor=2.1
    skip="${skip:+$skip,}hf,modelopt" ;;
  *) echo "gpu_bench: --arch must be qwen3_moe, deepseek_v3, kimi_k2_int4 or gpt_oss_mxfp4, got $arch" >&2; exit 2 ;;
esac
if [ "$small" = 1 ]; then
  layers=2 seqs=16 seq_len=64 micro_batch=4
  [ "$arch" = kimi_k2_int4 ] && layers=3  # the dense layer 0 and two MoE layers
  [ "$arch" = deepseek_v3 ] && layers=5    # the dense layers 0-2 and two MoE layers
  synth_extra=(--hidden 512 --intermediate 64 --vocab 8192)
  [ "$arch" = deepseek_v3 ] && synth_extra=(--hidden 256 --intermediate 64 --vocab 8192 --experts 32)
  [ "$arch" = kimi_k2_int4 ] && synth_extra=(--hidden 256 --intermediate 64 --vocab 8192)
  [ "$arch" = gpt_oss_mxfp4 ] && synth_extra=(--hidden 256 --intermediate 128 --vocab 8192 --experts 8)
else
  layers=${layers:-$def_layers}
  synth_extra=()
fi
if [ -z "$bin" ]; then
  s=$(command -v strata || true)
  [ -n "$s" ] || { echo "gpu_bench: no strata on PATH; pass --bin DIR" >&2; exit 2; }
  bin=$(dirname "$s")
fi
strata=$bin/strata
if [ -z "$work" ]; then  # the disk-backed folder with the most room (never tmpfs: RAM is no disk)
  best=0
  for d in /var/tmp /tmp "$HOME" "$PWD"; do
    [ -d "$d" ] && [ -w "$d" ] || continue
    [ "$(stat -f -c %T "$d")" = tmpfs ] && continue
    a=$(df -B1 --output=avail "$d" | tail -1 | tr -d ' ')
    [ "$a" -gt "$best" ] && best=$a work=$d/strata_gpu_bench
  done
  [ -n "$work" ] || { echo "gpu_bench: no disk-backed folder found; pass --work DIR" >&2; exit 2; }
fi
[ -x "$bin/make_synthetic" ] || { echo "gpu_bench: $bin/make_synthetic missing" >&2; exit 2; }

mkdir -p "$work" "$out"
logs=$work/logs
rm -rf "$logs" && mkdir -p "$logs"
ckpt=$work/ckpt
cleanup() {
  [ -n "${poller:-}" ] && kill "$poller" 2>/dev/null
  rm -rf "$work/out_"*
  [ "$keep" = 1 ] || rm -rf "$ckpt"
}
trap cleanup EXIT

elapsed() { awk -v a="$t_start" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.0f", b - a}'; }
skipped() {  # step: true when --skip names it or the deadline has passed
  case ",$skip," in *",$1,"*) return 0 ;; esac
  if [ "$deadline" != 0 ] && [ "$(elapsed)" -ge "$deadline" ]; then
    echo "== $1: skipped, ${deadline} s deadline passed"
    notes+=("$1 skipped: the ${deadline} s deadline had passed")
    return 0
  fi
  return 1
}
declare -A R=()  # results by key
notes=()
[ "$arch" = gpt_oss_mxfp4 ] &&
  notes+=("transformers baseline and ModelOpt not run: bench/hf_baseline.py and bench/modelopt_layerwise.py are not yet checked on transformers' MXFP4 loading")
[ "$arch" = kimi_k2_int4 ] &&
  notes+=("transformers baseline and ModelOpt not run: transformers 5.17 has no kimi_k2 model of its own (Kimi ships remote code), and INT4 needs the compressed-tensors package")
say() { echo "== $* (t=$(elapsed) s)"; }

# ---- machine ---------------------------------------------------------------------------------
gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)
R[gpu]=${gpu:-none}
R[cpus]=$(nproc)
R[ram]=$(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)
R[disk]="$(df -h --output=avail "$work" | tail -1 | tr -d ' ') free on $(df --output=source "$work" | tail -1) ($(stat -f -c %T "$work"))"
# The block device's queue and the kernel's writeback settings, which shape the read + write
# floor and strata's loop (docs/PERFORMANCE.md: the floor's lone writer against strata's
# per-layer writeback requests).
dev=$(basename "$(df --output=source "$work" | tail -1)")
q=/sys/class/block/$dev/queue
[ -d "$q" ] || q=/sys/class/block/$(basename "$(readlink -f "/sys/class/block/$dev/..")")/queue
R[io]="read_ahead_kb $(cat "$q/read_ahead_kb" 2>/dev/null || echo ?), max_sectors_kb $(cat "$q/max_sectors_kb" 2>/dev/null || echo ?), nr_requests $(cat "$q/nr_requests" 2>/dev/null || echo ?), scheduler $(sed -n 's/.*\[\(.*\)\].*/\1/p' "$q/scheduler" 2>/dev/null || echo ?); vm dirty_background_ratio $(cat /proc/sys/vm/dirty_background_ratio) dirty_ratio $(cat /proc/sys/vm/dirty_ratio) dirty_background_bytes $(cat /proc/sys/vm/dirty_background_bytes) dirty_expire_centisecs $(cat /proc/sys/vm/dirty_expire_centisecs)"
R[os]=$(. /etc/os-release 2>/dev/null; echo "${PRETTY_NAME:-?}")
R[pyver]=$("$py" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)' 2>/dev/null || echo "no torch")
R[strata]=$("$strata" --version 2>/dev/null | head -1)
say "machine: ${R[gpu]}; ${R[cpus]} CPUs, ${R[ram]}, ${R[disk]} at $work; ${R[os]}; ${R[pyver]}; ${R[strata]}"

# ---- cache control -----------------------------------------------------------------------------
# Decided once: a root shell that may write drop_caches drops the whole page cache; otherwise
# the checkpoint's own pages are evicted.
if sync && echo 3 2>/dev/null >/proc/sys/vm/drop_caches; then
  cache_method="drop_caches (sync, then echo 3 > /proc/sys/vm/drop_caches)"
else
  cache_method="posix_fadvise DONTNEED on every checkpoint file (dd iflag=nocache count=0); drop_caches refused"
fi
drop_cache() {  # then prints the resident share of the checkpoint
  sync
  case "$cache_method" in
    drop_caches*) echo 3 >/proc/sys/vm/drop_caches ;;
    *) for f in "$ckpt"/*; do dd if="$f" iflag=nocache count=0 status=none; done ;;
  esac
  if command -v fincore >/dev/null; then
    fincore -b -n -o RES "$ckpt"/*.safetensors 2>/dev/null |
      awk -v t="${R[ckpt_bytes]:-1}" '{s += $1} END {printf "%.1f%%", 100 * s / t}'
  else  # no fincore: the whole page cache's size, which bounds what of the checkpoint is in it
    awk '/^Cached:/ {printf "page cache %.2f GB", $2 * 1024 / 1e9}' /proc/meminfo
  fi
}
gpu_poll_start() {  # samples memory.used (MiB) every 100 ms into $logs/$1.gpumem
  poller=""
  command -v nvidia-smi >/dev/null || return 0
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 >"$logs/$1.gpumem" 2>/dev/null &
  poller=$!
}
gpu_poll_stop() {  # prints the peak MiB seen
  [ -n "${poller:-}" ] || { printf "n/a"; return; }
  kill "$poller" 2>/dev/null; wait "$poller" 2>/dev/null; poller=""
  sort -n "$logs/$1.gpumem" | tail -1 | tr -d ' \n'
}
secs() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", b - a}'; }

# ---- 1. the checkpoint -----------------------------------------------------------------------
rm -rf "$ckpt" "$work/out_"*
if [ "$small" = 0 ]; then  # the checkpoint, and as much again as an export and the write test take
  need=$(awk -v l="$layers" -v g="$layer_gb" -v r="$rest_gb" -v f="$disk_factor" 'BEGIN {printf "%.0f", (l * g + r) * f + 1}')
  avail=$(df -B1000000000 --output=avail "$work" | tail -1 | tr -d ' ')
  [ "$avail" -ge "$need" ] || { echo "gpu_bench: $work has $avail GB free; the checkpoint and an export need about $need GB (lower --layers)" >&2; exit 1; }
fi
say "generating the checkpoint"
t0=$EPOCHREALTIME
"$bin/make_synthetic" "$ckpt" --arch "$synth_arch" --layers "$layers" "${synth_extra[@]}" 2>&1 | tee "$logs/make_synthetic.log" ||
  { echo "gpu_bench: make_synthetic failed" >&2; exit 1; }
sync
t1=$EPOCHREALTIME
R[gen_s]=$(secs "$t0" "$t1")
R[ckpt_bytes]=$(cat "$ckpt"/*.safetensors | wc -c)  # cheap: these pages are still cached
R[ckpt_gb]=$(awk -v b="${R[ckpt_bytes]}" 'BEGIN {printf "%.2f", b / 1e9}')
R[ckpt_files]=$(ls "$ckpt"/*.safetensors | wc -l)
R[ckpt_desc]=$(sed -n 's/^[^:]*: //p' "$logs/make_synthetic.log" | tail -1)
say "checkpoint: ${R[ckpt_desc]}; ${R[ckpt_gb]} GB in ${R[ckpt_files]} files, written in ${R[gen_s]} s"

# ---- 2. calibration tokens (seeded), JSONL of token ids --------------------------------------
vocab=$(sed -n 's/.*"vocab_size": *\([0-9]*\).*/\1/p' "$ckpt/config.json")
"$py" - "$seqs" "$seq_len" "$vocab" >"$work/tokens.jsonl" <<'PY'
import json, random, sys
n, length, vocab = map(int, sys.argv[1:])
r = random.Random(20261202)
for _ in range(n):
    print(json.dumps([r.randrange(vocab) for _ in range(length)]))
PY
R[tokens]=$((seqs * seq_len))

# ---- 3. bf16 matmul rate ---------------------------------------------------------------------
R[peak_tflops]=""
if [ -n "$gpu" ] && ! skipped peak; then
  say "bf16 matmul rate"
  "$py" "$here/hf_baseline.py" peak >"$logs/peak.json" 2>"$logs/peak.err" &&
    R[peak_tflops]=$("$py" -c 'import json,sys; print("%.1f" % json.load(open(sys.argv[1]))["bf16_matmul_tflops"])' "$logs/peak.json")
  say "bf16 matmul: ${R[peak_tflops]:-failed} TFLOP/s"
fi
R[calib_flops]=$("$py" "$here/hf_baseline.py" flops --config "$ckpt/config.json" --seqs "$seqs" --seq_len "$seq_len")
R[hf_flops]=$("$py" "$here/hf_baseline.py" flops --config "$ckpt/config.json" --seqs "$seqs" --seq_len "$seq_len" --lm_head)

# ---- 4. cold reads -----------------------------------------------------------------------------
R[read_seq_s]="" R[read_par_s]=""
if ! skipped read; then
  R[res_read_seq]=$(drop_cache)
  say "cold read, one cat of every shard in turn (resident before: ${R[res_read_seq]})"
  t0=$EPOCHREALTIME
  cat "$ckpt"/*.safetensors >/dev/null
  R[read_seq_s]=$(secs "$t0" "$EPOCHREALTIME")
  R[res_read_par]=$(drop_cache)
  say "cold read, 8 cats in parallel (resident before: ${R[res_read_par]})"
  t0=$EPOCHREALTIME
  ls "$ckpt"/*.safetensors | xargs -P 8 -n 1 cat >/dev/null
  R[read_par_s]=$(secs "$t0" "$EPOCHREALTIME")
  say "cold read: ${R[read_seq_s]} s sequential, ${R[read_par_s]} s with 8 readers"
fi
# The floor: the faster of the two reads.
R[read_s]=$(awk -v a="${R[read_seq_s]}" -v b="${R[read_par_s]}" 'BEGIN {
  if (a == "" && b == "") print ""; else if (b == "" || (a != "" && a + 0 < b + 0)) print a; else print b }')

# ---- 4b. writing an export's worth of bytes -----------------------------------------------------
# What the export costs the disk: as many bytes as strata's output (bf16 except the NVFP4
# experts), taken from the checkpoint's own shards so the data is not compressible zeros, staged
# in /dev/shm (RAM) first so only the write touches the disk; written with one fsync at the end
# (strata fsyncs every shard). Then the same write while the checkpoint is read cold in
# parallel: the floor of a run that must read everything and write its export on one disk.
R[export_est]=$("$py" "$here/hf_baseline.py" export_bytes --config "$ckpt/config.json")
stage=/dev/shm/strata_gpu_bench_export
# The floor: the staged export bytes written (fsync at the end) while 8 readers read the
# checkpoint cold; prints its seconds.
rw_floor() {
  local t0=$EPOCHREALTIME wpid
  dd if="$stage" of="$work/write_test" bs=64M conv=fsync status=none &
  wpid=$!
  ls "$ckpt"/*.safetensors | xargs -P 8 -n 1 cat >/dev/null
  wait "$wpid"
  secs "$t0" "$EPOCHREALTIME"
  rm -f "$work/write_test"
}
R[write_s]="" R[rw_s]=""
if ! skipped write; then
  if [ -d /dev/shm ] && [ "$(df -B1 --output=avail /dev/shm | tail -1 | tr -d ' ')" -gt "$((R[export_est] + (1 << 30)))" ]; then
    cat "$ckpt"/*.safetensors | head -c "${R[export_est]}" >"$stage"
    drop_cache >/dev/null
    say "write $(awk -v b="${R[export_est]}" 'BEGIN {printf "%.2f", b / 1e9}') GB (an export's size) with fsync"
    t0=$EPOCHREALTIME
    dd if="$stage" of="$work/write_test" bs=64M conv=fsync status=none
    R[write_s]=$(secs "$t0" "$EPOCHREALTIME")
    rm -f "$work/write_test"
    R[res_rw]=$(drop_cache)
    say "cold read (8 readers) and that write at once (resident before: ${R[res_rw]})"
    R[rw_s]=$(rw_floor)
    [ "$pairs" -gt 1 ] || rm -f "$stage"
    say "write ${R[write_s]} s alone, read + write ${R[rw_s]} s"
  else
    notes+=("write floor not measured: /dev/shm lacks room for the export's bytes")
  fi
fi

# ---- 5. the transformers baseline --------------------------------------------------------------
hf_device=cuda
[ -n "$gpu" ] || hf_device=cpu  # only with --small: a toy run of the harness
if { [ -n "$gpu" ] || [ "$small" = 1 ]; } && ! skipped hf; then
  R[res_hf]=$(drop_cache)
  say "transformers baseline (resident before: ${R[res_hf]})"
  gpu_poll_start hf
  hf_limit=$hf_timeout
  if [ "$deadline" != 0 ]; then
    left=$((deadline - $(elapsed)))
    [ "$left" -lt "$hf_limit" ] && hf_limit=$((left > 30 ? left : 30))
  fi
  timeout -k 10 "$hf_limit" "$py" "$here/hf_baseline.py" run --model "$ckpt" \
    --tokens "$work/tokens.jsonl" --micro_batch "$micro_batch" --device "$hf_device" \
    --json "$logs/hf.json" >"$logs/hf.log" 2>&1
  rc=$?
  R[hf_gpu_mib]=$(gpu_poll_stop hf)
  if [ $rc = 0 ]; then
    eval "$("$py" - "$logs/hf.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print("R[hf_load_s]=%.2f R[hf_fwd_s]=%.2f R[hf_total_s]=%.2f" % (r["load_s"], r["forward_s"], r["total_s"]))
print("R[hf_alloc_gib]=%.1f R[hf_linears]=%d R[hf_experts]=%d R[hf_grouped]=%d R[hf_finite]=%s" % (
    r["peak_gpu_bytes"] / 2**30, r["linear_hooks"], r["experts_modules_hooked"],
    r["grouped_matmuls_recorded"], r["amax_finite"]))
PY
)"
    say "transformers: load ${R[hf_load_s]} s, forward ${R[hf_fwd_s]} s"
  elif [ $rc = 124 ] || [ $rc = 137 ]; then
    notes+=("transformers baseline stopped at its $hf_limit s limit (--hf_timeout, --deadline): it takes longer than that")
  else
    R[hf_total_s]="failed"
    notes+=("transformers baseline failed (rc $rc): $(tail -1 "$logs/hf.log")")
    tail -20 "$logs/hf.log"
  fi
fi

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a + 0 > 0 && b + 0 > 0) printf "%.2f", a / b; else printf "" }'; }
# ---- 6. strata, unconstrained and capped -------------------------------------------------------
help=$("$strata" quantize --help 2>&1 || true)
has_device=0 has_cap=0
grep -q -- "--device" <<<"$help" && has_device=1
grep -q -- "--max_gpu_memory_gb" <<<"$help" && has_cap=1
# --max_gpu_memory_gb counts GiB: a tenth of the checkpoint, rounded down to 0.01 GiB.
# (At least 0.01: 0 would mean no cap.)
[ -n "$cap_gb" ] || cap_gb=$(awk -v b="${R[ckpt_bytes]}" 'BEGIN {c = int(b / 2^30 / 10 * 100) / 100; printf "%.2f", c < 0.01 ? 0.01 : c}')
R[cap_gb]=$cap_gb
# Process start on its own: `strata --version` with the page cache dropped (the binary and the
# CUDA libraries it loads read from disk, as in the runs below) and again warm.
drop_cache >/dev/null
t0=$(date +%s.%N); "$strata" --version >/dev/null 2>&1; t1=$(date +%s.%N)
"$strata" --version >/dev/null 2>&1; t2=$(date +%s.%N)
R[start_cold_s]=$(secs "$t0" "$t1") R[start_warm_s]=$(secs "$t1" "$t2")
# cuda where the strata binary $1 has the CUDA backend and nvidia-smi found a GPU, else cpu (a
# CPU-only strata, or --small on a machine without a GPU).
strata_device() {
  if [ -n "$gpu" ] && "$1" --version 2>/dev/null | grep -q "CUDA backend built"; then echo cuda; else echo cpu; fi
}
run_strata() {  # name, extra flags... (RUN_BIN: another strata binary; KEEP_OUT=1: keep the export)
  local name=$1; shift
  local strata=${RUN_BIN:-$strata}
  local args=(quantize --model "$ckpt" --export_path "$work/out_$name" --recipe nvfp4_experts_only-kv_fp8
    --calib_data "$work/tokens.jsonl" --calib_size "$seqs" --calib_seq "$seq_len" --calib_min_tokens 1)
  [ -n "$batch_size" ] && args+=(--batch_size "$batch_size")
  [ "$has_device" = 1 ] && args+=(--device "$(strata_device "$strata")")
  args+=("${strata_flags[@]}" "$@")
  R[res_$name]=$(drop_cache)
  say "strata $name: ${args[*]} (resident before: ${R[res_$name]})"
  echo "$strata ${args[*]}" >"$logs/strata_$name.cmd"
  gpu_poll_start "strata_$name"
  local t0=$EPOCHREALTIME
  "$strata" "${args[@]}" >"$logs/strata_$name.log" 2>&1
  local rc=$? t1=$EPOCHREALTIME
  R[${name}_s]=$(secs "$t0" "$t1")
  R[${name}_gpu_mib]=$(gpu_poll_stop "strata_$name")
  if [ $rc != 0 ]; then
    notes+=("strata $name failed (rc $rc): $(tail -1 "$logs/strata_$name.log")")
    R[${name}_s]="failed"
    tail -20 "$logs/strata_$name.log"
  else
    R[${name}_out_gb]=$(du -sb "$work/out_$name" | awk '{printf "%.2f", $1 / 1e9}')
    # strata's own report (GPU engine): "GPU: peak device memory X GiB of Y GiB; waited A s for
    # weights, B s computing"; peak RSS from the CLI's last lines.
    R[${name}_own_gib]=$(sed -n 's/.*peak device memory \([0-9.]*\) GiB.*/\1/p' "$logs/strata_$name.log" | tail -1)
    R[${name}_compute_s]=$(sed -n 's/.* \([0-9.]*\) s computing.*/\1/p' "$logs/strata_$name.log" | tail -1)
    R[${name}_wait_s]=$(sed -n 's/.*waited \([0-9.]*\) s for weights.*/\1/p' "$logs/strata_$name.log" | tail -1)
    R[${name}_rss_mib]=$(sed -n 's/^peak RSS \([0-9.]*\) MiB.*/\1/p' "$logs/strata_$name.log" | tail -1)
    # strata's memory bound beside it (docs/QUANTIZE.md "Memory and progress"); a peak above it
    # is flagged in the notes.
    R[${name}_bound_mib]=$(sed -n 's/^peak RSS .*; bound \([0-9.]*\) MiB.*/\1/p' "$logs/strata_$name.log" | tail -1)
    if [ -n "${R[${name}_rss_mib]}" ] && [ -n "${R[${name}_bound_mib]}" ] &&
      awk -v p="${R[${name}_rss_mib]}" -v b="${R[${name}_bound_mib]}" 'BEGIN { exit !(p > b) }'; then
      R[${name}_bound_mib]="${R[${name}_bound_mib]} (EXCEEDED)"
      notes+=("strata $name: peak RSS ${R[${name}_rss_mib]} MiB above its memory bound: $(grep -m1 '^memory bound: ' "$logs/strata_$name.log")")
    fi
    # Wall time per phase, from the summary's "time ..." and "layers ..." lines.
    R[${name}_phases]=$(sed -n 's/^time //p' "$logs/strata_$name.log" | tail -1)
    R[${name}_layer_phases]=$(sed -n 's/^layers \([0-9.]* s = .*\)/\1/p' "$logs/strata_$name.log" | tail -1)
    R[${name}_head_thread]=$(sed -n 's/^export head on its own thread: \(.*\)/\1/p' "$logs/strata_$name.log" | tail -1)
    R[${name}_startup_steps]=$(sed -n 's/^strata: info: start-up steps: //p' "$logs/strata_$name.log" | tail -1)
    R[${name}_finish_steps]=$(sed -n 's/^finish steps: //p' "$logs/strata_$name.log" | tail -1)
    # The time outside strata's own clock (--profile): from the process's start to its clock's,
    # and from its last line (epoch E) to the process's end here (the exit).
    R[${name}_outside]=$(sed -n 's/^process: the run.s clock started \([0-9.]*\) s after .* at epoch \([0-9.]*\)$/\1 \2/p' \
      "$logs/strata_$name.log" | tail -1 | awk -v t1="$t1" 'NF == 2 {
        printf "the process start to the run clock %.2f s; its last line to its end (the exit) %.2f s", $1, t1 - $2 }')
    # --profile (strata's --gpu_profile): device time by part of the forward.
    R[${name}_profile]=$(sed -n 's/^strata: info: GPU profile: //p; s/^strata: info:   \(.*\)/\1/p' "$logs/strata_$name.log" | paste -sd';' | sed 's/;/; /g')
    # and the disk's traffic by phase and each half second (core/disk_timeline.h).
    R[${name}_disk]=$(grep '^disk, \|^disk GB/s each' "$logs/strata_$name.log" | sed 's/^/  /')
  fi
  [ "${KEEP_OUT:-0}" = 1 ] || rm -rf "$work/out_$name"
  say "strata $name: ${R[${name}_s]} s"
}
# With --before: the other build's run of step $1 first (export kept), then this build's, and the
# two exports compared file by file.
run_pair() {  # name, extra flags...
  local name=$1
  if [ -z "$before" ]; then
    run_strata "$@"
    return
  fi
  RUN_BIN=$before/strata KEEP_OUT=1 run_strata "${name}_before" "${@:2}"
  KEEP_OUT=1 run_strata "$@"
  if [ -d "$work/out_${name}_before" ] && [ -d "$work/out_$name" ]; then
    # The run record (strata_run.json) names the strata version; a build before it has none.
    if diff -rq -x strata_run.json "$work/out_${name}_before" "$work/out_$name" >"$logs/identity_$name.log" 2>&1; then
      R[${name}_identical]="byte-identical ($(ls "$work/out_$name" | wc -l) files)"
    else
      R[${name}_identical]="DIFFERENT: $(head -3 "$logs/identity_$name.log" | tr '\n' ' ')"
    fi
    notes+=("--before $before, $name: ${R[${name}_before_s]} s before, ${R[${name}_s]} s now ($(ratio "${R[${name}_s]}" "${R[${name}_before_s]}") x); exports ${R[${name}_identical]}")
  fi
  rm -rf "$work/out_${name}_before" "$work/out_$name"
}
if [ "$has_device" = 0 ] && [ "$small" = 0 ]; then
  notes+=("strata not run: this strata has no --device (no GPU engine); a CPU run of this size takes hours")
elif ! skipped strata; then
  # The compare step needs the unconstrained run's export (kept for it, deleted after).
  if ! skipped free; then
    if [ -z "$before" ] && ! skipped compare; then KEEP_OUT=1 run_pair free; else run_pair free; fi
  fi
  if [ "$has_cap" = 1 ]; then
    skipped strata || run_pair capped --max_gpu_memory_gb "$cap_gb"
  else
    notes+=("capped run not made: this strata has no --max_gpu_memory_gb")
  fi
fi

# ---- 6a. more (floor, strata) pairs (--pairs) ---------------------------------------------------
pair_lines=()
if [ "$pairs" -gt 1 ]; then
  if [ -z "${R[rw_s]}" ] || [ ! -f "$stage" ] || skipped strata; then
    notes+=("--pairs $pairs: not run (needs the write step's floor and the strata runs)")
  else
    pair_names=()
    skipped free || pair_names+=(free)
    [ "$has_cap" = 1 ] && pair_names+=(capped)
    declare -A alt_of=()
    if [ -n "$alt" ] && [ "$has_cap" = 1 ]; then
      IFS='|' read -r -a alt_sets <<<"$alt"
      for k in "${!alt_sets[@]}"; do
        name=alt
        [ "$k" -gt 0 ] && name=alt$((k + 1))
        alt_of[$name]=${alt_sets[$k]}
        pair_names+=("$name")
        read -r -a alt_flags <<<"${alt_of[$name]}"
        run_strata "$name" --max_gpu_memory_gb "$cap_gb" "${alt_flags[@]}"  # pair 1's
        notes+=("--alt: $name is strata capped with ${alt_of[$name]} added, in every pair")
      done
    fi
    for name in "${pair_names[@]}"; do
      [ -n "${R[${name}_s]:-}" ] && [ "${R[${name}_s]}" != failed ] &&
        R[pair_${name}_ratios]=$(ratio "${R[${name}_s]}" "${R[rw_s]}")
    done
    pair_lines+=("pair 1: floor ${R[rw_s]} s$(for name in "${pair_names[@]}"; do printf '; %s %s s (%s x)' "$name" "${R[${name}_s]:-?}" "$(ratio "${R[${name}_s]:-}" "${R[rw_s]}")"; done)")
    for ((i = 2; i <= pairs; i++)); do
      skipped "pair $i" && break
      drop_cache >/dev/null
      say "pair $i: the read + write floor"
      f=$(rw_floor)
      line="pair $i: floor $f s"
      for name in "${pair_names[@]}"; do
        case $name in
          capped) run_strata "capped_$i" --max_gpu_memory_gb "$cap_gb" ;;
          alt*)
            read -r -a alt_flags <<<"${alt_of[$name]}"
            run_strata "${name}_$i" --max_gpu_memory_gb "$cap_gb" "${alt_flags[@]}"
            ;;
          *) run_strata "free_$i" ;;
        esac
        r=$(ratio "${R[${name}_${i}_s]}" "$f")
        line+="; $name ${R[${name}_${i}_s]} s (${r:-?} x)"
        [ -n "$r" ] && R[pair_${name}_ratios]="${R[pair_${name}_ratios]:-} $r"
      done
      pair_lines+=("$line")
    done
    for name in "${pair_names[@]}"; do
      med=$(echo ${R[pair_${name}_ratios]:-} | tr ' ' '\n' | sort -n | awk '{v[NR] = $1} END {if (NR) printf "%.2f", (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}')
      pair_lines+=("median of $name x its floor over the pairs: ${med:-?} (${R[pair_${name}_ratios]:-none})")
    done
  fi
fi
rm -f "$stage"

# ---- 6b. strata compare of the source with that export (issue 20) -------------------------------
# `strata compare SRC EXPORT --device cuda` on the first 8 calibration sequences (compare's default
# 8 x 512 tokens at full size), cold cache, timed against the unconstrained quantize run: issue
# 20's goal is at most 2 x its time. Without a GPU or the CUDA backend (--small on a CPU machine)
# it runs on the CPU.
if [ -d "$work/out_free" ]; then
  head -8 "$work/tokens.jsonl" >"$work/compare_tokens.jsonl"
  cargs=(compare "$ckpt" "$work/out_free" --tokens "$work/compare_tokens.jsonl" --json "$logs/compare.json")
  "$strata" compare --help 2>&1 | grep -q -- "--device" && cargs+=(--device "$(strata_device "$strata")")
  R[res_compare]=$(drop_cache)
  say "strata compare: ${cargs[*]} (resident before: ${R[res_compare]})"
  echo "$strata ${cargs[*]}" >"$logs/strata_compare.cmd"
  gpu_poll_start strata_compare
  t0=$EPOCHREALTIME
  "$strata" "${cargs[@]}" >"$logs/strata_compare.log" 2>&1
  rc=$?
  R[compare_s]=$(secs "$t0" "$EPOCHREALTIME")
  R[compare_gpu_mib]=$(gpu_poll_stop strata_compare)
  if [ $rc != 0 ]; then
    notes+=("strata compare failed (rc $rc): $(tail -1 "$logs/strata_compare.log")")
    R[compare_s]="failed"
    tail -20 "$logs/strata_compare.log"
  else
    R[compare_kl]=$(sed -n 's/^  mean \([^ ]*\) .*/\1/p' "$logs/strata_compare.log" | head -1)
    R[compare_top1]=$(sed -n 's/^top-1 agreement \([0-9.]*\).*/\1/p' "$logs/strata_compare.log" | head -1)
    R[compare_device]=$(sed -n 's/.*(layers on \([a-z]*\)).*/\1/p' "$logs/strata_compare.log" | head -1)
  fi
  rm -rf "$work/out_free"
  say "strata compare: ${R[compare_s]} s"
fi

# ---- 6c. the peer: ModelOpt layerwise calibration with offload, at the capped run's memory ----
# bench/modelopt_layerwise.py, cold cache, with the GPU capped at --max_gpu_memory_gb's GiB (without
# a GPU, --small: host memory capped, the rest offloaded to disk). Stopped at --modelopt_timeout or
# the deadline, whichever comes first; then its per-layer lines say how far it got.
R[mo_s]=""
mo_ready() {  # installs the wheels once, puts them on PYTHONPATH for the rest of this script
  [ -n "$wheels" ] || { if [ -d "$here/../.whl" ]; then wheels=$here/../.whl; else wheels=-; fi; }
  . "$here/../tests/peer/modelopt_env.sh" && modelopt_env "$py" "$wheels" "$work/modelopt_site"
}
if { [ -n "$gpu" ] || [ "$small" = 1 ]; } && ! skipped modelopt; then
  mo_ready >"$logs/modelopt_env.log" 2>&1
  rc=$?
  limit=$modelopt_timeout
  if [ "$deadline" != 0 ]; then
    left=$((deadline - $(elapsed)))
    [ "$left" -lt "$limit" ] && limit=$left
  fi
  if [ $rc != 0 ]; then
    notes+=("ModelOpt not run: $(tail -1 "$logs/modelopt_env.log")")
  elif [ "$limit" -lt 30 ]; then
    notes+=("ModelOpt not run: $limit s left before the ${deadline} s deadline")
  else
    R[mo_version]=$(sed -n 's/^modelopt \([^ ]*\) .*/\1/p' "$logs/modelopt_env.log" | tail -1)
    R[mo_cap]=${R[cap_gb]}
    if [ -z "$gpu" ]; then  # --small on a CPU machine: host memory capped, the rest on disk
      # accelerate keeps room for the largest layer where the model runs, and a toy's tenth holds
      # no layer: then nothing stays on the CPU and ModelOpt's export fails on the meta device.
      R[mo_cap]=$(awk -v b="${R[ckpt_bytes]}" 'BEGIN {printf "%.3f", 0.6 * b / 2^30}')
      notes+=("ModelOpt without a GPU: host memory capped at ${R[mo_cap]} GiB (0.6 of the checkpoint), the rest offloaded to disk")
    fi
    R[res_mo]=$(drop_cache)
    say "ModelOpt layerwise + offload, cap ${R[mo_cap]} GiB, at most $limit s (resident before: ${R[res_mo]})"
    rm -rf "$work/out_modelopt" "$work/modelopt_offload" "$logs/modelopt.json"
    gpu_poll_start modelopt
    t0=$EPOCHREALTIME
    timeout -k 10 "$limit" "$py" "$here/modelopt_layerwise.py" --model "$ckpt" \
      --tokens "$work/tokens.jsonl" --export "$work/out_modelopt" --cap_gib "${R[mo_cap]}" \
      --offload_folder "$work/modelopt_offload" --json "$logs/modelopt.json" \
      >"$logs/modelopt.log" 2>"$logs/modelopt.err"
    rc=$?
    R[mo_s]=$(secs "$t0" "$EPOCHREALTIME")
    R[mo_gpu_mib]=$(gpu_poll_stop modelopt)
    # Progress, from the script's own lines: the load, the last layer calibrated.
    R[mo_load_s]=$(sed -n 's/^modelopt_layerwise: loaded in \([0-9.]*\) s.*/\1/p' "$logs/modelopt.log" | tail -1)
    R[mo_placed]=$(sed -n 's/^modelopt_layerwise: loaded in [0-9.]* s (modules by device: \(.*\))$/\1/p' "$logs/modelopt.log" | tail -1)
    last=$(sed -n 's/^modelopt_layerwise: layer \([0-9]*\)\/[0-9?]* calibrated at \([0-9.]*\) s$/\1 \2/p' "$logs/modelopt.log" | tail -1)
    R[mo_done]=${last%% *} R[mo_layer_at]=${last##* }
    R[mo_layers]=$(sed -n 's/.*"num_hidden_layers": *\([0-9]*\).*/\1/p' "$ckpt/config.json")
    R[mo_per_layer]=$(ratio "${R[mo_layer_at]:-}" "${R[mo_done]:-}")
    # Its JSON is written once the export is done: finished, even where the process's exit was
    # what the limit cut.
    if [ -s "$logs/modelopt.json" ]; then
      [ $rc = 0 ] || notes+=("ModelOpt finished its export but its process ended with rc $rc (the $limit s limit cut its exit)")
      eval "$("$py" - "$logs/modelopt.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print("R[mo_load_s]=%.2f R[mo_calib_s]=%.2f R[mo_export_s]=%.2f R[mo_alloc_gib]=%.2f R[mo_out_gb]=%.2f" % (
    r["load_s"], r["calib_s"], r["export_s"], r["peak_gpu_bytes"] / 2**30, r["export_bytes"] / 1e9))
PY
)"
      R[mo_status]=finished
    elif [ $rc = 124 ] || [ $rc = 137 ]; then
      R[mo_status]="not finished after $limit s"
      notes+=("ModelOpt stopped at its $limit s limit: ${R[mo_done]:-0} of ${R[mo_layers]} layers calibrated")
    else
      R[mo_status]="failed (rc $rc)"
      notes+=("ModelOpt failed (rc $rc): $(grep -v '^\s*$' "$logs/modelopt.err" | tail -1)")
      tail -20 "$logs/modelopt.err"
    fi
    rm -rf "$work/out_modelopt" "$work/modelopt_offload"
    say "ModelOpt: ${R[mo_status]} in ${R[mo_s]} s (load ${R[mo_load_s]:-not done} s, ${R[mo_done]:-0}/${R[mo_layers]} layers)"
  fi
fi

# ---- 7. the table ------------------------------------------------------------------------------
frac() {  # flops, seconds -> percent of the measured bf16 matmul rate
  awk -v f="$1" -v s="$2" -v p="${R[peak_tflops]}" 'BEGIN {
    if (s + 0 > 0 && p + 0 > 0) printf "%.1f%%", 100 * f / s / (p * 1e12); else printf "n/a" }'
}
{
  echo "## GPU benchmark: strata quantize against reading the checkpoint once"
  echo
  echo "machine: ${R[gpu]}; ${R[cpus]} CPUs, ${R[ram]} RAM; disk ${R[disk]}; ${R[os]}; ${R[pyver]}; ${R[strata]:-strata ?}"
  echo "disk queue and writeback: ${R[io]}"
  echo "checkpoint: synthetic ${R[ckpt_desc]}; ${R[ckpt_gb]} GB on disk in ${R[ckpt_files]} files; written in ${R[gen_s]} s ($(ratio "${R[ckpt_gb]}" "${R[gen_s]}") GB/s)"
  echo "calibration: $seqs sequences of $seq_len token ids (seeded), ${R[tokens]} tokens; recipe nvfp4_experts_only-kv_fp8"
  echo "cold cache: ${cache_method:-not needed}"
  echo "bf16 matmul rate (8192^3 torch.matmul, random data, this GPU): ${R[peak_tflops]:-not measured} TFLOP/s"
  echo "calibration forward: $(awk -v f="${R[calib_flops]}" 'BEGIN {printf "%.1f", f / 1e12}') TFLOP of matmuls without lm_head (strata), $(awk -v f="${R[hf_flops]}" 'BEGIN {printf "%.1f", f / 1e12}') with it (transformers computes logits)"
  echo
  echo "| step | wall s | x cold read | peak GPU MiB (nvidia-smi) | notes |"
  echo "|---|---:|---:|---:|---|"
  [ -n "${R[read_seq_s]}" ] && echo "| cold read, cat shard by shard | ${R[read_seq_s]} | $(ratio "${R[read_seq_s]}" "${R[read_s]}") | | $(ratio "${R[ckpt_gb]}" "${R[read_seq_s]}") GB/s; resident before ${R[res_read_seq]} |"
  [ -n "${R[read_par_s]}" ] && echo "| cold read, 8 cats in parallel | ${R[read_par_s]} | $(ratio "${R[read_par_s]}" "${R[read_s]}") | | $(ratio "${R[ckpt_gb]}" "${R[read_par_s]}") GB/s; resident before ${R[res_read_par]} |"
  [ -n "${R[write_s]}" ] && echo "| write $(awk -v b="${R[export_est]}" 'BEGIN {printf "%.2f", b / 1e9}') GB (an export's size), fsync | ${R[write_s]} | $(ratio "${R[write_s]}" "${R[read_s]}") | | $(awk -v b="${R[export_est]}" -v s="${R[write_s]}" 'BEGIN {printf "%.2f", b / 1e9 / s}') GB/s; bytes of the checkpoint's shards, staged in /dev/shm |"
  [ -n "${R[rw_s]}" ] && echo "| cold read (8 readers) and that write at once | ${R[rw_s]} | $(ratio "${R[rw_s]}" "${R[read_s]}") | | the floor of a run that reads everything and writes its export on this disk: $(awk -v c="${R[ckpt_bytes]}" -v e="${R[export_est]}" -v s="${R[rw_s]}" 'BEGIN {printf "%.2f", (c + e) / 1e9 / s}') GB/s read + written; resident before ${R[res_rw]} |"
  for name in free capped; do
    [ -n "${R[${name}_s]:-}" ] || continue
    label="strata, GPU memory unconstrained"
    [ "$name" = capped ] && label="strata, --max_gpu_memory_gb ${R[cap_gb]}"
    t=${R[${name}_s]}
    xhf=$(ratio "$t" "${R[hf_total_s]:-}")
    cs=${R[${name}_compute_s]:-}
    if [ -n "$cs" ]; then fr="$(frac "${R[calib_flops]}" "$cs") of bf16 rate over its ${cs} s computing"
    else fr="$(frac "${R[calib_flops]}" "$t") of bf16 rate over the whole wall time"; fi
    echo "| $label | $t | $(ratio "$t" "${R[read_s]}") | ${R[${name}_gpu_mib]} | own peak ${R[${name}_own_gib]:-?} GiB; waited ${R[${name}_wait_s]:-?} s for weights; $fr; output ${R[${name}_out_gb]:-?} GB; disk $(awk -v c="${R[ckpt_gb]}" -v o="${R[${name}_out_gb]:-0}" -v t="$t" 'BEGIN {printf "%.2f", (c + o) / t}') GB/s read + written over the run; peak RSS ${R[${name}_rss_mib]:-?} MiB, bound ${R[${name}_bound_mib]:-?} MiB; resident before ${R[res_$name]}${xhf:+; x transformers $xhf} |"
  done
  if [ -n "${R[compare_s]:-}" ]; then
    echo "| strata compare of the source with the unconstrained run's export, $(wc -l <"$work/compare_tokens.jsonl") x $seq_len tokens | ${R[compare_s]} | $(ratio "${R[compare_s]}" "${R[read_s]}") | ${R[compare_gpu_mib]} | layers on ${R[compare_device]:-?}; mean KL ${R[compare_kl]:-?}, top-1 ${R[compare_top1]:-?}; $(ratio "${R[compare_s]}" "${R[free_s]:-}") x the quantize run; resident before ${R[res_compare]} |"
  fi
  if [ -n "${R[hf_total_s]:-}" ]; then
    echo "| transformers: load onto the GPU | ${R[hf_load_s]:-} | $(ratio "${R[hf_load_s]:-}" "${R[read_s]}") | | resident before ${R[res_hf]:-} |"
    echo "| transformers: forward with amax hooks | ${R[hf_fwd_s]:-} | $(ratio "${R[hf_fwd_s]:-}" "${R[read_s]}") | | micro-batches of $micro_batch; $(frac "${R[hf_flops]}" "${R[hf_fwd_s]:-}") of bf16 rate; ${R[hf_linears]:-} nn.Linear hooked, ${R[hf_experts]:-} fused experts modules (${R[hf_grouped]:-} grouped matmuls recorded); amax finite: ${R[hf_finite]:-} |"
    echo "| transformers: load + forward | ${R[hf_total_s]} | $(ratio "${R[hf_total_s]}" "${R[read_s]}") | ${R[hf_gpu_mib]:-} | torch peak allocated ${R[hf_alloc_gib]:-} GiB |"
  fi
  if [ -n "${R[mo_s]:-}" ]; then
    # What it got through: the whole run, or the layers done in the time it had and their rate.
    if [ "${R[mo_status]}" = finished ]; then
      mo_note="load ${R[mo_load_s]} s, calibration ${R[mo_calib_s]} s (${R[mo_layers]} layers, $(ratio "${R[mo_calib_s]}" "${R[mo_layers]}") s a layer), export ${R[mo_export_s]} s; output ${R[mo_out_gb]} GB; torch peak allocated ${R[mo_alloc_gib]} GiB"
    else
      if [ -n "${R[mo_load_s]}" ]; then
        mo_note="${R[mo_status]}: load ${R[mo_load_s]} s, ${R[mo_done]:-0} of ${R[mo_layers]} layers calibrated"
      else
        mo_note="${R[mo_status]}: still starting or loading the model"
      fi
      [ -n "${R[mo_per_layer]}" ] && mo_note+=" in ${R[mo_layer_at]} s (${R[mo_per_layer]} s a layer; all ${R[mo_layers]} at that rate: $(awk -v l="${R[mo_load_s]}" -v p="${R[mo_per_layer]}" -v n="${R[mo_layers]}" 'BEGIN {printf "%.0f", l + p * n}') s before the export)"
    fi
    echo "| ModelOpt ${R[mo_version]}: layerwise calibration + offload, $([ -n "$gpu" ] && echo GPU || echo host) memory capped at ${R[mo_cap]} GiB | ${R[mo_s]}$(case "${R[mo_status]}" in finished) ;; "not finished"*) echo " (stopped)" ;; *) echo " (failed)" ;; esac) | $(ratio "${R[mo_s]}" "${R[read_s]}") | ${R[mo_gpu_mib]} | $mo_note; modules by device ${R[mo_placed]:-?}; resident before ${R[res_mo]} |"
  fi
  # strata against each reference, each ratio strata's time over the reference's (below 1: strata
  # is faster). ModelOpt stopped before the end: strata's time over the time ModelOpt had, an upper
  # bound ("<").
  if [ -n "${R[free_s]:-}${R[capped_s]:-}" ]; then
    mo_ref="${R[mo_s]:-}"
    echo
    echo "| strata run | wall s | x cold read | x read + write floor | x transformers (load + forward) | x ModelOpt layerwise + offload |"
    echo "|---|---:|---:|---:|---:|---:|"
    for name in free capped; do
      t=${R[${name}_s]:-}
      [ -n "$t" ] || continue
      label="GPU memory unconstrained"
      [ "$name" = capped ] && label="--max_gpu_memory_gb ${R[cap_gb]}"
      xmo=$(ratio "$t" "$mo_ref")
      case "${R[mo_status]:-}" in
        finished) ;;
        "not finished"*) [ -n "$xmo" ] && xmo="< $xmo (ModelOpt ${R[mo_status]})" ;;
        "") xmo="" ;;
        *) xmo="ModelOpt ${R[mo_status]}" ;;
      esac
      xhf=$(ratio "$t" "${R[hf_total_s]:-}")
      echo "| $label | $t | $(ratio "$t" "${R[read_s]}") | $(ratio "$t" "${R[rw_s]}") | ${xhf:-not run} | ${xmo:-not run} |"
    done
  fi
  echo
  echo "process start (strata --version): ${R[start_cold_s]:-?} s with the page cache dropped, ${R[start_warm_s]:-?} s warm"
  for name in free capped; do
    [ -n "${R[${name}_phases]:-}" ] || continue
    echo
    echo "strata $name, wall time by phase: ${R[${name}_phases]}"
    [ -n "${R[${name}_layer_phases]:-}" ] && echo "strata $name, the layer loop: ${R[${name}_layer_phases]}"
    [ -n "${R[${name}_head_thread]:-}" ] && echo "strata $name, the export head's thread: ${R[${name}_head_thread]}"
    [ -n "${R[${name}_startup_steps]:-}" ] && echo "strata $name, start-up steps: ${R[${name}_startup_steps]}"
    [ -n "${R[${name}_finish_steps]:-}" ] && echo "strata $name, finish steps: ${R[${name}_finish_steps]}"
    [ -n "${R[${name}_outside]:-}" ] && echo "strata $name, outside its own clock: ${R[${name}_outside]}"
    [ -n "${R[${name}_profile]:-}" ] && echo "strata $name, device time (--gpu_profile): ${R[${name}_profile]}"
    [ -n "${R[${name}_disk]:-}" ] && printf 'strata %s, the disk by phase (--gpu_profile):\n%s\n' "$name" "${R[${name}_disk]}"
  done
  echo
  echo "x cold read: against the faster cold read (${R[read_s]:-?} s)."
  if [ -n "${R[capped_s]:-}" ] && [ "${R[capped_s]}" != failed ] && [ -n "${R[read_s]}" ]; then
    r=$(ratio "${R[capped_s]}" "${R[read_s]}")
    echo "goal (capped run, export included, at most 1.3 x the cold read): $r x -> $(awk -v r="$r" 'BEGIN {print (r <= 1.3 ? "met" : "not met")}')"
    if [ -n "${R[rw_s]}" ]; then
      r=$(ratio "${R[capped_s]}" "${R[rw_s]}")
      echo "capped run against the floor of reading and writing the export at once (${R[rw_s]} s): $r x; goal of issue 17 (at most 1.3 x): $(awk -v r="$r" 'BEGIN {print (r <= 1.3 ? "met" : "not met")}')"
    fi
  fi
  if [ -n "${R[rw_s]}" ]; then  # issue 22: both runs at most 1.10 x the floor of this call
    for name in free capped; do
      r=$(ratio "${R[${name}_s]:-}" "${R[rw_s]}")
      [ -n "$r" ] && echo "goal of issue 22 (strata $name at most 1.10 x the read + write floor, ${R[rw_s]} s): $r x -> $(awk -v r="$r" 'BEGIN {print (r <= 1.10 ? "met" : "not met")}')"
    done
  fi
  if [ -n "${R[compare_s]:-}" ] && [ "${R[compare_s]}" != failed ] && [ -n "${R[free_s]:-}" ] && [ "${R[free_s]}" != failed ]; then
    r=$(ratio "${R[compare_s]}" "${R[free_s]}")
    echo "goal of issue 20 (strata compare at most 2 x the unconstrained quantize run, ${R[free_s]} s): $r x -> $(awk -v r="$r" 'BEGIN {print (r <= 2 ? "met" : "not met")}')"
  fi
  if [ ${#pair_lines[@]} -gt 0 ]; then
    echo "floor and strata in pairs (--pairs $pairs; each ratio to the floor measured just before):"
    for l in "${pair_lines[@]}"; do echo "  $l"; done
  fi
  for n in "${notes[@]}"; do echo "note: $n"; done
  echo "total benchmark time: $(elapsed) s"
} >"$out/gpu_bench.md"
cp "$work/tokens.jsonl" "$logs/" 2>/dev/null && gzip -f "$logs/tokens.jsonl"
cp "$ckpt/config.json" "$logs/config.json" 2>/dev/null
tar -C "$work" -czf "$out/gpu_bench_logs.tgz" logs
echo
cat "$out/gpu_bench.md"
