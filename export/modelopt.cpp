#include "export/modelopt.h"

#include <fnmatch.h>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "core/parallel.h"
#include "core/transpose.h"
#include "io/json.h"
#include "io/source_weights.h"
#include "model/groups.h"
#include "ops/cpu_backend.h"
#include "quant/fp8.h"
#include "quant/mxfp4.h"
#include "quant/mxfp8.h"
#include "quant/nvfp4.h"
#include "quant/scale_search.h"

namespace fs = std::filesystem;

namespace strata {
namespace {

// The exporter's weight quantization goes through the CPU backend's ops (ops/backend.h), the same
// ones the device placement calls on the CUDA backend; they keep no state, so the exporter's
// threads share one backend.
ops::CpuBackend& host_backend() {
  static ops::CpuBackend backend(nullptr, nullptr);
  return backend;
}

ops::StoredWeight stored(const Tensor& w) {
  const int64_t rows = w.shape().empty() ? 1 : w.shape()[0];
  return ops::StoredWeight{w.bytes(), w.dtype(), rows, rows ? w.numel() / rows : 0};
}

// max |w| over the tensors (NaN when any element is NaN).
float weight_amax_of(const std::vector<Tensor>& ws) {
  std::vector<std::vector<ops::StoredWeight>> group(1);
  for (const Tensor& w : ws)
    group[0].push_back(stored(w));
  float a = 0.0f;
  host_backend().weight_amaxes(group, &a);
  return a;
}

// The dtype of the affine KV cache's biases: ModelOpt keeps the bias in the dtype of the K/V
// states, the model's (config.json torch_dtype / dtype, as transformers loads it; none: fp32).
DType kv_bias_dtype(const ModelConfig& config) {
  const std::string& t = config.torch_dtype;
  if (t == "bfloat16") return DType::kBF16;
  if (t == "float16") return DType::kF16;
  if (t.empty() || t == "float32") return DType::kF32;
  fail(config.path, ": torch_dtype '", t,
       "' is not one an affine KV cache bias can be kept in (bfloat16, float16, float32)");
}

// [1, heads, 1, head_dim] of the K (k) or V states: MLA's every head with its K (nope + rope) or
// V width, else the KV heads of head_dim.
Shape kv_bias_shape(const ModelConfig& c, bool k) {
  if (c.kv_lora_rank > 0)
    return {1, c.num_attention_heads, 1,
            k ? c.qk_nope_head_dim + c.qk_rope_head_dim : c.v_head_dim};
  return {1, c.num_key_value_heads, 1, c.head_dim};
}

// k_bias / v_bias as ModelOpt 0.47 exports the quantizer's _bias_value: the shape of the K/V
// states' mean over batch and tokens, kept dims [1, heads, 1, head_dim], in `dtype`.
Tensor kv_bias_tensor(const KvAffine& a, int64_t heads, DType dtype) {
  const int64_t d = static_cast<int64_t>(a.bias.size()) / heads;
  STRATA_ASSERT(d * heads == static_cast<int64_t>(a.bias.size()), "bias of ", a.bias.size(),
                " channels over ", heads, " heads");
  Tensor t = Tensor::zeros(dtype, {1, heads, 1, d});
  for (size_t c = 0; c < a.bias.size(); ++c) {
    const float b = a.bias[c];
    if (dtype == DType::kBF16) {
      t.mutable_data<uint16_t>()[c] = f32_to_bf16(b);
    } else if (dtype == DType::kF16) {
      t.mutable_data<uint16_t>()[c] = f32_to_f16(b);
    } else {
      t.mutable_data<float>()[c] = b;
    }
  }
  return t;
}

// "model.layers.3.self_attn.q_proj" -> "model.layers.3.self_attn."
std::string attention_prefix(const QuantPlan& plan, int64_t layer) {
  for (const PlannedModule& m : plan.modules) {
    if (m.layer != layer) continue;
    const size_t at = m.module.find(".self_attn.");
    if (at != std::string::npos) return m.module.substr(0, at) + ".self_attn.";
  }
  return {};
}

// vLLM treats a module as excluded when an entry is a substring of its name, or when the name
// matches an entry as a wildcard (fnmatch).
bool vllm_excludes(const std::string& entry, const std::string& module) {
  if (module.find(entry) != std::string::npos) return true;
  return fnmatch(entry.c_str(), module.c_str(), 0) == 0;
}

Json quant_scheme(QFormat f) {
  Json s = Json::object();
  s["dynamic"] = false;
  s["num_bits"] = (f == QFormat::kNvfp4 || f == QFormat::kW4A16Nvfp4 ||
                   f == QFormat::kW4A16Nvfp4Bs32 || f == QFormat::kMxfp4)
                      ? 4
                      : 8;
  s["type"] = "float";
  if (qformat_group_size(f) > 0) s["group_size"] = qformat_group_size(f);
  return s;
}

// Weights in another format than safetensors: never copied to the export (finish() warns).
bool is_foreign_weights(const std::string& n) {
  return n.ends_with(".bin") || n.ends_with(".pt") || n.ends_with(".pth") || n.ends_with(".gguf");
}

// The source files finish() copies byte for byte (tokenizer, generation config, chat template
// ...): all but the weights, the index and the files the export writes itself.
bool is_copied_sidecar(const std::string& n) {
  return !(n.ends_with(".safetensors") || n == "model.safetensors.index.json" ||
           n == "config.json" || n == "hf_quant_config.json" || n == kRunRecordName ||
           is_foreign_weights(n));
}

}  // namespace

namespace {

// The quantized modules' consumer names, sorted and distinct, and what exclude_modules refuses:
// each name itself and each of its prefixes followed by '*' (any prefix, not only at a dot).
class RefusedNames {
 public:
  explicit RefusedNames(std::vector<std::string> quantized) : q_(std::move(quantized)) {
    std::sort(q_.begin(), q_.end());
    q_.erase(std::unique(q_.begin(), q_.end()), q_.end());
  }
  const std::vector<std::string>& quantized() const { return q_; }
  // Whether a quantized name starts with `prefix`.
  bool some_starts_with(std::string_view prefix) const {
    auto it = std::lower_bound(q_.begin(), q_.end(), prefix,
                               [](const std::string& a, std::string_view b) { return a < b; });
    return it != q_.end() && it->starts_with(prefix);
  }
  bool is_quantized(std::string_view name) const {
    return std::binary_search(q_.begin(), q_.end(), name, std::less<>());
  }
  // `s` is refused: a quantized name, or a prefix of one followed by '*'.
  bool refused(std::string_view s) const {
    return is_quantized(s) || (s.ends_with('*') && some_starts_with(s.substr(0, s.size() - 1)));
  }

