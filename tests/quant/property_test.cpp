// Round-trip error bounds derived from each format, on random weights of several distributions
// and scales (fixed seeds). Reference and fast encoders must also agree byte for byte here.
//
// NVFP4: with D = f32(block_scale) * weight_scale_2 and x = W / D, the E2M1 grid has spacing
//   0.5 below 2, 1 in [2, 4), 2 in [4, 6]; rounding errs by at most half a spacing, and beyond 6
//   (possible when the block scale rounded down) by |x| - 6. So |W - deq| <= D * bound(|x|)
//   (+ a few fp32 ulps of W: when |x| is just above 6 the error is a small difference). The block
//   scale itself is e4m3(a_b / (6 weight_scale_2)) or a clamp, so it is within 2^-4 (relative,
//   normal range) of the ideal scale: |x| <= 6 / (1 - 2^-4) < 6.4.
// FP8: x = W / scale has e4m3 half-spacing 2^-4 |x| (normal) or 2^-10 (subnormal), the bf16
//   rounding of the quotient adds 2^-9 |x| and that of the divisor 2^-9 |x|:
//   |W - deq| <= scale * (|x| (2^-4 + 2^-8) + 2^-10), with some fp32 slack.
// MXFP8: x = W / 2^e, |x| <= 448 by the choice of e; |W - deq| <= 2^e (2^-4 |x| + 2^-10).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "quant/fp8.h"
#include "quant/mxfp8.h"
#include "quant/nvfp4.h"
#include "tests/quant/test_util.h"

