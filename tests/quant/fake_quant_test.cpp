// The activation fake quantizers (what a server computes on: strata compare's simulation) against
// hand-worked values: quant/nvfp4.h nvfp4_fake_quantize, quant/fp8.h fp8_fake_quantize,
// quant/mxfp8.h mxfp8_fake_quantize, and the ActQuant dispatch of quant/quantized.h.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/error.h"
#include "quant/quantized.h"

namespace strata {
namespace {

// Global scale 1/8: 6 s = 0.75. Block amax 3 -> 3 / 0.75 = 4, exact in e4m3 -> d = 4/8 = 0.5.
// Each value over d, to the nearest E2M1 magnitude (ties to even), times d:
//    3     -> 6    -> 3          -1     -> 2    -> -1
//    0.3   -> 0.6  -> 0.5: 0.25   0.1    -> 0.2  -> 0
//    0.125 -> 0.25 (tie 0|0.5)  -> 0      0.375 -> 0.75 (tie 0.5|1) -> 1: 0.5
//    1.25  -> 2.5 (tie 2|3) -> 2: 1       1.75  -> 3.5 (tie 3|4) -> 4: 2
//    2.6   -> 5.2 -> 6: 3                 -0.875 -> 1.75 (tie 1.5|2) -> 2: -1
//    0.625 -> 1.25 (tie 1|1.5) -> 1: 0.5  -2.25 -> 4.5 -> 4: -2
//    0, -0.05 -> 0, 1.0 -> 2: 1, 0.7 -> 1.4 -> 1.5: 0.75
TEST(FakeQuant, Nvfp4Block) {
  std::vector<float> x = {3.0f, -1.0f,   0.3f,   0.1f,   0.125f, 0.375f, 1.25f, 1.75f,
                          2.6f, -0.875f, 0.625f, -2.25f, 0.0f,   -0.05f, 1.0f,  0.7f};
  nvfp4_fake_quantize(x.data(), 1, 16, 0.125f, "x");
  const std::vector<float> want = {3.0f, -1.0f, 0.25f, 0.0f,  0.0f, 0.5f,  1.0f, 2.0f,
                                   3.0f, -1.0f, 0.5f,  -2.0f, 0.0f, -0.0f, 1.0f, 0.75f};
  EXPECT_EQ(x, want);
}

// The block scale is rounded to e4m3: amax 2.9 -> 2.9 / 0.75 = 3.8667, between 3.75 and 4 (step
// 0.25 in [2, 4)) -> 3.75 -> d = 0.46875. 2.9 / d = 6.19 -> 6: 2.8125; 1 / d = 2.13 -> 2: 0.9375;
// 0.2 / d = 0.4267 -> 0.5: 0.234375. Each block has its own scale: the second block (amax 0.75
// -> 1.0 -> d = 0.125) gives 0.75 -> 6: 0.75 and 0.1 -> 0.8 -> 1: 0.125.
TEST(FakeQuant, Nvfp4ScaleRoundingAndBlocks) {
  std::vector<float> x(32, 0.0f);
  x[0] = 2.9f;
  x[1] = 1.0f;
  x[2] = 0.2f;
  x[16] = 0.75f;
  x[17] = 0.1f;
  nvfp4_fake_quantize(x.data(), 2, 16, 0.125f, "x");
  EXPECT_EQ(x[0], 2.8125f);
  EXPECT_EQ(x[1], 0.9375f);
  EXPECT_EQ(x[2], 0.234375f);
  EXPECT_EQ(x[16], 0.75f);
  EXPECT_EQ(x[17], 0.125f);
  EXPECT_EQ(x[31], 0.0f);
}

// Saturation: amax 400 -> 400 / 0.75 = 533 -> 448 -> d = 56; 400 / 56 = 7.1 -> 6: 336.
// Underflow: s = 2^-20, amax 12 * 2^-20 -> block scale 2 (exact) -> d = 2^-19 < 1e-5 -> d = 1
// (ModelOpt's substitute), so the block's values (about 1e-5) all round to 0.
TEST(FakeQuant, Nvfp4SaturationAndUnderflow) {
  std::vector<float> x(16, 0.0f);
  x[0] = 400.0f;
  x[1] = -100.0f;  // 100 / 56 = 1.79 -> 2: -112
  nvfp4_fake_quantize(x.data(), 1, 16, 0.125f, "x");
  EXPECT_EQ(x[0], 336.0f);
  EXPECT_EQ(x[1], -112.0f);

  std::vector<float> y(16, 0.0f);
  y[0] = 12 * 0x1p-20f;
  y[1] = -5 * 0x1p-20f;
  nvfp4_fake_quantize(y.data(), 1, 16, 0x1p-20f, "y");
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_EQ(y[1], 0.0f);
}

TEST(FakeQuant, Nvfp4Refusals) {
  std::vector<float> x(24, 1.0f);
  EXPECT_THROW(nvfp4_fake_quantize(x.data(), 1, 24, 0.125f, "layer.k_cache"), Error);
  EXPECT_THROW(nvfp4_fake_quantize(x.data(), 1, 16, 0.0f, "q_proj"), Error);
  EXPECT_THROW(nvfp4_fake_quantize(x.data(), 1, 16, NAN, "q_proj"), Error);
}

// Scale 0.5: 1 -> 2: 1;  0.53125 -> 1.0625 (tie 1|1.125) -> 1: 0.5;  -300 -> -600, clamped to
// -448: -224;  1000 -> 448: 224;  2^-10 -> 2^-9 (the smallest subnormal): 2^-10;  2^-11 -> 2^-10
// (tie 0|2^-9) -> 0;  3 * 2^-11 -> 1.5 * 2^-9 (tie 1|2 quanta) -> 2 quanta: 2^-9;  0.3 -> 0.6
// (step 2^-4 in [0.5, 1): 9.6 -> 10) -> 0.625: 0.3125.
TEST(FakeQuant, Fp8PerTensor) {
  std::vector<float> x = {1.0f, 0.53125f, -300.0f, 1000.0f, 0x1p-10f, 0x1p-11f, 3 * 0x1p-11f, 0.3f};
  fp8_fake_quantize(x.data(), static_cast<int64_t>(x.size()), 0.5f, "x");
  const std::vector<float> want = {1.0f, 0.5f, -224.0f, 224.0f, 0x1p-10f, 0.0f, 0x1p-9f, 0.3125f};
  EXPECT_EQ(x, want);
  std::vector<float> bad = {1.0f};
  EXPECT_THROW(fp8_fake_quantize(bad.data(), 1, 0.0f, "k_scale"), Error);
}

// Block amax 500: d = 500 / 448 = 1.116 -> exponent 1. 500 / 2 = 250 (step 16 in [128, 256)) ->
// 256: 512; 3 -> 1.5: 3; 0.1 -> 0.05 (step 2^-8 in [2^-5, 2^-4): 12.8 -> 13) -> 0.05078125:
// 0.1015625. Block amax 448: d = 448 * fl32(1/448) = 1 -> exponent 0: 1.0625 (tie 1|1.125) -> 1.
TEST(FakeQuant, Mxfp8Blocks) {
  std::vector<float> x(64, 0.0f);
  x[0] = 500.0f;
  x[1] = 3.0f;
  x[2] = 0.1f;
  x[32] = 448.0f;
  x[33] = -1.0625f;
  mxfp8_fake_quantize(x.data(), 1, 64, "x");
  EXPECT_EQ(x[0], 512.0f);
  EXPECT_EQ(x[1], 3.0f);
  EXPECT_EQ(x[2], 0.1015625f);
  EXPECT_EQ(x[32], 448.0f);
  EXPECT_EQ(x[33], -1.0f);
  std::vector<float> odd(48, 1.0f);
  EXPECT_THROW(mxfp8_fake_quantize(odd.data(), 1, 48, "x"), Error);
}

TEST(FakeQuant, ActQuantDispatch) {
  std::vector<float> a = {0.53125f, 1.0f}, b = a;
  fake_quantize(ActQuant{}, a.data(), 1, 2, "none");
  EXPECT_EQ(a, b);  // kNone leaves the values
  fake_quantize(ActQuant{ActQuant::Kind::kFp8, 0.5f}, a.data(), 1, 2, "fp8");
  EXPECT_EQ(a, (std::vector<float>{0.5f, 1.0f}));
  EXPECT_FALSE(ActQuant{}.on());
  EXPECT_TRUE((ActQuant{ActQuant::Kind::kNvfp4, 1.0f}.on()));
}

}  // namespace
}  // namespace strata
