// `strata eval` on a transformers fixture: its dumped logits against transformers' fp32 logits,
// and its mean NLL against the NLL computed here from those reference logits.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "tests/cli/cli_util.h"

namespace {

using namespace strata_cli_test;
const std::string kModel = std::string(STRATA_SOURCE_DIR) + "/tests/fixtures/models/qwen3_moe";

TEST(Eval, MatchesTransformersLogitsAndNll) {
  TempDir tmp;
  strata::SafetensorsFile ref = strata::SafetensorsFile::open(kModel + "/reference.safetensors");
  std::string jsonl;
  std::vector<std::vector<int32_t>> seqs;
  for (int s = 0; ref.find("tokens." + std::to_string(s)); ++s) {
    strata::Tensor t = ref.tensor("tokens." + std::to_string(s));
    seqs.emplace_back(t.data<int32_t>(), t.data<int32_t>() + t.numel());
    jsonl += "[";
    for (size_t i = 0; i < seqs.back().size(); ++i)
      jsonl += (i ? "," : "") + std::to_string(seqs.back()[i]);
    jsonl += "]\n";
  }
  ASSERT_GE(seqs.size(), 2u);
  write_file(tmp.path() / "tokens.jsonl", jsonl);
  const std::string logits = (tmp.path() / "logits.safetensors").string();
  RunResult r = run_strata("eval --model '" + kModel + "' --tokens '" +
                               (tmp.path() / "tokens.jsonl").string() + "' --fp32 --dump-logits '" +
                               logits + "'",
                           tmp.path());
  ASSERT_EQ(r.rc, 0) << r.err;

  double nll = 0;
  int64_t predicted = 0;
  strata::SafetensorsFile got = strata::SafetensorsFile::open(logits);
  for (size_t s = 0; s < seqs.size(); ++s) {
    strata::Tensor want = ref.tensor("ref32.logits." + std::to_string(s));
    strata::Tensor mine = got.tensor("logits_" + std::to_string(s));
    ASSERT_EQ(mine.shape(), want.shape());
    double num = 0, den = 0;
    for (int64_t i = 0; i < want.numel(); ++i) {
      const double d = mine.item_f32(i) - want.item_f32(i);
      num += d * d;
      den += static_cast<double>(want.item_f32(i)) * want.item_f32(i);
    }
    EXPECT_LT(std::sqrt(num / den), 1e-4) << "sequence " << s;
    const int64_t V = want.dim(1);
    for (size_t t = 0; t + 1 < seqs[s].size(); ++t) {
      double mx = -1e300, sum = 0;
      for (int64_t v = 0; v < V; ++v)
        mx = std::max(mx, static_cast<double>(want.item_f32(t * V + v)));
      for (int64_t v = 0; v < V; ++v)
        sum += std::exp(want.item_f32(t * V + v) - mx);
      nll += std::log(sum) + mx - want.item_f32(t * V + seqs[s][t + 1]);
      ++predicted;
    }
  }
  const double mean = nll / static_cast<double>(predicted);
  const auto pos = r.out.find("mean_nll ");
  ASSERT_NE(pos, std::string::npos) << r.out;
  const double printed = std::stod(r.out.substr(pos + 9));
  EXPECT_NEAR(printed, mean, 1e-4 * mean);
  EXPECT_NE(r.out.find("predicted " + std::to_string(predicted)), std::string::npos) << r.out;
}

TEST(Eval, BadTokenFilesAreOneLineErrors) {
  TempDir tmp;
  struct Case {
    std::string content, needle;
  } cases[] = {
      {"[1, 2, 3]\n[4, \"x\"]\n", "tokens.jsonl:2: token ids must be non-negative integers"},
      {"[1, 2\n", "tokens.jsonl:1: invalid JSON"},
      {"[1, 99999]\n", "token id 99999 is outside the vocabulary"},
      {"\n\n", "tokens.jsonl: no sequences"},
  };
  for (const Case& c : cases) {
    write_file(tmp.path() / "tokens.jsonl", c.content);
    RunResult r = run_strata(
        "eval --model '" + kModel + "' --tokens '" + (tmp.path() / "tokens.jsonl").string() + "'",
        tmp.path());
    EXPECT_EQ(r.rc, 1) << c.content;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
}

}  // namespace
