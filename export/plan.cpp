#include "export/plan.h"

#include <algorithm>
#include <map>
#include <memory>
#include <set>

#include "core/error.h"
#include "core/parallel.h"
#include "core/regex.h"
#include "model/groups.h"

namespace strata {

const PlannedModule* QuantPlan::find(std::string_view module) const {
  auto it =
      std::lower_bound(modules.begin(), modules.end(), module,
                       [](const PlannedModule& m, std::string_view n) { return m.module < n; });
  return it != modules.end() && it->module == module ? &*it : nullptr;
}

std::string QuantPlan::quant_algo() const {
  std::string algo;
  for (const PlannedModule& m : modules) {
    if (m.format == QFormat::kNone) continue;
    const std::string a(qformat_quant_algo(m.format));
    if (algo.empty()) {
      algo = a;
    } else if (algo != a) {
      return "MIXED_PRECISION";
    }
  }
  return algo;
}

namespace {

std::string with_format(const QuantPlan& plan, std::string key, std::string_view module) {
  const PlannedModule* m = plan.find(module);
  return key + "#" + std::string(qformat_name(m ? m->format : QFormat::kNone));
}

}  // namespace

std::string weight_group_key(const QuantPlan& plan, std::string_view module) {
  if (plan.fused_experts && routed_expert_index(module) >= 0)
    return with_format(plan, input_scale_group_key(module), module);
  return with_format(plan, shared_input_group_key(module), module);
}

std::string input_group_key(const QuantPlan& plan, std::string_view module) {
  return with_format(plan, input_scale_group_key(module), module);
}

bool fp8_shares_weight_amax(std::string_view module) {
  return routed_expert_index(module) >= 0;
}

std::string consumer_module(const QuantPlan& plan, const std::string& module) {
  if (!plan.fused_experts || routed_expert_index(module) < 0) return module;
  const size_t leaf = module.rfind('.');
  return module.substr(0, module.rfind('.', leaf - 1));
}

namespace {

// compressed-tensors' ignore entries: "re:<regex>" matched from the start of the module name
// (Python's re.match, here PCRE2), or a module name (also matching as the last components of a
// prefixed name). The regexes are compiled once.
class CtIgnore {
 public:
  CtIgnore(const std::vector<std::string>& entries, const std::string& what) {
    for (const std::string& entry : entries) {
      if (entry.starts_with("re:")) {
        regexes_.push_back(std::make_unique<Regex>(entry.substr(3), what + ".ignore"));
      } else {
        names_.push_back(entry);
      }
    }
  }
  bool ignores(const std::string& module) const {
    for (const std::unique_ptr<Regex>& re : regexes_) {
      if (re->matches_at_start(module)) return true;
    }
    for (const std::string& entry : names_) {
      if (module == entry || (module.size() > entry.size() && module.ends_with(entry) &&
                              module[module.size() - entry.size() - 1] == '.'))
        return true;
    }
    return false;
  }

