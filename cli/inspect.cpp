// strata inspect DIR [--json]: what a checkpoint holds and what quantizing it would give.
//
// Reads config.json and every shard header (nothing else of the weights), classifies each
// tensor by its hub name (model/arch.h) and prints: the architecture, which layers are dense or
// MoE, parameters and bytes per kind, bytes per source dtype, bytes on disk, the estimated
// output size for three recipes, and every tensor name it does not recognise.
//
// The estimate (tensor bytes; safetensors headers, config files and KV-cache scales are left
// out). A tensor is quantized when it is a linear weight (`weight`, `weight_packed`, or a fused
// [E, out, in] expert tensor) of a kind the recipe quantizes. The recipes follow ModelOpt's
// default exclusions: routers, lm_head, embeddings, norms, the vision tower, the projector and
// MTP layers stay in their source dtype.
//   nvfp4               attention, dense MLP, routed and shared experts
//   nvfp4_experts_only  routed experts only
//   fp8                 as nvfp4
// Per quantized weight with M rows in all (E*out for fused experts), K = the input dimension
// (x8 for an INT4 `weight_packed`) and n modules (1, E for fused experts, 2E for gate_up_proj),
// from spec/format.md §1 and §2:
//   NVFP4  M*K/2 (U8 E2M1 pairs) + M*K/16 (F8 block scales) + n*(4 + 4) (weight_scale_2,
//          input_scale). K % 16 != 0 cannot be NVFP4: such a weight stays at source size.
//   FP8    M*K (F8) + n*(4 + 4) (weight_scale, input_scale).
// The source's own quantization tensors (weight_scale_inv, ...) of a quantized kind count 0
// (they are replaced); everything else counts at its source size.
//
// --json prints one object (key order fixed; sizes in bytes; schema "strata.inspect.v1"):
//   schema, dir, model_type, text_model_type, family, multimodal, architectures [str],
//   num_hidden_layers, dense_layers [int], moe_layers [int], linear_attention_layers [int],
//   tensors, params, tensor_bytes, bytes_on_disk, shards [{file, tensors, bytes}],
//   kinds {<kind>: {tensors, params, bytes}} with every kind of model/arch.h in its order,
//   dtypes {<safetensors dtype>: {tensors, elements, bytes}} sorted by name,
//   estimates {nvfp4|nvfp4_experts_only|fp8: {bytes, quantized_tensors}},
//   unrecognized [tensor name] sorted,
//   refused [{tensor, why}]: the stored layouts `strata quantize` refuses (export/plan.h
//     tensor_layout_refusal), in name order,
//   source_quant_method (the config's quantization_config.quant_method, or null),
//   compression {<kind>: {<layout>: {modules, tensors, bytes}}}: how the linear weights of each
//     kind are stored ("bf16", "fp8_block 128x128", "int4_pack g32", "mxfp4 b32";
//     io/source_weights.h) and the tensors/bytes decompression reads for them,
//   decompressed_tensors [tensor name] sorted: every tensor strata will decompress.
// `params` counts weights, not quantization metadata (weight_scale_inv & co. count 0; an INT4
// weight_packed counts 8 per int32).
#include <algorithm>
#include <array>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/dtype.h"
#include "core/error.h"
#include "export/plan.h"
#include "io/checkpoint.h"
#include "io/hf_config.h"
#include "io/json.h"
#include "io/source_weights.h"
#include "model/arch.h"

