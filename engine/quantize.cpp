#include "engine/quantize.h"

#include <malloc.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <thread>

#include "core/device.h"
#include "core/disk_timeline.h"
#include "core/error.h"
#include "core/log.h"
#include "core/process_clock.h"
#include "core/progress.h"
#include "core/rss.h"
#include "engine/activation_store.h"
#include "engine/gpu_runner.h"
#include "engine/layer_loop.h"
#include "engine/nccl_comm.h"
#include "engine/parallel.h"
#include "engine/quantize_steps.h"
#include "engine/resume.h"
#include "io/layer_reader.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "io/source_weights.h"
#include "model/forward.h"
#include "ops/ops.h"
#include "quant/fp8.h"
#include "tokenizer/tokenizer.h"

namespace fs = std::filesystem;

namespace strata {
namespace {

uint64_t quantized_bytes(const PlannedModule& m) {
  const uint64_t out = static_cast<uint64_t>(m.shape[0]), in = static_cast<uint64_t>(m.shape[1]);
  switch (m.format) {
    case QFormat::kNvfp4:
      return out * in / 2 + out * in / 16 + 8;
    case QFormat::kW4A16Nvfp4:
      return out * in / 2 + out * in / 16 + 4;
    case QFormat::kFp8:
      return out * in + 8;
    case QFormat::kMxfp8:
      return out * in + out * in / 32;
    case QFormat::kW4A16Nvfp4Bs32:
      return out * in / 2 + out * in / 32 + 4;
    case QFormat::kMxfp4:
      return out * in / 2 + out * in / 32;
    case QFormat::kFp8PbWo:
      return out * in + 4 * ((out + 127) / 128) * ((in + 127) / 128);
    case QFormat::kNone:
      return out * in * static_cast<uint64_t>(dtype_bits(m.dtype)) / 8;
  }
  return 0;
}

// Refusals that need no calibration data, made before any work (prepare_output repeats them).
void check_output_early(const QuantizeJob& job, const std::string& resume_dir) {
  std::error_code ec;
  STRATA_CHECK(fs::weakly_canonical(job.export_path, ec) != fs::weakly_canonical(job.model_dir, ec),
               "--export_path ", job.export_path,
               " is the source checkpoint; choose another directory");
  if (job.overwrite || fs::exists(fs::path(resume_dir) / "manifest.json", ec)) return;
  if (!fs::exists(job.export_path, ec)) return;
  STRATA_CHECK(fs::is_directory(job.export_path, ec), "--export_path ", job.export_path,
               " exists and is not a directory");
  // A finished export: prepare_output compares its run record with this run's identity.
  if (fs::exists(fs::path(job.export_path) / kRunRecordName, ec)) return;
  STRATA_CHECK(fs::is_empty(job.export_path, ec), "--export_path ", job.export_path,
               " is not empty and holds no interrupted strata run to resume; remove it, choose "
               "another directory, or add --overwrite to replace its contents");
}

bool is_empty_dir(const std::string& dir) {
  std::error_code ec;
  return !fs::exists(dir, ec) || (fs::is_directory(dir, ec) && fs::is_empty(dir, ec));
}

void remove_contents(const std::string& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) return;
  for (const auto& e : fs::directory_iterator(dir)) {
    fs::remove_all(e.path(), ec);
    STRATA_CHECK(!ec, e.path().string(), ": cannot remove: ", ec.message());
  }
}

void create_dir(const std::string& dir, const char* what) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec == std::errc::no_space_on_device) throw DiskFullError(dir, 0);
  STRATA_CHECK(!ec && fs::is_directory(dir, ec), what, " ", dir,
               ": cannot create the directory: ", ec.message());
}

// Decides between a fresh run, a resumed one and nothing to do, before anything is written. A
// fresh run starts with an empty export directory and a manifest at step 0. std::nullopt: the
// export is finished and its run record holds this identity (a leftover resume folder without a
// manifest goes; the export is not touched). `check_hidden` says what is wrong with the hidden
// file a manifest names ("" when nothing): a damaged one is never trusted, the run starts over.
std::optional<ResumeState> prepare_output(
    const QuantizeJob& job, const std::string& resume_dir,
    const std::map<std::string, std::string>& identity, int64_t steps,
    const std::function<std::string(const ResumeState&)>& check_hidden) {
  const std::string& out = job.export_path;
  std::error_code ec;
  const fs::path out_c = fs::weakly_canonical(out, ec),
                 src_c = fs::weakly_canonical(job.model_dir, ec);
  STRATA_CHECK(out_c != src_c, "--export_path ", out,
               " is the source checkpoint; choose another directory");
  STRATA_CHECK(!src_c.string().starts_with(out_c.string() + "/"), "--export_path ", out,
               " holds the source checkpoint; choose another directory");
  STRATA_CHECK(!fs::exists(out, ec) || fs::is_directory(out, ec), "--export_path ", out,
               " exists and is not a directory");
  const std::string manifest = (fs::path(resume_dir) / "manifest.json").string();
  if (!job.overwrite) {
    if (std::optional<ResumeState> prev =
            resumed_state(read_resume_manifest(manifest), identity, steps, manifest)) {
      const std::string damage = prev->hidden_file.empty() ? "" : check_hidden(*prev);
      // The shards the manifest vouches for went with a removed --export_path: nothing to
      // continue from.
      const bool out_gone = !fs::is_directory(out, ec);
      if (out_gone && prev->next_step > 0)
        log_warn("--export_path ", out, " was removed after the interrupted run that ", manifest,
                 " records; starting the run over");
      if (!out_gone && damage.empty()) return *prev;
      // Only the latest hidden states are kept, so no later step can be resumed; and a shard
      // that spans the head and later steps may already be renamed complete. Starting over is
      // the point every step's bytes are known to come from.
      if (!damage.empty())
        log_warn((fs::path(resume_dir) / prev->hidden_file).string(), " ", damage,
                 ": the resume state is damaged and not trusted; starting the run over");
    } else if (std::optional<std::map<std::string, std::string>> done =
                   read_run_record((fs::path(out) / kRunRecordName).string())) {
      const std::string changed = identity_changes(*done, identity);
      STRATA_CHECK(changed.empty(), "--export_path ", out,
                   " holds the finished export of another job (changed: ", changed,
                   "); add --overwrite to replace it, or choose another --export_path");
      fs::remove_all(resume_dir, ec);  // what a kill after the manifest's removal left
      return std::nullopt;
    } else {
      STRATA_CHECK(is_empty_dir(out), "--export_path ", out,
                   " is not empty and holds no interrupted strata run to resume; remove it, "
                   "choose another directory, or add --overwrite to replace its contents");
    }
  }
  // Fresh: the manifest goes first, so that the output directory never holds files that no
  // manifest accounts for.
  std::error_code ignored;
  fs::remove(manifest, ignored);
  remove_contents(resume_dir);
  remove_contents(out);
  create_dir(out, "--export_path");
  create_dir(resume_dir, "the resume folder");
  ResumeState fresh;
  fresh.identity = identity;
  fresh.steps = steps;
  write_resume_manifest(manifest, fresh);
  return fresh;
}

