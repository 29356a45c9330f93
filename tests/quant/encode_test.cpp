// The fast encoders of quant/encode.h against the reference conversions of core/dtype.h.
// Every fp32 bit pattern is covered by a disabled test (run it with
// --gtest_also_run_disabled_tests, about a minute per encoder); the default run covers every
// combination of sign, exponent and top 11 mantissa bits with the low 12 bits set to values at
// and around each rounding boundary (e4m3 rounds at mantissa bit 20, bf16 at 16, e2m1 at 22 and
// below: all midpoints have low 12 bits 0), plus a million random patterns.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>

#include "core/dtype.h"
#include "quant/encode.h"

namespace strata {
namespace {

using quant_detail::fast_f32_to_e2m1;
using quant_detail::fast_f32_to_e4m3;
using quant_detail::fast_round_bf16;

// Low 12 mantissa bits at and around every rounding boundary.
constexpr uint32_t kLow[] = {0x000, 0x001, 0x7FF, 0x800, 0x801, 0xFFF};

// Returns the number of mismatches over the patterns produced by `each`.
template <typename Each>
int64_t count_mismatches(Each each) {
  int64_t bad = 0;
  each([&](uint32_t u) {
    const float x = std::bit_cast<float>(u);
    if (fast_f32_to_e4m3(x) != f32_to_e4m3(x)) {
      if (bad++ < 5) ADD_FAILURE() << "e4m3 " << std::hex << u;
    }
    if (fast_f32_to_e2m1(x) != f32_to_e2m1(x)) {
      if (bad++ < 5) ADD_FAILURE() << "e2m1 " << std::hex << u;
    }
    if (!std::isnan(x)) {
      const float a = fast_round_bf16(x), b = bf16_to_f32(f32_to_bf16(x));
      if (std::bit_cast<uint32_t>(a) != std::bit_cast<uint32_t>(b)) {
        if (bad++ < 5) ADD_FAILURE() << "bf16 " << std::hex << u;
      }
    }
  });
  return bad;
}

TEST(FastEncoders, HandPicked) {
  EXPECT_EQ(fast_f32_to_e4m3(464.0f), 0x7E);
  EXPECT_EQ(fast_f32_to_e4m3(-464.0f), 0xFE);
  EXPECT_EQ(fast_f32_to_e4m3(464.00003f), 0x7F);
  EXPECT_EQ(fast_f32_to_e4m3(0x1p-10f), 0x00);
  EXPECT_EQ(fast_f32_to_e4m3(0x1.8p-10f), 0x01);
  EXPECT_EQ(fast_f32_to_e4m3(0x1.fp-7f), 0x08);  // rounds up into the smallest normal
  EXPECT_EQ(fast_f32_to_e4m3(-0.0f), 0x80);
  EXPECT_EQ(fast_f32_to_e2m1(-0.0f), 0x0);
  EXPECT_EQ(fast_f32_to_e2m1(-0.1f), 0x8);
  EXPECT_EQ(fast_f32_to_e2m1(std::nanf("")), 0x7);
  EXPECT_EQ(fast_f32_to_e2m1(-INFINITY), 0xF);
}

TEST(FastEncoders, MatchReferenceAtEveryRoundingBoundary) {
  const int64_t bad = count_mismatches([](auto check) {
    for (uint32_t high = 0; high < (1u << 20); ++high) {
      for (uint32_t low : kLow)
        check((high << 12) | low);
    }
  });
  EXPECT_EQ(bad, 0);
}

TEST(FastEncoders, MatchReferenceOnRandomPatterns) {
  std::mt19937 rng(12345);
  const int64_t bad = count_mismatches([&](auto check) {
    for (int i = 0; i < 1000000; ++i)
      check(static_cast<uint32_t>(rng()));
  });
  EXPECT_EQ(bad, 0);
}

TEST(FastEncoders, DISABLED_MatchReferenceOnAllFp32Patterns) {
  const int64_t bad = count_mismatches([](auto check) {
    uint32_t u = 0;
    do {
      check(u);
    } while (++u != 0);
  });
  EXPECT_EQ(bad, 0);
}

}  // namespace
}  // namespace strata
