// strata recipes [NAME|PATH]
// Without an argument: every built-in recipe with its one-line description, one per line
// ("<name>  <description>", names padded to one column). With a built-in name or a YAML path:
// the recipe's KV-cache mode and its expanded rule list in order (imports spliced in), one rule
// per line: "<n>. <pattern> -> <format> [(input_amax A)] | enable | disable   (<origin>)"; the last
// matching rule decides each module (docs/RECIPES.md).
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/error.h"
#include "quant/recipe.h"

namespace strata::cli {

namespace {

std::string rule_action(const RecipeRule& r) {
  if (r.format && r.input_amax)
    return str(qformat_name(*r.format), " (input_amax ", *r.input_amax, ")");
  if (r.format) return std::string(qformat_name(*r.format));
  return r.enable.value_or(false) ? "enable" : "disable";
}

}  // namespace

int cmd_recipes(const std::vector<std::string>& argv) {
  Args args("recipes", "list the built-in recipes, or show one recipe's expanded rules");
  args.positional("recipe", "a built-in recipe name or a YAML file path", /*required=*/false);
  if (!args.parse(argv)) return 0;

  const std::optional<std::string> which = args.get_optional("recipe");
  if (!which) {
    const std::vector<RecipeInfo> all = builtin_recipes();
    size_t width = 0;
    for (const RecipeInfo& r : all)
      width = std::max(width, r.name.size());
    for (const RecipeInfo& r : all) {
      std::printf("%-*s  %s\n", static_cast<int>(width), r.name.c_str(), r.description.c_str());
    }
    return 0;
  }

  const Recipe recipe = load_recipe(*which);
  std::printf("recipe: %s\n", recipe.name.c_str());
  if (!recipe.description.empty()) std::printf("description: %s\n", recipe.description.c_str());
  std::printf("kv_cache: %s\n", std::string(kv_cache_format_name(recipe.kv_cache)).c_str());
  if (recipe.calibration == CalibrationMethod::kNvfp4ActHeadroom) {
    // Input amaxes from nvfp4_act_headroom; the weights' own algorithm after it.
    std::printf("algorithm: %s (weights: %s)\n",
                std::string(calibration_method_name(recipe.calibration)).c_str(),
                weight_calib_description(recipe.algorithm).c_str());
  } else {
    std::printf("algorithm: %s\n", weight_calib_description(recipe.algorithm).c_str());
  }
  std::printf("rules (the last matching rule decides; no match: unquantized):\n");
  size_t width = 0;
  for (const RecipeRule& r : recipe.rules)
    width = std::max(width, r.pattern.size());
  for (size_t i = 0; i < recipe.rules.size(); ++i) {
    const RecipeRule& r = recipe.rules[i];
    std::printf("%3zu. %-*s -> %-11s (%s)\n", i + 1, static_cast<int>(width), r.pattern.c_str(),
                rule_action(r).c_str(), r.origin.c_str());
  }
  return 0;
}

}  // namespace strata::cli
