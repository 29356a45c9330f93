#include "quant/nvfp4.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"

namespace strata {

namespace {

// fl32(1/2688) = 0x1.861862p-12: the fp32 reciprocal PyTorch's CUDA division by a Python number
// multiplies with (header comment). Written as a division so the compiler rounds it once.
constexpr float kInv2688 = 1.0f / 2688.0f;
constexpr float kMinBlockScale = 0x1p-9f;  // smallest e4m3 subnormal
constexpr float kMaxBlockScale = 448.0f;   // largest e4m3

// With `given` (one byte per block, row-major), those block scales are written and used instead of
// the ones computed from each block's amax (a searched scale, quant/scale_search.h).
template <quant_detail::Encoders kEncoders>
void quantize_rows(const Tensor& weight, float global_scale, float weight_amax, int64_t block,
                   std::string_view name, const uint8_t* given, Nvfp4Weight& out) {
  const int64_t width = weight.dim(-1);
  const int64_t rows = weight.numel() / width;
  const int64_t blocks = width / block;
  uint8_t* packed = out.packed.mutable_data<uint8_t>();
  uint8_t* scales = out.block_scale.mutable_data<uint8_t>();
  // 6 * weight_scale_2 rounded to fp32 before it divides (format.md §1, 3).
  const float six_global = 6.0f * global_scale;
  std::vector<float> row(static_cast<size_t>(width));
  for (int64_t r = 0; r < rows; ++r) {
    quant_detail::load_finite_f32(weight, r * width, width, row.data(), name);
    for (int64_t b = 0; b < blocks; ++b) {
      const float* w = row.data() + b * block;
      float block_amax = 0.0f;
      for (int64_t i = 0; i < block; ++i)
        block_amax = std::max(block_amax, std::fabs(w[i]));
      STRATA_CHECK(block_amax <= weight_amax, "nvfp4: tensor ", name, " has |W| = ", block_amax,
                   " in row ", r, ", above the weight amax ", weight_amax,
                   " it was given; the amax must be at least max|W|");
      float s = block_amax / six_global;
      if (s == 0.0f) s = 1.0f;
      s = std::clamp(s, kMinBlockScale, kMaxBlockScale);
      uint8_t scale_byte;
      if (given != nullptr) {
        scale_byte = given[r * blocks + b];
      } else if constexpr (kEncoders == quant_detail::Encoders::kFast) {
        scale_byte = quant_detail::fast_f32_to_e4m3(s);
      } else {
        scale_byte = f32_to_e4m3(s);
      }
      scales[r * blocks + b] = scale_byte;
      // Product rounded to fp32, then a true fp32 division (format.md §1, 4).
      const float descale = e4m3_to_f32(scale_byte) * global_scale;
      uint8_t* dst = packed + r * (width / 2) + b * (block / 2);
      for (int64_t i = 0; i < block; i += 2) {
        uint8_t lo, hi;
        if constexpr (kEncoders == quant_detail::Encoders::kFast) {
          lo = quant_detail::fast_f32_to_e2m1(w[i] / descale);
          hi = quant_detail::fast_f32_to_e2m1(w[i + 1] / descale);
        } else {
          lo = f32_to_e2m1(w[i] / descale);
          hi = f32_to_e2m1(w[i + 1] / descale);
        }
        dst[i / 2] = static_cast<uint8_t>(lo | (hi << 4));
      }
    }
  }
}

}  // namespace

float nvfp4_global_scale(float weight_amax) {
  return weight_amax * kInv2688;
}

float nvfp4_input_scale(float activation_amax, std::string_view name) {
  STRATA_CHECK(std::isfinite(activation_amax) && activation_amax > 0.0f, "nvfp4: activation amax ",
               activation_amax, " of ", name,
               " is not a positive finite number; no input_scale can be exported for it "
               "(did any calibration token reach this module?)");
  return activation_amax * kInv2688;
}

namespace quant_detail {

Nvfp4Weight nvfp4_quantize_with(Encoders encoders, const Tensor& weight, float weight_amax,
                                std::string_view name, int64_t block,
                                std::span<const uint8_t> block_scales) {
  STRATA_ASSERT(block == kNvfp4BlockSize || block == kNvfp4Bs32BlockSize, "nvfp4 block ", block);
  STRATA_ASSERT(block_scales.empty() || block == kNvfp4BlockSize, "nvfp4: given block scales with ",
                "blocks of ", block);
  check_weight(weight, name, block, "nvfp4");
  STRATA_CHECK(std::isfinite(weight_amax) && weight_amax > 0.0f, "nvfp4: weight amax ", weight_amax,
               " of ", name,
               " is not a positive finite number (an all-zero weight has no finite NVFP4 "
               "encoding; exclude the module)");
  const float global_scale = nvfp4_global_scale(weight_amax);
  STRATA_CHECK(global_scale > 0.0f, "nvfp4: weight amax ", weight_amax, " of ", name,
               " is too small for an fp32 weight_scale_2");
  Shape packed_shape = weight.shape();
  Shape scale_shape = weight.shape();
  packed_shape.back() /= 2;     // [..., out, in/2]
  scale_shape.back() /= block;  // [..., out, in/16] (in/32 for block 32)
  Nvfp4Weight out{Tensor::zeros(DType::kU8, packed_shape),
                  Tensor::zeros(DType::kF8E4M3, scale_shape), Tensor::scalar_f32(global_scale)};
  const uint8_t* given = nullptr;
  if (!block_scales.empty()) {
    STRATA_CHECK(static_cast<int64_t>(block_scales.size()) == out.block_scale.numel(),
                 "nvfp4: ", block_scales.size(), " block scales given for ", name, ", which has ",
                 out.block_scale.numel(), " blocks");
    for (uint8_t b : block_scales)
      STRATA_CHECK(b != 0 && (b & 0x7F) != 0x7F && (b & 0x80) == 0, "nvfp4: block scale byte ",
                   int(b), " given for ", name, " is not a positive finite e4m3 value");
    given = block_scales.data();
  }
  if (encoders == Encoders::kFast) {
    quantize_rows<Encoders::kFast>(weight, global_scale, weight_amax, block, name, given, out);
  } else {
    quantize_rows<Encoders::kReference>(weight, global_scale, weight_amax, block, name, given, out);
  }
  return out;
}

}  // namespace quant_detail

Nvfp4Weight nvfp4_quantize(const Tensor& weight, float weight_amax, std::string_view name,
                           int64_t block) {
  return quant_detail::nvfp4_quantize_with(quant_detail::Encoders::kFast, weight, weight_amax, name,
                                           block);
}

Nvfp4Weight nvfp4_quantize_with_scales(const Tensor& weight, float weight_amax,
                                       std::span<const uint8_t> block_scales,
                                       std::string_view name) {
  STRATA_CHECK(!block_scales.empty(), "nvfp4: no block scales given for ", name);
  return quant_detail::nvfp4_quantize_with(quant_detail::Encoders::kFast, weight, weight_amax, name,
                                           kNvfp4BlockSize, block_scales);
}

Tensor nvfp4_dequantize(const Nvfp4Weight& q) {
  STRATA_ASSERT(q.packed.dtype() == DType::kU8 && q.block_scale.dtype() == DType::kF8E4M3 &&
                q.global_scale.dtype() == DType::kF32 && q.global_scale.numel() == 1);
  Shape shape = q.packed.shape();
  shape.back() *= 2;  // [..., out, in]
  const int64_t width = shape.back();
  const int64_t block = width / q.block_scale.dim(-1);  // 16, or 32 (nvfp4_bs32)
  STRATA_ASSERT(q.block_scale.dim(-1) * block == width);
  Tensor out = Tensor::zeros(DType::kF32, shape);
  float* dst = out.mutable_data<float>();
  const uint8_t* packed = q.packed.data<uint8_t>();
  const uint8_t* scales = q.block_scale.data<uint8_t>();
  const float global_scale = q.global_scale.item_f32();
  const int64_t n = out.numel();
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t byte = packed[i / 2];
    const uint8_t code = (i % 2 == 0) ? (byte & 0xF) : (byte >> 4);
    const float descale = e4m3_to_f32(scales[i / block]) * global_scale;
    dst[i] = e2m1_to_f32(code) * descale;
  }
  return out;
}

