// NVFP4 against hand-worked bytes (format.md §1). Values are chosen so that every intermediate
// can be checked with pencil and paper; the derivations are in the comments.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/error.h"
#include "quant/nvfp4.h"
#include "tests/quant/test_util.h"

namespace strata {
namespace {

using quant_test::bits;
using quant_test::bytes_of;
using quant_test::make_weight;

// fl32(1/2688) = 0x1.861862p-12 = 0x1861862 * 2^-36 = 25565282 * 2^-36.
// 2688 * 25565282 = 68719478016 = 2^36 + 1280, so 2688 * fl32(1/2688) = 1 + 5 * 2^-28, which
// rounds to exactly 1.0 (less than half an ulp of 1, 2^-24). Hence weight amax 2688 gives
// weight_scale_2 = 1, 6 * weight_scale_2 = 6, and a block with amax 6 has block scale 1.0 (0x38):
// x = W exactly and the E2M1 rounding is visible directly.
constexpr float kUnitAmax = 2688.0f;

TEST(Nvfp4, GlobalScaleOfUnitAmaxIsOne) {
  EXPECT_EQ(nvfp4_global_scale(kUnitAmax), 1.0f);
}

TEST(Nvfp4, TiesAndSigns) {
  // codes: 6->7, 0.25->0 (tie, down to even 0), 0.75->2 (tie, up to 1.0), 1.25->2 (tie, down to
  // 1.0), 1.75->4 (tie, up to 2.0), 2.5->4 (tie, down to 2.0), 3.5->6 (tie, up to 4.0), 5->6
  // (tie, down to 4.0); the negatives get bit 3; -0.1 (bf16 -0.10009765625) rounds to zero and
  // keeps the sign: 0x8.
  Tensor w = make_weight(DType::kBF16, {1, 16},
                         {6, 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5, -0.25f, -0.75f, -1.25f,
                          -1.75f, -2.5f, -3.5f, -5, -0.1f});
  Nvfp4Weight q = nvfp4_quantize(w, kUnitAmax, "ties");
  // byte j = code[2j] | code[2j+1] << 4
  EXPECT_EQ(bytes_of(q.packed),
            (std::vector<uint8_t>{0x07, 0x22, 0x44, 0x66, 0xA8, 0xCA, 0xEC, 0x8E}));
  EXPECT_EQ(bytes_of(q.block_scale), std::vector<uint8_t>{0x38});
  EXPECT_EQ(q.global_scale.item_f32(), 1.0f);
  EXPECT_EQ(q.packed.shape(), (Shape{1, 8}));
  EXPECT_EQ(q.block_scale.shape(), (Shape{1, 1}));
  EXPECT_EQ(q.block_scale.dtype(), DType::kF8E4M3);
  EXPECT_EQ(q.global_scale.ndim(), 0);
}

TEST(Nvfp4, ZeroBlockSaturationAndMinimumScale) {
  std::vector<float> v(48, 0.0f);
  // Block 0: all zero -> s_b = 0 -> 1.0 -> scale byte 0x38, codes 0.
  // Block 1: amax 6 -> scale 1.0; 6 -> 7, 5.5 (> 5) -> 7, -5.5 -> 0xF, 4.5 (< 5) -> 4.0 = 6.
  v[16] = 6;
  v[17] = 5.5f;
  v[18] = -5.5f;
  v[19] = 4.5f;
  // Block 2: amax 6 * 2^-12 -> s_b = 2^-12, clamped up to 2^-9 (byte 0x01). Then x = W * 2^9:
  // 6*2^-12 -> 0.75 -> 1.0 (code 2); -3*2^-12 -> -0.375 -> -0.5 (0x9); 1.5*2^-12 -> 0.1875 -> 0;
  // -2^-13 -> -0.0625 -> negative zero (0x8).
  v[32] = 6 * 0x1p-12f;
  v[33] = -3 * 0x1p-12f;
  v[34] = 1.5f * 0x1p-12f;
  v[35] = -0x1p-13f;
  Tensor w = make_weight(DType::kBF16, {1, 48}, v);
  Nvfp4Weight q = nvfp4_quantize(w, kUnitAmax, "edges");
  EXPECT_EQ(bytes_of(q.block_scale), (std::vector<uint8_t>{0x38, 0x38, 0x01}));
  std::vector<uint8_t> expect(24, 0x00);
  expect[8] = 0x77;   // codes 7, 7
  expect[9] = 0x6F;   // codes 0xF, 6
  expect[16] = 0x92;  // codes 2, 9
  expect[17] = 0x80;  // codes 0, 8
  EXPECT_EQ(bytes_of(q.packed), expect);
}

TEST(Nvfp4, ReciprocalRuleForWeightScale2) {
  // A = 1.03125 = 33/32. fl32(1/2688) = 25565282 * 2^-36, so A * fl32(1/2688) =
  // 33 * 25565282 * 2^-41 = 843654306 * 2^-41. 843654306 has 30 bits; keeping 24 means dividing
  // by 2^6: 13182098.53..., which rounds up to 13182099 = 0xC92493 -> 0xC92493 * 2^-35, fp32
  // bits 0x39C92493 (exponent 2^-12: field 115 = 0x73, mantissa 0x492493).
  // The true quotient 33/32/2688 * 2^35 = 13182098.29 rounds to 13182098: bits 0x39C92492.
  EXPECT_EQ(bits(nvfp4_global_scale(1.03125f)), 0x39C92493u);
  EXPECT_NE(bits(nvfp4_global_scale(1.03125f)), bits(1.03125f / 2688.0f));
  Tensor w = make_weight(DType::kBF16, {1, 16}, std::vector<float>(16, 1.03125f));
  EXPECT_EQ(bits(nvfp4_quantize(w, 1.03125f, "w").global_scale.item_f32()), 0x39C92493u);
}

TEST(Nvfp4, BlockScaleAbove448IsClamped) {
  // A = 1.109375: weight_scale_2 = 0x39D86186, 6 * weight_scale_2 = 0x3B224924
  // (= 0x1.449248p-9), and a block whose amax is A gives s_b = A / that = 448.0000305 (one fp32
  // ulp above 448): clamped to 448 (0x7E); x = A / (448 * weight_scale_2) = 6.0000 -> code 7.
  const float a = 1.109375f;
  EXPECT_EQ(bits(nvfp4_global_scale(a)), 0x39D86186u);
  EXPECT_EQ(bits(6.0f * nvfp4_global_scale(a)), 0x3B224924u);
  EXPECT_GT(a / (6.0f * nvfp4_global_scale(a)), 448.0f);
  std::vector<float> v(16, 0.0f);
  v[0] = a;
  v[1] = -a;
  Nvfp4Weight q = nvfp4_quantize(make_weight(DType::kBF16, {1, 16}, v), a, "w");
  EXPECT_EQ(bytes_of(q.block_scale), std::vector<uint8_t>{0x7E});
  EXPECT_EQ(bytes_of(q.packed)[0], 0xF7);
}

TEST(Nvfp4, SameBytesFromF32AndF16Inputs) {
  // The ties row holds values exact in every input dtype, so the bytes must not depend on it.
  const std::vector<float> v{6,      0.25f,  0.75f,  1.25f,  1.75f, 2.5f,  3.5f, 5,
                             -0.25f, -0.75f, -1.25f, -1.75f, -2.5f, -3.5f, -5,   -0.125f};
  const auto ref =
      bytes_of(nvfp4_quantize(make_weight(DType::kBF16, {1, 16}, v), kUnitAmax, "b").packed);
  EXPECT_EQ(bytes_of(nvfp4_quantize(make_weight(DType::kF32, {1, 16}, v), kUnitAmax, "f").packed),
            ref);
  EXPECT_EQ(bytes_of(nvfp4_quantize(make_weight(DType::kF16, {1, 16}, v), kUnitAmax, "h").packed),
            ref);
}

TEST(Nvfp4, InputScale) {
  // 2688 * fl32(1/2688) = 1 (see kUnitAmax); 1.03125 as above.
  EXPECT_EQ(nvfp4_input_scale(2688.0f, "x"), 1.0f);
  EXPECT_EQ(bits(nvfp4_input_scale(1.03125f, "x")), 0x39C92493u);
  EXPECT_THROW(nvfp4_input_scale(0.0f, "x"), Error);
  EXPECT_THROW(nvfp4_input_scale(-1.0f, "x"), Error);
  EXPECT_THROW(nvfp4_input_scale(std::numeric_limits<float>::infinity(), "x"), Error);
  EXPECT_THROW(nvfp4_input_scale(std::nanf(""), "x"), Error);
}

TEST(Nvfp4, RefusesBadInput) {
  Tensor w = make_weight(DType::kBF16, {2, 24}, std::vector<float>(48, 1.0f));
  try {
    nvfp4_quantize(w, 1.0f, "model.layers.0.mlp.down_proj.weight");
    FAIL() << "width 24 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.0.mlp.down_proj.weight"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("16"), std::string::npos);
  }
  Tensor ok = make_weight(DType::kBF16, {1, 16}, std::vector<float>(16, 1.0f));
  EXPECT_THROW(nvfp4_quantize(ok, 0.0f, "w"), Error);  // all-zero weight's amax
  EXPECT_THROW(nvfp4_quantize(ok, 0.5f, "w"), Error);  // amax below max|W|
  EXPECT_THROW(nvfp4_quantize(ok, std::nanf(""), "w"), Error);
  std::vector<float> v(16, 1.0f);
  v[5] = std::numeric_limits<float>::infinity();
  EXPECT_THROW(nvfp4_quantize(make_weight(DType::kF32, {1, 16}, v), 1.0f, "w"), Error);
  v[5] = std::nanf("");
  EXPECT_THROW(nvfp4_quantize(make_weight(DType::kBF16, {1, 16}, v), 1.0f, "w"), Error);
  EXPECT_THROW(nvfp4_quantize(Tensor::zeros(DType::kF8E4M3, {1, 16}), 1.0f, "w"), Error);
}

TEST(Nvfp4, DequantizeHandWorked) {
  // Ties row: block scale 1, weight_scale_2 1, so values are the E2M1 values of the codes.
  Tensor w = make_weight(DType::kBF16, {1, 16},
                         {6, 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5, -0.25f, -0.75f, -1.25f,
                          -1.75f, -2.5f, -3.5f, -5, -0.1f});
  Tensor d = nvfp4_dequantize(nvfp4_quantize(w, kUnitAmax, "w"));
  const std::vector<float> expect{6, 0, 1, 1, 2, 2, 4, 4, -0.0f, -1, -1, -2, -2, -4, -4, -0.0f};
  ASSERT_EQ(d.shape(), (Shape{1, 16}));
  for (int i = 0; i < 16; ++i)
    EXPECT_EQ(d.item_f32(i), expect[i]) << i;
  EXPECT_TRUE(std::signbit(d.item_f32(15)));
}

TEST(Nvfp4, ThreeDimensionalWeight) {
  // [2 experts, 1, 16]: each expert row quantizes independently, shapes keep the leading dims.
  std::vector<float> v(32, 0.0f);
  v[0] = 6;
  v[16] = 3;  // block amax 3 -> s_b = 0.5 (0x30); x = 3 / 0.5 = 6 -> code 7
  Nvfp4Weight q = nvfp4_quantize(make_weight(DType::kBF16, {2, 1, 16}, v), kUnitAmax, "experts");
  EXPECT_EQ(q.packed.shape(), (Shape{2, 1, 8}));
  EXPECT_EQ(q.block_scale.shape(), (Shape{2, 1, 1}));
  EXPECT_EQ(bytes_of(q.block_scale), (std::vector<uint8_t>{0x38, 0x30}));
  EXPECT_EQ(q.packed.data<uint8_t>()[0], 0x07);
  EXPECT_EQ(q.packed.data<uint8_t>()[8], 0x07);
}

}  // namespace
}  // namespace strata