 private:
  std::vector<std::string> q_;
};

bool has_glob_char(std::string_view s) {
  return s.find_first_of("*?[\\") != std::string_view::npos;
}

}  // namespace

std::vector<std::string> ModeloptExporter::exclude_modules(const QuantPlan& plan) {
  // ModelOpt 0.47's summary (torch/export/quant_utils.py,
  // _prefix_wildcard_summarize_exclude_modules), under the names consumers give the modules (a
  // fused-experts plan's experts: the layer's experts module). A wildcard is refused when it is a
  // quantized module's name or a prefix of one followed by '*' (any prefix, not only at a dot). For
  // each unquantized module U, the candidates at each '.' of U, in order, are U[:i] + "*", then the
  // pair U[:i], U[:i] + ".*" (written as U[:i] + ".*" alone), and last U itself; the first
  // candidate none of whose parts is refused is taken. So a whole decoder layer becomes
  // "model.layers.0*" unless a quantized module starts with "model.layers.0" (layer 0x: then
  // "model.layers.0.*").
  std::vector<std::string> quantized;
  for (const PlannedModule& m : plan.modules) {
    if (m.format != QFormat::kNone) quantized.push_back(consumer_module(plan, m.module));
  }
  const RefusedNames refused(std::move(quantized));
  std::vector<std::string> unquantized = plan.excluded_extra;
  for (const PlannedModule& pm : plan.modules) {
    if (pm.format == QFormat::kNone) unquantized.push_back(consumer_module(plan, pm.module));
  }
  std::set<std::string> out;
  for (const std::string& module : unquantized) {
    std::string chosen;
    for (size_t i = 0; i < module.size() && chosen.empty(); ++i) {
      if (module[i] != '.') continue;
      const std::string prefix = module.substr(0, i);
      if (!refused.refused(prefix + "*")) {
        chosen = prefix + "*";
      } else if (!refused.refused(prefix) && !refused.refused(prefix + ".*")) {
        chosen = prefix + ".*";
      }
    }
    if (chosen.empty()) chosen = module;
    STRATA_CHECK(!refused.refused(chosen), "cannot exclude '", module,
                 "': a quantized module has the same name");
    out.insert(chosen);
  }
  // vLLM treats a module as excluded when an entry is a substring of its name or matches it as a
  // wildcard: no entry may reach a quantized module that way. An entry "P*" (P without glob
  // characters) reaches exactly the names starting with P when no name holds a glob character (no
  // substring can then hold the '*'): one search in the sorted names. Other entries are tried on
  // every name. The first conflict in the order of the plan's modules and the entries is reported.
  // An entry without glob characters reaches the names that hold it (fnmatch then needs equality,
  // a special case): one search in the names joined by '\n' when none holds a '\n'.
  const std::vector<std::string>& q = refused.quantized();
  const bool plain_names = std::none_of(q.begin(), q.end(), [](const std::string& n) {
    return has_glob_char(n) || n.find('\n') != std::string::npos;
  });
  std::string joined;
  for (size_t i = 0; plain_names && i < q.size(); ++i)
    joined += (i ? "\n" : "") + q[i];
  bool conflict = false;
  for (const std::string& entry : out) {
    const std::string_view p = std::string_view(entry).substr(0, entry.size() - 1);
    if (plain_names && entry.ends_with('*') && !has_glob_char(p)) {
      conflict = conflict || refused.some_starts_with(p);
    } else if (plain_names && !has_glob_char(entry) && entry.find('\n') == std::string::npos) {
      conflict = conflict || joined.find(entry) != std::string::npos;
    } else {
      for (size_t i = 0; i < q.size() && !conflict; ++i)
        conflict = vllm_excludes(entry, q[i]);
    }
  }
  for (const PlannedModule& m : plan.modules) {
    if (!conflict || m.format == QFormat::kNone) continue;
    const std::string c = consumer_module(plan, m.module);
    for (const std::string& entry : out) {
      STRATA_CHECK(!vllm_excludes(entry, c), "exclude_modules entry '", entry,
                   "' would also exclude the quantized '", c,
                   "' in vLLM (substring or wildcard match); quantize the excluded module too or "
                   "exclude the quantized one");
    }
  }
  STRATA_ASSERT(!conflict,
                "exclude_modules: a conflict found by the sorted search but not by "
                "vllm_excludes");
  return {out.begin(), out.end()};
}

ModeloptExporter::ModeloptExporter(const QuantPlan& plan, const ModelConfig& config,
                                   const Checkpoint& ckpt, std::string out_dir,
                                   ExportOptions options)
    : plan_(plan),
      config_(config),
      ckpt_(ckpt),
      out_dir_(std::move(out_dir)),
      options_(std::move(options)) {
  arch_ = resolve_arch(config_);
  const std::vector<std::string> names = ckpt_.tensor_names();
  resolve_wrapper_prefixes(arch_, names, ckpt_.dir());
  for (const PlannedModule& m : plan_.modules) {
    layer_modules_[m.layer].push_back(&m);
    const int64_t e = routed_expert_index(m.module);
    if (!plan_.fused_experts || e < 0) continue;
    std::vector<const PlannedModule*>& experts =
        fused_experts_[consumer_module(plan_, m.module) + m.module.substr(m.module.rfind('.'))];
    if (experts.size() <= static_cast<size_t>(e)) experts.resize(static_cast<size_t>(e) + 1);
    experts[static_cast<size_t>(e)] = &m;
  }
  for (const auto& [fused, experts] : fused_experts_) {
    for (size_t e = 0; e < experts.size(); ++e) {
      STRATA_CHECK(experts[e] != nullptr, ckpt_.dir(), ": '", fused, "' has no expert ", e, " of ",
                   experts.size(), "; fused experts are written from experts 0..E-1");
      STRATA_CHECK(experts[e]->shape == experts[0]->shape && experts[e]->dtype == experts[0]->dtype,
                   ckpt_.dir(), ": '", experts[e]->module, "' is ", dtype_name(experts[e]->dtype),
                   " ", shape_str(experts[e]->shape), " but '", experts[0]->module, "' is ",
                   dtype_name(experts[0]->dtype), " ", shape_str(experts[0]->shape),
                   "; the experts of one projection are written as one tensor");
    }
  }
  // Classified on several threads (208k names on a Kimi-K2), distributed in name order.
  std::vector<TensorClass> classes(names.size());
  parallel_chunks(names.size(), startup_threads(), 4096, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i)
      classes[i] = classify_tensor(arch_, names[i]);
  });
  // The head: the embeddings, then the rest outside the layers, in name order each.
  std::vector<std::string> rest;
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string& name = names[i];
    const TensorClass& c = classes[i];
    if (c.layer >= 0 && c.layer < plan_.num_layers && c.kind != TensorKind::kMtp) {
      layer_tensors_[c.layer].push_back(name);
    } else if (c.kind == TensorKind::kEmbedding) {
      embedding_tensors_.push_back(name);
    } else {
      rest.push_back(name);
    }
  }
  head_tensors_ = embedding_tensors_;
  head_tensors_.insert(head_tensors_.end(), rest.begin(), rest.end());
  auto append = [&](std::vector<TensorSpec> specs) {
    for (TensorSpec& t : specs)
      outputs_.push_back(std::move(t));
    step_end_.push_back(outputs_.size());
  };
  // Each layer's outputs on several threads, appended in step order (every layer has its entry
  // first: the threads only read the map).
  for (int64_t l = 0; l < plan_.num_layers; ++l)
    layer_tensors_[l];
  std::vector<std::vector<TensorSpec>> layer_specs(static_cast<size_t>(plan_.num_layers));
  parallel_chunks(layer_specs.size(), startup_threads(), 1, [&](size_t begin, size_t end) {
    for (size_t l = begin; l < end; ++l) {
      layer_specs[l] = outputs_of(layer_tensors_.at(static_cast<int64_t>(l)));
      for (TensorSpec& t : kv_outputs(static_cast<int64_t>(l)))
        layer_specs[l].push_back(std::move(t));
    }
  });
  append(outputs_of(head_tensors_));
  for (std::vector<TensorSpec>& specs : layer_specs)
    append(std::move(specs));
  for (const TensorSpec& t : outputs_)
    output_bytes_ += t.nbytes();  // asked once a layer by the progress line
  ShardOptions w;
  w.max_shard_bytes = options_.max_shard_bytes;
  writer_ = std::make_unique<PlannedShardWriter>(out_dir_, outputs_, w);
}

