#include "quant/mxfp4.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "quant/encode.h"

namespace strata {

namespace {

bool any_nonzero_code(const uint8_t* bytes, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    if ((bytes[j] & 0x77) != 0) return true;  // magnitude bits of both nibbles
  }
  return false;
}

// The block's E8M0 exponent: max(ceil(log2(a / 6)), -127), with log2 and ceil as torch's fp32 ops.
int mxfp4_exponent(float block_amax) {
  const float d = block_amax / 6.0f;
  if (d == 0.0f) return -127;
  return static_cast<int>(std::max(std::ceil(std::log2(d)), -127.0f));
}

// ModelOpt's cast_fp4: every tie rounds down; sign bit set unless x > 0.
uint8_t mxfp4_code(float x) {
  const float a = std::fabs(x);
  const int code =
      (a > 0.25f) + (a > 0.75f) + (a > 1.25f) + (a > 1.75f) + (a > 2.5f) + (a > 3.5f) + (a > 5.0f);
  return static_cast<uint8_t>((x > 0.0f ? 0 : 0x8) | code);
}

}  // namespace

Mxfp4Weight mxfp4_quantize(const Tensor& weight, std::string_view name) {
  quant_detail::check_weight(weight, name, kMxfp4BlockSize, "mxfp4");
  const int64_t width = weight.dim(-1), rows = weight.numel() / width;
  const int64_t blocks = width / kMxfp4BlockSize;
  Shape packed_shape = weight.shape(), scale_shape = weight.shape();
  packed_shape.back() /= 2;               // [..., out, in/2]
  scale_shape.back() /= kMxfp4BlockSize;  // [..., out, in/32]
  Mxfp4Weight q{Tensor::zeros(DType::kU8, packed_shape), Tensor::zeros(DType::kU8, scale_shape)};
  uint8_t* packed = q.packed.mutable_data<uint8_t>();
  uint8_t* scales = q.scale.mutable_data<uint8_t>();
  std::vector<float> row(static_cast<size_t>(width));
  for (int64_t r = 0; r < rows; ++r) {
    quant_detail::load_finite_f32(weight, r * width, width, row.data(), name);
    for (int64_t b = 0; b < blocks; ++b) {
      const float* w = row.data() + b * kMxfp4BlockSize;
      float block_amax = 0.0f;
      for (int64_t i = 0; i < kMxfp4BlockSize; ++i)
        block_amax = std::max(block_amax, std::fabs(w[i]));
      const int e = mxfp4_exponent(block_amax);
      scales[r * blocks + b] = static_cast<uint8_t>(e + 127);
      const float pow2 = std::ldexp(1.0f, e);  // 2^-127 is an fp32 subnormal: exact
      uint8_t* dst = packed + r * (width / 2) + b * (kMxfp4BlockSize / 2);
      for (int64_t i = 0; i < kMxfp4BlockSize; i += 2) {
        dst[i / 2] =
            static_cast<uint8_t>(mxfp4_code(w[i] / pow2) | (mxfp4_code(w[i + 1] / pow2) << 4));
      }
    }
  }
  return q;
}

Tensor mxfp4_dequantize(const Mxfp4Weight& q) {
  STRATA_ASSERT(q.packed.dtype() == DType::kU8 && q.scale.dtype() == DType::kU8);
  Shape shape = q.packed.shape();
  shape.back() *= 2;  // [..., out, in]
  STRATA_ASSERT(q.scale.dim(-1) * kMxfp4BlockSize == shape.back(), "mxfp4 shapes");
  Tensor out = Tensor::zeros(DType::kF32, shape);
  float* dst = out.mutable_data<float>();
  const uint8_t* packed = q.packed.data<uint8_t>();
  const uint8_t* scales = q.scale.data<uint8_t>();
  for (int64_t i = 0; i < out.numel(); ++i) {
    const uint8_t byte = packed[i / 2];
    const uint8_t code = (i % 2 == 0) ? (byte & 0xF) : (byte >> 4);
    dst[i] = std::ldexp(e2m1_to_f32(code), static_cast<int>(scales[i / kMxfp4BlockSize]) - 127);
  }
  return out;
}

int mxfp4_max_scale(const Tensor& blocks, const Tensor& scales) {
  STRATA_ASSERT(blocks.ndim() == 3 && blocks.dim(2) == 16 && scales.numel() * 16 == blocks.numel(),
                "mxfp4 shapes");
  const uint8_t* b = blocks.data<uint8_t>();
  const uint8_t* s = scales.data<uint8_t>();
  int best = -1;
  for (int64_t g = 0; g < scales.numel(); ++g) {
    if (any_nonzero_code(b + g * 16, 16)) best = std::max(best, static_cast<int>(s[g]));
  }
  return best;
}

std::optional<Nvfp4Weight> mxfp4_to_nvfp4_exact(const Tensor& blocks, const Tensor& scales,
                                                int group_max) {
  STRATA_ASSERT(blocks.ndim() == 3 && blocks.dim(2) == 16 && scales.numel() * 16 == blocks.numel(),
                "mxfp4 shapes");
  if (group_max < 0 || group_max == 0xFF) return std::nullopt;
  const int64_t out = blocks.dim(0), groups = blocks.dim(1), in = groups * 32;
  Nvfp4Weight q;
  q.packed = Tensor::zeros(DType::kU8, {out, in / 2});  // [out, in/2]: the block bytes in order
  q.block_scale = Tensor::zeros(DType::kF8E4M3, {out, in / 16});  // [out, in/16]
  q.global_scale = Tensor::scalar_f32(std::ldexp(1.0f, group_max - 135));
  const uint8_t* b = blocks.data<uint8_t>();
  const uint8_t* s = scales.data<uint8_t>();
  uint8_t* packed = q.packed.mutable_data<uint8_t>();
  uint8_t* bs = q.block_scale.mutable_data<uint8_t>();
  for (int64_t g = 0; g < out * groups; ++g) {
    for (int64_t half = 0; half < 2; ++half) {
      const uint8_t* bytes = b + g * 16 + half * 8;  // 8 bytes = 16 codes
      uint8_t scale_byte = 0x38;                     // 1.0 for a block of zero codes
      if (any_nonzero_code(bytes, 8)) {
        if (s[g] == 0xFF) return std::nullopt;
        const int k = static_cast<int>(s[g]) - group_max + 8;
        if (k < -9 || k > 8) return std::nullopt;
        scale_byte = f32_to_e4m3(std::ldexp(1.0f, k));
        STRATA_ASSERT(e4m3_to_f32(scale_byte) == std::ldexp(1.0f, k), "e4m3 power of two ", k);
      }
      bs[g * 2 + half] = scale_byte;
      for (int64_t j = 0; j < 8; ++j)
        packed[g * 16 + half * 8 + j] = bytes[j];
    }
  }
  return q;
}

}  // namespace strata
