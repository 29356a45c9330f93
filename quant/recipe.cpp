// Recipes: YAML parsing with yaml-cpp, the built-in recipe table (texts compiled in by
// quant/embed_recipes.cmake), and the fnmatch-style rule matcher.
#include "quant/recipe.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace strata {

namespace detail {
// Generated from recipes/**/*.yaml (quant/embed_recipes.cmake): repository-relative paths such as
// "recipes/nvfp4-kv_fp8.yaml" and "recipes/units/default_disabled.yaml", sorted, with their texts.
extern const char* const kRecipeFilePaths[];
extern const char* const kRecipeFileTexts[];
extern const size_t kRecipeFileCount;
}  // namespace detail

// ---- formats ----------------------------------------------------------------------------------

std::string_view qformat_name(QFormat f) {
  switch (f) {
    case QFormat::kNone:
      return "none";
    case QFormat::kNvfp4:
      return "nvfp4";
    case QFormat::kW4A16Nvfp4:
      return "w4a16_nvfp4";
    case QFormat::kFp8:
      return "fp8";
    case QFormat::kMxfp8:
      return "mxfp8";
    case QFormat::kW4A16Nvfp4Bs32:
      return "w4a16_nvfp4_bs32";
    case QFormat::kMxfp4:
      return "mxfp4";
    case QFormat::kFp8PbWo:
      return "fp8_pb_wo";
  }
  STRATA_ASSERT(false, "QFormat value ", static_cast<int>(f));
  return {};
}

std::optional<QFormat> qformat_from_name(std::string_view s) {
  for (QFormat f :
       {QFormat::kNone, QFormat::kNvfp4, QFormat::kW4A16Nvfp4, QFormat::kFp8, QFormat::kMxfp8,
        QFormat::kW4A16Nvfp4Bs32, QFormat::kMxfp4, QFormat::kFp8PbWo}) {
    if (qformat_name(f) == s) return f;
  }
  return std::nullopt;
}

std::string_view kv_cache_format_name(KvCacheFormat f) {
  switch (f) {
    case KvCacheFormat::kNone:
      return "none";
    case KvCacheFormat::kFp8:
      return "fp8";
    case KvCacheFormat::kFp8Cast:
      return "fp8_cast";
    case KvCacheFormat::kNvfp4:
      return "nvfp4";
    case KvCacheFormat::kNvfp4Cast:
      return "nvfp4_cast";
    case KvCacheFormat::kFp8Affine:
      return "fp8_affine";
    case KvCacheFormat::kNvfp4Affine:
      return "nvfp4_affine";
  }
  STRATA_ASSERT(false, "KvCacheFormat value ", static_cast<int>(f));
  return {};
}

namespace {
constexpr KvCacheFormat kKvFormats[] = {KvCacheFormat::kNone,       KvCacheFormat::kFp8,
                                        KvCacheFormat::kFp8Cast,    KvCacheFormat::kFp8Affine,
                                        KvCacheFormat::kNvfp4,      KvCacheFormat::kNvfp4Cast,
                                        KvCacheFormat::kNvfp4Affine};
}  // namespace

std::optional<KvCacheFormat> kv_cache_format_from_name(std::string_view s) {
  for (KvCacheFormat f : kKvFormats) {
    if (kv_cache_format_name(f) == s) return f;
  }
  return std::nullopt;
}

bool kv_cache_calibrated(KvCacheFormat f) {
  switch (f) {
    case KvCacheFormat::kFp8:
    case KvCacheFormat::kNvfp4:
    case KvCacheFormat::kFp8Affine:
    case KvCacheFormat::kNvfp4Affine:
      return true;
    case KvCacheFormat::kNone:
    case KvCacheFormat::kFp8Cast:
    case KvCacheFormat::kNvfp4Cast:
      return false;
  }
  return false;
}

bool kv_cache_affine(KvCacheFormat f) {
  switch (f) {
    case KvCacheFormat::kFp8Affine:
    case KvCacheFormat::kNvfp4Affine:
      return true;
    case KvCacheFormat::kNone:
    case KvCacheFormat::kFp8:
    case KvCacheFormat::kNvfp4:
    case KvCacheFormat::kFp8Cast:
    case KvCacheFormat::kNvfp4Cast:
      return false;
  }
  return false;
}

std::string_view kv_cache_quant_algo(KvCacheFormat f) {
  switch (f) {
    case KvCacheFormat::kNone:
      return "";
    case KvCacheFormat::kFp8:
    case KvCacheFormat::kFp8Cast:
    case KvCacheFormat::kFp8Affine:
      return "FP8";
    case KvCacheFormat::kNvfp4:
    case KvCacheFormat::kNvfp4Cast:
      return "NVFP4";
    case KvCacheFormat::kNvfp4Affine:
      return "NVFP4_AFFINE";
  }
  return "";
}

