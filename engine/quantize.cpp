#include "engine/quantize.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <future>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "core/progress.h"
#include "engine/resume.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "model/forward.h"
#include "tokenizer/tokenizer.h"

namespace fs = std::filesystem;

namespace strata {
namespace {

bool needs_activations(const QuantPlan& plan) {
  if (plan.recipe.kv_cache == KvCacheFormat::kFp8) return true;
  for (const PlannedModule& m : plan.modules) {
    if (m.format == QFormat::kNvfp4 || m.format == QFormat::kFp8) return true;
  }
  return false;
}

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
    case QFormat::kNone:
      return out * in * static_cast<uint64_t>(dtype_bits(m.dtype)) / 8;
  }
  return 0;
}

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024.0 && u < 4) {
    b /= 1024.0;
    ++u;
  }
  std::ostringstream os;
  os.precision(u == 0 ? 0 : 2);
  os << std::fixed << b << " " << units[u];
  return os.str();
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
  STRATA_CHECK(!ec && fs::is_directory(dir, ec), what, " ", dir,
               ": cannot create the directory: ", ec.message());
}

// Decides between a fresh run and a resumed one, before anything is written. A fresh run starts
// with an empty export directory and a manifest at step 0.
ResumeState prepare_output(const QuantizeJob& job, const std::string& resume_dir,
                           const std::map<std::string, std::string>& identity, int64_t steps) {
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
    if (std::optional<ResumeState> prev = read_resume_manifest(manifest)) {
      const std::string changed = identity_changes(prev->identity, identity);
      STRATA_CHECK(changed.empty(), manifest,
                   " records an interrupted run of another job (changed: ", changed,
                   "); run the same command as before to resume it, or add --overwrite to start "
                   "over");
      STRATA_CHECK(prev->steps == steps, manifest, ": malformed resume manifest (", prev->steps,
                   " steps, this run has ", steps, "); run with --overwrite to start over");
      return *prev;
    }
    STRATA_CHECK(is_empty_dir(out), "--export_path ", out,
                 " is not empty and holds no interrupted strata run to resume; remove it, choose "
                 "another directory, or add --overwrite to replace its contents");
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

// The next layer's inputs: one F32 [T_b, H] tensor per micro-batch.
void save_hidden(const std::string& path, const std::vector<std::vector<float>>& hidden,
                 int64_t hidden_size) {
  NamedTensors t;
  for (size_t b = 0; b < hidden.size(); ++b) {
    const int64_t rows = static_cast<int64_t>(hidden[b].size()) / hidden_size;
    t.emplace_back("hidden." + std::to_string(b),
                   Tensor::view(DType::kF32, {rows, hidden_size}, hidden[b].data(),
                                hidden[b].size() * sizeof(float),
                                std::shared_ptr<const void>(hidden[b].data(), [](const void*) {})));
  }
  write_safetensors(path, t);
}

void load_hidden(const std::string& path, std::vector<std::vector<float>>& hidden) {
  std::error_code ec;
  STRATA_CHECK(fs::exists(path, ec), path,
               ": missing, but the resume manifest needs it; run with --overwrite to start over");
  SafetensorsFile f = SafetensorsFile::open(path);
  for (size_t b = 0; b < hidden.size(); ++b) {
    const TensorEntry* e = f.find("hidden." + std::to_string(b));
    STRATA_CHECK(e && e->dtype == DType::kF32 && e->end - e->begin == hidden[b].size() * 4, path,
                 ": hidden.", b, " is missing or has the wrong size; run with --overwrite");
    std::memcpy(hidden[b].data(), f.tensor(*e).bytes(), hidden[b].size() * 4);
  }
}

// Test hook (tests/engine/kill_resume_test.sh): sleep this many milliseconds in every step after
// its tensors are written and before it is committed, so that a kill lands mid-run.
int64_t test_slow_step_ms() {
  const char* v = std::getenv("STRATA_TEST_SLOW_LAYER_MS");
  return v ? std::atoll(v) : 0;
}

}  // namespace

std::string MemoryEstimate::describe() const {
  return str(human_bytes(static_cast<double>(total())), " (2 x largest layer ",
             human_bytes(static_cast<double>(layer_weights)),
             " in fp32, the one computing and the one prefetched",
             activations
                 ? str(" + hidden states ", human_bytes(static_cast<double>(activations)),
                       " + micro-batch working set ", human_bytes(static_cast<double>(working)))
                 : std::string("; weight-only: no calibration forward"),
             ")");
}

