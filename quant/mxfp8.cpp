#include "quant/mxfp8.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "quant/fp8.h"

namespace strata {

namespace {

// ceil(log2(d)) for a positive finite fp32 d, exactly, from its bits.
int ceil_log2(float d) {
  const uint32_t u = std::bit_cast<uint32_t>(d);
  const int exponent_field = static_cast<int>(u >> 23);
  const uint32_t mantissa = u & 0x7FFFFF;
  if (exponent_field == 0) {  // subnormal: d = mantissa * 2^-149
    const int floor_log2 = static_cast<int>(std::bit_width(mantissa)) - 1 - 149;
    return floor_log2 + (std::has_single_bit(mantissa) ? 0 : 1);
  }
  return exponent_field - 127 + (mantissa != 0 ? 1 : 0);
}

template <quant_detail::Encoders kEncoders>
void quantize_rows(const Tensor& weight, std::string_view name, Mxfp8Weight& out) {
  const int64_t width = weight.dim(-1);
  const int64_t rows = weight.numel() / width;
  const int64_t blocks = width / kMxfp8BlockSize;
  uint8_t* elements = out.weight.mutable_data<uint8_t>();
  uint8_t* scales = out.scale.mutable_data<uint8_t>();
  std::vector<float> row(static_cast<size_t>(width));
  for (int64_t r = 0; r < rows; ++r) {
    quant_detail::load_finite_f32(weight, r * width, width, row.data(), name);
    for (int64_t b = 0; b < blocks; ++b) {
      const float* w = row.data() + b * kMxfp8BlockSize;
      float block_amax = 0.0f;
      for (int64_t i = 0; i < kMxfp8BlockSize; ++i)
        block_amax = std::max(block_amax, std::fabs(w[i]));
      const uint8_t biased = mxfp8_block_exponent(block_amax);
      scales[r * blocks + b] = biased;
      // 2^-e as an fp32 (2^-127 is a subnormal, still exact).
      const float inv_scale = std::ldexp(1.0f, 127 - static_cast<int>(biased));
      uint8_t* dst = elements + r * width + b * kMxfp8BlockSize;
      for (int64_t i = 0; i < kMxfp8BlockSize; ++i) {
        const float q = std::clamp(w[i] * inv_scale, -448.0f, 448.0f);
        if constexpr (kEncoders == quant_detail::Encoders::kFast) {
          dst[i] = quant_detail::fast_f32_to_e4m3(q);
        } else {
          dst[i] = f32_to_e4m3(q);
        }
      }
    }
  }
}

}  // namespace

uint8_t mxfp8_block_exponent(float block_amax) {
  STRATA_ASSERT(std::isfinite(block_amax) && block_amax >= 0.0f, "block amax ", block_amax);
  const float d = block_amax * kInv448;
  if (d == 0.0f) return 0;  // ModelOpt: log2 of a non-positive descale is taken as -127
  const int e = std::clamp(ceil_log2(d), -127, 127);
  return static_cast<uint8_t>(e + 127);
}

namespace quant_detail {

Mxfp8Weight mxfp8_quantize_with(Encoders encoders, const Tensor& weight, std::string_view name) {
  check_weight(weight, name, kMxfp8BlockSize, "mxfp8");
  Shape scale_shape = weight.shape();
  scale_shape.back() /= kMxfp8BlockSize;  // [..., out, in/32]
  Mxfp8Weight out{Tensor::zeros(DType::kF8E4M3, weight.shape()),
                  Tensor::zeros(DType::kU8, scale_shape)};
  if (encoders == Encoders::kFast) {
    quantize_rows<Encoders::kFast>(weight, name, out);
  } else {
    quantize_rows<Encoders::kReference>(weight, name, out);
  }
  return out;
}

}  // namespace quant_detail

Mxfp8Weight mxfp8_quantize(const Tensor& weight, std::string_view name) {
  return quant_detail::mxfp8_quantize_with(quant_detail::Encoders::kFast, weight, name);
}

Tensor mxfp8_dequantize(const Mxfp8Weight& q) {
  STRATA_ASSERT(q.weight.dtype() == DType::kF8E4M3 && q.scale.dtype() == DType::kU8);
  STRATA_ASSERT(q.scale.dim(-1) * kMxfp8BlockSize == q.weight.dim(-1));
  Tensor out = Tensor::zeros(DType::kF32, q.weight.shape());
  float* dst = out.mutable_data<float>();
  const uint8_t* src = q.weight.data<uint8_t>();
  const uint8_t* scales = q.scale.data<uint8_t>();
  for (int64_t i = 0; i < out.numel(); ++i) {
    const int exponent = static_cast<int>(scales[i / kMxfp8BlockSize]) - 127;
    dst[i] = std::ldexp(e4m3_to_f32(src[i]), exponent);
  }
  return out;
}

void mxfp8_fake_quantize(float* x, int64_t rows, int64_t cols, std::string_view name) {
  STRATA_CHECK(cols % kMxfp8BlockSize == 0, "mxfp8: ", name, " has rows of ", cols,
               " values, which MXFP8's blocks of 32 cannot take");
  const int64_t n = rows * cols;
  for (int64_t b = 0; b < n; b += kMxfp8BlockSize) {
    float* v = x + b;
    float block_amax = 0.0f;
    for (int64_t i = 0; i < kMxfp8BlockSize; ++i)
      block_amax = std::isfinite(v[i]) && std::isfinite(block_amax)
                       ? std::max(block_amax, std::fabs(v[i]))
                       : NAN;
    if (std::isnan(block_amax)) {
      std::fill(v, v + kMxfp8BlockSize, NAN);
      continue;
    }
    const int exponent = static_cast<int>(mxfp8_block_exponent(block_amax)) - 127;
    const float inv_scale = std::ldexp(1.0f, -exponent);
    for (int64_t i = 0; i < kMxfp8BlockSize; ++i) {
      const float q = std::clamp(v[i] * inv_scale, -448.0f, 448.0f);
      v[i] = std::ldexp(e4m3_to_f32(quant_detail::fast_f32_to_e4m3(q)), exponent);
    }
  }
}

}  // namespace strata