std::string_view kv_cache_description(KvCacheFormat f) {
  switch (f) {
    case KvCacheFormat::kNone:
      return "KV cache unquantized";
    case KvCacheFormat::kFp8:
      return "FP8 KV cache (calibrated k/v scales)";
    case KvCacheFormat::kFp8Cast:
      return "FP8 KV cache, cast (constant amax: no calibration, no k/v scale tensors)";
    case KvCacheFormat::kNvfp4:
      return "NVFP4 KV cache (calibrated k/v scales)";
    case KvCacheFormat::kNvfp4Cast:
      return "NVFP4 KV cache, cast (constant amax: no calibration, no k/v scale tensors)";
    case KvCacheFormat::kFp8Affine:
      return "FP8 KV cache, affine (calibrated k/v scales and per-head, per-channel k/v biases)";
    case KvCacheFormat::kNvfp4Affine:
      return "NVFP4 KV cache, affine (calibrated k/v scales and per-head, per-channel k/v biases)";
  }
  return "";
}

std::string_view qformat_quant_algo(QFormat f) {
  switch (f) {
    case QFormat::kNone:
      return "";
    case QFormat::kNvfp4:
      return "NVFP4";
    case QFormat::kW4A16Nvfp4:
    case QFormat::kW4A16Nvfp4Bs32:
      return "W4A16_NVFP4";
    case QFormat::kFp8:
      return "FP8";
    case QFormat::kMxfp8:
      return "MXFP8";
    case QFormat::kMxfp4:
      return "mxfp4";
    case QFormat::kFp8PbWo:
      return "fp8_pb_wo";
  }
  STRATA_ASSERT(false, "QFormat value ", static_cast<int>(f));
  return {};
}

std::string_view calibration_method_name(CalibrationMethod m) {
  switch (m) {
    case CalibrationMethod::kMax:
      return "max";
    case CalibrationMethod::kNvfp4ActHeadroom:
      return "nvfp4_act_headroom";
  }
  STRATA_ASSERT(false, "CalibrationMethod value ", static_cast<int>(m));
  return {};
}

int64_t qformat_block(QFormat f) {
  switch (f) {
    case QFormat::kNone:
    case QFormat::kFp8:
    case QFormat::kFp8PbWo:
      return 1;
    case QFormat::kNvfp4:
    case QFormat::kW4A16Nvfp4:
      return 16;
    case QFormat::kMxfp8:
    case QFormat::kW4A16Nvfp4Bs32:
    case QFormat::kMxfp4:
      return 32;
  }
  STRATA_ASSERT(false, "QFormat value ", static_cast<int>(f));
  return 1;
}

int64_t qformat_group_size(QFormat f) {
  // ModelOpt 0.47's process_layer_quant_config names a group_size for every block format it
  // knows; MXFP4 and FP8 per-block fall through to a bare {"quant_algo": ...}.
  return f == QFormat::kMxfp4 || qformat_block(f) == 1 ? 0 : qformat_block(f);
}

bool qformat_has_input_scale(QFormat f) {
  return f == QFormat::kNvfp4 || f == QFormat::kFp8;
}

// ---- glob -------------------------------------------------------------------------------------

namespace {

// Matches the bracket expression starting at pattern[p] == '[' against c. Returns the index just
// past the closing ']' and sets `matched`; returns npos when the bracket is not closed (then the
// '[' is an ordinary character, as in fnmatch).
size_t match_set(std::string_view pattern, size_t p, char c, bool& matched) {
  size_t i = p + 1;
  bool negate = false;
  if (i < pattern.size() && (pattern[i] == '!' || pattern[i] == '^')) {
    negate = true;
    ++i;
  }
  bool hit = false;
  bool first = true;
  while (i < pattern.size()) {
    char lo = pattern[i];
    if (lo == ']' && !first) {
      matched = hit != negate;
      return i + 1;
    }
    first = false;
    if (lo == '\\' && i + 1 < pattern.size()) lo = pattern[++i];
    ++i;
    char hi = lo;
    // A range "lo-hi"; a '-' before the closing ']' is an ordinary member.
    if (i + 1 < pattern.size() && pattern[i] == '-' && pattern[i + 1] != ']') {
      hi = pattern[i + 1];
      i += 2;
      if (hi == '\\' && i < pattern.size()) hi = pattern[i++];
    }
    const auto u = static_cast<unsigned char>(c);
    if (static_cast<unsigned char>(lo) <= u && u <= static_cast<unsigned char>(hi)) hit = true;
  }
  return std::string_view::npos;
}

// Whether pattern[p] (one pattern element, not '*') matches c; advances p past the element.
bool match_one(std::string_view pattern, size_t& p, char c) {
  const char pc = pattern[p];
  if (pc == '?') {
    ++p;
    return true;
  }
  if (pc == '[') {
    bool matched = false;
    const size_t next = match_set(pattern, p, c, matched);
    if (next != std::string_view::npos) {
      p = next;
      return matched;
    }
    ++p;
    return c == '[';
  }
  if (pc == '\\' && p + 1 < pattern.size()) {
    p += 2;
    return c == pattern[p - 1];
  }
  ++p;
  return c == pc;
}

}  // namespace