void nvfp4_fake_quantize(float* x, int64_t rows, int64_t cols, float global_scale,
                         std::string_view name) {
  STRATA_CHECK(cols % kNvfp4BlockSize == 0, "nvfp4: ", name, " has rows of ", cols,
               " values, which NVFP4's blocks of 16 cannot take");
  STRATA_CHECK(std::isfinite(global_scale) && global_scale > 0.0f, "nvfp4: the global scale ",
               global_scale, " of ", name, " is not a positive finite number");
  const float six_global = 6.0f * global_scale;  // fl32(6 * s), rounded before it divides
  const int64_t n = rows * cols;
  for (int64_t b = 0; b < n; b += kNvfp4BlockSize) {
    float* v = x + b;
    float block_amax = 0.0f;
    bool nan = false;
    for (int64_t i = 0; i < kNvfp4BlockSize; ++i) {
      nan = nan || std::isnan(v[i]);
      block_amax = std::max(block_amax, std::fabs(v[i]));
    }
    const float s = nan ? NAN : std::min(block_amax / six_global, kMaxBlockScale);
    float descale = e4m3_to_f32(quant_detail::fast_f32_to_e4m3(s)) * global_scale;
    if (!(descale >= 1e-5f)) descale = 1.0f;  // underflowed (or NaN): ModelOpt's substitute
    for (int64_t i = 0; i < kNvfp4BlockSize; ++i) {
      const float m =
          e2m1_to_f32(quant_detail::fast_f32_to_e2m1(std::fabs(v[i]) / descale)) * descale;
      v[i] = v[i] >= 0.0f ? m : -m;
    }
  }
}

}  // namespace strata
