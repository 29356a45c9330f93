// The recipe fuzz target's seeds and findings, replayed (tests/fuzz_replay_util.h): every input
// gives a recipe that keeps its promises or a strata::Error.
#include <gtest/gtest.h>

#include "fuzz/recipe_target.h"
#include "tests/fuzz_replay_util.h"

namespace strata {
namespace {

TEST(FuzzReplay, Recipe) {
  const auto seeds = test::fuzz_inputs("fuzz/corpus/recipe");
  ASSERT_FALSE(seeds.empty());
  // Seeds named bad_* are refused; the others are recipes that parse.
  int good = 0;
  for (const auto& p : seeds)
    good += !p.filename().string().starts_with("bad_");
  EXPECT_EQ(test::replay_fuzz_inputs(seeds, fuzz::recipe_one), good);
  test::replay_fuzz_inputs(test::fuzz_inputs("tests/quant/fuzz_regressions", "recipe-"),
                           fuzz::recipe_one);
}

}  // namespace
}  // namespace strata
