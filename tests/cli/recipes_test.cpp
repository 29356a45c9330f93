// `strata recipes` run as a user would: the list names every built-in recipe (names written here
// by hand) with a description; `strata recipes NAME` and `strata recipes PATH` print the expanded
// rules with their origins; an unknown name and a bad recipe file exit 1 naming the problem.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/cli/cli_util.h"

namespace {

using namespace strata_cli_test;

// Every built-in recipe, sorted: each qformat (recipes/qformat) with each KV-cache mode, then
// ModelOpt 0.47's general/ptq recipes strata has, and its models/ recipes.
const std::vector<std::string> kBuiltins = {
    "fp8-kv_fp8",
    "fp8-kv_fp8_affine",
    "fp8-kv_fp8_cast",
    "fp8-kv_none",
    "fp8-kv_nvfp4",
    "fp8-kv_nvfp4_affine",
    "fp8-kv_nvfp4_cast",
    "fp8_mla_bf16-kv_fp8",
    "fp8_mla_bf16-kv_fp8_affine",
    "fp8_mla_bf16-kv_fp8_cast",
    "fp8_mla_bf16-kv_none",
    "fp8_mla_bf16-kv_nvfp4",
    "fp8_mla_bf16-kv_nvfp4_affine",
    "fp8_mla_bf16-kv_nvfp4_cast",
    "general/ptq/fp8_default-kv_fp8",
    "general/ptq/fp8_default-kv_fp8_cast",
    "general/ptq/mxfp4_mlp_weight_only",
    "general/ptq/nvfp4_act_headroom-kv_fp8_cast",
    "general/ptq/nvfp4_default-kv_fp8",
    "general/ptq/nvfp4_default-kv_fp8_cast",
    "general/ptq/nvfp4_default-kv_nvfp4_cast",
    "general/ptq/nvfp4_experts_only-kv_fp8",
    "general/ptq/nvfp4_experts_only-kv_fp8_cast",
    "general/ptq/nvfp4_experts_only_input_scale1-kv_fp8_cast",
    "general/ptq/nvfp4_experts_only_mse-kv_fp8_cast",
    "general/ptq/nvfp4_mlp_only-kv_fp8",
    "general/ptq/nvfp4_mlp_only-kv_fp8_cast",
    "general/ptq/nvfp4_mlp_only-novit-kv_fp8",
    "general/ptq/nvfp4_mlp_only_mse-kv_fp8_cast",
    "general/ptq/nvfp4_mlp_weight_only",
    "general/ptq/nvfp4_omlp_only-kv_fp8",
    "general/ptq/nvfp4_omlp_only-kv_fp8_cast",
    "general/ptq/nvfp4_weight_only-kv_fp16",
    "general/ptq/nvfp4_weight_only-kv_fp8_cast",
    "models/moonshotai/Kimi-K3/ptq/nvfp4_experts-fp8_pb_attention",
    "mxfp8-kv_fp8",
    "mxfp8-kv_fp8_affine",
    "mxfp8-kv_fp8_cast",
    "mxfp8-kv_none",
    "mxfp8-kv_nvfp4",
    "mxfp8-kv_nvfp4_affine",
    "mxfp8-kv_nvfp4_cast",
    "nvfp4-kv_fp8",
    "nvfp4-kv_fp8_affine",
    "nvfp4-kv_fp8_cast",
    "nvfp4-kv_none",
    "nvfp4-kv_nvfp4",
    "nvfp4-kv_nvfp4_affine",
    "nvfp4-kv_nvfp4_cast",
    "nvfp4_experts_only-kv_fp8",
    "nvfp4_experts_only-kv_fp8_affine",
    "nvfp4_experts_only-kv_fp8_cast",
    "nvfp4_experts_only-kv_none",
    "nvfp4_experts_only-kv_nvfp4",
    "nvfp4_experts_only-kv_nvfp4_affine",
    "nvfp4_experts_only-kv_nvfp4_cast",
    "nvfp4_mla_bf16-kv_fp8",
    "nvfp4_mla_bf16-kv_fp8_affine",
    "nvfp4_mla_bf16-kv_fp8_cast",
    "nvfp4_mla_bf16-kv_none",
    "nvfp4_mla_bf16-kv_nvfp4",
    "nvfp4_mla_bf16-kv_nvfp4_affine",
    "nvfp4_mla_bf16-kv_nvfp4_cast",
    "nvfp4_mlp_only-kv_fp8",
    "nvfp4_mlp_only-kv_fp8_affine",
    "nvfp4_mlp_only-kv_fp8_cast",
    "nvfp4_mlp_only-kv_none",
    "nvfp4_mlp_only-kv_nvfp4",
    "nvfp4_mlp_only-kv_nvfp4_affine",
    "nvfp4_mlp_only-kv_nvfp4_cast",
    "nvfp4_omlp_only-kv_fp8",
    "nvfp4_omlp_only-kv_fp8_affine",
    "nvfp4_omlp_only-kv_fp8_cast",
    "nvfp4_omlp_only-kv_none",
    "nvfp4_omlp_only-kv_nvfp4",
    "nvfp4_omlp_only-kv_nvfp4_affine",
    "nvfp4_omlp_only-kv_nvfp4_cast",
    "w4a16_nvfp4-kv_fp8",
    "w4a16_nvfp4-kv_fp8_affine",
    "w4a16_nvfp4-kv_fp8_cast",
    "w4a16_nvfp4-kv_none",
    "w4a16_nvfp4-kv_nvfp4",
    "w4a16_nvfp4-kv_nvfp4_affine",
    "w4a16_nvfp4-kv_nvfp4_cast",
};

// The lines of s, without their '\n'.
std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t eol = s.find('\n', pos);
    if (eol == std::string::npos) eol = s.size();
    out.push_back(s.substr(pos, eol - pos));
    pos = eol + 1;
  }
  return out;
}