// Iterative matcher with single-star backtracking: on a mismatch, go back to the last '*' and let
// it swallow one more character. Earlier stars never need revisiting (the classic argument: the
// last star can absorb anything an earlier one could).
bool glob_match(std::string_view pattern, std::string_view text) {
  size_t p = 0, t = 0;
  size_t star_p = std::string_view::npos, star_t = 0;
  while (t < text.size()) {
    if (p < pattern.size() && pattern[p] == '*') {
      while (p < pattern.size() && pattern[p] == '*')
        ++p;
      star_p = p;
      star_t = t;
      continue;
    }
    if (p < pattern.size()) {
      size_t next = p;
      if (match_one(pattern, next, text[t])) {
        p = next;
        ++t;
        continue;
      }
    }
    if (star_p == std::string_view::npos) return false;
    p = star_p;
    t = ++star_t;
  }
  while (p < pattern.size() && pattern[p] == '*')
    ++p;
  return p == pattern.size();
}

// ---- parsing ----------------------------------------------------------------------------------

namespace {

constexpr std::string_view kQformatDir = "recipes/qformat/";
constexpr std::string_view kGeneralDir = "recipes/general/ptq/";
constexpr std::string_view kGeneralPrefix = "general/ptq/";
// ModelOpt 0.47's per-model recipes (modelopt_recipes/models/<org>/<model>/ptq/<name>.yaml), by
// the same name: "models/<org>/<model>/ptq/<name>" is recipes/models/<org>/<model>/ptq/<name>.yaml.
constexpr std::string_view kModelsDir = "recipes/models/";
constexpr std::string_view kModelsPrefix = "models/";
constexpr std::string_view kUnitDir = "recipes/units/";
// What ModelOpt 0.47's --kv_cache_qformat offers that strata does not write, and why.
constexpr std::string_view kKvRefused =
    "nvfp4_rotate (a Hadamard rotation of K) is not implemented";
constexpr std::string_view kYamlExt = ".yaml";
// ModelOpt 0.47 recipes (hf_ptq --recipe) that strata does not write, with what is missing: asked
// for by name, they are refused with that line rather than replaced by something else.
struct MissingRecipe {
  std::string_view name;
  std::string_view missing;
};
constexpr MissingRecipe kMissingRecipes[] = {
    {"general/ptq/nvfp4_default-kv_none-gptq", "GPTQ is not implemented"},
    {"general/ptq/nvfp4_experts_only-kv_fp8_layerwise",
     "ModelOpt 0.47's layerwise max calibration gives the routed experts other input scales "
     "than its non-layerwise run (up to 19% on the qwen3_moe fixture; weights and KV scales "
     "equal), which strata does not reproduce"},
    {"general/ptq/nvfp4_experts_only-kv_fp8_layerwise_offload",
     "ModelOpt 0.47's layerwise max calibration gives the routed experts other input scales "
     "than its non-layerwise run (up to 19% on the qwen3_moe fixture; weights and KV scales "
     "equal), which strata does not reproduce"},
    {"general/ptq/int4_blockwise_weight_only", "INT4 weights are not a format strata writes"},
};

// The text of a compiled-in file by repository-relative path, or nullptr.
const char* builtin_text(std::string_view path) {
  for (size_t i = 0; i < detail::kRecipeFileCount; ++i) {
    if (path == detail::kRecipeFilePaths[i]) return detail::kRecipeFileTexts[i];
  }
  return nullptr;
}

// Built-in names under `dir` (files directly in it), sorted.
std::vector<std::string> builtin_names(std::string_view dir) {
  std::vector<std::string> names;
  for (size_t i = 0; i < detail::kRecipeFileCount; ++i) {
    std::string_view path = detail::kRecipeFilePaths[i];
    if (!path.starts_with(dir) || !path.ends_with(kYamlExt)) continue;
    std::string_view rest = path.substr(dir.size(), path.size() - dir.size() - kYamlExt.size());
    if (rest.find('/') != std::string_view::npos) continue;
    names.emplace_back(rest);
  }
  std::sort(names.begin(), names.end());
  return names;
}

// The built-in per-model recipes, "models/<org>/<model>/ptq/<name>", sorted.
std::vector<std::string> builtin_model_names() {
  std::vector<std::string> names;
  for (size_t i = 0; i < detail::kRecipeFileCount; ++i) {
    std::string_view path = detail::kRecipeFilePaths[i];
    if (!path.starts_with(kModelsDir) || !path.ends_with(kYamlExt)) continue;
    names.push_back(
        str(kModelsPrefix,
            path.substr(kModelsDir.size(), path.size() - kModelsDir.size() - kYamlExt.size())));
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v)
    s += (s.empty() ? "" : ", ") + x;
  return s;
}

std::string scalar(const YAML::Node& n, const std::string& where, const char* key) {
  STRATA_CHECK(n.IsScalar(), where, ": '", key, "' must be a string");
  return n.Scalar();
}

struct ParseContext {
  std::string what;  // the file, for messages
  bool unit = false;
};

std::vector<RecipeRule> load_unit(const std::string& name, const std::string& where);

// Parses one rules list entry (1-based `index`) and appends the rule or the imported unit's rules.
void parse_rule(const ParseContext& ctx, const YAML::Node& node, int index,
                std::vector<RecipeRule>& out) {
  const std::string where = str(ctx.what, " rule ", index);
  STRATA_CHECK(node.IsMap(), where, ": a rule must be a mapping such as {pattern: \"*\", ",
               "format: nvfp4}");
  if (node["import"]) {
    STRATA_CHECK(!ctx.unit, where, ": a unit cannot import other units");
    STRATA_CHECK(node.size() == 1, where, ": an import rule has the single key 'import'");
    const std::string unit = scalar(node["import"], where, "import");
    std::vector<RecipeRule> rules = load_unit(unit, where);
    out.insert(out.end(), rules.begin(), rules.end());
    return;
  }
  RecipeRule rule;
  rule.origin = where;
  bool has_pattern = false;
  for (const auto& kv : node) {
    const std::string key = kv.first.IsScalar() ? kv.first.Scalar() : std::string("?");
    if (key == "pattern") {
      rule.pattern = scalar(kv.second, where, "pattern");
      has_pattern = true;
    } else if (key == "format") {
      const std::string f = scalar(kv.second, where, "format");
      const std::optional<QFormat> q = qformat_from_name(f);
      STRATA_CHECK(q.has_value() && *q != QFormat::kNone, where, ": unknown format '", f,
                   "' (formats: nvfp4, w4a16_nvfp4, fp8, mxfp8; use enable: false to leave a ",
                   "module unquantized)");
      rule.format = *q;
    } else if (key == "input_amax") {
      const std::string v = scalar(kv.second, where, "input_amax");
      char* end = nullptr;
      const float a = std::strtof(v.c_str(), &end);
      STRATA_CHECK(end != v.c_str() && *end == '\0' && std::isfinite(a) && a > 0, where,
                   ": input_amax must be a positive number, got '", v, "'");
      rule.input_amax = a;
    } else if (key == "enable") {
      const std::string v = scalar(kv.second, where, "enable");
      STRATA_CHECK(v == "true" || v == "false", where, ": enable must be true or false, got '", v,
                   "'");
      rule.enable = v == "true";
    } else {
      fail(where, ": unknown key '", key,
           "' (a rule has pattern, format (with optional input_amax) or enable, or import)");
    }
  }
  STRATA_CHECK(has_pattern && !rule.pattern.empty(), where, ": missing 'pattern'");
  STRATA_CHECK(!(rule.format && rule.enable), where, " ('", rule.pattern,
               "'): give either format or enable, not both");
  STRATA_CHECK(rule.format || rule.enable, where, " ('", rule.pattern,
               "'): give a format or enable: true/false");
  STRATA_CHECK(!rule.input_amax || rule.format == QFormat::kNvfp4 || rule.format == QFormat::kFp8,
               where, " ('", rule.pattern,
               "'): input_amax needs a format with an input scale (nvfp4 or fp8)");
  out.push_back(std::move(rule));
}

// A number (YAML scalar) of the algorithm mapping.
double algorithm_number(const YAML::Node& n, const std::string& where, const char* key) {
  const std::string v = scalar(n, where, key);
  char* end = nullptr;
  const double d = std::strtod(v.c_str(), &end);
  STRATA_CHECK(end != v.c_str() && *end == '\0' && std::isfinite(d), where, ": algorithm ", key,
               " must be a number, got '", v, "'");
  return d;
}

bool algorithm_bool(const YAML::Node& n, const std::string& where, const char* key) {
  const std::string v = scalar(n, where, key);
  STRATA_CHECK(v == "true" || v == "false", where, ": algorithm ", key,
               " must be true or false, got '", v, "'");
  return v == "true";
}

// `algorithm:` as ModelOpt's recipes write it: a method name, or a mapping with `method` and the
// options of ModelOpt 0.47's MaxCalibConfig / MseCalibConfig / LocalHessianCalibConfig that change
// what strata writes; `layerwise` and `distributed_sync` are accepted where they change nothing.
WeightCalib parse_algorithm(const YAML::Node& node, const std::string& what) {
  const std::string where = str(what, " algorithm");
  WeightCalib c;
  auto set_method = [&](const std::string& m) {
    if (m == "max") {
      c.method = WeightCalib::Method::kMax;
    } else if (m == "mse") {
      c.method = WeightCalib::Method::kMse;
    } else if (m == "local_hessian") {
      c.method = WeightCalib::Method::kLocalHessian;
      c.fp8_scale_sweep = true;  // LocalHessianCalibConfig's default
    } else {
      fail(where, ": unknown method '", m,
           "' (strata has max, mse and local_hessian for weights, nvfp4_act_headroom for NVFP4 "
           "inputs; ModelOpt's awq_*, smoothquant, gptq, svdquant and the others are not "
           "implemented)");
    }
  };
  if (node.IsScalar()) {
    set_method(node.Scalar());
    return c;
  }
  STRATA_CHECK(node.IsMap() && node["method"], where,
               ": give a method name or a mapping such as {method: mse, fp8_scale_sweep: true}");
  set_method(scalar(node["method"], where, "method"));
  for (const auto& kv : node) {
    const std::string key = kv.first.IsScalar() ? kv.first.Scalar() : std::string("?");
    const bool search = c.searches();
    if (key == "method") continue;
    if (key == "fp8_scale_sweep" && search) {
      c.fp8_scale_sweep = algorithm_bool(kv.second, where, "fp8_scale_sweep");
    } else if (key == "step_size" && search) {
      c.step_size = algorithm_number(kv.second, where, "step_size");
    } else if (key == "start_multiplier" && search) {
      c.start_multiplier = algorithm_number(kv.second, where, "start_multiplier");
    } else if (key == "stop_multiplier" && search) {
      c.stop_multiplier = algorithm_number(kv.second, where, "stop_multiplier");
    } else if (key == "block_size" && c.method == WeightCalib::Method::kLocalHessian) {
      STRATA_CHECK(algorithm_number(kv.second, where, "block_size") == 16, where,
                   ": block_size must be 16 (the NVFP4 block); ModelOpt allows others but then "
                   "its Hessian blocks do not align with the scale blocks");
    } else if (key == "distributed_sync") {
      algorithm_bool(kv.second, where, "distributed_sync");  // strata's ranks always merge
    } else if (key == "layerwise") {
      const YAML::Node& l = kv.second;
      const bool off = l.IsMap() && l.size() == 1 && l["enable"] &&
                       !algorithm_bool(l["enable"], where, "layerwise.enable");
      STRATA_CHECK(off, where,
                   ": only layerwise: {enable: false} is accepted (ModelOpt's layerwise "
                   "calibration feeds each layer the quantized previous layers' outputs; strata "
                   "calibrates on the unquantized ones)");
    } else {
      fail(where, ": unknown key '", key, "' for method ", weight_calib_method_name(c.method),
           " (mse and local_hessian take fp8_scale_sweep, step_size, start_multiplier, "
           "stop_multiplier; local_hessian also block_size; any method layerwise: {enable: "
           "false} and distributed_sync)");
    }
  }
  if (c.searches() && !c.fp8_scale_sweep) (void)mse_multipliers(c);  // checks the range
  return c;
}

// A recipe's `algorithm:`. ModelOpt 0.47's nvfp4_act_headroom (NVFP4ActHeadroomCalibConfig) sets
// the NVFP4 input amaxes and delegates the weights to its weight_scale_algorithm (default max);
// strata implements its default anchor_percentile 1, upper_percentile 99.99 and rho 16384
// (calib/max_calib.h), which its general/ptq recipe spells out. Any other method is a weight
// algorithm (parse_algorithm).
void parse_recipe_algorithm(const YAML::Node& node, const std::string& what, Recipe& r) {
  const std::string headroom(calibration_method_name(CalibrationMethod::kNvfp4ActHeadroom));
  const bool is_headroom = (node.IsScalar() && node.Scalar() == headroom) ||
                           (node.IsMap() && node["method"] && node["method"].IsScalar() &&
                            node["method"].Scalar() == headroom);
  if (!is_headroom) {
    r.algorithm = parse_algorithm(node, what);
    return;
  }
  r.calibration = CalibrationMethod::kNvfp4ActHeadroom;
  if (node.IsScalar()) return;
  const std::string where = str(what, " algorithm");
  for (const auto& kv : node) {
    const std::string key = kv.first.IsScalar() ? kv.first.Scalar() : std::string("?");
    if (key == "method") continue;
    if (key == "weight_scale_algorithm") {
      r.algorithm = parse_algorithm(kv.second, what);
      continue;
    }
    double want = 0.0;
    if (key == "anchor_percentile") {
      want = 1.0;
    } else if (key == "upper_percentile") {
      want = 99.99;
    } else if (key == "rho") {
      want = 16384.0;
    } else {
      fail(where, ": unknown key '", key,
           "' for method nvfp4_act_headroom (anchor_percentile, upper_percentile, rho, "
           "weight_scale_algorithm)");
    }
    STRATA_CHECK(algorithm_number(kv.second, where, key.c_str()) == want, where, ": ", key,
                 " must be ", want, " (ModelOpt's default, the only setting strata implements)");
  }
}

// Parses a recipe (or, with ctx.unit, a unit: description and rules only) from YAML text.
Recipe parse_any(std::string_view yaml, const ParseContext& ctx) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml));
  } catch (const YAML::Exception& e) {
    fail(ctx.what, ": YAML syntax error at line ", e.mark.line + 1, ", column ", e.mark.column + 1,
         ": ", e.msg);
  }
  STRATA_CHECK(root.IsMap(), ctx.what, ": a recipe is a mapping with keys description, ",
               ctx.unit ? "rules" : "imports, kv_cache, rules");
  Recipe r;
  r.name = ctx.what;
  const YAML::Node* rules_node = nullptr;
  YAML::Node rules_holder;
  for (const auto& kv : root) {
    const std::string key = kv.first.IsScalar() ? kv.first.Scalar() : std::string("?");
    if (key == "description") {
      r.description = scalar(kv.second, ctx.what, "description");
    } else if (key == "rules") {
      rules_holder = kv.second;
      rules_node = &rules_holder;
    } else if (key == "kv_cache" && !ctx.unit) {
      const std::string v = scalar(kv.second, ctx.what, "kv_cache");
      const std::optional<KvCacheFormat> f = kv_cache_format_from_name(v);
      STRATA_CHECK(f.has_value(), ctx.what, ": unknown kv_cache '", v,
                   "' (none, fp8, fp8_cast, nvfp4 or nvfp4_cast; ", kKvRefused, ")");
      r.kv_cache = *f;
    } else if (key == "algorithm" && !ctx.unit) {
      parse_recipe_algorithm(kv.second, ctx.what, r);
    } else if (key == "imports" && !ctx.unit) {
      STRATA_CHECK(kv.second.IsSequence(), ctx.what, ": 'imports' must be a list of unit names");
      int i = 0;
      for (const YAML::Node& n : kv.second) {
        const std::string where = str(ctx.what, " imports entry ", ++i);
        std::vector<RecipeRule> rules = load_unit(scalar(n, where, "imports"), where);
        r.rules.insert(r.rules.end(), rules.begin(), rules.end());
      }
    } else {
      fail(ctx.what, ": unknown key '", key, "' (a ", ctx.unit ? "unit" : "recipe", " has ",
           ctx.unit ? "description and rules"
                    : "description, imports, kv_cache, algorithm and rules",
           ")");
    }
  }
  STRATA_CHECK(rules_node != nullptr && rules_node->IsSequence() && rules_node->size() > 0,
               ctx.what, ": 'rules' must be a non-empty list");
  int index = 0;
  for (const YAML::Node& n : *rules_node)
    parse_rule(ctx, n, ++index, r.rules);

  // enable: true re-enables a format an earlier rule gave; without any earlier format rule it
  // can never do anything, which is a mistake in the recipe.
  if (!ctx.unit) {
    bool any_format = false;
    for (const RecipeRule& rule : r.rules) {
      STRATA_CHECK(any_format || rule.enable != true, rule.origin,
                   ": enable: true re-enables the format an earlier rule gave, but no earlier ",
                   "rule gives a format; write format: <name> instead");
      any_format = any_format || rule.format.has_value();
    }
  }
  return r;
}

