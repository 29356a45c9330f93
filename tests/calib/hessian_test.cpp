// local_hessian's input statistics (calib/max_calib.h): a shared input observed under several
// names (observe_shared) accumulates its BlockHessian once and copies it to the names in step with
// it; every name must end with exactly the sums it would have accumulated observed on its own,
// whatever the pattern of joint and separate observations. And BlockHessian::accumulate's split
// over threads gives the bits of one sequential pass.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "calib/max_calib.h"
#include "quant/scale_search.h"

namespace strata {
namespace {

std::vector<float> rows_of(std::mt19937& rng, int64_t rows, int64_t cols) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (float& v : x)
    v = d(rng);
  return x;
}

bool same_sums(const BlockHessian* a, const BlockHessian* b) {
  return a && b && a->tokens() == b->tokens() && a->sums().size() == b->sums().size() &&
         std::memcmp(a->sums().data(), b->sums().data(), a->sums().size() * 8) == 0;
}

TEST(Hessian, SharedObservationsEqualSeparateOnes) {
  const int64_t cols = 64;
  const std::vector<std::string> names = {"q", "k", "v", "o"};
  MaxCalibrator joint, alone;
  joint.track_hessians({"q", "k", "v", "o"});
  alone.track_hessians({"q", "k", "v", "o"});
  std::mt19937 rng(3);
  // Each step: which names see the rows together (the rest see nothing).
  const std::vector<std::vector<std::string>> steps = {
      {"q", "k", "v"},      {"q", "k", "v"}, {"q", "k"},      {"v"},      {"k", "q", "v"}, {"o"},
      {"q", "k", "v", "o"}, {"k"},           {"q", "k", "v"}, {"v", "q"}, {"q", "k", "v"}};
  for (const auto& step : steps) {
    const int64_t rows = 1 + static_cast<int64_t>(rng() % 7);
    const std::vector<float> x = rows_of(rng, rows, cols);
    joint.observe_shared(step, x.data(), rows, cols);
    for (const std::string& n : step)
      alone.observe(n, x.data(), rows, cols);
    for (const std::string& n : names) {
      ASSERT_EQ(joint.hessian(n) == nullptr, alone.hessian(n) == nullptr) << n;
      if (alone.hessian(n)) {
        EXPECT_TRUE(same_sums(joint.hessian(n), alone.hessian(n))) << n;
      }
      const auto* a = joint.find(n);
      const auto* b = alone.find(n);
      ASSERT_EQ(a == nullptr, b == nullptr);
      if (a) {
        EXPECT_EQ(a->rows, b->rows);
        EXPECT_EQ(a->amax, b->amax);
      }
    }
  }
  // The sums differ between names that saw different rows (the copies are not all one).
  EXPECT_FALSE(same_sums(joint.hessian("q"), joint.hessian("v")));
}

// A shared input whose first name is not tracked, and an untracked name between tracked ones.
TEST(Hessian, UntrackedNamesAreSkipped) {
  const int64_t cols = 32;
  MaxCalibrator joint, alone;
  joint.track_hessians({"k", "v"});
  alone.track_hessians({"k", "v"});
  std::mt19937 rng(5);
  const std::vector<std::string> step = {"q", "k", "r", "v"};
  for (int i = 0; i < 3; ++i) {
    const std::vector<float> x = rows_of(rng, 4, cols);
    joint.observe_shared(step, x.data(), 4, cols);
    for (const std::string& n : step)
      alone.observe(n, x.data(), 4, cols);
  }
  EXPECT_EQ(joint.hessian("q"), nullptr);
  EXPECT_EQ(joint.hessian("r"), nullptr);
  EXPECT_TRUE(same_sums(joint.hessian("k"), alone.hessian("k")));
  EXPECT_TRUE(same_sums(joint.hessian("v"), alone.hessian("v")));
}

// Many rows (the second call's 600 x 64 blocks are split over threads: at least 8192 block-rows)
// against one sequential pass written here.
TEST(Hessian, ThreadedAccumulationIsSequential) {
  const int64_t cols = 1024, rows = 700;
  std::mt19937 rng(11);
  const std::vector<float> x = rows_of(rng, rows, cols);
  BlockHessian h(cols);
  h.accumulate(x.data(), 100);
  h.accumulate(x.data() + 100 * cols, rows - 100);
  std::vector<double> ref(static_cast<size_t>(cols * 16), 0.0);
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t n = 0; n < cols / 16; ++n) {
      for (int64_t i = 0; i < 16; ++i) {
        for (int64_t j = 0; j < 16; ++j) {
          ref[static_cast<size_t>((n * 16 + i) * 16 + j)] +=
              static_cast<double>(x[static_cast<size_t>(t * cols + n * 16 + i)]) *
              static_cast<double>(x[static_cast<size_t>(t * cols + n * 16 + j)]);
        }
      }
    }
  }
  EXPECT_EQ(h.tokens(), rows);
  ASSERT_EQ(h.sums().size(), ref.size());
  EXPECT_EQ(std::memcmp(h.sums().data(), ref.data(), ref.size() * 8), 0);
}

// Sums gathered elsewhere (the GPU forward's) recorded into a fresh accumulator equal its own
// accumulation of the same rows; an input no token reached records nothing (the plain search).
TEST(Hessian, RecordedSumsAreTheAccumulatedOnes) {
  const int64_t cols = 48, rows = 9;
  std::mt19937 rng(17);
  const std::vector<float> x = rows_of(rng, rows, cols);
  MaxCalibrator own, recorded;
  own.track_hessians({"gate", "up", "idle"});
  recorded.track_hessians({"gate", "up", "idle"});
  own.observe_shared(std::vector<std::string>{"gate", "up"}, x.data(), rows, cols);
  BlockHessian elsewhere(cols);
  elsewhere.accumulate(x.data(), rows);
  for (const char* n : {"gate", "up"})
    recorded.record_hessian(n, cols, elsewhere.sums(), rows);
  recorded.record_hessian("idle", cols, std::vector<double>(static_cast<size_t>(16 * cols)), 0);
  EXPECT_TRUE(same_sums(recorded.hessian("gate"), own.hessian("gate")));
  EXPECT_TRUE(same_sums(recorded.hessian("up"), own.hessian("up")));
  EXPECT_EQ(recorded.hessian("idle"), nullptr);
  EXPECT_EQ(recorded.hessian("gate")->normalized(), own.hessian("gate")->normalized());
}

}  // namespace
}  // namespace strata
