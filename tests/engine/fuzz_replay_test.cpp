// The resume fuzz target's seeds and findings, replayed (tests/fuzz_replay_util.h): every input
// is a resume manifest or run record that keeps its promises, or a strata::Error.
#include <gtest/gtest.h>

#include "fuzz/resume_target.h"
#include "tests/fuzz_replay_util.h"

namespace strata {
namespace {

TEST(FuzzReplay, Resume) {
  const auto seeds = test::fuzz_inputs("fuzz/corpus/resume");
  ASSERT_FALSE(seeds.empty());
  // Seeds named bad_* are refused by both parsers; the others parse as one of them.
  int good = 0;
  for (const auto& p : seeds)
    good += !p.filename().string().starts_with("bad_");
  EXPECT_EQ(test::replay_fuzz_inputs(seeds, fuzz::resume_one), good);
  test::replay_fuzz_inputs(test::fuzz_inputs("tests/engine/fuzz_regressions", "resume-"),
                           fuzz::resume_one);
}

}  // namespace
}  // namespace strata