std::vector<RecipeRule> load_unit(const std::string& name, const std::string& where) {
  const std::string path = str(kUnitDir, name, kYamlExt);
  const char* text = name.find('/') == std::string::npos ? builtin_text(path) : nullptr;
  STRATA_CHECK(text != nullptr, where, ": unknown unit '", name,
               "' (built-in units: ", join(builtin_names(kUnitDir)), ")");
  std::vector<RecipeRule> rules = parse_any(text, ParseContext{path, true}).rules;
  for (RecipeRule& rule : rules)
    rule.imported = true;
  return rules;
}

std::string read_text_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  STRATA_CHECK(f.good(), path, ": cannot open the recipe file");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

Recipe parse_recipe(std::string_view yaml, const std::string& what) {
  return parse_any(yaml, ParseContext{what, false});
}

namespace {

// The built-in qformats (recipes/qformat/*.yaml) and general recipes (recipes/general/ptq/*.yaml).
std::vector<std::string> qformat_names() {
  return builtin_names(kQformatDir);
}

std::string kv_names() {
  std::string s;
  for (KvCacheFormat f : kKvFormats)
    s += str(s.empty() ? "" : ", ", kv_cache_format_name(f));
  return s;
}

// "<qformat>-kv_<kv>" with a built-in qformat and a KV mode, or nullopt.
std::optional<Recipe> load_composed(const std::string& name) {
  const size_t cut = name.rfind("-kv_");
  if (cut == std::string::npos) return std::nullopt;
  const std::string q = name.substr(0, cut), kv = name.substr(cut + 4);
  const std::string path = str(kQformatDir, q, kYamlExt);
  const char* text = builtin_text(path);
  if (text == nullptr) return std::nullopt;
  const std::optional<KvCacheFormat> f = kv_cache_format_from_name(kv);
  STRATA_CHECK(f.has_value(), "unknown recipe '", name, "': '", kv,
               "' is not a KV-cache mode strata writes (", kv_names(), "; ", kKvRefused, ")");
  Recipe r = parse_recipe(text, path);
  r.name = name;
  r.kv_cache = *f;
  r.description = str(r.description, "; ", kv_cache_description(*f));
  return r;
}

}  // namespace