// Everything in `dir` not named in `keep` goes: files a kill left behind, or shards the manifest
// does not vouch for.
void remove_except(const std::string& dir, const std::vector<std::string>& keep) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) return;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (std::find(keep.begin(), keep.end(), n) != keep.end()) continue;
    fs::remove_all(e.path(), ec);
    STRATA_CHECK(!ec, e.path().string(), ": cannot remove: ", ec.message());
  }
}

}  // namespace

uint64_t MemoryEstimate::fixed() const {
  const uint64_t copies = calibrated ? 2 : 1;
  return baseline + copies * (layer_weights + layer_source) + workers * quantizer + fused_outputs +
         outside_pages + working + statistics + threads + pinned + device_context;
}

uint64_t MemoryEstimate::total() const {
  return std::max(startup_peak, fixed() + activations);
}

uint64_t MemoryEstimate::minimum() const {
  return std::max(startup_peak, fixed() + activations_one);
}

std::string MemoryEstimate::describe() const {
  const std::string two = calibrated ? "2 x " : "";
  const std::string weights = on_gpu ? "2 x layer codes from the device " : "2 x layer weights ";
  return str(
      human_bytes(total()), " = process baseline ", human_bytes(baseline), " + ",
      calibrated ? str(weights, human_bytes(layer_weights), on_gpu ? "" : " fp32", " + ")
                 : std::string("weight-only, no calibration forward: "),
      two, "layer source pages ", human_bytes(layer_source), " + ", workers,
      " x quantizer temporaries ", human_bytes(quantizer),
      fused_outputs ? str(" + fused expert outputs ", human_bytes(fused_outputs)) : std::string(""),
      " + embedding/lm_head pages ", human_bytes(outside_pages),
      calibrated
          ? str(" + activation store ", human_bytes(activations),
                spilled ? str(" (one micro-batch; all ", human_bytes(activations_all), " spilled)")
                        : std::string(""),
                " + micro-batch working set ", human_bytes(working))
          : std::string(""),
      statistics ? str(" + local_hessian statistics ", human_bytes(statistics)) : std::string(""),
      " + threads ", human_bytes(threads),
      on_gpu
          ? str(" + pinned buffers ", human_bytes(pinned), " + CUDA context ",
                context_measured ? str(human_bytes(device_context), " (measured, + lazy loading)")
                : device_context ? str(human_bytes(device_context), " (allowance)")
                                 : std::string("(measured once it exists)"))
          : std::string(""),
      startup_peak > fixed() + activations ? str("; start-up peaked at ", human_bytes(startup_peak))
                                           : std::string(""));
}

MemoryEstimate estimate_memory(const QuantPlan& plan, const Checkpoint& ckpt,
                               const std::vector<int64_t>& micro_batch_tokens, int64_t seq_len,
                               int64_t hidden_size, bool bf16_store, int expert_ranks,
                               int64_t experts) {
  MemoryEstimate m;
  // With expert parallelism a rank holds at most ceil(E / ranks) of a layer's E routed experts.
  const int64_t held =
      expert_ranks > 1 && experts > 0 ? (experts + expert_ranks - 1) / expert_ranks : experts;
  m.calibrated = needs_activations(plan);
  m.workers = export_workers();
  m.threads =
      kThreadAllowance * (static_cast<uint64_t>(ops::threads()) + m.workers + kHelperThreads) +
      kFirstReadThreads * (kThreadAllowance + kFirstReadBytes);
  std::map<int64_t, std::pair<uint64_t, uint64_t>> layer;  // layer -> (params, source bytes)
  std::map<std::string, uint64_t> fused;  // fused expert projection -> its experts' encoded bytes
  for (const PlannedModule& p : plan.modules) {
    const uint64_t n = static_cast<uint64_t>(p.shape[0] * p.shape[1]);
    // A compressed source is decompressed to bf16 first (io/source_weights.h): 2 bytes a value
    // more, also when the module is written unquantized.
    const uint64_t decompressed = p.source != SourceCompression::kNone ? 2 * n : 0;
    if (p.format != QFormat::kNone)  // fp32 weight, scaled copy, codes
      m.quantizer = std::max(m.quantizer, 3 * n * 4 + decompressed);
    m.quantizer = std::max(m.quantizer, decompressed);
    if (plan.fused_experts && p.kind == TensorKind::kRoutedExperts) {
      const uint64_t encoded = p.format == QFormat::kNone  ? n * dtype_bits(p.dtype) / 8
                               : p.format == QFormat::kFp8 ? n
                                                           : n / 2 + n / 16;
      m.fused_outputs =
          std::max(m.fused_outputs, 2 * (fused[weight_group_key(plan, p.module)] += encoded));
    }
    if (p.layer < 0 || p.layer >= plan.num_layers) continue;
    const uint64_t share = p.kind == TensorKind::kRoutedExperts && held < experts
                               ? n * static_cast<uint64_t>(held) / static_cast<uint64_t>(experts)
                               : n;
    layer[p.layer].first += share;
    layer[p.layer].second += share * static_cast<uint64_t>(dtype_bits(p.dtype)) / 8;
  }
  for (const auto& [l, ps] : layer) {
    if (m.calibrated) m.layer_weights = std::max(m.layer_weights, ps.first * 4);
    m.layer_source = std::max(m.layer_source, ps.second);
  }
  std::map<int64_t, uint64_t> features;  // layer -> input features of its local_hessian modules
  for (const PlannedModule& p : plan.modules) {
    if (local_hessian_tracks(plan, p)) features[p.layer] += static_cast<uint64_t>(p.shape[1]);
  }
  for (const auto& [l, f] : features)
    m.statistics = std::max(m.statistics, 3 * f * 16 * sizeof(double));
  for (const std::string& name : ckpt.tensor_names()) {
    if (name.find(".layers.") != std::string::npos) continue;
    const TensorEntry& e = ckpt.entry(name);
    m.outside_pages = std::max(m.outside_pages, e.end - e.begin);
  }
  if (m.calibrated) {
    const DType d = bf16_store ? DType::kBF16 : DType::kF32;
    m.activations_all = ActivationStore::bytes_for(micro_batch_tokens, hidden_size, d);
    m.activations_one = ActivationStore::largest_batch_bytes(micro_batch_tokens, hidden_size, d);
    m.activations = m.activations_all;
    int64_t tokens = 0;
    for (int64_t t : micro_batch_tokens)
      tokens = std::max(tokens, t);
    // fp32 buffer and ~16 fp32 intermediates per token, plus one sequence's attention scores
    // for 64 heads.
    m.working = static_cast<uint64_t>(tokens) * static_cast<uint64_t>(hidden_size) * 4 * 17 +
                static_cast<uint64_t>(seq_len * seq_len) * 4 * 64;
  }
  return m;
}

