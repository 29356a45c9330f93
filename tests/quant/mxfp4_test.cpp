// The closed-form MXFP4 -> NVFP4 conversion (quant/mxfp4.h): the NVFP4 weight must dequantize
// (format.md §1: e2m1 * f32(weight_scale) * weight_scale_2) to the MXFP4 values
// (e2m1 * 2^(e-127)) exactly, and the conversion must refuse spans E4M3 cannot hold.
#include "quant/mxfp4.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/error.h"
#include "tests/quant/test_util.h"

namespace strata {
namespace {

double e2m1_ref(uint8_t code) {
  static const double mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  return (code & 8) ? -mag[code & 7] : mag[code & 7];
}

struct Mx {
  Tensor blocks, scales;
};

Mx random_mx(int64_t out, int64_t groups, int lo, int hi, uint32_t seed) {
  std::mt19937 rng(seed);
  Mx m{Tensor::zeros(DType::kU8, {out, groups, 16}), Tensor::zeros(DType::kU8, {out, groups})};
  for (int64_t i = 0; i < m.blocks.numel(); ++i)
    m.blocks.mutable_data<uint8_t>()[i] = static_cast<uint8_t>(rng());
  for (int64_t i = 0; i < m.scales.numel(); ++i)
    m.scales.mutable_data<uint8_t>()[i] = static_cast<uint8_t>(lo + rng() % (hi - lo + 1));
  return m;
}

TEST(Mxfp4, ExactConversionDequantizesToTheSource) {
  const int64_t out = 4, groups = 3;
  Mx m = random_mx(out, groups, 110, 127, 1);  // a span of 17 binades: the most E4M3 holds
  // One half-block of zero codes (incl. -0) gets scale 1.0.
  for (int j = 0; j < 8; ++j)
    m.blocks.mutable_data<uint8_t>()[16 + j] = (j % 2) ? 0x08 : 0x80;
  const int emax = mxfp4_max_scale(m.blocks, m.scales);
  EXPECT_EQ(emax, 127);
  const std::optional<Nvfp4Weight> q = mxfp4_to_nvfp4_exact(m.blocks, m.scales, emax + 2);
  ASSERT_FALSE(q.has_value()) << "a group max 2 above this weight's spans 19 binades";
  const std::optional<Nvfp4Weight> e = mxfp4_to_nvfp4_exact(m.blocks, m.scales, emax);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->global_scale.item_f32(), std::ldexp(1.0f, emax - 135));
  EXPECT_EQ(e->block_scale.data<uint8_t>()[2], 0x38);  // the zero half-block of group 1, row 0
  const Tensor deq = nvfp4_dequantize(*e);
  ASSERT_EQ(deq.shape(), Shape({out, groups * 32}));
  for (int64_t r = 0; r < out; ++r) {
    for (int64_t c = 0; c < groups * 32; ++c) {
      const int64_t g = r * groups + c / 32;
      const uint8_t byte = m.blocks.data<uint8_t>()[g * 16 + (c % 32) / 2];
      const uint8_t code = (c % 2 == 0) ? (byte & 0xF) : (byte >> 4);
      const double want = e2m1_ref(code) * std::ldexp(1.0, m.scales.data<uint8_t>()[g] - 127);
      ASSERT_EQ(static_cast<double>(deq.data<float>()[r * groups * 32 + c]), want) << r << "," << c;
    }
  }
  // The packed codes are the block bytes unchanged.
  for (int64_t i = 0; i < m.blocks.numel(); ++i)
    ASSERT_EQ(e->packed.data<uint8_t>()[i], m.blocks.data<uint8_t>()[i]);
}

TEST(Mxfp4, SpanBeyondE4m3IsRefused) {
  Mx m = random_mx(2, 2, 120, 120, 2);
  m.blocks.mutable_data<uint8_t>()[0] = 0x11;  // non-zero codes in every half-block
  m.blocks.mutable_data<uint8_t>()[8] = 0x11;
  m.scales.mutable_data<uint8_t>()[0] = 102;  // 18 binades below 120
  EXPECT_FALSE(mxfp4_to_nvfp4_exact(m.blocks, m.scales, 120).has_value());
  m.scales.mutable_data<uint8_t>()[0] = 103;  // 17: still exact (scale 2^-9)
  const std::optional<Nvfp4Weight> q = mxfp4_to_nvfp4_exact(m.blocks, m.scales, 120);
  ASSERT_TRUE(q.has_value());
  EXPECT_EQ(q->block_scale.data<uint8_t>()[0], 0x01);  // 2^-9, the smallest E4M3 subnormal
}

// ---- MXFP4 weights written (mxfp4_mlp_weight_only): hand-worked vectors --------------------

TEST(Mxfp4Quantize, HandWorkedBlocks) {
  // 4 blocks of 32 in one row: block 0 amax 6 (2^0), block 1 amax 0.75 (2^-3), block 2 amax 0.7
  // (log2(0.7/6) = -3.1, ceil -3), block 3 all zero (e = -127, byte 0).
  std::vector<float> v(128, 0.0f);
  const float b0[] = {3.0f, -0.75f, 0.25f, 0.0f,  1.75f, -5.0f,
                      6.0f, 2.5f,   0.1f,  -0.1f, 3.5f,  1.25f};
  std::copy(std::begin(b0), std::end(b0), v.begin());
  const float b1[] = {0.75f, -0.375f, 0.1875f, 0.5f};
  std::copy(std::begin(b1), std::end(b1), v.begin() + 32);
  v[64] = 0.7f;
  const Tensor w = quant_test::make_weight(DType::kF32, {1, 128}, v);
  const Mxfp4Weight q = mxfp4_quantize(w, "w");
  ASSERT_EQ(q.packed.shape(), Shape({1, 64}));
  ASSERT_EQ(q.scale.shape(), Shape({1, 4}));
  EXPECT_EQ(quant_test::bytes_of(q.scale), (std::vector<uint8_t>{127, 124, 124, 0}));
  const uint8_t* p = q.packed.data<uint8_t>();
  // Block 0, x = w: 3 -> 0x5; -0.75 -> 0.5 (ties down) 0x9; 0.25 -> 0 (+) 0x0; 0 -> 0x8 (a zero
  // has the sign bit); 1.75 -> 1.5 0x3; -5 -> -4 0xE; 6 -> 0x7; 2.5 -> 2 0x4; 0.1 -> 0x0;
  // -0.1 -> 0x8; 3.5 -> 3 0x5; 1.25 -> 1 0x2; zeros 0x8. Even element in the low nibble.
  const uint8_t want0[] = {0x95, 0x80, 0xE3, 0x47, 0x80, 0x25, 0x88, 0x88};
  for (int j = 0; j < 8; ++j)
    EXPECT_EQ(p[j], want0[j]) << j;
  for (int j = 8; j < 16; ++j)
    EXPECT_EQ(p[j], 0x88) << j;
  // Block 1, x = w * 8: 6 -> 0x7, -3 -> 0xD, 1.5 -> 0x3, 4 -> 0x6.
  EXPECT_EQ(p[16], 0xD7);
  EXPECT_EQ(p[17], 0x63);
  // Block 2, x = 0.7 * 8 = 5.6 -> 6 (0x7); block 3: every code 0x8.
  EXPECT_EQ(p[32], 0x87);
  for (int j = 48; j < 64; ++j)
    EXPECT_EQ(p[j], 0x88) << j;
  // Dequantized: the E2M1 grid times 2^e.
  const Tensor d = mxfp4_dequantize(q);
  const float* x = d.data<float>();
  EXPECT_EQ(x[0], 3.0f);
  EXPECT_EQ(x[1], -0.5f);
  EXPECT_EQ(x[4], 1.5f);
  EXPECT_EQ(x[5], -4.0f);
  EXPECT_EQ(x[33], -0.375f);
  EXPECT_EQ(x[64], 0.75f);
  EXPECT_EQ(x[3], 0.0f);
}

TEST(Mxfp4Quantize, Bf16ExponentsAndRefusals) {
  // amax 3 * 2^4 = 48: 48 / 6 = 8 = 2^3 exactly, e = 3; amax 49 gives e = 4.
  std::vector<float> v(64, 0.0f);
  v[0] = 48.0f;
  v[1] = 24.0f;  // 3 at e = 3 -> 0x5
  v[32] = 49.0f;
  const Mxfp4Weight q = mxfp4_quantize(quant_test::make_weight(DType::kBF16, {1, 64}, v), "w");
  EXPECT_EQ(quant_test::bytes_of(q.scale), (std::vector<uint8_t>{130, 131}));
  EXPECT_EQ(q.packed.data<uint8_t>()[0], 0x57);  // 6 | 3 << 4
  EXPECT_THROW(mxfp4_quantize(quant_test::make_weight(DType::kF32, {2, 48}, {}), "w"), Error);
  std::vector<float> bad(32, 1.0f);
  bad[5] = NAN;
  EXPECT_THROW(mxfp4_quantize(quant_test::make_weight(DType::kF32, {1, 32}, bad), "w"), Error);
}

// ---- NVFP4 in blocks of 32 (nvfp4_bs32, nvfp4_mlp_weight_only) --------------------------------

TEST(Nvfp4Bs32, SameArithmeticOnBlocksOf32) {
  // A row whose 16-halves of each 32-block share their amax: the 32-block scale is the 16-blocks'
  // scale, and every code is the same as with blocks of 16.
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(4 * 64);
  for (float& x : v)
    x = u(rng) * 0.45f;
  for (size_t b = 0; b < v.size(); b += 16)
    v[b + 3] = (b / 32) % 2 ? 1.0f : -0.5f;  // each half of a 32-block has amax 1 or 0.5
  const Tensor w = quant_test::make_weight(DType::kBF16, {4, 64}, v);
  const Nvfp4Weight q16 = nvfp4_quantize(w, 1.0f, "w");
  const Nvfp4Weight q32 = nvfp4_quantize(w, 1.0f, "w", kNvfp4Bs32BlockSize);
  ASSERT_EQ(q32.block_scale.shape(), Shape({4, 2}));
  EXPECT_EQ(quant_test::bytes_of(q32.packed), quant_test::bytes_of(q16.packed));
  EXPECT_EQ(q32.global_scale.item_f32(), q16.global_scale.item_f32());
  for (int64_t i = 0; i < 8; ++i)
    EXPECT_EQ(q32.block_scale.data<uint8_t>()[i], q16.block_scale.data<uint8_t>()[2 * i]) << i;
  // Hand-worked: amax 1 gives weight_scale_2 = fl32(1/2688); a 32-block of amax 1 has scale
  // 1 / fl32(6 * fl32(1/2688)) = 448 (0x7E); of amax 0.5, 224 (0x76).
  EXPECT_EQ(q32.block_scale.data<uint8_t>()[0], 0x76);
  EXPECT_EQ(q32.block_scale.data<uint8_t>()[1], 0x7E);
  // The dequantization takes the block from the shapes.
  const Tensor d32 = nvfp4_dequantize(q32), d16 = nvfp4_dequantize(q16);
  EXPECT_EQ(quant_test::bytes_of(d32), quant_test::bytes_of(d16));
  EXPECT_THROW(nvfp4_quantize(quant_test::make_weight(DType::kF32, {1, 48}, {}), 1.0f, "w",
                              kNvfp4Bs32BlockSize),
               Error);
}

}  // namespace
}  // namespace strata