Recipe load_recipe(const std::string& name_or_path) {
  for (const MissingRecipe& m : kMissingRecipes) {
    STRATA_CHECK(name_or_path != m.name, "recipe '", name_or_path,
                 "' is ModelOpt 0.47's, not strata's: ", m.missing, " (docs/RECIPES.md)");
  }
  const bool yaml_file = name_or_path.ends_with(".yaml") || name_or_path.ends_with(".yml");
  if (!yaml_file && name_or_path.starts_with(kGeneralPrefix)) {
    const std::string path = str(kGeneralDir, name_or_path.substr(kGeneralPrefix.size()), kYamlExt);
    if (const char* text = builtin_text(path)) {
      Recipe r = parse_recipe(text, path);
      r.name = name_or_path;
      return r;
    }
    STRATA_CHECK(name_or_path.find('/', kGeneralPrefix.size()) != std::string::npos ||
                     std::filesystem::exists(name_or_path),
                 "unknown recipe '", name_or_path, "': strata has these of ModelOpt 0.47's ",
                 "general/ptq recipes: ", join(builtin_names(kGeneralDir)),
                 " (docs/RECIPES.md says why the others are missing)");
  }
  if (!yaml_file && name_or_path.starts_with(kModelsPrefix)) {
    const std::string path = str(kModelsDir, name_or_path.substr(kModelsPrefix.size()), kYamlExt);
    if (const char* text = builtin_text(path)) {
      Recipe r = parse_recipe(text, path);
      r.name = name_or_path;
      return r;
    }
    STRATA_CHECK(std::filesystem::exists(name_or_path), "unknown recipe '", name_or_path,
                 "': strata has these of ModelOpt 0.47's models/ recipes: ",
                 join(builtin_model_names()), " (docs/RECIPES.md)");
  }
  if (!yaml_file && name_or_path.find('/') == std::string::npos) {
    if (std::optional<Recipe> r = load_composed(name_or_path)) return *r;
    fail("unknown recipe '", name_or_path, "': give a YAML file path or a built-in name (",
         "<qformat>-kv_<kv> with qformat one of ", join(qformat_names()), " and kv one of ",
         kv_names(), "; or general/ptq/<name>; `strata recipes` lists them)");
  }
  Recipe r = parse_recipe(read_text_file(name_or_path), name_or_path);
  r.name = name_or_path;
  return r;
}