std::string describe_plan(const QuantPlan& plan, const Checkpoint& ckpt, const CalibOptions& calib,
                          int64_t hidden_size, int64_t batch_size) {
  std::ostringstream os;
  os << "recipe      " << plan.recipe.name << ": " << plan.recipe.description << "\n";
  os << "kv cache    " << kv_cache_format_name(plan.recipe.kv_cache)
     << (plan.kv_layers.empty()
             ? ""
             : str(" (k/v scales for ", plan.kv_layers.size(), " attention layers)"))
     << "\n";
  // Modules per kind and format.
  std::map<std::string, std::map<std::string, int64_t>> table;
  uint64_t linear_src = 0, linear_out = 0;
  for (const PlannedModule& m : plan.modules) {
    table[std::string(tensor_kind_name(m.kind))][std::string(qformat_name(m.format))]++;
    // What the checkpoint stores for the weight: a compressed source's values and companions.
    for (const char* suffix : {".weight", ".weight_packed", ".weight_scale", ".weight_shape",
                               ".weight_scale_inv", ".weight_blocks", ".weight_scales"}) {
      const std::string t = m.module + suffix;
      if (ckpt.has(t)) linear_src += ckpt.entry(t).end - ckpt.entry(t).begin;
    }
    linear_out += quantized_bytes(m);
  }
  os << "\nlinear modules by kind and format\n";
  for (const auto& [kind, formats] : table) {
    os << "  " << kind;
    for (size_t pad = kind.size(); pad < 16; ++pad)
      os << ' ';
    bool first = true;
    for (const auto& [f, n] : formats) {
      os << (first ? "" : ", ") << n << " " << f;
      first = false;
    }
    os << "\n";
  }
  const uint64_t total_src = ckpt.bytes_on_disk();
  const uint64_t estimate = total_src - std::min(linear_src, total_src) + linear_out;
  os << "\nsource      " << human_bytes(static_cast<double>(total_src)) << " on disk\n";
  os << "output      about " << human_bytes(static_cast<double>(estimate)) << " ("
     << str(static_cast<double>(estimate) / static_cast<double>(std::max<uint64_t>(total_src, 1)))
            .substr(0, 5)
     << "x)\n";
  int64_t sequences = 0;
  for (const CalibSource& s : calib.sources)
    sequences += s.count;
  if (calib.sources.empty()) sequences = calib.default_count;
  std::vector<int64_t> micro_batches;
  for (int64_t s = 0; s < sequences; s += batch_size)
    micro_batches.push_back(std::min(batch_size, sequences - s) * calib.seq_len);
  MemoryEstimate mem = estimate_memory(plan, ckpt, micro_batches, calib.seq_len, hidden_size, true);
  // This process's own RSS stands for the baseline: a run measures its own, which also holds the
  // calibration tokens and the forward (and, on the GPU path, the CUDA context).
  mem.baseline = rss_bytes();
  mem.startup_peak = peak_rss_bytes();
  os << "memory      at most " << mem.describe() << " (CPU path; the run measures its baseline)\n";
  if (mem.calibrated)
    os << "            least with the activation store spilled: " << human_bytes(mem.minimum())
       << "\n";
  for (const std::string& w : plan.warnings)
    os << "warning     " << w << "\n";
  return os.str();
}

namespace {

// One quantize run (run_quantize), as the sequence of its steps. The members are the run's state,
// declared in the order the steps create it, so that they are destroyed in the reverse order.
class QuantizeRun {
 public:
  // `result` outlives the run (the exporter refers to its plan until destroyed).
  QuantizeRun(const QuantizeJob& job, QuantizeResult& result)
      : job(job),
        comm(job.comm ? *job.comm : single),
        lead(comm.rank() == 0),
        result(result),
        gemm_library(job.device == QuantizeJob::Device::kCuda
                         ? gpu_library_preload(job.cuda_devices)
                         : std::shared_future<void>()),
        config(read_model_config(job.model_dir)),
        ckpt(Checkpoint::open(job.model_dir)),
        exchange(comm) {
    // The disk starts at once: while the plan, the exporter and the calibration data are made
    // (seconds on a checkpoint of 200k tensors), the first step's tensors (the embedding, the
    // head) and layer 0's are read into the page cache, where the head's writer, the embedding
    // and the first layer's read find them. Not with ranks (one rank reads what all share) nor
    // when resuming (those steps are done). In 1 MiB reads on 4 threads (io/layer_reader.h
    // PageWarmer; 4 MiB held), so that the start's own small reads and syncs (calibration data,
    // tokenizer, resume record) wait behind at most those: asked all at once (madvise), gigabytes
    // of read-ahead queued ahead of them (measured with the page cache dropped on a Qwen3-MoE
    // shape: the calibration data took 0.50-0.53 s instead of 0.03-0.05 s).
    if (comm.size() == 1 && !fs::exists(resume_dir_of(job))) {
      first_blob = LayerReader(ckpt).plan(first_step_tensors(ckpt));
      ReadPattern early;
      early.threads = static_cast<int>(kFirstReadThreads);
      early.piece_bytes = 16ull << 20;
      early.read_bytes = kFirstReadBytes;
      early.sequential = false;
      first_reads =
          std::make_unique<PageWarmer>(std::vector<LayerBlob>{first_blob}, first_blob.bytes, early);
    }
  }

  // The plan (recipe x checkpoint) and the refusals it allows before any work.
  void resolve_plan();
  // --device: whether the calibration forward runs on the GPU (engine/gpu_runner.h).
  void choose_device();
  // Refusals of --export_path that need no calibration data (rank 0).
  void check_output() const;
  // Expert parallelism (docs/SCALEOUT.md "Expert parallel"), warned about when asked in vain.
  void choose_expert_parallel();
  // The forward and the calibration sequences (only when calibrating).
  void calibration_data();
  // The micro-batches, the memory estimate and, under a cap, whether the store spills.
  void plan_memory();
  // The resume folder and the run's identity; a fresh or a resumed state, agreed by the ranks.
  void prepare_resume();
  // The exporter, its ranks, and the output cleared of what the manifest does not vouch for.
  void open_exporter();
  // The baseline measured again now that the exporter exists; the bound held to the cap.
  void remeasure_baseline();
  // GPU path, single process: the page warmer and the early CUDA setup, started meanwhile.
  void start_gpu_early();
  // "resuming at ..." when the run continues an interrupted one.
  void log_resume() const;
  // Step 0, every tensor outside the decoder layers (the embedding table first): begun on a helper
  // thread (in order with ranks).
  void start_head();
  // The first layer's inputs: the embeddings, or the hidden states the manifest names. A single
  // process on the GPU leaves the embedding to the device placement, which writes it where the
  // hidden states will live (GpuLoop::embed).
  void embed();
  // Steps 1..N, the decoder layers: the layer loop (engine/layer_loop.h) on the placement.
  void run_layers();
  // The index and config files; the resume folder goes; the result's totals.
  void finish();
  // A write refused for want of space: one line naming the file and about how much more space
  // the run needs on that filesystem to finish (docs/QUANTIZE.md "Full disk").
  [[noreturn]] void disk_full(const DiskFullError& e);
  bool lead_rank() const { return lead; }
  void set_disk_timeline(DiskTimeline* d) { disk = d; }