// What write_tensors writes for `names`, in the same order (quantize_module for quantized ones).
std::vector<TensorSpec> ModeloptExporter::outputs_of(const std::vector<std::string>& names) const {
  std::vector<TensorSpec> out;
  for (const std::string& name : names) {
    if (is_compressed_aux(ckpt_, name)) continue;  // consumed by its module's decompression
    if (const std::optional<FusedMember> f = fused_member(name)) {
      if (f->expert == 0) {
        for (TensorSpec& t : fused_outputs(*f))
          out.push_back(std::move(t));
      }
      continue;
    }
    const PlannedModule* m = module_of(name);
    if (m && m->format == QFormat::kNone && m->source != SourceCompression::kNone) {
      out.push_back({m->module + ".weight", DType::kBF16, m->shape});
      continue;
    }
    if (!m || m->format == QFormat::kNone) {
      const TensorEntry& e = ckpt_.entry(name);
      out.push_back({name, upcast_to_f32(name) ? DType::kF32 : e.dtype, e.shape});
      continue;
    }
    const std::string& M = m->module;
    const int64_t rows = m->shape[0], cols = m->shape[1];
    switch (m->format) {
      case QFormat::kNvfp4:
      case QFormat::kW4A16Nvfp4:
        out.push_back({M + ".weight", DType::kU8, {rows, cols / 2}});
        out.push_back({M + ".weight_scale", DType::kF8E4M3, {rows, cols / 16}});
        out.push_back({M + ".weight_scale_2", DType::kF32, {}});
        if (m->format == QFormat::kNvfp4) out.push_back({M + ".input_scale", DType::kF32, {}});
        break;
      case QFormat::kFp8:
        out.push_back({M + ".weight", DType::kF8E4M3, {rows, cols}});
        out.push_back({M + ".weight_scale", DType::kF32, {}});
        out.push_back({M + ".input_scale", DType::kF32, {}});
        break;
      case QFormat::kMxfp8:
        out.push_back({M + ".weight", DType::kF8E4M3, {rows, cols}});
        out.push_back({M + ".weight_scale", DType::kU8, {rows, cols / 32}});
        break;
      case QFormat::kW4A16Nvfp4Bs32:
        out.push_back({M + ".weight", DType::kU8, {rows, cols / 2}});
        out.push_back({M + ".weight_scale", DType::kF8E4M3, {rows, cols / 32}});
        out.push_back({M + ".weight_scale_2", DType::kF32, {}});
        break;
      case QFormat::kMxfp4:
        out.push_back({M + ".weight", DType::kU8, {rows, cols / 2}});
        out.push_back({M + ".weight_scale", DType::kU8, {rows, cols / 32}});
        break;
      case QFormat::kFp8PbWo: {
        // quant/fp8.h: [ceil(out/128), 1, ceil(in/128), 1], or 0-d for a single block.
        const int64_t nr = (rows + kFp8PbBlock - 1) / kFp8PbBlock;
        const int64_t nc = (cols + kFp8PbBlock - 1) / kFp8PbBlock;
        out.push_back({M + ".weight", DType::kF8E4M3, {rows, cols}});
        out.push_back(
            {M + ".weight_scale", DType::kF32, nr * nc == 1 ? Shape{} : Shape{nr, 1, nc, 1}});
        break;
      }
      case QFormat::kNone:
        break;
    }
  }
  return out;
}

std::vector<TensorSpec> ModeloptExporter::kv_outputs(int64_t layer) const {
  std::vector<TensorSpec> out;
  if (std::find(plan_.kv_layers.begin(), plan_.kv_layers.end(), layer) == plan_.kv_layers.end())
    return out;
  const std::string p = attention_prefix(plan_, layer);
  STRATA_CHECK(!p.empty(), "layer ", layer,
               " has no self_attn module to attach k/v cache scales to");
  for (const char* kv : {"k", "v"}) {  // in write_layer's order
    out.push_back({p + kv + "_proj." + kv + "_scale", DType::kF32, {}});
    if (kv_cache_affine(plan_.recipe.kv_cache))
      out.push_back({p + kv + "_proj." + kv + "_bias", kv_bias_dtype(config_),
                     kv_bias_shape(config_, kv[0] == 'k')});
  }
  return out;
}

void ModeloptExporter::resume(int64_t next_step) {
  STRATA_ASSERT(next_step >= 0 && next_step <= steps(), "resume at step ", next_step);
  writer_->resume(next_step == 0 ? 0 : step_end_[static_cast<size_t>(next_step - 1)]);
}

void ModeloptExporter::release_source(int64_t step) const {
  for (const std::string& name : step_sources(step))
    ckpt_.release(name);
}

uint64_t ModeloptExporter::source_bytes(int64_t step) const {
  uint64_t n = 0;
  for (const std::string& name : step_sources(step)) {
    const TensorEntry& e = ckpt_.entry(name);
    n += e.end - e.begin;
  }
  return n;
}

uint64_t ModeloptExporter::output_bytes() const {
  return output_bytes_;
}

uint64_t ModeloptExporter::disk_bytes(uint64_t block) const {
  auto blocks = [block](uint64_t n) { return (n + block - 1) / block * block; };
  uint64_t modules = 4096;
  for (const PlannedModule& m : plan_.modules)
    modules += m.module.size() + 64;
  std::error_code ec;
  const uint64_t config = fs::file_size(fs::path(ckpt_.dir()) / "config.json", ec);
  uint64_t n = writer_->disk_bytes(block) + blocks((ec ? 0 : config) + modules) + blocks(modules);
  for (const auto& e : fs::directory_iterator(ckpt_.dir(), ec)) {
    if (e.is_regular_file(ec) && is_copied_sidecar(e.path().filename().string()))
      n += blocks(e.file_size(ec));
  }
  return n;
}

ModeloptExporter::~ModeloptExporter() = default;

void ModeloptExporter::write_head() {
  write_tensors(head_tensors_, nullptr);
}

LayerReport ModeloptExporter::write_layer(int64_t layer, const MaxCalibrator& calib,
                                          const PrecomputedWeights* precomputed) {
  LayerReport report;
  report.layer = layer;
  group_weight_amax_.clear();
  group_input_amax_.clear();
  group_mxfp4_max_.clear();
  pre_ = precomputed;
  write_tensors(layer_tensors_[layer], &calib);
  pre_ = nullptr;
  for (const PlannedModule* m : layer_modules_[layer]) {
    if (routed_expert_index(m->module) < 0) continue;
    if (!(m->module.ends_with(".gate_proj") || m->module.ends_with(".w1") ||
          (plan_.fused_experts && m->module.ends_with(".gate_up_proj"))))
      continue;
    ++report.experts;
    const MaxCalibrator::Stat* s = calib.find(m->module);
    const size_t e = static_cast<size_t>(routed_expert_index(m->module));
    if (report.expert_tokens.size() <= e) report.expert_tokens.resize(e + 1, -1);
    report.expert_tokens[e] = s ? s->rows : 0;
    if (!s || s->rows == 0) ++report.experts_without_tokens;
  }
  if (std::find(plan_.kv_layers.begin(), plan_.kv_layers.end(), layer) != plan_.kv_layers.end()) {
    const std::string p = attention_prefix(plan_, layer);
    STRATA_CHECK(!p.empty(), "layer ", layer,
                 " has no self_attn module to attach k/v cache scales to");
    const bool affine = kv_cache_affine(plan_.recipe.kv_cache);
    for (const char* kv : {"k", "v"}) {
      const std::string observed = p + kv + "_cache";
      const MaxCalibrator::Stat* s = calib.find(observed);
      STRATA_CHECK(s && s->rows > 0, "no calibration data reached ", observed);
      const std::string name = p + kv + "_proj." + kv + "_scale";
      const std::string bias_name = p + kv + "_proj." + kv + "_bias";
      if (rank_ != 0) {
        writer_->skip(name);
        if (affine) writer_->skip(bias_name);
        continue;
      }
      if (!affine) {
        writer_->add(name, Tensor::scalar_f32(fp8_kv_cache_scale(s->amax, name)));
        continue;
      }
      // The affine modes: the amax of the input less the bias (calib/max_calib.h).
      const DType dtype = kv_bias_dtype(config_);
      const std::optional<KvAffine> a = kv_affine(*s, dtype);
      STRATA_CHECK(a.has_value() && s->layout.heads > 0, "no calibration sequence reached ",
                   observed);
      writer_->add(name, Tensor::scalar_f32(fp8_kv_cache_scale(a->amax, name)));
      writer_->add(bias_name, kv_bias_tensor(*a, s->layout.heads, dtype));
    }
  }
  return report;
}