std::vector<RecipeInfo> builtin_recipes() {
  std::vector<RecipeInfo> out;
  for (const std::string& q : qformat_names()) {
    for (KvCacheFormat f : kKvFormats) {
      const std::string name = str(q, "-kv_", kv_cache_format_name(f));
      out.push_back({name, load_recipe(name).description});
    }
  }
  for (const std::string& g : builtin_names(kGeneralDir)) {
    const std::string name = str(kGeneralPrefix, g);
    out.push_back({name, load_recipe(name).description});
  }
  for (const std::string& name : builtin_model_names())
    out.push_back({name, load_recipe(name).description});
  std::sort(out.begin(), out.end(),
            [](const RecipeInfo& a, const RecipeInfo& b) { return a.name < b.name; });
  return out;
}

std::string recipe_name_for(std::string_view qformat, std::string_view kv_cache_qformat) {
  const std::vector<std::string> names = qformat_names();
  STRATA_CHECK(std::find(names.begin(), names.end(), qformat) != names.end(), "--qformat ", qformat,
               " is not a built-in qformat (", join(names),
               "); or give --recipe with a built-in name or a YAML file");
  STRATA_CHECK(kv_cache_format_from_name(kv_cache_qformat).has_value(), "--kv_cache_qformat ",
               kv_cache_qformat, " is not a KV-cache mode strata writes (", kv_names(), "; ",
               kKvRefused, ")");
  return str(qformat, "-kv_", kv_cache_qformat);
}