 private:
  // Step `next - 1` is written: make it durable, then record it with the file holding the next
  // layer's inputs ("" when none); the previous inputs' file goes once the manifest is written.
  // Its time is added to `*time` when given.
  void commit(int64_t next, const std::string& hidden_path, const std::string& old_input,
              double* time = nullptr);
  // The exporter of this plan (nothing written yet).
  void make_exporter();
  // Where the layers run: the device, the CPU, or no forward at all (weight-only formats).
  std::unique_ptr<Placement> placement();
  // Waits for the head's step (start_head), which must be recorded before any layer's (the layer
  // loop waits for it itself, before its first write: LayerLoop::wait_head), and for the staged
  // index and config files.
  void wait_head();
  // Throws the INT4 shape check's error, if any (waits for it).
  void check_int4_shapes();
  // Micro-batch b's embedding as the store holds it (its dtype, [T_b, H]).
  void embed_batch(size_t b, void* out) const;
  // The process's RSS and its peak so far into m.baseline and m.startup_peak (core/rss.h), the
  // larger of theirs and the measured; with ranks the largest over the ranks.
  void measure_baseline(MemoryEstimate& m);

  const QuantizeJob& job;
  const std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  PhaseTimer phase;  // laps into result.times (engine/run_times.h)
  SingleComm single;
  Comm& comm;
  const bool lead;  // rank 0 prepares, publishes and finishes the output
  QuantizeResult& result;
  // --device cuda: cuBLAS loaded on a helper thread from the first moment
  // (gpu_library_preload), ahead of the readers; held so that the thread ends with the run.
  std::shared_future<void> gemm_library;
  ModelConfig config;
  Checkpoint ckpt;
  LayerBlob first_blob;                     // the first step's tensors and layer 0's
  std::unique_ptr<PageWarmer> first_reads;  // the early page-cache reads (constructor)
  DiskTimeline* disk = nullptr;             // --gpu_profile: the disk's traffic by phase
  const QuantPlan& plan = result.plan;
  bool on_gpu = false;
  bool expert_parallel = false;
  CommExpertExchange exchange;
  std::unique_ptr<ModelForward> fwd;
  ForwardOptions fopts;
  Calibration calibration;
  MicroBatches micro;
  std::string resume_dir, manifest, offload;
  std::map<std::string, std::string> identity;
  ResumeState state;
  std::optional<ModeloptExporter> exporter;
  std::function<int(const std::string&)> expert_pin;
  std::unique_ptr<PageWarmer> warm;
  std::unique_ptr<GpuEarlySetup> early;  // the CUDA context and pinned buffers, meanwhile
  std::vector<LayerBlob> gpu_blobs;      // on the GPU: every layer's, planned once
  std::future<void> head_written;
  // Rank 0: the export's index and config files written under hidden names beside the first
  // layers (ModeloptExporter::stage_final_files), for the finish to rename.
  std::future<void> final_files;
  // INT4 sources: every module's weight_shape against the shape the plan took from the headers
  // (io/source_weights.h int4_shape_mismatch), read beside the start; joined before the first
  // layer's step is recorded.
  std::future<std::string> int4_shapes;
  // The step and hidden file the run started from: `state` is the head thread's to change
  // until the head is waited for.
  int64_t begin_step = 0;
  std::string begin_hidden;
  bool device_embeds = false;  // embed() left the embedding to the GPU placement
  std::function<int(const std::string&)> owner;
  std::vector<Batch> batches;
  std::unique_ptr<ActivationStore> store;
  int64_t first_layer = 0;
  std::optional<Progress> progress;
  std::vector<Batch> mine;  // GPU ranks: this rank's micro-batches, and their store indices
  std::vector<size_t> mine_ids;
  std::optional<GpuLoop> gpu;  // the device placement's inputs
};

void QuantizeRun::resolve_plan() {
  result.plan = make_plan(config, ckpt, job.recipe);
  for (const std::string& w : plan.warnings)
    log_warn(w);
  for (const PlannedModule& m : plan.modules) {
    const bool outside = m.layer < 0 || m.layer >= plan.num_layers;
    // (The head step, which writes every tensor outside the layers, has no statistics.)
    STRATA_CHECK(!(outside && qformat_has_input_scale(m.format)), plan.recipe.rules[m.rule].origin,
                 " gives '", m.module, "' format ", qformat_name(m.format),
                 ", which needs activation statistics; strata calibrates decoder layers only: use "
                 "w4a16_nvfp4 or exclude it");
  }
  // fp8_pb_wo (quant/fp8.h): a fused group of one-block weights shares one amax; a group mixing
  // one-block and larger weights is refused here, before any work (the exporter checks it too).
  std::map<std::string, std::pair<int, int>> pb_groups;  // key -> (members, one-block members)
  for (const PlannedModule& m : plan.modules) {
    if (m.format != QFormat::kFp8PbWo) continue;
    auto& [members, singles] = pb_groups[weight_group_key(plan, m.module)];
    ++members;
    singles += fp8_pb_single_block(m.shape);
  }
  for (const auto& [key, counts] : pb_groups) {
    STRATA_CHECK(counts.second == 0 || counts.second == counts.first, "fp8_pb_wo: the modules of ",
                 key,
                 " read one input and are partly one 128x128 block and partly more; ModelOpt 0.47 "
                 "unifies such a group's amax only when its first module is one block, and then "
                 "cannot export it; strata refuses (exclude some of them or pick another format)");
  }
  const WeightCalib& algo = plan.recipe.algorithm;
  if (algo.searches()) {
    // gpt-oss's fused experts: NVFP4 block scales are searched block by block as for any module
    // (ModelOpt searches the transposed [E, out, in] tensor, blocks along the input, under the
    // projection's one weight_scale_2); an FP8 multiplier search over the fused tensor is not
    // implemented.
    bool fp8_experts = false;
    for (const PlannedModule& m : plan.modules)
      fp8_experts =
          fp8_experts || (m.kind == TensorKind::kRoutedExperts && m.format == QFormat::kFp8);
    STRATA_CHECK(!plan.fused_experts || algo.fp8_scale_sweep || !fp8_experts, plan.recipe.name,
                 ": algorithm ", weight_calib_method_name(algo.method),
                 " without fp8_scale_sweep searches FP8 weight amaxes, which is not implemented "
                 "for gpt-oss's fused FP8 experts; use fp8_scale_sweep: true or a max recipe");
    STRATA_CHECK(algo.method != WeightCalib::Method::kLocalHessian || comm.size() == 1,
                 plan.recipe.name,
                 ": local_hessian runs in one process (its per-module input statistics are not "
                 "merged across ranks yet); run without mpirun");
  }
  result.calibrated = needs_activations(plan);
}

void QuantizeRun::check_int4_shapes() {
  if (!int4_shapes.valid()) return;
  const std::string wrong = int4_shapes.get();
  if (!wrong.empty()) fail(wrong);
}

void QuantizeRun::choose_device() {
  // --device cuda (engine/gpu_runner.h): its activation store is file-backed (written only at
  // durable steps); the hidden states live on the device or in pinned host memory.
  on_gpu = job.device == QuantizeJob::Device::kCuda && result.calibrated;
  if (job.device == QuantizeJob::Device::kCuda && job.cuda_devices.valid() &&
      job.cuda_devices.get() == 0) {  // the CLI's probe, on its helper thread until now
    STRATA_CHECK(!job.device_explicit, "--device cuda: ", kNoCudaDevice);
    on_gpu = false;
  }
  if (on_gpu) {
    // Checked first, so the refusal names the recipe's CPU-only algorithm whatever the machine has.
    const std::string search_why = device_search_unsupported(plan.recipe.algorithm);
    std::string why = !search_why.empty() ? search_why : gpu_unsupported(config, ckpt);
    if (why.empty() && comm.size() > 1 && job.expert_parallel && !nccl_compiled())
      why = "expert parallelism on GPU ranks needs a strata built with NCCL (docs/SCALEOUT.md)";
    STRATA_CHECK(why.empty() || !job.device_explicit, "--device cuda: ", why, "; use --device cpu");
    if (!why.empty() && lead) log_warn("calibrating on the CPU: ", why);
    on_gpu = why.empty();
  }
  // On the CPU every layer's weights are fp32 blocks of megabytes, made and freed by the forward,
  // the export workers and the writer, each thread in its own glibc arena. glibc's adaptive
  // threshold soon serves such blocks from the arenas, which keep what is freed for their own
  // thread, so the resident set grew arena by arena over the layers: a 4-layer gpt-oss shape
  // peaked at 12.3-12.9 GiB, above its 12.6 GiB bound in two runs of four (7.1-7.6 GiB with
  // blocks of 4 MiB and more mapped and unmapped each time, for about 4% more time; docs/
  // QUANTIZE.md "Memory"). The GPU path keeps its big buffers pinned and is left as it was.
  if (!on_gpu) mallopt(M_MMAP_THRESHOLD, static_cast<int>(kCpuMmapThreshold));
}

void QuantizeRun::check_output() const {
  if (lead) check_output_early(job, resume_dir_of(job));
}

void QuantizeRun::choose_expert_parallel() {
  // Only with ranks, a forward, and routed experts; the routed experts of each layer are then
  // read, run and written by their owner (expert_owner) alone.
  expert_parallel = use_expert_parallel(job.expert_parallel, comm.size(), result.calibrated,
                                        on_gpu && !nccl_compiled(), config.num_experts);
  // A fused tensor holds every expert of a projection and is written by one rank
  // (export/modelopt.h).
  STRATA_CHECK(!expert_parallel || !plan.fused_experts,
               "--expert_parallel: gpt-oss's experts are written fused, one tensor per projection "
               "and layer that one rank writes; run without --expert_parallel (the ranks then "
               "split the work by tensors)");
  if (job.expert_parallel && comm.size() > 1 && !expert_parallel && lead)
    log_warn("--expert_parallel: ",
             config.num_experts == 0 ? "the model has no routed experts"
                                     : "no calibration forward runs (weight-only formats)",
             "; the ranks split the work by tensors");
}

void QuantizeRun::calibration_data() {
  if (expert_parallel) fopts.experts = &exchange;
  fopts.bf16_ops = job.precision == CalibPrecision::kBf16Ops;
  if (!result.calibrated) return;
  fwd = ModelForward::create(config, ckpt, fopts);  // refuses unsupported math before any work
  phase.lap(&result.times.startup);
  std::unique_ptr<Tokenizer> tok;
  const bool has_tokenizer = fs::exists(fs::path(job.model_dir) / "tokenizer.json") ||
                             fs::exists(fs::path(job.model_dir) / "tiktoken.model");
  if (has_tokenizer) tok = std::make_unique<Tokenizer>(Tokenizer::load(job.model_dir));
  calibration = load_calibration(job.calib, tok.get(), fwd->vocab_size());
  result.calib = calibration.report;
  STRATA_CHECK(!calibration.sequences.empty(),
               "no calibration sequences: ", calibration.report.summary());
  log_info("calibration: ", calibration.report.sequences, " sequences, ", calibration.report.tokens,
           " tokens");
  phase.lap(&result.times.calib_data);
}

void QuantizeRun::plan_memory() {
  // Micro-batches: consecutive sequences by index, batch_size at a time.
  micro = group_micro_batches(calibration.sequences, job.batch_size);
  MemoryEstimate m = estimate_memory(plan, ckpt, micro.tokens, micro.longest, config.hidden_size,
                                     fopts.bf16_between_layers, expert_parallel ? comm.size() : 1,
                                     config.num_experts);
  // The process as it stands before the heavy work (binary, libraries, threads, the calibration
  // tokens, the forward); what the run allocates from here on are the estimate's other terms.
  measure_baseline(m);
  if (on_gpu) {
    gpu_blobs = gpu_layer_blobs(config, ckpt, plan.num_layers);
    m = with_gpu_host_memory(m, largest_blob(gpu_blobs, 0));
  }
  // Test hook (tests/engine/spill_test.sh): tiny fixtures spill.
  result.memory = fit_memory_cap(m, job.max_cpu_memory_bytes, job.test.activation_budget);
}

void QuantizeRun::measure_baseline(MemoryEstimate& m) {
  m.baseline = std::max(m.baseline, rss_bytes());
  m.startup_peak = std::max(m.startup_peak, peak_rss_bytes());
  if (comm.size() > 1) {  // the ranks must decide the same spill: the largest of each
    for (const std::string& r : comm.allgather(str(m.baseline, " ", m.startup_peak))) {
      std::istringstream is(r);
      uint64_t base = 0, peak = 0;
      is >> base >> peak;
      m.baseline = std::max(m.baseline, base);
      m.startup_peak = std::max(m.startup_peak, peak);
    }
  }
}

void QuantizeRun::remeasure_baseline() {
  measure_baseline(result.memory);
  check_memory_cap(result.memory, job.max_cpu_memory_bytes, "once the exporter exists");
}

void QuantizeRun::prepare_resume() {
  resume_dir = resume_dir_of(job);
  manifest = (fs::path(resume_dir) / "manifest.json").string();
  // Absolute, so that the manifest names a spill file outside the resume folder unambiguously.
  offload = job.offload_folder.empty()
                ? resume_dir
                : fs::absolute(job.offload_folder).lexically_normal().string();
  identity = run_identity(
      config, ckpt, plan, calibration.sequences,
      str("batch_size=", result.calibrated ? job.batch_size : 0,
          " max_shard_bytes=", job.max_shard_bytes, job.exact_mxfp4 ? " exact_mxfp4" : "",
          on_gpu ? " device=cuda" : "", fopts.bf16_ops ? " calib_precision=bf16_ops" : ""),
      job.version);
  // The hidden file a manifest names, checked against this run's layout and the manifest's
  // checksums.
  auto check_hidden = [this](const ResumeState& s) {
    const int64_t hidden = fwd ? fwd->hidden_size() : config.hidden_size;
    const ActivationStore layout(micro.tokens, hidden,
                                 fopts.bf16_between_layers ? DType::kBF16 : DType::kF32, true,
                                 offload);
    return layout.check((fs::path(resume_dir) / s.hidden_file).string(), s.hidden_sums);
  };
  // Rank 0 decides between a fresh run, a resumed one and a finished export; the other ranks
  // then take its decision and its manifest.
  std::optional<ResumeState> decided;
  if (lead) decided = prepare_output(job, resume_dir, identity, plan.num_layers + 1, check_hidden);
  uint8_t finished = lead && !decided ? 1 : 0;
  comm.barrier();
  comm.broadcast(&finished, 1, 0);
  result.already_complete = finished != 0;
  if (result.already_complete) return;
  if (lead) state = *decided;
  if (!lead) state = agree_resume_state(comm, manifest, identity);
}

void QuantizeRun::make_exporter() {
  ExportOptions eo;
  eo.max_shard_bytes = job.max_shard_bytes;
  eo.producer_version = job.version;
  eo.exact_mxfp4 = job.exact_mxfp4;
  exporter.emplace(plan, config, ckpt, job.export_path, eo);
}

void QuantizeRun::open_exporter() {
  const bool int4 =
      std::any_of(plan.modules.begin(), plan.modules.end(),
                  [](const PlannedModule& m) { return m.source == SourceCompression::kInt4Pack; });
  if (int4)
    int4_shapes = std::async(std::launch::async, [this] { return int4_shape_mismatch(ckpt); });
  make_exporter();
  STRATA_ASSERT(exporter->steps() == state.steps, "steps");
  // With expert parallelism a routed expert's tensors belong to the rank that holds the expert.
  const int64_t n_experts = config.num_experts;
  const int n_ranks = comm.size();
  if (expert_parallel) {
    expert_pin = [n_experts, n_ranks](const std::string& name) {
      const int64_t e = routed_expert_of(name);
      return e >= 0 && e < n_experts ? expert_owner(e, n_experts, n_ranks) : -1;
    };
    if (lead)
      log_info("expert parallel: ", n_experts, " routed experts per MoE layer (",
               expert_ranges(n_experts, n_ranks), ")");
  }
  exporter->set_ranks(comm.rank(), comm.size(), expert_pin);
  if (!lead) {
    comm.barrier();  // after rank 0 has renamed the shards a kill left complete
    exporter->resume(state.next_step);
  }
  std::error_code ec;
  // What the manifest vouches for stays; everything else a kill left behind goes.
  if (lead) exporter->resume(state.next_step);
  if (lead) remove_except(job.export_path, exporter->vouched_files());
  if (lead) remove_except(resume_dir, {"manifest.json", state.hidden_file});
  if (lead && offload != resume_dir && fs::is_directory(offload, ec)) {
    // Spilled hidden states an interrupted run left; the one the manifest names stays.
    for (const auto& e : fs::directory_iterator(offload)) {
      const std::string n = e.path().filename().string();
      if (n.starts_with("hidden-") && n.ends_with(".safetensors") &&
          e.path() != fs::path(state.hidden_file))
        fs::remove(e.path(), ec);
    }
  }
  if (lead) comm.barrier();
  if (comm.size() > 1) check_same_step(comm, state.next_step);
  result.resumed_at_step = state.next_step;
  result.layers = state.layers;
}

void QuantizeRun::start_gpu_early() {
  // The first layers' weights are read into the page cache while the run starts up. Not with
  // ranks: each rank reads only its share of every layer (and, on several hosts, a warmer per
  // rank would read the checkpoint once per rank).
  if (on_gpu && state.next_step <= plan.num_layers && comm.size() == 1) {
    // --test_first_reads streams: the start-up's small reads are done, so what is left of the
    // first step's tensors (the head's writer and layer 0 wait for them) goes on as 4 sequential
    // streams instead of 1 MiB reads queued behind the layers' streams started next.
    if (first_reads && job.test.first_reads_streams) {
      first_reads.reset();  // joins after the reads in flight
      ReadPattern streams;
      streams.threads = static_cast<int>(kFirstReadThreads);
      first_reads = std::make_unique<PageWarmer>(std::vector<LayerBlob>{first_blob},
                                                 first_blob.bytes, streams);
    }
    warm = gpu_warm_start(ckpt, *exporter, state.next_step - 1, plan.num_layers, job.test);
    if (result.calibrated)  // the GPU path keeps bf16 hidden states
      early = gpu_early_setup(
          std::max<int64_t>(state.next_step - 1, 0), plan.num_layers,
          largest_blob(gpu_blobs, state.next_step - 1),
          ActivationStore::bytes_for(micro.tokens, config.hidden_size, DType::kBF16),
          !result.memory.spilled, job.max_gpu_memory_bytes);
  }
}

void QuantizeRun::log_resume() const {
  if (state.next_step > 0)
    log_info("resuming at ", resume_point(state.next_step, plan.num_layers), " (", manifest, ")");
}

void QuantizeRun::commit(int64_t next, const std::string& hidden_path, const std::string& old_input,
                         double* time) {
  if (next >= 2) check_int4_shapes();  // the head's commit (next 1) runs on its own thread
  // Test hook (tests/engine/kill_resume_test.sh): a kill lands mid-run on tiny fixtures. The
  // layer loop sleeps at each layer step, durable or not.
  const int64_t slow_ms = job.test.slow_layer_ms;
  if (slow_ms > 0 && next == 1) std::this_thread::sleep_for(std::chrono::milliseconds(slow_ms));
  PhaseTimer timer;
  struct Lap {
    PhaseTimer& t;
    double* into;
    ~Lap() { t.lap(into); }
  } lap{timer, time};
  exporter->sync();
  comm.barrier();  // every rank's part of the step is durable
  // The hidden file's checksums: each rank computed those of its micro-batches as it wrote them
  // (0 for the others'), so that their sum holds every one.
  std::vector<uint64_t> sums;
  if (!hidden_path.empty()) {
    STRATA_ASSERT(!store->spilled() || store->input_path() == hidden_path, "hidden file ",
                  hidden_path, " is not the store's inputs");
    sums.assign(store->input_sums().begin(), store->input_sums().end());
    comm.allreduce_sum(sums.data(), sums.size());
  }
  if (!lead) {
    state.next_step = next;
    exporter->publish();
    exporter->release_source(next - 1);
    return;
  }
  const std::string old_hidden = state.hidden_file;
  state.hidden_file = hidden_path.empty() ? "" : manifest_name(hidden_path, resume_dir);
  state.hidden_sums.assign(sums.begin(), sums.end());
  state.next_step = next;
  state.layers = result.layers;
  write_resume_manifest(manifest, state);
  exporter->publish();
  exporter->release_source(next - 1);
  std::error_code ec;
  if (!old_hidden.empty()) fs::remove(fs::path(resume_dir) / old_hidden, ec);
  if (!old_input.empty()) fs::remove(old_input, ec);
}

void QuantizeRun::start_head() {
  phase.lap(&result.times.startup);
  begin_step = state.next_step;
  begin_hidden = state.hidden_file;
  // Step 0 (the embedding table and every other tensor outside the layers -- final norm, lm_head,
  // ... -- written, synced, recorded). A single process writes it on a helper thread while the
  // first hidden states are computed (they only read the table) and the first layers are read,
  // so that nothing is left to write after the layer loop; it is waited for before the layers'
  // commits. With ranks its commit is collective, so it runs here, in order.
  if (state.next_step == 0) {
    auto write_head = [this]() {
      PhaseTimer t;
      exporter->write_head();
      t.lap(&result.times.head_write);
      commit(1, "", "");
      t.lap(&result.times.head_commit);
    };
    if (comm.size() == 1) {
      head_written = std::async(std::launch::async, [this, write_head]() {
        write_head();
        result.times.head_done_at =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      });
    } else {
      write_head();
    }
  }
  if (lead)
    final_files = std::async(std::launch::async, [this]() { exporter->stage_final_files(); });
  phase.lap(&result.times.head);
}

void QuantizeRun::embed_batch(size_t b, void* out) const {
  if (store->dtype() == DType::kBF16) {
    fwd->embed_bf16(batches[b], static_cast<uint16_t*>(out));
  } else {
    fwd->embed(batches[b], static_cast<float*>(out));
  }
}

void QuantizeRun::embed() {
  // With ranks, tensors every rank needs are read by their writer and broadcast.
  owner = [this](const std::string& n) { return exporter->owner_of(n); };
  if (result.calibrated && begin_step <= plan.num_layers) {
    if (on_gpu) create_dir(offload, "--offload_folder");
    if (result.memory.spilled) {
      create_dir(offload, "--offload_folder");
      log_info("activation store: ", human_bytes(result.memory.activations_all), " spilled to ",
               offload, " (", micro.groups.size(), " micro-batches)");
    }
    store = std::make_unique<ActivationStore>(
        micro.tokens, fwd->hidden_size(), fopts.bf16_between_layers ? DType::kBF16 : DType::kF32,
        result.memory.spilled || on_gpu, offload,
        comm.size() > 1 ? owned_batches(comm, micro.groups.size()) : std::vector<bool>{});
    int64_t first_seq = 0;  // the calibration set's sequences, in micro-batch order
    for (size_t b = 0; b < micro.groups.size(); ++b) {
      batches.push_back(Batch::from_sequences(micro.groups[b], first_seq));
      first_seq += static_cast<int64_t>(micro.groups[b].size());
    }
    if (begin_hidden.empty()) {
      // The embedding, read by one rank.
      share_tensors(comm, ckpt, exporter->embedding_tensors(), owner);
      // A single process on the GPU: the placement embeds into pinned or device memory when the
      // hidden states live there, instead of through the store's file and back.
      device_embeds = on_gpu && comm.size() == 1;
      if (!device_embeds) {
        uint64_t most = 0;
        for (size_t b = 0; b < batches.size(); ++b)
          most = std::max(most, store->batch_bytes(b));
        std::vector<uint8_t> buf(most);  // one micro-batch
        store->begin(1);
        for (size_t b = 0; b < batches.size(); ++b) {
          if (!store->owns(b)) continue;
          embed_batch(b, buf.data());
          store->write_raw(b, buf.data());
        }
        store->commit(resume_dir, false);
        if (comm.size() > 1) exporter->release_source(0);
      }
    } else {
      store->load((fs::path(resume_dir) / begin_hidden).string());
    }
  }
  phase.lap(&result.times.embedding);
}

void QuantizeRun::wait_head() {
  if (head_written.valid()) head_written.get();
  // The staged files too (done long before, as a rule): a full disk there is reported now, not
  // after the last layer.
  if (final_files.valid()) final_files.get();
}

std::unique_ptr<Placement> QuantizeRun::placement() {
  if (!result.calibrated) return std::make_unique<NoForward>();
  if (on_gpu) {
    // With ranks, each runs its own micro-batches on its GPU (engine/gpu_ranks.h).
    for (size_t b = 0; comm.size() > 1 && b < batches.size(); ++b) {
      if (!store->owns(b)) continue;
      mine.push_back(batches[b]);
      mine_ids.push_back(b);
    }
    gpu.emplace(GpuLoop{config, ckpt, plan, *store, comm.size() > 1 ? mine : batches, *exporter,
                        first_layer, job.max_gpu_memory_bytes, !result.memory.spilled, resume_dir,
                        job.gpu, job.exact_mxfp4, &comm, mine_ids, &result.times, warm.get(),
                        early.get(), job.test, fopts.bf16_ops});
    if (device_embeds) gpu->embed = [this](size_t b, void* out) { embed_batch(b, out); };
    if (!gpu_blobs.empty()) gpu->layer_blobs = &gpu_blobs;
    gpu->expert_parallel = expert_parallel;  // rows exchanged over NCCL (engine/gpu_runner.h)
    gpu->expert_traffic = &exchange.traffic;
    return make_gpu_placement(*gpu);
  }
  return std::make_unique<HostPlacement>(HostPlacement::Inputs{*fwd, *exporter, ckpt, comm, *store,
                                                               batches, resume_dir, expert_parallel,
                                                               owner, expert_pin});
}

void QuantizeRun::run_layers() {
  first_layer = first_layer_to_run(begin_step, plan.num_layers);
  if (first_layer >= plan.num_layers) {
    wait_head();
    phase.lap(&result.times.head);
    return;
  }
  progress.emplace("quantize", plan.num_layers - first_layer, "layers", job.progress && lead);
  if (disk) disk->mark(on_gpu ? "GPU setup" : "placement");
  std::unique_ptr<Placement> where = placement();
  if (on_gpu) {
    // The CUDA context and the pinned buffers exist now: the bound takes the context as measured
    // and is held to the cap again.
    result.memory = with_measured_context(result.memory, rss_bytes(), where->pinned_bytes(),
                                          where->pinned_hidden_bytes());
    check_memory_cap(result.memory, job.max_cpu_memory_bytes, "once the CUDA context exists");
  }
  phase.lap(on_gpu ? &result.times.device_setup : &result.times.layers);
  if (disk) disk->mark("layers");
  LayerLoop loop{
      plan,
      *exporter,
      comm,
      store.get(),
      first_layer,
      job.test,
      result.times,
      [this](int64_t next, const std::string& hidden, const std::string& old_input) {
        commit(next, hidden, old_input, &result.times.commit);
      },
      [this](const LayerReport& r) {
        result.layers.push_back(r);
        progress->step(str("layer ", r.layer, ", wrote ",
                           human_bytes(static_cast<double>(exporter->bytes_written())), " of ",
                           human_bytes(static_cast<double>(exporter->output_bytes())),
                           r.experts ? str(" (", r.experts_without_tokens, "/", r.experts,
                                           " experts without tokens)")
                                     : ""));
      },
      [this]() { wait_head(); }};
  loop.resume_every_s = job.gpu.resume_every_s;
  run_layer_loop(loop, *where);
  result.times.writeback = exporter->writeback_seconds();
  progress->finish();
  phase.lap(&result.times.layers);
  if (disk) disk->mark("placement released");
  where.reset();  // the device's buffers go
  phase.lap(on_gpu ? &result.times.device_setup : &result.times.layers);
}

void QuantizeRun::finish() {
  if (disk) disk->mark("finish");
  // Each step's wall time (--gpu_profile: one line, bench/gpu_bench.sh reads it).
  PhaseTimer step_timer;
  std::string steps;
  auto step = [&](const char* name) {
    const double s = step_timer.lap(nullptr);
    steps += str(steps.empty() ? "" : ", ", name, " ", format_double("%.3f", s), " s");
  };
  check_int4_shapes();
  step("INT4 shape check");
  wait_head();  // done before the loop as a rule; a run with no layers to run waits here
  result.bytes_read = ckpt.bytes_read();
  result.expert_bytes_sent = exchange.traffic.bytes_sent;
  result.expert_exchange_seconds = exchange.traffic.seconds;
  if (lead) {
    std::error_code ec;
    result.files = exporter->finish(step);  // its first step includes the wait above
    // The run record comes last, synced: a re-run of this command then has nothing to do.
    // Experts without calibration tokens mean something only where activations were calibrated.
    write_run_record((fs::path(job.export_path) / kRunRecordName).string(), identity,
                     result.calibrated ? result.layers : std::vector<LayerReport>{});
    result.files.push_back(kRunRecordName);
    step("run record");
    // Then the manifest: once it is gone the export is complete.
    fs::remove(manifest, ec);
    fs::remove_all(resume_dir, ec);
    step("resume folder removed");
  }
  comm.barrier();
  if (job.gpu.profile) result.finish_steps = steps;
  phase.lap(&result.times.finish);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  result.times.total = result.seconds;
}

void QuantizeRun::disk_full(const DiskFullError& e) {
  // The filesystem that is full: that of the deepest existing folder above the file.
  fs::path dir = fs::path(e.path()).parent_path();
  std::error_code ec;
  while (!dir.empty() && !fs::is_directory(dir, ec))
    dir = dir.parent_path();
  struct statvfs vfs {};
  struct stat full {};
  if (dir.empty() || ::statvfs(dir.c_str(), &vfs) != 0 || ::stat(dir.c_str(), &full) != 0 ||
      vfs.f_frsize == 0)
    throw;  // (called in run_quantize's handler: rethrows `e`) the writer's own line
  const uint64_t block = vfs.f_frsize;
  auto blocks = [block](uint64_t n) { return (n + block - 1) / block * block; };
  auto on_full = [&](const std::string& d) {
    struct stat st {};
    return ::stat(d.c_str(), &st) == 0 && st.st_dev == full.st_dev;
  };
  // What the run's files in `d` take now (blocks allocated: a shard is reserved whole).
  auto held = [&](const std::string& d, bool only_hidden) {
    uint64_t n = 0;
    for (const auto& f : fs::directory_iterator(d, ec)) {
      const std::string name = f.path().filename().string();
      struct stat st {};
      if (only_hidden && !(name.starts_with("hidden-") && name.ends_with(".safetensors"))) continue;
      if (::stat(f.path().c_str(), &st) == 0 && S_ISREG(st.st_mode))
        n += static_cast<uint64_t>(st.st_blocks) * 512;
    }
    return n;
  };
  // What the run needs there to finish, from above: the whole export and its run record, two
  // manifests (one replacing the other), and two hidden-state files (the next layer's inputs
  // are written before the previous ones go) while layers remain.
  if (!exporter && fs::is_directory(job.export_path, ec)) {
    try {
      make_exporter();
    } catch (const Error&) {
    }
  }
  if (!exporter) throw;  // nothing to measure: the writer's own line
  uint64_t need = 0, have = static_cast<uint64_t>(vfs.f_bavail) * block;
  if (on_full(job.export_path)) {
    need += exporter->disk_bytes(block) + blocks(4096);
    have += held(job.export_path, false);
  }
  if (on_full(resume_dir)) {
    need += 2 * blocks(4096 + 64 * static_cast<uint64_t>(plan.num_layers + micro.tokens.size()));
    have += held(resume_dir, false);
  }
  const std::string hidden_dir = result.memory.spilled || on_gpu ? offload : resume_dir;
  if (result.calibrated && state.next_step <= plan.num_layers && on_full(hidden_dir)) {
    const int64_t hidden = fwd ? fwd->hidden_size() : config.hidden_size;
    need += 2 * blocks(ActivationStore::bytes_for(
                           micro.tokens, hidden,
                           fopts.bf16_between_layers ? DType::kBF16 : DType::kF32) +
                       4096 + 64 * micro.tokens.size());
    if (hidden_dir != resume_dir) have += held(hidden_dir, true);
  }
  const uint64_t more = need > have ? need - have : std::max<uint64_t>(e.bytes(), block);
  fail("no space left on device writing ", e.path(), " (needs about ",
       human_bytes(static_cast<double>(more)),
       " more; free space and re-run the same command to resume)");
}

}  // namespace

