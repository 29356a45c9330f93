#include "engine/quantize.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <sstream>

#include "core/error.h"
#include "core/log.h"
#include "core/progress.h"
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

// Refuses an export path that would lose data; called before any work.
void check_output_dir(const std::string& out, const std::string& src) {
  std::error_code ec;
  STRATA_CHECK(fs::weakly_canonical(out, ec) != fs::weakly_canonical(src, ec), "--export_path ",
               out, " is the source checkpoint; choose another directory");
  if (fs::exists(out)) {
    STRATA_CHECK(fs::is_directory(out), "--export_path ", out, " exists and is not a directory");
    STRATA_CHECK(
        fs::is_empty(out), "--export_path ", out,
        " is not empty; remove it or choose another directory (strata does not overwrite files)");
  }
}

void create_output_dir(const std::string& out) {
  std::error_code ec;
  fs::create_directories(out, ec);
  STRATA_CHECK(!ec, "--export_path ", out, ": cannot create the directory: ", ec.message());
}

}  // namespace

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
  // Memory: the largest layer's weights in fp32, the hidden states of every calibration token
  // (fp32), and one micro-batch's temporaries.
  std::map<int64_t, uint64_t> layer_params;
  uint64_t max_layer = 0;
  for (const PlannedModule& m : plan.modules) {
    if (m.layer >= 0) layer_params[m.layer] += static_cast<uint64_t>(m.shape[0] * m.shape[1]);
  }
  for (const auto& [l, p] : layer_params)
    max_layer = std::max(max_layer, p);
  int64_t sequences = 0;
  for (const CalibSource& s : calib.sources)
    sequences += s.count;
  if (calib.sources.empty()) sequences = calib.default_count;
  const uint64_t tokens = static_cast<uint64_t>(sequences * calib.seq_len);
  const uint64_t activations = tokens * static_cast<uint64_t>(hidden_size) * 4;
  const uint64_t working = static_cast<uint64_t>(batch_size * calib.seq_len) *
                           static_cast<uint64_t>(hidden_size) * 4 * 16;
  const bool act = needs_activations(plan);
  os << "memory      about "
     << human_bytes(static_cast<double>(max_layer * 4 + (act ? activations + working : 0)))
     << " (largest layer " << human_bytes(static_cast<double>(max_layer * 4)) << " in fp32"
     << (act ? str(" + hidden states of up to ", tokens, " calibration tokens ",
                   human_bytes(static_cast<double>(activations)))
             : std::string(" ; weight-only: no calibration forward"))
     << ")\n";
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
  check_output_dir(job.export_path, job.model_dir);

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

  create_output_dir(job.export_path);
  ExportOptions eo;
  eo.max_shard_bytes = job.max_shard_bytes;
  eo.producer_version = job.version;
  ModeloptExporter exporter(plan, config, ckpt, job.export_path, eo);
  exporter.write_head();

  // Micro-batches: consecutive sequences by index, batch_size at a time.
  std::vector<Batch> batches;
  std::vector<std::vector<float>> hidden;
  if (result.calibrated) {
    const int64_t bs = std::max<int64_t>(job.batch_size, 1);
    for (size_t i = 0; i < calibration.sequences.size(); i += static_cast<size_t>(bs)) {
      const size_t end = std::min(calibration.sequences.size(), i + static_cast<size_t>(bs));
      batches.push_back(
          Batch::from_sequences({calibration.sequences.begin() + static_cast<int64_t>(i),
                                 calibration.sequences.begin() + static_cast<int64_t>(end)}));
      hidden.emplace_back(static_cast<size_t>(batches.back().n_tokens() * fwd->hidden_size()));
      fwd->embed(batches.back(), hidden.back().data());
    }
  }

  MaxCalibrator calib;
  Progress progress("quantize", plan.num_layers, "layers", job.progress);
  for (int64_t l = 0; l < plan.num_layers; ++l) {
    calib.clear();
    if (result.calibrated) {
      auto layer = fwd->layer(l);
      for (size_t b = 0; b < batches.size(); ++b)
        layer->forward(batches[b], hidden[b].data(), &calib);
    }
    LayerReport r = exporter.write_layer(l, calib);
    result.layers.push_back(r);
    progress.step(
        r.experts ? str("(", r.experts_without_tokens, "/", r.experts, " experts without tokens)")
                  : "");
  }
  progress.finish();
  calib.clear();
  exporter.write_tail(calib);
  result.files = exporter.finish();
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return result;
}

}  // namespace strata