namespace strata {
namespace {

using quant_test::bytes_of;
using quant_test::make_weight;

struct Dist {
  const char* name;
  int kind;  // 0 normal, 1 uniform, 2 student-t-like (normal / |normal|), 3 log-uniform magnitudes
  float scale;
};

std::vector<float> sample(const Dist& d, int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) {
    switch (d.kind) {
      case 0:
        x = normal(rng) * d.scale;
        break;
      case 1:
        x = uni(rng) * d.scale;
        break;
      case 2:
        x = normal(rng) / std::max(std::fabs(normal(rng)), 0.05f) * d.scale;
        break;
      default:
        x = std::copysign(std::exp(uni(rng) * 12.0f), uni(rng)) * d.scale;
        break;
    }
  }
  return v;
}

const Dist kDists[] = {{"normal_0.02", 0, 0.02f},
                       {"normal_1", 0, 1.0f},
                       {"uniform_30", 1, 30.0f},
                       {"heavy_0.01", 2, 0.01f},
                       {"logwide_1e-3", 3, 1e-3f}};
const DType kTypes[] = {DType::kBF16, DType::kF16, DType::kF32};

float amax_of(const Tensor& w) {
  float a = 0;
  for (int64_t i = 0; i < w.numel(); ++i)
    a = std::max(a, std::fabs(w.item_f32(i)));
  return a;
}

float nvfp4_half_step(float ax) {
  if (ax < 2.0f) return 0.25f;
  if (ax < 4.0f) return 0.5f;
  if (ax <= 6.0f) return 1.0f;
  return ax - 6.0f;
}

TEST(QuantProperty, Nvfp4RoundTrip) {
  uint32_t seed = 1;
  for (const Dist& d : kDists) {
    for (DType dt : kTypes) {
      if (dt == DType::kF16 && d.kind == 3) continue;  // outside f16's range
      SCOPED_TRACE(std::string(d.name) + " " + std::string(dtype_name(dt)));
      const int rows = 24, cols = 128;
      Tensor w = make_weight(dt, {rows, cols}, sample(d, rows * cols, seed++));
      const float amax = amax_of(w);
      Nvfp4Weight q = nvfp4_quantize(w, amax, "w");
      Nvfp4Weight r =
          quant_detail::nvfp4_quantize_with(quant_detail::Encoders::kReference, w, amax, "w");
      EXPECT_EQ(bytes_of(q.packed), bytes_of(r.packed));
      EXPECT_EQ(bytes_of(q.block_scale), bytes_of(r.block_scale));
      Tensor deq = nvfp4_dequantize(q);
      const float g = q.global_scale.item_f32();
      for (int64_t row = 0; row < rows; ++row) {
        for (int64_t b = 0; b < cols / 16; ++b) {
          float a_b = 0;
          for (int i = 0; i < 16; ++i)
            a_b = std::max(a_b, std::fabs(w.item_f32(row * cols + b * 16 + i)));
          const float sb = e4m3_to_f32(q.block_scale.data<uint8_t>()[row * (cols / 16) + b]);
          const float ideal = std::clamp(a_b / (6.0f * g), 0x1p-9f, 448.0f);
          if (a_b > 0 && ideal >= 0x1p-6f) {
            EXPECT_LE(std::fabs(sb - ideal), ideal * 0x1p-4f);
          }
          const float dsc = sb * g;
          for (int i = 0; i < 16; ++i) {
            const int64_t k = row * cols + b * 16 + i;
            const float x = w.item_f32(k) / dsc;
            EXPECT_LT(std::fabs(x), 6.4f);
            const float err = std::fabs(w.item_f32(k) - deq.item_f32(k));
            // Slack: a few fp32 ulps of W for the rounding of x, the product and the difference.
            EXPECT_LE(err,
                      dsc * nvfp4_half_step(std::fabs(x)) + std::fabs(w.item_f32(k)) * 0x1p-21f)
                << k;
          }
        }
      }
    }
  }
}

TEST(QuantProperty, Fp8RoundTrip) {
  uint32_t seed = 100;
  for (const Dist& d : kDists) {
    for (DType dt : kTypes) {
      if (dt == DType::kF16 && d.kind == 3) continue;
      SCOPED_TRACE(std::string(d.name) + " " + std::string(dtype_name(dt)));
      Tensor w = make_weight(dt, {16, 96}, sample(d, 16 * 96, seed++));
      const float amax = amax_of(w);
      Fp8Weight q = fp8_quantize(w, amax, "w");
      EXPECT_EQ(bytes_of(q.weight), bytes_of(quant_detail::fp8_quantize_with(
                                                 quant_detail::Encoders::kReference, w, amax, "w")
                                                 .weight));
      Tensor deq = fp8_dequantize(q);
      const float s = q.scale.item_f32();
      for (int64_t k = 0; k < w.numel(); ++k) {
        const float x = w.item_f32(k) / s;
        EXPECT_LE(std::fabs(x), 448.0f * (1 + 0x1p-7f));
        const float err = std::fabs(w.item_f32(k) - deq.item_f32(k));
        EXPECT_LE(err, s * (std::fabs(x) * (0x1p-4f + 0x1p-8f) + 0x1p-10f) +
                           std::fabs(w.item_f32(k)) * 0x1p-21f)
            << k;
      }
    }
  }
}

TEST(QuantProperty, Mxfp8RoundTrip) {
  uint32_t seed = 200;
  for (const Dist& d : kDists) {
    for (DType dt : kTypes) {
      if (dt == DType::kF16 && d.kind == 3) continue;
      SCOPED_TRACE(std::string(d.name) + " " + std::string(dtype_name(dt)));
      Tensor w = make_weight(dt, {16, 128}, sample(d, 16 * 128, seed++));
      Mxfp8Weight q = mxfp8_quantize(w, "w");
      Mxfp8Weight r = quant_detail::mxfp8_quantize_with(quant_detail::Encoders::kReference, w, "w");
      EXPECT_EQ(bytes_of(q.weight), bytes_of(r.weight));
      EXPECT_EQ(bytes_of(q.scale), bytes_of(r.scale));
      Tensor deq = mxfp8_dequantize(q);
      for (int64_t k = 0; k < w.numel(); ++k) {
        const float unit = std::ldexp(1.0f, q.scale.data<uint8_t>()[k / 32] - 127);
        const float x = w.item_f32(k) / unit;
        EXPECT_LE(std::fabs(x), 448.0f);
        const float err = std::fabs(w.item_f32(k) - deq.item_f32(k));
        EXPECT_LE(err,
                  unit * (std::fabs(x) * 0x1p-4f + 0x1p-10f) + std::fabs(w.item_f32(k)) * 0x1p-21f)
            << k;
      }
    }
  }
}

}  // namespace
}  // namespace strata
