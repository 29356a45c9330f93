// FP8 per-tensor and KV-cache scales against hand-worked values (format.md §2, §3, and the
// ModelOpt/PyTorch rules documented in quant/fp8.h).
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "quant/fp8.h"
#include "tests/quant/test_util.h"

namespace strata {
namespace {

using quant_test::bits;
using quant_test::bytes_of;
using quant_test::make_weight;

// fl32(1/448) = 0x1.24924ap-9 = 0x124924A * 2^-33 = 19173962 * 2^-33.
// 448 * 19173962 = 8589934976 = 2^33 + 384, so 448 * fl32(1/448) = 1 + 3 * 2^-26: rounds to 1.0.
TEST(Fp8, ScaleOf448IsOne) {
  EXPECT_EQ(fp8_weight_scale(448.0f), 1.0f);
  EXPECT_EQ(fp8_input_scale(448.0f), 1.0f);
}

TEST(Fp8, ReciprocalRuleForWeightScale) {
  // A = 1.015625 = 65/64: 65 * 19173962 * 2^-39 = 1246307530 * 2^-39; 31 bits, keep 24: divide by
  // 2^7 -> 9736777.58, rounds up to 9736778 = 0x94924A -> 0x94924A * 2^-32: fp32 bits
  // 0x3B14924A (exponent 2^-9: field 118 = 0x76, mantissa 0x14924A). True division gives
  // 65/64/448 * 2^32 = 9736777.14 -> 0x3B149249.
  EXPECT_EQ(bits(fp8_weight_scale(1.015625f)), 0x3B14924Au);
  EXPECT_EQ(bits(1.015625f / 448.0f), 0x3B149249u);
}

TEST(Fp8, Bf16DivisorAndDoubleRounding) {
  // A = 1.015625, scale 0x3B14924A. The CUDA division loads the scale as bf16: 0x3B14|924A rounds
  // up to 0x3B15 = 1.1640625 * 2^-9 = 298 * 2^-17.
  //  W = A = 65 * 2^-6:  65 * 2^11 / 298 = 446.71 -> bf16 (step 2) 446 -> e4m3 (step 32) 448: 0x7E.
  //  W = 11 * 2^-10:     11 * 2^7 / 298 = 4.7248 -> bf16 (step 1/32) 4.71875 -> e4m3 (step 0.5)
  //                      9.4375 halves -> 9 -> 4.5 = 1.125 * 2^2: 0x49. (With the fp32 scale the
  //                      quotient 4.7385 -> bf16 4.75, a tie, -> even 5.0 = 0x4A: the divisor's
  //                      rounding is visible.)
  //  W = 49 * 2^-16:     98 / 298 = 0.328859 -> bf16 (step 2^-9) 168.38 -> 168 -> 0.328125, which
  //                      is the e4m3 midpoint 10.5 * 2^-5 -> even 10 -> 0.3125 = 1.25 * 2^-2:
  //                      0x2A. (Without the bf16 rounding of the quotient: 10.52 -> 11 = 0x2B.)
  //  W = -11 * 2^-10:    0xC9.
  Tensor w =
      make_weight(DType::kBF16, {1, 4}, {1.015625f, 11 * 0x1p-10f, 49 * 0x1p-16f, -11 * 0x1p-10f});
  Fp8Weight q = fp8_quantize(w, 1.015625f, "w");
  EXPECT_EQ(bytes_of(q.weight), (std::vector<uint8_t>{0x7E, 0x49, 0x2A, 0xC9}));
  EXPECT_EQ(bits(q.scale.item_f32()), 0x3B14924Au);
  EXPECT_EQ(q.scale.ndim(), 0);
  EXPECT_EQ(q.weight.dtype(), DType::kF8E4M3);
  EXPECT_EQ(q.weight.shape(), (Shape{1, 4}));
}

TEST(Fp8, UnitScaleShowsTheE4M3Rounding) {
  // A = 448 -> scale 1 (exact in bf16 too): weight = e4m3(W).
  // 1.0625 is the midpoint of 1 and 1.125 -> even 1.0 (0x38); 1.1875 -> 1.25 (0x3A); 448 -> 0x7E;
  // 2^-10 is half the smallest subnormal -> even 0 (0x00); -2^-10 -> 0x80; 3 * 2^-10 -> 2^-9 *
  // 1.5 -> even 2 quanta (0x02); 0 -> 0x00.
  Tensor w = make_weight(DType::kBF16, {1, 8},
                         {1.0625f, 1.1875f, 448, -448, 0x1p-10f, -0x1p-10f, 3 * 0x1p-10f, 0});
  EXPECT_EQ(bytes_of(fp8_quantize(w, 448.0f, "w").weight),
            (std::vector<uint8_t>{0x38, 0x3A, 0x7E, 0xFE, 0x00, 0x80, 0x02, 0x00}));
}

TEST(Fp8, F32WeightsHaveNoIntermediateRounding) {
  // f32 weight, A = 448, scale 1: e4m3(W) straight from fp32. 1.0625 + 2^-20 is just above the
  // midpoint -> 1.125 (0x39); in bf16 it would have been rounded to the midpoint first (-> 0x38).
  Tensor w = make_weight(DType::kF32, {1, 2}, {1.0625f + 0x1p-20f, 448.0f});
  EXPECT_EQ(bytes_of(fp8_quantize(w, 448.0f, "w").weight), (std::vector<uint8_t>{0x39, 0x7E}));
}

TEST(Fp8, InputScaleSubstitutions) {
  // 3 * fl32(1/448) = 57521886 * 2^-33: 26 bits, divide by 4 -> 14380471.5, a tie -> even
  // 14380472 = 0xDB6DB8 -> 0xDB6DB8 * 2^-31, bits 0x3BDB6DB8 (2^-8: field 119 = 0x77).
  EXPECT_EQ(bits(fp8_input_scale(3.0f)), 0x3BDB6DB8u);
  EXPECT_EQ(fp8_input_scale(0.0f), 1.0f);           // 0 -> 448 -> 1
  EXPECT_EQ(fp8_input_scale(std::nanf("")), 1.0f);  // NaN -> 448 -> 1
  EXPECT_EQ(fp8_input_scale(std::numeric_limits<float>::infinity()), FLT_MAX * (1.0f / 448.0f));
  EXPECT_EQ(fp8_input_scale(1e-40f), FLT_MIN * (1.0f / 448.0f));
}

TEST(Fp8, KvCacheScale) {
  EXPECT_EQ(fp8_kv_cache_scale(448.0f, "k"), 1.0f);
  EXPECT_EQ(bits(fp8_kv_cache_scale(1.015625f, "k")), 0x3B14924Au);
  EXPECT_THROW(fp8_kv_cache_scale(0.0f, "model.layers.3.self_attn.k_proj.k_scale"), Error);
  EXPECT_THROW(fp8_kv_cache_scale(std::nanf(""), "k"), Error);
  EXPECT_THROW(fp8_kv_cache_scale(std::numeric_limits<float>::infinity(), "k"), Error);
}

TEST(Fp8, RefusesBadInput) {
  Tensor ok = make_weight(DType::kBF16, {1, 4}, {1, 2, 3, 4});
  EXPECT_THROW(fp8_quantize(ok, 0.0f, "w"), Error);
  EXPECT_THROW(fp8_quantize(ok, 3.0f, "w"), Error);  // below max|W|
  Tensor bad = make_weight(DType::kF32, {1, 2}, {1, std::nanf("")});
  try {
    fp8_quantize(bad, 1.0f, "lm.q_proj.weight");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("lm.q_proj.weight"), std::string::npos);
  }
  EXPECT_THROW(fp8_quantize(Tensor::zeros(DType::kI32, {1, 4}), 1.0f, "w"), Error);
}

TEST(Fp8, Dequantize) {
  Tensor w =
      make_weight(DType::kBF16, {1, 4}, {1.015625f, 11 * 0x1p-10f, 49 * 0x1p-16f, -11 * 0x1p-10f});
  Fp8Weight q = fp8_quantize(w, 1.015625f, "w");
  Tensor d = fp8_dequantize(q);
  const float s = q.scale.item_f32();
  // bytes 0x7E, 0x49, 0x2A, 0xC9 are 448, 4.5, 0.3125, -4.5.
  EXPECT_EQ(d.item_f32(0), 448.0f * s);
  EXPECT_EQ(d.item_f32(1), 4.5f * s);
  EXPECT_EQ(d.item_f32(2), 0.3125f * s);
  EXPECT_EQ(d.item_f32(3), -4.5f * s);
}

// ---- FP8 per 128x128 block (fp8_pb_wo) ------------------------------------------------------
// k = fl32(1/448) = 0x3B124925 (0x1.24924ap-9). scale = fl32(a * k).

TEST(Fp8Pb, OneBlockHasA0dScaleAndFp32Quotients) {
  // A = 1.015625: scale 0x3B14924A = 9736778 * 2^-32 (ReciprocalRuleForWeightScale); unlike per
  // tensor, the quotient is not rounded to bf16 (and neither is the divisor):
  //  W = A:           65 * 2^26 / 9736778 = 447.99996 -> e4m3 448: 0x7E.
  //  W = 11 * 2^-10:  11 * 2^22 / 9736778 = 4.73846 -> e4m3 step 0.5: 4.5 (4.5 is 0.238 away,
  //                   5.0 0.262): 0x49 (= per tensor's byte here, by another route).
  //  W = 49 * 2^-16:  49 * 2^16 / 9736778 = 0.329808 -> step 2^-5: 10.554 -> 11 -> 0.34375 =
  //                   1.375 * 2^-2: 0x2B (per tensor gives 0x2A through its bf16 quotient).
  //  W = -11 * 2^-10: 0xC9.
  Tensor w =
      make_weight(DType::kBF16, {1, 4}, {1.015625f, 11 * 0x1p-10f, 49 * 0x1p-16f, -11 * 0x1p-10f});
  Fp8Weight q = fp8_pb_quantize(w, "w");
  EXPECT_EQ(bytes_of(q.weight), (std::vector<uint8_t>{0x7E, 0x49, 0x2B, 0xC9}));
  EXPECT_EQ(q.scale.ndim(), 0);
  EXPECT_EQ(bits(q.scale.item_f32()), 0x3B14924Au);
  EXPECT_EQ(q.weight.dtype(), DType::kF8E4M3);
}

TEST(Fp8Pb, PartialBlocksZeroBlockAndScaleLayout) {
  // W [130, 129]: blocks rows {0..127, 128..129} x cols {0..127, 128}, 2 x 2.
  //  (0,0): W[0,0] = 448, W[1,1] = 1.0625: a = 448, scale 448 * k = 1.0 (ScaleOf448IsOne):
  //         bytes 0x7E and 1.0625 -> even 1.0: 0x38.
  //  (0,1): W[0,128] = 2: scale 2k (exact); 2 / 2k = 1/k = 447.99998 -> 448: 0x7E.
  //  (1,0): all zero: a = 0 is replaced by 448 -> scale 1.0; bytes 0.
  //  (1,1): W[129,128] = -0.5: scale k/2; -0.5 / (k/2) -> -448: 0xFE.
  // Scale F32 [2, 1, 2, 1], row-major: {1, 2k, 1, k/2}.
  std::vector<float> v(130 * 129, 0.0f);
  v[0] = 448.0f;
  v[1 * 129 + 1] = 1.0625f;
  v[128] = 2.0f;
  v[129 * 129 + 128] = -0.5f;
  Fp8Weight q = fp8_pb_quantize(make_weight(DType::kBF16, {130, 129}, v), "w");
  ASSERT_EQ(q.scale.shape(), (Shape{2, 1, 2, 1}));
  ASSERT_EQ(q.weight.shape(), (Shape{130, 129}));
  const float k = 1.0f / 448.0f;
  EXPECT_EQ(bits(k), 0x3B124925u);
  const float* s = q.scale.data<float>();
  EXPECT_EQ(s[0], 1.0f);
  EXPECT_EQ(s[1], 2 * k);
  EXPECT_EQ(s[2], 1.0f);
  EXPECT_EQ(s[3], k / 2);
  const std::vector<uint8_t> b = bytes_of(q.weight);
  int nonzero = 0;
  for (uint8_t x : b)
    nonzero += x != 0;
  EXPECT_EQ(nonzero, 4);
  EXPECT_EQ(b[0], 0x7E);
  EXPECT_EQ(b[1 * 129 + 1], 0x38);
  EXPECT_EQ(b[128], 0x7E);
  EXPECT_EQ(b[129 * 129 + 128], 0xFE);
  // Dequantization: e4m3 value times its block's scale.
  const Tensor d = fp8_pb_dequantize(q);
  const float* x = d.data<float>();
  EXPECT_EQ(x[0], 448.0f);
  EXPECT_EQ(x[1 * 129 + 1], 1.0f);
  EXPECT_EQ(x[128], 448.0f * 2 * k);
  EXPECT_EQ(x[129 * 129 + 128], -448.0f * (k / 2));
}

TEST(Fp8Pb, RefusesNon2dAndNonFinite) {
  EXPECT_THROW(
      fp8_pb_quantize(make_weight(DType::kBF16, {2, 2, 2}, std::vector<float>(8, 1.0f)), "w"),
      Error);
  EXPECT_THROW(fp8_pb_quantize(make_weight(DType::kF32, {1, 2}, {1.0f, NAN}), "w"), Error);
}

}  // namespace
}  // namespace strata
