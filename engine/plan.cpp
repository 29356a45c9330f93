#include "engine/plan.h"

#include <algorithm>
#include <map>

#include "core/error.h"
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

QuantPlan make_plan(const ModelConfig& config, const Checkpoint& ckpt, const Recipe& recipe) {
  QuantPlan plan;
  plan.recipe = recipe;
  const ArchInfo arch = resolve_arch(config);
  plan.num_layers = arch.num_hidden_layers;
  std::vector<int> rule_hits(recipe.rules.size(), 0);
  for (const std::string& name : ckpt.tensor_names()) {
    const TensorClass c = classify_tensor(arch, name);
    if (c.role != TensorRole::kLinearWeight) continue;
    const TensorEntry& e = ckpt.entry(name);
    STRATA_CHECK(
        name.size() > 7 && name.ends_with(".weight"), ckpt.dir(), ": linear weight '", name,
        "' does not end in .weight (fused or pre-quantized source layouts are not supported yet)");
    PlannedModule m;
    m.module = name.substr(0, name.size() - 7);
    m.layer = c.layer;
    m.kind = c.kind;
    m.dtype = e.dtype;
    m.shape = e.shape;
    const RuleDecision d = recipe_decide(recipe, m.module);
    m.format = d.format;
    m.rule = d.rule;
    // Multi-token-prediction layers are not run by calibration and not loaded by consumers as
    // part of the decoder: they stay in the source dtype whatever the recipe says.
    if (m.kind == TensorKind::kMtp) m.format = QFormat::kNone;
    for (size_t r = 0; r < recipe.rules.size(); ++r) {
      if (glob_match(recipe.rules[r].pattern, m.module) ||
          glob_match(recipe.rules[r].pattern, m.module + ".")) {
        ++rule_hits[r];
      }
    }
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
    }
    plan.modules.push_back(std::move(m));
  }
  std::sort(plan.modules.begin(), plan.modules.end(),
            [](const PlannedModule& a, const PlannedModule& b) { return a.module < b.module; });
  STRATA_CHECK(!plan.modules.empty(), ckpt.dir(),
               ": no linear layers recognised; nothing to quantize");

  // Consumers fuse these groups and refuse a mix of formats (format.md §4).
  std::map<std::string, const PlannedModule*> first_of_group;
  for (const PlannedModule& m : plan.modules) {
    auto [it, inserted] = first_of_group.emplace(fused_group_key(m.module), &m);
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
    if (rule_hits[r] == 0 && !recipe.rules[r].imported) {
      plan.warnings.push_back(str(recipe.rules[r].origin, ": pattern '", recipe.rules[r].pattern,
                                  "' matches no linear module of this checkpoint"));
    }
  }
  if (recipe.kv_cache == KvCacheFormat::kFp8) {
    // Linear-attention layers (KDA, Gated DeltaNet) have no KV cache (format.md §3).
    for (int64_t l = 0; l < plan.num_layers; ++l) {
      if (!layer_is_linear_attention(arch, config, l)) plan.kv_layers.push_back(l);
    }
  }
  return plan;
}

}  // namespace strata