const PlannedModule* ModeloptExporter::module_of(const std::string& name) const {
  for (std::string_view suffix : {".weight", ".weight_packed", ".weight_blocks"}) {
    if (name.size() > suffix.size() && name.ends_with(suffix))
      return plan_.find(std::string_view(name).substr(0, name.size() - suffix.size()));
  }
  return nullptr;
}

Tensor ModeloptExporter::source_weight(const std::string& module) const {
  const std::optional<SourceWeight> sw = find_source_weight(ckpt_, module);
  STRATA_ASSERT(sw.has_value(), "planned module without a source weight: ", module);
  return read_source_weight(ckpt_, *sw);
}

int ModeloptExporter::exact_mxfp4_group_max(const PlannedModule& m) {
  if (!options_.exact_mxfp4 || m.source != SourceCompression::kMxfp4) return -1;
  std::lock_guard<std::mutex> lock(memo_mu_);  // write_tensors quantizes on several threads
  const std::string key = weight_group_key(plan_, m.module);
  if (auto it = group_mxfp4_max_.find(key); it != group_mxfp4_max_.end()) return it->second;
  std::vector<const PlannedModule*> members;
  for (const PlannedModule* o : layer_modules_.at(m.layer)) {
    if (weight_group_key(plan_, o->module) == key) members.push_back(o);
  }
  int best = -1;
  bool all_mxfp4 = true;
  for (const PlannedModule* o : members) {
    if (o->source != SourceCompression::kMxfp4) {
      all_mxfp4 = false;
      break;
    }
    best = std::max(best, mxfp4_max_scale(ckpt_.tensor(o->module + ".weight_blocks"),
                                          ckpt_.tensor(o->module + ".weight_scales")));
  }
  int result = all_mxfp4 ? best : -1;
  for (const PlannedModule* o : members) {
    if (result < 0) break;
    if (!mxfp4_to_nvfp4_exact(ckpt_.tensor(o->module + ".weight_blocks"),
                              ckpt_.tensor(o->module + ".weight_scales"), result)) {
      result = -1;
    }
  }
  if (result < 0) {
    log_warn("'", m.module, "': the exact MXFP4 -> NVFP4 conversion does not apply to its fused ",
             "group (a member is not MXFP4, or its scales span more than 17 binades); it is ",
             "requantized from its decompressed bf16 weight");
  }
  group_mxfp4_max_[key] = result;
  return result;
}

void ModeloptExporter::set_ranks(int rank, int ranks,
                                 const std::function<int(const std::string&)>& pinned) {
  STRATA_ASSERT(ranks >= 1 && rank >= 0 && rank < ranks, "rank ", rank, " of ", ranks);
  rank_ = rank;
  ranks_ = ranks;
  owner_.clear();
  if (ranks_ == 1) return;
  writer_->set_shared(rank_ == 0);
  assign_owners(head_tensors_);
  for (const auto& [layer, names] : layer_tensors_)
    assign_owners(names, pinned);
}

void ModeloptExporter::assign_owners(const std::vector<std::string>& names,
                                     const std::function<int(const std::string&)>& pinned) {
  // Units in order of first appearance, with their source bytes; a pinned unit takes the rank
  // of its tensors and is left out of the byte split.
  std::vector<std::string> unit_of(names.size());
  std::vector<std::string> units;
  std::map<std::string, uint64_t> unit_bytes;
  std::map<std::string, int> unit_owner;
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string& name = names[i];
    // A compressed source's scales go with their module.
    const PlannedModule* m = module_of(name);
    if (!m && is_compressed_aux(ckpt_, name))
      m = plan_.find(std::string_view(name).substr(0, name.rfind(".weight")));
    unit_of[i] =
        m && m->format != QFormat::kNone ? "group:" + weight_group_key(plan_, m->module) : name;
    // A fused tensor is written by one rank, which reads all its experts.
    if (const std::optional<FusedMember> f = fused_member(name))
      unit_of[i] = "fused:" + f->fused + (f->bias ? "_bias" : "");
    const int pin = pinned ? pinned(name) : -1;
    if (pin >= 0) {
      STRATA_ASSERT(pin < ranks_, "rank ", pin, " pinned for '", name, "'");
      auto [it, fresh] = unit_owner.emplace(unit_of[i], pin);
      STRATA_ASSERT(it->second == pin, "'", name, "' is pinned to another rank than its group");
      continue;
    }
    if (!unit_bytes.count(unit_of[i])) units.push_back(unit_of[i]);
    const TensorEntry& e = ckpt_.entry(name);
    unit_bytes[unit_of[i]] += e.end - e.begin;
  }
  uint64_t total = 0;
  for (const auto& [u, b] : unit_bytes)
    total += b;
  // Contiguous ranges: a unit goes to the rank whose share holds the unit's middle byte.
  uint64_t before = 0;
  for (const std::string& u : units) {
    STRATA_ASSERT(!unit_owner.count(u), "unit '", u, "' is partly pinned");
    const uint64_t mid = before + unit_bytes[u] / 2;
    const uint64_t r = total == 0 ? 0 : mid * static_cast<uint64_t>(ranks_) / total;
    unit_owner[u] = static_cast<int>(std::min<uint64_t>(r, static_cast<uint64_t>(ranks_ - 1)));
    before += unit_bytes[u];
  }
  for (size_t i = 0; i < names.size(); ++i)
    owner_[names[i]] = unit_owner[unit_of[i]];
}

int ModeloptExporter::owner_of(const std::string& name) const {
  if (ranks_ == 1) return 0;
  auto it = owner_.find(name);
  STRATA_ASSERT(it != owner_.end(), "no owner for '", name, "'");
  return it->second;
}

bool ModeloptExporter::upcast_to_f32(const std::string& name) const {
  if (!tensor_kept_in_fp32(arch_, name)) return false;
  const DType d = ckpt_.entry(name).dtype;
  return d == DType::kBF16 || d == DType::kF16;
}

bool ModeloptExporter::owns(const std::string& name) const {
  return owner_of(name) == rank_;
}

const std::vector<std::string>& ModeloptExporter::step_sources(int64_t step) const {
  static const std::vector<std::string> none;
  if (step == 0) return head_tensors_;
  auto it = layer_tensors_.find(step - 1);
  return it == layer_tensors_.end() ? none : it->second;
}

size_t export_workers() {
  return std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 16);
}