QuantizeResult run_quantize(const QuantizeJob& job) {
  QuantizeResult result;
  // Each step before the embedding, by its wall time on this thread: one info line (the summary's
  // `startup` and `calibration data` are their sum).
  PhaseTimer step_timer;
  // The CUDA driver's start, when the CLI's device check asked for it before the run's clock (its
  // probe on a helper thread: logged at the device choice, beside the steps it overlapped).
  std::string steps;
  if (!job.cuda_devices.valid() && cuda_probe_seconds() >= 0.005)
    steps = str("CUDA device probe (before the run) ", format_double("%.2f", cuda_probe_seconds()),
                " s");
  auto step = [&](const char* name) {
    const double s = step_timer.lap(nullptr);
    if (s >= 0.005)
      steps += str(steps.empty() ? "" : ", ", name, " ", format_double("%.2f", s), " s");
  };
  // --gpu_profile: the disk's traffic by phase, from before the first read (the constructor's).
  std::unique_ptr<DiskTimeline> disk;
  if (job.gpu.profile) {
    disk = std::make_unique<DiskTimeline>();
    disk->mark("start-up");
  }
  if (job.gpu.profile) result.clock_started_after = process_age_seconds();
  auto owned = std::make_unique<QuantizeRun>(job, result);
  QuantizeRun& run = *owned;
  run.set_disk_timeline(disk.get());
  step("config and checkpoint headers");
  run.resolve_plan();
  step("plan");
  run.choose_device();
  step("device choice");
  if (job.cuda_devices.valid() && cuda_probe_seconds() >= 0.005)
    steps += str(", CUDA device probe (beside the steps before) ",
                 format_double("%.2f", cuda_probe_seconds()), " s");
  run.check_output();
  run.choose_expert_parallel();
  step("output check");
  run.calibration_data();
  step("forward and calibration data");
  run.plan_memory();
  step("memory plan");
  try {
    run.prepare_resume();
    step("output folder and resume record");
    if (result.already_complete) return result;  // the same run finished before: nothing to do
    run.open_exporter();
    step("exporter");
    run.remeasure_baseline();
    run.start_gpu_early();
    run.log_resume();
    run.start_head();
    step("GPU and head started");
    if (run.lead_rank() && !steps.empty()) log_info("start-up steps: ", steps);
    run.embed();
    run.run_layers();
    run.finish();
    if (disk) result.disk_timeline = disk->finish();
  } catch (const DiskFullError& e) {
    run.disk_full(e);
  }
  if (job.leave_for_exit) (void)owned.release();  // reclaimed by the process's exit
  return result;
}

}  // namespace strata