TEST(RecipesCli, ListsEveryBuiltinWithADescription) {
  TempDir tmp;
  const RunResult r = run_strata("recipes", tmp.path());
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.err, "");
  const std::vector<std::string> lines = lines_of(r.out);
  ASSERT_EQ(lines.size(), kBuiltins.size()) << r.out;
  for (size_t i = 0; i < kBuiltins.size(); ++i) {
    // "<name><spaces><description>", sorted by name.
    ASSERT_EQ(lines[i].rfind(kBuiltins[i] + " ", 0), 0u) << lines[i];
    const size_t desc = lines[i].find_first_not_of(' ', kBuiltins[i].size());
    ASSERT_NE(desc, std::string::npos) << lines[i];
    EXPECT_GT(lines[i].size() - desc, 20u) << lines[i];
  }
}

TEST(RecipesCli, ShowsTheExpandedRulesOfABuiltin) {
  TempDir tmp;
  const RunResult r = run_strata("recipes nvfp4_experts_only-kv_fp8", tmp.path());
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("recipe: nvfp4_experts_only-kv_fp8\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("kv_cache: fp8\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("algorithm: max\n"), std::string::npos) << r.out;
  const RunResult h = run_strata("recipes general/ptq/nvfp4_act_headroom-kv_fp8_cast", tmp.path());
  ASSERT_EQ(h.rc, 0) << h.err;
  EXPECT_NE(h.out.find("algorithm: nvfp4_act_headroom (weights: max)\n"), std::string::npos)
      << h.out;
  const std::vector<std::string> lines = lines_of(r.out);
  // The recipe's own rule first, then default_disabled's, with their origins.
  bool experts = false, lm_head = false;
  for (const std::string& l : lines) {
    if (l.find("1. *.experts.*") != std::string::npos) {
      experts = true;
      EXPECT_NE(l.find("-> nvfp4"), std::string::npos) << l;
      EXPECT_NE(l.find("(recipes/qformat/nvfp4_experts_only.yaml rule 1)"), std::string::npos) << l;
    }
    if (l.find(" *lm_head* ") != std::string::npos) {
      lm_head = true;
      EXPECT_NE(l.find("-> disable"), std::string::npos) << l;
      EXPECT_NE(l.find("(recipes/units/default_disabled.yaml rule 6)"), std::string::npos) << l;
    }
  }
  EXPECT_TRUE(experts) << r.out;
  EXPECT_TRUE(lm_head) << r.out;
}

TEST(RecipesCli, ShowsAUserRecipeFile) {
  TempDir tmp;
  const fs::path file = tmp.path() / "mine.yaml";
  write_file(
      file,
      "description: my test recipe\nkv_cache: none\nrules:\n"
      "  - {pattern: \"*mlp*\", format: fp8}\n  - {pattern: \"*down_proj\", enable: false}\n");
  const RunResult r = run_strata("recipes '" + file.string() + "'", tmp.path());
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("description: my test recipe\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("kv_cache: none\n"), std::string::npos) << r.out;
  const std::vector<std::string> lines = lines_of(r.out);
  ASSERT_GE(lines.size(), 2u);
  EXPECT_NE(lines[lines.size() - 2].find("1. *mlp*"), std::string::npos) << r.out;
  EXPECT_NE(lines[lines.size() - 2].find("-> fp8"), std::string::npos) << r.out;
  EXPECT_NE(lines.back().find("2. *down_proj"), std::string::npos) << r.out;
  EXPECT_NE(lines.back().find("-> disable"), std::string::npos) << r.out;
  EXPECT_NE(lines.back().find(file.string() + " rule 2"), std::string::npos) << r.out;
}

TEST(RecipesCli, ErrorsExitOneNamingTheProblem) {
  TempDir tmp;
  RunResult r = run_strata("recipes nvfp4-kv_fp16", tmp.path());
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find("unknown recipe 'nvfp4-kv_fp16'"), std::string::npos) << r.err;

  const fs::path file = tmp.path() / "bad.yaml";
  write_file(file, "rules:\n  - {pattern: \"*\", format: int3}\n");
  r = run_strata("recipes '" + file.string() + "'", tmp.path());
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find(file.string() + " rule 1: unknown format 'int3'"), std::string::npos)
      << r.err;
}

}  // namespace
