#include "quant/fp8.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <vector>

#include "core/error.h"

namespace strata {

namespace {

// fl32(1/448) = 0x1.24924ap-9, the reciprocal PyTorch's CUDA division by 448.0 multiplies with.
constexpr float kInv448 = 1.0f / 448.0f;
constexpr int64_t kChunk = 4096;  // elements decoded at a time

template <quant_detail::Encoders kEncoders>
void quantize_elements(const Tensor& weight, float divisor, float weight_amax,
                       std::string_view name, uint8_t* dst) {
  const DType dt = weight.dtype();
  const int64_t n = weight.numel();
  std::vector<float> buf(static_cast<size_t>(std::min(n, kChunk)));
  for (int64_t first = 0; first < n; first += kChunk) {
    const int64_t count = std::min(kChunk, n - first);
    quant_detail::load_finite_f32(weight, first, count, buf.data(), name);
    for (int64_t i = 0; i < count; ++i) {
      const float w = buf[i];
      STRATA_CHECK(std::fabs(w) <= weight_amax, "fp8: tensor ", name, " has |W| = ", std::fabs(w),
                   " at flat element ", first + i, ", above the weight amax ", weight_amax,
                   " it was given; the amax must be at least max|W|");
      float q = w / divisor;
      if constexpr (kEncoders == quant_detail::Encoders::kFast) {
        if (dt == DType::kBF16) {
          q = quant_detail::fast_round_bf16(q);
        } else if (dt == DType::kF16) {
          q = quant_detail::round_to(dt, q);
        }
      } else {
        q = quant_detail::round_to(dt, q);
      }
      q = std::clamp(q, -448.0f, 448.0f);
      if constexpr (kEncoders == quant_detail::Encoders::kFast) {
        dst[first + i] = quant_detail::fast_f32_to_e4m3(q);
      } else {
        dst[first + i] = f32_to_e4m3(q);
      }
    }
  }
}

}  // namespace

float fp8_weight_scale(float weight_amax) {
  return weight_amax * kInv448;
}

float fp8_input_scale(float activation_amax) {
  float amax = activation_amax;
  if (amax == 0.0f || std::isnan(amax)) amax = 448.0f;
  amax = std::clamp(amax, FLT_MIN, FLT_MAX);  // also maps +inf to FLT_MAX
  return amax * kInv448;
}

float fp8_kv_cache_scale(float amax, std::string_view name) {
  STRATA_CHECK(std::isfinite(amax) && amax > 0.0f, "fp8 kv cache: amax ", amax, " of ", name,
               " is not a positive finite number; no k/v scale can be exported for it");
  return amax * kInv448;
}

namespace quant_detail {

Fp8Weight fp8_quantize_with(Encoders encoders, const Tensor& weight, float weight_amax,
                            std::string_view name, bool clip) {
  check_weight(weight, name, 1, "fp8");
  STRATA_CHECK(std::isfinite(weight_amax) && weight_amax > 0.0f, "fp8: weight amax ", weight_amax,
               " of ", name,
               " is not a positive finite number (an all-zero weight has no finite FP8 scale; "
               "exclude the module)");
  const float scale = fp8_weight_scale(weight_amax);
  // The divisor as the CUDA kernel sees it: the scale loaded in the weight's dtype.
  const float divisor = round_to(weight.dtype(), scale);
  STRATA_CHECK(divisor > 0.0f && std::isfinite(divisor), "fp8: weight amax ", weight_amax, " of ",
               name, " gives a scale that is 0 or infinite in ", dtype_name(weight.dtype()));
  Fp8Weight out{Tensor::zeros(DType::kF8E4M3, weight.shape()), Tensor::scalar_f32(scale)};
  uint8_t* dst = out.weight.mutable_data<uint8_t>();
  const float bound = clip ? INFINITY : weight_amax;  // the |W| <= amax check, off when clipping
  if (encoders == Encoders::kFast) {
    quantize_elements<Encoders::kFast>(weight, divisor, bound, name, dst);
  } else {
    quantize_elements<Encoders::kReference>(weight, divisor, bound, name, dst);
  }
  return out;
}

}  // namespace quant_detail

Fp8Weight fp8_quantize(const Tensor& weight, float weight_amax, std::string_view name) {
  return quant_detail::fp8_quantize_with(quant_detail::Encoders::kFast, weight, weight_amax, name);
}

Fp8Weight fp8_quantize_clipped(const Tensor& weight, float weight_amax, std::string_view name) {
  return quant_detail::fp8_quantize_with(quant_detail::Encoders::kFast, weight, weight_amax, name,
                                         true);
}

Tensor fp8_dequantize(const Fp8Weight& q) {
  STRATA_ASSERT(q.weight.dtype() == DType::kF8E4M3 && q.scale.dtype() == DType::kF32 &&
                q.scale.numel() == 1);
  Tensor out = Tensor::zeros(DType::kF32, q.weight.shape());
  float* dst = out.mutable_data<float>();
  const uint8_t* src = q.weight.data<uint8_t>();
  const float scale = q.scale.item_f32();
  for (int64_t i = 0; i < out.numel(); ++i)
    dst[i] = e4m3_to_f32(src[i]) * scale;
  return out;
}

void fp8_fake_quantize(float* x, int64_t n, float scale, std::string_view name) {
  STRATA_CHECK(std::isfinite(scale) && scale > 0.0f, "fp8: the scale ", scale, " of ", name,
               " is not a positive finite number");
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(x[i])) continue;
    const float q = std::clamp(x[i] / scale, -448.0f, 448.0f);
    x[i] = e4m3_to_f32(quant_detail::fast_f32_to_e4m3(q)) * scale;
  }
}

}  // namespace strata
