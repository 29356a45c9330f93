// The checks of recipe_fuzz, shared with tests/quant/fuzz_replay_test.cpp: YAML text given as a
// user recipe file (parse_recipe, which load_recipe calls on a file's text) must parse or throw
// strata::Error. A recipe it accepts keeps what recipe.h promises: at least one rule; each rule
// has a pattern and exactly one of format / enable (format never "none"); enable: true never
// comes before the first format rule; and recipe_decide names a rule that matches. Anything else
// (a crash, a sanitizer report, another exception, a broken promise: trap) is a finding.
// recipe_one returns whether the recipe was accepted.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/error.h"
#include "quant/recipe.h"

namespace strata::fuzz {

inline bool recipe_one(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  Recipe r;
  try {
    r = parse_recipe(text, "fuzz.yaml");
  } catch (const Error&) {
    return false;
  }
  if (r.rules.empty()) __builtin_trap();
  bool any_format = false;
  for (const RecipeRule& rule : r.rules) {
    if (rule.pattern.empty() || rule.origin.empty()) __builtin_trap();
    if (rule.format.has_value() == rule.enable.has_value()) __builtin_trap();
    if (rule.format == QFormat::kNone) __builtin_trap();
    if (rule.enable == true && !any_format) __builtin_trap();
    any_format = any_format || rule.format.has_value();
  }
  for (const char* module :
       {"model.layers.0.mlp.down_proj", "model.layers.3.mlp.experts.17.gate_proj",
        "model.layers.1.self_attn.q_proj", "lm_head", "model.embed_tokens"}) {
    const RuleDecision d = recipe_decide(r, module);
    if (d.rule < -1 || d.rule >= static_cast<int>(r.rules.size())) __builtin_trap();
    if (d.rule >= 0) {
      const std::string& p = r.rules[d.rule].pattern;
      if (!glob_match(p, module) && !glob_match(p, std::string(module) + ".")) __builtin_trap();
    } else if (d.format != QFormat::kNone) {
      __builtin_trap();
    }
  }
  return true;
}

}  // namespace strata::fuzz