 private:
  std::vector<std::unique_ptr<Regex>> regexes_;
  std::vector<std::string> names_;
};

// The lm_head module of a checkpoint that stores none (tied to the embedding), named where the
// stored head would be (model/common.cpp find_prefixes): beside the language model of a wrapper
// that keeps it under `language_model.`, else at the top level.
std::string tied_head_module(const ArchInfo& arch, const std::vector<std::string>& names) {
  if (!arch.head_prefix.empty()) return arch.head_prefix + "lm_head";
  for (const std::string& n : names) {
    if (n.starts_with("language_model.model.embed_tokens.")) return "language_model.lm_head";
  }
  return "lm_head";
}

}  // namespace

void check_source_quantization(const ModelConfig& config, const Checkpoint& ckpt,
                               const std::vector<PlannedModule>& modules) {
  std::set<SourceCompression> found;
  for (const PlannedModule& m : modules)
    found.insert(m.source);
  if (!config.quantization_config) return;
  const Json& q = *config.quantization_config;
  const std::string what = config.path + ": quantization_config";
  STRATA_CHECK(q.is_object(), what, " must be an object");
  const std::string method = q.contains("quant_method") && q["quant_method"].is_string()
                                 ? q["quant_method"].get<std::string>()
                                 : "";
  auto only = [&](SourceCompression allowed) {
    for (SourceCompression c : found) {
      STRATA_CHECK(c == SourceCompression::kNone || c == allowed, what, ": quant_method '", method,
                   "' but some weights are stored as ", source_compression_name(c));
    }
  };
  if (method == "fp8") {
    if (q.contains("weight_block_size") && !q["weight_block_size"].is_null()) {
      STRATA_CHECK(q["weight_block_size"] == Json::array({128, 128}), what,
                   ".weight_block_size is ", q["weight_block_size"].dump(),
                   "; strata decompresses 128x128 FP8 blocks only");
    }
    if (q.contains("fmt") && q["fmt"].is_string()) {
      // DeepSeek-V3 writes "e4m3", MiniMax-M2 torch's name of the same format.
      STRATA_CHECK(q["fmt"] == "e4m3" || q["fmt"] == "float8_e4m3fn", what, ".fmt is ",
                   q["fmt"].dump(), "; strata decompresses e4m3 FP8 blocks only");
    }
    only(SourceCompression::kFp8Block);
    return;
  }
  if (method == "mxfp4") {
    only(SourceCompression::kMxfp4);
    return;
  }
  if (method == "compressed-tensors") {
    const std::string format =
        q.contains("format") && q["format"].is_string() ? q["format"].get<std::string>() : "";
    STRATA_CHECK(format == "pack-quantized", what, ".format is '", format,
                 "'; strata decompresses compressed-tensors 'pack-quantized' INT4 only");
    std::set<int64_t> groups;
    STRATA_CHECK(q.contains("config_groups") && q["config_groups"].is_object(), what,
                 " has no config_groups object");
    for (const auto& [name, g] : q["config_groups"].items()) {
      const std::string where = what + ".config_groups." + name + ".weights";
      STRATA_CHECK(g.is_object() && g.contains("weights") && g["weights"].is_object(), where,
                   " is missing");
      const Json& w = g["weights"];
      auto field = [&](const char* k) { return w.contains(k) ? w[k] : Json(nullptr); };
      STRATA_CHECK(field("num_bits") == 4 && field("type") == "int" && field("symmetric") == true &&
                       field("strategy") == "group" && field("group_size").is_number_integer(),
                   where, " is ", w.dump(),
                   "; strata decompresses symmetric 4-bit int weights with group-wise scales only "
                   "(num_bits 4, type int, symmetric true, strategy group)");
      const Json actorder = field("actorder");
      STRATA_CHECK(actorder.is_null() || actorder == false, where, ".actorder is ", actorder.dump(),
                   "; activation-ordered INT4 sources are not supported");
      groups.insert(field("group_size").get<int64_t>());
    }
    std::vector<std::string> ignore;
    if (q.contains("ignore") && q["ignore"].is_array()) {
      for (const Json& e : q["ignore"]) {
        if (e.is_string()) ignore.push_back(e.get<std::string>());
      }
    }
    only(SourceCompression::kInt4Pack);
    if (found.count(SourceCompression::kInt4Pack) == 0) return;
    const CtIgnore ignored(ignore, what);
    // Every INT4 module against the ignore list: 69k regex matches on a Kimi-K2, on several
    // threads; the first refusal in module order is the one reported.
    parallel_chunks(modules.size(), startup_threads(), 4096, [&](size_t begin, size_t end) {
      for (size_t i = begin; i < end; ++i) {
        const PlannedModule& m = modules[i];
        if (m.source != SourceCompression::kInt4Pack) continue;
        STRATA_CHECK(!ignored.ignores(m.module), what, ".ignore names '", m.module,
                     "' but the checkpoint stores it pack-quantized; the checkpoint and its config "
                     "disagree");
        STRATA_CHECK(groups.count(m.source_group) == 1, ckpt.dir(), ": '", m.module,
                     "' has INT4 groups of ", m.source_group, " but ", what,
                     " declares other group sizes");
      }
    });
    return;
  }
  if (method == "modelopt") return;  // strata's own exports; the plan refuses quantized weights
  fail(what, ".quant_method is '", method,
       "'; strata decompresses fp8 (128x128 blocks), compressed-tensors pack-quantized INT4 and "
       "mxfp4 sources only");
}

std::string tensor_layout_refusal(const ArchInfo& arch, const Checkpoint& ckpt,
                                  const std::string& name) {
  return tensor_layout_refusal(arch, ckpt, name, classify_tensor(arch, name));
}

std::string tensor_layout_refusal(const ArchInfo& arch, const Checkpoint& ckpt,
                                  const std::string& name, const TensorClass& c) {
  constexpr std::string_view kTaken =
      "strata reads fused experts in transformers 5's layout: experts.gate_up_proj [E, 2I, H] "
      "(gate rows, then up rows) with experts.down_proj [E, H, I], in BF16/F16/F32 or as MXFP4 "
      "*_blocks/*_scales of that layout, without biases";
  if (const std::string base = ckpt.view_base(name);
      !base.empty() && c.kind != TensorKind::kRoutedExperts) {
    return str("'", base, "' holds fused experts, which strata reads per expert as '", name,
               "', a name the ", arch_family_name(arch.family),
               " family does not use: save the checkpoint with per-expert tensors");
  }
  if (name.ends_with("_blocks") && !name.ends_with(".weight_blocks"))
    return str("'", name,
               "' is a fused MXFP4 tensor in a layout strata does not split per expert (", kTaken,
               ")");
  if (c.role != TensorRole::kLinearWeight) return "";
  for (std::string_view suffix : {".weight", ".weight_packed", ".weight_blocks"}) {
    if (name.size() > suffix.size() && name.ends_with(suffix)) return "";
  }
  return str("linear weight '", name, "' is ", shape_str(ckpt.entry(name).shape),
             ", not a per-module .weight, .weight_packed or .weight_blocks, nor a fused expert "
             "layout strata splits per expert (",
             kTaken, ")");
}

QuantPlan make_plan(const ModelConfig& config, const Checkpoint& ckpt, const Recipe& recipe) {
  QuantPlan plan;
  plan.recipe = recipe;
  ArchInfo arch = resolve_arch(config);
  // gpt-oss's consumers load its experts fused, as ModelOpt 0.47 writes them (docs/QUANTIZE.md
  // "gpt-oss"); an export of per-expert modules would load nowhere.
  plan.fused_experts = arch.family == ArchFamily::kGptOss;
  const std::vector<std::string> names = ckpt.tensor_names();  // one copy of every name
  resolve_wrapper_prefixes(arch, names, ckpt.dir());
  plan.num_layers = arch.num_hidden_layers;
  RecipeMatcher matcher(recipe);
  // What each tensor is, read for every name independently (on several threads: a Kimi-K2 has
  // 208k tensors), then planned in name order below. A refusal is the first in name order, as a
  // sequential loop gives it (core/parallel.h).
  struct Facts {
    TensorClass c;
    bool tower = false;  // a vision tower's or projector's 2-D weight (planned as excluded)
    std::string module;  // a linear module's name (else empty)
    std::optional<SourceWeight> sw;
  };
  std::vector<Facts> facts(names.size());
  parallel_chunks(names.size(), startup_threads(), 4096, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      const std::string& name = names[i];
      Facts& f = facts[i];
      f.c = classify_tensor(arch, name);
      const std::string refused = tensor_layout_refusal(arch, ckpt, name, f.c);
      STRATA_CHECK(refused.empty(), ckpt.dir(), ": ", refused);
      // The vision tower and projector of a multimodal wrapper are copied unquantized; their
      // linear weights are planned (as excluded) so that exclude_modules lists them (format.md
      // §6).
      f.tower = (f.c.kind == TensorKind::kVision || f.c.kind == TensorKind::kProjector) &&
                name.ends_with(".weight") && ckpt.entry(name).shape.size() == 2;
      if (f.c.role != TensorRole::kLinearWeight && !f.tower) continue;
      for (std::string_view suffix : {".weight", ".weight_packed", ".weight_blocks"}) {
        if (name.size() > suffix.size() && name.ends_with(suffix))
          f.module = name.substr(0, name.size() - suffix.size());
      }
      f.sw = find_source_weight(ckpt, f.module);
      STRATA_ASSERT(f.sw.has_value(), "no source weight for ", f.module);
    }
  });
  bool head_stored = false;
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string& name = names[i];
    const Facts& f = facts[i];
    const TensorClass& c = f.c;
    if (c.kind == TensorKind::kLmHead) head_stored = true;
    if (c.kind == TensorKind::kEmbedding && name.ends_with(".weight"))
      plan.excluded_extra.push_back(name.substr(0, name.size() - 7));
    // The Gated DeltaNet's causal conv (Qwen3-Next, Qwen3.5) is an nn.Conv1d, a module ModelOpt
    // 0.47 gives a (default-disabled) quantizer, so its export lists it in exclude_modules.
    if ((arch.family == ArchFamily::kQwen3Next || arch.family == ArchFamily::kQwen35Moe) &&
        name.ends_with(".linear_attn.conv1d.weight"))
      plan.excluded_extra.push_back(name.substr(0, name.size() - 7));
    if (f.module.empty()) continue;
    const TensorEntry& e = ckpt.entry(name);
    const SourceWeight& sw = *f.sw;
    PlannedModule m;
    m.module = f.module;
    m.layer = c.layer;
    m.kind = c.kind;
    m.source = sw.compression;
    m.source_group = sw.group;
    m.dtype = sw.compression == SourceCompression::kNone ? e.dtype : DType::kBF16;
    m.shape = sw.shape;
    const RuleDecision& d = matcher.decide(m.module);
    m.format = d.format;
    m.rule = d.rule;
    m.input_amax = d.input_amax;
    // Multi-token-prediction layers are not run by calibration and not loaded by consumers as
    // part of the decoder: they stay in the source dtype whatever the recipe says; so do the
    // vision tower and the projector (calibration runs the language model only).
    if (m.kind == TensorKind::kMtp || f.tower) m.format = QFormat::kNone;
    if (m.format != QFormat::kNone) {
      const std::string rule = m.rule >= 0 ? recipe.rules[m.rule].origin : "the recipe";
      STRATA_CHECK(m.shape.size() == 2, rule, " quantizes '", m.module,
                   "', whose weight has shape ", shape_str(m.shape),
                   "; only 2-D [out, in] weights can be quantized");
      STRATA_CHECK(m.dtype == DType::kBF16 || m.dtype == DType::kF16 || m.dtype == DType::kF32,
                   rule, " quantizes '", m.module, "', whose weight is ", dtype_name(m.dtype),
                   "; only bf16/f16/f32 sources are supported");
      const int64_t block = qformat_block(m.format);
      STRATA_CHECK(m.shape[1] % block == 0, rule, " gives '", m.module, "' format ",
                   qformat_name(m.format), ", which needs an input width divisible by ", block,
                   ", but the weight is ", shape_str(m.shape),
                   "; exclude this module in the recipe or pick another format");
      STRATA_CHECK(!plan.fused_experts || m.kind != TensorKind::kRoutedExperts ||
                       m.format == QFormat::kNvfp4 || m.format == QFormat::kW4A16Nvfp4 ||
                       m.format == QFormat::kFp8,
                   rule, " gives '", m.module, "' format ", qformat_name(m.format),
                   "; gpt-oss's experts are written fused as ModelOpt writes them, in NVFP4, "
                   "W4A16 NVFP4 or FP8 only: exclude them or pick another format");
      // ModelOpt 0.47 quantizes transformers 5's fused experts (gate_up_proj [E, 2I, H]) with one
      // weight quantizer per expert over gate and up, whose 128-row blocks would span both; how
      // its export then splits the block scales was not compared, so strata does not guess.
      STRATA_CHECK(m.kind != TensorKind::kRoutedExperts || m.format != QFormat::kFp8PbWo, rule,
                   " gives the routed expert '", m.module,
                   "' format fp8_pb_wo; 128x128 block FP8 is written for attention, dense MLP and "
                   "shared-expert weights only: exclude the routed experts or pick another format");
    }
    plan.modules.push_back(std::move(m));
  }
  std::sort(plan.modules.begin(), plan.modules.end(),
            [](const PlannedModule& a, const PlannedModule& b) { return a.module < b.module; });
  if (!head_stored) plan.excluded_extra.push_back(tied_head_module(arch, names));
  STRATA_CHECK(!plan.modules.empty(), ckpt.dir(),
               ": no linear layers recognised; nothing to quantize");
  check_source_quantization(config, ckpt, plan.modules);

  // Consumers fuse these groups and refuse a mix of formats (format.md §4); fused experts are one
  // module of the layer (both projections).
  std::map<std::string, const PlannedModule*> first_of_group;
  for (const PlannedModule& m : plan.modules) {
    const std::string key = plan.fused_experts && routed_expert_index(m.module) >= 0
                                ? consumer_module(plan, m.module)
                                : fused_group_key(m.module);
    auto [it, inserted] = first_of_group.emplace(key, &m);
    if (inserted) continue;
    const PlannedModule& o = *it->second;
    if (o.format != m.format) {
      auto origin = [&](const PlannedModule& x) {
        return x.rule >= 0 ? recipe.rules[x.rule].origin : std::string("no rule");
      };
      fail("the recipe gives '", o.module, "' format ", qformat_name(o.format), " (", origin(o),
           ") but '", m.module, "' format ", qformat_name(m.format), " (", origin(m),
           "); vLLM fuses them into one layer and refuses a mix: give the whole group one format");
    }
  }
  for (size_t r = 0; r < recipe.rules.size(); ++r) {
    // Imported units (default_disabled, ...) list patterns for many architectures at once: only
    // the recipe's own rules are expected to hit something.
    if (matcher.rule_hits()[r] == 0 && !recipe.rules[r].imported) {
      plan.warnings.push_back(str(recipe.rules[r].origin, ": pattern '", recipe.rules[r].pattern,
                                  "' matches no linear module of this checkpoint"));
    }
  }
  if (kv_cache_calibrated(recipe.kv_cache)) {
    // Linear-attention layers (KDA, Gated DeltaNet) have no KV cache (format.md §3).
    for (int64_t l = 0; l < plan.num_layers; ++l) {
      if (!layer_is_linear_attention(arch, config, l)) plan.kv_layers.push_back(l);
    }
  }
  return plan;
}

}  // namespace strata