void ModeloptExporter::write_tensors(const std::vector<std::string>& names,
                                     const MaxCalibrator* calib) {
  // Quantized modules are quantized on up to `workers` threads, a window ahead of the writer;
  // every tensor is added in plan order, so the bytes do not depend on the thread count.
  // With ranks, a rank quantizes and writes only the tensors it owns.
  std::vector<const PlannedModule*> mods(names.size(), nullptr);
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string& name = names[i];
    if (is_compressed_aux(ckpt_, name) || !owns(name) || fused_member(name)) continue;
    const PlannedModule* m = module_of(name);
    if (!m || m->format == QFormat::kNone) continue;
    STRATA_ASSERT(calib != nullptr || !qformat_has_input_scale(m->format),
                  "quantized module outside a calibrated step: ", m->module);
    mods[i] = m;
  }
  const size_t workers = export_workers();
  using Outputs = std::vector<std::pair<std::string, Tensor>>;
  std::vector<std::future<Outputs>> pending(names.size());
  size_t launched = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    for (; launched < names.size() && launched < i + workers; ++launched) {
      if (!mods[launched]) continue;
      const PlannedModule* m = mods[launched];
      pending[launched] = std::async(workers > 1 ? std::launch::async : std::launch::deferred,
                                     [this, m, calib]() { return quantize_module(*m, calib); });
    }
    const std::string& name = names[i];
    if (is_compressed_aux(ckpt_, name)) continue;  // consumed by its module's decompression
    if (!owns(name)) {
      for (const TensorSpec& t : outputs_of({name}))
        writer_->skip(t.name);
      continue;
    }
    if (const std::optional<FusedMember> f = fused_member(name)) {
      if (f->expert == 0) {
        for (auto& [n, t] : fused_tensors(*f, calib))
          writer_->add(n, t);
      }
      continue;
    }
    if (!mods[i]) {
      const PlannedModule* m = module_of(name);
      if (m && m->source != SourceCompression::kNone)
        writer_->add(m->module + ".weight", source_weight(m->module));  // decompressed bf16
      else if (upcast_to_f32(name))
        writer_->add(name, ckpt_.tensor(name).to_f32());  // exact: bf16/f16 widen to fp32
      else
        writer_->add(name, ckpt_.tensor(name));  // a view: read from the mapping as written
      continue;
    }
    for (auto& [n, t] : pending[i].get())
      writer_->add(n, t);
  }
}

std::optional<ModeloptExporter::FusedMember> ModeloptExporter::fused_member(
    const std::string& name) const {
  if (!plan_.fused_experts) return std::nullopt;
  for (std::string_view suffix : {".weight", ".weight_blocks", ".weight_scales", ".bias"}) {
    if (name.size() <= suffix.size() || !name.ends_with(suffix)) continue;
    const std::string module = name.substr(0, name.size() - suffix.size());
    const int64_t e = routed_expert_index(module);
    if (e < 0) return std::nullopt;
    FusedMember f{consumer_module(plan_, module) + module.substr(module.rfind('.')), e,
                  suffix == ".bias"};
    if (!fused_experts_.count(f.fused)) return std::nullopt;
    return f;
  }
  return std::nullopt;
}

std::vector<TensorSpec> ModeloptExporter::fused_outputs(const FusedMember& f) const {
  const std::vector<const PlannedModule*>& experts = fused_experts_.at(f.fused);
  const PlannedModule& m = *experts[0];
  const int64_t E = static_cast<int64_t>(experts.size()), rows = m.shape[0], cols = m.shape[1];
  const std::string& P = f.fused;
  if (f.bias) {
    const TensorEntry& b = ckpt_.entry(m.module + ".bias");
    return {{P + "_bias", b.dtype, {E, b.shape.empty() ? 1 : b.shape[0]}}};
  }
  switch (m.format) {
    case QFormat::kNone:
      return {{P, m.dtype, {E, cols, rows}}};
    case QFormat::kNvfp4:
    case QFormat::kW4A16Nvfp4: {
      std::vector<TensorSpec> out = {{P, DType::kU8, {E, cols / 2, rows}},
                                     {P + "_weight_scale", DType::kF8E4M3, {E, cols / 16, rows}},
                                     {P + "_weight_scale_2", DType::kF32, {}}};
      if (m.format == QFormat::kNvfp4) out.push_back({P + "_input_scale", DType::kF32, {}});
      return out;
    }
    case QFormat::kFp8:
      return {{P, DType::kF8E4M3, {E, cols, rows}},
              {P + "_weight_scale", DType::kF32, {}},
              {P + "_input_scale", DType::kF32, {}}};
    case QFormat::kMxfp8:
    case QFormat::kW4A16Nvfp4Bs32:
    case QFormat::kMxfp4:
    case QFormat::kFp8PbWo:
      break;  // refused by make_plan
  }
  STRATA_ASSERT(false, "fused experts in format ", qformat_name(m.format), ": ", P);
  return {};
}

std::vector<std::pair<std::string, Tensor>> ModeloptExporter::fused_tensors(
    const FusedMember& f, const MaxCalibrator* calib) {
  const std::vector<const PlannedModule*>& experts = fused_experts_.at(f.fused);
  const int64_t E = static_cast<int64_t>(experts.size());
  const std::vector<TensorSpec> specs = fused_outputs(f);
  std::vector<std::pair<std::string, Tensor>> out;
  if (f.bias) {  // the experts' biases one after another, as they are
    Tensor fused = Tensor::zeros(specs[0].dtype, specs[0].shape);
    const size_t each = fused.nbytes() / static_cast<size_t>(E);
    for (int64_t e = 0; e < E; ++e) {
      const Tensor b = ckpt_.tensor(experts[static_cast<size_t>(e)]->module + ".bias");
      STRATA_ASSERT(b.nbytes() == each, "bias of ", experts[static_cast<size_t>(e)]->module);
      std::memcpy(fused.mutable_bytes() + static_cast<size_t>(e) * each, b.bytes(), each);
    }
    out.emplace_back(specs[0].name, std::move(fused));
    return out;
  }
  // Every expert as the per-expert module it is planned as (its packed rows and block scales are
  // ModelOpt's rows of the fused [E, out, in]; the scales come from the projection's groups),
  // then the 2-D tensors transposed into [E, in/k, out] and the scalars, equal in every expert,
  // written once. Expert 0 first: it fills the group memos the others read.
  using Outputs = std::vector<std::pair<std::string, Tensor>>;
  std::vector<Outputs> q(static_cast<size_t>(E));
  if (experts[0]->format == QFormat::kNone) {
    for (int64_t e = 0; e < E; ++e) {
      const std::string& M = experts[static_cast<size_t>(e)]->module;
      q[static_cast<size_t>(e)].emplace_back(M + ".weight", source_weight(M));
    }
  } else {
    q[0] = quantize_module(*experts[0], calib);
    const size_t workers = export_workers();
    std::vector<std::future<Outputs>> pending(static_cast<size_t>(E));
    size_t launched = 1;
    for (size_t e = 1; e < static_cast<size_t>(E); ++e) {
      for (; launched < static_cast<size_t>(E) && launched < e + workers; ++launched) {
        const PlannedModule* m = experts[launched];
        pending[launched] = std::async(workers > 1 ? std::launch::async : std::launch::deferred,
                                       [this, m, calib]() { return quantize_module(*m, calib); });
      }
      q[e] = pending[e].get();
    }
  }
  STRATA_ASSERT(q[0].size() == specs.size(), "fused outputs of ", f.fused);
  for (size_t k = 0; k < specs.size(); ++k) {
    const TensorSpec& spec = specs[k];
    const Tensor& t0 = q[0][k].second;
    if (t0.shape().size() == 2) {
      const int64_t rows = t0.shape()[0], cols = t0.shape()[1];
      const size_t size = static_cast<size_t>(dtype_bits(t0.dtype())) / 8;
      Tensor fused = Tensor::zeros(spec.dtype, spec.shape);
      STRATA_ASSERT(fused.nbytes() == t0.nbytes() * static_cast<size_t>(E), "fused ", spec.name);
      for (int64_t e = 0; e < E; ++e) {
        const Tensor& t = q[static_cast<size_t>(e)][k].second;
        STRATA_ASSERT(t.shape() == t0.shape() && t.dtype() == t0.dtype(), "expert ", e, " of ",
                      spec.name);
      }
      // The experts' transposes on the export workers, each a contiguous range of experts (the
      // bytes do not depend on the split).
      uint8_t* dst = fused.mutable_bytes();
      auto transpose_range = [&](int64_t e0, int64_t e1) {
        for (int64_t e = e0; e < e1; ++e)
          transpose_bytes(q[static_cast<size_t>(e)][k].second.bytes(), rows, cols, size,
                          dst + static_cast<size_t>(e) * t0.nbytes());
      };
      const int64_t parts = std::min<int64_t>(E, static_cast<int64_t>(export_workers()));
      std::vector<std::future<void>> done;
      for (int64_t p = 1; p < parts; ++p)
        done.push_back(
            std::async(std::launch::async, transpose_range, E * p / parts, E * (p + 1) / parts));
      transpose_range(0, E / parts);
      for (std::future<void>& d : done)
        d.get();
      out.emplace_back(spec.name, std::move(fused));
    } else {
      for (int64_t e = 1; e < E; ++e) {
        const Tensor& t = q[static_cast<size_t>(e)][k].second;
        STRATA_ASSERT(
            t.nbytes() == t0.nbytes() && std::memcmp(t.bytes(), t0.bytes(), t0.nbytes()) == 0,
            "expert ", e, " of ", f.fused, " has another ", spec.name);
      }
      out.emplace_back(spec.name, t0);
    }
  }
  return out;
}