MemoryEstimate estimate_memory(const QuantPlan& plan, uint64_t tokens, int64_t seq_len,
                               int64_t hidden_size, int64_t batch_size) {
  MemoryEstimate m;
  std::map<int64_t, uint64_t> layer_params;
  for (const PlannedModule& p : plan.modules) {
    if (p.layer >= 0) layer_params[p.layer] += static_cast<uint64_t>(p.shape[0] * p.shape[1]);
  }
  for (const auto& [l, p] : layer_params)
    m.layer_weights = std::max(m.layer_weights, p * 4);
  if (needs_activations(plan)) {
    const uint64_t h = static_cast<uint64_t>(hidden_size);
    m.activations = tokens * h * 4;
    m.working = static_cast<uint64_t>(batch_size * seq_len) * h * 4 * 16;
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
    linear_src += static_cast<uint64_t>(m.shape[0] * m.shape[1]) *
                  static_cast<uint64_t>(dtype_bits(m.dtype)) / 8;
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
  const uint64_t estimate = total_src - linear_src + linear_out;
  os << "\nsource      " << human_bytes(static_cast<double>(total_src)) << " on disk\n";
  os << "output      about " << human_bytes(static_cast<double>(estimate)) << " ("
     << str(static_cast<double>(estimate) / static_cast<double>(std::max<uint64_t>(total_src, 1)))
            .substr(0, 5)
     << "x)\n";
  int64_t sequences = 0;
  for (const CalibSource& s : calib.sources)
    sequences += s.count;
  if (calib.sources.empty()) sequences = calib.default_count;
  const MemoryEstimate mem = estimate_memory(plan, static_cast<uint64_t>(sequences * calib.seq_len),
                                             calib.seq_len, hidden_size, batch_size);
  os << "memory      about " << mem.describe() << "\n";
  for (const std::string& w : plan.warnings)
    os << "warning     " << w << "\n";
  return os.str();
}

QuantizeResult run_quantize(const QuantizeJob& job) {
  const auto t0 = std::chrono::steady_clock::now();
  QuantizeResult result;
  ModelConfig config = read_model_config(job.model_dir);
  Checkpoint ckpt = Checkpoint::open(job.model_dir);
  result.plan = make_plan(config, ckpt, job.recipe);
  const QuantPlan& plan = result.plan;
  for (const std::string& w : plan.warnings)
    log_warn(w);
  for (const PlannedModule& m : plan.modules) {
    const bool outside = m.layer < 0 || m.layer >= plan.num_layers;
    STRATA_CHECK(!(outside && (m.format == QFormat::kNvfp4 || m.format == QFormat::kFp8)),
                 plan.recipe.rules[m.rule].origin, " gives '", m.module, "' format ",
                 qformat_name(m.format),
                 ", which needs activation statistics; strata calibrates decoder layers only: use "
                 "w4a16_nvfp4 or "
                 "exclude it");
  }
  result.calibrated = needs_activations(plan);
  check_output_early(job,
                     job.resume_dir.empty() ? job.export_path + ".strata_resume" : job.resume_dir);

  std::unique_ptr<ModelForward> fwd;
  Calibration calibration;
  if (result.calibrated) {
    fwd = ModelForward::create(config, ckpt);  // refuses unsupported math before any work
    std::unique_ptr<Tokenizer> tok;
    const bool has_tokenizer = fs::exists(fs::path(job.model_dir) / "tokenizer.json") ||
                               fs::exists(fs::path(job.model_dir) / "tiktoken.model");
    if (has_tokenizer) tok = std::make_unique<Tokenizer>(Tokenizer::load(job.model_dir));
    calibration = load_calibration(job.calib, tok.get(), fwd->vocab_size());
    result.calib = calibration.report;
    STRATA_CHECK(!calibration.sequences.empty(),
                 "no calibration sequences: ", calibration.report.summary());
    log_info("calibration: ", calibration.report.sequences, " sequences, ",
             calibration.report.tokens, " tokens");
  }

  {
    int64_t longest = 0;
    for (const auto& seq : calibration.sequences)
      longest = std::max<int64_t>(longest, static_cast<int64_t>(seq.size()));
    result.memory = estimate_memory(plan, static_cast<uint64_t>(calibration.report.tokens), longest,
                                    config.hidden_size, job.batch_size);
    STRATA_CHECK(job.max_cpu_memory_bytes == 0 || result.memory.total() <= job.max_cpu_memory_bytes,
                 "--max_cpu_memory_gb ",
                 static_cast<double>(job.max_cpu_memory_bytes) / (1024.0 * 1024.0 * 1024.0),
                 " is below what this run needs: about ", result.memory.describe(),
                 "; raise it, or lower --calib_size, --calib_seq or --batch_size");
  }
  const std::string resume_dir =
      job.resume_dir.empty() ? job.export_path + ".strata_resume" : job.resume_dir;
  const std::string manifest = (fs::path(resume_dir) / "manifest.json").string();
  const std::map<std::string, std::string> identity =
      run_identity(config, ckpt, plan, calibration.sequences,
                   str("batch_size=", result.calibrated ? job.batch_size : 0,
                       " max_shard_bytes=", job.max_shard_bytes),
                   job.version);
  ResumeState state = prepare_output(job, resume_dir, identity, plan.num_layers + 2);

  ExportOptions eo;
  eo.max_shard_bytes = job.max_shard_bytes;
  eo.producer_version = job.version;
  ModeloptExporter exporter(plan, config, ckpt, job.export_path, eo);
  STRATA_ASSERT(exporter.steps() == state.steps, "steps");
  // What the manifest vouches for stays; everything else a kill left behind goes.
  exporter.resume(state.next_step);
  remove_except(job.export_path, exporter.vouched_files());
  remove_except(resume_dir, {"manifest.json", state.hidden_file});
  result.resumed_at_step = state.next_step;
  result.layers = state.layers;
  if (state.next_step > 0) {
    log_info("resuming at ",
             state.next_step <= plan.num_layers
                 ? str("layer ", state.next_step, "/", plan.num_layers)
                 : std::string(state.next_step == plan.num_layers + 1 ? "the final tensors"
                                                                      : "the config files"),
             " (", manifest, ")");
  }
  const int64_t slow_ms = test_slow_step_ms();
  // Step `done` is written: make it durable, then record it (with the next layer's inputs).
  auto commit = [&](int64_t next, const std::vector<std::vector<float>>* hidden, int64_t h) {
    if (slow_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(slow_ms));
    exporter.sync();
    const std::string old_hidden = state.hidden_file;
    state.hidden_file = "";
    if (hidden) {
      state.hidden_file = str("hidden-", next, ".safetensors");
      save_hidden((fs::path(resume_dir) / state.hidden_file).string(), *hidden, h);
    }
    state.next_step = next;
    state.layers = result.layers;
    write_resume_manifest(manifest, state);
    exporter.publish();
    exporter.release_source(next - 1);
    std::error_code ec;
    if (!old_hidden.empty()) fs::remove(fs::path(resume_dir) / old_hidden, ec);
  };

  if (state.next_step == 0) {
    exporter.write_head();
    commit(1, nullptr, 0);
  }

  // Micro-batches: consecutive sequences by index, batch_size at a time.
  std::vector<Batch> batches;
  std::vector<std::vector<float>> hidden;
  if (result.calibrated && state.next_step <= plan.num_layers) {
    const int64_t bs = std::max<int64_t>(job.batch_size, 1);
    for (size_t i = 0; i < calibration.sequences.size(); i += static_cast<size_t>(bs)) {
      const size_t end = std::min(calibration.sequences.size(), i + static_cast<size_t>(bs));
      batches.push_back(
          Batch::from_sequences({calibration.sequences.begin() + static_cast<int64_t>(i),
                                 calibration.sequences.begin() + static_cast<int64_t>(end)}));
      hidden.emplace_back(static_cast<size_t>(batches.back().n_tokens() * fwd->hidden_size()));
      if (state.hidden_file.empty()) fwd->embed(batches.back(), hidden.back().data());
    }
    if (!state.hidden_file.empty())
      load_hidden((fs::path(resume_dir) / state.hidden_file).string(), hidden);
  }

  MaxCalibrator calib;
  const int64_t first_layer = std::min(std::max<int64_t>(state.next_step - 1, 0), plan.num_layers);
  Progress progress("quantize", plan.num_layers - first_layer, "layers", job.progress);
  // Layer l + 1's weights load in the background while layer l computes. Loading is a pure
  // function of the checkpoint, so the results do not depend on the overlap.
  std::future<std::unique_ptr<DecoderLayer>> prefetch;
  auto fetch = [&](int64_t l) {
    return std::async(std::launch::async, [&fwd, l]() { return fwd->layer(l); });
  };
  if (result.calibrated && first_layer < plan.num_layers) prefetch = fetch(first_layer);
  uint64_t bytes_read = 0;
  for (int64_t l = first_layer; l < plan.num_layers; ++l) {
    calib.clear();
    if (result.calibrated) {
      std::unique_ptr<DecoderLayer> layer = prefetch.get();
      if (l + 1 < plan.num_layers) prefetch = fetch(l + 1);
      for (size_t b = 0; b < batches.size(); ++b)
        layer->forward(batches[b], hidden[b].data(), &calib);
    }
    bytes_read += exporter.source_bytes(l + 1);
    LayerReport r = exporter.write_layer(l, calib);
    result.layers.push_back(r);
    const bool last = l + 1 == plan.num_layers;
    commit(l + 2, result.calibrated && !last ? &hidden : nullptr,
           result.calibrated ? fwd->hidden_size() : 0);
    progress.step(str(
        "layer ", l, ", wrote ", human_bytes(static_cast<double>(exporter.bytes_written())), " of ",
        human_bytes(static_cast<double>(exporter.output_bytes())),
        r.experts ? str(" (", r.experts_without_tokens, "/", r.experts, " experts without tokens)")
                  : ""));
  }
  progress.finish();
  if (state.next_step == plan.num_layers + 1) {
    calib.clear();
    exporter.write_tail(calib);
    commit(plan.num_layers + 2, nullptr, 0);
  }
  result.files = exporter.finish();
  // The manifest goes first: once it is gone the export is complete.
  std::error_code ec;
  fs::remove(manifest, ec);
  fs::remove_all(resume_dir, ec);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return result;
}

}  // namespace strata