namespace {

// recipe_decide's loop over the rules; `matched` (when given) receives the rules whose pattern
// matched. `dotted` is module + ".".
RuleDecision decide_rules(const Recipe& recipe, std::string_view module, std::string_view dotted,
                          std::vector<uint32_t>* matched) {
  std::optional<QFormat> format;  // the last format a matching rule gave
  std::optional<float> input_amax;
  bool enabled = false;
  RuleDecision d;
  for (size_t i = 0; i < recipe.rules.size(); ++i) {
    const RecipeRule& rule = recipe.rules[i];
    if (!glob_match(rule.pattern, module) && !glob_match(rule.pattern, dotted)) continue;
    if (matched) matched->push_back(static_cast<uint32_t>(i));
    if (rule.format) {
      format = rule.format;
      input_amax = rule.input_amax;
      enabled = true;
    } else if (rule.enable == false) {
      enabled = false;
    } else if (format) {  // enable: true with a format to bring back
      enabled = true;
    } else {
      continue;  // enable: true, but no earlier rule gave this module a format: no effect
    }
    d.rule = static_cast<int>(i);
  }
  d.format = enabled && format ? *format : QFormat::kNone;
  if (d.format != QFormat::kNone) d.input_amax = input_amax;
  return d;
}

}  // namespace