std::vector<std::pair<std::string, Tensor>> ModeloptExporter::quantize_module(
    const PlannedModule& m, const MaxCalibrator* calib) {
  std::vector<std::pair<std::string, Tensor>> out;
  const std::string& M = m.module;
  // Weights quantized elsewhere (the GPU engine), named and written as if quantized here; the
  // source weight (decompressed, for a compressed source) is read only when quantized here.
  const auto pre_it = pre_ ? pre_->find(M) : decltype(pre_->find(M)){};
  const QuantizedWeight* pre = pre_ && pre_it != pre_->end() ? &pre_it->second : nullptr;
  const bool have_pre = pre != nullptr;
  const Tensor w = have_pre ? Tensor() : source_weight(M);
  // Weight amax of the fused group (NVFP4 shares weight_scale_2 within it).
  static const std::vector<const PlannedModule*> kNoModules;
  const auto lm = layer_modules_.find(m.layer);  // no insertion: several threads read the map
  const std::vector<const PlannedModule*>& layer_modules =
      lm == layer_modules_.end() ? kNoModules : lm->second;
  auto group_weight_amax = [&]() {
    const std::string key = weight_group_key(plan_, m.module);
    {
      std::lock_guard<std::mutex> lock(memo_mu_);
      if (auto it = group_weight_amax_.find(key); it != group_weight_amax_.end()) return it->second;
    }
    // One weight at a time (a compressed source's is decompressed for this), max-combined as
    // the backend combines a group.
    float a = 0.0f;
    for (const PlannedModule* o : layer_modules) {
      if (weight_group_key(plan_, o->module) != key) continue;
      const float x =
          o->module == m.module ? weight_amax_of({w}) : weight_amax_of({source_weight(o->module)});
      a = std::isnan(x) || std::isnan(a) ? NAN : std::max(a, x);
    }
    std::lock_guard<std::mutex> lock(memo_mu_);
    group_weight_amax_[key] = a;
    return a;
  };
  const WeightCalib& algo = plan_.recipe.algorithm;
  // A shared FP8 weight amax searched over every member of the group (memoized as the max one).
  auto searched_fp8_amax = [&]() {
    const std::string key = weight_group_key(plan_, m.module) + "#searched";
    {
      std::lock_guard<std::mutex> lock(memo_mu_);
      if (auto it = group_weight_amax_.find(key); it != group_weight_amax_.end()) return it->second;
    }
    std::vector<Tensor> members;
    for (const PlannedModule* o : layer_modules) {
      if (weight_group_key(plan_, o->module) != weight_group_key(plan_, m.module)) continue;
      members.push_back(o->module == m.module ? w : source_weight(o->module));
    }
    const float a = fp8_search_amax(members, group_weight_amax(), algo, M);
    std::lock_guard<std::mutex> lock(memo_mu_);
    group_weight_amax_[key] = a;
    return a;
  };
  // Activation amax shared by the input-scale group (fused group, or all experts of the layer).
  auto group_input_amax = [&](bool fused) {
    if (m.input_amax) return *m.input_amax;  // the recipe's constant (RecipeRule::input_amax)
    const std::string key = fused ? input_group_key(plan_, m.module) : m.module;
    {
      std::lock_guard<std::mutex> lock(memo_mu_);
      if (auto it = group_input_amax_.find(key); it != group_input_amax_.end()) return it->second;
    }
    // nvfp4_act_headroom (calib/max_calib.h) for an NVFP4 input: ModelOpt 0.47 keeps one
    // histogram per input quantizer, and transformers 5's fused experts have one input quantizer
    // per projection for all experts of the layer, so a routed expert's histograms add up over
    // the layer's experts (the pooled statistic); the modules of any other group read one input
    // each with its own quantizer, and their amaxes are max-combined as for max calibration.
    const bool headroom = plan_.recipe.calibration == CalibrationMethod::kNvfp4ActHeadroom &&
                          m.format == QFormat::kNvfp4;
    const bool pooled = headroom && routed_expert_index(m.module) >= 0;
    std::vector<int64_t> hist;
    float a = 0.0f;
    bool seen = false;
    for (const PlannedModule* o : layer_modules) {
      if ((fused ? input_group_key(plan_, o->module) : o->module) != key) continue;
      const MaxCalibrator::Stat* s = calib->find(o->module);
      if (!s || s->rows == 0) continue;
      float x = s->amax;
      if (headroom && !std::isnan(x)) {
        STRATA_ASSERT(s->hist.size() == static_cast<size_t>(kHeadroomBins),
                      "no block histogram of ", o->module);
        if (pooled) {
          if (hist.empty()) hist.assign(kHeadroomBins, 0);
          for (size_t i = 0; i < hist.size(); ++i)
            hist[i] += s->hist[i];
          seen = true;
          continue;
        }
        const std::optional<float> h = headroom_amax(s->hist);
        if (!h) continue;  // no non-zero block: no amax (ModelOpt's compute_amax gives None)
        x = *h;
      }
      seen = true;
      a = std::isnan(x) || std::isnan(a) ? NAN : std::max(a, x);
    }
    if (pooled && seen && !std::isnan(a)) {
      const std::optional<float> h = headroom_amax(hist);
      seen = h.has_value();
      if (h) a = *h;
    }
    STRATA_CHECK(seen, "no calibration token reached '", m.module,
                 "' (nor any module sharing its input scale)",
                 headroom ? ", or every block it saw was zero (nvfp4_act_headroom)" : "",
                 "; use more or different calibration data, or exclude it in the recipe");
    std::lock_guard<std::mutex> lock(memo_mu_);
    group_input_amax_[key] = a;
    return a;
  };
  switch (m.format) {
    case QFormat::kNvfp4:
    case QFormat::kW4A16Nvfp4: {
      Nvfp4Weight q;
      if (have_pre) {
        STRATA_ASSERT(pre->nvfp4, "precomputed weight of ", M, " is not NVFP4");
        q = *pre->nvfp4;
      } else if (algo.searches()) {
        // Static NVFP4 block scales chosen by the recipe's search (quant/scale_search.h) under
        // the group's weight_scale_2; local_hessian weighs the error by the module's inputs, and
        // without any (an expert no token reached, a module outside the decoder layers) it is
        // the plain search, as in ModelOpt.
        const BlockHessian* h = calib ? calib->hessian(M) : nullptr;
        const std::vector<double> hessian = h ? h->normalized() : std::vector<double>{};
        const ops::WeightSearch search{algo, hessian};
        q = *host_backend()
                 .quantize_weight(stored(w), m.format, group_weight_amax(), M, &search)
                 .nvfp4;
      } else {
        const int mx_max = exact_mxfp4_group_max(m);
        q = mx_max >= 0 ? *mxfp4_to_nvfp4_exact(ckpt_.tensor(M + ".weight_blocks"),
                                                ckpt_.tensor(M + ".weight_scales"), mx_max)
                        : *host_backend()
                               .quantize_weight(stored(w), m.format, group_weight_amax(), M)
                               .nvfp4;
      }
      out.emplace_back(M + ".weight", std::move(q.packed));
      out.emplace_back(M + ".weight_scale", std::move(q.block_scale));
      out.emplace_back(M + ".weight_scale_2", std::move(q.global_scale));
      if (m.format == QFormat::kNvfp4) {
        out.emplace_back(M + ".input_scale",
                         Tensor::scalar_f32(nvfp4_input_scale(group_input_amax(true), M)));
      }
      break;
    }
    case QFormat::kFp8: {
      // ModelOpt keeps FP8 weight and input scales per module (vLLM takes the max when it
      // fuses); routed experts share the layer's input scale and their gate/up group's weight
      // scale (export/plan.h fp8_shares_weight_amax).
      STRATA_ASSERT(!have_pre || pre->fp8, "precomputed weight of ", M, " is not FP8");
      const bool shared = fp8_shares_weight_amax(M);
      Fp8Weight q;
      if (have_pre) {
        q = *pre->fp8;
      } else if (algo.searches() && !algo.fp8_scale_sweep) {
        // Plain mse searches FP8 weights too (fp8_scale_sweep leaves them at max): the amax of
        // the module, or of its shared-amax group searched over all members together.
        q = fp8_quantize_clipped(w, shared ? searched_fp8_amax() : [&] {
          return fp8_search_amax(std::span<const Tensor>(&w, 1), weight_amax_of({w}), algo, M);
        }(), M);
      } else {
        ops::StoredWeight sw = stored(w);
        // ModelOpt exports gpt-oss's experts as one 3-D tensor, dividing in fp32 (backend.h).
        sw.fp32_quotient = plan_.fused_experts && m.kind == TensorKind::kRoutedExperts;
        q = *host_backend()
                 .quantize_weight(sw, m.format, shared ? group_weight_amax() : weight_amax_of({w}),
                                  M)
                 .fp8;
      }
      out.emplace_back(M + ".weight", std::move(q.weight));
      out.emplace_back(M + ".weight_scale", std::move(q.scale));
      const bool expert = routed_expert_index(M) >= 0;
      out.emplace_back(M + ".input_scale",
                       Tensor::scalar_f32(fp8_input_scale(group_input_amax(expert))));
      break;
    }
    case QFormat::kMxfp8: {
      STRATA_ASSERT(!have_pre || pre->mxfp8, "precomputed weight of ", M, " is not MXFP8");
      Mxfp8Weight q = have_pre
                          ? *pre->mxfp8
                          : *host_backend().quantize_weight(stored(w), m.format, 0.0f, M).mxfp8;
      out.emplace_back(M + ".weight", std::move(q.weight));
      out.emplace_back(M + ".weight_scale", std::move(q.scale));
      break;
    }
    case QFormat::kW4A16Nvfp4Bs32: {
      // Quantized here only (engine/weight_quantizer.h leaves it to the exporter); weight-only,
      // weight_scale_2 shared by the fused group as for 16-blocks.
      STRATA_ASSERT(!have_pre, "precomputed weight of ", M, " in nvfp4_bs32");
      Nvfp4Weight q =
          *host_backend().quantize_weight(stored(w), m.format, group_weight_amax(), M).nvfp4;
      out.emplace_back(M + ".weight", std::move(q.packed));
      out.emplace_back(M + ".weight_scale", std::move(q.block_scale));
      out.emplace_back(M + ".weight_scale_2", std::move(q.global_scale));
      break;
    }
    case QFormat::kFp8PbWo: {
      // Quantized here only (engine/weight_quantizer.h); weight-only, every module its own blocks
      // (ModelOpt 0.47 fuses no amax of a block-scaled FP8 weight).
      STRATA_ASSERT(!have_pre, "precomputed weight of ", M, " in fp8_pb_wo");
      // A fused group of single-block weights shares one amax (quant/fp8.h).
      int singles = 0, members = 0;
      const std::string key = weight_group_key(plan_, M);
      for (const PlannedModule* o : layer_modules) {
        if (weight_group_key(plan_, o->module) != key) continue;
        ++members;
        singles += fp8_pb_single_block(o->shape);
      }
      STRATA_CHECK(singles == 0 || singles == members, "fp8_pb_wo: '", M,
                   "' is fused with modules of the same input whose weights are partly one "
                   "128x128 block and partly more; ModelOpt 0.47 unifies such a group's amax only "
                   "when its first module is one block, and then cannot export it; strata refuses "
                   "(exclude some of these modules or pick another format)");
      const float amax = singles > 0 && members > 1 ? group_weight_amax() : 0.0f;
      Fp8Weight q = *host_backend().quantize_weight(stored(w), m.format, amax, M).fp8;
      out.emplace_back(M + ".weight", std::move(q.weight));
      out.emplace_back(M + ".weight_scale", std::move(q.scale));
      break;
    }
    case QFormat::kMxfp4: {
      STRATA_ASSERT(!have_pre, "precomputed weight of ", M, " in mxfp4");
      Mxfp4Weight q = *host_backend().quantize_weight(stored(w), m.format, 0.0f, M).mxfp4;
      out.emplace_back(M + ".weight", std::move(q.packed));
      out.emplace_back(M + ".weight_scale", std::move(q.scale));
      break;
    }
    case QFormat::kNone:
      STRATA_ASSERT(false, "quantize_module on an unquantized module");
  }
  return out;
}

