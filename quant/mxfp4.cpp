#include "quant/mxfp4.h"

#include <cmath>

#include "core/error.h"

namespace strata {

namespace {

bool any_nonzero_code(const uint8_t* bytes, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    if ((bytes[j] & 0x77) != 0) return true;  // magnitude bits of both nibbles
  }
  return false;
}

}  // namespace

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
