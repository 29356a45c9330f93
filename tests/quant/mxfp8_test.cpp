// MXFP8 against hand-worked bytes (format.md §7, quant/mxfp8.h).
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "quant/mxfp8.h"
#include "tests/quant/test_util.h"

namespace strata {
namespace {

using quant_test::bytes_of;
using quant_test::make_weight;

TEST(Mxfp8, BlockExponent) {
  // 448 * fl32(1/448) = 1 exactly (tests/quant/fp8_test.cpp): log2 = 0 -> byte 127.
  EXPECT_EQ(mxfp8_block_exponent(448.0f), 127);
  // 450 / 448 > 1 -> ceil(log2) = 1 -> 128. 896 -> exactly 2 -> 1 -> 128. 897 -> 129.
  EXPECT_EQ(mxfp8_block_exponent(450.0f), 128);
  EXPECT_EQ(mxfp8_block_exponent(896.0f), 128);
  EXPECT_EQ(mxfp8_block_exponent(897.0f), 129);
  // 224 -> 0.5 -> -1 -> 126; 225 -> log2 in (-1, 0) -> 0 -> 127.
  EXPECT_EQ(mxfp8_block_exponent(224.0f), 126);
  EXPECT_EQ(mxfp8_block_exponent(225.0f), 127);
  // Zero block -> -127 -> 0. A subnormal amax: 2^-133 / 448 ~ 2^-141.8 -> -141, clamped to -127.
  EXPECT_EQ(mxfp8_block_exponent(0.0f), 0);
  EXPECT_EQ(mxfp8_block_exponent(0x1p-133f), 0);
  // 448 * 2^-120 -> 2^-120 exactly (a power-of-two multiple of 448 stays exact) -> 7.
  EXPECT_EQ(mxfp8_block_exponent(448.0f * 0x1p-120f), 7);
  // The largest finite amax: 3.4e38 / 448 ~ 2^119.2 -> 120 -> 247.
  EXPECT_EQ(mxfp8_block_exponent(3.4028235e38f), 247);
}

TEST(Mxfp8, HandWorkedBlocks) {
  std::vector<float> v(128, 0.0f);
  // Row 0, block 0: amax 448 -> scale 2^0 (127); elements e4m3(W): 448 -> 0x7E, 1.0625 (tie) ->
  // 1.0 = 0x38, 1.1875 -> 1.25 = 0x3A, -3 -> 0xC4 (1.5 * 2^1: field 8, mantissa 4), 2^-10 (half
  // the smallest subnormal, tie) -> 0x00.
  v[0] = 448;
  v[1] = 1.0625f;
  v[2] = 1.1875f;
  v[3] = -3;
  v[4] = 0x1p-10f;
  // Row 0, block 1: all zero -> byte 0, elements 0.
  // Row 1, block 0: amax 450 -> scale 2^1 (128); W / 2: 450 -> 225 -> e4m3 step 16 -> 14.06 ->
  // 224 = 1.75 * 2^7 = 0x76; 3 -> 1.5 = 0x3C; -1 -> -0.5 = 0xB0.
  v[64] = 450;
  v[65] = 3;
  v[66] = -1;
  // Row 1, block 1: amax 2^-133 -> exponent clamped at -127 (byte 0); W * 2^127: 2^-133 ->
  // 2^-6 = smallest normal 0x08; -2^-133 -> 0x88.
  v[96] = 0x1p-133f;
  v[97] = -0x1p-133f;
  Tensor w = make_weight(DType::kBF16, {2, 64}, v);
  Mxfp8Weight q = mxfp8_quantize(w, "w");
  EXPECT_EQ(q.scale.shape(), (Shape{2, 2}));
  EXPECT_EQ(q.weight.shape(), (Shape{2, 64}));
  EXPECT_EQ(bytes_of(q.scale), (std::vector<uint8_t>{127, 0, 128, 0}));
  std::vector<uint8_t> expect(128, 0x00);
  expect[0] = 0x7E;
  expect[1] = 0x38;
  expect[2] = 0x3A;
  expect[3] = 0xC4;
  expect[64] = 0x76;
  expect[65] = 0x3C;
  expect[66] = 0xB0;
  expect[96] = 0x08;
  expect[97] = 0x88;
  EXPECT_EQ(bytes_of(q.weight), expect);

  Tensor d = mxfp8_dequantize(q);
  EXPECT_EQ(d.item_f32(0), 448.0f);
  EXPECT_EQ(d.item_f32(3), -3.0f);
  EXPECT_EQ(d.item_f32(64), 448.0f);  // 224 * 2
  EXPECT_EQ(d.item_f32(66), -1.0f);
  EXPECT_EQ(d.item_f32(96), 0x1p-133f);
}

TEST(Mxfp8, RefusesBadInput) {
  Tensor w = make_weight(DType::kBF16, {1, 48}, std::vector<float>(48, 1.0f));
  try {
    mxfp8_quantize(w, "model.layers.2.mlp.up_proj.weight");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.2.mlp.up_proj.weight"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("32"), std::string::npos);
  }
  std::vector<float> v(32, 1.0f);
  v[31] = std::nanf("");
  EXPECT_THROW(mxfp8_quantize(make_weight(DType::kF32, {1, 32}, v), "w"), Error);
}

}  // namespace
}  // namespace strata
