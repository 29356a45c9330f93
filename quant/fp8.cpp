#include "quant/fp8.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <vector>

#include "core/error.h"

namespace strata {

namespace {

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

bool fp8_pb_single_block(const Shape& shape) {
  return shape.size() == 2 && shape[0] <= kFp8PbBlock && shape[1] <= kFp8PbBlock;
}

Fp8Weight fp8_pb_quantize(const Tensor& weight, std::string_view name, float group_amax) {
  quant_detail::check_weight(weight, name, 1, "fp8_pb_wo");
  STRATA_CHECK(weight.shape().size() == 2, "fp8_pb_wo: tensor ", name, " has shape ",
               shape_str(weight.shape()), "; 128x128 block FP8 needs a 2-D weight [out, in]");
  const int64_t out = weight.shape()[0], in = weight.shape()[1];
  const int64_t nr = (out + kFp8PbBlock - 1) / kFp8PbBlock,
                nc = (in + kFp8PbBlock - 1) / kFp8PbBlock;
  std::vector<float> row(static_cast<size_t>(in));
  // Pass 1: block amaxes a[R, C].
  std::vector<float> scales(static_cast<size_t>(nr * nc), 0.0f);
  for (int64_t r = 0; r < out; ++r) {
    quant_detail::load_finite_f32(weight, r * in, in, row.data(), name);
    float* a = &scales[static_cast<size_t>((r / kFp8PbBlock) * nc)];
    for (int64_t c = 0; c < in; ++c)
      a[c / kFp8PbBlock] = std::max(a[c / kFp8PbBlock], std::fabs(row[c]));
  }
  STRATA_ASSERT(group_amax == 0.0f || nr * nc == 1, "fp8_pb_wo: a group amax for ", name,
                ", which is not one block");
  if (group_amax != 0.0f) {
    STRATA_CHECK(group_amax >= scales[0], "fp8_pb_wo: tensor ", name, " has |W| = ", scales[0],
                 ", above the group amax ", group_amax, " it was given");
    scales[0] = group_amax;
  }
  for (float& s : scales) {
    const float a = s == 0.0f ? 448.0f : std::clamp(s, FLT_MIN, FLT_MAX);
    s = fp8_weight_scale(a);
  }
  // Pass 2: codes.
  Fp8Weight q{
      Tensor::zeros(DType::kF8E4M3, {out, in}),
      nr * nc == 1 ? Tensor::scalar_f32(scales[0]) : Tensor::zeros(DType::kF32, {nr, 1, nc, 1})};
  if (nr * nc > 1) std::copy(scales.begin(), scales.end(), q.scale.mutable_data<float>());
  uint8_t* dst = q.weight.mutable_data<uint8_t>();
  for (int64_t r = 0; r < out; ++r) {
    quant_detail::load_finite_f32(weight, r * in, in, row.data(), name);
    const float* s = &scales[static_cast<size_t>((r / kFp8PbBlock) * nc)];
    for (int64_t c = 0; c < in; ++c) {
      const float x = std::clamp(row[c] / s[c / kFp8PbBlock], -448.0f, 448.0f);
      dst[r * in + c] = quant_detail::fast_f32_to_e4m3(x);
    }
  }
  return q;
}

Tensor fp8_pb_dequantize(const Fp8Weight& q) {
  STRATA_ASSERT(q.weight.dtype() == DType::kF8E4M3 && q.weight.shape().size() == 2 &&
                q.scale.dtype() == DType::kF32);
  const int64_t out = q.weight.shape()[0], in = q.weight.shape()[1];
  const int64_t nr = (out + kFp8PbBlock - 1) / kFp8PbBlock,
                nc = (in + kFp8PbBlock - 1) / kFp8PbBlock;
  STRATA_ASSERT(q.scale.numel() == nr * nc &&
                (q.scale.shape().empty() || q.scale.shape() == Shape{nr, 1, nc, 1}));
  Tensor t = Tensor::zeros(DType::kF32, {out, in});
  float* dst = t.mutable_data<float>();
  const uint8_t* src = q.weight.data<uint8_t>();
  const float* s = q.scale.data<float>();
  for (int64_t r = 0; r < out; ++r) {
    for (int64_t c = 0; c < in; ++c)
      dst[r * in + c] = e4m3_to_f32(src[r * in + c]) * s[(r / kFp8PbBlock) * nc + c / kFp8PbBlock];
  }
  return t;
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
