// Decompression of compressed source weights (io/source_weights.h) against hand-worked vectors
// and, on random data, against the formulas of spec/format.md §8 written out here with an
// independent decoder (no core/dtype conversions). tests/export/compressed_source_test.sh checks
// whole checkpoints against the numpy decompression of tests/export/check_modelopt_export.py.
#include "io/source_weights.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "io_test_util.h"

namespace strata {
namespace {

using test::expect_error;

Tensor make(DType d, Shape shape) {
  return Tensor::zeros(d, std::move(shape));
}

float bf16_at(const Tensor& t, int64_t i) {
  const uint32_t u = static_cast<uint32_t>(t.data<uint16_t>()[i]) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Independent decoders, from the bit layouts (format.md §1, §8).
double e4m3_ref(uint8_t b) {
  const int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
  const double v = e == 0 ? m * std::ldexp(1.0, -9) : (1.0 + m / 8.0) * std::ldexp(1.0, e - 7);
  return s ? -v : v;
}
double e2m1_ref(uint8_t code) {
  static const double mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  return (code & 8) ? -mag[code & 7] : mag[code & 7];
}
// Round a double that is exactly an fp32 product to fp32, then to bf16 (nearest even): bits.
uint16_t bf16_ref(double x) {
  const float f = static_cast<float>(x);
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

TEST(SourceWeights, Int4HandVectors) {
  // One row, 12 inputs (two int32 words, the second half padding), one group of 32 (ceil).
  Tensor packed = make(DType::kI32, {1, 2});
  packed.mutable_data<uint32_t>()[0] = 0x76543210u;  // nibbles 0..7  -> values -8..-1
  packed.mutable_data<uint32_t>()[1] = 0x0000FE98u;  // nibbles 8,9,E,F -> 0, 1, 6, 7
  Tensor scale = make(DType::kBF16, {1, 1});
  scale.mutable_data<uint16_t>()[0] = 0x3F00;  // 0.5
  const Tensor w = decompress_int4_pack(packed, scale, 1, 12, 32, "t");
  ASSERT_EQ(w.shape(), Shape({1, 12}));
  const float want[12] = {-4, -3.5, -3, -2.5, -2, -1.5, -1, -0.5, 0, 0.5, 3, 3.5};
  for (int i = 0; i < 12; ++i)
    EXPECT_EQ(bf16_at(w, i), want[i]) << i;
  // 7 * 1.0078125 = 7.0546875 is not a bf16 value: nearest are 7.03125 and 7.0625 -> 7.0625.
  packed.mutable_data<uint32_t>()[0] = 0xFu;
  scale.mutable_data<uint16_t>()[0] = 0x3F81;  // 1.0078125
  EXPECT_EQ(bf16_at(decompress_int4_pack(packed, scale, 1, 12, 32, "t"), 0), 7.0625f);
}

TEST(SourceWeights, Int4RandomAgainstFormula) {
  std::mt19937 rng(7);
  const int64_t out = 5, in = 72, group = 32, words = 9, groups = 3;  // in: not a multiple of 32
  Tensor packed = make(DType::kI32, {out, words});
  Tensor scale = make(DType::kF32, {out, groups});
  for (int64_t i = 0; i < out * words; ++i)
    packed.mutable_data<uint32_t>()[i] = rng();
  std::uniform_real_distribution<float> u(1e-3f, 2.0f);
  for (int64_t i = 0; i < out * groups; ++i)
    scale.mutable_data<float>()[i] = u(rng);
  const Tensor w = decompress_int4_pack(packed, scale, out, in, group, "t");
  for (int64_t r = 0; r < out; ++r) {
    for (int64_t c = 0; c < in; ++c) {
      const uint32_t word = packed.data<uint32_t>()[r * words + c / 8];
      const int q = static_cast<int>((word >> (4 * (c % 8))) & 0xF) - 8;
      const double v = q * static_cast<double>(scale.data<float>()[r * groups + c / group]);
      ASSERT_EQ(w.data<uint16_t>()[r * in + c], bf16_ref(v)) << r << "," << c;
    }
  }
}

TEST(SourceWeights, Fp8BlockRandomAgainstFormula) {
  std::mt19937 rng(8);
  const int64_t out = 130, in = 260;  // 2 x 3 blocks of 128, the last ones partial
  Tensor w8 = make(DType::kF8E4M3, {out, in});
  Tensor s = make(DType::kF32, {2, 3});
  for (int64_t i = 0; i < out * in; ++i) {
    uint8_t b = static_cast<uint8_t>(rng());
    if ((b & 0x7F) == 0x7F) b = 0x7E;  // no NaN
    w8.mutable_data<uint8_t>()[i] = b;
  }
  std::uniform_real_distribution<float> u(1e-4f, 0.01f);
  for (int i = 0; i < 6; ++i)
    s.mutable_data<float>()[i] = u(rng);
  const Tensor w = decompress_fp8_block(w8, s, 128, "t");
  for (int64_t r = 0; r < out; ++r) {
    for (int64_t c = 0; c < in; ++c) {
      const float prod = static_cast<float>(e4m3_ref(w8.data<uint8_t>()[r * in + c])) *
                         s.data<float>()[(r / 128) * 3 + c / 128];  // one fp32 product
      ASSERT_EQ(w.data<uint16_t>()[r * in + c], bf16_ref(prod)) << r << "," << c;
    }
  }
  // Hand vector: 0x38 is 1.0, 0x40 is 2.0, 0xC4 is -3.0.
  Tensor h8 = make(DType::kF8E4M3, {1, 3});
  h8.mutable_data<uint8_t>()[0] = 0x38;
  h8.mutable_data<uint8_t>()[1] = 0x40;
  h8.mutable_data<uint8_t>()[2] = 0xC4;
  Tensor hs = make(DType::kF32, {1, 1});
  hs.mutable_data<float>()[0] = 0.5f;
  const Tensor hw = decompress_fp8_block(h8, hs, 128, "t");
  EXPECT_EQ(bf16_at(hw, 0), 0.5f);
  EXPECT_EQ(bf16_at(hw, 1), 1.0f);
  EXPECT_EQ(bf16_at(hw, 2), -1.5f);
  expect_error(
      [&] {
        decompress_fp8_block(h8, make(DType::kF32, {1, 2}), 128, "t");
      },
      {"weight_scale_inv", "[1, 1]"});
}

TEST(SourceWeights, Mxfp4HandVectorsAndRandom) {
  // Hand: byte 0x21 -> elements 0.5 (low nibble) and 1.0; 0xF8 -> -0 and -6; scale 2^(128-127).
  Tensor b = make(DType::kU8, {1, 1, 16});
  b.mutable_data<uint8_t>()[0] = 0x21;
  b.mutable_data<uint8_t>()[1] = 0xF8;
  Tensor s = make(DType::kU8, {1, 1});
  s.mutable_data<uint8_t>()[0] = 128;
  const Tensor w = decompress_mxfp4(b, s, "t");
  ASSERT_EQ(w.shape(), Shape({1, 32}));
  EXPECT_EQ(bf16_at(w, 0), 1.0f);
  EXPECT_EQ(bf16_at(w, 1), 2.0f);
  EXPECT_EQ(w.data<uint16_t>()[2], 0x8000);  // -0
  EXPECT_EQ(bf16_at(w, 3), -12.0f);
  EXPECT_EQ(bf16_at(w, 4), 0.0f);
  s.mutable_data<uint8_t>()[0] = 0xFF;  // E8M0 NaN
  expect_error([&] { decompress_mxfp4(b, s, "t"); }, {"not a finite bf16 value"});

  std::mt19937 rng(9);
  const int64_t out = 3, groups = 4;
  Tensor rb = make(DType::kU8, {out, groups, 16});
  Tensor rs = make(DType::kU8, {out, groups});
  for (int64_t i = 0; i < rb.numel(); ++i)
    rb.mutable_data<uint8_t>()[i] = static_cast<uint8_t>(rng());
  for (int64_t i = 0; i < rs.numel(); ++i)
    rs.mutable_data<uint8_t>()[i] = static_cast<uint8_t>(100 + rng() % 50);
  const Tensor rw = decompress_mxfp4(rb, rs, "t");
  for (int64_t r = 0; r < out; ++r) {
    for (int64_t c = 0; c < groups * 32; ++c) {
      const uint8_t byte = rb.data<uint8_t>()[(r * groups + c / 32) * 16 + (c % 32) / 2];
      const uint8_t code = (c % 2 == 0) ? (byte & 0xF) : (byte >> 4);
      const double v =
          e2m1_ref(code) * std::ldexp(1.0, rs.data<uint8_t>()[r * groups + c / 32] - 127);
      ASSERT_EQ(rw.data<uint16_t>()[r * groups * 32 + c], bf16_ref(v)) << r << "," << c;
    }
  }
}

}  // namespace
}  // namespace strata
