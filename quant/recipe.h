// Recipes: which format every quantizer gets.
//
// A quantizer is a linear module of the checkpoint, named by its hub module name
// ("model.layers.3.mlp.experts.17.down_proj"). A recipe is an ordered list of rules; each rule
// is a glob on that name with either a format or an enable flag; for each quantizer the last
// rule that matches decides (later rules win). No matching rule: the module stays unquantized.
//
// Glob semantics are fnmatch's without flags: case-sensitive, `*` matches any run of characters
// including dots, `?` one character, `[...]` a set. A pattern is tried on the module name and on
// the module name followed by "." so that ModelOpt-style patterns written for a module's
// quantizers (`*mlp.gate.*`) hit the module itself.
//
// YAML (recipes/*.yaml, built into the binary; a user recipe is a path to such a file):
//   description: one line shown by `strata recipes`
//   imports: [default_disabled]      # units from recipes/units/, their rules go first, in order
//   kv_cache: fp8                    # none | fp8 | fp8_cast | nvfp4 | nvfp4_cast (default none)
//   algorithm: {method: mse, fp8_scale_sweep: true}   # weight calibration (default max), as
//                                    # ModelOpt's recipes spell it (quant/scale_search.h); or
//                                    # {method: nvfp4_act_headroom, weight_scale_algorithm: ...}
//                                    # for NVFP4 input amaxes (calib/max_calib.h)
//   rules:
//     - {pattern: "*", format: nvfp4}
//     - {pattern: "*.experts.*", enable: false}
//     - import: default_disabled     # a unit's rules spliced in at this place
// `enable: false` leaves a module unquantized; `enable: true` re-enables the format an earlier
// rule gave it (an error when no earlier rule of the recipe gives any format; for a module that no
// earlier format rule matched it has no effect). Unknown keys, unknown formats, a rule with both
// or neither of format/enable, and a missing import are errors naming the file and rule index.
// Rules are numbered from 1 in each file; a rule's origin is "<file> rule <n>", where the file of
// a unit's rule is "recipes/units/<unit>.yaml". Units hold description and rules only (no
// imports, no kv_cache). The built-in recipes end with `- import: default_disabled`, so the
// exclusions win over their format rules (docs/RECIPES.md).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "quant/scale_search.h"

