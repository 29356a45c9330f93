// The closed-form MXFP4 -> NVFP4 conversion (quant/mxfp4.h): the NVFP4 weight must dequantize
// (format.md §1: e2m1 * f32(weight_scale) * weight_scale_2) to the MXFP4 values
// (e2m1 * 2^(e-127)) exactly, and the conversion must refuse spans E4M3 cannot hold.
#include "quant/mxfp4.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

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

}  // namespace
}  // namespace strata