namespace {

// config.json's config_groups of a MIXED_PRECISION export, as ModelOpt 0.47's
// convert_hf_quant_config_format writes them: one group per distinct quantized_layers entry
// (quant_algo and group_size), numbered in the order the modules come in the model (ModelOpt walks
// named_modules: layers in order, attention before the MLP; strata orders by layer, then by
// TensorKind, which lists them so), each with its scheme (_quant_algo_to_group_config: MXFP8 also
// names input_activations there; an algorithm it does not know, mxfp4 or fp8_pb_wo, is only
// {"quant_algo": ...}) and the sorted names of its layers as targets.
Json mixed_config_groups(const QuantPlan& plan) {
  std::vector<const PlannedModule*> order;
  for (const PlannedModule& m : plan.modules) {
    if (m.format != QFormat::kNone) order.push_back(&m);
  }
  std::stable_sort(order.begin(), order.end(), [](const PlannedModule* a, const PlannedModule* b) {
    const int64_t la = a->layer < 0 ? INT64_MAX : a->layer,
                  lb = b->layer < 0 ? INT64_MAX : b->layer;
    return la != lb ? la < lb : a->kind < b->kind;
  });
  std::vector<std::pair<QFormat, std::set<std::string>>> keyed;  // by (quant_algo, group_size)
  for (const PlannedModule* m : order) {
    auto same = [&](const auto& k) {
      return qformat_quant_algo(k.first) == qformat_quant_algo(m->format) &&
             qformat_group_size(k.first) == qformat_group_size(m->format);
    };
    auto it = std::find_if(keyed.begin(), keyed.end(), same);
    if (it == keyed.end()) it = keyed.insert(keyed.end(), {m->format, {}});
    it->second.insert(consumer_module(plan, m->module));
  }
  Json groups = Json::object();
  int g = 0;
  for (const auto& [f, names] : keyed) {
    Json group = Json::object();
    if (f == QFormat::kMxfp4 || f == QFormat::kFp8PbWo) {
      group["quant_algo"] = std::string(qformat_quant_algo(f));
    } else {
      if (qformat_has_input_scale(f) || f == QFormat::kMxfp8)
        group["input_activations"] = quant_scheme(f);
      group["weights"] = quant_scheme(f);
    }
    Json targets = Json::array();
    for (const std::string& n : names)
      targets.push_back(n);
    group["targets"] = targets;
    groups["group_" + std::to_string(g++)] = group;
  }
  return groups;
}

}  // namespace