RuleDecision recipe_decide(const Recipe& recipe, std::string_view module) {
  // ModelOpt-style patterns are written for a module's quantizers ("*mlp.gate.*" for
  // "...mlp.gate.weight_quantizer"): trying name + "." lets them hit the module itself.
  return decide_rules(recipe, module, str(module, "."), nullptr);
}

namespace {

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

// A pattern that cannot tell two runs of digits forming a whole dot-separated component apart
// (".17." from ".3."): no '?', '[' or '\\', and each digit of it beside a literal that is neither
// a digit, '.' nor '*' ("conv1d"), which a digit of such a run never sits beside.
bool blind_to_index_runs(std::string_view pattern) {
  if (pattern.find_first_of("?[\\") != std::string_view::npos) return false;
  auto guard = [&](size_t i) {
    return i < pattern.size() && !is_digit(pattern[i]) && pattern[i] != '.' && pattern[i] != '*';
  };
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (is_digit(pattern[i]) && !(i > 0 && guard(i - 1)) && !guard(i + 1)) return false;
  }
  return true;
}

}  // namespace

RecipeMatcher::RecipeMatcher(const Recipe& recipe)
    : recipe_(recipe), hits_(recipe.rules.size(), 0) {
  by_key_ = std::all_of(recipe.rules.begin(), recipe.rules.end(),
                        [](const RecipeRule& r) { return blind_to_index_runs(r.pattern); });
}

const RecipeMatcher::Entry& RecipeMatcher::match(std::string_view module) {
  auto full = [&](Entry& e) {
    dotted_.assign(module);
    dotted_ += '.';
    e.matched.clear();
    e.decision = decide_rules(recipe_, module, dotted_, &e.matched);
  };
  if (!by_key_) {
    full(uncached_);
    return uncached_;
  }
  // Each run of digits that is a whole component becomes one '0'.
  key_.clear();
  for (size_t i = 0; i < module.size();) {
    size_t j = i;
    while (j < module.size() && is_digit(module[j]))
      ++j;
    const bool component =
        j > i && (i == 0 || module[i - 1] == '.') && (j == module.size() || module[j] == '.');
    if (component) {
      key_ += '0';
      i = j;
    } else if (j > i) {
      key_.append(module.substr(i, j - i));
      i = j;
    } else {
      key_ += module[i++];
    }
  }
  auto it = cache_.find(key_);
  if (it != cache_.end()) return it->second;
  Entry e;
  // The key is a module name the patterns decide as they decide `module`.
  const std::string key = key_;
  module = key;
  full(e);
  return cache_.emplace(key, std::move(e)).first->second;
}

const RuleDecision& RecipeMatcher::decide(std::string_view module) {
  const Entry& e = match(module);
  for (uint32_t r : e.matched)
    ++hits_[r];
  return e.decision;
}

}  // namespace strata