namespace strata {

// Per-module formats. kNvfp4 quantizes weights and inputs (W4A4); kW4A16Nvfp4 weights only;
// kFp8 per-tensor weights and inputs; kMxfp8 weights with E8M0 block scales (no input scale);
// kW4A16Nvfp4Bs32 NVFP4 weights in blocks of 32 (ModelOpt's nvfp4_bs32, weight-only);
// kMxfp4 E2M1 weights with E8M0 scales per 32 (weight-only, quant/mxfp4.h); kFp8PbWo E4M3
// weights with one F32 scale per 128x128 block (weight-only, ModelOpt's fp8_pb_wo, quant/fp8.h).
enum class QFormat : uint8_t {
  kNone,
  kNvfp4,
  kW4A16Nvfp4,
  kFp8,
  kMxfp8,
  kW4A16Nvfp4Bs32,
  kMxfp4,
  kFp8PbWo
};
// KV-cache modes, named as hf_ptq's --kv_cache_qformat (ModelOpt 0.47's configs/ptq/presets/kv):
// kFp8 / kNvfp4 calibrate k/v amaxes and write k_scale/v_scale = amax / 448; the cast modes pin
// the quantizers' amax to a constant (use_constant_amax), need no calibration and write no k/v
// scale tensors, only kv_cache_quant_algo. The affine modes (configs/ptq/units/kv_*_affine) are
// kFp8 / kNvfp4 with a static bias on the k/v quantizers: one value per head and channel,
// calibrated beside the amax (calib/max_calib.h "Affine KV cache"), written as k_bias/v_bias.
enum class KvCacheFormat : uint8_t {
  kNone,
  kFp8,
  kFp8Cast,
  kNvfp4,
  kNvfp4Cast,
  kFp8Affine,
  kNvfp4Affine
};
// How calibrated input amaxes are made (ModelOpt's quantize.algorithm.method): kMax, the largest
// |x|; kNvfp4ActHeadroom, ModelOpt 0.47's nvfp4_act_headroom for the inputs of NVFP4 modules
// (max(16384 x the 1st percentile, the 99.99th percentile) of the per-16-block amaxes, from a log2
// histogram: calib/max_calib.h), max for every other input. YAML: `algorithm: {method:
// nvfp4_act_headroom, weight_scale_algorithm: {method: max}}`, as ModelOpt's recipe spells it.
enum class CalibrationMethod : uint8_t { kMax, kNvfp4ActHeadroom };
// "max", "nvfp4_act_headroom"
std::string_view calibration_method_name(CalibrationMethod m);

// "nvfp4", "w4a16_nvfp4", "fp8", "mxfp8", "w4a16_nvfp4_bs32", "mxfp4", "fp8_pb_wo", "none"
std::string_view qformat_name(QFormat f);
std::optional<QFormat> qformat_from_name(std::string_view s);
// "none", "fp8", "fp8_cast", "nvfp4", "nvfp4_cast", "fp8_affine", "nvfp4_affine"
std::string_view kv_cache_format_name(KvCacheFormat f);
std::optional<KvCacheFormat> kv_cache_format_from_name(std::string_view s);
// Whether the mode calibrates k/v amaxes (and writes k_scale/v_scale): kFp8, kNvfp4 and the
// affine modes.
bool kv_cache_calibrated(KvCacheFormat f);
// Whether the mode calibrates and writes k/v biases (k_bias/v_bias): kFp8Affine, kNvfp4Affine.
bool kv_cache_affine(KvCacheFormat f);
// hf_quant_config's kv_cache_quant_algo: "FP8" (kFp8Affine too: ModelOpt 0.47 names an FP8 KV
// cache FP8 with or without biases), "NVFP4", "NVFP4_AFFINE", "" for kNone.
std::string_view kv_cache_quant_algo(KvCacheFormat f);
// One line for `strata recipes` and descriptions ("FP8 KV cache (calibrated k/v scales)", ...).
std::string_view kv_cache_description(KvCacheFormat f);
// ModelOpt's quant_algo for a format: "NVFP4", "W4A16_NVFP4" (both NVFP4 weight-only block
// sizes), "FP8", "MXFP8", "mxfp4" and "fp8_pb_wo" (lower case: ModelOpt 0.47 writes its
// internal name for both) ("" for kNone).
std::string_view qformat_quant_algo(QFormat f);
// Input width a format needs to divide (16 for NVFP4, 32 for MXFP8, MXFP4 and NVFP4 bs32, 1
// otherwise: FP8 per-block takes any shape, its last blocks partial).
int64_t qformat_block(QFormat f);
// The group_size ModelOpt 0.47 writes for the format in hf_quant_config.json (and in a mixed
// recipe's quantized_layers): the block, except none (0) for FP8, MXFP4 and FP8 per-block.
int64_t qformat_group_size(QFormat f);
// Whether the format quantizes the module's input too (an input_scale): kNvfp4, kFp8.
bool qformat_has_input_scale(QFormat f);

struct RecipeRule {
  std::string pattern;
  std::optional<QFormat> format;
  std::optional<bool> enable;
  std::string origin;     // "recipes/nvfp4-kv_fp8.yaml rule 3", for messages (contains "units/"
                          // for a rule imported from a unit)
  bool imported = false;  // spliced in from a unit (recipes/units/); such rules need not match
  // `input_amax: A` on a format rule: the input quantizer's amax is the constant A instead of a
  // calibrated one (ModelOpt's constant_amax; 2688 gives an NVFP4 input_scale of 1.0).
  std::optional<float> input_amax;
};

struct Recipe {
  std::string name;  // built-in name, or the path it was read from
  std::string description;
  KvCacheFormat kv_cache = KvCacheFormat::kNone;
  WeightCalib algorithm;  // how weight scales are chosen (max: from max|W|)
  // How NVFP4 input amaxes are calibrated: `algorithm: {method: nvfp4_act_headroom, ...}` sets
  // kNvfp4ActHeadroom and takes the weights' method from its weight_scale_algorithm.
  CalibrationMethod calibration = CalibrationMethod::kMax;
  std::vector<RecipeRule> rules;  // imports expanded, in order
};

// A built-in recipe by name or a YAML file by path. Built-in names:
//   "<qformat>-kv_<kv>": recipes/qformat/<qformat>.yaml (which modules get which format) with the
//     KV-cache mode <kv> (kv_cache_format_name), as hf_ptq's --qformat / --kv_cache_qformat;
//   "general/ptq/<name>": recipes/general/ptq/<name>.yaml, ModelOpt 0.47's recipe of that name
//     (hf_ptq --recipe general/ptq/<name>);
//   "models/<org>/<model>/ptq/<name>": recipes/models/<org>/<model>/ptq/<name>.yaml, ModelOpt
//     0.47's per-model recipe of that name (Kimi-K3's nvfp4_experts-fp8_pb_attention).
// Anything else containing '/' or ending in .yaml/.yml is a path. Throws strata::Error naming the
// file and rule.
Recipe load_recipe(const std::string& name_or_path);
// Parses YAML text; `what` names it in errors. Imports resolve against the built-in units.
Recipe parse_recipe(std::string_view yaml, const std::string& what);

struct RecipeInfo {
  std::string name;
  std::string description;
};
// Built-in recipes, sorted by name.
std::vector<RecipeInfo> builtin_recipes();
// The built-in recipe hf_ptq's flags name: qformat "nvfp4_experts_only" + kv "fp8" ->
// "nvfp4_experts_only-kv_fp8". Throws strata::Error for an unknown qformat or KV mode, listing the
// valid ones.
std::string recipe_name_for(std::string_view qformat, std::string_view kv_cache_qformat);

struct RuleDecision {
  QFormat format = QFormat::kNone;
  int rule = -1;  // index into Recipe::rules of the deciding rule, -1 when none matched
  std::optional<float> input_amax;  // of the format rule that gave `format`
};
// The format of one module, and which rule decided it.
RuleDecision recipe_decide(const Recipe& recipe, std::string_view module);

// recipe_decide for every module of a checkpoint, with how many modules each rule matched. A
// checkpoint's module names repeat per layer and per expert with other indices only
// ("model.layers.3.mlp.experts.17.down_proj"), and a pattern without '?', '[' or '\\' whose
// digits each sit beside a letter-like literal ("*conv1d*") cannot tell two such index components
// apart (its literals match no digit of them, its stars absorb any run): when every rule's pattern
// is such, each run of digits forming a whole dot-separated component is replaced by one '0' and
// the decision is remembered for that key, so that the rules are matched once per distinct key
// instead of once per module. Otherwise every module is matched in full. Either way decide()
// returns what recipe_decide returns.
class RecipeMatcher {
 public:
  explicit RecipeMatcher(const Recipe& recipe);
  const RuleDecision& decide(std::string_view module);
  // Per rule, how many decide() calls its pattern matched (the module or the module + ".").
  const std::vector<int64_t>& rule_hits() const { return hits_; }

 private:
  struct Entry {
    RuleDecision decision;
    std::vector<uint32_t> matched;  // the rules whose pattern matched
  };
  const Entry& match(std::string_view module);

  const Recipe& recipe_;
  bool by_key_ = false;  // every pattern is blind to digit runs
  std::vector<int64_t> hits_;
  std::string key_, dotted_;  // reused buffers
  std::map<std::string, Entry, std::less<>> cache_;
  Entry uncached_;
};
// fnmatch without flags (exposed for tests).
bool glob_match(std::string_view pattern, std::string_view text);

}  // namespace strata
