// strata quantize: the main job. Flags follow ModelOpt's hf_ptq.py where they exist.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <optional>
#include <string>
#include <thread>

#include "calib/dataset.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/device_flag.h"
#include "cli/launcher.h"
#include "core/device.h"
#include "core/error.h"
#include "core/log.h"
#include "core/process_clock.h"
#include "core/rss.h"
#include "engine/comm.h"
#include "engine/compare.h"
#include "engine/quantize.h"
#include "engine/quantize_steps.h"
#include "export/modelopt.h"
#include "io/checkpoint.h"
#include "io/hf_config.h"
#include "io/safetensors_writer.h"
#include "io/source_weights.h"
#include "ops/ops.h"

namespace strata::cli {

// AddressSanitizer's shadow memory and quarantine of freed blocks are no part of the memory
// bound: a sanitizer build prints the peak beside the bound without the warning
// (tests/memory_bound.sh does not assert it there either).
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitizerBuild = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kSanitizerBuild = true;
#else
constexpr bool kSanitizerBuild = false;
#endif
#else
constexpr bool kSanitizerBuild = false;
#endif

namespace {

GpuOptions gpu_options(const Args& args) {
  GpuOptions g;
  g.gemm_bf16 = args.choice("--gpu_gemm", "bf16|fp32") == 0;
  g.weight_buffers = args.choice("--gpu_weight_buffers", "auto|1|2");
  g.quantize = args.choice("--gpu_quantize", "on|off") == 0;
  g.warp_attention = args.choice("--gpu_attention", "auto|warp") == 1;
  g.profile = args.flag_set("--gpu_profile");
  g.resume_every_s = args.get_double("--resume_every");
  STRATA_CHECK(g.resume_every_s >= 0 && std::isfinite(g.resume_every_s),
               "--resume_every must be a number of seconds, 0 or more");
  return g;
}

TestHooks test_hooks(const Args& args) {
  TestHooks t;
  if (args.has("--test_activation_budget")) {
    const int64_t b = args.get_int("--test_activation_budget");
    STRATA_CHECK(b >= 0, "--test_activation_budget must not be negative");
    t.activation_budget = static_cast<uint64_t>(b);
  }
  if (args.has("--test_slow_layer_ms")) t.slow_layer_ms = args.get_int("--test_slow_layer_ms");
  STRATA_CHECK(args.has("--test_fail_rank") == args.has("--test_fail_layer"),
               "--test_fail_rank and --test_fail_layer go together");
  if (args.has("--test_fail_rank")) {
    t.fail_rank = static_cast<int>(args.get_int("--test_fail_rank"));
    t.fail_layer = args.get_int("--test_fail_layer");
  }
  t.gpu_host_store = args.flag_set("--test_gpu_host_store");
  t.gpu_split = args.flag_set("--test_gpu_split");
  if (args.has("--test_gpu_expert_slice")) {
    t.gpu_expert_slice = args.get_int("--test_gpu_expert_slice");
    STRATA_CHECK(t.gpu_expert_slice > 0, "--test_gpu_expert_slice must be positive");
  }
  if (args.has("--test_gpu_ranks_exchange"))
    t.gpu_exchange_on_main = args.choice("--test_gpu_ranks_exchange", "thread|main") == 1;
  if (args.has("--test_writeback"))
    t.writeback_per_layer = args.choice("--test_writeback", "layer|none") == 0;
  if (args.has("--test_first_reads"))
    t.first_reads_streams = args.choice("--test_first_reads", "gentle|streams") == 1;
  if (args.has("--test_gpu_read"))
    t.gpu_read = parse_read_pattern("--test_gpu_read", args.get("--test_gpu_read"));
  return t;
}

// The flags of `strata quantize`.
void declare_flags(Args& args) {
  args.option("--model,--pyt_ckpt_path", "DIR", "the Hugging Face checkpoint to quantize");
  args.option("--export_path", "DIR",
              "where to write the quantized checkpoint (created; must be empty unless it holds an "
              "interrupted run of the same command, which is resumed)");
  args.option("--resume_dir", "DIR",
              "where an interrupted run keeps its manifest and the next layer's inputs (default: "
              "<export_path>.strata_resume; removed when the run completes)");
  args.flag("--overwrite",
            "start over: replace the contents of --export_path and drop any resume state");
  args.option("--resume_every", "SECONDS",
              "on the GPU, write the hidden states a resume starts from at most this often (and "
              "at most once per 16 times their size read); a kill redoes about this long. The CPU "
              "path writes them every layer",
              std::to_string(static_cast<int>(GpuOptions{}.resume_every_s)));
  args.option("--qformat", "FORMAT",
              "nvfp4, nvfp4_experts_only, nvfp4_mlp_only, nvfp4_omlp_only, w4a16_nvfp4, fp8, "
              "mxfp8, nvfp4_mla_bf16 or fp8_mla_bf16 (ignored with --recipe)",
              "nvfp4");
  args.option("--kv_cache_qformat", "FORMAT",
              "fp8_cast (hf_ptq's default: constant amax, no k/v scales, no calibration), fp8 "
              "(calibrated k/v scales), fp8_affine (also per-head, per-channel k/v biases), nvfp4, "
              "nvfp4_cast, nvfp4_affine or none (ignored with --recipe)",
              "fp8_cast");
  args.option("--recipe", "NAME|PATH",
              "a built-in recipe (<qformat>-kv_<kv>, general/ptq/<name> or "
              "models/<org>/<model>/ptq/<name>; strata recipes lists them) or a recipe YAML file");
  args.option(
      "--calib_data", "A[,B...]",
      "calibration data: token-id JSONL, JSONL with a text field, or text files; default: the "
      "bundled corpus (needs the model's tokenizer)");
  args.option("--calib_size", "N[,M...]", "sequences to take from each --calib_data source", "256");
  args.option("--calib_seq", "N", "tokens per calibration sequence at most", "512");
  args.option("--calib_text_field", "NAME", "the text field of JSONL records", "text");
  args.option("--calib_min_tokens", "N",
              "skip (and count) calibration sequences shorter than this (1: every sample, as "
              "ModelOpt)",
              "1");
  args.option("--min_expert_tokens", "N",
              "the summary lists, per MoE layer, the routed experts that fewer than N calibration "
              "tokens reached (their input scales rest on little data)",
              "16");
  args.option("--calib_precision", "fp32_layers|bf16_ops",
              "how the calibration forward rounds: fp32_layers (default) computes each decoder "
              "layer in fp32 (on the GPU with bf16 GEMM inputs) and rounds to bf16 between layers, "
              "closer to the exact model; bf16_ops rounds to bf16 after every op as the bf16 "
              "PyTorch model does, which ModelOpt calibrates, for its input and KV scales",
              "fp32_layers");
  args.option("--batch_size", "N", "calibration sequences per micro-batch", "8");
  args.option("--seed", "N", "seed of the calibration sampling", "1234");
  args.option("--max_shard_size_gb", "GB", "largest output shard", "5");
  args.option("--max_cpu_memory_gb", "GB",
              "host memory the run may use: the calibration hidden states spill to "
              "--offload_folder when they do not fit beside one layer; a run that cannot fit "
              "even so is refused before it starts (0: no cap)",
              "0");
  args.option("--offload_folder", "DIR",
              "where spilled calibration hidden states go (default: the resume folder)");
  args.flag("--exact_mxfp4",
            "MXFP4 source weights given NVFP4 are converted in closed form, exactly (no weight "
            "calibration; docs/SOURCES.md says when it applies); default: requantize them");
  args.option("--device", "cpu|cuda",
              "where the calibration forward runs: cuda reads each layer into GPU memory and runs "
              "it there (default: cuda when strata was built with CUDA and a GPU is visible, else "
              "cpu)");
  args.option("--max_gpu_memory_gb", "GB",
              "GPU memory in GiB the run may use (one or two layers' weights, working set, and "
              "the calibration hidden states when they fit; else they stay in host memory) (0: "
              "the GPU's free memory)",
              "0");
  // The GPU path's switches (docs/CUDA.md): benchmarks and comparisons; none changes a byte of
  // the export but --gpu_gemm.
  args.option("--gpu_gemm", "bf16|fp32",
              "GEMM inputs of the GPU forward (fp32 accumulation either way); fp32 is slower and "
              "closer to the CPU's fp32 forward",
              "bf16");
  args.option("--gpu_weight_buffers", "auto|1|2",
              "device buffers for layer weights: 2 copy layer l+1 in while layer l computes, 1 "
              "leaves their memory to larger chunks; auto chooses from --max_gpu_memory_gb",
              "auto");
  args.option("--gpu_quantize", "on|off",
              "quantize the weights on the GPU (on) or on the CPU, from the layer's source (off); "
              "the bytes are the same",
              "on");
  args.option("--gpu_attention", "auto|warp",
              "attention on the GPU: auto uses batched GEMMs for the scores when they fit, warp "
              "always the warp-per-query kernel",
              "auto");
  args.flag("--gpu_profile",
            "log the GPU device time of each part of the forward (timing events cost a little)");
  // Test hooks, not in --help (docs/QUANTIZE.md "Test and benchmark switches").
  args.hidden_option("--test_activation_budget", "BYTES",
                     "the activation store's budget instead of the one --max_cpu_memory_gb "
                     "leaves (1: every micro-batch spills)");
  args.hidden_option("--test_slow_layer_ms", "MS",
                     "every step sleeps this long between writing and committing");
  args.hidden_option("--test_fail_rank", "R", "rank R fails at --test_fail_layer");
  args.hidden_option("--test_fail_layer", "L", "the layer at which --test_fail_rank fails");
  args.hidden_flag("--test_gpu_host_store",
                   "the GPU path keeps the hidden states in host memory, one micro-batch per "
                   "chunk");
  args.hidden_flag("--test_gpu_split",
                   "the GPU path runs chunks of sequences of one micro-batch, as when one "
                   "micro-batch does not fit beside a layer");
  args.hidden_option("--test_gpu_expert_slice", "N",
                     "the GPU path decompresses a compressed source's routed experts N at a "
                     "time, as when a layer's decompressed experts do not fit");
  args.hidden_option("--test_gpu_ranks_exchange", "thread|main",
                     "where GPU ranks exchange a layer's shares");
  args.hidden_option("--test_writeback", "layer|none",
                     "after each layer not recorded for resume, ask for its shards' writeback "
                     "(layer) or leave it to the kernel until the next fsync (none)");
  args.hidden_option("--test_first_reads", "gentle|streams",
                     "the GPU path's reads of the first step's tensors once the layers' warmer "
                     "starts: 1 MiB reads on 4 threads (gentle) or 4 sequential streams");
  args.hidden_option("--test_gpu_read",
                     "THREADS[:none|sequential|willneed[:PIECE_MiB[:READ_KiB]]][:wait|nowait]",
                     "the GPU path's page-cache warmer: threads, read hint, piece and read size; "
                     "whether the layer reader waits for it");
  args.option("--eval_data", "FILE",
              "after the run, compare the export with the source on FILE as `strata compare "
              "MODEL EXPORT` does (--tokens FILE for JSONL of token-id lists, else --text FILE: "
              "8 windows of 512 tokens, seed 1234) and print its KL divergence (mean, median, "
              "p99, max), top-1 agreement and both perplexities; each layer runs three times "
              "(docs/COMPARE.md), on --device with --max_gpu_memory_gb and --gpu_gemm (the CPU "
              "where the GPU forward cannot run the model); rank 0 alone under mpirun");
  args.option("--eval_json", "FILE",
              "with --eval_data: also write every number of the comparison as JSON (strata "
              "compare --json's fields)");
  args.flag("--dry-run", "print the plan (formats per module kind, output size, memory) and stop");
  args.option("--log_dir", "DIR",
              "under mpirun: every rank also writes its log to DIR/rank-<r>.log (rank 0 alone "
              "prints progress; see docs/SCALEOUT.md)");
  args.flag("--expert_parallel",
            "under mpirun: split the routed experts of every MoE layer over the ranks (each "
            "reads, runs and writes its range; tokens are sent to their experts' ranks) instead "
            "of every rank holding all of them; CPU ranks, or GPU ranks with the rows over NCCL "
            "(see docs/SCALEOUT.md)");
  args.flag("--quiet,-q", "only warnings and errors");
}

// The job's inputs, which --dry-run needs too: model, recipe, calibration, batching, shards.
QuantizeJob job_inputs(const Args& args) {
  QuantizeJob job;
  job.model_dir = args.get("--model");
  const std::string recipe_name =
      args.get_optional("--recipe")
          .value_or(recipe_name_for(args.get("--qformat"), args.get("--kv_cache_qformat")));
  job.recipe = load_recipe(recipe_name);
  const int64_t calib_seq = args.get_int("--calib_seq");
  STRATA_CHECK(calib_seq > 0, "--calib_seq must be positive");
  job.calib.seq_len = calib_seq;
  job.calib.min_tokens = std::min<int64_t>(args.get_int("--calib_min_tokens"), calib_seq);
  job.calib.text_field = args.get("--calib_text_field");
  job.calib.seed = static_cast<uint64_t>(args.get_int("--seed"));
  job.precision = args.choice("--calib_precision", "fp32_layers|bf16_ops") == 1
                      ? CalibPrecision::kBf16Ops
                      : CalibPrecision::kFp32Layers;
  if (auto data = args.get_optional("--calib_data")) {
    job.calib.sources = parse_calib_sources(*data, args.get("--calib_size"));
  } else {
    job.calib.default_count = args.get_int("--calib_size");
  }
  job.batch_size = args.get_int("--batch_size");
  STRATA_CHECK(job.batch_size > 0, "--batch_size must be positive");
  const double shard_gb = args.get_double("--max_shard_size_gb");
  STRATA_CHECK(shard_gb > 0, "--max_shard_size_gb must be positive");
  job.max_shard_bytes = static_cast<uint64_t>(shard_gb * 1024.0 * 1024.0 * 1024.0);
  job.version = STRATA_VERSION;
  return job;
}

// --dry-run: the plan, printed by rank 0 alone under mpirun; the ranks end.
void print_plan(const QuantizeJob& job) {
  ModelConfig config = read_model_config(job.model_dir);
  Checkpoint ckpt = Checkpoint::open(job.model_dir);
  QuantPlan plan = make_plan(config, ckpt, job.recipe);
  const std::string int4 = int4_shape_mismatch(ckpt);  // what a run checks beside its start
  STRATA_CHECK(int4.empty(), int4);
  const bool print = world(launcher_from_environment()).rank() == 0;  // under mpirun, rank 0 alone
  comm_finalize();
  if (print)
    std::fputs(describe_plan(plan, ckpt, job.calib, config.hidden_size, job.batch_size).c_str(),
               stdout);
}

// --device: where the calibration forward runs (default: cuda when built with CUDA and a GPU is
// visible). Whether a GPU is visible is asked on a helper thread (the CUDA driver's start, 0.1-0.2
// s with the disk idle), which the run reads at its device choice, after the checkpoint's headers;
// a refusal then still comes before anything is written.
void choose_device(const Args& args, QuantizeJob& job) {
  const std::optional<bool> cuda = device_flag(args, false);
  job.device_explicit = cuda.has_value();
  if (!cuda.value_or(cuda_compiled())) return;
  job.device = QuantizeJob::Device::kCuda;
  job.cuda_devices = std::async(std::launch::async, cuda_device_count).share();
}

// The rest of the job: output and resume folders, memory caps, device, GPU switches, test hooks.
void run_options(const Args& args, QuantizeJob& job) {
  job.export_path = args.get("--export_path");
  job.resume_dir = args.get_optional("--resume_dir").value_or("");
  job.overwrite = args.flag_set("--overwrite");
  job.exact_mxfp4 = args.flag_set("--exact_mxfp4");
  job.expert_parallel = args.flag_set("--expert_parallel");
  job.offload_folder = args.get_optional("--offload_folder").value_or("");
  const double mem_gb = args.get_double("--max_cpu_memory_gb");
  STRATA_CHECK(mem_gb >= 0, "--max_cpu_memory_gb must not be negative");
  job.max_cpu_memory_bytes = static_cast<uint64_t>(mem_gb * 1024.0 * 1024.0 * 1024.0);
  choose_device(args, job);
  const double gpu_gb = args.get_double("--max_gpu_memory_gb");
  STRATA_CHECK(gpu_gb >= 0, "--max_gpu_memory_gb must not be negative");
  job.max_gpu_memory_bytes = static_cast<uint64_t>(gpu_gb * 1024.0 * 1024.0 * 1024.0);
  job.gpu = gpu_options(args);
  job.test = test_hooks(args);
}

// Under ranks or with --log_dir: each rank's log prefix and file (DIR/rank-<r>.log), rank 0
// alone logging below warnings. Returns the file, nullptr when none.
std::FILE* open_rank_log(const Args& args, Comm& comm) {
  const int rank = comm.rank(), ranks = comm.size();
  std::FILE* log_file = nullptr;
  if (ranks > 1 || args.get_optional("--log_dir")) {
    if (auto dir = args.get_optional("--log_dir")) {
      std::error_code ec;
      std::filesystem::create_directories(*dir, ec);
      const std::string path = *dir + "/rank-" + std::to_string(rank) + ".log";
      log_file = std::fopen(path.c_str(), "w");
      STRATA_CHECK(log_file, path, ": cannot open the rank's log file; check --log_dir");
    }
    log_set_rank_output(ranks > 1 ? str("rank ", rank, ": ") : std::string(),
                        rank == 0 ? LogLevel::kDebug : LogLevel::kWarn, log_file);
  }
  return log_file;
}

// CPU ranks on one host split its cores, unless OMP_NUM_THREADS says otherwise.
void split_cores(Comm& comm) {
  if (comm.local_size() > 1 && !std::getenv("OMP_NUM_THREADS")) {
    const int cores = static_cast<int>(std::thread::hardware_concurrency());
    ops::set_threads(std::max(1, cores / comm.local_size()));
  }
}

// run_quantize on this rank; with ranks an error on one says why and stops them all.
QuantizeResult run_on_ranks(const QuantizeJob& job, Comm& comm, std::FILE* log_file) {
  const int rank = comm.rank(), ranks = comm.size();
  QuantizeResult r;
  try {
    if (rank == 0 && ranks > 1)
      log_info(ranks, " ranks (", comm.describe(), "), micro-batches split among them");
    r = run_quantize(job);
  } catch (const std::exception& e) {
    if (ranks == 1) throw;
    // Collective: this rank says why, then every rank stops (MPI_Abort), in bounded time.
    const bool bad_input = dynamic_cast<const Error*>(&e) != nullptr;
    std::fprintf(stderr, "strata quantize: error: rank %d of %d: %s%s\n", rank, ranks, e.what(),
                 bad_input ? "" : " (an internal error: a bug in strata, please report it)");
    std::fflush(stderr);
    if (log_file) std::fprintf(log_file, "error: %s\n", e.what()), std::fflush(log_file);
    comm.abort(bad_input ? 1 : 3);
  }
  return r;
}

// What each rank read, peaked at and sent, gathered for rank 0's summary (ranks only).
struct RankStats {
  std::vector<std::string> read_per_rank, rss_per_rank, sent_per_rank;
};
RankStats gather_rank_stats(Comm& comm, const QuantizeResult& r, uint64_t peak_rss) {
  const int ranks = comm.size();
  RankStats s;
  if (ranks > 1) {
    s.read_per_rank = comm.allgather(std::to_string(r.bytes_read));
    s.rss_per_rank = comm.allgather(str(static_cast<double>(peak_rss) / (1024.0 * 1024.0)));
    s.sent_per_rank = comm.allgather(
        str(r.expert_bytes_sent, " ", static_cast<int64_t>(r.expert_exchange_seconds * 1000.0)));
  }
  return s;
}

// Rank 0's summary of the run on stdout.
// One MoE layer's line of the summary: its experts that fewer than `min_tokens` calibration tokens
// reached, with their counts (at most 16 named; none for a layer from an older resume manifest,
// which kept only how many got no token).
// Empty when the layer has none.
std::string scarce_experts_line(const LayerReport& l, int64_t min_tokens) {
  std::vector<std::pair<int64_t, int64_t>> scarce;  // (expert, tokens)
  for (size_t e = 0; e < l.expert_tokens.size(); ++e) {
    if (l.expert_tokens[e] >= 0 && l.expert_tokens[e] < min_tokens)
      scarce.emplace_back(static_cast<int64_t>(e), l.expert_tokens[e]);
  }
  if (scarce.empty() && l.experts_without_tokens == 0) return "";
  std::string line = str("  layer ",
                         std::string(l.layer < 10    ? 2
                                     : l.layer < 100 ? 1
                                                     : 0,
                                     ' '),
                         l.layer, ": ", scarce.size(), " of ", l.experts, " (",
                         l.experts_without_tokens, " without any)");
  constexpr size_t kNamed = 16;
  for (size_t i = 0; i < scarce.size() && i < kNamed; ++i)
    line += str(i == 0 ? ": " : ", ", scarce[i].first, " (", scarce[i].second, ")");
  if (scarce.size() > kNamed) line += str(", and ", scarce.size() - kNamed, " more");
  return line;
}

void print_summary(const QuantizeJob& job, const QuantizeResult& r, uint64_t peak_rss, int ranks,
                   const RankStats& s, int64_t min_expert_tokens) {
  std::printf("quantized %s -> %s with %s in %.1f s%s\n", job.model_dir.c_str(),
              job.export_path.c_str(), r.plan.recipe.name.c_str(), r.seconds,
              r.resumed_at_step > 0 ? " (resumed an interrupted run)" : "");
  if (r.calibrated) {
    std::printf("calibration: %lld sequences, %lld tokens\n",
                static_cast<long long>(r.calib.sequences), static_cast<long long>(r.calib.tokens));
  } else {
    std::printf("calibration: none needed (weight-only formats, no KV cache)\n");
  }
  bool any_experts = false;
  for (const LayerReport& l : r.layers)
    any_experts |= l.experts > 0;
  std::vector<std::string> scarce;  // the MoE layers with such experts
  for (const LayerReport& l : r.layers) {
    if (l.experts == 0) continue;
    std::string line = scarce_experts_line(l, min_expert_tokens);
    if (!line.empty()) scarce.push_back(std::move(line));
  }
  if (any_experts && scarce.empty()) {
    std::printf(
        "experts: every routed expert of every MoE layer reached at least %lld "
        "calibration tokens (--min_expert_tokens)\n",
        static_cast<long long>(min_expert_tokens));
  } else if (any_experts) {
    std::printf(
        "experts that fewer than %lld calibration tokens reached, in the %zu MoE layers that have "
        "any (expert (tokens); --min_expert_tokens):\n",
        static_cast<long long>(min_expert_tokens), scarce.size());
    for (const std::string& line : scarce)
      std::printf("%s\n", line.c_str());
  }
  std::printf("wrote %zu files\n", r.files.size());
  // Wall time per phase (engine/run_times.h): where a slow run spent it.
  std::fputs(r.times.describe().c_str(), stdout);
  std::fputs(r.disk_timeline.c_str(), stdout);
  if (!r.finish_steps.empty()) std::printf("finish steps: %s\n", r.finish_steps.c_str());
  // The bound and the least (docs/QUANTIZE.md "Memory and progress"); the least also as the
  // --max_cpu_memory_gb that runs: with a margin of 1% (at least 2 MiB) for the baseline's
  // variation from run to run (a few hundred KiB measured), rounded up to the thousandth.
  const double to_mib = 1.0 / (1024.0 * 1024.0);
  const double peak = static_cast<double>(peak_rss);
  const double least = static_cast<double>(r.memory.minimum());
  const double least_gb = std::ceil((least + std::max(least / 100.0, 2.0 * 1024.0 * 1024.0)) /
                                    (1024.0 * 1024.0 * 1024.0) * 1000.0) /
                          1000.0;
  std::printf("peak RSS %.1f MiB; bound %.1f MiB%s; least %.1f MiB (--max_cpu_memory_gb %.3f)\n",
              peak * to_mib, static_cast<double>(r.memory.total()) * to_mib,
              r.memory.spilled ? " (activation store spilled)" : "", least * to_mib, least_gb);
  std::printf("memory bound: %s\n", r.memory.describe().c_str());
  if (peak > static_cast<double>(r.memory.total()) && !kSanitizerBuild)
    log_warn("peak RSS ", human_bytes(peak), " exceeded the memory bound ",
             human_bytes(static_cast<double>(r.memory.total())),
             "; please report it with the 'memory bound' line");
  if (ranks > 1) {
    std::printf("ranks: %d; checkpoint bytes read per rank:", ranks);
    uint64_t sum = 0;
    for (const std::string& b : s.read_per_rank) {
      std::printf(" %s", b.c_str());
      sum += std::stoull(b);
    }
    std::printf(" (sum %llu)\n", static_cast<unsigned long long>(sum));
    std::printf("peak RSS per rank, MiB:");
    for (const std::string& m : s.rss_per_rank)
      std::printf(" %.1f", std::stod(m));
    std::printf("\n");
    if (job.expert_parallel) {
      std::printf("expert exchange per rank (bytes sent to other ranks, ms):");
      for (const std::string& x : s.sent_per_rank)
        std::printf(" %s", x.c_str());
      std::printf("\n");
    }
  } else {
    std::printf("checkpoint bytes read: %llu\n", static_cast<unsigned long long>(r.bytes_read));
  }
  // The disk's rate over the whole run, the number to hold against the floor of reading the
  // checkpoint while writing the export (bench/gpu_bench.sh measures that floor). Not for a
  // resumed run, which read only what was left but finished the whole export.
  if (r.resumed_at_step == 0 && r.seconds > 0.0) {
    uint64_t read = r.bytes_read, written = 0;
    if (ranks > 1) {
      read = 0;
      for (const std::string& b : s.read_per_rank)
        read += std::stoull(b);
    }
    for (const std::string& f : r.files) {
      std::error_code ec;
      const uint64_t n = std::filesystem::file_size(std::filesystem::path(job.export_path) / f, ec);
      if (!ec) written += n;
    }
    // Decimal units, as disks are rated.
    auto decimal = [](double b) {
      return b >= 1e9   ? str(format_double("%.2f", b / 1e9), " GB")
             : b >= 1e6 ? str(format_double("%.2f", b / 1e6), " MB")
                        : str(format_double("%.1f", b / 1e3), " kB");
    };
    std::printf("disk: %s read and %s written in %.2f s, %s/s over the run\n",
                decimal(static_cast<double>(read)).c_str(),
                decimal(static_cast<double>(written)).c_str(), r.seconds,
                decimal(static_cast<double>(read + written) / r.seconds).c_str());
  }
}

// --eval_data: the comparison `strata compare MODEL EXPORT --tokens FILE` (a .jsonl file whose
// first record is a list of ids) or `--text FILE` (anything else) runs after the quantization,
// with compare's defaults. Checked here, before any work: the file exists, token ids parse, text
// has the model's tokenizer to read it, and --eval_json's folder exists.
std::optional<CompareJob> eval_job(const Args& args, const QuantizeJob& q) {
  const auto data = args.get_optional("--eval_data");
  const auto json = args.get_optional("--eval_json");
  STRATA_CHECK(data || !json, "--eval_json needs --eval_data");
  if (!data) return std::nullopt;
  namespace fs = std::filesystem;
  STRATA_CHECK(fs::exists(*data), *data,
               ": --eval_data does not exist; give token-id JSONL or text to compare on");
  CompareJob job;
  job.source_dir = q.model_dir;
  bool token_ids = false;
  if (fs::is_regular_file(*data) && data->size() >= 6 &&
      data->compare(data->size() - 6, 6, ".jsonl") == 0) {
    std::ifstream f(*data);
    std::string line;
    while (std::getline(f, line) && line.find_first_not_of(" \t\r") == std::string::npos) {
    }
    const size_t first = line.find_first_not_of(" \t\r");
    token_ids = first != std::string::npos && line[first] == '[';
  }
  if (token_ids) {
    read_token_file(*data);  // its errors now, not after the quantization
    job.token_file = *data;
  } else {
    STRATA_CHECK(fs::exists(fs::path(q.model_dir) / "tokenizer.json") ||
                     fs::exists(fs::path(q.model_dir) / "tiktoken.model"),
                 *data, ": --eval_data is text, and ", q.model_dir,
                 " has no tokenizer (tokenizer.json or tiktoken.model) to read it with; give "
                 "token-id JSONL (one list of ids per line)");
    // strata compare's defaults: --num_seqs 8 --max_tokens 512 --seed 1234.
    job.text.default_count = 8;
    job.text.seq_len = 512;
    job.text.seed = 1234;
    job.text.sources.push_back({*data, job.text.default_count});
  }
  if (json) {
    const fs::path dir = fs::absolute(*json).parent_path();
    STRATA_CHECK(fs::is_directory(dir), *json, ": --eval_json's folder ", dir.string(),
                 " does not exist");
  }
  return job;
}

// Rank 0, after the run: the comparison and its headline numbers in the summary.
void run_eval(CompareJob job, const QuantizeJob& q, const Args& args) {
  job.quantized_dir = q.export_path;
  job.progress = !args.flag_set("--quiet");
  job.cuda = q.device == QuantizeJob::Device::kCuda;
  job.max_gpu_memory_bytes = q.max_gpu_memory_bytes;
  job.gemm_bf16 = q.gpu.gemm_bf16;
  const CompareResult r = run_compare(job);
  if (auto json = args.get_optional("--eval_json"))
    write_file_atomic(*json, compare_json(r).dump(2) + "\n");
  std::printf(
      "evaluation (strata compare %s %s --%s %s, layers on %s): %lld sequences, %lld "
      "tokens\n%s",
      q.model_dir.c_str(), q.export_path.c_str(), job.token_file.empty() ? "text" : "tokens",
      args.get("--eval_data").c_str(), r.device == "cuda" ? "the GPU" : "the CPU",
      static_cast<long long>(r.sequences), static_cast<long long>(r.tokens),
      compare_headline(r).c_str());
}

}  // namespace

int cmd_quantize(const std::vector<std::string>& argv) {
  Args args("quantize",
            "Quantizes a Hugging Face checkpoint into NVIDIA ModelOpt's format (NVFP4, FP8, MXFP8 "
            "weights,\n"
            "calibrated activation scales, FP8 KV cache), one decoder layer at a time, for vLLM, "
            "SGLang and\n"
            "TensorRT-LLM. Calibration is max calibration over the calibration tokens "
            "(docs/QUANTIZE.md).\n"
            "The format comes from --recipe, or from --qformat and --kv_cache_qformat as hf_ptq.py "
            "names them.\n"
            "Under an MPI launcher (mpirun -np N strata quantize ...) N ranks share the work and "
            "write\n"
            "the same bytes as one process (docs/SCALEOUT.md).");
  declare_flags(args);
  if (!args.parse(argv)) return 0;
  if (args.flag_set("--quiet")) log_set_level(LogLevel::kWarn);
  QuantizeJob job = job_inputs(args);
  const int64_t min_expert_tokens = args.get_int("--min_expert_tokens");
  STRATA_CHECK(min_expert_tokens >= 1, "--min_expert_tokens must be at least 1");
  const std::optional<CompareJob> eval = eval_job(args, job);
  if (args.flag_set("--dry-run")) {
    print_plan(job);
    return 0;
  }
  run_options(args, job);
  // Under an MPI launcher (mpirun -np N strata quantize ...) every rank runs this job; an error
  // on any rank ends them all (docs/SCALEOUT.md).
  Comm& comm = world(launcher_from_environment());
  const int rank = comm.rank(), ranks = comm.size();
  job.comm = &comm;
  std::FILE* log_file = open_rank_log(args, comm);
  split_cores(comm);
  // One process with nothing after the run: its resources are left to the exit (QuantizeJob::
  // leave_for_exit), which _Exit below takes without running destructors. Not in sanitizer
  // builds, whose leak check runs at a normal exit.
  job.leave_for_exit = !kSanitizerBuild && !eval && ranks == 1 && comm.describe().empty();
  const QuantizeResult r = run_on_ranks(job, comm, log_file);
  // VmHWM, not getrusage's ru_maxrss: Linux keeps ru_maxrss across exec, so a strata started by
  // a large process (a Python script with torch loaded) would report its parent's peak.
  const uint64_t peak_rss = peak_rss_bytes();
  const RankStats stats = gather_rank_stats(comm, r, peak_rss);
  comm_finalize();
  if (rank != 0) return 0;
  if (r.already_complete) {
    std::printf(
        "%s: already complete (the same command finished it before; its %s matches this "
        "run); nothing to do\n",
        job.export_path.c_str(), kRunRecordName);
  } else {
    print_summary(job, r, peak_rss, ranks, stats, min_expert_tokens);
  }
  std::fflush(stdout);
  if (eval) run_eval(*eval, job, args);
  // --gpu_profile: the time outside the run's clock. bench/gpu_bench.sh takes the exit's share as
  // its own clock at the process's end minus the epoch here.
  if (job.gpu.profile && r.clock_started_after >= 0) {
    std::printf(
        "process: the run's clock started %.3f s after the process began; this line %.3f s "
        "after, at epoch %.3f\n",
        r.clock_started_after, process_age_seconds(), epoch_seconds());
    std::fflush(stdout);
  }
  if (job.leave_for_exit) {
    // Every file is written, synced and renamed; only the streams need flushing.
    std::fflush(nullptr);
    std::_Exit(0);
  }
  return 0;
}

}  // namespace strata::cli