void ModeloptExporter::stage_final_files() {
  auto staged = std::make_unique<StagedFiles>(out_dir_);
  if (const auto [index, text] = writer_->index_file(); !index.empty()) staged->stage(index, text);
  const std::string algo = plan_.quant_algo();
  const std::vector<std::string> exclude = exclude_modules(plan_);
  const std::string kv_algo(kv_cache_quant_algo(plan_.recipe.kv_cache));
  Json producer = Json::object();
  producer["name"] = "modelopt";
  producer["version"] = options_.producer_version;

  // hf_quant_config.json (format.md §5, key order as there).
  Json q = Json::object();
  q["quant_algo"] = algo.empty() ? Json(nullptr) : Json(algo);
  q["kv_cache_quant_algo"] = kv_algo.empty() ? Json(nullptr) : Json(kv_algo);
  std::set<QFormat> formats;
  for (const PlannedModule& m : plan_.modules) {
    if (m.format != QFormat::kNone) formats.insert(m.format);
  }
  if (formats.size() == 1 && qformat_group_size(*formats.begin()) > 0)
    q["group_size"] = qformat_group_size(*formats.begin());
  q["exclude_modules"] = exclude;
  if (algo == "MIXED_PRECISION") {
    Json layers = Json::object();
    std::string last;
    for (const PlannedModule& m : plan_.modules) {
      if (m.format == QFormat::kNone) continue;
      // A fused-experts plan's experts (adjacent in the sorted plan) are one consumer module of
      // one format (make_plan); any other module is its own.
      const std::string name = consumer_module(plan_, m.module);
      if (name == last) continue;
      last = name;
      Json l = Json::object();
      l["quant_algo"] = std::string(qformat_quant_algo(m.format));
      if (qformat_group_size(m.format) > 0) l["group_size"] = qformat_group_size(m.format);
      json_append(layers, name, l);  // distinct: the plan's modules, experts once per layer
    }
    q["quantized_layers"] = layers;
  }
  Json hf = Json::object();
  hf["producer"] = producer;
  hf["quantization"] = q;
  staged->stage("hf_quant_config.json", hf.dump(4) + "\n");

  // config.json: the source's, any stale quantization_config removed, ours at top level.
  Json config = config_.raw;
  // Also from every nested language-model config (io/hf_config.h unwraps them level by level).
  for (Json* level = &config; level != nullptr;) {
    level->erase("quantization_config");
    Json* next = nullptr;
    for (const char* nested : {"text_config", "language_config"}) {
      if (level->contains(nested) && (*level)[nested].is_object()) next = &(*level)[nested];
    }
    level = next;
  }
  Json qc = Json::object();
  Json groups = Json::object();
  if (algo == "MIXED_PRECISION") {
    groups = mixed_config_groups(plan_);
  } else {
    int g = 0;
    for (QFormat f : formats) {
      // ModelOpt 0.47's convert_hf_quant_config_format has no config group for MXFP4 or FP8 per
      // block (their quant_algo "mxfp4" / "fp8_pb_wo" falls through): such an export's
      // quantization_config has none.
      if (f == QFormat::kMxfp4 || f == QFormat::kFp8PbWo) continue;
      Json group = Json::object();
      if (qformat_has_input_scale(f)) group["input_activations"] = quant_scheme(f);
      group["weights"] = quant_scheme(f);
      group["targets"] = Json::array({"Linear"});
      groups["group_" + std::to_string(g++)] = group;
    }
  }
  if (!groups.empty() || formats.empty()) qc["config_groups"] = groups;
  qc["ignore"] = exclude;
  qc["quant_algo"] = algo.empty() ? Json(nullptr) : Json(algo);
  if (kv_algo == "FP8") {
    Json s = Json::object();
    s["dynamic"] = false;
    s["num_bits"] = 8;
    s["type"] = "float";
    qc["kv_cache_scheme"] = s;
  } else if (!kv_algo.empty()) {
    // ModelOpt 0.47's convert_hf_config writes any other KV algorithm's name as the scheme.
    qc["kv_cache_scheme"] = kv_algo;
  }
  qc["producer"] = producer;
  qc["quant_method"] = "modelopt";
  // No top-level group_size: ModelOpt 0.47's convert_hf_config writes it in config_groups only.
  if (algo == "MIXED_PRECISION") qc["quantized_layers"] = q["quantized_layers"];
  config["quantization_config"] = qc;
  staged->stage("config.json", config.dump(2) + "\n");

  // Every other source file, byte for byte (tokenizer, generation config, chat template ...).
  std::vector<fs::path> sidecars;
  for (const auto& e : fs::directory_iterator(ckpt_.dir())) {
    if (!e.is_regular_file()) continue;
    const std::string n = e.path().filename().string();
    if (is_copied_sidecar(n)) {
      sidecars.push_back(e.path());
    } else if (is_foreign_weights(n)) {
      log_warn(ckpt_.dir(), "/", n, ": weights in another format are not copied to the export");
    }
  }
  std::sort(sidecars.begin(), sidecars.end());
  for (const fs::path& p : sidecars) {
    std::ifstream in(p, std::ios::binary);
    STRATA_CHECK(in, p.string(), ": cannot open for reading");
    std::ostringstream ss;
    ss << in.rdbuf();
    staged->stage(p.filename().string(), ss.str());
  }
  staged_ = std::move(staged);
}

std::vector<std::string> ModeloptExporter::finish(const std::function<void(const char*)>& step) {
  if (!staged_) stage_final_files();
  if (step) step("index and config files staged");
  std::vector<std::string> files = writer_->finish();
  if (step) step("shards synced and renamed");
  for (std::string& f : staged_->publish())
    files.push_back(std::move(f));
  staged_.reset();
  if (step) step("index and config files renamed");
  return files;
}

}  // namespace strata
