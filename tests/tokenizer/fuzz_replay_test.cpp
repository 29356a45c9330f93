// The tokenizer fuzz targets' seeds and findings, replayed (tests/fuzz_replay_util.h): every input
// gives a tokenizer that keeps its promises or a strata::Error.
#include <gtest/gtest.h>

#include "fuzz/tokenizer_target.h"
#include "tests/fuzz_replay_util.h"

namespace strata {
namespace {

TEST(FuzzReplay, TokenizerJson) {
  const auto seeds = test::fuzz_inputs("fuzz/corpus/tokenizer_json");
  ASSERT_FALSE(seeds.empty());
  // The seeds are cut-down real tokenizers: each loads (else fuzzing starts from refusals only),
  // except those named bad_*.
  int good = 0;
  for (const auto& p : seeds)
    good += !p.filename().string().starts_with("bad_");
  EXPECT_EQ(test::replay_fuzz_inputs(seeds, fuzz::tokenizer_json_one), good);
  test::replay_fuzz_inputs(test::fuzz_inputs("tests/tokenizer/fuzz_regressions", "tokenizer_json-"),
                           fuzz::tokenizer_json_one);
}

TEST(FuzzReplay, Tiktoken) {
  const auto seeds = test::fuzz_inputs("fuzz/corpus/tiktoken");
  ASSERT_FALSE(seeds.empty());
  int good = 0;
  for (const auto& p : seeds)
    good += !p.filename().string().starts_with("bad_");
  EXPECT_EQ(test::replay_fuzz_inputs(seeds, fuzz::tiktoken_one), good);
  test::replay_fuzz_inputs(test::fuzz_inputs("tests/tokenizer/fuzz_regressions", "tiktoken-"),
                           fuzz::tiktoken_one);
}

}  // namespace
}  // namespace strata