namespace strata::cli {

namespace {

struct Tally {
  int64_t tensors = 0;
  int64_t params = 0;
  uint64_t bytes = 0;
};

enum class EstimateRecipe : uint8_t { kNvfp4, kNvfp4ExpertsOnly, kFp8 };
constexpr std::array<EstimateRecipe, 3> kRecipes = {
    EstimateRecipe::kNvfp4, EstimateRecipe::kNvfp4ExpertsOnly, EstimateRecipe::kFp8};

std::string_view recipe_key(EstimateRecipe r) {
  switch (r) {
    case EstimateRecipe::kNvfp4:
      return "nvfp4";
    case EstimateRecipe::kNvfp4ExpertsOnly:
      return "nvfp4_experts_only";
    case EstimateRecipe::kFp8:
      return "fp8";
  }
  STRATA_ASSERT(false, "unhandled EstimateRecipe");
}

std::string_view recipe_label(EstimateRecipe r) {
  switch (r) {
    case EstimateRecipe::kNvfp4:
      return "NVFP4";
    case EstimateRecipe::kNvfp4ExpertsOnly:
      return "NVFP4 experts only";
    case EstimateRecipe::kFp8:
      return "FP8";
  }
  STRATA_ASSERT(false, "unhandled EstimateRecipe");
}

bool recipe_quantizes(EstimateRecipe r, TensorKind kind) {
  switch (r) {
    case EstimateRecipe::kNvfp4:
    case EstimateRecipe::kFp8:
      return kind_is_quantized_by_default(kind);
    case EstimateRecipe::kNvfp4ExpertsOnly:
      return kind == TensorKind::kRoutedExperts;
  }
  STRATA_ASSERT(false, "unhandled EstimateRecipe");
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// Weights a tensor holds: INT4 packed eight to an int32; quantization metadata holds none.
int64_t logical_params(const TensorEntry& e, const TensorClass& c) {
  if (c.role == TensorRole::kQuantAux) return 0;
  int64_t n = shape_numel(e.shape);
  if (ends_with(e.name, ".weight_packed")) n *= 8;
  if (ends_with(e.name, ".weight_blocks")) n *= 2;  // MXFP4: two E2M1 values per byte
  return n;
}

// The estimated output bytes of one tensor under a recipe; *quantized says whether it was.
uint64_t estimate_bytes(EstimateRecipe r, const TensorEntry& e, const TensorClass& c,
                        bool* quantized) {
  *quantized = false;
  const uint64_t source = e.end - e.begin;
  if (!recipe_quantizes(r, c.kind)) return source;
  if (c.role == TensorRole::kQuantAux) return 0;
  if (c.role != TensorRole::kLinearWeight) return source;
  if (e.shape.size() != 2 && e.shape.size() != 3) return source;
  int64_t k = e.shape.back();
  if (ends_with(e.name, ".weight_packed")) k *= 8;
  int64_t m = e.shape[e.shape.size() - 2];
  int64_t modules = 1;
  if (ends_with(e.name, ".weight_blocks") && e.shape.size() == 3) {  // MXFP4 [out, in/32, 16]
    m = e.shape[0];
    k = e.shape[1] * 32;
  } else if (e.shape.size() == 3) {
    m *= e.shape[0];
    modules = e.shape[0] * (ends_with(e.name, "gate_up_proj") ? 2 : 1);
  }
  const uint64_t mk = static_cast<uint64_t>(m) * static_cast<uint64_t>(k);
  const uint64_t scalars = static_cast<uint64_t>(modules) * (4 + 4);
  switch (r) {
    case EstimateRecipe::kNvfp4:
    case EstimateRecipe::kNvfp4ExpertsOnly:
      if (k % 16 != 0) return source;
      *quantized = true;
      return mk / 2 + mk / 16 + scalars;
    case EstimateRecipe::kFp8:
      *quantized = true;
      return mk + scalars;
  }
  STRATA_ASSERT(false, "unhandled EstimateRecipe");
}

std::string basename_of(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// 1234567 -> "1,234,567".
std::string with_commas(int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

// Binary units: "512 B", "4.50 KiB", "1.25 MiB", "1.30 TiB".
std::string human_bytes(uint64_t n) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  if (n < 1024) return std::to_string(n) + " B";
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024.0 && u < 5) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f %s", v, kUnits[u]);
  return buf;
}

// [0,1,2,5,6] -> "0-2, 5-6"; "none" when empty.
std::string ranges(const std::vector<int64_t>& v) {
  if (v.empty()) return "none";
  std::string out;
  for (size_t i = 0; i < v.size();) {
    size_t j = i;
    while (j + 1 < v.size() && v[j + 1] == v[j] + 1)
      ++j;
    if (!out.empty()) out += ", ";
    out += std::to_string(v[i]);
    if (j > i) out += "-" + std::to_string(v[j]);
    i = j + 1;
  }
  return out;
}

struct Report {
  std::string dir;
  ModelConfig config;
  ArchInfo arch;
  std::vector<int64_t> dense_layers, moe_layers;
  std::vector<int64_t> linear_attention_layers;  // KDA / Gated DeltaNet: no KV cache
  std::array<Tally, kNumTensorKinds> kinds{};
  Tally total;
  std::map<std::string, Tally> dtypes;  // safetensors dtype name -> (tensors, elements, bytes)
  struct Shard {
    std::string file;
    int64_t tensors;
    uint64_t bytes;
  };
  std::vector<Shard> shards;
  uint64_t bytes_on_disk = 0;
  std::array<Tally, kRecipes.size()> estimates{};  // tensors = quantized tensors
  std::vector<std::string> unrecognized;
  std::vector<std::pair<std::string, std::string>> refused;  // tensor, why quantize refuses it
  std::string quant_method;  // the source's quantization_config.quant_method (JSON), if any
  struct Compression {
    int64_t modules = 0;  // linear modules stored this way
    int64_t tensors = 0;  // tensors read to decompress them (values, scales, shapes)
    uint64_t bytes = 0;
    std::string example;  // one such module
  };
  std::map<std::string, std::map<std::string, Compression>> compression;  // kind -> layout -> ..
  std::vector<std::string> decompress;  // every tensor decompression reads, sorted
};

// "int4_pack g32", "fp8_block 128x128", "mxfp4 b32", or the dtype of an uncompressed weight.
std::string source_layout_label(const SourceWeight& w) {
  switch (w.compression) {
    case SourceCompression::kNone:
      return std::string(dtype_name(w.dtype));
    case SourceCompression::kFp8Block:
      return "fp8_block " + std::to_string(w.group) + "x" + std::to_string(w.group);
    case SourceCompression::kInt4Pack:
      return "int4_pack g" + std::to_string(w.group);
    case SourceCompression::kMxfp4:
      return "mxfp4 b" + std::to_string(w.group);
  }
  STRATA_ASSERT(false, "unhandled SourceCompression");
}

Report build_report(const std::string& dir) {
  Report r;
  r.dir = dir;
  r.config = read_model_config(dir);
  r.arch = resolve_arch(r.config);
  for (int64_t i = 0; i < r.arch.num_hidden_layers; ++i) {
    (layer_is_moe(r.arch, r.config, i) ? r.moe_layers : r.dense_layers).push_back(i);
    if (layer_is_linear_attention(r.arch, r.config, i)) r.linear_attention_layers.push_back(i);
  }
  Checkpoint ckpt = Checkpoint::open(dir);
  resolve_wrapper_prefixes(r.arch, ckpt.tensor_names(), dir);
  if (r.config.quantization_config && r.config.quantization_config->is_object() &&
      r.config.quantization_config->contains("quant_method")) {
    r.quant_method = (*r.config.quantization_config)["quant_method"].dump();
  }
  for (const SafetensorsFile& shard : ckpt.shards()) {
    r.shards.push_back({basename_of(shard.path()), static_cast<int64_t>(shard.entries().size()),
                        shard.file_size()});
  }
  r.bytes_on_disk = ckpt.bytes_on_disk();

  for (const std::string& name : ckpt.tensor_names()) {
    const TensorEntry& e = ckpt.entry(name);
    const TensorClass c = classify_tensor(r.arch, name);
    const uint64_t bytes = e.end - e.begin;
    const int64_t params = logical_params(e, c);
    Tally& k = r.kinds[static_cast<int>(c.kind)];
    k.tensors += 1;
    k.params += params;
    k.bytes += bytes;
    r.total.tensors += 1;
    r.total.params += params;
    r.total.bytes += bytes;
    Tally& d = r.dtypes[std::string(dtype_safetensors_name(e.dtype))];
    d.tensors += 1;
    d.params += shape_numel(e.shape);
    d.bytes += bytes;
    if (c.kind == TensorKind::kUnrecognized) r.unrecognized.push_back(name);
    if (std::string why = tensor_layout_refusal(r.arch, ckpt, name); !why.empty())
      r.refused.emplace_back(name, std::move(why));
    // Compression of linear weights, per kind (io/source_weights.h).
    if (c.role == TensorRole::kLinearWeight) {
      std::string module;
      for (std::string_view suffix : {".weight", ".weight_packed", ".weight_blocks"}) {
        if (name.size() > suffix.size() && ends_with(name, suffix))
          module = name.substr(0, name.size() - suffix.size());
      }
      std::optional<SourceWeight> sw;
      if (!module.empty()) sw = find_source_weight(ckpt, module);
      const std::string layout = !sw ? "none" : source_layout_label(*sw);
      Report::Compression& g = r.compression[std::string(tensor_kind_name(c.kind))][layout];
      g.modules += 1;
      if (sw && sw->compression != SourceCompression::kNone) {
        for (const std::string& t : std::vector<std::string>{sw->stored}) {
          g.tensors += 1;
          g.bytes += ckpt.entry(t).end - ckpt.entry(t).begin;
          r.decompress.push_back(t);
        }
        for (const std::string& t : sw->aux) {
          g.tensors += 1;
          g.bytes += ckpt.entry(t).end - ckpt.entry(t).begin;
          r.decompress.push_back(t);
        }
        if (g.example.empty()) g.example = module;
      }
    }
    for (size_t i = 0; i < kRecipes.size(); ++i) {
      bool quantized = false;
      r.estimates[i].bytes += estimate_bytes(kRecipes[i], e, c, &quantized);
      r.estimates[i].tensors += quantized ? 1 : 0;
    }
  }
  std::sort(r.decompress.begin(), r.decompress.end());
  // The one check quantize makes beside its start rather than in its plan.
  std::string shape_tensor;
  if (std::string why = int4_shape_mismatch(ckpt, &shape_tensor); !why.empty()) {
    r.refused.emplace_back(shape_tensor, std::move(why));
    std::sort(r.refused.begin(), r.refused.end());
  }
  return r;
}

Json tally_json(const Tally& t, const char* count_key) {
  Json j = Json::object();
  j["tensors"] = t.tensors;
  j[count_key] = t.params;
  j["bytes"] = t.bytes;
  return j;
}

void print_json(const Report& r) {
  Json j = Json::object();
  j["schema"] = "strata.inspect.v1";
  j["dir"] = r.dir;
  j["model_type"] = r.config.model_type;
  j["text_model_type"] = r.config.text_model_type;
  j["family"] = std::string(arch_family_name(r.arch.family));
  j["multimodal"] = r.arch.multimodal;
  j["architectures"] = r.config.architectures;
  j["num_hidden_layers"] = r.arch.num_hidden_layers;
  j["dense_layers"] = r.dense_layers;
  j["moe_layers"] = r.moe_layers;
  j["linear_attention_layers"] = r.linear_attention_layers;
  j["tensors"] = r.total.tensors;
  j["params"] = r.total.params;
  j["tensor_bytes"] = r.total.bytes;
  j["bytes_on_disk"] = r.bytes_on_disk;
  Json shards = Json::array();
  for (const Report::Shard& s : r.shards) {
    shards.push_back({{"file", s.file}, {"tensors", s.tensors}, {"bytes", s.bytes}});
  }
  j["shards"] = shards;
  Json kinds = Json::object();
  for (int i = 0; i < kNumTensorKinds; ++i) {
    kinds[std::string(tensor_kind_name(static_cast<TensorKind>(i)))] =
        tally_json(r.kinds[i], "params");
  }
  j["kinds"] = kinds;
  Json dtypes = Json::object();
  for (const auto& [name, t] : r.dtypes)
    dtypes[name] = tally_json(t, "elements");
  j["dtypes"] = dtypes;
  Json est = Json::object();
  for (size_t i = 0; i < kRecipes.size(); ++i) {
    est[std::string(recipe_key(kRecipes[i]))] = {{"bytes", r.estimates[i].bytes},
                                                 {"quantized_tensors", r.estimates[i].tensors}};
  }
  j["estimates"] = est;
  j["unrecognized"] = r.unrecognized;
  Json refused = Json::array();
  for (const auto& [name, why] : r.refused)
    refused.push_back({{"tensor", name}, {"why", why}});
  j["refused"] = refused;
  j["source_quant_method"] = r.quant_method.empty() ? Json(nullptr) : Json::parse(r.quant_method);
  Json comp = Json::object();
  for (const auto& [kind, layouts] : r.compression) {
    Json k = Json::object();
    for (const auto& [layout, g] : layouts)
      k[layout] = {{"modules", g.modules}, {"tensors", g.tensors}, {"bytes", g.bytes}};
    comp[kind] = k;
  }
  j["compression"] = comp;
  j["decompressed_tensors"] = r.decompress;
  std::printf("%s\n", j.dump(2).c_str());
}

void print_human(const Report& r) {
  const ModelConfig& c = r.config;
  std::printf("checkpoint      %s\n", r.dir.c_str());
  std::string type = c.model_type;
  if (!c.text_model_type.empty() && c.text_model_type != c.model_type) {
    type += " (language model " + c.text_model_type + ")";
  }
  std::printf("model_type      %s\n", type.c_str());
  std::printf("family          %s%s\n", std::string(arch_family_name(r.arch.family)).c_str(),
              r.arch.multimodal ? ", multimodal wrapper" : "");
  std::string archs;
  for (const std::string& a : c.architectures)
    archs += (archs.empty() ? "" : ", ") + a;
  std::printf("architectures   %s\n", archs.empty() ? "(not given)" : archs.c_str());
  std::printf("layers          %lld: dense %s; MoE %s\n",
              static_cast<long long>(r.arch.num_hidden_layers), ranges(r.dense_layers).c_str(),
              ranges(r.moe_layers).c_str());
  if (!r.linear_attention_layers.empty()) {
    std::printf("linear attn     %s (no KV cache)\n", ranges(r.linear_attention_layers).c_str());
  }
  std::printf("shards          %zu, %s on disk (%s bytes)\n", r.shards.size(),
              human_bytes(r.bytes_on_disk).c_str(), with_commas(r.bytes_on_disk).c_str());
  std::printf("tensors         %s, %s parameters, %s\n", with_commas(r.total.tensors).c_str(),
              with_commas(r.total.params).c_str(), human_bytes(r.total.bytes).c_str());

  std::printf("\nparameters by kind\n");
  std::printf("  %-16s %9s %18s %12s\n", "kind", "tensors", "parameters", "bytes");
  for (int i = 0; i < kNumTensorKinds; ++i) {
    const auto kind = static_cast<TensorKind>(i);
    const Tally& t = r.kinds[i];
    // The kinds every decoder has are always shown; the rest when present.
    bool always = kind == TensorKind::kAttention || kind == TensorKind::kDenseMlp ||
                  kind == TensorKind::kRoutedExperts || kind == TensorKind::kSharedExperts ||
                  kind == TensorKind::kEmbedding || kind == TensorKind::kNorm ||
                  kind == TensorKind::kOther;
    if (!always && t.tensors == 0) continue;
    std::printf("  %-16s %9s %18s %12s\n", std::string(tensor_kind_name(kind)).c_str(),
                with_commas(t.tensors).c_str(), with_commas(t.params).c_str(),
                human_bytes(t.bytes).c_str());
  }
  std::printf("  %-16s %9s %18s %12s\n", "total", with_commas(r.total.tensors).c_str(),
              with_commas(r.total.params).c_str(), human_bytes(r.total.bytes).c_str());

  std::printf("\nsource dtypes\n");
  std::printf("  %-16s %9s %18s %12s\n", "dtype", "tensors", "elements", "bytes");
  for (const auto& [name, t] : r.dtypes) {
    std::printf("  %-16s %9s %18s %12s\n", name.c_str(), with_commas(t.tensors).c_str(),
                with_commas(t.params).c_str(), human_bytes(t.bytes).c_str());
  }

  std::printf("\nestimated output (tensor bytes; 'strata inspect --help' gives the rules)\n");
  std::printf("  %-20s %9s %14s %12s\n", "recipe", "quantized", "bytes", "vs source");
  for (size_t i = 0; i < kRecipes.size(); ++i) {
    const Tally& e = r.estimates[i];
    double ratio = r.total.bytes ? static_cast<double>(e.bytes) / r.total.bytes : 0.0;
    char rel[32];
    std::snprintf(rel, sizeof rel, "%.3fx", ratio);
    std::printf("  %-20s %9s %14s %12s\n", std::string(recipe_label(kRecipes[i])).c_str(),
                with_commas(e.tensors).c_str(), human_bytes(e.bytes).c_str(), rel);
  }

  std::printf("\nsource compression of linear weights by kind%s\n",
              r.quant_method.empty() ? "" : (" (quant_method " + r.quant_method + ")").c_str());
  std::printf("  %-16s %-20s %9s %9s %12s  %s\n", "kind", "stored as", "modules", "tensors",
              "bytes", "decompressed, e.g.");
  for (const auto& [kind, layouts] : r.compression) {
    for (const auto& [layout, g] : layouts) {
      std::printf("  %-16s %-20s %9s %9s %12s  %s\n", kind.c_str(), layout.c_str(),
                  with_commas(g.modules).c_str(), g.tensors ? with_commas(g.tensors).c_str() : "-",
                  g.tensors ? human_bytes(g.bytes).c_str() : "-",
                  g.example.empty() ? "-" : g.example.c_str());
    }
  }
  std::printf("  decompressed one layer at a time as it is read: %zu tensors (--json lists them)\n",
              r.decompress.size());

  if (r.refused.empty()) {
    std::printf("\nlayouts quantize refuses: none\n");
  } else {
    std::printf("\nlayouts quantize refuses: %zu tensors (strata quantize stops on the first)\n",
                r.refused.size());
    for (const auto& [name, why] : r.refused)
      std::printf("  %s\n", why.c_str());
  }

  if (r.unrecognized.empty()) {
    std::printf("\nunrecognized tensors: none\n");
  } else {
    std::printf("\nunrecognized tensors: %zu (not names of the %s family)\n", r.unrecognized.size(),
                std::string(arch_family_name(r.arch.family)).c_str());
    for (const std::string& n : r.unrecognized)
      std::printf("  %s\n", n.c_str());
  }
}

}  // namespace

int cmd_inspect(const std::vector<std::string>& argv) {
  Args args("inspect",
            "Summarizes a Hugging Face checkpoint directory: architecture, dense and MoE layers,\n"
            "parameters and bytes by kind and by dtype, bytes on disk, estimated output sizes for\n"
            "NVFP4, NVFP4 on routed experts only, and FP8, and every tensor name strata does not\n"
            "recognise. Reads config.json and the shard headers only.\n\n"
            "Estimate: tensor bytes of the output. Linear weights of attention, dense MLP, routed\n"
            "and shared experts are quantized (experts only: routed experts); routers, lm_head,\n"
            "embeddings, norms, vision tower, projector and MTP layers stay at source size. Per\n"
            "weight [M, K]: NVFP4 = M*K/2 + M*K/16 + 8 bytes (K % 16 != 0 stays at source size);\n"
            "FP8 = M*K + 8 bytes. The source's own quantization scales of a quantized weight\n"
            "count 0. Headers, config files and KV-cache scales are not counted.\n\n"
            "--json prints one object, schema \"strata.inspect.v1\": schema, dir, model_type,\n"
            "text_model_type, family, multimodal, architectures, num_hidden_layers, dense_layers,\n"
            "moe_layers, linear_attention_layers, tensors, params, tensor_bytes, bytes_on_disk,\n"
            "shards [{file, tensors, bytes}], kinds {<kind>: {tensors, params, bytes}} (every\n"
            "kind), dtypes {<dtype>: {tensors, elements, bytes}}, estimates {nvfp4,\n"
            "nvfp4_experts_only, fp8: {bytes, quantized_tensors}}, unrecognized [names],\n"
            "source_quant_method, compression {<kind>: {<layout>: {modules, tensors, bytes}}},\n"
            "decompressed_tensors [names]. Sizes are in bytes.\n\n"
            "Source compression (docs/SOURCES.md): per kind of linear module, how many modules\n"
            "are stored as bf16/f16/f32, DeepSeek FP8 128x128 blocks (fp8_block), compressed-\n"
            "tensors pack-quantized INT4 (int4_pack gN) or MXFP4 (mxfp4 b32), and the tensors\n"
            "strata decompresses (to bf16, one layer at a time) when it quantizes them.");
  args.positional("DIR", "checkpoint directory (config.json and safetensors shards)");
  args.flag("--json", "print the report as JSON (schema above) instead of tables");
  if (!args.parse(argv)) return 0;
  const Report r = build_report(args.get("DIR"));
  if (args.flag_set("--json")) {
    print_json(r);
  } else {
    print_human(r);
  }
  return 0;
}

}  // namespace strata::cli
